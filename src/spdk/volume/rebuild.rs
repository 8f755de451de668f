//! Thin rebuild: a local replica that is behind is made again from a local
//! up-to-date one by copying only the clusters the source holds, snapshot by
//! snapshot, so the rebuilt replica is as thin as its source and has the
//! same snapshot chain.
//!
//! SPDK's own raid1 rebuild (`bdev_raid_add_base_bdev`) reads the whole raid
//! and writes every block to the new member (`raid_bdev_process` in v26.05's
//! bdev_raid.c): a 10 GiB volume with 100 MiB written ends with 10 GiB
//! allocated, and its snapshots are not rebuilt at all. Here instead:
//!
//! ```text
//!  source r_s:  S1 <- S2 <- ... <- head (raid member, written)
//!  dest   r_k:  S1' <- S2' <- ... <- head' (not in the raid: no I/O)
//!   1. head' empty over the copies both chains share (a stale head' goes)
//!   2. next snapshot of the source: bdev_lvol_start_shallow_copy S -> head'
//!      (only S's own clusters), then head' is snapshotted as S' ; repeat
//!   3. chain copied, the source head's own clusters are few: the switch
//!      (a source head with many of them is snapshotted as `rb.<n>` first,
//!      and that snapshot is copied the same way while I/O goes on)
//!   4. switch: the export's listeners go (hosts keep their I/O queued and
//!      reconnect), the namespace and the raid go (the superblock cleared on
//!      the members), the source head (idle now) is snapshotted `rb.<n>`,
//!      copied and snapshotted on the dest, the raid is made again over the
//!      up-to-date members and head' (equal now: no resync), and exported
//!      again with the same namespace ids
//!   5. the `rb.<n>` snapshots are deleted (merged into their one clone)
//! ```
//!
//! The steps are carried out by the one step machine of every thin rebuild,
//! [`thin::step`]; this module gives it a talon volume's ends
//! ([`TalonEnds`]: a local dest, or a remote one through its node) and
//! counts the failures that send a volume to SPDK's full rebuild. Every
//! step is derived from what SPDK holds, so a restart of talon or of
//! spdk_tgt goes on from the copies made so far; only the running copy's id
//! is kept in memory (SPDK forgets it with a restart too, and the head it
//! was copying into is then made again). Until the switch the dest is not in
//! the raid and not in the ledger: it is never served while it is behind. A
//! failure inside the switch serves the volume again over the members it
//! had ([`VolumeOps::switch_restore`]); the dest is not one. The switch
//! itself, with its checks, is the one of both engines (`switch.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::lvol::{HeadFrom, remake_head};
use super::thin::{self, At, CopyState};
use super::{
    EngineNames, ExportSpec, Inventory, ReplicaInfo, Switch, SwitchSide, VolumeError, VolumeOps, VolumePlan,
    ignore_missing, naming, rpc,
};
use crate::names::Nqn;
use crate::resources::engine::RebuildDestStatus;
use crate::spdk::naming::{LvolRole, NSID, REMOTE_PREFIX, parse_lvol};
use crate::spdk::rpc::{ByName, LvolCreate, LvolSnapshot, RaidBdev, RemoveNamespace};

const MIB: u64 = 1 << 20;
/// How long a remote dest's node that did not answer is left alone.
const NO_ANSWER_PAUSE: Duration = Duration::from_secs(3);

/// The thin rebuilds of one target: the running copies, and the failed
/// steps per rebuild ([`thin::Failures`], the one policy of every thin
/// rebuild; one given up sends its volume to SPDK's full rebuild). The
/// runtime's backoff of a failing reconcile is the pause between its steps.
#[derive(Debug, Default, Clone)]
pub(super) struct Rebuilds {
    state: Arc<Mutex<RebuildState>>,
    runs: thin::Runs,
    failures: thin::Failures,
}

#[derive(Debug, Default)]
struct RebuildState {
    /// Per volume: the source's rebuild snapshots copied into a remote
    /// dest's head since it was last made ready (they are not snapshotted
    /// there: the head keeps their clusters until the switch, or until the
    /// next named snapshot of the chain is copied over them and taken).
    remote_rb: HashMap<String, Vec<String>>,
    /// Per volume: when a remote dest's node that did not answer is asked again.
    asked: HashMap<String, tokio::time::Instant>,
}

impl Rebuilds {
    fn lock(&self) -> std::sync::MutexGuard<'_, RebuildState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Whether volume `vol` rebuilds thin (no thin rebuild of it was given up).
    pub(super) fn thin_allowed(&self, vol: &str) -> bool {
        !self.failures.given_up(vol)
    }
    fn failed(&self, vol: &str, dest: &str) -> thin::Failed {
        self.runs.remove_all(vol);
        self.lock().remote_rb.remove(vol);
        self.failures.failed(vol, dest, std::time::Instant::now())
    }
    fn succeeded(&self, vol: &str) {
        self.runs.remove_all(vol);
        self.lock().remote_rb.remove(vol);
        self.failures.forget_all(vol);
    }
    /// Whether a copy runs for volume `vol`.
    pub(super) fn running(&self, vol: &str) -> bool {
        self.runs.any(vol)
    }
}

