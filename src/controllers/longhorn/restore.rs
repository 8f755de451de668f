//! `engine.LonghornRestoreController`: restores backups into Longhorn
//! replicas of this node (`LonghornRestore`, asked through Longhorn's
//! `BackupRestore`) and reports `LonghornRestoreStatus`.
//!
//! ```text
//!   LonghornRestore <replica> {target, backupVolume, backup, base?}
//!     the restores a reconcile starts, grouped by (target, volume, backup, base):
//!     one job per group, each block fetched once for all its replicas
//!     per replica: settle what a cut-off run left (below), then its target
//!       full (no base; the replica's lvol new: thin, nothing allocated):
//!         bdev_lvol_create <lvs>/<replica>.restoring (thin)
//!       incremental (base: the backup the lvol holds, a DR volume's next backup):
//!         bdev_lvol_snapshot <replica> -> <replica>.restore, clone -> <replica>.restoring
//!     mover::restore::fill_standby: every target at once (no file; a full
//!       restore writes only chunks with data, an incremental one the blocks
//!       that changed, whole)
//!     per replica: bdev_lvol_snapshot .restoring -> <replica>.restored (the mark:
//!       the whole restore is in it), then settle:
//!   settle: .restoring deleted; .restored there? it becomes the lvol's parent
//!     (bdev_lvol_set_parent), .restore and .restored deleted: each merges into
//!     its one clone (no copy): the lvol holds the restore, thin
//!     no .restored: .restore deleted (merged back: the lvol holds what it held)
//!   LonghornRestoreStatus <replica> {backup}: Pending -> InProgress (progress) -> Completed | Error
//! ```
//!
//! The replicas of a restoring engine are members of its raid1 (claimed:
//! spdk_tgt v26.05 refuses to export a raid member, "already claimed: type
//! exclusive_write by module raid"), so the mover writes a target lvol
//! beside each, and the target's data becomes the member's through
//! `bdev_lvol_set_parent` and snapshot merges, which a claimed lvol takes.
//! The engine serves no I/O meanwhile: Longhorn attaches a volume being
//! restored with its frontend disabled, and the raid (made without a
//! superblock) keeps nothing of its members' data. A replica on another
//! node is restored by that node's talon the same way (Longhorn asks each
//! replica's node). A restore that a restart of talon cut off settles
//! first: the lvol holds the whole restore (finished) or what it held
//! before (run again); a full restore cut off runs again on its untouched
//! lvol. A restore that completed is recorded in `LonghornRestoreLedger`
//! (persisted): after a restart it reads completed, not run again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use futures::FutureExt as _;
use std::sync::Arc;
use std::time::Duration;

