//! The rebuilds of a Longhorn raid1 engine, reported and driven once per
//! reconcile, in phases over the engine's previous status and the target's
//! listing:
//!
//! ```text
//!   prev status ──> carried over: rebuildsDone, rebuildSources (of the rebuildRequests asked now)
//!   member ledger: current at its request ──> rebuildsDone (a restart never rebuilds it again)
//!   rebuildRequests[r] = n ──> per replica: a thin step (longhorn_thin), else SPDK's raid rebuild
//!   started before, not seen to end ──> raid listed again ──> ended: judged by
//!        VolumeOps::raid_after_rebuild_end ──> rebuildsDone[r] = n, or rebuilt again
//!   a raid process runs ──> its member at the engine's cap, reported;  none ──> caps lifted
//! ```
//!
//! The decisions are plain functions over the status, the spec and the
//! listing (no RPC, no controller state), unit-tested below.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use super::thin::{Failed, Thin, ThinError};
use super::{CAP_GRACE, LonghornController, Serving, caps, chain};
use crate::resources::longhorn::{LonghornEngine, LonghornInstanceStatus, LonghornReplica};
use crate::runtime::Typed;
use crate::spdk::naming::longhorn as naming;
use crate::spdk::rpc::{GetRaids, RaidBdev, RaidCategory, RaidProcess};
use crate::spdk::volume::Inventory;
use crate::spdk::{ClientError, ErrorKind};

/// What every phase of one engine's rebuilds reads.
struct Engine<'a> {
    e: &'a Typed<LonghornEngine>,
    local: super::Local<'a>,
    prev: Option<&'a LonghornInstanceStatus>,
    plan: &'a Serving,
}

/// One `rebuildRequests` entry of a replica in the map.
#[derive(Debug, Clone, Copy)]
struct Request<'a> {
    replica: &'a str,
    number: u64,
    address: &'a str,
}

/// A rebuild (replica, request) started by an earlier reconcile and not
/// seen to end yet.
type Unsettled<'a> = (&'a String, &'a u64);

impl LonghornController {
    /// The rebuilds of raid1 engine `e`: each `rebuildRequests` entry not
    /// started yet is started (once per request number: one that fails
    /// stays failed until the next `ReplicaAdd`), the running one is
    /// reported, and a rebuild cap is lifted once no rebuild runs.
    pub(super) async fn rebuilds(
        &self,
        inv: &mut Inventory,
        e: &Typed<LonghornEngine>,
        local: super::Local<'_>,
        prev: Option<&LonghornInstanceStatus>,
        st: &mut LonghornInstanceStatus,
        plan: &Serving,
    ) {
        let requests = &e.spec.rebuild_requests;
        // (`st.rebuildsDone` holds what the member ledger says is done:
        // [`done_by_ledger`])
        if let Some(p) = prev {
            st.rebuilds_done.extend(done_carried(p, requests));
            st.rebuild_sources = sources_carried(p, requests);
        }
        let unsettled = unsettled(requests, &st.rebuilds_done, prev);
        let en = Engine { e, local, prev, plan };
        let mut started_one = false;
        for (replica, request) in requests {
            let Some(address) = e.spec.replica_address_map.get(replica) else {
                continue;
            };
            let rq = Request {
                replica,
                number: *request,
                address,
            };
            started_one |= self.rebuild_request(inv, &en, st, rq).await;
        }
        let all_capped = self.caps.all_of(e.id());
        let observed = caps::observed(inv, e.id());
        if !must_list_raid(started_one, &unsettled, &all_capped, &observed, inv.raid(e.id())) {
            return;
        }
        // the raid as it is now (a rebuild may have started or ended)
        let Ok(raid) = self.raid_now(inv, e.id()).await else {
            return;
        };
        if let Some(r) = raid.as_ref() {
            self.judge_ended(inv, &en, st, r, &unsettled).await;
        }
        match raid.as_ref().and_then(|r| r.process.as_ref()) {
            Some(p) => {
                self.cap_rebuild(inv, e, p, &all_capped).await;
                st.rebuild = raid_progress(inv, e.id(), p);
            }
            None => self.lift_caps(e.id(), &all_capped, &observed).await,
        }
    }

