//! `SpdkDouble`: a TEST DOUBLE of spdk_tgt's JSON-RPC server, in process, on
//! a Unix socket. It is not SPDK: it moves no data. It stands in where a real
//! spdk_tgt cannot run (controller tests of the V2 engine, rollback tests)
//! and keeps the semantics recorded from spdk_tgt v26.05 in
//! `tests/data/spdk/transcript-v26.05.jsonl`: names and aliases, claims, error
//! codes and messages, framing. It answers only methods a real v26.05 target
//! registers (`tests/data/spdk/rpc-methods-v26.05.json`; a test holds it to
//! that list), each family in its own file: `bdev`, `lvol`, `raid`, `nvmf`,
//! `iscsi`.
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
//! permitted"); an export claims its namespace's bdev `exclusive_write` (a
//! raid over it: -1 as above; a second export of it, or an export of a raid
//! member: -32602 "Invalid parameters"; the lvol or malloc bdev deleted all
//! the same, its namespace hot-removed; the claim ends with the namespace);
//! duplicate names -17; missing objects -19 (-2 for a missing
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
//! copies nothing, and fails only when armed to
//! ([`SpdkDouble::fail_next_rebuild`]); a shallow copy of a snapshot with allocated clusters
//! takes that time too (and is "in progress" at its first check); one whose
//! destination bdev goes before it ends reports state "error" with
//! "Input/output error" (not recorded from a real target). NVMe/TCP attach finds subsystems
//! of every `SpdkDouble` in the process (a fabric shared by the doubles) by
//! listener address and NQN; PCIe controllers are those added with
//! [`SpdkDouble::add_pcie_nvme`]. `bdev_nvme_send_cmd` takes NVMe Reads
//! (opcode 0x02) on an I/O queue, refused and completed as recorded from
//! v26.05 (-32602 "Invalid argument" for a controller not attached or a
//! `cmdbuf` not of 64 bytes; a completion with status LBA out of range,
//! invalid namespace, data length not the command's, or aborted above the
//! 128 KiB max transfer); a PCIe device reads as zeros under what
//! [`SpdkDouble::write_pcie_nvme`] and an lvstore's superblock (`SPDKBLOB`,
//! zeroed when the lvstore is deleted, as SPDK does) put there, an NVMe/TCP
//! one as zeros. Other commands complete with Invalid Command Opcode (not
//! recorded). An lvstore on a PCIe device does not come back after
//! [`SpdkDouble::restart`] (its superblock stays).
//!
//! `notify_get_notifications` reports bdev_register/bdev_unregister derived
//! when a call sees the bdev list change (a bdev made and gone between two
//! calls of any method is not reported).
//!
//! [`SpdkDouble::restart`] emulates a target restart: connections drop,
//! in-memory objects vanish, lvstores on AIO files come back when the same
//! file is attached again (examine), as on a real target. Raids made with a
//! superblock keep it on their lvol members (snapshots and clones show their
//! parent's): a member that leaves is recorded on the others, a rebuilt one
//! when its rebuild ends, and examine assembles the raid from the newest
//! superblock present (`configuring` while an active member is missing), as
//! SPDK's raid module does; a raid over a bdev that shows another raid's
//! superblock is refused (-17).

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

