//! NVMe PCI devices: inventory, in-use checks and safe driver binding.
//!
//! ```text
//!   /sys/bus/pci/devices/<bdf>/{vendor,device,class,numa_node,driver,iommu_group}
//!         └─ nvme/nvmeX/{model,serial,nvmeXnY}   /sys/block/nvmeXnY/{size,dev,holders,<parts>}
//!                              │
//!   select (BDF | serial | model) ──> PciDevice ──> in_use? (mounts, swap, holders, partitions,
//!                              │                     signatures in the first sectors; or a process
//!                              │                     holding /dev/vfio/<group> or /dev/uioN open)
//!                              ▼
//!   rebind: driver_override=<to> ─> <bdf>/driver/unbind ─> drivers_probe ─> driver == <to>?
//!             │ any failure: driver_override=<from>, drivers_probe, verify <from>   (rollback)
//!             └ always:      driver_override cleared
//! ```
//!
//! Binding uses `driver_override` + `drivers_probe`, never `new_id` (which would
//! grab every device with the same IDs). vfio-pci is chosen when an IOMMU is
//! active and the device's IOMMU group is viable (every other member unbound or
//! on vfio-pci, PCIe ports allowed as the kernel allows them); uio_pci_generic
//! otherwise. Devices are selected by BDF, serial or model, never by /dev name,
//! which changes across boots.

use super::{HostIoError, HostRoot, modules};
use crate::util::failpoint;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Read;
use std::time::{Duration, Instant};

/// The PCI class of an NVMe controller (mass storage, NVM, NVMe).
pub const NVME_CLASS: &str = "0x010802";
const DEVICES: &str = "/sys/bus/pci/devices";
/// How long to wait for an (asynchronous) probe to bind a driver.
const PROBE_WAIT: Duration = Duration::from_secs(10);
/// The same on a fixture tree (where a test may play the kernel).
const FIXTURE_PROBE_WAIT: Duration = Duration::from_secs(2);

/// Errors of PCI inventory and binding.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    #[error("malformed PCI address {0:?} (expected dddd:bb:dd.f, e.g. 0000:01:00.0)")]
    MalformedBdf(String),
    #[error(
        "{0:?} is a /dev name; select a disk by PCI address, serial or model (device names change across boots)"
    )]
    DevName(String),
    #[error("no PCI device {0} on this host")]
    UnknownDevice(String),
    #[error("no NVMe device with PCI address, serial or model {0:?}")]
    NoMatch(String),
    #[error("{selector:?} matches several NVMe devices ({bdfs}); select one by PCI address")]
    Ambiguous { selector: String, bdfs: String },
    #[error("PCI device {bdf} is not an NVMe controller (class {class})")]
    NotNvme { bdf: String, class: String },
    #[error("cannot inspect PCI device {bdf}")]
    Inspect {
        bdf: String,
        #[source]
        source: HostIoError,
    },
    #[error("cannot list PCI devices")]
    List(#[source] HostIoError),
    #[error("refusing to rebind {bdf}: {reason}")]
    InUse { bdf: String, reason: String },
    #[error("cannot read the first sectors of {dev} (of {bdf}) to check for data")]
    ReadSignature {
        bdf: String,
        dev: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot bind {bdf} to {driver}: {reason}")]
    NoDriver {
        bdf: String,
        driver: String,
        reason: String,
    },
    #[error("cannot bind {bdf} to vfio-pci: {reason}")]
    VfioNotViable { bdf: String, reason: String },
    #[error("cannot bind {bdf} to a user-space driver: {reason}")]
    NoUserspaceDriver { bdf: String, reason: String },
    #[error("cannot rebind {bdf} to {to}; the device was put back on {restored}")]
    Rebind {
        bdf: String,
        to: String,
        restored: String,
        #[source]
        source: Box<PciError>,
    },
    #[error(
        "cannot rebind {bdf} to {to}, and putting it back on {from} failed too ({rollback}); check the device by hand"
    )]
    RebindRollback {
        bdf: String,
        to: String,
        from: String,
        rollback: String,
        #[source]
        source: Box<PciError>,
    },
    #[error("sysfs refused the write for {bdf}")]
    SysfsWrite {
        bdf: String,
        #[source]
        source: HostIoError,
    },
    #[error("{bdf} is on driver {got} after the probe, not {want}")]
    Verify { bdf: String, want: String, got: String },
}

/// A validated PCI address, `dddd:bb:dd.f`, lower-case.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
pub struct Bdf(String);

