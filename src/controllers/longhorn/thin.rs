//! The engine's side of a Longhorn replica's thin rebuild (the replica
//! nodes' side and the picture: `crate::longhorn::rebuild`): its ends
//! ([`LonghornEnds`]: either replica here or on another node, asked through
//! its node's SPDKService), carried out one step per reconcile by the one
//! step machine of every thin rebuild, [`thin::step`]. Each step is derived
//! from what the replicas' lvstores hold, so a restart of talon goes on from
//! the copies made so far. Only the running copy is kept in memory (spdk_tgt
//! forgets it with a restart too; the dest's head is then made again). The
//! dest is in no raid and never read until the switch, when it equals the
//! source. Which replica is rebuilt, and what a failure reports, is
//! `longhorn_rebuilds.rs`; how failures count and when a rebuild is given
//! up is the one policy of every thin rebuild ([`thin::Failures`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Channel;

use super::{InstanceError, LonghornController, Serving};
use crate::names::InvalidName;
use crate::proto::peer::PeerError;
use crate::proto::spdkrpc;
use crate::proto::spdkrpc::spdk_service_client::SpdkServiceClient;
use crate::resources::longhorn::snapshot_lvol;
use crate::resources::longhorn::{LonghornEngine, LonghornReplica, SnapshotInfo};
use crate::runtime::Typed;
use crate::spdk::ClientError;
use crate::spdk::naming::longhorn::{self as naming, REBUILD_SNAP_PREFIX, is_rebuild_snap};
use crate::spdk::rpc::RaidBdev;
use crate::spdk::volume::naming::lvstore;
use crate::spdk::volume::replica_lvols::{ReplicaLvols, ResetHeadError, reset_head};
use crate::spdk::volume::thin::{self, Copier, CopyState, Run};
use crate::spdk::volume::{Inventory, Switch, SwitchSide, VolumeError};

/// How long a call to another node may take.
pub(super) const PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a dest's node may take to make its head ready and export it
/// (asked again every step meanwhile) before the step fails: what the node
/// itself waits for its controller when asked Longhorn's way.
const DST_WAIT: Duration = Duration::from_secs(60);

pub(super) use crate::spdk::volume::thin::Failed;

#[derive(Debug, Default)]
struct ThinState {
    /// The cap applied on a dest's node per (engine, replica).
    caps: HashMap<(String, String), u64>,
    /// Dests of this node copied from a source on another node: exported
    /// (not held by their engine) until the switch, so that node's target
    /// can write them, per (engine, replica).
    exported: BTreeSet<(String, String)>,
    /// The source replica each rebuild copies from, per (engine, replica):
    /// the last one a step chose.
    sources: HashMap<(String, String), String>,
    /// Dests on another node whose node is still making their head ready
    /// (`ReplicaRebuildingDstStart` answered without an address), per
    /// (engine, replica), since when: asked again at the next step.
    dst_waiting: HashMap<(String, String), Instant>,
}

/// Why a step of a Longhorn engine's thin rebuild failed; flattened into
/// words only where Longhorn reads them (`rebuildErrors`, the gRPC status).
#[derive(Debug, thiserror::Error)]
pub(super) enum ThinError {
    /// A step of the engine's SPDK objects (the switch's among them).
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// A call to this node's target.
    #[error("{doing}")]
    Spdk {
        doing: String,
        #[source]
        source: ClientError,
    },
    /// The node that serves `replica` was not reached.
    #[error("replica {replica}")]
    PeerUnreachable {
        replica: String,
        #[source]
        source: PeerError,
    },
    /// The node that serves `replica` answered an error (its words).
    #[error("replica {replica}: {doing} on its node: {message}")]
    Peer {
        replica: String,
        doing: &'static str,
        message: String,
    },
    /// A replica of another node was not attached here (the engine's words).
    #[error("replica {replica}: {message}")]
    Attach { replica: String, message: String },
    /// A dest's head of this node was not made again.
    #[error("replica {replica}: making its head again")]
    ResetHead {
        replica: String,
        #[source]
        source: ResetHeadError,
    },
    /// The engine has no raid1 to rebuild into.
    #[error("engine {engine} has no raid1")]
    NoRaid { engine: String },
    /// No member is in service to copy from.
    #[error("engine {engine}: no replica in service to rebuild {replica} from")]
    NoSource { engine: String, replica: String },
    /// A replica's name makes no NQN.
    #[error("replica {replica}")]
    BadName {
        replica: String,
        #[source]
        source: InvalidName,
    },
    /// A dest of this node copied from another node is not exported yet.
    #[error("replica {replica}: not exported for the copy from {source_replica}")]
    NotExported { replica: String, source_replica: String },
    /// A dest's node did not make its head ready in time.
    #[error("replica {replica}: its node has not made its head ready for the rebuild in {secs} s")]
    DestNotReady { replica: String, secs: u64 },
    /// A copy failed (SPDK's words, or its node's).
    #[error("copying snapshot {snapshot} to replica {replica}: {message}")]
    CopyFailed {
        snapshot: String,
        replica: String,
        message: String,
    },
}

