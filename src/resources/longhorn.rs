//! Longhorn's V2 instances as talon resources: desired state written by the
//! instance-manager gRPC service (`crate::longhorn`), persisted in the
//! `config` namespace, realized by `engine.LonghornController`, which reports
//! `LonghornInstanceStatus`.
//!
//! ```text
//!   InstanceCreate/ReplicaCreate ──> config/LonghornReplica <name>   (lvol talon-<disk>/<name>, NVMe/TCP export)
//!   InstanceCreate engine        ──> config/LonghornEngine <name>    (raid1 <name> over the replicas, export)
//!   InstanceCreate engine-frontend ─> config/LonghornEngineFrontend  (kernel NVMe/TCP, /dev/longhorn/<volume>)
//!   DiskCreate                   ──> config/Disk <disk>               (talon's own disk, lvstore talon-<disk>)
//!                                         │ engine.LonghornController
//!                                         v
//!                              engine/LonghornInstanceStatus <name>
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::runtime::Spec;

/// A Longhorn replica (id: the replica's instance name): a thin lvol
/// `talon-<disk>/<name>` exported over NVMe/TCP as
/// `nqn.2023-01.io.longhorn.spdk:<name>` unless an engine on this node holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornReplica {
    /// The Longhorn volume.
    pub volume: String,
    /// The talon Disk (Longhorn's disk name) whose lvstore holds the lvol.
    pub disk: String,
    /// Size in bytes (a multiple of the lvstore's cluster size).
    pub size_bytes: u64,
    /// The first port of the replica's range; the export listens on it.
    pub port_start: u16,
    /// The last port of the range.
    pub port_end: u16,
    /// Set by a delete with `cleanup_required`: the lvol goes with the instance.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cleanup: bool,
    /// The last revert another node's engine asked for
    /// (`ReplicaSnapshotRevert`): the controller makes the head a clone of
    /// the snapshot once per request number, unexported meanwhile, and
    /// reports it in `LonghornInstanceStatus.revert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert: Option<RevertRequest>,
    /// The last rebuild another node's engine starts into this replica
    /// (`ReplicaRebuildingDstStart`): unless the head is already empty right
    /// above the snapshots it shares with the source's chain, the controller
    /// makes it so (the snapshots not shared deleted), unexported meanwhile,
    /// once per request number, and reports it in
    /// `LonghornInstanceStatus.dstStart`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst_start: Option<DstStartRequest>,
    /// The creation time and labels of this replica's snapshots, as the
    /// engine that took them gave them (`ReplicaSnapshotCreate`'s timestamp
    /// and labels; this node's engine writes its own): kept with the
    /// replica, so an engine of the volume made later, on any node, lists
    /// them as the engine that took them did.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshot_info: BTreeMap<String, SnapshotInfo>,
    /// The last ask of another node's engine to reach this replica while an
    /// engine here holds it directly (`ReplicaGet` with
    /// `proto::peer::SHARE_FOR`): the engine here puts its member behind the
    /// replica's export while asks keep coming (see
    /// `controllers::longhorn::shared`). Absent in records written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_for: Option<ShareAsk>,
}

/// Another node's engine asking to reach a replica through its export
/// ([`LonghornReplica::shared_for`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ShareAsk {
    /// The asking engine (a Longhorn engine name).
    pub engine: String,
    /// When it last asked, milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// A numbered start of a rebuild into a replica ([`LonghornReplica::dst_start`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DstStartRequest {
    /// The request number (each call takes a greater one).
    pub request: u64,
    /// The session ([`new_session`]) of the talon that wrote it: only that
    /// session carries it out.
    #[serde(default)]
    pub session: u64,
    /// The source's snapshots, oldest first (Longhorn snapshot names).
    pub chain: Vec<String>,
    /// A linked clone's rebuild: the chain starts on this entrypoint beside
    /// the replica (made if missing). Absent: on nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<CloneBase>,
}

/// The engine a linked clone's base replica serves in (Longhorn's
/// `LinkedCloneSource.engine_name`, `engine_address`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LinkEngine {
    /// The engine.
    pub engine: String,
    /// Its address (storage IP and port).
    pub address: String,
}

