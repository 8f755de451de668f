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
//!       Path(new)           ── the record names new: this node's controller connects the kernel
//!                              path to it (spdk-tcp-blockdev); waited for until live
//!       Promote(new, old)   ── (blockdev: new's path live first) new optimized; failing: old
//!                              optimized again, record done: preparing
//!       Commit(new)         ── engineName, targetAddress = new; switchover cleared
//!
//!   every SWITCH_WATCH, each engine-frontend of this node with a switch-over record:
//!     its new engine asked on its node (here: the state; else EngineGet at its address)
//!       gone (NotFound, or tearing down here): the switch-over was given up (the
//!         manager's revert deletes the new engine and calls nothing more) ──> the
//!         same steps as a switch-over back to the target it has: the current engine
//!         optimized again when `switching` made it inaccessible, record cleared
//!       there, or its node not answering: nothing (a `promoting` that cannot reach
//!         the new engine makes the old one optimized itself)
//! ```

use std::time::Duration;

use tonic::Code;

use super::error::LonghornError;
use super::lifecycle::{self, EngineAt, Step};
use super::service::Longhorn;
use crate::proto::spdkrpc;
use crate::resources::longhorn::{
    AnaState, InstanceState, LonghornEngine, LonghornEngineFrontend, SwitchoverPhase,
};
use crate::runtime::Typed;

/// How long another node may take to set its engine's ANA state (it waits
/// for its controller).
const ANA_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the engine-frontends in a switch-over look whether their new
/// engine is still there: from a revert's deletion of it until the old
/// engine is optimized again, the host has no usable path. Only a frontend
/// with a switch-over recorded asks another node.
const SWITCH_WATCH: Duration = Duration::from_secs(1);

/// How long `promoting` waits for a kernel frontend's path to the new engine
/// to be live (it was at `preparing`; the kernel reconnects a lost one every
/// 2 s) while the old engine is inaccessible.
const PROMOTE_PATH_WAIT: Duration = Duration::from_secs(10);

