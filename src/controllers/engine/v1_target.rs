//! `engine.TgtdController`: runs tgtd while any volume is served by the V1
//! engine, restarts it when it dies, and reports it as `TargetStatus` `tgtd`.
//!
//! ```text
//!   NodeConfig (listenAddress, iscsiPort) ─┐
//!   Volume (engine v1 / auto→v1) ──────────┴─> reconcile ──> Tgtd::start_or_adopt / stop
//!                                                   │          (portal verified, own control socket)
//!                                                   └──> TargetStatus "tgtd" {state, pid, restarts, ...}
//!   every 2 s: is tgtd alive? no -> restarts += 1, start again (the volume controller re-exports)
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::Mutex;

use super::TargetsOnExit;
use super::selection::engine_for;
use crate::keeper::{KeeperFiles, TgtdWant};
use crate::resources::config::{NodeConfig, Volume};
use crate::resources::engine::{Engine, ObjectState, TGTD_STATUS_ID, TargetStatus};
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};
use crate::tgt::{DaemonError, Tgtd, TgtdConfig};

#[derive(Debug, Default)]
struct Inner {
    tgtd: Option<Tgtd>,
    restarts: u32,
    version: Option<String>,
    /// The want last written for the keeper (`--target-keeper`).
    want: Option<TgtdWant>,
}

/// Supervises tgtd for the V1 engine. When the controller is dropped (a clean
/// stop of talon) its tgtd, started or adopted, keeps serving, as after a crash
/// of talon, and the next talon adopts it (iSCSI sessions stay logged in); with
/// [`TargetsOnExit::stop`] (`--stop-targets-on-exit`) it is stopped.
#[derive(Debug)]
pub struct TgtdController {
    template: TgtdConfig,
    /// The engine of `auto` volumes on an `auto` node here.
    auto: Engine,
    on_exit: TargetsOnExit,
    /// `--target-keeper`: the keeper runs tgtd; talon writes wants and adopts.
    keeper: Option<KeeperFiles>,
    inner: Mutex<Inner>,
}

impl TgtdController {
    /// tgtd with its control socket, pid file and log under `run_dir`
    /// (`<run_dir>/tgtd/socket.0`, ...); `auto`: the engine of `auto` volumes
    /// on an `auto` node here (tgtd runs for them when it is V1).
    pub fn new(run_dir: impl Into<PathBuf>, auto: Engine) -> Self {
        let portal = SocketAddr::from(([127, 0, 0, 1], crate::tgt::daemon::ISCSI_PORT));
        Self::with_config(TgtdConfig::new(run_dir.into().join("tgtd"), portal), auto)
    }

