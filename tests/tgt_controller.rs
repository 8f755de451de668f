//! The V1 engine controllers on an in-memory runtime, against a real tgtd and
//! real libiscsi initiators: a desired `Volume` becomes a served LUN, grows,
//! comes back after tgtd dies, and is deleted once nobody is logged in.

mod tgt_common;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use talon::controllers::engine::v1_target::TgtdController;
use talon::controllers::engine::v1_volume::V1VolumeController;
use talon::resources::config::{NodeConfig, Snapshot, Volume};
use talon::resources::engine::{
    Engine, EngineStatus, ObjectState, SnapshotStatus, TGTD_STATUS_ID, TargetStatus,
};
use talon::runtime::State;
use talon::runtime::testing::{TestRuntime, eventually};
use talon::tgt::{Tgtd, TgtdConfig};
use tgt_common::{Libiscsi, read_capacity_as, ready};

const WAIT: Duration = Duration::from_secs(30);
/// The initiator the node allows (exports reach nobody else).
const INITIATOR: &str = "iqn.2025-01.io.talon.test:c";

fn engine_status(state: &State, id: &str) -> Option<EngineStatus> {
    state.get_typed::<EngineStatus>(id).ok().flatten().map(|t| t.spec)
}

fn volume(size: u64) -> Volume {
    serde_json::from_value(json!({"sizeBytes": size, "engine": "v1"})).expect("volume")
}

