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
//! A take is recorded before the freeze ([`LonghornSnapshotTake`],
//! persisted) and forgotten once it answered. A talon that stops in between
//! leaves copies of two instants: this node's, and another node's that its
//! call may still make after the stop. Each pass deletes the copies a record
//! left on every replica it names, until no remote call can land any more
//! ([`LonghornSnapshotTake::settled_ms`]); a snapshot of that name is
//! refused until then (a retry would keep the old copies beside new ones: a
//! snapshot whose replicas differ, and a revert to it a raid1 over them).
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
    LonghornEngine, LonghornInstanceStatus, LonghornReplica, LonghornSnapshotTake, SnapshotInfo,
    SnapshotStatus, snapshot_lvol,
};
use crate::runtime::{ControllerError, ReconcileContext, Typed};
use crate::spdk::naming::longhorn as naming;
use crate::spdk::volume::{Inventory, Member, PeerError, PointInTime, Unfreezable};

/// How long another node may take to snapshot its replica: the engine's
/// export is frozen meanwhile.
const REMOTE_TIMEOUT: Duration = Duration::from_secs(10);

/// After a clean-up that left something, how long until the next.
const RETRY_AFTER_MS: u64 = 30_000;

/// After a clean-up that left nothing before no copy can land any more,
/// how long until the next.
const AGAIN_AFTER_MS: u64 = 3_000;

/// How long after a take began a copy of it may still land on another
/// node: its call's time-out, and as long again for the node's own SPDK
/// call that the time-out did not stop.
const LANDS_WITHIN: Duration = Duration::from_secs(2 * REMOTE_TIMEOUT.as_secs());

