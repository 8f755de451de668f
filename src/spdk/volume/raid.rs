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
    ByName, GetBdevs, GetRaids, NullCreate, QosLimit, RaidAddBaseBdev, RaidBdev, RaidCategory, RaidCreate,
    RaidDelete, RaidLevel,
};

/// How long after a listing that shows SPDK's rebuild of a member ended it
/// is listed again, to tell a rebuild that finished from one that failed
/// (the member is then being taken out: see
/// [`VolumeOps::raid_after_rebuild_end`]).
const REBUILD_END_SETTLE: std::time::Duration = std::time::Duration::from_millis(250);

impl VolumeOps {
    /// Takes member `slot` out of its raid (one in none is no error); the
    /// listing says so after [`Inventory::empty_slot`].
    pub async fn take_out_member(&self, slot: &str) -> Result<(), ClientError> {
        super::lvol::remove_raid_member(&self.client, slot).await
    }

    /// Caps (0 lifts) the reads and writes of bdev `member` at `mbps` MB/s:
    /// a rebuild's writes into a raid member or a rebuild dest's head. Only
    /// on a bdev someone has open (on v26.05 a cap set on a bdev nobody has
    /// open cannot be lifted again): a raid member, or a head its export holds.
    pub async fn cap_rebuild_writes(&self, member: &str, mbps: u64) -> Result<(), ClientError> {
        super::lvol::set_qos_cap(&self.client, member, mbps).await
    }

