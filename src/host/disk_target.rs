//! Whether a path may become a talon disk (`disk_add`), checked before the
//! disk is stored: V2 puts an lvstore on it, which overwrites what is there.
//!
//! ```text
//!   path ─┬─ absent ─────────────────────────────> ok (talon creates a sparse file)
//!         ├─ regular file ─ empty, or "SPDKBLOB" at 0 ─> ok (an lvstore: talon's)
//!         │                 anything else ─────────> refused (data talon did not make)
//!         ├─ block device ─ open(O_EXCL) EBUSY ────> refused (mounted, or held by md/dm/...)
//!         │                 else ──────────────────> ok
//!         └─ anything else (a directory, ...) ─────> refused
//! ```
//! The path is the one SPDK opens (in talon's mount namespace).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The signature at the start of an SPDK blobstore (an lvstore's super
/// block, `SPDK_BS_SUPER_BLOCK_SIG` in SPDK's `lib/blob/blobstore.h`).
pub const BLOBSTORE_SIGNATURE: &[u8; 8] = b"SPDKBLOB";

/// Why a path cannot be a disk.
#[derive(Debug, thiserror::Error)]
pub enum DiskTargetError {
    #[error(
        "{path} is a file that holds data talon did not make (no SPDK lvstore at its start); it would be overwritten"
    )]
    ForeignFile { path: PathBuf },
    #[error("{path} is a block device in use (mounted, or held by another driver)")]
    InUse { path: PathBuf },
    #[error("{path} is neither a file nor a block device")]
    NotADisk { path: PathBuf },
    #[error("cannot inspect {path}")]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Checks that `path` may become a disk (see the module doc).
pub fn check(path: &Path) -> Result<(), DiskTargetError> {
    let inspect = |source| DiskTargetError::Inspect {
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(inspect(e)),
    };
    let ft = meta.file_type();
    if ft.is_file() {
        if meta.len() == 0 {
            return Ok(());
        }
        let mut head = [0u8; 8];
        let n = File::open(path)
            .and_then(|mut f| f.read(&mut head))
            .map_err(inspect)?;
        if n == head.len() && &head == BLOBSTORE_SIGNATURE {
            return Ok(());
        }
        return Err(DiskTargetError::ForeignFile {
            path: path.to_path_buf(),
        });
    }
    if ft.is_block_device() {
        // Linux: O_EXCL on a block device claims it, and fails with EBUSY while
        // it is mounted or claimed by md, dm, another exclusive opener
        return match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(path)
        {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(DiskTargetError::InUse {
                path: path.to_path_buf(),
            }),
            Err(e) => Err(inspect(e)),
        };
    }
    Err(DiskTargetError::NotADisk {
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_talon_did_not_make_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = |n: &str| dir.path().join(n);
        assert!(check(&p("absent.img")).is_ok());
        std::fs::write(p("empty.img"), b"").expect("write");
        assert!(check(&p("empty.img")).is_ok());
        let mut lvs = BLOBSTORE_SIGNATURE.to_vec();
        lvs.resize(4096, 0);
        std::fs::write(p("lvs.img"), &lvs).expect("write");
        assert!(check(&p("lvs.img")).is_ok());
        std::fs::write(p("db.sqlite"), b"SQLite format 3\0 precious").expect("write");
        let e = check(&p("db.sqlite")).expect_err("foreign file");
        assert!(
            e.to_string().contains("db.sqlite") && e.to_string().contains("did not make"),
            "{e}"
        );
        let e = check(dir.path()).expect_err("a directory");
        assert!(matches!(e, DiskTargetError::NotADisk { .. }), "{e:?}");
    }
}
