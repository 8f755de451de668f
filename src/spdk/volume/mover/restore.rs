//! A restored backup written into a new thin replica lvol through the
//! mover: only the chunks that hold data are written, so the replica
//! allocates about what the backup holds (the esnap copy of `from_file`
//! allocates every cluster). The data comes straight from the backup
//! store ([`Source::Backup`], no file on the data dir), or from a file
//! ([`Source::File`]), or from another volume's snapshot
//! ([`Source::Snapshot`], a volume made with a copy of it). A standby
//! (DR) volume's lvols are written by [`fill_standby`]: its first restore
//! into all of them at once, then each newer backup's changed blocks only.
//!
//! ```text
//!   bdev_lvol_create <lvs>/<replica>.rst (thin)      never read as a replica
//!   Source::Backup: backupstore::ops::restore_streamed ─> mover::Session::write
//!                   blocks fetched and checked, STREAM_BYTES in flight,
//!                   their 1 MiB chunks with data written at data_offset + offset
//!   Source::File:   mover::fill_from_file <file> -> that lvol   chunks with data only
//!   Source::Snapshot: mover::copy::copy_range <snapshot lvol> -> that lvol   chunks with data only
//!   bdev_lvol_rename <replica>.rst -> <replica>        whole: now a replica
//!   any error: the lvol deleted; a talon stopped meanwhile: remove_unfinished
//! ```

use super::super::super::client::SpdkClient;
use super::super::super::error::ErrorKind;
use super::super::super::naming::{self, LVS_PREFIX, LvolRole, parse_lvol};
use super::super::super::rpc::{ByName, LvolCreate, LvolRename};
use super::super::Inventory;
use super::MoverError;
use crate::backupstore::Progress;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a restored replica's data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file holding the replica's data (the volume's at its data offset).
    File(std::path::PathBuf),
    /// A backup in a store, the volume's data written at `data_offset`.
    Backup(FromBackup),
    /// A snapshot lvol of another volume (`Volume.copyFrom`).
    Snapshot(FromSnapshot),
}

/// A snapshot to copy a volume's data from, with the copy's progress.
#[derive(Debug, Clone)]
pub struct FromSnapshot {
    /// The snapshot (`<volume>@<snapshot>`), as the status names it.
    pub id: String,
    /// Its lvol (`<lvs>/<volume>-r<k>.s.<snapshot>`).
    pub lvol: String,
    /// Where the source volume's data starts in it (its raid superblock's room).
    pub from_offset: u64,
    /// The source volume's bytes copied.
    pub len: u64,
    /// Where the new volume's data starts in the replica written.
    pub data_offset: u64,
    /// Bytes of the snapshot read so far.
    pub copied: Arc<AtomicU64>,
}

/// The same snapshot, at the same offsets (the progress is a handle).
impl PartialEq for FromSnapshot {
    fn eq(&self, o: &Self) -> bool {
        (&self.lvol, self.from_offset, self.len, self.data_offset)
            == (&o.lvol, o.from_offset, o.len, o.data_offset)
    }
}

impl Eq for FromSnapshot {}

