//! Registration of the V1 engine's controllers.
//!
//! ```text
//!   register(rt, deps, selection) ──> engine.TgtdController      (tgtd under <run_dir>/tgtd)
//!                                └──> engine.V1VolumeController  (files under <data_dir>/v1)
//! ```

use super::selection::EngineSelection;
use super::v1_target::TgtdController;
use super::v1_volume::{V1Selection, V1VolumeController};
use crate::controllers::Deps;
use crate::resources::engine::Engine;
use crate::runtime::{Runtime, RuntimeError};

/// What V1 claims under `selection`: explicit V1 volumes (or volumes on a V1
/// node) always; `auto` volumes on an `auto` node when
/// [`EngineSelection::engine_for`] gives them to V1 (no usable SPDK, or
/// `--engine v1`). Exact: `serves_v1` differs from `engine_for == V1` only in
/// that auto/auto case.
pub fn v1_selection(selection: &EngineSelection) -> V1Selection {
    if selection.auto_engine() == Engine::V1 {
        V1Selection::AlsoAuto
    } else {
        V1Selection::Explicit
    }
}

/// Registers the V1 engine's controllers.
pub fn register(rt: &mut Runtime, deps: &Deps, selection: &EngineSelection) -> Result<(), RuntimeError> {
    let selection = v1_selection(selection);
    let target = TgtdController::new(&deps.run_dir, selection).on_exit(deps.targets_on_exit.clone());
    let admin = target.config().admin();
    rt.register(target)?;
    let initiators = match crate::attach::HostInitiators::load_or_create(&deps.host, &deps.data_dir) {
        Ok(i) => Some(i),
        Err(e) => {
            tracing::error!(error = %crate::runtime::runner::error_chain(&e),
                "no host initiator name: V1 volumes attached here are exported to the allowed hosts only");
            None
        }
    };
    rt.register(V1VolumeController::new(&deps.data_dir, admin, selection).with_initiators(initiators))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::config::EngineKind;

    #[test]
    fn v1_takes_auto_only_without_v2_or_when_pinned() {
        assert_eq!(
            v1_selection(&EngineSelection::fixed(false, "")),
            V1Selection::AlsoAuto
        );
        assert_eq!(
            v1_selection(&EngineSelection::fixed(true, "")),
            V1Selection::Explicit
        );
        let pinned = EngineSelection {
            default_engine: EngineKind::V1,
            ..EngineSelection::fixed(true, "")
        };
        assert_eq!(v1_selection(&pinned), V1Selection::AlsoAuto);
    }
}
