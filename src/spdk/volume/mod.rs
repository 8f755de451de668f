//! V2 volume operations over [`SpdkClient`]: replicas, engine, export,
//! snapshot, clone, expand, revert, delete and orphan listing, by the names of
//! the V2 contract (`/work/helpers/V2-CONTRACT.md`).
//!
//! ```text
//!   Inventory::load (6 list calls, concurrent) ──> what exists
//!          │
//!   VolumeOps::ensure(VolumePlan)                 talon-<disk>/<vol>-r<k>  (thin lvols, concurrent)
//!          │  missing objects only,                      │ 1 replica: the lvol is the engine
//!          │  each one recorded in `Made`                v ≥2: raid1 talon-raid-<vol>
//!          │  and undone in reverse on error      nvmf subsystem Nqn::for_volume, ns 1
//!          v                                      (nguid/uuid = volume_uuid), listener, hosts
//!   VolumeInfo (size, replicas, export)
//! ```
//!
//! Single replica: the lvol itself is exported, no raid1. A raid1 must have two
//! members in SPDK, and the one-member workaround (raid1 with a `bdev_null`
//! placeholder removed afterwards) measured the same IOPS as the bare lvol
//! (0.95-1.19x, shared/spdk/README.md; `benches/spdk_volume.rs` compares them
//! again) while adding two objects to create, track and rebuild after every
//! restart. A second replica added later replaces the namespace's bdev.
//!
//! By concept: this file has the types, `ensure` (replicas, then the raid
//! and the export), `delete` and the orphans; `raid.rs` the raid1,
//! `export.rs` the NVMe-oF exports and attaches, `snapshot.rs` snapshots,
//! `revert.rs` reverts (one core for both engines), `rebuild.rs` thin
//! rebuilds, `plan.rs` what a volume should be.
//!
//! Every operation is idempotent: it compares with the [`Inventory`] and
//! creates only what is missing; a failed multi-step operation deletes what it
//! created. Objects whose names are not talon's (see [`Owned`]) are never
//! touched.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures::future::{join_all, try_join_all};

use super::client::{ClientError, SpdkClient};
use super::error::ErrorKind;
use super::placement::Blocked;
use super::rpc::{
    ByName, ByNqn, CreateTransport, GetTransports, ListenAddress, Lvol, LvolClone, LvolCreate, LvolSetParent,
    RaidDelete, RemoveNamespace, SubsystemListener,
};
use crate::names::{NQN_PREFIX, Nqn, ObjectName};
use crate::util::nvme_auth::{self as dhchap, TlsPsk};

// the names and the inventory moved to their own modules; kept here for callers
mod engine;
pub mod error;
mod export;
pub mod freeze;
pub mod from_file;
pub mod lvol;
pub mod plan;
mod raid;
mod rebuild;
pub mod replica_lvols;
mod revert;
mod snapshot;
pub mod thin;
pub mod to_file;
pub use engine::{EngineNames, EnginePlan};
pub use export::{Export, NewSubsystem, RemoteAttach};
pub use rebuild::{PrepareError, RemoteDest};

pub use super::inventory::{Inventory, Owned, applied_revert, replica_heads};
pub use super::naming::{
    self, LVS_PREFIX, LvolRole, NSID, NULL_PREFIX, RAID_PREFIX, REMOTE_PREFIX, parse_lvol,
};
pub use error::VolumeError;
use plan::Make;
pub use plan::{ExportSpec, VolumePlan, point_in_time_set, superblock_room};
pub use revert::{RevertHead, TakeDown};
pub use snapshot::{Member, PointInTime, Taken, Unfreezable};
const MIB: u64 = 1 << 20;

fn rpc(volume: &str, step: impl Into<String>) -> impl FnOnce(ClientError) -> VolumeError {
    let (volume, step) = (volume.to_owned(), step.into());
    move |source| VolumeError::Rpc { volume, step, source }
}

