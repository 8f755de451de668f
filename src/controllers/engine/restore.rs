//! The restore of a new V2 volume from a backup (`Volume.fromBackup`), as
//! the volume controller asks for it before the volume's first replicas
//! are made, and a standby (DR) volume's data kept at its backup volume's
//! newest backup until it is activated.
//!
//! ```text
//!   no replica of it yet, no ledger, not standby ─> the store checked
//!     (the backup volume there, no larger than the volume) ─>
//!     Ready(Source::Backup) ─> its local replicas made straight from the
//!     store (spdk::volume::mover::restore: only blocks with data written,
//!     into thin lvols; no file on the data dir) ─> served
//!   no replica of it yet, no ledger, standby ─> a task: thin lvols
//!     <lvs>/<replica>.dr made (one a disk, up to its replica count, on
//!     disks whose superblock room is the data offset), the backup
//!     streamed into them all (spdk::volume::mover::restore::fill_standby:
//!     each block fetched once, only chunks with data written; no file on
//!     the data dir); what they hold recorded in <data_dir>/standby/<volume>.json ─> Held
//!   Held, standby ─> every pollSeconds: the backup volume's newest complete
//!     backup, when another: the record first marked `updating` (synced),
//!     then only the blocks that differ written into the lvols, whole
//!     (a block that became zeros, or is no longer mapped, written as
//!     zeros), then the record names the newer one ─> Held (the newer one)
//!   Held, updating (an update failed or was cut off: the lvols hold parts
//!     of two backups) ─> never served; at the next look the lvols made
//!     anew and the newest restored in full ─> Held (the newest)
//!   Held, its backup deleted from the store ─> the newest restored in full
//!   Held, standby cleared (activated) ─> brought to the newest once more
//!   Held, not standby (activated) ─> the lvols renamed <replica> ─> the
//!     record removed ─> the replicas exist: served like any volume's
//!   a replica cut off in its copy (still named <replica>.rst, see
//!     spdk::volume::mover::restore) ─> deleted first
//! ```
//!
//! Once a replica of the volume exists or it was served (a ledger), the
//! backup is never restored again: a replica made later is rebuilt from
//! the others like any new replica. A talon restarted while a volume is
//! a standby takes its lvols up again from the record; lvols without one
//! (a restore cut off) are made anew and restored in full, and so are
//! lvols whose record says an update was under way (a follow cut off):
//! which of their blocks hold which backup is not known, so nothing in
//! them is trusted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::backupstore::{self, Progress};
use crate::resources::config::{BackupSource, Volume};
use crate::spdk::naming;
use crate::spdk::volume::mover::standby::{StandbyLvol, StandbyLvols, StandbyLvolsError};
use crate::spdk::volume::plan::{RestoreFile, superblock_room};
use crate::spdk::volume::{Inventory, VolumeOps};
use crate::spdk::volume::{from_file, mover};

const MIB: u64 = 1 << 20;
/// A standby volume's check for a newer backup, by default.
const DEFAULT_POLL_SECONDS: u32 = 60;

/// What the volume controller does about a volume's restore now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to restore (none asked, or done).
    None,
    /// Not ready yet: the reason, with progress.
    Waiting(String),
    /// It cannot be restored: why.
    Failed(String),
    /// Make the replicas from this file.
    Ready(RestoreFile),
    /// A standby volume, not served: the backup its data is.
    Standby {
        /// What it does.
        message: String,
        /// The backup it holds whole; none while an update of it is cut off.
        backup: Option<String>,
        /// A newer backup is being restored.
        busy: bool,
    },
}

/// What a standby volume's lvols hold: recorded in
/// `<data_dir>/standby/<volume>.json` once they hold it whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Held {
    target: String,
    backup_volume: String,
    backup: String,
    data_offset: u64,
    /// Brought to the newest backup before the volume is served (cleared
    /// by the activation's last look).
    follows: bool,
    /// An update of the file to this backup started and did not end (it
    /// failed, or talon stopped in it): the blocks where `backup` and this
    /// one differ may hold either, so the file holds no backup whole. It is
    /// never served, and the next update restores the newest in full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    updating: Option<String>,
}

