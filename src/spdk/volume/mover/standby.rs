//! A standby (DR) volume's lvols: `<lvs>/<replica k>.dr`, one a disk,
//! thin, written by [`super::restore::fill_standby`] and never served; on
//! activation renamed to the volume's replicas.
//!
//! ```text
//!   found in the listing (by k) ─> remake: deleted, made anew (thin, zeros) one on each lvstore
//!     ─> fill: a backup written into all of them (only its blocks; onto a base: what differs)
//!     ─> make_replicas: each renamed <replica k>, then served like any volume's replicas
//!   remove: deleted (a standby given up, an activation's leftovers)
//! ```

use super::super::super::ClientError;
use super::super::super::naming;
use super::super::{Inventory, VolumeOps};
use super::restore::{FillError, Onto, fill_standby};
use crate::backupstore::{self, Progress};

/// SPDK's longest lvol name.
const LVOL_NAME_MAX: usize = 63;

/// One of a standby volume's lvols: `<lvs>/<replica k>.dr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbyLvol {
    /// The replica it becomes.
    pub k: usize,
    /// Its lvstore.
    pub lvs: String,
    /// Its bdev.
    pub uuid: String,
}

impl StandbyLvol {
    /// Its alias, of standby volume `vol`.
    pub fn alias(&self, vol: &str) -> String {
        format!("{}/{}", self.lvs, naming::standby(&naming::replica(vol, self.k)))
    }
}

/// Why a step on a standby's lvols failed.
#[derive(Debug, thiserror::Error)]
pub enum StandbyLvolsError {
    /// An SPDK call failed.
    #[error("{step}")]
    Rpc {
        /// The call and its object.
        step: String,
        /// SPDK's answer.
        #[source]
        source: ClientError,
    },
    /// A replica's standby lvol name would pass SPDK's bound.
    #[error(
        "lvol name {name} (standby volume {volume}'s replica) is longer than SPDK's {LVOL_NAME_MAX} characters"
    )]
    NameTooLong {
        /// The name.
        name: String,
        /// The volume.
        volume: String,
    },
    /// Nothing to restore into.
    #[error("standby volume {0} has no lvol to restore into")]
    NoLvol(String),
    /// The backup's blocks could not be written into the lvols.
    #[error("restoring into standby volume {volume}'s lvols")]
    Fill {
        /// The volume.
        volume: String,
        /// Why (naming the backup).
        #[source]
        source: Box<FillError>,
    },
}

/// Deletes `lvols` of standby volume `vol` (gone already is fine).
async fn delete_all(ops: &VolumeOps, vol: &str, lvols: Vec<StandbyLvol>) -> Result<(), StandbyLvolsError> {
    for l in lvols {
        let alias = l.alias(vol);
        ops.delete_lvol(&alias)
            .await
            .map_err(|source| StandbyLvolsError::Rpc {
                step: format!("deleting {alias}"),
                source,
            })?;
    }
    Ok(())
}

/// A standby volume's lvols, as a restore works on them.
#[derive(Debug)]
pub struct StandbyLvols {
    ops: VolumeOps,
    vol: String,
    /// The lvols, by k.
    pub lvols: Vec<StandbyLvol>,
    /// Each one's size in MiB (of those it makes).
    mib: u64,
}

impl StandbyLvols {
    /// `lvols` of standby volume `vol`, each made `mib` MiB when made anew.
    pub fn of(ops: &VolumeOps, vol: &str, lvols: Vec<StandbyLvol>, mib: u64) -> Self {
        Self {
            ops: ops.clone(),
            vol: vol.to_owned(),
            lvols,
            mib,
        }
    }

    /// Standby volume `vol`'s lvols in talon's lvstores of the listing, by k.
    pub fn listed(inv: &Inventory, vol: &str) -> Vec<StandbyLvol> {
        let mut lvols: Vec<StandbyLvol> = inv
            .lvols
            .values()
            .filter(|l| l.lvs.name.starts_with(naming::LVS_PREFIX))
            .filter_map(|l| match naming::parse_lvol(&l.name) {
                Some(naming::LvolRole::Standby { volume, k }) if volume == vol => Some(StandbyLvol {
                    k,
                    lvs: l.lvs.name.clone(),
                    uuid: l.uuid.clone(),
                }),
                _ => None,
            })
            .collect();
        lvols.sort_by_key(|l| l.k);
        lvols
    }

    /// Deletes standby volume `vol`'s lvols in the listing (an activation's
    /// leftovers; gone already is fine).
    pub async fn remove_listed(ops: &VolumeOps, inv: &Inventory, vol: &str) -> Result<(), StandbyLvolsError> {
        delete_all(ops, vol, Self::listed(inv, vol)).await
    }

    /// Deletes them all (gone already is fine).
    pub async fn remove(&mut self) -> Result<(), StandbyLvolsError> {
        delete_all(&self.ops, &self.vol, std::mem::take(&mut self.lvols)).await
    }

    /// Deletes them, then makes them anew (thin, reading zeros), one on each
    /// lvstore of `on`; none is left when one cannot be made.
    pub async fn remake(&mut self, on: &[String]) -> Result<(), StandbyLvolsError> {
        self.remove().await?;
        for (k, lvs) in on.iter().enumerate() {
            let name = naming::standby(&naming::replica(&self.vol, k));
            if name.len() > LVOL_NAME_MAX {
                return Err(StandbyLvolsError::NameTooLong {
                    name,
                    volume: self.vol.clone(),
                });
            }
            match self.ops.create_thin(lvs, &name, self.mib).await {
                Ok(uuid) => self.lvols.push(StandbyLvol {
                    k,
                    lvs: lvs.clone(),
                    uuid,
                }),
                Err(source) => {
                    let _ = self.remove().await;
                    return Err(StandbyLvolsError::Rpc {
                        step: format!("creating lvol {lvs}/{name}"),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// Backup `name` of backup volume `volume` written into them (onto
    /// `base` when given: see [`fill_standby`]).
    pub async fn fill(
        &self,
        store: &backupstore::Store,
        volume: &str,
        base: Option<&str>,
        name: &str,
        data_offset: u64,
        progress: &Progress,
    ) -> Result<backupstore::ops::RestoreStats, StandbyLvolsError> {
        let bdevs: Vec<String> = self.lvols.iter().map(|l| l.uuid.clone()).collect();
        if bdevs.is_empty() {
            return Err(StandbyLvolsError::NoLvol(self.vol.clone()));
        }
        let from = Onto {
            store,
            volume,
            backup: name,
            base,
            data_offset,
        };
        let stats = fill_standby(self.ops.client(), &from, &bdevs, progress)
            .await
            .map_err(|source| StandbyLvolsError::Fill {
                volume: self.vol.clone(),
                source: Box::new(source),
            })?;
        tracing::info!(volume = %self.vol, backup = %name, base = ?base, lvols = bdevs.len(),
            fetched = stats.blocks_downloaded, of = stats.blocks, "standby restored");
        Ok(stats)
    }

    /// Each renamed to its replica (`<volume>-r<k>`): the volume's replicas
    /// from here on (an activation).
    pub async fn make_replicas(&self) -> Result<(), StandbyLvolsError> {
        let vol = &self.vol;
        for l in &self.lvols {
            let alias = l.alias(vol);
            let replica = naming::replica(vol, l.k);
            self.ops
                .rename_lvol(&alias, &replica)
                .await
                .map_err(|source| StandbyLvolsError::Rpc {
                    step: format!("volume {vol}: renaming {alias} to {replica}"),
                    source,
                })?;
        }
        Ok(())
    }
}
