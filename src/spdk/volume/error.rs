//! The errors of the volume operations, shared by the plan and its apply.

use super::super::client::ClientError;
use crate::util::size::Bytes;

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
    /// A replica could not be filled with a restored backup (the lvol was
    /// removed again).
    #[error("volume {volume}: restoring replica {replica}")]
    Restore {
        /// The volume.
        volume: String,
        /// The replica lvol.
        replica: String,
        /// The step that failed and why.
        #[source]
        source: Box<super::mover::MoverError>,
    },
    /// A host's DH-HMAC-CHAP secret file is missing or invalid.
    #[error("volume {volume}: DH-HMAC-CHAP")]
    Dhchap {
        /// The volume.
        volume: String,
        /// Which file and why (never the secret).
        #[source]
        source: crate::util::nvme_auth::DhchapFileError,
    },
    /// Replicas cannot be placed on distinct ready disks (see [`crate::spdk::placement`]).
    #[error("volume {volume}: {reason}")]
    NoPlacement {
        /// The volume.
        volume: String,
        /// Why, naming each candidate disk.
        reason: String,
        /// A failed disk is among the candidates (a wait fails at once).
        disk_failed: bool,
    },
    /// Growing a replica would take its disk past the overcommit bound.
    #[error("volume {volume}: replica {replica} cannot grow to {} on disk {disk}: {reason}", Bytes(*bytes))]
    Overcommit {
        /// The volume.
        volume: String,
        /// The replica's lvol.
        replica: String,
        /// The disk.
        disk: String,
        /// The size asked for.
        bytes: u64,
        /// The figures.
        reason: Box<NoRoom>,
    },
    /// A step of a thin rebuild's copy failed (it is tried again).
    #[error("volume {volume}: rebuilding replica {replica} from snapshot {snapshot}: {message}")]
    RebuildCopy {
        /// The volume.
        volume: String,
        /// The replica being rebuilt.
        replica: String,
        /// The source snapshot being copied.
        snapshot: String,
        /// What SPDK said.
        message: String,
    },
    /// The node that serves a remote replica did not take its snapshot.
    #[error("snapshot {snapshot}: remote replica {replica}: {message}")]
    PeerSnapshot {
        /// `<vol>@<snap>`.
        snapshot: String,
        /// The replica as its volume names it (`r<k>`, or a Longhorn
        /// replica's name).
        replica: String,
        /// What the peer (or reaching it) said.
        message: String,
    },
    /// A snapshot of several replicas on an export that cannot be frozen.
    #[error(
        "snapshot {snapshot}: export {nqn} was made without ANA reporting and cannot be frozen, \
         so its replicas cannot be snapshotted at one instant; serve it again (detach and attach) first"
    )]
    Unfreezable {
        /// `<vol>@<snap>`.
        snapshot: String,
        /// The export.
        nqn: String,
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
    #[error("volume {volume}: raid {raid} is {} after its members grew to {}", Bytes(*actual), Bytes(*wanted))]
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
    #[error("volume {volume}: cannot shrink from {} to {}", Bytes(*current), Bytes(*wanted))]
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
    /// Another controller of this target holds the path an attach asked for
    /// (SPDK keeps one controller per path and host NQN): the attach would
    /// not make the bdev it names.
    #[error(
        "volume {volume}: {nqn} at {address} is attached already as controller {holder}, not as {controller} (one controller per path and host NQN)"
    )]
    PathHeld {
        /// The volume.
        volume: String,
        /// The subsystem.
        nqn: String,
        /// Its address, `ip:port`.
        address: String,
        /// The controller asked for.
        controller: String,
        /// The controller that holds the path.
        holder: String,
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
    /// The raid's superblock names members that are not present: SPDK
    /// holds the raid (state `configuring`) until they come, because the
    /// newest superblock says they hold the newest data. Served again when
    /// they come back; never served from the others alone.
    #[error(
        "volume {volume}: raid {raid} waits for the replicas its superblock names as up to date ({present} of {needed} present); it is served when they come back"
    )]
    RaidAssembling {
        /// The volume.
        volume: String,
        /// The raid bdev.
        raid: String,
        /// Members present.
        present: u32,
        /// Members the superblock names.
        needed: u32,
    },
    /// A name built from the volume is not acceptable to SPDK.
    #[error("volume {volume}: lvol name {lvol:?} is longer than SPDK's 63 characters")]
    NameTooLong {
        /// The volume.
        volume: String,
        /// The name.
        lvol: String,
    },
    /// An engine was asked for with no member to serve from.
    #[error("volume {volume}: the engine has no member to serve from")]
    EngineWithoutMembers {
        /// The volume (or engine).
        volume: String,
    },
    /// A local member could not be moved to another path (see
    /// [`super::share`]).
    #[error("engine {engine}: moving replica {replica}'s member to {to}: {reason}")]
    MemberSwap {
        /// The engine.
        engine: String,
        /// The replica.
        replica: String,
        /// The path it was to take.
        to: &'static str,
        /// Why, naming the SPDK object.
        reason: String,
    },
    /// A member of an engine to be made is not in the target.
    #[error("volume {volume}: member {member} is gone")]
    MemberGone {
        /// The volume (or engine).
        volume: String,
        /// The member bdev.
        member: String,
    },
    /// A revert with no way to wait on other nodes found some still at it.
    #[error("revert of {volume}: the nodes of {replicas:?} are still reverting them")]
    RevertWaiting {
        /// `<volume>@<snapshot>`.
        volume: String,
        /// Other nodes' replicas.
        replicas: Vec<String>,
    },
    /// The members of a raid1 have different block sizes, which SPDK's raid1
    /// refuses (`bdev_raid_create`: "Invalid argument").
    #[error(
        "volume {volume}: raid1 {raid} cannot take members of different block sizes ({members}): \
         place its replicas on disks of one block size (the volume's `disks`)"
    )]
    MixedBlockSizes {
        /// The volume or engine.
        volume: String,
        /// The raid1.
        raid: String,
        /// Each member and its block size.
        members: String,
    },
}

/// A promise a disk cannot make: `more` bytes of thin lvols on top of the
/// `committed` it has would pass `percent`% of its `total` bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "its thin lvols promise {}, and {} more would pass {percent}% of its {}",
    crate::util::size::Bytes(*committed),
    crate::util::size::Bytes(*more),
    crate::util::size::Bytes(*total)
)]
pub struct Overcommit {
    /// The disk's capacity.
    pub total: u64,
    /// What its thin lvols promise now.
    pub committed: u64,
    /// What was asked for.
    pub more: u64,
    /// The bound, in percent of `total`.
    pub percent: u32,
}

/// Why a disk cannot promise more ([`super::plan::within_overcommit`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRoom {
    /// The disk has no lvstore in the listing.
    #[error("it has no lvstore")]
    NoLvstore,
    /// Its lvstore's figures make no sense.
    #[error(transparent)]
    Figures(#[from] crate::spdk::rpc::LvstoreFigures),
    /// What its lvols promise does not fit in 64 bits.
    #[error("the sizes of its lvols add up past 2^64 bytes")]
    Overflow,
    /// Past the bound.
    #[error("{0} (overcommitPercent)")]
    Over(#[from] Overcommit),
}