    /// Detaches the NVMe-oF controller `controller` of a remote member (one
    /// not there is no error) and drops it and its namespace's bdev
    /// (`<controller>n1`) from `inv`.
    pub async fn detach_remote(&self, inv: &mut Inventory, controller: &str) -> Result<(), ClientError> {
        super::lvol::detach_controller(&self.client, controller).await?;
        inv.forget_controller(controller);
        Ok(())
    }
}

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
        again: MadeAgain<'_>,
        made: &mut Vec<Made>,
    ) -> Result<(String, SyncState), VolumeError> {
        let vol = plan.name.as_str();
        let raid = naming::raid(vol);
        // assembled by SPDK from a superblock that waits only for members
        // made again since (empty, with no superblock: they never join it;
        // what it waits for went with their disk): given up, made below
        // from the current members
        let given_up = match inv.raid(&raid) {
            Some(r) if r.state == "configuring" && self.waits_only_for(r, replicas, again).await => {
                tracing::warn!(volume = vol, raid = %raid, remote = ?again.remote, local = ?again.local,
                    "the raid's superblock waits only for replicas made again since: made again without them");
                // its superblock cleared on the members it has: SPDK refuses a
                // member with another raid's superblock ("Superblock of a
                // different raid bdev found", -EEXIST) in the raid made below
                let delete = RaidDelete {
                    name: raid.clone(),
                    clear_sb: Some(true),
                };
                ignore_missing(self.client.bdev_raid_delete(&delete))
                    .await
                    .map_err(rpc(
                        vol,
                        format!("giving up raid {raid} that waits for replicas made again"),
                    ))?;
                true
            }
            _ => false,
        };
        let listed = inv.raid(&raid).filter(|_| !given_up);
        // assembled by SPDK from a superblock that names members not here:
        // what they hold is newer than what is here, so nothing is touched
        check_assembling(vol, &raid, listed)?;
        let existing = listed.filter(|r| r.serves(|n| member_k(replicas, n).is_some()));
        // held back: a replica taken out of SPDK's rebuild this call, rebuilt
        // thin from the next call
        let (mut sync, held_back) = match existing {
            Some(r) => self.judge_existing(plan, &raid, r, replicas, trusted).await?,
            None => (
                self.make_new(inv, plan, &raid, replicas, trusted, made).await?,
                None,
            ),
        };
        // replicas that are behind join one at a time; SPDK rebuilds each from the others
        let behind = behind(replicas, &sync);
        self.lift_caps(inv, vol, replicas, &sync.in_sync).await;
        if let Some(k) = held_back {
            hold_back(&mut sync, &behind, k);
            return Ok((raid, sync));
        }
        self.next_rebuild(inv, plan, &raid, replicas, behind, &mut sync)
            .await;
        Ok((raid, sync))
    }

    /// Whether raid `r`, configuring from a superblock, waits only for
    /// members made again since (see [`waits_only_for`]).
    async fn waits_only_for(&self, r: &RaidBdev, replicas: &[ReplicaInfo], again: MadeAgain<'_>) -> bool {
        let mut uuids = BTreeSet::new();
        for m in replicas.iter().filter(|m| again.remote.contains(&m.k)) {
            if let Ok(Some(b)) = self.client.bdev(&m.bdev).await
                && let Some(u) = b.uuid
            {
                uuids.insert(u);
            }
        }
        let configured: BTreeSet<usize> = configured(r, replicas).collect();
        let gone_local = again.local.iter().filter(|k| !configured.contains(k)).count();
        waits_only_for(r, &uuids, gone_local)
    }

    /// How the replicas stand in raid `raid` as listed (`r`, serving one of
    /// them): placeholders left by an interrupted call removed first; the
    /// members in sync and the rebuild target from the listing; SPDK's full
    /// rebuild of a returning replica taken over by a thin one; a rebuild
    /// that ended judged by a second listing. Returns the state and the
    /// replica held back for a thin rebuild, if any.
    async fn judge_existing(
        &self,
        plan: &VolumePlan,
        raid: &str,
        r: &RaidBdev,
        replicas: &[ReplicaInfo],
        trusted: &(dyn Fn(usize) -> bool + Sync),
    ) -> Result<(SyncState, Option<usize>), VolumeError> {
        let vol = plan.name.as_str();
        self.remove_placeholders(vol, raid, r).await?;
        let (mut target, in_sync) = listed_sync(r, replicas);
        let mut sync = SyncState {
            in_sync,
            ..SyncState::default()
        };
        let mut held_back = None;
        // a replica that came back with the raid's superblock (a local
        // one, or a remote one whose node talon can call) is re-added
        // by SPDK's examine with a full rebuild (every block): taken
        // out again, it is rebuilt thin from a local one instead
        if let (Some((t, _)), Some(p)) = (target, r.process.as_ref())
            && thin_can_take(plan, t, &sync.in_sync)
            && self.thin_rebuild
            && self.rebuilds.thin_allowed(vol)
            && self.stop_full_rebuild(vol, t, &p.target).await
        {
            target = None;
            held_back = Some(t);
        }
        sync.rebuilding = target;
        if target.is_none() && held_back.is_none() {
            held_back = self
                .judge_rebuild_end(vol, raid, replicas, trusted, &mut sync.in_sync)
                .await?;
        }
        Ok((sync, held_back))
    }

    /// Removes from raid `raid` (listed as `r`) the placeholders an
    /// interrupted call left, before anything reads it.
    async fn remove_placeholders(&self, vol: &str, raid: &str, r: &RaidBdev) -> Result<(), VolumeError> {
        for b in &r.base_bdevs_list {
            if let Some(n) = b.name.as_deref().filter(|n| n.starts_with(NULL_PREFIX)) {
                ignore_missing(self.client.bdev_raid_remove_base_bdev(&ByName::new(n)))
                    .await
                    .map_err(rpc(vol, format!("removing placeholder {n} from {raid}")))?;
            }
        }
        Ok(())
    }

    /// Stops SPDK's full rebuild of replica `t` (member `target`) by taking
    /// it out of the raid; returns whether it was taken out (if not, the
    /// full rebuild goes on, logged).
    async fn stop_full_rebuild(&self, vol: &str, t: usize, target: &str) -> bool {
        match self.client.bdev_raid_remove_base_bdev(&ByName::new(target)).await {
            Ok(_) => {
                tracing::info!(
                    volume = vol,
                    replica = t,
                    "SPDK's full rebuild of a returning replica stopped: rebuilt thin instead"
                );
                true
            }
            Err(e) => {
                tracing::warn!(volume = vol, replica = t, error = %crate::util::error_chain(&e),
                    "SPDK's full rebuild of a returning replica could not be stopped; it goes on");
                false
            }
        }
    }

    /// A member the ledger does not trust, configured with no rebuild
    /// running: SPDK's rebuild of it has ended. v26.05 clears the raid's
    /// process before it takes out a target whose rebuild failed
    /// (`raid_bdev_process_finish_quiesced`, then the unquiesce, then
    /// `_raid_bdev_remove_base_bdev`), so a listing in between shows that
    /// target configured; it is trusted only if a listing a moment later
    /// still has it. The others leave `in_sync`; the first of them is
    /// returned, to be rebuilt again.
    async fn judge_rebuild_end(
        &self,
        vol: &str,
        raid: &str,
        replicas: &[ReplicaInfo],
        trusted: &(dyn Fn(usize) -> bool + Sync),
        in_sync: &mut BTreeSet<usize>,
    ) -> Result<Option<usize>, VolumeError> {
        let ended: Vec<usize> = in_sync.iter().copied().filter(|k| !trusted(*k)).collect();
        let Some(&k) = ended.first() else {
            return Ok(None);
        };
        let again = self
            .raid_after_rebuild_end(raid)
            .await
            .map_err(rpc(vol, format!("listing raid {raid} again after a rebuild")))?;
        let gone = left_out(&ended, again.as_ref(), replicas);
        for &g in &gone {
            tracing::warn!(
                volume = vol,
                replica = g,
                "SPDK's rebuild of a replica ended without it: not trusted, rebuilt again"
            );
            in_sync.remove(&g);
        }
        if let Some(&g) = gone.first() {
            return Ok(Some(g));
        }
        tracing::debug!(
            volume = vol,
            replica = k,
            "SPDK's rebuild of a replica ended with it in the raid"
        );
        Ok(None)
    }

    /// Makes raid `raid` from the trusted replicas (a raid of that name
    /// that lost every replica of ours is deleted first); the others get
    /// empty slots. Returns the replicas in sync: the trusted ones.
    async fn make_new(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        raid: &str,
        replicas: &[ReplicaInfo],
        trusted: &(dyn Fn(usize) -> bool + Sync),
        made: &mut Vec<Made>,
    ) -> Result<SyncState, VolumeError> {
        let vol = plan.name.as_str();
        if let Some(r) = inv.raid(raid) {
            // no replica of ours serves in it any more: made again below
            ignore_missing(self.client.bdev_raid_delete(&RaidDelete::new(&r.name)))
                .await
                .map_err(rpc(vol, format!("deleting raid {raid} that lost every replica")))?;
        }
        let good: Vec<&ReplicaInfo> = replicas.iter().filter(|r| trusted(r.k)).collect();
        let Some(first) = good.first() else {
            return Err(no_current(plan, replicas));
        };
        let geometry = self.geometry(inv, vol, first).await?;
        let in_sync: BTreeSet<usize> = good.iter().map(|r| r.k).collect();
        let members = slots(plan.replicas + plan.remote.len(), replicas, &in_sync);
        self.create_raid(inv, vol, &members, geometry, plan.uses_superblock(), made)
            .await?;
        Ok(SyncState {
            in_sync,
            ..SyncState::default()
        })
    }

    /// The block size and count of replica `first`'s bdev: as listed, else
    /// looked up, else 4096-byte blocks over its size.
    async fn geometry(
        &self,
        inv: &Inventory,
        vol: &str,
        first: &ReplicaInfo,
    ) -> Result<(u32, u64), VolumeError> {
        let step = format!("looking up replica {}", first.alias);
        Ok(self
            .bdev_geometry(inv, vol, &first.bdev, step)
            .await?
            .unwrap_or((4096, first.size_bytes / 4096)))
    }

    /// A replica back in service loses its rebuild cap (set by talon; also
    /// one left by a rebuild a restart interrupted); one that stays is
    /// logged and lifted at a later call.
    async fn lift_caps(
        &self,
        inv: &Inventory,
        vol: &str,
        replicas: &[ReplicaInfo],
        in_sync: &BTreeSet<usize>,
    ) {
        for r in replicas.iter().filter(|r| in_sync.contains(&r.k)) {
            if capped(inv, &r.bdev)
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
    }

    /// Starts or steps the next rebuild of a replica `behind`: thin (a
    /// local replica, or a remote one whose node talon can call, from a
    /// local up-to-date one, into a raid that stands), else SPDK's full
    /// rebuild (for the others, and for a volume whose thin rebuilds keep
    /// failing); with nothing to rebuild, the rebuild snapshots left by one
    /// that ended go. The replicas left behind are stale.
    async fn next_rebuild(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        raid: &str,
        replicas: &[ReplicaInfo],
        behind: Vec<&ReplicaInfo>,
        sync: &mut SyncState,
    ) {
        let vol = plan.name.as_str();
        let mut behind = behind.into_iter();
        let online = inv
            .raid(raid)
            .filter(|r| r.state == "online" && r.process.is_none());
        let source = thin_source(inv, plan, replicas, &sync.in_sync);
        if sync.rebuilding.is_none()
            && self.thin_rebuild
            && self.rebuilds.thin_allowed(vol)
            && let (Some(online), Some(src)) = (online, source)
            && let Some(r) = behind.clone().find(|r| {
                (r.k < plan.replicas || rebuild::remote_dest(plan, r.k).is_some())
                    && rebuild::same_room(inv, plan, src, r)
            })
        {
            let members = slots(plan.replicas + plan.remote.len(), replicas, &sync.in_sync);
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
            return;
        }
        if sync.rebuilding.is_none()
            && !self.rebuilds.running(vol)
            && let Some(r) = behind.next()
        {
            self.full_rebuild(plan, raid, r, sync).await;
        } else if sync.rebuilding.is_none() && !self.rebuilds.running(vol) && sync.in_sync.len() > 1 {
            // nothing to rebuild: rebuild snapshots left by one that ended
            // (or stopped) are merged away
            self.drop_rebuild_snapshots(inv, vol).await;
        }
        sync.stale.extend(behind.map(|r| r.k));
    }

    /// Adds replica `r` to raid `raid` for SPDK's rebuild, which writes to
    /// it (and so do the volume's writes to the part already rebuilt):
    /// capped until it is back. One that cannot join now is stale, tried
    /// again at the next reconcile.
    async fn full_rebuild(&self, plan: &VolumePlan, raid: &str, r: &ReplicaInfo, sync: &mut SyncState) {
        let vol = plan.name.as_str();
        match self.add_member(raid, &r.bdev, plan.rebuild_mib_per_sec).await {
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
        // the listing may be older than the members (a new volume's replicas)
        let mut sized = Vec::new();
        for m in members.iter().flatten() {
            match listed_block_size(inv, m) {
                Some(s) => sized.push(s),
                None => {
                    let asked = GetBdevs {
                        name: Some(m.clone()),
                        timeout: None,
                    };
                    if let Ok(Some(b)) = self
                        .client
                        .bdev_get_bdevs(&asked)
                        .await
                        .map(|v| v.into_iter().next())
                    {
                        sized.push((
                            b.aliases.first().cloned().unwrap_or_else(|| m.clone()),
                            b.block_size,
                        ));
                    }
                }
            }
        }
        if let Some(members) = mixed_block_sizes(&sized) {
            return Err(VolumeError::MixedBlockSizes {
                volume: vol.to_owned(),
                raid,
                members,
            });
        }
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

/// The replica whose bdev (or alias) is `member`.
fn member_k(replicas: &[ReplicaInfo], member: &str) -> Option<usize> {
    replicas
        .iter()
        .find(|r| r.bdev == member || r.alias == member)
        .map(|r| r.k)
}

/// The replicas made again empty since the ledger noted them, which a raid's
/// superblock may still wait for.
#[derive(Debug, Clone, Copy)]
pub(super) struct MadeAgain<'a> {
    /// Remote replicas made again on their nodes: their bdev here (the
    /// export's namespace) keeps the UUID the superblock names.
    pub remote: &'a BTreeSet<usize>,
    /// Local replicas whose lvol is in another lvstore than noted (their
    /// disk formatted): a new lvol, a new UUID; the one the superblock names
    /// went with the old lvstore.
    pub local: &'a BTreeSet<usize>,
}

/// Whether raid `r` misses at least one member and every one it misses is
/// a replica made again: the bdev of one of `uuids` (remote), or, for the
/// rest, no more than `gone_local` (local replicas made again and not
/// configured in `r`, whose old lvol is gone). A slot of a replica merely
/// not loaded yet is one more than that count, and the raid waits.
fn waits_only_for(r: &RaidBdev, uuids: &BTreeSet<String>, gone_local: usize) -> bool {
    let missing: Vec<_> = r.base_bdevs_list.iter().filter(|b| !b.is_configured).collect();
    let unmatched = missing
        .iter()
        .filter(|b| !b.uuid.as_ref().is_some_and(|u| uuids.contains(u)))
        .count();
    !missing.is_empty() && unmatched <= gone_local
}

/// A raid SPDK is still assembling from a superblock (`configuring`) is
/// an error: members not here hold newer data.
fn check_assembling(vol: &str, raid: &str, listed: Option<&RaidBdev>) -> Result<(), VolumeError> {
    match listed.filter(|r| r.state == "configuring") {
        Some(r) => Err(VolumeError::RaidAssembling {
            volume: vol.to_owned(),
            raid: raid.to_owned(),
            present: r.num_base_bdevs_discovered,
            needed: r.num_base_bdevs_operational,
        }),
        None => Ok(()),
    }
}

/// From a raid's listing: the replica SPDK rebuilds and how far (percent),
/// and the replicas configured in it but that one.
fn listed_sync(r: &RaidBdev, replicas: &[ReplicaInfo]) -> (Option<(usize, u32)>, BTreeSet<usize>) {
    let target = r
        .process
        .as_ref()
        .and_then(|p| Some((member_k(replicas, &p.target)?, p.progress.percent)));
    let in_sync = configured(r, replicas)
        .filter(|k| target.is_none_or(|(t, _)| t != *k))
        .collect();
    (target, in_sync)
}

/// The replicas configured in raid `r` (a rebuild's target included).
fn configured<'a>(r: &'a RaidBdev, replicas: &'a [ReplicaInfo]) -> impl Iterator<Item = usize> + 'a {
    r.base_bdevs_list
        .iter()
        .filter(|b| b.is_configured)
        .filter_map(|b| member_k(replicas, b.name.as_deref()?))
}

/// Whether replica `t`, rebuilt by SPDK, may be rebuilt thin instead: a
/// local one or a remote one whose node talon can call, with a local
/// replica in sync to copy from.
fn thin_can_take(plan: &VolumePlan, t: usize, in_sync: &BTreeSet<usize>) -> bool {
    (t < plan.replicas || rebuild::remote_dest(plan, t).is_some())
        && in_sync.iter().any(|k| *k < plan.replicas)
}

/// The replicas of `ended` that the raid listed again (`again`; `None`:
/// gone or busy) no longer serves: their rebuild failed.
fn left_out(ended: &[usize], again: Option<&RaidBdev>, replicas: &[ReplicaInfo]) -> Vec<usize> {
    let still = |k: usize| again.is_some_and(|x| x.serves(|n| member_k(replicas, n) == Some(k)));
    ended.iter().copied().filter(|k| !still(*k)).collect()
}

/// The raid's slots, `count` of them: slot k holds replica k's bdev when
/// k is in `set`, else nothing.
fn slots(count: usize, replicas: &[ReplicaInfo], set: &BTreeSet<usize>) -> Vec<Option<String>> {
    (0..count)
        .map(|k| {
            replicas
                .iter()
                .find(|m| m.k == k && set.contains(&k))
                .map(|m| m.bdev.clone())
        })
        .collect()
}

/// The replicas behind: neither in sync nor being rebuilt.
fn behind<'r>(replicas: &'r [ReplicaInfo], sync: &SyncState) -> Vec<&'r ReplicaInfo> {
    replicas
        .iter()
        .filter(|r| !sync.in_sync.contains(&r.k) && sync.rebuilding.is_none_or(|(t, _)| t != r.k))
        .collect()
}

