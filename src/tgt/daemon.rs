//! Supervision of tgtd: start it on one portal with talon's own control socket,
//! verify where it really listens, adopt a running one, stop it cleanly.
//!
//! ```text
//!   Tgtd::start_or_adopt(cfg)
//!     ├─ <run_dir>/tgtd.pid names a live tgtd that answers on <run_dir>/socket.0 ─> adopt
//!     └─ else spawn: tgtd -f --iscsi portal=ADDR:PORT   (TGT_IPC_SOCKET=<run_dir>/socket,
//!                                                        stdout+stderr >> <run_dir>/tgtd.log)
//!          wait until tgtadm answers
//!          /proc/<pid>/fd/* socket inodes ∩ /proc/<pid>/net/tcp{,6} LISTEN rows
//!            == {portal}?  else stop it and fail naming every address it listens on
//!   stop: delete every target --force, tgtadm --op delete --mode system,
//!         wait; SIGKILL by pid only as the last resort (tgtd ignores SIGTERM)
//! ```
//!
//! tgtd silently falls back to listening on all addresses when its portal's
//! port is taken, which is why the listening check is not optional.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::admin::{IPC_SOCKET_ENV, TgtAdm};
use crate::host::HostRoot;
use crate::host::net::{parse_proc_net_tcp, port_holder};

/// The default iSCSI port.
pub const ISCSI_PORT: u16 = 3260;

/// An error of tgtd supervision.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot create tgtd's run directory {path}")]
    RunDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start {program}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("tgtd (pid {pid}) exited while starting ({status}); its log {log} ends with: {tail}")]
    ExitedEarly {
        pid: u32,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("tgtd (pid {pid}) did not answer on {socket} within {waited:?}; see {log}")]
    NotReady {
        pid: u32,
        socket: PathBuf,
        waited: Duration,
        log: PathBuf,
    },
    #[error("tgtd (pid {pid}) listens on {found} instead of only {portal}; it was stopped")]
    WrongPortal {
        pid: u32,
        portal: SocketAddr,
        found: String,
    },
    #[error("the running tgtd (pid {pid}) listens on {found}, not only on {portal}; it was left running")]
    AdoptWrongPortal {
        pid: u32,
        portal: SocketAddr,
        found: String,
    },
    #[error("cannot serve iSCSI on {portal}: the port is in use by {holder} (tgtd pid {pid} was stopped)")]
    PortInUse {
        pid: u32,
        portal: SocketAddr,
        holder: String,
    },
    #[error("tgtd (pid {pid}) does not listen on {portal}")]
    NotListening { pid: u32, portal: SocketAddr },
    #[error("cannot read the sockets of tgtd (pid {pid}) at {path}")]
    ReadSockets {
        pid: u32,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("tgtd (pid {pid}) still runs after delete system and SIGKILL")]
    StillRunning { pid: u32 },
    #[error("cannot write tgtd's pid file {path}")]
    PidFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// How to run tgtd.
#[derive(Debug, Clone)]
pub struct TgtdConfig {
    /// The tgtd binary (default `tgtd` from PATH).
    pub program: PathBuf,
    /// The tgtadm binary (default `tgtadm` from PATH).
    pub tgtadm: PathBuf,
    /// Where the control socket, pid file and log live (e.g. `<data_dir>/run/tgtd`).
    pub run_dir: PathBuf,
    /// The one iSCSI portal tgtd may listen on.
    pub portal: SocketAddr,
    /// The host root (for /proc).
    pub host: HostRoot,
    /// How long to wait for tgtd to answer after it starts.
    pub start_timeout: Duration,
}

impl TgtdConfig {
    /// tgtd from PATH, its files under `run_dir`, listening on `portal`.
    pub fn new(run_dir: impl Into<PathBuf>, portal: SocketAddr) -> Self {
        Self {
            program: PathBuf::from("tgtd"),
            tgtadm: PathBuf::from("tgtadm"),
            run_dir: run_dir.into(),
            portal,
            host: HostRoot::real(),
            start_timeout: Duration::from_secs(10),
        }
    }

    /// The control socket base path (tgtd appends ".0").
    pub fn socket(&self) -> PathBuf {
        self.run_dir.join("socket")
    }

    /// tgtd's log (stdout and stderr, appended).
    pub fn log_path(&self) -> PathBuf {
        self.run_dir.join("tgtd.log")
    }

    /// The pid file talon writes (tgtd -f writes none).
    pub fn pid_path(&self) -> PathBuf {
        self.run_dir.join("tgtd.pid")
    }

