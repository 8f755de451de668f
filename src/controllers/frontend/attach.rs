//! `frontend.AttachController`: attaches the volumes asked for on this host through the kernel
//! NVMe/TCP initiator or, as the fallback, the kernel iSCSI initiator, and reports
//! `AttachmentStatus`.
//!
//! ```text
//!   config/Attachment(v) ─┬─ running ──> finalizer; choose(host probe, Attachment/Volume frontend,
//!   config/Volume(v)      │                                 EngineStatus(v).exports)
//!   engine/EngineStatus(v)┘     ├─ nvme-tcp ── nvme_tcp::attach (blocking thread) ─┐
//!                               └─ iscsi ───── iscsi::attach (iscsiadm in iscsid's ns) ┴─> frontend/AttachmentStatus(v)
//!                           tearing-down ──> detach by the status' transport ──> remove finalizer
//!                                            (the status goes by output tracking)
//! ```
//!
//! The host is reached through the `HostRoot` of the daemon (`--host-root`); iscsiadm runs in
//! iscsid's namespaces and the per-volume lock lives in the host mount namespace.

use std::net::IpAddr;
use std::time::Duration;

use crate::attach::choose::{self, HostFrontends, Transport};
use crate::attach::iscsi::{self, IscsiOptions, IscsiTarget, NsIscsiadm, SharedIscsiadm};
use crate::attach::nvme_tcp::{self, ConnectOptions, Connector, NvmeTcpTarget};
use crate::controllers::Deps;
use crate::names::{Iqn, Nqn, ObjectName};
use crate::resources::config::{FrontendKind, NodeConfig, Volume};
use crate::resources::engine::{Engine, EngineStatus, Export, ObjectState};
use crate::resources::frontend::{AttachState, Attachment, AttachmentStatus};
use crate::runtime::{Controller, ControllerError, Input, Output, Phase, ReconcileContext, Requeue};
use crate::tgt::ChapCredentials;

/// Attaches and detaches volumes on this host.
#[derive(Debug)]
pub struct AttachController {
    deps: Deps,
    opts: ConnectOptions,
    connect: Connector,
    iscsiadm: SharedIscsiadm,
    iscsi_opts: IscsiOptions,
    /// Fixed host capabilities (tests); `None` probes the host on every reconcile.
    host_frontends: Option<HostFrontends>,
}

impl AttachController {
    /// The controller on the real kernel initiator.
    pub fn new(deps: Deps) -> Self {
        let iscsiadm = std::sync::Arc::new(NsIscsiadm::new(deps.host.clone()));
        Self {
            deps,
            opts: ConnectOptions::default(),
            connect: nvme_tcp::fabrics_connect,
            iscsiadm,
            iscsi_opts: IscsiOptions::default(),
            host_frontends: None,
        }
    }

    /// The controller with another connector and options (tests on fixture trees). The injected
    /// connector is the host's NVMe/TCP initiator, so the host is not probed: it counts as
    /// having nvme_tcp and no iSCSI (see [`with_iscsi`](Self::with_iscsi)).
    pub fn with_connector(deps: Deps, opts: ConnectOptions, connect: Connector) -> Self {
        Self {
            opts,
            connect,
            host_frontends: Some(HostFrontends {
                nvme_tcp: true,
                iscsi: false,
            }),
            ..Self::new(deps)
        }
    }

