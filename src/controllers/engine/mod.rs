//! Engine controllers: the V1 engine (tgtd) and the V2 engine (SPDK).

pub mod v1;
pub mod v1_target;
pub mod v1_volume;
pub mod spdk_volume;
