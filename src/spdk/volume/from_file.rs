//! Restores made before the data mover: a file's data copied into a thin
//! lvol by making the file's aio bdev the lvol's external snapshot
//! (`bdev_lvol_set_parent_bdev`) and then `bdev_lvol_decouple_parent`.
//! talon restores through the mover now ([`super::mover::restore`]); what
//! is left here removes what such a restore left when a talon of before
//! stopped in it: a replica lvol that still has a bdev as its parent.

use super::super::client::SpdkClient;
use super::super::rpc::ByName;
use super::VolumeError;

/// Deletes the replica lvols of volume `vol` that still have a bdev as
/// their parent: a restore cut off between `bdev_lvol_set_parent_bdev` and
/// the end of its copy (a stop of talon or spdk_tgt); such a replica is
/// never served. Returns the lvols deleted.
pub async fn remove_unfinished(
    client: &SpdkClient,
    inv: &super::Inventory,
    vol: &str,
) -> Result<Vec<String>, VolumeError> {
    use super::super::naming::{LVS_PREFIX, LvolRole, parse_lvol};
    let mut out = Vec::new();
    for l in inv.lvols.values() {
        let mine = l.lvs.name.starts_with(LVS_PREFIX)
            && matches!(parse_lvol(&l.name), Some(LvolRole::Replica { volume, .. }) if volume == vol);
        if mine && l.is_esnap_clone {
            match client.bdev_lvol_delete(&ByName::new(&l.alias)).await {
                Ok(_) => out.push(l.alias.clone()),
                Err(e) if e.is(super::super::error::ErrorKind::NotFound) => {}
                Err(source) => {
                    return Err(VolumeError::Rpc {
                        volume: vol.to_owned(),
                        step: format!("deleting {} (its restore was cut off)", l.alias),
                        source,
                    });
                }
            }
        }
    }
    Ok(out)
}
