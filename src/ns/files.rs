//! Host-side file helpers: each runs `std::fs` inside the target's mount namespace.
//!
//! ```text
//!   read_file / write_file / create_dir_all ──run_in(mnt)──> std::fs in the target ns
//!   lock ──run_in(mnt): open(O_CREAT|O_CLOEXEC)──> fd ──flock(LOCK_EX|LOCK_NB) retry──> NsLock
//!   os_release ──read_file(/etc/os-release | /usr/lib/os-release)──> OsRelease
//! ```
//!
//! A file descriptor opened inside another mount namespace stays valid in the
//! whole process, so the lock is held by an fd of this process and released when
//! the [`NsLock`] is dropped.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{FILE_TIMEOUT, Namespaces, NsError, Target, TargetNamespaces};
use crate::host::HostRoot;
use crate::util::Backoff;

fn in_mnt<T: Send + 'static>(
    root: &HostRoot,
    target: &Target,
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<(T, String), NsError> {
    let ns = TargetNamespaces::open(root, target, Namespaces::MNT)?;
    let v = ns.run(timeout, f)?;
    Ok((v, ns.label().to_string()))
}

/// Reads a whole file at `path` in the target's mount namespace.
pub fn read_file(root: &HostRoot, target: &Target, path: impl AsRef<Path>) -> Result<Vec<u8>, NsError> {
    let path = path.as_ref().to_path_buf();
    let p = path.clone();
    let (res, label) = in_mnt(root, target, FILE_TIMEOUT, move || fs::read(p))?;
    res.map_err(|source| NsError::ReadFile {
        path,
        target: label,
        source,
    })
}

/// Creates or truncates the file at `path` in the target's mount namespace and
/// writes `data` to it.
pub fn write_file(
    root: &HostRoot,
    target: &Target,
    path: impl AsRef<Path>,
    data: impl AsRef<[u8]>,
) -> Result<(), NsError> {
    let path = path.as_ref().to_path_buf();
    let p = path.clone();
    let data = data.as_ref().to_vec();
    let (res, label) = in_mnt(root, target, FILE_TIMEOUT, move || fs::write(p, data))?;
    res.map_err(|source| NsError::WriteFile {
        path,
        target: label,
        source,
    })
}

/// Creates a directory and its missing parents in the target's mount namespace.
pub fn create_dir_all(root: &HostRoot, target: &Target, path: impl AsRef<Path>) -> Result<(), NsError> {
    let path = path.as_ref().to_path_buf();
    let p = path.clone();
    let (res, label) = in_mnt(root, target, FILE_TIMEOUT, move || fs::create_dir_all(p))?;
    res.map_err(|source| NsError::CreateDir {
        path,
        target: label,
        source,
    })
}

/// An exclusive `flock` on a lock file in a target's mount namespace; released
/// when dropped (the file itself stays, as lock files should).
#[derive(Debug)]
pub struct NsLock {
    path: PathBuf,
    target: String,
    file: fs::File,
}

impl NsLock {
    /// The lock file's path in the target's mount namespace.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The target whose mount namespace holds the lock file.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Releases the lock now and reports a failure (drop ignores it).
    pub fn release(self) -> Result<(), NsError> {
        flock(&self.file, libc::LOCK_UN).map_err(|source| NsError::Lock {
            path: self.path.clone(),
            target: self.target.clone(),
            source,
        })
    }
}

impl Drop for NsLock {
    fn drop(&mut self) {
        // Closing the only descriptor of the open file description releases the
        // lock anyway; unlocking first just makes it prompt and explicit.
        let _ = flock(&self.file, libc::LOCK_UN);
    }
}