/// Stops a tgtd the controller may have left behind if the test fails midway.
struct Cleanup(TgtdConfig);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(Some(t)) = Tgtd::adopt(self.0.clone()) {
            let _ = t.stop();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn desired_volume_is_served_grown_restored_and_deleted() {
    if !ready("desired_volume_is_served_grown_restored_and_deleted") {
        return;
    }
    let data = tempfile::tempdir().expect("data dir");
    let port = tgt_common::free_port();
    let portal: SocketAddr = format!("127.0.0.1:{port}").parse().expect("portal");
    let tgtd_cfg = TgtdConfig::new(data.path().join("run/tgtd"), portal);
    let _cleanup = Cleanup(tgtd_cfg.clone());
    let admin = tgtd_cfg.admin();
    let (cfg2, data_dir) = (tgtd_cfg.clone(), data.path().to_path_buf());
    // auto volumes on an auto node go to V2 here: V1 serves the explicit v1 volumes only
    let rt = TestRuntime::start(move |rt| {
        rt.register(TgtdController::with_config(cfg2, Engine::V2))?;
        rt.register(V1VolumeController::new(data_dir, admin, Engine::V2))
    })
    .expect("runtime");
    let state = rt.state.clone();
    let node = NodeConfig {
        iscsi_port: port,
        allowed_hosts: vec![INITIATOR.to_string()],
        ..NodeConfig::default()
    };
    state.create_typed("node", "", &node).expect("node config");
    state.create_typed("cv1", "", &volume(16 << 20)).expect("volume");

    let ready_status = eventually("cv1 served", WAIT, || async {
        engine_status(&state, "cv1").filter(|s| s.state == ObjectState::Ready)
    })
    .await;
    let export = &ready_status.exports[0];
    assert_eq!(
        (export.transport.as_str(), export.port, export.lun),
        ("iscsi", port, 1)
    );
    // V1 keeps one file per volume: a new volume that asks for two replicas is refused, by name
    let mut two = volume(16 << 20);
    two.replicas = 2;
    state.create_typed("two", "", &two).expect("volume");
    let refused = eventually("two refused", WAIT, || async {
        engine_status(&state, "two").filter(|s| s.state == ObjectState::Failed)
    })
    .await;
    assert!(
        refused
            .message
            .starts_with("volume two: the V1 engine keeps one replica (one file), not 2"),
        "{refused:?}"
    );
    assert!(refused.exports.is_empty(), "{refused:?}");
    state.destroy("config", "Volume", "two", "").expect("delete two");
    assert_eq!(export.name, "iqn.2025-01.io.talon:cv1");
    let url = format!("iscsi://{portal}/{}/1", export.name);
    assert_eq!(read_capacity_as(&url, Some(INITIATOR)), 16 << 20);
    assert!(data.path().join("v1/volumes/cv1.img").exists());

    // grow
    state
        .update_typed("cv1", "", None, &volume(32 << 20))
        .expect("grow");
    eventually("cv1 grown", WAIT, || async {
        engine_status(&state, "cv1").filter(|s| s.size_bytes == 32 << 20)
    })
    .await;
    assert_eq!(
        read_capacity_as(&url, Some(INITIATOR)),
        32 << 20,
        "initiator sees the new size"
    );

    // a snapshot on a filesystem without reflink fails clearly
    let snap: Snapshot = serde_json::from_value(json!({"volume": "cv1", "name": "s1"})).expect("snapshot");
    state.create_typed("cv1@s1", "", &snap).expect("snapshot");
    let s = eventually("snapshot status", WAIT, || async {
        state
            .get_typed::<SnapshotStatus>("cv1@s1")
            .ok()
            .flatten()
            .map(|t| t.spec)
    })
    .await;
    if s.state == ObjectState::Failed {
        assert!(s.message.contains("does not support reflink"), "{}", s.message);
    }

    // tgtd dies: the controller starts another and the volume is served again
    let first = eventually("tgtd status", WAIT, || async {
        state
            .get_typed::<TargetStatus>(TGTD_STATUS_ID)
            .ok()
            .flatten()
            .and_then(|t| t.spec.pid)
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill tgtd");
    let restarted = eventually("tgtd restarted", WAIT, || async {
        state
            .get_typed::<TargetStatus>(TGTD_STATUS_ID)
            .ok()
            .flatten()
            .map(|t| t.spec)
            .filter(|t| t.restarts == 1 && t.state == ObjectState::Ready && t.pid != Some(first))
    })
    .await;
    assert!(restarted.version.starts_with("1."), "{restarted:?}");
    eventually("cv1 re-exported", WAIT, || async {
        let out = std::process::Command::new("iscsi-readcapacity16")
            .args(["-i", INITIATOR, &url])
            .output()
            .ok()?;
        out.status.success().then_some(())
    })
    .await;

    // delete waits for the initiator to log out, then removes everything
    let lib = Libiscsi::load().expect("libiscsi");
    let session = lib
        .connect(&portal.to_string(), &export.name, INITIATOR, None)
        .expect("login");
    state.destroy("config", "Volume", "cv1", "").expect("delete");
    let deleting = eventually("delete waits", WAIT, || async {
        engine_status(&state, "cv1").filter(|s| s.state == ObjectState::Deleting)
    })
    .await;
    assert!(deleting.message.contains(INITIATOR), "{}", deleting.message);
    assert!(
        data.path().join("v1/volumes/cv1.img").exists(),
        "data kept while logged in"
    );
    drop(session);
    eventually("cv1 gone", WAIT, || async {
        state.get("config", "Volume", "cv1").is_none().then_some(())
    })
    .await;
    assert!(!data.path().join("v1/volumes/cv1.img").exists(), "file removed");
    // a snapshot that outlived its volume can still be deleted (the finalizer is released)
    state
        .destroy("config", "Snapshot", "cv1@s1", "")
        .expect("delete snapshot");
    eventually("cv1@s1 gone", WAIT, || async {
        state.get("config", "Snapshot", "cv1@s1").is_none().then_some(())
    })
    .await;
    eventually("statuses gone and tgtd stopped", WAIT, || async {
        (engine_status(&state, "cv1").is_none()
            && state.get("engine", "TargetStatus", TGTD_STATUS_ID).is_none())
        .then_some(())
    })
    .await;
    rt.stop().await;
}

/// A volume created while tgtd is gone (killed; the target controller has not
/// noticed yet) waits for the new tgtd instead of failing: its status is
/// `creating` ("waiting for tgtd"), never `failed`, until it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_while_tgtd_is_gone_waits_instead_of_failing() {
    if !ready("a_create_while_tgtd_is_gone_waits_instead_of_failing") {
        return;
    }
    let data = tempfile::tempdir().expect("data dir");
    let port = tgt_common::free_port();
    let portal: SocketAddr = format!("127.0.0.1:{port}").parse().expect("portal");
    let tgtd_cfg = TgtdConfig::new(data.path().join("run/tgtd"), portal);
    let _cleanup = Cleanup(tgtd_cfg.clone());
    let admin = tgtd_cfg.admin();
    let (cfg2, data_dir) = (tgtd_cfg.clone(), data.path().to_path_buf());
    let rt = TestRuntime::start(move |rt| {
        rt.register(TgtdController::with_config(cfg2, Engine::V2))?;
        rt.register(V1VolumeController::new(data_dir, admin, Engine::V2))
    })
    .expect("runtime");
    let state = rt.state.clone();
    let node = NodeConfig {
        iscsi_port: port,
        allowed_hosts: vec![INITIATOR.to_string()],
        ..NodeConfig::default()
    };
    state.create_typed("node", "", &node).expect("node config");
    state.create_typed("wa", "", &volume(8 << 20)).expect("volume");
    eventually("wa served", WAIT, || async {
        engine_status(&state, "wa").filter(|s| s.state == ObjectState::Ready)
    })
    .await;
    let mut seen = Vec::new();
    let mut killed = 0;
    for round in 0..3 {
        let pid = eventually("a new tgtd ready", WAIT, || async {
            state
                .get_typed::<TargetStatus>(TGTD_STATUS_ID)
                .ok()
                .flatten()
                .map(|t| t.spec)
                .filter(|t| t.state == ObjectState::Ready)
                .and_then(|t| t.pid)
                .filter(|p| *p != killed)
        })
        .await;
        killed = pid;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill tgtd");
        let id = format!("wb{round}");
        state.create_typed(&id, "", &volume(8 << 20)).expect("volume");
        let start = std::time::Instant::now();
        loop {
            let s = engine_status(&state, &id);
            if let Some(s) = &s {
                assert_ne!(
                    s.state,
                    ObjectState::Failed,
                    "{id} failed while tgtd restarted: {}",
                    s.message
                );
                if !seen.contains(&s.message) && s.state == ObjectState::Creating {
                    seen.push(s.message.clone());
                }
                if s.state == ObjectState::Ready {
                    break;
                }
            }
            assert!(start.elapsed() < WAIT, "{id} not served: {s:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    eprintln!("statuses seen while tgtd restarted: {seen:?}");
    rt.stop().await;
}
