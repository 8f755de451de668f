//! `engine.SpdkOrphanController`: reports the lvols in talon's lvstores that
//! nothing in the store owns (`OrphanLvol`), as after a lost state store, and
//! removes one only when `orphan_remove` asks (`OrphanRemoval`). Nothing else
//! deletes them: the volume controller's orphan cleanup takes exports, raids
//! and attachments of unknown volumes, never their lvols.
//!
//! ```text
//!   Volume, LonghornReplica (owners, read before and after the listing)
//!   TargetStatus "spdk" ready ──> Inventory::load ──> find (pure): lvols of talon-* lvstores
//!                                                     no owner claims ──> OrphanLvol <alias>
//!                                                                         (a warning once each)
//!   the same listing ──> mover::sweep: the data mover's temporary exports of another run removed
//!   OrphanRemoval <alias> {uuid} ──> still an orphan, same uuid, no clone ──> bdev_lvol_delete
//!                                    else: OrphanLvol.message says why
//! ```
//!
//! Owners: a talon name (`<volume>-r<k>`, its snapshots `.s.`, revert
//! markers `.rev.`) belongs to the Volume of that name, whatever its engine
//! or phase; another name to the LonghornReplica it is (`<replica>`) or
//! starts with (`<replica>-snap-…`, `<replica>.restore`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use crate::resources::config::{OrphanRemoval, Volume};
use crate::resources::engine::{Engine, ObjectState, OrphanLvol, SPDK_STATUS_ID, TargetStatus};
use crate::resources::longhorn::LonghornReplica;
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};
use crate::spdk::SpdkClient;
use crate::spdk::naming::Owners;
use crate::spdk::volume::{Inventory, LVS_PREFIX, LvolRole, VolumeOps, parse_lvol};

/// How often the lvols are looked at again without a change of an input.
const POLL: Duration = Duration::from_secs(30);

/// Reports orphan lvols and removes those asked for.
#[derive(Debug)]
pub struct SpdkOrphanController {
    ops: VolumeOps,
    /// The UUIDs of the orphans logged since this start (each once).
    warned: Mutex<BTreeSet<String>>,
}

impl SpdkOrphanController {
    /// A controller looking at the target behind `client`.
    pub fn new(client: SpdkClient) -> Self {
        Self {
            ops: VolumeOps::new(client),
            warned: Mutex::new(BTreeSet::new()),
        }
    }
}

/// The Volumes and LonghornReplicas this reconcile sees.
fn read_owners(ctx: &ReconcileContext) -> Result<Owners, ControllerError> {
    Ok(Owners {
        volumes: ctx.list::<Volume>()?.iter().map(|v| v.id().to_string()).collect(),
        replicas: ctx
            .list::<LonghornReplica>()?
            .iter()
            .map(|r| r.id().to_string())
            .collect(),
    })
}

/// What an lvol's name says it belonged to.
fn was(name: &str) -> String {
    match parse_lvol(name) {
        Some(LvolRole::Replica { volume, k }) => format!("volume {volume} replica {k}"),
        Some(LvolRole::Snapshot { volume, k, snap }) => {
            format!("volume {volume} replica {k} snapshot {snap}")
        }
        Some(LvolRole::RevertMarker { volume, generation }) => {
            format!("volume {volume} revert marker {generation}")
        }
        Some(LvolRole::Restoring { volume, k }) => format!("volume {volume} replica {k}, being restored"),
        Some(LvolRole::Standby { volume, k }) => format!("standby volume {volume} replica {k}"),
        None => format!("Longhorn replica or other ({name})"),
    }
}

/// The orphan lvols of `inv` by alias: lvols of `talon-*` lvstores that no
/// owner claims.
pub fn find(inv: &Inventory, owners: &Owners) -> BTreeMap<String, OrphanLvol> {
    let mut out = BTreeMap::new();
    for l in inv.lvols.values() {
        let Some(disk) = l.lvs.name.strip_prefix(LVS_PREFIX) else {
            continue;
        };
        if owners.owner(&l.name).is_some() {
            continue;
        }
        let cluster = inv
            .lvstores
            .iter()
            .find(|s| s.name == l.lvs.name)
            .map_or(0, |s| s.cluster_size);
        let clones = inv.clones_of(&l.alias);
        out.insert(
            l.alias.clone(),
            OrphanLvol {
                disk: disk.to_string(),
                lvol: l.name.clone(),
                uuid: l.uuid.clone(),
                was: was(&l.name),
                snapshot: l.is_snapshot,
                size_bytes: inv.bdevs.get(&l.uuid).map_or(0, |b| b.size_bytes()),
                allocated_bytes: l.num_allocated_clusters.saturating_mul(cluster),
                clones,
                message: String::new(),
            },
        );
    }
    out
}

