//! A file's data copied into a thin lvol: the other way of [`super::to_file`],
//! for restoring a backup.
//!
//! SPDK v26.05 has no RPC that writes data into an lvol. It can make a bdev
//! the external snapshot (esnap) of a thin lvol (`bdev_lvol_set_parent_bdev`)
//! and then copy its parent into the lvol and drop it
//! (`bdev_lvol_decouple_parent`). Of an external snapshot the blobstore
//! copies every cluster (`bs_cluster_needs_allocation`: an esnap clone's
//! unallocated clusters all need allocation; checked on a real v26.05
//! target: 64 of 64 clusters allocated for 5 MiB of data), so a restored
//! lvol is fully allocated.
//!
//! ```text
//!   bdev_aio_create <file> <bdev> (read-only)
//!   bdev_lvol_set_parent_bdev <lvol> <bdev>   the lvol reads the file
//!   bdev_lvol_decouple_parent <lvol>           copied; the file no longer used
//!   bdev_aio_delete <bdev>, always
//!   the lvol checked: no longer a clone of the file, every cluster allocated
//! ```
//!
//! One copy runs at a time in one spdk_tgt: two at once in a real spdk_tgt
//! v26.05 (`set_parent_bdev` + `decouple_parent` of two lvols of one
//! lvstore under raid1s) left one lvol uncopied: by hand, its decouple
//! never answered (a retry: "Device or resource busy"); in a talon test,
//! both calls answered and one lvol stayed empty. The check after the copy
//! stands behind the lock. The lock is a [`Copies`] value, one per target:
//! `controllers::register_all` hands one to the controller that restores
//! into it (talon's volumes, through [`super::VolumeOps::with_copies`];
//! Longhorn replicas restore through the mover, no file).

use std::path::Path;

use super::super::client::SpdkClient;
use super::super::error::ErrorKind;
use super::super::rpc::{AioCreate, ByName, LvolSetParentBdev};
use super::to_file::remove_bdev;

/// The copies into one target's lvols: one runs at a time (see the
/// module). Clones share the lock.
#[derive(Debug, Clone, Default)]
pub struct Copies(std::sync::Arc<tokio::sync::Mutex<()>>);

impl Copies {
    /// Fills thin lvol `lvol` (`lvs/name`, as large as `file`, nothing written
    /// yet) with `file`'s data through aio bdev `bdev`. On an error after the
    /// file became its parent the lvol is deleted before the aio bdev (an aio
    /// bdev deleted under an esnap clone hung a real v26.05 target): the
    /// caller makes it again. The error names the step.
    pub async fn copy_from_file(
        &self,
        client: &SpdkClient,
        file: &Path,
        block_size: u32,
        lvol: &str,
        bdev: &str,
    ) -> Result<(), String> {
        let _one = self.0.lock().await;
        let err = |step: String| {
            move |e: super::super::client::ClientError| format!("{step}: {}", crate::util::error_chain(&e))
        };
        remove_bdev(client, bdev)
            .await
            .map_err(err(format!("bdev_aio_delete {bdev} (left by an earlier copy)")))?;
        client
            .bdev_aio_create(&AioCreate {
                filename: file.display().to_string(),
                name: bdev.to_owned(),
                block_size: Some(block_size),
                readonly: true,
                fallocate: false,
            })
            .await
            .map_err(err(format!("bdev_aio_create {bdev} over {}", file.display())))?;
        let copied = match client
            .bdev_lvol_set_parent_bdev(&LvolSetParentBdev {
                lvol_name: lvol.to_owned(),
                parent_name: bdev.to_owned(),
            })
            .await
        {
            Err(e) => Err(err(format!("making {bdev} the parent of {lvol}"))(e)),
            Ok(_) => match client.bdev_lvol_decouple_parent(&ByName::new(lvol)).await {
                Ok(_) => Ok(true),
                Err(e) => {
                    let full = match e.is(ErrorKind::NoSpace) {
                        true => lvstore_full(client, lvol, file).await,
                        false => None,
                    };
                    let e = err(format!("copying {} into {lvol}", file.display()))(e);
                    let e = match full {
                        Some(full) => format!("{full} ({e})"),
                        None => e,
                    };
                    match client.bdev_lvol_delete(&ByName::new(lvol)).await {
                        Ok(_) => Err(e),
                        Err(d) => Err(format!("{e}; deleting {lvol}: {}", crate::util::error_chain(&d))),
                    }
                }
            },
        };
        let removed = remove_bdev(client, bdev)
            .await
            .map_err(err(format!("bdev_aio_delete {bdev}")));
        copied.and(removed)?;
        check_copied(client, lvol).await
    }
}

