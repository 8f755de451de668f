//! Single writes of one SPDK object: an lvol deleted or renamed, a raid
//! member taken out, a raid deleted, a controller detached, each done when
//! already so; a head made again; an lvol grown; a bdev's QoS cap. Private
//! to the engine: outside `spdk/volume` (the Longhorn controller, the
//! replica-side calls, the restores) they are [`VolumeOps`] methods, so
//! every SPDK write of the V2 engine goes through one door.

use super::VolumeOps;
use crate::spdk::rpc::ByName;
use crate::spdk::{ClientError, ErrorKind, SpdkClient};

/// Deletes lvol `alias` (`<lvstore>/<name>`); one that is not there is no
/// error. SPDK refuses a snapshot two or more clones depend on ("Operation
/// not permitted", `ErrorKind::Busy`).
pub(super) async fn delete_lvol(client: &SpdkClient, alias: &str) -> Result<(), ClientError> {
    match client.bdev_lvol_delete(&ByName::new(alias)).await {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Takes bdev `member` out of the raid that holds it; one in no raid (or
/// not there) is no error.
pub(super) async fn remove_raid_member(client: &SpdkClient, member: &str) -> Result<(), ClientError> {
    match client.bdev_raid_remove_base_bdev(&ByName::new(member)).await {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

/// How often, and how far apart, a controller being reset (EBUSY) is asked
/// again to disable before it is detached anyway.
const DISABLE_TRIES: u32 = 10;
const DISABLE_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Detaches NVMe controller `name` (and its namespace bdevs); one that is
/// not there is no error. The controller is disabled first (best effort):
/// v26.05 lets a namespace-change AEN that its admin queue poller reads
/// after the detach dropped the controller's last reference make a new
/// namespace bdev on it (bdev_nvme.c: `nvme_ctrlr_ns_attr_changed_cb` calls
/// `nvme_ctrlr_populate_namespaces` without checking `destruct`;
/// `nvme_ns_create` takes a reference with only an `assert` that one is
/// left). The detach then frees the namespace and the controller under that
/// bdev (`_nvme_ctrlr_delete`), and the next `bdev_get_bdevs` reads freed
/// memory (`nvme_namespace_info_json` -> `spdk_nvme_ns_get_ctrlr`) and kills
/// the target. A remote replica's node re-adding its namespace (a rebuild's
/// reset head) while the engine detached it did this once in a rehearsal,
/// and a two-target loop did it within seven rounds. A disabled controller's
/// admin queue poller is paused (`bdev_nvme_disable_ctrlr_complete`), so no
/// AEN is read from then on; the same loop disabling first never did in 150.
pub(super) async fn detach_controller(client: &SpdkClient, name: &str) -> Result<(), ClientError> {
    disable_controller(client, name).await;
    match client.bdev_nvme_detach_controller(&ByName::new(name)).await {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Disables NVMe controller `name` ([`detach_controller`]'s first step): one
/// being reset answers EBUSY and is asked again a few times; any other
/// answer (done, already disabled, not there, being deleted) ends it.
async fn disable_controller(client: &SpdkClient, name: &str) {
    for _ in 0..DISABLE_TRIES {
        match client.bdev_nvme_disable_controller(&ByName::new(name)).await {
            Err(e) if e.is(ErrorKind::Busy) => tokio::time::sleep(DISABLE_RETRY).await,
            _ => return,
        }
    }
}

/// Deletes raid bdev `name`; one that is not there is no error.
pub(super) async fn delete_raid(client: &SpdkClient, name: &str) -> Result<(), ClientError> {
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
pub(super) async fn create_thin(
    client: &SpdkClient,
    lvs: &str,
    name: &str,
    mib: u64,
) -> Result<String, ClientError> {
    client
        .bdev_lvol_create(&crate::spdk::rpc::LvolCreate::thin(lvs, name, mib))
        .await
}

/// Renames lvol `alias` (`<lvstore>/<name>`) to `new_name` in its lvstore.
pub(super) async fn rename(client: &SpdkClient, alias: &str, new_name: &str) -> Result<(), ClientError> {
    client
        .bdev_lvol_rename(&crate::spdk::rpc::LvolRename {
            old_name: alias.to_owned(),
            new_name: new_name.to_owned(),
        })
        .await
        .map(|_| ())
}

/// What [`remake_head`] makes a head again from.
#[derive(Debug, Clone, Copy)]
pub(super) enum HeadFrom<'a> {
    /// A clone of this snapshot (its alias, `lvs/name`).
    Snapshot(&'a str),
    /// A thin lvol of this many MiB, empty.
    Fresh(u64),
}

/// A [`remake_head`] that failed: what it was doing, and SPDK's answer.
#[derive(Debug)]
pub(super) struct RemakeFailed {
    pub(super) doing: String,
    pub(super) source: ClientError,
}

/// Makes head `lvs/head` again: deleted (one not there is no error), then
/// made a clone of a snapshot or a fresh thin lvol (`from`); answers its
/// UUID. Every head made again is made here: a revert's, a rebuild dest's
/// (talon's local one, a Longhorn replica's); what else each deletes around
/// it is its caller's rule.
pub(super) async fn remake_head(
    client: &SpdkClient,
    lvs: &str,
    head: &str,
    from: HeadFrom<'_>,
) -> Result<String, RemakeFailed> {
    let alias = format!("{lvs}/{head}");
    let failed = |doing: String| move |source| RemakeFailed { doing, source };
    delete_lvol(client, &alias)
        .await
        .map_err(failed(format!("deleting {alias}")))?;
    match from {
        HeadFrom::Snapshot(s) => client
            .bdev_lvol_clone(&crate::spdk::rpc::LvolClone {
                snapshot_name: s.to_owned(),
                clone_name: head.to_owned(),
            })
            .await
            .map_err(failed(format!("cloning {s} into {alias}"))),
        HeadFrom::Fresh(mib) => create_thin(client, lvs, head, mib)
            .await
            .map_err(failed(format!("creating {alias} empty"))),
    }
}

/// Grows lvol `lvol` (an alias `lvs/name`) to `mib` MiB (SPDK rounds up to
/// whole clusters); an lvol under a raid or an export grows in place.
pub(super) async fn resize(client: &SpdkClient, lvol: &str, mib: u64) -> Result<(), ClientError> {
    client
        .bdev_lvol_resize(&crate::spdk::rpc::LvolResize {
            name: lvol.to_owned(),
            size_in_mib: mib,
        })
        .await
        .map(|_| ())
}

/// Snapshots lvol `lvol` (an alias `lvs/name`) as `snapshot` in its lvstore.
pub(super) async fn snapshot(client: &SpdkClient, lvol: &str, snapshot: &str) -> Result<(), ClientError> {
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
pub(super) async fn set_qos_cap(client: &SpdkClient, bdev: &str, mbps: u64) -> Result<(), ClientError> {
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
pub(super) async fn disallow_host(client: &SpdkClient, nqn: &str, host: &str) -> Result<(), ClientError> {
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

/// Clones snapshot `snapshot` (an alias `lvs/name`) as thin lvol `name` in
/// its lvstore; answers the clone's UUID.
pub(super) async fn clone(client: &SpdkClient, snapshot: &str, name: &str) -> Result<String, ClientError> {
    client
        .bdev_lvol_clone(&crate::spdk::rpc::LvolClone {
            snapshot_name: snapshot.to_owned(),
            clone_name: name.to_owned(),
        })
        .await
}

/// Makes snapshot `parent` the parent of thin lvol `lvol` (both aliases);
/// spdk_tgt v26.05 takes it for an lvol a raid claims.
pub(super) async fn set_parent(client: &SpdkClient, lvol: &str, parent: &str) -> Result<(), ClientError> {
    client
        .bdev_lvol_set_parent(&crate::spdk::rpc::LvolSetParent {
            lvol_name: lvol.to_owned(),
            parent_name: parent.to_owned(),
        })
        .await
        .map(|_| ())
}

/// The single writes of one object, for the engine's own modules
/// (`spdk/volume` and below); users outside it call `VolumeOps` methods
/// with a meaning (each as the function it calls above says).
impl VolumeOps {
    /// Deletes lvol `alias`; one not there is no error ([`delete_lvol`]).
    pub(super) async fn delete_lvol(&self, alias: &str) -> Result<(), ClientError> {
        delete_lvol(&self.client, alias).await
    }
    /// Disables and detaches NVMe controller `name`; one not there is no
    /// error ([`detach_controller`]).
    pub(super) async fn detach_controller(&self, name: &str) -> Result<(), ClientError> {
        detach_controller(&self.client, name).await
    }
    /// Makes thin lvol `lvs/name` of `mib` MiB; answers its UUID.
    pub(super) async fn create_thin(&self, lvs: &str, name: &str, mib: u64) -> Result<String, ClientError> {
        create_thin(&self.client, lvs, name, mib).await
    }
    /// Renames lvol `alias` to `new_name` in its lvstore.
    pub(super) async fn rename_lvol(&self, alias: &str, new_name: &str) -> Result<(), ClientError> {
        rename(&self.client, alias, new_name).await
    }
    /// Snapshots lvol `lvol` as `snapshot` in its lvstore.
    pub(super) async fn snapshot_lvol(&self, lvol: &str, name: &str) -> Result<(), ClientError> {
        snapshot(&self.client, lvol, name).await
    }
    /// Caps (0 lifts) bdev `bdev`'s reads and writes at `mbps` MB/s; only
    /// on a bdev someone has open ([`set_qos_cap`]).
    pub(super) async fn set_qos_cap(&self, bdev: &str, mbps: u64) -> Result<(), ClientError> {
        set_qos_cap(&self.client, bdev, mbps).await
    }
    /// Clones snapshot `snapshot` as thin lvol `name`; answers its UUID.
    pub(super) async fn clone_snapshot(&self, snapshot: &str, name: &str) -> Result<String, ClientError> {
        clone(&self.client, snapshot, name).await
    }
    /// Makes snapshot `parent` the parent of thin lvol `lvol` ([`set_parent`]).
    pub(super) async fn set_parent(&self, lvol: &str, parent: &str) -> Result<(), ClientError> {
        set_parent(&self.client, lvol, parent).await
    }
}
