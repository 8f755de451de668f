//! `engine.V1VolumeController`: makes every V1 volume a sparse file exported by
//! tgtd, and every snapshot of one a reflinked file; reports `EngineStatus` and
//! `SnapshotStatus`.
//!
//! ```text
//!   Volume, Snapshot (config) ─┐                       ┌─> V1Store: create / clone / expand / delete
//!   NodeConfig (ACL, portal) ──┼─> jobs ─> V1Ops ──────┤   snapshot / delete_snapshot
//!   TargetStatus "tgtd" ───────┘   spawn_blocking      └─> TgtAdm: export (idempotent; again after
//!                                        │                          every tgtd restart)
//!                                        v
//!                    Realized: EngineStatus <volume>, SnapshotStatus <volume>@<name>, or deleted
//! ```
//!
//! Deletion: the controller holds a finalizer on each V1 `Volume` and
//! `Snapshot`; a delete waits (state `deleting`, message naming the sessions)
//! until no initiator is logged in, then removes target, file and snapshots.

use std::path::PathBuf;
use std::time::Duration;

use super::selection::engine_for;
use crate::attach::HostInitiators;
use crate::names::{Iqn, ObjectName};
use crate::resources::config::{NodeConfig, Snapshot, Volume, split_snapshot_id};
use crate::resources::engine::{
    Engine, EngineStatus, Export, ObjectState, SnapshotStatus, TGTD_STATUS_ID, TargetStatus,
};
use crate::resources::frontend::Attachment;
use crate::runtime::{Controller, ControllerError, Input, Output, Phase, ReconcileContext, Requeue};
use crate::tgt::volume::{VOLUME_LUN, VolumeError};
use crate::tgt::{ExportOptions, InitiatorAcl, TargetInfo, TgtAdm, V1Store};

/// The iSCSI ACL of a volume, by initiator name only: this host's initiator
/// name while the volume is attached here (`attached_by`), and the IQNs among
/// the node's allowed hosts. Nothing else: a volume attached nowhere and with
/// no allowed host is reachable by nobody (tgtd refuses discovery and login to
/// a target without ACL entries).
pub fn export_options(node: &NodeConfig, attached_by: Option<&Iqn>) -> ExportOptions {
    let mut names: Vec<InitiatorAcl> = Vec::new();
    let allowed = node.allowed_hosts.iter().filter_map(|h| Iqn::parse(h).ok());
    for iqn in attached_by.cloned().into_iter().chain(allowed) {
        let acl = InitiatorAcl::Name(iqn);
        if !names.contains(&acl) {
            names.push(acl);
        }
    }
    ExportOptions {
        initiators: names,
        chap: None,
    }
}

/// Serves V1 volumes through tgtd.
#[derive(Debug)]
pub struct V1VolumeController {
    store: V1Store,
    admin: TgtAdm,
    /// The engine of `auto` volumes on an `auto` node here
    /// ([`super::selection::EngineSelection::auto_engine`]).
    auto: Engine,
    /// This host's initiator names; `None` when they cannot be read (attached
    /// volumes are then exported only to the allowed hosts).
    initiators: Option<HostInitiators>,
}

impl V1VolumeController {
    /// Volumes under `<data_dir>/v1`, tgtd's control socket from `admin`;
    /// `auto`: the engine of `auto` volumes on an `auto` node here (V1 takes
    /// them when it is V1).
    pub fn new(data_dir: impl Into<PathBuf>, admin: TgtAdm, auto: Engine) -> Self {
        Self {
            store: V1Store::new(data_dir.into()),
            admin,
            auto,
            initiators: None,
        }
    }

    /// Exports attached volumes to this host's initiator name.
    pub fn with_initiators(mut self, initiators: Option<HostInitiators>) -> Self {
        self.initiators = initiators;
        self
    }
}

struct VolumeJob {
    id: String,
    spec: Volume,
    deleting: bool,
    /// Who may connect.
    opts: ExportOptions,
}

struct SnapshotJob {
    id: String,
    spec: Snapshot,
    deleting: bool,
}

