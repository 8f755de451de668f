//! The clone calls ([`super::clone`] has the picture and the jobs): the engine
//! proxy's `SnapshotClone` and `SnapshotCloneStatus`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::clone::{Job, Outcome, lock};
use super::error::LonghornError;
use super::proxy::REMOTE_TIMEOUT;
use super::service::Longhorn;
use super::snaphash::{COMPLETE, ERROR, IN_PROGRESS};
use crate::names::ObjectName;
use crate::proto::peer::{EngineAskError, PeerChannels, PeerError};
use crate::proto::{imrpc, ptypes, spdkrpc};
use crate::resources::longhorn::{LonghornCloneLedger, LonghornEngine, LonghornReplica, snapshot_lvol};
use crate::runtime::{Spec as _, State, StateError, Typed};
use crate::spdk::naming::longhorn::{self as naming, tcp};
use crate::spdk::volume::mover;
use crate::spdk::volume::naming::lvstore;
use crate::spdk::volume::{Export, ExportSpec, Inventory, NewSubsystem};

/// How often a clone from another node's replica is tried before it fails:
/// a restart of that node's talon mid-copy removes its exposure (found by
/// name when it starts again), and the next try exposes it again.
const REMOTE_TRIES: u32 = 3;
/// How long a clone waits before it tries another node's replica again.
const REMOTE_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Where a clone writes: engine bdev `bdev`, through its export when it has one.
#[derive(Debug)]
struct Target {
    bdev: String,
    export: Option<(crate::names::Nqn, std::net::SocketAddr)>,
}

/// Where one replica of a linked clone is linked.
#[derive(Debug)]
enum LinkAt {
    /// On this node.
    Here(LinkPair),
    /// By the node of replica `dst` (at `address`).
    Peer {
        dst: String,
        src: String,
        address: String,
    },
}
/// Why a linked clone is not made (the snapshot's data is then copied
/// through the engine).
#[derive(Debug, thiserror::Error)]
enum NotLinked {
    /// No `DstReplicaSrcReplicaPairMap`.
    #[error("the manager sent no replica pairs")]
    NoPairs,
    /// A replica of the engine has no pair.
    #[error("replica {0} has no source replica in the pair map")]
    NoSource(String),
    /// A pair on this node cannot be linked.
    #[error(transparent)]
    Pair(LonghornError),
    /// Links that failed, by replica.
    #[error("{}", failed_pairs(.0))]
    Failed(Vec<(String, LonghornError)>),
}

fn failed_pairs(failed: &[(String, LonghornError)]) -> String {
    let each: Vec<String> = failed.iter().map(|(r, x)| format!("replica {r}: {x}")).collect();
    each.join("; ")
}

impl LinkAt {
    fn dst(&self) -> &str {
        match self {
            Self::Here(p) => &p.dst,
            Self::Peer { dst, .. } => dst,
        }
    }

    fn src(&self) -> &str {
        match self {
            Self::Here(p) => &p.src,
            Self::Peer { src, .. } => src,
        }
    }
}

/// One replica of a linked clone and what it is linked to.
#[derive(Debug)]
struct LinkPair {
    /// The clone's replica.
    dst: String,
    /// Its source replica.
    src: String,
    /// The clone replica's head (alias).
    head: String,
    /// The source's snapshot (alias).
    snapshot: String,
    /// The entrypoint's name.
    entrypoint: String,
}

/// A source snapshot: on this node (`alias`, the lvol's), or held by
/// `replica` of another node (`alias` empty) and exposed by it for the copy.
#[derive(Debug, Clone)]
struct Source {
    replica: String,
    alias: String,
    /// The replica's address (`ip:port`).
    address: String,
    /// The snapshot's size (bytes).
    size: u64,
}

impl Source {
    fn remote(&self) -> bool {
        self.alias.is_empty()
    }

    /// Longhorn's words for where it was read (`LonghornCloneLedger::how`).
    fn how(&self) -> String {
        if self.remote() {
            format!("remote {}", self.replica)
        } else {
            "local".to_owned()
        }
    }
}

