//! Registration of the V1 engine's controllers.
//!
//! ```text
//!   register(rt, deps) ──> engine.TgtdController      (tgtd under <run_dir>/tgtd)
//!                     └──> engine.V1VolumeController  (files under <data_dir>/v1)
//! ```

use super::v1_target::TgtdController;
use super::v1_volume::{V1Selection, V1VolumeController};
use crate::controllers::Deps;
use crate::runtime::{Runtime, RuntimeError};

/// How `auto` volumes are treated until engine selection from
/// `HostCapabilities` exists: V1 takes them when this host has no `spdk_tgt`
/// on PATH and talon was built without the embedded SPDK.
pub fn default_selection() -> V1Selection {
    let spdk_on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("spdk_tgt").is_file()));
    if spdk_on_path || cfg!(feature = "spdk-embedded") {
        V1Selection::Explicit
    } else {
        V1Selection::AlsoAuto
    }
}

/// Registers the V1 engine's controllers.
pub fn register(rt: &mut Runtime, deps: &Deps) -> Result<(), RuntimeError> {
    let selection = default_selection();
    let target = TgtdController::new(&deps.run_dir, selection);
    let admin = target.config().admin();
    rt.register(target)?;
    rt.register(V1VolumeController::new(&deps.data_dir, admin, selection))
}
