//! Longhorn's snapshot integrity hash: `SnapshotHash`/`SnapshotHashStatus`
//! of the engine proxy (8501), which longhorn-manager's snapshot monitor
//! calls to compare a snapshot's checksum across the engine's replicas, and
//! the replica node's side of it (8504 `ReplicaSnapshotHash`/`Status`).
//!
//! ```text
//!   SnapshotHash(engine, s, rehash) ──> each RW member: here Hashes::start, elsewhere its
//!                                       node's ReplicaSnapshotHash (a WO member: refused)
//!   one job per replica and snapshot, in the background, one at a time per node:
//!     the snapshot lvol <lvs>/<replica>-snap-<s> read through the data mover
//!     (spdk::volume::mover: a temporary export on 127.0.0.1, talon's own
//!     NVMe/TCP host; no file, no copy): 1 MiB chunks, in order, 4 ahead
//!     (the lvol reads through its chain, so it reads as s reads); of a
//!     sparse chain only the chunks its allocation map names (mover::map:
//!     the others read as zeros, which the checksum skips anyway)
//!     SHA-256 over them as they stream (checksum); the export removed
//!   SnapshotHashStatus ──> {replica ip:port: "" | in_progress | complete + checksum | error}
//! ```
//!
//! Why the whole chain: a snapshot's own clusters depend on allocation (a
//! replica rebuilt, or a parent deleted and merged into it, holds the same
//! data in other clusters); what the snapshot reads does not. The checksum
//! is SHA-256 over the snapshot's size and every 1 MiB chunk that is not all
//! zeros (with its offset): a hole and written zeros hash alike, so equal
//! data gives an equal checksum on every replica. SPDK v26.05 has no
//! checksum RPC (Longhorn's fork has `bdev_lvol_register_snapshot_checksum`),
//! so the data comes out through the mover (until issue 55 it was
//! shallow-copied into a file on the data dir; the checksum is the same).
//!
//! Nothing is left behind: the export goes on every path; a replica
//! deleted mid-hash stops its hashes ([`Hashes::drop_replica`]: the
//! session dropped removes its export); a talon restart mid-hash leaves it
//! to the mover's sweep (the orphan controller's poll). [`Hashes::sweep`]
//! still removes the files and aio bdevs of an earlier talon's hashes.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tonic::Status;

use crate::names::ObjectName;
use crate::proto::spdkrpc;
use crate::resources::longhorn::snapshot_lvol;
use crate::spdk::SpdkClient;
use crate::spdk::volume::Inventory;
use crate::spdk::volume::ReplicaLvols;
use crate::spdk::volume::mover;
use crate::spdk::volume::mover::backup::map_pays;
use crate::spdk::volume::to_file::{self, Chain};

/// The states Longhorn's snapshot monitor reads (`SnapshotHashStatus` in
/// longhorn-manager's `k8s/pkg/apis/longhorn/v1beta2/snapshot.go`).
pub const IN_PROGRESS: &str = "in_progress";
/// See [`IN_PROGRESS`].
pub const COMPLETE: &str = "complete";
/// See [`IN_PROGRESS`].
pub const ERROR: &str = "error";
/// The name prefix of the aio bdevs a hash copies into.
pub const BDEV_PREFIX: &str = "talon-hash-";
/// How often the start's sweep looks again while spdk_tgt does not answer.
const SWEEP_RETRY: Duration = Duration::from_secs(10);
/// The chunk the checksum skips when it is all zeros.
const CHUNK: u64 = 1 << 20;
/// The chunks a hash reads ahead of the one it hashes.
const AHEAD: usize = 4;

/// Where one replica's hash of one snapshot stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// Queued or copying.
    Running,
    /// The checksum.
    Complete(String),
    /// Why it failed.
    Failed(String),
}

/// The hash jobs of this node's replicas, by (replica, snapshot), and the
/// directory an earlier talon staged them in. Kept by the server (talon's Longhorn
/// services), for as long as it runs: a restart forgets them, and the next
/// `SnapshotHash` hashes again.
#[derive(Debug)]
pub struct Hashes {
    dir: Option<PathBuf>,
    jobs: Mutex<BTreeMap<(String, String), Job>>,
    /// The tasks of the jobs running, to stop them when their replica goes.
    tasks: Mutex<BTreeMap<(String, String), tokio::task::AbortHandle>>,
    /// One copy at a time on this node.
    one: tokio::sync::Semaphore,
}

