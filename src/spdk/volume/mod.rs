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
//! Every operation is idempotent: it compares with the [`Inventory`] and
//! creates only what is missing; a failed multi-step operation deletes what it
//! created. Objects whose names are not talon's (see [`Owned`]) are never
//! touched.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use futures::future::{join_all, try_join_all};

use super::client::{ClientError, SpdkClient};
use super::error::ErrorKind;
use super::placement::Blocked;
use super::rpc::{
    AddNamespace, AllowAnyHost, AttachController, ByName, ByNqn, CreateSubsystem, CreateTransport,
    GetTransports, KeyringFileKey, ListenAddress, Lvol, LvolClone, LvolCreate, LvolResize, LvolSetParent,
    LvolSnapshot, NullCreate, QosLimit, RaidAddBaseBdev, RaidCreate, RaidDelete, RaidLevel, RemoveNamespace,
    SecureListener, SubsystemHostKeys, SubsystemHostParams, SubsystemListener,
};
use crate::names::{NQN_PREFIX, Nqn, ObjectName, volume_uuid};
use crate::util::nvme_auth::{self as dhchap, DhchapSecret, Secret, TlsPsk};

// the names and the inventory moved to their own modules; kept here for callers
pub mod error;
pub mod freeze;
pub mod from_file;
pub mod lvol;
pub mod plan;
mod rebuild;
pub mod replica_lvols;
pub mod to_file;
pub use rebuild::{PrepareError, RemoteDest};

pub use super::inventory::{Inventory, Owned, applied_revert, replica_heads};
pub use super::naming::{
    self, LVS_PREFIX, LvolRole, NSID, NULL_PREFIX, RAID_PREFIX, REMOTE_PREFIX, parse_lvol,
};
pub use error::VolumeError;
pub use plan::{ExportSpec, VolumePlan, point_in_time_set, superblock_room};
use plan::{Make, check_len};
const MIB: u64 = 1 << 20;

