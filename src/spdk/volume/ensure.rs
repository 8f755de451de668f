//! The phases of [`VolumeOps::ensure`], in the order it runs them: the
//! missing objects made, the replicas' facts, the remote replicas attached,
//! the local replicas grown, the engine, a clone's heads given their
//! parents, and the size the host sees. The decisions among them (which
//! replicas grow, which are trusted, where the size comes from) are pure
//! functions, tested below without SPDK.
//!
//! ```text
//!   make_missing ─> replica_facts ─> attach_remotes ─> remote_lvols ─> grow_local
//!        ─> make_engine ─> parent_heads ─> (export) ─> served_size
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures::future::join_all;

use super::plan::{self, LocalPlan};
use super::{
    Inventory, MIB, Made, REMOTE_PREFIX, RemoteAttach, ReplicaInfo, SyncState, VolumeError, VolumeOps,
    VolumePlan, naming, no_current, rpc,
};
use crate::names::Nqn;
use crate::spdk::rpc::LvolSetParent;

/// The replicas [`super::made_again`] finds between `noted` and `now`, each
/// logged with both (`what`: which check): never trusted, rebuilt.
pub(super) fn made_again_since(
    vol: &str,
    noted: &BTreeMap<usize, String>,
    now: &BTreeMap<usize, String>,
    what: &str,
) -> BTreeSet<usize> {
    let found = super::made_again(noted, |k| now.get(k).cloned());
    for (k, (noted, now)) in &found {
        tracing::warn!(
            volume = vol,
            replica = k,
            noted = noted.as_str(),
            now = now.as_str(),
            "{what}: rebuilt, not trusted"
        );
    }
    found.into_keys().collect()
}

/// Where each local replica's lvol is now (k -> the UUID of its lvstore):
/// as listed, or, for one this call makes, its disk's lvstore.
pub(super) fn local_lvstores(inv: &Inventory, local: &LocalPlan) -> BTreeMap<usize, String> {
    local
        .replicas
        .iter()
        .filter_map(|r| {
            let uuid = match inv.lvols.get(&r.alias) {
                Some(l) => l.lvs.uuid.clone(),
                None => {
                    let lvs = naming::lvstore(&r.disk);
                    inv.lvstores.iter().find(|l| l.name == lvs)?.uuid.clone()
                }
            };
            Some((r.k, uuid))
        })
        .collect()
}

/// The bytes each replica's lvol should have for the volume's size: the
/// size in whole MiB plus the replica's superblock room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rooms {
    /// The volume's size in whole MiB.
    size_mib: u64,
    /// The room of each local replica, by k.
    room_of: BTreeMap<usize, u64>,
    /// The room of a remote replica.
    remote_room: u64,
}

impl Rooms {
    /// The rooms of `plan`'s replicas: a local one's as `local` placed it; a
    /// remote member's at least SPDK's minimum data offset (1 MiB; its NVMe
    /// bdev's optimal I/O boundary may round it up) with a superblock, else 0.
    pub(super) fn new(plan: &VolumePlan, local: &LocalPlan) -> Self {
        Self {
            size_mib: plan::size_mib(plan),
            room_of: local.replicas.iter().map(|r| (r.k, r.room)).collect(),
            remote_room: if plan.uses_superblock() { MIB } else { 0 },
        }
    }

    /// The room before the volume's data on replica `r`.
    pub(super) fn room(&self, r: &ReplicaInfo) -> u64 {
        self.room_of.get(&r.k).copied().unwrap_or(self.remote_room)
    }

    /// The size replica `r` should have: the volume's plus its room.
    pub(super) fn wanted(&self, r: &ReplicaInfo) -> u64 {
        self.size_mib * MIB + self.room(r)
    }
}

/// Which replicas the engine may serve from as they are (the others are
/// rebuilt into it): those of the ledger that were not made now; with no
/// ledger, a new clone's replicas cloned from one point in time, a new
/// volume's replicas restored from its backup (now, or by a run that got
/// that far), else the replicas that exist, or all of a volume made now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Trust<'a> {
    /// The ledger ([`VolumePlan::in_sync`]).
    in_sync: Option<&'a BTreeSet<usize>>,
    /// A clone ([`VolumePlan::from_snapshot`]).
    clone: bool,
    /// A volume made from a backup ([`VolumePlan::restore`]).
    restore: bool,
    /// The count of local replicas.
    replicas: usize,
    /// The local replicas made by this call.
    created: BTreeSet<usize>,
    /// Every local replica is made by this call.
    fresh: bool,
    /// [`LocalPlan::clone_set`].
    clone_set: &'a BTreeSet<usize>,
    /// [`LocalPlan::restored`].
    restored: &'a BTreeSet<usize>,
    /// Remote replicas made again on their node since the ledger noted them
    /// ([`super::made_again`] over [`super::LvolNotes::lvols`]): never trusted.
    pub(super) remade: BTreeSet<usize>,
    /// Local replicas whose lvol is in another lvstore than the ledger noted
    /// ([`super::made_again`] over [`super::LvolNotes::lvstores`]): made again
    /// since, never trusted.
    pub(super) moved: BTreeSet<usize>,
    /// Remote replicas with a noted lvol whose node did not say which lvol
    /// it serves as the engine is made ([`VolumeOps::remote_lvols`]): not
    /// judged, never trusted.
    pub(super) unjudged: BTreeSet<usize>,
}

