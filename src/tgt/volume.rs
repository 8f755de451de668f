//! V1 volumes: sparse files under the data dir, exported by tgtd as iSCSI LUNs.
//!
//! ```text
//!   <data_dir>/v1/volumes/<name>.img ──export──> tgtd target iqn.2025-01.io.talon:<name>, LUN 1
//!        │         ▲                               (ACL: initiator addresses/names, optional CHAP)
//!        │ FICLONE │ FICLONE (clone)
//!        v         │
//!   <data_dir>/v1/snapshots/<name>/<snapshot>.img
//! ```
//!
//! - create: a sparse file (`set_len`), fsynced with its directory.
//! - delete: refused while an initiator is logged in (the error names the
//!   sessions); otherwise every target serving the file is removed first, then
//!   the file and the volume's snapshots.
//! - expand: grows the file, then removes and re-adds the LUN so tgtd reads
//!   the new size (tgtd has no online resize); refused while sessions are
//!   logged in, because an I/O arriving between the removal and the re-add
//!   would fail. Initiators see the new size with READ CAPACITY.
//! - snapshot / clone: reflinks (FICLONE); filesystems without reflink get a
//!   clear error and nothing is left behind.
//! - export / reexport_all: idempotent; after a restart of tgtd or talon every
//!   volume file is served again.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::admin::{AdminError, ChapSecret, ChapUser, InitiatorAcl, Nexus, TargetInfo, TgtAdm, Tid};
use crate::names::{Iqn, ObjectName};

/// The LUN a volume is served as (LUN 0 is tgtd's controller).
pub const VOLUME_LUN: u64 = 1;
/// Volume sizes are multiples of this (the LUN's logical block size).
pub const BLOCK_SIZE: u64 = 512;

/// An error of a V1 volume operation.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("invalid size {} for volume {volume}: {reason}", crate::util::size::Bytes(*size))]
    InvalidSize {
        volume: ObjectName,
        size: u64,
        reason: String,
    },
    #[error("volume {volume} already exists at {path}")]
    Exists { volume: ObjectName, path: PathBuf },
    #[error("volume {volume} does not exist (no {path})")]
    NotFound { volume: ObjectName, path: PathBuf },
    #[error("snapshot {snapshot} of volume {volume} already exists at {path}")]
    SnapshotExists {
        volume: ObjectName,
        snapshot: ObjectName,
        path: PathBuf,
    },
    #[error("snapshot {snapshot} of volume {volume} does not exist (no {path})")]
    SnapshotNotFound {
        volume: ObjectName,
        snapshot: ObjectName,
        path: PathBuf,
    },
    #[error("cannot create {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot resize {path} to {}", crate::util::size::Bytes(*size))]
    Resize {
        path: PathBuf,
        size: u64,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot move {path} to {to}")]
    SetAside {
        path: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {path}")]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("filesystem at {path} does not support reflink (use XFS with reflink=1 or btrfs)")]
    NoReflink {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot reflink {from} to {to}")]
    Reflink {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot {action} volume {volume}: initiators are logged in: {sessions}")]
    InUse {
        action: &'static str,
        volume: ObjectName,
        sessions: String,
    },
    #[error("cannot {action} volume {volume} through tgtd")]
    Admin {
        action: &'static str,
        volume: ObjectName,
        #[source]
        source: AdminError,
    },
    #[error("cannot export volume {volume}: target {iqn} (tid {tid}) serves {found:?} as LUN 1, not {path}")]
    ExportConflict {
        volume: ObjectName,
        iqn: Iqn,
        tid: Tid,
        found: Option<PathBuf>,
        path: PathBuf,
    },
}

impl VolumeError {
    /// Whether this failed only because tgtd did not answer
    /// ([`AdminError::tgtd_unreachable`]).
    pub fn tgtd_unreachable(&self) -> bool {
        matches!(self, Self::Admin { source, .. } if source.tgtd_unreachable())
    }
}

/// Incoming CHAP credentials of a target (the initiator authenticates).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChapCredentials {
    /// The user name (a tgtd account, global to the daemon).
    pub user: ChapUser,
    /// The secret.
    pub secret: ChapSecret,
}

/// Who may reach an exported volume.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExportOptions {
    /// Allowed initiators; empty allows nobody (tgtd's default).
    pub initiators: Vec<InitiatorAcl>,
    /// CHAP the initiators must pass (incoming). The account must exist in
    /// tgtd ([`ensure_chap_account`]); exports bind it to their target.
    pub chap: Option<ChapCredentials>,
}

/// A volume served by tgtd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// The volume.
    pub volume: ObjectName,
    /// Its target name.
    pub iqn: Iqn,
    /// Its tgtd target id.
    pub tid: Tid,
    /// Its LUN ([`VOLUME_LUN`]).
    pub lun: u64,
}

/// A V1 volume on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// The volume's name.
    pub name: ObjectName,
    /// Its backing file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Bytes allocated on disk (sparse files use less than `size`).
    pub allocated: u64,
}

/// A snapshot of a V1 volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The volume.
    pub volume: ObjectName,
    /// The snapshot's name.
    pub name: ObjectName,
    /// Its file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
}