/// Where a linked clone's rebuilt replica starts: the entrypoint of
/// snapshot `snapshot` of `replica`, the replica of the clone's source
/// volume beside it (same node, same lvstore; Longhorn's
/// `LinkedCloneSource`). Its source reads the same snapshot through its own
/// entrypoint beside it, so the dest needs only the source's own snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CloneBase {
    /// The source volume's replica beside the dest.
    pub replica: String,
    /// The snapshot the clone reads.
    pub snapshot: String,
}

impl CloneBase {
    /// The alias of the snapshot it names in lvstore `lvs`.
    pub fn snapshot_in(&self, lvs: &str) -> String {
        format!("{lvs}/{}", snapshot_lvol(&self.replica, &self.snapshot))
    }
}

/// What the controller made of a [`DstStartRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DstStartStatus {
    /// The request number.
    pub request: u64,
    /// What failed; empty: the head is ready for the rebuild.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// A numbered revert of an instance to one of its snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RevertRequest {
    /// The request number (each call takes a greater one).
    pub request: u64,
    /// The session ([`new_session`]) of the talon that wrote it: only that
    /// session carries it out.
    #[serde(default)]
    pub session: u64,
    /// The Longhorn snapshot name.
    pub snapshot: String,
}

/// A numbered snapshot of an engine ([`LonghornEngine::snapshot_requests`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotRequest {
    /// The request number (each call takes a greater one).
    pub request: u64,
    /// The session ([`new_session`]) of the talon that wrote it: only that
    /// session carries it out (no call waits on an older one's).
    pub session: u64,
    /// The snapshot's creation time and labels, handed to every replica's
    /// node with it (kept there, [`LonghornReplica::snapshot_info`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<SnapshotInfo>,
}

/// What the controller made of a snapshot request ([`SnapshotRequest`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// The request number carried out.
    pub request: u64,
    /// Why the snapshot was not taken (nothing of it is left); empty: every
    /// replica in service holds it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// The controller that realizes Longhorn's instances
/// (`engine.LonghornController`), also its finalizer on them.
pub const CONTROLLER: &str = "engine.LonghornController";

/// `<replica>-snap-<snapshot>`: the lvol of a replica's snapshot (Longhorn's
/// V2 name).
pub fn snapshot_lvol(replica: &str, snapshot: &str) -> String {
    format!("{replica}-snap-{snapshot}")
}

impl Spec for LonghornReplica {
    const TYPE: &'static str = "LonghornReplica";
    const NAMESPACE: &'static str = "config";
}