impl<'a> Trust<'a> {
    /// The rule for `plan` with its local replicas `local`.
    pub(super) fn new(plan: &'a VolumePlan, local: &'a LocalPlan) -> Self {
        Self {
            in_sync: plan.in_sync.as_ref(),
            clone: plan.from_snapshot.is_some(),
            restore: plan.restore.is_some(),
            replicas: plan.replicas,
            created: local
                .replicas
                .iter()
                .filter(|r| r.make.is_some())
                .map(|r| r.k)
                .collect(),
            fresh: local.replicas.iter().all(|r| r.make.is_some()),
            clone_set: &local.clone_set,
            restored: &local.restored,
            remade: BTreeSet::new(),
            moved: BTreeSet::new(),
            unjudged: BTreeSet::new(),
        }
    }

    /// Whether replica `k` holds the newest data.
    pub(super) fn trusts(&self, k: usize) -> bool {
        match self.in_sync {
            Some(s) => {
                s.contains(&k)
                    && !self.created.contains(&k)
                    && !self.remade.contains(&k)
                    && !self.moved.contains(&k)
                    && !self.unjudged.contains(&k)
            }
            // a new clone: only the replicas cloned from one point in time
            None if self.clone => self.clone_set.contains(&k),
            // a new volume from a backup: the replicas restored now, or by a run
            // that got that far (one cut off in its copy is removed before)
            None if self.restore => {
                self.restored.contains(&k) || (k < self.replicas && !self.created.contains(&k) && !self.fresh)
            }
            None => self.fresh || !self.created.contains(&k),
        }
    }
}

/// Where the size the host sees comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SizeFrom {
    /// The raid, looked up now (it may differ from the listing).
    LookUp,
    /// The raid as the inventory listed it.
    Listed,
    /// The smallest replica (the lvol itself is the engine).
    Replicas,
}

/// Where the size comes from: a raid that may have changed since the
/// listing (replicas grew, heads got their parents, or it was not listed)
/// is looked up; another raid is as listed; a lone lvol is its own size.
pub(super) fn size_from(is_raid: bool, may_differ: bool, raid_listed: bool) -> SizeFrom {
    if is_raid && (may_differ || !raid_listed) {
        SizeFrom::LookUp
    } else if is_raid {
        SizeFrom::Listed
    } else {
        SizeFrom::Replicas
    }
}

/// The data bytes of the smallest replica (its size less its room); 0
/// with none.
pub(super) fn min_replica(replicas: &[ReplicaInfo], rooms: &Rooms) -> u64 {
    replicas
        .iter()
        .map(|r| r.size_bytes.saturating_sub(rooms.room(r)))
        .min()
        .unwrap_or(0)
}

/// A raid smaller than its smallest replica did not follow a growth.
pub(super) fn check_grown(
    vol: &str,
    device: &str,
    is_raid: bool,
    size: u64,
    min: u64,
) -> Result<(), VolumeError> {
    if is_raid && size < min {
        return Err(VolumeError::RaidDidNotGrow {
            volume: vol.to_owned(),
            raid: device.to_owned(),
            actual: size,
            wanted: min,
        });
    }
    Ok(())
}

/// Whether a replica may grow here: a local one (a remote replica grows on
/// its own node) that is not a head waiting for its parent (it keeps the
/// snapshot's size until then: SPDK sets a parent of the same size only).
fn growable(r: &ReplicaInfo, local: usize, heads: &BTreeMap<usize, String>) -> bool {
    r.k < local && !heads.contains_key(&r.k)
}

/// The replicas to grow now: those [`growable`] smaller than [`Rooms::wanted`].
pub(super) fn to_grow(
    replicas: &[ReplicaInfo],
    rooms: &Rooms,
    local: usize,
    heads: &BTreeMap<usize, String>,
) -> Vec<ReplicaInfo> {
    replicas
        .iter()
        .filter(|r| r.size_bytes < rooms.wanted(r) && growable(r, local, heads))
        .cloned()
        .collect()
}

