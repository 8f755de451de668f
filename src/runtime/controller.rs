//! Controllers: what they read, what they own, and the context a reconcile
//! works through (which enforces declared outputs and tracks what was written).
//!
//! ```text
//!   inputs changed ──> reconcile(ctx) ──ctx.apply/destroy──> State (outputs only)
//!                          │ Ok: outputs this controller owns but did not apply are destroyed
//!                          └ Err/panic: runtime backs off and runs it again
//! ```

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::resource::{Spec, Typed};
use super::state::{State, StateError};

/// The error a reconcile returns; the runtime logs it and backs off.
pub type ControllerError = Box<dyn std::error::Error + Send + Sync>;

/// A resource type a controller reads; a change to one triggers a reconcile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// Namespace of the type.
    pub namespace: String,
    /// The type.
    #[serde(rename = "type")]
    pub type_: String,
}

impl Input {
    /// The input of a spec type.
    pub fn of<S: Spec>() -> Self {
        Self {
            namespace: S::NAMESPACE.to_string(),
            type_: S::TYPE.to_string(),
        }
    }
}

/// How a controller owns an output type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputKind {
    /// The only writer of the type.
    Exclusive,
    /// One of several writers; each owns the resources it created.
    Shared,
}

/// A resource type a controller writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Output {
    /// Namespace of the type.
    pub namespace: String,
    /// The type.
    #[serde(rename = "type")]
    pub type_: String,
    /// Exclusive or shared.
    pub kind: OutputKind,
}

impl Output {
    /// Exclusive ownership of a spec type.
    pub fn exclusive<S: Spec>() -> Self {
        Self {
            namespace: S::NAMESPACE.to_string(),
            type_: S::TYPE.to_string(),
            kind: OutputKind::Exclusive,
        }
    }

    /// Shared ownership of a spec type.
    pub fn shared<S: Spec>() -> Self {
        Self {
            namespace: S::NAMESPACE.to_string(),
            type_: S::TYPE.to_string(),
            kind: OutputKind::Shared,
        }
    }
}

/// When to run the next reconcile besides input changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Only when an input changes.
    OnInputChange,
    /// Also after this long (polling status controllers).
    After(Duration),
}

/// A refused write by a controller.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("controller {controller} did not declare {type_} as an output")]
    UndeclaredOutput { controller: String, type_: String },
    #[error("controller {controller} did not declare {type_} as an input")]
    UndeclaredInput { controller: String, type_: String },
    #[error(transparent)]
    State(#[from] StateError),
}

/// A controller: declares inputs and outputs, and reconciles.
#[async_trait::async_trait]
pub trait Controller: Send + Sync + 'static {
    /// `subsystem.ThingController`.
    fn name(&self) -> &'static str;
    /// Types whose changes trigger a reconcile.
    fn inputs(&self) -> Vec<Input>;
    /// Types this controller writes.
    fn outputs(&self) -> Vec<Output>;
    /// Brings outputs in line with inputs and the world.
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError>;
}

/// What a reconcile reads and writes through.
#[derive(Debug)]
pub struct ReconcileContext {
    state: State,
    name: &'static str,
    inputs: Vec<Input>,
    outputs: Vec<Output>,
    applied: BTreeSet<(String, String)>,
}

impl ReconcileContext {
    pub(crate) fn new(state: State, name: &'static str, inputs: Vec<Input>, outputs: Vec<Output>) -> Self {
        Self {
            state,
            name,
            inputs,
            outputs,
            applied: BTreeSet::new(),
        }
    }

    /// The controller's name (the owner of what it writes).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The store, for reads this context has no helper for.
    pub fn state(&self) -> &State {
        &self.state
    }

    fn check_output<S: Spec>(&self) -> Result<(), ContextError> {
        if self
            .outputs
            .iter()
            .any(|o| o.type_ == S::TYPE && o.namespace == S::NAMESPACE)
        {
            Ok(())
        } else {
            Err(ContextError::UndeclaredOutput {
                controller: self.name.to_string(),
                type_: S::TYPE.to_string(),
            })
        }
    }

