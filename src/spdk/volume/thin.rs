//! What every thin rebuild shares, talon's (`rebuild.rs`) and a Longhorn
//! engine's (`replica_rebuild.rs`): the step machine that
//! carries it out, one shallow copy started and asked where it stands, the
//! order of the steps, how far a rebuild is, and the next rebuild
//! snapshot's number.
//!
//! ```text
//!  source:  S1 <- S2 <- ... <- head (written)
//!  dest:    S1' <- ... <- Sj' <- head' (not served)
//!   make the head   head' is not empty right above the j copies it shares
//!   copy j          S(j+1)'s own clusters into head', kept as S(j+1)'
//!   round           the source head holds much of its own: snapshotted as
//!                   a rebuild snapshot first (at most MAX_ROUNDS times), copied
//!                   the same way while I/O goes on
//!   switch          the export closed, the head's last clusters copied,
//!                   the raid made again with the dest
//! ```
//!
//! One step machine ([`step`]) carries every thin rebuild out: talon's
//! own, whose source is a replica in this target and whose dest is one too
//! or is served by another node (`rebuild.rs`), and a Longhorn engine's,
//! either of whose ends may be on another node, copied by that node's
//! target (`replica_rebuild.rs`; that node is asked through
//! `ReplicaPeers`, Longhorn's SPDKService). What differs is behind
//! [`Ends`]: how each end is named, asked and written. The last step, the
//! switch ([`switch`]), is one sequence for both too, with one rule for how
//! much it copies while the hosts wait ([`switch_bytes`]); its close, join
//! and restore, with every check (the dest there, the superblock cleared,
//! the data offsets equal), are one implementation as well
//! ([`VolumeOps::switch_close`](super::VolumeOps::switch_close), `switch.rs`). The order of the
//! steps, the running copy, and when a copy is kept are decided here, from
//! what the two replicas hold, so a restart goes on from the copies made
//! so far: only the running copy is kept in memory ([`Runs`]), and spdk_tgt
//! forgets it with a restart too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::spdk::rpc::{CheckShallowCopy, ShallowCopyStatus, StartShallowCopy};
use crate::spdk::{ClientError, SpdkClient};

/// Rebuild snapshots of the source head taken while I/O goes on, before the
/// switch copies what is left with the export closed.
pub const MAX_ROUNDS: usize = 3;
/// How long a step waits for the copy it started (a small one is done in
/// this step instead of at the next reconcile).
pub const COPY_SETTLE: Duration = Duration::from_millis(300);
/// The most a source head may hold of its own for the switch to copy it
/// while the hosts wait: a head holding more is snapshotted and copied
/// first, I/O going on ([`Ends::busy_head`]). For both engines alike; it
/// depends on the path the copy takes. Into a dest of the same target a
/// copy runs at memory speed: on a real v26.05 here a switch with 104 MiB
/// to copy took 230-250 ms, one after a round 160 ms
/// (`benches/spdk_volume.rs rebuild`). Over NVMe/TCP it runs at the
/// network's: 32 MiB took about 1 s on two real spdk_tgt over loopback.
pub fn switch_bytes(over_nvme_tcp: bool) -> u64 {
    if over_nvme_tcp { 16 << 20 } else { 64 << 20 }
}
/// How long the switch waits for its last copy.
pub const SWITCH_COPY: Duration = Duration::from_secs(120);
/// How often a waited-for copy is asked where it stands.
const POLL: Duration = Duration::from_millis(15);

/// Failed steps in a row before a thin rebuild is given up...
pub const MAX_FAILURES: u32 = 3;
/// ...and for at least this long: a peer whose talon or spdk_tgt is still
/// starting (seconds on a loaded node) is waited for, not given up at once;
/// one gone for this long is, the bound Longhorn gives a remote replica's
/// link (ctrlr_loss_timeout 15 s).
pub const FAIL_AFTER: Duration = Duration::from_secs(15);
/// The pause after a failed step: doubles from 1 s, at most this.
pub const MAX_RETRY_PAUSE: Duration = Duration::from_secs(8);

/// A rebuild whose last steps failed.
#[derive(Debug, Clone, Copy)]
struct Failing {
    /// Failed steps in a row.
    count: u32,
    /// When the first of them failed.
    since: Instant,
    /// No step before this.
    retry_at: Instant,
    /// Given up ([`Failed::ForGood`]).
    given_up: bool,
}

/// What a failed step means for its rebuild ([`Failures::failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// Tried again after a pause: failed steps in a row so far.
    Retry(u32),
    /// Given up ([`MAX_FAILURES`] in a row over [`FAIL_AFTER`]): the dest
    /// is not rebuilt thin. A talon volume rebuilds it with SPDK's raid
    /// rebuild; a Longhorn engine reports the rebuild failed, and
    /// longhorn-manager, which asked for it, decides what comes next.
    ForGood(u32),
}

