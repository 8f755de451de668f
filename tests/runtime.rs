//! Controller-runtime tests on an in-memory runtime (tier 2).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use talon::runtime::testing::{TestRuntime, eventually};
use talon::runtime::{
    Controller, ControllerError, ControllerState, Input, Output, ReconcileContext, Requeue, RuntimeError,
    Spec,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Want {
    n: u64,
}
impl Spec for Want {
    const TYPE: &'static str = "Want";
    const NAMESPACE: &'static str = "config";
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Mid {
    n: u64,
}
impl Spec for Mid {
    const TYPE: &'static str = "Mid";
    const NAMESPACE: &'static str = "engine";
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Out {
    n: u64,
}
impl Spec for Out {
    const TYPE: &'static str = "Out";
    const NAMESPACE: &'static str = "frontend";
}

/// Want -> Mid (one per Want, same id).
struct First;
#[async_trait::async_trait]
impl Controller for First {
    fn name(&self) -> &'static str {
        "test.FirstController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::of::<Want>()]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<Mid>()]
    }
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        for w in ctx.list::<Want>()? {
            ctx.apply(w.id(), Mid { n: w.spec.n * 2 })?;
        }
        Ok(Requeue::OnInputChange)
    }
}

/// Mid -> Out.
struct Second;
#[async_trait::async_trait]
impl Controller for Second {
    fn name(&self) -> &'static str {
        "test.SecondController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::of::<Mid>()]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<Out>()]
    }
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        for m in ctx.list::<Mid>()? {
            ctx.apply(m.id(), Out { n: m.spec.n + 1 })?;
        }
        Ok(Requeue::OnInputChange)
    }
}

#[tokio::test]
async fn a_chain_of_two_controllers_converges_and_tracks_outputs() {
    let rt = TestRuntime::start(|rt| {
        rt.register(First)?;
        rt.register(Second)
    })
    .expect("register");
    let st = rt.state.clone();
    st.create_typed("a", "", &Want { n: 1 }).expect("create");
    st.create_typed("b", "", &Want { n: 5 }).expect("create");
    eventually("outputs for a and b", Duration::from_secs(10), || {
        let st = st.clone();
        async move {
            let outs = st.list_typed::<Out>().ok()?;
            (outs.len() == 2 && outs[0].spec.n == 3 && outs[1].spec.n == 11).then_some(())
        }
    })
    .await;
    let out = st.get_typed::<Out>("a").expect("get").expect("exists");
    assert_eq!(out.metadata.owner, "test.SecondController");
    // Removing the input removes the outputs it produced, through both controllers.
    st.destroy("config", "Want", "a", "").expect("destroy");
    eventually(
        "out/a removed by output tracking",
        Duration::from_secs(10),
        || {
            let st = st.clone();
            async move {
                (st.get_typed::<Out>("a").ok()?.is_none() && st.get_typed::<Mid>("a").ok()?.is_none())
                    .then_some(())
            }
        },
    )
    .await;
    assert!(st.get_typed::<Out>("b").expect("get").is_some());
    rt.stop().await;
}

#[test]
fn a_second_exclusive_owner_is_refused() {
    struct Again;
    #[async_trait::async_trait]
    impl Controller for Again {
        fn name(&self) -> &'static str {
            "test.AgainController"
        }
        fn inputs(&self) -> Vec<Input> {
            vec![]
        }
        fn outputs(&self) -> Vec<Output> {
            vec![Output::shared::<Mid>()]
        }
        async fn reconcile(&self, _: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
            Ok(Requeue::OnInputChange)
        }
    }
    let mut rt = talon::runtime::Runtime::new(talon::runtime::State::in_memory());
    rt.register(First).expect("first");
    let err = rt.register(Again).expect_err("second owner");
    assert!(matches!(err, RuntimeError::OwnerConflict { .. }), "{err}");
    assert!(err.to_string().contains("test.FirstController"), "{err}");
}

/// Writes a type it did not declare; then panics a few times before succeeding.
struct Unruly {
    calls: Arc<AtomicU32>,
}
#[async_trait::async_trait]
impl Controller for Unruly {
    fn name(&self) -> &'static str {
        "test.UnrulyController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::of::<Want>()]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<Out>()]
    }
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        match n {
            0 => {
                // Undeclared output: refused, and the error restarts the controller.
                ctx.apply("x", Mid { n: 0 })?;
                Ok(Requeue::OnInputChange)
            }
            1 | 2 => panic!("boom {n}"),
            _ => {
                ctx.apply("ok", Out { n: u64::from(n) })?;
                Ok(Requeue::OnInputChange)
            }
        }
    }
}

#[tokio::test]
async fn failures_and_panics_restart_with_backoff_and_reset_after_success() {
    let calls = Arc::new(AtomicU32::new(0));
    let rt = TestRuntime::with(Unruly { calls: calls.clone() }).expect("register");
    let st = rt.state.clone();
    eventually("the controller recovers", Duration::from_secs(20), || {
        let st = st.clone();
        async move { st.get_typed::<Out>("ok").ok()?.map(|_| ()) }
    })
    .await;
    assert!(
        st.get_typed::<Mid>("x").expect("get").is_none(),
        "the undeclared write must not land"
    );
    let statuses = rt.statuses();
    let s = eventually("status idle", Duration::from_secs(5), || {
        let statuses = statuses.clone();
        async move {
            let s = statuses.read().ok()?.get("test.UnrulyController").cloned()?;
            (s.state == ControllerState::Idle).then_some(s)
        }
    })
    .await;
    assert_eq!(s.restarts, 3, "one error and two panics");
    assert_eq!(s.last_error, None, "a clean reconcile clears the error");
    rt.stop().await;
}
