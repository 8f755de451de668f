//! `host.PciDeviceStatusController`: one `PciDevice` per NVMe PCI controller.
//!
//! ```text
//!   /sys/bus/pci/devices/<bdf> (class 0x010802) ─> pci::list_nvme ─> PciDevice "<bdf>"
//! ```

use std::time::Duration;

use crate::host::{HostRoot, pci};
use crate::resources::host::PciDevice;
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};

/// Observes NVMe PCI devices (inventory only; binding is explicit).
#[derive(Debug, Clone)]
pub struct PciDeviceStatusController {
    pub host: HostRoot,
    pub interval: Duration,
}

#[async_trait::async_trait]
impl Controller for PciDeviceStatusController {
    fn name(&self) -> &'static str {
        "host.PciDeviceStatusController"
    }
    fn inputs(&self) -> Vec<Input> {
        Vec::new()
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<PciDevice>()]
    }
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        for d in pci::list_nvme(&self.host)? {
            let vfio_blocker = pci::vfio_blocker(&self.host, &d);
            let spec = PciDevice {
                vendor: d.vendor,
                device: d.device,
                class: d.class,
                numa_node: d.numa_node,
                driver: d.driver,
                iommu_group: d.iommu_group,
                iommu_peers: d
                    .iommu_peers
                    .into_iter()
                    .map(|p| match p.driver {
                        Some(drv) => format!("{}={drv}", p.bdf),
                        None => p.bdf,
                    })
                    .collect(),
                vfio_blocker,
                block_devices: d.block_devices,
                model: d.model,
                serial: d.serial,
                size_bytes: d.size_bytes,
            };
            ctx.apply(d.bdf.as_str(), spec)?;
        }
        Ok(Requeue::After(self.interval))
    }
}
