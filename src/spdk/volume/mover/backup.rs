//! A snapshot's blocks as a backup takes them, read through the mover: no
//! staging file, nothing written on the node.
//!
//! SPDK v26.05 says how many clusters an lvol holds, not which (no fragmap
//! RPC); the allocation map ([`super::map`]) finds which: each lvol of the
//! chain shallow-copied into a target talon serves, which records where it
//! was written. Only the blocks a mapped cluster meets are read:
//!
//! ```text
//!   map:             full: the snapshot's whole chain; incremental: the lvols
//!                    after the base (a cluster none of them holds reads as the
//!                    base does); none (an external snapshot at the chain's
//!                    bottom, a base outside it, a chain so full that the map's
//!                    copy would move more than it saves, the map failed): every block
//!   full (no base):  Session::open(snapshot, Backup)
//!                    each mapped block, BLOCKS_AHEAD in flight: a non-zero byte? taken
//!   incremental:     also Session::open(base snapshot, Backup): the snapshot the
//!                    store's last backup holds, on the same replica
//!                    each mapped block read from both: the same bytes? skipped (the
//!                    base backup's block stays in the map); else taken, or, when it
//!                    now reads as zeros, dropped from the map (a hole, as restores
//!                    write it)
//!   close both (a drop, an error or a cancel: both exports removed all the same)
//! ```
//!
//! A backup thus reads what the chain holds (a full one) or what changed
//! since the base (an incremental one), plus the map's copy of the same
//! clusters over loopback, instead of the whole volume; what it uploads is
//! exactly the blocks whose bytes changed, so a block rewritten with the
//! same bytes is not uploaded again, and no base block is fetched from the
//! store to complete a partly written one.

use futures::StreamExt as _;

use std::collections::BTreeSet;

use super::super::Inventory;
use super::super::plan::{point_in_time_set, superblock_room};
use super::map::Ranges;
use super::{DEPTH, MoverError, Purpose, Session, has_data};
use crate::backupstore::BackupError;
use crate::backupstore::ops::{Block, Blocks};
use crate::spdk::SpdkClient;
use crate::spdk::naming;

/// Blocks read (from each snapshot) ahead of the one being looked at.
pub const BLOCKS_AHEAD: usize = 4;

/// Where a backup reads: the snapshot's bdev, the volume's data at
/// `data_offset` in it for `size` bytes, and the base snapshot's bdev
/// (same layout) when the backup is incremental.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupRead {
    /// The snapshot's bdev (`lvs/name`).
    pub snapshot: String,
    /// The snapshot the base backup holds (`lvs/name`), for an incremental backup.
    pub base: Option<String>,
    /// Where the volume's data starts in the bdevs (a raid superblock's room).
    pub data_offset: u64,
    /// The volume's size in bytes (the snapshot's data past it is not read).
    pub size: u64,
}

impl BackupRead {
    /// Where a backup of talon volume `vol`'s snapshot `snap` (`size` bytes)
    /// reads on this node: a replica of the snapshot's point-in-time set
    /// (`recorded`, from the ledger), preferring one that also holds
    /// `base_snap` (the snapshot the store's last backup holds: the backup
    /// is then incremental over it). `superblock`: whether the volume's
    /// replicas hold a raid superblock before its data. `None`: no replica
    /// here holds the snapshot.
    pub fn of_volume(
        inv: &Inventory,
        vol: &str,
        snap: &str,
        recorded: Option<&BTreeSet<usize>>,
        base_snap: Option<&str>,
        superblock: bool,
        size: u64,
    ) -> Option<BackupRead> {
        let lvol = |k: usize, s: &str| {
            inv.lvols.values().find(|l| {
                l.name == naming::snapshot_lvol(vol, k, s) && l.lvs.name.starts_with(naming::LVS_PREFIX)
            })
        };
        let mut best: Option<BackupRead> = None;
        for k in point_in_time_set(inv, vol, snap, recorded) {
            let Some(l) = lvol(k, snap) else {
                continue;
            };
            let data_offset = if superblock {
                inv.lvstores
                    .iter()
                    .find(|s| s.name == l.lvs.name)
                    .map_or(0, |s| superblock_room(s.cluster_size))
            } else {
                0
            };
            // the base on the same lvstore: the same layout
            let base = base_snap
                .and_then(|b| lvol(k, b))
                .filter(|b| b.lvs.name == l.lvs.name)
                .map(|b| format!("{}/{}", b.lvs.name, b.name));
            let read = BackupRead {
                snapshot: format!("{}/{}", l.lvs.name, l.name),
                base,
                data_offset,
                size,
            };
            if best
                .as_ref()
                .is_none_or(|b| b.base.is_none() && read.base.is_some())
            {
                best = Some(read);
            }
        }
        best
    }
}

