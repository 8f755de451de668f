//! Typed SPDK JSON-RPC methods: one params struct and one async method per
//! call talon makes, named exactly like the SPDK method.
//!
//! ```text
//!  LvolCreate { lvol_name, size_in_mib, .. } ──serde──> {"params":{..}}
//!        client.bdev_lvol_create(&p) ──SpdkClient::call──> spdk_tgt
//!  String (the lvol UUID) <──serde── {"result":"736c18ae-.."}
//! ```
//!
//! Params structs are talon's own requests: they refuse unknown fields (a
//! typo is a bug, and SPDK refuses unknown params too) and omit absent
//! options, so the wire params are exactly what SPDK's own `rpc.py` sends for
//! the same operation (the contract tests compare them with the recorded
//! transcript). A params struct that serializes to `{}` is sent as no params.
//! Result structs accept fields they do not know: SPDK adds fields between
//! releases. Sizes follow SPDK v26.05 (`size_in_mib`, `bdev_get_iostat`
//! takes `names`).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::client::{ClientError, SpdkClient};

fn is_false(b: &bool) -> bool {
    !*b
}

/// Params for calls that take a bdev or object `name` only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByName {
    /// The bdev, lvol (`lvs/lvol` or UUID), raid or controller name.
    pub name: String,
}

impl ByName {
    /// `{"name": name}`.
    pub fn new(name: impl Into<String>) -> Self {
        ByName { name: name.into() }
    }
}

/// Params for calls that take a subsystem NQN only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByNqn {
    /// The subsystem NQN.
    pub nqn: String,
}

/// Params for calls that take an iSCSI group tag only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByTag {
    /// The portal or initiator group tag.
    pub tag: u32,
}

/// No params (`spdk_get_version`, `framework_wait_init`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

// ---------------------------------------------------------------- framework

/// `spdk_get_version` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// "SPDK v26.05".
    pub version: String,
    /// The parsed version.
    pub fields: VersionFields,
}

/// The numeric parts of the SPDK version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionFields {
    /// Year.
    pub major: u32,
    /// Month.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
    /// "-pre" and the like.
    #[serde(default)]
    pub suffix: String,
}

/// `rpc_get_methods` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetMethods {
    /// Only the methods callable in the current state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<bool>,
}

// --------------------------------------------------------------------- bdev

/// `bdev_get_bdevs` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetBdevs {
    /// One bdev (name or alias); all when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Wait this many ms for the bdev to appear.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}

/// One bdev as `bdev_get_bdevs` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bdev {
    /// The bdev name (an lvol's name is its UUID).
    pub name: String,
    /// Aliases (an lvol has `lvs/lvol`).
    #[serde(default)]
    pub aliases: Vec<String>,
    /// "Malloc disk", "Logical Volume", "Raid Volume", "NVMe disk", "AIO disk".
    #[serde(default)]
    pub product_name: String,
    /// Block size in bytes.
    pub block_size: u32,
    /// Size in blocks.
    pub num_blocks: u64,
    /// The bdev UUID.
    #[serde(default)]
    pub uuid: Option<String>,
    /// Whether a module (lvstore, raid, nvmf namespace) claimed it.
    #[serde(default)]
    pub claimed: bool,
    /// The claim type when claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_type: Option<String>,
    /// The QoS limits set with `bdev_set_qos_limit` (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assigned_rate_limits: Option<RateLimits>,
    /// Module-specific details (`lvol`, `raid`, `nvme`, `aio`).
    #[serde(default)]
    pub driver_specific: Value,
    /// Metadata bytes per block (listed only when not 0).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub md_size: u32,
    /// Whether the metadata is inside each block (`block_size` counts it)
    /// rather than in a separate buffer.
    #[serde(default, skip_serializing_if = "is_false")]
    pub md_interleave: bool,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

impl Bdev {
    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.num_blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// `bdev_aio_create` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AioCreate {
    /// The file or block device.
    pub filename: String,
    /// The bdev name.
    pub name: String,
    /// Block size; detected when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// Open read-only.
    #[serde(default, skip_serializing_if = "is_false")]
    pub readonly: bool,
    /// Fallocate the file.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fallocate: bool,
}

/// `bdev_malloc_create` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MallocCreate {
    /// The bdev name; SPDK picks `MallocN` when absent (and may collide).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Size in blocks.
    pub num_blocks: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// The bdev UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// `bdev_get_iostat` params (v26.05 takes `names`, not `name`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetIostat {
    /// The bdevs; all when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<String>>,
}

/// `bdev_get_iostat` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoStat {
    /// Ticks per second.
    pub tick_rate: u64,
    /// The tick counter when sampled.
    pub ticks: u64,
    /// Per-bdev counters.
    pub bdevs: Vec<BdevIoStat>,
}

/// One bdev's I/O counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BdevIoStat {
    /// The bdev name.
    pub name: String,
    /// Bytes read.
    pub bytes_read: u64,
    /// Read operations.
    pub num_read_ops: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Write operations.
    pub num_write_ops: u64,
    /// Bytes unmapped.
    pub bytes_unmapped: u64,
    /// Unmap operations.
    pub num_unmap_ops: u64,
    /// Sum of read latencies in ticks.
    pub read_latency_ticks: u64,
    /// Sum of write latencies in ticks.
    pub write_latency_ticks: u64,
}

// --------------------------------------------------------------------- lvol

/// `bdev_lvol_create_lvstore` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LvstoreCreate {
    /// The base bdev (claimed by the lvstore).
    pub bdev_name: String,
    /// The lvstore name.
    pub lvs_name: String,
    /// Cluster size in bytes (SPDK default 4 MiB; talon uses 1 MiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_sz: Option<u32>,
    /// "none", "unmap" (default) or "write_zeroes".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clear_method: Option<String>,
    /// Metadata pages per 100 clusters (SPDK's default 100: one per
    /// cluster). Every one of them is read, one at a time, when the lvstore
    /// loads after an unclean stop; each lvol, snapshot and 512 allocated
    /// clusters take one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_md_pages_per_cluster_ratio: Option<u32>,
}

/// Selects an lvstore by UUID or name (`bdev_lvol_get_lvstores`,
/// `bdev_lvol_delete_lvstore`); all when both are absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LvstoreSelector {
    /// The lvstore UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The lvstore name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lvs_name: Option<String>,
}

impl LvstoreSelector {
    /// By name.
    pub fn name(lvs: impl Into<String>) -> Self {
        LvstoreSelector {
            uuid: None,
            lvs_name: Some(lvs.into()),
        }
    }
}

/// One lvstore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lvstore {
    /// The lvstore UUID.
    pub uuid: String,
    /// The lvstore name.
    pub name: String,
    /// The base bdev.
    pub base_bdev: String,
    /// Data clusters in total.
    pub total_data_clusters: u64,
    /// Free clusters.
    pub free_clusters: u64,
    /// Block size.
    pub block_size: u32,
    /// Cluster size in bytes.
    pub cluster_size: u64,
}

/// An lvstore's sizes in bytes, from figures that make sense.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LvstoreBytes {
    /// Its data clusters, in bytes.
    pub total: u64,
    /// Its free clusters, in bytes.
    pub free: u64,
    /// One cluster.
    pub cluster: u64,
}

