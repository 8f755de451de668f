//! NVMe secrets, one private file per host NQN: DH-HMAC-CHAP secrets
//! (`NodeConfig.nvmeDhchap`, [`DhchapSecret`], under `nvme-dhchap/`) and
//! NVMe/TCP TLS pre-shared keys (`NodeConfig.replicaTls`, [`TlsPsk`], under
//! `nvme-tls/`, same layout and rules).
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

/// A kind of secret kept one file per host NQN.
pub trait Secret: Sized + PartialEq {
    /// The directory under the data directory.
    const DIR: &'static str;
    /// The prefix of talon's keys of this kind in SPDK's keyring.
    const KEY_PREFIX: &'static str;
    /// What it is, for messages.
    const WHAT: &'static str;
    /// Validates the text of a file (surrounding white space ignored).
    fn parse(value: &str) -> Result<Self, InvalidSecret>;
    /// A new random secret.
    fn generate() -> io::Result<Self>;
    /// The secret as SPDK and the kernel read it.
    fn expose(&self) -> &str;
}

/// Base64 of `key` followed by its CRC-32 (little endian), the NVMe
/// interchange formats' payload.
fn with_crc(key: &[u8]) -> String {
    let mut raw = key.to_vec();
    raw.extend_from_slice(&crc32fast::hash(key).to_le_bytes());
    let s = STANDARD.encode(&raw);
    raw.fill(0);
    s
}

/// Checks `<base64>:` holding a key of one of `lens` bytes plus its CRC-32;
/// returns the key length.
fn check_payload(rest: &str, lens: &[usize]) -> Result<usize, InvalidSecret> {
    let b64 = rest.strip_suffix(':').ok_or(InvalidSecret("must end with ':'"))?;
    if !b64
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'='))
    {
        return Err(InvalidSecret("the key is not base64"));
    }
    let mut raw = STANDARD
        .decode(b64)
        .map_err(|_| InvalidSecret("the key is not base64"))?;
    let n = raw.len().saturating_sub(4);
    if !lens.contains(&n) || raw.len() != n + 4 {
        raw.fill(0);
        return Err(InvalidSecret("the key length is not one the format allows"));
    }
    let crc = u32::from_le_bytes(raw[n..].try_into().expect("4 bytes"));
    let ok = crc32fast::hash(&raw[..n]) == crc;
    raw.fill(0);
    if !ok {
        return Err(InvalidSecret("the key's CRC-32 does not match"));
    }
    Ok(n)
}

fn random32() -> io::Result<[u8; 32]> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(io::Error::other)?;
    Ok(key)
}

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

impl Secret for DhchapSecret {
    const DIR: &'static str = "nvme-dhchap";
    const KEY_PREFIX: &'static str = "talon-dhchap-";
    const WHAT: &'static str = "DH-HMAC-CHAP secret";

    /// Validates `DHHC-1:<hh>:<base64>:`.
    fn parse(value: &str) -> Result<Self, InvalidSecret> {
        let v = value.trim();
        let rest = v
            .strip_prefix("DHHC-1:")
            .ok_or(InvalidSecret("must start with \"DHHC-1:\""))?;
        let (hash, rest) = rest.split_once(':').ok_or(InvalidSecret("no hash id"))?;
        let lens: &[usize] = match hash {
            "00" => &[32, 48, 64],
            "01" => &[32],
            "02" => &[48],
            "03" => &[64],
            _ => return Err(InvalidSecret("the hash id is not 00, 01, 02 or 03")),
        };
        check_payload(rest, lens)?;
        Ok(Self(v.to_owned()))
    }

    /// 32 random bytes from the OS, no transformation (hash id 00).
    fn generate() -> io::Result<Self> {
        let mut key = random32()?;
        let s = Self(format!("DHHC-1:00:{}:", with_crc(&key)));
        key.fill(0);
        Ok(s)
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

impl DhchapSecret {
    /// See [`Secret::parse`].
    pub fn parse(value: &str) -> Result<Self, InvalidSecret> {
        <Self as Secret>::parse(value)
    }

    /// See [`Secret::generate`].
    pub fn generate() -> io::Result<Self> {
        <Self as Secret>::generate()
    }

    /// The secret itself, for SPDK's key file and the kernel's option string only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// An NVMe/TCP TLS pre-shared key in the PSK interchange format
/// `NVMeTLSkey-1:<hh>:<base64 of key + CRC-32>:` (NVMe/TCP transport
/// specification; what `nvme gen-tls-key` prints and SPDK v26.05's
/// `nvme_tcp_parse_interchange_psk` reads): hash 00 (the key is the retained
/// PSK, 32 or 48 bytes), 01 (SHA-256, 32 bytes) or 02 (SHA-384, 48 bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct TlsPsk(String);

impl fmt::Debug for TlsPsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsPsk(***)")
    }
}

impl Secret for TlsPsk {
    const DIR: &'static str = "nvme-tls";
    const KEY_PREFIX: &'static str = "talon-tls-";
    const WHAT: &'static str = "NVMe/TCP TLS pre-shared key";

