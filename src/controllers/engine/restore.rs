//! The restore of a new V2 volume from a backup (`Volume.fromBackup`), as
//! the volume controller asks for it before the volume's first replicas
//! are made.
//!
//! ```text
//!   no replica of it yet, no ledger ─> a task: the backup restored into
//!     <data_dir>/restore/<volume>.img (sparse; the data at the raid
//!     superblock's room), each block checked ─> Ready(file)
//!   VolumePlan.restore = file ─> its local replicas made from it
//!     (Make::Restore) ─> served ─> the file removed
//!   a replica cut off in its copy (still an esnap clone) ─> deleted first
//! ```
//!
//! Once a replica of the volume exists or it was served (a ledger), the
//! backup is never restored again: a replica made later is rebuilt from
//! the others like any new replica.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::backupstore::{self, Progress};
use crate::resources::config::Volume;
use crate::spdk::SpdkClient;
use crate::spdk::naming;
use crate::spdk::volume::Inventory;
use crate::spdk::volume::from_file;
use crate::spdk::volume::plan::{RestoreFile, superblock_room};

const MIB: u64 = 1 << 20;

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
}

#[derive(Debug)]
enum Task {
    Running {
        progress: Arc<Progress>,
        handle: tokio::task::JoinHandle<Result<RestoreFile, String>>,
    },
    Ready(RestoreFile),
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
        if !spec.remote_replicas.is_empty() || spec.serve_replica.is_some() {
            return Step::Failed(format!(
                "volume {vol}: a restore from a backup makes local replicas only (no remoteReplicas, no serveReplica)"
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
        // decided under the lock, awaited after it
        let finished = {
            let mut tasks = lock(&self.tasks);
            match tasks.get(vol) {
                Some(Task::Ready(f)) => return Step::Ready(f.clone()),
                Some(Task::Failed(m)) => return Step::Failed(m.clone()),
                Some(Task::Running { progress, handle }) if !handle.is_finished() => {
                    return Step::Waiting(format!(
                        "restoring backup {} of {} from {}: {}%",
                        src.backup,
                        src.backup_volume,
                        src.target,
                        progress.get()
                    ));
                }
                Some(Task::Running { .. }) => match tasks.remove(vol) {
                    Some(Task::Running { handle, .. }) => Some(handle),
                    _ => None,
                },
                None => None,
            }
        };
        if let Some(handle) = finished {
            let done = match handle.await {
                Ok(r) => r,
                Err(e) => Err(format!("restore task: {e}")),
            };
            let (step, task) = match done {
                Ok(f) => (Step::Ready(f.clone()), Task::Ready(f)),
                Err(m) => (Step::Failed(m.clone()), Task::Failed(m)),
            };
            lock(&self.tasks).insert(vol.to_owned(), task);
            return step;
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
        let progress = Arc::new(Progress::default());
        let file = dir.join(format!("{vol}.img"));
        let (src, size, p, dir) = (src.clone(), spec.size_bytes, progress.clone(), dir.clone());
        let handle = tokio::spawn(async move {
            std::fs::create_dir_all(&dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
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
            backupstore::ops::restore_to_file(
                &store,
                &src.backup_volume,
                &src.backup,
                &file,
                data_offset,
                &p,
            )
            .await
            .map_err(named)?;
            // as large as a replica lvol: the volume's whole MiB after the room
            let len = data_offset + size.div_ceil(MIB) * MIB;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .and_then(|f| f.set_len(len))
                .map_err(|e| format!("{}: {e}", file.display()))?;
            Ok(RestoreFile { file, data_offset })
        });
        lock(&self.tasks).insert(vol.to_owned(), Task::Running { progress, handle });
        Step::Waiting(format!(
            "restoring backup {} of {}: started",
            spec.from_backup.as_ref().map_or("", |s| s.backup.as_str()),
            spec.from_backup.as_ref().map_or("", |s| s.backup_volume.as_str())
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

    /// The volume is served (or gone): its restore file is removed.
    pub fn finish(&self, vol: &str) {
        let removed = lock(&self.tasks).remove(vol);
        match removed {
            Some(Task::Ready(f)) => {
                let _ = std::fs::remove_file(&f.file);
            }
            Some(Task::Running { handle, .. }) => handle.abort(),
            _ => {}
        }
        if let Some(dir) = &self.work_dir {
            let _ = std::fs::remove_file(dir.join(format!("{vol}.img")));
        }
    }
}
