//! Backups, restores, listings and deletions on a store, in Longhorn's
//! order (`deltablock.go`): a backup is listed complete only once its
//! config is written with a creation time, after every block it maps is
//! in the store; `volume.cfg` follows it. A deletion drops the config
//! first and then only blocks no complete backup maps, and none while
//! another backup is in progress.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures::{StreamExt, TryStreamExt};

use super::error::BackupError;
use super::format::{self, BackupCfg, BlockRef, Compression, VolumeCfg};
use super::image::SparseImage;
use super::lock::{Lock, LockKind};
use super::store::Store;

/// Blocks read, compressed and uploaded at once by default (Longhorn's
/// `backup-concurrent-limit` and `restore-concurrent-limit` default to 2 and
/// ask for more or fewer).
pub const PARALLEL: usize = 4;
/// The block sizes a backup is made with: Longhorn's `backup-block-size`
/// setting takes 2 MiB (its default) or 16 MiB.
pub const BLOCK_SIZES: [u64; 2] = [format::DEFAULT_BLOCK_SIZE, 16 << 20];

/// What a backup records of its volume and snapshot.
#[derive(Debug, Clone, Default)]
pub struct BackupRequest {
    /// The backup volume's name (Longhorn's volume name).
    pub volume: String,
    /// The backup's name.
    pub name: String,
    pub snapshot: String,
    /// The snapshot's creation time (RFC 3339).
    pub snapshot_created_at: String,
    /// The volume's size in bytes.
    pub size: u64,
    pub labels: BTreeMap<String, String>,
    /// Used when the backup volume is new; an existing one keeps its own.
    pub compression: Compression,
    /// Upload every block, even those the store holds (Longhorn's `full` mode).
    pub full: bool,
    /// `v1` or `v2`.
    pub data_engine: String,
    /// Its block size, one of [`BLOCK_SIZES`] (0: 2 MiB); an incremental
    /// backup's base must have the same.
    pub block_size: u64,
    /// Blocks compressed and uploaded at once (0: [`PARALLEL`]).
    pub concurrency: usize,
}

impl BackupRequest {
    /// Its block size in bytes.
    pub fn block_size(&self) -> u64 {
        match self.block_size {
            0 => format::DEFAULT_BLOCK_SIZE,
            n => n,
        }
    }

    fn concurrency(&self) -> usize {
        match self.concurrency {
            0 => PARALLEL,
            n => n,
        }
    }

    /// A backup `name` of snapshot `snapshot` (taken now) of a V2 volume of
    /// `size` bytes, into backup volume `volume`, lz4-compressed.
    pub fn v2(volume: &str, name: &str, snapshot: &str, size: u64) -> Self {
        Self {
            volume: volume.to_owned(),
            name: name.to_owned(),
            snapshot: snapshot.to_owned(),
            snapshot_created_at: format::now(),
            size,
            compression: Compression::Lz4,
            data_engine: "v2".into(),
            ..Default::default()
        }
    }
}

/// What a backup did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackupStats {
    /// Blocks of data read from the image.
    pub blocks_read: u64,
    /// Blocks written to the store (new, or again in full mode).
    pub blocks_uploaded: u64,
    /// Compressed bytes written.
    pub bytes_uploaded: u64,
    /// Blocks the complete backup maps.
    pub blocks_mapped: u64,
}

/// Progress of a running operation, 0-100.
#[derive(Debug, Default)]
pub struct Progress(AtomicU32);

impl Progress {
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
    fn set(&self, done: u64, total: u64) {
        let p = (done * 100).checked_div(total).map_or(100, |p| p as u32);
        self.0.store(p.min(100), Ordering::Relaxed);
    }
}

/// The volume's config, `None` when the store has no such backup volume.
pub async fn volume(store: &Store, volume: &str) -> Result<Option<VolumeCfg>, BackupError> {
    format::check_name("backup volume", volume)?;
    let path = format::volume_cfg_path(volume);
    match store.read(&path).await? {
        Some(b) => format::decode(&path, &b).map(Some),
        None => Ok(None),
    }
}

/// Backup `name` of `volume`'s config (complete or not).
pub async fn backup(store: &Store, volume: &str, name: &str) -> Result<BackupCfg, BackupError> {
    format::check_name("backup volume", volume)?;
    format::check_name("backup", name)?;
    let path = format::backup_cfg_path(volume, name);
    let b = store
        .read(&path)
        .await?
        .ok_or_else(|| BackupError::NotFound(format!("backup {name} of volume {volume}")))?;
    format::decode(&path, &b)
}

