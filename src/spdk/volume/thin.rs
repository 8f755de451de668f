//! What every thin rebuild shares, talon's (`rebuild.rs`) and a Longhorn
//! engine's (`controllers/engine/longhorn_thin.rs`): one shallow copy
//! started and asked where it stands, the order of the steps, how far a
//! rebuild is, and the next rebuild snapshot's number.
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
//! The two callers differ in where the ends are (talon's source is always in
//! this target; a Longhorn engine's may be on another node, copied by that
//! node's target) and in how the dest is named, so each carries these steps
//! out itself. What a step does is decided here, from what the two replicas
//! hold, so a restart goes on from the copies made so far.

use std::time::Duration;

use crate::spdk::rpc::{CheckShallowCopy, ShallowCopyStatus, StartShallowCopy};
use crate::spdk::{ClientError, SpdkClient};

/// Rebuild snapshots of the source head taken while I/O goes on, before the
/// switch copies what is left with the export closed.
pub const MAX_ROUNDS: usize = 3;
/// How long a step waits for the copy it started (a small one is done in
/// this step instead of at the next reconcile).
pub const COPY_SETTLE: Duration = Duration::from_millis(300);
/// How long the switch waits for its last copy.
pub const SWITCH_COPY: Duration = Duration::from_secs(120);
/// How often a waited-for copy is asked where it stands.
const POLL: Duration = Duration::from_millis(15);

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
pub async fn start_copy(client: &SpdkClient, src: &str, dst: &str) -> Result<u32, ClientError> {
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
pub async fn copy_state(client: &SpdkClient, op: u32) -> Result<CopyState, ClientError> {
    client
        .bdev_lvol_check_shallow_copy(&CheckShallowCopy { operation_id: op })
        .await
        .map(CopyState::from)
}

/// Copy `op`'s state once it no longer runs, or after `within`.
pub async fn wait_copy(client: &SpdkClient, op: u32, within: Duration) -> Result<CopyState, ClientError> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let s = copy_state(client, op).await?;
        if !matches!(s, CopyState::Running(_)) || tokio::time::Instant::now() >= deadline {
            return Ok(s);
        }
        tokio::time::sleep(POLL).await;
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
    /// with the export closed.
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