impl LonghornController {
    /// Carries out engine `e`'s snapshot requests not carried out yet
    /// (`prev` holds those that were); gives the statuses to report, one per
    /// request still in the spec. `running`: the engine is served (else
    /// each new request is refused, naming `why`).
    pub(super) async fn snapshots(
        &self,
        ctx: &mut ReconcileContext,
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
                Ok(()) => match self.snapshot(ctx, inv, e, local, name, r.info.as_ref()).await {
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
        ctx: &mut ReconcileContext,
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
        // a take of this name that did not end: its copies go first
        let record = LonghornSnapshotTake::id(e.id(), snap);
        if let Some(left) = ctx
            .get::<LonghornSnapshotTake>(&record)
            .map_err(|x| failed(x.into()))?
        {
            return Err(failed(InstanceError::TakeNotEnded { left: left.spec.left }));
        }
        let began = crate::util::unix_ms();
        let mut taking = LonghornSnapshotTake {
            engine: e.id().to_owned(),
            snapshot: snap.to_owned(),
            local: BTreeMap::new(),
            remote: BTreeMap::new(),
            began_ms: began,
            settled_ms: began.saturating_add(u64::try_from(LANDS_WITHIN.as_millis()).unwrap_or(u64::MAX)),
            left: String::new(),
            next_ms: 0,
        };
        // what each remote call left: a copy, none, or not known
        let landed: std::sync::Mutex<BTreeMap<String, Landed>> = Default::default();
        let mut members = Vec::new();
        for (key, (replica, address)) in replicas.iter().enumerate() {
            match local.get(*replica) {
                Some(r) => {
                    let head = naming::replica_alias(&r.disk, replica);
                    let lvol = snapshot_lvol(replica, snap);
                    let lvs = crate::spdk::volume::naming::lvstore(&r.disk);
                    // taken before by a take that answered (one that did not
                    // end left a record, above): kept
                    if !inv.lvols.contains_key(&format!("{lvs}/{lvol}")) {
                        taking.local.insert((*replica).clone(), r.disk.clone());
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
                        .snapshot_remote(replica, address, snap, &stamp, labels.clone(), &landed)
                        .boxed(),
                }),
            }
        }
        if members.is_empty() {
            return Ok(());
        }
        for m in &members {
            if let Member::Remote { key, .. } = m {
                let (replica, address) = replicas[*key];
                taking.remote.insert(replica.clone(), address.clone());
            }
        }
        if taking.remote.is_empty() {
            // this node's calls end with its target, before a talon started
            // again lists it
            taking.settled_ms = began;
        }
        // recorded before the freeze, forgotten once the take answered
        ctx.apply(&record, taking.clone()).map_err(|x| failed(x.into()))?;
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
        if taken.is_ok() {
            ctx.destroy::<LonghornSnapshotTake>(&record)
                .map_err(|x| failed(x.into()))?;
        }
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
                // this node's were deleted (asked again here: an undo may
                // have failed); another node's that made one, or may have,
                // are asked to go now, and again by the passes until none
                // can land
                let landed = landed
                    .into_inner()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                taking.remote.retain(|r, _| landed.get(r) != Some(&Landed::No));
                if taking.remote.keys().all(|r| landed.get(r) == Some(&Landed::Yes)) {
                    taking.settled_ms = crate::util::unix_ms();
                }
                ctx.apply(&record, taking).map_err(|x| failed(x.into()))?;
                self.clean_take(ctx, None, &record)
                    .await
                    .map_err(|c| failed(c.into()))?;
                Err(failed(x.into()))
            }
        }
    }

    /// Deletes the copies that takes which did not end left
    /// ([`LonghornSnapshotTake`]): at every pass, before any engine's
    /// snapshot. What it deletes goes from `inv`.
    pub(super) async fn clean_takes(
        &self,
        ctx: &mut ReconcileContext,
        inv: &mut Inventory,
    ) -> Result<(), ControllerError> {
        for t in ctx.list::<LonghornSnapshotTake>()? {
            for alias in self.clean_take(ctx, Some(inv), t.id()).await? {
                inv.lvols.remove(&alias);
            }
        }
        Ok(())
    }

    /// Deletes the copies take `id` may have made, on this node (those `inv`
    /// lists; every one without it) and on the other nodes; forgets the take once nothing is left
    /// and none can land any more. Gives the aliases deleted here. A failure
    /// to delete is kept in the record (and logged when it changes), tried
    /// again at the next pass.
    async fn clean_take(
        &self,
        ctx: &mut ReconcileContext,
        inv: Option<&Inventory>,
        id: &str,
    ) -> Result<Vec<String>, crate::runtime::ContextError> {
        let Some(t) = ctx.get::<LonghornSnapshotTake>(id)? else {
            return Ok(Vec::new());
        };
        let mut take = t.spec;
        let now = crate::util::unix_ms();
        if now < take.next_ms {
            return Ok(Vec::new());
        }
        let snap = take.snapshot.clone();
        let mut deleted = Vec::new();
        let mut left = Vec::new();
        for (replica, disk) in &take.local {
            let lvs = crate::spdk::volume::naming::lvstore(disk);
            let alias = format!("{lvs}/{}", snapshot_lvol(replica, &snap));
            if inv.is_some_and(|i| !i.lvols.contains_key(&alias)) {
                continue;
            }
            match self.ops.delete_replica_snapshot(&lvs, replica, &snap).await {
                Ok(a) => deleted.push(a),
                Err(x) => left.push(crate::util::error_chain(&x)),
            }
        }
        for (replica, address) in &take.remote {
            if let Err(m) = self.delete_snapshot_there(replica, address, &snap, true).await {
                left.push(m.text());
            }
        }
        if !deleted.is_empty() {
            tracing::info!(engine = %take.engine, snapshot = %snap, ?deleted,
                "a snapshot's take that did not end: its copies here deleted");
        }
        let left = left.join("; ");
        if left.is_empty() && now >= take.settled_ms {
            tracing::info!(engine = %take.engine, snapshot = %snap,
                "a snapshot's take that did not end: no copy of it is left");
            ctx.destroy::<LonghornSnapshotTake>(id)?;
        } else {
            if left != take.left && !left.is_empty() {
                tracing::warn!(engine = %take.engine, snapshot = %snap, %left,
                    "a snapshot's take that did not end: copies not deleted yet");
            }
            // nothing left: looked at again shortly (a copy may still land)
            take.next_ms = now.saturating_add(if left.is_empty() {
                AGAIN_AFTER_MS
            } else {
                RETRY_AFTER_MS
            });
            take.left = left;
            ctx.apply(id, take)?;
        }
        Ok(deleted)
    }

    /// Has the node of remote replica `replica` (at `address`) snapshot it;
    /// notes in `landed` what the call left there.
    async fn snapshot_remote(
        &self,
        replica: &str,
        address: &str,
        snap: &str,
        stamp: &str,
        labels: HashMap<String, String>,
        landed: &std::sync::Mutex<BTreeMap<String, Landed>>,
    ) -> Result<(), PeerError> {
        let note = |l: Landed| {
            landed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(replica.to_owned(), l);
        };
        // the error names the replica (VolumeError::PeerSnapshot)
        let mut c = match self.peers.client(address, self.peer_port, REMOTE_TIMEOUT).await {
            Ok(c) => c,
            Err(e) => {
                note(Landed::No);
                return Err(PeerError::Unreachable {
                    node: address.to_owned(),
                    message: crate::util::error_chain(&e),
                });
            }
        };
        let asked = c
            .replica_snapshot_create(spdkrpc::SnapshotRequest {
                name: replica.to_owned(),
                snapshot_name: snap.to_owned(),
                user_created: true,
                snapshot_timestamp: stamp.to_owned(),
                labels,
            })
            .await;
        note(Landed::of(&asked));
        asked.map(|_| ()).map_err(|s| PeerError::Refused {
            node: address.to_owned(),
            message: s.message().to_owned(),
        })
    }
}

