//! Shared by tests/ns_*.rs: a real helper process in its own mount, net and uts
//! namespaces (util-linux `unshare`), with a tmpfs holding a marker file, its own
//! hostname and a network interface, which the tests then enter.

#![allow(dead_code)]

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Whether the test can run; prints `SKIP <test>: <reason>` when not.
pub fn can_run(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP {test}: needs root to create and enter namespaces");
        return false;
    }
    for tool in ["unshare", "ip", "mount", "bash"] {
        if which::which(tool).is_err() {
            eprintln!("SKIP {test}: {tool} is not installed (util-linux, iproute2)");
            return false;
        }
    }
    true
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The helper process. Killed and reaped on drop.
#[derive(Debug)]
pub struct NsHelper {
    unshare: Child,
    /// The pid of the process inside the namespaces (in our pid namespace), when
    /// it shares our pid namespace.
    pub pid: u32,
    /// Its argv[0], to find it by name.
    pub name: String,
    pub hostname: String,
    pub iface: String,
    pub marker_text: String,
    /// A directory that has a tmpfs mounted over it only inside the helper's
    /// mount namespace; the marker file is `marker` in it.
    pub mnt_dir: tempfile::TempDir,
    ready_dir: tempfile::TempDir,
    pub pid_ns: bool,
}

impl NsHelper {
    pub fn start() -> Result<Self, String> {
        Self::start_with(None, false)
    }

    /// `name`: argv[0] of the helper (default unique); `pid_ns`: also a new pid
    /// namespace with its own /proc.
    pub fn start_with(name: Option<&str>, pid_ns: bool) -> Result<Self, String> {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let me = std::process::id();
        let name = name
            .map(str::to_string)
            .unwrap_or_else(|| format!("talonns-{me}-{n}"));
        let hostname = format!("talon-ns-{me}-{n}");
        let iface = format!("tns{}", n % 1000);
        let marker_text = format!("marker of helper {n} of test process {me}");
        let mnt_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let ready_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let script = r#"
            set -e
            mount -t tmpfs talon-ns-test "$MNT"
            printf '%s' "$MARKER" > "$MNT/marker"
            hostname "$HOST"
            ip link add "$IFACE" type dummy 2>/dev/null || ip link add "$IFACE" type bridge
            ip link set lo up
            echo $$ > "$READY.tmp"; mv "$READY.tmp" "$READY"
            exec -a "$NAME" sleep 600
        "#;
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--net", "--uts", "--fork", "--kill-child"]);
        if pid_ns {
            cmd.args(["--pid", "--mount-proc"]);
        }
        cmd.args(["bash", "-c", script])
            .env("MNT", mnt_dir.path())
            .env("MARKER", &marker_text)
            .env("HOST", &hostname)
            .env("IFACE", &iface)
            .env("NAME", &name)
            .env("READY", ready_dir.path().join("ready"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut unshare = cmd.spawn().map_err(|e| format!("cannot start unshare: {e}"))?;
        let ready = ready_dir.path().join("ready");
        let start = Instant::now();
        loop {
            if let Ok(s) = fs::read_to_string(&ready) {
                let inner: u32 = s
                    .trim()
                    .parse()
                    .map_err(|e| format!("bad ready file {s:?}: {e}"))?;
                let mut helper = Self {
                    unshare,
                    pid: inner,
                    name,
                    hostname,
                    iface,
                    marker_text,
                    mnt_dir,
                    ready_dir,
                    pid_ns,
                };
                // The ready file is written just before `exec -a NAME`: wait until the
                // process really carries its name, so lookups by name cannot race it.
                let named = Instant::now();
                loop {
                    match talon::ns::find_process(&talon::host::HostRoot::real(), &helper.name) {
                        Ok(pid) => {
                            if pid_ns {
                                helper.pid = pid;
                            }
                            break;
                        }
                        Err(e) if named.elapsed() > Duration::from_secs(20) => return Err(e.to_string()),
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
                return Ok(helper);
            }
            if let Ok(Some(status)) = unshare.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = unshare.stderr.take() {
                    let _ = io::Read::read_to_string(&mut e, &mut err);
                }
                return Err(format!("namespace helper failed ({status}): {}", err.trim()));
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = unshare.kill();
                let _ = unshare.wait();
                return Err("namespace helper did not get ready within 20 s".to_string());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn marker_path(&self) -> PathBuf {
        self.mnt_dir.path().join("marker")
    }

    /// The nsfs inode of the helper's namespace `kind`.
    pub fn ns_inode(&self, kind: &str) -> u64 {
        fs::metadata(format!("/proc/{}/ns/{kind}", self.pid))
            .map(|m| m.ino())
            .unwrap_or(0)
    }

    /// Kills the helper and waits until it is gone (unshare reaps it and exits).
    pub fn kill(&mut self) {
        if let Ok(Some(_)) = self.unshare.try_wait() {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        if nix::sys::signal::kill(pid, nix::sys::signal::SIGKILL).is_err() {
            // --kill-child: unshare's death takes the inner process along.
            let _ = self.unshare.kill();
        }
        let _ = self.unshare.wait();
    }
}

impl Drop for NsHelper {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a thread sees of its namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub marker: Option<String>,
    pub hostname: String,
    pub has_iface: bool,
}

pub fn view(marker: &Path, iface: &str) -> View {
    View {
        marker: fs::read_to_string(marker).ok(),
        hostname: nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default(),
        has_iface: if_index(iface) != 0,
    }
}

/// The interface's index in the calling thread's network namespace, 0 if absent.
pub fn if_index(iface: &str) -> u32 {
    let Ok(name) = CString::new(iface) else { return 0 };
    // SAFETY: if_nametoindex reads a NUL-terminated string that outlives the call.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

/// Threads of this process whose namespace `kind` is the given inode.
pub fn threads_in(kind: &str, inode: u64) -> Vec<String> {
    let mut out = Vec::new();
    for t in fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let p = t.path().join("ns").join(kind);
        if fs::metadata(&p).map(|m| m.ino()).ok() == Some(inode) {
            out.push(t.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

/// Descriptors of this process that refer to the namespace `kind:[inode]`.
pub fn fds_on(kind: &str, inode: u64) -> Vec<String> {
    let want = format!("{kind}:[{inode}]");
    let mut out = Vec::new();
    for fd in fs::read_dir("/proc/self/fd").into_iter().flatten().flatten() {
        if fs::read_link(fd.path())
            .map(|l| l.to_string_lossy() == want)
            .unwrap_or(false)
        {
            out.push(fd.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_SYS_ADMIN: u32 = 21;

/// Drops CAP_SYS_ADMIN from the calling thread only (capabilities are per
/// thread; threads and processes it creates afterwards inherit the reduced set).
pub fn drop_cap_sys_admin_in_this_thread() -> io::Result<()> {
    let mut hdr = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData (version 3 layout) into a live array.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    data[0].effective &= !(1 << CAP_SYS_ADMIN);
    data[0].permitted &= !(1 << CAP_SYS_ADMIN);
    data[0].inheritable &= !(1 << CAP_SYS_ADMIN);
    // SAFETY: capset reads the header and two CapData from live memory; pid 0 is
    // the calling thread.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