/// The one failure policy of every thin rebuild, talon's and a Longhorn
/// engine's: failed steps in a row per rebuild (by volume or engine, dest
/// replica), the pause before the next step (doubling from 1 s, at most
/// [`MAX_RETRY_PAUSE`]), and the bound ([`Failed::ForGood`]). A step that
/// does not fail ends the count ([`Failures::forget`]).
#[derive(Debug, Default, Clone)]
pub struct Failures(Arc<Mutex<HashMap<(String, String), Failing>>>);

impl Failures {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Failing>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Counts a failed step of the rebuild of `dest` of `of` at `now`:
    /// retried after a pause, or given up.
    pub fn failed(&self, of: &str, dest: &str, now: Instant) -> Failed {
        let mut all = self.lock();
        let f = all.entry((of.to_owned(), dest.to_owned())).or_insert(Failing {
            count: 0,
            since: now,
            retry_at: now,
            given_up: false,
        });
        f.count += 1;
        let pause = Duration::from_secs(1u64 << (f.count - 1).min(8)).min(MAX_RETRY_PAUSE);
        f.retry_at = now + pause;
        f.given_up = f.count >= MAX_FAILURES && now.duration_since(f.since) >= FAIL_AFTER;
        if f.given_up {
            Failed::ForGood(f.count)
        } else {
            Failed::Retry(f.count)
        }
    }
    /// Whether the rebuild's next step waits (its last one failed a moment ago).
    pub fn pausing(&self, of: &str, dest: &str, now: Instant) -> bool {
        self.lock()
            .get(&(of.to_owned(), dest.to_owned()))
            .is_some_and(|f| now < f.retry_at)
    }
    /// Whether a rebuild of `of` was given up (and not forgotten since).
    pub fn given_up(&self, of: &str) -> bool {
        self.lock().iter().any(|((o, _), f)| o == of && f.given_up)
    }
    /// Forgets the failures of the rebuild of `dest` of `of` (it joined,
    /// or is no longer asked for).
    pub fn forget(&self, of: &str, dest: &str) {
        self.lock().remove(&(of.to_owned(), dest.to_owned()));
    }
    /// Forgets the failures of every rebuild of `of`.
    pub fn forget_all(&self, of: &str) {
        self.lock().retain(|(o, _), _| o != of);
    }
}

/// Where one shallow copy stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyState {
    /// Copying: clusters copied so far.
    Running(u64),
    /// Every cluster copied.
    Done,
    /// Failed, with SPDK's words (or the state SPDK named, if not one of
    /// the three v26.05 answers).
    Failed(String),
}

impl From<ShallowCopyStatus> for CopyState {
    fn from(s: ShallowCopyStatus) -> Self {
        Self::from_answer(&s.state, s.copied_clusters, s.error)
    }
}

impl CopyState {
    /// The state a `bdev_lvol_check_shallow_copy` answer (or a peer's copy
    /// of it) names: "in progress", "complete" or "error".
    pub fn from_answer(state: &str, copied_clusters: u64, error: Option<String>) -> Self {
        match state {
            "in progress" => Self::Running(copied_clusters),
            "complete" => Self::Done,
            "error" => Self::Failed(error.unwrap_or_else(|| "unknown error".into())),
            other => Self::Failed(format!("the copy is in a state talon does not know: {other:?}")),
        }
    }
}

/// Starts copying the clusters snapshot lvol `src` holds of its own into
/// bdev `dst` (`bdev_lvol_start_shallow_copy`); answers the operation id.
pub(super) async fn start_copy(client: &SpdkClient, src: &str, dst: &str) -> Result<u32, ClientError> {
    client
        .bdev_lvol_start_shallow_copy(&StartShallowCopy {
            src_lvol_name: src.to_owned(),
            dst_bdev_name: dst.to_owned(),
        })
        .await
        .map(|s| s.operation_id)
}

/// Where copy `op` stands. An id spdk_tgt does not know (it restarted) is
/// the error its answer carries.
pub(super) async fn copy_state(client: &SpdkClient, op: u32) -> Result<CopyState, ClientError> {
    client
        .bdev_lvol_check_shallow_copy(&CheckShallowCopy { operation_id: op })
        .await
        .map(CopyState::from)
}

/// Why [`copy_each`] stopped.
#[derive(Debug)]
pub(super) enum EachError {
    /// Starting the copy of `lvol` was refused.
    Start { lvol: String, source: ClientError },
    /// The state of copy `op` of `lvol` could not be read.
    State {
        lvol: String,
        op: u32,
        source: ClientError,
    },
    /// The copy of `lvol` failed, in SPDK's words.
    Failed { lvol: String, message: String },
}

