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
//! What [`Caps`] holds is this controller's memory of the caps it set, for
//! the grace and "seen" rules. SPDK lists the cap a bdev carries
//! (`bdev_get_bdevs` `assigned_rate_limits`), and [`observed`] reads it: a
//! cap the memory does not know (set before a restart of talon, whose
//! rebuild ended while talon was down) is lifted too, or it would throttle
//! the volume's writes for good.

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

/// The members of raid `raid` that carry a rebuild cap as SPDK lists them
/// (`rw_mbytes_per_sec` > 0), each by the name the raid lists and, when
/// known, the lvol alias the cap was set on.
pub(super) fn observed(inv: &crate::spdk::volume::Inventory, raid: &str) -> Vec<(String, Option<String>)> {
    let Some(r) = inv.raid(raid) else {
        return Vec::new();
    };
    r.base_bdevs_list
        .iter()
        .filter_map(|b| b.name.clone())
        .filter(|n| {
            inv.bdevs
                .get(n)
                .and_then(|b| b.assigned_rate_limits.as_ref())
                .is_some_and(|l| l.rw_mbytes_per_sec > 0)
        })
        .map(|n| {
            let alias = inv
                .lvols
                .iter()
                .find(|(_, l)| l.uuid == n)
                .map(|(a, _)| a.clone());
            (n, alias)
        })
        .collect()
}

/// What to lift when no rebuild runs: the caps the memory says may go, and
/// every cap SPDK lists on a member the memory does not know.
pub(super) fn to_lift(
    liftable: Vec<String>,
    known: &[String],
    observed: &[(String, Option<String>)],
) -> Vec<String> {
    let mut out = liftable;
    for (name, alias) in observed {
        let knows = known.iter().any(|k| k == name || Some(k) == alias.as_ref());
        if !knows && !out.contains(name) {
            out.push(name.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a restart the memory is empty: a cap SPDK still lists is lifted;
    /// a cap the memory knows waits for its grace.
    #[test]
    fn a_cap_from_before_a_restart_is_lifted_a_known_one_waits() {
        let seen = [("uuid-m".to_owned(), Some("lvs/m".to_owned()))];
        assert_eq!(to_lift(Vec::new(), &[], &seen), ["uuid-m"]);
        assert!(to_lift(Vec::new(), &["lvs/m".to_owned()], &seen).is_empty());
        assert_eq!(
            to_lift(vec!["lvs/m".to_owned()], &["lvs/m".to_owned()], &seen),
            ["lvs/m"]
        );
    }

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