impl Bdf {
    /// Parses `dddd:bb:dd.f` or `bb:dd.f` (domain 0000).
    pub fn parse(s: &str) -> Result<Self, PciError> {
        let bad = || PciError::MalformedBdf(s.to_string());
        let lower = s.trim().to_ascii_lowercase();
        let full = if lower.matches(':').count() == 1 {
            format!("0000:{lower}")
        } else {
            lower
        };
        let (rest, func) = full.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
        if parts.len() != 3 || !hex(parts[0], 4) || !hex(parts[1], 2) || !hex(parts[2], 2) {
            return Err(bad());
        }
        let dev = u8::from_str_radix(parts[2], 16).map_err(|_| bad())?;
        if dev > 0x1f || func.len() != 1 || !matches!(func.as_bytes()[0], b'0'..=b'7') {
            return Err(bad());
        }
        Ok(Self(full))
    }
    /// The address text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Bdf {
    type Error = PciError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}
impl From<Bdf> for String {
    fn from(b: Bdf) -> String {
        b.0
    }
}
impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A user-space PCI driver talon binds NVMe disks to.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum,
)]
pub enum UserspaceDriver {
    #[serde(rename = "vfio-pci")]
    #[value(name = "vfio-pci")]
    VfioPci,
    #[serde(rename = "uio_pci_generic")]
    #[value(name = "uio_pci_generic")]
    UioPciGeneric,
}

impl UserspaceDriver {
    /// The driver's name under /sys/bus/pci/drivers.
    pub fn sysfs_name(self) -> &'static str {
        match self {
            Self::VfioPci => "vfio-pci",
            Self::UioPciGeneric => "uio_pci_generic",
        }
    }
    /// The kernel module providing the driver.
    pub fn module(self) -> &'static str {
        match self {
            Self::VfioPci => "vfio_pci",
            Self::UioPciGeneric => "uio_pci_generic",
        }
    }
}

impl fmt::Display for UserspaceDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.sysfs_name())
    }
}

/// One PCI device, as the inventory shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PciDevice {
    pub bdf: Bdf,
    /// Vendor ID, `0x8086`.
    pub vendor: String,
    /// Device ID, `0x0a54`.
    pub device: String,
    /// Class code, `0x010802` for NVMe.
    pub class: String,
    /// NUMA node, `None` when the platform reports -1.
    pub numa_node: Option<u32>,
    /// The bound driver, `None` when unbound.
    pub driver: Option<String>,
    /// The IOMMU group, `None` without an IOMMU.
    pub iommu_group: Option<u32>,
    /// The other devices in the IOMMU group, with their drivers.
    pub iommu_peers: Vec<IommuPeer>,
    /// Block devices (namespaces) of the controller while the nvme driver has it.
    pub block_devices: Vec<String>,
    pub model: Option<String>,
    pub serial: Option<String>,
    /// Total size of the namespaces in bytes.
    pub size_bytes: Option<u64>,
}

/// Another member of a device's IOMMU group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct IommuPeer {
    pub bdf: String,
    pub driver: Option<String>,
}

fn inspect_err(bdf: &str) -> impl Fn(HostIoError) -> PciError + '_ {
    move |source| PciError::Inspect {
        bdf: bdf.to_string(),
        source,
    }
}

