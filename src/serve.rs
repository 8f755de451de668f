//! `talon serve`: the node daemon.
//!
//! ```text
//!   data dir ──flock talon.lock──> State::open_typed(state.redb) ──> config file applied (desired state)
//!        │        (every record decoded; a missing store beside V1 volume files refused)
//!        └──> hugepages sized for the desired state (host::prepare_at_start)
//!        └──> Runtime (controllers::register_all) ──start──┐
//!   API: bind_unix(socket 0600) [+ TCP with token] ────────┼──> serve until SIGINT/SIGTERM
//!   shutdown: stop API (socket removed) ──> stop controllers ──> close store ──> release lock
//!             (spdk_tgt and tgtd keep serving for the next talon, unless --stop-targets-on-exit)
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::api::types::{EngineAvailability, NodeInfo};
use crate::api::{ApiBuilder, ApiContext};
use crate::controllers::engine::TargetsOnExit;
use crate::controllers::engine::selection::{EngineSelection, SpdkOptions};
use crate::controllers::{self, Deps};
use crate::host::HostRoot;
use crate::names::ObjectName;
use crate::resources::config::{Disk, EngineKind, NodeConfig, Volume};
use crate::runtime::{Runtime, Spec, State, StateError};

/// Options of `talon serve`.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The data directory (state store, V1 volume files, identity).
    pub data_dir: PathBuf,
    /// A YAML file of desired state applied at start.
    pub config: Option<PathBuf>,
    /// The API's Unix socket.
    pub socket: PathBuf,
    /// Optional TCP listener (requires `token_file`).
    pub listen_tcp: Option<SocketAddr>,
    /// File holding the bearer token for the TCP listener.
    pub token_file: Option<PathBuf>,
    /// TLS for the TCP listener and for calls to peer nodes (none set:
    /// plain TCP, with a warning at start).
    pub tls: crate::api::tls::TlsOptions,
    /// Directory for the sockets of spdk_tgt and tgtd.
    pub run_dir: PathBuf,
    /// The host's root (`/`, or where the host's / is mounted in a container).
    pub host_root: PathBuf,
    /// How SPDK is found and run, and the node's default engine.
    pub spdk: SpdkOptions,
    /// Stop spdk_tgt and tgtd when talon stops (a drain of the node); by
    /// default they keep serving and the next talon adopts them.
    pub stop_targets_on_exit: bool,
    /// Start although `state.redb` is missing while `<data_dir>/v1` holds
    /// volume data: the files are set aside under `<data_dir>/v1/orphaned/`
    /// (kept, never served). Without it talon refuses to start.
    pub set_aside_orphan_data: bool,
}

/// The shortest bearer token the TCP listener accepts (256 bits of a random
/// hex or base64 string).
pub const MIN_TOKEN_BYTES: usize = 32;

/// Descriptors the daemon keeps for itself (the store, SPDK's and tgtd's
/// sockets, children's pipes, host files, the admin socket's clients),
/// never given to network clients.
const OWN_DESCRIPTORS: u64 = 512;

