//! The engine's side of a Longhorn replica's thin rebuild (the replica
//! nodes' side and the picture: `crate::longhorn::rebuild`): its ends
//! ([`LonghornEnds`]: either replica here or on another node, asked through
//! its node's SPDKService), carried out one step per reconcile by the one
//! step machine of every thin rebuild, [`thin::step`]. Each step is derived
//! from what the replicas' lvstores hold, so a restart of talon goes on from
//! the copies made so far. Only the running copy is kept in memory (spdk_tgt
//! forgets it with a restart too; the dest's head is then made again). The
//! dest is in no raid and never read until the switch, when it equals the
//! source. Which replica is rebuilt, and how failures count, is
//! `longhorn_rebuilds.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Channel;

use super::{LonghornController, Serving, chain};
use crate::proto::spdkrpc;
use crate::proto::spdkrpc::spdk_service_client::SpdkServiceClient;
use crate::resources::longhorn::snapshot_lvol;
use crate::resources::longhorn::{LonghornEngine, LonghornReplica};
use crate::runtime::Typed;
use crate::spdk::naming::longhorn::{self as naming, REBUILD_SNAP_PREFIX, is_rebuild_snap};
use crate::spdk::volume::Inventory;
use crate::spdk::volume::naming::lvstore;
use crate::spdk::volume::replica_lvols::{ReplicaLvols, reset_head};
use crate::spdk::volume::thin::{self, Copier, CopyState, Run};

/// Failed steps in a row before the rebuild is reported failed (ERR)...
pub(super) const MAX_FAILURES: u32 = 3;
/// ...and for at least this long: a peer whose talon or spdk_tgt is still
/// starting (seconds on a loaded node) is waited for, not failed at once; one
/// gone for this long is failed, the bound Longhorn gives a remote replica's
/// link (ctrlr_loss_timeout 15 s).
const FAIL_AFTER: Duration = Duration::from_secs(15);
/// The pause after a failed step: doubles from 1 s, at most this.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(8);
/// How long a call to another node may take.
pub(super) const PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a dest's node may take to make its head ready and export it
/// (asked again every step meanwhile) before the step fails: what the node
/// itself waits for its controller when asked Longhorn's way.
const DST_WAIT: Duration = Duration::from_secs(60);

/// A rebuild whose last steps failed.
#[derive(Debug, Clone, Copy)]
struct Failing {
    /// Failed steps in a row.
    count: u32,
    /// When the first of them failed.
    since: Instant,
    /// No step before this.
    retry_at: Instant,
}

/// What a failed step means for its rebuild.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failed {
    /// Tried again after a pause: failed steps in a row so far.
    Retry(u32),
    /// Failed for good ([`MAX_FAILURES`] in a row over [`FAIL_AFTER`]).
    ForGood(u32),
}

#[derive(Debug, Default)]
struct ThinState {
    /// Failed steps in a row per (engine, replica).
    failures: HashMap<(String, String), Failing>,
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
}

