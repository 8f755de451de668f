//! Observed state of the data engines (V2: spdk_tgt; V1: tgtd), written by the
//! engine controllers from what the targets report.

use serde::{Deserialize, Serialize};

use crate::runtime::Spec;

/// Which engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// SPDK.
    V2,
    /// tgtd.
    V1,
}

/// Lifecycle of an engine object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ObjectState {
    /// Being created.
    Creating,
    /// Serving.
    Ready,
    /// Serving with fewer replicas than asked.
    Degraded,
    /// Not serving; `message` says why.
    Failed,
    /// Being removed.
    Deleting,
    /// A replica being filled from one that is up to date.
    Rebuilding,
    /// A replica that missed writes; it is rebuilt before it serves again.
    Stale,
    /// A standby (DR) volume: restored from backups, not served until
    /// activated.
    Standby,
    /// Not used, and nothing to wait for: the engine that would use it cannot
    /// run on this node (a disk on a node without SPDK, whose V1 volumes are
    /// files in the data dir); `message` says why.
    Unused,
}

/// The id of spdk_tgt's [`TargetStatus`] and of its [`SpdkEvents`].
pub const SPDK_STATUS_ID: &str = "spdk";
/// The id of tgtd's [`TargetStatus`].
pub const TGTD_STATUS_ID: &str = "tgtd";

/// A target process (`spdk` or `tgtd`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TargetStatus {
    /// Which engine it serves.
    pub engine: Engine,
    /// Ready once it answers on its control socket.
    pub state: ObjectState,
    /// Its pid, when talon started or adopted it.
    pub pid: Option<u32>,
    /// Its control socket.
    pub socket: String,
    /// Its version.
    pub version: String,
    /// Restarts since talon started.
    pub restarts: u32,
    /// What went wrong, or what it is doing.
    pub message: String,
}

impl TargetStatus {
    /// A V2 target that answers on `socket`, run `pid` (unit tests).
    #[cfg(test)]
    pub(crate) fn ready_for_test(pid: Option<u32>, socket: String) -> TargetStatus {
        TargetStatus {
            engine: Engine::V2,
            state: ObjectState::Ready,
            pid,
            socket,
            version: String::new(),
            restarts: 0,
            message: String::new(),
        }
    }

    /// Which run of the target this is.
    pub fn instance(&self) -> TargetInstance {
        TargetInstance {
            pid: self.pid,
            restarts: self.restarts,
        }
    }
}

impl Spec for TargetStatus {
    const TYPE: &'static str = "TargetStatus";
    const NAMESPACE: &'static str = "engine";
}

/// A disk as the engine sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DiskStatus {
    /// Which engine.
    pub engine: Engine,
    /// Ready once its lvstore is loaded or created.
    pub state: ObjectState,
    /// The base bdev name.
    pub bdev: String,
    /// The lvstore name and UUID.
    pub lvstore: String,
    /// The lvstore UUID.
    pub lvstore_uuid: String,
    /// Capacity in bytes.
    pub total_bytes: u64,
    /// Free bytes.
    pub free_bytes: u64,
    /// Cluster size in bytes.
    pub cluster_bytes: u64,
    /// What went wrong.
    pub message: String,
    /// The target this status was taken on ([`TargetStatus::instance`]).
    /// `Ready` holds for that target only: SPDK lists an lvstore as soon as
    /// its examine loaded it, before its lvols are opened (and
    /// `bdev_lvol_get_lvols` leaves unopened lvols out), so a later target's
    /// listing says nothing of its lvols until the disk is ensured there
    /// again (after `bdev_wait_for_examine`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetInstance>,
}

impl DiskStatus {
    /// Whether the disk is ready on the running target `target`: ensured
    /// there (its lvstore loaded and every lvol of it opened), not only on
    /// an earlier one.
    pub fn ready_on(&self, target: Option<&TargetStatus>) -> bool {
        self.state == ObjectState::Ready
            && target.is_some_and(|t| t.state == ObjectState::Ready && self.target == Some(t.instance()))
    }
}

