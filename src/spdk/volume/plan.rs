//! The pure half of a volume's set-up: from what should be ([`VolumePlan`])
//! and what is ([`Inventory`]) to the steps for the local replica lvols:
//! where each one is or goes (one placement decision,
//! [`crate::spdk::placement`]), how a missing one is made (thin, a clone, or
//! a fresh head that gets its snapshot as parent after the raid), and how
//! large its lvol is (the volume plus a raid superblock's room). No RPC: unit
//! tested with hand-built inventories. [`super::VolumeOps::ensure`] applies it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::error::VolumeError;
use crate::names::ObjectName;
use crate::spdk::inventory::Inventory;
use crate::spdk::naming::{self, LVS_PREFIX, LvolRole, parse_lvol};
use crate::spdk::placement::{self, Blocked, DiskAway, Slot};

const MIB: u64 = 1 << 20;

/// Where and how a volume is exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    /// Listener address.
    pub address: IpAddr,
    /// Listener port.
    pub port: u16,
    /// The host NQNs allowed to connect; nobody else can (empty: nobody).
    pub hosts: Vec<String>,
    /// `Some(<data-dir>)` when `NodeConfig.nvmeDhchap` is on:
    /// every host must authenticate (DH-HMAC-CHAP) with the secret of its
    /// file in `<data-dir>/nvme-dhchap/`, and remote replicas are attached with this node's own
    /// (see [`crate::util::dhchap`]).
    pub dhchap_data_dir: Option<std::path::PathBuf>,
    /// `Some(<data-dir>)` when `NodeConfig.replicaTls` is on: a served
    /// replica listens with TLS (`secure_channel`) and admits each host with
    /// its PSK from `<data-dir>/nvme-tls/`; remote replicas are attached with
    /// this node's own PSK. Volume exports (kernel hosts) never use it.
    pub tls_data_dir: Option<std::path::PathBuf>,
}

impl ExportSpec {
    /// An export on `address:port` to `hosts`, with no keys.
    pub fn plain(address: IpAddr, port: u16, hosts: Vec<String>) -> Self {
        Self {
            address,
            port,
            hosts,
            dhchap_data_dir: None,
            tls_data_dir: None,
        }
    }
}

/// What a volume should be.
#[derive(Debug, Clone)]
pub struct VolumePlan {
    /// The volume.
    pub name: ObjectName,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Replica count.
    pub replicas: usize,
    /// Disks the replicas may use (empty: any).
    pub disks: Vec<String>,
    /// Disks replicas were placed on before (replica k -> disk), so that a
    /// replica whose lvstore has not come back yet is waited for, not made again elsewhere.
    pub placed: BTreeMap<usize, String>,
    /// Configured disks that are not ready (or are being removed), and why:
    /// never placed on, and named when a replica cannot be placed.
    pub disk_away: BTreeMap<String, DiskAway>,
    /// Clone source `(volume, snapshot)`.
    pub from_snapshot: Option<(ObjectName, ObjectName)>,
    /// The replicas of the clone source whose snapshots were taken at one
    /// point in time (recorded in the source volume's ledger). Only those
    /// are cloned; the others are made empty and rebuilt from them. `None`:
    /// nothing recorded, the lowest replica with the snapshot is the only source.
    pub snapshot_set: Option<BTreeSet<usize>>,
    /// The export.
    pub export: ExportSpec,
    /// A new volume's data, restored from a backup into a sparse file: its
    /// first local replicas are made from it ([`Make::Restore`]).
    pub restore: Option<RestoreFile>,
    /// The replicas last known to hold the newest data (the persisted
    /// [`crate::resources::engine::ReplicaLedger`]); `None` when nothing was
    /// recorded yet: then replicas that exist are trusted, and new ones only
    /// when the whole volume is new.
    pub in_sync: Option<BTreeSet<usize>>,
    /// Replicas kept by other talon nodes: replica `replicas + i` is served
    /// at `remote[i]` (address, NVMe/TCP port).
    pub remote: Vec<(IpAddr, u16)>,
    /// What the ledger noted of the lvols of its up-to-date replicas: one
    /// made again since (empty) is not trusted ([`LvolNotes`]).
    pub noted: LvolNotes,
    /// The raid1 keeps a superblock on its members (volumes made since the
    /// superblock layout; see [`superblock_room`]): each local replica lvol
    /// is one superblock room larger than the volume, and SPDK records a
    /// member that leaves on the others before I/O goes on. Ignored for a
    /// volume of one replica (no raid). A node that serves a replica for an
    /// engine elsewhere gives it the room when this is set.
    pub superblock: bool,
    /// Cap on a rebuild's copying into the replica rebuilt, MiB/s.
    pub rebuild_mib_per_sec: Option<u64>,
    /// The nodes of the remote replicas that talon can call (`remote[i]`
    /// at `remote_dests[i]`): those are rebuilt thin; the others (and every
    /// remote replica when this is empty) by SPDK's full rebuild.
    pub remote_dests: Vec<Option<std::sync::Arc<dyn super::rebuild::RemoteDest>>>,
    /// How far the thin replicas on one disk may promise past its capacity, percent
    /// (`NodeConfig.overcommitPercent`): a new replica or a growth past it is refused.
    pub overcommit_percent: u32,
}