/// How long another node may take to say whether it has an engine.
const GET_TIMEOUT: Duration = Duration::from_secs(10);

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
        if phase == SwitchoverPhase::Promoting.as_str() && crate::util::fault("longhorn-switch-promoting") {
            return Err(LonghornError::Unavailable(format!(
                "{what}: promoting refused: fault injected (TALON_FAULTS/longhorn-switch-promoting)"
            )));
        }
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
                Step::Promote { new, old, path } => {
                    let promoted = async {
                        if path {
                            self.path_live_within(ef.id(), &new, PROMOTE_PATH_WAIT).await?;
                        }
                        self.engine_ana(&new, AnaState::Optimized).await
                    };
                    if let Err(e) = promoted.await {
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
                Step::Path(new) => self
                    .path_live(ef.id(), &new)
                    .await
                    .map_err(|e| in_phase(&what, phase, e))?,
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

    /// Until talon stops: every [`SWITCH_WATCH`], a switch-over whose new
    /// engine is gone from its node is given up ([`Self::give_up_switch`]).
    ///
    /// longhorn-manager v1.12.1 reverts a relocation whose new engine failed
    /// (in error, or its replicas no longer fit) by deleting that engine and
    /// pointing the engine-frontend's spec back at the old one; its
    /// engine-frontend controller then calls nothing, since the spec and the
    /// status target agree again (`engine_frontend_controller.go`
    /// `shouldExecuteEngineFrontendSwitchover`). An old engine that `switching`
    /// made inaccessible would stay so, and the host would have no path left.
    pub(super) async fn watch_switches(self) {
        let mut stopping = self.stopping.subscribe();
        // a look cut off by the stop leaves the record for the next serve
        tokio::select! {
            () = self.watch_switches_until_stopped() => {}
            _ = stopping.wait_for(|s| *s) => {}
        }
    }

    async fn watch_switches_until_stopped(&self) {
        loop {
            tokio::time::sleep(SWITCH_WATCH).await;
            // only those with a switch-over recorded are decoded
            let in_switch = match self.state().list_typed_where::<LonghornEngineFrontend>(|spec| {
                spec.get("switchover").is_some_and(|r| !r.is_null())
            }) {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "listing the engine frontends in a switch-over");
                    continue;
                }
            };
            for ef in in_switch {
                if ef.metadata.phase == crate::runtime::Phase::TearingDown {
                    continue;
                }
                let Some(r) = ef.spec.switchover.clone() else {
                    continue;
                };
                if !self.new_engine_gone(&r.engine_name, &r.target_address).await {
                    continue;
                }
                if let Err(e) = self.give_up_switch(ef.id(), &r.engine_name).await {
                    tracing::warn!(
                        frontend = ef.id(),
                        engine = r.engine_name,
                        error = %crate::util::error_chain(&e),
                        "giving up a switch-over whose new engine is gone (again in {SWITCH_WATCH:?})"
                    );
                }
            }
        }
    }

    /// Whether engine `name` at `address` is gone from its node: not in this
    /// node's state (or tearing down) when it is here, else NOT_FOUND from its
    /// node's `EngineGet`. A node that does not answer has not said so.
    async fn new_engine_gone(&self, name: &str, address: &str) -> bool {
        match self.state().get_typed::<LonghornEngine>(name) {
            Ok(Some(e)) => return e.metadata.phase == crate::runtime::Phase::TearingDown,
            Ok(None) => {}
            Err(_) => return false,
        }
        match self
            .peers()
            .engine_get(address, self.peer_port(), GET_TIMEOUT, name)
            .await
        {
            Ok(_) => false,
            Err(e) if e.not_found() => true,
            Err(e) => {
                tracing::debug!(engine = name, address, error = %crate::util::error_chain(&e),
                    "a switch-over's new engine could not be asked");
                false
            }
        }
    }

    /// Engine-frontend `name`'s switch-over to engine `gone`, given up: the
    /// steps of a switch-over back to the target it has (the current engine
    /// optimized again when `switching` made it inaccessible, the record
    /// dropped), unless the record names another engine by now.
    async fn give_up_switch(&self, name: &str, gone: &str) -> Result<(), LonghornError> {
        let Some(ef) = self
            .state()
            .get_typed::<LonghornEngineFrontend>(name)
            .map_err(LonghornError::State)?
            .filter(|f| f.spec.switchover.as_ref().is_some_and(|r| r.engine_name == gone))
        else {
            return Ok(());
        };
        let (target, engine) = (ef.spec.target_address.clone(), ef.spec.engine_name.clone());
        tracing::warn!(
            frontend = name,
            gone,
            serving = engine,
            target,
            done = ?ef.spec.switchover.as_ref().and_then(|r| r.done),
            "the switch-over's new engine is gone from its node (the manager gave the move up): \
             the engine the frontend has serves optimized again"
        );
        self.switch_over(name, Some(ef), &target, &engine, "preparing")
            .await
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

    /// Waits until engine-frontend `name`'s controller has the kernel path
    /// to engine `new`'s export live (it connects it once the switch-over
    /// record names the engine); what it says of a connect that failed
    /// since the record was written ends the wait.
    async fn path_live(&self, name: &str, new: &EngineAt) -> Result<(), LonghornError> {
        // the status lists it as the kernel names it
        let address = new
            .address
            .parse::<std::net::SocketAddr>()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| new.address.clone());
        let version = self
            .state()
            .get_typed::<LonghornEngineFrontend>(name)
            .map_err(LonghornError::State)?
            .map(|f| f.metadata.version)
            .unwrap_or_default();
        let what = format!(
            "engine frontend {name}: the NVMe/TCP path to {address} of engine {}",
            new.name
        );
        self.wait_status(name, &what, |st| {
            if st.paths.contains(&address) {
                return Some(Ok(()));
            }
            let failed = st.observed_version >= version
                && (st.state != InstanceState::Running || !st.message.is_empty());
            failed.then(|| {
                Err(LonghornError::Unavailable(format!(
                    "{what} is not live: {}",
                    st.message
                )))
            })
        })
        .await
    }

    /// [`Self::path_live`] for at most `bound`.
    async fn path_live_within(
        &self,
        name: &str,
        new: &EngineAt,
        bound: Duration,
    ) -> Result<(), LonghornError> {
        match tokio::time::timeout(bound, self.path_live(name, new)).await {
            Ok(r) => r,
            Err(_) => Err(LonghornError::Unavailable(format!(
                "engine frontend {name}: the NVMe/TCP path to {} of engine {} is not live after {bound:?}",
                new.address, new.name
            ))),
        }
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
