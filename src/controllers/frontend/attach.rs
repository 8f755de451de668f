//! `frontend.AttachController`: attaches the volumes asked for on this host through the kernel
//! NVMe/TCP initiator and reports `AttachmentStatus`.
//!
//! ```text
//!   config/Attachment(v) ─┬─ running ──> finalizer; EngineStatus(v).exports[nvme-tcp]
//!   engine/EngineStatus(v)┘                 ── nvme_tcp::attach (blocking thread) ──> frontend/AttachmentStatus(v)
//!                           tearing-down ──> nvme_tcp::detach ──> remove finalizer (status goes by output tracking)
//! ```
//!
//! Until the namespace core lands, the host is reached through the `HostRoot` of the daemon
//! (`--host-root`), not by entering the host's mount namespace. iSCSI exports are reported as
//! failed (the iSCSI frontend is not written yet).

use std::net::IpAddr;
use std::time::Duration;

use crate::attach::nvme_tcp::{self, ConnectOptions, Connector, NvmeTcpTarget};
use crate::controllers::Deps;
use crate::names::{Nqn, ObjectName};
use crate::resources::config::FrontendKind;
use crate::resources::engine::{EngineStatus, Export, ObjectState};
use crate::resources::frontend::{AttachState, Attachment, AttachmentStatus};
use crate::runtime::{Controller, ControllerError, Input, Output, Phase, ReconcileContext, Requeue};

/// Attaches and detaches volumes on this host.
#[derive(Debug)]
pub struct AttachController {
    deps: Deps,
    opts: ConnectOptions,
    connect: Connector,
}

impl AttachController {
    /// The controller on the real kernel initiator.
    pub fn new(deps: Deps) -> Self {
        Self {
            deps,
            opts: ConnectOptions::default(),
            connect: nvme_tcp::fabrics_connect,
        }
    }

    /// The controller with another connector and options (tests on fixture trees).
    pub fn with_connector(deps: Deps, opts: ConnectOptions, connect: Connector) -> Self {
        Self { deps, opts, connect }
    }
}

fn status(state: AttachState, message: impl Into<String>) -> AttachmentStatus {
    AttachmentStatus {
        transport: String::new(),
        device: String::new(),
        path: String::new(),
        controller: String::new(),
        state,
        message: message.into(),
    }
}

/// The NVMe/TCP target of an export; an unspecified listen address means this host.
fn nvme_target(e: &Export) -> Result<(NvmeTcpTarget, u32), String> {
    let mut traddr: IpAddr = e
        .address
        .parse()
        .map_err(|_| format!("export address {:?} is not an IP address", e.address))?;
    if traddr.is_unspecified() {
        traddr = if traddr.is_ipv4() {
            IpAddr::from([127, 0, 0, 1])
        } else {
            IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])
        };
    }
    let nqn = Nqn::parse(&e.name).map_err(|err| err.to_string())?;
    Ok((
        NvmeTcpTarget {
            traddr,
            trsvcid: e.port,
            nqn,
        },
        e.lun.max(1),
    ))
}

#[async_trait::async_trait]
impl Controller for AttachController {
    fn name(&self) -> &'static str {
        "frontend.AttachController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::of::<Attachment>(), Input::of::<EngineStatus>()]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<AttachmentStatus>()]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let mut requeue = Requeue::OnInputChange;
        for a in ctx.list::<Attachment>()? {
            let id = a.id().to_string();
            let volume = match ObjectName::parse("volume", &id) {
                Ok(v) => v,
                Err(e) => {
                    ctx.apply(&id, status(AttachState::Failed, e.to_string()))?;
                    continue;
                }
            };
            let (root, data_dir) = (self.deps.host.clone(), self.deps.data_dir.clone());
            if a.metadata.phase == Phase::TearingDown {
                let vol = volume.clone();
                // the export's NQN too: cleans up a controller even when /dev/talon/<volume> is gone
                let nqn = ctx.get::<EngineStatus>(&id)?.and_then(|e| {
                    e.spec
                        .exports
                        .iter()
                        .find(|x| x.transport == "nvme-tcp")
                        .and_then(|x| Nqn::parse(&x.name).ok())
                });
                tokio::task::spawn_blocking(move || nvme_tcp::detach(&root, &data_dir, &vol, nqn.as_ref()))
                    .await??;
                tracing::info!(volume = %id, "detached");
                ctx.remove_finalizer::<Attachment>(&id)?;
                continue;
            }
            ctx.add_finalizer::<Attachment>(&id)?;
            if a.spec.frontend == FrontendKind::Iscsi {
                ctx.apply(
                    &id,
                    status(AttachState::Failed, "the iSCSI frontend is not implemented yet"),
                )?;
                continue;
            }
            let engine = ctx.get::<EngineStatus>(&id)?;
            let export = engine.as_ref().and_then(|e| {
                matches!(e.spec.state, ObjectState::Ready | ObjectState::Degraded)
                    .then(|| e.spec.exports.iter().find(|x| x.transport == "nvme-tcp").cloned())
                    .flatten()
            });
            let Some(export) = export else {
                let msg = match engine {
                    None => "waiting for the volume's engine".to_string(),
                    Some(e) if e.spec.exports.iter().any(|x| x.transport == "iscsi") => {
                        "the volume is exported over iSCSI only; the iSCSI frontend is not implemented yet"
                            .into()
                    }
                    Some(e) => format!(
                        "waiting for the engine's NVMe/TCP export (engine {:?})",
                        e.spec.state
                    ),
                };
                ctx.apply(&id, status(AttachState::Attaching, msg))?;
                continue;
            };
            let (target, nsid) = match nvme_target(&export) {
                Ok(t) => t,
                Err(msg) => {
                    ctx.apply(&id, status(AttachState::Failed, msg))?;
                    continue;
                }
            };
            // an attached volume goes through here again on every input change: attach finds the
            // live controller and the existing node, and changes nothing
            let opts = ConnectOptions {
                nsid,
                ..self.opts.clone()
            };
            let connect = self.connect;
            let res = tokio::task::spawn_blocking(move || {
                nvme_tcp::attach_with(&root, &data_dir, &volume, &target, &opts, connect)
            })
            .await?;
            match res {
                Ok(at) => ctx.apply(
                    &id,
                    AttachmentStatus {
                        transport: "nvme-tcp".into(),
                        device: format!("/dev/{}", at.device),
                        path: at.stable_path.display().to_string(),
                        controller: at.controller,
                        state: AttachState::Attached,
                        message: String::new(),
                    },
                )?,
                Err(e) => {
                    tracing::warn!(volume = %id, error = %e, "attach failed");
                    ctx.apply(
                        &id,
                        status(AttachState::Failed, crate::runtime::runner::error_chain(&e)),
                    )?;
                    requeue = Requeue::After(Duration::from_secs(10));
                }
            }
        }
        Ok(requeue)
    }
}
