//! Why the Longhorn controller could not realize an instance, or carry out
//! a request on it: one variant per step, naming the instance, replica or
//! SPDK object, with SPDK's (or the volume operations') error as its
//! source.
//!
//! ```text
//!   spdk::ClientError, spdk::volume::VolumeError, names::InvalidName, attach::AttachError
//!        │ #[source]
//!        v
//!   InstanceError ──> error_chain, once ──> LonghornInstanceStatus.message
//!                                           (the gRPC handlers answer from it)
//! ```
//!
//! The messages are the ones Longhorn's manager has always read: a variant's
//! text plus its sources' (`util::error_chain`) is what the status says.

use crate::attach::AttachError;
use crate::names::InvalidName;
use crate::runtime::ContextError;
use crate::spdk::ClientError;
use crate::spdk::volume::VolumeError;

/// A step of the Longhorn controller that failed.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// A name Longhorn gave is not one SPDK can take.
    #[error(transparent)]
    Name(#[from] InvalidName),
    /// The state store could not be read.
    #[error(transparent)]
    State(#[from] ContextError),
    /// The node's listen address gives no instance address.
    #[error(transparent)]
    ListenAddress(#[from] crate::host::longhorn_address::AddressError),
    /// The replica's disk failed: not loaded, refused, or its figures wrong
    /// (its status's message).
    #[error("disk {disk} is not ready: {why}")]
    DiskNotReady {
        /// The disk.
        disk: String,
        /// Its status's message.
        why: String,
    },
    /// The replica's disk is still being brought up (its lvstore loading:
    /// after an unclean stop, a replay of its metadata), or not reported yet.
    #[error("disk {disk} is loading ({why}); the replica starts once its lvstore is loaded")]
    DiskLoading {
        /// The disk.
        disk: String,
        /// Its status's message, or that it has none yet.
        why: String,
    },
    /// The replica's head could not be made or grown.
    #[error(transparent)]
    Head(#[from] crate::spdk::volume::ReplicaHeadError),
    /// An export could not be made or taken away.
    #[error(transparent)]
    Export(#[from] VolumeError),
    /// A replica's lvols could not all be deleted.
    #[error(transparent)]
    Remove(#[from] crate::spdk::volume::ReplicaRemoveError),
    /// A replica's lvol could not be deleted.
    #[error("replica {replica}: deleting lvol {alias}")]
    DeleteLvol {
        replica: String,
        alias: String,
        #[source]
        source: ClientError,
    },
    /// An engine waits for replicas it cannot reach or that are not made.
    #[error("waiting for replicas: {}", .0.join("; "))]
    WaitingForReplicas(Vec<String>),
    /// An engine-frontend's frontend is not one talon serves.
    #[error(transparent)]
    Frontend(#[from] crate::spdk::naming::longhorn::UnservedFrontend),
    /// An address is not `ip:port`.
    #[error("target address {0:?} is not ip:port")]
    TargetAddress(String),
    /// Engine-frontends need the host's kernel.
    #[error("engine-frontends need the host's kernel (not available to this controller)")]
    NoHost,
    /// The kernel attach or detach of an engine-frontend, or its device
    /// node, failed.
    #[error(transparent)]
    Kernel(#[from] AttachError),
    /// A revert refused before anything was touched (a frontend, a replica
    /// being rebuilt, a replica without the snapshot: Longhorn's words).
    #[error(transparent)]
    RevertRefused(#[from] crate::spdk::volume::RevertRefused),
    /// A snapshot of an engine failed (nothing of it is left).
    #[error("snapshot {snapshot} of engine {engine}")]
    Snapshot {
        engine: String,
        snapshot: String,
        #[source]
        source: Box<InstanceError>,
    },
    /// No replica of the engine was left in service to snapshot.
    #[error("no replica is in service")]
    NoneInService,
    /// A take of the snapshot under this name did not end (talon stopped
    /// during it, or its copies could not all be deleted): they are deleted
    /// first.
    #[error(
        "an earlier take of it did not end; its copies are being deleted on every replica first{}",
        if .left.is_empty() { String::new() } else { format!(" (not yet: {})", .left) }
    )]
    TakeNotEnded {
        /// What the last clean-up could not delete.
        left: String,
    },
    /// SPDK refuses to delete a snapshot two lvols depend on.
    #[error("replica {replica}: SPDK refuses to delete {lvol} while more than one lvol depends on it")]
    SnapshotShared {
        replica: String,
        lvol: String,
        #[source]
        source: ClientError,
    },
    /// A remote replica's address is not `ip:port`.
    #[error("replica {replica}: address {address:?} is not ip:port")]
    ReplicaAddress { replica: String, address: String },
    /// A local replica's lvol is not there.
    #[error("local replica {replica}: lvol {alias} is missing")]
    LvolMissing { replica: String, alias: String },
    /// A remote replica's controller left from before could not be detached.
    #[error("replica {replica}: detaching its old controller")]
    DetachOld {
        replica: String,
        #[source]
        source: ClientError,
    },
    /// A member could not leave the raid1 slot it is in.
    #[error("replica {replica}: taking {member} out of raid {raid}")]
    LeaveSlot {
        replica: String,
        member: String,
        raid: String,
        #[source]
        source: Box<ClientError>,
    },
    /// A member could not be added to the raid1 (its rebuild not started).
    #[error("replica {replica}: adding {member} to raid {raid}")]
    AddMember {
        replica: String,
        member: String,
        raid: String,
        #[source]
        source: Box<ClientError>,
    },
    /// The node that serves `replica` was not reached.
    #[error("replica {replica}")]
    PeerUnreachable {
        replica: String,
        #[source]
        source: crate::proto::peer::PeerError,
    },
    /// Another node's SPDKService refused a call about its replica.
    #[error("replica {replica}: its node: {message}")]
    PeerRefused { replica: String, message: String },
    /// This node's target could not be listed after a step that changed it.
    #[error("listing spdk_tgt after the {after}")]
    Relist {
        after: &'static str,
        #[source]
        source: ClientError,
    },
    /// A rebuild dest's head was not made again.
    #[error(transparent)]
    ResetHead(#[from] crate::spdk::volume::ResetHeadError),
    /// A linked clone's rebuild dest: the entrypoint its chain starts on
    /// was not found or made.
    #[error("replica {replica}: the linked clone's entrypoint beside it")]
    CloneBase {
        replica: String,
        #[source]
        source: Box<crate::spdk::volume::LinkError>,
    },
    /// The task that attaches or detaches did not finish.
    #[error("{what} task")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl InstanceError {
    /// Whether an engine only waits (for replicas to come), rather than failed.
    pub fn waits(&self) -> bool {
        matches!(self, Self::WaitingForReplicas(_))
    }

    /// A replica that fails with this is starting, not in error: its disk
    /// is loading (Longhorn's manager takes an error replica as failed).
    pub fn replica_starting(&self) -> bool {
        matches!(self, Self::DiskLoading { .. })
    }

    /// The text a status carries: this error and its sources.
    pub fn text(&self) -> String {
        crate::util::error_chain(self)
    }
}
