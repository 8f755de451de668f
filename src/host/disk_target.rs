//! Whether a path may become a talon disk, by what it holds. One rule for
//! every way a disk comes (`disk_add`, Longhorn's `DiskCreate`) and checked
//! again by the disk controller right before it makes an lvstore, because an
//! lvstore overwrites what is there.
//!
//! ```text
//!   path ─┬─ absent ──────────────────────────────────> ok (talon creates a sparse file)
//!         ├─ block device held (O_EXCL: EBUSY) ───────> refused (mounted, or held by md/dm/...)
//!         ├─ file or block device: its first and last MiB
//!         │    "SPDKBLOB" at 0 ─────────────────────────> an lvstore: imported, never overwritten
//!         │    zeros (a `truncate -s` file, a new disk) > ok
//!         │    a signature (file system, partition table,
//!         │      LVM, md, LUKS, swap) ─────────────────> refused, named ("wipe" overwrites it)
//!         │    other bytes ────────────────────────────> refused, with the offset of the first
//!         │                                              ("wipe" overwrites them)
//!         └─ anything else (a directory, ...) ────────> refused
//! ```
//! The path is the one SPDK opens (in talon's mount namespace). `wipe`
//! zeroes the first and last MiB (where every signature above lives), never
//! an lvstore. [`classify`] is the one definition of blank: an NVMe disk's
//! ends, read through SPDK (`spdk::disk`), are judged by it too.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The signature at the start of an SPDK blobstore (an lvstore's super
/// block, `SPDK_BS_SUPER_BLOCK_SIG` in SPDK's `lib/blob/blobstore.h`).
pub const BLOBSTORE_SIGNATURE: &[u8; 8] = b"SPDKBLOB";

/// How much of each end of a disk is read, and wiped.
pub const EDGE: u64 = 1 << 20;

/// What a disk path holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// Nothing is there yet.
    Absent,
    /// Only zeros at both ends (a new sparse file, a new or zeroed device).
    Zeros,
    /// An SPDK blobstore: an lvstore, talon's or another's.
    Lvstore,
    /// A known signature: a file system, partition table, LVM, md, LUKS, swap.
    Signature(&'static str),
    /// Bytes that are not zeros, with no signature talon knows.
    Data {
        /// The offset of the first byte that is not zero.
        at: u64,
    },
}

impl Content {
    /// Whether an lvstore may be made over it without losing anything.
    pub fn is_blank(self) -> bool {
        matches!(self, Content::Absent | Content::Zeros)
    }
}

impl std::fmt::Display for Content {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Content::Absent => f.write_str("nothing (it does not exist)"),
            Content::Zeros => f.write_str("only zeros"),
            Content::Lvstore => f.write_str("an SPDK lvstore"),
            Content::Signature(s) => f.write_str(s),
            Content::Data { at } => write!(f, "non-zero data at offset {at} (and no signature talon knows)"),
        }
    }
}

/// Why a path cannot be a disk.
#[derive(Debug, thiserror::Error)]
pub enum DiskTargetError {
    #[error(
        "{path} holds {content}; making an lvstore would overwrite it. Wipe it first (`talon disk add --wipe`, `talosctl wipe disk`, `wipefs -a`), or choose another"
    )]
    Foreign { path: PathBuf, content: Content },
    #[error(
        "{path} holds an SPDK lvstore that is not loaded as this disk's (another one's, or one that did not load); talon never overwrites an lvstore"
    )]
    AnLvstore { path: PathBuf },
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

/// Reads what `path` holds (see the module doc).
pub fn inspect(path: &Path) -> Result<Content, DiskTargetError> {
    let inspect = |source| DiskTargetError::Inspect {
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Content::Absent),
        Err(e) => return Err(inspect(e)),
    };
    let ft = meta.file_type();
    let mut f = if ft.is_file() {
        File::open(path).map_err(inspect)?
    } else if ft.is_block_device() {
        // Linux: O_EXCL on a block device claims it, and fails with EBUSY while
        // it is mounted or claimed by md, dm, another exclusive opener
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                return Err(DiskTargetError::InUse {
                    path: path.to_path_buf(),
                });
            }
            Err(e) => return Err(inspect(e)),
        }
    } else {
        return Err(DiskTargetError::NotADisk {
            path: path.to_path_buf(),
        });
    };
    let len = f.seek(SeekFrom::End(0)).map_err(inspect)?;
    let head = read_at(&mut f, 0, len.min(EDGE)).map_err(inspect)?;
    let tail_at = len.saturating_sub(EDGE).max(head.len() as u64);
    let tail = read_at(&mut f, tail_at, len - tail_at).map_err(inspect)?;
    Ok(classify(&head, &tail, tail_at))
}

