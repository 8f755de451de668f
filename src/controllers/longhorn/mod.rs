//! `engine.LonghornController`: realizes Longhorn's V2 instances (desired
//! state written by the instance-manager gRPC service) in spdk_tgt on talon's
//! own disks, and reports `LonghornInstanceStatus`.
//!
//! ```text
//!   LonghornReplica ──> lvol talon-<disk>/<r> (thin) ──> export nqn...:<r> on port_start
//!        │                    (not exported while an engine here holds it: a raid1 claims it)
//!   LonghornEngine ──> members: local replica = its lvol, remote = bdev_nvme_attach_controller
//!        │             ──> raid1 <e> (two or more) ──> export nqn...:volume-<v> on port
//!   LonghornEngineFrontend ──> kernel NVMe/TCP attach of the engine's export, /dev/longhorn/<v>
//!                              (+ a switch-over's new export: a second path, `paths`)
//!   order: engines torn down, frontends torn down, replica exports a target restart took
//!          away (all at once: `reexport`), the instances a call waits on (created,
//!          or an engine of a new spec; again between engines for those created meanwhile),
//!          replicas, engines, frontends
//! ```
//!
//! Every reconcile compares the target with the desired state, so a restart
//! of spdk_tgt (TargetStatus changes) or of talon is repaired by the path that
//! creates: lvols come back with their lvstore (the disk controller examines
//! it), the raid and the exports are made again. A replica deleted without
//! `cleanup` keeps its lvol; one deleted with it loses it. Objects are named
//! by Longhorn's scheme ([`crate::spdk::naming::longhorn`]), which talon's own
//! orphan cleanup never matches.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::attach::nvme_tcp::{self, ConnectOptions, NvmeTcpTarget};
use crate::host::HostRoot;
use crate::host::longhorn_address::AddressError;
use crate::names::{Nqn, ObjectName};
use crate::resources::config::{Disk, NodeConfig};
use crate::resources::engine::{DiskStatus, ObjectState, TargetStatus};
use crate::resources::longhorn::{
    InstanceKind, InstanceState, LonghornEngine, LonghornEngineFrontend, LonghornInstanceStatus,
    LonghornMemberLedger, LonghornReplica, LonghornRevertLedger, LonghornSnapshotTake, RevertStatus, Session,
};
use crate::runtime::{
    Controller, ControllerError, Input, Output, Phase, ReconcileContext, Requeue, Spec, Typed,
};
use crate::spdk::SpdkClient;
use crate::spdk::naming::longhorn as naming;
use crate::spdk::rpc::LvolStoreRef;
use crate::spdk::volume::{
    EnginePlan, Export, ExportSpec, Inventory, NewSubsystem, RemoteAttach, TakeDown, VolumeError, VolumeOps,
};

use crate::resources::engine::SPDK_STATUS_ID;

/// The controller's name (also its finalizer on Longhorn's instances, which
/// the gRPC handlers add: it lives with them, below the controllers).
pub use crate::resources::longhorn::CONTROLLER as NAME;
/// Where engine-frontends put their device nodes.
pub const DEV_DIR: &str = "/dev/longhorn";
/// Status poll while instances exist (a remote replica that comes back, a
/// device that appears).
const POLL: Duration = Duration::from_secs(3);
/// The poll while a thin rebuild runs (a step per reconcile).
const THIN_POLL: Duration = Duration::from_millis(200);
/// The poll while an engine-frontend's second path is being connected (the
/// switch-over's `preparing` waits for it live).
const PATH_POLL: Duration = Duration::from_millis(500);
/// A rebuild cap whose rebuild was never seen running is lifted this long
/// after it was set (SPDK reports the rebuild a moment after the add).
const CAP_GRACE: Duration = Duration::from_secs(10);

/// Realizes Longhorn's instances.
#[derive(Debug)]
pub struct LonghornController {
    client: SpdkClient,
    ops: VolumeOps,
    /// talon's host NQN: admitted on every export (its own engine-frontends).
    host_nqn: Option<String>,
    /// The host, for engine-frontends; `None` refuses them (tests on a double).
    host: Option<(HostRoot, PathBuf)>,
    /// The SPDKService port of the other nodes (rebuilds call them).
    peer_port: u16,
    /// The channels to them, kept.
    peers: crate::proto::peer::PeerChannels,
    /// The thin rebuilds running.
    thin: thin::ReplicaRebuilds,
    /// Engine exports checked since this start for a freeze a stop left
    /// (`freeze::Freezes::thaw_leftover`).
    thaw_checked: crate::spdk::volume::freeze::ThawOnce,
    /// The raid1 rebuild members this controller capped.
    caps: caps::Caps,
    /// This serve's session (`resources::longhorn::new_session`): only the
    /// reverts and rebuild starts written in it are carried out.
    session: Session,
    /// When each member behind its export was last wanted (`shared`).
    wanted: shared::Wanted,
    /// The second kernel paths of engine-frontends in a switch-over, being
    /// connected (`paths`).
    second_paths: paths::SecondPaths,
    /// Where each pass's listing is published for the Longhorn services'
    /// polls ([`Self::with_listing`]).
    listing: crate::spdk::inventory::SharedListing,
    /// The instance address last looked up, when, and for which `listenAddress`
    /// ([`Self::instance_ip`]).
    address: std::sync::Mutex<Option<LookedUp>>,
}

/// An instance address looked up ([`LonghornController::instance_ip`]).
#[derive(Debug)]
struct LookedUp {
    at: Instant,
    /// The `listenAddress` it was looked up for.
    listen: String,
    ip: Result<IpAddr, AddressError>,
}

/// How long a looked-up instance address is taken as it is: a pass asks it per
/// instance, and each lookup lists the host's interfaces.
const ADDRESS_AGE: Duration = Duration::from_secs(1);

mod caps;
mod desired;
mod error;
mod ledger;
mod members;
mod paths;
mod purge;
mod rebuilds;
mod reexport;
mod revert;
mod shared;
mod snapshot;
mod thin;

pub mod restore;

pub use error::InstanceError;

impl LonghornController {
    /// A controller driving the target behind `client`.
    pub fn new(client: SpdkClient) -> Self {
        Self {
            ops: VolumeOps::new(client.clone()),
            client,
            host_nqn: None,
            host: None,
            peer_port: 8504,
            peers: Default::default(),
            thin: thin::ReplicaRebuilds::default(),
            thaw_checked: Default::default(),
            caps: caps::Caps::default(),
            session: crate::resources::longhorn::new_session(),
            wanted: Default::default(),
            second_paths: Default::default(),
            listing: Default::default(),
            address: Default::default(),
        }
    }

    /// The address this node's instances are served on (`NodeConfig.listenAddress`, see
    /// `host::longhorn_address`), looked up at most once per [`ADDRESS_AGE`].
    fn instance_ip(&self, node: &NodeConfig) -> Result<IpAddr, InstanceError> {
        let mut memo = self.address.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = memo.as_ref()
            && m.at.elapsed() < ADDRESS_AGE
            && m.listen == node.listen_address
        {
            return m.ip.clone().map_err(InstanceError::from);
        }
        let ip = crate::host::longhorn_address::instance_ip(&node.listen_address);
        *memo = Some(LookedUp {
            at: Instant::now(),
            listen: node.listen_address.clone(),
            ip: ip.clone(),
        });
        ip.map_err(InstanceError::from)
    }

    /// Publishes each pass's listing in `listing`, which the Longhorn services answer the
    /// manager's polls from (`Longhorn::with_listing`; this controller's client must count
    /// its changes in the session's count, as theirs do). The pass itself always lists anew.
    pub fn with_listing(mut self, listing: crate::spdk::inventory::SharedListing) -> Self {
        self.listing = listing;
        self
    }

    /// The session this serve's Longhorn services write their requests in.
    pub fn with_session(mut self, session: Session) -> Self {
        self.session = session;
        self
    }

    /// Other nodes' SPDKService is on `port` (this node's own).
    pub fn with_peer_port(mut self, port: u16) -> Self {
        self.peer_port = port;
        self
    }

    /// Admits this host's NQN on the exports.
    pub fn with_host_nqn(mut self, nqn: Option<String>) -> Self {
        self.host_nqn = nqn;
        self
    }

