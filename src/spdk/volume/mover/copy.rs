//! One bdev's data copied into another through the mover: a snapshot into
//! a new volume (Longhorn's `SnapshotClone`). Both are exported to talon for
//! the copy; only the chunks that hold data are written, so a thin target
//! allocates about what the source holds.
//!
//! ```text
//!   Session::open(from, Clone)   to: the caller's session (its own export of
//!                                the target, or one joined: an engine's export)
//!   read 1 MiB chunks in order, READ_AHEAD in flight ──> all zeros? skipped
//!                                                   └─> write, WRITE_AHEAD in flight
//!   copied: the bytes read so far (the caller's progress)
//!   close both (an error or a drop: both exports removed all the same)
//! ```
//!
//! A snapshot in the same spdk_tgt as a target bdev no subsystem exports
//! (v26.05 refuses a shallow copy into an exported one) is copied inside it
//! instead ([`within`]): SPDK's shallow copy of each snapshot of its chain,
//! oldest first, reads and writes only the clusters each holds of its own
//! (a newer snapshot's over the older's), with no export and nothing read
//! twice. Measured (benches/clone.rs, a 4 GiB snapshot, a chain of two):
//! 1 GiB of data 4.4-6.3 -> 2.0-2.4 s, 128 MiB 2.8-3.7 -> 0.37-0.44 s; the
//! same clusters allocated, the same data.
//!
//! ```text
//!   within(snap, dst)   chain = the snapshots below snap, oldest first, then snap
//!     an earlier copy into dst that still runs (its id persisted by the caller)
//!       is waited for first: two copies into one bdev would mix layers
//!     each: bdev_lvol_start_shallow_copy(snapshot, dst) -> op (given to the caller
//!           to persist), bdev_lvol_check_shallow_copy(op) until complete
//!     dst of another block size than snap's (v26.05 would copy at the wrong
//!       offsets), or the first start refused: Ok(None), nothing written:
//!       the caller copies through the mover
//!   copied: the clusters copied so far, as a share of `size`
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::{FuturesOrdered, FuturesUnordered};

use super::{CHUNK, Filled, MoverError, Purpose, Session, has_data};
use crate::spdk::SpdkClient;
use crate::spdk::volume::Inventory;
use crate::spdk::volume::thin::{CopyState, copy_state, start_copy};

/// Chunks read ahead of the one being looked at.
pub const READ_AHEAD: usize = 4;
/// Chunks being written at once.
pub const WRITE_AHEAD: usize = 8;

/// Copies bdev `from` into session `dst` (at least as large, new: it reads
/// zeros where nothing is written) from offset 0 to `from`'s end, writing
/// only chunks that hold data; `copied` follows the bytes read. At most
/// `READ_AHEAD + WRITE_AHEAD` chunks are in memory. Both sessions are
/// closed on every path.
pub async fn copy(
    client: &SpdkClient,
    from: &str,
    dst: Session,
    depth: u16,
    copied: &AtomicU64,
) -> Result<Filled, MoverError> {
    copy_range(client, from, Range::whole(), dst, depth, copied).await
}

/// Which bytes [`copy_range`] copies, and where they go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// Where the bytes start in the source.
    pub from_offset: u64,
    /// How many (`None`: up to the source's end).
    pub len: Option<u64>,
    /// Where they go in the target.
    pub to_offset: u64,
}

impl Range {
    /// The whole source, at the same offsets.
    pub fn whole() -> Self {
        Self {
            from_offset: 0,
            len: None,
            to_offset: 0,
        }
    }
}

/// Copies `range` of bdev `from` into session `dst` (new: it reads zeros
/// where nothing is written) as [`copy`] does: a volume's data from one
/// replica layout into another (each its own data offset). Offsets and
/// length are whole blocks of both bdevs; the range must fit in both.
/// Both sessions are closed on every path.
pub async fn copy_range(
    client: &SpdkClient,
    from: &str,
    range: Range,
    dst: Session,
    depth: u16,
    copied: &AtomicU64,
) -> Result<Filled, MoverError> {
    let src = Session::open(client, from, Purpose::Clone, depth).await?;
    copy_sessions(src, range, dst, copied).await
}