fn no_current(plan: &VolumePlan, present: &[ReplicaInfo]) -> VolumeError {
    let vol = plan.name.as_str();
    let here: BTreeSet<usize> = present.iter().map(|r| r.k).collect();
    let waiting = match &plan.in_sync {
        Some(s) => s
            .iter()
            .filter(|k| !here.contains(k))
            .map(|k| match plan.placed.get(k) {
                Some(d) => format!("{} on disk {d}", naming::replica(vol, *k)),
                None => naming::replica(vol, *k),
            })
            .collect(),
        None => Vec::new(),
    };
    VolumeError::NoCurrentReplica {
        volume: vol.to_owned(),
        waiting,
        stale: present.iter().map(|r| r.name.clone()).collect(),
    }
}

fn no_placement(volume: &str, b: &Blocked) -> VolumeError {
    VolumeError::NoPlacement {
        volume: volume.to_owned(),
        reason: b.reason.clone(),
        disk_failed: b.disk_failed,
    }
}

/// What [`VolumeOps::snapshot`] took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshotted {
    /// The snapshot lvol aliases of every local replica that has one.
    pub lvols: Vec<String>,
    /// The replicas whose snapshots this call took at one point in time
    /// (empty when they all existed already): what the ledger records.
    pub point_in_time: BTreeSet<usize>,
}

/// The snapshot of remote replica `k`, taken on its node by the caller's
/// future (polled while this node's export is frozen).
pub type RemoteSnapshot<'a> = (usize, futures::future::BoxFuture<'a, Result<(), String>>);

/// One replica as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaInfo {
    /// k.
    pub k: usize,
    /// `<vol>-r<k>`.
    pub name: String,
    /// The disk.
    pub disk: String,
    /// The lvol bdev (UUID).
    pub bdev: String,
    /// `talon-<disk>/<vol>-r<k>`.
    pub alias: String,
    /// Size.
    pub size_bytes: u64,
    /// Allocated bytes.
    pub allocated_bytes: u64,
}

/// A volume as served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// The exported bdev.
    pub device: String,
    /// Namespace size.
    pub size_bytes: u64,
    /// The NQN.
    pub nqn: String,
    /// Replicas present.
    pub replicas: Vec<ReplicaInfo>,
    /// Replicas asked for.
    pub wanted: usize,
    /// Replicas waited for (disk not back yet).
    pub waiting: Vec<(usize, String)>,
    /// Replicas that hold the newest data (the engine serves from these).
    pub in_sync: BTreeSet<usize>,
    /// The replica being rebuilt and how far it is (percent).
    pub rebuilding: Option<(usize, u32)>,
    /// Replicas present but behind, waiting for their turn to be rebuilt.
    pub stale: Vec<usize>,
    /// Replicas no disk can take now, and why.
    pub unplaced: Option<Blocked>,
}

/// How the engine's replicas stand after [`VolumeOps::ensure`].
#[derive(Debug, Default)]
struct SyncState {
    in_sync: BTreeSet<usize>,
    rebuilding: Option<(usize, u32)>,
    stale: Vec<usize>,
}

#[derive(Debug)]
enum Made {
    Lvol(String),
    Null(String),
    /// A raid made by this call, and whether it has a superblock.
    Raid(String, bool),
    Subsystem(String),
    Namespace(String),
    Listener(String, ListenAddress),
}

/// The operations.
#[derive(Debug, Clone)]
pub struct VolumeOps {
    client: SpdkClient,
    /// Held while the TCP transport is looked up and made, so the clones of
    /// these operations ask once. Operations of their own (the Longhorn
    /// controller's, its services') may ask at the same time: spdk_tgt v26.05
    /// makes one transport and refuses the others (-32603 "Transport type
    /// 'TCP' already exists", checked on a real target with four concurrent
    /// creates through four connections), which [`VolumeOps::ensure_transport`]
    /// takes as the transport being there.
    transport: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// The host NQN this node's target connects to remote replicas with (the
    /// serving node allows only it).
    host_nqn: Option<String>,
    /// The thin rebuilds running (see [`rebuild`]).
    rebuilds: rebuild::Rebuilds,
    /// Whether replicas that are behind are rebuilt thin (else by SPDK's
    /// raid rebuild, which writes every block).
    thin_rebuild: bool,
}