    /// Attaches engine-frontends through the kernel of `host` (`data_dir`
    /// holds the host identity).
    pub fn with_host(mut self, host: HostRoot, data_dir: PathBuf) -> Self {
        self.host = Some((host, data_dir));
        self
    }

    /// An export on `address:port` to the hosts Longhorn's flows present
    /// (the internal host NQN, this node's) and the node's `allowedHosts`.
    fn export_spec(&self, node: &NodeConfig, address: IpAddr, port: u16) -> ExportSpec {
        let mut hosts = vec![naming::internal_host_nqn()];
        hosts.extend(self.host_nqn.clone());
        for h in &node.allowed_hosts {
            if crate::names::Nqn::parse(h).is_ok() && !hosts.contains(h) {
                hosts.push(h.clone());
            }
        }
        ExportSpec::plain(address, port, hosts)
    }
}

/// A replica's export: lvol `alias` as `nqn`.
fn replica_export<'a>(nqn: &'a Nqn, alias: &'a str, ns_uuid: uuid::Uuid, spec: &'a ExportSpec) -> Export<'a> {
    Export {
        nqn,
        bdev: alias,
        ns_uuid,
        subsystem: NewSubsystem {
            model: "talon-longhorn-replica".into(),
            serial: None,
            ana: true,
            cntlid: None,
            listener_ana: None,
        },
        spec,
        only_listener: false,
    }
}

fn status(kind: InstanceKind, state: InstanceState, message: impl Into<String>) -> LonghornInstanceStatus {
    LonghornInstanceStatus::new(kind, state, message)
}

fn chain(e: &crate::spdk::ClientError) -> String {
    crate::util::error_chain(e)
}

use desired::{
    Assembly, Local, Member, Serving, direct_members, disk_ready, engine_status, held, keep_recorded,
    local_replicas,
};

impl LonghornController {
    /// Serves engine `plan` (see [`VolumeOps::serve_engine`]): returns the
    /// bdev that serves it.
    async fn serve_plan(&self, inv: &mut Inventory, plan: &EnginePlan<'_>) -> Result<String, VolumeError> {
        let device = self.ops.serve_engine(inv, plan).await?;
        inv.tcp_transport = true;
        Ok(device)
    }

    /// Exports replica lvol `alias` as `nqn` (idempotent; see
    /// [`VolumeOps::export`]): a subsystem that serves another bdev serves
    /// this one. The caller records the TCP transport made in `inv`.
    async fn export_replica(
        &self,
        inv: &Inventory,
        nqn: &Nqn,
        alias: &str,
        ns_uuid: uuid::Uuid,
        spec: &ExportSpec,
    ) -> Result<(), InstanceError> {
        let e = replica_export(nqn, alias, ns_uuid, spec);
        self.ops.export(inv, nqn.as_str(), &e).await?;
        Ok(())
    }

    async fn unexport(&self, inv: &mut Inventory, nqn: &str) -> Result<(), InstanceError> {
        if inv.subsystem(nqn).is_none() {
            return Ok(());
        }
        self.ops.unexport(nqn, nqn).await?;
        inv.subsystems.retain(|s| s.nqn != nqn);
        Ok(())
    }

    /// A replica: its lvol, exported unless `held` by an engine here (the
    /// engine named).
    async fn ensure_replica(
        &self,
        inv: &mut Inventory,
        ctx: &ReconcileContext,
        node: &NodeConfig,
        r: &Typed<LonghornReplica>,
        held_by: Option<&str>,
    ) -> Result<LonghornInstanceStatus, InstanceError> {
        let held = held_by.is_some();
        let name = ObjectName::parse("replica", r.id())?;
        let spec = &r.spec;
        let target = ctx.get::<TargetStatus>(SPDK_STATUS_ID)?.map(|t| t.spec);
        let disk = disk_ready(&spec.disk, ctx.get::<DiskStatus>(&spec.disk)?, target.as_ref())?;
        let alias = naming::replica_alias(&spec.disk, name.as_str());
        // a revert another node's engine asked for, before the lvol is read
        let prev = ctx.get::<LonghornInstanceStatus>(r.id())?.map(|s| s.spec);
        let done = prev.as_ref().and_then(|p| p.revert.clone());
        let mut revert = done.clone();
        if let Some(rq) = spec
            .revert
            .as_ref()
            .filter(|rq| RevertStatus::pending(done.as_ref(), rq, self.session.id()))
        {
            let first = done.as_ref().is_none_or(|d| d.request < rq.request);
            let out = self.revert_replica(inv, &name, spec, rq, held, first).await;
            if !out.error.is_empty() {
                return Ok(revert::half_reverted(InstanceKind::Replica, &out));
            }
            revert = Some(out);
        }
        // a rebuild another node's engine starts into it
        let mut dst_start = prev.as_ref().and_then(|p| p.dst_start.clone());
        if let Some(rq) = spec
            .dst_start
            .as_ref()
            // only this session's (see `new_session`): a rebuild start
            // carried out again after a restart would empty a rebuilt replica
            .filter(|rq| rq.session == self.session.id())
            .filter(|rq| dst_start.as_ref().is_none_or(|d| d.request < rq.request))
        {
            dst_start = Some(self.dst_start(inv, &name, spec, rq).await);
        }
        // made thin when missing; grown when an expansion (ReplicaExpand, or
        // the engine's on this node) grew the spec
        let lvs = LvolStoreRef {
            name: disk.spec.lvstore.clone(),
            uuid: disk.spec.lvstore_uuid.clone(),
        };
        let (lvol, size) = self
            .ops
            .ensure_replica_head(inv, &lvs, name.as_str(), spec.size_bytes)
            .await?;
        let nqn = naming::replica_nqn(&name)?;
        let addr: IpAddr = self.instance_ip(node)?;
        let mut st = status(InstanceKind::Replica, InstanceState::Running, "");
        st.bdev = alias.clone();
        st.uuid = lvol.uuid.clone();
        st.size_bytes = size;
        st.allocated_bytes = lvol
            .num_allocated_clusters
            .saturating_mul(disk.spec.cluster_bytes);
        if let Some(engine) = held_by {
            self.unexport(inv, nqn.as_str()).await?;
            // the words another node's engine reports when it waits for it
            // (`holder_of`)
            st.message = format!(
                "held by engine {engine} on this node (its raid1 claims the lvol, which SPDK \
                 cannot export while so)"
            );
        } else {
            let export = self.export_spec(node, addr, spec.port_start);
            self.export_replica(inv, &nqn, &alias, naming::namespace_id(name.as_str()), &export)
                .await?;
            inv.tcp_transport = true;
            st.nqn = nqn.as_str().to_owned();
            st.endpoint = SocketAddr::new(addr, spec.port_start).to_string();
        }
        st.revert = revert;
        st.dst_start = dst_start;
        Ok(st)
    }

    /// Removes a replica's export and, with `cleanup`, its lvols: the head
    /// and every snapshot of its chain (as Longhorn's replica delete does),
    /// each after the lvols that depend on it.
    async fn remove_replica(
        &self,
        inv: &mut Inventory,
        r: &Typed<LonghornReplica>,
    ) -> Result<(), InstanceError> {
        let name = ObjectName::parse("replica", r.id())?;
        let nqn = naming::replica_nqn(&name)?;
        self.unexport(inv, nqn.as_str()).await?;
        if !r.spec.cleanup {
            return Ok(());
        }
        let head = naming::replica_alias(&r.spec.disk, name.as_str());
        let snaps = format!("{head}-snap-");
        // and the lvols of a restore a restart or a failure cut off
        let restore = naming::restore_lvols(name.as_str()).map(|n| naming::replica_alias(&r.spec.disk, &n));
        let mine = |a: &String| *a == head || a.starts_with(&snaps) || restore.contains(a);
        // a linked clone's entrypoint, which goes with its last clone
        let lvs = crate::spdk::volume::naming::lvstore(&r.spec.disk);
        let base = crate::spdk::volume::ReplicaLvols::from_inventory(inv, &lvs, name.as_str())
            .base
            .map(|b| format!("{lvs}/{b}"));
        let lvols: Vec<String> = inv.lvols.keys().filter(|a| mine(a)).cloned().collect();
        self.ops.remove_replica_lvols(inv, name.as_str(), lvols).await?;
        if let Some(ep) = base {
            match self.ops.drop_entrypoint_if_unused(inv, &ep).await {
                Ok(true) => {
                    inv.lvols.remove(&ep);
                }
                Ok(false) => {}
                // nothing of the replica is left; the entrypoint is an orphan
                Err(x) => {
                    tracing::warn!(replica = %name, entrypoint = %ep, error = %crate::util::error_chain(&x), "deleting the linked clone's entrypoint")
                }
            }
        }
        Ok(())
    }

