//! Targets, namespace sets, and opening a target's namespace files.
//!
//! ```text
//!  Target::Process("iscsid") ──scan <root>/proc/*/{comm,cmdline,stat}──> pid (oldest match)
//!        │                                   ▲
//!        ▼                                   │ ENOENT/ESRCH or identity changed: re-resolve
//!  open <root>/proc/<pid>  (dir fd pins this process instance)
//!        └─ openat ns/{ipc,uts,net,pid,mnt}  (O_RDONLY|O_CLOEXEC)  ──> TargetNamespaces
//! ```

use std::fmt;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sched::CloneFlags;
use nix::sys::stat::{Mode, fstat};

use super::NsError;
use crate::util::HostRoot;

/// How many times a process found by name is re-resolved when it exits while its
/// namespace files are being opened (iscsid restarting, for example).
pub const MAX_RESOLVE_ATTEMPTS: u32 = 5;

/// Whose namespaces to enter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// The host: pid 1 as seen through the host root.
    Host,
    /// A process id (in the pid namespace of the host root's `/proc`).
    Pid(u32),
    /// A process found by name: its `comm`, or the base name of its `argv[0]`
    /// (`"iscsid"`, `"kubelet"`). The oldest matching process wins.
    Process(String),
}

impl Target {
    /// The target as written on a command line: `host`, a pid, or a process name.
    pub fn parse(s: &str) -> Result<Self, NsError> {
        let s = s.trim();
        let invalid = |reason| NsError::ParseTarget {
            input: s.to_string(),
            reason,
        };
        if s.is_empty() {
            return Err(invalid("it is empty"));
        }
        if s == "host" {
            return Ok(Self::Host);
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            return match s.parse::<u32>() {
                Ok(0) => Err(invalid("pid 0 is not a process")),
                Ok(pid) => Ok(Self::Pid(pid)),
                Err(_) => Err(invalid("the pid is out of range")),
            };
        }
        if s.contains('/') || s.contains('\0') {
            return Err(invalid("a process name cannot contain '/' or NUL"));
        }
        if s.len() > 255 {
            return Err(invalid("a process name is at most 255 bytes"));
        }
        Ok(Self::Process(s.to_string()))
    }
}

impl FromStr for Target {
    type Err = NsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Host => write!(f, "host (pid 1)"),
            Self::Pid(pid) => write!(f, "pid {pid}"),
            Self::Process(name) => write!(f, "process {name:?}"),
        }
    }
}

/// One kind of namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NsKind {
    Ipc,
    Uts,
    Net,
    Pid,
    Mnt,
}

impl NsKind {
    /// The order in which namespaces are entered (that of nsenter).
    pub const ORDER: [NsKind; 5] = [Self::Ipc, Self::Uts, Self::Net, Self::Pid, Self::Mnt];

    /// The file name under `/proc/<pid>/ns/`, also used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ipc => "ipc",
            Self::Uts => "uts",
            Self::Net => "net",
            Self::Pid => "pid",
            Self::Mnt => "mnt",
        }
    }

    /// The clone flag that `setns` expects for this kind.
    pub fn clone_flag(self) -> CloneFlags {
        match self {
            Self::Ipc => CloneFlags::CLONE_NEWIPC,
            Self::Uts => CloneFlags::CLONE_NEWUTS,
            Self::Net => CloneFlags::CLONE_NEWNET,
            Self::Pid => CloneFlags::CLONE_NEWPID,
            Self::Mnt => CloneFlags::CLONE_NEWNS,
        }
    }
}

/// A set of namespaces to enter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Namespaces {
    pub mnt: bool,
    pub net: bool,
    pub ipc: bool,
    pub uts: bool,
    /// Only affects children forked afterwards (the kernel moves no running task
    /// into a pid namespace).
    pub pid: bool,
}

impl Namespaces {
    /// mnt, net, ipc and uts: what host work usually needs.
    pub const ALL_BUT_PID: Self = Self {
        mnt: true,
        net: true,
        ipc: true,
        uts: true,
        pid: false,
    };
    /// Every supported namespace.
    pub const ALL: Self = Self {
        mnt: true,
        net: true,
        ipc: true,
        uts: true,
        pid: true,
    };
    /// The mount namespace only (file access).
    pub const MNT: Self = Self {
        mnt: true,
        net: false,
        ipc: false,
        uts: false,
        pid: false,
    };
    /// The network namespace only.
    pub const NET: Self = Self {
        mnt: false,
        net: true,
        ipc: false,
        uts: false,
        pid: false,
    };

