//! 8501 `imrpc.ProxyEngineService` for the engines of this node, and the
//! replica snapshot calls of 8504 that an engine snapshot fans out to.
//!
//! ```text
//!   longhorn-manager engine monitor (every few seconds, on the engine's node):
//!     VolumeGet ─ ReplicaList ─ SnapshotList ─ ReplicaRebuildingStatus ─
//!     SnapshotPurgeStatus ─ SnapshotCloneStatus ─ BackupRestoreStatus ─ MetricsGet
//!       └─> LonghornEngine spec + LonghornInstanceStatus + what spdk_tgt holds
//!             (the raid1's members: in service = RW, rebuild target = WO, else ERR)
//!   VolumeSnapshot(engine, name):
//!     checked here, then numbered on the engine (snapshotRequests) and waited for:
//!     the controller (controllers/longhorn/snapshot.rs) freezes the export and
//!     snapshots every replica in service with talon's own point-in-time core
//!     (VolumeOps::take_at_one_instant):
//!       ├─ local replica:  bdev_lvol_snapshot <lvs>/<replica> -> <replica>-snap-<name>
//!       └─ remote replica: its node's SPDKService ReplicaSnapshotCreate (<ip>:<its 8504>)
//!     thaw always; any failure deletes what was made and names the replica
//!   ReplicaSnapshotCreate (another node's engine, inside its freeze): this
//!     node's lvol snapshotted at once (a controller's round would hold the freeze)
//!   SnapshotRemove: the same lvols, deleted where they are
//! ```
//!
//! Why the snapshots are one instant: the same argument as talon's own
//! volumes (docs/replicas.md, "Snapshots at one point in time"): the
//! freeze returns when nothing is in flight in the raid1 and lets nothing new
//! in, and a remote replica's target has completed every write the raid sent
//! it. Snapshots are named as Longhorn's V2 engine names them
//! (`<replica>-snap-<snapshot>`), so Longhorn's view of a replica's lvols
//! stays the same.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use tonic::{Request, Response, Status};

use super::error::LonghornError;
use super::service::{FORWARDED, IoSample, Longhorn, chain, internal, next_request};
use crate::names::ObjectName;
use crate::proto::imrpc::{self, proxy_engine_service_server};
use crate::proto::ptypes;
use crate::proto::spdkrpc::{self, spdk_service_client::SpdkServiceClient};
use crate::resources::longhorn::{
    InstanceKind, InstanceState, LonghornEngine, LonghornEngineFrontend, LonghornInstanceStatus,
    LonghornReplica, SnapshotInfo, SnapshotRequest,
};
use crate::runtime::Typed;
use crate::spdk::naming::longhorn::{self as naming, is_rebuild_snap, tcp};
use crate::spdk::volume::Inventory;
use crate::spdk::volume::naming::lvstore;
use crate::spdk::volume::{ReplicaLvols, SnapshotDeleteError};

/// Longhorn's name of the head in a snapshot list.
pub const VOLUME_HEAD: &str = "volume-head";
/// How long another node may take to snapshot its replica (the engine's
/// export is frozen meanwhile).
pub(super) const REMOTE_TIMEOUT: Duration = Duration::from_secs(10);
const MIB: u64 = 1 << 20;
/// SPDK's longest lvol name (`SPDK_LVOL_NAME_MAX` less its NUL).
pub(super) const LVOL_NAME_MAX: usize = 63;

pub use crate::resources::longhorn::snapshot_lvol;

/// One member of an engine as the proxy reports it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Member {
    pub(super) replica: String,
    pub(super) address: String,
    pub(super) mode: ptypes::ReplicaMode,
    /// Percent, while it is rebuilt.
    pub(super) progress: Option<u32>,
}

pub(super) fn proxy_req(
    r: Option<imrpc::ProxyEngineRequest>,
) -> Result<imrpc::ProxyEngineRequest, LonghornError> {
    r.ok_or_else(|| LonghornError::Invalid("proxy_engine_request is missing".into()))
}

impl Longhorn {
    pub(super) fn engine(&self, name: &str) -> Result<Typed<LonghornEngine>, LonghornError> {
        if name.is_empty() {
            return Err(LonghornError::Invalid("engine_name is empty".into()));
        }
        self.state()
            .get_typed::<LonghornEngine>(name)
            .map_err(LonghornError::Store)?
            .ok_or_else(|| LonghornError::not_found("engine", name))
    }

    /// The engine of this node whose export listens at `address`
    /// (`[tcp://]ip:port`: the port is the engine's; every engine of a node
    /// has its own).
    pub(super) fn engine_at(&self, address: &str) -> Result<Typed<LonghornEngine>, LonghornError> {
        let a = address.strip_prefix("tcp://").unwrap_or(address);
        let port = a
            .parse::<std::net::SocketAddr>()
            .map_err(|_| {
                LonghornError::Invalid(format!(
                    "engine address {address:?} is not [tcp://]ip:port (and the request names no engine)"
                ))
            })?
            .port();
        self.state()
            .list_typed::<LonghornEngine>()
            .map_err(LonghornError::Store)?
            .into_iter()
            .find(|e| e.spec.port == port && e.metadata.phase == crate::runtime::Phase::Running)
            .ok_or_else(|| LonghornError::not_found("engine at", a))
    }

    pub(super) fn status_of(&self, name: &str) -> Option<LonghornInstanceStatus> {
        self.fresh_status(name).ok().flatten()
    }

    /// The status of instance `name`, unless it was last written before the
    /// instance of that name was made: its predecessor's, which the
    /// controller's pass that removed that one drops when it ends (an
    /// instance deleted and made again under one name in between would be
    /// reported running before it is). With no instance of that name, the
    /// status as it is.
    pub(super) fn fresh_status(&self, name: &str) -> Result<Option<LonghornInstanceStatus>, LonghornError> {
        let state = self.state();
        let Some(st) = state
            .get_typed::<LonghornInstanceStatus>(name)
            .map_err(LonghornError::State)?
        else {
            return Ok(None);
        };
        let created = match st.spec.kind {
            InstanceKind::Engine => state
                .get_typed::<LonghornEngine>(name)
                .map(|r| r.map(|r| r.metadata.created)),
            InstanceKind::Replica => state
                .get_typed::<LonghornReplica>(name)
                .map(|r| r.map(|r| r.metadata.created)),
            InstanceKind::EngineFrontend => state
                .get_typed::<LonghornEngineFrontend>(name)
                .map(|r| r.map(|r| r.metadata.created)),
        }
        .map_err(LonghornError::State)?;
        // RFC 3339 in UTC with the same precision: ordered as text
        Ok(match created {
            Some(c) if st.metadata.updated < c => None,
            _ => Some(st.spec),
        })
    }

    pub(super) fn local_replica(&self, name: &str) -> Option<LonghornReplica> {
        self.state()
            .get_typed::<LonghornReplica>(name)
            .ok()
            .flatten()
            .map(|r| r.spec)
    }

    /// The members of engine `e` and their modes, read from spdk_tgt now.
    pub(super) async fn members(&self, e: &Typed<LonghornEngine>) -> Result<Vec<Member>, LonghornError> {
        let inv = Inventory::load(self.client())
            .await
            .map_err(|x| LonghornError::spdk(format!("engine {}: reading spdk_tgt", e.id()), x))?;
        Ok(self.members_in(e, &inv))
    }