    /// The bdevs of an engine's `members` (see [`desired::assembly`]), in
    /// order: a local replica's lvol, or a remote replica attached over
    /// NVMe/TCP. Members that cannot be reached are added to `missing`.
    async fn member_bdevs(
        &self,
        inv: &Inventory,
        engine: &str,
        members: &[Member],
        missing: &mut Vec<String>,
    ) -> Vec<String> {
        let mut bdevs = Vec::new();
        for m in members {
            let (replica, address) = match m {
                Member::Local { alias } => {
                    bdevs.push(alias.clone());
                    continue;
                }
                Member::Remote { replica, address } => (replica, address),
            };
            match self.attach_remote(inv, replica, address).await {
                Ok(b) => bdevs.push(b),
                // an engine there holds it directly: named, asked to share
                // it (its member goes behind the replica's export), waited for
                Err(e) => missing.push(match self.holder_of(engine, replica, address).await {
                    Some(why) => format!(
                        "replica {replica} at {address}: its node says it is {why}; this engine \
                         asked that engine to share it and waits ({})",
                        e.text()
                    ),
                    None => e.text(),
                }),
            }
        }
        bdevs
    }

    /// Remote replica `replica` at `address` as a member: see
    /// [`VolumeOps::remote_member`].
    async fn attach_remote(
        &self,
        inv: &Inventory,
        replica: &str,
        address: &str,
    ) -> Result<String, InstanceError> {
        let name = naming::instance_name("replica", replica)?;
        let sa: SocketAddr = address.parse().map_err(|_| InstanceError::ReplicaAddress {
            replica: replica.to_owned(),
            address: address.to_owned(),
        })?;
        let nqn = naming::replica_nqn(&name)?;
        let a = RemoteAttach::longhorn(replica, sa, nqn.as_str());
        Ok(self.ops.remote_member(inv, replica, &a).await?)
    }

    /// An engine: its members, raid1 (two or more) and export.
    async fn ensure_engine(
        &self,
        inv: &mut Inventory,
        node: &NodeConfig,
        e: &Typed<LonghornEngine>,
        local: Local<'_>,
        prev: Option<&LonghornInstanceStatus>,
        current: &BTreeSet<String>,
    ) -> Result<LonghornInstanceStatus, InstanceError> {
        let addr: IpAddr = self.instance_ip(node)?;
        let serving = Serving::of(e.id(), &e.spec, self.export_spec(node, addr, e.spec.port))?;
        let name = serving.names.raid.clone();
        let left = self.drop_removed(inv, e, local.direct, prev).await;
        let ana = desired::spdk_ana(e.spec.ana_state);
        let raid = inv.raid(&name).map(|r| r.uuid.clone().unwrap_or_default());
        let plan = match desired::assembly(&name, &e.spec, serving.nqn(), current, local.direct, inv) {
            Assembly::Serving => serving.plan(Vec::new(), false),
            Assembly::Make {
                members,
                mut missing,
                bare,
            } => {
                let bdevs = self.member_bdevs(&*inv, &name, &members, &mut missing).await;
                if !missing.is_empty() || bdevs.is_empty() {
                    return Err(InstanceError::WaitingForReplicas(missing));
                }
                serving.plan(Assembly::slots(bdevs, bare), bare)
            }
        };
        let bdev = self.serve_plan(inv, &plan).await?;
        let uuid = match raid {
            Some(uuid) => uuid,
            None if bdev == name.as_str() => self
                .client
                .bdev(name.as_str())
                .await
                .ok()
                .flatten()
                .and_then(|b| b.uuid)
                .unwrap_or_default(),
            None => inv.lvols.get(&bdev).map(|l| l.uuid.clone()).unwrap_or_default(),
        };
        // a switch that failed is over once the raid is there again
        if bdev == name.as_str() {
            self.session.switch_done(name.as_str());
        }
        let nqn = serving.nqn().clone();
        // the ANA state the engine is set to: over a snapshot's freeze left
        // by a talon stopped before its thaw, or an export made again
        let ana_set = self.thaw_checked.check(&self.ops, nqn.as_str(), ana).await;
        let mut st = status(
            InstanceKind::Engine,
            InstanceState::Running,
            left.errors.join("; "),
        );
        match ana_set {
            Ok(()) => st.ana_state = Some(e.spec.ana_state),
            Err(err) => {
                st.ana_state = prev.and_then(|p| p.ana_state);
                st.ana_error = format!(
                    "setting the listeners of {nqn} {}: {}",
                    e.spec.ana_state.as_str(),
                    crate::util::error_chain(&err)
                );
            }
        }
        st.remote_members = left.attached;
        if bdev == name.as_str() {
            st.rebuilds_done = rebuilds::done_by_ledger(&e.spec.rebuild_requests, current);
            self.rebuilds(inv, e, local, prev, &mut st, &serving).await;
        }
        self.purge(inv, e, local.direct, prev, &mut st).await;
        st.bdev = bdev;
        st.uuid = uuid;
        st.nqn = nqn.as_str().to_owned();
        st.endpoint = SocketAddr::new(addr, e.spec.port).to_string();
        Ok(st)
    }

    /// Starts rebuilding replica `replica` (at `address`) into raid1 `raid`:
    /// the one place an engine's rebuild starts. Today it is SPDK's raid
    /// rebuild (`bdev_raid_add_base_bdev`: the new member gets every block of
    /// the volume); with `qos_mbps` the member's I/O is capped
    /// (`bdev_set_qos_limit` rw_mbytes_per_sec, once the raid has it open)
    /// until the rebuild ends. A
    /// remote replica is attached afresh (a controller left from before its
    /// node restarted or its lvol was made again is dropped first); a member
    /// still in a slot leaves it first.
    pub async fn start_rebuild(
        &self,
        inv: &mut Inventory,
        raid: &str,
        replica: &str,
        address: &str,
        local: &BTreeMap<String, LonghornReplica>,
        qos_mbps: i64,
    ) -> Result<(), InstanceError> {
        let (member, uuid) = match local.get(replica) {
            Some(r) => {
                let alias = naming::replica_alias(&r.disk, replica);
                let uuid = inv.lvols.get(&alias).map(|l| l.uuid.clone()).ok_or_else(|| {
                    InstanceError::LvolMissing {
                        replica: replica.to_owned(),
                        alias: alias.clone(),
                    }
                })?;
                (alias, Some(uuid))
            }
            None => {
                if inv.controllers.iter().any(|c| c == replica) {
                    self.ops.detach_remote(inv, replica).await.map_err(|source| {
                        InstanceError::DetachOld {
                            replica: replica.to_owned(),
                            source,
                        }
                    })?;
                }
                let b = self.attach_remote(inv, replica, address).await?;
                (b, None)
            }
        };
        let in_slot = inv.raid(raid).is_some_and(|r| {
            r.base_bdevs_list.iter().any(|b| {
                b.name.as_deref() == Some(member.as_str())
                    || (uuid.is_some()
                        && (b.name.as_ref() == uuid.as_ref() || b.uuid.as_ref() == uuid.as_ref()))
            })
        });
        if in_slot {
            self.ops
                .take_out_member(&member)
                .await
                .map_err(|source| InstanceError::LeaveSlot {
                    replica: replica.to_owned(),
                    member: member.clone(),
                    raid: raid.to_owned(),
                    source: Box::new(source),
                })?;
        }
        // capped once the raid has it open
        let mbps = u64::try_from(qos_mbps).unwrap_or(0);
        let capped = self
            .ops
            .add_member(raid, &member, Some(mbps))
            .await
            .map_err(|source| InstanceError::AddMember {
                replica: replica.to_owned(),
                member: member.clone(),
                raid: raid.to_owned(),
                source: Box::new(source),
            })?;
        if capped {
            self.caps.set(raid, &member, mbps);
        }
        tracing::info!(raid, replica, member, qos_mbps, "rebuild started");
        Ok(())
    }

