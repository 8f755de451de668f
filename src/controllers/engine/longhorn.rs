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
//!   order: engines torn down, frontends torn down, replicas, engines, frontends
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
use crate::names::{Nqn, ObjectName};
use crate::resources::config::{Disk, NodeConfig};
use crate::resources::engine::{DiskStatus, ObjectState, TargetStatus};
use crate::resources::longhorn::{
    InstanceKind, InstanceState, LonghornEngine, LonghornEngineFrontend, LonghornInstanceStatus,
    LonghornReplica, LonghornRevertLedger, RevertStatus, Session,
};
use crate::runtime::{Controller, ControllerError, Input, Output, Phase, ReconcileContext, Requeue, Typed};
use crate::spdk::SpdkClient;
use crate::spdk::naming::longhorn as naming;
use crate::spdk::rpc::{Lvol, LvolStoreRef};
use crate::spdk::volume::{
    EngineNames, EnginePlan, Export, ExportSpec, Inventory, NewSubsystem, RemoteAttach, VolumeOps,
};

use crate::resources::engine::SPDK_STATUS_ID;

/// The controller's name (also its finalizer on Longhorn's instances, which
/// the gRPC handlers add: it lives with them, below the controllers).
pub use crate::resources::longhorn::CONTROLLER as NAME;
/// Where engine-frontends put their device nodes.
pub const DEV_DIR: &str = "/dev/longhorn";
const MIB: u64 = 1 << 20;
/// Status poll while instances exist (a remote replica that comes back, a
/// device that appears).
const POLL: Duration = Duration::from_secs(3);
/// The poll while a thin rebuild runs (a step per reconcile).
const THIN_POLL: Duration = Duration::from_millis(200);
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
    /// The thin rebuilds running.
    thin: thin::ThinRebuilds,
    /// Engine exports checked since this start for a freeze a stop left
    /// (`freeze::thaw_leftover`).
    thaw_checked: crate::spdk::volume::freeze::ThawOnce,
    /// The raid1 rebuild members this controller capped.
    caps: caps::Caps,
    /// This serve's session (`resources::longhorn::new_session`): only the
    /// reverts and rebuild starts written in it are carried out.
    session: Session,
}

#[path = "longhorn_thin.rs"]
mod thin;

#[path = "longhorn_purge.rs"]
mod purge;

#[path = "longhorn_members.rs"]
mod members;

#[path = "longhorn_revert.rs"]
mod revert;

#[path = "longhorn_caps.rs"]
mod caps;

#[path = "longhorn_snapshot.rs"]
mod snapshot;

#[path = "longhorn_rebuilds.rs"]
mod rebuilds;

impl LonghornController {
    /// A controller driving the target behind `client`.
    pub fn new(client: SpdkClient) -> Self {
        Self {
            ops: VolumeOps::new(client.clone()),
            client,
            host_nqn: None,
            host: None,
            peer_port: 8504,
            thin: thin::ThinRebuilds::default(),
            thaw_checked: Default::default(),
            caps: caps::Caps::default(),
            session: crate::resources::longhorn::new_session(),
        }
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

fn status(kind: InstanceKind, state: InstanceState, message: impl Into<String>) -> LonghornInstanceStatus {
    LonghornInstanceStatus::new(kind, state, message)
}

fn chain(e: &crate::spdk::ClientError) -> String {
    crate::util::error_chain(e)
}

/// How an engine is served: its names in SPDK (Longhorn's) and its
/// export, for its assembly and its thin rebuild's switch alike.
pub(super) struct Serving {
    names: EngineNames,
    spec: ExportSpec,
}

impl Serving {
    /// Engine `engine` of `volume`: raid1 `<engine>`, exported as
    /// `naming::volume_nqn(volume)` with namespace id `volume-<volume>`.
    fn of(engine: &ObjectName, volume: &ObjectName, spec: ExportSpec) -> Result<Self, String> {
        Ok(Self {
            names: EngineNames {
                raid: engine.as_str().to_owned(),
                placeholder: format!("{}lh-{engine}-", crate::spdk::naming::NULL_PREFIX),
                nqn: naming::volume_nqn(volume).map_err(|x| x.to_string())?,
                ns_uuid: naming::namespace_id(&format!("volume-{volume}")),
                subsystem: NewSubsystem {
                    model: "talon-longhorn-engine".into(),
                    serial: None,
                    ana: true,
                },
            },
            spec,
        })
    }

    /// The export's subsystem.
    fn nqn(&self) -> &Nqn {
        &self.names.nqn
    }

    /// The plan that serves the engine from `slots` (see [`EnginePlan`]);
    /// `bare`: its one replica's lvol, no raid1.
    fn plan(&self, slots: Vec<Option<String>>, bare: bool) -> EnginePlan<'_> {
        EnginePlan {
            volume: &self.names.raid,
            names: &self.names,
            slots,
            bare,
            geometry: None,
            superblock: None,
            spec: &self.spec,
        }
    }
}

impl LonghornController {
    /// Serves engine `plan` (see [`VolumeOps::serve_engine`]): returns the
    /// bdev that serves it.
    async fn serve(&self, inv: &mut Inventory, plan: &EnginePlan<'_>) -> Result<String, String> {
        let device = self
            .ops
            .serve_engine(inv, plan)
            .await
            .map_err(|x| crate::util::error_chain(&x))?;
        inv.tcp_transport = true;
        Ok(device)
    }