    /// Parses a comma-separated list: `"mnt,net,ipc,uts"`. Accepts `mnt`/`mount`,
    /// `net`/`network`, `ipc`, `uts`, `pid`, and `all`.
    pub fn parse(s: &str) -> Result<Self, NsError> {
        let invalid = |reason: String| NsError::ParseNamespaces {
            input: s.to_string(),
            reason,
        };
        let mut out = Self {
            mnt: false,
            net: false,
            ipc: false,
            uts: false,
            pid: false,
        };
        for word in s.split(',').map(str::trim) {
            match word {
                "mnt" | "mount" => out.mnt = true,
                "net" | "network" => out.net = true,
                "ipc" => out.ipc = true,
                "uts" => out.uts = true,
                "pid" => out.pid = true,
                "all" => out = Self::ALL,
                "" => return Err(invalid("it has an empty entry".to_string())),
                other => {
                    return Err(invalid(format!(
                        "{other:?} is not one of mnt, net, ipc, uts, pid, all"
                    )));
                }
            }
        }
        Ok(out)
    }

    /// Whether `kind` is in the set.
    pub fn contains(self, kind: NsKind) -> bool {
        match kind {
            NsKind::Ipc => self.ipc,
            NsKind::Uts => self.uts,
            NsKind::Net => self.net,
            NsKind::Pid => self.pid,
            NsKind::Mnt => self.mnt,
        }
    }

    /// The selected kinds, in entering order.
    pub fn kinds(self) -> impl Iterator<Item = NsKind> {
        NsKind::ORDER.into_iter().filter(move |k| self.contains(*k))
    }
}

impl FromStr for Namespaces {
    type Err = NsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Namespaces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.kinds().map(NsKind::name).collect();
        if names.is_empty() {
            write!(f, "none")
        } else {
            write!(f, "{}", names.join(","))
        }
    }
}

/// One opened namespace file.
#[derive(Debug)]
pub(crate) struct NsFd {
    pub(crate) kind: NsKind,
    pub(crate) fd: OwnedFd,
    /// (st_dev, st_ino) of the namespace, to skip namespaces the thread is already in.
    pub(crate) id: (u64, u64),
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) label: String,
    pub(crate) pid: u32,
    pub(crate) fds: Vec<NsFd>,
}

/// The namespace files of one target, opened once (O_CLOEXEC). They keep the
/// namespaces alive even after the target process exits. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TargetNamespaces {
    pub(crate) inner: Arc<Inner>,
}

impl TargetNamespaces {
    /// Resolves `target` under `root` and opens the namespace files in `nss`.
    /// A process found by name that exits mid-way is re-resolved, up to
    /// [`MAX_RESOLVE_ATTEMPTS`] times.
    pub fn open(root: &HostRoot, target: &Target, nss: Namespaces) -> Result<Self, NsError> {
        open_with(root, target, nss, |attempt| resolve(root, target, attempt))
    }

    /// The pid the namespaces were opened from.
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// The target as it appears in messages: `process "iscsid" (pid 812)`.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// The namespace kinds held.
    pub fn kinds(&self) -> impl Iterator<Item = NsKind> + '_ {
        self.inner.fds.iter().map(|n| n.kind)
    }

    /// The namespaces the calling thread is not already in: (kind, raw fd).
    pub(crate) fn to_enter(&self) -> Result<Vec<(NsKind, i32)>, NsError> {
        let mut out = Vec::with_capacity(self.inner.fds.len());
        for n in &self.inner.fds {
            if !self.same_as_current(n)? {
                out.push((n.kind, n.fd.as_raw_fd()));
            }
        }
        Ok(out)
    }

    fn same_as_current(&self, n: &NsFd) -> Result<bool, NsError> {
        let own = PathBuf::from(format!("/proc/thread-self/ns/{}", n.kind.name()));
        match fs::metadata(&own) {
            Ok(m) => Ok((m.dev(), m.ino()) == n.id),
            // No procfs for ourselves: we cannot tell, so enter.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(NsError::OpenNamespace { path: own, source }),
        }
    }

    /// Moves the calling thread into the namespaces: `unshare(CLONE_FS)` first (the
    /// kernel refuses a mount-namespace switch to a thread sharing its fs_struct),
    /// then `setns` for every namespace the thread is not already in.
    ///
    /// The thread must never go back to serving other work: it is only called on
    /// the dedicated threads of [`super::run_in`] and of the pid-namespace spawner.
    pub(crate) fn enter_current_thread(&self) -> Result<(), NsError> {
        let label = &self.inner.label;
        nix::sched::unshare(CloneFlags::CLONE_FS).map_err(|e| NsError::UnshareFs {
            target: label.clone(),
            source: e.into(),
        })?;
        for n in &self.inner.fds {
            if self.same_as_current(n)? {
                continue;
            }
            nix::sched::setns(n.fd.as_fd(), n.kind.clone_flag())
                .map_err(|errno| enter_error(n.kind, label, errno))?;
        }
        Ok(())
    }
}

