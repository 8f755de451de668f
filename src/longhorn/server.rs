//! The five gRPC servers of Longhorn's instance-manager, on talon's state.
//!
//! ```text
//!   request ──> NamedUnimplemented (a method outside the subset: UNIMPLEMENTED naming it)
//!           ──> Health / reflection / the port's service
//!   InstanceCreate, ReplicaCreate, DiskCreate: validate (names, disk, size, ports)
//!           ──> write desired state (config namespace, persisted) ──> wait briefly for the status
//!   InstanceDelete: mark cleanup, destroy (the controller's finalizer removes what it made)
//!   InstanceGet/List/Watch: desired state + engine/LonghornInstanceStatus
//! ```
//!
//! Handlers write desired state and read status; the only SPDK call they
//! make is a read (`bdev_lvol_get_lvols`, `bdev_lvol_get_lvstores`) for the
//! disk listings.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tonic::{Request, Response, Status};

use super::error::LonghornError;
use super::lifecycle::{self, Op};
use super::replica_msg::fill_replica;
use super::service::{Longhorn, cannot_find};
use crate::names::ObjectName;
use crate::proto::imrpc::{self, disk_service_server, instance_service_server, proxy_engine_service_server};
use crate::proto::spdkrpc::{self, spdk_service_server};
use crate::proto::{self, process_manager_service_server};
use crate::resources::config::Disk;
use crate::resources::engine::{DiskStatus, ObjectState};
use crate::resources::longhorn::CONTROLLER;
use crate::resources::longhorn::{
    InstanceKind, InstanceState, LonghornEngine, LonghornEngineFrontend, LonghornInstanceStatus,
    LonghornReplica, LonghornSnapshotLedger,
};
use crate::runtime::{Phase, Spec, StateError, Typed};
use crate::spdk::naming::longhorn as naming;
use crate::spdk::rpc::{GetLvols, LvstoreSelector};
use crate::spdk::volume::{Inventory, plan};

/// How long a create or delete waits for the controller before it answers
/// with the state reached so far (Longhorn polls the state anyway).
const SETTLE: Duration = Duration::from_secs(10);
/// How long a refused DiskCreate waits for its Disk to be gone.
const DISK_FORGET: Duration = Duration::from_secs(30);

/// How long DiskCreate waits for the disk's lvstore.
const DISK_READY: Duration = Duration::from_secs(60);

/// `--longhorn-listen` and `--longhorn-port-range`.
#[derive(Debug, Clone)]
pub struct LonghornOptions {
    /// The first of the five ports (Longhorn: 8500).
    pub listen: SocketAddr,
    /// The ports instances' exports are given from (persisted with each instance).
    pub ports: RangeInclusive<u16>,
    /// Connection, stream and message bounds of the five ports.
    pub limits: super::bounds::GrpcLimits,
    /// The replicas on one disk may add up to this percentage of its
    /// capacity (thin: they are not all written); a ReplicaCreate past it
    /// is refused.
    pub overcommit_percent: u32,
}

impl LonghornOptions {
    /// The default instance port range.
    pub const DEFAULT_PORTS: RangeInclusive<u16> = 20001..=30000;
    /// The default overcommit bound: five times the disk, room for
    /// Longhorn's storage-over-provisioning-percentage (default 100) set
    /// up to 500.
    pub const DEFAULT_OVERCOMMIT_PERCENT: u32 = crate::spdk::placement::DEFAULT_OVERCOMMIT_PERCENT;
}

/// Why the servers could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A port is taken.
    #[error("cannot listen on {addr} for Longhorn's {service}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The service meant for it.
        service: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The base port leaves no room for five.
    #[error("--longhorn-listen {0}: the five ports base..base+4 do not fit below 65536")]
    BasePort(SocketAddr),
    /// The reflection descriptor is bad (a build problem).
    #[error("the Longhorn reflection service cannot be built")]
    Reflection(#[source] tonic_reflection::server::Error),
    /// A server failed.
    #[error("Longhorn's {service} server on {addr} failed")]
    Serve {
        /// The service.
        service: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
}

/// The five bound listeners, before serving.
#[derive(Debug)]
pub struct Bound {
    listeners: Vec<(SocketAddr, tokio::net::TcpListener)>,
}

impl Bound {
    /// The addresses, in [`super::SERVICES`] order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.listeners.iter().map(|(a, _)| *a).collect()
    }
}

/// Binds the five ports (all or none).
pub async fn bind(opts: &LonghornOptions) -> Result<Bound, ServeError> {
    let base = opts.listen.port();
    if base > u16::MAX - 4 {
        return Err(ServeError::BasePort(opts.listen));
    }
    let mut listeners = Vec::new();
    for (i, service) in super::SERVICES.iter().enumerate() {
        let addr = SocketAddr::new(opts.listen.ip(), base + i as u16);
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind {
                addr,
                service,
                source,
            })?;
        listeners.push((addr, l));
    }
    Ok(Bound { listeners })
}

