//! The kernel's mount tables, parsed once for every reader: `/proc/*/mountinfo`,
//! `/proc/mounts` and `/proc/swaps`.
//!
//! ```text
//!   mountinfo text ──parse_mountinfo──> [MountInfoEntry {dev, mount_point, fs_type, source}]
//!   /proc/mounts ────parse_mounts─────> [MountEntry {source, target, fs_type}]
//!   /proc/swaps ─────parse_swaps──────> ["/dev/sdb2", "/swapfile"]
//!                                         (fields octal-unescaped: "\040" is a space)
//! ```
//!
//! Why not the `procfs-core` crate: its 0.18 parser of `/proc/mounts` leaves
//! `\040` (a space) escaped, so a mount point with a space in its name would
//! not match; and it has no `/proc/swaps`. Its `/proc/net/tcp` parser is used
//! ([`super::net`]).

use std::path::Path;

/// One line of a mountinfo table (proc(5)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfoEntry {
    /// `major:minor` of the mounted device.
    pub dev: String,
    /// Where it is mounted.
    pub mount_point: String,
    /// The filesystem type (`ext4`, `devtmpfs`).
    pub fs_type: String,
    /// The mount source (`/dev/sda1`, `tmpfs`).
    pub source: String,
}

/// One line of `/proc/mounts` (fstab(5) form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The mount source (`/dev/sda1`, `hugetlbfs`).
    pub source: String,
    /// Where it is mounted.
    pub target: String,
    /// The filesystem type.
    pub fs_type: String,
}

/// The lines of a mountinfo table; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfoEntry> {
    text.lines()
        .filter_map(|line| {
            // the optional fields end at a lone "-"; escaped names hold no space
            let (pre, post) = line.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            Some(MountInfoEntry {
                dev: (*pre.get(2)?).to_string(),
                mount_point: unescape(pre.get(4)?),
                fs_type: unescape(post.next()?),
                source: unescape(post.next().unwrap_or_default()),
            })
        })
        .collect()
}

/// The lines of `/proc/mounts`; malformed lines are skipped.
pub fn parse_mounts(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            Some(MountEntry {
                source: unescape(f.next()?),
                target: unescape(f.next()?),
                fs_type: unescape(f.next()?),
            })
        })
        .collect()
}

/// The swap areas of `/proc/swaps` (its header skipped).
pub fn parse_swaps(text: &str) -> Vec<String> {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(unescape))
        .collect()
}

/// The filesystem type mounted at the deepest mount point containing `dir`
/// (the last such mount wins: it is the one on top).
pub fn fs_type_at(mountinfo: &[MountInfoEntry], dir: &Path) -> Option<String> {
    let mut best: Option<(usize, &str)> = None;
    for m in mountinfo {
        let mp = Path::new(&m.mount_point);
        if dir.starts_with(mp) {
            let depth = mp.components().count();
            if best.is_none_or(|(d, _)| depth >= d) {
                best = Some((depth, &m.fs_type));
            }
        }
    }
    best.map(|(_, t)| t.to_owned())
}

/// Decodes the octal escapes (`\040` space, `\011` tab, `\012` newline,
/// `\134` backslash) the kernel writes in mount tables.
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_parse_with_escapes() {
        let mi = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                  30 22 0:5 / /dev rw,nosuid master:2 shared:3 - devtmpfs udev rw\n\
                  31 22 0:40 / /mnt/my\\040disks rw - tmpfs tmpfs rw\n\
                  garbage\n";
        let e = parse_mountinfo(mi);
        assert_eq!(e.len(), 3);
        assert_eq!(
            e[1],
            MountInfoEntry {
                dev: "0:5".into(),
                mount_point: "/dev".into(),
                fs_type: "devtmpfs".into(),
                source: "udev".into(),
            }
        );
        assert_eq!(e[2].mount_point, "/mnt/my disks");
        assert_eq!(
            fs_type_at(&e, Path::new("/dev/shm/x")).as_deref(),
            Some("devtmpfs")
        );
        assert_eq!(
            fs_type_at(&e, Path::new("/mnt/my disks/a.img")).as_deref(),
            Some("tmpfs")
        );
        assert_eq!(fs_type_at(&e, Path::new("/var/x")).as_deref(), Some("ext4"));

        let m = parse_mounts("none /dev/huge\\040pages hugetlbfs rw 0 0\n/dev/sda1 / ext4 rw 0 0\n");
        assert_eq!(m[0].target, "/dev/huge pages");
        assert_eq!(
            (m[1].source.as_str(), m[1].fs_type.as_str()),
            ("/dev/sda1", "ext4")
        );

        let s = parse_swaps("Filename\tType\tSize\tUsed\tPriority\n/dev/sdb2 partition 1 0 -2\n");
        assert_eq!(s, ["/dev/sdb2"]);
        assert_eq!(unescape("a\\134b\\011c"), "a\\b\tc");
    }
}