pub(crate) fn enter_error(kind: NsKind, label: &str, errno: Errno) -> NsError {
    let source = io::Error::from(errno);
    if errno == Errno::EPERM {
        NsError::EnterDenied {
            ns: kind.name(),
            target: label.to_string(),
            source,
        }
    } else {
        NsError::Enter {
            ns: kind.name(),
            target: label.to_string(),
            source,
        }
    }
}

/// What a resolution attempt produced.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub(crate) pid: u32,
    /// The name the process must still carry when its files are opened.
    pub(crate) name: Option<String>,
}

/// Why opening a pid's namespace files failed.
#[derive(Debug)]
pub(crate) enum OpenFailure {
    /// The process is gone (or the pid now belongs to another process).
    Vanished(PathBuf),
    Other(NsError),
}

/// The open loop, with the resolver injectable so the retry path is testable.
pub(crate) fn open_with(
    root: &HostRoot,
    target: &Target,
    nss: Namespaces,
    mut resolver: impl FnMut(u32) -> Result<Resolved, NsError>,
) -> Result<TargetNamespaces, NsError> {
    let mut last_missing = root.path("/proc");
    for attempt in 1..=MAX_RESOLVE_ATTEMPTS {
        let resolved = match resolver(attempt) {
            Ok(r) => r,
            Err(NsError::ProcessNotFound { .. }) if attempt > 1 => {
                return Err(NsError::TargetVanished {
                    target: target.to_string(),
                    attempts: attempt - 1,
                    path: last_missing,
                });
            }
            Err(e) => return Err(e),
        };
        let label = match target {
            Target::Process(name) => format!("process {name:?} (pid {})", resolved.pid),
            other => other.to_string(),
        };
        match open_pid(root, resolved.pid, resolved.name.as_deref(), nss, &label) {
            Ok(fds) => {
                return Ok(TargetNamespaces {
                    inner: Arc::new(Inner {
                        label,
                        pid: resolved.pid,
                        fds,
                    }),
                });
            }
            Err(OpenFailure::Vanished(path)) => match target {
                Target::Process(_) => last_missing = path,
                _ => return Err(NsError::TargetMissing { target: label, path }),
            },
            Err(OpenFailure::Other(e)) => return Err(e),
        }
    }
    Err(NsError::TargetVanished {
        target: target.to_string(),
        attempts: MAX_RESOLVE_ATTEMPTS,
        path: last_missing,
    })
}

fn is_gone(errno: Errno) -> bool {
    matches!(errno, Errno::ENOENT | Errno::ESRCH)
}

/// Opens `<root>/proc/<pid>` and the selected namespace files relative to it, so
/// that all of them come from one process instance even if the pid is reused.
fn open_pid(
    root: &HostRoot,
    pid: u32,
    expect_name: Option<&str>,
    nss: Namespaces,
    label: &str,
) -> Result<Vec<NsFd>, OpenFailure> {
    let dir_path = root.path(format!("/proc/{pid}"));
    let dir = match open(
        &dir_path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) if is_gone(e) => return Err(OpenFailure::Vanished(dir_path)),
        Err(e) => {
            return Err(OpenFailure::Other(NsError::OpenNamespace {
                path: dir_path,
                source: e.into(),
            }));
        }
    };
    let mut fds = Vec::new();
    for kind in nss.kinds() {
        let rel = format!("ns/{}", kind.name());
        let path = dir_path.join(&rel);
        let fd = match openat(
            &dir,
            rel.as_str(),
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) if is_gone(e) => return Err(OpenFailure::Vanished(path)),
            Err(e @ (Errno::EACCES | Errno::EPERM)) => {
                return Err(OpenFailure::Other(NsError::OpenDenied {
                    ns: kind.name(),
                    path,
                    target: label.to_string(),
                    source: e.into(),
                }));
            }
            Err(e) => {
                return Err(OpenFailure::Other(NsError::OpenNamespace {
                    path,
                    source: e.into(),
                }));
            }
        };
        let st = fstat(&fd).map_err(|e| {
            OpenFailure::Other(NsError::OpenNamespace {
                path,
                source: e.into(),
            })
        })?;
        #[allow(clippy::unnecessary_cast)] // st_dev/st_ino widths differ between targets
        fds.push(NsFd {
            kind,
            fd,
            id: (st.st_dev as u64, st.st_ino as u64),
        });
    }
    // The pid may have been reused by another program between resolution and open:
    // the directory fd pins one instance, so check its identity now.
    if let Some(name) = expect_name {
        match identity_at(&dir) {
            Some(id) if id.matches(name) && !id.zombie => {}
            _ => return Err(OpenFailure::Vanished(dir_path)),
        }
    }
    Ok(fds)
}

