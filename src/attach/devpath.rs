//! The stable host path of an attached volume: `/dev/talon/<volume>`, a block device node made
//! with `mknod` with the major:minor of the kernel's block device (see
//! docs/frontend-device-path.md for why a node and not a symlink or a dm-linear device).
//!
//! ```text
//!   /sys/block/nvme1n1/dev "259:3" ──> mknod /dev/talon/.<vol>.tmp b 259 3 ──rename──> /dev/talon/<vol>
//!   detach: stat /dev/talon/<vol> ── block device? ──> unlink      (anything else: refused)
//! ```

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

use nix::sys::stat::{Mode, SFlag, major, makedev, minor, mknod};

use super::error::AttachError;
use crate::host::HostRoot;
use crate::names::ObjectName;

/// The directory of the stable paths, a host path.
pub const DEV_DIR: &str = "/dev/talon";

/// A block device number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevNum {
    pub major: u64,
    pub minor: u64,
}

impl DevNum {
    /// Parses a sysfs `dev` attribute (`"259:3"`).
    pub fn parse(s: &str) -> Option<Self> {
        let (a, b) = s.trim().split_once(':')?;
        Some(Self {
            major: a.parse().ok()?,
            minor: b.parse().ok()?,
        })
    }
}

impl std::fmt::Display for DevNum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// The host path `/dev/talon/<volume>`.
pub fn stable_path(volume: &ObjectName) -> PathBuf {
    PathBuf::from(DEV_DIR).join(volume.as_str())
}

/// Creates (or atomically replaces) `/dev/talon/<volume>` as a block node for `dev`.
/// `device` names the kernel device for the error message.
pub fn create(
    root: &HostRoot,
    volume: &ObjectName,
    device: &str,
    dev: DevNum,
) -> Result<PathBuf, AttachError> {
    create_in(root, DEV_DIR, volume, device, dev)
}

/// [`create`] in another directory of the host (`/dev/longhorn` for Longhorn's
/// engine-frontends).
pub fn create_in(
    root: &HostRoot,
    dev_dir: &str,
    volume: &ObjectName,
    device: &str,
    dev: DevNum,
) -> Result<PathBuf, AttachError> {
    let host_path = PathBuf::from(dev_dir).join(volume.as_str());
    let path = root.path(&host_path);
    let dir = root.path(dev_dir);
    let err = |source: std::io::Error| AttachError::CreateDevicePath {
        path: host_path.clone(),
        device: device.to_string(),
        source,
    };
    fs::create_dir_all(&dir).map_err(err)?;
    if let Some(cur) = current_in(root, dev_dir, volume)?
        && cur == dev
    {
        return Ok(host_path);
    }
    let tmp = dir.join(format!(".{volume}.tmp"));
    let _ = fs::remove_file(&tmp);
    mknod(
        &tmp,
        SFlag::S_IFBLK,
        Mode::from_bits_truncate(0o660),
        makedev(dev.major, dev.minor),
    )
    .map_err(|e| err(e.into()))?;
    if let Err(e) = fs::rename(&tmp, &path) {
        let _ = fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(host_path)
}

/// The device number behind `/dev/talon/<volume>`, `None` when absent; an error when the path
/// exists but is not a block device (talon never touches it then).
pub fn current(root: &HostRoot, volume: &ObjectName) -> Result<Option<DevNum>, AttachError> {
    current_in(root, DEV_DIR, volume)
}

/// [`current`] in another directory of the host.
pub fn current_in(
    root: &HostRoot,
    dev_dir: &str,
    volume: &ObjectName,
) -> Result<Option<DevNum>, AttachError> {
    let host_path = PathBuf::from(dev_dir).join(volume.as_str());
    match fs::symlink_metadata(root.path(&host_path)) {
        Ok(m) if m.file_type().is_block_device() => Ok(Some(DevNum {
            major: major(m.rdev()),
            minor: minor(m.rdev()),
        })),
        Ok(_) => Err(AttachError::ForeignDevicePath { path: host_path }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(AttachError::RemoveDevicePath {
            path: host_path,
            source,
        }),
    }
}

/// Removes `/dev/talon/<volume>` if it is a block device node; absent is fine.
pub fn remove(root: &HostRoot, volume: &ObjectName) -> Result<(), AttachError> {
    remove_in(root, DEV_DIR, volume)
}

/// [`remove`] in another directory of the host.
pub fn remove_in(root: &HostRoot, dev_dir: &str, volume: &ObjectName) -> Result<(), AttachError> {
    if current_in(root, dev_dir, volume)?.is_none() {
        return Ok(());
    }
    let host_path = PathBuf::from(dev_dir).join(volume.as_str());
    match fs::remove_file(root.path(&host_path)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(AttachError::RemoveDevicePath {
            path: host_path,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dev_numbers() {
        assert_eq!(DevNum::parse("259:3\n"), Some(DevNum { major: 259, minor: 3 }));
        assert_eq!(DevNum::parse("259"), None);
        assert_eq!(DevNum::parse("a:b"), None);
    }

    #[test]
    fn creates_replaces_and_removes_block_nodes() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIP creates_replaces_and_removes_block_nodes: mknod needs root");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let vol = ObjectName::parse("volume", "v1").expect("name");
        let loop0 = DevNum { major: 7, minor: 0 };
        let p = create(&root, &vol, "loop0", loop0).expect("create");
        assert_eq!(p, PathBuf::from("/dev/talon/v1"));
        assert_eq!(current(&root, &vol).expect("stat"), Some(loop0));
        let loop1 = DevNum { major: 7, minor: 1 };
        create(&root, &vol, "loop1", loop1).expect("replace");
        assert_eq!(current(&root, &vol).expect("stat"), Some(loop1));
        remove(&root, &vol).expect("remove");
        assert_eq!(current(&root, &vol).expect("stat"), None);
        remove(&root, &vol).expect("remove twice");
    }

    #[test]
    fn refuses_to_remove_what_talon_did_not_make() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let vol = ObjectName::parse("volume", "v1").expect("name");
        fs::create_dir_all(root.path(DEV_DIR)).expect("mkdir");
        fs::write(root.path("/dev/talon/v1"), "x").expect("write");
        let err = remove(&root, &vol).expect_err("regular file");
        assert!(err.to_string().contains("/dev/talon/v1"), "{err}");
        assert!(root.path("/dev/talon/v1").exists());
    }
}
