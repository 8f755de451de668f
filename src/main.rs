/// The daemon's allocator: mimalloc. Under Longhorn's polls talon spends its CPU
/// answering many small gRPC calls, each a burst of short-lived allocations; with
/// glibc's malloc a fifth of that CPU went to the allocator (issue 52's profile:
/// `_int_malloc`, `malloc_consolidate`, `unlink_chunk`, ...). See docs/sizing.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    talon::cli::main()
}