    /// [`Self::members`] for the manager's polls: from a listing at most
    /// [`super::service::POLL_LISTING_AGE`] old, shared by the polls of every engine.
    /// An engine with no status yet (statuses are not persisted: talon started
    /// moments ago, its controller has not looked at it) is UNAVAILABLE, not
    /// every replica ERR: longhorn-manager takes an engine whose replicas are
    /// all ERR as failed and salvages its volume (a detach and an attach, an
    /// outage for the host), as a talon restarted under a serving engine met.
    pub(super) async fn members_polled(
        &self,
        e: &Typed<LonghornEngine>,
    ) -> Result<Vec<Member>, LonghornError> {
        if self.status_of(e.id()).is_none() {
            return Err(LonghornError::Unavailable(format!(
                "engine {}: not looked at since talon started; ask again",
                e.id()
            )));
        }
        let inv = self
            .polled_inventory()
            .await
            .map_err(|x| LonghornError::spdk(format!("engine {}: reading spdk_tgt", e.id()), x))?;
        Ok(self.members_in(e, &inv))
    }

    /// The members of engine `e` and their modes in listing `inv`.
    fn members_in(&self, e: &Typed<LonghornEngine>, inv: &Inventory) -> Vec<Member> {
        let status = self.status_of(e.id());
        let running = status.as_ref().is_some_and(|s| s.state == InstanceState::Running);
        // a `ReplicaAdd` the controller has not taken up yet (it records the request in
        // `rebuildsStarted` when its reconcile ends): the replica is joining, WO at 0 %, as
        // Longhorn's engine lists a replica it adds. ERR there made the manager fail the
        // replica while its ReplicaAdd still ran, and a new replica (one try only) for good.
        let pending: BTreeSet<&String> = e
            .spec
            .rebuild_requests
            .iter()
            .filter(|(r, n)| status.as_ref().and_then(|s| s.rebuilds_started.get(*r)) != Some(*n))
            .map(|(r, _)| r)
            .collect();
        // a revert not carried out yet (the call checked every replica RW):
        // the modes from before it while the controller takes the raid1 down
        let reverting = e.spec.revert.as_ref().is_some_and(|r| {
            r.session == self.session()
                && status
                    .as_ref()
                    .and_then(|s| s.revert.as_ref())
                    .is_none_or(|d| !d.answers(r.request))
        });
        // replicas rebuilt thin: out of the raid until they equal their source
        let thin = status.map(|s| s.thin_rebuilds).unwrap_or_default();
        let raid = inv.raid(e.id());
        let switch = self.switch_of(e.id());
        let mut out = Vec::new();
        for (replica, address) in &e.spec.replica_address_map {
            // the names a member may go by in the raid: local lvol (alias,
            // UUID) or the remote controller's namespace bdev
            let mut names = vec![format!("{replica}n1")];
            if let Some(r) = self.local_replica(replica) {
                let alias = naming::replica_alias(&r.disk, replica);
                if let Some(l) = inv.lvols.get(&alias) {
                    names.push(l.uuid.clone());
                }
                names.push(alias);
            }
            if let Some(b) = inv.bdevs.get(&names[0]) {
                names.extend(b.uuid.clone());
            }
            let (mode, progress) = match raid {
                _ if reverting => (ptypes::ReplicaMode::Rw, None),
                _ if !running => (ptypes::ReplicaMode::Err, None),
                // a thin rebuild's switch: the modes from before it
                _ if switch.is_some() => match switch.as_ref() {
                    Some(s) if s.in_service.contains(replica) => (ptypes::ReplicaMode::Rw, None),
                    Some(s) if s.joining == *replica || thin.contains_key(replica) => (
                        ptypes::ReplicaMode::Wo,
                        Some(thin.get(replica).copied().unwrap_or(99)),
                    ),
                    _ if pending.contains(replica) => (ptypes::ReplicaMode::Wo, Some(0)),
                    _ => (ptypes::ReplicaMode::Err, None),
                },
                // one replica: exported without a raid
                None if e.spec.replica_address_map.len() == 1 => (ptypes::ReplicaMode::Rw, None),
                None => (ptypes::ReplicaMode::Err, None),
                Some(raid) => {
                    let slot = raid.base_bdevs_list.iter().find(|b| {
                        b.name.as_ref().is_some_and(|n| names.contains(n))
                            || b.uuid.as_ref().is_some_and(|u| names.contains(u))
                    });
                    let rebuilding = raid.process.as_ref().filter(|p| {
                        names.contains(&p.target) || slot.and_then(|s| s.name.as_ref()) == Some(&p.target)
                    });
                    match (slot, rebuilding) {
                        (Some(_), Some(p)) => (ptypes::ReplicaMode::Wo, Some(p.progress.percent)),
                        (None, _) if thin.contains_key(replica) => {
                            (ptypes::ReplicaMode::Wo, thin.get(replica).copied())
                        }
                        (None, _) if pending.contains(replica) => (ptypes::ReplicaMode::Wo, Some(0)),
                        (Some(s), None) if s.is_configured && raid.state == "online" => {
                            (ptypes::ReplicaMode::Rw, None)
                        }
                        _ => (ptypes::ReplicaMode::Err, None),
                    }
                }
            };
            out.push(Member {
                replica: replica.clone(),
                address: address.clone(),
                mode,
                progress,
            });
        }
        out
    }

    /// The engine-frontend of engine `e` on this node, if any (by name, or
    /// the one that attaches it).
    pub(super) fn frontend_of(&self, e: &str, named: &str) -> Option<Typed<LonghornEngineFrontend>> {
        // the manager names it in its VolumeGet polls: one lookup, not a listing of them all
        if !named.is_empty() {
            return self
                .state()
                .get_typed::<LonghornEngineFrontend>(named)
                .ok()
                .flatten();
        }
        self.frontends_of(e).into_iter().next()
    }