    fn parse(value: &str) -> Result<Self, InvalidSecret> {
        let v = value.trim();
        let rest = v
            .strip_prefix("NVMeTLSkey-1:")
            .ok_or(InvalidSecret("must start with \"NVMeTLSkey-1:\""))?;
        let (hash, rest) = rest.split_once(':').ok_or(InvalidSecret("no hash id"))?;
        let lens: &[usize] = match hash {
            "00" => &[32, 48],
            "01" => &[32],
            "02" => &[48],
            _ => return Err(InvalidSecret("the hash id is not 00, 01 or 02")),
        };
        check_payload(rest, lens)?;
        Ok(Self(v.to_owned()))
    }

    /// 32 random bytes, retained PSK derived with SHA-256 (hash 01, as
    /// `nvme gen-tls-key` makes by default).
    fn generate() -> io::Result<Self> {
        let mut key = random32()?;
        let s = Self(format!("NVMeTLSkey-1:01:{}:", with_crc(&key)));
        key.fill(0);
        Ok(s)
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

/// An error reading or making a secret file. Never contains the secret.
#[derive(Debug, thiserror::Error)]
pub enum DhchapFileError {
    #[error("host NQN {0:?} cannot name a secret file")]
    BadName(String),
    #[error(
        "no {what} for host {host}: put that host's in {path} (mode 0600; for another talon node, a copy of its own <data-dir>/{dir}/{host})"
    )]
    Missing {
        what: &'static str,
        dir: &'static str,
        host: String,
        path: PathBuf,
    },
    #[error("cannot read the secret file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the secret file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the secret file {path} is invalid")]
    Invalid {
        path: PathBuf,
        #[source]
        source: InvalidSecret,
    },
}

/// The directory of secrets of kind `S` under `data_dir`.
pub fn dir<S: Secret>(data_dir: &Path) -> PathBuf {
    data_dir.join(S::DIR)
}

/// The file of host `nqn`'s secret of kind `S` (an NQN validated by the
/// caller; a name with a `/` or a leading `.` is refused all the same).
pub fn path<S: Secret>(data_dir: &Path, nqn: &str) -> Result<PathBuf, DhchapFileError> {
    if nqn.is_empty() || nqn.starts_with('.') || nqn.contains(['/', '\0']) {
        return Err(DhchapFileError::BadName(nqn.to_owned()));
    }
    Ok(dir::<S>(data_dir).join(nqn))
}

/// The name of host `nqn`'s key of kind `S` in SPDK's keyring (SPDK refuses
/// a `:` inside a key name, which every NQN has).
pub fn keyring_name<S: Secret>(nqn: &str) -> String {
    format!(
        "{}{}",
        S::KEY_PREFIX,
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, nqn.as_bytes()).simple()
    )
}

/// Reads host `nqn`'s secret; a missing file is [`DhchapFileError::Missing`].
/// A file group or others may access is made 0600 first (SPDK's file keyring
/// refuses it otherwise, and talon keeps what it stores private).
pub fn load<S: Secret>(data_dir: &Path, nqn: &str) -> Result<S, DhchapFileError> {
    let p = path::<S>(data_dir, nqn)?;
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
            what: S::WHAT,
            dir: S::DIR,
            host: nqn.to_owned(),
            path: p,
        }),
        Err(source) => Err(DhchapFileError::Read { path: p, source }),
    }
}

/// Reads this node's own secret (host `nqn`), making it with a new random
/// one when there is none.
pub fn load_or_create<S: Secret>(data_dir: &Path, nqn: &str) -> Result<S, DhchapFileError> {
    match load::<S>(data_dir, nqn) {
        Err(DhchapFileError::Missing { path, .. }) => create(&path),
        other => other,
    }
}

/// Writes `secret` as host `nqn`'s (0600, replacing any), as an operator
/// copies another node's file.
pub fn store<S: Secret>(data_dir: &Path, nqn: &str, secret: &S) -> Result<(), DhchapFileError> {
    let p = path::<S>(data_dir, nqn)?;
    let tmp = write_tmp(&p, secret)?;
    let r = fs::rename(&tmp, &p).map_err(|source| DhchapFileError::Write {
        path: p.clone(),
        source,
    });
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r
}