/// Copies `range` of session `src` into session `dst` as [`copy_range`]
/// does: the source another's export joined ([`Session::join`]: a snapshot
/// another node exposes for a clone). Both sessions are closed on every
/// path (a joined one's export stays its owner's).
pub async fn copy_sessions(
    src: Session,
    range: Range,
    dst: Session,
    copied: &AtomicU64,
) -> Result<Filled, MoverError> {
    let from = src.bdev.clone();
    let done = async {
        let len = check_range(&src, &dst, &from, range)?;
        run(&src, &dst, range, len, copied).await
    }
    .await;
    let (a, b) = (src.close().await, dst.close().await);
    let done = done?;
    a?;
    b?;
    Ok(done)
}

/// The bytes `range` copies, once checked against both sessions; why not
/// names the target.
fn check_range(src: &Session, dst: &Session, from: &str, range: Range) -> Result<u64, MoverError> {
    let size = src.size();
    if range.from_offset > size {
        return Err(dst.invalid(format!(
            "offset {} is past the end of {from} ({size} bytes)",
            range.from_offset
        )));
    }
    let len = range.len.unwrap_or(size - range.from_offset);
    if range.from_offset + len > size {
        return Err(dst.invalid(format!(
            "{len} bytes from offset {} pass the end of {from} ({size} bytes)",
            range.from_offset
        )));
    }
    if dst.size() < range.to_offset.saturating_add(len) {
        return Err(dst.invalid(format!(
            "it holds {} bytes, less than the {len} bytes of {from} at offset {}",
            dst.size(),
            range.to_offset
        )));
    }
    for (what, bs) in [("source", src.block_size()), ("target", dst.block_size())] {
        let bs = u64::from(bs.max(1));
        if ![len, range.from_offset, range.to_offset]
            .iter()
            .all(|x| x.is_multiple_of(bs))
        {
            return Err(dst.invalid(format!(
                "{len} bytes of {from} from offset {} to offset {} are not whole blocks of the {what}'s {bs} bytes",
                range.from_offset, range.to_offset
            )));
        }
    }
    Ok(len)
}

async fn run(
    src: &Session,
    dst: &Session,
    range: Range,
    size: u64,
    copied: &AtomicU64,
) -> Result<Filled, MoverError> {
    let (base, to) = (range.from_offset, range.to_offset);
    let mut done = Filled::default();
    let mut reads = FuturesOrdered::new();
    let mut writes = FuturesUnordered::new();
    let mut next = 0u64;
    loop {
        while next < size && reads.len() < READ_AHEAD {
            let (at, len) = (next, (CHUNK as u64).min(size - next) as usize);
            reads.push_back(async move { src.read(base + at, len).await.map(|d| (at, d)) });
            next += len as u64;
        }
        if reads.is_empty() {
            break;
        }
        // writes go on while the next chunk is read; a full queue of writes is drained first
        let (at, data) = if writes.len() >= WRITE_AHEAD {
            if let Some(w) = writes.next().await {
                w?;
            }
            continue;
        } else if writes.is_empty() {
            match reads.next().await {
                Some(r) => r?,
                None => break,
            }
        } else {
            tokio::select! {
                biased;
                Some(w) = writes.next() => {
                    w?;
                    continue;
                }
                Some(r) = reads.next() => r?,
            }
        };
        let len = data.len() as u64;
        done.read += len;
        if has_data(&data) {
            done.written += len;
            writes.push(dst.write(to + at, Bytes::from(data)));
        }
        copied.store(at + len, Ordering::Relaxed);
    }
    while let Some(w) = writes.next().await {
        w?;
    }
    Ok(done)
}

/// How long [`within`] waits between two looks at a running shallow copy.
const WITHIN_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// What [`within`] copies, and what it tells its caller.
pub struct Within<'a> {
    /// The snapshot (an lvol alias of the target).
    pub snap: &'a str,
    /// The bdev written (new: it reads zeros where nothing is written).
    pub dst: &'a str,
    /// A copy an earlier try started into `dst` (an id `started` got):
    /// waited for until it no longer runs.
    pub earlier: Option<u32>,
    /// Gets each copy's id before it is waited for, for the caller to persist.
    pub started: &'a (dyn Fn(u32) + Sync),
    /// `copied` follows the clusters copied as a share of this many bytes.
    pub size: u64,
}

