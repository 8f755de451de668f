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
    let src = Session::open(client, from, Purpose::Clone, depth).await?;
    let size = src.size();
    if dst.size() < size {
        return Err(dst.io(format!(
            "it holds {} bytes, less than the {size} bytes of {from}",
            dst.size()
        )));
    }
    if size % u64::from(dst.block_size()) != 0 {
        return Err(dst.io(format!(
            "{from}'s {size} bytes are not whole blocks of {} bytes",
            dst.block_size()
        )));
    }
    let done = run(&src, &dst, size, copied).await?;
    src.close().await?;
    dst.close().await?;
    Ok(done)
}

async fn run(src: &Session, dst: &Session, size: u64, copied: &AtomicU64) -> Result<Filled, MoverError> {
    let mut done = Filled::default();
    let mut reads = FuturesOrdered::new();
    let mut writes = FuturesUnordered::new();
    let mut next = 0u64;
    loop {
        while next < size && reads.len() < READ_AHEAD {
            let (at, len) = (next, (CHUNK as u64).min(size - next) as usize);
            reads.push_back(async move { src.read(at, len).await.map(|d| (at, d)) });
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
            writes.push(dst.write(at, Bytes::from(data)));
        }
        copied.store(at + len, Ordering::Relaxed);
    }
    while let Some(w) = writes.next().await {
        w?;
    }
    Ok(done)
}
