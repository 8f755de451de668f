//! Disk operations of the V2 engine: a `Disk` as a base bdev (aio over a
//! file or block device, or an NVMe controller at a PCI address) with the
//! lvstore `talon-<disk>` on it. The disk controller maps `Disk`s to these
//! calls and their results to `DiskStatus`; every SPDK call is here.
//!
//! ```text
//!   DiskOps::ensure ─┬─ path: by what it is (stat): block device node, regular
//!                    │        file, or missing: a file created sparse with sizeBytes
//!                    │        (a missing node on devtmpfs is a missing device)
//!                    │        └─> bdev_aio_create "talon-disk-<d>"
//!                    ├─ pci: bdev_nvme_attach_controller "talon-disk-<d>" at its BDF
//!                    │        └─> bdev "talon-disk-<d>n1"
//!                    ├─ bdev_wait_for_examine ─> lvstore "talon-<d>" loaded?
//!                    │   yes: the UUID talon recorded (DiskIdentity)? ─> the lvstore
//!                    │        another UUID ─> refused (unless formatting)
//!                    │   no:  what the device holds, its first and last MiB
//!                    │        (path: read by talon; pci: NVMe Reads through
//!                    │        bdev_nvme_send_cmd), judged by disk_target::classify
//!                    │        ├─ talon once made an lvstore here ─> refused, whatever it reads
//!                    │        ├─ not blank (a signature, an lvstore that did not
//!                    │        │   load, non-zero data) ─> refused
//!                    │        └─ blank, or a format request ─> bdev_lvol_create_lvstore
//!                    │   fails ─> roll back the bdev/file made here
//!                    └─> the lvstore (sizes for DiskStatus), and whether it was created
//!   DiskOps::teardown: lvols left? ─yes─> Some("still holds lvols: ...")
//!                                   no ─> delete lvstore, delete base bdev
//!   DiskOps::remove_orphans: lvstore "talon-*" on a "talon-disk-*" bdev with no
//!            Disk and no lvols ─> removed; anything not named by talon is never touched.
//! ```
//!
//! A refusal names the device, what it holds, and the one command that
//! formats it anyway: `talon disk format <disk> --yes-destroy-data`. A disk
//! file is never deleted by talon (it may be the only copy of an lvstore);
//! removing the disk removes the lvstore from it and detaches it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::naming::{self, DISK_BDEV_PREFIX, LVS_PREFIX, pci_bdev};
use super::rpc::{
    AioCreate, AttachController, ByName, GetControllers, GetLvols, Lvstore, LvstoreCreate, LvstoreSelector,
    NvmeSendCmd,
};
use super::{ClientError, ErrorKind, SpdkClient};
use crate::host::HostRoot;
use crate::host::disk_target::{self, Content};
use crate::host::mounts::{fs_type_at, parse_mountinfo};
use crate::names::ObjectName;
use crate::resources::config::Disk;

/// Block size of a file disk's aio bdev.
pub const FILE_BLOCK_SIZE: u32 = 4096;

/// The metadata pages an lvstore talon makes keeps at least (SPDK's default,
/// one per cluster, when the disk has fewer clusters): room for ~2,000 lvols
/// and snapshots besides the extent pages of a full disk (one per 512
/// clusters).
pub const MIN_MD_PAGES: u64 = 2048;

/// The fewest metadata pages per 100 clusters an lvstore talon makes has.
pub const MIN_MD_PAGES_RATIO: u32 = 10;

/// Metadata pages per 100 clusters (`num_md_pages_per_cluster_ratio`) for a
/// new lvstore on `device_bytes` with `cluster_bytes` clusters: SPDK's default
/// (100, a page per cluster) up to [`MIN_MD_PAGES`] clusters, then fewer, down
/// to [`MIN_MD_PAGES_RATIO`]. After an unclean stop (kill -9, a crash, power)
/// spdk_tgt replays every metadata page one read at a time before any lvol is
/// listed (blobstore.c `bs_load_replay_md`), so the load takes time in
/// proportion to this count: a 3.7 GiB disk (3,712 pages) loaded in 7.1 s on
/// a busy 2-core machine, 1.5 s with a tenth of them, 1.1 s after a clean
/// stop (spdk_tgt v26.05, aio over a loop device; docs/sizing.md). An unknown
/// size (0) keeps SPDK's default.
pub fn md_pages_ratio(device_bytes: u64, cluster_bytes: u64) -> u32 {
    let clusters = device_bytes.checked_div(cluster_bytes).unwrap_or(0);
    if clusters <= MIN_MD_PAGES {
        return 100;
    }
    let ratio = (100 * MIN_MD_PAGES).div_ceil(clusters);
    u32::try_from(ratio).unwrap_or(100).clamp(MIN_MD_PAGES_RATIO, 100)
}

