//! V2 volume operations over [`SpdkClient`]: replicas, engine, export,
//! snapshot, clone, expand, revert, delete and orphan listing, by the names of
//! the V2 contract (`/work/helpers/V2-CONTRACT.md`).
//!
//! ```text
//!   Inventory::load (6 list calls, concurrent) ──> what exists
//!          │
//!   VolumeOps::ensure(VolumePlan)                 talon-<disk>/<vol>-r<k>  (thin lvols, concurrent)
//!          │  missing objects only,                      │ 1 replica: the lvol is the engine
//!          │  each one recorded in `Made`                v ≥2: raid1 talon-raid-<vol>
//!          │  and undone in reverse on error      nvmf subsystem Nqn::for_volume, ns 1
//!          v                                      (nguid/uuid = volume_uuid), listener, hosts
//!   VolumeInfo (size, replicas, export)
//! ```
//!
//! Single replica: the lvol itself is exported, no raid1. A raid1 must have two
//! members in SPDK, and the one-member workaround (raid1 with a `bdev_null`
//! placeholder removed afterwards) measured the same IOPS as the bare lvol
//! (0.95-1.19x, shared/spdk/README.md; `benches/spdk_volume.rs` compares them
//! again) while adding two objects to create, track and rebuild after every
//! restart. A second replica added later replaces the namespace's bdev.
//!
//! Every operation is idempotent: it compares with the [`Inventory`] and
//! creates only what is missing; a failed multi-step operation deletes what it
//! created. Objects whose names are not talon's (see [`Owned`]) are never
//! touched.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use futures::future::{join_all, try_join_all};

use super::client::{ClientError, SpdkClient};
use super::error::ErrorKind;
use super::placement::{self, Blocked, DiskAway, Slot};
use super::rpc::{
    AddNamespace, AllowAnyHost, AnaState, AttachController, Bdev, ByName, ByNqn, CreateSubsystem,
    CreateTransport, GetBdevs, GetControllers, GetLvols, GetRaids, GetSubsystems, GetTransports,
    ListenAddress, ListenerAnaState, Lvol, LvolClone, LvolCreate, LvolResize, LvolSnapshot, Lvstore,
    LvstoreSelector, NullCreate, RaidAddBaseBdev, RaidBdev, RaidCategory, RaidCreate, RaidLevel,
    RemoveNamespace, Subsystem, SubsystemHostParams, SubsystemListener,
};
use crate::names::{NQN_PREFIX, Nqn, ObjectName, volume_uuid};

/// Prefix of talon's lvstores (`talon-<disk>`).
pub const LVS_PREFIX: &str = "talon-";
/// Prefix of talon's raid bdevs.
pub const RAID_PREFIX: &str = "talon-raid-";
/// Prefix of talon's placeholder null bdevs.
pub const NULL_PREFIX: &str = "talon-null-";
/// Prefix of the NVMe controllers that attach remote replicas
/// (`talon-remote-<vol>-r<k>`, bdev `talon-remote-<vol>-r<k>n1`).
pub const REMOTE_PREFIX: &str = "talon-remote-";
/// The namespace id of every export.
pub const NSID: u32 = 1;
const MIB: u64 = 1 << 20;

/// Errors of the volume operations.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// An SPDK call failed.
    #[error("volume {volume}: {step} failed")]
    Rpc {
        /// The volume (or snapshot) id.
        volume: String,
        /// What was being done, naming the SPDK object.
        step: String,
        /// The client error.
        #[source]
        source: ClientError,
    },
    /// The NVMe/TCP listener's port is held by another process (SPDK answers
    /// only "Invalid parameters").
    #[error("volume {volume}: cannot listen on {listen}: the port is in use by {holder}")]
    PortInUse {
        /// The volume.
        volume: String,
        /// The listen address and port.
        listen: String,
        /// Who holds it ("pid N (comm)").
        holder: String,
        /// SPDK's answer.
        #[source]
        source: Box<ClientError>,
    },
    /// Replicas cannot be placed on distinct ready disks (see [`placement`]).
    #[error("volume {volume}: {reason}")]
    NoPlacement {
        /// The volume.
        volume: String,
        /// Why, naming each candidate disk.
        reason: String,
        /// A failed disk is among the candidates (a wait fails at once).
        disk_failed: bool,
    },
    /// A replica's snapshot is missing.
    #[error("volume {volume}: snapshot lvol {lvol} does not exist")]
    SnapshotMissing {
        /// The volume.
        volume: String,
        /// The snapshot lvol name.
        lvol: String,
    },
    /// SPDK refuses to delete a snapshot that has clones.
    #[error(
        "snapshot {snapshot}: SPDK refuses to delete it while volumes cloned from it exist; delete those first"
    )]
    SnapshotHasClones {
        /// `<vol>@<snap>`.
        snapshot: String,
        /// The refusal.
        #[source]
        source: ClientError,
    },
    /// The raid1 did not follow its grown members.
    #[error("volume {volume}: raid {raid} is {actual} bytes after its members grew to {wanted}")]
    RaidDidNotGrow {
        /// The volume.
        volume: String,
        /// The raid bdev.
        raid: String,
        /// Its size.
        actual: u64,
        /// The members' size.
        wanted: u64,
    },
    /// A volume does not shrink.
    #[error("volume {volume}: cannot shrink from {current} to {wanted} bytes")]
    Shrink {
        /// The volume.
        volume: String,
        /// Served size.
        current: u64,
        /// Asked size.
        wanted: u64,
    },
    /// A name built from the volume is not valid.
    #[error("volume {volume}: invalid derived name")]
    BadName {
        /// The volume.
        volume: String,
        /// Why.
        #[source]
        source: crate::names::InvalidName,
    },
    /// An NVMe attach connected but registered no bdev.
    #[error("volume {volume}: attaching {nqn} registered no bdev (namespace without explicit NGUID?)")]
    AttachedNoBdev {
        /// The volume.
        volume: String,
        /// The subsystem.
        nqn: String,
    },
    /// Every replica present missed writes; the up-to-date ones are away.
    #[error(
        "volume {volume}: no up-to-date replica is present (waiting for {waiting:?}; {stale:?} missed writes and are never served alone)"
    )]
    NoCurrentReplica {
        /// The volume.
        volume: String,
        /// Up-to-date replicas that are away.
        waiting: Vec<String>,
        /// Replicas present but behind.
        stale: Vec<String>,
    },
    /// A name built from the volume is not acceptable to SPDK.
    #[error("volume {volume}: lvol name {lvol:?} is longer than SPDK's 63 characters")]
    NameTooLong {
        /// The volume.
        volume: String,
        /// The name.
        lvol: String,
    },
}

/// A failed `nvmf_subsystem_add_listener`: named [`VolumeError::PortInUse`]
/// when another process listens on the port (SPDK says only "Invalid
/// parameters"; its bind error is in its log).
/// `target` is spdk_tgt's pid (its own listeners on the port are no conflict).
fn listener_error(
    volume: &str,
    address: &str,
    port: u16,
    target: Option<i32>,
    source: ClientError,
) -> VolumeError {
    let except = target.and_then(|p| u32::try_from(p).ok());
    let holder = address.parse::<IpAddr>().ok().and_then(|ip| {
        crate::host::net::port_holder(&crate::host::HostRoot::real(), (ip, port).into(), except)
    });
    match holder {
        Some(holder) => VolumeError::PortInUse {
            volume: volume.to_owned(),
            listen: format!("{address}:{port}"),
            holder,
            source: Box::new(source),
        },
        None => rpc(volume, format!("listening on {address}:{port}"))(source),
    }
}

fn rpc(volume: &str, step: impl Into<String>) -> impl FnOnce(ClientError) -> VolumeError {
    let (volume, step) = (volume.to_owned(), step.into());
    move |source| VolumeError::Rpc { volume, step, source }
}

/// Name helpers of the V2 contract.
pub mod naming {
    use super::*;

    /// `talon-<disk>`.
    pub fn lvstore(disk: &str) -> String {
        format!("{LVS_PREFIX}{disk}")
    }
    /// `<vol>-r<k>`.
    pub fn replica(vol: &str, k: usize) -> String {
        format!("{vol}-r{k}")
    }
    /// `<vol>-r<k>.s.<snap>`.
    pub fn snapshot_lvol(vol: &str, k: usize, snap: &str) -> String {
        format!("{vol}-r{k}.s.{snap}")
    }
    /// `<vol>.rev.<generation>`: a thin empty lvol recording that revert
    /// generation N was applied (SPDK keeps it with the data, so a revert runs
    /// once even across talon restarts).
    pub fn revert_marker(vol: &str, generation: u64) -> String {
        format!("{vol}.rev.{generation}")
    }
    /// `talon-raid-<vol>`.
    pub fn raid(vol: &str) -> String {
        format!("{RAID_PREFIX}{vol}")
    }
    /// The subsystem serial number: 20 characters from the volume UUID.
    pub fn serial(vol: &ObjectName) -> String {
        let u = volume_uuid(vol).simple().to_string().to_uppercase();
        format!("TLN{}", &u[..17])
    }
}