    /// Removes an engine's export, raid and remote attachments (replicas stay):
    /// [`VolumeOps::take_down`], as talon's volumes and reverts do.
    async fn remove_engine(
        &self,
        inv: &mut Inventory,
        e: &Typed<LonghornEngine>,
    ) -> Result<(), InstanceError> {
        let volume = ObjectName::parse("volume", &e.spec.volume)?;
        let nqn = naming::volume_nqn(&volume)?;
        // a local replica reached through its own export (while another
        // engine read it, `shared`) is detached too
        let remotes: Vec<String> = e
            .spec
            .replica_address_map
            .keys()
            .filter(|r| inv.controllers.iter().any(|c| c == *r))
            .cloned()
            .collect();
        self.ops
            .take_down(&TakeDown {
                id: e.id(),
                why: "engine removed",
                export: inv.subsystem(nqn.as_str()).map(|_| nqn.as_str()),
                raid: inv.raid(e.id()).map(|_| e.id()),
                remotes: remotes.clone(),
                dropped: Vec::new(),
            })
            .await?;
        inv.subsystems.retain(|s| s.nqn != nqn.as_str());
        inv.forget_raid(e.id());
        for replica in &remotes {
            inv.forget_controller(replica);
        }
        Ok(())
    }

    /// An engine-frontend, by its frontend ([`naming::FrontendMode`]): the kernel
    /// attaches the engine's export (`spdk-tcp-blockdev`), or the export is the
    /// endpoint itself (`spdk-tcp-nvmf`: `nvmf://ip:port/nqn`, no initiator), or
    /// there is nothing to attach (`""`: the volume is attached with its
    /// frontend disabled, Longhorn's maintenance mode).
    async fn ensure_frontend(
        &self,
        f: &Typed<LonghornEngineFrontend>,
    ) -> Result<LonghornInstanceStatus, InstanceError> {
        let mode = naming::FrontendMode::of(&f.spec.frontend).map_err(InstanceError::Frontend)?;
        let volume = ObjectName::parse("volume", &f.spec.volume)?;
        let sa: SocketAddr = f
            .spec
            .target_address
            .parse()
            .map_err(|_| InstanceError::TargetAddress(f.spec.target_address.clone()))?;
        let nqn = naming::volume_nqn(&volume)?;
        match mode {
            naming::FrontendMode::KernelBlockdev => {}
            naming::FrontendMode::NvmfEndpoint | naming::FrontendMode::Disabled => {
                let mut st = status(InstanceKind::EngineFrontend, InstanceState::Running, "");
                st.nqn = nqn.as_str().to_owned();
                if mode == naming::FrontendMode::NvmfEndpoint {
                    st.endpoint = naming::nvmf_endpoint(sa, nqn.as_str());
                }
                return Ok(st);
            }
        }
        let Some((host, data_dir)) = self.host.clone() else {
            return Err(InstanceError::NoHost);
        };
        let target = NvmeTcpTarget {
            traddr: sa.ip(),
            trsvcid: sa.port(),
            nqn,
        };
        // a switch-over's new engine: a second path beside the target's
        // (`preparing` waits for it), kept until the switch-over ends
        let second = f
            .spec
            .switchover
            .as_ref()
            .filter(|r| r.target_address != f.spec.target_address)
            .map(|r| {
                r.target_address
                    .parse::<SocketAddr>()
                    .map_err(|_| InstanceError::TargetAddress(r.target_address.clone()))
            })
            .transpose()?;
        let (v, h, d) = (volume.clone(), host.clone(), data_dir.clone());
        let opts = connect_options(&f.spec);
        let (path_opts, nqn) = (opts.clone(), target.nqn.clone());
        let (attached, paths) = tokio::task::spawn_blocking(move || {
            let a = nvme_tcp::attach(&h, &d, &v, &target, &opts)?;
            crate::attach::devpath::create_in(&h, DEV_DIR, &v, &a.device, a.dev)?;
            let paths = nvme_tcp::live_paths(&h, &target.nqn)?;
            Ok::<_, InstanceError>((a, paths))
        })
        .await
        .map_err(|source| InstanceError::Task {
            what: "attach",
            source,
        })??;
        // the volume is served through the target whatever the new path does
        let mut message = String::new();
        if let Some(sa) = second {
            let look = self.second_paths.look(f.id(), sa, paths.contains(&sa), || {
                let t = NvmeTcpTarget {
                    traddr: sa.ip(),
                    trsvcid: sa.port(),
                    nqn: nqn.clone(),
                };
                let v = volume.clone();
                tokio::task::spawn_blocking(move || {
                    nvme_tcp::connect_path(&host, &data_dir, &v, &t, &path_opts)
                })
            });
            if let paths::Look::Failed(e) = look {
                message = format!("the switch-over's new path: {e}");
            }
        }
        let mut st = status(InstanceKind::EngineFrontend, InstanceState::Running, message);
        st.paths = paths.iter().map(SocketAddr::to_string).collect();
        st.bdev = attached.device;
        st.nqn = naming::volume_nqn(&volume)?.as_str().to_owned();
        st.endpoint = format!("{DEV_DIR}/{volume}");
        Ok(st)
    }

    /// Engine-frontends going away are detached (`going`), or the others
    /// attached.
    async fn reconcile_frontends(
        &self,
        ctx: &mut ReconcileContext,
        frontends: &[Typed<LonghornEngineFrontend>],
        going: bool,
        errored: &mut BTreeSet<String>,
    ) -> Result<(), ControllerError> {
        for f in frontends {
            if (f.metadata.phase == Phase::TearingDown) != going {
                continue;
            }
            if going {
                match self.remove_frontend(f).await {
                    Ok(()) => ctx.remove_finalizer::<LonghornEngineFrontend>(f.id())?,
                    Err(m) => {
                        errored.insert(f.id().to_owned());
                        ctx.apply(
                            f.id(),
                            status(InstanceKind::EngineFrontend, InstanceState::Error, m.text()),
                        )?
                    }
                }
                continue;
            }
            let mut st = match self.ensure_frontend(f).await {
                Ok(s) => s,
                Err(m) => status(InstanceKind::EngineFrontend, InstanceState::Error, m.text()),
            };
            st.observed_version = f.metadata.version;
            ctx.apply(f.id(), st)?;
        }
        Ok(())
    }

    async fn remove_frontend(&self, f: &Typed<LonghornEngineFrontend>) -> Result<(), InstanceError> {
        // only a kernel attach leaves something on the host (an unknown frontend
        // never attached either)
        if naming::FrontendMode::of(&f.spec.frontend) != Ok(naming::FrontendMode::KernelBlockdev) {
            return Ok(());
        }
        let Some((host, data_dir)) = self.host.clone() else {
            return Ok(());
        };
        let volume = ObjectName::parse("volume", &f.spec.volume)?;
        let nqn = naming::volume_nqn(&volume)?;
        // a second path still being connected: what it makes goes too
        self.second_paths.settle(f.id(), Duration::from_secs(40)).await;
        tokio::task::spawn_blocking(move || {
            crate::attach::devpath::remove_in(&host, DEV_DIR, &volume)?;
            nvme_tcp::detach(&host, &data_dir, &volume, Some(&nqn))?;
            Ok::<_, InstanceError>(())
        })
        .await
        .map_err(|source| InstanceError::Task {
            what: "detach",
            source,
        })?
    }
}

/// The kernel connect of an engine-frontend: the I/O queues the manager asked for
/// (`nvme_tcp_nr_io_queues`), else talon's bounded default, never one per host CPU.
fn connect_options(f: &LonghornEngineFrontend) -> ConnectOptions {
    let mut o = ConnectOptions::default();
    if f.nr_io_queues > 0 {
        o.nr_io_queues = f.nr_io_queues;
    }
    o
}