    /// The engine-frontends of this node that attach engine `e` (the others are not decoded:
    /// the manager's VolumeGet polls of every engine ask this).
    pub(super) fn frontends_of(&self, e: &str) -> Vec<Typed<LonghornEngineFrontend>> {
        /// What a stored engine-frontend's spec says of its engine.
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct OfEngine<'a> {
            #[serde(borrow)]
            engine_name: &'a str,
        }
        self.state()
            .list_typed_where::<LonghornEngineFrontend>(|spec| {
                <OfEngine as serde::Deserialize>::deserialize(spec).is_ok_and(|f| f.engine_name == e)
            })
            .unwrap_or_default()
    }

    /// The lvols of engine `e`'s replicas as one of them holds them (every
    /// replica in service holds the same snapshots): a replica of this node
    /// read from spdk_tgt, else one of another node's (its `ReplicaGet`);
    /// `None` when none answers.
    pub(super) async fn engine_lvols(
        &self,
        e: &Typed<LonghornEngine>,
    ) -> Result<Option<ReplicaLvols>, LonghornError> {
        self.engine_lvols_from(e, false).await
    }

    /// [`Self::engine_lvols`], a local replica's read from a listing `polled` (the manager's
    /// `SnapshotList`: [`Self::polled_inventory`]) or made now.
    pub(super) async fn engine_lvols_from(
        &self,
        e: &Typed<LonghornEngine>,
        polled: bool,
    ) -> Result<Option<ReplicaLvols>, LonghornError> {
        if let Some((replica, r)) = e
            .spec
            .replica_address_map
            .keys()
            .find_map(|k| self.local_replica(k).map(|r| (k.clone(), r)))
        {
            if polled {
                let inv = self
                    .polled_inventory()
                    .await
                    .map_err(|x| LonghornError::spdk(format!("replica {replica}: listing spdk_tgt"), x))?;
                return Ok(Some(ReplicaLvols::from_inventory(
                    &inv,
                    &lvstore(&r.disk),
                    &replica,
                )));
            }
            return self.replica_lvols_now(&replica, &r.disk).await.map(Some);
        }
        let remote = self
            .peers()
            .remote_replica(&e.spec.replica_address_map, self.peer_port(), REMOTE_TIMEOUT)
            .await;
        Ok(remote.map(|r| ReplicaLvols::from(&r)))
    }

    /// The snapshot times and labels engine `e`'s replicas keep for
    /// snapshots `wanted`: this node's ([`LonghornReplica::snapshot_info`]),
    /// and for those none of them has (a replica here rebuilt after the
    /// snapshot was taken holds its data, not its time), the other nodes'
    /// replicas' (their `ReplicaGet`'s `creation_time`; labels are not in
    /// it).
    pub(super) async fn replicas_snapshot_info(
        &self,
        e: &Typed<LonghornEngine>,
        wanted: &[&String],
    ) -> std::collections::BTreeMap<String, SnapshotInfo> {
        let mut out = std::collections::BTreeMap::new();
        for r in e.spec.replica_address_map.keys() {
            if let Some(l) = self.local_replica(r) {
                for (s, i) in l.snapshot_info {
                    if !i.created.is_empty() {
                        out.entry(s).or_insert(i);
                    }
                }
            }
        }
        // the other nodes' replicas, each asked in turn until every wanted
        // snapshot has a time (a replica here is not asked again: its record
        // was read above)
        for (replica, address) in &e.spec.replica_address_map {
            if wanted.iter().all(|s| out.contains_key(*s)) {
                break;
            }
            if self.local_replica(replica).is_some() {
                continue;
            }
            let one: std::collections::BTreeMap<String, String> = [(replica.clone(), address.clone())].into();
            let Some(r) = self
                .peers()
                .remote_replica(&one, self.peer_port(), REMOTE_TIMEOUT)
                .await
            else {
                continue;
            };
            for (s, l) in r.snapshots {
                if !l.creation_time.is_empty() {
                    out.entry(s).or_insert(SnapshotInfo {
                        created: l.creation_time,
                        labels: Default::default(),
                    });
                }
            }
        }
        out
    }

    /// Snapshots a local replica's head as `lvol`; one that exists is kept.
    async fn snapshot_local(
        &self,
        replica: &str,
        r: &LonghornReplica,
        lvol: &str,
    ) -> Result<(), LonghornError> {
        let lvs = crate::spdk::volume::naming::lvstore(&r.disk);
        match self.ops().snapshot_replica_head(&lvs, replica, lvol).await {
            Ok(_) => Ok(()),
            Err(e) => Err(LonghornError::spdk(
                format!("replica {replica}: snapshotting {lvs}/{replica} as {lvol}"),
                e,
            )),
        }
    }

    /// The SPDKService of the node that serves a replica at `address`
    /// (`ip:port` of its export): the same IP, this node's SPDKService port
    /// (every instance manager of a cluster listens on the same ports).
    pub(super) async fn replica_node(
        &self,
        replica: &str,
        address: &str,
    ) -> Result<SpdkServiceClient<tonic::transport::Channel>, LonghornError> {
        self.peers()
            .client(address, self.peer_port(), REMOTE_TIMEOUT)
            .await
            .map_err(|source| LonghornError::Unreachable {
                replica: replica.to_owned(),
                source,
            })
    }

    /// Snapshot `snap` of every replica of engine `e` in service at one
    /// instant: checked here, numbered on the engine
    /// (`snapshotRequests`), taken by the controller; this waits for its
    /// status and records the snapshot's time and labels with it.
    async fn engine_snapshot(
        &self,
        e: &Typed<LonghornEngine>,
        snap: &str,
        info: SnapshotInfo,
    ) -> Result<(), LonghornError> {
        let what = format!("snapshot {snap} of engine {}", e.id());
        naming::instance_name("snapshot", snap)
            .map_err(|x| LonghornError::Invalid(format!("{what}: {x}")))?;
        for replica in e.spec.replica_address_map.keys() {
            let lvol = snapshot_lvol(replica, snap);
            if lvol.len() > LVOL_NAME_MAX {
                return Err(LonghornError::Invalid(format!(
                    "{what}: lvol name {lvol} is longer than SPDK's {LVOL_NAME_MAX} characters"
                )));
            }
        }
        if self
            .status_of(e.id())
            .is_none_or(|s| s.state != InstanceState::Running)
        {
            return Err(LonghornError::Refused(format!(
                "{what}: the engine is not running"
            )));
        }
        let done = self
            .status_of(e.id())
            .and_then(|s| s.snapshots.get(snap).map(|d| d.request))
            .unwrap_or(0);
        let asked = self
            .engine(e.id())?
            .spec
            .snapshot_requests
            .get(snap)
            .map_or(0, |r| r.request);
        let request = next_request(asked.max(done));
        let session = self.session();
        self.update_engine(e, |s| {
            // a request of an earlier serve has no call waiting on it
            s.snapshot_requests.retain(|_, r| r.session == session);
            s.snapshot_requests.insert(
                snap.to_owned(),
                SnapshotRequest {
                    request,
                    session,
                    info: Some(info.clone()),
                },
            );
        })?;
        let taken = self
            .wait_status(e.id(), &what, |st| {
                let d = st.snapshots.get(snap).filter(|d| d.request >= request)?;
                Some(match d.error.as_str() {
                    "" => Ok(()),
                    m => Err(LonghornError::Failed(m.to_owned())),
                })
            })
            .await;
        // the answer is had: the request goes, the snapshot's time and labels
        // (for SnapshotList; SPDK keeps neither) come with a snapshot taken
        self.update_engine(e, |s| {
            if s.snapshot_requests
                .get(snap)
                .is_some_and(|r| r.request == request)
            {
                s.snapshot_requests.remove(snap);
            }
            if taken.is_ok() {
                s.snapshot_info.insert(snap.to_owned(), info.clone());
            }
        })?;
        if taken.is_ok() {
            // kept with this node's replicas too (another node's keeps it from
            // its ReplicaSnapshotCreate): an engine made later lists it
            for r in e.spec.replica_address_map.keys() {
                if self.local_replica(r).is_some() {
                    self.replica_snapshot_info(r, |m| {
                        m.insert(snap.to_owned(), info.clone());
                    })?;
                }
            }
        }
        taken
    }

    /// Grows local replica `replica` to `size` bytes: checked (it grows, the
    /// disk has room, whole clusters), recorded in its spec, and carried out
    /// by the controller, whose status this waits for.
    async fn expand_local(
        &self,
        replica: &str,
        t: &Typed<LonghornReplica>,
        size: u64,
    ) -> Result<(), LonghornError> {
        let what = format!("replica {replica}");
        if size < t.spec.size_bytes {
            return Err(LonghornError::Refused(format!(
                "{what} is {} bytes; it can only grow, not shrink to {size}",
                t.spec.size_bytes
            )));
        }
        if size > t.spec.size_bytes {
            let d = self.ready_disk(&what, &t.spec.disk)?;
            self.check_room(&what, &t.spec.disk, d.total_bytes, Some(t.id()), size)
                .await?;
        }
        let alias = naming::replica_alias(&t.spec.disk, replica);
        let inv = Inventory::load(self.client())
            .await
            .map_err(|x| LonghornError::spdk(format!("{what}: reading spdk_tgt"), x))?;
        let cluster = cluster_size(&inv, &lvstore(&t.spec.disk)).unwrap_or(MIB);
        if size == 0 || !size.is_multiple_of(cluster) {
            return Err(LonghornError::Invalid(format!(
                "{what}: size {size} is not a positive multiple of disk {}'s cluster size {cluster}",
                t.spec.disk
            )));
        }
        if t.spec.size_bytes != size {
            let mut spec = t.spec.clone();
            spec.size_bytes = size;
            self.state()
                .update_typed(t.id(), "", None, &spec)
                .map_err(LonghornError::Store)?;
        }
        // the controller grows the lvol (ensure_replica) and reports its size
        self.wait_status(
            replica,
            &format!("{what}: growing {alias} to {size} bytes"),
            |st| {
                if st.size_bytes >= size {
                    return Some(Ok(()));
                }
                (st.state == InstanceState::Error).then(|| {
                    Err(LonghornError::internal(
                        format!("{what}: growing {alias} to {size} bytes"),
                        &st.message,
                    ))
                })
            },
        )
        .await
    }

    async fn expand_remote(&self, replica: &str, address: &str, size: u64) -> Result<(), LonghornError> {
        let peer = |message: &str| LonghornError::Peer {
            replica: replica.to_owned(),
            message: message.to_owned(),
        };
        let mut c = self
            .peers()
            .client(address, self.peer_port(), REMOTE_TIMEOUT)
            .await
            .map_err(|e| peer(&crate::util::error_chain(&e)))?;
        c.replica_expand(spdkrpc::ReplicaExpandRequest {
            name: replica.to_owned(),
            size,
        })
        .await
        .map(|_| ())
        .map_err(|s| peer(&format!("its node: {}", s.message())))
    }

    /// Grows every replica of engine `e`, waits until the raid1 (its smallest
    /// member) has grown, and records the engine's size.
    async fn engine_expand(&self, e: &Typed<LonghornEngine>, size: u64) -> Result<(), LonghornError> {
        let what = format!("expanding engine {} to {size} bytes", e.id());
        if size < e.spec.size_bytes {
            return Err(LonghornError::Refused(format!(
                "{what}: it is {} bytes and can only grow",
                e.spec.size_bytes
            )));
        }
        if self
            .status_of(e.id())
            .is_none_or(|s| s.state != InstanceState::Running)
        {
            return Err(LonghornError::Refused(format!(
                "{what}: the engine is not running"
            )));
        }
        for (replica, address) in &e.spec.replica_address_map {
            let local = self
                .state()
                .get_typed::<LonghornReplica>(replica)
                .map_err(LonghornError::Store)?;
            let grown = match local {
                Some(t) => self.expand_local(replica, &t, size).await,
                // a Peer error: UNAVAILABLE, naming the replica
                None => self.expand_remote(replica, address, size).await,
            };
            grown.map_err(|x| LonghornError::within(&what, x))?;
        }
        // a remote member grows when its namespace does (SPDK's AEN); the
        // raid1 follows its smallest member
        let bdev = self.status_of(e.id()).map(|s| s.bdev).unwrap_or_default();
        let deadline = Instant::now() + REMOTE_TIMEOUT;
        loop {
            let now = self
                .client()
                .bdev(&bdev)
                .await
                .ok()
                .flatten()
                .map(|b| b.size_bytes());
            if now.is_some_and(|n| n >= size) {
                break;
            }
            if Instant::now() > deadline {
                return Err(LonghornError::Timeout(format!(
                    "{what}: every replica grew, but {bdev} is still {} bytes",
                    now.unwrap_or(0)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut spec = e.spec.clone();
        spec.size_bytes = size;
        self.state()
            .update_typed(e.id(), "", None, &spec)
            .map_err(LonghornError::Store)?;
        Ok(())
    }

    /// A replica of this node asked for by another node: its name checked,
    /// its desired state read.
    pub(super) fn stored_replica(
        &self,
        name: &str,
    ) -> Result<(ObjectName, Typed<LonghornReplica>), LonghornError> {
        let replica =
            naming::instance_name("replica", name).map_err(|x| LonghornError::Invalid(x.to_string()))?;
        let t = self
            .state()
            .get_typed::<LonghornReplica>(replica.as_str())
            .map_err(LonghornError::Store)?
            .ok_or_else(|| LonghornError::not_found("replica", replica.as_str()))?;
        Ok((replica, t))
    }

    /// `ReplicaExpand` from another node's engine.
    pub(super) async fn replica_expand(
        &self,
        req: spdkrpc::ReplicaExpandRequest,
    ) -> Result<(), LonghornError> {
        let (replica, t) = self.stored_replica(&req.name)?;
        self.expand_local(replica.as_str(), &t, req.size).await
    }

    // ----- 8504: another node's engine snapshots a replica of this node

    /// `ReplicaSnapshotCreate`: snapshot of a replica of this node.
    pub(super) async fn replica_snapshot_create(
        &self,
        req: spdkrpc::SnapshotRequest,
        copy: bool,
    ) -> Result<spdkrpc::Replica, LonghornError> {
        naming::replica_snapshot_name(&req.snapshot_name)
            .map_err(|x| LonghornError::Invalid(x.to_string()))?;
        let (replica, t) = self.stored_replica(&req.name)?;
        let lvol = snapshot_lvol(replica.as_str(), &req.snapshot_name);
        if lvol.len() > LVOL_NAME_MAX {
            return Err(LonghornError::Invalid(format!(
                "replica {replica}: lvol name {lvol} is longer than SPDK's {LVOL_NAME_MAX} characters"
            )));
        }
        self.snapshot_local(replica.as_str(), &t.spec, &lvol).await?;
        // its time and labels as the engine gave them, kept with the replica;
        // a rebuild's copy of a snapshot (`copy`) without them keeps none
        // (now is not when it was taken: another replica's record is asked)
        if copy && req.snapshot_timestamp.is_empty() {
            return self.replica_message(&t);
        }
        let created = if req.snapshot_timestamp.is_empty() {
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
        } else {
            req.snapshot_timestamp.clone()
        };
        let info = SnapshotInfo {
            created,
            labels: req.labels.clone().into_iter().collect(),
        };
        self.replica_snapshot_info(replica.as_str(), |m| {
            m.entry(req.snapshot_name.clone()).or_insert_with(|| info.clone());
        })?;
        self.replica_message(&t)
    }

    /// Changes the snapshot times and labels kept with this node's replica
    /// `replica` ([`LonghornReplica::snapshot_info`]); a replica not here is
    /// left alone.
    pub(super) fn replica_snapshot_info(
        &self,
        replica: &str,
        mut f: impl FnMut(&mut std::collections::BTreeMap<String, SnapshotInfo>),
    ) -> Result<(), LonghornError> {
        loop {
            let Some(now) = self
                .state()
                .get_typed::<LonghornReplica>(replica)
                .map_err(LonghornError::Store)?
            else {
                return Ok(());
            };
            let mut spec = now.spec.clone();
            f(&mut spec.snapshot_info);
            if spec == now.spec {
                return Ok(());
            }
            match self
                .state()
                .update_typed(replica, "", Some(now.metadata.version), &spec)
            {
                Ok(_) => return Ok(()),
                Err(crate::runtime::StateError::Conflict { .. }) => continue,
                Err(crate::runtime::StateError::NotFound { .. }) => return Ok(()),
                Err(x) => return Err(LonghornError::Store(x)),
            }
        }
    }

    /// `ReplicaSnapshotDelete`; a snapshot that is not there is no error.
    pub(super) async fn replica_snapshot_delete(
        &self,
        req: spdkrpc::SnapshotRequest,
    ) -> Result<(), LonghornError> {
        naming::replica_snapshot_name(&req.snapshot_name)
            .map_err(|x| LonghornError::Invalid(x.to_string()))?;
        let (replica, t) = self.stored_replica(&req.name)?;
        self.ops()
            .delete_replica_snapshot(&lvstore(&t.spec.disk), replica.as_str(), &req.snapshot_name)
            .await
            .map_err(|e| match e {
                SnapshotDeleteError::Shared { .. } => {
                    LonghornError::Refused(format!("replica {replica}: {}", crate::util::error_chain(&e)))
                }
                SnapshotDeleteError::Spdk { lvol, source } => {
                    LonghornError::spdk(format!("replica {replica}: deleting {lvol}"), source)
                }
            })?;
        self.replica_snapshot_info(replica.as_str(), |m| {
            m.remove(&req.snapshot_name);
        })
    }
}

/// The cluster size of lvstore `lvs`.
fn cluster_size(inv: &Inventory, lvs: &str) -> Option<u64> {
    inv.lvstores
        .iter()
        .find(|s| s.name == lvs)
        .map(|s| s.cluster_size)
}

fn disk_info(
    name: &str,
    bytes: u64,
    parent: &str,
    children: &[&str],
    removed: bool,
) -> imrpc::EngineSnapshotDiskInfo {
    imrpc::EngineSnapshotDiskInfo {
        name: name.to_owned(),
        parent: parent.to_owned(),
        children: children.iter().map(|c| ((*c).to_owned(), true)).collect(),
        removed,
        user_created: name != VOLUME_HEAD,
        // SPDK v26.05 keeps no creation time an RPC reports: the engine's
        // snapshot_info has it for the snapshots taken through it
        created: String::new(),
        size: bytes.to_string(),
        labels: HashMap::new(),
    }
}

/// Forwards the call to the engine node's proxy when the engine is not on
/// this node but its engine-frontend is (see `engine_ops::forward_target`);
/// otherwise evaluates to the request.
macro_rules! forward {
    ($self:ident, $req:ident, $p:expr, $method:ident) => {{
        let forwarded = $req.metadata().contains_key(FORWARDED);
        let target = $self.forward_target(forwarded, $p).await?;
        if let Some(mut c) = target {
            let mut r = Request::new($req.into_inner());
            r.metadata_mut()
                .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
            return c.$method(r).await;
        }
        $req
    }};
}

#[tonic::async_trait]
impl proxy_engine_service_server::ProxyEngineService for Longhorn {
    async fn cleanup_backup_mount_points(&self, _: Request<()>) -> Result<Response<()>, Status> {
        // longhorn-manager's backup-target controller calls this while the backup target
        // URL is empty. talon's daemon keeps its NFS mounts: a backup or restore of
        // talon's own may be using one, and an unmount under it would send its writes
        // to the folder beneath. `longhorn backup cleanup-all-mounts` (the engine
        // binary's call, in the manager's pod) unmounts what that binary mounted.
        Ok(Response::new(()))
    }

    async fn server_version_get(
        &self,
        _: Request<imrpc::ProxyEngineRequest>,
    ) -> Result<Response<imrpc::EngineVersionProxyResponse>, Status> {
        // a V1 engine's controller call: talon has no V1 Longhorn engine
        Err(Status::unimplemented(
            "/imrpc.ProxyEngineService/ServerVersionGet is not implemented by talon's Longhorn instance manager \
             (it asks a V1 engine's controller; talon serves V2 engines)",
        ))
    }

    async fn volume_get(
        &self,
        req: Request<imrpc::ProxyEngineRequest>,
    ) -> Result<Response<imrpc::EngineVolumeGetProxyResponse>, Status> {
        let forwarded = req.metadata().contains_key(FORWARDED);
        if let Some(mut c) = self.forward_target(forwarded, Some(req.get_ref())).await? {
            // the engine answers from its node; the endpoint is this node's
            // engine-frontend's device
            let p = req.into_inner();
            let mut r = Request::new(p.clone());
            r.metadata_mut()
                .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
            let mut resp = c.volume_get(r).await?.into_inner();
            if let (Some(v), Some(f)) = (
                resp.volume.as_mut(),
                self.frontend_for(&p.engine_name, &p.engine_frontend_name),
            ) {
                v.endpoint = self.status_of(f.id()).map(|s| s.endpoint).unwrap_or_default();
            }
            return Ok(Response::new(resp));
        }
        let req = req.into_inner();
        let e = self.engine(&req.engine_name)?;
        let st = self.status_of(e.id());
        let running = st.as_ref().is_some_and(|s| s.state == InstanceState::Running);
        // the frontend is up when the engine runs and, with an engine-frontend,
        // when that runs too (an engine-frontend in error is no frontend)
        let (endpoint, frontend_up) = match self.frontend_of(e.id(), &req.engine_frontend_name) {
            Some(f) => match self.status_of(f.id()) {
                Some(s) if s.state == InstanceState::Running => (s.endpoint, running),
                _ => (String::new(), false),
            },
            None if e.spec.frontend == "spdk-tcp-nvmf" && running => (
                st.as_ref()
                    .map(|s| naming::nvmf_endpoint(&s.endpoint, &s.nqn))
                    .unwrap_or_default(),
                true,
            ),
            None => (String::new(), running),
        };
        tracing::debug!(
            engine = %e.id(),
            engine_frontend = %req.engine_frontend_name,
            size = e.spec.size_bytes,
            %endpoint,
            frontend_up,
            "VolumeGet answered"
        );
        Ok(Response::new(imrpc::EngineVolumeGetProxyResponse {
            volume: Some(ptypes::Volume {
                name: e.spec.volume.clone(),
                size: i64::try_from(e.spec.size_bytes).unwrap_or(i64::MAX),
                replica_count: i32::try_from(e.spec.replica_address_map.len()).unwrap_or(i32::MAX),
                endpoint,
                frontend: e.spec.frontend.clone(),
                frontend_state: if frontend_up { "up" } else { "down" }.to_owned(),
                is_expanding: false,
                last_expansion_error: String::new(),
                last_expansion_failed_at: String::new(),
                unmap_mark_snap_chain_removed: false,
                snapshot_max_count: e.spec.snapshot_max_count,
                snapshot_max_size: 0,
            }),
        }))
    }

    async fn volume_expand(
        &self,
        req: Request<imrpc::EngineVolumeExpandRequest>,
    ) -> Result<Response<()>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            volume_expand
        );
        let req = req.into_inner();
        let p = proxy_req(req.proxy_engine_request)?;
        let e = self.engine(&p.engine_name)?;
        let size = req
            .expand
            .map(|x| x.size)
            .filter(|s| *s > 0)
            .ok_or_else(|| Status::invalid_argument(format!("expanding engine {}: no size", e.id())))?;
        self.engine_expand(&e, u64::try_from(size).unwrap_or(0)).await?;
        Ok(Response::new(()))
    }

    async fn replica_list(
        &self,
        req: Request<imrpc::ProxyEngineRequest>,
    ) -> Result<Response<imrpc::EngineReplicaListProxyResponse>, Status> {
        let req = forward!(self, req, Some(req.get_ref()), replica_list);
        let e = self.engine(&req.into_inner().engine_name)?;
        let replicas = self
            .members_polled(&e)
            .await?
            .into_iter()
            .map(|m| ptypes::ControllerReplica {
                address: Some(ptypes::ReplicaAddress {
                    address: tcp(&m.address),
                    instance_name: m.replica,
                }),
                mode: m.mode as i32,
            })
            .collect();
        Ok(Response::new(imrpc::EngineReplicaListProxyResponse {
            replica_list: Some(ptypes::ReplicaListReply { replicas }),
        }))
    }

    async fn replica_rebuilding_status(
        &self,
        req: Request<imrpc::ProxyEngineRequest>,
    ) -> Result<Response<imrpc::EngineReplicaRebuildStatusProxyResponse>, Status> {
        let req = forward!(self, req, Some(req.get_ref()), replica_rebuilding_status);
        let e = self.engine(&req.into_inner().engine_name)?;
        let members = self.members_polled(&e).await?;
        let in_service: Vec<String> = members
            .iter()
            .filter(|m| m.mode == ptypes::ReplicaMode::Rw)
            .map(|m| tcp(&m.address))
            .collect();
        let status = self.status_of(e.id()).unwrap_or_else(|| {
            LonghornInstanceStatus::new(InstanceKind::Engine, InstanceState::Starting, "")
        });
        let status = members
            .into_iter()
            .filter_map(|m| rebuild_status(&e.spec, &status, &in_service, &m).map(|r| (tcp(&m.address), r)))
            .collect();
        Ok(Response::new(imrpc::EngineReplicaRebuildStatusProxyResponse {
            status,
        }))
    }

    async fn snapshot_list(
        &self,
        req: Request<imrpc::ProxyEngineRequest>,
    ) -> Result<Response<imrpc::EngineSnapshotListProxyResponse>, Status> {
        let req = forward!(self, req, Some(req.get_ref()), snapshot_list);
        let e = self.engine(&req.into_inner().engine_name)?;
        let mut disks = HashMap::new();
        // from the polls' shared listing: a snapshot made or deleted since (by the controller,
        // whose client shares the session's count of changes) makes a new one
        let view = self.engine_lvols_from(&e, true).await?.unwrap_or_default();
        // rebuild snapshots are talon's, for the moment of a rebuild: not
        // listed, their children shown on their parents
        let shown = |mut p: Option<String>| {
            while let Some(x) = p.as_ref().filter(|x| is_rebuild_snap(x)) {
                p = view.snapshots.get(x).and_then(|(pp, _)| pp.clone());
            }
            p.unwrap_or_default()
        };
        let head_parent = shown(view.head_parent.clone());
        // the time and labels of a snapshot this engine did not take (it was
        // made later, on another node: Longhorn moved the engine) as its
        // replicas keep them
        let unknown: Vec<&String> = view
            .snapshots
            .keys()
            .filter(|s| !is_rebuild_snap(s) && !e.spec.snapshot_info.contains_key(*s))
            .collect();
        let kept = if unknown.is_empty() {
            Default::default()
        } else {
            self.replicas_snapshot_info(&e, &unknown).await
        };
        for (s, (p, bytes)) in view.snapshots.iter().filter(|(s, _)| !is_rebuild_snap(s)) {
            let mut children: Vec<&str> = view
                .snapshots
                .iter()
                .filter(|(c, (cp, _))| !is_rebuild_snap(c) && shown(cp.clone()) == *s)
                .map(|(c, _)| c.as_str())
                .collect();
            if head_parent == *s {
                children.push(VOLUME_HEAD);
            }
            let mut d = disk_info(
                s,
                *bytes,
                &shown(p.clone()),
                &children,
                e.spec.removed_snapshots.contains(s),
            );
            if let Some(i) = e.spec.snapshot_info.get(s).or_else(|| kept.get(s)) {
                d.created = i.created.clone();
                d.labels = i.labels.clone().into_iter().collect();
            }
            disks.insert(s.clone(), d);
        }
        disks.insert(
            VOLUME_HEAD.to_owned(),
            disk_info(VOLUME_HEAD, view.head_bytes, &head_parent, &[], false),
        );
        Ok(Response::new(imrpc::EngineSnapshotListProxyResponse { disks }))
    }

    async fn volume_snapshot(
        &self,
        req: Request<imrpc::EngineVolumeSnapshotRequest>,
    ) -> Result<Response<imrpc::EngineVolumeSnapshotProxyResponse>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            volume_snapshot
        );
        let req = req.into_inner();
        let p = proxy_req(req.proxy_engine_request)?;
        let e = self.engine(&p.engine_name)?;
        let (name, labels) = req
            .snapshot_volume
            .map(|s| (s.name, s.labels))
            .unwrap_or_default();
        let name = if name.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            name
        };
        self.check_snapshot_count(&e).await?;
        let info = SnapshotInfo {
            created: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            labels: labels.into_iter().collect(),
        };
        // in a task of its own: a caller that goes away (its deadline, a reset
        // stream) drops this handler, never the request's answer and record
        let (lh, engine, snap) = (self.clone(), e.clone(), name.clone());
        tokio::spawn(async move { lh.engine_snapshot(&engine, &snap, info).await })
            .await
            .map_err(|x| Status::internal(format!("snapshot {name} of engine {}: {x}", e.id())))??;
        Ok(Response::new(imrpc::EngineVolumeSnapshotProxyResponse {
            snapshot: Some(ptypes::VolumeSnapshotReply { name }),
        }))
    }

    async fn snapshot_remove(
        &self,
        req: Request<imrpc::EngineSnapshotRemoveRequest>,
    ) -> Result<Response<()>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            snapshot_remove
        );
        let req = req.into_inner();
        let p = proxy_req(req.proxy_engine_request)?;
        let e = self.engine(&p.engine_name)?;
        for snap in &req.names {
            // the spec as it is now (a removal may mark a snapshot removed)
            let e = self.engine(e.id())?;
            self.remove_snapshot(&e, snap).await?;
        }
        Ok(Response::new(()))
    }

    async fn snapshot_hash(
        &self,
        req: Request<imrpc::EngineSnapshotHashRequest>,
    ) -> Result<Response<()>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            snapshot_hash
        );
        let req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request)?.engine_name)?;
        self.engine_hash(&e, &req.snapshot_name, req.rehash).await?;
        Ok(Response::new(()))
    }

    async fn snapshot_hash_status(
        &self,
        req: Request<imrpc::EngineSnapshotHashStatusRequest>,
    ) -> Result<Response<imrpc::EngineSnapshotHashStatusProxyResponse>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            snapshot_hash_status
        );
        let req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request)?.engine_name)?;
        Ok(Response::new(imrpc::EngineSnapshotHashStatusProxyResponse {
            status: self.engine_hash_status(&e, &req.snapshot_name).await?,
        }))
    }

    async fn snapshot_purge_status(
        &self,
        req: Request<imrpc::ProxyEngineRequest>,
    ) -> Result<Response<imrpc::EngineSnapshotPurgeStatusProxyResponse>, Status> {
        let req = forward!(self, req, Some(req.get_ref()), snapshot_purge_status);
        // the last purge the controller carried out, or the one asked for
        let e = self.engine(&req.into_inner().engine_name)?;
        Ok(Response::new(imrpc::EngineSnapshotPurgeStatusProxyResponse {
            status: self.purge_status(&e),
        }))
    }

    async fn snapshot_clone_status(
        &self,
        req: Request<imrpc::ProxyEngineRequest>,
    ) -> Result<Response<imrpc::EngineSnapshotCloneStatusProxyResponse>, Status> {
        let req = forward!(self, req, Some(req.get_ref()), snapshot_clone_status);
        let e = self.engine(&req.into_inner().engine_name)?;
        Ok(Response::new(imrpc::EngineSnapshotCloneStatusProxyResponse {
            status: self.engine_clone_status(&e).await?,
        }))
    }

    async fn snapshot_clone(
        &self,
        req: Request<imrpc::EngineSnapshotCloneRequest>,
    ) -> Result<Response<()>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            snapshot_clone
        );
        let req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request.clone())?.engine_name)?;
        self.engine_clone(&e, &req).await?;
        Ok(Response::new(()))
    }

    async fn snapshot_backup(
        &self,
        req: Request<imrpc::EngineSnapshotBackupRequest>,
    ) -> Result<Response<imrpc::EngineSnapshotBackupProxyResponse>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            snapshot_backup
        );
        let mut req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request.take())?.engine_name)?;
        Ok(Response::new(self.engine_backup(&e, req).await?))
    }

    async fn snapshot_backup_status(
        &self,
        req: Request<imrpc::EngineSnapshotBackupStatusRequest>,
    ) -> Result<Response<imrpc::EngineSnapshotBackupStatusProxyResponse>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            snapshot_backup_status
        );
        let req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request)?.engine_name)?;
        Ok(Response::new(
            self.engine_backup_status(&e, &req.backup_name, &req.replica_address)
                .await?,
        ))
    }

    async fn backup_restore_status(
        &self,
        req: Request<imrpc::ProxyEngineRequest>,
    ) -> Result<Response<imrpc::EngineBackupRestoreStatusProxyResponse>, Status> {
        let req = forward!(self, req, Some(req.get_ref()), backup_restore_status);
        let e = self.engine(&req.into_inner().engine_name)?;
        Ok(Response::new(self.engine_restore_status(&e).await?))
    }

    async fn backup_restore(
        &self,
        req: Request<imrpc::EngineBackupRestoreRequest>,
    ) -> Result<Response<imrpc::EngineBackupRestoreProxyResponse>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            backup_restore
        );
        let req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request.clone())?.engine_name)?;
        Ok(Response::new(self.engine_backup_restore(&e, req).await?))
    }

    async fn volume_snapshot_max_count_set(
        &self,
        req: Request<imrpc::EngineVolumeSnapshotMaxCountSetRequest>,
    ) -> Result<Response<()>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            volume_snapshot_max_count_set
        );
        let req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request)?.engine_name)?;
        self.snapshot_max_count_set(&e, req.count.map_or(0, |c| c.count))?;
        Ok(Response::new(()))
    }

    async fn snapshot_revert(
        &self,
        req: Request<imrpc::EngineSnapshotRevertRequest>,
    ) -> Result<Response<()>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            snapshot_revert
        );
        let req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request)?.engine_name)?;
        self.revert(&e, &req.name).await?;
        Ok(Response::new(()))
    }

    async fn snapshot_purge(
        &self,
        req: Request<imrpc::EngineSnapshotPurgeRequest>,
    ) -> Result<Response<()>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            snapshot_purge
        );
        let req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request)?.engine_name)?;
        self.purge(&e).await?;
        Ok(Response::new(()))
    }

    async fn replica_add(
        &self,
        req: Request<imrpc::EngineReplicaAddRequest>,
    ) -> Result<Response<()>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            replica_add
        );
        let req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request)?.engine_name)?;
        if req.restore {
            return Err(Status::unimplemented(format!(
                "engine {}: restore replicas (backups) are not served by talon",
                e.id()
            )));
        }
        let beside = req
            .linked_clone_source
            .as_ref()
            .filter(|l| !l.replica_name.is_empty());
        self.replica_add(&e, &req.replica_name, &req.replica_address, beside)
            .await?;
        Ok(Response::new(()))
    }

    async fn replica_rebuilding_qos_set(
        &self,
        req: Request<imrpc::EngineReplicaRebuildingQosSetRequest>,
    ) -> Result<Response<()>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            replica_rebuilding_qos_set
        );
        let req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request)?.engine_name)?;
        self.rebuild_qos_set(&e, req.qos_limit_mbps).await?;
        Ok(Response::new(()))
    }

    async fn replica_remove(
        &self,
        req: Request<imrpc::EngineReplicaRemoveRequest>,
    ) -> Result<Response<()>, Status> {
        let req = forward!(
            self,
            req,
            req.get_ref().proxy_engine_request.as_ref(),
            replica_remove
        );
        let req = req.into_inner();
        let e = self.engine(&proxy_req(req.proxy_engine_request)?.engine_name)?;
        self.replica_remove(&e, &req.replica_name, &req.replica_address)
            .await?;
        Ok(Response::new(()))
    }

    async fn replica_mode_update(
        &self,
        req: Request<imrpc::EngineReplicaModeUpdateRequest>,
    ) -> Result<Response<()>, Status> {
        // longhorn-manager names the engine by its address alone here (its
        // proxy client fills no engine name: a V1 engine's controller is at
        // that address), and asks the engine's own node
        let req = req.into_inner();
        let pr = proxy_req(req.proxy_engine_request)?;
        let e = match pr.engine_name.as_str() {
            "" => self.engine_at(&pr.address)?,
            name => self.engine(name)?,
        };
        let mode = ptypes::ReplicaMode::try_from(req.mode).map_err(|_| {
            LonghornError::Invalid(format!(
                "engine {}: replica mode {} is not one Longhorn sends",
                e.id(),
                req.mode
            ))
        })?;
        self.replica_mode_update(&e, &req.replica_address, mode).await?;
        Ok(Response::new(()))
    }

    async fn metrics_get(
        &self,
        req: Request<imrpc::ProxyEngineRequest>,
    ) -> Result<Response<imrpc::EngineMetricsGetProxyResponse>, Status> {
        let req = forward!(self, req, Some(req.get_ref()), metrics_get);
        let e = self.engine(&req.into_inner().engine_name)?;
        let bdev = self.status_of(e.id()).map(|s| s.bdev).unwrap_or_default();
        if bdev.is_empty() {
            return Ok(Response::new(imrpc::EngineMetricsGetProxyResponse {
                metrics: Some(ptypes::Metrics::default()),
            }));
        }
        let v: serde_json::Value = self
            .client()
            .typed("bdev_get_iostat", &serde_json::json!({"names": [bdev]}))
            .await
            .map_err(|x| internal(&format!("engine {}: iostat of {bdev}", e.id()), chain(&x)))?;
        let tick_rate = v["tick_rate"].as_u64().unwrap_or(0);
        let b = &v["bdevs"][0];
        let now = IoSample {
            at: Instant::now(),
            bytes_read: b["bytes_read"].as_u64().unwrap_or(0),
            bytes_written: b["bytes_written"].as_u64().unwrap_or(0),
            reads: b["num_read_ops"].as_u64().unwrap_or(0),
            writes: b["num_write_ops"].as_u64().unwrap_or(0),
            read_ticks: b["read_latency_ticks"].as_u64().unwrap_or(0),
            write_ticks: b["write_latency_ticks"].as_u64().unwrap_or(0),
        };
        let before = self.swap_io_sample(e.id(), now);
        Ok(Response::new(imrpc::EngineMetricsGetProxyResponse {
            metrics: Some(rates(before, now, tick_rate)),
        }))
    }
}