/// Copies snapshot `from` into bdev `bdev` (new: it reads zeros): inside
/// spdk_tgt when the data sits at the same offset in both
/// ([`super::copy::within`]; the source's superblock room zeroed after),
/// else through the mover, only the chunks that hold data written. Every
/// export is removed whether it ends well or not.
pub async fn fill_from_snapshot(
    client: &SpdkClient,
    from: &FromSnapshot,
    bdev: &str,
    depth: u16,
) -> Result<super::Filled, super::MoverError> {
    // at the same offsets, inside spdk_tgt (only the chain's clusters read and written)
    if from.from_offset == from.data_offset {
        let inv = Inventory::load(client)
            .await
            .map_err(|source| super::MoverError::Rpc {
                bdev: bdev.to_owned(),
                step: "listing the target".into(),
                source,
            })?;
        let w = super::copy::Within {
            snap: &from.lvol,
            dst: bdev,
            earlier: None,
            started: &|_| {},
            size: from.len,
        };
        if let Some(f) = super::copy::within(client, &inv, &w, &from.copied).await? {
            if from.data_offset > 0 {
                // the source's raid superblock came along in its room: a member
                // keeping another raid's superblock is refused by bdev_raid_create
                let s = super::Session::open(client, bdev, super::Purpose::Clone, depth).await?;
                let zeros = Bytes::from(vec![0u8; from.data_offset as usize]);
                let wrote = s.write(0, zeros).await;
                s.close().await?;
                wrote?;
            }
            return Ok(f);
        }
    }
    let dst = super::Session::open(client, bdev, super::Purpose::Clone, depth).await?;
    let range = super::copy::Range {
        from_offset: from.from_offset,
        len: Some(from.len),
        to_offset: from.data_offset,
    };
    super::copy::copy_range(client, &from.lvol, range, dst, depth, &from.copied).await
}

/// A backup to restore from, with the progress its restore reports.
#[derive(Clone)]
pub struct FromBackup {
    /// The backup target's URL (names the store).
    pub target: String,
    /// The store, opened.
    pub store: crate::backupstore::Store,
    /// The backup volume.
    pub volume: String,
    /// The backup.
    pub backup: String,
    /// Where the volume's data starts in the replica (the raid
    /// superblock's room).
    pub data_offset: u64,
    /// The restore's progress.
    pub progress: Arc<Progress>,
}

impl std::fmt::Debug for FromBackup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FromBackup")
            .field("target", &self.target)
            .field("volume", &self.volume)
            .field("backup", &self.backup)
            .field("data_offset", &self.data_offset)
            .finish_non_exhaustive()
    }
}

/// The same backup, at the same offset (the store and progress are handles).
impl PartialEq for FromBackup {
    fn eq(&self, o: &Self) -> bool {
        (&self.target, &self.volume, &self.backup, self.data_offset)
            == (&o.target, &o.volume, &o.backup, o.data_offset)
    }
}

impl Eq for FromBackup {}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Backup(b) => write!(f, "backup {} of {} in {}", b.backup, b.volume, b.target),
            Source::Snapshot(s) => write!(f, "snapshot {} ({})", s.id, s.lvol),
        }
    }
}

/// Writes backup `from` into bdev `bdev` (new: it reads zeros) through the
/// mover: each block fetched and checked, only its 1 MiB chunks that hold
/// data written, at `from.data_offset` plus the block's offset; at most
/// [`crate::backupstore::ops::STREAM_BYTES`] of blocks in memory. The
/// export is removed whether it ends well or not.
pub async fn fill_from_backup(
    client: &SpdkClient,
    from: &FromBackup,
    bdev: &str,
    depth: u16,
) -> Result<super::Filled, super::MoverError> {
    let s = super::Session::open(client, bdev, super::Purpose::Restore, depth).await?;
    let limit = s.size().saturating_sub(from.data_offset);
    let written = AtomicU64::new(0);
    let (session, written_ref, base) = (&s, &written, from.data_offset);
    let restored = crate::backupstore::ops::restore_streamed(
        &from.store,
        &from.volume,
        &from.backup,
        limit,
        &from.progress,
        move |offset, data| async move {
            let data = Bytes::from(data);
            let chunks = (0..data.len()).step_by(super::CHUNK).filter_map(|at| {
                let part = data.slice(at..(at + super::CHUNK).min(data.len()));
                super::has_data(&part).then_some((at, part))
            });
            futures::future::try_join_all(chunks.map(|(at, part)| {
                written_ref.fetch_add(part.len() as u64, Ordering::Relaxed);
                session.write(base + offset + at as u64, part)
            }))
            .await
            .map(|_| ())
            .map_err(|e| crate::util::error_chain(&e))
        },
    )
    .await;
    let closed = s.close().await;
    let stats = restored.map_err(|source| super::MoverError::Backup {
        bdev: bdev.to_owned(),
        source: Box::new(source),
    })?;
    closed?;
    Ok(super::Filled {
        written: written.load(Ordering::Relaxed),
        read: stats.bytes_written,
    })
}