use crate::spdk::rpc::{
    AddNamespace, AioCreate, AttachController, ByName, ByNqn, ByTag, CheckShallowCopy, CreateInitiatorGroup,
    CreatePortalGroup, CreateSubsystem, CreateTargetNode, CreateTransport, DeleteTargetNode, GetBdevs,
    GetConfig, GetControllers, GetIostat, GetLvols, GetNotifications, GetRaids, GetSubsystems, GetTransports,
    KeyringFileKey, ListenerAnaState, LvolClone, LvolCreate, LvolResize, LvolSnapshot, LvstoreCreate,
    LvstoreSelector, MallocCreate, NullCreate, NvmeSendCmd, RaidAddBaseBdev, RaidCategory, RaidCreate,
    RaidLevel, RemoveNamespace, StartShallowCopy, SubsystemHostKeys, SubsystemHostParams, SubsystemListener,
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

mod bdev;
mod iscsi;
mod lvol;
mod nvmf;
mod raid;

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
    /// Its own first cluster holds zeros where a superblock was
    /// (`bdev_raid_delete` with `clear_sb`): it hides a parent's superblock.
    sb_cleared: bool,
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

/// How [`Bdev::claimed_by`] names the NVMe-oF target's claim on a
/// namespace's bdev (followed by the subsystem's NQN).
const NVMF_CLAIM: &str = "nvmf ";

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
    /// DH-HMAC-CHAP keys of listed hosts: host NQN -> (key, controller key), by keyring name.
    host_keys: BTreeMap<String, (Option<String>, Option<String>)>,
    /// TLS PSKs of listed hosts: host NQN -> keyring name (not reported, as in v26.05).
    host_psks: BTreeMap<String, String>,
    listeners: Vec<crate::spdk::rpc::ListenAddress>,
    /// Created with `ana_reporting`.
    ana_reporting: bool,
    /// `max_namespaces` (SPDK's default 32 when not given): also the highest ANA group.
    max_namespaces: u32,
    /// Listeners set to a state other than optimized, by `traddr:trsvcid`.
    ana: BTreeMap<String, crate::spdk::rpc::AnaState>,
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
    /// Its ANA group (its nsid until `nvmf_subsystem_set_ns_ana_group`).
    anagrpid: u32,
    /// No I/O can be in flight on it: a `nvmf_subsystem_set_ns_ana_group`
    /// (which pauses and drains the namespace) came after the last ANA
    /// state change. The ANA state RPC drains nothing, so it clears this.
    drained: bool,
}

#[derive(Debug, Clone)]
struct Ctrlr {
    name: String,
    trid: Value,
    bdevs: Vec<String>,
    /// The remote subsystem's controller id, for the detach.
    cntlid: Option<u32>,
    /// The keyring keys it holds a reference on (PSK, DH-HMAC-CHAP keys).
    keys: Vec<String>,
    /// The host NQN it connected as.
    host: String,
}

#[derive(Debug, Clone)]
struct PciNvme {
    num_blocks: u64,
    block_size: u32,
    /// What was put on it (`write_pcie_nvme`, an lvstore's superblock), in
    /// order: (offset, bytes); the rest reads as zeros.
    writes: Vec<(u64, Vec<u8>)>,
}