    fn check_input<S: Spec>(&self) -> Result<(), ContextError> {
        if self
            .inputs
            .iter()
            .any(|o| o.type_ == S::TYPE && o.namespace == S::NAMESPACE)
        {
            Ok(())
        } else {
            Err(ContextError::UndeclaredInput {
                controller: self.name.to_string(),
                type_: S::TYPE.to_string(),
            })
        }
    }

    /// Every resource of a type.
    pub fn list<S: Spec>(&self) -> Result<Vec<Typed<S>>, ContextError> {
        Ok(self.state.list_typed::<S>()?)
    }

    /// One resource.
    pub fn get<S: Spec>(&self, id: &str) -> Result<Option<Typed<S>>, ContextError> {
        Ok(self.state.get_typed::<S>(id)?)
    }

    /// Creates or updates an output (a write that changes nothing is skipped), and
    /// marks it as produced by this reconcile.
    pub fn apply<S: Spec>(&mut self, id: &str, spec: S) -> Result<(), ContextError> {
        self.check_output::<S>()?;
        self.applied.insert((S::TYPE.to_string(), id.to_string()));
        let value = serde_json::to_value(&spec).map_err(|source| StateError::Decode {
            type_: S::TYPE.to_string(),
            id: id.to_string(),
            source,
        })?;
        // the usual case in a pass over many instances: nothing changed
        if self.state.holds(S::NAMESPACE, S::TYPE, id, self.name, &value) {
            return Ok(());
        }
        if self.state.contains(S::NAMESPACE, S::TYPE, id) {
            self.state
                .update(S::NAMESPACE, S::TYPE, id, self.name, None, |r| r.spec = value)?;
        } else {
            self.state
                .create(S::NAMESPACE, S::TYPE, id, self.name, value, Default::default())?;
        }
        Ok(())
    }

    /// Destroys an output now.
    pub fn destroy<S: Spec>(&mut self, id: &str) -> Result<(), ContextError> {
        self.check_output::<S>()?;
        self.applied.remove(&(S::TYPE.to_string(), id.to_string()));
        match self.state.destroy(S::NAMESPACE, S::TYPE, id, self.name) {
            Ok(_) | Err(StateError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Holds an input resource: a user delete only marks it tearing-down until the
    /// finalizer (this controller's name) is removed.
    pub fn add_finalizer<S: Spec>(&self, id: &str) -> Result<(), ContextError> {
        self.check_input::<S>()?;
        let has = self
            .state
            .get(S::NAMESPACE, S::TYPE, id)
            .is_some_and(|r| r.metadata.finalizers.contains(self.name));
        if !has {
            self.state.add_finalizer(S::NAMESPACE, S::TYPE, id, self.name)?;
        }
        Ok(())
    }

    /// Releases an input resource held by [`Self::add_finalizer`].
    pub fn remove_finalizer<S: Spec>(&self, id: &str) -> Result<(), ContextError> {
        self.check_input::<S>()?;
        Ok(self
            .state
            .remove_finalizer(S::NAMESPACE, S::TYPE, id, self.name)?)
    }

    /// After a clean reconcile: destroys outputs this controller owns that the
    /// reconcile did not apply.
    pub(crate) fn cleanup_outputs(&mut self) -> Result<usize, StateError> {
        let mut removed = 0;
        for out in &self.outputs {
            for id in self.state.owned_ids(&out.namespace, &out.type_, self.name) {
                if !self.applied.contains(&(out.type_.clone(), id.clone())) {
                    match self.state.destroy(&out.namespace, &out.type_, &id, self.name) {
                        Ok(_) | Err(StateError::NotFound { .. }) => removed += 1,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        self.applied.clear();
        Ok(removed)
    }
}