/// Where the lvols of a volume's up-to-date replicas were, as the ledger
/// noted them (each pass, for the replicas up to date in it), so that a
/// replica whose lvol was made again since (empty: its disk formatted or
/// replaced, and the lvol made again there, perhaps by a pass cut off before
/// the ledger heard of it) is told by [`made_again`] and never trusted.
///
/// ```text
///   local replica k:  the UUID of the lvstore its lvol is in (a revert remakes
///                     a head in its lvstore; a format makes a new lvstore)
///   remote replica k: the UUID of the lvol its node serves as it (asked of
///                     the node, `RemoteDest::lvol`)
/// ```
///
/// A Longhorn engine's ledger notes its members' lvstores and is judged by
/// the same rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LvolNotes {
    /// Local replica k -> the UUID of its lvol's lvstore.
    pub lvstores: BTreeMap<usize, String>,
    /// Remote replica k -> the UUID of the lvol its node serves as it.
    pub lvols: BTreeMap<usize, String>,
}

/// The members whose lvol is not where (or what) `noted` says it was while
/// they held the newest data: `now(m)` is what is listed or reported now
/// (`None`: not known, not judged). Each with (noted, now): made again
/// since, empty (its disk formatted or replaced). A member with no note is
/// not judged (a ledger from before the notes). One rule for talon's volumes
/// ([`LvolNotes`]) and Longhorn's engines (their ledger's lvstores).
pub fn made_again<K: Ord + Clone>(
    noted: &BTreeMap<K, String>,
    now: impl Fn(&K) -> Option<String>,
) -> BTreeMap<K, (String, String)> {
    noted
        .iter()
        .filter_map(|(m, was)| {
            let is = now(m)?;
            (*was != is).then(|| (m.clone(), (was.clone(), is)))
        })
        .collect()
}

/// The room a raid superblock takes at the start of an lvol member: SPDK
/// puts the raid's data at 1 MiB rounded up to the member's optimal I/O
/// boundary (`raid_bdev_configure_base_bdev`), which for an lvol is its
/// lvstore's cluster (`vbdev_lvol.c`). One cluster for talon's lvstores
/// (whole MiB clusters); allocated on a thin replica once, by the superblock.
pub fn superblock_room(cluster_size: u64) -> u64 {
    let c = cluster_size.max(1);
    MIB.div_ceil(c) * c
}

/// The replicas of `vol`'s snapshot `snap` that a revert or clone may use
/// as they are: the recorded point-in-time set (`recorded`, from the ledger)
/// among the snapshot lvols present, else the lowest replica that has the
/// snapshot. Never two replicas whose snapshots may differ; the others are
/// rebuilt from these. Empty when no replica has the snapshot.
pub fn point_in_time_set(
    inv: &Inventory,
    vol: &str,
    snap: &str,
    recorded: Option<&BTreeSet<usize>>,
) -> BTreeSet<usize> {
    let present: BTreeSet<usize> = inv
        .lvols
        .values()
        .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
        .filter_map(|l| match parse_lvol(&l.name) {
            Some(LvolRole::Snapshot { volume, k, snap: s }) if volume == vol && s == snap => Some(k),
            _ => None,
        })
        .collect();
    let together: BTreeSet<usize> = recorded
        .map(|r| r.intersection(&present).copied().collect())
        .unwrap_or_default();
    if together.is_empty() {
        present.into_iter().take(1).collect()
    } else {
        together
    }
}

