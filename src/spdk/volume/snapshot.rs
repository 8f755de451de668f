//! Point-in-time snapshots of [`VolumeOps`]: taken of every replica with
//! the export frozen, and deleted everywhere (reverts: `revert.rs`).

use std::collections::BTreeSet;

use futures::FutureExt;
use futures::future::join_all;

use super::freeze;
use super::plan::check_len;
use super::{
    Inventory, LVS_PREFIX, LvolRole, Made, REMOTE_PREFIX, RemoteSnapshot, Snapshotted, VolumeError,
    VolumeOps, ignore_missing, naming, parse_lvol, replica_heads, rpc,
};
use crate::names::{Nqn, ObjectName};
use crate::spdk::error::ErrorKind;
use crate::spdk::rpc::{ByName, Lvol, LvolSnapshot};

/// What [`VolumeOps::take_at_one_instant`] snapshots, at one instant.
#[derive(Debug)]
pub struct PointInTime<'a> {
    /// What errors name (`<volume>@<snapshot>`).
    pub id: String,
    /// The NQN of the export frozen meanwhile.
    pub export: String,
    /// The raid1 whose members are checked in service (`None`: one member
    /// exported as it is).
    pub raid: Option<String>,
    /// The replicas to snapshot.
    pub members: Vec<Member<'a>>,
    /// What to do when the export cannot be frozen.
    pub unfreezable: Unfreezable,
}

/// One replica of a [`PointInTime`]; `key` is the caller's to tell them apart.
pub enum Member<'a> {
    /// An lvol of this target: its head (`<lvs>/<lvol>`) and the name of the
    /// snapshot lvol to take of it (in the same lvstore).
    Local {
        /// The caller's key.
        key: usize,
        /// The head's alias.
        head: String,
        /// The snapshot lvol's name.
        snapshot: String,
    },
    /// Another node's replica: its bdev in the raid, and the future that has
    /// its node take the snapshot (polled while the export is frozen).
    Remote {
        /// The caller's key.
        key: usize,
        /// What an error calls it.
        name: String,
        /// Its namespace bdev in the raid.
        bdev: String,
        /// The call to its node.
        take: futures::future::BoxFuture<'a, Result<(), super::PeerError>>,
    },
}

impl std::fmt::Debug for Member<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Member::Local { key, head, snapshot } => f
                .debug_struct("Local")
                .field("key", key)
                .field("head", head)
                .field("snapshot", snapshot)
                .finish(),
            Member::Remote { key, name, bdev, .. } => f
                .debug_struct("Remote")
                .field("key", key)
                .field("name", name)
                .field("bdev", bdev)
                .finish(),
        }
    }
}

/// An export made before ANA reporting cannot be frozen (SPDK refuses the
/// ANA state): what a snapshot of more than one replica does then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfreezable {
    /// Snapshot one local replica only; the caller rebuilds the others from
    /// it when it reverts or clones (talon's volumes: the ledger knows).
    OneReplica,
    /// Refuse: the caller needs every replica's snapshot.
    Refuse,
}

/// What [`VolumeOps::take_at_one_instant`] made.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Taken {
    /// (key, snapshot lvol alias) of each local member.
    pub local: Vec<(usize, String)>,
    /// The keys of the remote members whose nodes took theirs.
    pub remote: BTreeSet<usize>,
    /// The keys of the members the raid does not serve now (failed, or the
    /// target of a rebuild): none was taken of them.
    pub left_out: BTreeSet<usize>,
}

impl Taken {
    /// Nothing was taken: no member was left in service.
    pub fn is_empty(&self) -> bool {
        self.local.is_empty() && self.remote.is_empty()
    }
}

