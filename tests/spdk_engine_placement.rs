//! The V2 engine's target, disk and volume controllers together against
//! `SpdkDouble` (a TEST DOUBLE of spdk_tgt: recorded v26.05 semantics, no
//! data): the defects of issue 19 as a user meets them.
//! - a 2-replica volume listing two disks that are failing waits, saying
//!   which disk failed and why (state failed, so `--wait` ends at once);
//!   when one disk comes up it still waits (never both replicas on one
//!   disk); when the second comes up its replicas land on the two disks;
//! - after a target restart, 20 volumes set up 16 at a time make one TCP
//!   transport: `nvmf_create_transport` is called once;
//! - a served volume whose only disk failed reports the disk's error;
//! - a volume's export left frozen by a stop (between a snapshot's freeze and
//!   its thaw) is thawed by the next talon once it serves the volume.
//!
//! The same against a real spdk_tgt: `tests/spdk_engine_restart_real.rs`.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use talon::controllers::engine::selection::EngineSelection;
use talon::controllers::engine::spdk_disk::SpdkDiskController;
use talon::controllers::engine::spdk_target::SpdkTargetController;
use talon::controllers::engine::spdk_volume::SpdkVolumeController;
use talon::resources::config::{Disk, NodeConfig, Volume};
use talon::resources::engine::{DiskStatus, EngineStatus, ObjectState, ReplicaStatus};
use talon::runtime::State;
use talon::runtime::testing::{TestRuntime, eventually};
use talon::spdk::rpc::GetLvols;
use talon::spdk::{SpdkClient, SpdkDouble};

const WAIT: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;

fn start(run_dir: &Path) -> TestRuntime {
    let rt = start_on(run_dir, State::in_memory());
    rt.state
        .create_typed("node", "", &NodeConfig::default())
        .expect("node");
    rt
}

/// The controllers on `state` (a restart of talon over the same store).
fn start_on(run_dir: &Path, state: State) -> TestRuntime {
    let mut cfg = talon::spdk::target::TargetConfig::new(run_dir);
    // never spawn a real one here: only the double on the socket is adopted
    cfg.spdk_tgt = Some(run_dir.join("no-spdk_tgt"));
    cfg.spdk_dir = None;
    let run = run_dir.to_path_buf();
    let client = SpdkClient::new(run_dir.join("spdk.sock"));
    TestRuntime::start_on(state, move |rt| {
        rt.register(SpdkTargetController::new(
            cfg,
            EngineSelection::fixed(true, "SpdkDouble (test double)"),
        ))?;
        rt.register(SpdkDiskController::new(&run, talon::host::HostRoot::new(&run)))?;
        rt.register(SpdkVolumeController::new(client, false))
    })
    .expect("runtime")
}

fn file_disk(path: &Path, size: Option<u64>) -> Disk {
    Disk {
        path: Some(path.display().to_string()),
        pci: None,
        size_bytes: size,
        cluster_mib: 1,
        block_size: None,
        format: 0,
    }
}

fn volume(replicas: u32, disks: &[&str]) -> Volume {
    serde_json::from_value(
        json!({"sizeBytes": 16 * MIB, "replicas": replicas, "engine": "v2", "disks": disks}),
    )
    .expect("volume")
}

fn engine(st: &State, id: &str) -> Option<EngineStatus> {
    st.get_typed::<EngineStatus>(id).ok().flatten().map(|t| t.spec)
}

async fn disk_is(st: &State, id: &str, want: ObjectState) -> DiskStatus {
    eventually(&format!("DiskStatus {id} {want:?}"), WAIT, || async {
        st.get_typed::<DiskStatus>(id)
            .expect("get")
            .map(|d| d.spec)
            .filter(|d| d.state == want)
    })
    .await
}

/// Volume `id`'s engine status once it is Ready.
async fn served(st: &State, id: &str) -> EngineStatus {
    eventually(&format!("{id} ready"), WAIT, || async {
        engine(st, id).filter(|e| e.state == ObjectState::Ready)
    })
    .await
}

async fn lvols_of(c: &SpdkClient, vol: &str) -> Vec<String> {
    let mut v: Vec<String> = c
        .bdev_lvol_get_lvols(&GetLvols::default())
        .await
        .expect("lvols")
        .into_iter()
        .map(|l| l.alias)
        .filter(|a| {
            a.split('/')
                .nth(1)
                .is_some_and(|n| n.starts_with(&format!("{vol}-r")))
        })
        .collect();
    v.sort();
    v
}