/// Why a disk could not be brought up or removed.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The disk's name is not a valid object name.
    #[error("Disk {disk:?} has an invalid name")]
    InvalidName {
        /// The disk.
        disk: String,
        /// Why.
        #[source]
        source: crate::names::InvalidName,
    },
    /// Neither `path` nor `pci` is set, or both are.
    #[error("Disk {disk} needs exactly one of `path` and `pci`")]
    Backing {
        /// The disk.
        disk: String,
    },
    /// A file disk is missing and has no `sizeBytes` to create it with.
    #[error("Disk {disk}: file {path} does not exist and no sizeBytes is given to create it")]
    MissingFile {
        /// The disk.
        disk: String,
        /// The file.
        path: PathBuf,
    },
    /// A block device disk does not exist.
    #[error("Disk {disk}: block device {path} does not exist")]
    MissingBlockDevice {
        /// The disk.
        disk: String,
        /// The device.
        path: PathBuf,
    },
    /// The path is neither a regular file nor a block device.
    #[error("Disk {disk}: {path} is neither a regular file nor a block device ({kind})")]
    NotFileOrBlockDevice {
        /// The disk.
        disk: String,
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: String,
    },
    /// The path could not be looked at.
    #[error("Disk {disk}: cannot stat {path}")]
    Stat {
        /// The disk.
        disk: String,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The sparse file could not be created.
    #[error("Disk {disk}: creating the sparse file {path} failed")]
    CreateFile {
        /// The disk.
        disk: String,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// `pci` names no NVMe device of this host (by PCI address, serial or model).
    #[error("Disk {disk}: pci {pci:?} does not resolve to an NVMe device")]
    Pci {
        /// The disk.
        disk: String,
        /// The value.
        pci: String,
        /// Why.
        #[source]
        source: Box<crate::host::pci::PciError>,
    },
    /// The lvstore exists on another bdev than the disk's.
    #[error("Disk {disk}: lvstore {lvstore} exists on bdev {found}, not on {expected}")]
    LvstoreElsewhere {
        /// The disk.
        disk: String,
        /// The lvstore.
        lvstore: String,
        /// Its bdev.
        found: String,
        /// The disk's bdev.
        expected: String,
    },
    /// A created lvstore is not listed.
    #[error("Disk {disk}: lvstore {lvstore} was created but is not listed")]
    LvstoreVanished {
        /// The disk.
        disk: String,
        /// The lvstore.
        lvstore: String,
    },
    /// No lvstore of the disk loaded, and the device holds something an
    /// lvstore would overwrite: data, a signature, or an lvstore SPDK did
    /// not load as this disk's.
    #[error(
        "Disk {disk}: {device} holds {what}, and no lvstore {lvstore} loaded from it; talon makes an lvstore only over a blank device (zeros at both ends), and wrote nothing. If what it holds is not needed: `talon disk format {disk} --yes-destroy-data`",
        what = refused_content(*.found)
    )]
    NotBlank {
        /// The disk.
        disk: String,
        /// The device (a path, or `NVMe <bdf> (bdev ...)`).
        device: String,
        /// The lvstore looked for.
        lvstore: String,
        /// What the device holds.
        found: Content,
    },
    /// The lvstore talon made (or first found) on the disk did not load.
    #[error(
        "Disk {disk}: lvstore {lvstore} (uuid {expected}), which talon recorded on {device}, did not load; the device holds {what}. talon never makes a new lvstore over it (every replica on it would be lost) and wrote nothing. Find why it did not load (spdk_tgt's log); if its data is lost for good: `talon disk format {disk} --yes-destroy-data`",
        what = refused_content(*.found)
    )]
    LvstoreNotLoaded {
        /// The disk.
        disk: String,
        /// The device.
        device: String,
        /// The lvstore.
        lvstore: String,
        /// The UUID recorded.
        expected: String,
        /// What the device holds now.
        found: Content,
    },
    /// The lvstore loaded has another UUID than the one talon recorded.
    #[error(
        "Disk {disk}: lvstore {lvstore} loaded from {device} has uuid {found}, not {expected} which talon recorded on this disk (another device at this address or path?); not used. If that lvstore is to be replaced: `talon disk format {disk} --yes-destroy-data`"
    )]
    LvstoreReplaced {
        /// The disk.
        disk: String,
        /// The device.
        device: String,
        /// The lvstore.
        lvstore: String,
        /// The UUID recorded.
        expected: String,
        /// The UUID loaded.
        found: String,
    },
    /// What the device holds could not be read; nothing is made over it.
    #[error("Disk {disk}: cannot read {device} to check that it is blank; nothing was written")]
    ReadDevice {
        /// The disk.
        disk: String,
        /// The device.
        device: String,
        /// Why (boxed: a rare error that would make every DiskError large).
        #[source]
        source: Box<ReadError>,
    },
    /// An SPDK call failed.
    #[error("Disk {disk}: {op} failed")]
    Rpc {
        /// The disk (or lvstore/bdev for orphans).
        disk: String,
        /// The operation (`bdev_aio_create talon-disk-a`, ...).
        op: String,
        /// The error.
        #[source]
        source: ClientError,
    },
}

/// Why the ends of a device could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A path could not be read.
    #[error(transparent)]
    Path(#[from] disk_target::DiskTargetError),
    /// An SPDK call failed.
    #[error("{op} failed")]
    Rpc {
        /// The call.
        op: String,
        /// The error.
        #[source]
        source: ClientError,
    },
    /// An NVMe Read completed with an error status.
    #[error(
        "the NVMe Read of {blocks} blocks at LBA {lba} completed with status type {sct:#x}, code {sc:#04x}"
    )]
    Status {
        /// Its first block.
        lba: u64,
        /// How many blocks.
        blocks: u64,
        /// Status code type.
        sct: u8,
        /// Status code.
        sc: u8,
    },
    /// SPDK's answer was not what `bdev_nvme_send_cmd` answers.
    #[error("the answer to an NVMe Read is malformed: {0}")]
    Reply(String),
}

/// What a device holds, said in a refusal (an lvstore there is one that did
/// not load as this disk's).
fn refused_content(c: Content) -> String {
    match c {
        Content::Lvstore => {
            "an lvstore superblock (SPDKBLOB at offset 0) that did not load as this disk's".into()
        }
        Content::Absent => "nothing (it does not exist)".into(),
        c => c.to_string(),
    }
}

fn rpc(disk: &str, op: impl Into<String>) -> impl FnOnce(ClientError) -> DiskError {
    let (disk, op) = (disk.to_owned(), op.into());
    move |source| DiskError::Rpc { disk, op, source }
}

/// Whether `s` is a PCI address `dddd:bb:dd.f` (hex).
pub fn is_bdf(s: &str) -> bool {
    let hex = |p: &str, n: usize| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit());
    let mut it = s.split(':');
    let (Some(d), Some(b), Some(df), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return false;
    };
    let Some((dev, f)) = df.split_once('.') else {
        return false;
    };
    hex(d, 4) && hex(b, 2) && hex(dev, 2) && f.len() == 1 && matches!(f.as_bytes()[0], b'0'..=b'7')
}

/// Names talon uses for one disk.
#[derive(Debug, Clone)]
pub struct DiskNames {
    /// The disk.
    pub disk: String,
    /// The aio bdev, or the NVMe controller name.
    pub base: String,
    /// The bdev the lvstore sits on.
    pub bdev: String,
    /// `talon-<disk>`.
    pub lvstore: String,
}

