//! The `talon` command line: `serve` runs the daemon; the other verbs are thin
//! clients of [`crate::client`] or call host library code directly.
//!
//! ```text
//!   talon serve ──> serve::serve(opts, SIGINT|SIGTERM)
//!   talon get / node / rpc ──> client::Client ──UDS──> daemon
//! ```

pub mod attach;
pub mod backup;
pub mod doctor;
pub mod host;
pub mod longhorn_engine;
pub mod longhorn_pod;
pub mod ns;
pub mod output;
pub mod volume;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::api::volume::VolumeView;
use crate::client::{Client, DEFAULT_SOCKET};
use output::{Format, print_value};

/// Boxed error for CLI commands.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;

/// talon: replicated SPDK block volumes for Kubernetes and Talos Linux.
#[derive(Debug, Parser)]
#[command(name = "talon", version = crate::VERSION, about, propagate_version = true)]
pub struct Cli {
    /// The daemon's API socket.
    #[arg(long, global = true, env = "TALON_SOCKET", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// Threads of talon's async runtime (default: the host's CPUs, at most
    /// [`MAX_DEFAULT_WORKERS`]): SPDK polls its own cores, and a worker per
    /// CPU of a large host only adds wake-ups to talon's idle cost.
    #[arg(long, global = true, env = "TALON_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub worker_threads: Option<u16>,
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node daemon (on SIGTERM/SIGINT spdk_tgt and tgtd keep serving
    /// and the next talon adopts them, unless --stop-targets-on-exit).
    Serve(Box<ServeArgs>),
    /// Start spdk_tgt and tgtd as `talon serve --target-keeper` asks, and keep
    /// them running (the data path's own pod; docs/upgrade.md).
    KeepTargets(KeepTargetsArgs),
    /// Show resources: `get types`, `get controllers`, `get <type> [id]`.
    Get(GetArgs),
    /// This node.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Volumes: create, get, list, delete, expand, clone, revert, attach, detach, activate, wait.
    #[command(subcommand)]
    Volume(volume::VolumeCommand),
    /// Snapshots: create, list, delete.
    #[command(subcommand)]
    Snapshot(volume::SnapshotCommand),
    /// Disks: add, list, remove, format.
    #[command(subcommand)]
    Disk(volume::DiskCommand),
    /// Orphan lvols (no volume or Longhorn replica owns them): list, remove.
    #[command(subcommand)]
    Orphan(volume::OrphanCommand),
    /// Backups to a backup target (S3, vfs): create, list, get, delete, restore, store-list.
    #[command(subcommand)]
    Backup(backup::BackupCommand),
    /// Whether this host serves volumes (V1 or V2; --require-v2: V2), what it lacks for V2,
    /// and the Talos patch that fixes it (no daemon needed).
    Doctor(doctor::DoctorArgs),
    /// Host operations that need no daemon.
    Host(HostArgs),
    /// Attach a volume on this host without the daemon (operators, guest tests).
    Attach(attach::AttachArgs),
    /// Detach a volume from this host without the daemon.
    Detach(attach::DetachArgs),
    /// Call any API method with JSON params (for operators and scripts).
    Rpc {
        /// Method name, e.g. `node_info`.
        method: String,
        /// Named params as a JSON object.
        #[arg(default_value = "{}")]
        params: String,
    },
}

/// `talon serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Data directory: persisted state, V1 volume files, identity.
    #[arg(long, env = "TALON_DATA_DIR", default_value = "/var/lib/talon")]
    pub data_dir: PathBuf,
    /// YAML file of desired state (node, disks, volumes) applied at start.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Also serve the API on this TCP address (needs --token-file).
    #[arg(long)]
    pub listen_tcp: Option<std::net::SocketAddr>,
    /// File holding the bearer token required on the TCP listener; talon also
    /// presents it to the nodes of remote replicas (one token for the cluster).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The TCP listener serves TLS with this certificate chain (PEM; with
    /// --tls-key). It is also this node's client certificate towards peers.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM, mode 0600 or 0400).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// TCP clients must present a certificate signed by this CA (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Call the admin API of peer nodes (remote replicas) over TLS, checking
    /// their certificates against this CA (PEM).
    #[arg(long)]
    pub tls_peer_ca: Option<PathBuf>,
    /// Directory for the sockets of spdk_tgt and tgtd.
    #[arg(long, default_value = "/run/talon")]
    pub run_dir: PathBuf,
    /// Where the host's / is (when talon runs in a container with the host mounted).
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    /// The spdk_tgt binary (else $TALON_SPDK_DIR/build/bin/spdk_tgt, else PATH).
    #[arg(long)]
    pub spdk_tgt: Option<PathBuf>,
    /// spdk_tgt's core mask.
    #[arg(long, default_value = "0x1")]
    pub spdk_cpumask: String,
    /// Run spdk_tgt without hugepages (`--no-huge -s N`; development only).
    #[arg(long)]
    pub no_huge: bool,
    /// Memory in MiB for spdk_tgt with --no-huge.
    #[arg(long, default_value_t = 2048, requires = "no_huge")]
    pub no_huge_mem_mib: u64,
    /// Run spdk_tgt in interrupt mode (no busy polling).
    #[arg(long)]
    pub interrupt_mode: bool,
    /// The node's default engine for `auto` volumes on an `auto` node.
    #[arg(long, value_enum, default_value_t = EngineArg::Auto)]
    pub engine: EngineArg,
    /// One more argument for spdk_tgt, passed as given (repeat it for more),
    /// e.g. `--spdk-arg=--disable-cpumask-locks`.
    #[arg(long = "spdk-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub spdk_args: Vec<std::ffi::OsString>,
    /// Stop spdk_tgt and tgtd when talon stops (draining the node). Without
    /// it they keep serving volumes across a restart or an upgrade of talon,
    /// and the next talon adopts them.
    #[arg(
        long,
        env = "TALON_STOP_TARGETS_ON_EXIT",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub stop_targets_on_exit: bool,
    /// Start although <data-dir>/state.redb is missing while <data-dir>/v1
    /// holds volume files (the store that described them was deleted or
    /// moved): they are moved to <data-dir>/v1/orphaned/<time>/ (kept, never
    /// served, copy the data out by hand) and talon starts as an empty node.
    /// Without it talon refuses to start and names the files.
    #[arg(long)]
    pub set_aside_orphan_data: bool,
    /// spdk_tgt and tgtd are run by `talon keep-targets` (another pod sharing
    /// the run dir): talon never starts or stops them itself, it writes what
    /// should run under <run-dir>/keeper/ and adopts what the keeper started.
    #[arg(
        long,
        env = "TALON_TARGET_KEEPER",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub target_keeper: bool,
    /// Serve Longhorn's V2 instance-manager gRPC protocol on this address and
    /// the four ports after it (Longhorn: 0.0.0.0:8500, so 8500-8504).
    #[arg(long, value_name = "ADDR:PORT")]
    pub longhorn_listen: Option<std::net::SocketAddr>,
    /// The ports Longhorn instances' NVMe/TCP exports are given from.
    #[arg(long, value_name = "LOW-HIGH", default_value = "20001-30000", value_parser = parse_port_range)]
    pub longhorn_port_range: std::ops::RangeInclusive<u16>,
    /// The Longhorn replicas on one disk may add up to this percentage of
    /// its capacity (thin replicas; keep it at or above Longhorn's
    /// storage-over-provisioning-percentage); a ReplicaCreate or expansion
    /// past it is refused with RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "PERCENT", default_value_t = crate::longhorn::server::LonghornOptions::DEFAULT_OVERCOMMIT_PERCENT, value_parser = clap::value_parser!(u32).range(100..=100_000))]
    pub longhorn_overcommit_percent: u32,
    /// Open connections to the five Longhorn ports in all; past it a connection is closed on
    /// accept (lowered, with a warning, to fit the descriptor limit).
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub longhorn_max_connections: u32,
    /// Open connections to the Longhorn ports from one peer address.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub longhorn_max_connections_per_peer: u32,
    /// A Longhorn connection that moves no byte either way for this many seconds is closed (a
    /// live client answers the HTTP/2 pings sent every 30 s).
    #[arg(long, value_name = "SECONDS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(31..=86_400))]
    pub longhorn_idle_timeout: u64,
}

