//! `host.PciBindController`: binds the NVMe device of every `Disk` with
//! `pci` to a user-space driver before SPDK attaches it, and gives it back to
//! its original driver when the Disk goes. Every rebind is recorded first.
//!
//! ```text
//!   Disk <d> {pci: BDF | serial | model}
//!     running:  intent for <d>? ─yes─> device on target? Bound : finish (set_driver target,
//!                 │                                         rollback to the original driver)
//!                 no ─> select ─> already user-space? adopt (not given back) ─> Bound
//!                       in use (mounts, holders, swap, partitions, signatures)? Failed, untouched
//!                       choose vfio-pci (viable IOMMU group) | uio_pci_generic | Failed (why)
//!                       PciBindIntent <bdf> {disk, original, target, Binding}  ── persisted ──┐
//!                       pci::bind (driver_override, unbind, drivers_probe, verify; rollback)  <┘
//!                         ok: intent Bound      failed and rolled back: intent removed, Failed
//!     deleted:  SPDK still holds it (finalizer engine.SpdkDiskController)? wait (Releasing)
//!               intent Releasing ── persisted ──> set_driver original (refused while a process
//!               holds /dev/vfio/<g> or /dev/uioN open) ─> intent removed, finalizer released
//!   intents whose Disk is gone: given back the same way.
//!   ──> PciBindingStatus <d> {bdf, driver, originalDriver, targetDriver, state, message}
//! ```
//!
//! After a crash at any step the intent says what was under way: a bind is
//! finished when its Disk still wants the device, a give back is finished
//! either way; a device is never left between drivers.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::host::pci::{self, Bdf, BindOptions, PciError};
use crate::host::{HostRoot, os};
use crate::resources::config::Disk;
use crate::resources::engine::DiskIdentity;
use crate::resources::host::{BindPhase, BindingState, PciBindIntent, PciBindingStatus};
use crate::runtime::{Controller, ControllerError, Input, Output, Phase, ReconcileContext, Requeue, Typed};
use crate::util::error_chain;

/// The controller's name, also its finalizer on Disks.
pub const NAME: &str = "host.PciBindController";
/// The finalizer SPDK's disk controller holds while the device is attached.
pub const SPDK_DISK_FINALIZER: &str = "engine.SpdkDiskController";

/// Binds the NVMe devices of Disks (see the module docs).
#[derive(Debug, Clone)]
pub struct PciBindController {
    pub host: HostRoot,
    /// Look again this often (a device in use may become free; a failed bind is retried).
    pub interval: Duration,
}

fn status(selector: &str, state: BindingState, message: impl Into<String>) -> PciBindingStatus {
    PciBindingStatus {
        selector: selector.to_string(),
        bdf: None,
        driver: None,
        original_driver: None,
        target_driver: None,
        state,
        message: message.into(),
    }
}

fn with_intent(
    mut s: PciBindingStatus,
    bdf: &str,
    intent: &PciBindIntent,
    driver: Option<String>,
) -> PciBindingStatus {
    s.bdf = Some(bdf.to_string());
    s.driver = driver;
    s.original_driver = intent.original_driver.clone();
    s.target_driver = Some(intent.target_driver.clone());
    s
}

fn current_driver(host: &HostRoot, bdf: &Bdf) -> Result<Option<String>, PciError> {
    Ok(pci::read_device(host, bdf)?.driver)
}

impl PciBindController {
    /// Records (persists) an intent; the store commits before this returns.
    fn record(ctx: &mut ReconcileContext, bdf: &str, intent: &PciBindIntent) -> Result<(), ControllerError> {
        ctx.apply(bdf, intent.clone())?;
        Ok(())
    }