impl LonghornController {
    /// Step 1 of a reconcile: the engines tearing down are removed (their
    /// finalizer with them), or reported in error.
    async fn remove_engines(
        &self,
        ctx: &mut ReconcileContext,
        inv: &mut Inventory,
        engines: &[Typed<LonghornEngine>],
        errored: &mut BTreeSet<String>,
    ) -> Result<(), ControllerError> {
        for e in engines.iter().filter(|e| e.metadata.phase == Phase::TearingDown) {
            match self.remove_engine(inv, e).await {
                Ok(()) => {
                    // its current members go with it: an engine made again
                    // under its name is seeded from what the manager says then
                    ctx.destroy::<LonghornMemberLedger>(e.id())?;
                    ctx.remove_finalizer::<LonghornEngine>(e.id())?
                }
                Err(m) => {
                    errored.insert(e.id().to_owned());
                    ctx.apply(
                        e.id(),
                        status(InstanceKind::Engine, InstanceState::Error, m.text()),
                    )?
                }
            }
        }
        Ok(())
    }

    /// Step 2 of a reconcile: each replica removed, reported stopping (made
    /// only to be removed), or made and reported; `held` ones (by a running
    /// engine here) are not exported.
    async fn reconcile_replicas(
        &self,
        ctx: &mut ReconcileContext,
        inv: &mut Inventory,
        node: &NodeConfig,
        replicas: &[Typed<LonghornReplica>],
        held: &BTreeMap<&str, &str>,
        errored: &mut BTreeSet<String>,
    ) -> Result<(), ControllerError> {
        for r in replicas {
            if r.metadata.phase == Phase::TearingDown {
                if held.contains_key(r.id()) && r.spec.cleanup {
                    let m = format!(
                        "replica {} is held by a running engine; delete the engine first",
                        r.id()
                    );
                    errored.insert(r.id().to_owned());
                    ctx.apply(r.id(), status(InstanceKind::Replica, InstanceState::Error, m))?;
                    continue;
                }
                match self.remove_replica(inv, r).await {
                    Ok(()) => ctx.remove_finalizer::<LonghornReplica>(r.id())?,
                    Err(m) => {
                        errored.insert(r.id().to_owned());
                        ctx.apply(
                            r.id(),
                            status(InstanceKind::Replica, InstanceState::Error, m.text()),
                        )?
                    }
                }
                continue;
            }
            if r.spec.cleanup {
                // created only to be removed (DiskReplicaInstanceDelete)
                ctx.apply(r.id(), status(InstanceKind::Replica, InstanceState::Stopping, ""))?;
                continue;
            }
            let st = match self
                .ensure_replica(inv, ctx, node, r, held.get(r.id()).copied())
                .await
            {
                Ok(s) => s,
                Err(m) => {
                    let state = if m.replica_starting() {
                        InstanceState::Starting
                    } else {
                        InstanceState::Error
                    };
                    let mut st = status(InstanceKind::Replica, state, m.text());
                    // the requests carried out stay known (the calls wait on them)
                    if let Some(p) = ctx.get::<LonghornInstanceStatus>(r.id())? {
                        st.revert = p.spec.revert;
                        st.dst_start = p.spec.dst_start;
                    }
                    st
                }
            };
            ctx.apply(r.id(), st)?;
        }
        Ok(())
    }

    /// Step 3 of a reconcile, for running engine `e`: a revert first, then
    /// the engine (its raid1, export, rebuilds and purge) and its snapshots,
    /// its status written. Returns whether the next reconcile comes soon (a
    /// thin rebuild runs, or a revert waits on other nodes).
    async fn reconcile_engine(
        &self,
        ctx: &mut ReconcileContext,
        inv: &mut Inventory,
        node: &NodeConfig,
        e: &Typed<LonghornEngine>,
        local: Local<'_>,
    ) -> Result<bool, ControllerError> {
        let prev = ctx.get::<LonghornInstanceStatus>(e.id())?.map(|s| s.spec);
        if crate::util::fault_for("longhorn-engine-error", e.id()) {
            // a test's engine in error (TALON_FAULTS): nothing of it touched
            let mut st = status(
                InstanceKind::Engine,
                InstanceState::Error,
                "fault injected: longhorn-engine-error (TALON_FAULTS)",
            );
            if let Some(p) = prev {
                keep_recorded(&mut st, p);
            }
            st.observed_version = e.metadata.version;
            ctx.apply(e.id(), st)?;
            return Ok(false);
        }
        // the lvstores of the remote members, from their nodes, when the
        // raid1 is to be made (or one current has none noted)
        let recorded = ctx.get::<LonghornMemberLedger>(e.id())?.map(|l| l.spec);
        let remote = self.remote_lvstores(inv, e, local.all, recorded.as_ref()).await;
        // the lvstore each replica's lvol is in: listed here, or as its node says
        let here = |r: &str| ledger::lvstore_of(local.all, inv, r).or_else(|| remote.get(r).cloned());
        // the current members, recorded before the raid1 is first made
        let before = match recorded {
            Some(l) => l,
            None => {
                let l = ledger::seed(&e.spec, prev.as_ref(), &here);
                tracing::info!(engine = e.id(), current = ?l.current, "member ledger seeded");
                ctx.apply(e.id(), l.clone())?;
                l
            }
        };
        // a replica whose lvol was made again elsewhere (its disk formatted
        // or replaced, here or on its node) holds none of the engine's data:
        // written out of the ledger at once
        let moved = ledger::moved(&before, &ledger::current_members(&before, &e.spec), &here);
        let before = match ledger::without_moved(&before, &moved) {
            Some(after) => {
                tracing::warn!(
                    engine = e.id(),
                    moved = ?moved,
                    reason = after.reason,
                    "member ledger written: replicas whose lvol is in another lvstore than when they \
                     were current are out, to be rebuilt"
                );
                ctx.apply(e.id(), after.clone())?;
                after
            }
            None => before,
        };
        let current = ledger::current_members(&before, &e.spec);
        // a current member of another node with an lvstore noted whose node
        // did not say where its lvol is now is not judged: the raid1 is not
        // made over it until it is (its NVMe/TCP export may answer while its
        // node's SPDKService is slow; taken in unjudged, a replica made again
        // empty there would serve RW)
        let remote_current: BTreeSet<String> = current
            .iter()
            .filter(|r| !local.all.contains_key(*r))
            .cloned()
            .collect();
        let unjudged = ledger::unjudged(&before, &remote_current, inv.raid(e.id()).is_none(), &here);
        // a revert first: the raid1 is made again over the reverted heads
        let revert = self.revert(ctx, inv, e, local.direct, prev.as_ref()).await?;
        let waiting = revert
            .as_ref()
            .is_some_and(|r| r.error.is_empty() && !r.waiting.is_empty());
        let mut st = match revert.as_ref() {
            Some(r) if !r.error.is_empty() => revert::half_reverted(InstanceKind::Engine, r),
            Some(r) if waiting => revert::reverting(prev.as_ref(), r),
            _ if !unjudged.is_empty() => engine_status(Err(InstanceError::WaitingForReplicas(unjudged))),
            _ => engine_status(
                self.ensure_engine(inv, node, e, local, prev.as_ref(), &current)
                    .await,
            ),
        };
        st.revert = revert;
        // a member that left is written out, a rebuilt one in, before the
        // status says either
        let names = self.names_in_raid(ctx, inv, e)?;
        let names_of = |r: &str| names.get(r).cloned().unwrap_or_default();
        let view = match inv.raid(e.id()) {
            Some(raid) if st.state == InstanceState::Running => ledger::RaidView::Raid(raid, &names_of),
            _ => ledger::RaidView::None,
        };
        let here = |r: &str| ledger::lvstore_of(local.all, inv, r).or_else(|| remote.get(r).cloned());
        if let Some(after) = ledger::observed(&before, &e.spec, &st, view, &here) {
            tracing::info!(engine = e.id(), current = ?after.current, reason = after.reason, "member ledger written");
            ctx.apply(e.id(), after)?;
        }
        let running = match st.state {
            InstanceState::Running if !waiting => Ok(()),
            _ => Err(st.message.as_str()),
        };
        st.snapshots = self
            .snapshots(ctx, inv, e, local.direct, prev.as_ref(), running)
            .await;
        if st.state != InstanceState::Running
            && let Some(p) = prev
        {
            keep_recorded(&mut st, p);
        }
        st.remote_members
            .extend(members::remote_members(&e.spec.replica_address_map, local.direct));
        st.observed_version = e.metadata.version;
        let fast = !st.thin_rebuilds.is_empty() || waiting;
        ctx.apply(e.id(), st)?;
        Ok(fast)
    }
}