impl ThinError {
    fn spdk(doing: String) -> impl FnOnce(ClientError) -> Self {
        move |source| Self::Spdk { doing, source }
    }
    fn peer(replica: &str, doing: &'static str) -> impl FnOnce(tonic::Status) -> Self {
        let replica = replica.to_owned();
        move |s| Self::Peer {
            replica,
            doing,
            message: s.message().to_owned(),
        }
    }
}

/// Where a dest on another node stands after one more ask to make its
/// head ready (`ReplicaRebuildingDstStart`, answered at once).
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

impl ThinState {
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

/// The thin rebuilds of this node's engines.
#[derive(Debug, Default, Clone)]
pub(super) struct ThinRebuilds {
    state: Arc<Mutex<ThinState>>,
    /// The copy running per (engine, replica).
    runs: thin::Runs,
    /// The failed steps per (engine, replica): the one policy of every
    /// thin rebuild.
    failures: thin::Failures,
}

impl ThinRebuilds {
    fn lock(&self) -> std::sync::MutexGuard<'_, ThinState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Counts a failed step at `now`: retried after a pause, or failed for
    /// good ([`thin::Failures`]).
    pub(super) fn failed(&self, engine: &str, replica: &str, now: Instant) -> Failed {
        self.runs.remove(engine, replica);
        self.failures.failed(engine, replica, now)
    }
    /// Whether the rebuild's next step waits (its last one failed a moment ago).
    pub(super) fn pausing(&self, engine: &str, replica: &str, now: Instant) -> bool {
        self.failures.pausing(engine, replica, now)
    }
    /// Forgets a rebuild (joined, failed for good, or no longer asked).
    pub(super) fn forget(&self, engine: &str, replica: &str) {
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
    pub(super) fn source(&self, engine: &str, replica: &str) -> Option<String> {
        self.lock()
            .sources
            .get(&(engine.to_owned(), replica.to_owned()))
            .cloned()
    }
    /// The replicas of this node that a rebuild from another node writes
    /// through their export: their engine does not hold them.
    pub(super) fn exported_dsts(&self) -> BTreeSet<String> {
        self.lock().exported.iter().map(|(_, r)| r.clone()).collect()
    }
}

/// Where a thin rebuild stands after one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Thin {
    /// Copying: bytes of the source copied so far, of its total.
    Copying { copied: u64, total: u64 },
    /// The replica is a member of the raid again, equal to the source.
    Joined,
    /// Cannot be rebuilt thin (why): SPDK's raid rebuild does it.
    Unsupported(String),
}

/// One end of a rebuild: a replica of this node or of another.
#[derive(Debug, Clone)]
enum End {
    Here { replica: String, lvs: String, size: u64 },
    Peer { replica: String, address: String },
}

impl End {
    fn replica(&self) -> &str {
        match self {
            End::Here { replica, .. } | End::Peer { replica, .. } => replica,
        }
    }
}

impl LonghornController {
    /// The SPDKService of the node that serves a replica at `address`.
    pub(super) async fn peer(
        &self,
        replica: &str,
        address: &str,
    ) -> Result<SpdkServiceClient<Channel>, InstanceError> {
        self.peers
            .client(address, self.peer_port, PEER_TIMEOUT)
            .await
            .map_err(|source| InstanceError::PeerUnreachable {
                replica: replica.to_owned(),
                source,
            })
    }