/// Replica `k`, held back for a thin rebuild, counts as rebuilding (from
/// 0%); the others behind are stale.
fn hold_back(sync: &mut SyncState, behind: &[&ReplicaInfo], k: usize) {
    sync.stale.extend(behind.iter().map(|r| r.k).filter(|b| *b != k));
    sync.rebuilding = Some((k, 0));
}

/// Whether bdev `bdev` is listed with a rebuild cap.
fn capped(inv: &Inventory, bdev: &str) -> bool {
    inv.bdevs
        .get(bdev)
        .and_then(|b| b.assigned_rate_limits.as_ref())
        .is_some_and(|l| l.rw_mbytes_per_sec > 0)
}

/// The replica a thin rebuild copies from: the first local one in sync
/// that is listed.
fn thin_source<'r>(
    inv: &Inventory,
    plan: &VolumePlan,
    replicas: &'r [ReplicaInfo],
    in_sync: &BTreeSet<usize>,
) -> Option<&'r ReplicaInfo> {
    replicas
        .iter()
        .filter(|r| r.k < plan.replicas && in_sync.contains(&r.k))
        .find(|r| inv.lvols.contains_key(&r.alias))
}

/// Member `m` (a bdev name, UUID or lvol alias) as `inv` lists it: its
/// name for people (an lvol by its alias) and its block size.
fn listed_block_size(inv: &Inventory, m: &str) -> Option<(String, u32)> {
    let bdev = inv.bdev_named(m)?;
    let lvol = inv.lvols.values().find(|l| l.uuid == bdev.name);
    Some((
        lvol.map_or_else(|| m.to_owned(), |l| l.alias.clone()),
        bdev.block_size,
    ))
}

