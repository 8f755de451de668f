//! `engine.SpdkTargetController`: runs spdk_tgt while the V2 engine has work
//! (any `Disk`, or any volume [`EngineSelection::engine_for`] gives V2), and always while
//! talon serves Longhorn's instance-manager protocol ([`SpdkTargetController::always`]),
//! restarts it with backoff when it dies, and reports it as `TargetStatus` `spdk`.
//!
//! ```text
//!   NodeConfig, Disk, Volume ──> reconcile ──needed?──> Target::start (adopt a target answering on
//!        (selection: V2?)           │                     <run_dir>/spdk.sock, else spawn + wait for
//!                                   │                     spdk_get_version), -s from the use seen
//!                                   │                     (or a floor + 8 MiB/volume) capped at the
//!                                   │                     free hugepages, -u unless a Disk has `pci`
//!              --target-keeper ─────┴──> keeper/spdk.want.json; adopt what `talon keep-targets` runs
//!                                   └──> TargetStatus "spdk" {state, pid, version, restarts, ...}
//!   every second: spdk_get_version answers? no -> restarts += 1, start again after backoff
//!   (100 ms doubling to 30 s, back to 100 ms after a minute of uptime); the disk and
//!   volume controllers watch TargetStatus and reconcile their objects back.
//! ```
//!
//! Shutdown: when the controller is dropped (a clean stop of talon) the target
//! it started or adopted keeps serving, as after a crash of talon, and the
//! next talon adopts it: a restart or an upgrade of talon does not interrupt
//! volume I/O. With [`TargetsOnExit::stop`] (`--stop-targets-on-exit`, a drain
//! of the node) it is stopped instead: SIGINT, then SIGKILL after the grace
//! period (10 s). `-s` is decided when the target starts; more volumes later
//! do not restart a running target.
//!
//! Memory: with hugepages, `-s` is sized from use ([`sized_mem_mib`]): the
//! high-water mark of the target's DPDK heap, measured every minute
//! (`env_dpdk_get_mem_stats`) and kept in `<data_dir>/spdk-memory.json`, plus
//! a quarter; before anything was measured, the program's floor (spdk_tgt
//! 1024 MiB, nvmf_tgt 512) plus 8 MiB a volume. It is capped at the hugepages
//! free when the target is spawned, so that a smaller pool never keeps the
//! target from starting (a restart after a crash included): it starts with
//! what there is and `TargetStatus` reports the shortfall.
//!
//! With a keeper (`--target-keeper`, [`crate::keeper`]) the controller never
//! starts or stops the target: it writes what should run, adopts what the
//! keeper runs, counts a restart when it stops answering, and shows the
//! keeper's cause when it cannot start; a drain asks the keeper to stop it.
//!
//! In-process (`--engine spdk-embedded`): the same, except that the target is
//! the SPDK framework on a thread of talon (pid = talon's), it is kept while
//! talon runs even without V2 work, and when it dies it is not restarted (DPDK
//! initializes once per process): `TargetStatus` goes `failed` saying so.

use std::time::{Duration, Instant};

use nix::sys::signal::kill;
use nix::unistd::Pid;
use tokio::sync::Mutex;

use super::TargetsOnExit;
use super::selection::{EngineSelection, free_hugepages_mib};
use crate::host::HostRoot;
use crate::keeper::{KeeperFiles, SpdkWant};
use crate::resources::config::{Disk, NodeConfig, Volume};
use crate::resources::engine::SPDK_STATUS_ID;
use crate::resources::engine::{Engine, ObjectState, TargetStatus};
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};
use crate::spdk::ClientError;
pub use crate::spdk::launch::cap_memory;
use crate::spdk::launch::{
    MemoryUse, heap_in_use_mib, interrupt_mode_program, set_nvme_keep_alive, sized_mem_mib,
};
use crate::spdk::rpc::Version;
use crate::spdk::target::{Memory, Origin, Target, TargetConfig};
use crate::util::Backoff;

#[derive(Debug)]
struct Inner {
    target: Option<Target>,
    restarts: u32,
    backoff: Backoff,
    /// When the held target was started or adopted.
    up_since: Option<Instant>,
    /// No start before this (backoff after a crash or a failed start).
    next_start: Option<Instant>,
    /// Why the last start failed (kept in `TargetStatus` until a start works).
    last_error: Option<String>,
    /// The hugepage shortfall the held target was started with, if any.
    memory_note: Option<String>,
    /// Why the held target runs without talon's NVMe keep-alive, if it does.
    nvme_note: Option<String>,
    /// The want last written for the keeper (`--target-keeper`).
    want: Option<SpdkWant>,
    /// When the held target's memory use was last measured.
    measured: Option<Instant>,
}

