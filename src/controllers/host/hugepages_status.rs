//! `host.HugepagesStatusController`: one `HugepagesStatus` per pool.
//!
//! ```text
//!   /sys/.../hugepages-<size>/{nr,free}_hugepages ─> hugepages::pools ─> HugepagesStatus "2M-node0"
//! ```

use std::time::Duration;

use crate::host::{HostRoot, hugepages};
use crate::resources::host::HugepagesStatus;
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};

/// Observes the hugepage pools.
#[derive(Debug, Clone)]
pub struct HugepagesStatusController {
    pub host: HostRoot,
    pub interval: Duration,
}

#[async_trait::async_trait]
impl Controller for HugepagesStatusController {
    fn name(&self) -> &'static str {
        "host.HugepagesStatusController"
    }
    fn inputs(&self) -> Vec<Input> {
        Vec::new()
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<HugepagesStatus>()]
    }
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        for pool in hugepages::pools(&self.host)? {
            let status = HugepagesStatus::from(&pool);
            ctx.apply(&status.id(), status)?;
        }
        Ok(Requeue::After(self.interval))
    }
}
