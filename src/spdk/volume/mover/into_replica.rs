//! A backup restored into a replica's own lvol, which may be live (a
//! Longhorn replica's `BackupRestore`, a DR standby following its backup
//! volume): the mover writes a target lvol beside it, never the lvol itself,
//! and the target's data becomes the lvol's own by SPDK's merges, so a cut
//! (talon or spdk_tgt killed) at any point leaves the lvol either as it was
//! or holding the whole restore, never a part of it.
//!
//! ```text
//!   prepare   full:        bdev_lvol_create <lvs>/<target> (thin, empty)
//!             incremental: bdev_lvol_snapshot <lvol> -> <base>; bdev_lvol_clone <base> -> <target>
//!   (the mover writes the backup's blocks into every target: fill_standby)
//!   mark_whole  bdev_lvol_snapshot <target> -> <restored>: the mark that it holds the whole restore
//!   settle    <target> deleted (a snapshot keeps its data);
//!             <restored> there: it becomes <lvol>'s parent (bdev_lvol_set_parent) ─> Restored
//!             else ─> AsBefore;
//!             <base> deleted (merged into its one clone: the lvol, or <restored>),
//!             <restored> deleted (merged into the lvol)
//! ```
//!
//! Names: [`naming::restore_snapshot`] (`<base>`), [`naming::restore_target`],
//! [`naming::restored_snapshot`]. Settling first, before a restore starts,
//! finishes or undoes what a cut run left.

use super::super::super::ClientError;
use super::super::super::naming::longhorn as naming;
use super::super::{Inventory, VolumeOps};

/// SPDK's longest lvol name.
const LVOL_NAME_MAX: usize = 63;

/// A replica's lvol a restore writes.
#[derive(Debug, Clone)]
pub struct IntoReplica {
    /// The replica, as errors name it.
    pub replica: String,
    /// Its lvol, `<lvs>/<replica>`.
    pub alias: String,
    /// The lvol's size.
    pub lvol_bytes: u64,
}

/// Where a replica's lvol stands once [`VolumeOps::settle_restore`] is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The restore's whole data is the lvol's (merged into it).
    Restored,
    /// The lvol holds what it held before the restore.
    AsBefore,
}

/// Why a step on a replica's restore lvols failed.
#[derive(Debug, thiserror::Error)]
pub enum IntoReplicaError {
    /// An SPDK call of a step failed.
    #[error("replica {replica}: {step}")]
    Spdk {
        replica: String,
        step: String,
        #[source]
        source: Box<ClientError>,
    },
    /// A restore lvol's name would be longer than SPDK takes.
    #[error("replica {replica}: lvol name {name} is longer than SPDK's {LVOL_NAME_MAX} characters")]
    NameTooLong { replica: String, name: String },
}

/// Which of a replica's restore snapshots an lvol's parent is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreParent {
    /// The snapshot an incremental restore took of the lvol (its base):
    /// the lvol is that snapshot's one clone (the restore's first step
    /// merges it back).
    Base,
    /// The snapshot of a whole restore, which a cut-off run made the lvol's
    /// parent (the restore's first step merges it in).
    Restored,
}

impl IntoReplica {
    /// Which of its restore snapshots `parent` (an lvol's parent, by alias)
    /// is; `None`: another lvol, or none.
    pub fn restore_parent(&self, parent: Option<&str>) -> Option<RestoreParent> {
        let parent = parent?;
        if parent == self.base_snap() {
            Some(RestoreParent::Base)
        } else if parent == self.restored() {
            Some(RestoreParent::Restored)
        } else {
            None
        }
    }

    fn lvs(&self) -> &str {
        self.alias.split_once('/').map_or("", |(l, _)| l)
    }

    /// `<lvs>/<name>` of one of its restore lvols.
    fn beside(&self, name: String) -> String {
        format!("{}/{name}", self.lvs())
    }

    /// The snapshot of the lvol an incremental restore takes (its base).
    fn base_snap(&self) -> String {
        self.beside(naming::restore_snapshot(&self.replica))
    }

    /// The lvol the mover writes.
    fn target(&self) -> String {
        self.beside(naming::restore_target(&self.replica))
    }

    /// The target's snapshot, once it holds the whole restore.
    pub fn restored(&self) -> String {
        self.beside(naming::restored_snapshot(&self.replica))
    }