/// A Longhorn engine (id: the engine's instance name): a raid1 bdev `<name>`
/// over the replicas of `replicaAddressMap` (a replica of this node enters as
/// its lvol, a remote one through `bdev_nvme_attach_controller`), exported as
/// `nqn.2023-01.io.longhorn.spdk:volume-<volume>` on `port`. One replica: the
/// member is exported without a raid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornEngine {
    /// The Longhorn volume.
    pub volume: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Replica instance name -> `ip:port` of its export.
    pub replica_address_map: BTreeMap<String, String>,
    /// The export's port.
    pub port: u16,
    /// Longhorn's frontend name (`spdk-tcp-nvmf`, `spdk-tcp-blockdev`, or empty).
    #[serde(default)]
    pub frontend: String,
    /// Most snapshots the volume may hold (`VolumeSnapshotMaxCountSet`); 0:
    /// no limit.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub snapshot_max_count: i32,
    /// Cap of a rebuild's writes to its target member, MB/s
    /// (`ReplicaRebuildingQosSet`, SPDK's `bdev_set_qos_limit`); 0: none.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub rebuild_qos_mbps: i64,
    /// Replicas `ReplicaAdd` asked to join (replica -> request number): the
    /// controller starts one rebuild per request number
    /// (`LonghornInstanceStatus.rebuildsStarted`), so a rebuild that fails
    /// stays failed (mode ERR) until the next `ReplicaAdd`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rebuild_requests: BTreeMap<String, u64>,
    /// Replicas of a linked clone that `ReplicaAdd` asked to join (replica
    /// -> the replica of the clone's source volume beside it, its
    /// `linked_clone_source`): rebuilt over that replica's entrypoint, thin.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rebuild_links: BTreeMap<String, String>,
    /// For each replica of `rebuild_links`: the engine that serves the
    /// replica beside it, and that engine's address (`linked_clone_source`
    /// `engine_name`, `engine_address`), asked again right before the
    /// rebuild's switch.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rebuild_link_engines: BTreeMap<String, LinkEngine>,
    /// Snapshots `SnapshotRemove` marked removed (SPDK keeps a snapshot with
    /// more than one child): `SnapshotPurge` deletes them once it can.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub removed_snapshots: BTreeSet<String>,
    /// Replicas `ReplicaModeUpdate` set ERR (longhorn-manager's snapshot
    /// checksum vote found their data differs from the others'): out of the
    /// raid1 and never taken back into it (a raid1 made again leaves them
    /// out too). The mark outlives a `ReplicaRemove`: a `ReplicaAdd` of the
    /// replica deletes its snapshots, clears the mark and rebuilds it.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub failed_replicas: BTreeSet<String>,
    /// The last `SnapshotPurge` or `SnapshotRemove` asked for (a request
    /// number; 0: none): the controller deletes the snapshots of
    /// `removedSnapshots` that SPDK lets go, once per number, and reports it
    /// in `LonghornInstanceStatus.purge`.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub purge_request: u64,
    /// The last `SnapshotRevert` asked for: the controller takes the raid1
    /// down, makes every replica's head a clone of the snapshot (another
    /// node's through its `ReplicaSnapshotRevert`) and makes the raid1 again,
    /// once per request number, and reports it in
    /// `LonghornInstanceStatus.revert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert: Option<RevertRequest>,
    /// Snapshots `VolumeSnapshot` asks for (snapshot name -> request): the
    /// controller takes each of every replica in service at one instant,
    /// once per request number, and reports it in
    /// `LonghornInstanceStatus.snapshots`; the call removes its request when
    /// it has the answer.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshot_requests: BTreeMap<String, SnapshotRequest>,
    /// What Longhorn lists of each snapshot taken through this engine that
    /// SPDK v26.05 keeps nowhere an RPC reports (no lvol xattr RPC upstream):
    /// its creation time and labels. longhorn-manager's snapshot controller
    /// waits for `created` before it lets a volume detach.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshot_info: BTreeMap<String, SnapshotInfo>,
    /// The ANA state of the export's listeners
    /// (`EngineSetTargetListenerANAState`, which the engine-frontend's node
    /// calls while Longhorn moves the engine): set at every (re)export and
    /// after every freeze, so a restart of talon or spdk_tgt never makes an
    /// engine a host has left optimized again.
    #[serde(default, skip_serializing_if = "AnaState::is_optimized")]
    pub ana_state: AnaState,
}

/// The ANA state of an engine's export, as Longhorn spells it
/// (`EngineSetTargetListenerANAState`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AnaState {
    /// The preferred path: I/O is served.
    #[default]
    Optimized,
    /// A path I/O is served on when no optimized one is left.
    NonOptimized,
    /// No I/O is served: every command fails with a path error the host
    /// retries on another path.
    Inaccessible,
}

impl AnaState {
    /// Longhorn's spelling (`optimized`, `non-optimized`, `inaccessible`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Optimized => "optimized",
            Self::NonOptimized => "non-optimized",
            Self::Inaccessible => "inaccessible",
        }
    }

    /// Longhorn's spelling read back; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Optimized, Self::NonOptimized, Self::Inaccessible]
            .into_iter()
            .find(|a| a.as_str() == s)
    }

    fn is_optimized(&self) -> bool {
        *self == Self::Optimized
    }
}

/// A snapshot's creation time and labels ([`LonghornEngine::snapshot_info`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotInfo {
    /// RFC 3339, seconds, UTC (as Longhorn's `created`).
    pub created: String,
    /// Longhorn's snapshot labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

impl Spec for LonghornEngine {
    const TYPE: &'static str = "LonghornEngine";
    const NAMESPACE: &'static str = "config";
}

/// A Longhorn engine-frontend (id: its instance name): the engine's export
/// attached through the kernel NVMe/TCP initiator, `/dev/longhorn/<volume>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornEngineFrontend {
    /// The Longhorn volume.
    pub volume: String,
    /// The engine instance it attaches.
    pub engine_name: String,
    /// The engine's export, `ip:port`.
    pub target_address: String,
    /// Longhorn's frontend name.
    #[serde(default)]
    pub frontend: String,
    /// Size in bytes.
    #[serde(default)]
    pub size_bytes: u64,
    /// I/O queues of the NVMe/TCP connect (a kernel attach, `spdk-tcp-blockdev`) as the
    /// manager asked (`nvme_tcp_nr_io_queues`); 0: talon's bounded default
    /// ([`crate::attach::nvme_tcp::DEFAULT_IO_QUEUES`]), never one per host CPU.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub nr_io_queues: u32,
    /// The switch-over to another engine's export that longhorn-manager is
    /// carrying out (`InstanceSwitchOverTarget`, phase by phase): the phase
    /// reached, kept so that a phase asked again, after a restart of talon
    /// too, carries on from it. `None` once the target is the new engine's
    /// (`promoting` rewrote `engineName` and `targetAddress`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switchover: Option<FrontendSwitchover>,
}

