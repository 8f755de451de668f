//! `engine.SpdkDiskController`: makes every `Disk` a base bdev with an
//! lvstore on it in spdk_tgt through [`DiskOps`], and reports `DiskStatus`.
//! It maps resources to operations and results to statuses; every SPDK call
//! is in [`crate::spdk::disk`].
//!
//! ```text
//!   Disk <d> (config) ──────────┐
//!   TargetStatus spdk ──────────┼─> reconcile ─┬─ running: DiskOps::ensure ─> DiskStatus <d> ready
//!   PciBindingStatus <d> (pci) ─┤              │    (a pci disk waits for PciBindingStatus Bound,
//!   DiskIdentity <d> (ledger) ──┘              │     then is attached at the address it was bound at)
//!        ^                                     │    the lvstore it created, or first found ─> DiskIdentity <d>
//!        └── persisted; ensure takes only ─────┤    (a Disk `format` above the last served: carried out once)
//!            its UUID, never makes another     ├─ deleted (finalizer): DiskOps::teardown ─> released
//!            while it does not load            │    (and its DiskIdentity dropped), or DiskStatus
//!                                              │    deleting "still holds lvols: ..."
//!                                              └─ DiskOps::remove_orphans (talon's names only)
//! ```
//!
//! Every reconcile applies the `DiskIdentity` of every Disk it lists (the
//! runtime drops outputs a clean reconcile did not apply), also while
//! spdk_tgt is down.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use crate::host::HostRoot;
use crate::resources::config::Disk;
use crate::resources::engine::{DiskIdentity, DiskStatus, Engine, ObjectState, SPDK_STATUS_ID, TargetStatus};
use crate::resources::host::{BindingState, PciBindingStatus};
use crate::runtime::{Controller, ControllerError, Input, Output, Phase, ReconcileContext, Requeue};
use crate::spdk::SpdkClient;
use crate::spdk::disk::{DiskNames, DiskOps, Ensured};
use crate::spdk::rpc::Lvstore;

/// Serves `Disk`s through spdk_tgt on `<run_dir>/spdk.sock`.
#[derive(Debug)]
pub struct SpdkDiskController {
    ops: DiskOps,
    /// Why this node cannot run the V2 engine, when it cannot: its disks are
    /// then `unused`, not waiting for a target that never comes.
    no_v2: Option<String>,
}

impl SpdkDiskController {
    /// Talks to the target on `<run_dir>/spdk.sock`; NVMe serials are
    /// resolved through `host`'s sysfs.
    pub fn new(run_dir: impl AsRef<Path>, host: HostRoot) -> Self {
        Self::with_client(SpdkClient::new(run_dir.as_ref().join("spdk.sock")), host)
    }

    /// Talks to the target through `client`.
    pub fn with_client(client: SpdkClient, host: HostRoot) -> Self {
        SpdkDiskController {
            ops: DiskOps::new(client, host),
            no_v2: None,
        }
    }

    /// This node cannot run the V2 engine (`reason`: the engine selection's):
    /// only V2 volumes use disks, so each disk is reported `unused`.
    pub fn without_v2(mut self, reason: Option<String>) -> Self {
        self.no_v2 = reason;
        self
    }
}

fn disk_status(n: &DiskNames, state: ObjectState, lvs: Option<&Lvstore>, message: String) -> DiskStatus {
    let bytes = lvs.and_then(|l| l.bytes().ok());
    DiskStatus {
        engine: Engine::V2,
        state,
        bdev: n.bdev.clone(),
        lvstore: n.lvstore.clone(),
        lvstore_uuid: lvs.map(|l| l.uuid.clone()).unwrap_or_default(),
        total_bytes: bytes.map_or(0, |b| b.total),
        free_bytes: bytes.map_or(0, |b| b.free),
        cluster_bytes: bytes.map_or(0, |b| b.cluster),
        message,
        target: None,
    }
}

/// The Disk as SPDK attaches it: a `pci` disk with the address its device
/// was bound at, once `PciBindingStatus` says Bound; before, the state to
/// report (Failed when the binding failed) and why.
type NotBound = (ObjectState, String);
fn bound_spec(
    ctx: &ReconcileContext,
    id: &str,
    spec: &Disk,
) -> Result<Result<Disk, NotBound>, ControllerError> {
    if spec.pci.is_none() {
        return Ok(Ok(spec.clone()));
    }
    let binding = ctx.get::<PciBindingStatus>(id)?.map(|b| b.spec);
    Ok(match binding {
        Some(b) if b.state == BindingState::Bound && b.bdf.is_some() => Ok(Disk {
            pci: b.bdf,
            ..spec.clone()
        }),
        Some(b) if b.state == BindingState::Failed => Err((
            ObjectState::Failed,
            format!("the NVMe device is not bound: {}", b.message),
        )),
        Some(b) => Err((
            ObjectState::Creating,
            format!("waiting for the NVMe device to be bound: {}", b.message),
        )),
        None => Err((
            ObjectState::Creating,
            "waiting for the NVMe device to be bound to a user-space driver".to_string(),
        )),
    })
}

