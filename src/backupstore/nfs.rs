//! NFS backup targets, as Longhorn names them: `nfs://<server>:/<export>`,
//! optionally `?nfsOptions=a,b` (or the key repeated). talon mounts the
//! share itself with mount(2) (there is no mount.nfs helper on Talos): it
//! resolves the server and gives the kernel `addr=`, and mounts NFSv4
//! trying 4.2, 4.1 and 4.0 with Longhorn's options (`actimeo=1,soft,
//! timeo=300,retry=2`) unless `nfsOptions` gives them. The store is then
//! the mounted folder, laid out as a `vfs://` target's.
//!
//! ```text
//!   nfs://srv.example:/exports/backups ──> <mount root>/srv_example/exports/backups
//!     already an NFS mount there ─> used
//!     else: srv.example resolved ─> mount("srv.example:/exports/backups", dir, "nfs4",
//!           "nfsvers=4.2,actimeo=1,soft,timeo=300,retry=2,addr=10.0.0.5") ─> 4.1 ─> 4.0
//! ```
//!
//! Every part that reaches the kernel's option string or a path is checked
//! first: the server is a host name or an IP address, the export an absolute
//! path of plain characters, each option `key` or `key=value` of plain
//! characters (no `,`); `addr` is talon's to set. Every share is mounted
//! `nosuid,nodev,noexec` (mount(2) flags, whatever the options say): a
//! target's URL may come from Longhorn's unauthenticated ports, and a share
//! holds files its server's owner wrote. `exec`, `suid` and `dev` in
//! `nfsOptions` are refused (they ask for what talon never grants), and
//! `noexec`, `nosuid` and `nodev` are dropped (they are flags, not NFS
//! options, and talon sets them). A share found mounted without those
//! flags (an older talon's) is remounted with them before it is used. Mounts stay (Longhorn's do
//! too); [`unmount_all`] removes them for `longhorn backup cleanup-all-mounts`
//! (the engine binary's call). The daemon never calls it: an unmount under a
//! running backup would send its writes to the folder beneath.

use std::net::{IpAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::BackupError;

/// Where shares are mounted unless `TALON_BACKUPSTORE_MOUNTS` says otherwise.
pub const DEFAULT_MOUNT_ROOT: &str = "/var/lib/talon/backupstore-mounts";
/// How long one mount attempt may take before the next (or an error).
const MOUNT_TIMEOUT: Duration = Duration::from_secs(10);
/// NFSv4 minor versions tried when the URL gives no options (Longhorn's order).
const MINOR_VERSIONS: [&str; 3] = ["4.2", "4.1", "4.0"];
/// The mount flags of every share: nothing on it runs, gains privileges or
/// opens a device.
pub const MOUNT_FLAGS: nix::mount::MsFlags = nix::mount::MsFlags::MS_NOSUID
    .union(nix::mount::MsFlags::MS_NODEV)
    .union(nix::mount::MsFlags::MS_NOEXEC);

/// A parsed NFS target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsTarget {
    /// Host name or IP address (an IPv6 address without brackets).
    pub server: String,
    /// The export's path on the server (absolute).
    pub export: String,
    /// Mount options from `nfsOptions` (none: Longhorn's, by version).
    pub options: Vec<String>,
}

fn plain(s: &str, extra: &[char]) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
}