use crate::backupstore::{self, Progress};
use crate::resources::backup::{BackupState, LonghornRestore, LonghornRestoreLedger, LonghornRestoreStatus};
use crate::resources::longhorn::LonghornReplica;
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};
use crate::spdk::SpdkClient;
use crate::spdk::volume::Inventory;
use crate::spdk::volume::mover::into_replica::{IntoReplica, IntoReplicaError, RestoreParent, Settled};
use crate::spdk::volume::naming::lvstore;
use crate::spdk::volume::{VolumeOps, mover};

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
    /// An SPDK step on the replica's lvols failed.
    #[error(transparent)]
    Lvols(#[from] IntoReplicaError),
    /// The restore's snapshot vanished right after it was made.
    #[error("{0} is gone after its making")]
    Gone(String),
    /// Writing the backup into the replicas' lvols failed.
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
    ops: VolumeOps,
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
    /// Restores through the target behind `client`; the credentials under
    /// `data_dir`. The image files of an older talon's restores
    /// (`<data_dir>/restore/lh-*.img`) are removed: nothing reads them.
    pub fn new(client: SpdkClient, data_dir: &std::path::Path) -> Self {
        if let Ok(dir) = std::fs::read_dir(data_dir.join("restore")) {
            for f in dir.flatten() {
                let n = f.file_name().to_string_lossy().into_owned();
                if n.starts_with("lh-") && n.ends_with(".img") {
                    let _ = std::fs::remove_file(f.path());
                }
            }
        }
        Self {
            ops: VolumeOps::new(client),
            credentials_dir: credentials_dir(data_dir),
            running: Tasks::new("restore task"),
        }
    }

    fn forget_credentials(&self, id: &str) {
        let _ = std::fs::remove_dir_all(self.credentials_dir.join(id));
    }

    /// The replica's lvol a restore writes, checked new (`fresh`) or checked
    /// to hold a restore of its own (not a clone of anything else).
    fn replica_lvol(
        inv: &Inventory,
        id: &str,
        r: &LonghornReplica,
        fresh: bool,
    ) -> Result<IntoReplica, RestoreError> {
        let mut into = IntoReplica {
            replica: id.to_owned(),
            alias: format!("{}/{id}", lvstore(&r.disk)),
            // read from its bdev below
            lvol_bytes: 0,
        };
        let alias = into.alias.clone();
        let l = inv.lvols.get(&alias).ok_or_else(|| RestoreError::NotMade {
            replica: id.to_owned(),
            alias: alias.clone(),
        })?;
        let parent = into.restore_parent(inv.parent_of(&alias).as_deref());
        let own = parent == Some(RestoreParent::Base);
        let restored = parent == Some(RestoreParent::Restored);
        if !fresh && ((l.is_clone && !own && !restored) || l.is_esnap_clone || l.is_snapshot) {
            return Err(RestoreError::NotItsRestore {
                replica: id.to_owned(),
                alias,
            });
        }
        if fresh
            && ((l.is_clone && !restored)
                || l.is_esnap_clone
                || l.is_snapshot
                || l.num_allocated_clusters > 0)
        {
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
        into.lvol_bytes = u64::from(b.block_size) * b.num_blocks;
        Ok(into)
    }
}

/// What a group of restores started together restores: target, backup
/// volume, backup and base.
type GroupKey = (String, String, String, Option<String>);

/// One restore into one or more replicas of this node (the same backup,
/// onto the same base): each block fetched once, written into every
/// replica's target lvol through the mover, then each target's data made
/// its replica's lvol's own (snapshot, parent, merge: no copy).
struct Job {
    ops: VolumeOps,
    /// The restore (its target, credentials, backup and base).
    restore: LonghornRestore,
    members: Vec<IntoReplica>,
    progress: Arc<Progress>,
}

impl Job {
    /// The backup target, its backup volume checked to fit every replica.
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
        if let Some(m) = self.members.iter().find(|m| cfg.size > m.lvol_bytes) {
            return Err(RestoreError::TooLarge {
                backup: r.backup.clone(),
                bytes: cfg.size,
                replica: m.replica.clone(),
                lvol_bytes: m.lvol_bytes,
            });
        }
        Ok(store)
    }

    /// A backup store error of this restore.
    fn backup_error(&self) -> impl Fn(backupstore::BackupError) -> RestoreError + '_ {
        move |source| RestoreError::Backup {
            backup: self.restore.backup.clone(),
            volume: self.restore.backup_volume.clone(),
            incremental_from: self.restore.base.clone(),
            source: Box::new(source),
        }
    }

    /// The restore into every member; the blocks it fetched.
    async fn run(self) -> Result<u64, RestoreError> {
        let named = self.backup_error();
        let store = self.open(&named).await?;
        // what a run cut off left (talon restarted) is settled first
        let mut todo = Vec::new();
        for m in &self.members {
            match self.ops.settle_restore(m).await? {
                Settled::AsBefore => todo.push(m.clone()),
                Settled::Restored => {
                    tracing::info!(replica = %m.replica, backup = %self.restore.backup,
                        "a restore cut off after its data was whole: finished")
                }
            }
        }
        if todo.is_empty() {
            return Ok(0);
        }
        let (mut failed, fetched) = match self.fill(&store, &todo).await {
            Ok(n) => (None, n),
            Err(e) => (Some(e), 0),
        };
        for m in &todo {
            let settled = self.ops.settle_restore(m).await.map_err(RestoreError::from);
            failed = match (failed, settled) {
                (None, Ok(Settled::Restored)) => None,
                (None, Ok(Settled::AsBefore)) => Some(RestoreError::Gone(m.restored())),
                (None, Err(e)) | (Some(e), Ok(_)) => Some(e),
                (Some(e), Err(d)) => Some(RestoreError::Both(Box::new(e), Box::new(d))),
            };
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(fetched),
        }
    }

    /// The targets made and written; each one's snapshot made (the mark
    /// that it holds the whole restore).
    async fn fill(&self, store: &backupstore::Store, todo: &[IntoReplica]) -> Result<u64, RestoreError> {
        let r = &self.restore;
        let mut targets = Vec::new();
        for m in todo {
            targets.push(self.ops.prepare_restore(m, r.base.is_some()).await?);
        }
        let from = mover::restore::Onto {
            store,
            volume: &r.backup_volume,
            backup: &r.backup,
            base: r.base.as_deref(),
            data_offset: 0,
        };
        let stats = mover::restore::fill_standby(self.ops.client(), &from, &targets, &self.progress)
            .await
            .map_err(|e| match e {
                mover::restore::FillError::Backup { source, .. } => (self.backup_error())(source),
                other => RestoreError::Copy {
                    replica: todo
                        .iter()
                        .map(|m| m.replica.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    step: "writing the backup into its lvol: ",
                    message: crate::util::error_chain(&other),
                },
            })?;
        tracing::info!(backup = %r.backup, base = ?r.base, replicas = todo.len(),
            fetched = stats.blocks_downloaded, of = stats.blocks, "restored through the mover");
        for m in todo {
            self.ops.mark_restore_whole(m).await?;
        }
        Ok(stats.blocks_downloaded)
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
                ctx.destroy::<LonghornRestoreStatus>(s.id())?;
            }
        }
        // the ledger of a restore no longer wanted goes with the outputs this
        // reconcile does not apply
        let mut inv: Option<Inventory> = None;
        let mut waiting = false;
        // the restores to start, by what they restore: one job writes each group
        let mut groups: BTreeMap<GroupKey, (LonghornRestore, Vec<IntoReplica>)> = BTreeMap::new();
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
                match Inventory::load(self.ops.client()).await {
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
            let into = match Self::replica_lvol(found, &id, &replica.spec, !incremental) {
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
            let key = (
                r.spec.target.clone(),
                r.spec.backup_volume.clone(),
                r.spec.backup.clone(),
                r.spec.base.clone(),
            );
            groups
                .entry(key)
                .or_insert_with(|| (r.spec.clone(), Vec::new()))
                .1
                .push(into);
            ctx.apply(&id, of(status(BackupState::InProgress, 0, "")))?;
        }
        for (restore, members) in groups.into_values() {
            let progress = Arc::new(Progress::default());
            let ids: Vec<String> = members.iter().map(|m| m.replica.clone()).collect();
            let job = Job {
                ops: self.ops.clone(),
                restore,
                members,
                progress: progress.clone(),
            };
            // one job, its outcome (the status's text) each replica's
            let outcome = async move { job.run().await.map_err(|e| e.text()) }.shared();
            for id in &ids {
                self.running.start(id, progress.clone(), outcome.clone());
            }
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
        let spdk = RestoreError::from(IntoReplicaError::Spdk {
            replica: "r1".into(),
            step: "deleting talon-d/r1.restore".into(),
            source: Box::new(crate::spdk::ClientError::Rpc(crate::spdk::SpdkError::new(
                "bdev_lvol_delete",
                -16,
                "Device or resource busy",
            ))),
        });
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
