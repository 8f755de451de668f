//! NVMe in-band authentication (DH-HMAC-CHAP) secrets of `NodeConfig.nvmeDhchap`,
//! one private file per host NQN.
//!
//! ```text
//!   <data-dir>/nvme-dhchap/            0700
//!     <host NQN>                       0600, one line "DHHC-1:00:<base64 of 32 random bytes + CRC-32>:"
//!        │ this node's own NQN: made by talon when absent
//!        │ another host's NQN: put there by the operator (a copy of that node's file)
//!        ├──> spdk_tgt's file keyring (keyring_file_add_key, key "talon-dhchap-<uuid5 of the NQN>"):
//!        │      nvmf_subsystem_add_host dhchap_key / bdev_nvme_attach_controller dhchap_key
//!        └──> the kernel NVMe/TCP attach of this host: dhchap_secret=<line> in the option string
//! ```
//!
//! The secret format is the NVMe base specification's (TP 8006) as nvme-cli's
//! `gen-dhchap-key` writes it and both SPDK (`lib/nvme/nvme_auth.c`,
//! `nvme_auth_get_key`) and Linux (`nvme_auth_extract_key`) read it: a hash id
//! (00 none, 01 SHA-256, 02 SHA-384, 03 SHA-512), then base64 of a 32, 48 or
//! 64 byte key followed by its CRC-32 (little endian). [`DhchapSecret::parse`]
//! checks all of it, since the secret goes into a kernel option string. The
//! secret is never logged: `Debug` prints `***`.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// The directory under the data directory.
pub const DIR: &str = "nvme-dhchap";
/// The prefix of talon's keys in SPDK's keyring.
pub const KEY_PREFIX: &str = "talon-dhchap-";

/// A DH-HMAC-CHAP secret in its `DHHC-1:hh:base64:` form, validated.
#[derive(Clone, PartialEq, Eq)]
pub struct DhchapSecret(String);

impl fmt::Debug for DhchapSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DhchapSecret(***)")
    }
}

/// Why a secret is refused. Never contains the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a DH-HMAC-CHAP secret: {0}")]
pub struct InvalidSecret(&'static str);

impl DhchapSecret {
    /// Validates `DHHC-1:<hh>:<base64>:` (surrounding white space ignored).
    pub fn parse(value: &str) -> Result<Self, InvalidSecret> {
        let v = value.trim();
        let rest = v
            .strip_prefix("DHHC-1:")
            .ok_or(InvalidSecret("must start with \"DHHC-1:\""))?;
        let (hash, rest) = rest
            .split_once(':')
            .ok_or(InvalidSecret("no hash id"))?;
        let want_len = match hash {
            "00" => None,
            "01" => Some(32),
            "02" => Some(48),
            "03" => Some(64),
            _ => return Err(InvalidSecret("the hash id is not 00, 01, 02 or 03")),
        };
        let b64 = rest
            .strip_suffix(':')
            .ok_or(InvalidSecret("must end with ':'"))?;
        if !b64
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'='))
        {
            return Err(InvalidSecret("the key is not base64"));
        }
        let raw = STANDARD
            .decode(b64)
            .map_err(|_| InvalidSecret("the key is not base64"))?;
        let n = raw.len().saturating_sub(4);
        if ![32, 48, 64].contains(&n) || raw.len() != n + 4 {
            return Err(InvalidSecret("the key is not 32, 48 or 64 bytes"));
        }
        if want_len.is_some_and(|w| w != n) {
            return Err(InvalidSecret("the key length does not match its hash id"));
        }
        let crc = u32::from_le_bytes(raw[n..].try_into().expect("4 bytes"));
        if crc32fast::hash(&raw[..n]) != crc {
            return Err(InvalidSecret("the key's CRC-32 does not match"));
        }
        Ok(Self(v.to_owned()))
    }

    /// A new secret: 32 random bytes from the OS, no transformation (hash id 00).
    pub fn generate() -> io::Result<Self> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(io::Error::other)?;
        let mut raw = key.to_vec();
        raw.extend_from_slice(&crc32fast::hash(&key).to_le_bytes());
        key.fill(0);
        Ok(Self(format!("DHHC-1:00:{}:", STANDARD.encode(&raw))))
    }

    /// The secret itself, for SPDK's key file and the kernel's option string only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// An error reading or making a secret file. Never contains the secret.
#[derive(Debug, thiserror::Error)]
pub enum DhchapFileError {
    #[error("host NQN {0:?} cannot name a secret file")]
    BadName(String),
    #[error(
        "no DH-HMAC-CHAP secret for host {host}: put that host's secret in {path} (mode 0600; for another talon node, a copy of its own <data-dir>/nvme-dhchap/{host})"
    )]
    Missing { host: String, path: PathBuf },
    #[error("cannot read the DH-HMAC-CHAP secret {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the DH-HMAC-CHAP secret {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the DH-HMAC-CHAP secret {path} is invalid")]
    Invalid {
        path: PathBuf,
        #[source]
        source: InvalidSecret,
    },
}

/// The secrets directory of `data_dir`.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join(DIR)
}

/// The secret file of host `nqn` (an NQN validated by the caller; a name
/// with a `/` or a leading `.` is refused all the same).
pub fn path(data_dir: &Path, nqn: &str) -> Result<PathBuf, DhchapFileError> {
    if nqn.is_empty() || nqn.starts_with('.') || nqn.contains(['/', '\0']) {
        return Err(DhchapFileError::BadName(nqn.to_owned()));
    }
    Ok(dir(data_dir).join(nqn))
}

