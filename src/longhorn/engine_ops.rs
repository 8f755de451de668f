//! The engine operations of 8501 beyond the monitor's polls: snapshot revert
//! and purge, the snapshot count limit, replica add (rebuild) and remove,
//! the rebuild cap; the 8504 `ReplicaSnapshotRevert` a revert fans out to;
//! and the forwarding of proxy calls for an engine on another node.
//!
//! ```text
//!   SnapshotRevert(engine, s)   (Longhorn detaches the frontend first: refused while one is attached)
//!     hold the engine ─ raid1 deleted ─ remote members detached
//!       ├─ remote replica: its node's ReplicaSnapshotRevert (unexport, head deleted, clone of s)
//!       └─ local replica:  head deleted, bdev_lvol_clone <r>-snap-<s> -> <r>
//!     release ─ the controller makes the raid1 and the export again
//!   ReplicaAdd(engine, r, tcp://ip:port)
//!     rebuildRequests[r] = n ──> controller: start_rebuild (bdev_raid_add_base_bdev) ──> r is WO, then RW
//!     while a rebuild of the engine runs: "replica add is already in progress"
//!   ReplicaRemove: out of the map ──> controller: out of the raid1, detached ──> status.observedVersion
//!   SnapshotRemove(s) / SnapshotPurge
//!     removedSnapshots += s, purgeRequest = n ──> controller: each removed snapshot SPDK lets go
//!     deleted on every replica ──> status.purge { request: n, deleted, kept, errors } ──> the call returns
//!   a call for an engine not here, whose engine-frontend is here:
//!     forwarded to the engine node's proxy (the frontend's target IP, this node's proxy port)
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tonic::transport::Channel;

use super::error::LonghornError;
use super::proxy::{LVOL_NAME_MAX, Member};
use super::service::{Longhorn, next_request};
use crate::proto::imrpc::{self, proxy_engine_service_client::ProxyEngineServiceClient};
use crate::proto::ptypes;
use crate::proto::spdkrpc;
use crate::resources::longhorn::snapshot_lvol;
use crate::resources::longhorn::{
    AnaState, InstanceKind, InstanceState, LonghornEngine, LonghornEngineFrontend, LonghornInstanceStatus,
    LonghornReplica, PurgeStatus, RevertRequest, RevertStatus,
};
use crate::runtime::{Phase, Typed};
use crate::spdk::naming::longhorn as naming;
use crate::spdk::rpc::ByNqn;
use crate::spdk::volume::naming::lvstore;

/// How long a forwarded call or an engine operation may take.
const OP_TIMEOUT: Duration = Duration::from_secs(60);

impl Longhorn {
    pub(super) fn update_engine(
        &self,
        e: &Typed<LonghornEngine>,
        f: impl FnMut(&mut LonghornEngine),
    ) -> Result<(), LonghornError> {
        self.change_engine(e, f).map(|_| ())
    }

    /// [`Self::update_engine`], giving the engine's version after it. `f`
    /// changes the newest spec, written only over the version it read: two
    /// calls at once (two snapshots of one engine) each keep the other's
    /// change (a write between is read again, and `f` applied again).
    fn change_engine(
        &self,
        e: &Typed<LonghornEngine>,
        mut f: impl FnMut(&mut LonghornEngine),
    ) -> Result<u64, LonghornError> {
        loop {
            let now = self.engine(e.id())?;
            let mut spec = now.spec.clone();
            f(&mut spec);
            if spec == now.spec {
                return Ok(now.metadata.version);
            }
            match self
                .state()
                .update_typed(e.id(), "", Some(now.metadata.version), &spec)
            {
                Ok(t) => return Ok(t.metadata.version),
                Err(crate::runtime::StateError::Conflict { .. }) => continue,
                Err(x) => return Err(LonghornError::State(x)),
            }
        }
    }

    fn running(&self, e: &Typed<LonghornEngine>, what: &str) -> Result<(), LonghornError> {
        match self.status_of(e.id()) {
            Some(s) if s.state == InstanceState::Running => Ok(()),
            Some(s) => Err(LonghornError::Refused(format!(
                "{what}: the engine is not running ({}: {})",
                s.state.as_str(),
                s.message
            ))),
            None => Err(LonghornError::Refused(format!(
                "{what}: the engine is not running"
            ))),
        }
    }

    // ----- VolumeSnapshotMaxCountSet, and its check before a snapshot

    /// `VolumeSnapshotMaxCountSet`: kept on the engine (0: no limit).
    pub(super) fn snapshot_max_count_set(
        &self,
        e: &Typed<LonghornEngine>,
        count: i32,
    ) -> Result<(), LonghornError> {
        if count < 0 {
            return Err(LonghornError::Invalid(format!(
                "engine {}: snapshot max count {count} is negative",
                e.id()
            )));
        }
        self.update_engine(e, |s| s.snapshot_max_count = count)
    }

    /// Refuses a snapshot beyond the engine's limit, with Longhorn's text.
    pub(super) async fn check_snapshot_count(&self, e: &Typed<LonghornEngine>) -> Result<(), LonghornError> {
        let max = e.spec.snapshot_max_count;
        if max <= 0 {
            return Ok(());
        }
        // the count as a replica holds it (every replica holds the same);
        // rebuild snapshots are talon's, for a moment, and not counted
        let Some(view) = self.engine_lvols(e).await? else {
            return Ok(());
        };
        let n = view
            .snapshots
            .keys()
            .filter(|s| !naming::is_rebuild_snap(s))
            .count();
        if i32::try_from(n).unwrap_or(i32::MAX) >= max {
            return Err(LonghornError::Refused(format!(
                "snapshot count {n} is equal or larger than snapshotMaxCount {max}"
            )));
        }
        Ok(())
    }