    /// One requested rebuild: carried on (its error, or settled: done or in
    /// a slot), or one thin step; returns whether SPDK's raid rebuild was
    /// started for it instead.
    async fn rebuild_request(
        &self,
        inv: &mut Inventory,
        en: &Engine<'_>,
        st: &mut LonghornInstanceStatus,
        rq: Request<'_>,
    ) -> bool {
        let (e, replica) = (en.e, rq.replica);
        st.rebuilds_started.insert(replica.to_owned(), rq.number);
        if st.rebuilds_done.get(replica) == Some(&rq.number) {
            return false;
        }
        if let Some(p) = en
            .prev
            .filter(|p| p.rebuilds_started.get(replica) == Some(&rq.number))
        {
            if let Some(m) = p.rebuild_errors.get(replica) {
                st.rebuild_errors.insert(replica.to_owned(), m.clone());
                return false;
            }
            // done, or SPDK's rebuild writes it (judged below)
            let names = self.member_names(inv, en.local.direct, replica);
            let in_slot = in_a_slot(inv.raid(e.id()), &names);
            if st.rebuilds_done.get(replica) == Some(&rq.number) || in_slot {
                return false;
            }
        } else {
            // a new request starts afresh
            self.thin.forget(e.id(), replica);
        }
        // its last step failed a moment ago: it stays where it was
        if self.thin.pausing(e.id(), replica, Instant::now()) {
            let pct = en
                .prev
                .and_then(|p| p.thin_rebuilds.get(replica))
                .copied()
                .unwrap_or(0);
            st.thin_rebuilds.insert(replica.to_owned(), pct);
            return false;
        }
        // a raid this reconcile made (after a failed switch) is not in
        // the listing yet
        if inv.raid(e.id()).is_none()
            && let Ok(now) = Inventory::load(&self.client).await
        {
            *inv = now;
        }
        let step = self.thin_step(inv, e, en.local, replica, en.plan).await;
        if let Some(src) = self.thin.source(e.id(), replica) {
            st.rebuild_sources.insert(replica.to_owned(), src);
        }
        self.after_step(inv, en, st, rq, step).await
    }

    /// What a thin step came to: reported, joined, handed to SPDK's raid
    /// rebuild (returns true), or failed (tried again after a pause, or for
    /// good).
    async fn after_step(
        &self,
        inv: &mut Inventory,
        en: &Engine<'_>,
        st: &mut LonghornInstanceStatus,
        rq: Request<'_>,
        step: Result<Thin, ThinError>,
    ) -> bool {
        let (e, replica) = (en.e, rq.replica);
        match step {
            Ok(Thin::Copying { copied, total }) => {
                let pct = copy_percent(copied, total).max(shown(en.prev, replica, rq.number));
                st.thin_rebuilds.insert(replica.to_owned(), pct);
                st.rebuild = progress_line(replica, pct, copied, total);
            }
            Ok(Thin::Joined) => {
                self.thin.forget(e.id(), replica);
                st.rebuilds_done.insert(replica.to_owned(), rq.number);
                if let Ok(now) = Inventory::load(&self.client).await {
                    *inv = now;
                }
            }
            Ok(Thin::Unsupported(why)) => {
                tracing::info!(
                    engine = e.id(),
                    replica,
                    why,
                    "rebuilding with SPDK's raid rebuild (every block)"
                );
                if let Err(m) = self
                    .start_rebuild(
                        inv,
                        e.id(),
                        replica,
                        rq.address,
                        en.local.direct,
                        e.spec.rebuild_qos_mbps,
                    )
                    .await
                {
                    let m = m.text();
                    tracing::warn!(engine = e.id(), replica, error = %m, "rebuild did not start");
                    st.rebuild_errors.insert(replica.to_owned(), m);
                }
                return true;
            }
            Err(x) => match self.thin.failed(e.id(), replica, Instant::now()) {
                Failed::Retry(n) => {
                    tracing::warn!(engine = e.id(), replica, failures = n, error = %crate::util::error_chain(&x), "thin rebuild step failed; tried again");
                    st.thin_rebuilds
                        .insert(replica.to_owned(), shown(en.prev, replica, rq.number));
                }
                Failed::ForGood(n) => {
                    // in Longhorn's words: its status carries the error as text
                    let m = crate::util::error_chain(&x);
                    tracing::warn!(engine = e.id(), replica, failures = n, error = %m, "thin rebuild failed");
                    self.thin.forget(e.id(), replica);
                    st.rebuild_errors.insert(replica.to_owned(), m);
                }
            },
        }
        false
    }

