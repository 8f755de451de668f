//! Longhorn's `SnapshotClone` and `SnapshotCloneStatus` (8501): a new
//! volume made from a snapshot of another (a PVC with a `dataSource`, CSI
//! volume cloning, a VolumeSnapshot restored in the cluster).
//!
//! ```text
//!   longhorn-manager engine monitor (the new volume's engine, spec.requestedDataSource set):
//!     SnapshotCloneStatus(engine) ─ every state "" ─> SnapshotClone(engine, from volume, snapshot, mode)
//!   SnapshotClone here (the engine's node):
//!     source: a replica of from_volume on this node holding <lvs>/<replica>-snap-<snapshot>
//!     target: the engine's bdev (its raid1, or its one replica's lvol): every replica written
//!     a job in the background: spdk::volume::mover::copy, chunks with data only (thin)
//!   SnapshotCloneStatus ─> {tcp://<member>: in_progress + progress | complete | error + why}
//!                          no clone yet: one member with state "" (the manager then asks)
//! ```
//!
//! Both clone modes v1.12.1 sends are a full copy through the engine here:
//! the linked clone (`DstReplicaSrcReplicaPairMap`) asks each new replica to
//! be an lvol clone of its source replica's snapshot; talon writes the same
//! data, thin, and reports every member as the manager's aggregation expects.
//! A clone's state lives in this serve's memory: after a restart the state
//! is "" again and the manager asks again (the copy writes the same data).

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
