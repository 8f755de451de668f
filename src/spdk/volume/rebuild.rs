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
//! Every step is derived from what SPDK holds, so a restart of talon or of
//! spdk_tgt goes on from the copies made so far; only the running copy's id
//! is kept in memory (SPDK forgets it with a restart too, and the head it
//! was copying into is then made again). Until the switch the dest is not in
//! the raid and not in the ledger: it is never served while it is behind. A
//! failure inside the switch leaves the raid missing, and the next reconcile
//! makes it again from the replicas the ledger trusts (the dest is not one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::thin::{self, CopyState, Next};
use super::{
    EngineNames, EnginePlan, Inventory, Made, ReplicaInfo, VolumeError, VolumeOps, VolumePlan,
    ignore_missing, naming, rpc,
};
use crate::names::Nqn;
use crate::resources::engine::RebuildDestStatus;
use crate::spdk::naming::{LvolRole, NSID, REMOTE_PREFIX, parse_lvol};
use crate::spdk::rpc::{ByName, LvolClone, LvolCreate, LvolSnapshot, RaidBdev, RaidDelete, RemoveNamespace};

const MIB: u64 = 1 << 20;
/// A source head with at most this many clusters of its own is copied
/// inside the switch (with 4 MiB clusters: 256 MiB, a second or two here).
const SWITCH_CLUSTERS: u64 = 64;
/// Thin rebuilds of a volume that failed in a row before the volume falls
/// back to SPDK's full rebuild.
const MAX_FAILURES: u32 = 3;
/// How long a remote dest's node that did not answer is left alone.
const NO_ANSWER_PAUSE: Duration = Duration::from_secs(3);

/// A shallow copy running for a rebuild.
#[derive(Debug, Clone)]
struct Running {
    /// The replica being rebuilt.
    k: usize,
    /// The source snapshot's snapshot name (`S` of `<vol>-r<s>.s.<S>`).
    snap: String,
    /// The dest head it copies into.
    dst: String,
    op: u32,
}

/// The thin rebuilds of one target: the running copies, and the failures in
/// a row per volume.
#[derive(Debug, Default, Clone)]
pub(super) struct Rebuilds(Arc<Mutex<RebuildState>>);

#[derive(Debug, Default)]
struct RebuildState {
    running: HashMap<String, Running>,
    failures: HashMap<String, u32>,
    /// Per volume: the source's rebuild snapshots copied into a remote
    /// dest's head since it was last made ready (they are not snapshotted
    /// there: the head keeps their clusters until the switch).
    remote_rb: HashMap<String, Vec<String>>,
    /// Per volume: when a remote dest's node that did not answer is asked again.
    asked: HashMap<String, tokio::time::Instant>,
}