/// The replica facts of the local replicas: each one's bdev and allocated
/// bytes as listed, or, made by this call, its new bdev (`new_bdevs`, by
/// alias) with nothing allocated.
pub(super) fn replica_facts(
    inv: &Inventory,
    local: &LocalPlan,
    new_bdevs: &HashMap<String, String>,
) -> Vec<ReplicaInfo> {
    local
        .replicas
        .iter()
        .map(|r| {
            let cluster = inv.lvstore(&r.disk).map_or(MIB, |s| s.cluster_size);
            let (bdev, allocated) = match inv.lvols.get(&r.alias) {
                Some(l) => (l.uuid.clone(), l.num_allocated_clusters.saturating_mul(cluster)),
                None => (new_bdevs.get(&r.alias).cloned().unwrap_or_default(), 0),
            };
            ReplicaInfo {
                k: r.k,
                name: r.name.clone(),
                disk: r.disk.clone(),
                bdev,
                alias: r.alias.clone(),
                size_bytes: r.size_bytes,
                allocated_bytes: allocated,
            }
        })
        .collect()
}

/// The engine of one replica: the replica's lvol itself, if it is trusted.
pub(super) fn lone_engine(
    plan: &VolumePlan,
    replicas: &[ReplicaInfo],
    trust: &Trust<'_>,
) -> Result<(String, SyncState), VolumeError> {
    match replicas.first() {
        Some(r) if trust.trusts(r.k) => Ok((
            r.bdev.clone(),
            SyncState {
                in_sync: BTreeSet::from([r.k]),
                ..SyncState::default()
            },
        )),
        _ => Err(no_current(plan, replicas)),
    }
}