    // ----- SnapshotRemove, SnapshotPurge: a purge request the controller carries out

    /// Refuses `what` while a replica of `e` is being rebuilt (WO), in
    /// Longhorn's words (`during`: what Longhorn says after the replica).
    async fn refuse_wo(&self, e: &Typed<LonghornEngine>, during: &str) -> Result<(), LonghornError> {
        match self
            .members(e)
            .await?
            .iter()
            .find(|m| m.mode == ptypes::ReplicaMode::Wo)
        {
            Some(m) => Err(LonghornError::Refused(format!(
                "engine {} contains WO replica {} during {during}",
                e.id(),
                m.replica
            ))),
            None => Ok(()),
        }
    }

    /// Numbers a purge request on `e` (with `mark`'s change of the spec)
    /// and waits for the controller to carry it out; the snapshots it
    /// deleted everywhere are forgotten.
    async fn request_purge(
        &self,
        e: &Typed<LonghornEngine>,
        what: &str,
        mut mark: impl FnMut(&mut LonghornEngine),
    ) -> Result<PurgeStatus, LonghornError> {
        let done = self
            .status_of(e.id())
            .and_then(|s| s.purge)
            .map_or(0, |p| p.request);
        let request = next_request(self.engine(e.id())?.spec.purge_request.max(done));
        self.update_engine(e, |s| {
            mark(s);
            // a later request of another call stands: it covers this one
            s.purge_request = s.purge_request.max(request);
        })?;
        let p = self
            .wait_status(e.id(), what, |st| {
                if st.state == InstanceState::Error {
                    return Some(Err(LonghornError::Refused(format!(
                        "{what}: the engine is not running: {}",
                        st.message
                    ))));
                }
                st.purge
                    .as_ref()
                    .filter(|p| p.request >= request)
                    .cloned()
                    .map(Ok)
            })
            .await?;
        if !p.deleted.is_empty() {
            self.update_engine(e, |s| {
                for d in &p.deleted {
                    s.removed_snapshots.remove(d);
                    s.snapshot_info.remove(d);
                }
            })?;
            for r in e.spec.replica_address_map.keys() {
                self.replica_snapshot_info(r, |m| {
                    for d in &p.deleted {
                        m.remove(d);
                    }
                })?;
            }
        }
        Ok(p)
    }

    /// `SnapshotRemove`: snapshot `snap` of every replica of `e` is marked
    /// removed and deleted; one SPDK must keep (two or more lvols depend on
    /// it, after a revert) stays marked removed, for `SnapshotPurge`.
    pub(super) async fn remove_snapshot(
        &self,
        e: &Typed<LonghornEngine>,
        snap: &str,
    ) -> Result<(), LonghornError> {
        let what = format!("deleting snapshot {snap} of engine {}", e.id());
        naming::instance_name("snapshot", snap)
            .map_err(|x| LonghornError::Invalid(format!("{what}: {x}")))?;
        self.running(e, &what)?;
        self.refuse_wo(e, &format!("snapshot {snap} delete")).await?;
        let p = self
            .request_purge(e, &what, |s| {
                s.removed_snapshots.insert(snap.to_owned());
            })
            .await?;
        if p.deleted.contains(snap) || p.kept.contains(snap) {
            return Ok(());
        }
        if !p.refused.is_empty() {
            return Err(LonghornError::Refused(format!("{what}: {}", p.refused)));
        }
        let errors: Vec<&str> = p.errors.values().map(String::as_str).collect();
        Err(LonghornError::Unavailable(format!(
            "{what}: {}",
            errors.join("; ")
        )))
    }

    /// `SnapshotPurge`: every snapshot marked removed that SPDK now lets go
    /// (one lvol or none depends on it) is deleted on every replica; the
    /// result per replica is what `SnapshotPurgeStatus` reports.
    pub(super) async fn purge(&self, e: &Typed<LonghornEngine>) -> Result<(), LonghornError> {
        let what = format!("purging the snapshots of engine {}", e.id());
        self.running(e, &what)?;
        self.refuse_wo(e, "snapshot purge").await?;
        let p = self.request_purge(e, &what, |_| {}).await?;
        if !p.refused.is_empty() {
            return Err(LonghornError::Refused(p.refused));
        }
        if p.errors.is_empty() {
            Ok(())
        } else {
            let errors: Vec<&str> = p.errors.values().map(String::as_str).collect();
            Err(LonghornError::internal(&what, errors.join("; ")))
        }
    }

    /// `SnapshotPurgeStatus`: the last purge per replica address, or the
    /// one asked for and not carried out yet.
    pub(super) fn purge_status(
        &self,
        e: &Typed<LonghornEngine>,
    ) -> std::collections::HashMap<String, ptypes::SnapshotPurgeStatusResponse> {
        let last = self.status_of(e.id()).and_then(|s| s.purge);
        let purging = e.spec.purge_request > last.as_ref().map_or(0, |p| p.request);
        if last.is_none() && !purging {
            return std::collections::HashMap::new();
        }
        e.spec
            .replica_address_map
            .values()
            .map(|a| {
                let a = naming::tcp(a);
                let error = match &last {
                    _ if purging => None,
                    Some(p) if !p.refused.is_empty() => Some(p.refused.clone()),
                    Some(p) => p.errors.get(&a).cloned(),
                    None => None,
                };
                let state = match (&error, purging) {
                    (_, true) => "in_progress",
                    (Some(_), false) => "error",
                    (None, false) => "complete",
                };
                let s = ptypes::SnapshotPurgeStatusResponse {
                    is_purging: purging,
                    state: state.into(),
                    error: error.unwrap_or_default(),
                    progress: if purging { 0 } else { 100 },
                };
                (a, s)
            })
            .collect()
    }

