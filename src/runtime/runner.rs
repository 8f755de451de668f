//! The runtime: registers controllers (refusing a second exclusive owner of a
//! type), runs each on its own task, reconciles on input change, and restarts a
//! failed or panicking reconcile with exponential backoff.
//!
//! ```text
//!   State events ──filter(inputs)──> [controller task] ──reconcile──> Ok ──> cleanup outputs, reset backoff
//!        ^                                  │                         Err/panic ──> sleep(backoff), backoff*=2 (cap)
//!        └────────── ctx.apply ─────────────┘
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::FutureExt;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::controller::{Controller, Input, Output, OutputKind, ReconcileContext, Requeue};
use super::resource::now_rfc3339;
use super::state::{Event, State};
use crate::util::{Backoff, error_chain};

/// First backoff after a failure.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// Longest backoff between retries (there is no retry limit).
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A refused registration.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("controller {controller} wants {type_} exclusively, but {owner} already owns it")]
    OwnerConflict {
        controller: String,
        type_: String,
        owner: String,
    },
    #[error("controller {0} is registered twice")]
    DuplicateController(String),
}

/// What a controller is doing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ControllerState {
    /// Not started yet.
    Pending,
    /// In a reconcile.
    Reconciling,
    /// Waiting for an input change or a requeue.
    Idle,
    /// Waiting out a backoff after a failure.
    Backoff,
    /// Stopped with the runtime.
    Stopped,
}

/// The status of one controller, as `talon get controllers` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ControllerStatus {
    /// `subsystem.ThingController`.
    pub name: String,
    /// Types it reads.
    pub inputs: Vec<Input>,
    /// Types it writes.
    pub outputs: Vec<Output>,
    /// What it is doing.
    pub state: ControllerState,
    /// Failures (errors and panics) since start.
    pub restarts: u64,
    /// Clean reconciles since start.
    pub reconciles: u64,
    /// The last failure, if the last reconcile failed.
    pub last_error: Option<String>,
    /// When the last reconcile ended (RFC 3339).
    pub last_reconcile: Option<String>,
}

/// Shared view of every controller's status.
pub type Statuses = Arc<RwLock<BTreeMap<String, ControllerStatus>>>;

/// The controller runtime, before it runs.
pub struct Runtime {
    state: State,
    controllers: Vec<Arc<dyn Controller>>,
    owners: BTreeMap<(String, String), (String, OutputKind)>,
    statuses: Statuses,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("controllers", &self.controllers.len())
            .finish()
    }
}

/// A running runtime; dropping it does not stop the controllers, `shutdown` does.
pub struct RuntimeHandle {
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    statuses: Statuses,
    /// The controllers, dropped only once every task has ended (see `shutdown`).
    held: Vec<Arc<dyn Controller>>,
}

impl std::fmt::Debug for RuntimeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeHandle")
            .field("tasks", &self.tasks.len())
            .field("controllers", &self.held.len())
            .finish()
    }
}

impl Runtime {
    /// A runtime over a state store.
    pub fn new(state: State) -> Self {
        Self {
            state,
            controllers: Vec::new(),
            owners: BTreeMap::new(),
            statuses: Statuses::default(),
        }
    }

    /// The state store.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The statuses of the registered controllers (live once running).
    pub fn statuses(&self) -> Statuses {
        self.statuses.clone()
    }

    /// Registers a controller; refuses a second exclusive owner of an output type.
    pub fn register(&mut self, c: impl Controller) -> Result<(), RuntimeError> {
        let name = c.name().to_string();
        if self.controllers.iter().any(|x| x.name() == name) {
            return Err(RuntimeError::DuplicateController(name));
        }
        let outputs = c.outputs();
        for o in &outputs {
            if let Some((owner, kind)) = self.owners.get(&(o.namespace.clone(), o.type_.clone()))
                && (*kind == OutputKind::Exclusive || o.kind == OutputKind::Exclusive)
            {
                return Err(RuntimeError::OwnerConflict {
                    controller: name,
                    type_: o.type_.clone(),
                    owner: owner.clone(),
                });
            }
        }
        for o in &outputs {
            self.owners
                .insert((o.namespace.clone(), o.type_.clone()), (name.clone(), o.kind));
        }
        let status = ControllerStatus {
            name: name.clone(),
            inputs: c.inputs(),
            outputs,
            state: ControllerState::Pending,
            restarts: 0,
            reconciles: 0,
            last_error: None,
            last_reconcile: None,
        };
        self.statuses
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, status);
        self.controllers.push(Arc::new(c));
        Ok(())
    }

    /// Starts every controller on its own task.
    pub fn start(self) -> RuntimeHandle {
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let held = self.controllers.clone();
        for c in self.controllers {
            let (state, statuses, stop_rx) = (self.state.clone(), self.statuses.clone(), stop_rx.clone());
            tasks.spawn(run_controller(c, state, statuses, stop_rx));
        }
        RuntimeHandle {
            stop,
            tasks,
            statuses: self.statuses,
            held,
        }
    }

    /// Runs until `shutdown` completes, then stops every controller.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let handle = self.start();
        shutdown.await;
        handle.shutdown().await;
    }
}