impl BackupRead {
    /// Whether the snapshot reads exactly as the base does, known without
    /// reading: the base is in the snapshot's chain and no lvol after it
    /// (the snapshot included) holds a cluster of its own. An incremental
    /// backup of an idle volume then takes no block.
    pub fn same_as_base(&self, inv: &Inventory) -> bool {
        let Some(base) = &self.base else {
            return false;
        };
        let chain = self.chain(inv);
        let Some(at) = chain.iter().position(|l| l == base) else {
            return false;
        };
        chain[at + 1..]
            .iter()
            .all(|l| inv.lvols.get(l).is_some_and(|l| l.num_allocated_clusters == 0))
    }
}

impl BackupRead {
    /// The snapshot's chain, oldest first, the snapshot last.
    fn chain(&self, inv: &Inventory) -> Vec<String> {
        let mut chain = inv.chain(&self.snapshot);
        chain.push(self.snapshot.clone());
        chain
    }

    /// The lvols whose own clusters are all a backup must look at: the
    /// snapshot's whole chain for a full backup, the lvols after the base
    /// for an incremental one (a cluster none of them holds reads as the
    /// base does). `None`: every block is read, when the chain does not say
    /// (it ends in an external snapshot or a parent not listed, the base is
    /// outside it) or a map would move more than it saves ([`map_pays`]).
    pub fn map_lvols(&self, inv: &Inventory) -> Option<Vec<String>> {
        let mut chain = self.chain(inv);
        if !super::map::names_all_data(inv, &chain) {
            return None;
        }
        let lvols = match &self.base {
            None => chain,
            Some(base) => {
                let at = chain.iter().position(|l| l == base)?;
                chain.split_off(at + 1)
            }
        };
        let held = super::map::held(inv, &lvols);
        map_pays(held, self.size, self.base.is_some()).then_some(lvols)
    }
}

/// Whether mapping pays: a map moves the `held` bytes of the mapped lvols
/// once (the shallow copy) and the backup then reads them (twice for an
/// incremental one: the snapshot and the base), against reading the whole
/// `size` (twice for an incremental one). A dense volume's full backup is
/// read without a map, which would double what crosses loopback.
pub fn map_pays(held: u64, size: u64, incremental: bool) -> bool {
    let reads = if incremental { 2 } else { 1 };
    held.saturating_mul(1 + reads) < size.saturating_mul(reads)
}

/// The open exports of a [`BackupRead`], and where its chain holds data.
#[derive(Debug)]
pub struct BackupReader {
    read: BackupRead,
    snapshot: Session,
    base: Option<Session>,
    /// The byte ranges of the bdevs a block must meet to be looked at
    /// (`None`: every block is read).
    map: Option<Ranges>,
}

impl BackupReader {
    /// Exports the snapshot (and the base) to talon, and maps where its
    /// chain holds data ([`super::map`]; a map that cannot be made is
    /// logged and every block read). Nothing is left when it fails; a bdev
    /// too small for `data_offset + size` is refused.
    pub async fn open(
        client: &SpdkClient,
        inv: &Inventory,
        read: BackupRead,
    ) -> Result<BackupReader, MoverError> {
        let snapshot = Session::open(client, &read.snapshot, Purpose::Backup, DEPTH).await?;
        let base = match &read.base {
            Some(b) => match Session::open(client, b, Purpose::Backup, DEPTH).await {
                Ok(s) => Some(s),
                Err(e) => {
                    let _ = snapshot.close().await;
                    return Err(e);
                }
            },
            None => None,
        };
        let mut r = BackupReader {
            read,
            snapshot,
            base,
            map: None,
        };
        let need = r.read.data_offset + r.read.size;
        if r.snapshot.size() < need {
            let reason = format!(
                "it holds {} bytes, a backup of the volume reads {need}",
                r.snapshot.size()
            );
            let e = r.snapshot.invalid(reason);
            let _ = r.close().await;
            return Err(e);
        }
        if let Some(lvols) = r.read.map_lvols(inv) {
            let (size, block) = (r.snapshot.size(), r.snapshot.block_size());
            match super::map::allocated(client, &lvols, size, block).await {
                Ok(m) => r.map = Some(m),
                Err(e) => tracing::warn!(snapshot = %r.read.snapshot, error = %crate::util::error_chain(&e),
                    "no allocation map of the snapshot's chain: the backup reads every block"),
            }
        }
        Ok(r)
    }

    /// The bytes the backup looks at: what the map names (`None`: no map,
    /// the whole volume).
    pub fn mapped(&self) -> Option<u64> {
        self.map.as_ref().map(Ranges::bytes)
    }