impl Held {
    fn of(src: &BackupSource, backup: &str, data_offset: u64, follows: bool) -> Self {
        Self {
            target: src.target.clone(),
            backup_volume: src.backup_volume.clone(),
            backup: backup.to_owned(),
            data_offset,
            follows,
            updating: None,
        }
    }

    /// The file holds `backup` whole (no update of it was cut off).
    fn whole(&self) -> bool {
        self.updating.is_none()
    }

    /// What the file holds, in a status: the backup, or why none.
    fn says(&self, backup_volume: &str) -> String {
        match &self.updating {
            None => format!("holds backup {} of {backup_volume}", self.backup),
            Some(u) => format!(
                "holds no whole backup of {backup_volume} (its update from backup {} to {u} did not finish)",
                self.backup
            ),
        }
    }
}

/// A restore into a standby volume's lvols: what they hold once it ends, with what
/// the restore fetched (none when there was nothing newer).
type RestoreTask = tokio::task::JoinHandle<Result<(Held, Option<backupstore::ops::RestoreStats>), TaskError>>;

/// How a restore task failed: why, and what the lvols hold after it (none:
/// a first restore, nothing held).
#[derive(Debug)]
struct TaskError {
    message: String,
    held: Option<Held>,
}

impl From<String> for TaskError {
    /// A failure of a first restore: nothing is held.
    fn from(message: String) -> Self {
        Self { message, held: None }
    }
}

impl From<StandbyError> for TaskError {
    /// A failure of a first restore: nothing is held.
    fn from(e: StandbyError) -> Self {
        crate::util::error_chain(&e).into()
    }
}