/// What realizing one job came to (the V2 controller's word for the same):
/// a status to report, or the object is gone.
enum Realized<S> {
    Status(S),
    Deleted,
}

/// The V1 side of volumes for one reconcile: the store, tgtd's admin and the
/// portal (the V2 engine's `VolumeOps`/`DiskOps` in the same role).
struct V1Ops {
    store: V1Store,
    admin: TgtAdm,
    address: String,
    port: u16,
}

fn failed(engine_msg: impl Into<String>, device: String) -> EngineStatus {
    EngineStatus {
        engine: Engine::V1,
        state: ObjectState::Failed,
        size_bytes: 0,
        device,
        replicas: Vec::new(),
        exports: Vec::new(),
        message: engine_msg.into(),
    }
}

fn error_text(e: &VolumeError) -> String {
    crate::util::error_chain(e)
}

impl V1Ops {
    /// `targets`: tgtd's targets listed once for this reconcile (`None`: list
    /// them for this volume).
    fn volume(&self, job: &VolumeJob, targets: Option<&[TargetInfo]>) -> Realized<EngineStatus> {
        let name = match ObjectName::parse("volume", &job.id) {
            Ok(n) => n,
            Err(e) => return Realized::Status(failed(e.to_string(), String::new())),
        };
        let device = self.store.volume_path(&name).display().to_string();
        if job.deleting {
            return match self.store.delete(&self.admin, &name) {
                Ok(()) | Err(VolumeError::NotFound { .. }) => Realized::Deleted,
                Err(e) => Realized::Status(EngineStatus {
                    state: ObjectState::Deleting,
                    ..failed(error_text(&e), device)
                }),
            };
        }
        let mut message = String::new();
        let info = match self.store.info(&name) {
            Ok(info) => info,
            Err(VolumeError::NotFound { .. }) => {
                let made = match &job.spec.from_snapshot {
                    Some(source) => match split_snapshot_id(source) {
                        Ok((v, s)) => self.store.clone_snapshot(&v, &s, &name),
                        Err(msg) => return Realized::Status(failed(msg, device)),
                    },
                    None => self.store.create(&name, job.spec.size_bytes),
                };
                match made {
                    Ok(info) => info,
                    Err(e) => return Realized::Status(failed(error_text(&e), device)),
                }
            }
            Err(e) => return Realized::Status(failed(error_text(&e), device)),
        };
        let mut size = info.size;
        if job.spec.size_bytes > info.size {
            match self.store.expand(&self.admin, &name, job.spec.size_bytes) {
                Ok(grown) => size = grown.size,
                Err(e) => {
                    message = format!(
                        "expand to {} bytes waits: {}",
                        job.spec.size_bytes,
                        error_text(&e)
                    )
                }
            }
        } else if job.spec.size_bytes < info.size {
            message = format!("volumes do not shrink: serving {} bytes", info.size);
        }
        if job.spec.revert_to.is_some() {
            message = "revert is not supported by the V1 engine".to_string();
        }
        let exported = match targets {
            Some(t) => self.store.export_known(&self.admin, &name, &job.opts, t),
            None => self.store.export(&self.admin, &name, &job.opts),
        };
        match exported {
            Ok(export) => Realized::Status(EngineStatus {
                engine: Engine::V1,
                state: ObjectState::Ready,
                size_bytes: size,
                device,
                replicas: Vec::new(),
                exports: vec![Export {
                    transport: "iscsi".to_string(),
                    address: self.address.clone(),
                    port: self.port,
                    name: export.iqn.to_string(),
                    lun: VOLUME_LUN as u32,
                    hosts: job.opts.initiators.iter().map(|a| a.to_string()).collect(),
                }],
                message,
            }),
            Err(e) => Realized::Status(EngineStatus {
                size_bytes: size,
                ..failed(error_text(&e), device)
            }),
        }
    }