/// One run of a target process: its pid and talon's count of its restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TargetInstance {
    /// Its pid, when talon started or adopted it.
    pub pid: Option<u32>,
    /// Restarts since talon started.
    pub restarts: u32,
}

impl Spec for DiskStatus {
    const TYPE: &'static str = "DiskStatus";
    const NAMESPACE: &'static str = "engine";
}

/// What talon made on a disk (id: the disk), persisted (namespace `ledger`):
/// the lvstore it created there, or found there the first time it served the
/// disk. Checked at every later ensure: an lvstore is never made over a
/// device where the one recorded does not load (an I/O error, the target
/// stopping, a newer format), nor is another lvstore taken for it; only
/// `talon disk format` (the Disk's numbered `format` request) does, once.
/// Dropped when the disk is removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DiskIdentity {
    /// The lvstore name (`talon-<disk>`).
    pub lvstore: String,
    /// Its UUID: what must load from the device.
    pub lvstore_uuid: String,
    /// The device it is on, as talon named it then (a path, or `NVMe <bdf>`).
    pub device: String,
    /// Whether talon created it (false: it was there when talon first
    /// served the disk).
    pub created: bool,
    /// When it was recorded (RFC 3339).
    pub since: String,
    /// The last `format` request of the Disk that was carried out.
    #[serde(default)]
    pub format_served: u64,
}

impl Spec for DiskIdentity {
    const TYPE: &'static str = "DiskIdentity";
    const NAMESPACE: &'static str = "ledger";
}

/// One replica of a volume (id `<volume>-r<N>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReplicaStatus {
    /// The volume.
    pub volume: String,
    /// The disk it lives on.
    pub disk: String,
    /// The lvol bdev (UUID) and alias.
    pub bdev: String,
    /// `lvstore/lvol` alias.
    pub alias: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Allocated bytes (thin provisioning).
    pub allocated_bytes: u64,
    /// State.
    pub state: ObjectState,
    /// What went wrong.
    pub message: String,
}

impl Spec for ReplicaStatus {
    const TYPE: &'static str = "ReplicaStatus";
    const NAMESPACE: &'static str = "engine";
}

/// Which replicas of a V2 volume hold its newest data (id: the volume).
/// Persisted (namespace `ledger`): after a restart of talon or spdk_tgt a
/// replica that missed writes is rebuilt from one that did not, and is never
/// served on its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReplicaLedger {
    /// Replica indices (k of `<volume>-r<k>`) that are up to date.
    pub in_sync: Vec<u32>,
    /// The disk of each replica (index k), so that a replica whose disk is
    /// away is waited for, not made again elsewhere.
    #[serde(default)]
    pub disks: Vec<String>,
    /// When the set last changed (RFC 3339).
    pub changed: String,
    /// Why it last changed.
    pub reason: String,
    /// Snapshot name -> the replicas whose snapshot lvols were taken at one
    /// point in time (the export frozen). A revert or clone uses only these
    /// as they are and rebuilds the others; a snapshot not listed has one
    /// source (its lowest replica).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub snapshots: std::collections::BTreeMap<String, Vec<u32>>,
    /// Replica index -> the UUID of the lvol that another node serves as
    /// that replica, as its node reported it while the replica was up to
    /// date here (remote replicas with an `api`). A replica whose node now
    /// reports another lvol was made again there (its disk replaced or
    /// formatted): it holds none of the data and is rebuilt, never trusted.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub lvols: std::collections::BTreeMap<u32, String>,
    /// Replica index -> the UUID of the lvstore its lvol was in while the
    /// replica was up to date (local replicas). A replica whose lvol is in
    /// another lvstore now was made again there (its disk formatted or
    /// replaced, perhaps by a pass cut off before this ledger heard of it):
    /// rebuilt, never trusted.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub lvstores: std::collections::BTreeMap<u32, String>,
}

