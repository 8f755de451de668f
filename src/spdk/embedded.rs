//! The SPDK application framework in-process (`talon serve --engine
//! spdk-embedded`, built with the `spdk-embedded` feature): the same target
//! spdk_tgt would be, on a dedicated OS thread of talon, answering JSON-RPC
//! on the same socket, so every controller drives it unchanged.
//!
//! ```text
//!   TargetConfig ──opts──> thread "spdk-reactor" ── spdk_app_start (EAL init, reactor 0 on this
//!   (socket, -m, -s,          │                     thread, other reactors on their cores,
//!    --no-huge, -u,           │                     RPC server on <run_dir>/spdk.sock) ... blocks
//!    interrupt mode)          │                       │ on_started: phase Running
//!                             │                       v
//!   wait_ready (spdk_get_version on the socket) or the thread ended ──> Embedded
//!   stop: spdk_app_start_shutdown (a critical message to the app thread; thread-safe)
//!         ──> spdk_app_start returns ──> spdk_app_fini (same thread) ──> join
//! ```
//!
//! DPDK's EAL initializes once per process: once `spdk_app_start` has run, a
//! second start in this process fails with [`TargetError::EmbeddedAlreadyRan`]
//! (talon must be restarted), which the target controller reports instead of
//! retrying. SPDK's own signal handlers are off: talon handles SIGINT/SIGTERM
//! and stops the framework on the way out.

use std::ffi::{CString, c_void};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::client::SpdkClient;
use super::launch::{Memory, TargetConfig, TargetError, probe, wait_ready};
use super::rpc::Version;

/// Where the framework of this process is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// `spdk_app_start` never ran here.
    NotRun,
    /// The thread is in `spdk_app_start`; the app thread may not exist yet.
    Starting,
    /// Subsystems are up (the start callback ran); shutdown can be requested.
    Running,
    /// `spdk_app_start` returned; how.
    Ended(String),
}

/// One framework per process (DPDK's EAL is process-global).
static PHASE: Mutex<Phase> = Mutex::new(Phase::NotRun);

fn phase() -> MutexGuard<'static, Phase> {
    // A panic while holding the lock leaves a valid Phase behind.
    PHASE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `spdk_app_start`'s start callback, on the app thread once every subsystem
/// is initialized.
extern "C" fn on_started(_ctx: *mut c_void) {
    let mut p = phase();
    if *p == Phase::Starting {
        *p = Phase::Running;
    }
    tracing::info!("in-process SPDK framework started");
}

/// Options that must outlive `spdk_app_start` (SPDK keeps the pointers).
#[derive(Debug)]
struct Strings {
    name: CString,
    rpc_addr: CString,
    reactor_mask: CString,
}

fn cstring(name: &'static str, value: String) -> Result<CString, TargetError> {
    CString::new(value.clone()).map_err(|_| TargetError::EmbeddedOption { name, value })
}

/// The framework options from a [`TargetConfig`], without pointers yet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Settings {
    mem_size_mib: i32,
    no_huge: bool,
    no_pci: bool,
    interrupt_mode: bool,
    disable_cpumask_locks: bool,
}

impl Settings {
    /// Maps the spdk_tgt settings; of `extra_args`, only
    /// `--disable-cpumask-locks` has an in-process equivalent.
    fn from_config(cfg: &TargetConfig) -> Result<Settings, TargetError> {
        let mut disable_cpumask_locks = false;
        for a in &cfg.extra_args {
            if a == "--disable-cpumask-locks" {
                disable_cpumask_locks = true;
            } else {
                return Err(TargetError::EmbeddedOption {
                    name: "extra argument",
                    value: a.to_string_lossy().into_owned(),
                });
            }
        }
        let mem = cfg.mem_size_mib();
        Ok(Settings {
            mem_size_mib: i32::try_from(mem).map_err(|_| TargetError::EmbeddedOption {
                name: "memory size (MiB)",
                value: mem.to_string(),
            })?,
            no_huge: matches!(cfg.memory, Memory::NoHuge { .. }),
            no_pci: !cfg.pci_disks,
            interrupt_mode: cfg.interrupt_mode,
            disable_cpumask_locks,
        })
    }
}

