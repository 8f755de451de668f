//! What serves a volume, and its export, under either engine's names: a
//! plan over the members by slot ([`EnginePlan`]) carried out by
//! [`VolumeOps::serve_engine`]. The Longhorn controller's engine, its thin
//! rebuild's switch and talon's restore after a failed switch are each one
//! `serve_engine`. [`VolumeOps::ensure`] and talon's thin switch do other
//! steps between the raid1 and the export (a clone's parents, the data
//! offset check), so they make the raid1 with the same `raid1_in` and export
//! under the same [`EngineNames`]. Only the names differ between the engines.
//!
//! ```text
//!   EnginePlan { names, slots: [Some(m0), None, Some(m2)], bare, superblock, spec }
//!     bare:         slot 0 is the engine (one replica, no raid)
//!     raid listed:  it serves (the caller has judged its members)
//!     else:         raid1 names.raid over the slots; an empty slot is held by
//!                   bdev_null <placeholder><k> while it is made, then emptied
//!   export: subsystem names.nqn (made when missing), namespace 1 = what
//!           serves (identity names.ns_uuid), listener, exactly spec.hosts
//!   a step that fails: what this call made is undone, in reverse
//! ```

use super::{Export, ExportSpec, Inventory, Made, NewSubsystem, VolumeError, VolumeOps, rpc};
use crate::names::{Nqn, ObjectName, volume_uuid};
use crate::spdk::naming::{self, NULL_PREFIX};

/// The names of an engine's objects in SPDK: talon's
/// ([`EngineNames::volume`]) or Longhorn's (the controller's, from its
/// engine and volume names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineNames {
    /// The raid1.
    pub raid: String,
    /// Empty slot k is held by bdev_null `<placeholder><k>` while the raid1
    /// is made.
    pub placeholder: String,
    /// The export's subsystem.
    pub nqn: Nqn,
    /// Its namespace's UUID (and NGUID): what a host knows the volume by.
    pub ns_uuid: uuid::Uuid,
    /// The subsystem, when it has to be made.
    pub subsystem: NewSubsystem,
}

impl EngineNames {
    /// Talon volume `vol`'s: raid1 `talon-raid-<vol>`, placeholders
    /// `talon-null-<vol>-r<k>`, [`Nqn::for_volume`], [`volume_uuid`], and
    /// a subsystem with the volume's serial and ANA reporting, so a
    /// snapshot can freeze it ([`VolumeOps::snapshot`]).
    pub fn volume(vol: &ObjectName) -> Self {
        Self {
            raid: naming::raid(vol.as_str()),
            // `<placeholder><k>` is `talon-null-` and replica k's name
            placeholder: format!("{NULL_PREFIX}{vol}-r"),
            nqn: Nqn::for_volume(vol),
            ns_uuid: volume_uuid(vol),
            subsystem: NewSubsystem {
                model: "talon".into(),
                serial: Some(naming::serial(vol)),
                ana: true,
                cntlid: None,
                listener_ana: None,
            },
        }
    }

    /// The placeholder of empty slot `k`.
    pub fn placeholder(&self, k: usize) -> String {
        format!("{}{k}", self.placeholder)
    }

    /// The export of `bdev` under these names as `spec` says.
    pub fn export<'a>(&'a self, bdev: &'a str, spec: &'a ExportSpec) -> Export<'a> {
        Export {
            nqn: &self.nqn,
            bdev,
            ns_uuid: self.ns_uuid,
            subsystem: self.subsystem.clone(),
            spec,
            only_listener: false,
        }
    }
}

/// An engine to serve: its members by slot, and its export.
#[derive(Debug, Clone)]
pub struct EnginePlan<'a> {
    /// What errors name: the volume, or the Longhorn engine.
    pub volume: &'a str,
    /// The names.
    pub names: &'a EngineNames,
    /// The members by slot: a bdev (an lvol's alias or UUID, a remote
    /// replica's NVMe/TCP bdev), or `None` for an empty slot (a member
    /// that joins later, by a rebuild). At least one is a bdev.
    pub slots: Vec<Option<String>>,
    /// No raid: slot 0 is the engine itself (a volume of one replica).
    pub bare: bool,
    /// The placeholders' block size and count (`None`: the first member's).
    pub geometry: Option<(u32, u64)>,
    /// Whether SPDK writes its raid superblock on the members (`None`:
    /// SPDK's default, none).
    pub superblock: Option<bool>,
    /// Listener, hosts, keys.
    pub spec: &'a ExportSpec,
}

/// What [`VolumeOps::take_down`] deletes, each one that is not there no error:
/// an engine's serving objects, in the order SPDK allows. Talon's volume
/// deletion, a Longhorn engine's removal and a revert (both engines) take an
/// engine down with it.
#[derive(Debug)]
pub struct TakeDown<'a> {
    /// What errors name (a volume, an engine, `<volume>@<snapshot>`).
    pub id: &'a str,
    /// Why, in errors (`revert`, `engine removed`, `volume deleted`).
    pub why: &'a str,
    /// The export's subsystem (`None`: kept; it loses its namespace with the raid).
    pub export: Option<&'a str>,
    /// The raid1 (`None`: a replica served alone).
    pub raid: Option<&'a str>,
    /// Other nodes' replicas attached here as NVMe controllers (by controller name).
    pub remotes: Vec<String>,
    /// Heads (`<lvs>/<name>`) that go without coming back.
    pub dropped: Vec<String>,
}