impl Longhorn {
    /// The replica of volume `volume` on this node that holds snapshot `snap`.
    fn clone_source(&self, inv: &Inventory, volume: &str, snap: &str) -> Result<Source, LonghornError> {
        let mut replicas: Vec<Typed<LonghornReplica>> = self
            .state()
            .list_typed::<LonghornReplica>()
            .map_err(LonghornError::Store)?
            .into_iter()
            .filter(|r| r.spec.volume == volume)
            .collect();
        replicas.sort_by(|a, b| a.id().cmp(b.id()));
        replicas
            .iter()
            .find_map(|r| {
                let alias = format!("{}/{}", lvstore(&r.spec.disk), snapshot_lvol(r.id(), snap));
                let lvol = inv.lvols.get(&alias)?;
                let size = inv
                    .bdevs
                    .get(&lvol.uuid)
                    .map_or(0, |b| b.num_blocks * u64::from(b.block_size));
                Some(Source {
                    replica: r.id().to_owned(),
                    alias,
                    address: self.replica_address(r),
                    size,
                })
            })
            .ok_or_else(|| {
                LonghornError::Refused(format!(
                    "cannot clone snapshot {snap} of volume {volume}: none of its replicas on this node \
                     ({}) holds it, and no from_engine_address names its engine's node to ask for one",
                    if replicas.is_empty() {
                        "none".to_owned()
                    } else {
                        replicas
                            .iter()
                            .map(|r| r.id().to_owned())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ))
            })
    }

    fn replica_address(&self, r: &Typed<LonghornReplica>) -> String {
        self.status_of(r.id()).map(|s| s.endpoint).unwrap_or_default()
    }

    /// Where engine `e` is written: its export (a bdev cannot be exported
    /// twice), joined as the internal host it admits; with no export (its
    /// frontend disabled), its bdev (its raid1, or its lone replica's lvol
    /// of this node) exported to talon for the copy.
    fn clone_target(&self, inv: &Inventory, e: &Typed<LonghornEngine>) -> Result<Target, LonghornError> {
        let bdev = if inv.raid(e.id()).is_some() {
            Some(e.id().to_owned())
        } else {
            let mut replicas = e.spec.replica_address_map.keys();
            match (replicas.next(), replicas.next()) {
                (Some(only), None) => self
                    .local_replica(only)
                    .map(|r| naming::replica_alias(&r.disk, only))
                    .filter(|alias| inv.lvols.contains_key(alias)),
                _ => None,
            }
        };
        let Some(bdev) = bdev else {
            return Err(LonghornError::Refused(format!(
                "engine {} serves no bdev on this node yet (no raid {0}, no lone replica lvol of this node)",
                e.id()
            )));
        };
        let volume = naming::instance_name("volume", &e.spec.volume)
            .map_err(|x| LonghornError::Invalid(format!("engine {}: {x}", e.id())))?;
        let nqn = naming::volume_nqn(&volume).map_err(|x| LonghornError::Invalid(x.to_string()))?;
        let export = inv
            .subsystems
            .iter()
            .find(|s| s.nqn == nqn.as_str())
            .and_then(|s| {
                s.listen_addresses.iter().find_map(|l| {
                    let ip: std::net::IpAddr = l.traddr.parse().ok()?;
                    let port: u16 = l.trsvcid.as_deref()?.parse().ok()?;
                    Some(std::net::SocketAddr::new(ip, port))
                })
            });
        Ok(Target {
            bdev,
            export: export.map(|a| (nqn, a)),
        })
    }

    /// A replica of volume `from_volume` on another node that holds snapshot
    /// `snap`, found through engine `from_engine` of the node at
    /// `from_address` (its SPDKService `EngineGet`, then `ReplicaGet` of each
    /// replica in service, on its node).
    async fn remote_clone_source(
        &self,
        from_address: &str,
        from_engine: &str,
        from_volume: &str,
        snap: &str,
    ) -> Result<Source, LonghornError> {
        let what =
            format!("snapshot {snap} of volume {from_volume} (engine {from_engine} at {from_address})");
        let eng = self
            .peers()
            .engine_get(from_address, self.peer_port(), REMOTE_TIMEOUT, from_engine)
            .await
            .map_err(|x| match x {
                EngineAskError::Peer(PeerError::Address(_)) => LonghornError::Invalid(format!(
                    "from_engine_address {from_address:?} is not ip, ip:port or tcp://ip:port"
                )),
                x => LonghornError::Unavailable(format!("cloning {what}: {}", crate::util::error_chain(&x))),
            })?;
        if eng.volume_name != from_volume {
            return Err(LonghornError::Invalid(format!(
                "cloning {what}: engine {from_engine} serves volume {}",
                eng.volume_name
            )));
        }
        let replicas: std::collections::BTreeMap<String, String> =
            eng.replica_address_map.into_iter().collect();
        let mut looked = Vec::new();
        for (replica, address) in &replicas {
            if eng.replica_mode_map.get(replica) != Some(&(spdkrpc::ReplicaMode::Rw as i32)) {
                continue;
            }
            looked.push(replica.clone());
            let Ok(mut rc) = self
                .peers()
                .client(address, self.peer_port(), REMOTE_TIMEOUT)
                .await
            else {
                continue;
            };
            let Ok(r) = rc
                .replica_get(spdkrpc::ReplicaGetRequest {
                    name: replica.clone(),
                })
                .await
            else {
                continue;
            };
            if let Some(l) = r.into_inner().snapshots.get(snap) {
                return Ok(Source {
                    replica: replica.clone(),
                    alias: String::new(),
                    address: address.strip_prefix("tcp://").unwrap_or(address).to_owned(),
                    size: l.spec_size,
                });
            }
        }
        Err(LonghornError::Refused(format!(
            "cannot clone {what}: none of its replicas in service ({}) holds it",
            if looked.is_empty() {
                "none".to_owned()
            } else {
                looked.join(", ")
            }
        )))
    }

    /// The clone ledger of engine `e`, when it is of `e`'s volume.
    fn clone_ledger(&self, e: &Typed<LonghornEngine>) -> Option<LonghornCloneLedger> {
        self.state()
            .get_typed::<LonghornCloneLedger>(e.id())
            .ok()
            .flatten()
            .map(|t| t.spec)
            .filter(|l| l.volume == e.spec.volume)
    }

    /// `SnapshotClone`: the data of snapshot `req.snapshot_name` of
    /// `req.from_volume_name` copied into engine `e`, in the background, from
    /// a replica of this node that holds it, else from one of another node
    /// (found through `req.from_engine_address`'s `EngineGet`), which exposes
    /// it for the copy. Asked again while it runs: refused; after it
    /// completed (also before a restart: the ledger): done.
    pub(super) async fn engine_clone(
        &self,
        e: &Typed<LonghornEngine>,
        req: &imrpc::EngineSnapshotCloneRequest,
    ) -> Result<(), LonghornError> {
        let snap = naming::replica_snapshot_name(&req.snapshot_name)
            .map_err(|x| LonghornError::Invalid(format!("snapshot_name: {x}")))?;
        let from_volume = naming::instance_name("volume", &req.from_volume_name)
            .map_err(|x| LonghornError::Invalid(format!("from_volume_name: {x}")))?;
        let mode = imrpc::CloneMode::try_from(req.clone_mode).map_err(|_| {
            LonghornError::Invalid(format!("clone_mode {} is not one Longhorn sends", req.clone_mode))
        })?;
        let (snap, from_volume) = (snap.as_str(), from_volume.as_str());
        if from_volume == e.spec.volume {
            return Err(LonghornError::Invalid(format!(
                "engine {}: volume {from_volume} cannot be cloned into itself",
                e.id()
            )));
        }
        let running = match self.clones().jobs().get(e.id()) {
            Some(j) if j.volume == e.spec.volume => Some((lock(&j.outcome).clone(), j.snapshot.clone())),
            _ => None,
        };
        match running {
            Some((Outcome::Running, s)) => {
                return Err(LonghornError::Refused(format!(
                    "engine {} is cloning snapshot {s} already",
                    e.id()
                )));
            }
            Some((Outcome::Complete, s)) if s == snap => return Ok(()),
            Some(_) => {}
            None => {
                if self
                    .clone_ledger(e)
                    .is_some_and(|l| l.state == COMPLETE && l.snapshot == snap)
                {
                    return Ok(());
                }
            }
        }
        let inv = Inventory::load(self.client())
            .await
            .map_err(|x| LonghornError::spdk(format!("engine {}: reading spdk_tgt", e.id()), x))?;
        if mode == imrpc::CloneMode::LinkedClone {
            let linked = match self.link_pairs(&inv, e, req, from_volume, snap) {
                Ok(pairs) => self.link_now(e, req, &inv, from_volume, snap, &pairs).await,
                Err(why) => Err(why),
            };
            match linked {
                Ok(()) => return Ok(()),
                Err(why) => {
                    tracing::info!(engine = %e.id(), %why, "a linked clone cannot be made; the snapshot's data is copied");
                }
            }
        }
        let src = match self.clone_source(&inv, from_volume, snap) {
            Ok(s) => s,
            Err(here) if req.from_engine_address.is_empty() => return Err(here),
            Err(_) => {
                let from_engine = naming::instance_name("engine", &req.from_engine_name)
                    .map_err(|x| LonghornError::Invalid(format!("from_engine_name: {x}")))?;
                let mut s = self
                    .remote_clone_source(&req.from_engine_address, from_engine.as_str(), from_volume, snap)
                    .await?;
                if s.size == 0 {
                    s.size = e.spec.size_bytes;
                }
                s
            }
        };
        let dst = self.clone_target(&inv, e)?;
        let (copied, outcome) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(Mutex::new(Outcome::Running)),
        );
        let engines: std::collections::BTreeSet<String> = self
            .state()
            .list_typed::<LonghornEngine>()
            .map_err(LonghornError::Store)?
            .into_iter()
            .map(|t| t.id().to_owned())
            .collect();
        {
            let mut jobs = self.clones().jobs();
            // the clones into engines deleted since are forgotten (a running one ends on its own:
            // its export went with the engine)
            jobs.retain(|engine, _| engines.contains(engine));
            if jobs
                .get(e.id())
                .is_some_and(|j| *lock(&j.outcome) == Outcome::Running)
            {
                return Err(LonghornError::Refused(format!(
                    "engine {} is cloning already",
                    e.id()
                )));
            }
            jobs.insert(
                e.id().to_owned(),
                Job {
                    volume: e.spec.volume.clone(),
                    snapshot: snap.to_owned(),
                    from: src.address.clone(),
                    size: src.size,
                    copied: copied.clone(),
                    outcome: outcome.clone(),
                },
            );
        }
        forget_ledgers(self.state(), &engines);
        // a shallow copy an earlier try of this clone started may still run
        let copy_op = self
            .clone_ledger(e)
            .filter(|l| l.volume == e.spec.volume)
            .and_then(|l| l.copy_op);
        let ledger = LonghornCloneLedger {
            copy_op,
            ..new_ledger(
                e,
                req,
                from_volume,
                snap,
                src.address.clone(),
                src.how(),
                IN_PROGRESS,
            )
        };
        if let Err(x) = self.state().upsert_typed(e.id(), &ledger) {
            self.clones().jobs().remove(e.id());
            return Err(LonghornError::Store(x));
        }
        tracing::info!(engine = %e.id(), from = %src.replica, how = %ledger.how, to = ?dst, ?mode, "cloning a snapshot");
        let run = Run {
            client: self.client().clone(),
            peers: self.peers().clone(),
            peer_port: self.peer_port(),
            state: self.state().clone(),
            engine: e.id().to_owned(),
            what: format!(
                "snapshot {snap} of volume {from_volume} (replica {}{})",
                src.replica,
                if src.remote() {
                    format!(" at {}", src.address)
                } else {
                    String::new()
                }
            ),
            src,
            dst,
            ledger,
            copied,
            outcome,
            stopping: self.stopping.subscribe(),
        };
        tokio::spawn(run.run());
        Ok(())
    }

