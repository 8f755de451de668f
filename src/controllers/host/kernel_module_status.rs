//! `host.KernelModuleStatusController`: one `KernelModuleStatus` per module talon uses.
//!
//! ```text
//!   /proc/modules, modules.builtin, modules.dep ─> modules::module_state ─> KernelModuleStatus "nvme_tcp"
//! ```

use std::time::Duration;

use crate::host::{HostRoot, modules};
use crate::resources::host::KernelModuleStatus;
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};

/// Observes the kernel modules in [`modules::TALON_MODULES`].
#[derive(Debug, Clone)]
pub struct KernelModuleStatusController {
    pub host: HostRoot,
    pub interval: Duration,
}

#[async_trait::async_trait]
impl Controller for KernelModuleStatusController {
    fn name(&self) -> &'static str {
        "host.KernelModuleStatusController"
    }
    fn inputs(&self) -> Vec<Input> {
        Vec::new()
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<KernelModuleStatus>()]
    }
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        for &m in modules::TALON_MODULES {
            let state = modules::module_state(&self.host, m)?;
            ctx.apply(
                m,
                KernelModuleStatus {
                    state,
                    present: state.is_present(),
                },
            )?;
        }
        Ok(Requeue::After(self.interval))
    }
}