impl Lvstore {
    /// Its sizes, when SPDK's figures make sense: a cluster size that is a
    /// power of two and a multiple of the block size, no more free clusters
    /// than clusters, and byte counts that fit in 64 bits. Otherwise why not
    /// (a disk pulled under its lvstore was seen reporting such figures).
    pub fn bytes(&self) -> Result<LvstoreBytes, LvstoreFigures> {
        let odd = |why: OddFigures| LvstoreFigures {
            lvstore: self.name.clone(),
            why,
        };
        let (c, b) = (self.cluster_size, u64::from(self.block_size));
        if !c.is_power_of_two() || b == 0 || c % b != 0 {
            return Err(odd(OddFigures::Cluster { cluster: c, block: b }));
        }
        if self.free_clusters > self.total_data_clusters {
            return Err(odd(OddFigures::MoreFree {
                free: self.free_clusters,
                total: self.total_data_clusters,
            }));
        }
        let total = self.total_data_clusters.checked_mul(c).ok_or_else(|| {
            odd(OddFigures::Overflow {
                clusters: self.total_data_clusters,
                cluster: c,
            })
        })?;
        Ok(LvstoreBytes {
            total,
            // no more than total: cannot overflow
            free: self.free_clusters * c,
            cluster: c,
        })
    }
}

/// An lvstore whose figures make no sense ([`Lvstore::bytes`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lvstore {lvstore} reports {why}")]
pub struct LvstoreFigures {
    /// The lvstore.
    pub lvstore: String,
    /// What it reports.
    pub why: OddFigures,
}

/// What an lvstore reports that makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OddFigures {
    /// Not a power of two, or not a multiple of the block size.
    #[error("a cluster size of {cluster} bytes on {block}-byte blocks")]
    Cluster {
        /// Its cluster size.
        cluster: u64,
        /// Its block size.
        block: u64,
    },
    /// More free clusters than clusters.
    #[error("{free} free clusters of {total}")]
    MoreFree {
        /// Free clusters.
        free: u64,
        /// All clusters.
        total: u64,
    },
    /// More than 2^64 bytes.
    #[error("{clusters} clusters of {cluster} bytes (more than 2^64 bytes)")]
    Overflow {
        /// Clusters.
        clusters: u64,
        /// Its cluster size.
        cluster: u64,
    },
}

/// `bdev_lvol_create` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LvolCreate {
    /// The lvol name inside the lvstore.
    pub lvol_name: String,
    /// Size in MiB.
    pub size_in_mib: u64,
    /// The lvstore by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lvs_name: Option<String>,
    /// The lvstore by UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Thin provisioning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thin_provision: Option<bool>,
    /// "none", "unmap" or "write_zeroes".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clear_method: Option<String>,
}

impl LvolCreate {
    /// A thin lvol `lvs/name` of `size_in_mib`.
    pub fn thin(lvs: impl Into<String>, name: impl Into<String>, size_in_mib: u64) -> Self {
        LvolCreate {
            lvol_name: name.into(),
            size_in_mib,
            lvs_name: Some(lvs.into()),
            uuid: None,
            thin_provision: Some(true),
            clear_method: None,
        }
    }
}

/// `bdev_lvol_snapshot` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LvolSnapshot {
    /// The lvol (`lvs/lvol` or UUID).
    pub lvol_name: String,
    /// The snapshot name inside the same lvstore.
    pub snapshot_name: String,
}

/// `bdev_lvol_rename` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LvolRename {
    /// The lvol (`lvs/lvol` or UUID).
    pub old_name: String,
    /// Its new name inside the same lvstore.
    pub new_name: String,
}

/// `bdev_lvol_clone` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LvolClone {
    /// The snapshot (`lvs/snap` or UUID); a writable lvol is refused.
    pub snapshot_name: String,
    /// The clone name inside the same lvstore.
    pub clone_name: String,
}

/// `bdev_lvol_resize` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LvolResize {
    /// The lvol (`lvs/lvol` or UUID).
    pub name: String,
    /// The new size in MiB.
    pub size_in_mib: u64,
}

/// `bdev_lvol_get_lvols` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetLvols {
    /// The lvstore by UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lvs_uuid: Option<String>,
    /// The lvstore by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lvs_name: Option<String>,
}

/// One lvol as `bdev_lvol_get_lvols` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lvol {
    /// `lvs/lvol`.
    pub alias: String,
    /// The lvol UUID, also its bdev name.
    pub uuid: String,
    /// The lvol name inside the lvstore.
    pub name: String,
    /// Thin provisioned.
    #[serde(default)]
    pub is_thin_provisioned: bool,
    /// A snapshot (read-only).
    #[serde(default)]
    pub is_snapshot: bool,
    /// A clone of a snapshot.
    #[serde(default)]
    pub is_clone: bool,
    /// A clone of a bdev (an external snapshot, `bdev_lvol_set_parent_bdev`).
    #[serde(default)]
    pub is_esnap_clone: bool,
    /// Allocated clusters.
    #[serde(default)]
    pub num_allocated_clusters: u64,
    /// The lvstore.
    pub lvs: LvolStoreRef,
}

/// The lvstore an lvol lives in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LvolStoreRef {
    /// The lvstore name.
    pub name: String,
    /// The lvstore UUID.
    pub uuid: String,
}

/// `bdev_lvol_start_shallow_copy` params: copies the clusters allocated in
/// the lvol itself (not its parents) onto another bdev.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartShallowCopy {
    /// The source lvol (read-only: a snapshot).
    pub src_lvol_name: String,
    /// The destination bdev.
    pub dst_bdev_name: String,
}

/// `bdev_lvol_start_shallow_copy` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShallowCopyStarted {
    /// The id to poll with `bdev_lvol_check_shallow_copy`.
    pub operation_id: u32,
}

/// `bdev_lvol_check_shallow_copy` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckShallowCopy {
    /// The operation id.
    pub operation_id: u32,
}

/// `bdev_lvol_check_shallow_copy` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShallowCopyStatus {
    /// "in progress", "complete" or "error".
    pub state: String,
    /// Clusters copied so far.
    pub copied_clusters: u64,
    /// Clusters to copy.
    pub total_clusters: u64,
    /// The error text when `state` is "error".
    #[serde(default)]
    pub error: Option<String>,
}

/// `bdev_get_bdevs`' `assigned_rate_limits`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimits {
    /// Reads and writes, MiB/s (0: no limit).
    #[serde(default)]
    pub rw_mbytes_per_sec: u64,
}

/// `bdev_set_qos_limit` params: limits not given stay as they are; 0 lifts one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosLimit {
    /// The bdev.
    pub name: String,
    /// Reads and writes together, in MiB/s (SPDK's "MB" are MiB).
    pub rw_mbytes_per_sec: u64,
}

/// `bdev_lvol_set_parent_bdev` params: makes a bdev the external snapshot
/// (esnap) of a thin lvol, which then reads what it has not written from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LvolSetParentBdev {
    /// The lvol.
    pub lvol_name: String,
    /// The bdev that becomes its parent.
    pub parent_name: String,
}

/// `bdev_lvol_set_parent` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LvolSetParent {
    /// The lvol.
    pub lvol_name: String,
    /// Its new parent snapshot.
    pub parent_name: String,
}

// --------------------------------------------------------------------- raid

/// RAID levels talon uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RaidLevel {
    /// Striping.
    Raid0,
    /// Mirroring: talon's replicated engine.
    Raid1,
    /// Concatenation.
    Concat,
}

/// `bdev_raid_create` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaidCreate {
    /// The raid bdev name.
    pub name: String,
    /// The level (raid1 needs at least 2 base bdevs).
    pub raid_level: RaidLevel,
    /// The base bdevs (claimed by the raid).
    pub base_bdevs: Vec<String>,
    /// Strip size (raid0/concat).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strip_size_kb: Option<u32>,
    /// The raid bdev UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Write a superblock on the members.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superblock: Option<bool>,
}

/// Which raids `bdev_raid_get_bdevs` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RaidCategory {
    /// Every raid.
    All,
    /// Online raids.
    Online,
    /// Raids being configured.
    Configuring,
    /// Offline raids.
    Offline,
}