impl VolumePlan {
    /// A plan for a volume with no history: no placement, no clone source,
    /// no ledger, no remote replicas, any disk.
    pub fn new(name: ObjectName, size_bytes: u64, replicas: usize, export: ExportSpec) -> Self {
        Self {
            name,
            size_bytes,
            replicas,
            disks: Vec::new(),
            placed: BTreeMap::new(),
            disk_away: BTreeMap::new(),
            from_snapshot: None,
            snapshot_set: None,
            export,
            restore: None,
            in_sync: None,
            remote: Vec::new(),
            noted: LvolNotes::default(),
            superblock: replicas >= 2,
            rebuild_mib_per_sec: None,
            remote_dests: Vec::new(),
            overcommit_percent: placement::DEFAULT_OVERCOMMIT_PERCENT,
        }
    }

    /// The volume's export to kernel hosts: the plan's, never with TLS
    /// (that is for replicas served to other nodes' engines).
    pub fn host_export(&self) -> ExportSpec {
        ExportSpec {
            tls_data_dir: None,
            ..self.export.clone()
        }
    }

    /// Whether this volume's raid1 keeps a superblock (see `superblock`).
    pub fn uses_superblock(&self) -> bool {
        self.superblock && self.replicas + self.remote.len() >= 2
    }
}

pub use super::error::{NoRoom, Overcommit};

/// The one overcommit rule, for every thin lvol talon makes on a disk
/// (talon's volumes and Longhorn's replicas alike): what the disk promises
/// stays within `percent`% of its capacity. Compared in 128 bits: sizes near
/// 2^64 never wrap.
pub fn commitment(total: u64, committed: u64, more: u64, percent: u32) -> Result<(), Overcommit> {
    let bound = u128::from(total) * u128::from(percent) / 100;
    if u128::from(committed) + u128::from(more) > bound {
        return Err(Overcommit {
            total,
            committed,
            more,
            percent,
        });
    }
    Ok(())
}

/// Whether `disk` can promise `more` bytes within `percent` of its capacity, on top of what its
/// thin lvols promise now ([`Inventory::committed`]); the error says why not, with the figures.
pub fn within_overcommit(inv: &Inventory, disk: &str, more: u64, percent: u32) -> Result<(), NoRoom> {
    let total = inv.lvstore(disk).ok_or(NoRoom::NoLvstore)?.bytes()?.total;
    let committed = inv.committed(disk).ok_or(NoRoom::Overflow)?;
    Ok(commitment(total, committed, more, percent)?)
}

/// Disks with a talon lvstore (free bytes), less those the plan says are away
/// (being removed).
fn ready_disks(inv: &Inventory, plan: &VolumePlan) -> BTreeMap<String, u64> {
    inv.disks()
        .into_iter()
        .filter(|(d, _)| !plan.disk_away.contains_key(d))
        .collect()
}

pub(super) fn check_len(volume: &str, lvol: &str) -> Result<(), VolumeError> {
    if lvol.len() > 63 {
        return Err(VolumeError::NameTooLong {
            volume: volume.to_owned(),
            lvol: lvol.to_owned(),
        });
    }
    Ok(())
}

/// How a missing local replica lvol is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Make {
    /// A thin lvol of `mib` MiB.
    Thin {
        /// Its size.
        mib: u64,
    },
    /// A clone of the snapshot lvol `snapshot` (its alias): the snapshot's
    /// size, its data.
    Clone {
        /// The snapshot lvol's alias.
        snapshot: String,
    },
    /// A thin lvol of `mib` MiB filled with a restored backup's data:
    /// only its chunks with data written ([`super::mover::restore`]).
    Restore {
        /// Its size.
        mib: u64,
        /// The restored data.
        from: super::mover::restore::Source,
    },
    /// A fresh thin lvol of the snapshot's size (`mib`) that gets `snapshot`
    /// as its parent once the raid's superblock is in its own first cluster:
    /// SPDK refuses a member that shows another raid's superblock, and a
    /// clone shows its snapshot's.
    Head {
        /// The snapshot's size.
        mib: u64,
        /// The snapshot lvol's alias.
        snapshot: String,
    },
}

/// Where a new volume's replicas are restored from: a backup in its store,
/// or a sparse file (a standby's) as large as such a replica; the
/// volume's data at `data_offset` (the raid superblock's room on the
/// replicas it is made for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreFile {
    /// The backup or the file.
    pub from: super::mover::restore::Source,
    /// Where the volume's data starts in it.
    pub data_offset: u64,
}