impl Hashes {
    /// Jobs that stream (no file); `dir` is where an earlier talon staged
    /// its hashes, swept at the start.
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self {
            dir,
            jobs: Mutex::default(),
            tasks: Mutex::default(),
            one: tokio::sync::Semaphore::new(1),
        }
    }

    /// Starts hashing snapshot `snap` of `replica` (in lvstore `lvs`) in the
    /// background, unless a hash of it runs (no second one) or one completed
    /// and `rehash` is false.
    pub(super) fn start(
        self: &Arc<Self>,
        client: &SpdkClient,
        lvs: String,
        replica: &ObjectName,
        snap: &str,
        rehash: bool,
    ) -> Result<(), Status> {
        let hashes = Arc::clone(self);
        let key = (replica.as_str().to_owned(), snap.to_owned());
        {
            let mut jobs = hashes.jobs();
            match jobs.get(&key) {
                Some(Job::Running) => return Ok(()),
                Some(Job::Complete(_)) if !rehash => return Ok(()),
                _ => {}
            }
            jobs.insert(key.clone(), Job::Running);
        }
        let client = client.clone();
        let mut tasks = self.tasks();
        let task = tokio::spawn(async move {
            let r = match hashes.one.acquire().await {
                Ok(_one) => run(&client, &lvs, &key.0, &key.1).await,
                Err(_) => Err(HashError::Stopped {
                    replica: key.0.clone(),
                    snap: key.1.clone(),
                }),
            }
            .map_err(|e| crate::util::error_chain(&e));
            match &r {
                Ok(sum) => {
                    tracing::info!(replica = %key.0, snapshot = %key.1, checksum = %sum, "snapshot hashed")
                }
                Err(m) => {
                    tracing::info!(replica = %key.0, snapshot = %key.1, error = %m, "snapshot hash failed")
                }
            }
            let job = r.map_or_else(Job::Failed, Job::Complete);
            hashes.tasks().remove(&key);
            hashes.jobs().insert(key, job);
        });
        // under the lock: the task's own removal waits for this insert
        let key = (replica.as_str().to_owned(), snap.to_owned());
        tasks.insert(key, task.abort_handle());
        Ok(())
    }

    /// Replica `replica` is gone: its hashes stop and are forgotten (their
    /// files and bdevs removed as [`to_file::Staging`] removes them).
    pub(super) fn drop_replica(&self, replica: &str) {
        let mut tasks = self.tasks();
        let gone: Vec<(String, String)> = tasks.keys().filter(|(r, _)| r == replica).cloned().collect();
        for key in gone {
            if let Some(t) = tasks.remove(&key) {
                t.abort();
                tracing::info!(replica, snapshot = %key.1, "stopped a snapshot hash: its replica was deleted");
            }
        }
        drop(tasks);
        self.jobs().retain(|(r, _), _| r != replica);
    }

    fn tasks(&self) -> MutexGuard<'_, BTreeMap<(String, String), tokio::task::AbortHandle>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the hash of a (replica, snapshot) stands.
    pub(super) fn job(&self, key: &(String, String)) -> Option<Job> {
        self.jobs().get(key).cloned()
    }

    /// Forgets the hash of a (replica, snapshot) that is gone.
    pub(super) fn forget(&self, key: &(String, String)) {
        self.jobs().remove(key);
    }

    fn jobs(&self) -> MutexGuard<'_, BTreeMap<(String, String), Job>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes what a hash left behind before this start (a restart
    /// mid-hash): the files under the directory and the aio bdevs named
    /// [`BDEV_PREFIX`]`*` in spdk_tgt of no hash running now. spdk_tgt may
    /// not answer yet (it starts with the first disk, or is adopted): the
    /// bdevs are looked for again, every 10 s, until it does.
    pub async fn sweep(self: &Arc<Self>, client: &SpdkClient) {
        if self.sweep_once(client).await {
            return;
        }
        let (hashes, client) = (Arc::downgrade(self), client.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_RETRY).await;
                let Some(h) = hashes.upgrade() else { return };
                if h.sweep_once(&client).await {
                    return;
                }
            }
        });
    }

    /// One [`Hashes::sweep`]; whether spdk_tgt answered.
    async fn sweep_once(&self, client: &SpdkClient) -> bool {
        let running: std::collections::BTreeSet<String> =
            self.tasks().keys().map(|(r, s)| job_name(r, s)).collect();
        if let Some(dir) = &self.dir
            && let Ok(entries) = std::fs::read_dir(dir)
        {
            for e in entries.flatten() {
                if running.contains(e.file_name().to_str().unwrap_or_default()) {
                    continue;
                }
                if let Err(x) = std::fs::remove_file(e.path()) {
                    tracing::warn!(file = %e.path().display(), error = %x, "removing a snapshot hash file");
                }
            }
        }
        let listed = tokio::time::timeout(Duration::from_secs(2), Inventory::load(client)).await;
        let Ok(Ok(inv)) = listed else {
            return false;
        };
        for b in inv.bdevs.keys() {
            let Some(name) = b.strip_prefix(BDEV_PREFIX) else {
                continue;
            };
            if running.contains(name) {
                continue;
            }
            match to_file::remove_bdev(client, b).await {
                Ok(()) => tracing::info!(bdev = %b, "removed a snapshot hash bdev left by an earlier run"),
                Err(x) => {
                    tracing::warn!(bdev = %b, error = %crate::util::error_chain(&x), "removing a snapshot hash bdev")
                }
            }
        }
        true
    }
}

