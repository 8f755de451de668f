//! The restore of a new V2 volume from a backup (`Volume.fromBackup`), as
//! the volume controller asks for it before the volume's first replicas
//! are made, and a standby (DR) volume's data kept at its backup volume's
//! newest backup until it is activated.
//!
//! ```text
//!   no replica of it yet, no ledger ─> a task: the backup restored into
//!     <data_dir>/restore/<volume>.img (sparse; the data at the raid
//!     superblock's room), each block checked; what it holds recorded
//!     beside it (<volume>.img.json) ─> Held
//!   Held, standby ─> every pollSeconds: the backup volume's newest complete
//!     backup, when another: the record first marked `updating` (synced),
//!     then the blocks that differ fetched, then the record names the newer
//!     one ─> Held (the newer one)
//!   Held, updating (an update failed or was cut off: the file holds parts
//!     of two backups) ─> never served; at the next look the newest
//!     restored in full ─> Held (the newest)
//!   Held, its backup deleted from the store ─> the newest restored in full
//!   Held, standby cleared (activated) ─> brought to the newest once more
//!   Held, not standby ─> Ready(file) ─> VolumePlan.restore = file ─> its
//!     local replicas made from it (Make::Restore) ─> served ─> file removed
//!   a replica cut off in its copy (still an esnap clone) ─> deleted first
//! ```
//!
//! Once a replica of the volume exists or it was served (a ledger), the
//! backup is never restored again: a replica made later is rebuilt from
//! the others like any new replica. A talon restarted while a volume is
//! held (standby, or between its restore and its replicas) takes the file
//! up again from its record; a file without one (a restore cut off) is
//! restored again in full, and so is a file whose record says an update
//! was under way (a follow cut off): which of its blocks hold which backup
//! is not known, so nothing in it is trusted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::backupstore::{self, Progress};
use crate::resources::config::{BackupSource, Volume};
use crate::spdk::SpdkClient;
use crate::spdk::naming;
use crate::spdk::volume::Inventory;
use crate::spdk::volume::from_file;
use crate::spdk::volume::plan::{RestoreFile, superblock_room};

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

/// What a restore file holds: recorded beside it (`<volume>.img.json`)
/// once it holds it whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Held {
    target: String,
    backup_volume: String,
    backup: String,
    data_offset: u64,
    /// Made for a standby volume: brought to the newest backup before its
    /// replicas are made.
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

    fn file(&self, file: &Path) -> RestoreFile {
        RestoreFile {
            file: file.to_owned(),
            data_offset: self.data_offset,
        }
    }
}

/// A restore into a volume's file: what it holds once it ends, with what
/// the restore fetched (none when there was nothing newer).
type RestoreTask = tokio::task::JoinHandle<Result<(Held, Option<backupstore::ops::RestoreStats>), TaskError>>;

/// How a restore task failed: why, and what the file holds after it (none:
/// a first restore, nothing held).
#[derive(Debug)]
struct TaskError {
    message: String,
    held: Option<Held>,
}

impl From<String> for TaskError {
    /// A failure of a first restore: the file holds nothing.
    fn from(message: String) -> Self {
        Self { message, held: None }
    }
}

/// One volume's restore, as [`Restores::step`] works on it.
struct Job<'a> {
    vol: &'a str,
    src: &'a BackupSource,
    spec: &'a Volume,
    /// `<dir>/<volume>.img`.
    file: PathBuf,
    dir: &'a Path,
    /// Where the volume's data starts in the file.
    data_offset: u64,
}

/// What [`Restores::decide`] found.
enum Decision {
    /// The step to report.
    Now(Step),
    /// No task and no file held: a full restore starts.
    Start,
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
        /// What the file held before (a standby's follow).
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
        /// What the last restore into the file fetched: blocks, of how many.
        fetched: Option<(u64, u64)>,
    },
    Failed(String),
}