impl NfsTarget {
    /// Parses what follows `nfs://`; `bad` makes the error naming the URL.
    pub fn parse(rest: &str, bad: impl Fn(&str) -> BackupError) -> Result<Self, BackupError> {
        let (main, query) = match rest.split_once('?') {
            Some((m, q)) => (m, Some(q)),
            None => (rest, None),
        };
        let (server, export) = if let Some(r) = main.strip_prefix('[') {
            let (ip, after) = r
                .split_once(']')
                .ok_or_else(|| bad("an IPv6 server needs its closing ']'"))?;
            let export = after
                .strip_prefix(':')
                .ok_or_else(|| bad("an NFS target is nfs://<server>:/<export>"))?;
            (ip, export)
        } else {
            main.split_once(':')
                .ok_or_else(|| bad("an NFS target is nfs://<server>:/<export>"))?
        };
        let server_ok = server.parse::<IpAddr>().is_ok()
            || (server.len() <= 253
                && server.split('.').all(|l| {
                    (1..=63).contains(&l.len())
                        && plain(l, &['-'])
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                }));
        if !server_ok {
            return Err(bad("the NFS server must be a host name or an IP address"));
        }
        let export_ok = export.starts_with('/')
            && export.len() <= 1024
            && export
                .split('/')
                .all(|p| p.is_empty() || (plain(p, &['_', '-', '.']) && p != "." && p != ".."));
        if !export_ok {
            return Err(bad(
                "the NFS export must be an absolute path of letters, digits, '_', '-' and '.' (no '.' or '..' parts)",
            ));
        }
        let mut options = Vec::new();
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            // the store's own query keys (a backup URL's) are not options
            if k != "nfsOptions" {
                continue;
            }
            for o in v.split(',').filter(|o| !o.is_empty()) {
                let (key, value) = o.split_once('=').unwrap_or((o, ""));
                if !plain(key, &['_', '.']) || !(value.is_empty() || plain(value, &['_', '.', '-', ':'])) {
                    return Err(bad(&format!(
                        "NFS option {o:?}: an option is key or key=value of letters, digits and '_.-:'"
                    )));
                }
                if key == "addr" {
                    return Err(bad(
                        "NFS option addr is set by talon (the server's resolved address)",
                    ));
                }
                match key {
                    "exec" | "suid" | "dev" => {
                        return Err(bad(&format!(
                            "NFS option {key} is refused: talon mounts every share nosuid,nodev,noexec"
                        )));
                    }
                    // the flags talon sets (mount(2) flags, not NFS options)
                    "noexec" | "nosuid" | "nodev" => continue,
                    _ => {}
                }
                options.push(o.to_owned());
            }
        }
        Ok(Self {
            server: server.to_owned(),
            export: export.to_owned(),
            options,
        })
    }

    /// The mount's source as the kernel takes it: `server:/export`
    /// (`[v6]:/export` for an IPv6 address).
    pub fn source(&self) -> String {
        if self.server.contains(':') {
            format!("[{}]:{}", self.server, self.export)
        } else {
            format!("{}:{}", self.server, self.export)
        }
    }

    /// Where it is mounted under `root`: `<root>/<server, '.' and ':' as
    /// '_'>/<export>`.
    pub fn mount_dir(&self, root: &Path) -> PathBuf {
        let host = self.server.replace(['.', ':'], "_");
        root.join(host).join(self.export.trim_start_matches('/'))
    }

    /// The option strings tried in turn, each with `addr=<ip>`.
    pub fn attempts(&self, addr: IpAddr) -> Vec<String> {
        if self.options.is_empty() {
            MINOR_VERSIONS
                .iter()
                .map(|v| format!("nfsvers={v},actimeo=1,soft,timeo=300,retry=2,addr={addr}"))
                .collect()
        } else {
            vec![format!("{},addr={addr}", self.options.join(","))]
        }
    }
}

