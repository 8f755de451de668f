//! The thin rebuild of an engine whose replicas are named lvols, each on
//! this node or on another (Longhorn's engines): its ends
//! ([`ReplicaEnds`]), carried out one step at a time by the one step machine
//! of every thin rebuild ([`thin::step`]) and the one checked switch
//! ([`Switch`]). What only another node can do (list, snapshot, make its
//! replica's head ready, copy from its replica, let a dest go) is asked
//! through [`ReplicaPeers`], which the protocol's layer implements (Longhorn's
//! SPDKService, `controllers::longhorn::thin`); everything this node's target
//! does is done here, so the step machine and the single writes stay private
//! to `spdk/volume`.
//!
//! ```text
//!   source S (in the raid, here or there)     dest D (out of the raid, here or there)
//!   1. D's head empty right above the snapshots both share
//!        here: reset_head      there: its node (ReplicaPeers::dst_start)
//!   2. S's next snapshot's own clusters copied into D's head where S lives
//!        S here: D's bdev here (its lvol, or its export attached)
//!        S there: S's node copies into D's export (src_copy_start)
//!   3. D's head snapshotted as that snapshot; repeat; then the switch
//! ```
//!
//! Each step is derived from what the replicas' lvstores hold, so a restart
//! of talon goes on from the copies made so far. Only the running copy is
//! kept in memory (spdk_tgt forgets it with a restart too; the dest's head
//! is then made again). The dest is in no raid and never read until the
//! switch, when it equals the source. How failures count and when a rebuild
//! is given up is the one policy of every thin rebuild ([`thin::Failures`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::thin::{self, Copier, CopyState, Run};
use super::{
    EngineNames, ExportSpec, Inventory, ReplicaLvols, ResetHeadError, SnapshotDeleteError, Switch,
    SwitchSide, VolumeError, VolumeOps,
};
use crate::names::{InvalidName, Nqn};
use crate::resources::longhorn::{CloneBase, SnapshotInfo, snapshot_lvol};
use crate::spdk::ClientError;
use crate::spdk::naming::longhorn::{self as naming, REBUILD_SNAP_PREFIX, is_rebuild_snap};
use crate::spdk::rpc::RaidBdev;

pub use super::thin::Failed;

/// How long a dest's node may take to make its head ready and export it
/// (asked again every step meanwhile) before the step fails: what the node
/// itself waits for its controller when asked Longhorn's way.
const DST_WAIT: Duration = Duration::from_secs(60);

