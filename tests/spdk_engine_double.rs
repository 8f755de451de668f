//! The V2 engine's target and disk controllers against `SpdkDouble`, a TEST
//! DOUBLE of spdk_tgt (src/spdk/double.rs; it keeps the recorded semantics of
//! spdk_tgt v26.05 but moves no data). The target controller adopts the
//! double on `<run_dir>/spdk.sock` as it would adopt a running spdk_tgt.

use std::path::Path;
use std::time::Duration;

use talon::controllers::engine::selection::EngineSelection;
use talon::controllers::engine::spdk_disk::SpdkDiskController;
use talon::controllers::engine::spdk_target::SpdkTargetController;
use talon::resources::config::Disk;
use talon::resources::engine::SPDK_STATUS_ID;
use talon::resources::engine::{DiskStatus, ObjectState, TargetStatus};
use talon::runtime::State;
use talon::runtime::testing::{TestRuntime, eventually};
use talon::spdk::rpc::{AioCreate, GetLvols, LvolCreate, LvstoreCreate, LvstoreSelector, MallocCreate};
use talon::spdk::{SpdkClient, SpdkDouble};

const WAIT: Duration = Duration::from_secs(30);

fn start(run_dir: &Path, state: State) -> TestRuntime {
    start_with(
        run_dir,
        state,
        EngineSelection::fixed(true, "SpdkDouble (test double)"),
    )
}

