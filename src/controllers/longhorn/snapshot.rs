//! Engine snapshots: `VolumeSnapshot` numbers a request on the engine
//! (`LonghornEngine.snapshotRequests`); this takes it once per number with
//! the same point-in-time core as talon's own volumes
//! ([`VolumeOps::take_at_one_instant`]) and reports it in
//! `LonghornInstanceStatus.snapshots`, which the call waits on.
//!
//! ```text
//!   request (name, n) ──> refused: the engine not running
//!                     ──> export frozen (no I/O enters, none in flight in the raid1)
//!                           this node's replicas:  bdev_lvol_snapshot <lvs>/<replica> -> <replica>-snap-<name>
//!                           another node's:        its ReplicaSnapshotCreate (inside the freeze)
//!                           a replica the raid1 does not serve (ERR, or WO: rebuilt) gets none
//!                         thawed, always
//!                     ──> failed: what was made is deleted, the error reported
//! ```
//!
//! The call takes no SPDK step itself: a freeze held by a gRPC handler
//! outlived the caller that dropped it, and the engine's replicas in service
//! are the controller's to know (the raid it made).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures::FutureExt;

use super::{InstanceError, LonghornController};
use crate::names::ObjectName;
use crate::proto::spdkrpc;
use crate::resources::longhorn::{
    LonghornEngine, LonghornInstanceStatus, LonghornReplica, SnapshotInfo, SnapshotStatus, snapshot_lvol,
};
use crate::runtime::Typed;
use crate::spdk::naming::longhorn as naming;
use crate::spdk::volume::{Inventory, Member, PeerError, PointInTime, Unfreezable};

/// How long another node may take to snapshot its replica: the engine's
/// export is frozen meanwhile.
const REMOTE_TIMEOUT: Duration = Duration::from_secs(10);

impl LonghornController {
    /// Carries out engine `e`'s snapshot requests not carried out yet
    /// (`prev` holds those that were); gives the statuses to report, one per
    /// request still in the spec. `running`: the engine is served (else
    /// each new request is refused, naming `why`).
    pub(super) async fn snapshots(
        &self,
        inv: &Inventory,
        e: &Typed<LonghornEngine>,
        local: &BTreeMap<String, LonghornReplica>,
        prev: Option<&LonghornInstanceStatus>,
        running: Result<(), &str>,
    ) -> BTreeMap<String, SnapshotStatus> {
        let mut out = BTreeMap::new();
        for (name, r) in &e.spec.snapshot_requests {
            let done = prev.and_then(|p| p.snapshots.get(name));
            if done.is_some_and(|d| d.request >= r.request) || r.session != self.session.id() {
                out.extend(done.map(|d| (name.clone(), d.clone())));
                continue;
            }
            let error = match running {
                Err(why) => format!(
                    "snapshot {name} of engine {}: the engine is not running: {why}",
                    e.id()
                ),
                Ok(()) => match self.snapshot(inv, e, local, name, r.info.as_ref()).await {
                    Ok(()) => String::new(),
                    Err(m) => m.text(),
                },
            };
            if error.is_empty() {
                tracing::info!(engine = e.id(), request = r.request, snapshot = %name, "engine snapshot");
            } else {
                tracing::warn!(engine = e.id(), request = r.request, %error, "engine snapshot");
            }
            out.insert(
                name.clone(),
                SnapshotStatus {
                    request: r.request,
                    error,
                },
            );
        }
        out
    }