/// Why the daemon could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot create the data directory {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make {path} private (mode 0700/0600)")]
    Private {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("data directory {path} is in use by another talon (pid {holder})")]
    DataDirLocked { path: PathBuf, holder: String },
    #[error("cannot lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    State(#[from] StateError),
    #[error(
        "state store {store} does not exist, but the data directory holds volume data it described: \
         {files}; the store that described them is missing (deleted or moved), and starting as an \
         empty node would serve a new volume of an old name from its old file. Put the store back \
         (or restore it from a backup), or start with --set-aside-orphan-data to move these to \
         {orphaned}/ (kept, never served) and start empty",
        files = list_paths(files),
        orphaned = orphaned.display()
    )]
    OrphanData {
        store: PathBuf,
        files: Vec<PathBuf>,
        orphaned: PathBuf,
    },
    #[error(transparent)]
    V1Data(#[from] crate::tgt::VolumeError),
    #[error("config file {path} cannot be read")]
    ConfigRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is invalid: {message}")]
    ConfigInvalid { path: PathBuf, message: String },
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error(transparent)]
    Api(#[from] crate::api::server::ServeError),
    #[error("--listen-tcp needs --token-file")]
    TokenMissing,
    #[error("token file {path} cannot be read or is empty")]
    Token {
        path: PathBuf,
        source: Option<std::io::Error>,
    },
    #[error("token file {path} is accessible by group or others (mode {mode:o}); make it 0600 or 0400")]
    TokenMode { path: PathBuf, mode: u32 },
    #[error("the token in {path} has {len} bytes; at least {MIN_TOKEN_BYTES} are required")]
    TokenShort { path: PathBuf, len: usize },
    #[error(transparent)]
    Tls(#[from] crate::api::tls::TlsError),
    #[error("cannot listen on {addr}")]
    TcpBind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Target(#[from] crate::spdk::target::TargetError),
    #[error(transparent)]
    Longhorn(#[from] crate::longhorn::server::ServeError),
}

/// Up to ten paths, comma-separated, then how many more.
fn list_paths(paths: &[PathBuf]) -> String {
    let mut s = paths
        .iter()
        .take(10)
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > 10 {
        s.push_str(&format!(" and {} more", paths.len() - 10));
    }
    s
}

/// Opens the state store, decoding every record with its typed spec, and
/// deals with V1 volume data no record describes:
///
/// - the store does not exist but volume files do: refused
///   ([`ServeError::OrphanData`]) unless `set_aside` (`--set-aside-orphan-data`);
/// - otherwise files of volumes the store does not hold (a store restored from
///   an older backup) are moved to `<data_dir>/v1/orphaned/<time>/` with a
///   warning, so that a new volume of the same name never serves an old file.
fn open_store(data_dir: &Path, set_aside: bool) -> Result<State, ServeError> {
    let path = data_dir.join("state.redb");
    let v1 = crate::tgt::V1Store::new(data_dir);
    let missing =
        matches!(std::fs::symlink_metadata(&path), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    if missing && !set_aside {
        let files = v1.orphans(&Default::default())?;
        if !files.is_empty() {
            return Err(ServeError::OrphanData {
                store: path,
                files,
                orphaned: data_dir.join("v1/orphaned"),
            });
        }
    }
    let state = State::open_typed(&path, &crate::resources::registry())?;
    let known = state
        .list(Volume::NAMESPACE, Volume::TYPE)
        .into_iter()
        .map(|r| r.metadata.id)
        .collect();
    let orphans = v1.orphans(&known)?;
    if !orphans.is_empty() {
        let to = v1.set_aside(&orphans)?;
        tracing::warn!(files = %list_paths(&orphans), to = %to.display(),
            "volume data that no volume of the state store describes was set aside (kept, never served)");
    }
    Ok(state)
}

/// The desired state a config file may carry.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigFile {
    /// Node settings.
    #[serde(default)]
    pub node: Option<NodeConfig>,
    /// Disks by name.
    #[serde(default)]
    pub disks: BTreeMap<String, Disk>,
    /// Volumes by name.
    #[serde(default)]
    pub volumes: BTreeMap<String, Volume>,
}

/// The exclusive lock on a data directory, held while the daemon runs.
#[derive(Debug)]
pub struct DataDirLock {
    _flock: nix::fcntl::Flock<std::fs::File>,
}

/// Takes the data directory's lock, recording our pid; refuses with the
/// holder's pid when another talon has it.
/// Makes `path` and everything under it private to root, whatever modes it
/// finds (`mkdir -p` and a hostPath `DirectoryOrCreate` make 0755, files
/// created under another umask 0644): directories 0700, regular files 0600.
/// Symbolic links are not followed and other files (sockets, devices) are
/// left alone. Returns how many modes it changed.
pub fn make_private(path: &Path) -> Result<usize, ServeError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| ServeError::Private { path: p, source }
    };
    let mut changed = 0;
    let mut todo = vec![path.to_path_buf()];
    while let Some(p) = todo.pop() {
        let meta = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            // a file removed meanwhile (a volume being deleted) needs nothing
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(err(&p)(e)),
        };
        let want = if meta.is_dir() {
            for entry in std::fs::read_dir(&p).map_err(err(&p))? {
                todo.push(entry.map_err(err(&p))?.path());
            }
            0o700
        } else if meta.is_file() {
            0o600
        } else {
            continue;
        };
        if meta.permissions().mode() & 0o7777 != want {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(want)).map_err(err(&p))?;
            changed += 1;
        }
    }
    if changed > 0 {
        tracing::info!(path = %path.display(), changed, "made the data directory private (0700/0600)");
    }
    Ok(changed)
}

