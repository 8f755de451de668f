//! spdk_tgt supervision as a library: find the binary, build its argv, spawn
//! it or adopt one already answering on the socket, wait for readiness,
//! stop it, and a restart-with-backoff loop that reports [`TargetEvent`]s.
//!
//! ```text
//!  TargetConfig ──find_spdk_tgt──> /…/spdk_tgt ──argv()──> spawn ─┐
//!        │                                                        v
//!        └── socket answers spdk_get_version? ── yes ──> adopt   wait_ready (spdk_get_version,
//!                                                          │      backoff, child exit checked)
//!                                                          v              │
//!  supervise(): Started/Adopted ─> wait for exit ─> Exited ─> Restarting(after backoff) ─┘
//!               shutdown ─> stop: SIGINT, grace period, SIGKILL ─> Stopped
//!  TargetConfig.embedded (spdk-embedded feature) ──> embedded::Embedded: the framework on a
//!               thread of talon, same socket, same wait_ready; never restarted in-process
//! ```
//!
//! Memory: `-s` is 1024 MiB + 8 MiB per exported volume unless set (the
//! target controller sets it from the use seen, [`super::launch::sized_mem_mib`]);
//! with `--no-huge` the given `-s` is taken from ordinary memory (development).
//! `-u` (no PCI) unless PCI NVMe disks are configured. The RPC socket lives
//! under the run dir.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::client::SpdkClient;
use super::rpc::Version;
use crate::util::Backoff;

use super::launch::probe;
pub use super::launch::{
    Memory, TargetConfig, TargetError, find_spdk_tgt, interrupt_mode_program, mem_size_mib_for,
    start_failure_cause, wait_ready,
};

/// How talon came to hold the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// talon started it.
    Spawned,
    /// It was already answering on the socket.
    Adopted,
    /// The SPDK framework runs in talon (`--engine spdk-embedded`).
    Embedded,
}

/// A running spdk_tgt.
#[derive(Debug)]
pub struct Target {
    client: SpdkClient,
    origin: Origin,
    pid: Option<i32>,
    child: Option<Child>,
    version: Version,
    #[cfg(feature = "spdk-embedded")]
    embedded: Option<super::embedded::Embedded>,
    /// Copies its log file into talon's log while talon holds it.
    log: Option<LogForward>,
}

/// A task that copies new lines of spdk_tgt's log file into talon's log
/// (tracing target `spdk_tgt`); ends when dropped.
#[derive(Debug)]
struct LogForward(tokio::task::JoinHandle<()>);