    /// Snapshot `snap` of every replica of engine `e` in service, at one
    /// instant; nothing of it left on error. Another node's replica gets
    /// the snapshot's time and labels (`info`) with it, to keep.
    async fn snapshot(
        &self,
        inv: &Inventory,
        e: &Typed<LonghornEngine>,
        local: &BTreeMap<String, LonghornReplica>,
        snap: &str,
        info: Option<&SnapshotInfo>,
    ) -> Result<(), InstanceError> {
        let failed = |source| InstanceError::Snapshot {
            engine: e.id().to_owned(),
            snapshot: snap.to_owned(),
            source: Box::new(source),
        };
        let volume = ObjectName::parse("volume", &e.spec.volume).map_err(|x| failed(x.into()))?;
        let nqn = naming::volume_nqn(&volume).map_err(|x| failed(x.into()))?;
        let replicas: Vec<(&String, &String)> = e.spec.replica_address_map.iter().collect();
        let stamp = info.map_or_else(
            || humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            |i| i.created.clone(),
        );
        let labels: HashMap<String, String> = info
            .map(|i| i.labels.clone().into_iter().collect())
            .unwrap_or_default();
        let mut members = Vec::new();
        for (key, (replica, address)) in replicas.iter().enumerate() {
            match local.get(*replica) {
                Some(r) => {
                    let head = naming::replica_alias(&r.disk, replica);
                    let lvol = snapshot_lvol(replica, snap);
                    let lvs = crate::spdk::volume::naming::lvstore(&r.disk);
                    // taken before (a call tried again): kept
                    if !inv.lvols.contains_key(&format!("{lvs}/{lvol}")) {
                        members.push(Member::Local {
                            key,
                            head,
                            snapshot: lvol,
                        });
                    }
                }
                None => members.push(Member::Remote {
                    key,
                    name: (*replica).clone(),
                    bdev: format!("{replica}n1"),
                    take: self
                        .snapshot_remote(replica, address, snap, &stamp, labels.clone())
                        .boxed(),
                }),
            }
        }
        if members.is_empty() {
            return Ok(());
        }
        let remote: Vec<usize> = members
            .iter()
            .filter_map(|m| match m {
                Member::Remote { key, .. } => Some(*key),
                Member::Local { .. } => None,
            })
            .collect();
        let taken = self
            .ops
            .take_at_one_instant(
                inv,
                PointInTime {
                    id: format!("{}@{snap}", e.id()),
                    export: nqn.as_str().to_owned(),
                    raid: inv.raid(e.id()).map(|r| r.name.clone()),
                    members,
                    unfreezable: Unfreezable::Refuse,
                },
            )
            .await;
        match taken {
            Ok(t) if t.is_empty() => Err(failed(InstanceError::NoneInService)),
            Ok(t) => {
                // ERR ones, which Longhorn's engine skips too (isBackendDispatchable);
                // WO ones, which it would snapshot: here their copy is not the
                // volume's until the rebuild ends (as before this moved here)
                let without: Vec<&str> = t.left_out.iter().map(|k| replicas[*k].0.as_str()).collect();
                if !without.is_empty() {
                    tracing::info!(
                        engine = e.id(),
                        snapshot = snap,
                        ?without,
                        "snapshot of the replicas in service"
                    );
                }
                Ok(())
            }
            Err(x) => {
                // a thaw may have failed: the export's ANA state is looked
                // at again at the next reconcile (as talon's volumes do)
                self.thaw_checked.forget(nqn.as_str());
                // this node's were deleted; another node's are asked to go
                for k in remote {
                    let (replica, address) = replicas[k];
                    if let Err(m) = self.delete_snapshot_there(replica, address, snap).await {
                        tracing::warn!(engine = e.id(), error = %m.text(), "a failed snapshot left on another node");
                    }
                }
                Err(failed(x.into()))
            }
        }
    }

    /// Has the node of remote replica `replica` (at `address`) snapshot it.
    async fn snapshot_remote(
        &self,
        replica: &str,
        address: &str,
        snap: &str,
        stamp: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), PeerError> {
        // the error names the replica (VolumeError::PeerSnapshot)
        let mut c = self
            .peers
            .client(address, self.peer_port, REMOTE_TIMEOUT)
            .await
            .map_err(|e| PeerError::Unreachable {
                node: address.to_owned(),
                message: crate::util::error_chain(&e),
            })?;
        c.replica_snapshot_create(spdkrpc::SnapshotRequest {
            name: replica.to_owned(),
            snapshot_name: snap.to_owned(),
            user_created: true,
            snapshot_timestamp: stamp.to_owned(),
            labels,
        })
        .await
        .map(|_| ())
        .map_err(|s| PeerError::Refused {
            node: address.to_owned(),
            message: s.message().to_owned(),
        })
    }
}
