//! Replica placement: which disk each replica of a V2 volume lives on. One
//! pure function, [`place`]: no SPDK calls, no clock, no randomness; the
//! volume operations ([`super::volume::VolumeOps`]) call it with what the
//! inventory and the disk statuses say, then create what it decides.
//!
//! ```text
//!   ready disks (lvstore present, free bytes) ─┐
//!   disks away (not ready yet, or failed: why) ┤
//!   each disk's block size ────────────────────┤
//!   disks the volume lists (empty: any) ───────┼─> place ─> replica k: Exists(d) | Create(d)
//!   replicas that exist (k -> disk) ───────────┤                      | WaitFor(d) | Unplaced
//!   replicas placed before (k -> disk) ────────┤            + Blocked {which, why, a disk failed?}
//!   clone: replica k pinned to its snapshot's disk
//! ```
//!
//! The rules, each tested for every order in which disks appear, fail and
//! come back (see the tests at the bottom):
//! - an existing replica stays where it is; a replica placed before on a disk
//!   that is away is waited for there (it may hold the newest data), never
//!   made again elsewhere;
//! - a new replica goes on a ready disk that holds no other replica of the
//!   volume (existing, being created, or waited for), is not full (the overcommit
//!   bound: what its thin replicas promise), and only on a listed
//!   disk when the volume lists disks; among those, the most free bytes wins
//!   (ties: the first name);
//! - every replica of a volume has one block size: SPDK's raid1 refuses
//!   members of different block sizes (`bdev_raid_create` -22 on a real
//!   v26.05 target), so a volume on a 512 B disk and a 4 KiB disk could
//!   never be served. A new replica goes to a disk of the block size of the
//!   replicas that exist; a new volume takes the block size whose disks
//!   can hold all its replicas (the one of the disk with the most free
//!   bytes among those that can);
//! - a volume that has no replica yet is placed whole or not at all: it
//!   waits until every replica has its own disk, rather than starting with
//!   fewer replicas (which would then be rebuilt block by block);
//! - when a replica cannot be placed, [`Blocked`] says why, naming each
//!   disk that could have taken it and what is wrong with it; `disk_failed`
//!   is set when a failed disk is among them, so a wait fails at once with the
//!   disk's error instead of running into its timeout;
//! - a clone's replica k lives where snapshot k of the source lives (SPDK
//!   clones inside the snapshot's lvstore); the source's placement already
//!   kept those apart.

use std::collections::{BTreeMap, BTreeSet};

/// How far the thin replicas on one disk may promise past its capacity by default, percent.
pub const DEFAULT_OVERCOMMIT_PERCENT: u32 = 500;

/// Why a configured disk is not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskAway {
    /// Coming up (no status yet, or being created/imported): its lvstore
    /// may be listed before all its lvols are opened.
    Pending(String),
    /// Being removed (its lvols, all opened, stay listed until it is gone).
    Removing(String),
    /// Failed; the disk's error.
    Failed(String),
}

/// Where one replica goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// Its lvol exists on this disk.
    Exists(String),
    /// Create it on this disk.
    Create(String),
    /// Placed before on this disk, which is away: wait for it.
    WaitFor(String),
    /// No disk can take it now ([`Placement::blocked`] says why).
    Unplaced,
}

impl Slot {
    /// The disk of the slot, if it has one.
    pub fn disk(&self) -> Option<&str> {
        match self {
            Slot::Exists(d) | Slot::Create(d) | Slot::WaitFor(d) => Some(d),
            Slot::Unplaced => None,
        }
    }
}

/// Replicas that could not be placed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The replicas (k) without a disk.
    pub replicas: Vec<usize>,
    /// A sentence: what is needed and what each candidate disk lacks.
    pub reason: String,
    /// A failed disk is among the candidates (its error is in `reason`).
    pub disk_failed: bool,
    /// A ready disk of another block size than the volume's is among the
    /// candidates (named in `reason`).
    pub other_block_size: bool,
}