    /// [`Self::peer`], for a rebuild's step.
    async fn peer_of(&self, replica: &str, address: &str) -> Result<SpdkServiceClient<Channel>, ThinError> {
        self.peers
            .client(address, self.peer_port, PEER_TIMEOUT)
            .await
            .map_err(|source| ThinError::PeerUnreachable {
                replica: replica.to_owned(),
                source,
            })
    }

    fn end(&self, local: &BTreeMap<String, LonghornReplica>, replica: &str, address: &str) -> End {
        match local.get(replica) {
            Some(r) => End::Here {
                replica: replica.to_owned(),
                lvs: lvstore(&r.disk),
                size: r.size_bytes,
            },
            None => End::Peer {
                replica: replica.to_owned(),
                address: address.to_owned(),
            },
        }
    }

    async fn lvols_of(&self, inv: &Inventory, end: &End) -> Result<ReplicaLvols, ThinError> {
        match end {
            End::Here { replica, lvs, .. } => Ok(ReplicaLvols::from_inventory(inv, lvs, replica)),
            End::Peer { replica, address } => {
                let r = self
                    .peer_of(replica, address)
                    .await?
                    .replica_get(spdkrpc::ReplicaGetRequest {
                        name: replica.clone(),
                    })
                    .await
                    .map_err(ThinError::peer(replica, "listing its lvols"))?
                    .into_inner();
                Ok(ReplicaLvols::from(&r))
            }
        }
    }

    /// Snapshots the head of `end` as snapshot `snap`; `dst`: a rebuild
    /// dest's copy of a source snapshot, with the source's time and labels
    /// when known (another node's dest keeps them).
    async fn snapshot_end(
        &self,
        end: &End,
        snap: &str,
        dst: Option<Option<&SnapshotInfo>>,
    ) -> Result<(), ThinError> {
        match end {
            End::Here { replica, lvs, .. } => {
                let name = snapshot_lvol(replica, snap);
                crate::spdk::volume::lvol::snapshot(&self.client, &format!("{lvs}/{replica}"), &name)
                    .await
                    .map_err(ThinError::spdk(format!("snapshotting {lvs}/{replica} as {name}")))
            }
            End::Peer { replica, address } => {
                let info = dst.flatten();
                let req = spdkrpc::SnapshotRequest {
                    name: replica.clone(),
                    snapshot_name: snap.to_owned(),
                    snapshot_timestamp: info.map(|i| i.created.clone()).unwrap_or_default(),
                    labels: info
                        .map(|i| i.labels.clone().into_iter().collect())
                        .unwrap_or_default(),
                    ..Default::default()
                };
                let mut c = self.peer_of(replica, address).await?;
                let r = if dst.is_some() {
                    c.replica_rebuilding_dst_snapshot_create(req).await.map(|_| ())
                } else {
                    c.replica_snapshot_create(req).await.map(|_| ())
                };
                r.map_err(ThinError::peer(replica, "snapshotting it"))
            }
        }
    }

    async fn delete_snapshot_of(&self, end: &End, snap: &str) -> Result<(), ThinError> {
        match end {
            End::Here { replica, lvs, .. } => {
                let a = format!("{lvs}/{}", snapshot_lvol(replica, snap));
                crate::spdk::volume::lvol::delete_lvol(&self.client, &a)
                    .await
                    .map_err(ThinError::spdk(format!("deleting {a}")))
            }
            End::Peer { replica, address } => self
                .peer_of(replica, address)
                .await?
                .replica_snapshot_delete(spdkrpc::SnapshotRequest {
                    name: replica.clone(),
                    snapshot_name: snap.to_owned(),
                    ..Default::default()
                })
                .await
                .map(|_| ())
                .map_err(ThinError::peer(replica, "deleting a rebuild snapshot")),
        }
    }

    /// The bdev this node writes a dest's head through: its lvol, or its
    /// export attached.
    async fn dst_bdev(&self, inv: &Inventory, dst: &End) -> Result<String, ThinError> {
        match dst {
            End::Here { replica, lvs, .. } => Ok(format!("{lvs}/{replica}")),
            End::Peer { replica, address } => {
                self.attach_remote(inv, replica, address)
                    .await
                    .map_err(|e| ThinError::Attach {
                        replica: replica.clone(),
                        message: e.text(),
                    })
            }
        }
    }