    /// Exports replica lvol `alias` as `nqn` (idempotent; see
    /// [`VolumeOps::export`]): a subsystem that serves another bdev serves
    /// this one.
    async fn export_replica(
        &self,
        inv: &mut Inventory,
        nqn: &Nqn,
        alias: &str,
        ns_uuid: uuid::Uuid,
        spec: &ExportSpec,
    ) -> Result<(), String> {
        let e = Export {
            nqn,
            bdev: alias,
            ns_uuid,
            subsystem: NewSubsystem {
                model: "talon-longhorn-replica".into(),
                serial: None,
                ana: true,
            },
            spec,
            only_listener: false,
        };
        self.ops
            .export(inv, nqn.as_str(), &e)
            .await
            .map_err(|x| crate::util::error_chain(&x))?;
        inv.tcp_transport = true;
        Ok(())
    }

    async fn unexport(&self, inv: &mut Inventory, nqn: &str) -> Result<(), String> {
        if inv.subsystem(nqn).is_none() {
            return Ok(());
        }
        self.ops
            .unexport(nqn, nqn)
            .await
            .map_err(|x| crate::util::error_chain(&x))?;
        inv.subsystems.retain(|s| s.nqn != nqn);
        Ok(())
    }

    /// A replica: its lvol, exported unless `held` by an engine here.
    async fn ensure_replica(
        &self,
        inv: &mut Inventory,
        ctx: &ReconcileContext,
        node: &NodeConfig,
        r: &Typed<LonghornReplica>,
        held: bool,
    ) -> Result<LonghornInstanceStatus, String> {
        let name = ObjectName::parse("replica", r.id()).map_err(|e| e.to_string())?;
        let spec = &r.spec;
        let disk = ctx
            .get::<DiskStatus>(&spec.disk)
            .map_err(|e| e.to_string())?
            .filter(|d| d.spec.state == ObjectState::Ready)
            .ok_or_else(|| format!("disk {} is not ready", spec.disk))?;
        let alias = naming::replica_alias(&spec.disk, name.as_str());
        // a revert another node's engine asked for, before the lvol is read
        let prev = ctx
            .get::<LonghornInstanceStatus>(r.id())
            .map_err(|e| e.to_string())?
            .map(|s| s.spec);
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
        let lvol = match inv.lvols.get(&alias) {
            Some(l) => l.clone(),
            None => {
                // bdev_lvol_create answers the new lvol's UUID: the rest is known (thin,
                // nothing allocated), so no listing of every lvol follows
                let uuid = crate::spdk::volume::lvol::create_thin(
                    &self.client,
                    &disk.spec.lvstore,
                    name.as_str(),
                    spec.size_bytes.div_ceil(MIB),
                )
                .await
                .map_err(|e| format!("creating lvol {alias}: {}", chain(&e)))?;
                let lvol = Lvol {
                    alias: alias.clone(),
                    uuid,
                    name: name.as_str().to_owned(),
                    is_thin_provisioned: true,
                    is_snapshot: false,
                    is_clone: false,
                    is_esnap_clone: false,
                    num_allocated_clusters: 0,
                    lvs: LvolStoreRef {
                        name: disk.spec.lvstore.clone(),
                        uuid: disk.spec.lvstore_uuid.clone(),
                    },
                };
                inv.lvols.insert(alias.clone(), lvol.clone());
                lvol
            }
        };
        // an expansion (ReplicaExpand, or the engine's on this node) grew the spec
        let mut size = inv
            .bdevs
            .get(&lvol.uuid)
            .map_or(spec.size_bytes, |b| u64::from(b.block_size) * b.num_blocks);
        if size < spec.size_bytes {
            crate::spdk::volume::lvol::resize(&self.client, &alias, spec.size_bytes.div_ceil(MIB))
                .await
                .map_err(|e| format!("growing lvol {alias} to {} bytes: {}", spec.size_bytes, chain(&e)))?;
            size = match self.client.bdev(&alias).await {
                Ok(Some(b)) => b.size_bytes(),
                Ok(None) => return Err(format!("lvol {alias} is gone after growing it")),
                Err(e) => return Err(format!("reading lvol {alias} after growing it: {}", chain(&e))),
            };
            if let Some(b) = inv.bdevs.get_mut(&lvol.uuid) {
                b.num_blocks = size / u64::from(b.block_size.max(1));
            }
        }
        let nqn = naming::replica_nqn(&name).map_err(|e| e.to_string())?;
        let addr: IpAddr = crate::host::longhorn_address::instance_ip(&node.listen_address)?;
        let mut st = status(InstanceKind::Replica, InstanceState::Running, "");
        st.bdev = alias.clone();
        st.uuid = lvol.uuid.clone();
        st.size_bytes = size;
        st.allocated_bytes = lvol
            .num_allocated_clusters
            .saturating_mul(disk.spec.cluster_bytes);
        if held {
            self.unexport(inv, nqn.as_str()).await?;
            st.message = "held by an engine on this node (its raid1 claims the lvol)".into();
        } else {
            let export = self.export_spec(node, addr, spec.port_start);
            self.export_replica(inv, &nqn, &alias, naming::namespace_id(name.as_str()), &export)
                .await?;
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
    async fn remove_replica(&self, inv: &mut Inventory, r: &Typed<LonghornReplica>) -> Result<(), String> {
        let name = ObjectName::parse("replica", r.id()).map_err(|e| e.to_string())?;
        let nqn = naming::replica_nqn(&name).map_err(|e| e.to_string())?;
        self.unexport(inv, nqn.as_str()).await?;
        if !r.spec.cleanup {
            return Ok(());
        }
        let head = naming::replica_alias(&r.spec.disk, name.as_str());
        let snaps = format!("{head}-snap-");
        // and the snapshot of an incremental restore a restart cut off
        let restore = naming::replica_alias(&r.spec.disk, &naming::restore_snapshot(name.as_str()));
        let mine = |a: &String| *a == head || a.starts_with(&snaps) || *a == restore;
        let mut left: Vec<String> = inv.lvols.keys().filter(|a| mine(a)).cloned().collect();
        while !left.is_empty() {
            // the lvols no other lvol of the replica is a clone of
            let leaves: Vec<String> = left
                .iter()
                .filter(|a| !left.iter().any(|o| inv.parent_of(o).is_some_and(|p| p == **a)))
                .cloned()
                .collect();
            if leaves.is_empty() {
                return Err(format!("replica {name}: lvols {left:?} depend on each other"));
            }
            for alias in leaves {
                crate::spdk::volume::lvol::delete_lvol(&self.client, &alias)
                    .await
                    .map_err(|e| format!("replica {name}: deleting lvol {alias}: {}", chain(&e)))?;
                left.retain(|a| *a != alias);
            }
        }
        for a in inv.lvols.keys().filter(|a| mine(a)).cloned().collect::<Vec<_>>() {
            inv.lvols.remove(&a);
        }
        Ok(())
    }

    /// The member bdevs of an engine, in `replicaAddressMap` order: a local
    /// replica's lvol, or a remote replica attached over NVMe/TCP. Members
    /// that cannot be reached are listed in the second value.
    async fn members(
        &self,
        inv: &Inventory,
        e: &LonghornEngine,
        local: &BTreeMap<String, LonghornReplica>,
    ) -> (Vec<String>, Vec<String>) {
        let mut bdevs = Vec::new();
        let mut missing = Vec::new();
        for (replica, address) in &e.replica_address_map {
            if let Some(r) = local.get(replica) {
                let alias = naming::replica_alias(&r.disk, replica);
                if inv.lvols.contains_key(&alias) {
                    bdevs.push(alias);
                } else {
                    missing.push(format!("local replica {replica}: lvol {alias} is missing"));
                }
                continue;
            }
            match self.attach_remote(inv, replica, address).await {
                Ok(b) => bdevs.push(b),
                Err(m) => missing.push(m),
            }
        }
        (bdevs, missing)
    }

    /// Remote replica `replica` at `address` as a member: see
    /// [`VolumeOps::remote_member`].
    async fn attach_remote(&self, inv: &Inventory, replica: &str, address: &str) -> Result<String, String> {
        let name = naming::instance_name("replica", replica).map_err(|e| e.to_string())?;
        let sa: SocketAddr = address
            .parse()
            .map_err(|_| format!("replica {replica}: address {address:?} is not ip:port"))?;
        let nqn = naming::replica_nqn(&name).map_err(|e| e.to_string())?;
        let a = RemoteAttach {
            controller: replica,
            address: sa.ip(),
            port: sa.port(),
            nqn: nqn.as_str(),
            host_nqn: Some(naming::internal_host_nqn()),
            longhorn_link: true,
            dhchap_data_dir: None,
            tls_data_dir: None,
        };
        self.ops
            .remote_member(inv, replica, &a)
            .await
            .map_err(|x| crate::util::error_chain(&x))
    }

    /// An engine: its members, raid1 (two or more) and export.
    async fn ensure_engine(
        &self,
        inv: &mut Inventory,
        node: &NodeConfig,
        e: &Typed<LonghornEngine>,
        local: &BTreeMap<String, LonghornReplica>,
        prev: Option<&LonghornInstanceStatus>,
    ) -> Result<LonghornInstanceStatus, String> {
        let name = ObjectName::parse("engine", e.id()).map_err(|x| x.to_string())?;
        let volume = ObjectName::parse("volume", &e.spec.volume).map_err(|x| x.to_string())?;
        let addr: IpAddr = crate::host::longhorn_address::instance_ip(&node.listen_address)?;
        let left = self.drop_removed(inv, e, local, prev).await;
        let serving = Serving::of(&name, &volume, self.export_spec(node, addr, e.spec.port))?;
        let raid = inv
            .raid(name.as_str())
            .map(|r| r.uuid.clone().unwrap_or_default());
        let plan = match raid {
            // it serves: the rebuilds and removals below change its members
            Some(_) => serving.plan(Vec::new(), false),
            None => {
                // a replica whose last rebuild was not seen to end stays out
                // (it may hold half a rebuild); Longhorn sees it ERR
                let mut spec = e.spec.clone();
                let done = prev.map(|p| &p.rebuilds_done);
                spec.replica_address_map.retain(|r, _| {
                    e.spec
                        .rebuild_requests
                        .get(r)
                        .is_none_or(|req| done.and_then(|d| d.get(r)) == Some(req))
                });
                let (members, missing) = self.members(&*inv, &spec, local).await;
                if !missing.is_empty() || members.is_empty() {
                    return Err(format!("waiting for replicas: {}", missing.join("; ")));
                }
                // one member of several (the others held out): a raid1
                // still, so the others can be rebuilt into it; its second
                // slot is empty (held by a placeholder while it is made)
                let bare = members.len() == 1 && e.spec.replica_address_map.len() == 1;
                let mut slots: Vec<Option<String>> = members.into_iter().map(Some).collect();
                if slots.len() == 1 && !bare {
                    slots.push(None);
                }
                serving.plan(slots, bare)
            }
        };
        let bdev = self.serve(inv, &plan).await?;
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
        // a snapshot's freeze left by a talon stopped before its thaw
        self.thaw_checked.check(&self.client, nqn.as_str()).await;
        let mut st = status(
            InstanceKind::Engine,
            InstanceState::Running,
            left.errors.join("; "),
        );
        st.remote_members = left.attached;
        if bdev == name.as_str() {
            self.rebuilds(inv, e, local, prev, &mut st, &serving).await;
        }
        self.purge(inv, e, local, prev, &mut st).await;
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
    ) -> Result<(), String> {
        let (member, uuid) = match local.get(replica) {
            Some(r) => {
                let alias = naming::replica_alias(&r.disk, replica);
                let uuid = inv
                    .lvols
                    .get(&alias)
                    .map(|l| l.uuid.clone())
                    .ok_or_else(|| format!("local replica {replica}: lvol {alias} is missing"))?;
                (alias, Some(uuid))
            }
            None => {
                if inv.controllers.iter().any(|c| c == replica) {
                    crate::spdk::volume::lvol::detach_controller(&self.client, replica)
                        .await
                        .map_err(|x| {
                            format!("replica {replica}: detaching its old controller: {}", chain(&x))
                        })?;
                    inv.controllers.retain(|c| c != replica);
                    inv.bdevs.remove(&format!("{replica}n1"));
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
            crate::spdk::volume::lvol::remove_raid_member(&self.client, &member)
                .await
                .map_err(|x| {
                    format!(
                        "replica {replica}: taking {member} out of raid {raid}: {}",
                        chain(&x)
                    )
                })?;
        }
        // capped once the raid has it open
        let mbps = u64::try_from(qos_mbps).unwrap_or(0);
        let capped = self
            .ops
            .add_member(raid, &member, Some(mbps))
            .await
            .map_err(|x| format!("replica {replica}: adding {member} to raid {raid}: {}", chain(&x)))?;
        if capped {
            self.caps.set(raid, &member, mbps);
        }
        tracing::info!(raid, replica, member, qos_mbps, "rebuild started");
        Ok(())
    }

    /// Removes an engine's export, raid and remote attachments (replicas stay).
    async fn remove_engine(
        &self,
        inv: &mut Inventory,
        e: &Typed<LonghornEngine>,
        local: &BTreeMap<String, LonghornReplica>,
    ) -> Result<(), String> {
        let volume = ObjectName::parse("volume", &e.spec.volume).map_err(|x| x.to_string())?;
        let nqn = naming::volume_nqn(&volume).map_err(|x| x.to_string())?;
        self.unexport(inv, nqn.as_str()).await?;
        if inv.raid(e.id()).is_some() {
            crate::spdk::volume::lvol::delete_raid(&self.client, e.id())
                .await
                .map_err(|x| format!("deleting raid {}: {}", e.id(), chain(&x)))?;
            inv.raids.retain(|r| r.name != e.id());
        }
        for replica in e.spec.replica_address_map.keys() {
            if local.contains_key(replica) || !inv.controllers.iter().any(|c| c == replica) {
                continue;
            }
            crate::spdk::volume::lvol::detach_controller(&self.client, replica)
                .await
                .map_err(|x| format!("detaching replica {replica}: {}", chain(&x)))?;
            inv.controllers.retain(|c| c != replica);
            inv.bdevs.remove(&format!("{replica}n1"));
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
    ) -> Result<LonghornInstanceStatus, String> {
        let mode = naming::FrontendMode::of(&f.spec.frontend)?;
        let volume = ObjectName::parse("volume", &f.spec.volume).map_err(|x| x.to_string())?;
        let sa: SocketAddr = f
            .spec
            .target_address
            .parse()
            .map_err(|_| format!("target address {:?} is not ip:port", f.spec.target_address))?;
        let nqn = naming::volume_nqn(&volume).map_err(|x| x.to_string())?;
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
            return Err("engine-frontends need the host's kernel (not available to this controller)".into());
        };
        let target = NvmeTcpTarget {
            traddr: sa.ip(),
            trsvcid: sa.port(),
            nqn,
        };
        let v = volume.clone();
        let attached = tokio::task::spawn_blocking(move || {
            let a = nvme_tcp::attach(&host, &data_dir, &v, &target, &ConnectOptions::default())
                .map_err(|e| crate::util::error_chain(&e))?;
            crate::attach::devpath::create_in(&host, DEV_DIR, &v, &a.device, a.dev)
                .map_err(|e| crate::util::error_chain(&e))?;
            Ok::<_, String>(a)
        })
        .await
        .map_err(|e| format!("attach task: {e}"))??;
        let mut st = status(InstanceKind::EngineFrontend, InstanceState::Running, "");
        st.bdev = attached.device;
        st.nqn = naming::volume_nqn(&volume)
            .map_err(|x| x.to_string())?
            .as_str()
            .to_owned();
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
                            status(InstanceKind::EngineFrontend, InstanceState::Error, m),
                        )?
                    }
                }
                continue;
            }
            let st = match self.ensure_frontend(f).await {
                Ok(s) => s,
                Err(m) => status(InstanceKind::EngineFrontend, InstanceState::Error, m),
            };
            ctx.apply(f.id(), st)?;
        }
        Ok(())
    }