    /// The links of a linked clone into engine `e` (Longhorn's
    /// `DstReplicaSrcReplicaPairMap`): each replica of the engine with its
    /// source replica, a replica of this node checked here ([`Self::local_link`]),
    /// one of another node asked of its node. Why not, in words, when a pair
    /// is not so (the data is then copied through the engine).
    fn link_pairs(
        &self,
        inv: &Inventory,
        e: &Typed<LonghornEngine>,
        req: &imrpc::EngineSnapshotCloneRequest,
        from_volume: &str,
        snap: &str,
    ) -> Result<Vec<LinkAt>, NotLinked> {
        let pairs = &req.dst_replica_src_replica_pair_map;
        if pairs.is_empty() {
            return Err(NotLinked::NoPairs);
        }
        let mut out = Vec::new();
        for (dst, address) in &e.spec.replica_address_map {
            let src = pairs.get(dst).ok_or_else(|| NotLinked::NoSource(dst.clone()))?;
            if self.local_replica(dst).is_some() {
                out.push(LinkAt::Here(
                    self.local_link(inv, dst, src, Some(from_volume), snap)
                        .map_err(NotLinked::Pair)?,
                ));
            } else {
                out.push(LinkAt::Peer {
                    dst: dst.clone(),
                    src: src.clone(),
                    address: address.strip_prefix("tcp://").unwrap_or(address).to_owned(),
                });
            }
        }
        Ok(out)
    }

