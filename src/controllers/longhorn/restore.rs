//! `engine.LonghornRestoreController`: restores backups into Longhorn
//! replicas of this node (`LonghornRestore`, asked through Longhorn's
//! `BackupRestore`) and reports `LonghornRestoreStatus`.
//!
//! ```text
//!   LonghornRestore <replica> {target, backupVolume, backup, base?} ─> a task:
//!     full (no base): the replica's lvol is new (thin, no parent, nothing allocated)?
//!       no ──> Error (a first backup restores into a new replica only)
//!       the backup ──> <data>/restore/lh-<replica>.img (sparse, each block checked)
//!         ──> the lvol filled from it (spdk::volume::from_file: esnap + decouple)
//!     incremental (base: the backup the lvol holds, a DR volume's next backup):
//!       bdev_lvol_snapshot <lvs>/<replica> -> <replica>.restore (the lvol, now empty, clones it)
//!       <replica>.restore ──> lh-<replica>.img (spdk::volume::to_file: shallow copy)
//!       only the blocks base lacks fetched into it, base's blocks the backup
//!         lacks made holes (backupstore::ops::restore_delta_to_file)
//!       ──> the lvol filled from it (from_file: its parent becomes the file, decoupled)
//!       <replica>.restore deleted (on a failure too: with the lvol still its
//!         clone, the delete merges it back and the lvol reads base again)
//!   LonghornRestoreStatus <replica> {backup}: Pending -> InProgress (progress) -> Completed | Error
//! ```
//!
//! The replicas of a restoring engine are written beneath its raid1 while
//! the engine serves no I/O: Longhorn attaches a volume being restored
//! with its frontend disabled, and the raid (made without a superblock)
//! keeps nothing of its members' data. A full restore that a restart of
//! talon cut off starts again if the lvol is still untouched; otherwise it
//! ends in Error (the replica is never served as restored). An incremental
//! one starts again unless the cut left the lvol a clone of the file. A
//! restore that completed is recorded in `LonghornRestoreLedger`
//! (persisted): after a restart it reads completed, not run again.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::backupstore::{self, Progress};
use crate::resources::backup::{BackupState, LonghornRestore, LonghornRestoreLedger, LonghornRestoreStatus};
use crate::resources::longhorn::LonghornReplica;
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};
use crate::spdk::SpdkClient;
use crate::spdk::naming::longhorn::{replica_alias, restore_snapshot};
use crate::spdk::volume::Inventory;
use crate::spdk::volume::naming::lvstore;
use crate::spdk::volume::{from_file, lvol, to_file};

use crate::controllers::engine::backup::open_store;
use crate::controllers::engine::tasks::{Seen, Tasks};

/// How often a running restore's progress is published.
const POLL: Duration = Duration::from_secs(1);

/// Why a restore into a replica failed or cannot start: its text (with its
/// sources) is the restore's status message.
#[derive(Debug, thiserror::Error)]
enum RestoreError {
    /// The replica's lvol is not made yet.
    #[error("replica {replica}: its lvol {alias} is not made yet")]
    NotMade { replica: String, alias: String },
    /// An incremental restore into an lvol that is not the restore it held.
    #[error(
        "replica {replica}: its lvol {alias} is a clone, not the restore it held: an incremental \
         restore goes on from a replica's own restored data only"
    )]
    NotItsRestore { replica: String, alias: String },
    /// A first restore into a replica that holds data.
    #[error(
        "replica {replica} holds data ({alias}: {clusters} clusters allocated{}): a backup restores into a new replica only",
        if *.clone { ", a clone" } else { "" }
    )]
    HoldsData {
        replica: String,
        alias: String,
        clusters: u64,
        clone: bool,
    },
    /// The lvol has no bdev.
    #[error("replica {replica}: no bdev {uuid} for {alias}")]
    NoBdev {
        replica: String,
        uuid: String,
        alias: String,
    },
    /// The backup target could not be opened.
    #[error("{0}")]
    Target(String),
    /// The backup store failed.
    #[error(
        "backup {backup} of {volume}{}",
        .incremental_from.as_ref().map_or(String::new(), |b| format!(" (incremental from {b})"))
    )]
    Backup {
        backup: String,
        volume: String,
        incremental_from: Option<String>,
        #[source]
        source: Box<backupstore::BackupError>,
    },
    /// The backup volume is not in the store.
    #[error("backup volume {volume} not found in {target}")]
    VolumeMissing { volume: String, target: String },
    /// The backup is larger than the replica.
    #[error("backup {backup} holds {bytes} bytes: more than replica {replica}'s {lvol_bytes}")]
    TooLarge {
        backup: String,
        bytes: u64,
        replica: String,
        lvol_bytes: u64,
    },
    /// A file or folder of the restore could not be made.
    #[error("{}", .path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An SPDK step on the replica's lvols failed.
    #[error("replica {replica}: {step}")]
    Spdk {
        replica: String,
        step: String,
        #[source]
        source: Box<crate::spdk::ClientError>,
    },
    /// The restore's snapshot vanished right after it was made.
    #[error("{0} is gone after its making")]
    Gone(String),
    /// Copying the lvol out to the file, or the file into it, failed.
    #[error("replica {replica}: {step}{message}")]
    Copy {
        replica: String,
        step: &'static str,
        message: String,
    },
    /// The restore failed, and so did the cleanup after it.
    #[error("{}; {}", .0.text(), .1.text())]
    Both(Box<RestoreError>, Box<RestoreError>),
}