/// A switch-over of an engine-frontend's target in progress
/// ([`LonghornEngineFrontend::switchover`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FrontendSwitchover {
    /// The new engine.
    pub engine_name: String,
    /// Its export, `ip:port`.
    pub target_address: String,
    /// The last phase carried out to its end; `None`: `preparing` began
    /// (the new path may be being connected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<SwitchoverPhase>,
}

/// Longhorn's switch-over phases of an engine-frontend, in their order
/// (`switchover_phase` of `InstanceSwitchOverTarget`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SwitchoverPhase {
    /// The new engine's listener made non-optimized (a kernel path to it
    /// connected first): a path the host may use, not the preferred one.
    Preparing,
    /// The old engine's listener made inaccessible: I/O moves to the new.
    Switching,
    /// The new engine's listener made optimized and the frontend's target
    /// the new engine.
    Promoting,
}

impl SwitchoverPhase {
    /// Every phase, in order.
    pub const ALL: [Self; 3] = [Self::Preparing, Self::Switching, Self::Promoting];

    /// Longhorn's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Preparing => "preparing",
            Self::Switching => "switching",
            Self::Promoting => "promoting",
        }
    }

    /// Longhorn's spelling read back; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

impl Spec for LonghornEngineFrontend {
    const TYPE: &'static str = "LonghornEngineFrontend";
    const NAMESPACE: &'static str = "config";
}

/// Which Longhorn instance type a status is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceKind {
    /// `replica`.
    Replica,
    /// `engine`.
    Engine,
    /// `engine-frontend`.
    EngineFrontend,
}

impl InstanceKind {
    /// Longhorn's name of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replica => "replica",
            Self::Engine => "engine",
            Self::EngineFrontend => "engine-frontend",
        }
    }
}

/// Longhorn's instance states that talon reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    /// Being made.
    Starting,
    /// Serving.
    Running,
    /// Being removed.
    Stopping,
    /// Not serving; `message` says why.
    Error,
}

impl InstanceState {
    /// Longhorn's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Error => "error",
        }
    }
}