/// Shallow-copies each of `lvols` into bdev `dst` in turn (oldest first: a
/// newer lvol's clusters over the older's), each polled every `poll` until
/// it is done.
pub(super) async fn copy_each(
    client: &SpdkClient,
    lvols: &[String],
    dst: &str,
    poll: std::time::Duration,
) -> Result<(), EachError> {
    for lvol in lvols {
        let op = start_copy(client, lvol, dst)
            .await
            .map_err(|source| EachError::Start {
                lvol: lvol.clone(),
                source,
            })?;
        loop {
            match copy_state(client, op).await {
                Ok(CopyState::Done) => break,
                Ok(CopyState::Running(_)) => tokio::time::sleep(poll).await,
                Ok(CopyState::Failed(message)) => {
                    return Err(EachError::Failed {
                        lvol: lvol.clone(),
                        message,
                    });
                }
                Err(source) => {
                    return Err(EachError::State {
                        lvol: lvol.clone(),
                        op,
                        source,
                    });
                }
            }
        }
    }
    Ok(())
}

impl super::VolumeOps {
    /// Starts copying the clusters snapshot lvol `src` holds of its own
    /// into bdev `dst` ([`start_copy`]); answers the operation id.
    pub async fn start_shallow_copy(&self, src: &str, dst: &str) -> Result<u32, ClientError> {
        start_copy(&self.client, src, dst).await
    }
    /// Where shallow copy `op` stands ([`copy_state`]).
    pub async fn shallow_copy_state(&self, op: u32) -> Result<CopyState, ClientError> {
        copy_state(&self.client, op).await
    }
}

/// What the dest of a thin rebuild holds, seen against its source's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The snapshots of the source's chain (oldest first), how many.
    pub chain: usize,
    /// How many of them the dest holds, from the oldest on, each over the
    /// one before.
    pub shared: usize,
    /// Whether the dest's head is empty right above those and no other
    /// copy of the chain's snapshots is in the way.
    pub ready: bool,
    /// Whether the source head holds more of its own than the switch copies
    /// with the export closed ([`switch_bytes`]).
    pub busy_head: bool,
    /// Rebuild snapshots in the source's chain (taken by this rebuild).
    pub rounds: usize,
}

/// The next step of a thin rebuild.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The dest's head is made again, empty, right above the snapshots it
    /// shares (what else it holds of the chain goes).
    MakeHead,
    /// Snapshot `j` of the source's chain (oldest first) is copied into the
    /// dest's head, and kept there as the same snapshot.
    Copy(usize),
    /// The source head is snapshotted as the next rebuild snapshot, to be
    /// copied the same way while I/O goes on.
    Round,
    /// The switch.
    Switch,
}

impl Progress {
    /// What the rebuild does next.
    pub fn next(&self) -> Next {
        if !self.ready {
            Next::MakeHead
        } else if self.shared < self.chain {
            Next::Copy(self.shared)
        } else if self.busy_head && self.rounds < MAX_ROUNDS {
            Next::Round
        } else {
            Next::Switch
        }
    }
}

/// How far a rebuild is: what is copied of the whole, in the unit `own`
/// counts (clusters or bytes), with the first `j` snapshots of the chain
/// copied and `now` of the next. `own`: each chain snapshot's own share,
/// oldest first, then the source head's.
pub fn copied(own: &[u64], j: usize, now: u64) -> (u64, u64) {
    let total = own.iter().sum();
    let done = own[..j.min(own.len())].iter().sum::<u64>() + now;
    (done.min(total), total)
}

/// The number of the next rebuild snapshot: one more than the highest taken
/// (`taken`), or 1.
pub fn next_round(taken: impl IntoIterator<Item = u64>) -> u64 {
    taken.into_iter().max().map_or(1, |n| n + 1)
}

/// Where a shallow copy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copier {
    /// In this node's target: the operation id.
    Here(u32),
    /// In another node's target (the source's node): asked there.
    Elsewhere,
}

/// A shallow copy a rebuild runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The source snapshot it copies (its snapshot name).
    pub snap: String,
    pub copier: Copier,
}

/// The copies running, one per rebuild: by (volume or engine, dest replica).
#[derive(Debug, Default, Clone)]
pub struct Runs(Arc<Mutex<HashMap<(String, String), Run>>>);

impl Runs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Run>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn key(of: &str, dest: &str) -> (String, String) {
        (of.to_owned(), dest.to_owned())
    }
    /// The copy running for the rebuild of `dest` of `of`.
    pub fn get(&self, of: &str, dest: &str) -> Option<Run> {
        self.lock().get(&Self::key(of, dest)).cloned()
    }
    fn insert(&self, of: &str, dest: &str, run: Run) {
        self.lock().insert(Self::key(of, dest), run);
    }
    /// Forgets the copy of the rebuild of `dest` of `of`.
    pub fn remove(&self, of: &str, dest: &str) {
        self.lock().remove(&Self::key(of, dest));
    }
    /// Forgets every copy of `of`'s rebuilds.
    pub fn remove_all(&self, of: &str) {
        self.lock().retain(|(o, _), _| o != of);
    }
    /// Whether a copy runs for one of `of`'s rebuilds.
    pub fn any(&self, of: &str) -> bool {
        self.lock().keys().any(|(o, _)| o == of)
    }
}