impl VolumeOps {
    /// Makes the missing replica lvols of `local`, all at once; records
    /// them in `made` and returns their bdevs by alias. The first error
    /// found is returned once all are done. The volume's subsystem is not
    /// made here: only the export makes it, once an engine serves (a volume
    /// held back never has one).
    pub(super) async fn make_missing(
        &self,
        plan: &VolumePlan,
        local: &LocalPlan,
        made: &mut Vec<Made>,
    ) -> Result<HashMap<String, String>, VolumeError> {
        let vol = plan.name.as_str();
        let creates = local
            .replicas
            .iter()
            .filter_map(|r| Some((r, r.make.as_ref()?)))
            .map(|(r, make)| async move {
                self.make_replica(vol, &r.disk, &r.name, make)
                    .await
                    .map(|uuid| (r.alias.clone(), uuid))
            });
        let lvols = join_all(creates).await;
        let mut first_err = None;
        let mut new_bdevs = HashMap::new();
        for r in lvols {
            match r {
                Ok((alias, uuid)) => {
                    made.push(Made::Lvol(alias.clone()));
                    new_bdevs.insert(alias, uuid);
                }
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(new_bdevs),
        }
    }

    /// Attaches the plan's remote replicas over NVMe/TCP from the nodes
    /// that serve them, one after the other, adding each to `replicas`; one
    /// that does not answer goes to `waiting`, like a disk that is away.
    pub(super) async fn attach_remotes(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        replicas: &mut Vec<ReplicaInfo>,
        waiting: &mut Vec<(usize, String)>,
    ) -> Result<(), VolumeError> {
        for (i, (addr, port)) in plan.remote.iter().enumerate() {
            let k = plan.replicas + i;
            match self.remote_replica(inv, plan, k, (*addr, *port)).await? {
                Some(r) => replicas.push(r),
                None => waiting.push((k, format!("{addr}:{port}"))),
            }
        }
        Ok(())
    }

    /// The lvol each attached remote replica's node serves as it now (k ->
    /// UUID), asked of the nodes talon can call for the replicas the ledger
    /// holds up to date that it has no lvol noted for, or all of them when
    /// the engine is to be made (`assembling`): then one made again on its
    /// node (its disk replaced or formatted) is told from the lvol noted
    /// ([`super::made_again`]) before the raid1 trusts it. Asked after the
    /// attach: the node's status names the lvol its export serves from the
    /// pass that made it. Also returns the replicas with a noted lvol whose
    /// node did not say which lvol it serves now, when the engine is to be
    /// made: not judged, so not trusted (its export may answer while its
    /// admin API does not; taken in unjudged, a replica made again empty
    /// would be served).
    pub(super) async fn remote_lvols(
        &self,
        plan: &VolumePlan,
        attached: &[ReplicaInfo],
        assembling: bool,
    ) -> (BTreeMap<usize, String>, BTreeSet<usize>) {
        let Some(in_sync) = plan.in_sync.as_ref() else {
            return (BTreeMap::new(), BTreeSet::new());
        };
        let asks = plan.remote_dests.iter().enumerate().filter_map(|(i, d)| {
            let k = plan.replicas + i;
            let ask = in_sync.contains(&k)
                && attached.iter().any(|r| r.k == k)
                && (assembling || !plan.noted.lvols.contains_key(&k));
            let d = d.as_ref().filter(|_| ask)?;
            Some(async move { (k, d.lvol(k).await) })
        });
        let mut out = BTreeMap::new();
        let mut unjudged = BTreeSet::new();
        for (k, r) in join_all(asks).await {
            let noted = assembling && plan.noted.lvols.contains_key(&k);
            match r {
                Ok(Some(uuid)) => {
                    out.insert(k, uuid);
                }
                Ok(None) if noted => {
                    tracing::warn!(
                        volume = plan.name.as_str(),
                        replica = k,
                        "remote replica's node serves no lvol as it: not trusted, rebuilt"
                    );
                    unjudged.insert(k);
                }
                Ok(None) => {}
                Err(e) if noted => {
                    tracing::warn!(volume = plan.name.as_str(), replica = k, error = %e,
                        "remote replica's lvol not known as the engine is made: not trusted, rebuilt");
                    unjudged.insert(k);
                }
                Err(e) => tracing::warn!(volume = plan.name.as_str(), replica = k, error = %e,
                    "remote replica's lvol not known: not judged"),
            }
        }
        (out, unjudged)
    }

    /// Attaches remote replica `k` served at `at`: its facts, or `None`
    /// when its node does not answer.
    async fn remote_replica(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        k: usize,
        at: (std::net::IpAddr, u16),
    ) -> Result<Option<ReplicaInfo>, VolumeError> {
        let vol = plan.name.as_str();
        let (addr, port) = at;
        let name = naming::replica(vol, k);
        let ctrl = format!("{REMOTE_PREFIX}{name}");
        let nqn = Nqn::for_replica(&plan.name, &format!("r{k}")).map_err(|source| VolumeError::BadName {
            volume: vol.to_owned(),
            source,
        })?;
        let bdev = format!("{ctrl}n1");
        let a = RemoteAttach {
            controller: &ctrl,
            address: addr,
            port,
            nqn: nqn.as_str(),
            host_nqn: self.host_nqn.clone(),
            longhorn_link: false,
            dhchap_data_dir: plan.export.dhchap_data_dir.as_deref(),
            tls_data_dir: plan.export.tls_data_dir.as_deref(),
        };
        let size = match self.remote_member(inv, vol, &a).await {
            Ok(b) => match inv.bdevs.get(&b) {
                Some(listed) => Some(listed.size_bytes()),
                None => self
                    .client
                    .bdev(&b)
                    .await
                    .map_err(rpc(vol, format!("looking up remote replica {b}")))?
                    .map(|b| b.size_bytes()),
            },
            Err(e) => {
                tracing::warn!(volume = vol, replica = %name, error = %crate::util::error_chain(&e), "remote replica not reachable");
                None
            }
        };
        Ok(size.map(|size_bytes| ReplicaInfo {
            k,
            name,
            disk: format!("{addr}:{port}"),
            bdev,
            alias: nqn.as_str().to_owned(),
            size_bytes,
            allocated_bytes: 0,
        }))
    }

    /// Grows the local replicas smaller than asked (an expand), each within
    /// its disk's overcommit bound (all checked before any grows), and
    /// records their new sizes in `replicas`; the engine follows. Returns
    /// whether any replica (a remote one too) was smaller than asked.
    pub(super) async fn grow_local(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        local: &LocalPlan,
        rooms: &Rooms,
        replicas: &mut [ReplicaInfo],
    ) -> Result<bool, VolumeError> {
        let vol = plan.name.as_str();
        let grew = replicas.iter().any(|r| r.size_bytes < rooms.wanted(r));
        let grow = to_grow(replicas, rooms, plan.replicas, &local.parents);
        for r in &grow {
            plan::within_overcommit(
                inv,
                &r.disk,
                rooms.wanted(r) - r.size_bytes,
                plan.overcommit_percent,
            )
            .map_err(|reason| VolumeError::Overcommit {
                volume: vol.to_owned(),
                replica: r.alias.clone(),
                disk: r.disk.clone(),
                bytes: rooms.wanted(r),
                reason: Box::new(reason),
            })?;
        }
        self.grow(vol, &grow, rooms.size_mib, &|r| rooms.room(r)).await?;
        for r in replicas
            .iter_mut()
            .filter(|r| growable(r, plan.replicas, &local.parents))
        {
            r.size_bytes = r.size_bytes.max(rooms.wanted(r));
        }
        Ok(grew)
    }

    /// The engine: the lvol itself (one replica), or raid1 over the
    /// replicas that are up to date, with the others rebuilt into it one at
    /// a time ([`Self::ensure_raid`]). Returns what serves and how the
    /// replicas stand.
    pub(super) async fn make_engine(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        replicas: &[ReplicaInfo],
        trust: &Trust<'_>,
        made: &mut Vec<Made>,
    ) -> Result<(String, SyncState), VolumeError> {
        if plan.replicas + plan.remote.len() <= 1 {
            lone_engine(plan, replicas, trust)
        } else {
            let again = super::raid::MadeAgain {
                remote: &trust.remade,
                local: &trust.moved,
            };
            self.ensure_raid(inv, plan, replicas, &|k| trust.trusts(k), again, made)
                .await
        }
    }

    /// A clone with a superblock: its heads get their snapshots as parents
    /// now that the raid's superblock is in their own first cluster; then
    /// they grow to the volume's size (recorded in `replicas`). Before the
    /// first export only (no ledger yet): a head without a parent then can
    /// only be one made here, or by a run that stopped between the raid and
    /// this step.
    pub(super) async fn parent_heads(
        &self,
        vol: &str,
        local: &LocalPlan,
        rooms: &Rooms,
        replicas: &mut [ReplicaInfo],
    ) -> Result<(), VolumeError> {
        if local.parents.is_empty() {
            return Ok(());
        }
        let mut grown = Vec::new();
        for r in replicas.iter_mut() {
            let Some(snap) = local.parents.get(&r.k) else {
                continue;
            };
            self.client
                .bdev_lvol_set_parent(&LvolSetParent {
                    lvol_name: r.alias.clone(),
                    parent_name: snap.clone(),
                })
                .await
                .map_err(rpc(vol, format!("making {snap} the parent of {}", r.alias)))?;
            if r.size_bytes < rooms.wanted(r) {
                grown.push(r.clone());
            }
            r.size_bytes = r.size_bytes.max(rooms.wanted(r));
        }
        self.grow(vol, &grown, rooms.size_mib, &|r| rooms.room(r)).await
    }

    /// The size the host sees of `device`: looked up only when it may
    /// differ from the replicas' ([`size_from`]); a raid smaller than its
    /// smallest replica is an error ([`check_grown`]).
    pub(super) async fn served_size(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        device: &str,
        replicas: &[ReplicaInfo],
        rooms: &Rooms,
        may_differ: bool,
    ) -> Result<u64, VolumeError> {
        let vol = plan.name.as_str();
        let is_raid = device == naming::raid(vol);
        let min = min_replica(replicas, rooms);
        let size_bytes = match size_from(is_raid, may_differ, inv.raid(device).is_some()) {
            SizeFrom::LookUp => match self
                .client
                .bdev(device)
                .await
                .map_err(rpc(vol, format!("looking up {device}")))?
            {
                Some(b) => b.size_bytes(),
                None => 0,
            },
            SizeFrom::Listed => inv.bdev_size(device).unwrap_or(min),
            SizeFrom::Replicas => min,
        };
        check_grown(vol, device, is_raid, size_bytes, min)?;
        if size_bytes > 0 && plan.size_bytes < size_bytes.saturating_sub(MIB) {
            tracing::info!(
                volume = vol,
                served = size_bytes,
                asked = plan.size_bytes,
                "volumes do not shrink"
            );
        }
        Ok(size_bytes)
    }
}

#[cfg(test)]
mod tests {
    //! The pure decisions of `ensure` against hand-built plans: no double,
    //! no SPDK.