impl Rebuilds {
    fn lock(&self) -> std::sync::MutexGuard<'_, RebuildState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Whether volume `vol` rebuilds thin (it has not failed too often).
    pub(super) fn thin_allowed(&self, vol: &str) -> bool {
        self.lock().failures.get(vol).copied().unwrap_or(0) < MAX_FAILURES
    }
    fn failed(&self, vol: &str) -> u32 {
        let mut s = self.lock();
        s.running.remove(vol);
        s.remote_rb.remove(vol);
        let n = s.failures.entry(vol.to_owned()).or_default();
        *n += 1;
        *n
    }
    fn succeeded(&self, vol: &str) {
        let mut s = self.lock();
        s.running.remove(vol);
        s.remote_rb.remove(vol);
        s.failures.remove(vol);
    }
    /// Whether a copy runs for volume `vol`.
    pub(super) fn running(&self, vol: &str) -> bool {
        self.lock().running.contains_key(vol)
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

/// The snapshot name of an lvol name (`S` of `<vol>-r<k>.s.<S>`).
fn snap_of(inv: &Inventory, alias: &str) -> Option<String> {
    match parse_lvol(&inv.lvols.get(alias)?.name)? {
        LvolRole::Snapshot { snap, .. } => Some(snap),
        _ => None,
    }
}

fn allocated(inv: &Inventory, alias: &str) -> u64 {
    inv.lvols.get(alias).map_or(0, |l| l.num_allocated_clusters)
}

/// How far a rebuild from the head `head` over `chain` (oldest first) is,
/// in percent of the clusters to copy (99 at most: done is `Joined`), with
/// the first `j` snapshots copied and `copied_now` clusters of the next.
fn percent(inv: &Inventory, chain: &[String], head: &str, j: usize, copied_now: u64) -> u32 {
    let own: Vec<u64> = chain
        .iter()
        .map(String::as_str)
        .chain([head])
        .map(|a| allocated(inv, a))
        .collect();
    let (done, total) = thin::copied(&own, j.min(chain.len()), copied_now);
    u32::try_from((done * 100).checked_div(total).unwrap_or(0).min(99)).unwrap_or(99)
}

/// `lvs/name` of an lvol named `name` in the lvstore of `alias`.
fn sibling(alias: &str, name: &str) -> String {
    let lvs = alias.split_once('/').map_or("", |(l, _)| l);
    format!("{lvs}/{name}")
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
        let lvs = r.alias.split_once('/')?.0;
        inv.lvstores
            .iter()
            .find(|l| l.name == lvs)
            .map(|l| super::superblock_room(l.cluster_size))
    };
    room(src).is_some_and(|a| room(dst) == Some(a))
}

/// The node of remote replica `k` of `plan`, when talon can call it.
pub(super) fn remote_dest(plan: &VolumePlan, k: usize) -> Option<&dyn RemoteDest> {
    let i = k.checked_sub(plan.replicas)?;
    plan.remote_dests.get(i)?.as_deref()
}

impl VolumeOps {
    /// One step of the thin rebuild of local replica `dst` from local
    /// replica `src` (in the raid, up to date). `members`: the raid's
    /// up-to-date members by slot (`dst` joins its own slot at the switch).
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
        let step = match remote_dest(plan, dst.k) {
            Some(d) => self.thin_step_remote(inv, plan, raid, src, dst, d, members).await,
            None => self.thin_step(inv, plan, raid, src, dst, members).await,
        };
        match step {
            Ok(Step::Joined) => {
                self.rebuilds.succeeded(vol);
                Ok(Step::Joined)
            }
            Ok(s) => Ok(s),
            Err(e) => {
                let n = self.rebuilds.failed(vol);
                tracing::warn!(volume = vol, replica = %dst.name, failures = n, error = %crate::util::error_chain(&e),
                    "thin rebuild step failed; tried again at the next reconcile{}",
                    if n >= MAX_FAILURES { " with SPDK's full rebuild" } else { "" });
                Err(e)
            }
        }
    }