/// Where the dest stands against the source's chain, before the next copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// It holds the chain's first `shared` snapshots; `ready`: its head is
    /// empty right above them and no other copy of the chain is in the way.
    Holds { shared: usize, ready: bool },
    /// Its side is at it (its head made, stale snapshots deleted, its node
    /// asked): the next step looks again. It holds the first `shared`.
    Busy { shared: usize },
}

/// Where a thin rebuild stands after one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Copying: `copied` of the source's `total`, in the unit of [`Ends::own`].
    Copying { copied: u64, total: u64 },
    /// The dest is a member of the raid again, equal to the source.
    Joined,
}

/// The two ends of one thin rebuild, as one step sees them (listed once,
/// at the step's start), and what each step does to them.
#[async_trait::async_trait]
pub trait Ends: Send + Sync {
    type Error: Send;
    /// The volume or engine whose rebuild this is.
    fn of(&self) -> &str;
    /// The dest replica's name.
    fn dest(&self) -> &str;
    /// The source's chain, oldest first: snapshot names, as the dest keeps
    /// its copies.
    fn chain(&self) -> &[String];
    /// What each snapshot of the chain holds of its own, then the source
    /// head: how far the rebuild is counts in this unit.
    fn own(&self) -> &[u64];
    /// One cluster in the unit of [`Ends::own`] (a running copy counts clusters).
    fn cluster(&self) -> u64;
    /// Whether the source head holds more of its own than the switch copies
    /// with the export closed ([`switch_bytes`]).
    fn busy_head(&self) -> bool;
    /// Rebuild snapshots in the source's chain (taken by this rebuild).
    fn rounds(&self) -> usize;
    /// Where the dest stands.
    async fn at(&self) -> Result<At, Self::Error>;
    /// Makes the dest's head empty right above the first `shared` snapshots
    /// of the chain, with nothing else of the chain in the way.
    async fn make_ready(&self, shared: usize) -> Result<(), Self::Error>;
    /// Whether the dest can be written now (false: the next step asks again).
    async fn writable(&self) -> Result<bool, Self::Error> {
        Ok(true)
    }
    /// Whether the engine's persisted record of its current replicas has
    /// the dest out. The switch deletes the raid with its superblock, which
    /// is the target's own record that the dest fell behind: talon killed
    /// between the switch's close and join must find that in the engine's
    /// record, or the next talon makes the raid again over a dest that
    /// missed writes. false: the switch waits for a step after the record
    /// was written (talon's ledger is written after the pass that saw the
    /// dest go; a Longhorn engine's dest is a replica added, never current
    /// until it joins).
    fn dest_recorded_out(&self) -> bool {
        true
    }
    /// What must still hold for the switch, asked right before it (the
    /// copies are done, no copy runs, nothing is closed yet): an error is
    /// the step's, and nothing was touched.
    async fn switch_allowed(&self) -> Result<(), Self::Error> {
        Ok(())
    }
    /// Starts copying snapshot `j` of the chain into the dest's head.
    async fn start_copy(&self, j: usize) -> Result<Copier, Self::Error>;
    /// Where copy `run` stands, or `None` when it is not known (the target
    /// that ran it restarted).
    async fn check(&self, run: &Run) -> Result<Option<CopyState>, Self::Error>;
    /// The error of a copy that failed.
    async fn copy_failed(&self, run: &Run, message: String) -> Self::Error;
    /// A copy no longer known (its target restarted).
    fn copy_lost(&self) {}
    /// Keeps what a finished copy of snapshot `snap` put in the dest's head
    /// (snapshotted as `snap`).
    async fn keep(&self, snap: &str) -> Result<(), Self::Error>;
    /// Snapshots the source head as the next rebuild snapshot; answers its
    /// name.
    async fn round(&self) -> Result<String, Self::Error>;
    /// The switch's first part ([`switch`]): what must hold for it checked,
    /// then the hosts off (the export closed) and the raid deleted.
    async fn close(&self) -> Result<(), Self::Error>;
    /// Starts the switch's copy of rebuild snapshot `snap` (just taken of
    /// the idle source head, so in no listing of the step), uncapped: the
    /// hosts wait for it.
    async fn start_last_copy(&self, snap: &str) -> Result<Copier, Self::Error>;
    /// The raid made again with the dest, and exported, once the dest holds
    /// `snap`, the switch's copy.
    async fn join(&self, snap: &str) -> Result<(), Self::Error>;
    /// After a switch that failed (in any of its parts, `close` included):
    /// the raid served again over the members it had, at once rather than
    /// at the next reconcile. Best effort: the failure is already the step's
    /// error, and what cannot be done now the next reconcile does.
    async fn restore(&self);
}

