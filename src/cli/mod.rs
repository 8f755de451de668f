//! The `talon` command line.

pub mod attach;

use clap::Parser;

/// talon: replicated block volumes for Kubernetes and Talos Linux.
#[derive(Debug, Parser)]
#[command(name = "talon", version = crate::VERSION)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Attach a volume on this host (no daemon needed).
    Attach(attach::AttachArgs),
    /// Detach a volume from this host (no daemon needed).
    Detach(attach::DetachArgs),
}

/// Entry point of the `talon` binary.
pub fn main() -> std::process::ExitCode {
    // TEMPORARY wiring on wip/attach for the guest tests; the lead owns this file.
    let cli = Cli::parse();
    let res = match cli.command {
        Some(Command::Attach(a)) => attach::run_attach(a),
        Some(Command::Detach(a)) => attach::run_detach(a),
        None => Ok(()),
    };
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = e.to_string();
            let mut src = e.source();
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("talon: {msg}");
            std::process::ExitCode::FAILURE
        }
    }
}