    /// Starts copying snapshot `snap` of `src` into `dst`'s head
    /// (`dst_export`: the address a dest of this node is exported at, for a
    /// source on another node).
    async fn start_copy(
        &self,
        inv: &Inventory,
        src: &End,
        dst: &End,
        dst_export: Option<String>,
        snap: &str,
    ) -> Result<Copier, ThinError> {
        match src {
            End::Here { replica, lvs, .. } => {
                let to = self.dst_bdev(inv, dst).await?;
                let from = format!("{lvs}/{}", snapshot_lvol(replica, snap));
                thin::start_copy(&self.client, &from, &to)
                    .await
                    .map(Copier::Here)
                    .map_err(ThinError::spdk(format!("copying {from}'s clusters to {to}")))
            }
            End::Peer { replica, address } => {
                let to = match dst {
                    End::Peer { address, .. } => address.clone(),
                    // exported for this rebuild (see `exported`)
                    End::Here { .. } => dst_export.ok_or_else(|| ThinError::NotExported {
                        replica: dst.replica().to_owned(),
                        source_replica: replica.clone(),
                    })?,
                };
                let mut c = self.peer_of(replica, address).await?;
                c.replica_rebuilding_src_start(spdkrpc::ReplicaRebuildingSrcStartRequest {
                    name: replica.clone(),
                    dst_replica_name: dst.replica().to_owned(),
                    dst_replica_address: to.clone(),
                    exposed_snapshot_name: String::new(),
                })
                .await
                .map_err(ThinError::peer(replica, "starting the rebuild from it"))?;
                c.replica_rebuilding_src_shallow_copy_start(
                    spdkrpc::ReplicaRebuildingSrcShallowCopyStartRequest {
                        name: replica.clone(),
                        snapshot_name: snap.to_owned(),
                        dst_rebuilding_lvol_address: to.clone(),
                    },
                )
                .await
                .map_err(ThinError::peer(replica, "starting a copy from it"))?;
                Ok(Copier::Elsewhere)
            }
        }
    }

    /// Where copy `run` of `src` into replica `dst` stands, or `Ok(None)`
    /// when it is not known (spdk_tgt or a node restarted).
    async fn check(&self, src: &End, dst: &str, run: &Run) -> Result<Option<CopyState>, ThinError> {
        match (&run.copier, src) {
            (Copier::Here(op), _) => Ok(thin::copy_state(&self.client, *op).await.ok()),
            (Copier::Elsewhere, End::Peer { replica, address }) => {
                match self
                    .peer_of(replica, address)
                    .await?
                    .replica_rebuilding_src_shallow_copy_check(
                        spdkrpc::ReplicaRebuildingSrcShallowCopyCheckRequest {
                            name: replica.clone(),
                            dst_replica_name: dst.to_owned(),
                            snapshot_name: run.snap.clone(),
                        },
                    )
                    .await
                {
                    Ok(r) => {
                        let r = r.into_inner();
                        Ok(Some(CopyState::from_answer(
                            &r.state,
                            r.handled_clusters,
                            Some(r.error_msg).filter(|m| !m.is_empty()),
                        )))
                    }
                    Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
                    Err(s) => Err(ThinError::peer(replica, "checking the copy from it")(s)),
                }
            }
            (Copier::Elsewhere, End::Here { .. }) => Ok(None),
        }
    }

    /// The cap the rebuild of `dst` runs at (its node's head; a dest of this
    /// node is not capped: its head is open to nobody until it joins, and on
    /// v26.05 a cap set so can never be lifted again).
    async fn cap(&self, e: &str, dst: &End, mbps: u64) -> Result<(), ThinError> {
        let k = (e.to_owned(), dst.replica().to_owned());
        if self.thin.lock().caps.get(&k).copied().unwrap_or(0) == mbps {
            return Ok(());
        }
        let (replica, address) = match dst {
            End::Peer { replica, address } => (replica, address),
            // exported for a copy from another node: open by the export
            End::Here { replica, lvs, .. } if self.thin.lock().exported.contains(&k) => {
                let head = format!("{lvs}/{replica}");
                crate::spdk::volume::lvol::set_qos_cap(&self.client, &head, mbps)
                    .await
                    .map_err(ThinError::spdk(format!(
                        "replica {replica}: capping its head {head}"
                    )))?;
                self.thin.lock().caps.insert(k, mbps);
                return Ok(());
            }
            End::Here { .. } => return Ok(()),
        };
        self.peer_of(replica, address)
            .await?
            .replica_rebuilding_dst_set_qos_limit(spdkrpc::ReplicaRebuildingDstSetQosLimitRequest {
                name: replica.clone(),
                qos_limit_mbps: i64::try_from(mbps).unwrap_or(i64::MAX),
            })
            .await
            .map_err(ThinError::peer(replica, "capping its rebuild"))?;
        self.thin.lock().caps.insert(k, mbps);
        Ok(())
    }