    /// Replica `dst` of this node linked to snapshot `snap` of replica `src`
    /// (of volume `from_volume` when given): both on one disk, the snapshot
    /// there.
    fn local_link(
        &self,
        inv: &Inventory,
        dst: &str,
        src: &str,
        from_volume: Option<&str>,
        snap: &str,
    ) -> Result<LinkPair, LonghornError> {
        let refused = |m: String| LonghornError::Refused(format!("linked clone into replica {dst}: {m}"));
        let (dst, d) = self.stored_replica(dst)?;
        let src = naming::instance_name("replica", src).map_err(|x| refused(x.to_string()))?;
        let s = self
            .local_replica(src.as_str())
            .ok_or_else(|| refused(format!("source replica {src} is not on this node")))?;
        if let Some(v) = from_volume.filter(|v| *v != s.volume) {
            return Err(refused(format!(
                "source replica {src} is of volume {}, not {v}",
                s.volume
            )));
        }
        if s.disk != d.spec.disk {
            return Err(refused(format!(
                "it is on disk {}, its source {src} on disk {}",
                d.spec.disk, s.disk
            )));
        }
        let snapshot = format!("{}/{}", lvstore(&s.disk), snapshot_lvol(src.as_str(), snap));
        if !inv.lvols.contains_key(&snapshot) {
            return Err(refused(format!("source replica {src} holds no snapshot {snap}")));
        }
        Ok(LinkPair {
            dst: dst.to_string(),
            src: src.to_string(),
            head: naming::replica_alias(&d.spec.disk, dst.as_str()),
            snapshot,
            entrypoint: naming::clone_entrypoint(src.as_str(), snap),
        })
    }

    /// Links `p` in this node's target.
    async fn link_here(
        &self,
        inv: &Inventory,
        p: &LinkPair,
    ) -> Result<crate::spdk::volume::Linked, LonghornError> {
        let link = crate::spdk::volume::Link {
            snapshot: &p.snapshot,
            entrypoint: &p.entrypoint,
            head: &p.head,
        };
        self.ops()
            .link_clone(inv, &link)
            .await
            .map_err(|x| LonghornError::Refused(crate::util::error_chain(&x)))
    }

    /// `ReplicaSnapshotCloneDstStart` from another node's engine: this
    /// node's replica `req.name` made a linked clone of snapshot
    /// `req.snapshot_name` of replica `req.src_replica_name`, which Longhorn
    /// places on the same disk. A full copy is the engine's
    /// (`SnapshotClone`), not a replica's.
    pub(super) async fn clone_dst_start(
        &self,
        req: spdkrpc::ReplicaSnapshotCloneDstStartRequest,
    ) -> Result<(), LonghornError> {
        if req.clone_mode != spdkrpc::CloneMode::LinkedClone as i32 {
            return Err(LonghornError::Unimplemented(format!(
                "replica {}: talon copies a full clone through its engine (SnapshotClone), not replica by replica",
                req.name
            )));
        }
        let snap = naming::replica_snapshot_name(&req.snapshot_name)
            .map_err(|x| LonghornError::Invalid(format!("snapshot_name: {x}")))?;
        let inv = Inventory::load(self.client())
            .await
            .map_err(|x| LonghornError::spdk(format!("replica {}: reading spdk_tgt", req.name), x))?;
        let p = self.local_link(&inv, &req.name, &req.src_replica_name, None, snap.as_str())?;
        let how = self.link_here(&inv, &p).await?;
        tracing::info!(replica = %p.dst, from = %p.src, snapshot = %snap, ?how, "cloned a snapshot: linked (asked by the engine's node)");
        Ok(())
    }

    /// The linked clone into engine `e`: each pair linked, here or by its
    /// replica's node, then the clone recorded complete. Asked again (a
    /// restart, the manager's retry): the links made are found. A pair that
    /// fails: why, and the caller copies the data through the engine, which
    /// leaves every member reading the same (a linked one reads the snapshot
    /// where the copy writes nothing).
    async fn link_now(
        &self,
        e: &Typed<LonghornEngine>,
        req: &imrpc::EngineSnapshotCloneRequest,
        inv: &Inventory,
        from_volume: &str,
        snap: &str,
        pairs: &[LinkAt],
    ) -> Result<(), NotLinked> {
        let mut failed = Vec::new();
        for p in pairs {
            let done = match p {
                LinkAt::Here(p) => self.link_here(inv, p).await.map(|how| format!("{how:?}")),
                LinkAt::Peer { dst, src, address } => self
                    .link_on_peer(dst, src, address, snap)
                    .await
                    .map(|()| format!("on its node {address}")),
            };
            match done {
                Ok(how) => {
                    tracing::info!(engine = %e.id(), replica = %p.dst(), from = %p.src(), snapshot = %snap, %how, "cloned a snapshot: linked");
                }
                Err(x) => failed.push((p.dst().to_owned(), x)),
            }
        }
        if !failed.is_empty() {
            return Err(NotLinked::Failed(failed));
        }
        let from = pairs.iter().map(LinkAt::src).collect::<Vec<_>>().join(",");
        let ledger = new_ledger(
            e,
            req,
            from_volume,
            snap,
            from.clone(),
            "linked".to_owned(),
            COMPLETE,
        );
        record(self.state(), e.id(), &ledger);
        let size = e.spec.size_bytes;
        self.clones().jobs().insert(
            e.id().to_owned(),
            Job {
                volume: e.spec.volume.clone(),
                snapshot: snap.to_owned(),
                from,
                size,
                copied: Arc::new(AtomicU64::new(size)),
                outcome: Arc::new(Mutex::new(Outcome::Complete)),
            },
        );
        Ok(())
    }

    /// Asks the node at `address` to make its replica `dst` a linked clone
    /// of snapshot `snap` of its replica `src` (`ReplicaSnapshotCloneDstStart`).
    async fn link_on_peer(
        &self,
        dst: &str,
        src: &str,
        address: &str,
        snap: &str,
    ) -> Result<(), LonghornError> {
        let mut c = self
            .peers()
            .client(address, self.peer_port(), REMOTE_TIMEOUT)
            .await
            .map_err(|x| LonghornError::Unavailable(crate::util::error_chain(&x)))?;
        c.replica_snapshot_clone_dst_start(spdkrpc::ReplicaSnapshotCloneDstStartRequest {
            name: dst.to_owned(),
            snapshot_name: snap.to_owned(),
            src_replica_name: src.to_owned(),
            src_replica_address: String::new(),
            clone_mode: spdkrpc::CloneMode::LinkedClone as i32,
        })
        .await
        .map(|_| ())
        .map_err(|x| LonghornError::Relayed(Box::new(x)))
    }

