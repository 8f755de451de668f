//! The kernel iSCSI initiator, driven by `iscsiadm` run inside iscsid's namespaces (on Talos the
//! iscsi-tools extension keeps iscsid, its /etc/iscsi and its node database in its own mount
//! namespace, and iscsiadm reaches iscsid over an abstract socket of iscsid's network namespace).
//! No shell: every argument is a validated IQN, a parsed socket address or a number.
//!
//! ```text
//!  IscsiTarget{SocketAddr portal, Iqn, lun}
//!    │ lock /run/talon/locks/<volume>.lock (host mnt ns)
//!    ▼
//!  /sys/class/iscsi_session/sessionN {targetname, state} + iscsi_connection/connectionN:0
//!    │ {persistent_address, persistent_port} matches IQN+portal and LOGGED_IN? ──yes──> reuse
//!    │ no
//!    ▼  NsCommand("iscsiadm") in Target::Process("iscsid"), mnt+net+ipc+uts (bounded)
//!  -m discovery -t sendtargets -p PORTAL -o nonpersistent   IQN offered? (any address: tgtd names
//!  -m node -o new -T IQN -p PORTAL                           its bind address; the node gets the
//!  -m node -T IQN -p PORTAL -o update (login timeout, retries)  portal we can reach)
//!  -m node -T IQN -p PORTAL --login                          ─ failure ─> logout + node delete
//!    ▼
//!  sessionN/device/target*/H:C:T:LUN/block/sdX ── short backoff ──> /sys/block/sdX/dev "8:16"
//!    ▼
//!  devpath::create ──> /dev/talon/<volume>
//!
//!  detach: /dev/talon/<volume> ─ rdev ─> /sys/dev/block/M:m ─> .../sessionN/...  (+ sessions of --iqn)
//!          ──> -m session -r N --logout, -m node -o delete -T IQN -p PORTAL, wait; unlink the node
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::{Component, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::devpath::{self, DevNum};
use super::error::AttachError;
use super::kernel_backoff;
use crate::host::{HostIoError, HostRoot};
use crate::names::{Iqn, ObjectName};
use crate::ns::{Namespaces, NsCommand, NsError, Target};
use crate::tgt::ChapCredentials;

/// iscsiadm's exit code for "session exists" (a login of a logged-in node).
pub const EXIT_SESSION_EXISTS: i32 = 15;
/// iscsiadm's exit code for "no records/sessions found".
pub const EXIT_NO_OBJECTS: i32 = 21;
/// The highest LUN talon accepts (SAM flat addressing).
pub const MAX_LUN: u32 = 16383;
/// The session state of a logged-in session in sysfs.
pub const LOGGED_IN: &str = "LOGGED_IN";
/// PATH for iscsiadm inside iscsid's mount namespace (Talos extensions install to /usr/local).
pub const ISCSIADM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The iscsiadm interface record through which talon logs in with its own
/// initiator name (`iface.initiatorname`), in iscsid's `/etc/iscsi/ifaces/`.
pub const IFACE: &str = "talon";

/// Where to log in: a reachable portal, the target's IQN, and the volume's LUN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiTarget {
    pub portal: SocketAddr,
    pub iqn: Iqn,
    pub lun: u32,
    /// The initiator name to log in with (through the interface [`IFACE`]);
    /// `None` uses iscsid's default name. A target that allows only named
    /// initiators (talon's V1 exports) answers discovery and login only for
    /// them.
    pub initiator: Option<Iqn>,
    /// CHAP credentials the target requires (`NodeConfig.iscsiChap`), set in
    /// the node record before login.
    pub chap: Option<ChapCredentials>,
}

/// `a` with `-I talon` when the target is reached with talon's initiator name.
fn via_iface(target: &IscsiTarget, mut a: Vec<String>) -> Vec<String> {
    if target.initiator.is_some() {
        a.extend(["-I".to_string(), IFACE.to_string()]);
    }
    a
}

/// Makes the interface [`IFACE`] carry the target's initiator name (a no-op
/// without one). `-o new` of an existing interface fails harmlessly; the
/// update is what must succeed.
fn ensure_iface(
    iscsiadm: &dyn Iscsiadm,
    target: &IscsiTarget,
    opts: &IscsiOptions,
) -> Result<(), IscsiError> {
    let Some(name) = &target.initiator else {
        return Ok(());
    };
    let out = adm(
        iscsiadm,
        "interface creation",
        target,
        args(&["-m", "iface", "-I", IFACE, "-o", "new"]),
        opts.logout_timeout,
    )?;
    if out.code != 0 {
        tracing::debug!(iface = IFACE, code = out.code, stderr = %out.stderr, "iscsiadm iface new (exists?)");
    }
    let out = adm(
        iscsiadm,
        "interface update",
        target,
        args(&[
            "-m",
            "iface",
            "-I",
            IFACE,
            "-o",
            "update",
            "-n",
            "iface.initiatorname",
            "-v",
            name.as_str(),
        ]),
        opts.logout_timeout,
    )?;
    if out.code != 0 {
        return Err(IscsiError::Iface {
            iface: IFACE,
            initiator: name.to_string(),
            code: out.code,
            stderr: out.stderr,
        });
    }
    Ok(())
}

/// Bounds of the steps of an attach or detach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiOptions {
    /// SendTargets discovery.
    pub discovery_timeout: Duration,
    /// The whole login (iscsid's per-attempt login timeout is a third of it, with 2 retries).
    pub login_timeout: Duration,
    /// The wait for the LUN's block device after login.
    pub device_timeout: Duration,
    /// Logout and node delete, each.
    pub logout_timeout: Duration,
}