/// How often a running target's memory use is measured (the first time
/// [`FIRST_MEASURE`] after it is held).
const MEASURE_EVERY: Duration = Duration::from_secs(60);
const FIRST_MEASURE: Duration = Duration::from_secs(5);

/// Uptime after which a crash restarts the backoff from its first delay: a
/// target that served this long was healthy (one killed every 10-20 s had
/// its restarts wait the full 30 s with a 60 s bound); a crash loop dies
/// sooner, or never becomes ready.
const STABLE_UPTIME: Duration = Duration::from_secs(10);

/// Supervises spdk_tgt for the V2 engine (see the module docs).
#[derive(Debug)]
pub struct SpdkTargetController {
    template: TargetConfig,
    selection: EngineSelection,
    on_exit: TargetsOnExit,
    host: HostRoot,
    /// `--target-keeper`: the keeper runs the target; talon writes wants and adopts.
    keeper: Option<KeeperFiles>,
    /// Where the memory use seen is kept (`<data_dir>/spdk-memory.json`).
    memory_file: Option<std::path::PathBuf>,
    /// The target runs from the start, disks or not ([`SpdkTargetController::always`]).
    always: bool,
    inner: Mutex<Inner>,
}

impl SpdkTargetController {
    /// With the target settings (`<run_dir>/spdk.sock`, cpumask, memory)
    /// and this node's engine selection.
    pub fn new(template: TargetConfig, selection: EngineSelection) -> Self {
        SpdkTargetController {
            template,
            selection,
            on_exit: TargetsOnExit::stop(),
            host: HostRoot::real(),
            keeper: None,
            memory_file: None,
            always: false,
            inner: Mutex::new(Inner {
                target: None,
                restarts: 0,
                backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(30)),
                up_since: None,
                next_start: None,
                last_error: None,
                memory_note: None,
                nvme_note: None,
                want: None,
                measured: None,
            }),
        }
    }

    /// What dropping the controller does to the target (default: stop it;
    /// the daemon passes its `--stop-targets-on-exit` policy).
    pub fn on_exit(mut self, on_exit: TargetsOnExit) -> Self {
        self.on_exit = on_exit;
        self
    }

    /// Where free hugepages are read (`/sys/kernel/mm/hugepages`) to cap `-s`.
    pub fn with_host(mut self, host: HostRoot) -> Self {
        self.host = host;
        self
    }

    /// `--target-keeper`: `talon keep-targets` runs spdk_tgt; this controller
    /// writes what should run (`<run_dir>/keeper/spdk.want.json`), adopts the
    /// target, and reports the keeper's cause when it cannot start; it never
    /// starts or stops it itself.
    pub fn with_keeper(mut self, keeper: Option<KeeperFiles>) -> Self {
        self.keeper = keeper;
        self
    }

    /// Keeps the memory use seen in `<data_dir>/spdk-memory.json` and sizes
    /// `-s` from it ([`sized_mem_mib`]).
    pub fn with_data_dir(mut self, data_dir: &std::path::Path) -> Self {
        self.memory_file = Some(data_dir.join("spdk-memory.json"));
        self
    }

    /// Runs the target from the start, before any disk or volume: a Longhorn V2
    /// instance manager is alive only while an `spdk_tgt` process runs (its pod's liveness
    /// probe, `pgrep -f '^spdk_tgt'`, from 3 s after the start), and Longhorn adds disks later.
    pub fn always(mut self, always: bool) -> Self {
        self.always = always;
        self
    }

    /// The target settings.
    pub fn config(&self) -> &TargetConfig {
        &self.template
    }
}

impl SpdkTargetController {
    /// Whether the program that runs is nvmf_tgt (interrupt mode beside spdk_tgt).
    fn runs_nvmf(&self, cfg: &TargetConfig) -> bool {
        cfg.interrupt_mode
            && self
                .selection
                .spdk_tgt
                .as_deref()
                .is_some_and(|b| interrupt_mode_program(b) != b)
    }

