//! The target keeper: `talon keep-targets` starts spdk_tgt and tgtd, keeps
//! them running (restart with backoff when one dies) and does nothing else, so
//! that the data path can live in a process (a pod) that a rollout of talon's
//! controller does not replace. `talon serve --target-keeper` then never
//! starts or stops a target: it says what should run, in files under
//! `<run_dir>/keeper/`, and adopts what the keeper started through the same
//! sockets and pid files as always.
//!
//! ```text
//!   talon serve --target-keeper                        talon keep-targets (another pod, same host paths)
//!     engine.SpdkTargetController ──write──> keeper/spdk.want.json ──read──> spawn/adopt spdk_tgt (-s capped
//!     engine.TgtdController       ──write──> keeper/tgtd.want.json ──read──> spawn/adopt tgtd    at free hugepages)
//!        │ adopt: <run_dir>/spdk.sock, <run_dir>/tgtd/tgtd.pid                │ supervise: exit -> restart
//!        └──read── keeper/spdk.status.json, keeper/tgtd.status.json <──write──┘ (pid, state, cause, restarts)
//!   SIGTERM to talon serve: nothing happens to the targets (a drain writes `run: false`: the keeper stops them)
//!   SIGTERM to the keeper: it stops the targets cleanly (SIGINT; tgtd: delete system), its pod is going
//! ```
//!
//! A want file that is absent says nothing (the keeper waits, and leaves a
//! running target alone); `run: false` stops the target. A running spdk_tgt
//! is not restarted when its want changes (that would interrupt I/O): the new
//! settings apply at its next start. tgtd is restarted on a new portal, as
//! talon's own supervision does. Files are written whole (temporary file and
//! rename) and read with unknown fields ignored, so a keeper and a talon of
//! different versions understand each other.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::host::HostRoot;
use crate::host::hugepages::free_hugepages_mib;
use crate::spdk::launch::cap_memory;
use crate::spdk::target::{Memory, Origin, Target, TargetConfig};
use crate::tgt::{Tgtd, TgtdConfig};
use crate::util::{Backoff, error_chain};

/// The keeper's directory under the run dir.
pub fn dir(run_dir: &Path) -> PathBuf {
    run_dir.join("keeper")
}

/// What spdk_tgt should run with (written by talon serve's
/// `engine.SpdkTargetController`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SpdkWant {
    /// Whether spdk_tgt should run (false: stop it).
    pub run: bool,
    /// `-m`.
    pub cpumask: String,
    /// `-s` in MiB as talon sized it; the keeper caps it at the free
    /// hugepages when it starts the target.
    pub mem_mib: u64,
    /// `--no-huge` (development).
    pub no_huge: bool,
    /// PCI NVMe disks are configured (otherwise `-u`).
    pub pci_disks: bool,
    /// `--interrupt-mode` (nvmf_tgt when it sits beside spdk_tgt).
    pub interrupt_mode: bool,
    /// More arguments, as given to talon serve (`--spdk-arg`).
    pub extra_args: Vec<String>,
    /// Volumes exported when it was sized (for the shortfall note).
    pub volumes: u32,
}

impl SpdkWant {
    /// The want for a target configured as `cfg` with `-s` `mem_mib`.
    pub fn from_config(cfg: &TargetConfig, mem_mib: u64) -> Self {
        SpdkWant {
            run: true,
            cpumask: cfg.cpumask.clone(),
            mem_mib,
            no_huge: matches!(cfg.memory, Memory::NoHuge { .. }),
            pci_disks: cfg.pci_disks,
            interrupt_mode: cfg.interrupt_mode,
            extra_args: cfg
                .extra_args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            volumes: cfg.exported_volumes,
        }
    }

    /// Stop it.
    pub fn stop() -> Self {
        SpdkWant::default()
    }
}

/// What tgtd should run with (written by talon serve's `engine.TgtdController`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TgtdWant {
    /// Whether tgtd should run (false: stop it).
    pub run: bool,
    /// Its one iSCSI portal.
    pub portal: Option<SocketAddr>,
}

/// How a kept target is doing (written by the keeper).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KeptStatus {
    /// `starting`, `running`, `failed`, `stopped`.
    pub state: String,
    /// Its pid while it runs.
    pub pid: Option<u32>,
    /// What happened last: the cause of a failed start, how it exited.
    pub message: String,
    /// Restarts after it died.
    pub restarts: u32,
    /// `-s` it was started with (spdk_tgt).
    pub mem_mib: Option<u64>,
    /// The hugepage shortfall it was started with, if any.
    pub memory_note: Option<String>,
    /// The keeper's pid.
    pub keeper_pid: u32,
    /// When this was written (seconds since the epoch).
    pub updated: u64,
}

/// The files of one keeper directory.
#[derive(Debug, Clone)]
pub struct KeeperFiles {
    dir: PathBuf,
}

