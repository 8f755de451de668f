//! What the proxy's engine operations share with `engine.LonghornController`
//! in this process: a `ReplicaAdd` in progress and the switch of a thin
//! rebuild.
//!
//! ```text
//!   ReplicaAdd ── hold("<engine>/replica-add") ── a second one: "replica add is already in progress"
//!   thin rebuild switch (raid1 down until the export) ── switching ──> ReplicaList's modes from before it
//! ```
//!
//! Reverts, removals, purges and rebuild starts into a replica are not here:
//! they are numbered requests on the instance that the controller carries
//! out, and no operation holds an instance from the controller.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

fn lock<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn held() -> &'static Mutex<BTreeSet<String>> {
    static HELD: OnceLock<Mutex<BTreeSet<String>>> = OnceLock::new();
    HELD.get_or_init(Mutex::default)
}

/// An operation in progress (`<engine>/<operation>`); over when dropped.
#[derive(Debug)]
pub struct Hold(String);

impl Drop for Hold {
    fn drop(&mut self) {
        lock(held()).remove(&self.0);
    }
}

/// Holds `name`, unless an operation holds it already.
pub fn try_hold(name: &str) -> Option<Hold> {
    lock(held())
        .insert(name.to_owned())
        .then(|| Hold(name.to_owned()))
}

/// An engine in a thin rebuild's switch: the replica joining and those in
/// service (by replica name).
#[derive(Debug, Clone)]
pub struct SwitchModes {
    pub joining: String,
    pub in_service: BTreeSet<String>,
}

fn switching() -> &'static Mutex<BTreeMap<String, SwitchModes>> {
    static SWITCHING: OnceLock<Mutex<BTreeMap<String, SwitchModes>>> = OnceLock::new();
    SWITCHING.get_or_init(Mutex::default)
}

/// A thin rebuild's switch of an engine, from raid delete to export: while it
/// lasts the raid is missing or being assembled, and `ReplicaList` reports the
/// modes from before it (the manager must not take the replicas in service
/// for failed). Ends when dropped, or, after [`Switch::keep`], when the
/// engine's raid is there again ([`switch_done`]).
#[derive(Debug)]
pub struct Switch(Option<String>);

impl Switch {
    pub fn start(engine: &str, modes: SwitchModes) -> Switch {
        lock(switching()).insert(engine.to_owned(), modes);
        Switch(Some(engine.to_owned()))
    }

    /// A switch that failed: the modes stay until [`switch_done`].
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        if let Some(e) = self.0.take() {
            lock(switching()).remove(&e);
        }
    }
}

/// The raid of `engine` is there again (after a switch that failed).
pub fn switch_done(engine: &str) {
    lock(switching()).remove(engine);
}

/// The modes an engine had when its switch started, while it lasts.
pub fn switch_of(engine: &str) -> Option<SwitchModes> {
    lock(switching()).get(engine).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_exclusive_until_dropped() {
        let h = try_hold("ops-test-e").expect("first hold");
        assert!(try_hold("ops-test-e").is_none());
        drop(h);
        assert!(try_hold("ops-test-e").is_some());
    }
}
