//! Engine controllers: the V1 engine (tgtd) and the V2 engine (SPDK).

pub mod selection;
pub mod spdk_disk;
pub mod spdk_events;
pub mod spdk_target;
pub mod spdk_volume;
pub mod v1;
pub mod v1_target;
pub mod v1_volume;
