//! The switch of a thin rebuild, the one checked sequence of both engines
//! (talon's `rebuild.rs`, a Longhorn engine's
//! `replica_rebuild.rs`): the step machine's
//! [`thin::switch`](super::thin::switch) calls [`VolumeOps::switch_close`],
//! then copies the idle source head's last clusters into the dest, then
//! [`VolumeOps::switch_join`]; a switch that fails in any part is undone by
//! [`VolumeOps::switch_restore`].
//!
//! ```text
//!   close   the dest's bdev looked up (made reachable by its side first):
//!           gone -> error, the raid stays as it is, no host is cut off
//!           side.closing()                      (Longhorn: ReplicaList keeps its modes)
//!           export closed: listeners and namespace go, hosts reconnect later
//!           raid deleted, its superblock cleared on the members (clear_sb
//!           = what the raid has): a member keeping another raid's superblock
//!           is refused by the next bdev_raid_create (v26.05: -17 File exists)
//!   ...     the switch's copy into the dest, kept
//!   join    side.release()                      (Longhorn: the source's node lets
//!                                                the dest go, a loopback export goes)
//!           raid made again over the same slots + the dest in its slot, with
//!           the superblock it had and the source's geometry
//!           data_offset of source == dest in bdev_raid_get_bdevs, else the
//!           dest is taken out again (the copies kept the source's offsets)
//!           export opened again: the same subsystem, namespace id, hosts
//!   restore the raid listed: exported as it is; missing: made again over
//!           the slots it had (the dest's empty), the same superblock
//! ```
//!
//! What differs between the engines is behind [`SwitchSide`] (how the
//! dest is reached, what holds it for the copies) and in [`Switch`]'s
//! names (talon's, or Longhorn's NQN and raid name) and slots.

use super::{EngineNames, EnginePlan, ExportSpec, Inventory, VolumeError, VolumeOps, ignore_missing, rpc};
use crate::spdk::rpc::{ByName, GetRaids, RaidBdev, RaidCategory, RaidDelete};

/// What one engine's side does at its switch, where the engines differ.
#[async_trait::async_trait]
pub trait SwitchSide: Send + Sync {
    /// The side's errors: the shared steps' [`VolumeError`]s go into them.
    type Error: From<VolumeError> + Send;
    /// The name of the dest's bdev in this target, as the raid takes it:
    /// made reachable first where that is the side's part (a Longhorn dest
    /// on another node attached). Whether it is there is looked up after.
    async fn dest_bdev(&self) -> Result<String, Self::Error>;
    /// Right before the hosts go off (the dest is there).
    fn closing(&self) {}
    /// Once the dest holds the switch's copy, before the raid is made again
    /// with it: what held the dest for the copies lets it go.
    async fn release(&self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// One engine's switch, whoever produced the engine.
#[derive(Debug, Clone)]
pub struct Switch<'a> {
    /// What errors name: the volume, or the Longhorn engine.
    pub of: &'a str,
    /// The rebuilt replica (errors name it).
    pub replica: &'a str,
    /// The engine's names: its raid (`names.raid`) and export.
    pub names: &'a EngineNames,
    /// The export opened again.
    pub spec: &'a ExportSpec,
    /// The raid as the step listed it: its superblock is kept.
    pub raid: &'a RaidBdev,
    /// The source's bdev (an lvol's alias or UUID, a remote bdev).
    pub source: &'a str,
    /// The members in service by slot (the dest's slot empty or past the end).
    pub slots: &'a [Option<String>],
    /// The dest's slot.
    pub dest_slot: usize,
}

impl Switch<'_> {
    fn failed(&self, snapshot: &str, message: String) -> VolumeError {
        VolumeError::RebuildCopy {
            volume: self.of.to_owned(),
            replica: self.replica.to_owned(),
            snapshot: snapshot.to_owned(),
            message,
        }
    }

    /// The slots with `dest` (or nothing) in the dest's slot.
    fn slots_with(&self, dest: Option<String>) -> Vec<Option<String>> {
        let mut slots = self.slots.to_vec();
        if slots.len() <= self.dest_slot {
            slots.resize(self.dest_slot + 1, None);
        }
        slots[self.dest_slot] = dest;
        slots
    }
}

/// The `data_offset` of the slot of `raid` that holds bdev `b` (by its name
/// or UUID).
fn data_offset(raid: &RaidBdev, b: &crate::spdk::rpc::Bdev) -> Option<u64> {
    raid.base_bdevs_list
        .iter()
        .find(|m| m.name.as_deref() == Some(b.name.as_str()) || (m.uuid.is_some() && m.uuid == b.uuid))
        .map(|m| m.data_offset)
}

