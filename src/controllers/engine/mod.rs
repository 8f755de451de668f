//! Engine controllers: the V1 engine (tgtd) and the V2 engine (SPDK).

pub mod backup;
pub mod peer;
pub mod restore;
pub mod selection;
pub mod snapshot_copy;
pub mod spdk_disk;
pub mod spdk_events;
pub mod spdk_orphans;
pub mod spdk_target;
pub mod spdk_volume;
pub mod tasks;
pub mod v1;
pub mod v1_target;
pub mod v1_volume;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a clean stop of talon (SIGTERM, SIGINT) does to the targets it holds
/// (spdk_tgt, tgtd): leave them serving for the next talon to adopt (the
/// daemon's default, so a restart or an upgrade of talon never interrupts
/// volume I/O), or stop them (`talon serve --stop-targets-on-exit`, a drain of
/// the node). Shared: the daemon can change it while it runs.
#[derive(Debug, Clone, Default)]
pub struct TargetsOnExit(Arc<AtomicBool>);

impl TargetsOnExit {
    /// Targets keep running after talon stops.
    pub fn leave() -> Self {
        Self::default()
    }

    /// Targets are stopped with talon.
    pub fn stop() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }

    /// Stop (true) or leave (false) the targets when talon stops.
    pub fn set_stop(&self, stop: bool) {
        self.0.store(stop, Ordering::SeqCst);
    }

    /// Whether the targets are stopped with talon.
    pub fn stops(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