/// "no space left on lvstore <lvs>" with its room and what a copy of `file`
/// into `lvol` (`lvs/name`) needs (every cluster of the file's size).
async fn lvstore_full(client: &SpdkClient, lvol: &str, file: &Path) -> Option<String> {
    use crate::util::size::human_bytes as human;
    let lvs = lvol.split_once('/')?.0;
    let inv = super::Inventory::load(client).await.ok()?;
    let s = inv.lvstores.iter().find(|s| s.name == lvs)?;
    let need = std::fs::metadata(file).ok()?.len();
    Some(format!(
        "no space left on lvstore {lvs} (bdev {}): {} free of {}, {} needed",
        s.base_bdev,
        human(s.free_clusters.saturating_mul(s.cluster_size)),
        human(s.total_data_clusters.saturating_mul(s.cluster_size)),
        human(need)
    ))
}

/// Lvol `lvol` after its copy: no longer a clone of a bdev, every cluster
/// of its size allocated.
async fn check_copied(client: &SpdkClient, lvol: &str) -> Result<(), String> {
    let inv = super::Inventory::load(client).await.map_err(|e| {
        format!(
            "reading spdk_tgt after copying into {lvol}: {}",
            crate::util::error_chain(&e)
        )
    })?;
    let l = inv
        .lvols
        .get(lvol)
        .ok_or_else(|| format!("{lvol} is gone after the copy"))?;
    let cluster = inv
        .lvstores
        .iter()
        .find(|s| s.name == l.lvs.name)
        .map_or(0, |s| s.cluster_size);
    let bytes = inv
        .bdevs
        .get(&l.uuid)
        .map_or(0, |b| u64::from(b.block_size) * b.num_blocks);
    let want = if cluster == 0 { 0 } else { bytes.div_ceil(cluster) };
    if l.is_esnap_clone || l.num_allocated_clusters < want {
        return Err(format!(
            "{lvol} holds {} of its {want} clusters after the copy{}: the file was not copied in",
            l.num_allocated_clusters,
            if l.is_esnap_clone {
                " and still reads the file"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

/// Deletes the replica lvols of volume `vol` that still have a bdev as
/// their parent: a restore cut off between `bdev_lvol_set_parent_bdev` and
/// the end of its copy (a stop of talon or spdk_tgt); such a replica is
/// never served. Returns the lvols deleted.
pub async fn remove_unfinished(
    client: &SpdkClient,
    inv: &super::Inventory,
    vol: &str,
) -> Result<Vec<String>, String> {
    use super::super::naming::{LVS_PREFIX, LvolRole, parse_lvol};
    let mut out = Vec::new();
    for l in inv.lvols.values() {
        let mine = l.lvs.name.starts_with(LVS_PREFIX)
            && matches!(parse_lvol(&l.name), Some(LvolRole::Replica { volume, .. }) if volume == vol);
        if mine && l.is_esnap_clone {
            match client.bdev_lvol_delete(&ByName::new(&l.alias)).await {
                Ok(_) => out.push(l.alias.clone()),
                Err(e) if e.is(super::super::error::ErrorKind::NotFound) => {}
                Err(e) => return Err(format!("deleting {}: {}", l.alias, crate::util::error_chain(&e))),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_clones_of_one_copies_share_its_lock() {
        let a = Copies::default();
        let b = a.clone();
        let running = a.0.lock().await;
        assert!(
            b.0.try_lock().is_err(),
            "a clone's copy waits for the running one"
        );
        assert!(
            Copies::default().0.try_lock().is_ok(),
            "another target's does not"
        );
        drop(running);
        assert!(b.0.try_lock().is_ok());
    }
}
