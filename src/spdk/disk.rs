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
//!                    ├─ bdev_wait_for_examine ─> lvstore "talon-<d>" imported?
//!                    │        no ─> the path blank (zeros)? no ─> refused (host::disk_target)
//!                    │              yes ─> bdev_lvol_create_lvstore (cluster clusterMib)
//!                    │              fails ─> roll back the bdev/file made here
//!                    └─> the lvstore (sizes for DiskStatus)
//!   DiskOps::teardown: lvols left? ─yes─> Some("still holds lvols: ...")
//!                                   no ─> delete lvstore, delete base bdev
//!   DiskOps::remove_orphans: lvstore "talon-*" on a "talon-disk-*" bdev with no
//!            Disk and no lvols ─> removed; anything not named by talon is never touched.
//! ```
//!
//! A disk file is never deleted by talon (it may be the only copy of an
//! lvstore); removing the disk removes the lvstore from it and detaches it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::naming::{self, DISK_BDEV_PREFIX, LVS_PREFIX, pci_bdev};
use super::rpc::{
    AioCreate, AttachController, ByName, GetControllers, GetLvols, Lvstore, LvstoreCreate, LvstoreSelector,
};
use super::{ClientError, ErrorKind, SpdkClient};
use crate::host::HostRoot;
use crate::host::disk_target;
use crate::host::mounts::{fs_type_at, parse_mountinfo};
use crate::names::ObjectName;
use crate::resources::config::Disk;

/// Block size of a file disk's aio bdev.
pub const FILE_BLOCK_SIZE: u32 = 4096;

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
    /// The path holds something an lvstore would overwrite: data, a
    /// signature, or an lvstore SPDK did not load as this disk's.
    #[error("Disk {disk}: no lvstore {lvstore} is loaded from it, and it is not blank")]
    NotBlank {
        /// The disk.
        disk: String,
        /// The lvstore looked for.
        lvstore: String,
        /// What the path holds.
        #[source]
        source: disk_target::DiskTargetError,
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

    /// Attaches the base bdev if it is not there; records what it made.
    async fn ensure_base(&self, n: &DiskNames, spec: &Disk, created: &mut Created) -> Result<(), DiskError> {
        let present = self
            .client
            .bdev(&n.bdev)
            .await
            .map_err(rpc(&n.disk, format!("bdev_get_bdevs {}", n.bdev)))?
            .is_some();
        if present {
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
    pub async fn ensure(&self, n: &DiskNames, spec: &Disk) -> Result<Lvstore, DiskError> {
        let mut created = Created::default();
        match self.ensure_inner(n, spec, &mut created).await {
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
        created: &mut Created,
    ) -> Result<Lvstore, DiskError> {
        self.ensure_base(n, spec, created).await?;
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
            return Ok(l);
        }
        // the last look before an lvstore overwrites the disk: only over
        // zeros (an lvstore that did not load, e.g. while the target shuts
        // down or another node's, is never overwritten)
        if let Some(path) = &spec.path {
            let (path, shown) = (PathBuf::from(path), PathBuf::from(path));
            let blank = tokio::task::spawn_blocking(move || disk_target::check_blank(&path))
                .await
                .unwrap_or_else(|e| {
                    Err(disk_target::DiskTargetError::Inspect {
                        path: shown,
                        source: std::io::Error::other(e),
                    })
                });
            if let Err(source) = blank {
                return Err(DiskError::NotBlank {
                    disk: n.disk.clone(),
                    lvstore: n.lvstore.clone(),
                    source,
                });
            }
        }
        let params = LvstoreCreate {
            bdev_name: n.bdev.clone(),
            lvs_name: n.lvstore.clone(),
            cluster_sz: Some(spec.cluster_mib.max(1).saturating_mul(1 << 20)),
            clear_method: None,
        };
        self.client.bdev_lvol_create_lvstore(&params).await.map_err(rpc(
            &n.disk,
            format!("bdev_lvol_create_lvstore {} on {}", n.lvstore, n.bdev),
        ))?;
        tracing::info!(disk = %n.disk, lvstore = %n.lvstore, "lvstore created");
        self.lvstore(&n.disk, &n.lvstore)
            .await?
            .ok_or_else(|| DiskError::LvstoreVanished {
                disk: n.disk.clone(),
                lvstore: n.lvstore.clone(),
            })
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