impl RestoreError {
    fn text(&self) -> String {
        crate::util::error_chain(self)
    }
}

/// Restores backups into Longhorn replicas.
#[derive(Debug)]
pub struct LonghornRestoreController {
    client: SpdkClient,
    /// The target's copies from a file, one at a time: a clone of the lock
    /// talon's volume restores hold too.
    copies: from_file::Copies,
    /// Where restored images are made (sparse files, removed after).
    work_dir: PathBuf,
    /// Where `longhorn::restore` leaves each restore's credentials.
    credentials_dir: PathBuf,
    /// Each task answers the blocks it fetched.
    running: Tasks<u64>,
}

fn status(state: BackupState, progress: u32, message: impl Into<String>) -> LonghornRestoreStatus {
    LonghornRestoreStatus {
        state,
        progress,
        message: message.into(),
        ..Default::default()
    }
}

/// Where a restore's credentials are kept under talon's data dir (one
/// folder per replica): `<data>/backup/restore-credentials`.
pub fn credentials_dir(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("backup").join("restore-credentials")
}

impl LonghornRestoreController {
    /// Restores through the target behind `client`, making images under
    /// `<data_dir>/restore/`.
    pub fn new(client: SpdkClient, data_dir: &std::path::Path) -> Self {
        Self {
            client,
            copies: from_file::Copies::default(),
            work_dir: data_dir.join("restore"),
            credentials_dir: credentials_dir(data_dir),
            running: Tasks::new("restore task"),
        }
    }

    /// Copies from files under `copies`, the lock every other copier into
    /// this target holds a clone of.
    pub fn with_copies(mut self, copies: from_file::Copies) -> Self {
        self.copies = copies;
        self
    }

    fn forget_credentials(&self, id: &str) {
        let _ = std::fs::remove_dir_all(self.credentials_dir.join(id));
    }

    fn file(&self, id: &str) -> PathBuf {
        self.work_dir.join(format!("lh-{id}.img"))
    }

    /// The replica's lvol, checked new (`fresh`) or checked to hold a
    /// restore of its own (not a clone of anything); its alias and bdev's
    /// block size and size in bytes.
    fn replica_lvol(
        inv: &Inventory,
        id: &str,
        r: &LonghornReplica,
        fresh: bool,
    ) -> Result<(String, u32, u64), RestoreError> {
        let alias = format!("{}/{id}", lvstore(&r.disk));
        let l = inv.lvols.get(&alias).ok_or_else(|| RestoreError::NotMade {
            replica: id.to_owned(),
            alias: alias.clone(),
        })?;
        // the one clone of the snapshot a cut-off incremental restore took
        // (its first step deletes that snapshot: merged back)
        let own = inv.parent_of(&alias) == Some(replica_alias(&r.disk, &restore_snapshot(id)));
        if !fresh && ((l.is_clone && !own) || l.is_esnap_clone || l.is_snapshot) {
            return Err(RestoreError::NotItsRestore {
                replica: id.to_owned(),
                alias,
            });
        }
        if fresh && (l.is_clone || l.is_esnap_clone || l.is_snapshot || l.num_allocated_clusters > 0) {
            return Err(RestoreError::HoldsData {
                replica: id.to_owned(),
                alias,
                clusters: l.num_allocated_clusters,
                clone: l.is_clone || l.is_esnap_clone,
            });
        }
        let b = inv.bdevs.get(&l.uuid).ok_or_else(|| RestoreError::NoBdev {
            replica: id.to_owned(),
            uuid: l.uuid.clone(),
            alias: alias.clone(),
        })?;
        Ok((alias, b.block_size, u64::from(b.block_size) * b.num_blocks))
    }
}