    /// With explicit tgtd settings (the portal is replaced by NodeConfig's).
    pub fn with_config(template: TgtdConfig, auto: Engine) -> Self {
        Self {
            template,
            auto,
            on_exit: TargetsOnExit::stop(),
            keeper: None,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// What dropping the controller does to tgtd (default: stop it; the
    /// daemon passes its `--stop-targets-on-exit` policy).
    pub fn on_exit(mut self, on_exit: TargetsOnExit) -> Self {
        self.on_exit = on_exit;
        self
    }

    /// `--target-keeper`: `talon keep-targets` runs tgtd; this controller
    /// writes what should run (`<run_dir>/keeper/tgtd.want.json`) and adopts
    /// it, never starts or stops it itself.
    pub fn with_keeper(mut self, keeper: Option<KeeperFiles>) -> Self {
        self.keeper = keeper;
        self
    }

    /// Writes `want` for the keeper when it changed.
    fn want(&self, inner: &mut Inner, want: TgtdWant) -> Result<(), ControllerError> {
        let Some(k) = &self.keeper else { return Ok(()) };
        if inner.want.as_ref() != Some(&want) {
            k.write_want("tgtd", &want)
                .map_err(|e| format!("writing {}: {e}", k.want_path("tgtd").display()))?;
            inner.want = Some(want);
        }
        Ok(())
    }

    /// The tgtd settings (control socket and friends), portal aside.
    pub fn config(&self) -> &TgtdConfig {
        &self.template
    }
}

fn status(
    state: ObjectState,
    pid: Option<u32>,
    cfg: &TgtdConfig,
    inner: &Inner,
    message: String,
) -> TargetStatus {
    TargetStatus {
        engine: Engine::V1,
        state,
        pid,
        socket: cfg.socket().display().to_string(),
        version: inner.version.clone().unwrap_or_default(),
        restarts: inner.restarts,
        message,
    }
}

fn tgtd_version(program: &std::path::Path) -> Option<String> {
    let out = std::process::Command::new(program).arg("-V").output().ok()?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!v.is_empty()).then_some(v)
}

impl Drop for TgtdController {
    fn drop(&mut self) {
        if let Some(k) = &self.keeper {
            // the keeper holds tgtd: a drain asks it to stop it, a stop leaves it
            if self.on_exit.stops() {
                match k.write_want("tgtd", &TgtdWant::default()) {
                    Ok(()) => tracing::info!("asked the target keeper to stop tgtd"),
                    Err(e) => tracing::warn!(error = %e, "cannot ask the target keeper to stop tgtd"),
                }
            }
            return;
        }
        let Some(t) = self.inner.get_mut().tgtd.take() else {
            return;
        };
        if !self.on_exit.stops() {
            tracing::info!(
                pid = t.pid(),
                portal = %t.portal(),
                "leaving tgtd serving; the next talon adopts it (--stop-targets-on-exit stops it)"
            );
            return;
        }
        if let Err(e) = t.stop() {
            tracing::warn!(error = %e, "cannot stop tgtd");
        }
    }
}

impl TgtdController {
    /// `--target-keeper`: writes what should run, adopts the keeper's tgtd,
    /// and says what the keeper says while there is nothing to adopt.
    async fn adopt_kept(
        &self,
        ctx: &mut ReconcileContext,
        inner: &mut Inner,
        cfg: TgtdConfig,
    ) -> Result<Requeue, ControllerError> {
        self.want(
            inner,
            TgtdWant {
                run: true,
                portal: Some(cfg.portal),
            },
        )?;
        if let Some(t) = inner.tgtd.as_mut()
            && (!t.is_alive() || t.portal() != cfg.portal)
        {
            if !t.is_alive() {
                tracing::warn!(pid = t.pid(), "tgtd died; the target keeper starts it again");
                inner.restarts += 1;
            }
            inner.tgtd = None;
        }
        if inner.version.is_none() {
            let program = cfg.program.clone();
            inner.version = tokio::task::spawn_blocking(move || tgtd_version(&program)).await?;
        }
        let keeper = self
            .keeper
            .as_ref()
            .map(|k| k.read_status("tgtd"))
            .unwrap_or_default();
        if inner.tgtd.is_none() {
            let adopt_cfg = cfg.clone();
            let why = match tokio::task::spawn_blocking(move || Tgtd::adopt(adopt_cfg)).await? {
                Ok(Some(t)) => {
                    inner.tgtd = Some(t);
                    None
                }
                Ok(None) => Some("not running yet".to_string()),
                // the keeper is moving it to a new portal
                Err(e @ DaemonError::AdoptWrongPortal { .. }) => Some(crate::util::error_chain(&e)),
                Err(e) => return Err(e.into()),
            };
            if let Some(why) = why {
                let (state, msg) = match keeper {
                    Some(k) if k.state == "failed" => (
                        ObjectState::Failed,
                        format!("the target keeper cannot start tgtd: {}", k.message),
                    ),
                    Some(k) => (
                        ObjectState::Creating,
                        format!(
                            "waiting for the target keeper (pid {}) to serve iSCSI on {}: {why}; keeper: {} ({})",
                            k.keeper_pid, cfg.portal, k.state, k.message
                        ),
                    ),
                    None => (
                        ObjectState::Creating,
                        format!(
                            "waiting for the target keeper (talon keep-targets) to serve iSCSI on {}: {why}",
                            cfg.portal
                        ),
                    ),
                };
                ctx.apply(TGTD_STATUS_ID, status(state, None, &cfg, inner, msg))?;
                return Ok(Requeue::After(Duration::from_millis(500)));
            }
        }
        let pid = inner.tgtd.as_ref().map(Tgtd::pid);
        let msg = format!("serving iSCSI on {} (kept by talon keep-targets)", cfg.portal);
        ctx.apply(TGTD_STATUS_ID, status(ObjectState::Ready, pid, &cfg, inner, msg))?;
        Ok(Requeue::After(Duration::from_secs(2)))
    }
}

#[async_trait::async_trait]
impl Controller for TgtdController {
    fn name(&self) -> &'static str {
        "engine.TgtdController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::of::<NodeConfig>(), Input::of::<Volume>()]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::shared::<TargetStatus>()]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let node = ctx.get::<NodeConfig>("node")?.map(|n| n.spec).unwrap_or_default();
        let needed = ctx
            .list::<Volume>()?
            .iter()
            .any(|v| engine_for(&v.spec, &node, self.auto) == Engine::V1);
        let mut inner = self.inner.lock().await;