    use super::*;
    use crate::names::ObjectName;
    use crate::spdk::rpc::{Lvol, LvolStoreRef, Lvstore};
    use crate::spdk::volume::plan::{LocalReplica, Make};

    /// A plan for volume `v` of `mib` MiB with `replicas` local replicas.
    fn vplan(mib: u64, replicas: usize, superblock: bool) -> VolumePlan {
        crate::spdk::volume::plan::test_plan("v", mib, replicas, superblock)
    }

    /// Local replica `k` on disk `d<k>` of `bytes` with `room`, made now or not.
    fn local_replica(k: usize, bytes: u64, room: u64, make: bool) -> LocalReplica {
        LocalReplica {
            k,
            disk: format!("d{k}"),
            name: format!("v-r{k}"),
            alias: format!("talon-d{k}/v-r{k}"),
            make: make.then_some(Make::Thin { mib: bytes / MIB }),
            room,
            size_bytes: bytes,
        }
    }

    /// A local plan of `replicas`, nothing else.
    fn local_plan(replicas: Vec<LocalReplica>) -> LocalPlan {
        LocalPlan {
            replicas,
            waiting: vec![],
            unplaced: None,
            clone_set: BTreeSet::new(),
            restored: BTreeSet::new(),
            parents: BTreeMap::new(),
            wanted: BTreeMap::new(),
        }
    }

