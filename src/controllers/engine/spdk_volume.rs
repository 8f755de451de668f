//! `engine.SpdkVolumeController`: realizes V2 `Volume`s and their `Snapshot`s
//! in spdk_tgt through [`VolumeOps`], and reports `EngineStatus`,
//! `SnapshotStatus` and `ReplicaStatus`.
//!
//! ```text
//!   Volume, Snapshot, Disk (config) ─┐
//!   NodeConfig (listener, hosts) ────┼─> Inventory::load ─> orphans removed (talon names, no lvol
//!                                    │                      of an unknown volume: spdk_orphans)
//!   TargetStatus "spdk" (restarts) ──┘        │
//!                                             v
//!        plain volumes ─> snapshots ─> clones / reverts ─> deletions (volumes, then snapshots)
//!              (VolumeOps::ensure, concurrently)                     │
//!                                             v                      v
//!        EngineStatus <vol>, ReplicaStatus <vol>-r<k>,     finalizers released
//!        SnapshotStatus <vol>@<snap>
//! ```
//!
//! Every reconcile compares the whole target with the desired state, so a
//! target restart (TargetStatus changes) is repaired by the same path that
//! creates: lvols come back with their lvstore, the raid and export are made
//! again. A volume's replicas are local lvols (placed here on distinct disks)
//! and `remoteReplicas` served by other talon nodes (a Volume there with
//! `serveReplica: k` keeps and exports replica k), attached over NVMe/TCP
//! into this node's raid1. The persisted `ReplicaLedger` says which replicas
//! are up to date; the others are rebuilt before they count.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::selection::serves_v2;
use crate::names::ObjectName;
use crate::resources::config::{Disk, FrontendKind, NodeConfig, Snapshot, Volume, split_snapshot_id};
use crate::resources::engine::SPDK_STATUS_ID;
use crate::resources::engine::{
    CopyProgress, DiskStatus, Engine, EngineStatus, Export, ObjectState, RebuildDest, RebuildDestStatus,
    ReplicaLedger, ReplicaStatus, SnapshotStatus, SpdkEvents, TargetStatus,
};
use crate::resources::frontend::Attachment;
use crate::runtime::{Controller, ControllerError, Input, Output, Phase, ReconcileContext, Requeue, Typed};
use crate::spdk::SpdkClient;
use crate::spdk::placement::DiskAway;
use crate::spdk::volume::plan::RestoreFile;
use crate::spdk::volume::{
    ExportSpec, Inventory, LvolNotes, PeerError, RemoteDest, RemoteSnapshot, RevertAsk, VolumeError,
    VolumeInfo, VolumeOps, VolumePlan, applied_revert, replica_heads,
};

use super::peer::{PeerDest, Peers};
use super::restore::{Restores, Step as RestoreStep};
use super::snapshot_copy::{SnapshotCopies, Step as CopyStep};

/// Volumes realized concurrently in one reconcile.
const CONCURRENCY: usize = 16;

/// Serves V2 volumes in spdk_tgt.
#[derive(Debug)]
pub struct SpdkVolumeController {
    ops: VolumeOps,
    claims_auto: bool,
    /// This host's NQN: allowed on the exports of volumes attached here, and
    /// presented when attaching remote replicas.
    host_nqn: Option<String>,
    /// The volumes' exports (by NQN) checked for listeners left frozen (ANA
    /// inaccessible) by a snapshot that did not finish, since this start.
    thaw_checked: crate::spdk::volume::freeze::ThawOnce,
    /// The data directory (DH-HMAC-CHAP secrets under `nvme-dhchap/`).
    data_dir: Option<std::path::PathBuf>,
    /// The nodes of remote replicas, for their snapshots and growth.
    peers: Peers,
    /// Volumes made from backups, being restored.
    restores: Restores,
    /// Volumes made with a copy of a snapshot, being copied.
    copies: SnapshotCopies,
    /// (volume, remote replica) -> the size its node was asked to grow to,
    /// and when a failed ask may be tried again.
    grown: std::sync::Mutex<BTreeMap<(String, usize), Grown>>,
}

/// What a remote replica's node was asked to grow to.
#[derive(Debug, Clone, Copy)]
enum Grown {
    To(u64),
    RetryAfter(std::time::Instant),
}

impl SpdkVolumeController {
    /// A controller driving the target behind `client`; `selection_claims_auto`:
    /// whether `auto` volumes on an `auto` node are V2 here (SPDK usable).
    pub fn new(client: SpdkClient, selection_claims_auto: bool) -> Self {
        Self {
            ops: VolumeOps::new(client),
            claims_auto: selection_claims_auto,
            host_nqn: None,
            thaw_checked: Default::default(),
            data_dir: None,
            peers: Peers::default(),
            restores: Restores::default(),
            copies: SnapshotCopies::default(),
            grown: std::sync::Mutex::default(),
        }
    }

    /// Calls the nodes of remote replicas (`RemoteReplica.api`) with `peers`.
    pub fn with_peers(mut self, peers: Peers) -> Self {
        self.peers = peers;
        self
    }

    /// Asks the nodes of `v`'s callable remote replicas to grow them to the
    /// volume's size (once per size; a failure is tried again after 30 s).
    async fn grow_remotes(&self, v: &Typed<Volume>) {
        for (k, api) in Self::callable_remotes(&v.spec) {
            let key = (v.id().to_string(), k);
            let due = match lock(&self.grown).get(&key) {
                Some(Grown::To(s)) => *s < v.spec.size_bytes,
                Some(Grown::RetryAfter(t)) => std::time::Instant::now() >= *t,
                None => true,
            };
            if !due {
                continue;
            }
            let next = match self.peers.expand(&api, v.id(), v.spec.size_bytes).await {
                Ok(()) => Grown::To(v.spec.size_bytes),
                Err(e) => {
                    tracing::warn!(volume = %v.id(), replica = k, error = %e, "remote replica not grown");
                    Grown::RetryAfter(std::time::Instant::now() + Duration::from_secs(30))
                }
            };
            lock(&self.grown).insert(key, next);
        }
    }

    /// The remote replicas of `spec` whose node talon can call: (index, api).
    fn callable_remotes(spec: &Volume) -> Vec<(usize, String)> {
        spec.remote_replicas
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((spec.replicas as usize + i, r.api.clone()?)))
            .collect()
    }

    /// Exports attached volumes to this host's NQN and attaches remote
    /// replicas as it.
    pub fn with_host_nqn(mut self, nqn: Option<String>) -> Self {
        self.ops = self.ops.with_host_nqn(nqn.clone());
        self.host_nqn = nqn;
        self
    }

    /// Keeps DH-HMAC-CHAP secrets under `data_dir` (`NodeConfig.nvmeDhchap`)
    /// and restores volumes from backups under `<data_dir>/restore/`.
    pub fn with_data_dir(mut self, data_dir: std::path::PathBuf) -> Self {
        self.restores = Restores::new(&data_dir);
        self.data_dir = Some(data_dir);
        self
    }
}

/// The host NQNs a volume's export allows: the node's allowed hosts (NQNs
/// among them) and, for a served replica, its engine nodes (`replicaHosts`);
/// for a volume with an engine here, this host while the volume is attached.
pub fn export_hosts(node: &NodeConfig, spec: &Volume, attached_by: Option<&str>) -> Vec<String> {
    let mut hosts: Vec<String> = Vec::new();
    let own = if spec.serve_replica.is_some() {
        spec.replica_hosts.clone()
    } else {
        attached_by.map(str::to_owned).into_iter().collect()
    };
    let allowed = node
        .allowed_hosts
        .iter()
        .filter(|h| crate::names::Nqn::parse(h).is_ok())
        .cloned();
    for h in own.into_iter().chain(allowed) {
        if !hosts.contains(&h) {
            hosts.push(h);
        }
    }
    hosts
}

/// What refuses `job`'s revert to `target` here, in the words both
/// protocols share: a frontend attached. (A member being rebuilt does not
/// refuse it: the point-in-time set leaves it out and it is rebuilt from
/// the reverted ones; a member without the snapshot likewise.)
fn revert_ask<'a>(job: &'a Job, target: &'a str) -> RevertAsk<'a> {
    RevertAsk {
        what: "volume",
        id: &job.id,
        snapshot: target.rsplit('@').next().unwrap_or(target),
        frontend: job.attached,
        rebuilding: None,
        holders: Vec::new(),
    }
}

/// The frontend an attachment names, in its config words.
fn frontend_word(f: FrontendKind) -> &'static str {
    match f {
        FrontendKind::Auto => "auto",
        FrontendKind::NvmeTcp => "nvme-tcp",
        FrontendKind::Iscsi => "iscsi",
    }
}

fn err_text(e: &VolumeError) -> String {
    crate::util::error_chain(e)
}

fn engine_status(state: ObjectState, message: impl Into<String>) -> EngineStatus {
    EngineStatus {
        engine: Engine::V2,
        state,
        size_bytes: 0,
        device: String::new(),
        replicas: Vec::new(),
        exports: Vec::new(),
        message: message.into(),
        restored_backup: None,
        copy: None,
    }
}

fn snap_status(
    volume: &str,
    state: ObjectState,
    objects: Vec<String>,
    message: impl Into<String>,
) -> SnapshotStatus {
    SnapshotStatus {
        volume: volume.to_owned(),
        engine: Engine::V2,
        state,
        objects,
        created: String::new(),
        message: message.into(),
    }
}

struct Job {
    id: String,
    spec: Volume,
    placed: BTreeMap<usize, String>,
    /// Configured disks not ready, and why (the same for every job).
    disk_away: BTreeMap<String, DiskAway>,
    /// From the volume's ledger.
    in_sync: Option<BTreeSet<usize>>,
    /// From the volume's ledger: where its up-to-date replicas' lvols were.
    noted: LvolNotes,
    /// The point-in-time set of the snapshot a revert or clone starts from
    /// (from the ledger of the snapshot's volume).
    snapshot_set: Option<BTreeSet<usize>>,
    /// Who may connect ([`export_hosts`]).
    hosts: Vec<String>,
    /// `NodeConfig.replicaTlsPort`.
    tls_port: u16,
    /// `NodeConfig.rebuildMibPerSec`.
    rebuild_cap: Option<u64>,
    /// `NodeConfig.overcommitPercent`.
    overcommit_percent: u32,
    /// A served replica: its engine's request not answered yet.
    dest_request: Option<RebuildDest>,
    /// The frontend the volume is attached with on this node (`None`: detached).
    attached: Option<&'static str>,
    /// A copy of a snapshot (`copyFrom`): whether the source volume's
    /// replicas hold a raid superblock (`None`: the source volume is not
    /// known here).
    copy_source_superblock: Option<bool>,
}

/// What realizing one volume gave.
struct Realized {
    status: EngineStatus,
    replicas: Vec<(String, ReplicaStatus)>,
    /// The replicas now up to date, when the engine stands (for the ledger).
    in_sync: Option<BTreeSet<usize>>,
    /// Where each replica lives (placed or waited for).
    disks: BTreeMap<usize, String>,
    /// Where the up-to-date replicas' lvols are (for the ledger).
    notes: LvolNotes,
    /// Look again soon: a rebuild, a copy or a restore runs (poll for its
    /// progress), or a served replica made now is exported by the next pass.
    soon: bool,
    /// The answer to the job's `dest_request`.
    dest_answer: Option<RebuildDestStatus>,
}

impl Realized {
    fn failed(state: ObjectState, message: impl Into<String>) -> Self {
        Self {
            status: engine_status(state, message),
            replicas: Vec::new(),
            in_sync: None,
            disks: BTreeMap::new(),
            notes: LvolNotes::default(),
            soon: false,
            dest_answer: None,
        }
    }
}