/// What the engine made of a Longhorn instance (id: the instance name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornInstanceStatus {
    /// The instance type.
    pub kind: InstanceKind,
    /// Its state.
    pub state: InstanceState,
    /// Why it is not running, or what a running one could not do yet (it is
    /// tried again).
    #[serde(default)]
    pub message: String,
    /// The bdev that holds or serves the data (lvol alias, raid or member).
    #[serde(default)]
    pub bdev: String,
    /// The lvol or raid UUID (Longhorn's instance uuid).
    #[serde(default)]
    pub uuid: String,
    /// The NVMe/TCP subsystem that exports it, when exported.
    #[serde(default)]
    pub nqn: String,
    /// Where it is exported (`ip:port`), or the device of an engine-frontend.
    #[serde(default)]
    pub endpoint: String,
    /// Allocated bytes (replicas).
    #[serde(default)]
    pub allocated_bytes: u64,
    /// Replicas: the lvol's size in bytes, as served (grown to the spec's
    /// `sizeBytes` by the controller; an expansion waits for it).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub size_bytes: u64,
    /// Engines: the `rebuildRequests` whose rebuild was started (replica ->
    /// request number).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rebuilds_started: BTreeMap<String, u64>,
    /// Engines: the `rebuildRequests` whose rebuild was seen to end with the
    /// replica in the raid (replica -> request number). A replica with a
    /// request not here is never a member when the raid is made again (after
    /// a restart of spdk_tgt): it may hold half a rebuild.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rebuilds_done: BTreeMap<String, u64>,
    /// Engines: why a requested rebuild could not start, by replica.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rebuild_errors: BTreeMap<String, String>,
    /// Engines: the replicas being rebuilt thin (out of the raid until they
    /// equal their source; WO for Longhorn), with the percent copied.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub thin_rebuilds: BTreeMap<String, u32>,
    /// Engines: the replica each thin rebuild copies from, by replica; kept
    /// with `rebuildsDone` once it ended, until the next request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rebuild_sources: BTreeMap<String, String>,
    /// Engines: the rebuild running now (`<replica> <percent>% <bytes>/<total> bytes`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rebuild: String,
    /// Engines and engine-frontends: the version of the `LonghornEngine`
    /// (`LonghornEngineFrontend`) this status was made from (a call that
    /// changed the spec waits for it).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub observed_version: u64,
    /// Engines: the replicas of the map served from other nodes (attached
    /// as NVMe/TCP controllers named after them), so one that leaves the
    /// map is detached.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub remote_members: BTreeSet<String>,
    /// Engines: the last purge carried out (`LonghornEngine.purgeRequest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge: Option<PurgeStatus>,
    /// Engines and replicas: the last revert carried out
    /// (`LonghornEngine.revert`, `LonghornReplica.revert`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert: Option<RevertStatus>,
    /// Replicas: the last rebuild start carried out (`LonghornReplica.dstStart`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst_start: Option<DstStartStatus>,
    /// Engines: the snapshot requests carried out, by snapshot name (while
    /// `LonghornEngine.snapshotRequests` holds them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshots: BTreeMap<String, SnapshotStatus>,
    /// Engines: the ANA state the export's listeners were seen set to
    /// (`LonghornEngine.anaState`); `None` while not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ana_state: Option<AnaState>,
    /// Engines: why the export's listeners could not be set to
    /// `LonghornEngine.anaState` (the last try).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ana_error: String,
    /// Engine-frontends of `spdk-tcp-blockdev`: the NVMe/TCP paths of the
    /// volume's subsystem (`ip:port`) the host's kernel has live: the
    /// target's, and a switch-over's new engine's once `preparing`
    /// connected it.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub paths: BTreeSet<String>,
}

/// What the controller made of a revert request ([`RevertRequest`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RevertStatus {
    /// The request number.
    pub request: u64,
    /// The snapshot.
    pub snapshot: String,
    /// Why nothing was reverted (a replica being rebuilt, a frontend, a
    /// replica without the snapshot); the request is over.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub refused: String,
    /// What failed after the first head was touched: the replicas may
    /// differ, so the instance is not served and every reconcile tries the
    /// request again until it is done.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// Engines: the replicas of other nodes whose node was asked to revert
    /// them and is still at it (asked at once, `proto::peer::AT_ONCE`). The
    /// raid1 stays down, this node's heads are not touched yet, and every
    /// reconcile asks them again until none is left.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<String>,
}

/// What one start of `talon serve` shares between its Longhorn services and
/// `engine.LonghornController` ([`new_session`]): the session token, and the
/// engines in a thin rebuild's switch. Made by the serve and handed to both;
/// gone with the process, as what it says is.
#[derive(Debug, Clone)]
pub struct Session {
    id: u64,
    switches: std::sync::Arc<std::sync::Mutex<BTreeMap<String, SwitchModes>>>,
    /// The count of changes made to spdk_tgt by the clients of this session (the Longhorn
    /// services' and `engine.LonghornController`'s): the services' listing for the manager's
    /// polls is used again only while it stands still.
    spdk_changes: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// A new session, its token nonzero, one per start of `talon serve` (its
/// Longhorn services and `engine.LonghornController` share it). A revert or
/// a rebuild start is carried out only in the session whose call wrote it
/// and waits for it: what says it was done (`LonghornInstanceStatus`) is
/// observed state, gone with a restart, while the request stays in the
/// persisted spec; carried out again after a restart it would undo every
/// write since (a revert) or empty a rebuilt replica (a rebuild start). A
/// call cut off by a restart failed for its caller, who calls again.
pub fn new_session() -> Session {
    Session {
        id: new_token(),
        switches: std::sync::Arc::default(),
        spdk_changes: std::sync::Arc::default(),
    }
}

fn new_token() -> u64 {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| {
            u64::try_from(d.as_nanos() % u128::from(u64::MAX)).unwrap_or(0)
        });
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (nanos ^ (u64::from(std::process::id()) << 40) ^ (n << 56)) | 1
}

