//! The replica exports a restart of spdk_tgt took away, made again first and
//! all at once (the boot storm).
//!
//! ```text
//!   spdk_tgt ready, lvstores loaded ──> Inventory::load ──> engines going away removed
//!     ──> lost exports: replicas here running, lvol there, no subsystem, not held by an
//!         engine here, no revert or rebuild start of this session pending
//!     ──> the TCP transport once ──> each exported, REEXPORTS_AT_ONCE at a time
//!         (a failure is logged; the replica's own step tries again and reports it)
//!     ──> Inventory::load again ──> the waited-on instances, replicas, engines, frontends
//! ```
//!
//! Other nodes' engines reach a replica here through its export, and give the
//! path up once their host's `ctrlr_loss_timeout` (15 s, Longhorn's link
//! timeouts) runs out: the manager then rebuilds the replica. The replicas'
//! own step makes their exports too, one replica after the other (~125 ms
//! each on a busy node), so after a restart the last of 50 came back after
//! the engines had given up. Made here in one concurrent step, they come
//! back together, whatever their number.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Instant;

use futures::StreamExt;

use super::{InstanceError, LonghornController, held, local_replicas};
use crate::names::ObjectName;
use crate::resources::config::NodeConfig;
use crate::resources::longhorn::{LonghornEngine, LonghornReplica};
use crate::runtime::{ControllerError, Phase, Typed};
use crate::spdk::naming::longhorn as naming;
use crate::spdk::volume::Inventory;

/// Replica exports made at the same time (SPDK answers calls in flight
/// together: a round trip is its RPC poller's period, not one per call).
pub(super) const REEXPORTS_AT_ONCE: usize = 16;

impl LonghornController {
    /// Exports again, concurrently, every replica here whose export is gone
    /// ([`lost_exports`]), and lists the target again when one was made.
    pub(super) async fn reexport_replicas(
        &self,
        inv: &mut Inventory,
        node: &NodeConfig,
        replicas: &[Typed<LonghornReplica>],
        engines: &[Typed<LonghornEngine>],
    ) -> Result<(), ControllerError> {
        let running: Vec<&Typed<LonghornEngine>> = engines
            .iter()
            .filter(|e| e.metadata.phase == Phase::Running)
            .collect();
        let local = local_replicas(replicas);
        // no replica shared through its export counts out: those held are
        // then a superset of the replicas' step's, and it decides the rest
        let held = held(&running, &local, &self.thin.exported_dsts(), &BTreeSet::new());
        let lost = lost_exports(inv, replicas, &held, self.session.id());
        if lost.is_empty() {
            return Ok(());
        }
        // the replicas' step names a bad address
        let Ok(addr) = self.instance_ip(node) else {
            return Ok(());
        };
        let started = Instant::now();
        if !inv.tcp_transport {
            match self.ops.ensure_transport().await {
                Ok(_) => inv.tcp_transport = true,
                Err(e) => {
                    tracing::warn!(
                        replicas = lost.len(),
                        "the NVMe/TCP transport for the replicas' exports: {}",
                        super::chain(&e)
                    );
                    return Ok(());
                }
            }
        }
        // the futures made before the stream (a closure in it is not Send
        // enough for the controller's boxed future)
        let listed: &Inventory = inv;
        let each: Vec<_> = lost
            .into_iter()
            .map(|r| self.reexport_one(listed, node, addr, r))
            .collect();
        let results: Vec<(&str, Result<(), InstanceError>)> = futures::stream::iter(each)
            .buffer_unordered(REEXPORTS_AT_ONCE)
            .collect()
            .await;
        let mut failed = 0;
        for (replica, r) in &results {
            if let Err(e) = r {
                failed += 1;
                tracing::warn!(replica, "exporting the replica again: {}", e.text());
            }
        }
        let made = results.len() - failed;
        tracing::info!(
            made,
            failed,
            ms = started.elapsed().as_millis() as u64,
            "replica exports made again"
        );
        if made > 0 {
            *inv = Inventory::load(&self.client).await?;
        }
        Ok(())
    }
}