    // ----- SnapshotRevert

    /// `SnapshotRevert`: every replica of `e` back to snapshot `snap`. The
    /// engine must be detached from its frontend (Longhorn detaches it and
    /// makes the engine with an empty frontend) and every replica in service.
    pub(super) async fn revert(&self, e: &Typed<LonghornEngine>, snap: &str) -> Result<(), LonghornError> {
        let what = format!("reverting engine {} to snapshot {snap}", e.id());
        naming::instance_name("snapshot", snap)
            .map_err(|x| LonghornError::Invalid(format!("{what}: {x}")))?;
        self.running(e, &what)?;
        if !e.spec.frontend.is_empty() {
            return Err(LonghornError::Refused(format!(
                "invalid frontend {} for engine {} snapshot {snap} revert: the engine must be detached from its frontend",
                e.spec.frontend,
                e.id()
            )));
        }
        // an engine-frontend with its frontend disabled (maintenance mode, where
        // Longhorn v1.12 reverts) attaches nothing; any other one is attached
        if let Some(f) = self.frontend_for(e.id(), "")
            && naming::FrontendMode::of(&f.spec.frontend) != Ok(naming::FrontendMode::Disabled)
        {
            return Err(LonghornError::Refused(format!(
                "{what}: engine-frontend {} attaches it with frontend {:?}; detach it first",
                f.id(),
                f.spec.frontend
            )));
        }
        let volume = crate::names::ObjectName::parse("volume", &e.spec.volume)
            .map_err(|x| LonghornError::Invalid(x.to_string()))?;
        let nqn = naming::volume_nqn(&volume).map_err(|x| LonghornError::Invalid(x.to_string()))?;
        match self
            .client()
            .nvmf_subsystem_get_controllers(&ByNqn {
                nqn: nqn.as_str().to_owned(),
            })
            .await
        {
            Ok(c) if !c.is_empty() => {
                return Err(LonghornError::Refused(format!(
                    "{what}: {} host(s) are connected to its export {nqn}; detach them first",
                    c.len()
                )));
            }
            _ => {}
        }
        let members = self.members(e).await?;
        if let Some(m) = members.iter().find(|m| m.mode != ptypes::ReplicaMode::Rw) {
            return Err(LonghornError::Refused(format!(
                "{what}: replica {} is {} (not in service); remove it before reverting",
                m.replica,
                mode_name(m)
            )));
        }
        for replica in e.spec.replica_address_map.keys() {
            if let Some(r) = self.local_replica(replica) {
                let source = format!("{}/{}", lvstore(&r.disk), snapshot_lvol(replica, snap));
                if self.client().bdev(&source).await.ok().flatten().is_none() {
                    return Err(LonghornError::Refused(format!(
                        "{what}: replica {replica} does not contain the reverting snapshot {snap}"
                    )));
                }
            }
        }
        // the controller takes the raid1 down, reverts every head and makes
        // the raid1 again
        let done = self
            .status_of(e.id())
            .and_then(|s| s.revert)
            .map_or(0, |r| r.request);
        let asked = self.engine(e.id())?.spec.revert.map_or(0, |r| r.request);
        let request = next_request(asked.max(done));
        self.update_engine(e, |s| {
            s.revert = Some(RevertRequest {
                request,
                session: self.session(),
                snapshot: snap.to_owned(),
            })
        })?;
        self.wait_reverted(e.id(), &what, request).await
    }

    /// 8504 `ReplicaSnapshotRevert` from another node's engine: this node's
    /// replica back to the snapshot (its export goes while the head is made
    /// again; the controller makes it again). Asked `at_once` (a talon
    /// engine, `proto::peer::AT_ONCE`), it answers at once whether the
    /// replica is reverted (false: its controller is still at it; the
    /// engine asks again), judged from what the replica is: its head a
    /// clone of the snapshot with no cluster of its own, exported again. A
    /// revert asked and not yet carried out is not asked again; one that
    /// failed is answered as the error, and asked anew.
    pub(super) async fn replica_snapshot_revert(
        &self,
        req: spdkrpc::SnapshotRequest,
        at_once: bool,
    ) -> Result<bool, LonghornError> {
        naming::instance_name("snapshot", &req.snapshot_name)
            .map_err(|x| LonghornError::Invalid(x.to_string()))?;
        let (replica, t) = self.stored_replica(&req.name)?;
        let lvol = snapshot_lvol(replica.as_str(), &req.snapshot_name);
        if lvol.len() > LVOL_NAME_MAX {
            return Err(LonghornError::Invalid(format!(
                "replica {replica}: lvol name {lvol} is longer than SPDK's {LVOL_NAME_MAX} characters"
            )));
        }
        let source = format!("{}/{lvol}", lvstore(&t.spec.disk));
        if self.client().bdev(&source).await.ok().flatten().is_none() {
            return Err(LonghornError::Refused(format!(
                "replica {replica} does not contain the reverting snapshot {}",
                req.snapshot_name
            )));
        }
        let what = format!("replica {replica}: reverting to snapshot {}", req.snapshot_name);
        // the controller takes its export down, reverts the head and
        // exports it again
        let last = self.status_of(replica.as_str()).and_then(|s| s.revert);
        let done = last.as_ref().map_or(0, |r| r.request);
        let asked = t.spec.revert.as_ref();
        if at_once {
            let pending = asked.is_some_and(|a| {
                a.request > done && a.session == self.session() && a.snapshot == req.snapshot_name
            });
            if pending {
                return Ok(false);
            }
            let have = self.replica_lvols_now(replica.as_str(), &t.spec.disk).await?;
            let nqn = naming::replica_nqn(&replica).map_err(|x| LonghornError::Invalid(x.to_string()))?;
            if have.head_parent.as_deref() == Some(req.snapshot_name.as_str())
                && have.head_bytes == 0
                && self.exported_at(replica.as_str(), nqn.as_str()).await.is_some()
            {
                return Ok(true);
            }
        }
        let request = next_request(asked.map_or(0, |r| r.request).max(done));
        let spec = LonghornReplica {
            revert: Some(RevertRequest {
                request,
                session: self.session(),
                snapshot: req.snapshot_name.clone(),
            }),
            ..t.spec.clone()
        };
        self.state()
            .update_typed(replica.as_str(), "", None, &spec)
            .map_err(LonghornError::State)?;
        if at_once {
            // the revert asked last failed: the engine counts the failure,
            // and the revert is asked anew (just above)
            let failed = last
                .filter(|l| asked.is_some_and(|a| a.request == l.request && a.snapshot == req.snapshot_name));
            return match failed.and_then(|l| revert_failure(&l, &what)) {
                Some(x) => Err(x),
                None => Ok(false),
            };
        }
        self.wait_reverted(replica.as_str(), &what, request).await?;
        Ok(true)
    }