/// A step on a standby's lvols or record that failed.
#[derive(Debug, thiserror::Error)]
enum StandbyError {
    /// Its record could not be written.
    #[error("recording {}", path.display())]
    Record {
        /// The record.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A step on its lvols failed.
    #[error(transparent)]
    Lvols(#[from] StandbyLvolsError),
}

/// One volume's restore, as [`Restores::step`] works on it.
struct Job<'a> {
    vol: &'a str,
    src: &'a BackupSource,
    spec: &'a Volume,
    /// The record of what the standby's lvols hold: `<dir>/<volume>.json`.
    file: PathBuf,
    dir: &'a Path,
    /// Where the volume's data starts in a replica.
    data_offset: u64,
    /// The engine's operations, for the tasks.
    ops: &'a VolumeOps,
    /// The standby's lvols there now.
    lvols: Vec<StandbyLvol>,
    /// The lvstores a first restore puts them on, best first.
    lvstores: Vec<String>,
}

/// What [`Restores::decide`] found.
enum Decision {
    /// The step to report.
    Now(Step),
    /// No task and nothing held: a full restore starts.
    Start,
    /// Activated and held whole: the lvols become the replicas.
    Activate,
    /// A task ended: its result is taken, then decided again.
    Settle(RestoreTask, Option<Held>),
    /// A task was started: decided again.
    Again,
}

#[derive(Debug)]
enum Task {
    Running {
        progress: Arc<Progress>,
        handle: RestoreTask,
        /// What the lvols held before (a standby's follow).
        before: Option<Held>,
        /// The backup being restored, when known.
        doing: String,
    },
    Held {
        held: Held,
        /// The last look for a newer backup.
        checked: Option<Instant>,
        /// How that look failed, if it did.
        error: Option<String>,
        /// What the last restore into the lvols fetched: blocks, of how many.
        fetched: Option<(u64, u64)>,
    },
    Failed(String),
}

/// The restores of the volumes being made.
#[derive(Debug, Default)]
pub struct Restores {
    /// Where the standby volumes' records are kept.
    work_dir: Option<PathBuf>,
    /// Where restore files were made (removed when found).
    old_dir: Option<PathBuf>,
    tasks: Mutex<BTreeMap<String, Task>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The record at `path`, if it is there and readable.
fn read_record(path: &Path) -> Option<Held> {
    let b = std::fs::read(path).ok()?;
    serde_json::from_slice(&b).ok()
}

/// Records what the lvols hold at `path` (written whole, synced, then
/// renamed into place; the lvols' writes were acknowledged before).
fn write_record(path: &Path, held: &Held) -> Result<(), StandbyError> {
    let tmp = path.with_extension("json.tmp");
    let err = |source: std::io::Error| StandbyError::Record {
        path: path.to_owned(),
        source,
    };
    let body = serde_json::to_vec(held).map_err(|e| err(e.into()))?;
    std::fs::write(&tmp, body).map_err(err)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

impl Restores {
    /// Standby records under `<data_dir>/standby/`.
    pub fn new(data_dir: &std::path::Path) -> Self {
        Self {
            work_dir: Some(data_dir.join("standby")),
            old_dir: Some(data_dir.join("restore")),
            tasks: Mutex::default(),
        }
    }

    /// What to do about volume `vol` (`spec`): `served` when it has a
    /// ledger; `superblock` when its replicas hold a raid superblock.
    pub async fn step(
        &self,
        ops: &VolumeOps,
        inv: &Inventory,
        vol: &str,
        spec: &Volume,
        served: bool,
        superblock: bool,
    ) -> Step {
        let Some(src) = &spec.from_backup else {
            return Step::None;
        };
        if served {
            self.finish(vol);
            return Step::None;
        }
        // remote replicas are not made from the file: they are rebuilt from the local ones
        if spec.serve_replica.is_some() {
            return Step::Failed(format!(
                "volume {vol}: a served replica (serveReplica) is not restored from a backup: its engine's node restores the volume"
            ));
        }
        // a replica the mover was writing when talon or spdk_tgt stopped
        match mover::restore::remove_unfinished(ops.client(), inv, vol).await {
            Ok(gone) if !gone.is_empty() => {
                tracing::info!(volume = %vol, lvols = ?gone, "removed replicas whose restore was cut off");
            }
            Ok(_) => {}
            Err(e) => return Step::Failed(format!("volume {vol}: {}", crate::util::error_chain(&e))),
        }
        let exists =
            (0..spec.replicas.max(1) as usize).any(|k| inv.find_lvol(&naming::replica(vol, k)).is_some());
        if exists {
            match from_file::remove_unfinished(ops.client(), inv, vol).await {
                Ok(gone) if !gone.is_empty() => {
                    return Step::Waiting(format!(
                        "removed {} (its restore was cut off); restoring again",
                        gone.join(", ")
                    ));
                }
                Ok(_) => {
                    // made from the backup before (or an activated standby's): the others
                    // are rebuilt from them; a standby lvol an activation left is dropped
                    if let Err(e) = StandbyLvols::remove_listed(ops, inv, vol).await {
                        return Step::Failed(format!("volume {vol}: {}", crate::util::error_chain(&e)));
                    }
                    self.finish(vol);
                    return Step::None;
                }
                Err(e) => return Step::Failed(crate::util::error_chain(&e)),
            }
        }
        let Some(dir) = &self.work_dir else {
            return Step::Failed("no data directory for restores".into());
        };
        // the raid's data offset on the replicas' disks (their smallest cluster)
        let data_offset = if superblock {
            match inv
                .lvstores
                .iter()
                .filter(|l| l.name.starts_with(naming::LVS_PREFIX))
                .map(|l| superblock_room(l.cluster_size))
                .min()
            {
                Some(r) => r,
                None => return Step::Waiting("waiting for a disk".into()),
            }
        } else {
            0
        };
        let lvstores = standby_lvstores(inv, spec, superblock, data_offset);
        let job = Job {
            vol,
            src,
            spec,
            file: dir.join(format!("{vol}.json")),
            dir,
            data_offset,
            ops,
            lvols: StandbyLvols::listed(inv, vol),
            lvstores,
        };
        // a finished task's result taken, then decided again (at most twice)
        for _ in 0..3 {
            match self.decide(&job) {
                Decision::Now(step) => return step,
                // a standby keeps its data in a file until activated; any other
                // volume's replicas are written from the store (no file)
                Decision::Start if spec.standby => return self.start_full(&job),
                Decision::Start => return direct(&job).await,
                Decision::Activate => return self.activate(&job).await,
                Decision::Settle(handle, before) => self.settle(vol, handle, before).await,
                Decision::Again => {}
            }
        }
        Step::Waiting(format!(
            "restoring backup {} of {}",
            src.backup, src.backup_volume
        ))
    }

    /// What the volume's task says now (under the lock, which is not held
    /// across an await): a step, a finished task to settle, or none yet.
    fn decide(&self, job: &Job<'_>) -> Decision {
        let (vol, src, spec) = (job.vol, job.src, job.spec);
        let mut tasks = lock(&self.tasks);
        if !tasks.contains_key(vol) {
            // a talon restarted: the lvols are taken up again when their record fits
            match read_record(&job.file).filter(|h| {
                h.target == src.target
                    && h.backup_volume == src.backup_volume
                    && h.data_offset == job.data_offset
                    && !job.lvols.is_empty()
            }) {
                Some(held) => tasks.insert(
                    vol.to_owned(),
                    Task::Held {
                        held,
                        checked: None,
                        error: None,
                        fetched: None,
                    },
                ),
                None => return Decision::Start,
            };
        }
        match tasks.get(vol) {
            None => Decision::Start,
            Some(Task::Failed(m)) => Decision::Now(Step::Failed(m.clone())),
            Some(Task::Running {
                progress,
                handle,
                before,
                doing,
            }) if !handle.is_finished() => {
                let pct = progress.get();
                Decision::Now(match before {
                    Some(h) if spec.standby => Step::Standby {
                        message: format!(
                            "standby: {}; restoring backup {doing}: {pct}%",
                            h.says(&src.backup_volume)
                        ),
                        backup: h.whole().then(|| h.backup.clone()),
                        busy: true,
                    },
                    Some(h) => Step::Waiting(format!(
                        "activating: {}; restoring the newest backup {doing}: {pct}%",
                        h.says(&src.backup_volume)
                    )),
                    None => Step::Waiting(format!(
                        "restoring backup {doing} of {} from {}: {pct}%",
                        src.backup_volume, src.target
                    )),
                })
            }
            Some(Task::Running { .. }) => match tasks.remove(vol) {
                Some(Task::Running { handle, before, .. }) => Decision::Settle(handle, before),
                _ => Decision::Start,
            },
            Some(Task::Held {
                held,
                checked,
                error,
                fetched,
            }) => {
                let poll =
                    Duration::from_secs(src.poll_seconds.unwrap_or(DEFAULT_POLL_SECONDS).max(1).into());
                let due = checked.is_none_or(|c| c.elapsed() >= poll);
                if spec.standby && !due {
                    let mut message = format!("standby: {}", held.says(&src.backup_volume));
                    if let Some((n, of)) = fetched.filter(|_| held.whole()) {
                        message.push_str(&format!(" (its restore fetched {n} of {of} blocks)"));
                    }
                    if let Some(e) = error {
                        message.push_str(&format!("; the last look for a newer backup failed: {e}"));
                    }
                    if !held.whole() {
                        message.push_str("; the next look restores the newest backup in full");
                    }
                    return Decision::Now(Step::Standby {
                        message,
                        backup: held.whole().then(|| held.backup.clone()),
                        busy: false,
                    });
                }
                if !spec.standby && !held.follows && held.whole() {
                    return Decision::Activate;
                }
                // a standby's look for a newer backup, or an activation's last one
                let before = held.clone();
                let progress = Arc::new(Progress::default());
                let handle = tokio::spawn(follow(
                    StandbyLvols::of(
                        job.ops,
                        vol,
                        job.lvols.clone(),
                        replica_mib(job.data_offset, spec.size_bytes),
                    ),
                    src.clone(),
                    before.clone(),
                    job.file.clone(),
                    spec.size_bytes,
                    spec.standby,
                    progress.clone(),
                ));
                tasks.insert(
                    vol.to_owned(),
                    Task::Running {
                        progress,
                        handle,
                        before: Some(before),
                        doing: "(the newest)".into(),
                    },
                );
                // decided again: the task just started reports itself
                Decision::Again
            }
        }
    }

    /// Takes a finished task's result: what the lvols hold now, or why the
    /// first restore failed (a failed look keeps what was held, and is tried
    /// again at the next poll).
    async fn settle(&self, vol: &str, handle: RestoreTask, before: Option<Held>) {
        let done = match handle.await {
            Ok(r) => r,
            // a task that panicked or was aborted mid-write: its lvols are not trusted
            Err(e) => Err(TaskError {
                message: format!("restore task: {e}"),
                held: before.clone().map(|h| Held {
                    updating: Some(h.updating.clone().unwrap_or_else(|| "(unknown)".into())),
                    ..h
                }),
            }),
        };
        let mut tasks = lock(&self.tasks);
        let last = match tasks.remove(vol) {
            Some(Task::Held { fetched, .. }) => fetched,
            _ => None,
        };
        let task = match done {
            Ok((held, stats)) => Task::Held {
                held,
                checked: Some(Instant::now()),
                error: None,
                fetched: stats.map(|s| (s.blocks_downloaded, s.blocks)).or(last),
            },
            // a follow that failed: the lvols hold what the task says (an update cut
            // off marks it, so it is never served as the backup it held before)
            Err(TaskError {
                message,
                held: Some(held),
            }) => Task::Held {
                held,
                checked: Some(Instant::now()),
                error: Some(message),
                fetched: last,
            },
            Err(TaskError { message, held: None }) => Task::Failed(message),
        };
        tasks.insert(vol.to_owned(), task);
    }

    /// Nothing held: the standby's lvols made anew, the backup restored in
    /// full into them, then recorded.
    fn start_full(&self, job: &Job<'_>) -> Step {
        if job.lvstores.is_empty() {
            return Step::Waiting(format!(
                "waiting for a disk for standby volume {} (none ready whose superblock room is {} bytes)",
                job.vol, job.data_offset
            ));
        }
        let progress = Arc::new(Progress::default());
        let (src, size, p) = (job.src.clone(), job.spec.size_bytes, progress.clone());
        let (file, dir, data_offset) = (job.file.clone(), job.dir.to_owned(), job.data_offset);
        let n = (job.spec.replicas.max(1) as usize).min(job.lvstores.len());
        let mut lvols = StandbyLvols::of(
            job.ops,
            job.vol,
            job.lvols.clone(),
            replica_mib(data_offset, size),
        );
        let on: Vec<String> = job.lvstores.iter().take(n).cloned().collect();
        let follows = job.spec.standby;
        let doing = src.backup.clone();
        let message = format!("restoring backup {doing} of {}: started", src.backup_volume);
        let handle = tokio::spawn(async move {
            std::fs::create_dir_all(&dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
            let _ = std::fs::remove_file(&file);
            let store = super::backup::open_store(&src.target, src.credential_secret.as_deref())?;
            let named =
                |e: backupstore::BackupError| format!("backup {} of {}: {e}", src.backup, src.backup_volume);
            let cfg = backupstore::ops::volume(&store, &src.backup_volume)
                .await
                .map_err(named)?
                .ok_or_else(|| format!("backup volume {} not found in {}", src.backup_volume, src.target))?;
            if cfg.size > size {
                return Err(format!(
                    "backup {} holds {} bytes: more than the volume's {size}",
                    src.backup, cfg.size
                )
                .into());
            }
            // a standby holds the newest (the one asked for may be gone since)
            let name = match cfg.last_backup_name.as_str() {
                newest if follows && !newest.is_empty() => newest.to_owned(),
                _ => src.backup.clone(),
            };
            lvols.remake(&on).await.map_err(StandbyError::from)?;
            let stats = lvols
                .fill(&store, &src.backup_volume, None, &name, data_offset, &p)
                .await;
            let stats = match stats {
                Ok(s) => s,
                Err(e) => {
                    // nothing half-made stays: the next try makes them anew
                    let _ = lvols.remove().await;
                    return Err(StandbyError::from(e).into());
                }
            };
            let held = Held::of(&src, &name, data_offset, follows);
            write_record(&file, &held)?;
            Ok((held, Some(stats)))
        });
        lock(&self.tasks).insert(
            job.vol.to_owned(),
            Task::Running {
                progress,
                handle,
                before: None,
                doing,
            },
        );
        Step::Waiting(message)
    }

    /// An activated standby that holds its newest backup whole: its lvols
    /// renamed to its replicas, then its record removed; the replicas are
    /// served at the next pass like any volume's.
    async fn activate(&self, job: &Job<'_>) -> Step {
        let lvols = StandbyLvols::of(job.ops, job.vol, job.lvols.clone(), 0);
        if let Err(e) = lvols.make_replicas().await {
            return Step::Failed(crate::util::error_chain(&e));
        }
        self.finish(job.vol);
        Step::Waiting(format!(
            "activating: {} replicas made from the standby's lvols",
            job.lvols.len()
        ))
    }

    /// Stops the restores of volumes not in `live` (deleted, or being
    /// deleted) and removes their files.
    pub fn retain(&self, live: &std::collections::BTreeSet<String>) {
        let gone: Vec<String> = lock(&self.tasks)
            .keys()
            .filter(|v| !live.contains(*v))
            .cloned()
            .collect();
        for v in gone {
            self.finish(&v);
        }
    }

    /// The volume is served (or gone): its standby record is removed (its
    /// lvols are its replicas by then, or deleted with it), and a restore
    /// file an older talon left.
    pub fn finish(&self, vol: &str) {
        let removed = lock(&self.tasks).remove(vol);
        if let Some(Task::Running { handle, .. }) = removed {
            handle.abort();
        }
        if let Some(dir) = &self.work_dir {
            let _ = std::fs::remove_file(dir.join(format!("{vol}.json")));
        }
        if let Some(dir) = &self.old_dir {
            let file = dir.join(format!("{vol}.img"));
            let _ = std::fs::remove_file(dir.join(format!("{vol}.img.json")));
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A volume that is no standby: its replicas are made straight from the
/// backup (mover::restore::fill_from_backup, no file on the data dir),
/// once the store says the backup volume is there and fits the volume
/// (the backup itself is checked complete, and each block, as it is written).
async fn direct(job: &Job<'_>) -> Step {
    let src = job.src;
    let store = match super::backup::open_store(&src.target, src.credential_secret.as_deref()) {
        Ok(s) => s,
        Err(e) => return Step::Failed(format!("volume {}: {e}", job.vol)),
    };
    match backupstore::ops::volume(&store, &src.backup_volume).await {
        Ok(Some(cfg)) if cfg.size > job.spec.size_bytes => {
            return Step::Failed(format!(
                "backup {} holds {} bytes: more than the volume's {}",
                src.backup, cfg.size, job.spec.size_bytes
            ));
        }
        Ok(Some(_)) => {}
        Ok(None) => {
            return Step::Failed(format!(
                "backup volume {} not found in {}",
                src.backup_volume, src.target
            ));
        }
        Err(e) => {
            return Step::Failed(format!("backup {} of {}: {e}", src.backup, src.backup_volume));
        }
    }
    match backupstore::ops::backup(&store, &src.backup_volume, &src.backup).await {
        Ok(b) if b.complete() => {}
        Ok(_) => {
            return Step::Failed(format!(
                "backup {} of {} is still in progress",
                src.backup, src.backup_volume
            ));
        }
        Err(e) => {
            return Step::Failed(format!("backup {} of {}: {e}", src.backup, src.backup_volume));
        }
    }
    Step::Ready(RestoreFile {
        from: mover::restore::Source::Backup(mover::restore::FromBackup {
            target: src.target.clone(),
            store,
            volume: src.backup_volume.clone(),
            backup: src.backup.clone(),
            data_offset: job.data_offset,
            progress: Arc::new(Progress::default()),
        }),
        data_offset: job.data_offset,
    })
}

/// A replica lvol's size in MiB: the raid superblock's room, then the
/// volume's whole MiB (as the volume plan makes it).
fn replica_mib(data_offset: u64, size: u64) -> u64 {
    size.div_ceil(MIB) + data_offset.div_ceil(MIB)
}

/// The lvstores a standby's lvols may go on, the most free first: talon's,
/// of the volume's disks when it names some, whose superblock room is the
/// data offset (what a replica there is served with).
fn standby_lvstores(inv: &Inventory, spec: &Volume, superblock: bool, data_offset: u64) -> Vec<String> {
    let mut l: Vec<&crate::spdk::rpc::Lvstore> = inv
        .lvstores
        .iter()
        .filter(|l| {
            l.name
                .strip_prefix(naming::LVS_PREFIX)
                .is_some_and(|d| spec.disks.is_empty() || spec.disks.iter().any(|x| x == d))
        })
        .filter(|l| !superblock || superblock_room(l.cluster_size) == data_offset)
        .collect();
    l.sort_by_key(|l| std::cmp::Reverse(l.free_clusters.saturating_mul(l.cluster_size)));
    l.into_iter().map(|l| l.name.clone()).collect()
}

/// Brings a standby volume's lvols (holding `held`, recorded at `file`)
/// to its backup volume's newest complete backup, when that is another:
/// only the blocks that differ are fetched and written when they hold
/// `held` whole and that backup is still in the store; otherwise (an
/// update cut off before, or the backup they hold deleted) the lvols are
/// made anew and the newest restored in full. The record is marked
/// `updating` (synced) before the lvols are written and names the newest
/// only after they are whole, so a failure or a stop at any point leaves a
/// record that says they hold no backup. `standby` false: the
/// activation's last look (the lvols become the replicas once it ends).
async fn follow(
    mut lvols: StandbyLvols,
    src: BackupSource,
    held: Held,
    file: PathBuf,
    size: u64,
    standby: bool,
    progress: Arc<Progress>,
) -> Result<(Held, Option<backupstore::ops::RestoreStats>), TaskError> {
    // a failure before the file is written: it holds what it held
    let kept = |message: String| TaskError {
        message,
        held: Some(held.clone()),
    };
    let store = super::backup::open_store(&src.target, src.credential_secret.as_deref()).map_err(kept)?;
    let cfg = backupstore::ops::volume(&store, &src.backup_volume)
        .await
        .map_err(|e| kept(format!("backup volume {}: {e}", src.backup_volume)))?
        .ok_or_else(|| {
            kept(format!(
                "backup volume {} not found in {}",
                src.backup_volume, src.target
            ))
        })?;
    let newest = cfg.last_backup_name;
    if newest.is_empty() || (newest == held.backup && held.whole()) {
        if !held.whole() {
            return Err(kept(format!(
                "backup volume {} has no complete backup to restore in full",
                src.backup_volume
            )));
        }
        let next = Held {
            follows: standby,
            ..held.clone()
        };
        if next != held {
            write_record(&file, &next).map_err(|e| kept(crate::util::error_chain(&e)))?;
        }
        return Ok((next, None));
    }
    if cfg.size > size {
        return Err(kept(format!(
            "backup {newest} of {} holds {} bytes: more than the volume's {size}",
            src.backup_volume, cfg.size
        )));
    }
    let named = |e: backupstore::BackupError| format!("backup {newest} of {}: {e}", src.backup_volume);
    let b = backupstore::ops::backup(&store, &src.backup_volume, &newest)
        .await
        .map_err(|e| kept(named(e)))?;
    if !b.complete() {
        // volume.cfg names a backup only once it is complete; a store that says otherwise waits
        return Ok((held, None));
    }
    // a delta needs the held backup whole in the lvols and its block list in the store
    let base = if held.whole() {
        match backupstore::ops::backup(&store, &src.backup_volume, &held.backup).await {
            Ok(b) if b.complete() => Some(held.backup.clone()),
            Ok(_) | Err(backupstore::BackupError::NotFound(_)) => None,
            Err(e) => {
                return Err(kept(format!(
                    "backup {} of {}: {e}",
                    held.backup, src.backup_volume
                )));
            }
        }
    } else {
        None
    };
    // from here the lvols are written: until they are whole, the record says they hold
    // no backup (the next look makes them anew and restores the newest in full)
    let updating = Held {
        updating: Some(newest.clone()),
        ..held.clone()
    };
    write_record(&file, &updating).map_err(|e| kept(crate::util::error_chain(&e)))?;
    let cut = |message: String| TaskError {
        message,
        held: Some(updating.clone()),
    };
    if base.is_none() {
        // the lvols hold no backup whole: made anew on the same lvstores
        let on: Vec<String> = lvols.lvols.iter().map(|l| l.lvs.clone()).collect();
        lvols
            .remake(&on)
            .await
            .map_err(|e| cut(crate::util::error_chain(&e)))?;
    }
    let stats = lvols
        .fill(
            &store,
            &src.backup_volume,
            base.as_deref(),
            &newest,
            held.data_offset,
            &progress,
        )
        .await
        .map_err(|e| cut(crate::util::error_chain(&e)))?;
    let next = Held {
        backup: newest,
        follows: standby,
        updating: None,
        ..held
    };
    write_record(&file, &next).map_err(|e| cut(crate::util::error_chain(&e)))?;
    Ok((next, Some(stats)))
}
