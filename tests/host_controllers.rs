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
            present: true
        }
    );
    let vfio = eventually("vfio_pci status", WAIT, || async {
        get::<KernelModuleStatus>(&state, "vfio_pci")
    })
    .await;
    assert_eq!(vfio.state, ModuleState::Available);
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
        s.get("host.KernelModuleStatusController")
            .and_then(|c| c.last_error.clone())
    })
    .await;
    assert!(err.contains("/proc/modules"), "{err}");
    rt.stop().await;
}