/// What an owned lvol name means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LvolRole {
    /// Replica k of a volume.
    Replica {
        /// The volume.
        volume: String,
        /// k.
        k: usize,
    },
    /// Snapshot of replica k.
    Snapshot {
        /// The volume.
        volume: String,
        /// k.
        k: usize,
        /// The snapshot name.
        snap: String,
    },
    /// A revert marker.
    RevertMarker {
        /// The volume.
        volume: String,
        /// The generation.
        generation: u64,
    },
}

/// Parses a talon lvol name (inside a `talon-*` lvstore).
pub fn parse_lvol(name: &str) -> Option<LvolRole> {
    if let Some((vol, gen_)) = name.split_once(".rev.") {
        return Some(LvolRole::RevertMarker {
            volume: vol.to_owned(),
            generation: gen_.parse().ok()?,
        });
    }
    let (head, snap) = match name.split_once(".s.") {
        Some((h, s)) => (h, Some(s)),
        None => (name, None),
    };
    let (vol, k) = head.rsplit_once("-r")?;
    let k: usize = k.parse().ok()?;
    if vol.is_empty() {
        return None;
    }
    Some(match snap {
        Some(s) => LvolRole::Snapshot {
            volume: vol.to_owned(),
            k,
            snap: s.to_owned(),
        },
        None => LvolRole::Replica {
            volume: vol.to_owned(),
            k,
        },
    })
}

fn no_current(plan: &VolumePlan, present: &[ReplicaInfo]) -> VolumeError {
    let vol = plan.name.as_str();
    let here: BTreeSet<usize> = present.iter().map(|r| r.k).collect();
    let waiting = match &plan.in_sync {
        Some(s) => s
            .iter()
            .filter(|k| !here.contains(k))
            .map(|k| match plan.placed.get(k) {
                Some(d) => format!("{} on disk {d}", naming::replica(vol, *k)),
                None => naming::replica(vol, *k),
            })
            .collect(),
        None => Vec::new(),
    };
    VolumeError::NoCurrentReplica {
        volume: vol.to_owned(),
        waiting,
        stale: present.iter().map(|r| r.name.clone()).collect(),
    }
}

fn no_placement(volume: &str, b: &Blocked) -> VolumeError {
    VolumeError::NoPlacement {
        volume: volume.to_owned(),
        reason: b.reason.clone(),
        disk_failed: b.disk_failed,
    }
}

/// Disks with a talon lvstore (free bytes), less those the plan says are away
/// (being removed).
fn ready_disks(inv: &Inventory, plan: &VolumePlan) -> BTreeMap<String, u64> {
    inv.disks()
        .into_iter()
        .filter(|(d, _)| !plan.disk_away.contains_key(d))
        .collect()
}

fn check_len(volume: &str, lvol: &str) -> Result<(), VolumeError> {
    if lvol.len() > 63 {
        return Err(VolumeError::NameTooLong {
            volume: volume.to_owned(),
            lvol: lvol.to_owned(),
        });
    }
    Ok(())
}

/// Everything talon looks at in one target, loaded with concurrent calls.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// Every lvstore.
    pub lvstores: Vec<Lvstore>,
    /// Every lvol, by alias `lvs/name`.
    pub lvols: BTreeMap<String, Lvol>,
    /// Every bdev by name.
    pub bdevs: HashMap<String, Bdev>,
    /// Every raid bdev.
    pub raids: Vec<RaidBdev>,
    /// Every nvmf subsystem.
    pub subsystems: Vec<Subsystem>,
    /// Whether the TCP transport exists.
    pub tcp_transport: bool,
    /// NVMe bdev controllers by name (remote replicas are `talon-remote-*`).
    pub controllers: Vec<String>,
}

impl Inventory {
    /// Lists the target.
    pub async fn load(client: &SpdkClient) -> Result<Inventory, ClientError> {
        let (p1, p2, p3) = (
            LvstoreSelector::default(),
            GetLvols::default(),
            GetBdevs::default(),
        );
        let p4 = GetRaids {
            category: RaidCategory::All,
        };
        let (p5, p6) = (GetSubsystems::default(), GetTransports::default());
        let p7 = GetControllers::default();
        let (lvs, lvols, bdevs, raids, subs, tr, ctrlrs) = tokio::try_join!(
            client.bdev_lvol_get_lvstores(&p1),
            client.bdev_lvol_get_lvols(&p2),
            client.bdev_get_bdevs(&p3),
            client.bdev_raid_get_bdevs(&p4),
            client.nvmf_get_subsystems(&p5),
            client.nvmf_get_transports(&p6),
            client.bdev_nvme_get_controllers(&p7),
        )?;
        Ok(Inventory {
            lvstores: lvs,
            lvols: lvols.into_iter().map(|l| (l.alias.clone(), l)).collect(),
            bdevs: bdevs.into_iter().map(|b| (b.name.clone(), b)).collect(),
            raids,
            subsystems: subs,
            tcp_transport: tr.iter().any(|t| t.trtype.eq_ignore_ascii_case("tcp")),
            controllers: ctrlrs.into_iter().map(|c| c.name).collect(),
        })
    }

    /// The lvstore `talon-<disk>`.
    pub fn lvstore(&self, disk: &str) -> Option<&Lvstore> {
        let n = naming::lvstore(disk);
        self.lvstores.iter().find(|l| l.name == n)
    }

    /// The lvol `name` in any talon lvstore.
    pub fn find_lvol(&self, name: &str) -> Option<&Lvol> {
        self.lvols
            .values()
            .find(|l| l.name == name && l.lvs.name.starts_with(LVS_PREFIX))
    }

    /// The size of a bdev.
    pub fn bdev_size(&self, name: &str) -> Option<u64> {
        self.bdevs.get(name).map(Bdev::size_bytes)
    }

    /// The subsystem of `nqn`.
    pub fn subsystem(&self, nqn: &str) -> Option<&Subsystem> {
        self.subsystems.iter().find(|s| s.nqn == nqn)
    }

    /// The raid `name`.
    pub fn raid(&self, name: &str) -> Option<&RaidBdev> {
        self.raids.iter().find(|r| r.name == name)
    }

    /// Disk names with a talon lvstore, with free bytes.
    pub fn disks(&self) -> Vec<(String, u64)> {
        self.lvstores
            .iter()
            .filter_map(|l| {
                let d = l.name.strip_prefix(LVS_PREFIX)?;
                Some((d.to_owned(), l.free_clusters * l.cluster_size))
            })
            .collect()
    }

    /// Every talon object of a volume that is not wanted (`keep_volume`
    /// false) or a snapshot lvol not wanted (`keep_snapshot(vol, snap)` false).
    /// Foreign objects are never listed.
    pub fn orphans(
        &self,
        keep_volume: impl Fn(&str) -> bool,
        keep_snapshot: impl Fn(&str, &str) -> bool,
        keep_remote: impl Fn(&str, usize) -> bool,
    ) -> Vec<Owned> {
        let mut out = Vec::new();
        let vol_prefix = format!("{NQN_PREFIX}:vol:");
        let rep_prefix = format!("{NQN_PREFIX}:replica:");
        for s in &self.subsystems {
            let vol = s
                .nqn
                .strip_prefix(&vol_prefix)
                .or_else(|| s.nqn.strip_prefix(&rep_prefix).and_then(|r| r.split(':').next()));
            if let Some(v) = vol
                && !keep_volume(v)
            {
                out.push(Owned::Subsystem(s.nqn.clone()));
            }
        }
        for r in &self.raids {
            if let Some(v) = r.name.strip_prefix(RAID_PREFIX)
                && !keep_volume(v)
            {
                out.push(Owned::Raid(r.name.clone()));
            }
        }
        for c in &self.controllers {
            if let Some(LvolRole::Replica { volume, k }) = c.strip_prefix(REMOTE_PREFIX).and_then(parse_lvol)
                && !keep_remote(&volume, k)
            {
                out.push(Owned::Remote(c.clone()));
            }
        }
        for b in self.bdevs.values() {
            if let Some(v) = b.name.strip_prefix(NULL_PREFIX)
                && !keep_volume(v)
            {
                out.push(Owned::Null(b.name.clone()));
            }
        }
        // heads and markers before snapshots: a snapshot goes only once its clones are gone
        let mut snaps = Vec::new();
        for l in self.lvols.values() {
            if !l.lvs.name.starts_with(LVS_PREFIX) {
                continue;
            }
            match parse_lvol(&l.name) {
                Some(LvolRole::Replica { volume, .. }) | Some(LvolRole::RevertMarker { volume, .. })
                    if !keep_volume(&volume) =>
                {
                    out.push(Owned::Lvol(l.alias.clone()))
                }
                Some(LvolRole::Snapshot { volume, snap, .. }) if !keep_snapshot(&volume, &snap) => {
                    snaps.push(Owned::Lvol(l.alias.clone()))
                }
                _ => {}
            }
        }
        out.extend(snaps);
        out
    }
}

/// An SPDK object talon owns (by name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    /// An nvmf subsystem.
    Subsystem(String),
    /// A raid bdev.
    Raid(String),
    /// A null placeholder bdev.
    Null(String),
    /// An lvol by alias.
    Lvol(String),
    /// An NVMe controller attaching a remote replica.
    Remote(String),
}