    fn program(&self, cfg: &TargetConfig) -> &'static str {
        if self.runs_nvmf(cfg) {
            "nvmf_tgt"
        } else {
            "spdk_tgt"
        }
    }

    /// `-s` for a start: from the use seen before ([`sized_mem_mib`]).
    fn sized_mem_mib(&self, cfg: &TargetConfig) -> u64 {
        let seen = self
            .memory_file
            .as_deref()
            .map(read_memory)
            .and_then(|mut r| r.remove(self.program(cfg)));
        sized_mem_mib(cfg.exported_volumes, self.runs_nvmf(cfg), seen.as_ref())
    }

    /// Measures the held target's heap now and then; a new high-water mark
    /// is kept for the next start.
    async fn measure(&self, inner: &mut Inner, volumes: u32) {
        let (Some(path), Some(t)) = (self.memory_file.as_deref(), inner.target.as_ref()) else {
            return;
        };
        let due = match (inner.measured, inner.up_since) {
            (Some(at), _) => at.elapsed() >= MEASURE_EVERY,
            (None, Some(up)) => up.elapsed() >= FIRST_MEASURE,
            (None, None) => true,
        };
        if !due {
            return;
        }
        inner.measured = Some(Instant::now());
        let Some(mib) = heap_in_use(t, &self.host).await else {
            return;
        };
        let program = self.program(&self.template);
        let mut record = read_memory(path);
        let seen = record.entry(program.to_string()).or_default();
        if mib <= seen.peak_mib && volumes <= seen.volumes {
            return;
        }
        seen.peak_mib = seen.peak_mib.max(mib);
        seen.volumes = seen.volumes.max(volumes);
        tracing::info!(
            program,
            in_use_mib = mib,
            volumes,
            "spdk memory use: a new high-water mark"
        );
        let tmp = path.with_extension("json.tmp");
        let written = serde_json::to_vec_pretty(&record)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&tmp, b))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "cannot keep the spdk memory use");
        }
    }

    /// `--target-keeper`: writes what should run, adopts what the keeper
    /// started, and says what the keeper says while there is nothing to adopt.
    async fn adopt_kept(
        &self,
        ctx: &mut ReconcileContext,
        inner: &mut Inner,
        keeper: &KeeperFiles,
        want: SpdkWant,
    ) -> Result<Requeue, ControllerError> {
        // a running target keeps what it was started with: the want changes only the next start
        if inner.want.as_ref() != Some(&want) {
            keeper
                .write_want("spdk", &want)
                .map_err(|e| format!("writing {}: {e}", keeper.want_path("spdk").display()))?;
            inner.want = Some(want);
        }
        let socket = self.template.socket();
        let kept = keeper.read_status("spdk");
        if let Some(t) = Target::adopt(&socket).await {
            tracing::info!(pid = ?t.pid(), version = %t.version().version, "adopted the kept spdk_tgt");
            inner.memory_note = kept
                .filter(|k| k.pid.is_some() && k.pid == t.pid().and_then(|p| u32::try_from(p).ok()))
                .and_then(|k| k.memory_note);
            inner.nvme_note = configure(&t).await;
            inner.target = Some(t);
            inner.up_since = Some(Instant::now());
            inner.measured = None;
            inner.last_error = None;
            let msg = format!("adopted on {} (kept by talon keep-targets)", socket.display());
            let msg = with_notes(msg, inner);
            ctx.apply(
                SPDK_STATUS_ID,
                status(&self.template, inner, ObjectState::Ready, msg),
            )?;
            return Ok(Requeue::After(Duration::from_secs(1)));
        }
        let (state, msg) = match kept {
            Some(k) if k.state == "failed" => (
                ObjectState::Failed,
                format!("the target keeper cannot start spdk_tgt: {}", k.message),
            ),
            Some(k) => (
                ObjectState::Creating,
                format!(
                    "waiting for the target keeper (pid {}) to start spdk_tgt on {}: {} ({})",
                    k.keeper_pid,
                    socket.display(),
                    k.state,
                    k.message
                ),
            ),
            None => (
                ObjectState::Creating,
                format!(
                    "waiting for the target keeper (talon keep-targets) to start spdk_tgt on {}: no keeper has \
                     answered in {}",
                    socket.display(),
                    keeper.dir().display()
                ),
            ),
        };
        if state == ObjectState::Failed {
            inner.last_error = Some(msg.clone());
        }
        ctx.apply(SPDK_STATUS_ID, status(&self.template, inner, state, msg))?;
        Ok(Requeue::After(Duration::from_millis(500)))
    }
}

/// The memory use seen per program (`spdk_tgt`, `nvmf_tgt`).
type MemoryRecord = std::collections::BTreeMap<String, MemoryUse>;

