//! What a snapshot reads, copied out of spdk_tgt into a sparse file.
//!
//! SPDK v26.05 has no RPC that reads an lvol's data (Longhorn's fork adds
//! checksum and range RPCs). Its shallow copy writes the clusters one lvol
//! holds into any bdev; copying a snapshot's chain, root first, into an aio
//! bdev over a sparse file of the snapshot's size leaves the file reading
//! as the snapshot reads, with holes where nothing of the chain was ever
//! written (each copy writes only allocated clusters, `lvol.c`
//! `spdk_lvol_shallow_copy`). The snapshot hash reads the file; a backup
//! reads its data ranges (`SEEK_DATA`).
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
use super::super::rpc::{AioCreate, ByName, CheckShallowCopy, StartShallowCopy};
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
}

impl Chain {
    /// Snapshot `alias` (`lvs/name`) and its ancestors as `inv` lists them
    /// ([`Inventory::chain`]); `None` when it is not there.
    pub fn of(inv: &Inventory, alias: &str) -> Option<Chain> {
        let bdev = inv.bdevs.get(&inv.lvols.get(alias)?.uuid)?;
        let mut lvols = inv.chain(alias);
        lvols.push(alias.to_owned());
        Some(Chain {
            lvols,
            size: bdev.num_blocks.checked_mul(u64::from(bdev.block_size))?,
            block_size: bdev.block_size,
        })
    }
}

/// Copies `chain` into sparse file `file` (made anew, the snapshot's size)
/// through aio bdev `bdev`, oldest lvol first; `bdev` is deleted on every
/// path (one an earlier copy left under that name too). The error names the
/// step.
pub async fn copy_to_file(client: &SpdkClient, chain: &Chain, file: &Path, bdev: &str) -> Result<(), String> {
    remove_bdev(client, bdev).await.map_err(|e| {
        format!(
            "bdev_aio_delete {bdev} (left by an earlier copy): {}",
            crate::util::error_chain(&e)
        )
    })?;
    std::fs::File::create(file)
        .and_then(|f| f.set_len(chain.size))
        .map_err(|e| format!("making {}: {e}", file.display()))?;
    client
        .bdev_aio_create(&AioCreate {
            filename: file.display().to_string(),
            name: bdev.to_owned(),
            block_size: Some(chain.block_size),
            readonly: false,
            fallocate: false,
        })
        .await
        .map_err(|e| format!("bdev_aio_create {bdev}: {}", crate::util::error_chain(&e)))?;
    let copied = copy_chain(client, chain, bdev).await;
    let removed = remove_bdev(client, bdev)
        .await
        .map_err(|e| format!("bdev_aio_delete {bdev}: {}", crate::util::error_chain(&e)));
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

async fn copy_chain(client: &SpdkClient, chain: &Chain, bdev: &str) -> Result<(), String> {
    for src in &chain.lvols {
        let op = client
            .bdev_lvol_start_shallow_copy(&StartShallowCopy {
                src_lvol_name: src.clone(),
                dst_bdev_name: bdev.to_owned(),
            })
            .await
            .map_err(|e| {
                format!(
                    "copying {src}'s clusters to {bdev}: {}",
                    crate::util::error_chain(&e)
                )
            })?
            .operation_id;
        loop {
            let s = client
                .bdev_lvol_check_shallow_copy(&CheckShallowCopy { operation_id: op })
                .await
                .map_err(|e| format!("copying {src}: copy {op}: {}", crate::util::error_chain(&e)))?;
            match s.state.as_str() {
                "complete" => break,
                "error" => {
                    return Err(format!(
                        "copying {src}'s clusters to {bdev}: {}",
                        s.error.unwrap_or_default()
                    ));
                }
                _ => tokio::time::sleep(POLL).await,
            }
        }
    }
    Ok(())
}
