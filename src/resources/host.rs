//! Host resources (namespace `host`), written by the controllers in
//! [`crate::controllers::host`]: specs derived from desired state, and
//! status observed from the host.
//!
//! ```text
//!   NodeConfig, Volume ─> HugepagesSpec   (id "2M-node0": pages wanted and why; SPDK's -s)
//!   host::hugepages ─> HugepagesStatus   (id "2M-node0", or "2M" without NUMA: wanted/have/why)
//!                      HugepagesLedger   (namespace `ledger`: the pool before talon grew it)
//!   Disk (pci) ─> PciBindIntent (namespace `ledger`, id = PCI address: persisted before a rebind)
//!              ─> PciBindingStatus (id = disk: which driver, and why not yet)
//!   host::modules   ─> KernelModuleStatus (id = module name: state, wanted, what talon did)
//!   host::pci       ─> PciDevice          (id = PCI address)
//!   all of them     ─> HostCapabilities   (id "node")
//! ```

use serde::{Deserialize, Serialize};

use crate::host::hugepages::{HugepagePool, PageSize};
use crate::host::modules::ModuleState;
use crate::runtime::Spec;

/// The hugepages SPDK needs from one pool (id as [`HugepagesStatus`]),
/// derived from `NodeConfig.hugepages` and the volumes this node exports.
/// Read by the hugepage controller (which sizes the pool) and by whoever
/// sizes spdk_tgt's `-s` (`spdkMemMib`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HugepagesSpec {
    /// Page size (talon sizes 2 MiB pools).
    pub size: PageSize,
    /// NUMA node; absent for the global pool of a host without NUMA sysfs.
    pub node: Option<u32>,
    /// `auto`, `off` or `<n> MiB`, as configured.
    pub mode: String,
    /// Pages wanted in this pool; absent with `off` (the pool is left alone).
    pub wanted: Option<u64>,
    /// The same in MiB.
    pub wanted_mib: Option<u64>,
    /// spdk_tgt's memory over all nodes (`-s`, MiB); 0 when SPDK needs none here.
    pub spdk_mem_mib: u64,
    /// NVMe/TCP volumes exported by this node, counted for `auto`.
    pub exported_volumes: u32,
    /// How the figure was reached.
    pub reason: String,
}

impl Spec for HugepagesSpec {
    const TYPE: &'static str = "HugepagesSpec";
    const NAMESPACE: &'static str = "host";
}

/// What a hugepage pool held before talon first grew it (namespace
/// `ledger`, persisted; id as [`HugepagesStatus`]): talon gives back only
/// pages it added, and only free ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HugepagesLedger {
    /// `nr_hugepages` before talon's first write (moved along when someone
    /// else resizes the pool).
    pub before: u64,
    /// What talon last wrote.
    pub set: u64,
}

impl Spec for HugepagesLedger {
    const TYPE: &'static str = "HugepagesLedger";
    const NAMESPACE: &'static str = "ledger";
}

/// Whether a pool holds what talon wants of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum HugepagesState {
    /// talon wants nothing of this pool.
    Unmanaged,
    /// The pool holds at least what is wanted.
    Ok,
    /// Fewer pages than wanted: `reason` says why and what fixes it.
    Short,
}

/// One hugepage pool: a page size on a NUMA node (or the whole host): what
/// talon wants of it, what it has, and why they differ.
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
    /// Pages talon wants in the pool (from `HugepagesSpec`).
    #[serde(default)]
    pub wanted: Option<u64>,
    /// Pages mapped or reserved by processes (never taken away).
    #[serde(default)]
    pub in_use: u64,
    /// Unmanaged, ok, or short.
    #[serde(default = "unmanaged")]
    pub state: HugepagesState,
    /// Why the pool is as it is: what talon did, what the kernel gave, or
    /// (Talos, read-only sysfs) what to change.
    #[serde(default)]
    pub reason: String,
    /// The Talos machine-config patch that gives the node the pool (Talos
    /// only, when short).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub talos_patch: Option<String>,
}

fn unmanaged() -> HugepagesState {
    HugepagesState::Unmanaged
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
            wanted: None,
            in_use: p.total.saturating_sub(p.free),
            state: HugepagesState::Unmanaged,
            reason: String::new(),
            talos_patch: None,
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
    /// Whether this node needs it now.
    #[serde(default)]
    pub wanted: bool,
    /// Why it is wanted, and what talon did (loaded it, could not, or on
    /// Talos the machine-config patch that loads it).
    #[serde(default)]
    pub message: String,
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

/// Where a recorded rebind stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BindPhase {
    /// Moving to the user-space driver (finished at the next start if cut short).
    Binding,
    /// On the user-space driver.
    Bound,
    /// Going back to the original driver (finished at the next start if cut short).
    Releasing,
}