impl Blocked {
    /// Whether a wait for the placement fails at once rather than running
    /// into its timeout: a candidate disk failed, or is of another block
    /// size (either needs the operator; the volume is still placed as soon
    /// as a disk that fits is ready).
    pub fn fails_now(&self) -> bool {
        self.disk_failed || self.other_block_size
    }
}

/// What [`place`] decided.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// Replica k -> its slot, for every wanted replica.
    pub slots: BTreeMap<usize, Slot>,
    /// Set when some replica is [`Slot::Unplaced`].
    pub blocked: Option<Blocked>,
}

/// What [`place`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The replicas wanted here (k): `0..replicas`, or the one replica a node serves.
    pub wanted: &'a [usize],
    /// Disks the volume may use; empty: any.
    pub listed: &'a [String],
    /// Disks whose lvstore is present, with free bytes.
    pub ready: &'a BTreeMap<String, u64>,
    /// The block size of each disk's lvstore (a disk not listed: not known,
    /// any block size goes).
    pub block_size: &'a BTreeMap<String, u32>,
    /// Configured disks that are not ready, and why.
    pub away: &'a BTreeMap<String, DiskAway>,
    /// Ready disks that cannot take a new replica (the overcommit bound), and why.
    pub full: &'a BTreeMap<String, String>,
    /// Replicas whose lvol exists (k -> disk).
    pub existing: &'a BTreeMap<usize, String>,
    /// Where replicas were placed before (k -> disk), from the ledger and
    /// the last statuses.
    pub placed: &'a BTreeMap<usize, String>,
    /// A clone: replica k -> the disk of the source's snapshot k (a replica
    /// with no snapshot is not made: the source had fewer replicas).
    pub clone_of: Option<&'a BTreeMap<usize, String>>,
}

/// Decides where every wanted replica lives (see the module docs for the rules).
pub fn place(req: &Request<'_>) -> Placement {
    let mut slots: BTreeMap<usize, Slot> = BTreeMap::new();
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    let mut open = Vec::new();
    for &k in req.wanted {
        if let Some(d) = req.existing.get(&k) {
            slots.insert(k, Slot::Exists(d.clone()));
            taken.entry(d.clone()).or_insert(k);
        } else if let Some(d) = req.placed.get(&k).filter(|d| !req.ready.contains_key(*d)) {
            slots.insert(k, Slot::WaitFor(d.clone()));
            taken.entry(d.clone()).or_insert(k);
        } else {
            open.push(k);
        }
    }
    let fresh = slots.is_empty();
    let allowed = |d: &str| req.listed.is_empty() || req.listed.iter().any(|l| l == d);
    let known = |d: &str| req.block_size.get(d).copied();
    // the volume's block size: its replicas' (the first known), else the
    // one whose disks can take every replica
    let mut want = slots.values().filter_map(Slot::disk).find_map(known);
    if want.is_none() && req.clone_of.is_none() {
        want = block_size_for(req, &taken, open.len(), &allowed);
    }
    let fits = |d: &str, want: Option<u32>| want.is_none_or(|w| known(d).is_none_or(|b| b == w));
    let mut unplaced = Vec::new();
    for k in open {
        if let Some(pins) = req.clone_of {
            if let Some(d) = pins.get(&k) {
                slots.insert(k, Slot::Create(d.clone()));
                taken.entry(d.clone()).or_insert(k);
            }
            continue;
        }
        let best = req
            .ready
            .iter()
            .filter(|(d, _)| {
                allowed(d) && !taken.contains_key(*d) && !req.full.contains_key(*d) && fits(d, want)
            })
            .max_by(|(da, fa), (db, fb)| most_free((da, fa), (db, fb)));
        match best {
            Some((d, _)) => {
                want = want.or_else(|| known(d));
                slots.insert(k, Slot::Create(d.clone()));
                taken.insert(d.clone(), k);
            }
            None => {
                slots.insert(k, Slot::Unplaced);
                unplaced.push(k);
            }
        }
    }
    if unplaced.is_empty() {
        return Placement { slots, blocked: None };
    }
    if fresh {
        // placed whole or not at all
        for s in slots.values_mut() {
            *s = Slot::Unplaced;
        }
        unplaced = slots.keys().copied().collect();
    }
    let blocked = blocked(req, &slots, &taken, unplaced, want);
    Placement {
        slots,
        blocked: Some(blocked),
    }
}