/// Reads one PCI device.
pub fn read_device(root: &HostRoot, bdf: &Bdf) -> Result<PciDevice, PciError> {
    let b = bdf.as_str();
    let dir = format!("{DEVICES}/{b}");
    if !root.exists(&dir) {
        return Err(PciError::UnknownDevice(b.to_string()));
    }
    let e = inspect_err(b);
    let attr = |n: &str| root.read_attr(format!("{dir}/{n}")).map_err(&e);
    let numa_node = root
        .read_attr_opt(format!("{dir}/numa_node"))
        .map_err(&e)?
        .and_then(|s| s.parse().ok());
    let driver = root.link_name(format!("{dir}/driver")).map_err(&e)?;
    let iommu_group = root
        .link_name(format!("{dir}/iommu_group"))
        .map_err(&e)?
        .and_then(|g| g.parse::<u32>().ok());
    let mut iommu_peers = Vec::new();
    if let Some(g) = iommu_group {
        for m in root
            .list_dir(format!("/sys/kernel/iommu_groups/{g}/devices"))
            .map_err(&e)?
        {
            if m != b {
                let driver = root.link_name(format!("{DEVICES}/{m}/driver")).map_err(&e)?;
                iommu_peers.push(IommuPeer { bdf: m, driver });
            }
        }
    }
    let mut dev = PciDevice {
        bdf: bdf.clone(),
        vendor: attr("vendor")?,
        device: attr("device")?,
        class: attr("class")?,
        numa_node,
        driver,
        iommu_group,
        iommu_peers,
        block_devices: Vec::new(),
        model: None,
        serial: None,
        size_bytes: None,
    };
    // The nvme driver exposes the controller as <dev>/nvme/nvmeN.
    if root.exists(format!("{dir}/nvme")) {
        for ctrl in root.list_dir(format!("{dir}/nvme")).map_err(&e)? {
            let cdir = format!("{dir}/nvme/{ctrl}");
            dev.model = root.read_attr_opt(format!("{cdir}/model")).map_err(&e)?;
            dev.serial = root.read_attr_opt(format!("{cdir}/serial")).map_err(&e)?;
            let mut multipath = false;
            for ns in root.list_dir(&cdir).map_err(&e)? {
                if is_namespace_name(&ns) && root.exists(format!("/sys/block/{ns}")) {
                    dev.block_devices.push(ns);
                } else if is_path_name(&ns) {
                    multipath = true;
                }
            }
            // Native NVMe multipath: the controller holds hidden nvmeXcYnZ paths;
            // the block devices live in the subsystem next to the controller.
            if multipath {
                for sub in root.list_dir("/sys/class/nvme-subsystem").unwrap_or_default() {
                    let sdir = format!("/sys/class/nvme-subsystem/{sub}");
                    let entries = root.list_dir(&sdir).unwrap_or_default();
                    if entries.contains(&ctrl) {
                        for ns in entries {
                            if is_namespace_name(&ns)
                                && root.exists(format!("/sys/block/{ns}"))
                                && !dev.block_devices.contains(&ns)
                            {
                                dev.block_devices.push(ns);
                            }
                        }
                    }
                }
            }
        }
    }
    let mut size = 0u64;
    for ns in &dev.block_devices {
        let sectors: u64 = root
            .read_attr(format!("/sys/block/{ns}/size"))
            .map_err(&e)?
            .parse()
            .unwrap_or(0);
        size += sectors * 512;
    }
    if !dev.block_devices.is_empty() {
        dev.size_bytes = Some(size);
    }
    Ok(dev)
}

/// `nvme0n1` (not `nvme0c0n1`, `ng0n1` or partitions).
fn is_namespace_name(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("nvme") else {
        return false;
    };
    let Some((c, n)) = rest.split_once('n') else {
        return false;
    };
    !c.is_empty()
        && c.bytes().all(|b| b.is_ascii_digit())
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
}

/// `nvme0c0n1`: a hidden multipath path device.
fn is_path_name(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("nvme") else {
        return false;
    };
    let Some((a, rest)) = rest.split_once('c') else {
        return false;
    };
    let Some((b, c)) = rest.split_once('n') else {
        return false;
    };
    [a, b, c]
        .iter()
        .all(|p| !p.is_empty() && p.bytes().all(|x| x.is_ascii_digit()))
}

/// Every PCI device of class NVMe, sorted by address.
pub fn list_nvme(root: &HostRoot) -> Result<Vec<PciDevice>, PciError> {
    let mut out = Vec::new();
    let names = match root.list_dir(DEVICES) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(PciError::List(e)),
    };
    for name in names {
        let Ok(bdf) = Bdf::parse(&name) else { continue };
        let class = root
            .read_attr(format!("{DEVICES}/{name}/class"))
            .map_err(inspect_err(&name))?;
        if class == NVME_CLASS {
            out.push(read_device(root, &bdf)?);
        }
    }
    Ok(out)
}

/// Finds one NVMe device by PCI address, serial or model (exact match).
pub fn select(root: &HostRoot, selector: &str) -> Result<PciDevice, PciError> {
    if selector.starts_with("/dev/") || selector.starts_with("nvme") && is_namespace_name(selector) {
        return Err(PciError::DevName(selector.to_string()));
    }
    if let Ok(bdf) = Bdf::parse(selector) {
        let dev = read_device(root, &bdf)?;
        if dev.class != NVME_CLASS {
            return Err(PciError::NotNvme {
                bdf: bdf.to_string(),
                class: dev.class,
            });
        }
        return Ok(dev);
    }
    if looks_like_bdf(selector) {
        return Err(PciError::MalformedBdf(selector.to_string()));
    }
    let all = list_nvme(root)?;
    for key in [|d: &PciDevice| d.serial.clone(), |d: &PciDevice| d.model.clone()] {
        let hits: Vec<&PciDevice> = all
            .iter()
            .filter(|d| key(d).as_deref() == Some(selector))
            .collect();
        match hits.len() {
            0 => continue,
            1 => return Ok(hits[0].clone()),
            _ => {
                let bdfs = hits.iter().map(|d| d.bdf.as_str()).collect::<Vec<_>>().join(", ");
                return Err(PciError::Ambiguous {
                    selector: selector.to_string(),
                    bdfs,
                });
            }
        }
    }
    Err(PciError::NoMatch(selector.to_string()))
}

