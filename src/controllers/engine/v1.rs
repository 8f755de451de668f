//! Registration of the V1 engine's controllers.
//!
//! ```text
//!   register(rt, deps, selection) ──> engine.TgtdController      (tgtd under <run_dir>/tgtd)
//!                                └──> engine.V1VolumeController  (files under <data_dir>/v1)
//! ```

use super::selection::EngineSelection;
use super::v1_target::TgtdController;
use super::v1_volume::V1VolumeController;
use crate::controllers::Deps;
use crate::runtime::{Runtime, RuntimeError};

/// Registers the V1 engine's controllers. They claim the volumes
/// [`EngineSelection::engine_for`] gives to V1: explicit V1 volumes (or
/// volumes on a V1 node) always, `auto` volumes on an `auto` node when
/// [`EngineSelection::auto_engine`] is V1 (no usable SPDK, or `--engine v1`).
pub fn register(rt: &mut Runtime, deps: &Deps, selection: &EngineSelection) -> Result<(), RuntimeError> {
    let auto = selection.auto_engine();
    let target = TgtdController::new(&deps.run_dir, auto)
        .on_exit(deps.targets_on_exit.clone())
        .with_keeper(
            deps.spdk
                .target_keeper
                .then(|| crate::keeper::KeeperFiles::new(&deps.run_dir)),
        );
    let admin = target.config().admin();
    rt.register(target)?;
    let initiators = match crate::attach::HostInitiators::load_or_create(&deps.host, &deps.data_dir) {
        Ok(i) => Some(i),
        Err(e) => {
            tracing::error!(error = %crate::util::error_chain(&e),
                "no host initiator name: V1 volumes attached here are exported to the allowed hosts only");
            None
        }
    };
    rt.register(V1VolumeController::new(&deps.data_dir, admin, auto).with_initiators(initiators))
}
