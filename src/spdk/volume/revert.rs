//! Reverts, one core for both engines. [`VolumeOps::take_down`] deletes
//! what serves the replicas (the export, the raid1, other nodes' replicas
//! attached here) and the heads that do not come back; then
//! [`VolumeOps::remake_heads`] makes each head again from its snapshot.
//! talon's [`VolumeOps::revert`] adds its names, the point-in-time set, the
//! superblock and the marker; a Longhorn engine's revert
//! (`engine.LonghornController`) has other nodes revert their replicas
//! between the two, and a Longhorn replica's revert (another node's engine
//! asks) remakes its one head.
//!
//! ```text
//!   take_down:    export ─x  raid1 ─x  remote controllers ─x  dropped heads ─x
//!   (other nodes revert theirs: Longhorn)
//!   remake_heads: <lvs>/<head> ─x ; a clone of <lvs>/<snapshot> (or fresh, its size: superblock)
//! ```
//!
//! Both steps are idempotent (what is not there is not deleted twice; a head
//! is deleted before it is made), so a revert that failed half way is
//! carried out again from the start.

use std::collections::{BTreeMap, BTreeSet};

use super::lvol::{HeadFrom, remake_head};
use super::{
    Inventory, LVS_PREFIX, LvolRole, MIB, VolumeError, VolumeOps, naming, parse_lvol, point_in_time_set,
    replica_heads, rpc,
};
use crate::names::{Nqn, ObjectName};
use crate::spdk::error::ErrorKind;
use crate::spdk::rpc::{ByName, Lvol, LvolCreate, LvolSetParent};

/// What [`VolumeOps::take_down`] deletes, each one that is not there no error.
#[derive(Debug)]
pub struct TakeDown<'a> {
    /// What errors name (`<volume>@<snapshot>`).
    pub id: &'a str,
    /// The export's subsystem (`None`: kept; it loses its namespace with the raid).
    pub export: Option<&'a str>,
    /// The raid1 (`None`: a replica served alone).
    pub raid: Option<&'a str>,
    /// Other nodes' replicas attached here as NVMe controllers (by controller name).
    pub remotes: Vec<String>,
    /// Heads (`<lvs>/<name>`) that go without coming back.
    pub dropped: Vec<String>,
}

/// A head [`VolumeOps::remake_heads`] makes again from its snapshot.
#[derive(Debug, Clone)]
pub struct RevertHead {
    /// The lvstore of both.
    pub lvs: String,
    /// The head's lvol name.
    pub head: String,
    /// The snapshot's lvol name.
    pub snapshot: String,
    /// `Some(mib)`: made fresh and empty of that size (the caller puts the
    /// snapshot under it later), not a clone.
    pub fresh_mib: Option<u64>,
}

impl RevertHead {
    /// The head's alias, `<lvs>/<head>`.
    pub fn alias(&self) -> String {
        format!("{}/{}", self.lvs, self.head)
    }
}

impl VolumeOps {
    /// Deletes what serves the replicas of a revert, in the order SPDK
    /// allows: the export, the raid1, the remote members, the heads dropped.
    pub async fn take_down(&self, t: &TakeDown<'_>) -> Result<(), VolumeError> {
        if let Some(nqn) = t.export {
            self.unexport(t.id, nqn).await?;
        }
        if let Some(raid) = t.raid {
            super::lvol::delete_raid(&self.client, raid)
                .await
                .map_err(rpc(t.id, format!("deleting raid {raid} for revert")))?;
        }
        for c in &t.remotes {
            super::lvol::detach_controller(&self.client, c)
                .await
                .map_err(rpc(t.id, format!("detaching remote replica {c} for revert")))?;
        }
        for alias in &t.dropped {
            super::lvol::delete_lvol(&self.client, alias).await.map_err(rpc(
                t.id,
                format!("deleting head {alias} that has no snapshot to revert to"),
            ))?;
        }
        Ok(())
    }

    /// Makes each head of `heads` again from its snapshot: the head goes (one
    /// not there is no error), then comes back as a clone of the snapshot
    /// under the same name (or fresh, [`RevertHead::fresh_mib`]). Answers
    /// the new heads' UUIDs, in order.
    pub async fn remake_heads(&self, id: &str, heads: &[RevertHead]) -> Result<Vec<String>, VolumeError> {
        let mut made = Vec::with_capacity(heads.len());
        for h in heads {
            let snapshot = format!("{}/{}", h.lvs, h.snapshot);
            let from = match h.fresh_mib {
                Some(mib) => HeadFrom::Fresh(mib),
                None => HeadFrom::Snapshot(&snapshot),
            };
            let uuid = remake_head(&self.client, &h.lvs, &h.head, from)
                .await
                .map_err(|f| rpc(id, format!("{} for revert", f.doing))(f.source))?;
            made.push(uuid);
        }
        Ok(made)
    }