fn start_with(run_dir: &Path, state: State, selection: EngineSelection) -> TestRuntime {
    let mut cfg = talon::spdk::target::TargetConfig::new(run_dir);
    // never spawn a real one here: only the double on the socket is adopted
    cfg.spdk_tgt = Some(run_dir.join("no-spdk_tgt"));
    cfg.spdk_dir = None;
    let run = run_dir.to_path_buf();
    // as controllers::register_all gives it: why V2 cannot run here, when it cannot
    let no_v2 = (!selection.v2_available).then(|| selection.reason.clone());
    TestRuntime::start_on(state, move |rt| {
        rt.register(SpdkTargetController::new(cfg, selection))?;
        // the host controller that binds NVMe disks first, on a fixture /sys under run_dir
        rt.register(talon::controllers::host::PciBindController {
            host: talon::host::HostRoot::new(&run),
            interval: Duration::from_millis(100),
        })?;
        rt.register(SpdkDiskController::new(&run, talon::host::HostRoot::new(&run)).without_v2(no_v2))
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

async fn status(st: &State, id: &str, want: ObjectState) -> DiskStatus {
    eventually(&format!("DiskStatus {id} {want:?}"), WAIT, || async {
        st.get_typed::<DiskStatus>(id)
            .expect("get")
            .map(|d| d.spec)
            .filter(|d| d.state == want)
    })
    .await
}

async fn lvstore_names(c: &SpdkClient) -> Vec<String> {
    let mut v: Vec<String> = c
        .bdev_lvol_get_lvstores(&LvstoreSelector::default())
        .await
        .expect("lvstores")
        .into_iter()
        .map(|l| l.name)
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn disk_is_created_then_imported_after_a_target_restart() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let rt = start(d.path(), State::in_memory());
    let st = rt.state.clone();
    let img = d.path().join("disks/d1.img");
    st.create_typed("d1", "", &file_disk(&img, Some(64 << 20)))
        .expect("disk");

    let s = status(&st, "d1", ObjectState::Ready).await;
    assert_eq!(s.bdev, "talon-disk-d1");
    assert_eq!(s.lvstore, "talon-d1");
    assert_eq!(s.cluster_bytes, 1 << 20);
    assert!(s.total_bytes > 0 && s.free_bytes <= s.total_bytes, "{s:?}");
    assert_eq!(std::fs::metadata(&img).expect("sparse file").len(), 64 << 20);
    let t = st
        .get_typed::<TargetStatus>(SPDK_STATUS_ID)
        .expect("get")
        .expect("target")
        .spec;
    assert_eq!(t.state, ObjectState::Ready);
    assert_eq!(
        t.pid,
        Some(std::process::id()),
        "the in-process double is adopted"
    );
    assert_eq!(double.calls("bdev_lvol_create_lvstore"), 1);

    // the target restarts: objects vanish; the lvstore waits in the file.
    // The in-process double keeps its pid, so the target status does not
    // change (as with a keeper that restarts spdk_tgt before talon looks)
    let (_, mut changes) = st.watch(None);
    double.restart().await.expect("restart");
    eventually("talon-disk-d1 attached again", WAIT, || async {
        double
            .bdev_names()
            .contains(&"talon-disk-d1".to_owned())
            .then_some(())
    })
    .await;
    let again = status(&st, "d1", ObjectState::Ready).await;
    // not Ready while its lvstore loaded again: a listing then may miss lvols
    let mut seen = Vec::new();
    loop {
        match changes.try_recv() {
            Ok(e) if e.resource.metadata.type_ == "DiskStatus" && e.resource.metadata.id == "d1" => {
                let d: DiskStatus = serde_json::from_value(e.resource.spec).expect("status");
                seen.push((d.state, d.message));
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::TryRecvError::Empty) => break,
            Err(e) => panic!("store events: {e}"),
        }
    }
    // the pass that meets the restart says why the disk is not ready: the
    // lvstore loading again, or (when that pass's call met the target going
    // down: a connect refused on spdk.sock, or a call whose connection was
    // reset) the failed call, after which the next pass loads it: Failed is
    // not Ready either, so no placement trusts the disk meanwhile
    let loading = seen.iter().position(|(s, m)| {
        (*s == ObjectState::Creating && m.contains("again (the bdev was gone"))
            || (*s == ObjectState::Failed
                && (m.contains("spdk.sock") || m.contains("The SPDK connection closed")))
    });
    let ready = seen.iter().rposition(|(s, _)| *s == ObjectState::Ready);
    assert!(
        matches!((loading, ready), (Some(l), Some(r)) if l < r),
        "loading (or failed on the restart), then ready: {seen:?}"
    );
    assert!(
        seen.iter()
            .take(loading.unwrap_or(0))
            .all(|(s, _)| *s != ObjectState::Ready),
        "never Ready between the restart and the load: {seen:?}"
    );
    assert_eq!(again.lvstore_uuid, s.lvstore_uuid, "imported, not recreated");
    // a reconcile that listed the disk's bdev just before the restart finds
    // no lvstore after it and may try a create, which the target refuses
    // (the bdev is gone; over a real file the blank check refuses first): at
    // most that one, and the lvstore above is the one from before
    assert!(double.calls("bdev_lvol_create_lvstore") <= 1);
    assert!(double.calls("bdev_wait_for_examine") >= 1);
    rt.stop().await;
}

#[tokio::test]
async fn failed_lvstore_create_rolls_back_the_aio_bdev_and_file() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    // the first two lvstore creates fail
    double.fail_nth("bdev_lvol_create_lvstore", 1, -5, "Input/output error");
    double.fail_nth("bdev_lvol_create_lvstore", 2, -5, "Input/output error");
    let rt = start(d.path(), State::in_memory());
    let st = rt.state.clone();
    let img = d.path().join("d1.img");
    let disk = file_disk(&img, Some(32 << 20));
    st.create_typed("d1", "", &disk).expect("disk");

    let failed = status(&st, "d1", ObjectState::Failed).await;
    assert!(
        failed
            .message
            .contains("bdev_lvol_create_lvstore talon-d1 on talon-disk-d1 failed"),
        "{}",
        failed.message
    );
    eventually("two failed attempts", WAIT, || async {
        (double.calls("bdev_lvol_create_lvstore") >= 2).then_some(())
    })
    .await;
    // no reconcile runs after stop: what the failed ones made is gone
    rt.stop().await;
    assert_eq!(double.calls("bdev_lvol_create_lvstore"), 2);
    assert_eq!(
        double.calls("bdev_aio_delete"),
        2,
        "each failed reconcile deletes the aio bdev it made"
    );
    assert!(double.bdev_names().is_empty(), "{:?}", double.bdev_names());
    assert!(
        !img.exists(),
        "the sparse file made by the failed reconcile is removed"
    );

    // a new attempt succeeds from scratch
    let rt = start(d.path(), st.clone());
    let ok = status(&st, "d1", ObjectState::Ready).await;
    assert!(!ok.lvstore_uuid.is_empty());
    assert_eq!(double.calls("bdev_lvol_create_lvstore"), 3);
    assert_eq!(double.calls("bdev_aio_create"), 3);
    assert!(img.exists());
    rt.stop().await;
}

#[tokio::test]
async fn bad_disks_fail_with_a_clear_message() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let rt = start(d.path(), State::in_memory());
    let st = rt.state.clone();
    st.create_typed("nofile", "", &file_disk(&d.path().join("missing.img"), None))
        .expect("disk");
    st.create_typed(
        "nodev",
        "",
        &file_disk(Path::new("/dev/talon-no-such-device"), Some(1 << 30)),
    )
    .expect("disk");
    let pci = Disk {
        path: None,
        pci: Some("S4EVNF0M123456".into()),
        size_bytes: None,
        cluster_mib: 1,
        block_size: None,
        format: 0,
    };
    st.create_typed("serial", "", &pci).expect("disk");

    let m = status(&st, "nofile", ObjectState::Failed).await.message;
    assert!(m.contains("does not exist and no sizeBytes is given"), "{m}");
    let m = status(&st, "nodev", ObjectState::Failed).await.message;
    assert!(
        m.contains("block device /dev/talon-no-such-device does not exist"),
        "{m}"
    );
    let m = status(&st, "serial", ObjectState::Failed).await.message;
    assert!(
        m.contains("the NVMe device is not bound: Disk serial: no NVMe device with PCI address, serial or model \"S4EVNF0M123456\""),
        "{m}"
    );
    assert!(!Path::new("/dev/talon-no-such-device").exists());
    assert!(double.bdev_names().is_empty(), "{:?}", double.bdev_names());
    rt.stop().await;
}

#[tokio::test]
async fn pci_disk_attaches_an_nvme_controller() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    double.add_pcie_nvme("0000:00:04.0", 262144, 4096);
    // the device in the host's sysfs (a fixture under run_dir), already on
    // vfio-pci (bound by the machine config): used as it is
    let dev = d.path().join("sys/bus/pci/devices/0000:00:04.0");
    std::fs::create_dir_all(&dev).expect("mkdir");
    std::fs::create_dir_all(d.path().join("sys/bus/pci/drivers/vfio-pci")).expect("mkdir");
    for (attr, v) in [("vendor", "0x1b36"), ("device", "0x0010"), ("class", "0x010802")] {
        std::fs::write(dev.join(attr), format!("{v}\n")).expect("write");
    }
    std::os::unix::fs::symlink("../../../../bus/pci/drivers/vfio-pci", dev.join("driver")).expect("ln");
    let rt = start(d.path(), State::in_memory());
    let st = rt.state.clone();
    let pci = Disk {
        path: None,
        pci: Some("0000:00:04.0".into()),
        size_bytes: None,
        cluster_mib: 4,
        block_size: None,
        format: 0,
    };
    st.create_typed("nvme0", "", &pci).expect("disk");
    let s = status(&st, "nvme0", ObjectState::Ready).await;
    assert_eq!(s.bdev, "talon-disk-nvme0n1");
    assert_eq!(s.cluster_bytes, 4 << 20);
    // removed: SPDK detaches it, then the binding lets the Disk go
    st.destroy("config", "Disk", "nvme0", "").expect("delete");
    eventually("Disk nvme0 gone", WAIT, || async {
        st.get_typed::<Disk>("nvme0")
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        !double
            .bdev_names()
            .iter()
            .any(|b| b.starts_with("talon-disk-nvme0")),
        "{:?}",
        double.bdev_names()
    );
    rt.stop().await;
}

/// A PCI disk is read through SPDK before talon makes an lvstore on it
/// (issue 54): holding a file system it is refused by name, nothing
/// written; blank it gets an lvstore whose identity is recorded; after a
/// target restart that lvstore does not load and the disk is refused with
/// the UUID recorded, until `format` (the numbered request `talon disk
/// format` raises) makes a new one, once.
#[tokio::test]
async fn pci_disk_is_read_before_an_lvstore_and_remembered() {
    use talon::resources::engine::DiskIdentity;
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let bdf = "0000:00:04.0";
    double.add_pcie_nvme(bdf, 65536, 4096);
    double.write_pcie_nvme(bdf, 1080, &[0x53, 0xef]);
    let dev = d.path().join("sys/bus/pci/devices").join(bdf);
    std::fs::create_dir_all(&dev).expect("mkdir");
    std::fs::create_dir_all(d.path().join("sys/bus/pci/drivers/vfio-pci")).expect("mkdir");
    for (attr, v) in [("vendor", "0x1b36"), ("device", "0x0010"), ("class", "0x010802")] {
        std::fs::write(dev.join(attr), format!("{v}\n")).expect("write");
    }
    std::os::unix::fs::symlink("../../../../bus/pci/drivers/vfio-pci", dev.join("driver")).expect("ln");
    let rt = start(d.path(), State::in_memory());
    let st = rt.state.clone();
    let pci = Disk {
        path: None,
        pci: Some(bdf.into()),
        size_bytes: None,
        cluster_mib: 1,
        block_size: None,
        format: 0,
    };
    st.create_typed("nvme0", "", &pci).expect("disk");
    let s = status(&st, "nvme0", ObjectState::Failed).await;
    for want in [
        "NVMe 0000:00:04.0 (bdev talon-disk-nvme0n1)",
        "an ext2/3/4 file system",
        "`talon disk format nvme0 --yes-destroy-data`",
    ] {
        assert!(s.message.contains(want), "{want}: {}", s.message);
    }
    assert_eq!(double.calls("bdev_lvol_create_lvstore"), 0, "nothing written");
    assert_eq!(double.read_pcie_nvme(bdf, 1080, 2), [0x53, 0xef]);
    assert!(st.get_typed::<DiskIdentity>("nvme0").expect("get").is_none());
    // wiped outside talon: made, and remembered
    double.write_pcie_nvme(bdf, 1080, &[0, 0]);
    let s1 = status(&st, "nvme0", ObjectState::Ready).await;
    let id = st
        .get_typed::<DiskIdentity>("nvme0")
        .expect("get")
        .expect("identity")
        .spec;
    assert_eq!(id.lvstore_uuid, s1.lvstore_uuid);
    assert!(id.created && id.device.contains(bdf), "{id:?}");
    // the target restarts, the lvstore does not come back: refused, with the UUID
    double.restart().await.expect("restart");
    let s = eventually("nvme0 refused after the restart", WAIT, || async {
        st.get_typed::<DiskStatus>("nvme0")
            .expect("get")
            .map(|d| d.spec)
            .filter(|d| d.state == ObjectState::Failed && d.message.contains("did not load"))
    })
    .await;
    assert!(s.message.contains(&s1.lvstore_uuid), "{}", s.message);
    // (the double counts calls since its restart)
    assert_eq!(double.calls("bdev_lvol_create_lvstore"), 0, "no second lvstore");
    // the one deliberate command, served once
    let cur = st.get_typed::<Disk>("nvme0").expect("get").expect("disk");
    st.update_typed(
        "nvme0",
        "",
        Some(cur.metadata.version),
        &Disk {
            format: 1,
            ..pci.clone()
        },
    )
    .expect("format request");
    let s2 = status(&st, "nvme0", ObjectState::Ready).await;
    assert_ne!(s2.lvstore_uuid, s1.lvstore_uuid);
    let id = st
        .get_typed::<DiskIdentity>("nvme0")
        .expect("get")
        .expect("identity")
        .spec;
    assert_eq!(
        (id.lvstore_uuid.clone(), id.format_served),
        (s2.lvstore_uuid.clone(), 1)
    );
    // removed: its identity goes too
    st.destroy("config", "Disk", "nvme0", "").expect("delete");
    eventually("nvme0 and its identity gone", WAIT, || async {
        (st.get_typed::<Disk>("nvme0").expect("get").is_none()
            && st.get_typed::<DiskIdentity>("nvme0").expect("get").is_none())
        .then_some(())
    })
    .await;
    assert_eq!(double.read_pcie_nvme(bdf, 0, 8), [0; 8], "the lvstore deleted");
    rt.stop().await;
}

#[tokio::test]
async fn disk_delete_waits_for_lvols_then_removes_lvstore_and_bdev() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let c = SpdkClient::new(double.socket());
    let rt = start(d.path(), State::in_memory());
    let st = rt.state.clone();
    let img = d.path().join("d1.img");
    st.create_typed("d1", "", &file_disk(&img, Some(64 << 20)))
        .expect("disk");
    status(&st, "d1", ObjectState::Ready).await;
    c.bdev_lvol_create(&LvolCreate::thin("talon-d1", "vol1-r0", 8))
        .await
        .expect("lvol");

    st.destroy("config", "Disk", "d1", "").expect("delete");
    let s = status(&st, "d1", ObjectState::Deleting).await;
    assert!(
        s.message
            .contains("still holds lvols of talon in lvstore talon-d1: vol1-r0"),
        "{}",
        s.message
    );
    assert!(
        st.get_typed::<Disk>("d1").expect("get").is_some(),
        "held by the finalizer"
    );

    c.bdev_lvol_delete(&talon::spdk::rpc::ByName::new("talon-d1/vol1-r0"))
        .await
        .expect("delete lvol");
    eventually("Disk d1 gone", WAIT, || async {
        st.get_typed::<Disk>("d1").expect("get").is_none().then_some(())
    })
    .await;
    assert!(lvstore_names(&c).await.is_empty());
    assert!(double.bdev_names().is_empty(), "{:?}", double.bdev_names());
    assert!(st.get_typed::<DiskStatus>("d1").expect("get").is_none());
    assert!(img.exists(), "talon never deletes a disk file");
    // no disk and no volume left: the target is let go and its status removed
    eventually("TargetStatus spdk removed", WAIT, || async {
        st.get_typed::<TargetStatus>(SPDK_STATUS_ID)
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    rt.stop().await;
}

#[tokio::test]
async fn orphans_removed_only_when_empty_and_owned() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let c = SpdkClient::new(double.socket());
    for (name, file) in [
        ("talon-disk-x", "x.img"),
        ("talon-disk-y", "y.img"),
        ("talon-disk-z", "z.img"),
    ] {
        let f = d.path().join(file);
        std::fs::File::create(&f)
            .expect("file")
            .set_len(32 << 20)
            .expect("size");
        c.bdev_aio_create(&AioCreate {
            filename: f.display().to_string(),
            name: name.into(),
            block_size: None,
            readonly: false,
            fallocate: false,
        })
        .await
        .expect("aio");
    }
    let lvs = |bdev: &str, name: &str| LvstoreCreate {
        bdev_name: bdev.into(),
        lvs_name: name.into(),
        cluster_sz: Some(1 << 20),
        clear_method: None,
        num_md_pages_per_cluster_ratio: None,
    };
    c.bdev_lvol_create_lvstore(&lvs("talon-disk-x", "talon-x"))
        .await
        .expect("lvs x");
    c.bdev_lvol_create_lvstore(&lvs("talon-disk-y", "talon-y"))
        .await
        .expect("lvs y");
    c.bdev_lvol_create(&LvolCreate::thin("talon-y", "v-r0", 4))
        .await
        .expect("lvol");
    c.bdev_malloc_create(&MallocCreate {
        name: Some("foreign0".into()),
        num_blocks: 8192,
        block_size: 4096,
        uuid: None,
    })
    .await
    .expect("malloc");
    c.bdev_lvol_create_lvstore(&lvs("foreign0", "talon-foreign"))
        .await
        .expect("lvs f");
    c.bdev_malloc_create(&MallocCreate {
        name: Some("foreign1".into()),
        num_blocks: 8192,
        block_size: 4096,
        uuid: None,
    })
    .await
    .expect("malloc");
    c.bdev_lvol_create_lvstore(&lvs("foreign1", "theirs"))
        .await
        .expect("lvs t");

    let rt = start(d.path(), State::in_memory());
    let st = rt.state.clone();
    st.create_typed("d1", "", &file_disk(&d.path().join("d1.img"), Some(32 << 20)))
        .expect("disk");
    status(&st, "d1", ObjectState::Ready).await;
    eventually("orphans removed", WAIT, || async {
        let b = double.bdev_names();
        (!b.contains(&"talon-disk-x".to_owned()) && !b.contains(&"talon-disk-z".to_owned())).then_some(())
    })
    .await;
    assert_eq!(
        lvstore_names(&c).await,
        ["talon-d1", "talon-foreign", "talon-y", "theirs"],
        "an orphan with lvols, and lvstores on bdevs talon does not own, stay"
    );
    let kept = c
        .bdev_lvol_get_lvols(&GetLvols {
            lvs_uuid: None,
            lvs_name: Some("talon-y".into()),
        })
        .await
        .expect("lvols");
    assert_eq!(kept.len(), 1);
    let b = double.bdev_names();
    for want in ["talon-disk-y", "talon-disk-d1", "foreign0", "foreign1"] {
        assert!(b.contains(&want.to_owned()), "{want} missing from {b:?}");
    }
    rt.stop().await;
}

#[tokio::test]
async fn without_v2_the_target_reports_why_and_disks_are_unused() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let rt = start_with(
        d.path(),
        State::in_memory(),
        EngineSelection::fixed(false, "spdk_tgt was not found in /nowhere"),
    );
    let st = rt.state.clone();
    st.create_typed("d1", "", &file_disk(&d.path().join("d1.img"), Some(32 << 20)))
        .expect("disk");
    let t = eventually("TargetStatus spdk failed", WAIT, || async {
        st.get_typed::<TargetStatus>(SPDK_STATUS_ID)
            .expect("get")
            .map(|t| t.spec)
            .filter(|t| t.state == ObjectState::Failed)
    })
    .await;
    assert!(
        t.message
            .contains("the V2 engine is not available: spdk_tgt was not found"),
        "{}",
        t.message
    );
    // not waiting for a target that never comes: unused, saying why (issue 54)
    let s = status(&st, "d1", ObjectState::Unused).await;
    assert!(
        s.message.contains("only V2 volumes use disks")
            && s.message.contains("spdk_tgt was not found in /nowhere"),
        "{}",
        s.message
    );
    assert!(double.bdev_names().is_empty());
    // never held: a delete is immediate
    st.destroy("config", "Disk", "d1", "").expect("delete");
    assert!(st.get_typed::<Disk>("d1").expect("get").is_none());
    rt.stop().await;
}