/// A backup to write into lvols with [`fill_standby`]: which one, from
/// which store, onto what they hold already, and where the volume's data
/// starts in them.
#[derive(Debug, Clone, Copy)]
pub struct Onto<'a> {
    /// The store, opened.
    pub store: &'a crate::backupstore::Store,
    /// The backup volume.
    pub volume: &'a str,
    /// The backup written.
    pub backup: &'a str,
    /// The backup the bdevs hold already (complete, same backup volume):
    /// only the blocks that differ are written. None: the bdevs are new
    /// (they read zeros).
    pub base: Option<&'a str>,
    /// Where the volume's data starts in each bdev.
    pub data_offset: u64,
}

/// Why [`fill_standby`] failed.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    /// A bdev could not be exported to the mover or connected.
    #[error("opening {bdev}")]
    Open {
        /// The bdev.
        bdev: String,
        /// Why.
        #[source]
        source: super::MoverError,
    },
    /// The backup could not be read, or a block of it written.
    #[error("backup {backup} of {volume}")]
    Backup {
        /// The backup.
        backup: String,
        /// The backup volume.
        volume: String,
        /// Why.
        #[source]
        source: crate::backupstore::BackupError,
    },
    /// An export could not be removed after the restore.
    #[error("closing the mover's export of {bdev}")]
    Close {
        /// The bdev.
        bdev: String,
        /// Why.
        #[source]
        source: super::MoverError,
    },
}

/// Writes backup `from` into every bdev of `bdevs` (a standby volume's
/// replicas, Longhorn replicas' restore lvols) through the mover, each
/// block fetched once and written to all: without `from.base`, the bdevs
/// are new (they read zeros) and only chunks with data are written; with
/// it, the bdevs hold backup `base` and only the blocks that differ are
/// written, whole (zeros included: a block that became zeros, or that the
/// backup no longer maps, is written as zeros). A failure leaves the bdevs
/// part way between the two. The exports are removed whether it ends well
/// or not.
pub async fn fill_standby(
    client: &SpdkClient,
    from: &Onto<'_>,
    bdevs: &[String],
    progress: &Progress,
) -> Result<crate::backupstore::ops::RestoreStats, FillError> {
    let mut sessions = Vec::with_capacity(bdevs.len());
    let mut opened = Ok(());
    for b in bdevs {
        match super::Session::open(client, b, super::Purpose::Restore, super::DEPTH).await {
            Ok(s) => sessions.push(s),
            Err(source) => {
                opened = Err(FillError::Open {
                    bdev: b.clone(),
                    source,
                });
                break;
            }
        }
    }
    let data_offset = from.data_offset;
    let restored = async {
        opened?;
        let limit = sessions
            .iter()
            .map(|s| s.size())
            .min()
            .unwrap_or(0)
            .saturating_sub(data_offset);
        let (all, every_chunk) = (&sessions, from.base.is_some());
        crate::backupstore::ops::restore_streamed_onto(
            from.store,
            from.volume,
            from.base,
            from.backup,
            limit,
            progress,
            move |offset, data| async move {
                let data = Bytes::from(data);
                let chunks: Vec<(usize, Bytes)> = (0..data.len())
                    .step_by(super::CHUNK)
                    .map(|at| (at, data.slice(at..(at + super::CHUNK).min(data.len()))))
                    .filter(|(_, part)| every_chunk || super::has_data(part))
                    .collect();
                futures::future::try_join_all(all.iter().flat_map(|s| {
                    chunks
                        .iter()
                        .map(move |(at, part)| s.write(data_offset + offset + *at as u64, part.clone()))
                }))
                .await
                .map(|_| ())
                .map_err(|e| crate::util::error_chain(&e))
            },
        )
        .await
        .map_err(|source| FillError::Backup {
            backup: from.backup.to_owned(),
            volume: from.volume.to_owned(),
            source,
        })
    }
    .await;
    let mut closed = Ok(());
    for s in sessions {
        let bdev = s.bdev.clone();
        if let Err(source) = s.close().await
            && closed.is_ok()
        {
            closed = Err(FillError::Close { bdev, source });
        }
    }
    let stats = restored?;
    closed?;
    Ok(stats)
}

