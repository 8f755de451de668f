//! Host status controllers on an in-memory runtime over a fixture tree: they
//! publish what the tree shows and follow it when it changes (tier 2).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use talon::controllers::host;
use talon::host::HostRoot;
use talon::host::hugepages::PageSize;
use talon::host::modules::ModuleState;
use talon::resources::host::{HostCapabilities, HugepagesStatus, KernelModuleStatus, PciDevice};
use talon::runtime::Spec;
use talon::runtime::state::State;
use talon::runtime::testing::{TestRuntime, eventually};

const WAIT: Duration = Duration::from_secs(20);
const BDF: &str = "0000:01:00.0";

fn write(root: &Path, p: &str, content: &str) {
    let path = root.join(p.trim_start_matches('/'));
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, content).expect("write");
}

fn fixture(root: &Path) {
    write(root, "/etc/os-release", "ID=debian\n");
    write(root, "/proc/sys/kernel/osrelease", "6.1.0-fixture\n");
    write(root, "/proc/modules", "nvme_tcp 45056 0 - Live 0x0\n");
    write(
        root,
        "/proc/mounts",
        "hugetlbfs /dev/hugepages hugetlbfs rw 0 0\n",
    );
    write(
        root,
        "/lib/modules/6.1.0-fixture/modules.dep",
        "kernel/drivers/vfio/pci/vfio-pci.ko:\n",
    );
    for n in [0, 1] {
        write(
            root,
            &format!("/sys/devices/system/node/node{n}/hugepages/hugepages-2048kB/nr_hugepages"),
            "64\n",
        );
        write(
            root,
            &format!("/sys/devices/system/node/node{n}/hugepages/hugepages-2048kB/free_hugepages"),
            "32\n",
        );
    }
    let d = format!("/sys/bus/pci/devices/{BDF}");
    write(root, &format!("{d}/vendor"), "0x1b36\n");
    write(root, &format!("{d}/device"), "0x0010\n");
    write(root, &format!("{d}/class"), "0x010802\n");
    write(root, &format!("{d}/numa_node"), "1\n");
    write(root, &format!("{d}/nvme/nvme0/serial"), "talon-test-1\n");
    write(root, &format!("{d}/nvme/nvme0/model"), "QEMU NVMe Ctrl\n");
    fs::create_dir_all(root.join("sys/bus/pci/drivers/nvme")).expect("mkdir");
    symlink(
        "../../../../bus/pci/drivers/nvme",
        root.join(format!("sys/bus/pci/devices/{BDF}/driver")),
    )
    .expect("ln");
}

fn get<S: Spec>(state: &State, id: &str) -> Option<S> {
    state.get_typed::<S>(id).expect("get").map(|t| t.spec)
}

