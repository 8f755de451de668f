//! `talon attach` / `talon detach`: daemon-less frontends for operators and the guest tests.
//!
//! ```text
//!   talon attach nvme-tcp --volume v --traddr IP --trsvcid P --nqn N ──> attach::nvme_tcp::attach
//!        prints "device=/dev/nvme1n1 path=/dev/talon/v controller=nvme1 reused=false"
//!   talon detach nvme-tcp --volume v [--nqn N] ──> attach::nvme_tcp::detach
//!   talon attach iscsi --volume v --portal IP:PORT --iqn IQN [--lun N] ──> attach::iscsi::attach_host
//!        prints "device=/dev/sdb path=/dev/talon/v session=session1 reused=false"
//!   talon detach iscsi --volume v [--iqn IQN] ──> attach::iscsi::detach_host
//! ```

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::attach::iscsi::{self, IscsiOptions, IscsiTarget};
use crate::attach::nvme_tcp::{self, ConnectOptions, NvmeTcpTarget};
use crate::host::HostRoot;
use crate::names::{Iqn, Nqn, ObjectName};

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
    /// Log in through iscsiadm inside iscsid's namespaces and create /dev/talon/<volume>.
    Iscsi(IscsiAttachArgs),
}

/// `talon attach iscsi`.
#[derive(Debug, clap::Args)]
pub struct IscsiAttachArgs {
    /// The volume name (a DNS label); names /dev/talon/<volume>.
    #[arg(long)]
    pub volume: String,
    /// The portal as this host reaches it, `IP:PORT` (`[IPv6]:PORT`).
    #[arg(long)]
    pub portal: std::net::SocketAddr,
    /// The target IQN (default: talon's IQN of the volume).
    #[arg(long)]
    pub iqn: Option<String>,
    /// The LUN of the volume.
    #[arg(long, default_value_t = 1)]
    pub lun: u32,
    /// Log in with this initiator name (through the iscsiadm interface
    /// `talon`) instead of iscsid's default; `host` means talon's own name on
    /// this host (what the daemon uses and its V1 exports allow).
    #[arg(long)]
    pub initiator_name: Option<String>,
    /// Log in with CHAP, with the user and secret of the credentials file in
    /// the data directory (`<data-dir>/iscsi-chap`, what `NodeConfig.iscsiChap`
    /// makes the node's V1 targets require).
    #[arg(long)]
    pub chap: bool,
    /// talon's data directory (where the host ID behind `--initiator-name host` is kept).
    #[arg(long, default_value = DEFAULT_DATA_DIR, env = "TALON_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Bound on SendTargets discovery, in seconds.
    #[arg(long, default_value_t = 15)]
    pub discovery_timeout: u64,
    /// Bound on the login, in seconds.
    #[arg(long, default_value_t = 30)]
    pub login_timeout: u64,
    /// Bound on the wait for the block device, in seconds.
    #[arg(long, default_value_t = 15)]
    pub device_timeout: u64,
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
    /// Authenticate with DH-HMAC-CHAP: this host's secret from
    /// `<data-dir>/nvme-dhchap/<host NQN>` (made when absent), never on the command line.
    #[arg(long)]
    pub dhchap: bool,
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
    /// Log out of the iSCSI session of a volume, delete its node record, remove /dev/talon/<volume>.
    Iscsi(IscsiDetachArgs),
}

/// `talon detach iscsi`.
#[derive(Debug, clap::Args)]
pub struct IscsiDetachArgs {
    /// The volume name.
    #[arg(long)]
    pub volume: String,
    /// Also log out of every session of this target IQN (and delete its node records).
    #[arg(long)]
    pub iqn: Option<String>,
    /// Bound on logout and node delete, in seconds.
    #[arg(long, default_value_t = 20)]
    pub logout_timeout: u64,
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
    let a = match args.frontend {
        AttachFrontend::NvmeTcp(a) => a,
        AttachFrontend::Iscsi(a) => return run_attach_iscsi(a),
    };
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
        dhchap_secret: None,
    };
    let opts = if a.dhchap {
        let host = nvme_tcp::HostIdentity::load_or_create(&HostRoot::real(), &a.data_dir)?;
        let secret = crate::util::nvme_auth::load_or_create::<crate::util::nvme_auth::DhchapSecret>(
            &a.data_dir,
            host.hostnqn.as_str(),
        )
        .map_err(|e| crate::util::error_chain(&e))?;
        ConnectOptions {
            dhchap_secret: Some(secret),
            ..opts
        }
    } else {
        opts
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
    let a = match args.frontend {
        DetachFrontend::NvmeTcp(a) => a,
        DetachFrontend::Iscsi(a) => return run_detach_iscsi(a),
    };
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

fn run_attach_iscsi(a: IscsiAttachArgs) -> Result<(), super::CliError> {
    let volume = ObjectName::parse("volume", &a.volume)?;
    let iqn = match a.iqn.as_deref() {
        Some(i) => Iqn::parse(i)?,
        None => Iqn::for_volume(&volume),
    };
    let opts = IscsiOptions {
        discovery_timeout: Duration::from_secs(a.discovery_timeout),
        login_timeout: Duration::from_secs(a.login_timeout),
        device_timeout: Duration::from_secs(a.device_timeout),
        ..IscsiOptions::default()
    };
    let initiator = match a.initiator_name.as_deref() {
        None => None,
        Some("host") => {
            Some(crate::attach::HostInitiators::load_or_create(&HostRoot::real(), &a.data_dir)?.iqn)
        }
        Some(name) => Some(Iqn::parse(name)?),
    };
    let target = IscsiTarget {
        portal: a.portal,
        iqn,
        lun: a.lun,
        initiator,
        chap: if a.chap {
            Some(crate::tgt::chap::load(&a.data_dir)?)
        } else {
            None
        },
    };
    let at = iscsi::attach_host(&HostRoot::real(), &volume, &target, &opts)?;
    println!(
        "device=/dev/{} path={} session={} reused={}",
        at.device,
        at.stable_path.display(),
        at.session,
        at.reused
    );
    Ok(())
}

fn run_detach_iscsi(a: IscsiDetachArgs) -> Result<(), super::CliError> {
    let volume = ObjectName::parse("volume", &a.volume)?;
    let iqn = a.iqn.as_deref().map(Iqn::parse).transpose()?;
    let opts = IscsiOptions {
        logout_timeout: Duration::from_secs(a.logout_timeout),
        ..IscsiOptions::default()
    };
    let d = iscsi::detach_host(&HostRoot::real(), &volume, iqn.as_ref(), &opts)?;
    println!(
        "sessions={} removed_path={}",
        d.sessions.join(","),
        d.removed_path
    );
    Ok(())
}
