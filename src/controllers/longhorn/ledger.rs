//! The persisted ledger of a Longhorn engine's current members
//! ([`LonghornMemberLedger`]): which replicas hold every write the engine
//! took, so that a raid1 made again after a restart (of spdk_tgt, of talon,
//! of both) never takes in a replica that missed writes as if it had not.
//!
//! ```text
//!   first reconcile of an engine ──> seeded: every replica of the map (0), less one a
//!        │                           ReplicaAdd asked for and not seen rebuilt   ── written before the raid1 is made
//!   each reconcile of a running engine, before its status is written:
//!        member out of the map / a newer ReplicaAdd of it ──> out
//!        member not in a configured slot of the raid1, or a rebuild writes it ──> out (missed writes from then on)
//!        replica rebuilt (rebuildsDone = its request) and configured in the raid1 ──> in, at that request
//!   raid1 made again ──> only the current members; any other replica is out of it: ERR
//!                        to longhorn-manager (`longhorn::proxy`), which removes and rebuilds it
//!   a member: the lvstore of its lvol noted (seeded, noted, the raid1 serving it; another
//!        node's as its node reports it, asked when the raid1 is to be made or none is noted);
//!        its lvol now in another lvstore (disk formatted or replaced: made again, empty)
//!        ──> not current (`moved`): out of a raid1 made again, ERR, rebuilt
//!   engine deleted ──> ledger destroyed; a ledger without its engine ──> destroyed
//! ```
//!
//! The decisions are plain functions over the ledger, the spec, the status
//! and the raid as listed, unit-tested below.

use std::collections::{BTreeMap, BTreeSet};

use super::LonghornController;
use crate::resources::longhorn::{
    LonghornEngine, LonghornInstanceStatus, LonghornMemberLedger, LonghornReplica,
};
use crate::runtime::{ControllerError, ReconcileContext, Typed};
use crate::spdk::naming::longhorn as naming;
use crate::spdk::rpc::RaidBdev;
use crate::spdk::volume::{Inventory, made_again};

impl LonghornController {
    /// The names each replica of `e`'s map may go by in its raid1: the
    /// namespace bdev of a controller attached to it (`<replica>n1`, and its
    /// UUID), and for a replica of this node its lvol (alias and UUID).
    pub(super) fn names_in_raid(
        &self,
        ctx: &ReconcileContext,
        inv: &Inventory,
        e: &Typed<LonghornEngine>,
    ) -> Result<BTreeMap<String, Vec<String>>, ControllerError> {
        let mut out = BTreeMap::new();
        for r in e.spec.replica_address_map.keys() {
            let b = format!("{r}n1");
            let mut names: Vec<String> = inv
                .bdevs
                .get(&b)
                .and_then(|x| x.uuid.clone())
                .into_iter()
                .collect();
            names.push(b);
            if let Some(l) = ctx.get::<LonghornReplica>(r)? {
                let alias = naming::replica_alias(&l.spec.disk, r);
                names.extend(inv.lvols.get(&alias).map(|x| x.uuid.clone()));
                names.push(alias);
            }
            out.insert(r.clone(), names);
        }
        Ok(out)
    }
}

/// The ledger of an engine first seen (none recorded): every replica of its
/// map, at 0, but one a `ReplicaAdd` asked for that `prev` (the status of
/// this talon, if it ran the engine before the ledger existed) does not say
/// was rebuilt. A new engine is what longhorn-manager says: all RW.
pub(super) fn seed(
    e: &LonghornEngine,
    prev: Option<&LonghornInstanceStatus>,
    here: &dyn Fn(&str) -> Option<String>,
) -> LonghornMemberLedger {
    let current: BTreeMap<String, u64> = e
        .replica_address_map
        .keys()
        .filter_map(|r| match e.rebuild_requests.get(r) {
            None => Some((r.clone(), 0)),
            Some(n) if prev.and_then(|p| p.rebuilds_done.get(r)) == Some(n) => Some((r.clone(), *n)),
            Some(_) => None,
        })
        .collect();
    let reason = format!("engine created over {}", names(current.keys()));
    let lvstores = current
        .keys()
        .filter_map(|r| Some((r.clone(), here(r)?)))
        .collect();
    LonghornMemberLedger {
        volume: e.volume.clone(),
        current,
        lvstores,
        reason,
    }
}