fn read_memory(path: &std::path::Path) -> MemoryRecord {
    std::fs::read(path)
        .ok()
        .and_then(|t| serde_json::from_slice(&t).ok())
        .unwrap_or_default()
}

/// The MiB a running target's DPDK heaps hold (`env_dpdk_get_mem_stats`
/// writes its dump in the target's own /tmp, read through `/proc/<pid>/root`
/// so that a target in another pod's mount namespace is read too).
async fn heap_in_use(t: &Target, host: &HostRoot) -> Option<u64> {
    let r: serde_json::Value = t
        .client()
        .call_with_timeout::<(), serde_json::Value>("env_dpdk_get_mem_stats", None, Duration::from_secs(10))
        .await
        .map_err(|e| tracing::debug!(error = %e, "env_dpdk_get_mem_stats"))
        .ok()?;
    let file = r["filename"].as_str()?;
    let pid = t.pid()?;
    let text = std::fs::read_to_string(host.path(format!("/proc/{pid}/root{file}"))).ok()?;
    heap_in_use_mib(&text)
}

fn pid_alive(pid: Option<i32>) -> bool {
    pid.is_some_and(|p| kill(Pid::from_raw(p), None).is_ok())
}

/// Whether the target still answers; a slow answer from a live process counts.
async fn answers(t: &Target) -> bool {
    match t
        .client()
        .call_with_timeout::<(), Version>("spdk_get_version", None, Duration::from_secs(5))
        .await
    {
        Ok(_) => true,
        Err(ClientError::Timeout { .. }) => pid_alive(t.pid()),
        Err(e) => !e.is_transport(),
    }
}

impl Drop for SpdkTargetController {
    fn drop(&mut self) {
        if let Some(k) = &self.keeper {
            // the keeper holds the target: a drain asks it to stop it, a stop leaves it
            if self.on_exit.stops() {
                if let Err(e) = k.write_want("spdk", &SpdkWant::stop()) {
                    tracing::warn!(error = %e, "cannot ask the target keeper to stop spdk_tgt");
                } else {
                    tracing::info!("asked the target keeper to stop spdk_tgt");
                }
            }
            if let Some(t) = self.inner.get_mut().target.take() {
                t.release();
            }
            return;
        }
        let Some(t) = self.inner.get_mut().target.take() else {
            return;
        };
        // an in-process target cannot outlive talon: stop it cleanly
        if self.on_exit.stops() || t.origin() == Origin::Embedded {
            t.stop_blocking(self.template.stop_grace);
        } else {
            tracing::info!(
                pid = ?t.pid(),
                socket = %self.template.socket().display(),
                "leaving spdk_tgt serving; the next talon adopts it (--stop-targets-on-exit stops it)"
            );
            t.release();
        }
    }
}

fn status(cfg: &TargetConfig, inner: &Inner, state: ObjectState, message: String) -> TargetStatus {
    let t = inner.target.as_ref();
    TargetStatus {
        engine: Engine::V2,
        state,
        pid: t.and_then(Target::pid).and_then(|p| u32::try_from(p).ok()),
        socket: cfg.socket().display().to_string(),
        version: t.map(|t| t.version().version.clone()).unwrap_or_default(),
        restarts: inner.restarts,
        message,
    }
}

