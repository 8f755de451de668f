//! `engine.SpdkVolumeController`: realizes V2 `Volume`s and their `Snapshot`s
//! in spdk_tgt through [`VolumeOps`], and reports `EngineStatus`,
//! `SnapshotStatus` and `ReplicaStatus`.
//!
//! ```text
//!   Volume, Snapshot, Disk (config) ─┐
//!   NodeConfig (listener, hosts) ────┼─> Inventory::load ─> orphans removed (talon names only)
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
use crate::resources::config::{Disk, NodeConfig, Snapshot, Volume, split_snapshot_id};
use crate::resources::engine::SPDK_STATUS_ID;
use crate::resources::engine::{
    DiskStatus, Engine, EngineStatus, Export, ObjectState, RebuildDest, RebuildDestStatus, ReplicaLedger,
    ReplicaStatus, SnapshotStatus, SpdkEvents, TargetStatus,
};
use crate::resources::frontend::Attachment;
use crate::runtime::{Controller, ControllerError, Input, Output, Phase, ReconcileContext, Requeue, Typed};
use crate::spdk::SpdkClient;
use crate::spdk::placement::DiskAway;
use crate::spdk::volume::{
    ExportSpec, Inventory, RemoteDest, RemoteSnapshot, VolumeError, VolumeInfo, VolumeOps, VolumePlan,
    applied_revert, replica_heads,
};

use super::peer::{PeerDest, Peers};
use super::restore::{Restores, Step as RestoreStep};

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
}

/// What realizing one volume gave.
struct Realized {
    status: EngineStatus,
    replicas: Vec<(String, ReplicaStatus)>,
    /// The replicas now up to date, when the engine stands (for the ledger).
    in_sync: Option<BTreeSet<usize>>,
    /// Where each replica lives (placed or waited for).
    disks: BTreeMap<usize, String>,
    /// A rebuild runs (poll for its progress).
    rebuilding: bool,
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
            rebuilding: false,
            dest_answer: None,
        }
    }
}