/// `bdev_raid_get_bdevs` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetRaids {
    /// The category.
    pub category: RaidCategory,
}

/// One raid bdev.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaidBdev {
    /// The raid bdev name.
    pub name: String,
    /// The raid UUID.
    #[serde(default)]
    pub uuid: Option<String>,
    /// "online", "configuring", "offline".
    pub state: String,
    /// "raid1", ...
    pub raid_level: String,
    /// Made with a superblock on its members (SPDK records membership
    /// changes there before I/O goes on, and assembles the raid from it when
    /// the members are examined).
    #[serde(default)]
    pub superblock: bool,
    /// Base bdev slots.
    pub num_base_bdevs: u32,
    /// Slots with a bdev found.
    pub num_base_bdevs_discovered: u32,
    /// Slots in service (fewer than `num_base_bdevs`: degraded).
    pub num_base_bdevs_operational: u32,
    /// The slots.
    #[serde(default)]
    pub base_bdevs_list: Vec<RaidBaseBdev>,
    /// A background process (a rebuild) while one runs.
    #[serde(default)]
    pub process: Option<RaidProcess>,
}

impl RaidBdev {
    /// Whether a configured slot holds a member `is` names.
    pub fn serves(&self, is: impl Fn(&str) -> bool) -> bool {
        self.base_bdevs_list
            .iter()
            .any(|b| b.is_configured && b.name.as_deref().is_some_and(&is))
    }

    /// The slot of the member `names` names (by its name or its UUID) when
    /// it is in service: configured and not written by a raid process (SPDK
    /// marks a rebuild's target configured before its rebuild starts).
    pub fn slot_in_service(&self, names: &[String]) -> Option<&RaidBaseBdev> {
        if self.process.as_ref().is_some_and(|p| names.contains(&p.target)) {
            return None;
        }
        self.base_bdevs_list.iter().find(|b| {
            b.is_configured
                && (b.name.as_ref().is_some_and(|n| names.contains(n))
                    || b.uuid.as_ref().is_some_and(|u| names.contains(u)))
        })
    }
}

/// A raid's background process, as `bdev_raid_get_bdevs` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaidProcess {
    /// "rebuild".
    #[serde(rename = "type")]
    pub kind: String,
    /// The member being written (the bdev name it was added by).
    pub target: String,
    /// How far it is.
    pub progress: RaidProgress,
}

/// Progress of a raid process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaidProgress {
    /// Blocks done.
    pub blocks: u64,
    /// Percent done.
    pub percent: u32,
}

/// One raid slot; `name` is absent for an empty slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaidBaseBdev {
    /// The member bdev.
    #[serde(default)]
    pub name: Option<String>,
    /// Its UUID.
    #[serde(default)]
    pub uuid: Option<String>,
    /// Whether the slot is in service.
    #[serde(default)]
    pub is_configured: bool,
    /// Blocks before the raid's data on the member (its superblock's room;
    /// 0 without a superblock).
    #[serde(default)]
    pub data_offset: u64,
    /// Blocks of the raid's data on the member.
    #[serde(default)]
    pub data_size: u64,
}

/// `bdev_raid_delete` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaidDelete {
    /// The raid bdev.
    pub name: String,
    /// Also wipe the superblock on the members it has (a raid made with
    /// `superblock`); without it they keep it, and SPDK assembles the raid
    /// from them again when they are examined (a target restart).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clear_sb: Option<bool>,
}

impl RaidDelete {
    /// Deletes raid `name`, members keep their superblock.
    pub fn new(name: impl Into<String>) -> Self {
        RaidDelete {
            name: name.into(),
            clear_sb: None,
        }
    }
}

/// `bdev_raid_add_base_bdev` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaidAddBaseBdev {
    /// The raid bdev.
    pub raid_bdev: String,
    /// The bdev to add (a rebuild starts).
    pub base_bdev: String,
}

/// `bdev_null_create` params (a placeholder that reads zeros and drops writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NullCreate {
    /// The bdev name.
    pub name: String,
    /// Size in blocks.
    pub num_blocks: u64,
    /// Block size in bytes.
    pub block_size: u32,
}

/// `notify_get_notifications` params: events from id `id` on, at most `max`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetNotifications {
    /// The first event id wanted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// At most this many.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
}

/// One event of SPDK's notify library (`bdev_register`, `bdev_unregister`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notification {
    /// The event type.
    #[serde(rename = "type")]
    pub kind: String,
    /// The object (a bdev name).
    pub ctx: String,
    /// Its id (counts from 0 in each target process).
    pub id: u64,
}

// --------------------------------------------------------------------- nvmf

/// `nvmf_create_transport` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTransport {
    /// "TCP" or "RDMA".
    pub trtype: String,
    /// Queue depth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queue_depth: Option<u32>,
    /// In-capsule data size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_capsule_data_size: Option<u32>,
    /// Max I/O size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_io_size: Option<u32>,
}

impl CreateTransport {
    /// The TCP transport with SPDK defaults.
    pub fn tcp() -> Self {
        CreateTransport {
            trtype: "TCP".into(),
            max_queue_depth: None,
            in_capsule_data_size: None,
            max_io_size: None,
        }
    }
}

/// `nvmf_get_transports` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetTransports {
    /// One transport type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trtype: Option<String>,
}

/// One nvmf transport.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transport {
    /// "TCP".
    pub trtype: String,
    /// Every other option as reported.
    #[serde(flatten)]
    pub options: serde_json::Map<String, Value>,
}

/// `nvmf_create_subsystem` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSubsystem {
    /// The subsystem NQN.
    pub nqn: String,
    /// Allow any host (talon sets false and adds hosts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_any_host: Option<bool>,
    /// Serial number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    /// Model number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_number: Option<String>,
    /// Max namespaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_namespaces: Option<u32>,
    /// ANA reporting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ana_reporting: Option<bool>,
    /// The lowest controller ID the subsystem hands out (SPDK: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cntlid: Option<u16>,
    /// The highest controller ID the subsystem hands out (SPDK: 0xffef).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cntlid: Option<u16>,
}

/// `nvmf_get_subsystems` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetSubsystems {
    /// One subsystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nqn: Option<String>,
}

/// One nvmf subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subsystem {
    /// The NQN.
    pub nqn: String,
    /// "NVMe" or "Discovery".
    pub subtype: String,
    /// Listeners.
    #[serde(default)]
    pub listen_addresses: Vec<ListenAddress>,
    /// Any host may connect.
    #[serde(default)]
    pub allow_any_host: bool,
    /// Allowed hosts.
    #[serde(default)]
    pub hosts: Vec<SubsystemHost>,
    /// Serial number.
    #[serde(default)]
    pub serial_number: Option<String>,
    /// Model number.
    #[serde(default)]
    pub model_number: Option<String>,
    /// Namespaces (the bdev of an lvol is reported by UUID).
    #[serde(default)]
    pub namespaces: Vec<SubsystemNamespace>,
    /// The lowest controller ID it hands out.
    #[serde(default)]
    pub min_cntlid: Option<u16>,
    /// The highest controller ID it hands out.
    #[serde(default)]
    pub max_cntlid: Option<u16>,
}

impl Subsystem {
    /// Whether the subsystem was created with ANA reporting (SPDK reports an
    /// `anagrpid` on its namespaces only then). `None` when it has no
    /// namespace to tell by.
    pub fn ana_reporting(&self) -> Option<bool> {
        self.namespaces.first().map(|n| n.anagrpid.is_some())
    }
}

/// An allowed host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubsystemHost {
    /// The host NQN.
    pub nqn: String,
    /// The keyring key the host must authenticate with (DH-HMAC-CHAP), by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_key: Option<String>,
    /// The keyring key the controller authenticates with to the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrlr_key: Option<String>,
}