#[async_trait::async_trait]
impl Controller for SpdkTargetController {
    fn name(&self) -> &'static str {
        "engine.SpdkTargetController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::of::<NodeConfig>(),
            Input::of::<Disk>(),
            Input::of::<Volume>(),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::shared::<TargetStatus>()]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let node = ctx.get::<NodeConfig>("node")?.map(|n| n.spec).unwrap_or_default();
        let disks = ctx.list::<Disk>()?;
        let v2_volumes = ctx
            .list::<Volume>()?
            .iter()
            .filter(|v| self.selection.engine_for(&v.spec, &node) == Engine::V2)
            .count();
        let mut inner = self.inner.lock().await;

        if disks.is_empty() && v2_volumes == 0 && !self.always {
            if let Some(k) = &self.keeper {
                // the keeper stops it; talon lets go of it
                if inner.want.as_ref().is_none_or(|w| w.run) {
                    k.write_want("spdk", &SpdkWant::stop())
                        .map_err(|e| format!("writing {}: {e}", k.want_path("spdk").display()))?;
                    inner.want = Some(SpdkWant::stop());
                }
                if let Some(t) = inner.target.take() {
                    t.release();
                }
                return Ok(Requeue::OnInputChange);
            }
            // no V2 work: no target (its hugepages and ports are free for others);
            // an in-process one stays: it could not be started again
            if inner
                .target
                .as_ref()
                .is_some_and(|t| t.origin() != Origin::Embedded)
                && let Some(t) = inner.target.take()
            {
                let status = t.stop(self.template.stop_grace).await?;
                tracing::info!(%status, "stopped spdk_tgt: no disks and no V2 volumes");
            }
            return Ok(Requeue::OnInputChange);
        }
        if !self.selection.v2_available {
            let msg = format!("the V2 engine is not available: {}", self.selection.reason);
            ctx.apply(
                SPDK_STATUS_ID,
                status(&self.template, &inner, ObjectState::Failed, msg),
            )?;
            return Ok(Requeue::OnInputChange);
        }

        // with a keeper, a dead target may be replaced before talon looks: the client reconnects
        // to the new one on the same socket, so a gone pid counts as stopped too
        if let Some(t) = inner.target.as_ref()
            && ((self.keeper.is_some() && t.pid().is_some() && !pid_alive(t.pid())) || !answers(t).await)
        {
            tracing::warn!(pid = ?t.pid(), "spdk_tgt stopped answering; starting it again");
            inner.target = None;
            inner.restarts += 1;
            let up_for = inner.up_since.take().map(|u| u.elapsed());
            note_stop(&mut inner.backoff, up_for);
            // with a keeper, the keeper restarts it (with its own backoff); talon adopts it again
            if self.keeper.is_none() {
                let delay = inner.backoff.next_delay();
                inner.next_start = Some(Instant::now() + delay);
            }
            inner.last_error = None;
        }
        if inner.target.is_none() {
            if let Some(at) = inner.next_start {
                let left = at.saturating_duration_since(Instant::now());
                if !left.is_zero() {
                    // a start that failed stays `failed` with its cause while the next one waits
                    let (state, msg) = match &inner.last_error {
                        Some(e) => (
                            ObjectState::Failed,
                            format!("cannot start: {e} (next attempt in {left:.1?})"),
                        ),
                        None => (
                            ObjectState::Creating,
                            format!("restarting in {left:.1?} (restart {})", inner.restarts),
                        ),
                    };
                    ctx.apply(SPDK_STATUS_ID, status(&self.template, &inner, state, msg))?;
                    return Ok(Requeue::After(left));
                }
            }
            let mut cfg = self.template.clone();
            cfg.exported_volumes = u32::try_from(v2_volumes).unwrap_or(u32::MAX);
            cfg.pci_disks = disks.iter().any(|d| d.spec.pci.is_some());
            let wanted = self.sized_mem_mib(&cfg);
            if let Some(k) = &self.keeper {
                let mem_mib = match cfg.memory {
                    Memory::NoHuge { mem_size_mib } => mem_size_mib,
                    Memory::Hugepages { mem_size_mib } => mem_size_mib.unwrap_or(wanted),
                };
                return self
                    .adopt_kept(ctx, &mut inner, k, SpdkWant::from_config(&cfg, mem_mib))
                    .await;
            }
            let mut memory_note = None;
            if cfg.memory == (Memory::Hugepages { mem_size_mib: None }) && !cfg.embedded {
                let (mib, note) = cap_memory(wanted, free_hugepages_mib(&self.host), cfg.exported_volumes);
                cfg.memory = Memory::Hugepages {
                    mem_size_mib: Some(mib),
                };
                memory_note = note;
            }
            match Target::start(&cfg).await {
                Ok(t) => {
                    tracing::info!(pid = ?t.pid(), origin = ?t.origin(), version = %t.version().version, "spdk_tgt ready");
                    // an adopted target kept the memory it was started with
                    inner.memory_note = memory_note.filter(|_| t.origin() == Origin::Spawned);
                    if let Some(n) = &inner.memory_note {
                        tracing::warn!("{n}");
                    }
                    inner.nvme_note = configure(&t).await;
                    inner.target = Some(t);
                    inner.up_since = Some(Instant::now());
                    inner.next_start = None;
                    inner.last_error = None;
                }
                Err(e) if e.is_permanent() => {
                    inner.next_start = None;
                    let msg = crate::util::error_chain(&e);
                    ctx.apply(
                        SPDK_STATUS_ID,
                        status(&self.template, &inner, ObjectState::Failed, msg),
                    )?;
                    return Ok(Requeue::OnInputChange);
                }
                Err(e) => {
                    let after = inner.backoff.next_delay();
                    inner.next_start = Some(Instant::now() + after);
                    let cause = crate::util::error_chain(&e);
                    // a spawned target that never became ready was killed (Target::spawn)
                    tracing::warn!(error = %cause, next_attempt_in = ?after, "spdk_tgt did not start");
                    let msg = format!("cannot start: {cause} (next attempt in {after:.1?})");
                    inner.last_error = Some(cause);
                    ctx.apply(
                        SPDK_STATUS_ID,
                        status(&self.template, &inner, ObjectState::Failed, msg),
                    )?;
                    return Ok(Requeue::After(after));
                }
            }
        }
        let origin = inner.target.as_ref().map(Target::origin);
        let msg = match origin {
            Some(Origin::Adopted) => format!("adopted on {}", self.template.socket().display()),
            Some(Origin::Embedded) => format!(
                "in-process (spdk-embedded), serving on {}",
                self.template.socket().display()
            ),
            _ => format!("serving on {}", self.template.socket().display()),
        };
        let msg = with_notes(msg, &inner);
        ctx.apply(
            SPDK_STATUS_ID,
            status(&self.template, &inner, ObjectState::Ready, msg),
        )?;
        self.measure(&mut inner, u32::try_from(v2_volumes).unwrap_or(u32::MAX))
            .await;
        Ok(Requeue::After(Duration::from_secs(1)))
    }
}