impl ReplicaLedger {
    /// The recorded point-in-time set of snapshot `snap`.
    pub fn snapshot_set(&self, snap: &str) -> Option<std::collections::BTreeSet<usize>> {
        self.snapshots
            .get(snap)
            .map(|ks| ks.iter().map(|k| *k as usize).collect())
    }

    /// The noted lvol of each remote replica ([`ReplicaLedger::lvols`]).
    pub fn lvol_notes(&self) -> std::collections::BTreeMap<usize, String> {
        by_index(&self.lvols)
    }

    /// The noted lvstore of each local replica ([`ReplicaLedger::lvstores`]).
    pub fn lvstore_notes(&self) -> std::collections::BTreeMap<usize, String> {
        by_index(&self.lvstores)
    }

    /// The up-to-date replica indices.
    pub fn in_sync_set(&self) -> std::collections::BTreeSet<usize> {
        self.in_sync.iter().map(|k| *k as usize).collect()
    }

    /// Replica index -> disk, for the replicas whose disk is known.
    pub fn placed(&self) -> std::collections::BTreeMap<usize, String> {
        self.disks
            .iter()
            .enumerate()
            .filter(|(_, d)| !d.is_empty())
            .map(|(k, d)| (k, d.clone()))
            .collect()
    }
}

/// A ledger's notes (replica index as stored -> UUID), by index.
fn by_index(m: &std::collections::BTreeMap<u32, String>) -> std::collections::BTreeMap<usize, String> {
    m.iter().map(|(k, u)| (*k as usize, u.clone())).collect()
}

impl Spec for ReplicaLedger {
    const TYPE: &'static str = "ReplicaLedger";
    const NAMESPACE: &'static str = "ledger";
}

/// Bdev events of spdk_tgt (id `spdk`), counted from its notify library: a
/// change wakes the volume controller (a raid member that went away, or a
/// replica's lvol that came back and that SPDK's examine may be rebuilding
/// in full).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SpdkEvents {
    /// bdev_unregister events seen since talon started.
    pub bdev_unregistered: u64,
    /// bdev_register events seen since talon started.
    #[serde(default)]
    pub bdev_registered: u64,
    /// The last bdev registered or unregistered.
    pub last_bdev: String,
}

impl Spec for SpdkEvents {
    const TYPE: &'static str = "SpdkEvents";
    const NAMESPACE: &'static str = "engine";
}

/// How a volume is exported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Export {
    /// `nvme-tcp` or `iscsi`.
    pub transport: String,
    /// Listen address.
    pub address: String,
    /// Port.
    pub port: u16,
    /// Subsystem NQN (NVMe/TCP) or target IQN (iSCSI).
    pub name: String,
    /// LUN (iSCSI) or namespace id (NVMe).
    pub lun: u32,
    /// The initiators allowed to connect (host NQNs or initiator IQNs): the
    /// hosts the volume is attached to and the node's `allowedHosts`; nobody
    /// else can.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

/// The engine of a volume (id = volume name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EngineStatus {
    /// Which engine serves it.
    pub engine: Engine,
    /// State.
    pub state: ObjectState,
    /// Size in bytes as served.
    pub size_bytes: u64,
    /// The bdev (V2) or backing file (V1) the export serves.
    pub device: String,
    /// Replica ids in the engine.
    pub replicas: Vec<String>,
    /// Exports (NVMe/TCP and/or iSCSI).
    pub exports: Vec<Export>,
    /// What went wrong, or what it is doing.
    pub message: String,
    /// A standby volume's data: the backup it holds (restored from its
    /// backup volume), until the volume is activated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_backup: Option<String>,
    /// A volume made with a copy of a snapshot (`Volume.copyFrom`): how far
    /// the copy is (100 once the volume is served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<CopyProgress>,
}