    /// One step of the thin rebuild of replica `dst_name` of raid1 engine
    /// `e`, carried out by the one step machine ([`thin::step`]) over
    /// [`LonghornEnds`].
    pub(super) async fn thin_step(
        &self,
        inv: &Inventory,
        e: &Typed<LonghornEngine>,
        local: super::Local<'_>,
        dst_name: &str,
        plan: &Serving,
    ) -> Result<Thin, ThinError> {
        let (all, local) = (local.all, local.direct);
        let engine = e.id();
        let raid = inv.raid(engine).ok_or_else(|| ThinError::NoRaid {
            engine: engine.to_owned(),
        })?;
        let dst_address = e
            .spec
            .replica_address_map
            .get(dst_name)
            .cloned()
            .unwrap_or_default();
        let dst = self.end(local, dst_name, &dst_address);
        // the members in service, by the name the raid knows each by
        let mut in_service: Vec<(End, String)> = Vec::new();
        for (r, address) in &e.spec.replica_address_map {
            let names = self.member_names(inv, local, r);
            let slot = raid.base_bdevs_list.iter().find(|b| {
                b.name.as_ref().is_some_and(|n| names.contains(n))
                    || b.uuid.as_ref().is_some_and(|u| names.contains(u))
            });
            if r == dst_name {
                if let Some(s) = slot.and_then(|s| s.name.clone()) {
                    // it left its slot's data behind when it fell out: out again
                    crate::spdk::volume::lvol::remove_raid_member(&self.client, &s)
                        .await
                        .map_err(ThinError::spdk(format!("taking {s} out of raid {engine}")))?;
                }
                continue;
            }
            if let Some(s) = slot.filter(|s| s.is_configured).and_then(|s| s.name.clone()) {
                // a source of this node is read here even when its raid
                // reaches it through its export (another engine reads it
                // too, or read it until lately): never through this
                // node's own SPDKService, whose attach of the dest would
                // take the path this engine's attach of it needs
                in_service.push((self.end(all, r, address), s));
            }
        }
        // a source here first: the copy runs in this target
        in_service.sort_by_key(|(end, _)| matches!(end, End::Peer { .. }));
        let Some((src, _)) = in_service.first().cloned() else {
            return Err(ThinError::NoSource {
                engine: engine.to_owned(),
                replica: dst_name.to_owned(),
            });
        };
        self.thin
            .lock()
            .sources
            .insert((engine.to_owned(), dst_name.to_owned()), src.replica().to_owned());
        let bad_name = |source| ThinError::BadName {
            replica: dst_name.to_owned(),
            source,
        };
        let dst_nqn =
            naming::replica_nqn(&crate::names::ObjectName::parse("replica", dst_name).map_err(bad_name)?)
                .map_err(bad_name)?;
        let have_src = self.lvols_of(inv, &src).await?;
        let have_dst = self.lvols_of(inv, &dst).await?;
        let chain_src = have_src.chain();
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
        let ends = LonghornEnds {
            ctrl: self,
            inv,
            engine,
            qos: u64::try_from(e.spec.rebuild_qos_mbps).unwrap_or(0),
            // a dest of this node copied from another node: exported for it
            remote_into_here: matches!((&src, &dst), (End::Peer { .. }, End::Here { .. })),
            src_info: all
                .get(src.replica())
                .map(|r| r.snapshot_info.clone())
                .unwrap_or_default(),
            src,
            dst,
            dst_nqn,
            dst_address,
            have_src,
            have_dst,
            chain_src,
            own,
            cluster: inv.lvstores.first().map_or(1, |l| l.cluster_size),
            slots: in_service.iter().map(|(_, n)| Some(n.clone())).collect(),
            in_service,
            raid,
            plan,
        };
        Ok(match thin::step(&ends, &self.thin.runs).await? {
            thin::Step::Copying { copied, total } => Thin::Copying { copied, total },
            thin::Step::Joined => Thin::Joined,
        })
    }

