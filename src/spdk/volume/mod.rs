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
//! and the export; its phases in `ensure.rs`), `delete` and the orphans;
//! `raid.rs` the raid1, `engine.rs` an engine served under either engine's
//! names (`serve_engine`), `export.rs` the NVMe-oF exports and attaches, `snapshot.rs` snapshots,
//! `revert.rs` reverts (one core for both engines), `rebuild.rs` thin
//! rebuilds, `plan.rs` what a volume should be.
//!
//! Every operation is idempotent: it compares with the [`Inventory`] and
//! creates only what is missing; a failed multi-step operation deletes what it
//! created. Objects whose names are not talon's (see [`Owned`]) are never
//! touched.

use std::collections::{BTreeSet, HashMap};

use futures::future::try_join_all;

use super::client::{ClientError, SpdkClient};
use super::error::ErrorKind;
use super::placement::Blocked;
use super::rpc::{
    ByName, ByNqn, CreateTransport, GetTransports, ListenAddress, Lvol, LvolClone, LvolCreate, RaidDelete,
    RemoveNamespace, SubsystemListener,
};
use crate::names::{NQN_PREFIX, Nqn, ObjectName};
use crate::util::nvme_auth::{self as dhchap, TlsPsk};

// the names and the inventory moved to their own modules; kept here for callers
mod engine;
mod ensure;
pub mod error;
mod export;
pub mod freeze;
pub mod from_file;
mod linked_clone;
mod lvol;
pub mod mover;
pub mod plan;
mod raid;
mod rebuild;
mod replica_life;
mod replica_lvols;
mod replica_rebuild;
mod revert;
mod share;
mod snapshot;
mod src_copies;
mod switch;
mod thin;
pub mod to_file;
pub use engine::{EngineNames, EnginePlan, TakeDown};
pub use export::{Export, NewSubsystem, RemoteAttach};
pub use linked_clone::{Link, LinkError, Linked};
pub use rebuild::{PeerError, PrepareError, RemoteDest};
pub use share::{MemberPath, MemberSwap};
pub use src_copies::{SrcCopies, SrcCopyError};
pub use switch::{Switch, SwitchSide};

