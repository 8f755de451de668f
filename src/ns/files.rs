//! Host-side file helpers: each runs `std::fs` inside the target's mount namespace.
//!
//! ```text
//!   read_file / write_file / create_dir_all ──run_in(mnt)──> std::fs in the target ns
//!   lock ──run_in(mnt): open(O_CREAT|O_CLOEXEC)──> fd ──flock(LOCK_EX|LOCK_NB) retry──> NsLock
//! ```
//!
//! A file descriptor opened inside another mount namespace stays valid in the
//! whole process, so the lock is held by an fd of this process and released when
//! the [`NsLock`] is dropped.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{FILE_TIMEOUT, Namespaces, NsError, Target, TargetNamespaces};
use crate::util::Backoff;
use crate::util::HostRoot;

/// Runs `f` inside the target's mount namespace (bounded by `timeout`);
/// returns its result and the target's label for messages.
pub fn in_mnt<T: Send + 'static>(
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