/// The restores of the volumes being made.
#[derive(Debug, Default)]
pub struct Restores {
    /// Where restored files are made.
    work_dir: Option<PathBuf>,
    tasks: Mutex<BTreeMap<String, Task>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the record of what `file` holds is.
fn record_path(file: &Path) -> PathBuf {
    let mut p = file.as_os_str().to_owned();
    p.push(".json");
    PathBuf::from(p)
}

/// The record of what `file` holds, if it is there and readable.
fn read_record(file: &Path) -> Option<Held> {
    let b = std::fs::read(record_path(file)).ok()?;
    serde_json::from_slice(&b).ok()
}

/// Records what `file` holds (written whole, then renamed into place, after
/// the file's data is on disk).
fn write_record(file: &Path, held: &Held) -> Result<(), String> {
    let path = record_path(file);
    let tmp = path.with_extension("json.tmp");
    let err = |e: std::io::Error| format!("recording {}: {e}", path.display());
    std::fs::File::open(file)
        .and_then(|f| f.sync_all())
        .map_err(err)?;
    let body = serde_json::to_vec(held).map_err(|e| format!("recording {}: {e}", path.display()))?;
    std::fs::write(&tmp, body).map_err(err)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)
}

impl Restores {
    /// Restores under `<data_dir>/restore/`.
    pub fn new(data_dir: &std::path::Path) -> Self {
        Self {
            work_dir: Some(data_dir.join("restore")),
            tasks: Mutex::default(),
        }
    }