/// The order in which free disks are taken: the most free bytes, then the
/// first name.
fn most_free(a: (&String, &u64), b: (&String, &u64)) -> std::cmp::Ordering {
    a.1.cmp(b.1).then_with(|| b.0.cmp(a.0))
}

/// The block size a volume with no replica takes for its `n` new ones: of
/// the block sizes whose free disks (allowed, not taken, not full) number
/// `n` or more, the one of the disk taken first ([`most_free`]); when none
/// has enough, that of the disk taken first (the volume then waits, saying
/// so). `None`: no disk's block size is known.
fn block_size_for(
    req: &Request<'_>,
    taken: &BTreeMap<String, usize>,
    n: usize,
    allowed: &dyn Fn(&str) -> bool,
) -> Option<u32> {
    let mut groups: BTreeMap<u32, Vec<(&String, &u64)>> = BTreeMap::new();
    for (d, free) in req.ready {
        if allowed(d)
            && !taken.contains_key(d)
            && !req.full.contains_key(d)
            && let Some(b) = req.block_size.get(d)
        {
            groups.entry(*b).or_default().push((d, free));
        }
    }
    // each block size: its disk taken first, and how many it has
    let firsts: Vec<(u32, usize, (&String, &u64))> = groups
        .iter()
        .filter_map(|(b, v)| {
            let first = v.iter().copied().max_by(|x, y| most_free(*x, *y))?;
            Some((*b, v.len(), first))
        })
        .collect();
    let by_first =
        |x: &&(u32, usize, (&String, &u64)), y: &&(u32, usize, (&String, &u64))| most_free(x.2, y.2);
    firsts
        .iter()
        .filter(|(_, len, _)| *len >= n)
        .max_by(by_first)
        .or_else(|| firsts.iter().max_by(by_first))
        .map(|(b, _, _)| *b)
}