/// The body of the reactor thread: runs the framework until it stops, then
/// tears it down; returns `spdk_app_start`'s result.
fn run_framework(strings: &Strings, s: &Settings) -> i32 {
    let mut opts = spdk_sys::spdk_app_opts::default();
    // SAFETY: `opts` is a valid, writable spdk_app_opts of exactly the size passed.
    unsafe { spdk_sys::spdk_app_opts_init(&mut opts, std::mem::size_of::<spdk_sys::spdk_app_opts>()) };
    opts.name = strings.name.as_ptr();
    opts.rpc_addr = strings.rpc_addr.as_ptr();
    opts.reactor_mask = strings.reactor_mask.as_ptr();
    opts.mem_size = s.mem_size_mib;
    opts.no_huge = s.no_huge;
    // hugepage files are removed once mapped: nothing is left under
    // /dev/hugepages if talon dies
    opts.unlink_hugepage = !s.no_huge;
    opts.no_pci = s.no_pci;
    opts.interrupt_mode = s.interrupt_mode;
    opts.disable_cpumask_locks = s.disable_cpumask_locks;
    // talon owns SIGINT/SIGTERM and stops the framework itself
    opts.disable_signal_handlers = true;
    // SAFETY: `opts` was initialized by spdk_app_opts_init; every pointer in it
    // points into `strings`, which outlives this call and spdk_app_fini below;
    // `on_started` matches spdk_msg_fn and ignores its (null) argument. Only
    // one thread per process gets here (PHASE goes NotRun -> Starting once).
    let rc = unsafe { spdk_sys::spdk_app_start(&mut opts, Some(on_started), std::ptr::null_mut()) };
    // No shutdown request may reach the app thread from now on (see `request_shutdown`).
    *phase() = Phase::Ended(format!("spdk_app_start returned {rc}"));
    // SAFETY: called once, on the thread that ran spdk_app_start, after it
    // returned (spdk_tgt does the same, also after a failed start).
    unsafe { spdk_sys::spdk_app_fini() };
    rc
}

/// The running in-process framework.
#[derive(Debug)]
pub struct Embedded {
    thread: Option<JoinHandle<i32>>,
    /// `Some(rc)` once `spdk_app_start` returned and the framework is torn down.
    done: watch::Receiver<Option<i32>>,
    socket: PathBuf,
    /// How long a stop waits for a framework still starting.
    start_timeout: Duration,
    /// How long a stop waits for the framework to end.
    stop_grace: Duration,
}

impl Embedded {
    /// Starts the framework on its own thread and waits until it answers
    /// `spdk_get_version` on the config's socket.
    pub async fn start(cfg: &TargetConfig) -> Result<(Embedded, Version), TargetError> {
        let socket = cfg.socket();
        let settings = Settings::from_config(cfg)?;
        let strings = Strings {
            name: cstring("name", "talon".into())?,
            rpc_addr: cstring("RPC socket", socket.display().to_string())?,
            reactor_mask: cstring("cpumask", cfg.cpumask.clone())?,
        };
        std::fs::create_dir_all(&cfg.run_dir).map_err(|source| TargetError::RunDir {
            path: cfg.run_dir.clone(),
            source,
        })?;
        if let Some((_, _, pid)) = probe(&socket).await {
            return Err(TargetError::SocketInUse { socket, pid });
        }
        // A socket file nobody answers on is stale (a crashed target).
        let _ = std::fs::remove_file(&socket);

        {
            let mut p = phase();
            match &*p {
                Phase::NotRun => *p = Phase::Starting,
                Phase::Ended(how) => {
                    return Err(TargetError::EmbeddedAlreadyRan {
                        socket,
                        how: how.clone(),
                    });
                }
                Phase::Starting | Phase::Running => {
                    return Err(TargetError::EmbeddedAlreadyRan {
                        socket,
                        how: "still running".into(),
                    });
                }
            }
        }
        let (tx, done) = watch::channel(None);
        let spawned = std::thread::Builder::new()
            .name("spdk-reactor".into())
            .spawn(move || {
                let rc = run_framework(&strings, &settings);
                let _ = tx.send(Some(rc));
                rc
            });
        let thread = match spawned {
            Ok(t) => t,
            Err(source) => {
                *phase() = Phase::NotRun;
                return Err(TargetError::EmbeddedThread { socket, source });
            }
        };
        tracing::info!(socket = %socket.display(), cpumask = %cfg.cpumask, "started the in-process SPDK framework");
        let e = Embedded {
            thread: Some(thread),
            done,
            socket: socket.clone(),
            start_timeout: cfg.ready_timeout,
            stop_grace: cfg.stop_grace,
        };
        let client = SpdkClient::new(&socket);
        let mut ended = e.done.clone();
        let ready = tokio::select! {
            r = wait_ready(&client, None, cfg.ready_timeout) => r,
            rc = ended.wait_for(Option::is_some) => Err(TargetError::EmbeddedExited {
                socket: socket.clone(),
                rc: rc.ok().and_then(|r| *r).unwrap_or(-1),
            }),
        };
        client.disconnect().await;
        match ready {
            Ok(v) => Ok((e, v)),
            Err(err) => {
                let status = e.stop().await;
                tracing::warn!(%status, "the in-process SPDK framework did not come up");
                Err(err)
            }
        }
    }

