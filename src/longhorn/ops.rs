//! What the proxy's engine operations share with `engine.LonghornController`
//! in this process: instances an operation holds (the controller leaves them
//! alone until it is done), member bdevs capped for a rebuild, and the
//! switch of a thin rebuild.
//!
//! ```text
//!   RebuildingSrcCopyStart (a head made again) ── hold(replica) ──> controller skips it
//!   ReplicaAdd ── hold("<engine>/replica-add") ── a second one: "replica add is already in progress"
//!   rebuild start (bdev_set_qos_limit on the target) ── capped ──> lifted when the raid's rebuild ends
//! ```
//!
//! Reverts, removals and purges are not here: they are numbered requests on
//! the instance that the controller carries out.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

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

/// A member carrying a rebuild cap: its raid, since when, and whether its
/// rebuild was seen running.
#[derive(Debug, Clone)]
struct Cap {
    raid: String,
    since: Instant,
    seen: bool,
}

fn capped() -> &'static Mutex<BTreeMap<String, Cap>> {
    static CAPPED: OnceLock<Mutex<BTreeMap<String, Cap>>> = OnceLock::new();
    CAPPED.get_or_init(Mutex::default)
}

/// Records that member bdev `member` of raid `raid` carries a rebuild cap.
pub fn mark_capped(raid: &str, member: &str) {
    let cap = Cap {
        raid: raid.to_owned(),
        since: Instant::now(),
        seen: false,
    };
    lock(capped()).insert(member.to_owned(), cap);
}

/// Records that the rebuild into capped member `member` was seen running.
pub fn seen_rebuilding(member: &str) {
    if let Some(c) = lock(capped()).get_mut(member) {
        c.seen = true;
    }
}

/// The capped members of raid `raid` whose cap may be lifted when no
/// rebuild runs: their rebuild was seen running, or was started `grace`
/// ago (SPDK reports a raid's rebuild a moment after the member was added).
pub fn capped_of(raid: &str, grace: Duration) -> Vec<String> {
    lock(capped())
        .iter()
        .filter(|(_, c)| c.raid == raid && (c.seen || c.since.elapsed() >= grace))
        .map(|(m, _)| m.clone())
        .collect()
}

/// Whether member `member` carries a rebuild cap.
pub fn is_capped(member: &str) -> bool {
    lock(capped()).contains_key(member)
}

/// The capped members of raid `raid`, whatever their state.
pub fn all_capped_of(raid: &str) -> Vec<String> {
    lock(capped())
        .iter()
        .filter(|(_, c)| c.raid == raid)
        .map(|(m, _)| m.clone())
        .collect()
}

/// Forgets the cap of `member` (lifted).
pub fn uncap(member: &str) {
    lock(capped()).remove(member);
}

/// Caps (or with 0 lifts) the reads and writes of bdev `bdev` at `mbps`
/// MB/s (SPDK's `bdev_set_qos_limit` rw_mbytes_per_sec; SPDK counts MiB).
pub async fn set_rebuild_cap(
    client: &crate::spdk::SpdkClient,
    bdev: &str,
    mbps: u64,
) -> Result<(), crate::spdk::ClientError> {
    client
        .bdev_set_qos_limit(&crate::spdk::rpc::QosLimit {
            name: bdev.to_owned(),
            rw_mbytes_per_sec: mbps,
        })
        .await
        .map(|_| ())
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