/// The ledger without the `moved` members (see [`moved`]); `None` when
/// there is none.
pub(super) fn without_moved(
    l: &LonghornMemberLedger,
    moved: &BTreeMap<String, (String, String)>,
) -> Option<LonghornMemberLedger> {
    if moved.is_empty() {
        return None;
    }
    let mut after = l.clone();
    after.current.retain(|r, _| !moved.contains_key(r));
    after.lvstores.retain(|r, _| !moved.contains_key(r));
    let what: Vec<String> = moved
        .iter()
        .map(|(r, (noted, now))| format!("{r} (lvstore {noted}, now {now})"))
        .collect();
    after.reason = format!(
        "{}: lvol made again in another lvstore (its disk formatted or replaced), holds none of the data",
        what.join(", ")
    );
    Some(after)
}

impl LonghornController {
    /// The lvstore UUIDs of engine `e`'s remote members (replicas not in
    /// `local`), as their nodes report them (`ReplicaGet`'s `lvs_uuid`),
    /// asked only when the raid1 is to be made (none listed in `inv`) or a
    /// current remote member has none noted in `ledger` (`None`: not
    /// seeded yet, every one). A node that does not answer gives none (its
    /// replica is not judged: reaching it fails the assembly anyway).
    pub(super) async fn remote_lvstores(
        &self,
        inv: &Inventory,
        e: &Typed<LonghornEngine>,
        local: &BTreeMap<String, LonghornReplica>,
        ledger: Option<&LonghornMemberLedger>,
    ) -> BTreeMap<String, String> {
        let making = inv.raid(e.id()).is_none();
        // every node at once: one that does not answer costs its time-out once
        let asks = e.spec.replica_address_map.iter().filter_map(|(r, address)| {
            let unnoted = ledger.is_none_or(|l| l.is_current(&e.spec, r) && !l.lvstores.contains_key(r));
            if local.contains_key(r) || (!making && !unnoted) {
                return None;
            }
            let ask = tonic::Request::new(crate::proto::spdkrpc::ReplicaGetRequest { name: r.clone() });
            Some(async move { (r, self.replica_there(address, ask).await) })
        });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .filter_map(|(r, x)| Some((r.clone(), x?.lvs_uuid)).filter(|(_, u)| !u.is_empty()))
            .collect()
    }
}

/// The UUID of the lvstore replica `r`'s lvol is listed in, for a replica
/// of this node (`local`).
pub(super) fn lvstore_of(
    local: &BTreeMap<String, LonghornReplica>,
    inv: &Inventory,
    r: &str,
) -> Option<String> {
    let spec = local.get(r)?;
    let lvol = inv.lvols.get(&naming::replica_alias(&spec.disk, r))?;
    Some(lvol.lvs.uuid.clone())
}

/// The current members whose lvol is not in the lvstore the ledger noted
/// for it (`here`: the UUID of the lvstore replica `r`'s lvol is in, listed
/// for a replica of this node, reported by its node for another's), each
/// with the noted and the listed lvstore: its disk was formatted or
/// replaced and its lvol made again, empty. Not current: a raid1 made again
/// leaves it out. The rule talon's volumes are judged by ([`made_again`]).
pub(super) fn moved(
    l: &LonghornMemberLedger,
    current: &BTreeSet<String>,
    here: &dyn Fn(&str) -> Option<String>,
) -> BTreeMap<String, (String, String)> {
    let noted: BTreeMap<String, String> = l
        .lvstores
        .iter()
        .filter(|(r, _)| current.contains(*r))
        .map(|(r, u)| (r.clone(), u.clone()))
        .collect();
    made_again(&noted, |r| here(r))
}

/// The current members of other nodes (`remote`) that the raid1 about to
/// be made (`making`) cannot judge: an lvstore noted, and none known now
/// (`here`: its node did not answer in time), each as a reason to wait.
/// None when the raid1 is not being made (it holds its members).
pub(super) fn unjudged(
    l: &LonghornMemberLedger,
    remote: &BTreeSet<String>,
    making: bool,
    here: &dyn Fn(&str) -> Option<String>,
) -> Vec<String> {
    if !making {
        return Vec::new();
    }
    remote
        .iter()
        .filter(|r| l.lvstores.contains_key(*r) && here(r).is_none())
        .map(|r| {
            format!(
                "replica {r}: its node has not said which lvstore its lvol is in (noted {}; a disk formatted \
                 there would have made it again, empty)",
                l.lvstores[r]
            )
        })
        .collect()
}