/// Why a step of a thin rebuild between named replicas failed; flattened
/// into words only where the protocol reads them.
#[derive(Debug, thiserror::Error)]
pub enum ThinError {
    /// A step of the engine's SPDK objects (the switch's among them).
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// A call to this node's target.
    #[error("{doing}")]
    Spdk {
        /// What was being done, naming the object.
        doing: String,
        /// SPDK's answer.
        #[source]
        source: ClientError,
    },
    /// The node that serves `replica` was not reached.
    #[error("replica {replica}")]
    PeerUnreachable {
        /// The replica.
        replica: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The node that serves `replica` answered an error (its words).
    #[error("replica {replica}: {doing} on its node: {message}")]
    Peer {
        /// The replica.
        replica: String,
        /// What it was asked.
        doing: &'static str,
        /// What it said.
        message: String,
    },
    /// A replica of another node was not attached here (the engine's words).
    #[error("replica {replica}: {message}")]
    Attach {
        /// The replica.
        replica: String,
        /// Why.
        message: String,
    },
    /// A dest's head of this node was not made again.
    #[error("replica {replica}: making its head again")]
    ResetHead {
        /// The replica.
        replica: String,
        /// The step that failed.
        #[source]
        source: ResetHeadError,
    },
    /// The engine has no raid1 to rebuild into.
    #[error("engine {engine} has no raid1")]
    NoRaid {
        /// The engine.
        engine: String,
    },
    /// No member is in service to copy from.
    #[error("engine {engine}: no replica in service to rebuild {replica} from")]
    NoSource {
        /// The engine.
        engine: String,
        /// The replica rebuilt.
        replica: String,
    },
    /// A replica's name makes no NQN.
    #[error("replica {replica}")]
    BadName {
        /// The replica.
        replica: String,
        /// Why.
        #[source]
        source: InvalidName,
    },
    /// A dest of this node copied from another node is not exported yet.
    #[error("replica {replica}: not exported for the copy from {source_replica}")]
    NotExported {
        /// The dest.
        replica: String,
        /// The source.
        source_replica: String,
    },
    /// A dest's node did not make its head ready in time.
    #[error("replica {replica}: its node has not made its head ready for the rebuild in {secs} s")]
    DestNotReady {
        /// The dest.
        replica: String,
        /// How long it was waited for.
        secs: u64,
    },
    /// A linked clone's dest: the entrypoint its chain starts on was not
    /// found or made beside it.
    #[error("replica {replica}: the linked clone's entrypoint beside it")]
    CloneBase {
        /// The dest.
        replica: String,
        /// Why.
        #[source]
        source: super::LinkError,
    },
    /// A linked clone's dest of another node: its node cannot start its
    /// chain on the base asked for (the replica beside it lacks the
    /// snapshot); the rebuild copies every block instead.
    #[error("replica {replica}: its node cannot start it on the linked clone's entrypoint: {message}")]
    NoCloneBase {
        /// The dest.
        replica: String,
        /// Its node's words.
        message: String,
    },
    /// A linked clone's dest, right before its switch: the replica beside
    /// it, whose entrypoint its chain starts on, is no longer in service in
    /// the source volume's engine (voted corrupt, being rebuilt, or that
    /// engine is down). The rebuild copies every block instead.
    #[error("replica {replica}: the linked clone's base {beside} is not in service at the switch: {why}")]
    BaseUnfit {
        /// The dest.
        replica: String,
        /// The replica beside it.
        beside: String,
        /// Why, in the engine's words.
        why: String,
    },
    /// A copy failed (SPDK's words, or its node's).
    #[error("copying snapshot {snapshot} to replica {replica}: {message}")]
    CopyFailed {
        /// The snapshot copied.
        snapshot: String,
        /// The dest.
        replica: String,
        /// Why.
        message: String,
    },
}

impl ThinError {
    fn spdk(doing: String) -> impl FnOnce(ClientError) -> Self {
        move |source| Self::Spdk { doing, source }
    }
}

/// One end of a rebuild: a replica of this node or of another.
#[derive(Debug, Clone)]
pub enum ReplicaEnd {
    /// A replica of this node: its head is lvol `lvs/replica`, `size` bytes.
    Here {
        /// The replica (its head lvol's name).
        replica: String,
        /// Its lvstore.
        lvs: String,
        /// Its size in bytes.
        size: u64,
    },
    /// A replica of another node, served at `address` (ip:port).
    Peer {
        /// The replica.
        replica: String,
        /// Its export's address.
        address: String,
    },
}

impl ReplicaEnd {
    /// The replica's name.
    pub fn replica(&self) -> &str {
        match self {
            ReplicaEnd::Here { replica, .. } | ReplicaEnd::Peer { replica, .. } => replica,
        }
    }
}

/// The name of the entrypoint a linked clone's base names.
pub fn clone_base_entrypoint(b: &CloneBase) -> String {
    naming::clone_entrypoint(&b.replica, &b.snapshot)
}

/// Whether the snapshot a linked clone's base names is in lvstore `lvs`
/// (its entrypoint can be found or made there).
pub fn clone_base_present(inv: &Inventory, lvs: &str, b: &CloneBase) -> bool {
    inv.lvols.get(&b.snapshot_in(lvs)).is_some_and(|l| l.is_snapshot)
}

impl VolumeOps {
    /// The entrypoint `base` names, found or made in lvstore `lvs` for dest
    /// `dst` (a replica of this node, rebuilt next with
    /// [`VolumeOps::reset_head`] over it). Returns its name.
    pub async fn clone_base_for(
        &self,
        inv: &Inventory,
        lvs: &str,
        dst: &str,
        base: &CloneBase,
    ) -> Result<String, super::LinkError> {
        let ep = clone_base_entrypoint(base);
        let link = super::Link {
            snapshot: &base.snapshot_in(lvs),
            entrypoint: &ep,
            head: &format!("{lvs}/{dst}"),
        };
        self.clone_base(inv, &link).await?;
        Ok(ep)
    }
}

/// What only the node of a replica elsewhere can do for its rebuild, and
/// what the protocol keeps about a switch: implemented by the protocol's
/// layer. Every error is the step's [`ThinError`], in that layer's words.
#[async_trait::async_trait]
pub trait ReplicaPeers: Send + Sync {
    /// Replica `replica`'s lvols on its node at `address`.
    async fn lvols(&self, replica: &str, address: &str) -> Result<ReplicaLvols, ThinError>;
    /// Snapshots its head as `snap`; `dst`: a rebuild dest's copy of the
    /// source's `snap`, with its time and labels when known.
    async fn snapshot(
        &self,
        replica: &str,
        address: &str,
        snap: &str,
        dst: Option<Option<&SnapshotInfo>>,
    ) -> Result<(), ThinError>;
    /// Deletes its snapshot `snap`.
    async fn delete_snapshot(&self, replica: &str, address: &str, snap: &str) -> Result<(), ThinError>;
    /// Attaches its export here; answers the bdev this node writes it through.
    async fn attach(&self, inv: &Inventory, replica: &str, address: &str) -> Result<String, ThinError>;
    /// Asks its node to make its head empty right above the snapshots of
    /// `chain` (the source's, oldest first) it shares over `base` (a linked
    /// clone's: the chain starts on that entrypoint), for a copy from
    /// `src`; answers whether it is so (false: its node is still at it).
    async fn dst_start(
        &self,
        replica: &str,
        address: &str,
        src: &ReplicaEnd,
        chain: &[String],
        base: Option<&CloneBase>,
    ) -> Result<bool, ThinError>;
    /// Asks its node to copy its snapshot `snap`'s own clusters into
    /// `dst`'s head, exported at `to`.
    async fn src_copy_start(
        &self,
        replica: &str,
        address: &str,
        dst: &str,
        to: &str,
        snap: &str,
    ) -> Result<(), ThinError>;
    /// Where that copy stands (`None`: its node does not know it).
    async fn src_copy_check(
        &self,
        replica: &str,
        address: &str,
        dst: &str,
        snap: &str,
    ) -> Result<Option<CopyState>, ThinError>;
    /// Caps (0 lifts) the writes into its head while it is rebuilt.
    async fn dst_qos(&self, replica: &str, address: &str, mbps: u64) -> Result<(), ThinError>;
    /// Its node lets the dest `dst` it copied into go.
    async fn src_finish(&self, replica: &str, address: &str, dst: &str) -> Result<(), ThinError>;
    /// Right before the engine's hosts go off for the switch: `joining`
    /// joins, `in_service` stay.
    fn switch_started(&self, engine: &str, joining: &str, in_service: Vec<String>);
    /// The switch is over; the dest is a member.
    fn switch_done(&self, engine: &str);
    /// Why replica `replica` is not in service in engine `engine` (at
    /// `address`, its node's storage address) now: not running, or the
    /// replica not RW there. `None`: it is.
    async fn unfit_base(&self, replica: &str, engine: &str, address: &str) -> Option<String>;
}

/// Where a thin rebuild stands after one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Thin {
    /// Copying: bytes of the source copied so far, of its total.
    Copying {
        /// Bytes copied.
        copied: u64,
        /// Of.
        total: u64,
    },
    /// The replica is a member of the raid again, equal to the source.
    Joined,
    /// Cannot be rebuilt thin (why): SPDK's raid rebuild does it.
    Unsupported(String),
}