    /// A Disk that wants its device bound.
    fn bind_disk(
        &self,
        ctx: &mut ReconcileContext,
        disk: &Typed<Disk>,
        selector: &str,
        intents: &mut BTreeMap<String, PciBindIntent>,
        load_module: bool,
    ) -> Result<PciBindingStatus, ControllerError> {
        let id = disk.id();
        if let Some((bdf, intent)) = intents
            .iter()
            .find(|(_, i)| i.disk == id)
            .map(|(b, i)| (b.clone(), i.clone()))
        {
            return self.finish_bind(ctx, &bdf, intent, intents);
        }
        let dev = match pci::select(&self.host, selector) {
            Ok(d) => d,
            Err(e) => {
                // a device already on a user-space driver shows no serial or model
                let hidden: Vec<String> = match &e {
                    PciError::NoMatch(_) => pci::list_nvme(&self.host)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|d| matches!(d.driver.as_deref(), Some("vfio-pci" | "uio_pci_generic")))
                        .map(|d| d.bdf.to_string())
                        .collect(),
                    _ => Vec::new(),
                };
                let hint = if hidden.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (NVMe devices on a user-space driver show no serial or model: name one by PCI address: {})",
                        hidden.join(", ")
                    )
                };
                return Ok(status(
                    selector,
                    BindingState::Failed,
                    format!("Disk {id}: {}{hint}", error_chain(&e)),
                ));
            }
        };
        let bdf = dev.bdf.to_string();
        if let Some(other) = intents.get(&bdf) {
            return Ok(PciBindingStatus {
                bdf: Some(bdf.clone()),
                driver: dev.driver.clone(),
                ..status(
                    selector,
                    BindingState::Failed,
                    format!("Disk {id}: {bdf} is already bound for Disk {}", other.disk),
                )
            });
        }
        let mut st = PciBindingStatus {
            bdf: Some(bdf.clone()),
            driver: dev.driver.clone(),
            ..status(selector, BindingState::Failed, String::new())
        };
        if matches!(dev.driver.as_deref(), Some("vfio-pci" | "uio_pci_generic")) {
            // bound by someone else (a Talos PCIDriverRebindConfig, `talon host pci bind`):
            // used as it is, and left as it is when the Disk goes
            st.state = BindingState::Bound;
            st.target_driver = dev.driver.clone();
            st.message = format!(
                "{bdf} was already on {} (not bound by talon: left there when the Disk goes)",
                dev.driver.as_deref().unwrap_or("?")
            );
            return Ok(st);
        }
        // data on a free device is taken only on a format request not yet served
        // (`talon disk format`); a device the kernel uses, never
        let served = ctx.get::<DiskIdentity>(id)?.map_or(0, |i| i.spec.format_served);
        let format = disk.spec.format > served;
        let busy = match pci::in_use_by_kernel(&self.host, &dev) {
            Ok(None) if !format => pci::carries(&self.host, &dev).map(|c| {
                c.map(|c| {
                    format!(
                        "{c}; talon makes no lvstore over it. If its data is not needed: `talon disk format {id} --yes-destroy-data`"
                    )
                })
            }),
            r => r,
        };
        match busy {
            Ok(Some(reason)) => {
                st.message = format!("Disk {id}: refusing to take {bdf} from the kernel: {reason}");
                return Ok(st);
            }
            Err(e) => {
                st.message = format!("Disk {id}: {}", error_chain(&e));
                return Ok(st);
            }
            Ok(None) => {}
        }
        let driver = match pci::choose_driver(&self.host, &dev) {
            Ok(d) => d,
            Err(e) => {
                st.message = format!("Disk {id}: {}", error_chain(&e));
                return Ok(st);
            }
        };
        let intent = PciBindIntent {
            disk: id.to_string(),
            selector: selector.to_string(),
            original_driver: dev.driver.clone(),
            target_driver: driver.sysfs_name().to_string(),
            phase: BindPhase::Binding,
        };
        // persisted before the first sysfs write
        Self::record(ctx, &bdf, &intent)?;
        crate::util::failpoint("pci-after-intent");
        intents.insert(bdf.clone(), intent.clone());
        tracing::info!(disk = %id, %bdf, from = ?dev.driver, to = %driver, "binding the disk's NVMe device");
        let opts = BindOptions {
            driver: Some(driver),
            load_module,
            data_ok: format,
        };
        match pci::bind(&self.host, &bdf, opts) {
            Ok(out) => {
                let intent = PciBindIntent {
                    phase: BindPhase::Bound,
                    ..intent
                };
                Self::record(ctx, &bdf, &intent)?;
                intents.insert(bdf.clone(), intent.clone());
                let st = status(
                    selector,
                    BindingState::Bound,
                    format!(
                        "{bdf} moved from {} to {}",
                        out.from.as_deref().unwrap_or("no driver"),
                        out.to
                    ),
                );
                Ok(with_intent(st, &bdf, &intent, Some(out.to)))
            }
            Err(e @ PciError::RebindRollback { .. }) => {
                // not known to be back: the intent stays, the next pass finishes it
                let msg = format!("Disk {id}: {}", error_chain(&e));
                tracing::warn!(disk = %id, %bdf, error = %msg, "bind failed and was not rolled back");
                let st = status(selector, BindingState::Failed, msg);
                Ok(with_intent(
                    st,
                    &bdf,
                    &intent,
                    current_driver(&self.host, &dev.bdf).ok().flatten(),
                ))
            }
            Err(e) => {
                // refused before any change, or rolled back to the original driver
                ctx.destroy::<PciBindIntent>(&bdf)?;
                intents.remove(&bdf);
                let msg = format!("Disk {id}: {}", error_chain(&e));
                tracing::warn!(disk = %id, %bdf, error = %msg, "bind failed");
                st.message = msg;
                st.driver = current_driver(&self.host, &dev.bdf).ok().flatten();
                Ok(st)
            }
        }
    }

    /// A recorded bind: finished (the device goes to the target driver; on
    /// failure back to the original one).
    fn finish_bind(
        &self,
        ctx: &mut ReconcileContext,
        bdf: &str,
        mut intent: PciBindIntent,
        intents: &mut BTreeMap<String, PciBindIntent>,
    ) -> Result<PciBindingStatus, ControllerError> {
        let b = Bdf::parse(bdf)?;
        let sel = intent.selector.clone();
        if intent.phase == BindPhase::Releasing {
            // the Disk was made again while its device went back: bind it again
            intent.phase = BindPhase::Binding;
            Self::record(ctx, bdf, &intent)?;
        }
        let now = current_driver(&self.host, &b)?;
        let done = now.as_deref() == Some(intent.target_driver.as_str())
            && pci::driver_override(&self.host, &b)?.is_none();
        if !done {
            tracing::info!(disk = %intent.disk, %bdf, now = ?now, to = %intent.target_driver, "finishing a recorded bind");
            if let Err(e) = pci::set_driver(
                &self.host,
                &b,
                Some(&intent.target_driver),
                intent.original_driver.as_deref(),
            ) {
                let msg = format!(
                    "Disk {}: finishing the bind of {bdf}: {}",
                    intent.disk,
                    error_chain(&e)
                );
                let now = current_driver(&self.host, &b).ok().flatten();
                if now == intent.original_driver && !matches!(e, PciError::RebindRollback { .. }) {
                    ctx.destroy::<PciBindIntent>(bdf)?;
                    intents.remove(bdf);
                }
                let st = status(&sel, BindingState::Failed, msg);
                return Ok(with_intent(st, bdf, &intent, now));
            }
        }
        if intent.phase != BindPhase::Bound {
            intent.phase = BindPhase::Bound;
            Self::record(ctx, bdf, &intent)?;
        }
        intents.insert(bdf.to_string(), intent.clone());
        let st = status(
            &sel,
            BindingState::Bound,
            format!("{bdf} on {}", intent.target_driver),
        );
        Ok(with_intent(st, bdf, &intent, Some(intent.target_driver.clone())))
    }

    /// Gives a recorded device back to its original driver; `Ok(true)` once it is there.
    fn give_back(
        &self,
        ctx: &mut ReconcileContext,
        bdf: &str,
        mut intent: PciBindIntent,
        intents: &mut BTreeMap<String, PciBindIntent>,
    ) -> Result<(bool, PciBindingStatus), ControllerError> {
        let b = Bdf::parse(bdf)?;
        let sel = intent.selector.clone();
        if intent.phase != BindPhase::Releasing {
            intent.phase = BindPhase::Releasing;
            Self::record(ctx, bdf, &intent)?;
            intents.insert(bdf.to_string(), intent.clone());
            crate::util::failpoint("pci-after-intent");
        }
        let before = current_driver(&self.host, &b)?;
        match pci::set_driver(
            &self.host,
            &b,
            intent.original_driver.as_deref(),
            before.as_deref(),
        ) {
            Ok(out) => {
                tracing::info!(disk = %intent.disk, %bdf, to = %out.to, changed = out.changed, "device given back");
                ctx.destroy::<PciBindIntent>(bdf)?;
                intents.remove(bdf);
                let st = status(
                    &sel,
                    BindingState::Releasing,
                    format!("{bdf} given back to {}", out.to),
                );
                Ok((
                    true,
                    with_intent(st, bdf, &intent, intent.original_driver.clone()),
                ))
            }
            Err(e) => {
                let msg = format!("Disk {}: giving {bdf} back: {}", intent.disk, error_chain(&e));
                tracing::warn!(error = %msg, "device not given back yet");
                let st = status(&sel, BindingState::Releasing, msg);
                Ok((
                    false,
                    with_intent(st, bdf, &intent, current_driver(&self.host, &b).ok().flatten()),
                ))
            }
        }
    }
}