impl VolumeOps {
    /// Snapshots every up-to-date replica of a volume (`in_sync`; `None`:
    /// every replica) at one point in time; rolls back the snapshots it made
    /// on error. A replica that is behind or being rebuilt gets none: its
    /// copy would not be the volume's.
    ///
    /// One point in time: SPDK quiesces only the lvol it snapshots
    /// (`bdev_lvol_snapshot`), not its raid siblings. So the export is
    /// frozen first ([`freeze::Freezes::freeze`]): no new I/O command reaches the
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
        let raid = inv.raid(&naming::raid(v)).map(|_| naming::raid(v));
        let mut members: Vec<Member<'_>> = todo
            .into_iter()
            .map(|(key, head, snapshot, _)| Member::Local { key, head, snapshot })
            .collect();
        members.extend(remote.into_iter().map(|(key, take)| Member::Remote {
            key,
            name: format!("r{key}"),
            bdev: format!("{REMOTE_PREFIX}{}n1", naming::replica(v, key)),
            take,
        }));
        let taken = self
            .take_at_one_instant(
                inv,
                PointInTime {
                    id: id.clone(),
                    export: Nqn::for_volume(vol).as_str().to_owned(),
                    raid,
                    members,
                    unfreezable: Unfreezable::OneReplica,
                },
            )
            .await?;
        if !taken.left_out.is_empty() {
            tracing::warn!(snapshot = %id, replicas = ?taken.left_out, "a replica left the raid since it was \
                last seen up to date: snapshot taken without it");
        }
        if taken.is_empty() {
            return Err(VolumeError::SnapshotMissing {
                volume: id,
                lvol: naming::replica(v, 0),
            });
        }
        let mut point_in_time: BTreeSet<usize> = taken.local.iter().map(|(k, _)| *k).collect();
        point_in_time.extend(taken.remote);
        done.extend(taken.local.into_iter().map(|(_, a)| a));
        Ok(Snapshotted {
            lvols: done,
            point_in_time,
        })
    }

    /// Takes the snapshots of `p.members` at one instant: the one core of
    /// talon's volume snapshots ([`Self::snapshot`]) and a Longhorn engine's
    /// (`VolumeSnapshot`), which differ only in their names.
    ///
    /// 1. `p.export` (when it is served and more than one member is taken)
    ///    is frozen ([`freeze::Freezes::freeze`]): no new command reaches the raid and
    ///    none is in flight in it. An export made without ANA reporting
    ///    cannot be frozen: [`Unfreezable`] says what then.
    /// 2. The members `p.raid` serves now, drained, are kept: one the raid
    ///    failed since the caller chose (a write it could not take) missed
    ///    writes the others hold, and one being rebuilt is not the volume's
    ///    copy yet. Without a raid (one member exported as it is) all are kept.
    /// 3. Local heads are snapshotted (`bdev_lvol_snapshot`) and remote
    ///    members' futures run, together; the export is thawed, always.
    /// 4. Any failure deletes the local snapshots this made and is returned;
    ///    the caller deletes remote ones (their nodes made them).
    ///
    /// An empty [`Taken`]: no member was left in service (nothing made);
    /// [`Taken::left_out`] names those the raid does not serve.
    pub async fn take_at_one_instant(
        &self,
        inv: &Inventory,
        p: PointInTime<'_>,
    ) -> Result<Taken, VolumeError> {
        let PointInTime {
            id,
            export,
            raid,
            mut members,
            unfreezable,
        } = p;
        let sub = inv
            .subsystem(&export)
            .filter(|s| !s.namespaces.is_empty() && !s.listen_addresses.is_empty());
        let mut frozen = freeze::Frozen::default();
        if let Some(sub) = sub
            && members.len() > 1
        {
            if sub.ana_reporting() == Some(true) {
                frozen = self
                    .freezes
                    .freeze(&self.client, sub)
                    .await
                    .map_err(|e| rpc(&id, e.what)(e.source))?;
            } else {
                match unfreezable {
                    Unfreezable::OneReplica => {
                        tracing::warn!(nqn = %export, snapshot = %id, "export predates ANA reporting and cannot be frozen: \
                            snapshot taken on one replica; a revert or clone rebuilds the others from it");
                        let first = members
                            .iter()
                            .position(|m| matches!(m, Member::Local { .. }))
                            .unwrap_or(0);
                        members = vec![members.swap_remove(first)];
                    }
                    Unfreezable::Refuse => {
                        return Err(VolumeError::Unfreezable {
                            snapshot: id,
                            nqn: export,
                        });
                    }
                }
            }
        }
        crate::util::failpoint("snapshot-frozen");
        let mut left_out = BTreeSet::new();
        if let Some(raid) = &raid {
            let live = match self.raid_serves(raid).await {
                Ok(live) => live,
                Err(e) => {
                    let _ = self.freezes.thaw(&self.client, &frozen).await;
                    return Err(rpc(&id, format!("reading raid {raid}"))(e));
                }
            };
            let left_out = &mut left_out;
            members.retain(|m| {
                let (key, serves) = match m {
                    Member::Local { key, head, .. } => {
                        let uuid = inv.lvols.get(head).map(|l| l.uuid.as_str());
                        (
                            *key,
                            live.contains(head.as_str()) || uuid.is_some_and(|u| live.contains(u)),
                        )
                    }
                    Member::Remote { key, bdev, .. } => {
                        let uuid = inv.bdevs.get(bdev).and_then(|b| b.uuid.as_deref());
                        (
                            *key,
                            live.contains(bdev.as_str()) || uuid.is_some_and(|u| live.contains(u)),
                        )
                    }
                };
                if !serves {
                    left_out.insert(key);
                }
                serves
            });
            if members.is_empty() {
                let _ = self.freezes.thaw(&self.client, &frozen).await;
                return Ok(Taken {
                    left_out: left_out.clone(),
                    ..Taken::default()
                });
            }
        }
        let id_ref = &id;
        let mut local = Vec::new();
        let mut remote = Vec::new();
        for m in members {
            match m {
                Member::Local { key, head, snapshot } => local.push(async move {
                    let lvs = head.split_once('/').map_or("", |(l, _)| l);
                    let alias = format!("{lvs}/{snapshot}");
                    self.client
                        .bdev_lvol_snapshot(&LvolSnapshot {
                            lvol_name: head.clone(),
                            snapshot_name: snapshot,
                        })
                        .await
                        .map(|_| (key, alias))
                        .map_err(rpc(id_ref, format!("snapshotting {head}")))
                }),
                Member::Remote { key, name, take, .. } => remote.push(async move {
                    take.await.map(|()| key).map_err(|e| VolumeError::PeerSnapshot {
                        snapshot: id_ref.clone(),
                        replica: name,
                        message: e.to_string(),
                    })
                }),
            }
        }
        // (a crash test's point: this node's copies made, another node's
        // call not yet answered when the remote ones are slower)
        let local = join_all(local).inspect(|_| crate::util::failpoint("snapshot-local-taken"));
        let (results, remote_results) = futures::future::join(local, join_all(remote)).await;
        crate::util::failpoint("snapshot-taken");
        let thawed = self.freezes.thaw(&self.client, &frozen).await;
        let mut err = None;
        let mut taken = Taken {
            left_out,
            ..Taken::default()
        };
        for r in results {
            match r {
                Ok(a) => taken.local.push(a),
                Err(e) => err = err.or(Some(e)),
            }
        }
        for r in remote_results {
            match r {
                Ok(k) => {
                    taken.remote.insert(k);
                }
                Err(e) => err = err.or(Some(e)),
            }
        }
        // a thaw that failed fails the snapshot too, and nothing of it is
        // kept here (the caller retries; a copy kept from this instant and
        // one taken at the next would not be one point in time)
        let err = err.or(thawed
            .err()
            .map(rpc(&id, format!("thawing {export} after the snapshot"))));
        if let Some(e) = err {
            self.undo(taken.local.into_iter().map(|(_, a)| Made::Lvol(a)).collect())
                .await;
            return Err(e);
        }
        Ok(taken)
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
}
