//! `talon doctor`: checks the host and prints fixes (and Talos patches).
//! It passes when the node can serve volumes, V2 or V1: with tgtd there, what
//! only V2 needs is a warning (`--require-v2`: a failure).
//!
//! ```text
//!   DoctorArgs ─> host::doctor::run(HostRoot) ─> Report ─┬─> judge ─> text | json | yaml, exit code
//!   SpdkOptions ─> EngineSelection (as `talon serve`) ─> "engine" check ┤
//!   tgtd on PATH ─> "v1" check ─────────────────────────────────────────┘
//! ```

use crate::cli::host::Output;
use crate::controllers::engine::selection::{EngineSelection, SpdkOptions};
use crate::host::HostRoot;
use crate::host::doctor::{self, Check, DoctorOptions, Status, Target};
use crate::host::hugepages;
use crate::host::talos::TalosVersion;
use std::path::PathBuf;

/// `talon doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Give advice for this kind of host (default: detected from os-release).
    #[arg(long = "for", value_enum)]
    pub target: Option<Target>,
    /// Hugepage MiB wanted (default: sized from --volumes).
    #[arg(long)]
    pub hugepages_mib: Option<u64>,
    /// A disk talon should own: PCI address, serial or model (repeatable).
    #[arg(long = "disk")]
    pub disks: Vec<String>,
    /// The Talos machine-config shape.
    #[arg(long, value_enum, default_value_t = TalosVersion::V1_13)]
    pub talos_version: TalosVersion,
    /// Expected attached NVMe/TCP volumes on this node (hugepage sizing).
    #[arg(long, default_value_t = 8)]
    pub volumes: u32,
    /// talon's data path on the host.
    #[arg(long, default_value = doctor::DEFAULT_DATA_PATH)]
    pub data_path: String,
    /// The host's root directory.
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    /// The spdk_tgt `talon serve` would run (else $TALON_SPDK_DIR, else PATH).
    #[arg(long)]
    pub spdk_tgt: Option<PathBuf>,
    /// Fail unless the host is ready for V2 volumes (SPDK). Without it a host
    /// that serves V1 volumes (tgtd) passes, with what V2 lacks as warnings.
    #[arg(long)]
    pub require_v2: bool,
}

/// Which engine `talon serve` would pick on this host for `auto` volumes,
/// and why: the same detection the daemon makes at start, plus the
/// hugepages it would reserve first (`hugepages: auto`, the default) where it
/// may write them (not on Talos).
pub fn engine_check(root: &HostRoot, opts: &SpdkOptions, talos: bool, tgtd: Option<PathBuf>) -> Check {
    let sel = EngineSelection::detect_on(opts, root);
    let v1 = match &tgtd {
        Some(p) => format!("V1 (tgtd at {})", p.display()),
        None => "no engine: tgtd (V1) is not installed either".to_string(),
    };
    let need = hugepages::spdk_sizing_mib(0);
    let writable = !talos && nix::unistd::Uid::effective().is_root();
    let (status, measured, fix) = if sel.v2_available {
        (Status::Pass, format!("V2: {}", sel.reason), None)
    } else if sel.spdk_tgt.is_some() && !opts.no_huge && writable {
        (
            Status::Pass,
            format!(
                "V2: {}; talon serve first reserves {need} MiB of 2M hugepages itself (hugepages: auto), V1 if the kernel cannot give them",
                sel.reason
            ),
            None,
        )
    } else if sel.spdk_tgt.is_some() && !opts.no_huge && talos {
        (
            Status::Warn,
            format!("{v1}: {}", sel.reason),
            Some("on Talos apply the vm.nr_hugepages patch below, then V2 is picked".to_string()),
        )
    } else {
        (
            if tgtd.is_some() { Status::Warn } else { Status::Fail },
            format!("{v1}: V2 unavailable: {}", sel.reason),
            Some(
                "install SPDK (spdk_tgt on PATH, --spdk-tgt or TALON_SPDK_DIR) for V2; Debian package `tgt` for V1"
                    .to_string(),
            ),
        )
    };
    Check {
        name: "engine".to_string(),
        status,
        measured,
        fix,
    }
}

/// The V1 engine's readiness: tgtd (the iSCSI target that serves a V1
/// volume's file) where `talon serve` runs.
pub fn v1_check(tgtd: Option<&std::path::Path>) -> Check {
    match tgtd {
        Some(p) => Check {
            name: "v1".to_string(),
            status: Status::Pass,
            measured: format!(
                "tgtd at {}: this node serves V1 volumes (a file each, over iSCSI)",
                p.display()
            ),
            fix: None,
        },
        None => Check {
            name: "v1".to_string(),
            status: Status::Warn,
            measured: "tgtd is not installed: no V1 volumes".to_string(),
            fix: Some("apt-get install tgt (Debian), for V1 volumes without SPDK".to_string()),
        },
    }
}

/// Adds the V1 check and judges: a node with tgtd serves V1 volumes, so
/// what only V2 needs (hugepages, modules, SPDK) is a warning there, unless
/// `require_v2`. Returns the checks that fail.
pub fn judge(report: &mut doctor::Report, tgtd: Option<&std::path::Path>, require_v2: bool) -> usize {
    if tgtd.is_some() && !require_v2 {
        for c in report.checks.iter_mut().filter(|c| c.status == Status::Fail) {
            c.status = Status::Warn;
            c.measured.push_str(" (V2 needs it; V1 volumes serve without it)");
        }
    }
    // after the os and engine checks
    report.checks.insert(2.min(report.checks.len()), v1_check(tgtd));
    report.checks.iter().filter(|c| c.status == Status::Fail).count()
}