/// The replicas of `e`'s map the ledger says are current: the only ones a
/// raid1 made again takes in.
pub(super) fn current_members(l: &LonghornMemberLedger, e: &LonghornEngine) -> BTreeSet<String> {
    e.replica_address_map
        .keys()
        .filter(|r| l.is_current(e, r))
        .cloned()
        .collect()
}

/// What the raid1 of an engine shows of its members, for [`observed`].
pub(super) enum RaidView<'a> {
    /// Running over raid1 `raid`; `names(r)`: the names replica `r` may go
    /// by in it (lvol alias or UUID, remote namespace bdev or its UUID).
    Raid(&'a RaidBdev, &'a dyn Fn(&str) -> Vec<String>),
    /// Not running over a raid1 (a lone member, or not running): nothing
    /// is learnt of the members.
    None,
}

/// The ledger after a reconcile of engine `e` that came to status `st`:
/// members out of the map (or asked to be rebuilt again) go; with a raid1,
/// members not configured in it or written by a rebuild go, and replicas
/// whose rebuild ended (`st.rebuildsDone` at their request) and configured
/// in it come in. `None`: nothing changed.
pub(super) fn observed(
    before: &LonghornMemberLedger,
    e: &LonghornEngine,
    st: &LonghornInstanceStatus,
    raid: RaidView<'_>,
    here: &dyn Fn(&str) -> Option<String>,
) -> Option<LonghornMemberLedger> {
    let mut current: BTreeMap<String, u64> = before
        .current
        .iter()
        .filter(|(r, _)| before.is_current(e, r))
        .map(|(r, n)| (r.clone(), *n))
        .collect();
    let unlisted: Vec<&String> = before
        .current
        .keys()
        .filter(|r| !current.contains_key(*r))
        .collect();
    let mut left = Vec::new();
    let mut joined = Vec::new();
    let mut served = BTreeSet::new();
    if let RaidView::Raid(raid, names_of) = raid {
        let serves = |r: &str| raid.slot_in_service(&names_of(r)).is_some();
        current.retain(|r, _| {
            let keep = serves(r);
            if !keep {
                left.push(r.clone());
            }
            keep
        });
        served.extend(current.keys().cloned());
        for (r, n) in &e.rebuild_requests {
            if e.replica_address_map.contains_key(r)
                && !current.contains_key(r)
                && st.rebuilds_done.get(r) == Some(n)
                && serves(r)
            {
                current.insert(r.clone(), *n);
                joined.push(r.clone());
                served.insert(r.clone());
            }
        }
    }
    // the lvstore of each current member of this node: the one the raid1
    // serves it from, else the one noted, else (not noted yet) the listed one
    let lvstores: BTreeMap<String, String> = current
        .keys()
        .filter_map(|r| {
            // served with none known now (its node did not answer): the
            // note is kept, never dropped for the next answer to replace
            let at = match before.lvstores.get(r) {
                Some(noted) if !served.contains(r) => Some(noted.clone()),
                noted => here(r).or_else(|| noted.cloned()),
            };
            Some((r.clone(), at?))
        })
        .collect();
    if current == before.current && lvstores == before.lvstores {
        return None;
    }
    let mut why = Vec::new();
    if !unlisted.is_empty() {
        why.push(format!(
            "{} out of the replica map or asked to be rebuilt",
            names(unlisted)
        ));
    }
    if !left.is_empty() {
        why.push(format!(
            "{} left the raid1 (missed writes from then on)",
            names(&left)
        ));
    }
    if !joined.is_empty() {
        why.push(format!("{} rebuilt and back in the raid1", names(&joined)));
    }
    if why.is_empty() {
        why.push("the lvstores of its replicas here noted".to_owned());
    }
    Some(LonghornMemberLedger {
        volume: before.volume.clone(),
        current,
        lvstores,
        reason: why.join("; "),
    })
}

/// Keeps the ledger of every engine that is still recorded (applied again
/// at every reconcile, also one that waits for the target, so the runtime's
/// clean-up of outputs not applied takes none) and destroys the others.
pub(super) fn keep_member_ledgers(
    ctx: &mut ReconcileContext,
    engines: &[Typed<LonghornEngine>],
) -> Result<(), ControllerError> {
    for l in ctx.list::<LonghornMemberLedger>()? {
        let id = l.id().to_owned();
        if engines.iter().any(|e| e.id() == id) {
            ctx.apply(&id, l.spec)?;
        } else {
            tracing::info!(engine = id, "member ledger of an engine gone: destroyed");
            ctx.destroy::<LonghornMemberLedger>(&id)?;
        }
    }
    Ok(())
}