fn looks_like_bdf(s: &str) -> bool {
    s.contains(':') && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
}

/// Whether an IOMMU is active on the host (registered IOMMU units or groups).
pub fn iommu_active(root: &HostRoot) -> bool {
    let nonempty = |p: &str| root.list_dir(p).map(|v| !v.is_empty()).unwrap_or(false);
    nonempty("/sys/class/iommu") || nonempty("/sys/kernel/iommu_groups")
}

/// Why vfio-pci cannot take the device, or `None` when it can.
pub fn vfio_blocker(root: &HostRoot, dev: &PciDevice) -> Option<String> {
    if !iommu_active(root) {
        return Some(
            "no IOMMU is active (enable VT-d/AMD-Vi and intel_iommu=on or amd_iommu=on)".to_string(),
        );
    }
    let Some(group) = dev.iommu_group else {
        return Some("the device has no IOMMU group".to_string());
    };
    let busy: Vec<String> = dev
        .iommu_peers
        .iter()
        .filter(|p| !matches!(p.driver.as_deref(), None | Some("vfio-pci") | Some("pcieport")))
        .map(|p| format!("{} on {}", p.bdf, p.driver.as_deref().unwrap_or("?")))
        .collect();
    if busy.is_empty() {
        None
    } else {
        Some(format!(
            "IOMMU group {group} is not viable: {} must be unbound or on vfio-pci",
            busy.join(", ")
        ))
    }
}

/// Whether a driver is registered, or can be (module present or loadable).
fn driver_registered(root: &HostRoot, driver: &str) -> bool {
    root.exists(format!("/sys/bus/pci/drivers/{driver}"))
}

/// Picks the user-space driver for a device: vfio-pci when the IOMMU group is
/// viable, else uio_pci_generic when it is registered or its module is
/// installed, else an error that says why neither fits.
pub fn choose_driver(root: &HostRoot, dev: &PciDevice) -> Result<UserspaceDriver, PciError> {
    let vfio = vfio_blocker(root, dev);
    let usable = |d: UserspaceDriver| {
        driver_registered(root, d.sysfs_name())
            || modules::module_state(root, d.module())
                .map(|s| s != modules::ModuleState::Missing)
                .unwrap_or(false)
    };
    if vfio.is_none() && usable(UserspaceDriver::VfioPci) {
        return Ok(UserspaceDriver::VfioPci);
    }
    if usable(UserspaceDriver::UioPciGeneric) {
        return Ok(UserspaceDriver::UioPciGeneric);
    }
    let vfio_reason = vfio.unwrap_or_else(|| "the vfio_pci module is not installed".to_string());
    Err(PciError::NoUserspaceDriver {
        bdf: dev.bdf.to_string(),
        reason: format!("vfio-pci: {vfio_reason}; uio_pci_generic: the module is not installed"),
    })
}

/// Why a device must not be taken from the kernel, or `None` when it is free:
/// a mounted namespace or partition, holders (dm, md), partitions, or a
/// partition table / file-system / LVM signature in the first sectors.
pub fn in_use(root: &HostRoot, dev: &PciDevice) -> Result<Option<String>, PciError> {
    match in_use_by_kernel(root, dev)? {
        Some(r) => Ok(Some(r)),
        None => carries(root, dev),
    }
}

/// The signature a free device carries (`/dev/<ns> carries <what>`), which
/// [`in_use`] refuses too; a deliberate format takes the device anyway.
pub fn carries(root: &HostRoot, dev: &PciDevice) -> Result<Option<String>, PciError> {
    for ns in &dev.block_devices {
        if let Some(sig) = signature(root, dev.bdf.as_str(), ns)? {
            return Ok(Some(format!("/dev/{ns} carries {sig}")));
        }
    }
    Ok(None)
}