/// A namespace of a subsystem as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubsystemNamespace {
    /// The namespace id.
    pub nsid: u32,
    /// The bdev name.
    pub bdev_name: String,
    /// The NGUID (32 hex digits, upper case).
    #[serde(default)]
    pub nguid: Option<String>,
    /// The namespace UUID.
    #[serde(default)]
    pub uuid: Option<String>,
    /// The ANA group; SPDK reports it only for subsystems created with
    /// `ana_reporting` (`nvmf_rpc.c`, `dump_nvmf_subsystem`).
    #[serde(default)]
    pub anagrpid: Option<u32>,
}

/// A transport address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenAddress {
    /// "TCP".
    pub trtype: String,
    /// "IPv4" or "IPv6".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adrfam: Option<String>,
    /// The address.
    pub traddr: String,
    /// The port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trsvcid: Option<String>,
}

impl ListenAddress {
    /// NVMe/TCP over IPv4 (IPv6 when `addr` is one).
    pub fn tcp(addr: std::net::IpAddr, port: u16) -> Self {
        ListenAddress {
            trtype: "TCP".into(),
            adrfam: Some(if addr.is_ipv4() { "IPv4" } else { "IPv6" }.into()),
            traddr: addr.to_string(),
            trsvcid: Some(port.to_string()),
        }
    }
}

/// `nvmf_subsystem_add_ns` namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceParams {
    /// The bdev to export.
    pub bdev_name: String,
    /// The namespace id; the first free one when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    /// Explicit NGUID (32 hex digits): set it, or an NVMe attach of this
    /// namespace inside the same target clashes with the source bdev's UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nguid: Option<String>,
    /// Explicit namespace UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// `nvmf_subsystem_add_ns` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddNamespace {
    /// The subsystem.
    pub nqn: String,
    /// The namespace.
    pub namespace: NamespaceParams,
}

impl AddNamespace {
    /// Exports `bdev` with a NGUID and UUID derived from `id` (both set, see
    /// [`NamespaceParams::nguid`]).
    pub fn with_id(nqn: impl Into<String>, bdev: impl Into<String>, id: uuid::Uuid) -> Self {
        AddNamespace {
            nqn: nqn.into(),
            namespace: NamespaceParams {
                bdev_name: bdev.into(),
                nsid: None,
                nguid: Some(id.simple().to_string().to_uppercase()),
                uuid: Some(id.hyphenated().to_string()),
            },
        }
    }
}

/// `nvmf_subsystem_remove_ns` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveNamespace {
    /// The subsystem.
    pub nqn: String,
    /// The namespace id.
    pub nsid: u32,
}

/// `nvmf_subsystem_add_listener` / `_remove_listener` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemListener {
    /// The subsystem.
    pub nqn: String,
    /// The address.
    pub listen_address: ListenAddress,
}

/// An ANA state of a listener, as `nvmf_subsystem_listener_set_ana_state`
/// spells it. SPDK v26.05 sets only these three (`subsystem.c`,
/// `spdk_nvmf_subsystem_set_ana_state`: change and persistent loss are -ENOTSUP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnaState {
    /// I/O is served.
    Optimized,
    /// I/O is served (a less preferred path).
    NonOptimized,
    /// Every I/O command is completed with the path error "ANA inaccessible"
    /// (no DNR), without reaching the bdev; hosts with NVMe multipath queue
    /// it until the state changes.
    Inaccessible,
}

impl AnaState {
    /// SPDK's spelling, as `nvmf_subsystem_get_listeners` reports it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Optimized => "optimized",
            Self::NonOptimized => "non_optimized",
            Self::Inaccessible => "inaccessible",
        }
    }
}

/// `nvmf_subsystem_listener_set_ana_state` params. SPDK pauses the subsystem
/// with nsid 0 while it changes the state, then resumes it (`nvmf_rpc.c`,
/// `rpc_nvmf_subsystem_listener_set_ana_state` -> `spdk_nvmf_subsystem_pause(subsystem, 0, ...)`):
/// nsid 0 pauses no namespace, so it waits for outstanding admin commands
/// only, never for I/O (`nvmf.c`, `nvmf_poll_group_pause_subsystem`; "If 0,
/// pause no namespaces", `nvmf.h`). I/O already past the ANA check goes on
/// after the call returns; [`SetNsAnaGroup`] is what waits for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerAnaState {
    /// The subsystem (created with `ana_reporting`, or SPDK answers -32603
    /// "error setting ANA state: -22").
    pub nqn: String,
    /// The listener.
    pub listen_address: ListenAddress,
    /// The state for every ANA group of the listener.
    pub ana_state: AnaState,
}

/// `nvmf_subsystem_set_ns_ana_group` params. SPDK pauses namespace `nsid`
/// (`spdk_nvmf_subsystem_pause(subsystem, nsid, ...)`): it waits until no
/// I/O is outstanding on it in any poll group, moves it to `anagrpid`, and
/// resumes it; commands that arrive meanwhile are queued and run after.
/// Refused with -32602 "Invalid parameters" for an unknown subsystem or
/// namespace, an `anagrpid` of 0 or above the subsystem's `max_namespaces`
/// (checked on v26.05). Setting the group a namespace already has changes
/// nothing but the drain (and a namespace-changed notice to hosts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetNsAnaGroup {
    /// The subsystem.
    pub nqn: String,
    /// The namespace.
    pub nsid: u32,
    /// The ANA group it joins.
    pub anagrpid: u32,
}

/// One listener of `nvmf_subsystem_get_listeners`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerInfo {
    /// The address.
    pub address: ListenAddress,
    /// One state per ANA group (reported only with `ana_reporting`).
    #[serde(default)]
    pub ana_states: Vec<AnaGroupState>,
}

/// The ANA state of one group of a listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnaGroupState {
    /// The group id.
    pub ana_group: u32,
    /// "optimized", "non_optimized", "inaccessible", "persistent_loss" or "change".
    pub ana_state: String,
}

/// `nvmf_subsystem_allow_any_host` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowAnyHost {
    /// The subsystem.
    pub nqn: String,
    /// Whether any host may connect (talon sets false).
    pub allow_any_host: bool,
}

/// `nvmf_subsystem_add_host` / `_remove_host` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemHostParams {
    /// The subsystem.
    pub nqn: String,
    /// The host NQN.
    pub host: String,
}

/// `nvmf_subsystem_add_host` with DH-HMAC-CHAP keys, and `nvmf_subsystem_set_keys`
/// params. SPDK v26.05 (`lib/nvmf/nvmf_rpc.c`): a key name not in the keyring
/// is -32602 "Invalid parameters"; `set_keys` on a host the subsystem does not
/// list is -22 "Invalid argument"; `set_keys` without keys clears them (the
/// host then connects without authentication).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemHostKeys {
    /// The subsystem.
    pub nqn: String,
    /// The host NQN.
    pub host: String,
    /// The key the host authenticates with (a keyring key name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhchap_key: Option<String>,
    /// The key the controller authenticates with (bidirectional; needs `dhchap_key`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrlr_key: Option<String>,
    /// `nvmf_subsystem_add_host` only: the TLS PSK of the host (a keyring key
    /// name), read by the TCP transport (`lib/nvmf/tcp.c`,
    /// `nvmf_tcp_subsystem_add_host`); a name not in the keyring is -32603
    /// "Internal error". `nvmf_get_subsystems` does not report it (v26.05).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psk: Option<String>,
}