    /// `SnapshotCloneStatus`: the clone into engine `e` as each member in
    /// service reports it, by `tcp://` address; before any clone, one member
    /// with state "" (longhorn-instance-manager's V2 proxy answers so). A
    /// clone this serve does not run is read from its ledger: one that was
    /// running when talon stopped starts again.
    pub(super) async fn engine_clone_status(
        &self,
        e: &Typed<LonghornEngine>,
    ) -> Result<HashMap<String, ptypes::SnapshotCloneStatusResponse>, LonghornError> {
        let mut members: Vec<_> = self
            .members_polled(e)
            .await?
            .into_iter()
            .filter(|m| m.mode == ptypes::ReplicaMode::Rw)
            .collect();
        members.sort_by(|a, b| a.replica.cmp(&b.replica));
        if members.is_empty() {
            return Err(LonghornError::Refused(format!(
                "engine {}: cannot get clone status from any replica (none is in service)",
                e.id()
            )));
        }
        let mut status = self.clone_job_status(e);
        if status.is_none()
            && let Some(l) = self.clone_ledger(e)
        {
            status = Some(if l.state == IN_PROGRESS {
                // talon stopped mid-clone: the copy starts over (it writes the same data)
                let req = imrpc::EngineSnapshotCloneRequest {
                    from_engine_address: l.from_engine_address.clone(),
                    snapshot_name: l.snapshot.clone(),
                    from_engine_name: l.from_engine.clone(),
                    from_volume_name: l.from_volume.clone(),
                    clone_mode: l.mode,
                    ..Default::default()
                };
                tracing::info!(engine = %e.id(), snapshot = %l.snapshot, "starting a clone a restart stopped again");
                match self.engine_clone(e, &req).await {
                    Ok(()) => self.clone_job_status(e).unwrap_or_else(|| ledger_status(&l)),
                    Err(x) => {
                        let failed = LonghornCloneLedger {
                            state: ERROR.to_owned(),
                            error: format!("starting the clone again after a restart of talon: {x}"),
                            ..l
                        };
                        record(self.state(), e.id(), &failed);
                        ledger_status(&failed)
                    }
                }
            } else {
                ledger_status(&l)
            });
        }
        let status = match status {
            Some(s) => s,
            None => {
                members.truncate(1);
                ptypes::SnapshotCloneStatusResponse::default()
            }
        };
        Ok(members
            .into_iter()
            .map(|m| (tcp(&m.address), status.clone()))
            .collect())
    }

    /// The status of the clone this serve runs (or ran) into engine `e`.
    fn clone_job_status(&self, e: &Typed<LonghornEngine>) -> Option<ptypes::SnapshotCloneStatusResponse> {
        let jobs = self.clones().jobs();
        let j = jobs.get(e.id()).filter(|j| j.volume == e.spec.volume)?;
        let outcome = lock(&j.outcome).clone();
        let progress = match (&outcome, j.size) {
            (Outcome::Complete, _) => 100,
            (_, 0) => 0,
            _ => (j.copied.load(Ordering::Relaxed).min(j.size) * 100 / j.size) as i32,
        };
        let (state, error) = match outcome {
            Outcome::Running => (IN_PROGRESS, String::new()),
            Outcome::Complete => (COMPLETE, String::new()),
            Outcome::Failed(why) => (ERROR, why),
        };
        Some(ptypes::SnapshotCloneStatusResponse {
            is_cloning: state == IN_PROGRESS,
            error,
            progress,
            state: state.to_owned(),
            from_replica_address: j.from.clone(),
            snapshot_name: j.snapshot.clone(),
        })
    }

    /// `ReplicaRebuildingSrcStart` with `exposed_snapshot_name` (a clone on
    /// another node reads it): replica `req.name`'s snapshot exported
    /// read-only as `clone_source_nqn(replica, dst_replica_name)` (the clone's
    /// engine) on the replica's address, to the internal host only; made
    /// afresh. Answers the address (`ip:port`).
    pub(super) async fn clone_source_expose(
        &self,
        req: &spdkrpc::ReplicaRebuildingSrcStartRequest,
    ) -> Result<spdkrpc::ReplicaRebuildingSrcStartResponse, LonghornError> {
        let (replica, t) = self.stored_replica(&req.name)?;
        let engine = naming::instance_name("engine", &req.dst_replica_name)
            .map_err(|x| LonghornError::Invalid(format!("dst_replica_name: {x}")))?;
        let snap = naming::replica_snapshot_name(&req.exposed_snapshot_name)
            .map_err(|x| LonghornError::Invalid(format!("exposed_snapshot_name: {x}")))?;
        let what = format!("replica {replica}: exposing snapshot {snap} to engine {engine}");
        let nqn =
            naming::clone_source_nqn(&replica, &engine).map_err(|x| LonghornError::Invalid(x.to_string()))?;
        let alias = format!(
            "{}/{}",
            lvstore(&t.spec.disk),
            snapshot_lvol(replica.as_str(), snap.as_str())
        );
        let inv = Inventory::load(self.client())
            .await
            .map_err(|x| LonghornError::spdk(format!("{what}: reading spdk_tgt"), x))?;
        if !inv.lvols.contains_key(&alias) {
            return Err(LonghornError::not_found(
                "snapshot",
                &format!("{snap} of replica {replica} ({alias})"),
            ));
        }
        // where the replica's export listens (exported or not: an engine here may hold it)
        let m = self.replica_message(&t)?;
        let at =
            m.ip.parse::<std::net::IpAddr>()
                .ok()
                .zip(u16::try_from(m.port_start).ok().filter(|p| *p != 0))
                .map(|(ip, port)| std::net::SocketAddr::new(ip, port))
                .ok_or_else(|| LonghornError::Refused(format!("{what}: the replica has no address yet")))?;
        // an exposure an earlier start left (the clone's node restarted) goes first
        let inv = if inv.subsystem(nqn.as_str()).is_some() {
            self.ops()
                .unexport(replica.as_str(), nqn.as_str())
                .await
                .map_err(|x| LonghornError::internal(&what, crate::util::error_chain(&x)))?;
            Inventory::load(self.client())
                .await
                .map_err(|x| LonghornError::spdk(format!("{what}: reading spdk_tgt"), x))?
        } else {
            inv
        };
        let spec = ExportSpec::plain(at.ip(), at.port(), vec![naming::internal_host_nqn()]);
        self.ops()
            .export(
                &inv,
                replica.as_str(),
                &Export {
                    nqn: &nqn,
                    bdev: &alias,
                    ns_uuid: uuid::Uuid::new_v4(),
                    subsystem: NewSubsystem {
                        model: "talon clone source".into(),
                        serial: None,
                        ana: false,
                        cntlid: None,
                        listener_ana: None,
                    },
                    spec: &spec,
                    only_listener: false,
                },
            )
            .await
            .map_err(|x| LonghornError::internal(&what, crate::util::error_chain(&x)))?;
        tracing::info!(%replica, %snap, %engine, %nqn, %at, "exposed a snapshot for a clone");
        Ok(spdkrpc::ReplicaRebuildingSrcStartResponse {
            exposed_snapshot_lvol_address: at.to_string(),
        })
    }

