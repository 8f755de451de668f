//! `talon doctor`: checks the host and prints fixes (and Talos patches).
//!
//! ```text
//!   DoctorArgs ─> host::doctor::run(HostRoot) ─> Report ─┬─> text | json | yaml
//!   SpdkOptions ─> EngineSelection (as `talon serve`) ─> "engine" check ┘
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
    let check = engine_check(&root, &spdk, talos, which::which("tgtd").ok());
    // after the os check, where the verdict is read first
    report.checks.insert(1.min(report.checks.len()), check);
    match args.output {
        Output::Text => print!("{}", report.to_text()),
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&report)?),
    }
    let failed = report.checks.iter().filter(|c| c.status == Status::Fail).count();
    if failed > 0 {
        return Err(format!("doctor: {failed} check(s) failed").into());
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
}