/// Where a dest on another node stands after one more ask to make its
/// head ready (answered at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DstAsk {
    /// Its head is made again: no longer waited for.
    Ready,
    /// Asked first (or afresh, after a bound ran out): its node works at it.
    Asked,
    /// Its node is still at it, asked since an earlier step.
    Waiting,
    /// Not ready within [`DST_WAIT`]: a failed step; the next one asks afresh.
    TooLong,
}

#[derive(Debug, Default)]
struct State {
    /// The cap applied on a dest's node per (engine, replica).
    caps: HashMap<(String, String), u64>,
    /// Dests of this node copied from a source on another node: exported
    /// (not held by their engine) until the switch, so that node's target
    /// can write them, per (engine, replica).
    exported: BTreeSet<(String, String)>,
    /// The source replica each rebuild copies from, per (engine, replica):
    /// the last one a step chose.
    sources: HashMap<(String, String), String>,
    /// Dests on another node whose node is still making their head ready,
    /// per (engine, replica), since when: asked again at the next step.
    dst_waiting: HashMap<(String, String), Instant>,
}

impl State {
    /// Records one ask of dest `key` at `now`, which its node answered
    /// `ready` or not yet.
    fn dst_asked(&mut self, key: &(String, String), ready: bool, now: Instant) -> DstAsk {
        if ready {
            self.dst_waiting.remove(key);
            return DstAsk::Ready;
        }
        let since = *self.dst_waiting.entry(key.clone()).or_insert(now);
        if now.duration_since(since) >= DST_WAIT {
            self.dst_waiting.remove(key);
            DstAsk::TooLong
        } else if since < now {
            DstAsk::Waiting
        } else {
            DstAsk::Asked
        }
    }
}

/// The thin rebuilds of one node's engines over named replicas: the running
/// copies, the failed steps (the one policy of every thin rebuild), and
/// what each rebuild holds open meanwhile.
#[derive(Debug, Default, Clone)]
pub struct ReplicaRebuilds {
    state: Arc<Mutex<State>>,
    /// The copy running per (engine, replica).
    runs: thin::Runs,
    /// The failed steps per (engine, replica).
    failures: thin::Failures,
}

impl ReplicaRebuilds {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Counts a failed step at `now`: retried after a pause, or failed for
    /// good ([`thin::Failures`]).
    pub fn failed(&self, engine: &str, replica: &str, now: Instant) -> Failed {
        self.runs.remove(engine, replica);
        self.failures.failed(engine, replica, now)
    }
    /// Whether the rebuild's next step waits (its last one failed a moment ago).
    pub fn pausing(&self, engine: &str, replica: &str, now: Instant) -> bool {
        self.failures.pausing(engine, replica, now)
    }
    /// Forgets a rebuild (joined, failed for good, or no longer asked).
    pub fn forget(&self, engine: &str, replica: &str) {
        self.runs.remove(engine, replica);
        self.failures.forget(engine, replica);
        let mut s = self.lock();
        let k = (engine.to_owned(), replica.to_owned());
        s.caps.remove(&k);
        s.exported.remove(&k);
        s.sources.remove(&k);
        s.dst_waiting.remove(&k);
    }
    /// The replica the rebuild of `replica` copies from (known once a step ran).
    pub fn source(&self, engine: &str, replica: &str) -> Option<String> {
        self.lock()
            .sources
            .get(&(engine.to_owned(), replica.to_owned()))
            .cloned()
    }
    /// The replicas of this node that a rebuild from another node writes
    /// through their export: their engine does not hold them.
    pub fn exported_dsts(&self) -> BTreeSet<String> {
        self.lock().exported.iter().map(|(_, r)| r.clone()).collect()
    }
}