/// Why the kernel itself uses a device (mounted, swap, holders,
/// partitions), never to be taken whatever is asked; `None` when free.
pub fn in_use_by_kernel(root: &HostRoot, dev: &PciDevice) -> Result<Option<String>, PciError> {
    let b = dev.bdf.as_str();
    let e = inspect_err(b);
    let mountinfo = root.read_string("/proc/self/mountinfo").ok();
    let mounts = root.read_string("/proc/mounts").ok();
    let swaps = super::mounts::parse_swaps(&root.read_string("/proc/swaps").unwrap_or_default());
    for ns in &dev.block_devices {
        let mut nodes = vec![ns.clone()];
        for entry in root.list_dir(format!("/sys/block/{ns}")).map_err(&e)? {
            if entry.starts_with(ns.as_str()) && root.exists(format!("/sys/block/{ns}/{entry}/partition")) {
                nodes.push(entry);
            }
        }
        for node in &nodes {
            let sys = if node == ns {
                format!("/sys/block/{ns}")
            } else {
                format!("/sys/block/{ns}/{node}")
            };
            let majmin = root.read_attr_opt(format!("{sys}/dev")).map_err(&e)?;
            if swaps.iter().any(|s| *s == format!("/dev/{node}")) {
                return Ok(Some(format!("/dev/{node} is active swap")));
            }
            if let Some(target) = mounted_at(mountinfo.as_deref(), mounts.as_deref(), node, majmin.as_deref())
            {
                return Ok(Some(format!("/dev/{node} is mounted at {target}")));
            }
            if let Ok(holders) = root.list_dir(format!("{sys}/holders"))
                && !holders.is_empty()
            {
                return Ok(Some(format!(
                    "/dev/{node} is held by {} (device-mapper, md or similar)",
                    holders.join(", ")
                )));
            }
        }
        if nodes.len() > 1 {
            return Ok(Some(format!(
                "/dev/{ns} has partitions ({})",
                nodes[1..].join(", ")
            )));
        }
    }
    Ok(None)
}

fn mounted_at(
    mountinfo: Option<&str>,
    mounts: Option<&str>,
    node: &str,
    majmin: Option<&str>,
) -> Option<String> {
    let dev_path = format!("/dev/{node}");
    if let Some(mi) = mountinfo {
        let found = super::mounts::parse_mountinfo(mi)
            .into_iter()
            .find(|m| majmin.is_some_and(|n| m.dev == n) || m.source == dev_path);
        if let Some(m) = found {
            return Some(m.mount_point);
        }
    }
    let mounts = super::mounts::parse_mounts(mounts?);
    mounts
        .into_iter()
        .find(|m| m.source == dev_path)
        .map(|m| m.target)
}

/// Looks for data in the first 68 KiB of a block device: GPT, MBR, ext2/3/4,
/// XFS, btrfs, LVM2 physical volume, LUKS, md (1.1, 1.2), swap.
pub fn signature(root: &HostRoot, bdf: &str, ns: &str) -> Result<Option<&'static str>, PciError> {
    let dev = format!("/dev/{ns}");
    let path = root.path(&dev);
    let mut buf = Vec::with_capacity(69 * 1024);
    std::fs::File::open(&path)
        .and_then(|f| f.take(69 * 1024).read_to_end(&mut buf))
        .map_err(|source| PciError::ReadSignature {
            bdf: bdf.to_string(),
            dev: dev.clone(),
            source,
        })?;
    Ok(detect_signature(&buf))
}

/// The signature check on a buffer holding the start of a device.
pub fn detect_signature(buf: &[u8]) -> Option<&'static str> {
    let at = |off: usize, magic: &[u8]| buf.get(off..off + magic.len()) == Some(magic);
    if at(512, b"EFI PART") || at(4096, b"EFI PART") {
        return Some("a GPT partition table");
    }
    if (0..4).any(|s| at(s * 512, b"LABELONE") && at(s * 512 + 0x18, b"LVM2 001")) {
        return Some("an LVM2 physical volume");
    }
    if at(0, b"LUKS\xba\xbe") {
        return Some("a LUKS volume");
    }
    // md superblocks 1.1 (at 0) and 1.2 (at 4 KiB); 0.90 and 1.0 live at the end
    if at(0, &0xa92b_4efc_u32.to_le_bytes()) || at(4096, &0xa92b_4efc_u32.to_le_bytes()) {
        return Some("an md RAID member");
    }
    if at(0, b"XFSB") {
        return Some("an XFS file system");
    }
    if at(1080, &[0x53, 0xef]) {
        return Some("an ext2/3/4 file system");
    }
    if at(65536 + 0x40, b"_BHRfS_M") {
        return Some("a btrfs file system");
    }
    if at(4096 - 10, b"SWAPSPACE2") || at(4096 - 10, b"SWAP-SPACE") {
        return Some("a swap signature");
    }
    if at(510, &[0x55, 0xaa]) {
        return Some("an MBR partition table or boot sector");
    }
    None
}