/// The file and bdev name of replica `replica`'s hash of snapshot `snap`.
fn job_name(replica: &str, snap: &str) -> String {
    format!("{replica}@{snap}")
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The checksum as it is built: SHA-256 over a tag, the snapshot's size,
/// and each 1 MiB chunk that is not all zeros, with its offset (a hole and
/// written zeros hash alike).
struct Sum(ring::digest::Context);

impl Sum {
    fn new(size: u64) -> Sum {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"talon-snaphash-1");
        ctx.update(&size.to_le_bytes());
        Sum(ctx)
    }

    /// The chunk at `at` (1 MiB, the last one shorter).
    fn chunk(&mut self, at: u64, chunk: &[u8]) {
        if mover::has_data(chunk) {
            self.0.update(&at.to_le_bytes());
            self.0.update(chunk);
        }
    }

    fn finish(self) -> String {
        to_hex(self.0.finish().as_ref())
    }
}

/// The checksum of the first `size` bytes of `path`, as [`run`] computes
/// it of a snapshot. Holes are skipped without reading them (`SEEK_DATA`).
pub fn checksum(path: &Path, size: u64) -> io::Result<String> {
    let f = std::fs::File::open(path)?;
    let mut sum = Sum::new(size);
    let mut buf = vec![0u8; CHUNK as usize];
    let mut at = 0u64;
    while at < size {
        // the next data at or after `at` (holes read as zeros: skipped)
        let offset = i64::try_from(at).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        match nix::unistd::lseek(&f, offset, nix::unistd::Whence::SeekData) {
            Ok(d) => at = (u64::try_from(d).unwrap_or(at) / CHUNK * CHUNK).max(at),
            Err(nix::errno::Errno::ENXIO) => break,
            Err(_) => {}
        }
        if at >= size {
            break;
        }
        let n = usize::try_from((size - at).min(CHUNK)).unwrap_or(buf.len());
        let chunk = &mut buf[..n];
        f.read_exact_at(chunk, at)?;
        sum.chunk(at, chunk);
        at += CHUNK;
    }
    Ok(sum.finish())
}

/// Replica `replica`'s snapshot `snap` in lvstore `lvs` as spdk_tgt holds
/// it now; `None` when it is not there.
fn plan_of(inv: &Inventory, lvs: &str, replica: &str, snap: &str) -> Option<Chain> {
    ReplicaLvols::from_inventory(inv, lvs, replica)
        .snapshots
        .get(snap)?;
    Chain::of(inv, &format!("{lvs}/{}", snapshot_lvol(replica, snap)))
}

