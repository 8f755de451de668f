//! Point-in-time snapshots of [`VolumeOps`]: taken of every replica with
//! the export frozen, deleted everywhere, and a volume reverted to one.

use std::collections::{BTreeMap, BTreeSet};

use futures::future::join_all;

use super::freeze;
use super::plan::check_len;
use super::{
    Inventory, LVS_PREFIX, LvolRole, MIB, Made, REMOTE_PREFIX, RemoteSnapshot, Snapshotted, VolumeError,
    VolumeOps, ignore_missing, naming, parse_lvol, point_in_time_set, replica_heads, rpc,
};
use crate::names::{Nqn, ObjectName};
use crate::spdk::error::ErrorKind;
use crate::spdk::rpc::{ByName, ByNqn, Lvol, LvolClone, LvolCreate, LvolSetParent, LvolSnapshot, RaidDelete};

impl VolumeOps {
    /// Snapshots every up-to-date replica of a volume (`in_sync`; `None`:
    /// every replica) at one point in time; rolls back the snapshots it made
    /// on error. A replica that is behind or being rebuilt gets none: its
    /// copy would not be the volume's.
    ///
    /// One point in time: SPDK quiesces only the lvol it snapshots
    /// (`bdev_lvol_snapshot`), not its raid siblings. So the export is
    /// frozen first ([`freeze::freeze`]): no new I/O command reaches the
    /// raid (each is failed with a retryable path error that hosts with NVMe
    /// multipath queue), and none is in flight in it. The snapshots are
    /// taken, the listeners set optimized again, always. A volume not exported takes no I/O. An
    /// export made before ANA reporting (no `anagrpid`) cannot be frozen:
    /// then only the lowest replica is snapshotted, and a revert or clone
    /// rebuilds the others from it (see [`point_in_time_set`]).
    ///
    /// Remote replicas (`remote`, those whose node talon can call) are
    /// snapshotted by their own nodes inside the same freeze: the drain
    /// means every write the raid sent them has completed, and no one else
    /// writes to a served replica (its export admits only this engine). Any
    /// failure undoes the local snapshots; the caller deletes remote ones.
    pub async fn snapshot(
        &self,
        inv: &Inventory,
        vol: &ObjectName,
        snap: &ObjectName,
        in_sync: Option<&BTreeSet<usize>>,
        remote: Vec<RemoteSnapshot<'_>>,
    ) -> Result<Snapshotted, VolumeError> {
        let v = vol.as_str();
        let id = format!("{v}@{snap}");
        let mut remote = remote;
        remote.retain(|(k, _)| in_sync.is_none_or(|s| s.contains(k)));
        let mut heads = replica_heads(inv, v);
        heads.retain(|(k, _)| in_sync.is_none_or(|s| s.contains(k)));
        let mut done = Vec::new();
        let mut todo = Vec::new();
        for (k, l) in &heads {
            let sname = naming::snapshot_lvol(v, *k, snap.as_str());
            check_len(v, &sname)?;
            let alias = format!("{}/{sname}", l.lvs.name);
            if inv.lvols.contains_key(&alias) {
                done.push(alias);
            } else {
                todo.push((*k, l.alias.clone(), sname, alias));
            }
        }
        if heads.is_empty() {
            return Err(VolumeError::SnapshotMissing {
                volume: id,
                lvol: naming::replica(v, 0),
            });
        }
        if todo.is_empty() {
            return Ok(Snapshotted {
                lvols: done,
                point_in_time: BTreeSet::new(),
            });
        }
        let nqn = Nqn::for_volume(vol);
        let export = inv
            .subsystem(nqn.as_str())
            .filter(|s| !s.namespaces.is_empty() && !s.listen_addresses.is_empty());
        let mut frozen = freeze::Frozen::default();
        if let Some(sub) = export
            && todo.len() + remote.len() > 1
        {
            if sub.ana_reporting() == Some(true) {
                frozen = freeze::freeze(&self.client, sub)
                    .await
                    .map_err(|e| rpc(&id, e.what)(e.source))?;
            } else {
                tracing::warn!(%nqn, snapshot = %id, "export predates ANA reporting and cannot be frozen: \
                    snapshot taken on one replica; a revert or clone rebuilds the others from it");
                todo.truncate(1);
                remote.clear();
            }
        }
        // the members the raid serves now, drained: the up-to-date set the
        // caller passed was read before the freeze, and a member the raid
        // failed since then (a write it could not take) missed writes the
        // others hold. Such a replica gets no snapshot.
        if inv.raid(&naming::raid(v)).is_some() {
            let live = match self.raid_serves(v).await {
                Ok(live) => live,
                Err(e) => {
                    let _ = freeze::thaw(&self.client, &frozen).await;
                    return Err(rpc(&id, format!("reading raid {}", naming::raid(v)))(e));
                }
            };
            let before = todo.len() + remote.len();
            todo.retain(|(_, head, _, _)| {
                let uuid = inv.lvols.get(head).map(|l| l.uuid.as_str());
                live.contains(head.as_str()) || uuid.is_some_and(|u| live.contains(u))
            });
            remote.retain(|(k, _)| live.contains(&format!("{REMOTE_PREFIX}{}n1", naming::replica(v, *k))));
            if todo.len() + remote.len() < before {
                tracing::warn!(snapshot = %id, "a replica left the raid since it was last seen up to date: \
                    snapshot taken without it");
            }
            if todo.is_empty() && remote.is_empty() {
                let _ = freeze::thaw(&self.client, &frozen).await;
                return Err(VolumeError::SnapshotMissing {
                    volume: id,
                    lvol: naming::replica(v, 0),
                });
            }
        }
        let id_ref = &id;
        let local = join_all(todo.iter().map(|(k, head, sname, alias)| async move {
            self.client
                .bdev_lvol_snapshot(&LvolSnapshot {
                    lvol_name: head.clone(),
                    snapshot_name: sname.clone(),
                })
                .await
                .map(|_| (*k, alias.clone()))
                .map_err(rpc(id_ref, format!("snapshotting {head}")))
        }));
        let remote = join_all(remote.into_iter().map(|(k, f)| async move {
            f.await.map(|()| k).map_err(|message| VolumeError::PeerSnapshot {
                snapshot: id_ref.clone(),
                replica: k,
                message,
            })
        }));
        let (results, remote_results) = futures::future::join(local, remote).await;
        let thawed = freeze::thaw(&self.client, &frozen).await;
        let mut err = None;
        let mut made = Vec::new();
        for r in results {
            match r {
                Ok(a) => made.push(a),
                Err(e) => err = err.or(Some(e)),
            }
        }
        let mut remote_made = BTreeSet::new();
        for r in remote_results {
            match r {
                Ok(k) => {
                    remote_made.insert(k);
                }
                Err(e) => err = err.or(Some(e)),
            }
        }
        if let Some(e) = err {
            self.undo(made.into_iter().map(|(_, a)| Made::Lvol(a)).collect())
                .await;
            return Err(e);
        }
        thawed.map_err(rpc(&id, format!("thawing {nqn} after the snapshot")))?;
        let mut point_in_time: BTreeSet<usize> = made.iter().map(|(k, _)| *k).collect();
        point_in_time.extend(remote_made);
        done.extend(made.into_iter().map(|(_, a)| a));
        Ok(Snapshotted {
            lvols: done,
            point_in_time,
        })
    }