fn read_at(f: &mut File, at: u64, n: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    f.seek(SeekFrom::Start(at))?;
    f.take(n).read_to_end(&mut buf)?;
    Ok(buf)
}

/// What a disk holds, from its first bytes (`head`, from offset 0) and last
/// (`tail`, from offset `tail_at`; may be empty: a disk no longer than
/// `head`). Blank is [`Content::Zeros`]: every byte of both ends zero.
pub fn classify(head: &[u8], tail: &[u8], tail_at: u64) -> Content {
    if head.starts_with(BLOBSTORE_SIGNATURE) {
        return Content::Lvstore;
    }
    if let Some(s) = super::pci::detect_signature(head).or_else(|| tail_signature(head, tail)) {
        return Content::Signature(s);
    }
    let first = |b: &[u8]| b.iter().position(|x| *x != 0).map(|i| i as u64);
    match first(head).or_else(|| first(tail).map(|i| tail_at + i)) {
        None => Content::Zeros,
        Some(at) => Content::Data { at },
    }
}

/// Signatures kept at a device's end: GPT's backup header (last 512-byte
/// sector), md superblocks 0.90 and 1.0 (4 KiB-aligned, in the last 128 KiB).
fn tail_signature(head: &[u8], tail: &[u8]) -> Option<&'static str> {
    // a disk shorter than two edges: its end is in `head`
    let end: &[u8] = if tail.is_empty() { head } else { tail };
    if end.len() >= 512 && end[end.len() - 512..].starts_with(b"EFI PART") {
        return Some("a GPT partition table (its backup header)");
    }
    const MD_MAGIC: [u8; 4] = 0xa92b_4efc_u32.to_le_bytes();
    let from = end.len().saturating_sub(128 << 10);
    (from..end.len())
        .step_by(4096)
        .map(|o| o - o % 4096)
        .any(|o| end.get(o..o + 4) == Some(&MD_MAGIC[..]))
        .then_some("an md RAID member")
}

/// Checks that `path` may become a disk; `wipe` accepts what it holds (the
/// caller wipes it with [`wipe`]). Returns what it holds.
pub fn check(path: &Path, wipe: bool) -> Result<Content, DiskTargetError> {
    let content = inspect(path)?;
    match content {
        Content::Absent | Content::Zeros | Content::Lvstore => Ok(content),
        Content::Signature(_) | Content::Data { .. } if wipe => Ok(content),
        Content::Signature(_) | Content::Data { .. } => Err(DiskTargetError::Foreign {
            path: path.to_path_buf(),
            content,
        }),
    }
}

/// Checks that `path` is blank (absent, or zeros): an lvstore made over it
/// loses nothing.
pub fn check_blank(path: &Path) -> Result<(), DiskTargetError> {
    match inspect(path)? {
        c if c.is_blank() => Ok(()),
        Content::Lvstore => Err(DiskTargetError::AnLvstore {
            path: path.to_path_buf(),
        }),
        content => Err(DiskTargetError::Foreign {
            path: path.to_path_buf(),
            content,
        }),
    }
}