/// One local replica: where it is or goes, how a missing one is made, and
/// what its lvol holds besides the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReplica {
    /// k.
    pub k: usize,
    /// The disk.
    pub disk: String,
    /// `<vol>-r<k>`.
    pub name: String,
    /// `talon-<disk>/<vol>-r<k>`.
    pub alias: String,
    /// `None`: it exists.
    pub make: Option<Make>,
    /// Bytes before the volume's data: the raid superblock's room (0
    /// without a superblock).
    pub room: u64,
    /// The lvol's size: as it is, or as it will be made.
    pub size_bytes: u64,
}

/// The local replicas' steps of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPlan {
    /// The replicas placed (existing or to make), by k.
    pub replicas: Vec<LocalReplica>,
    /// Replicas waited for (their disk is not back yet): (k, disk).
    pub waiting: Vec<(usize, String)>,
    /// Replicas no disk can take now, and why.
    pub unplaced: Option<Blocked>,
    /// The replicas of a clone taken from its snapshot as they are (one
    /// point in time); the others start empty and are rebuilt.
    pub clone_set: BTreeSet<usize>,
    /// The replicas of a new volume made from its restored backup now
    /// ([`Make::Restore`]): with those that exist, the ones up to date;
    /// the others start empty and are rebuilt.
    pub restored: BTreeSet<usize>,
    /// Heads that get their snapshot (alias) as parent after the raid is
    /// made: those made now as [`Make::Head`], and those of a clone never
    /// exported (no ledger yet) that have none, left by a run that stopped
    /// between the raid and its parents.
    pub parents: BTreeMap<usize, String>,
    /// The lvol size of every local replica for the volume's size (grown to
    /// it, after its parent for a head).
    pub wanted: BTreeMap<usize, u64>,
}

/// The volume's size in whole MiB (SPDK sizes lvols in MiB).
pub fn size_mib(plan: &VolumePlan) -> u64 {
    plan.size_bytes.div_ceil(MIB).max(1)
}

/// Decides the local replicas of `plan` against `inv`: no RPC.
pub fn local(inv: &Inventory, plan: &VolumePlan) -> Result<LocalPlan, VolumeError> {
    let ks: Vec<usize> = (0..plan.replicas).collect();
    local_for(inv, plan, &ks, plan.uses_superblock())
}

