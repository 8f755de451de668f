//! The V2 engine's target and disk controllers with a real spdk_tgt
//! (`TALON_SPDK_DIR` set; `--no-huge -s 1024`): the controller starts the
//! target, a file disk gets its lvstore; a new talon (new runtime) imports
//! that lvstore (same UUID) instead of recreating it; after `kill -9` of
//! spdk_tgt the controller restarts it (restarts == 1) and the disk comes back.
//! One test fn, in the nextest group `real-spdk` (one at a time).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use talon::controllers::engine::selection::{EngineSelection, SpdkOptions};
use talon::controllers::engine::spdk_disk::SpdkDiskController;
use talon::controllers::engine::spdk_target::SpdkTargetController;
use talon::resources::config::Disk;
use talon::resources::engine::SPDK_STATUS_ID;
use talon::resources::engine::{DiskStatus, ObjectState, TargetStatus};
use talon::runtime::State;
use talon::runtime::testing::{TestRuntime, eventually};

const WAIT: Duration = Duration::from_secs(90);

fn start(run_dir: &Path, spdk_dir: &Path, state: State) -> TestRuntime {
    let opts = SpdkOptions {
        spdk_tgt: None,
        spdk_dir: Some(spdk_dir.to_path_buf()),
        path_var: None,
        no_huge: true,
        no_huge_mem_mib: 1024,
        // other jobs may run SPDK on core 0
        extra_args: vec!["--disable-cpumask-locks".into()],
        ..SpdkOptions::default()
    };
    let selection = EngineSelection::detect(&opts);
    assert!(selection.v2_available, "{}", selection.reason);
    let cfg = opts.target_config(run_dir);
    let run = run_dir.to_path_buf();
    TestRuntime::start_on(state, move |rt| {
        rt.register(SpdkTargetController::new(cfg, selection))?;
        rt.register(SpdkDiskController::new(&run, talon::host::HostRoot::new(&run)))
    })
    .expect("runtime")
}

async fn disk_ready(st: &State) -> DiskStatus {
    eventually("DiskStatus d1 ready", WAIT, || async {
        st.get_typed::<DiskStatus>("d1")
            .expect("get")
            .map(|d| d.spec)
            .filter(|d| d.state == ObjectState::Ready)
    })
    .await
}

async fn target(st: &State, pred: impl Fn(&TargetStatus) -> bool) -> TargetStatus {
    eventually("TargetStatus spdk", WAIT, || async {
        st.get_typed::<TargetStatus>(SPDK_STATUS_ID)
            .expect("get")
            .map(|t| t.spec)
            .filter(|t| t.state == ObjectState::Ready && pred(t))
    })
    .await
}

fn gone(pid: u32) -> bool {
    kill(Pid::from_raw(pid as i32), None).is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_target_and_disk_survive_restarts() {
    let Some(spdk_dir) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP real_spdk_target_and_disk_survive_restarts: TALON_SPDK_DIR not set");
        return;
    };
    if !spdk_dir.join("build/bin/spdk_tgt").exists() {
        eprintln!(
            "SKIP real_spdk_target_and_disk_survive_restarts: no build/bin/spdk_tgt under {}",
            spdk_dir.display()
        );
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let img = d.path().join("d1.img");
    let disk = Disk {
        path: Some(img.display().to_string()),
        pci: None,
        size_bytes: Some(256 << 20),
        cluster_mib: 1,
        block_size: None,
        format: 0,
    };

    // 1. talon starts spdk_tgt; the file disk gets an lvstore
    let rt = start(d.path(), &spdk_dir, State::in_memory());
    rt.state.create_typed("d1", "", &disk).expect("disk");
    let t1 = target(&rt.state, |_| true).await;
    assert!(t1.version.starts_with("SPDK v"), "{t1:?}");
    assert_eq!(t1.restarts, 0);
    let pid1 = t1.pid.expect("pid");
    assert_ne!(pid1, std::process::id());
    let s1 = disk_ready(&rt.state).await;
    assert_eq!(s1.lvstore, "talon-d1");
    assert_eq!(s1.cluster_bytes, 1 << 20);
    assert!(s1.total_bytes > 200 << 20, "{s1:?}");
    eprintln!(
        "disk d1: lvstore {} uuid {} on spdk_tgt pid {pid1}",
        s1.lvstore, s1.lvstore_uuid
    );

    // 2. a clean stop of talon stops the target it started
    rt.stop().await;
    assert!(gone(pid1), "spdk_tgt pid {pid1} still runs after a clean stop");

    // 3. a new talon with the same desired state: new target, lvstore imported
    let rt = start(d.path(), &spdk_dir, State::in_memory());
    rt.state.create_typed("d1", "", &disk).expect("disk");
    let t2 = target(&rt.state, |_| true).await;
    let pid2 = t2.pid.expect("pid");
    assert_ne!(pid2, pid1);
    let s2 = disk_ready(&rt.state).await;
    assert_eq!(
        s2.lvstore_uuid, s1.lvstore_uuid,
        "imported after the restart, not recreated"
    );

    // 4. kill -9: restarted with restarts == 1, the disk comes back
    kill(Pid::from_raw(pid2 as i32), Signal::SIGKILL).expect("kill -9");
    let t3 = target(&rt.state, |t| t.restarts == 1).await;
    let pid3 = t3.pid.expect("pid");
    assert_ne!(pid3, pid2);
    let s3 = eventually("disk d1 back after the crash", WAIT, || async {
        let s = disk_ready(&rt.state).await;
        let c = talon::spdk::SpdkClient::new(d.path().join("spdk.sock"));
        c.bdev("talon-disk-d1").await.ok().flatten().map(|_| s)
    })
    .await;
    assert_eq!(s3.lvstore_uuid, s1.lvstore_uuid);
    rt.stop().await;
    assert!(gone(pid3), "spdk_tgt pid {pid3} still runs after a clean stop");
    eprintln!(
        "real spdk_tgt: started {pid1}, stopped; restarted {pid2}, killed; restarted {pid3}; lvstore {} kept",
        s1.lvstore_uuid
    );
}