/// An engine in a thin rebuild's switch: the replica joining and those in
/// service (by replica name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchModes {
    /// The replica the switch takes into the raid.
    pub joining: String,
    /// The replicas in service before it.
    pub in_service: BTreeSet<String>,
}

impl Session {
    /// The token the requests of this session carry.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The count its SPDK clients share (`SpdkClient::sharing_changes`).
    pub fn spdk_changes(&self) -> &std::sync::Arc<std::sync::atomic::AtomicU64> {
        &self.spdk_changes
    }

    fn switches(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SwitchModes>> {
        self.switches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A thin rebuild's switch of `engine` starts, from raid delete to
    /// export: while it lasts the raid is missing or being assembled, and
    /// `ReplicaList` reports the modes from before it (the manager must not
    /// take the replicas in service for failed). Ends at
    /// [`Session::switch_done`]: called by the switch that joins, or, after
    /// one that failed, by the reconcile that finds the raid there again.
    pub fn start_switch(&self, engine: &str, modes: SwitchModes) {
        self.switches().insert(engine.to_owned(), modes);
    }

    /// The switch of `engine` is over: its raid is there again.
    pub fn switch_done(&self, engine: &str) {
        self.switches().remove(engine);
    }

    /// The modes `engine` had when its switch started, while it lasts.
    pub fn switch_of(&self, engine: &str) -> Option<SwitchModes> {
        self.switches().get(engine).cloned()
    }
}

impl RevertStatus {
    /// Whether request `r` still has to be carried out given this status
    /// (`None`: nothing carried out yet): a request of this `session`
    /// ([`new_session`]) with a newer number, or the same one that failed
    /// half way.
    pub fn pending(done: Option<&RevertStatus>, r: &RevertRequest, session: u64) -> bool {
        if r.session != session {
            return false;
        }
        match done {
            None => true,
            Some(d) => {
                d.request < r.request
                    || (d.request == r.request && (!d.error.is_empty() || !d.waiting.is_empty()))
            }
        }
    }

    /// Whether request number `request` is carried out as far as its
    /// callers are concerned: answered (done, refused or failed half way),
    /// not still waiting on other nodes.
    pub fn answers(&self, request: u64) -> bool {
        self.request > request || (self.request == request && self.waiting.is_empty())
    }
}

/// What the controller made of a purge request ([`LonghornEngine::purge_request`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PurgeStatus {
    /// The request number carried out.
    pub request: u64,
    /// Why nothing was purged (a replica being rebuilt); empty: it ran.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub refused: String,
    /// Removed snapshots deleted on every replica.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub deleted: BTreeSet<String>,
    /// Removed snapshots kept: more than one lvol depends on each (SPDK
    /// refuses to delete them until one goes).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub kept: BTreeSet<String>,
    /// What failed, per replica address (`tcp://ip:port`); a replica
    /// missing here had every deletion done.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, String>,
}

impl LonghornInstanceStatus {
    /// A status of `kind` in `state` (why: `message`), nothing else known.
    pub fn new(kind: InstanceKind, state: InstanceState, message: impl Into<String>) -> Self {
        Self {
            kind,
            state,
            message: message.into(),
            bdev: String::new(),
            uuid: String::new(),
            nqn: String::new(),
            endpoint: String::new(),
            allocated_bytes: 0,
            size_bytes: 0,
            rebuilds_started: BTreeMap::new(),
            rebuilds_done: BTreeMap::new(),
            rebuild_errors: BTreeMap::new(),
            thin_rebuilds: BTreeMap::new(),
            rebuild_sources: BTreeMap::new(),
            rebuild: String::new(),
            observed_version: 0,
            remote_members: BTreeSet::new(),
            purge: None,
            revert: None,
            dst_start: None,
            snapshots: BTreeMap::new(),
            ana_state: None,
            ana_error: String::new(),
            paths: BTreeSet::new(),
        }
    }
}

impl Spec for LonghornInstanceStatus {
    const TYPE: &'static str = "LonghornInstanceStatus";
    const NAMESPACE: &'static str = "engine";
}

/// An engine's revert that has begun and is not done (id: the engine),
/// persisted: written once the revert got past its checks and before its
/// raid1 goes, destroyed once every head is a clone of the snapshot. A
/// talon that restarts in between (its statuses gone, the request of an
/// older session) carries the revert on instead of serving a raid1 over
/// heads some of which are reverted and some not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornRevertLedger {
    /// The engine's revert request number ([`RevertRequest::request`]).
    pub request: u64,
    /// The Longhorn snapshot reverted to.
    pub snapshot: String,
    /// The engine's volume: an engine of it made again (after a detach, or
    /// under another name) carries the revert on before it serves.
    #[serde(default)]
    pub volume: String,
    /// The engine's replicas on this node when the revert began: the ledger
    /// outlives its engine while this node holds an lvol of one of them.
    #[serde(default)]
    pub replicas: Vec<String>,
}

