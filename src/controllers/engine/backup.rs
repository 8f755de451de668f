//! `engine.BackupController`: carries out `Backup`s of V2 volumes' snapshots
//! to their backup targets, one at a time, and reports `BackupStatus`.
//!
//! ```text
//!   Backup (config) ── its SnapshotStatus Ready (V2) ──> a task:
//!     the store's last backup of the volume ── its snapshot on the replica read?
//!        yes: the blocks that differ from it (incremental) ┐
//!        no:  the blocks that hold data                    ├─> backupstore::ops::create_from
//!     (spdk::volume::mover::backup, one replica of the snapshot's point-in-time
//!      set, read over NVMe/TCP on loopback: no staging file)
//!   BackupStatus <name>: Pending -> InProgress (progress) -> Completed | Error
//! ```
//!
//! A backup that a restart of talon cut off starts again (its unfinished
//! config in the store is replaced); one the store holds complete is
//! reported complete. One whose reads failed (spdk_tgt restarted under it,
//! taking the mover's export and connection) is tried again, up to 4 times
//! 10 s apart, while it stays in progress. A deleted `Backup` stops its task and leaves the
//! store as Longhorn leaves a failed backup: an unfinished config that no
//! restore, listing or block collection trusts.
//!
//! What a task makes outside the store goes with it on every path: the
//! mover's exports of its snapshots are removed when it ends, fails or is
//! stopped, and the mover's sweep removes those a talon stopped mid-backup
//! left. [`sweep`] removes the staging files and aio bdevs of backups an
//! older talon (before the mover read backups) left. Backups run one at a
//! time; one queued behind another starts in the reconcile that takes the
//! other's end, whatever their names' order.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;

use crate::backupstore::{self, BackupCfg, BackupRequest, BackupStats, Progress, Store};
use crate::resources::backup::{Backup, BackupState, BackupStatus};
use crate::resources::config::{Volume, snapshot_id};
use crate::resources::engine::{Engine, ObjectState, ReplicaLedger, SnapshotStatus};
use crate::resources::longhorn::{LonghornReplica, snapshot_lvol};
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue, Typed};
use crate::spdk::SpdkClient;
use crate::spdk::volume::Inventory;
use crate::spdk::volume::mover::MoverError;
use crate::spdk::volume::mover::backup::{BackupRead, BackupReader};
use crate::spdk::volume::naming::lvstore;
use crate::spdk::volume::to_file;

use super::tasks::{Seen, Tasks};

/// How often a running backup's progress is published.
const POLL: Duration = Duration::from_secs(1);
/// How often the start's sweep is tried again while spdk_tgt does not answer.
const SWEEP_RETRY: Duration = Duration::from_secs(10);

type Outcome = Result<(BackupCfg, BackupStats, bool), String>;

/// Backs up V2 volumes' snapshots.
#[derive(Debug)]
pub struct BackupController {
    client: SpdkClient,
    /// `<data dir>/backup`: the credentials of Longhorn's backup calls, and
    /// the staging files an older talon left.
    work_dir: PathBuf,
    running: Tasks<(BackupCfg, BackupStats, bool)>,
    /// Whether what an earlier talon left (files, bdevs) was swept.
    swept: std::sync::atomic::AtomicBool,
}

impl BackupController {
    /// Backs up through the target behind `client`, making images under
    /// `<data_dir>/backup/`.
    pub fn new(client: SpdkClient, data_dir: &std::path::Path) -> Self {
        Self {
            client,
            work_dir: data_dir.join("backup"),
            running: Tasks::new("backup task"),
            swept: Default::default(),
        }
    }

    /// Removes the credentials a Longhorn backup call left for backup `id`
    /// (`<work dir>/credentials/<id>`, see `longhorn::backup`).
    fn forget_credentials(&self, id: &str) {
        let _ = std::fs::remove_dir_all(self.work_dir.join("credentials").join(id));
    }

    /// Once per start, before it holds anything: what backups an earlier
    /// talon ran left behind ([`sweep`]); done once spdk_tgt answered.
    async fn sweep_once(&self) {
        use std::sync::atomic::Ordering;
        if !self.swept.load(Ordering::Relaxed)
            && sweep(&self.client, &self.work_dir, &self.running.ids()).await
        {
            self.swept.store(true, Ordering::Relaxed);
        }
    }
}