impl LonghornController {
    /// The instances a call waits on ([`waited_on`]) and not yet `done` by this
    /// reconcile, listed again (some may have come since it began): reconciled
    /// and added to `done`. Returns whether the next reconcile comes soon.
    async fn reconcile_created(
        &self,
        ctx: &mut ReconcileContext,
        inv: &mut Inventory,
        node: &NodeConfig,
        done: &mut BTreeSet<String>,
        errored: &mut BTreeSet<String>,
    ) -> Result<bool, ControllerError> {
        let replicas = ctx.list::<LonghornReplica>()?;
        let engines = ctx.list::<LonghornEngine>()?;
        let frontends = ctx.list::<LonghornEngineFrontend>()?;
        let all = (&replicas[..], &engines[..], &frontends[..]);
        self.reconcile_waited(ctx, inv, node, all, done, errored).await
    }

    /// The instances of `all` a call waits on ([`waited_on`]) and not yet
    /// `done` by this reconcile, reconciled and added to `done`. Returns
    /// whether the next reconcile comes soon.
    async fn reconcile_waited(
        &self,
        ctx: &mut ReconcileContext,
        inv: &mut Inventory,
        node: &NodeConfig,
        (replicas, engines, frontends): Instances<'_>,
        done: &mut BTreeSet<String>,
        errored: &mut BTreeSet<String>,
    ) -> Result<bool, ControllerError> {
        let state = ctx.state();
        let mut new_replicas = waited_on(state, replicas, done);
        let new_engines = waited_on(state, engines, done);
        let new_frontends = waited_on(state, frontends, done);
        // a new engine's local replicas with it: held now, they leave their
        // export before its raid1 claims them
        let members: BTreeSet<&str> = new_engines
            .iter()
            .flat_map(|e| e.spec.replica_address_map.keys().map(String::as_str))
            .collect();
        let also: Vec<_> = replicas
            .iter()
            .filter(|r| members.contains(r.id()) && !done.contains(r.id()))
            .filter(|r| !new_replicas.iter().any(|n| n.id() == r.id()))
            .cloned()
            .collect();
        new_replicas.extend(also);
        if new_replicas.is_empty() && new_engines.is_empty() && new_frontends.is_empty() {
            return Ok(false);
        }
        add_finalizers(ctx, &new_replicas, &new_engines, &new_frontends)?;
        let local = local_replicas(replicas);
        let running: Vec<&Typed<LonghornEngine>> = engines
            .iter()
            .filter(|e| e.metadata.phase == Phase::Running)
            .collect();
        // a replica another engine reads through its export stays as it is
        // for a new engine too (see `shared_replicas`)
        let shared = self.shared_replicas(inv, &running, &local).await;
        let held = held(&running, &local, &self.thin.exported_dsts(), &shared);
        self.reconcile_replicas(ctx, inv, node, &new_replicas, &held, errored)
            .await?;
        let direct = direct_members(&local, &shared);
        let mut fast = false;
        for e in &new_engines {
            let local = Local {
                direct: &direct,
                all: &local,
            };
            fast |= self.reconcile_engine(ctx, inv, node, e, local).await?;
        }
        self.reconcile_frontends(ctx, &new_frontends, false, errored)
            .await?;
        done.extend(new_replicas.iter().map(|r| r.id().to_owned()));
        done.extend(new_engines.iter().map(|e| e.id().to_owned()));
        done.extend(new_frontends.iter().map(|f| f.id().to_owned()));
        Ok(fast)
    }
}

/// The Longhorn instances of one pass: replicas, engines, engine-frontends.
type Instances<'a> = (
    &'a [Typed<LonghornReplica>],
    &'a [Typed<LonghornEngine>],
    &'a [Typed<LonghornEngineFrontend>],
);

/// The instances of `all` not `done` that a call waits on: running, and with
/// no status yet (an InstanceCreate) or, an engine, a status of an older spec
/// (a call that changed it waits for `observedVersion`).
fn waited_on<S: Spec + Clone>(
    state: &crate::runtime::State,
    all: &[Typed<S>],
    done: &BTreeSet<String>,
) -> Vec<Typed<S>> {
    let waited = |t: &Typed<S>| {
        if t.metadata.phase != Phase::Running || done.contains(t.id()) {
            return false;
        }
        let Some(st) = state.get(
            LonghornInstanceStatus::NAMESPACE,
            LonghornInstanceStatus::TYPE,
            t.id(),
        ) else {
            return true;
        };
        S::TYPE == LonghornEngine::TYPE
            && st
                .spec
                .get("observedVersion")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0)
                < t.metadata.version
    };
    all.iter().filter(|t| waited(t)).cloned().collect()
}

/// Whether a Longhorn instance was created or changed since the last look
/// (a lag, which may hide one, counts as one).
fn created_since(rx: &mut tokio::sync::broadcast::Receiver<crate::runtime::Event>) -> bool {
    use tokio::sync::broadcast::error::TryRecvError;
    let mut any = false;
    loop {
        match rx.try_recv() {
            Ok(ev) => {
                let m = &ev.resource.metadata;
                any |= ev.kind != crate::runtime::EventKind::Destroyed
                    && m.namespace == LonghornEngine::NAMESPACE
                    && [
                        LonghornReplica::TYPE,
                        LonghornEngine::TYPE,
                        LonghornEngineFrontend::TYPE,
                    ]
                    .contains(&m.type_.as_str());
            }
            Err(TryRecvError::Lagged(_)) => any = true,
            Err(TryRecvError::Empty | TryRecvError::Closed) => return any,
        }
    }
}

/// The controller's finalizer on every running instance (removed once the
/// instance is torn down).
fn add_finalizers(
    ctx: &mut ReconcileContext,
    replicas: &[Typed<LonghornReplica>],
    engines: &[Typed<LonghornEngine>],
    frontends: &[Typed<LonghornEngineFrontend>],
) -> Result<(), ControllerError> {
    for r in replicas {
        if r.metadata.phase == Phase::Running {
            ctx.add_finalizer::<LonghornReplica>(r.id())?;
        }
    }
    for e in engines {
        if e.metadata.phase == Phase::Running {
            ctx.add_finalizer::<LonghornEngine>(e.id())?;
        }
    }
    for f in frontends {
        if f.metadata.phase == Phase::Running {
            ctx.add_finalizer::<LonghornEngineFrontend>(f.id())?;
        }
    }
    Ok(())
}

/// A reconcile without spdk_tgt: the replicas and engines reported
/// starting, the target polled for.
fn wait_for_target(
    ctx: &mut ReconcileContext,
    replicas: &[Typed<LonghornReplica>],
    engines: &[Typed<LonghornEngine>],
) -> Result<Requeue, ControllerError> {
    // nothing of SPDK's can be made or removed without the target: report and wait
    let msg = "waiting for spdk_tgt";
    for r in replicas {
        ctx.apply(
            r.id(),
            status(InstanceKind::Replica, InstanceState::Starting, msg),
        )?;
    }
    // an engine with no status yet (talon just started; statuses are not
    // persisted) keeps none: its spdk_tgt may be serving it, adopted in a
    // moment, and a "starting" status would list every replica ERR, which
    // longhorn-manager takes for a failed volume (it salvages it)
    for e in engines {
        if ctx.get::<LonghornInstanceStatus>(e.id())?.is_some() {
            ctx.apply(e.id(), status(InstanceKind::Engine, InstanceState::Starting, msg))?;
        }
    }
    Ok(Requeue::After(POLL))
}