/// Serves the five ports until `shutdown`, within `limits` (the connection
/// bounds hold for the five ports together).
pub async fn serve(
    bound: Bound,
    lh: Longhorn,
    limits: super::bounds::GrpcLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    // what a hash left behind when talon stopped mid-hash
    lh.hashes().sweep(lh.client()).await;
    // what a clone on another node left exposed here when talon stopped
    lh.clone_source_sweep().await;
    // switch-overs the manager gave up (ends when the servers stop)
    tokio::spawn(lh.clone().watch_switches());
    let (tx, rx) = tokio::sync::watch::channel(false);
    let counter = crate::util::conn::ConnCounter::default();
    let refusals = std::sync::Arc::new(super::bounds::AcceptLogs::default());
    let served = std::sync::Arc::new(ServedPaths::from_protos());
    let closer = crate::util::conn::Closer::default();
    let mut tasks = Vec::new();
    for (i, (addr, listener)) in bound.listeners.into_iter().enumerate() {
        let service = super::SERVICES[i];
        let routes = routes(i, &lh).await?;
        let mut rx = rx.clone();
        let incoming = super::bounds::incoming(
            listener,
            counter.clone(),
            limits.clone(),
            refusals.clone(),
            closer.clone(),
        );
        let message = limits.message;
        let served = served.clone();
        let server = tonic::transport::Server::builder()
            .max_concurrent_streams(limits.max_streams)
            .http2_keepalive_interval(Some(limits.ping))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)))
            .layer(tower::layer::layer_fn(move |inner| NamedUnimplemented {
                inner,
                message,
                served: served.clone(),
            }))
            .add_routes(routes);
        tasks.push(tokio::spawn(async move {
            server
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = rx.wait_for(|s| *s).await;
                })
                .await
                .map_err(|source| ServeError::Serve {
                    service,
                    addr,
                    source,
                })
        }));
    }
    tracing::info!(services = ?super::SERVICES, ?limits, "serving Longhorn's instance-manager protocol");
    shutdown.await;
    lh.stopping.send_replace(true);
    let _ = tx.send(true);
    // open calls get STOP_GRACE to finish; then the connections still open
    // (a watch stream, a call that never finishes) are closed, so each
    // server's wait for its connections ends and every connection task lets
    // go of the service (and the state store it holds): a stop that only
    // aborted the servers left tonic's per-connection tasks serving
    let deadline = tokio::time::Instant::now() + crate::util::conn::STOP_GRACE;
    let mut first_err = None;
    for (i, mut t) in tasks.into_iter().enumerate() {
        let ended = match tokio::time::timeout_at(deadline, &mut t).await {
            Ok(r) => r,
            Err(_) => {
                closer.close();
                tracing::info!(
                    service = super::SERVICES[i],
                    grace = ?crate::util::conn::STOP_GRACE,
                    "connections still open after the grace period closed"
                );
                match tokio::time::timeout(CLOSE_BOUND, &mut t).await {
                    Ok(r) => r,
                    Err(_) => {
                        t.abort();
                        // dropped (with its listener and service) before the stop returns
                        let _ = t.await;
                        tracing::warn!(service = super::SERVICES[i], bound = ?CLOSE_BOUND,
                            "a server did not end after its connections were closed; aborted");
                        continue;
                    }
                }
            }
        };
        if let Ok(Err(e)) = ended
            && first_err.is_none()
        {
            first_err = Some(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// How long a server gets to end once its connections were closed.
const CLOSE_BOUND: Duration = Duration::from_secs(5);

/// Health, reflection and the service of port `i`.
async fn routes(i: usize, lh: &Longhorn) -> Result<tonic::service::Routes, ServeError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status(super::SERVICES[i], tonic_health::ServingStatus::Serving)
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(ServeError::Reflection)?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(ServeError::Reflection)?;
    let routes = tonic::service::Routes::new(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    Ok(match i {
        0 => routes.add_service(process_manager_service_server::ProcessManagerServiceServer::new(
            lh.clone(),
        )),
        1 => routes.add_service(proxy_engine_service_server::ProxyEngineServiceServer::new(
            lh.clone(),
        )),
        2 => routes.add_service(disk_service_server::DiskServiceServer::new(lh.clone())),
        3 => routes.add_service(instance_service_server::InstanceServiceServer::new(lh.clone())),
        _ => routes.add_service(spdk_service_server::SpdkServiceServer::new(lh.clone())),
    })
}

// ------------------------------------------------------------ unimplemented

/// The method paths talon serves: the methods of its protos, health and
/// reflection. Anything else is answered UNIMPLEMENTED naming the method
/// (tonic's own answer carries no message). Read from the protos once per
/// [`serve`], shared by its five ports.
#[derive(Debug, Default)]
struct ServedPaths(BTreeSet<String>);

impl ServedPaths {
    fn from_protos() -> Self {
        let mut paths = BTreeSet::new();
        if let Ok(fds) =
            <prost_types::FileDescriptorSet as prost::Message>::decode(crate::proto::FILE_DESCRIPTOR_SET)
        {
            for f in fds.file {
                let pkg = f.package.unwrap_or_default();
                for s in f.service {
                    let svc = match (pkg.as_str(), s.name.as_deref()) {
                        ("", Some(n)) => n.to_owned(),
                        (p, Some(n)) => format!("{p}.{n}"),
                        _ => continue,
                    };
                    for m in s.method {
                        if let Some(m) = m.name {
                            paths.insert(format!("/{svc}/{m}"));
                        }
                    }
                }
            }
        }
        Self(paths)
    }

    fn contains(&self, path: &str) -> bool {
        path.starts_with("/grpc.health.v1.Health/")
            || path.starts_with("/grpc.reflection.")
            || self.0.contains(path)
    }
}

/// Answers a method outside talon's subset with UNIMPLEMENTED naming it.
#[derive(Debug, Clone)]
struct NamedUnimplemented<S> {
    inner: S,
    /// A request's message must come within this time of its headers.
    message: Duration,
    /// The methods served.
    served: std::sync::Arc<ServedPaths>,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<tonic::body::Body>> for NamedUnimplemented<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let path = req.uri().path().to_owned();
        let message = self.message;
        let req = req.map(|b| tonic::body::Body::new(super::bounds::MessageTimeout::new(b, message)));
        if self.served.contains(&path) {
            let started = std::time::Instant::now();
            let call = self.inner.call(req);
            return Box::pin(async move {
                let resp = call.await;
                if let Ok(r) = &resp {
                    log_call(&path, r, started.elapsed());
                }
                resp
            });
        }
        tracing::info!(method = %path, "longhorn gRPC call answered UNIMPLEMENTED");
        Box::pin(async move { Ok(Status::from(unimplemented(&path)).into_http()) })
    }
}

/// One line per Longhorn call, so talon's log says what the manager asked:
/// calls that change something at info, reads and watches at debug, and any
/// call that failed at info with its code and message (from the headers:
/// tonic puts a unary error there; a stream's end status comes later and is
/// not seen here).
fn log_call(path: &str, resp: &http::Response<tonic::body::Body>, took: std::time::Duration) {
    let method = path.rsplit('/').next().unwrap_or(path);
    let code = resp
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(tonic::Code::from)
        .unwrap_or(tonic::Code::Ok);
    let ms = took.as_secs_f64() * 1e3;
    if code != tonic::Code::Ok {
        let message = resp
            .headers()
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            // percent-encoded on the wire (gRPC over HTTP/2)
            .map(|m| {
                percent_encoding::percent_decode_str(m)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        // the manager polls for instances it expects to be gone (NotFound) and retries what it
        // asked too early: those are its routine; talon's own failures are an operator's business
        if matches!(
            code,
            tonic::Code::Internal
                | tonic::Code::Unknown
                | tonic::Code::DataLoss
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Unavailable
        ) {
            tracing::warn!(method = %path, ?code, %message, ms, "longhorn gRPC call failed");
        } else {
            tracing::info!(method = %path, ?code, %message, ms, "longhorn gRPC call failed");
        }
    } else if is_read(method) || is_routine(method) {
        tracing::debug!(method = %path, ms, "longhorn gRPC call");
    } else {
        tracing::info!(method = %path, ms, "longhorn gRPC call");
    }
}

/// Methods that only read (or watch, or check health).
fn is_read(method: &str) -> bool {
    ["Get", "List", "Watch", "Check", "Status", "Version", "Log"]
        .iter()
        .any(|w| method.starts_with(w) || method.ends_with(w))
        || method.contains("Status")
}

/// An engine-frontend's `nvme_tcp_nr_io_queues`: 0 (unset: talon's bounded default), else
/// Longhorn's range 1..=128 ([`crate::attach::nvme_tcp::MAX_IO_QUEUES`]).
fn io_queues(what: &str, n: i32) -> Result<u32, LonghornError> {
    let max = crate::attach::nvme_tcp::MAX_IO_QUEUES;
    match u32::try_from(n) {
        Ok(q) if q <= max => Ok(q),
        _ => Err(LonghornError::Invalid(format!(
            "{what}: nvme_tcp_nr_io_queues {n} is not in 1..={max} (0: talon's default of {})",
            crate::attach::nvme_tcp::DEFAULT_IO_QUEUES
        ))),
    }
}

/// Calls the manager repeats on a timer that change nothing of talon's (the log level it
/// asks for is said once per value by its handler; talon has no backup mounts to clean up):
/// logged at debug, as reads are, not a line per call at info.
fn is_routine(method: &str) -> bool {
    ["LogSetLevel", "LogSetFlags", "CleanupBackupMountPoints"].contains(&method)
}

/// `DiskCreate`'s `block_size` for an aio disk: 0 leaves it to SPDK; else a
/// power of two of at least 512, which SPDK v26.05's `bdev_aio_create` takes
/// (it refuses others with -22: "must be a power of 2", "must be at least
/// 512"). One below the device's own block size is refused by SPDK when the
/// disk is made, and `DiskCreate` answers its words.
fn aio_block_size(what: &str, block_size: i64) -> Result<Option<u32>, LonghornError> {
    if block_size == 0 {
        return Ok(None);
    }
    match u32::try_from(block_size) {
        Ok(b) if b >= 512 && b.is_power_of_two() => Ok(Some(b)),
        _ => Err(LonghornError::Invalid(format!(
            "{what}: block size {block_size} is not a power of two of at least 512"
        ))),
    }
}

fn unimplemented(method: &str) -> LonghornError {
    LonghornError::Unimplemented(format!(
        "{method} is not implemented by talon's Longhorn instance manager"
    ))
}

// ------------------------------------------------------------ helpers

fn invalid(e: crate::names::InvalidName) -> LonghornError {
    LonghornError::Invalid(e.to_string())
}

fn v2_only(what: &str, data_engine: i32, driver: i32) -> Result<(), LonghornError> {
    if data_engine == imrpc::DataEngine::V2 as i32 || driver == imrpc::BackendStoreDriver::V2 as i32 {
        Ok(())
    } else {
        Err(LonghornError::Invalid(format!(
            "{what}: talon serves the V2 data engine only (data_engine DATA_ENGINE_V2)"
        )))
    }
}

fn kind_of(ty: &str, name: &str) -> Result<InstanceKind, LonghornError> {
    match ty {
        "replica" => Ok(InstanceKind::Replica),
        "engine" => Ok(InstanceKind::Engine),
        "engine-frontend" => Ok(InstanceKind::EngineFrontend),
        other => Err(LonghornError::Invalid(format!(
            "instance {name}: unknown instance type {other:?} (talon serves replica, engine and engine-frontend)"
        ))),
    }
}

fn type_of(kind: InstanceKind) -> &'static str {
    match kind {
        InstanceKind::Replica => LonghornReplica::TYPE,
        InstanceKind::Engine => LonghornEngine::TYPE,
        InstanceKind::EngineFrontend => LonghornEngineFrontend::TYPE,
    }
}

fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// What the status of an instance says, or `starting` before the controller wrote one.
struct Observed {
    state: InstanceState,
    status: Option<LonghornInstanceStatus>,
}

impl Longhorn {
    /// The engine-frontend instance `name`, if there is one.
    fn frontend(&self, name: &str) -> Result<Option<LonghornEngineFrontend>, LonghornError> {
        Ok(self
            .state()
            .get_typed::<LonghornEngineFrontend>(name)
            .map_err(LonghornError::State)?
            .map(|f| f.spec))
    }

    /// The NVMe/TCP paths of engine-frontend `f` (of volume `volume`): engine,
    /// address and the ANA state talon set or knows its listener in. The
    /// target's, in the state its engine keeps when the engine is on this node
    /// (`EngineSetTargetListenerANAState`), else optimized unless a switch-over
    /// made it inaccessible; and the new engine's of a switch-over under way,
    /// once `preparing` made it non-optimized. Sorted by address.
    fn frontend_paths(
        &self,
        f: &LonghornEngineFrontend,
        volume: &str,
    ) -> Result<Vec<(String, SocketAddr, crate::resources::longhorn::AnaState)>, LonghornError> {
        use crate::resources::longhorn::{AnaState, SwitchoverPhase};
        let kept = |engine: &str| -> Result<Option<AnaState>, LonghornError> {
            Ok(self
                .state()
                .get_typed::<LonghornEngine>(engine)
                .map_err(LonghornError::State)?
                .filter(|e| e.spec.volume == volume)
                .map(|e| e.spec.ana_state))
        };
        let mut out = Vec::new();
        if let Ok(t) = f.target_address.parse::<SocketAddr>() {
            let switched = f
                .switchover
                .as_ref()
                .is_some_and(|r| r.done >= Some(SwitchoverPhase::Switching));
            let ana = match kept(&f.engine_name)? {
                Some(a) => a,
                None if switched => AnaState::Inaccessible,
                None => AnaState::Optimized,
            };
            out.push((f.engine_name.clone(), t, ana));
        }
        if let Some(r) = f.switchover.as_ref().filter(|r| r.done.is_some())
            && let Ok(t) = r.target_address.parse::<SocketAddr>()
        {
            let ana = kept(&r.engine_name)?.unwrap_or(AnaState::NonOptimized);
            out.push((r.engine_name.clone(), t, ana));
        }
        out.sort_by_key(|p| p.1);
        Ok(out)
    }

    fn observed(&self, name: &str, kind: InstanceKind) -> Result<Observed, LonghornError> {
        let status = self.fresh_status(name)?.filter(|s| s.kind == kind);
        Ok(Observed {
            state: status.as_ref().map_or(InstanceState::Starting, |s| s.state),
            status,
        })
    }

    /// Waits until the instance is running or failed (or [`SETTLE`] passed).
    async fn settle(&self, name: &str, kind: InstanceKind) {
        let (_, mut rx) = self.state().watch(Some(("engine", LonghornInstanceStatus::TYPE)));
        let deadline = tokio::time::Instant::now() + SETTLE;
        loop {
            if let Ok(o) = self.observed(name, kind)
                && matches!(o.state, InstanceState::Running | InstanceState::Error)
            {
                return;
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => return,
                Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => return,
                Ok(_) => {}
            }
        }
    }

    /// Waits until the desired-state resource is gone (or [`SETTLE`] passed).
    async fn settle_gone(&self, ty: &str, name: &str) {
        let (_, mut rx) = self.state().watch(Some(("config", ty)));
        let deadline = tokio::time::Instant::now() + SETTLE;
        while self.state().get("config", ty, name).is_some() {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) | Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => return,
                Ok(_) => {}
            }
        }
    }

    /// Ports every Longhorn instance holds.
    fn used_ports(&self) -> Result<BTreeSet<u16>, LonghornError> {
        let mut used = BTreeSet::new();
        for r in self
            .state()
            .list_typed::<LonghornReplica>()
            .map_err(LonghornError::State)?
        {
            used.extend(r.spec.port_start..=r.spec.port_end);
        }
        for e in self
            .state()
            .list_typed::<LonghornEngine>()
            .map_err(LonghornError::State)?
        {
            used.insert(e.spec.port);
        }
        Ok(used)
    }

    /// The first `count` consecutive free ports of the range.
    fn free_ports(&self, what: &str, count: u16) -> Result<(u16, u16), LonghornError> {
        let used = self.used_ports()?;
        let (lo, hi) = (*self.ports.start(), *self.ports.end());
        let mut start = lo;
        while u32::from(start) + u32::from(count) - 1 <= u32::from(hi) {
            let end = start + count - 1;
            match (start..=end).find(|p| used.contains(p)) {
                None => return Ok((start, end)),
                Some(p) => start = p + 1,
            }
        }
        Err(LonghornError::Exhausted(format!(
            "{what}: no {count} free consecutive ports left in {lo}-{hi}"
        )))
    }

    pub(super) fn ready_disk(&self, what: &str, disk: &str) -> Result<DiskStatus, LonghornError> {
        let name = naming::instance_name("disk", disk).map_err(invalid)?;
        if self
            .state()
            .get_typed::<Disk>(name.as_str())
            .map_err(LonghornError::State)?
            .is_none()
        {
            return Err(LonghornError::within(
                what,
                LonghornError::not_found("disk", disk),
            ));
        }
        // ready on the running target: after a restart SPDK lists the
        // lvstore before it has opened every lvol, so a listing of its
        // replicas then would miss some (DiskStatus::ready_on)
        let target = self
            .state()
            .get_typed::<crate::resources::engine::TargetStatus>(crate::resources::engine::SPDK_STATUS_ID)
            .map_err(LonghornError::State)?
            .map(|t| t.spec);
        match self
            .state()
            .get_typed::<DiskStatus>(name.as_str())
            .map_err(LonghornError::State)?
        {
            Some(d) if d.spec.ready_on(target.as_ref()) => Ok(d.spec),
            Some(d) if d.spec.state == ObjectState::Ready => Err(LonghornError::Refused(format!(
                "{what}: disk {disk} is loading on the running spdk_tgt (its lvols may not all be opened yet)"
            ))),
            Some(d) => Err(LonghornError::Refused(format!(
                "{what}: disk {disk} is not ready ({:?}: {})",
                d.spec.state, d.spec.message
            ))),
            None => Err(LonghornError::Refused(format!(
                "{what}: disk {disk} is not ready yet"
            ))),
        }
    }

    /// Refuses `size` bytes more on `disk` (of `total` bytes) when its
    /// replicas, `except` the one growing, would add up to more than the
    /// overcommit bound.
    /// Whether disk `disk` (`total` bytes) can promise `size` more bytes to
    /// replica `what` (`except`: a replica growing, whose present size is
    /// not counted), by the one overcommit rule of talon's own volumes
    /// ([`plan::commitment`]). What the disk promises: every thin lvol on its
    /// lvstore (talon's volumes too), with each Longhorn replica counted at
    /// its recorded size whether its lvol exists yet or not.
    pub(super) async fn check_room(
        &self,
        what: &str,
        disk: &str,
        total: u64,
        except: Option<&str>,
        size: u64,
    ) -> Result<(), LonghornError> {
        let inv = Inventory::load(self.client())
            .await
            .map_err(|x| LonghornError::spdk(format!("{what}: reading spdk_tgt"), x))?;
        let replicas = self
            .state()
            .list_typed::<LonghornReplica>()
            .map_err(LonghornError::State)?;
        let committed = replicas
            .iter()
            .filter(|r| r.spec.disk == disk)
            .fold(inv.committed(disk), |sum, r| {
                let made = inv
                    .lvols
                    .get(&naming::replica_alias(disk, r.id()))
                    .and_then(|l| inv.bdev_size(&l.uuid))
                    .unwrap_or(0);
                let recorded = if Some(r.id()) == except {
                    0
                } else {
                    r.spec.size_bytes
                };
                sum?.checked_sub(made)?.checked_add(recorded)
            })
            .ok_or_else(|| {
                LonghornError::internal(
                    what,
                    format!("disk {disk}: the sizes of its lvols add up past 2^64 bytes"),
                )
            })?;
        plan::commitment(total, committed, size, self.overcommit_percent).map_err(|e| {
            LonghornError::Exhausted(format!(
                "{what}: {size} bytes on disk {disk}: {e} (talon serve --longhorn-overcommit-percent)"
            ))
        })
    }

    fn create_user<S: Spec>(&self, id: &str, spec: &S) -> Result<(), LonghornError> {
        self.state()
            .create_typed(id, "", spec)
            .map_err(LonghornError::State)?;
        // the controller's finalizer from the start: a delete always goes through it
        self.state()
            .add_finalizer(S::NAMESPACE, S::TYPE, id, CONTROLLER)
            .map_err(LonghornError::State)
    }

    // ----- replica

    #[allow(clippy::too_many_arguments)]
    async fn create_replica(
        &self,
        name: &str,
        volume: &str,
        disk: &str,
        disk_uuid: &str,
        size: u64,
        port_count: i32,
    ) -> Result<(), LonghornError> {
        let what = format!("replica {name}");
        let rname = naming::instance_name("replica", name).map_err(invalid)?;
        let volume = ObjectName::parse("volume", volume).map_err(invalid)?;
        let d = self.ready_disk(&what, disk)?;
        if !disk_uuid.is_empty() && disk_uuid != d.lvstore_uuid {
            return Err(LonghornError::Refused(format!(
                "{what}: disk {disk} has UUID {}, not {disk_uuid}",
                d.lvstore_uuid
            )));
        }
        if size == 0 || d.cluster_bytes == 0 || !size.is_multiple_of(d.cluster_bytes) {
            return Err(LonghornError::Invalid(format!(
                "{what}: size {size} is not a positive multiple of disk {disk}'s cluster size {}",
                d.cluster_bytes
            )));
        }
        let _one = self.alloc.lock().await;
        if let Some(cur) = self
            .state()
            .get_typed::<LonghornReplica>(rname.as_str())
            .map_err(LonghornError::State)?
        {
            if cur.metadata.phase == Phase::TearingDown {
                return Err(LonghornError::Unavailable(format!(
                    "{what} is being deleted; retry"
                )));
            }
            if cur.spec.disk == disk && cur.spec.size_bytes == size && cur.spec.volume == volume.as_str() {
                return Ok(());
            }
            return Err(LonghornError::Exists(format!(
                "{what} already exists on disk {} with {} bytes",
                cur.spec.disk, cur.spec.size_bytes
            )));
        }
        self.check_room(&what, disk, d.total_bytes, None, size).await?;
        let count = u16::try_from(port_count.clamp(1, 64)).unwrap_or(1);
        let (port_start, port_end) = self.free_ports(&what, count)?;
        // made again over the lvol a delete without cleanup kept (Longhorn's
        // attach after a detach): the snapshot times it had come back
        let kept = self
            .state()
            .get_typed::<LonghornSnapshotLedger>(rname.as_str())
            .map_err(LonghornError::State)?
            .filter(|l| l.spec.volume == volume.as_str() && l.spec.disk == disk);
        self.create_user(
            rname.as_str(),
            &LonghornReplica {
                volume: volume.as_str().to_owned(),
                disk: disk.to_owned(),
                size_bytes: size,
                port_start,
                port_end,
                cleanup: false,
                revert: None,
                dst_start: None,
                snapshot_info: kept
                    .as_ref()
                    .map(|l| l.spec.snapshot_info.clone())
                    .unwrap_or_default(),
                shared_for: None,
            },
        )?;
        if kept.is_some() {
            self.forget_snapshot_ledger(rname.as_str())?;
        }
        Ok(())
    }

    /// Destroys the snapshot ledger of replica `id` ([`LonghornSnapshotLedger`]), if any.
    fn forget_snapshot_ledger(&self, id: &str) -> Result<(), LonghornError> {
        match self.state().destroy(
            LonghornSnapshotLedger::NAMESPACE,
            LonghornSnapshotLedger::TYPE,
            id,
            "",
        ) {
            Ok(_) | Err(StateError::NotFound { .. }) => Ok(()),
            Err(e) => Err(LonghornError::State(e)),
        }
    }

    /// Deletes a replica instance; `cleanup` removes its lvol too. An lvol
    /// kept by an earlier delete (no instance) is removed by a cleanup delete
    /// when its disk is known.
    async fn delete_replica(
        &self,
        name: &str,
        cleanup: bool,
        disk: Option<String>,
    ) -> Result<(), LonghornError> {
        let rname = naming::instance_name("replica", name).map_err(invalid)?;
        let id = rname.as_str();
        let _one = self.alloc.lock().await;
        match self
            .state()
            .get_typed::<LonghornReplica>(id)
            .map_err(LonghornError::State)?
        {
            Some(cur) => {
                if !cleanup && !cur.spec.cleanup && !cur.spec.snapshot_info.is_empty() {
                    // the lvol stays, and with it what SPDK does not keep of its
                    // snapshots: an instance made again over it lists their times
                    self.state()
                        .upsert_typed(
                            id,
                            &LonghornSnapshotLedger {
                                volume: cur.spec.volume.clone(),
                                disk: cur.spec.disk.clone(),
                                snapshot_info: cur.spec.snapshot_info.clone(),
                            },
                        )
                        .map_err(LonghornError::State)?;
                }
                if cleanup {
                    self.forget_snapshot_ledger(id)?;
                }
                if cleanup && !cur.spec.cleanup {
                    self.state()
                        .update_typed(
                            id,
                            "",
                            None,
                            &LonghornReplica {
                                cleanup: true,
                                ..cur.spec.clone()
                            },
                        )
                        .map_err(LonghornError::State)?;
                }
            }
            None => {
                let Some(disk) = disk.filter(|_| cleanup) else {
                    return Ok(());
                };
                self.forget_snapshot_ledger(id)?;
                // an lvol left by a delete without cleanup: an instance made only to go
                self.create_user(
                    id,
                    &LonghornReplica {
                        volume: String::new(),
                        disk,
                        size_bytes: 0,
                        port_start: 0,
                        port_end: 0,
                        cleanup: true,
                        revert: None,
                        dst_start: None,
                        snapshot_info: BTreeMap::new(),
                        shared_for: None,
                    },
                )?;
            }
        }
        self.state()
            .destroy("config", LonghornReplica::TYPE, id, "")
            .map_err(LonghornError::State)?;
        // a restore into it goes with it (its status and credentials with that)
        use crate::resources::backup::LonghornRestore;
        use crate::runtime::Spec as _;
        if self
            .state()
            .get_typed::<LonghornRestore>(id)
            .map_err(LonghornError::State)?
            .is_some()
        {
            self.state()
                .destroy("config", LonghornRestore::TYPE, id, "")
                .map_err(LonghornError::State)?;
        }
        drop(_one);
        // its snapshot hashes stop, their files and bdevs removed
        self.hashes().drop_replica(id);
        self.settle_gone(LonghornReplica::TYPE, id).await;
        Ok(())
    }

    pub(super) fn replica_message(
        &self,
        r: &Typed<LonghornReplica>,
    ) -> Result<spdkrpc::Replica, LonghornError> {
        let o = self.observed(r.id(), InstanceKind::Replica)?;
        let s = o
            .status
            .clone()
            .unwrap_or_else(|| empty_status(InstanceKind::Replica));
        let lvs_uuid = self
            .state()
            .get_typed::<DiskStatus>(&r.spec.disk)
            .map_err(LonghornError::State)?
            .map(|d| d.spec.lvstore_uuid)
            .unwrap_or_default();
        let listen = self
            .state()
            .get_typed::<crate::resources::config::NodeConfig>("node")
            .map_err(LonghornError::State)?
            .map(|n| n.spec.listen_address)
            .unwrap_or_default();
        // where the replica's export listens (the controller's choice too)
        let ip = crate::host::longhorn_address::instance_ip(&listen)
            .map(|a| a.to_string())
            .unwrap_or(listen);
        let state = phase_state(r.metadata.phase, o.state);
        Ok(spdkrpc::Replica {
            name: r.id().to_owned(),
            lvs_name: r.spec.disk.clone(),
            lvs_uuid,
            spec_size: r.spec.size_bytes,
            actual_size: s.allocated_bytes,
            ip,
            port_start: i32::from(r.spec.port_start),
            port_end: i32::from(r.spec.port_end),
            head: (!s.uuid.is_empty()).then(|| spdkrpc::Lvol {
                name: r.id().to_owned(),
                uuid: s.uuid.clone(),
                spec_size: r.spec.size_bytes,
                actual_size: s.allocated_bytes,
                ..Default::default()
            }),
            snapshots: Default::default(),
            rebuilding: false,
            state: state.as_str().to_owned(),
            error_msg: s.message.clone(),
            backing_image_name: String::new(),
            uuid: s.uuid,
        })
    }

    // ----- engine and engine-frontend

    async fn create_engine(
        &self,
        spec: &imrpc::InstanceSpec,
        volume: &ObjectName,
    ) -> Result<(), LonghornError> {
        let name = naming::instance_name("engine", &spec.name).map_err(invalid)?;
        let what = format!("engine {name}");
        let sp = spec.spdk_instance_spec.clone().unwrap_or_default();
        if sp.replica_address_map.is_empty() {
            return Err(LonghornError::Invalid(format!(
                "{what}: replica_address_map is empty"
            )));
        }
        let mut map = BTreeMap::new();
        for (r, a) in &sp.replica_address_map {
            naming::instance_name("replica", r)
                .map_err(|e| LonghornError::Invalid(format!("{what}: {e}")))?;
            a.parse::<SocketAddr>().map_err(|_| {
                LonghornError::Invalid(format!("{what}: replica {r}: address {a:?} is not ip:port"))
            })?;
            map.insert(r.clone(), a.clone());
        }
        if sp.size == 0 {
            return Err(LonghornError::Invalid(format!("{what}: size is 0")));
        }
        naming::volume_nqn(volume).map_err(invalid)?;
        let _one = self.alloc.lock().await;
        for e in self
            .state()
            .list_typed::<LonghornEngine>()
            .map_err(LonghornError::State)?
        {
            if e.id() == name.as_str() {
                if e.metadata.phase == Phase::TearingDown {
                    return Err(LonghornError::Unavailable(format!(
                        "{what} is being deleted; retry"
                    )));
                }
                if e.spec.replica_address_map == map && e.spec.volume == volume.as_str() {
                    return Ok(());
                }
                return Err(LonghornError::Exists(format!(
                    "{what} already exists with other replicas"
                )));
            }
            if e.spec.volume == volume.as_str() {
                return Err(LonghornError::Exists(format!(
                    "{what}: volume {volume} already has engine {} on this node",
                    e.id()
                )));
            }
        }
        let (port, _) = self.free_ports(&what, 1)?;
        self.create_user(
            name.as_str(),
            &LonghornEngine {
                volume: volume.as_str().to_owned(),
                size_bytes: sp.size,
                replica_address_map: map,
                port,
                frontend: sp.frontend.clone(),
                snapshot_max_count: sp.snapshot_max_count.max(0),
                rebuild_qos_mbps: 0,
                rebuild_requests: BTreeMap::new(),
                rebuild_links: BTreeMap::new(),
                rebuild_link_engines: BTreeMap::new(),
                removed_snapshots: BTreeSet::new(),
                failed_replicas: Default::default(),
                purge_request: 0,
                revert: None,
                snapshot_requests: BTreeMap::new(),
                snapshot_info: BTreeMap::new(),
                ana_state: Default::default(),
            },
        )
    }

    async fn create_frontend(
        &self,
        spec: &imrpc::InstanceSpec,
        volume: &ObjectName,
    ) -> Result<(), LonghornError> {
        let name = naming::instance_name("engine-frontend", &spec.name).map_err(invalid)?;
        let what = format!("engine-frontend {name}");
        naming::instance_name("engine", &spec.engine_name)
            .map_err(|e| LonghornError::Invalid(format!("{what}: {e}")))?;
        spec.target_address.parse::<SocketAddr>().map_err(|_| {
            LonghornError::Invalid(format!(
                "{what}: target address {:?} is not ip:port",
                spec.target_address
            ))
        })?;
        let sp = spec.spdk_instance_spec.clone().unwrap_or_default();
        naming::FrontendMode::of(&sp.frontend).map_err(|e| LonghornError::Invalid(format!("{what}: {e}")))?;
        let nr_io_queues = io_queues(&what, sp.nvme_tcp_nr_io_queues)?;
        let want = LonghornEngineFrontend {
            volume: volume.as_str().to_owned(),
            engine_name: spec.engine_name.clone(),
            target_address: spec.target_address.clone(),
            frontend: sp.frontend,
            size_bytes: sp.size,
            nr_io_queues,
            switchover: None,
        };
        let _one = self.alloc.lock().await;
        if let Some(cur) = self
            .state()
            .get_typed::<LonghornEngineFrontend>(name.as_str())
            .map_err(LonghornError::State)?
        {
            // a switch-over under way is not the manager's to repeat
            let same = LonghornEngineFrontend {
                switchover: cur.spec.switchover.clone(),
                ..want
            };
            if cur.spec == same && cur.metadata.phase == Phase::Running {
                return Ok(());
            }
            return Err(LonghornError::Exists(format!("{what} already exists")));
        }
        self.create_user(name.as_str(), &want)
    }

    async fn delete_other(&self, kind: InstanceKind, name: &str) -> Result<(), LonghornError> {
        let n = naming::instance_name("instance", name).map_err(invalid)?;
        let ty = type_of(kind);
        match self.state().destroy("config", ty, n.as_str(), "") {
            Ok(_) | Err(StateError::NotFound { .. }) => {}
            Err(e) => return Err(LonghornError::State(e)),
        }
        self.settle_gone(ty, n.as_str()).await;
        if kind == InstanceKind::Engine {
            self.forget_clone(n.as_str());
        }
        Ok(())
    }

    // ----- instance responses

    fn instance_response(
        &self,
        kind: InstanceKind,
        name: &str,
    ) -> Result<Option<imrpc::InstanceResponse>, LonghornError> {
        let (phase, volume, engine_name) = match kind {
            InstanceKind::Replica => {
                match self
                    .state()
                    .get_typed::<LonghornReplica>(name)
                    .map_err(LonghornError::State)?
                {
                    Some(r) => (r.metadata.phase, r.spec.volume, String::new()),
                    None => return Ok(None),
                }
            }
            InstanceKind::Engine => match self
                .state()
                .get_typed::<LonghornEngine>(name)
                .map_err(LonghornError::State)?
            {
                Some(e) => (e.metadata.phase, e.spec.volume, String::new()),
                None => return Ok(None),
            },
            InstanceKind::EngineFrontend => {
                match self
                    .state()
                    .get_typed::<LonghornEngineFrontend>(name)
                    .map_err(LonghornError::State)?
                {
                    Some(f) => (f.metadata.phase, f.spec.volume, f.spec.engine_name),
                    None => return Ok(None),
                }
            }
        };
        let o = self.observed(name, kind)?;
        let s = o.status.clone().unwrap_or_else(|| empty_status(kind));
        let mut status = imrpc::InstanceStatus {
            state: phase_state(phase, o.state).as_str().to_owned(),
            error_msg: s.message.clone(),
            uuid: s.uuid.clone(),
            ..Default::default()
        };
        match kind {
            InstanceKind::Replica => {
                if let Some(r) = self
                    .state()
                    .get_typed::<LonghornReplica>(name)
                    .map_err(LonghornError::State)?
                {
                    status.port_start = i32::from(r.spec.port_start);
                    status.port_end = i32::from(r.spec.port_end);
                }
            }
            InstanceKind::Engine => {
                if let Some(e) = self
                    .state()
                    .get_typed::<LonghornEngine>(name)
                    .map_err(LonghornError::State)?
                {
                    status.port_start = i32::from(e.spec.port);
                    status.port_end = i32::from(e.spec.port);
                }
            }
            InstanceKind::EngineFrontend => {
                if let Some(f) = self
                    .state()
                    .get_typed::<LonghornEngineFrontend>(name)
                    .map_err(LonghornError::State)?
                {
                    let target = f.spec.target_address.parse::<SocketAddr>().ok();
                    let port = target.map(|a| i32::from(a.port())).unwrap_or(0);
                    // the frontend is reached where the engine exports the volume: the
                    // manager addresses an engine-frontend as ip:port_start
                    status.port_start = port;
                    status.port_end = port;
                    status.target_port_start = port;
                    status.target_port_end = port;
                    // its NVMe/TCP paths (Longhorn's engine-frontend lists them so): the
                    // manager's engine-frontend monitor takes the target from the active
                    // path and writes an empty one back without it, against the instance
                    // handler's target, so the size it observed (the online expansion's end)
                    // never got written. The active path is the target's; during a
                    // switch-over the new engine's path is listed too once `preparing` set
                    // it non-optimized.
                    if let Some(t) = target {
                        let nqn = crate::names::ObjectName::parse("volume", &volume)
                            .ok()
                            .and_then(|v| naming::volume_nqn(&v).ok())
                            .map(|n| n.to_string())
                            .unwrap_or_default();
                        status.active_path = t.to_string();
                        status.preferred_path = t.to_string();
                        status.paths = self
                            .frontend_paths(&f.spec, &volume)?
                            .into_iter()
                            .map(|(engine, address, ana)| imrpc::EngineFrontendNvmeTcpPath {
                                engine_name: engine,
                                target_ip: address.ip().to_string(),
                                target_port: i32::from(address.port()),
                                nqn: nqn.clone(),
                                nguid: String::new(),
                                ana_state: ana.as_str().to_owned(),
                            })
                            .collect();
                    }
                    status.engine_name = engine_name;
                    status.frontend = f.spec.frontend.clone();
                    if o.state == InstanceState::Running {
                        status.endpoint = s.endpoint.clone();
                    }
                }
            }
        }
        Ok(Some(imrpc::InstanceResponse {
            spec: Some(imrpc::InstanceSpec {
                backend_store_driver: imrpc::BackendStoreDriver::V2 as i32,
                data_engine: imrpc::DataEngine::V2 as i32,
                name: name.to_owned(),
                r#type: kind.as_str().to_owned(),
                volume_name: volume,
                ..Default::default()
            }),
            status: Some(status),
            deleted: false,
        }))
    }

    fn all_instances(&self) -> Result<BTreeMap<String, imrpc::InstanceResponse>, LonghornError> {
        let mut out = BTreeMap::new();
        let ids = |ty: &str| -> Vec<String> {
            self.state()
                .list("config", ty)
                .into_iter()
                .map(|r| r.metadata.id)
                .collect()
        };
        for (kind, ty) in [
            (InstanceKind::Replica, LonghornReplica::TYPE),
            (InstanceKind::Engine, LonghornEngine::TYPE),
            (InstanceKind::EngineFrontend, LonghornEngineFrontend::TYPE),
        ] {
            for id in ids(ty) {
                if let Some(r) = self.instance_response(kind, &id)? {
                    out.insert(id, r);
                }
            }
        }
        Ok(out)
    }

    /// A stream that yields once per change of any Longhorn instance (and
    /// once at the start).
    fn watch_stream(&self) -> WatchStream {
        let (_, mut rx) = self.state().watch(None);
        let (tx, out) = tokio::sync::mpsc::channel(16);
        let mut stopping = self.stopping.subscribe();
        tokio::spawn(async move {
            if tx.send(Ok(())).await.is_err() {
                return;
            }
            loop {
                let ev = tokio::select! {
                    ev = rx.recv() => ev,
                    _ = stopping.wait_for(|s| *s) => return,
                };
                match ev {
                    Ok(ev) => {
                        let ty = ev.resource.metadata.type_.as_str();
                        let ours = [
                            LonghornReplica::TYPE,
                            LonghornEngine::TYPE,
                            LonghornEngineFrontend::TYPE,
                            LonghornInstanceStatus::TYPE,
                        ]
                        .contains(&ty);
                        if ours && tx.send(Ok(())).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        if tx.send(Ok(())).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(out))
    }

    // ----- disks

    fn disk_message(&self, name: &str) -> Result<imrpc::Disk, LonghornError> {
        let disk = self
            .state()
            .get_typed::<Disk>(name)
            .map_err(LonghornError::State)?
            .ok_or_else(|| LonghornError::not_found("disk", name))?;
        let st = self
            .state()
            .get_typed::<DiskStatus>(name)
            .map_err(LonghornError::State)?
            .map(|s| s.spec);
        let block = 4096i64;
        let (total, free, cluster, uuid, state) = match &st {
            Some(s) => (
                s.total_bytes as i64,
                s.free_bytes as i64,
                s.cluster_bytes as i64,
                s.lvstore_uuid.clone(),
                format!("{:?}", s.state).to_lowercase(),
            ),
            None => (0, 0, 0, String::new(), "creating".into()),
        };
        Ok(imrpc::Disk {
            id: name.to_owned(),
            uuid,
            path: disk
                .spec
                .path
                .clone()
                .or(disk.spec.pci.clone())
                .unwrap_or_default(),
            r#type: "block".into(),
            total_size: total,
            free_size: free,
            total_blocks: total / block,
            free_blocks: free / block,
            block_size: block,
            cluster_size: cluster,
            driver: if disk.spec.pci.is_some() { "nvme" } else { "aio" }.into(),
            name: name.to_owned(),
            state,
        })
    }

    async fn block_size(&self, disk: &str) -> Option<i64> {
        let lvs = crate::spdk::volume::naming::lvstore(disk);
        self.client()
            .bdev_lvol_get_lvstores(&LvstoreSelector::name(&lvs))
            .await
            .ok()?
            .first()
            .map(|l| i64::from(l.block_size))
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<(), Status>> + Send>>;

fn empty_status(kind: InstanceKind) -> LonghornInstanceStatus {
    LonghornInstanceStatus::new(kind, InstanceState::Starting, "")
}

fn phase_state(phase: Phase, observed: InstanceState) -> InstanceState {
    match phase {
        Phase::TearingDown if observed != InstanceState::Error => InstanceState::Stopping,
        _ => observed,
    }
}

fn deleted_response(name: &str, kind: InstanceKind) -> imrpc::InstanceResponse {
    imrpc::InstanceResponse {
        spec: Some(imrpc::InstanceSpec {
            name: name.to_owned(),
            r#type: kind.as_str().to_owned(),
            ..Default::default()
        }),
        status: Some(imrpc::InstanceStatus {
            state: "stopped".into(),
            ..Default::default()
        }),
        deleted: true,
    }
}

fn version_response() -> proto::VersionResponse {
    proto::VersionResponse {
        version: crate::VERSION.to_owned(),
        git_commit: String::new(),
        build_date: String::new(),
        instance_manager_api_version: super::API_VERSION,
        instance_manager_api_min_version: super::API_MIN_VERSION,
        instance_manager_proxy_api_version: super::PROXY_API_VERSION,
        instance_manager_proxy_api_min_version: super::PROXY_API_MIN_VERSION,
    }
}

// ------------------------------------------------------------ 8500

#[tonic::async_trait]
impl process_manager_service_server::ProcessManagerService for Longhorn {
    async fn version_get(&self, _: Request<()>) -> Result<Response<proto::VersionResponse>, Status> {
        Ok(Response::new(version_response()))
    }
}

// ------------------------------------------------------------ 8501: proxy.rs

// ------------------------------------------------------------ 8503

#[tonic::async_trait]
impl instance_service_server::InstanceService for Longhorn {
    async fn instance_create(
        &self,
        req: Request<imrpc::InstanceCreateRequest>,
    ) -> Result<Response<imrpc::InstanceResponse>, Status> {
        let req = req.into_inner();
        let spec = req
            .spec
            .ok_or_else(|| Status::invalid_argument("InstanceCreate: spec is missing"))?;
        let what = format!("instance {}", spec.name);
        if req.data_layout_type != imrpc::DataLayoutType::Replicated as i32 {
            return Err(Status::invalid_argument(format!(
                "{what}: talon serves replicated (raid1) volumes only"
            )));
        }
        let kind = kind_of(&spec.r#type, &spec.name)?;
        v2_only(&what, spec.data_engine, spec.backend_store_driver)?;
        let volume = ObjectName::parse("volume", &spec.volume_name).map_err(invalid)?;
        match kind {
            InstanceKind::Replica => {
                let sp = spec.spdk_instance_spec.clone().unwrap_or_default();
                self.create_replica(
                    &spec.name,
                    volume.as_str(),
                    &sp.disk_name,
                    &sp.disk_uuid,
                    sp.size,
                    spec.port_count,
                )
                .await?
            }
            InstanceKind::Engine => self.create_engine(&spec, &volume).await?,
            InstanceKind::EngineFrontend => self.create_frontend(&spec, &volume).await?,
        }
        self.settle(&spec.name, kind).await;
        let r = self
            .instance_response(kind, &spec.name)?
            .ok_or_else(|| Status::aborted(format!("{what} was deleted while it was created")))?;
        Ok(Response::new(r))
    }

    async fn instance_delete(
        &self,
        req: Request<imrpc::InstanceDeleteRequest>,
    ) -> Result<Response<imrpc::InstanceResponse>, Status> {
        let req = req.into_inner();
        let kind = kind_of(&req.r#type, &req.name)?;
        v2_only(
            &format!("instance {}", req.name),
            req.data_engine,
            req.backend_store_driver,
        )?;
        match kind {
            InstanceKind::Replica => {
                let disk = (!req.disk_uuid.is_empty())
                    .then(|| {
                        self.state()
                            .list_typed::<DiskStatus>()
                            .ok()?
                            .into_iter()
                            .find(|d| d.spec.lvstore_uuid == req.disk_uuid)
                            .map(|d| d.id().to_owned())
                    })
                    .flatten();
                self.delete_replica(&req.name, req.cleanup_required, disk).await?
            }
            // as Longhorn's instance manager: an engine goes only with cleanup_required
            InstanceKind::Engine if !req.cleanup_required => {}
            _ => self.delete_other(kind, &req.name).await?,
        }
        Ok(Response::new(deleted_response(&req.name, kind)))
    }

    async fn instance_get(
        &self,
        req: Request<imrpc::InstanceGetRequest>,
    ) -> Result<Response<imrpc::InstanceResponse>, Status> {
        let req = req.into_inner();
        let kind = kind_of(&req.r#type, &req.name)?;
        self.instance_response(kind, &req.name)?
            .map(Response::new)
            .ok_or_else(|| cannot_find(&kind.as_str().replace('-', " "), &req.name))
    }

    async fn instance_list(&self, _: Request<()>) -> Result<Response<imrpc::InstanceListResponse>, Status> {
        Ok(Response::new(imrpc::InstanceListResponse {
            instances: self.all_instances()?.into_iter().collect(),
        }))
    }

    type InstanceWatchStream = WatchStream;

    async fn instance_watch(&self, _: Request<()>) -> Result<Response<Self::InstanceWatchStream>, Status> {
        Ok(Response::new(self.watch_stream()))
    }

    async fn instance_suspend(
        &self,
        req: Request<imrpc::InstanceSuspendRequest>,
    ) -> Result<Response<()>, Status> {
        let req = req.into_inner();
        let v1 = req.data_engine == imrpc::DataEngine::V1 as i32;
        lifecycle::check(Op::Suspend, v1, &req.r#type, &req.name)?;
        Err(lifecycle::suspend_or_resume(Op::Suspend, &req.name, self.frontend(&req.name)?.as_ref()).into())
    }

    async fn instance_resume(
        &self,
        req: Request<imrpc::InstanceResumeRequest>,
    ) -> Result<Response<()>, Status> {
        let req = req.into_inner();
        let v1 = req.data_engine == imrpc::DataEngine::V1 as i32;
        lifecycle::check(Op::Resume, v1, &req.r#type, &req.name)?;
        Err(lifecycle::suspend_or_resume(Op::Resume, &req.name, self.frontend(&req.name)?.as_ref()).into())
    }

    async fn instance_switch_over_target(
        &self,
        req: Request<imrpc::InstanceSwitchOverTargetRequest>,
    ) -> Result<Response<()>, Status> {
        let req = req.into_inner();
        let v1 = req.data_engine == imrpc::DataEngine::V1 as i32;
        lifecycle::check(Op::SwitchOver, v1, &req.r#type, &req.name)?;
        // as Longhorn: by its name, else the only engine-frontend of the engine so named
        let found = match self
            .state()
            .get_typed::<LonghornEngineFrontend>(&req.name)
            .map_err(LonghornError::State)?
        {
            Some(ef) => Some(ef),
            None => {
                let mut of_engine = self
                    .state()
                    .list_typed::<LonghornEngineFrontend>()
                    .map_err(LonghornError::State)?
                    .into_iter()
                    .filter(|f| f.spec.engine_name == req.name);
                match (of_engine.next(), of_engine.next()) {
                    (Some(f), None) => Some(f),
                    (Some(_), Some(_)) => {
                        return Err(Status::failed_precondition(format!(
                            "multiple engine frontends found for engine {}",
                            req.name
                        )));
                    }
                    _ => None,
                }
            }
        };
        self.switch_over(
            &req.name,
            found,
            &req.target_address,
            &req.engine_name,
            &req.switchover_phase,
        )
        .await?;
        Ok(Response::new(()))
    }

    async fn instance_delete_target(
        &self,
        req: Request<imrpc::InstanceDeleteTargetRequest>,
    ) -> Result<Response<()>, Status> {
        let req = req.into_inner();
        let v1 = req.data_engine == imrpc::DataEngine::V1 as i32;
        lifecycle::check(Op::DeleteTarget, v1, &req.r#type, &req.name)?;
        Ok(Response::new(()))
    }

    async fn log_set_level(&self, req: Request<imrpc::LogSetLevelRequest>) -> Result<Response<()>, Status> {
        // the manager asks again every minute or so: said once per value
        let level = &req.get_ref().level;
        if self.log_asked(false, level) {
            tracing::info!(%level, "Longhorn asked for a log level (talon's is set by RUST_LOG)");
        }
        Ok(Response::new(()))
    }

    async fn log_set_flags(&self, req: Request<imrpc::LogSetFlagsRequest>) -> Result<Response<()>, Status> {
        let flags = &req.get_ref().flags;
        if self.log_asked(true, flags) {
            tracing::info!(%flags, "Longhorn asked for log flags (talon's are set by RUST_LOG)");
        }
        Ok(Response::new(()))
    }

    async fn version_get(&self, _: Request<()>) -> Result<Response<proto::VersionResponse>, Status> {
        Ok(Response::new(version_response()))
    }
}

impl Longhorn {
    /// Removes a Disk this `DiskCreate` recorded and that did not come up,
    /// and waits (bounded) until it is gone: the disk controller holds it
    /// until its base bdev is detached, and a refused `DiskCreate` must
    /// leave no Disk behind.
    async fn forget_disk(&self, name: &str) {
        let (_, mut rx) = self.state().watch(Some(("config", Disk::TYPE)));
        match self.state().destroy("config", Disk::TYPE, name, "") {
            Ok(_) | Err(StateError::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(disk = %name, error = %e, "DiskCreate: the refused disk is not removed");
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + DISK_FORGET;
        while matches!(self.state().get_typed::<Disk>(name), Ok(Some(_))) {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => {
                    tracing::warn!(disk = %name, "DiskCreate: the refused disk is still being removed");
                    return;
                }
                Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => return,
                Ok(_) => {}
            }
        }
    }
}

// ------------------------------------------------------------ 8502

#[tonic::async_trait]
impl disk_service_server::DiskService for Longhorn {
    async fn disk_create(
        &self,
        req: Request<imrpc::DiskCreateRequest>,
    ) -> Result<Response<imrpc::Disk>, Status> {
        let req = req.into_inner();
        let name = naming::instance_name("disk", &req.disk_name).map_err(invalid)?;
        let what = format!("disk {name}");
        if req.disk_type != imrpc::DiskType::Block as i32 {
            return Err(Status::invalid_argument(format!(
                "{what}: talon's V2 disks are block disks (disk_type block)"
            )));
        }
        if req.disk_path.is_empty() {
            return Err(Status::invalid_argument(format!("{what}: disk_path is empty")));
        }
        let pci = is_pci_address(&req.disk_path) || req.disk_driver == "nvme";
        if pci && !is_pci_address(&req.disk_path) {
            return Err(Status::invalid_argument(format!(
                "{what}: driver nvme needs a PCI address (dddd:bb:dd.f), not {:?}",
                req.disk_path
            )));
        }
        if !pci && !req.disk_path.starts_with('/') {
            return Err(Status::invalid_argument(format!(
                "{what}: disk_path {:?} is neither an absolute path nor a PCI address",
                req.disk_path
            )));
        }
        if !matches!(req.disk_driver.as_str(), "" | "auto" | "aio" | "nvme") {
            return Err(Status::invalid_argument(format!(
                "{what}: disk driver {:?} is not one of aio, nvme, auto",
                req.disk_driver
            )));
        }
        let want = Disk {
            path: (!pci).then(|| req.disk_path.clone()),
            pci: pci.then(|| req.disk_path.clone()),
            size_bytes: None,
            cluster_mib: 1,
            // as Longhorn's engine: the aio bdev's block size (an NVMe disk has its own)
            block_size: if pci {
                None
            } else {
                aio_block_size(&what, req.block_size)?
            },
            format: 0,
        };
        // what a path holds is judged before anything is recorded (the rule
        // disk_add follows): a refused path leaves no Disk behind
        let recorded = self
            .state()
            .get_typed::<Disk>(name.as_str())
            .map_err(LonghornError::State)?
            .is_some();
        if let Some(path) = want.path.clone().map(std::path::PathBuf::from)
            && !recorded
        {
            let checked = tokio::task::spawn_blocking(move || crate::host::disk_target::check(&path, false))
                .await
                .map_err(|e| Status::internal(format!("{what}: {e}")))?;
            if let Err(e) = checked {
                return Err(Status::failed_precondition(format!(
                    "{what}: {}",
                    crate::util::error_chain(&e)
                )));
            }
        }
        let made = match self
            .state()
            .get_typed::<Disk>(name.as_str())
            .map_err(LonghornError::State)?
        {
            Some(cur) if cur.spec.path == want.path && cur.spec.pci == want.pci => false,
            Some(cur) => {
                return Err(Status::already_exists(format!(
                    "{what} already exists for {}",
                    cur.spec.path.or(cur.spec.pci).unwrap_or_default()
                )));
            }
            None => {
                self.state()
                    .create_typed(name.as_str(), "", &want)
                    .map_err(LonghornError::State)?;
                true
            }
        };
        // wait for its lvstore; a disk that cannot come up is not left behind
        let (_, mut rx) = self.state().watch(Some(("engine", DiskStatus::TYPE)));
        let deadline = tokio::time::Instant::now() + DISK_READY;
        let failure = loop {
            match self
                .state()
                .get_typed::<DiskStatus>(name.as_str())
                .map_err(LonghornError::State)?
            {
                Some(d) if d.spec.state == ObjectState::Ready => break None,
                Some(d) if d.spec.state == ObjectState::Failed => {
                    break Some(Status::failed_precondition(format!("{what}: {}", d.spec.message)));
                }
                _ => {}
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => {
                    break Some(Status::deadline_exceeded(format!(
                        "{what}: its lvstore was not ready within {} s",
                        DISK_READY.as_secs()
                    )));
                }
                Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => {
                    break Some(Status::unavailable(format!("{what}: talon is stopping")));
                }
                Ok(_) => {}
            }
        };
        if let Some(f) = failure {
            if made {
                self.forget_disk(name.as_str()).await;
            }
            return Err(f);
        }
        let mut d = self.disk_message(name.as_str())?;
        if let Some(b) = self.block_size(name.as_str()).await {
            d.block_size = b;
            d.total_blocks = d.total_size / b.max(1);
            d.free_blocks = d.free_size / b.max(1);
        }
        Ok(Response::new(d))
    }

    async fn disk_delete(&self, req: Request<imrpc::DiskDeleteRequest>) -> Result<Response<()>, Status> {
        let req = req.into_inner();
        let name = naming::instance_name("disk", &req.disk_name).map_err(invalid)?;
        let on_it: Vec<String> = self
            .state()
            .list_typed::<LonghornReplica>()
            .map_err(LonghornError::State)?
            .into_iter()
            .filter(|r| r.spec.disk == name.as_str())
            .map(|r| r.id().to_owned())
            .collect();
        if !on_it.is_empty() {
            return Err(Status::failed_precondition(format!(
                "disk {name} holds replica instances {}; delete them first",
                on_it.join(", ")
            )));
        }
        match self.state().destroy("config", Disk::TYPE, name.as_str(), "") {
            Ok(_) | Err(StateError::NotFound { .. }) => Ok(Response::new(())),
            Err(e) => Err(LonghornError::State(e).into()),
        }
    }

    async fn disk_get(&self, req: Request<imrpc::DiskGetRequest>) -> Result<Response<imrpc::Disk>, Status> {
        let req = req.into_inner();
        let name = naming::instance_name("disk", &req.disk_name).map_err(invalid)?;
        let mut d = self.disk_message(name.as_str())?;
        if let Some(b) = self.block_size(name.as_str()).await {
            d.block_size = b;
            d.total_blocks = d.total_size / b.max(1);
            d.free_blocks = d.free_size / b.max(1);
        }
        Ok(Response::new(d))
    }

    async fn disk_health_get(
        &self,
        req: Request<imrpc::DiskHealthGetRequest>,
    ) -> Result<Response<imrpc::DiskHealthGetResponse>, Status> {
        let req = req.into_inner();
        let name = naming::instance_name("disk", &req.disk_name).map_err(invalid)?;
        let d = self.disk_message(name.as_str())?;
        // no SMART data is read yet: the identity of the disk, counters zero
        Ok(Response::new(imrpc::DiskHealthGetResponse {
            model_number: format!("talon {}", d.driver),
            traddr: d.path,
            available_spare_percentage: 100,
            ..Default::default()
        }))
    }

    async fn disk_replica_instance_list(
        &self,
        req: Request<imrpc::DiskReplicaInstanceListRequest>,
    ) -> Result<Response<imrpc::DiskReplicaInstanceListResponse>, Status> {
        let req = req.into_inner();
        let name = naming::instance_name("disk", &req.disk_name).map_err(invalid)?;
        let d = self.ready_disk(&format!("disk {name}"), name.as_str())?;
        let lvols = self
            .client()
            .bdev_lvol_get_lvols(&GetLvols::default())
            .await
            .map_err(|e| Status::unavailable(format!("listing the lvols of disk {name}: {e}")))?;
        let mut out = std::collections::HashMap::new();
        for l in lvols {
            if l.lvs.name != d.lvstore
                || l.is_snapshot
                || crate::spdk::volume::parse_lvol(&l.name).is_some()
                || naming::instance_name("replica", &l.name).is_err()
            {
                continue;
            }
            let spec_size = self
                .state()
                .get_typed::<LonghornReplica>(&l.name)
                .ok()
                .flatten()
                .map(|r| r.spec.size_bytes)
                .unwrap_or_default();
            out.insert(
                l.name.clone(),
                imrpc::ReplicaInstance {
                    name: l.name.clone(),
                    uuid: l.uuid.clone(),
                    disk_name: name.as_str().to_owned(),
                    disk_uuid: d.lvstore_uuid.clone(),
                    spec_size,
                    actual_size: l.num_allocated_clusters.saturating_mul(d.cluster_bytes),
                },
            );
        }
        Ok(Response::new(imrpc::DiskReplicaInstanceListResponse {
            replica_instances: out,
        }))
    }

    async fn disk_replica_instance_delete(
        &self,
        req: Request<imrpc::DiskReplicaInstanceDeleteRequest>,
    ) -> Result<Response<()>, Status> {
        let req = req.into_inner();
        let name = naming::instance_name("disk", &req.disk_name).map_err(invalid)?;
        self.ready_disk(&format!("disk {name}"), name.as_str())?;
        self.delete_replica(&req.replcia_instance_name, true, Some(name.as_str().to_owned()))
            .await?;
        Ok(Response::new(()))
    }

    async fn metrics_get(
        &self,
        req: Request<imrpc::DiskGetRequest>,
    ) -> Result<Response<imrpc::DiskMetricsGetReply>, Status> {
        let req = req.into_inner();
        let name = naming::instance_name("disk", &req.disk_name).map_err(invalid)?;
        self.disk_message(name.as_str())?;
        Ok(Response::new(imrpc::DiskMetricsGetReply {
            metrics: Some(Default::default()),
        }))
    }

    async fn version_get(&self, _: Request<()>) -> Result<Response<imrpc::DiskVersionResponse>, Status> {
        Ok(Response::new(imrpc::DiskVersionResponse {
            version: crate::VERSION.to_owned(),
            git_commit: String::new(),
            build_date: String::new(),
            instance_manager_disk_service_api_version: super::DISK_API_VERSION,
            instance_manager_disk_service_api_min_version: super::DISK_API_MIN_VERSION,
        }))
    }
}

// ------------------------------------------------------------ 8504

/// One event, then quiet until the client goes or the servers stop.
fn empty_watch(lh: &Longhorn) -> WatchStream {
    let mut stopping = lh.stopping.subscribe();
    let end = futures::stream::once(async move {
        let _ = stopping.wait_for(|s| *s).await;
    })
    .filter_map(|()| async { None });
    Box::pin(futures::stream::once(async { Ok(()) }).chain(end))
}

use futures::StreamExt as _;

#[tonic::async_trait]
impl spdk_service_server::SpdkService for Longhorn {
    async fn replica_create(
        &self,
        req: Request<spdkrpc::ReplicaCreateRequest>,
    ) -> Result<Response<spdkrpc::Replica>, Status> {
        let req = req.into_inner();
        let volume = req
            .name
            .rsplit_once("-r-")
            .map(|(v, _)| v.to_owned())
            .unwrap_or_else(|| req.name.clone());
        self.create_replica(
            &req.name,
            &volume,
            &req.lvs_name,
            &req.lvs_uuid,
            req.spec_size,
            req.port_count,
        )
        .await?;
        self.settle(&req.name, InstanceKind::Replica).await;
        let r = self
            .state()
            .get_typed::<LonghornReplica>(&req.name)
            .map_err(LonghornError::State)?
            .ok_or_else(|| {
                Status::aborted(format!("replica {} was deleted while it was created", req.name))
            })?;
        Ok(Response::new(self.replica_message(&r)?))
    }

    async fn replica_delete(
        &self,
        req: Request<spdkrpc::ReplicaDeleteRequest>,
    ) -> Result<Response<()>, Status> {
        let req = req.into_inner();
        self.delete_replica(&req.name, req.cleanup_required, None).await?;
        Ok(Response::new(()))
    }

    async fn replica_get(
        &self,
        req: Request<spdkrpc::ReplicaGetRequest>,
    ) -> Result<Response<spdkrpc::Replica>, Status> {
        if crate::util::fault("longhorn-replica-get-down") {
            // a test's node whose SPDKService does not answer (TALON_FAULTS)
            return Err(Status::unavailable(
                "fault injected: longhorn-replica-get-down (TALON_FAULTS)",
            ));
        }
        // another node's engine waits for it (see `share::share_asked`)
        let share_for = crate::proto::peer::asked_share_for(req.metadata());
        let name = req.into_inner().name;
        let r = self
            .state()
            .get_typed::<LonghornReplica>(&name)
            .map_err(LonghornError::State)?
            .ok_or_else(|| cannot_find("replica", &name))?;
        if let Some(engine) = share_for {
            self.share_asked(&r, &engine)?;
        }
        let mut m = self.replica_message(&r)?;
        // the head's parent and the snapshots as spdk_tgt holds them now
        fill_replica(&self.replica_lvols_now(r.id(), &r.spec.disk).await?, &mut m);
        // when each was made, as the engine that took it said
        for (s, l) in &mut m.snapshots {
            if let Some(i) = r.spec.snapshot_info.get(s) {
                l.creation_time = i.created.clone();
                l.user_created = true;
            }
        }
        Ok(Response::new(m))
    }

    async fn replica_expand(
        &self,
        req: Request<spdkrpc::ReplicaExpandRequest>,
    ) -> Result<Response<()>, Status> {
        self.replica_expand(req.into_inner()).await?;
        Ok(Response::new(()))
    }

    async fn replica_snapshot_create(
        &self,
        req: Request<spdkrpc::SnapshotRequest>,
    ) -> Result<Response<spdkrpc::Replica>, Status> {
        Ok(Response::new(
            self.replica_snapshot_create(req.into_inner(), false).await?,
        ))
    }

    async fn replica_snapshot_delete(
        &self,
        req: Request<spdkrpc::SnapshotRequest>,
    ) -> Result<Response<()>, Status> {
        self.replica_snapshot_delete(req.into_inner()).await?;
        Ok(Response::new(()))
    }

    async fn replica_snapshot_revert(
        &self,
        req: Request<spdkrpc::SnapshotRequest>,
    ) -> Result<Response<()>, Status> {
        let at_once = req.metadata().contains_key(crate::proto::peer::AT_ONCE);
        let done = self.replica_snapshot_revert(req.into_inner(), at_once).await?;
        let mut resp = Response::new(());
        if !done {
            resp.metadata_mut().insert(
                crate::proto::peer::PENDING,
                tonic::metadata::MetadataValue::from_static("1"),
            );
        }
        Ok(resp)
    }

    async fn replica_snapshot_hash(
        &self,
        req: Request<spdkrpc::SnapshotHashRequest>,
    ) -> Result<Response<()>, Status> {
        let req = req.into_inner();
        self.replica_hash(&req.name, &req.snapshot_name, req.rehash)
            .await?;
        Ok(Response::new(()))
    }

    async fn replica_snapshot_hash_status(
        &self,
        req: Request<spdkrpc::SnapshotHashStatusRequest>,
    ) -> Result<Response<spdkrpc::ReplicaSnapshotHashStatusResponse>, Status> {
        let req = req.into_inner();
        Ok(Response::new(
            self.replica_hash_status(&req.name, &req.snapshot_name).await?,
        ))
    }

    async fn replica_backup_create(
        &self,
        req: Request<spdkrpc::BackupCreateRequest>,
    ) -> Result<Response<spdkrpc::BackupCreateResponse>, Status> {
        Ok(Response::new(self.replica_backup_create(req.into_inner()).await?))
    }

    async fn replica_backup_status(
        &self,
        req: Request<spdkrpc::BackupStatusRequest>,
    ) -> Result<Response<spdkrpc::BackupStatusResponse>, Status> {
        Ok(Response::new(
            self.replica_backup_status(&req.into_inner().backup)?,
        ))
    }

    async fn replica_backup_restore(
        &self,
        req: Request<spdkrpc::ReplicaBackupRestoreRequest>,
    ) -> Result<Response<()>, Status> {
        self.replica_backup_restore(req.into_inner())?;
        Ok(Response::new(()))
    }

    async fn replica_restore_status(
        &self,
        req: Request<spdkrpc::ReplicaRestoreStatusRequest>,
    ) -> Result<Response<spdkrpc::ReplicaRestoreStatusResponse>, Status> {
        Ok(Response::new(
            self.replica_restore_status(&req.into_inner().replica_name)?,
        ))
    }

    async fn replica_rebuilding_src_start(
        &self,
        req: Request<spdkrpc::ReplicaRebuildingSrcStartRequest>,
    ) -> Result<Response<spdkrpc::ReplicaRebuildingSrcStartResponse>, Status> {
        Ok(Response::new(self.rebuilding_src_start(req.into_inner()).await?))
    }

    async fn replica_rebuilding_src_finish(
        &self,
        req: Request<spdkrpc::ReplicaRebuildingSrcFinishRequest>,
    ) -> Result<Response<()>, Status> {
        self.rebuilding_src_finish(req.into_inner()).await?;
        Ok(Response::new(()))
    }

    async fn replica_rebuilding_src_shallow_copy_start(
        &self,
        req: Request<spdkrpc::ReplicaRebuildingSrcShallowCopyStartRequest>,
    ) -> Result<Response<()>, Status> {
        self.rebuilding_src_copy_start(req.into_inner()).await?;
        Ok(Response::new(()))
    }

    async fn replica_rebuilding_src_shallow_copy_check(
        &self,
        req: Request<spdkrpc::ReplicaRebuildingSrcShallowCopyCheckRequest>,
    ) -> Result<Response<spdkrpc::ReplicaRebuildingSrcShallowCopyCheckResponse>, Status> {
        Ok(Response::new(
            self.rebuilding_src_copy_check(req.into_inner()).await?,
        ))
    }

    async fn replica_rebuilding_dst_start(
        &self,
        req: Request<spdkrpc::ReplicaRebuildingDstStartRequest>,
    ) -> Result<Response<spdkrpc::ReplicaRebuildingDstStartResponse>, Status> {
        let at_once = req.metadata().contains_key(crate::proto::peer::AT_ONCE);
        Ok(Response::new(
            self.rebuilding_dst_start(req.into_inner(), at_once).await?,
        ))
    }

    async fn replica_rebuilding_dst_snapshot_create(
        &self,
        req: Request<spdkrpc::SnapshotRequest>,
    ) -> Result<Response<()>, Status> {
        self.replica_snapshot_create(req.into_inner(), true).await?;
        Ok(Response::new(()))
    }

    async fn replica_snapshot_clone_dst_start(
        &self,
        req: Request<spdkrpc::ReplicaSnapshotCloneDstStartRequest>,
    ) -> Result<Response<()>, Status> {
        self.clone_dst_start(req.into_inner()).await?;
        Ok(Response::new(()))
    }

    async fn replica_rebuilding_dst_set_qos_limit(
        &self,
        req: Request<spdkrpc::ReplicaRebuildingDstSetQosLimitRequest>,
    ) -> Result<Response<()>, Status> {
        self.rebuilding_dst_qos(req.into_inner()).await?;
        Ok(Response::new(()))
    }

    async fn replica_list(&self, _: Request<()>) -> Result<Response<spdkrpc::ReplicaListResponse>, Status> {
        let mut replicas = std::collections::HashMap::new();
        for r in self
            .state()
            .list_typed::<LonghornReplica>()
            .map_err(LonghornError::State)?
        {
            replicas.insert(r.id().to_owned(), self.replica_message(&r)?);
        }
        Ok(Response::new(spdkrpc::ReplicaListResponse { replicas }))
    }

    type ReplicaWatchStream = WatchStream;

    async fn replica_watch(&self, _: Request<()>) -> Result<Response<Self::ReplicaWatchStream>, Status> {
        Ok(Response::new(self.watch_stream()))
    }

    async fn shard_list(&self, _: Request<()>) -> Result<Response<spdkrpc::ShardListResponse>, Status> {
        Ok(Response::new(spdkrpc::ShardListResponse::default()))
    }

    type ShardWatchStream = WatchStream;

    async fn shard_watch(&self, _: Request<()>) -> Result<Response<Self::ShardWatchStream>, Status> {
        Ok(Response::new(empty_watch(self)))
    }

    async fn shard_group_list(
        &self,
        _: Request<()>,
    ) -> Result<Response<spdkrpc::ShardGroupListResponse>, Status> {
        Ok(Response::new(spdkrpc::ShardGroupListResponse::default()))
    }

    type ShardGroupWatchStream = WatchStream;

    async fn shard_group_watch(
        &self,
        _: Request<()>,
    ) -> Result<Response<Self::ShardGroupWatchStream>, Status> {
        Ok(Response::new(empty_watch(self)))
    }

    async fn engine_set_target_listener_ana_state(
        &self,
        req: Request<spdkrpc::EngineSetTargetListenerAnaStateRequest>,
    ) -> Result<Response<()>, Status> {
        let req = req.into_inner();
        self.engine_ana_state_set(&req.name, &req.ana_state).await?;
        Ok(Response::new(()))
    }

    async fn engine_get(
        &self,
        req: Request<spdkrpc::EngineGetRequest>,
    ) -> Result<Response<spdkrpc::Engine>, Status> {
        Ok(Response::new(self.engine_get_spdk(&req.into_inner().name).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_paths_come_from_the_protos() {
        let served = ServedPaths::from_protos();
        let is_served = |p: &str| served.contains(p);
        assert!(is_served("/ProcessManagerService/VersionGet"));
        assert!(is_served("/imrpc.InstanceService/InstanceCreate"));
        assert!(is_served("/spdkrpc.SPDKService/ShardGroupWatch"));
        assert!(is_served("/grpc.health.v1.Health/Check"));
        assert!(!is_served("/imrpc.InstanceService/InstanceLog"));
        assert!(is_served("/imrpc.ProxyEngineService/VolumeGet"));
        assert!(is_served("/imrpc.ProxyEngineService/ReplicaAdd"));
        assert!(is_served("/imrpc.ProxyEngineService/SnapshotClone"));
        assert!(!is_served(
            "/imrpc.ProxyEngineService/VolumeUnmapMarkSnapChainRemovedSet"
        ));
        assert!(!is_served("/ProcessManagerService/ProcessList"));
    }

    #[test]
    fn refusals_keep_the_code_and_words_longhorn_reads() {
        let cases: Vec<(LonghornError, tonic::Code, &str)> = vec![
            (
                aio_block_size("disk d", 1000).expect_err("not a power of two"),
                tonic::Code::InvalidArgument,
                "disk d: block size 1000 is not a power of two of at least 512",
            ),
            (
                kind_of("shard", "s").expect_err("unknown type"),
                tonic::Code::InvalidArgument,
                "instance s: unknown instance type \"shard\" (talon serves replica, engine and engine-frontend)",
            ),
            (
                v2_only("instance i", 0, 0).expect_err("v1"),
                tonic::Code::InvalidArgument,
                "instance i: talon serves the V2 data engine only (data_engine DATA_ENGINE_V2)",
            ),
            (
                unimplemented("/imrpc.InstanceService/InstanceLog"),
                tonic::Code::Unimplemented,
                "/imrpc.InstanceService/InstanceLog is not implemented by talon's Longhorn instance manager",
            ),
        ];
        for (e, code, message) in cases {
            let s = Status::from(e);
            assert_eq!((s.code(), s.message()), (code, message));
        }
        assert_eq!(aio_block_size("disk d", 4096).ok(), Some(Some(4096)));
    }

    /// Field 16 of SpdkInstanceSpec is `nvme_tcp_nr_io_queues` (Longhorn v1.13): a spec encoded
    /// by hand (key 16 varint: 0x80 0x01) decodes to it; 0 is talon's default, Longhorn's range
    /// 1..=128 is taken, anything else refused naming the frontend.
    #[test]
    fn the_managers_io_queues_are_field_16_and_bounded() {
        let wire = [0x80, 0x01, 8];
        let sp = <imrpc::SpdkInstanceSpec as prost::Message>::decode(&wire[..]).expect("decodes");
        assert_eq!(sp.nvme_tcp_nr_io_queues, 8);
        assert_eq!(io_queues("engine-frontend f", 0).ok(), Some(0));
        assert_eq!(io_queues("engine-frontend f", 8).ok(), Some(8));
        assert_eq!(io_queues("engine-frontend f", 128).ok(), Some(128));
        for bad in [-1, 129] {
            let s = Status::from(io_queues("engine-frontend f", bad).expect_err("out of range"));
            assert_eq!(s.code(), tonic::Code::InvalidArgument);
            assert_eq!(
                s.message(),
                format!(
                    "engine-frontend f: nvme_tcp_nr_io_queues {bad} is not in 1..=128 (0: talon's default of 4)"
                )
            );
        }
    }

    /// What the manager repeats on a timer and changes nothing is logged at debug, as reads.
    #[test]
    fn routine_calls_are_not_logged_at_info() {
        for m in ["LogSetLevel", "LogSetFlags", "CleanupBackupMountPoints"] {
            assert!(is_routine(m), "{m}");
        }
        for m in ["InstanceCreate", "ReplicaAdd", "SnapshotRevert", "VolumeExpand"] {
            assert!(!is_routine(m) && !is_read(m), "{m}");
        }
    }

    #[test]
    fn pci_addresses_are_told_from_paths() {
        assert!(is_pci_address("0000:00:1e.0"));
        assert!(!is_pci_address("/dev/nvme0n1"));
        assert!(!is_pci_address("0000:00:1e.0x"));
    }
}