/// Where a thin rebuild stands after one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Copying; percent of the source's clusters copied.
    Copying(u32),
    /// The replica is a member of the raid again, up to date.
    Joined,
}

/// The snapshot name of an lvol name (`S` of `<vol>-r<s>.s.<S>`).
fn snap_of(inv: &Inventory, alias: &str) -> Option<String> {
    match parse_lvol(&inv.lvols.get(alias)?.name)? {
        LvolRole::Snapshot { snap, .. } => Some(snap),
        _ => None,
    }
}

fn allocated(inv: &Inventory, alias: &str) -> u64 {
    inv.lvols.get(alias).map_or(0, |l| l.num_allocated_clusters)
}

/// The lvstore of lvol `alias` (`lvs/name`).
pub(super) fn lvs_of(alias: &str) -> &str {
    alias.split_once('/').map_or("", |(l, _)| l)
}

/// `lvs/name` of an lvol named `name` in the lvstore of `alias`.
pub(super) fn sibling(alias: &str, name: &str) -> String {
    format!("{}/{name}", lvs_of(alias))
}

/// The cluster size of the lvstore holding lvol `alias`, when listed.
fn cluster_of(inv: &Inventory, alias: &str) -> Option<u64> {
    let lvs = lvs_of(alias);
    inv.lvstores
        .iter()
        .find(|l| l.name == lvs)
        .map(|l| l.cluster_size)
}

/// The bdev a rebuild copies into: a local dest's head, or the NVMe/TCP
/// bdev of a remote one (its head on its node).
fn dst_target(dst: &ReplicaInfo) -> String {
    if dst.bdev.starts_with(REMOTE_PREFIX) {
        dst.bdev.clone()
    } else {
        dst.alias.clone()
    }
}

/// Whether a thin copy from `src` to `dst` lands where the raid reads it:
/// with a superblock, the raid's data starts at 1 MiB rounded up to a
/// member's optimal I/O boundary (v26.05 `raid_bdev_configure_base_bdev`),
/// an lvol's cluster (see [`superblock_room`]), and on a remote replica's
/// NVMe/TCP bdev at 1 MiB (the target reports an NOIOB of at most its
/// 128 KiB I/O size). The copies keep offsets, so the two must be equal.
pub(super) fn same_room(inv: &Inventory, plan: &VolumePlan, src: &ReplicaInfo, dst: &ReplicaInfo) -> bool {
    if !plan.uses_superblock() {
        return true;
    }
    let room = |r: &ReplicaInfo| {
        if r.bdev.starts_with(REMOTE_PREFIX) {
            return Some(MIB);
        }
        cluster_of(inv, &r.alias).map(super::superblock_room)
    };
    room(src).is_some_and(|a| room(dst) == Some(a))
}

/// The node of remote replica `k` of `plan`, when talon can call it.
pub(super) fn remote_dest(plan: &VolumePlan, k: usize) -> Option<&dyn RemoteDest> {
    let i = k.checked_sub(plan.replicas)?;
    plan.remote_dests.get(i)?.as_deref()
}

/// The source's chain as a rebuild copies it: its lvols' aliases, oldest
/// first, their snapshot names (the dest's copies are named by them), and
/// what each holds of its own then the source head.
struct SourceChain {
    aliases: Vec<String>,
    snaps: Vec<String>,
    own: Vec<u64>,
}

impl SourceChain {
    /// The chain below source replica `src`; `None` when it holds a
    /// snapshot that is not talon's (its copy could not be named).
    fn of(inv: &Inventory, src: &ReplicaInfo) -> Option<Self> {
        let aliases = inv.chain(&src.alias);
        let snaps: Vec<String> = aliases.iter().filter_map(|a| snap_of(inv, a)).collect();
        if snaps.len() != aliases.len() {
            return None;
        }
        let own = aliases
            .iter()
            .chain([&src.alias])
            .map(|a| allocated(inv, a))
            .collect();
        Some(Self { aliases, snaps, own })
    }
}

/// What every step of a talon volume's rebuild knows: the volume, the
/// listing the step works from, the raid, the two replicas and the source's
/// chain.
struct Rebuild<'a> {
    ops: &'a VolumeOps,
    inv: &'a Inventory,
    plan: &'a VolumePlan,
    raid: &'a RaidBdev,
    src: &'a ReplicaInfo,
    dst: &'a ReplicaInfo,
    /// The raid's up-to-date members by slot (the dest joins its own slot
    /// at the switch).
    members: &'a [Option<String>],
    chain: SourceChain,
}

