//! What the proxy's engine operations share with `engine.LonghornController`
//! in this process: instances an operation holds (the controller leaves them
//! alone until it is done), member bdevs capped for a rebuild, and the last
//! snapshot purge of each engine.
//!
//! ```text
//!   SnapshotRevert / ReplicaRemove ── hold(engine), hold(local replicas) ──> controller skips them
//!   ReplicaAdd ── hold("<engine>/replica-add") ── a second one: "replica add is already in progress"
//!   rebuild start (bdev_set_qos_limit on the target) ── capped ──> lifted when the raid's rebuild ends
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

fn lock<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn held() -> &'static Mutex<BTreeSet<String>> {
    static HELD: OnceLock<Mutex<BTreeSet<String>>> = OnceLock::new();
    HELD.get_or_init(Mutex::default)
}

/// An instance (or `<engine>/<operation>`) held by an operation; released
/// when dropped.
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

/// Whether an operation holds `name` (the controller then leaves it alone).
pub fn is_held(name: &str) -> bool {
    lock(held()).contains(name)
}

fn capped() -> &'static Mutex<BTreeMap<String, String>> {
    static CAPPED: OnceLock<Mutex<BTreeMap<String, String>>> = OnceLock::new();
    CAPPED.get_or_init(Mutex::default)
}

/// Records that member bdev `member` of raid `raid` carries a rebuild cap.
pub fn mark_capped(raid: &str, member: &str) {
    lock(capped()).insert(member.to_owned(), raid.to_owned());
}

/// The capped members of raid `raid`.
pub fn capped_of(raid: &str) -> Vec<String> {
    lock(capped())
        .iter()
        .filter(|(_, r)| *r == raid)
        .map(|(m, _)| m.clone())
        .collect()
}

/// Forgets the cap of `member` (lifted).
pub fn uncap(member: &str) {
    lock(capped()).remove(member);
}

/// The last snapshot purge of an engine, per replica address: (error, if any).
pub type PurgeResult = BTreeMap<String, Option<String>>;

fn purges() -> &'static Mutex<BTreeMap<String, PurgeResult>> {
    static PURGES: OnceLock<Mutex<BTreeMap<String, PurgeResult>>> = OnceLock::new();
    PURGES.get_or_init(Mutex::default)
}

/// Records engine `engine`'s last purge.
pub fn set_purge(engine: &str, result: PurgeResult) {
    lock(purges()).insert(engine.to_owned(), result);
}

/// Engine `engine`'s last purge.
pub fn purge_of(engine: &str) -> PurgeResult {
    lock(purges()).get(engine).cloned().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_exclusive_until_dropped() {
        let h = try_hold("ops-test-e").expect("first hold");
        assert!(is_held("ops-test-e"));
        assert!(try_hold("ops-test-e").is_none());
        drop(h);
        assert!(!is_held("ops-test-e"));
        assert!(try_hold("ops-test-e").is_some());
    }
}