/// The name prefix of the aio bdevs backups made before they read through
/// the mover (an earlier talon's leftovers are swept).
pub const STAGING_BDEV_PREFIX: &str = "talon-backup-";

/// Removes the staging files (`<work_dir>/*.img`) and aio bdevs
/// ([`STAGING_BDEV_PREFIX`]`*`) of backups not in `running`: what an older
/// talon (one that staged backups) stopped mid-backup left. Whether spdk_tgt answered (its bdevs were
/// looked at).
pub async fn sweep(client: &SpdkClient, work_dir: &std::path::Path, running: &BTreeSet<String>) -> bool {
    if let Ok(entries) = std::fs::read_dir(work_dir) {
        for e in entries.flatten() {
            let path = e.path();
            let stem = path.file_stem().and_then(|n| n.to_str()).unwrap_or_default();
            if path.extension().is_some_and(|x| x == "img") && !running.contains(stem) {
                match std::fs::remove_file(&path) {
                    Ok(()) => {
                        tracing::info!(file = %path.display(), "removed a backup's staging file left by an earlier run")
                    }
                    Err(x) => {
                        tracing::warn!(file = %path.display(), error = %x, "removing a backup's staging file")
                    }
                }
            }
        }
    }
    // spdk_tgt may not run yet (it starts with the first disk)
    let listed =
        tokio::time::timeout(Duration::from_secs(2), client.bdev_get_bdevs(&Default::default())).await;
    let Ok(Ok(bdevs)) = listed else {
        return false;
    };
    for b in bdevs {
        let Some(name) = b.name.strip_prefix(STAGING_BDEV_PREFIX) else {
            continue;
        };
        if running.contains(name) {
            continue;
        }
        match to_file::remove_bdev(client, &b.name).await {
            Ok(()) => tracing::info!(bdev = %b.name, "removed a backup's aio bdev left by an earlier run"),
            Err(x) => {
                tracing::warn!(bdev = %b.name, error = %crate::util::error_chain(&x), "removing a backup's aio bdev")
            }
        }
    }
    true
}

/// The store of a target with the credentials of secret `secret`.
pub fn open_store(target: &str, secret: Option<&str>) -> Result<Store, String> {
    Store::open_with_secret(target, secret.map(std::path::Path::new)).map_err(|e| e.to_string())
}

fn status(state: BackupState, message: impl Into<String>) -> BackupStatus {
    BackupStatus {
        state,
        message: message.into(),
        ..Default::default()
    }
}

fn completed(
    b: &Typed<Backup>,
    cfg: &BackupCfg,
    stats: Option<&BackupStats>,
    incremental: bool,
) -> BackupStatus {
    BackupStatus {
        state: BackupState::Completed,
        progress: 100,
        url: backupstore::format::backup_url(&b.spec.target, b.id(), b.spec.backup_volume()),
        incremental,
        blocks_read: stats.map_or(0, |s| s.blocks_read),
        blocks_uploaded: stats.map_or(0, |s| s.blocks_uploaded),
        bytes_uploaded: stats.map_or(0, |s| s.bytes_uploaded),
        size: cfg.size,
        completed: cfg.created_time.clone(),
        message: String::new(),
    }
}

/// Where a backup task reads its snapshot.
enum Source {
    /// A talon volume's snapshot: a replica of its point-in-time set
    /// (`recorded`, from the ledger); `superblock`: whether the replicas
    /// hold a raid superblock before the volume's data.
    Volume {
        recorded: Option<BTreeSet<usize>>,
        superblock: bool,
    },
    /// A Longhorn replica's snapshot lvol in lvstore `lvs` (no superblock:
    /// Longhorn's raids are made without one).
    Longhorn { lvs: String, replica: String },
}

/// What a backup task needs.
struct Job {
    client: SpdkClient,
    backup: Backup,
    name: String,
    volume_size: u64,
    source: Source,
    snapshot_created: String,
    progress: Arc<Progress>,
}

/// Why one try of a backup failed.
enum Failed {
    /// Its snapshot could not be read: spdk_tgt did not answer, or the
    /// mover's export or connection went (the target restarted under the
    /// backup). Another try, once the target serves the snapshot again,
    /// may get past it.
    Read(String),
    /// Anything else (the store, a snapshot that is not there): final.
    Other(String),
}