fn names<S: AsRef<str>>(rs: impl IntoIterator<Item = S>) -> String {
    let v: Vec<String> = rs.into_iter().map(|r| r.as_ref().to_owned()).collect();
    if v.is_empty() {
        "no replica".to_owned()
    } else {
        v.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::longhorn::{InstanceKind, InstanceState};
    use crate::spdk::rpc::{RaidBaseBdev, RaidProcess, RaidProgress};

    fn engine(replicas: &[&str], requests: &[(&str, u64)]) -> LonghornEngine {
        let mut e = crate::controllers::longhorn::tests::engine_of_two();
        e.replica_address_map = replicas
            .iter()
            .map(|r| ((*r).to_owned(), "10.0.0.1:20001".to_owned()))
            .collect();
        e.rebuild_requests = requests.iter().map(|(r, n)| ((*r).to_owned(), *n)).collect();
        e
    }

    fn ledger(current: &[(&str, u64)]) -> LonghornMemberLedger {
        LonghornMemberLedger {
            volume: "vol".into(),
            current: current.iter().map(|(r, n)| ((*r).to_owned(), *n)).collect(),
            lvstores: BTreeMap::new(),
            reason: String::new(),
        }
    }

    fn running(done: &[(&str, u64)]) -> LonghornInstanceStatus {
        let mut st = LonghornInstanceStatus::new(InstanceKind::Engine, InstanceState::Running, "");
        st.rebuilds_done = done.iter().map(|(r, n)| ((*r).to_owned(), *n)).collect();
        st
    }

    /// Slots named after their replicas (`<r>n1`): (replica, configured).
    fn raid(slots: &[(&str, bool)], writing: Option<&str>) -> RaidBdev {
        RaidBdev {
            name: "vol-e-0".into(),
            uuid: None,
            state: "online".into(),
            raid_level: "raid1".into(),
            superblock: false,
            num_base_bdevs: slots.len() as u32,
            num_base_bdevs_discovered: slots.len() as u32,
            num_base_bdevs_operational: slots.len() as u32,
            base_bdevs_list: slots
                .iter()
                .map(|(r, c)| RaidBaseBdev {
                    name: Some(format!("{r}n1")),
                    uuid: None,
                    is_configured: *c,
                    data_offset: 0,
                    data_size: 0,
                })
                .collect(),
            process: writing.map(|w| RaidProcess {
                kind: "rebuild".into(),
                target: format!("{w}n1"),
                progress: RaidProgress {
                    blocks: 0,
                    percent: 0,
                },
            }),
        }
    }

    fn n1(r: &str) -> Vec<String> {
        vec![format!("{r}n1")]
    }

    /// No replica of this node.
    fn nowhere(_: &str) -> Option<String> {
        None
    }

    /// A new engine's replicas are all current; one a ReplicaAdd asked for
    /// is current only once this talon saw its rebuild end.
    #[test]
    fn a_new_engine_is_seeded_with_its_map_less_the_replicas_still_to_rebuild() {
        let e = engine(&["r1", "r2"], &[]);
        assert_eq!(
            seed(&e, None, &nowhere).current,
            ledger(&[("r1", 0), ("r2", 0)]).current
        );
        let e = engine(&["r1", "r2", "r3"], &[("r2", 4), ("r3", 5)]);
        let prev = running(&[("r2", 4), ("r3", 2)]);
        assert_eq!(
            seed(&e, Some(&prev), &nowhere).current,
            ledger(&[("r1", 0), ("r2", 4)]).current
        );
        assert_eq!(seed(&e, None, &nowhere).current, ledger(&[("r1", 0)]).current);
    }

    /// Current: in the map, at the number of its latest ReplicaAdd.
    #[test]
    fn a_replica_is_current_only_at_its_latest_replica_add() {
        let l = ledger(&[("r1", 0), ("r2", 3), ("gone", 0)]);
        let e = engine(&["r1", "r2", "r3"], &[("r2", 3)]);
        assert_eq!(current_members(&l, &e), ["r1".to_owned(), "r2".to_owned()].into());
        // removed and added again: a newer request, not current until rebuilt
        let e = engine(&["r1", "r2"], &[("r2", 7)]);
        assert_eq!(current_members(&l, &e), ["r1".to_owned()].into());
    }

    /// A member out of a configured slot, or written by a rebuild, leaves;
    /// one not in the map leaves; nothing changes while all serve.
    #[test]
    fn members_leave_when_the_raid_no_longer_serves_them_or_the_map_drops_them() {
        let before = ledger(&[("r1", 0), ("r2", 0)]);
        let e = engine(&["r1", "r2"], &[]);
        let st = running(&[]);
        let all = raid(&[("r1", true), ("r2", true)], None);
        assert_eq!(
            observed(&before, &e, &st, RaidView::Raid(&all, &n1), &nowhere),
            None
        );
        let faulted = raid(&[("r1", true), ("r2", false)], None);
        let after = observed(&before, &e, &st, RaidView::Raid(&faulted, &n1), &nowhere).expect("r2 out");
        assert_eq!(after.current, ledger(&[("r1", 0)]).current);
        assert!(after.reason.contains("r2 left the raid1"), "{}", after.reason);
        let gone = raid(&[("r1", true)], None);
        let after = observed(&before, &e, &st, RaidView::Raid(&gone, &n1), &nowhere).expect("r2 out");
        assert_eq!(after.current, ledger(&[("r1", 0)]).current);
        let written = raid(&[("r1", true), ("r2", true)], Some("r2"));
        let after = observed(&before, &e, &st, RaidView::Raid(&written, &n1), &nowhere).expect("r2 out");
        assert_eq!(after.current, ledger(&[("r1", 0)]).current);
        // ReplicaRemove: out of the map, with or without a raid to look at
        let e1 = engine(&["r1"], &[]);
        let after = observed(&before, &e1, &st, RaidView::None, &nowhere).expect("r2 out");
        assert_eq!(after.current, ledger(&[("r1", 0)]).current);
        assert!(
            after.reason.contains("out of the replica map"),
            "{}",
            after.reason
        );
    }

    /// A rebuilt replica comes in once its rebuild ended and it serves in
    /// the raid1, at its request; not while written, not at an older request,
    /// and never without a raid to see it in.
    #[test]
    fn a_rebuilt_replica_comes_in_once_it_serves_at_its_request() {
        let before = ledger(&[("r1", 0)]);
        let e = engine(&["r1", "r2"], &[("r2", 5)]);
        let both = raid(&[("r1", true), ("r2", true)], None);
        let after = observed(
            &before,
            &e,
            &running(&[("r2", 5)]),
            RaidView::Raid(&both, &n1),
            &nowhere,
        )
        .expect("r2 in");
        assert_eq!(after.current, ledger(&[("r1", 0), ("r2", 5)]).current);
        assert!(after.reason.contains("r2 rebuilt"), "{}", after.reason);
        assert_eq!(
            observed(
                &before,
                &e,
                &running(&[("r2", 4)]),
                RaidView::Raid(&both, &n1),
                &nowhere
            ),
            None
        );
        let writing = raid(&[("r1", true), ("r2", true)], Some("r2"));
        assert_eq!(
            observed(
                &before,
                &e,
                &running(&[("r2", 5)]),
                RaidView::Raid(&writing, &n1),
                &nowhere
            ),
            None
        );
        assert_eq!(
            observed(&before, &e, &running(&[("r2", 5)]), RaidView::None, &nowhere),
            None
        );
        // faulted after it joined: out, and not back from the same rebuild
        let joined = ledger(&[("r1", 0), ("r2", 5)]);
        let faulted = raid(&[("r1", true), ("r2", false)], None);
        let after = observed(
            &joined,
            &e,
            &running(&[("r2", 5)]),
            RaidView::Raid(&faulted, &n1),
            &nowhere,
        )
        .expect("r2 out");
        assert_eq!(after.current, ledger(&[("r1", 0)]).current);
    }

    /// A member of this node is noted with its lvol's lvstore when the
    /// ledger is seeded; one whose lvol is now listed in another lvstore
    /// (its disk formatted or replaced) is out at once, named with both; one
    /// of another node, or not noted (a ledger of before), never.
    #[test]
    fn a_member_whose_lvol_was_made_again_in_another_lvstore_is_out() {
        let e = engine(&["r1", "r2", "r3"], &[]);
        let first = |r: &str| (r == "r1" || r == "r3").then(|| "lvs-1".to_owned());
        let l = seed(&e, None, &first);
        assert_eq!(
            l.lvstores,
            BTreeMap::from([
                ("r1".to_owned(), "lvs-1".to_owned()),
                ("r3".to_owned(), "lvs-1".to_owned())
            ])
        );
        let current = current_members(&l, &e);
        assert!(moved(&l, &current, &first).is_empty());
        assert_eq!(without_moved(&l, &BTreeMap::new()), None);
        // r1's disk formatted: its lvol made again in a new lvstore; r3's
        // lvol not listed (its disk not loaded yet): nothing said of it
        let now = |r: &str| (r == "r1").then(|| "lvs-2".to_owned());
        let m = moved(&l, &current, &now);
        assert_eq!(
            m,
            BTreeMap::from([("r1".to_owned(), ("lvs-1".to_owned(), "lvs-2".to_owned()))])
        );
        let after = without_moved(&l, &m).expect("r1 out");
        assert_eq!(after.current, ledger(&[("r2", 0), ("r3", 0)]).current);
        assert_eq!(
            after.lvstores,
            BTreeMap::from([("r3".to_owned(), "lvs-1".to_owned())])
        );
        assert!(
            after.reason.contains("r1 (lvstore lvs-1, now lvs-2)"),
            "{}",
            after.reason
        );
        // a ledger written before lvstores were noted: noted by a pass, not judged
        let old = ledger(&[("r1", 0), ("r2", 0)]);
        assert!(moved(&old, &current_members(&old, &e), &now).is_empty());
    }

    /// A pass notes the lvstore of a member not noted yet; a raid1 serving a
    /// member notes the one it serves it from (a rebuilt replica's); a noted
    /// one not served stays as noted.
    #[test]
    fn the_lvstores_of_members_here_are_noted_and_follow_the_raid() {
        let e = engine(&["r1", "r2"], &[("r2", 5)]);
        let st = running(&[("r2", 5)]);
        let here = |r: &str| Some(format!("lvs-of-{r}"));
        // not noted yet (a ledger of before), no raid to look at
        let old = ledger(&[("r1", 0)]);
        let after = observed(&old, &e, &st, RaidView::None, &here).expect("noted");
        assert_eq!(
            after.lvstores,
            BTreeMap::from([("r1".to_owned(), "lvs-of-r1".to_owned())])
        );
        assert_eq!(after.current, old.current);
        assert_eq!(observed(&after, &e, &st, RaidView::None, &here), None);
        // r2 rebuilt and served: in, with the lvstore the raid1 serves it from
        let both = raid(&[("r1", true), ("r2", true)], None);
        let joined = observed(&after, &e, &st, RaidView::Raid(&both, &n1), &here).expect("r2 in");
        assert_eq!(
            joined.lvstores,
            BTreeMap::from([
                ("r1".to_owned(), "lvs-of-r1".to_owned()),
                ("r2".to_owned(), "lvs-of-r2".to_owned())
            ])
        );
        // noted, not served (no raid): kept as noted, whatever is listed now
        let elsewhere = |_: &str| Some("lvs-new".to_owned());
        assert_eq!(observed(&joined, &e, &st, RaidView::None, &elsewhere), None);
        // served, and its node did not answer: the note is kept, not dropped
        // for the next answer (maybe a lvol made again there) to replace
        let unknown = |r: &str| (r == "r1").then(|| "lvs-of-r1".to_owned());
        assert_eq!(
            observed(&joined, &e, &st, RaidView::Raid(&both, &n1), &unknown),
            None
        );
    }

    /// A raid1 about to be made waits for a noted member of another node
    /// whose node did not say where its lvol is (not judged: it may have
    /// been made again, empty); one not noted, or a raid1 that stands, does
    /// not wait.
    #[test]
    fn a_raid1_is_not_made_over_a_noted_member_its_node_did_not_answer_for() {
        let l = LonghornMemberLedger {
            lvstores: BTreeMap::from([("r2".to_owned(), "lvs-2".to_owned())]),
            ..ledger(&[("r2", 0), ("r3", 0)])
        };
        let remote = BTreeSet::from(["r2".to_owned(), "r3".to_owned()]);
        let silent = |_: &str| None;
        let waits = unjudged(&l, &remote, true, &silent);
        assert_eq!(waits.len(), 1, "{waits:?}");
        assert!(waits[0].contains("r2") && waits[0].contains("lvs-2"), "{waits:?}");
        assert!(
            unjudged(&l, &remote, false, &silent).is_empty(),
            "the raid1 stands"
        );
        let answered = |r: &str| (r == "r2").then(|| "lvs-9".to_owned());
        assert!(
            unjudged(&l, &remote, true, &answered).is_empty(),
            "judged by moved()"
        );
    }
}
