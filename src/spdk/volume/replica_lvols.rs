//! A Longhorn-named replica's lvols as a thin rebuild sees them (its head
//! `<lvs>/<r>` and snapshots `<lvs>/<r>-snap-<s>`), and the write a rebuild
//! makes of them before it copies: the head made empty again right above
//! the snapshots it shares with the source
//! ([`VolumeOps::reset_head`](super::VolumeOps::reset_head)). The engine's
//! controller and the replica node's rebuild calls both use them; the copy
//! itself is [`super::thin::start_copy`].

use std::collections::BTreeMap;

use super::Inventory;
use crate::resources::longhorn::snapshot_lvol;
use crate::spdk::ClientError;
use crate::spdk::volume::lvol::{HeadFrom, remake_head};

const MIB: u64 = 1 << 20;

/// A replica's lvols as a rebuild sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaLvols {
    /// Whether the head exists.
    pub head: bool,
    /// The head's parent snapshot (its snapshot name).
    pub head_parent: Option<String>,
    /// Bytes the head holds of its own.
    pub head_bytes: u64,
    /// Snapshot name -> (its parent snapshot, bytes of its own).
    pub snapshots: BTreeMap<String, (Option<String>, u64)>,
    /// The lvol below the replica's own chain that is not one of its
    /// snapshots (its name): a linked clone's entrypoint, whose data the
    /// replica reads where it holds none. `None`: the chain starts empty.
    /// A thin rebuild copies the replica's own snapshots only, so a replica
    /// with a base is never its source.
    pub base: Option<String>,
}

impl ReplicaLvols {
    /// Replica `replica`'s lvols in lvstore `lvs`, from a listing.
    pub fn from_inventory(inv: &Inventory, lvs: &str, replica: &str) -> Self {
        let cluster = inv
            .lvstores
            .iter()
            .find(|s| s.name == lvs)
            .map_or(0, |s| s.cluster_size);
        let prefix = snapshot_lvol(replica, "");
        let snap_of = |alias: &str| {
            alias
                .strip_prefix(lvs)
                .and_then(|a| a.strip_prefix('/'))
                .and_then(|n| n.strip_prefix(&prefix))
                .map(str::to_owned)
        };
        let mut out = Self::default();
        // below each own lvol that has no own parent: the lvol it starts on
        let mut bases: BTreeMap<Option<String>, String> = BTreeMap::new();
        for (alias, l) in inv.lvols.range(format!("{lvs}/")..) {
            if !alias.starts_with(&format!("{lvs}/")) {
                break;
            }
            let bytes = l.num_allocated_clusters.saturating_mul(cluster);
            let raw = inv.parent_of(alias);
            let parent = raw.as_deref().and_then(snap_of);
            let mine = l.name == replica || snap_of(alias).is_some();
            if mine
                && parent.is_none()
                && let Some(p) = raw
            {
                bases.insert(
                    snap_of(alias),
                    p.strip_prefix(&format!("{lvs}/")).unwrap_or(&p).to_owned(),
                );
            }
            if l.name == replica {
                out.head = true;
                out.head_parent = parent;
                out.head_bytes = bytes;
            } else if let Some(s) = snap_of(alias) {
                out.snapshots.insert(s, (parent, bytes));
            }
        }
        // the chain's: below its oldest snapshot, or the head's own
        let root = out.chain().first().cloned();
        out.base = bases.remove(&root);
        out
    }

    /// The head's snapshots, oldest first.
    pub fn chain(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = self.head_parent.clone();
        while let Some(p) = at {
            if out.contains(&p) || out.len() > 4096 {
                break;
            }
            at = self.snapshots.get(&p).and_then(|(pp, _)| pp.clone());
            out.push(p);
        }
        out.reverse();
        out
    }

    /// How many snapshots of `chain` (oldest first) this replica holds, each
    /// over the one before, the first over `base` (an entrypoint's name, or
    /// nothing below): the copies a rebuild keeps. Over another base, none:
    /// the same names hold other data.
    pub fn shared(&self, base: Option<&str>, chain: &[String]) -> usize {
        if self.base.as_deref() != base {
            return 0;
        }
        let mut prev: Option<&String> = None;
        for (i, s) in chain.iter().enumerate() {
            match self.snapshots.get(s) {
                Some((p, _)) if p.as_ref() == prev => prev = Some(s),
                _ => return i,
            }
        }
        chain.len()
    }

