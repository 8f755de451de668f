//! `InstanceSwitchOverTarget` of an engine-frontend, phase by phase: the
//! steps [`lifecycle::switch_over`] plans, carried out in order. An ANA
//! state is desired state of the engine's node: written there through its
//! `EngineSetTargetListenerANAState` (this node's own handler for an engine
//! of this node), which returns once that node's controller has set it.
//!
//! ```text
//!   InstanceSwitchOverTarget(ef, new ip:port, new engine, phase)   one at a time per frontend
//!     plan (lifecycle::switch_over) ── steps:
//!       Ana(engine, state)  ── engine here? ──yes──> engine_ana_state_set (LonghornEngine.anaState)
//!                                          └─no───> <engine ip>:8504 EngineSetTargetListenerANAState
//!       Record(r)           ── LonghornEngineFrontend.switchover = r
//!       Promote(new, old)   ── new optimized; failing: old optimized again, record done: preparing
//!       Commit(new)         ── engineName, targetAddress = new; switchover cleared
//! ```

use std::time::Duration;

use tonic::Code;

use super::error::LonghornError;
use super::lifecycle::{self, EngineAt, Step};
use super::service::Longhorn;
use crate::proto::spdkrpc;
use crate::resources::longhorn::{AnaState, LonghornEngine, LonghornEngineFrontend, SwitchoverPhase};
use crate::runtime::Typed;

/// How long another node may take to set its engine's ANA state (it waits
/// for its controller).
const ANA_TIMEOUT: Duration = Duration::from_secs(60);

impl Longhorn {
    /// Switches engine-frontend `ef` over to engine `engine_name` at
    /// `target_address` as far as `phase` (see [`lifecycle::switch_over`]).
    pub(super) async fn switch_over(
        &self,
        name: &str,
        found: Option<Typed<LonghornEngineFrontend>>,
        target_address: &str,
        engine_name: &str,
        phase: &str,
    ) -> Result<(), LonghornError> {
        let steps = lifecycle::switch_over(
            name,
            found.as_ref().map(|f| &f.spec),
            target_address,
            engine_name,
            phase,
        )?;
        let Some(ef) = found.filter(|_| !steps.is_empty()) else {
            return Ok(());
        };
        let what = format!("engine frontend {}", ef.id());
        let _one = self
            .try_hold(&format!("{}/switch-over", ef.id()))
            .ok_or_else(|| {
                LonghornError::Refused(format!("{what} target switchover is already in progress"))
            })?;
        for step in steps {
            match step {
                Step::Ana {
                    engine,
                    state,
                    gone_ok,
                } => match self.engine_ana(&engine, state).await {
                    Err(e) if gone_ok && e.code() == Code::NotFound => {
                        tracing::info!(
                            frontend = ef.id(),
                            engine = engine.name,
                            "the old engine is gone: its listener needs no ANA state"
                        );
                    }
                    r => r.map_err(|e| in_phase(&what, phase, e))?,
                },
                Step::Promote { new, old } => {
                    if let Err(e) = self.engine_ana(&new, AnaState::Optimized).await {
                        // the old one serves again; the next promoting demotes it first
                        if let Err(x) = self.engine_ana(&old, AnaState::Optimized).await {
                            tracing::warn!(
                                frontend = ef.id(),
                                engine = old.name,
                                error = %x,
                                "making the old engine optimized again after a failed promotion"
                            );
                        }
                        self.frontend_update(ef.id(), |f| {
                            if let Some(r) = f.switchover.as_mut() {
                                r.done = r.done.min(Some(SwitchoverPhase::Preparing));
                            }
                        })?;
                        return Err(in_phase(&what, phase, e));
                    }
                }
                Step::Record(r) => self.frontend_update(ef.id(), |f| f.switchover = r.clone())?,
                Step::Commit(new) => {
                    self.frontend_update(ef.id(), |f| {
                        f.engine_name = new.name.clone();
                        f.target_address = new.address.clone();
                        f.switchover = None;
                    })?;
                    tracing::info!(
                        frontend = ef.id(),
                        engine = new.name,
                        target = new.address,
                        "engine frontend switched over"
                    );
                }
            }
        }
        Ok(())
    }

    /// Sets engine `e`'s listener ANA state on its node.
    async fn engine_ana(&self, e: &EngineAt, state: AnaState) -> Result<(), LonghornError> {
        let here = self
            .state()
            .get_typed::<LonghornEngine>(&e.name)
            .map_err(LonghornError::State)?
            .is_some();
        if here {
            return self.engine_ana_state_set(&e.name, state.as_str()).await;
        }
        let mut c = self
            .peers()
            .client(&e.address, self.peer_port(), ANA_TIMEOUT)
            .await
            .map_err(|source| {
                LonghornError::Unavailable(format!(
                    "engine {} at {}: {}",
                    e.name,
                    e.address,
                    crate::util::error_chain(&source)
                ))
            })?;
        c.engine_set_target_listener_ana_state(spdkrpc::EngineSetTargetListenerAnaStateRequest {
            name: e.name.clone(),
            ana_state: state.as_str().to_owned(),
        })
        .await
        .map(|_| ())
        .map_err(|s| LonghornError::Relayed(Box::new(s)))
    }

    /// Changes engine-frontend `name`'s spec with `f`, over the newest
    /// version.
    fn frontend_update(
        &self,
        name: &str,
        mut f: impl FnMut(&mut LonghornEngineFrontend),
    ) -> Result<(), LonghornError> {
        loop {
            let now = self
                .state()
                .get_typed::<LonghornEngineFrontend>(name)
                .map_err(LonghornError::State)?
                .ok_or_else(|| LonghornError::Gone(format!("cannot find engine frontend {name}")))?;
            let mut spec = now.spec.clone();
            f(&mut spec);
            if spec == now.spec {
                return Ok(());
            }
            match self
                .state()
                .update_typed(name, "", Some(now.metadata.version), &spec)
            {
                Ok(_) => return Ok(()),
                Err(crate::runtime::StateError::Conflict { .. }) => continue,
                Err(x) => return Err(LonghornError::State(x)),
            }
        }
    }
}

/// Error `e` of a phase of `what`'s switch-over, its code kept (NOT_FOUND
/// for an engine not found, as Longhorn's).
fn in_phase(what: &str, phase: &str, e: LonghornError) -> LonghornError {
    LonghornError::within(
        format!(
            "failed to switch over target for {what} in phase {}",
            if phase.is_empty() { "(all)" } else { phase }
        ),
        e,
    )
}