#[tokio::test]
async fn a_dead_target_is_counted_retried_with_backoff_and_readopted() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let rt = start(d.path(), State::in_memory());
    let st = rt.state.clone();
    st.create_typed("d1", "", &file_disk(&d.path().join("d1.img"), Some(32 << 20)))
        .expect("disk");
    let s1 = status(&st, "d1", ObjectState::Ready).await;

    // the target dies (stays down): restarts counted, starts fail (no spdk_tgt here)
    double.stop().await;
    let failed = eventually("TargetStatus failed to start again", WAIT, || async {
        st.get_typed::<TargetStatus>(SPDK_STATUS_ID)
            .expect("get")
            .map(|t| t.spec)
            .filter(|t| t.state == ObjectState::Failed && t.restarts == 1)
    })
    .await;
    assert!(
        failed.message.contains("spdk_tgt was not found"),
        "{}",
        failed.message
    );
    assert!(failed.message.contains("next attempt in"), "{}", failed.message);
    let waiting = status(&st, "d1", ObjectState::Creating).await;
    assert!(
        waiting.message.contains("waiting for spdk_tgt"),
        "{}",
        waiting.message
    );

    // it answers again (state kept, as after a stall): adopted, disk ready again
    double.resume().expect("resume");
    let t = eventually("TargetStatus ready again", WAIT, || async {
        st.get_typed::<TargetStatus>(SPDK_STATUS_ID)
            .expect("get")
            .map(|t| t.spec)
            .filter(|t| t.state == ObjectState::Ready)
    })
    .await;
    assert_eq!(t.restarts, 1);
    let s2 = status(&st, "d1", ObjectState::Ready).await;
    assert_eq!(s2.lvstore_uuid, s1.lvstore_uuid);
    rt.stop().await;
}

