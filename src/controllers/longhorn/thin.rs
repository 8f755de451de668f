//! The engine's side of a Longhorn replica's thin rebuild (the replica
//! nodes' side and the picture: `crate::longhorn::rebuild`): which replicas
//! are its ends and which members are in service, looked up from the
//! engine's spec and raid; the steps themselves are the engine's
//! ([`VolumeOps::replica_thin_step`] in `spdk/volume`, the one step machine
//! and switch of every thin rebuild). What only a replica's node can do is
//! asked through its SPDKService: this module's [`ReplicaPeers`]. Which
//! replica is rebuilt, and what a failure reports, is `rebuilds.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use tonic::transport::Channel;

use super::{InstanceError, LonghornController, Serving};
use crate::proto::spdkrpc;
use crate::proto::spdkrpc::spdk_service_client::SpdkServiceClient;
use crate::resources::longhorn::{CloneBase, LonghornEngine, LonghornReplica, SnapshotInfo};
use crate::runtime::Typed;
use crate::spdk::naming::longhorn as naming;
use crate::spdk::volume::naming::lvstore;
use crate::spdk::volume::{CopyState, Inventory, ReplicaEnd, ReplicaLvols, ReplicaPeers, ReplicaRebuild};

pub(super) use crate::spdk::volume::{Failed, ReplicaRebuilds, Thin, ThinError};

/// How long a call to another node may take.
pub(super) const PEER_TIMEOUT: Duration = Duration::from_secs(30);

fn peer_said(replica: &str, doing: &'static str) -> impl FnOnce(tonic::Status) -> ThinError {
    let replica = replica.to_owned();
    move |s| ThinError::Peer {
        replica,
        doing,
        message: s.message().to_owned(),
    }
}

impl LonghornController {
    /// The SPDKService of the node that serves a replica at `address`.
    pub(super) async fn peer(
        &self,
        replica: &str,
        address: &str,
    ) -> Result<SpdkServiceClient<Channel>, InstanceError> {
        self.peers
            .client(address, self.peer_port, PEER_TIMEOUT)
            .await
            .map_err(|source| InstanceError::PeerUnreachable {
                replica: replica.to_owned(),
                source,
            })
    }

    /// [`Self::peer`], for a rebuild's step.
    async fn peer_of(&self, replica: &str, address: &str) -> Result<SpdkServiceClient<Channel>, ThinError> {
        self.peers
            .client(address, self.peer_port, PEER_TIMEOUT)
            .await
            .map_err(|source| ThinError::PeerUnreachable {
                replica: replica.to_owned(),
                source: Box::new(source),
            })
    }

    fn end(&self, local: &BTreeMap<String, LonghornReplica>, replica: &str, address: &str) -> ReplicaEnd {
        match local.get(replica) {
            Some(r) => ReplicaEnd::Here {
                replica: replica.to_owned(),
                lvs: lvstore(&r.disk),
                size: r.size_bytes,
            },
            None => ReplicaEnd::Peer {
                replica: replica.to_owned(),
                address: address.to_owned(),
            },
        }
    }

    /// One step of the thin rebuild of replica `dst_name` of raid1 engine
    /// `e`: its ends and the members in service, for the engine's step
    /// ([`crate::spdk::volume::VolumeOps::replica_thin_step`]).
    pub(super) async fn thin_step(
        &self,
        inv: &Inventory,
        e: &Typed<LonghornEngine>,
        local: super::Local<'_>,
        dst_name: &str,
        plan: &Serving,
    ) -> Result<Thin, ThinError> {
        let (all, local) = (local.all, local.direct);
        let engine = e.id();
        let raid = inv.raid(engine).ok_or_else(|| ThinError::NoRaid {
            engine: engine.to_owned(),
        })?;
        let dst_address = e
            .spec
            .replica_address_map
            .get(dst_name)
            .cloned()
            .unwrap_or_default();
        let dst = self.end(local, dst_name, &dst_address);
        // the members in service, by the name the raid knows each by
        let mut in_service: Vec<(ReplicaEnd, String)> = Vec::new();
        for (r, address) in &e.spec.replica_address_map {
            let names = self.member_names(inv, local, r);
            let slot = raid.base_bdevs_list.iter().find(|b| {
                b.name.as_ref().is_some_and(|n| names.contains(n))
                    || b.uuid.as_ref().is_some_and(|u| names.contains(u))
            });
            if r == dst_name {
                if let Some(s) = slot.and_then(|s| s.name.clone()) {
                    // it left its slot's data behind when it fell out: out again
                    self.ops
                        .take_out_member(&s)
                        .await
                        .map_err(|source| ThinError::Spdk {
                            doing: format!("taking {s} out of raid {engine}"),
                            source,
                        })?;
                }
                continue;
            }
            if let Some(s) = raid.slot_in_service(&names).and_then(|b| b.name.clone()) {
                // a source of this node is read here even when its raid
                // reaches it through its export (another engine reads it
                // too, or read it until lately): never through this
                // node's own SPDKService, whose attach of the dest would
                // take the path this engine's attach of it needs
                in_service.push((self.end(all, r, address), s));
            }
        }
        // a source here first: the copy runs in this target
        in_service.sort_by_key(|(end, _)| matches!(end, ReplicaEnd::Peer { .. }));
        // (none in service: the step says so)
        self.ops
            .replica_thin_step(
                inv,
                &self.thin,
                self,
                ReplicaRebuild {
                    engine,
                    raid,
                    names: &plan.names,
                    spec: &plan.spec,
                    dst_address,
                    src_info: in_service
                        .first()
                        .and_then(|(src, _)| all.get(src.replica()))
                        .map(|r| r.snapshot_info.clone())
                        .unwrap_or_default(),
                    in_service,
                    dst,
                    qos: u64::try_from(e.spec.rebuild_qos_mbps).unwrap_or(0),
                    beside: e.spec.rebuild_links.get(dst_name).cloned(),
                    // no address: the engine is asked on this node (ReplicaAdd
                    // found it here)
                    beside_engine: e.spec.rebuild_link_engines.get(dst_name).map(|l| {
                        let at = match l.address.as_str() {
                            "" => std::net::SocketAddr::new(plan.spec.address, 0).to_string(),
                            a => a.to_owned(),
                        };
                        (l.engine.clone(), at)
                    }),
                },
            )
            .await
    }