    /// Waits until instance `id`'s controller has carried out revert
    /// request `request` and serves it again: refused or failed half way is
    /// the call's error.
    async fn wait_reverted(&self, id: &str, what: &str, request: u64) -> Result<(), LonghornError> {
        self.wait_status(id, what, |st| {
            let r = st.revert.as_ref().filter(|r| r.answers(request))?;
            if let Some(x) = revert_failure(r, what) {
                return Some(Err(x));
            }
            (st.state == InstanceState::Running).then_some(Ok(()))
        })
        .await
    }

    // ----- ReplicaAdd, ReplicaRemove, ReplicaRebuildingQosSet

    /// `ReplicaAdd`: replica `replica` at `address` joins engine `e`'s raid1;
    /// returns once its rebuild runs (WO; the manager then waits for RW or
    /// ERR). `beside`: a linked clone's replica, the replica of the clone's
    /// source volume beside it and that volume's engine
    /// (`linked_clone_source`): its rebuilt chain starts on that replica's
    /// entrypoint when the replica is RW in that engine; otherwise SPDK's
    /// raid rebuild copies every block.
    pub(super) async fn replica_add(
        &self,
        e: &Typed<LonghornEngine>,
        replica: &str,
        address: &str,
        beside: Option<&imrpc::LinkedCloneSource>,
    ) -> Result<(), LonghornError> {
        let what = format!("adding replica {replica} to engine {}", e.id());
        let replica = naming::instance_name("replica", replica)
            .map_err(|x| LonghornError::Invalid(format!("{what}: {x}")))?;
        let replica = replica.as_str();
        let beside = beside
            .map(|l| {
                naming::instance_name("replica", &l.replica_name)
                    .map(|b| (b, l))
                    .map_err(|x| LonghornError::Invalid(format!("{what}: linked clone source: {x}")))
            })
            .transpose()?;
        let address = address.strip_prefix("tcp://").unwrap_or(address);
        address.parse::<SocketAddr>().map_err(|_| {
            LonghornError::Invalid(format!("{what}: address {address:?} is not [tcp://]ip:port"))
        })?;
        let busy = || LonghornError::Refused(format!("{what}: replica add is already in progress"));
        let _adding = self
            .try_hold(&format!("{}/replica-add", e.id()))
            .ok_or_else(busy)?;
        self.running(e, &what)?;
        let members = self.members(e).await?;
        if let Some(m) = members.iter().find(|m| m.mode == ptypes::ReplicaMode::Wo) {
            return Err(LonghornError::Refused(format!(
                "{what}: replica add is already in progress (replica {} is being rebuilt)",
                m.replica
            )));
        }
        let st = self.status_of(e.id()).unwrap_or_else(no_status);
        if e.spec
            .rebuild_requests
            .iter()
            .any(|(r, n)| st.rebuilds_started.get(r) != Some(n))
        {
            return Err(busy());
        }
        if self.client().bdev(e.id()).await.ok().flatten().is_none() {
            return Err(LonghornError::Refused(format!(
                "{what}: the engine has no raid1 (a single replica is exported as it is); \
                 make the engine again with two or more replicas"
            )));
        }
        if members
            .iter()
            .any(|m| m.replica == replica && m.mode == ptypes::ReplicaMode::Rw)
        {
            return Err(LonghornError::Exists(format!(
                "{what}: replica {replica} already exists and is in service (RW)"
            )));
        }
        if !members
            .iter()
            .any(|m| m.replica != replica && m.mode == ptypes::ReplicaMode::Rw)
        {
            return Err(LonghornError::Refused(format!(
                "{what}: no replica is in service to rebuild from"
            )));
        }
        // a replica longhorn-manager voted corrupt keeps no snapshot: the thin
        // rebuild shares snapshots by name and would keep its bad ones
        if e.spec.failed_replicas.contains(replica) {
            self.wipe_snapshots(replica, address).await.map_err(|x| {
                LonghornError::within(
                    format!("{what}: it was set ERR (its data voted corrupt), its snapshots go first"),
                    x,
                )
            })?;
        }
        // a base whose data is not in service (voted corrupt, being rebuilt)
        // is not linked to: the rebuild copies every block
        let beside = match beside {
            None => None,
            Some((b, l)) => match self
                .linked_source_unfit(b.as_str(), &l.engine_name, &l.engine_address)
                .await
            {
                None => Some((
                    b,
                    crate::resources::longhorn::LinkEngine {
                        engine: l.engine_name.clone(),
                        address: l.engine_address.clone(),
                    },
                )),
                Some(why) => {
                    tracing::warn!(engine = %e.id(), replica, beside = %b, "{what}: a linked clone's replica is rebuilt whole, not over the entrypoint beside it: {why}");
                    None
                }
            },
        };
        // request numbers never repeat (a status may still hold an older
        // request of the same replica)
        let used = e
            .spec
            .rebuild_requests
            .values()
            .chain(st.rebuilds_started.values())
            .max()
            .copied()
            .unwrap_or(0);
        let request = next_request(used);
        self.update_engine(e, |s| {
            s.replica_address_map
                .insert(replica.to_owned(), address.to_owned());
            s.rebuild_requests.insert(replica.to_owned(), request);
            match &beside {
                Some((b, engine)) => {
                    s.rebuild_links.insert(replica.to_owned(), b.to_string());
                    s.rebuild_link_engines.insert(replica.to_owned(), engine.clone());
                }
                None => {
                    s.rebuild_links.remove(replica);
                    s.rebuild_link_engines.remove(replica);
                }
            };
            // a replica set ERR comes back only through this rebuild
            s.failed_replicas.remove(replica);
        })?;
        let request = self
            .engine(e.id())?
            .spec
            .rebuild_requests
            .get(replica)
            .copied()
            .unwrap_or(request);
        // the controller starts the rebuild (start_rebuild) and records it
        self.wait_status(e.id(), &what, |st| {
            (st.rebuilds_started.get(replica) == Some(&request)).then(|| {
                match st.rebuild_errors.get(replica) {
                    Some(m) => Err(LonghornError::internal(&what, m)),
                    None => Ok(()),
                }
            })
        })
        .await
    }