    async fn thin_step(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        raid: &RaidBdev,
        src: &ReplicaInfo,
        dst: &ReplicaInfo,
        members: &[Option<String>],
    ) -> Result<Step, VolumeError> {
        let vol = plan.name.as_str();
        let src_chain = inv.chain(&src.alias);
        let progress = |copied_now: u64, j: usize| percent(inv, &src_chain, &src.alias, j, copied_now);

        // a copy that runs: done yet?
        let running = self.rebuilds.lock().running.get(vol).cloned();
        if let Some(c) = running {
            let j = src_chain
                .iter()
                .position(|a| snap_of(inv, a).as_deref() == Some(c.snap.as_str()))
                .unwrap_or(0);
            match thin::copy_state(&self.client, c.op).await {
                Ok(CopyState::Running(n)) if c.k == dst.k => {
                    return Ok(Step::Copying(progress(n, j)));
                }
                Ok(CopyState::Done) if c.k == dst.k => {
                    self.rebuilds.lock().running.remove(vol);
                    self.keep_copy(vol, &c.dst, dst.k, &c.snap).await?;
                    return Ok(Step::Copying(progress(0, j + 1)));
                }
                Ok(CopyState::Failed(message)) => {
                    self.rebuilds.lock().running.remove(vol);
                    return Err(VolumeError::RebuildCopy {
                        volume: vol.to_owned(),
                        replica: dst.name.clone(),
                        snapshot: c.snap,
                        message,
                    });
                }
                // SPDK forgot it (a restart of the target) or it was another
                // replica's: the head it copied into is made again below
                _ => {
                    self.rebuilds.lock().running.remove(vol);
                }
            }
        }

        let Some(head) = inv.lvols.get(&dst.alias) else {
            // made by this reconcile: the next one sees it
            return Ok(Step::Copying(0));
        };
        // the copies the dest already has: its snapshots of the source's
        // chain, from the oldest on, each over the one before (taken while
        // it was in service, or copied by an earlier rebuild: that instant)
        let mut shared: Vec<String> = Vec::new();
        for s in &src_chain {
            let Some(snap) = snap_of(inv, s) else { break };
            let d = sibling(&dst.alias, &naming::snapshot_lvol(vol, dst.k, &snap));
            if !inv.lvols.contains_key(&d) || inv.parent_of(&d) != shared.last().cloned() {
                break;
            }
            shared.push(d);
        }
        let j = shared.len();
        // the dest head must be empty and right above them: a head with data
        // of its own (what it held when it fell behind, or a copy that did
        // not finish) or over other snapshots is made again
        let head_ready = head.num_allocated_clusters == 0 && inv.chain(&dst.alias) == shared;
        // a copy of the next snapshot off the chain (an earlier attempt) is in the way
        let in_the_way = src_chain
            .get(j)
            .and_then(|s| snap_of(inv, s))
            .map(|snap| sibling(&dst.alias, &naming::snapshot_lvol(vol, dst.k, &snap)))
            .filter(|copy| inv.lvols.contains_key(copy));
        let rounds = src_chain
            .iter()
            .filter(|a| snap_of(inv, a).is_some_and(|s| naming::is_rebuild_snap(&s)))
            .count();
        let at = thin::Progress {
            chain: src_chain.len(),
            shared: j,
            ready: head_ready && in_the_way.is_none(),
            busy_head: allocated(inv, &src.alias) > SWITCH_CLUSTERS,
            rounds,
        };
        match at.next() {
            Next::MakeHead if !head_ready => {
                ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&dst.alias)))
                    .await
                    .map_err(rpc(vol, format!("deleting {} to rebuild it", dst.alias)))?;
                let name = naming::replica(vol, dst.k);
                match shared.last() {
                    Some(parent) => self
                        .client
                        .bdev_lvol_clone(&LvolClone {
                            snapshot_name: parent.clone(),
                            clone_name: name.clone(),
                        })
                        .await
                        .map(|_| ()),
                    None => {
                        let lvs = dst.alias.split_once('/').map_or("", |(l, _)| l);
                        self.client
                            .bdev_lvol_create(&LvolCreate::thin(lvs, &name, src.size_bytes.div_ceil(MIB)))
                            .await
                            .map(|_| ())
                    }
                }
                .map_err(rpc(
                    vol,
                    format!("making {} again, empty, to rebuild it", dst.alias),
                ))?;
                tracing::info!(volume = vol, replica = %dst.name, shared = j, "rebuilding replica thin from r{}", src.k);
                Ok(Step::Copying(progress(0, j)))
            }
            Next::MakeHead => {
                if let Some(copy) = in_the_way {
                    ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&copy)))
                        .await
                        .map_err(rpc(
                            vol,
                            format!("deleting {copy}, an earlier copy off the chain"),
                        ))?;
                }
                Ok(Step::Copying(progress(0, j)))
            }
            Next::Copy(j) => {
                let s = &src_chain[j];
                let Some(snap) = snap_of(inv, s) else {
                    return Err(VolumeError::RebuildCopy {
                        volume: vol.to_owned(),
                        replica: dst.name.clone(),
                        snapshot: s.clone(),
                        message: "the source's chain holds a snapshot that is not talon's".into(),
                    });
                };
                let op = self.copy_into(vol, s, &snap, dst).await?;
                // a small copy is often done at once: kept now, not a poll later
                if self.settled(vol, op).await {
                    self.keep_copy(vol, &dst.alias, dst.k, &snap).await?;
                    return Ok(Step::Copying(progress(0, j + 1)));
                }
                Ok(Step::Copying(progress(0, j)))
            }
            Next::Round => {
                self.take_rebuild_snapshot(inv, vol, src).await?;
                Ok(Step::Copying(progress(0, j)))
            }
            Next::Switch => {
                self.switch(inv, plan, raid, src, dst, members).await?;
                Ok(Step::Joined)
            }
        }
    }

    /// One step of the thin rebuild of remote replica `dst` (its node `dest`
    /// answers for its head and snapshots) from local replica `src`: the
    /// same steps as a local dest's, the copies written from here into the
    /// remote head through its NVMe/TCP bdev. The source's rebuild
    /// snapshots are not snapshotted there: the head keeps their clusters
    /// until the switch (what the engine then serves from it).
    #[allow(clippy::too_many_arguments)]
    async fn thin_step_remote(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        raid: &RaidBdev,
        src: &ReplicaInfo,
        dst: &ReplicaInfo,
        dest: &dyn RemoteDest,
        members: &[Option<String>],
    ) -> Result<Step, VolumeError> {
        let vol = plan.name.as_str();
        let src_chain = inv.chain(&src.alias);
        let snaps: Vec<String> = src_chain.iter().filter_map(|a| snap_of(inv, a)).collect();
        if snaps.len() != src_chain.len() {
            return Err(VolumeError::RebuildCopy {
                volume: vol.to_owned(),
                replica: dst.name.clone(),
                snapshot: String::new(),
                message: "the source's chain holds a snapshot that is not talon's".into(),
            });
        }
        let named: Vec<String> = snaps
            .iter()
            .filter(|s| !naming::is_rebuild_snap(s))
            .cloned()
            .collect();
        let progress = |j: usize, copied_now: u64| percent(inv, &src_chain, &src.alias, j, copied_now);
        let failed = |snapshot: &str, message: String| VolumeError::RebuildCopy {
            volume: vol.to_owned(),
            replica: dst.name.clone(),
            snapshot: snapshot.to_owned(),
            message,
        };
        let pos = |snap: &str| snaps.iter().position(|s| s == snap).unwrap_or(0);

        // a copy that runs: done yet?
        let running = self.rebuilds.lock().running.get(vol).cloned();
        if let Some(c) = running {
            match thin::copy_state(&self.client, c.op).await {
                Ok(CopyState::Running(n)) if c.k == dst.k => {
                    return Ok(Step::Copying(progress(pos(&c.snap), n)));
                }
                Ok(CopyState::Done) if c.k == dst.k => {
                    self.rebuilds.lock().running.remove(vol);
                    self.keep_remote_copy(vol, dest, &c.snap)
                        .await
                        .map_err(|m| failed(&c.snap, m))?;
                    return Ok(Step::Copying(progress(pos(&c.snap) + 1, 0)));
                }
                Ok(CopyState::Failed(message)) => {
                    self.rebuilds.lock().running.remove(vol);
                    self.reattach(vol, dst).await;
                    return Err(failed(&c.snap, message));
                }
                // SPDK forgot it (a restart of the target) or it was another
                // replica's: the dest's head is made ready again below
                _ => {
                    let mut st = self.rebuilds.lock();
                    st.running.remove(vol);
                    st.remote_rb.remove(vol);
                }
            }
        }

        // how far along the source's chain the dest's head is: right after
        // the last rebuild snapshot copied into it, or (none is) after the
        // named snapshots its node holds. Each copy goes in the chain's
        // order: a snapshot taken on the source after a rebuild snapshot
        // (a user's, during the rebuild) is copied over that one's
        // clusters, never under them.
        let last_rb = self
            .rebuilds
            .lock()
            .remote_rb
            .get(vol)
            .and_then(|c| c.last().cloned());
        let after_rb = last_rb.and_then(|rb| snaps.iter().position(|s| *s == rb));
        let next = match after_rb {
            Some(i) => i + 1,
            None => {
                self.rebuilds.lock().remote_rb.remove(vol);
                // the dest's head empty right above the snapshots it shares
                // (a node that does not answer is asked again after a pause,
                // without holding up this reconcile or counting a failure)
                let now = tokio::time::Instant::now();
                if self.rebuilds.lock().asked.get(vol).is_some_and(|t| *t > now) {
                    return Ok(Step::Copying(0));
                }
                let st = match dest.prepare(&named).await {
                    Ok(st) => st,
                    Err(PrepareError::NoAnswer(m)) => {
                        tracing::info!(volume = vol, replica = %dst.name, why = %m,
                            "remote replica's node does not answer; its rebuild waits");
                        self.rebuilds
                            .lock()
                            .asked
                            .insert(vol.to_owned(), now + NO_ANSWER_PAUSE);
                        return Ok(Step::Copying(0));
                    }
                    Err(PrepareError::Refused(m)) => return Err(failed("", m)),
                };
                if !st.stale.is_empty() {
                    for s in &st.stale {
                        dest.delete_snapshot(s).await.map_err(|m| failed(s, m))?;
                    }
                    tracing::info!(volume = vol, replica = %dst.name, stale = ?st.stale,
                        "snapshots the source does not hold at their place deleted on the remote replica");
                    return Ok(Step::Copying(0));
                }
                let held = (st.shared as usize).min(named.len());
                let next = held.checked_sub(1).map_or(0, |n| pos(&named[n]) + 1);
                if st.reset {
                    // its namespace went and came back: attached afresh (next reconcile)
                    tracing::info!(volume = vol, replica = %dst.name, shared = st.shared,
                        "rebuilding remote replica thin from r{}", src.k);
                    self.reattach(vol, dst).await;
                    return Ok(Step::Copying(progress(next, 0)));
                }
                next
            }
        };
        if let Some(snap) = snaps.get(next) {
            let op = self.copy_into(vol, &src_chain[next], snap, dst).await?;
            if self.settled(vol, op).await {
                self.keep_remote_copy(vol, dest, snap)
                    .await
                    .map_err(|m| failed(snap, m))?;
                return Ok(Step::Copying(progress(next + 1, 0)));
            }
            return Ok(Step::Copying(progress(next, 0)));
        }
        // the whole chain is in the dest's head
        let at = thin::Progress {
            chain: snaps.len(),
            shared: snaps.len(),
            ready: true,
            busy_head: allocated(inv, &src.alias) > SWITCH_CLUSTERS,
            rounds: snaps.iter().filter(|s| naming::is_rebuild_snap(s)).count(),
        };
        if at.next() == Next::Round {
            self.take_rebuild_snapshot(inv, vol, src).await?;
            return Ok(Step::Copying(progress(snaps.len(), 0)));
        }
        self.switch(inv, plan, raid, src, dst, members).await?;
        Ok(Step::Joined)
    }

    /// Keeps what a finished copy of source snapshot `snap` put in remote
    /// dest `dest`'s head: a named snapshot is snapshotted there (the
    /// rebuild snapshots copied into the head before it go into that
    /// snapshot with it); a rebuild snapshot's clusters stay in the head.
    async fn keep_remote_copy(&self, vol: &str, dest: &dyn RemoteDest, snap: &str) -> Result<(), String> {
        if naming::is_rebuild_snap(snap) {
            self.rebuilds
                .lock()
                .remote_rb
                .entry(vol.to_owned())
                .or_default()
                .push(snap.to_owned());
            return Ok(());
        }
        dest.snapshot(snap).await?;
        self.rebuilds.lock().remote_rb.remove(vol);
        Ok(())
    }

    /// Waits up to [`thin::COPY_SETTLE`] for copy `op` of volume `vol` to
    /// finish; true (and the copy no longer running) when it did.
    async fn settled(&self, vol: &str, op: u32) -> bool {
        let done = matches!(
            thin::wait_copy(&self.client, op, thin::COPY_SETTLE).await,
            Ok(CopyState::Done)
        );
        if done {
            self.rebuilds.lock().running.remove(vol);
        }
        done
    }

    /// Detaches the controller of remote replica `dst` (best effort): the
    /// next reconcile attaches it afresh.
    async fn reattach(&self, vol: &str, dst: &ReplicaInfo) {
        let ctrl = format!("{REMOTE_PREFIX}{}", dst.name);
        if let Err(e) = super::lvol::detach_controller(&self.client, &ctrl).await {
            tracing::warn!(volume = vol, replica = %dst.name, error = %e, "remote replica not detached");
        }
    }

    /// Starts the shallow copy of source snapshot `s` (snapshot name `snap`)
    /// into the dest head, grown to `s`'s size first. Not capped by
    /// `rebuildMibPerSec`: on v26.05 a QoS limit set on a bdev nobody has
    /// open (the head, until a copy opens it) can never be changed or lifted
    /// again (`bdev_set_qos_limit` answers EAGAIN from then on, seen on a
    /// real target), and the head becomes a raid member.
    async fn copy_into(&self, vol: &str, s: &str, snap: &str, dst: &ReplicaInfo) -> Result<u32, VolumeError> {
        let target = dst_target(dst);
        if target != dst.alias {
            // a remote head: its node sizes it (to the volume's size)
            return self.start_copy(vol, s, snap, dst, &target).await;
        }
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
        self.start_copy(vol, s, snap, dst, &dst.alias).await
    }

    /// Starts the shallow copy of source snapshot `s` into bdev `target`
    /// (the dest head, or a remote one's NVMe/TCP bdev).
    async fn start_copy(
        &self,
        vol: &str,
        s: &str,
        snap: &str,
        dst: &ReplicaInfo,
        target: &str,
    ) -> Result<u32, VolumeError> {
        let op = thin::start_copy(&self.client, s, target)
            .await
            .map_err(rpc(vol, format!("copying {s}'s clusters to {target}")))?;
        self.rebuilds.lock().running.insert(
            vol.to_owned(),
            Running {
                k: dst.k,
                snap: snap.to_owned(),
                dst: target.to_owned(),
                op,
            },
        );
        Ok(op)
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

    /// The switch: with the export closed, the raid is made again over the
    /// up-to-date members and the dest, after the dest got the source head's
    /// last clusters.
    async fn switch(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        raid: &RaidBdev,
        src: &ReplicaInfo,
        dst: &ReplicaInfo,
        members: &[Option<String>],
    ) -> Result<(), VolumeError> {
        let vol = plan.name.as_str();
        let nqn = Nqn::for_volume(&plan.name);
        // the listing this step works from is a moment old: a dest whose
        // disk went since is not switched to (the raid would go for nothing)
        let target = dst_target(dst);
        if self
            .client
            .bdev(&target)
            .await
            .map_err(rpc(vol, format!("looking up {target}")))?
            .is_none()
        {
            return Err(VolumeError::RebuildCopy {
                volume: vol.to_owned(),
                replica: dst.name.clone(),
                snapshot: String::new(),
                message: format!("{target} went before the switch: the raid stays as it is"),
            });
        }
        tracing::info!(volume = vol, replica = %dst.name, "rebuild: switching the raid to the rebuilt replica");
        // hosts off: their connections drop, their I/O waits for the reconnect
        self.close_export(inv, vol, nqn.as_str()).await?;
        // the raid goes; its superblock is cleared on its members so that
        // they (and the dest, which gets the cleared cluster by the copy
        // below) make a new raid without SPDK finding the old one
        self.client
            .bdev_raid_delete(&RaidDelete {
                name: raid.name.clone(),
                clear_sb: Some(raid.superblock),
            })
            .await
            .map_err(rpc(vol, format!("deleting raid {} for the switch", raid.name)))?;
        match self.switch_to(inv, plan, raid, src, dst, members).await {
            Ok(()) => Ok(()),
            Err(e) => {
                // the volume is served again over the members it had, not
                // left without a raid until the next reconcile
                self.restore_after_switch(plan, raid, src, members).await;
                Err(e)
            }
        }
    }

    /// The rest of [`Self::switch`] once the raid is gone: the source head's
    /// last clusters copied, the raid made again with the dest, exported.
    async fn switch_to(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        raid: &RaidBdev,
        src: &ReplicaInfo,
        dst: &ReplicaInfo,
        members: &[Option<String>],
    ) -> Result<(), VolumeError> {
        let vol = plan.name.as_str();
        // the source head's last clusters
        let (snap, s) = self.take_rebuild_snapshot(inv, vol, src).await?;
        let op = self.copy_into(vol, &s, &snap, dst).await?;
        let st = thin::wait_copy(&self.client, op, thin::SWITCH_COPY)
            .await
            .map_err(rpc(vol, format!("checking the copy of {s}")))?;
        match st {
            CopyState::Done => {}
            CopyState::Failed(message) => {
                self.rebuilds.lock().running.remove(vol);
                return Err(VolumeError::RebuildCopy {
                    volume: vol.to_owned(),
                    replica: dst.name.clone(),
                    snapshot: snap,
                    message,
                });
            }
            CopyState::Running(_) => {
                return Err(VolumeError::RebuildCopy {
                    volume: vol.to_owned(),
                    replica: dst.name.clone(),
                    snapshot: snap,
                    message: format!("the last copy did not finish in {}s", thin::SWITCH_COPY.as_secs()),
                });
            }
        }
        self.rebuilds.lock().running.remove(vol);
        let target = dst_target(dst);
        // a local dest keeps the copy as a snapshot, merged away with the
        // source's; a remote one keeps it in its head
        if target == dst.alias {
            self.keep_copy(vol, &dst.alias, dst.k, &snap).await?;
        }
        // the same size as the source: the raid takes its smallest member
        let dst_bdev = self
            .client
            .bdev(&target)
            .await
            .map_err(rpc(vol, format!("looking up {target}")))?;
        let gone = |what: &str| VolumeError::RebuildCopy {
            volume: vol.to_owned(),
            replica: dst.name.clone(),
            snapshot: snap.clone(),
            message: format!("{what} disappeared during the switch"),
        };
        let Some(dst_bdev) = dst_bdev else {
            return Err(gone(&target));
        };
        let src_bdev = self
            .client
            .bdev(&src.alias)
            .await
            .map_err(rpc(vol, format!("looking up {}", src.alias)))?;
        let Some(src_bdev) = src_bdev else {
            return Err(gone(&src.alias));
        };
        // the raid again, over the same members in the same slots and the dest
        let mut members = members.to_vec();
        if let Some(m) = members.get_mut(dst.k) {
            *m = Some(dst_bdev.name.clone());
        }
        let mut made = Vec::new();
        let geometry = (src_bdev.block_size, src_bdev.num_blocks);
        if let Err(e) = self
            .create_raid(inv, vol, &members, geometry, raid.superblock, &mut made)
            .await
        {
            self.undo(made).await;
            return Err(e);
        }
        // exported again: the same namespace ids, the listener, the hosts
        let now = Inventory::load(&self.client)
            .await
            .map_err(rpc(vol, "listing the target after the switch"))?;
        // the copies put each cluster at the source's offset: the raid's data
        // must start at the same place on both, or the dest is not served
        let offset_of = |name: &str| {
            now.raid(&raid.name)?
                .base_bdevs_list
                .iter()
                .find(|b| b.name.as_deref() == Some(name))
                .map(|b| b.data_offset)
        };
        let (so, dso) = (offset_of(&src_bdev.name), offset_of(&dst_bdev.name));
        if so != dso {
            ignore_missing(
                self.client
                    .bdev_raid_remove_base_bdev(&ByName::new(&dst_bdev.name)),
            )
            .await
            .map_err(rpc(
                vol,
                format!("taking {} out of {} again", dst_bdev.name, raid.name),
            ))?;
            return Err(VolumeError::RebuildCopy {
                volume: vol.to_owned(),
                replica: dst.name.clone(),
                snapshot: snap,
                message: format!(
                    "the raid's data starts at block {so:?} on the source and {dso:?} on the rebuilt replica: \
                     taken out again (rebuilt by SPDK's rebuild)"
                ),
            });
        }
        self.export_raid(&now, plan, &raid.name).await?;
        tracing::info!(volume = vol, replica = %dst.name, "rebuild: replica joined the raid, up to date");
        Ok(())
    }

    /// Exports volume `plan`'s raid `raid` again after a switch (to kernel
    /// hosts: never TLS), in its subsystem as it was.
    async fn export_raid(&self, now: &Inventory, plan: &VolumePlan, raid: &str) -> Result<(), VolumeError> {
        let spec = plan.host_export();
        let names = EngineNames::volume(&plan.name);
        let mut made: Vec<Made> = Vec::new();
        self.export_ns(now, plan.name.as_str(), &names.export(raid, &spec), &mut made)
            .await
    }

    /// After a switch that failed past the raid's deletion: the raid made
    /// again over the members it had (the dest's slot empty) where it is
    /// missing, and exported again. Best effort: what cannot be done now
    /// the next reconcile does (the failure is already the step's error).
    async fn restore_after_switch(
        &self,
        plan: &VolumePlan,
        raid: &RaidBdev,
        src: &ReplicaInfo,
        members: &[Option<String>],
    ) {
        let vol = plan.name.as_str();
        let restored = async {
            let inv = Inventory::load(&self.client)
                .await
                .map_err(rpc(vol, "listing the target to restore the raid"))?;
            // a raid listed is exported as it is; a missing one is made
            // again with the source's geometry for the dest's empty slot
            let geometry = match inv.raid(&raid.name) {
                Some(_) => None,
                None => {
                    let src_bdev = self
                        .client
                        .bdev(&src.alias)
                        .await
                        .map_err(rpc(vol, format!("looking up {}", src.alias)))?;
                    let Some(b) = src_bdev else {
                        return Err(VolumeError::RebuildCopy {
                            volume: vol.to_owned(),
                            replica: src.name.clone(),
                            snapshot: String::new(),
                            message: format!("{} went too: the raid is not made again here", src.alias),
                        });
                    };
                    Some((b.block_size, b.num_blocks))
                }
            };
            let spec = plan.host_export();
            let names = EngineNames::volume(&plan.name);
            self.serve_engine(
                &inv,
                &EnginePlan {
                    volume: vol,
                    names: &names,
                    slots: members.to_vec(),
                    bare: false,
                    geometry,
                    superblock: Some(raid.superblock),
                    spec: &spec,
                },
            )
            .await
            .map(|_| ())
        };
        match restored.await {
            Ok(()) => tracing::info!(
                volume = vol,
                "rebuild: the switch failed; the raid serves again over the members it had"
            ),
            Err(e) => tracing::warn!(volume = vol, error = %crate::util::error_chain(&e),
                "rebuild: the switch failed and the raid could not be made again now; the next reconcile does"),
        }
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
    async fn snapshot(&self, snap: &str) -> Result<(), String>;
    /// Deletes the served replica's snapshot `snap`.
    async fn delete_snapshot(&self, snap: &str) -> Result<(), String>;
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