impl DiskNames {
    /// The names of disk `id`, its name validated.
    pub fn of(id: &str, spec: &Disk) -> Result<DiskNames, DiskError> {
        names(id, spec)
    }

    /// Only the disk's name (its name is invalid: nothing else can be named).
    pub fn fallback(id: &str) -> DiskNames {
        DiskNames {
            disk: id.to_owned(),
            base: String::new(),
            bdev: String::new(),
            lvstore: String::new(),
        }
    }
}

fn names(id: &str, spec: &Disk) -> Result<DiskNames, DiskError> {
    let name = ObjectName::parse("disk", id).map_err(|source| DiskError::InvalidName {
        disk: id.to_owned(),
        source,
    })?;
    let base = naming::disk_base(name.as_str());
    let bdev = if spec.pci.is_some() {
        pci_bdev(&base)
    } else {
        base.clone()
    };
    Ok(DiskNames {
        disk: name.to_string(),
        base,
        bdev,
        lvstore: naming::lvstore(name.as_str()),
    })
}

/// A disk brought up by [`DiskOps::ensure`].
#[derive(Debug, Clone)]
pub struct Ensured {
    /// Its lvstore.
    pub lvstore: Lvstore,
    /// Whether this call created it (else it loaded).
    pub created: bool,
    /// The device, as refusals name it.
    pub device: String,
}

/// The device of a disk as messages name it: its path, or `NVMe <bdf>
/// (bdev <bdev>)`.
pub fn device_name(n: &DiskNames, spec: &Disk) -> String {
    match (&spec.path, &spec.pci) {
        (Some(p), _) => p.clone(),
        (None, Some(pci)) => format!("NVMe {pci} (bdev {})", n.bdev),
        (None, None) => n.bdev.clone(),
    }
}

/// The NVMe Read command's opcode.
const NVME_OPC_READ: u8 = 0x02;

/// Bytes per NVMe Read passed through SPDK: below any controller's maximum
/// transfer (MDTS is at least one 4 KiB page, and in practice 128 KiB and
/// more; a larger transfer is not refused by the RPC: over NVMe/TCP a 1 MiB
/// one reset the controller), and small enough to pipeline.
pub const NVME_READ_BYTES: u64 = 32 << 10;

/// How many Reads are in flight at once.
const NVME_READS_IN_FLIGHT: usize = 8;

/// SPDK's base64 for NVMe passthrough: the URL-safe alphabet, padded
/// (`spdk_base64_urlsafe_encode`); padding is accepted either way.
const NVME_B64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// The submission queue entry of an NVMe Read of `blocks` (1..=65536)
/// blocks at `lba` of namespace `nsid`: opcode in byte 0, NSID in bytes
/// 4-7, the starting LBA in CDW10-11 (bytes 40-47), the 0-based block count
/// in CDW12 bits 0-15 (bytes 48-49). SPDK fills the command id and the data
/// pointer.
pub fn nvme_read_sqe(nsid: u32, lba: u64, blocks: u16) -> [u8; 64] {
    let mut sqe = [0u8; 64];
    sqe[0] = NVME_OPC_READ;
    sqe[4..8].copy_from_slice(&nsid.to_le_bytes());
    sqe[40..48].copy_from_slice(&lba.to_le_bytes());
    sqe[48..50].copy_from_slice(&blocks.saturating_sub(1).to_le_bytes());
    sqe
}

/// The status of an NVMe completion queue entry (16 bytes; the status
/// field in bytes 14-15 above the phase bit): `(sct, sc)`, `(0, 0)` for
/// success; `None` when it is not 16 bytes.
pub fn nvme_cpl_status(cpl: &[u8]) -> Option<(u8, u8)> {
    let raw: [u8; 16] = cpl.try_into().ok()?;
    let status = u16::from_le_bytes([raw[14], raw[15]]) >> 1;
    Some((((status >> 8) & 0x7) as u8, (status & 0xff) as u8))
}

/// NVMe Reads of one namespace through `bdev_nvme_send_cmd`.
struct NvmeReader<'a> {
    client: &'a SpdkClient,
    ctrlr: &'a str,
    nsid: u32,
    block_size: u64,
    md_size: u32,
}

impl NvmeReader<'_> {
    /// `blocks` blocks from `lba`, in order.
    async fn range(&self, lba: u64, blocks: u64) -> Result<Vec<u8>, ReadError> {
        use futures::StreamExt;
        let per = (NVME_READ_BYTES / self.block_size).clamp(1, 1 << 16);
        let reads = (0..blocks.div_ceil(per)).map(|i| {
            let at = lba + i * per;
            self.one(at, per.min(lba + blocks - at))
        });
        let mut out = Vec::new();
        let mut s = futures::stream::iter(reads).buffered(NVME_READS_IN_FLIGHT);
        while let Some(r) = s.next().await {
            out.extend_from_slice(&r?);
        }
        Ok(out)
    }

    async fn one(&self, lba: u64, blocks: u64) -> Result<Vec<u8>, ReadError> {
        use base64::Engine;
        let n = u16::try_from(blocks).unwrap_or(u16::MAX);
        let data_len = u64::from(n) * self.block_size;
        let params = NvmeSendCmd {
            name: self.ctrlr.to_owned(),
            cmd_type: "io".into(),
            data_direction: "c2h".into(),
            cmdbuf: NVME_B64.encode(nvme_read_sqe(self.nsid, lba, n)),
            data_len: Some(u32::try_from(data_len).unwrap_or(u32::MAX)),
            metadata_len: (self.md_size > 0).then(|| u32::from(n) * self.md_size),
            timeout_ms: None,
        };
        let r = self
            .client
            .bdev_nvme_send_cmd(&params)
            .await
            .map_err(|source| ReadError::Rpc {
                op: format!("bdev_nvme_send_cmd {} (Read of LBA {lba})", self.ctrlr),
                source,
            })?;
        let cpl = NVME_B64
            .decode(&r.cpl)
            .map_err(|e| ReadError::Reply(format!("cpl {:?}: {e}", r.cpl)))?;
        match nvme_cpl_status(&cpl) {
            Some((0, 0)) => {}
            Some((sct, sc)) => {
                return Err(ReadError::Status {
                    lba,
                    blocks: u64::from(n),
                    sct,
                    sc,
                });
            }
            None => return Err(ReadError::Reply(format!("cpl of {} bytes, not 16", cpl.len()))),
        }
        let data = NVME_B64
            .decode(r.data.as_deref().unwrap_or_default())
            .map_err(|e| ReadError::Reply(format!("data: {e}")))?;
        if data.len() as u64 != data_len {
            return Err(ReadError::Reply(format!(
                "{} bytes of data for a Read of {data_len}",
                data.len()
            )));
        }
        Ok(data)
    }
}