pub fn lock_data_dir(dir: &Path) -> Result<DataDirLock, ServeError> {
    let path = dir.join("talon.lock");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|source| ServeError::Lock {
            path: path.clone(),
            source,
        })?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(mut flock) => {
            let _ = flock.set_len(0);
            let _ = writeln!(&mut *flock, "{}", std::process::id());
            Ok(DataDirLock { _flock: flock })
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            let holder = std::fs::read_to_string(&path)
                .unwrap_or_default()
                .trim()
                .to_string();
            Err(ServeError::DataDirLocked {
                path: dir.to_path_buf(),
                holder,
            })
        }
        Err((_, e)) => Err(ServeError::Lock {
            path,
            source: e.into(),
        }),
    }
}

/// Applies a config file's desired state to the store (as the user), creating
/// or updating what it names and leaving everything else alone. Relative disk
/// paths are taken relative to `data_dir`.
pub fn apply_config_file(state: &State, path: &Path, data_dir: &Path) -> Result<(), ServeError> {
    let text = std::fs::read_to_string(path).map_err(|source| ServeError::ConfigRead {
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |message: String| ServeError::ConfigInvalid {
        path: path.to_path_buf(),
        message,
    };
    let de = serde_yaml_ng::Deserializer::from_str(&text);
    let cfg: ConfigFile = serde_path_to_error::deserialize(de).map_err(|e| invalid(e.to_string()))?;
    if let Some(node) = &cfg.node {
        for (key, dir) in [
            ("backupFolderRoot", &node.backup_folder_root),
            ("backupSecretsDir", &node.backup_secrets_dir),
        ] {
            if let Some(d) = dir
                && (!d.starts_with('/') || d.split('/').any(|p| p == ".." || p == "."))
            {
                return Err(invalid(format!(
                    "node.{key} {d:?} must be an absolute path without '.' or '..'"
                )));
            }
        }
        state.upsert_typed("node", node)?;
    }
    for (name, disk) in &cfg.disks {
        ObjectName::parse("disk", name).map_err(|e| invalid(e.to_string()))?;
        let mut disk = disk.clone();
        if let Some(p) = &disk.path
            && !p.starts_with('/')
        {
            disk.path = Some(data_dir.join(p).display().to_string());
        }
        state.upsert_typed(name, &disk)?;
    }
    for (name, vol) in &cfg.volumes {
        ObjectName::parse("volume", name).map_err(|e| invalid(e.to_string()))?;
        // the same checks as volume_create: nothing the engines cannot serve is stored
        crate::api::volume::check_volume_size(&format!("volume {name}"), vol.size_bytes)
            .map_err(|e| invalid(e.message))?;
        let node_v1 = state
            .get_typed::<NodeConfig>("node")?
            .is_some_and(|n| n.spec.engine == EngineKind::V1);
        let v1 = vol.engine == EngineKind::V1 || (vol.engine == EngineKind::Auto && node_v1);
        if v1 && vol.replicas as usize + vol.remote_replicas.len() > 1 {
            return Err(invalid(format!(
                "volume {name}: the V1 engine keeps one replica (one file), not {}: set replicas to 1, \
                 or use engine v2",
                vol.replicas as usize + vol.remote_replicas.len()
            )));
        }
        if vol.serve_replica.is_some() && vol.replica_hosts.is_empty() {
            return Err(invalid(format!(
                "volume {name}: serveReplica needs replicaHosts (the engine node's hostNqn)"
            )));
        }
        // the replicas' layout is the data's: a volume already stored keeps
        // the one it was made with, a new one gets what volume_create gives
        let mut vol = vol.clone();
        vol.raid_superblock = match state.get_typed::<Volume>(name)? {
            Some(stored) => stored.spec.raid_superblock,
            None => vol.wants_superblock(),
        };
        state.upsert_typed(name, &vol)?;
    }
    Ok(())
}

/// The engines this node can run, and why not (V2 from [`EngineSelection`]).
pub fn detect_engines(selection: &EngineSelection) -> Vec<EngineAvailability> {
    let v2 = EngineAvailability {
        engine: "v2".into(),
        available: selection.v2_available,
        detail: selection.reason.clone(),
    };
    let v1 = match which::which("tgtd").ok() {
        Some(p) => EngineAvailability {
            engine: "v1".into(),
            available: true,
            detail: p.display().to_string(),
        },
        None => EngineAvailability {
            engine: "v1".into(),
            available: false,
            detail: "tgtd not found (Debian package `tgt`)".into(),
        },
    };
    vec![v2, v1]
}

fn os_release(host: &HostRoot) -> (String, String) {
    match crate::host::os::detect(host) {
        Ok(os) => (os.id, os.pretty_name.unwrap_or_default()),
        Err(_) => ("unknown".to_string(), String::new()),
    }
}

/// Builds `node_info` for this process.
pub fn node_info_fn(
    host: HostRoot,
    data_dir: PathBuf,
    selection: &EngineSelection,
) -> Arc<dyn Fn() -> NodeInfo + Send + Sync> {
    let engines = detect_engines(selection);
    let ids = crate::attach::HostInitiators::load_or_create(&host, &data_dir).ok();
    Arc::new(move || {
        let (os_id, os_name) = os_release(&host);
        NodeInfo {
            version: crate::VERSION.to_string(),
            hostname: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            kernel: nix::sys::utsname::uname()
                .map(|u| u.release().to_string_lossy().into_owned())
                .unwrap_or_default(),
            os_id,
            os_name,
            data_dir: data_dir.display().to_string(),
            engines: engines.clone(),
            host_nqn: ids.as_ref().map(|i| i.nqn.to_string()).unwrap_or_default(),
            host_iqn: ids.as_ref().map(|i| i.iqn.to_string()).unwrap_or_default(),
        }
    })
}

/// Runs the daemon until `shutdown` completes.
pub async fn serve(opts: ServeOptions, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServeError> {
    serve_with(opts, None, shutdown).await
}

/// [`serve`], also serving Longhorn's instance-manager protocol when
/// `longhorn` is given (`--longhorn-listen`).
pub async fn serve_with(
    opts: ServeOptions,
    longhorn: Option<crate::longhorn::server::LonghornOptions>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    if opts.spdk.embedded && !cfg!(feature = "spdk-embedded") {
        return Err(crate::spdk::target::TargetError::EmbeddedNotBuilt.into());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&opts.data_dir)
        .map_err(|source| ServeError::DataDir {
            path: opts.data_dir.clone(),
            source,
        })?;
    let data_dir = std::fs::canonicalize(&opts.data_dir).map_err(|source| ServeError::DataDir {
        path: opts.data_dir.clone(),
        source,
    })?;
    let _lock = lock_data_dir(&data_dir)?;
    make_private(&data_dir)?;
    let state = open_store(&data_dir, opts.set_aside_orphan_data)?;
    make_private(&data_dir.join("state.redb"))?;
    if state.get_typed::<NodeConfig>("node")?.is_none() {
        state.create_typed("node", "", &NodeConfig::default())?;
    }
    if let Some(cfg) = &opts.config {
        apply_config_file(&state, cfg, &data_dir)?;
    }

    // the TCP listener's token, also presented to the nodes of remote replicas
    let token = match &opts.token_file {
        None => None,
        Some(p) => Some(read_token(p)?),
    };
    if opts.listen_tcp.is_some() && token.is_none() {
        return Err(ServeError::TokenMissing);
    }
    // every TLS file is read (and a key's mode checked) before anything listens
    let tls_server = opts.tls.server()?;
    let peer_tls = opts.tls.peer_client()?;
    let unix = crate::api::server::bind_unix(&opts.socket)?;
    // network clients may hold what is left of the descriptor limit once the
    // daemon's own (store, SPDK and tgtd sockets, children, the admin
    // socket's clients) and the admin TCP listener's are set aside
    let nofile = match crate::util::conn::raise_nofile() {
        Ok(n) => n.soft,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the descriptor limit; assuming 1024");
            1024
        }
    };
    let network_fds = nofile
        .saturating_sub(OWN_DESCRIPTORS + crate::api::server::TcpLimits::default().max_connections as u64);
    let tcp = match opts.listen_tcp {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::TcpBind { addr, source })?,
        ),
        None => None,
    };

    let longhorn_bound = match &longhorn {
        Some(l) => Some(crate::longhorn::server::bind(l).await?),
        None => None,
    };

    let host = HostRoot::new(&opts.host_root);
    let longhorn_session = crate::resources::longhorn::new_session();
    let longhorn_listing = crate::spdk::inventory::SharedListing::default();
    let deps = Deps {
        host: host.clone(),
        data_dir: data_dir.clone(),
        run_dir: opts.run_dir.clone(),
        spdk: opts.spdk.clone(),
        targets_on_exit: if opts.stop_targets_on_exit {
            TargetsOnExit::stop()
        } else {
            TargetsOnExit::leave()
        },
        peer_token: token.clone(),
        peer_tls,
        longhorn_peer_port: longhorn_bound
            .as_ref()
            .and_then(|b| b.addrs().last().map(SocketAddr::port))
            .unwrap_or(8504),
        longhorn: longhorn_bound.is_some(),
        longhorn_session: longhorn_session.clone(),
        longhorn_listing: longhorn_listing.clone(),
        spdk_run: crate::spdk::RunId::new(),
    };
    // hugepages first: the engine selection below looks at the free pool
    controllers::host::prepare_at_start(&state, &deps);
    let selection = EngineSelection::detect_with_socket(
        &opts.spdk,
        &host,
        &opts.spdk.target_config(&opts.run_dir).socket(),
    );
    tracing::info!(v2_available = selection.v2_available, reason = %selection.reason, "engine selection");
    let mut rt = Runtime::new(state.clone());
    controllers::register_all(&mut rt, &deps, &selection)?;
    let registry = crate::resources::registry();
    // `node_stop`: stop like SIGTERM, right after the answer went out; a drain stops the targets too
    let stop_asked = Arc::new(tokio::sync::Notify::new());
    let node_stop = {
        let (asked, targets) = (stop_asked.clone(), deps.targets_on_exit.clone());
        Arc::new(move |drain: bool| {
            if drain {
                targets.set_stop(true);
            }
            let asked = asked.clone();
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                asked.notify_one();
            });
            targets.stops()
        })
    };
    let ctx = ApiContext {
        state: state.clone(),
        registry: Arc::new(registry),
        statuses: rt.statuses(),
        node_info: node_info_fn(host, data_dir.clone(), &selection),
        node_stop,
    };
    let mut api = ApiBuilder::new(ctx);
    crate::api::register_core(&mut api);
    crate::api::volume::register(&mut api);
    let methods = api.build();
    let runtime = rt.start();
    tracing::info!(version = crate::VERSION, data_dir = %data_dir.display(), socket = %opts.socket.display(), "talon serving");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let unix_task = tokio::spawn(crate::api::server::serve_unix(
        unix,
        opts.socket.clone(),
        methods.clone(),
        stopped(stop_rx.clone()),
    ));
    let tcp_task = match (tcp, token) {
        (Some(l), Some(token)) => {
            if tls_server.is_some() {
                tracing::info!(addr = ?opts.listen_tcp, client_certificates = opts.tls.client_ca.is_some(), "API also on TCP with TLS (bearer token required)");
            } else {
                tracing::warn!(addr = ?opts.listen_tcp, "API also on TCP WITHOUT TLS: the bearer token and every call cross the network unencrypted (set --tls-cert and --tls-key)");
            }
            Some(tokio::spawn(crate::api::server::serve_tcp_tls(
                l,
                token,
                tls_server,
                crate::api::server::TcpLimits::default(),
                methods.clone(),
                stopped(stop_rx.clone()),
            )))
        }
        _ => None,
    };
    let longhorn_task = match (longhorn_bound, longhorn) {
        (Some(bound), Some(l)) => {
            tracing::info!(addrs = ?bound.addrs(), "Longhorn instance-manager protocol");
            let spdk_service_port = bound.addrs().last().map_or(8504, SocketAddr::port);
            let lh = crate::longhorn::service::Longhorn::new(
                state.clone(),
                crate::spdk::SpdkClient::of_run(
                    opts.spdk.target_config(&opts.run_dir).socket(),
                    &deps.spdk_run,
                    Some(longhorn_session.spdk_changes()),
                ),
                l.ports,
            )
            .with_peer_port(spdk_service_port)
            .with_overcommit(l.overcommit_percent)
            .with_hash_dir(data_dir.join("snaphash"))
            .with_backup_dir(data_dir.join("backup"))
            .with_session(longhorn_session)
            .with_listing(longhorn_listing);
            Some(tokio::spawn(crate::longhorn::server::serve(
                bound,
                lh,
                l.limits.clone().within(network_fds),
                stopped(stop_rx.clone()),
            )))
        }
        _ => None,
    };
    tokio::select! {
        _ = shutdown => {}
        _ = stop_asked.notified() => tracing::info!("node_stop asked"),
    }
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    let _ = unix_task.await;
    if let Some(t) = tcp_task {
        let _ = t.await;
    }
    if let Some(t) = longhorn_task {
        match t.await {
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::util::error_chain(&e), "Longhorn servers")
            }
            Err(e) => tracing::warn!(error = %e, "Longhorn servers task"),
            Ok(Ok(())) => {}
        }
    }
    let stop_targets = deps.targets_on_exit.stops();
    runtime.shutdown().await;
    // the store is closed when serve returns (a talon started again in the
    // same process opens it); a task that still holds it is named by count
    drop(methods); // the API's context holds the store too
    let held = state.close(crate::util::conn::STOP_GRACE).await;
    if held > 0 {
        tracing::warn!(held, grace = ?crate::util::conn::STOP_GRACE,
            "the state store is still held by tasks of this talon after the grace; it closes when they end");
    }
    if stop_targets {
        tracing::info!("stopped (targets stopped too)");
    } else {
        tracing::info!("stopped; spdk_tgt and tgtd, where running, keep serving for the next talon");
    }
    Ok(())
}