impl From<String> for Failed {
    fn from(why: String) -> Self {
        Failed::Other(why)
    }
}

/// Tries of a backup whose reads failed (a restart of spdk_tgt under it:
/// the target is started again and its lvstores loaded within seconds), and
/// the pause before the next.
const READ_TRIES: u32 = 4;
const READ_RETRY: Duration = Duration::from_secs(10);

impl Job {
    /// The backup, tried again (up to [`READ_TRIES`]) while its snapshot
    /// could not be read, and after such a failure also while anything else
    /// fails (the restarted target may not hold the snapshot's lvstore yet).
    /// A try that failed left the store as a stopped backup does: an
    /// unfinished config the next try replaces.
    async fn run(self) -> Outcome {
        let mut read_failed = false;
        let mut tried = 1;
        loop {
            let why = match self.run_once().await {
                Ok(done) => return Ok(done),
                Err(Failed::Read(why)) => {
                    read_failed = true;
                    why
                }
                Err(Failed::Other(why)) if read_failed => why,
                Err(Failed::Other(why)) => return Err(why),
            };
            if tried == READ_TRIES {
                return Err(format!("{why} (tried {tried} times)"));
            }
            tracing::warn!(backup = %self.name, error = %why, tried, "backup failed reading its snapshot; trying again in {READ_RETRY:?}");
            tried += 1;
            tokio::time::sleep(READ_RETRY).await;
        }
    }

    async fn run_once(&self) -> Result<(BackupCfg, BackupStats, bool), Failed> {
        let store = open_store(&self.backup.target, self.backup.credential_secret.as_deref())?;
        let bvol = self.backup.backup_volume().to_owned();
        let named = |e: backupstore::BackupError| format!("backup {}: {e}", self.name);
        if let Ok(b) = backupstore::ops::backup(&store, &bvol, &self.name).await
            && b.complete()
        {
            if b.snapshot_name != self.backup.snapshot {
                return Err(format!(
                    "backup {}: the target holds a complete backup of that name of snapshot {:?} of {bvol}; \
                     pick another name",
                    self.name, b.snapshot_name
                )
                .into());
            }
            // done before a restart of talon
            return Ok((b, BackupStats::default(), false));
        }
        let bs = self
            .backup
            .block_size
            .unwrap_or(backupstore::format::DEFAULT_BLOCK_SIZE);
        let base = if self.backup.full {
            None
        } else {
            backupstore::ops::last_backup(&store, &bvol)
                .await
                .map_err(named)?
                // blocks of another size: this one is taken whole
                .filter(|b| b.block_size().is_ok_and(|n| n == bs))
        };
        let inv = Inventory::load(&self.client)
            .await
            .map_err(|e| Failed::Read(format!("listing spdk_tgt: {}", crate::util::error_chain(&e))))?;
        let (vol, snap) = (self.backup.volume.as_str(), self.backup.snapshot.as_str());
        let base_snap = base
            .as_ref()
            .map(|b| b.snapshot_name.as_str())
            .filter(|s| *s != snap);
        let read = match &self.source {
            Source::Volume { recorded, superblock } => BackupRead::of_volume(
                &inv,
                vol,
                snap,
                recorded.as_ref(),
                base_snap,
                *superblock,
                self.volume_size,
            )
            .ok_or_else(|| format!("no replica of volume {vol} on this node holds snapshot {snap}"))?,
            Source::Longhorn { lvs, replica } => {
                let lvol = |s: &str| {
                    let alias = format!("{lvs}/{}", snapshot_lvol(replica, s));
                    inv.lvols.contains_key(&alias).then_some(alias)
                };
                let snapshot = lvol(snap).ok_or_else(|| {
                    format!("replica {replica} of {vol} holds no snapshot {snap} on this node")
                })?;
                BackupRead {
                    snapshot,
                    base: base_snap.and_then(lvol),
                    data_offset: 0,
                    size: self.volume_size,
                }
            }
        };
        // over the base backup only when its snapshot is read beside
        let base = base.filter(|_| read.base.is_some());
        let reading = |e: MoverError| {
            Failed::Read(format!(
                "reading snapshot {snap} of {vol}: {}",
                crate::util::error_chain(&e)
            ))
        };
        let compression = match &self.backup.compression {
            Some(c) => backupstore::format::Compression::parse(c).map_err(named)?,
            None => Default::default(),
        };
        let req = BackupRequest {
            snapshot_created_at: self.snapshot_created.clone(),
            labels: self.backup.labels.clone(),
            full: self.backup.full,
            compression,
            block_size: bs,
            concurrency: self.backup.concurrency.map_or(0, |n| n as usize),
            ..BackupRequest::v2(&bvol, &self.name, snap, self.volume_size.div_ceil(bs) * bs)
        };
        backupstore::ops::check_request(&req, base.as_ref()).map_err(named)?;
        // nothing changed since the base (an idle volume): no block to read
        let opening = async {
            match read.same_as_base(&inv) {
                true => Ok(None),
                false => BackupReader::open(&self.client, &inv, read).await.map(Some),
            }
        };
        // the reader opens (its exports, the allocation map's copies) while
        // the lock settles: Longhorn's protocol waits 2 s before a lock
        // counts, and the reader only reads, so nothing reaches the store
        // before the lock is held
        let (lock, reader) = futures::join!(
            backupstore::lock::Lock::acquire(&store, &bvol, backupstore::lock::LockKind::Use),
            opening
        );
        let reader = match reader {
            Ok(r) => r,
            Err(e) => {
                if let Ok(l) = lock {
                    l.release().await;
                }
                return Err(reading(e));
            }
        };
        if let Some(r) = &reader {
            match r.mapped() {
                Some(b) => {
                    tracing::info!(backup = %self.name, mapped_mib = b >> 20, volume_mib = self.volume_size >> 20,
                    "the backup reads what its snapshot's chain holds (allocation map)")
                }
                None => tracing::info!(backup = %self.name, volume_mib = self.volume_size >> 20,
                    "the backup reads every block (no allocation map)"),
            }
        }
        let made = match lock {
            Err(e) => Err(Failed::Other(named(e))),
            Ok(lock) => {
                let blocks = match &reader {
                    Some(r) => r.blocks(bs),
                    None => futures::stream::empty().boxed(),
                };
                backupstore::ops::create_held(&store, lock, &req, blocks, base.as_ref(), &self.progress)
                    .await
                    .map_err(|e| match e {
                        e @ backupstore::BackupError::ReadSnapshot { .. } => Failed::Read(named(e)),
                        e => Failed::Other(named(e)),
                    })
            }
        };
        // the exports go on every path (a stopped task drops the reader: its sessions remove them)
        if let Some(reader) = reader
            && let Err(e) = reader.close().await
        {
            tracing::warn!(backup = %self.name, error = %crate::util::error_chain(&e), "closing a backup's reads");
        }
        let incremental = base.is_some();
        made.map(|(cfg, stats)| (cfg, stats, incremental))
    }
}