impl KeeperFiles {
    /// The files under `<run_dir>/keeper`.
    pub fn new(run_dir: &Path) -> Self {
        KeeperFiles { dir: dir(run_dir) }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<name>.want.json`.
    pub fn want_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.want.json"))
    }

    /// `<name>.status.json`.
    pub fn status_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.status.json"))
    }

    /// Writes a want (whole: temporary file, then rename).
    pub fn write_want<T: Serialize>(&self, name: &str, want: &T) -> std::io::Result<()> {
        write_json(&self.want_path(name), want)
    }

    /// Reads a want; None when absent or unreadable.
    pub fn read_want<T: DeserializeOwned>(&self, name: &str) -> Option<T> {
        read_json(&self.want_path(name))
    }

    /// Writes a status.
    pub fn write_status(&self, name: &str, status: &KeptStatus) -> std::io::Result<()> {
        write_json(&self.status_path(name), status)
    }

    /// Reads a status; None when absent or unreadable.
    pub fn read_status(&self, name: &str) -> Option<KeptStatus> {
        read_json(&self.status_path(name))
    }
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let text = serde_json::to_vec_pretty(v).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Option<T> {
    let text = std::fs::read(path).ok()?;
    match serde_json::from_slice(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read a keeper file; ignored");
            None
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Options of `talon keep-targets`.
#[derive(Debug, Clone)]
pub struct KeeperOptions {
    /// The run dir shared with talon serve (sockets, pid files, `keeper/`).
    pub run_dir: PathBuf,
    /// The host's root (free hugepages, /proc for tgtd's sockets).
    pub host_root: PathBuf,
    /// An explicit spdk_tgt binary; else `$TALON_SPDK_DIR`, else PATH.
    pub spdk_tgt: Option<PathBuf>,
    /// How often the wants and the targets are looked at.
    pub poll: Duration,
}

/// The held lock on `<run_dir>/keeper/keeper.lock`: one keeper per run dir.
#[derive(Debug)]
pub struct KeeperLock {
    _flock: nix::fcntl::Flock<std::fs::File>,
}

/// Takes the keeper lock, waiting while another keeper (a pod being
/// replaced) still holds it.
pub async fn lock(
    files: &KeeperFiles,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<Option<KeeperLock>> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(files.dir())?;
    let path = files.dir().join("keeper.lock");
    let mut said = false;
    loop {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(mut f) => {
                use std::io::Write;
                let _ = f.set_len(0);
                let _ = writeln!(&mut *f, "{}", std::process::id());
                return Ok(Some(KeeperLock { _flock: f }));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                if !said {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    tracing::info!(path = %path.display(), holder = holder.trim(), "another keeper holds the run dir; waiting");
                    said = true;
                }
            }
            Err((_, e)) => return Err(e.into()),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = shutdown.wait_for(|s| *s) => return Ok(None),
        }
    }
}

/// Runs the keeper until `shutdown`, then stops the targets it holds.
pub async fn run(
    opts: KeeperOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let files = KeeperFiles::new(&opts.run_dir);
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let keep = async {
        let Some(_lock) = lock(&files, &mut rx).await? else {
            return Ok(());
        };
        tracing::info!(dir = %files.dir().display(), "keeping spdk_tgt and tgtd as talon asks");
        let spdk = SpdkKeeper::new(&opts, files.clone());
        let tgtd = TgtdKeeper::new(&opts, files.clone());
        tokio::join!(spdk.run(rx.clone()), tgtd.run(rx.clone()));
        Ok::<(), std::io::Error>(())
    };
    tokio::pin!(keep);
    tokio::select! {
        r = &mut keep => return r,
        _ = shutdown => {}
    }
    tracing::info!("stopping the kept targets");
    let _ = tx.send(true);
    keep.await
}

/// One target's supervision state.
#[derive(Debug)]
struct Kept {
    name: &'static str,
    files: KeeperFiles,
    status: KeptStatus,
    backoff: Backoff,
    next_start: Instant,
    up_since: Option<Instant>,
}

impl Kept {
    fn new(name: &'static str, files: KeeperFiles) -> Self {
        Kept {
            name,
            files,
            status: KeptStatus {
                state: "stopped".into(),
                keeper_pid: std::process::id(),
                ..KeptStatus::default()
            },
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(30)),
            next_start: Instant::now(),
            up_since: None,
        }
    }

    fn set(&mut self, state: &str, pid: Option<u32>, message: String) {
        if self.status.state == state && self.status.pid == pid && self.status.message == message {
            return;
        }
        self.status.state = state.into();
        self.status.pid = pid;
        self.status.message = message;
        self.status.updated = now_secs();
        if let Err(e) = self.files.write_status(self.name, &self.status) {
            tracing::warn!(target = self.name, error = %e, "cannot write the keeper status");
        }
    }

    /// After a start failed: the next one waits.
    fn failed(&mut self, cause: String) {
        let after = self.backoff.next_delay();
        self.next_start = Instant::now() + after;
        tracing::warn!(target = self.name, %cause, ?after, "cannot start");
        self.set("failed", None, cause);
    }

    /// After it died: count a restart; the next start waits for the backoff.
    fn exited(&mut self, how: String) {
        if self
            .up_since
            .take()
            .is_some_and(|u| u.elapsed() > Duration::from_secs(60))
        {
            self.backoff.reset();
        }
        self.status.restarts += 1;
        self.next_start = Instant::now() + self.backoff.next_delay();
        tracing::warn!(target = self.name, %how, "exited; starting it again");
        self.set("starting", None, format!("exited ({how}); restarting"));
    }

    /// A start begins; a failed one stays `failed` with its cause while the
    /// next attempt runs (talon shows that cause, not a flicker of `starting`).
    fn starting(&mut self) {
        if self.status.state != "failed" {
            self.set("starting", None, "starting".into());
        }
    }

    fn running(&mut self, pid: Option<u32>, message: String) {
        self.up_since = Some(Instant::now());
        self.set("running", pid, message);
    }
}

struct SpdkKeeper {
    opts: KeeperOptions,
    host: HostRoot,
    kept: Kept,
}

impl SpdkKeeper {
    fn new(opts: &KeeperOptions, files: KeeperFiles) -> Self {
        SpdkKeeper {
            opts: opts.clone(),
            host: HostRoot::new(&opts.host_root),
            kept: Kept::new("spdk", files),
        }
    }

    fn config(&self, want: &SpdkWant) -> (TargetConfig, Option<String>) {
        let mut cfg = TargetConfig::new(&self.opts.run_dir);
        cfg.spdk_tgt = self.opts.spdk_tgt.clone();
        cfg.cpumask = want.cpumask.clone();
        cfg.pci_disks = want.pci_disks;
        cfg.interrupt_mode = want.interrupt_mode;
        cfg.exported_volumes = want.volumes;
        cfg.extra_args = want.extra_args.iter().map(Into::into).collect();
        let mut note = None;
        cfg.memory = if want.no_huge {
            Memory::NoHuge {
                mem_size_mib: want.mem_mib,
            }
        } else {
            let (mib, n) = cap_memory(want.mem_mib, free_hugepages_mib(&self.host), want.volumes);
            note = n;
            Memory::Hugepages {
                mem_size_mib: Some(mib),
            }
        };
        (cfg, note)
    }

    async fn run(mut self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut held: Option<Target> = None;
        loop {
            if *shutdown.borrow() {
                break;
            }
            let want: Option<SpdkWant> = self.kept.files.read_want("spdk");
            match (&want, held.is_some()) {
                (Some(w), false) if w.run && Instant::now() >= self.kept.next_start => {
                    let (cfg, note) = self.config(w);
                    self.kept.starting();
                    match Target::start(&cfg).await {
                        Ok(t) => {
                            let pid = t.pid().and_then(|p| u32::try_from(p).ok());
                            let adopted = t.origin() == Origin::Adopted;
                            self.kept.status.mem_mib = (!adopted).then(|| cfg.mem_size_mib());
                            self.kept.status.memory_note = note.filter(|_| !adopted);
                            let msg = if adopted {
                                format!("adopted on {}", cfg.socket().display())
                            } else {
                                format!(
                                    "serving on {} with -s {} MiB",
                                    cfg.socket().display(),
                                    cfg.mem_size_mib()
                                )
                            };
                            tracing::info!(?pid, %msg, "spdk_tgt kept");
                            self.kept.running(pid, msg);
                            held = Some(t);
                        }
                        Err(e) => self.kept.failed(error_chain(&e)),
                    }
                }
                (Some(w), true) if !w.run => {
                    if let Some(t) = held.take() {
                        let how = t.stop(TargetConfig::new(&self.opts.run_dir).stop_grace).await;
                        let how = how.unwrap_or_else(|e| e.to_string());
                        tracing::info!(%how, "stopped spdk_tgt: talon asked");
                        self.kept.status.mem_mib = None;
                        self.kept.status.memory_note = None;
                        self.kept
                            .set("stopped", None, format!("stopped as talon asked ({how})"));
                    }
                }
                _ => {}
            }
            let tick = tokio::time::sleep(self.opts.poll);
            match held.as_mut() {
                Some(t) => tokio::select! {
                    r = t.wait_exit() => {
                        held = None;
                        self.kept.exited(r.unwrap_or_else(|e| e.to_string()));
                    }
                    _ = tick => {}
                    _ = shutdown.changed() => {}
                },
                None => tokio::select! {
                    _ = tick => {}
                    _ = shutdown.changed() => {}
                },
            }
        }
        if let Some(t) = held.take() {
            let how = t
                .stop(TargetConfig::new(&self.opts.run_dir).stop_grace)
                .await
                .unwrap_or_else(|e| e.to_string());
            tracing::info!(%how, "stopped spdk_tgt: the keeper stops");
            self.kept
                .set("stopped", None, format!("the keeper stopped ({how})"));
        }
    }
}

struct TgtdKeeper {
    template: TgtdConfig,
    poll: Duration,
    kept: Kept,
}

impl TgtdKeeper {
    fn new(opts: &KeeperOptions, files: KeeperFiles) -> Self {
        let mut template = TgtdConfig::new(
            opts.run_dir.join("tgtd"),
            SocketAddr::from(([127, 0, 0, 1], crate::tgt::daemon::ISCSI_PORT)),
        );
        template.host = HostRoot::new(&opts.host_root);
        TgtdKeeper {
            template,
            poll: opts.poll,
            kept: Kept::new("tgtd", files),
        }
    }

    async fn run(mut self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut held: Option<Tgtd> = None;
        loop {
            if *shutdown.borrow() {
                break;
            }
            let want: Option<TgtdWant> = self.kept.files.read_want("tgtd");
            if let Some(t) = held.as_mut()
                && !t.is_alive()
            {
                let pid = t.pid();
                held = None;
                self.kept.exited(format!("tgtd pid {pid} is gone"));
            }
            let stop = match (&want, &held) {
                (Some(w), Some(t)) => !w.run || w.portal.is_some_and(|p| p != t.portal()),
                _ => false,
            };
            if stop && let Some(t) = held.take() {
                let pid = t.pid();
                let r = tokio::task::spawn_blocking(move || t.stop()).await;
                let how = match r {
                    Ok(Ok(())) => "stopped".to_string(),
                    Ok(Err(e)) => error_chain(&e),
                    Err(e) => e.to_string(),
                };
                tracing::info!(pid, %how, "stopped tgtd: talon asked (stop, or a new portal)");
                self.kept
                    .set("stopped", None, format!("stopped as talon asked ({how})"));
            }
            if let Some(w) = &want
                && w.run
                && held.is_none()
                && Instant::now() >= self.kept.next_start
            {
                let mut cfg = self.template.clone();
                if let Some(p) = w.portal {
                    cfg.portal = p;
                }
                self.kept.starting();
                match tokio::task::spawn_blocking(move || Tgtd::start_or_adopt(cfg)).await {
                    Ok(Ok(t)) => {
                        let msg = format!("serving iSCSI on {}", t.portal());
                        self.kept.running(Some(t.pid()), msg);
                        held = Some(t);
                    }
                    Ok(Err(e)) => self.kept.failed(error_chain(&e)),
                    Err(e) => self.kept.failed(e.to_string()),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.poll) => {}
                _ = shutdown.changed() => {}
            }
        }
        if let Some(t) = held.take() {
            let _ = tokio::task::spawn_blocking(move || t.stop()).await;
            tracing::info!("stopped tgtd: the keeper stops");
            self.kept.set("stopped", None, "the keeper stopped".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wants_and_statuses_round_trip_and_tolerate_other_versions() {
        let d = tempfile::tempdir().expect("tempdir");
        let f = KeeperFiles::new(d.path());
        assert_eq!(f.read_want::<SpdkWant>("spdk"), None, "absent");
        let w = SpdkWant {
            run: true,
            cpumask: "0x1".into(),
            mem_mib: 1024,
            extra_args: vec!["--disable-cpumask-locks".into()],
            ..SpdkWant::default()
        };
        f.write_want("spdk", &w).expect("write");
        assert_eq!(f.read_want::<SpdkWant>("spdk"), Some(w));
        // a newer talon's field is ignored; a missing one takes its default
        std::fs::write(
            f.want_path("tgtd"),
            r#"{"run": true, "portal": "127.0.0.1:3260", "newer": 1}"#,
        )
        .expect("write");
        let t: TgtdWant = f.read_want("tgtd").expect("read");
        assert!(t.run);
        assert_eq!(t.portal, Some("127.0.0.1:3260".parse().expect("addr")));
        std::fs::write(f.want_path("tgtd"), "{not json").expect("write");
        assert_eq!(f.read_want::<TgtdWant>("tgtd"), None, "garbage is no want");
        let s = KeptStatus {
            state: "failed".into(),
            message: "core 0 is locked".into(),
            ..KeptStatus::default()
        };
        f.write_status("spdk", &s).expect("write");
        assert_eq!(f.read_status("spdk"), Some(s));
        let left: Vec<_> = std::fs::read_dir(f.dir())
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp."))
            .collect();
        assert!(left.is_empty(), "no temporary file is left: {left:?}");
    }
}
