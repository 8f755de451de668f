//! A Longhorn replica's lvols made, grown and removed: its head found in
//! the listing or made thin, grown when its spec grew (an expansion), and
//! at its removal its whole chain deleted, each lvol after those that
//! depend on it. The replica node's controller calls these; which lvols are
//! the replica's (its Longhorn names) is the caller's to say.
//!
//! ```text
//!   ensure_replica_head: listed? ──no──> bdev_lvol_create (thin) ─┐
//!                          │yes                                   v
//!                          └──────────> smaller than asked? ──> bdev_lvol_resize ─> read back
//!   remove_replica_lvols:  leaves (no lvol of the set is their clone) deleted, then their parents, ...
//! ```

use super::{Inventory, VolumeOps};
use crate::spdk::ClientError;
use crate::spdk::rpc::{Lvol, LvolStoreRef};
use crate::spdk::volume::lvol::{create_thin, delete_lvol, resize};

const MIB: u64 = 1 << 20;

/// Why a replica's head is not there as asked.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaHeadError {
    /// The lvol could not be made.
    #[error("creating lvol {alias}")]
    Create {
        /// The lvol.
        alias: String,
        /// SPDK's answer.
        #[source]
        source: ClientError,
    },
    /// The lvol could not grow to the size asked for.
    #[error("growing lvol {alias} to {bytes} bytes")]
    Grow {
        /// The lvol.
        alias: String,
        /// The size asked for.
        bytes: u64,
        /// SPDK's answer.
        #[source]
        source: ClientError,
    },
    /// The lvol vanished right after it grew.
    #[error("lvol {0} is gone after growing it")]
    GoneAfterGrow(String),
    /// The lvol could not be read after it grew.
    #[error("reading lvol {alias} after growing it")]
    ReadAfterGrow {
        /// The lvol.
        alias: String,
        /// SPDK's answer.
        #[source]
        source: ClientError,
    },
}

/// Why a replica's lvols were not all deleted.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaRemoveError {
    /// None of those left is a leaf: they depend on each other.
    #[error("replica {replica}: lvols {lvols:?} depend on each other")]
    Circular {
        /// The replica.
        replica: String,
        /// The lvols left.
        lvols: Vec<String>,
    },
    /// SPDK failed a delete.
    #[error("replica {replica}: deleting lvol {alias}")]
    Delete {
        /// The replica.
        replica: String,
        /// The lvol.
        alias: String,
        /// SPDK's answer.
        #[source]
        source: ClientError,
    },
}

impl VolumeOps {
    /// Replica `replica`'s head `<lvs>/<replica>` as `inv` lists it, or made
    /// thin of `bytes` (MiB rounded up) and added to `inv` (SPDK answers the
    /// new lvol's UUID and the rest is known: thin, nothing allocated, so no
    /// listing follows); grown to `bytes` when it is smaller. Answers the lvol
    /// and its size in bytes.
    pub async fn ensure_replica_head(
        &self,
        inv: &mut Inventory,
        lvs: &LvolStoreRef,
        replica: &str,
        bytes: u64,
    ) -> Result<(Lvol, u64), ReplicaHeadError> {
        let alias = format!("{}/{replica}", lvs.name);
        let lvol = match inv.lvols.get(&alias) {
            Some(l) => l.clone(),
            None => {
                let uuid = create_thin(&self.client, &lvs.name, replica, bytes.div_ceil(MIB))
                    .await
                    .map_err(|source| ReplicaHeadError::Create {
                        alias: alias.clone(),
                        source,
                    })?;
                let lvol = Lvol {
                    alias: alias.clone(),
                    uuid,
                    name: replica.to_owned(),
                    is_thin_provisioned: true,
                    is_snapshot: false,
                    is_clone: false,
                    is_esnap_clone: false,
                    num_allocated_clusters: 0,
                    lvs: lvs.clone(),
                };
                inv.lvols.insert(alias.clone(), lvol.clone());
                lvol
            }
        };
        let size = inv
            .bdevs
            .get(&lvol.uuid)
            .map_or(bytes, |b| u64::from(b.block_size) * b.num_blocks);
        if size >= bytes {
            return Ok((lvol, size));
        }
        resize(&self.client, &alias, bytes.div_ceil(MIB))
            .await
            .map_err(|source| ReplicaHeadError::Grow {
                alias: alias.clone(),
                bytes,
                source,
            })?;
        let size = match self.client.bdev(&alias).await {
            Ok(Some(b)) => b.size_bytes(),
            Ok(None) => return Err(ReplicaHeadError::GoneAfterGrow(alias)),
            Err(source) => return Err(ReplicaHeadError::ReadAfterGrow { alias, source }),
        };
        if let Some(b) = inv.bdevs.get_mut(&lvol.uuid) {
            b.num_blocks = size / u64::from(b.block_size.max(1));
        }
        Ok((lvol, size))
    }

    /// Deletes `lvols` (replica `replica`'s, listed in `inv`), each after
    /// the lvols of the set that are its clones, and takes them out of `inv`.
    /// One gone already is no error.
    pub async fn remove_replica_lvols(
        &self,
        inv: &mut Inventory,
        replica: &str,
        lvols: Vec<String>,
    ) -> Result<(), ReplicaRemoveError> {
        let mut left = lvols;
        while !left.is_empty() {
            let leaves: Vec<String> = left
                .iter()
                .filter(|a| !left.iter().any(|o| inv.parent_of(o).is_some_and(|p| p == **a)))
                .cloned()
                .collect();
            if leaves.is_empty() {
                return Err(ReplicaRemoveError::Circular {
                    replica: replica.to_owned(),
                    lvols: left,
                });
            }
            for alias in leaves {
                delete_lvol(&self.client, &alias)
                    .await
                    .map_err(|source| ReplicaRemoveError::Delete {
                        replica: replica.to_owned(),
                        alias: alias.clone(),
                        source,
                    })?;
                left.retain(|a| *a != alias);
                inv.lvols.remove(&alias);
            }
        }
        Ok(())
    }
}