impl SpdkVolumeController {
    async fn realize(&self, inv: &Inventory, job: &Job, export: &ExportSpec) -> Realized {
        // a served replica with TLS listens on the TLS port (and only there)
        let port = match (&export.tls_data_dir, job.spec.serve_replica) {
            (Some(_), Some(_)) => job.tls_port,
            _ => export.port,
        };
        let export = &ExportSpec {
            hosts: job.hosts.clone(),
            port,
            ..export.clone()
        };
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
        let replicas = job.spec.replicas.max(1) as usize;
        // the raid's superblock, or (a served replica) room for the engine's
        let slots = job.spec.raid_slots();
        let superblock = job.spec.uses_superblock();
        // revert: once per generation, recorded in SPDK with the data
        let mut reloaded = None;
        if let Some(target) = &job.spec.revert_to
            && job.spec.revert_generation > applied_revert(inv, &job.id)
        {
            let snap = match ObjectName::parse("snapshot", target.rsplit('@').next().unwrap_or(target)) {
                Ok(s) => s,
                Err(e) => return Realized::failed(ObjectState::Failed, e.to_string()),
            };
            match self
                .ops
                .revert(
                    inv,
                    &name,
                    &snap,
                    job.spec.revert_generation,
                    job.snapshot_set.as_ref(),
                    superblock.then_some(slots),
                )
                .await
            {
                Ok(reverted) => in_sync = Some(reverted),
                Err(e) => return Realized::failed(ObjectState::Failed, err_text(&e)),
            }
            match Inventory::load(self.ops.client()).await {
                Ok(i) => reloaded = Some(i),
                Err(e) => return Realized::failed(ObjectState::Failed, e.to_string()),
            }
            message = format!("reverted to {target} (generation {})", job.spec.revert_generation);
        }
        // a served replica: its engine's request for the next copy of a
        // thin rebuild, answered before the replica is exported (again)
        let mut dest_answer = None;
        if let (Some(k), Some(req)) = (job.spec.serve_replica, &job.dest_request) {
            let plan = VolumePlan::new(name.clone(), job.spec.size_bytes, 1, export.clone());
            let answer = match self.ops.prepare_dest(inv, &plan, k as usize, &req.chain).await {
                Ok(a) => a,
                Err(e) => RebuildDestStatus {
                    message: err_text(&e),
                    ..RebuildDestStatus::default()
                },
            };
            if answer.reset {
                match Inventory::load(self.ops.client()).await {
                    Ok(mut i) => {
                        let disks: BTreeSet<String> = inv.disks().into_iter().map(|(d, _)| d).collect();
                        i.retain_disks(&disks);
                        reloaded = Some(i);
                    }
                    Err(e) => return Realized::failed(ObjectState::Failed, e.to_string()),
                }
            }
            dest_answer = Some(RebuildDestStatus {
                generation: req.generation,
                ..answer
            });
        }
        let inv = reloaded.as_ref().unwrap_or(inv);
        let mut remote = Vec::new();
        for r in &job.spec.remote_replicas {
            match r.address.parse::<IpAddr>() {
                Ok(a) => remote.push((a, r.port)),
                Err(_) => {
                    return Realized::failed(
                        ObjectState::Failed,
                        format!("remote replica address {:?} is not an IP address", r.address),
                    );
                }
            }
        }
        // a new volume from a backup: restored into a file first
        let restore = match self
            .restores
            .step(
                self.ops.client(),
                inv,
                &job.id,
                &job.spec,
                job.in_sync.is_some(),
                superblock,
            )
            .await
        {
            RestoreStep::None => None,
            RestoreStep::Ready(f) => Some(f),
            RestoreStep::Failed(m) => return Realized::failed(ObjectState::Failed, m),
            RestoreStep::Waiting(m) => {
                let mut r = Realized::failed(ObjectState::Creating, m);
                r.rebuilding = true;
                return r;
            }
            // a standby volume is not served: it holds a backup until activated
            RestoreStep::Standby {
                message,
                backup,
                busy,
            } => {
                let mut r = Realized::failed(ObjectState::Standby, message);
                r.status.size_bytes = job.spec.size_bytes;
                r.status.restored_backup = Some(backup);
                r.rebuilding = busy;
                return r;
            }
        };
        let restoring = restore.is_some();
        let plan = VolumePlan {
            name: name.clone(),
            size_bytes: job.spec.size_bytes,
            replicas,
            disks: job.spec.disks.clone(),
            placed: job.placed.clone(),
            disk_away: job.disk_away.clone(),
            from_snapshot,
            snapshot_set: job.snapshot_set.clone(),
            export: export.clone(),
            restore,
            in_sync,
            remote,
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
        let done = match job.spec.serve_replica {
            Some(k) => self.ops.ensure_served(inv, &plan, k as usize).await,
            None => self.ops.ensure(inv, &plan).await,
        };
        let mut realized = match done {
            Ok(info) => {
                if job.spec.serve_replica.is_none() {
                    // a snapshot's freeze left by a talon stopped before its thaw
                    let nqn = crate::names::Nqn::for_volume(&name);
                    self.thaw_checked.check(self.ops.client(), nqn.as_str()).await;
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
                let rebuilding = info.rebuilding.is_some();
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
                    rebuilding,
                    dest_answer: None,
                }
            }
            // No valid placement: a wait while the disks it needs come up (DiskStatus
            // is an input, so this runs again when one does); failed, with the
            // disk's error, when one of them failed, so a wait ends at once. It is
            // placed as soon as a disk is ready.
            Err(e @ VolumeError::NoPlacement { disk_failed, .. }) => Realized::failed(
                if disk_failed {
                    ObjectState::Failed
                } else {
                    ObjectState::Creating
                },
                format!("waiting for disks: {}", err_text(&e)),
            ),
            // waiting for replicas on disks that failed: say why they are away
            Err(e @ (VolumeError::NoCurrentReplica { .. } | VolumeError::RaidAssembling { .. })) => {
                let mut m = err_text(&e);
                let failed: BTreeSet<&String> = job.placed.values().collect();
                for d in failed {
                    if let Some(DiskAway::Failed(why)) = job.disk_away.get(d) {
                        m.push_str(&format!("; disk {d} failed: {why}"));
                    }
                }
                Realized::failed(ObjectState::Failed, m)
            }
            Err(e) => Realized::failed(ObjectState::Failed, err_text(&e)),
        };
        realized.dest_answer = dest_answer;
        realized
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
                Err(message) => {
                    unreachable = Some(VolumeError::PeerSnapshot {
                        snapshot: s.id().to_string(),
                        replica: format!("r{k}"),
                        message,
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
                        let f: futures::future::BoxFuture<'_, Result<(), String>> =
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
            |v, k| {
                all_volumes.iter().any(|x| {
                    x.id() == v
                        && x.metadata.phase != Phase::TearingDown
                        && (x.spec.replicas as usize..x.spec.replicas as usize + x.spec.remote_replicas.len())
                            .contains(&k)
                })
            },
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
                    .await?;
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
    let degraded = info.in_sync.len() < info.wanted;
    if degraded {
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
        message = format!("volumes do not shrink: serving {} bytes", info.size_bytes);
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
                    state: if info.in_sync.contains(&r.k) {
                        ObjectState::Ready
                    } else if info.rebuilding.is_some_and(|(k, _)| k == r.k) {
                        ObjectState::Rebuilding
                    } else {
                        ObjectState::Stale
                    },
                    message: match info.rebuilding {
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
        state: if degraded {
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
    };
    (status, replicas)
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
        let node = ctx.get::<NodeConfig>("node")?.map(|n| n.spec).unwrap_or_default();
        let all_volumes = ctx.list::<Volume>()?;
        let volumes: Vec<_> = all_volumes
            .iter()
            .filter(|v| {
                serves_v2(&v.spec, &node, self.claims_auto) || v.metadata.finalizers.contains(self.name())
            })
            .cloned()
            .collect();
        let mine: BTreeSet<String> = volumes.iter().map(|v| v.id().to_string()).collect();
        // a restore of a volume that is being deleted (or gone) stops, its file goes
        self.restores.retain(
            &volumes
                .iter()
                .filter(|v| v.metadata.phase != crate::runtime::Phase::TearingDown)
                .map(|v| v.id().to_string())
                .collect(),
        );
        let snapshots: Vec<_> = ctx
            .list::<Snapshot>()?
            .into_iter()
            .filter(|s| mine.contains(&s.spec.volume) || s.metadata.finalizers.contains(self.name()))
            .collect();
        // the ledgers outlive every reconcile until their volume is gone
        let mut ledgers: BTreeMap<String, ReplicaLedger> = BTreeMap::new();
        for l in ctx.list::<ReplicaLedger>()? {
            if all_volumes.iter().any(|v| v.id() == l.id()) {
                ctx.apply(l.id(), l.spec.clone())?;
                ledgers.insert(l.id().to_string(), l.spec);
            }
        }
        let target_ready = ctx
            .get::<TargetStatus>(SPDK_STATUS_ID)?
            .is_some_and(|t| t.spec.engine == Engine::V2 && t.spec.state == ObjectState::Ready);
        if !target_ready {
            for v in volumes.iter().filter(|v| v.metadata.phase != Phase::TearingDown) {
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
            for s in &snapshots {
                if let Some(cur) = ctx.get::<SnapshotStatus>(s.id())? {
                    ctx.apply(s.id(), cur.spec)?;
                }
            }
            return Ok(Requeue::After(Duration::from_secs(2)));
        }
        let export = match export_spec(&node, self.data_dir.as_ref()) {
            Ok(e) => e,
            Err(msg) => {
                for v in &volumes {
                    ctx.apply(v.id(), engine_status(ObjectState::Failed, msg.clone()))?;
                }
                return Ok(Requeue::OnInputChange);
            }
        };
        let tls_port = node.replica_tls_port;
        let attached: BTreeSet<String> = ctx
            .list::<Attachment>()?
            .into_iter()
            .map(|a| a.id().to_string())
            .collect();
        let disk_list = ctx.list::<Disk>()?;
        let disks: BTreeSet<String> = disk_list.iter().map(|d| d.id().to_string()).collect();
        let previous_replicas: Vec<_> = ctx.list::<ReplicaStatus>()?;

        let mut inv = Inventory::load(self.ops.client()).await?;
        // only lvstores of configured disks are usable
        inv.retain_disks(&disks);

        let live_vols: BTreeSet<String> = all_volumes
            .iter()
            .filter(|v| v.metadata.phase != Phase::TearingDown)
            .map(|v| v.id().to_string())
            .collect();
        let known_snaps: BTreeSet<String> = ctx
            .list::<Snapshot>()?
            .iter()
            .map(|s| s.id().to_string())
            .collect();
        if self
            .remove_orphans(&inv, &all_volumes, &live_vols, &known_snaps)
            .await
        {
            inv = Inventory::load(self.ops.client()).await?;
            inv.retain_disks(&disks);
        }

        let disk_away = disks_away(&disk_list, &ctx.list::<DiskStatus>()?, &inv);

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

        // finalizers and jobs
        let mut live = Vec::new();
        let mut deleting = Vec::new();
        for v in &volumes {
            if v.metadata.phase == Phase::TearingDown {
                deleting.push(v.id().to_string());
                continue;
            }
            ctx.add_finalizer::<Volume>(v.id())?;
            let mut placed: BTreeMap<usize, String> = previous_replicas
                .iter()
                .filter(|r| r.spec.volume == v.id())
                .filter_map(|r| {
                    let k = r.id().rsplit_once("-r")?.1.parse().ok()?;
                    Some((k, r.spec.disk.clone()))
                })
                .collect();
            let ledger = ledgers.get(v.id());
            placed.extend(ledger.map(ReplicaLedger::placed).unwrap_or_default());
            // revert: this volume's snapshot; clone: the source volume's
            let start = v.spec.revert_to.as_deref().or(v.spec.from_snapshot.as_deref());
            let snapshot_set = start.and_then(|id| {
                let (sv, ss) = split_snapshot_id(id).ok()?;
                ledgers.get(sv.as_str())?.snapshot_set(ss.as_str())
            });
            let attached_by = self.host_nqn.as_deref().filter(|_| attached.contains(v.id()));
            live.push(Job {
                id: v.id().to_string(),
                spec: v.spec.clone(),
                placed,
                disk_away: disk_away.clone(),
                in_sync: ledger.map(ReplicaLedger::in_sync_set),
                snapshot_set,
                hosts: export_hosts(&node, &v.spec, attached_by),
                tls_port,
                rebuild_cap: node.rebuild_mib_per_sec,
                overcommit_percent: node
                    .overcommit_percent
                    .unwrap_or(crate::spdk::placement::DEFAULT_OVERCOMMIT_PERCENT),
                dest_request: v
                    .spec
                    .serve_replica
                    .and_then(|_| dest_requests.get(v.id()))
                    .filter(|r| answers.get(v.id()).is_none_or(|a| a.generation < r.generation))
                    .cloned(),
            });
        }
        // one TCP transport per target, made (or adopted) before the volumes
        // are set up concurrently
        if !live.is_empty() && !inv.tcp_transport {
            if self.ops.ensure_transport().await? {
                tracing::info!("NVMe/TCP transport created");
            }
            inv.tcp_transport = true;
        }
        let (plain, derived): (Vec<Job>, Vec<Job>) = live
            .into_iter()
            .partition(|j| j.spec.from_snapshot.is_none() && j.spec.revert_to.is_none());

        let mut statuses: Vec<(String, Realized)> = Vec::new();
        let run = |jobs: Vec<Job>, inv: Inventory| {
            let export = export.clone();
            async move {
                futures::stream::iter(jobs)
                    .map(|j| {
                        let (inv, export) = (&inv, &export);
                        async move {
                            let r = self.realize(inv, &j, export).await;
                            (j.id, r)
                        }
                    })
                    .buffer_unordered(CONCURRENCY)
                    .collect::<Vec<_>>()
                    .await
            }
        };
        statuses.extend(run(plain, inv.clone()).await);
        // a remote replica grows on its node when the volume grows
        for v in volumes.iter().filter(|v| v.metadata.phase != Phase::TearingDown) {
            self.grow_remotes(v).await;
        }

        // snapshots of live volumes
        let mut snap_out: Vec<(String, SnapshotStatus)> = Vec::new();
        // (volume, snapshot, point-in-time set; None: the snapshot is gone)
        let mut snap_sets: Vec<(String, String, Option<BTreeSet<usize>>)> = Vec::new();
        let mut snap_deleting = Vec::new();
        if !snapshots.is_empty() {
            inv = Inventory::load(self.ops.client()).await?;
        }
        for s in &snapshots {
            if s.metadata.phase == Phase::TearingDown {
                snap_deleting.push(s.clone());
                continue;
            }
            ctx.add_finalizer::<Snapshot>(s.id())?;
            let (vol, snap) = match (
                ObjectName::parse("volume", &s.spec.volume),
                ObjectName::parse("snapshot", &s.spec.name),
            ) {
                (Ok(v), Ok(n)) => (v, n),
                (Err(e), _) | (_, Err(e)) => {
                    snap_out.push((
                        s.id().to_string(),
                        snap_status(&s.spec.volume, ObjectState::Failed, vec![], e.to_string()),
                    ));
                    continue;
                }
            };
            // taken already: the snapshot lvols of the replicas that have a head
            let heads: BTreeSet<usize> = replica_heads(&inv, vol.as_str())
                .iter()
                .map(|(k, _)| *k)
                .collect();
            let taken = inv.snapshot_lvols(vol.as_str(), snap.as_str());
            let existing: Vec<String> = taken
                .iter()
                .filter(|(k, _)| heads.contains(k))
                .map(|(_, a)| a.clone())
                .collect();
            let live_volume = live_vols.contains(vol.as_str());
            let st = if !live_volume {
                // volume gone: what was taken stays until the snapshot is deleted
                let kept: Vec<String> = taken.into_iter().map(|(_, a)| a).collect();
                if kept.is_empty() {
                    snap_status(
                        &s.spec.volume,
                        ObjectState::Failed,
                        vec![],
                        format!("volume {vol} does not exist"),
                    )
                } else {
                    snap_status(&s.spec.volume, ObjectState::Ready, kept, "")
                }
            } else {
                let prev = ctx.get::<SnapshotStatus>(s.id())?.map(|p| p.spec);
                let taken_before = prev.as_ref().is_some_and(|p| p.state == ObjectState::Ready);
                if taken_before && !existing.is_empty() {
                    snap_status(&s.spec.volume, ObjectState::Ready, existing, "")
                } else {
                    let in_sync = statuses
                        .iter()
                        .find(|(id, _)| id == vol.as_str())
                        .and_then(|(_, r)| r.in_sync.clone())
                        .or_else(|| ledgers.get(vol.as_str()).map(ReplicaLedger::in_sync_set));
                    let remotes = volumes
                        .iter()
                        .find(|x| x.id() == vol.as_str())
                        .map(|x| Self::callable_remotes(&x.spec))
                        .unwrap_or_default();
                    let (st, set) = self.take_snapshot(&inv, s, &vol, &snap, in_sync, remotes).await;
                    if let Some(set) = set {
                        snap_sets.push((vol.to_string(), snap.to_string(), Some(set)));
                    }
                    st
                }
            };
            let mut st = st;
            st.created = ctx
                .get::<SnapshotStatus>(s.id())?
                .map(|p| p.spec.created)
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| {
                    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
                });
            snap_out.push((s.id().to_string(), st));
        }

        // clones and reverts need the snapshots
        if !derived.is_empty() {
            inv = Inventory::load(self.ops.client()).await?;
            statuses.extend(run(derived, inv.clone()).await);
        }

        // the ledgers first: a volume status that says Ready or Degraded, or a
        // snapshot status that says Ready, is never seen before the set it
        // was reached with is persisted
        for (id, r) in &statuses {
            if let Some(next) = r
                .in_sync
                .as_ref()
                .and_then(|now| next_ledger(ledgers.get(id), now, &r.disks))
            {
                tracing::info!(volume = %id, in_sync = ?next.in_sync, reason = %next.reason, "replica ledger");
                ctx.apply(id, next.clone())?;
                ledgers.insert(id.clone(), next);
            }
        }
        record_snapshots(ctx, &mut ledgers, &mut snap_sets)?;
        for (id, st) in snap_out {
            ctx.apply(&id, st)?;
        }
        let mut rebuilding = false;
        for (id, r) in statuses {
            rebuilding |= r.rebuilding;
            ctx.apply(&id, r.status)?;
            if let Some(a) = r.dest_answer {
                ctx.apply(&id, a)?;
            }
            for (rid, rs) in r.replicas {
                ctx.apply(&rid, rs)?;
            }
        }

        // deletions: volumes first (their heads may be clones of snapshots), then snapshots
        if !deleting.is_empty() || !snap_deleting.is_empty() {
            inv = Inventory::load(self.ops.client()).await?;
        }
        let mut deleted_vols = Vec::new();
        for id in &deleting {
            let r = match ObjectName::parse("volume", id) {
                Ok(n) => self.ops.delete(&inv, &n).await.map_err(|e| err_text(&e)),
                Err(e) => Err(e.to_string()),
            };
            match r {
                Ok(()) => deleted_vols.push(id.clone()),
                Err(m) => ctx.apply(id, engine_status(ObjectState::Deleting, m))?,
            }
        }
        if !deleted_vols.is_empty() && !snap_deleting.is_empty() {
            inv = Inventory::load(self.ops.client()).await?;
        }
        for s in &snap_deleting {
            let deleted = self.delete_snapshot_everywhere(&inv, s, &all_volumes).await;
            match deleted {
                Ok(()) => {
                    snap_sets.push((s.spec.volume.clone(), s.spec.name.clone(), None));
                    ctx.remove_finalizer::<Snapshot>(s.id())?
                }
                Err(m) => ctx.apply(
                    s.id(),
                    snap_status(&s.spec.volume, ObjectState::Deleting, vec![], m),
                )?,
            }
        }
        record_snapshots(ctx, &mut ledgers, &mut snap_sets)?;
        for id in deleted_vols {
            ctx.remove_finalizer::<Volume>(&id)?;
        }
        // replica statuses of volumes that are not live are not re-applied: the runtime drops them
        // SPDK tells nobody when a raid loses a member: poll, quickly while a
        // rebuild runs, and often enough with raids that the ledger learns of a
        // replica that left before a restart could trust it again
        let raids = volumes
            .iter()
            .any(|v| v.spec.replicas as usize + v.spec.remote_replicas.len() > 1);
        Ok(Requeue::After(if rebuilding {
            // a thin rebuild takes one step per reconcile
            Duration::from_millis(300)
        } else if raids {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(10)
        }))
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

/// Configured disks that take no new replica, and why: those whose lvstore
/// is not in the target (their `DiskStatus` says why: failed, or still coming
/// up) and those being removed.
fn disks_away(
    disks: &[crate::runtime::Typed<Disk>],
    statuses: &[crate::runtime::Typed<DiskStatus>],
    inv: &Inventory,
) -> BTreeMap<String, DiskAway> {
    let mut away = BTreeMap::new();
    for d in disks {
        let id = d.id();
        if d.metadata.phase == Phase::TearingDown {
            away.insert(id.to_owned(), DiskAway::Pending("being removed".into()));
            continue;
        }
        if inv.lvstore(id).is_some() {
            continue;
        }
        let st = statuses.iter().find(|s| s.id() == id).map(|s| &s.spec);
        let why = match st {
            Some(s) if s.state == ObjectState::Failed => DiskAway::Failed(s.message.clone()),
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

/// The ledger to record when the up-to-date set or the placement differs from
/// `before` (`None`: nothing changed). `changed` and `reason` move only with
/// the up-to-date set.
fn next_ledger(
    before: Option<&ReplicaLedger>,
    in_sync: &BTreeSet<usize>,
    placed: &BTreeMap<usize, String>,
) -> Option<ReplicaLedger> {
    let now: Vec<u32> = in_sync.iter().map(|k| *k as u32).collect();
    let len = placed.keys().max().map_or(0, |m| m + 1);
    let disks: Vec<String> = (0..len)
        .map(|k| placed.get(&k).cloned().unwrap_or_default())
        .collect();
    match before {
        Some(b) if b.in_sync == now && b.disks == disks => None,
        Some(b) if b.in_sync == now => Some(ReplicaLedger { disks, ..b.clone() }),
        _ => Some(ReplicaLedger {
            reason: ledger_reason(before.map(|b| b.in_sync.as_slice()), &now),
            changed: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            in_sync: now,
            disks,
            snapshots: before.map(|b| b.snapshots.clone()).unwrap_or_default(),
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
        let first = next_ledger(None, &BTreeSet::from([0, 1]), &placed).expect("first");
        assert_eq!(
            (first.in_sync.as_slice(), first.reason.as_str()),
            (&[0, 1][..], "first record")
        );
        assert!(next_ledger(Some(&first), &BTreeSet::from([0, 1]), &placed).is_none());
        let moved = BTreeMap::from([(0, "d1".to_string()), (1, "d3".to_string())]);
        let m = next_ledger(Some(&first), &BTreeSet::from([0, 1]), &moved).expect("placement");
        assert_eq!((m.reason.as_str(), m.disks[1].as_str()), ("first record", "d3"));
        let left = next_ledger(Some(&m), &BTreeSet::from([0]), &moved).expect("left");
        assert!(left.reason.contains("r1 left"), "{}", left.reason);
    }
}
