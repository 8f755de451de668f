//! Hugepages: read and set `nr_hugepages` per page size, globally or per NUMA
//! node; verify what the kernel allocated; mount hugetlbfs; prove a page maps.
//!
//! ```text
//!   read:  /sys/devices/system/node/node<K>/hugepages/hugepages-<kB>kB/{nr,free}_hugepages
//!          (no NUMA nodes in sysfs: /sys/kernel/mm/hugepages/hugepages-<kB>kB/..)
//!   set:   write nr_hugepages ──> read back ──> got == asked ? Ok
//!                                           └─> no: write the previous value back,
//!                                                   Err(Shortfall { asked, got })
//!   mount: /proc/mounts has hugetlbfs ? nothing : mount -t hugetlbfs at /dev/hugepages
//!   prove: hugepage_rs::alloc(one default-size page) ─ write ─ read back ─ dealloc
//! ```
//!
//! Nothing here allocates hugepages as a side effect: only [`set_pages`] writes
//! `nr_hugepages`, and only when the caller asks. When the kernel cannot allocate
//! the full count (fragmented memory) the previous value is restored, so a failed
//! set leaves the pool as it was, and the error names asked vs got.

use super::{HostIoError, HostRoot};
use serde::{Deserialize, Serialize};
use std::alloc::Layout;
use std::fmt;
use std::path::PathBuf;

/// Errors of hugepage inspection and sizing.
#[derive(Debug, thiserror::Error)]
pub enum HugepagesError {
    #[error("cannot read hugepage counters at {path}")]
    ReadCounter {
        path: String,
        #[source]
        source: HostIoError,
    },
    #[error("hugepage counter {path} holds {value:?}, not a number")]
    ParseCounter { path: String, value: String },
    #[error("NUMA node {node} has no {size} hugepage pool on this host")]
    NoSuchNode { node: u32, size: PageSize },
    #[error("the kernel has no {size} hugepage pool (hugepages unsupported or size not enabled)")]
    NoSuchSize { size: PageSize },
    #[error("cannot set {size} hugepages{} to {asked}", node_suffix(*.node))]
    WriteCounter {
        size: PageSize,
        node: Option<u32>,
        asked: u64,
        #[source]
        source: HostIoError,
    },
    #[error(
        "the kernel allocated only {got} of {asked} {size} hugepages{} (memory fragmented or too small); restored the previous value {previous}",
        node_suffix(*.node)
    )]
    Shortfall {
        size: PageSize,
        node: Option<u32>,
        asked: u64,
        got: u64,
        previous: u64,
    },
    #[error("unknown hugepage size {0:?} (expected 2M or 1G)")]
    ParseSize(String),
    #[error("cannot read the mount table")]
    ReadMounts(#[source] HostIoError),
    #[error("cannot mount hugetlbfs at {path}: the host root is not the real /")]
    MountNotLocal { path: PathBuf },
    #[error("cannot mount hugetlbfs at {path}")]
    Mount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot map a {size} hugepage: no free page of the default size, or MAP_HUGETLB refused")]
    MapPage { size: PageSize },
    #[error("the hugepage proof only maps the default page size ({default}), not {asked}")]
    ProofSize { default: PageSize, asked: PageSize },
    #[error("a mapped hugepage did not read back what was written")]
    PageCorrupt,
    #[error("SPDK core mask {0:?} is neither a hex mask (0x3) nor a CPU list ([0,2-3])")]
    ParseCpumask(String),
}

fn node_suffix(node: Option<u32>) -> String {
    node.map(|n| format!(" on NUMA node {n}")).unwrap_or_default()
}

/// A hugepage size.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum PageSize {
    /// 2 MiB pages (`hugepages-2048kB`), what SPDK uses.
    #[serde(rename = "2M")]
    Size2M,
    /// 1 GiB pages (`hugepages-1048576kB`).
    #[serde(rename = "1G")]
    Size1G,
}

impl PageSize {
    /// Both sizes, smallest first.
    pub const ALL: [PageSize; 2] = [PageSize::Size2M, PageSize::Size1G];

