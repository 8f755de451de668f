//! Host controllers: they prepare the host through [`HostRoot`] and publish
//! `host` resources. `HugepagesConfigController` derives what SPDK needs and
//! touches nothing; `HugepagesController` is the only writer of
//! `nr_hugepages`; the others observe.
//!
//! ```text
//!   NodeConfig, Volume, Disk ─> HugepagesConfigController ─> HugepagesSpec
//!   HugepagesSpec ─> HugepagesController (writes nr_hugepages) ─> HugepagesStatus ──┐
//!   Disk, Volume ─> KernelModuleController (modprobe; not on Talos) ─> KernelModuleStatus ┼─> HostCapabilitiesController ─> HostCapabilities
//!   HostRoot ─> PciDeviceStatusController    ─> PciDevice          │        (+ os-release, IOMMU)
//!   Disk (pci) ─> PciBindController (driver_override, drivers_probe) ─> PciBindingStatus, PciBindIntent (ledger)
//!                                   every 30 s (requeue), or on input change
//! ```

pub mod capabilities;
pub mod hugepages;
pub mod hugepages_config;
pub mod kernel_modules;
pub mod pci_binding;
pub mod pci_device_status;

use std::time::Duration;

use crate::host::HostRoot;
use crate::runtime::{Runtime, RuntimeError};

pub use capabilities::HostCapabilitiesController;
pub use hugepages::HugepagesController;
pub use hugepages_config::{HugepagesConfigController, SpdkDemand};
pub use kernel_modules::KernelModuleController;
pub use pci_binding::PciBindController;
pub use pci_device_status::PciDeviceStatusController;

/// How often the status controllers look again.
pub const POLL: Duration = Duration::from_secs(30);

/// Registers the controllers that derive the host's desired state from the
/// `config` namespace (what SPDK needs of it).
pub fn register_config(rt: &mut Runtime, host: &HostRoot, demand: SpdkDemand) -> Result<(), RuntimeError> {
    rt.register(HugepagesConfigController {
        host: host.clone(),
        demand,
    })
}

/// Registers the host controllers, polling every `interval`.
pub fn register(rt: &mut Runtime, host: &HostRoot, interval: Duration) -> Result<(), RuntimeError> {
    rt.register(HugepagesController::new(host.clone(), interval))?;
    rt.register(KernelModuleController::new(host.clone(), interval))?;
    rt.register(PciDeviceStatusController {
        host: host.clone(),
        interval,
    })?;
    rt.register(PciBindController {
        host: host.clone(),
        interval,
    })?;
    rt.register(HostCapabilitiesController {
        host: host.clone(),
        interval,
    })?;
    Ok(())
}

/// Prepares the host once before the controllers start: sizes the hugepage
/// pools for the desired state in `state`, assuming V2 wherever SPDK can
/// run, so that the engine selection made at start sees the pool talon
/// reserves. Failures are logged (the controllers report them again).
pub fn prepare_at_start(state: &crate::runtime::State, deps: &crate::controllers::Deps) {
    use crate::controllers::engine::selection::EngineSelection;
    use crate::resources::config::{Disk, NodeConfig, Volume};
    let socket = deps.spdk.target_config(&deps.run_dir).socket();
    let mut selection = EngineSelection::detect_with_socket(&deps.spdk, &deps.host, &socket);
    let demand = SpdkDemand::new(&deps.spdk, &selection);
    selection.v2_available = demand.spdk.is_ok();
    let demand = SpdkDemand { selection, ..demand };
    let run = || -> Result<(), crate::runtime::ControllerError> {
        let node = state
            .get_typed::<NodeConfig>("node")?
            .map(|n| n.spec)
            .unwrap_or_default();
        let volumes: Vec<Volume> = state
            .list_typed::<Volume>()?
            .into_iter()
            .map(|v| v.spec)
            .collect();
        let disks = state.list_typed::<Disk>()?.len();
        let specs = hugepages_config::desired(&deps.host, &demand, &node, &volumes, disks)?;
        hugepages::size_at_start(&deps.host, state, &specs)
    };
    if let Err(e) = run() {
        tracing::warn!(error = %crate::util::error_chain(e.as_ref()), "hugepages not sized at start");
    }
}