impl Rebuild<'_> {
    fn vol(&self) -> &str {
        self.plan.name.as_str()
    }

    fn failed(&self, snapshot: &str, message: String) -> VolumeError {
        VolumeError::RebuildCopy {
            volume: self.vol().to_owned(),
            replica: self.dst.name.clone(),
            snapshot: snapshot.to_owned(),
            message,
        }
    }
}

/// A local dest as the step's listing shows it: its head and its copies
/// (`<vol>-r<k>.s.<S>`) are lvols of this target.
struct LocalView {
    /// Whether the dest's head is there (one made by this reconcile is not
    /// listed yet: the next step sees it).
    head: bool,
    /// The copies it holds of the source's chain, from the oldest on, each
    /// over the one before.
    shared: Vec<String>,
    /// Whether its head is empty right above them.
    head_ready: bool,
    /// A copy of the next snapshot off the chain (an earlier attempt).
    in_the_way: Option<String>,
}

impl LocalView {
    fn of(r: &Rebuild<'_>) -> Self {
        let (inv, vol, dst) = (r.inv, r.vol(), r.dst);
        let head = inv.lvols.get(&dst.alias);
        // the copies the dest already has: its snapshots of the source's
        // chain, from the oldest on, each over the one before (taken while
        // it was in service, or copied by an earlier rebuild: that instant)
        let mut shared: Vec<String> = Vec::new();
        for snap in &r.chain.snaps {
            let d = sibling(&dst.alias, &naming::snapshot_lvol(vol, dst.k, snap));
            if !inv.lvols.contains_key(&d) || inv.parent_of(&d) != shared.last().cloned() {
                break;
            }
            shared.push(d);
        }
        // the dest head must be empty and right above them: a head with data
        // of its own (what it held when it fell behind, or a copy that did
        // not finish) or over other snapshots is made again
        let head_ready =
            head.is_some_and(|h| h.num_allocated_clusters == 0) && inv.chain(&dst.alias) == shared;
        let in_the_way = r
            .chain
            .snaps
            .get(shared.len())
            .map(|snap| sibling(&dst.alias, &naming::snapshot_lvol(vol, dst.k, snap)))
            .filter(|copy| inv.lvols.contains_key(copy));
        Self {
            head: head.is_some(),
            shared,
            head_ready,
            in_the_way,
        }
    }
}

/// Where a talon volume's dest is.
enum Dest<'a> {
    /// In this target.
    Local(LocalView),
    /// Served by another node (`node` answers for its head and snapshots);
    /// the copies are written from here into its head through its NVMe/TCP
    /// bdev. The source's rebuild snapshots are not snapshotted there: the
    /// head keeps their clusters until the switch (what the engine then
    /// serves from it), or until a named snapshot after them in the chain
    /// is copied over them and taken with them.
    Remote {
        node: &'a dyn RemoteDest,
        /// The source's chain without its rebuild snapshots: what the
        /// node holds of it.
        named: Vec<String>,
    },
}

/// The ends of a talon volume's thin rebuild.
struct TalonEnds<'a> {
    r: Rebuild<'a>,
    dest: Dest<'a>,
}