    /// Whether the head is empty right above the first `j` snapshots of
    /// `chain` (over `base`, see [`Self::shared`]) and holds no other copy of
    /// them: ready for the next copy.
    pub fn ready_over(&self, base: Option<&str>, chain: &[String], j: usize) -> bool {
        self.head
            && self.head_bytes == 0
            && self.base.as_deref() == base
            && self.head_parent.as_ref() == j.checked_sub(1).map(|i| &chain[i])
            && chain[j..].iter().all(|s| !self.snapshots.contains_key(s))
    }
}

/// A [`VolumeOps::reset_head`](super::VolumeOps::reset_head) that failed:
/// the step (naming the lvol) and SPDK's answer.
#[derive(Debug, thiserror::Error)]
#[error("{step}")]
pub struct ResetHeadError {
    /// What was being done, naming the lvol.
    pub step: String,
    /// SPDK's answer.
    #[source]
    pub source: ClientError,
}

/// Why a replica's snapshot was not deleted.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotDeleteError {
    /// SPDK refuses: more than one lvol reads it (it can go only by a merge
    /// into its one clone).
    #[error("SPDK refuses to delete {lvol} while more than one lvol depends on it")]
    Shared {
        /// The snapshot's lvol.
        lvol: String,
        /// SPDK's answer.
        #[source]
        source: ClientError,
    },
    /// SPDK failed the delete.
    #[error("deleting {lvol}")]
    Spdk {
        /// The snapshot's lvol.
        lvol: String,
        /// SPDK's answer.
        #[source]
        source: ClientError,
    },
}

impl super::VolumeOps {
    /// Snapshots replica `replica`'s head (`<lvs>/<replica>`) as its snapshot
    /// lvol `lvol`; one that exists already is kept (asked again). Answers
    /// the snapshot's alias.
    pub async fn snapshot_replica_head(
        &self,
        lvs: &str,
        replica: &str,
        lvol: &str,
    ) -> Result<String, ClientError> {
        let head = format!("{lvs}/{replica}");
        match crate::spdk::volume::lvol::snapshot(&self.client, &head, lvol).await {
            Ok(()) => Ok(format!("{lvs}/{lvol}")),
            Err(e) if e.is(crate::spdk::ErrorKind::AlreadyExists) => Ok(format!("{lvs}/{lvol}")),
            Err(e) => Err(e),
        }
    }
}

impl super::VolumeOps {
    /// Deletes snapshot `snap` of replica `replica` (`<lvs>/<replica>-snap-<snap>`;
    /// SPDK merges it into its one clone); one that is not there is no
    /// error. Answers its alias.
    pub async fn delete_replica_snapshot(
        &self,
        lvs: &str,
        replica: &str,
        snap: &str,
    ) -> Result<String, SnapshotDeleteError> {
        let lvol = format!("{lvs}/{}", snapshot_lvol(replica, snap));
        match crate::spdk::volume::lvol::delete_lvol(&self.client, &lvol).await {
            Ok(()) => Ok(lvol),
            Err(source) if source.is(crate::spdk::ErrorKind::Busy) => {
                Err(SnapshotDeleteError::Shared { lvol, source })
            }
            Err(source) => Err(SnapshotDeleteError::Spdk { lvol, source }),
        }
    }
}

