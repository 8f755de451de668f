//! The engine's snapshot purge: `SnapshotRemove` and `SnapshotPurge` number
//! a request on the engine (`LonghornEngine.purgeRequest`), this carries it
//! out once per number and reports it in `LonghornInstanceStatus.purge`,
//! which the calls wait on.
//!
//! ```text
//!   purgeRequest n ──> a replica being rebuilt (WO)?  refused, nothing deleted
//!                      each of removedSnapshots:
//!                        more than one lvol depends on it ──> kept (SPDK refuses it)
//!                        else, on every replica:
//!                          this node's:    lvol <lvs>/<replica>-snap-<s> deleted
//!                          another node's: its ReplicaSnapshotDelete
//!                        ──> deleted, or an error per replica address
//!                  ──> status.purge { request: n, deleted, kept, errors }
//! ```

use std::collections::BTreeMap;

use super::{InstanceError, LonghornController};
use crate::proto::spdkrpc;
use crate::resources::longhorn::{LonghornEngine, LonghornInstanceStatus, LonghornReplica, PurgeStatus};
use crate::runtime::Typed;
use crate::spdk::naming::longhorn as naming;
use crate::spdk::naming::longhorn::tcp;
use crate::spdk::volume::Inventory;
use crate::spdk::volume::naming::lvstore;
use crate::spdk::volume::{ReplicaLvols, SnapshotDeleteError};

impl LonghornController {
    /// Carries out engine `e`'s purge request unless it was (`prev` holds
    /// the last one); `st` (its rebuilds already judged) gets the outcome.
    pub(super) async fn purge(
        &self,
        inv: &mut Inventory,
        e: &Typed<LonghornEngine>,
        local: &BTreeMap<String, LonghornReplica>,
        prev: Option<&LonghornInstanceStatus>,
        st: &mut LonghornInstanceStatus,
    ) {
        let request = e.spec.purge_request;
        st.purge = prev.and_then(|p| p.purge.clone());
        if request == 0 || st.purge.as_ref().is_some_and(|p| p.request >= request) {
            return;
        }
        let mut out = PurgeStatus {
            request,
            ..PurgeStatus::default()
        };
        if let Some(r) = rebuilding(&e.spec, prev, st) {
            // a thin rebuild copies the snapshots as they are
            out.refused = format!("engine {} contains WO replica {r} during snapshot purge", e.id());
            tracing::info!(engine = e.id(), request, refused = %out.refused, "snapshot purge");
            st.purge = Some(out);
            return;
        }
        let view = self.chain_view(inv, e, local).await;
        for snap in &e.spec.removed_snapshots {
            if view.as_ref().is_some_and(|v| children(v, snap) > 1) {
                out.kept.insert(snap.clone());
                continue;
            }
            let mut all = true;
            for (replica, address) in &e.spec.replica_address_map {
                let done = match local.get(replica) {
                    Some(r) => self.delete_snapshot_here(inv, replica, r, snap).await,
                    None => self.delete_snapshot_there(replica, address, snap, false).await,
                };
                if let Err(m) = done {
                    all = false;
                    let errs = out.errors.entry(tcp(address)).or_default();
                    if !errs.is_empty() {
                        errs.push_str("; ");
                    }
                    errs.push_str(&format!("snapshot {snap}: {}", m.text()));
                }
            }
            if all {
                out.deleted.insert(snap.clone());
            }
        }
        tracing::info!(
            engine = e.id(),
            request,
            deleted = ?out.deleted,
            kept = ?out.kept,
            errors = ?out.errors,
            "snapshot purge"
        );
        st.purge = Some(out);
    }

    /// The snapshot chain as a replica of `e` holds it (every replica in
    /// service holds the same): one of this node's from the listing, else
    /// another node's (its `ReplicaGet`); `None` when none answers.
    async fn chain_view(
        &self,
        inv: &Inventory,
        e: &Typed<LonghornEngine>,
        local: &BTreeMap<String, LonghornReplica>,
    ) -> Option<ReplicaLvols> {
        if let Some((replica, r)) = e
            .spec
            .replica_address_map
            .keys()
            .find_map(|k| local.get(k).map(|r| (k, r)))
        {
            return Some(ReplicaLvols::from_inventory(inv, &lvstore(&r.disk), replica));
        }
        self.peers
            .remote_replica(
                &e.spec.replica_address_map,
                self.peer_port,
                super::thin::PEER_TIMEOUT,
            )
            .await
            .map(|r| ReplicaLvols::from(&r))
    }