    async fn remove_frontend(&self, f: &Typed<LonghornEngineFrontend>) -> Result<(), String> {
        // only a kernel attach leaves something on the host (an unknown frontend
        // never attached either)
        if naming::FrontendMode::of(&f.spec.frontend) != Ok(naming::FrontendMode::KernelBlockdev) {
            return Ok(());
        }
        let Some((host, data_dir)) = self.host.clone() else {
            return Ok(());
        };
        let volume = ObjectName::parse("volume", &f.spec.volume).map_err(|x| x.to_string())?;
        let nqn = naming::volume_nqn(&volume).map_err(|x| x.to_string())?;
        tokio::task::spawn_blocking(move || {
            crate::attach::devpath::remove_in(&host, DEV_DIR, &volume)
                .map_err(|e| crate::util::error_chain(&e))?;
            nvme_tcp::detach(&host, &data_dir, &volume, Some(&nqn))
                .map_err(|e| crate::util::error_chain(&e))?;
            Ok::<_, String>(())
        })
        .await
        .map_err(|e| format!("detach task: {e}"))?
    }
}

impl LonghornController {
    /// Step 1 of a reconcile: the engines tearing down are removed (their
    /// finalizer with them), or reported in error.
    async fn remove_engines(
        &self,
        ctx: &mut ReconcileContext,
        inv: &mut Inventory,
        engines: &[Typed<LonghornEngine>],
        local: &BTreeMap<String, LonghornReplica>,
        errored: &mut BTreeSet<String>,
    ) -> Result<(), ControllerError> {
        for e in engines.iter().filter(|e| e.metadata.phase == Phase::TearingDown) {
            match self.remove_engine(inv, e, local).await {
                Ok(()) => ctx.remove_finalizer::<LonghornEngine>(e.id())?,
                Err(m) => {
                    errored.insert(e.id().to_owned());
                    ctx.apply(e.id(), status(InstanceKind::Engine, InstanceState::Error, m))?
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
        held: &BTreeSet<&str>,
        errored: &mut BTreeSet<String>,
    ) -> Result<(), ControllerError> {
        for r in replicas {
            if r.metadata.phase == Phase::TearingDown {
                if held.contains(r.id()) && r.spec.cleanup {
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
                        ctx.apply(r.id(), status(InstanceKind::Replica, InstanceState::Error, m))?
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
                .ensure_replica(inv, ctx, node, r, held.contains(r.id()))
                .await
            {
                Ok(s) => s,
                Err(m) => {
                    let mut st = status(InstanceKind::Replica, InstanceState::Error, m);
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
        local: &BTreeMap<String, LonghornReplica>,
    ) -> Result<bool, ControllerError> {
        let prev = ctx.get::<LonghornInstanceStatus>(e.id())?.map(|s| s.spec);
        // a revert first: the raid1 is made again over the reverted heads
        let revert = self.revert(ctx, inv, e, local, prev.as_ref()).await?;
        let waiting = revert
            .as_ref()
            .is_some_and(|r| r.error.is_empty() && !r.waiting.is_empty());
        let mut st = match revert.as_ref() {
            Some(r) if !r.error.is_empty() => revert::half_reverted(InstanceKind::Engine, r),
            Some(r) if waiting => revert::reverting(prev.as_ref(), r),
            _ => engine_status(self.ensure_engine(inv, node, e, local, prev.as_ref()).await),
        };
        st.revert = revert;
        let running = match st.state {
            InstanceState::Running if !waiting => Ok(()),
            _ => Err(st.message.as_str()),
        };
        st.snapshots = self.snapshots(inv, e, local, prev.as_ref(), running).await;
        if st.state != InstanceState::Running
            && let Some(p) = prev
        {
            keep_recorded(&mut st, p);
        }
        st.remote_members
            .extend(members::remote_members(&e.spec.replica_address_map, local));
        st.observed_version = e.metadata.version;
        let fast = !st.thin_rebuilds.is_empty() || waiting;
        ctx.apply(e.id(), st)?;
        Ok(fast)
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
    for e in engines {
        ctx.apply(e.id(), status(InstanceKind::Engine, InstanceState::Starting, msg))?;
    }
    Ok(Requeue::After(POLL))
}

/// The replicas this node serves: running, and not made only to be removed.
fn local_replicas(replicas: &[Typed<LonghornReplica>]) -> BTreeMap<String, LonghornReplica> {
    replicas
        .iter()
        .filter(|r| r.metadata.phase == Phase::Running && !r.spec.cleanup)
        .map(|r| (r.id().to_owned(), r.spec.clone()))
        .collect()
}

/// The local replicas a running engine here holds (a raid1 claims them: not
/// exported), but those rebuilt from another node (exported for it).
fn held<'a>(
    running_engines: &[&'a Typed<LonghornEngine>],
    local: &BTreeMap<String, LonghornReplica>,
    rebuilt_from_afar: &BTreeSet<String>,
) -> BTreeSet<&'a str> {
    running_engines
        .iter()
        .flat_map(|e| e.spec.replica_address_map.keys())
        .filter(|r| local.contains_key(*r) && !rebuilt_from_afar.contains(*r))
        .map(String::as_str)
        .collect()
}

/// An engine's status from what `ensure_engine` came to: running, starting
/// while it waits for replicas, or in error.
fn engine_status(made: Result<LonghornInstanceStatus, String>) -> LonghornInstanceStatus {
    match made {
        Ok(s) => s,
        Err(m) if m.starts_with("waiting for replicas") => {
            status(InstanceKind::Engine, InstanceState::Starting, m)
        }
        Err(m) => status(InstanceKind::Engine, InstanceState::Error, m),
    }
}

/// What an engine that is not running keeps of its previous status.
fn keep_recorded(st: &mut LonghornInstanceStatus, prev: LonghornInstanceStatus) {
    // the rebuilds started stay recorded (none is started twice)
    st.rebuilds_started = prev.rebuilds_started;
    st.rebuilds_done = prev.rebuilds_done;
    st.rebuild_errors = prev.rebuild_errors;
    st.purge = prev.purge;
    // what is still to detach stays known
    st.remote_members = prev.remote_members;
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
        ]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let replicas = ctx.list::<LonghornReplica>()?;
        let engines = ctx.list::<LonghornEngine>()?;
        let frontends = ctx.list::<LonghornEngineFrontend>()?;
        // kept first, also through a reconcile with nothing to do: a
        // detach takes every instance of a volume that is mid-revert
        revert::keep_revert_ledgers(ctx)?;
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

        // 1. engines going away
        // one listing of the target per reconcile: what this reconcile changes it
        // records in `inv` as it goes (lvols made, subsystems, raids and
        // controllers removed), so later steps see it without listing again
        let started = Instant::now();
        let mut inv = Inventory::load(&self.client).await?;
        let listed = started.elapsed();
        revert::drop_stale_revert_ledgers(ctx, &inv, &engines)?;
        self.remove_engines(ctx, &mut inv, &engines, &local, &mut errored)
            .await?;

        // 2. replicas: held ones are not exported
        let running_engines: Vec<&Typed<LonghornEngine>> = engines
            .iter()
            .filter(|e| e.metadata.phase == Phase::Running)
            .collect();
        // (a replica rebuilt from another node is exported for it instead)
        let rebuilt_from_afar = self.thin.exported_dsts();
        let held = held(&running_engines, &local, &rebuilt_from_afar);
        self.reconcile_replicas(ctx, &mut inv, &node, &replicas, &held, &mut errored)
            .await?;

        // 3. engines
        let replicas_done = started.elapsed();
        // a thin rebuild goes one step per reconcile, and a revert asks the
        // nodes still reverting its replicas again at each: the next one soon
        let mut fast = false;
        for e in &running_engines {
            fast |= self.reconcile_engine(ctx, &mut inv, &node, e, &local).await?;
        }

        // 4. engine-frontends (after the engines: one here may be what they attach)
        let engines_done = started.elapsed();
        self.reconcile_frontends(ctx, &frontends, false, &mut errored)
            .await?;
        tracing::debug!(
            listing_ms = listed.as_secs_f64() * 1e3,
            replicas_ms = (replicas_done - listed).as_secs_f64() * 1e3,
            engines_ms = (engines_done - replicas_done).as_secs_f64() * 1e3,
            frontends_ms = (started.elapsed() - engines_done).as_secs_f64() * 1e3,
            replicas = replicas.len(),
            engines = engines.len(),
            frontends = frontends.len(),
            "Longhorn reconcile"
        );
        // instances still tearing down keep a status until they are gone
        for (id, kind) in tearing(&replicas, &engines, &frontends) {
            if !errored.contains(id) && ctx.state().get("config", kind_type(kind), id).is_some() {
                ctx.apply(id, status(kind, InstanceState::Stopping, ""))?;
            }
        }
        Ok(Requeue::After(if fast { THIN_POLL } else { POLL }))
    }
}

fn kind_type(kind: InstanceKind) -> &'static str {
    use crate::runtime::Spec;
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

    fn typed<S>(id: &str, spec: S) -> Typed<S> {
        Typed {
            metadata: crate::runtime::Metadata::new("config", "Test", id, ""),
            spec,
        }
    }

    fn tearing_down<S>(mut t: Typed<S>) -> Typed<S> {
        t.metadata.phase = Phase::TearingDown;
        t
    }

    fn replica(id: &str, cleanup: bool) -> Typed<LonghornReplica> {
        let spec = json!({
            "volume": "v", "disk": "d", "sizeBytes": 1048576, "portStart": 20000, "portEnd": 20010,
            "cleanup": cleanup
        });
        typed(id, serde_json::from_value(spec).expect("replica"))
    }

    fn engine(id: &str, replicas: &[&str]) -> Typed<LonghornEngine> {
        let map: BTreeMap<&str, &str> = replicas.iter().map(|r| (*r, "127.0.0.1:20000")).collect();
        let spec = json!({ "volume": "v", "sizeBytes": 1048576, "replicaAddressMap": map, "port": 20100 });
        typed(id, serde_json::from_value(spec).expect("engine"))
    }

    /// This node serves its running replicas, not those tearing down or
    /// made only to be removed.
    #[test]
    fn only_running_replicas_not_made_to_be_removed_are_served_here() {
        let replicas = [
            replica("r-a", false),
            replica("r-b", true),
            tearing_down(replica("r-c", false)),
        ];
        assert_eq!(local_replicas(&replicas).into_keys().collect::<Vec<_>>(), ["r-a"]);
    }

    /// A local replica in a running engine's map is held (not exported)
    /// unless it is rebuilt from another node; another node's replica never.
    #[test]
    fn a_local_replica_of_a_running_engine_is_held_unless_rebuilt_from_afar() {
        let local = local_replicas(&[
            replica("r-a", false),
            replica("r-b", false),
            replica("r-c", false),
        ]);
        let (e1, e2) = (engine("e1", &["r-a", "r-x"]), engine("e2", &["r-b"]));
        let afar = BTreeSet::from(["r-b".to_owned()]);
        assert_eq!(held(&[&e1, &e2], &local, &afar), BTreeSet::from(["r-a"]));
        assert_eq!(
            held(&[&e1, &e2], &local, &BTreeSet::new()),
            BTreeSet::from(["r-a", "r-b"])
        );
        assert!(held(&[], &local, &afar).is_empty());
    }

    /// An engine that waits for its replicas is starting, one that failed
    /// otherwise is in error.
    #[test]
    fn an_engine_waiting_for_replicas_is_starting_any_other_failure_an_error() {
        let s = engine_status(Err("waiting for replicas: r-b".into()));
        assert_eq!(
            (s.state, s.message.as_str()),
            (InstanceState::Starting, "waiting for replicas: r-b")
        );
        assert_eq!(engine_status(Err("no port".into())).state, InstanceState::Error);
        let ok = status(InstanceKind::Engine, InstanceState::Running, "");
        assert_eq!(engine_status(Ok(ok.clone())), ok);
    }

    /// An engine not running keeps the rebuilds it started, saw done or
    /// failed, its purge and the members still to detach; nothing else.
    #[test]
    fn an_engine_not_running_keeps_its_rebuild_records_and_members_to_detach() {
        let mut prev = status(InstanceKind::Engine, InstanceState::Running, "");
        prev.rebuilds_started = [("r-a".to_owned(), 2)].into();
        prev.rebuilds_done = [("r-a".to_owned(), 1)].into();
        prev.rebuild_errors = [("r-b".to_owned(), "no lvol".to_owned())].into();
        prev.remote_members = ["r-b".to_owned()].into();
        prev.thin_rebuilds = [("r-a".to_owned(), 40)].into();
        prev.bdev = "e".into();
        let mut st = status(InstanceKind::Engine, InstanceState::Error, "gone");
        keep_recorded(&mut st, prev.clone());
        assert_eq!(st.rebuilds_started, prev.rebuilds_started);
        assert_eq!(st.rebuilds_done, prev.rebuilds_done);
        assert_eq!(st.rebuild_errors, prev.rebuild_errors);
        assert_eq!(st.remote_members, prev.remote_members);
        assert_eq!(st.purge, prev.purge);
        assert!(st.thin_rebuilds.is_empty() && st.bdev.is_empty(), "{st:?}");
        assert_eq!((st.state, st.message.as_str()), (InstanceState::Error, "gone"));
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