/// The name of host `nqn`'s key in SPDK's keyring (SPDK refuses a `:` inside
/// a key name, which every NQN has).
pub fn keyring_name(nqn: &str) -> String {
    format!(
        "{KEY_PREFIX}{}",
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, nqn.as_bytes()).simple()
    )
}

/// Reads host `nqn`'s secret; a missing file is [`DhchapFileError::Missing`].
/// A file group or others may access is made 0600 first (SPDK's file keyring
/// refuses it otherwise, and talon keeps what it stores private).
pub fn load(data_dir: &Path, nqn: &str) -> Result<DhchapSecret, DhchapFileError> {
    let p = path(data_dir, nqn)?;
    match fs::symlink_metadata(&p) {
        Ok(m) => {
            if m.permissions().mode() & 0o077 != 0 {
                fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).map_err(|source| {
                    DhchapFileError::Write {
                        path: p.clone(),
                        source,
                    }
                })?;
            }
            read(&p)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(DhchapFileError::Missing {
            host: nqn.to_owned(),
            path: p,
        }),
        Err(source) => Err(DhchapFileError::Read { path: p, source }),
    }
}

/// Reads this node's own secret (host `nqn`), making it with a new random
/// secret when there is none.
pub fn load_or_create(data_dir: &Path, nqn: &str) -> Result<DhchapSecret, DhchapFileError> {
    match load(data_dir, nqn) {
        Err(DhchapFileError::Missing { path, .. }) => create(&path),
        other => other,
    }
}

fn read(p: &Path) -> Result<DhchapSecret, DhchapFileError> {
    let text = fs::read_to_string(p).map_err(|source| DhchapFileError::Read {
        path: p.to_path_buf(),
        source,
    })?;
    DhchapSecret::parse(&text).map_err(|source| DhchapFileError::Invalid {
        path: p.to_path_buf(),
        source,
    })
}

fn create(p: &Path) -> Result<DhchapSecret, DhchapFileError> {
    let err = |source| DhchapFileError::Write {
        path: p.to_path_buf(),
        source,
    };
    let d = p.parent().expect("a file under the secrets directory");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(d)
        .map_err(err)?;
    let secret = DhchapSecret::generate().map_err(err)?;
    // a temporary file linked into place: a crash never leaves half a secret,
    // and of two callers at once the first one's secret is kept
    let tmp = d.join(format!(".{}.tmp", uuid::Uuid::new_v4().simple()));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(format!("{}\n", secret.expose()).as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(err)?;
    drop(f);
    let linked = fs::hard_link(&tmp, p);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(secret),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read(p),
        Err(source) => Err(err(source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_parse_and_differ() {
        let a = DhchapSecret::generate().expect("random");
        let b = DhchapSecret::generate().expect("random");
        assert_ne!(a, b);
        assert_eq!(DhchapSecret::parse(a.expose()), Ok(a.clone()));
        assert!(a.expose().starts_with("DHHC-1:00:") && a.expose().ends_with(':'));
        assert_eq!(a.expose().len(), "DHHC-1:00:".len() + 48 + 1);
        assert!(!format!("{a:?}").contains(&a.expose()[10..20]));
    }

    #[test]
    fn parse_refuses_what_is_not_a_secret() {
        // nvme-cli's documented example key (gen-dhchap-key, 32 bytes, no transform)
        let good = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
        DhchapSecret::parse(good).expect("nvme-cli's example");
        let mut flipped = good.to_owned();
        flipped.replace_range(12..13, "b");
        for bad in [
            "",
            "DHHC-2:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:",
            "DHHC-1:04:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:",
            "DHHC-1:02:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:",
            "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n",
            "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:,traddr=1",
            "DHHC-1:00:ia6zGodOr4SE,0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:",
            "DHHC-1:00:AAAA:",
            flipped.as_str(),
        ] {
            assert!(DhchapSecret::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn files_are_private_and_named_by_host() {
        let d = tempfile::tempdir().expect("tempdir");
        let nqn = "nqn.2014-08.org.nvmexpress:uuid:11111111-1111-1111-1111-111111111111";
        assert!(matches!(load(d.path(), nqn), Err(DhchapFileError::Missing { .. })));
        let a = load_or_create(d.path(), nqn).expect("made");
        let p = path(d.path(), nqn).expect("path");
        assert_eq!(fs::metadata(&p).expect("stat").permissions().mode() & 0o777, 0o600);
        assert_eq!(
            fs::metadata(dir(d.path())).expect("stat").permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(load_or_create(d.path(), nqn).expect("again"), a);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).expect("chmod");
        assert_eq!(load(d.path(), nqn).expect("read"), a);
        assert_eq!(fs::metadata(&p).expect("stat").permissions().mode() & 0o777, 0o600);
        fs::write(&p, "secret\n").expect("write");
        let e = load(d.path(), nqn).expect_err("garbage");
        assert!(matches!(e, DhchapFileError::Invalid { .. }), "{e}");
        assert!(path(d.path(), "../x").is_err() && path(d.path(), "a/b").is_err());
        let k = keyring_name(nqn);
        assert!(k.starts_with(KEY_PREFIX) && !k.contains(':'), "{k}");
    }
}
