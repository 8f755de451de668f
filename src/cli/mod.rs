//! The `talon` command line.

/// Entry point of the `talon` binary.
pub fn main() -> std::process::ExitCode {
    std::process::ExitCode::SUCCESS
}