/// One restore: the backup into a file, the file into the lvol.
struct Job {
    client: SpdkClient,
    copies: from_file::Copies,
    restore: LonghornRestore,
    replica: String,
    file: PathBuf,
    alias: String,
    block_size: u32,
    lvol_bytes: u64,
    progress: Arc<Progress>,
}

impl Job {
    /// The restore: a full one, or incremental from `restore.base`.
    async fn run(self) -> Result<u64, RestoreError> {
        match self.restore.base.clone() {
            None => self.full().await,
            Some(base) => self.incremental(&base).await,
        }
    }

    /// The backup target, its backup volume checked to fit the replica,
    /// and the folder of the file made.
    async fn open(
        &self,
        named: &impl Fn(backupstore::BackupError) -> RestoreError,
    ) -> Result<backupstore::Store, RestoreError> {
        let r = &self.restore;
        let store = open_store(&r.target, r.credential_secret.as_deref()).map_err(RestoreError::Target)?;
        let cfg = backupstore::ops::volume(&store, &r.backup_volume)
            .await
            .map_err(named)?
            .ok_or_else(|| RestoreError::VolumeMissing {
                volume: r.backup_volume.clone(),
                target: r.target.clone(),
            })?;
        if cfg.size > self.lvol_bytes {
            return Err(RestoreError::TooLarge {
                backup: r.backup.clone(),
                bytes: cfg.size,
                replica: self.replica.clone(),
                lvol_bytes: self.lvol_bytes,
            });
        }
        if let Some(dir) = self.file.parent() {
            std::fs::create_dir_all(dir).map_err(|source| RestoreError::File {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        Ok(store)
    }

    /// A backup store error of this restore (`base`: an incremental one's).
    fn backup_error(&self, base: Option<&str>) -> impl Fn(backupstore::BackupError) -> RestoreError + '_ {
        let base = base.map(str::to_owned);
        move |source| RestoreError::Backup {
            backup: self.restore.backup.clone(),
            volume: self.restore.backup_volume.clone(),
            incremental_from: base.clone(),
            source: Box::new(source),
        }
    }

    /// The bdev name the copies use.
    fn bdev(&self) -> String {
        format!("talon-restore-{}", self.replica)
    }

    /// The replica's lvol filled from the file.
    async fn fill_lvol(&self) -> Result<(), RestoreError> {
        self.copies
            .copy_from_file(
                &self.client,
                &self.file,
                self.block_size,
                &self.alias,
                &self.bdev(),
            )
            .await
            .map_err(|message| RestoreError::Copy {
                replica: self.replica.clone(),
                step: "",
                message,
            })
    }

    async fn incremental(self, base: &str) -> Result<u64, RestoreError> {
        let r = &self.restore;
        let named = self.backup_error(Some(base));
        let store = self.open(&named).await?;
        let lvs = self.alias.split_once('/').map_or("", |(l, _)| l);
        let snap = restore_snapshot(&self.replica);
        let snap_alias = format!("{lvs}/{snap}");
        let failed = |step: &str, source: crate::spdk::ClientError| RestoreError::Spdk {
            replica: self.replica.clone(),
            step: step.to_owned(),
            source: Box::new(source),
        };
        // one a cut-off run left (the lvol then reads it still: deleting merges it back)
        lvol::delete_lvol(&self.client, &snap_alias)
            .await
            .map_err(|e| failed(&format!("deleting {snap_alias} (left by an earlier restore)"), e))?;
        lvol::snapshot(&self.client, &self.alias, &snap)
            .await
            .map_err(|e| failed(&format!("snapshotting {} as {snap}", self.alias), e))?;
        let done = async {
            let inv = Inventory::load(&self.client)
                .await
                .map_err(|e| failed("reading spdk_tgt", e))?;
            let chain = to_file::Chain::of(&inv, &snap_alias)
                .ok_or_else(|| RestoreError::Gone(snap_alias.clone()))?;
            to_file::copy_to_file(&self.client, &chain, &self.file, &self.bdev())
                .await
                .map_err(|message| RestoreError::Copy {
                    replica: self.replica.clone(),
                    step: "copying out what it holds: ",
                    message,
                })?;
            let stats = backupstore::ops::restore_delta_to_file(
                &store,
                &r.backup_volume,
                base,
                &r.backup,
                &self.file,
                0,
                &self.progress,
            )
            .await
            .map_err(named)?;
            self.fill_lvol().await?;
            Ok(stats.blocks_downloaded)
        }
        .await;
        let _ = std::fs::remove_file(&self.file);
        // after the copy the lvol no longer depends on the snapshot; before it,
        // the lvol is its one clone and the delete merges it back (base again)
        let dropped = lvol::delete_lvol(&self.client, &snap_alias)
            .await
            .map_err(|e| failed(&format!("deleting {snap_alias}"), e));
        match done {
            Ok(n) => dropped.map(|()| n),
            Err(e) => Err(match dropped {
                Ok(()) => e,
                Err(d) => RestoreError::Both(Box::new(e), Box::new(d)),
            }),
        }
    }

    async fn full(self) -> Result<u64, RestoreError> {
        let r = &self.restore;
        let named = self.backup_error(None);
        let store = self.open(&named).await?;
        let done = async {
            let stats = backupstore::ops::restore_to_file(
                &store,
                &r.backup_volume,
                &r.backup,
                &self.file,
                0,
                &self.progress,
            )
            .await
            .map_err(named)?;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&self.file)
                .and_then(|f| f.set_len(self.lvol_bytes))
                .map_err(|source| RestoreError::File {
                    path: self.file.clone(),
                    source,
                })?;
            self.fill_lvol().await?;
            Ok(stats.blocks_downloaded)
        }
        .await;
        let _ = std::fs::remove_file(&self.file);
        done
    }
}

#[async_trait::async_trait]
impl Controller for LonghornRestoreController {
    fn name(&self) -> &'static str {
        "engine.LonghornRestoreController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::of::<LonghornRestore>(), Input::of::<LonghornReplica>()]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<LonghornRestoreStatus>(),
            Output::exclusive::<LonghornRestoreLedger>(),
        ]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let restores = ctx.list::<LonghornRestore>()?;
        let wanted: BTreeSet<String> = restores.iter().map(|r| r.id().to_string()).collect();
        // a restore no longer wanted (its replica deleted) is let run to its end,
        // not aborted: a copy stopped between its SPDK calls would leave its aio
        // bdev under an esnap clone; without the lvol the copy fails and removes
        // what it made
        self.running.keep_only(&wanted, false);
        for s in ctx.list::<LonghornRestoreStatus>()? {
            if !wanted.contains(s.id()) {
                self.forget_credentials(s.id());
                let _ = std::fs::remove_file(self.file(s.id()));
                ctx.destroy::<LonghornRestoreStatus>(s.id())?;
            }
        }
        // the ledger of a restore no longer wanted goes with the outputs this
        // reconcile does not apply
        let mut inv: Option<Inventory> = None;
        let mut waiting = false;
        for r in &restores {
            let id = r.id().to_string();
            let backup = r.spec.backup.as_str();
            // kept: outputs a reconcile does not apply are destroyed after it
            let ledger = ctx.get::<LonghornRestoreLedger>(&id)?.map(|l| l.spec);
            if let Some(l) = &ledger {
                ctx.apply(&id, l.clone())?;
            }
            // a status of the backup before this one (an incremental restore's base)
            // is no status of this restore; one from before statuses named their
            // backup is of the spec's, unless the spec goes on from a base
            let prev = ctx
                .get::<LonghornRestoreStatus>(&id)?
                .map(|s| s.spec)
                .filter(|s| s.backup == backup || (s.backup.is_empty() && r.spec.base.is_none()));
            if let Some(s) = &prev
                && matches!(s.state, BackupState::Completed | BackupState::Error)
            {
                ctx.apply(&id, s.clone())?;
                continue;
            }
            let of = |mut s: LonghornRestoreStatus| {
                s.backup = backup.to_owned();
                s
            };
            // restored before a restart of talon (its statuses gone with it); the
            // ledger is written only once a restore of this backup completed
            if ledger.is_some_and(|l| l.backup == backup) {
                self.forget_credentials(&id);
                ctx.apply(&id, of(status(BackupState::Completed, 100, "")))?;
                continue;
            }
            match self.running.seen(&id).await {
                Seen::Absent => {}
                Seen::Running(p) => {
                    ctx.apply(&id, of(status(BackupState::InProgress, p.min(99), "")))?;
                    continue;
                }
                Seen::Ended(outcome) => {
                    let s = match outcome {
                        Ok(n) => {
                            ctx.apply(
                                &id,
                                LonghornRestoreLedger {
                                    backup: backup.to_owned(),
                                },
                            )?;
                            LonghornRestoreStatus {
                                blocks_downloaded: n,
                                ..status(BackupState::Completed, 100, "")
                            }
                        }
                        Err(e) => status(BackupState::Error, 0, e),
                    };
                    self.forget_credentials(&id);
                    ctx.apply(&id, of(s))?;
                    continue;
                }
            }
            // an incremental restore runs again from its start after a restart of
            // talon (statuses are not persisted): a step cut off left the lvol
            // standalone, holding the base or the new backup (the changed blocks
            // applied again give the new backup), or the clone of its snapshot (the
            // first step deletes the snapshot: merged back), or an esnap clone of
            // the file (refused below: Error)
            let incremental = r.spec.base.is_some();
            let Some(replica) = ctx.get::<LonghornReplica>(&id)? else {
                self.forget_credentials(&id);
                ctx.apply(
                    &id,
                    of(status(
                        BackupState::Error,
                        0,
                        format!("replica {id} is not on this node"),
                    )),
                )?;
                continue;
            };
            if inv.is_none() {
                match Inventory::load(&self.client).await {
                    Ok(i) => inv = Some(i),
                    Err(e) => {
                        let why = format!("reading spdk_tgt: {}", crate::util::error_chain(&e));
                        waiting = true;
                        ctx.apply(&id, of(status(BackupState::Pending, 0, why)))?;
                        continue;
                    }
                }
            }
            let Some(found) = inv.as_ref() else { continue };
            if !found
                .lvols
                .contains_key(&format!("{}/{id}", lvstore(&replica.spec.disk)))
            {
                waiting = true;
                ctx.apply(
                    &id,
                    of(status(
                        BackupState::Pending,
                        0,
                        format!("waiting for replica {id}'s lvol"),
                    )),
                )?;
                continue;
            }
            let (alias, block_size, lvol_bytes) =
                match Self::replica_lvol(found, &id, &replica.spec, !incremental) {
                    Ok(l) => l,
                    Err(why) => {
                        // after a restart of talon: a restore cut off in its copy touched the lvol
                        let why = if prev.is_some_and(|s| s.state == BackupState::InProgress) {
                            format!(
                                "restore cut off (talon restarted) after it wrote the lvol: {}",
                                why.text()
                            )
                        } else {
                            why.text()
                        };
                        self.forget_credentials(&id);
                        ctx.apply(&id, of(status(BackupState::Error, 0, why)))?;
                        continue;
                    }
                };
            let progress = Arc::new(Progress::default());
            let job = Job {
                client: self.client.clone(),
                copies: self.copies.clone(),
                restore: r.spec.clone(),
                replica: id.clone(),
                file: self.file(&id),
                alias,
                block_size,
                lvol_bytes,
                progress: progress.clone(),
            };
            // the task's outcome becomes the status's text
            self.running.start(
                &id,
                progress,
                async move { job.run().await.map_err(|e| e.text()) },
            );
            ctx.apply(&id, of(status(BackupState::InProgress, 0, "")))?;
        }
        if self.running.is_empty() && !waiting {
            Ok(Requeue::OnInputChange)
        } else {
            Ok(Requeue::After(POLL))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restore's status says what it said when its errors were text: the
    /// step, the replica or lvol, and SPDK's answer after a colon.
    #[test]
    fn a_restore_error_reads_as_its_status_always_did() {
        let holds = RestoreError::HoldsData {
            replica: "r1".into(),
            alias: "talon-d/r1".into(),
            clusters: 3,
            clone: true,
        };
        assert_eq!(
            holds.text(),
            "replica r1 holds data (talon-d/r1: 3 clusters allocated, a clone): a backup restores into a new replica only"
        );
        let spdk = RestoreError::Spdk {
            replica: "r1".into(),
            step: "deleting talon-d/r1.restore".into(),
            source: Box::new(crate::spdk::ClientError::Rpc(crate::spdk::SpdkError::new(
                "bdev_lvol_delete",
                -16,
                "Device or resource busy",
            ))),
        };
        let copy = RestoreError::Copy {
            replica: "r1".into(),
            step: "copying out what it holds: ",
            message: "bdev_aio_create failed".into(),
        };
        assert_eq!(
            copy.text(),
            "replica r1: copying out what it holds: bdev_aio_create failed"
        );
        let both = RestoreError::Both(Box::new(copy), Box::new(spdk));
        assert!(
            both.text().starts_with(
                "replica r1: copying out what it holds: bdev_aio_create failed; \
                 replica r1: deleting talon-d/r1.restore: "
            ),
            "{}",
            both.text()
        );
        let incremental = RestoreError::Backup {
            backup: "b2".into(),
            volume: "v".into(),
            incremental_from: Some("b1".into()),
            source: Box::new(backupstore::BackupError::NotFound("backup b2".into())),
        };
        assert!(
            incremental
                .text()
                .starts_with("backup b2 of v (incremental from b1): "),
            "{}",
            incremental.text()
        );
    }
}
