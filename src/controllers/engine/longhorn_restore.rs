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

use super::tasks::{Seen, Tasks};

/// How often a running restore's progress is published.
const POLL: Duration = Duration::from_secs(1);

/// Restores backups into Longhorn replicas.
#[derive(Debug)]
pub struct LonghornRestoreController {
    client: SpdkClient,
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
            work_dir: data_dir.join("restore"),
            credentials_dir: credentials_dir(data_dir),
            running: Tasks::new("restore task"),
        }
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
    ) -> Result<(String, u32, u64), String> {
        let alias = format!("{}/{id}", lvstore(&r.disk));
        let l = inv
            .lvols
            .get(&alias)
            .ok_or_else(|| format!("replica {id}: its lvol {alias} is not made yet"))?;
        // the one clone of the snapshot a cut-off incremental restore took
        // (its first step deletes that snapshot: merged back)
        let own = inv.parent_of(&alias) == Some(replica_alias(&r.disk, &restore_snapshot(id)));
        if !fresh && ((l.is_clone && !own) || l.is_esnap_clone || l.is_snapshot) {
            return Err(format!(
                "replica {id}: its lvol {alias} is a clone, not the restore it held: an incremental \
                 restore goes on from a replica's own restored data only"
            ));
        }
        if fresh && (l.is_clone || l.is_esnap_clone || l.is_snapshot || l.num_allocated_clusters > 0) {
            return Err(format!(
                "replica {id} holds data ({alias}: {} clusters allocated{}): a backup restores into a new replica only",
                l.num_allocated_clusters,
                if l.is_clone || l.is_esnap_clone {
                    ", a clone"
                } else {
                    ""
                }
            ));
        }
        let b = inv
            .bdevs
            .get(&l.uuid)
            .ok_or_else(|| format!("replica {id}: no bdev {} for {alias}", l.uuid))?;
        Ok((alias, b.block_size, u64::from(b.block_size) * b.num_blocks))
    }
}

/// One restore: the backup into a file, the file into the lvol.
struct Job {
    client: SpdkClient,
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
    async fn run(self) -> Result<u64, String> {
        match self.restore.base.clone() {
            None => self.full().await,
            Some(base) => self.incremental(&base).await,
        }
    }

    /// The backup target, its backup volume checked to fit the replica,
    /// and the folder of the file made.
    async fn open(
        &self,
        named: &impl Fn(backupstore::BackupError) -> String,
    ) -> Result<backupstore::Store, String> {
        let r = &self.restore;
        let store = super::backup::open_store(&r.target, r.credential_secret.as_deref())?;
        let cfg = backupstore::ops::volume(&store, &r.backup_volume)
            .await
            .map_err(named)?
            .ok_or_else(|| format!("backup volume {} not found in {}", r.backup_volume, r.target))?;
        if cfg.size > self.lvol_bytes {
            return Err(format!(
                "backup {} holds {} bytes: more than replica {}'s {}",
                r.backup, cfg.size, self.replica, self.lvol_bytes
            ));
        }
        if let Some(dir) = self.file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
        }
        Ok(store)
    }

    /// The bdev name the copies use.
    fn bdev(&self) -> String {
        format!("talon-restore-{}", self.replica)
    }

    /// The replica's lvol filled from the file.
    async fn fill_lvol(&self) -> Result<(), String> {
        from_file::copy_from_file(
            &self.client,
            &self.file,
            self.block_size,
            &self.alias,
            &self.bdev(),
        )
        .await
        .map_err(|e| format!("replica {}: {e}", self.replica))
    }

    async fn incremental(self, base: &str) -> Result<u64, String> {
        let r = &self.restore;
        let named = |e: backupstore::BackupError| {
            format!(
                "backup {} of {} (incremental from {base}): {e}",
                r.backup, r.backup_volume
            )
        };
        let store = self.open(&named).await?;
        let lvs = self.alias.split_once('/').map_or("", |(l, _)| l);
        let snap = restore_snapshot(&self.replica);
        let snap_alias = format!("{lvs}/{snap}");
        let failed = |step: &str, e: crate::spdk::ClientError| {
            format!(
                "replica {}: {step}: {}",
                self.replica,
                crate::util::error_chain(&e)
            )
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
                .ok_or_else(|| format!("{snap_alias} is gone after its making"))?;
            to_file::copy_to_file(&self.client, &chain, &self.file, &self.bdev())
                .await
                .map_err(|e| format!("replica {}: copying out what it holds: {e}", self.replica))?;
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
                Err(d) => format!("{e}; {d}"),
            }),
        }
    }

    async fn full(self) -> Result<u64, String> {
        let r = &self.restore;
        let named = |e: backupstore::BackupError| format!("backup {} of {}: {e}", r.backup, r.backup_volume);
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
                .map_err(|e| format!("{}: {e}", self.file.display()))?;
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
                            format!("restore cut off (talon restarted) after it wrote the lvol: {why}")
                        } else {
                            why
                        };
                        self.forget_credentials(&id);
                        ctx.apply(&id, of(status(BackupState::Error, 0, why)))?;
                        continue;
                    }
                };
            let progress = Arc::new(Progress::default());
            let job = Job {
                client: self.client.clone(),
                restore: r.spec.clone(),
                replica: id.clone(),
                file: self.file(&id),
                alias,
                block_size,
                lvol_bytes,
                progress: progress.clone(),
            };
            self.running.start(&id, progress, job.run());
            ctx.apply(&id, of(status(BackupState::InProgress, 0, "")))?;
        }
        if self.running.is_empty() && !waiting {
            Ok(Requeue::OnInputChange)
        } else {
            Ok(Requeue::After(POLL))
        }
    }
}