    /// Raid `name` as SPDK lists it now, recorded in `inv` (`None`: no such
    /// raid).
    async fn raid_now(&self, inv: &mut Inventory, name: &str) -> Result<Option<RaidBdev>, ClientError> {
        let all = self
            .client
            .bdev_raid_get_bdevs(&GetRaids {
                category: RaidCategory::All,
            })
            .await?;
        let raid = all.into_iter().find(|r| r.name == name);
        if let Some(r) = raid.as_ref() {
            inv.forget_raid(&r.name);
            inv.raids.push(r.clone());
        }
        Ok(raid)
    }

    /// The unsettled rebuilds of raid `r` that ended, judged: done, or
    /// rebuilt again.
    async fn judge_ended(
        &self,
        inv: &Inventory,
        en: &Engine<'_>,
        st: &mut LonghornInstanceStatus,
        r: &RaidBdev,
        unsettled: &[Unsettled<'_>],
    ) {
        let e = en.e;
        // a rebuild started before this reconcile ended when its member
        // is configured and no process writes it (SPDK reports the
        // process a moment after the add: never judged in that
        // reconcile), and a listing a moment later still has it (one
        // whose rebuild failed is being taken out: see
        // `VolumeOps::raid_after_rebuild_end`)
        let ended = ended(r, unsettled, inv, en.local.direct);
        if ended.is_empty() {
            return;
        }
        // gone, or a process runs again: judged at the next reconcile
        let again = self.ops.raid_after_rebuild_end(e.id()).await.ok().flatten();
        for (replica, request, names) in ended.into_iter().filter(|_| again.is_some()) {
            if again
                .as_ref()
                .is_some_and(|a| a.slot_in_service(&names).is_some())
            {
                st.rebuilds_done.insert(replica.clone(), *request);
            } else {
                tracing::warn!(
                    engine = e.id(),
                    replica = replica.as_str(),
                    "SPDK's rebuild of a replica ended without it: not rebuilt; rebuilt again"
                );
            }
        }
    }

    /// The member raid process `p` writes, at engine `e`'s cap
    /// (`ReplicaRebuildingQosSet` changes it).
    async fn cap_rebuild(
        &self,
        inv: &Inventory,
        e: &Typed<LonghornEngine>,
        p: &RaidProcess,
        all_capped: &[String],
    ) {
        // the member the rebuild writes (added by name; SPDK may name an lvol by UUID)
        let mut target = p.target.clone();
        for m in capped_written(inv, all_capped, &p.target) {
            self.caps.seen(&m);
            target = m;
        }
        // at the engine's cap (ReplicaRebuildingQosSet changes it)
        let want = u64::try_from(e.spec.rebuild_qos_mbps).unwrap_or(0);
        if self.caps.of(&target) != want {
            match self.ops.cap_rebuild_writes(&target, want).await {
                Ok(()) => {
                    self.caps.set(e.id(), &target, want);
                    self.caps.seen(&target);
                    tracing::info!(engine = e.id(), member = target, mbps = want, "rebuild cap");
                }
                Err(x) => {
                    tracing::warn!(member = target, error = %chain(&x), "setting the rebuild cap failed")
                }
            }
        }
    }

    /// No rebuild runs in raid `raid`: the caps that may go are lifted.
    async fn lift_caps(&self, raid: &str, all_capped: &[String], observed: &[(String, Option<String>)]) {
        let lift = caps::to_lift(self.caps.liftable(raid, CAP_GRACE), all_capped, observed);
        for member in lift {
            match self.ops.cap_rebuild_writes(&member, 0).await {
                Ok(()) => self.caps.forget(&member),
                Err(x) if x.is(ErrorKind::NotFound) => self.caps.forget(&member),
                Err(x) => {
                    tracing::warn!(member, error = %chain(&x), "lifting the rebuild cap failed")
                }
            }
        }
    }
}

/// The `rebuildsDone` of `prev` whose request is still the one asked.
/// The requests whose replica the member ledger holds current (at that
/// request): done, also by a talon before a restart, and never rebuilt again.
pub(super) fn done_by_ledger(
    requests: &BTreeMap<String, u64>,
    current: &BTreeSet<String>,
) -> BTreeMap<String, u64> {
    requests
        .iter()
        .filter(|(r, _)| current.contains(*r))
        .map(|(r, n)| (r.clone(), *n))
        .collect()
}

fn done_carried(prev: &LonghornInstanceStatus, requests: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    prev.rebuilds_done
        .iter()
        .filter(|(r, req)| requests.get(*r) == Some(*req))
        .map(|(r, req)| (r.clone(), *req))
        .collect()
}

/// The `rebuildSources` of `prev` whose rebuild is the one asked now: a
/// source stays known for the rebuild it served (also once it ended).
fn sources_carried(
    prev: &LonghornInstanceStatus,
    requests: &BTreeMap<String, u64>,
) -> BTreeMap<String, String> {
    prev.rebuild_sources
        .iter()
        .filter(|(r, _)| {
            let req = requests.get(*r);
            req.is_some() && prev.rebuilds_started.get(*r) == req
        })
        .map(|(r, s)| (r.clone(), s.clone()))
        .collect()
}

/// The percent reported last for the same rebuild: what is reported never
/// goes back (a later round of a rebuild copies more, a failed step starts
/// its copy again); 0 for a rebuild not reported before.
fn shown(prev: Option<&LonghornInstanceStatus>, replica: &str, request: u64) -> u32 {
    prev.filter(|p| p.rebuilds_started.get(replica) == Some(&request))
        .and_then(|p| p.thin_rebuilds.get(replica))
        .copied()
        .unwrap_or(0)
}

/// The rebuilds started by an earlier reconcile and not seen to end yet:
/// not `done`, started by `prev` for the same request, and not failed there.
fn unsettled<'a>(
    requests: &'a BTreeMap<String, u64>,
    done: &BTreeMap<String, u64>,
    prev: Option<&LonghornInstanceStatus>,
) -> Vec<Unsettled<'a>> {
    requests
        .iter()
        .filter(|(r, req)| {
            done.get(*r) != Some(*req)
                && prev.and_then(|p| p.rebuilds_started.get(*r)) == Some(*req)
                && prev.is_none_or(|p| !p.rebuild_errors.contains_key(*r))
        })
        .collect()
}