impl TalonEnds<'_> {
    /// Where remote dest `node` stands: right after the last rebuild
    /// snapshot copied into its head, or (none is) after the named
    /// snapshots it holds. So each copy goes in the chain's order: a
    /// snapshot taken on the source after a rebuild snapshot (a user's,
    /// during the rebuild) is copied over that one's clusters, never under
    /// them.
    async fn remote_at(&self, node: &dyn RemoteDest, named: &[String]) -> Result<At, VolumeError> {
        let (ops, vol, dst, snaps) = (self.r.ops, self.r.vol(), self.r.dst, &self.r.chain.snaps);
        let last_rb = ops
            .rebuilds
            .lock()
            .remote_rb
            .get(vol)
            .and_then(|c| c.last().cloned());
        if let Some(i) = last_rb.and_then(|rb| snaps.iter().position(|s| *s == rb)) {
            return Ok(At::Holds {
                shared: i + 1,
                ready: true,
            });
        }
        ops.rebuilds.lock().remote_rb.remove(vol);
        // the dest's head empty right above the snapshots it shares (a
        // node that does not answer is asked again after a pause, without
        // holding up this reconcile or counting a failure)
        let now = tokio::time::Instant::now();
        if ops.rebuilds.lock().asked.get(vol).is_some_and(|t| *t > now) {
            return Ok(At::Busy { shared: 0 });
        }
        let st = match node.prepare(named).await {
            Ok(st) => st,
            Err(PrepareError::NoAnswer(m)) => {
                tracing::info!(volume = vol, replica = %dst.name, why = %m,
                    "remote replica's node does not answer; its rebuild waits");
                ops.rebuilds
                    .lock()
                    .asked
                    .insert(vol.to_owned(), now + NO_ANSWER_PAUSE);
                return Ok(At::Busy { shared: 0 });
            }
            Err(PrepareError::Refused(m)) => return Err(self.r.failed("", m)),
        };
        if !st.stale.is_empty() {
            for s in &st.stale {
                node.delete_snapshot(s)
                    .await
                    .map_err(|e| self.r.failed(s, e.to_string()))?;
            }
            tracing::info!(volume = vol, replica = %dst.name, stale = ?st.stale,
                "snapshots the source does not hold at their place deleted on the remote replica");
            return Ok(At::Busy { shared: 0 });
        }
        let held = (st.shared as usize).min(named.len());
        let shared = held
            .checked_sub(1)
            .and_then(|n| snaps.iter().position(|s| *s == named[n]))
            .map_or(0, |i| i + 1);
        if st.reset {
            // its namespace went and came back: attached afresh (next reconcile)
            tracing::info!(volume = vol, replica = %dst.name, shared = st.shared,
                "rebuilding remote replica thin from r{}", self.r.src.k);
            ops.reattach(vol, dst).await;
            return Ok(At::Busy { shared });
        }
        Ok(At::Holds { shared, ready: true })
    }

    /// Makes local dest `view`'s head empty right above the `j` copies it
    /// shares, or deletes the copy in the way of the next one.
    async fn make_local_ready(&self, view: &LocalView, j: usize) -> Result<(), VolumeError> {
        let (ops, vol, dst) = (self.r.ops, self.r.vol(), self.r.dst);
        if view.head_ready {
            if let Some(copy) = &view.in_the_way {
                ignore_missing(ops.client.bdev_lvol_delete(&ByName::new(copy)))
                    .await
                    .map_err(rpc(
                        vol,
                        format!("deleting {copy}, an earlier copy off the chain"),
                    ))?;
            }
            return Ok(());
        }
        let from = match view.shared.last() {
            Some(parent) => HeadFrom::Snapshot(parent),
            None => HeadFrom::Fresh(self.r.src.size_bytes.div_ceil(MIB)),
        };
        remake_head(
            &ops.client,
            lvs_of(&dst.alias),
            &naming::replica(vol, dst.k),
            from,
        )
        .await
        .map_err(|f| rpc(vol, format!("{} to rebuild it", f.doing))(f.source))?;
        tracing::info!(volume = vol, replica = %dst.name, shared = j, "rebuilding replica thin from r{}", self.r.src.k);
        Ok(())
    }

    /// Keeps a finished copy of `snap` in remote dest `node`: a named
    /// snapshot is snapshotted there (the rebuild snapshots copied into the
    /// head before it go into that snapshot with it); a rebuild snapshot's
    /// clusters stay in the head.
    async fn keep_remote(&self, node: &dyn RemoteDest, snap: &str) -> Result<(), VolumeError> {
        let (ops, vol) = (self.r.ops, self.r.vol());
        if naming::is_rebuild_snap(snap) {
            ops.rebuilds
                .lock()
                .remote_rb
                .entry(vol.to_owned())
                .or_default()
                .push(snap.to_owned());
            return Ok(());
        }
        node.snapshot(snap)
            .await
            .map_err(|e| self.r.failed(snap, e.to_string()))?;
        ops.rebuilds.lock().remote_rb.remove(vol);
        Ok(())
    }
}