/// Makes replica lvol `lvs/name` of `mib` from `from`; answers its UUID.
/// The error names the step; nothing is left behind (a lvol whose delete
/// failed too keeps its restoring name: [`remove_unfinished`] takes it).
pub async fn fill_replica(
    client: &SpdkClient,
    from: &Source,
    lvs: &str,
    name: &str,
    mib: u64,
) -> Result<String, MoverError> {
    let tmp = naming::restoring(name);
    let alias = format!("{lvs}/{tmp}");
    if tmp.len() > 63 {
        return Err(MoverError::Invalid {
            bdev: alias,
            reason: format!(
                "lvol name {tmp} (replica {name} while it is restored) is longer than SPDK's 63 characters"
            ),
        });
    }
    let rpc = |step: String| {
        let bdev = alias.clone();
        move |source| MoverError::Rpc { bdev, step, source }
    };
    let uuid = client
        .bdev_lvol_create(&LvolCreate::thin(lvs, &tmp, mib))
        .await
        .map_err(rpc(format!("creating lvol {alias}")))?;
    let filled = match from {
        Source::File(file) => super::fill_from_file(client, file, &uuid, super::DEPTH).await,
        Source::Backup(b) => fill_from_backup(client, b, &uuid, super::DEPTH).await,
        Source::Snapshot(snap) => fill_from_snapshot(client, snap, &uuid, super::DEPTH).await,
    };
    let filled = async {
        let f = filled?;
        tracing::info!(lvol = %alias, written = f.written, read = f.read, %from, "restored into a thin lvol");
        client
            .bdev_lvol_rename(&LvolRename {
                old_name: alias.clone(),
                new_name: name.to_owned(),
            })
            .await
            .map(|_| ())
            .map_err(rpc(format!("renaming {alias} to {name}")))
    }
    .await;
    if let Err(e) = filled {
        match client.bdev_lvol_delete(&ByName::new(&uuid)).await {
            Ok(_) => {}
            Err(d) if d.is(ErrorKind::NotFound) => {}
            Err(d) => tracing::error!(
                lvol = %alias,
                error = %crate::util::error_chain(&d),
                "could not delete a replica lvol whose restore failed: the next restore of the volume removes it"
            ),
        }
        return Err(e);
    }
    Ok(uuid)
}

/// Deletes the lvols of volume `vol` a restore was writing when it was cut
/// off (talon or spdk_tgt stopped): they never hold a whole backup.
/// Returns the lvols deleted.
pub async fn remove_unfinished(
    client: &SpdkClient,
    inv: &Inventory,
    vol: &str,
) -> Result<Vec<String>, MoverError> {
    let mut out = Vec::new();
    for l in inv.lvols.values() {
        let cut = l.lvs.name.starts_with(LVS_PREFIX)
            && matches!(parse_lvol(&l.name), Some(LvolRole::Restoring { volume, .. }) if volume == vol);
        if !cut {
            continue;
        }
        match client.bdev_lvol_delete(&ByName::new(&l.alias)).await {
            Ok(_) => out.push(l.alias.clone()),
            Err(e) if e.is(ErrorKind::NotFound) => {}
            Err(source) => {
                return Err(MoverError::Rpc {
                    bdev: l.alias.clone(),
                    step: format!("deleting {} (its restore was cut off)", l.alias),
                    source,
                });
            }
        }
    }
    Ok(out)
}