    /// The size in KiB.
    pub fn kib(self) -> u64 {
        match self {
            Self::Size2M => 2048,
            Self::Size1G => 1_048_576,
        }
    }

    /// The size in MiB.
    pub fn mib(self) -> u64 {
        self.kib() / 1024
    }

    /// The sysfs directory name, `hugepages-2048kB`.
    pub fn dir_name(self) -> String {
        format!("hugepages-{}kB", self.kib())
    }

    fn from_kib(kib: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.kib() == kib)
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Size2M => "2M",
            Self::Size1G => "1G",
        })
    }
}

impl std::str::FromStr for PageSize {
    type Err = HugepagesError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "2m" | "2mb" | "2mib" | "2048kb" | "2048" => Ok(Self::Size2M),
            "1g" | "1gb" | "1gib" | "1048576kb" | "1048576" => Ok(Self::Size1G),
            _ => Err(HugepagesError::ParseSize(s.to_string())),
        }
    }
}

/// The pool of one size on one NUMA node (or the whole host without NUMA).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HugepagePool {
    pub size: PageSize,
    /// The NUMA node, `None` for the global pool of a host without NUMA sysfs.
    pub node: Option<u32>,
    /// `nr_hugepages`.
    pub total: u64,
    /// `free_hugepages`.
    pub free: u64,
}

impl HugepagePool {
    /// Total MiB of this pool.
    pub fn total_mib(&self) -> u64 {
        self.total * self.size.mib()
    }
    /// Free MiB of this pool.
    pub fn free_mib(&self) -> u64 {
        self.free * self.size.mib()
    }
}

/// The NUMA nodes that have hugepage pools in sysfs, sorted.
pub fn numa_nodes(root: &HostRoot) -> Vec<u32> {
    let mut nodes: Vec<u32> = root
        .list_dir("/sys/devices/system/node")
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.strip_prefix("node")?.parse().ok())
        .filter(|n| root.exists(format!("/sys/devices/system/node/node{n}/hugepages")))
        .collect();
    nodes.sort_unstable();
    nodes
}

fn pool_dir(size: PageSize, node: Option<u32>) -> String {
    match node {
        Some(n) => format!("/sys/devices/system/node/node{n}/hugepages/{}", size.dir_name()),
        None => format!("/sys/kernel/mm/hugepages/{}", size.dir_name()),
    }
}

fn read_counter(root: &HostRoot, path: &str) -> Result<u64, HugepagesError> {
    let value = root
        .read_attr(path)
        .map_err(|source| HugepagesError::ReadCounter {
            path: path.to_string(),
            source,
        })?;
    value.parse().map_err(|_| HugepagesError::ParseCounter {
        path: path.to_string(),
        value,
    })
}