pub use super::inventory::{Inventory, Owned, applied_revert, replica_heads};
pub use super::naming::{
    self, LVS_PREFIX, LvolRole, NSID, NULL_PREFIX, RAID_PREFIX, REMOTE_PREFIX, parse_lvol,
};
pub use error::VolumeError;
use plan::Make;
pub use plan::{ExportSpec, LvolNotes, VolumePlan, made_again, point_in_time_set, superblock_room};
pub use replica_life::{ReplicaHeadError, ReplicaRemoveError};
pub use replica_lvols::{ReplicaLvols, ResetHeadError, SnapshotDeleteError};
pub use replica_rebuild::{
    Failed, ReplicaEnd, ReplicaPeers, ReplicaRebuild, ReplicaRebuilds, Thin, ThinError,
    clone_base_entrypoint, clone_base_present,
};
pub use revert::{RevertAsk, RevertHead, RevertMembers, RevertPeer, RevertRefused, Reverted};
pub use snapshot::{Member, PointInTime, Taken, Unfreezable};
pub use thin::CopyState;
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
        disk_failed: b.fails_now(),
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
pub type RemoteSnapshot<'a> = (usize, futures::future::BoxFuture<'a, Result<(), PeerError>>);

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
    /// Where the replicas' lvols are (a local one's lvstore, a remote one's
    /// lvol as its node serves it, asked now, else as the ledger noted it):
    /// for the ledger, which keeps those of the replicas in `in_sync`.
    pub notes: LvolNotes,
    /// The replica being rebuilt and how far it is (percent).
    pub rebuilding: Option<(usize, u32)>,
    /// Replicas present but behind, waiting for their turn to be rebuilt.
    pub stale: Vec<usize>,
    /// Replicas no disk can take now, and why.
    pub unplaced: Option<Blocked>,
    /// A served replica ([`VolumeOps::ensure_served`]) whose lvol this call
    /// made: not exported yet. It is exported from the next call, once the
    /// replica's status names the new lvol, so an engine that attaches it and
    /// asks which lvol it reads never gets an older lvol's UUID.
    pub export_next: bool,
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
    /// The exports these operations (and their clones) hold frozen for a
    /// snapshot, which a leftover-freeze check leaves alone.
    freezes: freeze::Freezes,
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
            freezes: Default::default(),
        }
    }

    /// The exports these operations hold frozen.
    pub fn freezes(&self) -> &freeze::Freezes {
        &self.freezes
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

    /// The phases of [`Self::ensure`] in order (each in `ensure.rs`); what
    /// they make is recorded in `made` for the rollback.
    async fn ensure_inner(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        made: &mut Vec<Made>,
    ) -> Result<VolumeInfo, VolumeError> {
        let vol = plan.name.as_str();
        // the local replicas: one pure decision (plan::local)
        let local = plan::local(inv, plan)?;
        let mut waiting = local.waiting.clone();
        let names = EngineNames::volume(&plan.name);
        // no replica that can serve (every one present missed writes): refused
        // before anything is made, so a volume held back does not make and
        // undo its missing replicas on every pass
        let mut trust = ensure::Trust::new(plan, &local);
        // a local replica whose lvol is in another lvstore than the ledger
        // noted was made again, empty, since (its disk formatted or replaced;
        // maybe by a pass cut off before the ledger heard of it): rebuilt
        let lvstores = ensure::local_lvstores(inv, &local);
        trust.moved = ensure::made_again_since(
            vol,
            &plan.noted.lvstores,
            &lvstores,
            "replica's lvol made again in another lvstore since it was up to date (disk formatted or replaced)",
        );
        let wanted = plan.replicas + plan.remote.len();
        let can_serve = |k: usize| k >= plan.replicas || local.replicas.iter().any(|r| r.k == k);
        if plan.in_sync.is_some()
            && inv.raid(names.raid.as_str()).is_none()
            && !(0..wanted).any(|k| can_serve(k) && trust.trusts(k))
        {
            let present = ensure::replica_facts(inv, &local, &HashMap::new());
            return Err(no_current(plan, &present));
        }
        // create missing replicas, concurrently
        let new_bdevs = self.make_missing(plan, &local, made).await?;
        let mut replicas = ensure::replica_facts(inv, &local, &new_bdevs);
        // remote replicas: attached over NVMe/TCP from the nodes that serve them;
        // one that does not answer is waited for like a disk that is away
        self.attach_remotes(inv, plan, &mut replicas, &mut waiting)
            .await?;
        // a remote replica its node made again (empty) since the ledger noted
        // it is not trusted: rebuilt, never served as up to date
        let assembling = inv.raid(names.raid.as_str()).is_none_or(|r| r.state != "online");
        let (asked, unjudged) = self.remote_lvols(plan, &replicas, assembling).await;
        trust.unjudged = unjudged;
        trust.remade = ensure::made_again_since(
            vol,
            &plan.noted.lvols,
            &asked,
            "remote replica made again on its node since it was up to date here (disk replaced or formatted)",
        );
        // grow local replicas that are smaller than asked (expand), then the engine
        // follows; a remote replica grows on its own node (the controller asks
        // it to), and the raid1 follows its smallest member
        let rooms = ensure::Rooms::new(plan, &local);
        let grew = self.grow_local(inv, plan, &local, &rooms, &mut replicas).await?;
        // engine: the lvol itself (one replica), or raid1 over the replicas that
        // are up to date, with the others rebuilt into it one at a time
        let (device, sync) = self.make_engine(inv, plan, &replicas, &trust, made).await?;
        // a clone with a superblock: its heads get their snapshots as parents
        self.parent_heads(vol, &local, &rooms, &mut replicas).await?;
        // export: the transport and subsystem when missing (only now that an
        // engine serves), namespace, listener, hosts (a kernel host: never TLS)
        let spec = plan.host_export();
        self.export_in(inv, vol, &names.export(&device, &spec), made)
            .await?;
        // the size the host sees: looked up only when it may differ from the replicas'
        let may_differ = grew || !local.parents.is_empty();
        let size_bytes = self
            .served_size(inv, plan, &device, &replicas, &rooms, may_differ)
            .await?;
        Ok(VolumeInfo {
            device,
            size_bytes,
            nqn: names.nqn.as_str().to_owned(),
            replicas,
            wanted: plan.replicas + plan.remote.len(),
            waiting,
            notes: LvolNotes {
                lvstores,
                lvols: (plan.replicas..wanted)
                    .filter_map(|k| Some((k, asked.get(&k).or(plan.noted.lvols.get(&k))?.clone())))
                    .collect(),
            },
            in_sync: sync.in_sync,
            rebuilding: sync.rebuilding,
            stale: sync.stale,
            unplaced: local.unplaced,
            export_next: false,
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
            Make::Restore { mib, from } => {
                // only the data written, into a thin lvol (mover::restore)
                return mover::restore::fill_replica(&self.client, from, &lvs, name, *mib)
                    .await
                    .map_err(|e| VolumeError::Restore {
                        volume: vol.to_owned(),
                        replica: format!("{lvs}/{name}"),
                        source: Box::new(e),
                    });
            }
        };
        made.map_err(rpc(vol, format!("creating replica lvol {lvs}/{name}")))
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
    /// markers); absent objects are fine. Snapshots stay (their own
    /// resources); what is left of them goes with [`VolumeOps::delete_snapshots`].
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
        let raid = naming::raid(v);
        self.take_down(&TakeDown {
            id: v,
            why: "volume deleted",
            export: inv.subsystem(nqn.as_str()).map(|_| nqn.as_str()),
            raid: inv.raid(&raid).map(|_| raid.as_str()),
            remotes: inv
                .controllers
                .iter()
                .filter(|c| matches!(c.strip_prefix(REMOTE_PREFIX).and_then(parse_lvol), Some(LvolRole::Replica { volume, .. }) if volume == v))
                .cloned()
                .collect(),
            dropped: Vec::new(),
        })
        .await?;
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
                Some(LvolRole::Replica { volume, .. })
                | Some(LvolRole::RevertMarker { volume, .. })
                | Some(LvolRole::Standby { volume, .. }) => volume == v,
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

    /// Deletes the snapshot lvols volume `vol` left once its heads are gone
    /// ([`VolumeOps::delete`]), those `keep(snap)` does not keep (a rebuild's
    /// `rb.<n>`, one a Snapshot no longer accounts for): each once no lvol is
    /// a clone of it, the newest first. One that a clone of another volume
    /// still depends on stays (reported as an orphan lvol once the volume is
    /// gone): orphan cleanup never deletes the lvols of a volume talon does
    /// not know, so a volume's own go here.
    pub async fn delete_snapshots(
        &self,
        vol: &ObjectName,
        keep: impl Fn(&str) -> bool,
    ) -> Result<(), VolumeError> {
        let v = vol.as_str();
        let inv = Inventory::load(&self.client)
            .await
            .map_err(rpc(v, "listing its snapshots"))?;
        let mut left: BTreeSet<String> = inv
            .lvols
            .values()
            .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
            .filter(|l| {
                matches!(parse_lvol(&l.name), Some(LvolRole::Snapshot { volume, snap, .. }) if volume == v && !keep(&snap))
            })
            .map(|l| l.alias.clone())
            .collect();
        let mut gone = BTreeSet::new();
        loop {
            let leaves: Vec<String> = left
                .iter()
                .filter(|a| {
                    !inv.lvols
                        .keys()
                        .filter(|o| !gone.contains(*o))
                        .any(|o| inv.parent_of(o).as_deref() == Some(a.as_str()))
                })
                .cloned()
                .collect();
            if leaves.is_empty() {
                if !left.is_empty() {
                    tracing::warn!(volume = v, snapshots = ?left, "snapshots kept: clones of other volumes depend on them");
                }
                return Ok(());
            }
            for a in leaves {
                ignore_missing(self.client.bdev_lvol_delete(&ByName::new(&a)))
                    .await
                    .map_err(rpc(v, format!("deleting snapshot {a}")))?;
                left.remove(&a);
                gone.insert(a);
            }
        }
    }

    /// Deletes lvol `alias`, which nothing of talon's or Longhorn's owns, as
    /// its `OrphanLvolRemoval` asked (the caller checked its UUID and that
    /// no lvol is its clone); one gone already is no error.
    pub async fn delete_orphan_lvol(&self, alias: &str) -> Result<(), ClientError> {
        lvol::delete_lvol(&self.client, alias).await
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