/// The result of [`V1Store::remove_orphans`].
#[derive(Debug, Default)]
pub struct OrphanReport {
    /// Targets removed.
    pub removed: Vec<Iqn>,
    /// Targets that could not be removed, with the reason.
    pub failed: Vec<(Iqn, AdminError)>,
}

/// The result of [`V1Store::reexport_all`]: what is served and what failed.
#[derive(Debug, Default)]
pub struct ReexportReport {
    /// Volumes served.
    pub exported: Vec<Export>,
    /// Volumes that could not be exported, with the reason.
    pub failed: Vec<(ObjectName, VolumeError)>,
    /// Set when the volume directory could not be read at all.
    pub list_error: Option<VolumeError>,
}

/// The V1 volumes of one data dir.
#[derive(Debug, Clone)]
pub struct V1Store {
    root: PathBuf,
}

impl V1Store {
    /// The store under `<data_dir>/v1`.
    pub fn new(data_dir: impl AsRef<Path>) -> Self {
        Self {
            root: data_dir.as_ref().join("v1"),
        }
    }

    /// The directory of volume files.
    pub fn volumes_dir(&self) -> PathBuf {
        self.root.join("volumes")
    }

    /// A volume's backing file.
    pub fn volume_path(&self, name: &ObjectName) -> PathBuf {
        self.volumes_dir().join(format!("{name}.img"))
    }

    /// The directory of a volume's snapshots.
    pub fn snapshots_dir(&self, volume: &ObjectName) -> PathBuf {
        self.root.join("snapshots").join(volume.as_str())
    }

    /// A snapshot's file.
    pub fn snapshot_path(&self, volume: &ObjectName, snapshot: &ObjectName) -> PathBuf {
        self.snapshots_dir(volume).join(format!("{snapshot}.img"))
    }

    fn check_size(&self, volume: &ObjectName, size: u64) -> Result<(), VolumeError> {
        let limit = filesystem_limit(&self.root);
        let reason = if size == 0 {
            "a volume must not be empty".to_string()
        } else if !size.is_multiple_of(BLOCK_SIZE) {
            format!("not a multiple of the {BLOCK_SIZE}-byte block size")
        } else if size > i64::MAX as u64 {
            "too large".to_string()
        } else if let Some((fs, max)) = limit.filter(|(_, max)| size > *max) {
            format!(
                "larger than the {} a file can have on the {fs} filesystem of {}",
                crate::util::size::Bytes(max),
                self.root.display()
            )
        } else {
            return Ok(());
        };
        Err(VolumeError::InvalidSize {
            volume: volume.clone(),
            size,
            reason,
        })
    }

