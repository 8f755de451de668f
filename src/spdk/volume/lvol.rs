//! Single writes the Longhorn layer shares: an lvol deleted, a raid member
//! taken out, a raid deleted, a controller detached, each done when already
//! so; an lvol grown; a bdev's QoS cap. (A revert's heads: `revert.rs`.)

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

/// Takes bdev `member` out of the raid that holds it; one in no raid (or
/// not there) is no error.
pub async fn remove_raid_member(client: &SpdkClient, member: &str) -> Result<(), ClientError> {
    match client.bdev_raid_remove_base_bdev(&ByName::new(member)).await {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Detaches NVMe controller `name` (and its namespace bdevs); one that is
/// not there is no error.
pub async fn detach_controller(client: &SpdkClient, name: &str) -> Result<(), ClientError> {
    match client.bdev_nvme_detach_controller(&ByName::new(name)).await {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes raid bdev `name`; one that is not there is no error.
pub async fn delete_raid(client: &SpdkClient, name: &str) -> Result<(), ClientError> {
    match client
        .bdev_raid_delete(&crate::spdk::rpc::RaidDelete::new(name))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Makes thin lvol `name` of `mib` MiB in lvstore `lvs`; answers its UUID.
pub async fn create_thin(
    client: &SpdkClient,
    lvs: &str,
    name: &str,
    mib: u64,
) -> Result<String, ClientError> {
    client
        .bdev_lvol_create(&crate::spdk::rpc::LvolCreate::thin(lvs, name, mib))
        .await
}

/// Grows lvol `lvol` (an alias `lvs/name`) to `mib` MiB (SPDK rounds up to
/// whole clusters); an lvol under a raid or an export grows in place.
pub async fn resize(client: &SpdkClient, lvol: &str, mib: u64) -> Result<(), ClientError> {
    client
        .bdev_lvol_resize(&crate::spdk::rpc::LvolResize {
            name: lvol.to_owned(),
            size_in_mib: mib,
        })
        .await
        .map(|_| ())
}

/// Snapshots lvol `lvol` (an alias `lvs/name`) as `snapshot` in its lvstore.
pub async fn snapshot(client: &SpdkClient, lvol: &str, snapshot: &str) -> Result<(), ClientError> {
    client
        .bdev_lvol_snapshot(&crate::spdk::rpc::LvolSnapshot {
            lvol_name: lvol.to_owned(),
            snapshot_name: snapshot.to_owned(),
        })
        .await
        .map(|_| ())
}

/// Caps (with 0 lifts) the reads and writes of bdev `bdev` at `mbps` MB/s
/// (SPDK's `bdev_set_qos_limit` `rw_mbytes_per_sec`). On v26.05 a limit set
/// on a bdev nobody has open cannot be changed or lifted again (EAGAIN):
/// cap only what is open (a raid member, an exported head).
pub async fn set_qos_cap(client: &SpdkClient, bdev: &str, mbps: u64) -> Result<(), ClientError> {
    client
        .bdev_set_qos_limit(&crate::spdk::rpc::QosLimit {
            name: bdev.to_owned(),
            rw_mbytes_per_sec: mbps,
        })
        .await
        .map(|_| ())
}

/// Takes host `host` off subsystem `nqn`'s allowed hosts; SPDK then
/// disconnects it (`nvmf_subsystem_remove_host` ends its connections). One
/// not listed (or a subsystem that is not there) is no error.
pub async fn disallow_host(client: &SpdkClient, nqn: &str, host: &str) -> Result<(), ClientError> {
    match client
        .nvmf_subsystem_remove_host(&crate::spdk::rpc::SubsystemHostParams {
            nqn: nqn.to_owned(),
            host: host.to_owned(),
        })
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}