/// [`local`] for replicas `ks` only, with `superblock` room or not: what a
/// node that serves replica k of a volume whose engine is elsewhere keeps
/// (the engine's raid puts its superblock in the replica's first MiB).
pub fn local_for(
    inv: &Inventory,
    plan: &VolumePlan,
    ks: &[usize],
    superblock: bool,
) -> Result<LocalPlan, VolumeError> {
    let vol = plan.name.as_str();
    let mib = size_mib(plan);
    let sb = superblock;
    let cluster = |disk: &str| inv.lvstore(disk).map_or(MIB, |l| l.cluster_size.max(1));
    let room = |disk: &str| if sb { superblock_room(cluster(disk)) } else { 0 };
    let whole = |bytes: u64, disk: &str| bytes.div_ceil(cluster(disk)).saturating_mul(cluster(disk));
    let lvol_mib = |disk: &str| mib + room(disk).div_ceil(MIB);
    let mut existing = BTreeMap::new();
    for &k in ks {
        let name = naming::replica(vol, k);
        check_len(vol, &name)?;
        if let Some(l) = inv.find_lvol(&name) {
            existing.insert(k, l.lvs.name.trim_start_matches(LVS_PREFIX).to_owned());
        }
    }
    let source = plan
        .from_snapshot
        .as_ref()
        .map(|(sv, ss)| (sv.as_str(), ss.as_str()));
    let clone_set: BTreeSet<usize> = match source {
        Some((sv, ss)) => point_in_time_set(inv, sv, ss, plan.snapshot_set.as_ref()),
        None => BTreeSet::new(),
    };
    // a clone lives in the lvstore of its snapshot
    let snapshot_of = |k: usize| {
        let (sv, ss) = source?;
        inv.find_lvol(&naming::snapshot_lvol(sv, k, ss))
    };
    let clone_of: Option<BTreeMap<usize, String>> = source.map(|_| {
        ks.iter()
            .copied()
            .filter_map(|k| {
                Some((
                    k,
                    snapshot_of(k)?.lvs.name.trim_start_matches(LVS_PREFIX).to_owned(),
                ))
            })
            .collect()
    });
    let restore = plan
        .restore
        .as_ref()
        .filter(|_| existing.is_empty() && plan.in_sync.is_none() && source.is_none());
    let ready = ready_disks(inv, plan);
    // a new replica promises its whole size on the disk it goes to
    let full: BTreeMap<String, String> = ready
        .keys()
        .filter_map(|d| {
            let more = whole(lvol_mib(d).saturating_mul(MIB), d);
            within_overcommit(inv, d, more, plan.overcommit_percent)
                .err()
                .map(|why| (d.clone(), why.to_string()))
        })
        .collect();
    let block_size: BTreeMap<String, u32> = inv
        .lvstores
        .iter()
        .filter_map(|l| Some((l.name.strip_prefix(LVS_PREFIX)?.to_owned(), l.block_size)))
        .collect();
    let decided = placement::place(&placement::Request {
        wanted: ks,
        listed: &plan.disks,
        ready: &ready,
        block_size: &block_size,
        away: &plan.disk_away,
        full: &full,
        existing: &existing,
        placed: &plan.placed,
        clone_of: clone_of.as_ref(),
    });
    if let Some((sv, ss)) = source
        && ks.contains(&0)
        && !decided.slots.contains_key(&0)
    {
        return Err(VolumeError::SnapshotMissing {
            volume: vol.to_owned(),
            lvol: naming::snapshot_lvol(sv, 0, ss),
        });
    }
    let mut out = LocalPlan {
        replicas: Vec::new(),
        waiting: Vec::new(),
        unplaced: None,
        clone_set: clone_set.clone(),
        restored: BTreeSet::new(),
        parents: BTreeMap::new(),
        wanted: BTreeMap::new(),
    };
    for (k, slot) in &decided.slots {
        let (disk, exists) = match slot {
            Slot::Exists(d) => (d, true),
            Slot::Create(d) => (d, false),
            Slot::WaitFor(d) => {
                out.waiting.push((*k, d.clone()));
                continue;
            }
            Slot::Unplaced => continue,
        };
        let name = naming::replica(vol, *k);
        let alias = format!("{}/{name}", naming::lvstore(disk));
        let snap = snapshot_of(*k).filter(|_| clone_set.contains(k));
        let snap_bytes = snap.and_then(|s| inv.bdev_size(&s.uuid)).unwrap_or(0);
        let (make, size_bytes) = if exists {
            let l = inv.lvols.get(&alias);
            let size = l.and_then(|l| inv.bdev_size(&l.uuid)).unwrap_or(0);
            // a clone's head with no parent yet, before its first export
            if let Some(s) = snap
                && sb
                && plan.in_sync.is_none()
                && l.is_some_and(|l| !l.is_clone)
            {
                out.parents.insert(*k, s.alias.clone());
            }
            (None, size)
        } else {
            match snap {
                Some(s) if sb => {
                    out.parents.insert(*k, s.alias.clone());
                    let make = Make::Head {
                        mib: snap_bytes / MIB,
                        snapshot: s.alias.clone(),
                    };
                    (Some(make), snap_bytes)
                }
                Some(s) => (
                    Some(Make::Clone {
                        snapshot: s.alias.clone(),
                    }),
                    snap_bytes,
                ),
                // a new volume from a backup: only before anything of it
                // exists or was served, on disks whose room matches the file
                None if restore.is_some_and(|r| r.data_offset == room(disk)) => {
                    out.restored.insert(*k);
                    let from = restore
                        .map(|r| r.from.clone())
                        .unwrap_or_else(|| super::mover::restore::Source::File(Default::default()));
                    (
                        Some(Make::Restore {
                            mib: lvol_mib(disk),
                            from,
                        }),
                        whole(lvol_mib(disk).saturating_mul(MIB), disk),
                    )
                }
                None => (
                    Some(Make::Thin { mib: lvol_mib(disk) }),
                    whole(lvol_mib(disk).saturating_mul(MIB), disk),
                ),
            }
        };
        out.wanted.insert(*k, mib * MIB + room(disk));
        out.replicas.push(LocalReplica {
            k: *k,
            disk: disk.clone(),
            name,
            alias,
            make,
            room: room(disk),
            size_bytes,
        });
    }
    if let Some(b) = &decided.blocked
        && out.replicas.is_empty()
    {
        return Err(VolumeError::NoPlacement {
            volume: vol.to_owned(),
            reason: b.reason.clone(),
            disk_failed: b.fails_now(),
        });
    }
    out.unplaced = decided.blocked;
    Ok(out)
}