    /// The dest's head empty right above the snapshots it shares with the
    /// source (on its node for a replica of another). True once it is so
    /// (and a dest of another node is exported again); false while that
    /// node is still at it (asked again at the next step).
    async fn reset_dst(
        &self,
        inv: &Inventory,
        src: &End,
        dst: &End,
        have: &ReplicaLvols,
        chain_src: &[String],
    ) -> Result<bool, ThinError> {
        match dst {
            End::Here { replica, lvs, size } => {
                reset_head(&self.client, lvs, replica, *size, have, chain_src)
                    .await
                    .map(|_| true)
                    .map_err(|source| ThinError::ResetHead {
                        replica: replica.clone(),
                        source,
                    })
            }
            End::Peer { replica, address } => {
                // this node's controller of it goes: the head is a new namespace
                if inv.controllers.iter().any(|c| c == replica) {
                    crate::spdk::volume::lvol::detach_controller(&self.client, replica)
                        .await
                        .map_err(ThinError::spdk(format!(
                            "replica {replica}: detaching its old controller"
                        )))?;
                }
                let list = chain_src
                    .iter()
                    .enumerate()
                    .map(|(i, s)| spdkrpc::Lvol {
                        name: s.clone(),
                        parent: i.checked_sub(1).map(|p| chain_src[p].clone()).unwrap_or_default(),
                        ..Default::default()
                    })
                    .collect();
                let src_address = match src {
                    End::Peer { address, .. } => address.clone(),
                    End::Here { .. } => String::new(),
                };
                // its node answers where it stands instead of holding this
                // reconcile while its own controller works
                let req = crate::proto::peer::at_once(spdkrpc::ReplicaRebuildingDstStartRequest {
                    name: replica.clone(),
                    src_replica_name: src.replica().to_owned(),
                    src_replica_address: src_address,
                    rebuilding_snapshot_list: list,
                    ..Default::default()
                });
                self.peer_of(replica, address)
                    .await?
                    .replica_rebuilding_dst_start(req)
                    .await
                    .map(|r| !r.into_inner().dst_head_lvol_address.is_empty())
                    .map_err(ThinError::peer(replica, "making its head again"))
            }
        }
    }

    /// The names raid1 `e` may know replica `r` by: its lvol's alias and
    /// UUID here, or the namespace bdev of its controller.
    pub(super) fn member_names(
        &self,
        inv: &Inventory,
        local: &BTreeMap<String, LonghornReplica>,
        r: &str,
    ) -> Vec<String> {
        match local.get(r) {
            Some(l) => {
                let alias = naming::replica_alias(&l.disk, r);
                let uuid = inv.lvols.get(&alias).map(|x| x.uuid.clone());
                std::iter::once(alias).chain(uuid).collect()
            }
            None => {
                let b = format!("{r}n1");
                let uuid = inv.bdevs.get(&b).and_then(|x| x.uuid.clone());
                std::iter::once(b).chain(uuid).collect()
            }
        }
    }
}

/// The ends of a Longhorn engine's thin rebuild, as one step sees them:
/// either may be a replica of this node or of another (asked through its
/// node's SPDKService).
struct LonghornEnds<'a> {
    ctrl: &'a LonghornController,
    inv: &'a Inventory,
    engine: &'a str,
    src: End,
    dst: End,
    /// The dest's own export (a dest of this node, copied into from a
    /// source on another node, is written through it until the switch).
    dst_nqn: crate::names::Nqn,
    dst_address: String,
    remote_into_here: bool,
    /// The source's snapshot times and labels when it is of this node
    /// (`LonghornReplica::snapshot_info`): a dest of another node keeps them
    /// with its copies.
    src_info: BTreeMap<String, SnapshotInfo>,
    have_src: ReplicaLvols,
    have_dst: ReplicaLvols,
    chain_src: Vec<String>,
    own: Vec<u64>,
    cluster: u64,
    /// The members in service, by the name the raid knows each by.
    in_service: Vec<(End, String)>,
    /// The same names as slots, the source's first.
    slots: Vec<Option<String>>,
    /// The raid as the step listed it.
    raid: &'a RaidBdev,
    plan: &'a Serving,
    /// `rebuildQosMbps`: the cap the copies run at.
    qos: u64,
}