impl std::fmt::Debug for Within<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Within")
            .field("snap", &self.snap)
            .field("dst", &self.dst)
            .field("earlier", &self.earlier)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Copies snapshot `w.snap` into bdev `w.dst` of the same target: a
/// shallow copy of each snapshot of its chain (`inv`'s), oldest first,
/// one at a time. `Ok(None)`: SPDK refused the first copy before anything
/// was written (the caller copies another way).
pub async fn within(
    client: &SpdkClient,
    inv: &Inventory,
    w: &Within<'_>,
    copied: &AtomicU64,
) -> Result<Option<Filled>, MoverError> {
    let (snap, dst, size) = (w.snap, w.dst, w.size);
    let rpc = |step: String| {
        let bdev = dst.to_owned();
        move |source| MoverError::Rpc { bdev, step, source }
    };
    if let Some(op) = w.earlier {
        // an id spdk_tgt does not know: that copy ended with the target
        while let Ok(CopyState::Running(_)) = copy_state(client, op).await {
            tokio::time::sleep(WITHIN_POLL).await;
        }
    }
    // v26.05 copies into a bdev of another block size without a word, at
    // the wrong offsets (seen on a real target: a 4 KiB-block snapshot
    // into a 512 B-block lvol read back different from its first byte):
    // only equal block sizes are copied here, the rest through the mover
    let (from, to) = (inv.bdev_named(snap), inv.bdev_named(dst));
    if from.map(|b| b.block_size) != to.map(|b| b.block_size) || from.is_none() {
        tracing::debug!(snapshot = %snap, %dst, from = ?from.map(|b| b.block_size), to = ?to.map(|b| b.block_size),
            "block sizes differ (or a bdev is not listed): the data goes through the mover");
        return Ok(None);
    }
    let mut chain = inv.chain(snap);
    chain.push(snap.to_owned());
    // a chain over an external snapshot (`bdev_lvol_set_parent_bdev`) reads
    // data no shallow copy of it holds
    if inv.lvols.get(&chain[0]).is_none_or(|l| l.is_esnap_clone) {
        return Ok(None);
    }
    let own = |alias: &str| inv.lvols.get(alias).map_or(0, |l| l.num_allocated_clusters);
    let total: u64 = chain.iter().map(|a| own(a)).sum::<u64>().max(1);
    let cluster = inv
        .lvols
        .get(snap)
        .and_then(|l| inv.lvstores.iter().find(|s| s.uuid == l.lvs.uuid))
        .map_or(0, |s| s.cluster_size);
    let mut done = 0u64;
    for (i, s) in chain.iter().enumerate() {
        let op = match start_copy(client, s, dst).await {
            Ok(op) => op,
            Err(e) if i == 0 => {
                tracing::debug!(snapshot = %s, %dst, error = %crate::util::error_chain(&e),
                    "a shallow copy is refused: the data goes through the mover");
                return Ok(None);
            }
            Err(e) => return Err(rpc(format!("starting the shallow copy of {s}"))(e)),
        };
        (w.started)(op);
        loop {
            let state = copy_state(client, op)
                .await
                .map_err(rpc(format!("checking the shallow copy of {s}")))?;
            let now = match state {
                CopyState::Done => break,
                CopyState::Running(n) => n,
                CopyState::Failed(message) => {
                    return Err(MoverError::ShallowCopy {
                        bdev: dst.to_owned(),
                        snapshot: s.clone(),
                        message,
                    });
                }
            };
            copied.store(size.saturating_mul(done + now) / total, Ordering::Relaxed);
            tokio::time::sleep(WITHIN_POLL).await;
        }
        done += own(s);
        copied.store(size.saturating_mul(done) / total, Ordering::Relaxed);
    }
    let bytes = done.saturating_mul(cluster);
    Ok(Some(Filled {
        written: bytes,
        read: bytes,
    }))
}