/// Where and how a volume is exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    /// Listener address.
    pub address: IpAddr,
    /// Listener port.
    pub port: u16,
    /// The host NQNs allowed to connect; nobody else can (empty: nobody).
    pub hosts: Vec<String>,
}

/// What a volume should be.
#[derive(Debug, Clone)]
pub struct VolumePlan {
    /// The volume.
    pub name: ObjectName,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Replica count.
    pub replicas: usize,
    /// Disks the replicas may use (empty: any).
    pub disks: Vec<String>,
    /// Disks replicas were placed on before (replica k -> disk), so that a
    /// replica whose lvstore has not come back yet is waited for, not made again elsewhere.
    pub placed: BTreeMap<usize, String>,
    /// Configured disks that are not ready (or are being removed), and why:
    /// never placed on, and named when a replica cannot be placed.
    pub disk_away: BTreeMap<String, DiskAway>,
    /// Clone source `(volume, snapshot)`.
    pub from_snapshot: Option<(ObjectName, ObjectName)>,
    /// The replicas of the clone source whose snapshots were taken at one
    /// point in time (recorded in the source volume's ledger). Only those
    /// are cloned; the others are made empty and rebuilt from them. `None`:
    /// nothing recorded, the lowest replica with the snapshot is the only source.
    pub snapshot_set: Option<BTreeSet<usize>>,
    /// The export.
    pub export: ExportSpec,
    /// The replicas last known to hold the newest data (the persisted
    /// [`crate::resources::engine::ReplicaLedger`]); `None` when nothing was
    /// recorded yet: then replicas that exist are trusted, and new ones only
    /// when the whole volume is new.
    pub in_sync: Option<BTreeSet<usize>>,
    /// Replicas kept by other talon nodes: replica `replicas + i` is served
    /// at `remote[i]` (address, NVMe/TCP port).
    pub remote: Vec<(IpAddr, u16)>,
}

/// What [`VolumeOps::snapshot`] took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshotted {
    /// The snapshot lvol aliases of every replica that has one.
    pub lvols: Vec<String>,
    /// The replicas whose snapshots this call took at one point in time
    /// (empty when they all existed already): what the ledger records.
    pub point_in_time: BTreeSet<usize>,
}

/// The replicas of `vol`'s snapshot `snap` that a revert or clone may use
/// as they are: the recorded point-in-time set (`recorded`, from the ledger)
/// among the snapshot lvols present, else the lowest replica that has the
/// snapshot. Never two replicas whose snapshots may differ; the others are
/// rebuilt from these. Empty when no replica has the snapshot.
pub fn point_in_time_set(
    inv: &Inventory,
    vol: &str,
    snap: &str,
    recorded: Option<&BTreeSet<usize>>,
) -> BTreeSet<usize> {
    let present: BTreeSet<usize> = inv
        .lvols
        .values()
        .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
        .filter_map(|l| match parse_lvol(&l.name) {
            Some(LvolRole::Snapshot { volume, k, snap: s }) if volume == vol && s == snap => Some(k),
            _ => None,
        })
        .collect();
    let together: BTreeSet<usize> = recorded
        .map(|r| r.intersection(&present).copied().collect())
        .unwrap_or_default();
    if together.is_empty() {
        present.into_iter().take(1).collect()
    } else {
        together
    }
}

impl VolumePlan {
    /// A plan for a volume with no history: no placement, no clone source,
    /// no ledger, no remote replicas, any disk.
    pub fn new(name: ObjectName, size_bytes: u64, replicas: usize, export: ExportSpec) -> Self {
        Self {
            name,
            size_bytes,
            replicas,
            disks: Vec::new(),
            placed: BTreeMap::new(),
            disk_away: BTreeMap::new(),
            from_snapshot: None,
            snapshot_set: None,
            export,
            in_sync: None,
            remote: Vec::new(),
        }
    }
}

/// One replica as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaInfo {
    /// k.
    pub k: usize,
    /// `<vol>-r<k>`.
    pub name: String,
    /// The disk.
    pub disk: String,
    /// The lvol bdev (UUID).
    pub bdev: String,
    /// `talon-<disk>/<vol>-r<k>`.
    pub alias: String,
    /// Size.
    pub size_bytes: u64,
    /// Allocated bytes.
    pub allocated_bytes: u64,
}

/// A volume as served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// The exported bdev.
    pub device: String,
    /// Namespace size.
    pub size_bytes: u64,
    /// The NQN.
    pub nqn: String,
    /// Replicas present.
    pub replicas: Vec<ReplicaInfo>,
    /// Replicas asked for.
    pub wanted: usize,
    /// Replicas waited for (disk not back yet).
    pub waiting: Vec<(usize, String)>,
    /// Replicas that hold the newest data (the engine serves from these).
    pub in_sync: BTreeSet<usize>,
    /// The replica being rebuilt and how far it is (percent).
    pub rebuilding: Option<(usize, u32)>,
    /// Replicas present but behind, waiting for their turn to be rebuilt.
    pub stale: Vec<usize>,
    /// Replicas no disk can take now, and why.
    pub unplaced: Option<Blocked>,
}

/// How the engine's replicas stand after [`VolumeOps::ensure`].
#[derive(Debug, Default)]
struct SyncState {
    in_sync: BTreeSet<usize>,
    rebuilding: Option<(usize, u32)>,
    stale: Vec<usize>,
}

#[derive(Debug)]
enum Made {
    Lvol(String),
    Null(String),
    Raid(String),
    Subsystem(String),
    Namespace(String),
    Listener(String, ListenAddress),
}

/// The operations.
#[derive(Debug, Clone)]
pub struct VolumeOps {
    client: SpdkClient,
    /// Held while the TCP transport is looked up and made: SPDK checks for
    /// an existing transport when `nvmf_create_transport` arrives but adds
    /// the new one only when its creation completes, so concurrent calls
    /// each make one (each with its own buffers and poll groups).
    transport: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// The host NQN this node's target connects to remote replicas with (the
    /// serving node allows only it).
    host_nqn: Option<String>,
}

impl VolumeOps {
    /// Operations over `client`.
    pub fn new(client: SpdkClient) -> Self {
        Self {
            client,
            transport: Default::default(),
            host_nqn: None,
        }
    }

