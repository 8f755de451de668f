//! Longhorn's `SnapshotClone` and `SnapshotCloneStatus` (8501): a new
//! volume made from a snapshot of another (a PVC with a `dataSource`, CSI
//! volume cloning, a VolumeSnapshot restored in the cluster).
//!
//! ```text
//!   longhorn-manager engine monitor (the new volume's engine, spec.requestedDataSource set):
//!     SnapshotCloneStatus(engine) ─ every state "" ─> SnapshotClone(engine, from volume, snapshot, mode)
//!   SnapshotClone here (the engine's node):
//!     source: a replica of from_volume on this node holding <lvs>/<replica>-snap-<snapshot>
//!         or, none here: from_engine_address's node ─ EngineGet(from_engine_name) ─> its RW replicas
//!                        each replica's node ─ ReplicaGet ─> the first holding the snapshot
//!                        that node ─ ReplicaRebuildingSrcStart(exposed_snapshot_name) ─> ip:port of
//!                          nqn...:clone-src:<replica>:<engine> (read-only, the internal host only)
//!     target: the engine's bdev (its raid1, or its one replica's lvol): every replica written
//!     a job in the background: spdk::volume::mover::copy, chunks with data only (thin);
//!       from another node: the exposure joined (mover::copy::copy_sessions), then
//!       ReplicaRebuildingSrcFinish on every path (3 tries, 5 s apart)
//!     LonghornCloneLedger <engine> (persisted): in_progress, then complete | error + why
//!   SnapshotCloneStatus ─> {tcp://<member>: in_progress + progress | complete | error + why}
//!                          not run by this serve: the ledger's (in_progress: started again)
//!                          no clone yet: one member with state "" (the manager then asks)
//!   talon starts: every clone-src exposure an earlier run left is removed
//! ```
//!
//! Both clone modes v1.12.1 sends are a full copy through the engine here:
//! the linked clone (`DstReplicaSrcReplicaPairMap`) asks each new replica to
//! be an lvol clone of its source replica's snapshot; talon writes the same
//! data, thin, and reports every member as the manager's aggregation expects.
//! A clone's copy ends when its serve stops (unrecorded, as after a kill):
//! the next serve reads `in_progress` from the ledger and starts it over.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Where one clone stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Copying.
    Running,
    /// Copied.
    Complete,
    /// Failed, why.
    Failed(String),
}

/// One clone into an engine.
#[derive(Debug)]
pub(super) struct Job {
    /// The engine's volume (an engine made again under its name for
    /// another volume is not this clone's).
    pub(super) volume: String,
    pub(super) snapshot: String,
    /// The source replica's address (`from_replica_address`).
    pub(super) from: String,
    pub(super) size: u64,
    pub(super) copied: Arc<AtomicU64>,
    pub(super) outcome: Arc<Mutex<Outcome>>,
}

/// The clones into this node's engines, by engine.
#[derive(Debug, Default)]
pub struct Clones {
    jobs: Mutex<BTreeMap<String, Job>>,
}

impl Clones {
    pub(super) fn jobs(&self) -> MutexGuard<'_, BTreeMap<String, Job>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(super) fn lock(o: &Mutex<Outcome>) -> MutexGuard<'_, Outcome> {
    o.lock().unwrap_or_else(PoisonError::into_inner)
}
