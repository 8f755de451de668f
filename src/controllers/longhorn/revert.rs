//! Reverts and rebuild starts: `SnapshotRevert` numbers a request on the engine
//! (`LonghornEngine.revert`), `ReplicaSnapshotRevert` (another node's
//! engine) one on the replica (`LonghornReplica.revert`); this carries each
//! out once per number and reports it in `LonghornInstanceStatus.revert`,
//! which the calls wait on.
//!
//! ```text
//!   engine revert n ──> refused, nothing touched: a frontend, a replica being rebuilt (WO),
//!                       a replica of this node without the snapshot
//!                   ──> LonghornRevertLedger n written (persisted: a restart, or an
//!                       engine of the volume made again after a detach, carries it on)
//!                   ──> raid1 deleted, remote members detached
//!                       another node's replicas: its ReplicaSnapshotRevert (each checks first)
//!                       this node's: head <lvs>/<replica> deleted, cloned again from <replica>-snap-<s>
//!                       (asked at once: a node still at it is named in status.revert.waiting,
//!                       the raid1 stays down, asked again at the next reconcile)
//!                   ──> failed half way: status.revert.error, the engine not served
//!                       (its replicas may differ), tried again every reconcile
//!                   ──> done: the ledger destroyed, then the rest of the reconcile makes
//!                       the raid1 over the new heads
//!   replica revert n ─> its export down, head cloned again, exported again
//!   replica dstStart n (ReplicaRebuildingDstStart) ─> head not empty over the shared snapshots?
//!                       its export down, the snapshots not shared deleted, head made again, exported again
//! ```

use std::collections::BTreeMap;

use super::purge::rebuilding;
use super::{InstanceError, LonghornController, status};
use crate::names::ObjectName;
use crate::proto::spdkrpc;
use crate::resources::longhorn::{
    DstStartRequest, DstStartStatus, InstanceKind, InstanceState, LonghornEngine, LonghornInstanceStatus,
    LonghornReplica, LonghornRevertLedger, RevertRequest, RevertStatus, snapshot_lvol,
};
use crate::runtime::{ControllerError, ReconcileContext, Typed};
use crate::spdk::naming::longhorn as naming;
use crate::spdk::volume::naming::lvstore;
use crate::spdk::volume::{Inventory, RevertAsk, RevertHead, RevertMembers, RevertPeer, Reverted, TakeDown};
use crate::spdk::volume::{ReplicaLvols, clone_base_entrypoint};