/// A failed `nvmf_subsystem_add_listener`: named [`VolumeError::PortInUse`]
/// when another process listens on the port (SPDK says only "Invalid
/// parameters"; its bind error is in its log).
/// `target` is spdk_tgt's pid (its own listeners on the port are no conflict).
fn listener_error(
    volume: &str,
    address: &str,
    port: u16,
    target: Option<i32>,
    source: ClientError,
) -> VolumeError {
    let except = target.and_then(|p| u32::try_from(p).ok());
    let holder = address.parse::<IpAddr>().ok().and_then(|ip| {
        crate::host::net::port_holder(&crate::host::HostRoot::real(), (ip, port).into(), except)
    });
    match holder {
        Some(holder) => VolumeError::PortInUse {
            volume: volume.to_owned(),
            listen: format!("{address}:{port}"),
            holder,
            source: Box::new(source),
        },
        None => rpc(volume, format!("listening on {address}:{port}"))(source),
    }
}

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
    /// Held while the TCP transport is looked up and made: SPDK checks for
    /// an existing transport when `nvmf_create_transport` arrives but adds
    /// the new one only when its creation completes, so concurrent calls
    /// each make one (each with its own buffers and poll groups).
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
        let nqn = Nqn::for_volume(&plan.name);
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
                .nvmf_create_subsystem(&CreateSubsystem {
                    nqn: nqn.as_str().to_owned(),
                    allow_any_host: Some(false),
                    serial_number: Some(naming::serial(&plan.name)),
                    model_number: Some("talon".into()),
                    max_namespaces: Some(1),
                    // so that a snapshot can freeze it (VolumeOps::snapshot)
                    ana_reporting: Some(true),
                })
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
            let size = match inv.bdevs.get(&bdev) {
                Some(b) => Some(b.size_bytes()),
                None => {
                    if inv.controllers.contains(&ctrl) {
                        // a controller whose namespace is gone: attach it afresh
                        let _ = ignore_missing(self.client.bdev_nvme_detach_controller(&ByName::new(&ctrl)))
                            .await;
                    }
                    match self
                        .attach_replica(
                            vol,
                            &ctrl,
                            *addr,
                            *port,
                            nqn.as_str(),
                            plan.export.dhchap_data_dir.as_deref(),
                            plan.export.tls_data_dir.as_deref(),
                        )
                        .await
                    {
                        Ok(b) => self
                            .client
                            .bdev(&b)
                            .await
                            .map_err(rpc(vol, format!("looking up remote replica {b}")))?
                            .map(|b| b.size_bytes()),
                        Err(e) => {
                            tracing::warn!(volume = vol, replica = %name, error = %crate::util::error_chain(&e), "remote replica not reachable");
                            None
                        }
                    }
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
        self.export_ns(
            inv,
            vol,
            &nqn,
            &device,
            volume_uuid(&plan.name),
            &ExportSpec {
                tls_data_dir: None,
                ..plan.export.clone()
            },
            made,
        )
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
            self.client
                .bdev_lvol_resize(&LvolResize {
                    name: r.alias.clone(),
                    size_in_mib: mib,
                })
                .await
                .map_err(rpc(vol, format!("resizing replica {} to {mib} MiB", r.alias)))
        }))
        .await
        .map(|_| ())
    }

    /// Puts `device` as namespace 1 of the existing subsystem `nqn` (replacing
    /// another bdev there), with its listener and exactly the allowed hosts.
    #[allow(clippy::too_many_arguments)]
    async fn export_ns(
        &self,
        inv: &Inventory,
        vol: &str,
        nqn: &Nqn,
        device: &str,
        id: uuid::Uuid,
        export: &ExportSpec,
        made: &mut Vec<Made>,
    ) -> Result<(), VolumeError> {
        let sub = inv.subsystem(nqn.as_str());
        let ns = sub.and_then(|s| s.namespaces.iter().find(|n| n.nsid == NSID));
        if let Some(ns) = ns
            && ns.bdev_name != *device
        {
            self.client
                .nvmf_subsystem_remove_ns(&RemoveNamespace {
                    nqn: nqn.as_str().to_owned(),
                    nsid: NSID,
                })
                .await
                .map_err(rpc(vol, format!("replacing the namespace of {nqn}")))?;
        }
        if ns.is_none_or(|ns| ns.bdev_name != *device) {
            let mut p = AddNamespace::with_id(nqn.as_str(), device, id);
            p.namespace.nsid = Some(NSID);
            self.client
                .nvmf_subsystem_add_ns(&p)
                .await
                .map_err(rpc(vol, format!("adding bdev {device} to {nqn}")))?;
            made.push(Made::Namespace(nqn.as_str().to_owned()));
        }
        let listen = ListenAddress::tcp(export.address, export.port);
        let has_listener = sub.is_some_and(|s| {
            s.listen_addresses
                .iter()
                .any(|l| l.traddr == listen.traddr && l.trsvcid == listen.trsvcid)
        });
        // TLS (served replicas only): the port is TLS as a whole; a
        // listener elsewhere (the plain port before TLS was turned on, or the
        // TLS port after it was turned off) is removed, so no other path stays
        let tls = export.tls_data_dir.is_some();
        if tls || nqn.as_str().contains(":replica:") {
            let stale: Vec<ListenAddress> = sub
                .map(|s| {
                    s.listen_addresses
                        .iter()
                        .filter(|l| !(l.traddr == listen.traddr && l.trsvcid == listen.trsvcid))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            for l in stale {
                self.client
                    .nvmf_subsystem_remove_listener(&SubsystemListener {
                        nqn: nqn.as_str().to_owned(),
                        listen_address: l.clone(),
                    })
                    .await
                    .map_err(rpc(
                        vol,
                        format!(
                            "removing listener {}:{} of {nqn}",
                            l.traddr,
                            l.trsvcid.as_deref().unwrap_or_default()
                        ),
                    ))?;
            }
        }
        // a host listed before the TLS listener was made has no PSK (SPDK
        // does not report one): listed again with it
        let relist = tls && !has_listener;
        if relist && sub.is_some_and(|s| s.allow_any_host) {
            self.client
                .nvmf_subsystem_allow_any_host(&AllowAnyHost {
                    nqn: nqn.as_str().to_owned(),
                    allow_any_host: false,
                })
                .await
                .map_err(rpc(vol, format!("allowing only listed hosts on {nqn}")))?;
        }
        if !has_listener {
            let added = if tls {
                self.client
                    .nvmf_subsystem_add_listener_secure(&SecureListener {
                        nqn: nqn.as_str().to_owned(),
                        listen_address: listen.clone(),
                        secure_channel: true,
                    })
                    .await
            } else {
                self.client
                    .nvmf_subsystem_add_listener(&SubsystemListener {
                        nqn: nqn.as_str().to_owned(),
                        listen_address: listen.clone(),
                    })
                    .await
            };
            if let Err(source) = added {
                let target = super::launch::socket_peer_pid(self.client.socket()).await;
                return Err(listener_error(vol, &listen.traddr, export.port, target, source));
            }
            made.push(Made::Listener(nqn.as_str().to_owned(), listen));
        }
        // exports made before access control allowed any host
        if sub.is_some_and(|s| s.allow_any_host) {
            self.client
                .nvmf_subsystem_allow_any_host(&AllowAnyHost {
                    nqn: nqn.as_str().to_owned(),
                    allow_any_host: false,
                })
                .await
                .map_err(rpc(vol, format!("allowing only listed hosts on {nqn}")))?;
        }
        let mut have: BTreeSet<&str> = sub
            .map(|s| s.hosts.iter().map(|h| h.nqn.as_str()).collect())
            .unwrap_or_default();
        // with DH-HMAC-CHAP every host is listed with its key, and only then;
        // with TLS, with its PSK
        let keys = match &export.dhchap_data_dir {
            Some(d) => Some(self.host_keys::<DhchapSecret>(vol, d, &export.hosts).await?),
            None => None,
        };
        let psks = match &export.tls_data_dir {
            Some(d) => Some(self.host_keys::<TlsPsk>(vol, d, &export.hosts).await?),
            None => None,
        };
        let key_of = |h: &str| keys.as_ref().and_then(|k| k.get(h).cloned());
        if relist {
            for h in std::mem::take(&mut have) {
                self.client
                    .nvmf_subsystem_remove_host(&SubsystemHostParams {
                        nqn: nqn.as_str().to_owned(),
                        host: h.to_owned(),
                    })
                    .await
                    .map_err(rpc(vol, format!("listing host {h} on {nqn} again with its PSK")))?;
            }
        }
        for h in export.hosts.iter().filter(|h| !have.contains(h.as_str())) {
            self.client
                .nvmf_subsystem_add_host_keys(&SubsystemHostKeys {
                    nqn: nqn.as_str().to_owned(),
                    host: h.clone(),
                    dhchap_key: key_of(h),
                    dhchap_ctrlr_key: None,
                    psk: psks.as_ref().and_then(|k| k.get(h.as_str()).cloned()),
                })
                .await
                .map_err(rpc(vol, format!("allowing host {h} on {nqn}")))?;
        }
        // hosts listed before DH-HMAC-CHAP was turned on (or off, or with another key)
        for h in sub
            .map(|s| s.hosts.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|_| !relist)
        {
            let want = key_of(&h.nqn);
            if export.hosts.contains(&h.nqn) && (h.dhchap_key != want || h.dhchap_ctrlr_key.is_some()) {
                self.client
                    .nvmf_subsystem_set_keys(&SubsystemHostKeys {
                        nqn: nqn.as_str().to_owned(),
                        host: h.nqn.clone(),
                        dhchap_key: want,
                        dhchap_ctrlr_key: None,
                        psk: None,
                    })
                    .await
                    .map_err(rpc(
                        vol,
                        format!("setting the DH-HMAC-CHAP key of host {} on {nqn}", h.nqn),
                    ))?;
            }
        }
        // the keys hosts held here before: freed from the keyring below when
        // nothing else uses them
        let mut dropped: BTreeSet<String> = BTreeSet::new();
        for h in sub.map(|s| s.hosts.as_slice()).unwrap_or_default() {
            let removed = !export.hosts.contains(&h.nqn);
            let want = key_of(&h.nqn);
            for k in [&h.dhchap_key, &h.dhchap_ctrlr_key].into_iter().flatten() {
                if removed || want.as_ref() != Some(k) {
                    dropped.insert(k.clone());
                }
            }
            if removed {
                dropped.insert(dhchap::keyring_name::<TlsPsk>(&h.nqn));
            }
        }
        for h in have.iter().filter(|h| !export.hosts.iter().any(|x| x == *h)) {
            self.client
                .nvmf_subsystem_remove_host(&SubsystemHostParams {
                    nqn: nqn.as_str().to_owned(),
                    host: (*h).to_owned(),
                })
                .await
                .map_err(rpc(vol, format!("disallowing host {h} on {nqn}")))?;
        }
        if !dropped.is_empty() {
            self.release_unused_keys(vol, &dropped).await;
        }
        Ok(())
    }

    /// Removes from the target's keyring each key of `names` that nothing
    /// uses any more (refcnt 1: only the keyring's own reference), so a host
    /// taken off every export leaves no key behind. A key still used (the
    /// host is listed on another export, a controller attached with it) stays.
    /// The secret files stay: they are the node's credentials (its own, or
    /// copies the operator placed), read again if the host comes back.
    /// Best effort: a failure is logged, the export stands.
    async fn release_unused_keys(&self, vol: &str, names: &BTreeSet<String>) {
        let keys = match self.client.keyring_get_keys().await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(volume = vol, error = %e, "cannot list the keyring to release unused host keys");
                return;
            }
        };
        for k in keys
            .iter()
            .filter(|k| names.contains(&k.name) && !k.removed && k.refcnt == Some(1))
        {
            match self
                .client
                .keyring_file_remove_key(&ByName { name: k.name.clone() })
                .await
            {
                Ok(_) => {
                    tracing::info!(volume = vol, key = %k.name, "host key no longer used: removed from the keyring")
                }
                Err(e) => {
                    tracing::warn!(volume = vol, key = %k.name, error = %e, "cannot remove an unused host key from the keyring")
                }
            }
        }
    }

    /// The raid1 of a volume with two or more replicas: made from the
    /// replicas that are up to date (empty slots, through short-lived
    /// `bdev_null` placeholders, for the others), then each replica that is
    /// behind is added to it, which makes SPDK rebuild it from the others;
    /// one rebuild at a time. A raid that exists is only completed.
    async fn ensure_raid(
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
        let existing = inv.raid(&raid).filter(|r| {
            r.base_bdevs_list
                .iter()
                .any(|b| b.is_configured && b.name.as_deref().is_some_and(|n| k_of(n).is_some()))
        });
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
            match self
                .client
                .bdev_raid_add_base_bdev(&RaidAddBaseBdev {
                    raid_bdev: raid.clone(),
                    base_bdev: r.bdev.clone(),
                })
                .await
            {
                Ok(_) => {
                    tracing::info!(volume = vol, replica = %r.name, "rebuilding replica from the up-to-date ones");
                    sync.rebuilding = Some((r.k, 0));
                    // SPDK's rebuild writes to it (and so do the volume's
                    // writes to the part already rebuilt): capped until it is back
                    if let Some(mib) = plan.rebuild_mib_per_sec
                        && let Err(e) = self
                            .client
                            .bdev_set_qos_limit(&QosLimit {
                                name: r.bdev.clone(),
                                rw_mbytes_per_sec: mib,
                            })
                            .await
                    {
                        tracing::warn!(volume = vol, replica = %r.name, error = %e, "rebuild runs uncapped");
                    }
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
                        let _ = ignore_missing(self.client.bdev_nvme_detach_controller(&ByName::new(&ctrl)))
                            .await;
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
    /// `None` for a replica that joins later): a missing slot is held by a
    /// `bdev_null` placeholder of the members' geometry while the raid is
    /// made, then emptied (SPDK makes a raid1 of two or more bdevs only).
    /// With `superblock`, SPDK writes the raid's superblock on the members.
    async fn create_raid(
        &self,
        inv: &Inventory,
        vol: &str,
        members: &[Option<String>],
        (block_size, num_blocks): (u32, u64),
        superblock: bool,
        made: &mut Vec<Made>,
    ) -> Result<(), VolumeError> {
        let raid = naming::raid(vol);
        let mut bases = Vec::new();
        let mut nulls = Vec::new();
        for (k, m) in members.iter().enumerate() {
            match m {
                Some(b) => bases.push(b.clone()),
                None => {
                    let n = format!("{NULL_PREFIX}{}", naming::replica(vol, k));
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
                base_bdevs: bases,
                strip_size_kb: None,
                uuid: None,
                superblock: Some(superblock),
            })
            .await
            .map_err(rpc(vol, format!("creating raid1 {raid}")))?;
        made.push(Made::Raid(raid.clone(), superblock));
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

    /// Keeps replica `k` of a volume whose engine runs on another node: the
    /// thin lvol `<vol>-r<k>` (made on the disk with the most free space, or
    /// waited for on the disk it was placed on), grown to the size, and
    /// exported as `Nqn::for_replica(vol, "r<k>")` with an NGUID/UUID derived
    /// from the replica, on the node's listener, to the allowed hosts. Rolls
    /// back what it made when a step fails.
    pub async fn ensure_served(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        k: usize,
    ) -> Result<VolumeInfo, VolumeError> {
        let mut made = Vec::new();
        match self.ensure_served_inner(inv, plan, k, &mut made).await {
            Ok(i) => Ok(i),
            Err(e) => {
                self.undo(made).await;
                Err(e)
            }
        }
    }

    async fn ensure_served_inner(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        k: usize,
        made: &mut Vec<Made>,
    ) -> Result<VolumeInfo, VolumeError> {
        let vol = plan.name.as_str();
        let name = naming::replica(vol, k);
        check_len(vol, &name)?;
        let nqn = Nqn::for_replica(&plan.name, &format!("r{k}")).map_err(|source| VolumeError::BadName {
            volume: vol.to_owned(),
            source,
        })?;
        let mut info = VolumeInfo {
            device: String::new(),
            size_bytes: 0,
            nqn: nqn.as_str().to_owned(),
            replicas: Vec::new(),
            wanted: 1,
            waiting: Vec::new(),
            in_sync: BTreeSet::new(),
            rebuilding: None,
            stale: Vec::new(),
            unplaced: None,
        };
        // the lvol: the same pure plan as the engine's replicas, for k alone
        let lp = plan::local_for(inv, plan, &[k], plan.superblock)?;
        if let Some(w) = lp.waiting.first() {
            info.waiting.push(w.clone());
            return Ok(info);
        }
        let Some(r) = lp.replicas.iter().find(|r| r.k == k) else {
            let b = lp.unplaced.unwrap_or_else(|| Blocked {
                replicas: vec![k],
                reason: format!("replica r{k} has no disk"),
                disk_failed: false,
            });
            return Err(no_placement(vol, &b));
        };
        let (disk, alias) = (r.disk.clone(), r.alias.clone());
        let cluster = inv.lvstore(&disk).map_or(MIB, |s| s.cluster_size);
        let (bdev, allocated) = match (&r.make, inv.lvols.get(&alias)) {
            (None, Some(l)) => (l.uuid.clone(), l.num_allocated_clusters.saturating_mul(cluster)),
            (make, _) => {
                // a served replica starts thin and empty (its engine rebuilds it)
                let thin = Make::Thin {
                    mib: lp.wanted[&k].div_ceil(MIB),
                };
                let make = match make {
                    Some(m @ Make::Thin { .. }) => m,
                    _ => &thin,
                };
                let uuid = self.make_replica(vol, &disk, &name, make).await?;
                made.push(Made::Lvol(alias.clone()));
                (uuid, 0)
            }
        };
        let want = lp.wanted[&k];
        let size = if r.size_bytes < want {
            let mib = want.div_ceil(MIB);
            self.client
                .bdev_lvol_resize(&LvolResize {
                    name: alias.clone(),
                    size_in_mib: mib,
                })
                .await
                .map_err(rpc(vol, format!("resizing replica {alias} to {mib} MiB")))?;
            want
        } else {
            r.size_bytes
        };
        // the engine's raid superblock is in this lvol: SPDK's examine (this
        // target restarted) made a `configuring` raid of it here, which claims
        // it. That raid is the engine node's, not this one's: it goes, and the
        // superblock stays for the engine
        let raid = naming::raid(vol);
        if inv.raid(&raid).is_some_and(|r| {
            r.state == "configuring"
                && r.base_bdevs_list
                    .iter()
                    .any(|b| b.name.as_deref() == Some(bdev.as_str()))
        }) {
            ignore_missing(self.client.bdev_raid_delete(&RaidDelete::new(&raid)))
                .await
                .map_err(rpc(
                    vol,
                    format!("releasing {alias} from the raid {raid} its superblock made here"),
                ))?;
        }
        let id = uuid::Uuid::new_v5(&volume_uuid(&plan.name), format!("r{k}").as_bytes());
        self.export_replica_in(inv, vol, &nqn, &bdev, id, &plan.export, made)
            .await?;
        info.device = bdev.clone();
        // what the engine gets: the lvol less its superblock's room
        info.size_bytes = size.saturating_sub(r.room);
        info.in_sync.insert(k);
        info.replicas.push(ReplicaInfo {
            k,
            name,
            disk,
            bdev,
            alias,
            size_bytes: size,
            allocated_bytes: allocated,
        });
        Ok(info)
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
            ignore_missing(self.client.bdev_nvme_detach_controller(&ByName::new(c)))
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

    /// The members raid `naming::raid(vol)` serves from now: configured
    /// and not the target of a rebuild (by name; empty when it is gone).
    async fn raid_serves(&self, vol: &str) -> Result<BTreeSet<String>, ClientError> {
        let raid = naming::raid(vol);
        let all = self
            .client
            .bdev_raid_get_bdevs(&super::rpc::GetRaids {
                category: super::rpc::RaidCategory::All,
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
                Owned::Remote(c) => {
                    ignore_missing(self.client.bdev_nvme_detach_controller(&ByName::new(c))).await
                }
            };
            match r {
                Ok(()) => removed.push(o),
                Err(e) => errors.push(format!("removing orphan {o:?}: {e}")),
            }
        }
        (removed, errors)
    }

    /// Exports replica `replica` (bdev `bdev`, an lvol) of `vol` to a remote
    /// engine: subsystem `Nqn::for_replica`, namespace with explicit
    /// NGUID/UUID derived from the replica (so an attach inside the same
    /// target registers a bdev), to exactly `hosts`. Idempotent; rolls back on
    /// error.
    pub async fn export_replica(
        &self,
        vol: &ObjectName,
        replica: &str,
        bdev: &str,
        address: IpAddr,
        port: u16,
        hosts: Vec<String>,
    ) -> Result<String, VolumeError> {
        self.export_replica_as(
            vol,
            replica,
            bdev,
            ExportSpec {
                address,
                port,
                hosts,
                dhchap_data_dir: None,
                tls_data_dir: None,
            },
        )
        .await
    }

    /// [`VolumeOps::export_replica`] with the whole export spec (hosts with
    /// DH-HMAC-CHAP when it has `dhchap_data_dir`).
    pub async fn export_replica_as(
        &self,
        vol: &ObjectName,
        replica: &str,
        bdev: &str,
        export: ExportSpec,
    ) -> Result<String, VolumeError> {
        let v = vol.as_str();
        let nqn = Nqn::for_replica(vol, replica).map_err(|source| VolumeError::BadName {
            volume: v.to_owned(),
            source,
        })?;
        let inv = Inventory::load(&self.client)
            .await
            .map_err(rpc(v, "listing the target"))?;
        let id = uuid::Uuid::new_v5(&volume_uuid(vol), replica.as_bytes());
        let mut made = Vec::new();
        match self
            .export_replica_in(&inv, v, &nqn, bdev, id, &export, &mut made)
            .await
        {
            Ok(()) => Ok(nqn.as_str().to_owned()),
            Err(e) => {
                self.undo(made).await;
                Err(e)
            }
        }
    }

    /// The TCP transport, the replica subsystem `nqn` and its namespace.
    #[allow(clippy::too_many_arguments)]
    async fn export_replica_in(
        &self,
        inv: &Inventory,
        vol: &str,
        nqn: &Nqn,
        bdev: &str,
        id: uuid::Uuid,
        export: &ExportSpec,
        made: &mut Vec<Made>,
    ) -> Result<(), VolumeError> {
        if !inv.tcp_transport {
            self.ensure_transport()
                .await
                .map_err(rpc(vol, "creating the TCP transport"))?;
        }
        if inv.subsystem(nqn.as_str()).is_none() {
            self.client
                .nvmf_create_subsystem(&CreateSubsystem {
                    nqn: nqn.as_str().to_owned(),
                    allow_any_host: Some(false),
                    serial_number: None,
                    model_number: Some("talon-replica".into()),
                    max_namespaces: Some(1),
                    ana_reporting: None,
                })
                .await
                .map_err(rpc(vol, format!("creating subsystem {nqn}")))?;
            made.push(Made::Subsystem(nqn.as_str().to_owned()));
        }
        self.export_ns(inv, vol, nqn, bdev, id, export, made).await
    }

    /// The keyring key of each host's DH-HMAC-CHAP secret, registered with
    /// the target's file keyring where it is not yet. This node's own secret
    /// is made when absent; another host's must be there (its file names it).
    async fn host_keys<S: Secret>(
        &self,
        vol: &str,
        data_dir: &std::path::Path,
        hosts: &[String],
    ) -> Result<std::collections::BTreeMap<String, String>, VolumeError> {
        let registered: BTreeSet<String> = self
            .client
            .keyring_get_keys()
            .await
            .map_err(rpc(vol, "listing the keyring"))?
            .into_iter()
            .filter(|k| !k.removed)
            .map(|k| k.name)
            .collect();
        let mut out = std::collections::BTreeMap::new();
        for h in hosts {
            let name = self.register_key::<S>(vol, data_dir, h, &registered).await?;
            out.insert(h.clone(), name);
        }
        Ok(out)
    }

    /// Checks host `nqn`'s secret file (made when it is this node's own) and
    /// gives it to the target's keyring unless `registered` has it; returns
    /// the key name.
    async fn register_key<S: Secret>(
        &self,
        vol: &str,
        data_dir: &std::path::Path,
        nqn: &str,
        registered: &BTreeSet<String>,
    ) -> Result<String, VolumeError> {
        let bad = |source| VolumeError::Dhchap {
            volume: vol.to_owned(),
            source,
        };
        if self.host_nqn.as_deref() == Some(nqn) {
            dhchap::load_or_create::<S>(data_dir, nqn).map_err(bad)?;
        } else {
            dhchap::load::<S>(data_dir, nqn).map_err(bad)?;
        }
        let name = dhchap::keyring_name::<S>(nqn);
        if !registered.contains(&name) {
            let path = dhchap::path::<S>(data_dir, nqn).map_err(bad)?;
            match self
                .client
                .keyring_file_add_key(&KeyringFileKey {
                    name: name.clone(),
                    path: path.display().to_string(),
                })
                .await
            {
                Ok(_) => {}
                Err(e) if e.is(ErrorKind::AlreadyExists) => {}
                Err(e) => {
                    return Err(rpc(
                        vol,
                        format!("giving {} to the target's keyring", path.display()),
                    )(e));
                }
            }
        }
        Ok(name)
    }

    /// Attaches a remote replica exported by [`VolumeOps::export_replica`];
    /// with `tls_data_dir`, over NVMe/TCP TLS with this node's own PSK;
    /// returns its bdev (`<controller>n1`). With `dhchap_data_dir`, this node
    /// authenticates with its own DH-HMAC-CHAP secret.
    #[allow(clippy::too_many_arguments)]
    pub async fn attach_replica(
        &self,
        vol: &str,
        controller: &str,
        address: IpAddr,
        port: u16,
        nqn: &str,
        dhchap_data_dir: Option<&std::path::Path>,
        tls_data_dir: Option<&std::path::Path>,
    ) -> Result<String, VolumeError> {
        let mut dhchap_key = None;
        let mut psk = None;
        if let Some(me) = self.host_nqn.as_deref()
            && (dhchap_data_dir.is_some() || tls_data_dir.is_some())
        {
            let registered: BTreeSet<String> = self
                .client
                .keyring_get_keys()
                .await
                .map_err(rpc(vol, "listing the keyring"))?
                .into_iter()
                .filter(|k| !k.removed)
                .map(|k| k.name)
                .collect();
            if let Some(d) = dhchap_data_dir {
                dhchap_key = Some(self.register_key::<DhchapSecret>(vol, d, me, &registered).await?);
            }
            if let Some(d) = tls_data_dir {
                psk = Some(self.register_key::<TlsPsk>(vol, d, me, &registered).await?);
            }
        }
        let bdevs = match self
            .client
            .bdev_nvme_attach_controller(&AttachController {
                hostnqn: self.host_nqn.clone(),
                dhchap_key,
                psk,
                ..AttachController::tcp(controller, address, port, nqn)
            })
            .await
        {
            Ok(b) => b,
            Err(e) if e.is(ErrorKind::AlreadyExists) => vec![format!("{controller}n1")],
            Err(e) => return Err(rpc(vol, format!("attaching {nqn} at {address}:{port}"))(e)),
        };
        match bdevs.into_iter().next() {
            Some(b) => Ok(b),
            None => {
                let _ = self
                    .client
                    .bdev_nvme_detach_controller(&ByName::new(controller))
                    .await;
                Err(VolumeError::AttachedNoBdev {
                    volume: vol.to_owned(),
                    nqn: nqn.to_owned(),
                })
            }
        }
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