        if !needed && self.keeper.is_some() {
            // the keeper stops it; talon lets go of it
            self.want(&mut inner, TgtdWant::default())?;
            inner.tgtd = None;
            return Ok(Requeue::OnInputChange);
        }
        if !needed {
            // nothing to serve: no tgtd (it could hold the iSCSI port another target wants)
            if let Some(t) = inner.tgtd.take() {
                tokio::task::spawn_blocking(move || t.stop()).await??;
            }
            return Ok(Requeue::OnInputChange);
        }

        let mut cfg = self.template.clone();
        let ip: IpAddr = match node.listen_address.parse() {
            Ok(ip) => ip,
            Err(_) => {
                let msg = format!("listenAddress {:?} is not an IP address", node.listen_address);
                ctx.apply(
                    TGTD_STATUS_ID,
                    status(ObjectState::Failed, None, &cfg, &inner, msg),
                )?;
                return Ok(Requeue::OnInputChange);
            }
        };
        cfg.portal = SocketAddr::new(ip, node.iscsi_port);
        if self.keeper.is_some() {
            return self.adopt_kept(ctx, &mut inner, cfg).await;
        }

        if let Some(t) = inner.tgtd.as_mut() {
            if !t.is_alive() {
                tracing::warn!(pid = t.pid(), "tgtd died; starting it again");
                inner.tgtd = None;
                inner.restarts += 1;
            } else if t.portal() != cfg.portal
                && let Some(t) = inner.tgtd.take()
            {
                // the portal changed: stop it; it starts again below on the new one
                tokio::task::spawn_blocking(move || t.stop()).await??;
            }
        }
        if inner.version.is_none() {
            let program = cfg.program.clone();
            inner.version = tokio::task::spawn_blocking(move || tgtd_version(&program)).await?;
        }
        if inner.tgtd.is_none() {
            let start_cfg = cfg.clone();
            match tokio::task::spawn_blocking(move || Tgtd::start_or_adopt(start_cfg)).await? {
                Ok(t) => inner.tgtd = Some(t),
                Err(e) => {
                    let msg = crate::util::error_chain(&e);
                    ctx.apply(
                        TGTD_STATUS_ID,
                        status(ObjectState::Failed, None, &cfg, &inner, msg),
                    )?;
                    return Ok(Requeue::After(Duration::from_secs(5)));
                }
            }
        }
        let pid = inner.tgtd.as_ref().map(Tgtd::pid);
        let msg = format!("serving iSCSI on {}", cfg.portal);
        ctx.apply(TGTD_STATUS_ID, status(ObjectState::Ready, pid, &cfg, &inner, msg))?;
        Ok(Requeue::After(Duration::from_secs(2)))
    }
}