/// Processes that hold the device's user-space driver node open
/// (`/dev/vfio/<group>`, `/dev/vfio/devices/vfioN`, `/dev/uioN`), as `comm (pid N)`.
/// Unbinding under them would block in the kernel until they let go.
pub fn userspace_users(root: &HostRoot, dev: &PciDevice) -> Vec<String> {
    let b = dev.bdf.as_str();
    let mut nodes: Vec<std::path::PathBuf> = Vec::new();
    match dev.driver.as_deref() {
        Some("vfio-pci") => {
            if let Some(g) = dev.iommu_group {
                nodes.push(format!("/dev/vfio/{g}").into());
            }
            for v in root
                .list_dir(format!("{DEVICES}/{b}/vfio-dev"))
                .unwrap_or_default()
            {
                nodes.push(format!("/dev/vfio/devices/{v}").into());
            }
        }
        Some("uio_pci_generic") => {
            for u in root.list_dir(format!("{DEVICES}/{b}/uio")).unwrap_or_default() {
                nodes.push(format!("/dev/{u}").into());
            }
        }
        _ => {}
    }
    let mut users = Vec::new();
    if nodes.is_empty() {
        return users;
    }
    // Our own process may hold it through an inherited descriptor; that is the caller's.
    let me = root.is_real().then(|| std::process::id().to_string());
    let pids = root.list_dir("/proc").unwrap_or_default();
    for pid in pids
        .iter()
        .filter(|p| p.bytes().all(|c| c.is_ascii_digit()) && Some(*p) != me.as_ref())
    {
        for fd in root.list_dir(format!("/proc/{pid}/fd")).unwrap_or_default() {
            if let Ok(target) = root.read_link(format!("/proc/{pid}/fd/{fd}"))
                && nodes.contains(&target)
            {
                let comm = root.read_attr(format!("/proc/{pid}/comm")).unwrap_or_default();
                users.push(format!("{comm} (pid {pid})"));
                break;
            }
        }
    }
    users
}

fn refuse_if_opened(root: &HostRoot, dev: &PciDevice) -> Result<(), PciError> {
    let users = userspace_users(root, dev);
    if users.is_empty() {
        return Ok(());
    }
    Err(PciError::InUse {
        bdf: dev.bdf.to_string(),
        reason: format!(
            "opened through {} by {}; stop it first",
            dev.driver.as_deref().unwrap_or("its driver"),
            users.join(", ")
        ),
    })
}

/// What a bind or unbind did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindOutcome {
    pub bdf: Bdf,
    pub from: Option<String>,
    pub to: String,
    /// False when the device already was on the target driver.
    pub changed: bool,
}

/// Options of [`bind`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BindOptions {
    /// The driver to use; `None` chooses (see [`choose_driver`]).
    pub driver: Option<UserspaceDriver>,
    /// Run modprobe for a driver that is not registered (not on Talos).
    pub load_module: bool,
    /// Take a free device whatever signature it carries (a deliberate
    /// format, `talon disk format`); one the kernel uses is still refused.
    pub data_ok: bool,
}

/// Binds an NVMe device to a user-space driver, refusing a device in use.
pub fn bind(root: &HostRoot, selector: &str, opts: BindOptions) -> Result<BindOutcome, PciError> {
    let dev = select(root, selector)?;
    let bdf = dev.bdf.to_string();
    let driver = match opts.driver {
        Some(UserspaceDriver::VfioPci) => {
            if let Some(reason) = vfio_blocker(root, &dev) {
                return Err(PciError::VfioNotViable { bdf, reason });
            }
            UserspaceDriver::VfioPci
        }
        Some(d) => d,
        None => choose_driver(root, &dev)?,
    };
    let to = driver.sysfs_name();
    if dev.driver.as_deref() == Some(to) {
        return Ok(BindOutcome {
            bdf: dev.bdf,
            from: dev.driver,
            to: to.to_string(),
            changed: false,
        });
    }
    let busy = if opts.data_ok {
        in_use_by_kernel(root, &dev)?
    } else {
        in_use(root, &dev)?
    };
    if let Some(reason) = busy {
        return Err(PciError::InUse { bdf, reason });
    }
    refuse_if_opened(root, &dev)?;
    if !driver_registered(root, to) {
        if opts.load_module {
            modules::ensure_loaded(root, driver.module()).map_err(|e| PciError::NoDriver {
                bdf: bdf.clone(),
                driver: to.to_string(),
                reason: e.to_string(),
            })?;
        }
        if !driver_registered(root, to) {
            return Err(PciError::NoDriver {
                bdf,
                driver: to.to_string(),
                reason: format!("the driver is not registered (load module {})", driver.module()),
            });
        }
    }
    rebind(root, &dev.bdf, dev.driver.as_deref(), to)?;
    Ok(BindOutcome {
        bdf: dev.bdf,
        from: dev.driver,
        to: to.to_string(),
        changed: true,
    })
}