/// The percent a thin copy reports: below 100 until the replica joined
/// (0 for a copy of nothing yet).
fn copy_percent(copied: u64, total: u64) -> u32 {
    u32::try_from((copied * 100).checked_div(total).unwrap_or(0).min(99)).unwrap_or(99)
}

/// What `rebuild` reports of a running rebuild.
fn progress_line(member: &str, pct: u32, done: u64, total: u64) -> String {
    format!("{member} {pct}% {done}/{total} bytes")
}

/// The rebuild raid process `p` of raid `raid` runs, as `rebuild` reports it.
fn raid_progress(inv: &Inventory, raid: &str, p: &RaidProcess) -> String {
    let (bs, blocks) = inv
        .bdevs
        .get(raid)
        .map_or((0, 0), |b| (u64::from(b.block_size), b.num_blocks));
    progress_line(&p.target, p.progress.percent, p.progress.blocks * bs, blocks * bs)
}

/// Whether a slot of `raid` (configured or not) holds a member `names`
/// names, by its name or its UUID.
fn in_a_slot(raid: Option<&RaidBdev>, names: &[String]) -> bool {
    raid.is_some_and(|r| {
        r.base_bdevs_list.iter().any(|b| {
            b.name.as_ref().is_some_and(|n| names.contains(n))
                || b.uuid.as_ref().is_some_and(|u| names.contains(u))
        })
    })
}

/// The names an SPDK rebuild of `replica` is judged by: this node's lvol
/// (alias and UUID), or the namespace `<replica>n1` of its controller.
fn judged_names(inv: &Inventory, local: &BTreeMap<String, LonghornReplica>, replica: &str) -> Vec<String> {
    match local.get(replica) {
        Some(l) => {
            let alias = naming::replica_alias(&l.disk, replica);
            let uuid = inv.lvols.get(&alias).map(|x| x.uuid.clone());
            std::iter::once(alias).chain(uuid).collect()
        }
        None => vec![format!("{replica}n1")],
    }
}

/// The unsettled rebuilds whose SPDK rebuild ended in listing `r`: the
/// member is in service (configured, by its name or UUID, and no process
/// writes it; [`RaidBdev::slot_in_service`]), each with its names.
fn ended<'a>(
    r: &RaidBdev,
    unsettled: &[Unsettled<'a>],
    inv: &Inventory,
    local: &BTreeMap<String, LonghornReplica>,
) -> Vec<(&'a String, &'a u64, Vec<String>)> {
    let mut out = Vec::new();
    for (replica, request) in unsettled {
        let names = judged_names(inv, local, replica);
        if r.slot_in_service(&names).is_some() {
            out.push((*replica, *request, names));
        }
    }
    out
}

