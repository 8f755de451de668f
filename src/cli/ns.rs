//! `talon host exec` and `talon host cat`: operator access to another process's
//! namespaces on hosts with no shell and no nsenter (Talos).
//!
//! ```text
//!   talon host exec --ns-of iscsid --ns mnt,net -- iscsiadm -m session
//!     └─ ns::NsCommand::status (stdio passed through) ─> exit code propagated
//!   talon host cat --ns-of host /etc/os-release
//!     └─ ns::read_file (host mount namespace) ─> stdout
//! ```

use std::error::Error;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::host::HostRoot;
use crate::ns::{self, Namespaces, NsCommand, Target};

/// The namespace commands of `talon host`.
#[derive(Debug, clap::Subcommand)]
pub enum HostNsCommand {
    /// Run a program inside another process's namespaces (no nsenter needed).
    Exec(ExecArgs),
    /// Print a file as seen in another process's mount namespace.
    Cat(CatArgs),
}

/// `talon host exec --ns-of host|iscsid|kubelet|PID [--ns mnt,net,ipc,uts] -- CMD ARGS...`
#[derive(Debug, Clone, clap::Args)]
pub struct ExecArgs {
    /// Whose namespaces: `host` (pid 1), a process name (`iscsid`, `kubelet`), or a pid.
    #[arg(long = "ns-of", value_name = "host|NAME|PID", value_parser = Target::parse)]
    pub ns_of: Target,
    /// The namespaces to enter: a comma-separated list of mnt, net, ipc, uts, pid, or all.
    #[arg(long = "ns", value_name = "LIST", default_value = "mnt,net,ipc,uts", value_parser = Namespaces::parse)]
    pub ns: Namespaces,
    /// Kill the program when it runs longer than this (`30s`, `5m`); no limit by default.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// The program (looked up in PATH inside the target's mount namespace) and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `talon host cat --ns-of host|iscsid|kubelet|PID PATH`
#[derive(Debug, Clone, clap::Args)]
pub struct CatArgs {
    /// Whose mount namespace: `host` (pid 1), a process name, or a pid.
    #[arg(long = "ns-of", value_name = "host|NAME|PID", value_parser = Target::parse)]
    pub ns_of: Target,
    /// The file, as a path inside that mount namespace.
    pub path: PathBuf,
}

/// Runs a namespace command; `root` is the host root (`/`, or where the host's
/// `/` is mounted). `exec` exits with the program's exit code (128 + signal when
/// it was killed by one).
pub fn run(cmd: HostNsCommand, root: &HostRoot) -> Result<ExitCode, Box<dyn Error>> {
    match cmd {
        HostNsCommand::Exec(args) => {
            let code = exec(&args, root)?;
            Ok(ExitCode::from(code.clamp(0, 255) as u8))
        }
        HostNsCommand::Cat(args) => {
            cat(&args, root, &mut std::io::stdout().lock())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `talon host exec`: runs the program with stdio passed through and returns its
/// shell-style exit code.
pub fn exec(args: &ExecArgs, root: &HostRoot) -> Result<i32, Box<dyn Error>> {
    let (program, rest) = args.command.split_first().ok_or("no program given after --")?;
    let mut cmd = NsCommand::new(program);
    cmd.args(rest);
    match args.timeout {
        Some(t) => cmd.timeout(t),
        None => cmd.no_timeout(),
    };
    let status = cmd.status(root, &args.ns_of, args.ns)?;
    Ok(ns::exit_code(&status))
}

/// `talon host cat`: copies the file's bytes to `out`.
pub fn cat(args: &CatArgs, root: &HostRoot, out: &mut impl Write) -> Result<(), Box<dyn Error>> {
    let data = ns::read_file(root, &args.ns_of, &args.path)?;
    out.write_all(&data)?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: HostNsCommand,
    }

    fn parse(args: &[&str]) -> Result<HostNsCommand, clap::Error> {
        Cli::try_parse_from(std::iter::once("host").chain(args.iter().copied())).map(|c| c.cmd)
    }

    #[test]
    fn parses_exec_and_cat() {
        let HostNsCommand::Exec(e) = parse(&[
            "exec", "--ns-of", "iscsid", "--ns", "mnt,net", "--", "iscsiadm", "-m", "session",
        ])
        .expect("exec") else {
            panic!("not exec")
        };
        assert_eq!(e.ns_of, Target::Process("iscsid".into()));
        assert_eq!(e.ns.to_string(), "net,mnt");
        assert_eq!(e.command, ["iscsiadm", "-m", "session"].map(OsString::from));
        let HostNsCommand::Exec(e) = parse(&["exec", "--ns-of", "host", "--", "ls"]).expect("exec") else {
            panic!("not exec")
        };
        assert_eq!((e.ns_of, e.ns), (Target::Host, Namespaces::ALL_BUT_PID));
        let HostNsCommand::Cat(c) = parse(&["cat", "--ns-of", "4242", "/etc/os-release"]).expect("cat")
        else {
            panic!("not cat")
        };
        assert_eq!(c.ns_of, Target::Pid(4242));
        assert!(parse(&["exec", "--ns-of", "host", "--ns", "mnt,bogus", "--", "ls"]).is_err());
        assert!(
            parse(&["exec", "--ns-of", "host"]).is_err(),
            "a program is required"
        );
    }

    #[test]
    fn exec_propagates_the_exit_code_and_cat_copies_bytes() {
        let root = HostRoot::real();
        let me = std::process::id().to_string();
        let HostNsCommand::Exec(e) =
            parse(&["exec", "--ns-of", &me, "--", "sh", "-c", "exit 7"]).expect("exec")
        else {
            panic!("not exec")
        };
        assert_eq!(exec(&e, &root).expect("exec"), 7);

        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        std::fs::write(&file, b"bytes\0here").expect("write");
        let args = CatArgs {
            ns_of: Target::Pid(std::process::id()),
            path: file,
        };
        let mut out = Vec::new();
        cat(&args, &root, &mut out).expect("cat");
        assert_eq!(out, b"bytes\0here");
        let missing = CatArgs {
            ns_of: Target::Pid(std::process::id()),
            path: dir.path().join("nope"),
        };
        let err = cat(&missing, &root, &mut Vec::new()).expect_err("missing");
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