#[async_trait::async_trait]
impl Controller for PciBindController {
    fn name(&self) -> &'static str {
        NAME
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::of::<Disk>(), Input::of::<DiskIdentity>()]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<PciBindingStatus>(),
            Output::exclusive::<PciBindIntent>(),
        ]
    }
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let disks: Vec<Typed<Disk>> = ctx
            .list::<Disk>()?
            .into_iter()
            .filter(|d| d.spec.pci.is_some())
            .collect();
        let mut intents: BTreeMap<String, PciBindIntent> = ctx
            .list::<PciBindIntent>()?
            .into_iter()
            .map(|i| (i.id().to_string(), i.spec))
            .collect();
        let talos = os::detect(&self.host).is_ok_and(|o| o.is_talos());
        let load_module = !talos && self.host.is_real();
        let mut retry = false;

        for d in &disks {
            let id = d.id();
            let selector = d.spec.pci.clone().unwrap_or_default();
            if d.metadata.phase == Phase::Running {
                ctx.add_finalizer::<Disk>(id)?;
                let st = self.bind_disk(ctx, d, &selector, &mut intents, load_module)?;
                retry |= st.state != BindingState::Bound;
                ctx.apply(id, st)?;
                continue;
            }
            // tearing down: SPDK lets go first
            if d.metadata.finalizers.contains(SPDK_DISK_FINALIZER) {
                retry = true;
                let mut st = ctx
                    .get::<PciBindingStatus>(id)?
                    .map(|s| s.spec)
                    .unwrap_or_else(|| status(&selector, BindingState::Releasing, ""));
                st.state = BindingState::Releasing;
                st.message = "waiting for SPDK to detach the device".to_string();
                ctx.apply(id, st)?;
                continue;
            }
            let found = intents
                .iter()
                .find(|(_, i)| i.disk == id)
                .map(|(b, i)| (b.clone(), i.clone()));
            match found {
                None => {
                    ctx.remove_finalizer::<Disk>(id)?;
                    ctx.destroy::<PciBindingStatus>(id)?;
                }
                Some((bdf, intent)) => {
                    let (done, st) = self.give_back(ctx, &bdf, intent, &mut intents)?;
                    if done {
                        ctx.remove_finalizer::<Disk>(id)?;
                        ctx.destroy::<PciBindingStatus>(id)?;
                    } else {
                        retry = true;
                        ctx.apply(id, st)?;
                    }
                }
            }
        }
        // intents no Disk holds any more (its Disk is gone): give the device back
        let held: Vec<&str> = disks.iter().map(|d| d.id()).collect();
        let orphans: Vec<(String, PciBindIntent)> = intents
            .iter()
            .filter(|(_, i)| !held.contains(&i.disk.as_str()))
            .map(|(b, i)| (b.clone(), i.clone()))
            .collect();
        for (bdf, intent) in orphans {
            let (done, st) = self.give_back(ctx, &bdf, intent, &mut intents)?;
            if !done {
                retry = true;
                tracing::warn!(%bdf, message = %st.message, "orphan binding not given back yet");
            }
        }
        // every intent still recorded is an output of this pass
        for (bdf, intent) in intents {
            ctx.apply(&bdf, intent)?;
        }
        Ok(Requeue::After(if retry {
            self.interval.min(Duration::from_secs(5))
        } else {
            self.interval
        }))
    }
}
