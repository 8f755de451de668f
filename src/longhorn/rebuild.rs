//! Thin rebuild of a Longhorn engine's replica across nodes: the replica
//! node's side (8504 `ReplicaRebuilding*` calls) and what both sides share.
//!
//! The engine's controller drives it (`controllers::longhorn::thin`), one step
//! per reconcile, from what the replicas' lvstores hold:
//!
//! ```text
//!   source S (RW, in the raid)        dest D (held out of the raid)
//!   S-snap-a <- S-snap-b <- S         D-snap-a <- D            shared: a
//!   1. D's head empty right above the snapshots both share (DstStart)
//!   2. copy S-snap-b's own clusters into D's head, where S lives:
//!      its own target (engine node) or S's node (SrcStart, SrcShallowCopyStart,
//!      SrcShallowCopyCheck: S's target attaches D's export)
//!   3. D's head snapshotted as D-snap-b (DstSnapshotCreate); repeat
//!   4. the switch (engine node): export closed, raid deleted, S's head
//!      snapshotted as the next `talon-rb-<n>`, copied, raid made again with D
//! ```
//!
//! Only the clusters a snapshot holds of its own are copied
//! (`bdev_lvol_start_shallow_copy`), so D ends as thin as S, with the same
//! chain. The calls keep Longhorn's names and field numbers; what each does
//! on a talon node is talon's (Longhorn's own engine is not their caller).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::error::LonghornError;
use super::service::Longhorn;
use crate::names::InvalidName;
use crate::proto::spdkrpc;
use crate::resources::longhorn::{CloneBase, DstStartRequest, LonghornReplica, snapshot_lvol};
use crate::spdk::ErrorKind;
use crate::spdk::naming::longhorn as naming;
use crate::spdk::rpc::CheckShallowCopy;
use crate::spdk::volume::Inventory;
use crate::spdk::volume::naming::lvstore;
use crate::spdk::volume::{ReplicaLvols, clone_base_entrypoint, clone_base_present};

/// How long DstStart waits for the controller to export the new head.
const EXPORT_WAIT: Duration = Duration::from_secs(20);

impl Longhorn {
    /// The lvols of replica `replica` of this node, read from spdk_tgt.
    pub(super) async fn replica_lvols_now(
        &self,
        replica: &str,
        disk: &str,
    ) -> Result<ReplicaLvols, LonghornError> {
        let inv = self.listing_for(replica).await?;
        Ok(ReplicaLvols::from_inventory(&inv, &lvstore(disk), replica))
    }

    /// spdk_tgt's listing, read now for replica `replica`'s call.
    async fn listing_for(&self, replica: &str) -> Result<Inventory, LonghornError> {
        Inventory::load(self.client())
            .await
            .map_err(|e| LonghornError::spdk(format!("replica {replica}: listing spdk_tgt"), e))
    }