/// What a reconcile created (rolled back when a later step fails).
#[derive(Debug, Default)]
struct Created {
    bdev: bool,
    file: Option<PathBuf>,
}

/// The SPDK side of disks: every RPC the disk controller needs.
#[derive(Debug)]
pub struct DiskOps {
    client: SpdkClient,
    host: HostRoot,
}

impl DiskOps {
    /// Disks of the target behind `client`; NVMe serials are resolved
    /// through `host`'s sysfs.
    pub fn new(client: SpdkClient, host: HostRoot) -> Self {
        DiskOps { client, host }
    }

    async fn lvstore(&self, disk: &str, name: &str) -> Result<Option<Lvstore>, DiskError> {
        match self
            .client
            .bdev_lvol_get_lvstores(&LvstoreSelector::name(name))
            .await
        {
            Ok(mut v) => Ok(v.pop()),
            Err(e) if e.is(ErrorKind::NotFound) => Ok(None),
            Err(e) => Err(rpc(disk, format!("bdev_lvol_get_lvstores {name}"))(e)),
        }
    }

    async fn lvol_names(&self, disk: &str, lvs: &Lvstore) -> Result<Vec<String>, DiskError> {
        let lvols = self
            .client
            .bdev_lvol_get_lvols(&GetLvols {
                lvs_uuid: Some(lvs.uuid.clone()),
                lvs_name: None,
            })
            .await
            .map_err(rpc(disk, format!("bdev_lvol_get_lvols {}", lvs.name)))?;
        Ok(lvols.into_iter().map(|l| l.name).collect())
    }

    /// Whether the disk's base bdev is in the target now (when it is not,
    /// [`Self::ensure`] attaches it and SPDK's examine loads its lvstore).
    pub async fn base_present(&self, n: &DiskNames) -> Result<bool, DiskError> {
        Ok(self
            .client
            .bdev(&n.bdev)
            .await
            .map_err(rpc(&n.disk, format!("bdev_get_bdevs {}", n.bdev)))?
            .is_some())
    }

    /// Attaches the base bdev if it is not there; records what it made.
    async fn ensure_base(&self, n: &DiskNames, spec: &Disk, created: &mut Created) -> Result<(), DiskError> {
        if self.base_present(n).await? {
            return Ok(());
        }
        match (&spec.path, &spec.pci) {
            (Some(path), None) => {
                let path = PathBuf::from(path);
                let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok();
                let is_file = match backing_of(&n.disk, &path, mountinfo.as_deref())? {
                    Backing::BlockDevice => false,
                    Backing::File => true,
                    Backing::NewFile => {
                        let Some(size) = spec.size_bytes else {
                            return Err(DiskError::MissingFile {
                                disk: n.disk.clone(),
                                path,
                            });
                        };
                        create_sparse(&path, size).map_err(|source| DiskError::CreateFile {
                            disk: n.disk.clone(),
                            path: path.clone(),
                            source,
                        })?;
                        created.file = Some(path.clone());
                        true
                    }
                };
                // the block size asked for (Longhorn's DiskCreate gives 512), else SPDK
                // detects a block device's, not a regular file's ("Block size could not
                // be auto-detected"); v26.05 refuses one below the device's own (-22)
                let params = AioCreate {
                    filename: path.display().to_string(),
                    name: n.base.clone(),
                    block_size: spec.block_size.or(is_file.then_some(FILE_BLOCK_SIZE)),
                    readonly: false,
                    fallocate: false,
                };
                match self.client.bdev_aio_create(&params).await {
                    Ok(_) => created.bdev = true,
                    Err(e) if e.is(ErrorKind::AlreadyExists) => {}
                    Err(e) => {
                        let what = match spec.block_size {
                            Some(b) => format!("bdev_aio_create {} with block size {b}", n.base),
                            None => format!("bdev_aio_create {}", n.base),
                        };
                        return Err(rpc(&n.disk, what)(e));
                    }
                }
            }
            (None, Some(pci)) => {
                // a PCI address as given (SPDK reports a missing one); a serial
                // or model resolved through the host's sysfs
                let pci = if is_bdf(pci) {
                    pci.clone()
                } else {
                    crate::host::pci::select(&self.host, pci)
                        .map_err(|source| DiskError::Pci {
                            disk: n.disk.clone(),
                            pci: pci.clone(),
                            source: Box::new(source),
                        })?
                        .bdf
                        .as_str()
                        .to_owned()
                };
                let params = AttachController::pcie(n.base.clone(), pci.clone());
                self.client
                    .bdev_nvme_attach_controller(&params)
                    .await
                    .map_err(rpc(
                        &n.disk,
                        format!("bdev_nvme_attach_controller {} {pci}", n.base),
                    ))?;
                created.bdev = true;
            }
            _ => {
                return Err(DiskError::Backing { disk: n.disk.clone() });
            }
        }
        Ok(())
    }

    /// Deletes the base bdev (aio bdev or NVMe controller); absent is fine.
    async fn delete_base(&self, disk: &str, base: &str, pci: bool) -> Result<(), DiskError> {
        let r = if pci {
            self.client.bdev_nvme_detach_controller(&ByName::new(base)).await
        } else {
            self.client.bdev_aio_delete(&ByName::new(base)).await
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
            Err(e) => Err(rpc(disk, format!("deleting bdev {base}"))(e)),
        }
    }