/// Runs `talon doctor`; fails when a check fails.
pub fn run(args: DoctorArgs) -> Result<(), crate::cli::CliError> {
    let root = HostRoot::new(&args.host_root);
    let opts = DoctorOptions {
        target: args.target,
        hugepages_mib: args.hugepages_mib,
        disks: args.disks,
        talos_version: args.talos_version,
        volumes: args.volumes,
        data_path: args.data_path,
    };
    let mut report = doctor::run(&root, &opts)?;
    let spdk = SpdkOptions {
        spdk_tgt: args.spdk_tgt,
        ..SpdkOptions::default()
    };
    let talos = report.os.as_ref().is_some_and(|o| o.is_talos());
    let tgtd = which::which("tgtd").ok();
    let check = engine_check(&root, &spdk, talos, tgtd.clone());
    // after the os check, where the verdict is read first
    report.checks.insert(1.min(report.checks.len()), check);
    let failed = judge(&mut report, tgtd.as_deref(), args.require_v2);
    match args.output {
        Output::Text => print!("{}", report.to_text()),
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&report)?),
    }
    if failed > 0 {
        let v2 = if args.require_v2 {
            " (--require-v2: V2 volumes)"
        } else {
            ""
        };
        return Err(format!("doctor: {failed} check(s) failed{v2}").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(free_2m: u64) -> (tempfile::TempDir, HostRoot, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().expect("tempdir");
        let hp = d.path().join("root/sys/kernel/mm/hugepages/hugepages-2048kB");
        std::fs::create_dir_all(&hp).expect("mkdir");
        std::fs::write(hp.join("free_hugepages"), format!("{free_2m}\n")).expect("write");
        let bin = d.path().join("spdk_tgt");
        std::fs::write(&bin, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let root = HostRoot::new(d.path().join("root"));
        (d, root, bin)
    }

    fn opts(bin: Option<PathBuf>) -> SpdkOptions {
        SpdkOptions {
            spdk_tgt: bin,
            spdk_dir: None,
            path_var: None,
            ..SpdkOptions::default()
        }
    }

    #[test]
    fn the_engine_check_says_what_serve_would_pick_and_why() {
        let (_d, root, bin) = host(512);
        let c = engine_check(&root, &opts(Some(bin.clone())), false, None);
        assert_eq!(c.status, Status::Pass);
        assert!(
            c.measured.starts_with("V2: ") && c.measured.contains("1024 MiB of free hugepages"),
            "{c:?}"
        );

        let (_d, root, bin) = host(0);
        let c = engine_check(
            &root,
            &opts(Some(bin.clone())),
            true,
            Some("/usr/sbin/tgtd".into()),
        );
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.measured.starts_with("V1 (tgtd at /usr/sbin/tgtd)"), "{c:?}");
        assert!(
            c.fix.as_deref().unwrap_or("").contains("vm.nr_hugepages"),
            "{c:?}"
        );
        if nix::unistd::Uid::effective().is_root() {
            let c = engine_check(&root, &opts(Some(bin)), false, None);
            assert_eq!(c.status, Status::Pass, "{c:?}");
            assert!(c.measured.contains("reserves 1024 MiB"), "{c:?}");
        }

        let c = engine_check(&root, &opts(None), false, None);
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.measured.contains("no engine") && c.measured.contains("spdk_tgt was not found"),
            "{c:?}"
        );
    }

    fn report(statuses: &[(&str, Status)]) -> doctor::Report {
        doctor::Report {
            os: None,
            target: doctor::Target::Generic,
            checks: statuses
                .iter()
                .map(|(n, s)| Check {
                    name: n.to_string(),
                    status: *s,
                    measured: "measured".into(),
                    fix: None,
                })
                .collect(),
            talos: None,
        }
    }

    #[test]
    fn a_node_that_serves_v1_passes_with_what_v2_lacks_as_warnings() {
        let v2_gaps = [
            ("os", Status::Pass),
            ("engine", Status::Warn),
            ("hugepages-2M", Status::Fail),
            ("module nvme_tcp", Status::Fail),
        ];
        let tgtd = Some(std::path::Path::new("/usr/sbin/tgtd"));
        let mut r = report(&v2_gaps);
        assert_eq!(judge(&mut r, tgtd, false), 0, "{r:?}");
        assert_eq!(r.checks[2].name, "v1");
        assert_eq!(r.checks[2].status, Status::Pass);
        assert!(r.checks[2].measured.contains("/usr/sbin/tgtd"), "{r:?}");
        let hp = r.checks.iter().find(|c| c.name == "hugepages-2M").expect("kept");
        assert_eq!(hp.status, Status::Warn);
        assert!(hp.measured.contains("V2 needs it"), "{hp:?}");
        // asked for V2: its gaps fail
        let mut r = report(&v2_gaps);
        assert_eq!(judge(&mut r, tgtd, true), 2, "{r:?}");
        // no tgtd: nothing serves, the gaps fail
        let mut r = report(&v2_gaps);
        assert_eq!(judge(&mut r, None, false), 2, "{r:?}");
        assert_eq!(r.checks[2].status, Status::Warn);
        assert!(
            r.checks[2]
                .fix
                .as_deref()
                .is_some_and(|f| f.contains("apt-get install tgt"))
        );
        // ready for V2: passes either way
        let mut r = report(&[("os", Status::Pass), ("engine", Status::Pass)]);
        assert_eq!(judge(&mut r, None, true), 0, "{r:?}");
    }
}