    /// Creates a sparse volume file of `size` bytes.
    pub fn create(&self, name: &ObjectName, size: u64) -> Result<VolumeInfo, VolumeError> {
        self.check_size(name, size)?;
        let dir = self.volumes_dir();
        private_dir(&dir).map_err(|source| VolumeError::Create {
            path: dir.clone(),
            source,
        })?;
        let path = self.volume_path(name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| {
                if source.kind() == io::ErrorKind::AlreadyExists {
                    VolumeError::Exists {
                        volume: name.clone(),
                        path: path.clone(),
                    }
                } else {
                    VolumeError::Create {
                        path: path.clone(),
                        source,
                    }
                }
            })?;
        let result = file
            .set_len(size)
            .and_then(|()| file.sync_all())
            .and_then(|()| sync_dir(&dir))
            .map_err(|source| VolumeError::Resize {
                path: path.clone(),
                size,
                source,
            });
        if let Err(e) = result {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        self.info(name)
    }

    /// A volume's size and allocation.
    pub fn info(&self, name: &ObjectName) -> Result<VolumeInfo, VolumeError> {
        let path = self.volume_path(name);
        let meta = fs::metadata(&path).map_err(|source| {
            if source.kind() == io::ErrorKind::NotFound {
                VolumeError::NotFound {
                    volume: name.clone(),
                    path: path.clone(),
                }
            } else {
                VolumeError::Stat {
                    path: path.clone(),
                    source,
                }
            }
        })?;
        Ok(VolumeInfo {
            name: name.clone(),
            path,
            size: meta.len(),
            allocated: meta.blocks() * 512,
        })
    }

    /// Every volume, sorted by name (files with names that are not volume names
    /// are skipped).
    pub fn list(&self) -> Result<Vec<VolumeInfo>, VolumeError> {
        let dir = self.volumes_dir();
        let mut out = Vec::new();
        for name in img_names(&dir)? {
            match ObjectName::parse("volume", &name) {
                Ok(v) => out.push(self.info(&v)?),
                Err(e) => {
                    tracing::warn!(path = %dir.display(), error = %e, "skipping a file that is not a volume")
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The volume data under `<data_dir>/v1` of volumes not in `known` (the
    /// volumes a state store describes): `volumes/<name>.img` files and
    /// `snapshots/<name>/` directories, sorted. Nothing under `orphaned/`.
    pub fn orphans(&self, known: &BTreeSet<String>) -> Result<Vec<PathBuf>, VolumeError> {
        let mut out: Vec<PathBuf> = img_names(&self.volumes_dir())?
            .into_iter()
            .filter(|n| !known.contains(n))
            .map(|n| self.volumes_dir().join(format!("{n}.img")))
            .collect();
        let snaps = self.root.join("snapshots");
        match fs::read_dir(&snaps) {
            Ok(entries) => {
                for e in entries {
                    let e = e.map_err(|source| VolumeError::Stat {
                        path: snaps.clone(),
                        source,
                    })?;
                    let name = e.file_name().to_string_lossy().into_owned();
                    if !known.contains(&name) {
                        out.push(e.path());
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(VolumeError::Stat { path: snaps, source }),
        }
        out.sort();
        Ok(out)
    }

    /// Moves `paths` (from [`V1Store::orphans`]) to
    /// `<data_dir>/v1/orphaned/<unix seconds>/`, each keeping its place under
    /// `v1` (`volumes/x.img`, `snapshots/x/`): kept, never served, and no new
    /// volume of the same name finds them. Returns the directory.
    pub fn set_aside(&self, paths: &[PathBuf]) -> Result<PathBuf, VolumeError> {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut to = self.root.join("orphaned").join(secs.to_string());
        for n in 1.. {
            if !to.exists() {
                break;
            }
            to = self.root.join("orphaned").join(format!("{secs}.{n}"));
        }
        for p in paths {
            let rel = p.strip_prefix(&self.root).unwrap_or(p);
            let dst = to.join(rel);
            let dir = dst.parent().unwrap_or(&to).to_path_buf();
            let moved = private_dir(&dir)
                .and_then(|()| fs::rename(p, &dst))
                .and_then(|()| sync_dir(&dir))
                .and_then(|()| sync_dir(p.parent().unwrap_or(&self.root)));
            moved.map_err(|source| VolumeError::SetAside {
                path: p.clone(),
                to: dst,
                source,
            })?;
        }
        Ok(to)
    }

    /// The targets of tgtd serving this volume's file (by backing path, so a
    /// target made by another name counts too).
    fn serving_targets(&self, admin: &TgtAdm, name: &ObjectName) -> Result<Vec<TargetInfo>, AdminError> {
        let path = self.volume_path(name);
        Ok(admin
            .show()?
            .into_iter()
            .filter(|t| {
                t.luns
                    .iter()
                    .any(|l| l.backing_path.as_deref() == Some(path.as_path()))
            })
            .collect())
    }

    /// The sessions logged in to targets serving the volume.
    pub fn sessions(&self, admin: &TgtAdm, name: &ObjectName) -> Result<Vec<Nexus>, VolumeError> {
        let targets = self
            .serving_targets(admin, name)
            .map_err(admin_err("inspect", name))?;
        Ok(targets.into_iter().flat_map(|t| t.nexuses).collect())
    }

    fn refuse_if_in_use(
        &self,
        action: &'static str,
        name: &ObjectName,
        targets: &[TargetInfo],
    ) -> Result<(), VolumeError> {
        let sessions: Vec<String> = targets
            .iter()
            .flat_map(|t| t.nexuses.iter().map(|n| format!("{n} on {}", t.name)))
            .collect();
        if sessions.is_empty() {
            return Ok(());
        }
        Err(VolumeError::InUse {
            action,
            volume: name.clone(),
            sessions: sessions.join(", "),
        })
    }

    /// Exports a volume as LUN 1 of target `Iqn::for_volume(name)`, with the
    /// given ACL and CHAP. Idempotent: an existing target is brought to the
    /// wanted ACL. A failure while creating a new target removes it again.
    pub fn export(
        &self,
        admin: &TgtAdm,
        name: &ObjectName,
        opts: &ExportOptions,
    ) -> Result<Export, VolumeError> {
        let iqn = Iqn::for_volume(name);
        let existing = admin.find_target(&iqn).map_err(admin_err("export", name))?;
        self.export_seen(admin, name, opts, existing)
    }

    /// [`export`](Self::export) given tgtd's targets as one `show` listed them
    /// (a reconcile lists them once for every volume): a volume already
    /// served as wanted costs no tgtadm call, so a reconcile of N volumes
    /// lists N targets once instead of N times.
    pub fn export_known(
        &self,
        admin: &TgtAdm,
        name: &ObjectName,
        opts: &ExportOptions,
        targets: &[TargetInfo],
    ) -> Result<Export, VolumeError> {
        let iqn = Iqn::for_volume(name);
        let existing = targets.iter().find(|t| t.name == iqn.as_str()).cloned();
        self.export_seen(admin, name, opts, existing)
    }

    fn export_seen(
        &self,
        admin: &TgtAdm,
        name: &ObjectName,
        opts: &ExportOptions,
        existing: Option<TargetInfo>,
    ) -> Result<Export, VolumeError> {
        let path = self.info(name)?.path;
        let iqn = Iqn::for_volume(name);
        if let Some(t) = existing {
            let found = t.lun(VOLUME_LUN).and_then(|l| l.backing_path.clone());
            // talon's target by name, whatever step of an export a crash interrupted:
            // without its LUN it is adopted and completed; with another file behind it
            // (a volume of that name deleted and made again while talon was down) and
            // nobody logged in, it is removed and made again
            let adopt = match found.as_deref() {
                Some(p) if p == path.as_path() => true,
                None => {
                    tracing::info!(volume = %name, tid = t.tid, %iqn, "adopting a half-made target: adding its LUN");
                    admin
                        .new_lun(t.tid, VOLUME_LUN, &path)
                        .map_err(admin_err("export", name))?;
                    true
                }
                Some(_) if t.nexuses.is_empty() => {
                    tracing::info!(volume = %name, tid = t.tid, %iqn, found = ?found,
                        "removing a stale target that serves another file");
                    admin
                        .delete_target(t.tid, false)
                        .map_err(admin_err("export", name))?;
                    false
                }
                Some(_) => {
                    return Err(VolumeError::ExportConflict {
                        volume: name.clone(),
                        iqn,
                        tid: t.tid,
                        found,
                        path,
                    });
                }
            };
            if adopt {
                sync_acl(admin, &t, opts).map_err(admin_err("export", name))?;
                return Ok(Export {
                    volume: name.clone(),
                    iqn,
                    tid: t.tid,
                    lun: VOLUME_LUN,
                });
            }
        }
        let tid = admin.new_target(&iqn).map_err(admin_err("export", name))?;
        let setup = || -> Result<(), AdminError> {
            admin.new_lun(tid, VOLUME_LUN, &path)?;
            for acl in &opts.initiators {
                admin.bind(tid, acl)?;
            }
            if let Some(chap) = &opts.chap {
                set_chap(admin, tid, chap)?;
            }
            Ok(())
        };
        if let Err(e) = setup() {
            if let Err(undo) = admin.delete_target(tid, true) {
                tracing::warn!(tid, %iqn, error = %undo, "cannot remove a half-made target");
            }
            return Err(admin_err("export", name)(e));
        }
        Ok(Export {
            volume: name.clone(),
            iqn,
            tid,
            lun: VOLUME_LUN,
        })
    }

    /// Stops serving a volume (every target serving its file). Without `force`
    /// it refuses while initiators are logged in, naming them.
    pub fn unexport(&self, admin: &TgtAdm, name: &ObjectName, force: bool) -> Result<(), VolumeError> {
        let targets = self
            .serving_targets(admin, name)
            .map_err(admin_err("unexport", name))?;
        self.unexport_seen(admin, name, force, targets)
    }

    fn unexport_seen(
        &self,
        admin: &TgtAdm,
        name: &ObjectName,
        force: bool,
        targets: Vec<TargetInfo>,
    ) -> Result<(), VolumeError> {
        if !force {
            self.refuse_if_in_use("unexport", name, &targets)?;
        }
        for t in &targets {
            admin
                .delete_target(t.tid, force)
                .map_err(admin_err("unexport", name))?;
        }
        Ok(())
    }

    /// Removes the targets talon made (named `Iqn::for_volume`) for volumes
    /// that `keep` does not name, whatever state a crash left them in (no
    /// LUN, no ACL); a target with initiators logged in stays. Returns what
    /// was removed and what could not be.
    pub fn remove_orphans(
        &self,
        admin: &TgtAdm,
        keep: impl Fn(&ObjectName) -> bool,
    ) -> Result<OrphanReport, AdminError> {
        Ok(self.remove_orphans_known(admin, keep, &admin.show()?))
    }

    /// [`remove_orphans`](Self::remove_orphans) given tgtd's targets as one
    /// `show` listed them.
    pub fn remove_orphans_known(
        &self,
        admin: &TgtAdm,
        keep: impl Fn(&ObjectName) -> bool,
        targets: &[TargetInfo],
    ) -> OrphanReport {
        let prefix = format!("{}:", crate::names::IQN_PREFIX);
        let mut report = OrphanReport::default();
        for t in targets {
            let Some(v) = t.name.strip_prefix(&prefix) else {
                continue;
            };
            // only names talon gives its volumes (`host.` and other dotted names are not)
            let Ok(volume) = ObjectName::parse("volume", v) else {
                continue;
            };
            if keep(&volume) {
                continue;
            }
            let iqn = Iqn::for_volume(&volume);
            if !t.nexuses.is_empty() {
                tracing::warn!(%iqn, tid = t.tid, "an orphaned target has initiators logged in; left");
                continue;
            }
            match admin.delete_target(t.tid, false) {
                Ok(()) => report.removed.push(iqn),
                Err(e) => report.failed.push((iqn, e)),
            }
        }
        report
    }

    /// Exports every volume on disk (after a restart of tgtd or talon), with the
    /// options `opts_for` gives each. Continues past failures and reports them.
    pub fn reexport_all(
        &self,
        admin: &TgtAdm,
        opts_for: impl Fn(&ObjectName) -> ExportOptions,
    ) -> ReexportReport {
        let mut report = ReexportReport::default();
        let volumes = match self.list() {
            Ok(v) => v,
            Err(e) => {
                report.list_error = Some(e);
                return report;
            }
        };
        for v in volumes {
            match self.export(admin, &v.name, &opts_for(&v.name)) {
                Ok(e) => report.exported.push(e),
                Err(e) => report.failed.push((v.name, e)),
            }
        }
        report
    }

    /// Deletes a volume: refuses while initiators are logged in (naming them),
    /// removes every target serving its file, then the file and its snapshots.
    pub fn delete(&self, admin: &TgtAdm, name: &ObjectName) -> Result<(), VolumeError> {
        let info = self.info(name)?;
        self.unexport(admin, name, false)?;
        self.delete_files(name, info)
    }

    /// [`delete`](Self::delete) given tgtd's targets as one `show` listed them
    /// (a reconcile lists them once for all its deletes). A session that
    /// logged in after the listing makes tgtd refuse to remove its target
    /// ("this target is still active"): the delete fails and is tried again.
    pub fn delete_known(
        &self,
        admin: &TgtAdm,
        name: &ObjectName,
        targets: &[TargetInfo],
    ) -> Result<(), VolumeError> {
        let info = self.info(name)?;
        let serving = targets
            .iter()
            .filter(|t| {
                t.luns
                    .iter()
                    .any(|l| l.backing_path.as_deref() == Some(info.path.as_path()))
            })
            .cloned()
            .collect();
        self.unexport_seen(admin, name, false, serving)?;
        self.delete_files(name, info)
    }

    /// [`delete`](Self::delete) of a volume served by target `tid` of the
    /// running tgtd (as its export returned it): removes that target without
    /// listing the others, so its cost does not grow with the number of
    /// volumes. When tgtd refuses (initiators logged in, the target gone or
    /// replaced behind talon's back), falls back to [`delete`](Self::delete),
    /// which lists the targets and names the sessions in its error.
    pub fn delete_by_tid(&self, admin: &TgtAdm, name: &ObjectName, tid: Tid) -> Result<(), VolumeError> {
        let info = self.info(name)?;
        match admin.delete_target(tid, false) {
            Ok(()) => self.delete_files(name, info),
            Err(e) if e.tgtd_unreachable() => Err(admin_err("delete", name)(e)),
            Err(e) => {
                tracing::debug!(volume = %name, tid, error = %e, "removing the target by its id failed; listing the targets");
                self.delete(admin, name)
            }
        }
    }

    fn delete_files(&self, name: &ObjectName, info: VolumeInfo) -> Result<(), VolumeError> {
        fs::remove_file(&info.path).map_err(|source| VolumeError::Remove {
            path: info.path.clone(),
            source,
        })?;
        let snaps = self.snapshots_dir(name);
        match fs::remove_dir_all(&snaps) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(VolumeError::Remove { path: snaps, source }),
        }
        let _ = sync_dir(&self.volumes_dir());
        Ok(())
    }

    /// Grows a volume to `new_size` bytes and makes tgtd serve the new size.
    /// Refused while initiators are logged in (tgtd cannot resize a LUN in
    /// place); on a tgtd failure the file is shrunk back.
    pub fn expand(
        &self,
        admin: &TgtAdm,
        name: &ObjectName,
        new_size: u64,
    ) -> Result<VolumeInfo, VolumeError> {
        self.check_size(name, new_size)?;
        let info = self.info(name)?;
        if new_size < info.size {
            return Err(VolumeError::InvalidSize {
                volume: name.clone(),
                size: new_size,
                reason: format!(
                    "smaller than the current {} (volumes only grow)",
                    crate::util::size::Bytes(info.size)
                ),
            });
        }
        if new_size == info.size {
            return Ok(info);
        }
        let targets = self
            .serving_targets(admin, name)
            .map_err(admin_err("expand", name))?;
        self.refuse_if_in_use("expand", name, &targets)?;
        let resize = |size| {
            let f = OpenOptions::new().write(true).open(&info.path)?;
            f.set_len(size)?;
            f.sync_all()
        };
        resize(new_size).map_err(|source| VolumeError::Resize {
            path: info.path.clone(),
            size: new_size,
            source,
        })?;
        for t in &targets {
            let lun = t
                .luns
                .iter()
                .find(|l| l.backing_path.as_deref() == Some(info.path.as_path()));
            let Some(lun) = lun else { continue };
            if let Err(e) = admin.reopen_lun(t.tid, lun.lun, &info.path) {
                if let Err(undo) = resize(info.size) {
                    tracing::warn!(path = %info.path.display(), error = %undo, "cannot shrink back after a failed expand");
                }
                return Err(admin_err("expand", name)(e));
            }
        }
        self.info(name)
    }

    /// Takes a snapshot by reflink (crash-consistent: XFS and btrfs flush the
    /// source's dirty pages before sharing its extents).
    pub fn snapshot(&self, volume: &ObjectName, snapshot: &ObjectName) -> Result<SnapshotInfo, VolumeError> {
        let src = self.info(volume)?.path;
        let dir = self.snapshots_dir(volume);
        private_dir(&dir).map_err(|source| VolumeError::Create {
            path: dir.clone(),
            source,
        })?;
        let dst = self.snapshot_path(volume, snapshot);
        reflink_new(&src, &dst).map_err(|e| match e {
            ReflinkFail::Exists => VolumeError::SnapshotExists {
                volume: volume.clone(),
                snapshot: snapshot.clone(),
                path: dst.clone(),
            },
            other => other.into_error(&self.root, &src, &dst),
        })?;
        let _ = sync_dir(&dir);
        self.snapshot_info(volume, snapshot)
    }

    /// A snapshot's details.
    pub fn snapshot_info(
        &self,
        volume: &ObjectName,
        snapshot: &ObjectName,
    ) -> Result<SnapshotInfo, VolumeError> {
        let path = self.snapshot_path(volume, snapshot);
        let meta = fs::metadata(&path).map_err(|source| {
            if source.kind() == io::ErrorKind::NotFound {
                VolumeError::SnapshotNotFound {
                    volume: volume.clone(),
                    snapshot: snapshot.clone(),
                    path: path.clone(),
                }
            } else {
                VolumeError::Stat {
                    path: path.clone(),
                    source,
                }
            }
        })?;
        Ok(SnapshotInfo {
            volume: volume.clone(),
            name: snapshot.clone(),
            path,
            size: meta.len(),
        })
    }

    /// A volume's snapshots, sorted by name.
    pub fn list_snapshots(&self, volume: &ObjectName) -> Result<Vec<SnapshotInfo>, VolumeError> {
        let mut out = Vec::new();
        for name in img_names(&self.snapshots_dir(volume))? {
            if let Ok(s) = ObjectName::parse("snapshot", &name) {
                out.push(self.snapshot_info(volume, &s)?);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Deletes a snapshot (volumes cloned from it keep their data).
    pub fn delete_snapshot(&self, volume: &ObjectName, snapshot: &ObjectName) -> Result<(), VolumeError> {
        let path = self.snapshot_info(volume, snapshot)?.path;
        fs::remove_file(&path).map_err(|source| VolumeError::Remove { path, source })
    }

    /// Creates volume `new` from a snapshot by reflink.
    pub fn clone_snapshot(
        &self,
        volume: &ObjectName,
        snapshot: &ObjectName,
        new: &ObjectName,
    ) -> Result<VolumeInfo, VolumeError> {
        let src = self.snapshot_info(volume, snapshot)?.path;
        let dst = self.volume_path(new);
        reflink_new(&src, &dst).map_err(|e| match e {
            ReflinkFail::Exists => VolumeError::Exists {
                volume: new.clone(),
                path: dst.clone(),
            },
            other => other.into_error(&self.root, &src, &dst),
        })?;
        let _ = sync_dir(&self.volumes_dir());
        self.info(new)
    }
}

fn admin_err<'a>(
    action: &'static str,
    volume: &'a ObjectName,
) -> impl FnOnce(AdminError) -> VolumeError + 'a {
    move |source| VolumeError::Admin {
        action,
        volume: volume.clone(),
        source,
    }
}

/// Brings a target's ACL and CHAP to `opts`.
fn sync_acl(admin: &TgtAdm, t: &TargetInfo, opts: &ExportOptions) -> Result<(), AdminError> {
    for acl in &opts.initiators {
        if !t.acl.contains(&acl.to_string()) {
            admin.bind(t.tid, acl)?;
        }
    }
    for shown in &t.acl {
        if opts.initiators.iter().all(|a| a.to_string() != *shown) {
            match parse_acl(shown) {
                Some(acl) => admin.unbind(t.tid, &acl)?,
                None => {
                    tracing::warn!(tid = t.tid, entry = %shown, "leaving an ACL entry talon cannot parse")
                }
            }
        }
    }
    if let Some(chap) = &opts.chap
        && !t.accounts.iter().any(|a| a == chap.user.as_str())
    {
        admin.bind_account(t.tid, &chap.user, false)?;
    }
    for shown in &t.accounts {
        let wanted = opts.chap.as_ref().is_some_and(|c| c.user.as_str() == shown);
        if !wanted && let Ok(user) = ChapUser::parse(shown.trim_end_matches(" (outgoing)")) {
            admin.unbind_account(t.tid, &user, shown.ends_with(" (outgoing)"))?;
        }
    }
    // tgtd checks the ACL at login only: a session of an initiator the ACL no longer
    // admits (its Attachment deleted, allowedHosts changed) is cut here, and its
    // next login is refused
    for n in t.nexuses.iter().filter(|n| !admitted(opts, n)) {
        tracing::info!(tid = t.tid, session = %n, "closing a session the ACL no longer admits");
        for c in &n.connections {
            match admin.close_connection(t.tid, n.id, c.cid) {
                Ok(()) => {}
                // gone meanwhile (the initiator logged out)
                Err(AdminError::Failed { message, .. })
                    if message.contains("can't find the session")
                        || message.contains("can't find the connection") => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Whether the ACL of `opts` admits a logged-in session: by its initiator
/// name, or by the address of every one of its connections.
fn admitted(opts: &ExportOptions, n: &Nexus) -> bool {
    let by_address = |acl: &InitiatorAcl, addr: &str| -> bool {
        let Ok(ip) = addr.parse::<std::net::IpAddr>() else {
            return false;
        };
        match acl {
            InitiatorAcl::All => true,
            InitiatorAcl::Address(a) => *a == ip,
            InitiatorAcl::Subnet { address, prefix } => in_subnet(ip, *address, *prefix),
            InitiatorAcl::Name(_) => false,
        }
    };
    opts.initiators.iter().any(|acl| match acl {
        InitiatorAcl::Name(iqn) => iqn.as_str() == n.initiator,
        other => !n.connections.is_empty() && n.connections.iter().all(|c| by_address(other, &c.address)),
    })
}

fn in_subnet(ip: std::net::IpAddr, net: std::net::IpAddr, prefix: u8) -> bool {
    use std::net::IpAddr::{V4, V6};
    match (ip, net) {
        (V4(a), V4(b)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix.min(32))).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (V6(a), V6(b)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// An ACL entry as tgtd shows it, back as an [`InitiatorAcl`].
fn parse_acl(shown: &str) -> Option<InitiatorAcl> {
    if shown == "ALL" {
        return Some(InitiatorAcl::All);
    }
    if let Ok(a) = shown.parse() {
        return Some(InitiatorAcl::Address(a));
    }
    if let Some((a, p)) = shown.split_once('/')
        && let (Ok(address), Ok(prefix)) = (a.parse(), p.parse())
    {
        return Some(InitiatorAcl::Subnet { address, prefix });
    }
    Iqn::parse(shown).ok().map(InitiatorAcl::Name)
}

/// Binds the CHAP account (made by [`ensure_chap_account`]) to a new target.
fn set_chap(admin: &TgtAdm, tid: Tid, chap: &ChapCredentials) -> Result<(), AdminError> {
    admin.bind_account(tid, &chap.user, false)
}

/// Makes tgtd hold the CHAP account of `chap` (tgtd accounts are global; an
/// export with `ExportOptions.chap` binds it). tgtd cannot show a secret or
/// change one: with `replace` an existing account is deleted and made again
/// with this secret, which unbinds it from every target (the exports bind it
/// again); without, an existing account is kept as it is. The secret goes to
/// tgtd over its control socket, never in an argv.
pub fn ensure_chap_account(admin: &TgtAdm, chap: &ChapCredentials, replace: bool) -> Result<(), AdminError> {
    if admin.accounts()?.iter().any(|a| a == chap.user.as_str()) {
        if !replace {
            return Ok(());
        }
        admin.delete_account(&chap.user)?;
    }
    admin.new_account(&chap.user, &chap.secret)
}

fn img_names(dir: &Path) -> Result<Vec<String>, VolumeError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(VolumeError::Stat {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| VolumeError::Stat {
            path: dir.to_path_buf(),
            source,
        })?;
        if let Some(stem) = entry.file_name().to_str().and_then(|n| n.strip_suffix(".img")) {
            out.push(stem.to_string());
        }
    }
    Ok(out)
}

/// The largest file the filesystem holding `dir` (or its nearest existing
/// ancestor) can have, when it is below what talon serves: ext4 addresses
/// 2^32 - 1 blocks per extent-mapped file, 16 TiB - 4 KiB with 4 KiB blocks
/// (checked here: ftruncate to 17592186040320 works, 512 bytes more is
/// EFBIG). XFS, btrfs and tmpfs go to 8 EiB.
pub fn filesystem_limit(dir: &Path) -> Option<(&'static str, u64)> {
    let existing = dir.ancestors().find(|d| d.exists())?;
    let s = nix::sys::statfs::statfs(existing).ok()?;
    (s.filesystem_type() == nix::sys::statfs::EXT4_SUPER_MAGIC).then(|| {
        let block = u64::try_from(s.block_size()).unwrap_or(4096);
        ("ext4", ((1u64 << 32) - 1) * block)
    })
}

/// Creates `dir` and its missing parents private to root (0700).
fn private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

enum ReflinkFail {
    Exists,
    Create(io::Error),
    Clone(io::Error),
}

impl ReflinkFail {
    fn into_error(self, root: &Path, src: &Path, dst: &Path) -> VolumeError {
        match self {
            Self::Exists => VolumeError::Create {
                path: dst.to_path_buf(),
                source: io::Error::from(io::ErrorKind::AlreadyExists),
            },
            Self::Create(source) => VolumeError::Create {
                path: dst.to_path_buf(),
                source,
            },
            Self::Clone(source) if is_no_reflink(&source) => VolumeError::NoReflink {
                path: root.to_path_buf(),
                source,
            },
            Self::Clone(source) => VolumeError::Reflink {
                from: src.to_path_buf(),
                to: dst.to_path_buf(),
                source,
            },
        }
    }
}

/// The errno values with which FICLONE says "not on this filesystem".
fn is_no_reflink(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::EXDEV | libc::EINVAL | libc::ENOTTY)
    )
}

/// Creates `dst` (must not exist) sharing `src`'s extents; removes `dst` again
/// on failure.
fn reflink_new(src: &Path, dst: &Path) -> Result<(), ReflinkFail> {
    let from = File::open(src).map_err(ReflinkFail::Create)?;
    let to = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                ReflinkFail::Exists
            } else {
                ReflinkFail::Create(e)
            }
        })?;
    // SAFETY: FICLONE takes the source descriptor as its integer argument; both
    // descriptors are open for the duration of the call (owned by `from`/`to`).
    let rc = unsafe { libc::ioctl(to.as_raw_fd(), libc::FICLONE, from.as_raw_fd()) };
    let result = if rc == 0 {
        to.sync_all().map_err(ReflinkFail::Create)
    } else {
        Err(ReflinkFail::Clone(io::Error::last_os_error()))
    };
    if result.is_err() {
        drop(to);
        let _ = fs::remove_file(dst);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn name(s: &str) -> ObjectName {
        ObjectName::parse("volume", s).expect("name")
    }

    #[test]
    fn create_is_sparse_and_list_sorts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = V1Store::new(dir.path());
        let b = store.create(&name("b"), 1 << 30).expect("create b");
        assert_eq!(b.size, 1 << 30);
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(
            mode(&b.path),
            0o600,
            "volume files are private whatever the umask"
        );
        assert_eq!(mode(&store.volumes_dir()), 0o700);
        assert!(b.allocated < 1 << 20, "sparse: {} bytes allocated", b.allocated);
        store.create(&name("a"), 4096).expect("create a");
        fs::write(store.volumes_dir().join("Not_A_Name.img"), b"").expect("junk");
        let names: Vec<String> = store
            .list()
            .expect("list")
            .into_iter()
            .map(|v| v.name.to_string())
            .collect();
        assert_eq!(names, ["a", "b"]);
        let e = store.create(&name("a"), 4096).expect_err("exists");
        assert!(e.to_string().starts_with("volume a already exists at "), "{e}");
    }

    #[test]
    fn sizes_are_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = V1Store::new(dir.path());
        for (size, why) in [(0, "must not be empty"), (1000, "multiple of the 512-byte")] {
            let e = store.create(&name("v"), size).expect_err("bad size");
            assert!(e.to_string().contains(why), "{e}");
        }
        assert!(!store.volume_path(&name("v")).exists(), "nothing left behind");
    }

    #[test]
    fn reflink_on_a_filesystem_without_it_is_a_clear_error() {
        // /dev/shm is tmpfs: no FICLONE.
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            eprintln!("SKIP reflink_on_a_filesystem_without_it_is_a_clear_error: no /dev/shm");
            return;
        };
        let store = V1Store::new(dir.path());
        store.create(&name("v"), 1 << 20).expect("create");
        let e = store
            .snapshot(&name("v"), &name("s1"))
            .expect_err("tmpfs has no reflink");
        assert_eq!(
            e.to_string(),
            format!(
                "filesystem at {} does not support reflink (use XFS with reflink=1 or btrfs)",
                dir.path().join("v1").display()
            )
        );
        assert!(
            !store.snapshot_path(&name("v"), &name("s1")).exists(),
            "no half-made snapshot"
        );
        let e = store.snapshot(&name("nope"), &name("s1")).expect_err("no volume");
        assert!(e.to_string().starts_with("volume nope does not exist"), "{e}");
    }

    #[test]
    fn acl_entries_round_trip() {
        for acl in [
            InitiatorAcl::All,
            InitiatorAcl::Address("10.1.2.3".parse().expect("ip")),
            InitiatorAcl::Subnet {
                address: "10.0.0.0".parse().expect("ip"),
                prefix: 8,
            },
            InitiatorAcl::Name(Iqn::parse("iqn.2025-01.io.example:h").expect("iqn")),
        ] {
            assert_eq!(parse_acl(&acl.to_string()), Some(acl));
        }
    }
}

#[cfg(test)]
mod filesystem_limit_tests {
    use super::*;

    /// On ext4 (this machine's /tmp) a volume larger than the largest ext4 file
    /// is refused before a file is made, naming the filesystem and the limit;
    /// the limit itself is served.
    #[test]
    fn volumes_beyond_the_ext4_file_limit_are_refused_up_front() {
        let d = tempfile::tempdir().expect("tempdir");
        let Some(("ext4", max)) = filesystem_limit(d.path()) else {
            eprintln!(
                "SKIP volumes_beyond_the_ext4_file_limit_are_refused_up_front: {} is not on ext4",
                d.path().display()
            );
            return;
        };
        let store = V1Store::new(d.path());
        let v = ObjectName::parse("volume", "huge").expect("name");
        let e = store.create(&v, max + 512).expect_err("past the limit");
        let text = e.to_string();
        assert!(
            matches!(e, VolumeError::InvalidSize { .. })
                && text.contains("ext4")
                && text.contains(&max.to_string()),
            "{text}"
        );
        assert!(!store.volume_path(&v).exists(), "no file is left");
        let info = store.create(&v, max).expect("the limit itself (sparse)");
        assert_eq!(info.size, max);
    }
}
