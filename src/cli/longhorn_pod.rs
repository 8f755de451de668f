//! The entry point of talon's image as Longhorn's V2 instance-manager: the
//! pod's arguments (longhorn-manager `controller/instance_manager_controller.go`)
//! turned into `talon serve` arguments, so no shell or wrapper script is needed.
//!
//! ```text
//!   start-spdk-tgt --spdk-cpumask M --spdk-memory-size MiB [--spdk-no-hugepage] [--spdk-interrupt-mode]
//!                  ... daemon --spdk-enabled --listen 0.0.0.0:8500
//!     ──> talon serve --spdk-cpumask M [--no-huge --no-huge-mem-mib MiB] [--interrupt-mode]
//!                     --longhorn-listen 0.0.0.0:8500
//! ```

use std::ffi::OsString;

/// The word Longhorn's pod arguments start with (or the name talon is
/// invoked by, through a link).
pub const START: &str = "start-spdk-tgt";

/// Longhorn's options that take a value and that talon does not use: the SPDK
/// log flags, core count and iobuf pool sizes (talon sizes them itself), the
/// control path.
const IGNORED_WITH_VALUE: &[&str] = &[
    "--spdk-log",
    "--spdk-core-number",
    "--spdk-iobuf-large-pool-size",
    "--spdk-iobuf-small-pool-size",
    "--longhorn-control-path",
];
/// Longhorn's switches that talon does not need (`daemon` is a word, not an option).
const IGNORED_SWITCHES: &[&str] = &[
    "--enable-spdk",
    "--debug",
    "daemon",
    "--spdk-enabled",
    "--enable-irq-affinity",
    "--enable-workqueue-affinity",
    "--enable-rps",
];

/// Whether `argv` is Longhorn's pod command line: `talon start-spdk-tgt ...`
/// or a link named `start-spdk-tgt`.
pub fn is_pod_argv(argv: &[OsString]) -> bool {
    let name = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str());
    name == Some(START) || argv.get(1).and_then(|a| a.to_str()) == Some(START)
}

/// Translates Longhorn's pod arguments (after `start-spdk-tgt`) into talon's
/// argv (`talon serve ...`). An option talon does not know is refused by name.
pub fn serve_argv(args: &[String]) -> Result<Vec<OsString>, String> {
    let mut out: Vec<OsString> = vec!["talon".into(), "serve".into()];
    let (mut memory, mut no_huge, mut listen) = (None::<String>, false, None::<String>);
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = |flag: &str| -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => it.next().cloned().ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        match flag {
            "--spdk-cpumask" => {
                let v = value(flag)?;
                out.push("--spdk-cpumask".into());
                out.push(v.into());
            }
            "--spdk-memory-size" => {
                let v = value(flag)?;
                v.parse::<u64>()
                    .map_err(|_| format!("--spdk-memory-size {v:?} is not a number of MiB"))?;
                memory = Some(v);
            }
            "--spdk-no-hugepage" => no_huge = true,
            "--spdk-interrupt-mode" => out.push("--interrupt-mode".into()),
            "--listen" => listen = Some(value(flag)?),
            f if IGNORED_WITH_VALUE.contains(&f) => {
                value(f)?;
            }
            f if IGNORED_SWITCHES.contains(&f) => {}
            other => return Err(format!("start-spdk-tgt: option {other:?} is not known to talon")),
        }
    }
    if no_huge {
        out.push("--no-huge".into());
        if let Some(m) = &memory {
            out.push("--no-huge-mem-mib".into());
            out.push(m.into());
        }
    }
    let listen = listen.ok_or("start-spdk-tgt: --listen ADDR:PORT is missing")?;
    out.push("--longhorn-listen".into());
    out.push(listen.into());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn longhorns_pod_args_become_talon_serve() {
        let pod = s(&[
            "--spdk-log",
            "",
            "--spdk-cpumask",
            "0x3",
            "--spdk-core-number",
            "2",
            "--spdk-memory-size",
            "2048",
            "--spdk-iobuf-large-pool-size",
            "4096",
            "--longhorn-control-path",
            "/var/lib/longhorn",
            "--enable-spdk",
            "--debug",
            "daemon",
            "--spdk-enabled",
            "--listen",
            "0.0.0.0:8500",
            "--spdk-interrupt-mode",
            "--spdk-no-hugepage",
        ]);
        let argv = serve_argv(&pod).expect("translated");
        let argv: Vec<String> = argv
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            argv,
            s(&[
                "talon",
                "serve",
                "--spdk-cpumask",
                "0x3",
                "--interrupt-mode",
                "--no-huge",
                "--no-huge-mem-mib",
                "2048",
                "--longhorn-listen",
                "0.0.0.0:8500",
            ])
        );
        let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(&argv).expect("talon parses it");
        assert!(matches!(cli.command, crate::cli::Command::Serve(_)));
        let e = serve_argv(&s(&["--listen", "0.0.0.0:8500", "--spdk-something", "1"])).expect_err("unknown");
        assert!(e.contains("--spdk-something"), "{e}");
        assert!(
            serve_argv(&s(&["--spdk-cpumask", "0x1"]))
                .expect_err("no listen")
                .contains("--listen")
        );
        assert!(is_pod_argv(&["/usr/local/bin/start-spdk-tgt".into()]));
        assert!(is_pod_argv(&["talon".into(), "start-spdk-tgt".into()]));
        assert!(!is_pod_argv(&["talon".into(), "serve".into()]));
    }
}