    /// Deletes snapshot `snap` of this node's replica `replica`; one that is
    /// not there is no error.
    async fn delete_snapshot_here(
        &self,
        inv: &mut Inventory,
        replica: &str,
        r: &LonghornReplica,
        snap: &str,
    ) -> Result<(), InstanceError> {
        match self
            .ops
            .delete_replica_snapshot(&lvstore(&r.disk), replica, snap)
            .await
        {
            Ok(target) => {
                inv.lvols.remove(&target);
                Ok(())
            }
            Err(SnapshotDeleteError::Shared { lvol, source }) => Err(InstanceError::SnapshotShared {
                replica: replica.to_owned(),
                lvol,
                source,
            }),
            Err(SnapshotDeleteError::Spdk { lvol, source }) => Err(InstanceError::DeleteLvol {
                replica: replica.to_owned(),
                alias: lvol,
                source,
            }),
        }
    }

    /// Deletes snapshot `snap` of replica `replica` on the node that serves
    /// it at `address` (its `ReplicaSnapshotDelete`). `gone_is_done`: a
    /// replica its node no longer has is no error.
    pub(super) async fn delete_snapshot_there(
        &self,
        replica: &str,
        address: &str,
        snap: &str,
        gone_is_done: bool,
    ) -> Result<(), InstanceError> {
        naming::instance_name("snapshot", snap)?;
        let mut c = self.peer(replica, address).await?;
        let asked = c
            .replica_snapshot_delete(spdkrpc::SnapshotRequest {
                name: replica.to_owned(),
                snapshot_name: snap.to_owned(),
                ..Default::default()
            })
            .await;
        match asked {
            Ok(_) => Ok(()),
            Err(s) if gone_is_done && s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(InstanceError::PeerRefused {
                replica: replica.to_owned(),
                message: s.message().to_owned(),
            }),
        }
    }
}

/// A replica of `e` being rebuilt (Longhorn sees it WO): a rebuild request
/// not seen to end, and not failed.
pub(super) fn rebuilding<'a>(
    e: &'a LonghornEngine,
    prev: Option<&LonghornInstanceStatus>,
    st: &LonghornInstanceStatus,
) -> Option<&'a str> {
    let ended = |r: &str, n: u64| {
        let done = |s: &LonghornInstanceStatus| s.rebuilds_done.get(r) == Some(&n);
        let failed = |s: &LonghornInstanceStatus| {
            s.rebuilds_started.get(r) == Some(&n) && s.rebuild_errors.contains_key(r)
        };
        done(st) || failed(st) || prev.is_some_and(|p| done(p) || failed(p))
    };
    e.rebuild_requests
        .iter()
        .find(|(r, n)| e.replica_address_map.contains_key(*r) && !ended(r, **n))
        .map(|(r, _)| r.as_str())
}

/// How many lvols depend on snapshot `snap` in `view` (its clones, the head
/// included).
fn children(view: &ReplicaLvols, snap: &str) -> usize {
    view.snapshots
        .values()
        .filter(|(p, _)| p.as_deref() == Some(snap))
        .count()
        + usize::from(view.head_parent.as_deref() == Some(snap))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::longhorn::{InstanceKind, InstanceState};

    fn engine(requests: &[(&str, u64)]) -> LonghornEngine {
        LonghornEngine {
            rebuild_requests: requests.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
            purge_request: 1,
            ..super::super::tests::engine_of_two()
        }
    }

    fn status() -> LonghornInstanceStatus {
        LonghornInstanceStatus::new(InstanceKind::Engine, InstanceState::Running, "")
    }

    /// A replica counts as rebuilt (WO) from its request until its rebuild
    /// is seen to end or fail, in this reconcile or the one before; a
    /// request of a replica gone from the map does not count.
    #[test]
    fn a_purge_waits_out_a_rebuild_from_request_to_end() {
        let e = engine(&[("rb", 7)]);
        let mut st = status();
        assert_eq!(rebuilding(&e, None, &st), Some("rb"), "requested, not started");
        st.rebuilds_started.insert("rb".into(), 7);
        assert_eq!(rebuilding(&e, None, &st), Some("rb"), "started, running");
        let mut prev = status();
        prev.rebuilds_done.insert("rb".into(), 7);
        assert_eq!(rebuilding(&e, Some(&prev), &status()), None, "done before");
        st.rebuilds_done.insert("rb".into(), 6);
        assert_eq!(rebuilding(&e, None, &st), Some("rb"), "an older request done");
        st.rebuild_errors.insert("rb".into(), "lost".into());
        assert_eq!(rebuilding(&e, None, &st), None, "failed: ERR, not WO");
        let mut gone = engine(&[("rc", 3)]);
        gone.replica_address_map.remove("rc");
        assert_eq!(rebuilding(&gone, None, &status()), None);
    }

    #[test]
    fn the_children_of_a_snapshot_count_the_head() {
        let mut v = ReplicaLvols::default();
        v.snapshots.insert("s1".into(), (None, 0));
        v.snapshots.insert("s2".into(), (Some("s1".into()), 0));
        v.head_parent = Some("s1".into());
        assert_eq!(children(&v, "s1"), 2);
        assert_eq!(children(&v, "s2"), 0);
        v.head_parent = Some("s2".into());
        assert_eq!(children(&v, "s1"), 1);
        assert_eq!(children(&v, "s2"), 1);
    }
}
