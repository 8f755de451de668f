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
//! What changed only: a volume served with the same spec, ACL/CHAP and tgtd
//! (pid) as last time is passed over (its status applied again from memory);
//! tgtd's targets are listed at most once per reconcile, when a volume needs
//! them; a full pass (every volume, orphaned targets) runs at start, after
//! each tgtd start and every [`FULL_PASS_EVERY`].
//!
//! Deletion: the controller holds a finalizer on each V1 `Volume` and
//! `Snapshot`; a delete waits (state `deleting`, message naming the sessions)
//! until no initiator is logged in, then removes target, file and snapshots.
//! A delete costs the same whatever the number of volumes: the target id the
//! export got from this tgtd (same pid) is remembered and the target removed
//! by it; only without one (after a tgtd or talon restart, before the full
//! pass served the volume again) or when tgtd refuses (sessions, gone) are
//! the targets listed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::selection::engine_for;
use crate::attach::HostInitiators;
use crate::names::{Iqn, ObjectName};
use crate::resources::config::{NodeConfig, Snapshot, Volume, split_snapshot_id};
use crate::resources::engine::{
    Engine, EngineStatus, Export, ObjectState, SnapshotStatus, TGTD_STATUS_ID, TargetStatus,
};
use crate::resources::frontend::Attachment;
use crate::runtime::{Controller, ControllerError, Input, Output, Phase, ReconcileContext, Requeue};
use crate::tgt::volume::ensure_chap_account;
use crate::tgt::volume::{VOLUME_LUN, VolumeError};
use crate::tgt::{
    AdminError, ChapCredentials, ExportOptions, InitiatorAcl, TargetInfo, TgtAdm, Tid, V1Store,
};

/// The iSCSI ACL of a volume, by initiator name only: this host's initiator
/// name while the volume is attached here (`attached_by`), and the IQNs among
/// the node's allowed hosts. Nothing else: a volume attached nowhere and with
/// no allowed host is reachable by nobody (tgtd refuses discovery and login to
/// a target without ACL entries).
pub fn export_options(
    node: &NodeConfig,
    attached_by: Option<&Iqn>,
    chap: Option<&ChapCredentials>,
) -> ExportOptions {
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
        chap: chap.cloned(),
    }
}

/// Serves V1 volumes through tgtd.
#[derive(Debug)]
pub struct V1VolumeController {
    store: V1Store,
    /// The data directory (the node's CHAP credentials file).
    data_dir: PathBuf,
    /// The CHAP credentials this controller made tgtd hold, by the pid of
    /// that tgtd (a new tgtd, or new credentials, make it again).
    chap_installed: std::sync::Arc<std::sync::Mutex<Option<(u32, ChapCredentials)>>>,
    /// What each live volume was last brought to, with the status it got: a
    /// reconcile passes over volumes whose spec, ACL and tgtd are unchanged
    /// without a file stat or a tgtadm call, so creating or attaching one
    /// volume does not cost a pass over every other one.
    served: std::sync::Arc<std::sync::Mutex<HashMap<String, Served>>>,
    /// When the last full pass ran, and for which tgtd (pid).
    last_full: std::sync::Arc<std::sync::Mutex<Option<(u32, Instant)>>>,
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
        let data_dir = data_dir.into();
        Self {
            store: V1Store::new(data_dir.clone()),
            data_dir,
            chap_installed: Default::default(),
            served: Default::default(),
            last_full: Default::default(),
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

/// A full pass (every volume checked against tgtd, orphans removed) runs at
/// least this often, besides at start and after every tgtd (re)start: it
/// repairs what someone else changed in tgtd behind talon's back.
pub const FULL_PASS_EVERY: Duration = Duration::from_secs(60);

/// What a live volume was brought to ([`V1VolumeController::served`]).
#[derive(Debug, Clone, PartialEq)]
struct ServedKey {
    spec: Volume,
    opts: ExportOptions,
    tgtd_pid: u32,
}

#[derive(Debug, Clone)]
struct Served {
    key: ServedKey,
    status: EngineStatus,
    /// The target id serving it in the tgtd of `key.tgtd_pid`.
    tid: Tid,
}

/// tgtd's targets, listed at most once per reconcile and only when a volume
/// needs them.
struct Listing<'a> {
    admin: &'a TgtAdm,
    got: Option<Option<Vec<TargetInfo>>>,
}

impl<'a> Listing<'a> {
    fn new(admin: &'a TgtAdm) -> Self {
        Self { admin, got: None }
    }

    /// The targets (`None` when tgtadm failed: each volume then lists them itself).
    fn get(&mut self) -> Option<&[TargetInfo]> {
        let admin = self.admin;
        self.got
            .get_or_insert_with(|| match admin.show() {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list tgtd's targets");
                    None
                }
            })
            .as_deref()
    }

    /// The targets if this reconcile listed them already (never lists).
    fn get_if_listed(&self) -> Option<&[TargetInfo]> {
        self.got.as_ref().and_then(|g| g.as_deref())
    }
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
        restored_backup: None,
        copy: None,
    }
}

