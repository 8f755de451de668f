//! `InstanceSuspend`, `InstanceResume`, `InstanceSwitchOverTarget` and
//! `InstanceDeleteTarget`: the answers of longhorn-instance-manager v1.12.1's
//! V2 instance ops (`pkg/instance/instance.go`, over longhorn-spdk-engine's
//! `server_enginefrontend.go` and `enginefrontend.go`), and the plan of an
//! engine-frontend's switch-over to another engine's export, phase by phase
//! (carried out by `super::switchover`).
//!
//! ```text
//!   request ──data engine V1?──> UNIMPLEMENTED "v1 data engine instance <op> is not supported"
//!      │ type
//!      ├─ replica, shard, shardgroup ─> INVALID_ARGUMENT "<op> is not supported for instance type <t>"
//!      ├─ engine ─────────────> UNIMPLEMENTED (suspend/resume/switch-over), INTERNAL (delete target)
//!      ├─ engine-frontend ──> find it (switch-over: also by engine name) ── none ──> NOT_FOUND
//!      │      suspend/resume: UNIMPLEMENTED "<op> frontend <f> is unimplemented: engine
//!      │                      frontend lifecycle unimplemented" (Longhorn suspends only a
//!      │                      dm-linear blockdev frontend; talon's has none)
//!      │      switch-over to the target it has: OK (Longhorn's duplicate-request no-op);
//!      │                      to another: the phase's steps (spdk-tcp-nvmf, and
//!      │                      spdk-tcp-blockdev with a second kernel path); a bad phase
//!      │                      INVALID_ARGUMENT; ublk, "" FAILED_PRECONDITION
//!      └─ other ──────────────> INVALID_ARGUMENT "unknown instance type <t>"
//! ```
//!
//! longhorn-manager v1.12.1 calls only `InstanceSwitchOverTarget`, for an
//! engine-frontend, when a V2 volume's `spec.engineNodeID` moves its engine to
//! another node (`controller/engine_frontend_controller.go`): `preparing`,
//! `switching`, `promoting`, each once the last succeeded; on an error it
//! records a `FailedSwitchover` event and asks the same phase again, while
//! the old engine keeps serving (`controller/volume_controller.go`
//! `processEngineSwitchover` deletes the old engine only after the frontend
//! reports the new target). `InstanceSuspend/Resume` and
//! `InstanceDeleteTarget` have no caller there.

use super::error::LonghornError;
use crate::resources::longhorn::{AnaState, FrontendSwitchover, LonghornEngineFrontend, SwitchoverPhase};
use crate::spdk::naming::longhorn as naming;

/// One of the four calls, for its words in the answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `InstanceSuspend`.
    Suspend,
    /// `InstanceResume`.
    Resume,
    /// `InstanceSwitchOverTarget`.
    SwitchOver,
    /// `InstanceDeleteTarget`.
    DeleteTarget,
}

impl Op {
    /// Longhorn's words for the V1 refusal and the replica refusal.
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Op::Suspend => ("instance suspend", "suspend"),
            Op::Resume => ("instance resume", "resume"),
            Op::SwitchOver => ("instance target switch over", "target switch over"),
            Op::DeleteTarget => ("instance target delete", "target deletion"),
        }
    }
}

/// The answer before anything is looked up: `Ok(())` when the call is for an
/// engine-frontend of the V2 data engine (the caller then looks it up).
pub fn check(op: Op, v1: bool, ty: &str, name: &str) -> Result<(), LonghornError> {
    let (v1_words, type_words) = op.words();
    if v1 {
        return Err(LonghornError::Unimplemented(format!(
            "v1 data engine {v1_words} is not supported"
        )));
    }
    let refuse = |words: &str| Err(LonghornError::Unimplemented(words.to_owned()));
    match (ty, op) {
        ("engine-frontend", Op::DeleteTarget) => {
            Err(LonghornError::Invalid(format!("unknown instance type {ty}")))
        }
        ("engine-frontend", _) => Ok(()),
        ("engine", Op::Suspend) => refuse("suspend is not supported for instance type engine"),
        ("engine", Op::Resume) => refuse("resume is not supported for instance type engine"),
        ("engine", Op::SwitchOver) => {
            refuse("switch over target for engine has been replaced by engine frontend switch over")
        }
        ("engine", Op::DeleteTarget) => Err(LonghornError::internal(
            format!("failed to delete target for engine {name}"),
            "EngineDeleteTarget is not implemented yet and will be removed in the future",
        )),
        ("replica" | "shard" | "shardgroup", _) => Err(LonghornError::Invalid(format!(
            "{type_words} is not supported for instance type {ty}"
        ))),
        _ => Err(LonghornError::Invalid(format!("unknown instance type {ty}"))),
    }
}