impl VolumeOps {
    /// Operations over `client`.
    pub fn new(client: SpdkClient) -> Self {
        Self {
            client,
            transport: Default::default(),
            host_nqn: None,
            rebuilds: Default::default(),
            thin_rebuild: true,
        }
    }

    /// Rebuilds replicas with SPDK's raid rebuild (every block written)
    /// instead of thin copies (for comparison: `benches/`).
    pub fn with_full_rebuild(mut self, full: bool) -> Self {
        self.thin_rebuild = !full;
        self
    }

    /// Makes sure the target has its one NVMe/TCP transport: an existing one
    /// is adopted (after a restart of talon), a missing one is made, once,
    /// under one lock shared by every clone of these operations. Returns
    /// whether it made one.
    pub async fn ensure_transport(&self) -> Result<bool, ClientError> {
        let _one_at_a_time = self.transport.lock().await;
        let have = self.client.nvmf_get_transports(&GetTransports::default()).await?;
        if have.iter().any(|t| t.trtype.eq_ignore_ascii_case("tcp")) {
            return Ok(false);
        }
        match self.client.nvmf_create_transport(&CreateTransport::tcp()).await {
            Ok(_) => Ok(true),
            Err(e) if e.is(ErrorKind::AlreadyExists) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Attaches remote replicas as host `nqn` (talon's host NQN on this node).
    pub fn with_host_nqn(mut self, nqn: Option<String>) -> Self {
        self.host_nqn = nqn;
        self
    }

    /// The client.
    pub fn client(&self) -> &SpdkClient {
        &self.client
    }

    async fn undo(&self, made: Vec<Made>) {
        for m in made.into_iter().rev() {
            let r = match &m {
                Made::Lvol(a) => self.client.bdev_lvol_delete(&ByName::new(a)).await.map(|_| ()),
                Made::Null(n) => ignore_missing(self.client.bdev_null_delete(&ByName::new(n))).await,
                // a superblock this call wrote goes with its raid: left on a
                // member that stays, it would make SPDK refuse the next raid
                // over it (a different raid's superblock)
                Made::Raid(n, sb) => self
                    .client
                    .bdev_raid_delete(&RaidDelete {
                        name: n.clone(),
                        clear_sb: sb.then_some(true),
                    })
                    .await
                    .map(|_| ()),
                Made::Subsystem(n) => self
                    .client
                    .nvmf_delete_subsystem(&ByNqn { nqn: n.clone() })
                    .await
                    .map(|_| ()),
                Made::Namespace(n) => self
                    .client
                    .nvmf_subsystem_remove_ns(&RemoveNamespace {
                        nqn: n.clone(),
                        nsid: NSID,
                    })
                    .await
                    .map(|_| ()),
                Made::Listener(n, a) => self
                    .client
                    .nvmf_subsystem_remove_listener(&SubsystemListener {
                        nqn: n.clone(),
                        listen_address: a.clone(),
                    })
                    .await
                    .map(|_| ()),
            };
            if let Err(e) = r {
                tracing::warn!(object = ?m, error = %e, "rollback step failed; orphan cleanup retries it");
            }
        }
    }

    /// Makes the volume exist and be exported, creating only what is missing;
    /// rolls back what this call created when a step fails.
    pub async fn ensure(&self, inv: &Inventory, plan: &VolumePlan) -> Result<VolumeInfo, VolumeError> {
        let mut made = Vec::new();
        match self.ensure_inner(inv, plan, &mut made).await {
            Ok(i) => Ok(i),
            Err(e) => {
                self.undo(made).await;
                Err(e)
            }
        }
    }

    async fn ensure_inner(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        made: &mut Vec<Made>,
    ) -> Result<VolumeInfo, VolumeError> {
        let vol = plan.name.as_str();
        let size_mib = plan::size_mib(plan);
        // the local replicas: one pure decision (plan::local)
        let local = plan::local(inv, plan)?;
        let mut waiting = local.waiting.clone();
        let unplaced = local.unplaced.clone();

        // create missing replicas, and the transport and subsystem, concurrently
        let names = EngineNames::volume(&plan.name);
        let nqn = &names.nqn;
        let creates = local
            .replicas
            .iter()
            .filter_map(|r| Some((r, r.make.as_ref()?)))
            .map(|(r, make)| async move {
                self.make_replica(vol, &r.disk, &r.name, make)
                    .await
                    .map(|uuid| (r.alias.clone(), uuid))
            });
        let subsystem = async {
            if !inv.tcp_transport {
                self.ensure_transport()
                    .await
                    .map_err(rpc(vol, "creating the TCP transport"))?;
            }
            if inv.subsystem(nqn.as_str()).is_some() {
                return Ok(false);
            }
            self.client
                .nvmf_create_subsystem(&names.subsystem.create(nqn))
                .await
                .map(|_| true)
                .map_err(rpc(vol, format!("creating subsystem {nqn}")))
        };
        let (lvols, sub) = futures::join!(join_all(creates), subsystem);
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
        match sub {
            Ok(true) => made.push(Made::Subsystem(nqn.as_str().to_owned())),
            Ok(false) => {}
            Err(e) => first_err = first_err.or(Some(e)),
        }
        if let Some(e) = first_err {
            return Err(e);
        }

        // replica facts
        let mut replicas = Vec::new();
        for r in &local.replicas {
            let cluster = inv.lvstore(&r.disk).map_or(MIB, |s| s.cluster_size);
            let (bdev, allocated) = match inv.lvols.get(&r.alias) {
                Some(l) => (l.uuid.clone(), l.num_allocated_clusters.saturating_mul(cluster)),
                None => (new_bdevs.get(&r.alias).cloned().unwrap_or_default(), 0),
            };
            replicas.push(ReplicaInfo {
                k: r.k,
                name: r.name.clone(),
                disk: r.disk.clone(),
                bdev,
                alias: r.alias.clone(),
                size_bytes: r.size_bytes,
                allocated_bytes: allocated,
            });
        }

        // remote replicas: attached over NVMe/TCP from the nodes that serve them;
        // one that does not answer is waited for like a disk that is away
        for (i, (addr, port)) in plan.remote.iter().enumerate() {
            let k = plan.replicas + i;
            let name = naming::replica(vol, k);
            let ctrl = format!("{REMOTE_PREFIX}{name}");
            let nqn =
                Nqn::for_replica(&plan.name, &format!("r{k}")).map_err(|source| VolumeError::BadName {
                    volume: vol.to_owned(),
                    source,
                })?;
            let bdev = format!("{ctrl}n1");
            let a = RemoteAttach {
                controller: &ctrl,
                address: *addr,
                port: *port,
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
            match size {
                Some(size_bytes) => replicas.push(ReplicaInfo {
                    k,
                    name,
                    disk: format!("{addr}:{port}"),
                    bdev,
                    alias: nqn.as_str().to_owned(),
                    size_bytes,
                    allocated_bytes: 0,
                }),
                None => waiting.push((k, format!("{addr}:{port}"))),
            }
        }

        // grow local replicas that are smaller than asked (expand), then the engine
        // follows; a remote replica grows on its own node (the controller asks
        // it to), and the raid1 follows its smallest member. A head that gets its
        // snapshot as parent below keeps the snapshot's size until then (SPDK
        // sets a parent of the same size only).
        let room_of: BTreeMap<usize, u64> = local.replicas.iter().map(|r| (r.k, r.room)).collect();
        // a remote member's room is at least SPDK's minimum data offset (1 MiB;
        // its NVMe bdev's optimal I/O boundary may round it up)
        let remote_room = if plan.uses_superblock() { MIB } else { 0 };
        let local_room = |r: &ReplicaInfo| room_of.get(&r.k).copied().unwrap_or(remote_room);
        let wanted = |r: &ReplicaInfo| size_mib * MIB + local_room(r);
        let orphan_heads: BTreeSet<usize> = local.parents.keys().copied().collect();
        let grew = replicas.iter().any(|r| r.size_bytes < wanted(r));
        let grow: Vec<ReplicaInfo> = replicas
            .iter()
            .filter(|r| r.size_bytes < wanted(r) && r.k < plan.replicas && !orphan_heads.contains(&r.k))
            .cloned()
            .collect();
        for r in &grow {
            plan::within_overcommit(inv, &r.disk, wanted(r) - r.size_bytes, plan.overcommit_percent)
                .map_err(|reason| VolumeError::Overcommit {
                    volume: vol.to_owned(),
                    replica: r.alias.clone(),
                    disk: r.disk.clone(),
                    bytes: wanted(r),
                    reason,
                })?;
        }
        self.grow(vol, &grow, size_mib, &local_room).await?;
        for r in replicas
            .iter_mut()
            .filter(|r| r.k < plan.replicas && !orphan_heads.contains(&r.k))
        {
            r.size_bytes = r.size_bytes.max(wanted(r));
        }

        // engine: the lvol itself (one replica), or raid1 over the replicas that
        // are up to date, with the others rebuilt into it one at a time
        let created: BTreeSet<usize> = local
            .replicas
            .iter()
            .filter(|r| r.make.is_some())
            .map(|r| r.k)
            .collect();
        let fresh = local.replicas.iter().all(|r| r.make.is_some());
        let trusted = |k: usize| match &plan.in_sync {
            Some(s) => s.contains(&k) && !created.contains(&k),
            // a new clone: only the replicas cloned from one point in time
            None if plan.from_snapshot.is_some() => local.clone_set.contains(&k),
            // a new volume from a backup: the replicas restored now, or by a run
            // that got that far (one cut off in its copy is removed before)
            None if plan.restore.is_some() => {
                local.restored.contains(&k) || (k < plan.replicas && !created.contains(&k) && !fresh)
            }
            None => fresh || !created.contains(&k),
        };
        let (device, sync) = if plan.replicas + plan.remote.len() <= 1 {
            match replicas.first() {
                Some(r) if trusted(r.k) => (
                    r.bdev.clone(),
                    SyncState {
                        in_sync: BTreeSet::from([r.k]),
                        ..SyncState::default()
                    },
                ),
                _ => return Err(no_current(plan, &replicas)),
            }
        } else {
            self.ensure_raid(inv, plan, &replicas, &trusted, made).await?
        };
        let is_raid = device == naming::raid(vol);

        // a clone with a superblock: its heads get their snapshots as parents
        // now that the raid's superblock is in their own first cluster; then
        // they grow to the volume's size. Before the first export only (no
        // ledger yet): a head without a parent then can only be one made here,
        // or by a run that stopped between the raid and this step.
        if !local.parents.is_empty() {
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
                if r.size_bytes < wanted(r) {
                    grown.push(r.clone());
                }
                r.size_bytes = r.size_bytes.max(wanted(r));
            }
            self.grow(vol, &grown, size_mib, &local_room).await?;
        }

        // export: namespace, listener, hosts (a kernel host: never TLS)
        let spec = plan.host_export();
        self.export_ns(inv, vol, &names.export(&device, &spec), made)
            .await?;

        // the size the host sees: looked up only when it may differ from the replicas'
        let min_replica = replicas
            .iter()
            .map(|r| r.size_bytes.saturating_sub(local_room(r)))
            .min()
            .unwrap_or(0);
        let size_bytes = if is_raid && (grew || !orphan_heads.is_empty() || inv.raid(&device).is_none()) {
            match self
                .client
                .bdev(&device)
                .await
                .map_err(rpc(vol, format!("looking up {device}")))?
            {
                Some(b) => b.size_bytes(),
                None => 0,
            }
        } else if is_raid {
            inv.bdev_size(&device).unwrap_or(min_replica)
        } else {
            min_replica
        };
        if is_raid && size_bytes < min_replica {
            return Err(VolumeError::RaidDidNotGrow {
                volume: vol.to_owned(),
                raid: device,
                actual: size_bytes,
                wanted: min_replica,
            });
        }
        if size_bytes > 0 && plan.size_bytes < size_bytes.saturating_sub(MIB) {
            tracing::info!(
                volume = vol,
                served = size_bytes,
                asked = plan.size_bytes,
                "volumes do not shrink"
            );
        }
        Ok(VolumeInfo {
            device,
            size_bytes,
            nqn: nqn.as_str().to_owned(),
            replicas,
            wanted: plan.replicas + plan.remote.len(),
            waiting,
            in_sync: sync.in_sync,
            rebuilding: sync.rebuilding,
            stale: sync.stale,
            unplaced,
        })
    }

    /// Makes replica lvol `name` on `disk` as the plan says; returns its UUID.
    async fn make_replica(
        &self,
        vol: &str,
        disk: &str,
        name: &str,
        make: &Make,
    ) -> Result<String, VolumeError> {
        let lvs = naming::lvstore(disk);
        let made = match make {
            Make::Thin { mib } | Make::Head { mib, .. } => {
                self.client
                    .bdev_lvol_create(&LvolCreate::thin(&lvs, name, *mib))
                    .await
            }
            Make::Clone { snapshot } => {
                self.client
                    .bdev_lvol_clone(&LvolClone {
                        snapshot_name: snapshot.clone(),
                        clone_name: name.to_owned(),
                    })
                    .await
            }
            Make::Restore { mib, file } => {
                let uuid = self
                    .client
                    .bdev_lvol_create(&LvolCreate::thin(&lvs, name, *mib))
                    .await
                    .map_err(rpc(vol, format!("creating replica lvol {lvs}/{name}")))?;
                let alias = format!("{lvs}/{name}");
                let block = self.lvstore_block_size(&lvs).await;
                let bdev = format!("talon-restore-{name}");
                if let Err(why) = from_file::copy_from_file(&self.client, file, block, &alias, &bdev).await {
                    // nothing half-made stays: the lvol goes (copy_from_file may have deleted it)
                    let _ = ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&alias))).await;
                    return Err(VolumeError::Restore {
                        volume: vol.to_owned(),
                        replica: alias,
                        reason: why,
                    });
                }
                Ok(uuid)
            }
        };
        made.map_err(rpc(vol, format!("creating replica lvol {lvs}/{name}")))
    }