/// What a remote call of a take left on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Landed {
    /// A copy (the call succeeded).
    Yes,
    /// None: the call was never sent, or its node answered that it failed.
    No,
    /// Not known: cut or timed out once sent; a copy may still land.
    Maybe,
}

impl Landed {
    /// What a call that ended in `r` left.
    fn of<T>(r: &Result<T, tonic::Status>) -> Self {
        match r {
            Ok(_) => Landed::Yes,
            Err(s) if never_sent(s) || answered(s.code()) => Landed::No,
            Err(_) => Landed::Maybe,
        }
    }
}

/// Whether a call that failed with `s` never left this node: its connection
/// was refused (the node's talon down), so nothing of it can land there.
fn never_sent(s: &tonic::Status) -> bool {
    let mut e: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(x) = e {
        if let Some(io) = x.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        e = x.source();
    }
    false
}

/// Whether status code `c` is the other node's own answer that the call
/// failed before it made anything (not a time-out, a cut connection, or
/// an internal failure whose SPDK call may still end).
fn answered(c: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        c,
        Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy may land after a take only from a call that was sent and not
    /// answered: cut, timed out, or failed inside the other node.
    #[test]
    fn only_a_call_sent_and_not_answered_may_still_land_a_copy() {
        assert_eq!(Landed::of(&Ok(())), Landed::Yes);
        for s in [
            tonic::Status::not_found("replica vol-r-b not found"),
            tonic::Status::invalid_argument("bad snapshot name"),
            tonic::Status::failed_precondition("not running"),
        ] {
            assert_eq!(Landed::of::<()>(&Err(s)), Landed::No);
        }
        for s in [
            tonic::Status::cancelled("Timeout expired"),
            tonic::Status::deadline_exceeded("deadline"),
            tonic::Status::internal("replica vol-r-b: snapshotting: timed out"),
            tonic::Status::unavailable("connection reset"),
        ] {
            assert_eq!(Landed::of::<()>(&Err(s)), Landed::Maybe);
        }
        let refused = tonic::Status::from_error(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(Landed::of::<()>(&Err(refused)), Landed::No);
    }
}