#[async_trait::async_trait]
impl thin::Ends for TalonEnds<'_> {
    type Error = VolumeError;

    /// The volume's ledger ([`VolumePlan::in_sync`], as persisted before
    /// this pass) has the dest out.
    fn dest_recorded_out(&self) -> bool {
        self.r
            .plan
            .in_sync
            .as_ref()
            .is_some_and(|s| !s.contains(&self.r.dst.k))
    }

    fn of(&self) -> &str {
        self.r.vol()
    }

    fn dest(&self) -> &str {
        &self.r.dst.name
    }

    fn chain(&self) -> &[String] {
        &self.r.chain.snaps
    }

    fn own(&self) -> &[u64] {
        &self.r.chain.own
    }

    fn cluster(&self) -> u64 {
        1
    }

    fn busy_head(&self) -> bool {
        let (inv, src) = (self.r.inv, self.r.src);
        let cluster = cluster_of(inv, &src.alias).unwrap_or(1);
        let over_nvme_tcp = matches!(self.dest, Dest::Remote { .. });
        allocated(inv, &src.alias).saturating_mul(cluster) > thin::switch_bytes(over_nvme_tcp)
    }

    fn rounds(&self) -> usize {
        self.r
            .chain
            .snaps
            .iter()
            .filter(|s| naming::is_rebuild_snap(s))
            .count()
    }

    async fn at(&self) -> Result<At, VolumeError> {
        match &self.dest {
            Dest::Local(v) if !v.head => Ok(At::Busy { shared: 0 }),
            Dest::Local(v) => Ok(At::Holds {
                shared: v.shared.len(),
                ready: v.head_ready && v.in_the_way.is_none(),
            }),
            Dest::Remote { node, named } => self.remote_at(*node, named).await,
        }
    }

    async fn make_ready(&self, j: usize) -> Result<(), VolumeError> {
        match &self.dest {
            Dest::Local(v) => self.make_local_ready(v, j).await,
            // its node makes it ready when `at` asks
            Dest::Remote { .. } => Ok(()),
        }
    }

    async fn start_copy(&self, j: usize) -> Result<thin::Copier, VolumeError> {
        let r = &self.r;
        r.ops
            .copy_into(r.vol(), &r.chain.aliases[j], r.dst)
            .await
            .map(thin::Copier::Here)
    }

    async fn check(&self, run: &thin::Run) -> Result<Option<CopyState>, VolumeError> {
        Ok(match run.copier {
            thin::Copier::Here(op) => thin::copy_state(&self.r.ops.client, op).await.ok(),
            thin::Copier::Elsewhere => None,
        })
    }

    async fn copy_failed(&self, run: &thin::Run, message: String) -> VolumeError {
        if let Dest::Remote { .. } = self.dest {
            self.r.ops.reattach(self.r.vol(), self.r.dst).await;
        }
        self.r.failed(&run.snap, message)
    }

    fn copy_lost(&self) {
        if let Dest::Remote { .. } = self.dest {
            self.r.ops.rebuilds.lock().remote_rb.remove(self.r.vol());
        }
    }

    async fn keep(&self, snap: &str) -> Result<(), VolumeError> {
        let r = &self.r;
        match &self.dest {
            Dest::Local(_) => r.ops.keep_copy(r.vol(), &r.dst.alias, r.dst.k, snap).await,
            Dest::Remote { node, .. } => self.keep_remote(*node, snap).await,
        }
    }

    async fn round(&self) -> Result<String, VolumeError> {
        let r = &self.r;
        r.ops
            .take_rebuild_snapshot(r.inv, r.vol(), r.src)
            .await
            .map(|(snap, _)| snap)
    }

    async fn close(&self) -> Result<(), VolumeError> {
        self.r.close().await
    }

    async fn start_last_copy(&self, snap: &str) -> Result<thin::Copier, VolumeError> {
        let r = &self.r;
        let alias = sibling(&r.src.alias, &naming::snapshot_lvol(r.vol(), r.src.k, snap));
        r.ops
            .copy_into(r.vol(), &alias, r.dst)
            .await
            .map(thin::Copier::Here)
    }

    async fn join(&self, snap: &str) -> Result<(), VolumeError> {
        self.r.join(snap).await
    }

    async fn restore(&self) {
        self.r.restore().await;
    }
}

/// The switch's ends of a talon volume ([`thin::switch`]): the one checked
/// switch ([`Switch`]) under talon's names, the dest in its own slot.
impl Rebuild<'_> {
    /// The switch of this rebuild under `names` (talon's), exported as `spec`.
    fn switch<'b>(&'b self, names: &'b EngineNames, spec: &'b ExportSpec) -> Switch<'b> {
        Switch {
            of: self.vol(),
            replica: &self.dst.name,
            names,
            spec,
            raid: self.raid,
            source: &self.src.alias,
            slots: self.members,
            dest_slot: self.dst.k,
        }
    }

    async fn close(&self) -> Result<(), VolumeError> {
        let (names, spec) = (EngineNames::volume(&self.plan.name), self.plan.host_export());
        self.ops
            .switch_close(self.inv, &self.switch(&names, &spec), self)
            .await
    }

    async fn join(&self, snap: &str) -> Result<(), VolumeError> {
        let (names, spec) = (EngineNames::volume(&self.plan.name), self.plan.host_export());
        self.ops
            .switch_join(&self.switch(&names, &spec), snap, self)
            .await
    }

    async fn restore(&self) {
        let (names, spec) = (EngineNames::volume(&self.plan.name), self.plan.host_export());
        self.ops.switch_restore(&self.switch(&names, &spec)).await;
    }
}

/// A talon dest is reached as it is: a local head, or a remote one's
/// NVMe/TCP bdev attached for the copies.
#[async_trait::async_trait]
impl SwitchSide for Rebuild<'_> {
    type Error = VolumeError;

    async fn dest_bdev(&self) -> Result<String, VolumeError> {
        Ok(dst_target(self.dst))
    }
}

/// The snapshot names of a chain without the rebuild snapshots.
fn named(snaps: &[String]) -> Vec<String> {
    snaps
        .iter()
        .filter(|s| !naming::is_rebuild_snap(s))
        .cloned()
        .collect()
}