    /// The exposure of replica `replica` for engine `engine`'s clone removed
    /// (`ReplicaRebuildingSrcFinish`); nothing to do when there is none.
    pub(super) async fn clone_source_unexpose(
        &self,
        replica: &str,
        engine: &str,
    ) -> Result<(), LonghornError> {
        let (Ok(r), Ok(e)) = (
            naming::instance_name("replica", replica),
            naming::instance_name("engine", engine),
        ) else {
            return Ok(());
        };
        let nqn = naming::clone_source_nqn(&r, &e).map_err(|x| LonghornError::Invalid(x.to_string()))?;
        // SPDK v26.05 answers a delete of a subsystem it does not have "Invalid parameters"
        let inv = Inventory::load(self.client())
            .await
            .map_err(|x| LonghornError::spdk(format!("replica {replica}: reading spdk_tgt"), x))?;
        if inv.subsystem(nqn.as_str()).is_none() {
            return Ok(());
        }
        self.ops()
            .unexport(replica, nqn.as_str())
            .await
            .map_err(|x| LonghornError::internal(format!("replica {replica}"), crate::util::error_chain(&x)))
    }

    /// Removes every snapshot exposure for a clone an earlier run of talon
    /// left (its clone's node asks again if it still wants it); answers
    /// their NQNs.
    pub async fn clone_source_sweep(&self) -> Vec<String> {
        let Ok(inv) = Inventory::load(self.client()).await else {
            return Vec::new();
        };
        let prefix = naming::clone_source_prefix();
        let mut out = Vec::new();
        for s in inv.subsystems.iter().filter(|s| s.nqn.starts_with(&prefix)) {
            match self.ops().unexport("clone", &s.nqn).await {
                Ok(()) => {
                    tracing::info!(nqn = %s.nqn, "removed a snapshot exposure for a clone an earlier run left");
                    out.push(s.nqn.clone());
                }
                Err(e) => {
                    tracing::warn!(nqn = %s.nqn, error = %crate::util::error_chain(&e), "removing a snapshot exposure")
                }
            }
        }
        out
    }

    /// `EngineGet` of SPDKService (Longhorn's field numbers, talon's subset):
    /// engine `name` of this node, its replicas and their modes (what a clone
    /// on another node asks to find a replica holding its snapshot).
    pub(super) async fn engine_get_spdk(&self, name: &str) -> Result<spdkrpc::Engine, LonghornError> {
        let e = self.engine(name)?;
        // deleted as far as any caller goes: Longhorn's EngineDelete ends
        // with the engine out of its map, talon's InstanceDelete returns
        // while the controller tears it down (a frontend whose switch-over
        // it was learns so now, not after the teardown)
        if e.metadata.phase == crate::runtime::Phase::TearingDown {
            return Err(LonghornError::not_found("engine", name));
        }
        let members = self.members_polled(&e).await?;
        let status = self.status_of(e.id());
        let ip = status
            .as_ref()
            .and_then(|s| s.endpoint.parse::<std::net::SocketAddr>().ok())
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        Ok(spdkrpc::Engine {
            name: e.id().to_owned(),
            volume_name: e.spec.volume.clone(),
            spec_size: e.spec.size_bytes,
            ip,
            port: i32::from(e.spec.port),
            replica_address_map: e.spec.replica_address_map.clone().into_iter().collect(),
            replica_mode_map: members
                .iter()
                .map(|m| (m.replica.clone(), m.mode as i32))
                .collect(),
            frontend: e.spec.frontend.clone(),
            state: status.map(|s| s.state.as_str().to_owned()).unwrap_or_default(),
        })
    }

    /// Why replica `replica` cannot be the base a linked clone's rebuilt
    /// replica starts on now, as Longhorn checks it before such a rebuild
    /// (longhorn-spdk-engine v1.12.1 `checkLinkedCloneSrcReplicaMode`):
    /// `engine`, the source volume's engine (here, or at `address` through its
    /// node's SPDKService `EngineGet`), is not running or does not hold the
    /// replica RW (its data voted corrupt, being rebuilt, gone). `None`: it can.
    pub(super) async fn linked_source_unfit(
        &self,
        replica: &str,
        engine: &str,
        address: &str,
    ) -> Option<String> {
        if engine.is_empty() {
            return Some("no engine of the source volume was named to check it in".into());
        }
        let eng = if self.engine(engine).is_ok() {
            self.engine_get_spdk(engine).await.map_err(|x| x.to_string())
        } else {
            self.peers()
                .engine_get(address, self.peer_port(), REMOTE_TIMEOUT, engine)
                .await
                .map_err(|x| crate::util::error_chain(&x))
        };
        crate::proto::peer::unfit_base(replica, engine, address, eng)
    }
}

