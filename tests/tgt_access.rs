//! Who can reach a V1 volume, against a real tgtd, with libiscsi clients run
//! as the unprivileged user `nobody` (what any local user can do): nobody
//! while the volume is attached nowhere; only this host's initiator name
//! while it is attached here; the node's allowed hosts besides. Discovery
//! offers a stranger nothing.

mod tgt_common;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use talon::attach::HostInitiators;
use talon::controllers::engine::v1_target::TgtdController;
use talon::controllers::engine::v1_volume::V1VolumeController;
use talon::names::{Iqn, Nqn};
use talon::resources::config::{FrontendKind, NodeConfig, Volume};
use talon::resources::engine::{Engine, EngineStatus, ObjectState};
use talon::resources::frontend::Attachment;
use talon::runtime::State;
use talon::runtime::testing::{TestRuntime, eventually};
use talon::tgt::{Tgtd, TgtdConfig};
use tgt_common::{ready, tool_as_nobody};

const WAIT: Duration = Duration::from_secs(30);
/// talon's initiator name on this (test) host.
const ME: &str = "iqn.2025-01.io.talon:host.0b7d3c1e-3a43-4bd4-a4a1-4e3d7d4c2f10";
/// Any other initiator.
const STRANGER: &str = "iqn.2025-01.io.example:stranger";
/// An initiator the node allows for every volume.
const ALLOWED: &str = "iqn.2025-01.io.example:allowed";

struct Cleanup(TgtdConfig);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(Some(t)) = Tgtd::adopt(self.0.clone()) {
            let _ = t.stop();
        }
    }
}

fn engine_status(state: &State, id: &str) -> Option<EngineStatus> {
    state.get_typed::<EngineStatus>(id).ok().flatten().map(|t| t.spec)
}

/// Whether `initiator`, as user nobody, can log in and INQUIRE the LUN.
fn can_read(portal: SocketAddr, volume: &str, initiator: &str) -> (bool, String) {
    let url = format!("iscsi://{portal}/iqn.2025-01.io.talon:{volume}/1");
    tool_as_nobody("iscsi-inq", &["-i", initiator, &url])
}

/// The targets SendTargets discovery offers `initiator`, as user nobody.
fn discovered(portal: SocketAddr, initiator: &str) -> String {
    let (_, out) = tool_as_nobody("iscsi-ls", &["-i", initiator, &format!("iscsi://{portal}")]);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_volume_reaches_only_the_host_it_is_attached_to() {
    if !ready("v1_volume_reaches_only_the_host_it_is_attached_to") {
        return;
    }
    let data = tempfile::tempdir().expect("data dir");
    let port = tgt_common::free_port();
    let portal: SocketAddr = format!("127.0.0.1:{port}").parse().expect("portal");
    let tgtd_cfg = TgtdConfig::new(data.path().join("run/tgtd"), portal);
    let _cleanup = Cleanup(tgtd_cfg.clone());
    let admin = tgtd_cfg.admin();
    let (cfg2, data_dir) = (tgtd_cfg.clone(), data.path().to_path_buf());
    let ids = HostInitiators {
        nqn: Nqn::parse("nqn.2014-08.org.nvmexpress:uuid:0b7d3c1e-3a43-4bd4-a4a1-4e3d7d4c2f10").expect("nqn"),
        iqn: Iqn::parse(ME).expect("iqn"),
    };
    // auto volumes on an auto node go to V2 here: V1 serves the explicit v1 volumes only
    let rt = TestRuntime::start(move |rt| {
        rt.register(TgtdController::with_config(cfg2, Engine::V2))?;
        rt.register(V1VolumeController::new(data_dir, admin, Engine::V2).with_initiators(Some(ids)))
    })
    .expect("runtime");
    let state = rt.state.clone();
    state
        .create_typed(
            "node",
            "",
            &NodeConfig {
                iscsi_port: port,
                ..NodeConfig::default()
            },
        )
        .expect("node config");
    let vol: Volume = serde_json::from_value(json!({"sizeBytes": 8 << 20, "engine": "v1"})).expect("volume");
    for v in ["acc1", "acc2"] {
        state.create_typed(v, "", &vol).expect("volume");
    }
    for v in ["acc1", "acc2"] {
        let s = eventually("served", WAIT, || async {
            engine_status(&state, v).filter(|s| s.state == ObjectState::Ready)
        })
        .await;
        assert_eq!(s.exports[0].hosts, Vec::<String>::new(), "{v}: nobody by default");
    }

    // attached nowhere: nobody, not even this host, reaches a volume or sees it
    for who in [ME, STRANGER] {
        let (ok, out) = can_read(portal, "acc1", who);
        assert!(!ok, "{who} read acc1 while it is attached nowhere: {out}");
        let offered = discovered(portal, who);
        assert!(!offered.contains("io.talon:acc"), "{who} discovered {offered}");
    }

    // attached here: this host's initiator name, and only for that volume
    state
        .create_typed(
            "acc1",
            "",
            &Attachment {
                frontend: FrontendKind::Auto,
            },
        )
        .expect("attachment");
    eventually("acc1 allows this host", WAIT, || async {
        engine_status(&state, "acc1").filter(|s| s.exports[0].hosts == [ME])
    })
    .await;
    let (ok, out) = can_read(portal, "acc1", ME);
    assert!(ok, "this host cannot read its attached volume: {out}");
    let (ok, out) = can_read(portal, "acc1", STRANGER);
    assert!(!ok, "a stranger read acc1: {out}");
    let (ok, out) = can_read(portal, "acc2", ME);
    assert!(!ok, "this host read acc2, which it has not attached: {out}");
    let offered = discovered(portal, ME);
    assert!(
        offered.contains("io.talon:acc1") && !offered.contains("io.talon:acc2"),
        "{offered}"
    );
    assert!(!discovered(portal, STRANGER).contains("io.talon:acc"));

    // the node's allowed hosts reach every volume
    let mut node = state.get_typed::<NodeConfig>("node").expect("get").expect("node");
    node.spec.allowed_hosts = vec![ALLOWED.to_string()];
    state
        .update_typed("node", "", Some(node.metadata.version), &node.spec)
        .expect("allow a host");
    eventually("acc2 allows the allowed host", WAIT, || async {
        engine_status(&state, "acc2").filter(|s| s.exports[0].hosts == [ALLOWED])
    })
    .await;
    let (ok, out) = can_read(portal, "acc2", ALLOWED);
    assert!(ok, "the allowed host cannot read acc2: {out}");

    // detached: this host is refused again
    state.destroy("config", "Attachment", "acc1", "").expect("detach");
    eventually("acc1 no longer allows this host", WAIT, || async {
        engine_status(&state, "acc1").filter(|s| s.exports[0].hosts == [ALLOWED])
    })
    .await;
    let (ok, out) = can_read(portal, "acc1", ME);
    assert!(!ok, "this host read acc1 after the detach: {out}");
    rt.stop().await;
}
