//! What a snapshot reads, copied out of spdk_tgt into a sparse file by
//! SPDK itself: the tests' second reader of a snapshot, beside the data
//! mover (`mover`), which every data path of talon reads through (a backup,
//! a snapshot hash, a clone). Until the mover read backups, a backup staged
//! its snapshot here, on the data dir; the sweeps still remove a staging
//! file or aio bdev an earlier talon left ([`remove_bdev`]).
//!
//! SPDK v26.05 has no RPC that reads an lvol's data (Longhorn's fork adds
//! checksum and range RPCs). Its shallow copy writes the clusters one lvol
//! holds into any bdev; copying a snapshot's chain, root first, into an aio
//! bdev over a sparse file of the snapshot's size leaves the file reading
//! as the snapshot reads, with holes where nothing of the chain was ever
//! written (each copy writes only allocated clusters, `lvol.c`
//! `spdk_lvol_shallow_copy`).
//!
//! ```text
//!   sparse file (the snapshot's size) ── bdev_aio_create <bdev> (its block size)
//!   chain root .. snapshot: bdev_lvol_start_shallow_copy <lvol> -> <bdev>,
//!                           polled with bdev_lvol_check_shallow_copy
//!   bdev_aio_delete <bdev>, always
//! ```

use std::path::Path;
use std::time::Duration;

use super::super::client::{ClientError, SpdkClient};
use super::super::error::ErrorKind;
use super::super::rpc::{AioCreate, ByName};
use super::Inventory;

/// How often a running copy is polled.
const POLL: Duration = Duration::from_millis(100);

/// A snapshot's chain as a copy to a file needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The lvols (`lvs/name`), the root first, the snapshot last.
    pub lvols: Vec<String>,
    /// The snapshot's size in bytes.
    pub size: u64,
    /// Its block size.
    pub block_size: u32,
    /// The bytes each lvol holds (its allocated clusters), as `lvols`: a
    /// copy writes at most their sum into the file.
    pub held: Vec<u64>,
}

impl Chain {
    /// Snapshot `alias` (`lvs/name`) and its ancestors as `inv` lists them
    /// ([`Inventory::chain`]); `None` when it is not there.
    pub fn of(inv: &Inventory, alias: &str) -> Option<Chain> {
        let bdev = inv.bdevs.get(&inv.lvols.get(alias)?.uuid)?;
        let mut lvols = inv.chain(alias);
        lvols.push(alias.to_owned());
        let held = lvols.iter().map(|a| inv.held_bytes(a).unwrap_or(0)).collect();
        Some(Chain {
            lvols,
            size: bdev.num_blocks.checked_mul(u64::from(bdev.block_size))?,
            block_size: bdev.block_size,
            held,
        })
    }

    /// The most a copy of the chain writes into its file: what its lvols
    /// hold, at most the snapshot's size.
    pub fn data_bytes(&self) -> u64 {
        self.held
            .iter()
            .fold(0u64, |a, b| a.saturating_add(*b))
            .min(self.size)
    }
}

/// A copy of a chain into a staging file that failed, naming the step.
#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    /// An SPDK call failed.
    #[error("{step}")]
    Rpc {
        /// The call and its object.
        step: String,
        /// SPDK's answer.
        #[source]
        source: ClientError,
    },
    /// The staging file could not be made.
    #[error("making {}", file.display())]
    File {
        /// The file.
        file: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The staging file's filesystem is full (or would be).
    #[error("{room} to copy the snapshot into {}", file.display())]
    NoSpace {
        /// The folder's room ("no space left on ...: free of ...").
        room: String,
        /// The file.
        file: std::path::PathBuf,
        /// What failed because of it (none: making the file).
        #[source]
        source: Option<Box<StagingError>>,
    },
    /// SPDK's shallow copy of an lvol ended failed.
    #[error("copying {src}'s clusters to {bdev}: {message}")]
    Copy {
        /// The lvol copied.
        src: String,
        /// The aio bdev written.
        bdev: String,
        /// SPDK's state message.
        message: String,
    },
}

/// Copies `chain` into sparse file `file` (made anew, 0600, the snapshot's
/// size) through aio bdev `bdev`, oldest lvol first; `bdev` is deleted on
/// every path (one an earlier copy left under that name too). The error
/// names the step; a copy that failed because `file`'s filesystem is full
/// (SPDK says "Input/output error" of an aio write the kernel refused with
/// ENOSPC) says "no space left on" its folder, with the sizes.
pub async fn copy_to_file(
    client: &SpdkClient,
    chain: &Chain,
    file: &Path,
    bdev: &str,
) -> Result<(), StagingError> {
    let rpc = |step: String| move |source| StagingError::Rpc { step, source };
    remove_bdev(client, bdev)
        .await
        .map_err(rpc(format!("bdev_aio_delete {bdev} (left by an earlier copy)")))?;
    let dir = file.parent().unwrap_or(Path::new("/"));
    crate::util::private::file(file)
        .and_then(|f| f.set_len(chain.size))
        .map_err(|e| match crate::util::space::is_no_space(&e) {
            true => StagingError::NoSpace {
                room: crate::util::space::no_space(dir, None),
                file: file.to_owned(),
                source: None,
            },
            false => StagingError::File {
                file: file.to_owned(),
                source: e,
            },
        })?;
    client
        .bdev_aio_create(&AioCreate {
            filename: file.display().to_string(),
            name: bdev.to_owned(),
            block_size: Some(chain.block_size),
            readonly: false,
            fallocate: false,
        })
        .await
        .map_err(rpc(format!("bdev_aio_create {bdev}")))?;
    let copied = copy_chain(client, chain, bdev).await.map_err(|e| {
        // what the file holds now (its allocated blocks) against what the copy writes
        let held = std::fs::metadata(file).map_or(0, |m| {
            use std::os::unix::fs::MetadataExt as _;
            m.blocks().saturating_mul(512)
        });
        match crate::util::space::short_of(dir, chain.data_bytes(), held) {
            Some(room) => StagingError::NoSpace {
                room,
                file: file.to_owned(),
                source: Some(Box::new(e)),
            },
            None => e,
        }
    });
    let removed = remove_bdev(client, bdev)
        .await
        .map_err(rpc(format!("bdev_aio_delete {bdev}")));
    copied.and(removed)
}

/// Deletes aio bdev `bdev`; one that is not there is no error.
pub async fn remove_bdev(client: &SpdkClient, bdev: &str) -> Result<(), ClientError> {
    match client.bdev_aio_delete(&ByName::new(bdev)).await {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn copy_chain(client: &SpdkClient, chain: &Chain, bdev: &str) -> Result<(), StagingError> {
    use super::thin::EachError;
    super::thin::copy_each(client, &chain.lvols, bdev, POLL)
        .await
        .map_err(|e| match e {
            EachError::Start { lvol, source } => StagingError::Rpc {
                step: format!("copying {lvol}'s clusters to {bdev}"),
                source,
            },
            EachError::State { lvol, op, source } => StagingError::Rpc {
                step: format!("copying {lvol}: copy {op}"),
                source,
            },
            EachError::Failed { lvol, message } => StagingError::Copy {
                src: lvol,
                bdev: bdev.to_owned(),
                message,
            },
        })
}