impl VolumeOps {
    /// Deletes what `t` names, in the order SPDK allows: the export (its
    /// hosts lose their connections), the raid1, the remote members'
    /// controllers, the heads dropped. The replicas' lvols otherwise stay.
    pub async fn take_down(&self, t: &TakeDown<'_>) -> Result<(), VolumeError> {
        let why = t.why;
        if let Some(nqn) = t.export {
            self.unexport(t.id, nqn).await?;
        }
        if let Some(raid) = t.raid {
            super::lvol::delete_raid(&self.client, raid)
                .await
                .map_err(rpc(t.id, format!("deleting raid {raid} ({why})")))?;
        }
        for c in &t.remotes {
            super::lvol::detach_controller(&self.client, c)
                .await
                .map_err(rpc(t.id, format!("detaching remote replica {c} ({why})")))?;
        }
        for alias in &t.dropped {
            super::lvol::delete_lvol(&self.client, alias).await.map_err(rpc(
                t.id,
                format!("deleting head {alias} ({why}: it has no snapshot to come back from)"),
            ))?;
        }
        Ok(())
    }

    /// Serves `p`: the bare member, the raid1 listed, or a raid1 made over
    /// its slots; exported (the transport and subsystem made when
    /// missing). Returns what serves. Idempotent; what it made is undone
    /// when a step fails, so no raid stays without its export.
    pub async fn serve_engine(&self, inv: &Inventory, p: &EnginePlan<'_>) -> Result<String, VolumeError> {
        let mut made = Vec::new();
        let r = self.serve_engine_in(inv, p, &mut made).await;
        if r.is_err() {
            self.undo(made).await;
        }
        r
    }

    async fn serve_engine_in(
        &self,
        inv: &Inventory,
        p: &EnginePlan<'_>,
        made: &mut Vec<Made>,
    ) -> Result<String, VolumeError> {
        let device = if p.bare {
            p.slots
                .first()
                .cloned()
                .flatten()
                .ok_or_else(|| VolumeError::EngineWithoutMembers {
                    volume: p.volume.to_owned(),
                })?
        } else {
            if inv.raid(&p.names.raid).is_none() {
                self.engine_raid(inv, p, made).await?;
            }
            p.names.raid.clone()
        };
        self.export_in(inv, p.volume, &p.names.export(&device, p.spec), made)
            .await?;
        Ok(device)
    }

    /// The block size and count of bdev `bdev`: as `inv` lists it, else
    /// looked up (`step` names the lookup in an error); `None` when it is
    /// not there.
    pub(super) async fn bdev_geometry(
        &self,
        inv: &Inventory,
        vol: &str,
        bdev: &str,
        step: String,
    ) -> Result<Option<(u32, u64)>, VolumeError> {
        if let Some(b) = inv.bdevs.get(bdev) {
            return Ok(Some((b.block_size, b.num_blocks)));
        }
        Ok(self
            .client
            .bdev(bdev)
            .await
            .map_err(rpc(vol, step))?
            .map(|b| (b.block_size, b.num_blocks)))
    }

    /// Makes raid1 `p.names.raid` over `p.slots` (see [`Self::raid1_in`]);
    /// what it made is pushed on `made`.
    pub(super) async fn engine_raid(
        &self,
        inv: &Inventory,
        p: &EnginePlan<'_>,
        made: &mut Vec<Made>,
    ) -> Result<(), VolumeError> {
        let geometry = match p.geometry {
            Some(g) => g,
            None if p.slots.iter().all(Option::is_some) => (0, 0),
            None => {
                let first =
                    p.slots
                        .iter()
                        .flatten()
                        .next()
                        .ok_or_else(|| VolumeError::EngineWithoutMembers {
                            volume: p.volume.to_owned(),
                        })?;
                self.bdev_geometry(inv, p.volume, first, format!("looking up member {first}"))
                    .await?
                    .ok_or_else(|| VolumeError::MemberGone {
                        volume: p.volume.to_owned(),
                        member: first.clone(),
                    })?
            }
        };
        let placeholder = |k: usize| p.names.placeholder(k);
        self.raid1_in(
            inv,
            p.volume,
            &p.names.raid,
            &p.slots,
            geometry,
            p.superblock,
            &placeholder,
            made,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_talon_volume_keeps_the_names_it_always_had() {
        let vol = ObjectName::parse("volume", "pg-data").expect("valid name");
        let n = EngineNames::volume(&vol);
        assert_eq!(n.raid, naming::raid("pg-data"));
        assert_eq!(
            n.placeholder(2),
            format!("{NULL_PREFIX}{}", naming::replica("pg-data", 2))
        );
        assert_eq!(
            n.placeholder(12),
            format!("{NULL_PREFIX}{}", naming::replica("pg-data", 12))
        );
        assert_eq!(n.nqn, Nqn::for_volume(&vol));
        assert_eq!(n.ns_uuid, volume_uuid(&vol));
        assert_eq!(n.subsystem.serial, Some(naming::serial(&vol)));
        assert!(n.subsystem.ana);
    }
}