/// `nvmf_subsystem_add_listener` with `secure_channel` (NVMe/TCP TLS 1.3 with
/// a PSK; SPDK v26.05 listens with its `ssl` socket). TLS is a property of
/// the listening port: a plain listener added later on the same address and
/// port shares the TLS socket (seen on spdk_tgt v26.05), so talon keeps TLS
/// on a port of its own. Refused with -32603 "Cannot establish secure
/// channel, when 'allow_any_host' is set".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecureListener {
    /// The subsystem.
    pub nqn: String,
    /// The address.
    pub listen_address: ListenAddress,
    /// Require TLS.
    pub secure_channel: bool,
}

/// `keyring_file_add_key` params. SPDK v26.05 (`module/keyring/file`): the
/// path must be absolute, the file owned by spdk_tgt's uid and not accessible
/// by group or others (else -1 "Operation not permitted"); a name already in
/// the keyring is -17 "File exists". The file is read again at every use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyringFileKey {
    /// The key name (no `:` inside).
    pub name: String,
    /// The key file.
    pub path: String,
}

/// One key of `keyring_get_keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyringKey {
    /// The name.
    pub name: String,
    /// "keyring_file", ...
    #[serde(default)]
    pub module: Option<String>,
    /// The key file (file keyring).
    #[serde(default)]
    pub path: Option<String>,
    /// Removed but still referenced.
    #[serde(default)]
    pub removed: bool,
    /// References: the keyring's own (until removed) plus one per user (a
    /// subsystem host's key or PSK, an NVMe controller's); 1 = unused
    /// (`lib/keyring/keyring.c` of v26.05).
    #[serde(default)]
    pub refcnt: Option<i64>,
}

/// A host controller connected to an nvmf subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmfController {
    /// Controller id.
    pub cntlid: u32,
    /// The host NQN.
    pub hostnqn: String,
    /// The host id.
    #[serde(default)]
    pub hostid: Option<String>,
    /// I/O queue pairs.
    #[serde(default)]
    pub num_io_qpairs: u32,
}

// --------------------------------------------------------------- bdev_nvme

/// The NVMe keep-alive talon sets on every target, as Longhorn's SPDK engine
/// does (`replicaKeepAliveTimeoutMs`): 10 s.
pub const NVME_KEEP_ALIVE_MS: u32 = 10_000;

/// `bdev_nvme_set_options` params: global options of SPDK's NVMe bdev module,
/// taken only while no NVMe controller exists (-1 "RPC not permitted with nvme
/// controllers already attached" after one). talon sets only the keep-alive;
/// the reconnect options go with each `bdev_nvme_attach_controller`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvmeOptions {
    /// Keep-alive timeout of the controllers attached later (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_alive_timeout_ms: Option<u32>,
}

/// `framework_get_config` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetConfig {
    /// The subsystem (`bdev`, `nvmf`, ...).
    pub name: String,
}

/// One call of a subsystem's configuration (`framework_get_config`): the
/// method that would make the state again and its params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigCall {
    /// The method (`bdev_nvme_set_options`, ...).
    pub method: String,
    /// Its params as SPDK reports them.
    #[serde(default)]
    pub params: Value,
}

/// `bdev_nvme_attach_controller` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachController {
    /// The controller name; bdevs are `{name}n{nsid}`.
    pub name: String,
    /// "tcp" or "pcie".
    pub trtype: String,
    /// IP address, or PCI BDF for PCIe.
    pub traddr: String,
    /// "ipv4" or "ipv6".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adrfam: Option<String>,
    /// Port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trsvcid: Option<String>,
    /// The subsystem NQN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnqn: Option<String>,
    /// The host NQN to present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostnqn: Option<String>,
    /// Give up reconnecting after this many seconds (-1: never).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ctrlr_loss_timeout_sec: Option<i64>,
    /// Delay between reconnects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconnect_delay_sec: Option<u32>,
    /// Fail I/O after this many seconds disconnected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fast_io_fail_timeout_sec: Option<u32>,
    /// The keyring key to authenticate with (DH-HMAC-CHAP). A name not in the
    /// keyring is -126 "Required key not available"; a connect the target
    /// refuses (wrong key, no key where one is required) is -5
    /// "Input/output error" (spdk_tgt v26.05).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_key: Option<String>,
    /// The keyring key the controller must prove (bidirectional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrlr_key: Option<String>,
    /// The TLS PSK (a keyring key name): connect with NVMe/TCP TLS 1.3. A
    /// refused handshake (no PSK where the listener wants one, another PSK)
    /// is -5 "Input/output error"; a name not in the keyring -126.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psk: Option<String>,
}

impl AttachController {
    /// An NVMe/TCP attach of `subnqn` at `addr:port`.
    pub fn tcp(
        name: impl Into<String>,
        addr: std::net::IpAddr,
        port: u16,
        subnqn: impl Into<String>,
    ) -> Self {
        AttachController {
            name: name.into(),
            trtype: "tcp".into(),
            traddr: addr.to_string(),
            adrfam: Some(if addr.is_ipv4() { "ipv4" } else { "ipv6" }.into()),
            trsvcid: Some(port.to_string()),
            subnqn: Some(subnqn.into()),
            hostnqn: None,
            ctrlr_loss_timeout_sec: None,
            reconnect_delay_sec: None,
            fast_io_fail_timeout_sec: None,
            dhchap_key: None,
            dhchap_ctrlr_key: None,
            psk: None,
        }
    }

    /// This attach with Longhorn's replica-link timeouts (go-spdk-helper's
    /// defaults, which Longhorn's SPDK engine attaches replicas with): a lost
    /// link is retried every 2 s, its I/O failed after 10 s, the controller
    /// given up after 15 s. SPDK's own defaults (no reconnect) fail a replica at
    /// the first blip, as one was under a stalled machine.
    pub fn with_longhorn_link_timeouts(self) -> Self {
        AttachController {
            ctrlr_loss_timeout_sec: Some(15),
            reconnect_delay_sec: Some(2),
            fast_io_fail_timeout_sec: Some(10),
            ..self
        }
    }

    /// A local PCIe controller at `bdf`.
    pub fn pcie(name: impl Into<String>, bdf: impl Into<String>) -> Self {
        AttachController {
            name: name.into(),
            trtype: "pcie".into(),
            traddr: bdf.into(),
            adrfam: None,
            trsvcid: None,
            subnqn: None,
            hostnqn: None,
            ctrlr_loss_timeout_sec: None,
            reconnect_delay_sec: None,
            fast_io_fail_timeout_sec: None,
            dhchap_key: None,
            dhchap_ctrlr_key: None,
            psk: None,
        }
    }
}

/// `bdev_nvme_send_cmd` params: one NVMe command passed through to an
/// attached controller (`module/bdev/nvme/nvme_rpc.c`). Every buffer is
/// base64 "urlsafe" (`-` and `_`). The RPC answers as soon as the command
/// completes, whatever its NVMe status: that is in `cpl`. A controller name
/// that is not attached, or a `cmdbuf` that does not decode to 64 bytes, is
/// -32602 "Invalid argument" (spdk_tgt v26.05); so is an aio or other bdev's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvmeSendCmd {
    /// The NVMe bdev controller (`bdev_nvme_attach_controller`'s `name`).
    pub name: String,
    /// `io` (an I/O queue of the controller) or `admin`.
    pub cmd_type: String,
    /// `c2h` (data from the controller) or `h2c`.
    pub data_direction: String,
    /// The 64-byte submission queue entry.
    pub cmdbuf: String,
    /// Bytes to transfer from the controller (`c2h`); must be what the
    /// command moves. A transfer above the controller's MDTS is not refused
    /// by the RPC: over NVMe/TCP (v26.05, 128 KiB) a 1 MiB Read reset the
    /// controller and completed aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_len: Option<u32>,
    /// Metadata bytes to transfer from the controller (a separate-metadata
    /// format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_len: Option<u32>,
    /// Timeout in ms (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u32>,
}