/// Zeroes the first and last MiB of `path` (every signature [`classify`]
/// knows lives there); refuses an lvstore, which is never wiped.
pub fn wipe(path: &Path) -> Result<(), DiskTargetError> {
    // blank: nothing to wipe; an lvstore (or what cannot be read): refused
    match check_blank(path) {
        Ok(()) => return Ok(()),
        Err(DiskTargetError::Foreign { .. }) => {}
        Err(e) => return Err(e),
    }
    let io = |source| DiskTargetError::Inspect {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_EXCL)
        .open(path)
        .map_err(io)?;
    let len = f.seek(SeekFrom::End(0)).map_err(io)?;
    let zeros = vec![0u8; usize::try_from(EDGE).unwrap_or(1 << 20)];
    for at in [0, len.saturating_sub(EDGE)] {
        let n = usize::try_from((len - at).min(EDGE)).unwrap_or(0);
        f.seek(SeekFrom::Start(at)).map_err(io)?;
        f.write_all(&zeros[..n]).map_err(io)?;
    }
    f.sync_all().map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, len: u64, writes: &[(u64, &[u8])]) -> PathBuf {
        let p = dir.join(name);
        let mut f = File::create(&p).expect("create");
        f.set_len(len).expect("len");
        for (at, b) in writes {
            f.seek(SeekFrom::Start(*at)).expect("seek");
            f.write_all(b).expect("write");
        }
        p
    }

    #[test]
    fn zeros_and_lvstores_are_accepted_data_and_signatures_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        assert_eq!(
            check(&d.join("absent.img"), false).expect("absent"),
            Content::Absent
        );
        // `truncate -s 4G`: only zeros, and nothing is read but its ends
        let sparse = file(d, "sparse.img", 4 << 30, &[]);
        assert_eq!(check(&sparse, false).expect("sparse"), Content::Zeros);
        assert_eq!(
            check(&file(d, "empty.img", 0, &[]), false).expect("empty"),
            Content::Zeros
        );
        let lvs = file(d, "lvs.img", 64 << 20, &[(0, BLOBSTORE_SIGNATURE)]);
        assert_eq!(check(&lvs, false).expect("lvstore"), Content::Lvstore);
        let cases: [(&str, u64, u64, &[u8], &str); 6] = [
            (
                "ext4.img",
                64 << 20,
                1080,
                &[0x53, 0xef],
                "an ext2/3/4 file system",
            ),
            ("xfs.img", 64 << 20, 0, b"XFSB", "an XFS file system"),
            (
                "gpt.img",
                64 << 20,
                (64 << 20) - 512,
                b"EFI PART",
                "a GPT partition table (its backup header)",
            ),
            (
                "md10.img",
                64 << 20,
                (64 << 20) - 8192,
                &0xa92b_4efc_u32.to_le_bytes(),
                "an md RAID member",
            ),
            ("luks.img", 64 << 20, 0, b"LUKS\xba\xbe", "a LUKS volume"),
            (
                "small-gpt.img",
                1 << 20,
                (1 << 20) - 512,
                b"EFI PART",
                "a GPT partition table (its backup header)",
            ),
        ];
        for (name, len, at, magic, what) in cases {
            let p = file(d, name, len, &[(at, magic)]);
            let e = check(&p, false).expect_err(name);
            assert!(
                matches!(e, DiskTargetError::Foreign { content: Content::Signature(s), .. } if s == what),
                "{name}: {e:?}"
            );
            assert!(
                e.to_string().contains(name) && e.to_string().contains("--wipe"),
                "{e}"
            );
            assert!(check(&p, true).is_ok(), "{name} with wipe");
        }
        let db = file(d, "db.sqlite", 1 << 16, &[(0, b"SQLite format 3\0 precious")]);
        let e = check(&db, false).expect_err("data");
        assert!(
            matches!(
                e,
                DiskTargetError::Foreign {
                    content: Content::Data { at: 0 },
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("non-zero data at offset 0"), "{e}");
        // in the last MiB: named by its offset
        let end = file(d, "end.img", 4 << 20, &[((4 << 20) - 100, b"x")]);
        let e = check(&end, false).expect_err("data at the end");
        assert!(
            matches!(e, DiskTargetError::Foreign { content: Content::Data { at }, .. } if at == (4 << 20) - 100),
            "{e:?}"
        );
        // data past the first MiB and before the last is not looked at
        let mid = file(d, "mid.img", 64 << 20, &[(32 << 20, b"x")]);
        assert_eq!(check(&mid, false).expect("middle"), Content::Zeros);
        let e = check(d, false).expect_err("a directory");
        assert!(matches!(e, DiskTargetError::NotADisk { .. }), "{e:?}");
    }

    #[test]
    fn wipe_zeroes_both_ends_and_never_an_lvstore() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let len = 64u64 << 20;
        let p = file(
            d,
            "gpt.img",
            len,
            &[(512, b"EFI PART"), (len - 512, b"EFI PART"), (32 << 20, b"kept")],
        );
        wipe(&p).expect("wipe");
        assert_eq!(inspect(&p).expect("inspect"), Content::Zeros);
        assert_eq!(
            std::fs::metadata(&p).expect("meta").len(),
            len,
            "its size is kept"
        );
        let mut mid = [0u8; 4];
        let mut f = File::open(&p).expect("open");
        f.seek(SeekFrom::Start(32 << 20)).expect("seek");
        f.read_exact(&mut mid).expect("read");
        assert_eq!(&mid, b"kept", "only the ends are written");
        let lvs = file(d, "lvs.img", len, &[(0, BLOBSTORE_SIGNATURE)]);
        assert!(matches!(wipe(&lvs), Err(DiskTargetError::AnLvstore { .. })));
        assert!(matches!(
            check_blank(&lvs),
            Err(DiskTargetError::AnLvstore { .. })
        ));
        assert_eq!(inspect(&lvs).expect("inspect"), Content::Lvstore);
    }
}