/// One step of the thin rebuild of `dst` in raid1 engine `engine`, as its
/// controller sees it.
#[derive(Debug)]
pub struct ReplicaRebuild<'a> {
    /// The engine (its raid1's name).
    pub engine: &'a str,
    /// The raid as the controller listed it.
    pub raid: &'a RaidBdev,
    /// The engine's names in SPDK.
    pub names: &'a EngineNames,
    /// Its export.
    pub spec: &'a ExportSpec,
    /// The dest.
    pub dst: ReplicaEnd,
    /// The address the dest is served at (its node's export).
    pub dst_address: String,
    /// The members in service, each with the name the raid knows it by;
    /// the first is the source (put one of this node first).
    pub in_service: Vec<(ReplicaEnd, String)>,
    /// The source's snapshot times and labels when it is of this node: a
    /// dest of another node keeps them with its copies.
    pub src_info: BTreeMap<String, SnapshotInfo>,
    /// The cap the copies run at, MB/s (0: none).
    pub qos: u64,
    /// A linked clone's dest: the replica of the clone's source volume
    /// beside it (Longhorn's `ReplicaAdd` `linked_clone_source`), whose
    /// entrypoint its chain starts on. Without it, a source that is a
    /// linked clone is rebuilt by SPDK's raid rebuild (every block).
    pub beside: Option<String>,
    /// The engine the replica beside serves in, with its address
    /// (`linked_clone_source.engine_name`/`engine_address`): asked again
    /// right before the switch whether it still holds that replica RW.
    pub beside_engine: Option<(String, String)>,
}

impl VolumeOps {
    /// One step of a thin rebuild between named replicas (see the module).
    pub async fn replica_thin_step(
        &self,
        inv: &Inventory,
        rebuilds: &ReplicaRebuilds,
        peers: &dyn ReplicaPeers,
        r: ReplicaRebuild<'_>,
    ) -> Result<Thin, ThinError> {
        let (engine, dst_name) = (r.engine, r.dst.replica().to_owned());
        let Some((src, _)) = r.in_service.first().cloned() else {
            return Err(ThinError::NoSource {
                engine: engine.to_owned(),
                replica: dst_name,
            });
        };
        rebuilds
            .lock()
            .sources
            .insert((engine.to_owned(), dst_name.clone()), src.replica().to_owned());
        let bad_name = |source| ThinError::BadName {
            replica: dst_name.clone(),
            source,
        };
        let dst_nqn =
            naming::replica_nqn(&crate::names::ObjectName::parse("replica", &dst_name).map_err(bad_name)?)
                .map_err(bad_name)?;
        let lvols_of = |end: &ReplicaEnd| {
            let end = end.clone();
            async move {
                match end {
                    ReplicaEnd::Here { replica, lvs, .. } => {
                        Ok(ReplicaLvols::from_inventory(inv, &lvs, &replica))
                    }
                    ReplicaEnd::Peer { replica, address } => peers.lvols(&replica, &address).await,
                }
            }
        };
        let have_src = lvols_of(&src).await?;
        let have_dst = lvols_of(&r.dst).await?;
        let chain_src = have_src.chain();
        // a linked clone's copies hold its own data only: the dest's chain
        // starts on the same snapshot's entrypoint beside it, or SPDK's
        // raid rebuild copies every block
        let dst_base = match (&have_src.base, r.beside) {
            (None, _) => None,
            (Some(base), beside) => match (naming::clone_entrypoint_snapshot(base), beside) {
                (Some(snapshot), Some(replica)) => Some(CloneBase {
                    replica,
                    snapshot: snapshot.to_owned(),
                }),
                (Some(_), None) => {
                    return Ok(Thin::Unsupported(format!(
                        "source replica {} is a linked clone (its chain starts on {base}) and no replica of the clone's source volume beside the dest was named; a thin copy would leave out the data it reads there",
                        src.replica()
                    )));
                }
                (None, _) => {
                    return Ok(Thin::Unsupported(format!(
                        "source replica {}'s chain starts on {base}, not on a linked clone's entrypoint; a thin copy would leave out the data it reads there",
                        src.replica()
                    )));
                }
            },
        };
        // a dest of this node whose replica beside has no such snapshot in its
        // lvstore (another disk, or it is gone); one of another node: its node says so
        if let (Some(b), ReplicaEnd::Here { lvs, .. }) = (&dst_base, &r.dst)
            && !clone_base_present(inv, lvs, b)
        {
            return Ok(Thin::Unsupported(format!(
                "source replica {} is a linked clone and {}, the base beside the dest, does not exist",
                src.replica(),
                b.snapshot_in(lvs)
            )));
        }
        if let Some(bad) = chain_src
            .iter()
            .find(|s| naming::replica_snapshot_name(s).is_err())
        {
            return Ok(Thin::Unsupported(format!(
                "source snapshot {bad:?} is not a Longhorn snapshot name"
            )));
        }
        let own: Vec<u64> = chain_src
            .iter()
            .map(|s| have_src.snapshots.get(s).map_or(0, |(_, b)| *b))
            .chain([have_src.head_bytes])
            .collect();
        let ends = ReplicaEnds {
            ops: self,
            peers,
            rebuilds,
            inv,
            engine,
            // a dest of this node copied from another node: exported for it
            remote_into_here: matches!((&src, &r.dst), (ReplicaEnd::Peer { .. }, ReplicaEnd::Here { .. })),
            src_info: r.src_info,
            src,
            dst: r.dst,
            dst_nqn,
            dst_address: r.dst_address,
            have_src,
            have_dst,
            chain_src,
            own,
            cluster: inv.lvstores.first().map_or(1, |l| l.cluster_size),
            slots: r.in_service.iter().map(|(_, n)| Some(n.clone())).collect(),
            in_service: r.in_service,
            raid: r.raid,
            names: r.names,
            spec: r.spec,
            qos: r.qos,
            dst_ep: dst_base.as_ref().map(clone_base_entrypoint),
            base_engine: dst_base.as_ref().and(r.beside_engine),
            dst_base,
        };
        Ok(match thin::step(&ends, &rebuilds.runs).await {
            Ok(thin::Step::Copying { copied, total }) => Thin::Copying { copied, total },
            Ok(thin::Step::Joined) => Thin::Joined,
            Err(e @ (ThinError::NoCloneBase { .. } | ThinError::BaseUnfit { .. })) => {
                Thin::Unsupported(e.to_string())
            }
            Err(e) => return Err(e),
        })
    }
}