impl Spec for LonghornRevertLedger {
    const TYPE: &'static str = "LonghornRevertLedger";
    const NAMESPACE: &'static str = "ledger";
}

/// The snapshot times and labels of a Longhorn replica whose instance is
/// deleted and whose lvol is kept (id: the replica): `InstanceDelete`
/// without cleanup, as Longhorn's every detach does. Written when the
/// replica's record goes ([`LonghornReplica::snapshot_info`]), read back into
/// the record when the replica is made again under its name on the same disk,
/// destroyed with its lvol (a delete with cleanup). SPDK v26.05 keeps no
/// snapshot time an RPC reports: without it every engine made after a detach
/// lists the volume's snapshots without their creation time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornSnapshotLedger {
    /// The replica's volume.
    pub volume: String,
    /// The replica's disk (where its lvol stays).
    pub disk: String,
    /// Snapshot name -> its time and labels.
    pub snapshot_info: BTreeMap<String, SnapshotInfo>,
}

impl Spec for LonghornSnapshotLedger {
    const TYPE: &'static str = "LonghornSnapshotLedger";
    const NAMESPACE: &'static str = "ledger";
}

/// The current members of a Longhorn engine (id: the engine), persisted:
/// the replicas that hold every write the engine took, each with the
/// `rebuildRequests` number it is current at (0: a member since the engine
/// was created). Seeded from the replica address map before the engine first
/// serves (every replica of a new engine is RW, one a `ReplicaAdd` asked
/// for is not current until its rebuild ended); a member that leaves the
/// raid1 (faulted, removed) is written out before the engine's status says
/// so; a rebuilt one is written in once its rebuild ended (the switch).
/// When the raid1 is made again (a restart of spdk_tgt or of talon) only
/// these replicas are members: any other is ERR to longhorn-manager, which
/// rebuilds it. Destroyed with the engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornMemberLedger {
    /// The engine's volume.
    pub volume: String,
    /// Replica -> the `rebuildRequests` number it is current at (0: since
    /// the engine was created). A later `ReplicaAdd` of it (a greater
    /// number) makes the entry stale: not current until that rebuild ends.
    pub current: BTreeMap<String, u64>,
    /// Replica -> the UUID of the lvstore its lvol was in when it was
    /// current (noted when the ledger is seeded or a pass finds it missing,
    /// and when the raid1 serves it; another node's replica as its node
    /// reports it, asked when the raid1 is to be made or none is noted). A
    /// current replica whose lvol is now in another lvstore (its disk
    /// formatted or replaced: the lvol made again, empty) is not current:
    /// left out of a raid1 made again, and rebuilt.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lvstores: BTreeMap<String, String>,
    /// Why it last changed, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl LonghornMemberLedger {
    /// Whether `replica` of engine `e` is current: in its replica map
    /// (`ReplicaRemove` takes it out) and listed at the number of its latest
    /// `ReplicaAdd` (0 without one).
    pub fn is_current(&self, e: &LonghornEngine, replica: &str) -> bool {
        let asked = e.rebuild_requests.get(replica).copied().unwrap_or(0);
        e.replica_address_map.contains_key(replica) && self.current.get(replica) == Some(&asked)
    }
}

impl Spec for LonghornMemberLedger {
    const TYPE: &'static str = "LonghornMemberLedger";
    const NAMESPACE: &'static str = "ledger";
}

