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

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::{FuturesOrdered, FuturesUnordered};

use super::{CHUNK, Filled, MoverError, Purpose, Session, has_data};
use crate::spdk::SpdkClient;

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