    async fn rollback(&self, n: &DiskNames, spec: &Disk, created: Created) {
        if created.bdev
            && let Err(e) = self.delete_base(&n.disk, &n.base, spec.pci.is_some()).await
        {
            tracing::warn!(disk = %n.disk, error = %e, "rollback: cannot delete the base bdev");
        }
        if let Some(f) = created.file
            && let Err(e) = std::fs::remove_file(&f)
        {
            tracing::warn!(disk = %n.disk, file = %f.display(), error = %e, "rollback: cannot remove the file");
        }
    }

    /// Base bdev and lvstore up (imported or created); rolls back on failure.
    /// `recorded` is the lvstore UUID talon recorded on this disk
    /// (`DiskIdentity`): only that one is taken, and none is created while
    /// it does not load. `format` (a format request not yet served) makes
    /// the lvstore over whatever the device holds, replacing one of another
    /// UUID.
    pub async fn ensure(
        &self,
        n: &DiskNames,
        spec: &Disk,
        recorded: Option<&str>,
        format: bool,
    ) -> Result<Ensured, DiskError> {
        let mut created = Created::default();
        match self.ensure_inner(n, spec, recorded, format, &mut created).await {
            Ok(l) => Ok(l),
            Err(e) => {
                self.rollback(n, spec, created).await;
                Err(e)
            }
        }
    }

    async fn ensure_inner(
        &self,
        n: &DiskNames,
        spec: &Disk,
        recorded: Option<&str>,
        format: bool,
        created: &mut Created,
    ) -> Result<Ensured, DiskError> {
        self.ensure_base(n, spec, created).await?;
        let device = device_name(n, spec);
        // an lvstore on the bdev is imported by examine: wait for it, then look
        self.client
            .bdev_wait_for_examine()
            .await
            .map_err(rpc(&n.disk, "bdev_wait_for_examine"))?;
        if let Some(l) = self.lvstore(&n.disk, &n.lvstore).await? {
            if l.base_bdev != n.bdev {
                return Err(DiskError::LvstoreElsewhere {
                    disk: n.disk.clone(),
                    lvstore: n.lvstore.clone(),
                    found: l.base_bdev,
                    expected: n.bdev.clone(),
                });
            }
            match recorded {
                Some(u) if u != l.uuid && !format => {
                    return Err(DiskError::LvstoreReplaced {
                        disk: n.disk.clone(),
                        device,
                        lvstore: n.lvstore.clone(),
                        expected: u.to_owned(),
                        found: l.uuid,
                    });
                }
                // formatting: replaced below
                Some(u) if u != l.uuid => {}
                _ => {
                    return Ok(Ensured {
                        lvstore: l,
                        created: false,
                        device,
                    });
                }
            }
        }
        if format {
            // asked for by name (`talon disk format`): any lvstore loaded from
            // the device goes, then a new one is made over what it holds
            let on_it = self
                .client
                .bdev_lvol_get_lvstores(&LvstoreSelector::default())
                .await
                .map_err(rpc(&n.disk, "bdev_lvol_get_lvstores"))?
                .into_iter()
                .filter(|l| l.base_bdev == n.bdev);
            for l in on_it {
                tracing::warn!(disk = %n.disk, lvstore = %l.name, uuid = %l.uuid, "format: deleting the lvstore loaded from the device");
                self.client
                    .bdev_lvol_delete_lvstore(&LvstoreSelector {
                        uuid: Some(l.uuid.clone()),
                        lvs_name: None,
                    })
                    .await
                    .map_err(rpc(&n.disk, format!("bdev_lvol_delete_lvstore {}", l.name)))?;
            }
            tracing::warn!(disk = %n.disk, %device, "format: making a new lvstore over what the device holds, as asked");
        } else {
            // the last look before an lvstore overwrites the device: where talon
            // made one, never again; elsewhere only over zeros (an lvstore that
            // did not load, e.g. while the target shuts down, or another node's,
            // is never overwritten)
            let found = self
                .content(n, spec)
                .await
                .map_err(|source| DiskError::ReadDevice {
                    disk: n.disk.clone(),
                    device: device.clone(),
                    source: Box::new(source),
                })?;
            if let Some(u) = recorded {
                return Err(DiskError::LvstoreNotLoaded {
                    disk: n.disk.clone(),
                    device,
                    lvstore: n.lvstore.clone(),
                    expected: u.to_owned(),
                    found,
                });
            }
            if !found.is_blank() {
                return Err(DiskError::NotBlank {
                    disk: n.disk.clone(),
                    device,
                    lvstore: n.lvstore.clone(),
                    found,
                });
            }
        }
        let cluster_bytes = spec.cluster_mib.max(1).saturating_mul(1 << 20);
        let device_bytes = self
            .client
            .bdev(&n.bdev)
            .await
            .map_err(rpc(&n.disk, format!("bdev_get_bdevs {}", n.bdev)))?
            .map(|b| b.num_blocks.saturating_mul(u64::from(b.block_size)))
            .unwrap_or(0);
        let params = LvstoreCreate {
            bdev_name: n.bdev.clone(),
            lvs_name: n.lvstore.clone(),
            cluster_sz: Some(cluster_bytes),
            clear_method: None,
            num_md_pages_per_cluster_ratio: Some(md_pages_ratio(device_bytes, u64::from(cluster_bytes))),
        };
        self.client.bdev_lvol_create_lvstore(&params).await.map_err(rpc(
            &n.disk,
            format!("bdev_lvol_create_lvstore {} on {}", n.lvstore, n.bdev),
        ))?;
        let l = self
            .lvstore(&n.disk, &n.lvstore)
            .await?
            .ok_or_else(|| DiskError::LvstoreVanished {
                disk: n.disk.clone(),
                lvstore: n.lvstore.clone(),
            })?;
        tracing::info!(disk = %n.disk, lvstore = %n.lvstore, uuid = %l.uuid, %device, "lvstore created");
        Ok(Ensured {
            lvstore: l,
            created: true,
            device,
        })
    }