    fn failed(&self, step: String) -> impl FnOnce(ClientError) -> IntoReplicaError + '_ {
        move |source| IntoReplicaError::Spdk {
            replica: self.replica.clone(),
            step,
            source: Box::new(source),
        }
    }
}

impl VolumeOps {
    /// The target lvol of `r` made: new and thin (a full restore), or a clone
    /// of a snapshot of the lvol (`incremental`: it reads what the lvol holds).
    /// Returns the target's bdev (UUID) for the mover.
    pub async fn prepare_restore(
        &self,
        r: &IntoReplica,
        incremental: bool,
    ) -> Result<String, IntoReplicaError> {
        let name = naming::restore_target(&r.replica);
        if name.len() > LVOL_NAME_MAX {
            return Err(IntoReplicaError::NameTooLong {
                replica: r.replica.clone(),
                name,
            });
        }
        if !incremental {
            return self
                .create_thin(r.lvs(), &name, r.lvol_bytes.div_ceil(1 << 20))
                .await
                .map_err(r.failed(format!("creating {}", r.target())));
        }
        let base = naming::restore_snapshot(&r.replica);
        self.snapshot_lvol(&r.alias, &base)
            .await
            .map_err(r.failed(format!("snapshotting {} as {base}", r.alias)))?;
        self.clone_snapshot(&r.base_snap(), &name)
            .await
            .map_err(r.failed(format!("cloning {} as {}", r.base_snap(), r.target())))
    }

    /// `r`'s target marked as holding the whole restore (its snapshot made),
    /// once the mover wrote all of it.
    pub async fn mark_restore_whole(&self, r: &IntoReplica) -> Result<(), IntoReplicaError> {
        let name = naming::restored_snapshot(&r.replica);
        self.snapshot_lvol(&r.target(), &name)
            .await
            .map_err(r.failed(format!("snapshotting {} as {name}", r.target())))
    }

    /// Brings `r`'s lvols to one of two ends, from wherever a run cut off
    /// (or a failure) left them: its target deleted; then, once the target's
    /// snapshot (made only when the target held the whole restore) exists,
    /// it becomes the lvol's parent and is merged into it with the base
    /// snapshot ([`Settled::Restored`]); else the base snapshot is merged
    /// back into the lvol ([`Settled::AsBefore`]).
    pub async fn settle_restore(&self, r: &IntoReplica) -> Result<Settled, IntoReplicaError> {
        let (target, restored, base) = (r.target(), r.restored(), r.base_snap());
        self.delete_lvol(&target)
            .await
            .map_err(r.failed(format!("deleting {target}")))?;
        let inv = Inventory::load(self.client())
            .await
            .map_err(r.failed("reading spdk_tgt".into()))?;
        let end = if inv.lvols.contains_key(&restored) {
            if inv.parent_of(&r.alias).as_deref() != Some(restored.as_str()) {
                self.set_parent(&r.alias, &restored)
                    .await
                    .map_err(r.failed(format!("making {restored} the parent of {}", r.alias)))?;
            }
            Settled::Restored
        } else {
            Settled::AsBefore
        };
        // the base's one clone is the lvol (as before) or the restored snapshot:
        // either way the delete merges it into that clone
        self.delete_lvol(&base)
            .await
            .map_err(r.failed(format!("deleting {base}")))?;
        self.delete_lvol(&restored)
            .await
            .map_err(r.failed(format!("deleting {restored}")))?;
        Ok(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_is_one_of_the_replicas_restore_snapshots_only_in_its_lvstore() {
        let into = IntoReplica {
            replica: "pvc-r-1".into(),
            alias: "lvs-d1/pvc-r-1".into(),
            lvol_bytes: 1 << 20,
        };
        assert_eq!(
            into.restore_parent(Some("lvs-d1/pvc-r-1.restore")),
            Some(RestoreParent::Base)
        );
        assert_eq!(
            into.restore_parent(Some("lvs-d1/pvc-r-1.restored")),
            Some(RestoreParent::Restored)
        );
        // another replica's, another lvstore's, a snapshot of the replica's own, none
        for other in [
            "lvs-d1/pvc-r-2.restore",
            "lvs-d2/pvc-r-1.restored",
            "lvs-d1/pvc-r-1-snap-s1",
        ] {
            assert_eq!(into.restore_parent(Some(other)), None, "{other}");
        }
        assert_eq!(into.restore_parent(None), None);
    }
}