    /// Uses another iscsiadm, iSCSI bounds and fixed host capabilities (tests on fixture trees).
    pub fn with_iscsi(mut self, iscsiadm: SharedIscsiadm, opts: IscsiOptions, host: HostFrontends) -> Self {
        self.iscsiadm = iscsiadm;
        self.iscsi_opts = opts;
        self.host_frontends = Some(host);
        self
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

/// Why an engine's export cannot be attached to.
#[derive(Debug, thiserror::Error)]
enum ExportError {
    /// Its address is not an IP address.
    #[error("export address {address:?} is not an IP address")]
    Address {
        /// The export's address.
        address: String,
    },
    /// Its name is not an NQN (NVMe/TCP) or an IQN (iSCSI).
    #[error(transparent)]
    Name(#[from] crate::names::InvalidName),
}

/// The address of an export; an unspecified listen address means this host.
fn export_addr(e: &Export) -> Result<IpAddr, ExportError> {
    let addr: IpAddr = e.address.parse().map_err(|_| ExportError::Address {
        address: e.address.clone(),
    })?;
    Ok(match addr {
        a if !a.is_unspecified() => a,
        IpAddr::V4(_) => IpAddr::from([127, 0, 0, 1]),
        IpAddr::V6(_) => IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
    })
}

/// The NVMe/TCP target of an export and the namespace id.
fn nvme_target(e: &Export) -> Result<(NvmeTcpTarget, u32), ExportError> {
    let nqn = Nqn::parse(&e.name)?;
    Ok((
        NvmeTcpTarget {
            traddr: export_addr(e)?,
            trsvcid: e.port,
            nqn,
        },
        e.lun.max(1),
    ))
}

/// The iSCSI target of an export; an unspecified listen address means this host. The login
/// uses talon's initiator name, the one the engine allows for attached volumes.
fn iscsi_target(
    e: &Export,
    initiator: Option<Iqn>,
    chap: Option<ChapCredentials>,
) -> Result<IscsiTarget, ExportError> {
    let iqn = Iqn::parse(&e.name)?;
    Ok(IscsiTarget {
        portal: std::net::SocketAddr::new(export_addr(e)?, e.port),
        iqn,
        lun: e.lun,
        initiator,
        chap,
    })
}

#[async_trait::async_trait]
impl Controller for AttachController {
    fn name(&self) -> &'static str {
        "frontend.AttachController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::of::<Attachment>(),
            Input::of::<Volume>(),
            Input::of::<EngineStatus>(),
            Input::of::<NodeConfig>(),
        ]
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
                let engine = ctx.get::<EngineStatus>(&id)?;
                let export = |t: &str| {
                    engine
                        .as_ref()
                        .and_then(|e| e.spec.exports.iter().find(|x| x.transport == t).cloned())
                };
                // the export's NQN/IQN too: cleans up even when /dev/talon/<volume> is gone
                let nqn = export("nvme-tcp").and_then(|x| Nqn::parse(&x.name).ok());
                let iqn = export("iscsi").and_then(|x| Iqn::parse(&x.name).ok());
                let was = ctx
                    .get::<AttachmentStatus>(&id)?
                    .map(|s| s.spec.transport)
                    .unwrap_or_default();
                let (adm, iopts) = (self.iscsiadm.clone(), self.iscsi_opts.clone());
                tokio::task::spawn_blocking(move || -> Result<(), ControllerError> {
                    let iscsi_sessions = match &iqn {
                        Some(iqn) => iscsi::list_sessions(&root)?
                            .iter()
                            .any(|s| s.targetname == iqn.as_str()),
                        None => false,
                    };
                    if was == "iscsi" || iscsi_sessions {
                        iscsi::detach(&root, &vol, iqn.as_ref(), &iopts, &*adm)?;
                    }
                    if was != "iscsi" {
                        nvme_tcp::detach(&root, &data_dir, &vol, nqn.as_ref())?;
                    }
                    Ok(())
                })
                .await??;
                tracing::info!(volume = %id, "detached");
                ctx.remove_finalizer::<Attachment>(&id)?;
                continue;
            }
            ctx.add_finalizer::<Attachment>(&id)?;
            let engine = ctx.get::<EngineStatus>(&id)?;
            let exports = match &engine {
                None => {
                    ctx.apply(
                        &id,
                        status(AttachState::Attaching, "waiting for the volume's engine"),
                    )?;
                    continue;
                }
                Some(e) if !matches!(e.spec.state, ObjectState::Ready | ObjectState::Degraded) => {
                    let msg = format!("waiting for the engine (state {:?})", e.spec.state);
                    ctx.apply(&id, status(AttachState::Attaching, msg))?;
                    continue;
                }
                Some(e) if e.spec.exports.is_empty() => {
                    ctx.apply(
                        &id,
                        status(AttachState::Attaching, "waiting for the engine's exports"),
                    )?;
                    continue;
                }
                Some(e) => e.spec.exports.clone(),
            };
            let volume_frontend = ctx
                .get::<Volume>(&id)?
                .map(|v| v.spec.frontend)
                .unwrap_or(FrontendKind::Auto);
            let wanted = choose::effective(a.spec.frontend, volume_frontend);
            // an attached volume stays on its transport while `auto` (a module unloaded later
            // must not start a second attach through the other frontend)
            let current = ctx
                .get::<AttachmentStatus>(&id)?
                .filter(|s| s.spec.state == AttachState::Attached)
                .map(|s| s.spec.transport);
            let wanted = match (wanted, current.as_deref()) {
                (FrontendKind::Auto, Some("nvme-tcp")) => FrontendKind::NvmeTcp,
                (FrontendKind::Auto, Some("iscsi")) => FrontendKind::Iscsi,
                (w, _) => w,
            };
            let host = match self.host_frontends {
                Some(h) => h,
                None => {
                    let r = root.clone();
                    tokio::task::spawn_blocking(move || HostFrontends::probe(&r)).await?
                }
            };
            let (transport, export) = match choose::choose(&id, host, wanted, &exports) {
                Ok(c) => c,
                Err(e) => {
                    ctx.apply(&id, status(AttachState::Failed, e.to_string()))?;
                    continue;
                }
            };
            // the engine allows this host once it sees the Attachment: wait for it rather than
            // fail a login the target would refuse
            let ids = {
                let (r, d) = (root.clone(), data_dir.clone());
                tokio::task::spawn_blocking(move || crate::attach::HostInitiators::load_or_create(&r, &d))
                    .await?
            };
            let ids = match ids {
                Ok(ids) => ids,
                Err(e) => {
                    ctx.apply(&id, status(AttachState::Failed, crate::util::error_chain(&e)))?;
                    requeue = Requeue::After(Duration::from_secs(10));
                    continue;
                }
            };
            let me = match transport {
                Transport::Iscsi => ids.iqn.to_string(),
                Transport::NvmeTcp => ids.nqn.to_string(),
            };
            if !export.hosts.contains(&me) {
                let msg = format!("waiting for the engine to allow this host ({me})");
                ctx.apply(&id, status(AttachState::Attaching, msg))?;
                continue;
            }
            if transport == Transport::Iscsi {
                // this node's V1 targets require CHAP when the node says so: log in with the
                // node's credentials (the same file the engine gives tgtd)
                let v1 = engine.as_ref().is_some_and(|e| e.spec.engine == Engine::V1);
                let chap_on = ctx.get::<NodeConfig>("node")?.is_some_and(|n| n.spec.iscsi_chap);
                let chap = if v1 && chap_on {
                    let d = data_dir.clone();
                    match tokio::task::spawn_blocking(move || crate::tgt::chap::load_or_create(&d)).await? {
                        Ok(c) => Some(c),
                        Err(e) => {
                            let msg = crate::util::error_chain(&e);
                            ctx.apply(&id, status(AttachState::Failed, msg))?;
                            requeue = Requeue::After(Duration::from_secs(10));
                            continue;
                        }
                    }
                } else {
                    None
                };
                let target = match iscsi_target(&export, Some(ids.iqn.clone()), chap) {
                    Ok(t) => t,
                    Err(e) => {
                        ctx.apply(&id, status(AttachState::Failed, e.to_string()))?;
                        continue;
                    }
                };
                let (adm, iopts) = (self.iscsiadm.clone(), self.iscsi_opts.clone());
                // an attached volume comes through here again on every input change: attach finds
                // the logged-in session and the existing node, and runs no iscsiadm
                let res = tokio::task::spawn_blocking(move || {
                    iscsi::attach(&root, &volume, &target, &iopts, &*adm)
                })
                .await?;
                match res {
                    Ok(at) => ctx.apply(
                        &id,
                        AttachmentStatus {
                            transport: Transport::Iscsi.to_string(),
                            device: format!("/dev/{}", at.device),
                            path: at.stable_path.display().to_string(),
                            controller: at.session,
                            state: AttachState::Attached,
                            message: String::new(),
                        },
                    )?,
                    Err(e) => {
                        tracing::warn!(volume = %id, error = %e, "iSCSI attach failed");
                        ctx.apply(&id, status(AttachState::Failed, crate::util::error_chain(&e)))?;
                        requeue = Requeue::After(Duration::from_secs(10));
                    }
                }
                continue;
            }
            let (target, nsid) = match nvme_target(&export) {
                Ok(t) => t,
                Err(e) => {
                    ctx.apply(&id, status(AttachState::Failed, e.to_string()))?;
                    continue;
                }
            };
            // this node's V2 exports require DH-HMAC-CHAP when the node says so: authenticate
            // with this host's secret (the same file the engine gives spdk_tgt's keyring)
            let dhchap_secret = if ctx.get::<NodeConfig>("node")?.is_some_and(|n| n.spec.nvme_dhchap) {
                let (d, nqn) = (data_dir.clone(), ids.nqn.to_string());
                match tokio::task::spawn_blocking(move || {
                    crate::util::nvme_auth::load_or_create::<crate::util::nvme_auth::DhchapSecret>(&d, &nqn)
                })
                .await?
                {
                    Ok(s) => Some(s),
                    Err(e) => {
                        ctx.apply(&id, status(AttachState::Failed, crate::util::error_chain(&e)))?;
                        requeue = Requeue::After(Duration::from_secs(10));
                        continue;
                    }
                }
            } else {
                None
            };
            // an attached volume goes through here again on every input change: attach finds the
            // live controller and the existing node, and changes nothing
            let opts = ConnectOptions {
                nsid,
                dhchap_secret,
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
                    ctx.apply(&id, status(AttachState::Failed, crate::util::error_chain(&e)))?;
                    requeue = Requeue::After(Duration::from_secs(10));
                }
            }
        }
        Ok(requeue)
    }
}