/// `talon keep-targets`.
#[derive(Debug, clap::Args)]
pub struct KeepTargetsArgs {
    /// The run dir shared with `talon serve` (sockets, tgtd's pid file, keeper/).
    #[arg(long, default_value = "/run/talon")]
    pub run_dir: PathBuf,
    /// Where the host's / is (when the keeper runs in a container with the host mounted).
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    /// The spdk_tgt binary (else $TALON_SPDK_DIR/build/bin/spdk_tgt, else PATH).
    #[arg(long)]
    pub spdk_tgt: Option<PathBuf>,
}

/// `LOW-HIGH`, both ports, LOW <= HIGH.
pub fn parse_port_range(s: &str) -> Result<std::ops::RangeInclusive<u16>, String> {
    let (lo, hi) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?} is not LOW-HIGH"))?;
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{p:?} is not a port"))
    };
    let (lo, hi) = (port(lo)?, port(hi)?);
    if lo > hi {
        return Err(format!("{s:?}: {lo} is above {hi}"));
    }
    Ok(lo..=hi)
}

/// `talon serve --engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineArg {
    /// V2 when SPDK is usable, else V1.
    Auto,
    /// tgtd/iSCSI.
    V1,
    /// SPDK (spdk_tgt, spawned or adopted).
    V2,
    /// SPDK in-process: talon runs the SPDK framework itself (needs a talon
    /// built with `--features spdk-embedded`).
    SpdkEmbedded,
}