/// The folder shares are mounted under.
pub fn mount_root() -> PathBuf {
    std::env::var_os("TALON_BACKUPSTORE_MOUNTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_MOUNT_ROOT))
}

/// The NFS mounts of this mount namespace: (mount point, source), from
/// `/proc/self/mountinfo`.
fn nfs_mounts() -> Vec<(PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    crate::host::mounts::parse_mountinfo(&text)
        .into_iter()
        .filter(|m| m.fs_type.starts_with("nfs"))
        .map(|m| (PathBuf::from(m.mount_point), m.source))
        .collect()
}

/// Mounts `t` (unless it is mounted already) and gives its folder.
pub fn ensure_mounted(t: &NfsTarget, url: &str) -> Result<PathBuf, BackupError> {
    let dir = t.mount_dir(&mount_root());
    let failed = |reason: String| BackupError::Target {
        url: super::error::redact_urls(url),
        reason,
    };
    if nfs_mounts().iter().any(|(p, _)| *p == dir) {
        harden(&dir).map_err(|e| failed(format!("remounting {} nosuid,nodev,noexec: {e}", dir.display())))?;
        return Ok(dir);
    }
    let addr = blocking(|| (t.server.as_str(), 2049).to_socket_addrs())
        .map_err(|e| failed(format!("resolving NFS server {}: {e}", t.server)))?
        .map(|a| a.ip())
        .next()
        .ok_or_else(|| failed(format!("NFS server {} has no address", t.server)))?;
    std::fs::create_dir_all(&dir).map_err(|e| failed(format!("making {}: {e}", dir.display())))?;
    let source = t.source();
    let mut tried = Vec::new();
    for data in t.attempts(addr) {
        match blocking(|| mount_bounded(&source, &dir, &data)) {
            Ok(()) => {
                tracing::info!(source = %source, dir = %dir.display(), options = %data, "NFS backup target mounted");
                return Ok(dir);
            }
            Err(e) => tried.push(format!("{data}: {e}")),
        }
    }
    let _ = std::fs::remove_dir(&dir);
    Err(failed(format!(
        "mounting NFS share {source} on {} failed: {}",
        dir.display(),
        tried.join("; ")
    )))
}

/// Makes the mount at `dir` nosuid, nodev and noexec if it is not (a
/// bind remount changes only those per-mount flags; its others are kept).
fn harden(dir: &Path) -> Result<(), nix::Error> {
    use nix::sys::statvfs::FsFlags;
    let have = blocking(|| nix::sys::statvfs::statvfs(dir))?.flags();
    if have.contains(FsFlags::ST_NOSUID | FsFlags::ST_NODEV | FsFlags::ST_NOEXEC) {
        return Ok(());
    }
    use nix::mount::MsFlags;
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MOUNT_FLAGS;
    for (st, ms) in [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if have.contains(st) {
            flags |= ms;
        }
    }
    blocking(|| nix::mount::mount(None::<&str>, dir, None::<&str>, flags, None::<&str>))?;
    tracing::info!(dir = %dir.display(), "NFS backup target remounted nosuid,nodev,noexec");
    Ok(())
}

/// Runs `f`, which may block for seconds, without stalling the other tasks
/// of a multi-threaded runtime it is called from.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// One mount(2), in a thread so a server that does not answer costs at
/// most [`MOUNT_TIMEOUT`] (the mount itself may still end later).
fn mount_bounded(source: &str, dir: &Path, data: &str) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (source, dir, data) = (source.to_owned(), dir.to_owned(), data.to_owned());
    std::thread::spawn(move || {
        let r = nix::mount::mount(
            Some(source.as_str()),
            &dir,
            Some("nfs4"),
            MOUNT_FLAGS,
            Some(data.as_str()),
        );
        let _ = tx.send(r);
    });
    match rx.recv_timeout(MOUNT_TIMEOUT) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(nix::errno::Errno::ENODEV)) => Err("the kernel has no NFSv4 client (module nfsv4)".into()),
        Ok(Err(e)) => Err(e.desc().to_owned()),
        Err(_) => Err(format!("no answer in {} s", MOUNT_TIMEOUT.as_secs())),
    }
}