    /// `ReplicaRebuildingDstStart`: replica `name` becomes a rebuild's dest:
    /// its head empty right above the snapshots of `rebuilding_snapshot_list`
    /// (the source's chain, oldest first) it shares; the rest of its
    /// snapshots are deleted. A head already so is kept. Answers the head's
    /// export once the controller has made it again; asked `at_once` (a
    /// talon engine's call, `proto::peer::AT_ONCE`), it answers at once
    /// instead, without an address while the controller is still at it
    /// (the engine asks again), and a start asked before and not yet
    /// carried out is not asked again.
    pub(super) async fn rebuilding_dst_start(
        &self,
        req: spdkrpc::ReplicaRebuildingDstStartRequest,
        at_once: bool,
    ) -> Result<spdkrpc::ReplicaRebuildingDstStartResponse, LonghornError> {
        let not_yet = spdkrpc::ReplicaRebuildingDstStartResponse::default();
        let (replica, t) = self.stored_replica(&req.name)?;
        let chain: Vec<String> = req
            .rebuilding_snapshot_list
            .iter()
            .map(|l| l.name.clone())
            .collect();
        for s in &chain {
            naming::replica_snapshot_name(s).map_err(|x| LonghornError::Invalid(x.to_string()))?;
        }
        let what = format!(
            "replica {replica}: starting a rebuild from {}",
            req.src_replica_name
        );
        // a linked clone's dest: its chain starts on the entrypoint of the
        // source volume's replica beside it
        let base = match req
            .linked_clone_source
            .as_ref()
            .filter(|l| !l.replica_name.is_empty())
        {
            None => None,
            Some(l) => {
                let invalid =
                    |x: InvalidName| LonghornError::Invalid(format!("{what}: linked clone source: {x}"));
                naming::instance_name("replica", &l.replica_name).map_err(invalid)?;
                naming::replica_snapshot_name(&l.snapshot_name).map_err(invalid)?;
                Some(CloneBase {
                    replica: l.replica_name.clone(),
                    snapshot: l.snapshot_name.clone(),
                })
            }
        };
        let ep = base.as_ref().map(clone_base_entrypoint);
        let lvs = lvstore(&t.spec.disk);
        let inv = self.listing_for(replica.as_str()).await?;
        if let Some(b) = &base
            && !clone_base_present(&inv, &lvs, b)
        {
            // the engine rebuilds it whole instead (SPDK's raid rebuild)
            return Err(LonghornError::Refused(format!(
                "{what}: its linked clone's base {} (replica {} beside it) does not exist",
                b.snapshot_in(&lvs),
                b.replica
            )));
        }
        let have = ReplicaLvols::from_inventory(&inv, &lvs, replica.as_str());
        let nqn = naming::replica_nqn(&replica).map_err(|x| LonghornError::Invalid(x.to_string()))?;
        if !have.ready_over(ep.as_deref(), &chain, have.shared(ep.as_deref(), &chain)) {
            // the controller takes the export down, makes the head again
            // and exports it again
            let last = self.status_of(replica.as_str()).and_then(|s| s.dst_start);
            let done = last.as_ref().map_or(0, |d| d.request);
            let asked = t.spec.dst_start.as_ref();
            let pending = asked.is_some_and(|d| {
                d.request > done && d.session == self.session() && d.chain == chain && d.base == base
            });
            if at_once && pending {
                return Ok(not_yet);
            }
            let request = super::service::next_request(asked.map_or(0, |d| d.request).max(done));
            let spec = LonghornReplica {
                dst_start: Some(DstStartRequest {
                    request,
                    session: self.session(),
                    chain: chain.clone(),
                    base: base.clone(),
                }),
                ..t.spec.clone()
            };
            self.state()
                .update_typed(replica.as_str(), "", None, &spec)
                .map_err(LonghornError::Store)?;
            if at_once {
                // the start asked last failed: the engine counts the failure,
                // and the start is asked anew (just above)
                return match last.filter(|d| asked.is_some_and(|a| a.request == d.request)) {
                    Some(d) if !d.error.is_empty() => Err(LonghornError::internal(&what, d.error)),
                    _ => Ok(not_yet),
                };
            }
            // at most the shared wait's 60 s (its reconcile may be busy with
            // another instance first); a replica deleted meanwhile: ABORTED at once
            self.wait_status(replica.as_str(), &what, |st| {
                let d = st.dst_start.as_ref().filter(|d| d.request >= request)?;
                Some(match d.error.as_str() {
                    "" => Ok(()),
                    m => Err(LonghornError::internal(&what, m)),
                })
            })
            .await?;
        }
        // the controller exports the head (again)
        let deadline = Instant::now() + EXPORT_WAIT;
        loop {
            if let Some(endpoint) = self.exported_at(replica.as_str(), nqn.as_str()).await {
                return Ok(spdkrpc::ReplicaRebuildingDstStartResponse {
                    dst_head_lvol_address: endpoint,
                });
            }
            if at_once {
                return Ok(not_yet);
            }
            if Instant::now() > deadline {
                return Err(LonghornError::Timeout(format!(
                    "{what}: its head is not exported again after {}s",
                    EXPORT_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Where replica `replica`'s head is exported (subsystem `nqn` with a
    /// namespace and a listener, and the endpoint its status reports), if it is.
    pub(super) async fn exported_at(&self, replica: &str, nqn: &str) -> Option<String> {
        let subs = self.client().nvmf_get_subsystems(&Default::default()).await;
        let exported = subs.is_ok_and(|s| {
            s.iter()
                .any(|s| s.nqn == nqn && !s.namespaces.is_empty() && !s.listen_addresses.is_empty())
        });
        let st = self.status_of(replica).filter(|_| exported)?;
        Some(st.endpoint).filter(|e| !e.is_empty())
    }

    /// `ReplicaRebuildingDstSetQosLimit`: caps (0 lifts) the writes into a
    /// rebuild dest's head. Its export holds it open, so SPDK can lift the
    /// cap again (on v26.05 a cap set on a bdev nobody has open cannot).
    pub(super) async fn rebuilding_dst_qos(
        &self,
        req: spdkrpc::ReplicaRebuildingDstSetQosLimitRequest,
    ) -> Result<(), LonghornError> {
        let (replica, t) = self.stored_replica(&req.name)?;
        let mbps = u64::try_from(req.qos_limit_mbps)
            .map_err(|_| LonghornError::Invalid(format!("replica {replica}: negative QoS limit")))?;
        let head = naming::replica_alias(&t.spec.disk, replica.as_str());
        self.ops()
            .cap_rebuild_writes(&head, mbps)
            .await
            .map_err(|e| LonghornError::spdk(format!("replica {replica}: capping {head} at {mbps} MB/s"), e))
    }

    /// `ReplicaRebuildingSrcStart`: this node's replica `name` is a rebuild's
    /// source; the dest replica's export is attached (afresh: a dest made
    /// again is a new namespace).
    pub(super) async fn rebuilding_src_start(
        &self,
        req: spdkrpc::ReplicaRebuildingSrcStartRequest,
    ) -> Result<spdkrpc::ReplicaRebuildingSrcStartResponse, LonghornError> {
        if !req.exposed_snapshot_name.is_empty() {
            // Longhorn's exposure of a snapshot to another node: a clone there reads it
            return self.clone_source_expose(&req).await;
        }
        let (replica, _) = self.stored_replica(&req.name)?;
        let dst = naming::instance_name("replica", &req.dst_replica_name)
            .map_err(|x| LonghornError::Invalid(x.to_string()))?;
        let what = format!("replica {replica}: rebuilding {dst}");
        let sa: SocketAddr = req
            .dst_replica_address
            .strip_prefix("tcp://")
            .unwrap_or(&req.dst_replica_address)
            .parse()
            .map_err(|_| {
                LonghornError::Invalid(format!(
                    "{what}: address {:?} is not ip:port",
                    req.dst_replica_address
                ))
            })?;
        let nqn = naming::replica_nqn(&dst).map_err(|x| LonghornError::Invalid(x.to_string()))?;
        self.ops()
            .attach_copy_dest(
                self.src_copies(),
                replica.as_str(),
                dst.as_str(),
                sa,
                nqn.as_str(),
            )
            .await?;
        Ok(spdkrpc::ReplicaRebuildingSrcStartResponse::default())
    }

    /// `ReplicaRebuildingSrcShallowCopyStart`: copies the clusters snapshot
    /// `snapshot_name` of replica `name` holds of its own into the dest
    /// attached by SrcStart at `dst_rebuilding_lvol_address`.
    pub(super) async fn rebuilding_src_copy_start(
        &self,
        req: spdkrpc::ReplicaRebuildingSrcShallowCopyStartRequest,
    ) -> Result<(), LonghornError> {
        let (replica, t) = self.stored_replica(&req.name)?;
        naming::replica_snapshot_name(&req.snapshot_name)
            .map_err(|x| LonghornError::Invalid(x.to_string()))?;
        let address = req
            .dst_rebuilding_lvol_address
            .strip_prefix("tcp://")
            .unwrap_or(&req.dst_rebuilding_lvol_address)
            .to_owned();
        let src = format!(
            "{}/{}",
            lvstore(&t.spec.disk),
            snapshot_lvol(replica.as_str(), &req.snapshot_name)
        );
        self.ops()
            .start_copy_to_dest(
                self.src_copies(),
                replica.as_str(),
                &address,
                &req.snapshot_name,
                &src,
            )
            .await?;
        Ok(())
    }

    /// `ReplicaRebuildingSrcShallowCopyCheck`: where that copy stands. One
    /// this node does not know (talon or spdk_tgt restarted) is NOT_FOUND.
    pub(super) async fn rebuilding_src_copy_check(
        &self,
        req: spdkrpc::ReplicaRebuildingSrcShallowCopyCheckRequest,
    ) -> Result<spdkrpc::ReplicaRebuildingSrcShallowCopyCheckResponse, LonghornError> {
        let op = self
            .src_copies()
            .operation(&req.name, &req.dst_replica_name, &req.snapshot_name)
            .ok_or_else(|| {
                LonghornError::Gone(format!(
                    "replica {}: no copy of snapshot {} to {} runs here",
                    req.name, req.snapshot_name, req.dst_replica_name
                ))
            })?;
        let s = self
            .client()
            .bdev_lvol_check_shallow_copy(&CheckShallowCopy { operation_id: op })
            .await
            .map_err(
                |e| match e.is(ErrorKind::NotFound) || e.is(ErrorKind::InvalidParams) {
                    true => LonghornError::Gone(format!("replica {}: spdk_tgt forgot copy {op}", req.name)),
                    false => LonghornError::spdk(format!("replica {}: checking copy {op}", req.name), e),
                },
            )?;
        Ok(spdkrpc::ReplicaRebuildingSrcShallowCopyCheckResponse {
            state: s.state,
            copied_clusters: s.copied_clusters,
            total_clusters: s.total_clusters,
            error_msg: s.error.unwrap_or_default(),
            handled_clusters: s.copied_clusters,
        })
    }

    /// `ReplicaRebuildingSrcFinish`: the dest's export is detached, and a
    /// snapshot exposed for a clone into engine `dst_replica_name` removed.
    pub(super) async fn rebuilding_src_finish(
        &self,
        req: spdkrpc::ReplicaRebuildingSrcFinishRequest,
    ) -> Result<(), LonghornError> {
        self.clone_source_unexpose(&req.name, &req.dst_replica_name)
            .await?;
        Ok(self
            .ops()
            .finish_copies_to(self.src_copies(), &req.name, &req.dst_replica_name)
            .await?)
    }
}