/// The status a ledger reports.
fn ledger_status(l: &LonghornCloneLedger) -> ptypes::SnapshotCloneStatusResponse {
    ptypes::SnapshotCloneStatusResponse {
        is_cloning: l.state == IN_PROGRESS,
        error: l.error.clone(),
        progress: if l.state == COMPLETE { 100 } else { 0 },
        state: l.state.clone(),
        from_replica_address: l.from.clone(),
        snapshot_name: l.snapshot.clone(),
    }
}

/// The ledger of a clone of snapshot `snap` of `from_volume` into engine `e`
/// as `req` asks it, read from `from` (`how`), in `state`.
fn new_ledger(
    e: &Typed<LonghornEngine>,
    req: &imrpc::EngineSnapshotCloneRequest,
    from_volume: &str,
    snap: &str,
    from: String,
    how: String,
    state: &str,
) -> LonghornCloneLedger {
    LonghornCloneLedger {
        volume: e.spec.volume.clone(),
        snapshot: snap.to_owned(),
        from_volume: from_volume.to_owned(),
        from_engine: req.from_engine_name.clone(),
        from_engine_address: req.from_engine_address.clone(),
        mode: req.clone_mode,
        from,
        how,
        state: state.to_owned(),
        error: String::new(),
        copy_op: None,
    }
}

/// Writes ledger `l` of engine `engine` (a failure is logged: the clone's
/// outcome stays in memory for this serve).
fn record(state: &State, engine: &str, l: &LonghornCloneLedger) {
    if let Err(e) = state.upsert_typed(engine, l) {
        tracing::warn!(%engine, error = %crate::util::error_chain(&e), "recording a clone");
    }
}

impl Longhorn {
    /// Forgets the clone into engine `engine`, deleted: its job and its
    /// ledger (an engine made again under the name is a new clone's).
    pub(super) fn forget_clone(&self, engine: &str) {
        self.clones().jobs().remove(engine);
        forget_ledger(self.state(), engine);
    }
}

/// Destroys the clone ledger of engine `engine` (none is no error; a
/// failure is logged).
fn forget_ledger(state: &State, engine: &str) {
    match state.destroy(
        LonghornCloneLedger::NAMESPACE,
        LonghornCloneLedger::TYPE,
        engine,
        "",
    ) {
        Ok(_) | Err(StateError::NotFound { .. }) => {}
        Err(e) => tracing::warn!(%engine, error = %crate::util::error_chain(&e), "forgetting a clone"),
    }
}

/// Destroys the clone ledgers of engines not in `engines` (deleted since).
fn forget_ledgers(state: &State, engines: &std::collections::BTreeSet<String>) {
    let Ok(all) = state.list_typed::<LonghornCloneLedger>() else {
        return;
    };
    for l in all.iter().filter(|l| !engines.contains(l.id())) {
        forget_ledger(state, l.id());
    }
}

/// One clone's copy, in the background.
struct Run {
    client: crate::spdk::SpdkClient,
    peers: PeerChannels,
    peer_port: u16,
    state: State,
    engine: String,
    /// The source, in words.
    what: String,
    src: Source,
    dst: Target,
    ledger: LonghornCloneLedger,
    copied: Arc<AtomicU64>,
    outcome: Arc<Mutex<Outcome>>,
    /// Set when this serve stops.
    stopping: tokio::sync::watch::Receiver<bool>,
}