    /// Deletes every replica's snapshot lvol `<vol>-r<k>.s.<snap>`; a clear
    /// error when SPDK refuses because clones exist.
    pub async fn delete_snapshot(&self, inv: &Inventory, vol: &str, snap: &str) -> Result<(), VolumeError> {
        let id = format!("{vol}@{snap}");
        let lvols: Vec<&Lvol> = inv
            .lvols
            .values()
            .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
            .filter(|l| {
                matches!(parse_lvol(&l.name), Some(LvolRole::Snapshot { volume, snap: s, .. }) if volume == vol && s == snap)
            })
            .collect();
        for l in lvols {
            match ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&l.alias))).await {
                Ok(()) => {}
                Err(e) if e.is(ErrorKind::Busy) => {
                    return Err(VolumeError::SnapshotHasClones {
                        snapshot: id,
                        source: e,
                    });
                }
                Err(e) => return Err(rpc(&id, format!("deleting snapshot lvol {}", l.alias))(e)),
            }
        }
        Ok(())
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
        // engine and export go: SPDK has no in-place revert
        let nqn = Nqn::for_volume(vol);
        if inv.subsystem(nqn.as_str()).is_some() {
            ignore_missing(self.client.nvmf_delete_subsystem(&ByNqn {
                nqn: nqn.as_str().to_owned(),
            }))
            .await
            .map_err(rpc(&id, format!("deleting subsystem {nqn} for revert")))?;
        }
        let raid = naming::raid(v);
        if inv.raid(&raid).is_some() {
            ignore_missing(self.client.bdev_raid_delete(&RaidDelete::new(&raid)))
                .await
                .map_err(rpc(&id, format!("deleting raid {raid} for revert")))?;
        }
        for (k, l) in replica_heads(inv, v) {
            if !snaps.iter().any(|(sk, _)| *sk == k) {
                ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&l.alias)))
                    .await
                    .map_err(rpc(&id, format!("deleting head {} that has no {snap}", l.alias)))?;
            }
        }
        let mut heads = BTreeMap::new();
        for (k, s) in &snaps {
            let head = naming::replica(v, *k);
            let alias = format!("{}/{head}", s.lvs.name);
            if inv.lvols.contains_key(&alias) {
                ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&alias)))
                    .await
                    .map_err(rpc(&id, format!("deleting head {alias} for revert")))?;
            }
            let made = match superblock {
                // a fresh head of the snapshot's size (a clone would show the
                // old raid's superblock, and SPDK refuses it in a new raid)
                Some(_) => {
                    let bytes = inv.bdev_size(&s.uuid).unwrap_or(0);
                    self.client
                        .bdev_lvol_create(&LvolCreate::thin(&s.lvs.name, &head, bytes / MIB))
                        .await
                        .map_err(rpc(&id, format!("creating head {alias} for revert")))?
                }
                None => self
                    .client
                    .bdev_lvol_clone(&LvolClone {
                        snapshot_name: s.alias.clone(),
                        clone_name: head,
                    })
                    .await
                    .map_err(rpc(&id, format!("cloning {} into {alias}", s.alias)))?,
            };
            heads.insert(*k, (alias, made));
        }
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