/// The ends of a thin rebuild between named replicas, as one step sees them.
struct ReplicaEnds<'a> {
    ops: &'a VolumeOps,
    peers: &'a dyn ReplicaPeers,
    rebuilds: &'a ReplicaRebuilds,
    inv: &'a Inventory,
    engine: &'a str,
    src: ReplicaEnd,
    dst: ReplicaEnd,
    /// The dest's own export (a dest of this node, copied into from a
    /// source on another node, is written through it until the switch).
    dst_nqn: Nqn,
    dst_address: String,
    remote_into_here: bool,
    src_info: BTreeMap<String, SnapshotInfo>,
    have_src: ReplicaLvols,
    have_dst: ReplicaLvols,
    chain_src: Vec<String>,
    own: Vec<u64>,
    cluster: u64,
    /// The members in service, by the name the raid knows each by.
    in_service: Vec<(ReplicaEnd, String)>,
    /// The same names as slots, the source's first.
    slots: Vec<Option<String>>,
    raid: &'a RaidBdev,
    names: &'a EngineNames,
    spec: &'a ExportSpec,
    qos: u64,
    /// A linked clone's dest: where its chain starts, and that entrypoint's name.
    dst_base: Option<CloneBase>,
    dst_ep: Option<String>,
    /// The engine that serves the replica of `dst_base`, and its address.
    base_engine: Option<(String, String)>,
}