fn error_text(e: &VolumeError) -> String {
    crate::util::error_chain(e)
}

impl V1Ops {
    /// `listing`: tgtd's targets, listed once for this reconcile if a volume
    /// needs them (a volume made now does not: its target is made without).
    /// `tid`: for a delete, the target id the volume's export got from the
    /// running tgtd, if known (then nothing is listed). Returns the status,
    /// and the target id of a volume served.
    fn volume(
        &self,
        job: &VolumeJob,
        listing: &mut Listing<'_>,
        tid: Option<Tid>,
    ) -> (Realized<EngineStatus>, Option<Tid>) {
        let name = match ObjectName::parse("volume", &job.id) {
            Ok(n) => n,
            Err(e) => return (Realized::Status(failed(e.to_string(), String::new())), None),
        };
        let device = self.store.volume_path(&name).display().to_string();
        if job.deleting {
            let deleted = match (tid, listing.get_if_listed()) {
                (Some(tid), None) => self.store.delete_by_tid(&self.admin, &name, tid),
                (_, Some(t)) => self.store.delete_known(&self.admin, &name, t),
                (None, None) => match listing.get() {
                    Some(t) => self.store.delete_known(&self.admin, &name, t),
                    None => self.store.delete(&self.admin, &name),
                },
            };
            let out = match deleted {
                Ok(()) | Err(VolumeError::NotFound { .. }) => Realized::Deleted,
                Err(e) => Realized::Status(EngineStatus {
                    state: ObjectState::Deleting,
                    ..failed(error_text(&e), device)
                }),
            };
            return (out, None);
        }
        let mut message = String::new();
        let mut fresh = false;
        // a V1 volume is one file: more replicas are refused, not silently dropped (one made by
        // an earlier talon keeps serving, and says so)
        let replicas = job.spec.replicas as usize + job.spec.remote_replicas.len();
        let one_replica = format!(
            "volume {name}: the V1 engine keeps one replica (one file), not {replicas}: \
             set replicas to 1, or use engine v2 on a node with SPDK"
        );
        let info = match self.store.info(&name) {
            Ok(info) => {
                if replicas > 1 {
                    message = one_replica;
                }
                info
            }
            Err(VolumeError::NotFound { .. }) if replicas > 1 => {
                return (Realized::Status(failed(one_replica, device)), None);
            }
            Err(VolumeError::NotFound { .. }) => {
                fresh = true;
                let made = match &job.spec.from_snapshot {
                    Some(source) => match split_snapshot_id(source) {
                        Ok((v, s)) => self.store.clone_snapshot(&v, &s, &name),
                        Err(msg) => return (Realized::Status(failed(msg, device)), None),
                    },
                    None => self.store.create(&name, job.spec.size_bytes),
                };
                match made {
                    Ok(info) => info,
                    Err(e) => return (Realized::Status(failed(error_text(&e), device)), None),
                }
            }
            Err(e) => return (Realized::Status(failed(error_text(&e), device)), None),
        };
        let mut size = info.size;
        if job.spec.size_bytes > info.size {
            match self.store.expand(&self.admin, &name, job.spec.size_bytes) {
                Ok(grown) => size = grown.size,
                Err(e) => {
                    message = format!(
                        "expand to {} waits: {}",
                        crate::util::size::Bytes(job.spec.size_bytes),
                        error_text(&e)
                    )
                }
            }
        } else if job.spec.size_bytes < info.size {
            message = format!(
                "volumes do not shrink: serving {}",
                crate::util::size::Bytes(info.size)
            );
        }
        if job.spec.revert_to.is_some() {
            message = "revert is not supported by the V1 engine".to_string();
        }
        let listed = |listing: &mut Listing<'_>| match listing.get() {
            Some(t) => self.store.export_known(&self.admin, &name, &job.opts, t),
            None => self.store.export(&self.admin, &name, &job.opts),
        };
        let exported = if fresh {
            // a file made now has no target of talon's serving it: make one without listing
            // the others, unless tgtd has a stale one of that name (then adopt or replace it)
            match self.store.export_known(&self.admin, &name, &job.opts, &[]) {
                Err(VolumeError::Admin {
                    source: AdminError::TargetExists { .. },
                    ..
                }) => listed(listing),
                other => other,
            }
        } else {
            listed(listing)
        };
        let tid = exported.as_ref().ok().map(|e| e.tid);
        let out = match exported {
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
                restored_backup: None,
                copy: None,
            }),
            // tgtd stopping or restarting: the volume waits for it (a `wait` goes on, and
            // fails at once only if tgtd's TargetStatus turns failed)
            Err(e) if e.tgtd_unreachable() => Realized::Status(EngineStatus {
                state: ObjectState::Creating,
                size_bytes: size,
                ..failed(format!("waiting for tgtd: {}", error_text(&e)), device)
            }),
            Err(e) => Realized::Status(EngineStatus {
                size_bytes: size,
                ..failed(error_text(&e), device)
            }),
        };
        (out, tid)
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
        let tgtd = ctx.get::<TargetStatus>(TGTD_STATUS_ID)?;
        let tgtd_ready = tgtd
            .as_ref()
            .is_some_and(|t| t.spec.engine == Engine::V1 && t.spec.state == ObjectState::Ready);
        let tgtd_pid = tgtd.and_then(|t| t.spec.pid).unwrap_or(0);
        let chap = if node.iscsi_chap {
            let d = self.data_dir.clone();
            let c = tokio::task::spawn_blocking(move || crate::tgt::chap::load_or_create(&d)).await?;
            Some(c?)
        } else {
            None
        };
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
                opts: export_options(&node, attached_by, chap.as_ref()),
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
        let installed = self.chap_installed.clone();
        let (served, last_full) = (self.served.clone(), self.last_full.clone());
        let (vol_out, snap_out) = tokio::task::spawn_blocking(move || {
            let mut full = {
                let last = last_full.lock().unwrap_or_else(|p| p.into_inner());
                !matches!(*last, Some((pid, at)) if pid == tgtd_pid && at.elapsed() < FULL_PASS_EVERY)
            };
            if tgtd_ready && let Some(chap) = chap {
                // once per tgtd and per credentials: the account an earlier talon or an
                // earlier file made may hold another secret, and tgtd cannot show it
                let mut have = installed.lock().unwrap_or_else(|p| p.into_inner());
                let wanted = (tgtd_pid, chap);
                if have.as_ref() != Some(&wanted) {
                    match ensure_chap_account(&ops.admin, &wanted.1, true) {
                        Ok(()) => {
                            tracing::info!(user = %wanted.1.user, "iSCSI CHAP account set in tgtd");
                            *have = Some(wanted);
                            // a remade account is bound to no target: bind it on every one
                            full = true;
                        }
                        Err(e) => tracing::error!(error = %e, "cannot set the iSCSI CHAP account in tgtd"),
                    }
                }
            }
            let mut listing = Listing::new(&ops.admin);
            if tgtd_ready && full {
                // targets talon made for volumes nobody wants (a crash mid-export or
                // mid-delete): removed by name
                let orphans = match listing.get() {
                    Some(t) => {
                        Ok(ops
                            .store
                            .remove_orphans_known(&ops.admin, |v| known.contains(v.as_str()), t))
                    }
                    None => ops
                        .store
                        .remove_orphans(&ops.admin, |v| known.contains(v.as_str())),
                };
                match orphans {
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
            let mut served = served.lock().unwrap_or_else(|p| p.into_inner());
            // live volumes first (a snapshot needs its volume), then snapshots, then deletions
            for j in vol_jobs.iter().filter(|j| !j.deleting) {
                let key = ServedKey {
                    spec: j.spec.clone(),
                    opts: j.opts.clone(),
                    tgtd_pid,
                };
                if !full && let Some(s) = served.get(&j.id).filter(|s| s.key == key) {
                    vol_out.push((j.id.clone(), Realized::Status(s.status.clone())));
                    continue;
                }
                let (out, tid) = ops.volume(j, &mut listing, None);
                match (&out, tid) {
                    // only a volume served as asked is passed over next time
                    (Realized::Status(s), Some(tid))
                        if s.state == ObjectState::Ready && s.message.is_empty() =>
                    {
                        served.insert(
                            j.id.clone(),
                            Served {
                                key,
                                status: s.clone(),
                                tid,
                            },
                        );
                    }
                    _ => {
                        served.remove(&j.id);
                    }
                }
                vol_out.push((j.id.clone(), out));
            }
            for j in &snap_jobs {
                snap_out.push((j.id.clone(), ops.snapshot(j)));
            }
            for j in vol_jobs.iter().filter(|j| j.deleting) {
                // the target id is trusted only from the tgtd that gave it
                let tid = served
                    .remove(&j.id)
                    .filter(|s| s.key.tgtd_pid == tgtd_pid)
                    .map(|s| s.tid);
                vol_out.push((j.id.clone(), ops.volume(j, &mut listing, tid).0));
            }
            // volumes gone from the config are forgotten
            served.retain(|id, _| known.contains(id));
            if full && tgtd_ready {
                *last_full.lock().unwrap_or_else(|p| p.into_inner()) = Some((tgtd_pid, Instant::now()));
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
            export_options(&node, None, None).initiators,
            vec![],
            "nobody by default"
        );
        let me = Iqn::parse("iqn.2025-01.io.talon:host.1").expect("iqn");
        assert_eq!(
            export_options(&node, Some(&me), None).initiators,
            vec![InitiatorAcl::Name(me.clone())]
        );
        node.allowed_hosts = vec![
            "nqn.2014-08.org.nvmexpress:uuid:1".into(),
            "iqn.2025-01.io.example:h".into(),
            me.to_string(),
        ];
        assert_eq!(
            export_options(&node, Some(&me), None).initiators,
            vec![
                InitiatorAcl::Name(me),
                InitiatorAcl::Name(Iqn::parse("iqn.2025-01.io.example:h").expect("iqn"))
            ]
        );
    }
}
