//! The controller-resource runtime, after Talos's COSI runtime.
//!
//! ```text
//!   API / config file ──> State["config"] (redb) ──events──> controllers ──> State["host"|"engine"|"frontend"]
//!                                                                  └──> State["ledger"] (redb)
//!                                                               │
//!                                                        sysfs, SPDK, tgtd, kernel initiators
//! ```
//! - [`resource`]: metadata + spec, and the type registry.
//! - [`state`]: the store (get/list/create/update/destroy/watch), `config` persisted.
//! - [`controller`]: the `Controller` trait and the reconcile context.
//! - [`runner`]: supervision: one task per controller, backoff on failure.
//! - `testing` (feature `testing`, tests only): an in-memory runtime and `eventually` for controller tests.

pub mod controller;
pub mod resource;
pub mod runner;
pub mod state;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use controller::{
    ContextError, Controller, ControllerError, Input, Output, OutputKind, ReconcileContext, Requeue,
};
pub use resource::{Column, Metadata, Phase, Resource, Spec, TypeInfo, TypeRegistry, Typed};
pub use runner::{ControllerState, ControllerStatus, Runtime, RuntimeError, RuntimeHandle, Statuses};
pub use state::{Destroyed, Event, EventKind, State, StateError};