/// A rebind talon does or did (namespace `ledger`, persisted, id = the PCI
/// address). Written before the first sysfs write of a bind and of a give
/// back, so a crash at any step is finished or rolled back at the next start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PciBindIntent {
    /// The Disk the device serves.
    pub disk: String,
    /// The Disk's `pci` (address, serial or model) when it was resolved.
    pub selector: String,
    /// The driver the device had before talon took it (`nvme`), absent when unbound.
    pub original_driver: Option<String>,
    /// `vfio-pci` or `uio_pci_generic`.
    pub target_driver: String,
    /// Binding, bound, or releasing.
    pub phase: BindPhase,
}

impl Spec for PciBindIntent {
    const TYPE: &'static str = "PciBindIntent";
    const NAMESPACE: &'static str = "ledger";
}

/// Where a Disk's NVMe device stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BindingState {
    /// Being moved to the user-space driver.
    Binding,
    /// On the user-space driver: SPDK may attach it.
    Bound,
    /// Not bound; `message` says why (in use, no driver, not found, ...).
    Failed,
    /// Waiting for SPDK to let go, or going back to its original driver.
    Releasing,
}

/// The driver binding of a Disk's NVMe device (id = the Disk).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PciBindingStatus {
    /// The Disk's `pci` as given.
    pub selector: String,
    /// The device's PCI address, once resolved.
    pub bdf: Option<String>,
    /// The driver it is on now.
    pub driver: Option<String>,
    /// The driver it goes back to when the Disk is removed.
    pub original_driver: Option<String>,
    /// The user-space driver chosen.
    pub target_driver: Option<String>,
    /// Binding, bound, failed or releasing.
    pub state: BindingState,
    /// Why, or what happened.
    pub message: String,
}

impl Spec for PciBindingStatus {
    const TYPE: &'static str = "PciBindingStatus";
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
        "A hugepage pool per size and NUMA node: wanted, have, why",
        &[
            ("STATE", "/state"),
            ("WANTED-PAGES", "/wanted"),
            ("TOTAL-PAGES", "/total"),
            ("FREE-PAGES", "/free"),
            ("IN-USE-PAGES", "/inUse"),
            ("TOTAL-MiB", "/totalMib"),
            ("FREE-MiB", "/freeMib"),
            ("REASON", "/reason"),
        ],
    );
    reg.register::<HugepagesSpec>(
        "The hugepages SPDK needs from a pool, and spdk_tgt's -s",
        &[
            ("MODE", "/mode"),
            ("WANTED", "/wanted"),
            ("SPDK-MEM-MiB", "/spdkMemMib"),
            ("VOLUMES", "/exportedVolumes"),
        ],
    );
    reg.register::<HugepagesLedger>(
        "A hugepage pool before talon grew it (persisted)",
        &[("BEFORE", "/before"), ("SET", "/set")],
    );
    reg.register::<KernelModuleStatus>(
        "A kernel module talon uses",
        &[
            ("STATE", "/state"),
            ("PRESENT", "/present"),
            ("WANTED", "/wanted"),
            ("MESSAGE", "/message"),
        ],
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
    reg.register::<PciBindingStatus>(
        "The driver binding of a Disk's NVMe device",
        &[
            ("STATE", "/state"),
            ("BDF", "/bdf"),
            ("DRIVER", "/driver"),
            ("ORIGINAL", "/originalDriver"),
            ("MESSAGE", "/message"),
        ],
    );
    reg.register::<PciBindIntent>(
        "A rebind talon does or did, persisted before it starts",
        &[
            ("DISK", "/disk"),
            ("PHASE", "/phase"),
            ("FROM", "/originalDriver"),
            ("TO", "/targetDriver"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_named_for_its_page_size() {
        let pool = |size, node| HugepagePool {
            size,
            node,
            total: 2,
            free: 1,
        };
        let s = HugepagesStatus::from(&pool(PageSize::Size1G, Some(0)));
        assert_eq!(s.id(), "1G-node0");
        assert_eq!((s.total_mib, s.free_mib), (2048, 1024));
        assert_eq!(HugepagesStatus::from(&pool(PageSize::Size2M, None)).id(), "2M");
    }
}