/// Rates between two iostat samples (per second; latency in ns per I/O);
/// zeros without an earlier sample or after a counter reset (a restarted
/// target).
fn rates(before: Option<IoSample>, now: IoSample, tick_rate: u64) -> ptypes::Metrics {
    let Some(b) = before else {
        return ptypes::Metrics::default();
    };
    let secs = now.at.duration_since(b.at).as_secs_f64();
    if secs <= 0.0 || now.reads < b.reads || now.writes < b.writes {
        return ptypes::Metrics::default();
    }
    let per_sec = |d: u64| (d as f64 / secs) as u64;
    let latency = |ticks: u64, ops: u64| {
        if ops == 0 || tick_rate == 0 {
            0
        } else {
            (ticks as f64 / ops as f64 / tick_rate as f64 * 1e9) as u64
        }
    };
    let (reads, writes) = (now.reads - b.reads, now.writes - b.writes);
    ptypes::Metrics {
        read_throughput: per_sec(now.bytes_read.saturating_sub(b.bytes_read)),
        write_throughput: per_sec(now.bytes_written.saturating_sub(b.bytes_written)),
        read_latency: latency(now.read_ticks.saturating_sub(b.read_ticks), reads),
        write_latency: latency(now.write_ticks.saturating_sub(b.write_ticks), writes),
        read_iops: per_sec(reads),
        write_iops: per_sec(writes),
    }
}