impl SpdkVolumeController {
    /// Sets up one volume (or served replica): a revert or a rebuild
    /// request first, then a restore's file, then the volume itself.
    async fn realize(&self, inv: &Inventory, job: &Job, export: &ExportSpec) -> Realized {
        let export = &job_export(export, job);
        let name = match ObjectName::parse("volume", &job.id) {
            Ok(n) => n,
            Err(e) => return Realized::failed(ObjectState::Failed, e.to_string()),
        };
        let from_snapshot = match job
            .spec
            .from_snapshot
            .as_deref()
            .map(split_snapshot_id)
            .transpose()
        {
            Ok(f) => f,
            Err(m) => return Realized::failed(ObjectState::Failed, m),
        };
        let mut message = String::new();
        let mut in_sync = job.in_sync.clone();
        // revert: once per generation, recorded in SPDK with the data; the
        // status says so from then on (not only in the reconcile that did
        // it, which the next one may follow at once: a watcher missed it)
        let mut reloaded = None;
        if let Some(target) = &job.spec.revert_to {
            message = format!("reverted to {target} (generation {})", job.spec.revert_generation);
            if job.spec.revert_generation > applied_revert(inv, &job.id) {
                // the shared refusals (`RevertAsk`): the API refuses an
                // attached volume, and this refuses one attached after the
                // request (the revert waits, nothing touched, the volume
                // served as it is)
                match revert_ask(job, target).check(inv) {
                    Err(refused) => {
                        message = format!(
                            "revert to {target} (generation {}) waits: {refused}",
                            job.spec.revert_generation
                        );
                    }
                    Ok(()) => match self.revert(inv, job, &name, target).await {
                        Ok((reverted, i)) => {
                            in_sync = Some(reverted);
                            reloaded = Some(i);
                        }
                        Err(r) => return r,
                    },
                }
            }
        }
        // a served replica: its engine's request for the next copy of a
        // thin rebuild, answered before the replica is exported (again)
        let mut dest_answer = None;
        if let (Some(k), Some(req)) = (job.spec.serve_replica, &job.dest_request) {
            match self.answer_dest(inv, job, &name, export, k as usize, req).await {
                Ok((answer, reset)) => {
                    if reset.is_some() {
                        reloaded = reset;
                    }
                    dest_answer = Some(answer);
                }
                Err(r) => return r,
            }
        }
        let inv = reloaded.as_ref().unwrap_or(inv);
        let remote = match remote_addresses(&job.spec) {
            Ok(r) => r,
            Err(m) => return Realized::failed(ObjectState::Failed, m),
        };
        // the raid's superblock, or (a served replica) room for the engine's
        let superblock = job.spec.uses_superblock();
        // a new volume from a backup (or a standby): what its lvols hold is
        // judged once every disk they may be on has all its lvols open
        let not_served = job.spec.from_backup.is_some() && job.in_sync.is_none();
        let step = match not_served
            .then(|| restore_waits_for(&job.spec, &job.disk_away))
            .flatten()
        {
            Some(why) => RestoreStep::Waiting(why),
            None => {
                self.restores
                    .step(
                        &self.ops,
                        inv,
                        &job.id,
                        &job.spec,
                        job.in_sync.is_some(),
                        superblock,
                    )
                    .await
            }
        };
        let restore = match restore_file(step, &job.spec) {
            Ok(f) => f,
            Err(r) => return *r,
        };
        let restoring = restore.is_some();
        let plan = VolumePlan {
            name: name.clone(),
            size_bytes: job.spec.size_bytes,
            replicas: job.spec.replicas.max(1) as usize,
            disks: job.spec.disks.clone(),
            placed: job.placed.clone(),
            disk_away: job.disk_away.clone(),
            from_snapshot,
            snapshot_set: job.snapshot_set.clone(),
            export: export.clone(),
            restore,
            in_sync,
            remote,
            noted: job.noted.clone(),
            superblock,
            rebuild_mib_per_sec: job.rebuild_cap,
            overcommit_percent: job.overcommit_percent,
            remote_dests: job
                .spec
                .remote_replicas
                .iter()
                .map(|r| {
                    let api = r.api.clone()?;
                    let d: Arc<dyn RemoteDest> =
                        Arc::new(PeerDest::new(self.peers.clone(), api, job.id.clone()));
                    Some(d)
                })
                .collect(),
        };
        // a new volume with a copy of a snapshot: its replica 0 copied first
        let copied = match self.copy_step(inv, job, &plan).await {
            Ok(c) => c,
            Err(r) => return *r,
        };
        let done = match job.spec.serve_replica {
            Some(k) => self.ops.ensure_served(inv, &plan, k as usize).await,
            None => self.ops.ensure(inv, &plan).await,
        };
        let mut realized = match done {
            Ok(info) => self.served(job, &name, info, export, restoring, message).await,
            Err(e) => not_realized(e, job),
        };
        realized.status.copy = copied;
        realized.dest_answer = dest_answer;
        realized
    }

    /// The copy of a snapshot that `job`'s volume is made with: its progress
    /// once copied (`None`: no copy asked), or, while it is not copied, what
    /// realizing gives: a wait (polled) or a failure (polled: tried again).
    async fn copy_step(
        &self,
        inv: &Inventory,
        job: &Job,
        plan: &VolumePlan,
    ) -> Result<Option<CopyProgress>, Box<Realized>> {
        let Some(id) = job.spec.copy_from.as_deref() else {
            return Ok(None);
        };
        let src = match job.copy_source_superblock {
            Some(sb) => super::snapshot_copy::source(inv, id, job.snapshot_set.as_ref(), sb),
            None => Err(format!("snapshot {id}: its volume is not served here")),
        };
        let step = if job.in_sync.is_some() {
            self.copies.served(&job.id, &job.spec)
        } else {
            self.copies
                .step(self.ops.client(), inv, &job.id, &job.spec, src, plan)
                .await
        };
        let (state, message, progress) = match step {
            CopyStep::None => return Ok(None),
            CopyStep::Copied(p) => return Ok(Some(p)),
            CopyStep::Waiting(m, p) => (ObjectState::Creating, m, p),
            CopyStep::Failed(m, p) => (ObjectState::Failed, m, p),
        };
        let mut r = Realized::failed(state, message);
        r.status.copy = Some(progress);
        // polled: its progress, or the next try
        r.soon = true;
        Err(Box::new(r))
    }

    /// Reverts `job`'s volume `name` to snapshot `target`: the replicas in
    /// sync after it, and the target listed again.
    async fn revert(
        &self,
        inv: &Inventory,
        job: &Job,
        name: &ObjectName,
        target: &str,
    ) -> Result<(BTreeSet<usize>, Inventory), Realized> {
        let failed = |m: String| Realized::failed(ObjectState::Failed, m);
        let snap = ObjectName::parse("snapshot", target.rsplit('@').next().unwrap_or(target))
            .map_err(|e| failed(e.to_string()))?;
        // the raid's superblock, or (a served replica) room for the engine's
        let slots = job.spec.raid_slots();
        let superblock = job.spec.uses_superblock();
        let reverted = self
            .ops
            .revert(
                inv,
                name,
                &snap,
                job.spec.revert_generation,
                job.snapshot_set.as_ref(),
                superblock.then_some(slots),
            )
            .await
            .map_err(|e| failed(err_text(&e)))?;
        let reloaded = Inventory::load(self.ops.client())
            .await
            .map_err(|e| failed(e.to_string()))?;
        Ok((reverted, reloaded))
    }

    /// Answers `req`, an engine's request for the next copy of a thin
    /// rebuild into served replica `k` (an error is the answer's message);
    /// with the target listed again (its disks as in `inv`) when the replica
    /// was reset.
    async fn answer_dest(
        &self,
        inv: &Inventory,
        job: &Job,
        name: &ObjectName,
        export: &ExportSpec,
        k: usize,
        req: &RebuildDest,
    ) -> Result<(RebuildDestStatus, Option<Inventory>), Realized> {
        let plan = VolumePlan::new(name.clone(), job.spec.size_bytes, 1, export.clone());
        let answer = match self.ops.prepare_dest(inv, &plan, k, &req.chain).await {
            Ok(a) => a,
            Err(e) => RebuildDestStatus {
                message: err_text(&e),
                ..RebuildDestStatus::default()
            },
        };
        let mut reloaded = None;
        if answer.reset {
            match Inventory::load(self.ops.client()).await {
                Ok(mut i) => {
                    let disks: BTreeSet<String> = inv.disks().into_iter().map(|(d, _)| d).collect();
                    i.retain_disks(&disks);
                    reloaded = Some(i);
                }
                Err(e) => return Err(Realized::failed(ObjectState::Failed, e.to_string())),
            }
        }
        let answer = RebuildDestStatus {
            generation: req.generation,
            ..answer
        };
        Ok((answer, reloaded))
    }

    /// What realizing `job` gave once the target serves it as `info`.
    async fn served(
        &self,
        job: &Job,
        name: &ObjectName,
        info: VolumeInfo,
        export: &ExportSpec,
        restoring: bool,
        mut message: String,
    ) -> Realized {
        if job.spec.serve_replica.is_none() {
            // a snapshot's freeze left by a talon stopped before its thaw
            let nqn = crate::names::Nqn::for_volume(name);
            // logged there; checked again on the next reconcile
            let _ = self
                .thaw_checked
                .check(&self.ops, nqn.as_str(), crate::spdk::rpc::AnaState::Optimized)
                .await;
        }
        if restoring {
            self.restores.finish(&job.id);
            message = format!(
                "restored from backup {}",
                job.spec.from_backup.as_ref().map_or("", |b| b.backup.as_str())
            );
        }
        // a served replica's engine (and ledger) is on another node
        let in_sync = job.spec.serve_replica.is_none().then(|| info.in_sync.clone());
        let notes = info.notes.clone();
        let soon = info.rebuilding.is_some() || info.export_next;
        let disks = info
            .replicas
            .iter()
            .map(|r| (r.k, r.disk.clone()))
            .chain(info.waiting.iter().cloned())
            .collect();
        let (status, replicas) = status_of(&job.id, &job.spec, info, export, message);
        Realized {
            status,
            replicas,
            in_sync,
            disks,
            notes,
            soon,
            dest_answer: None,
        }
    }

    /// Takes snapshot `snap` (resource `s`) of live volume `vol` on its
    /// replicas in sync (`in_sync`; `None`: all) and on its remote replicas
    /// (`remotes`, each on its node): every remote node is reached first, and
    /// one that cannot be fails the snapshot without freezing the export; a
    /// failure undoes what was taken. Gives the snapshot's status and, when
    /// taken, the replicas it was taken at one instant on.
    async fn take_snapshot(
        &self,
        inv: &Inventory,
        s: &Typed<Snapshot>,
        vol: &ObjectName,
        snap: &ObjectName,
        in_sync: Option<BTreeSet<usize>>,
        remotes: Vec<(usize, String)>,
    ) -> (SnapshotStatus, Option<BTreeSet<usize>>) {
        let mut clients = Vec::new();
        let mut unreachable = None;
        for (k, api) in &remotes {
            if in_sync.as_ref().is_some_and(|s| !s.contains(k)) {
                continue;
            }
            match self.peers.connect(api).await {
                Ok(c) => clients.push((*k, api.as_str(), c)),
                Err(e) => {
                    unreachable = Some(VolumeError::PeerSnapshot {
                        snapshot: s.id().to_string(),
                        replica: format!("r{k}"),
                        message: e.to_string(),
                    });
                    break;
                }
            }
        }
        let r = match unreachable {
            Some(e) => Err(e),
            None => {
                let remote: Vec<RemoteSnapshot<'_>> = clients
                    .iter()
                    .map(|(k, api, c)| {
                        let f: futures::future::BoxFuture<'_, Result<(), PeerError>> =
                            Box::pin(self.peers.snapshot(c, api, vol.as_str(), snap.as_str()));
                        (*k, f)
                    })
                    .collect();
                let r = self.ops.snapshot(inv, vol, snap, in_sync.as_ref(), remote).await;
                if r.is_err() {
                    // the local ones were undone; so go the remote
                    // ones, before a retry can take them again
                    for (k, api, _) in &clients {
                        if let Err(e) = self.peers.delete_snapshot(api, vol.as_str(), snap.as_str()).await {
                            tracing::warn!(snapshot = %s.id(), replica = k, error = %e,
                                "could not delete a remote replica's snapshot after a failed snapshot");
                        }
                    }
                }
                r
            }
        };
        match r {
            Ok(taken) => {
                let set = (!taken.point_in_time.is_empty()).then_some(taken.point_in_time);
                (
                    snap_status(&s.spec.volume, ObjectState::Ready, taken.lvols, ""),
                    set,
                )
            }
            Err(e) => {
                // a thaw may have failed: look again at the next reconcile
                self.thaw_checked
                    .forget(crate::names::Nqn::for_volume(vol).as_str());
                (
                    snap_status(&s.spec.volume, ObjectState::Failed, vec![], err_text(&e)),
                    None,
                )
            }
        }
    }