impl ReplicaEnds<'_> {
    fn key(&self) -> (String, String) {
        (self.engine.to_owned(), self.dst.replica().to_owned())
    }
    /// The address a dest of this node is written at by a source's node.
    fn dst_export(&self) -> Option<String> {
        self.remote_into_here.then(|| self.dst_address.clone())
    }
    /// The switch of this rebuild: the one checked switch under the
    /// engine's names, the dest after the members in service.
    fn switch(&self) -> Switch<'_> {
        Switch {
            of: self.engine,
            replica: self.dst.replica(),
            names: self.names,
            spec: self.spec,
            raid: self.raid,
            source: self.in_service.first().map_or("", |(_, n)| n.as_str()),
            slots: &self.slots,
            dest_slot: self.slots.len(),
        }
    }

    /// Snapshots the head of `end` as `snap`; `dst`: a dest's copy of a
    /// source snapshot (another node's dest keeps its time and labels).
    async fn snapshot_end(
        &self,
        end: &ReplicaEnd,
        snap: &str,
        dst: Option<Option<&SnapshotInfo>>,
    ) -> Result<(), ThinError> {
        match end {
            ReplicaEnd::Here { replica, lvs, .. } => {
                let name = snapshot_lvol(replica, snap);
                self.ops
                    .snapshot_lvol(&format!("{lvs}/{replica}"), &name)
                    .await
                    .map_err(ThinError::spdk(format!("snapshotting {lvs}/{replica} as {name}")))
            }
            ReplicaEnd::Peer { replica, address } => self.peers.snapshot(replica, address, snap, dst).await,
        }
    }

    async fn delete_snapshot_of(&self, end: &ReplicaEnd, snap: &str) -> Result<(), ThinError> {
        match end {
            ReplicaEnd::Here { replica, lvs, .. } => self
                .ops
                .delete_replica_snapshot(lvs, replica, snap)
                .await
                .map(|_| ())
                .map_err(|e| match e {
                    SnapshotDeleteError::Shared { lvol, source }
                    | SnapshotDeleteError::Spdk { lvol, source } => {
                        ThinError::spdk(format!("deleting {lvol}"))(source)
                    }
                }),
            ReplicaEnd::Peer { replica, address } => self.peers.delete_snapshot(replica, address, snap).await,
        }
    }

    /// The bdev this node writes the dest's head through: its lvol, or its
    /// export attached.
    async fn dst_bdev(&self, inv: &Inventory) -> Result<String, ThinError> {
        match &self.dst {
            ReplicaEnd::Here { replica, lvs, .. } => Ok(format!("{lvs}/{replica}")),
            ReplicaEnd::Peer { replica, address } => self.peers.attach(inv, replica, address).await,
        }
    }

    /// Starts copying the source's snapshot `snap` into the dest's head.
    async fn copy(&self, inv: &Inventory, snap: &str) -> Result<Copier, ThinError> {
        match &self.src {
            ReplicaEnd::Here { replica, lvs, .. } => {
                let to = self.dst_bdev(inv).await?;
                let from = format!("{lvs}/{}", snapshot_lvol(replica, snap));
                self.ops
                    .start_shallow_copy(&from, &to)
                    .await
                    .map(Copier::Here)
                    .map_err(ThinError::spdk(format!("copying {from}'s clusters to {to}")))
            }
            ReplicaEnd::Peer { replica, address } => {
                let to = match &self.dst {
                    ReplicaEnd::Peer { address, .. } => address.clone(),
                    // exported for this rebuild (see `exported`)
                    ReplicaEnd::Here { .. } => self.dst_export().ok_or_else(|| ThinError::NotExported {
                        replica: self.dst.replica().to_owned(),
                        source_replica: replica.clone(),
                    })?,
                };
                self.peers
                    .src_copy_start(replica, address, self.dst.replica(), &to, snap)
                    .await?;
                Ok(Copier::Elsewhere)
            }
        }
    }

    /// The cap the rebuild runs at (the dest's node's head; a dest of this
    /// node is not capped: its head is open to nobody until it joins, and
    /// on v26.05 a cap set so can never be lifted again).
    async fn cap(&self, mbps: u64) -> Result<(), ThinError> {
        let k = self.key();
        if self.rebuilds.lock().caps.get(&k).copied().unwrap_or(0) == mbps {
            return Ok(());
        }
        match &self.dst {
            ReplicaEnd::Peer { replica, address } => self.peers.dst_qos(replica, address, mbps).await?,
            // exported for a copy from another node: open by the export
            ReplicaEnd::Here { replica, lvs, .. } if self.rebuilds.lock().exported.contains(&k) => {
                let head = format!("{lvs}/{replica}");
                self.ops
                    .set_qos_cap(&head, mbps)
                    .await
                    .map_err(ThinError::spdk(format!(
                        "replica {replica}: capping its head {head}"
                    )))?;
            }
            ReplicaEnd::Here { .. } => return Ok(()),
        }
        self.rebuilds.lock().caps.insert(k, mbps);
        Ok(())
    }

    /// The dest's head empty right above the snapshots it shares with the
    /// source (on its node for a replica of another). True once it is so;
    /// false while that node is still at it (asked again at the next step).
    async fn reset_dst(&self) -> Result<bool, ThinError> {
        match &self.dst {
            ReplicaEnd::Here { replica, lvs, size } => {
                if let Some(b) = &self.dst_base {
                    self.ops
                        .clone_base_for(self.inv, lvs, replica, b)
                        .await
                        .map_err(|source| ThinError::CloneBase {
                            replica: replica.clone(),
                            source,
                        })?;
                }
                self.ops
                    .reset_head(
                        lvs,
                        replica,
                        *size,
                        &self.have_dst,
                        self.dst_ep.as_deref(),
                        &self.chain_src,
                    )
                    .await
                    .map(|_| true)
                    .map_err(|source| ThinError::ResetHead {
                        replica: replica.clone(),
                        source,
                    })
            }
            ReplicaEnd::Peer { replica, address } => {
                // this node's controller of it goes: the head is a new namespace
                if self.inv.controllers.iter().any(|c| c == replica) {
                    self.ops
                        .detach_controller(replica)
                        .await
                        .map_err(ThinError::spdk(format!(
                            "replica {replica}: detaching its old controller"
                        )))?;
                }
                self.peers
                    .dst_start(
                        replica,
                        address,
                        &self.src,
                        &self.chain_src,
                        self.dst_base.as_ref(),
                    )
                    .await
            }
        }
    }

    /// The rebuild snapshots merged away on both ends, the oldest first
    /// (`last`: the switch's). Best effort: what is left goes after the next
    /// rebuild.
    async fn merge_rebuild_snapshots(&self, last: &str) {
        let last = last.to_owned();
        let mut rb: Vec<&String> = self
            .have_src
            .snapshots
            .keys()
            .chain(self.have_dst.snapshots.keys())
            .chain(std::iter::once(&last))
            .filter(|s| is_rebuild_snap(s))
            .collect();
        rb.sort_by_key(|s| rebuild_snap_number(s));
        rb.dedup();
        for end in [&self.src, &self.dst] {
            for s in &rb {
                if let Err(m) = self.delete_snapshot_of(end, s).await {
                    tracing::warn!(engine = self.engine, replica = end.replica(), error = %m,
                        "rebuild snapshot not merged away");
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl thin::Ends for ReplicaEnds<'_> {
    type Error = ThinError;

    /// A linked clone's dest: the replica beside it is asked again, in its
    /// engine, as longhorn-spdk-engine asks at `RebuildingDstFinish`: one
    /// voted corrupt, being rebuilt or whose engine is down since the
    /// `ReplicaAdd` is not what the rebuilt replica reads below its own data.
    async fn switch_allowed(&self) -> Result<(), ThinError> {
        let (Some(base), Some((engine, address))) = (&self.dst_base, &self.base_engine) else {
            return Ok(());
        };
        match self.peers.unfit_base(&base.replica, engine, address).await {
            None => Ok(()),
            Some(why) => Err(ThinError::BaseUnfit {
                replica: self.dst.replica().to_owned(),
                beside: base.replica.clone(),
                why,
            }),
        }
    }

    fn of(&self) -> &str {
        self.engine
    }

    fn dest(&self) -> &str {
        self.dst.replica()
    }

    fn chain(&self) -> &[String] {
        &self.chain_src
    }

    fn own(&self) -> &[u64] {
        &self.own
    }

    fn cluster(&self) -> u64 {
        self.cluster
    }

    fn busy_head(&self) -> bool {
        let over_nvme_tcp =
            matches!(self.src, ReplicaEnd::Peer { .. }) || matches!(self.dst, ReplicaEnd::Peer { .. });
        self.have_src.head_bytes > thin::switch_bytes(over_nvme_tcp)
    }

    fn rounds(&self) -> usize {
        self.chain_src.iter().filter(|s| is_rebuild_snap(s)).count()
    }

    async fn at(&self) -> Result<thin::At, ThinError> {
        let base = self.dst_ep.as_deref();
        let j = self.have_dst.shared(base, &self.chain_src);
        // a dest's node still making its head ready is asked again first
        let waiting = matches!(self.dst, ReplicaEnd::Peer { .. })
            && self.rebuilds.lock().dst_waiting.contains_key(&self.key());
        Ok(thin::At::Holds {
            shared: j,
            ready: self.have_dst.ready_over(base, &self.chain_src, j) && !waiting,
        })
    }

    async fn make_ready(&self, j: usize) -> Result<(), ThinError> {
        let (engine, dst_name) = (self.engine, self.dst.replica());
        if self.remote_into_here && self.inv.subsystem(self.dst_nqn.as_str()).is_some() {
            // its export goes while its head is made again (made again
            // by the replica's controller at the next reconcile); already
            // gone, it is not deleted again: SPDK answers a missing
            // subsystem's delete as invalid parameters
            self.ops.unexport(dst_name, self.dst_nqn.as_str()).await?;
        }
        let ready = self.reset_dst().await?;
        let by = match self.rebuilds.lock().dst_asked(&self.key(), ready, Instant::now()) {
            DstAsk::Ready => Some("its head made again"),
            DstAsk::Asked => Some("its node makes its head again"),
            DstAsk::Waiting => None,
            DstAsk::TooLong => {
                return Err(ThinError::DestNotReady {
                    replica: dst_name.to_owned(),
                    secs: DST_WAIT.as_secs(),
                });
            }
        };
        if let Some(by) = by {
            match &self.dst_ep {
                None => tracing::info!(
                    engine,
                    replica = dst_name,
                    source = self.src.replica(),
                    shared = j,
                    "rebuilding replica thin: {by} over the snapshots it shares"
                ),
                Some(ep) => tracing::info!(
                    engine,
                    replica = dst_name,
                    source = self.src.replica(),
                    shared = j,
                    entrypoint = ep.as_str(),
                    "rebuilding a linked clone's replica thin: {by} over the snapshots it shares, on the entrypoint beside it"
                ),
            }
        }
        Ok(())
    }

    /// A dest of this node copied from another node is exported first (by
    /// the replica's controller, at its next reconcile).
    async fn writable(&self) -> Result<bool, ThinError> {
        if !self.remote_into_here {
            return Ok(true);
        }
        let newly = self.rebuilds.lock().exported.insert(self.key());
        let ready = self
            .inv
            .subsystem(self.dst_nqn.as_str())
            .is_some_and(|s| !s.namespaces.is_empty() && !s.listen_addresses.is_empty());
        Ok(!newly && ready)
    }

    async fn start_copy(&self, j: usize) -> Result<Copier, ThinError> {
        self.cap(self.qos).await?;
        self.copy(self.inv, &self.chain_src[j]).await
    }

    async fn check(&self, run: &Run) -> Result<Option<CopyState>, ThinError> {
        match (&run.copier, &self.src) {
            (Copier::Here(op), _) => Ok(self.ops.shallow_copy_state(*op).await.ok()),
            (Copier::Elsewhere, ReplicaEnd::Peer { replica, address }) => {
                self.peers
                    .src_copy_check(replica, address, self.dst.replica(), &run.snap)
                    .await
            }
            (Copier::Elsewhere, ReplicaEnd::Here { .. }) => Ok(None),
        }
    }

    async fn copy_failed(&self, run: &Run, message: String) -> ThinError {
        ThinError::CopyFailed {
            snapshot: run.snap.clone(),
            replica: self.dst.replica().to_owned(),
            message,
        }
    }

    async fn keep(&self, snap: &str) -> Result<(), ThinError> {
        self.snapshot_end(&self.dst, snap, Some(self.src_info.get(snap)))
            .await
    }

    async fn round(&self) -> Result<String, ThinError> {
        let snap = next_rebuild_snap(&self.have_src, &self.have_dst);
        self.snapshot_end(&self.src, &snap, None).await?;
        Ok(snap)
    }

    async fn close(&self) -> Result<(), ThinError> {
        self.ops.switch_close(self.inv, &self.switch(), self).await
    }

    async fn start_last_copy(&self, snap: &str) -> Result<Copier, ThinError> {
        self.cap(0).await?;
        let now = Inventory::load(&self.ops.client)
            .await
            .map_err(ThinError::spdk("listing the target in the switch".into()))?;
        self.copy(&now, snap).await
    }

    async fn join(&self, snap: &str) -> Result<(), ThinError> {
        self.ops.switch_join(&self.switch(), snap, self).await?;
        self.peers.switch_done(self.engine);
        self.merge_rebuild_snapshots(snap).await;
        Ok(())
    }

    async fn restore(&self) {
        self.ops.switch_restore(&self.switch()).await;
    }
}

/// A dest is reached through its node's export when it is on another node;
/// the source's node and a loopback export hold it for the copies until
/// the switch's copy is kept.
#[async_trait::async_trait]
impl SwitchSide for ReplicaEnds<'_> {
    type Error = ThinError;

    async fn dest_bdev(&self) -> Result<String, ThinError> {
        match &self.dst {
            ReplicaEnd::Here { replica, lvs, .. } => Ok(format!("{lvs}/{replica}")),
            ReplicaEnd::Peer { .. } => {
                let now = Inventory::load(&self.ops.client)
                    .await
                    .map_err(ThinError::spdk("listing the target in the switch".into()))?;
                self.dst_bdev(&now).await
            }
        }
    }

    fn closing(&self) {
        self.peers.switch_started(
            self.engine,
            self.dst.replica(),
            self.in_service
                .iter()
                .map(|(end, _)| end.replica().to_owned())
                .collect(),
        );
    }

    /// The source's node lets the dest go, and a dest of this node written
    /// from afar is held by the engine alone.
    async fn release(&self) -> Result<(), ThinError> {
        if let ReplicaEnd::Peer { replica, address } = &self.src {
            // best effort: its next SrcStart detaches a controller left behind
            if let Err(e) = self.peers.src_finish(replica, address, self.dst.replica()).await {
                tracing::warn!(engine = self.engine, replica, error = %crate::util::error_chain(&e),
                    "the source's node did not let the dest go");
            }
        }
        if self.remote_into_here {
            self.ops
                .unexport(self.dst.replica(), self.dst_nqn.as_str())
                .await?;
            self.rebuilds.lock().exported.remove(&self.key());
        }
        Ok(())
    }
}

fn rebuild_snap_number(s: &str) -> Option<u64> {
    s.strip_prefix(REBUILD_SNAP_PREFIX)?.parse().ok()
}

/// The next `talon-rb-<n>` neither replica holds.
fn next_rebuild_snap(a: &ReplicaLvols, b: &ReplicaLvols) -> String {
    let n = thin::next_round(
        a.snapshots
            .keys()
            .chain(b.snapshots.keys())
            .filter_map(|s| rebuild_snap_number(s)),
    );
    format!("{REBUILD_SNAP_PREFIX}{n}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dest_whose_node_has_not_made_its_head_ready_in_60_s_is_a_failed_step_then_asked_afresh() {
        let mut t = State::default();
        let key = ("e".to_owned(), "r".to_owned());
        let t0 = Instant::now();
        assert_eq!(t.dst_asked(&key, false, t0), DstAsk::Asked);
        assert_eq!(
            t.dst_asked(&key, false, t0 + Duration::from_secs(1)),
            DstAsk::Waiting
        );
        assert_eq!(
            t.dst_asked(&key, false, t0 + DST_WAIT - Duration::from_millis(1)),
            DstAsk::Waiting,
            "counted from the first ask, not the last"
        );
        assert_eq!(t.dst_asked(&key, false, t0 + DST_WAIT), DstAsk::TooLong);
        assert!(t.dst_waiting.is_empty(), "a failed step forgets the wait");
        // the next step asks afresh, with a bound of its own
        let t1 = t0 + DST_WAIT + Duration::from_secs(1);
        assert_eq!(t.dst_asked(&key, false, t1), DstAsk::Asked);
        assert_eq!(t.dst_asked(&key, false, t1 + DST_WAIT / 2), DstAsk::Waiting);
        // ready: no longer waited for; another dest waits on its own
        let other = ("e".to_owned(), "r2".to_owned());
        assert_eq!(t.dst_asked(&other, false, t1), DstAsk::Asked);
        assert_eq!(t.dst_asked(&key, true, t1 + DST_WAIT / 2), DstAsk::Ready);
        assert!(!t.dst_waiting.contains_key(&key));
        assert_eq!(t.dst_asked(&other, false, t1 + DST_WAIT), DstAsk::TooLong);
    }
}