impl LonghornController {
    /// Replica `r` exported on `addr` as its own step would export it.
    async fn reexport_one<'a>(
        &self,
        inv: &Inventory,
        node: &NodeConfig,
        addr: IpAddr,
        r: &'a Typed<LonghornReplica>,
    ) -> (&'a str, Result<(), InstanceError>) {
        let made = async {
            let name = ObjectName::parse("replica", r.id())?;
            let nqn = naming::replica_nqn(&name)?;
            let alias = naming::replica_alias(&r.spec.disk, name.as_str());
            let spec = self.export_spec(node, addr, r.spec.port_start);
            let ns = naming::namespace_id(name.as_str());
            self.export_replica(inv, &nqn, &alias, ns, &spec).await
        };
        (r.id(), made.await)
    }
}

/// The replicas of `replicas` whose export a restart of the target took
/// away and that can be exported again as they are: running and not made
/// only to be removed, their lvol listed at its size, no subsystem of
/// theirs, not `held` by an engine here (its raid1 claims the lvol), and no
/// revert or rebuild start of this `session` to carry out first (the
/// replicas' step does those, then exports).
pub(super) fn lost_exports<'a>(
    inv: &Inventory,
    replicas: &'a [Typed<LonghornReplica>],
    held: &BTreeMap<&str, &str>,
    session: u64,
) -> Vec<&'a Typed<LonghornReplica>> {
    replicas
        .iter()
        .filter(|r| r.metadata.phase == Phase::Running && !r.spec.cleanup)
        .filter(|r| !held.contains_key(r.id()))
        .filter(|r| {
            r.spec.revert.as_ref().is_none_or(|rq| rq.session != session)
                && r.spec.dst_start.as_ref().is_none_or(|rq| rq.session != session)
        })
        .filter(|r| {
            let Ok(name) = ObjectName::parse("replica", r.id()) else {
                return false;
            };
            let Ok(nqn) = naming::replica_nqn(&name) else {
                return false;
            };
            let alias = naming::replica_alias(&r.spec.disk, name.as_str());
            let Some(lvol) = inv.lvols.get(&alias) else {
                return false;
            };
            // a replica to grow is the replicas' step's
            let size = inv
                .bdevs
                .get(&lvol.uuid)
                .map_or(r.spec.size_bytes, |b| u64::from(b.block_size) * b.num_blocks);
            size >= r.spec.size_bytes && inv.subsystem(nqn.as_str()).is_none()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::controllers::longhorn::NAME;
    use crate::resources::engine::{DiskStatus, Engine, ObjectState};
    use crate::runtime::{Controller, ReconcileContext};
    use crate::spdk::rpc::ByNqn;
    use crate::spdk::{SpdkClient, SpdkDouble};

    const MIB: u64 = 1 << 20;

    fn replica(volume: &str, port: u16) -> LonghornReplica {
        serde_json::from_value(json!({
            "volume": volume, "disk": "d", "sizeBytes": MIB, "portStart": port, "portEnd": port
        }))
        .expect("replica")
    }

    /// One reconcile of a new controller (talon started again) on `state`.
    async fn pass(socket: &std::path::Path, state: &crate::runtime::State) {
        let c = LonghornController::new(SpdkClient::new(socket));
        let mut ctx = ReconcileContext::new(state.clone(), NAME, c.inputs(), c.outputs());
        c.reconcile(&mut ctx).await.expect("reconcile");
        ctx.cleanup_outputs().expect("cleanup");
    }

    fn nqn(replica: &str) -> String {
        let name = ObjectName::parse("replica", replica).expect("name");
        naming::replica_nqn(&name).expect("nqn").as_str().to_owned()
    }

    /// After spdk_tgt restarted (its exports gone, the lvols back with their
    /// lvstore), one reconcile makes every replica's export again in one
    /// concurrent step: each replica's subsystem is made before any of them
    /// gets its namespace (before, one replica after the other), all before
    /// the engine here is served; one export that fails does not stop the
    /// others and is made by the replica's own step; a replica the engine
    /// here holds stays unexported.
    #[tokio::test]
    async fn lost_replica_exports_come_back_together_before_the_engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let double = SpdkDouble::start(dir.path().join("spdk.sock"))
            .await
            .expect("double");
        let client = SpdkClient::new(double.socket());
        let lvs_uuid = crate::spdk::double::malloc_lvstore(&client, "talon-d")
            .await
            .expect("malloc bdev and lvstore");
        let state = super::super::tests::ready_target_on(&double);
        let disk = DiskStatus {
            engine: Engine::V2,
            state: ObjectState::Ready,
            bdev: "M0".into(),
            lvstore: "talon-d".into(),
            lvstore_uuid: lvs_uuid,
            total_bytes: 64 * MIB,
            free_bytes: 64 * MIB,
            cluster_bytes: MIB,
            message: String::new(),
            // ensured on the target `ready_target_on` reports
            target: Some(crate::resources::engine::TargetInstance {
                pid: None,
                restarts: 0,
            }),
        };
        state.upsert_typed("d", &disk).expect("disk");
        let node = NodeConfig {
            listen_address: "127.0.0.1".into(),
            ..Default::default()
        };
        state.upsert_typed("node", &node).expect("node");
        let served: Vec<String> = (1..=6).map(|i| format!("v{i}-r-0000000{i}")).collect();
        for (i, r) in served.iter().enumerate() {
            let spec = replica(&format!("v{}", i + 1), 20001 + i as u16);
            state.upsert_typed(r, &spec).expect("replica");
        }
        // an engine here over its one local replica (held: its lvol is the engine's)
        let own = "w-r-00000001";
        state.upsert_typed(own, &replica("w", 20010)).expect("replica");
        let engine: LonghornEngine = serde_json::from_value(json!({
            "volume": "w", "sizeBytes": MIB, "replicaAddressMap": {own: "127.0.0.1:20010"},
            "port": 20020
        }))
        .expect("engine");
        state.upsert_typed("w-e-0", &engine).expect("engine");
        pass(double.socket(), &state).await;
        let volume_nqn = naming::volume_nqn(&ObjectName::parse("volume", "w").expect("w"))
            .expect("nqn")
            .as_str()
            .to_owned();
        let mut subsystems = double.subsystem_nqns();
        subsystems.sort();
        let mut want: Vec<String> = served.iter().map(|r| nqn(r)).collect();
        want.push(volume_nqn.clone());
        want.sort();
        assert_eq!(subsystems, want, "served before the restart");

        // the restart: every export gone, the lvols still there
        for n in double.subsystem_nqns() {
            client
                .nvmf_delete_subsystem(&ByNqn { nqn: n })
                .await
                .expect("delete");
        }
        double.fail_nth("nvmf_create_subsystem", 2, -32602, "Invalid parameters");
        let from = double.call_order().len();
        pass(double.socket(), &state).await;
        let calls = double.call_order().split_off(from);
        let at = |method: &str, nqn: &str| {
            calls
                .iter()
                .position(|(m, n)| m == method && n.as_deref() == Some(nqn))
        };
        let mut subsystems = double.subsystem_nqns();
        subsystems.sort();
        assert_eq!(subsystems, want, "every export back: {calls:?}");
        let made: Vec<usize> = served
            .iter()
            .map(|r| at("nvmf_create_subsystem", &nqn(r)).expect("made"))
            .collect();
        let namespaces: Vec<usize> = served
            .iter()
            .map(|r| at("nvmf_subsystem_add_ns", &nqn(r)).expect("namespace"))
            .collect();
        assert!(
            made.iter().max() < namespaces.iter().min(),
            "every replica's subsystem asked for before any namespace (together): {calls:?}"
        );
        // the one whose subsystem failed was made again, by its own step
        let tries = |r: &String| {
            calls
                .iter()
                .filter(|(m, n)| m == "nvmf_create_subsystem" && n.as_deref() == Some(&nqn(r)))
                .count()
        };
        let (retried, together): (Vec<&String>, Vec<&String>) = served.iter().partition(|r| tries(r) > 1);
        assert_eq!(retried.len(), 1, "one failed and was made again: {calls:?}");
        let engine_made = at("nvmf_create_subsystem", &volume_nqn).expect("engine export");
        for r in together {
            let listening = at("nvmf_subsystem_add_listener", &nqn(r)).expect("listener");
            assert!(
                listening < engine_made,
                "{r} listening before the engine is served: {calls:?}"
            );
        }
        assert!(
            at("nvmf_create_subsystem", &nqn(own)).is_none(),
            "a held replica is not exported"
        );
    }
}
