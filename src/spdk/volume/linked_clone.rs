//! A linked clone: a new replica whose data is another replica's snapshot
//! without a copy (Longhorn's "fast clone", `CloneMode` linked-clone). The
//! new replica's head, empty, gets the snapshot's entrypoint as its parent:
//!
//! ```text
//!   source replica s                       clone replica c (same lvstore)
//!   s-snap-X ──> ... ──> s (head)
//!      └──> s-clone-ep-X (an empty snapshot: the entrypoint, shared by every clone of X)
//!              └──> c (head; was empty, reads X where it holds nothing of its own)
//!
//!   entrypoint made: bdev_lvol_clone X as s-clone-ep-X-tmp-head, bdev_lvol_snapshot it as
//!   s-clone-ep-X, bdev_lvol_delete the tmp head; then bdev_lvol_set_parent c s-clone-ep-X
//! ```
//!
//! Each step is found done or done, so a call cut off (a crash, a failure)
//! is asked again. Only an empty head with no parent is linked: a head that
//! holds data (a replica written, or one linked to something else) is
//! refused, never overlaid. The entrypoint, not X itself, is the clone's
//! parent as in Longhorn: the clone's chain starts on a name that says it
//! is a clone's (a rebuild or a listing stops there, see
//! [`ReplicaLvols::base`](super::ReplicaLvols::base)), and X keeps one
//! clone more however many replicas link to it. When the last clone of an
//! entrypoint is gone, the entrypoint goes too ([`VolumeOps::drop_entrypoint_if_unused`]).

use super::rebuild::{lvs_of, sibling};
use super::{Inventory, VolumeOps, lvol};
use crate::spdk::ClientError;
use crate::spdk::naming::longhorn::{clone_entrypoint_tmp_head, is_clone_entrypoint};

/// SPDK's longest lvol name (`SPDK_LVOL_NAME_MAX` less its NUL).
const LVOL_NAME_MAX: usize = 63;

/// One linked clone to make.
#[derive(Debug, Clone)]
pub struct Link<'a> {
    /// The source snapshot's alias (`lvs/<replica>-snap-<s>`).
    pub snapshot: &'a str,
    /// The entrypoint's name in the same lvstore
    /// ([`clone_entrypoint`](crate::spdk::naming::longhorn::clone_entrypoint)).
    pub entrypoint: &'a str,
    /// The clone replica's head (its alias): empty, no parent.
    pub head: &'a str,
}

/// What [`VolumeOps::link_clone`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linked {
    /// The head was linked now.
    Now,
    /// The head was linked before (a call asked again).
    Already,
}

/// Why a linked clone was not made; each names the lvols.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// An lvol the link needs is not there.
    #[error("linked clone of {snapshot} into {head}: {missing} does not exist")]
    Missing {
        /// The source snapshot.
        snapshot: String,
        /// The clone's head.
        head: String,
        /// The one missing.
        missing: String,
    },
    /// The source is not a snapshot.
    #[error("linked clone into {head}: {snapshot} is not a snapshot")]
    NotSnapshot {
        /// The lvol given as the source.
        snapshot: String,
        /// The clone's head.
        head: String,
    },
    /// The head is in another lvstore than the snapshot: a linked clone
    /// shares the source's blobstore.
    #[error("linked clone of {snapshot} into {head}: the two are in different lvstores")]
    OtherLvstore {
        /// The source snapshot.
        snapshot: String,
        /// The clone's head.
        head: String,
    },
    /// The head holds data: linking it would put a snapshot under it.
    #[error(
        "linked clone of {snapshot} into {head}: the head holds {clusters} clusters of its own; only an empty replica is linked"
    )]
    HeadHoldsData {
        /// The source snapshot.
        snapshot: String,
        /// The clone's head.
        head: String,
        /// Its allocated clusters.
        clusters: u64,
    },
    /// The head has another parent already.
    #[error("linked clone of {snapshot} into {head}: the head is a clone of {parent} already")]
    HeadHasParent {
        /// The source snapshot.
        snapshot: String,
        /// The clone's head.
        head: String,
        /// Its parent.
        parent: String,
    },
    /// The entrypoint exists over another lvol than the snapshot (an older
    /// snapshot of the name) and other clones read it.
    #[error(
        "linked clone of {snapshot}: entrypoint {entrypoint} is a clone of {parent}, not of the snapshot, and clones read it"
    )]
    StaleEntrypoint {
        /// The source snapshot.
        snapshot: String,
        /// The entrypoint.
        entrypoint: String,
        /// What it is a clone of (none: nothing).
        parent: String,
    },
    /// The entrypoint's name is longer than SPDK takes.
    #[error(
        "linked clone of {snapshot}: entrypoint name {entrypoint} is longer than SPDK's {LVOL_NAME_MAX} characters"
    )]
    NameTooLong {
        /// The source snapshot.
        snapshot: String,
        /// The entrypoint's name.
        entrypoint: String,
    },
    /// A call to spdk_tgt failed.
    #[error("linked clone of {snapshot} into {head}: {doing}")]
    Spdk {
        /// The source snapshot.
        snapshot: String,
        /// The clone's head.
        head: String,
        /// What was being done, naming the lvol.
        doing: String,
        /// SPDK's answer.
        #[source]
        source: ClientError,
    },
}

impl Link<'_> {
    fn spdk(&self, doing: String) -> impl FnOnce(ClientError) -> LinkError + '_ {
        move |source| LinkError::Spdk {
            snapshot: self.snapshot.to_owned(),
            head: self.head.to_owned(),
            doing,
            source,
        }
    }

    fn missing(&self, missing: &str) -> LinkError {
        LinkError::Missing {
            snapshot: self.snapshot.to_owned(),
            head: self.head.to_owned(),
            missing: missing.to_owned(),
        }
    }
}