impl VolumeOps {
    /// One step of the thin rebuild of replica `dst` (local, or remote with
    /// a node talon can call) from local replica `src` (in the raid, up to
    /// date). `members`: the raid's up-to-date members by slot (`dst` joins
    /// its own slot at the switch).
    pub(super) async fn thin_rebuild(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        raid: &RaidBdev,
        src: &ReplicaInfo,
        dst: &ReplicaInfo,
        members: &[Option<String>],
    ) -> Result<Step, VolumeError> {
        let vol = plan.name.as_str();
        let step = match SourceChain::of(inv, src) {
            Some(chain) => {
                let r = Rebuild {
                    ops: self,
                    inv,
                    plan,
                    raid,
                    src,
                    dst,
                    members,
                    chain,
                };
                let dest = match remote_dest(plan, dst.k) {
                    Some(node) => Dest::Remote {
                        node,
                        named: named(&r.chain.snaps),
                    },
                    None => Dest::Local(LocalView::of(&r)),
                };
                thin::step(&TalonEnds { r, dest }, &self.rebuilds.runs).await
            }
            None => Err(VolumeError::RebuildCopy {
                volume: vol.to_owned(),
                replica: dst.name.clone(),
                snapshot: String::new(),
                message: "the source's chain holds a snapshot that is not talon's".into(),
            }),
        };
        match step {
            Ok(thin::Step::Joined) => {
                self.rebuilds.succeeded(vol);
                Ok(Step::Joined)
            }
            Ok(thin::Step::Copying { copied, total }) => {
                // 99 at most: done is `Joined`
                let pct = (copied * 100).checked_div(total).unwrap_or(0).min(99);
                Ok(Step::Copying(u32::try_from(pct).unwrap_or(99)))
            }
            Err(e) => {
                let (n, then) = match self.rebuilds.failed(vol, &dst.name) {
                    thin::Failed::Retry(n) => (n, ""),
                    thin::Failed::ForGood(n) => (n, " with SPDK's full rebuild"),
                };
                tracing::warn!(volume = vol, replica = %dst.name, failures = n, error = %crate::util::error_chain(&e),
                    "thin rebuild step failed; tried again at the next reconcile{then}");
                Err(e)
            }
        }
    }

    /// Detaches the controller of remote replica `dst` (best effort): the
    /// next reconcile attaches it afresh.
    async fn reattach(&self, vol: &str, dst: &ReplicaInfo) {
        let ctrl = format!("{REMOTE_PREFIX}{}", dst.name);
        if let Err(e) = super::lvol::detach_controller(&self.client, &ctrl).await {
            tracing::warn!(volume = vol, replica = %dst.name, error = %e, "remote replica not detached");
        }
    }

    /// Starts the shallow copy of source snapshot `s` into the dest head
    /// (a local one grown to `s`'s size first); answers the operation id.
    /// Not capped by `rebuildMibPerSec`: on v26.05 a QoS limit set on a
    /// bdev nobody has open (the head, until a copy opens it) can never be
    /// changed or lifted again (`bdev_set_qos_limit` answers EAGAIN from
    /// then on, seen on a real target), and the head becomes a raid member.
    async fn copy_into(&self, vol: &str, s: &str, dst: &ReplicaInfo) -> Result<u32, VolumeError> {
        let target = dst_target(dst);
        // a remote head: its node sizes it (to the volume's size)
        if target == dst.alias {
            let size = match self
                .client
                .bdev(s)
                .await
                .map_err(rpc(vol, format!("looking up {s}")))?
            {
                Some(b) => b.size_bytes(),
                None => 0,
            };
            let head = self
                .client
                .bdev(&dst.alias)
                .await
                .map_err(rpc(vol, format!("looking up {}", dst.alias)))?
                .map_or(0, |b| b.size_bytes());
            if head < size {
                super::lvol::resize(&self.client, &dst.alias, size.div_ceil(MIB))
                    .await
                    .map_err(rpc(vol, format!("growing {} to {s}'s size", dst.alias)))?;
            }
        }
        thin::start_copy(&self.client, s, &target)
            .await
            .map_err(rpc(vol, format!("copying {s}'s clusters to {target}")))
    }