/// How far the copy of a snapshot into a new volume is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CopyProgress {
    /// The snapshot copied (`<volume>@<snapshot>`).
    pub from: String,
    /// Bytes of the snapshot read so far.
    pub bytes_copied: u64,
    /// The snapshot's bytes.
    pub bytes_total: u64,
    /// `bytesCopied` of `bytesTotal`, 0 to 100 (100 only once the copy is whole).
    pub percent: u8,
}

impl Spec for EngineStatus {
    const TYPE: &'static str = "EngineStatus";
    const NAMESPACE: &'static str = "engine";
}

/// A request from a volume's engine node to the node that serves one of its
/// replicas (`serveReplica`), made through the peer API: get the served
/// replica ready for the next shallow copy of a thin rebuild (id = volume).
/// Not persisted: a request dies with the process that was to answer it, so
/// a restart never acts on an old one (the engine asks again).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RebuildDest {
    /// The source replica's snapshots, oldest first: the dest keeps the ones
    /// it holds of them in that order from the first on, and its head is
    /// made empty right above them.
    pub chain: Vec<String>,
    /// Raised by each request; the answer carries the one it answers.
    pub generation: u64,
}

impl Spec for RebuildDest {
    const TYPE: &'static str = "RebuildDest";
    const NAMESPACE: &'static str = "engine";
}

/// The answer to a [`RebuildDest`] (id = volume).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RebuildDestStatus {
    /// The request's generation this answers.
    pub generation: u64,
    /// How many snapshots of the chain the replica holds, from the first on.
    pub shared: u32,
    /// Snapshots of the replica that are not among those: nothing was made
    /// again while they are there (the engine deletes them first, through
    /// `snapshot_delete`, which keeps this node's Snapshot resources right).
    pub stale: Vec<String>,
    /// Whether the head was made again by this request (its export's
    /// namespace went and came back: an engine attached to it attaches again).
    pub reset: bool,
    /// Empty, or why the request failed.
    pub message: String,
}

impl Spec for RebuildDestStatus {
    const TYPE: &'static str = "RebuildDestStatus";
    const NAMESPACE: &'static str = "engine";
}

/// A snapshot as the engine holds it (id = snapshot id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// The volume.
    pub volume: String,
    /// Which engine.
    pub engine: Engine,
    /// State.
    pub state: ObjectState,
    /// Snapshot bdevs (V2) or reflinked file (V1).
    pub objects: Vec<String>,
    /// When it was taken (RFC 3339).
    pub created: String,
    /// What went wrong.
    pub message: String,
}

impl Spec for SnapshotStatus {
    const TYPE: &'static str = "SnapshotStatus";
    const NAMESPACE: &'static str = "engine";
}

/// An lvol in one of talon's lvstores that nothing in the store owns (id:
/// its alias `talon-<disk>/<lvol>`): a talon name (`<volume>-r<k>`, its
/// snapshots and revert markers) with no Volume of that name, or another
/// name with no LonghornReplica it belongs to, as after a lost state store.
/// Reported (and logged once), never deleted, until `orphan_remove` asks for
/// it (an [`OrphanRemoval`](crate::resources::config::OrphanRemoval)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OrphanLvol {
    /// The disk whose lvstore holds it.
    pub disk: String,
    /// The lvol's name in the lvstore.
    pub lvol: String,
    /// The lvol's UUID (what a removal names, so that another lvol made
    /// later under the same name is never taken for it).
    pub uuid: String,
    /// What its name says it belonged to, e.g. `volume v1 replica 0`.
    pub was: String,
    /// A snapshot (read-only).
    pub snapshot: bool,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Clusters it holds, in bytes.
    pub allocated_bytes: u64,
    /// The lvols that are clones of it: it can be removed only after them.
    pub clones: Vec<String>,
    /// Why the last removal asked for did not happen.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl Spec for OrphanLvol {
    const TYPE: &'static str = "OrphanLvol";
    const NAMESPACE: &'static str = "engine";
}