/// The target gets Longhorn's 10 s NVMe keep-alive (`bdev_nvme_set_options`)
/// when it is adopted, before the disk controller attaches anything, and again
/// when a new target is adopted after the first died (the option lives in the
/// process).
#[tokio::test]
async fn the_target_gets_the_nvme_keep_alive_when_adopted() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let rt = start(d.path(), State::in_memory());
    let st = rt.state.clone();
    st.create_typed("d1", "", &file_disk(&d.path().join("d1.img"), Some(32 << 20)))
        .expect("disk");
    status(&st, "d1", ObjectState::Ready).await;
    assert_eq!(double.nvme_keep_alive_set(), Some(10_000));
    assert_eq!(double.calls("bdev_nvme_set_options"), 1);

    // the target dies and a new one (nothing set) answers: adopted, and set again
    double.stop().await;
    eventually("the dead target counted", WAIT, || async {
        st.get_typed::<TargetStatus>(SPDK_STATUS_ID)
            .expect("get")
            .filter(|t| t.spec.restarts == 1)
    })
    .await;
    double.restart().await.expect("restart");
    eventually("keep-alive set on the new target", WAIT, || async {
        double.nvme_keep_alive_set().filter(|ms| *ms == 10_000)
    })
    .await;
    rt.stop().await;
}