    fn snapshot(&self, job: &SnapshotJob) -> Realized<SnapshotStatus> {
        let status = |state, objects, created, message| SnapshotStatus {
            volume: job.spec.volume.clone(),
            engine: Engine::V1,
            state,
            objects,
            created,
            message,
        };
        let names = ObjectName::parse("volume", &job.spec.volume)
            .and_then(|v| Ok((v, ObjectName::parse("snapshot", &job.spec.name)?)));
        let (volume, snap) = match names {
            Ok(n) => n,
            Err(e) => {
                return Realized::Status(status(ObjectState::Failed, vec![], String::new(), e.to_string()));
            }
        };
        if job.deleting {
            return match self.store.delete_snapshot(&volume, &snap) {
                Ok(()) | Err(VolumeError::SnapshotNotFound { .. }) => Realized::Deleted,
                Err(e) => Realized::Status(status(
                    ObjectState::Deleting,
                    vec![],
                    String::new(),
                    error_text(&e),
                )),
            };
        }
        let info = match self.store.snapshot_info(&volume, &snap) {
            Ok(info) => Ok(info),
            Err(VolumeError::SnapshotNotFound { .. }) => self.store.snapshot(&volume, &snap),
            Err(e) => Err(e),
        };
        match info {
            Ok(info) => {
                let created = std::fs::metadata(&info.path)
                    .and_then(|m| m.modified())
                    .map(|t| humantime::format_rfc3339_seconds(t).to_string())
                    .unwrap_or_default();
                let path = info.path.display().to_string();
                Realized::Status(status(ObjectState::Ready, vec![path], created, String::new()))
            }
            Err(e) => Realized::Status(status(ObjectState::Failed, vec![], String::new(), error_text(&e))),
        }
    }
}

