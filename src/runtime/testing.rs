//! Helpers for controller tests: an in-memory runtime and eventually-style asserts.

use std::future::Future;
use std::time::Duration;

use super::controller::Controller;
use super::runner::{Runtime, RuntimeError, RuntimeHandle, Statuses};
use super::state::State;

/// Sends this test's logs (talon's at info, others' warnings) to the test's
/// output, which the test runner shows when the test fails; `RUST_LOG`
/// chooses otherwise. Once per process; later calls do nothing.
pub fn capture_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,talon=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_test_writer()
        .try_init();
}

/// An in-memory runtime running the given controllers.
#[derive(Debug)]
pub struct TestRuntime {
    /// The store the controllers work on.
    pub state: State,
    handle: Option<RuntimeHandle>,
    statuses: Statuses,
}

impl TestRuntime {
    /// Starts a runtime on an in-memory store; `register` adds the controllers.
    pub fn start(
        register: impl FnOnce(&mut Runtime) -> Result<(), RuntimeError>,
    ) -> Result<Self, RuntimeError> {
        Self::start_on(State::in_memory(), register)
    }

    /// Starts a runtime on a given store.
    pub fn start_on(
        state: State,
        register: impl FnOnce(&mut Runtime) -> Result<(), RuntimeError>,
    ) -> Result<Self, RuntimeError> {
        let mut rt = Runtime::new(state.clone());
        register(&mut rt)?;
        let statuses = rt.statuses();
        Ok(Self {
            state,
            handle: Some(rt.start()),
            statuses,
        })
    }

    /// Starts a runtime with one controller.
    pub fn with(c: impl Controller) -> Result<Self, RuntimeError> {
        Self::start(|rt| rt.register(c))
    }

    /// The controllers' statuses.
    pub fn statuses(&self) -> Statuses {
        self.statuses.clone()
    }

    /// Stops the controllers.
    pub async fn stop(mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown().await;
        }
    }
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
/// This is a wait for an outcome, not a timing assertion: the timeout is generous.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = crate::util::Backoff::new(Duration::from_millis(5), Duration::from_millis(100));
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(delay.next_delay()).await;
    }
}