    /// Deletes every snapshot of replica `replica` (this node's, or on the
    /// node at `address` through its `ReplicaGet`/`ReplicaSnapshotDelete`),
    /// the newest first: each deleted merges into its one child (SPDK keeps
    /// a snapshot with two children). Its head is made again empty by the
    /// rebuild that follows, which then copies every snapshot of the source.
    async fn wipe_snapshots(&self, replica: &str, address: &str) -> Result<(), LonghornError> {
        let peer_answer = |doing: &str, x: tonic::Status| LonghornError::PeerAnswer {
            replica: replica.to_owned(),
            code: x.code(),
            message: format!("{doing}: {}", x.message()),
        };
        /// Where the replica is: this node (its disk), or another node.
        enum At {
            Here(String),
            Peer(crate::proto::spdkrpc::spdk_service_client::SpdkServiceClient<Channel>),
        }
        let mut at = match self
            .state()
            .get_typed::<LonghornReplica>(replica)
            .map_err(LonghornError::State)?
        {
            Some(r) => At::Here(r.spec.disk),
            None => At::Peer(self.replica_node(replica, address).await?),
        };
        loop {
            // snapshot -> its parent snapshot
            let parents: BTreeMap<String, Option<String>> = match &mut at {
                At::Here(disk) => self
                    .replica_lvols_now(replica, disk)
                    .await?
                    .snapshots
                    .into_iter()
                    .map(|(s, (p, _))| (s, p))
                    .collect(),
                At::Peer(c) => c
                    .replica_get(spdkrpc::ReplicaGetRequest {
                        name: replica.to_owned(),
                    })
                    .await
                    .map_err(|x| peer_answer("ReplicaGet", x))?
                    .into_inner()
                    .snapshots
                    .into_iter()
                    .map(|(s, l)| (s, Some(l.parent).filter(|p| !p.is_empty())))
                    .collect(),
            };
            // the newest: one no other snapshot descends from
            let Some(snap) = parents
                .keys()
                .find(|s| !parents.values().any(|p| p.as_ref() == Some(*s)))
            else {
                return match parents.keys().next() {
                    None => Ok(()),
                    Some(s) => Err(LonghornError::Refused(format!(
                        "replica {replica}: its snapshots descend from each other in a circle ({s})"
                    ))),
                };
            };
            let req = spdkrpc::SnapshotRequest {
                name: replica.to_owned(),
                snapshot_name: snap.clone(),
                ..Default::default()
            };
            match &mut at {
                At::Here(_) => self.replica_snapshot_delete(req).await?,
                At::Peer(c) => {
                    c.replica_snapshot_delete(req)
                        .await
                        .map_err(|x| peer_answer("ReplicaSnapshotDelete", x))?;
                }
            }
            tracing::info!(replica, snapshot = %snap, "snapshot of a replica voted corrupt deleted before its rebuild");
        }
    }