    /// The blocks of `block` bytes the backup takes, offsets ascending (see
    /// the module's notes), `BLOCKS_AHEAD` blocks read at once; a read that
    /// fails names the snapshot's bdev.
    pub fn blocks(&self, block: u64) -> Blocks<'_> {
        let (size, at) = (self.read.size, self.read.data_offset);
        // a block no mapped cluster meets reads as zeros (full) or as the
        // base (incremental): not taken either way, so not read
        let looked_at = move |offset: &u64| {
            self.map
                .as_ref()
                .is_none_or(|m| m.touches(at + offset, at + (offset + block).min(size)))
        };
        futures::stream::iter((0..size).step_by(block as usize).filter(looked_at))
            .map(move |offset| self.block(offset, block))
            .buffered(BLOCKS_AHEAD)
            .filter_map(|r| async move { r.transpose() })
            .map(|r| {
                r.map_err(|e| BackupError::ReadSnapshot {
                    snapshot: self.read.snapshot.clone(),
                    reason: crate::util::error_chain(&e),
                })
            })
            .boxed()
    }

    /// Block `offset`: what the backup takes of it, if anything.
    async fn block(&self, offset: u64, block: u64) -> Result<Option<Block>, MoverError> {
        let len = block.min(self.read.size - offset) as usize;
        let at = self.read.data_offset + offset;
        let (mut now, then) = match &self.base {
            None => (self.snapshot.read(at, len).await?, None),
            Some(b) => {
                // the base may be smaller (the volume grew since): zeros past its end
                let blen = b.size().saturating_sub(at).min(len as u64) as usize;
                let (now, mut then) = futures::try_join!(self.snapshot.read(at, len), async {
                    if blen == 0 {
                        Ok(Vec::new())
                    } else {
                        b.read(at, blen).await
                    }
                })?;
                then.resize(len, 0);
                (now, Some(then))
            }
        };
        let data = has_data(&now);
        let taken = match then {
            Some(then) if then == now => return Ok(None),
            // changed: its bytes, or gone to zeros
            Some(_) => data,
            None if !data => return Ok(None),
            None => true,
        };
        now.resize(block as usize, 0);
        Ok(Some(Block {
            offset,
            data: taken.then_some(now),
        }))
    }

    /// Closes both exports.
    pub async fn close(self) -> Result<(), MoverError> {
        let base = match self.base {
            Some(b) => b.close().await,
            None => Ok(()),
        };
        self.snapshot.close().await.and(base)
    }
}

#[cfg(test)]
mod tests {
    //! Which incremental backups need no read, against hand-built inventories.

    use super::*;
    use crate::spdk::inventory::testing::{TestLvol, add_lvol};

    /// Adds snapshot `lvs/name` holding `clusters`, a clone of `parent` when given.
    fn lvol(i: &mut Inventory, name: &str, clusters: u64, parent: Option<&str>) {
        let l = TestLvol {
            lvs: "lvs",
            name,
            bytes: 4 << 20,
            clusters,
            snapshot: true,
            parent,
        };
        add_lvol(i, l);
    }

    fn read(snapshot: &str, base: Option<&str>) -> BackupRead {
        BackupRead {
            snapshot: format!("lvs/{snapshot}"),
            base: base.map(|b| format!("lvs/{b}")),
            data_offset: 0,
            size: 4 << 20,
        }
    }

    #[test]
    fn a_map_is_made_when_it_moves_less_than_reading_the_whole_volume() {
        const G: u64 = 1 << 30;
        // full: map + read of the data against one read of the volume
        assert!(map_pays(10 * G, 1024 * G, false));
        assert!(map_pays(400 * G, 1024 * G, false));
        assert!(
            !map_pays(512 * G, 1024 * G, false),
            "half full: the same bytes either way"
        );
        assert!(!map_pays(1024 * G, 1024 * G, false), "dense: no map");
        // incremental: map + two reads of the change against two reads of the volume
        assert!(map_pays(64 << 20, 4 * G, true));
        assert!(map_pays(600 * G, 1024 * G, true));
        assert!(!map_pays(700 * G, 1024 * G, true));
    }

    #[test]
    fn a_snapshot_with_nothing_of_its_own_since_the_base_reads_as_the_base() {
        let mut i = Inventory::default();
        lvol(&mut i, "s1", 3, None);
        lvol(&mut i, "s2", 0, Some("s1"));
        lvol(&mut i, "s3", 0, Some("s2"));
        lvol(&mut i, "s4", 1, Some("s3"));
        lvol(&mut i, "other", 0, None);
        assert!(read("s2", Some("s1")).same_as_base(&i));
        assert!(
            read("s3", Some("s1")).same_as_base(&i),
            "two empty snapshots after the base"
        );
        assert!(!read("s4", Some("s1")).same_as_base(&i), "s4 holds a cluster");
        assert!(!read("s4", Some("s3")).same_as_base(&i));
        assert!(!read("s2", None).same_as_base(&i), "a full backup reads");
        assert!(
            !read("s2", Some("other")).same_as_base(&i),
            "a base outside the chain"
        );
        assert!(
            !read("s1", Some("s2")).same_as_base(&i),
            "a base newer than the snapshot"
        );
    }
}
