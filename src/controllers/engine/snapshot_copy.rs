//! A new V2 volume made with a copy of another volume's snapshot
//! (`Volume.copyFrom`, `talon volume create --from-snapshot`), as the
//! volume controller asks for it before the volume's first replica is
//! made. The shape of a restore from a backup ([`super::restore`]), with
//! a snapshot lvol as the source.
//!
//! ```text
//!   copyFrom, no ledger, no replica lvol of it ─>
//!     a copy cut off before (<lvs>/<vol>-r<k>.rst, talon or spdk_tgt stopped) deleted
//!     the source: a snapshot lvol <lvs>/<src>-r<k>.s.<snap> of the point-in-time set
//!     replica 0 placed as the volume's plan places it (plan::local: disks, overcommit)
//!     a task: mover::restore::fill_replica(Source::Snapshot)
//!       bdev_lvol_create <vol>-r0.rst (thin)
//!       at the same offsets, the same block size: mover::copy::within, inside
//!                                spdk_tgt (the chain's clusters), the room zeroed after
//!       else mover::copy::copy_range  the source's data (after its superblock room)
//!                                into the new one's (after its own): chunks with data only
//!       bdev_lvol_rename <vol>-r0.rst -> <vol>-r0
//!     status: creating, "copying ...: 45% (...)", copy {bytesCopied, bytesTotal, percent}
//!   the task done ─> the next pass finds <vol>-r0: the volume is planned like any
//!     other (r0 exists and is trusted, the other replicas made and rebuilt from it),
//!     served (ready, attachable), its ledger written, copy percent 100
//!   the task failed ─> failed with why; tried again after RETRY
//!   a ledger (served once) ─> never copied again: the snapshot may go
//! ```
//!
//! The volume is never served before replica 0 holds the whole copy: a
//! replica lvol named `<vol>-r<k>` only exists once renamed after the copy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::resources::config::{Volume, split_snapshot_id};
use crate::resources::engine::CopyProgress;
use crate::spdk::SpdkClient;
use crate::spdk::naming;
use crate::spdk::volume::plan::{self, Make, VolumePlan, point_in_time_set, superblock_room};
use crate::spdk::volume::{Inventory, mover};

const MIB: u64 = 1 << 20;

/// A failed copy is tried again after this long.
pub const RETRY: Duration = Duration::from_secs(10);

/// What the volume controller does about a volume's copy now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to copy (none asked).
    None,
    /// Copied (replica 0 holds it, or the volume was served): plan and
    /// serve it; the status shows `progress`.
    Copied(CopyProgress),
    /// Copying, or about to: what it does, and how far.
    Waiting(String, CopyProgress),
    /// The copy failed (tried again after [`RETRY`]): why.
    Failed(String, CopyProgress),
}

/// Where a volume's copy comes from, found by [`source`].
#[derive(Debug, Clone)]
pub struct Source {
    /// `<volume>@<snapshot>`.
    pub id: String,
    /// The snapshot lvol's alias.
    pub lvol: String,
    /// Where the source volume's data starts in it.
    pub from_offset: u64,
    /// The snapshot lvol's bytes after `from_offset`.
    pub len: u64,
}

#[derive(Debug)]
enum Task {
    Running {
        handle: tokio::task::JoinHandle<Result<(), String>>,
        copied: Arc<AtomicU64>,
        total: u64,
        what: String,
    },
    Failed {
        message: String,
        at: Instant,
        progress: CopyProgress,
    },
    Done(CopyProgress),
}

/// The copies of snapshots into the volumes being made.
#[derive(Debug, Default)]
pub struct SnapshotCopies {
    tasks: Mutex<BTreeMap<String, Task>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `copied` of `total` bytes from `from`, as the status shows it.
pub fn progress(from: &str, copied: u64, total: u64) -> CopyProgress {
    let copied = copied.min(total);
    let percent = match total {
        0 => 100,
        t if copied == t => 100,
        // 100 only once whole
        t => ((copied.saturating_mul(100) / t) as u8).min(99),
    };
    CopyProgress {
        from: from.to_owned(),
        bytes_copied: copied,
        bytes_total: total,
        percent,
    }
}

/// The snapshot `id` (`<volume>@<snapshot>`) to copy from, on this node:
/// a lvol of its point-in-time set (`recorded`, from the source volume's
/// ledger), with the source volume's data offset (`source_superblock`:
/// its replicas hold a raid superblock). No RPC.
pub fn source(
    inv: &Inventory,
    id: &str,
    recorded: Option<&BTreeSet<usize>>,
    source_superblock: bool,
) -> Result<Source, String> {
    let (sv, ss) = split_snapshot_id(id)?;
    let set = point_in_time_set(inv, sv.as_str(), ss.as_str(), recorded);
    let lvol = set
        .iter()
        .find_map(|&k| inv.find_lvol(&naming::snapshot_lvol(sv.as_str(), k, ss.as_str())))
        .ok_or_else(|| {
            format!(
                "snapshot {id}: no replica of volume {} on this node holds it (lvol {} in no lvstore)",
                sv.as_str(),
                naming::snapshot_lvol(sv.as_str(), 0, ss.as_str())
            )
        })?;
    let bytes = inv
        .bdev_size(&lvol.uuid)
        .ok_or_else(|| format!("snapshot {id}: lvol {} has no bdev", lvol.alias))?;
    let from_offset = if source_superblock {
        let cluster = inv
            .lvstores
            .iter()
            .find(|l| l.name == lvol.lvs.name)
            .map_or(MIB, |l| l.cluster_size);
        superblock_room(cluster)
    } else {
        0
    };
    Ok(Source {
        id: id.to_owned(),
        lvol: lvol.alias.clone(),
        from_offset,
        len: bytes.saturating_sub(from_offset),
    })
}

impl SnapshotCopies {
    /// Volume `vol` (`spec`) was served (it has a ledger): its copy is
    /// whole, never made again.
    pub fn served(&self, vol: &str, spec: &Volume) -> Step {
        match spec.copy_from.as_deref() {
            None => Step::None,
            Some(id) => Step::Copied(
                self.done(vol)
                    .unwrap_or_else(|| progress(id, spec.size_bytes, spec.size_bytes)),
            ),
        }
    }