impl LonghornEnds<'_> {
    fn key(&self) -> (String, String) {
        (self.engine.to_owned(), self.dst.replica().to_owned())
    }
    /// The address a dest of this node is written at by a source's node.
    fn dst_export(&self) -> Option<String> {
        self.remote_into_here.then(|| self.dst_address.clone())
    }
    /// The switch of this rebuild: the one checked switch ([`Switch`])
    /// under the engine's names, the dest after the members in service.
    fn switch(&self) -> Switch<'_> {
        Switch {
            of: self.engine,
            replica: self.dst.replica(),
            names: &self.plan.names,
            spec: &self.plan.spec,
            raid: self.raid,
            source: self.in_service.first().map_or("", |(_, n)| n.as_str()),
            slots: &self.slots,
            dest_slot: self.slots.len(),
        }
    }
}

#[async_trait::async_trait]
impl thin::Ends for LonghornEnds<'_> {
    type Error = ThinError;

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
        let over_nvme_tcp = matches!(self.src, End::Peer { .. }) || matches!(self.dst, End::Peer { .. });
        self.have_src.head_bytes > thin::switch_bytes(over_nvme_tcp)
    }

    fn rounds(&self) -> usize {
        self.chain_src.iter().filter(|s| is_rebuild_snap(s)).count()
    }

    async fn at(&self) -> Result<thin::At, ThinError> {
        let j = self.have_dst.shared(&self.chain_src);
        // a dest's node still making its head ready is asked again first
        let waiting = matches!(self.dst, End::Peer { .. })
            && self.ctrl.thin.lock().dst_waiting.contains_key(&self.key());
        Ok(thin::At::Holds {
            shared: j,
            ready: self.have_dst.ready_over(&self.chain_src, j) && !waiting,
        })
    }

    async fn make_ready(&self, j: usize) -> Result<(), ThinError> {
        let (ctrl, engine, dst_name) = (self.ctrl, self.engine, self.dst.replica());
        if self.remote_into_here {
            // its export goes while its head is made again (made again
            // by the replica's controller at the next reconcile)
            ctrl.ops.unexport(dst_name, self.dst_nqn.as_str()).await?;
        }
        let ready = ctrl
            .reset_dst(self.inv, &self.src, &self.dst, &self.have_dst, &self.chain_src)
            .await?;
        let by = match ctrl.thin.lock().dst_asked(&self.key(), ready, Instant::now()) {
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
            tracing::info!(
                engine,
                replica = dst_name,
                source = self.src.replica(),
                shared = j,
                "rebuilding replica thin: {by} over the snapshots it shares"
            );
        }
        Ok(())
    }

    /// A dest of this node copied from another node is exported first (by
    /// the replica's controller, at its next reconcile).
    async fn writable(&self) -> Result<bool, ThinError> {
        if !self.remote_into_here {
            return Ok(true);
        }
        let newly = self.ctrl.thin.lock().exported.insert(self.key());
        let ready = self
            .inv
            .subsystem(self.dst_nqn.as_str())
            .is_some_and(|s| !s.namespaces.is_empty() && !s.listen_addresses.is_empty());
        Ok(!newly && ready)
    }

    async fn start_copy(&self, j: usize) -> Result<Copier, ThinError> {
        self.ctrl.cap(self.engine, &self.dst, self.qos).await?;
        self.ctrl
            .start_copy(
                self.inv,
                &self.src,
                &self.dst,
                self.dst_export(),
                &self.chain_src[j],
            )
            .await
    }

    async fn check(&self, run: &Run) -> Result<Option<CopyState>, ThinError> {
        self.ctrl.check(&self.src, self.dst.replica(), run).await
    }

    async fn copy_failed(&self, run: &Run, message: String) -> ThinError {
        ThinError::CopyFailed {
            snapshot: run.snap.clone(),
            replica: self.dst.replica().to_owned(),
            message,
        }
    }

    async fn keep(&self, snap: &str) -> Result<(), ThinError> {
        self.ctrl
            .snapshot_end(&self.dst, snap, Some(self.src_info.get(snap)))
            .await
    }

    async fn round(&self) -> Result<String, ThinError> {
        let snap = next_rebuild_snap(&self.have_src, &self.have_dst);
        self.ctrl.snapshot_end(&self.src, &snap, None).await?;
        Ok(snap)
    }

    async fn close(&self) -> Result<(), ThinError> {
        self.ctrl.ops.switch_close(self.inv, &self.switch(), self).await
    }

    async fn start_last_copy(&self, snap: &str) -> Result<Copier, ThinError> {
        let ctrl = self.ctrl;
        ctrl.cap(self.engine, &self.dst, 0).await?;
        let now = Inventory::load(&ctrl.client)
            .await
            .map_err(ThinError::spdk("listing the target in the switch".into()))?;
        ctrl.start_copy(&now, &self.src, &self.dst, self.dst_export(), snap)
            .await
    }

    async fn join(&self, snap: &str) -> Result<(), ThinError> {
        self.ctrl.ops.switch_join(&self.switch(), snap, self).await?;
        self.ctrl.session.switch_done(self.engine);
        self.merge_rebuild_snapshots(snap).await;
        Ok(())
    }

    async fn restore(&self) {
        self.ctrl.ops.switch_restore(&self.switch()).await;
    }
}