fn blocked(
    req: &Request<'_>,
    slots: &BTreeMap<usize, Slot>,
    taken: &BTreeMap<String, usize>,
    unplaced: Vec<usize>,
    want: Option<u32>,
) -> Blocked {
    let names: Vec<String> = unplaced.iter().map(|k| format!("r{k}")).collect();
    let need = slots.len();
    let mut candidates: BTreeSet<&str> = req.ready.keys().map(String::as_str).collect();
    candidates.extend(req.away.keys().map(String::as_str));
    candidates.extend(req.listed.iter().map(String::as_str));
    if !req.listed.is_empty() {
        candidates.retain(|d| req.listed.iter().any(|l| l == d));
    }
    let mut failed = false;
    let mut other_size = false;
    let mut parts = Vec::new();
    for d in &candidates {
        let holder = taken
            .get(*d)
            .filter(|k| slots.get(k).is_some_and(|s| s.disk() == Some(d)));
        let what = match (holder, req.ready.contains_key(*d), req.away.get(*d)) {
            (Some(k), _, _) => format!("{d} holds r{k}"),
            (None, true, _) if req.full.contains_key(*d) => format!("{d} is full: {}", req.full[*d]),
            (None, true, _) if want.is_some_and(|w| req.block_size.get(*d).is_some_and(|b| *b != w)) => {
                other_size = true;
                format!(
                    "{d} has {}-byte blocks, not the {}-byte blocks of the volume's replicas",
                    req.block_size[*d],
                    want.unwrap_or_default()
                )
            }
            (None, true, _) => format!("{d} is ready"),
            (None, false, Some(DiskAway::Failed(m))) => {
                failed = true;
                format!("{d} failed: {m}")
            }
            (None, false, Some(DiskAway::Pending(m))) => format!("{d} is not ready yet ({m})"),
            (None, false, Some(DiskAway::Removing(m))) => format!("{d} is {m}"),
            (None, false, None) => format!("{d} is not configured"),
        };
        parts.push(what);
    }
    let scope = if req.listed.is_empty() {
        "configured disks".to_owned()
    } else {
        format!("listed disks ({})", req.listed.join(", "))
    };
    let disks = if parts.is_empty() {
        "there are none".to_owned()
    } else {
        parts.join("; ")
    };
    let hint = if other_size {
        " (SPDK's raid1 takes no members of two block sizes: add a disk of the volume's block size, \
         or list disks of one block size in the volume's `disks`)"
    } else {
        ""
    };
    Blocked {
        reason: format!(
            "{} of {need} replica(s) ({}) cannot be placed: every replica needs its own ready disk, all of one block size, among the {scope}, and {disks}{hint}",
            unplaced.len(),
            names.join(", "),
        ),
        replicas: unplaced,
        disk_failed: failed,
        other_block_size: other_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn two_replicas_never_share_the_only_ready_disk() {
        let ready = BTreeMap::from([("ram0".to_string(), 100)]);
        let away = BTreeMap::from([("ram1".to_string(), DiskAway::Failed("no such device".into()))]);
        let none = BTreeMap::new();
        let listed = s(&["ram0", "ram1"]);
        let p = place(&Request {
            wanted: &[0, 1],
            listed: &listed,
            ready: &ready,
            block_size: &BTreeMap::new(),
            away: &away,
            full: &BTreeMap::new(),
            existing: &none,
            placed: &none,
            clone_of: None,
        });
        assert_eq!(p.slots.values().filter(|s| **s == Slot::Unplaced).count(), 2);
        let b = p.blocked.expect("blocked");
        assert!(b.disk_failed);
        assert!(b.reason.contains("ram1 failed: no such device"), "{}", b.reason);
        assert!(b.reason.contains("ram0 is ready"), "{}", b.reason);
    }

    #[test]
    fn the_replicas_of_a_volume_have_one_block_size() {
        // b has the most free bytes but 512 B blocks; a and c have 4 KiB
        let ready = BTreeMap::from([
            ("a".to_string(), 50),
            ("b".to_string(), 900),
            ("c".to_string(), 10),
        ]);
        let bs = BTreeMap::from([
            ("a".to_string(), 4096),
            ("b".to_string(), 512),
            ("c".to_string(), 4096),
        ]);
        let none = BTreeMap::new();
        let req = |wanted: &'static [usize], existing: &'static [(usize, &'static str)]| {
            let existing: BTreeMap<usize, String> =
                existing.iter().map(|(k, d)| (*k, d.to_string())).collect();
            place(&Request {
                wanted,
                listed: &[],
                ready: &ready,
                block_size: &bs,
                away: &none_away(),
                full: &BTreeMap::new(),
                existing: &existing,
                placed: &none,
                clone_of: None,
            })
        };
        // a new volume of two: the block size two disks have, not the freest disk's
        let p = req(&[0, 1], &[]);
        assert_eq!(p.slots[&0], Slot::Create("a".into()), "{p:?}");
        assert_eq!(p.slots[&1], Slot::Create("c".into()), "{p:?}");
        // of one: the freest disk
        assert_eq!(req(&[0], &[]).slots[&0], Slot::Create("b".into()));
        // a replica added beside one on b: no other 512 B disk, so it waits, saying why
        let p = req(&[0, 1], &[(0, "b")]);
        assert_eq!(p.slots[&1], Slot::Unplaced);
        let reason = p.blocked.expect("blocked").reason;
        assert!(
            reason.contains("a has 4096-byte blocks, not the 512-byte blocks of the volume's replicas"),
            "{reason}"
        );
        // beside one on c: a (4 KiB), although b has more free bytes
        assert_eq!(req(&[0, 1], &[(0, "c")]).slots[&1], Slot::Create("a".into()));
        // a new volume of three: no block size has three disks, so it waits whole
        let p = req(&[0, 1, 2], &[]);
        assert!(p.slots.values().all(|s| *s == Slot::Unplaced), "{p:?}");
        assert!(
            p.blocked
                .expect("blocked")
                .reason
                .contains("all of one block size")
        );
    }

    fn none_away() -> BTreeMap<String, DiskAway> {
        BTreeMap::new()
    }

    #[test]
    fn a_full_disk_takes_no_new_replica_and_is_named() {
        // the most free bytes, but its thin replicas already promise past the bound
        let ready = BTreeMap::from([("a".to_string(), 900), ("b".to_string(), 10)]);
        let full = BTreeMap::from([("a".to_string(), "the replicas would promise 6 GiB".to_string())]);
        let none = BTreeMap::new();
        let away = BTreeMap::new();
        let sizes = BTreeMap::new();
        let req = |wanted: &'static [usize]| Request {
            wanted,
            listed: &[],
            ready: &ready,
            block_size: &sizes,
            away: &away,
            full: &full,
            existing: &none,
            placed: &none,
            clone_of: None,
        };
        let p = place(&req(&[0]));
        assert_eq!(p.slots[&0], Slot::Create("b".into()));
        let p = place(&req(&[0, 1]));
        let b = p.blocked.expect("blocked");
        assert!(
            b.reason.contains("a is full: the replicas would promise 6 GiB"),
            "{}",
            b.reason
        );
        assert!(!b.disk_failed);
    }

    #[test]
    fn an_existing_volume_gets_what_can_be_placed() {
        let ready = BTreeMap::from([("a".to_string(), 10), ("b".to_string(), 5)]);
        let away = BTreeMap::new();
        let existing = BTreeMap::from([(0, "a".to_string())]);
        let p = place(&Request {
            wanted: &[0, 1, 2],
            listed: &[],
            ready: &ready,
            block_size: &BTreeMap::new(),
            away: &away,
            full: &BTreeMap::new(),
            existing: &existing,
            placed: &BTreeMap::new(),
            clone_of: None,
        });
        assert_eq!(p.slots[&0], Slot::Exists("a".into()));
        assert_eq!(p.slots[&1], Slot::Create("b".into()));
        assert_eq!(p.slots[&2], Slot::Unplaced);
        let b = p.blocked.expect("blocked");
        assert_eq!(b.replicas, vec![2]);
        assert!(!b.disk_failed);
        assert!(b.reason.contains("a holds r0; b holds r1"), "{}", b.reason);
    }

    #[test]
    fn most_free_wins_and_ties_go_to_the_first_name() {
        let ready = BTreeMap::from([("a".to_string(), 5), ("b".to_string(), 9), ("c".to_string(), 9)]);
        let none = BTreeMap::new();
        let p = place(&Request {
            wanted: &[0],
            listed: &[],
            ready: &ready,
            block_size: &BTreeMap::new(),
            away: &BTreeMap::new(),
            full: &BTreeMap::new(),
            existing: &none,
            placed: &none,
            clone_of: None,
        });
        assert_eq!(p.slots[&0], Slot::Create("b".into()));
    }

    #[test]
    fn a_clone_follows_its_snapshots() {
        let ready = BTreeMap::from([("a".to_string(), 5), ("b".to_string(), 9)]);
        let none = BTreeMap::new();
        let pins = BTreeMap::from([(0, "a".to_string())]);
        let p = place(&Request {
            wanted: &[0, 1],
            listed: &[],
            ready: &ready,
            block_size: &BTreeMap::new(),
            away: &BTreeMap::new(),
            full: &BTreeMap::new(),
            existing: &none,
            placed: &none,
            clone_of: Some(&pins),
        });
        assert_eq!(p.slots, BTreeMap::from([(0, Slot::Create("a".into()))]));
        assert!(p.blocked.is_none());
    }

    // ---- every order of disk events ------------------------------------------------

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Ev {
        /// The disk's lvstore is there.
        Up(usize),
        /// The disk controller reports it failed.
        Fail(usize),
        /// Gone (target restart, pulled): not ready, no error yet.
        Gone(usize),
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum St {
        Unknown,
        Ready,
        Failed,
        Gone,
    }

    const DISKS: [&str; 3] = ["d0", "d1", "d2"];

    struct Case {
        replicas: usize,
        listed: Vec<String>,
        /// Each disk's block size (`None`: not known, as before the rule).
        sizes: Option<[u32; 3]>,
    }

    /// One simulated node: disk states, replicas made so far (k -> disk).
    #[derive(Clone)]
    struct World {
        disks: [St; 3],
        placed: BTreeMap<usize, String>,
        /// Free bytes per disk: shrinks with each replica, so "most free" moves.
        free: [u64; 3],
    }

    fn step(case: &Case, w: &mut World, trail: &[Ev]) {
        let ready: BTreeMap<String, u64> = (0..3)
            .filter(|i| w.disks[*i] == St::Ready)
            .map(|i| (DISKS[i].to_owned(), w.free[i]))
            .collect();
        let away: BTreeMap<String, DiskAway> = (0..3)
            .filter_map(|i| match w.disks[i] {
                St::Ready => None,
                St::Failed => Some((DISKS[i].to_owned(), DiskAway::Failed(format!("E-{}", DISKS[i])))),
                St::Unknown | St::Gone => Some((DISKS[i].to_owned(), DiskAway::Pending("coming up".into()))),
            })
            .collect();
        // an lvol is seen only while its disk is ready
        let existing: BTreeMap<usize, String> = w
            .placed
            .iter()
            .filter(|(_, d)| ready.contains_key(*d))
            .map(|(k, d)| (*k, d.clone()))
            .collect();
        let wanted: Vec<usize> = (0..case.replicas).collect();
        let before = w.placed.clone();
        let sizes: BTreeMap<String, u32> = case
            .sizes
            .map(|b| {
                (0..3)
                    .filter(|i| w.disks[*i] == St::Ready)
                    .map(|i| (DISKS[i].to_owned(), b[i]))
                    .collect()
            })
            .unwrap_or_default();
        let size_of = |d: &str| {
            case.sizes
                .map(|b| b[DISKS.iter().position(|x| *x == d).expect("disk")])
        };
        let p = place(&Request {
            wanted: &wanted,
            listed: &case.listed,
            ready: &ready,
            block_size: &sizes,
            away: &away,
            full: &BTreeMap::new(),
            existing: &existing,
            placed: &w.placed,
            clone_of: None,
        });
        let ctx = || {
            format!(
                "replicas {} listed {:?} after {trail:?}: {p:?}",
                case.replicas, case.listed
            )
        };
        assert_eq!(p.slots.len(), case.replicas, "{}", ctx());
        let mut creates = 0;
        for (k, slot) in &p.slots {
            match slot {
                Slot::Exists(d) => assert_eq!(before.get(k), Some(d), "an existing replica stays: {}", ctx()),
                Slot::WaitFor(d) => {
                    assert_eq!(before.get(k), Some(d), "{}", ctx());
                    assert!(!ready.contains_key(d), "{}", ctx());
                }
                Slot::Create(d) => {
                    creates += 1;
                    assert!(
                        !before.contains_key(k),
                        "a placed replica is never made again: {}",
                        ctx()
                    );
                    assert!(ready.contains_key(d), "created on a ready disk: {}", ctx());
                    assert!(
                        case.listed.is_empty() || case.listed.contains(d),
                        "never on an unlisted disk: {}",
                        ctx()
                    );
                    w.placed.insert(*k, d.clone());
                    let i = DISKS.iter().position(|x| x == d).expect("disk");
                    w.free[i] = w.free[i].saturating_sub(7);
                }
                Slot::Unplaced => {}
            }
        }
        // the rule: never two replicas of the volume on one disk, ever
        let distinct: BTreeSet<&String> = w.placed.values().collect();
        assert_eq!(
            distinct.len(),
            w.placed.len(),
            "two replicas on one disk: {}",
            ctx()
        );
        // the rule: every replica of the volume of one block size
        let placed_sizes: BTreeSet<Option<u32>> = w.placed.values().map(|d| size_of(d)).collect();
        assert!(placed_sizes.len() <= 1, "replicas of two block sizes: {}", ctx());
        // whole or nothing for a new volume
        if before.is_empty() {
            assert!(
                creates == 0 || creates == case.replicas,
                "partial first placement: {}",
                ctx()
            );
        }
        let unplaced: Vec<usize> = p
            .slots
            .iter()
            .filter(|(_, s)| **s == Slot::Unplaced)
            .map(|(k, _)| *k)
            .collect();
        match &p.blocked {
            None => assert!(unplaced.is_empty(), "{}", ctx()),
            Some(b) => {
                assert_eq!(b.replicas, unplaced, "{}", ctx());
                // the wait says why, naming each failed candidate with its error
                let eligible = |i: usize| case.listed.is_empty() || case.listed.iter().any(|l| l == DISKS[i]);
                let mut any_failed = false;
                for i in (0..3).filter(|i| eligible(*i)) {
                    if w.disks[i] == St::Failed && !before.values().any(|d| d == DISKS[i]) {
                        any_failed = true;
                        assert!(b.reason.contains(&format!("E-{}", DISKS[i])), "{}", ctx());
                    }
                }
                assert_eq!(b.disk_failed, any_failed, "{}", ctx());
                for i in (0..3).filter(|i| !eligible(*i)) {
                    assert!(
                        !b.reason.contains(DISKS[i]),
                        "an unlisted disk is not a candidate: {}",
                        ctx()
                    );
                }
            }
        }
        // liveness: once enough eligible disks are ready (and nothing waited for
        // is away), every replica has a disk
        // (of the volume's block size, or of any one for a new volume)
        let of_size = |b: Option<u32>| {
            ready
                .keys()
                .filter(|d| case.listed.is_empty() || case.listed.contains(d))
                .filter(|d| b.is_none() || size_of(d) == b)
                .count()
        };
        let eligible_ready = match before.values().next() {
            Some(d) => of_size(size_of(d)),
            None => [4096, 512]
                .iter()
                .map(|b| of_size(case.sizes.map(|_| *b)))
                .max()
                .unwrap_or(0),
        };
        let waits = p.slots.values().any(|s| matches!(s, Slot::WaitFor(_)));
        if !waits && eligible_ready >= case.replicas {
            assert!(unplaced.is_empty(), "placeable but not placed: {}", ctx());
        }
    }

    fn walk(case: &Case, w: &World, trail: &mut Vec<Ev>, depth: usize, visited: &mut u64) {
        if depth == 0 {
            return;
        }
        for i in 0..3 {
            for ev in [Ev::Up(i), Ev::Fail(i), Ev::Gone(i)] {
                let mut w = w.clone();
                w.disks[i] = match ev {
                    Ev::Up(_) => St::Ready,
                    Ev::Fail(_) => St::Failed,
                    Ev::Gone(_) => St::Gone,
                };
                trail.push(ev);
                step(case, &mut w, trail);
                *visited += 1;
                walk(case, &w, trail, depth - 1, visited);
                trail.pop();
            }
        }
    }

    /// Every sequence of 5 disk events (each of 3 disks comes up, fails or
    /// goes away, in every order: 9^5 sequences), for 2- and 3-replica
    /// volumes that list no disk, two of the three, or all three, with the
    /// disks of one block size and with one of another; after every event
    /// the placement keeps the rules.
    #[test]
    fn every_order_of_disk_events_keeps_the_rules() {
        let cases = [
            (2, vec![]),
            (2, s(&["d0", "d1"])),
            (2, s(&["d1", "d2"])),
            (2, s(&["d0", "d1", "d2"])),
            (3, vec![]),
            (3, s(&["d0", "d1", "d2"])),
            (3, s(&["d0", "d2"])),
        ];
        // every disk of one (unknown) block size, then d1 of 512 B beside two of 4 KiB
        let sizes = [None, Some([4096, 512, 4096])];
        for ((replicas, listed), sizes) in sizes
            .iter()
            .flat_map(|z| cases.iter().cloned().map(move |c| (c, *z)))
        {
            let case = Case {
                replicas,
                listed,
                sizes,
            };
            let w = World {
                disks: [St::Unknown; 3],
                placed: BTreeMap::new(),
                free: [100, 100, 100],
            };
            let mut visited = 0;
            walk(&case, &w, &mut Vec::new(), 5, &mut visited);
            assert_eq!(visited, (1..=5).map(|n| 9u64.pow(n)).sum::<u64>());
        }
    }
}