/// The instances tearing down, each with its kind.
fn tearing<'a>(
    replicas: &'a [Typed<LonghornReplica>],
    engines: &'a [Typed<LonghornEngine>],
    frontends: &'a [Typed<LonghornEngineFrontend>],
) -> Vec<(&'a str, InstanceKind)> {
    replicas
        .iter()
        .filter(|r| r.metadata.phase == Phase::TearingDown)
        .map(|r| (r.id(), InstanceKind::Replica))
        .chain(
            engines
                .iter()
                .filter(|e| e.metadata.phase == Phase::TearingDown)
                .map(|e| (e.id(), InstanceKind::Engine)),
        )
        .chain(
            frontends
                .iter()
                .filter(|f| f.metadata.phase == Phase::TearingDown)
                .map(|f| (f.id(), InstanceKind::EngineFrontend)),
        )
        .collect()
}

#[async_trait::async_trait]
impl Controller for LonghornController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::of::<LonghornReplica>(),
            Input::of::<LonghornEngine>(),
            Input::of::<LonghornEngineFrontend>(),
            Input::of::<Disk>(),
            Input::of::<DiskStatus>(),
            Input::of::<TargetStatus>(),
            Input::of::<NodeConfig>(),
        ]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<LonghornInstanceStatus>(),
            Output::exclusive::<LonghornRevertLedger>(),
            Output::exclusive::<LonghornMemberLedger>(),
            Output::exclusive::<LonghornSnapshotTake>(),
        ]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let replicas = ctx.list::<LonghornReplica>()?;
        let engines = ctx.list::<LonghornEngine>()?;
        let frontends = ctx.list::<LonghornEngineFrontend>()?;
        // kept first, also through a reconcile with nothing to do: a
        // detach takes every instance of a volume that is mid-revert
        // a revert begun and not done stays recorded when its engine goes (a
        // detach, or a delete after the revert failed): the engine made again
        // carries it on before it serves (`revert::drop_stale_revert_ledgers`
        // destroys one with nothing left to make one again); a snapshot's take
        // that did not end stays until its copies are deleted (`clean_takes`)
        keep_every::<LonghornRevertLedger>(ctx)?;
        ledger::keep_member_ledgers(ctx, &engines)?;
        keep_every::<LonghornSnapshotTake>(ctx)?;
        if replicas.is_empty() && engines.is_empty() && frontends.is_empty() {
            return Ok(Requeue::OnInputChange);
        }
        let node = ctx.get::<NodeConfig>("node")?.map(|n| n.spec).unwrap_or_default();
        add_finalizers(ctx, &replicas, &engines, &frontends)?;
        let target_ready = ctx
            .get::<TargetStatus>(SPDK_STATUS_ID)?
            .is_some_and(|t| t.spec.state == ObjectState::Ready);
        let mut errored: BTreeSet<String> = BTreeSet::new();
        // engine-frontends are the kernel's (NVMe/TCP to an engine's export,
        // here or on another node): they need no spdk_tgt on this node
        self.reconcile_frontends(ctx, &frontends, true, &mut errored)
            .await?;
        if !target_ready {
            self.reconcile_frontends(ctx, &frontends, false, &mut errored)
                .await?;
            return wait_for_target(ctx, &replicas, &engines);
        }
        let local = local_replicas(&replicas);
        // instances created while this pass runs: served between its engines
        let (_, mut created) = ctx.state().watch(Some((
            LonghornEngineFrontend::NAMESPACE,
            LonghornEngineFrontend::TYPE,
        )));

        // 1. engines going away
        // one listing of the target per reconcile: what this reconcile changes it
        // records in `inv` as it goes (lvols made, subsystems, raids and
        // controllers removed), so later steps see it without listing again
        let started = Instant::now();
        let mut inv = Inventory::clone(&*self.listing.fresh(&self.client).await?);
        let listed = started.elapsed();
        revert::drop_stale_revert_ledgers(ctx, &inv, &engines)?;
        // copies a snapshot's take that did not end left, before any take
        self.clean_takes(ctx, &mut inv).await?;
        self.remove_engines(ctx, &mut inv, &engines, &mut errored).await?;

        // 2. the replica exports a restart of spdk_tgt took away, all at once
        // before anything else: other nodes' engines give them up after their
        // ctrlr_loss_timeout (see `reexport`)
        self.reexport_replicas(&mut inv, &node, &replicas, &engines)
            .await?;

        // 3. the instances a call waits on (an InstanceCreate, an engine's new
        // spec) first: the call waits for its own instance, not for a pass over
        // every other
        let mut done = BTreeSet::new();
        let all = (&replicas[..], &engines[..], &frontends[..]);
        let mut fast = self
            .reconcile_waited(ctx, &mut inv, &node, all, &mut done, &mut errored)
            .await?;

        // 4. replicas: held ones are not exported
        let running_engines: Vec<&Typed<LonghornEngine>> = engines
            .iter()
            .filter(|e| e.metadata.phase == Phase::Running)
            .collect();
        // (a replica rebuilt from another node is exported for it instead)
        let rebuilt_from_afar = self.thin.exported_dsts();
        // (and one another engine reads through its export stays exported:
        // an engine here that does not serve yet reaches it through it too)
        let shared = self.shared_replicas(&inv, &running_engines, &local).await;
        let held = held(&running_engines, &local, &rebuilt_from_afar, &shared);
        let rest: Vec<_> = replicas
            .iter()
            .filter(|r| !done.contains(r.id()))
            .cloned()
            .collect();
        self.reconcile_replicas(ctx, &mut inv, &node, &rest, &held, &mut errored)
            .await?;

        // 5. engines
        let replicas_done = started.elapsed();
        // a thin rebuild goes one step per reconcile, and a revert asks the
        // nodes still reverting its replicas again at each: the next one soon
        // a shared replica is a remote member to its engine: attached
        // through its export, never claimed
        let direct = direct_members(&local, &shared);
        for e in &running_engines {
            if created_since(&mut created) {
                fast |= self
                    .reconcile_created(ctx, &mut inv, &node, &mut done, &mut errored)
                    .await?;
            }
            if !done.contains(e.id()) {
                // a member another node's engine wants goes behind its export
                // (and back when none does): see `shared`
                let direct = self.share_members(&mut inv, &node, e, &local, &direct).await;
                let local = Local {
                    direct: &direct,
                    all: &local,
                };
                fast |= self.reconcile_engine(ctx, &mut inv, &node, e, local).await?;
            }
        }

        // 6. engine-frontends (after the engines: one here may be what they attach)
        let engines_done = started.elapsed();
        if created_since(&mut created) {
            fast |= self
                .reconcile_created(ctx, &mut inv, &node, &mut done, &mut errored)
                .await?;
        }
        let rest: Vec<_> = frontends
            .iter()
            .filter(|f| !done.contains(f.id()))
            .cloned()
            .collect();
        self.reconcile_frontends(ctx, &rest, false, &mut errored).await?;
        tracing::debug!(
            listing_ms = listed.as_secs_f64() * 1e3,
            replicas_ms = (replicas_done - listed).as_secs_f64() * 1e3,
            engines_ms = (engines_done - replicas_done).as_secs_f64() * 1e3,
            frontends_ms = (started.elapsed() - engines_done).as_secs_f64() * 1e3,
            replicas = replicas.len(),
            engines = engines.len(),
            frontends = frontends.len(),
            first = done.len(),
            "Longhorn reconcile"
        );
        // instances still tearing down keep a status until they are gone; one
        // gone during this reconcile may have been made again under its name
        // (a new engine's status is its own, never this pass's "stopping")
        for (id, kind) in tearing(&replicas, &engines, &frontends) {
            let still_tearing = ctx
                .state()
                .get("config", kind_type(kind), id)
                .is_some_and(|r| r.metadata.phase == Phase::TearingDown);
            if !errored.contains(id) && still_tearing {
                ctx.apply(id, status(kind, InstanceState::Stopping, ""))?;
            }
        }
        Ok(Requeue::After(if fast {
            THIN_POLL
        } else if self.second_paths.any_running() {
            // a second path being connected: its frontend's status soon after
            PATH_POLL
        } else {
            POLL
        }))
    }
}

/// Keeps every record of kind `S`: applied again at every reconcile, also
/// one that waits for the target, so the runtime's clean-up of outputs not
/// applied takes none; what destroys one decides when it goes.
fn keep_every<S: Spec>(ctx: &mut ReconcileContext) -> Result<(), ControllerError> {
    for r in ctx.list::<S>()? {
        let id = r.id().to_owned();
        ctx.apply(&id, r.spec)?;
    }
    Ok(())
}