/// Free hugepage memory in MiB, over every page size (`/sys/kernel/mm/hugepages`).
pub fn free_hugepages_mib(host: &HostRoot) -> u64 {
    let dir = "/sys/kernel/mm/hugepages";
    let Ok(sizes) = host.list_dir(dir) else {
        return 0;
    };
    sizes
        .iter()
        .filter_map(|s| {
            let kb: u64 = s.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()?;
            let free: u64 = host
                .read_attr(format!("{dir}/{s}/free_hugepages"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some(kb.saturating_mul(free) / 1024)
        })
        .sum()
}

/// Reads one pool. `node = None` reads the global pool.
pub fn read_pool(root: &HostRoot, size: PageSize, node: Option<u32>) -> Result<HugepagePool, HugepagesError> {
    let dir = pool_dir(size, node);
    if !root.exists(&dir) {
        return Err(match node {
            Some(node) => HugepagesError::NoSuchNode { node, size },
            None => HugepagesError::NoSuchSize { size },
        });
    }
    Ok(HugepagePool {
        size,
        node,
        total: read_counter(root, &format!("{dir}/nr_hugepages"))?,
        free: read_counter(root, &format!("{dir}/free_hugepages"))?,
    })
}

/// Every pool: per NUMA node and size when the host has NUMA sysfs, otherwise
/// the global pool per size. Sizes the kernel lacks are left out.
pub fn pools(root: &HostRoot) -> Result<Vec<HugepagePool>, HugepagesError> {
    let nodes = numa_nodes(root);
    let mut out = Vec::new();
    for size in PageSize::ALL {
        if nodes.is_empty() {
            if root.exists(pool_dir(size, None)) {
                out.push(read_pool(root, size, None)?);
            }
        } else {
            for &n in &nodes {
                if root.exists(pool_dir(size, Some(n))) {
                    out.push(read_pool(root, size, Some(n))?);
                }
            }
        }
    }
    Ok(out)
}

/// Totals of one size over all nodes (global files; per-node sums without them).
pub fn totals(root: &HostRoot, size: PageSize) -> Result<HugepagePool, HugepagesError> {
    if root.exists(pool_dir(size, None)) {
        return read_pool(root, size, None);
    }
    let mut sum = HugepagePool {
        size,
        node: None,
        total: 0,
        free: 0,
    };
    let all = pools(root)?;
    if !all.iter().any(|p| p.size == size) {
        return Err(HugepagesError::NoSuchSize { size });
    }
    for p in all.into_iter().filter(|p| p.size == size) {
        sum.total += p.total;
        sum.free += p.free;
    }
    Ok(sum)
}

/// The result of a successful [`set_pages`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetOutcome {
    pub size: PageSize,
    pub node: Option<u32>,
    pub previous: u64,
    pub now: u64,
}

/// Sets `nr_hugepages` of one pool to `count` and verifies the kernel allocated
/// all of it. On a shortfall the previous value is written back and
/// [`HugepagesError::Shortfall`] names asked vs got.
pub fn set_pages(
    root: &HostRoot,
    size: PageSize,
    node: Option<u32>,
    count: u64,
) -> Result<SetOutcome, HugepagesError> {
    let before = read_pool(root, size, node)?;
    let path = format!("{}/nr_hugepages", pool_dir(size, node));
    let write = |v: u64| {
        root.write_str(&path, &v.to_string())
            .map_err(|source| HugepagesError::WriteCounter {
                size,
                node,
                asked: v,
                source,
            })
    };
    write(count)?;
    let got = read_pool(root, size, node)?.total;
    if got != count {
        // Best effort: the error below is the one the caller must see.
        let restored = write(before.total);
        if let Err(e) = restored {
            tracing::warn!(error = %e, "could not restore the previous hugepage count");
        }
        return Err(HugepagesError::Shortfall {
            size,
            node,
            asked: count,
            got,
            previous: before.total,
        });
    }
    Ok(SetOutcome {
        size,
        node,
        previous: before.total,
        now: got,
    })
}

/// The kernel's default hugepage size (`Hugepagesize:` in /proc/meminfo).
pub fn default_size(root: &HostRoot) -> Option<PageSize> {
    let meminfo = root.read_string("/proc/meminfo").ok()?;
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("Hugepagesize:")?;
        let kib = rest.split_whitespace().next()?.parse().ok()?;
        PageSize::from_kib(kib)
    })
}

/// The hugetlbfs mount points listed in /proc/mounts.
pub fn hugetlbfs_mounts(root: &HostRoot) -> Result<Vec<PathBuf>, HugepagesError> {
    let mounts = root
        .read_string("/proc/mounts")
        .map_err(HugepagesError::ReadMounts)?;
    Ok(super::mounts::parse_mounts(&mounts)
        .into_iter()
        .filter(|m| m.fs_type == "hugetlbfs")
        .map(|m| PathBuf::from(m.target))
        .collect())
}

/// What [`ensure_hugetlbfs`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "result", content = "path")]
pub enum MountOutcome {
    AlreadyMounted(PathBuf),
    Mounted(PathBuf),
}