    /// What instance `name` is (`engine`, `replica`, `engine frontend`) when it is being
    /// deleted or gone; `None` while either kind of it is wanted. One gone
    /// from the store altogether is what its status said it was (`was`),
    /// else an engine.
    fn going(&self, name: &str, was: Option<InstanceKind>) -> Option<&'static str> {
        let phase = |p: Option<Phase>| p.map(|p| p == Phase::TearingDown);
        if let Some(f) = self.state().get_typed::<LonghornEngineFrontend>(name).ok()? {
            return (f.metadata.phase == Phase::TearingDown).then_some("engine frontend");
        }
        let engine = self.state().get_typed::<LonghornEngine>(name).ok()?;
        let replica = self.state().get_typed::<LonghornReplica>(name).ok()?;
        match (
            phase(engine.map(|e| e.metadata.phase)),
            phase(replica.map(|r| r.metadata.phase)),
        ) {
            (Some(false), _) | (_, Some(false)) => None,
            (_, Some(true)) => Some("replica"),
            (Some(true), None) => Some("engine"),
            (None, None) => Some(was.map_or("engine", InstanceKind::as_str)),
        }
    }

    /// Waits for the controller: until `done` makes something of instance
    /// `engine`'s status (an engine's, a replica's, or an engine-frontend's), at most
    /// [`OP_TIMEOUT`]. An instance deleted (or being deleted) meanwhile
    /// carries out nothing more: the wait ends at once, ABORTED.
    pub(super) async fn wait_status<T>(
        &self,
        engine: &str,
        what: &str,
        mut done: impl FnMut(&LonghornInstanceStatus) -> Option<Result<T, LonghornError>>,
    ) -> Result<T, LonghornError> {
        let deadline = Instant::now() + OP_TIMEOUT;
        let mut was = None;
        loop {
            let st = self.status_of(engine);
            if let Some(r) = st.as_ref().and_then(&mut done) {
                return r;
            }
            was = st.map(|s| s.kind).or(was);
            // an instance being deleted carries out no more requests
            if let Some(noun) = self.going(engine, was) {
                return Err(LonghornError::Aborted(format!(
                    "{what}: {noun} {engine} is being deleted"
                )));
            }
            if Instant::now() > deadline {
                return Err(LonghornError::Timeout(format!(
                    "{what}: the controller has not done it in {} s",
                    OP_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `ReplicaRemove`: the replica (by name, or by address) leaves engine
    /// `e`: out of the raid1, detached, out of the replica map. One that is
    /// not there is no error.
    pub(super) async fn replica_remove(
        &self,
        e: &Typed<LonghornEngine>,
        name: &str,
        address: &str,
    ) -> Result<(), LonghornError> {
        let address = address.strip_prefix("tcp://").unwrap_or(address);
        let Some(replica) = e
            .spec
            .replica_address_map
            .iter()
            .find(|(r, a)| {
                (!name.is_empty() && r.as_str() == name) || (name.is_empty() && a.as_str() == address)
            })
            .map(|(r, _)| r.clone())
        else {
            return Ok(());
        };
        let what = format!("removing replica {replica} from engine {}", e.id());
        if e.spec.replica_address_map.len() == 1 {
            return Err(LonghornError::Refused(format!(
                "{what}: it is the engine's only replica"
            )));
        }
        if let Some(r) = &e.spec.revert
            && RevertStatus::pending(
                self.status_of(e.id()).and_then(|s| s.revert).as_ref(),
                r,
                self.session(),
            )
        {
            return Err(LonghornError::Unavailable(format!(
                "{what}: a revert of the engine to snapshot {} is in progress",
                r.snapshot
            )));
        }
        // the controller takes it out of the raid1 and detaches it
        let version = self.change_engine(e, |s| {
            s.replica_address_map.remove(&replica);
            s.rebuild_requests.remove(&replica);
            s.rebuild_links.remove(&replica);
            s.rebuild_link_engines.remove(&replica);
            // a replica set ERR stays marked: the manager may add it back
            // (reused), and its snapshots must go before its rebuild
        })?;
        self.wait_status(e.id(), &what, |st| {
            (st.observed_version >= version).then(|| match st.state {
                InstanceState::Error => Err(LonghornError::internal(&what, &st.message)),
                _ => Ok(()),
            })
        })
        .await
    }

    /// `ReplicaModeUpdate`: longhorn-manager's snapshot checksum vote found
    /// the data of the replica at `address` differs from the others'
    /// ("Detected corrupted replica") and sets it ERR. Only ERR is taken (a
    /// replica becomes RW by its rebuild, never by a word). The replica
    /// stays in the engine's map, marked failed (persisted): the controller
    /// takes it out of the raid1, so no read is served from it, and no
    /// raid1 made again takes it back; Longhorn lists it ERR, removes it and
    /// rebuilds it (`ReplicaAdd` clears the mark). Refused for the only
    /// replica in service (the volume would stop: its data is all there is)
    /// and while a rebuild runs (its source may be the one voted out: asked
    /// again at the manager's next check). Longhorn's own V2 engine answers
    /// UNIMPLEMENTED and keeps serving the replica.
    pub(super) async fn replica_mode_update(
        &self,
        e: &Typed<LonghornEngine>,
        address: &str,
        mode: ptypes::ReplicaMode,
    ) -> Result<(), LonghornError> {
        let address = address.strip_prefix("tcp://").unwrap_or(address);
        let what = format!(
            "engine {}: setting the replica at {address} {}",
            e.id(),
            mode.as_str_name()
        );
        if mode != ptypes::ReplicaMode::Err {
            return Err(LonghornError::Invalid(format!(
                "{what}: only ERR is set by a call (a replica becomes RW by its rebuild)"
            )));
        }
        let Some(replica) = e
            .spec
            .replica_address_map
            .iter()
            .find(|(_, a)| a.as_str() == address)
            .map(|(r, _)| r.clone())
        else {
            return Err(LonghornError::not_found(
                "replica",
                &format!("at {address} in engine {}", e.id()),
            ));
        };
        let what = format!("engine {}: setting replica {replica} ({address}) ERR", e.id());
        if e.spec.failed_replicas.contains(&replica) {
            return Ok(());
        }
        self.running(e, &what)?;
        let members = self.members(e).await?;
        if let Some(m) = members.iter().find(|m| m.mode == ptypes::ReplicaMode::Wo) {
            return Err(LonghornError::Unavailable(format!(
                "{what}: replica {} is being rebuilt; ask again once it is done",
                m.replica
            )));
        }
        match members.iter().find(|m| m.replica == replica).map(|m| m.mode) {
            Some(ptypes::ReplicaMode::Rw) => {}
            // out of service already: marked, so no raid1 made again takes it
            _ => {
                self.update_engine(e, |s| {
                    s.failed_replicas.insert(replica.clone());
                })?;
                return Ok(());
            }
        }
        if !members
            .iter()
            .any(|m| m.replica != replica && m.mode == ptypes::ReplicaMode::Rw)
        {
            return Err(LonghornError::Refused(format!(
                "{what}: it is the engine's only replica in service; the volume keeps it"
            )));
        }
        let version = self.change_engine(e, |s| {
            s.failed_replicas.insert(replica.clone());
        })?;
        tracing::warn!(
            engine = e.id(),
            replica,
            address,
            "replica set ERR by longhorn-manager (its snapshot checksum was voted out): taken out of the raid1"
        );
        // the controller takes it out of the raid1
        let message = self
            .wait_status(e.id(), &what, |st| {
                (st.observed_version >= version).then(|| match st.state {
                    InstanceState::Error => Err(LonghornError::internal(&what, &st.message)),
                    _ => Ok(st.message.clone()),
                })
            })
            .await?;
        let e = self.engine(e.id())?;
        match self.members(&e).await?.iter().find(|m| m.replica == replica) {
            Some(m) if m.mode == ptypes::ReplicaMode::Rw => Err(LonghornError::internal(
                &what,
                format!("still in the raid1 ({message}); taken out at the next reconcile"),
            )),
            _ => Ok(()),
        }
    }

    /// `ReplicaRebuildingQosSet`: the cap is kept on the engine for the
    /// next rebuilds; the controller brings the running rebuild's member to
    /// it (0 lifts) and the call returns once a reconcile has seen it.
    pub(super) async fn rebuild_qos_set(
        &self,
        e: &Typed<LonghornEngine>,
        mbps: i64,
    ) -> Result<(), LonghornError> {
        let what = format!("engine {}: rebuild QoS {mbps} MB/s", e.id());
        if mbps < 0 {
            return Err(LonghornError::Invalid(format!("{what}: negative")));
        }
        let version = self.change_engine(e, |s| s.rebuild_qos_mbps = mbps)?;
        self.wait_status(e.id(), &what, |st| {
            (st.observed_version >= version).then_some(Ok(()))
        })
        .await
    }

    // ----- EngineSetTargetListenerANAState

    /// `EngineSetTargetListenerANAState`: the ANA state of engine `name`'s
    /// export (Longhorn's spelling: `optimized`, `non-optimized`,
    /// `inaccessible`), kept on the engine (set again at every export and
    /// after every freeze) and set by the controller before the call
    /// returns. An engine that does not serve yet is set when it does.
    pub(super) async fn engine_ana_state_set(&self, name: &str, state: &str) -> Result<(), LonghornError> {
        let want = AnaState::parse(state).ok_or_else(|| {
            LonghornError::Invalid(format!(
                "engine {name}: invalid ANA state {state:?} (optimized, non-optimized or inaccessible)"
            ))
        })?;
        let e = self.engine(name)?;
        let what = format!("engine {name}: ANA state {}", want.as_str());
        let version = self.change_engine(&e, |s| s.ana_state = want)?;
        self.wait_status(name, &what, |st| {
            if st.observed_version < version {
                return None;
            }
            if st.ana_state == Some(want) {
                return Some(Ok(()));
            }
            if !st.ana_error.is_empty() {
                return Some(Err(LonghornError::Internal {
                    what: what.clone(),
                    message: st.ana_error.clone(),
                }));
            }
            // not exported: its listener is added in that state
            (st.state != InstanceState::Running).then_some(Ok(()))
        })
        .await
    }

    // ----- forwarding

    /// The engine-frontend of this node that attaches engine `engine`
    /// (`named` first, when given).
    pub(super) fn frontend_for(&self, engine: &str, named: &str) -> Option<Typed<LonghornEngineFrontend>> {
        let v = self.frontends_of(engine);
        v.iter()
            .find(|f| !named.is_empty() && f.id() == named)
            .or_else(|| v.first())
            .cloned()
    }

    /// For a call about an engine that is not on this node: the proxy of
    /// the engine's node (this node's own proxy port), at the IP of the
    /// engine-frontend's target when this node attaches the engine, else at
    /// the IP of the call's `address` (the engine's `ip:port`, where
    /// Longhorn's own proxy sends it: a backup's owner node asks its own
    /// instance manager about an engine on another node). `None`: answer
    /// here.
    pub(super) async fn forward_target(
        &self,
        forwarded: bool,
        p: Option<&imrpc::ProxyEngineRequest>,
    ) -> Result<Option<ProxyEngineServiceClient<Channel>>, LonghornError> {
        let Some(p) = p else {
            return Ok(None);
        };
        if forwarded || p.engine_name.is_empty() {
            return Ok(None);
        }
        if self
            .state()
            .get_typed::<LonghornEngine>(&p.engine_name)
            .map_err(LonghornError::State)?
            .is_some()
        {
            return Ok(None);
        }
        let (sa, via): (SocketAddr, String) = match self.frontend_for(&p.engine_name, &p.engine_frontend_name)
        {
            Some(f) => (
                f.spec.target_address.parse().map_err(|_| {
                    LonghornError::internal(
                        format!("engine-frontend {}", f.id()),
                        format!("target address {:?} is not ip:port", f.spec.target_address),
                    )
                })?,
                format!("engine-frontend {} attaches it", f.id()),
            ),
            None => {
                let a = p.address.strip_prefix("tcp://").unwrap_or(&p.address);
                let Ok(sa) = a.parse::<SocketAddr>() else {
                    return Ok(None);
                };
                (sa, format!("the call's address {a}"))
            }
        };
        let url = format!("http://{}", SocketAddr::new(sa.ip(), self.proxy_port()));
        let ch = tonic::transport::Endpoint::from_shared(url.clone())
            .map_err(|x| LonghornError::internal(&url, x))?
            .connect_timeout(super::proxy::REMOTE_TIMEOUT)
            .timeout(OP_TIMEOUT)
            .connect()
            .await
            .map_err(|x| {
                LonghornError::Unavailable(format!(
                    "engine {} is on another node ({via}); its proxy at {url}: {x}",
                    p.engine_name
                ))
            })?;
        Ok(Some(ProxyEngineServiceClient::new(ch)))
    }
}

fn mode_name(m: &Member) -> &'static str {
    match m.mode {
        ptypes::ReplicaMode::Rw => "RW",
        ptypes::ReplicaMode::Wo => "WO",
        ptypes::ReplicaMode::Err => "ERR",
    }
}

/// An engine status before the controller wrote one.
/// A request number past `used` that never repeats (the clock, in ns).
/// Why a revert carried out did not revert, if so: refused (nothing
/// touched), or failed half way (the controller tries it again).
fn revert_failure(r: &RevertStatus, what: &str) -> Option<LonghornError> {
    if !r.refused.is_empty() {
        return Some(LonghornError::Refused(format!("{what}: {}", r.refused)));
    }
    (!r.error.is_empty()).then(|| LonghornError::internal(what, &r.error))
}

fn no_status() -> crate::resources::longhorn::LonghornInstanceStatus {
    crate::resources::longhorn::LonghornInstanceStatus::new(
        crate::resources::longhorn::InstanceKind::Engine,
        InstanceState::Starting,
        "",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::State;
    use crate::spdk::SpdkClient;
    use tonic::Code;

    /// An engine being deleted (InstanceDelete returned, the controller
    /// tears it down) is gone for SPDKService's `EngineGet`, as Longhorn's
    /// engine is once its EngineDelete returned: a switch-over whose new
    /// engine the manager deleted is given up without waiting for the
    /// teardown.
    #[tokio::test]
    async fn an_engine_being_deleted_is_not_found_by_engine_get() {
        let lh = Longhorn::new(State::in_memory(), SpdkClient::new("/nonexistent"), 1..=2);
        let e = engine();
        use crate::runtime::Spec;
        let st = lh.state();
        st.create_typed("vol-e-1", "test", &e).expect("engine");
        st.add_finalizer(
            LonghornEngine::NAMESPACE,
            LonghornEngine::TYPE,
            "vol-e-1",
            "test-controller",
        )
        .expect("finalizer");
        st.destroy(LonghornEngine::NAMESPACE, LonghornEngine::TYPE, "vol-e-1", "test")
            .expect("delete");
        let err = lh.engine_get_spdk("vol-e-1").await.expect_err("being deleted");
        assert_eq!(err.code(), Code::NotFound, "{}", err.message());
        assert!(err.message().contains("vol-e-1"), "{}", err.message());
    }

    /// An engine deleted and made again under its name before the pass that
    /// removed it dropped its status: the status left is the old engine's
    /// and is not read as the new one's (it said running before the new one
    /// was made); one written after is.
    #[tokio::test]
    async fn a_status_written_before_its_instance_was_made_is_its_predecessors() {
        let lh = Longhorn::new(State::in_memory(), SpdkClient::new("/nonexistent"), 1..=2);
        let st = LonghornInstanceStatus::new(InstanceKind::Engine, InstanceState::Running, "");
        lh.state()
            .create_typed("vol-e-0", "test", &st)
            .expect("the old engine's status");
        // no engine of that name: the status as it is
        assert_eq!(
            lh.status_of("vol-e-0").map(|s| s.state),
            Some(InstanceState::Running)
        );
        std::thread::sleep(Duration::from_millis(3));
        lh.state()
            .create_typed("vol-e-0", "test", &engine())
            .expect("the new engine");
        assert_eq!(lh.status_of("vol-e-0"), None);
        std::thread::sleep(Duration::from_millis(3));
        let mut now = st.clone();
        now.state = InstanceState::Starting;
        lh.state()
            .update_typed("vol-e-0", "test", None, &now)
            .expect("the new engine's status");
        assert_eq!(
            lh.status_of("vol-e-0").map(|s| s.state),
            Some(InstanceState::Starting)
        );
    }

    fn engine() -> LonghornEngine {
        LonghornEngine {
            volume: "vol".into(),
            size_bytes: 1 << 20,
            replica_address_map: [("vol-r-a".to_string(), "127.0.0.1:20001".to_string())].into(),
            port: 20000,
            frontend: String::new(),
            snapshot_max_count: 0,
            rebuild_qos_mbps: 0,
            rebuild_requests: Default::default(),
            rebuild_links: Default::default(),
            rebuild_link_engines: Default::default(),
            removed_snapshots: Default::default(),
            failed_replicas: Default::default(),
            purge_request: 0,
            revert: None,
            snapshot_requests: Default::default(),
            snapshot_info: Default::default(),
            ana_state: Default::default(),
        }
    }

    /// An instance gone from the store altogether (no finalizer held it
    /// tearing down) is named as its status said it was.
    #[tokio::test]
    async fn a_wait_on_an_instance_gone_names_it_as_its_status_did() {
        let lh = Longhorn::new(State::in_memory(), SpdkClient::new("/nonexistent"), 1..=2);
        let st = LonghornInstanceStatus::new(InstanceKind::Replica, InstanceState::Running, "");
        lh.state()
            .create_typed("vol-r-a", "test", &st)
            .expect("a replica's status");
        let e = lh
            .wait_status::<()>("vol-r-a", "waiting", |_| None)
            .await
            .expect_err("no replica vol-r-a");
        assert_eq!(
            (e.code(), e.message().as_str()),
            (Code::Aborted, "waiting: replica vol-r-a is being deleted")
        );
        // nothing says what it was
        let e = lh
            .wait_status::<()>("vol-e-0", "waiting", |_| None)
            .await
            .expect_err("no engine vol-e-0");
        assert_eq!(e.message(), "waiting: engine vol-e-0 is being deleted");
    }
}