/// A run dir with the double on its socket, the controllers started on it,
/// and a client of the double.
async fn on_double() -> (tempfile::TempDir, SpdkDouble, TestRuntime, SpdkClient) {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let rt = start(d.path());
    let client = SpdkClient::new(d.path().join("spdk.sock"));
    (d, double, rt, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_wait_for_two_disks_and_never_share_one() {
    let (d, _double, rt, client) = on_double().await;
    let st = rt.state.clone();
    // both disks fail: files that are not there and no size to make them with
    let (img0, img1) = (d.path().join("ram0.img"), d.path().join("ram1.img"));
    st.create_typed("ram0", "", &file_disk(&img0, None))
        .expect("disk");
    st.create_typed("ram1", "", &file_disk(&img1, None))
        .expect("disk");
    st.create_typed("v", "", &volume(2, &["ram0", "ram1"]))
        .expect("volume");
    let e0 = disk_is(&st, "ram0", ObjectState::Failed).await;
    disk_is(&st, "ram1", ObjectState::Failed).await;

    let failed = eventually("v failed naming both disks", WAIT, || async {
        engine(&st, "v").filter(|e| {
            e.state == ObjectState::Failed
                && e.message.contains("ram0 failed")
                && e.message.contains("ram1 failed")
        })
    })
    .await;
    assert!(
        failed.message.contains(&e0.message),
        "the disk's own error: {}",
        failed.message
    );

    // ram0 comes up: still no placement (one disk for two replicas)
    std::fs::File::create(&img0)
        .and_then(|f| f.set_len(256 * MIB))
        .expect("ram0 file");
    disk_is(&st, "ram0", ObjectState::Ready).await;
    let waiting = eventually("v says ram0 is ready, ram1 failed", WAIT, || async {
        engine(&st, "v").filter(|e| e.message.contains("ram0 is ready") && e.message.contains("ram1 failed"))
    })
    .await;
    assert_eq!(waiting.state, ObjectState::Failed, "{waiting:?}");
    assert!(
        lvols_of(&client, "v").await.is_empty(),
        "nothing placed while only one disk is ready"
    );

    // ram1 comes up: one replica on each
    std::fs::File::create(&img1)
        .and_then(|f| f.set_len(256 * MIB))
        .expect("ram1 file");
    let ready = served(&st, "v").await;
    assert_eq!(ready.replicas.len(), 2, "{ready:?}");
    let mut disks: Vec<String> = ["v-r0", "v-r1"]
        .iter()
        .map(|r| {
            st.get_typed::<ReplicaStatus>(r)
                .expect("get")
                .expect("replica status")
                .spec
                .disk
        })
        .collect();
    disks.sort();
    assert_eq!(disks, vec!["ram0", "ram1"]);
    let lvols = lvols_of(&client, "v").await;
    let lvstores: std::collections::BTreeSet<&str> =
        lvols.iter().filter_map(|a| a.split('/').next()).collect();
    assert_eq!(lvstores.len(), 2, "one replica per disk: {lvols:?}");
    rt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_volumes_after_a_target_restart_make_one_transport() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let rt = start(d.path());
    let st = rt.state.clone();
    st.create_typed("d1", "", &file_disk(&d.path().join("d1.img"), Some(512 * MIB)))
        .expect("disk");
    st.create_typed("d2", "", &file_disk(&d.path().join("d2.img"), Some(512 * MIB)))
        .expect("disk");
    let names: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        st.create_typed(n, "", &volume(1 + (i % 2) as u32, &[]))
            .expect("volume");
    }
    for n in &names {
        served(&st, n).await;
    }
    assert_eq!(double.calls("nvmf_create_transport"), 1);

    // the target restarts (objects vanish, lvstores wait in the files); the
    // volumes are set up again, 16 at a time
    double.restart().await.expect("restart");
    let client = SpdkClient::new(d.path().join("spdk.sock"));
    eventually("all 20 exported again", WAIT, || async {
        let inv = talon::spdk::volume::Inventory::load(&client).await.ok()?;
        names
            .iter()
            .all(|n| {
                inv.subsystem(&format!("{}:vol:{n}", talon::names::NQN_PREFIX))
                    .is_some_and(|s| s.namespaces.len() == 1)
            })
            .then_some(())
    })
    .await;
    // the double's counters restart with it
    assert_eq!(
        double.calls("nvmf_create_transport"),
        1,
        "one transport per target, made once"
    );
    let transports = client
        .nvmf_get_transports(&Default::default())
        .await
        .expect("transports");
    assert_eq!(transports.len(), 1);
    rt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_whose_disk_failed_says_so() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let rt = start(d.path());
    let st = rt.state.clone();
    let img = d.path().join("d1.img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(256 * MIB))
        .expect("disk file");
    st.create_typed("d1", "", &file_disk(&img, None)).expect("disk");
    st.create_typed("v", "", &volume(1, &[])).expect("volume");
    served(&st, "v").await;

    // the disk's file goes, then the target restarts: the disk cannot come back
    std::fs::remove_file(&img).expect("rm");
    double.restart().await.expect("restart");
    let e = disk_is(&st, "d1", ObjectState::Failed).await;
    let v = eventually("v failed, naming the disk's error", WAIT, || async {
        engine(&st, "v").filter(|s| s.state == ObjectState::Failed && s.message.contains("disk d1 failed"))
    })
    .await;
    assert!(v.message.contains(&e.message), "{}", v.message);
    assert!(v.message.contains("v-r0 on disk d1"), "{}", v.message);
    rt.stop().await;
}

/// A stop between a snapshot's freeze and its thaw leaves the volume's export
/// ANA inaccessible: its hosts' I/O stays queued. The next talon (the same
/// store, the target left running) thaws it once it serves the volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_left_frozen_by_a_stop_is_thawed_at_the_next_start() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let rt = start(d.path());
    let st = rt.state.clone();
    st.create_typed("d1", "", &file_disk(&d.path().join("d1.img"), Some(512 * MIB)))
        .expect("disk");
    st.create_typed("fz", "", &volume(1, &[])).expect("volume");
    served(&st, "fz").await;
    rt.stop().await;

    // frozen as a freeze leaves it (by hand: a freeze made in this process
    // would be held by it, and the next talon runs in it)
    let client = SpdkClient::new(d.path().join("spdk.sock"));
    let nqn = format!("{}:vol:fz", talon::names::NQN_PREFIX);
    let sub = client
        .subsystem(&nqn)
        .await
        .expect("subsystems")
        .expect("the volume's export");
    assert!(!sub.listen_addresses.is_empty());
    for l in &sub.listen_addresses {
        client
            .nvmf_subsystem_listener_set_ana_state(&talon::spdk::rpc::ListenerAnaState {
                nqn: nqn.clone(),
                listen_address: l.clone(),
                ana_state: talon::spdk::rpc::AnaState::Inaccessible,
            })
            .await
            .expect("inaccessible");
    }
    assert_eq!(double.frozen_listeners(&nqn).len(), sub.listen_addresses.len());

    let rt = start_on(d.path(), st);
    eventually("the export thawed", WAIT, || async {
        double.frozen_listeners(&nqn).is_empty().then_some(())
    })
    .await;
    rt.stop().await;
}

/// The replicas of a volume share one block size (SPDK's raid1 refuses
/// members of two): a 512 B disk with the most free room is passed over
/// for two 4 KiB disks, and a volume listing a 512 B and a 4 KiB disk waits,
/// saying why, with nothing made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volumes_replicas_go_to_disks_of_one_block_size() {
    let (d, _double, rt, client) = on_double().await;
    let st = rt.state.clone();
    let disk = |name: &str, mib: u64, block: u32| Disk {
        block_size: Some(block),
        ..file_disk(&d.path().join(format!("{name}.img")), Some(mib * MIB))
    };
    st.create_typed("k4a", "", &disk("k4a", 64, 4096)).expect("disk");
    st.create_typed("b512", "", &disk("b512", 512, 512))
        .expect("disk");
    st.create_typed("k4b", "", &disk("k4b", 64, 4096)).expect("disk");
    for (id, bs) in [("k4a", 4096), ("b512", 512), ("k4b", 4096)] {
        let s = disk_is(&st, id, ObjectState::Ready).await;
        assert!(s.free_bytes > 0, "{s:?}");
        let lvs = client
            .bdev_lvol_get_lvstores(&talon::spdk::rpc::LvstoreSelector::default())
            .await
            .expect("lvstores");
        let l = lvs.iter().find(|l| l.name == s.lvstore).expect("its lvstore");
        assert_eq!(l.block_size, bs, "{id}");
    }

    st.create_typed("m", "", &volume(2, &[])).expect("volume");
    served(&st, "m").await;
    let mut disks: Vec<String> = ["m-r0", "m-r1"]
        .iter()
        .map(|r| {
            st.get_typed::<ReplicaStatus>(r)
                .expect("get")
                .expect("replica")
                .spec
                .disk
        })
        .collect();
    disks.sort();
    assert_eq!(disks, ["k4a", "k4b"], "the two 4 KiB disks, not the freest");

    st.create_typed("x", "", &volume(2, &["b512", "k4a"]))
        .expect("volume");
    let waiting = eventually("x waits, naming the block sizes", WAIT, || async {
        engine(&st, "x").filter(|e| {
            e.message
                .contains("k4a has 4096-byte blocks, not the 512-byte blocks of the volume's replicas")
        })
    })
    .await;
    assert_ne!(waiting.state, ObjectState::Ready, "{waiting:?}");
    assert!(lvols_of(&client, "x").await.is_empty(), "nothing made for x");
    rt.stop().await;
}