    /// What the device of a disk holds at its ends: a path read by talon,
    /// an NVMe namespace read through SPDK.
    async fn content(&self, n: &DiskNames, spec: &Disk) -> Result<Content, ReadError> {
        match &spec.path {
            Some(path) => {
                let (path, shown) = (PathBuf::from(path), PathBuf::from(path));
                tokio::task::spawn_blocking(move || disk_target::inspect(&path))
                    .await
                    .unwrap_or_else(|e| {
                        Err(disk_target::DiskTargetError::Inspect {
                            path: shown,
                            source: std::io::Error::other(e),
                        })
                    })
                    .map_err(ReadError::Path)
            }
            None => self.read_nvme_ends(&n.base, &n.bdev).await,
        }
    }

    /// What NVMe bdev `bdev` of controller `ctrlr` holds in its first and
    /// last MiB ([`disk_target::classify`]), read with NVMe Read commands
    /// passed through SPDK (`bdev_nvme_send_cmd`): a device bound to a
    /// user-space driver has no other reader. Read in [`NVME_READ_BYTES`]
    /// pieces, below any controller's MDTS.
    pub async fn read_nvme_ends(&self, ctrlr: &str, bdev: &str) -> Result<Content, ReadError> {
        let b = self
            .client
            .bdev(bdev)
            .await
            .map_err(|source| ReadError::Rpc {
                op: format!("bdev_get_bdevs {bdev}"),
                source,
            })?
            .ok_or_else(|| ReadError::Reply(format!("bdev {bdev} is not listed")))?;
        let bs = u64::from(b.block_size);
        if bs == 0 {
            return Err(ReadError::Reply(format!("bdev {bdev} has block size 0")));
        }
        let nsid = b
            .driver_specific
            .pointer("/nvme/0/ns_data/id")
            .and_then(serde_json::Value::as_u64)
            .and_then(|i| u32::try_from(i).ok())
            .unwrap_or(1);
        let md = if b.md_interleave { 0 } else { b.md_size };
        let blocks = b.num_blocks;
        let edge = disk_target::EDGE.div_ceil(bs);
        let head_blocks = blocks.min(edge);
        let tail_lba = blocks.saturating_sub(edge).max(head_blocks);
        let read = NvmeReader {
            client: &self.client,
            ctrlr,
            nsid,
            block_size: bs,
            md_size: md,
        };
        let head = read.range(0, head_blocks).await?;
        let tail = read.range(tail_lba, blocks - tail_lba).await?;
        Ok(disk_target::classify(&head, &tail, tail_lba * bs))
    }

    /// Tears a disk down; `Ok(Some(msg))` when lvols still hold it.
    pub async fn teardown(&self, n: &DiskNames, spec: &Disk) -> Result<Option<String>, DiskError> {
        // attach the base again (after a restart) so its lvstore and lvols are seen
        let mut created = Created::default();
        let base_ok = self.ensure_base(n, spec, &mut created).await;
        if base_ok.is_ok() {
            self.client
                .bdev_wait_for_examine()
                .await
                .map_err(rpc(&n.disk, "bdev_wait_for_examine"))?;
        }
        if let Some(l) = self.lvstore(&n.disk, &n.lvstore).await? {
            let lvols = self.lvol_names(&n.disk, &l).await?;
            if !lvols.is_empty() {
                return Ok(Some(format!(
                    "disk {} still holds lvols of talon in lvstore {}: {}; delete their volumes first",
                    n.disk,
                    n.lvstore,
                    lvols.join(", ")
                )));
            }
            self.client
                .bdev_lvol_delete_lvstore(&LvstoreSelector::name(&n.lvstore))
                .await
                .map_err(rpc(&n.disk, format!("bdev_lvol_delete_lvstore {}", n.lvstore)))?;
        }
        self.delete_base(&n.disk, &n.base, spec.pci.is_some()).await?;
        Ok(None)
    }

    /// Removes talon-owned lvstores and base bdevs that no Disk names:
    /// only empty lvstores on `talon-disk-*` bdevs; foreign objects stay.
    pub async fn remove_orphans(&self, wanted: &BTreeSet<String>) -> Result<(), DiskError> {
        let all = self
            .client
            .bdev_lvol_get_lvstores(&LvstoreSelector::default())
            .await
            .map_err(rpc("-", "bdev_lvol_get_lvstores"))?;
        let mut claimed_bases = BTreeSet::new();
        for l in all {
            claimed_bases.insert(l.base_bdev.clone());
            let Some(disk) = l.name.strip_prefix(LVS_PREFIX) else {
                continue;
            };
            if wanted.contains(disk) || !l.base_bdev.starts_with(DISK_BDEV_PREFIX) {
                continue;
            }
            let lvols = self.lvol_names(disk, &l).await?;
            if !lvols.is_empty() {
                tracing::warn!(lvstore = %l.name, ?lvols, "orphan lvstore still holds lvols; left alone");
                continue;
            }
            tracing::info!(lvstore = %l.name, bdev = %l.base_bdev, "removing orphan lvstore");
            self.client
                .bdev_lvol_delete_lvstore(&LvstoreSelector::name(&l.name))
                .await
                .map_err(rpc(disk, format!("bdev_lvol_delete_lvstore {}", l.name)))?;
            claimed_bases.remove(&l.base_bdev);
        }
        // orphan base bdevs: aio bdevs and NVMe controllers named talon-disk-<d>, no Disk, no lvstore
        let bdevs = self
            .client
            .bdev_get_bdevs(&Default::default())
            .await
            .map_err(rpc("-", "bdev_get_bdevs"))?;
        for b in bdevs {
            let Some(disk) = b.name.strip_prefix(DISK_BDEV_PREFIX) else {
                continue;
            };
            if b.product_name != "AIO disk"
                || wanted.contains(disk)
                || claimed_bases.contains(&b.name)
                || b.claimed
            {
                continue;
            }
            tracing::info!(bdev = %b.name, "removing orphan aio bdev");
            self.delete_base(disk, &b.name, false).await?;
        }
        let ctrlrs = self
            .client
            .bdev_nvme_get_controllers(&GetControllers::default())
            .await
            .map_err(rpc("-", "bdev_nvme_get_controllers"))?;
        for c in ctrlrs {
            let Some(disk) = c.name.strip_prefix(DISK_BDEV_PREFIX) else {
                continue;
            };
            if wanted.contains(disk) || claimed_bases.contains(&pci_bdev(&c.name)) {
                continue;
            }
            tracing::info!(controller = %c.name, "removing orphan NVMe controller");
            self.delete_base(disk, &c.name, true).await?;
        }
        Ok(())
    }
}