impl LonghornController {
    /// Carries out engine `e`'s revert request unless it was (`prev` holds
    /// the last one); gives the revert status to report. `inv` is listed
    /// again after a revert. A revert that has begun is in the engine's
    /// [`LonghornRevertLedger`] until every head is reverted: a request of an
    /// older session (a talon that stopped half way, its statuses gone) that
    /// the ledger names is carried on, so no raid1 is made over heads some
    /// of which are reverted and some not.
    pub(super) async fn revert(
        &self,
        ctx: &mut ReconcileContext,
        inv: &mut Inventory,
        e: &Typed<LonghornEngine>,
        local: &BTreeMap<String, LonghornReplica>,
        prev: Option<&LonghornInstanceStatus>,
    ) -> Result<Option<RevertStatus>, ControllerError> {
        let done = prev.and_then(|p| p.revert.as_ref());
        // a revert begun and not done: the heads may differ, and only a
        // revert done to the end makes them one again. Its ledger is this
        // engine's, or one of its volume's engine that went (a detach, or a
        // delete after the revert failed) and was made again
        let (ledger_id, begun) = match ctx.get::<LonghornRevertLedger>(e.id())? {
            Some(l) => (Some(l.id().to_owned()), Some(l.spec)),
            None => ctx
                .list::<LonghornRevertLedger>()?
                .into_iter()
                .find(|l| !l.spec.volume.is_empty() && l.spec.volume == e.spec.volume)
                .map_or((None, None), |l| (Some(l.id().to_owned()), Some(l.spec))),
        };
        // with no request (an engine made again), the ledger's is carried on
        let carried = begun.as_ref().map(|b| RevertRequest {
            request: b.request,
            session: 0,
            snapshot: b.snapshot.clone(),
        });
        let Some(r) = e
            .spec
            .revert
            .as_ref()
            .filter(|r| RevertStatus::pending(done, r, self.session.id()) || begun.is_some())
            .or(carried.as_ref())
        else {
            return Ok(done.cloned());
        };
        let mut out = RevertStatus {
            request: r.request,
            snapshot: r.snapshot.clone(),
            ..RevertStatus::default()
        };
        // a request tried before got past the checks (and may have touched
        // heads), as did the one a ledger holds (the checks would refuse
        // what it left, and its heads are to be made one again)
        let retry = done.is_some_and(|d| d.request == r.request) || begun.is_some();
        if !retry && let Err(m) = revert_allowed(inv, e.id(), &e.spec, local, prev, &r.snapshot) {
            tracing::info!(engine = e.id(), request = r.request, refused = %m, "snapshot revert");
            out.refused = m.text();
            return Ok(Some(out));
        }
        if let Some(b) = begun
            .as_ref()
            .filter(|_| done.is_none_or(|d| d.request != r.request))
        {
            tracing::warn!(engine = e.id(), request = r.request, snapshot = %r.snapshot, begun = b.request,
                "snapshot revert: one begun and not done (before a restart, or superseded) is carried on; its heads may differ until it is done");
        }
        // recorded before anything is touched, kept until it is done
        let replicas = match &begun {
            Some(b) => b.replicas.clone(),
            None => e
                .spec
                .replica_address_map
                .keys()
                .filter(|r| local.contains_key(*r))
                .cloned()
                .collect(),
        };
        ctx.apply(
            e.id(),
            LonghornRevertLedger {
                request: r.request,
                snapshot: r.snapshot.clone(),
                volume: e.spec.volume.clone(),
                replicas,
            },
        )?;
        if let Some(old) = ledger_id.filter(|l| l != e.id()) {
            // an engine of the volume that went: this one carries it now
            ctx.destroy::<LonghornRevertLedger>(&old)?;
        }
        match self.revert_replicas(inv, e, local, &r.snapshot).await {
            Ok(waiting) if !waiting.is_empty() => {
                // asked again at the next reconcile (soon: see `reconcile`)
                let before = done.filter(|d| d.request == r.request).map(|d| &d.waiting);
                if before != Some(&waiting) {
                    tracing::info!(
                        engine = e.id(),
                        request = r.request,
                        ?waiting,
                        "snapshot revert: the replicas' nodes revert them"
                    );
                }
                out.waiting = waiting;
                return Ok(Some(out));
            }
            Ok(_) => {
                // every head is a clone of the snapshot: done, before the
                // raid1 serves them
                ctx.destroy::<LonghornRevertLedger>(e.id())?;
            }
            Err(x) => out.error = x.text(),
        }
        match Inventory::load(&self.client).await {
            Ok(i) => *inv = i,
            Err(x) if out.error.is_empty() => {
                out.error = InstanceError::Relist {
                    after: "revert",
                    source: x,
                }
                .text();
            }
            Err(_) => {}
        }
        if out.error.is_empty() {
            tracing::info!(engine = e.id(), request = r.request, snapshot = %r.snapshot, "snapshot revert");
        } else {
            tracing::warn!(engine = e.id(), request = r.request, error = %out.error, "snapshot revert");
        }
        Ok(Some(out))
    }

    /// Takes engine `e`'s raid1 down and makes every replica's head a clone
    /// of snapshot `snap`: another node's first (each checks its snapshot
    /// before it deletes anything), then this node's. Another node is asked
    /// at once ([`crate::proto::peer::AT_ONCE`]): the replicas whose node is
    /// still at it are answered, and this node's heads wait for the next
    /// call (no reconcile here waits on another node's, which may be
    /// reverting into this node at the same time).
    async fn revert_replicas(
        &self,
        inv: &mut Inventory,
        e: &Typed<LonghornEngine>,
        local: &BTreeMap<String, LonghornReplica>,
        snap: &str,
    ) -> Result<Vec<String>, InstanceError> {
        let id = format!("{}@{snap}", e.id());
        let map = &e.spec.replica_address_map;
        let remotes: Vec<String> = map.keys().filter(|r| !local.contains_key(*r)).cloned().collect();
        let peers = map
            .iter()
            .filter(|(r, _)| !local.contains_key(*r))
            .map(|(replica, address)| {
                Box::new(ServicePeer {
                    controller: self,
                    replica,
                    address,
                }) as Box<dyn RevertPeer<Error = InstanceError> + '_>
            })
            .collect();
        let heads: Vec<RevertHead> = map
            .keys()
            .filter_map(|k| local.get(k).map(|r| (k, r)))
            .map(|(replica, r)| RevertHead {
                lvs: lvstore(&r.disk),
                head: replica.clone(),
                snapshot: snapshot_lvol(replica, snap),
                fresh_mib: None,
            })
            .collect();
        // the raid1 goes (its export's namespace with it), the remote members
        // are detached; then other nodes' replicas, then this node's heads
        let reverted = self
            .ops
            .revert_members(&RevertMembers {
                take_down: TakeDown {
                    id: &id,
                    why: "revert",
                    export: None,
                    raid: Some(e.id()),
                    remotes: remotes.clone(),
                    dropped: Vec::new(),
                },
                snapshot: snap,
                peers,
                heads,
            })
            .await;
        inv.forget_raid(e.id());
        for c in &remotes {
            inv.forget_controller(c);
        }
        match reverted? {
            Reverted::Waiting(w) => Ok(w),
            Reverted::Done(_) => Ok(Vec::new()),
        }
    }