impl VolumeOps {
    /// The switch's first part: the dest checked (the step's listing is a
    /// moment old: a dest whose bdev went since is not switched to, the raid
    /// would go for nothing), the hosts off, the raid deleted with its
    /// superblock cleared on its members. `inv`: the step's listing.
    pub async fn switch_close<S: SwitchSide + ?Sized>(
        &self,
        inv: &Inventory,
        s: &Switch<'_>,
        side: &S,
    ) -> Result<(), S::Error> {
        let dest = side.dest_bdev().await?;
        if self
            .client
            .bdev(&dest)
            .await
            .map_err(rpc(s.of, format!("looking up {dest}")))?
            .is_none()
        {
            return Err(s
                .failed(
                    "",
                    format!("{dest} went before the switch: the raid stays as it is"),
                )
                .into());
        }
        side.closing();
        // hosts off: their connections drop, their I/O waits for the reconnect
        self.close_export(inv, s.of, s.names.nqn.as_str()).await?;
        // the raid goes; its superblock is cleared on its members so that
        // they (and the dest, which gets the cleared cluster by the switch's
        // copy) make a new raid without SPDK finding the old one
        self.client
            .bdev_raid_delete(&RaidDelete {
                name: s.raid.name.clone(),
                clear_sb: Some(s.raid.superblock),
            })
            .await
            .map_err(rpc(s.of, format!("deleting raid {} for the switch", s.raid.name)))?;
        Ok(())
    }

    /// The switch's last part, once the dest holds the switch's copy
    /// `snap`: the raid made again over the same members in the same slots
    /// and the dest, with the superblock it had; the raid's data checked to
    /// start at the same place on the source and the dest; exported again.
    pub async fn switch_join<S: SwitchSide + ?Sized>(
        &self,
        s: &Switch<'_>,
        snap: &str,
        side: &S,
    ) -> Result<(), S::Error> {
        side.release().await?;
        let dest = side.dest_bdev().await?;
        let gone = |what: &str| s.failed(snap, format!("{what} disappeared during the switch"));
        let Some(dst_bdev) = self
            .client
            .bdev(&dest)
            .await
            .map_err(rpc(s.of, format!("looking up {dest}")))?
        else {
            return Err(gone(&dest).into());
        };
        // the same size as the source: the raid takes its smallest member
        let Some(src_bdev) = self
            .client
            .bdev(s.source)
            .await
            .map_err(rpc(s.of, format!("looking up {}", s.source)))?
        else {
            return Err(gone(s.source).into());
        };
        let now = Inventory::load(&self.client)
            .await
            .map_err(rpc(s.of, "listing the target in the switch"))?;
        let plan = EnginePlan {
            volume: s.of,
            names: s.names,
            slots: s.slots_with(Some(dst_bdev.name.clone())),
            bare: false,
            geometry: Some((src_bdev.block_size, src_bdev.num_blocks)),
            superblock: Some(s.raid.superblock),
            spec: s.spec,
        };
        let mut made = Vec::new();
        if let Err(e) = self.engine_raid(&now, &plan, &mut made).await {
            self.undo(made).await;
            return Err(e.into());
        }
        // the copies put each cluster at the source's offset: the raid's data
        // must start at the same place on both, or the dest is not served
        let raids = self
            .client
            .bdev_raid_get_bdevs(&GetRaids {
                category: RaidCategory::All,
            })
            .await
            .map_err(rpc(s.of, "listing the raids after the switch"))?;
        let made_again = raids.iter().find(|r| r.name == s.names.raid);
        let (so, dso) = (
            made_again.and_then(|r| data_offset(r, &src_bdev)),
            made_again.and_then(|r| data_offset(r, &dst_bdev)),
        );
        if so != dso {
            ignore_missing(
                self.client
                    .bdev_raid_remove_base_bdev(&ByName::new(&dst_bdev.name)),
            )
            .await
            .map_err(rpc(
                s.of,
                format!("taking {} out of {} again", dst_bdev.name, s.names.raid),
            ))?;
            return Err(s
                .failed(
                    snap,
                    format!(
                        "the raid's data starts at block {so:?} on the source and {dso:?} on the rebuilt replica: \
                         taken out again"
                    ),
                )
                .into());
        }
        // exported again: the same namespace ids, the listener, the hosts
        let mut made = Vec::new();
        self.export_in(&now, s.of, &s.names.export(&s.names.raid, s.spec), &mut made)
            .await?;
        Ok(())
    }

    /// After a switch that failed (in any part): the raid served again over
    /// the members in service, at once rather than at the next reconcile; a
    /// raid listed is exported as it is, a missing one is made again over
    /// the slots it had (the dest's empty) with the superblock it had. Best
    /// effort: what cannot be done now the next reconcile does (the failure
    /// is already the step's error).
    pub async fn switch_restore(&self, s: &Switch<'_>) {
        let restored = async {
            let inv = Inventory::load(&self.client)
                .await
                .map_err(rpc(s.of, "listing the target to restore the raid"))?;
            let geometry = match inv.raid(&s.names.raid) {
                Some(_) => None,
                None => Some(
                    self.bdev_geometry(&inv, s.of, s.source, format!("looking up {}", s.source))
                        .await?
                        .ok_or_else(|| {
                            s.failed(
                                "",
                                format!("{} went too: the raid is not made again here", s.source),
                            )
                        })?,
                ),
            };
            let plan = EnginePlan {
                volume: s.of,
                names: s.names,
                slots: s.slots_with(None),
                bare: false,
                geometry,
                superblock: Some(s.raid.superblock),
                spec: s.spec,
            };
            self.serve_engine(&inv, &plan).await.map(|_| ())
        };
        match restored.await {
            Ok(()) => tracing::info!(
                of = s.of,
                "rebuild: the switch failed; the raid serves again over the members it had"
            ),
            Err(e) => tracing::warn!(of = s.of, error = %crate::util::error_chain(&e),
                "rebuild: the switch failed and the raid could not be made again now; the next reconcile does"),
        }
    }
}