/// Unmounts every NFS share under the mount root (lazily: a share whose
/// server is gone does not hang it); what could not be unmounted.
pub fn unmount_all() -> Vec<String> {
    let root = mount_root();
    let mut failed = Vec::new();
    for (p, source) in nfs_mounts() {
        if !p.starts_with(&root) {
            continue;
        }
        match nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) => {
                tracing::info!(source = %source, dir = %p.display(), "NFS backup target unmounted");
                let _ = std::fs::remove_dir(&p);
            }
            Err(e) => failed.push(format!("{}: {e}", p.display())),
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(rest: &str) -> Result<NfsTarget, String> {
        NfsTarget::parse(rest, |r| BackupError::Target {
            url: format!("nfs://{rest}"),
            reason: r.to_owned(),
        })
        .map_err(|e| e.to_string())
    }

    #[test]
    fn longhorn_nfs_urls_parse_to_a_source_a_folder_and_options() {
        let t = parse("longhorn-test-nfs-svc.default:/opt/backupstore").expect("parse");
        assert_eq!(t.source(), "longhorn-test-nfs-svc.default:/opt/backupstore");
        assert_eq!(
            t.mount_dir(Path::new("/m")),
            Path::new("/m/longhorn-test-nfs-svc_default/opt/backupstore")
        );
        let ip: IpAddr = "10.0.0.5".parse().expect("ip");
        assert_eq!(
            t.attempts(ip),
            [
                "nfsvers=4.2,actimeo=1,soft,timeo=300,retry=2,addr=10.0.0.5",
                "nfsvers=4.1,actimeo=1,soft,timeo=300,retry=2,addr=10.0.0.5",
                "nfsvers=4.0,actimeo=1,soft,timeo=300,retry=2,addr=10.0.0.5",
            ]
        );
        // both of Longhorn's spellings of the options; a backup URL's own keys are not options
        for q in [
            "nfsOptions=nfsvers=4.1,soft,timeo=450",
            "nfsOptions=nfsvers=4.1&nfsOptions=soft&nfsOptions=timeo=450&backup=b&volume=v",
        ] {
            let t = parse(&format!("10.0.0.1:/b?{q}")).expect("parse");
            assert_eq!(t.options, ["nfsvers=4.1", "soft", "timeo=450"], "{q}");
            assert_eq!(t.attempts(ip), ["nfsvers=4.1,soft,timeo=450,addr=10.0.0.5"]);
        }
        // the flags talon sets anyway are dropped from the options, and set on every mount
        let t = parse("10.0.0.1:/b?nfsOptions=nosuid,soft,nodev,noexec").expect("parse");
        assert_eq!(t.options, ["soft"]);
        use nix::mount::MsFlags;
        assert!(MOUNT_FLAGS.contains(MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC));
        let t = parse("[fd00::5]:/b").expect("parse");
        assert_eq!(
            (t.server.as_str(), t.source()),
            ("fd00::5", "[fd00::5]:/b".into())
        );
        assert_eq!(t.mount_dir(Path::new("/m")), Path::new("/m/fd00__5/b"));
    }

    /// The remount of a share found mounted without the flags, on a tmpfs
    /// (a bind remount does not depend on the file system).
    #[test]
    fn a_mount_found_without_the_flags_is_remounted_with_them() {
        use nix::mount::{MntFlags, MsFlags};
        use nix::sys::statvfs::{FsFlags, statvfs};
        let d = tempfile::tempdir().expect("tempdir");
        if let Err(e) = nix::mount::mount(
            Some("tmpfs"),
            d.path(),
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=1m"),
        ) {
            eprintln!("SKIP a_mount_found_without_the_flags_is_remounted_with_them: mounting a tmpfs: {e}");
            return;
        }
        let before = statvfs(d.path()).expect("statvfs").flags();
        let r = harden(d.path());
        let after = statvfs(d.path()).expect("statvfs").flags();
        let again = harden(d.path());
        let _ = nix::mount::umount2(d.path(), MntFlags::MNT_DETACH);
        let all = FsFlags::ST_NOSUID | FsFlags::ST_NODEV | FsFlags::ST_NOEXEC;
        assert!(!before.contains(all), "{before:?}");
        r.expect("remounted");
        again.expect("a mount with the flags is left as it is");
        assert!(after.contains(all), "{after:?}");
    }

    #[test]
    fn nfs_targets_that_would_reach_the_kernel_or_a_path_unchecked_are_refused() {
        for (rest, why) in [
            ("server/path", "nfs://<server>:/<export>"),
            ("bad_host:/x", "host name or an IP address"),
            ("-x:/y", "host name or an IP address"),
            ("h:relative", "absolute path"),
            ("h:/a/../b", "absolute path"),
            ("h:/a b", "absolute path"),
            ("h:/x?nfsOptions=soft,addr=1.2.3.4", "addr is set by talon"),
            ("h:/x?nfsOptions=vers=4.2,sec=sys%2Cfoo", "NFS option"),
            ("h:/x?nfsOptions=a b", "NFS option"),
            ("h:/x?nfsOptions=soft,exec", "NFS option exec is refused"),
            ("h:/x?nfsOptions=suid", "NFS option suid is refused"),
            (
                "h:/x?nfsOptions=nfsvers=4.1&nfsOptions=dev",
                "NFS option dev is refused",
            ),
            ("[fd00::1:/x", "closing ']'"),
        ] {
            let e = parse(rest).expect_err(rest);
            assert!(e.contains(why), "{rest}: {e}");
            assert!(e.contains(&format!("\"nfs://{rest}\"")), "names the URL: {e}");
        }
    }
}