impl Drop for LogForward {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl LogForward {
    /// Follows `path` from its start, or from its current end (an adopted
    /// target whose earlier lines were seen by the talon before).
    fn follow(path: PathBuf, from_end: bool) -> Self {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        LogForward(tokio::spawn(async move {
            let mut pos = if from_end {
                std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0)
            } else {
                0
            };
            let mut partial = String::new();
            loop {
                if let Ok(mut f) = tokio::fs::File::open(&path).await {
                    let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
                    if len < pos {
                        pos = 0; // started afresh: another target
                    }
                    if len > pos && f.seek(io::SeekFrom::Start(pos)).await.is_ok() {
                        let mut buf = Vec::new();
                        if let Ok(n) = f.take(len - pos).read_to_end(&mut buf).await {
                            pos += n as u64;
                            partial.push_str(&String::from_utf8_lossy(&buf));
                            while let Some(i) = partial.find('\n') {
                                let line: String = partial.drain(..=i).collect();
                                let line = line.trim_end();
                                if !line.is_empty() {
                                    tracing::info!(target: "spdk_tgt", "{line}");
                                }
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }))
    }
}

impl Target {
    /// Adopts a target already answering on `socket`; `None` if none answers.
    pub async fn adopt(socket: &Path) -> Option<Target> {
        let (client, version, pid) = probe(socket).await?;
        Some(Target {
            client,
            origin: Origin::Adopted,
            pid,
            child: None,
            version,
            #[cfg(feature = "spdk-embedded")]
            embedded: None,
            log: None,
        })
    }

    /// Adopts a target on the config's socket, or spawns one and waits until
    /// it answers; with `cfg.embedded`, starts the framework in-process
    /// instead (never adopts).
    pub async fn start(cfg: &TargetConfig) -> Result<Target, TargetError> {
        if cfg.embedded {
            return Self::start_embedded(cfg).await;
        }
        if let Some(mut t) = Self::adopt(&cfg.socket()).await {
            tracing::info!(pid = ?t.pid, version = %t.version.version, "adopted a running spdk_tgt");
            t.log = Some(LogForward::follow(cfg.log_path(), true));
            return Ok(t);
        }
        Self::spawn(cfg).await
    }

    #[cfg(feature = "spdk-embedded")]
    async fn start_embedded(cfg: &TargetConfig) -> Result<Target, TargetError> {
        let (embedded, version) = super::embedded::Embedded::start(cfg).await?;
        Ok(Target {
            client: SpdkClient::new(cfg.socket()),
            origin: Origin::Embedded,
            pid: i32::try_from(std::process::id()).ok(),
            child: None,
            version,
            embedded: Some(embedded),
            log: None,
        })
    }

    #[cfg(not(feature = "spdk-embedded"))]
    async fn start_embedded(_cfg: &TargetConfig) -> Result<Target, TargetError> {
        Err(TargetError::EmbeddedNotBuilt)
    }

    /// Spawns spdk_tgt (never adopts) and waits until it answers.
    pub async fn spawn(cfg: &TargetConfig) -> Result<Target, TargetError> {
        let path_var = std::env::var_os("PATH");
        let mut bin = find_spdk_tgt(
            cfg.spdk_tgt.as_deref(),
            cfg.spdk_dir.as_deref(),
            path_var.as_deref(),
        )?;
        // argv[0] is the bare name of the program asked for: Longhorn's liveness probe
        // of the V2 instance-manager pod looks for a process whose command line starts
        // with `spdk_tgt` (`pgrep -f '^spdk_tgt'`), also when interrupt mode runs
        // nvmf_tgt in its place (/proc/<pid>/exe and the log name the real binary)
        let arg0 = bin
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_else(|| bin.clone().into());
        if cfg.interrupt_mode {
            bin = interrupt_mode_program(&bin);
        }
        crate::util::private::dir(&cfg.run_dir).map_err(|source| TargetError::RunDir {
            path: cfg.run_dir.clone(),
            source,
        })?;
        let socket = cfg.socket();
        // A socket file nobody answers on is stale (a crashed target).
        let _ = std::fs::remove_file(&socket);
        let log_path = cfg.log_path();
        let log_err = |source| TargetError::RunDir {
            path: log_path.clone(),
            source,
        };
        // afresh for each target, appended to (so that a copytruncate rotation
        // leaves no hole), root's only
        let log = crate::util::private::log(&log_path, true).map_err(log_err)?;
        let log2 = log.try_clone().map_err(log_err)?;
        let mut child = Command::new(&bin)
            .arg0(arg0)
            .args(cfg.argv())
            .stdin(std::process::Stdio::null())
            // a file, not talon's stdout: the target outlives talon (a pipe would break)
            .stdout(log)
            .stderr(log2)
            .kill_on_drop(false)
            // its own process group: a terminal's Ctrl-C to talon does not reach it, and it
            // outlives talon (the next talon adopts it)
            .process_group(0)
            .spawn()
            .map_err(|source| TargetError::Spawn {
                path: bin.clone(),
                source,
            })?;
        let pid = child.id().and_then(|p| i32::try_from(p).ok());
        tracing::info!(?pid, bin = %bin.display(), "spawned spdk_tgt");
        let client = SpdkClient::new(&socket);
        let ready = wait_ready(&client, Some(&mut child), cfg.ready_timeout)
            .await
            .map_err(|e| match e {
                TargetError::ExitedEarly {
                    pid, status, socket, ..
                } => {
                    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                    let cause = format!("{} (log: {})", start_failure_cause(&text), log_path.display());
                    tracing::warn!(pid, %status, %cause, "spdk_tgt could not start");
                    TargetError::ExitedEarly {
                        pid,
                        status,
                        socket,
                        cause,
                    }
                }
                e => e,
            });
        match ready {
            Ok(version) => Ok(Target {
                client,
                origin: Origin::Spawned,
                pid,
                child: Some(child),
                version,
                #[cfg(feature = "spdk-embedded")]
                embedded: None,
                log: Some(LogForward::follow(log_path.clone(), false)),
            }),
            Err(e) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                Err(e)
            }
        }
    }

    /// The client on its socket.
    pub fn client(&self) -> &SpdkClient {
        &self.client
    }

    /// Spawned or adopted.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The process id, when known.
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// The version it answered at readiness.
    pub fn version(&self) -> &Version {
        &self.version
    }

    /// Lets go of the target without stopping it (an in-process one runs
    /// until talon exits).
    pub fn release(mut self) {
        self.child.take();
        #[cfg(feature = "spdk-embedded")]
        if let Some(e) = self.embedded.take() {
            std::mem::forget(e);
        }
    }

    /// Waits until the target exits: the child's status for a spawned
    /// target; for an adopted one, until its socket stops answering.
    pub async fn wait_exit(&mut self) -> Result<String, TargetError> {
        #[cfg(feature = "spdk-embedded")]
        if let Some(e) = self.embedded.as_mut() {
            return Ok(e.wait_exit().await);
        }
        if let Some(c) = self.child.as_mut() {
            let pid = c.id().unwrap_or(0);
            let status = c
                .wait()
                .await
                .map_err(|source| TargetError::Wait { pid, source })?;
            return Ok(status.to_string());
        }
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let probe = self
                .client
                .call_with_timeout::<(), Version>("spdk_get_version", None, Duration::from_secs(5))
                .await;
            if let Err(e) = probe
                && e.is_transport()
            {
                return Ok(format!("stopped answering: {e}"));
            }
        }
    }

    /// Stops it: SIGINT, then SIGKILL if it has not exited after `grace`.
    /// Returns how it ended.
    pub async fn stop(mut self, grace: Duration) -> Result<String, TargetError> {
        self.client.disconnect().await;
        #[cfg(feature = "spdk-embedded")]
        if let Some(e) = self.embedded.take() {
            return Ok(e.stop().await);
        }
        let Some(pid) = self.pid else {
            return Ok("unknown pid: not signalled".into());
        };
        if in_process(pid) {
            // An in-process target (spdk-embedded, or a test double).
            return Ok("in-process target: not signalled".into());
        }
        let signal = |s: Signal| signal(pid, s);
        signal(Signal::SIGINT)?;
        if let Some(mut c) = self.child.take() {
            let upid = c.id().unwrap_or(0);
            match tokio::time::timeout(grace, c.wait()).await {
                Ok(r) => {
                    return r
                        .map(|s| s.to_string())
                        .map_err(|source| TargetError::Wait { pid: upid, source });
                }
                Err(_) => {
                    signal(Signal::SIGKILL)?;
                    let s = c
                        .wait()
                        .await
                        .map_err(|source| TargetError::Wait { pid: upid, source })?;
                    return Ok(format!("{s} (killed after {grace:?})"));
                }
            }
        }
        // Adopted: not our child; watch the pid disappear.
        let deadline = Instant::now() + grace;
        let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(200));
        while kill(Pid::from_raw(pid), None).is_ok() {
            if Instant::now() >= deadline {
                signal(Signal::SIGKILL)?;
                return Ok(format!("killed after {grace:?}"));
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
        Ok("exited".into())
    }

    /// [`Self::stop`] without a runtime (for `Drop`): SIGINT, wait up to
    /// `grace`, SIGKILL; a child of ours is reaped.
    pub fn stop_blocking(self, grace: Duration) {
        let (pid, origin) = (self.pid, self.origin);
        drop(self);
        let Some(pid) = pid else { return };
        if in_process(pid) {
            return; // an in-process target (a test double, spdk-embedded)
        }
        let p = Pid::from_raw(pid);
        let gone = || match origin {
            // our child: reap it (a zombie would still answer kill(0))
            Origin::Spawned => match waitpid(p, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => false,
                Ok(_) => true,
                Err(_) => kill(p, None).is_err(),
            },
            Origin::Adopted | Origin::Embedded => kill(p, None).is_err(),
        };
        if kill(p, Signal::SIGINT).is_err() {
            return;
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if gone() {
                tracing::info!(pid, "spdk_tgt stopped");
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!(pid, ?grace, "spdk_tgt did not stop on SIGINT; killing it");
        let _ = signal(pid, Signal::SIGKILL);
        if origin == Origin::Spawned {
            let _ = waitpid(p, None);
        }
    }
}

/// Whether `pid` is this process (an in-process target: never signalled).
fn in_process(pid: i32) -> bool {
    u32::try_from(pid).ok() == Some(std::process::id())
}

/// Sends `s` to `pid`; a process already gone is no error.
fn signal(pid: i32, s: Signal) -> Result<(), TargetError> {
    match kill(Pid::from_raw(pid), s) {
        Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
        Err(source) => Err(TargetError::Signal {
            pid,
            signal: s,
            source,
        }),
    }
}

/// What the supervision loop reports; the controller reconciles SPDK
/// objects back after `Started` following an `Exited`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetEvent {
    /// talon started the target and it answered.
    Started {
        /// Its pid.
        pid: Option<i32>,
        /// Its version string.
        version: String,
    },
    /// A running target was adopted.
    Adopted {
        /// Its pid.
        pid: Option<i32>,
        /// Its version string.
        version: String,
    },
    /// The target exited or stopped answering.
    Exited {
        /// How.
        status: String,
    },
    /// A start failed.
    StartFailed {
        /// Why.
        error: String,
    },
    /// The next start comes after this delay.
    Restarting {
        /// 1 for the first restart.
        attempt: u32,
        /// The delay.
        after: Duration,
    },
    /// Stopped on shutdown.
    Stopped {
        /// How it ended.
        status: String,
    },
}

/// Runs the target until `shutdown` completes: adopt or start it, restart it
/// with backoff (100 ms doubling to 30 s, reset after a minute of uptime)
/// whenever it exits or fails to start, and stop it on shutdown. Events go
/// to `events`; a closed receiver does not stop the loop.
pub async fn supervise(
    cfg: TargetConfig,
    events: mpsc::Sender<TargetEvent>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
    loop {
        let started = tokio::select! {
            r = Target::start(&cfg) => r,
            _ = &mut shutdown => return,
        };
        match started {
            Ok(mut t) => {
                let (pid, version) = (t.pid(), t.version().version.clone());
                let ev = match t.origin() {
                    Origin::Spawned | Origin::Embedded => TargetEvent::Started { pid, version },
                    Origin::Adopted => TargetEvent::Adopted { pid, version },
                };
                let _ = events.send(ev).await;
                let up = Instant::now();
                let ended = tokio::select! {
                    r = t.wait_exit() => Some(r),
                    _ = &mut shutdown => None,
                };
                match ended {
                    None => {
                        let status = match t.stop(cfg.stop_grace).await {
                            Ok(s) => s,
                            Err(e) => e.to_string(),
                        };
                        let _ = events.send(TargetEvent::Stopped { status }).await;
                        return;
                    }
                    Some(r) => {
                        let status = r.unwrap_or_else(|e| e.to_string());
                        let _ = events.send(TargetEvent::Exited { status }).await;
                        if up.elapsed() > Duration::from_secs(60) {
                            backoff.reset();
                        }
                    }
                }
            }
            Err(e) => {
                let permanent = e.is_permanent();
                let _ = events
                    .send(TargetEvent::StartFailed { error: e.to_string() })
                    .await;
                if permanent {
                    return;
                }
            }
        }
        let after = backoff.next_delay();
        let _ = events
            .send(TargetEvent::Restarting {
                attempt: backoff.attempts(),
                after,
            })
            .await;
        tokio::select! {
            _ = tokio::time::sleep(after) => {}
            _ = &mut shutdown => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_for_hugepages_and_volumes() {
        let mut c = TargetConfig::new("/run/talon");
        c.exported_volumes = 4;
        let a: Vec<String> = c
            .argv()
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert_eq!(a, ["-m", "0x1", "-s", "1056", "-u", "-r", "/run/talon/spdk.sock"]);
    }

    #[test]
    fn argv_for_no_huge_pci_interrupt() {
        let mut c = TargetConfig::new("/run/talon");
        c.memory = Memory::NoHuge { mem_size_mib: 1024 };
        c.pci_disks = true;
        c.interrupt_mode = true;
        c.cpumask = "0x3".into();
        let a: Vec<String> = c
            .argv()
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            a,
            [
                "-m",
                "0x3",
                "--no-huge",
                "-s",
                "1024",
                "-r",
                "/run/talon/spdk.sock",
                "--interrupt-mode"
            ]
        );
    }

    #[test]
    fn start_failure_causes_are_named() {
        let lock = "[2026-11-23 21:40:01.1] app.c: 799:claim_cpu_cores: *ERROR*: Cannot create lock on core 3, \
                    probably process 977 has claimed it.\nUnable to acquire lock on assigned core mask - exiting.\n";
        let c = start_failure_cause(lock);
        assert!(
            c.starts_with("core 3 is locked by another SPDK process (pid 977)"),
            "{c}"
        );
        let huge = "EAL: No free 2048 kB hugepages reported on node 0\n\
                    EAL: Not enough memory available on socket 0! Requested: 4812MB, available: 882MB\n\
                    EAL: FATAL: Cannot init memory\n";
        let c = start_failure_cause(huge);
        assert!(c.starts_with("not enough hugepages"), "{c}");
        assert!(c.contains("Requested: 4812MB, available: 882MB"), "{c}");
        let sock = "rpc.c: 181:spdk_rpc_listen: *ERROR*: RPC Unix domain socket path /run/talon/spdk.sock in use. \
                    Specify another.\n";
        assert!(start_failure_cause(sock).starts_with("its RPC socket is in use"));
        assert_eq!(start_failure_cause(""), "it wrote nothing");
        assert_eq!(
            start_failure_cause("a\nb\nc\nd\n"),
            "its log ends with: b | c | d"
        );
    }

    #[test]
    fn interrupt_mode_runs_nvmf_tgt_when_it_is_beside_spdk_tgt() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().expect("tempdir");
        let spdk = d.path().join("spdk_tgt");
        let nvmf = d.path().join("nvmf_tgt");
        std::fs::write(&spdk, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&spdk, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(interrupt_mode_program(&spdk), spdk, "no nvmf_tgt: spdk_tgt");
        std::fs::write(&nvmf, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&nvmf, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(interrupt_mode_program(&spdk), nvmf);
        let other = d.path().join("my_tgt");
        assert_eq!(interrupt_mode_program(&other), other, "another binary is kept");
    }

    #[test]
    fn mem_size_grows_per_volume() {
        assert_eq!(mem_size_mib_for(0), 1024);
        assert_eq!(mem_size_mib_for(10), 1104);
    }

    #[test]
    fn finds_in_order_explicit_dir_path() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().expect("tempdir");
        let mk = |p: &Path| {
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        };
        let explicit = d.path().join("x/spdk_tgt");
        let in_dir = d.path().join("spdk/build/bin/spdk_tgt");
        let in_path = d.path().join("bin/spdk_tgt");
        let path_var = std::env::join_paths([d.path().join("nope"), d.path().join("bin")]).expect("join");
        let e = find_spdk_tgt(None, Some(&d.path().join("spdk")), Some(&path_var)).expect_err("none");
        assert!(e.to_string().contains("spdk_tgt was not found"), "{e}");
        // each directory once, by its name or through a link, without the program's name
        let link = d.path().join("bin-link");
        std::fs::create_dir_all(d.path().join("bin")).expect("mkdir");
        std::os::unix::fs::symlink(d.path().join("bin"), &link).expect("symlink");
        let twice = std::env::join_paths([
            d.path().join("bin"),
            d.path().join("nope"),
            d.path().join("bin"),
            link,
        ])
        .expect("join");
        let e = find_spdk_tgt(None, Some(&d.path().join("spdk")), Some(&twice)).expect_err("none");
        let dir = |p: &str| d.path().join(p).display().to_string();
        assert_eq!(
            e.to_string(),
            format!(
                "spdk_tgt was not found in {}, {}, {}",
                dir("spdk/build/bin"),
                dir("bin"),
                dir("nope")
            )
        );
        mk(&in_path);
        assert_eq!(
            find_spdk_tgt(None, Some(&d.path().join("spdk")), Some(&path_var)).expect("p"),
            in_path
        );
        mk(&in_dir);
        assert_eq!(
            find_spdk_tgt(None, Some(&d.path().join("spdk")), Some(&path_var)).expect("d"),
            in_dir
        );
        // an explicit binary that is missing is an error naming it, even with
        // others to be found: a wrong --spdk-tgt is never replaced quietly
        let e = find_spdk_tgt(Some(&explicit), Some(&d.path().join("spdk")), Some(&path_var))
            .expect_err("explicit missing");
        assert!(e.to_string().contains(&explicit.display().to_string()), "{e}");
        assert!(!e.to_string().contains("build/bin"), "{e}");
        mk(&explicit);
        assert_eq!(
            find_spdk_tgt(Some(&explicit), Some(&d.path().join("spdk")), Some(&path_var)).expect("e"),
            explicit
        );
    }

    #[cfg(not(feature = "spdk-embedded"))]
    #[tokio::test]
    async fn embedded_without_the_feature_is_a_permanent_failure() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut c = TargetConfig::new(d.path());
        c.embedded = true;
        let e = Target::start(&c).await.expect_err("no feature");
        assert!(matches!(e, TargetError::EmbeddedNotBuilt), "{e}");
        assert!(e.is_permanent());
        assert!(e.to_string().contains("--features spdk-embedded"), "{e}");
        // supervise reports it once and gives up instead of retrying
        let (tx, mut rx) = mpsc::channel(8);
        supervise(c, tx, std::future::pending()).await;
        let ev = rx.recv().await.expect("an event");
        assert!(matches!(ev, TargetEvent::StartFailed { .. }), "{ev:?}");
        assert!(rx.recv().await.is_none(), "no restart after a permanent failure");
    }
}