/// A plan for volume `name` of `mib` MiB with `replicas` local replicas
/// (a raid superblock or not), exported on 127.0.0.1:4420 to nobody: the
/// unit tests' plan.
#[cfg(test)]
pub(super) fn test_plan(name: &str, mib: u64, replicas: usize, superblock: bool) -> VolumePlan {
    let mut p = VolumePlan::new(
        ObjectName::parse("volume", name).expect("name"),
        mib * MIB,
        replicas,
        ExportSpec::plain([127, 0, 0, 1].into(), 4420, vec![]),
    );
    p.superblock = superblock;
    p
}

#[cfg(test)]
mod tests {
    //! The local plan against hand-built inventories: no double, no SPDK.

    use super::*;

    #[test]
    fn thin_lvols_on_a_disk_add_up_to_the_overcommit_bound_and_no_further() {
        const G: u64 = 1 << 30;
        assert!(commitment(4 * G, 0, 20 * G, 500).is_ok());
        assert!(commitment(4 * G, 16 * G, 4 * G, 500).is_ok());
        let e = commitment(4 * G, 16 * G, 4 * G + 1, 500).expect_err("past 500%");
        assert_eq!(
            e.to_string(),
            "its thin lvols promise 16 GiB (17179869184 bytes), and 4.0 GiB (4294967297 bytes) more \
             would pass 500% of its 4 GiB (4294967296 bytes)"
        );
        // sizes near 2^64 are compared, never wrapped
        assert!(commitment(4 * G, u64::MAX, u64::MAX, 100_000).is_err());
        assert!(commitment(u64::MAX, 0, u64::MAX, 100).is_ok());
    }
    use crate::spdk::rpc::{Bdev, Lvol, LvolStoreRef, Lvstore};

    const CLUSTER: u64 = 4 * MIB;

    /// An inventory with lvstores `talon-<disk>` of 4 MiB clusters.
    fn inv(disks: &[&str]) -> Inventory {
        let mut i = Inventory::default();
        for d in disks {
            i.lvstores.push(Lvstore {
                uuid: format!("u-{d}"),
                name: format!("talon-{d}"),
                base_bdev: format!("talon-disk-{d}"),
                total_data_clusters: 1024,
                free_clusters: 1024,
                block_size: 4096,
                cluster_size: CLUSTER,
            });
        }
        i
    }

    /// Adds lvol `name` of `bytes` to disk `d`'s lvstore.
    fn lvol(i: &mut Inventory, d: &str, name: &str, bytes: u64, snapshot: bool, clone: bool) {
        let uuid = format!("uuid-{d}-{name}");
        let alias = format!("talon-{d}/{name}");
        i.lvols.insert(
            alias.clone(),
            Lvol {
                alias: alias.clone(),
                uuid: uuid.clone(),
                name: name.into(),
                is_thin_provisioned: true,
                is_snapshot: snapshot,
                is_clone: clone,
                is_esnap_clone: false,
                num_allocated_clusters: 0,
                lvs: LvolStoreRef {
                    name: format!("talon-{d}"),
                    uuid: format!("u-{d}"),
                },
            },
        );
        i.bdevs.insert(
            uuid.clone(),
            Bdev {
                name: uuid,
                aliases: vec![alias],
                product_name: "Logical Volume".into(),
                block_size: 4096,
                num_blocks: bytes / 4096,
                uuid: None,
                claimed: false,
                claim_type: None,
                assigned_rate_limits: None,
                driver_specific: serde_json::Value::Null,
                md_size: 0,
                md_interleave: false,
            },
        );
    }

    fn vplan(name: &str, mib: u64, replicas: usize, superblock: bool) -> VolumePlan {
        test_plan(name, mib, replicas, superblock)
    }

    #[test]
    fn new_replicas_of_a_superblock_volume_get_one_cluster_of_room() {
        let i = inv(&["a", "b"]);
        let p = local(&i, &vplan("v", 10, 2, true)).expect("plan");
        assert_eq!(p.replicas.len(), 2);
        for r in &p.replicas {
            // 10 MiB + one 4 MiB cluster of room, made as 14 MiB (whole clusters: 16)
            assert_eq!(r.make, Some(Make::Thin { mib: 14 }), "{r:?}");
            assert_eq!(r.room, CLUSTER);
            assert_eq!(r.size_bytes, 16 * MIB);
            assert_eq!(p.wanted[&r.k], 14 * MIB);
        }
        assert_ne!(p.replicas[0].disk, p.replicas[1].disk, "distinct disks");
        assert!(p.parents.is_empty() && p.waiting.is_empty() && p.unplaced.is_none());
    }

