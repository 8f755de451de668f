//! `SpdkDouble`: a TEST DOUBLE of spdk_tgt's JSON-RPC server, in process, on
//! a Unix socket. It is not SPDK: it moves no data. It stands in where a real
//! spdk_tgt cannot run (controller tests of the V2 engine, rollback tests)
//! and keeps the semantics recorded from spdk_tgt v26.05 in
//! `shared/spdk/transcript-v26.05.jsonl`: names and aliases, claims, error
//! codes and messages, framing.
//!
//! ```text
//!  SpdkClient ──Unix socket──> accept loop ──> connection task
//!                                  │   stream of JSON values; malformed JSON
//!                                  │   closes the connection (as SPDK does)
//!                                  v
//!                    faults (fail / drop the Nth call of a method)
//!                                  v
//!                    State (bdevs, lvstores, raids, subsystems, ...) ──> reply + "\n"
//! ```
//!
//! Recorded semantics it enforces: an lvol's bdev name is its UUID with alias
//! `lvs/lvol`; a bdev under an lvstore or raid is claimed (a second lvstore:
//! -1; a raid member: -1 "Failed to create RAID bdev X: Operation not
//! permitted"); duplicate names -17; missing objects -19 (-2 for a missing
//! AIO file); raid1 with fewer than 2 base bdevs -22; `remove_base_bdev`
//! leaves a raid1 online and degraded; a snapshot with more than one clone
//! cannot be deleted (-32603 "Operation not permitted"); clone of a writable
//! lvol -32602 "Invalid argument"; a thick lvol too large -32602 "No space
//! left on device"; nvmf errors -32602 "Invalid parameters" / -32603
//! "Unable to create subsystem"; attach of a controller name twice -114,
//! to an address nobody listens on -5; an NVMe attach of a namespace whose
//! NGUID is its source bdev's UUID registers no bdev (the alias clash); param
//! decoding failures -32603 "spdk_json_decode_object failed" (-32700 for a
//! bad raid level); unknown methods -32601.
//!
//! Simplifications (not recorded, documented here): deleting a claimed bdev
//! is refused with -16 where SPDK would hot-remove it; a raid member that does
//! not exist is refused with -19 where SPDK would leave the raid
//! "configuring"; a rebuild (a member added to an online raid1) takes
//! [`SpdkDouble::set_rebuild_time`] (zero by default: done at once) and
//! copies nothing. NVMe/TCP attach finds subsystems
//! of every `SpdkDouble` in the process (a fabric shared by the doubles) by
//! listener address and NQN; PCIe controllers are those added with
//! [`SpdkDouble::add_pcie_nvme`].
//!
//! `notify_get_notifications` reports bdev_register/bdev_unregister derived
//! when a call sees the bdev list change (a bdev made and gone between two
//! calls of any method is not reported).
//!
//! [`SpdkDouble::restart`] emulates a target restart: connections drop,
//! in-memory objects vanish, lvstores on AIO files come back when the same
//! file is attached again (examine), as on a real target.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::rpc::{
    AddNamespace, AioCreate, AttachController, ByName, ByNqn, ByTag, CreateInitiatorGroup, CreatePortalGroup,
    CreateSubsystem, CreateTargetNode, CreateTransport, DeleteTargetNode, GetBdevs, GetControllers,
    GetIostat, GetLvols, GetNotifications, GetRaids, GetSubsystems, GetTransports, ListenerAnaState,
    LvolClone, LvolCreate, LvolResize, LvolSnapshot, LvstoreCreate, LvstoreSelector, MallocCreate,
    NullCreate, RaidAddBaseBdev, RaidCategory, RaidCreate, RaidLevel, RemoveNamespace, SubsystemHostParams,
    SubsystemListener,
};

/// A fault to inject into one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer this error instead of running the call.
    Error {
        /// The code.
        code: i64,
        /// The message.
        message: String,
    },
    /// Close the connection without answering; `after_execute` runs the
    /// call first (the target did it, the client never hears).
    DropConnection {
        /// Run the call before dropping the connection.
        after_execute: bool,
    },
    /// Answer after a delay.
    Delay(Duration),
}

#[derive(Debug)]
struct Armed {
    method: String,
    remaining: u32,
    fault: Fault,
}

type RpcResult = Result<Value, (i64, String)>;

fn fail<T>(code: i64, message: impl Into<String>) -> Result<T, (i64, String)> {
    Err((code, message.into()))
}

fn decode<T: DeserializeOwned>(params: &Option<Value>) -> Result<T, (i64, String)> {
    let v = params.clone().unwrap_or_else(|| json!({}));
    serde_json::from_value(v).map_err(|_| (-32603, "spdk_json_decode_object failed".to_owned()))
}

const ENODEV: (i64, &str) = (-19, "No such device");
const EEXIST: (i64, &str) = (-17, "File exists");
const EBUSY: (i64, &str) = (-16, "Device or resource busy");
const INVALID_PARAMS: (i64, &str) = (-32602, "Invalid parameters");

fn e<T>(c: (i64, &str)) -> Result<T, (i64, String)> {
    fail(c.0, c.1)
}

#[derive(Debug, Clone)]
enum BdevKind {
    Malloc,
    Aio { filename: PathBuf },
    Lvol(LvolInfo),
    Raid,
    Nvme { ctrlr: String },
    Null,
}

#[derive(Debug, Clone)]
struct LvolInfo {
    lvs_uuid: String,
    name: String,
    thin: bool,
    snapshot: bool,
    /// The snapshot this lvol is a clone of (bdev name = UUID).
    parent: Option<String>,
    allocated: u64,
    /// A raid superblock in this lvol's own first cluster (a clone without
    /// one reads its parent's, as examine does on a real target).
    sb: Option<Superblock>,
}

/// A raid superblock as SPDK writes it on a member (`raid_bdev_superblock`:
/// the parts talon's behaviour depends on). Slot k: the member's UUID and
/// whether it is an active (CONFIGURED) member; a member that left keeps its
/// UUID with the state MISSING/FAILED, a rebuilt one becomes CONFIGURED when
/// its rebuild finishes.
#[derive(Debug, Clone, PartialEq)]
struct Superblock {
    uuid: String,
    name: String,
    seq: u64,
    slots: Vec<(Option<String>, bool)>,
}

#[derive(Debug, Clone)]
struct Bdev {
    name: String,
    aliases: Vec<String>,
    uuid: String,
    block_size: u32,
    num_blocks: u64,
    claimed_by: Option<String>,
    kind: BdevKind,
}

#[derive(Debug, Clone)]
struct Lvs {
    uuid: String,
    name: String,
    base_bdev: String,
    cluster_size: u64,
    total_clusters: u64,
}

#[derive(Debug, Clone)]
struct Raid {
    name: String,
    level: RaidLevel,
    strip_size_kb: u32,
    slots: Vec<Option<String>>,
    /// A rebuild into a member: (member, started, finishes).
    rebuild: Option<(String, Instant, Instant)>,
    /// The superblock (raids made with `superblock`, or assembled by examine).
    sb: Option<Superblock>,
    /// Assembled from a superblock whose active members are not all here:
    /// no bdev, I/O waits (state `configuring`).
    configuring: bool,
    /// Per slot: blocks before the data (the superblock's room).
    offsets: Vec<u64>,
}

impl Raid {
    /// The rebuild running now, if any.
    fn rebuilding(&self) -> Option<&(String, Instant, Instant)> {
        self.rebuild.as_ref().filter(|r| Instant::now() < r.2)
    }
}

#[derive(Debug, Clone, Default)]
struct Subsys {
    nqn: String,
    allow_any_host: bool,
    serial: String,
    model: String,
    hosts: Vec<String>,
    listeners: Vec<super::rpc::ListenAddress>,
    /// Created with `ana_reporting`.
    ana_reporting: bool,
    /// Listeners set to a state other than optimized, by `traddr:trsvcid`.
    ana: BTreeMap<String, super::rpc::AnaState>,
    namespaces: Vec<Ns>,
    /// Host controllers connected by NVMe/TCP attaches: (cntlid, hostnqn, hostid).
    controllers: Vec<(u32, String, String)>,
}

#[derive(Debug, Clone)]
struct Ns {
    nsid: u32,
    bdev: String,
    nguid: String,
    uuid: String,
    /// Whether nguid was given explicitly or derived from the bdev UUID.
    derived_nguid: bool,
    num_blocks: u64,
    block_size: u32,
}

#[derive(Debug, Clone)]
struct Ctrlr {
    name: String,
    trid: Value,
    bdevs: Vec<String>,
    /// The remote subsystem's controller id, for the detach.
    cntlid: Option<u32>,
}

#[derive(Debug, Clone)]
struct PciNvme {
    num_blocks: u64,
    block_size: u32,
}

/// Lvstores kept on AIO files across a restart.
#[derive(Debug, Clone)]
struct OnDisk {
    lvs: Lvs,
    lvols: Vec<Bdev>,
}

#[derive(Debug, Default)]
struct State {
    bdevs: Vec<Bdev>,
    lvstores: Vec<Lvs>,
    raids: Vec<Raid>,
    transports: Vec<String>,
    subsystems: Vec<Subsys>,
    ctrlrs: Vec<Ctrlr>,
    portal_groups: BTreeMap<u32, Value>,
    initiator_groups: BTreeMap<u32, Value>,
    target_nodes: BTreeMap<String, Value>,
    pci: BTreeMap<String, PciNvme>,
    on_disk: HashMap<PathBuf, OnDisk>,
    malloc_counter: u32,
    faults: Vec<Armed>,
    calls: HashMap<String, u64>,
    /// This target's host id (its host NQN is derived from it).
    host_id: String,
    /// How long a raid1 rebuild takes (zero: done at once).
    rebuild_time: Duration,
    /// Notify events (type, bdev), id = index, and the bdevs last seen.
    notifications: Vec<(&'static str, String)>,
    seen: std::collections::BTreeSet<String>,
    /// Snapshots of an lvol that was exported (itself, or as a raid member)
    /// through a listener that accepted I/O when the snapshot was taken.
    snapshots_while_writable: Vec<String>,
}

/// Every double in the process, for NVMe/TCP attach across doubles.
static FABRIC: Mutex<Vec<Weak<Mutex<State>>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug)]
struct Server {
    task: JoinHandle<()>,
    shutdown: watch::Sender<bool>,
}

/// The spdk_tgt test double (see the module docs). Dropping it stops it.
#[derive(Debug)]
pub struct SpdkDouble {
    socket: PathBuf,
    state: Arc<Mutex<State>>,
    server: Mutex<Option<Server>>,
}