/// Why one try of a clone's copy failed.
#[derive(Debug, thiserror::Error)]
enum CopyError {
    /// Reading or writing the data.
    #[error("copying")]
    Mover(#[from] mover::MoverError),
    /// A name Longhorn sent does not make an NQN.
    #[error("naming the source's exposure")]
    Name(#[from] crate::names::InvalidName),
    /// The source replica's node could not be reached.
    #[error("reaching the source replica's node {address}")]
    Peer {
        /// Its address.
        address: String,
        /// Why.
        #[source]
        source: crate::proto::peer::PeerError,
    },
    /// The source replica's node refused a call.
    #[error("{step} on the source replica's node: {}", status.message())]
    Remote {
        /// The call.
        step: &'static str,
        /// Its answer.
        status: tonic::Status,
    },
    /// The source replica's node answered an address that is not ip:port.
    #[error("the source replica's node exposed it at {0:?}, not ip:port")]
    Address(String),
    /// spdk_tgt did not answer a listing.
    #[error("{step}")]
    Spdk {
        /// What was asked.
        step: &'static str,
        /// Why.
        #[source]
        source: crate::spdk::ClientError,
    },
}

impl Run {
    async fn run(self) {
        let work = async {
            let mut tries = 0;
            loop {
                tries += 1;
                match self.copy_once().await {
                    Err(why) if self.src.remote() && tries < REMOTE_TRIES => {
                        tracing::warn!(engine = %self.engine, error = %crate::util::error_chain(&why), tries, "a clone from another node failed; trying again");
                        self.copied.store(0, Ordering::Relaxed);
                        tokio::time::sleep(REMOTE_RETRY).await;
                    }
                    r => break r,
                }
            }
        };
        let mut stopping = self.stopping.clone();
        let r = tokio::select! {
            r = work => r,
            () = async {
                let _ = stopping.wait_for(|s| *s).await;
            } => {
                // the copy ends with this serve, unrecorded (as after a kill): its ledger says
                // in_progress, and the next serve starts it again
                tracing::info!(engine = %self.engine, "talon stops: a clone ends unfinished");
                if self.src.remote() {
                    match tokio::time::timeout(REMOTE_TIMEOUT, self.unexpose()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(x)) => tracing::warn!(engine = %self.engine, replica = %self.src.replica, error = %crate::util::error_chain(&x), "removing a snapshot exposure"),
                        Err(_) => tracing::warn!(engine = %self.engine, replica = %self.src.replica, after = ?REMOTE_TIMEOUT, "removing a snapshot exposure: no answer"),
                    }
                }
                return;
            }
        };
        let (engine, dst) = (&self.engine, &self.dst.bdev);
        let (outcome, ledger) = match r {
            Ok((f, via)) => {
                tracing::info!(%engine, from = %self.what, to = %dst, how = %self.ledger.how, via, written = f.written, read = f.read, "cloned a snapshot");
                (
                    Outcome::Complete,
                    LonghornCloneLedger {
                        state: COMPLETE.to_owned(),
                        copy_op: None,
                        ..self.ledger.clone()
                    },
                )
            }
            Err(x) => {
                let why = format!(
                    "cloning {} into engine {engine} ({dst}): {}",
                    self.what,
                    crate::util::error_chain(&x)
                );
                tracing::warn!(%engine, error = %why, "a snapshot clone failed");
                (
                    Outcome::Failed(why.clone()),
                    LonghornCloneLedger {
                        state: ERROR.to_owned(),
                        error: why,
                        ..self.ledger.clone()
                    },
                )
            }
        };
        // the ledger first: a status asked between the two reads the job
        record(&self.state, engine, &ledger);
        *lock(&self.outcome) = outcome;
    }

    /// The engine's bdev, as a mover session.
    async fn target(&self) -> Result<mover::Session, mover::MoverError> {
        match &self.dst.export {
            Some((nqn, addr)) => {
                let host = naming::internal_host_nqn();
                mover::Session::join(&self.client, &self.dst.bdev, nqn, *addr, &host, mover::DEPTH).await
            }
            None => {
                mover::Session::open(&self.client, &self.dst.bdev, mover::Purpose::Clone, mover::DEPTH).await
            }
        }
    }

    /// One try of the copy; answers what it wrote and read, and which way.
    async fn copy_once(&self) -> Result<(mover::Filled, &'static str), CopyError> {
        if !self.src.remote() {
            // v26.05 refuses a shallow copy into a bdev its NVMe-oF target
            // exports ("cannot create blobstore block device"): only an engine
            // whose bdev is not exported is copied into inside the target
            if self.dst.export.is_none()
                && let Some(f) = self.copy_within().await?
            {
                return Ok((f, "shallow copies inside spdk_tgt"));
            }
            let dst = self.target().await?;
            let f = mover::copy::copy(&self.client, &self.src.alias, dst, mover::DEPTH, &self.copied).await?;
            return Ok((f, "the mover"));
        }
        let dst = self.target().await?;
        let r = self.copy_remote(dst).await;
        // the exposure goes on every path (a restart of this node's talon
        // mid-copy: the clone starts again, and its start makes it afresh)
        if let Err(x) = self.unexpose().await {
            tracing::warn!(engine = %self.engine, replica = %self.src.replica, error = %crate::util::error_chain(&x), "removing a snapshot exposure");
        }
        r.map(|f| (f, "the mover from the exposure"))
    }

    /// A source of this node copied inside spdk_tgt, straight into the
    /// engine's bdev ([`mover::copy::within`]): each copy's id persisted in
    /// the ledger before it is waited for. `None`: SPDK refused the copy
    /// before writing anything (the mover copies it).
    async fn copy_within(&self) -> Result<Option<mover::Filled>, CopyError> {
        let inv = Inventory::load(&self.client)
            .await
            .map_err(|source| CopyError::Spdk {
                step: "listing the target",
                source,
            })?;
        let started = |op: u32| {
            let l = LonghornCloneLedger {
                copy_op: Some(op),
                ..self.ledger.clone()
            };
            record(&self.state, &self.engine, &l);
        };
        let w = mover::copy::Within {
            snap: &self.src.alias,
            dst: &self.dst.bdev,
            earlier: self.ledger.copy_op,
            started: &started,
            size: self.src.size,
        };
        Ok(mover::copy::within(&self.client, &inv, &w, &self.copied).await?)
    }

    fn names(&self) -> Result<(ObjectName, ObjectName), CopyError> {
        let replica = naming::instance_name("replica", &self.src.replica)?;
        let engine = naming::instance_name("engine", &self.engine)?;
        Ok((replica, engine))
    }

    async fn peer(
        &self,
    ) -> Result<
        crate::proto::spdkrpc::spdk_service_client::SpdkServiceClient<tonic::transport::Channel>,
        CopyError,
    > {
        self.peers
            .client(&self.src.address, self.peer_port, REMOTE_TIMEOUT)
            .await
            .map_err(|source| CopyError::Peer {
                address: self.src.address.clone(),
                source,
            })
    }

    async fn copy_remote(&self, dst: mover::Session) -> Result<mover::Filled, CopyError> {
        let (replica, engine) = self.names()?;
        let nqn = naming::clone_source_nqn(&replica, &engine)?;
        let mut c = self.peer().await?;
        let at = c
            .replica_rebuilding_src_start(spdkrpc::ReplicaRebuildingSrcStartRequest {
                name: replica.as_str().to_owned(),
                dst_replica_name: engine.as_str().to_owned(),
                dst_replica_address: String::new(),
                exposed_snapshot_name: self.ledger.snapshot.clone(),
            })
            .await
            .map_err(|status| CopyError::Remote {
                step: "exposing the snapshot",
                status,
            })?
            .into_inner()
            .exposed_snapshot_lvol_address;
        let addr: std::net::SocketAddr = at.parse().map_err(|_| CopyError::Address(at.clone()))?;
        let label = format!("{}@{at}", snapshot_lvol(replica.as_str(), &self.ledger.snapshot));
        let src = mover::Session::join(
            &self.client,
            &label,
            &nqn,
            addr,
            &naming::internal_host_nqn(),
            mover::DEPTH,
        )
        .await?;
        Ok(mover::copy::copy_sessions(src, mover::copy::Range::whole(), dst, &self.copied).await?)
    }

    async fn unexpose(&self) -> Result<(), CopyError> {
        let (replica, engine) = self.names()?;
        let mut c = self.peer().await?;
        c.replica_rebuilding_src_finish(spdkrpc::ReplicaRebuildingSrcFinishRequest {
            name: replica.as_str().to_owned(),
            dst_replica_name: engine.as_str().to_owned(),
        })
        .await
        .map(drop)
        .map_err(|status| CopyError::Remote {
            step: "removing the snapshot's exposure",
            status,
        })
    }
}
