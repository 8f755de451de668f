//! The host root handle: every path under /sys, /proc, /dev and /etc goes
//! through it, so host logic runs unchanged on a fixture tree in a tempdir.
//!
//! ```text
//!   logic ── HostRoot::path("/sys/bus/pci/devices/..") ──> <prefix>/sys/bus/pci/devices/..
//!                  read_string / write_str / read_link  (errors carry the full path)
//! ```

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// An I/O error on a host path; the message names the path and the operation.
#[derive(Debug, thiserror::Error)]
pub enum HostIoError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {value:?} to {path}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot list {path}")]
    ReadDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot resolve link {path}")]
    ReadLink {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl HostIoError {
    /// The underlying I/O error kind (NotFound, PermissionDenied, ...).
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            Self::Read { source, .. }
            | Self::Write { source, .. }
            | Self::ReadDir { source, .. }
            | Self::ReadLink { source, .. } => source.kind(),
        }
    }
}

/// A handle on the host's file system tree. `HostRoot::real()` is `/`; tests use
/// `HostRoot::new(tempdir)` with a fixture tree laid out like the real one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot {
    prefix: PathBuf,
}

impl Default for HostRoot {
    fn default() -> Self {
        Self::real()
    }
}

impl HostRoot {
    /// The real host root, `/`.
    pub fn real() -> Self {
        Self {
            prefix: PathBuf::from("/"),
        }
    }

    /// A root at `prefix` (a fixture tree, or the host's `/` seen from a container
    /// at e.g. `/host`).
    pub fn new(prefix: impl Into<PathBuf>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// Whether this is the real `/`.
    pub fn is_real(&self) -> bool {
        self.prefix == Path::new("/")
    }

    /// The prefix of this root.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// Maps an absolute host path (`/sys/...`) into this root.
    pub fn path(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let p = host_path.as_ref();
        let rel = p.strip_prefix("/").unwrap_or(p);
        self.prefix.join(rel)
    }

    /// Reads a whole file as a string.
    pub fn read_string(&self, host_path: impl AsRef<Path>) -> Result<String, HostIoError> {
        let path = self.path(host_path);
        fs::read_to_string(&path).map_err(|source| HostIoError::Read { path, source })
    }

    /// Reads a sysfs-style attribute: the file's content without the trailing newline
    /// and surrounding white space.
    pub fn read_attr(&self, host_path: impl AsRef<Path>) -> Result<String, HostIoError> {
        self.read_string(host_path).map(|s| s.trim().to_string())
    }

    /// Reads an attribute, or `None` when the file does not exist.
    pub fn read_attr_opt(&self, host_path: impl AsRef<Path>) -> Result<Option<String>, HostIoError> {
        match self.read_attr(host_path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `value` to an existing file (sysfs attribute semantics: no create, no
    /// truncate beyond what the kernel does).
    pub fn write_str(&self, host_path: impl AsRef<Path>, value: &str) -> Result<(), HostIoError> {
        use std::io::Write;
        let path = self.path(host_path);
        let res = fs::OpenOptions::new()
            .write(true)
            .truncate(!self.is_real())
            .open(&path)
            .and_then(|mut f| f.write_all(value.as_bytes()));
        res.map_err(|source| HostIoError::Write {
            path,
            value: value.to_string(),
            source,
        })
    }

    /// Whether a host path exists.
    pub fn exists(&self, host_path: impl AsRef<Path>) -> bool {
        self.path(host_path).exists()
    }

    /// The names of the entries of a directory, sorted.
    pub fn list_dir(&self, host_path: impl AsRef<Path>) -> Result<Vec<String>, HostIoError> {
        let path = self.path(host_path);
        let rd = fs::read_dir(&path).map_err(|source| HostIoError::ReadDir {
            path: path.clone(),
            source,
        })?;
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|source| HostIoError::ReadDir {
                path: path.clone(),
                source,
            })?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    /// The target of a symbolic link, as stored (sysfs links are relative).
    pub fn read_link(&self, host_path: impl AsRef<Path>) -> Result<PathBuf, HostIoError> {
        let path = self.path(host_path);
        fs::read_link(&path).map_err(|source| HostIoError::ReadLink { path, source })
    }

    /// The last component of a link's target (`driver` -> `nvme`), or `None` when
    /// the link does not exist.
    pub fn link_name(&self, host_path: impl AsRef<Path>) -> Result<Option<String>, HostIoError> {
        match self.read_link(host_path) {
            Ok(t) => Ok(t.file_name().map(|n| n.to_string_lossy().into_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_paths_into_the_prefix_and_names_them_in_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        fs::create_dir_all(root.path("/sys/module/nvme")).expect("mkdir");
        fs::write(root.path("/sys/module/nvme/refcnt"), "3\n").expect("write");
        assert_eq!(root.read_attr("/sys/module/nvme/refcnt").expect("read"), "3");
        assert_eq!(root.read_attr_opt("/sys/module/nope/refcnt").expect("opt"), None);
        let err = root.read_attr("/proc/missing").expect_err("missing");
        assert!(err.to_string().contains("/proc/missing"), "{err}");
        root.write_str("/sys/module/nvme/refcnt", "4").expect("write");
        assert_eq!(root.read_attr("/sys/module/nvme/refcnt").expect("read"), "4");
        assert_eq!(
            root.list_dir("/sys/module").expect("ls"),
            vec!["nvme".to_string()]
        );
    }
}