/// Gives a device back to the kernel's nvme driver.
pub fn unbind(root: &HostRoot, selector: &str) -> Result<BindOutcome, PciError> {
    let dev = select(root, selector)?;
    if dev.driver.as_deref() == Some("nvme") {
        return Ok(BindOutcome {
            bdf: dev.bdf,
            from: dev.driver,
            to: "nvme".to_string(),
            changed: false,
        });
    }
    refuse_if_opened(root, &dev)?;
    if !driver_registered(root, "nvme") {
        return Err(PciError::NoDriver {
            bdf: dev.bdf.to_string(),
            driver: "nvme".to_string(),
            reason: "the nvme driver is not registered".to_string(),
        });
    }
    rebind(root, &dev.bdf, dev.driver.as_deref(), "nvme")?;
    Ok(BindOutcome {
        bdf: dev.bdf,
        from: dev.driver,
        to: "nvme".to_string(),
        changed: true,
    })
}

/// Puts a device on driver `to` (`None`: no driver at all), whatever it is
/// on now (a half-done move included), refusing while a process holds its
/// user-space node open. On failure the device goes to `rollback_to`
/// (`None`: left without a driver). Used to finish or undo a recorded bind
/// and to give a device back to its original driver; a first bind from the
/// kernel's driver goes through [`bind`], which checks for data first.
pub fn set_driver(
    root: &HostRoot,
    bdf: &Bdf,
    to: Option<&str>,
    rollback_to: Option<&str>,
) -> Result<BindOutcome, PciError> {
    let dev = read_device(root, bdf)?;
    let outcome = |changed| BindOutcome {
        bdf: bdf.clone(),
        from: dev.driver.clone(),
        to: to.unwrap_or("none").to_string(),
        changed,
    };
    if dev.driver.as_deref() == to {
        clear_override_if_set(root, bdf)?;
        return Ok(outcome(false));
    }
    refuse_if_opened(root, &dev)?;
    match to {
        Some(t) => {
            if !driver_registered(root, t) {
                return Err(PciError::NoDriver {
                    bdf: bdf.to_string(),
                    driver: t.to_string(),
                    reason: "the driver is not registered".to_string(),
                });
            }
            rebind(root, bdf, rollback_to, t)?;
        }
        None => {
            unbind_current(root, bdf)?;
            clear_override(root, bdf)?;
        }
    }
    Ok(outcome(true))
}

/// The device's `driver_override`, `None` when unset (`(null)` or empty).
pub fn driver_override(root: &HostRoot, bdf: &Bdf) -> Result<Option<String>, PciError> {
    let v = root
        .read_attr_opt(format!("{DEVICES}/{bdf}/driver_override"))
        .map_err(inspect_err(bdf.as_str()))?;
    Ok(v.filter(|v| !v.is_empty() && v != "(null)"))
}

fn clear_override_if_set(root: &HostRoot, bdf: &Bdf) -> Result<(), PciError> {
    if driver_override(root, bdf)?.is_some() {
        clear_override(root, bdf)?;
    }
    Ok(())
}

/// Moves a device from `from` (or unbound) to `to`; on failure puts it back.
fn rebind(root: &HostRoot, bdf: &Bdf, from: Option<&str>, to: &str) -> Result<(), PciError> {
    match move_driver(root, bdf, to) {
        Ok(()) => Ok(()),
        Err(err) => {
            let restored = from.map_or("no driver".to_string(), str::to_string);
            let rollback = match from {
                Some(orig) => move_driver(root, bdf, orig),
                None => unbind_current(root, bdf).and_then(|()| clear_override(root, bdf)),
            };
            match rollback {
                Ok(()) => Err(PciError::Rebind {
                    bdf: bdf.to_string(),
                    to: to.to_string(),
                    restored,
                    source: Box::new(err),
                }),
                Err(r) => Err(PciError::RebindRollback {
                    bdf: bdf.to_string(),
                    to: to.to_string(),
                    from: restored,
                    rollback: r.to_string(),
                    source: Box::new(err),
                }),
            }
        }
    }
}

fn sysfs_write(root: &HostRoot, bdf: &Bdf, path: &str, value: &str) -> Result<(), PciError> {
    root.write_str(path, value)
        .map_err(|source| PciError::SysfsWrite {
            bdf: bdf.to_string(),
            source,
        })
}