/// Reads a bearer token file: private (no group/other bits), not empty, at
/// least [`MIN_TOKEN_BYTES`] long.
fn read_token(p: &std::path::Path) -> Result<Arc<str>, ServeError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(p)
        .map_err(|e| ServeError::Token {
            path: p.to_path_buf(),
            source: Some(e),
        })?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(ServeError::TokenMode {
            path: p.to_path_buf(),
            mode: mode & 0o7777,
        });
    }
    let t = std::fs::read_to_string(p)
        .map_err(|e| ServeError::Token {
            path: p.to_path_buf(),
            source: Some(e),
        })?
        .trim()
        .to_string();
    if t.is_empty() {
        return Err(ServeError::Token {
            path: p.to_path_buf(),
            source: None,
        });
    }
    if t.len() < MIN_TOKEN_BYTES {
        return Err(ServeError::TokenShort {
            path: p.to_path_buf(),
            len: t.len(),
        });
    }
    Ok(Arc::<str>::from(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config file cannot flip a stored volume's layout (its data offset)
    /// and gives a new volume the one `volume_create` gives.
    #[test]
    fn a_config_file_keeps_a_stored_volume_layout_and_gives_new_ones_the_superblock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = dir.path().join("talon.yaml");
        std::fs::write(
            &cfg,
            "volumes:\n  new2:\n    sizeBytes: 16777216\n    replicas: 2\n    engine: v2\n  \
             one:\n    sizeBytes: 16777216\n    replicas: 1\n    engine: v2\n  \
             legacy:\n    sizeBytes: 16777216\n    replicas: 2\n    engine: v2\n",
        )
        .expect("config");
        let state = State::in_memory();
        let mut legacy: Volume =
            serde_json::from_value(serde_json::json!({"sizeBytes": 16777216, "replicas": 2, "engine": "v2"}))
                .expect("volume");
        legacy.raid_superblock = false;
        state.create_typed("legacy", "", &legacy).expect("legacy");
        apply_config_file(&state, &cfg, dir.path()).expect("apply");
        let layout = |n: &str| {
            state
                .get_typed::<Volume>(n)
                .expect("get")
                .expect("stored")
                .spec
                .raid_superblock
        };
        assert!(
            layout("new2"),
            "a new 2-replica volume gets the superblock layout"
        );
        assert!(!layout("one"), "one local replica has no raid");
        assert!(!layout("legacy"), "a stored volume keeps its layout");
        // applied again at the next start: nothing flips
        apply_config_file(&state, &cfg, dir.path()).expect("apply again");
        assert!(layout("new2") && !layout("legacy"));
    }
}
