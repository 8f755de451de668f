//! The raid1 of [`VolumeOps`]: made over the replicas the plan says are
//! current (a `bdev_null` placeholder while one is missing), grown with a
//! member that is back, and which members serve now.

use std::collections::BTreeSet;

use super::rebuild;
use super::{
    Inventory, Made, NULL_PREFIX, REMOTE_PREFIX, ReplicaInfo, SyncState, VolumeError, VolumeOps, VolumePlan,
    ignore_missing, naming, no_current, rpc,
};
use crate::spdk::client::ClientError;
use crate::spdk::error::ErrorKind;
use crate::spdk::rpc::{
    ByName, GetRaids, NullCreate, QosLimit, RaidAddBaseBdev, RaidBdev, RaidCategory, RaidCreate, RaidDelete,
    RaidLevel,
};

/// How long after a listing that shows SPDK's rebuild of a member ended it
/// is listed again, to tell a rebuild that finished from one that failed
/// (the member is then being taken out: see
/// [`VolumeOps::raid_after_rebuild_end`]).
const REBUILD_END_SETTLE: std::time::Duration = std::time::Duration::from_millis(250);

impl VolumeOps {
    /// Raid `raid` listed again [`REBUILD_END_SETTLE`] after a listing that
    /// showed SPDK's rebuild of a member ended (the member configured, no
    /// process): the one judgement of how SPDK's rebuild ended, for talon's
    /// volumes and Longhorn's engines alike. v26.05 clears the raid's
    /// process in `raid_bdev_process_finish_quiesced` and takes out a target
    /// whose rebuild failed only after the unquiesce
    /// (`raid_bdev_process_finish_unquiesced`, then
    /// `_raid_bdev_remove_base_bdev`): a member this listing still has
    /// configured was rebuilt. `None` when the raid is gone or runs a
    /// process again (nothing can be judged from it now).
    pub async fn raid_after_rebuild_end(&self, raid: &str) -> Result<Option<RaidBdev>, ClientError> {
        tokio::time::sleep(REBUILD_END_SETTLE).await;
        let raids = self
            .client
            .bdev_raid_get_bdevs(&GetRaids {
                category: RaidCategory::All,
            })
            .await?;
        Ok(raids.into_iter().find(|x| x.name == raid && x.process.is_none()))
    }