impl PciNvme {
    /// `len` bytes from offset `at`, the writes laid over zeros.
    fn read(&self, at: u64, len: u64) -> Vec<u8> {
        let mut out = vec![0u8; usize::try_from(len).unwrap_or(0)];
        for (w_at, bytes) in &self.writes {
            let (from, to) = ((*w_at).max(at), (w_at + bytes.len() as u64).min(at + len));
            if from < to {
                let (o, i) = ((from - at) as usize, (from - w_at) as usize);
                let n = (to - from) as usize;
                out[o..o + n].copy_from_slice(&bytes[i..i + n]);
            }
        }
        out
    }
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
    /// The file keyring: key name -> key file.
    keys: BTreeMap<String, PathBuf>,
    /// Keys removed while still referenced: kept (as `removed`) until their
    /// last user lets go, as `lib/keyring/keyring.c` does.
    removed_keys: BTreeMap<String, PathBuf>,
    /// Listening `traddr:trsvcid` made with `secure_channel` (TLS).
    tls_ports: std::collections::BTreeSet<String>,
    portal_groups: BTreeMap<u32, Value>,
    initiator_groups: BTreeMap<u32, Value>,
    target_nodes: BTreeMap<String, Value>,
    pci: BTreeMap<String, PciNvme>,
    on_disk: HashMap<PathBuf, OnDisk>,
    malloc_counter: u32,
    faults: Vec<Armed>,
    calls: HashMap<String, u64>,
    /// Every call in the order it was served: method and the `nqn` it named.
    order: Vec<(String, Option<String>)>,
    /// This target's host id (its host NQN is derived from it).
    host_id: String,
    /// How long a raid1 rebuild takes (zero: done at once).
    rebuild_time: Duration,
    /// The next rebuild that ends fails, its target listed in the raid
    /// (configured, no process) this long before it is taken out
    /// ([`SpdkDouble::fail_next_rebuild`]).
    rebuild_failure: Option<Duration>,
    /// Targets of failed rebuilds still listed in their raid: (raid, target,
    /// when it is taken out).
    failed_targets: Vec<(String, String, Instant)>,
    /// Notify events (type, bdev), id = index, and the bdevs last seen.
    notifications: Vec<(&'static str, String)>,
    seen: std::collections::BTreeSet<String>,
    /// Snapshots of an lvol that was exported (itself, or as a raid member)
    /// through a listener that accepted I/O, or not drained since its
    /// listeners changed state, when the snapshot was taken.
    snapshots_while_writable: Vec<String>,
    /// Shallow copies by operation id (SPDK numbers them from 1 for the
    /// process's life): clusters copied, clusters to copy, the error, and
    /// how many checks saw it (one check sees it in progress, the next
    /// complete, as a copy that takes a moment).
    shallow_copies: Vec<ShallowCopy>,
    /// Clusters a shallow copy wrote through an NVMe/TCP namespace bdev,
    /// applied to the remote double's lvol once this double's lock is let go.
    fabric_writes: Vec<FabricWrite>,
    shallow_copy_count: u32,
    /// Each shallow copy started, in order: (source lvol, destination bdev)
    /// as the request named them.
    copies_started: Vec<(String, String)>,
    /// `bdev_set_qos_limit` limits in force, by bdev name: (rw_ios_per_sec,
    /// rw_mbytes_per_sec, r_mbytes_per_sec, w_mbytes_per_sec); 0 = none.
    qos: BTreeMap<String, [u64; 4]>,
    /// The NVMe keep-alive `bdev_nvme_set_options` set (`None`: v26.05's
    /// default, [`NVME_KEEP_ALIVE_DEFAULT_MS`]).
    nvme_keep_alive_ms: Option<u32>,
}

/// v26.05's NVMe keep-alive when nobody set one (`framework_get_config bdev`
/// of a fresh spdk_tgt).
const NVME_KEEP_ALIVE_DEFAULT_MS: u32 = 10_000;

#[derive(Debug, Clone)]
struct ShallowCopy {
    id: u32,
    total: u64,
    error: Option<&'static str>,
    checks: u32,
    /// When it ends: the rebuild time after its start (a copy of no
    /// clusters ends at once).
    done_at: std::time::Instant,
    /// The destination bdev: a copy whose destination goes (a lost
    /// controller) ends in error.
    dst: String,
}

/// Clusters written through NVMe/TCP namespace `nsid` of subsystem `trid`
/// (a shallow copy into another double's replica).
#[derive(Debug, Clone)]
struct FabricWrite {
    trid: Value,
    nsid: u32,
    clusters: u64,
    sb: Option<(Option<Superblock>, bool)>,
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

/// Through `client`: a 64 MiB malloc bdev `M0` (4 KiB blocks) and the lvstore
/// `lvs` on it (1 MiB clusters), the fixture many tests start from; returns
/// the lvstore's UUID. (On the double or a real target alike.)
pub async fn malloc_lvstore(
    client: &crate::spdk::SpdkClient,
    lvs: &str,
) -> Result<String, crate::spdk::ClientError> {
    client
        .bdev_malloc_create(&crate::spdk::rpc::MallocCreate {
            name: Some("M0".into()),
            num_blocks: 16384,
            block_size: 4096,
            uuid: None,
        })
        .await?;
    client
        .bdev_lvol_create_lvstore(&crate::spdk::rpc::LvstoreCreate {
            bdev_name: "M0".into(),
            lvs_name: lvs.into(),
            cluster_sz: Some(1 << 20),
            clear_method: None,
            num_md_pages_per_cluster_ratio: None,
        })
        .await
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

    /// How long a raid1 rebuild, or a shallow copy of a snapshot with
    /// clusters, takes from now on (zero: done at once).
    pub fn set_rebuild_time(&self, d: Duration) {
        lock(&self.state).rebuild_time = d;
    }

    /// The next raid1 rebuild to end fails as it does on v26.05, where
    /// `raid_bdev_process_finish_quiesced` clears the raid's process and
    /// only after the unquiesce `raid_bdev_process_finish_unquiesced` takes
    /// the failed target out (`_raid_bdev_remove_base_bdev`): for
    /// `listed_for` the target is listed configured with no process, then it
    /// leaves its slot and the superblock marks it not active.
    pub fn fail_next_rebuild(&self, listed_for: Duration) {
        lock(&self.state).rebuild_failure = Some(listed_for);
    }

    /// A host writes `clusters` clusters that were never written through
    /// bdev `name` (an lvol, or a raid: each member in service gets them),
    /// as allocation counts: the double keeps no data. False when there is
    /// no such bdev (a host's write would fail): nothing was written.
    #[must_use = "a write to a missing bdev lands nowhere"]
    pub fn write(&self, name: &str, clusters: u64) -> bool {
        let mut s = lock(&self.state);
        let Some(i) = s.find(name) else { return false };
        let targets: Vec<usize> = match &s.bdevs[i].kind {
            BdevKind::Raid => {
                let raid = s.bdevs[i].name.clone();
                let members: Vec<String> = s
                    .raids
                    .iter()
                    .find(|r| r.name == raid)
                    .map(|r| r.slots.iter().flatten().cloned().collect())
                    .unwrap_or_default();
                members.iter().filter_map(|m| s.find(m)).collect()
            }
            BdevKind::Lvol(_) => vec![i],
            _ => vec![],
        };
        for t in targets {
            let total =
                s.bdevs[t].num_blocks * u64::from(s.bdevs[t].block_size) / s.cluster_size_of(t).max(1);
            s.set_lvol_info(t, |l| l.allocated = (l.allocated + clusters).min(total));
        }
        true
    }

    /// The NVMe/TCP controller `name` of this target loses its remote
    /// subsystem for good (the replica's node is gone: SPDK's bdev_nvme
    /// deletes the controller when its reconnect fails, ctrlr_loss_timeout_sec
    /// 0 by default): its bdevs go, a raid loses them (degraded) and a
    /// rebuild into one of them fails. Returns false without such a controller.
    pub fn lose_controller(&self, name: &str) -> bool {
        let c = {
            let mut s = lock(&self.state);
            let Some(ci) = s.ctrlrs.iter().position(|c| c.name == name) else {
                return false;
            };
            let c = s.ctrlrs.remove(ci);
            for b in &c.bdevs {
                if let Some(i) = s.find(b) {
                    s.remove_bdev(i);
                }
            }
            s.sync_notifications();
            c
        };
        if let Some(cntlid) = c.cntlid {
            fabric_disconnect(&c.trid, cntlid);
        }
        true
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

    /// Disarms the faults still armed for `method` (a fault that stands for
    /// a condition that has passed).
    pub fn clear_faults(&self, method: &str) {
        lock(&self.state).faults.retain(|a| a.method != method);
    }

    /// Drops the connection on the `nth` next call of `method`, before running it.
    pub fn drop_connection_on(&self, method: &str, nth: u32) {
        self.inject(method, nth, Fault::DropConnection { after_execute: false });
    }

    /// Snapshots (`lvs/name`) taken of an lvol exported (directly or as a
    /// raid member) by a subsystem that could have I/O in flight at that
    /// moment (a listener accepting I/O, or the namespace not drained since
    /// its listeners were made inaccessible): each one may be a different
    /// instant from its siblings'.
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

    /// The NVMe keep-alive a `bdev_nvme_set_options` set (`None`: none did).
    pub fn nvme_keep_alive_set(&self) -> Option<u32> {
        lock(&self.state).nvme_keep_alive_ms
    }

    /// The shallow copies started so far, in order: (source lvol,
    /// destination bdev) as each request named them.
    pub fn copies_started(&self) -> Vec<(String, String)> {
        lock(&self.state).copies_started.clone()
    }

    /// How many times `method` was called.
    pub fn calls(&self, method: &str) -> u64 {
        lock(&self.state).calls.get(method).copied().unwrap_or(0)
    }

    /// Every call served so far, in the order served: its method and the
    /// subsystem NQN its parameters named (`nqn`), if any.
    pub fn call_order(&self) -> Vec<(String, Option<String>)> {
        lock(&self.state).order.clone()
    }

    /// Adds a local NVMe device that `bdev_nvme_attach_controller` with
    /// trtype PCIe can attach at `bdf`.
    pub fn add_pcie_nvme(&self, bdf: &str, num_blocks: u64, block_size: u32) {
        lock(&self.state).pci.insert(
            bdf.to_owned(),
            PciNvme {
                num_blocks,
                block_size,
                writes: Vec::new(),
            },
        );
    }

    /// Puts `bytes` at `offset` of the local NVMe device at `bdf` (as a file
    /// system, or a damaged lvstore, would be): `bdev_nvme_send_cmd` Reads
    /// return them. Panics when no device was added at `bdf`.
    pub fn write_pcie_nvme(&self, bdf: &str, offset: u64, bytes: &[u8]) {
        lock(&self.state)
            .pci
            .get_mut(bdf)
            .unwrap_or_else(|| panic!("no PCIe NVMe at {bdf} in the double"))
            .writes
            .push((offset, bytes.to_vec()));
    }

    /// `len` bytes at `offset` of the local NVMe device at `bdf`.
    pub fn read_pcie_nvme(&self, bdf: &str, offset: u64, len: u64) -> Vec<u8> {
        lock(&self.state)
            .pci
            .get(bdf)
            .map(|d| d.read(offset, len))
            .unwrap_or_default()
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
        let nqn = params
            .as_ref()
            .and_then(|p| p.get("nqn"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        s.order.push((method.clone(), nqn));
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
/// one the attach named, else the double's default. A host listed with a
/// DH-HMAC-CHAP key must present the same secret (`secret`, the content of
/// the attaching target's key file); a host listed without one connects
/// without authentication whatever it presents.
fn fabric_connect(
    traddr: &str,
    trsvcid: &str,
    nqn: &str,
    host_id: &str,
    hostnqn: Option<&str>,
    secret: Option<&str>,
    psk: Option<&str>,
) -> Option<(Vec<Ns>, u32)> {
    let hostnqn = hostnqn.map_or_else(
        || format!("nqn.2014-08.org.nvmexpress:uuid:{host_id}"),
        str::to_owned,
    );
    for d in fabric() {
        let mut s = lock(&d);
        let s = &mut *s;
        for sub in &mut s.subsystems {
            if sub.nqn == nqn && listens(sub, traddr, trsvcid) {
                // TLS: a TLS port takes only a handshake with the host's PSK;
                // a plain port refuses a TLS handshake
                let tls_port = s.tls_ports.contains(&format!("{traddr}:{trsvcid}"));
                match (tls_port, psk) {
                    (false, None) => {}
                    (true, Some(given)) => {
                        let want = sub
                            .host_psks
                            .get(&hostnqn)
                            .and_then(|k| s.keys.get(k))
                            .and_then(|p| std::fs::read_to_string(p).ok());
                        let valid = |x: &str| {
                            <crate::util::nvme_auth::TlsPsk as crate::util::nvme_auth::Secret>::parse(x).ok()
                        };
                        match (want.as_deref().and_then(valid), valid(given)) {
                            (Some(w), Some(g)) if w == g => {}
                            _ => return None,
                        }
                    }
                    _ => return None,
                }
                if !sub.allow_any_host && !sub.hosts.contains(&hostnqn) {
                    return None;
                }
                if let Some(key) = sub.host_keys.get(&hostnqn).and_then(|k| k.0.as_ref()) {
                    let want = s.keys.get(key).and_then(|p| std::fs::read_to_string(p).ok());
                    let valid = |x: &str| crate::util::nvme_auth::DhchapSecret::parse(x).ok();
                    match (want.as_deref().and_then(valid), secret.and_then(valid)) {
                        (Some(w), Some(g)) if w == g => {}
                        _ => return None,
                    }
                }
                let cntlid = sub.controllers.iter().map(|c| c.0).max().unwrap_or(0) + 1;
                sub.controllers.push((cntlid, hostnqn, host_id.to_owned()));
                return Some((sub.namespaces.clone(), cntlid));
            }
        }
    }
    None
}

/// A write through the fabric lands in the lvol behind the namespace.
fn fabric_write(w: &FabricWrite) {
    let (Some(traddr), Some(trsvcid), Some(nqn)) = (
        w.trid["traddr"].as_str(),
        w.trid["trsvcid"].as_str(),
        w.trid["subnqn"].as_str(),
    ) else {
        return;
    };
    for d in fabric() {
        let mut s = lock(&d);
        let Some(bdev) = s
            .subsystems
            .iter()
            .find(|sub| sub.nqn == nqn && listens(sub, traddr, trsvcid))
            .and_then(|sub| sub.namespaces.iter().find(|n| n.nsid == w.nsid))
            .map(|n| n.bdev.clone())
        else {
            continue;
        };
        let Some(i) = s.find(&bdev) else { return };
        if !matches!(s.bdevs[i].kind, BdevKind::Lvol(_)) {
            return;
        }
        let total = s.bdevs[i].num_blocks * u64::from(s.bdevs[i].block_size) / s.cluster_size_of(i).max(1);
        s.set_lvol_info(i, |l| {
            l.allocated = (l.allocated + w.clusters).min(total);
            if let Some((sb, cleared)) = &w.sb {
                l.sb = sb.clone();
                l.sb_cleared = *cleared;
            }
        });
        return;
    }
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
        let s = &mut *s;
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
        let (host_id, secret, psk) = {
            let s = lock(state);
            s.check_ctrlr_name(&p)?;
            let psk = match &p.psk {
                Some(k) => match s.keys.get(k) {
                    Some(path) => Some(std::fs::read_to_string(path).unwrap_or_default()),
                    None => return fail(-126, "Required key not available"),
                },
                None => None,
            };
            // bdev_nvme.c: a key name the keyring lacks is -ENOKEY before any connect
            let secret = match &p.dhchap_key {
                Some(k) => match s.keys.get(k) {
                    Some(path) => Some(std::fs::read_to_string(path).unwrap_or_default()),
                    None => return fail(-126, "Required key not available"),
                },
                None => None,
            };
            (s.host_id.clone(), secret, psk)
        };
        let remote = if p.trtype.eq_ignore_ascii_case("tcp") {
            let port = p.trsvcid.as_deref().unwrap_or("4420");
            fabric_connect(
                &p.traddr,
                port,
                p.subnqn.as_deref().unwrap_or(""),
                &host_id,
                p.hostnqn.as_deref(),
                secret.as_deref(),
                psk.as_deref(),
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
    let (r, writes) = {
        let mut s = lock(state);
        let r = s.call(method, params);
        s.sync_notifications();
        (r, std::mem::take(&mut s.fabric_writes))
    };
    for w in writes {
        fabric_write(&w);
    }
    r
}

fn new_uuid() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

fn nguid_of(uuid: &str) -> String {
    uuid.replace('-', "").to_uppercase()
}

impl State {
    /// The local PCIe NVMe device under bdev `i`, if it is one's namespace.
    fn pci_device_of(&mut self, i: usize) -> Option<&mut PciNvme> {
        let BdevKind::Nvme { ctrlr } = &self.bdevs[i].kind else {
            return None;
        };
        let c = self.ctrlrs.iter().find(|c| &c.name == ctrlr)?;
        if c.trid["trtype"].as_str() != Some("PCIe") {
            return None;
        }
        let traddr = c.trid["traddr"].as_str()?.to_owned();
        self.pci.get_mut(&traddr)
    }

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
        let q = self.qos.get(&b.name).copied().unwrap_or_default();
        v["assigned_rate_limits"] = json!({"rw_ios_per_sec": q[0], "rw_mbytes_per_sec": q[1],
            "r_mbytes_per_sec": q[2], "w_mbytes_per_sec": q[3]});
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
    /// subsystem that may have I/O in flight in it or take new I/O: a
    /// listener serves I/O (ANA optimized), or the namespace was not drained
    /// since the last ANA state change.
    fn writable_export(&self, i: usize) -> bool {
        let b = &self.bdevs[i];
        let device = match &b.claimed_by {
            Some(raid) if self.raids.iter().any(|r| &r.name == raid) => raid.clone(),
            _ => b.name.clone(),
        };
        self.subsystems.iter().any(|s| {
            s.namespaces.iter().any(|n| {
                n.bdev == device
                    && (!n.drained
                        || s.listeners.iter().any(|l| {
                            let key = format!("{}:{}", l.traddr, l.trsvcid.as_deref().unwrap_or_default());
                            !s.ana.contains_key(&key)
                        }))
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

    /// Ends the NVMe-oF target's claim on bdev `name` (its namespace
    /// removed).
    fn release_nvmf_claim(&mut self, name: &str) {
        if let Some(b) = self.bdevs.iter_mut().find(|b| b.name == name)
            && b.claimed_by.as_deref().is_some_and(|c| c.starts_with(NVMF_CLAIM))
        {
            b.claimed_by = None;
        }
    }

    /// Whether bdev `i` may be deleted: not claimed, or claimed only by an
    /// export (v26.05 deletes an exported lvol or malloc bdev and
    /// hot-removes its namespace; a raid member or an lvstore's base is
    /// refused here, see the simplifications above).
    fn deletable(&self, i: usize) -> bool {
        self.bdevs[i]
            .claimed_by
            .as_deref()
            .is_none_or(|c| c.starts_with(NVMF_CLAIM))
    }

    /// Removes a bdev that goes away: namespaces exporting it go too (as
    /// SPDK hot-removes them).
    fn remove_bdev(&mut self, i: usize) -> Bdev {
        let b = self.bdevs.remove(i);
        self.qos.remove(&b.name);
        for s in &mut self.subsystems {
            s.namespaces.retain(|n| n.bdev != b.name);
        }
        // a raid loses the member (degraded), as on a hot remove; one with a
        // superblock records it on the members left before I/O goes on
        let mut changed = Vec::new();
        for (ri, r) in self.raids.iter_mut().enumerate() {
            // a rebuild into it fails (SPDK ends the raid's process)
            if r.rebuild
                .as_ref()
                .is_some_and(|x| x.0 == b.name || b.aliases.contains(&x.0))
            {
                r.rebuild = None;
            }
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
            "framework_get_config" => {
                let p: GetConfig = decode(params)?;
                // only the NVMe options of the bdev subsystem (v26.05 lists every bdev's call too)
                Ok(match p.name.as_str() {
                    "bdev" => json!([{"method": "bdev_nvme_set_options", "params": {
                        "keep_alive_timeout_ms": self.nvme_keep_alive_ms.unwrap_or(NVME_KEEP_ALIVE_DEFAULT_MS),
                        "transport_ack_timeout": 0, "ctrlr_loss_timeout_sec": 0,
                        "reconnect_delay_sec": 0, "fast_io_fail_timeout_sec": 0}}]),
                    _ => json!([]),
                })
            }
            m if m.starts_with("bdev_lvol_") => self.call_lvol(m, params),
            m if m.starts_with("bdev_raid_") => self.call_raid(m, params),
            m if m.starts_with("nvmf_") || m.starts_with("bdev_nvme_") => self.call_nvmf(m, params),
            m if m.starts_with("iscsi_") => self.call_iscsi(m, params),
            m if m.starts_with("keyring_") => self.call_keyring(m, params),
            m if m.starts_with("bdev_") => self.call_bdev(m, params),
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
        // bdev_nvme.c: one controller per path and host NQN, whatever its name
        let (trid, host) = (trid_of(p), self.host_nqn_of(p));
        if self.ctrlrs.iter().any(|c| c.trid == trid && c.host == host) {
            return fail(EEXIST.0, EEXIST.1);
        }
        Ok(())
    }

    /// The host NQN attach `p` connects as: the one it names, else the
    /// target's default.
    fn host_nqn_of(&self, p: &AttachController) -> String {
        p.hostnqn
            .clone()
            .unwrap_or_else(|| format!("nqn.2014-08.org.nvmexpress:uuid:{}", self.host_id))
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
        let keys = [&p.psk, &p.dhchap_key, &p.dhchap_ctrlr_key]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        let host = self.host_nqn_of(&p);
        self.ctrlrs.push(Ctrlr {
            name: p.name.clone(),
            trid,
            bdevs: created.clone(),
            cntlid,
            keys,
            host,
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
        sb_cleared: false,
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
    "bdev_set_qos_limit",
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
    "nvmf_subsystem_set_ns_ana_group",
    "nvmf_subsystem_get_listeners",
    "nvmf_subsystem_add_host",
    "nvmf_subsystem_allow_any_host",
    "nvmf_subsystem_remove_host",
    "nvmf_subsystem_get_controllers",
    "nvmf_subsystem_set_keys",
    "keyring_file_add_key",
    "keyring_file_remove_key",
    "keyring_get_keys",
    "bdev_nvme_attach_controller",
    "bdev_nvme_detach_controller",
    "bdev_nvme_disable_controller",
    "bdev_nvme_get_controllers",
    "bdev_nvme_send_cmd",
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