    /// Removes the talon-named SPDK objects no desired resource accounts for
    /// (any engine's volume counts); whether any was.
    async fn remove_orphans(
        &self,
        inv: &Inventory,
        all_volumes: &[Typed<Volume>],
        live_vols: &BTreeSet<String>,
        known_snaps: &BTreeSet<String>,
    ) -> bool {
        let orphans = inv.orphans(
            |v| live_vols.contains(v) || all_volumes.iter().any(|x| x.id() == v),
            |v, s| known_snaps.contains(&format!("{v}@{s}")),
            |v, k| keeps_remote(all_volumes, v, k),
        );
        if orphans.is_empty() {
            return false;
        }
        let (removed, errors) = self.ops.remove_orphans(orphans).await;
        for r in &removed {
            tracing::info!(object = ?r, "removed orphaned SPDK object");
        }
        for e in errors {
            tracing::warn!("{e}");
        }
        true
    }

    /// Deletes snapshot `s` on this node's replicas, then on the remote
    /// replicas of its volume (each on its node); the first failure stops it.
    async fn delete_snapshot_everywhere(
        &self,
        inv: &Inventory,
        s: &Typed<Snapshot>,
        all_volumes: &[Typed<Volume>],
    ) -> Result<(), String> {
        self.ops
            .delete_snapshot(inv, &s.spec.volume, &s.spec.name)
            .await
            .map_err(|e| err_text(&e))?;
        if let Some(v) = all_volumes.iter().find(|v| v.id() == s.spec.volume) {
            for (_, api) in Self::callable_remotes(&v.spec) {
                self.peers
                    .delete_snapshot(&api, &s.spec.volume, &s.spec.name)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn status_of(
    id: &str,
    spec: &Volume,
    info: VolumeInfo,
    export: &ExportSpec,
    mut message: String,
) -> (EngineStatus, Vec<(String, ReplicaStatus)>) {
    // a served replica whose lvol this pass made: its status names the lvol
    // before the next pass exports it
    let made_now = info.export_next;
    let degraded = !made_now && info.in_sync.len() < info.wanted;
    if made_now {
        message = "replica made; exported from the next pass, once this status names its lvol".into();
    } else if degraded {
        let mut parts = Vec::new();
        if let Some((k, pct)) = info.rebuilding {
            parts.push(format!("rebuilding r{k} ({pct}%)"));
        }
        if !info.stale.is_empty() {
            let s: Vec<String> = info.stale.iter().map(|k| format!("r{k}")).collect();
            parts.push(format!("{} behind, rebuilt next", s.join(", ")));
        }
        if let Some(b) = &info.unplaced {
            parts.push(b.reason.clone());
        }
        if !info.waiting.is_empty() {
            let w: Vec<String> = info
                .waiting
                .iter()
                .map(|(k, d)| format!("r{k} on disk {d}"))
                .collect();
            parts.push(format!("waiting for {}", w.join(", ")));
        }
        message = format!(
            "{} of {} replicas up to date; {}",
            info.in_sync.len(),
            info.wanted,
            parts.join("; ")
        );
    } else if info.size_bytes > spec.size_bytes.div_ceil(1 << 20) * (1 << 20) && message.is_empty() {
        message = format!(
            "volumes do not shrink: serving {}",
            crate::util::size::Bytes(info.size_bytes)
        );
    }
    let replicas = info
        .replicas
        .iter()
        .map(|r| {
            (
                r.name.clone(),
                ReplicaStatus {
                    volume: id.to_owned(),
                    disk: r.disk.clone(),
                    bdev: r.bdev.clone(),
                    alias: r.alias.clone(),
                    size_bytes: r.size_bytes,
                    allocated_bytes: r.allocated_bytes,
                    state: if made_now {
                        ObjectState::Creating
                    } else if info.in_sync.contains(&r.k) {
                        ObjectState::Ready
                    } else if info.rebuilding.is_some_and(|(k, _)| k == r.k) {
                        ObjectState::Rebuilding
                    } else {
                        ObjectState::Stale
                    },
                    message: match info.rebuilding {
                        _ if made_now => "made; exported from the next pass".into(),
                        Some((k, pct)) if k == r.k => format!("{pct}% rebuilt"),
                        _ if !info.in_sync.contains(&r.k) => {
                            "missed writes; rebuilt when its turn comes".into()
                        }
                        _ => String::new(),
                    },
                },
            )
        })
        .chain(info.waiting.iter().map(|(k, d)| {
            (
                crate::spdk::volume::naming::replica(id, *k),
                ReplicaStatus {
                    volume: id.to_owned(),
                    disk: d.clone(),
                    bdev: String::new(),
                    alias: String::new(),
                    size_bytes: 0,
                    allocated_bytes: 0,
                    state: ObjectState::Stale,
                    message: format!("disk {d} is away; rebuilt when it is back"),
                },
            )
        }))
        .collect();
    let status = EngineStatus {
        engine: Engine::V2,
        state: if made_now {
            ObjectState::Creating
        } else if degraded {
            ObjectState::Degraded
        } else {
            ObjectState::Ready
        },
        size_bytes: info.size_bytes,
        device: info.device,
        replicas: info.replicas.iter().map(|r| r.name.clone()).collect(),
        exports: vec![Export {
            transport: "nvme-tcp".into(),
            address: export.address.to_string(),
            port: export.port,
            name: info.nqn,
            lun: crate::spdk::volume::NSID,
            hosts: export.hosts.clone(),
        }],
        message,
        restored_backup: None,
        copy: None,
    };
    (status, replicas)
}

/// The export of `job`: its hosts, and for a served replica with TLS, the
/// TLS port (and only there).
fn job_export(export: &ExportSpec, job: &Job) -> ExportSpec {
    // a served replica with TLS listens on the TLS port (and only there)
    let port = match (&export.tls_data_dir, job.spec.serve_replica) {
        (Some(_), Some(_)) => job.tls_port,
        _ => export.port,
    };
    ExportSpec {
        hosts: job.hosts.clone(),
        port,
        ..export.clone()
    }
}

/// The address and port of each of `spec`'s remote replicas; why not when
/// one is not an IP address.
fn remote_addresses(spec: &Volume) -> Result<Vec<(IpAddr, u16)>, String> {
    let mut remote = Vec::new();
    for r in &spec.remote_replicas {
        match r.address.parse::<IpAddr>() {
            Ok(a) => remote.push((a, r.port)),
            Err(_) => {
                return Err(format!(
                    "remote replica address {:?} is not an IP address",
                    r.address
                ));
            }
        }
    }
    Ok(remote)
}

/// The file to make the replicas from (`None`: no restore), or, while a
/// backup is not restored, what realizing gives: a wait (polled), a
/// failure, or a standby volume, which is not served: it holds a backup
/// until activated.
/// Why a restore into `spec` (not served yet) waits: a disk its lvols may
/// be on is coming up. Until its examine ends SPDK lists its lvstore before
/// all its lvols are opened, so a replica or standby lvol missing from the
/// listing may only not be opened yet; judged then, a standby's lvols would
/// be made anew (its backup fetched again) and a restored replica restored
/// twice.
fn restore_waits_for(spec: &Volume, away: &BTreeMap<String, DiskAway>) -> Option<String> {
    away.iter()
        .filter(|(d, _)| spec.disks.is_empty() || spec.disks.contains(d))
        .find_map(|(d, a)| match a {
            DiskAway::Pending(why) => Some(format!(
                "waiting for disk {d} ({why}): a restore looks for its lvols once every disk's are open"
            )),
            DiskAway::Removing(_) | DiskAway::Failed(_) => None,
        })
}

fn restore_file(step: RestoreStep, spec: &Volume) -> Result<Option<RestoreFile>, Box<Realized>> {
    match step {
        RestoreStep::None => Ok(None),
        RestoreStep::Ready(f) => Ok(Some(f)),
        RestoreStep::Failed(m) => Err(Box::new(Realized::failed(ObjectState::Failed, m))),
        RestoreStep::Waiting(m) => {
            let mut r = Realized::failed(ObjectState::Creating, m);
            r.soon = true;
            Err(Box::new(r))
        }
        // a standby volume is not served: it holds a backup until activated
        RestoreStep::Standby {
            message,
            backup,
            busy,
        } => {
            let mut r = Realized::failed(ObjectState::Standby, message);
            r.status.size_bytes = spec.size_bytes;
            r.status.restored_backup = backup;
            r.soon = busy;
            Err(Box::new(r))
        }
    }
}

/// What realizing `job` gave when the target could not serve it (`e`).
fn not_realized(e: VolumeError, job: &Job) -> Realized {
    match e {
        // No valid placement: a wait while the disks it needs come up (DiskStatus
        // is an input, so this runs again when one does); failed, with the
        // disk's error, when one of them failed, so a wait ends at once. It is
        // placed as soon as a disk is ready.
        e @ VolumeError::NoPlacement { disk_failed, .. } => Realized::failed(
            if disk_failed {
                ObjectState::Failed
            } else {
                ObjectState::Creating
            },
            format!("waiting for disks: {}", err_text(&e)),
        ),
        // waiting for replicas on disks that failed: say why they are away
        e @ (VolumeError::NoCurrentReplica { .. } | VolumeError::RaidAssembling { .. }) => {
            let mut m = err_text(&e);
            let failed: BTreeSet<&String> = job.placed.values().collect();
            for d in failed {
                if let Some(DiskAway::Failed(why)) = job.disk_away.get(d) {
                    m.push_str(&format!("; disk {d} failed: {why}"));
                }
            }
            Realized::failed(ObjectState::Failed, m)
        }
        e => Realized::failed(ObjectState::Failed, err_text(&e)),
    }
}

#[async_trait::async_trait]
impl Controller for SpdkVolumeController {
    fn name(&self) -> &'static str {
        "engine.SpdkVolumeController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::of::<NodeConfig>(),
            Input::of::<Volume>(),
            Input::of::<Snapshot>(),
            Input::of::<Disk>(),
            Input::of::<DiskStatus>(),
            Input::of::<TargetStatus>(),
            Input::of::<Attachment>(),
            // a bdev went away (a raid member): look now, not at the next poll
            Input::of::<SpdkEvents>(),
            // an engine node's request for a replica served here
            Input::of::<RebuildDest>(),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::shared::<EngineStatus>(),
            Output::shared::<SnapshotStatus>(),
            Output::exclusive::<ReplicaStatus>(),
            Output::exclusive::<ReplicaLedger>(),
            Output::exclusive::<RebuildDestStatus>(),
        ]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let mut want = self.load_desired(ctx)?;
        let target = ctx.get::<TargetStatus>(SPDK_STATUS_ID)?;
        if !target_ready(target.as_ref().map(|t| &t.spec)) {
            return Self::wait_for_target(ctx, &want);
        }
        let export = match export_spec(&want.node, self.data_dir.as_ref()) {
            Ok(e) => e,
            Err(msg) => {
                for v in &want.volumes {
                    ctx.apply(v.id(), engine_status(ObjectState::Failed, msg.clone()))?;
                }
                return Ok(Requeue::OnInputChange);
            }
        };
        let mut here = self.load_target(ctx, &want).await?;
        let jobs = make_jobs(&want, &here, self.host_nqn.as_deref());
        for j in &jobs.live {
            ctx.add_finalizer::<Volume>(&j.id)?;
        }
        self.ensure_transport(&jobs.live, &mut here.inv).await?;
        let (plain, derived) = split_derived(jobs.live);
        // the replicas served to other nodes first, all of them: their engines
        // give an export up after their ctrlr_loss_timeout (a target restart
        // took every export away), and the volumes here may wait on other nodes
        let (served, volumes) = served_first(plain);
        let mut statuses = self.realize_all(served, &here.inv, &export).await;
        statuses.extend(self.realize_all(volumes, &here.inv, &export).await);
        // a remote replica grows on its node when the volume grows
        for v in want
            .volumes
            .iter()
            .filter(|v| v.metadata.phase != Phase::TearingDown)
        {
            self.grow_remotes(v).await;
        }
        let snaps = self.snapshots(ctx, &want, &mut here, &statuses).await?;
        // clones and reverts need the snapshots
        if !derived.is_empty() {
            here.inv = Inventory::load(self.ops.client()).await?;
            statuses.extend(self.realize_all(derived, &here.inv, &export).await);
        }
        let SnapshotPass {
            out,
            mut sets,
            deleting: snap_deleting,
        } = snaps;
        persist_ledgers(ctx, &mut want.ledgers, &statuses, &mut sets)?;
        for (id, st) in out {
            ctx.apply(&id, st)?;
        }
        let soon = apply_statuses(ctx, statuses)?;
        self.delete(ctx, &mut want, &mut here.inv, &jobs.deleting, &snap_deleting)
            .await?;
        // replica statuses of volumes that are not live are not re-applied: the runtime drops them
        Ok(Requeue::After(requeue_after(soon, &want.volumes)))
    }
}

/// What one reconcile reads of the desired state, once, before it looks at
/// the target.
struct Desired {
    /// This node's config (`node`).
    node: NodeConfig,
    /// Every volume, of either engine: SPDK objects and ledgers of any of
    /// them are kept.
    all_volumes: Vec<Typed<Volume>>,
    /// The volumes this controller serves ([`served_volumes`]).
    volumes: Vec<Typed<Volume>>,
    /// Their snapshots ([`served_snapshots`]).
    snapshots: Vec<Typed<Snapshot>>,
    /// The ledgers of existing volumes, by volume; kept up to date as the
    /// phases record.
    ledgers: BTreeMap<String, ReplicaLedger>,
}

/// What one reconcile reads of this node and its target once the target is
/// up: the one inventory the phases share (listed again only after a phase
/// changed the target), and the inputs the jobs are made from.
struct Loaded {
    /// The target's objects, on configured disks only.
    inv: Inventory,
    /// Volumes (of either engine) not being deleted.
    live_vols: BTreeSet<String>,
    /// Volumes attached on this node, and with which frontend.
    attached: BTreeMap<String, &'static str>,
    /// The replica statuses reported before this reconcile.
    previous_replicas: Vec<Typed<ReplicaStatus>>,
    /// Configured disks that take no new replica ([`disks_away`]).
    disk_away: BTreeMap<String, DiskAway>,
    /// Engine nodes' requests for replicas served here, by volume.
    dest_requests: BTreeMap<String, RebuildDest>,
    /// The answers to them so far, by live volume.
    answers: BTreeMap<String, RebuildDestStatus>,
}

/// The volumes to set up, in the volumes' order, and those being deleted.
#[derive(Default)]
struct Jobs {
    live: Vec<Job>,
    deleting: Vec<String>,
}

/// What the snapshot phase leaves to the later ones.
#[derive(Default)]
struct SnapshotPass {
    /// Statuses, applied once the ledgers are persisted.
    out: Vec<(String, SnapshotStatus)>,
    /// (volume, snapshot, point-in-time set; None: the snapshot is gone)
    sets: Vec<(String, String, Option<BTreeSet<usize>>)>,
    /// Snapshots being deleted, deleted after the volumes.
    deleting: Vec<Typed<Snapshot>>,
}

/// The phases of [`SpdkVolumeController::reconcile`], in the order it runs them.
impl SpdkVolumeController {
    /// Reads the desired state: the node's config, the volumes served here,
    /// their snapshots, and the ledgers (applied again: they are outputs).
    /// Restores of volumes not live any more stop.
    fn load_desired(&self, ctx: &mut ReconcileContext) -> Result<Desired, ControllerError> {
        let node = ctx.get::<NodeConfig>("node")?.map(|n| n.spec).unwrap_or_default();
        let all_volumes = ctx.list::<Volume>()?;
        let volumes = served_volumes(&all_volumes, &node, self.claims_auto, self.name());
        // a restore of a volume that is being deleted (or gone) stops, its file goes
        self.restores.retain(&live_ids(&volumes));
        self.copies.retain(&live_ids(&volumes));
        let snapshots = served_snapshots(ctx.list::<Snapshot>()?, &volumes, self.name());
        // the ledgers outlive every reconcile until their volume is gone
        let mut ledgers: BTreeMap<String, ReplicaLedger> = BTreeMap::new();
        for l in ctx.list::<ReplicaLedger>()? {
            if all_volumes.iter().any(|v| v.id() == l.id()) {
                ctx.apply(l.id(), l.spec.clone())?;
                ledgers.insert(l.id().to_string(), l.spec);
            }
        }
        Ok(Desired {
            node,
            all_volumes,
            volumes,
            snapshots,
            ledgers,
        })
    }

    /// spdk_tgt is not up (or not V2): the volumes wait for it, and what was
    /// reported of replicas and snapshots stays.
    fn wait_for_target(ctx: &mut ReconcileContext, want: &Desired) -> Result<Requeue, ControllerError> {
        for v in want
            .volumes
            .iter()
            .filter(|v| v.metadata.phase != Phase::TearingDown)
        {
            ctx.apply(
                v.id(),
                engine_status(ObjectState::Creating, "waiting for spdk_tgt"),
            )?;
        }
        // keep what we reported about replicas and snapshots until the target is back
        for r in ctx.list::<ReplicaStatus>()? {
            let id = r.id().to_string();
            ctx.apply(&id, r.spec)?;
        }
        for s in &want.snapshots {
            if let Some(cur) = ctx.get::<SnapshotStatus>(s.id())? {
                ctx.apply(s.id(), cur.spec)?;
            }
        }
        Ok(Requeue::After(Duration::from_secs(2)))
    }

    /// Reads this node's inputs and the target's inventory, removes the
    /// orphans (and lists the target again if there were any), and keeps
    /// the answers to rebuild requests of live volumes.
    async fn load_target(
        &self,
        ctx: &mut ReconcileContext,
        want: &Desired,
    ) -> Result<Loaded, ControllerError> {
        let attached: BTreeMap<String, &'static str> = ctx
            .list::<Attachment>()?
            .into_iter()
            .map(|a| (a.id().to_string(), frontend_word(a.spec.frontend)))
            .collect();
        let disk_list = ctx.list::<Disk>()?;
        let disks: BTreeSet<String> = disk_list.iter().map(|d| d.id().to_string()).collect();
        let previous_replicas: Vec<_> = ctx.list::<ReplicaStatus>()?;

        let mut inv = Inventory::load(self.ops.client()).await?;
        // only lvstores of configured disks are usable
        inv.retain_disks(&disks);

        let live_vols = live_ids(&want.all_volumes);
        let known_snaps: BTreeSet<String> = ctx
            .list::<Snapshot>()?
            .iter()
            .map(|s| s.id().to_string())
            .collect();
        if self
            .remove_orphans(&inv, &want.all_volumes, &live_vols, &known_snaps)
            .await
        {
            inv = Inventory::load(self.ops.client()).await?;
            inv.retain_disks(&disks);
        }

        let target = ctx.get::<TargetStatus>(SPDK_STATUS_ID)?.map(|t| t.spec);
        let disk_away = disks_away(&disk_list, &ctx.list::<DiskStatus>()?, target.as_ref(), &inv);

        // engine nodes' requests for replicas served here, and the answers so far
        let dest_requests: BTreeMap<String, RebuildDest> = ctx
            .list::<RebuildDest>()?
            .into_iter()
            .map(|r| (r.id().to_string(), r.spec))
            .collect();
        let mut answers: BTreeMap<String, RebuildDestStatus> = BTreeMap::new();
        for a in ctx.list::<RebuildDestStatus>()? {
            if live_vols.contains(a.id()) {
                ctx.apply(a.id(), a.spec.clone())?;
                answers.insert(a.id().to_string(), a.spec);
            }
        }
        Ok(Loaded {
            inv,
            live_vols,
            attached,
            previous_replicas,
            disk_away,
            dest_requests,
            answers,
        })
    }

    /// One TCP transport per target, made (or adopted) before the volumes
    /// are set up concurrently.
    async fn ensure_transport(&self, jobs: &[Job], inv: &mut Inventory) -> Result<(), ControllerError> {
        if !jobs.is_empty() && !inv.tcp_transport {
            if self.ops.ensure_transport().await? {
                tracing::info!("NVMe/TCP transport created");
            }
            inv.tcp_transport = true;
        }
        Ok(())
    }

    /// Sets `jobs` up on `inv`, [`CONCURRENCY`] at a time.
    async fn realize_all(
        &self,
        jobs: Vec<Job>,
        inv: &Inventory,
        export: &ExportSpec,
    ) -> Vec<(String, Realized)> {
        futures::stream::iter(jobs)
            .map(|j| async move {
                let r = self.realize(inv, &j, export).await;
                (j.id, r)
            })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await
    }

    /// The snapshots of live volumes, on a fresh inventory: each taken once
    /// (on the replicas in sync per `statuses`, else per the ledger) and
    /// reported; those being deleted are set aside for the deletions.
    async fn snapshots(
        &self,
        ctx: &mut ReconcileContext,
        want: &Desired,
        here: &mut Loaded,
        statuses: &[(String, Realized)],
    ) -> Result<SnapshotPass, ControllerError> {
        let mut pass = SnapshotPass::default();
        if !want.snapshots.is_empty() {
            here.inv = Inventory::load(self.ops.client()).await?;
        }
        let inv = &here.inv;
        for s in &want.snapshots {
            if s.metadata.phase == Phase::TearingDown {
                pass.deleting.push(s.clone());
                continue;
            }
            ctx.add_finalizer::<Snapshot>(s.id())?;
            let (vol, snap) = match (
                ObjectName::parse("volume", &s.spec.volume),
                ObjectName::parse("snapshot", &s.spec.name),
            ) {
                (Ok(v), Ok(n)) => (v, n),
                (Err(e), _) | (_, Err(e)) => {
                    pass.out.push((
                        s.id().to_string(),
                        snap_status(&s.spec.volume, ObjectState::Failed, vec![], e.to_string()),
                    ));
                    continue;
                }
            };
            // taken already: the snapshot lvols of the replicas that have a head
            let heads: BTreeSet<usize> = replica_heads(inv, vol.as_str()).iter().map(|(k, _)| *k).collect();
            let taken = inv.snapshot_lvols(vol.as_str(), snap.as_str());
            let st = if !here.live_vols.contains(vol.as_str()) {
                gone_volume_snapshot(&s.spec.volume, taken)
            } else {
                let prev = ctx.get::<SnapshotStatus>(s.id())?.map(|p| p.spec);
                match still_taken(&s.spec.volume, prev.as_ref(), on_heads(&taken, &heads)) {
                    Some(st) => st,
                    None => {
                        let in_sync = snapshot_in_sync(statuses, &want.ledgers, vol.as_str());
                        let remotes = want
                            .volumes
                            .iter()
                            .find(|x| x.id() == vol.as_str())
                            .map(|x| Self::callable_remotes(&x.spec))
                            .unwrap_or_default();
                        let (st, set) = self.take_snapshot(inv, s, &vol, &snap, in_sync, remotes).await;
                        if let Some(set) = set {
                            pass.sets.push((vol.to_string(), snap.to_string(), Some(set)));
                        }
                        st
                    }
                }
            };
            let mut st = st;
            st.created = created(ctx.get::<SnapshotStatus>(s.id())?.map(|p| p.spec.created));
            pass.out.push((s.id().to_string(), st));
        }
        Ok(pass)
    }

    /// Deletions: volumes first (their heads may be clones of snapshots),
    /// then snapshots (here, then on their remote replicas' nodes); their
    /// finalizers go once the ledgers forget the snapshots deleted.
    async fn delete(
        &self,
        ctx: &mut ReconcileContext,
        want: &mut Desired,
        inv: &mut Inventory,
        deleting: &[String],
        snap_deleting: &[Typed<Snapshot>],
    ) -> Result<(), ControllerError> {
        if !deleting.is_empty() || !snap_deleting.is_empty() {
            *inv = Inventory::load(self.ops.client()).await?;
        }
        let mut deleted_vols = Vec::new();
        let snapshots: BTreeSet<String> = if deleting.is_empty() {
            BTreeSet::new()
        } else {
            ctx.list::<Snapshot>()?
                .iter()
                .map(|s| s.id().to_string())
                .collect()
        };
        for id in deleting {
            // its lvols, snapshots too: orphan cleanup never takes lvols
            let r = match ObjectName::parse("volume", id) {
                Ok(n) => match self.ops.delete(inv, &n).await {
                    Ok(()) => self
                        .ops
                        .delete_snapshots(&n, |s| snapshots.contains(&format!("{id}@{s}")))
                        .await
                        .map_err(|e| err_text(&e)),
                    Err(e) => Err(err_text(&e)),
                },
                Err(e) => Err(e.to_string()),
            };
            match r {
                Ok(()) => deleted_vols.push(id.clone()),
                Err(m) => ctx.apply(id, engine_status(ObjectState::Deleting, m))?,
            }
        }
        if !deleted_vols.is_empty() && !snap_deleting.is_empty() {
            *inv = Inventory::load(self.ops.client()).await?;
        }
        let mut gone = Vec::new();
        for s in snap_deleting {
            let deleted = self.delete_snapshot_everywhere(inv, s, &want.all_volumes).await;
            match deleted {
                Ok(()) => {
                    gone.push((s.spec.volume.clone(), s.spec.name.clone(), None));
                    ctx.remove_finalizer::<Snapshot>(s.id())?
                }
                Err(m) => ctx.apply(
                    s.id(),
                    snap_status(&s.spec.volume, ObjectState::Deleting, vec![], m),
                )?,
            }
        }
        record_snapshots(ctx, &mut want.ledgers, &mut gone)?;
        for id in deleted_vols {
            ctx.remove_finalizer::<Volume>(&id)?;
        }
        Ok(())
    }
}

/// The ledgers first: a volume status that says Ready or Degraded, or a
/// snapshot status that says Ready, is never seen before the set it was
/// reached with is persisted. Then the snapshots' point-in-time `sets`.
fn persist_ledgers(
    ctx: &mut ReconcileContext,
    ledgers: &mut BTreeMap<String, ReplicaLedger>,
    statuses: &[(String, Realized)],
    sets: &mut Vec<(String, String, Option<BTreeSet<usize>>)>,
) -> Result<(), ControllerError> {
    for (id, r) in statuses {
        if let Some(next) = r
            .in_sync
            .as_ref()
            .and_then(|now| next_ledger(ledgers.get(id), now, &r.disks, &r.notes))
        {
            tracing::info!(volume = %id, in_sync = ?next.in_sync, reason = %next.reason, "replica ledger");
            ctx.apply(id, next.clone())?;
            ledgers.insert(id.clone(), next);
        }
    }
    record_snapshots(ctx, ledgers, sets)
}

/// Applies each volume's status, its answer to a rebuild request and its
/// replicas' statuses; whether a rebuild runs.
fn apply_statuses(
    ctx: &mut ReconcileContext,
    statuses: Vec<(String, Realized)>,
) -> Result<bool, ControllerError> {
    let mut soon = false;
    for (id, r) in statuses {
        soon |= r.soon;
        ctx.apply(&id, r.status)?;
        if let Some(a) = r.dest_answer {
            ctx.apply(&id, a)?;
        }
        for (rid, rs) in r.replicas {
            ctx.apply(&rid, rs)?;
        }
    }
    Ok(soon)
}

/// The volumes this controller serves: V2 here ([`serves_v2`]), or still held
/// by its finalizer (`name`), such as one being deleted.
fn served_volumes(
    all: &[Typed<Volume>],
    node: &NodeConfig,
    claims_auto: bool,
    name: &str,
) -> Vec<Typed<Volume>> {
    all.iter()
        .filter(|v| serves_v2(&v.spec, node, claims_auto) || v.metadata.finalizers.contains(name))
        .cloned()
        .collect()
}

/// The snapshots of `volumes`, and those still held by the finalizer `name`.
fn served_snapshots(
    all: Vec<Typed<Snapshot>>,
    volumes: &[Typed<Volume>],
    name: &str,
) -> Vec<Typed<Snapshot>> {
    let mine: BTreeSet<&str> = volumes.iter().map(|v| v.id()).collect();
    all.into_iter()
        .filter(|s| mine.contains(s.spec.volume.as_str()) || s.metadata.finalizers.contains(name))
        .collect()
}

/// The ids of the volumes not being deleted.
fn live_ids(volumes: &[Typed<Volume>]) -> BTreeSet<String> {
    volumes
        .iter()
        .filter(|v| v.metadata.phase != Phase::TearingDown)
        .map(|v| v.id().to_string())
        .collect()
}

/// Whether the target is up and serving V2.
fn target_ready(target: Option<&TargetStatus>) -> bool {
    target.is_some_and(|t| t.engine == Engine::V2 && t.state == ObjectState::Ready)
}

/// The jobs of the volumes served here, from what was loaded; a volume being
/// deleted is no job but a deletion.
fn make_jobs(want: &Desired, here: &Loaded, host_nqn: Option<&str>) -> Jobs {
    let node = &want.node;
    let mut jobs = Jobs::default();
    for v in &want.volumes {
        if v.metadata.phase == Phase::TearingDown {
            jobs.deleting.push(v.id().to_string());
            continue;
        }
        let mut placed: BTreeMap<usize, String> = here
            .previous_replicas
            .iter()
            .filter(|r| r.spec.volume == v.id())
            .filter_map(|r| {
                let k = r.id().rsplit_once("-r")?.1.parse().ok()?;
                Some((k, r.spec.disk.clone()))
            })
            .collect();
        let ledger = want.ledgers.get(v.id());
        placed.extend(ledger.map(ReplicaLedger::placed).unwrap_or_default());
        // revert: this volume's snapshot; clone: the source volume's
        let start = v
            .spec
            .revert_to
            .as_deref()
            .or(v.spec.from_snapshot.as_deref())
            .or(v.spec.copy_from.as_deref());
        let copy_source_superblock = v.spec.copy_from.as_deref().and_then(|id| {
            let (sv, _) = split_snapshot_id(id).ok()?;
            let src = want.volumes.iter().find(|x| x.id() == sv.as_str())?;
            Some(src.spec.uses_superblock())
        });
        let snapshot_set = start.and_then(|id| {
            let (sv, ss) = split_snapshot_id(id).ok()?;
            want.ledgers.get(sv.as_str())?.snapshot_set(ss.as_str())
        });
        let attached = here.attached.get(v.id()).copied();
        let attached_by = host_nqn.filter(|_| attached.is_some());
        jobs.live.push(Job {
            id: v.id().to_string(),
            spec: v.spec.clone(),
            placed,
            disk_away: here.disk_away.clone(),
            in_sync: ledger.map(ReplicaLedger::in_sync_set),
            noted: ledger
                .map(|l| LvolNotes {
                    lvstores: l.lvstore_notes(),
                    lvols: l.lvol_notes(),
                })
                .unwrap_or_default(),
            snapshot_set,
            hosts: export_hosts(node, &v.spec, attached_by),
            tls_port: node.replica_tls_port,
            rebuild_cap: node.rebuild_mib_per_sec,
            overcommit_percent: node
                .overcommit_percent
                .unwrap_or(crate::spdk::placement::DEFAULT_OVERCOMMIT_PERCENT),
            dest_request: v
                .spec
                .serve_replica
                .and_then(|_| here.dest_requests.get(v.id()))
                .filter(|r| {
                    here.answers
                        .get(v.id())
                        .is_none_or(|a| a.generation < r.generation)
                })
                .cloned(),
            copy_source_superblock,
            attached,
        });
    }
    jobs
}

/// Plain volumes, and the clones and reverts, set up once the snapshots
/// they start from are taken.
fn split_derived(jobs: Vec<Job>) -> (Vec<Job>, Vec<Job>) {
    jobs.into_iter().partition(|j| {
        j.spec.from_snapshot.is_none() && j.spec.revert_to.is_none() && j.spec.copy_from.is_none()
    })
}

/// Jobs split into the replicas served to other nodes' engines and the
/// volumes, each in its order.
fn served_first(jobs: Vec<Job>) -> (Vec<Job>, Vec<Job>) {
    jobs.into_iter().partition(|j| j.spec.serve_replica.is_some())
}

/// Whether remote replica `k` of volume `v` (its NVMe controller here) is
/// wanted: `v` exists, is not being deleted, and has a remote replica `k`.
fn keeps_remote(all_volumes: &[Typed<Volume>], v: &str, k: usize) -> bool {
    all_volumes.iter().any(|x| {
        x.id() == v
            && x.metadata.phase != Phase::TearingDown
            && (x.spec.replicas as usize..x.spec.replicas as usize + x.spec.remote_replicas.len())
                .contains(&k)
    })
}

/// A snapshot's lvols (`taken`: replica -> lvol) on replicas that have a head.
fn on_heads(taken: &[(usize, String)], heads: &BTreeSet<usize>) -> Vec<String> {
    taken
        .iter()
        .filter(|(k, _)| heads.contains(k))
        .map(|(_, a)| a.clone())
        .collect()
}

/// The status of a snapshot of `volume`, which is gone: what was taken
/// stays until the snapshot is deleted.
fn gone_volume_snapshot(volume: &str, taken: Vec<(usize, String)>) -> SnapshotStatus {
    let kept: Vec<String> = taken.into_iter().map(|(_, a)| a).collect();
    if kept.is_empty() {
        snap_status(
            volume,
            ObjectState::Failed,
            vec![],
            format!("volume {volume} does not exist"),
        )
    } else {
        snap_status(volume, ObjectState::Ready, kept, "")
    }
}

/// A snapshot reported Ready before (`prev`) that replicas with a head still
/// hold (`existing`) is not taken again: its status (`None`: take it).
fn still_taken(volume: &str, prev: Option<&SnapshotStatus>, existing: Vec<String>) -> Option<SnapshotStatus> {
    let taken_before = prev.is_some_and(|p| p.state == ObjectState::Ready);
    (taken_before && !existing.is_empty()).then(|| snap_status(volume, ObjectState::Ready, existing, ""))
}

/// The replicas a snapshot of `vol` is taken on: those in sync as set up in
/// this reconcile, else as its ledger says (`None`: all).
fn snapshot_in_sync(
    statuses: &[(String, Realized)],
    ledgers: &BTreeMap<String, ReplicaLedger>,
    vol: &str,
) -> Option<BTreeSet<usize>> {
    statuses
        .iter()
        .find(|(id, _)| id == vol)
        .and_then(|(_, r)| r.in_sync.clone())
        .or_else(|| ledgers.get(vol).map(ReplicaLedger::in_sync_set))
}

/// When a snapshot was taken: as reported `before`, or now.
fn created(before: Option<String>) -> String {
    before
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string())
}

/// How soon to look again. SPDK tells nobody when a raid loses a member:
/// poll, quickly while a rebuild runs (or a volume asked to be looked at
/// `soon`), and often enough with raids that the ledger learns of a replica
/// that left before a restart could trust it again.
fn requeue_after(soon: bool, volumes: &[Typed<Volume>]) -> Duration {
    let raids = volumes
        .iter()
        .any(|v| v.spec.replicas as usize + v.spec.remote_replicas.len() > 1);
    if soon {
        // a thin rebuild takes one step per reconcile
        Duration::from_millis(300)
    } else if raids {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(10)
    }
}

/// What this node's exports are made with, from its `NodeConfig`: the
/// listen address, the NVMe/TCP port, and the secrets' folder for DH-HMAC-CHAP
/// and TLS when they are on (`data_dir`). Hosts are set per volume
/// (`Job::hosts`). Why not, naming the field, when the config cannot be served.
fn export_spec(node: &NodeConfig, data_dir: Option<&std::path::PathBuf>) -> Result<ExportSpec, String> {
    let address: IpAddr = node.listen_address.parse().map_err(|_| {
        format!(
            "NodeConfig listenAddress {:?} is not an IP address",
            node.listen_address
        )
    })?;
    if (node.nvme_dhchap || node.replica_tls) && data_dir.is_none() {
        return Err(
            "NodeConfig nvmeDhchap or replicaTls is set but this talon has no data directory for the secrets"
                .into(),
        );
    }
    if node.replica_tls && node.replica_tls_port == node.nvmf_port {
        return Err(format!(
            "NodeConfig replicaTlsPort {} is nvmfPort: TLS needs a port of its own",
            node.replica_tls_port
        ));
    }
    Ok(ExportSpec {
        address,
        port: node.nvmf_port,
        hosts: Vec::new(),
        dhchap_data_dir: data_dir.filter(|_| node.nvme_dhchap).cloned(),
        tls_data_dir: data_dir.filter(|_| node.replica_tls).cloned(),
    })
}

/// Configured disks that take no new replica, and why: those being removed,
/// and those not ready on the running target: their lvstore is not in the
/// target, or its `DiskStatus` is not `Ready` on this target (SPDK lists an
/// lvstore as soon as its examine loaded it, its lvols only once each is
/// opened: until the disk controller's ensure saw the examine end, a
/// replica missing from the listing may only not be opened yet, and a
/// replica made for it would be a second, empty one).
fn disks_away(
    disks: &[crate::runtime::Typed<Disk>],
    statuses: &[crate::runtime::Typed<DiskStatus>],
    target: Option<&TargetStatus>,
    inv: &Inventory,
) -> BTreeMap<String, DiskAway> {
    let mut away = BTreeMap::new();
    for d in disks {
        let id = d.id();
        if d.metadata.phase == Phase::TearingDown {
            away.insert(id.to_owned(), DiskAway::Removing("being removed".into()));
            continue;
        }
        let st = statuses.iter().find(|s| s.id() == id).map(|s| &s.spec);
        let listed = inv.lvstore(id).is_some();
        if listed && st.is_some_and(|s| s.ready_on(target)) {
            continue;
        }
        let why = match st {
            Some(s) if s.state == ObjectState::Failed => DiskAway::Failed(s.message.clone()),
            _ if listed => DiskAway::Pending(
                "its lvstore is loaded, its lvols may not all be opened yet (SPDK's examine): \
                 waiting for the disk to be ready on this target"
                    .into(),
            ),
            Some(s) if s.state == ObjectState::Ready => {
                DiskAway::Pending("its lvstore is not loaded yet".into())
            }
            Some(s) if !s.message.is_empty() => DiskAway::Pending(s.message.clone()),
            _ => DiskAway::Pending("not brought up yet".into()),
        };
        away.insert(id.to_owned(), why);
    }
    away
}

/// The ledger to record when the up-to-date set, the placement or the
/// notes of where the replicas' lvols are differ from `before` (`None`:
/// nothing changed). `changed` and `reason` move only with the up-to-date
/// set. `notes` is what the engine noted of its up-to-date replicas this
/// pass (a local one's lvstore, a remote one's lvol); a replica not up to
/// date loses its notes (it is rebuilt, maybe into another lvol).
fn next_ledger(
    before: Option<&ReplicaLedger>,
    in_sync: &BTreeSet<usize>,
    placed: &BTreeMap<usize, String>,
    notes: &LvolNotes,
) -> Option<ReplicaLedger> {
    let now: Vec<u32> = in_sync.iter().map(|k| *k as u32).collect();
    let len = placed.keys().max().map_or(0, |m| m + 1);
    let disks: Vec<String> = (0..len)
        .map(|k| placed.get(&k).cloned().unwrap_or_default())
        .collect();
    let by_k = |m: &BTreeMap<usize, String>| -> BTreeMap<u32, String> {
        m.iter()
            .filter(|(k, _)| in_sync.contains(k))
            .map(|(k, u)| (*k as u32, u.clone()))
            .collect()
    };
    let (lvols, lvstores) = (by_k(&notes.lvols), by_k(&notes.lvstores));
    match before {
        Some(b) if b.in_sync == now && b.disks == disks && b.lvols == lvols && b.lvstores == lvstores => None,
        Some(b) if b.in_sync == now => Some(ReplicaLedger {
            disks,
            lvols,
            lvstores,
            ..b.clone()
        }),
        _ => Some(ReplicaLedger {
            reason: ledger_reason(before.map(|b| b.in_sync.as_slice()), &now),
            changed: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            in_sync: now,
            disks,
            snapshots: before.map(|b| b.snapshots.clone()).unwrap_or_default(),
            lvols,
            lvstores,
        }),
    }
}

/// Records (or, with `None`, forgets) the point-in-time sets of snapshots in
/// their volumes' ledgers, persisted before anything can revert to them.
/// A volume with no ledger has no engine here: nothing to record.
fn record_snapshots(
    ctx: &mut ReconcileContext,
    ledgers: &mut BTreeMap<String, ReplicaLedger>,
    sets: &mut Vec<(String, String, Option<BTreeSet<usize>>)>,
) -> Result<(), ControllerError> {
    for (vol, snap, set) in sets.drain(..) {
        let Some(l) = ledgers.get_mut(&vol) else {
            continue;
        };
        let changed = match set {
            Some(set) => {
                let ks: Vec<u32> = set.iter().map(|k| *k as u32).collect();
                l.snapshots.insert(snap, ks.clone()) != Some(ks)
            }
            None => l.snapshots.remove(&snap).is_some(),
        };
        if changed {
            ctx.apply(&vol, l.clone())?;
        }
    }
    Ok(())
}

/// Why the up-to-date set changed, in words.
fn ledger_reason(before: Option<&[u32]>, now: &[u32]) -> String {
    let Some(before) = before else {
        return "first record".into();
    };
    let names = |ks: Vec<&u32>| ks.iter().map(|k| format!("r{k}")).collect::<Vec<_>>().join(", ");
    let left = names(before.iter().filter(|k| !now.contains(k)).collect());
    let joined = names(now.iter().filter(|k| !before.contains(k)).collect());
    match (left.is_empty(), joined.is_empty()) {
        (false, true) => format!("{left} left the engine (missed writes from then on)"),
        (true, false) => format!("{joined} rebuilt and back in the engine"),
        _ => format!("{left} left; {joined} rebuilt"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk takes new replicas only once it is ready on the running
    /// target: its lvstore listed is not enough (SPDK lists an lvstore
    /// before it has opened its lvols, and lists only opened lvols), nor is
    /// a `Ready` of an earlier spdk_tgt.
    #[test]
    fn a_disk_takes_replicas_only_once_ready_on_the_running_target() {
        fn typed<S>(id: &str, spec: S) -> crate::runtime::Typed<S> {
            crate::runtime::Typed {
                metadata: crate::runtime::Metadata::new("config", "Test", id, ""),
                spec,
            }
        }
        let target = |pid| TargetStatus::ready_for_test(Some(pid), String::new());
        let (now, before) = (target(20), target(10));
        let status = |state, on: &TargetStatus| DiskStatus {
            engine: Engine::V2,
            state,
            bdev: "talon-disk-d1".into(),
            lvstore: "talon-d1".into(),
            lvstore_uuid: "u1".into(),
            total_bytes: 64 << 20,
            free_bytes: 64 << 20,
            cluster_bytes: 1 << 20,
            message: "lvstore talon-d1".into(),
            target: Some(on.instance()),
        };
        let disk: Disk = serde_json::from_value(serde_json::json!({"path": "/d1"})).expect("disk");
        let disks = [typed("d1", disk)];
        let mut inv = Inventory::default();
        inv.lvstores.push(crate::spdk::rpc::Lvstore {
            uuid: "u1".into(),
            name: "talon-d1".into(),
            base_bdev: "talon-disk-d1".into(),
            total_data_clusters: 64,
            free_clusters: 64,
            block_size: 512,
            cluster_size: 1 << 20,
        });
        let away = |st: Option<DiskStatus>, t: &TargetStatus, inv: &Inventory| {
            let sts: Vec<_> = st.into_iter().map(|s| typed("d1", s)).collect();
            disks_away(&disks, &sts, Some(t), inv)
        };
        assert!(away(Some(status(ObjectState::Ready, &now)), &now, &inv).is_empty());
        // listed, but talon just started (no status), the disk controller is at
        // it, or its Ready is of the target before this one: waited for
        for st in [
            None,
            Some(status(ObjectState::Creating, &now)),
            Some(status(ObjectState::Ready, &before)),
        ] {
            let a = away(st.clone(), &now, &inv);
            match a.get("d1") {
                Some(DiskAway::Pending(why)) => assert!(why.contains("lvols may not all be opened"), "{why}"),
                other => panic!("{st:?}: {other:?}"),
            }
        }
        // ready on this target but its lvstore gone from the listing
        let a = away(
            Some(status(ObjectState::Ready, &now)),
            &now,
            &Inventory::default(),
        );
        assert!(
            matches!(a.get("d1"), Some(DiskAway::Pending(w)) if w.contains("not loaded yet")),
            "{a:?}"
        );
    }

    /// The export settings come from the NodeConfig, and a config that
    /// cannot be served is refused naming its field.
    #[test]
    fn exports_are_refused_naming_the_node_config_field_that_cannot_be_served() {
        let dir = std::path::PathBuf::from("/var/lib/talon");
        let node = NodeConfig {
            listen_address: "10.0.0.5".into(),
            nvmf_port: 4420,
            ..NodeConfig::default()
        };
        let e = export_spec(&node, None).expect("plain");
        assert_eq!((e.address.to_string(), e.port), ("10.0.0.5".into(), 4420));
        assert!(e.dhchap_data_dir.is_none() && e.tls_data_dir.is_none());
        let bad = NodeConfig {
            listen_address: "node-a".into(),
            ..node.clone()
        };
        assert!(
            export_spec(&bad, Some(&dir))
                .expect_err("name")
                .contains("listenAddress \"node-a\"")
        );
        let dhchap = NodeConfig {
            nvme_dhchap: true,
            ..node.clone()
        };
        assert!(
            export_spec(&dhchap, None)
                .expect_err("no dir")
                .contains("no data directory")
        );
        let e = export_spec(&dhchap, Some(&dir)).expect("dhchap");
        assert_eq!((e.dhchap_data_dir, e.tls_data_dir), (Some(dir.clone()), None));
        let tls = NodeConfig {
            replica_tls: true,
            replica_tls_port: 4420,
            ..node.clone()
        };
        assert!(
            export_spec(&tls, Some(&dir))
                .expect_err("one port")
                .contains("replicaTlsPort 4420 is nvmfPort")
        );
        let tls = NodeConfig {
            replica_tls_port: 4421,
            ..tls
        };
        assert_eq!(
            export_spec(&tls, Some(&dir)).expect("tls").tls_data_dir,
            Some(dir)
        );
    }

    #[test]
    fn ledger_moves_its_reason_only_with_the_up_to_date_set() {
        let placed = BTreeMap::from([(0, "d1".to_string()), (1, "d2".to_string())]);
        let none = LvolNotes::default();
        let first = next_ledger(None, &BTreeSet::from([0, 1]), &placed, &none).expect("first");
        assert_eq!(
            (first.in_sync.as_slice(), first.reason.as_str()),
            (&[0, 1][..], "first record")
        );
        assert!(next_ledger(Some(&first), &BTreeSet::from([0, 1]), &placed, &none).is_none());
        let moved = BTreeMap::from([(0, "d1".to_string()), (1, "d3".to_string())]);
        let m = next_ledger(Some(&first), &BTreeSet::from([0, 1]), &moved, &none).expect("placement");
        assert_eq!((m.reason.as_str(), m.disks[1].as_str()), ("first record", "d3"));
        let left = next_ledger(Some(&m), &BTreeSet::from([0]), &moved, &none).expect("left");
        assert!(left.reason.contains("r1 left"), "{}", left.reason);
    }

    #[test]
    fn a_replicas_lvol_is_noted_while_it_is_up_to_date_and_forgotten_when_it_leaves() {
        let placed = BTreeMap::from([(0, "d1".to_string()), (1, "10.0.0.2:4420".to_string())]);
        let none = LvolNotes::default();
        let both = BTreeSet::from([0, 1]);
        let first = next_ledger(None, &both, &placed, &none).expect("first");
        assert!(first.lvols.is_empty() && first.lvstores.is_empty());
        // noted (r0's lvstore listed, r1's node answered): written, the reason kept
        let notes = LvolNotes {
            lvstores: BTreeMap::from([(0, "lvs-1".to_string())]),
            lvols: BTreeMap::from([(1, "u-1".to_string())]),
        };
        let noted = next_ledger(Some(&first), &both, &placed, &notes).expect("noted");
        assert_eq!(noted.lvols, BTreeMap::from([(1, "u-1".to_string())]));
        assert_eq!(noted.lvstores, BTreeMap::from([(0, "lvs-1".to_string())]));
        assert_eq!(noted.reason, "first record");
        assert!(next_ledger(Some(&noted), &both, &placed, &notes).is_none());
        // r1 left: its note goes with it, even if the engine still named it
        let left = next_ledger(Some(&noted), &BTreeSet::from([0]), &placed, &notes).expect("left");
        assert!(left.lvols.is_empty(), "{:?}", left.lvols);
        assert_eq!(left.lvstores.len(), 1);
        // back after its rebuild, noted again with what its node reports then
        let rebuilt = LvolNotes {
            lvols: BTreeMap::from([(1, "u-2".to_string())]),
            ..notes.clone()
        };
        let back = next_ledger(Some(&left), &both, &placed, &rebuilt).expect("back");
        assert_eq!(back.lvols, BTreeMap::from([(1, "u-2".to_string())]));
        // r0 left: its lvstore's note goes too
        let r0_left = next_ledger(Some(&back), &BTreeSet::from([1]), &placed, &rebuilt).expect("r0 left");
        assert!(r0_left.lvstores.is_empty(), "{:?}", r0_left.lvstores);
    }

    const ME: &str = "engine.SpdkVolumeController";

    fn typed<S>(id: &str, spec: S) -> Typed<S> {
        Typed {
            metadata: crate::runtime::Metadata::new("config", "Test", id, ""),
            spec,
        }
    }

    /// Volume `id` of 1 MiB with `more` fields (camelCase, as in the API).
    fn vol(id: &str, more: serde_json::Value) -> Typed<Volume> {
        let mut spec = serde_json::json!({"sizeBytes": 1 << 20});
        spec.as_object_mut()
            .expect("object")
            .extend(more.as_object().expect("object").clone());
        typed(id, serde_json::from_value(spec).expect("volume"))
    }

    fn tearing_down<S>(mut t: Typed<S>) -> Typed<S> {
        t.metadata.phase = Phase::TearingDown;
        t
    }

    fn held<S>(mut t: Typed<S>) -> Typed<S> {
        t.metadata.finalizers.insert(ME.into());
        t
    }

    fn snapshot(volume: &str, name: &str) -> Typed<Snapshot> {
        typed(
            &format!("{volume}@{name}"),
            Snapshot {
                volume: volume.into(),
                name: name.into(),
            },
        )
    }

    fn ledger(in_sync: &[u32], disks: &[&str]) -> ReplicaLedger {
        ReplicaLedger {
            in_sync: in_sync.to_vec(),
            disks: disks.iter().map(|d| d.to_string()).collect(),
            changed: String::new(),
            reason: String::new(),
            snapshots: BTreeMap::new(),
            lvols: BTreeMap::new(),
            lvstores: BTreeMap::new(),
        }
    }

    fn desired(volumes: Vec<Typed<Volume>>, ledgers: Vec<(&str, ReplicaLedger)>) -> Desired {
        Desired {
            node: NodeConfig::default(),
            all_volumes: volumes.clone(),
            volumes,
            snapshots: Vec::new(),
            ledgers: ledgers.into_iter().map(|(v, l)| (v.to_string(), l)).collect(),
        }
    }

    fn loaded() -> Loaded {
        Loaded {
            inv: Inventory::default(),
            live_vols: BTreeSet::new(),
            attached: BTreeMap::new(),
            previous_replicas: Vec::new(),
            disk_away: BTreeMap::new(),
            dest_requests: BTreeMap::new(),
            answers: BTreeMap::new(),
        }
    }

    /// A job for `v` made as a reconcile makes it, with nothing loaded.
    fn job(v: Typed<Volume>) -> Job {
        make_jobs(&desired(vec![v], vec![]), &loaded(), None)
            .live
            .pop()
            .expect("a job")
    }

    fn ids<S: crate::runtime::Spec>(list: &[Typed<S>]) -> Vec<&str> {
        list.iter().map(|t| t.id()).collect()
    }

    #[test]
    fn a_volume_is_served_here_when_v2_or_while_its_finalizer_holds_it() {
        let node = NodeConfig::default();
        let all = vec![
            vol("a", serde_json::json!({"engine": "v2"})),
            vol("b", serde_json::json!({"engine": "v1"})),
            held(vol("c", serde_json::json!({"engine": "v1"}))),
            vol("d", serde_json::json!({})),
        ];
        let served = served_volumes(&all, &node, true, ME);
        assert_eq!(ids(&served), ["a", "c", "d"]);
        // auto volumes are V1 where SPDK is not usable
        assert_eq!(ids(&served_volumes(&all, &node, false, ME)), ["a", "c"]);
        let snaps = served_snapshots(
            vec![
                snapshot("a", "s1"),
                snapshot("b", "s1"),
                held(snapshot("b", "s2")),
                snapshot("gone", "s1"),
            ],
            &served,
            ME,
        );
        assert_eq!(ids(&snaps), ["a@s1", "b@s2"]);
        let live = live_ids(&[
            vol("x", serde_json::json!({})),
            tearing_down(vol("y", serde_json::json!({}))),
        ]);
        assert_eq!(live, BTreeSet::from(["x".to_string()]));
    }

    #[test]
    fn only_a_ready_v2_target_is_one_to_set_volumes_up_on() {
        let target = |engine, state| TargetStatus {
            engine,
            state,
            pid: None,
            socket: String::new(),
            version: String::new(),
            restarts: 0,
            message: String::new(),
        };
        assert!(target_ready(Some(&target(Engine::V2, ObjectState::Ready))));
        assert!(!target_ready(Some(&target(Engine::V2, ObjectState::Creating))));
        assert!(!target_ready(Some(&target(Engine::V1, ObjectState::Ready))));
        assert!(!target_ready(None));
    }

    #[test]
    fn live_volumes_become_jobs_placed_as_reported_and_recorded_and_the_others_deletions() {
        let mut src = ledger(&[0, 1], &["d1", "d2"]);
        src.snapshots.insert("s1".into(), vec![1]);
        let mut want = desired(
            vec![
                vol("a", serde_json::json!({"replicas": 2})),
                tearing_down(vol("gone", serde_json::json!({}))),
                vol("c", serde_json::json!({"fromSnapshot": "a@s1"})),
            ],
            vec![("a", src)],
        );
        want.node.replica_tls_port = 4430;
        want.node.rebuild_mib_per_sec = Some(50);
        let mut here = loaded();
        here.attached.insert("c".into(), "nvme-tcp");
        here.disk_away
            .insert("d3".into(), DiskAway::Pending("not brought up yet".into()));
        let reported = |id: &str, volume: &str, disk: &str| {
            typed(
                id,
                ReplicaStatus {
                    volume: volume.into(),
                    disk: disk.into(),
                    bdev: String::new(),
                    alias: String::new(),
                    size_bytes: 0,
                    allocated_bytes: 0,
                    state: ObjectState::Ready,
                    message: String::new(),
                },
            )
        };
        here.previous_replicas = vec![
            // the ledger's placement wins over a status reported before
            reported("a-r1", "a", "d9"),
            reported("a-r2", "a", "d3"),
            reported("c-r0", "c", "d2"),
            reported("b-r0", "b", "d1"),
        ];
        let jobs = make_jobs(&want, &here, Some("nqn.2014-08.org.nvmexpress:uuid:me"));
        assert_eq!(jobs.deleting, ["gone"]);
        let [a, c] = &jobs.live[..] else {
            panic!(
                "two jobs: {:?}",
                jobs.live.iter().map(|j| &j.id).collect::<Vec<_>>()
            );
        };
        assert_eq!(
            a.placed,
            BTreeMap::from([(0, "d1".into()), (1, "d2".into()), (2, "d3".into())])
        );
        assert_eq!(a.in_sync, Some(BTreeSet::from([0, 1])));
        assert_eq!((a.snapshot_set.as_ref(), a.hosts.len()), (None, 0));
        assert_eq!(
            (a.tls_port, a.rebuild_cap, a.overcommit_percent),
            (4430, Some(50), crate::spdk::placement::DEFAULT_OVERCOMMIT_PERCENT)
        );
        assert_eq!(a.disk_away.len(), 1);
        // a clone starts from the point-in-time set its source's ledger recorded
        assert_eq!(c.placed, BTreeMap::from([(0, "d2".into())]));
        assert_eq!(
            (c.in_sync.as_ref(), c.snapshot_set.as_ref()),
            (None, Some(&BTreeSet::from([1])))
        );
        // attached here: this host may connect
        assert_eq!(c.hosts, ["nqn.2014-08.org.nvmexpress:uuid:me"]);
    }

    #[test]
    fn a_served_replica_answers_each_rebuild_request_generation_once() {
        let want = desired(
            vec![
                vol("served", serde_json::json!({"serveReplica": 1})),
                vol("engine", serde_json::json!({})),
            ],
            vec![],
        );
        let request = |generation| RebuildDest {
            chain: vec!["s1".into()],
            generation,
        };
        let answer = |generation| RebuildDestStatus {
            generation,
            ..RebuildDestStatus::default()
        };
        let mut here = loaded();
        here.dest_requests.insert("served".into(), request(3));
        // a volume with its engine here serves no replica: no request is its
        here.dest_requests.insert("engine".into(), request(3));
        let asked = |here: &Loaded| {
            make_jobs(&want, here, None)
                .live
                .into_iter()
                .map(|j| (j.id, j.dest_request.map(|r| r.generation)))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            asked(&here),
            [("served".into(), Some(3)), ("engine".into(), None)]
        );
        here.answers.insert("served".into(), answer(2));
        assert_eq!(asked(&here)[0], ("served".into(), Some(3)));
        here.answers.insert("served".into(), answer(3));
        assert_eq!(asked(&here)[0], ("served".into(), None));
    }

    #[test]
    fn clones_and_reverts_are_set_up_after_the_snapshots_served_replicas_first() {
        let jobs = vec![
            job(vol("plain", serde_json::json!({}))),
            job(vol("clone", serde_json::json!({"fromSnapshot": "plain@s1"}))),
            job(vol(
                "revert",
                serde_json::json!({"revertTo": "revert@s1", "revertGeneration": 1}),
            )),
            job(vol("served", serde_json::json!({"serveReplica": 1}))),
        ];
        let (plain, derived) = split_derived(jobs);
        let names = |js: &[Job]| js.iter().map(|j| j.id.clone()).collect::<Vec<_>>();
        assert_eq!(names(&plain), ["plain", "served"]);
        assert_eq!(names(&derived), ["clone", "revert"]);
        // the replicas served to other nodes before the volumes here
        let (served, volumes) = served_first(plain);
        assert_eq!(names(&served), ["served"]);
        assert_eq!(names(&volumes), ["plain"]);
    }

    #[test]
    fn a_remote_replica_is_kept_while_its_volume_lives_and_counts_it() {
        let remote = serde_json::json!({"address": "10.0.0.2", "port": 4420});
        let all = vec![
            vol(
                "a",
                serde_json::json!({"replicas": 1, "remoteReplicas": [remote, remote]}),
            ),
            tearing_down(vol(
                "b",
                serde_json::json!({"replicas": 1, "remoteReplicas": [remote]}),
            )),
        ];
        // replica 0 is local; 1 and 2 are remote
        let kept: Vec<usize> = (0..4).filter(|k| keeps_remote(&all, "a", *k)).collect();
        assert_eq!(kept, [1, 2]);
        assert!(!keeps_remote(&all, "b", 1), "being deleted");
        assert!(!keeps_remote(&all, "c", 1), "no such volume");
    }

    #[test]
    fn a_snapshot_of_a_gone_volume_keeps_what_was_taken_until_it_is_deleted() {
        let kept = gone_volume_snapshot(
            "a",
            vec![(0, "talon-d1/a@s1".into()), (1, "talon-d2/a@s1".into())],
        );
        assert_eq!(
            (kept.state, kept.objects.as_slice(), kept.volume.as_str()),
            (
                ObjectState::Ready,
                &["talon-d1/a@s1".to_string(), "talon-d2/a@s1".to_string()][..],
                "a"
            )
        );
        let none = gone_volume_snapshot("a", vec![]);
        assert_eq!(
            (none.state, none.message.as_str()),
            (ObjectState::Failed, "volume a does not exist")
        );
    }

    #[test]
    fn a_snapshot_reported_ready_is_not_taken_again_while_a_replica_with_a_head_holds_it() {
        let taken = vec![(0, "talon-d1/a@s1".to_string()), (2, "talon-d3/a@s1".to_string())];
        // replica 2 lost its head (being rebuilt): its snapshot lvol does not count
        let existing = on_heads(&taken, &BTreeSet::from([0, 1]));
        assert_eq!(existing, ["talon-d1/a@s1"]);
        let ready = snap_status("a", ObjectState::Ready, vec![], "");
        let failed = snap_status("a", ObjectState::Failed, vec![], "peer unreachable");
        let st = still_taken("a", Some(&ready), existing.clone()).expect("kept");
        assert_eq!((st.state, st.objects), (ObjectState::Ready, existing.clone()));
        assert!(
            still_taken("a", Some(&failed), existing.clone()).is_none(),
            "failed: taken again"
        );
        assert!(
            still_taken("a", None, existing).is_none(),
            "never reported: taken"
        );
        let no_head = on_heads(&taken, &BTreeSet::from([1]));
        assert!(
            still_taken("a", Some(&ready), no_head).is_none(),
            "no head holds it: taken again"
        );
    }

    #[test]
    fn a_snapshot_is_taken_on_the_replicas_in_sync_now_else_on_those_the_ledger_names() {
        let mut now = Realized::failed(ObjectState::Ready, "");
        now.in_sync = Some(BTreeSet::from([0]));
        let waiting = Realized::failed(ObjectState::Creating, "waiting for disks");
        let statuses = vec![("a".to_string(), now), ("b".to_string(), waiting)];
        let ledgers = BTreeMap::from([
            ("a".to_string(), ledger(&[0, 1], &[])),
            ("b".to_string(), ledger(&[1], &[])),
        ]);
        assert_eq!(
            snapshot_in_sync(&statuses, &ledgers, "a"),
            Some(BTreeSet::from([0]))
        );
        assert_eq!(
            snapshot_in_sync(&statuses, &ledgers, "b"),
            Some(BTreeSet::from([1]))
        );
        // no engine and no ledger here: all of them
        assert_eq!(snapshot_in_sync(&statuses, &ledgers, "c"), None);
    }

    #[test]
    fn a_snapshot_keeps_the_time_it_was_first_reported() {
        assert_eq!(
            created(Some("2025-01-02T03:04:05Z".into())),
            "2025-01-02T03:04:05Z"
        );
        for before in [None, Some(String::new())] {
            let now = created(before);
            assert!(humantime::parse_rfc3339(&now).is_ok(), "{now}");
        }
    }

    #[test]
    fn polls_fast_while_rebuilding_then_often_with_raids_else_seldom() {
        let remote = serde_json::json!({"address": "10.0.0.2", "port": 4420});
        let single = vec![vol("a", serde_json::json!({"replicas": 1}))];
        let raid = vec![vol("a", serde_json::json!({"replicas": 2}))];
        let remote_raid = vec![vol(
            "a",
            serde_json::json!({"replicas": 1, "remoteReplicas": [remote]}),
        )];
        assert_eq!(requeue_after(true, &single), Duration::from_millis(300));
        assert_eq!(requeue_after(false, &raid), Duration::from_secs(2));
        assert_eq!(requeue_after(false, &remote_raid), Duration::from_secs(2));
        assert_eq!(requeue_after(false, &single), Duration::from_secs(10));
        assert_eq!(requeue_after(false, &[]), Duration::from_secs(10));
    }

    #[test]
    fn a_served_replica_with_tls_is_exported_on_the_tls_port_only() {
        let node = NodeConfig {
            listen_address: "10.0.0.5".into(),
            nvmf_port: 4420,
            replica_tls: true,
            replica_tls_port: 4430,
            ..NodeConfig::default()
        };
        let tls = export_spec(&node, Some(&"/var/lib/talon".into())).expect("tls");
        let plain = ExportSpec {
            tls_data_dir: None,
            ..tls.clone()
        };
        let mut served = job(vol("a", serde_json::json!({"serveReplica": 1})));
        served.tls_port = 4430;
        served.hosts = vec!["nqn.engine".into()];
        let mut engine = job(vol("b", serde_json::json!({})));
        engine.tls_port = 4430;
        let e = job_export(&tls, &served);
        assert_eq!(
            (e.port, e.hosts.as_slice()),
            (4430, &["nqn.engine".to_string()][..])
        );
        assert_eq!(job_export(&plain, &served).port, 4420);
        assert_eq!(job_export(&tls, &engine).port, 4420);
    }

    #[test]
    fn a_remote_replica_is_reached_by_ip_address_only() {
        let ok = vol(
            "a",
            serde_json::json!({"remoteReplicas": [{"address": "10.0.0.2", "port": 4420}, {"address": "fd00::3", "port": 4421}]}),
        );
        assert_eq!(
            remote_addresses(&ok.spec).expect("addresses"),
            [
                ("10.0.0.2".parse().expect("v4"), 4420),
                ("fd00::3".parse().expect("v6"), 4421)
            ]
        );
        let named = vol(
            "a",
            serde_json::json!({"remoteReplicas": [{"address": "node-b", "port": 4420}]}),
        );
        assert_eq!(
            remote_addresses(&named.spec).expect_err("a name"),
            "remote replica address \"node-b\" is not an IP address"
        );
    }

    #[test]
    fn a_restore_waits_polled_and_a_standby_volume_reports_its_backup_unserved() {
        let spec = vol("a", serde_json::json!({})).spec;
        let outcome = |step| match restore_file(step, &spec) {
            Ok(f) => panic!("served with {f:?}"),
            Err(r) => (
                r.status.state,
                r.status.message,
                r.soon,
                r.status.size_bytes,
                r.status.restored_backup,
            ),
        };
        assert!(matches!(restore_file(RestoreStep::None, &spec), Ok(None)));
        assert_eq!(
            outcome(RestoreStep::Waiting("12% downloaded".into())),
            (ObjectState::Creating, "12% downloaded".into(), true, 0, None)
        );
        assert_eq!(
            outcome(RestoreStep::Failed("no such backup".into())),
            (ObjectState::Failed, "no such backup".into(), false, 0, None)
        );
        assert_eq!(
            outcome(RestoreStep::Standby {
                message: "standby".into(),
                backup: Some("b-2".into()),
                busy: true,
            }),
            (
                ObjectState::Standby,
                "standby".into(),
                true,
                1 << 20,
                Some("b-2".into())
            )
        );
    }

    #[test]
    fn a_volume_with_no_placement_waits_for_its_disks_unless_one_failed() {
        let j = job(vol("a", serde_json::json!({})));
        let no_placement = |disk_failed| VolumeError::NoPlacement {
            volume: "a".into(),
            reason: "disk d1 is not brought up yet".into(),
            disk_failed,
        };
        let waits = not_realized(no_placement(false), &j);
        assert_eq!(waits.status.state, ObjectState::Creating);
        assert!(
            waits.status.message.starts_with("waiting for disks: "),
            "{}",
            waits.status.message
        );
        assert_eq!(
            not_realized(no_placement(true), &j).status.state,
            ObjectState::Failed
        );
    }

    #[test]
    fn a_restore_waits_while_a_disk_its_lvols_may_be_on_is_coming_up() {
        let away = BTreeMap::from([
            ("d1".into(), DiskAway::Removing("being removed".into())),
            ("d2".into(), DiskAway::Failed("I/O error".into())),
            (
                "d3".into(),
                DiskAway::Pending("its lvstore is loaded, its lvols may not all be opened yet".into()),
            ),
        ]);
        let any = vol("a", serde_json::json!({})).spec;
        let why = restore_waits_for(&any, &away).expect("d3 is coming up");
        assert!(
            why.contains("disk d3") && why.contains("may not all be opened"),
            "{why}"
        );
        // a removed or failed disk is not waited for; nor a disk the volume does not use
        let on = vol("a", serde_json::json!({"disks": ["d1", "d2"]})).spec;
        assert_eq!(restore_waits_for(&on, &away), None);
        assert_eq!(restore_waits_for(&any, &BTreeMap::new()), None);
    }

    #[test]
    fn a_volume_whose_current_replicas_are_away_names_the_failed_disks_they_are_on() {
        let mut j = job(vol("a", serde_json::json!({"replicas": 3})));
        j.placed = BTreeMap::from([(0, "d1".into()), (1, "d2".into()), (2, "d1".into())]);
        j.disk_away = BTreeMap::from([
            ("d1".into(), DiskAway::Failed("I/O error".into())),
            ("d2".into(), DiskAway::Pending("not brought up yet".into())),
            ("d9".into(), DiskAway::Failed("unplugged".into())),
        ]);
        let r = not_realized(
            VolumeError::NoCurrentReplica {
                volume: "a".into(),
                waiting: vec!["r0".into()],
                stale: vec![],
            },
            &j,
        );
        assert_eq!(r.status.state, ObjectState::Failed);
        // once per disk, and only disks its replicas are on
        assert_eq!(r.status.message.matches("; disk d1 failed: I/O error").count(), 1);
        assert!(!r.status.message.contains("d2") && !r.status.message.contains("d9"));
    }
}