    #[test]
    fn a_new_volume_from_a_backup_makes_its_replicas_from_the_file_only_while_nothing_of_it_exists() {
        let file = super::super::mover::restore::Source::File("/data/restore/v.img".into());
        let restore = |offset| RestoreFile {
            from: file.clone(),
            data_offset: offset,
        };
        let i = inv(&["a", "b"]);
        let mut p = vplan("v", 10, 2, true);
        p.restore = Some(restore(CLUSTER));
        let l = local(&i, &p).expect("plan");
        assert_eq!(l.restored, [0, 1].into());
        for r in &l.replicas {
            assert_eq!(
                r.make,
                Some(Make::Restore {
                    mib: 14,
                    from: file.clone()
                }),
                "{r:?}"
            );
        }
        // a file made for another room: those replicas start empty (rebuilt)
        p.restore = Some(restore(MIB));
        let l = local(&i, &p).expect("plan");
        assert!(l.restored.is_empty());
        assert!(
            l.replicas
                .iter()
                .all(|r| matches!(r.make, Some(Make::Thin { .. })))
        );
        // one replica exists already (a run that got that far): the other is not restored again
        let mut j = inv(&["a", "b"]);
        lvol(&mut j, "a", "v-r0", 16 * MIB, false, false);
        p.restore = Some(restore(CLUSTER));
        let l = local(&j, &p).expect("plan");
        assert!(l.restored.is_empty());
        assert_eq!(l.replicas.iter().filter(|r| r.make.is_some()).count(), 1);
        assert!(matches!(
            l.replicas.iter().find(|r| r.k == 1).and_then(|r| r.make.clone()),
            Some(Make::Thin { .. })
        ));
        // served before (a ledger): never restored again
        p.in_sync = Some([0].into());
        let l = local(&i, &p).expect("plan");
        assert!(l.restored.is_empty());
    }

    #[test]
    fn old_layout_and_single_replicas_have_no_room() {
        let i = inv(&["a", "b"]);
        let legacy = local(&i, &vplan("v", 10, 2, false)).expect("plan");
        assert!(
            legacy
                .replicas
                .iter()
                .all(|r| r.room == 0 && r.make == Some(Make::Thin { mib: 10 }))
        );
        let one = local(&i, &vplan("w", 10, 1, true)).expect("plan");
        assert_eq!(one.replicas[0].room, 0, "one replica: no raid, no superblock");
    }

    #[test]
    fn existing_replicas_are_kept_where_they_are_and_measured() {
        let mut i = inv(&["a", "b", "c"]);
        lvol(&mut i, "c", "v-r1", 12 * MIB, false, false);
        let p = local(&i, &vplan("v", 10, 2, true)).expect("plan");
        let r1 = p.replicas.iter().find(|r| r.k == 1).expect("r1");
        assert_eq!(
            (r1.disk.as_str(), r1.make.clone(), r1.size_bytes),
            ("c", None, 12 * MIB)
        );
        assert_eq!(p.wanted[&1], 14 * MIB, "grown to the volume plus room");
        let r0 = p.replicas.iter().find(|r| r.k == 0).expect("r0");
        assert_ne!(r0.disk, "c");
    }

    #[test]
    fn a_clone_of_a_superblock_volume_makes_heads_that_get_their_snapshot_after_the_raid() {
        let mut i = inv(&["a", "b"]);
        lvol(&mut i, "a", "src-r0.s.s1", 16 * MIB, true, false);
        lvol(&mut i, "b", "src-r1.s.s1", 16 * MIB, true, false);
        let mut p = vplan("cl", 10, 2, true);
        p.from_snapshot = Some((
            ObjectName::parse("volume", "src").expect("n"),
            ObjectName::parse("snapshot", "s1").expect("n"),
        ));
        p.snapshot_set = Some([0, 1].into());
        let d = local(&i, &p).expect("plan");
        assert_eq!(d.clone_set, [0, 1].into());
        for r in &d.replicas {
            let snap = format!("talon-{}/src-r{}.s.s1", r.disk, r.k);
            assert_eq!(
                r.make,
                Some(Make::Head {
                    mib: 16,
                    snapshot: snap.clone()
                }),
                "a fresh head of the snapshot's size, in its lvstore"
            );
            assert_eq!(d.parents[&r.k], snap);
        }
        // the old layout clones
        p.superblock = false;
        let d = local(&i, &p).expect("plan");
        assert!(
            d.replicas
                .iter()
                .all(|r| matches!(r.make, Some(Make::Clone { .. })))
        );
        assert!(d.parents.is_empty());
    }