/// What a disk `path` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// A block device node.
    BlockDevice,
    /// A regular file that exists.
    File,
    /// Nothing yet, on a filesystem where a file can be made (anywhere but
    /// devtmpfs: /dev/shm, /var/lib/..., a tmpfs or a disk).
    NewFile,
}

/// Decides file vs block device by what `path` is: a block device node is a
/// block device, a regular file a file; a missing path is a file to create
/// unless it would be on devtmpfs (the /dev of device nodes, where a missing
/// node is a device that is not there). `mountinfo` is this process's
/// `/proc/self/mountinfo`: the decision is made in the mount namespace in
/// which talon creates the file.
fn backing_of(disk: &str, path: &Path, mountinfo: Option<&str>) -> Result<Backing, DiskError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => Ok(Backing::BlockDevice),
        Ok(m) if m.is_file() => Ok(Backing::File),
        Ok(m) => Err(DiskError::NotFileOrBlockDevice {
            disk: disk.to_owned(),
            path: path.to_path_buf(),
            kind: format!("{:?}", m.file_type()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // the nearest directory that exists says which filesystem it would be on
            let dir = path
                .ancestors()
                .skip(1)
                .find(|a| a.is_dir())
                .and_then(|a| a.canonicalize().ok());
            let on_devtmpfs = match (dir, mountinfo) {
                (Some(dir), Some(mi)) => {
                    fs_type_at(&parse_mountinfo(mi), &dir).is_some_and(|t| t == "devtmpfs")
                }
                // no mountinfo: /dev itself holds device nodes
                (Some(dir), None) => dir == Path::new("/dev"),
                (None, _) => false,
            };
            if on_devtmpfs {
                Err(DiskError::MissingBlockDevice {
                    disk: disk.to_owned(),
                    path: path.to_path_buf(),
                })
            } else {
                Ok(Backing::NewFile)
            }
        }
        Err(source) => Err(DiskError::Stat {
            disk: disk.to_owned(),
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn create_sparse(path: &Path, size: u64) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // a disk file holds every replica on it: private to root
    let f = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().write(true).create_new(true),
        0o600,
    )
    .open(path)?;
    f.set_len(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md_pages_fewer_on_big_disks_never_below_the_floor() {
        const MIB: u64 = 1 << 20;
        // small disks keep a page per cluster (SPDK's default)
        assert_eq!(md_pages_ratio(1024 * MIB, MIB), 100);
        assert_eq!(md_pages_ratio(2048 * MIB, MIB), 100);
        // the scale bench's N=50 disk: 3,712 clusters, >= 2,048 pages kept
        let r = md_pages_ratio(3712 * MIB, MIB);
        assert_eq!(r, 56);
        assert!(3712 * u64::from(r) / 100 >= MIN_MD_PAGES);
        // 1 TiB: a page per 10 clusters, not a million pages to replay
        assert_eq!(md_pages_ratio(1 << 40, MIB), MIN_MD_PAGES_RATIO);
        // a size not known keeps the default
        assert_eq!(md_pages_ratio(0, MIB), 100);
        assert_eq!(md_pages_ratio(1 << 30, 0), 100);
    }

    #[test]
    fn bdf_format() {
        assert!(is_bdf("0000:00:04.0"));
        assert!(is_bdf("0000:af:1f.7"));
        assert!(!is_bdf("0000:00:04"));
        assert!(!is_bdf("S4EVNF0M123456"));
        assert!(!is_bdf("0000:00:04.8"));
    }

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
24 22 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=1k
25 24 0:22 / /dev/shm rw,nosuid - tmpfs tmpfs rw
26 22 0:23 / /var/lib/my\\040disks rw - xfs /dev/sdb rw
27 24 0:24 / /dev/pts rw - devpts devpts rw
";

    #[test]
    fn the_deepest_mount_names_the_filesystem() {
        let at = |p: &str| fs_type_at(&parse_mountinfo(MOUNTINFO), Path::new(p));
        assert_eq!(at("/dev").as_deref(), Some("devtmpfs"));
        assert_eq!(at("/dev/disk/by-id").as_deref(), Some("devtmpfs"));
        assert_eq!(at("/dev/shm").as_deref(), Some("tmpfs"));
        assert_eq!(at("/dev/shmx").as_deref(), Some("devtmpfs"));
        assert_eq!(at("/var/lib/my disks/a").as_deref(), Some("xfs"));
        assert_eq!(at("/var/lib").as_deref(), Some("ext4"));
        // a second mount on the same point is the one on top
        let over = format!("{MOUNTINFO}30 25 0:40 / /dev/shm rw - ramfs none rw\n");
        assert_eq!(
            fs_type_at(&parse_mountinfo(&over), Path::new("/dev/shm/x")).as_deref(),
            Some("ramfs")
        );
    }

    #[test]
    fn file_or_block_device_by_what_the_path_is() {
        let d = tempfile::tempdir().expect("tempdir");
        let here = d.path().canonicalize().expect("canonical");
        // the temp dir on devtmpfs (as mountinfo tells) vs on tmpfs
        let dev = format!("1 0 0:6 / {} rw - devtmpfs devtmpfs rw\n", here.display());
        let shm = format!("1 0 0:6 / {} rw - tmpfs tmpfs rw\n", here.display());
        let missing = here.join("x.img");
        assert_eq!(
            backing_of("d", &missing, Some(&shm)).expect("file"),
            Backing::NewFile
        );
        assert!(matches!(
            backing_of("d", &missing, Some(&dev)),
            Err(DiskError::MissingBlockDevice { .. })
        ));
        // in a directory that does not exist yet: the nearest existing one decides
        let deep = here.join("a/b/x.img");
        assert_eq!(
            backing_of("d", &deep, Some(&shm)).expect("file"),
            Backing::NewFile
        );
        std::fs::write(&missing, b"").expect("file");
        assert_eq!(
            backing_of("d", &missing, Some(&dev)).expect("file"),
            Backing::File
        );
        assert!(matches!(
            backing_of("d", &here, Some(&shm)),
            Err(DiskError::NotFileOrBlockDevice { .. })
        ));
        // a real block device node, when the host has one
        if let Some(b) = ["/dev/loop0", "/dev/ram0", "/dev/sda", "/dev/vda", "/dev/nvme0n1"]
            .into_iter()
            .map(Path::new)
            .find(|p| {
                use std::os::unix::fs::FileTypeExt;
                std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
            })
        {
            assert_eq!(backing_of("d", b, None).expect("block"), Backing::BlockDevice);
        }
        // /dev/shm on this host: a missing image there is a file to create
        let mi = std::fs::read_to_string("/proc/self/mountinfo").ok();
        if Path::new("/dev/shm").is_dir() && mi.as_deref().is_some_and(|m| m.contains(" /dev/shm ")) {
            let p = Path::new("/dev/shm/talon-unit-missing-never-made.img");
            assert_eq!(backing_of("d", p, mi.as_deref()).expect("file"), Backing::NewFile);
        }
        if mi.as_deref().is_some_and(|m| m.contains(" devtmpfs ")) {
            let p = Path::new("/dev/talon-unit-no-such-device");
            assert!(matches!(
                backing_of("d", p, mi.as_deref()),
                Err(DiskError::MissingBlockDevice { .. })
            ));
        }
    }

    /// Recorded from spdk_tgt v26.05 (`bdev_nvme_send_cmd` over an NVMe/TCP
    /// controller attached from the same target, an aio bdev exported): the
    /// command it accepted, and completions it gave.
    #[test]
    fn nvme_read_command_and_completions_as_spdk_gives_them() {
        use base64::Engine;
        // Read of 8 blocks at LBA 0 of namespace 1, as SPDK's rpc.py sent it
        assert_eq!(
            NVME_B64.encode(nvme_read_sqe(1, 0, 8)),
            "AgAAAAEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABwAAAAAAAAAAAAAAAAAAAA=="
        );
        let sqe = nvme_read_sqe(1, 131_064, 8);
        assert_eq!(u64::from_le_bytes(sqe[40..48].try_into().expect("8")), 131_064);
        let status = |s: &str| nvme_cpl_status(&NVME_B64.decode(s).expect("base64")).expect("16 bytes");
        assert_eq!(status("AAAAAAAAAAAAAAEAAAAAAA=="), (0, 0), "success");
        assert_eq!(status("AAAAAAAAAAACAAAAAAAAAQ=="), (0, 0x80), "LBA out of range");
        assert_eq!(status("AAAAAAAAAAACAAAAAAAWgA=="), (0, 0x0b), "invalid namespace");
        assert_eq!(
            status("AAAAAAAAAAACAAAAAAAeAA=="),
            (0, 0x0f),
            "data length not the command's"
        );
        assert_eq!(
            status("AAAAAAAAAAAAAAEAAAAQAA=="),
            (0, 0x08),
            "aborted (a transfer above MDTS)"
        );
        // without padding too
        assert_eq!(status("AAAAAAAAAAAAAAEAAAAAAA"), (0, 0));
        assert_eq!(nvme_cpl_status(&[0; 8]), None);
    }

    #[test]
    fn refusals_name_the_device_what_it_holds_and_the_format_command() {
        let e = DiskError::NotBlank {
            disk: "nvme0".into(),
            device: "NVMe 0000:00:04.0 (bdev talon-disk-nvme0n1)".into(),
            lvstore: "talon-nvme0".into(),
            found: Content::Signature("an XFS file system"),
        };
        let m = e.to_string();
        for want in [
            "NVMe 0000:00:04.0",
            "an XFS file system",
            "`talon disk format nvme0 --yes-destroy-data`",
        ] {
            assert!(m.contains(want), "{want}: {m}");
        }
        let e = DiskError::LvstoreNotLoaded {
            disk: "d1".into(),
            device: "/dev/sdb".into(),
            lvstore: "talon-d1".into(),
            expected: "u-1".into(),
            found: Content::Lvstore,
        };
        let m = e.to_string();
        for want in [
            "/dev/sdb",
            "uuid u-1",
            "an lvstore superblock (SPDKBLOB at offset 0) that did not load",
            "`talon disk format d1 --yes-destroy-data`",
        ] {
            assert!(m.contains(want), "{want}: {m}");
        }
        let e = DiskError::NotBlank {
            disk: "d1".into(),
            device: "/x.img".into(),
            lvstore: "talon-d1".into(),
            found: Content::Data { at: 4096 },
        };
        assert!(e.to_string().contains("non-zero data at offset 4096"), "{e}");
    }

    #[test]
    fn names_follow_the_contract() {
        let file: Disk = serde_json::from_value(serde_json::json!({"path": "/x"})).expect("disk");
        let n = names("d1", &file).expect("names");
        assert_eq!(
            (n.base.as_str(), n.bdev.as_str(), n.lvstore.as_str()),
            ("talon-disk-d1", "talon-disk-d1", "talon-d1")
        );
        let pci: Disk = serde_json::from_value(serde_json::json!({"pci": "0000:00:04.0"})).expect("disk");
        let n = names("d2", &pci).expect("names");
        assert_eq!(
            (n.base.as_str(), n.bdev.as_str()),
            ("talon-disk-d2", "talon-disk-d2n1")
        );
        assert!(names("Bad_Name", &file).is_err());
    }
}