#[tokio::test]
async fn status_controllers_publish_and_follow_the_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path());
    let root = HostRoot::new(dir.path());
    let rt = TestRuntime::start(|rt| host::register(rt, &root, Duration::from_millis(50))).expect("start");
    let state = rt.state.clone();

    let hp = eventually("HugepagesStatus 2M-node1", WAIT, || async {
        get::<HugepagesStatus>(&state, "2M-node1")
    })
    .await;
    assert_eq!(
        (hp.size, hp.node, hp.total, hp.free, hp.free_mib),
        (PageSize::Size2M, Some(1), 64, 32, 64)
    );
    let m = eventually("nvme_tcp status", WAIT, || async {
        get::<KernelModuleStatus>(&state, "nvme_tcp")
    })
    .await;
    assert_eq!(
        m,
        KernelModuleStatus {
            state: ModuleState::Loaded,
            present: true,
            wanted: true,
            message: "wanted: volumes attach over NVMe/TCP".into(),
        }
    );
    let vfio = eventually("vfio_pci status", WAIT, || async {
        get::<KernelModuleStatus>(&state, "vfio_pci")
    })
    .await;
    assert_eq!((vfio.state, vfio.wanted), (ModuleState::Available, false));
    let dev = eventually("PciDevice", WAIT, || async { get::<PciDevice>(&state, BDF) }).await;
    assert_eq!(
        (dev.driver.as_deref(), dev.serial.as_deref(), dev.numa_node),
        (Some("nvme"), Some("talon-test-1"), Some(1))
    );
    assert!(
        dev.vfio_blocker.as_deref().unwrap_or("").contains("no IOMMU"),
        "{dev:?}"
    );
    let caps = eventually("HostCapabilities", WAIT, || async {
        get::<HostCapabilities>(&state, "node").filter(|c| c.hugepages_total_mib == 256)
    })
    .await;
    assert!(
        caps.nvme_tcp && !caps.talos && !caps.iommu && caps.hugetlbfs_mounted,
        "{caps:?}"
    );
    assert_eq!(caps.hugepages_free_mib, 128);

    // The host changes: nvme_tcp unloaded, the disk gone, the OS is Talos.
    write(dir.path(), "/proc/modules", "");
    write(
        dir.path(),
        "/lib/modules/6.1.0-fixture/modules.dep",
        "kernel/drivers/nvme/host/nvme-tcp.ko:\n",
    );
    write(dir.path(), "/etc/os-release", "ID=talos\n");
    fs::remove_dir_all(dir.path().join(format!("sys/bus/pci/devices/{BDF}"))).expect("rm");
    let caps = eventually("capabilities follow", WAIT, || async {
        get::<HostCapabilities>(&state, "node").filter(|c| c.talos && !c.nvme_tcp)
    })
    .await;
    assert!(!caps.nvme_tcp_loadable, "never loadable on Talos: {caps:?}");
    eventually("PciDevice destroyed", WAIT, || async {
        get::<PciDevice>(&state, BDF).is_none().then_some(())
    })
    .await;
    rt.stop().await;
}

#[tokio::test]
async fn failing_reads_restart_the_controller_not_the_runtime() {
    // An unreadable /proc/modules (a directory here): the module controller
    // errors (and backs off); the others still publish.
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path());
    fs::remove_file(dir.path().join("proc/modules")).expect("rm");
    fs::create_dir(dir.path().join("proc/modules")).expect("mkdir");
    let root = HostRoot::new(dir.path());
    let rt = TestRuntime::start(|rt| host::register(rt, &root, Duration::from_millis(50))).expect("start");
    let statuses = rt.statuses();
    let state = rt.state.clone();
    eventually("HugepagesStatus", WAIT, || async {
        get::<HugepagesStatus>(&state, "2M-node0")
    })
    .await;
    let err = eventually("module controller error", WAIT, || async {
        let s = statuses.read().ok()?;
        s.get("host.KernelModuleController")
            .and_then(|c| c.last_error.clone())
    })
    .await;
    assert!(err.contains("/proc/modules"), "{err}");
    rt.stop().await;
}

// ---- hugepages as desired state (HugepagesConfigController + HugepagesController) ----

use talon::controllers::engine::selection::EngineSelection;
use talon::resources::config::{HugepagesSetting, NodeConfig, Volume};
use talon::resources::host::{HugepagesLedger, HugepagesSpec, HugepagesState};

const NODE0: &str = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB";

fn demand() -> host::SpdkDemand {
    host::SpdkDemand {
        spdk: Ok("spdk_tgt (fixture)".into()),
        no_huge: false,
        cpumask: "0x1".into(),
        selection: EngineSelection::fixed(true, "fixture"),
    }
}

/// Two NUMA nodes with empty 2 MiB pools; SPDK's core 0 is on node 0.
fn numa_fixture(root: &Path, os: &str) {
    write(root, "/etc/os-release", os);
    for (n, cpus) in [(0, "0-1"), (1, "2-3")] {
        let d = format!("/sys/devices/system/node/node{n}");
        write(root, &format!("{d}/cpulist"), &format!("{cpus}\n"));
        write(
            root,
            &format!("{d}/hugepages/hugepages-2048kB/nr_hugepages"),
            "0\n",
        );
        write(
            root,
            &format!("{d}/hugepages/hugepages-2048kB/free_hugepages"),
            "0\n",
        );
    }
}

fn start_hugepages(root: &HostRoot) -> TestRuntime {
    TestRuntime::start(|rt| {
        host::register_config(rt, root, demand())?;
        rt.register(host::HugepagesController::new(
            root.clone(),
            Duration::from_millis(50),
        ))
    })
    .expect("start")
}

