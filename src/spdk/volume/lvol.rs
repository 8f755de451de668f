//! Single lvol writes the Longhorn layer shares with talon's volumes.

use crate::spdk::rpc::ByName;
use crate::spdk::{ClientError, ErrorKind, SpdkClient};

/// Deletes lvol `alias` (`<lvstore>/<name>`); one that is not there is no
/// error. SPDK refuses a snapshot two or more clones depend on ("Operation
/// not permitted", `ErrorKind::Busy`).
pub async fn delete_lvol(client: &SpdkClient, alias: &str) -> Result<(), ClientError> {
    match client.bdev_lvol_delete(&ByName::new(alias)).await {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}