impl Drop for SpdkDouble {
    fn drop(&mut self) {
        if let Some(s) = lock(&self.server).take() {
            let _ = s.shutdown.send(true);
            s.task.abort();
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

impl SpdkDouble {
    /// Starts a double listening on `socket` (replacing a stale socket file).
    pub async fn start(socket: impl Into<PathBuf>) -> io::Result<SpdkDouble> {
        let state = Arc::new(Mutex::new(State {
            host_id: new_uuid(),
            ..State::default()
        }));
        {
            let mut fabric = lock(&FABRIC);
            fabric.retain(|w| w.strong_count() > 0);
            fabric.push(Arc::downgrade(&state));
        }
        let d = SpdkDouble {
            socket: socket.into(),
            state,
            server: Mutex::new(None),
        };
        d.listen()?;
        Ok(d)
    }

    fn listen(&self) -> io::Result<()> {
        let _ = std::fs::remove_file(&self.socket);
        let listener = UnixListener::bind(&self.socket)?;
        let (tx, rx) = watch::channel(false);
        let state = self.state.clone();
        let task = tokio::spawn(accept_loop(listener, state, rx));
        *lock(&self.server) = Some(Server { task, shutdown: tx });
        Ok(())
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops listening and closes every connection, returning once they are
    /// closed (the target died). The state stays until [`SpdkDouble::restart`].
    pub async fn stop(&self) {
        let server = lock(&self.server).take();
        if let Some(s) = server {
            let _ = s.shutdown.send(true);
            let _ = s.task.await;
            let _ = std::fs::remove_file(&self.socket);
        }
    }

    /// Starts listening again after [`SpdkDouble::stop`], state unchanged.
    pub fn resume(&self) -> io::Result<()> {
        if lock(&self.server).is_some() {
            return Ok(());
        }
        self.listen()
    }

    /// A target restart: connections drop, in-memory objects vanish, lvstores
    /// on AIO files wait for their file to be attached again.
    pub async fn restart(&self) -> io::Result<()> {
        self.stop().await;
        {
            let mut s = lock(&self.state);
            let mut on_disk = std::mem::take(&mut s.on_disk);
            for lvs in &s.lvstores {
                let Some(base) = s.bdevs.iter().find(|b| b.name == lvs.base_bdev) else {
                    continue;
                };
                if let BdevKind::Aio { filename } = &base.kind {
                    let lvols = s
                        .bdevs
                        .iter()
                        .filter(|b| matches!(&b.kind, BdevKind::Lvol(l) if l.lvs_uuid == lvs.uuid))
                        .map(|b| Bdev {
                            claimed_by: None,
                            ..b.clone()
                        })
                        .collect();
                    on_disk.insert(
                        filename.clone(),
                        OnDisk {
                            lvs: lvs.clone(),
                            lvols,
                        },
                    );
                }
            }
            let pci = std::mem::take(&mut s.pci);
            let faults = std::mem::take(&mut s.faults);
            let host_id = std::mem::take(&mut s.host_id);
            let rebuild_time = s.rebuild_time;
            *s = State {
                on_disk,
                pci,
                faults,
                host_id,
                rebuild_time,
                ..State::default()
            };
        }
        self.listen()
    }

    /// How long a raid1 rebuild takes from now on (zero: done at once).
    pub fn set_rebuild_time(&self, d: Duration) {
        lock(&self.state).rebuild_time = d;
    }

    /// Pulls the AIO disk `bdev` as a failing device would go: its lvstore
    /// unloads (and comes back when the same file is attached again), its
    /// lvols vanish, raids lose them as members (degraded) and namespaces on
    /// them go. Returns false when there is no such AIO bdev.
    pub fn hot_remove(&self, bdev: &str) -> bool {
        let mut s = lock(&self.state);
        let Some(i) = s.find(bdev) else { return false };
        let BdevKind::Aio { filename } = s.bdevs[i].kind.clone() else {
            return false;
        };
        let name = s.bdevs[i].name.clone();
        if let Some(li) = s.lvstores.iter().position(|l| l.base_bdev == name) {
            let lvs = s.lvstores.remove(li);
            let lvols: Vec<Bdev> = s
                .bdevs
                .iter()
                .filter(|b| matches!(&b.kind, BdevKind::Lvol(l) if l.lvs_uuid == lvs.uuid))
                .map(|b| Bdev {
                    claimed_by: None,
                    ..b.clone()
                })
                .collect();
            for l in &lvols {
                if let Some(j) = s.find(&l.name) {
                    s.remove_bdev(j);
                }
            }
            s.on_disk.insert(filename, OnDisk { lvs, lvols });
        }
        if let Some(j) = s.find(&name) {
            s.remove_bdev(j);
        }
        s.sync_notifications();
        true
    }

    /// Injects `fault` into the `nth` next call of `method` (1 = the next one).
    pub fn inject(&self, method: &str, nth: u32, fault: Fault) {
        lock(&self.state).faults.push(Armed {
            method: method.to_owned(),
            remaining: nth.max(1),
            fault,
        });
    }

    /// Makes the `nth` next call of `method` fail with `code`/`message`.
    pub fn fail_nth(&self, method: &str, nth: u32, code: i64, message: &str) {
        self.inject(
            method,
            nth,
            Fault::Error {
                code,
                message: message.to_owned(),
            },
        );
    }

    /// Drops the connection on the `nth` next call of `method`, before running it.
    pub fn drop_connection_on(&self, method: &str, nth: u32) {
        self.inject(method, nth, Fault::DropConnection { after_execute: false });
    }

    /// Snapshots (`lvs/name`) taken of an lvol that a listener accepting I/O
    /// exported (directly or as a raid member) at that moment: each one may
    /// be a different instant from its siblings'.
    pub fn snapshots_while_writable(&self) -> Vec<String> {
        lock(&self.state).snapshots_while_writable.clone()
    }

    /// Listeners of `nqn` whose ANA state is not optimized (`traddr:trsvcid`).
    pub fn frozen_listeners(&self, nqn: &str) -> Vec<String> {
        let st = lock(&self.state);
        st.subsystems
            .iter()
            .find(|s| s.nqn == nqn)
            .map(|s| s.ana.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// How many times `method` was called.
    pub fn calls(&self, method: &str) -> u64 {
        lock(&self.state).calls.get(method).copied().unwrap_or(0)
    }

    /// Adds a local NVMe device that `bdev_nvme_attach_controller` with
    /// trtype PCIe can attach at `bdf`.
    pub fn add_pcie_nvme(&self, bdf: &str, num_blocks: u64, block_size: u32) {
        lock(&self.state).pci.insert(
            bdf.to_owned(),
            PciNvme {
                num_blocks,
                block_size,
            },
        );
    }

    /// Names of every bdev (for leftover checks in tests).
    pub fn bdev_names(&self) -> Vec<String> {
        lock(&self.state).bdevs.iter().map(|b| b.name.clone()).collect()
    }

    /// NQNs of every subsystem except discovery.
    pub fn subsystem_nqns(&self) -> Vec<String> {
        lock(&self.state)
            .subsystems
            .iter()
            .map(|s| s.nqn.clone())
            .collect()
    }
}

async fn accept_loop(listener: UnixListener, state: Arc<Mutex<State>>, shutdown: watch::Receiver<bool>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let mut sd = shutdown.clone();
        tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => { conns.spawn(serve_conn(s, state.clone(), shutdown.clone())); }
                Err(err) => { tracing::warn!(%err, "SpdkDouble accept failed"); return; }
            },
            _ = sd.changed() => {
                conns.shutdown().await;
                return;
            }
        }
    }
}

async fn serve_conn(stream: UnixStream, state: Arc<Mutex<State>>, mut shutdown: watch::Receiver<bool>) {
    let (mut r, mut w) = stream.into_split();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = r.read(&mut chunk) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
            _ = shutdown.changed() => return,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut consumed = 0;
        let mut requests = Vec::new();
        let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
        loop {
            match it.next() {
                Some(Ok(v)) => {
                    consumed = it.byte_offset();
                    requests.push(v);
                }
                Some(Err(e)) if e.is_eof() => break,
                // Malformed JSON: SPDK closes the connection, answering nothing.
                Some(Err(_)) => return,
                None => {
                    consumed = buf.len();
                    break;
                }
            }
        }
        buf.drain(..consumed);
        for req in requests {
            let out = match req {
                Value::Array(items) if !items.is_empty() => {
                    let mut answers = Vec::new();
                    for item in items {
                        match handle_request(&state, item).await {
                            Outcome::Reply(v) => answers.push(v),
                            Outcome::Silent => {}
                            Outcome::Drop => return,
                        }
                    }
                    if answers.is_empty() {
                        None
                    } else {
                        Some(Value::Array(answers))
                    }
                }
                other => match handle_request(&state, other).await {
                    Outcome::Reply(v) => Some(v),
                    Outcome::Silent => None,
                    Outcome::Drop => return,
                },
            };
            if let Some(v) = out {
                let mut bytes = serde_json::to_vec(&v).unwrap_or_default();
                bytes.push(b'\n');
                if w.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        }
    }
}

enum Outcome {
    Reply(Value),
    Silent,
    Drop,
}

fn invalid_request() -> Outcome {
    Outcome::Reply(json!({"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request"}}))
}

async fn handle_request(state: &Arc<Mutex<State>>, req: Value) -> Outcome {
    let Value::Object(obj) = req else {
        return invalid_request();
    };
    if obj.get("jsonrpc").is_some_and(|v| v != "2.0") {
        return invalid_request();
    }
    let Some(method) = obj.get("method").and_then(Value::as_str).map(str::to_owned) else {
        return invalid_request();
    };
    let id = obj.get("id").cloned().unwrap_or(Value::Null);
    let params = obj.get("params").cloned().filter(|p| !p.is_null());

    let fault = {
        let mut s = lock(state);
        *s.calls.entry(method.clone()).or_default() += 1;
        let mut hit = None;
        for a in s.faults.iter_mut().filter(|a| a.method == method) {
            a.remaining -= 1;
            if a.remaining == 0 && hit.is_none() {
                hit = Some(a.fault.clone());
            }
        }
        s.faults.retain(|a| a.remaining > 0);
        hit
    };
    let result = match fault {
        Some(Fault::Error { code, message }) => Err((code, message)),
        Some(Fault::DropConnection { after_execute }) => {
            if after_execute {
                let _ = execute(state, &method, &params);
            }
            return Outcome::Drop;
        }
        Some(Fault::Delay(d)) => {
            tokio::time::sleep(d).await;
            execute(state, &method, &params)
        }
        None => execute(state, &method, &params),
    };
    if id.is_null() {
        return Outcome::Silent;
    }
    Outcome::Reply(match result {
        Ok(v) => json!({"jsonrpc":"2.0","id":id,"result":v}),
        Err((code, message)) => json!({"jsonrpc":"2.0","id":id,"error":{"code":code,"message":message}}),
    })
}

fn fabric() -> Vec<Arc<Mutex<State>>> {
    lock(&FABRIC).iter().filter_map(Weak::upgrade).collect()
}

fn listens(sub: &Subsys, traddr: &str, trsvcid: &str) -> bool {
    sub.listeners
        .iter()
        .any(|l| l.traddr == traddr && l.trsvcid.as_deref() == Some(trsvcid))
}

/// What an NVMe/TCP attach finds on the fabric: the namespaces of a
/// subsystem listening at the address, and the controller id the subsystem
/// gave this host.
/// A connect, as SPDK's target answers it: only to a host the subsystem
/// allows (`allow_any_host`, or its NQN among the hosts); `hostnqn` is the
/// one the attach named, else the double's default.
fn fabric_connect(
    traddr: &str,
    trsvcid: &str,
    nqn: &str,
    host_id: &str,
    hostnqn: Option<&str>,
) -> Option<(Vec<Ns>, u32)> {
    let hostnqn = hostnqn.map_or_else(
        || format!("nqn.2014-08.org.nvmexpress:uuid:{host_id}"),
        str::to_owned,
    );
    for d in fabric() {
        let mut s = lock(&d);
        for sub in &mut s.subsystems {
            if sub.nqn == nqn && listens(sub, traddr, trsvcid) {
                if !sub.allow_any_host && !sub.hosts.contains(&hostnqn) {
                    return None;
                }
                let cntlid = sub.controllers.iter().map(|c| c.0).max().unwrap_or(0) + 1;
                sub.controllers.push((cntlid, hostnqn, host_id.to_owned()));
                return Some((sub.namespaces.clone(), cntlid));
            }
        }
    }
    None
}

fn fabric_disconnect(trid: &Value, cntlid: u32) {
    let (Some(traddr), Some(trsvcid), Some(nqn)) = (
        trid["traddr"].as_str(),
        trid["trsvcid"].as_str(),
        trid["subnqn"].as_str(),
    ) else {
        return;
    };
    for d in fabric() {
        let mut s = lock(&d);
        for sub in &mut s.subsystems {
            if sub.nqn == nqn && listens(sub, traddr, trsvcid) {
                sub.controllers.retain(|c| c.0 != cntlid);
            }
        }
    }
}

fn execute(state: &Arc<Mutex<State>>, method: &str, params: &Option<Value>) -> RpcResult {
    // The attach looks at the fabric (every double) before taking this
    // double's lock, so two doubles attaching to each other cannot deadlock.
    if method == "bdev_nvme_attach_controller" {
        let p: AttachController = decode(params)?;
        let host_id = {
            let s = lock(state);
            s.check_ctrlr_name(&p)?;
            s.host_id.clone()
        };
        let remote = if p.trtype.eq_ignore_ascii_case("tcp") {
            let port = p.trsvcid.as_deref().unwrap_or("4420");
            fabric_connect(
                &p.traddr,
                port,
                p.subnqn.as_deref().unwrap_or(""),
                &host_id,
                p.hostnqn.as_deref(),
            )
        } else {
            None
        };
        let mut s = lock(state);
        let r = s.attach(p, remote);
        s.sync_notifications();
        return r;
    }
    if method == "bdev_nvme_detach_controller" {
        let p: ByName = decode(params)?;
        let c = {
            let mut s = lock(state);
            let c = s.detach(&p.name);
            s.sync_notifications();
            c?
        };
        if let Some(cntlid) = c.cntlid {
            fabric_disconnect(&c.trid, cntlid);
        }
        return Ok(json!(true));
    }
    let mut s = lock(state);
    let r = s.call(method, params);
    s.sync_notifications();
    r
}

fn new_uuid() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

fn nguid_of(uuid: &str) -> String {
    uuid.replace('-', "").to_uppercase()
}

impl State {
    fn find(&self, name: &str) -> Option<usize> {
        self.bdevs
            .iter()
            .position(|b| b.name == name || b.aliases.iter().any(|a| a == name))
    }

    fn name_taken(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    fn bdev_json(&self, b: &Bdev) -> Value {
        let (product, driver) = match &b.kind {
            BdevKind::Malloc => ("Malloc disk", json!({})),
            BdevKind::Aio { filename } => ("AIO disk", json!({"aio": {"filename": filename}})),
            BdevKind::Lvol(l) => {
                let lvs = self.lvstores.iter().find(|s| s.uuid == l.lvs_uuid);
                let base_snapshot = l
                    .parent
                    .as_ref()
                    .and_then(|p| self.bdevs.iter().find(|b| &b.name == p))
                    .and_then(|b| match &b.kind {
                        BdevKind::Lvol(pl) => Some(pl.name.clone()),
                        _ => None,
                    });
                let mut lv = json!({
                    "lvol_store_uuid": l.lvs_uuid,
                    "base_bdev": lvs.map(|s| s.base_bdev.clone()).unwrap_or_default(),
                    "thin_provision": l.thin,
                    "num_allocated_clusters": l.allocated,
                    "snapshot": l.snapshot,
                    "clone": l.parent.is_some(),
                    "esnap_clone": false,
                });
                if let Some(bs) = base_snapshot {
                    lv["base_snapshot"] = json!(bs);
                }
                if l.snapshot {
                    lv["clones"] = json!(
                        self.clones_of(&b.name)
                            .iter()
                            .map(|c| self.lvol_name(c))
                            .collect::<Vec<_>>()
                    );
                }
                ("Logical Volume", json!({ "lvol": lv }))
            }
            BdevKind::Raid => ("Raid Volume", json!({"raid": self.raid_json(&b.name)})),
            BdevKind::Null => ("Null disk", json!({})),
            BdevKind::Nvme { ctrlr } => ("NVMe disk", json!({"nvme": [{"ctrlr": ctrlr}]})),
        };
        let mut v = json!({
            "name": b.name, "aliases": b.aliases, "product_name": product,
            "block_size": b.block_size, "num_blocks": b.num_blocks, "uuid": b.uuid,
            "claimed": b.claimed_by.is_some(), "zoned": false, "driver_specific": driver,
        });
        if b.claimed_by.is_some() {
            v["claim_type"] = json!("exclusive_write");
        }
        v
    }

    fn lvol_name(&self, bdev: &str) -> String {
        match self.bdevs.iter().find(|b| b.name == bdev).map(|b| &b.kind) {
            Some(BdevKind::Lvol(l)) => l.name.clone(),
            _ => bdev.to_owned(),
        }
    }

    fn clones_of(&self, snapshot: &str) -> Vec<String> {
        self.bdevs
            .iter()
            .filter(|b| matches!(&b.kind, BdevKind::Lvol(l) if l.parent.as_deref() == Some(snapshot)))
            .map(|b| b.name.clone())
            .collect()
    }

    fn raid_json(&self, name: &str) -> Value {
        let Some(r) = self.raids.iter().find(|r| r.name == name) else {
            return json!({});
        };
        let uuid = self
            .bdevs
            .iter()
            .find(|b| b.name == name)
            .map(|b| b.uuid.clone())
            .unwrap_or_default();
        let discovered = r.slots.iter().filter(|s| s.is_some()).count();
        let operational = match (&r.sb, r.configuring) {
            (Some(sb), true) => sb.slots.iter().filter(|s| s.1).count(),
            _ => discovered,
        };
        let state = if r.configuring {
            "configuring"
        } else if discovered == 0 {
            "offline"
        } else {
            "online"
        };
        let uuid = r.sb.as_ref().map(|sb| sb.uuid.clone()).unwrap_or(uuid);
        let size = self.find(&r.name).map_or(0, |i| self.bdevs[i].num_blocks);
        let level = serde_json::to_value(r.level).unwrap_or(Value::Null);
        let list: Vec<Value> = r
            .slots
            .iter()
            .enumerate()
            .map(|(k, s)| match s {
                Some(n) => {
                    let u = self.find(n).map(|i| self.bdevs[i].uuid.clone());
                    json!({"name": n, "uuid": u, "is_configured": true,
                        "data_offset": r.offsets.get(k).copied().unwrap_or(0), "data_size": size})
                }
                None => json!({"name": null, "uuid": null, "is_configured": false, "data_offset": 0, "data_size": 0}),
            })
            .collect();
        let mut out = json!({
            "name": r.name, "uuid": uuid, "strip_size_kb": r.strip_size_kb, "state": state,
            "raid_level": level, "superblock": r.sb.is_some(), "num_base_bdevs": r.slots.len(),
            "num_base_bdevs_discovered": discovered, "num_base_bdevs_operational": operational,
            "base_bdevs_list": list,
        });
        if let Some((target, start, end)) = r.rebuilding() {
            let blocks = self.find(&r.name).map(|i| self.bdevs[i].num_blocks).unwrap_or(0);
            let done = start.elapsed().as_secs_f64() / (*end - *start).as_secs_f64();
            out["process"] = json!({"type": "rebuild", "target": target,
                "progress": {"blocks": (blocks as f64 * done) as u64, "percent": (done * 100.0) as u32}});
        }
        out
    }

    fn lvs_by(&self, sel: &LvstoreSelector) -> Result<usize, (i64, String)> {
        self.lvstores
            .iter()
            .position(|l| {
                sel.uuid.as_ref().is_none_or(|u| &l.uuid == u)
                    && sel.lvs_name.as_ref().is_none_or(|n| &l.name == n)
            })
            .ok_or((ENODEV.0, ENODEV.1.to_owned()))
    }

    fn lvs_json(&self, l: &Lvs) -> Value {
        let used: u64 = self
            .bdevs
            .iter()
            .filter_map(|b| match &b.kind {
                BdevKind::Lvol(x) if x.lvs_uuid == l.uuid => Some(x.allocated),
                _ => None,
            })
            .sum();
        let block_size = self
            .find(&l.base_bdev)
            .map(|i| self.bdevs[i].block_size)
            .unwrap_or(4096);
        json!({
            "uuid": l.uuid, "name": l.name, "base_bdev": l.base_bdev,
            "total_data_clusters": l.total_clusters, "free_clusters": l.total_clusters.saturating_sub(used),
            "block_size": block_size, "cluster_size": l.cluster_size,
        })
    }

    fn free_clusters(&self, lvs_uuid: &str) -> u64 {
        let l = self.lvstores.iter().find(|l| l.uuid == lvs_uuid);
        let used: u64 = self
            .bdevs
            .iter()
            .filter_map(|b| match &b.kind {
                BdevKind::Lvol(x) if x.lvs_uuid == lvs_uuid => Some(x.allocated),
                _ => None,
            })
            .sum();
        l.map(|l| l.total_clusters.saturating_sub(used)).unwrap_or(0)
    }

    /// The lvol bdev index for `lvs/name` or a UUID.
    fn lvol(&self, name: &str) -> Result<usize, (i64, String)> {
        match self.find(name) {
            Some(i) if matches!(self.bdevs[i].kind, BdevKind::Lvol(_)) => Ok(i),
            _ => e(ENODEV),
        }
    }

    /// Whether bdev `i` (or the raid it is a member of) is a namespace of a
    /// subsystem with a listener that serves I/O (ANA optimized).
    fn writable_export(&self, i: usize) -> bool {
        let b = &self.bdevs[i];
        let device = match &b.claimed_by {
            Some(raid) if self.raids.iter().any(|r| &r.name == raid) => raid.clone(),
            _ => b.name.clone(),
        };
        self.subsystems.iter().any(|s| {
            s.namespaces.iter().any(|n| n.bdev == device)
                && s.listeners.iter().any(|l| {
                    let key = format!("{}:{}", l.traddr, l.trsvcid.as_deref().unwrap_or_default());
                    !s.ana.contains_key(&key)
                })
        })
    }

    fn lvol_info(&self, i: usize) -> LvolInfo {
        match &self.bdevs[i].kind {
            BdevKind::Lvol(l) => l.clone(),
            _ => unreachable_lvol(),
        }
    }

    fn set_lvol_info(&mut self, i: usize, f: impl FnOnce(&mut LvolInfo)) {
        if let BdevKind::Lvol(l) = &mut self.bdevs[i].kind {
            f(l);
        }
    }

    /// Removes a bdev that goes away: namespaces exporting it go too (as
    /// SPDK hot-removes them).
    fn remove_bdev(&mut self, i: usize) -> Bdev {
        let b = self.bdevs.remove(i);
        for s in &mut self.subsystems {
            s.namespaces.retain(|n| n.bdev != b.name);
        }
        // a raid loses the member (degraded), as on a hot remove; one with a
        // superblock records it on the members left before I/O goes on
        let mut changed = Vec::new();
        for (ri, r) in self.raids.iter_mut().enumerate() {
            for s in r.slots.iter_mut() {
                if s.as_deref() == Some(b.name.as_str()) {
                    *s = None;
                    changed.push(ri);
                }
            }
        }
        for ri in changed {
            self.sb_member_left(ri, &b.uuid);
        }
        b
    }

    /// The superblock bdev `i` shows at its start: its own, else (a thin
    /// lvol reads unallocated clusters from its parent) its parent's.
    fn visible_sb(&self, i: usize) -> Option<Superblock> {
        let mut i = i;
        for _ in 0..64 {
            let BdevKind::Lvol(l) = &self.bdevs[i].kind else {
                return None;
            };
            if let Some(sb) = &l.sb {
                return Some(sb.clone());
            }
            i = self.find(l.parent.as_deref()?)?;
        }
        None
    }

    /// Where a raid puts its data on member `i` when it has a superblock:
    /// 1 MiB rounded up to the member's optimal I/O boundary (an lvol's
    /// cluster), as `raid_bdev_configure_base_bdev` does.
    fn sb_data_offset(&self, i: usize) -> u64 {
        let bs = u64::from(self.bdevs[i].block_size.max(1));
        let min = (1u64 << 20) / bs;
        let boundary = match &self.bdevs[i].kind {
            BdevKind::Lvol(l) => self
                .lvstores
                .iter()
                .find(|s| s.uuid == l.lvs_uuid)
                .map_or(0, |s| s.cluster_size / bs),
            _ => 0,
        };
        if boundary == 0 {
            min
        } else {
            min.div_ceil(boundary) * boundary
        }
    }

    /// Writes raid `ri`'s superblock on its active members (the lvols).
    fn write_sb(&mut self, ri: usize) {
        let Some(sb) = self.raids[ri].sb.clone() else {
            return;
        };
        let members: Vec<String> = self.raids[ri].slots.iter().flatten().cloned().collect();
        for m in members {
            if let Some(i) = self.find(&m) {
                self.set_lvol_info(i, |l| l.sb = Some(sb.clone()));
            }
        }
    }

    /// Raid `ri` lost the member with `uuid`: its superblock says so (seq+1)
    /// on the members left.
    fn sb_member_left(&mut self, ri: usize, uuid: &str) {
        let Some(sb) = self.raids[ri].sb.as_mut() else {
            return;
        };
        let mut hit = false;
        for slot in sb.slots.iter_mut() {
            if slot.0.as_deref() == Some(uuid) && slot.1 {
                slot.1 = false;
                hit = true;
            }
        }
        if hit {
            sb.seq += 1;
            self.write_sb(ri);
        }
        if let Some(r) = self.raids.get_mut(ri)
            && r.rebuild
                .as_ref()
                .is_some_and(|(t, _, _)| self.bdevs.iter().all(|b| &b.name != t))
        {
            r.rebuild = None;
        }
    }

    /// A rebuild that has finished makes its member active in the superblock
    /// (SPDK: `raid_bdev_process_finish_write_sb`).
    fn settle_rebuilds(&mut self) {
        for ri in 0..self.raids.len() {
            let done = match &self.raids[ri].rebuild {
                Some((target, _, end)) if Instant::now() >= *end => Some(target.clone()),
                _ => None,
            };
            let Some(target) = done else { continue };
            self.raids[ri].rebuild = None;
            let Some(i) = self.find(&target) else { continue };
            let uuid = self.bdevs[i].uuid.clone();
            let Some(slot) = self.raids[ri]
                .slots
                .iter()
                .position(|s| s.as_deref() == Some(target.as_str()))
            else {
                continue;
            };
            if let Some(sb) = self.raids[ri].sb.as_mut() {
                if let Some(e) = sb.slots.get_mut(slot) {
                    *e = (Some(uuid), true);
                }
                sb.seq += 1;
                self.write_sb(ri);
            }
        }
    }

    /// Examine of lvols that just appeared (an lvstore loaded): a raid whose
    /// superblock they carry is assembled as SPDK's raid module does
    /// (`raid_bdev_examine_sb`): from the newest superblock among its members
    /// present; `configuring` (no bdev) until every member it names as
    /// active is here; a member that left re-joins an online raid by a
    /// rebuild; a member the newest superblock does not name is ignored.
    fn examine_sb(&mut self, appeared: &[String]) {
        let mut uuids = Vec::new();
        for n in appeared {
            let Some(i) = self.find(n) else { continue };
            if let Some(sb) = self.visible_sb(i)
                && sb
                    .slots
                    .iter()
                    .any(|s| s.0.as_deref() == Some(self.bdevs[i].uuid.as_str()))
                && !uuids.contains(&sb.uuid)
            {
                uuids.push(sb.uuid);
            }
        }
        for u in uuids {
            // every present bdev that carries this raid's superblock and is named in it
            let carriers: Vec<(usize, Superblock)> = (0..self.bdevs.len())
                .filter_map(|i| {
                    let sb = self.visible_sb(i)?;
                    (sb.uuid == u
                        && sb
                            .slots
                            .iter()
                            .any(|s| s.0.as_deref() == Some(self.bdevs[i].uuid.as_str())))
                    .then_some((i, sb))
                })
                .collect();
            let online = self
                .raids
                .iter()
                .position(|r| r.sb.as_ref().is_some_and(|sb| sb.uuid == u) && !r.configuring);
            if let Some(ri) = online {
                // members that left come back through a rebuild
                let Some(sb) = self.raids[ri].sb.clone() else {
                    continue;
                };
                for (i, _) in &carriers {
                    let (uuid, name) = (self.bdevs[*i].uuid.clone(), self.bdevs[*i].name.clone());
                    let slot = sb
                        .slots
                        .iter()
                        .position(|s| s.0.as_deref() == Some(uuid.as_str()) && !s.1);
                    if let Some(slot) = slot
                        && self.raids[ri].slots[slot].is_none()
                        && self.bdevs[*i].claimed_by.is_none()
                        && self.raids[ri].rebuilding().is_none()
                    {
                        self.raids[ri].slots[slot] = Some(name.clone());
                        self.raids[ri].offsets[slot] = self.sb_data_offset(*i);
                        self.bdevs[*i].claimed_by = Some(format!("raid {}", self.raids[ri].name));
                        let now = Instant::now();
                        self.raids[ri].rebuild = Some((name, now, now + self.rebuild_time));
                    }
                }
                continue;
            }
            // (re)assemble from the newest superblock present
            let Some(newest) = carriers.iter().map(|(_, sb)| sb.clone()).max_by_key(|sb| sb.seq) else {
                continue;
            };
            if let Some(ri) = self
                .raids
                .iter()
                .position(|r| r.sb.as_ref().is_some_and(|sb| sb.uuid == u))
            {
                let old = self.raids.remove(ri);
                for m in old.slots.iter().flatten() {
                    if let Some(i) = self.find(m) {
                        self.bdevs[i].claimed_by = None;
                    }
                }
            }
            let mut slots = vec![None; newest.slots.len()];
            let mut offsets = vec![0; newest.slots.len()];
            for (k, (uuid, active)) in newest.slots.iter().enumerate() {
                if !active {
                    continue;
                }
                if let Some(i) = self.bdevs.iter().position(|b| Some(&b.uuid) == uuid.as_ref()) {
                    slots[k] = Some(self.bdevs[i].name.clone());
                    offsets[k] = self.sb_data_offset(i);
                    self.bdevs[i].claimed_by = Some(format!("raid {}", newest.name));
                }
            }
            let configuring = newest
                .slots
                .iter()
                .zip(&slots)
                .any(|((_, active), present)| *active && present.is_none());
            let name = newest.name.clone();
            let members: Vec<usize> = slots.iter().flatten().filter_map(|n| self.find(n)).collect();
            let num_blocks = members
                .iter()
                .zip(
                    slots
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| s.is_some())
                        .map(|(k, _)| offsets[k]),
                )
                .map(|(&i, off)| self.bdevs[i].num_blocks.saturating_sub(off))
                .min()
                .unwrap_or(0);
            let bs = members.first().map_or(4096, |&i| self.bdevs[i].block_size);
            self.raids.push(Raid {
                name: name.clone(),
                level: RaidLevel::Raid1,
                strip_size_kb: 0,
                slots,
                rebuild: None,
                sb: Some(newest.clone()),
                configuring,
                offsets,
            });
            if !configuring && self.find(&name).is_none() {
                self.bdevs.push(Bdev {
                    name,
                    aliases: vec![newest.uuid.clone()],
                    uuid: newest.uuid.clone(),
                    block_size: bs,
                    num_blocks,
                    claimed_by: None,
                    kind: BdevKind::Raid,
                });
            }
        }
    }

    /// Derives bdev_register/bdev_unregister events from the bdevs now
    /// against those seen last time.
    fn sync_notifications(&mut self) {
        let now: std::collections::BTreeSet<String> = self.bdevs.iter().map(|b| b.name.clone()).collect();
        for gone in self.seen.difference(&now) {
            self.notifications.push(("bdev_unregister", gone.clone()));
        }
        for new in now.difference(&self.seen) {
            self.notifications.push(("bdev_register", new.clone()));
        }
        self.seen = now;
    }

    fn call(&mut self, method: &str, params: &Option<Value>) -> RpcResult {
        self.settle_rebuilds();
        match method {
            "notify_get_notifications" => {
                let p: GetNotifications = decode(params)?;
                self.sync_notifications();
                let from = p.id.unwrap_or(0) as usize;
                let max = p.max.map_or(usize::MAX, |m| m as usize);
                Ok(Value::Array(
                    self.notifications
                        .iter()
                        .enumerate()
                        .skip(from)
                        .take(max)
                        .map(|(i, (t, c))| json!({"type": t, "ctx": c, "id": i}))
                        .collect(),
                ))
            }
            "spdk_get_version" => Ok(json!({"version": "SPDK v26.05 (SpdkDouble)",
                "fields": {"major": 26, "minor": 5, "patch": 0, "suffix": "-double"}})),
            "rpc_get_methods" => Ok(json!(METHODS)),
            "framework_wait_init" | "bdev_wait_for_examine" => Ok(json!(true)),
            "bdev_get_bdevs" => {
                let p: GetBdevs = decode(params)?;
                match p.name {
                    Some(n) => match self.find(&n) {
                        Some(i) => Ok(json!([self.bdev_json(&self.bdevs[i])])),
                        None => e(ENODEV),
                    },
                    None => Ok(Value::Array(
                        self.bdevs.iter().map(|b| self.bdev_json(b)).collect(),
                    )),
                }
            }
            "bdev_examine" => {
                let p: ByName = decode(params)?;
                self.find(&p.name)
                    .map(|_| json!(true))
                    .ok_or((ENODEV.0, ENODEV.1.into()))
            }
            "bdev_get_iostat" => {
                let p: GetIostat = decode(params)?;
                let names: Vec<String> = match p.names {
                    Some(ns) => {
                        let mut out = Vec::new();
                        for n in ns {
                            let i = self.find(&n).ok_or((ENODEV.0, ENODEV.1.to_owned()))?;
                            out.push(self.bdevs[i].name.clone());
                        }
                        out
                    }
                    None => self.bdevs.iter().map(|b| b.name.clone()).collect(),
                };
                let bdevs: Vec<Value> = names
                    .iter()
                    .map(|n| {
                        json!({"name": n, "bytes_read": 0, "num_read_ops": 0, "bytes_written": 0,
                        "num_write_ops": 0, "bytes_unmapped": 0, "num_unmap_ops": 0,
                        "read_latency_ticks": 0, "write_latency_ticks": 0, "io_error": {}})
                    })
                    .collect();
                Ok(json!({"tick_rate": 1_000_000_000u64, "ticks": 0, "bdevs": bdevs}))
            }
            "bdev_malloc_create" => {
                if params.is_none() {
                    return fail(-32603, "spdk_json_decode_object failed");
                }
                let p: MallocCreate = decode(params)?;
                if p.block_size == 0 || !p.block_size.is_multiple_of(512) || p.num_blocks == 0 {
                    return fail(-22, "Invalid argument");
                }
                let name = match p.name {
                    Some(n) => n,
                    None => {
                        let n = format!("Malloc{}", self.malloc_counter);
                        self.malloc_counter += 1;
                        n
                    }
                };
                if self.name_taken(&name) {
                    return e(EEXIST);
                }
                let uuid = p.uuid.unwrap_or_else(new_uuid);
                self.bdevs.push(Bdev {
                    name: name.clone(),
                    aliases: vec![uuid.clone()],
                    uuid,
                    block_size: p.block_size,
                    num_blocks: p.num_blocks,
                    claimed_by: None,
                    kind: BdevKind::Malloc,
                });
                Ok(json!(name))
            }
            "bdev_malloc_delete" | "bdev_aio_delete" => {
                let p: ByName = decode(params)?;
                let want_aio = method == "bdev_aio_delete";
                let i = match self.find(&p.name) {
                    Some(i)
                        if matches!(self.bdevs[i].kind, BdevKind::Aio { .. }) == want_aio
                            && matches!(self.bdevs[i].kind, BdevKind::Aio { .. } | BdevKind::Malloc) =>
                    {
                        i
                    }
                    _ => return e(ENODEV),
                };
                if self.bdevs[i].claimed_by.is_some() {
                    return e(EBUSY);
                }
                self.remove_bdev(i);
                Ok(json!(true))
            }
            "bdev_aio_create" => {
                let p: AioCreate = decode(params)?;
                let meta = match std::fs::metadata(&p.filename) {
                    Ok(m) => m,
                    Err(_) => return fail(-2, "No such file or directory"),
                };
                if self.name_taken(&p.name) {
                    return e(EEXIST);
                }
                let bs = p.block_size.unwrap_or(512);
                if bs == 0 || !bs.is_multiple_of(512) {
                    return fail(-22, "Invalid argument");
                }
                let filename =
                    std::fs::canonicalize(&p.filename).unwrap_or_else(|_| PathBuf::from(&p.filename));
                let uuid = new_uuid();
                self.bdevs.push(Bdev {
                    name: p.name.clone(),
                    aliases: vec![uuid.clone()],
                    uuid,
                    block_size: bs,
                    num_blocks: meta.len() / u64::from(bs),
                    claimed_by: None,
                    kind: BdevKind::Aio {
                        filename: filename.clone(),
                    },
                });
                // Examine: an lvstore written on this file comes back.
                if let Some(d) = self.on_disk.remove(&filename) {
                    let mut lvs = d.lvs;
                    lvs.base_bdev = p.name.clone();
                    if let Some(i) = self.find(&p.name) {
                        self.bdevs[i].claimed_by = Some(format!("lvstore {}", lvs.name));
                    }
                    self.lvstores.push(lvs);
                    let appeared: Vec<String> = d.lvols.iter().map(|l| l.name.clone()).collect();
                    self.bdevs.extend(d.lvols);
                    self.examine_sb(&appeared);
                }
                Ok(json!(p.name))
            }
            "bdev_lvol_create_lvstore" => {
                let p: LvstoreCreate = decode(params)?;
                let i = self.find(&p.bdev_name).ok_or((ENODEV.0, ENODEV.1.to_owned()))?;
                if self.bdevs[i].claimed_by.is_some() {
                    return fail(-1, "Operation not permitted");
                }
                if self.lvstores.iter().any(|l| l.name == p.lvs_name) {
                    return e(EEXIST);
                }
                let cluster = u64::from(p.cluster_sz.unwrap_or(4 << 20));
                let size = self.bdevs[i].num_blocks * u64::from(self.bdevs[i].block_size);
                if cluster == 0 || size / cluster < 2 {
                    return fail(-22, "Invalid argument");
                }
                let uuid = new_uuid();
                self.bdevs[i].claimed_by = Some(format!("lvstore {}", p.lvs_name));
                self.lvstores.push(Lvs {
                    uuid: uuid.clone(),
                    name: p.lvs_name,
                    base_bdev: self.bdevs[i].name.clone(),
                    cluster_size: cluster,
                    total_clusters: size / cluster - 1,
                });
                Ok(json!(uuid))
            }
            "bdev_lvol_get_lvstores" => {
                let p: LvstoreSelector = decode(params)?;
                if p.uuid.is_none() && p.lvs_name.is_none() {
                    return Ok(Value::Array(
                        self.lvstores.iter().map(|l| self.lvs_json(l)).collect(),
                    ));
                }
                let i = self.lvs_by(&p)?;
                Ok(json!([self.lvs_json(&self.lvstores[i])]))
            }
            "bdev_lvol_delete_lvstore" => {
                let p: LvstoreSelector = decode(params)?;
                if p.uuid.is_none() && p.lvs_name.is_none() {
                    return fail(-22, "Invalid argument");
                }
                let i = self.lvs_by(&p)?;
                let lvs = self.lvstores[i].clone();
                let in_lvs = |b: &Bdev| matches!(&b.kind, BdevKind::Lvol(l) if l.lvs_uuid == lvs.uuid);
                if self.bdevs.iter().any(|b| in_lvs(b) && b.claimed_by.is_some()) {
                    return e(EBUSY);
                }
                while let Some(j) = self.bdevs.iter().position(in_lvs) {
                    self.remove_bdev(j);
                }
                self.lvstores.remove(i);
                if let Some(j) = self.find(&lvs.base_bdev) {
                    self.bdevs[j].claimed_by = None;
                }
                Ok(json!(true))
            }
            "bdev_lvol_create" => {
                let p: LvolCreate = decode(params)?;
                let sel = LvstoreSelector {
                    uuid: p.uuid.clone(),
                    lvs_name: p.lvs_name.clone(),
                };
                if sel.uuid.is_none() && sel.lvs_name.is_none() {
                    return fail(-32602, "Invalid parameters");
                }
                let li = self.lvs_by(&sel)?;
                let lvs = self.lvstores[li].clone();
                let alias = format!("{}/{}", lvs.name, p.lvol_name);
                if self.name_taken(&alias) {
                    return e(EEXIST);
                }
                let clusters = (p.size_in_mib << 20).div_ceil(lvs.cluster_size);
                let thin = p.thin_provision.unwrap_or(false);
                if !thin && clusters > self.free_clusters(&lvs.uuid) {
                    return fail(-32602, "No space left on device");
                }
                let bs = self
                    .find(&lvs.base_bdev)
                    .map(|i| self.bdevs[i].block_size)
                    .unwrap_or(4096);
                let uuid = new_uuid();
                self.bdevs.push(Bdev {
                    name: uuid.clone(),
                    aliases: vec![alias],
                    uuid: uuid.clone(),
                    block_size: bs,
                    num_blocks: clusters * lvs.cluster_size / u64::from(bs),
                    claimed_by: None,
                    kind: BdevKind::Lvol(LvolInfo {
                        lvs_uuid: lvs.uuid,
                        name: p.lvol_name,
                        thin,
                        snapshot: false,
                        parent: None,
                        allocated: if thin { 0 } else { clusters },
                        sb: None,
                    }),
                });
                Ok(json!(uuid))
            }
            "bdev_lvol_snapshot" => {
                let p: LvolSnapshot = decode(params)?;
                let i = self.lvol(&p.lvol_name)?;
                let info = self.lvol_info(i);
                let lvs = self.lvstores.iter().find(|l| l.uuid == info.lvs_uuid).cloned();
                let Some(lvs) = lvs else { return e(ENODEV) };
                if info.snapshot {
                    return fail(-22, "Invalid argument");
                }
                let alias = format!("{}/{}", lvs.name, p.snapshot_name);
                if self.name_taken(&alias) {
                    return e(EEXIST);
                }
                if self.writable_export(i) {
                    self.snapshots_while_writable.push(alias.clone());
                }
                let uuid = new_uuid();
                let src = self.bdevs[i].clone();
                self.bdevs.push(Bdev {
                    name: uuid.clone(),
                    aliases: vec![alias],
                    uuid: uuid.clone(),
                    claimed_by: None,
                    kind: BdevKind::Lvol(LvolInfo {
                        name: p.snapshot_name,
                        snapshot: true,
                        parent: info.parent.clone(),
                        allocated: info.allocated,
                        thin: info.thin,
                        lvs_uuid: info.lvs_uuid,
                        // the head's clusters (its superblock too) now belong to the snapshot
                        sb: info.sb.clone(),
                    }),
                    ..src
                });
                let snap = uuid.clone();
                self.set_lvol_info(i, |l| {
                    l.parent = Some(snap);
                    l.allocated = 0;
                    l.thin = true;
                    l.sb = None;
                });
                Ok(json!(uuid))
            }
            "bdev_lvol_set_parent" => {
                let p: super::rpc::LvolSetParent = decode(params)?;
                let i = self.lvol(&p.lvol_name)?;
                let si = self.lvol(&p.parent_name)?;
                let (info, parent) = (self.lvol_info(i), self.lvol_info(si));
                // blobstore: the parent must be a snapshot with as many
                // clusters as the lvol, and the lvol thin
                if i == si
                    || !parent.snapshot
                    || !info.thin
                    || self.bdevs[i].num_blocks != self.bdevs[si].num_blocks
                {
                    return fail(-32602, "Invalid argument");
                }
                let snap = self.bdevs[si].name.clone();
                self.set_lvol_info(i, |l| l.parent = Some(snap));
                Ok(json!(true))
            }
            "bdev_lvol_clone" => {
                let p: LvolClone = decode(params)?;
                let i = self.lvol(&p.snapshot_name)?;
                let info = self.lvol_info(i);
                if !info.snapshot {
                    return fail(-32602, "Invalid argument");
                }
                let Some(lvs) = self.lvstores.iter().find(|l| l.uuid == info.lvs_uuid).cloned() else {
                    return e(ENODEV);
                };
                let alias = format!("{}/{}", lvs.name, p.clone_name);
                if self.name_taken(&alias) {
                    return e(EEXIST);
                }
                let uuid = new_uuid();
                let src = self.bdevs[i].clone();
                self.bdevs.push(Bdev {
                    name: uuid.clone(),
                    aliases: vec![alias],
                    uuid: uuid.clone(),
                    claimed_by: None,
                    kind: BdevKind::Lvol(LvolInfo {
                        name: p.clone_name,
                        snapshot: false,
                        parent: Some(src.name.clone()),
                        allocated: 0,
                        thin: true,
                        lvs_uuid: info.lvs_uuid,
                        sb: None,
                    }),
                    ..src
                });
                Ok(json!(uuid))
            }
            "bdev_lvol_resize" => {
                let p: LvolResize = decode(params)?;
                let i = self.lvol(&p.name)?;
                let info = self.lvol_info(i);
                let Some(lvs) = self.lvstores.iter().find(|l| l.uuid == info.lvs_uuid).cloned() else {
                    return e(ENODEV);
                };
                let clusters = (p.size_in_mib << 20).div_ceil(lvs.cluster_size);
                if !info.thin
                    && clusters > info.allocated
                    && clusters - info.allocated > self.free_clusters(&lvs.uuid)
                {
                    return fail(-32602, "No space left on device");
                }
                let bs = u64::from(self.bdevs[i].block_size);
                self.bdevs[i].num_blocks = clusters * lvs.cluster_size / bs;
                if !info.thin {
                    self.set_lvol_info(i, |l| l.allocated = clusters);
                }
                Ok(json!(true))
            }
            "bdev_lvol_delete" => {
                let p: ByName = decode(params)?;
                let i = self.lvol(&p.name)?;
                if self.bdevs[i].claimed_by.is_some() {
                    return e(EBUSY);
                }
                let name = self.bdevs[i].name.clone();
                let info = self.lvol_info(i);
                let clones = self.clones_of(&name);
                if clones.len() > 1 {
                    return fail(-32603, "Operation not permitted");
                }
                // A snapshot with one clone is merged into it.
                for c in clones {
                    if let Some(j) = self.find(&c) {
                        let parent = info.parent.clone();
                        self.set_lvol_info(j, |l| l.parent = parent);
                    }
                }
                self.remove_bdev(i);
                Ok(json!(true))
            }
            "bdev_lvol_get_lvols" => {
                let p: GetLvols = decode(params)?;
                let sel = LvstoreSelector {
                    uuid: p.lvs_uuid,
                    lvs_name: p.lvs_name,
                };
                let only = if sel.uuid.is_some() || sel.lvs_name.is_some() {
                    Some(self.lvstores[self.lvs_by(&sel)?].uuid.clone())
                } else {
                    None
                };
                let mut out = Vec::new();
                for b in &self.bdevs {
                    let BdevKind::Lvol(l) = &b.kind else { continue };
                    if only.as_ref().is_some_and(|u| u != &l.lvs_uuid) {
                        continue;
                    }
                    let lvs_name = self
                        .lvstores
                        .iter()
                        .find(|s| s.uuid == l.lvs_uuid)
                        .map(|s| s.name.clone());
                    out.push(json!({
                        "alias": b.aliases.first(), "uuid": b.uuid, "name": l.name,
                        "is_thin_provisioned": l.thin, "is_snapshot": l.snapshot, "is_clone": l.parent.is_some(),
                        "is_esnap_clone": false, "is_degraded": false, "num_allocated_clusters": l.allocated,
                        "lvs": {"name": lvs_name, "uuid": l.lvs_uuid},
                    }));
                }
                Ok(Value::Array(out))
            }
            "bdev_null_create" => {
                let p: NullCreate = decode(params)?;
                if self.name_taken(&p.name) {
                    return e(EEXIST);
                }
                if p.block_size == 0 || !p.block_size.is_multiple_of(512) || p.num_blocks == 0 {
                    return fail(-22, "Invalid argument");
                }
                let uuid = new_uuid();
                self.bdevs.push(Bdev {
                    name: p.name.clone(),
                    aliases: vec![uuid.clone()],
                    uuid,
                    block_size: p.block_size,
                    num_blocks: p.num_blocks,
                    claimed_by: None,
                    kind: BdevKind::Null,
                });
                Ok(json!(p.name))
            }
            "bdev_null_delete" => {
                let p: ByName = decode(params)?;
                match self.find(&p.name) {
                    // a raid member is hot-removed from its raid, as SPDK does
                    Some(i) if matches!(self.bdevs[i].kind, BdevKind::Null) => {
                        self.remove_bdev(i);
                        Ok(json!(true))
                    }
                    _ => e(ENODEV),
                }
            }
            "bdev_raid_create" => {
                if let Some(level) = params.as_ref().and_then(|p| p.get("raid_level"))
                    && serde_json::from_value::<RaidLevel>(level.clone()).is_err()
                {
                    return fail(-32700, "spdk_json_decode_object failed");
                }
                let p: RaidCreate = decode(params)?;
                let failed = |m: &str| format!("Failed to create RAID bdev {}: {m}", p.name);
                if self.name_taken(&p.name) || self.raids.iter().any(|r| r.name == p.name) {
                    return fail(-17, failed("File exists"));
                }
                if p.raid_level == RaidLevel::Raid1 && p.base_bdevs.len() < 2 {
                    return fail(-22, "At least 2 base devices required for raid1");
                }
                if p.base_bdevs.is_empty() {
                    return fail(-22, failed("Invalid argument"));
                }
                let mut idx = Vec::new();
                let uuid = p.uuid.clone().unwrap_or_else(new_uuid);
                for m in &p.base_bdevs {
                    let i = self.find(m).ok_or((-19, failed("No such device")))?;
                    if self.bdevs[i].claimed_by.is_some() {
                        return fail(-1, failed("Operation not permitted"));
                    }
                    // "Superblock of a different raid bdev found on bdev ..."
                    // (with or without `superblock`)
                    if self.visible_sb(i).is_some_and(|sb| sb.uuid != uuid) {
                        return fail(-17, failed("File exists"));
                    }
                    idx.push(i);
                }
                let superblock = p.superblock.unwrap_or(false);
                let offsets: Vec<u64> = idx
                    .iter()
                    .map(|&i| if superblock { self.sb_data_offset(i) } else { 0 })
                    .collect();
                let bs = self.bdevs[idx[0]].block_size;
                let min = idx
                    .iter()
                    .zip(&offsets)
                    .map(|(&i, off)| self.bdevs[i].num_blocks.saturating_sub(*off))
                    .min()
                    .unwrap_or(0);
                let sum: u64 = idx.iter().map(|&i| self.bdevs[i].num_blocks).sum();
                let num_blocks = if p.raid_level == RaidLevel::Raid1 {
                    min
                } else {
                    sum
                };
                let mut slots = Vec::new();
                for &i in &idx {
                    self.bdevs[i].claimed_by = Some(format!("raid {}", p.name));
                    slots.push(Some(self.bdevs[i].name.clone()));
                }
                let sb = superblock.then(|| Superblock {
                    uuid: uuid.clone(),
                    name: p.name.clone(),
                    seq: 1,
                    slots: idx
                        .iter()
                        .map(|&i| (Some(self.bdevs[i].uuid.clone()), true))
                        .collect(),
                });
                self.raids.push(Raid {
                    name: p.name.clone(),
                    level: p.raid_level,
                    strip_size_kb: p.strip_size_kb.unwrap_or(0),
                    slots,
                    rebuild: None,
                    sb,
                    configuring: false,
                    offsets,
                });
                let ri = self.raids.len() - 1;
                self.write_sb(ri);
                self.bdevs.push(Bdev {
                    name: p.name,
                    aliases: vec![uuid.clone()],
                    uuid,
                    block_size: bs,
                    num_blocks,
                    claimed_by: None,
                    kind: BdevKind::Raid,
                });
                Ok(json!(true))
            }
            "bdev_raid_delete" => {
                let p: super::rpc::RaidDelete = decode(params)?;
                let Some(ri) = self.raids.iter().position(|r| r.name == p.name) else {
                    return e(ENODEV);
                };
                let raid = self.raids.remove(ri);
                for m in raid.slots.iter().flatten() {
                    if let Some(i) = self.find(m) {
                        self.bdevs[i].claimed_by = None;
                        if p.clear_sb == Some(true) && raid.sb.is_some() {
                            self.set_lvol_info(i, |l| l.sb = None);
                        }
                    }
                }
                if let Some(i) = self.find(&p.name) {
                    self.remove_bdev(i);
                }
                Ok(json!(true))
            }
            "bdev_raid_get_bdevs" => {
                let p: GetRaids = decode(params)?;
                let all: Vec<Value> = self.raids.iter().map(|r| self.raid_json(&r.name)).collect();
                Ok(Value::Array(
                    all.into_iter()
                        .filter(|r| match p.category {
                            RaidCategory::All => true,
                            RaidCategory::Online => r["state"] == "online",
                            RaidCategory::Offline => r["state"] == "offline",
                            RaidCategory::Configuring => r["state"] == "configuring",
                        })
                        .collect(),
                ))
            }
            "bdev_raid_add_base_bdev" => {
                let p: RaidAddBaseBdev = decode(params)?;
                let ri = self
                    .raids
                    .iter()
                    .position(|r| r.name == p.raid_bdev)
                    .ok_or((ENODEV.0, ENODEV.1.into()))?;
                let bi = self.find(&p.base_bdev).ok_or((ENODEV.0, ENODEV.1.into()))?;
                if self.bdevs[bi].claimed_by.is_some() || self.raids[ri].rebuilding().is_some() {
                    return fail(-1, "Operation not permitted");
                }
                let raid_uuid = self.raids[ri].sb.as_ref().map(|sb| sb.uuid.clone());
                if self
                    .visible_sb(bi)
                    .is_some_and(|sb| Some(&sb.uuid) != raid_uuid.as_ref())
                {
                    return fail(-17, "File exists");
                }
                // a member that left takes its old slot back (its UUID is in the superblock)
                let uuid = self.bdevs[bi].uuid.clone();
                let own = self.raids[ri].sb.as_ref().and_then(|sb| {
                    sb.slots
                        .iter()
                        .position(|s| s.0.as_deref() == Some(uuid.as_str()))
                });
                let free = |r: &Raid| r.slots.iter().position(Option::is_none);
                let Some(slot) = own
                    .filter(|k| self.raids[ri].slots[*k].is_none())
                    .or_else(|| free(&self.raids[ri]))
                else {
                    return fail(-22, "Invalid argument");
                };
                let online = self.raids[ri].slots.iter().any(Option::is_some);
                self.raids[ri].slots[slot] = Some(self.bdevs[bi].name.clone());
                if self.raids[ri].sb.is_some() {
                    self.raids[ri].offsets[slot] = self.sb_data_offset(bi);
                }
                self.bdevs[bi].claimed_by = Some(format!("raid {}", p.raid_bdev));
                if online {
                    // SPDK names the member in the superblock when the rebuild finishes
                    let now = Instant::now();
                    self.raids[ri].rebuild = Some((p.base_bdev.clone(), now, now + self.rebuild_time));
                    if let Some(sb) = self.raids[ri].sb.as_mut()
                        && let Some(e) = sb.slots.get_mut(slot)
                    {
                        *e = (Some(uuid), false);
                    }
                    self.settle_rebuilds();
                }
                Ok(json!(true))
            }
            "bdev_raid_remove_base_bdev" => {
                let p: ByName = decode(params)?;
                let bi = self.find(&p.name).ok_or((ENODEV.0, ENODEV.1.into()))?;
                let name = self.bdevs[bi].name.clone();
                let Some(ri) = self
                    .raids
                    .iter()
                    .position(|r| r.slots.iter().any(|s| s.as_deref() == Some(&name)))
                else {
                    return e(ENODEV);
                };
                for s in &mut self.raids[ri].slots {
                    if s.as_deref() == Some(&name) {
                        *s = None;
                    }
                }
                self.bdevs[bi].claimed_by = None;
                let uuid = self.bdevs[bi].uuid.clone();
                self.sb_member_left(ri, &uuid);
                Ok(json!(true))
            }
            "nvmf_create_transport" => {
                let p: CreateTransport = decode(params)?;
                let t = p.trtype.to_uppercase();
                if t != "TCP" && t != "RDMA" {
                    return fail(-32602, format!("Invalid transport type '{}'", p.trtype));
                }
                if self.transports.contains(&t) {
                    return fail(-32603, format!("Transport type '{}' already exists", p.trtype));
                }
                self.transports.push(t);
                Ok(json!(true))
            }
            "nvmf_get_transports" => {
                let p: GetTransports = decode(params)?;
                Ok(Value::Array(
                    self.transports
                        .iter()
                        .filter(|t| p.trtype.as_ref().is_none_or(|w| w.eq_ignore_ascii_case(t)))
                        .map(|t| {
                            json!({"trtype": t, "max_queue_depth": 128, "max_io_qpairs_per_ctrlr": 127,
                            "in_capsule_data_size": 4096, "max_io_size": 131072})
                        })
                        .collect(),
                ))
            }
            "nvmf_create_subsystem" => {
                let p: CreateSubsystem = decode(params)?;
                let valid = p.nqn.starts_with("nqn.") && p.nqn.len() <= 223 && p.nqn.contains(':');
                if !valid || self.subsystems.iter().any(|s| s.nqn == p.nqn) {
                    return fail(-32603, format!("Unable to create subsystem {}", p.nqn));
                }
                let n = self.subsystems.len() + 1;
                self.subsystems.push(Subsys {
                    nqn: p.nqn,
                    allow_any_host: p.allow_any_host.unwrap_or(false),
                    serial: p.serial_number.unwrap_or_else(|| format!("SPDK{n:014}")),
                    model: p.model_number.unwrap_or_else(|| "SPDK bdev Controller".into()),
                    ana_reporting: p.ana_reporting.unwrap_or(false),
                    ..Subsys::default()
                });
                Ok(json!(true))
            }
            "nvmf_delete_subsystem" => {
                let p: ByNqn = decode(params)?;
                let i = self.subsys(&p.nqn)?;
                self.subsystems.remove(i);
                Ok(json!(true))
            }
            "nvmf_get_subsystems" => {
                let p: GetSubsystems = decode(params)?;
                let mut out = vec![
                    json!({"nqn": "nqn.2014-08.org.nvmexpress.discovery", "subtype": "Discovery",
                    "listen_addresses": [], "allow_any_host": true, "hosts": []}),
                ];
                for s in &self.subsystems {
                    out.push(json!({
                        "nqn": s.nqn, "subtype": "NVMe", "listen_addresses": s.listeners,
                        "allow_any_host": s.allow_any_host,
                        "hosts": s.hosts.iter().map(|h| json!({"nqn": h})).collect::<Vec<_>>(),
                        "serial_number": s.serial, "model_number": s.model, "max_namespaces": 32,
                        "namespaces": s.namespaces.iter().map(|n| {
                            let mut ns = json!({"nsid": n.nsid, "bdev_name": n.bdev,
                                "name": n.bdev, "nguid": n.nguid, "uuid": n.uuid});
                            if s.ana_reporting {
                                ns["anagrpid"] = json!(n.nsid);
                            }
                            ns
                        }).collect::<Vec<_>>(),
                    }));
                }
                match p.nqn {
                    Some(nqn) => {
                        let one: Vec<Value> = out.into_iter().filter(|s| s["nqn"] == nqn.as_str()).collect();
                        if one.is_empty() {
                            e(INVALID_PARAMS)
                        } else {
                            Ok(Value::Array(one))
                        }
                    }
                    None => Ok(Value::Array(out)),
                }
            }
            "nvmf_subsystem_add_ns" => {
                let p: AddNamespace = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                let bi = self
                    .find(&p.namespace.bdev_name)
                    .ok_or((INVALID_PARAMS.0, INVALID_PARAMS.1.into()))?;
                let b = self.bdevs[bi].clone();
                let sub = &mut self.subsystems[si];
                let nsid = match p.namespace.nsid {
                    Some(n) if n == 0 || sub.namespaces.iter().any(|x| x.nsid == n) => {
                        return e(INVALID_PARAMS);
                    }
                    Some(n) => n,
                    None => (1..)
                        .find(|n| !sub.namespaces.iter().any(|x| x.nsid == *n))
                        .unwrap_or(1),
                };
                let derived_nguid = p.namespace.nguid.is_none();
                sub.namespaces.push(Ns {
                    nsid,
                    bdev: b.name.clone(),
                    nguid: p.namespace.nguid.unwrap_or_else(|| nguid_of(&b.uuid)),
                    uuid: p.namespace.uuid.unwrap_or_else(|| b.uuid.clone()),
                    derived_nguid,
                    num_blocks: b.num_blocks,
                    block_size: b.block_size,
                });
                sub.namespaces.sort_by_key(|n| n.nsid);
                Ok(json!(nsid))
            }
            "nvmf_subsystem_remove_ns" => {
                let p: RemoveNamespace = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                let before = self.subsystems[si].namespaces.len();
                self.subsystems[si].namespaces.retain(|n| n.nsid != p.nsid);
                if self.subsystems[si].namespaces.len() == before {
                    return e(INVALID_PARAMS);
                }
                Ok(json!(true))
            }
            "nvmf_subsystem_add_listener" | "nvmf_subsystem_remove_listener" => {
                let p: SubsystemListener = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                let same = |l: &super::rpc::ListenAddress| {
                    l.trtype.eq_ignore_ascii_case(&p.listen_address.trtype)
                        && l.traddr == p.listen_address.traddr
                        && l.trsvcid == p.listen_address.trsvcid
                };
                let exists = self.subsystems[si].listeners.iter().any(same);
                if method.ends_with("add_listener") {
                    if exists || !self.transports.contains(&p.listen_address.trtype.to_uppercase()) {
                        return e(INVALID_PARAMS);
                    }
                    self.subsystems[si].listeners.push(p.listen_address);
                } else {
                    if !exists {
                        return e(INVALID_PARAMS);
                    }
                    self.subsystems[si].listeners.retain(|l| !same(l));
                }
                Ok(json!(true))
            }
            "nvmf_subsystem_get_listeners" => {
                let p: ByNqn = decode(params)?;
                let Ok(si) = self.subsys(&p.nqn) else {
                    return fail(-32602, format!("Unable to find subsystem with NQN {}", p.nqn));
                };
                let sub = &self.subsystems[si];
                Ok(Value::Array(
                    sub.listeners
                        .iter()
                        .map(|l| {
                            let key = format!("{}:{}", l.traddr, l.trsvcid.as_deref().unwrap_or_default());
                            let state = match sub.ana.get(&key) {
                                Some(super::rpc::AnaState::Inaccessible) => "inaccessible",
                                Some(super::rpc::AnaState::NonOptimized) => "non_optimized",
                                _ => "optimized",
                            };
                            let mut v = json!({"address": l});
                            if sub.ana_reporting {
                                v["ana_states"] = json!([{"ana_group": 1, "ana_state": state}]);
                            }
                            v
                        })
                        .collect(),
                ))
            }
            "nvmf_subsystem_listener_set_ana_state" => {
                let p: ListenerAnaState = decode(params)?;
                let Ok(si) = self.subsys(&p.nqn) else {
                    return fail(-32602, format!("Unable to find subsystem with NQN {}", p.nqn));
                };
                let sub = &mut self.subsystems[si];
                let l = &p.listen_address;
                let listens = sub.listeners.iter().any(|x| {
                    x.trtype.eq_ignore_ascii_case(&l.trtype) && x.traddr == l.traddr && x.trsvcid == l.trsvcid
                });
                if !sub.ana_reporting || !listens {
                    return fail(-32603, "error setting ANA state: -22");
                }
                let key = format!("{}:{}", l.traddr, l.trsvcid.as_deref().unwrap_or_default());
                match p.ana_state {
                    super::rpc::AnaState::Optimized => sub.ana.remove(&key),
                    other => sub.ana.insert(key, other),
                };
                Ok(json!(true))
            }
            "nvmf_subsystem_allow_any_host" => {
                let p: super::rpc::AllowAnyHost = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                self.subsystems[si].allow_any_host = p.allow_any_host;
                Ok(json!(true))
            }
            "nvmf_subsystem_add_host" | "nvmf_subsystem_remove_host" => {
                let p: SubsystemHostParams = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                let hosts = &mut self.subsystems[si].hosts;
                let exists = hosts.contains(&p.host);
                if method.ends_with("add_host") {
                    if exists {
                        return e(INVALID_PARAMS);
                    }
                    hosts.push(p.host);
                } else {
                    if !exists {
                        return e(INVALID_PARAMS);
                    }
                    hosts.retain(|h| h != &p.host);
                }
                Ok(json!(true))
            }
            "nvmf_subsystem_get_controllers" => {
                let p: ByNqn = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                Ok(Value::Array(
                    self.subsystems[si]
                        .controllers
                        .iter()
                        .map(|(cntlid, hostnqn, hostid)| {
                            json!({"cntlid": cntlid, "cntrltype": "io",
                            "hostnqn": hostnqn, "hostid": hostid, "num_io_qpairs": 1})
                        })
                        .collect(),
                ))
            }
            "bdev_nvme_get_controllers" => {
                let p: GetControllers = decode(params)?;
                let list: Vec<Value> = self
                    .ctrlrs
                    .iter()
                    .filter(|c| p.name.as_ref().is_none_or(|n| n == &c.name))
                    .map(|c| json!({"name": c.name, "ctrlrs": [{"state": "enabled", "trid": c.trid}]}))
                    .collect();
                if p.name.is_some() && list.is_empty() {
                    return e(ENODEV);
                }
                Ok(Value::Array(list))
            }
            "iscsi_create_portal_group" => {
                let p: CreatePortalGroup = decode(params)?;
                if self.portal_groups.contains_key(&p.tag) {
                    return e(INVALID_PARAMS);
                }
                self.portal_groups.insert(
                    p.tag,
                    json!({"tag": p.tag, "portals": p.portals, "private": false}),
                );
                Ok(json!(true))
            }
            "iscsi_delete_portal_group" | "iscsi_delete_initiator_group" => {
                let p: ByTag = decode(params)?;
                let map = if method.contains("portal") {
                    &mut self.portal_groups
                } else {
                    &mut self.initiator_groups
                };
                map.remove(&p.tag)
                    .map(|_| json!(true))
                    .ok_or((INVALID_PARAMS.0, INVALID_PARAMS.1.into()))
            }
            "iscsi_get_portal_groups" => Ok(Value::Array(self.portal_groups.values().cloned().collect())),
            "iscsi_create_initiator_group" => {
                let p: CreateInitiatorGroup = decode(params)?;
                if self.initiator_groups.contains_key(&p.tag) {
                    return e(INVALID_PARAMS);
                }
                self.initiator_groups.insert(
                    p.tag,
                    json!({"tag": p.tag, "initiators": p.initiators, "netmasks": p.netmasks}),
                );
                Ok(json!(true))
            }
            "iscsi_get_initiator_groups" => {
                Ok(Value::Array(self.initiator_groups.values().cloned().collect()))
            }
            "iscsi_create_target_node" => {
                let p: CreateTargetNode = decode(params)?;
                let name = if p.name.starts_with("iqn.") {
                    p.name.clone()
                } else {
                    format!("iqn.2016-06.io.spdk:{}", p.name)
                };
                let ok = !self.target_nodes.contains_key(&name)
                    && p.luns.iter().all(|l| self.find(&l.bdev_name).is_some())
                    && p.pg_ig_maps.iter().all(|m| {
                        self.portal_groups.contains_key(&m.pg_tag)
                            && self.initiator_groups.contains_key(&m.ig_tag)
                    });
                if !ok {
                    return e(INVALID_PARAMS);
                }
                self.target_nodes.insert(name.clone(), json!({
                    "name": name, "alias_name": p.alias_name, "pg_ig_maps": p.pg_ig_maps, "luns": p.luns,
                    "queue_depth": p.queue_depth, "disable_chap": p.disable_chap.unwrap_or(false),
                    "require_chap": p.require_chap.unwrap_or(false), "mutual_chap": false, "chap_group": 0,
                    "header_digest": false, "data_digest": false,
                }));
                Ok(json!(true))
            }
            "iscsi_delete_target_node" => {
                let p: DeleteTargetNode = decode(params)?;
                self.target_nodes
                    .remove(&p.name)
                    .map(|_| json!(true))
                    .ok_or((INVALID_PARAMS.0, INVALID_PARAMS.1.into()))
            }
            "iscsi_get_target_nodes" => Ok(Value::Array(self.target_nodes.values().cloned().collect())),
            _ => fail(-32601, "Method not found"),
        }
    }

    fn subsys(&self, nqn: &str) -> Result<usize, (i64, String)> {
        self.subsystems
            .iter()
            .position(|s| s.nqn == nqn)
            .ok_or((INVALID_PARAMS.0, INVALID_PARAMS.1.into()))
    }

    fn check_ctrlr_name(&self, p: &AttachController) -> Result<(), (i64, String)> {
        if let Some(c) = self.ctrlrs.iter().find(|c| c.name == p.name) {
            if c.trid == trid_of(p) {
                return fail(
                    -114,
                    format!(
                        "A controller named {} already exists with the specified network path",
                        p.name
                    ),
                );
            }
            return fail(
                -17,
                format!(
                    "A controller named {} already exists and multipath is disabled",
                    p.name
                ),
            );
        }
        Ok(())
    }

    fn detach(&mut self, name: &str) -> Result<Ctrlr, (i64, String)> {
        let Some(ci) = self.ctrlrs.iter().position(|c| c.name == name) else {
            return e(ENODEV);
        };
        let c = self.ctrlrs.remove(ci);
        for b in &c.bdevs {
            // A raid loses the member (degraded), as on a hot remove.
            for r in &mut self.raids {
                for s in &mut r.slots {
                    if s.as_deref() == Some(b) {
                        *s = None;
                    }
                }
            }
            if let Some(i) = self.find(b) {
                self.remove_bdev(i);
            }
        }
        Ok(c)
    }

    fn attach(&mut self, p: AttachController, remote: Option<(Vec<Ns>, u32)>) -> RpcResult {
        self.check_ctrlr_name(&p)?;
        let trid = trid_of(&p);
        let cntlid = remote.as_ref().map(|r| r.1);
        let remote = remote.map(|r| r.0);
        let namespaces: Vec<(u32, String, u64, u32, bool)> = if p.trtype.eq_ignore_ascii_case("pcie") {
            let Some(d) = self.pci.get(&p.traddr) else {
                return e(ENODEV);
            };
            vec![(1, new_uuid(), d.num_blocks, d.block_size, false)]
        } else {
            let Some(nss) = remote else {
                return fail(-5, "Input/output error");
            };
            nss.into_iter()
                .map(|n| {
                    // The bdev takes its UUID from the NGUID.
                    let u = uuid::Uuid::parse_str(&n.nguid)
                        .map(|u| u.hyphenated().to_string())
                        .unwrap_or(n.uuid);
                    (n.nsid, u, n.num_blocks, n.block_size, n.derived_nguid)
                })
                .collect()
        };
        let mut created = Vec::new();
        for (nsid, uuid, num_blocks, block_size, _) in namespaces {
            let name = format!("{}n{}", p.name, nsid);
            // The alias clash recorded on a real target: a namespace whose
            // UUID is already a bdev's here registers no bdev.
            if self.name_taken(&uuid) || self.name_taken(&name) {
                tracing::debug!(%name, %uuid, "SpdkDouble: namespace bdev alias clash, no bdev");
                continue;
            }
            self.bdevs.push(Bdev {
                name: name.clone(),
                aliases: vec![uuid.clone()],
                uuid,
                block_size,
                num_blocks,
                claimed_by: None,
                kind: BdevKind::Nvme {
                    ctrlr: p.name.clone(),
                },
            });
            created.push(name);
        }
        self.ctrlrs.push(Ctrlr {
            name: p.name.clone(),
            trid,
            bdevs: created.clone(),
            cntlid,
        });
        Ok(json!(created))
    }
}

fn trid_of(p: &AttachController) -> Value {
    json!({
        "trtype": if p.trtype.eq_ignore_ascii_case("pcie") { "PCIe" } else { "TCP" },
        "adrfam": p.adrfam.as_ref().map(|a| if a.eq_ignore_ascii_case("ipv6") { "IPv6" } else { "IPv4" }),
        "traddr": p.traddr, "trsvcid": p.trsvcid, "subnqn": p.subnqn,
    })
}

fn unreachable_lvol() -> LvolInfo {
    // Only called after `State::lvol` checked the kind.
    LvolInfo {
        lvs_uuid: String::new(),
        name: String::new(),
        thin: true,
        snapshot: false,
        parent: None,
        allocated: 0,
        sb: None,
    }
}

/// The methods the double implements (its `rpc_get_methods`).
pub const METHODS: &[&str] = &[
    "spdk_get_version",
    "rpc_get_methods",
    "framework_wait_init",
    "bdev_wait_for_examine",
    "bdev_examine",
    "bdev_get_bdevs",
    "bdev_get_iostat",
    "bdev_malloc_create",
    "bdev_malloc_delete",
    "bdev_aio_create",
    "bdev_aio_delete",
    "bdev_lvol_create_lvstore",
    "bdev_lvol_get_lvstores",
    "bdev_lvol_delete_lvstore",
    "bdev_lvol_create",
    "bdev_lvol_snapshot",
    "bdev_lvol_clone",
    "bdev_lvol_set_parent",
    "bdev_lvol_resize",
    "bdev_lvol_delete",
    "bdev_lvol_get_lvols",
    "bdev_null_create",
    "bdev_null_delete",
    "notify_get_notifications",
    "bdev_raid_create",
    "bdev_raid_delete",
    "bdev_raid_get_bdevs",
    "bdev_raid_add_base_bdev",
    "bdev_raid_remove_base_bdev",
    "nvmf_create_transport",
    "nvmf_get_transports",
    "nvmf_create_subsystem",
    "nvmf_delete_subsystem",
    "nvmf_get_subsystems",
    "nvmf_subsystem_add_ns",
    "nvmf_subsystem_remove_ns",
    "nvmf_subsystem_add_listener",
    "nvmf_subsystem_remove_listener",
    "nvmf_subsystem_listener_set_ana_state",
    "nvmf_subsystem_get_listeners",
    "nvmf_subsystem_add_host",
    "nvmf_subsystem_allow_any_host",
    "nvmf_subsystem_remove_host",
    "nvmf_subsystem_get_controllers",
    "bdev_nvme_attach_controller",
    "bdev_nvme_detach_controller",
    "bdev_nvme_get_controllers",
    "iscsi_create_portal_group",
    "iscsi_delete_portal_group",
    "iscsi_get_portal_groups",
    "iscsi_create_initiator_group",
    "iscsi_delete_initiator_group",
    "iscsi_get_initiator_groups",
    "iscsi_create_target_node",
    "iscsi_delete_target_node",
    "iscsi_get_target_nodes",
];