fn volume() -> Volume {
    serde_json::from_value(serde_json::json!({"sizeBytes": 1048576})).expect("volume")
}

fn pages(root: &Path, file: &str) -> u64 {
    fs::read_to_string(root.join(format!("{NODE0}/{file}").trim_start_matches('/')))
        .expect("read")
        .trim()
        .parse()
        .expect("number")
}

/// What the fixture's "kernel" has in use: `free = nr - in_use`.
fn set_in_use(root: &Path, in_use: u64) {
    let nr = pages(root, "nr_hugepages");
    write(
        root,
        &format!("{NODE0}/free_hugepages"),
        &format!("{}\n", nr.saturating_sub(in_use)),
    );
}

async fn status_where(
    state: &State,
    id: &str,
    what: &str,
    f: impl Fn(&HugepagesStatus) -> bool,
) -> HugepagesStatus {
    eventually(what, WAIT, || async {
        get::<HugepagesStatus>(state, id).filter(|s| f(s))
    })
    .await
}

#[tokio::test]
async fn auto_hugepages_follow_the_volumes_and_never_take_pages_in_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    numa_fixture(dir.path(), "ID=debian\n");
    let root = HostRoot::new(dir.path());
    let rt = start_hugepages(&root);
    let state = rt.state.clone();
    state
        .create_typed("node", "", &NodeConfig::default())
        .expect("node");

    // no volumes yet: the spdk_tgt base, 1024 MiB = 512 pages, on node 0 only
    let s = status_where(&state, "2M-node0", "node0 grown to 512", |s| s.total == 512).await;
    assert_eq!((s.wanted, s.state), (Some(512), HugepagesState::Ok), "{s:?}");
    assert!(s.reason.contains("talon grew 0 -> 512"), "{}", s.reason);
    assert_eq!(pages(dir.path(), "nr_hugepages"), 512);
    let n1 = status_where(&state, "2M-node1", "node1 status", |_| true).await;
    assert_eq!(
        (n1.wanted, n1.total, n1.state),
        (None, 0, HugepagesState::Unmanaged)
    );
    let ledger = eventually("ledger", WAIT, || async {
        get::<HugepagesLedger>(&state, "2M-node0")
    })
    .await;
    assert_eq!(ledger, HugepagesLedger { before: 0, set: 512 });
    set_in_use(dir.path(), 0);

    // two volumes: 1024 + 2 × 8 = 1040 MiB -> 520 pages
    for v in ["v1", "v2"] {
        state.create_typed(v, "", &volume()).expect("volume");
    }
    let spec = eventually("spec for 2 volumes", WAIT, || async {
        get::<HugepagesSpec>(&state, "2M-node0").filter(|s| s.exported_volumes == 2)
    })
    .await;
    assert_eq!((spec.wanted, spec.spdk_mem_mib), (Some(520), 1040));
    status_where(&state, "2M-node0", "grown to 520", |s| s.total == 520).await;

    // every page in use (SPDK mapped them), then the volumes go: nothing is taken away
    set_in_use(dir.path(), 520);
    for v in ["v1", "v2"] {
        state.destroy("config", "Volume", v, "").expect("delete");
    }
    let s = status_where(&state, "2M-node0", "wanted back to 512", |s| {
        s.wanted == Some(512)
    })
    .await;
    assert_eq!(
        (s.total, s.in_use, s.state),
        (520, 520, HugepagesState::Ok),
        "{s:?}"
    );
    // a few polls later still 520
    status_where(&state, "2M-node0", "a later poll", |s| s.wanted == Some(512)).await;
    assert_eq!(pages(dir.path(), "nr_hugepages"), 520);

    // the pages are released: the free ones talon added go back
    set_in_use(dir.path(), 0);
    let s = status_where(&state, "2M-node0", "shrunk to 512", |s| s.total == 512).await;
    assert!(s.reason.contains("gave back free pages"), "{}", s.reason);

    // someone else grows the pool to 800: talon cannot tell its pages from
    // theirs, so the whole pool is theirs now (talon added nothing): forgotten
    write(dir.path(), &format!("{NODE0}/nr_hugepages"), "800\n");
    set_in_use(dir.path(), 0);
    eventually("ledger dropped after the foreign grow", WAIT, || async {
        get::<HugepagesLedger>(&state, "2M-node0").is_none().then_some(())
    })
    .await;
    status_where(&state, "2M-node0", "800 left alone", |s| {
        s.total == 800 && s.state == HugepagesState::Ok
    })
    .await;

    // they shrink it to 100: talon grows it back to what SPDK needs
    write(dir.path(), &format!("{NODE0}/nr_hugepages"), "100\n");
    set_in_use(dir.path(), 0);
    status_where(&state, "2M-node0", "grown from 100", |s| s.total == 512).await;
    assert_eq!(
        get::<HugepagesLedger>(&state, "2M-node0"),
        Some(HugepagesLedger {
            before: 100,
            set: 512
        })
    );
    set_in_use(dir.path(), 0);

    // off: talon gives back what it added, and only that, and forgets the pool
    let node = NodeConfig {
        hugepages: HugepagesSetting::OFF,
        ..NodeConfig::default()
    };
    state.update_typed("node", "", None, &node).expect("off");
    let s = status_where(&state, "2M-node0", "back to 100", |s| s.total == 100).await;
    assert_eq!((s.wanted, s.state), (None, HugepagesState::Unmanaged));
    eventually("ledger dropped", WAIT, || async {
        get::<HugepagesLedger>(&state, "2M-node0").is_none().then_some(())
    })
    .await;
    rt.stop().await;
}