    /// The next free `rb.<n>` of a volume.
    fn next_rebuild_snap(&self, inv: &Inventory, vol: &str) -> String {
        let n = thin::next_round(inv.lvols.values().filter_map(|l| match parse_lvol(&l.name)? {
            LvolRole::Snapshot { volume, snap, .. } if volume == vol => {
                naming::rebuild_snap_number(&snap).map(u64::from)
            }
            _ => None,
        }));
        naming::rebuild_snap(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Snapshots the source head as the next `rb.<n>`; returns the snapshot
    /// name and the snapshot lvol's alias.
    async fn take_rebuild_snapshot(
        &self,
        inv: &Inventory,
        vol: &str,
        src: &ReplicaInfo,
    ) -> Result<(String, String), VolumeError> {
        let snap = self.next_rebuild_snap(inv, vol);
        let name = naming::snapshot_lvol(vol, src.k, &snap);
        super::lvol::snapshot(&self.client, &src.alias, &name)
            .await
            .map_err(rpc(
                vol,
                format!("taking rebuild snapshot {name} of {}", src.alias),
            ))?;
        Ok((snap, sibling(&src.alias, &name)))
    }

    /// Keeps what a finished copy put in dest head `head` as replica `k`'s
    /// snapshot `snap` (the head is its clone, empty, after).
    async fn keep_copy(&self, vol: &str, head: &str, k: usize, snap: &str) -> Result<(), VolumeError> {
        let name = naming::snapshot_lvol(vol, k, snap);
        self.client
            .bdev_lvol_snapshot(&LvolSnapshot {
                lvol_name: head.to_owned(),
                snapshot_name: name.clone(),
            })
            .await
            .map_err(rpc(vol, format!("snapshotting rebuilt {head} as {name}")))?;
        Ok(())
    }

    /// Deletes a volume's rebuild snapshots (`<vol>-r<k>.s.rb.<n>`): each is
    /// merged into its one clone. Best effort: one that cannot go now is
    /// tried again at the next reconcile.
    pub(super) async fn drop_rebuild_snapshots(&self, inv: &Inventory, vol: &str) {
        let mut rb: Vec<(u32, String)> = inv
            .lvols
            .values()
            .filter(|l| l.lvs.name.starts_with(naming::LVS_PREFIX))
            .filter_map(|l| match parse_lvol(&l.name)? {
                LvolRole::Snapshot { volume, snap, .. } if volume == vol => {
                    Some((naming::rebuild_snap_number(&snap)?, l.alias.clone()))
                }
                _ => None,
            })
            .collect();
        rb.sort();
        for (_, alias) in rb {
            if let Err(e) = ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&alias))).await {
                tracing::warn!(volume = vol, snapshot = %alias, error = %e, "rebuild snapshot not deleted yet");
            }
        }
    }
}

/// Why a remote replica's node did not make it ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// No answer in time (the node, or its target, is down or restarting):
    /// asked again later, not counted as a failed rebuild.
    #[error("{0}")]
    NoAnswer(String),
    /// The node answered with an error.
    #[error("{0}")]
    Refused(String),
}

/// A call to the node that serves a remote replica (`node`: talon's admin
/// API there, or a Longhorn node's SPDKService) that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// This node has no token to call its peers with.
    #[error("no peer token on this node (talon serve --peer-token-file): cannot call {node}")]
    NoToken {
        /// The peer's admin API address.
        node: String,
    },
    /// The peer was not reached in time.
    #[error("talon at {node} did not answer in {after:?}")]
    NoAnswer {
        /// The peer's admin API address.
        node: String,
        /// How long it was waited for.
        after: std::time::Duration,
    },
    /// The peer could not be reached.
    #[error("talon at {node}: {message}")]
    Connect {
        /// The peer's admin API address.
        node: String,
        /// Why (the error's chain).
        message: String,
    },
    /// The peer did not take snapshot `volume@snap` (`message`: what it
    /// said, or how long it was waited for).
    #[error("talon at {node}: snapshot {volume}@{snap}{message}")]
    Snapshot {
        /// The peer's admin API address.
        node: String,
        /// Its replica.
        volume: String,
        /// The snapshot.
        snap: String,
        /// `: <its answer>`, or ` not taken in <time>`.
        message: String,
    },
    /// The peer did not delete snapshot `volume@snap`.
    #[error("talon at {node}: deleting snapshot {volume}@{snap}: {message}")]
    DeleteSnapshot {
        /// The peer's admin API address.
        node: String,
        /// Its replica.
        volume: String,
        /// The snapshot.
        snap: String,
        /// What it said.
        message: String,
    },
    /// The peer did not grow its replica `volume`.
    #[error("talon at {node}: expanding {volume}{message}")]
    Expand {
        /// The peer's admin API address.
        node: String,
        /// Its replica.
        volume: String,
        /// ` to <n> bytes: <its answer>`, or `: no answer in <time>`.
        message: String,
    },
    /// A Longhorn replica's node (its SPDKService at `node`) could not be reached.
    #[error("{message}")]
    Unreachable {
        /// Its SPDKService address.
        node: String,
        /// Why (the error's chain).
        message: String,
    },
    /// A Longhorn replica's node answered with an error.
    #[error("its node: {message}")]
    Refused {
        /// Its SPDKService address.
        node: String,
        /// What it said.
        message: String,
    },
}

/// The node that serves a remote replica, as the thin rebuild of that
/// replica needs it (talon's peer API there). The copies run on this node's
/// target, from a local snapshot into the remote replica's NVMe/TCP bdev.
#[async_trait::async_trait]
pub trait RemoteDest: Send + Sync + std::fmt::Debug {
    /// Makes the served replica ready for the next copy: its head empty
    /// right above the snapshots of `chain` (the source's, oldest first) it
    /// holds, in that order from the first on ([`RebuildDestStatus`]).
    async fn prepare(&self, chain: &[String]) -> Result<RebuildDestStatus, PrepareError>;
    /// Snapshots the served replica's head (a copy of the source's `snap`) as `snap`.
    async fn snapshot(&self, snap: &str) -> Result<(), PeerError>;
    /// Deletes the served replica's snapshot `snap`.
    async fn delete_snapshot(&self, snap: &str) -> Result<(), PeerError>;
    /// The UUID of the lvol its node serves as replica `k` now (`None`: it
    /// reports none yet), to tell a replica made again there from the one
    /// that was up to date.
    async fn lvol(&self, k: usize) -> Result<Option<String>, PeerError>;
}

