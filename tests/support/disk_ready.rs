//! What the disk controller reports, for tests that run the volume
//! controller without it: every configured disk `Ready` on the running
//! target. (The volume controller places replicas only on disks ready on
//! the running spdk_tgt: an lvstore in SPDK's listing may not have opened
//! its lvols yet.) Call it once the disks' lvstores are loaded, after each
//! target (re)start, as the disk controller would after its
//! `bdev_wait_for_examine`.

use talon::resources::config::Disk;
use talon::resources::engine::{DiskStatus, Engine, ObjectState, TargetStatus};
use talon::runtime::State;

/// Marks every `Disk` in `state` ready on `target`.
pub fn disks_ready_on(state: &State, target: &TargetStatus) {
    for d in state.list_typed::<Disk>().expect("disks") {
        let id = d.id().to_owned();
        let st = DiskStatus {
            engine: Engine::V2,
            state: ObjectState::Ready,
            bdev: format!("talon-disk-{id}"),
            lvstore: format!("talon-{id}"),
            lvstore_uuid: String::new(),
            total_bytes: 0,
            free_bytes: 0,
            cluster_bytes: 0,
            message: format!("lvstore talon-{id} (set by the test for the disk controller)"),
            target: Some(target.instance()),
        };
        state.upsert_typed(&id, &st).expect("disk status");
    }
}
