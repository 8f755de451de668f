//! `talon doctor`: checks the host and prints fixes (and Talos patches).
//!
//! ```text
//!   DoctorArgs ─> host::doctor::run(HostRoot) ─> Report ─> text | json | yaml
//! ```

use crate::cli::host::Output;
use crate::host::HostRoot;
use crate::host::doctor::{self, DoctorOptions, Status, Target};
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
    let report = doctor::run(&root, &opts)?;
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