impl From<EngineArg> for crate::resources::config::EngineKind {
    fn from(e: EngineArg) -> Self {
        match e {
            EngineArg::Auto => Self::Auto,
            EngineArg::V1 => Self::V1,
            EngineArg::V2 | EngineArg::SpdkEmbedded => Self::V2,
        }
    }
}

/// `talon host`.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// Where the host's / is (when talon runs in a container with the host mounted).
    #[arg(long, global = true, default_value = "/")]
    pub host_root: PathBuf,
    #[command(subcommand)]
    pub command: HostCommand,
}

/// `talon host ...`.
#[derive(Debug, Subcommand)]
pub enum HostCommand {
    /// Run programs and read files inside another process's namespaces.
    #[command(flatten)]
    Ns(ns::HostNsCommand),
    /// Hugepages and NVMe PCI devices.
    #[command(flatten)]
    Prep(host::HostCommand),
}

/// `talon get`.
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    /// `types`, `controllers`, or a resource type (e.g. `volume`).
    pub what: String,
    /// A resource id.
    pub id: Option<String>,
    /// Output format (default: a table; for `volume NAME`, its description).
    #[arg(short, long, value_enum)]
    pub output: Option<Format>,
    /// Keep streaming changes.
    #[arg(short, long)]
    pub watch: bool,
}

/// `talon node`.
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Version, host, kernel, OS and engines.
    Info {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
        output: Format,
    },
    /// Stop the daemon; spdk_tgt and tgtd keep serving for the next talon.
    Stop,
    /// Stop the daemon and spdk_tgt and tgtd with it (take the node out of
    /// service: detach or move its volumes first).
    Drain,
}

/// The HTTP, WebSocket, gRPC and JSON-RPC libraries. Their trace output
/// carries request headers and bodies (the TCP listener's bearer token, CHAP
/// and DH-HMAC secrets), and their debug output is a line per frame or
/// connection: [`log_filter`] caps them, never raising one above what the
/// spec gives it. Prefixes match: `jsonrpsee` is also `jsonrpsee-client` and
/// `jsonrpsee-server`, `hyper` also `hyper_util`, `tower` also `tower_http`.
const QUIET_LIBRARIES: &[&str] = &[
    "hyper",
    "hyper_util",
    "h2",
    "jsonrpsee",
    "jsonrpsee_server",
    "jsonrpsee_core",
    "soketto",
    "tonic",
    "tower",
    "tower_http",
];