/// One step of the thin rebuild `ends`, with its running copy in `runs`.
pub async fn step<E: Ends + ?Sized>(ends: &E, runs: &Runs) -> Result<Step, E::Error> {
    let (of, dest, chain) = (ends.of(), ends.dest(), ends.chain());
    let copying = |j: usize, now: u64| {
        let (copied, total) = copied(ends.own(), j, now.saturating_mul(ends.cluster()));
        Step::Copying { copied, total }
    };
    // a copy that runs: done yet?
    if let Some(run) = runs.get(of, dest) {
        let j = chain.iter().position(|s| *s == run.snap).unwrap_or(0);
        match ends.check(&run).await? {
            Some(CopyState::Running(n)) => return Ok(copying(j, n)),
            Some(CopyState::Done) => {
                runs.remove(of, dest);
                ends.keep(&run.snap).await?;
                return Ok(copying(j + 1, 0));
            }
            Some(CopyState::Failed(m)) => {
                runs.remove(of, dest);
                return Err(ends.copy_failed(&run, m).await);
            }
            // not known any more: where the dest stands says what is next
            None => {
                runs.remove(of, dest);
                ends.copy_lost();
            }
        }
    }
    let (shared, ready) = match ends.at().await? {
        At::Busy { shared } => return Ok(copying(shared, 0)),
        At::Holds { shared, ready } => (shared, ready),
    };
    let next = Progress {
        chain: chain.len(),
        shared,
        ready,
        busy_head: ends.busy_head(),
        rounds: ends.rounds(),
    }
    .next();
    if next == Next::MakeHead {
        ends.make_ready(shared).await?;
        return Ok(copying(shared, 0));
    }
    if !ends.writable().await? {
        return Ok(copying(shared, 0));
    }
    match next {
        Next::Copy(j) => {
            let run = Run {
                snap: chain[j].clone(),
                copier: ends.start_copy(j).await?,
            };
            runs.insert(of, dest, run.clone());
            // a small copy is often done at once: kept now, not a poll later
            match settle(ends, &run).await? {
                Some(CopyState::Done) => {
                    runs.remove(of, dest);
                    ends.keep(&run.snap).await?;
                    Ok(copying(j + 1, 0))
                }
                Some(CopyState::Failed(m)) => {
                    runs.remove(of, dest);
                    Err(ends.copy_failed(&run, m).await)
                }
                _ => Ok(copying(j, 0)),
            }
        }
        Next::Round => {
            ends.round().await?;
            Ok(copying(shared, 0))
        }
        Next::Switch if !ends.dest_recorded_out() => {
            tracing::info!(
                of,
                replica = dest,
                "rebuild: the switch waits until the dest is recorded out of service"
            );
            Ok(copying(shared, 0))
        }
        Next::Switch => {
            ends.switch_allowed().await?;
            switch(ends).await?;
            runs.remove(of, dest);
            Ok(Step::Joined)
        }
        Next::MakeHead => Ok(copying(shared, 0)),
    }
}

/// The switch, the last step of every thin rebuild: with the hosts off and
/// the raid gone, the idle source head snapshotted, that snapshot copied
/// into the dest and kept, and the raid made again with the dest. A switch
/// that fails in any part is undone as far as serving goes: the raid is made
/// again over the members it had ([`Ends::restore`]).
pub async fn switch<E: Ends + ?Sized>(ends: &E) -> Result<(), E::Error> {
    tracing::info!(
        of = ends.of(),
        replica = ends.dest(),
        "rebuild: switching the raid to the rebuilt replica"
    );
    let switched = async {
        ends.close().await?;
        crate::util::failpoint("rebuild-switch-closed");
        let snap = ends.round().await?;
        let run = Run {
            copier: ends.start_last_copy(&snap).await?,
            snap,
        };
        let failed = match wait(ends, &run, SWITCH_COPY).await? {
            Some(CopyState::Done) => None,
            Some(CopyState::Failed(m)) => Some(m),
            Some(CopyState::Running(_)) => Some(format!(
                "the switch's copy did not finish in {} s",
                SWITCH_COPY.as_secs()
            )),
            None => Some("the switch's copy is no longer known to its target".to_owned()),
        };
        if let Some(m) = failed {
            return Err(ends.copy_failed(&run, m).await);
        }
        ends.keep(&run.snap).await?;
        crate::util::failpoint("rebuild-switch-copied");
        ends.join(&run.snap).await?;
        crate::util::failpoint("rebuild-switch-joined");
        Ok(())
    };
    match switched.await {
        Ok(()) => {
            tracing::info!(
                of = ends.of(),
                replica = ends.dest(),
                "rebuild: replica joined the raid, equal to its source"
            );
            Ok(())
        }
        Err(e) => {
            ends.restore().await;
            Err(e)
        }
    }
}

/// Copy `run`'s state once it no longer runs, or after [`COPY_SETTLE`].
async fn settle<E: Ends + ?Sized>(ends: &E, run: &Run) -> Result<Option<CopyState>, E::Error> {
    wait(ends, run, COPY_SETTLE).await
}