/// `bdev_nvme_send_cmd` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmeCmdResult {
    /// The 16-byte completion queue entry (its status in bytes 14-15).
    pub cpl: String,
    /// The data read (`c2h` with `data_len`).
    #[serde(default)]
    pub data: Option<String>,
    /// The metadata read.
    #[serde(default)]
    pub metadata: Option<String>,
}

/// `bdev_nvme_get_controllers` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetControllers {
    /// One controller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// An NVMe bdev controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvmeController {
    /// The controller name.
    pub name: String,
    /// Its paths.
    #[serde(default)]
    pub ctrlrs: Vec<NvmeControllerPath>,
}

/// One path of an NVMe bdev controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvmeControllerPath {
    /// "enabled", "resetting", ...
    #[serde(default)]
    pub state: String,
    /// The transport id.
    pub trid: ControllerTrid,
    /// The host it connected as (absent from older targets' answers).
    #[serde(default)]
    pub host: Option<ControllerHost>,
}

/// The host side of an NVMe bdev controller's path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerHost {
    /// The host NQN it connected as.
    pub nqn: String,
}

/// A transport id as `bdev_nvme_get_controllers` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerTrid {
    /// "TCP", "PCIe".
    pub trtype: String,
    /// Address.
    pub traddr: String,
    /// "IPv4".
    #[serde(default)]
    pub adrfam: Option<String>,
    /// Port.
    #[serde(default)]
    pub trsvcid: Option<String>,
    /// Subsystem NQN.
    #[serde(default)]
    pub subnqn: Option<String>,
}

// -------------------------------------------------------------------- iscsi

/// An iSCSI portal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Portal {
    /// Address.
    pub host: String,
    /// Port (a string in SPDK).
    pub port: String,
}

/// `iscsi_create_portal_group` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatePortalGroup {
    /// The tag.
    pub tag: u32,
    /// Portals.
    pub portals: Vec<Portal>,
}

/// `iscsi_create_initiator_group` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateInitiatorGroup {
    /// The tag.
    pub tag: u32,
    /// Initiator names or "ANY".
    pub initiators: Vec<String>,
    /// Netmasks.
    pub netmasks: Vec<String>,
}

/// A LUN of a target node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiLun {
    /// The bdev.
    pub bdev_name: String,
    /// The LUN id.
    pub lun_id: u32,
}

/// A portal group to initiator group mapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgIgMap {
    /// Portal group tag.
    pub pg_tag: u32,
    /// Initiator group tag.
    pub ig_tag: u32,
}

/// `iscsi_create_target_node` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTargetNode {
    /// The node name (SPDK prefixes `iqn.2016-06.io.spdk:` unless a full IQN).
    pub name: String,
    /// The alias.
    pub alias_name: String,
    /// LUNs.
    pub luns: Vec<IscsiLun>,
    /// Group mappings.
    pub pg_ig_maps: Vec<PgIgMap>,
    /// Queue depth.
    pub queue_depth: u32,
    /// Disable CHAP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_chap: Option<bool>,
    /// Require CHAP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub require_chap: Option<bool>,
}

/// `iscsi_delete_target_node` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteTargetNode {
    /// The full IQN.
    pub name: String,
}

/// An iSCSI target node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetNode {
    /// The full IQN.
    pub name: String,
    /// The alias.
    #[serde(default)]
    pub alias_name: String,
    /// Group mappings.
    #[serde(default)]
    pub pg_ig_maps: Vec<PgIgMap>,
    /// LUNs.
    #[serde(default)]
    pub luns: Vec<IscsiLun>,
    /// Queue depth.
    #[serde(default)]
    pub queue_depth: u32,
}

/// An iSCSI portal group as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortalGroup {
    /// The tag.
    pub tag: u32,
    /// Portals.
    #[serde(default)]
    pub portals: Vec<PortalReport>,
}

/// A portal as reported (SPDK may add fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortalReport {
    /// Address.
    pub host: String,
    /// Port.
    pub port: String,
}

/// An iSCSI initiator group as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitiatorGroup {
    /// The tag.
    pub tag: u32,
    /// Initiators.
    #[serde(default)]
    pub initiators: Vec<String>,
    /// Netmasks.
    #[serde(default)]
    pub netmasks: Vec<String>,
}

// ------------------------------------------------------------------ methods