    /// The tgtadm client for this tgtd.
    pub fn admin(&self) -> TgtAdm {
        TgtAdm::new(self.socket()).with_program(&self.tgtadm)
    }
}

/// A running tgtd, started or adopted by talon.
#[derive(Debug)]
pub struct Tgtd {
    cfg: TgtdConfig,
    pid: u32,
    /// Set when this process started tgtd (so it can reap it).
    child: Option<Child>,
}

impl Tgtd {
    /// Adopts the tgtd recorded in the run directory if it is alive and answers,
    /// else starts one. Either way it listens only on the configured portal.
    pub fn start_or_adopt(cfg: TgtdConfig) -> Result<Self, DaemonError> {
        match Self::adopt(cfg.clone())? {
            Some(t) => Ok(t),
            None => Self::start(cfg),
        }
    }

    /// Adopts the tgtd named by the pid file, if it is a live tgtd answering on
    /// the control socket; verifies its portal (an adopted tgtd listening
    /// elsewhere is an error, and is left running: talon did not start it).
    pub fn adopt(cfg: TgtdConfig) -> Result<Option<Self>, DaemonError> {
        let recorded = fs::read_to_string(cfg.pid_path())
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .filter(|pid| is_live_tgtd(&cfg.host, *pid));
        // no pid file (a talon killed while its tgtd started): the process behind the control socket
        let Some(pid) = recorded
            .or_else(|| control_socket_pid(&cfg.socket()).filter(|pid| is_live_tgtd(&cfg.host, *pid)))
        else {
            return Ok(None);
        };
        if cfg.admin().ping().is_err() {
            return Ok(None);
        }
        let t = Self {
            cfg,
            pid,
            child: None,
        };
        let found = t.listening()?;
        if found != [t.cfg.portal] {
            let found = found.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ");
            return Err(DaemonError::AdoptWrongPortal {
                pid,
                portal: t.cfg.portal,
                found,
            });
        }
        if recorded.is_none() {
            // record it again, for the next talon and for tools that read the pid file
            let _ = fs::write(t.cfg.pid_path(), format!("{pid}\n"));
        }
        tracing::info!(pid, portal = %t.cfg.portal, "adopted a running tgtd");
        Ok(Some(t))
    }

    /// Starts tgtd, waits until it answers and checks that it listens on the
    /// portal only; otherwise stops it and fails.
    pub fn start(cfg: TgtdConfig) -> Result<Self, DaemonError> {
        crate::util::private::dir(&cfg.run_dir).map_err(|source| DaemonError::RunDir {
            path: cfg.run_dir.clone(),
            source,
        })?;
        let log_path = cfg.log_path();
        let log = crate::util::private::log(&log_path, false).map_err(|source| DaemonError::RunDir {
            path: log_path.clone(),
            source,
        })?;
        let log2 = log.try_clone().map_err(|source| DaemonError::RunDir {
            path: log_path.clone(),
            source,
        })?;
        let child = Command::new(&cfg.program)
            .arg("-f")
            .arg("--iscsi")
            .arg(format!("portal={}", cfg.portal))
            .env(IPC_SOCKET_ENV, cfg.socket())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            // its own process group: a terminal's Ctrl-C to talon does not reach tgtd
            .process_group(0)
            .spawn()
            .map_err(|source| DaemonError::Spawn {
                program: cfg.program.clone(),
                source,
            })?;
        let pid = child.id();
        let mut t = Self {
            cfg,
            pid,
            child: Some(child),
        };
        // the pid file first: if talon dies (kill -9) while tgtd starts, the next talon
        // finds this tgtd (adopts it, or its portal check fails naming it) instead of an orphan
        let pid_path = t.cfg.pid_path();
        if let Err(source) = fs::write(&pid_path, format!("{pid}\n")) {
            t.kill_and_reap();
            return Err(DaemonError::PidFile {
                path: pid_path,
                source,
            });
        }
        if let Err(e) = t.wait_ready() {
            t.kill_and_reap();
            t.remove_pid_file();
            return Err(e);
        }
        match t.listening() {
            Ok(found) if found == [t.cfg.portal] => {}
            Ok(found) => {
                // tgtd falls back to other addresses when its portal's port is taken: say who has it
                let err = match port_holder(&t.cfg.host, t.cfg.portal, Some(pid)) {
                    Some(holder) => DaemonError::PortInUse {
                        pid,
                        portal: t.cfg.portal,
                        holder,
                    },
                    None => wrong_portal(pid, t.cfg.portal, &found),
                };
                t.stop_quietly();
                t.remove_pid_file();
                return Err(err);
            }
            Err(e) => {
                t.stop_quietly();
                t.remove_pid_file();
                return Err(e);
            }
        }
        tracing::info!(pid, portal = %t.cfg.portal, "started tgtd");
        Ok(t)
    }