/// What identifies a process when looking for it by name.
#[derive(Debug, Default)]
pub(crate) struct Identity {
    comm: String,
    argv0_base: String,
    zombie: bool,
    start_time: u64,
}

impl Identity {
    fn matches(&self, name: &str) -> bool {
        self.comm == name || self.argv0_base == name
    }
}

fn read_at(dir: &OwnedFd, file: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let fd = openat(dir, file, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    let mut buf = Vec::new();
    fs::File::from(fd).read_to_end(&mut buf).ok()?;
    Some(buf)
}

fn identity_at(dir: &OwnedFd) -> Option<Identity> {
    let comm = read_at(dir, "comm")?;
    let cmdline = read_at(dir, "cmdline").unwrap_or_default();
    let stat = read_at(dir, "stat").unwrap_or_default();
    Some(parse_identity(&comm, &cmdline, &stat))
}

fn parse_identity(comm: &[u8], cmdline: &[u8], stat: &[u8]) -> Identity {
    let comm = String::from_utf8_lossy(comm).trim_end_matches('\n').to_string();
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    let argv0 = String::from_utf8_lossy(argv0);
    let argv0_base = Path::new(argv0.as_ref())
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // stat: "pid (comm) state ppid ... starttime(22nd field)"; comm may hold spaces
    // and parentheses, so split after the last ')'.
    let stat = String::from_utf8_lossy(stat);
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let zombie = matches!(fields.first(), Some(&"Z") | Some(&"X"));
    // fields[0] is field 3 (state), so field 22 is fields[19].
    let start_time = fields.get(19).and_then(|s| s.parse().ok()).unwrap_or(u64::MAX);
    Identity {
        comm,
        argv0_base,
        zombie,
        start_time,
    }
}

/// Resolves a target to a pid: `Host` is pid 1, `Pid` is itself, `Process` is the
/// oldest live process whose comm or argv[0] base name equals the name.
pub(crate) fn resolve(root: &HostRoot, target: &Target, _attempt: u32) -> Result<Resolved, NsError> {
    match target {
        Target::Host => Ok(Resolved { pid: 1, name: None }),
        Target::Pid(pid) => Ok(Resolved {
            pid: *pid,
            name: None,
        }),
        Target::Process(name) => find_process(root, name).map(|pid| Resolved {
            pid,
            name: Some(name.clone()),
        }),
    }
}

/// The oldest live process named `name` under `<root>/proc`.
pub fn find_process(root: &HostRoot, name: &str) -> Result<u32, NsError> {
    let proc_dir = root.path("/proc");
    let rd = fs::read_dir(&proc_dir).map_err(|source| NsError::ListProcesses {
        path: proc_dir.clone(),
        source,
    })?;
    // Skip ourselves (a talon named like its target), when /proc is in our pid namespace.
    let own = if root.is_real() { std::process::id() } else { 0 };
    let mut best: Option<(u64, u32)> = None;
    for entry in rd {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == own {
            continue;
        }
        let Ok(dir) = open(
            &entry.path(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue; // exited while scanning
        };
        let Some(id) = identity_at(&dir) else { continue };
        if id.zombie || !id.matches(name) {
            continue;
        }
        let key = (id.start_time, pid);
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    }
    best.map(|(_, pid)| pid).ok_or_else(|| NsError::ProcessNotFound {
        name: name.to_string(),
        proc_dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_namespace_lists_and_rejects_unknown_names() {
        assert_eq!(
            Namespaces::parse("mnt,net,ipc,uts").expect("parse"),
            Namespaces::ALL_BUT_PID
        );
        assert_eq!(
            Namespaces::parse(" mount , network").expect("parse").to_string(),
            "net,mnt"
        );
        assert_eq!(Namespaces::parse("all").expect("all"), Namespaces::ALL);
        let err = Namespaces::parse("mnt,usr").expect_err("usr");
        assert!(err.to_string().contains("\"usr\""), "{err}");
        assert!(Namespaces::parse("").is_err());
        assert!(Namespaces::parse("mnt,,net").is_err());
    }

    #[test]
    fn parses_targets() {
        assert_eq!(Target::parse("host").expect("host"), Target::Host);
        assert_eq!(Target::parse("812").expect("pid"), Target::Pid(812));
        assert_eq!(
            Target::parse("iscsid").expect("name"),
            Target::Process("iscsid".into())
        );
        assert!(Target::parse("0").is_err());
        assert!(Target::parse("../x").is_err());
        assert!(Target::parse("99999999999").is_err());
        assert_eq!(
            Target::Process("kubelet".into()).to_string(),
            "process \"kubelet\""
        );
    }

    #[test]
    fn parses_identity_from_proc_files() {
        let stat = b"812 (isc (si) d) S 1 812 812 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 4242 1000 1";
        let id = parse_identity(b"isc (si) d\n", b"/usr/local/sbin/iscsid\0-f\0", stat);
        assert!(id.matches("iscsid"));
        assert!(id.matches("isc (si) d"));
        assert!(!id.zombie);
        assert_eq!(id.start_time, 4242);
        let z = parse_identity(
            b"x\n",
            b"",
            b"9 (x) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 77",
        );
        assert!(z.zombie);
    }

    #[test]
    fn fixture_root_without_the_process_names_the_missing_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("proc")).expect("mkdir");
        let root = HostRoot::new(dir.path());
        let err = TargetNamespaces::open(&root, &Target::Pid(4242), Namespaces::MNT).expect_err("missing");
        let msg = err.to_string();
        assert!(msg.contains("pid 4242") && msg.contains("/proc/4242"), "{msg}");
        let err = TargetNamespaces::open(&root, &Target::Process("iscsid".into()), Namespaces::MNT)
            .expect_err("missing");
        assert!(matches!(err, NsError::ProcessNotFound { .. }), "{err:?}");
        assert!(
            err.to_string().contains("iscsid") && err.to_string().contains("/proc"),
            "{err}"
        );
    }

    /// A process found by name exits between resolution and open: the open loop
    /// re-resolves and succeeds on the next live pid. Real processes: a reaped
    /// child (its pid is gone) and ourselves-compatible `sleep`.
    #[test]
    fn re_resolves_a_process_that_vanished_mid_way() {
        let mut gone = std::process::Command::new("true").spawn().expect("spawn true");
        let gone_pid = gone.id();
        gone.wait().expect("wait");
        let mut live = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let root = HostRoot::real();
        let target = Target::Process("sleep".into());
        let mut calls = 0;
        let res = open_with(&root, &target, Namespaces::NET, |_| {
            calls += 1;
            let pid = if calls == 1 { gone_pid } else { live.id() };
            Ok(Resolved {
                pid,
                name: Some("sleep".into()),
            })
        });
        let _ = live.kill();
        let _ = live.wait();
        let ns = res.expect("second attempt opens the live process");
        assert_eq!(calls, 2);
        assert_eq!(ns.pid(), live.id());
        assert!(ns.label().contains("process \"sleep\""), "{}", ns.label());

        // It keeps vanishing: bounded retries, then an error naming the process.
        let err = open_with(&root, &target, Namespaces::NET, |_| {
            Ok(Resolved {
                pid: gone_pid,
                name: Some("sleep".into()),
            })
        })
        .expect_err("always gone");
        match err {
            NsError::TargetVanished {
                attempts, ref path, ..
            } => {
                assert_eq!(attempts, MAX_RESOLVE_ATTEMPTS);
                assert!(path.to_string_lossy().contains(&gone_pid.to_string()), "{err}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    /// The pid was reused by another program: the identity check refuses it.
    #[test]
    fn refuses_a_pid_that_now_belongs_to_another_program() {
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let root = HostRoot::real();
        let err = open_with(
            &root,
            &Target::Process("iscsid-test".into()),
            Namespaces::NET,
            |_| {
                Ok(Resolved {
                    pid: other.id(),
                    name: Some("iscsid-test".into()),
                })
            },
        )
        .expect_err("identity mismatch");
        let _ = other.kill();
        let _ = other.wait();
        assert!(matches!(err, NsError::TargetVanished { .. }), "{err:?}");
    }
}