    /// Carries out replica `name`'s revert request `rq` (another node's
    /// engine reverts): unexported, its head a clone of the snapshot again;
    /// the caller exports it again. `first`: not tried before (a retry got
    /// past the checks). `inv` is listed again after a revert.
    pub(super) async fn revert_replica(
        &self,
        inv: &mut Inventory,
        name: &ObjectName,
        r: &LonghornReplica,
        rq: &RevertRequest,
        held: bool,
        first: bool,
    ) -> RevertStatus {
        let mut out = RevertStatus {
            request: rq.request,
            snapshot: rq.snapshot.clone(),
            ..RevertStatus::default()
        };
        let lvs = lvstore(&r.disk);
        let source = snapshot_lvol(name.as_str(), &rq.snapshot);
        if first {
            if let Err(x) = naming::instance_name("snapshot", &rq.snapshot) {
                out.refused = x.to_string();
            } else if held {
                out.refused = format!("replica {name} is held by an engine on this node: revert the engine");
            } else if let Err(x) = (RevertAsk {
                what: "replica",
                id: name.as_str(),
                snapshot: &rq.snapshot,
                frontend: None,
                rebuilding: None,
                holders: vec![(name.as_str().to_owned(), format!("{lvs}/{source}"))],
            })
            .check(inv)
            {
                out.refused = x.to_string();
            }
            if !out.refused.is_empty() {
                return out;
            }
        }
        let done = async {
            let nqn = naming::replica_nqn(name)?;
            self.unexport(inv, nqn.as_str()).await?;
            let head = RevertHead {
                lvs: lvs.clone(),
                head: name.as_str().to_owned(),
                snapshot: source.clone(),
                fresh_mib: None,
            };
            self.ops
                .remake_heads(&format!("{name}@{}", rq.snapshot), &[head])
                .await?;
            *inv = Inventory::load(&self.client)
                .await
                .map_err(|source| InstanceError::Relist {
                    after: "revert",
                    source,
                })?;
            Ok::<(), InstanceError>(())
        };
        if let Err(x) = done.await {
            out.error = x.text();
        }
        tracing::info!(replica = name.as_str(), request = rq.request, error = %out.error, "replica revert");
        out
    }
}

impl LonghornController {
    /// Carries out replica `name`'s rebuild start `rq` (another node's
    /// engine rebuilds into it): unless its head is already empty right
    /// above the snapshots it shares with `rq.chain`, unexported and the
    /// head made so (`rebuild::reset_head`); the caller exports it again.
    /// `inv` is listed again after a change.
    pub(super) async fn dst_start(
        &self,
        inv: &mut Inventory,
        name: &ObjectName,
        r: &LonghornReplica,
        rq: &DstStartRequest,
    ) -> DstStartStatus {
        let lvs = lvstore(&r.disk);
        let done = async {
            for s in &rq.chain {
                naming::replica_snapshot_name(s)?;
            }
            let have = ReplicaLvols::from_inventory(inv, &lvs, name.as_str());
            let base = rq.base.as_ref().map(clone_base_entrypoint);
            let base = base.as_deref();
            if have.ready_over(base, &rq.chain, have.shared(base, &rq.chain)) {
                return Ok(());
            }
            if let Some(b) = &rq.base {
                self.ops
                    .clone_base_for(inv, &lvs, name.as_str(), b)
                    .await
                    .map_err(|source| InstanceError::CloneBase {
                        replica: name.to_string(),
                        source: Box::new(source),
                    })?;
            }
            let nqn = naming::replica_nqn(name)?;
            self.unexport(inv, nqn.as_str()).await?;
            let kept = self
                .ops
                .reset_head(&lvs, name.as_str(), r.size_bytes, &have, base, &rq.chain)
                .await;
            *inv = Inventory::load(&self.client)
                .await
                .map_err(|source| InstanceError::Relist {
                    after: "reset",
                    source,
                })?;
            let kept = kept?;
            tracing::info!(
                replica = name.as_str(),
                request = rq.request,
                kept,
                entrypoint = base,
                "rebuild dest head made again"
            );
            Ok::<(), InstanceError>(())
        };
        let error = done.await.err().map(|x| x.text()).unwrap_or_default();
        if !error.is_empty() {
            tracing::warn!(
                replica = name.as_str(),
                request = rq.request,
                error,
                "rebuild dest start"
            );
        }
        DstStartStatus {
            request: rq.request,
            error,
        }
    }
}