#[async_trait::async_trait]
impl Controller for SpdkOrphanController {
    fn name(&self) -> &'static str {
        "engine.SpdkOrphanController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::of::<TargetStatus>(),
            Input::of::<Volume>(),
            Input::of::<LonghornReplica>(),
            Input::of::<OrphanRemoval>(),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<OrphanLvol>()]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let ready = ctx
            .get::<TargetStatus>(SPDK_STATUS_ID)?
            .is_some_and(|t| t.spec.engine == Engine::V2 && t.spec.state == ObjectState::Ready);
        if !ready {
            // what was reported stays reported while the target is away
            for o in ctx.list::<OrphanLvol>()? {
                let id = o.id().to_string();
                ctx.apply(&id, o.spec)?;
            }
            return Ok(Requeue::OnInputChange);
        }
        // owners read before and after the listing: a volume made or deleted
        // meanwhile is an owner in one of them
        let mut owners = read_owners(ctx)?;
        let inv = Inventory::load(self.ops.client()).await?;
        owners.extend(read_owners(ctx)?);
        // the data mover's exports an earlier run of talon left (a crash mid-move)
        crate::spdk::volume::mover::sweep(self.ops.client(), &inv).await;
        let mut found = find(&inv, &owners);
        // a refusal is said while its request stands
        for req in ctx.list::<OrphanRemoval>()? {
            let alias = req.id().to_string();
            let Some(o) = found.get_mut(&alias) else {
                continue; // not an orphan (any more): orphan_remove says why
            };
            if o.uuid != req.spec.uuid {
                o.message = format!(
                    "removal asked for lvol {} with UUID {}, this one is {}; not removed",
                    alias, req.spec.uuid, o.uuid
                );
                continue;
            }
            if !o.clones.is_empty() {
                o.message = format!(
                    "lvol {alias} has clones ({}); remove them first; not removed",
                    o.clones.join(", ")
                );
                continue;
            }
            match self.ops.delete_orphan_lvol(&alias).await {
                Ok(()) => {
                    tracing::info!(lvol = %alias, uuid = %o.uuid, was = %o.was, "orphan lvol removed as asked");
                    found.remove(&alias);
                }
                Err(e) => {
                    o.message = format!("deleting lvol {alias}: {}", crate::util::error_chain(&e));
                    tracing::warn!(lvol = %alias, "{}", o.message);
                }
            }
        }
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        for (alias, o) in found {
            if warned.insert(o.uuid.clone()) {
                tracing::warn!(
                    lvol = %alias,
                    uuid = %o.uuid,
                    was = %o.was,
                    size_bytes = o.size_bytes,
                    "orphan lvol: no volume or Longhorn replica owns it; kept (see `talon orphan list`, \
                     remove it with `talon orphan remove {alias}`)"
                );
            }
            ctx.apply(&alias, o)?;
        }
        Ok(Requeue::After(POLL))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spdk::inventory::testing::{TestLvol, add_lvol};
    use crate::spdk::rpc::Lvstore;

    fn inv(lvols: &[(&str, &str, Option<&str>)]) -> Inventory {
        let mut i = Inventory::default();
        for d in ["d1", "other"] {
            i.lvstores.push(Lvstore {
                uuid: format!("u-{d}"),
                name: if d == "other" {
                    "foreign".into()
                } else {
                    format!("talon-{d}")
                },
                base_bdev: format!("talon-disk-{d}"),
                total_data_clusters: 1024,
                free_clusters: 1024,
                block_size: 4096,
                cluster_size: 1 << 20,
            });
        }
        for (lvs, name, parent) in lvols {
            let snapshot = name.contains(".s.") || name.contains("-snap-");
            let l = TestLvol {
                lvs,
                name,
                bytes: 4096 * 4096,
                clusters: 2,
                snapshot,
                parent: *parent,
            };
            add_lvol(&mut i, l);
        }
        i
    }

    #[test]
    fn lvols_no_volume_or_longhorn_replica_owns_are_orphans() {
        let i = inv(&[
            ("talon-d1", "kept-r0", None),
            ("talon-d1", "kept-r0.s.daily", None),
            ("talon-d1", "lost-r0.s.daily", None),
            ("talon-d1", "lost-r0", Some("lost-r0.s.daily")),
            ("talon-d1", "lost.rev.3", None),
            ("talon-d1", "pvc-1-r-abc", None),
            ("talon-d1", "pvc-1-r-abc-snap-s1", None),
            ("talon-d1", "pvc-1-r-abc.restore", None),
            ("talon-d1", "pvc-2-r-def", None),
            ("foreign", "lost-r1", None),
        ]);
        let owners = Owners {
            volumes: ["kept".to_string()].into(),
            replicas: ["pvc-1-r-abc".to_string()].into(),
        };
        let found = find(&i, &owners);
        assert_eq!(
            found.keys().cloned().collect::<Vec<_>>(),
            [
                "talon-d1/lost-r0",
                "talon-d1/lost-r0.s.daily",
                "talon-d1/lost.rev.3",
                "talon-d1/pvc-2-r-def"
            ]
        );
        let snap = &found["talon-d1/lost-r0.s.daily"];
        assert_eq!(snap.clones, ["talon-d1/lost-r0"]);
        assert_eq!(snap.was, "volume lost replica 0 snapshot daily");
        assert_eq!(snap.disk, "d1");
        assert_eq!(snap.allocated_bytes, 2 << 20);
        assert_eq!(snap.size_bytes, 16 << 20);
        assert!(found["talon-d1/lost-r0"].clones.is_empty());
    }

    #[test]
    fn a_longhorn_replica_owns_only_its_own_names() {
        let owners = Owners {
            volumes: BTreeSet::new(),
            replicas: ["r-a".to_string()].into(),
        };
        assert!(owners.owner("r-a").is_some());
        assert!(owners.owner("r-a-snap-x").is_some());
        assert!(owners.owner("r-a.restore").is_some());
        assert!(owners.owner("r-ab").is_none());
        assert!(owners.owner("v-r0").is_none(), "a talon name needs its Volume");
    }
}