/// The backup volumes of the store.
pub async fn volumes(store: &Store) -> Result<Vec<String>, BackupError> {
    let base = format!("{}/volumes", format::BASE);
    let mut out = Vec::new();
    for l1 in store.list(&base).await? {
        for l2 in store.list(&format!("{base}/{l1}")).await? {
            for v in store.list(&format!("{base}/{l1}/{l2}")).await? {
                if format::valid_name(&v) {
                    out.push(v);
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The names of `volume`'s backups, in progress ones included.
pub async fn backup_names(store: &Store, volume: &str) -> Result<Vec<String>, BackupError> {
    format::check_name("backup volume", volume)?;
    Ok(store
        .list(&format::backups_dir(volume))
        .await?
        .into_iter()
        .filter_map(|f| {
            f.strip_prefix("backup_")
                .and_then(|f| f.strip_suffix(".cfg"))
                .filter(|n| format::valid_name(n))
                .map(str::to_owned)
        })
        .collect())
}

/// `volume`'s complete backups, oldest snapshot first.
pub async fn complete_backups(store: &Store, volume: &str) -> Result<Vec<BackupCfg>, BackupError> {
    let mut out = Vec::new();
    for n in backup_names(store, volume).await? {
        let b = backup(store, volume, &n).await?;
        if b.complete() {
            out.push(b);
        }
    }
    out.sort_by(|a, b| {
        (a.snapshot_created_at.as_str(), a.created_time.as_str())
            .cmp(&(b.snapshot_created_at.as_str(), b.created_time.as_str()))
    });
    Ok(out)
}

/// The backup an incremental backup of `volume` builds on: its
/// `LastBackupName`, when that is complete.
pub async fn last_backup(store: &Store, volume_name: &str) -> Result<Option<BackupCfg>, BackupError> {
    let Some(v) = volume(store, volume_name).await? else {
        return Ok(None);
    };
    if v.last_backup_name.is_empty() {
        return Ok(None);
    }
    match backup(store, volume_name, &v.last_backup_name).await {
        Ok(b) if b.complete() => Ok(Some(b)),
        Ok(_) | Err(BackupError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// One block a backup takes, at `offset` in the volume: its bytes (one
/// block long), or `None`: a block the base backup maps that the snapshot
/// now reads as zeros (left out of the new backup's map: a restore makes it
/// a hole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub offset: u64,
    pub data: Option<Vec<u8>>,
}

/// The blocks a backup takes, offsets ascending: with a base backup, those
/// that changed since it (the others are the base's); without, those that
/// hold data.
pub type Blocks<'a> = futures::stream::BoxStream<'a, Result<Block, BackupError>>;

/// Backs `image` up as `req` says. `base` is the backup `image` is a delta
/// over (its holes within a changed block are read from `base`'s block), or
/// `None` when `image` holds the whole snapshot.
pub async fn create(
    store: &Store,
    req: &BackupRequest,
    image: &SparseImage,
    base: Option<&BackupCfg>,
    progress: &Progress,
) -> Result<(BackupCfg, BackupStats), BackupError> {
    let blocks = image_blocks(store, req, image, base)?;
    create_from(store, req, blocks, base, progress).await
}

/// Backs up the `blocks` a reader gives (see [`Blocks`]) as `req` says,
/// over `base` when they are what changed since it.
pub async fn create_from(
    store: &Store,
    req: &BackupRequest,
    blocks: Blocks<'_>,
    base: Option<&BackupCfg>,
    progress: &Progress,
) -> Result<(BackupCfg, BackupStats), BackupError> {
    check_request(req, base)?;
    let work = create_locked(store, req, blocks, base, progress);
    Lock::holding(store, &req.volume, LockKind::Use, work).await
}

/// As [`create_from`], under `lock`, which the caller took (a `Use` lock on
/// `req.volume`, from [`Lock::acquire`] after [`check_request`]) so that it
/// can open its reader during the lock's 2 s settle; releases it whatever
/// the backup returns. Nothing is written to the store before the lock is
/// held either way: a reader only reads.
pub async fn create_held(
    store: &Store,
    lock: Lock,
    req: &BackupRequest,
    blocks: Blocks<'_>,
    base: Option<&BackupCfg>,
    progress: &Progress,
) -> Result<(BackupCfg, BackupStats), BackupError> {
    let out = match check_request(req, base) {
        Ok(()) if lock.covers(&req.volume, LockKind::Use) => {
            create_locked(store, req, blocks, base, progress).await
        }
        Ok(()) => Err(BackupError::Invalid(format!(
            "backup {}: the lock held is not a backup's lock on backup volume {}",
            req.name, req.volume
        ))),
        Err(e) => Err(e),
    };
    lock.release().await;
    out
}

/// Whether `req` is a backup the store takes, over `base` when given: its
/// names, block size and volume size (before any lock is written).
pub fn check_request(req: &BackupRequest, base: Option<&BackupCfg>) -> Result<(), BackupError> {
    format::check_backup_volume_name(&req.volume)?;
    format::check_backup_name(&req.name)?;
    let bs = req.block_size();
    if !BLOCK_SIZES.contains(&bs) {
        return Err(BackupError::Invalid(format!(
            "backup {}: a block size of {bs} bytes is not one Longhorn takes (2 MiB or 16 MiB)",
            req.name
        )));
    }
    if req.size == 0 || !req.size.is_multiple_of(bs) {
        return Err(BackupError::Invalid(format!(
            "volume {} is {} bytes: a backup needs a whole number of {bs}-byte blocks",
            req.volume, req.size
        )));
    }
    if let Some(b) = base
        && b.block_size()? != bs
    {
        return Err(BackupError::Invalid(format!(
            "backup {} has blocks of {} bytes, not {bs}: back up in full",
            b.name,
            b.block_size()?
        )));
    }
    Ok(())
}

/// The blocks of a sparse image with data; over `base`, a block's holes
/// read as `base`'s block there.
fn image_blocks<'a>(
    store: &'a Store,
    req: &'a BackupRequest,
    image: &'a SparseImage,
    base: Option<&BackupCfg>,
) -> Result<Blocks<'a>, BackupError> {
    let (bs, volume) = (req.block_size(), req.volume.as_str());
    let base_blocks: BTreeMap<u64, String> = base
        .map(|b| b.blocks.iter().map(|r| (r.offset, r.checksum.clone())).collect())
        .unwrap_or_default();
    let base_method = match base {
        Some(b) => Some(b.compression()?),
        None => None,
    };
    Ok(futures::stream::iter(image.blocks(bs))
        .map(move |offset| {
            let under = base_blocks.get(&offset).cloned().zip(base_method);
            async move {
                let mut data = {
                    let image = image.clone();
                    tokio::task::spawn_blocking(move || {
                        let mut buf = vec![0u8; bs as usize];
                        image.read(offset, &mut buf).map(|()| buf)
                    })
                    .await
                    .expect("reading a block")?
                };
                // a delta's holes are what the base backup holds there
                if let Some((sum, method)) = under
                    && !image.whole(offset, bs)
                {
                    let path = format::block_path(volume, &sum);
                    let raw = store
                        .read(&path)
                        .await?
                        .ok_or_else(|| BackupError::NotFound(format!("block {path} of the base backup")))?;
                    let old = format::open_block(&raw, method, &sum, bs)?;
                    fill_holes(image, offset, &mut data, &old)?;
                }
                Ok(Block {
                    offset,
                    data: Some(data),
                })
            }
        })
        .buffered(req.concurrency())
        .boxed())
}

async fn create_locked(
    store: &Store,
    req: &BackupRequest,
    blocks: Blocks<'_>,
    base: Option<&BackupCfg>,
    progress: &Progress,
) -> Result<(BackupCfg, BackupStats), BackupError> {
    let bs = req.block_size();
    let cfg_path = format::backup_cfg_path(&req.volume, &req.name);
    // one cut off before (a crash, a stop) is written anew; a complete one stays
    if let Some(b) = store.read(&cfg_path).await?
        && format::decode::<BackupCfg>(&cfg_path, &b).is_ok_and(|c| c.complete())
    {
        return Err(BackupError::Invalid(format!(
            "backup {} of volume {} already exists",
            req.name, req.volume
        )));
    }
    let vol = match volume(store, &req.volume).await? {
        Some(v) => v,
        None => {
            let v = VolumeCfg {
                name: req.volume.clone(),
                size: req.size,
                labels: Some(req.labels.clone()),
                created_time: format::now(),
                compression_method: req.compression.as_str().to_owned(),
                data_engine: req.data_engine.clone(),
                ..Default::default()
            };
            store
                .write(&format::volume_cfg_path(&req.volume), format::encode(&v))
                .await?;
            v
        }
    };
    let method = Compression::parse(&vol.compression_method)?;
    // in progress until the final write
    let mut cfg = BackupCfg {
        name: req.name.clone(),
        volume_name: req.volume.clone(),
        compression_method: method.as_str().to_owned(),
        ..Default::default()
    };
    store.write(&cfg_path, format::encode(&cfg)).await?;

    // progress: how far through the volume the blocks taken are
    let total = req.size / bs;
    // Two stages, each `concurrency` blocks wide and each block a task of
    // its own (its work on any core, not one after another in the task that
    // polls the stream; dropped, the backup cancelled, a task is aborted):
    // a block's checksum and compression, then its upload. The next blocks'
    // checksums run while the uploads before them wait on the store, so at
    // a few uploads in flight neither the cores nor the link wait on the
    // other; held at most: `concurrency` blocks in each stage.
    let n = req.concurrency();
    let results: Vec<(u64, Option<String>, Option<u64>)> = blocks
        .map(|b| {
            let full = req.full;
            let task = tokio::spawn(async move {
                let Block { offset, data } = b?;
                let Some(data) = data else {
                    return Ok(Prepared::Gone { offset });
                };
                // a full backup uploads every block: compressed beside its checksum
                Ok(tokio::task::spawn_blocking(move || {
                    let sum = format::checksum(&data);
                    match full {
                        true => Prepared::Compressed {
                            offset,
                            z: method.compress(&data),
                            sum,
                        },
                        false => Prepared::Read { offset, sum, data },
                    }
                })
                .await
                .expect("checksumming a block"))
            });
            futures::FutureExt::map(tokio_util::task::AbortOnDropHandle::new(task), |r| {
                r.expect("a block's checksum task")
            })
        })
        .buffered(n)
        .map(|p| {
            let (store, volume) = (store.clone(), req.volume.clone());
            let task = tokio::spawn(async move {
                let (offset, sum, z) = match p? {
                    Prepared::Gone { offset } => return Ok((offset, None, None)),
                    Prepared::Compressed { offset, sum, z } => (offset, sum, z),
                    // an incremental backup uploads only a block the store lacks
                    Prepared::Read { offset, sum, data } => {
                        if store.exists(&format::block_path(&volume, &sum)).await? {
                            return Ok((offset, Some(sum), None));
                        }
                        let z = tokio::task::spawn_blocking(move || method.compress(&data))
                            .await
                            .expect("compressing a block");
                        (offset, sum, z)
                    }
                };
                let n = z.len() as u64;
                store.write(&format::block_path(&volume, &sum), z).await?;
                Ok::<_, BackupError>((offset, Some(sum), Some(n)))
            });
            futures::FutureExt::map(tokio_util::task::AbortOnDropHandle::new(task), |r| {
                r.expect("a block's upload task")
            })
        })
        .buffered(n)
        .inspect(|r| {
            if let Ok((offset, ..)) = r {
                progress.set(offset / bs + 1, total + 1)
            }
        })
        .try_collect()
        .await?;

    let mut stats = BackupStats::default();
    let mut blocks: BTreeMap<u64, String> = base
        .map(|b| b.blocks.iter().map(|r| (r.offset, r.checksum.clone())).collect())
        .unwrap_or_default();
    let mut fresh = BTreeSet::new();
    for (offset, sum, uploaded) in results {
        let Some(sum) = sum else {
            blocks.remove(&offset);
            continue;
        };
        stats.blocks_read += 1;
        if let Some(n) = uploaded {
            stats.blocks_uploaded += 1;
            stats.bytes_uploaded += n;
            // a block two offsets share is uploaded once, by whichever wrote first
            fresh.insert(sum.clone());
        }
        blocks.insert(offset, sum);
    }
    blocks.retain(|&o, _| o < req.size);
    cfg.blocks = blocks
        .into_iter()
        .map(|(offset, checksum)| BlockRef { offset, checksum })
        .collect();
    stats.blocks_mapped = cfg.blocks.len() as u64;
    cfg.snapshot_name = req.snapshot.clone();
    cfg.snapshot_created_at = req.snapshot_created_at.clone();
    cfg.size = stats.blocks_mapped * bs;
    cfg.labels = Some(req.labels.clone());
    // as longhorn-manager passes them: the block size in bytes, decimal
    cfg.parameters = Some(BTreeMap::from([
        (
            format::PARAM_MODE.to_owned(),
            if req.full { "full" } else { "incremental" }.to_owned(),
        ),
        (format::PARAM_BLOCK_SIZE.to_owned(), bs.to_string()),
    ]));
    cfg.is_incremental = base.is_some();
    if req.full {
        cfg.re_uploaded_data_size = stats.bytes_uploaded;
    } else {
        cfg.newly_uploaded_data_size = stats.bytes_uploaded;
    }
    cfg.created_time = format::now();
    // the commit point
    store.write(&cfg_path, format::encode(&cfg)).await?;

    let mut vol = volume(store, &req.volume)
        .await?
        .ok_or_else(|| BackupError::NotFound(format!("volume.cfg of {}", req.volume)))?;
    vol.last_backup_name = cfg.name.clone();
    vol.last_backup_at = cfg.snapshot_created_at.clone();
    vol.block_count += if req.full { 0 } else { fresh.len() as u64 };
    vol.size = req.size;
    vol.labels = Some(req.labels.clone());
    if vol.data_engine.is_empty() {
        vol.data_engine = req.data_engine.clone();
    }
    store
        .write(&format::volume_cfg_path(&req.volume), format::encode(&vol))
        .await?;
    progress.set(1, 1);
    Ok((cfg, stats))
}

/// A block through a backup's first stage.
enum Prepared {
    /// No data there any more (a block of the base the volume dropped).
    Gone { offset: u64 },
    /// A full backup's block: checksummed and compressed.
    Compressed { offset: u64, sum: String, z: Vec<u8> },
    /// An incremental backup's: checksummed, compressed only if the store
    /// lacks it.
    Read { offset: u64, sum: String, data: Vec<u8> },
}

/// Copies the hole ranges of `image`'s block at `offset` from `old`.
fn fill_holes(image: &SparseImage, offset: u64, data: &mut [u8], old: &[u8]) -> Result<(), BackupError> {
    const STEP: u64 = 4096;
    let mut at = 0u64;
    while at < data.len() as u64 {
        if !image.whole(offset + at, STEP) {
            let (s, e) = (at as usize, (at + STEP) as usize);
            data[s..e].copy_from_slice(&old[s..e]);
        }
        at += STEP;
    }
    Ok(())
}

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreStats {
    pub blocks: u64,
    /// Blocks fetched from the store (all of them in a full restore; in an
    /// incremental one, those not already held at their offset).
    pub blocks_downloaded: u64,
    /// Bytes written (all-zero blocks are left as holes).
    pub bytes_written: u64,
    /// The volume's size.
    pub size: u64,
}

/// Restores backup `name` of `volume` into `file` (made anew: a sparse
/// file of `data_offset` plus the volume's size, the volume's data at
/// `data_offset`). Every block is checked against its checksum; a missing
/// or damaged block fails the restore, naming it.
pub async fn restore_to_file(
    store: &Store,
    volume_name: &str,
    name: &str,
    file: &Path,
    data_offset: u64,
    progress: &Progress,
) -> Result<RestoreStats, BackupError> {
    let work = restore_locked(store, volume_name, name, None, file, data_offset, progress);
    Lock::holding(store, volume_name, LockKind::Use, work).await
}

/// Brings `file`, which reads as backup `base` of `volume` restored (at
/// `data_offset`), to backup `name` of the same volume: only the blocks
/// `base` does not hold at their offset are fetched and written, and the
/// blocks `base` maps that `name` does not are made holes (Longhorn's
/// incremental restore, as a DR volume follows its source's backups).
/// Both backups must be complete. A failure leaves `file` part way between
/// the two: the caller does not use it.
pub async fn restore_delta_to_file(
    store: &Store,
    volume_name: &str,
    base: &str,
    name: &str,
    file: &Path,
    data_offset: u64,
    progress: &Progress,
) -> Result<RestoreStats, BackupError> {
    let work = restore_locked(store, volume_name, name, Some(base), file, data_offset, progress);
    Lock::holding(store, volume_name, LockKind::Use, work).await
}

/// A restore's blocks checked against the volume: whole blocks inside it.
fn check_blocks(vol: &VolumeCfg, b: &BackupCfg, volume_name: &str, bs: u64) -> Result<(), BackupError> {
    if vol.size == 0 || !vol.size.is_multiple_of(bs) {
        return Err(BackupError::Format {
            object: format::volume_cfg_path(volume_name),
            reason: format!("size {} is not a whole number of {bs}-byte blocks", vol.size),
        });
    }
    if let Some(r) = b
        .blocks
        .iter()
        .find(|r| r.offset % bs != 0 || r.offset >= vol.size)
    {
        return Err(BackupError::Format {
            object: format::backup_cfg_path(volume_name, &b.name),
            reason: format!(
                "block offset {} is not a block of the {}-byte volume",
                r.offset, vol.size
            ),
        });
    }
    Ok(())
}

/// A complete backup's config.
/// A backup to restore from: its volume, its own config, block size and compression, with
/// every block it lists checked against its volume.
async fn restorable(
    store: &Store,
    volume_name: &str,
    name: &str,
) -> Result<(VolumeCfg, BackupCfg, u64, Compression), BackupError> {
    let vol = volume(store, volume_name)
        .await?
        .ok_or_else(|| BackupError::NotFound(format!("backup volume {volume_name}")))?;
    let b = complete(store, volume_name, name).await?;
    let bs = b.block_size()?;
    let method = b.compression()?;
    check_blocks(&vol, &b, volume_name, bs)?;
    Ok((vol, b, bs, method))
}

/// The blocks backup `base` of `volume_name` maps, by offset with their
/// checksums: what an incremental restore onto it finds in place. `base`
/// must be complete, of block size `bs` (the backup restored onto it) and
/// within `vol`.
async fn held_blocks(
    store: &Store,
    volume_name: &str,
    vol: &VolumeCfg,
    base: &str,
    name: &str,
    bs: u64,
) -> Result<BTreeMap<u64, String>, BackupError> {
    let old = complete(store, volume_name, base).await?;
    if old.block_size()? != bs {
        return Err(BackupError::Invalid(format!(
            "backups {base} and {name} of volume {volume_name} have different block sizes: \
             an incremental restore needs one"
        )));
    }
    check_blocks(vol, &old, volume_name, bs)?;
    Ok(old.blocks.into_iter().map(|r| (r.offset, r.checksum)).collect())
}

async fn complete(store: &Store, volume_name: &str, name: &str) -> Result<BackupCfg, BackupError> {
    let b = backup(store, volume_name, name).await?;
    if !b.complete() {
        return Err(BackupError::Invalid(format!(
            "backup {name} of volume {volume_name} is still in progress"
        )));
    }
    Ok(b)
}

/// Makes `len` bytes of `f` at `at` a hole (they read zeros).
fn punch(f: &std::fs::File, at: u64, len: u64) -> std::io::Result<()> {
    use nix::fcntl::{FallocateFlags, fallocate};
    let off = |x: u64| i64::try_from(x).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput));
    fallocate(
        f,
        FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
        off(at)?,
        off(len)?,
    )
    .map_err(std::io::Error::from)
}

async fn restore_locked(
    store: &Store,
    volume_name: &str,
    name: &str,
    base: Option<&str>,
    file: &Path,
    data_offset: u64,
    progress: &Progress,
) -> Result<RestoreStats, BackupError> {
    let (vol, b, bs, method) = restorable(store, volume_name, name).await?;
    // what the file holds already (incremental): the base's blocks by offset
    let (f, held) = match base {
        None => {
            let f = crate::util::private::file(file).map_err(BackupError::io(file.display()))?;
            f.set_len(data_offset + vol.size)
                .map_err(BackupError::io(file.display()))?;
            (f, BTreeMap::new())
        }
        Some(base) => {
            let held = held_blocks(store, volume_name, &vol, base, name, bs).await?;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(file)
                .map_err(BackupError::io(file.display()))?;
            let len = f.metadata().map_err(BackupError::io(file.display()))?.len();
            if len < data_offset + vol.size {
                return Err(BackupError::Invalid(format!(
                    "{}: {len} bytes, less than the volume's {} at offset {data_offset}",
                    file.display(),
                    vol.size
                )));
            }
            (f, held)
        }
    };
    let wanted: BTreeSet<u64> = b.blocks.iter().map(|r| r.offset).collect();
    // blocks the base maps and this backup does not read zeros
    for at in held.keys().filter(|at| !wanted.contains(at)) {
        punch(&f, data_offset + at, bs).map_err(BackupError::io(file.display()))?;
    }
    let fetch: Vec<BlockRef> = b
        .blocks
        .iter()
        .filter(|r| held.get(&r.offset) != Some(&r.checksum))
        .cloned()
        .collect();
    let f = Arc::new(f);
    let total = fetch.len() as u64;
    let done = AtomicU32::new(0);
    let incremental = base.is_some();
    let written: Vec<u64> = futures::stream::iter(fetch)
        .map(|r| {
            let (store, f) = (store.clone(), f.clone());
            let path = format::block_path(volume_name, &r.checksum);
            let shown = file.display().to_string();
            async move {
                let raw = store
                    .read(&path)
                    .await?
                    .ok_or_else(|| BackupError::NotFound(format!("block {path} of backup {name}")))?;
                tokio::task::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt;
                    let data = format::open_block(&raw, method, &r.checksum, bs)?;
                    if data.iter().all(|&x| x == 0) {
                        // a new file reads zeros there; an old one may not
                        if incremental {
                            punch(&f, data_offset + r.offset, bs).map_err(BackupError::io(shown))?;
                        }
                        return Ok(0);
                    }
                    f.write_all_at(&data, data_offset + r.offset)
                        .map_err(BackupError::io(shown))?;
                    Ok(bs)
                })
                .await
                .expect("writing a block")
            }
        })
        .buffered(PARALLEL)
        .inspect(|_| {
            let d = done.fetch_add(1, Ordering::Relaxed) + 1;
            progress.set(u64::from(d), total + 1);
        })
        .try_collect()
        .await?;
    f.sync_all().map_err(BackupError::io(file.display()))?;
    progress.set(1, 1);
    Ok(RestoreStats {
        blocks: b.blocks.len() as u64,
        blocks_downloaded: total,
        bytes_written: written.iter().sum(),
        size: vol.size,
    })
}

/// The decoded blocks a streaming restore holds in memory at once, in
/// bytes: its fetches in flight are this over the block size (16 of
/// 2 MiB, 2 of 16 MiB), each holding its compressed and its decoded copy.
pub const STREAM_BYTES: u64 = 32 << 20;

/// Restores backup `name` of `volume` (complete) into whatever `write`
/// writes to, with no file: every block is fetched and checked against its
/// checksum, and a block that holds a non-zero byte is given to `write`
/// with its offset in the volume (an all-zero one is not: the target is
/// new and reads zeros). At most [`STREAM_BYTES`] of blocks are fetched or
/// being written at once. The backup must fit `limit` bytes. A missing or
/// damaged block fails the restore, naming it; what was written before
/// then is the caller's to drop.
pub async fn restore_streamed<W, F>(
    store: &Store,
    volume_name: &str,
    name: &str,
    limit: u64,
    progress: &Progress,
    write: W,
) -> Result<RestoreStats, BackupError>
where
    W: Fn(u64, Vec<u8>) -> F,
    F: std::future::Future<Output = Result<(), String>>,
{
    restore_streamed_onto(store, volume_name, None, name, limit, progress, write).await
}

/// [`restore_streamed`] onto a target that holds backup `base` (complete,
/// same block size) when one is given: only the blocks `base` does not
/// hold at their offset are fetched, and every block whose data changes is
/// given to `write` whole, zeros included: a block `base` maps that `name`
/// does not, or one that became all zeros, comes as a block of zeros (the
/// target holds `base`'s data there), so `write` must write every byte it
/// is given. Without `base`, as [`restore_streamed`]. A failure leaves the
/// target part way between the two: the caller does not use it.
pub async fn restore_streamed_onto<W, F>(
    store: &Store,
    volume_name: &str,
    base: Option<&str>,
    name: &str,
    limit: u64,
    progress: &Progress,
    write: W,
) -> Result<RestoreStats, BackupError>
where
    W: Fn(u64, Vec<u8>) -> F,
    F: std::future::Future<Output = Result<(), String>>,
{
    let work = async {
        let (vol, b, bs, method) = restorable(store, volume_name, name).await?;
        if vol.size > limit {
            return Err(BackupError::Invalid(format!(
                "backup {name} of volume {volume_name} holds {} bytes: more than the {limit} it is restored into",
                vol.size
            )));
        }
        // what the target holds already (incremental): the base's blocks by offset
        let held: BTreeMap<u64, String> = match base {
            None => BTreeMap::new(),
            Some(base) => held_blocks(store, volume_name, &vol, base, name, bs).await?,
        };
        let incremental = base.is_some();
        let wanted: BTreeSet<u64> = b.blocks.iter().map(|r| r.offset).collect();
        // blocks the base maps and this backup does not: zeros over the base's data
        let cleared: Vec<u64> = held.keys().filter(|at| !wanted.contains(at)).copied().collect();
        let fetch: Vec<BlockRef> = b
            .blocks
            .iter()
            .filter(|r| held.get(&r.offset) != Some(&r.checksum))
            .cloned()
            .collect();
        let ahead = usize::try_from(STREAM_BYTES / bs.max(1)).unwrap_or(1).max(1);
        let fetched = fetch.len() as u64;
        let total = fetched + cleared.len() as u64;
        let done = AtomicU32::new(0);
        let write = &write;
        let block_len = usize::try_from(bs).map_err(|_| BackupError::Invalid(format!("block size {bs}")))?;
        // each job: a block to fetch, or (none) zeros at an offset the base mapped
        let jobs = cleared
            .into_iter()
            .map(|at| (at, None))
            .chain(fetch.into_iter().map(|r| (r.offset, Some(r))));
        let written: Vec<u64> = futures::stream::iter(jobs)
            .map(|(at, r)| {
                let store = store.clone();
                async move {
                    let Some(r) = r else {
                        write(at, vec![0; block_len])
                            .await
                            .map_err(|reason| BackupError::WriteBlock {
                                block: format!("(zeros: no block of backup {name} there)"),
                                backup: name.to_owned(),
                                offset: at,
                                reason,
                            })?;
                        return Ok(0);
                    };
                    let path = format::block_path(volume_name, &r.checksum);
                    let raw = store
                        .read(&path)
                        .await?
                        .ok_or_else(|| BackupError::NotFound(format!("block {path} of backup {name}")))?;
                    let sum = r.checksum.clone();
                    let data =
                        tokio::task::spawn_blocking(move || format::open_block(&raw, method, &sum, bs))
                            .await
                            .expect("decoding a block")?;
                    let zero = data.iter().all(|&x| x == 0);
                    // a new target reads zeros there; one that holds the base may not
                    if zero && !incremental {
                        return Ok(0);
                    }
                    write(r.offset, data)
                        .await
                        .map_err(|reason| BackupError::WriteBlock {
                            block: path.clone(),
                            backup: name.to_owned(),
                            offset: r.offset,
                            reason,
                        })?;
                    Ok::<_, BackupError>(if zero { 0 } else { bs })
                }
            })
            .buffer_unordered(ahead)
            .inspect(|_| {
                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                progress.set(u64::from(d), total + 1);
            })
            .try_collect()
            .await?;
        progress.set(1, 1);
        Ok(RestoreStats {
            blocks: b.blocks.len() as u64,
            blocks_downloaded: fetched,
            bytes_written: written.iter().sum(),
            size: vol.size,
        })
    };
    Lock::holding(store, volume_name, LockKind::Use, work).await
}

/// Deletes backup volume `volume` whole: its configs, blocks and locks
/// (Longhorn's `DeleteBackupVolume`, under a delete lock).
pub async fn delete_volume(store: &Store, volume_name: &str) -> Result<(), BackupError> {
    format::check_name("backup volume", volume_name)?;
    let dir = format::volume_dir(volume_name);
    Lock::holding(store, volume_name, LockKind::Delete, store.remove_all(&dir)).await
}

/// Deletes backup `name` of `volume`, then the blocks no other backup maps
/// (none while a backup is in progress or a config does not read: a
/// block a backup may need is never deleted).
pub async fn delete(store: &Store, volume_name: &str, name: &str) -> Result<u64, BackupError> {
    format::check_name("backup volume", volume_name)?;
    format::check_name("backup", name)?;
    let work = delete_locked(store, volume_name, name);
    Lock::holding(store, volume_name, LockKind::Delete, work).await
}

async fn delete_locked(store: &Store, volume_name: &str, name: &str) -> Result<u64, BackupError> {
    let cfg_path = format::backup_cfg_path(volume_name, name);
    if !store.exists(&cfg_path).await? {
        return Err(BackupError::NotFound(format!(
            "backup {name} of volume {volume_name}"
        )));
    }
    store.remove(&cfg_path).await?;
    let mut vol = volume(store, volume_name)
        .await?
        .ok_or_else(|| BackupError::NotFound(format!("backup volume {volume_name}")))?;
    let names = backup_names(store, volume_name).await?;
    let mut gc = true;
    let mut referenced = BTreeSet::new();
    let mut latest: Option<BackupCfg> = None;
    for n in &names {
        match backup(store, volume_name, n).await {
            Ok(b) if b.complete() => {
                referenced.extend(b.blocks.iter().map(|r| r.checksum.clone()));
                if latest
                    .as_ref()
                    .is_none_or(|l| b.snapshot_created_at > l.snapshot_created_at)
                {
                    latest = Some(b);
                }
            }
            Ok(_) | Err(_) => gc = false,
        }
    }
    if vol.last_backup_name == name {
        let (n, at) = latest
            .map(|b| (b.name, b.snapshot_created_at))
            .unwrap_or_default();
        vol.last_backup_name = n;
        vol.last_backup_at = at;
    }
    if backup_names(store, volume_name).await? != names {
        gc = false;
    }
    let mut removed = 0;
    if gc {
        let dir = format::blocks_dir(volume_name);
        let mut present = 0u64;
        for l1 in store.list(&dir).await? {
            for l2 in store.list(&format!("{dir}/{l1}")).await? {
                for f in store.list(&format!("{dir}/{l1}/{l2}")).await? {
                    let Some(sum) = f.strip_suffix(".blk") else {
                        continue;
                    };
                    if referenced.contains(sum) {
                        present += 1;
                    } else {
                        store.remove(&format!("{dir}/{l1}/{l2}/{f}")).await?;
                        removed += 1;
                    }
                }
            }
        }
        vol.block_count = present;
    }
    store
        .write(&format::volume_cfg_path(volume_name), format::encode(&vol))
        .await?;
    Ok(removed)
}