    /// What to do about volume `vol` (`spec`, planned as `plan`), not served
    /// yet; `src`: where its copy comes from, or why it cannot be found.
    pub async fn step(
        &self,
        client: &SpdkClient,
        inv: &Inventory,
        vol: &str,
        spec: &Volume,
        src: Result<Source, String>,
        plan: &VolumePlan,
    ) -> Step {
        let Some(id) = spec.copy_from.as_deref() else {
            return Step::None;
        };
        let settled = self.settle(vol);
        let known = |total: u64| progress(id, 0, total);
        if spec.serve_replica.is_some() || !spec.remote_replicas.is_empty() {
            return Step::Failed(
                format!(
                    "volume {vol}: a copy of a snapshot is made on the engine's node, with local replicas only"
                ),
                known(0),
            );
        }
        match settled {
            Some(Step::None) | None => {}
            Some(s) => return s,
        }
        // a copy cut off (talon or spdk_tgt stopped in it): made again from the start
        match mover::restore::remove_unfinished(client, inv, vol).await {
            Ok(gone) if !gone.is_empty() => {
                tracing::info!(volume = %vol, lvols = ?gone, "removed a copy of a snapshot that was cut off");
                return Step::Waiting(
                    format!(
                        "removed {} (its copy was cut off); copying {id} again",
                        gone.join(", ")
                    ),
                    known(0),
                );
            }
            Ok(_) => {}
            Err(e) => {
                return Step::Failed(
                    format!("volume {vol}: {}", crate::util::error_chain(&e)),
                    known(0),
                );
            }
        }
        let exists =
            (0..spec.replicas.max(1) as usize).any(|k| inv.find_lvol(&naming::replica(vol, k)).is_some());
        if exists {
            return Step::Copied(
                self.done(vol)
                    .unwrap_or_else(|| progress(id, spec.size_bytes, spec.size_bytes)),
            );
        }
        let src = match src {
            Ok(s) => s,
            Err(e) => return Step::Failed(format!("volume {vol}: {e}"), known(0)),
        };
        self.start(client, inv, vol, src, plan)
    }

    /// A task's end taken (under the lock): what it says now, if a task is there.
    fn settle(&self, vol: &str) -> Option<Step> {
        let mut tasks = lock(&self.tasks);
        let task = tasks.remove(vol)?;
        let (now, keep) = match task {
            Task::Running {
                handle,
                copied,
                total,
                what,
            } => {
                let p = progress(&what, copied.load(Ordering::Relaxed), total);
                if !handle.is_finished() {
                    let says = format!(
                        "copying snapshot {what}: {}% ({} of {})",
                        p.percent,
                        crate::util::size::Bytes(p.bytes_copied),
                        crate::util::size::Bytes(total)
                    );
                    let step = Step::Waiting(says, p);
                    (
                        Some(step),
                        Task::Running {
                            handle,
                            copied,
                            total,
                            what,
                        },
                    )
                } else {
                    // finished: its result, without waiting (a panic or abort is a failure)
                    let r = futures::FutureExt::now_or_never(handle)
                        .unwrap_or_else(|| Ok(Err("the copy task did not end".into())))
                        .unwrap_or_else(|e| Err(format!("the copy task ended: {e}")));
                    match r {
                        Ok(()) => {
                            let p = progress(&what, total, total);
                            // the replica is seen by the next pass (this one's inventory is older)
                            (
                                Some(Step::Waiting(
                                    format!("copied snapshot {what}; serving"),
                                    p.clone(),
                                )),
                                Task::Done(p),
                            )
                        }
                        Err(message) => {
                            let step = Step::Failed(message.clone(), p.clone());
                            (
                                Some(step),
                                Task::Failed {
                                    message,
                                    at: Instant::now(),
                                    progress: p,
                                },
                            )
                        }
                    }
                }
            }
            Task::Failed {
                message,
                at,
                progress,
            } => {
                if at.elapsed() >= RETRY {
                    return Some(Step::None);
                }
                let step = Step::Failed(
                    format!(
                        "{message} (tried again in {} s)",
                        RETRY.saturating_sub(at.elapsed()).as_secs() + 1
                    ),
                    progress.clone(),
                );
                (
                    Some(step),
                    Task::Failed {
                        message,
                        at,
                        progress,
                    },
                )
            }
            Task::Done(p) => (None, Task::Done(p)),
        };
        tasks.insert(vol.to_owned(), keep);
        now
    }