/// Where backup `b` reads its snapshot, the volume's size and the
/// snapshot's time; `Err`: the status to report instead (waiting, or why
/// it cannot be done).
fn source(
    ctx: &ReconcileContext,
    b: &Typed<Backup>,
) -> Result<Result<(Source, u64, String), BackupStatus>, ControllerError> {
    if let Some(lh) = &b.spec.longhorn {
        let Some(r) = ctx.get::<LonghornReplica>(&lh.replica)?.map(|r| r.spec) else {
            return Ok(Err(status(
                BackupState::Error,
                format!("Longhorn replica {} is not on this node", lh.replica),
            )));
        };
        if r.volume != b.spec.volume {
            return Ok(Err(status(
                BackupState::Error,
                format!(
                    "Longhorn replica {} is of volume {}, not {}",
                    lh.replica, r.volume, b.spec.volume
                ),
            )));
        }
        let source = Source::Longhorn {
            lvs: lvstore(&r.disk),
            replica: lh.replica.clone(),
        };
        return Ok(Ok((source, r.size_bytes, lh.snapshot_created.clone())));
    }
    let sid = snapshot_id(&b.spec.volume, &b.spec.snapshot);
    let snap = ctx.get::<SnapshotStatus>(&sid)?.map(|s| s.spec);
    let Some(snap) = snap.filter(|s| s.state == ObjectState::Ready) else {
        return Ok(Err(status(
            BackupState::Pending,
            format!("waiting for snapshot {sid} to be ready"),
        )));
    };
    if snap.engine != Engine::V2 {
        return Ok(Err(status(
            BackupState::Error,
            format!("snapshot {sid} is a V1 snapshot: backups are of V2 volumes"),
        )));
    }
    let Some(vol) = ctx.get::<Volume>(&b.spec.volume)?.map(|v| v.spec) else {
        return Ok(Err(status(
            BackupState::Error,
            format!("volume {} not found", b.spec.volume),
        )));
    };
    let recorded = ctx
        .get::<ReplicaLedger>(&b.spec.volume)?
        .and_then(|l| l.spec.snapshot_set(&b.spec.snapshot));
    let source = Source::Volume {
        recorded,
        superblock: vol.raid_superblock && vol.replicas + vol.remote_replicas.len() as u32 > 1,
    };
    Ok(Ok((source, vol.size_bytes, snap.created)))
}