/// `engine.SpdkEventsController` counts bdev_unregister events of the target
/// (a disk pulled, with its lvols): the change is what wakes the volume
/// controller; after a target restart it follows the new target's ids.
#[tokio::test]
async fn bdev_unregister_events_become_an_spdk_events_change() {
    use talon::controllers::engine::spdk_events::SpdkEventsController;
    use talon::resources::engine::SpdkEvents;
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let mut cfg = talon::spdk::target::TargetConfig::new(d.path());
    cfg.spdk_tgt = Some(d.path().join("no-spdk_tgt"));
    cfg.spdk_dir = None;
    let run = d.path().to_path_buf();
    let socket = cfg.socket();
    let rt = TestRuntime::start_on(State::in_memory(), move |rt| {
        rt.register(SpdkTargetController::new(
            cfg,
            EngineSelection::fixed(true, "SpdkDouble (test double)"),
        ))?;
        rt.register(SpdkDiskController::new(&run, talon::host::HostRoot::new(&run)))?;
        rt.register(SpdkEventsController::new(SpdkClient::new(&socket)))
    })
    .expect("runtime");
    let st = rt.state.clone();
    st.create_typed("d1", "", &file_disk(&d.path().join("d1.img"), Some(64 << 20)))
        .expect("disk");
    status(&st, "d1", ObjectState::Ready).await;
    let c = SpdkClient::new(double.socket());
    c.bdev_lvol_create(&LvolCreate::thin("talon-d1", "x-r0", 4))
        .await
        .expect("lvol");
    let events = |st: &State| {
        st.get_typed::<SpdkEvents>("spdk")
            .ok()
            .flatten()
            .map(|e| e.spec)
            .unwrap_or_default()
    };
    let before = events(&st).bdev_unregistered;
    assert!(double.hot_remove("talon-disk-d1"));
    let after = eventually("unregisters counted", WAIT, || async {
        Some(events(&st)).filter(|e| e.bdev_unregistered >= before + 2)
    })
    .await;
    assert!(!after.last_bdev.is_empty(), "{after:?}");
    rt.stop().await;
}