impl VolumeOps {
    /// The served replica `k` of `plan` (this node serves it to an engine
    /// elsewhere) made ready for the next copy of its thin rebuild: its
    /// snapshots that are `chain`'s first ones in order are kept, and its
    /// head is made again empty right above them unless it is so already.
    /// Nothing is made again while it holds other snapshots: they are
    /// answered (`stale`), for the engine to delete first.
    pub async fn prepare_dest(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        k: usize,
        chain: &[String],
    ) -> Result<RebuildDestStatus, VolumeError> {
        let vol = plan.name.as_str();
        let name = naming::replica(vol, k);
        let mut out = RebuildDestStatus::default();
        let Some(head) = inv.find_lvol(&name).cloned() else {
            // no head: the controller makes it empty (a served replica starts so)
            return Ok(out);
        };
        let own_snap = |alias: &str| match parse_lvol(&inv.lvols.get(alias)?.name)? {
            LvolRole::Snapshot { volume, k: sk, snap } if volume == vol && sk == k => Some(snap),
            _ => None,
        };
        let below: Vec<String> = inv
            .chain(&head.alias)
            .iter()
            .filter_map(|a| own_snap(a))
            .collect();
        let j = below.iter().zip(chain).take_while(|(a, b)| a == b).count();
        out.shared = u32::try_from(j).unwrap_or(u32::MAX);
        let mut stale: Vec<(usize, String)> = inv
            .lvols
            .values()
            .filter(|l| l.lvs.name == head.lvs.name)
            .filter_map(|l| own_snap(&l.alias).map(|s| (inv.chain(&l.alias).len(), s)))
            .filter(|(_, s)| !below[..j].contains(s))
            .collect();
        // the newest first: a child before its parent
        stale.sort_by(|a, b| b.cmp(a));
        out.stale = stale.into_iter().map(|(_, s)| s).collect();
        if !out.stale.is_empty() {
            return Ok(out);
        }
        // every snapshot of the chain held: what the head holds of its own
        // stays. It was written after the last of them, and the source got
        // each such write too (a raid1 member that misses a write leaves the
        // raid): the copies of the source's clusters since then, which come
        // next, overwrite every cluster of it. The same goes for what SPDK's
        // own rebuild wrote into it before talon stopped that rebuild.
        if j == chain.len() || head.num_allocated_clusters == 0 {
            return Ok(out);
        }
        // a snapshot of the chain to copy, over a head that holds data: the
        // head must be empty over the last snapshot kept. A clone of that
        // snapshot would carry the engine's raid superblock (written before
        // it was taken), and the engine's SPDK would add the head back to
        // its raid by a full rebuild as soon as it sees it again (examine
        // matches the namespace's UUID), writing into it. So the replica's
        // snapshots are given up (answered stale: the engine deletes them)
        // and it is copied from the first on, into an empty head.
        if j > 0 {
            out.stale = below[..j].iter().rev().cloned().collect();
            return Ok(out);
        }
        // the namespace goes first: its engine never reads the head half made
        let nqn = Nqn::for_replica(&plan.name, &format!("r{k}")).map_err(|source| VolumeError::BadName {
            volume: vol.to_owned(),
            source,
        })?;
        if inv
            .subsystem(nqn.as_str())
            .is_some_and(|s| s.namespaces.iter().any(|n| n.nsid == NSID))
        {
            ignore_missing(self.client.nvmf_subsystem_remove_ns(&RemoveNamespace {
                nqn: nqn.as_str().to_owned(),
                nsid: NSID,
            }))
            .await
            .map_err(rpc(
                vol,
                format!("removing the namespace of {nqn} to rebuild {name}"),
            ))?;
        }
        ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&head.alias)))
            .await
            .map_err(rpc(vol, format!("deleting {} to rebuild it", head.alias)))?;
        let size = inv
            .bdevs
            .get(&head.uuid)
            .map_or(plan.size_bytes, |b| b.size_bytes());
        self.client
            .bdev_lvol_create(&LvolCreate::thin(&head.lvs.name, &name, size.div_ceil(MIB)))
            .await
            .map_err(rpc(
                vol,
                format!("making {} again, empty, to rebuild it", head.alias),
            ))?;
        tracing::info!(volume = vol, replica = %name, shared = j, "served replica made ready for its rebuild");
        out.reset = true;
        Ok(out)
    }
}