impl RuntimeHandle {
    /// The statuses of the controllers.
    pub fn statuses(&self) -> Statuses {
        self.statuses.clone()
    }

    /// Stops every controller once its current reconcile ends, and waits.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
        // only now: a controller that owns a target stops it when dropped,
        // and another's reconcile must not run against a target shutting
        // down (a disk reconcile found its lvstore unloaded mid-shutdown and
        // asked for a new one over it)
        self.held.clear();
    }
}

fn set_status(statuses: &Statuses, name: &str, f: impl FnOnce(&mut ControllerStatus)) {
    if let Some(s) = statuses.write().unwrap_or_else(|p| p.into_inner()).get_mut(name) {
        f(s);
    }
}

fn relevant(inputs: &[Input], ev: &Event) -> bool {
    let m = &ev.resource.metadata;
    inputs
        .iter()
        .any(|i| i.namespace == m.namespace && i.type_ == m.type_)
}

/// Waits for an event on one of the inputs (or a lag, which may hide one).
async fn next_relevant(rx: &mut broadcast::Receiver<Event>, inputs: &[Input]) {
    loop {
        match rx.recv().await {
            Ok(ev) if relevant(inputs, &ev) => return,
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

fn drain(rx: &mut broadcast::Receiver<Event>) {
    while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = rx.try_recv() {}
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

enum Wait {
    Inputs,
    InputsOrDeadline(Instant),
    Deadline(Instant),
}

async fn run_controller(
    c: Arc<dyn Controller>,
    state: State,
    statuses: Statuses,
    mut stop: watch::Receiver<bool>,
) {
    let name = c.name();
    let (inputs, outputs) = (c.inputs(), c.outputs());
    let (_, mut rx) = state.watch(None);
    let mut backoff = Backoff::new(BACKOFF_INITIAL, BACKOFF_MAX);
    let mut wait = Wait::Deadline(Instant::now());
    loop {
        let stopped = match wait {
            Wait::Inputs => tokio::select! {
                _ = next_relevant(&mut rx, &inputs) => false,
                _ = stop.wait_for(|s| *s) => true,
            },
            Wait::InputsOrDeadline(at) => tokio::select! {
                _ = next_relevant(&mut rx, &inputs) => false,
                _ = tokio::time::sleep_until(at) => false,
                _ = stop.wait_for(|s| *s) => true,
            },
            Wait::Deadline(at) => tokio::select! {
                _ = tokio::time::sleep_until(at) => false,
                _ = stop.wait_for(|s| *s) => true,
            },
        };
        if stopped {
            break;
        }
        drain(&mut rx);
        set_status(&statuses, name, |s| s.state = ControllerState::Reconciling);
        let mut ctx = ReconcileContext::new(state.clone(), name, inputs.clone(), outputs.clone());
        let result = AssertUnwindSafe(c.reconcile(&mut ctx)).catch_unwind().await;
        let failure = match result {
            Ok(Ok(requeue)) => match ctx.cleanup_outputs() {
                Ok(_) => {
                    backoff.reset();
                    set_status(&statuses, name, |s| {
                        s.state = ControllerState::Idle;
                        s.reconciles += 1;
                        s.last_error = None;
                        s.last_reconcile = Some(now_rfc3339());
                    });
                    wait = match requeue {
                        Requeue::OnInputChange => Wait::Inputs,
                        Requeue::After(d) => Wait::InputsOrDeadline(Instant::now() + d),
                    };
                    None
                }
                Err(e) => Some(format!("output cleanup failed: {e}")),
            },
            Ok(Err(e)) => Some(error_chain(e.as_ref())),
            Err(p) => Some(format!("panicked: {}", panic_message(p.as_ref()))),
        };
        if let Some(msg) = failure {
            tracing::warn!(controller = name, error = %msg, backoff_ms = backoff.peek().as_millis() as u64, "controller failed; restarting after backoff");
            set_status(&statuses, name, |s| {
                s.state = ControllerState::Backoff;
                s.restarts += 1;
                s.last_error = Some(msg);
                s.last_reconcile = Some(now_rfc3339());
            });
            wait = Wait::Deadline(Instant::now() + backoff.next_delay());
        }
    }
    set_status(&statuses, name, |s| s.state = ControllerState::Stopped);
}