/// The identity to record after an ensure: a new one when the lvstore was
/// created (or first seen), the format request served; `None` when the
/// recorded one stands as it is.
fn identity_after(
    known: Option<&DiskIdentity>,
    e: &Ensured,
    n: &DiskNames,
    format_served: u64,
) -> Option<DiskIdentity> {
    match known {
        Some(k) if !e.created && k.lvstore_uuid == e.lvstore.uuid => {
            (k.format_served != format_served).then(|| DiskIdentity {
                format_served,
                ..k.clone()
            })
        }
        _ => Some(DiskIdentity {
            lvstore: n.lvstore.clone(),
            lvstore_uuid: e.lvstore.uuid.clone(),
            device: e.device.clone(),
            created: e.created,
            since: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            format_served,
        }),
    }
}

#[async_trait::async_trait]
impl Controller for SpdkDiskController {
    fn name(&self) -> &'static str {
        "engine.SpdkDiskController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::of::<Disk>(),
            Input::of::<TargetStatus>(),
            Input::of::<PciBindingStatus>(),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<DiskStatus>(),
            Output::exclusive::<DiskIdentity>(),
        ]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let disks = ctx.list::<Disk>()?;
        // what talon made on each disk, kept for as long as its Disk is listed
        let mut identities: BTreeMap<String, DiskIdentity> = ctx
            .list::<DiskIdentity>()?
            .into_iter()
            .filter(|i| disks.iter().any(|d| d.id() == i.id()))
            .map(|i| (i.id().to_owned(), i.spec))
            .collect();
        for (id, i) in &identities {
            ctx.apply(id, i.clone())?;
        }
        let target = ctx.get::<TargetStatus>(SPDK_STATUS_ID)?.map(|t| t.spec);
        let ready = target.as_ref().is_some_and(|t| t.state == ObjectState::Ready);
        let on_target = target.as_ref().map(TargetStatus::instance);
        if !ready {
            let why = target.map_or_else(|| "not started yet".to_owned(), |t| t.message);
            for d in &disks {
                let n = DiskNames::of(d.id(), &d.spec).unwrap_or_else(|_| DiskNames::fallback(d.id()));
                let (state, msg) = match &self.no_v2 {
                    _ if d.metadata.phase == Phase::TearingDown => {
                        (ObjectState::Deleting, format!("waiting for spdk_tgt: {why}"))
                    }
                    Some(reason) => (
                        ObjectState::Unused,
                        format!(
                            "not used: only V2 volumes use disks, and this node cannot run V2 ({reason}); \
                             its V1 volumes are files in the data dir"
                        ),
                    ),
                    None => (ObjectState::Creating, format!("waiting for spdk_tgt: {why}")),
                };
                ctx.apply(d.id(), disk_status(&n, state, None, msg))?;
            }
            return Ok(Requeue::OnInputChange);
        }

        // held from the first time SPDK objects may be made for it (a node
        // without V2 never holds a Disk: deleting it there is immediate)
        for d in &disks {
            if d.metadata.phase == Phase::Running {
                ctx.add_finalizer::<Disk>(d.id())?;
            }
        }
        let mut retry = false;
        let mut wanted = BTreeSet::new();
        for d in &disks {
            wanted.insert(d.id().to_owned());
            let n = match DiskNames::of(d.id(), &d.spec) {
                Ok(n) => n,
                Err(e) => {
                    let msg = crate::util::error_chain(&e);
                    ctx.apply(
                        d.id(),
                        disk_status(&DiskNames::fallback(d.id()), ObjectState::Failed, None, msg),
                    )?;
                    if d.metadata.phase == Phase::TearingDown {
                        ctx.remove_finalizer::<Disk>(d.id())?;
                    }
                    continue;
                }
            };
            if d.metadata.phase == Phase::TearingDown {
                let spec = bound_spec(ctx, d.id(), &d.spec)?.unwrap_or_else(|_| d.spec.clone());
                match self.ops.teardown(&n, &spec).await {
                    Ok(None) => {
                        tracing::info!(disk = %n.disk, "disk removed");
                        // its lvstore is gone: nothing of talon's is left to protect
                        identities.remove(d.id());
                        ctx.destroy::<DiskIdentity>(d.id())?;
                        // the Disk goes last: who waits for it finds nothing else left
                        ctx.destroy::<DiskStatus>(d.id())?;
                        ctx.remove_finalizer::<Disk>(d.id())?;
                    }
                    Ok(Some(msg)) => {
                        retry = true;
                        ctx.apply(d.id(), disk_status(&n, ObjectState::Deleting, None, msg))?;
                    }
                    Err(e) => {
                        retry = true;
                        let msg = crate::util::error_chain(&e);
                        ctx.apply(d.id(), disk_status(&n, ObjectState::Deleting, None, msg))?;
                    }
                }
                continue;
            }
            // an NVMe disk is attached once the host controller bound it, at its address
            let spec = match bound_spec(ctx, d.id(), &d.spec)? {
                Ok(spec) => spec,
                Err((state, why)) => {
                    retry = true;
                    ctx.apply(d.id(), disk_status(&n, state, None, why))?;
                    continue;
                }
            };
            let known = identities.get(d.id());
            let served = known.map_or(0, |i| i.format_served);
            let format = d.spec.format > served;
            let recorded = known.map(|i| i.lvstore_uuid.clone());
            let before = ctx.get::<DiskStatus>(d.id())?.map(|s| s.spec.state);
            if before.is_none() {
                // the first ensure since talon started: after an unclean stop the
                // lvstore's load replays all its metadata (seconds to minutes)
                let msg = format!("loading lvstore {} from {}", n.lvstore, n.bdev);
                ctx.apply(d.id(), disk_status(&n, ObjectState::Creating, None, msg))?;
            } else if before == Some(ObjectState::Ready) && !self.ops.base_present(&n).await.unwrap_or(true) {
                // Ready, but its base bdev is gone: spdk_tgt restarted (and the
                // target status may not say so yet: a keeper restarts it before the
                // supervisor looks), or the device went away. While ensure brings
                // it back, SPDK's examine lists the lvstore before its lvols are
                // open: not ready meanwhile
                let msg = format!(
                    "loading lvstore {} from {} again (the bdev was gone: spdk_tgt restarted, or the device went away)",
                    n.lvstore, n.bdev
                );
                tracing::info!(disk = %n.disk, "base bdev gone: loading the lvstore again");
                ctx.apply(d.id(), disk_status(&n, ObjectState::Creating, None, msg))?;
            }
            match self.ops.ensure(&n, &spec, recorded.as_deref(), format).await {
                Ok(e) => {
                    if let Some(i) = identity_after(known, &e, &n, d.spec.format.max(served)) {
                        if e.created {
                            tracing::info!(disk = %n.disk, uuid = %i.lvstore_uuid, device = %i.device, "disk identity recorded");
                        }
                        ctx.apply(d.id(), i.clone())?;
                        identities.insert(d.id().to_owned(), i);
                    }
                    let l = e.lvstore;
                    match l.bytes() {
                        Ok(_) => {
                            let msg = format!("lvstore {} on {}", n.lvstore, n.bdev);
                            // ready on this target: ensure waited for its examine
                            let st = DiskStatus {
                                target: on_target,
                                ..disk_status(&n, ObjectState::Ready, Some(&l), msg)
                            };
                            ctx.apply(d.id(), st)?;
                        }
                        Err(why) => {
                            // never placed on (Inventory::disks leaves it out)
                            retry = true;
                            let msg = format!("{why}: the disk is not used until its figures make sense");
                            tracing::warn!(disk = %n.disk, error = %msg, "disk not ready");
                            ctx.apply(d.id(), disk_status(&n, ObjectState::Failed, None, msg))?;
                        }
                    }
                }
                Err(e) => {
                    retry = true;
                    let msg = crate::util::error_chain(&e);
                    tracing::warn!(disk = %n.disk, error = %msg, "disk not ready");
                    ctx.apply(d.id(), disk_status(&n, ObjectState::Failed, None, msg))?;
                }
            }
        }
        if let Err(e) = self.ops.remove_orphans(&wanted).await {
            retry = true;
            tracing::warn!(error = %crate::util::error_chain(&e), "orphan disk objects not removed");
        }
        // poll: a target restart the supervisor did not see (a quick one) is healed here too
        Ok(Requeue::After(if retry {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(5)
        }))
    }
}