/// Mounts hugetlbfs at `/dev/hugepages` unless some hugetlbfs is mounted already.
/// Mounting needs the real root (and CAP_SYS_ADMIN).
pub fn ensure_hugetlbfs(root: &HostRoot) -> Result<MountOutcome, HugepagesError> {
    if let Some(p) = hugetlbfs_mounts(root)?.into_iter().next() {
        return Ok(MountOutcome::AlreadyMounted(p));
    }
    let path = PathBuf::from("/dev/hugepages");
    if !root.is_real() {
        return Err(HugepagesError::MountNotLocal { path });
    }
    std::fs::create_dir_all(&path).map_err(|source| HugepagesError::Mount {
        path: path.clone(),
        source,
    })?;
    nix::mount::mount(
        Some("hugetlbfs"),
        &path,
        Some("hugetlbfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some("pagesize=2M"),
    )
    .map_err(|e| HugepagesError::Mount {
        path: path.clone(),
        source: e.into(),
    })?;
    Ok(MountOutcome::Mounted(path))
}

/// Proves hugepages of the default size are usable by this process: maps one
/// page with `hugepage-rs` (MAP_HUGETLB), writes a pattern over it, reads it back
/// and unmaps it. Needs one free page; does not change `nr_hugepages`.
pub fn prove_usable(root: &HostRoot, size: PageSize) -> Result<(), HugepagesError> {
    let default = default_size(root).unwrap_or(PageSize::Size2M);
    if size != default {
        return Err(HugepagesError::ProofSize { default, asked: size });
    }
    let bytes = usize::try_from(size.kib() * 1024).map_err(|_| HugepagesError::MapPage { size })?;
    let layout = Layout::from_size_align(bytes, 4096).map_err(|_| HugepagesError::MapPage { size })?;
    // SAFETY: the layout has a non-zero size and an alignment (4 KiB) below the
    // hugepage size, as hugepage_rs::alloc requires.
    let p = unsafe { hugepage_rs::alloc(layout) };
    if p.is_null() {
        return Err(HugepagesError::MapPage { size });
    }
    // SAFETY: `p` points at `bytes` writable bytes that this function alone owns
    // until the dealloc below.
    let page = unsafe { std::slice::from_raw_parts_mut(p, bytes) };
    for (i, b) in page.iter_mut().enumerate().step_by(4096) {
        *b = (i / 4096) as u8 ^ 0xa5;
    }
    let ok = page
        .iter()
        .enumerate()
        .step_by(4096)
        .all(|(i, b)| *b == (i / 4096) as u8 ^ 0xa5);
    // SAFETY: `p` came from hugepage_rs::alloc with this same layout; `page` is
    // not used after this point.
    unsafe { hugepage_rs::dealloc(p, layout) };
    if !ok {
        return Err(HugepagesError::PageCorrupt);
    }
    Ok(())
}

/// What spdk_tgt v26.05 needs with nothing configured: its DPDK heap holds
/// 884 MiB empty (the iSCSI target's PDU and task pools, the bdev_io, fsdev_io
/// and message pools; measured with `benches/memory/run.sh`), and it does not
/// start with 512.
pub const SPDK_BASE_MIB: u64 = 1024;
/// Hugepages per attached NVMe/TCP volume, twice what it was measured to cost: its connected
/// host's qpairs, ~0.8 MiB each (3.8 MiB a volume; docs/sizing.md, `cargo bench --bench
/// longhorn_scale`), the admin queue and
/// [`crate::attach::nvme_tcp::DEFAULT_IO_QUEUES`] I/O queues: talon's attach and a
/// Longhorn engine-frontend without `nvme_tcp_nr_io_queues` ask for no more, whatever the
/// host's CPU count. Longhorn issue 13817 measured ~43 MiB per volume with one queue per CPU.
pub const SPDK_MIB_PER_VOLUME: u64 = 8;

/// The 2 MiB hugepages SPDK needs for `volumes` attached NVMe/TCP volumes
/// before any use was measured: [`SPDK_BASE_MIB`] plus
/// [`SPDK_MIB_PER_VOLUME`] each, rounded up to whole 2 MiB pages.
pub fn spdk_sizing_mib(volumes: u32) -> u64 {
    let mib = SPDK_BASE_MIB + SPDK_MIB_PER_VOLUME * u64::from(volumes);
    mib.div_ceil(2) * 2
}

/// The CPUs of an SPDK core mask: `0x3` (hex mask), `[0,2-3]` or `0,2-3` (a list).
pub fn parse_cpumask(mask: &str) -> Result<Vec<u32>, HugepagesError> {
    let bad = || HugepagesError::ParseCpumask(mask.to_string());
    let m = mask.trim();
    let mut cpus = Vec::new();
    if let Some(hex) = m.strip_prefix("0x").or_else(|| m.strip_prefix("0X")) {
        if hex.is_empty() {
            return Err(bad());
        }
        for (i, c) in hex.bytes().rev().enumerate() {
            let v = (c as char).to_digit(16).ok_or_else(bad)?;
            for b in 0..4 {
                if v & (1 << b) != 0 {
                    cpus.push(u32::try_from(i * 4 + b).map_err(|_| bad())?);
                }
            }
        }
    } else {
        cpus = parse_cpulist(m.trim_start_matches('[').trim_end_matches(']')).ok_or_else(bad)?;
    }
    if cpus.is_empty() {
        return Err(bad());
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// A kernel CPU list (`0-3,8,10-11`); `None` when malformed.
pub fn parse_cpulist(list: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// How many of `cpus` each NUMA node holds (`None`: a host without NUMA
/// sysfs, or CPUs no node lists), sorted by node.
pub fn cpus_per_node(root: &HostRoot, cpus: &[u32]) -> Vec<(Option<u32>, u32)> {
    let nodes = numa_nodes(root);
    let mut counts: Vec<(Option<u32>, u32)> = Vec::new();
    let mut add = |node: Option<u32>| match counts.iter_mut().find(|(n, _)| *n == node) {
        Some((_, c)) => *c += 1,
        None => counts.push((node, 1)),
    };
    for cpu in cpus {
        let node = nodes.iter().copied().find(|n| {
            root.read_attr(format!("/sys/devices/system/node/node{n}/cpulist"))
                .ok()
                .and_then(|l| parse_cpulist(&l))
                .is_some_and(|l| l.contains(cpu))
        });
        // a CPU no node lists on a NUMA host: the first node (where DPDK puts it)
        add(node.or_else(|| nodes.first().copied()));
    }
    counts.sort();
    counts
}

/// Splits `mib` of 2 MiB pages over NUMA nodes in proportion to the SPDK
/// cores each holds, as DPDK distributes `-s` memory when no per-socket
/// amounts are given; every share is rounded up to whole pages.
pub fn split_pages(mib: u64, per_node: &[(Option<u32>, u32)]) -> Vec<(Option<u32>, u64)> {
    let cores: u64 = per_node.iter().map(|(_, c)| u64::from(*c)).sum();
    if cores == 0 {
        return Vec::new();
    }
    let pages = mib.div_ceil(PageSize::Size2M.mib());
    per_node
        .iter()
        .map(|(n, c)| (*n, (pages * u64::from(*c)).div_ceil(cores)))
        .collect()
}

/// Global reserved-but-not-faulted pages of a size (`resv_hugepages`); 0
/// when the file is missing.
pub fn reserved(root: &HostRoot, size: PageSize) -> u64 {
    root.read_attr(format!("{}/resv_hugepages", pool_dir(size, None)))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Pages of a pool that are mapped or promised (`total - free`, plus the
/// global reservations on a host without NUMA sysfs or when this node is the
/// only one): the kernel cannot take these away, and talon never asks it to.
pub fn in_use(pool: &HugepagePool, resv: u64) -> u64 {
    (pool.total.saturating_sub(pool.free))
        .saturating_add(resv)
        .min(pool.total)
}

/// The `nr_hugepages` talon writes for a pool: grows to `wanted`; shrinks
/// only pages talon added (never below `before`, the count it found before
/// it first changed the pool) and never below the pages in use. `None`:
/// leave the pool as it is.
pub fn target_pages(
    pool: &HugepagePool,
    in_use: u64,
    wanted: Option<u64>,
    before: Option<u64>,
) -> Option<u64> {
    let floor = in_use.max(before.unwrap_or(pool.total));
    let goal = match wanted {
        Some(w) => w.max(floor),
        // not wanted any more: give back what talon added, as far as it is free
        None => floor,
    };
    // without a baseline talon added nothing and only grows
    let goal = if before.is_none() {
        goal.max(pool.total)
    } else {
        goal
    };
    (goal != pool.total).then_some(goal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn pool(root: &HostRoot, dir: &str, nr: u64, free: u64) {
        fs::create_dir_all(root.path(dir)).expect("mkdir");
        fs::write(root.path(format!("{dir}/nr_hugepages")), format!("{nr}\n")).expect("w");
        fs::write(root.path(format!("{dir}/free_hugepages")), format!("{free}\n")).expect("w");
    }

    #[test]
    fn reads_numa_pools_and_sums_them() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(d.path());
        pool(
            &root,
            "/sys/devices/system/node/node0/hugepages/hugepages-2048kB",
            100,
            90,
        );
        pool(
            &root,
            "/sys/devices/system/node/node1/hugepages/hugepages-2048kB",
            50,
            50,
        );
        pool(
            &root,
            "/sys/devices/system/node/node0/hugepages/hugepages-1048576kB",
            1,
            1,
        );
        pool(
            &root,
            "/sys/devices/system/node/node1/hugepages/hugepages-1048576kB",
            0,
            0,
        );
        assert_eq!(numa_nodes(&root), vec![0, 1]);
        let all = pools(&root).expect("pools");
        assert_eq!(all.len(), 4);
        assert_eq!(
            all[0],
            HugepagePool {
                size: PageSize::Size2M,
                node: Some(0),
                total: 100,
                free: 90
            }
        );
        let t = totals(&root, PageSize::Size2M).expect("totals");
        assert_eq!((t.total, t.free, t.free_mib()), (150, 140, 280));
        let err = read_pool(&root, PageSize::Size2M, Some(7)).expect_err("no node 7");
        assert!(err.to_string().contains("NUMA node 7"), "{err}");
    }

    #[test]
    fn falls_back_to_global_pool_and_sets_with_verify() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(d.path());
        pool(&root, "/sys/kernel/mm/hugepages/hugepages-2048kB", 4, 4);
        assert!(numa_nodes(&root).is_empty());
        let all = pools(&root).expect("pools");
        assert_eq!(
            all,
            vec![HugepagePool {
                size: PageSize::Size2M,
                node: None,
                total: 4,
                free: 4
            }]
        );
        // A fixture file reads back what was written: the set "succeeds".
        let out = set_pages(&root, PageSize::Size2M, None, 8).expect("set");
        assert_eq!((out.previous, out.now), (4, 8));
        assert!(matches!(
            set_pages(&root, PageSize::Size1G, None, 1),
            Err(HugepagesError::NoSuchSize { .. })
        ));
    }

    #[test]
    fn parses_sizes_mounts_and_sizing() {
        assert_eq!("2M".parse::<PageSize>().expect("2M"), PageSize::Size2M);
        assert_eq!("1g".parse::<PageSize>().expect("1G"), PageSize::Size1G);
        assert!("3M".parse::<PageSize>().is_err());
        assert_eq!(spdk_sizing_mib(0), 1024);
        assert_eq!(spdk_sizing_mib(1), 1032);
        assert_eq!(spdk_sizing_mib(10), 1104);
        assert_eq!(spdk_sizing_mib(100), 1824);
        assert_eq!(super::super::mounts::unescape("/mnt/a\\040b"), "/mnt/a b");
        let d = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(d.path());
        fs::create_dir_all(root.path("/proc")).expect("mkdir");
        fs::write(root.path("/proc/mounts"), "proc /proc proc rw 0 0\n").expect("w");
        assert!(hugetlbfs_mounts(&root).expect("m").is_empty());
        assert!(matches!(
            ensure_hugetlbfs(&root),
            Err(HugepagesError::MountNotLocal { .. })
        ));
        fs::write(
            root.path("/proc/mounts"),
            "hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n",
        )
        .expect("w");
        assert_eq!(
            ensure_hugetlbfs(&root).expect("mounted"),
            MountOutcome::AlreadyMounted(PathBuf::from("/dev/hugepages"))
        );
    }
}