/// Copy `run`'s state once it no longer runs, or after `within` (`None`:
/// not known any more).
pub async fn wait<E: Ends + ?Sized>(
    ends: &E,
    run: &Run,
    within: Duration,
) -> Result<Option<CopyState>, E::Error> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match ends.check(run).await? {
            Some(CopyState::Running(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(POLL).await;
            }
            s => return Ok(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(chain: usize, shared: usize, ready: bool, busy_head: bool, rounds: usize) -> Next {
        Progress {
            chain,
            shared,
            ready,
            busy_head,
            rounds,
        }
        .next()
    }

    #[test]
    fn a_rebuild_makes_the_head_then_copies_oldest_first_then_rounds_then_switches() {
        // a head with data of its own, or over the wrong snapshot: made again first
        assert_eq!(at(3, 1, false, false, 0), Next::MakeHead);
        assert_eq!(at(0, 0, false, true, 0), Next::MakeHead);
        // the chain, oldest first, from the first snapshot the dest lacks
        assert_eq!(at(3, 0, true, true, 0), Next::Copy(0));
        assert_eq!(at(3, 2, true, false, 0), Next::Copy(2));
        // the chain is copied: a busy head is snapshotted, at most MAX_ROUNDS times
        assert_eq!(at(3, 3, true, true, 0), Next::Round);
        assert_eq!(at(5, 5, true, true, MAX_ROUNDS - 1), Next::Round);
        assert_eq!(at(6, 6, true, true, MAX_ROUNDS), Next::Switch);
        assert_eq!(at(3, 3, true, false, 0), Next::Switch);
        assert_eq!(at(0, 0, true, false, 0), Next::Switch);
    }

    #[test]
    fn progress_counts_the_copied_snapshots_and_the_running_copy_never_past_the_whole() {
        let own = [10, 20, 5];
        assert_eq!(copied(&own, 0, 0), (0, 35));
        assert_eq!(copied(&own, 1, 7), (17, 35));
        assert_eq!(copied(&own, 3, 0), (35, 35));
        assert_eq!(copied(&own, 9, 100), (35, 35));
        assert_eq!(copied(&[], 0, 0), (0, 0));
    }

    /// Ends kept in memory: the dest at `at`, each copy answering `state`
    /// (what a step does is written to `log`). Stands in for no real part:
    /// the step machine's order is what is tested.
    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the scripted ends answer for a step they refuse (its words).
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Refused(String);

    struct Scripted {
        chain: Vec<String>,
        own: Vec<u64>,
        at: Mutex<At>,
        writable: bool,
        busy_head: bool,
        join_refused: bool,
        switch_refused: Option<&'static str>,
        state: Mutex<Option<CopyState>>,
        log: Mutex<Vec<String>>,
    }

    impl Scripted {
        fn new(chain: &[&str], at: At) -> Self {
            Self {
                chain: chain.iter().map(|s| (*s).to_owned()).collect(),
                own: vec![10; chain.len() + 1],
                at: Mutex::new(at),
                writable: true,
                busy_head: false,
                join_refused: false,
                switch_refused: None,
                state: Mutex::new(Some(CopyState::Running(1))),
                log: Mutex::new(Vec::new()),
            }
        }
        fn answer(&self, s: Option<CopyState>) {
            *lock(&self.state) = s;
        }
        fn at(&self, at: At) {
            *lock(&self.at) = at;
        }
        fn did(&self, what: String) {
            lock(&self.log).push(what);
        }
        fn log(&self) -> Vec<String> {
            std::mem::take(&mut *lock(&self.log))
        }
    }

    #[async_trait::async_trait]
    impl Ends for Scripted {
        type Error = Refused;
        fn of(&self) -> &str {
            "vol"
        }
        fn dest(&self) -> &str {
            "r1"
        }
        fn chain(&self) -> &[String] {
            &self.chain
        }
        fn own(&self) -> &[u64] {
            &self.own
        }
        fn cluster(&self) -> u64 {
            1
        }
        fn busy_head(&self) -> bool {
            self.busy_head
        }
        fn rounds(&self) -> usize {
            0
        }
        async fn at(&self) -> Result<At, Refused> {
            Ok(*lock(&self.at))
        }
        async fn make_ready(&self, shared: usize) -> Result<(), Refused> {
            self.did(format!("make ready over {shared}"));
            Ok(())
        }
        async fn writable(&self) -> Result<bool, Refused> {
            Ok(self.writable)
        }
        async fn start_copy(&self, j: usize) -> Result<Copier, Refused> {
            self.did(format!("copy {}", self.chain[j]));
            Ok(Copier::Here(7))
        }
        async fn check(&self, _: &Run) -> Result<Option<CopyState>, Refused> {
            Ok(lock(&self.state).clone())
        }
        async fn copy_failed(&self, run: &Run, message: String) -> Refused {
            Refused(format!("copy of {} failed: {message}", run.snap))
        }
        fn copy_lost(&self) {
            self.did("lost".into());
        }
        async fn keep(&self, snap: &str) -> Result<(), Refused> {
            self.did(format!("keep {snap}"));
            Ok(())
        }
        async fn round(&self) -> Result<String, Refused> {
            self.did("round".into());
            Ok("rb.1".into())
        }
        async fn switch_allowed(&self) -> Result<(), Refused> {
            match self.switch_refused {
                Some(why) => Err(Refused(why.into())),
                None => Ok(()),
            }
        }
        async fn close(&self) -> Result<(), Refused> {
            self.did("close".into());
            Ok(())
        }
        async fn start_last_copy(&self, snap: &str) -> Result<Copier, Refused> {
            self.did(format!("last copy {snap}"));
            Ok(Copier::Here(8))
        }
        async fn join(&self, snap: &str) -> Result<(), Refused> {
            self.did(format!("join with {snap}"));
            match self.join_refused {
                true => Err(Refused("raid refused".into())),
                false => Ok(()),
            }
        }
        async fn restore(&self) {
            self.did("restore".into());
        }
    }

    fn copying(copied: u64, total: u64) -> Step {
        Step::Copying { copied, total }
    }

    #[tokio::test(start_paused = true)]
    async fn a_copy_that_ends_in_a_later_step_is_kept_before_anything_else_is_asked() {
        let e = Scripted::new(
            &["a", "b"],
            At::Holds {
                shared: 0,
                ready: true,
            },
        );
        let runs = Runs::default();
        assert_eq!(step(&e, &runs).await, Ok(copying(0, 30)), "started");
        assert_eq!(e.log(), ["copy a"]);
        assert!(runs.any("vol") && runs.get("vol", "r1").is_some_and(|r| r.snap == "a"));
        // still running at the next step: how far it is, nothing else asked
        e.at(At::Busy { shared: 0 });
        assert_eq!(
            step(&e, &runs).await,
            Ok(copying(1, 30)),
            "one cluster of a copied"
        );
        assert_eq!(e.log(), Vec::<String>::new());
        // done by the next step: kept, nothing else done in that step
        e.answer(Some(CopyState::Done));
        e.at(At::Busy { shared: 0 });
        assert_eq!(step(&e, &runs).await, Ok(copying(10, 30)));
        assert_eq!(e.log(), ["keep a"]);
        assert!(!runs.any("vol"));
        // the next snapshot, done at once: kept in the same step
        e.at(At::Holds {
            shared: 1,
            ready: true,
        });
        assert_eq!(step(&e, &runs).await, Ok(copying(20, 30)));
        assert_eq!(e.log(), ["copy b", "keep b"]);
        assert!(!runs.any("vol"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_copy_is_the_steps_error_and_a_lost_one_is_looked_at_afresh() {
        let e = Scripted::new(
            &["a"],
            At::Holds {
                shared: 0,
                ready: true,
            },
        );
        let runs = Runs::default();
        step(&e, &runs).await.expect("copy started");
        e.answer(Some(CopyState::Failed("No space left on device".into())));
        assert_eq!(
            step(&e, &runs).await,
            Err(Refused("copy of a failed: No space left on device".into()))
        );
        assert!(!runs.any("vol"), "a failed copy is forgotten");
        // a copy failing in the step that started it fails that step
        assert_eq!(
            step(&e, &runs).await,
            Err(Refused("copy of a failed: No space left on device".into()))
        );
        // a copy its target no longer knows: forgotten, the dest looked at again
        e.log();
        e.answer(Some(CopyState::Running(0)));
        step(&e, &runs).await.expect("copy started");
        e.answer(None);
        e.at(At::Holds {
            shared: 0,
            ready: false,
        });
        assert_eq!(step(&e, &runs).await, Ok(copying(0, 20)));
        assert_eq!(e.log(), ["copy a", "lost", "make ready over 0"]);
        assert!(!runs.any("vol"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dest_busy_or_not_writable_is_not_copied_into() {
        let mut e = Scripted::new(&["a"], At::Busy { shared: 0 });
        let runs = Runs::default();
        assert_eq!(step(&e, &runs).await, Ok(copying(0, 20)));
        assert_eq!(e.log(), Vec::<String>::new(), "its side is at it: nothing asked");
        e.writable = false;
        e.at(At::Holds {
            shared: 0,
            ready: true,
        });
        assert_eq!(step(&e, &runs).await, Ok(copying(0, 20)));
        assert_eq!(e.log(), Vec::<String>::new(), "not exported yet: no copy");
        assert!(!runs.any("vol"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_chain_copied_a_busy_head_is_snapshotted_then_the_switch_joins() {
        let mut e = Scripted::new(
            &["a"],
            At::Holds {
                shared: 1,
                ready: true,
            },
        );
        e.busy_head = true;
        let runs = Runs::default();
        assert_eq!(step(&e, &runs).await, Ok(copying(10, 20)));
        assert_eq!(e.log(), ["round"]);
        e.busy_head = false;
        e.answer(Some(CopyState::Done));
        assert_eq!(step(&e, &runs).await, Ok(Step::Joined));
        assert_eq!(
            e.log(),
            ["close", "round", "last copy rb.1", "keep rb.1", "join with rb.1"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_switch_not_allowed_touches_nothing() {
        let mut e = Scripted::new(
            &["a"],
            At::Holds {
                shared: 1,
                ready: true,
            },
        );
        e.switch_refused = Some("the base is not RW in its engine");
        e.answer(Some(CopyState::Done));
        let runs = Runs::default();
        assert_eq!(
            step(&e, &runs).await,
            Err(Refused("the base is not RW in its engine".into()))
        );
        assert_eq!(
            e.log(),
            Vec::<String>::new(),
            "nothing closed, no round, no raid change"
        );
        assert!(!runs.any("vol"));
        // allowed again: the switch goes as ever
        e.switch_refused = None;
        assert_eq!(step(&e, &runs).await, Ok(Step::Joined));
        assert_eq!(
            e.log(),
            ["close", "round", "last copy rb.1", "keep rb.1", "join with rb.1"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_switch_that_fails_in_any_part_serves_the_raid_again_at_once() {
        let ready = At::Holds {
            shared: 1,
            ready: true,
        };
        let runs = Runs::default();
        // its copy fails: never kept, never joined
        let mut e = Scripted::new(&["a"], ready);
        e.answer(Some(CopyState::Failed("Input/output error".into())));
        assert_eq!(
            step(&e, &runs).await,
            Err(Refused("copy of rb.1 failed: Input/output error".into()))
        );
        assert_eq!(e.log(), ["close", "round", "last copy rb.1", "restore"]);
        // its copy does not finish while the hosts wait
        e.answer(Some(CopyState::Running(3)));
        let err = step(&e, &runs).await.expect_err("the copy never ends");
        assert!(err.0.contains("did not finish in 120 s"), "{err:?}");
        assert_eq!(e.log(), ["close", "round", "last copy rb.1", "restore"]);
        // its target forgot it
        e.answer(None);
        let err = step(&e, &runs).await.expect_err("the copy is lost");
        assert!(err.0.contains("no longer known"), "{err:?}");
        assert_eq!(e.log(), ["close", "round", "last copy rb.1", "restore"]);
        // the raid is refused with the dest: served again without it
        e.answer(Some(CopyState::Done));
        e.join_refused = true;
        assert_eq!(step(&e, &runs).await, Err(Refused("raid refused".into())));
        assert_eq!(
            e.log(),
            [
                "close",
                "round",
                "last copy rb.1",
                "keep rb.1",
                "join with rb.1",
                "restore"
            ]
        );
        assert!(
            !runs.any("vol"),
            "the switch's copy is never a step's running copy"
        );
    }

    #[test]
    fn a_failing_step_is_retried_after_pauses_and_given_up_only_after_15_s() {
        let t = Failures::default();
        let t0 = Instant::now();
        // a peer still starting: three fast failures are not the end
        assert_eq!(t.failed("e", "r", t0), Failed::Retry(1));
        assert!(t.pausing("e", "r", t0 + Duration::from_millis(900)));
        assert!(!t.pausing("e", "r", t0 + Duration::from_secs(1)));
        assert_eq!(t.failed("e", "r", t0 + Duration::from_secs(1)), Failed::Retry(2));
        assert!(t.pausing("e", "r", t0 + Duration::from_millis(2900)));
        assert_eq!(t.failed("e", "r", t0 + Duration::from_secs(3)), Failed::Retry(3));
        assert!(!t.given_up("e"));
        // the pause stops growing at 8 s
        for i in 4..10 {
            let _ = t.failed("e", "r", t0 + Duration::from_secs(3 + i));
        }
        let late = t0 + Duration::from_secs(13);
        assert!(t.pausing("e", "r", late) && !t.pausing("e", "r", late + MAX_RETRY_PAUSE));
        // failing for 15 s and more: for good
        assert_eq!(t.failed("e", "r", t0 + FAIL_AFTER), Failed::ForGood(10));
        assert!(t.given_up("e") && !t.given_up("e2"));
        // another replica, and a forgotten one, start afresh
        assert_eq!(t.failed("e", "r2", t0), Failed::Retry(1));
        t.forget("e", "r");
        assert!(!t.pausing("e", "r", t0) && !t.given_up("e"));
        assert_eq!(t.failed("e", "r", t0 + FAIL_AFTER), Failed::Retry(1));
        t.forget_all("e");
        assert!(!t.pausing("e", "r2", t0));
    }

    #[test]
    fn answers_of_a_copy_check_name_their_state() {
        assert_eq!(
            CopyState::from_answer("in progress", 4, None),
            CopyState::Running(4)
        );
        assert_eq!(CopyState::from_answer("complete", 9, None), CopyState::Done);
        assert_eq!(
            CopyState::from_answer("error", 1, Some("No space left".into())),
            CopyState::Failed("No space left".into())
        );
        assert_eq!(
            CopyState::from_answer("error", 1, None),
            CopyState::Failed("unknown error".into())
        );
        assert!(
            matches!(CopyState::from_answer("paused", 0, None), CopyState::Failed(m) if m.contains("paused"))
        );
        assert_eq!(next_round([]), 1);
        assert_eq!(next_round([2, 7, 3]), 8);
    }
}