    /// Replica `k` as ensure sees it, of `bytes`.
    fn info(k: usize, bytes: u64) -> ReplicaInfo {
        ReplicaInfo {
            k,
            name: format!("v-r{k}"),
            disk: format!("d{k}"),
            bdev: format!("bdev-{k}"),
            alias: format!("talon-d{k}/v-r{k}"),
            size_bytes: bytes,
            allocated_bytes: 0,
        }
    }

    /// The replicas among `ks` that `t` trusts.
    fn trusted(t: &Trust<'_>, ks: std::ops::Range<usize>) -> Vec<usize> {
        ks.filter(|k| t.trusts(*k)).collect()
    }

    #[test]
    fn rooms_are_the_local_ones_and_one_mib_for_a_remote_member_with_a_superblock() {
        let mut p = vplan(10, 1, true);
        p.remote = vec![([10, 0, 0, 2].into(), 4420)];
        let l = local_plan(vec![local_replica(0, 14 * MIB, 4 * MIB, false)]);
        let rooms = Rooms::new(&p, &l);
        assert_eq!(rooms.room(&info(0, 0)), 4 * MIB);
        assert_eq!(rooms.room(&info(1, 0)), MIB, "remote member");
        assert_eq!(rooms.wanted(&info(0, 0)), 14 * MIB);
        assert_eq!(rooms.wanted(&info(1, 0)), 11 * MIB);
        // no superblock without a raid: no room for the remote member
        let mut p = vplan(10, 1, false);
        p.remote = vec![([10, 0, 0, 2].into(), 4420)];
        assert_eq!(Rooms::new(&p, &l).room(&info(1, 0)), 0);
    }