/// What talon sets on a target it has just started or adopted, before the
/// disk and volume controllers attach any NVMe controller: the NVMe keep-alive
/// (Longhorn's 10 s). A target that cannot take it (controllers attached
/// before talon adopted it, or the call failed) runs on with the note
/// returned; the next start or adoption tries again.
async fn configure(t: &Target) -> Option<String> {
    let note = match set_nvme_keep_alive(t.client()).await {
        Ok(note) => note,
        Err(e) => Some(format!(
            "setting the NVMe keep-alive failed: {}",
            crate::util::error_chain(&e)
        )),
    };
    if let Some(n) = &note {
        tracing::warn!("{n}");
    }
    note
}

/// The status message with the notes on the held target appended.
fn with_notes(msg: String, inner: &Inner) -> String {
    [&inner.memory_note, &inner.nvme_note]
        .into_iter()
        .flatten()
        .fold(msg, |m, n| format!("{m}; {n}"))
}

/// A target stopped after `up_for` of answering (`None`: it never did):
/// one that ran longer than [`STABLE_UPTIME`] starts the backoff over, so a
/// crash after hours waits 100 ms, not the 30 s earlier crashes built up.
fn note_stop(backoff: &mut crate::util::Backoff, up_for: Option<Duration>) {
    if up_for.is_some_and(|u| u > STABLE_UPTIME) {
        backoff.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restart_backoff_grows_with_quick_deaths_and_resets_after_healthy_running() {
        let mut b = crate::util::Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let mut delays = Vec::new();
        // killed every few seconds, and once a target that never answered
        for up in [
            Some(2),
            Some(3),
            None,
            Some(5),
            Some(1),
            Some(2),
            Some(4),
            Some(9),
            Some(3),
            Some(2),
        ] {
            note_stop(&mut b, up.map(Duration::from_secs));
            delays.push(b.next_delay());
        }
        assert_eq!(
            delays.last(),
            Some(&Duration::from_secs(30)),
            "capped: {delays:?}"
        );
        assert!(delays.windows(2).all(|w| w[0] <= w[1]), "{delays:?}");
        // then it ran 11 s: back to the first pause
        note_stop(&mut b, Some(Duration::from_secs(11)));
        assert_eq!(b.next_delay(), Duration::from_millis(100));
        // 10 s exactly is not yet healthy running
        note_stop(&mut b, Some(STABLE_UPTIME));
        assert_eq!(b.next_delay(), Duration::from_millis(200));
    }

    #[test]
    fn memory_is_capped_at_the_free_hugepages_with_the_shortfall_named() {
        assert_eq!(cap_memory(942, 2048, 10), (942, None));
        let (mib, note) = cap_memory(4812, 882, 100);
        assert_eq!(mib, 882);
        let note = note.expect("a shortfall note");
        assert!(note.contains("-s 882 MiB") && note.contains("4812 MiB"), "{note}");
        assert!(
            note.contains("100 volume(s)") && note.contains("3930 MiB short"),
            "{note}"
        );
        // nothing free: nothing to start with; the target's own failure says why
        assert_eq!(cap_memory(512, 0, 0), (512, None));
    }
}