#[tokio::test]
async fn on_talos_hugepages_are_reported_with_the_patch_not_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    numa_fixture(dir.path(), "ID=talos\nVERSION_ID=v1.13.0\n");
    let root = HostRoot::new(dir.path());
    let rt = start_hugepages(&root);
    let state = rt.state.clone();
    state
        .create_typed("node", "", &NodeConfig::default())
        .expect("node");
    let s = status_where(&state, "2M-node0", "short on Talos", |s| {
        s.state == HugepagesState::Short
    })
    .await;
    assert_eq!((s.wanted, s.total), (Some(512), 0));
    assert_eq!(pages(dir.path(), "nr_hugepages"), 0, "nothing written on Talos");
    assert!(s.reason.contains("machine config"), "{}", s.reason);
    // two NUMA nodes: the kernel spreads the sysctl, so 2 × 512
    let patch = s.talos_patch.expect("patch");
    assert!(
        patch.contains("vm.nr_hugepages: '1024'") && !patch.contains("kubelet"),
        "{patch}"
    );
    assert!(s.reason.contains("2 NUMA nodes"), "{}", s.reason);
    assert!(get::<HugepagesLedger>(&state, "2M-node0").is_none());
    rt.stop().await;
}

#[tokio::test]
async fn a_refused_hugepage_write_is_reported_with_the_fix() {
    // nr_hugepages is a read-only sysfs attribute holding 0 (the kernel
    // refuses writes to it even from root, as a read-only /sys would)
    let ro = Path::new("/sys/devices/system/cpu/cpu0/topology/physical_package_id");
    if std::fs::read_to_string(ro)
        .map(|s| s.trim() != "0")
        .unwrap_or(true)
    {
        eprintln!(
            "SKIP a_refused_hugepage_write_is_reported_with_the_fix: {} does not read 0",
            ro.display()
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    numa_fixture(dir.path(), "ID=debian\n");
    let nr = dir
        .path()
        .join(NODE0.trim_start_matches('/'))
        .join("nr_hugepages");
    fs::remove_file(&nr).expect("rm");
    symlink(ro, &nr).expect("ln");
    let root = HostRoot::new(dir.path());
    let rt = start_hugepages(&root);
    let state = rt.state.clone();
    state
        .create_typed("node", "", &NodeConfig::default())
        .expect("node");
    let s = status_where(&state, "2M-node0", "short, write refused", |s| {
        s.state == HugepagesState::Short
    })
    .await;
    assert!(
        s.reason.contains("cannot set 2M hugepages on NUMA node 0 to 512")
            && s.reason.contains("talon host hugepages --set 512 --node 0"),
        "{}",
        s.reason
    );
    assert!(s.talos_patch.is_none());
    // the baseline is kept; nothing was added
    let l = get::<HugepagesLedger>(&state, "2M-node0").expect("ledger");
    assert_eq!(l, HugepagesLedger { before: 0, set: 0 });
    rt.stop().await;
}

// ---- kernel modules loaded where allowed (KernelModuleController) ----

#[tokio::test]
async fn wanted_modules_are_loaded_where_allowed_else_the_fix_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path());
    // nvme_tcp installed but not loaded; no IOMMU: a pci Disk wants uio_pci_generic
    write(dir.path(), "/proc/modules", "");
    write(
        dir.path(),
        "/lib/modules/6.1.0-fixture/modules.dep",
        "kernel/drivers/nvme/host/nvme-tcp.ko:\nkernel/drivers/uio/uio_pci_generic.ko:\n",
    );
    let root = HostRoot::new(dir.path());
    let rt = TestRuntime::start(|rt| host::register(rt, &root, Duration::from_millis(50))).expect("start");
    let state = rt.state.clone();
    let disk: talon::resources::config::Disk =
        serde_json::from_value(serde_json::json!({"pci": BDF})).expect("disk");
    state.create_typed("nvme-a", "", &disk).expect("disk");
    let uio = eventually("uio_pci_generic wanted", WAIT, || async {
        get::<KernelModuleStatus>(&state, "uio_pci_generic").filter(|m| m.wanted)
    })
    .await;
    // a fixture tree is not the real /: modprobe is not run, and the status says so
    assert_eq!(uio.state, ModuleState::Available);
    assert!(
        uio.message.contains("a Disk names an NVMe device")
            && uio.message.contains("cannot load kernel module uio_pci_generic")
            && uio.message.contains("not the real /"),
        "{}",
        uio.message
    );
    let iscsi = get::<KernelModuleStatus>(&state, "iscsi_tcp").expect("iscsi_tcp");
    assert!(!iscsi.wanted, "nvme_tcp is installed: {iscsi:?}");

    // on Talos: no modprobe, the machine-config patch instead
    write(dir.path(), "/etc/os-release", "ID=talos\nVERSION_ID=v1.15.1\n");
    let m = eventually("Talos patch", WAIT, || async {
        get::<KernelModuleStatus>(&state, "nvme_tcp").filter(|m| m.message.contains("Talos"))
    })
    .await;
    assert!(
        m.message.contains("kind: KernelModuleConfig") && m.message.contains("name: nvme_tcp"),
        "{}",
        m.message
    );
    rt.stop().await;
}

