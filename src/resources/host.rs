//! Host status resources (namespace `host`), written only by the status
//! controllers in [`crate::controllers::host`], which observe and never change
//! the host.
//!
//! ```text
//!   host::hugepages ─> HugepagesStatus   (id "2M-node0", or "2M" without NUMA)
//!   host::modules   ─> KernelModuleStatus (id = module name)
//!   host::pci       ─> PciDevice          (id = PCI address)
//!   all of them     ─> HostCapabilities   (id "node")
//! ```

use serde::{Deserialize, Serialize};

use crate::host::hugepages::{HugepagePool, PageSize};
use crate::host::modules::ModuleState;
use crate::runtime::Spec;

/// One hugepage pool: a page size on a NUMA node (or the whole host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HugepagesStatus {
    /// Page size, `2M` or `1G`.
    pub size: PageSize,
    /// NUMA node; absent for the global pool of a host without NUMA sysfs.
    pub node: Option<u32>,
    /// Pages in the pool (`nr_hugepages`).
    pub total: u64,
    /// Pages free (`free_hugepages`).
    pub free: u64,
    /// Pool size in MiB.
    pub total_mib: u64,
    /// Free MiB.
    pub free_mib: u64,
}

impl HugepagesStatus {
    /// The resource id: `2M-node0`, or `2M` for a global pool.
    pub fn id(&self) -> String {
        match self.node {
            Some(n) => format!("{}-node{n}", self.size),
            None => self.size.to_string(),
        }
    }
}

impl From<&HugepagePool> for HugepagesStatus {
    fn from(p: &HugepagePool) -> Self {
        Self {
            size: p.size,
            node: p.node,
            total: p.total,
            free: p.free,
            total_mib: p.total_mib(),
            free_mib: p.free_mib(),
        }
    }
}

impl Spec for HugepagesStatus {
    const TYPE: &'static str = "HugepagesStatus";
    const NAMESPACE: &'static str = "host";
}

/// Whether a kernel module talon uses is present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KernelModuleStatus {
    /// Loaded, builtin, available (installed, not loaded) or missing.
    pub state: ModuleState,
    /// Whether its function is usable now (loaded or built in).
    pub present: bool,
}

impl Spec for KernelModuleStatus {
    const TYPE: &'static str = "KernelModuleStatus";
    const NAMESPACE: &'static str = "host";
}

/// An NVMe PCI controller on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PciDevice {
    /// Vendor ID, `0x8086`.
    pub vendor: String,
    /// Device ID.
    pub device: String,
    /// PCI class, `0x010802`.
    pub class: String,
    /// NUMA node, when the platform reports one.
    pub numa_node: Option<u32>,
    /// Bound driver (`nvme`, `vfio-pci`, `uio_pci_generic`), absent when unbound.
    pub driver: Option<String>,
    /// IOMMU group.
    pub iommu_group: Option<u32>,
    /// Other members of the IOMMU group (`bdf` or `bdf=driver`).
    pub iommu_peers: Vec<String>,
    /// Why vfio-pci cannot take it, when it cannot.
    pub vfio_blocker: Option<String>,
    /// Namespaces while the nvme driver has it.
    pub block_devices: Vec<String>,
    /// Model, while the nvme driver has it.
    pub model: Option<String>,
    /// Serial, while the nvme driver has it.
    pub serial: Option<String>,
    /// Total namespace size in bytes.
    pub size_bytes: Option<u64>,
}

impl Spec for PciDevice {
    const TYPE: &'static str = "PciDevice";
    const NAMESPACE: &'static str = "host";
}

/// What this host can do, summed up (id `node`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostCapabilities {
    /// os-release `ID`.
    pub os_id: String,
    /// Talos Linux: modules and hugepages come from the machine config.
    pub talos: bool,
    /// nvme_tcp is loaded or built in.
    pub nvme_tcp: bool,
    /// nvme_tcp is not present but modprobe could load it (never on Talos).
    pub nvme_tcp_loadable: bool,
    /// iscsi_tcp is loaded or built in.
    pub iscsi_tcp: bool,
    /// An IOMMU is active.
    pub iommu: bool,
    /// 2 MiB hugepages in the pool, MiB.
    pub hugepages_total_mib: u64,
    /// 2 MiB hugepages free, MiB.
    pub hugepages_free_mib: u64,
    /// hugetlbfs is mounted somewhere.
    pub hugetlbfs_mounted: bool,
}

impl Spec for HostCapabilities {
    const TYPE: &'static str = "HostCapabilities";
    const NAMESPACE: &'static str = "host";
}

/// Registers the host types with their table columns.
pub fn register_types(reg: &mut crate::runtime::TypeRegistry) {
    reg.register::<HugepagesStatus>(
        "A hugepage pool per size and NUMA node",
        &[
            ("SIZE", "/size"),
            ("NODE", "/node"),
            ("TOTAL", "/total"),
            ("FREE", "/free"),
            ("FREE-MiB", "/freeMib"),
        ],
    );
    reg.register::<KernelModuleStatus>(
        "A kernel module talon uses",
        &[("STATE", "/state"), ("PRESENT", "/present")],
    );
    reg.register::<PciDevice>(
        "An NVMe PCI controller",
        &[
            ("DRIVER", "/driver"),
            ("NUMA", "/numaNode"),
            ("IOMMU", "/iommuGroup"),
            ("SERIAL", "/serial"),
            ("MODEL", "/model"),
        ],
    );
    reg.register::<HostCapabilities>(
        "What this host can do",
        &[
            ("OS", "/osId"),
            ("TALOS", "/talos"),
            ("NVME-TCP", "/nvmeTcp"),
            ("IOMMU", "/iommu"),
            ("HUGEPAGES-FREE-MiB", "/hugepagesFreeMib"),
        ],
    );
}