    /// The block size of lvstore `lvs` (4096 when it cannot be listed).
    async fn lvstore_block_size(&self, lvs: &str) -> u32 {
        match self.client.bdev_lvol_get_lvstores(&Default::default()).await {
            Ok(list) => list.iter().find(|l| l.name == lvs).map_or(4096, |l| l.block_size),
            Err(_) => 4096,
        }
    }

    /// Grows local replicas to the volume's `size_mib` plus their superblock
    /// room, concurrently.
    async fn grow(
        &self,
        vol: &str,
        grow: &[ReplicaInfo],
        size_mib: u64,
        room: &(dyn Fn(&ReplicaInfo) -> u64 + Sync),
    ) -> Result<(), VolumeError> {
        try_join_all(grow.iter().map(|r| async move {
            let mib = size_mib + room(r).div_ceil(MIB);
            lvol::resize(&self.client, &r.alias, mib)
                .await
                .map_err(rpc(vol, format!("resizing replica {} to {mib} MiB", r.alias)))
        }))
        .await
        .map(|_| ())
    }

    /// Deletes the volume's export, engine and replica heads (and revert
    /// markers); absent objects are fine. Snapshots stay (their own resources).
    pub async fn delete(&self, inv: &Inventory, vol: &ObjectName) -> Result<(), VolumeError> {
        let v = vol.as_str();
        let nqn = Nqn::for_volume(vol);
        let served = format!("{NQN_PREFIX}:replica:{v}:");
        // the keys of the hosts of its exports, freed once the exports are gone
        let dropped: BTreeSet<String> = inv
            .subsystems
            .iter()
            .filter(|s| s.nqn == nqn.as_str() || s.nqn.starts_with(&served))
            .flat_map(|s| s.hosts.iter())
            .flat_map(|h| {
                [h.dhchap_key.clone(), h.dhchap_ctrlr_key.clone()]
                    .into_iter()
                    .flatten()
                    .chain([dhchap::keyring_name::<TlsPsk>(&h.nqn)])
            })
            .collect();
        if inv.subsystem(nqn.as_str()).is_some() {
            ignore_missing(self.client.nvmf_delete_subsystem(&ByNqn {
                nqn: nqn.as_str().to_owned(),
            }))
            .await
            .map_err(rpc(v, format!("deleting subsystem {nqn}")))?;
        }
        let raid = naming::raid(v);
        if inv.raid(&raid).is_some() {
            ignore_missing(self.client.bdev_raid_delete(&RaidDelete::new(&raid)))
                .await
                .map_err(rpc(v, format!("deleting raid {raid}")))?;
        }
        for c in inv
            .controllers
            .iter()
            .filter(|c| matches!(c.strip_prefix(REMOTE_PREFIX).and_then(parse_lvol), Some(LvolRole::Replica { volume, .. }) if volume == v))
        {
            lvol::detach_controller(&self.client, c)
                .await
                .map_err(rpc(v, format!("detaching remote replica {c}")))?;
        }
        for sub in inv.subsystems.iter().filter(|s| s.nqn.starts_with(&served)) {
            ignore_missing(self.client.nvmf_delete_subsystem(&ByNqn { nqn: sub.nqn.clone() }))
                .await
                .map_err(rpc(v, format!("deleting replica export {}", sub.nqn)))?;
        }
        if !dropped.is_empty() {
            self.release_unused_keys(v, &dropped).await;
        }
        let null = format!("{NULL_PREFIX}{v}");
        if inv.bdevs.contains_key(&null) {
            ignore_missing(
                self.client
                    .typed::<_, bool>("bdev_null_delete", &ByName::new(&null)),
            )
            .await
            .map_err(rpc(v, format!("deleting placeholder {null}")))?;
        }
        let heads: Vec<&Lvol> = inv
            .lvols
            .values()
            .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
            .filter(|l| match parse_lvol(&l.name) {
                Some(LvolRole::Replica { volume, .. }) | Some(LvolRole::RevertMarker { volume, .. }) => {
                    volume == v
                }
                _ => false,
            })
            .collect();
        try_join_all(heads.iter().map(|l| async {
            ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&l.alias)))
                .await
                .map_err(rpc(v, format!("deleting replica {}", l.alias)))
        }))
        .await?;
        Ok(())
    }

    /// Deletes owned orphans; failures are logged and returned as text (the
    /// next reconcile retries). Returns what was removed.
    pub async fn remove_orphans(&self, orphans: Vec<Owned>) -> (Vec<Owned>, Vec<String>) {
        let mut removed = Vec::new();
        let mut errors = Vec::new();
        for o in orphans {
            let r = match &o {
                Owned::Subsystem(n) => {
                    ignore_missing(self.client.nvmf_delete_subsystem(&ByNqn { nqn: n.clone() })).await
                }
                Owned::Raid(n) => ignore_missing(self.client.bdev_raid_delete(&RaidDelete::new(n))).await,
                Owned::Null(n) => {
                    ignore_missing(self.client.typed::<_, bool>("bdev_null_delete", &ByName::new(n))).await
                }
                Owned::Lvol(a) => ignore_missing(self.client.bdev_lvol_delete(&ByName::new(a))).await,
                Owned::Remote(c) => lvol::detach_controller(&self.client, c).await,
            };
            match r {
                Ok(()) => removed.push(o),
                Err(e) => errors.push(format!("removing orphan {o:?}: {e}")),
            }
        }
        (removed, errors)
    }
}

async fn ignore_missing<T>(
    f: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<(), ClientError> {
    match f.await {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}