/// Whether the raid must be listed again after the rebuild steps: a raid
/// rebuild was started, one is unsettled, a cap is known or listed, or the
/// listing has a process running. Otherwise nothing is left to judge, cap
/// or lift.
fn must_list_raid(
    started_one: bool,
    unsettled: &[Unsettled<'_>],
    all_capped: &[String],
    observed: &[(String, Option<String>)],
    raid: Option<&RaidBdev>,
) -> bool {
    started_one
        || !unsettled.is_empty()
        || !all_capped.is_empty()
        || !observed.is_empty()
        || raid.is_some_and(|r| r.process.is_some())
}

/// The capped members `target` (the member a raid process writes) is:
/// by name, or by the UUID of the lvol or bdev the cap was set on.
fn capped_written(inv: &Inventory, all_capped: &[String], target: &str) -> Vec<String> {
    all_capped
        .iter()
        .filter(|m| {
            let uuid = inv
                .lvols
                .get(*m)
                .map(|l| l.uuid.clone())
                .or_else(|| inv.bdevs.get(*m).and_then(|b| b.uuid.clone()));
            target == m.as_str() || uuid.as_deref() == Some(target)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::longhorn::{InstanceKind, InstanceState};
    use serde_json::json;

    fn st() -> LonghornInstanceStatus {
        super::super::status(InstanceKind::Engine, InstanceState::Running, "")
    }

    fn map<V: Clone>(entries: &[(&str, V)]) -> BTreeMap<String, V> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    /// `r-a` is this node's replica (lvol `u-a`), `r-b` another node's
    /// (controller `r-b`, namespace `r-bn1` with UUID `u-b`).
    fn local() -> BTreeMap<String, LonghornReplica> {
        let r: LonghornReplica = serde_json::from_value(json!({
            "volume": "v", "disk": "d", "sizeBytes": 1048576, "portStart": 20000, "portEnd": 20010
        }))
        .expect("replica");
        [("r-a".to_owned(), r)].into()
    }

    fn inv() -> Inventory {
        let alias = naming::replica_alias("d", "r-a");
        let l: crate::spdk::rpc::Lvol = serde_json::from_value(json!({
            "alias": alias, "uuid": "u-a", "name": "r-a",
            "lvs": { "name": "talon-d", "uuid": "u-d" }
        }))
        .expect("lvol");
        let b: crate::spdk::rpc::Bdev = serde_json::from_value(json!({
            "name": "r-bn1", "block_size": 512, "num_blocks": 2048, "uuid": "u-b"
        }))
        .expect("bdev");
        let raid: crate::spdk::rpc::Bdev = serde_json::from_value(json!({
            "name": "e", "block_size": 4096, "num_blocks": 256
        }))
        .expect("bdev");
        let mut inv = Inventory::default();
        inv.lvols.insert(alias, l);
        inv.bdevs.insert(b.name.clone(), b);
        inv.bdevs.insert(raid.name.clone(), raid);
        inv
    }

    /// A raid1 `e` with `slots` (name, configured) and, with `writing`, a
    /// rebuild process writing that member.
    fn raid(slots: &[(&str, bool)], writing: Option<&str>) -> RaidBdev {
        let slots: Vec<_> = slots
            .iter()
            .map(|(n, c)| json!({ "name": n, "is_configured": c }))
            .collect();
        let process = writing
            .map(|t| json!({ "type": "rebuild", "target": t, "progress": { "blocks": 64, "percent": 25 } }));
        serde_json::from_value(json!({
            "name": "e", "state": "online", "raid_level": "raid1",
            "num_base_bdevs": 2, "num_base_bdevs_discovered": 2, "num_base_bdevs_operational": 2,
            "base_bdevs_list": slots, "process": process
        }))
        .expect("raid")
    }

    /// What was done or copied from for an earlier request is forgotten at
    /// a new `ReplicaAdd` (a new request number) or once the replica is no
    /// longer asked for; a source stays for the request it served.
    #[test]
    fn done_and_sources_carry_over_only_for_the_request_asked_now() {
        let mut prev = st();
        prev.rebuilds_started = map(&[("r-a", 1), ("r-b", 1), ("r-c", 3), ("r-d", 1)]);
        prev.rebuilds_done = map(&[("r-a", 1), ("r-b", 1), ("r-d", 1)]);
        prev.rebuild_sources = map(&[("r-a", "s1"), ("r-b", "s2"), ("r-c", "s3"), ("r-d", "s4")])
            .into_iter()
            .map(|(r, s)| (r, s.to_owned()))
            .collect();
        let requests = map(&[("r-a", 1), ("r-b", 2), ("r-c", 3)]);
        assert_eq!(done_carried(&prev, &requests), map(&[("r-a", 1)]));
        assert_eq!(
            sources_carried(&prev, &requests),
            map(&[("r-a", "s1".to_owned()), ("r-c", "s3".to_owned())])
        );
    }

    /// The percent shown is the last one reported for the same request, and
    /// a copy that starts again (a later round, a failed step) never shows
    /// less; a new request starts from 0.
    #[test]
    fn the_percent_shown_never_goes_back_within_one_request() {
        let mut prev = st();
        prev.rebuilds_started = map(&[("r-a", 1)]);
        prev.thin_rebuilds = map(&[("r-a", 40)]);
        assert_eq!(shown(Some(&prev), "r-a", 1), 40);
        assert_eq!(shown(Some(&prev), "r-a", 2), 0, "a new request");
        assert_eq!(shown(Some(&prev), "r-b", 1), 0, "never reported");
        assert_eq!(shown(None, "r-a", 1), 0);
        assert_eq!(copy_percent(10, 100).max(shown(Some(&prev), "r-a", 1)), 40);
        assert_eq!(copy_percent(60, 100).max(shown(Some(&prev), "r-a", 1)), 60);
    }

    /// A thin copy shows 99% at most (100 is the replica joined), and a
    /// copy of a total not known yet shows 0.
    #[test]
    fn a_thin_copy_shows_below_100_until_the_replica_joined() {
        assert_eq!(copy_percent(0, 0), 0);
        assert_eq!(copy_percent(5, 0), 0);
        assert_eq!(copy_percent(1, 3), 33);
        assert_eq!(copy_percent(50, 100), 50);
        assert_eq!(copy_percent(100, 100), 99);
        assert_eq!(progress_line("r-a", 33, 1, 3), "r-a 33% 1/3 bytes");
    }

    /// Unsettled: started by the previous reconcile for the same request,
    /// not seen done, and not failed to start.
    #[test]
    fn unsettled_are_the_rebuilds_started_before_neither_done_nor_failed() {
        let mut prev = st();
        prev.rebuilds_started = map(&[("r-a", 1), ("r-b", 1), ("r-c", 1), ("r-d", 1)]);
        prev.rebuild_errors = map(&[("r-c", "no lvol".to_owned())]);
        let requests = map(&[("r-a", 1), ("r-b", 1), ("r-c", 1), ("r-d", 2), ("r-e", 1)]);
        let done = map(&[("r-b", 1)]);
        let got: Vec<(String, u64)> = unsettled(&requests, &done, Some(&prev))
            .into_iter()
            .map(|(r, n)| (r.clone(), *n))
            .collect();
        assert_eq!(got, [("r-a".to_owned(), 1)]);
        assert!(
            unsettled(&requests, &done, None).is_empty(),
            "nothing started before"
        );
    }

    /// A replica holds a slot (configured or not) by any of its names: an
    /// lvol's alias or UUID, a namespace's name or UUID.
    #[test]
    fn a_replica_is_in_a_slot_by_name_or_uuid_configured_or_not() {
        let names = vec!["talon-d/r-a".to_owned(), "u-a".to_owned()];
        assert!(in_a_slot(Some(&raid(&[("u-a", false)], None)), &names));
        assert!(in_a_slot(Some(&raid(&[("talon-d/r-a", true)], None)), &names));
        let by_uuid: RaidBdev = {
            let mut r = raid(&[("x", true)], None);
            r.base_bdevs_list[0].uuid = Some("u-a".into());
            r
        };
        assert!(in_a_slot(Some(&by_uuid), &names));
        assert!(!in_a_slot(Some(&raid(&[("r-bn1", true)], None)), &names));
        assert!(!in_a_slot(None, &names), "no raid");
    }

    /// SPDK's rebuild of an unsettled replica ended once its member is in a
    /// configured slot (by name or UUID) and no process writes it; a remote
    /// replica is judged by its namespace's name.
    #[test]
    fn an_spdk_rebuild_ended_when_its_member_is_configured_and_no_process_writes_it() {
        let (inv, local) = (inv(), local());
        let (a, b, one) = ("r-a".to_owned(), "r-b".to_owned(), 1u64);
        let unsettled = [(&a, &one), (&b, &one)];
        let names = |r: &RaidBdev| -> Vec<String> {
            ended(r, &unsettled, &inv, &local)
                .into_iter()
                .map(|(r, _, _)| r.clone())
                .collect()
        };
        assert_eq!(
            names(&raid(&[("u-a", true), ("r-bn1", true)], None)),
            ["r-a", "r-b"]
        );
        assert_eq!(
            names(&raid(&[("u-a", true), ("r-bn1", true)], Some("r-bn1"))),
            ["r-a"],
            "a process writes r-b"
        );
        assert_eq!(
            names(&raid(&[("u-a", false), ("u-b", true)], None)),
            Vec::<String>::new()
        );
        // listed by another name, its UUID the lvol's (SPDK may list a slot so)
        let mut by_uuid = raid(&[("x", true), ("r-bn1", false)], None);
        by_uuid.base_bdevs_list[0].uuid = Some("u-a".into());
        assert_eq!(names(&by_uuid), ["r-a"], "r-a by its UUID");
        let got = ended(&raid(&[("u-a", true)], None), &unsettled, &inv, &local);
        assert_eq!(got[0].2, [naming::replica_alias("d", "r-a"), "u-a".to_owned()]);
        assert_eq!(judged_names(&inv, &local, "r-b"), ["r-bn1"]);
    }

    /// The raid is listed again only when there is something to judge, cap
    /// or lift: a raid rebuild started now, an unsettled one, a cap known or
    /// listed, or a process in the listing.
    #[test]
    fn the_raid_is_listed_again_only_with_a_rebuild_or_cap_to_look_after() {
        let (a, one) = ("r-a".to_owned(), 1u64);
        let idle = raid(&[("u-a", true)], None);
        let busy = raid(&[("u-a", true)], Some("u-a"));
        let capped = vec!["talon-d/r-a".to_owned()];
        let observed = vec![("u-a".to_owned(), None)];
        assert!(!must_list_raid(false, &[], &[], &[], Some(&idle)));
        assert!(!must_list_raid(false, &[], &[], &[], None));
        assert!(must_list_raid(true, &[], &[], &[], Some(&idle)));
        assert!(must_list_raid(false, &[(&a, &one)], &[], &[], Some(&idle)));
        assert!(must_list_raid(false, &[], &capped, &[], Some(&idle)));
        assert!(must_list_raid(false, &[], &[], &observed, Some(&idle)));
        assert!(must_list_raid(false, &[], &[], &[], Some(&busy)));
    }

    /// The member a raid process writes is the capped one it names by name,
    /// or by the UUID of the lvol or bdev the cap was set on.
    #[test]
    fn the_capped_member_a_rebuild_writes_is_found_by_name_or_uuid() {
        let inv = inv();
        let alias = naming::replica_alias("d", "r-a");
        let capped = vec![alias.clone(), "r-bn1".to_owned(), "r-cn1".to_owned()];
        assert_eq!(capped_written(&inv, &capped, "u-a"), [alias.as_str()]);
        assert_eq!(capped_written(&inv, &capped, &alias), [alias.as_str()]);
        assert_eq!(capped_written(&inv, &capped, "u-b"), ["r-bn1"]);
        assert_eq!(capped_written(&inv, &capped, "r-cn1"), ["r-cn1"]);
        assert!(capped_written(&inv, &capped, "u-x").is_empty());
    }

    /// A raid rebuild is reported in bytes of the raid's blocks (0 when the
    /// raid's bdev is not listed).
    #[test]
    fn a_raid_rebuild_is_reported_in_bytes_of_the_raid() {
        let r = raid(&[("u-a", true)], Some("u-a"));
        let p = r.process.as_ref().expect("process");
        assert_eq!(raid_progress(&inv(), "e", p), "u-a 25% 262144/1048576 bytes");
        assert_eq!(raid_progress(&Inventory::default(), "e", p), "u-a 25% 0/0 bytes");
    }
}
