//! `talon attach` / `talon detach`: daemon-less frontends for operators and the guest tests.
//!
//! ```text
//!   talon attach nvme-tcp --volume v --traddr IP --trsvcid P --nqn N ──> attach::nvme_tcp::attach
//!        prints "device=/dev/nvme1n1 path=/dev/talon/v controller=nvme1 reused=false"
//!   talon detach nvme-tcp --volume v [--nqn N] ──> attach::nvme_tcp::detach
//! ```

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::attach::nvme_tcp::{self, ConnectOptions, NvmeTcpTarget};
use crate::host::HostRoot;
use crate::names::{Nqn, ObjectName};

/// The default data directory.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/talon";

/// `talon attach`.
#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    #[command(subcommand)]
    pub frontend: AttachFrontend,
}

/// The frontends of `talon attach`.
#[derive(Debug, clap::Subcommand)]
pub enum AttachFrontend {
    /// Connect through the kernel NVMe/TCP initiator and create /dev/talon/<volume>.
    NvmeTcp(NvmeTcpAttachArgs),
}

/// `talon attach nvme-tcp`.
#[derive(Debug, clap::Args)]
pub struct NvmeTcpAttachArgs {
    /// The volume name (a DNS label); names /dev/talon/<volume>.
    #[arg(long)]
    pub volume: String,
    /// The target's IP address.
    #[arg(long)]
    pub traddr: IpAddr,
    /// The target's TCP port.
    #[arg(long, default_value_t = 4420)]
    pub trsvcid: u16,
    /// The subsystem NQN (default: talon's NQN of the volume).
    #[arg(long)]
    pub nqn: Option<String>,
    /// I/O queues (1..=16).
    #[arg(long, default_value_t = nvme_tcp::DEFAULT_IO_QUEUES)]
    pub nr_io_queues: u32,
    /// Seconds to keep reconnecting a lost controller; -1 = forever.
    #[arg(long, default_value_t = 60, allow_negative_numbers = true)]
    pub ctrl_loss_tmo: i64,
    /// Seconds between reconnects.
    #[arg(long, default_value_t = 2)]
    pub reconnect_delay: u32,
    /// Keep-alive timeout in seconds.
    #[arg(long, default_value_t = 5)]
    pub keep_alive_tmo: u32,
    /// Namespace ID of the volume.
    #[arg(long, default_value_t = 1)]
    pub nsid: u32,
    /// Bound on the connect, in seconds.
    #[arg(long, default_value_t = 20)]
    pub connect_timeout: u64,
    /// Bound on the wait for the block device, in seconds.
    #[arg(long, default_value_t = 10)]
    pub namespace_timeout: u64,
    /// talon's data directory (generated host NQN, locks).
    #[arg(long, default_value = DEFAULT_DATA_DIR, env = "TALON_DATA_DIR")]
    pub data_dir: PathBuf,
}

/// `talon detach`.
#[derive(Debug, clap::Args)]
pub struct DetachArgs {
    #[command(subcommand)]
    pub frontend: DetachFrontend,
}

/// The frontends of `talon detach`.
#[derive(Debug, clap::Subcommand)]
pub enum DetachFrontend {
    /// Disconnect the NVMe/TCP controllers of a volume and remove /dev/talon/<volume>.
    NvmeTcp(NvmeTcpDetachArgs),
}

/// `talon detach nvme-tcp`.
#[derive(Debug, clap::Args)]
pub struct NvmeTcpDetachArgs {
    /// The volume name.
    #[arg(long)]
    pub volume: String,
    /// Also disconnect every TCP controller of this subsystem NQN.
    #[arg(long)]
    pub nqn: Option<String>,
    /// talon's data directory.
    #[arg(long, default_value = DEFAULT_DATA_DIR, env = "TALON_DATA_DIR")]
    pub data_dir: PathBuf,
}

fn parse_nqn(nqn: Option<&str>, volume: &ObjectName) -> Result<Nqn, super::CliError> {
    Ok(match nqn {
        Some(n) => Nqn::parse(n)?,
        None => Nqn::for_volume(volume),
    })
}

/// Runs `talon attach`.
pub fn run_attach(args: AttachArgs) -> Result<(), super::CliError> {
    let AttachFrontend::NvmeTcp(a) = args.frontend;
    let volume = ObjectName::parse("volume", &a.volume)?;
    let nqn = parse_nqn(a.nqn.as_deref(), &volume)?;
    let ctrl_loss_tmo = match a.ctrl_loss_tmo {
        -1 => None,
        t => Some(
            u32::try_from(t).map_err(|_| format!("invalid --ctrl-loss-tmo {t}: use -1 or 0..=4294967295"))?,
        ),
    };
    let opts = ConnectOptions {
        nr_io_queues: a.nr_io_queues,
        ctrl_loss_tmo,
        reconnect_delay: a.reconnect_delay,
        keep_alive_tmo: a.keep_alive_tmo,
        nsid: a.nsid,
        connect_timeout: Duration::from_secs(a.connect_timeout),
        namespace_timeout: Duration::from_secs(a.namespace_timeout),
    };
    let target = NvmeTcpTarget {
        traddr: a.traddr,
        trsvcid: a.trsvcid,
        nqn,
    };
    let at = nvme_tcp::attach(&HostRoot::real(), &a.data_dir, &volume, &target, &opts)?;
    println!(
        "device=/dev/{} path={} controller={} reused={}",
        at.device,
        at.stable_path.display(),
        at.controller,
        at.reused
    );
    Ok(())
}

/// Runs `talon detach`.
pub fn run_detach(args: DetachArgs) -> Result<(), super::CliError> {
    let DetachFrontend::NvmeTcp(a) = args.frontend;
    let volume = ObjectName::parse("volume", &a.volume)?;
    let nqn = a.nqn.as_deref().map(Nqn::parse).transpose()?;
    let d = nvme_tcp::detach(&HostRoot::real(), &a.data_dir, &volume, nqn.as_ref())?;
    println!(
        "controllers={} removed_path={}",
        d.controllers.join(","),
        d.removed_path
    );
    Ok(())
}