    #[test]
    fn a_clone_head_left_without_its_parent_gets_it_before_the_first_export_only() {
        let mut i = inv(&["a", "b"]);
        lvol(&mut i, "a", "src-r0.s.s1", 16 * MIB, true, false);
        lvol(&mut i, "b", "src-r1.s.s1", 16 * MIB, true, false);
        lvol(&mut i, "a", "cl-r0", 16 * MIB, false, false);
        let mut p = vplan("cl", 10, 2, true);
        p.from_snapshot = Some((
            ObjectName::parse("volume", "src").expect("n"),
            ObjectName::parse("snapshot", "s1").expect("n"),
        ));
        let d = local(&i, &p).expect("plan");
        assert_eq!(d.clone_set, [0].into(), "nothing recorded: one source");
        assert_eq!(d.parents.get(&0).map(String::as_str), Some("talon-a/src-r0.s.s1"));
        let r1 = d.replicas.iter().find(|r| r.k == 1).expect("r1");
        assert_eq!(
            (r1.disk.as_str(), r1.make.clone()),
            ("b", Some(Make::Thin { mib: 14 })),
            "the others start empty, beside their snapshot"
        );
        // once exported (a ledger exists), a head without a parent is its own data
        p.in_sync = Some([0].into());
        assert!(local(&i, &p).expect("plan").parents.is_empty());
    }

    #[test]
    fn a_clone_whose_first_snapshot_is_missing_is_refused_by_name() {
        let i = inv(&["a"]);
        let mut p = vplan("cl", 10, 1, false);
        p.from_snapshot = Some((
            ObjectName::parse("volume", "src").expect("n"),
            ObjectName::parse("snapshot", "s1").expect("n"),
        ));
        let e = local(&i, &p).expect_err("no snapshot");
        assert!(e.to_string().contains("src-r0.s.s1"), "{e}");
    }

    #[test]
    fn a_disk_whose_thin_replicas_promise_past_the_bound_takes_no_new_one() {
        // 1024 clusters of CLUSTER bytes each; 500%: 5120 clusters' worth may be promised
        let cap = 1024 * CLUSTER;
        let mut i = inv(&["a", "b"]);
        lvol(&mut i, "a", "old-r0", 4 * cap, false, false);
        lvol(&mut i, "a", "old-r0.s.s1", 4 * cap, true, false);
        assert_eq!(i.committed("a"), Some(4 * cap), "snapshots promise nothing more");
        let big = vplan("v", 2 * cap / MIB, 1, false);
        let p = local(&i, &big).expect("plan");
        assert_eq!(p.replicas[0].disk, "b", "a would pass 500%: {p:?}");
        // one disk only: refused, naming the disk and the figures
        i.lvstores.retain(|l| l.name == "talon-a");
        let e = local(&i, &big).expect_err("full");
        let m = e.to_string();
        assert!(
            matches!(
                e,
                VolumeError::NoPlacement {
                    disk_failed: false,
                    ..
                }
            ),
            "{m}"
        );
        assert!(
            m.contains("a is full: its thin lvols promise") && m.contains("would pass 500%"),
            "{m}"
        );
        // a higher bound takes it
        let mut more = vplan("v", 2 * cap / MIB, 1, false);
        more.overcommit_percent = 700;
        assert_eq!(local(&i, &more).expect("plan").replicas[0].disk, "a");
        // figures past 2^64 make the disk full, never a panic or a wrap
        lvol(&mut i, "a", "huge-r0", u64::MAX, false, false);
        assert_eq!(i.committed("a"), None);
        let e = local(&i, &vplan("w", 1, 1, false)).expect_err("nonsense");
        assert!(e.to_string().contains("past 2^64 bytes"), "{e}");
    }

    #[test]
    fn replicas_wait_for_their_disk_and_report_what_cannot_be_placed() {
        let mut i = inv(&["a"]);
        let mut p = vplan("v", 10, 2, true);
        p.placed = [(1, "b".to_string())].into();
        let d = local(&i, &p).expect("plan");
        assert_eq!(d.waiting, vec![(1, "b".to_string())]);
        assert_eq!(d.replicas.len(), 1);
        i.lvstores.clear();
        let e = local(&i, &vplan("w", 10, 2, true)).expect_err("no disk");
        assert!(matches!(e, VolumeError::NoPlacement { .. }), "{e}");
    }
}