/// Suspend or resume of an engine-frontend (`None`: there is none of that
/// name): refused as Longhorn refuses a frontend it cannot suspend.
pub fn suspend_or_resume(op: Op, name: &str, ef: Option<&LonghornEngineFrontend>) -> LonghornError {
    let (verb, noun) = match op {
        Op::Resume => ("resume", "resumption"),
        _ => ("suspend", "suspension"),
    };
    match ef {
        None => LonghornError::Gone(format!(
            "failed to {verb} engine frontend {name}: cannot find engine frontend {name} for {noun}"
        )),
        Some(ef) => LonghornError::Unimplemented(format!(
            "failed to {verb} engine frontend {name}: {verb} frontend {} is unimplemented: engine frontend \
             lifecycle unimplemented",
            ef.frontend
        )),
    }
}

/// An engine of a switch-over and where its node is reached: its export's
/// `ip:port` (its node's SPDKService is at that IP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineAt {
    /// The engine instance.
    pub name: String,
    /// Its export, `ip:port`.
    pub address: String,
}

/// One step of a switch-over phase, carried out in order by the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The ANA state of `engine`'s listener, set on its node
    /// (`EngineSetTargetListenerANAState`); `gone_ok`: an engine that is not
    /// there any more counts as done (the old one, deleted after
    /// `promoting`).
    Ana {
        engine: EngineAt,
        state: AnaState,
        gone_ok: bool,
    },
    /// The new engine made optimized; should that fail, the old one is made
    /// optimized again and the record goes back to `preparing` (the next
    /// `promoting` runs `switching` first). `path`: a kernel frontend, whose
    /// path to the new engine must be live first (Longhorn loads the new
    /// path's device at `promoting`); one that is not fails the promotion
    /// the same way.
    Promote {
        new: EngineAt,
        old: EngineAt,
        path: bool,
    },
    /// The switch-over record written on the engine-frontend (`None`: no
    /// switch-over under way).
    Record(Option<FrontendSwitchover>),
    /// A kernel path to the new engine's export beside the target's
    /// (`spdk-tcp-blockdev`): connected by this node's engine-frontend
    /// controller once the record names the engine, waited for until the
    /// kernel has it live.
    Path(EngineAt),
    /// The engine-frontend's target made the new engine (`engineName`,
    /// `targetAddress`), the record cleared, in one write.
    Commit(EngineAt),
}