/// Another node's replica in an engine's revert: its node's SPDKService
/// `ReplicaSnapshotRevert`, asked at once ([`crate::proto::peer::AT_ONCE`]).
struct ServicePeer<'a> {
    controller: &'a LonghornController,
    replica: &'a String,
    address: &'a String,
}

#[async_trait::async_trait]
impl RevertPeer for ServicePeer<'_> {
    type Error = InstanceError;

    fn replica(&self) -> &str {
        self.replica
    }

    async fn revert(&self, snapshot: &str) -> Result<bool, InstanceError> {
        let mut c = self.controller.peer(self.replica, self.address).await?;
        let req = crate::proto::peer::at_once(spdkrpc::SnapshotRequest {
            name: self.replica.clone(),
            snapshot_name: snapshot.to_owned(),
            ..Default::default()
        });
        let answer = c
            .replica_snapshot_revert(req)
            .await
            .map_err(|s| InstanceError::PeerRefused {
                replica: self.replica.clone(),
                message: s.message().to_owned(),
            })?;
        Ok(!answer.metadata().contains_key(crate::proto::peer::PENDING))
    }
}

/// Destroys the revert ledgers with no head left here to revert: of whose
/// replicas this node lists no lvol, head or snapshot (deleted with their
/// data; a volume made again under the same name has replicas of other
/// names). One that names none (its engine had no replica here) goes with
/// its engine.
pub(super) fn drop_stale_revert_ledgers(
    ctx: &mut ReconcileContext,
    inv: &Inventory,
    engines: &[Typed<LonghornEngine>],
) -> Result<(), ControllerError> {
    for l in ctx.list::<LonghornRevertLedger>()? {
        let keep = if l.spec.replicas.is_empty() {
            engines.iter().any(|e| e.id() == l.id())
        } else {
            l.spec.replicas.iter().any(|r| {
                let snaps = snapshot_lvol(r, "");
                inv.lvols
                    .values()
                    .any(|x| x.name == *r || x.name.starts_with(&snaps))
            })
        };
        if !keep {
            tracing::info!(
                engine = l.id(),
                request = l.spec.request,
                "snapshot revert: no head of it is left here; its ledger goes"
            );
            ctx.destroy::<LonghornRevertLedger>(l.id())?;
        }
    }
    Ok(())
}

fn revert_allowed(
    inv: &Inventory,
    id: &str,
    spec: &LonghornEngine,
    local: &BTreeMap<String, LonghornReplica>,
    prev: Option<&LonghornInstanceStatus>,
    snap: &str,
) -> Result<(), InstanceError> {
    naming::instance_name("snapshot", snap)?;
    let now = LonghornInstanceStatus::new(InstanceKind::Engine, InstanceState::Running, "");
    RevertAsk {
        what: "engine",
        id,
        snapshot: snap,
        frontend: Some(spec.frontend.as_str()).filter(|f| !f.is_empty()),
        rebuilding: rebuilding(spec, prev, &now),
        holders: spec
            .replica_address_map
            .keys()
            .filter_map(|replica| {
                let r = local.get(replica)?;
                let source = format!("{}/{}", lvstore(&r.disk), snapshot_lvol(replica, snap));
                Some((replica.clone(), source))
            })
            .collect(),
    }
    .check(inv)?;
    Ok(())
}

/// The status of an engine whose revert waits on other nodes' replicas
/// (`r.waiting`): what it was (`prev`), for the manager (a revert it asked
/// runs), with the wait in its message. Its raid1 is down meanwhile: the
/// reconcile neither serves it nor takes snapshots of it.
pub(super) fn reverting(prev: Option<&LonghornInstanceStatus>, r: &RevertStatus) -> LonghornInstanceStatus {
    let message = format!(
        "reverting to snapshot {}: waiting for the nodes of {} to revert them",
        r.snapshot,
        r.waiting.join(", ")
    );
    let mut st = match prev {
        Some(p) => LonghornInstanceStatus { message, ..p.clone() },
        None => status(InstanceKind::Engine, InstanceState::Starting, message),
    };
    st.revert = Some(r.clone());
    st
}