    /// Waits until the framework stops by itself; returns how.
    pub async fn wait_exit(&mut self) -> String {
        match self.done.wait_for(Option::is_some).await {
            Ok(rc) => format!("spdk_app_start returned {}", rc.unwrap_or(-1)),
            Err(_) => "the reactor thread ended".into(),
        }
    }

    /// Stops the framework and waits for its thread (off the async runtime).
    pub async fn stop(mut self) -> String {
        let thread = self.thread.take();
        let (start, grace) = (self.start_timeout, self.stop_grace);
        let status = tokio::task::spawn_blocking(move || stop_thread(thread, start, grace))
            .await
            .unwrap_or_else(|e| format!("stopping the in-process SPDK framework panicked: {e}"));
        tracing::info!(%status, socket = %self.socket.display(), "in-process SPDK framework stopped");
        status
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let status = stop_thread(self.thread.take(), self.start_timeout, self.stop_grace);
            tracing::info!(%status, socket = %self.socket.display(), "in-process SPDK framework stopped");
        }
    }
}

/// Asks a running framework to shut down. Waits (up to `timeout`) for one
/// still starting: before its app thread exists a request cannot be sent.
/// Returns false when the framework already ended.
fn request_shutdown(timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        {
            let p = phase();
            match &*p {
                Phase::Running => {
                    // SAFETY: the framework is running (its app thread exists) and
                    // cannot reach spdk_app_fini while we hold PHASE (run_framework
                    // takes it first); the call only posts a message to the app
                    // thread, which SPDK allows from any thread (and signal handlers).
                    unsafe { spdk_sys::spdk_app_start_shutdown() };
                    return true;
                }
                Phase::Ended(_) | Phase::NotRun => return false,
                Phase::Starting if Instant::now() >= deadline => {
                    tracing::warn!(
                        ?timeout,
                        "the in-process SPDK framework is still starting; not waiting for it"
                    );
                    return false;
                }
                Phase::Starting => {}
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Stops the framework and joins its thread; returns how it ended. A
/// framework that does not finish starting within `start` or stopping within
/// `grace` is left to the process exit (a thread cannot be killed).
fn stop_thread(thread: Option<JoinHandle<i32>>, start: Duration, grace: Duration) -> String {
    let Some(thread) = thread else {
        return "already stopped".into();
    };
    if !request_shutdown(start) && !thread.is_finished() && !matches!(*phase(), Phase::Ended(_)) {
        return "left running: it did not finish starting".into();
    }
    let deadline = Instant::now() + grace;
    while !thread.is_finished() {
        if Instant::now() >= deadline {
            return format!("left running: it did not stop within {grace:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    match thread.join() {
        Ok(rc) => format!("in-process SPDK stopped (spdk_app_start returned {rc})"),
        Err(_) => "the SPDK reactor thread panicked".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_follow_the_target_config() {
        let mut c = TargetConfig::new("/run/talon");
        c.memory = Memory::NoHuge { mem_size_mib: 1024 };
        c.extra_args = vec!["--disable-cpumask-locks".into()];
        c.interrupt_mode = true;
        let s = Settings::from_config(&c).expect("settings");
        assert_eq!(
            s,
            Settings {
                mem_size_mib: 1024,
                no_huge: true,
                no_pci: true,
                interrupt_mode: true,
                disable_cpumask_locks: true,
            }
        );
        c.pci_disks = true;
        c.memory = Memory::Hugepages { mem_size_mib: None };
        c.exported_volumes = 2;
        let s = Settings::from_config(&c).expect("settings");
        assert_eq!((s.mem_size_mib, s.no_huge, s.no_pci), (598, false, false));
        c.extra_args = vec!["--wait-for-rpc".into()];
        let e = Settings::from_config(&c).expect_err("unsupported");
        assert!(e.to_string().contains("--wait-for-rpc"), "{e}");
    }
}
