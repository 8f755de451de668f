//! The snapshot hash calls ([`super::snaphash`] has the picture and the
//! jobs): `ReplicaSnapshotHash`/`Status` of this node's replicas, and the
//! engine proxy's `SnapshotHash`/`SnapshotHashStatus` over an engine's members.

use std::collections::HashMap;

use super::error::LonghornError;
use super::proxy::Member;
use super::service::Longhorn;
use super::snaphash::{Job, status_message};
use crate::proto::{ptypes, spdkrpc};
use crate::resources::longhorn::{LonghornEngine, snapshot_lvol};
use crate::runtime::Typed;
use crate::spdk::naming::longhorn as naming;
use crate::spdk::volume::naming::lvstore;

impl Longhorn {
    /// `ReplicaSnapshotHash` (and an engine's member on this node): starts
    /// hashing snapshot `snap` of replica `name`, unless a hash of it runs
    /// (no second one) or one completed and `rehash` is false.
    pub(super) async fn replica_hash(
        &self,
        name: &str,
        snap: &str,
        rehash: bool,
    ) -> Result<(), LonghornError> {
        naming::replica_snapshot_name(snap).map_err(|x| LonghornError::Invalid(x.to_string()))?;
        let (replica, t) = self.stored_replica(name)?;
        let lvs = lvstore(&t.spec.disk);
        let have = self.replica_lvols_now(replica.as_str(), &t.spec.disk).await?;
        if !have.snapshots.contains_key(snap) {
            return Err(LonghornError::Gone(format!(
                "replica {replica}: cannot find snapshot {snap} ({})",
                snapshot_lvol(replica.as_str(), snap)
            )));
        }
        self.hashes().start(self.client(), lvs, &replica, snap, rehash)?;
        Ok(())
    }

    /// `ReplicaSnapshotHashStatus`: where replica `name`'s hash of `snap`
    /// stands (state "" when it was never hashed). A snapshot that is not
    /// there is NOT_FOUND, unless its hash failed (that error names it).
    pub(super) async fn replica_hash_status(
        &self,
        name: &str,
        snap: &str,
    ) -> Result<spdkrpc::ReplicaSnapshotHashStatusResponse, LonghornError> {
        let (replica, t) = self.stored_replica(name)?;
        let key = (replica.as_str().to_owned(), snap.to_owned());
        let job = self.hashes().job(&key);
        if matches!(job, Some(Job::Running | Job::Failed(_))) {
            return Ok(status_message(job));
        }
        let have = self.replica_lvols_now(replica.as_str(), &t.spec.disk).await?;
        if !have.snapshots.contains_key(snap) {
            self.hashes().forget(&key);
            return Err(LonghornError::Gone(format!(
                "replica {replica}: cannot find snapshot {snap} ({})",
                snapshot_lvol(replica.as_str(), snap)
            )));
        }
        Ok(status_message(job))
    }

    /// The members of engine `e` a hash asks: those in service (RW). A
    /// member being rebuilt (WO) refuses the hash, as Longhorn's V2 engine
    /// does; one in error is left out.
    async fn hash_members(&self, e: &Typed<LonghornEngine>) -> Result<Vec<Member>, LonghornError> {
        let members = self.members(e).await?;
        if let Some(m) = members.iter().find(|m| m.mode == ptypes::ReplicaMode::Wo) {
            return Err(LonghornError::Refused(format!(
                "engine {} contains WO replica {} during snapshot hash",
                e.id(),
                m.replica
            )));
        }
        Ok(members
            .into_iter()
            .filter(|m| m.mode == ptypes::ReplicaMode::Rw)
            .collect())
    }

    /// `SnapshotHash`: each replica in service hashes snapshot `snap` where
    /// it lives. Errors name the replica; the first one's code is answered.
    pub(super) async fn engine_hash(
        &self,
        e: &Typed<LonghornEngine>,
        snap: &str,
        rehash: bool,
    ) -> Result<(), LonghornError> {
        naming::replica_snapshot_name(snap).map_err(|x| LonghornError::Invalid(x.to_string()))?;
        let mut errors = Vec::new();
        for m in self.hash_members(e).await? {
            let r = match self.local_replica(&m.replica) {
                Some(_) => self.replica_hash(&m.replica, snap, rehash).await,
                None => match self.replica_node(&m.replica, &m.address).await {
                    Ok(mut c) => c
                        .replica_snapshot_hash(spdkrpc::SnapshotHashRequest {
                            name: m.replica.clone(),
                            snapshot_name: snap.to_owned(),
                            rehash,
                        })
                        .await
                        .map(|_| ())
                        .map_err(|s| LonghornError::PeerAnswer {
                            replica: m.replica.clone(),
                            code: s.code(),
                            message: s.message().to_owned(),
                        }),
                    Err(x) => Err(x),
                },
            };
            if let Err(e) = r {
                errors.push(e);
            }
        }
        match errors.is_empty() {
            true => Ok(()),
            false => Err(LonghornError::Several(errors)),
        }
    }

    /// `SnapshotHashStatus`: each replica in service, by its URL (`tcp://ip:port`).
    pub(super) async fn engine_hash_status(
        &self,
        e: &Typed<LonghornEngine>,
        snap: &str,
    ) -> Result<HashMap<String, ptypes::SnapshotHashStatusResponse>, LonghornError> {
        let mut out = HashMap::new();
        for m in self.hash_members(e).await? {
            let s = match self.local_replica(&m.replica) {
                Some(_) => self.replica_hash_status(&m.replica, snap).await?,
                None => {
                    let mut c = self.replica_node(&m.replica, &m.address).await?;
                    c.replica_snapshot_hash_status(spdkrpc::SnapshotHashStatusRequest {
                        name: m.replica.clone(),
                        snapshot_name: snap.to_owned(),
                    })
                    .await
                    .map_err(|s| LonghornError::PeerAnswer {
                        replica: m.replica.clone(),
                        code: s.code(),
                        message: s.message().to_owned(),
                    })?
                    .into_inner()
                }
            };
            // the replica's URL: longhorn-manager sets a replica whose checksum
            // lost its vote ERR by this key, and refuses one without tcp://
            // ("invalid replica url", as Longhorn's V2 engine's `ip:port` meets)
            out.insert(
                format!("tcp://{}", m.address),
                ptypes::SnapshotHashStatusResponse {
                    state: s.state,
                    checksum: s.checksum,
                    error: s.error,
                    silently_corrupted: s.silently_corrupted,
                },
            );
        }
        Ok(out)
    }
}