/// When the members (name, block size) have more than one block size:
/// each with its size, for the error.
fn mixed_block_sizes(sized: &[(String, u32)]) -> Option<String> {
    let sizes: BTreeSet<u32> = sized.iter().map(|(_, b)| *b).collect();
    (sizes.len() > 1).then(|| {
        sized
            .iter()
            .map(|(m, b)| format!("{m} {b} B"))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

#[cfg(test)]
mod tests {
    //! The pure decisions of `ensure_raid` against hand-built listings: no
    //! double, no SPDK.

    use super::*;
    use crate::spdk::rpc::{Bdev, RaidBaseBdev, RaidProcess, RaidProgress, RateLimits};

    /// A plan for volume `v` with `replicas` local replicas and `remote`
    /// remote ones (no node talon can call).
    fn vplan(replicas: usize, remote: usize) -> VolumePlan {
        let mut p = crate::spdk::volume::plan::test_plan("v", 10, replicas, false);
        p.remote = vec![([10, 0, 0, 2].into(), 4420); remote];
        p
    }

    /// Replica `k` with bdev `bdev-<k>`.
    fn info(k: usize) -> ReplicaInfo {
        ReplicaInfo {
            k,
            name: format!("v-r{k}"),
            disk: format!("d{k}"),
            bdev: format!("bdev-{k}"),
            alias: format!("talon-d{k}/v-r{k}"),
            size_bytes: 10 << 20,
            allocated_bytes: 0,
        }
    }

    /// Raid `talon-raid-v` in `state` over `slots` (member, configured),
    /// rebuilding `target` at `percent` when given.
    fn raid(state: &str, slots: &[(Option<&str>, bool)], target: Option<(&str, u32)>) -> RaidBdev {
        RaidBdev {
            name: "talon-raid-v".into(),
            uuid: None,
            state: state.into(),
            raid_level: "raid1".into(),
            superblock: true,
            num_base_bdevs: slots.len() as u32,
            num_base_bdevs_discovered: slots.iter().filter(|s| s.0.is_some()).count() as u32,
            num_base_bdevs_operational: slots.len() as u32,
            base_bdevs_list: slots
                .iter()
                .map(|(n, c)| RaidBaseBdev {
                    name: n.map(str::to_owned),
                    uuid: None,
                    is_configured: *c,
                    data_offset: 0,
                    data_size: 0,
                })
                .collect(),
            process: target.map(|(t, percent)| RaidProcess {
                kind: "rebuild".into(),
                target: t.into(),
                progress: RaidProgress { blocks: 0, percent },
            }),
        }
    }

    #[test]
    fn members_are_known_by_bdev_or_alias() {
        let replicas = [info(0), info(1)];
        assert_eq!(member_k(&replicas, "bdev-1"), Some(1));
        assert_eq!(member_k(&replicas, "talon-d0/v-r0"), Some(0));
        assert_eq!(member_k(&replicas, "talon-null-v-r1"), None);
    }

    #[test]
    fn a_configuring_raid_is_given_up_only_when_it_waits_for_remade_members_alone() {
        let mut r = raid(
            "configuring",
            &[(Some("bdev-0"), true), (None, false), (None, false)],
            None,
        );
        r.base_bdevs_list[1].uuid = Some("u-1".into());
        r.base_bdevs_list[2].uuid = Some("u-2".into());
        let both = BTreeSet::from(["u-1".to_string(), "u-2".to_string()]);
        assert!(waits_only_for(&r, &both, 0));
        // it waits for u-2 too, which was not made again: newer data there
        assert!(!waits_only_for(&r, &BTreeSet::from(["u-1".to_string()]), 0));
        // ... unless a local replica was made again (its old lvol, which u-2
        // is, went with its disk's format)
        assert!(waits_only_for(&r, &BTreeSet::from(["u-1".to_string()]), 1));
        // a slot with no UUID listed is never matched to a remote member
        r.base_bdevs_list[2].uuid = None;
        assert!(!waits_only_for(&r, &both, 0));
        // nothing missing: nothing to give up
        let full = raid("configuring", &[(Some("bdev-0"), true)], None);
        assert!(!waits_only_for(&full, &both, 1));
    }

    #[test]
    fn a_configuring_raid_waits_for_more_slots_than_local_replicas_made_again() {
        // three replicas: r0 configured, r1 made again on its formatted disk,
        // r2's disk not loaded yet: two slots missing, one accounted for
        let r = raid(
            "configuring",
            &[(Some("bdev-0"), true), (None, false), (None, false)],
            None,
        );
        assert!(!waits_only_for(&r, &BTreeSet::new(), 1));
        assert!(waits_only_for(&r, &BTreeSet::new(), 2));
    }

    #[test]
    fn a_raid_spdk_still_assembles_is_not_touched() {
        let r = raid("configuring", &[(Some("bdev-0"), true), (None, false)], None);
        let e = check_assembling("v", "talon-raid-v", Some(&r)).expect_err("assembling");
        assert!(
            matches!(&e, VolumeError::RaidAssembling { raid, present: 1, needed: 2, .. } if raid == "talon-raid-v"),
            "{e:?}"
        );
        let r = raid("online", &[(Some("bdev-0"), true), (None, false)], None);
        assert!(check_assembling("v", "talon-raid-v", Some(&r)).is_ok());
        assert!(check_assembling("v", "talon-raid-v", None).is_ok());
    }

    #[test]
    fn the_listing_gives_the_rebuild_target_and_the_configured_others() {
        let replicas = [info(0), info(1), info(2)];
        let r = raid(
            "online",
            &[
                (Some("bdev-0"), true),
                (Some("talon-null-v-r1"), true),
                (Some("bdev-2"), true),
                (Some("bdev-1"), false),
            ],
            Some(("bdev-2", 40)),
        );
        let (target, in_sync) = listed_sync(&r, &replicas);
        assert_eq!(target, Some((2, 40)));
        assert_eq!(in_sync, BTreeSet::from([0]));
        let r = raid("online", &[(Some("bdev-0"), true), (Some("bdev-1"), true)], None);
        assert_eq!(listed_sync(&r, &replicas), (None, BTreeSet::from([0, 1])));
    }

    #[test]
    fn a_full_rebuild_is_taken_over_only_with_a_local_source_and_a_reachable_target() {
        let p = vplan(2, 1);
        assert!(thin_can_take(&p, 1, &BTreeSet::from([0])));
        assert!(!thin_can_take(&p, 1, &BTreeSet::from([2])), "no local source");
        assert!(
            !thin_can_take(&p, 2, &BTreeSet::from([0])),
            "remote, no node to call"
        );
    }

    #[test]
    fn a_rebuild_that_ended_without_its_replica_leaves_it_out() {
        let replicas = [info(0), info(1), info(2)];
        assert_eq!(
            left_out(&[1, 2], None, &replicas),
            vec![1, 2],
            "raid gone or busy"
        );
        let again = raid(
            "online",
            &[
                (Some("bdev-0"), true),
                (Some("bdev-1"), true),
                (Some("bdev-2"), false),
            ],
            None,
        );
        assert_eq!(left_out(&[1, 2], Some(&again), &replicas), vec![2]);
    }

    #[test]
    fn slots_hold_the_replicas_of_the_set_only() {
        let replicas = [info(0), info(2)];
        assert_eq!(
            slots(3, &replicas, &BTreeSet::from([0, 1, 2])),
            vec![Some("bdev-0".to_owned()), None, Some("bdev-2".to_owned())]
        );
        assert_eq!(
            slots(3, &replicas, &BTreeSet::from([2])),
            vec![None, None, Some("bdev-2".to_owned())]
        );
    }

    #[test]
    fn replicas_behind_are_neither_in_sync_nor_rebuilding_and_one_held_back_rebuilds() {
        let replicas = [info(0), info(1), info(2), info(3)];
        let mut sync = SyncState {
            in_sync: BTreeSet::from([0]),
            rebuilding: Some((1, 30)),
            stale: vec![],
        };
        let b: Vec<usize> = behind(&replicas, &sync).iter().map(|r| r.k).collect();
        assert_eq!(b, vec![2, 3]);
        sync.rebuilding = None;
        let b = behind(&replicas, &sync);
        hold_back(&mut sync, &b, 2);
        assert_eq!(sync.rebuilding, Some((2, 0)));
        assert_eq!(sync.stale, vec![1, 3]);
    }

    /// An lvol's bdev as `bdev_get_bdevs` lists it: `block_size`, capped at `mbps`.
    fn lvol_bdev(name: &str, block_size: u32, mbps: Option<u64>) -> Bdev {
        Bdev {
            name: name.into(),
            aliases: vec![],
            product_name: "Logical Volume".into(),
            block_size,
            num_blocks: 256,
            uuid: None,
            claimed: false,
            claim_type: None,
            assigned_rate_limits: mbps.map(|m| RateLimits { rw_mbytes_per_sec: m }),
            driver_specific: serde_json::Value::Null,
            md_size: 0,
            md_interleave: false,
        }
    }

    /// Members of two block sizes (an NVMe disk at 4 KiB beside an aio disk
    /// at 512 B) are named with their sizes before SPDK's raid1 refuses
    /// them (an lvol by its alias, found by UUID or alias); one size is not judged.
    #[test]
    fn members_of_different_block_sizes_are_named_before_the_raid1_is_made() {
        let mut inv = Inventory::default();
        let bdev = |name: &str, block_size: u32| lvol_bdev(name, block_size, None);
        for (uuid, alias, bs) in [
            ("u0", "talon-d0/v-r0", 4096),
            ("u1", "talon-d1/v-r1", 512),
            ("u2", "talon-d2/v-r2", 4096),
        ] {
            inv.bdevs.insert(uuid.into(), bdev(uuid, bs));
            let l: crate::spdk::rpc::Lvol = serde_json::from_value(serde_json::json!({
                "alias": alias, "uuid": uuid, "name": alias.split('/').nth(1),
                "lvs": { "name": alias.split('/').next(), "uuid": "lvs" }
            }))
            .expect("lvol");
            inv.lvols.insert(alias.into(), l);
        }
        inv.bdevs.insert("r1n1".into(), bdev("r1n1", 4096));
        let m = |v: &[&str]| {
            v.iter()
                .filter_map(|s| listed_block_size(&inv, s))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            mixed_block_sizes(&m(&["u0", "talon-d1/v-r1"])).as_deref(),
            Some("talon-d0/v-r0 4096 B, talon-d1/v-r1 512 B")
        );
        assert_eq!(mixed_block_sizes(&m(&["u0", "u2", "r1n1"])), None, "one size");
        assert_eq!(listed_block_size(&inv, "unknown"), None, "not listed");
        assert_eq!(mixed_block_sizes(&m(&["u0"])), None, "one member");
    }

    #[test]
    fn a_bdev_is_capped_when_listed_with_a_limit() {
        let mut inv = Inventory::default();
        let bdev = |name: &str, mbps: Option<u64>| lvol_bdev(name, 4096, mbps);
        inv.bdevs.insert("a".into(), bdev("a", Some(50)));
        inv.bdevs.insert("b".into(), bdev("b", Some(0)));
        inv.bdevs.insert("c".into(), bdev("c", None));
        assert!(capped(&inv, "a"));
        assert!(!capped(&inv, "b") && !capped(&inv, "c") && !capped(&inv, "d"));
    }
}
