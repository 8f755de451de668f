//! The clone calls ([`super::clone`] has the picture and the jobs): the engine
//! proxy's `SnapshotClone` and `SnapshotCloneStatus`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::clone::{Job, Outcome, lock};
use super::error::LonghornError;
use super::service::Longhorn;
use super::snaphash::{COMPLETE, ERROR, IN_PROGRESS};
use crate::proto::{imrpc, ptypes};
use crate::resources::longhorn::{LonghornEngine, LonghornReplica, snapshot_lvol};
use crate::runtime::Typed;
use crate::spdk::naming::longhorn::{self as naming, tcp};
use crate::spdk::volume::Inventory;
use crate::spdk::volume::mover;
use crate::spdk::volume::naming::lvstore;

/// Where a clone writes: engine bdev `bdev`, through its export when it has one.
#[derive(Debug)]
struct Target {
    bdev: String,
    export: Option<(crate::names::Nqn, std::net::SocketAddr)>,
}

/// A source snapshot on this node: its replica, the lvol's alias, the
/// replica's address.
#[derive(Debug)]
struct Source {
    replica: String,
    alias: String,
    address: String,
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
                inv.lvols.contains_key(&alias).then(|| Source {
                    replica: r.id().to_owned(),
                    alias,
                    address: self.replica_address(r),
                })
            })
            .ok_or_else(|| {
                LonghornError::Refused(format!(
                    "cannot clone snapshot {snap} of volume {volume}: none of its replicas on this node \
                     ({}) holds it (talon clones from a replica on the new engine's node)",
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

    /// `SnapshotClone`: the data of snapshot `req.snapshot_name` of
    /// `req.from_volume_name` copied into engine `e`, in the background.
    /// Asked again while it runs: refused; after it completed: done.
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
        if let Some(j) = self.clones().jobs().get(e.id())
            && j.volume == e.spec.volume
        {
            match &*lock(&j.outcome) {
                Outcome::Running => {
                    return Err(LonghornError::Refused(format!(
                        "engine {} is cloning snapshot {} already",
                        e.id(),
                        j.snapshot
                    )));
                }
                Outcome::Complete if j.snapshot == snap => return Ok(()),
                _ => {}
            }
        }
        let inv = Inventory::load(self.client())
            .await
            .map_err(|x| LonghornError::spdk(format!("engine {}: reading spdk_tgt", e.id()), x))?;
        let src = self.clone_source(&inv, from_volume, snap)?;
        let dst = self.clone_target(&inv, e)?;
        let size = inv
            .lvols
            .get(&src.alias)
            .and_then(|l| inv.bdevs.get(&l.uuid))
            .map_or(0, |b| b.num_blocks * u64::from(b.block_size));
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
                    size,
                    copied: copied.clone(),
                    outcome: outcome.clone(),
                },
            );
        }
        tracing::info!(engine = %e.id(), from = %src.alias, to = ?dst, ?mode, "cloning a snapshot");
        let (client, engine, what) = (
            self.client().clone(),
            e.id().to_owned(),
            format!(
                "snapshot {snap} of volume {from_volume} (replica {})",
                src.replica
            ),
        );
        tokio::spawn(async move {
            let session = match &dst.export {
                Some((nqn, addr)) => {
                    let host = naming::internal_host_nqn();
                    mover::Session::join(&client, &dst.bdev, nqn, *addr, &host, mover::DEPTH).await
                }
                None => mover::Session::open(&client, &dst.bdev, mover::Purpose::Clone, mover::DEPTH).await,
            };
            let r = match session {
                Ok(s) => mover::copy::copy(&client, &src.alias, s, mover::DEPTH, &copied).await,
                Err(x) => Err(x),
            };
            let dst = &dst.bdev;
            let mut o = lock(&outcome);
            *o = match r {
                Ok(f) => {
                    tracing::info!(%engine, from = %src.alias, to = %dst, written = f.written, read = f.read, "cloned a snapshot");
                    Outcome::Complete
                }
                Err(x) => {
                    let why = format!(
                        "cloning {what} into engine {engine} ({dst}): {}",
                        crate::util::error_chain(&x)
                    );
                    tracing::warn!(%engine, error = %why, "a snapshot clone failed");
                    Outcome::Failed(why)
                }
            };
        });
        Ok(())
    }

    /// `SnapshotCloneStatus`: the clone into engine `e` as each member in
    /// service reports it, by `tcp://` address; before any clone, one member
    /// with state "" (longhorn-instance-manager's V2 proxy answers so).
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
        let status = match self
            .clones()
            .jobs()
            .get(e.id())
            .filter(|j| j.volume == e.spec.volume)
        {
            None => {
                members.truncate(1);
                ptypes::SnapshotCloneStatusResponse::default()
            }
            Some(j) => {
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
                ptypes::SnapshotCloneStatusResponse {
                    is_cloning: state == IN_PROGRESS,
                    error,
                    progress,
                    state: state.to_owned(),
                    from_replica_address: j.from.clone(),
                    snapshot_name: j.snapshot.clone(),
                }
            }
        };
        Ok(members
            .into_iter()
            .map(|m| (tcp(&m.address), status.clone()))
            .collect())
    }
}