impl VolumeOps {
    /// Makes `l.head` a linked clone of `l.snapshot` (see the module): the
    /// entrypoint found or made, then the head's parent. `inv` is a listing
    /// taken before; the head is checked in it.
    pub async fn link_clone(&self, inv: &Inventory, l: &Link<'_>) -> Result<Linked, LinkError> {
        let ep = Self::check_source(inv, l).map_err(|e| *e)?;
        let head = inv.lvols.get(l.head).ok_or_else(|| l.missing(l.head))?;
        match inv.parent_of(l.head) {
            Some(p) if p == ep => return Ok(Linked::Already),
            Some(parent) => {
                return Err(LinkError::HeadHasParent {
                    snapshot: l.snapshot.to_owned(),
                    head: l.head.to_owned(),
                    parent,
                });
            }
            None if head.num_allocated_clusters > 0 => {
                return Err(LinkError::HeadHoldsData {
                    snapshot: l.snapshot.to_owned(),
                    head: l.head.to_owned(),
                    clusters: head.num_allocated_clusters,
                });
            }
            None => {}
        }
        self.ensure_entrypoint(inv, l, &ep).await?;
        lvol::set_parent(&self.client, l.head, &ep)
            .await
            .map_err(l.spdk(format!("making {ep} the parent of {}", l.head)))?;
        Ok(Linked::Now)
    }

    /// The entrypoint of `l.snapshot` found or made, for a head made later
    /// as its clone (a linked clone's replica rebuilt: its chain starts on
    /// the entrypoint beside it; [`VolumeOps::reset_head`]). `l.head` is
    /// not looked at but must be in the snapshot's lvstore. Returns the
    /// entrypoint's alias.
    pub async fn clone_base(&self, inv: &Inventory, l: &Link<'_>) -> Result<String, LinkError> {
        let ep = Self::check_source(inv, l).map_err(|e| *e)?;
        self.ensure_entrypoint(inv, l, &ep).await?;
        Ok(ep)
    }

    /// What every link checks first: names SPDK takes, one lvstore, the
    /// source a snapshot. Returns the entrypoint's alias.
    fn check_source(inv: &Inventory, l: &Link<'_>) -> Result<String, Box<LinkError>> {
        if l.entrypoint.len() > LVOL_NAME_MAX || clone_entrypoint_tmp_head(l.entrypoint).len() > LVOL_NAME_MAX
        {
            return Err(Box::new(LinkError::NameTooLong {
                snapshot: l.snapshot.to_owned(),
                entrypoint: l.entrypoint.to_owned(),
            }));
        }
        if lvs_of(l.head) != lvs_of(l.snapshot) {
            return Err(Box::new(LinkError::OtherLvstore {
                snapshot: l.snapshot.to_owned(),
                head: l.head.to_owned(),
            }));
        }
        let snap = inv
            .lvols
            .get(l.snapshot)
            .ok_or_else(|| Box::new(l.missing(l.snapshot)))?;
        if !snap.is_snapshot {
            return Err(Box::new(LinkError::NotSnapshot {
                snapshot: l.snapshot.to_owned(),
                head: l.head.to_owned(),
            }));
        }
        Ok(sibling(l.snapshot, l.entrypoint))
    }

    /// The entrypoint `ep` of `l.snapshot`, found (a clone of the snapshot)
    /// or made; a tmp head an earlier try left is deleted either way.
    async fn ensure_entrypoint(&self, inv: &Inventory, l: &Link<'_>, ep: &str) -> Result<(), LinkError> {
        let tmp = sibling(ep, &clone_entrypoint_tmp_head(l.entrypoint));
        lvol::delete_lvol(&self.client, &tmp)
            .await
            .map_err(l.spdk(format!("deleting {tmp}, left by an earlier try")))?;
        if inv.lvols.contains_key(ep) {
            let parent = inv.parent_of(ep);
            if parent.as_deref() == Some(l.snapshot) {
                return Ok(());
            }
            // over an older snapshot of the name (deleted since, or merged into it)
            if !inv.clones_of(ep).is_empty() {
                return Err(LinkError::StaleEntrypoint {
                    snapshot: l.snapshot.to_owned(),
                    entrypoint: ep.to_owned(),
                    parent: parent.unwrap_or_default(),
                });
            }
            lvol::delete_lvol(&self.client, ep)
                .await
                .map_err(l.spdk(format!("deleting stale entrypoint {ep}")))?;
        }
        lvol::clone(&self.client, l.snapshot, &clone_entrypoint_tmp_head(l.entrypoint))
            .await
            .map_err(l.spdk(format!("cloning {} as {tmp}", l.snapshot)))?;
        let made = lvol::snapshot(&self.client, &tmp, l.entrypoint)
            .await
            .map_err(l.spdk(format!("snapshotting {tmp} as {ep}")));
        // the tmp head goes either way (a failure here leaves it for the next try)
        let gone = lvol::delete_lvol(&self.client, &tmp)
            .await
            .map_err(l.spdk(format!("deleting {tmp}")));
        made?;
        gone
    }

    /// Deletes entrypoint `alias` when nothing is a clone of it any more
    /// (its last linked clone was deleted). Not an entrypoint, or not
    /// listed: nothing done.
    pub async fn drop_entrypoint_if_unused(&self, inv: &Inventory, alias: &str) -> Result<bool, ClientError> {
        let Some(l) = inv.lvols.get(alias) else {
            return Ok(false);
        };
        if !l.is_snapshot || !is_clone_entrypoint(&l.name) || !inv.clones_of(alias).is_empty() {
            return Ok(false);
        }
        lvol::delete_lvol(&self.client, alias).await?;
        Ok(true)
    }
}