    #[test]
    fn only_local_replicas_smaller_than_asked_and_not_waiting_for_a_parent_grow() {
        let p = vplan(10, 3, false);
        let l = local_plan((0..3).map(|k| local_replica(k, 8 * MIB, 0, false)).collect());
        let rooms = Rooms::new(&p, &l);
        // r0 small, r1 as asked, r2 small but a head waiting for its parent,
        // r3 remote and small
        let replicas = vec![
            info(0, 8 * MIB),
            info(1, 10 * MIB),
            info(2, 8 * MIB),
            info(3, 4 * MIB),
        ];
        let heads = BTreeMap::from([(2, "talon-d2/snap".to_owned())]);
        let grow: Vec<usize> = to_grow(&replicas, &rooms, 3, &heads)
            .iter()
            .map(|r| r.k)
            .collect();
        assert_eq!(grow, vec![0]);
        assert!(to_grow(&replicas[1..2], &rooms, 3, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn the_ledger_trusts_its_replicas_unless_made_now() {
        let mut p = vplan(10, 3, true);
        p.in_sync = Some(BTreeSet::from([0, 1]));
        let l = local_plan(vec![
            local_replica(0, 10 * MIB, 0, false),
            local_replica(1, 10 * MIB, 0, true),
            local_replica(2, 10 * MIB, 0, false),
        ]);
        assert_eq!(trusted(&Trust::new(&p, &l), 0..4), vec![0]);
    }

    #[test]
    fn a_remote_replica_made_again_on_its_node_is_never_trusted() {
        let mut p = vplan(10, 1, true);
        p.remote = vec![([10, 0, 0, 2].into(), 4420), ([10, 0, 0, 3].into(), 4420)];
        p.in_sync = Some(BTreeSet::from([0, 1, 2]));
        let noted = BTreeMap::from([(1, "u-1".to_string()), (2, "u-2".to_string())]);
        // r1's node serves another lvol now; r2's the same; r0 local has no note
        let now = BTreeMap::from([(1, "u-1b".to_string()), (2, "u-2".to_string())]);
        let remade = |noted: &BTreeMap<usize, String>, now: &BTreeMap<usize, String>| -> BTreeSet<usize> {
            super::super::made_again(noted, |k| now.get(k).cloned())
                .into_keys()
                .collect()
        };
        assert_eq!(
            super::super::made_again(&noted, |k| now.get(k).cloned()),
            BTreeMap::from([(1, ("u-1".to_string(), "u-1b".to_string()))])
        );
        // nothing noted (a ledger from before), or the node not asked: not judged
        assert!(remade(&BTreeMap::new(), &now).is_empty());
        assert!(remade(&noted, &BTreeMap::new()).is_empty());
        let l = local_plan(vec![local_replica(0, 10 * MIB, 0, false)]);
        let mut t = Trust::new(&p, &l);
        t.remade = remade(&noted, &now);
        assert_eq!(trusted(&t, 0..3), vec![0, 2]);
        // r2's node did not say which lvol it serves as the engine is made: not judged, not trusted
        t.unjudged = BTreeSet::from([2]);
        assert_eq!(trusted(&t, 0..3), vec![0]);
    }

    /// A local replica whose lvol is in another lvstore than the ledger
    /// noted (its disk formatted, the lvol made again there by a pass that
    /// was cut off before the ledger heard of it) exists, is in the ledger,
    /// and is still never trusted.
    #[test]
    fn a_local_replica_in_another_lvstore_than_noted_is_never_trusted() {
        let mut p = vplan(10, 2, true);
        p.in_sync = Some(BTreeSet::from([0, 1]));
        // r0's lvol listed in its lvstore as noted; r1's disk formatted: its
        // lvol (made by the pass cut off, or now) in a new lvstore
        p.noted.lvstores = BTreeMap::from([(0, "u-talon-d0".to_string()), (1, "lvs-c".to_string())]);
        let l = local_plan(vec![
            local_replica(0, 10 * MIB, 0, false),
            local_replica(1, 10 * MIB, 0, false),
        ]);
        let mut inv = Inventory::default();
        crate::spdk::inventory::testing::add_lvol(
            &mut inv,
            crate::spdk::inventory::testing::TestLvol {
                lvs: "talon-d0",
                name: "v-r0",
                bytes: 10 * MIB,
                ..Default::default()
            },
        );
        inv.lvstores.push(crate::spdk::rpc::Lvstore {
            uuid: "lvs-c2".into(),
            name: naming::lvstore("d1"),
            base_bdev: "talon-disk-d1".into(),
            total_data_clusters: 100,
            free_clusters: 100,
            block_size: 4096,
            cluster_size: MIB,
        });
        let now = local_lvstores(&inv, &l);
        assert_eq!(
            now,
            BTreeMap::from([(0, "u-talon-d0".to_string()), (1, "lvs-c2".to_string())])
        );
        let mut t = Trust::new(&p, &l);
        assert_eq!(trusted(&t, 0..2), vec![0, 1], "before the notes are read");
        t.moved = super::super::made_again(&p.noted.lvstores, |k| now.get(k).cloned())
            .into_keys()
            .collect();
        assert_eq!(trusted(&t, 0..2), vec![0]);
    }

    #[test]
    fn without_a_ledger_existing_replicas_are_trusted_or_all_of_a_new_volume() {
        let p = vplan(10, 2, true);
        let fresh = local_plan(vec![
            local_replica(0, 10 * MIB, 0, true),
            local_replica(1, 10 * MIB, 0, true),
        ]);
        assert_eq!(trusted(&Trust::new(&p, &fresh), 0..2), vec![0, 1]);
        let half = local_plan(vec![
            local_replica(0, 10 * MIB, 0, false),
            local_replica(1, 10 * MIB, 0, true),
        ]);
        assert_eq!(trusted(&Trust::new(&p, &half), 0..2), vec![0]);
    }

    #[test]
    fn a_new_clone_trusts_its_point_in_time_set_only() {
        let mut p = vplan(10, 3, true);
        p.from_snapshot = Some((
            ObjectName::parse("volume", "src").expect("name"),
            ObjectName::parse("snapshot", "s").expect("name"),
        ));
        let mut l = local_plan((0..3).map(|k| local_replica(k, 10 * MIB, 0, true)).collect());
        l.clone_set = BTreeSet::from([1]);
        assert_eq!(trusted(&Trust::new(&p, &l), 0..3), vec![1]);
    }

    #[test]
    fn a_volume_from_a_backup_trusts_the_restored_and_those_a_run_before_made() {
        let mut p = vplan(10, 3, true);
        p.restore = Some(plan::RestoreFile {
            from: crate::spdk::volume::mover::restore::Source::File("/tmp/restored".into()),
            data_offset: 0,
        });
        // all made now: only the restored one
        let mut l = local_plan((0..3).map(|k| local_replica(k, 10 * MIB, 0, true)).collect());
        l.restored = BTreeSet::from([0]);
        assert_eq!(trusted(&Trust::new(&p, &l), 0..3), vec![0]);
        // a run before made r0 and r1 (restored then); r2 is made now
        let mut l = local_plan(vec![
            local_replica(0, 10 * MIB, 0, false),
            local_replica(1, 10 * MIB, 0, false),
            local_replica(2, 10 * MIB, 0, true),
        ]);
        l.restored = BTreeSet::new();
        assert_eq!(trusted(&Trust::new(&p, &l), 0..4), vec![0, 1]);
    }

    #[test]
    fn one_replica_is_its_own_engine_only_when_trusted() {
        let mut p = vplan(10, 1, false);
        let l = local_plan(vec![local_replica(0, 10 * MIB, 0, false)]);
        let replicas = vec![info(0, 10 * MIB)];
        let (device, sync) = lone_engine(&p, &replicas, &Trust::new(&p, &l)).expect("trusted");
        assert_eq!(device, "bdev-0");
        assert_eq!(sync.in_sync, BTreeSet::from([0]));
        assert!(sync.rebuilding.is_none() && sync.stale.is_empty());
        p.in_sync = Some(BTreeSet::new());
        let e = lone_engine(&p, &replicas, &Trust::new(&p, &l)).expect_err("not in the ledger");
        assert!(matches!(e, VolumeError::NoCurrentReplica { .. }), "{e:?}");
        let e = lone_engine(&p, &[], &Trust::new(&p, &l)).expect_err("no replica");
        assert!(matches!(e, VolumeError::NoCurrentReplica { .. }), "{e:?}");
    }

    #[test]
    fn the_size_is_looked_up_only_for_a_raid_that_may_have_changed() {
        assert_eq!(size_from(true, true, true), SizeFrom::LookUp);
        assert_eq!(size_from(true, false, false), SizeFrom::LookUp, "raid not listed");
        assert_eq!(size_from(true, false, true), SizeFrom::Listed);
        assert_eq!(size_from(false, true, false), SizeFrom::Replicas);
        assert_eq!(size_from(false, false, true), SizeFrom::Replicas);
    }

    #[test]
    fn the_smallest_replica_counts_without_its_room() {
        let p = vplan(10, 2, true);
        let l = local_plan(vec![
            local_replica(0, 14 * MIB, 4 * MIB, false),
            local_replica(1, 12 * MIB, MIB, false),
        ]);
        let rooms = Rooms::new(&p, &l);
        assert_eq!(
            min_replica(&[info(0, 14 * MIB), info(1, 12 * MIB)], &rooms),
            10 * MIB
        );
        assert_eq!(
            min_replica(&[info(0, 20 * MIB), info(1, 12 * MIB)], &rooms),
            11 * MIB
        );
        assert_eq!(min_replica(&[], &rooms), 0);
    }

    #[test]
    fn a_raid_smaller_than_its_smallest_replica_did_not_grow() {
        let e = check_grown("v", "talon-raid-v", true, 9 * MIB, 10 * MIB).expect_err("smaller");
        assert!(
            matches!(&e, VolumeError::RaidDidNotGrow { raid, actual, wanted, .. }
                if raid == "talon-raid-v" && *actual == 9 * MIB && *wanted == 10 * MIB),
            "{e:?}"
        );
        assert!(check_grown("v", "talon-raid-v", true, 10 * MIB, 10 * MIB).is_ok());
        assert!(
            check_grown("v", "bdev-0", false, 9 * MIB, 10 * MIB).is_ok(),
            "no raid"
        );
    }

    #[test]
    fn replica_facts_take_the_listed_lvol_or_the_one_made_now() {
        let mut inv = Inventory::default();
        inv.lvstores.push(Lvstore {
            uuid: "u-d0".into(),
            name: "talon-d0".into(),
            base_bdev: "talon-disk-d0".into(),
            total_data_clusters: 1024,
            free_clusters: 1024,
            block_size: 4096,
            cluster_size: 4 * MIB,
        });
        inv.lvols.insert(
            "talon-d0/v-r0".into(),
            Lvol {
                alias: "talon-d0/v-r0".into(),
                uuid: "uuid-0".into(),
                name: "v-r0".into(),
                is_thin_provisioned: true,
                is_snapshot: false,
                is_clone: false,
                is_esnap_clone: false,
                num_allocated_clusters: 3,
                lvs: LvolStoreRef {
                    name: "talon-d0".into(),
                    uuid: "u-d0".into(),
                },
            },
        );
        let l = local_plan(vec![
            local_replica(0, 10 * MIB, 0, false),
            local_replica(1, 10 * MIB, 0, true),
        ]);
        let new = HashMap::from([("talon-d1/v-r1".to_owned(), "uuid-1".to_owned())]);
        let facts = replica_facts(&inv, &l, &new);
        assert_eq!(facts.len(), 2);
        assert_eq!(
            (facts[0].bdev.as_str(), facts[0].allocated_bytes),
            ("uuid-0", 12 * MIB)
        );
        assert_eq!((facts[1].bdev.as_str(), facts[1].allocated_bytes), ("uuid-1", 0));
        assert_eq!(facts[1].size_bytes, 10 * MIB);
    }
}