fn kind_type(kind: InstanceKind) -> &'static str {
    match kind {
        InstanceKind::Replica => LonghornReplica::TYPE,
        InstanceKind::Engine => LonghornEngine::TYPE,
        InstanceKind::EngineFrontend => LonghornEngineFrontend::TYPE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(super) fn typed<S>(id: &str, spec: S) -> Typed<S> {
        Typed {
            metadata: crate::runtime::Metadata::new("config", "Test", id, ""),
            spec,
        }
    }

    pub(super) fn tearing_down<S>(mut t: Typed<S>) -> Typed<S> {
        t.metadata.phase = Phase::TearingDown;
        t
    }

    pub(super) fn replica(id: &str, cleanup: bool) -> Typed<LonghornReplica> {
        let spec = json!({
            "volume": "v", "disk": "d", "sizeBytes": 1048576, "portStart": 20000, "portEnd": 20010,
            "cleanup": cleanup
        });
        typed(id, serde_json::from_value(spec).expect("replica"))
    }

    /// A state whose spdk_tgt is ready on `double`'s socket: what a pass of
    /// the controller waits for (the tests' "spdk_tgt on the double").
    pub(super) fn ready_target_on(double: &crate::spdk::double::SpdkDouble) -> crate::runtime::State {
        let state = crate::runtime::State::in_memory();
        let target = TargetStatus::ready_for_test(None, double.socket().display().to_string());
        state.upsert_typed(SPDK_STATUS_ID, &target).expect("target");
        state
    }

    /// An engine of volume `v` over replicas `ra` (127.0.0.1) and `rb`
    /// (127.0.0.2), asked nothing: the purge and revert tests' fixture.
    pub(super) fn engine_of_two() -> LonghornEngine {
        LonghornEngine {
            volume: "v".into(),
            size_bytes: 1 << 20,
            replica_address_map: [("ra", "127.0.0.1:20001"), ("rb", "127.0.0.2:20001")]
                .map(|(r, a)| (r.to_string(), a.to_string()))
                .into(),
            port: 20000,
            frontend: String::new(),
            snapshot_max_count: 0,
            rebuild_qos_mbps: 0,
            rebuild_requests: Default::default(),
            rebuild_links: Default::default(),
            rebuild_link_engines: Default::default(),
            removed_snapshots: Default::default(),
            failed_replicas: Default::default(),
            purge_request: 0,
            revert: None,
            snapshot_requests: BTreeMap::new(),
            snapshot_info: Default::default(),
            ana_state: Default::default(),
        }
    }

    pub(super) fn engine(id: &str, replicas: &[&str]) -> Typed<LonghornEngine> {
        let map: BTreeMap<&str, &str> = replicas.iter().map(|r| (*r, "127.0.0.1:20000")).collect();
        let spec = json!({ "volume": "v", "sizeBytes": 1048576, "replicaAddressMap": map, "port": 20100 });
        typed(id, serde_json::from_value(spec).expect("engine"))
    }

    /// One reconcile of `c` on `state`, as the runtime runs it.
    async fn pass(c: &LonghornController, state: &crate::runtime::State) {
        let mut ctx = ReconcileContext::new(state.clone(), NAME, c.inputs(), c.outputs());
        c.reconcile(&mut ctx).await.expect("reconcile");
        ctx.cleanup_outputs().expect("cleanup");
    }

    /// An InstanceCreate waits for its own instance, not for a pass over every
    /// other: the reconcile after a create writes the new instances' statuses
    /// (a replica, an engine-frontend) before it touches any of the 20
    /// engine-frontends already there, whose statuses all change in the same
    /// reconcile, and it still reaches every one of them. Before, the new ones
    /// came last (in name order after the 20), each create waiting for the pass.
    #[tokio::test]
    async fn a_created_instance_is_reconciled_before_the_pass_over_every_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let double = crate::spdk::double::SpdkDouble::start(dir.path().join("spdk.sock"))
            .await
            .expect("double");
        let c = LonghornController::new(SpdkClient::new(double.socket()));
        let state = ready_target_on(&double);
        let frontend = |v: &str, port: u16| LonghornEngineFrontend {
            volume: v.into(),
            engine_name: format!("{v}-e-0"),
            target_address: format!("127.0.0.1:{port}"),
            frontend: "spdk-tcp-nvmf".into(),
            size_bytes: 1 << 20,
            nr_io_queues: 0,
            switchover: None,
        };
        let old: Vec<String> = (0..20).map(|i| format!("vol{i:02}")).collect();
        for v in &old {
            state
                .upsert_typed(&format!("{v}-ef-0"), &frontend(v, 20000))
                .expect("frontend");
        }
        pass(&c, &state).await;

        // every engine-frontend there moves to another target (each status
        // changes), and a replica and an engine-frontend are created
        for v in &old {
            state
                .upsert_typed(&format!("{v}-ef-0"), &frontend(v, 20001))
                .expect("frontend");
        }
        state
            .upsert_typed("zz-ef-0", &frontend("zz", 20001))
            .expect("new frontend");
        // on a disk this node has not: its status (an error) is written at once
        state
            .upsert_typed("zz-r-00000001", &replica("zz-r-00000001", false).spec)
            .expect("new replica");
        let (_, mut rx) = state.watch(None);
        pass(&c, &state).await;
        let mut written = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            let m = &ev.resource.metadata;
            if m.type_ == LonghornInstanceStatus::TYPE && ev.kind != crate::runtime::EventKind::Destroyed {
                written.push(m.id.clone());
            }
        }
        assert_eq!(written.len(), 22, "every status written once: {written:?}");
        let mut first: Vec<&str> = written[..2].iter().map(String::as_str).collect();
        first.sort();
        assert_eq!(
            first,
            ["zz-ef-0", "zz-r-00000001"],
            "the created ones first: {written:?}"
        );
        let endpoint = state
            .get_typed::<LonghornInstanceStatus>("vol19-ef-0")
            .expect("status")
            .expect("vol19's status")
            .spec
            .endpoint;
        assert!(
            endpoint.contains(":20001/"),
            "the pass reached the others: {endpoint}"
        );
    }

    /// An engine-frontend's kernel connect asks for the queues the manager sent, else talon's
    /// bounded default (4), never one per host CPU.
    #[test]
    fn a_frontend_connects_with_the_managers_queues_else_a_bounded_default() {
        let f = |q: u32| LonghornEngineFrontend {
            volume: "v".into(),
            engine_name: "v-e-0".into(),
            target_address: "10.0.0.1:20001".into(),
            frontend: "spdk-tcp-blockdev".into(),
            size_bytes: 1 << 30,
            nr_io_queues: q,
            switchover: None,
        };
        assert_eq!(connect_options(&f(0)).nr_io_queues, nvme_tcp::DEFAULT_IO_QUEUES);
        assert_eq!(nvme_tcp::DEFAULT_IO_QUEUES, 4);
        assert_eq!(connect_options(&f(2)).nr_io_queues, 2);
        assert_eq!(connect_options(&f(64)).nr_io_queues, 64);
        // an older state file (no field) reads as the default
        let old: LonghornEngineFrontend = serde_json::from_value(json!({
            "volume": "v", "engineName": "v-e-0", "targetAddress": "10.0.0.1:20001",
            "frontend": "spdk-tcp-blockdev", "sizeBytes": 1
        }))
        .expect("old spec");
        assert_eq!(connect_options(&old).nr_io_queues, 4);
    }

    /// The instances tearing down are listed replicas first, then engines
    /// (engine-frontends last).
    #[test]
    fn instances_tearing_down_are_listed_replicas_first_then_engines() {
        let replicas = [replica("r-a", false), tearing_down(replica("r-b", false))];
        let engines = [tearing_down(engine("e1", &["r-a"])), engine("e2", &["r-a"])];
        assert_eq!(
            tearing(&replicas, &engines, &[]),
            [("r-b", InstanceKind::Replica), ("e1", InstanceKind::Engine)]
        );
    }
}