fn clear_override(root: &HostRoot, bdf: &Bdf) -> Result<(), PciError> {
    sysfs_write(root, bdf, &format!("{DEVICES}/{bdf}/driver_override"), "\n")
}

fn unbind_current(root: &HostRoot, bdf: &Bdf) -> Result<(), PciError> {
    let link = format!("{DEVICES}/{bdf}/driver");
    if root
        .link_name(&link)
        .map_err(inspect_err(bdf.as_str()))?
        .is_some()
    {
        sysfs_write(root, bdf, &format!("{link}/unbind"), bdf.as_str())?;
    }
    Ok(())
}

/// driver_override=to, unbind, drivers_probe, wait for the driver link, and
/// clear driver_override whatever happened.
fn move_driver(root: &HostRoot, bdf: &Bdf, to: &str) -> Result<(), PciError> {
    sysfs_write(root, bdf, &format!("{DEVICES}/{bdf}/driver_override"), to)?;
    failpoint("pci-after-override");
    let res = unbind_current(root, bdf)
        .inspect(|()| failpoint("pci-after-unbind"))
        .and_then(|()| sysfs_write(root, bdf, "/sys/bus/pci/drivers_probe", bdf.as_str()))
        .and_then(|()| wait_for_driver(root, bdf, to))
        .inspect(|()| failpoint("pci-after-probe"));
    let cleared = clear_override(root, bdf);
    res.and(cleared)
}

fn wait_for_driver(root: &HostRoot, bdf: &Bdf, want: &str) -> Result<(), PciError> {
    let link = format!("{DEVICES}/{bdf}/driver");
    let start = Instant::now();
    loop {
        let got = root.link_name(&link).map_err(inspect_err(bdf.as_str()))?;
        if got.as_deref() == Some(want) {
            return Ok(());
        }
        // nvme probes asynchronously; a fixture tree changes only when a test
        // plays the kernel, and then at once
        let wait = if root.is_real() {
            PROBE_WAIT
        } else {
            FIXTURE_PROBE_WAIT
        };
        if start.elapsed() > wait {
            return Err(PciError::Verify {
                bdf: bdf.to_string(),
                want: want.to_string(),
                got: got.unwrap_or_else(|| "none".to_string()),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bdfs() {
        assert_eq!(Bdf::parse("0000:01:00.0").expect("ok").as_str(), "0000:01:00.0");
        assert_eq!(Bdf::parse("AF:1F.7").expect("short").as_str(), "0000:af:1f.7");
        for bad in [
            "",
            "0000:01:00",
            "0000:01:00.8",
            "0000:01:20.0",
            "zz:00.0",
            "0000:001:00.0",
            "0000:01:00.0/x",
        ] {
            assert!(matches!(Bdf::parse(bad), Err(PciError::MalformedBdf(_))), "{bad}");
        }
    }

    #[test]
    fn detects_signatures() {
        let mut b = vec![0u8; 70 * 1024];
        assert_eq!(detect_signature(&b), None);
        b[1080] = 0x53;
        b[1081] = 0xef;
        assert_eq!(detect_signature(&b), Some("an ext2/3/4 file system"));
        let mut b = vec![0u8; 70 * 1024];
        b[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(detect_signature(&b), Some("a GPT partition table"));
        let mut b = vec![0u8; 70 * 1024];
        b[0..4].copy_from_slice(b"XFSB");
        assert_eq!(detect_signature(&b), Some("an XFS file system"));
        let mut b = vec![0u8; 70 * 1024];
        b[65600..65608].copy_from_slice(b"_BHRfS_M");
        assert_eq!(detect_signature(&b), Some("a btrfs file system"));
        let mut b = vec![0u8; 70 * 1024];
        b[512..520].copy_from_slice(b"LABELONE");
        b[536..544].copy_from_slice(b"LVM2 001");
        assert_eq!(detect_signature(&b), Some("an LVM2 physical volume"));
        let mut b = vec![0u8; 1024];
        b[510] = 0x55;
        b[511] = 0xaa;
        assert_eq!(
            detect_signature(&b),
            Some("an MBR partition table or boot sector")
        );
    }

    #[test]
    fn namespace_names() {
        assert!(is_namespace_name("nvme0n1"));
        assert!(is_namespace_name("nvme12n3"));
        assert!(!is_namespace_name("nvme0c0n1"));
        assert!(!is_namespace_name("nvme0n1p1"));
        assert!(!is_namespace_name("nvme0"));
        assert!(is_path_name("nvme0c0n1"));
        assert!(!is_path_name("nvme0n1"));
    }
}
