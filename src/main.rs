fn main() -> std::process::ExitCode {
    talon::cli::main()
}