    /// Makes sure the target has its one NVMe/TCP transport: an existing one
    /// is adopted (after a restart of talon), a missing one is made, once,
    /// under one lock shared by every clone of these operations. Returns
    /// whether it made one.
    pub async fn ensure_transport(&self) -> Result<bool, ClientError> {
        let _one_at_a_time = self.transport.lock().await;
        let have = self.client.nvmf_get_transports(&GetTransports::default()).await?;
        if have.iter().any(|t| t.trtype.eq_ignore_ascii_case("tcp")) {
            return Ok(false);
        }
        match self.client.nvmf_create_transport(&CreateTransport::tcp()).await {
            Ok(_) => Ok(true),
            Err(e) if e.is(ErrorKind::AlreadyExists) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Attaches remote replicas as host `nqn` (talon's host NQN on this node).
    pub fn with_host_nqn(mut self, nqn: Option<String>) -> Self {
        self.host_nqn = nqn;
        self
    }

    /// The client.
    pub fn client(&self) -> &SpdkClient {
        &self.client
    }

    async fn undo(&self, made: Vec<Made>) {
        for m in made.into_iter().rev() {
            let r = match &m {
                Made::Lvol(a) => self.client.bdev_lvol_delete(&ByName::new(a)).await.map(|_| ()),
                Made::Null(n) => ignore_missing(self.client.bdev_null_delete(&ByName::new(n))).await,
                Made::Raid(n) => self.client.bdev_raid_delete(&ByName::new(n)).await.map(|_| ()),
                Made::Subsystem(n) => self
                    .client
                    .nvmf_delete_subsystem(&ByNqn { nqn: n.clone() })
                    .await
                    .map(|_| ()),
                Made::Namespace(n) => self
                    .client
                    .nvmf_subsystem_remove_ns(&RemoveNamespace {
                        nqn: n.clone(),
                        nsid: NSID,
                    })
                    .await
                    .map(|_| ()),
                Made::Listener(n, a) => self
                    .client
                    .nvmf_subsystem_remove_listener(&SubsystemListener {
                        nqn: n.clone(),
                        listen_address: a.clone(),
                    })
                    .await
                    .map(|_| ()),
            };
            if let Err(e) = r {
                tracing::warn!(object = ?m, error = %e, "rollback step failed; orphan cleanup retries it");
            }
        }
    }

    /// Makes the volume exist and be exported, creating only what is missing;
    /// rolls back what this call created when a step fails.
    pub async fn ensure(&self, inv: &Inventory, plan: &VolumePlan) -> Result<VolumeInfo, VolumeError> {
        let mut made = Vec::new();
        match self.ensure_inner(inv, plan, &mut made).await {
            Ok(i) => Ok(i),
            Err(e) => {
                self.undo(made).await;
                Err(e)
            }
        }
    }

    async fn ensure_inner(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        made: &mut Vec<Made>,
    ) -> Result<VolumeInfo, VolumeError> {
        let vol = plan.name.as_str();
        let size_mib = plan.size_bytes.div_ceil(MIB).max(1);
        // place replicas: one pure decision (spdk::placement)
        let mut existing = BTreeMap::new();
        for k in 0..plan.replicas {
            let name = naming::replica(vol, k);
            check_len(vol, &name)?;
            if let Some(l) = inv.find_lvol(&name) {
                existing.insert(k, l.lvs.name.trim_start_matches(LVS_PREFIX).to_owned());
            }
        }
        let source = plan
            .from_snapshot
            .as_ref()
            .map(|(sv, ss)| (sv.as_str(), ss.as_str()));
        // the replicas of a clone that are cloned; the others start empty and are rebuilt
        let clone_set: BTreeSet<usize> = match source {
            Some((sv, ss)) => point_in_time_set(inv, sv, ss, plan.snapshot_set.as_ref()),
            None => BTreeSet::new(),
        };
        // a clone lives in the lvstore of its snapshot
        let clone_of: Option<BTreeMap<usize, String>> = source.map(|(sv, ss)| {
            (0..plan.replicas)
                .filter_map(|k| {
                    let l = inv.find_lvol(&naming::snapshot_lvol(sv, k, ss))?;
                    Some((k, l.lvs.name.trim_start_matches(LVS_PREFIX).to_owned()))
                })
                .collect()
        });
        let ready = ready_disks(inv, plan);
        let wanted: Vec<usize> = (0..plan.replicas).collect();
        let decided = placement::place(&placement::Request {
            wanted: &wanted,
            listed: &plan.disks,
            ready: &ready,
            away: &plan.disk_away,
            existing: &existing,
            placed: &plan.placed,
            clone_of: clone_of.as_ref(),
        });
        if let Some((sv, ss)) = source
            && !decided.slots.contains_key(&0)
        {
            return Err(VolumeError::SnapshotMissing {
                volume: vol.to_owned(),
                lvol: naming::snapshot_lvol(sv, 0, ss),
            });
        }
        let mut placement: Vec<(usize, String, bool)> = Vec::new(); // (k, disk, exists)
        let mut waiting = Vec::new();
        for (k, slot) in &decided.slots {
            match slot {
                Slot::Exists(d) => placement.push((*k, d.clone(), true)),
                Slot::Create(d) => placement.push((*k, d.clone(), false)),
                Slot::WaitFor(d) => waiting.push((*k, d.clone())),
                Slot::Unplaced => {}
            }
        }
        if let Some(b) = &decided.blocked
            && placement.is_empty()
        {
            return Err(no_placement(vol, b));
        }
        let unplaced = decided.blocked;

        // create missing replicas, and the transport and subsystem, concurrently
        let nqn = Nqn::for_volume(&plan.name);
        let creates = placement.iter().filter(|p| !p.2).map(|(k, disk, _)| {
            let name = naming::replica(vol, *k);
            let lvs = naming::lvstore(disk);
            let clone_from = source.filter(|_| clone_set.contains(k));
            async move {
                let r = match clone_from {
                    Some((sv, ss)) => {
                        let snap = format!("{lvs}/{}", naming::snapshot_lvol(sv, *k, ss));
                        self.client
                            .bdev_lvol_clone(&LvolClone {
                                snapshot_name: snap,
                                clone_name: name.clone(),
                            })
                            .await
                    }
                    None => {
                        self.client
                            .bdev_lvol_create(&LvolCreate::thin(&lvs, &name, size_mib))
                            .await
                    }
                };
                r.map(|uuid| (format!("{lvs}/{name}"), uuid))
                    .map_err(rpc(vol, format!("creating replica lvol {lvs}/{name}")))
            }
        });
        let subsystem = async {
            if !inv.tcp_transport {
                self.ensure_transport()
                    .await
                    .map_err(rpc(vol, "creating the TCP transport"))?;
            }
            if inv.subsystem(nqn.as_str()).is_some() {
                return Ok(false);
            }
            self.client
                .nvmf_create_subsystem(&CreateSubsystem {
                    nqn: nqn.as_str().to_owned(),
                    allow_any_host: Some(false),
                    serial_number: Some(naming::serial(&plan.name)),
                    model_number: Some("talon".into()),
                    max_namespaces: Some(1),
                    // so that a snapshot can freeze it (VolumeOps::snapshot)
                    ana_reporting: Some(true),
                })
                .await
                .map(|_| true)
                .map_err(rpc(vol, format!("creating subsystem {nqn}")))
        };
        let (lvols, sub) = futures::join!(join_all(creates), subsystem);
        let mut first_err = None;
        let mut new_bdevs = HashMap::new();
        for r in lvols {
            match r {
                Ok((alias, uuid)) => {
                    made.push(Made::Lvol(alias.clone()));
                    new_bdevs.insert(alias, uuid);
                }
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        match sub {
            Ok(true) => made.push(Made::Subsystem(nqn.as_str().to_owned())),
            Ok(false) => {}
            Err(e) => first_err = first_err.or(Some(e)),
        }
        if let Some(e) = first_err {
            return Err(e);
        }

        // replica facts (sizes of new lvols come from one lookup each)
        let mut replicas = Vec::new();
        for (k, disk, _) in &placement {
            let name = naming::replica(vol, *k);
            let alias = format!("{}/{name}", naming::lvstore(disk));
            let (bdev, allocated) = match inv.lvols.get(&alias) {
                Some(l) => {
                    let cs = inv.lvstore(disk).map(|s| s.cluster_size).unwrap_or(MIB);
                    (l.uuid.clone(), l.num_allocated_clusters * cs)
                }
                None => (new_bdevs.get(&alias).cloned().unwrap_or_default(), 0),
            };
            let cluster = inv.lvstore(disk).map(|s| s.cluster_size.max(1)).unwrap_or(MIB);
            let size = match inv.bdev_size(&bdev) {
                Some(s) => s,
                // just made: a clone has its snapshot's size, a new lvol whole clusters
                None => match source.filter(|_| clone_set.contains(k)) {
                    Some((sv, ss)) => inv
                        .find_lvol(&naming::snapshot_lvol(sv, *k, ss))
                        .and_then(|l| inv.bdev_size(&l.uuid))
                        .unwrap_or(0),
                    None => (size_mib * MIB).div_ceil(cluster) * cluster,
                },
            };
            replicas.push(ReplicaInfo {
                k: *k,
                name,
                disk: disk.clone(),
                bdev,
                alias,
                size_bytes: size,
                allocated_bytes: allocated,
            });
        }

        // remote replicas: attached over NVMe/TCP from the nodes that serve them;
        // one that does not answer is waited for like a disk that is away
        for (i, (addr, port)) in plan.remote.iter().enumerate() {
            let k = plan.replicas + i;
            let name = naming::replica(vol, k);
            let ctrl = format!("{REMOTE_PREFIX}{name}");
            let nqn =
                Nqn::for_replica(&plan.name, &format!("r{k}")).map_err(|source| VolumeError::BadName {
                    volume: vol.to_owned(),
                    source,
                })?;
            let bdev = format!("{ctrl}n1");
            let size = match inv.bdevs.get(&bdev) {
                Some(b) => Some(b.size_bytes()),
                None => {
                    if inv.controllers.contains(&ctrl) {
                        // a controller whose namespace is gone: attach it afresh
                        let _ = ignore_missing(self.client.bdev_nvme_detach_controller(&ByName::new(&ctrl)))
                            .await;
                    }
                    match self.attach_replica(vol, &ctrl, *addr, *port, nqn.as_str()).await {
                        Ok(b) => self
                            .client
                            .bdev(&b)
                            .await
                            .map_err(rpc(vol, format!("looking up remote replica {b}")))?
                            .map(|b| b.size_bytes()),
                        Err(e) => {
                            tracing::warn!(volume = vol, replica = %name, error = %crate::util::error_chain(&e), "remote replica not reachable");
                            None
                        }
                    }
                }
            };
            match size {
                Some(size_bytes) => replicas.push(ReplicaInfo {
                    k,
                    name,
                    disk: format!("{addr}:{port}"),
                    bdev,
                    alias: nqn.as_str().to_owned(),
                    size_bytes,
                    allocated_bytes: 0,
                }),
                None => waiting.push((k, format!("{addr}:{port}"))),
            }
        }

        // grow local replicas that are smaller than asked (expand), then the engine
        // follows; a remote replica grows on its own node
        let wanted = size_mib * MIB;
        let grew = replicas.iter().any(|r| r.size_bytes < wanted);
        let grow: Vec<_> = replicas
            .iter()
            .filter(|r| r.size_bytes < wanted && r.k < plan.replicas)
            .collect();
        if !grow.is_empty() {
            try_join_all(grow.iter().map(|r| async {
                self.client
                    .bdev_lvol_resize(&LvolResize {
                        name: r.alias.clone(),
                        size_in_mib: size_mib,
                    })
                    .await
                    .map_err(rpc(
                        vol,
                        format!("resizing replica {} to {size_mib} MiB", r.alias),
                    ))
            }))
            .await?;
            for r in replicas.iter_mut().filter(|r| r.k < plan.replicas) {
                r.size_bytes = r.size_bytes.max(wanted);
            }
        }

        // engine: the lvol itself (one replica), or raid1 over the replicas that
        // are up to date, with the others rebuilt into it one at a time
        let created: BTreeSet<usize> = placement.iter().filter(|p| !p.2).map(|p| p.0).collect();
        let fresh = placement.iter().all(|p| !p.2);
        let trusted = |k: usize| match &plan.in_sync {
            Some(s) => s.contains(&k) && !created.contains(&k),
            // a new clone: only the replicas cloned from one point in time
            None if source.is_some() => clone_set.contains(&k),
            None => fresh || !created.contains(&k),
        };
        let (device, sync) = if plan.replicas + plan.remote.len() <= 1 {
            match replicas.first() {
                Some(r) if trusted(r.k) => (
                    r.bdev.clone(),
                    SyncState {
                        in_sync: BTreeSet::from([r.k]),
                        ..SyncState::default()
                    },
                ),
                _ => return Err(no_current(plan, &replicas)),
            }
        } else {
            self.ensure_raid(inv, plan, &replicas, &trusted, made).await?
        };
        let is_raid = device == naming::raid(vol);

        // export: namespace, listener, hosts
        self.export_ns(
            inv,
            vol,
            &nqn,
            &device,
            volume_uuid(&plan.name),
            &plan.export,
            made,
        )
        .await?;

        // the size the host sees: looked up only when it may differ from the replicas'
        let min_replica = replicas.iter().map(|r| r.size_bytes).min().unwrap_or(0);
        let size_bytes = if is_raid && (grew || inv.raid(&device).is_none()) {
            match self
                .client
                .bdev(&device)
                .await
                .map_err(rpc(vol, format!("looking up {device}")))?
            {
                Some(b) => b.size_bytes(),
                None => 0,
            }
        } else if is_raid {
            inv.bdev_size(&device).unwrap_or(min_replica)
        } else {
            min_replica
        };
        if is_raid && size_bytes < min_replica {
            return Err(VolumeError::RaidDidNotGrow {
                volume: vol.to_owned(),
                raid: device,
                actual: size_bytes,
                wanted: min_replica,
            });
        }
        if size_bytes > 0 && plan.size_bytes < size_bytes.saturating_sub(MIB) {
            tracing::info!(
                volume = vol,
                served = size_bytes,
                asked = plan.size_bytes,
                "volumes do not shrink"
            );
        }
        Ok(VolumeInfo {
            device,
            size_bytes,
            nqn: nqn.as_str().to_owned(),
            replicas,
            wanted: plan.replicas + plan.remote.len(),
            waiting,
            in_sync: sync.in_sync,
            rebuilding: sync.rebuilding,
            stale: sync.stale,
            unplaced,
        })
    }

    /// Puts `device` as namespace 1 of the existing subsystem `nqn` (replacing
    /// another bdev there), with its listener and exactly the allowed hosts.
    #[allow(clippy::too_many_arguments)]
    async fn export_ns(
        &self,
        inv: &Inventory,
        vol: &str,
        nqn: &Nqn,
        device: &str,
        id: uuid::Uuid,
        export: &ExportSpec,
        made: &mut Vec<Made>,
    ) -> Result<(), VolumeError> {
        let sub = inv.subsystem(nqn.as_str());
        let ns = sub.and_then(|s| s.namespaces.iter().find(|n| n.nsid == NSID));
        if let Some(ns) = ns
            && ns.bdev_name != *device
        {
            self.client
                .nvmf_subsystem_remove_ns(&RemoveNamespace {
                    nqn: nqn.as_str().to_owned(),
                    nsid: NSID,
                })
                .await
                .map_err(rpc(vol, format!("replacing the namespace of {nqn}")))?;
        }
        if ns.is_none_or(|ns| ns.bdev_name != *device) {
            let mut p = AddNamespace::with_id(nqn.as_str(), device, id);
            p.namespace.nsid = Some(NSID);
            self.client
                .nvmf_subsystem_add_ns(&p)
                .await
                .map_err(rpc(vol, format!("adding bdev {device} to {nqn}")))?;
            made.push(Made::Namespace(nqn.as_str().to_owned()));
        }
        let listen = ListenAddress::tcp(export.address, export.port);
        let has_listener = sub.is_some_and(|s| {
            s.listen_addresses
                .iter()
                .any(|l| l.traddr == listen.traddr && l.trsvcid == listen.trsvcid)
        });
        if !has_listener {
            if let Err(source) = self
                .client
                .nvmf_subsystem_add_listener(&SubsystemListener {
                    nqn: nqn.as_str().to_owned(),
                    listen_address: listen.clone(),
                })
                .await
            {
                let target = super::launch::socket_peer_pid(self.client.socket()).await;
                return Err(listener_error(vol, &listen.traddr, export.port, target, source));
            }
            made.push(Made::Listener(nqn.as_str().to_owned(), listen));
        }
        // exports made before access control allowed any host
        if sub.is_some_and(|s| s.allow_any_host) {
            self.client
                .nvmf_subsystem_allow_any_host(&AllowAnyHost {
                    nqn: nqn.as_str().to_owned(),
                    allow_any_host: false,
                })
                .await
                .map_err(rpc(vol, format!("allowing only listed hosts on {nqn}")))?;
        }
        let have: BTreeSet<&str> = sub
            .map(|s| s.hosts.iter().map(|h| h.nqn.as_str()).collect())
            .unwrap_or_default();
        for h in export.hosts.iter().filter(|h| !have.contains(h.as_str())) {
            self.client
                .nvmf_subsystem_add_host(&SubsystemHostParams {
                    nqn: nqn.as_str().to_owned(),
                    host: h.clone(),
                })
                .await
                .map_err(rpc(vol, format!("allowing host {h} on {nqn}")))?;
        }
        for h in have.iter().filter(|h| !export.hosts.iter().any(|x| x == *h)) {
            self.client
                .nvmf_subsystem_remove_host(&SubsystemHostParams {
                    nqn: nqn.as_str().to_owned(),
                    host: (*h).to_owned(),
                })
                .await
                .map_err(rpc(vol, format!("disallowing host {h} on {nqn}")))?;
        }
        Ok(())
    }

    /// The raid1 of a volume with two or more replicas: made from the
    /// replicas that are up to date (empty slots, through short-lived
    /// `bdev_null` placeholders, for the others), then each replica that is
    /// behind is added to it, which makes SPDK rebuild it from the others;
    /// one rebuild at a time. A raid that exists is only completed.
    async fn ensure_raid(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        replicas: &[ReplicaInfo],
        trusted: &(dyn Fn(usize) -> bool + Sync),
        made: &mut Vec<Made>,
    ) -> Result<(String, SyncState), VolumeError> {
        let vol = plan.name.as_str();
        let raid = naming::raid(vol);
        let k_of = |member: &str| {
            replicas
                .iter()
                .find(|r| r.bdev == member || r.alias == member)
                .map(|r| r.k)
        };
        let mut sync = SyncState::default();
        let existing = inv.raid(&raid).filter(|r| {
            r.base_bdevs_list
                .iter()
                .any(|b| b.is_configured && b.name.as_deref().is_some_and(|n| k_of(n).is_some()))
        });
        match existing {
            Some(r) => {
                // a placeholder left by an interrupted call: out before anything reads it
                for b in &r.base_bdevs_list {
                    if let Some(n) = b.name.as_deref().filter(|n| n.starts_with(NULL_PREFIX)) {
                        ignore_missing(self.client.bdev_raid_remove_base_bdev(&ByName::new(n)))
                            .await
                            .map_err(rpc(vol, format!("removing placeholder {n} from {raid}")))?;
                    }
                }
                let target = r
                    .process
                    .as_ref()
                    .and_then(|p| Some((k_of(&p.target)?, p.progress.percent)));
                sync.rebuilding = target;
                sync.in_sync = r
                    .base_bdevs_list
                    .iter()
                    .filter(|b| b.is_configured)
                    .filter_map(|b| k_of(b.name.as_deref()?))
                    .filter(|k| target.is_none_or(|(t, _)| t != *k))
                    .collect();
            }
            None => {
                if let Some(r) = inv.raid(&raid) {
                    // no replica of ours serves in it any more: made again below
                    ignore_missing(self.client.bdev_raid_delete(&ByName::new(&r.name)))
                        .await
                        .map_err(rpc(vol, format!("deleting raid {raid} that lost every replica")))?;
                }
                let good: Vec<&ReplicaInfo> = replicas.iter().filter(|r| trusted(r.k)).collect();
                let Some(first) = good.first() else {
                    return Err(no_current(plan, replicas));
                };
                let (block_size, num_blocks) = match inv.bdevs.get(&first.bdev) {
                    Some(b) => (b.block_size, b.num_blocks),
                    None => match self
                        .client
                        .bdev(&first.bdev)
                        .await
                        .map_err(rpc(vol, format!("looking up replica {}", first.alias)))?
                    {
                        Some(b) => (b.block_size, b.num_blocks),
                        None => (4096, first.size_bytes / 4096),
                    },
                };
                let mut members = Vec::new();
                let mut nulls = Vec::new();
                for k in 0..plan.replicas + plan.remote.len() {
                    match good.iter().find(|r| r.k == k) {
                        Some(r) => members.push(r.bdev.clone()),
                        None => {
                            let n = format!("{NULL_PREFIX}{}", naming::replica(vol, k));
                            if !inv.bdevs.contains_key(&n) {
                                self.client
                                    .bdev_null_create(&NullCreate {
                                        name: n.clone(),
                                        num_blocks,
                                        block_size,
                                    })
                                    .await
                                    .map_err(rpc(vol, format!("creating placeholder {n}")))?;
                            }
                            made.push(Made::Null(n.clone()));
                            members.push(n.clone());
                            nulls.push(n);
                        }
                    }
                }
                self.client
                    .bdev_raid_create(&RaidCreate {
                        name: raid.clone(),
                        raid_level: RaidLevel::Raid1,
                        base_bdevs: members,
                        strip_size_kb: None,
                        uuid: None,
                        superblock: Some(false),
                    })
                    .await
                    .map_err(rpc(vol, format!("creating raid1 {raid}")))?;
                made.push(Made::Raid(raid.clone()));
                for n in &nulls {
                    self.client
                        .bdev_raid_remove_base_bdev(&ByName::new(n))
                        .await
                        .map_err(rpc(
                            vol,
                            format!("emptying the slot of placeholder {n} in {raid}"),
                        ))?;
                    ignore_missing(self.client.bdev_null_delete(&ByName::new(n)))
                        .await
                        .map_err(rpc(vol, format!("deleting placeholder {n}")))?;
                }
                sync.in_sync = good.iter().map(|r| r.k).collect();
            }
        }
        // replicas that are behind join one at a time; SPDK rebuilds each from the others
        let behind: Vec<&ReplicaInfo> = replicas
            .iter()
            .filter(|r| !sync.in_sync.contains(&r.k) && sync.rebuilding.is_none_or(|(t, _)| t != r.k))
            .collect();
        let mut behind = behind.into_iter();
        if sync.rebuilding.is_none()
            && let Some(r) = behind.next()
        {
            match self
                .client
                .bdev_raid_add_base_bdev(&RaidAddBaseBdev {
                    raid_bdev: raid.clone(),
                    base_bdev: r.bdev.clone(),
                })
                .await
            {
                Ok(_) => {
                    tracing::info!(volume = vol, replica = %r.name, "rebuilding replica from the up-to-date ones");
                    sync.rebuilding = Some((r.k, 0));
                }
                // another process runs (SPDK allows one): the next reconcile adds it
                Err(e) if e.is(ErrorKind::Busy) => sync.stale.push(r.k),
                Err(e) => {
                    return Err(rpc(
                        vol,
                        format!("adding replica {} to {raid} to rebuild it", r.alias),
                    )(e));
                }
            }
        }
        sync.stale.extend(behind.map(|r| r.k));
        Ok((raid, sync))
    }

    /// Keeps replica `k` of a volume whose engine runs on another node: the
    /// thin lvol `<vol>-r<k>` (made on the disk with the most free space, or
    /// waited for on the disk it was placed on), grown to the size, and
    /// exported as `Nqn::for_replica(vol, "r<k>")` with an NGUID/UUID derived
    /// from the replica, on the node's listener, to the allowed hosts. Rolls
    /// back what it made when a step fails.
    pub async fn ensure_served(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        k: usize,
    ) -> Result<VolumeInfo, VolumeError> {
        let mut made = Vec::new();
        match self.ensure_served_inner(inv, plan, k, &mut made).await {
            Ok(i) => Ok(i),
            Err(e) => {
                self.undo(made).await;
                Err(e)
            }
        }
    }

    async fn ensure_served_inner(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        k: usize,
        made: &mut Vec<Made>,
    ) -> Result<VolumeInfo, VolumeError> {
        let vol = plan.name.as_str();
        let name = naming::replica(vol, k);
        check_len(vol, &name)?;
        let size_mib = plan.size_bytes.div_ceil(MIB).max(1);
        let nqn = Nqn::for_replica(&plan.name, &format!("r{k}")).map_err(|source| VolumeError::BadName {
            volume: vol.to_owned(),
            source,
        })?;
        let mut info = VolumeInfo {
            device: String::new(),
            size_bytes: 0,
            nqn: nqn.as_str().to_owned(),
            replicas: Vec::new(),
            wanted: 1,
            waiting: Vec::new(),
            in_sync: BTreeSet::new(),
            rebuilding: None,
            stale: Vec::new(),
            unplaced: None,
        };
        let (disk, alias, bdev, size, allocated) = match inv.find_lvol(&name) {
            Some(l) => {
                let disk = l.lvs.name.trim_start_matches(LVS_PREFIX).to_owned();
                let cs = inv.lvstore(&disk).map(|s| s.cluster_size).unwrap_or(MIB);
                let size = inv.bdev_size(&l.uuid).unwrap_or(0);
                (
                    disk,
                    l.alias.clone(),
                    l.uuid.clone(),
                    size,
                    l.num_allocated_clusters * cs,
                )
            }
            None => {
                let ready = ready_disks(inv, plan);
                let decided = placement::place(&placement::Request {
                    wanted: &[k],
                    listed: &plan.disks,
                    ready: &ready,
                    away: &plan.disk_away,
                    existing: &BTreeMap::new(),
                    placed: &plan.placed,
                    clone_of: None,
                });
                let disk = match decided.slots.get(&k) {
                    Some(Slot::WaitFor(d)) => {
                        info.waiting.push((k, d.clone()));
                        return Ok(info);
                    }
                    Some(Slot::Create(d) | Slot::Exists(d)) => d.clone(),
                    Some(Slot::Unplaced) | None => {
                        let b = decided.blocked.unwrap_or_else(|| Blocked {
                            replicas: vec![k],
                            reason: format!("replica r{k} has no disk"),
                            disk_failed: false,
                        });
                        return Err(no_placement(vol, &b));
                    }
                };
                let lvs = naming::lvstore(&disk);
                let uuid = self
                    .client
                    .bdev_lvol_create(&LvolCreate::thin(&lvs, &name, size_mib))
                    .await
                    .map_err(rpc(vol, format!("creating replica lvol {lvs}/{name}")))?;
                let alias = format!("{lvs}/{name}");
                made.push(Made::Lvol(alias.clone()));
                (disk, alias, uuid, size_mib * MIB, 0)
            }
        };
        let size = if size < size_mib * MIB {
            self.client
                .bdev_lvol_resize(&LvolResize {
                    name: alias.clone(),
                    size_in_mib: size_mib,
                })
                .await
                .map_err(rpc(vol, format!("resizing replica {alias} to {size_mib} MiB")))?;
            size_mib * MIB
        } else {
            size
        };
        let id = uuid::Uuid::new_v5(&volume_uuid(&plan.name), format!("r{k}").as_bytes());
        self.export_replica_in(inv, vol, &nqn, &bdev, id, &plan.export, made)
            .await?;
        info.device = bdev.clone();
        info.size_bytes = size;
        info.in_sync.insert(k);
        info.replicas.push(ReplicaInfo {
            k,
            name,
            disk,
            bdev,
            alias,
            size_bytes: size,
            allocated_bytes: allocated,
        });
        Ok(info)
    }

    /// Deletes the volume's export, engine and replica heads (and revert
    /// markers); absent objects are fine. Snapshots stay (their own resources).
    pub async fn delete(&self, inv: &Inventory, vol: &ObjectName) -> Result<(), VolumeError> {
        let v = vol.as_str();
        let nqn = Nqn::for_volume(vol);
        if inv.subsystem(nqn.as_str()).is_some() {
            ignore_missing(self.client.nvmf_delete_subsystem(&ByNqn {
                nqn: nqn.as_str().to_owned(),
            }))
            .await
            .map_err(rpc(v, format!("deleting subsystem {nqn}")))?;
        }
        let raid = naming::raid(v);
        if inv.raid(&raid).is_some() {
            ignore_missing(self.client.bdev_raid_delete(&ByName::new(&raid)))
                .await
                .map_err(rpc(v, format!("deleting raid {raid}")))?;
        }
        for c in inv
            .controllers
            .iter()
            .filter(|c| matches!(c.strip_prefix(REMOTE_PREFIX).and_then(parse_lvol), Some(LvolRole::Replica { volume, .. }) if volume == v))
        {
            ignore_missing(self.client.bdev_nvme_detach_controller(&ByName::new(c)))
                .await
                .map_err(rpc(v, format!("detaching remote replica {c}")))?;
        }
        let served = format!("{NQN_PREFIX}:replica:{v}:");
        for sub in inv.subsystems.iter().filter(|s| s.nqn.starts_with(&served)) {
            ignore_missing(self.client.nvmf_delete_subsystem(&ByNqn { nqn: sub.nqn.clone() }))
                .await
                .map_err(rpc(v, format!("deleting replica export {}", sub.nqn)))?;
        }
        let null = format!("{NULL_PREFIX}{v}");
        if inv.bdevs.contains_key(&null) {
            ignore_missing(
                self.client
                    .typed::<_, bool>("bdev_null_delete", &ByName::new(&null)),
            )
            .await
            .map_err(rpc(v, format!("deleting placeholder {null}")))?;
        }
        let heads: Vec<&Lvol> = inv
            .lvols
            .values()
            .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
            .filter(|l| match parse_lvol(&l.name) {
                Some(LvolRole::Replica { volume, .. }) | Some(LvolRole::RevertMarker { volume, .. }) => {
                    volume == v
                }
                _ => false,
            })
            .collect();
        try_join_all(heads.iter().map(|l| async {
            ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&l.alias)))
                .await
                .map_err(rpc(v, format!("deleting replica {}", l.alias)))
        }))
        .await?;
        Ok(())
    }

    /// Snapshots every up-to-date replica of a volume (`in_sync`; `None`:
    /// every replica) at one point in time; rolls back the snapshots it made
    /// on error. A replica that is behind or being rebuilt gets none: its
    /// copy would not be the volume's.
    ///
    /// One point in time: SPDK quiesces only the lvol it snapshots
    /// (`bdev_lvol_snapshot`), not its raid siblings, and v26.05 has no
    /// `nvmf_subsystem_pause` RPC. So the export is frozen first: every
    /// listener of the volume's subsystem is set ANA inaccessible, which SPDK
    /// does with the subsystem paused and drained (no I/O outstanding in the
    /// raid when the call returns), after which every new I/O command is
    /// failed with a retryable path error before it reaches the raid (hosts
    /// with NVMe multipath queue it). The snapshots are taken, the listeners
    /// set optimized again, always. A volume not exported takes no I/O. An
    /// export made before ANA reporting (no `anagrpid`) cannot be frozen:
    /// then only the lowest replica is snapshotted, and a revert or clone
    /// rebuilds the others from it (see [`point_in_time_set`]).
    pub async fn snapshot(
        &self,
        inv: &Inventory,
        vol: &ObjectName,
        snap: &ObjectName,
        in_sync: Option<&BTreeSet<usize>>,
    ) -> Result<Snapshotted, VolumeError> {
        let v = vol.as_str();
        let id = format!("{v}@{snap}");
        let mut heads = replica_heads(inv, v);
        heads.retain(|(k, _)| in_sync.is_none_or(|s| s.contains(k)));
        let mut done = Vec::new();
        let mut todo = Vec::new();
        for (k, l) in &heads {
            let sname = naming::snapshot_lvol(v, *k, snap.as_str());
            check_len(v, &sname)?;
            let alias = format!("{}/{sname}", l.lvs.name);
            if inv.lvols.contains_key(&alias) {
                done.push(alias);
            } else {
                todo.push((*k, l.alias.clone(), sname, alias));
            }
        }
        if heads.is_empty() {
            return Err(VolumeError::SnapshotMissing {
                volume: id,
                lvol: naming::replica(v, 0),
            });
        }
        if todo.is_empty() {
            return Ok(Snapshotted {
                lvols: done,
                point_in_time: BTreeSet::new(),
            });
        }
        let nqn = Nqn::for_volume(vol);
        let export = inv
            .subsystem(nqn.as_str())
            .filter(|s| !s.namespaces.is_empty() && !s.listen_addresses.is_empty());
        let mut frozen = Vec::new();
        if let Some(sub) = export
            && todo.len() > 1
        {
            if sub.ana_reporting() == Some(true) {
                for l in &sub.listen_addresses {
                    if let Err(e) = self.set_ana(&nqn, l, AnaState::Inaccessible).await {
                        // thaw logs its own failures; the freeze error is the one to report
                        let _ = self.thaw(&nqn, &frozen).await;
                        return Err(rpc(&id, format!("freezing {nqn} on {}", l.traddr))(e));
                    }
                    frozen.push(l.clone());
                }
            } else {
                tracing::warn!(%nqn, snapshot = %id, "export predates ANA reporting and cannot be frozen: \
                    snapshot taken on one replica; a revert or clone rebuilds the others from it");
                todo.truncate(1);
            }
        }
        let id_ref = &id;
        let results = join_all(todo.iter().map(|(k, head, sname, alias)| async move {
            self.client
                .bdev_lvol_snapshot(&LvolSnapshot {
                    lvol_name: head.clone(),
                    snapshot_name: sname.clone(),
                })
                .await
                .map(|_| (*k, alias.clone()))
                .map_err(rpc(id_ref, format!("snapshotting {head}")))
        }))
        .await;
        let thawed = self.thaw(&nqn, &frozen).await;
        let mut err = None;
        let mut made = Vec::new();
        for r in results {
            match r {
                Ok(a) => made.push(a),
                Err(e) => err = err.or(Some(e)),
            }
        }
        if let Some(e) = err {
            self.undo(made.into_iter().map(|(_, a)| Made::Lvol(a)).collect())
                .await;
            return Err(e);
        }
        thawed.map_err(rpc(&id, format!("thawing {nqn} after the snapshot")))?;
        let point_in_time = made.iter().map(|(k, _)| *k).collect();
        done.extend(made.into_iter().map(|(_, a)| a));
        Ok(Snapshotted {
            lvols: done,
            point_in_time,
        })
    }

    async fn set_ana(&self, nqn: &Nqn, l: &ListenAddress, state: AnaState) -> Result<bool, ClientError> {
        self.client
            .nvmf_subsystem_listener_set_ana_state(&ListenerAnaState {
                nqn: nqn.as_str().to_owned(),
                listen_address: l.clone(),
                ana_state: state,
            })
            .await
    }

    /// Sets `listeners` of `nqn` optimized again; every one is tried, the
    /// first error returned.
    async fn thaw(&self, nqn: &Nqn, listeners: &[ListenAddress]) -> Result<(), ClientError> {
        let mut first = Ok(());
        for l in listeners {
            if let Err(e) = self.set_ana(nqn, l, AnaState::Optimized).await {
                tracing::error!(%nqn, listener = %l.traddr, error = %e, "could not thaw the export after a snapshot");
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Sets every listener of the volume's export that is not optimized
    /// (left frozen by a snapshot that talon did not finish: a crash between
    /// freeze and thaw) optimized again. Returns how many it thawed.
    pub async fn thaw_export(&self, vol: &ObjectName) -> Result<usize, VolumeError> {
        let nqn = Nqn::for_volume(vol);
        let listeners = match self
            .client
            .nvmf_subsystem_get_listeners(&ByNqn {
                nqn: nqn.as_str().to_owned(),
            })
            .await
        {
            Ok(l) => l,
            Err(e) if e.is(ErrorKind::InvalidParams) || e.is(ErrorKind::NotFound) => return Ok(0),
            Err(e) => return Err(rpc(vol.as_str(), format!("listing the listeners of {nqn}"))(e)),
        };
        let frozen: Vec<ListenAddress> = listeners
            .into_iter()
            .filter(|l| l.ana_states.iter().any(|s| s.ana_state != "optimized"))
            .map(|l| l.address)
            .collect();
        if !frozen.is_empty() {
            tracing::warn!(%nqn, listeners = frozen.len(), "export was left frozen: thawing it");
        }
        self.thaw(&nqn, &frozen)
            .await
            .map_err(rpc(vol.as_str(), format!("thawing {nqn}")))?;
        Ok(frozen.len())
    }

    /// Deletes every replica's snapshot lvol `<vol>-r<k>.s.<snap>`; a clear
    /// error when SPDK refuses because clones exist.
    pub async fn delete_snapshot(&self, inv: &Inventory, vol: &str, snap: &str) -> Result<(), VolumeError> {
        let id = format!("{vol}@{snap}");
        let lvols: Vec<&Lvol> = inv
            .lvols
            .values()
            .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
            .filter(|l| {
                matches!(parse_lvol(&l.name), Some(LvolRole::Snapshot { volume, snap: s, .. }) if volume == vol && s == snap)
            })
            .collect();
        for l in lvols {
            match ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&l.alias))).await {
                Ok(()) => {}
                Err(e) if e.is(ErrorKind::Busy) => {
                    return Err(VolumeError::SnapshotHasClones {
                        snapshot: id,
                        source: e,
                    });
                }
                Err(e) => return Err(rpc(&id, format!("deleting snapshot lvol {}", l.alias))(e)),
            }
        }
        Ok(())
    }

    /// Reverts the volume to snapshot `snap`: the export and engine go
    /// away, the head of each replica of the snapshot's point-in-time set
    /// ([`point_in_time_set`] of `recorded`) is deleted and made again as a
    /// clone of its snapshot, and the marker `<vol>.rev.<generation>` records
    /// it. Every other replica (behind when the snapshot was taken, or whose
    /// snapshot is not proven to be the same instant) loses its head: it is
    /// made again empty and rebuilt from the set, so a raid1 is never built
    /// over members that may differ. Idempotent: run again after a failure,
    /// it finishes the missing replicas. Returns the replicas now up to date;
    /// the caller then calls [`VolumeOps::ensure`] with them to export again.
    pub async fn revert(
        &self,
        inv: &Inventory,
        vol: &ObjectName,
        snap: &ObjectName,
        generation: u64,
        recorded: Option<&BTreeSet<usize>>,
    ) -> Result<BTreeSet<usize>, VolumeError> {
        let v = vol.as_str();
        let id = format!("{v}@{snap}");
        let sources = point_in_time_set(inv, v, snap.as_str(), recorded);
        let snaps: Vec<(usize, &Lvol)> = inv
            .lvols
            .values()
            .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
            .filter_map(|l| match parse_lvol(&l.name) {
                Some(LvolRole::Snapshot { volume, k, snap: s })
                    if volume == v && s == snap.as_str() && sources.contains(&k) =>
                {
                    Some((k, l))
                }
                _ => None,
            })
            .collect();
        if snaps.is_empty() {
            return Err(VolumeError::SnapshotMissing {
                volume: v.to_owned(),
                lvol: naming::snapshot_lvol(v, 0, snap.as_str()),
            });
        }
        // engine and export go: SPDK has no in-place revert
        let nqn = Nqn::for_volume(vol);
        if inv.subsystem(nqn.as_str()).is_some() {
            ignore_missing(self.client.nvmf_delete_subsystem(&ByNqn {
                nqn: nqn.as_str().to_owned(),
            }))
            .await
            .map_err(rpc(&id, format!("deleting subsystem {nqn} for revert")))?;
        }
        let raid = naming::raid(v);
        if inv.raid(&raid).is_some() {
            ignore_missing(self.client.bdev_raid_delete(&ByName::new(&raid)))
                .await
                .map_err(rpc(&id, format!("deleting raid {raid} for revert")))?;
        }
        for (k, l) in replica_heads(inv, v) {
            if !snaps.iter().any(|(sk, _)| *sk == k) {
                ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&l.alias)))
                    .await
                    .map_err(rpc(&id, format!("deleting head {} that has no {snap}", l.alias)))?;
            }
        }
        for (k, s) in &snaps {
            let head = naming::replica(v, *k);
            let alias = format!("{}/{head}", s.lvs.name);
            if inv.lvols.contains_key(&alias) {
                ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&alias)))
                    .await
                    .map_err(rpc(&id, format!("deleting head {alias} for revert")))?;
            }
            self.client
                .bdev_lvol_clone(&LvolClone {
                    snapshot_name: s.alias.clone(),
                    clone_name: head,
                })
                .await
                .map_err(rpc(&id, format!("cloning {} into {alias}", s.alias)))?;
        }
        let lvs = &snaps[0].1.lvs.name;
        let marker = naming::revert_marker(v, generation);
        match self
            .client
            .bdev_lvol_create(&LvolCreate::thin(lvs, &marker, 1))
            .await
        {
            Ok(_) => {}
            Err(e) if e.is(ErrorKind::AlreadyExists) => {}
            Err(e) => return Err(rpc(&id, format!("recording revert marker {lvs}/{marker}"))(e)),
        }
        // older markers go
        for l in inv.lvols.values() {
            if let Some(LvolRole::RevertMarker {
                volume,
                generation: g,
            }) = parse_lvol(&l.name)
                && volume == v
                && g < generation
            {
                let _ = self.client.bdev_lvol_delete(&ByName::new(&l.alias)).await;
            }
        }
        Ok(snaps.iter().map(|(k, _)| *k).collect())
    }

    /// Deletes owned orphans; failures are logged and returned as text (the
    /// next reconcile retries). Returns what was removed.
    pub async fn remove_orphans(&self, orphans: Vec<Owned>) -> (Vec<Owned>, Vec<String>) {
        let mut removed = Vec::new();
        let mut errors = Vec::new();
        for o in orphans {
            let r = match &o {
                Owned::Subsystem(n) => {
                    ignore_missing(self.client.nvmf_delete_subsystem(&ByNqn { nqn: n.clone() })).await
                }
                Owned::Raid(n) => ignore_missing(self.client.bdev_raid_delete(&ByName::new(n))).await,
                Owned::Null(n) => {
                    ignore_missing(self.client.typed::<_, bool>("bdev_null_delete", &ByName::new(n))).await
                }
                Owned::Lvol(a) => ignore_missing(self.client.bdev_lvol_delete(&ByName::new(a))).await,
                Owned::Remote(c) => {
                    ignore_missing(self.client.bdev_nvme_detach_controller(&ByName::new(c))).await
                }
            };
            match r {
                Ok(()) => removed.push(o),
                Err(e) => errors.push(format!("removing orphan {o:?}: {e}")),
            }
        }
        (removed, errors)
    }

    /// Exports replica `replica` (bdev `bdev`, an lvol) of `vol` to a remote
    /// engine: subsystem `Nqn::for_replica`, namespace with explicit
    /// NGUID/UUID derived from the replica (so an attach inside the same
    /// target registers a bdev), to exactly `hosts`. Idempotent; rolls back on
    /// error.
    pub async fn export_replica(
        &self,
        vol: &ObjectName,
        replica: &str,
        bdev: &str,
        address: IpAddr,
        port: u16,
        hosts: Vec<String>,
    ) -> Result<String, VolumeError> {
        let v = vol.as_str();
        let nqn = Nqn::for_replica(vol, replica).map_err(|source| VolumeError::BadName {
            volume: v.to_owned(),
            source,
        })?;
        let inv = Inventory::load(&self.client)
            .await
            .map_err(rpc(v, "listing the target"))?;
        let export = ExportSpec { address, port, hosts };
        let id = uuid::Uuid::new_v5(&volume_uuid(vol), replica.as_bytes());
        let mut made = Vec::new();
        match self
            .export_replica_in(&inv, v, &nqn, bdev, id, &export, &mut made)
            .await
        {
            Ok(()) => Ok(nqn.as_str().to_owned()),
            Err(e) => {
                self.undo(made).await;
                Err(e)
            }
        }
    }

    /// The TCP transport, the replica subsystem `nqn` and its namespace.
    #[allow(clippy::too_many_arguments)]
    async fn export_replica_in(
        &self,
        inv: &Inventory,
        vol: &str,
        nqn: &Nqn,
        bdev: &str,
        id: uuid::Uuid,
        export: &ExportSpec,
        made: &mut Vec<Made>,
    ) -> Result<(), VolumeError> {
        if !inv.tcp_transport {
            self.ensure_transport()
                .await
                .map_err(rpc(vol, "creating the TCP transport"))?;
        }
        if inv.subsystem(nqn.as_str()).is_none() {
            self.client
                .nvmf_create_subsystem(&CreateSubsystem {
                    nqn: nqn.as_str().to_owned(),
                    allow_any_host: Some(false),
                    serial_number: None,
                    model_number: Some("talon-replica".into()),
                    max_namespaces: Some(1),
                    ana_reporting: None,
                })
                .await
                .map_err(rpc(vol, format!("creating subsystem {nqn}")))?;
            made.push(Made::Subsystem(nqn.as_str().to_owned()));
        }
        self.export_ns(inv, vol, nqn, bdev, id, export, made).await
    }

    /// Attaches a remote replica exported by [`VolumeOps::export_replica`];
    /// returns its bdev (`<controller>n1`).
    pub async fn attach_replica(
        &self,
        vol: &str,
        controller: &str,
        address: IpAddr,
        port: u16,
        nqn: &str,
    ) -> Result<String, VolumeError> {
        let bdevs = match self
            .client
            .bdev_nvme_attach_controller(&AttachController {
                hostnqn: self.host_nqn.clone(),
                ..AttachController::tcp(controller, address, port, nqn)
            })
            .await
        {
            Ok(b) => b,
            Err(e) if e.is(ErrorKind::AlreadyExists) => vec![format!("{controller}n1")],
            Err(e) => return Err(rpc(vol, format!("attaching {nqn} at {address}:{port}"))(e)),
        };
        match bdevs.into_iter().next() {
            Some(b) => Ok(b),
            None => {
                let _ = self
                    .client
                    .bdev_nvme_detach_controller(&ByName::new(controller))
                    .await;
                Err(VolumeError::AttachedNoBdev {
                    volume: vol.to_owned(),
                    nqn: nqn.to_owned(),
                })
            }
        }
    }
}