    /// The names raid1 `e` may know replica `r` by: its lvol's alias and
    /// UUID here, or the namespace bdev of its controller.
    pub(super) fn member_names(
        &self,
        inv: &Inventory,
        local: &BTreeMap<String, LonghornReplica>,
        r: &str,
    ) -> Vec<String> {
        match local.get(r) {
            Some(l) => {
                let alias = naming::replica_alias(&l.disk, r);
                let uuid = inv.lvols.get(&alias).map(|x| x.uuid.clone());
                std::iter::once(alias).chain(uuid).collect()
            }
            None => {
                let b = format!("{r}n1");
                let uuid = inv.bdevs.get(&b).and_then(|x| x.uuid.clone());
                std::iter::once(b).chain(uuid).collect()
            }
        }
    }
}

#[async_trait::async_trait]
impl ReplicaPeers for LonghornController {
    async fn lvols(&self, replica: &str, address: &str) -> Result<ReplicaLvols, ThinError> {
        let r = self
            .peer_of(replica, address)
            .await?
            .replica_get(spdkrpc::ReplicaGetRequest {
                name: replica.to_owned(),
            })
            .await
            .map_err(peer_said(replica, "listing its lvols"))?
            .into_inner();
        Ok(ReplicaLvols::from(&r))
    }

    async fn snapshot(
        &self,
        replica: &str,
        address: &str,
        snap: &str,
        dst: Option<Option<&SnapshotInfo>>,
    ) -> Result<(), ThinError> {
        let info = dst.flatten();
        let req = spdkrpc::SnapshotRequest {
            name: replica.to_owned(),
            snapshot_name: snap.to_owned(),
            snapshot_timestamp: info.map(|i| i.created.clone()).unwrap_or_default(),
            labels: info
                .map(|i| i.labels.clone().into_iter().collect())
                .unwrap_or_default(),
            ..Default::default()
        };
        let mut c = self.peer_of(replica, address).await?;
        let r = if dst.is_some() {
            c.replica_rebuilding_dst_snapshot_create(req).await.map(|_| ())
        } else {
            c.replica_snapshot_create(req).await.map(|_| ())
        };
        r.map_err(peer_said(replica, "snapshotting it"))
    }