/// The status of an instance whose revert failed half way: not served.
pub(super) fn half_reverted(kind: InstanceKind, r: &RevertStatus) -> LonghornInstanceStatus {
    let mut st = status(
        kind,
        InstanceState::Error,
        format!(
            "reverting to snapshot {}: {}; the replicas may differ, so it is not served until the revert is done",
            r.snapshot, r.error
        ),
    );
    st.revert = Some(r.clone());
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: u64 = 7;

    fn req(n: u64) -> RevertRequest {
        RevertRequest {
            request: n,
            session: SESSION,
            snapshot: "s1".into(),
        }
    }

    fn inv() -> Inventory {
        let l: crate::spdk::rpc::Lvol = serde_json::from_value(serde_json::json!({
            "alias": "talon-d/ra-snap-s1", "uuid": "u-s1", "name": "ra-snap-s1",
            "lvs": { "name": "talon-d", "uuid": "u-d" }
        }))
        .expect("lvol");
        Inventory {
            lvstores: vec![],
            lvols: [(l.alias.clone(), l)].into(),
            bdevs: Default::default(),
            raids: vec![],
            subsystems: vec![],
            tcp_transport: true,
            controllers: vec![],
        }
    }

    fn engine() -> LonghornEngine {
        LonghornEngine {
            revert: Some(req(1)),
            ..super::super::tests::engine_of_two()
        }
    }

    /// The controller refuses, touching nothing, what the call refuses: a
    /// frontend, a replica being rebuilt, a local replica without the
    /// snapshot, a bad name; a remote replica's snapshot is its node's check.
    #[test]
    fn a_revert_is_refused_before_anything_is_touched() {
        let local: BTreeMap<String, LonghornReplica> = [(
            "ra".to_string(),
            LonghornReplica {
                volume: "v".into(),
                disk: "d".into(),
                size_bytes: 1 << 20,
                port_start: 20001,
                port_end: 20001,
                cleanup: false,
                revert: None,
                dst_start: None,
                snapshot_info: Default::default(),
                shared_for: None,
            },
        )]
        .into();
        let e = engine();
        revert_allowed(&inv(), "e", &e, &local, None, "s1").expect("allowed");
        let no = |e: &LonghornEngine, snap: &str| {
            revert_allowed(&inv(), "e", e, &local, None, snap)
                .expect_err("refused")
                .text()
        };
        assert!(no(&e, "s2").contains("replica ra does not contain the reverting snapshot s2"));
        assert!(no(&e, "../x").contains("snapshot"));
        let f = LonghornEngine {
            frontend: "spdk-tcp-blockdev".into(),
            ..engine()
        };
        assert!(no(&f, "s1").contains("must be detached from its frontend"));
        let mut r = engine();
        r.rebuild_requests.insert("rb".into(), 3);
        assert!(no(&r, "s1").contains("engine e contains WO replica rb during snapshot s1 revert"));
    }

    /// A request is carried out once, and again only while it failed half
    /// way; one refused is over; one an earlier process wrote never.
    #[test]
    fn a_revert_request_is_carried_out_until_done_or_refused() {
        let pending = |d: Option<&RevertStatus>, r: &RevertRequest| RevertStatus::pending(d, r, SESSION);
        assert!(pending(None, &req(1)));
        let done = RevertStatus {
            request: 1,
            snapshot: "s1".into(),
            ..RevertStatus::default()
        };
        assert!(!pending(Some(&done), &req(1)));
        assert!(pending(Some(&done), &req(2)));
        let refused = RevertStatus {
            refused: "a frontend".into(),
            ..done.clone()
        };
        assert!(!pending(Some(&refused), &req(1)));
        // other nodes still reverting their replicas: asked again, and the
        // calls go on waiting
        let waiting = RevertStatus {
            waiting: vec!["r-b".into()],
            ..done.clone()
        };
        assert!(pending(Some(&waiting), &req(1)));
        assert!(!waiting.answers(1));
        assert!(done.answers(1) && !done.answers(2));
        let failed = RevertStatus {
            error: "lost".into(),
            ..done
        };
        assert!(pending(Some(&failed), &req(1)));
        assert!(!pending(Some(&failed), &req(0)));
        // written by an earlier talon (its status gone with the restart): never again
        let stale = RevertRequest {
            session: SESSION + 2,
            ..req(5)
        };
        assert!(!pending(None, &stale));
        let before_sessions = RevertRequest { session: 0, ..req(5) };
        assert!(!pending(None, &before_sessions));
    }
}