/// What a switch-over of engine-frontend `name` (`found`: it, by its name or
/// as the only one of the engine `name`) to `target_address` (`ip:port`) of
/// engine `engine_name` in phase `phase` does: the steps, in order; none
/// when the target is the one it has and no switch-over is recorded.
///
/// Each phase is idempotent: asked again (the manager retries a phase that
/// failed; a talon restarted asks nothing of its own) it sets the same ANA
/// states again. A phase whose earlier ones were not carried out to their
/// end for this target runs them first (`phase` empty, Longhorn's one-call
/// switch-over, runs all three), so no order of calls leaves both engines
/// optimized or none usable:
///
/// ```text
///   preparing   spdk-tcp-blockdev, no path yet: new ─> inaccessible, record {new},
///                 the kernel path to new connected (this node's controller) and live
///               new ─> non-optimized            record {new, done: preparing}
///   switching   old ─> inaccessible (gone: ok)  record {new, done: switching}
///   promoting   spdk-tcp-blockdev: the kernel path to new live (else as a failed promotion)
///               new ─> optimized (else old ─> optimized, record done: preparing)
///               target := new, record cleared
///   same target as now, a record of another:  old (the current) ─> optimized when
///               it was made inaccessible, record cleared (a switch-over the
///               manager reverted)
/// ```
pub fn switch_over(
    name: &str,
    found: Option<&LonghornEngineFrontend>,
    target_address: &str,
    engine_name: &str,
    phase: &str,
) -> Result<Vec<Step>, LonghornError> {
    if target_address.is_empty() {
        return Err(LonghornError::Invalid("target address is required".into()));
    }
    let valid = target_address
        .rsplit_once(':')
        .is_some_and(|(ip, port)| !ip.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0));
    if !valid {
        return Err(LonghornError::Invalid(format!(
            "invalid target address {target_address:?}"
        )));
    }
    let Some(ef) = found else {
        return Err(LonghornError::Gone(format!(
            "failed to switch over target for engine frontend {name}: cannot find engine frontend or \
             engine {name} for target switchover"
        )));
    };
    let asked = match phase {
        "" => SwitchoverPhase::Promoting,
        p => SwitchoverPhase::parse(p).ok_or_else(|| {
            LonghornError::Invalid(format!(
                "failed to switch over target for engine frontend {name}: invalid switchover phase {p:?} \
                 (preparing, switching or promoting)"
            ))
        })?,
    };
    let current = EngineAt {
        name: ef.engine_name.clone(),
        address: ef.target_address.clone(),
    };
    let same_engine = engine_name.is_empty() || engine_name == ef.engine_name;
    if ef.target_address == target_address && same_engine {
        // the target it has (Longhorn's duplicate-request no-op); a record of
        // another target is a switch-over the manager gave up
        return Ok(match &ef.switchover {
            None => Vec::new(),
            Some(r) if r.done >= Some(SwitchoverPhase::Switching) => vec![
                Step::Ana {
                    engine: current,
                    state: AnaState::Optimized,
                    gone_ok: false,
                },
                Step::Record(None),
            ],
            Some(_) => vec![Step::Record(None)],
        });
    }
    let kernel = match naming::FrontendMode::of(&ef.frontend) {
        Ok(naming::FrontendMode::NvmfEndpoint) => false,
        Ok(naming::FrontendMode::KernelBlockdev) => true,
        Ok(naming::FrontendMode::Disabled) | Err(_) => {
            return Err(LonghornError::Refused(format!(
                "frontend {} does not support target switchover for engine frontend {name}",
                ef.frontend
            )));
        }
    };
    if engine_name.is_empty() {
        return Err(LonghornError::Invalid(format!(
            "failed to switch over target for engine frontend {name}: the engine name of target \
             {target_address} is required"
        )));
    }
    let new = EngineAt {
        name: engine_name.to_owned(),
        address: target_address.to_owned(),
    };
    let record = |done| {
        Step::Record(Some(FrontendSwitchover {
            engine_name: new.name.clone(),
            target_address: new.address.clone(),
            done,
        }))
    };
    let done = ef
        .switchover
        .as_ref()
        .filter(|r| r.engine_name == new.name && r.target_address == new.address)
        .map(|r| r.done);
    let done = done.flatten();
    let mut steps = Vec::new();
    for p in SwitchoverPhase::ALL.into_iter().filter(|p| *p <= asked) {
        if p < asked && done >= Some(p) {
            continue;
        }
        match p {
            SwitchoverPhase::Preparing if kernel => {
                // Longhorn's order: the listener inaccessible while the host
                // connects to it (no I/O routed there before the kernel knows
                // its state), then non-optimized. A path connected before
                // (the record says preparing ended) is not made inaccessible
                // again: the old one may be so by now.
                if done.is_none() {
                    steps.push(Step::Ana {
                        engine: new.clone(),
                        state: AnaState::Inaccessible,
                        gone_ok: false,
                    });
                    steps.push(record(None));
                }
                steps.push(Step::Path(new.clone()));
                steps.push(Step::Ana {
                    engine: new.clone(),
                    state: AnaState::NonOptimized,
                    gone_ok: false,
                });
                steps.push(record(done.max(Some(p))));
            }
            SwitchoverPhase::Preparing => {
                steps.push(Step::Ana {
                    engine: new.clone(),
                    state: AnaState::NonOptimized,
                    gone_ok: false,
                });
                steps.push(record(done.max(Some(p))));
            }
            SwitchoverPhase::Switching => {
                steps.push(Step::Ana {
                    engine: current.clone(),
                    state: AnaState::Inaccessible,
                    gone_ok: true,
                });
                steps.push(record(done.max(Some(p))));
            }
            SwitchoverPhase::Promoting => {
                steps.push(Step::Promote {
                    new: new.clone(),
                    old: current.clone(),
                    path: kernel,
                });
                steps.push(Step::Commit(new.clone()));
            }
        }
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ef() -> LonghornEngineFrontend {
        LonghornEngineFrontend {
            volume: "vol".into(),
            engine_name: "vol-e-0".into(),
            target_address: "10.0.0.1:20001".into(),
            frontend: "spdk-tcp-nvmf".into(),
            size_bytes: 1 << 30,
            nr_io_queues: 0,
            switchover: None,
        }
    }

    #[test]
    fn types_and_engines_get_longhorns_codes() {
        use tonic::Code::*;
        let code = |op, v1, ty| check(op, v1, ty, "x").map_err(|s| s.code()).err();
        assert_eq!(code(Op::Suspend, true, "engine-frontend"), Some(Unimplemented));
        assert_eq!(code(Op::Suspend, false, "engine-frontend"), None);
        assert_eq!(code(Op::Resume, false, "engine"), Some(Unimplemented));
        assert_eq!(code(Op::SwitchOver, false, "engine"), Some(Unimplemented));
        assert_eq!(code(Op::DeleteTarget, false, "engine"), Some(Internal));
        assert_eq!(
            code(Op::DeleteTarget, false, "engine-frontend"),
            Some(InvalidArgument)
        );
        assert_eq!(code(Op::Suspend, false, "replica"), Some(InvalidArgument));
        assert_eq!(code(Op::Suspend, false, "bogus"), Some(InvalidArgument));
        let words = |op, ty| check(op, false, ty, "x").map_err(|e| e.message()).err();
        assert_eq!(
            words(Op::DeleteTarget, "engine").as_deref(),
            Some(
                "failed to delete target for engine x: EngineDeleteTarget is not implemented yet and will be \
                 removed in the future"
            )
        );
        assert_eq!(
            words(Op::Resume, "engine").as_deref(),
            Some("resume is not supported for instance type engine")
        );
        let gone = tonic::Status::from(suspend_or_resume(Op::Resume, "f", None));
        assert_eq!(
            (gone.code(), gone.message()),
            (
                NotFound,
                "failed to resume engine frontend f: cannot find engine frontend f for resumption"
            )
        );
    }

    const NEW: &str = "10.0.0.2:20001";

    fn at(name: &str, address: &str) -> EngineAt {
        EngineAt {
            name: name.into(),
            address: address.into(),
        }
    }

    fn ana(name: &str, address: &str, state: AnaState, gone_ok: bool) -> Step {
        Step::Ana {
            engine: at(name, address),
            state,
            gone_ok,
        }
    }

    fn record(done: Option<SwitchoverPhase>) -> Step {
        Step::Record(Some(FrontendSwitchover {
            engine_name: "vol-e-1".into(),
            target_address: NEW.into(),
            done,
        }))
    }

    fn reached(done: Option<SwitchoverPhase>) -> LonghornEngineFrontend {
        LonghornEngineFrontend {
            switchover: Some(FrontendSwitchover {
                engine_name: "vol-e-1".into(),
                target_address: NEW.into(),
                done,
            }),
            ..ef()
        }
    }

    fn plan(ef: &LonghornEngineFrontend, phase: &str) -> Vec<Step> {
        switch_over("f", Some(ef), NEW, "vol-e-1", phase).expect("a plan")
    }

    #[test]
    fn a_switch_over_to_the_target_it_has_is_a_no_op_and_bad_requests_get_longhorns_codes() {
        let ef = ef();
        for phase in ["", "preparing", "switching", "promoting"] {
            assert_eq!(
                switch_over("f", Some(&ef), "10.0.0.1:20001", "", phase).ok(),
                Some(vec![])
            );
            assert_eq!(
                switch_over("f", Some(&ef), "10.0.0.1:20001", "vol-e-0", phase).ok(),
                Some(vec![])
            );
        }
        assert_eq!(
            switch_over("f", Some(&ef), "", "", "preparing").map_err(|e| e.code()),
            Err(tonic::Code::InvalidArgument)
        );
        assert_eq!(
            switch_over("f", Some(&ef), "10.0.0.1", "", "preparing").map_err(|e| e.code()),
            Err(tonic::Code::InvalidArgument)
        );
        let e = switch_over("f", None, "10.0.0.1:1", "", "preparing").expect_err("none");
        assert_eq!(e.code(), tonic::Code::NotFound);
        assert!(
            e.message().contains("cannot find engine frontend or engine f"),
            "{}",
            e.message()
        );
        let e = switch_over("f", Some(&ef), NEW, "vol-e-1", "promote").expect_err("bad phase");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message().contains("engine frontend f") && e.message().contains("\"promote\""),
            "{}",
            e.message()
        );
        let e = switch_over("f", Some(&ef), NEW, "", "preparing").expect_err("no engine name");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        for (frontend, words) in [
            (
                "",
                "frontend  does not support target switchover for engine frontend f",
            ),
            (
                "ublk",
                "frontend ublk does not support target switchover for engine frontend f",
            ),
        ] {
            let other = LonghornEngineFrontend {
                frontend: frontend.into(),
                ..ef.clone()
            };
            let e = switch_over("f", Some(&other), NEW, "vol-e-1", "preparing").expect_err(frontend);
            assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{frontend}");
            assert!(e.message().contains(words), "{}", e.message());
        }
    }

    /// The three phases in the manager's order: each sets one ANA state and
    /// records how far it got; `promoting` makes the new engine the target.
    #[test]
    fn the_three_phases_set_the_ana_states_in_longhorns_order() {
        use AnaState::*;
        use SwitchoverPhase::*;
        let ef = ef();
        assert_eq!(
            plan(&ef, "preparing"),
            vec![ana("vol-e-1", NEW, NonOptimized, false), record(Some(Preparing))]
        );
        assert_eq!(
            plan(&reached(Some(Preparing)), "switching"),
            vec![
                ana("vol-e-0", "10.0.0.1:20001", Inaccessible, true),
                record(Some(Switching)),
            ]
        );
        assert_eq!(
            plan(&reached(Some(Switching)), "promoting"),
            vec![
                Step::Promote {
                    new: at("vol-e-1", NEW),
                    old: at("vol-e-0", "10.0.0.1:20001"),
                    path: false,
                },
                Step::Commit(at("vol-e-1", NEW)),
            ]
        );
    }

    /// `spdk-tcp-blockdev` (Longhorn's `switchOverTargetBlockdevPhased`):
    /// `preparing` connects a kernel path to the new engine while its
    /// listener is inaccessible, then makes it non-optimized; a path
    /// connected before is not made inaccessible again; `switching` and
    /// `promoting` are the nvmf frontend's.
    #[test]
    fn a_kernel_frontend_connects_the_new_path_inaccessible_first() {
        use AnaState::*;
        use SwitchoverPhase::*;
        let kernel = |done: Option<Option<SwitchoverPhase>>| LonghornEngineFrontend {
            frontend: "spdk-tcp-blockdev".into(),
            ..done.map(reached).unwrap_or_else(ef)
        };
        let connect = vec![
            ana("vol-e-1", NEW, Inaccessible, false),
            record(None),
            Step::Path(at("vol-e-1", NEW)),
            ana("vol-e-1", NEW, NonOptimized, false),
            record(Some(Preparing)),
        ];
        assert_eq!(plan(&kernel(None), "preparing"), connect);
        // a preparing cut off after the record: all again
        assert_eq!(plan(&kernel(Some(None)), "preparing"), connect);
        // asked again once switching made the old one inaccessible: the new
        // path is never inaccessible at the same time
        assert_eq!(
            plan(&kernel(Some(Some(Switching))), "preparing"),
            vec![
                Step::Path(at("vol-e-1", NEW)),
                ana("vol-e-1", NEW, NonOptimized, false),
                record(Some(Switching)),
            ]
        );
        assert_eq!(
            plan(&kernel(Some(Some(Preparing))), "switching"),
            plan(&reached(Some(Preparing)), "switching")
        );
        // promoting checks the kernel's path to the new engine first
        assert_eq!(
            plan(&kernel(Some(Some(Switching))), "promoting"),
            vec![
                Step::Promote {
                    new: at("vol-e-1", NEW),
                    old: at("vol-e-0", "10.0.0.1:20001"),
                    path: true,
                },
                Step::Commit(at("vol-e-1", NEW)),
            ]
        );
        // Longhorn's one-call switch-over: the three phases in order
        let all = plan(&kernel(None), "");
        assert_eq!(all[..5], connect[..]);
        assert!(matches!(all.last(), Some(Step::Commit(_))), "{all:?}");
    }

    /// A phase asked again does its step again and never records less than
    /// was reached; a phase whose earlier ones were not done runs them first,
    /// so the old engine is never left optimized beside an optimized new one.
    #[test]
    fn phases_asked_again_or_out_of_order_are_safe() {
        use AnaState::*;
        use SwitchoverPhase::*;
        assert_eq!(
            plan(&reached(Some(Switching)), "preparing"),
            vec![ana("vol-e-1", NEW, NonOptimized, false), record(Some(Switching))]
        );
        assert_eq!(
            plan(&reached(Some(Switching)), "switching"),
            vec![
                ana("vol-e-0", "10.0.0.1:20001", Inaccessible, true),
                record(Some(Switching)),
            ]
        );
        // promoting straight after preparing: switching first
        let p = plan(&reached(Some(Preparing)), "promoting");
        assert_eq!(p[0], ana("vol-e-0", "10.0.0.1:20001", Inaccessible, true));
        assert!(matches!(p[2], Step::Promote { .. }), "{p:?}");
        // preparing began but did not end (a restart): it is done again
        assert_eq!(
            plan(&reached(None), "switching")[..2],
            [ana("vol-e-1", NEW, NonOptimized, false), record(Some(Preparing))]
        );
        // Longhorn's one-call switch-over: all three
        let all = plan(&ef(), "");
        assert_eq!(all.len(), 6, "{all:?}");
        assert_eq!(all.last(), Some(&Step::Commit(at("vol-e-1", NEW))));
        // a record of another target is replaced
        let other = LonghornEngineFrontend {
            switchover: Some(FrontendSwitchover {
                engine_name: "vol-e-2".into(),
                target_address: "10.0.0.3:20001".into(),
                done: Some(Switching),
            }),
            ..ef()
        };
        assert_eq!(
            plan(&other, "preparing"),
            vec![
                ana("vol-e-1", NEW, AnaState::NonOptimized, false),
                record(Some(Preparing))
            ]
        );
    }

    /// A switch-over the manager gave up (it points the frontend back at
    /// the engine it has): the old engine, made inaccessible by `switching`,
    /// is made optimized again and the record dropped.
    #[test]
    fn a_given_up_switch_over_makes_the_current_engine_optimized_again() {
        let back = |done| {
            switch_over(
                "f",
                Some(&reached(done)),
                "10.0.0.1:20001",
                "vol-e-0",
                "preparing",
            )
        };
        assert_eq!(
            back(Some(SwitchoverPhase::Switching)).ok(),
            Some(vec![
                ana("vol-e-0", "10.0.0.1:20001", AnaState::Optimized, false),
                Step::Record(None),
            ])
        );
        assert_eq!(
            back(Some(SwitchoverPhase::Preparing)).ok(),
            Some(vec![Step::Record(None)])
        );
    }

    #[test]
    fn the_shardgroup_type_is_spelled_as_longhorn_spells_it() {
        let e = check(Op::SwitchOver, false, "shardgroup", "g").expect_err("not supported");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            e.message(),
            "target switch over is not supported for instance type shardgroup"
        );
    }
}