/// The log filter for `spec` (`TALON_LOG`'s syntax; `info` when none, empty
/// or invalid). Each of [`QUIET_LIBRARIES`] logs at the level the spec gives it
/// (its own directive, else the spec's default level) and at debug at most:
/// `info` keeps them at info (no per-frame or per-connection line),
/// `debug` shows their debug lines, `trace` never shows their trace.
pub fn log_filter(spec: Option<&str>) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    let spec = spec
        .filter(|s| !s.trim().is_empty() && EnvFilter::try_new(s).is_ok())
        .unwrap_or("info");
    let directives = capped_directives(spec);
    EnvFilter::try_new(directives.join(",")).unwrap_or_else(|_| EnvFilter::new("info"))
}

/// `spec`'s directives with [`QUIET_LIBRARIES`] capped (see [`log_filter`]):
/// a directive within a library, or one naming no target (a span's, which
/// would reach the libraries' events in that span), at debug at most, and a
/// directive for each library at the level the spec gives it, capped.
fn capped_directives(spec: &str) -> Vec<String> {
    use tracing_subscriber::filter::LevelFilter;
    let cap = |l: LevelFilter| l.min(LevelFilter::DEBUG);
    let level_of = |s: &str| s.trim().parse::<LevelFilter>().ok();
    // targets other directives do not name are off unless the spec has a bare level
    let mut default = LevelFilter::OFF;
    let mut targets: Vec<(String, LevelFilter)> = Vec::new();
    let mut out = Vec::new();
    for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if let Some(l) = level_of(d) {
            default = l;
            out.push(d.to_string());
            continue;
        }
        // `target[span{fields}]=level`; without `=level` it means trace
        let (lhs, level) = d
            .rsplit_once('=')
            .and_then(|(lhs, l)| Some((lhs, level_of(l)?)))
            .unwrap_or((d, LevelFilter::TRACE));
        let target = lhs.split('[').next().unwrap_or_default().trim();
        let static_ = !lhs.contains('[');
        let within_library = QUIET_LIBRARIES.iter().any(|lib| target.starts_with(lib));
        if target.is_empty() || within_library {
            out.push(format!("{lhs}={}", cap(level)));
        } else {
            out.push(d.to_string());
        }
        if static_ {
            targets.push((target.to_string(), level));
        }
    }
    for lib in QUIET_LIBRARIES {
        // the most specific directive whose target covers the library, else the default
        let given = targets
            .iter()
            .filter(|(t, _)| lib.starts_with(t.as_str()))
            .max_by_key(|(t, _)| t.len())
            .map(|(_, l)| *l)
            .unwrap_or(default);
        if !targets.iter().any(|(t, _)| t == lib) {
            out.push(format!("{lib}={}", cap(given)));
        }
    }
    out
}

