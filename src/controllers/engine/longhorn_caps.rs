//! Rebuild caps of raid1 rebuilds: the member a rebuild writes carries the
//! engine's `rebuildQosMbps` (SPDK's `bdev_set_qos_limit`) while the rebuild
//! runs; `ReplicaRebuildingQosSet` only changes the spec, and the next
//! reconcile brings the running rebuild's cap to it.
//!
//! ```text
//!   rebuild start, rebuildQosMbps > 0 ──> member capped (once the raid has it open)
//!   rebuild running, cap != rebuildQosMbps ──> capped again (0: lifted)
//!   no rebuild runs, the capped member's rebuild seen (or 10 s gone) ──> lifted
//! ```
//!
//! What this holds is this controller's memory of the caps it set: SPDK
//! reports no QoS limit in a listing the reconcile reads.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A member carrying a rebuild cap: its raid, the cap, since when, and
/// whether its rebuild was seen running.
#[derive(Debug, Clone)]
struct Cap {
    raid: String,
    mbps: u64,
    since: Instant,
    seen: bool,
}

/// The members this controller capped, by member bdev name.
#[derive(Debug, Default)]
pub(super) struct Caps(Mutex<BTreeMap<String, Cap>>);

impl Caps {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Cap>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Member `member` of raid `raid` now carries a cap of `mbps` (0: none).
    pub fn set(&self, raid: &str, member: &str, mbps: u64) {
        let mut all = self.lock();
        if mbps == 0 {
            all.remove(member);
            return;
        }
        let seen = all.get(member).is_some_and(|c| c.seen);
        let cap = Cap {
            raid: raid.to_owned(),
            mbps,
            since: Instant::now(),
            seen,
        };
        all.insert(member.to_owned(), cap);
    }

    /// The cap member `member` carries (0: none).
    pub fn of(&self, member: &str) -> u64 {
        self.lock().get(member).map_or(0, |c| c.mbps)
    }

    /// The rebuild into capped member `member` was seen running.
    pub fn seen(&self, member: &str) {
        if let Some(c) = self.lock().get_mut(member) {
            c.seen = true;
        }
    }

    /// The capped members of raid `raid` whose cap may be lifted when no
    /// rebuild runs: their rebuild was seen running, or was started `grace`
    /// ago (SPDK reports a raid's rebuild a moment after the member was
    /// added).
    pub fn liftable(&self, raid: &str, grace: Duration) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, c)| c.raid == raid && (c.seen || c.since.elapsed() >= grace))
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// The capped members of raid `raid`, whatever their state.
    pub fn all_of(&self, raid: &str) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, c)| c.raid == raid)
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// Forgets the cap of `member` (lifted, or the member is gone).
    pub fn forget(&self, member: &str) {
        self.lock().remove(member);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cap is liftable once its rebuild was seen or the grace is over;
    /// one set to 0 is gone; a changed cap keeps "seen".
    #[test]
    fn caps_are_lifted_after_their_rebuild_was_seen() {
        let caps = Caps::default();
        caps.set("e", "m", 8);
        assert_eq!(caps.of("m"), 8);
        assert!(caps.liftable("e", Duration::from_secs(60)).is_empty());
        assert_eq!(caps.liftable("e", Duration::ZERO), ["m"]);
        caps.seen("m");
        caps.set("e", "m", 16);
        assert_eq!(caps.liftable("e", Duration::from_secs(60)), ["m"]);
        assert_eq!(caps.all_of("e"), ["m"]);
        assert!(caps.all_of("other").is_empty());
        caps.set("e", "m", 0);
        assert_eq!(caps.of("m"), 0);
        assert!(caps.all_of("e").is_empty());
    }
}