/// Why a snapshot was not hashed; its text (with its sources) is the
/// job's error that `ReplicaSnapshotHashStatus` answers.
#[derive(Debug, thiserror::Error)]
enum HashError {
    /// This node's target was not listed.
    #[error("replica {replica}: hashing snapshot {snap}: listing spdk_tgt")]
    List {
        replica: String,
        snap: String,
        #[source]
        source: crate::spdk::ClientError,
    },
    /// The snapshot went before or while it was read.
    #[error("replica {replica}: snapshot {snap} was deleted while it was hashed")]
    Gone { replica: String, snap: String },
    /// The snapshot was not read through.
    #[error("replica {replica}: hashing snapshot {snap}")]
    Read {
        replica: String,
        snap: String,
        #[source]
        source: mover::MoverError,
    },
    /// The node stopped before the job's turn came.
    #[error("replica {replica}: hashing snapshot {snap}: stopped")]
    Stopped { replica: String, snap: String },
}

/// One job: the snapshot read through the mover (a temporary loopback
/// export, no file) and hashed as it streams ([`hash_lvol`], mapped when
/// that pays: [`map_of`]); the export removed again on every path (a job
/// stopped drops its session, which removes it).
async fn run(client: &SpdkClient, lvs: &str, replica: &str, snap: &str) -> Result<String, HashError> {
    let (r, sn) = (replica.to_owned(), snap.to_owned());
    let gone = || HashError::Gone {
        replica: r.clone(),
        snap: sn.clone(),
    };
    let inv = Inventory::load(client).await.map_err(|source| HashError::List {
        replica: r.clone(),
        snap: sn.clone(),
        source,
    })?;
    let plan = plan_of(&inv, lvs, replica, snap).ok_or_else(gone)?;
    let alias = format!("{lvs}/{}", snapshot_lvol(replica, snap));
    let sum = hash_lvol(client, &alias, plan.size, map_of(&inv, &plan)).await;
    // a snapshot deleted meanwhile (its read may have failed for it, or
    // ended before): no checksum of it
    let now = Inventory::load(client).await.ok();
    let still = now.as_ref().and_then(|inv| plan_of(inv, lvs, replica, snap));
    match (sum, still) {
        (_, None) if now.is_some() => Err(gone()),
        (Ok(h), _) => {
            tracing::debug!(
                replica,
                snapshot = snap,
                read = h.read,
                size = h.size,
                "snapshot read for its hash"
            );
            Ok(h.checksum)
        }
        (Err(source), _) => Err(HashError::Read {
            replica: r,
            snap: sn,
            source,
        }),
    }
}

/// The lvols whose allocation map tells a hash of `chain`'s snapshot which
/// chunks to read: the whole chain, when its own clusters are all that
/// reads as data ([`mover::map::names_all_data`]) and the map's copy of
/// them costs less than reading the snapshot ([`map_pays`]); `None`: every
/// chunk is read.
pub fn map_of<'a>(inv: &Inventory, chain: &'a Chain) -> Option<&'a [String]> {
    let held: u64 = chain.held.iter().sum();
    (mover::map::names_all_data(inv, &chain.lvols) && map_pays(held, chain.size, false))
        .then_some(chain.lvols.as_slice())
}

/// What a hash read: the checksum, the bytes read and the snapshot's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashed {
    /// The checksum ([`checksum`] of the same data gives the same).
    pub checksum: String,
    /// The bytes read from spdk_tgt (the chunks the map names, or all).
    pub read: u64,
    /// The snapshot's size.
    pub size: u64,
}