    /// What to do about volume `vol` (`spec`): `served` when it has a
    /// ledger; `superblock` when its replicas hold a raid superblock.
    pub async fn step(
        &self,
        client: &SpdkClient,
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
        let exists =
            (0..spec.replicas.max(1) as usize).any(|k| inv.find_lvol(&naming::replica(vol, k)).is_some());
        if exists {
            match from_file::remove_unfinished(client, inv, vol).await {
                Ok(gone) if !gone.is_empty() => {
                    return Step::Waiting(format!(
                        "removed {} (its restore was cut off); restoring again",
                        gone.join(", ")
                    ));
                }
                Ok(_) => {
                    // made from the backup before: the others are rebuilt from them
                    self.finish(vol);
                    return Step::None;
                }
                Err(e) => return Step::Failed(format!("volume {vol}: {e}")),
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
        let job = Job {
            vol,
            src,
            spec,
            file: dir.join(format!("{vol}.img")),
            dir,
            data_offset,
        };
        // a finished task's result taken, then decided again (at most twice)
        for _ in 0..3 {
            match self.decide(&job) {
                Decision::Now(step) => return step,
                Decision::Start => return self.start_full(&job),
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
            // a talon restarted: the file is taken up again when its record fits
            match read_record(&job.file).filter(|h| {
                h.target == src.target
                    && h.backup_volume == src.backup_volume
                    && h.data_offset == job.data_offset
                    && job.file.exists()
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
                    return Decision::Now(Step::Ready(held.file(&job.file)));
                }
                // a standby's look for a newer backup, or an activation's last one
                let before = held.clone();
                let progress = Arc::new(Progress::default());
                let handle = tokio::spawn(follow(
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

    /// Takes a finished task's result: what the file holds now, or why the
    /// first restore failed (a failed look keeps what was held, and is tried
    /// again at the next poll).
    async fn settle(&self, vol: &str, handle: RestoreTask, before: Option<Held>) {
        let done = match handle.await {
            Ok(r) => r,
            // a task that panicked or was aborted mid-write: its file is not trusted
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
            // a follow that failed: the file holds what the task says (an update cut
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

    /// Nothing held: the backup restored in full into the file, then recorded.
    fn start_full(&self, job: &Job<'_>) -> Step {
        let progress = Arc::new(Progress::default());
        let (src, size, p) = (job.src.clone(), job.spec.size_bytes, progress.clone());
        let (file, dir, data_offset) = (job.file.clone(), job.dir.to_owned(), job.data_offset);
        let follows = job.spec.standby;
        let doing = src.backup.clone();
        let message = format!("restoring backup {doing} of {}: started", src.backup_volume);
        let handle = tokio::spawn(given_back(file.clone(), async move {
            std::fs::create_dir_all(&dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
            let _ = std::fs::remove_file(record_path(&file));
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
                ));
            }
            // a standby holds the newest (the one asked for may be gone since)
            let name = match cfg.last_backup_name.as_str() {
                newest if follows && !newest.is_empty() => newest.to_owned(),
                _ => src.backup.clone(),
            };
            let stats = backupstore::ops::restore_to_file(
                &store,
                &src.backup_volume,
                &name,
                &file,
                data_offset,
                &p,
            )
            .await
            .map_err(|e| format!("backup {name} of {}: {e}", src.backup_volume))?;
            // as large as a replica lvol: the volume's whole MiB after the room
            let len = data_offset + size.div_ceil(MIB) * MIB;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .and_then(|f| f.set_len(len))
                .map_err(|e| format!("{}: {e}", file.display()))?;
            let held = Held::of(&src, &name, data_offset, follows);
            write_record(&file, &held)?;
            Ok((held, Some(stats)))
        }));
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

    /// The volume is served (or gone): its restore file is removed.
    pub fn finish(&self, vol: &str) {
        let removed = lock(&self.tasks).remove(vol);
        if let Some(Task::Running { handle, .. }) = removed {
            handle.abort();
        }
        if let Some(dir) = &self.work_dir {
            let file = dir.join(format!("{vol}.img"));
            let _ = std::fs::remove_file(record_path(&file));
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A full restore into `file` that removes the file and its record when it
/// fails: a partial file holds nothing usable (the next try restores in
/// full), and on a full disk it would keep the data dir full.
async fn given_back<T>(
    file: PathBuf,
    restore: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, TaskError> {
    let r = restore.await;
    if r.is_err() {
        give_back(&file);
    }
    r.map_err(TaskError::from)
}

/// Removes `file` and its record: what it held is not trusted, and its room
/// on the data dir is given back.
fn give_back(file: &Path) {
    let _ = std::fs::remove_file(record_path(file));
    let _ = std::fs::remove_file(file);
}

/// Brings a standby volume's file (holding `held`) to its backup volume's
/// newest complete backup, when that is another: only the blocks that
/// differ are fetched when the file holds `held` whole and that backup is
/// still in the store; otherwise (an update cut off before, or the backup
/// it holds deleted) the newest is restored in full. The record is marked
/// `updating` (synced) before the file is written and names the newest
/// only after it is whole, so a failure or a stop at any point leaves a
/// record that says the file holds no backup. `standby` false: the
/// activation's last look (the file is used once it ends).
async fn follow(
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
        .ok_or_else(|| kept(format!("backup volume {} not found in {}", src.backup_volume, src.target)))?;
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
            write_record(&file, &next).map_err(kept)?;
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
    // a delta needs the held backup whole in the file and its block list in the store
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
    // from here the file is written: until it is whole, its record says it holds no
    // backup (a full restore makes the file anew: no record at all says the same)
    let updating = Held {
        updating: Some(newest.clone()),
        ..held.clone()
    };
    if base.is_some() {
        write_record(&file, &updating).map_err(kept)?;
    } else {
        let _ = std::fs::remove_file(record_path(&file));
    }
    // a failure from here: the file holds no backup; it and its record go (the next
    // look restores in full, into a new file), so a full data dir is given back
    let cut = |message: String| {
        give_back(&file);
        TaskError {
            message,
            held: Some(updating.clone()),
        }
    };
    let stats = match &base {
        Some(base) => {
            backupstore::ops::restore_delta_to_file(
                &store,
                &src.backup_volume,
                base,
                &newest,
                &file,
                held.data_offset,
                &progress,
            )
            .await
        }
        None => {
            backupstore::ops::restore_to_file(
                &store,
                &src.backup_volume,
                &newest,
                &file,
                held.data_offset,
                &progress,
            )
            .await
        }
    }
    .map_err(|e| cut(named(e)))?;
    // a full restore makes the file the volume's size: as large as a replica lvol again
    let len = held.data_offset + size.div_ceil(MIB) * MIB;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .and_then(|f| f.set_len(len))
        .map_err(|e| cut(format!("{}: {e}", file.display())))?;
    let next = Held {
        backup: newest,
        follows: standby,
        updating: None,
        ..held
    };
    write_record(&file, &next).map_err(cut)?;
    Ok((next, Some(stats)))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;
    use crate::backupstore::{BackupCfg, BackupRequest, Credentials, SparseImage, Store, ops};

    const SIZE: u64 = 8 * MIB;

    /// A backup of an image of SIZE bytes with `writes` (at, seed), on top of `base`.
    async fn backup(
        store: &Store,
        dir: &Path,
        name: &str,
        writes: &[(u64, u8)],
        base: Option<&BackupCfg>,
    ) -> BackupCfg {
        let image = dir.join(format!("{name}.src"));
        let f = std::fs::File::create(&image).expect("create");
        f.set_len(SIZE).expect("set_len");
        for (at, seed) in writes {
            f.write_all_at(&vec![*seed; MIB as usize], *at)
                .expect("write_all_at");
        }
        let req = BackupRequest::v2("src", name, name, SIZE);
        let img = SparseImage::open(&image, 0, SIZE).expect("image");
        ops::create(store, &req, &img, base, &Progress::default())
            .await
            .expect("backup")
            .0
    }

    /// Steps until `done` says so (bounded).
    async fn step_until(r: &Restores, spec: &Volume, done: impl Fn(&Step) -> bool) -> Step {
        let (client, inv) = (SpdkClient::new("/nonexistent/spdk.sock"), Inventory::default());
        for _ in 0..400 {
            let s = r.step(&client, &inv, "dr", spec, false, false).await;
            if done(&s) {
                return s;
            }
            assert!(!matches!(s, Step::Failed(_)), "{s:?}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let last = r.step(&SpdkClient::new("/nonexistent/spdk.sock"), &Inventory::default(), "dr", spec, false, false).await;
        panic!("no such step; the last: {last:?}");
    }

    fn holds(backup: &str) -> impl Fn(&Step) -> bool + '_ {
        move |s| matches!(s, Step::Standby { backup: Some(b), busy: false, .. } if b == backup)
    }

    /// A standby volume `dr` of backup volume `src` in `target`, from backup `b1`.
    fn standby(target: &str) -> Volume {
        Volume {
            size_bytes: SIZE,
            replicas: 1,
            engine: Default::default(),
            frontend: Default::default(),
            disks: Vec::new(),
            from_snapshot: None,
            from_backup: Some(BackupSource {
                target: target.to_owned(),
                credential_secret: None,
                backup_volume: "src".into(),
                backup: "b1".into(),
                poll_seconds: Some(1),
            }),
            standby: true,
            revert_to: None,
            revert_generation: 0,
            remote_replicas: Vec::new(),
            serve_replica: None,
            replica_hosts: Vec::new(),
            raid_superblock: false,
        }
    }

    /// Damages backup `b`'s block at `at` in the vfs store under `root`
    /// (its bytes changed in place, so reading it fails its checksum).
    fn corrupt(root: &Path, b: &BackupCfg, at: u64) {
        let sum = &b.blocks.iter().find(|r| r.offset == at).expect("block").checksum;
        let path = root.join(crate::backupstore::format::block_path("src", sum));
        let path = if path.exists() {
            path
        } else {
            root.join("backupstore").join(crate::backupstore::format::block_path("src", sum))
        };
        let mut bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for x in bytes.iter_mut().skip(16) {
            *x ^= 0x5a;
        }
        std::fs::write(&path, bytes).expect("write");
    }

    /// The volume's data in `file` is backup `name` restored, block by block.
    async fn assert_holds(store: &Store, dir: &Path, file: &Path, name: &str) {
        let want = dir.join(format!("want-{name}.img"));
        ops::restore_to_file(store, "src", name, &want, 0, &Progress::default())
            .await
            .expect("restore");
        let (got, want) = (std::fs::read(file).expect("read"), std::fs::read(&want).expect("read"));
        for (k, (g, w)) in got[..SIZE as usize]
            .chunks(MIB as usize)
            .zip(want.chunks(MIB as usize))
            .enumerate()
        {
            assert!(g == w, "MiB {k} of {} is not backup {name}'s", file.display());
        }
    }

    /// A standby holding b1 whose update to b2 failed on b2's damaged block.
    async fn failed_update(store: &Store, dir: &Path, r: &Restores, spec: &Volume) -> (BackupCfg, BackupCfg) {
        let b1 = backup(store, dir, "b1", &[(0, 1), (4 * MIB, 2)], None).await;
        step_until(r, spec, holds("b1")).await;
        // b2 changes three of the four 2 MiB blocks; its last one is damaged
        let b2 = backup(store, dir, "b2", &[(0, 5), (2 * MIB, 6), (6 * MIB, 7)], Some(&b1)).await;
        corrupt(&dir.join("store"), &b2, 6 * MIB);
        let s = step_until(r, spec, |s| {
            matches!(s, Step::Standby { message, busy: false, .. } if message.contains("failed"))
        })
        .await;
        let Step::Standby { backup, message, .. } = s else { panic!("{s:?}") };
        assert_eq!(backup, None, "a file part way between b1 and b2 holds no backup: {message}");
        assert!(message.contains("holds no whole backup"), "{message}");
        (b1, b2)
    }

    #[tokio::test]
    async fn a_standby_whose_update_failed_and_whose_newer_backup_was_deleted_serves_exactly_the_older_backup() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = format!("vfs://{}", dir.path().join("store").display());
        std::fs::create_dir(dir.path().join("store")).expect("the target's folder");
        let store = Store::open(&target, &Credentials::none()).expect("store");
        let data = dir.path().join("data");
        let r = Restores::new(&data);
        let mut spec = standby(&target);
        failed_update(&store, dir.path(), &r, &spec).await;
        let file = data.join("restore/dr.img");
        assert!(
            !file.exists() && read_record(&file).is_none(),
            "a file part way between two backups is removed with its record"
        );
        ops::delete(&store, "src", "b2").await.expect("delete b2");
        spec.standby = false;
        let s = step_until(&r, &spec, |s| matches!(s, Step::Ready(_))).await;
        let Step::Ready(f) = s else { panic!("not ready") };
        assert_holds(&store, dir.path(), &f.file, "b1").await;
        assert_eq!(
            read_record(&file).map(|h| (h.backup, h.updating)),
            Some(("b1".into(), None))
        );
    }

    #[tokio::test]
    async fn a_cut_off_update_then_a_backup_like_the_one_held_is_restored_in_full_over_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = format!("vfs://{}", dir.path().join("store").display());
        std::fs::create_dir(dir.path().join("store")).expect("the target's folder");
        let store = Store::open(&target, &Credentials::none()).expect("store");
        let data = dir.path().join("data");
        let spec = standby(&target);
        let (b1, _) = failed_update(&store, dir.path(), &Restores::new(&data), &spec).await;
        // a restart, then a newer backup whose blocks are b1's: nothing differs from b1
        let r = Restores::new(&data);
        backup(&store, dir.path(), "b3", &[], Some(&b1)).await;
        let s = step_until(&r, &spec, holds("b3")).await;
        let file = data.join("restore/dr.img");
        assert_holds(&store, dir.path(), &file, "b3").await;
        assert!(
            matches!(&s, Step::Standby { message, .. } if !message.contains("fetched 0 of")),
            "restored in full, not as a delta from b1: {s:?}"
        );
    }

    #[tokio::test]
    async fn activation_when_the_held_backup_was_deleted_restores_the_newest_in_full() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = format!("vfs://{}", dir.path().join("store").display());
        std::fs::create_dir(dir.path().join("store")).expect("the target's folder");
        let store = Store::open(&target, &Credentials::none()).expect("store");
        let data = dir.path().join("data");
        let r = Restores::new(&data);
        let mut spec = standby(&target);
        let b1 = backup(&store, dir.path(), "b1", &[(0, 1), (4 * MIB, 2)], None).await;
        step_until(&r, &spec, holds("b1")).await;
        // no look for a newer backup before the activation
        if let Some(src) = spec.from_backup.as_mut() {
            src.poll_seconds = Some(3600);
        }
        backup(&store, dir.path(), "b2", &[(2 * MIB, 3)], Some(&b1)).await;
        ops::delete(&store, "src", "b1").await.expect("delete b1");
        spec.standby = false;
        let s = step_until(&r, &spec, |s| matches!(s, Step::Ready(_))).await;
        let Step::Ready(f) = s else { panic!("not ready") };
        assert_holds(&store, dir.path(), &f.file, "b2").await;
    }

    #[tokio::test]
    async fn a_standby_volume_follows_its_backups_keeps_them_over_a_restart_and_is_ready_once_activated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = format!("vfs://{}", dir.path().join("store").display());
        std::fs::create_dir(dir.path().join("store")).expect("the target's folder");
        let store = Store::open(&target, &Credentials::none()).expect("store");
        let b1 = backup(&store, dir.path(), "b1", &[(0, 1), (4 * MIB, 2)], None).await;
        let mut spec = standby(&target);
        let data = dir.path().join("data");
        let r = Restores::new(&data);
        step_until(&r, &spec, holds("b1")).await;
        let file = data.join("restore/dr.img");
        assert_eq!(read_record(&file).map(|h| h.backup), Some("b1".into()));

        // b2 changes the second MiB: only its block is fetched
        let b2 = backup(&store, dir.path(), "b2", &[(MIB, 3)], Some(&b1)).await;
        let s = step_until(&r, &spec, holds("b2")).await;
        assert!(
            matches!(&s, Step::Standby { message, .. } if message.contains("fetched 1 of")),
            "{s:?}"
        );

        // a new process (a restart of talon): the file is taken up again, not restored anew
        let written = std::fs::metadata(&file)
            .and_then(|m| m.modified())
            .expect("mtime");
        let r = Restores::new(&data);
        step_until(&r, &spec, holds("b2")).await;
        assert_eq!(
            std::fs::metadata(&file)
                .and_then(|m| m.modified())
                .expect("mtime"),
            written
        );

        // activated after b3: the newest is restored once more, then the file is used
        backup(&store, dir.path(), "b3", &[(6 * MIB, 4)], Some(&b2)).await;
        spec.standby = false;
        let s = step_until(&r, &spec, |s| matches!(s, Step::Ready(_))).await;
        let Step::Ready(f) = s else { panic!("not ready") };
        let want = dir.path().join("want.img");
        ops::restore_to_file(&store, "src", "b3", &want, 0, &Progress::default())
            .await
            .expect("restore b3");
        let got = std::fs::read(&f.file).expect("read");
        assert!(
            got[..SIZE as usize] == std::fs::read(&want).expect("read")[..],
            "the file holds b3"
        );
        assert_eq!(
            read_record(&file).map(|h| (h.backup, h.follows)),
            Some(("b3".into(), false))
        );

        r.finish("dr");
        assert!(
            !file.exists() && !record_path(&file).exists(),
            "finish removes the file and its record"
        );
    }
}