    /// The progress of volume `vol`'s copy that ended, if this talon made it.
    fn done(&self, vol: &str) -> Option<CopyProgress> {
        match lock(&self.tasks).get(vol) {
            Some(Task::Done(p)) => Some(p.clone()),
            _ => None,
        }
    }

    /// Starts the copy of `src` into replica 0 of `vol`, placed as `plan` places it.
    fn start(&self, client: &SpdkClient, inv: &Inventory, vol: &str, src: Source, plan: &VolumePlan) -> Step {
        let waiting = progress(&src.id, 0, src.len);
        let local = match plan::local(inv, plan) {
            Ok(l) => l,
            Err(e) => {
                return Step::Waiting(
                    format!(
                        "waiting for disks to copy {} into: {}",
                        src.id,
                        crate::util::error_chain(&e)
                    ),
                    waiting,
                );
            }
        };
        let Some(r0) = local.replicas.iter().find(|r| r.k == 0) else {
            let why = local
                .waiting
                .iter()
                .map(|(k, d)| format!("replica {k} waits for disk {d}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Step::Waiting(
                format!("waiting for a disk to copy {} into ({why})", src.id),
                waiting,
            );
        };
        let Some(Make::Thin { mib }) = r0.make else {
            return Step::Failed(
                format!(
                    "volume {vol}: replica {} is not a new thin lvol ({:?})",
                    r0.name, r0.make
                ),
                waiting,
            );
        };
        let data_bytes = r0.size_bytes.saturating_sub(r0.room).min(mib * MIB);
        let len = src.len.min(data_bytes);
        let copied = Arc::new(AtomicU64::new(0));
        let from = mover::restore::Source::Snapshot(mover::restore::FromSnapshot {
            id: src.id.clone(),
            lvol: src.lvol.clone(),
            from_offset: src.from_offset,
            len,
            data_offset: r0.room,
            copied: copied.clone(),
        });
        let (client, lvs, name, what) = (
            client.clone(),
            naming::lvstore(&r0.disk),
            r0.name.clone(),
            src.id.clone(),
        );
        tracing::info!(volume = %vol, from = %src.lvol, replica = %r0.alias, bytes = len, "copying a snapshot into a new volume");
        let volume = vol.to_owned();
        let handle = tokio::spawn(async move {
            match mover::restore::fill_replica(&client, &from, &lvs, &name, mib).await {
                Ok(_) => {
                    tracing::info!(%volume, %from, "copied a snapshot into a new volume");
                    Ok(())
                }
                Err(e) => {
                    let why = format!(
                        "volume {volume}: copying {from}: {}",
                        crate::util::error_chain(&e)
                    );
                    tracing::warn!(%volume, error = %why, "a copy of a snapshot failed");
                    Err(why)
                }
            }
        });
        let p = progress(&what, 0, len);
        lock(&self.tasks).insert(
            vol.to_owned(),
            Task::Running {
                handle,
                copied,
                total: len,
                what: what.clone(),
            },
        );
        Step::Waiting(format!("copying snapshot {what}: 0%"), p)
    }

    /// Stops the copies into volumes not in `live` (deleted, or being deleted).
    pub fn retain(&self, live: &BTreeSet<String>) {
        lock(&self.tasks).retain(|v, t| {
            let keep = live.contains(v);
            if !keep && let Task::Running { handle, .. } = t {
                handle.abort();
            }
            keep
        });
    }
}

/// A controller stopped stops its copies: one cut off is made again from
/// the start by the next (its lvol is still `<replica>.rst`).
impl Drop for SnapshotCopies {
    fn drop(&mut self) {
        for t in lock(&self.tasks).values() {
            if let Task::Running { handle, .. } = t {
                handle.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reaches_100_only_when_whole() {
        assert_eq!(progress("a@s", 0, 10).percent, 0);
        assert_eq!(progress("a@s", 5, 10).percent, 50);
        assert_eq!(progress("a@s", 999, 1000).percent, 99);
        assert_eq!(progress("a@s", 1000, 1000).percent, 100);
        assert_eq!(progress("a@s", 2000, 1000).bytes_copied, 1000);
        assert_eq!(progress("a@s", 0, 0).percent, 100);
    }
}
