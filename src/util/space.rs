//! Room on a filesystem, for the errors of writes that did not fit: a full
//! data dir says "no space left on <dir>" with the sizes, never a bare
//! "Input/output error" (what an aio bdev reports for a write the kernel
//! refused with ENOSPC).
//!
//! ```text
//!   a write failed ── is_no_space(e)? ──> no_space(dir, need) ─> "no space left on <dir>: 3 MiB free of 32 MiB, ..."
//!   a copy failed  ── short_of(dir, need, held) ──> Some(that text) when the data could not fit
//! ```

use std::io;
use std::path::Path;

use super::size::human_bytes as human;

/// A filesystem's free (for an unprivileged writer, as `df` shows) and total bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Bytes free.
    pub free: u64,
    /// Bytes in all.
    pub total: u64,
}

/// The room on the filesystem that holds `path` (or its nearest existing
/// ancestor); `None` when none can be read.
pub fn room(path: &Path) -> Option<Room> {
    let mut at = Some(path);
    while let Some(p) = at {
        if let Ok(s) = nix::sys::statvfs::statvfs(p) {
            let unit = s.fragment_size();
            return Some(Room {
                free: s.blocks_available().saturating_mul(unit),
                total: s.blocks().saturating_mul(unit),
            });
        }
        at = p.parent();
    }
    None
}

/// Whether `e` is the kernel's "no space left on device" (ENOSPC, or a
/// quota's EDQUOT).
pub fn is_no_space(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    ) || e.raw_os_error() == Some(nix::errno::Errno::ENOSPC as i32)
}

/// "no space left on `dir`" with its room and, when known, what the write
/// needed.
pub fn no_space(dir: &Path, need: Option<u64>) -> String {
    let mut s = format!("no space left on {}", dir.display());
    if let Some(r) = room(dir) {
        s.push_str(&format!(": {} free of {}", human(r.free), human(r.total)));
    }
    if let Some(n) = need {
        s.push_str(&format!(", {} needed", human(n)));
    }
    s
}

/// After a copy of up to `need` bytes into a file under `dir` failed, with
/// `held` bytes of it written: the [`no_space`] text when the rest cannot
/// fit in what the filesystem has free (the copy's failure was then a full
/// disk, whatever its error said); `None` when it could.
pub fn short_of(dir: &Path, need: u64, held: u64) -> Option<String> {
    let r = room(dir)?;
    (r.free < need.saturating_sub(held)).then(|| no_space(dir, Some(need)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_units_and_enospc_is_no_space() {
        assert!(is_no_space(&io::Error::from_raw_os_error(
            nix::errno::Errno::ENOSPC as i32
        )));
        assert!(!is_no_space(&io::Error::from_raw_os_error(
            nix::errno::Errno::EIO as i32
        )));
        let t = tempfile::tempdir().expect("tempdir");
        let r = room(&t.path().join("not/made/yet")).expect("the room of an ancestor");
        assert!(r.total >= r.free && r.total > 0, "{r:?}");
        let m = no_space(t.path(), Some(1 << 20));
        assert!(
            m.starts_with(&format!("no space left on {}: ", t.path().display()))
                && m.ends_with("1 MiB needed"),
            "{m}"
        );
        assert_eq!(short_of(t.path(), 0, 0), None, "nothing needed always fits");
        assert!(
            short_of(t.path(), u64::MAX, 0).is_some(),
            "more than any disk never fits"
        );
    }
}