    /// The raid1 of a volume with two or more replicas: made from the
    /// replicas that are up to date (empty slots, through short-lived
    /// `bdev_null` placeholders, for the others), then each replica that is
    /// behind is added to it, which makes SPDK rebuild it from the others;
    /// one rebuild at a time. A raid that exists is only completed.
    pub(super) async fn ensure_raid(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        replicas: &[ReplicaInfo],
        trusted: &(dyn Fn(usize) -> bool + Sync),
        made: &mut Vec<Made>,
    ) -> Result<(String, SyncState), VolumeError> {
        let vol = plan.name.as_str();
        let raid = naming::raid(vol);
        let k_of = |member: &str| {
            replicas
                .iter()
                .find(|r| r.bdev == member || r.alias == member)
                .map(|r| r.k)
        };
        let mut sync = SyncState::default();
        // a replica taken out of SPDK's rebuild this call: rebuilt thin from the next call
        let mut held_back: Option<usize> = None;
        // assembled by SPDK from a superblock that names members not here:
        // what they hold is newer than what is here, so nothing is touched
        if let Some(r) = inv.raid(&raid).filter(|r| r.state == "configuring") {
            return Err(VolumeError::RaidAssembling {
                volume: vol.to_owned(),
                raid,
                present: r.num_base_bdevs_discovered,
                needed: r.num_base_bdevs_operational,
            });
        }
        let existing = inv.raid(&raid).filter(|r| r.serves(|n| k_of(n).is_some()));
        match existing {
            Some(r) => {
                // a placeholder left by an interrupted call: out before anything reads it
                for b in &r.base_bdevs_list {
                    if let Some(n) = b.name.as_deref().filter(|n| n.starts_with(NULL_PREFIX)) {
                        ignore_missing(self.client.bdev_raid_remove_base_bdev(&ByName::new(n)))
                            .await
                            .map_err(rpc(vol, format!("removing placeholder {n} from {raid}")))?;
                    }
                }
                let mut target = r
                    .process
                    .as_ref()
                    .and_then(|p| Some((k_of(&p.target)?, p.progress.percent)));
                sync.in_sync = r
                    .base_bdevs_list
                    .iter()
                    .filter(|b| b.is_configured)
                    .filter_map(|b| k_of(b.name.as_deref()?))
                    .filter(|k| target.is_none_or(|(t, _)| t != *k))
                    .collect();
                // a replica that came back with the raid's superblock (a local
                // one, or a remote one whose node talon can call) is re-added
                // by SPDK's examine with a full rebuild (every block): taken
                // out again, it is rebuilt thin from a local one instead
                if let (Some((t, _)), Some(p)) = (target, r.process.as_ref())
                    && (t < plan.replicas || rebuild::remote_dest(plan, t).is_some())
                    && self.thin_rebuild
                    && self.rebuilds.thin_allowed(vol)
                    && sync.in_sync.iter().any(|k| *k < plan.replicas)
                {
                    match self
                        .client
                        .bdev_raid_remove_base_bdev(&ByName::new(&p.target))
                        .await
                    {
                        Ok(_) => {
                            tracing::info!(
                                volume = vol,
                                replica = t,
                                "SPDK's full rebuild of a returning replica stopped: rebuilt thin instead"
                            );
                            target = None;
                            held_back = Some(t);
                        }
                        Err(e) => {
                            tracing::warn!(volume = vol, replica = t, error = %crate::util::error_chain(&e),
                                "SPDK's full rebuild of a returning replica could not be stopped; it goes on")
                        }
                    }
                }
                sync.rebuilding = target;
                // a member the ledger does not trust, configured with no
                // rebuild running: SPDK's rebuild of it has ended. v26.05
                // clears the raid's process before it takes out a target
                // whose rebuild failed (`raid_bdev_process_finish_quiesced`,
                // then the unquiesce, then `_raid_bdev_remove_base_bdev`), so
                // a listing in between shows that target configured; it is
                // trusted only if a listing a moment later still has it
                if target.is_none() && held_back.is_none() {
                    let ended: Vec<usize> = sync.in_sync.iter().copied().filter(|k| !trusted(*k)).collect();
                    if let Some(&k) = ended.first() {
                        let again = self
                            .raid_after_rebuild_end(&raid)
                            .await
                            .map_err(rpc(vol, format!("listing raid {raid} again after a rebuild")))?;
                        let still =
                            |k: usize| again.as_ref().is_some_and(|x| x.serves(|n| k_of(n) == Some(k)));
                        let gone: Vec<usize> = ended.iter().copied().filter(|k| !still(*k)).collect();
                        for &g in &gone {
                            tracing::warn!(
                                volume = vol,
                                replica = g,
                                "SPDK's rebuild of a replica ended without it: not trusted, rebuilt again"
                            );
                            sync.in_sync.remove(&g);
                        }
                        if let Some(&g) = gone.first() {
                            held_back = Some(g);
                        } else {
                            tracing::debug!(
                                volume = vol,
                                replica = k,
                                "SPDK's rebuild of a replica ended with it in the raid"
                            );
                        }
                    }
                }
            }
            None => {
                if let Some(r) = inv.raid(&raid) {
                    // no replica of ours serves in it any more: made again below
                    ignore_missing(self.client.bdev_raid_delete(&RaidDelete::new(&r.name)))
                        .await
                        .map_err(rpc(vol, format!("deleting raid {raid} that lost every replica")))?;
                }
                let good: Vec<&ReplicaInfo> = replicas.iter().filter(|r| trusted(r.k)).collect();
                let Some(first) = good.first() else {
                    return Err(no_current(plan, replicas));
                };
                let (block_size, num_blocks) = match inv.bdevs.get(&first.bdev) {
                    Some(b) => (b.block_size, b.num_blocks),
                    None => match self
                        .client
                        .bdev(&first.bdev)
                        .await
                        .map_err(rpc(vol, format!("looking up replica {}", first.alias)))?
                    {
                        Some(b) => (b.block_size, b.num_blocks),
                        None => (4096, first.size_bytes / 4096),
                    },
                };
                let members: Vec<Option<String>> = (0..plan.replicas + plan.remote.len())
                    .map(|k| good.iter().find(|r| r.k == k).map(|r| r.bdev.clone()))
                    .collect();
                self.create_raid(
                    inv,
                    vol,
                    &members,
                    (block_size, num_blocks),
                    plan.uses_superblock(),
                    made,
                )
                .await?;
                sync.in_sync = good.iter().map(|r| r.k).collect();
            }
        }
        // replicas that are behind join one at a time; SPDK rebuilds each from the others
        let behind: Vec<&ReplicaInfo> = replicas
            .iter()
            .filter(|r| !sync.in_sync.contains(&r.k) && sync.rebuilding.is_none_or(|(t, _)| t != r.k))
            .collect();
        // a replica back in service loses its rebuild cap (set by talon;
        // also one left by a rebuild a restart interrupted)
        for r in replicas.iter().filter(|r| sync.in_sync.contains(&r.k)) {
            let capped = inv
                .bdevs
                .get(&r.bdev)
                .and_then(|b| b.assigned_rate_limits.as_ref())
                .is_some_and(|l| l.rw_mbytes_per_sec > 0);
            if capped
                && let Err(e) = self
                    .client
                    .bdev_set_qos_limit(&QosLimit {
                        name: r.bdev.clone(),
                        rw_mbytes_per_sec: 0,
                    })
                    .await
            {
                tracing::warn!(volume = vol, replica = %r.name, error = %e, "rebuild cap not lifted yet");
            }
        }
        if let Some(k) = held_back {
            sync.stale.extend(behind.iter().map(|r| r.k).filter(|b| *b != k));
            sync.rebuilding = Some((k, 0));
            return Ok((raid, sync));
        }
        let mut behind = behind.into_iter();
        // thin: a local replica, or a remote one whose node talon can call,
        // from a local up-to-date one, into a raid that stands (SPDK's full
        // rebuild for the others, and for a volume whose thin rebuilds keep
        // failing)
        let online = inv
            .raid(&raid)
            .filter(|r| r.state == "online" && r.process.is_none());
        let source = replicas
            .iter()
            .filter(|r| r.k < plan.replicas && sync.in_sync.contains(&r.k))
            .find(|r| inv.lvols.contains_key(&r.alias));
        if sync.rebuilding.is_none()
            && self.thin_rebuild
            && self.rebuilds.thin_allowed(vol)
            && let (Some(online), Some(src)) = (online, source)
            && let Some(r) = behind.clone().find(|r| {
                (r.k < plan.replicas || rebuild::remote_dest(plan, r.k).is_some())
                    && rebuild::same_room(inv, plan, src, r)
            })
        {
            let members: Vec<Option<String>> = (0..plan.replicas + plan.remote.len())
                .map(|k| {
                    replicas
                        .iter()
                        .find(|m| m.k == k && sync.in_sync.contains(&k))
                        .map(|m| m.bdev.clone())
                })
                .collect();
            let rest: Vec<&ReplicaInfo> = behind.filter(|b| b.k != r.k).collect();
            match self.thin_rebuild(inv, plan, online, src, r, &members).await {
                Ok(rebuild::Step::Copying(pct)) => sync.rebuilding = Some((r.k, pct)),
                Ok(rebuild::Step::Joined) => {
                    sync.in_sync.insert(r.k);
                }
                // logged with the failure count; the replica stays behind
                Err(_) => sync.stale.push(r.k),
            }
            sync.stale.extend(rest.into_iter().map(|r| r.k));
            return Ok((raid, sync));
        }
        if sync.rebuilding.is_none()
            && !self.rebuilds.running(vol)
            && let Some(r) = behind.next()
        {
            // SPDK's rebuild writes to it (and so do the volume's writes to
            // the part already rebuilt): capped until it is back
            match self.add_member(&raid, &r.bdev, plan.rebuild_mib_per_sec).await {
                Ok(_) => {
                    tracing::info!(volume = vol, replica = %r.name, "rebuilding replica from the up-to-date ones");
                    sync.rebuilding = Some((r.k, 0));
                }
                // another process runs (SPDK allows one): the next reconcile adds it
                Err(e) if e.is(ErrorKind::Busy) => sync.stale.push(r.k),
                // it cannot join now (a remote replica whose controller is
                // failing, a member SPDK refuses): it stays behind and is
                // tried again; the volume goes on from the up-to-date ones
                Err(e) => {
                    tracing::warn!(volume = vol, replica = %r.name, error = %crate::util::error_chain(&e),
                        "replica cannot join the raid to be rebuilt; tried again at the next reconcile");
                    // a remote replica with a superblock rejoins through SPDK's
                    // examine (it keeps its slot by UUID, and an add that failed
                    // half-way leaves the slot taken): its controller is
                    // attached afresh at the next reconcile, and examine
                    // re-adds it by a rebuild
                    if r.k >= plan.replicas && plan.uses_superblock() {
                        let ctrl = format!("{REMOTE_PREFIX}{}", r.name);
                        let _ = super::lvol::detach_controller(&self.client, &ctrl).await;
                    }
                    sync.stale.push(r.k);
                }
            }
        } else if sync.rebuilding.is_none() && !self.rebuilds.running(vol) && sync.in_sync.len() > 1 {
            // nothing to rebuild: rebuild snapshots left by one that ended
            // (or stopped) are merged away
            self.drop_rebuild_snapshots(inv, vol).await;
        }
        sync.stale.extend(behind.map(|r| r.k));
        Ok((raid, sync))
    }