/// A Longhorn dest is reached through its node's export when it is on
/// another node; the source's node and a loopback export hold it for the
/// copies until the switch's copy is kept.
#[async_trait::async_trait]
impl SwitchSide for LonghornEnds<'_> {
    type Error = ThinError;

    async fn dest_bdev(&self) -> Result<String, ThinError> {
        let ctrl = self.ctrl;
        match &self.dst {
            End::Here { replica, lvs, .. } => Ok(format!("{lvs}/{replica}")),
            End::Peer { .. } => {
                let now = Inventory::load(&ctrl.client)
                    .await
                    .map_err(ThinError::spdk("listing the target in the switch".into()))?;
                ctrl.dst_bdev(&now, &self.dst).await
            }
        }
    }

    fn closing(&self) {
        // ReplicaList keeps the modes from before the switch until the raid
        // is there again: the members in service stay RW for the manager
        self.ctrl.session.start_switch(
            self.engine,
            crate::resources::longhorn::SwitchModes {
                joining: self.dst.replica().to_owned(),
                in_service: self
                    .in_service
                    .iter()
                    .map(|(end, _)| end.replica().to_owned())
                    .collect(),
            },
        );
    }

    /// The source's node lets the dest go, and a dest of this node written
    /// from afar is held by the engine alone.
    async fn release(&self) -> Result<(), ThinError> {
        let (ctrl, engine, dst) = (self.ctrl, self.engine, &self.dst);
        if let End::Peer { replica, address } = &self.src {
            // best effort: its next SrcStart detaches a controller left behind
            let finish = async {
                ctrl.peer_of(replica, address)
                    .await?
                    .replica_rebuilding_src_finish(spdkrpc::ReplicaRebuildingSrcFinishRequest {
                        name: replica.clone(),
                        dst_replica_name: dst.replica().to_owned(),
                    })
                    .await
                    .map_err(ThinError::peer(replica, "letting the dest go"))
            };
            if let Err(e) = finish.await {
                tracing::warn!(engine, replica, error = %crate::util::error_chain(&e),
                    "the source's node did not let the dest go");
            }
        }
        if self.remote_into_here {
            ctrl.ops.unexport(dst.replica(), self.dst_nqn.as_str()).await?;
            ctrl.thin.lock().exported.remove(&self.key());
        }
        Ok(())
    }
}

/// The switch's ends of a Longhorn engine ([`thin::switch`]).
impl LonghornEnds<'_> {
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
                if let Err(m) = self.ctrl.delete_snapshot_of(end, s).await {
                    tracing::warn!(engine = self.engine, replica = end.replica(), error = %m,
                        "rebuild snapshot not merged away");
                }
            }
        }
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
        let mut t = ThinState::default();
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