impl Default for IscsiOptions {
    fn default() -> Self {
        Self {
            discovery_timeout: Duration::from_secs(15),
            login_timeout: Duration::from_secs(30),
            device_timeout: Duration::from_secs(15),
            logout_timeout: Duration::from_secs(20),
        }
    }
}

/// A failed iSCSI attach or detach. Every variant names the IQN, portal or session.
#[derive(Debug, thiserror::Error)]
pub enum IscsiError {
    #[error("LUN {lun} of {iqn} is not in 0..={MAX_LUN}")]
    InvalidLun { iqn: String, lun: u32 },

    #[error(
        "cannot log in to {iqn} at {portal}: iscsid is not running on this host ({why}); start it: \
         `systemctl start iscsid`, or run `iscsid` as root (Debian package open-iscsi; on Talos the \
         iscsi-tools extension)"
    )]
    IscsidNotRunning {
        iqn: String,
        portal: String,
        why: String,
    },

    #[error("cannot run iscsiadm {args} in the namespaces of iscsid")]
    Run {
        args: String,
        #[source]
        source: Box<NsError>,
    },

    #[error("iscsiadm {op} for {iqn} at {portal} did not finish within {waited:?} (portal unreachable?)")]
    TimedOut {
        op: &'static str,
        iqn: String,
        portal: String,
        waited: Duration,
    },

    #[error("SendTargets discovery at {portal} for {iqn} failed (iscsiadm exit {code}): {stderr}")]
    Discovery {
        iqn: String,
        portal: String,
        code: i32,
        stderr: String,
    },

    #[error("the portal {portal} does not offer target {iqn}; it offers [{offered}]")]
    NotOffered {
        iqn: String,
        portal: String,
        offered: String,
    },

    #[error(
        "setting initiator name {initiator} on iscsiadm interface {iface} failed (iscsiadm exit {code}): {stderr}"
    )]
    Iface {
        iface: &'static str,
        initiator: String,
        code: i32,
        stderr: String,
    },

    #[error("creating the node record of {iqn} at {portal} failed (iscsiadm exit {code}): {stderr}")]
    CreateNode {
        iqn: String,
        portal: String,
        code: i32,
        stderr: String,
    },

    #[error("login to {iqn} at {portal} failed (iscsiadm exit {code}): {stderr}")]
    Login {
        iqn: String,
        portal: String,
        code: i32,
        stderr: String,
    },

    #[error("iscsiadm logged in to {iqn} at {portal} but no session shows in /sys/class/iscsi_session")]
    SessionNotFound { iqn: String, portal: String },

    #[error(
        "{session} of {iqn} at {portal} shows no block device for LUN {lun} after {waited:?}; logged out"
    )]
    DeviceNotFound {
        session: String,
        iqn: String,
        portal: String,
        lun: u32,
        waited: Duration,
    },

    #[error("logout of {session} ({iqn}) failed (iscsiadm exit {code}): {stderr}")]
    Logout {
        session: String,
        iqn: String,
        code: i32,
        stderr: String,
    },

    #[error("deleting the node record of {iqn} failed (iscsiadm exit {code}): {stderr}")]
    DeleteNode { iqn: String, code: i32, stderr: String },

    #[error("{session} is still present {waited:?} after logout")]
    LogoutTimedOut { session: String, waited: Duration },

    #[error("reading the iSCSI state of the host failed")]
    Sysfs(#[from] HostIoError),

    #[error(transparent)]
    Attach(#[from] AttachError),
}

/// What an iscsiadm run printed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AdmOutput {
    /// Exit code (128 + signal when killed).
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs iscsiadm. [`NsIscsiadm`] on a real host; tests use a kernel double.
pub trait Iscsiadm: Send + Sync + std::fmt::Debug {
    /// Runs `iscsiadm args...`, killed after `timeout` ([`NsError::CommandTimeout`]).
    fn run(&self, args: &[String], timeout: Duration) -> Result<AdmOutput, NsError>;

    /// Sets CHAP (`node.session.auth.*`) in the node record of `target` that
    /// `-o new` made, by rewriting the record file in iscsid's node database
    /// (mode 0600): iscsiadm takes a setting's value only as an argument,
    /// which every local user can read in /proc/<pid>/cmdline. Returns the
    /// record files written.
    fn set_node_auth(
        &self,
        target: &IscsiTarget,
        iface: &str,
        chap: &ChapCredentials,
    ) -> Result<Vec<PathBuf>, String>;

    /// Why iscsid cannot answer, when that is known before iscsiadm runs
    /// (`None`: it may; iscsiadm then says what it finds).
    fn iscsid_missing(&self) -> Option<String> {
        None
    }
}

/// Where open-iscsi keeps its node records: Debian's build, then the
/// upstream default. iscsiadm reads the record at login and gives it to
/// iscsid over its socket.
pub const NODE_DIRS: [&str; 2] = ["/etc/iscsi/nodes", "/var/lib/iscsi/nodes"];

/// The record settings [`set_record_auth`] owns.
const AUTH_KEYS: [&str; 3] = [
    "node.session.auth.authmethod",
    "node.session.auth.username",
    AUTH_PASSWORD,
];

/// The record files of `iqn` at `portal` through interface `iface` under the
/// node directories `dirs`: `<dir>/<iqn>/<ip>,<port>,<tpgt>/<iface>` (open-iscsi
/// 2.0.870 and later) or the older flat `<dir>/<iqn>/<ip>,<port>`.
pub fn node_record_files(dirs: &[PathBuf], iqn: &str, portal: &SocketAddr, iface: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let (flat, prefix) = (
        format!("{},{}", portal.ip(), portal.port()),
        format!("{},{},", portal.ip(), portal.port()),
    );
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(d.join(iqn)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if name.starts_with(&prefix) && path.is_dir() && path.join(iface).is_file() {
                out.push(path.join(iface));
            } else if name == flat && path.is_file() {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Rewrites the node record file `path` with CHAP on for `chap` (other
/// settings kept; earlier auth lines replaced), as a new 0600 file renamed
/// over the old one: the secret is never in a file others can read, nor in
/// any argument.
pub fn set_record_auth(path: &std::path::Path, chap: &ChapCredentials) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let text = std::fs::read_to_string(path)?;
    let ours = |l: &str| {
        let l = l.trim_start();
        AUTH_KEYS.iter().any(|k| {
            l.strip_prefix(k)
                .is_some_and(|rest| rest.starts_with(|c: char| c == '=' || c.is_whitespace()))
        })
    };
    let auth = format!(
        "node.session.auth.authmethod = CHAP\nnode.session.auth.username = {}\n{AUTH_PASSWORD} = {}\n",
        chap.user.as_str(),
        chap.secret.expose()
    );
    let mut out = String::with_capacity(text.len() + auth.len());
    let mut placed = false;
    for l in text.lines().filter(|l| !ours(l)) {
        if !placed && l.trim() == "# END RECORD" {
            out.push_str(&auth);
            placed = true;
        }
        out.push_str(l);
        out.push('\n');
    }
    if !placed {
        out.push_str(&auth);
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.talon-tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = f.write_all(out.as_bytes()).and_then(|()| f.sync_all());
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// iscsiadm run inside iscsid's mount, network, IPC and UTS namespaces (no-op switches where
/// iscsid runs in talon's own namespaces), or in the host's when no iscsid process is found
/// (a socket-activated iscsid, or none: then iscsiadm says so).
#[derive(Debug, Clone)]
pub struct NsIscsiadm {
    root: HostRoot,
}

impl NsIscsiadm {
    pub fn new(root: HostRoot) -> Self {
        Self { root }
    }

    fn target(&self) -> Target {
        match crate::ns::find_process(&self.root, "iscsid") {
            Ok(pid) => {
                tracing::debug!(pid, "running iscsiadm in the namespaces of iscsid");
                // by name: re-resolved should iscsid restart while its namespaces are opened
                Target::Process("iscsid".into())
            }
            Err(e) => {
                tracing::debug!(error = %e, "no iscsid process: running iscsiadm in the host namespaces");
                Target::Host
            }
        }
    }
}

/// The abstract socket iscsiadm calls iscsid on, as /proc/net/unix lists it;
/// systemd's iscsid.socket listens on it before iscsid runs.
const ISCSID_SOCKET: &str = "@ISCSIADM_ABSTRACT_NAMESPACE";

impl Iscsiadm for NsIscsiadm {
    fn iscsid_missing(&self) -> Option<String> {
        if crate::ns::find_process(&self.root, "iscsid").is_ok() {
            return None;
        }
        // the host's network namespace (pid 1's): a socket-activated iscsid starts on the first call
        let unix = std::fs::read_to_string(self.root.path("/proc/1/net/unix")).ok()?;
        if unix.lines().any(|l| l.trim_end().ends_with(ISCSID_SOCKET)) {
            return None;
        }
        Some(format!(
            "no iscsid process, and nothing listens on its socket {ISCSID_SOCKET}"
        ))
    }

    fn run(&self, args: &[String], timeout: Duration) -> Result<AdmOutput, NsError> {
        let mut cmd = NsCommand::new("iscsiadm");
        cmd.args(args).env("PATH", ISCSIADM_PATH).timeout(timeout);
        let out = cmd.output(&self.root, &self.target(), Namespaces::ALL_BUT_PID)?;
        Ok(AdmOutput {
            code: crate::ns::exit_code(&out.status),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: summarize_stderr(&String::from_utf8_lossy(&out.stderr)),
        })
    }

    fn set_node_auth(
        &self,
        target: &IscsiTarget,
        iface: &str,
        chap: &ChapCredentials,
    ) -> Result<Vec<PathBuf>, String> {
        let (iqn, portal, iface, chap) = (
            target.iqn.to_string(),
            target.portal,
            iface.to_string(),
            chap.clone(),
        );
        let (res, label) =
            crate::ns::in_mnt(&self.root, &self.target(), crate::ns::FILE_TIMEOUT, move || {
                let dirs: Vec<PathBuf> = NODE_DIRS.iter().map(PathBuf::from).collect();
                let files = node_record_files(&dirs, &iqn, &portal, &iface);
                for f in &files {
                    set_record_auth(f, &chap).map_err(|e| format!("writing {}: {e}", f.display()))?;
                }
                Ok::<_, String>(files)
            })
            .map_err(|e| e.to_string())?;
        res.map_err(|e| format!("{e} (in the namespaces of {label})"))
    }
}

/// iscsiadm's stderr for a message: distinct lines (it repeats each retry), the last three, joined.
pub fn summarize_stderr(s: &str) -> String {
    let mut lines: Vec<&str> = Vec::new();
    for l in s.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !lines.contains(&l) {
            lines.push(l);
        }
    }
    let skip = lines.len().saturating_sub(3);
    lines[skip..].join("; ")
}

/// The portal as iscsiadm takes it: `1.2.3.4:3260`, `[fd00::1]:3260`.
pub fn portal_arg(p: &SocketAddr) -> String {
    p.to_string()
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Runs iscsiadm; a kill on timeout becomes [`IscsiError::TimedOut`] for `op`.
fn adm(
    iscsiadm: &dyn Iscsiadm,
    op: &'static str,
    target: &IscsiTarget,
    a: Vec<String>,
    timeout: Duration,
) -> Result<AdmOutput, IscsiError> {
    match iscsiadm.run(&a, timeout) {
        Ok(o) => Ok(o),
        Err(NsError::CommandTimeout { .. }) => Err(IscsiError::TimedOut {
            op,
            iqn: target.iqn.to_string(),
            portal: portal_arg(&target.portal),
            waited: timeout,
        }),
        Err(source) => Err(IscsiError::Run {
            args: redacted(&a).join(" "),
            source: Box::new(source),
        }),
    }
}

/// The node record setting that holds the CHAP secret.
const AUTH_PASSWORD: &str = "node.session.auth.password";

/// iscsiadm's arguments fit for a message: the value that follows a secret
/// setting's name (`-n node.session.auth.password -v SECRET`) is replaced.
pub fn redacted(a: &[String]) -> Vec<String> {
    let mut out = a.to_vec();
    if let Some(i) = a.iter().position(|x| x == AUTH_PASSWORD)
        && let Some(v) = a[i..].iter().position(|x| x == "-v")
        && let Some(secret) = out.get_mut(i + v + 1)
    {
        *secret = "***".to_string();
    }
    out
}

/// Parses SendTargets output lines `ADDR:PORT,TPGT IQN`.
pub fn parse_sendtargets(out: &str) -> Vec<(Option<SocketAddr>, String)> {
    out.lines()
        .filter_map(|l| {
            let (portal, name) = l.trim().split_once(char::is_whitespace)?;
            let addr = portal.rsplit_once(',').map_or(portal, |(a, _)| a);
            Some((addr.parse().ok(), name.trim().to_string()))
        })
        .collect()
}

/// One iSCSI session as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// `sessionN`.
    pub name: String,
    pub targetname: String,
    pub state: String,
    /// The portal it was made for (persistent address and port of its connection).
    pub portal: Option<SocketAddr>,
}

fn session_number(name: &str) -> Option<u32> {
    name.strip_prefix("session")?.parse().ok()
}

/// Reads one session, `None` when it is gone.
pub fn read_session(root: &HostRoot, name: &str) -> Result<Option<Session>, IscsiError> {
    let Some(n) = session_number(name) else {
        return Ok(None);
    };
    let dir = PathBuf::from("/sys/class/iscsi_session").join(name);
    let Some(targetname) = root.read_attr_opt(dir.join("targetname"))? else {
        return Ok(None);
    };
    let state = root.read_attr_opt(dir.join("state"))?.unwrap_or_default();
    let mut portal = None;
    let prefix = format!("connection{n}:");
    let conns = match root.list_dir("/sys/class/iscsi_connection") {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    for c in conns.iter().filter(|c| c.starts_with(&prefix)) {
        let cdir = PathBuf::from("/sys/class/iscsi_connection").join(c);
        let attr = |p: &str, a: &str| -> Result<Option<String>, IscsiError> {
            Ok(root
                .read_attr_opt(cdir.join(p))?
                .or(root.read_attr_opt(cdir.join(a))?))
        };
        let addr = attr("persistent_address", "address")?.and_then(|a| a.parse::<IpAddr>().ok());
        let port = attr("persistent_port", "port")?.and_then(|p| p.parse::<u16>().ok());
        if let (Some(a), Some(p)) = (addr, port) {
            portal = Some(SocketAddr::new(a, p));
            break;
        }
    }
    Ok(Some(Session {
        name: name.to_string(),
        targetname,
        state,
        portal,
    }))
}

/// Every iSCSI session of the host.
pub fn list_sessions(root: &HostRoot) -> Result<Vec<Session>, IscsiError> {
    let names = match root.list_dir("/sys/class/iscsi_session") {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for n in names.iter().filter(|n| session_number(n).is_some()) {
        if let Some(s) = read_session(root, n)? {
            out.push(s);
        }
    }
    Ok(out)
}

/// The session of `target` (same IQN and portal), in any state.
pub fn find_session(root: &HostRoot, target: &IscsiTarget) -> Result<Option<Session>, IscsiError> {
    Ok(list_sessions(root)?
        .into_iter()
        .find(|s| s.targetname == target.iqn.as_str() && s.portal == Some(target.portal)))
}

/// The block device of LUN `lun` of a session, when it is there:
/// `/sys/class/iscsi_session/<session>/device/target*/H:C:T:<lun>/block/<sdX>`.
pub fn find_lun_device(root: &HostRoot, session: &str, lun: u32) -> Result<Option<String>, IscsiError> {
    let dev = PathBuf::from("/sys/class/iscsi_session")
        .join(session)
        .join("device");
    let ls = |p: &PathBuf| -> Result<Vec<String>, IscsiError> {
        match root.list_dir(p) {
            Ok(v) => Ok(v),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    };
    for t in ls(&dev)?.into_iter().filter(|t| t.starts_with("target")) {
        let tdir = dev.join(&t);
        for hctl in ls(&tdir)? {
            let parts: Vec<&str> = hctl.split(':').collect();
            if parts.len() != 4 || parts[3].parse::<u32>().ok() != Some(lun) {
                continue;
            }
            if let Some(blk) = ls(&tdir.join(&hctl).join("block"))?.into_iter().next() {
                return Ok(Some(blk));
            }
        }
    }
    Ok(None)
}

/// Waits for the LUN's block device (sysfs and its /dev node).
fn wait_device(
    root: &HostRoot,
    session: &str,
    target: &IscsiTarget,
    bound: Duration,
) -> Result<(String, DevNum), IscsiError> {
    let (mut backoff, until) = (kernel_backoff(), std::time::Instant::now() + bound);
    loop {
        if let Some(blk) = find_lun_device(root, session, target.lun)?
            && let Some(dev) = root.read_attr_opt(PathBuf::from("/sys/block").join(&blk).join("dev"))?
            && let Some(dev) = DevNum::parse(&dev)
            && root.exists(PathBuf::from("/dev").join(&blk))
        {
            return Ok((blk, dev));
        }
        if !backoff.sleep_before(until) {
            return Err(IscsiError::DeviceNotFound {
                session: session.to_string(),
                iqn: target.iqn.to_string(),
                portal: portal_arg(&target.portal),
                lun: target.lun,
                waited: bound,
            });
        }
    }
}

/// The result of an attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// `sessionN`.
    pub session: String,
    /// The kernel block device, `sdX`.
    pub device: String,
    pub dev: DevNum,
    /// `/dev/talon/<volume>` (a host path).
    pub stable_path: PathBuf,
    /// Whether a logged-in session for the same IQN and portal was reused.
    pub reused: bool,
}

/// SendTargets discovery at the portal; the IQN must be offered (at any address).
fn discover(iscsiadm: &dyn Iscsiadm, target: &IscsiTarget, opts: &IscsiOptions) -> Result<(), IscsiError> {
    let p = portal_arg(&target.portal);
    let out = adm(
        iscsiadm,
        "discovery",
        target,
        via_iface(
            target,
            args(&[
                "-m",
                "discovery",
                "-t",
                "sendtargets",
                "-p",
                &p,
                "-o",
                "nonpersistent",
            ]),
        ),
        opts.discovery_timeout,
    )?;
    if out.code != 0 {
        return Err(IscsiError::Discovery {
            iqn: target.iqn.to_string(),
            portal: p,
            code: out.code,
            stderr: out.stderr,
        });
    }
    let offered = parse_sendtargets(&out.stdout);
    match offered.iter().find(|(_, n)| n == target.iqn.as_str()) {
        Some((addr, _)) => {
            if *addr != Some(target.portal) {
                tracing::debug!(iqn = %target.iqn, portal = %p, named = ?addr,
                    "SendTargets names another address; the node gets the portal we reach");
            }
            Ok(())
        }
        None => Err(IscsiError::NotOffered {
            iqn: target.iqn.to_string(),
            portal: p,
            offered: offered.into_iter().map(|(_, n)| n).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// Creates the node record with the reachable portal and bounds iscsid's login attempts.
fn create_node(iscsiadm: &dyn Iscsiadm, target: &IscsiTarget, opts: &IscsiOptions) -> Result<(), IscsiError> {
    let (iqn, p) = (target.iqn.to_string(), portal_arg(&target.portal));
    let attempt = (opts.login_timeout.as_secs() / 3).max(1).to_string();
    let steps: [Vec<String>; 3] = [
        args(&["-m", "node", "-o", "new", "-T", &iqn, "-p", &p]),
        args(&[
            "-m",
            "node",
            "-T",
            &iqn,
            "-p",
            &p,
            "-o",
            "update",
            "-n",
            "node.conn[0].timeo.login_timeout",
            "-v",
            &attempt,
        ]),
        args(&[
            "-m",
            "node",
            "-T",
            &iqn,
            "-p",
            &p,
            "-o",
            "update",
            "-n",
            "node.session.initial_login_retry_max",
            "-v",
            "2",
        ]),
    ];
    for a in steps {
        let out = adm(
            iscsiadm,
            "node creation",
            target,
            via_iface(target, a),
            opts.logout_timeout,
        )?;
        if out.code != 0 {
            return Err(IscsiError::CreateNode {
                iqn,
                portal: p,
                code: out.code,
                stderr: out.stderr,
            });
        }
    }
    if let Some(chap) = &target.chap {
        // never `-o update -n node.session.auth.password -v SECRET`: an argument is readable
        // by every local user in /proc/<pid>/cmdline; the record file is written instead
        let iface = if target.initiator.is_some() {
            IFACE
        } else {
            "default"
        };
        match iscsiadm.set_node_auth(target, iface, chap) {
            Ok(files) if !files.is_empty() => {
                tracing::debug!(iqn = %iqn, portal = %p, records = ?files, "CHAP set in the node record");
            }
            Ok(_) => {
                return Err(IscsiError::CreateNode {
                    iqn,
                    portal: p,
                    code: -1,
                    stderr: format!(
                        "CHAP: no node record of this target and portal through interface {iface} under {} in iscsid's namespaces",
                        NODE_DIRS.join(" or ")
                    ),
                });
            }
            Err(e) => {
                return Err(IscsiError::CreateNode {
                    iqn,
                    portal: p,
                    code: -1,
                    stderr: format!("CHAP: {e}"),
                });
            }
        }
    }
    Ok(())
}

/// Logs out of `target` at its portal and deletes its node record; both "nothing there" answers
/// are fine. Used to roll back a failed attach.
fn logout_and_delete(
    iscsiadm: &dyn Iscsiadm,
    target: &IscsiTarget,
    opts: &IscsiOptions,
) -> Result<(), IscsiError> {
    let (iqn, p) = (target.iqn.to_string(), portal_arg(&target.portal));
    let out = adm(
        iscsiadm,
        "logout",
        target,
        args(&["-m", "node", "-T", &iqn, "-p", &p, "--logout"]),
        opts.logout_timeout,
    )?;
    if out.code != 0 && out.code != EXIT_NO_OBJECTS {
        return Err(IscsiError::Logout {
            session: format!("the session at {p}"),
            iqn,
            code: out.code,
            stderr: out.stderr,
        });
    }
    delete_node(iscsiadm, target, Some(&p), opts)
}

fn delete_node(
    iscsiadm: &dyn Iscsiadm,
    target: &IscsiTarget,
    portal: Option<&str>,
    opts: &IscsiOptions,
) -> Result<(), IscsiError> {
    let iqn = target.iqn.to_string();
    let mut a = args(&["-m", "node", "-o", "delete", "-T", &iqn]);
    if let Some(p) = portal {
        a.extend(args(&["-p", p]));
    }
    let out = adm(iscsiadm, "node delete", target, a, opts.logout_timeout)?;
    if out.code != 0 && out.code != EXIT_NO_OBJECTS {
        return Err(IscsiError::DeleteNode {
            iqn,
            code: out.code,
            stderr: out.stderr,
        });
    }
    Ok(())
}

/// Attaches `volume` from `target` through `iscsiadm`: reuses a logged-in session of the same IQN
/// and portal, or discovers, creates the node and logs in; waits for the LUN's disk and makes
/// `/dev/talon/<volume>`. On failure after a new login, logs out and deletes the node record.
pub fn attach(
    root: &HostRoot,
    volume: &ObjectName,
    target: &IscsiTarget,
    opts: &IscsiOptions,
    iscsiadm: &dyn Iscsiadm,
) -> Result<Attached, IscsiError> {
    if target.lun > MAX_LUN {
        return Err(IscsiError::InvalidLun {
            iqn: target.iqn.to_string(),
            lun: target.lun,
        });
    }
    let _lock = super::lock_volume(root, volume)?;
    let existing = find_session(root, target)?;
    if existing.is_none()
        && let Some(why) = iscsiadm.iscsid_missing()
    {
        return Err(IscsiError::IscsidNotRunning {
            iqn: target.iqn.to_string(),
            portal: portal_arg(&target.portal),
            why,
        });
    }
    // a session that was there before (even one the kernel is recovering) is never logged out here
    let owned = existing.is_none();
    let live = existing.filter(|s| s.state == LOGGED_IN);
    let reused = live.is_some();
    let undo = |e: IscsiError| -> IscsiError {
        if owned && let Err(u) = logout_and_delete(iscsiadm, target, opts) {
            tracing::error!(iqn = %target.iqn, portal = %target.portal, error = %u,
                "cannot log out after a failed attach");
        }
        e
    };
    let session = match live {
        Some(s) => {
            tracing::info!(session = %s.name, iqn = %target.iqn, "reusing the logged-in session");
            s.name
        }
        None => {
            ensure_iface(iscsiadm, target, opts)?;
            discover(iscsiadm, target, opts)?;
            create_node(iscsiadm, target, opts).map_err(undo)?;
            let (iqn, p) = (target.iqn.to_string(), portal_arg(&target.portal));
            let out = adm(
                iscsiadm,
                "login",
                target,
                via_iface(target, args(&["-m", "node", "-T", &iqn, "-p", &p, "--login"])),
                opts.login_timeout,
            )
            .map_err(undo)?;
            if out.code != 0 && out.code != EXIT_SESSION_EXISTS {
                return Err(undo(IscsiError::Login {
                    iqn,
                    portal: p,
                    code: out.code,
                    stderr: out.stderr,
                }));
            }
            match find_session(root, target).map_err(undo)? {
                Some(s) => s.name,
                None => return Err(undo(IscsiError::SessionNotFound { iqn, portal: p })),
            }
        }
    };
    let (device, dev) = wait_device(root, &session, target, opts.device_timeout).map_err(undo)?;
    let stable_path = devpath::create(root, volume, &device, dev)
        .map_err(IscsiError::from)
        .map_err(undo)?;
    Ok(Attached {
        session,
        device,
        dev,
        stable_path,
        reused,
    })
}

/// The result of a detach.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Detached {
    /// Sessions logged out.
    pub sessions: Vec<String>,
    /// Whether `/dev/talon/<volume>` was removed.
    pub removed_path: bool,
}

/// The session behind block device `M:m`: the `sessionN` component of its sysfs device path.
fn session_of_dev(root: &HostRoot, dev: DevNum) -> Result<Option<String>, IscsiError> {
    let link = match root.read_link(format!("/sys/dev/block/{dev}")) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(link.components().find_map(|c| match c {
        Component::Normal(n) => n
            .to_str()
            .filter(|n| session_number(n).is_some())
            .map(str::to_string),
        _ => None,
    }))
}

/// Detaches `volume`: logs out of the session behind `/dev/talon/<volume>` and, when `iqn` is
/// given, of every session of that target (cleans up after a lost node), deletes their node
/// records, waits until the sessions are gone, then removes the node. Idempotent.
pub fn detach(
    root: &HostRoot,
    volume: &ObjectName,
    iqn: Option<&Iqn>,
    opts: &IscsiOptions,
    iscsiadm: &dyn Iscsiadm,
) -> Result<Detached, IscsiError> {
    let _lock = super::lock_volume(root, volume)?;
    let mut sessions: Vec<Session> = Vec::new();
    if let Some(dev) = devpath::current(root, volume)?
        && let Some(name) = session_of_dev(root, dev)?
        && let Some(s) = read_session(root, &name)?
    {
        sessions.push(s);
    }
    if let Some(iqn) = iqn {
        sessions.extend(
            list_sessions(root)?
                .into_iter()
                .filter(|s| s.targetname == iqn.as_str()),
        );
    }
    sessions.sort_by(|a, b| a.name.cmp(&b.name));
    sessions.dedup_by(|a, b| a.name == b.name);
    let mut targets: Vec<IscsiTarget> = Vec::new();
    for s in &sessions {
        let Ok(t_iqn) = Iqn::parse(&s.targetname) else {
            tracing::warn!(session = %s.name, targetname = %s.targetname, "not an IQN talon can pass on; skipped");
            continue;
        };
        let portal = s.portal.unwrap_or(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0));
        let t = IscsiTarget {
            portal,
            iqn: t_iqn,
            lun: 0,
            initiator: None,
            chap: None,
        };
        let n = session_number(&s.name).unwrap_or_default().to_string();
        let out = adm(
            iscsiadm,
            "logout",
            &t,
            args(&["-m", "session", "-r", &n, "--logout"]),
            opts.logout_timeout,
        )?;
        if out.code != 0 && out.code != EXIT_NO_OBJECTS {
            return Err(IscsiError::Logout {
                session: s.name.clone(),
                iqn: s.targetname.clone(),
                code: out.code,
                stderr: out.stderr,
            });
        }
        targets.push(t);
    }
    for t in &targets {
        let p = (t.portal.port() != 0).then(|| portal_arg(&t.portal));
        delete_node(iscsiadm, t, p.as_deref(), opts)?;
    }
    if let Some(iqn) = iqn
        && targets.is_empty()
    {
        // no session: still remove node records a failed attach may have left
        let t = IscsiTarget {
            portal: SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0),
            iqn: iqn.clone(),
            lun: 0,
            initiator: None,
            chap: None,
        };
        delete_node(iscsiadm, &t, None, opts)?;
    }
    for s in &sessions {
        let (mut backoff, until) = (kernel_backoff(), std::time::Instant::now() + opts.logout_timeout);
        while read_session(root, &s.name)?.is_some() {
            if !backoff.sleep_before(until) {
                return Err(IscsiError::LogoutTimedOut {
                    session: s.name.clone(),
                    waited: opts.logout_timeout,
                });
            }
        }
    }
    let removed_path = devpath::current(root, volume)?.is_some();
    devpath::remove(root, volume)?;
    Ok(Detached {
        sessions: sessions.into_iter().map(|s| s.name).collect(),
        removed_path,
    })
}

/// [`attach`] with iscsiadm in iscsid's namespaces.
pub fn attach_host(
    root: &HostRoot,
    volume: &ObjectName,
    target: &IscsiTarget,
    opts: &IscsiOptions,
) -> Result<Attached, IscsiError> {
    attach(root, volume, target, opts, &NsIscsiadm::new(root.clone()))
}

/// [`detach`] with iscsiadm in iscsid's namespaces.
pub fn detach_host(
    root: &HostRoot,
    volume: &ObjectName,
    iqn: Option<&Iqn>,
    opts: &IscsiOptions,
) -> Result<Detached, IscsiError> {
    detach(root, volume, iqn, opts, &NsIscsiadm::new(root.clone()))
}

/// A shared iscsiadm, as the attach controller holds it.
pub type SharedIscsiadm = Arc<dyn Iscsiadm>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_iscsid_is_said_as_such_unless_its_socket_listens() {
        let d = tempfile::tempdir().expect("tempdir");
        let net = d.path().join("proc/1/net");
        std::fs::create_dir_all(&net).expect("mkdir");
        let header = "Num       RefCount Protocol Flags    Type St Inode Path\n";
        std::fs::write(
            net.join("unix"),
            format!("{header}0000000000000000: 00000002 00000000 00010000 0001 01 23 /run/systemd/notify\n"),
        )
        .expect("unix");
        let adm = NsIscsiadm::new(HostRoot::new(d.path()));
        let why = adm.iscsid_missing().expect("no iscsid");
        assert!(why.contains("no iscsid process"), "{why}");
        let e = IscsiError::IscsidNotRunning {
            iqn: "iqn.2025-01.io.talon:demo".into(),
            portal: "127.0.0.1:3262".into(),
            why,
        }
        .to_string();
        assert!(
            e.contains("iscsid is not running") && e.contains("systemctl start iscsid"),
            "{e}"
        );
        assert!(!e.contains("namespaces") && !e.contains("PTRACE"), "{e}");
        // socket-activated: iscsid starts on the first call
        std::fs::write(
            net.join("unix"),
            format!("{header}0000000000000000: 00000002 00000000 00010000 0001 01 24 @ISCSIADM_ABSTRACT_NAMESPACE\n"),
        )
        .expect("unix");
        assert_eq!(adm.iscsid_missing(), None);
    }

    /// The record edit replaces earlier auth lines, keeps the rest, writes
    /// 0600, and finds both record layouts.
    #[test]
    fn record_auth_is_written_into_the_record_file_only() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().expect("tempdir");
        let iqn = "iqn.2025-01.io.talon:v1";
        let portal: SocketAddr = "10.0.2.2:3260".parse().expect("portal");
        let new = d.path().join("nodes").join(iqn).join("10.0.2.2,3260,1");
        std::fs::create_dir_all(&new).expect("dir");
        std::fs::write(
            new.join("talon"),
            "# BEGIN RECORD 2.1.8\nnode.name = iqn.2025-01.io.talon:v1\nnode.session.auth.authmethod = None\n\
             node.session.auth.username = old\nnode.session.auth.password = old-secret\n\
             node.session.auth.username_in = mutual\nnode.conn[0].port = 3260\n# END RECORD\n",
        )
        .expect("record");
        std::fs::write(new.join("default"), "# BEGIN RECORD\n# END RECORD\n").expect("other iface");
        let old = d.path().join("old").join(iqn);
        std::fs::create_dir_all(&old).expect("dir");
        std::fs::write(old.join("10.0.2.2,3260"), "node.name = x\n").expect("flat record");
        std::fs::write(old.join("10.0.2.22,3260"), "node.name = y\n").expect("another portal");
        let dirs = [d.path().join("nodes"), d.path().join("old")];
        let files = node_record_files(&dirs, iqn, &portal, "talon");
        assert_eq!(files, vec![new.join("talon"), old.join("10.0.2.2,3260")]);
        let chap = ChapCredentials {
            user: crate::tgt::ChapUser::parse("talon").expect("user"),
            secret: crate::tgt::ChapSecret::parse("0123456789abcdef0123").expect("secret"),
        };
        set_record_auth(&files[0], &chap).expect("edit");
        let text = std::fs::read_to_string(&files[0]).expect("read");
        assert_eq!(
            text,
            "# BEGIN RECORD 2.1.8\nnode.name = iqn.2025-01.io.talon:v1\n\
             node.session.auth.username_in = mutual\nnode.conn[0].port = 3260\n\
             node.session.auth.authmethod = CHAP\nnode.session.auth.username = talon\n\
             node.session.auth.password = 0123456789abcdef0123\n# END RECORD\n"
        );
        let mode = std::fs::metadata(&files[0]).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // no temp file left beside it
        assert_eq!(std::fs::read_dir(&new).expect("ls").count(), 2);
        // the flat layout without an END line gets the lines at the end
        set_record_auth(&files[1], &chap).expect("edit flat");
        let flat = std::fs::read_to_string(&files[1]).expect("read");
        assert!(
            flat.ends_with("node.session.auth.password = 0123456789abcdef0123\n"),
            "{flat}"
        );
    }

    #[test]
    fn parses_sendtargets_lines() {
        let out =
            "127.0.0.1:3260,1 iqn.2025-01.io.talon:v1\n[fd00::1]:3260,1 iqn.2025-01.io.talon:v2\nbogus\n";
        let got = parse_sendtargets(out);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, Some("127.0.0.1:3260".parse().expect("addr")));
        assert_eq!(got[0].1, "iqn.2025-01.io.talon:v1");
        assert_eq!(got[1].0, Some("[fd00::1]:3260".parse().expect("addr")));
    }

    #[test]
    fn stderr_is_deduplicated_and_short() {
        let e = "iscsiadm: refused\niscsiadm: refused\niscsiadm: refused\niscsiadm: retries exceeded\niscsiadm: PDU timed out\n";
        assert_eq!(
            summarize_stderr(e),
            "iscsiadm: refused; iscsiadm: retries exceeded; iscsiadm: PDU timed out"
        );
        assert_eq!(summarize_stderr(""), "");
    }

    #[test]
    fn portal_args_are_plain_socket_addresses() {
        assert_eq!(portal_arg(&"10.0.2.2:3260".parse().expect("a")), "10.0.2.2:3260");
        assert_eq!(portal_arg(&"[::1]:3260".parse().expect("a")), "[::1]:3260");
    }

    #[test]
    fn secrets_are_redacted_from_arguments() {
        let a = args(&[
            "-m",
            "node",
            "-o",
            "update",
            "-n",
            AUTH_PASSWORD,
            "-v",
            "s3cr3t-value",
        ]);
        let r = redacted(&a).join(" ");
        assert!(!r.contains("s3cr3t") && r.ends_with("-v ***"), "{r}");
        let plain = args(&["-m", "node", "-n", "node.session.auth.username", "-v", "talon"]);
        assert_eq!(redacted(&plain), plain);
    }

    #[test]
    fn finds_the_session_number_in_a_device_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        std::fs::create_dir_all(root.path("/sys/dev/block")).expect("mkdir");
        std::os::unix::fs::symlink(
            "../../devices/platform/host2/session7/target2:0:0/2:0:0:1/block/sdb",
            root.path("/sys/dev/block/8:16"),
        )
        .expect("link");
        let got = session_of_dev(&root, DevNum { major: 8, minor: 16 }).expect("read");
        assert_eq!(got.as_deref(), Some("session7"));
        assert_eq!(
            session_of_dev(&root, DevNum { major: 8, minor: 0 }).expect("read"),
            None
        );
    }
}