/// What `ReplicaRebuildingStatus` reports for member `m` of engine `e`
/// (`None`: nothing, it was never rebuilt or its rebuild was not asked for
/// now), as Longhorn's V2 engine reports a rebuild's dest
/// (longhorn-spdk-engine `RebuildingDstShallowCopyCheck`): `in_progress`
/// with the percent copied, never less than reported before for that
/// rebuild; `error` with the reason; `complete` with 100 once the replica
/// joined (until the next `ReplicaAdd` of it). The source is the replica the
/// rebuild copies from, `tcp://ip:port`, in `from_replica_address_list` (what
/// longhorn-manager reads) and in the deprecated `from_replica_address`; a
/// rebuild by SPDK's raid (no thin source) names the replicas in service.
pub(super) fn rebuild_status(
    e: &LonghornEngine,
    st: &LonghornInstanceStatus,
    in_service: &[String],
    m: &Member,
) -> Option<ptypes::ReplicaRebuildStatusResponse> {
    let request = e.rebuild_requests.get(&m.replica);
    let (is_rebuilding, progress, error, state) = match (m.progress, st.rebuild_errors.get(&m.replica)) {
        (Some(p), _) => (true, p.min(99), String::new(), "in_progress"),
        (None, Some(x)) if m.mode == ptypes::ReplicaMode::Err => (false, 0, x.clone(), "error"),
        // RW in the raid is done: the controller records the rebuild as done
        // only when its reconcile ends, a moment after the raid took the member
        (None, None)
            if m.mode == ptypes::ReplicaMode::Rw
                && request.is_some()
                && (st.rebuilds_done.get(&m.replica) == request
                    || st.rebuilds_started.get(&m.replica) == request) =>
        {
            (false, 100, String::new(), "complete")
        }
        _ => return None,
    };
    let from: Vec<String> = match st
        .rebuild_sources
        .get(&m.replica)
        .and_then(|src| e.replica_address_map.get(src))
    {
        Some(address) => vec![tcp(address)],
        None => in_service
            .iter()
            .filter(|a| **a != tcp(&m.address))
            .cloned()
            .collect(),
    };
    Some(ptypes::ReplicaRebuildStatusResponse {
        is_rebuilding,
        error,
        progress: i32::try_from(progress).unwrap_or(100),
        state: state.into(),
        from_replica_address: from.first().cloned().unwrap_or_default(),
        from_replica_address_list: from,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, ops: u64) -> IoSample {
        IoSample {
            at,
            bytes_read: ops * 4096,
            bytes_written: ops * 8192,
            reads: ops,
            writes: ops,
            read_ticks: ops * 1000,
            write_ticks: ops * 2000,
        }
    }

    #[test]
    fn metrics_are_rates_between_two_samples() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(
            rates(None, sample(t1, 10), 1_000_000_000),
            ptypes::Metrics::default()
        );
        let m = rates(Some(sample(t0, 100)), sample(t1, 300), 1_000_000_000);
        assert_eq!((m.read_iops, m.write_iops), (100, 100));
        assert_eq!((m.read_throughput, m.write_throughput), (409_600, 819_200));
        // 1000 ticks per read at 1 GHz: 1 µs
        assert_eq!((m.read_latency, m.write_latency), (1000, 2000));
        // counters went back (a restarted target): no rates
        assert_eq!(
            rates(Some(sample(t0, 300)), sample(t1, 100), 1_000_000_000),
            ptypes::Metrics::default()
        );
    }

    #[test]
    fn snapshot_lvols_are_named_as_longhorn_names_them() {
        assert_eq!(snapshot_lvol("r-1", "s1"), "r-1-snap-s1");
    }

    /// The raid takes the rebuilt member during a reconcile; the controller
    /// records the rebuild done when that reconcile ends. In between, the
    /// member is RW and its rebuild complete, never unreported.
    #[test]
    fn a_member_rw_after_its_started_rebuild_is_complete_before_the_status_says_done() {
        let e = LonghornEngine {
            volume: "v".into(),
            size_bytes: 1 << 20,
            replica_address_map: [
                ("ra".to_string(), "127.0.0.1:20001".to_string()),
                ("rb".to_string(), "127.0.0.2:20001".to_string()),
            ]
            .into(),
            port: 20000,
            frontend: String::new(),
            snapshot_max_count: 0,
            rebuild_qos_mbps: 0,
            rebuild_requests: [("rb".to_string(), 3)].into(),
            rebuild_links: Default::default(),
            rebuild_link_engines: Default::default(),
            removed_snapshots: Default::default(),
            failed_replicas: Default::default(),
            purge_request: 0,
            revert: None,
            snapshot_requests: Default::default(),
            snapshot_info: Default::default(),
            ana_state: Default::default(),
        };
        let member = |mode| Member {
            replica: "rb".into(),
            address: "127.0.0.2:20001".into(),
            mode,
            progress: None,
        };
        let in_service = vec!["tcp://127.0.0.1:20001".to_string()];
        let mut st = LonghornInstanceStatus::new(InstanceKind::Engine, InstanceState::Running, "");
        // asked, not started yet: not reported
        assert_eq!(
            rebuild_status(&e, &st, &in_service, &member(ptypes::ReplicaMode::Rw)),
            None
        );
        st.rebuilds_started.insert("rb".into(), 3);
        let done = rebuild_status(&e, &st, &in_service, &member(ptypes::ReplicaMode::Rw)).expect("reported");
        assert_eq!(
            (done.state.as_str(), done.progress, done.is_rebuilding),
            ("complete", 100, false)
        );
        assert_eq!(done.from_replica_address, "tcp://127.0.0.1:20001");
        // started, out of the raid: not complete
        assert_eq!(
            rebuild_status(&e, &st, &in_service, &member(ptypes::ReplicaMode::Err)),
            None
        );
        // a started rebuild that failed is never complete
        st.rebuild_errors.insert("rb".into(), "copy failed".into());
        assert_eq!(
            rebuild_status(&e, &st, &in_service, &member(ptypes::ReplicaMode::Rw)),
            None
        );
        let failed = rebuild_status(&e, &st, &in_service, &member(ptypes::ReplicaMode::Err)).expect("error");
        assert_eq!(
            (failed.state.as_str(), failed.error.as_str()),
            ("error", "copy failed")
        );
    }
}
