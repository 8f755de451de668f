//! The node's iSCSI CHAP credentials (`NodeConfig.iscsiChap`), kept in one
//! private file of the data directory.
//!
//! ```text
//!   <data-dir>/iscsi-chap (0600, root)      made once with a random secret
//!     user=talon                             ──> tgtd account (control socket, never argv)
//!     secret=<64 random hex digits>          ──> bound to every V1 target
//!                                            ──> this host's iscsiadm node record
//! ```
//!
//! The secret lives only here and in tgtd's and iscsid's memory: not in the
//! node config (readable through the API), not in logs (`ChapSecret`'s
//! `Debug` hides it). An operator who admits another initiator through
//! `allowedHosts` gives it this user and secret; replacing the file (same
//! format, mode 0600) rotates them at the next reconcile.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::admin::{AdminError, ChapSecret, ChapUser};
use super::volume::ChapCredentials;

/// The file name under the data directory.
pub const FILE: &str = "iscsi-chap";
/// The user name talon writes into a new file.
pub const DEFAULT_USER: &str = "talon";

/// An error reading or making the credentials file. Never contains the secret.
#[derive(Debug, thiserror::Error)]
pub enum ChapFileError {
    #[error("cannot read the iSCSI CHAP credentials {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the iSCSI CHAP credentials {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the iSCSI CHAP credentials {path} have no {key}= line")]
    Missing { path: PathBuf, key: &'static str },
    #[error("the iSCSI CHAP credentials {path} are invalid")]
    Invalid {
        path: PathBuf,
        #[source]
        source: AdminError,
    },
}

/// The credentials file of `data_dir`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE)
}

/// Reads the node's credentials, making the file with a new random secret if
/// there is none. A file that group or others may read is made 0600 first
/// (talon keeps what it stores private whatever mode it finds).
pub fn load_or_create(data_dir: &Path) -> Result<ChapCredentials, ChapFileError> {
    let p = path(data_dir);
    match fs::symlink_metadata(&p) {
        Ok(m) => {
            if m.permissions().mode() & 0o077 != 0 {
                fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).map_err(|source| {
                    ChapFileError::Write {
                        path: p.clone(),
                        source,
                    }
                })?;
            }
            read(&p)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => create(&p),
        Err(source) => Err(ChapFileError::Read { path: p, source }),
    }
}

/// Reads the node's credentials; a missing file is an error (an initiator
/// with a secret made up now could not log in anyway).
pub fn load(data_dir: &Path) -> Result<ChapCredentials, ChapFileError> {
    read(&path(data_dir))
}

fn read(p: &Path) -> Result<ChapCredentials, ChapFileError> {
    let text = fs::read_to_string(p).map_err(|source| ChapFileError::Read {
        path: p.to_path_buf(),
        source,
    })?;
    let value = |key: &'static str| {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .next_back()
            .map(str::trim)
            .ok_or_else(|| ChapFileError::Missing {
                path: p.to_path_buf(),
                key,
            })
    };
    let invalid = |source| ChapFileError::Invalid {
        path: p.to_path_buf(),
        source,
    };
    Ok(ChapCredentials {
        user: ChapUser::parse(value("user")?).map_err(invalid)?,
        secret: ChapSecret::parse(value("secret")?).map_err(invalid)?,
    })
}

fn create(p: &Path) -> Result<ChapCredentials, ChapFileError> {
    let creds = ChapCredentials {
        user: ChapUser::parse(DEFAULT_USER).expect("a valid user name"),
        secret: ChapSecret::parse(&format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        ))
        .expect("64 hex digits are a valid secret"),
    };
    let err = |source| ChapFileError::Write {
        path: p.to_path_buf(),
        source,
    };
    // written to a temporary file and renamed: a crash never leaves half a secret
    // a name of its own: the engine and the attach controller may both make the file at once
    let tmp = p.with_extension(format!("{}.tmp", uuid::Uuid::new_v4().simple()));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    let body = format!(
        "# iSCSI CHAP credentials of this talon node (NodeConfig.iscsiChap)\nuser={}\nsecret={}\n",
        creds.user,
        creds.secret.expose()
    );
    f.write_all(body.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(err)?;
    drop(f);
    match fs::hard_link(&tmp, p) {
        Ok(()) => {
            let _ = fs::remove_file(&tmp);
            Ok(creds)
        }
        // another caller made it first: use theirs
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let _ = fs::remove_file(&tmp);
            read(p)
        }
        Err(source) => {
            let _ = fs::remove_file(&tmp);
            Err(err(source))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_private_and_read_back() {
        let d = tempfile::tempdir().expect("tempdir");
        let a = load_or_create(d.path()).expect("create");
        assert_eq!(a.user.as_str(), DEFAULT_USER);
        assert_eq!(a.secret.expose().len(), 64);
        let mode = fs::metadata(path(d.path())).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = load_or_create(d.path()).expect("read");
        assert_eq!(a, b, "the same secret every time");
        assert!(
            !format!("{b:?}").contains(b.secret.expose()),
            "Debug hides the secret"
        );
    }

    #[test]
    fn operator_file_is_checked_and_made_private() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = path(d.path());
        fs::write(&p, "user=alice\nsecret=short\n").expect("write");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = load_or_create(d.path()).expect_err("short secret");
        assert!(matches!(e, ChapFileError::Invalid { .. }), "{e}");
        assert!(!crate::util::error_chain(&e).contains("short\n"));
        assert_eq!(
            fs::metadata(&p).expect("stat").permissions().mode() & 0o777,
            0o600
        );
        fs::write(&p, "user=alice\nsecret=0123456789abcdef\n").expect("write");
        let c = load_or_create(d.path()).expect("valid");
        assert_eq!(
            (c.user.as_str(), c.secret.expose()),
            ("alice", "0123456789abcdef")
        );
        fs::write(&p, "secret=0123456789abcdef\n").expect("write");
        assert!(matches!(
            load_or_create(d.path()),
            Err(ChapFileError::Missing { key: "user", .. })
        ));
    }
}