#[async_trait::async_trait]
impl Controller for BackupController {
    fn name(&self) -> &'static str {
        "engine.BackupController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::of::<Backup>(),
            Input::of::<Volume>(),
            Input::of::<SnapshotStatus>(),
            Input::of::<ReplicaLedger>(),
            Input::of::<LonghornReplica>(),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<BackupStatus>()]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let backups = ctx.list::<Backup>()?;
        let wanted: BTreeSet<String> = backups.iter().map(|b| b.id().to_string()).collect();
        // a deleted Backup: its task stops (the lock is released in the background)
        for id in self.running.keep_only(&wanted, true) {
            self.forget_credentials(&id);
        }
        for s in ctx.list::<BackupStatus>()? {
            if !wanted.contains(s.id()) {
                ctx.destroy::<BackupStatus>(s.id())?;
            }
        }
        self.sweep_once().await;
        // first every task's progress or end, then the queue: a backup queued
        // behind one that ended starts now, whatever their names' order
        let mut queued = Vec::new();
        for b in &backups {
            let id = b.id().to_string();
            let prev = ctx.get::<BackupStatus>(&id)?.map(|s| s.spec);
            if let Some(s) = &prev
                && matches!(s.state, BackupState::Completed | BackupState::Error)
            {
                ctx.apply(&id, s.clone())?;
                continue;
            }
            match self.running.seen(&id).await {
                Seen::Absent => queued.push(b),
                Seen::Running(p) => {
                    let mut s = prev.clone().unwrap_or_default();
                    s.state = BackupState::InProgress;
                    s.progress = p.min(99);
                    ctx.apply(&id, s)?;
                }
                Seen::Ended(outcome) => {
                    let s = match outcome {
                        Ok((cfg, stats, incremental)) => completed(b, &cfg, Some(&stats), incremental),
                        Err(e) => status(BackupState::Error, e),
                    };
                    if b.spec.longhorn.is_some() {
                        self.forget_credentials(&id);
                    }
                    ctx.apply(&id, s)?;
                }
            }
        }
        let mut busy = self.running.any();
        for b in queued {
            let id = b.id().to_string();
            if let Some(other) = &busy {
                ctx.apply(
                    &id,
                    status(BackupState::Pending, format!("waiting for backup {other}")),
                )?;
                continue;
            }
            if let Err(e) = backupstore::format::check_backup_name(&id)
                .and_then(|_| backupstore::format::check_backup_volume_name(b.spec.backup_volume()))
            {
                ctx.apply(&id, status(BackupState::Error, e.to_string()))?;
                continue;
            }
            let (source, volume_size, snapshot_created) = match source(ctx, b)? {
                Ok(found) => found,
                Err(s) => {
                    ctx.apply(&id, s)?;
                    continue;
                }
            };
            let progress = Arc::new(Progress::default());
            let job = Job {
                client: self.client.clone(),
                backup: b.spec.clone(),
                name: id.clone(),
                volume_size,
                source,
                snapshot_created,
                progress: progress.clone(),
            };
            self.running.start(&id, progress, job.run());
            busy = Some(id.clone());
            ctx.apply(
                &id,
                BackupStatus {
                    state: BackupState::InProgress,
                    ..Default::default()
                },
            )?;
        }
        if !self.running.is_empty() {
            Ok(Requeue::After(POLL))
        } else if !self.swept.load(std::sync::atomic::Ordering::Relaxed) {
            // spdk_tgt did not answer yet: what an earlier talon left is looked for again
            Ok(Requeue::After(SWEEP_RETRY))
        } else {
            Ok(Requeue::OnInputChange)
        }
    }
}