    fn wait_ready(&mut self) -> Result<(), DaemonError> {
        let start = Instant::now();
        let admin = self.cfg.admin();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(DaemonError::ExitedEarly {
                    pid: self.pid,
                    status: status.to_string(),
                    log: self.cfg.log_path(),
                    tail: log_tail(&self.cfg.log_path()),
                });
            }
            if admin.ping().is_ok() {
                // its portals may appear a moment after the control socket
                let settle = Instant::now() + Duration::from_secs(1);
                while Instant::now() < settle && self.listening().map(|l| l.is_empty()).unwrap_or(true) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                return Ok(());
            }
            if start.elapsed() > self.cfg.start_timeout {
                return Err(DaemonError::NotReady {
                    pid: self.pid,
                    socket: self.cfg.socket(),
                    waited: self.cfg.start_timeout,
                    log: self.cfg.log_path(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// tgtd's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The portal it listens on.
    pub fn portal(&self) -> SocketAddr {
        self.cfg.portal
    }

    /// Its configuration.
    pub fn config(&self) -> &TgtdConfig {
        &self.cfg
    }

    /// Whether this process started it (rather than adopting it).
    pub fn is_child(&self) -> bool {
        self.child.is_some()
    }

    /// The tgtadm client for it.
    pub fn admin(&self) -> TgtAdm {
        self.cfg.admin()
    }

    /// Whether tgtd still runs (reaps it if it was our child and died). A
    /// supervising controller polls this and starts a new one when it is false.
    pub fn is_alive(&mut self) -> bool {
        if let Some(child) = self.child.as_mut() {
            return matches!(child.try_wait(), Ok(None));
        }
        is_live_tgtd(&self.cfg.host, self.pid)
    }

    /// The TCP addresses tgtd listens on, read from `/proc/<pid>/fd` and
    /// `/proc/<pid>/net/tcp{,6}` (sorted).
    pub fn listening(&self) -> Result<Vec<SocketAddr>, DaemonError> {
        listening_sockets(&self.cfg.host, self.pid)
    }

    /// Stops tgtd: deletes every target (--force, sessions included), asks it to
    /// exit, waits, and sends SIGKILL by pid only if it is still there after 5 s.
    pub fn stop(mut self) -> Result<(), DaemonError> {
        if !self.is_alive() {
            self.remove_pid_file();
            return Ok(());
        }
        let admin = self.cfg.admin();
        let pid = self.pid;
        let result = (|| {
            for t in admin.show()? {
                admin.delete_target(t.tid, true)?;
            }
            admin.delete_system()
        })();
        if let Err(source) = result {
            tracing::warn!(pid, error = %source, "tgtd refused to shut down; killing it");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.is_alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.is_alive() {
            tracing::warn!(pid, "tgtd did not exit; sending SIGKILL");
            self.kill_and_reap();
            if self.is_alive() {
                return Err(DaemonError::StillRunning { pid });
            }
        }
        self.remove_pid_file();
        Ok(())
    }

    fn stop_quietly(&mut self) {
        let admin = self.cfg.admin();
        let _ = admin.delete_system();
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.is_alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill_and_reap();
    }

    fn kill_and_reap(&mut self) {
        if self.is_alive()
            && let Ok(pid) = i32::try_from(self.pid)
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if let Some(child) = self.child.as_mut() {
            let _ = child.wait();
        } else {
            let deadline = Instant::now() + Duration::from_secs(2);
            while self.is_alive() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn remove_pid_file(&self) {
        let _ = fs::remove_file(self.cfg.pid_path());
    }
}

/// The pid of the process listening on tgtd's control socket (`<base>.0`),
/// from SO_PEERCRED.
fn control_socket_pid(base: &Path) -> Option<u32> {
    let mut path = base.as_os_str().to_owned();
    path.push(".0");
    let stream = std::os::unix::net::UnixStream::connect(PathBuf::from(path)).ok()?;
    let cred = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    u32::try_from(cred.pid()).ok()
}

/// Whether `pid` is a tgtd that has not exited (a zombie has exited).
fn is_live_tgtd(host: &HostRoot, pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(host.path(format!("/proc/{pid}/stat"))) else {
        return false;
    };
    // "<pid> (<comm>) <state> ..."; comm may contain spaces and parentheses
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return false;
    };
    let comm = &stat[open + 1..close];
    let state = stat[close + 1..].split_whitespace().next().unwrap_or("");
    comm == "tgtd" && !matches!(state, "Z" | "X" | "x")
}

fn wrong_portal(pid: u32, portal: SocketAddr, found: &[SocketAddr]) -> DaemonError {
    if found.is_empty() {
        return DaemonError::NotListening { pid, portal };
    }
    let found = found.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ");
    DaemonError::WrongPortal { pid, portal, found }
}

fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// The TCP addresses process `pid` listens on: the socket inodes among its file
/// descriptors, matched with LISTEN rows of its network namespace's
/// `/proc/<pid>/net/tcp` and `tcp6`.
pub fn listening_sockets(host: &HostRoot, pid: u32) -> Result<Vec<SocketAddr>, DaemonError> {
    let fd_dir = host.path(format!("/proc/{pid}/fd"));
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DaemonError::ReadSockets { pid, path, source }
    };
    let mut inodes = HashSet::new();
    for entry in fs::read_dir(&fd_dir).map_err(read_err(&fd_dir))? {
        let Ok(entry) = entry else { continue };
        if let Ok(target) = fs::read_link(entry.path())
            && let Some(inode) = target
                .to_str()
                .and_then(|s| s.strip_prefix("socket:["))
                .and_then(|s| s.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let mut found = Vec::new();
    for table in ["tcp", "tcp6"] {
        let path = host.path(format!("/proc/{pid}/net/{table}"));
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // no IPv6
            Err(e) => return Err(read_err(&path)(e)),
        };
        found.extend(
            parse_proc_net_tcp(&text)
                .into_iter()
                .filter(|(_, i)| inodes.contains(i))
                .map(|(a, _)| a),
        );
    }
    found.sort();
    found.dedup();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_match_fd_inodes() {
        // A fixture /proc: fd 3 is socket 4242 (127.0.0.1:13999), 4243 belongs to another process.
        let dir = tempfile::tempdir().expect("tempdir");
        let host = HostRoot::new(dir.path());
        let fd = dir.path().join("proc/7/fd");
        fs::create_dir_all(&fd).expect("fd dir");
        fs::create_dir_all(dir.path().join("proc/7/net")).expect("net dir");
        std::os::unix::fs::symlink("socket:[4242]", fd.join("3")).expect("link");
        std::os::unix::fs::symlink("/dev/null", fd.join("0")).expect("link");
        let table = "header
   0: 0100007F:36AF 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 0
   1: 00000000:0CBC 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4243 1 0 100 0 0 10 0
";
        fs::write(dir.path().join("proc/7/net/tcp"), table).expect("tcp");
        let found = listening_sockets(&host, 7).expect("sockets");
        if cfg!(target_endian = "little") {
            assert_eq!(
                found,
                vec!["127.0.0.1:13999".parse::<SocketAddr>().expect("addr")]
            );
        }
        let err = listening_sockets(&host, 8).expect_err("no such pid");
        assert!(err.to_string().contains("pid 8"), "{err}");
    }

    #[test]
    fn zombies_and_other_programs_are_not_live_tgtds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = HostRoot::new(dir.path());
        for (pid, stat) in [
            (1, "1 (tgtd) S 0 1"),
            (2, "2 (tgtd) Z 0 2"),
            (3, "3 (a (tgtd)) S 1"),
        ] {
            fs::create_dir_all(dir.path().join(format!("proc/{pid}"))).expect("dir");
            fs::write(dir.path().join(format!("proc/{pid}/stat")), stat).expect("stat");
        }
        assert!(is_live_tgtd(&host, 1));
        assert!(!is_live_tgtd(&host, 2), "zombie");
        assert!(!is_live_tgtd(&host, 3), "other program");
        assert!(!is_live_tgtd(&host, 4), "gone");
    }

    #[test]
    fn wrong_portal_names_every_address() {
        let p: SocketAddr = "127.0.0.1:3260".parse().expect("addr");
        let e = wrong_portal(
            9,
            p,
            &[
                "0.0.0.0:3260".parse().expect("a"),
                "[::]:3260".parse().expect("a"),
            ],
        );
        assert_eq!(
            e.to_string(),
            "tgtd (pid 9) listens on 0.0.0.0:3260, [::]:3260 instead of only 127.0.0.1:3260; it was stopped"
        );
        assert!(matches!(
            wrong_portal(9, p, &[]),
            DaemonError::NotListening { .. }
        ));
    }
}