fn init_logging(format: LogFormat) {
    let filter = log_filter(std::env::var("TALON_LOG").ok().as_deref());
    // colours only for a person at a terminal: a log file or journal gets plain text
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Entry point of the `talon` binary.
pub fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if longhorn_engine::is_engine_argv(&argv) {
        // longhorn-manager's backup target calls of Longhorn's engine binary
        return longhorn_engine::main(argv);
    }
    let cli = if longhorn_pod::is_pod_argv(&argv) {
        // Longhorn's instance-manager pod arguments
        let skip = if argv.get(1).and_then(|a| a.to_str()) == Some(longhorn_pod::START) {
            2
        } else {
            1
        };
        let rest: Vec<String> = argv
            .iter()
            .skip(skip)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        match longhorn_pod::serve_argv(&rest) {
            Ok(talon_argv) => Cli::parse_from(talon_argv),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        Cli::parse_from(argv)
    };
    init_logging(cli.log_format);
    let workers = runtime_workers(
        cli.worker_threads,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", crate::util::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// The most runtime threads talon starts by itself: the controllers, the
/// API and Longhorn's gRPC servers are I/O-bound (SPDK does the data path
/// on its own cores); measured in docs/sizing.md.
pub const MAX_DEFAULT_WORKERS: usize = 4;

/// The runtime's worker threads: what was asked (`--worker-threads`,
/// `TALON_WORKER_THREADS`), else the host's CPUs up to
/// [`MAX_DEFAULT_WORKERS`].
fn runtime_workers(asked: Option<u16>, cpus: usize) -> usize {
    asked.map_or(cpus.clamp(1, MAX_DEFAULT_WORKERS), usize::from)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => tracing::info!("SIGINT"),
        _ = term.recv() => tracing::info!("SIGTERM"),
    }
}

async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Serve(a) => {
            let opts = crate::serve::ServeOptions {
                data_dir: a.data_dir,
                config: a.config,
                socket: cli.socket,
                listen_tcp: a.listen_tcp,
                token_file: a.token_file,
                tls: crate::api::tls::TlsOptions {
                    cert: a.tls_cert,
                    key: a.tls_key,
                    client_ca: a.tls_client_ca,
                    peer_ca: a.tls_peer_ca,
                },
                run_dir: a.run_dir,
                host_root: a.host_root,
                spdk: crate::controllers::engine::selection::SpdkOptions {
                    spdk_tgt: a.spdk_tgt,
                    cpumask: a.spdk_cpumask,
                    no_huge: a.no_huge,
                    no_huge_mem_mib: a.no_huge_mem_mib,
                    interrupt_mode: a.interrupt_mode,
                    engine: a.engine.into(),
                    embedded: a.engine == EngineArg::SpdkEmbedded,
                    extra_args: a.spdk_args,
                    target_keeper: a.target_keeper,
                    ..Default::default()
                },
                stop_targets_on_exit: a.stop_targets_on_exit,
                set_aside_orphan_data: a.set_aside_orphan_data,
            };
            let longhorn = a
                .longhorn_listen
                .map(|listen| crate::longhorn::server::LonghornOptions {
                    listen,
                    ports: a.longhorn_port_range.clone(),
                    limits: crate::longhorn::bounds::GrpcLimits {
                        max_connections: a.longhorn_max_connections as usize,
                        max_per_peer: a.longhorn_max_connections_per_peer as usize,
                        idle: std::time::Duration::from_secs(a.longhorn_idle_timeout),
                        ..Default::default()
                    },
                    overcommit_percent: a.longhorn_overcommit_percent,
                });
            crate::serve::serve_with(opts, longhorn, shutdown_signal()).await?;
        }
        Command::KeepTargets(a) => {
            let opts = crate::keeper::KeeperOptions {
                run_dir: a.run_dir,
                host_root: a.host_root,
                spdk_tgt: a.spdk_tgt,
                poll: std::time::Duration::from_millis(500),
            };
            crate::keeper::run(opts, shutdown_signal()).await?;
        }
        Command::Get(a) => get(&cli.socket, a).await?,
        Command::Attach(a) => attach::run_attach(a)?,
        Command::Detach(a) => attach::run_detach(a)?,
        Command::Node(NodeCommand::Info { output }) => {
            let c = Client::connect_unix(&cli.socket).await?;
            let info = c.node_info().await?;
            if output == Format::Table {
                output::print_node_info(&info);
            } else {
                print_value(&serde_json::to_value(info)?, output)?;
            }
        }
        Command::Node(cmd @ (NodeCommand::Stop | NodeCommand::Drain)) => {
            let drain = matches!(cmd, NodeCommand::Drain);
            let c = Client::connect_unix(&cli.socket).await?;
            let r: crate::api::types::NodeStopResult = c
                .call("node_stop", crate::api::types::NodeStopParams { drain })
                .await?;
            if r.targets_stop {
                println!("talon stops, and spdk_tgt and tgtd with it");
            } else {
                println!("talon stops; spdk_tgt and tgtd keep serving for the next talon");
            }
        }
        Command::Volume(cmd) => volume::run_volume(&Client::connect_unix(&cli.socket).await?, cmd).await?,
        Command::Snapshot(cmd) => {
            volume::run_snapshot(&Client::connect_unix(&cli.socket).await?, cmd).await?
        }
        Command::Disk(cmd) => volume::run_disk(&Client::connect_unix(&cli.socket).await?, cmd).await?,
        Command::Orphan(cmd) => volume::run_orphan(&Client::connect_unix(&cli.socket).await?, cmd).await?,
        Command::Backup(cmd) => backup::run(&Client::connect_unix(&cli.socket).await?, cmd).await?,
        Command::Doctor(a) => tokio::task::block_in_place(|| doctor::run(a))?,
        Command::Host(h) => {
            let root = crate::host::HostRoot::new(&h.host_root);
            match h.command {
                HostCommand::Ns(cmd) => {
                    return tokio::task::block_in_place(|| ns::run(cmd, &root))
                        .map_err(|e| e.to_string().into());
                }
                HostCommand::Prep(cmd) => tokio::task::block_in_place(|| host::run_command(&root, cmd))?,
            }
        }
        Command::Rpc { method, params } => {
            let params: serde_json::Value =
                serde_json::from_str(&params).map_err(|e| format!("params are not JSON: {e}"))?;
            let c = Client::connect_unix(&cli.socket).await?;
            let v: serde_json::Value = c.call(&method, params).await?;
            print_value(&v, Format::Json)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `talon get volume NAME`: the resource with its status beside it (the
/// engine's state and exports, replicas with their state and a rebuild's
/// progress, the attachment, the last error; `-o table`: its row of `volume
/// list`); with `--watch`, a line each time one of them changes.
pub(crate) async fn get_volume(
    c: &Client,
    name: &str,
    output: Option<Format>,
    watch: bool,
) -> Result<(), CliError> {
    let by_name = || crate::api::volume::NameParams {
        name: name.to_string(),
        wait: false,
        timeout_seconds: None,
    };
    // volume_get first: it checks the name and says "volume ... not found"
    let view: VolumeView = c.call("volume_get", by_name()).await?;
    let output = match output {
        None => {
            print!("{}", volume::describe_volume(&view));
            Format::Table
        }
        Some(Format::Table) => {
            volume::volume_rows(std::slice::from_ref(&view));
            Format::Table
        }
        Some(output) => {
            let r = c.get("Volume", name).await?;
            let mut v = serde_json::to_value(&r)?;
            v["status"] = serde_json::json!({
                "engine": view.engine,
                "replicas": view.replicas,
                "attachment": view.attachment,
            });
            print_value(&v, output)?;
            output
        }
    };
    if !watch {
        return Ok(());
    }
    let mut sub = c.watch(None, false).await?;
    let mut last = volume::volume_line(&view);
    if output == Format::Table {
        println!("{}  {last}", chrono_now());
    }
    while let Some(ev) = sub.next().await {
        let ev = ev.map_err(|e| format!("watch ended: {e}"))?;
        let res = &ev.resource;
        let mine = match res.metadata.type_.as_str() {
            "Volume" | "EngineStatus" | "AttachmentStatus" => res.metadata.id == name,
            "ReplicaStatus" => {
                serde_json::from_value::<crate::resources::engine::ReplicaStatus>(res.spec.clone())
                    .is_ok_and(|r| r.volume == name)
            }
            _ => false,
        };
        if !mine {
            continue;
        }
        let view: VolumeView = match c.call("volume_get", by_name()).await {
            Ok(v) => v,
            Err(_) => {
                println!("{}  {name} deleted", chrono_now());
                return Ok(());
            }
        };
        match output {
            Format::Table => {
                let line = volume::volume_line(&view);
                if line != last {
                    println!("{}  {line}", chrono_now());
                    last = line;
                }
            }
            _ => output::print_event(&ev, output, None)?,
        }
    }
    Ok(())
}

/// The wall-clock time of day (UTC) for watch lines.
fn chrono_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{:02}:{:02}:{:02}", secs / 3600 % 24, secs / 60 % 60, secs % 60)
}

async fn get(socket: &std::path::Path, a: GetArgs) -> Result<(), CliError> {
    let c = Client::connect_unix(socket).await?;
    let is_volume = ["volume", "volumes"]
        .iter()
        .any(|v| a.what.eq_ignore_ascii_case(v));
    if is_volume && a.id.is_some() {
        return get_volume(&c, a.id.as_deref().unwrap_or_default(), a.output, a.watch).await;
    }
    let fmt = a.output.unwrap_or(Format::Table);
    if is_volume && fmt == Format::Table && !a.watch {
        // the same table as `volume list`: the engine as asked and as resolved
        let v: Vec<VolumeView> = c.call("volume_list", crate::api::types::NoParams {}).await?;
        volume::volume_rows(&v);
        return Ok(());
    }
    match a.what.as_str() {
        "types" | "type" => {
            let types = c.types().await?;
            if fmt == Format::Table {
                output::print_types(&types);
            } else {
                print_value(&serde_json::to_value(types)?, fmt)?;
            }
        }
        "controllers" | "controller" => {
            let cs = c.controllers().await?;
            if fmt == Format::Table {
                output::print_controllers(&cs);
            } else {
                print_value(&serde_json::to_value(cs)?, fmt)?;
            }
        }
        what => {
            let types = c.types().await?;
            let info = types
                .iter()
                .find(|t| {
                    let (tl, w) = (t.type_.to_ascii_lowercase(), what.to_ascii_lowercase());
                    tl == w || format!("{tl}s") == w || format!("{tl}es") == w
                })
                .cloned();
            let items = match &a.id {
                Some(id) => vec![c.get(what, id).await?],
                None => c.list(what).await?,
            };
            if fmt == Format::Table {
                output::print_resources(&items, info.as_ref());
            } else if a.id.is_some() {
                print_value(&serde_json::to_value(&items[0])?, fmt)?;
            } else {
                print_value(&serde_json::to_value(&items)?, fmt)?;
            }
            if a.watch {
                let mut sub = c.watch(Some(what), false).await?;
                while let Some(ev) = sub.next().await {
                    let ev = ev.map_err(|e| format!("watch ended: {e}"))?;
                    if a.id.as_ref().is_some_and(|id| id != &ev.resource.metadata.id) {
                        continue;
                    }
                    output::print_event(&ev, fmt, info.as_ref())?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::Level;
    use tracing_subscriber::layer::SubscriberExt;

    use super::{MAX_DEFAULT_WORKERS, log_filter, runtime_workers};

    #[test]
    fn the_runtime_takes_the_threads_asked_else_the_cpus_up_to_a_bound() {
        assert_eq!(runtime_workers(None, 2), 2);
        assert_eq!(runtime_workers(None, 64), MAX_DEFAULT_WORKERS);
        assert_eq!(runtime_workers(None, 0), 1);
        assert_eq!(runtime_workers(Some(1), 64), 1);
        assert_eq!(runtime_workers(Some(16), 2), 16);
    }

    /// Records the target and level of each event it is given.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<(String, Level)>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_event(&self, ev: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            let m = ev.metadata();
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((m.target().to_string(), *m.level()));
        }
    }

    /// The most verbose level at which `target` logs under `spec` (None: not even error).
    fn most_verbose(seen: &[(String, Level)], target: &str) -> Option<Level> {
        seen.iter().filter(|(t, _)| t == target).map(|(_, l)| *l).max()
    }

    /// What `log_filter(spec)` lets through of an event at each level from
    /// each library (the targets their events carry) and from talon.
    fn seen_under(spec: Option<&str>) -> Vec<(String, Level)> {
        let seen = Seen::default();
        let sub = tracing_subscriber::registry()
            .with(log_filter(spec))
            .with(seen.clone());
        tracing::subscriber::with_default(sub, || {
            macro_rules! each_level {
                ($($t:literal),*) => {$(
                    tracing::error!(target: $t, "e");
                    tracing::warn!(target: $t, "w");
                    tracing::info!(target: $t, "i");
                    tracing::debug!(target: $t, "d");
                    tracing::trace!(target: $t, "t");
                )*};
            }
            each_level!(
                "hyper",
                "hyper_util::client",
                "h2::codec",
                "jsonrpsee-client",
                "jsonrpsee-server",
                "jsonrpsee_core",
                "soketto",
                "tonic::transport",
                "tower::buffer",
                "tower_http",
                "talon::api"
            );
        });
        seen.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    const LIBRARY_TARGETS: &[&str] = &[
        "hyper",
        "hyper_util::client",
        "h2::codec",
        "jsonrpsee-client",
        "jsonrpsee-server",
        "jsonrpsee_core",
        "soketto",
        "tonic::transport",
        "tower::buffer",
        "tower_http",
    ];

    #[test]
    fn the_libraries_log_at_the_level_the_spec_gives_them_and_never_trace() {
        for (spec, libs, own) in [
            // the default: no DEBUG line from a library (a CLI call writes nothing)
            (None, Level::INFO, Level::INFO),
            (Some("info"), Level::INFO, Level::INFO),
            (Some("talon=loud"), Level::INFO, Level::INFO),
            (Some(""), Level::INFO, Level::INFO),
            (Some("warn"), Level::WARN, Level::WARN),
            (Some("debug"), Level::DEBUG, Level::DEBUG),
            // their trace holds secrets
            (Some("trace"), Level::DEBUG, Level::TRACE),
            (Some("info,talon=trace"), Level::INFO, Level::TRACE),
        ] {
            let seen = seen_under(spec);
            for t in LIBRARY_TARGETS {
                assert_eq!(most_verbose(&seen, t), Some(libs), "{t} under {spec:?}");
            }
            assert_eq!(
                most_verbose(&seen, "talon::api"),
                Some(own),
                "talon under {spec:?}"
            );
        }
    }

    /// A group's summary that lists its verbs ("Volumes: create, get, ...") lists every one.
    #[test]
    fn help_summaries_list_every_verb() {
        use clap::CommandFactory;
        let cli = super::Cli::command();
        let mut listed = 0;
        for group in cli.get_subcommands() {
            let about = group.get_about().map(|a| a.to_string()).unwrap_or_default();
            let Some((_, verbs)) = about.rsplit_once(": ") else {
                continue;
            };
            if group.get_subcommands().next().is_none() {
                continue;
            }
            let mut said: Vec<&str> = verbs.trim_end_matches('.').split(", ").collect();
            let mut has: Vec<&str> = group.get_subcommands().map(|c| c.get_name()).collect();
            said.sort_unstable();
            has.sort_unstable();
            assert_eq!(said, has, "talon {}: {about:?}", group.get_name());
            listed += 1;
        }
        assert!(listed >= 4, "volume, snapshot, disk and backup list their verbs");
    }

    #[test]
    fn a_library_directive_is_kept_below_trace_and_nothing_else_raises_one() {
        // its own directive, lowered or raised, but never to trace
        let seen = seen_under(Some("info,h2=trace,tonic=warn,jsonrpsee=debug"));
        assert_eq!(most_verbose(&seen, "h2::codec"), Some(Level::DEBUG));
        assert_eq!(most_verbose(&seen, "tonic::transport"), Some(Level::WARN));
        assert_eq!(most_verbose(&seen, "jsonrpsee-client"), Some(Level::DEBUG));
        assert_eq!(most_verbose(&seen, "hyper"), Some(Level::INFO));
        // a more specific directive inside a library, a bare target (trace), a span's directive
        let seen = seen_under(Some("info,h2::codec=trace,soketto,[conn]=trace"));
        assert_eq!(most_verbose(&seen, "h2::codec"), Some(Level::DEBUG));
        assert_eq!(most_verbose(&seen, "soketto"), Some(Level::DEBUG));
        // a prefix of a library's name is a directive for it too, capped
        let seen = seen_under(Some("warn,t=trace"));
        assert_eq!(most_verbose(&seen, "tower::buffer"), Some(Level::DEBUG));
        assert_eq!(most_verbose(&seen, "hyper"), Some(Level::WARN));
        // no default level: only what the spec names logs
        let seen = seen_under(Some("talon=debug"));
        assert_eq!(most_verbose(&seen, "talon::api"), Some(Level::DEBUG));
        for t in LIBRARY_TARGETS {
            assert_eq!(most_verbose(&seen, t), None, "{t}");
        }
    }
}