    async fn delete_snapshot(&self, replica: &str, address: &str, snap: &str) -> Result<(), ThinError> {
        self.peer_of(replica, address)
            .await?
            .replica_snapshot_delete(spdkrpc::SnapshotRequest {
                name: replica.to_owned(),
                snapshot_name: snap.to_owned(),
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(peer_said(replica, "deleting a rebuild snapshot"))
    }

    async fn attach(&self, inv: &Inventory, replica: &str, address: &str) -> Result<String, ThinError> {
        self.attach_remote(inv, replica, address)
            .await
            .map_err(|e| ThinError::Attach {
                replica: replica.to_owned(),
                message: e.text(),
            })
    }

    async fn dst_start(
        &self,
        replica: &str,
        address: &str,
        src: &ReplicaEnd,
        chain: &[String],
        base: Option<&CloneBase>,
    ) -> Result<bool, ThinError> {
        let list = chain
            .iter()
            .enumerate()
            .map(|(i, s)| spdkrpc::Lvol {
                name: s.clone(),
                parent: i.checked_sub(1).map(|p| chain[p].clone()).unwrap_or_default(),
                ..Default::default()
            })
            .collect();
        let src_address = match src {
            ReplicaEnd::Peer { address, .. } => address.clone(),
            ReplicaEnd::Here { .. } => String::new(),
        };
        // its node answers where it stands instead of holding this
        // reconcile while its own controller works
        let req = crate::proto::peer::at_once(spdkrpc::ReplicaRebuildingDstStartRequest {
            name: replica.to_owned(),
            src_replica_name: src.replica().to_owned(),
            src_replica_address: src_address,
            rebuilding_snapshot_list: list,
            linked_clone_source: base.map(|b| spdkrpc::LinkedCloneSource {
                snapshot_name: b.snapshot.clone(),
                replica_name: b.replica.clone(),
                ..Default::default()
            }),
            ..Default::default()
        });
        self.peer_of(replica, address)
            .await?
            .replica_rebuilding_dst_start(req)
            .await
            .map(|r| !r.into_inner().dst_head_lvol_address.is_empty())
            .map_err(|s| match s.code() {
                // the base asked for is not there: the rebuild copies every block
                tonic::Code::FailedPrecondition if base.is_some() => ThinError::NoCloneBase {
                    replica: replica.to_owned(),
                    message: s.message().to_owned(),
                },
                _ => peer_said(replica, "making its head again")(s),
            })
    }

    async fn src_copy_start(
        &self,
        replica: &str,
        address: &str,
        dst: &str,
        to: &str,
        snap: &str,
    ) -> Result<(), ThinError> {
        let mut c = self.peer_of(replica, address).await?;
        c.replica_rebuilding_src_start(spdkrpc::ReplicaRebuildingSrcStartRequest {
            name: replica.to_owned(),
            dst_replica_name: dst.to_owned(),
            dst_replica_address: to.to_owned(),
            exposed_snapshot_name: String::new(),
        })
        .await
        .map_err(peer_said(replica, "starting the rebuild from it"))?;
        c.replica_rebuilding_src_shallow_copy_start(spdkrpc::ReplicaRebuildingSrcShallowCopyStartRequest {
            name: replica.to_owned(),
            snapshot_name: snap.to_owned(),
            dst_rebuilding_lvol_address: to.to_owned(),
        })
        .await
        .map_err(peer_said(replica, "starting a copy from it"))?;
        Ok(())
    }

    async fn src_copy_check(
        &self,
        replica: &str,
        address: &str,
        dst: &str,
        snap: &str,
    ) -> Result<Option<CopyState>, ThinError> {
        match self
            .peer_of(replica, address)
            .await?
            .replica_rebuilding_src_shallow_copy_check(spdkrpc::ReplicaRebuildingSrcShallowCopyCheckRequest {
                name: replica.to_owned(),
                dst_replica_name: dst.to_owned(),
                snapshot_name: snap.to_owned(),
            })
            .await
        {
            Ok(r) => {
                let r = r.into_inner();
                Ok(Some(CopyState::from_answer(
                    &r.state,
                    r.handled_clusters,
                    Some(r.error_msg).filter(|m| !m.is_empty()),
                )))
            }
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(peer_said(replica, "checking the copy from it")(s)),
        }
    }

    async fn dst_qos(&self, replica: &str, address: &str, mbps: u64) -> Result<(), ThinError> {
        self.peer_of(replica, address)
            .await?
            .replica_rebuilding_dst_set_qos_limit(spdkrpc::ReplicaRebuildingDstSetQosLimitRequest {
                name: replica.to_owned(),
                qos_limit_mbps: i64::try_from(mbps).unwrap_or(i64::MAX),
            })
            .await
            .map(|_| ())
            .map_err(peer_said(replica, "capping its rebuild"))
    }

    async fn src_finish(&self, replica: &str, address: &str, dst: &str) -> Result<(), ThinError> {
        self.peer_of(replica, address)
            .await?
            .replica_rebuilding_src_finish(spdkrpc::ReplicaRebuildingSrcFinishRequest {
                name: replica.to_owned(),
                dst_replica_name: dst.to_owned(),
            })
            .await
            .map(|_| ())
            .map_err(peer_said(replica, "letting the dest go"))
    }

    fn switch_started(&self, engine: &str, joining: &str, in_service: Vec<String>) {
        // ReplicaList keeps the modes from before the switch until the raid
        // is there again: the members in service stay RW for the manager
        self.session.start_switch(
            engine,
            crate::resources::longhorn::SwitchModes {
                joining: joining.to_owned(),
                in_service: in_service.into_iter().collect(),
            },
        );
    }

    fn switch_done(&self, engine: &str) {
        self.session.switch_done(engine);
    }

    /// Asked of the engine's node (this one too) through its `EngineGet`, as
    /// the `ReplicaAdd` asked it (`Longhorn::linked_source_unfit`).
    async fn unfit_base(&self, replica: &str, engine: &str, address: &str) -> Option<String> {
        let got = self
            .peers
            .engine_get(address, self.peer_port, PEER_TIMEOUT, engine)
            .await
            .map_err(|x| crate::util::error_chain(&x));
        crate::proto::peer::unfit_base(replica, engine, address, got)
    }
}