fn read<S: Secret>(p: &Path) -> Result<S, DhchapFileError> {
    let text = fs::read_to_string(p).map_err(|source| DhchapFileError::Read {
        path: p.to_path_buf(),
        source,
    })?;
    S::parse(&text).map_err(|source| DhchapFileError::Invalid {
        path: p.to_path_buf(),
        source,
    })
}

/// The secret in a new 0600 file beside `p`, synced. No newline after it:
/// SPDK's PSK parser wants the file to end with the format's last `:`.
fn write_tmp<S: Secret>(p: &Path, secret: &S) -> Result<PathBuf, DhchapFileError> {
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
    let tmp = d.join(format!(".{}.tmp", uuid::Uuid::new_v4().simple()));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    if let Err(e) = f
        .write_all(secret.expose().as_bytes())
        .and_then(|()| f.sync_all())
    {
        let _ = fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(tmp)
}

fn create<S: Secret>(p: &Path) -> Result<S, DhchapFileError> {
    let secret = S::generate().map_err(|source| DhchapFileError::Write {
        path: p.to_path_buf(),
        source,
    })?;
    // a temporary file linked into place: a crash never leaves half a secret,
    // and of two callers at once the first one's secret is kept
    let tmp = write_tmp(p, &secret)?;
    let linked = fs::hard_link(&tmp, p);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(secret),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read(p),
        Err(source) => Err(DhchapFileError::Write {
            path: p.to_path_buf(),
            source,
        }),
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
    fn tls_psks_parse_and_their_files_end_with_the_colon() {
        let k = TlsPsk::generate().expect("random");
        assert!(k.expose().starts_with("NVMeTLSkey-1:01:") && k.expose().ends_with(':'));
        assert_eq!(<TlsPsk as Secret>::parse(k.expose()), Ok(k.clone()));
        // the SPDK documentation's example PSK (32 bytes, hash 01)
        <TlsPsk as Secret>::parse("NVMeTLSkey-1:01:MDAxMTIyMzM0NDU1NjY3Nzg4OTlhYWJiY2NkZGVlZmZwJEiQ:")
            .expect("SPDK's example");
        assert!(
            <TlsPsk as Secret>::parse("NVMeTLSkey-1:03:MDAxMTIyMzM0NDU1NjY3Nzg4OTlhYWJiY2NkZGVlZmZwJEiQ:")
                .is_err()
        );
        assert!(
            <TlsPsk as Secret>::parse("DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:").is_err()
        );
        let d = tempfile::tempdir().expect("tempdir");
        let made = load_or_create::<TlsPsk>(d.path(), "nqn.x:h").expect("made");
        let text = fs::read_to_string(path::<TlsPsk>(d.path(), "nqn.x:h").expect("p")).expect("read");
        assert_eq!(
            text,
            made.expose(),
            "no newline: SPDK wants the last byte to be ':'"
        );
        assert!(!format!("{made:?}").contains(made.expose()));
    }

    #[test]
    fn files_are_private_and_named_by_host() {
        let d = tempfile::tempdir().expect("tempdir");
        let nqn = "nqn.2014-08.org.nvmexpress:uuid:11111111-1111-1111-1111-111111111111";
        assert!(matches!(
            load::<DhchapSecret>(d.path(), nqn),
            Err(DhchapFileError::Missing { .. })
        ));
        let a = load_or_create::<DhchapSecret>(d.path(), nqn).expect("made");
        let p = path::<DhchapSecret>(d.path(), nqn).expect("path");
        assert_eq!(
            fs::metadata(&p).expect("stat").permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::metadata(dir::<DhchapSecret>(d.path()))
                .expect("stat")
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        assert_eq!(load_or_create::<DhchapSecret>(d.path(), nqn).expect("again"), a);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).expect("chmod");
        assert_eq!(load::<DhchapSecret>(d.path(), nqn).expect("read"), a);
        assert_eq!(
            fs::metadata(&p).expect("stat").permissions().mode() & 0o777,
            0o600
        );
        fs::write(&p, "secret\n").expect("write");
        let e = load::<DhchapSecret>(d.path(), nqn).expect_err("garbage");
        assert!(matches!(e, DhchapFileError::Invalid { .. }), "{e}");
        assert!(
            path::<DhchapSecret>(d.path(), "../x").is_err() && path::<DhchapSecret>(d.path(), "a/b").is_err()
        );
        let k = keyring_name::<DhchapSecret>(nqn);
        assert!(k.starts_with(DhchapSecret::KEY_PREFIX) && !k.contains(':'), "{k}");
    }
}
