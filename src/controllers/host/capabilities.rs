//! `host.HostCapabilitiesController`: sums up what the host can do.
//!
//! ```text
//!   HugepagesStatus[2M-*] ──┐
//!   KernelModuleStatus ─────┼─> HostCapabilities "node"
//!   os-release, IOMMU, /proc/mounts (observed) ┘
//! ```

use std::time::Duration;

use crate::host::hugepages::{self, PageSize};
use crate::host::modules::ModuleState;
use crate::host::{HostRoot, os, pci};
use crate::resources::host::{HostCapabilities, HugepagesStatus, KernelModuleStatus};
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};

/// Derives `HostCapabilities` from the status resources and the OS.
#[derive(Debug, Clone)]
pub struct HostCapabilitiesController {
    pub host: HostRoot,
    pub interval: Duration,
}

#[async_trait::async_trait]
impl Controller for HostCapabilitiesController {
    fn name(&self) -> &'static str {
        "host.HostCapabilitiesController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::of::<HugepagesStatus>(), Input::of::<KernelModuleStatus>()]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<HostCapabilities>()]
    }
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let os = os::detect(&self.host)?;
        let talos = os.is_talos();
        let modules = ctx.list::<KernelModuleStatus>()?;
        let state = |name: &str| modules.iter().find(|m| m.id() == name).map(|m| m.spec.state);
        let nvme_tcp = state("nvme_tcp").is_some_and(ModuleState::is_present);
        let pools = ctx.list::<HugepagesStatus>()?;
        let two_m = pools.iter().filter(|p| p.spec.size == PageSize::Size2M);
        let (total, free) = two_m.fold((0, 0), |(t, f), p| (t + p.spec.total_mib, f + p.spec.free_mib));
        let caps = HostCapabilities {
            os_id: os.id,
            talos,
            nvme_tcp,
            nvme_tcp_loadable: !nvme_tcp && !talos && state("nvme_tcp") == Some(ModuleState::Available),
            iscsi_tcp: state("iscsi_tcp").is_some_and(ModuleState::is_present),
            iommu: pci::iommu_active(&self.host),
            hugepages_total_mib: total,
            hugepages_free_mib: free,
            hugetlbfs_mounted: hugepages::hugetlbfs_mounts(&self.host)
                .map(|m| !m.is_empty())
                .unwrap_or(false),
        };
        ctx.apply("node", caps)?;
        Ok(Requeue::After(self.interval))
    }
}