macro_rules! rpc {
    ($(#[$m:meta])* $name:ident($p:ty) -> $r:ty) => {
        $(#[$m])*
        pub async fn $name(&self, params: &$p) -> Result<$r, ClientError> {
            self.typed(stringify!($name), params).await
        }
    };
    ($(#[$m:meta])* $name:ident() -> $r:ty) => {
        $(#[$m])*
        pub async fn $name(&self) -> Result<$r, ClientError> {
            self.typed(stringify!($name), &NoParams {}).await
        }
    };
}

impl SpdkClient {
    /// Calls `method` with `params` (sent as no params when they serialize
    /// to `{}`) and decodes the result.
    pub async fn typed<P: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<R, ClientError> {
        let value = serde_json::to_value(params).map_err(|source| ClientError::EncodeParams {
            method: method.to_owned(),
            source,
        })?;
        let params = match value {
            Value::Null => None,
            Value::Object(m) if m.is_empty() => None,
            v => Some(v),
        };
        let v = self
            .call_value(method, params, self.timeouts().for_method(method))
            .await?;
        serde_json::from_value(v).map_err(|source| ClientError::DecodeResult {
            method: method.to_owned(),
            source,
        })
    }

    rpc!(/// The target's version; also the readiness probe.
        spdk_get_version() -> Version);
    rpc!(/// Registered method names.
        rpc_get_methods(GetMethods) -> Vec<String>);
    rpc!(/// Waits for the framework to finish initializing.
        framework_wait_init() -> bool);
    rpc!(/// Lists bdevs, or one by name or alias (-19 when missing).
        bdev_get_bdevs(GetBdevs) -> Vec<Bdev>);
    rpc!(/// Creates an AIO bdev over a file or block device; returns its name.
        bdev_aio_create(AioCreate) -> String);
    rpc!(/// Deletes an AIO bdev.
        bdev_aio_delete(ByName) -> bool);
    rpc!(/// Creates a RAM bdev (tests and benches); returns its name.
        bdev_malloc_create(MallocCreate) -> String);
    rpc!(/// Deletes a RAM bdev.
        bdev_malloc_delete(ByName) -> bool);
    rpc!(/// Examines a bdev (imports an lvstore on it).
        bdev_examine(ByName) -> bool);
    rpc!(/// Waits until every examine finished.
        bdev_wait_for_examine() -> bool);
    rpc!(/// I/O counters of some or all bdevs.
        bdev_get_iostat(GetIostat) -> IoStat);
    rpc!(/// Creates an lvstore on a bdev; returns the lvstore UUID (long timeout).
        bdev_lvol_create_lvstore(LvstoreCreate) -> String);
    rpc!(/// Lists lvstores (-19 for a missing selected one).
        bdev_lvol_get_lvstores(LvstoreSelector) -> Vec<Lvstore>);
    rpc!(/// Deletes an lvstore and every lvol in it.
        bdev_lvol_delete_lvstore(LvstoreSelector) -> bool);
    rpc!(/// Creates an lvol; returns its UUID (= its bdev name).
        bdev_lvol_create(LvolCreate) -> String);
    rpc!(/// Snapshots an lvol; returns the snapshot UUID.
        bdev_lvol_snapshot(LvolSnapshot) -> String);
    rpc!(/// Clones a snapshot; returns the clone UUID.
        bdev_lvol_clone(LvolClone) -> String);
    rpc!(/// Renames an lvol (its UUID, and so its bdev name, stays).
        bdev_lvol_rename(LvolRename) -> bool);
    rpc!(/// Resizes an lvol.
        bdev_lvol_resize(LvolResize) -> bool);
    rpc!(/// Deletes an lvol (a snapshot with clones is refused).
        bdev_lvol_delete(ByName) -> bool);
    rpc!(/// Lists lvols.
        bdev_lvol_get_lvols(GetLvols) -> Vec<Lvol>);
    rpc!(/// Starts a shallow copy of an lvol onto a bdev (long timeout).
        bdev_lvol_start_shallow_copy(StartShallowCopy) -> ShallowCopyStarted);
    rpc!(/// Progress of a shallow copy.
        bdev_lvol_check_shallow_copy(CheckShallowCopy) -> ShallowCopyStatus);
    rpc!(/// Makes a snapshot the parent of an lvol.
        bdev_lvol_set_parent(LvolSetParent) -> bool);
    rpc!(/// Makes a bdev the external snapshot of a thin lvol.
        bdev_lvol_set_parent_bdev(LvolSetParentBdev) -> bool);
    rpc!(/// Copies the parent's clusters into the lvol and drops the parent
        /// (long timeout: SPDK answers when the copy is done; of an external
        /// snapshot, every cluster is copied).
        bdev_lvol_decouple_parent(ByName) -> bool);
    rpc!(/// Caps (or with 0 lifts the cap on) a bdev's reads and writes.
        bdev_set_qos_limit(QosLimit) -> bool);
    rpc!(/// Creates a raid bdev.
        bdev_raid_create(RaidCreate) -> bool);
    rpc!(/// Deletes a raid bdev (releases its members).
        bdev_raid_delete(RaidDelete) -> bool);
    rpc!(/// Lists raid bdevs.
        bdev_raid_get_bdevs(GetRaids) -> Vec<RaidBdev>);
    rpc!(/// Adds a member to a raid (starts a rebuild).
        bdev_raid_add_base_bdev(RaidAddBaseBdev) -> bool);
    rpc!(/// Removes a member bdev from its raid (a raid1 stays online, degraded).
        bdev_raid_remove_base_bdev(ByName) -> bool);
    rpc!(/// Creates a null bdev (returns its name).
        bdev_null_create(NullCreate) -> String);
    rpc!(/// Deletes a null bdev.
        bdev_null_delete(ByName) -> bool);
    rpc!(/// Events since an id (bdev register/unregister, ...).
        notify_get_notifications(GetNotifications) -> Vec<Notification>);
    rpc!(/// Creates an nvmf transport.
        nvmf_create_transport(CreateTransport) -> bool);
    rpc!(/// Lists nvmf transports.
        nvmf_get_transports(GetTransports) -> Vec<Transport>);
    rpc!(/// Creates an nvmf subsystem.
        nvmf_create_subsystem(CreateSubsystem) -> bool);
    rpc!(/// Deletes an nvmf subsystem.
        nvmf_delete_subsystem(ByNqn) -> bool);
    rpc!(/// Lists nvmf subsystems.
        nvmf_get_subsystems(GetSubsystems) -> Vec<Subsystem>);
    rpc!(/// Adds a namespace; returns its nsid.
        nvmf_subsystem_add_ns(AddNamespace) -> u32);
    rpc!(/// Removes a namespace.
        nvmf_subsystem_remove_ns(RemoveNamespace) -> bool);
    rpc!(/// Adds a listener.
        nvmf_subsystem_add_listener(SubsystemListener) -> bool);
    rpc!(/// Removes a listener.
        nvmf_subsystem_remove_listener(SubsystemListener) -> bool);
    rpc!(/// Sets the ANA state of a listener (waits for no I/O: see
        /// [`ListenerAnaState`]).
        nvmf_subsystem_listener_set_ana_state(ListenerAnaState) -> bool);
    rpc!(/// Moves a namespace to an ANA group, with the namespace paused and
        /// drained (see [`SetNsAnaGroup`]).
        nvmf_subsystem_set_ns_ana_group(SetNsAnaGroup) -> bool);
    rpc!(/// The listeners of a subsystem with their ANA states.
        nvmf_subsystem_get_listeners(ByNqn) -> Vec<ListenerInfo>);
    rpc!(/// Allows a host.
        nvmf_subsystem_add_host(SubsystemHostParams) -> bool);
    rpc!(/// Allows any host, or only the listed ones.
        nvmf_subsystem_allow_any_host(AllowAnyHost) -> bool);
    rpc!(/// Disallows a host.
        nvmf_subsystem_remove_host(SubsystemHostParams) -> bool);
    rpc!(/// Changes (or, without keys, clears) a listed host's DH-HMAC-CHAP keys.
        nvmf_subsystem_set_keys(SubsystemHostKeys) -> bool);
    rpc!(/// Adds a key file to the keyring.
        keyring_file_add_key(KeyringFileKey) -> bool);
    rpc!(/// Removes a file key from the keyring.
        keyring_file_remove_key(ByName) -> bool);
    rpc!(/// The keys of the keyring.
        keyring_get_keys() -> Vec<KeyringKey>);
    rpc!(/// Host controllers connected to a subsystem.
        nvmf_subsystem_get_controllers(ByNqn) -> Vec<NvmfController>);
    rpc!(/// Attaches an NVMe controller; returns the bdev names created
        /// (possibly none, see [`NamespaceParams::nguid`]). Long timeout.
        bdev_nvme_attach_controller(AttachController) -> Vec<String>);
    rpc!(/// Sets global NVMe bdev options (only before the first controller).
        bdev_nvme_set_options(NvmeOptions) -> bool);
    rpc!(/// A subsystem's configuration as the calls that make it.
        framework_get_config(GetConfig) -> Vec<ConfigCall>);
    rpc!(/// Detaches an NVMe controller.
        bdev_nvme_detach_controller(ByName) -> bool);
    rpc!(/// Disables an NVMe controller: its qpairs go, its admin queue is
        /// disconnected and no longer polled (it stays, with its bdevs, until
        /// enabled or detached). EBUSY while it is being reset.
        bdev_nvme_disable_controller(ByName) -> bool);
    rpc!(/// Lists NVMe controllers.
        bdev_nvme_get_controllers(GetControllers) -> Vec<NvmeController>);
    rpc!(/// Passes one NVMe command through to an attached controller (see
        /// [`NvmeSendCmd`]: a completed call may carry an NVMe error status).
        bdev_nvme_send_cmd(NvmeSendCmd) -> NvmeCmdResult);
    rpc!(/// Creates an iSCSI portal group.
        iscsi_create_portal_group(CreatePortalGroup) -> bool);
    rpc!(/// Deletes an iSCSI portal group.
        iscsi_delete_portal_group(ByTag) -> bool);
    rpc!(/// Lists iSCSI portal groups.
        iscsi_get_portal_groups() -> Vec<PortalGroup>);
    rpc!(/// Creates an iSCSI initiator group.
        iscsi_create_initiator_group(CreateInitiatorGroup) -> bool);
    rpc!(/// Deletes an iSCSI initiator group.
        iscsi_delete_initiator_group(ByTag) -> bool);
    rpc!(/// Lists iSCSI initiator groups.
        iscsi_get_initiator_groups() -> Vec<InitiatorGroup>);
    rpc!(/// Creates an iSCSI target node.
        iscsi_create_target_node(CreateTargetNode) -> bool);
    rpc!(/// Deletes an iSCSI target node.
        iscsi_delete_target_node(DeleteTargetNode) -> bool);
    rpc!(/// Lists iSCSI target nodes.
        iscsi_get_target_nodes() -> Vec<TargetNode>);

    /// `nvmf_subsystem_add_host` with DH-HMAC-CHAP keys.
    pub async fn nvmf_subsystem_add_host_keys(
        &self,
        params: &SubsystemHostKeys,
    ) -> Result<bool, ClientError> {
        self.typed("nvmf_subsystem_add_host", params).await
    }

    /// `nvmf_subsystem_add_listener` with `ana_state`: the listener is
    /// made in that state, so no host ever finds it in another (SPDK
    /// v26.05 takes `optimized`, `non_optimized` or `inaccessible`, else
    /// -32602 "Invalid parameters" and no listener; on a subsystem without
    /// ANA reporting the state is taken and never reported).
    pub async fn nvmf_subsystem_add_listener_ana(
        &self,
        params: &ListenerAnaState,
    ) -> Result<bool, ClientError> {
        self.typed("nvmf_subsystem_add_listener", params).await
    }

    /// `nvmf_subsystem_add_listener` with `secure_channel`.
    pub async fn nvmf_subsystem_add_listener_secure(
        &self,
        params: &SecureListener,
    ) -> Result<bool, ClientError> {
        self.typed("nvmf_subsystem_add_listener", params).await
    }

    /// One bdev by name or alias, `None` when SPDK says it does not exist.
    pub async fn bdev(&self, name: &str) -> Result<Option<Bdev>, ClientError> {
        match self
            .bdev_get_bdevs(&GetBdevs {
                name: Some(name.to_owned()),
                timeout: None,
            })
            .await
        {
            Ok(mut v) => Ok(v.pop()),
            Err(e) if e.is(super::ErrorKind::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One nvmf subsystem by NQN, `None` when absent. Looked up in the full
    /// list, since a missing subsystem is reported only as the ambiguous
    /// `-32602 "Invalid parameters"`.
    pub async fn subsystem(&self, nqn: &str) -> Result<Option<Subsystem>, ClientError> {
        let all = self.nvmf_get_subsystems(&GetSubsystems::default()).await?;
        Ok(all.into_iter().find(|s| s.nqn == nqn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A member is in service in its configured slot, by name or UUID, but
    /// never while a rebuild writes it.
    #[test]
    fn a_member_a_rebuild_writes_is_not_in_service() {
        let slot = |name: &str, uuid: &str, configured| RaidBaseBdev {
            name: Some(name.into()),
            uuid: Some(uuid.into()),
            is_configured: configured,
            data_offset: 0,
            data_size: 0,
        };
        let mut raid = RaidBdev {
            name: "vol-e-0".into(),
            uuid: None,
            state: "online".into(),
            raid_level: "raid1".into(),
            superblock: false,
            num_base_bdevs: 3,
            num_base_bdevs_discovered: 3,
            num_base_bdevs_operational: 3,
            base_bdevs_list: vec![
                slot("talon-d/r-a", "u-a", true),
                slot("r-bn1", "u-b", true),
                slot("r-cn1", "u-c", false),
            ],
            process: None,
        };
        let names = |v: &[&str]| v.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            raid.slot_in_service(&names(&["u-a"]))
                .and_then(|b| b.name.clone()),
            Some("talon-d/r-a".into())
        );
        assert_eq!(
            raid.slot_in_service(&names(&["r-bn1"]))
                .and_then(|b| b.name.clone()),
            Some("r-bn1".into())
        );
        assert_eq!(
            raid.slot_in_service(&names(&["r-cn1"]))
                .and_then(|b| b.name.clone()),
            None,
            "not configured"
        );
        raid.process = Some(RaidProcess {
            kind: "rebuild".into(),
            target: "r-bn1".into(),
            progress: RaidProgress {
                blocks: 0,
                percent: 10,
            },
        });
        assert_eq!(
            raid.slot_in_service(&names(&["r-bn1", "u-b"]))
                .and_then(|b| b.name.clone()),
            None,
            "written by a rebuild"
        );
        assert_eq!(
            raid.slot_in_service(&names(&["u-a"]))
                .and_then(|b| b.name.clone()),
            Some("talon-d/r-a".into())
        );
    }

    #[test]
    fn lvstore_figures_that_make_no_sense_are_refused_never_overflow() {
        let lvs = |total: u64, free: u64, cluster: u64| Lvstore {
            uuid: "u".into(),
            name: "talon-d1".into(),
            base_bdev: "talon-disk-d1".into(),
            total_data_clusters: total,
            free_clusters: free,
            block_size: 4096,
            cluster_size: cluster,
        };
        let mib = 1 << 20;
        assert_eq!(
            lvs(1024, 1000, mib).bytes(),
            Ok(LvstoreBytes {
                total: 1024 * mib,
                free: 1000 * mib,
                cluster: mib
            })
        );
        // seen: a disk pulled under its lvstore, free_clusters * cluster_size overflowed
        let e = lvs(u64::MAX, u64::MAX, mib)
            .bytes()
            .expect_err("2^84 bytes")
            .to_string();
        assert!(e.contains("talon-d1") && e.contains("2^64"), "{e}");
        assert!(
            lvs(10, 11, mib)
                .bytes()
                .expect_err("free > total")
                .to_string()
                .contains("11 free clusters of 10")
        );
        assert!(lvs(10, 1, 0).bytes().is_err(), "no cluster size");
        assert!(lvs(10, 1, 3 * mib).bytes().is_err(), "not a power of two");
        assert!(lvs(10, 1, 2048).bytes().is_err(), "smaller than a block");
        let inv = crate::spdk::inventory::Inventory {
            lvstores: vec![
                lvs(u64::MAX, u64::MAX, mib),
                Lvstore {
                    name: "talon-d2".into(),
                    ..lvs(1024, 512, mib)
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            inv.disks(),
            vec![("d2".to_string(), 512 * mib)],
            "d1 is never placed on"
        );
    }

    #[test]
    fn thin_lvol_params_match_spdk() {
        let p = LvolCreate::thin("lvs0", "lvol0", 16);
        assert_eq!(
            serde_json::to_value(&p).expect("json"),
            json!({"lvol_name":"lvol0","size_in_mib":16,"lvs_name":"lvs0","thin_provision":true})
        );
    }

    #[test]
    fn add_ns_with_id_sets_nguid_and_uuid() {
        let id = uuid::Uuid::parse_str("0b4c5f0e-6f2a-4d33-9c1e-3d2b5a7e9f10").expect("uuid");
        let p = AddNamespace::with_id("nqn.2016-06.io.spdk:replica0", "Raid1", id);
        assert_eq!(
            serde_json::to_value(&p).expect("json"),
            json!({"nqn":"nqn.2016-06.io.spdk:replica0","namespace":{"bdev_name":"Raid1",
                "uuid":"0b4c5f0e-6f2a-4d33-9c1e-3d2b5a7e9f10","nguid":"0B4C5F0E6F2A4D339C1E3D2B5A7E9F10"}})
        );
    }

    #[test]
    fn tcp_helpers_match_recorded_params() {
        let a = AttachController::tcp("Nvme0", [127, 0, 0, 1].into(), 4420, "nqn.2016-06.io.spdk:cnode1");
        assert_eq!(
            serde_json::to_value(&a).expect("json"),
            json!({"name":"Nvme0","trtype":"tcp","adrfam":"ipv4","traddr":"127.0.0.1","trsvcid":"4420",
                "subnqn":"nqn.2016-06.io.spdk:cnode1"})
        );
        let l = ListenAddress::tcp([127, 0, 0, 1].into(), 4420);
        assert_eq!(
            serde_json::to_value(&l).expect("json"),
            json!({"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"4420"})
        );
    }

    #[test]
    fn params_refuse_unknown_fields() {
        let r: Result<MallocCreate, _> =
            serde_json::from_value(json!({"name":"M","num_blocks":1,"block_size":4096,"no_such_param":1}));
        assert!(r.is_err());
    }
}