/// A snapshot of an engine being taken (id: `<engine>@<snapshot>`),
/// persisted: written before the engine's export is frozen, destroyed once
/// the take has answered (its copies kept on every replica in service, or
/// deleted from every one). One found at the start of a pass was left by a
/// talon that stopped in between, or by a failed take whose copies could
/// not all be deleted: its copies may be of two instants (this node's, made
/// inside the freeze, and another node's that may still land after it, for
/// up to the remote call's time-out). They are deleted on every replica it
/// names, again at each pass until [`Self::settled_ms`] has passed, before
/// a snapshot of that name is taken again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornSnapshotTake {
    /// The engine.
    pub engine: String,
    /// The Longhorn snapshot name.
    pub snapshot: String,
    /// This node's replicas taken -> their disk.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub local: BTreeMap<String, String>,
    /// Other nodes' replicas taken -> their address (`ip:port`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub remote: BTreeMap<String, String>,
    /// When the take began, milliseconds since the Unix epoch.
    pub began_ms: u64,
    /// When no copy of it can land any more (a remote node's call has timed
    /// out), milliseconds since the Unix epoch: a clean-up done after this is
    /// the last.
    pub settled_ms: u64,
    /// What the last clean-up left, in words (empty: none ran yet, or it
    /// left nothing).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub left: String,
    /// After a clean-up that left something: when the next may run,
    /// milliseconds since the Unix epoch (a node that does not answer holds
    /// a pass up to its connect time-out; 0: at the next pass).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl LonghornSnapshotTake {
    /// The id of engine `engine`'s take of `snapshot`.
    pub fn id(engine: &str, snapshot: &str) -> String {
        format!("{engine}@{snapshot}")
    }
}

impl Spec for LonghornSnapshotTake {
    const TYPE: &'static str = "LonghornSnapshotTake";
    const NAMESPACE: &'static str = "ledger";
}

/// A snapshot clone into an engine of this node (id: the engine), persisted
/// (`SnapshotClone`): written when the copy starts, its outcome when it
/// ends. After a restart of talon `SnapshotCloneStatus` reports a finished
/// clone from it, and starts one that was running again (the manager sees
/// `in_progress`, never "" or an error for it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornCloneLedger {
    /// The engine's volume (an engine made again under its name for another
    /// volume is not this clone's).
    pub volume: String,
    /// The Longhorn snapshot cloned.
    pub snapshot: String,
    /// Its volume.
    pub from_volume: String,
    /// Its volume's engine (`from_engine_name`).
    pub from_engine: String,
    /// That engine's node (`from_engine_address`; empty: not given).
    #[serde(default)]
    pub from_engine_address: String,
    /// Longhorn's clone mode number (`CloneMode`).
    #[serde(default)]
    pub mode: i32,
    /// The source replica's address (`from_replica_address` of the status).
    #[serde(default)]
    pub from: String,
    /// How it was done: `local` (a replica of this node), `remote <replica>`
    /// (exposed by its node), `linked` (an lvol clone).
    #[serde(default)]
    pub how: String,
    /// `in_progress`, `complete` or `error` (Longhorn's words).
    pub state: String,
    /// Why it failed.
    #[serde(default)]
    pub error: String,
    /// The shallow copy inside spdk_tgt last started for it (a local source,
    /// `mover::copy::within`): the next try waits until it no longer runs,
    /// so two copies never write one engine at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_op: Option<u32>,
}

impl Spec for LonghornCloneLedger {
    const TYPE: &'static str = "LonghornCloneLedger";
    const NAMESPACE: &'static str = "ledger";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Longhorn's three spellings and nothing else (SPDK's `non_optimized`
    /// is not Longhorn's); an engine recorded before `anaState` existed, or
    /// optimized, is stored without it and read back optimized.
    #[test]
    fn an_engines_ana_state_is_longhorns_word_and_optimized_unless_set() {
        for a in [
            AnaState::Optimized,
            AnaState::NonOptimized,
            AnaState::Inaccessible,
        ] {
            assert_eq!(AnaState::parse(a.as_str()), Some(a));
            assert_eq!(serde_json::to_value(a).expect("json"), a.as_str());
        }
        for bad in ["non_optimized", "Optimized", "change", ""] {
            assert_eq!(AnaState::parse(bad), None, "{bad}");
        }
        let old = serde_json::json!({
            "volume": "v", "sizeBytes": 1048576, "replicaAddressMap": {}, "port": 20000
        });
        let mut e: LonghornEngine = serde_json::from_value(old.clone()).expect("an engine from before");
        assert_eq!(e.ana_state, AnaState::Optimized);
        assert_eq!(serde_json::to_value(&e).expect("json").get("anaState"), None);
        e.ana_state = AnaState::Inaccessible;
        assert_eq!(
            serde_json::to_value(&e).expect("json")["anaState"],
            "inaccessible"
        );
    }
}
