//! `InstanceSuspend`, `InstanceResume`, `InstanceSwitchOverTarget` and
//! `InstanceDeleteTarget`: the answers of longhorn-instance-manager v1.12.1's
//! V2 instance ops (`pkg/instance/instance.go`, over longhorn-spdk-engine's
//! `server_enginefrontend.go` and `enginefrontend.go`) where talon cannot do
//! what is asked, so that longhorn-manager sees the error its own engine
//! gives and nothing is changed: the engine-frontend keeps its target and
//! its state, I/O goes on.
//!
//! ```text
//!   request ──data engine V1?──> UNIMPLEMENTED "v1 data engine instance <op> is not supported"
//!      │ type
//!      ├─ replica ────────────> INVALID_ARGUMENT "<op> is not supported for instance type replica"
//!      ├─ engine ─────────────> UNIMPLEMENTED (suspend/resume/switch-over), INTERNAL (delete target)
//!      ├─ engine-frontend ──> find it (switch-over: also by engine name) ── none ──> NOT_FOUND
//!      │      suspend/resume: UNIMPLEMENTED "<op> frontend <f> is unimplemented: engine
//!      │                      frontend lifecycle unimplemented" (Longhorn suspends only a
//!      │                      dm-linear blockdev frontend; talon's has none)
//!      │      switch-over to the target it has: OK (Longhorn's duplicate-request no-op);
//!      │                      to another: UNIMPLEMENTED, the frontend left as it is
//!      └─ other ──────────────> INVALID_ARGUMENT "unknown instance type <t>"
//! ```
//!
//! longhorn-manager v1.12.1 calls only `InstanceSwitchOverTarget`, for an
//! engine-frontend, when a V2 volume's `spec.engineNodeID` moves its engine to
//! another node (`controller/engine_frontend_controller.go`); on an error it
//! records a `FailedSwitchover` event and tries again, while the old engine
//! keeps serving (`controller/volume_controller.go` `processEngineSwitchover`
//! stops the old engine only after the frontend reports the new target).
//! `InstanceSuspend/Resume` and `InstanceDeleteTarget` have no caller there.

use super::error::LonghornError;
use crate::resources::longhorn::LonghornEngineFrontend;

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
        ("replica" | "shard" | "shard-group", _) => Err(LonghornError::Invalid(format!(
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

/// A switch-over of the engine-frontend found for `name` (by its name, else
/// as the only one of the engine `name`) to `target_address` (`ip:port`) of
/// the engine `engine_name` (empty: whichever engine is there).
pub fn switch_over(
    name: &str,
    found: Option<&LonghornEngineFrontend>,
    target_address: &str,
    engine_name: &str,
) -> Result<(), LonghornError> {
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
    let same_engine = engine_name.is_empty() || engine_name == ef.engine_name;
    if ef.target_address == target_address && same_engine {
        return Ok(());
    }
    Err(LonghornError::Unimplemented(format!(
        "failed to switch over target for engine frontend {name}: talon's engine frontend cannot switch \
         over its target (from engine {} at {} to {} at {target_address}); it keeps its target",
        ef.engine_name,
        ef.target_address,
        if engine_name.is_empty() {
            "an engine"
        } else {
            engine_name
        },
    )))
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

    #[test]
    fn a_switch_over_to_the_target_it_has_is_a_no_op_and_any_other_is_refused() {
        let ef = ef();
        assert!(switch_over("f", Some(&ef), "10.0.0.1:20001", "").is_ok());
        assert!(switch_over("f", Some(&ef), "10.0.0.1:20001", "vol-e-0").is_ok());
        let e = switch_over("f", Some(&ef), "10.0.0.2:20001", "vol-e-1").expect_err("other target");
        assert_eq!(e.code(), tonic::Code::Unimplemented);
        assert!(
            e.message().contains("vol-e-1 at 10.0.0.2:20001"),
            "{}",
            e.message()
        );
        let e = switch_over("f", Some(&ef), "10.0.0.1:20001", "vol-e-1").expect_err("other engine");
        assert_eq!(e.code(), tonic::Code::Unimplemented);
        assert_eq!(
            switch_over("f", Some(&ef), "", "").map_err(|e| e.code()),
            Err(tonic::Code::InvalidArgument)
        );
        assert_eq!(
            switch_over("f", Some(&ef), "10.0.0.1", "").map_err(|e| e.code()),
            Err(tonic::Code::InvalidArgument)
        );
        let e = switch_over("f", None, "10.0.0.1:1", "").expect_err("none");
        assert_eq!(e.code(), tonic::Code::NotFound);
        assert!(
            e.message().contains("cannot find engine frontend or engine f"),
            "{}",
            e.message()
        );
    }
}
