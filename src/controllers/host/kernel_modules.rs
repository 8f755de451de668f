//! `host.KernelModuleController`: loads the kernel modules talon's data paths
//! need where the host allows it, and reports every module talon uses as
//! `KernelModuleStatus` (state, wanted, why).
//!
//! ```text
//!   wanted: nvme_tcp (attach over NVMe/TCP, always)
//!           vfio_pci | uio_pci_generic (a Disk with `pci`; vfio_pci with an active IOMMU)
//!           iscsi_tcp (a Volume with frontend iscsi, or nvme_tcp cannot be had)
//!   Disk, Volume ─┐
//!   /proc/modules, modules.builtin, modules.dep ─> module_state ─┬─ present: nothing to do
//!                                                                ├─ Talos: the machine-config patch
//!                                                                ├─ not the real /: say so
//!                                                                └─ modprobe, verify ─> KernelModuleStatus
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::host::modules::{self, ModuleState};
use crate::host::talos::{self, TalosNeeds};
use crate::host::{HostRoot, os, pci};
use crate::resources::config::{Disk, FrontendKind, Volume};
use crate::resources::host::KernelModuleStatus;
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};
use crate::util::error_chain;

use super::hugepages::talos_version;

/// Loads and observes the kernel modules in [`modules::TALON_MODULES`].
#[derive(Debug, Clone)]
pub struct KernelModuleController {
    pub host: HostRoot,
    pub interval: Duration,
    /// The load failure last warned about, per module: the same one again is
    /// logged at debug (a host without modprobe fails every poll).
    pub warned: Arc<Mutex<BTreeMap<&'static str, String>>>,
}

impl KernelModuleController {
    /// Polls `host` every `interval`.
    pub fn new(host: HostRoot, interval: Duration) -> Self {
        Self {
            host,
            interval,
            warned: Arc::default(),
        }
    }

    /// Whether `msg` is news for `module` (then it is warned about once).
    fn first_time(&self, module: &'static str, msg: &str) -> bool {
        let mut w = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if w.get(module).is_some_and(|m| m == msg) {
            return false;
        }
        w.insert(module, msg.to_string());
        true
    }
}

/// Which of talon's modules are wanted, and why.
pub fn wanted(host: &HostRoot, disks: &[Disk], volumes: &[Volume]) -> Vec<(&'static str, String)> {
    let mut out = vec![("nvme_tcp", "volumes attach over NVMe/TCP".to_string())];
    if disks.iter().any(|d| d.pci.is_some()) {
        let m = if pci::iommu_active(host) {
            "vfio_pci"
        } else {
            "uio_pci_generic"
        };
        out.push((
            m,
            "a Disk names an NVMe device (user-space driver for SPDK)".to_string(),
        ));
    }
    let nvme_tcp_absent = modules::module_state(host, "nvme_tcp").is_ok_and(|s| s == ModuleState::Missing);
    if volumes.iter().any(|v| v.frontend == FrontendKind::Iscsi) {
        out.push(("iscsi_tcp", "a Volume attaches over iSCSI".to_string()));
    } else if nvme_tcp_absent {
        out.push((
            "iscsi_tcp",
            "nvme_tcp is not installed: volumes attach over iSCSI".to_string(),
        ));
    }
    out
}

#[async_trait::async_trait]
impl Controller for KernelModuleController {
    fn name(&self) -> &'static str {
        "host.KernelModuleController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::of::<Disk>(), Input::of::<Volume>()]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<KernelModuleStatus>()]
    }
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let disks: Vec<Disk> = ctx.list::<Disk>()?.into_iter().map(|d| d.spec).collect();
        let volumes: Vec<Volume> = ctx.list::<Volume>()?.into_iter().map(|v| v.spec).collect();
        let want = wanted(&self.host, &disks, &volumes);
        let os = os::detect(&self.host).ok();
        let talos = os
            .as_ref()
            .filter(|o| o.is_talos())
            .map(|o| talos_version(o.version_id.as_deref()));
        for &m in modules::TALON_MODULES {
            let state = modules::module_state(&self.host, m)?;
            let why = want.iter().find(|(w, _)| *w == m).map(|(_, why)| why.clone());
            let (state, message) = match (&why, state.is_present(), talos) {
                (None, _, _) => (state, String::new()),
                (Some(why), true, _) => (state, format!("wanted: {why}")),
                (Some(why), false, Some(v)) => {
                    let needs = TalosNeeds {
                        modules: vec![m.to_string()],
                        ..TalosNeeds::default()
                    };
                    let patch =
                        talos::to_yaml(&super::hugepages::hugepages_only(talos::documents(v, &needs)))
                            .unwrap_or_default();
                    (
                        state,
                        format!(
                            "wanted: {why}; Talos loads modules from the machine config, talon does not: apply\n{patch}"
                        ),
                    )
                }
                (Some(why), false, None) => match modules::ensure_loaded(&self.host, m) {
                    Ok(now) => {
                        tracing::info!(module = m, state = ?now, "kernel module loaded");
                        self.warned.lock().unwrap_or_else(|p| p.into_inner()).remove(m);
                        (now, format!("wanted: {why}; loaded by talon"))
                    }
                    Err(e) => {
                        let msg = error_chain(&e);
                        if self.first_time(m, &msg) {
                            tracing::warn!(module = m, error = %msg, "kernel module not loaded");
                        } else {
                            tracing::debug!(module = m, error = %msg, "kernel module not loaded");
                        }
                        (
                            modules::module_state(&self.host, m).unwrap_or(state),
                            format!("wanted: {why}; {msg}"),
                        )
                    }
                },
            };
            ctx.apply(
                m,
                KernelModuleStatus {
                    state,
                    present: state.is_present(),
                    wanted: why.is_some(),
                    message,
                },
            )?;
        }
        Ok(Requeue::After(self.interval))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_failure_is_warned_about_once() {
        let c = KernelModuleController::new(HostRoot::new("/nonexistent"), Duration::from_secs(30));
        let msg = "cannot load kernel module nvme_tcp: modprobe is not installed (not found on PATH)";
        assert!(c.first_time("nvme_tcp", msg));
        assert!(
            !c.first_time("nvme_tcp", msg),
            "the same failure again is not news"
        );
        assert!(c.first_time("iscsi_tcp", msg), "per module");
        assert!(
            c.first_time("nvme_tcp", "modprobe nvme_tcp failed: x"),
            "a new failure is"
        );
    }
}