/// The replica heads `(k, lvol)` of a volume.
pub fn replica_heads<'a>(inv: &'a Inventory, vol: &str) -> Vec<(usize, &'a Lvol)> {
    let mut v: Vec<(usize, &Lvol)> = inv
        .lvols
        .values()
        .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
        .filter_map(|l| match parse_lvol(&l.name) {
            Some(LvolRole::Replica { volume, k }) if volume == vol => Some((k, l)),
            _ => None,
        })
        .collect();
    v.sort_by_key(|(k, _)| *k);
    v
}

/// The highest revert generation recorded for a volume.
pub fn applied_revert(inv: &Inventory, vol: &str) -> u64 {
    inv.lvols
        .values()
        .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
        .filter_map(|l| match parse_lvol(&l.name) {
            Some(LvolRole::RevertMarker { volume, generation }) if volume == vol => Some(generation),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

async fn ignore_missing<T>(
    f: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<(), ClientError> {
    match f.await {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvol_names_parse_back() {
        assert_eq!(
            parse_lvol("x-r1-r0"),
            Some(LvolRole::Replica {
                volume: "x-r1".into(),
                k: 0
            })
        );
        assert_eq!(
            parse_lvol("v-r2.s.daily"),
            Some(LvolRole::Snapshot {
                volume: "v".into(),
                k: 2,
                snap: "daily".into()
            })
        );
        assert_eq!(
            parse_lvol("v.rev.3"),
            Some(LvolRole::RevertMarker {
                volume: "v".into(),
                generation: 3
            })
        );
        assert_eq!(parse_lvol("lvol0"), None);
        assert_eq!(parse_lvol("-r0"), None);
    }

    #[test]
    fn serial_is_twenty_chars() {
        let v = ObjectName::parse("volume", "a").expect("name");
        assert_eq!(naming::serial(&v).len(), 20);
    }
}
