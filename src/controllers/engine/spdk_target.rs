//! `engine.SpdkTargetController`: runs spdk_tgt while the V2 engine has work
//! (any `Disk`, or any volume [`EngineSelection::engine_for`] gives V2),
//! restarts it with backoff when it dies, and reports it as `TargetStatus` `spdk`.
//!
//! ```text
//!   NodeConfig, Disk, Volume ──> reconcile ──needed?──> Target::start (adopt a target answering on
//!        (selection: V2?)           │                     <run_dir>/spdk.sock, else spawn + wait for
//!                                   │                     spdk_get_version), -s 512 + 43/volume MiB
//!                                   │                     capped at the free hugepages, -u unless a
//!                                   │                     Disk has `pci`
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
//! Memory: with hugepages, `-s` is the per-volume formula capped at the
//! hugepages free when the target is spawned, so that a smaller pool never
//! keeps the target from starting (a restart after a crash included): it
//! starts with what there is and `TargetStatus` reports the shortfall.
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
use crate::resources::config::{Disk, NodeConfig, Volume};
use crate::resources::engine::SPDK_STATUS_ID;
use crate::resources::engine::{Engine, ObjectState, TargetStatus};
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};
use crate::spdk::ClientError;
use crate::spdk::rpc::Version;
use crate::spdk::target::{Memory, Origin, Target, TargetConfig, mem_size_mib_for};
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
}

/// Uptime after which a crash restarts the backoff from its first delay.
const STABLE_UPTIME: Duration = Duration::from_secs(60);

/// Supervises spdk_tgt for the V2 engine (see the module docs).
#[derive(Debug)]
pub struct SpdkTargetController {
    template: TargetConfig,
    selection: EngineSelection,
    on_exit: TargetsOnExit,
    host: HostRoot,
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
            inner: Mutex::new(Inner {
                target: None,
                restarts: 0,
                backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(30)),
                up_since: None,
                next_start: None,
                last_error: None,
                memory_note: None,
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

    /// The target settings.
    pub fn config(&self) -> &TargetConfig {
        &self.template
    }
}

/// `-s` for hugepages: the `wanted` MiB, or the `free` MiB when fewer are
/// free (start with what there is), with a note of the shortfall. With no
/// free hugepages at all there is nothing to start with: `wanted` is kept and
/// the target's own failure names the cause.
pub fn cap_memory(wanted: u64, free: u64, volumes: u32) -> (u64, Option<String>) {
    if free >= wanted || free == 0 {
        return (wanted, None);
    }
    let note = format!(
        "hugepages short: started with -s {free} MiB, all that was free, instead of the {wanted} MiB \
         sized for {volumes} volume(s) ({} MiB short)",
        wanted - free
    );
    (free, Some(note))
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

        if disks.is_empty() && v2_volumes == 0 {
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

        if let Some(t) = inner.target.as_ref()
            && !answers(t).await
        {
            tracing::warn!(pid = ?t.pid(), "spdk_tgt stopped answering; starting it again");
            inner.target = None;
            inner.restarts += 1;
            if inner.up_since.take().is_some_and(|u| u.elapsed() > STABLE_UPTIME) {
                inner.backoff.reset();
            }
            let delay = inner.backoff.next_delay();
            inner.next_start = Some(Instant::now() + delay);
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
            let mut memory_note = None;
            if cfg.memory == (Memory::Hugepages { mem_size_mib: None }) && !cfg.embedded {
                let wanted = mem_size_mib_for(cfg.exported_volumes);
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
        let msg = match &inner.memory_note {
            Some(n) => format!("{msg}; {n}"),
            None => msg,
        };
        ctx.apply(
            SPDK_STATUS_ID,
            status(&self.template, &inner, ObjectState::Ready, msg),
        )?;
        Ok(Requeue::After(Duration::from_secs(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