#[async_trait::async_trait]
impl Controller for V1VolumeController {
    fn name(&self) -> &'static str {
        "engine.V1VolumeController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::of::<NodeConfig>(),
            Input::of::<Volume>(),
            Input::of::<Snapshot>(),
            Input::of::<TargetStatus>(),
            Input::of::<Attachment>(),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::shared::<EngineStatus>(),
            Output::shared::<SnapshotStatus>(),
        ]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let node = ctx.get::<NodeConfig>("node")?.map(|n| n.spec).unwrap_or_default();
        let volumes: Vec<_> = ctx
            .list::<Volume>()?
            .into_iter()
            // ours: served by V1, or still held by our finalizer (to finish a delete)
            .filter(|v| {
                engine_for(&v.spec, &node, self.auto) == Engine::V1
                    || v.metadata.finalizers.contains(self.name())
            })
            .collect();
        let mine: std::collections::BTreeSet<String> = volumes.iter().map(|v| v.id().to_string()).collect();
        let snapshots: Vec<_> = ctx
            .list::<Snapshot>()?
            .into_iter()
            .filter(|s| mine.contains(&s.spec.volume) || s.metadata.finalizers.contains(self.name()))
            .collect();
        if volumes.is_empty() && snapshots.is_empty() {
            return Ok(Requeue::OnInputChange);
        }
        let tgtd_ready = ctx
            .get::<TargetStatus>(TGTD_STATUS_ID)?
            .is_some_and(|t| t.spec.engine == Engine::V1 && t.spec.state == ObjectState::Ready);
        let attached: std::collections::BTreeSet<String> = ctx
            .list::<Attachment>()?
            .into_iter()
            .map(|a| a.id().to_string())
            .collect();
        let my_iqn = self.initiators.as_ref().map(|i| &i.iqn);
        let mut vol_jobs = Vec::new();
        for v in volumes {
            if !tgtd_ready {
                // volumes wait for tgtd; snapshots (files only) go on below
                let mut s = failed("waiting for tgtd", volume_path_str(&self.store, v.id()));
                s.state = ObjectState::Creating;
                ctx.apply(v.id(), s)?;
                continue;
            }
            let deleting = v.metadata.phase == Phase::TearingDown;
            if !deleting {
                ctx.add_finalizer::<Volume>(v.id())?;
            }
            let attached_by = my_iqn.filter(|_| attached.contains(v.id()));
            vol_jobs.push(VolumeJob {
                id: v.id().to_string(),
                spec: v.spec,
                deleting,
                opts: export_options(&node, attached_by),
            });
        }
        let mut snap_jobs = Vec::new();
        for s in snapshots {
            let deleting = s.metadata.phase == Phase::TearingDown;
            if !deleting {
                ctx.add_finalizer::<Snapshot>(s.id())?;
            }
            snap_jobs.push(SnapshotJob {
                id: s.id().to_string(),
                spec: s.spec,
                deleting,
            });
        }
        let ops = V1Ops {
            store: self.store.clone(),
            admin: self.admin.clone(),
            address: node.listen_address.clone(),
            port: node.iscsi_port,
        };
        // every volume that exists, in any phase (a deleting one is removed by its job)
        let known: std::collections::BTreeSet<String> =
            ctx.list::<Volume>()?.iter().map(|v| v.id().to_string()).collect();
        // tgtadm and file operations block: run them off the async workers.
        let (vol_out, snap_out) = tokio::task::spawn_blocking(move || {
            if tgtd_ready {
                // targets talon made for volumes nobody wants (a crash mid-export or
                // mid-delete): removed by name
                match ops
                    .store
                    .remove_orphans(&ops.admin, |v| known.contains(v.as_str()))
                {
                    Ok(r) => {
                        for iqn in r.removed {
                            tracing::info!(%iqn, "removed an orphaned target");
                        }
                        for (iqn, e) in r.failed {
                            tracing::warn!(%iqn, error = %e, "cannot remove an orphaned target");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot list tgtd's targets for orphans"),
                }
            }
            let mut vol_out = Vec::new();
            let mut snap_out = Vec::new();
            // one listing of tgtd's targets for every live volume (a volume whose target is
            // as wanted then costs no tgtadm call); each volume lists them itself if it fails
            let targets = ops.admin.show().ok();
            // live volumes first (a snapshot needs its volume), then snapshots, then deletions
            for j in vol_jobs.iter().filter(|j| !j.deleting) {
                vol_out.push((j.id.clone(), ops.volume(j, targets.as_deref())));
            }
            for j in &snap_jobs {
                snap_out.push((j.id.clone(), ops.snapshot(j)));
            }
            for j in vol_jobs.iter().filter(|j| j.deleting) {
                vol_out.push((j.id.clone(), ops.volume(j, None)));
            }
            (vol_out, snap_out)
        })
        .await?;

        for (id, out) in snap_out {
            match out {
                Realized::Status(s) => ctx.apply(&id, s)?,
                Realized::Deleted => ctx.remove_finalizer::<Snapshot>(&id)?,
            }
        }
        for (id, out) in vol_out {
            match out {
                Realized::Status(s) => ctx.apply(&id, s)?,
                Realized::Deleted => ctx.remove_finalizer::<Volume>(&id)?,
            }
        }
        // poll: sessions logging out unblock pending expands and deletes
        Ok(Requeue::After(Duration::from_secs(if tgtd_ready {
            5
        } else {
            2
        })))
    }
}

fn volume_path_str(store: &V1Store, id: &str) -> String {
    ObjectName::parse("volume", id)
        .map(|n| store.volume_path(&n).display().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_is_the_attached_host_and_the_allowed_iqns_only() {
        let mut node = NodeConfig::default();
        assert_eq!(
            export_options(&node, None).initiators,
            vec![],
            "nobody by default"
        );
        let me = Iqn::parse("iqn.2025-01.io.talon:host.1").expect("iqn");
        assert_eq!(
            export_options(&node, Some(&me)).initiators,
            vec![InitiatorAcl::Name(me.clone())]
        );
        node.allowed_hosts = vec![
            "nqn.2014-08.org.nvmexpress:uuid:1".into(),
            "iqn.2025-01.io.example:h".into(),
            me.to_string(),
        ];
        assert_eq!(
            export_options(&node, Some(&me)).initiators,
            vec![
                InitiatorAcl::Name(me),
                InitiatorAcl::Name(Iqn::parse("iqn.2025-01.io.example:h").expect("iqn"))
            ]
        );
    }
}