/// The checksum of lvol `alias` (`lvs/name`, `size` bytes) as it reads,
/// streamed through the mover: 1 MiB chunks, in order, [`AHEAD`] in flight.
/// With `map` (the lvols of its chain, oldest first, as [`map_of`] gives
/// them) only the chunks their allocation map meets are read: the others
/// read as zeros, which the checksum skips, so it is the same either way. A
/// map that cannot be made is logged and every chunk read.
pub async fn hash_lvol(
    client: &SpdkClient,
    alias: &str,
    size: u64,
    map: Option<&[String]>,
) -> Result<Hashed, mover::MoverError> {
    let s = mover::Session::open(client, alias, mover::Purpose::Hash, mover::DEPTH).await?;
    if s.size() != size {
        let reason = format!("its export holds {} bytes, the snapshot {size}", s.size());
        let _ = s.close().await;
        return Err(mover::MoverError::Invalid {
            bdev: alias.to_owned(),
            reason,
        });
    }
    let ranges = match map {
        Some(lvols) => match mover::map::allocated(client, lvols, size, s.block_size()).await {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(snapshot = alias, error = %crate::util::error_chain(&e),
                    "no allocation map of the snapshot's chain: its hash reads every chunk");
                None
            }
        },
        None => None,
    };
    let mut sum = Sum::new(size);
    let mut read = 0u64;
    let wanted = |start: u64, end: u64| ranges.as_ref().is_none_or(|m| m.touches(start, end));
    let streamed = s
        .read_in_order_where(CHUNK as usize, AHEAD, wanted, |at, d| {
            read += d.len() as u64;
            sum.chunk(at, d);
            Ok(())
        })
        .await;
    if let Err(e) = streamed {
        let _ = s.close().await;
        return Err(e);
    }
    s.close().await?;
    Ok(Hashed {
        checksum: sum.finish(),
        read,
        size,
    })
}

pub(super) fn status_message(job: Option<Job>) -> spdkrpc::ReplicaSnapshotHashStatusResponse {
    let (state, checksum, error) = match job {
        None => ("", String::new(), String::new()),
        Some(Job::Running) => (IN_PROGRESS, String::new(), String::new()),
        Some(Job::Complete(c)) => (COMPLETE, c, String::new()),
        Some(Job::Failed(e)) => (ERROR, String::new(), e),
    };
    spdkrpc::ReplicaSnapshotHashStatusResponse {
        state: state.to_owned(),
        checksum,
        error,
        // talon keeps no earlier checksum to find silent corruption by
        // (Longhorn's V2 engine reports false too)
        silently_corrupted: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(chunks: &[(u64, &[u8])], size: u64) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().expect("temp file");
        f.as_file().set_len(size).expect("size");
        for (at, data) in chunks {
            f.as_file().write_all_at(data, *at).expect("write");
        }
        f
    }

    #[test]
    fn equal_data_gives_an_equal_checksum_whatever_is_allocated() {
        let size = 8 * CHUNK;
        let data = vec![7u8; 4096];
        let sparse = file_with(&[(3 * CHUNK + 512, &data)], size);
        // the same data, with zeros written where the other has holes
        let zeros = vec![0u8; 2 * CHUNK as usize];
        let dense = file_with(
            &[(0, &zeros), (5 * CHUNK, &zeros), (3 * CHUNK + 512, &data)],
            size,
        );
        let a = checksum(sparse.path(), size).expect("checksum");
        assert_eq!(a, checksum(dense.path(), size).expect("checksum"));
        assert_eq!(a.len(), 64, "SHA-256 in hex: {a}");
        // the same bytes elsewhere, other bytes, another size: another checksum
        let moved = file_with(&[(4 * CHUNK + 512, &data)], size);
        assert_ne!(a, checksum(moved.path(), size).expect("checksum"));
        let other = file_with(&[(3 * CHUNK + 512, &vec![8u8; 4096])], size);
        assert_ne!(a, checksum(other.path(), size).expect("checksum"));
        let bigger = file_with(&[(3 * CHUNK + 512, &data)], size + CHUNK);
        assert_ne!(a, checksum(bigger.path(), size + CHUNK).expect("checksum"));
    }

    #[test]
    fn a_size_that_is_not_a_multiple_of_the_chunk_is_hashed_to_its_end() {
        let size = CHUNK + 4096;
        let a = file_with(&[(CHUNK, &[1u8; 4096])], size);
        let b = file_with(&[(CHUNK, &[2u8; 4096])], size);
        assert_ne!(
            checksum(a.path(), size).expect("checksum"),
            checksum(b.path(), size).expect("checksum")
        );
    }

    #[test]
    fn the_status_carries_longhorns_states() {
        assert_eq!(status_message(None).state, "");
        assert_eq!(status_message(Some(Job::Running)).state, "in_progress");
        let c = status_message(Some(Job::Complete("ab".into())));
        assert_eq!((c.state.as_str(), c.checksum.as_str()), ("complete", "ab"));
        let e = status_message(Some(Job::Failed("gone".into())));
        assert_eq!((e.state.as_str(), e.error.as_str()), ("error", "gone"));
    }
}