    /// Creates raid1 `talon-raid-<vol>` over `members` (slot k: a bdev, or
    /// `None` for a replica that joins later): see [`Self::raid1_in`], the
    /// placeholders named `talon-null-<vol>-r<k>`. With `superblock`, SPDK
    /// writes the raid's superblock on the members.
    pub(super) async fn create_raid(
        &self,
        inv: &Inventory,
        vol: &str,
        members: &[Option<String>],
        geometry: (u32, u64),
        superblock: bool,
        made: &mut Vec<Made>,
    ) -> Result<(), VolumeError> {
        let slot = |k: usize| format!("{NULL_PREFIX}{}", naming::replica(vol, k));
        self.raid1_in(
            inv,
            vol,
            &naming::raid(vol),
            members,
            geometry,
            Some(superblock),
            &slot,
            made,
        )
        .await
    }

    /// Raid1 `raid` over `members` (slot k: a bdev, or `None` for one that
    /// joins later): a missing slot is held by a `bdev_null` placeholder
    /// (`placeholder(k)`, of `geometry`: block size, blocks) while the raid
    /// is made, then emptied (SPDK makes a raid1 of two or more bdevs only).
    /// Errors name `vol`; what it made is in `made` for the caller to undo.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn raid1_in(
        &self,
        inv: &Inventory,
        vol: &str,
        raid: &str,
        members: &[Option<String>],
        (block_size, num_blocks): (u32, u64),
        superblock: Option<bool>,
        placeholder: &(dyn Fn(usize) -> String + Sync),
        made: &mut Vec<Made>,
    ) -> Result<(), VolumeError> {
        let raid = raid.to_owned();
        let mut bases = Vec::new();
        let mut nulls = Vec::new();
        for (k, m) in members.iter().enumerate() {
            match m {
                Some(b) => bases.push(b.clone()),
                None => {
                    let n = placeholder(k);
                    if !inv.bdevs.contains_key(&n) {
                        self.client
                            .bdev_null_create(&NullCreate {
                                name: n.clone(),
                                num_blocks,
                                block_size,
                            })
                            .await
                            .map_err(rpc(vol, format!("creating placeholder {n}")))?;
                    }
                    made.push(Made::Null(n.clone()));
                    bases.push(n.clone());
                    nulls.push(n);
                }
            }
        }
        self.client
            .bdev_raid_create(&RaidCreate {
                name: raid.clone(),
                raid_level: RaidLevel::Raid1,
                base_bdevs: bases.clone(),
                strip_size_kb: None,
                uuid: None,
                superblock,
            })
            .await
            .map_err(rpc(
                vol,
                format!("creating raid1 {raid} over {}", bases.join(", ")),
            ))?;
        made.push(Made::Raid(raid.clone(), superblock.unwrap_or(false)));
        for n in &nulls {
            self.client
                .bdev_raid_remove_base_bdev(&ByName::new(n))
                .await
                .map_err(rpc(
                    vol,
                    format!("emptying the slot of placeholder {n} in {raid}"),
                ))?;
            ignore_missing(self.client.bdev_null_delete(&ByName::new(n)))
                .await
                .map_err(rpc(vol, format!("deleting placeholder {n}")))?;
        }
        Ok(())
    }

    /// Adds `member` to raid1 `raid`: SPDK's rebuild writes it from the
    /// other members. With `cap` (MB/s), its reads and writes are capped
    /// once the raid has it open (on v26.05 a limit set on a bdev nobody has
    /// open cannot be changed or lifted again). Returns whether the cap is
    /// on: one SPDK refuses is logged, and the rebuild runs uncapped.
    pub async fn add_member(&self, raid: &str, member: &str, cap: Option<u64>) -> Result<bool, ClientError> {
        self.client
            .bdev_raid_add_base_bdev(&RaidAddBaseBdev {
                raid_bdev: raid.to_owned(),
                base_bdev: member.to_owned(),
            })
            .await?;
        let Some(mbps) = cap.filter(|m| *m > 0) else {
            return Ok(false);
        };
        match super::lvol::set_qos_cap(&self.client, member, mbps).await {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::warn!(raid, member, error = %crate::util::error_chain(&e), "the rebuild runs uncapped");
                Ok(false)
            }
        }
    }

    /// The members raid `raid` serves from now: configured and not the
    /// target of a rebuild (by name; empty when it is gone).
    pub(super) async fn raid_serves(&self, raid: &str) -> Result<BTreeSet<String>, ClientError> {
        let all = self
            .client
            .bdev_raid_get_bdevs(&crate::spdk::rpc::GetRaids {
                category: crate::spdk::rpc::RaidCategory::All,
            })
            .await?;
        let Some(r) = all.into_iter().find(|r| r.name == raid) else {
            return Ok(BTreeSet::new());
        };
        let target = r.process.as_ref().map(|p| p.target.clone());
        Ok(r.base_bdevs_list
            .into_iter()
            .filter(|b| b.is_configured)
            .filter_map(|b| b.name)
            .filter(|n| Some(n) != target.as_ref())
            .collect())
    }
}