impl ThinRebuilds {
    fn lock(&self) -> std::sync::MutexGuard<'_, ThinState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Counts a failed step at `now`: retried after a pause, or failed for good.
    pub(super) fn failed(&self, engine: &str, replica: &str, now: Instant) -> Failed {
        self.runs.remove(engine, replica);
        let mut s = self.lock();
        let f = s
            .failures
            .entry((engine.to_owned(), replica.to_owned()))
            .or_insert(Failing {
                count: 0,
                since: now,
                retry_at: now,
            });
        f.count += 1;
        let pause = Duration::from_secs(1u64 << (f.count - 1).min(8)).min(MAX_RETRY_PAUSE);
        f.retry_at = now + pause;
        if f.count >= MAX_FAILURES && now.duration_since(f.since) >= FAIL_AFTER {
            Failed::ForGood(f.count)
        } else {
            Failed::Retry(f.count)
        }
    }
    /// Whether the rebuild's next step waits (its last one failed a moment ago).
    pub(super) fn pausing(&self, engine: &str, replica: &str, now: Instant) -> bool {
        self.lock()
            .failures
            .get(&(engine.to_owned(), replica.to_owned()))
            .is_some_and(|f| now < f.retry_at)
    }
    /// Forgets a rebuild (joined, failed for good, or no longer asked).
    pub(super) fn forget(&self, engine: &str, replica: &str) {
        self.runs.remove(engine, replica);
        let mut s = self.lock();
        let k = (engine.to_owned(), replica.to_owned());
        s.failures.remove(&k);
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
    ) -> Result<SpdkServiceClient<Channel>, String> {
        crate::proto::peer::peer_client(address, self.peer_port, PEER_TIMEOUT)
            .await
            .map_err(|e| format!("replica {replica}: {}", crate::util::error_chain(&e)))
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

    async fn lvols_of(&self, inv: &Inventory, end: &End) -> Result<ReplicaLvols, String> {
        match end {
            End::Here { replica, lvs, .. } => Ok(ReplicaLvols::from_inventory(inv, lvs, replica)),
            End::Peer { replica, address } => {
                let r = self
                    .peer(replica, address)
                    .await?
                    .replica_get(spdkrpc::ReplicaGetRequest {
                        name: replica.clone(),
                    })
                    .await
                    .map_err(|s| format!("replica {replica}: its node: {}", s.message()))?
                    .into_inner();
                Ok(ReplicaLvols::from(&r))
            }
        }
    }

    /// Snapshots the head of `end` as snapshot `snap`.
    async fn snapshot_end(&self, end: &End, snap: &str, dst: bool) -> Result<(), String> {
        match end {
            End::Here { replica, lvs, .. } => {
                let name = snapshot_lvol(replica, snap);
                crate::spdk::volume::lvol::snapshot(&self.client, &format!("{lvs}/{replica}"), &name)
                    .await
                    .map_err(|e| format!("snapshotting {lvs}/{replica} as {name}: {}", chain(&e)))
            }
            End::Peer { replica, address } => {
                let req = spdkrpc::SnapshotRequest {
                    name: replica.clone(),
                    snapshot_name: snap.to_owned(),
                    ..Default::default()
                };
                let mut c = self.peer(replica, address).await?;
                let r = if dst {
                    c.replica_rebuilding_dst_snapshot_create(req).await.map(|_| ())
                } else {
                    c.replica_snapshot_create(req).await.map(|_| ())
                };
                r.map_err(|s| {
                    format!(
                        "replica {replica}: snapshotting it as {snap} on its node: {}",
                        s.message()
                    )
                })
            }
        }
    }

    async fn delete_snapshot_of(&self, end: &End, snap: &str) -> Result<(), String> {
        match end {
            End::Here { replica, lvs, .. } => {
                let a = format!("{lvs}/{}", snapshot_lvol(replica, snap));
                crate::spdk::volume::lvol::delete_lvol(&self.client, &a)
                    .await
                    .map_err(|e| format!("deleting {a}: {}", chain(&e)))
            }
            End::Peer { replica, address } => self
                .peer(replica, address)
                .await?
                .replica_snapshot_delete(spdkrpc::SnapshotRequest {
                    name: replica.clone(),
                    snapshot_name: snap.to_owned(),
                    ..Default::default()
                })
                .await
                .map(|_| ())
                .map_err(|s| {
                    format!(
                        "replica {replica}: deleting snapshot {snap} on its node: {}",
                        s.message()
                    )
                }),
        }
    }

    /// The bdev this node writes a dest's head through: its lvol, or its
    /// export attached.
    async fn dst_bdev(&self, inv: &Inventory, dst: &End) -> Result<String, String> {
        match dst {
            End::Here { replica, lvs, .. } => Ok(format!("{lvs}/{replica}")),
            End::Peer { replica, address } => self.attach_remote(inv, replica, address).await,
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
    ) -> Result<Copier, String> {
        match src {
            End::Here { replica, lvs, .. } => {
                let to = self.dst_bdev(inv, dst).await?;
                let from = format!("{lvs}/{}", snapshot_lvol(replica, snap));
                thin::start_copy(&self.client, &from, &to)
                    .await
                    .map(Copier::Here)
                    .map_err(|x| format!("copying {from}'s clusters to {to}: {}", chain(&x)))
            }
            End::Peer { replica, address } => {
                let to = match dst {
                    End::Peer { address, .. } => address.clone(),
                    // exported for this rebuild (see `exported`)
                    End::Here { .. } => dst_export.ok_or_else(|| {
                        format!(
                            "replica {}: not exported for the copy from {replica}",
                            dst.replica()
                        )
                    })?,
                };
                let mut c = self.peer(replica, address).await?;
                let fail = |s: tonic::Status| format!("replica {replica}: its node: {}", s.message());
                c.replica_rebuilding_src_start(spdkrpc::ReplicaRebuildingSrcStartRequest {
                    name: replica.clone(),
                    dst_replica_name: dst.replica().to_owned(),
                    dst_replica_address: to.clone(),
                    exposed_snapshot_name: String::new(),
                })
                .await
                .map_err(fail)?;
                c.replica_rebuilding_src_shallow_copy_start(
                    spdkrpc::ReplicaRebuildingSrcShallowCopyStartRequest {
                        name: replica.clone(),
                        snapshot_name: snap.to_owned(),
                        dst_rebuilding_lvol_address: to.clone(),
                    },
                )
                .await
                .map_err(fail)?;
                Ok(Copier::Elsewhere)
            }
        }
    }

    /// Where copy `run` of `src` into replica `dst` stands, or `Ok(None)`
    /// when it is not known (spdk_tgt or a node restarted).
    async fn check(&self, src: &End, dst: &str, run: &Run) -> Result<Option<CopyState>, String> {
        match (&run.copier, src) {
            (Copier::Here(op), _) => Ok(thin::copy_state(&self.client, *op).await.ok()),
            (Copier::Elsewhere, End::Peer { replica, address }) => {
                match self
                    .peer(replica, address)
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
                    Err(s) => Err(format!("replica {replica}: its node: {}", s.message())),
                }
            }
            (Copier::Elsewhere, End::Here { .. }) => Ok(None),
        }
    }

    /// The cap the rebuild of `dst` runs at (its node's head; a dest of this
    /// node is not capped: its head is open to nobody until it joins, and on
    /// v26.05 a cap set so can never be lifted again).
    async fn cap(&self, e: &str, dst: &End, mbps: u64) -> Result<(), String> {
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
                    .map_err(|x| format!("replica {replica}: capping its head {head}: {}", chain(&x)))?;
                self.thin.lock().caps.insert(k, mbps);
                return Ok(());
            }
            End::Here { .. } => return Ok(()),
        };
        self.peer(replica, address)
            .await?
            .replica_rebuilding_dst_set_qos_limit(spdkrpc::ReplicaRebuildingDstSetQosLimitRequest {
                name: replica.clone(),
                qos_limit_mbps: i64::try_from(mbps).unwrap_or(i64::MAX),
            })
            .await
            .map_err(|s| {
                format!(
                    "replica {replica}: capping its rebuild on its node: {}",
                    s.message()
                )
            })?;
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
        local: &BTreeMap<String, LonghornReplica>,
        dst_name: &str,
        plan: &Serving,
    ) -> Result<Thin, String> {
        let engine = e.id();
        let raid = inv
            .raid(engine)
            .ok_or_else(|| format!("engine {engine} has no raid1"))?;
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
                        .map_err(|x| format!("taking {s} out of raid {engine}: {}", chain(&x)))?;
                }
                continue;
            }
            if let Some(s) = slot.filter(|s| s.is_configured).and_then(|s| s.name.clone()) {
                in_service.push((self.end(local, r, address), s));
            }
        }
        // a source here first: the copy runs in this target
        in_service.sort_by_key(|(end, _)| matches!(end, End::Peer { .. }));
        let Some((src, _)) = in_service.first().cloned() else {
            return Err(format!(
                "engine {engine}: no replica in service to rebuild {dst_name} from"
            ));
        };
        self.thin
            .lock()
            .sources
            .insert((engine.to_owned(), dst_name.to_owned()), src.replica().to_owned());
        let dst_nqn = naming::replica_nqn(
            &crate::names::ObjectName::parse("replica", dst_name).map_err(|x| x.to_string())?,
        )
        .map_err(|x| x.to_string())?;
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
            src,
            dst,
            dst_nqn,
            dst_address,
            have_src,
            have_dst,
            chain_src,
            own,
            cluster: inv.lvstores.first().map_or(1, |l| l.cluster_size),
            in_service,
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
    ) -> Result<bool, String> {
        match dst {
            End::Here { replica, lvs, size } => {
                reset_head(&self.client, lvs, replica, *size, have, chain_src)
                    .await
                    .map(|_| true)
            }
            End::Peer { replica, address } => {
                // this node's controller of it goes: the head is a new namespace
                if inv.controllers.iter().any(|c| c == replica) {
                    crate::spdk::volume::lvol::detach_controller(&self.client, replica)
                        .await
                        .map_err(|x| {
                            format!("replica {replica}: detaching its old controller: {}", chain(&x))
                        })?;
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
                self.peer(replica, address)
                    .await?
                    .replica_rebuilding_dst_start(req)
                    .await
                    .map(|r| !r.into_inner().dst_head_lvol_address.is_empty())
                    .map_err(|s| {
                        format!(
                            "replica {replica}: making its head again on its node: {}",
                            s.message()
                        )
                    })
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
    have_src: ReplicaLvols,
    have_dst: ReplicaLvols,
    chain_src: Vec<String>,
    own: Vec<u64>,
    cluster: u64,
    /// The members in service, by the name the raid knows each by.
    in_service: Vec<(End, String)>,
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
}

#[async_trait::async_trait]
impl thin::Ends for LonghornEnds<'_> {
    type Error = String;

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

    async fn at(&self) -> Result<thin::At, String> {
        let j = self.have_dst.shared(&self.chain_src);
        // a dest's node still making its head ready is asked again first
        let waiting = matches!(self.dst, End::Peer { .. })
            && self.ctrl.thin.lock().dst_waiting.contains_key(&self.key());
        Ok(thin::At::Holds {
            shared: j,
            ready: self.have_dst.ready_over(&self.chain_src, j) && !waiting,
        })
    }

    async fn make_ready(&self, j: usize) -> Result<(), String> {
        let (ctrl, engine, dst_name) = (self.ctrl, self.engine, self.dst.replica());
        if self.remote_into_here {
            // its export goes while its head is made again (made again
            // by the replica's controller at the next reconcile)
            ctrl.ops
                .unexport(dst_name, self.dst_nqn.as_str())
                .await
                .map_err(|x| format!("replica {dst_name}: {}", crate::util::error_chain(&x)))?;
        }
        let ready = ctrl
            .reset_dst(self.inv, &self.src, &self.dst, &self.have_dst, &self.chain_src)
            .await?;
        let by = match ctrl.thin.lock().dst_asked(&self.key(), ready, Instant::now()) {
            DstAsk::Ready => Some("its head made again"),
            DstAsk::Asked => Some("its node makes its head again"),
            DstAsk::Waiting => None,
            DstAsk::TooLong => {
                return Err(format!(
                    "replica {dst_name}: its node has not made its head ready for the rebuild in {} s",
                    DST_WAIT.as_secs()
                ));
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
    async fn writable(&self) -> Result<bool, String> {
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

    async fn start_copy(&self, j: usize) -> Result<Copier, String> {
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

    async fn check(&self, run: &Run) -> Result<Option<CopyState>, String> {
        self.ctrl.check(&self.src, self.dst.replica(), run).await
    }

    async fn copy_failed(&self, run: &Run, message: String) -> String {
        format!(
            "copying snapshot {} to replica {}: {message}",
            run.snap,
            self.dst.replica()
        )
    }

    async fn keep(&self, snap: &str) -> Result<(), String> {
        self.ctrl.snapshot_end(&self.dst, snap, true).await
    }

    async fn round(&self) -> Result<String, String> {
        let snap = next_rebuild_snap(&self.have_src, &self.have_dst);
        self.ctrl.snapshot_end(&self.src, &snap, false).await?;
        Ok(snap)
    }

    async fn close(&self) -> Result<(), String> {
        let (ctrl, engine) = (self.ctrl, self.engine);
        // ReplicaList keeps the modes from before the switch until the raid
        // is there again: the members in service stay RW for the manager
        ctrl.session.start_switch(
            engine,
            crate::resources::longhorn::SwitchModes {
                joining: self.dst.replica().to_owned(),
                in_service: self
                    .in_service
                    .iter()
                    .map(|(end, _)| end.replica().to_owned())
                    .collect(),
            },
        );
        // hosts off: their connections drop, their I/O waits for the reconnect
        ctrl.ops
            .close_export(self.inv, engine, self.plan.nqn().as_str())
            .await
            .map_err(|x| crate::util::error_chain(&x))?;
        crate::spdk::volume::lvol::delete_raid(&ctrl.client, engine)
            .await
            .map_err(|x| format!("deleting raid {engine} for the switch: {}", chain(&x)))
    }

    async fn start_last_copy(&self, snap: &str) -> Result<Copier, String> {
        let ctrl = self.ctrl;
        ctrl.cap(self.engine, &self.dst, 0).await?;
        let now = Inventory::load(&ctrl.client)
            .await
            .map_err(|x| format!("listing the target in the switch: {}", chain(&x)))?;
        ctrl.start_copy(&now, &self.src, &self.dst, self.dst_export(), snap)
            .await
    }

    async fn join(&self, snap: &str) -> Result<(), String> {
        self.join_raid().await?;
        self.ctrl.session.switch_done(self.engine);
        self.merge_rebuild_snapshots(snap).await;
        Ok(())
    }

    async fn restore(&self) {
        let (ctrl, engine) = (self.ctrl, self.engine);
        let mut slots: Vec<Option<String>> = self.in_service.iter().map(|(_, n)| Some(n.clone())).collect();
        // one member: a raid1 still, its second slot held by a placeholder
        if slots.len() == 1 {
            slots.push(None);
        }
        let restored = async {
            let mut now = Inventory::load(&ctrl.client)
                .await
                .map_err(|x| format!("listing the target: {}", chain(&x)))?;
            ctrl.serve(&mut now, &self.plan.plan(slots, false)).await
        };
        match restored.await {
            Ok(_) => tracing::info!(
                engine,
                "rebuild: the switch failed; the raid serves again over the members in service"
            ),
            Err(m) => tracing::warn!(engine, error = %m,
                "rebuild: the switch failed and the raid could not be made again now; the next reconcile does"),
        }
    }
}

/// The switch's ends of a Longhorn engine ([`thin::switch`]).
impl LonghornEnds<'_> {
    /// The raid made again over the members in service and the dest, once
    /// the dest holds the switch's copy: the source's node lets the dest go,
    /// and a dest of this node written from afar is held by the engine alone.
    async fn join_raid(&self) -> Result<(), String> {
        let (ctrl, engine, dst) = (self.ctrl, self.engine, &self.dst);
        if let End::Peer { replica, address } = &self.src {
            // best effort: its next SrcStart detaches a controller left behind
            let finish = async {
                ctrl.peer(replica, address)
                    .await?
                    .replica_rebuilding_src_finish(spdkrpc::ReplicaRebuildingSrcFinishRequest {
                        name: replica.clone(),
                        dst_replica_name: dst.replica().to_owned(),
                    })
                    .await
                    .map_err(|s| s.message().to_owned())
            };
            if let Err(m) = finish.await {
                tracing::warn!(engine, replica, error = %m, "the source's node did not let the dest go");
            }
        }
        if self.remote_into_here {
            ctrl.ops
                .unexport(dst.replica(), self.dst_nqn.as_str())
                .await
                .map_err(|x| format!("replica {}: {}", dst.replica(), crate::util::error_chain(&x)))?;
            ctrl.thin.lock().exported.remove(&self.key());
        }
        let mut now = Inventory::load(&ctrl.client)
            .await
            .map_err(|x| format!("listing the target after the switch: {}", chain(&x)))?;
        let dst_bdev = ctrl.dst_bdev(&now, dst).await?;
        let slots: Vec<Option<String>> = self
            .in_service
            .iter()
            .map(|(_, n)| Some(n.clone()))
            .chain([Some(dst_bdev)])
            .collect();
        ctrl.serve(&mut now, &self.plan.plan(slots, false))
            .await
            .map_err(|x| format!("making raid1 {engine} again: {x}"))
            .map(|_| ())
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

    #[test]
    fn a_failing_step_is_retried_after_pauses_and_fails_for_good_only_after_15_s() {
        let t = ThinRebuilds::default();
        let t0 = Instant::now();
        // a peer still starting: three fast failures are not the end
        assert_eq!(t.failed("e", "r", t0), Failed::Retry(1));
        assert!(t.pausing("e", "r", t0 + Duration::from_millis(900)));
        assert!(!t.pausing("e", "r", t0 + Duration::from_secs(1)));
        assert_eq!(t.failed("e", "r", t0 + Duration::from_secs(1)), Failed::Retry(2));
        assert!(t.pausing("e", "r", t0 + Duration::from_millis(2900)));
        assert_eq!(t.failed("e", "r", t0 + Duration::from_secs(3)), Failed::Retry(3));
        // the pause stops growing at 8 s
        for i in 4..10 {
            let _ = t.failed("e", "r", t0 + Duration::from_secs(3 + i));
        }
        let late = t0 + Duration::from_secs(13);
        assert!(t.pausing("e", "r", late) && !t.pausing("e", "r", late + MAX_RETRY_PAUSE));
        // failing for 15 s and more: for good
        assert_eq!(t.failed("e", "r", t0 + FAIL_AFTER), Failed::ForGood(10));
        // another replica, and a forgotten one, start afresh
        assert_eq!(t.failed("e", "r2", t0), Failed::Retry(1));
        t.forget("e", "r");
        assert!(!t.pausing("e", "r", t0));
        assert_eq!(t.failed("e", "r", t0 + FAIL_AFTER), Failed::Retry(1));
    }
}