#[tokio::test]
async fn the_hugepage_baseline_survives_a_restart() {
    // talon grew the pool, then restarted: it still knows which pages it added
    let dir = tempfile::tempdir().expect("tempdir");
    numa_fixture(dir.path(), "ID=debian\n");
    write(dir.path(), &format!("{NODE0}/nr_hugepages"), "10\n");
    write(dir.path(), &format!("{NODE0}/free_hugepages"), "10\n");
    let root = HostRoot::new(dir.path());
    let db = dir.path().join("state.redb");
    let state = State::open(&db).expect("store");
    state
        .create_typed("node", "", &NodeConfig::default())
        .expect("node");
    let rt = TestRuntime::start_on(state.clone(), |rt| {
        host::register_config(rt, &root, demand())?;
        rt.register(host::HugepagesController::new(
            root.clone(),
            Duration::from_millis(50),
        ))
    })
    .expect("start");
    status_where(&state, "2M-node0", "grown to 512", |s| s.total == 512).await;
    rt.stop().await;
    drop(state);

    let state = State::open(&db).expect("reopen");
    assert_eq!(
        get::<HugepagesLedger>(&state, "2M-node0"),
        Some(HugepagesLedger { before: 10, set: 512 })
    );
    set_in_use(dir.path(), 0);
    let node = NodeConfig {
        hugepages: HugepagesSetting::OFF,
        ..NodeConfig::default()
    };
    state.update_typed("node", "", None, &node).expect("off");
    let rt = TestRuntime::start_on(state.clone(), |rt| {
        host::register_config(rt, &root, demand())?;
        rt.register(host::HugepagesController::new(
            root.clone(),
            Duration::from_millis(50),
        ))
    })
    .expect("restart");
    status_where(&state, "2M-node0", "back to the 10 found", |s| s.total == 10).await;
    rt.stop().await;
}