impl super::VolumeOps {
    /// Makes replica `replica`'s head (in lvstore `lvs`, `size` bytes) empty
    /// right above the snapshots of `chain` it shares over `base` (an
    /// entrypoint of the same lvstore, there already; see
    /// [`ReplicaLvols::shared`]): the head and every snapshot it does not
    /// share are deleted (the newest first), the head made again as a clone
    /// of the last shared one (or of `base`, or empty). Returns how many it
    /// shares.
    pub async fn reset_head(
        &self,
        lvs: &str,
        replica: &str,
        size: u64,
        have: &ReplicaLvols,
        base: Option<&str>,
        chain: &[String],
    ) -> Result<usize, ResetHeadError> {
        let client = &self.client;
        let j = have.shared(base, chain);
        let shared = &chain[..j];
        let alias = |name: &str| format!("{lvs}/{name}");
        let delete = |a: String| async move {
            crate::spdk::volume::lvol::delete_lvol(client, &a)
                .await
                .map_err(|source| ResetHeadError {
                    step: format!("deleting {a}"),
                    source,
                })
        };
        // the head goes first: a snapshot not shared may be its parent (SPDK
        // would merge it into the head); `remake_head` below finds it gone
        delete(alias(replica)).await?;
        // the snapshots not shared, the newest first (a child before its parent)
        let depth = |s: &String| {
            let mut d = 0;
            let mut at = have.snapshots.get(s).and_then(|(p, _)| p.clone());
            while let Some(p) = at {
                d += 1;
                if d > 4096 {
                    break;
                }
                at = have.snapshots.get(&p).and_then(|(pp, _)| pp.clone());
            }
            d
        };
        let mut stale: Vec<&String> = have.snapshots.keys().filter(|s| !shared.contains(s)).collect();
        stale.sort_by_key(|s| std::cmp::Reverse(depth(s)));
        for s in stale {
            delete(alias(&snapshot_lvol(replica, s))).await?;
        }
        let parent = match shared.last() {
            Some(p) => Some(alias(&snapshot_lvol(replica, p))),
            None => base.map(alias),
        };
        let from = match &parent {
            Some(p) => HeadFrom::Snapshot(p),
            None => HeadFrom::Fresh(size.div_ceil(MIB)),
        };
        remake_head(client, lvs, replica, from)
            .await
            .map_err(|f| ResetHeadError {
                step: format!("{} to rebuild it", f.doing),
                source: f.source,
            })?;
        Ok(j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lvols(head_parent: Option<&str>, head_bytes: u64, snaps: &[(&str, Option<&str>)]) -> ReplicaLvols {
        ReplicaLvols {
            head: true,
            head_parent: head_parent.map(str::to_owned),
            head_bytes,
            snapshots: snaps
                .iter()
                .map(|(s, p)| ((*s).to_owned(), (p.map(str::to_owned), 0)))
                .collect(),
            base: None,
        }
    }

    #[test]
    fn a_dest_shares_the_prefix_of_the_chain_it_holds_in_the_same_order() {
        let chain: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let d = lvols(Some("b"), 4096, &[("a", None), ("b", Some("a"))]);
        assert_eq!(d.shared(None, &chain), 2);
        assert_eq!(d.chain(), vec!["a", "b"]);
        assert!(!d.ready_over(None, &chain, 2), "its head holds data");
        let d = lvols(Some("b"), 0, &[("a", None), ("b", Some("a"))]);
        assert!(d.ready_over(None, &chain, 2));
        // b over another parent: only a is shared; a stale copy of c is in the way
        let d = lvols(Some("a"), 0, &[("a", None), ("b", Some("x")), ("c", Some("a"))]);
        assert_eq!(d.shared(None, &chain), 1);
        assert!(!d.ready_over(None, &chain, 1));
        assert_eq!(lvols(None, 0, &[]).shared(None, &chain), 0);
        assert!(lvols(None, 0, &[]).ready_over(None, &chain, 0));
    }

    #[test]
    fn a_linked_clones_copies_are_shared_only_over_the_same_entrypoint() {
        let chain: Vec<String> = ["a", "b"].map(String::from).to_vec();
        let ep = "src-r-1-clone-ep-x";
        let on =
            |base: Option<&str>, head_parent: Option<&str>, snaps: &[(&str, Option<&str>)]| ReplicaLvols {
                base: base.map(str::to_owned),
                ..lvols(head_parent, 0, snaps)
            };
        let d = on(Some(ep), Some("b"), &[("a", None), ("b", Some("a"))]);
        assert_eq!(d.shared(Some(ep), &chain), 2);
        assert!(d.ready_over(Some(ep), &chain, 2));
        // the same names over nothing (a copy made without the entrypoint),
        // or over another entrypoint: other data, nothing shared
        let d = on(None, Some("b"), &[("a", None), ("b", Some("a"))]);
        assert_eq!(d.shared(Some(ep), &chain), 0);
        assert!(!d.ready_over(Some(ep), &chain, 0));
        let d = on(
            Some("other-clone-ep-x"),
            Some("b"),
            &[("a", None), ("b", Some("a"))],
        );
        assert_eq!(d.shared(Some(ep), &chain), 0);
        // a head right on the entrypoint is ready for the first copy; an
        // empty head over nothing is not, nor one on it when the source has none
        assert!(on(Some(ep), None, &[]).ready_over(Some(ep), &chain, 0));
        assert!(!on(None, None, &[]).ready_over(Some(ep), &chain, 0));
        assert!(!on(Some(ep), None, &[]).ready_over(None, &chain, 0));
    }
}