fn flock(file: &fs::File, op: libc::c_int) -> io::Result<()> {
    // SAFETY: flock only reads the descriptor number, which `file` keeps open for
    // the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Takes an exclusive lock on `path` (created with mode 0600 if missing; parent
/// directories must exist) in the target's mount namespace, waiting up to
/// `timeout` for another holder to release it.
pub fn lock(
    root: &HostRoot,
    target: &Target,
    path: impl AsRef<Path>,
    timeout: Duration,
) -> Result<NsLock, NsError> {
    let start = Instant::now();
    let path = path.as_ref().to_path_buf();
    let p = path.clone();
    let (res, label) = in_mnt(root, target, timeout, move || {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(p)
    })?;
    let file = res.map_err(|source| NsError::OpenLock {
        path: path.clone(),
        target: label.clone(),
        source,
    })?;
    let mut pause = Backoff::new(Duration::from_millis(1), Duration::from_millis(50));
    loop {
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => {
                return Ok(NsLock {
                    path,
                    target: label,
                    file,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(NsError::Lock {
                    path,
                    target: label,
                    source,
                });
            }
        }
        if !pause.sleep_before(start + timeout) {
            return Err(NsError::LockTimeout {
                path,
                target: label,
                timeout,
            });
        }
    }
}

/// The parsed `os-release` file of a target's mount namespace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OsRelease {
    /// `ID` (`"talos"`, `"debian"`); `"linux"` when absent, as os-release(5) says.
    pub id: String,
    /// `VERSION_ID` (`"12"`, `"v1.11.0"`), absent on rolling releases.
    pub version_id: Option<String>,
    /// `PRETTY_NAME`; `"Linux"` when absent.
    pub pretty_name: String,
    /// Every key-value pair, unquoted.
    pub fields: BTreeMap<String, String>,
}

impl OsRelease {
    /// Parses os-release text: `KEY=value` lines, values optionally in single or
    /// double quotes with backslash escapes; comments and malformed lines skipped.
    pub fn parse(text: &str) -> Self {
        let mut fields = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((key, raw)) = line.split_once('=') else {
                continue;
            };
            let key = key.trim();
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                continue;
            }
            fields.insert(key.to_string(), unquote(raw.trim()));
        }
        Self {
            id: fields.get("ID").cloned().unwrap_or_else(|| "linux".to_string()),
            version_id: fields.get("VERSION_ID").cloned(),
            pretty_name: fields
                .get("PRETTY_NAME")
                .cloned()
                .unwrap_or_else(|| "Linux".to_string()),
            fields,
        }
    }
}

fn unquote(raw: &str) -> String {
    let mut chars = raw.chars();
    let quote = match raw.chars().next() {
        Some(q @ ('"' | '\'')) => {
            chars.next();
            Some(q)
        }
        _ => None,
    };
    let mut out = String::new();
    while let Some(c) = chars.next() {
        match (c, quote) {
            (c, Some(q)) if c == q => break,
            ('\\', Some('"')) | ('\\', None) => {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            }
            (c, _) => out.push(c),
        }
    }
    out
}

/// Reads and parses `/etc/os-release` (or `/usr/lib/os-release`) in the target's
/// mount namespace.
pub fn os_release(root: &HostRoot, target: &Target) -> Result<OsRelease, NsError> {
    let (res, label) = in_mnt(root, target, FILE_TIMEOUT, || {
        fs::read_to_string("/etc/os-release").or_else(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                fs::read_to_string("/usr/lib/os-release")
            } else {
                Err(e)
            }
        })
    })?;
    let text = res.map_err(|source| NsError::ReadFile {
        path: PathBuf::from("/etc/os-release"),
        target: label,
        source,
    })?;
    Ok(OsRelease::parse(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_os_release_quoting() {
        let text = "# comment\nNAME=\"Talos\"\nID=talos\nVERSION_ID=v1.11.0\n\
                    PRETTY_NAME=\"Talos (v1.11.0) \\\"x\\\"\"\nHOME_URL='https://x/$y'\nbad line\n";
        let rel = OsRelease::parse(text);
        assert_eq!(rel.id, "talos");
        assert_eq!(rel.version_id.as_deref(), Some("v1.11.0"));
        assert_eq!(rel.pretty_name, "Talos (v1.11.0) \"x\"");
        assert_eq!(rel.fields["HOME_URL"], "https://x/$y");
        assert_eq!(rel.fields["NAME"], "Talos");
        let empty = OsRelease::parse("");
        assert_eq!(
            (empty.id.as_str(), empty.pretty_name.as_str()),
            ("linux", "Linux")
        );
        assert_eq!(empty.version_id, None);
    }

    /// The helpers against our own process: no namespace switch needed, so this
    /// runs unprivileged; the namespaced paths are covered in tests/ns_*.rs.
    #[test]
    fn file_helpers_and_lock_in_own_mount_namespace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::real();
        let me = Target::Pid(std::process::id());
        let sub = dir.path().join("a/b");
        create_dir_all(&root, &me, &sub).expect("mkdir");
        write_file(&root, &me, sub.join("f"), b"hello").expect("write");
        assert_eq!(read_file(&root, &me, sub.join("f")).expect("read"), b"hello");
        let err = read_file(&root, &me, sub.join("missing")).expect_err("missing");
        assert!(
            err.to_string().contains("missing") && err.to_string().contains("pid"),
            "{err}"
        );

        let lock_path = dir.path().join("talon.lock");
        let held = lock(&root, &me, &lock_path, Duration::from_secs(1)).expect("lock");
        let err = lock(&root, &me, &lock_path, Duration::from_millis(30)).expect_err("busy");
        assert!(matches!(err, NsError::LockTimeout { .. }), "{err:?}");
        drop(held);
        lock(&root, &me, &lock_path, Duration::from_millis(30))
            .expect("free again")
            .release()
            .expect("release");

        let rel = os_release(&root, &me).expect("os-release");
        assert!(!rel.id.is_empty());
    }
}
