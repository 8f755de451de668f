//! Host status controllers: they observe the host through [`HostRoot`] and
//! publish `host` resources; none of them writes to the host.
//!
//! ```text
//!   HostRoot ─> HugepagesStatusController    ─> HugepagesStatus ──┐
//!   HostRoot ─> KernelModuleStatusController ─> KernelModuleStatus ┼─> HostCapabilitiesController ─> HostCapabilities
//!   HostRoot ─> PciDeviceStatusController    ─> PciDevice          │        (+ os-release, IOMMU)
//!                                   every 30 s (requeue), or on input change
//! ```

pub mod capabilities;
pub mod hugepages_status;
pub mod kernel_module_status;
pub mod pci_device_status;

use std::time::Duration;

use crate::host::HostRoot;
use crate::runtime::{Runtime, RuntimeError};

pub use capabilities::HostCapabilitiesController;
pub use hugepages_status::HugepagesStatusController;
pub use kernel_module_status::KernelModuleStatusController;
pub use pci_device_status::PciDeviceStatusController;

/// How often the status controllers look again.
pub const POLL: Duration = Duration::from_secs(30);

/// Registers the host controllers, polling every `interval`.
pub fn register(rt: &mut Runtime, host: &HostRoot, interval: Duration) -> Result<(), RuntimeError> {
    rt.register(HugepagesStatusController {
        host: host.clone(),
        interval,
    })?;
    rt.register(KernelModuleStatusController {
        host: host.clone(),
        interval,
    })?;
    rt.register(PciDeviceStatusController {
        host: host.clone(),
        interval,
    })?;
    rt.register(HostCapabilitiesController {
        host: host.clone(),
        interval,
    })?;
    Ok(())
}