    /// Reverts the volume to snapshot `snap`: the export and engine go
    /// away, the head of each replica of the snapshot's point-in-time set
    /// ([`point_in_time_set`] of `recorded`) is deleted and made again as a
    /// clone of its snapshot, and the marker `<vol>.rev.<generation>` records
    /// it. Every other replica (behind when the snapshot was taken, or whose
    /// snapshot is not proven to be the same instant) loses its head: it is
    /// made again empty and rebuilt from the set, so a raid1 is never built
    /// over members that may differ. Idempotent: run again after a failure,
    /// it finishes the missing replicas. Returns the replicas now up to date;
    /// the caller then calls [`VolumeOps::ensure`] with them to export again.
    pub async fn revert(
        &self,
        inv: &Inventory,
        vol: &ObjectName,
        snap: &ObjectName,
        generation: u64,
        recorded: Option<&BTreeSet<usize>>,
        superblock: Option<usize>,
    ) -> Result<BTreeSet<usize>, VolumeError> {
        let v = vol.as_str();
        let id = format!("{v}@{snap}");
        let sources = point_in_time_set(inv, v, snap.as_str(), recorded);
        let snaps: Vec<(usize, &Lvol)> = inv
            .lvols
            .values()
            .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
            .filter_map(|l| match parse_lvol(&l.name) {
                Some(LvolRole::Snapshot { volume, k, snap: s })
                    if volume == v && s == snap.as_str() && sources.contains(&k) =>
                {
                    Some((k, l))
                }
                _ => None,
            })
            .collect();
        if snaps.is_empty() {
            return Err(VolumeError::SnapshotMissing {
                volume: v.to_owned(),
                lvol: naming::snapshot_lvol(v, 0, snap.as_str()),
            });
        }
        // engine and export go (SPDK has no in-place revert), and the heads
        // of replicas outside the set
        let nqn = Nqn::for_volume(vol);
        let raid = naming::raid(v);
        self.take_down(&TakeDown {
            id: &id,
            export: inv.subsystem(nqn.as_str()).map(|_| nqn.as_str()),
            raid: inv.raid(&raid).map(|_| raid.as_str()),
            remotes: Vec::new(),
            dropped: replica_heads(inv, v)
                .into_iter()
                .filter(|(k, _)| !snaps.iter().any(|(sk, _)| sk == k))
                .map(|(_, l)| l.alias.clone())
                .collect(),
        })
        .await?;
        let plan: Vec<RevertHead> = snaps
            .iter()
            .map(|(k, s)| RevertHead {
                lvs: s.lvs.name.clone(),
                head: naming::replica(v, *k),
                snapshot: s.name.clone(),
                // a fresh head of the snapshot's size (a clone would show the
                // old raid's superblock, and SPDK refuses it in a new raid)
                fresh_mib: superblock.map(|_| inv.bdev_size(&s.uuid).unwrap_or(0) / MIB),
            })
            .collect();
        let made = self.remake_heads(&id, &plan).await?;
        let heads: BTreeMap<usize, (String, String)> = snaps
            .iter()
            .zip(plan.iter().zip(made))
            .map(|((k, _), (h, uuid))| (*k, (h.alias(), uuid)))
            .collect();
        if let Some(slots) = superblock {
            // the raid over the fresh heads writes its superblock into their
            // own first cluster; then the snapshots go under them. The marker
            // below comes last: a stop before it makes the next start revert
            // again from the beginning.
            let first = &snaps[0].1;
            let geometry = match inv.bdevs.get(&first.uuid) {
                Some(b) => (b.block_size, b.num_blocks),
                None => (4096, inv.bdev_size(&first.uuid).unwrap_or(0) / 4096),
            };
            let members: Vec<Option<String>> = (0..slots.max(2))
                .map(|k| heads.get(&k).map(|(_, uuid)| uuid.clone()))
                .collect();
            let mut made = Vec::new();
            self.create_raid(inv, v, &members, geometry, true, &mut made)
                .await
                .map_err(|e| match e {
                    VolumeError::Rpc { step, source, .. } => VolumeError::Rpc {
                        volume: id.clone(),
                        step,
                        source,
                    },
                    e => e,
                })?;
            for (k, s) in &snaps {
                let Some((alias, _)) = heads.get(k) else { continue };
                self.client
                    .bdev_lvol_set_parent(&LvolSetParent {
                        lvol_name: alias.clone(),
                        parent_name: s.alias.clone(),
                    })
                    .await
                    .map_err(rpc(&id, format!("making {} the parent of {alias}", s.alias)))?;
            }
        }
        let lvs = &snaps[0].1.lvs.name;
        let marker = naming::revert_marker(v, generation);
        match self
            .client
            .bdev_lvol_create(&LvolCreate::thin(lvs, &marker, 1))
            .await
        {
            Ok(_) => {}
            Err(e) if e.is(ErrorKind::AlreadyExists) => {}
            Err(e) => return Err(rpc(&id, format!("recording revert marker {lvs}/{marker}"))(e)),
        }
        // older markers go
        for l in inv.lvols.values() {
            if let Some(LvolRole::RevertMarker {
                volume,
                generation: g,
            }) = parse_lvol(&l.name)
                && volume == v
                && g < generation
            {
                let _ = self.client.bdev_lvol_delete(&ByName::new(&l.alias)).await;
            }
        }
        Ok(snaps.iter().map(|(k, _)| *k).collect())
    }
}
