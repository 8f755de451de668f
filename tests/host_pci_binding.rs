//! `host.PciBindController` on fixture trees (tier 2): a Disk naming an NVMe
//! device by serial is bound to a user-space driver and given back when the
//! Disk goes; a device in use is refused and left alone; a rebind recorded in
//! the ledger and cut short by a crash is finished or rolled back at start.
//!
//! The fixture tree is no kernel: a thread here plays the PCI core's part
//! (`<driver>/unbind` drops the driver link, `drivers_probe` links the
//! device to its `driver_override`, or to nvme without one). What the real
//! kernel does is checked in the QEMU guest (tests/vm/steps/pci-bind*.sh).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use talon::controllers::host::PciBindController;
use talon::host::HostRoot;
use talon::resources::config::Disk;
use talon::resources::host::{BindPhase, BindingState, PciBindIntent, PciBindingStatus};
use talon::runtime::State;
use talon::runtime::testing::{TestRuntime, eventually};

const WAIT: Duration = Duration::from_secs(20);
const BDF: &str = "0000:01:00.0";
const SERIAL: &str = "talon-test-1";
const DRIVERS: [&str; 3] = ["nvme", "vfio-pci", "uio_pci_generic"];

struct Fixture {
    dir: tempfile::TempDir,
    root: HostRoot,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let f = Fixture { dir, root };
        f.write("/etc/os-release", "ID=debian\n");
        f.write("/proc/sys/kernel/osrelease", "6.1.0-fixture\n");
        f.write("/proc/modules", "");
        f.write("/proc/mounts", "sysfs /sys sysfs rw 0 0\n");
        f.write("/proc/self/mountinfo", "22 1 0:21 / /sys rw - sysfs sysfs rw\n");
        f.write("/sys/bus/pci/drivers_probe", "");
        for d in DRIVERS {
            f.write(&format!("/sys/bus/pci/drivers/{d}/unbind"), "");
        }
        f.write("/sys/class/iommu/dmar0/uevent", "");
        let d = format!("/sys/bus/pci/devices/{BDF}");
        f.write(&format!("{d}/vendor"), "0x1b36\n");
        f.write(&format!("{d}/device"), "0x0010\n");
        f.write(&format!("{d}/class"), "0x010802\n");
        f.write(&format!("{d}/numa_node"), "0\n");
        f.write(&format!("{d}/driver_override"), "(null)\n");
        f.link(&format!("{d}/iommu_group"), "../../../../kernel/iommu_groups/5");
        fs::create_dir_all(f.root.path(format!("/sys/kernel/iommu_groups/5/devices/{BDF}"))).expect("mkdir");
        f.write(&format!("{d}/nvme/nvme0/serial"), &format!("{SERIAL}  \n"));
        f.write(&format!("{d}/nvme/nvme0/model"), "QEMU NVMe Ctrl\n");
        fs::create_dir_all(f.root.path(format!("{d}/nvme/nvme0/nvme0n1"))).expect("mkdir");
        f.write("/sys/block/nvme0n1/size", "524288\n");
        f.write("/sys/block/nvme0n1/dev", "259:0\n");
        fs::create_dir_all(f.root.path("/sys/block/nvme0n1/holders")).expect("mkdir");
        f.write("/dev/nvme0n1", &"\0".repeat(70 * 1024));
        f.set_driver(Some("nvme"));
        f
    }

    fn write(&self, p: &str, content: &str) {
        let path = self.root.path(p);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, content).expect("write");
    }

    fn link(&self, p: &str, target: &str) {
        let path = self.root.path(p);
        let _ = fs::remove_file(&path);
        symlink(target, path).expect("symlink");
    }

    fn set_driver(&self, driver: Option<&str>) {
        let link = format!("/sys/bus/pci/devices/{BDF}/driver");
        let _ = fs::remove_file(self.root.path(&link));
        if let Some(d) = driver {
            self.link(&link, &format!("../../../../bus/pci/drivers/{d}"));
        }
    }

    fn driver(&self) -> Option<String> {
        self.root
            .link_name(format!("/sys/bus/pci/devices/{BDF}/driver"))
            .expect("link")
    }

    fn override_(&self) -> String {
        fs::read_to_string(
            self.root
                .path(format!("/sys/bus/pci/devices/{BDF}/driver_override")),
        )
        .expect("read")
        .trim()
        .to_string()
    }

    /// Plays the kernel's PCI core on this tree until dropped.
    fn kernel(&self) -> Kernel {
        let stop = Arc::new(AtomicBool::new(false));
        let root = self.dir.path().to_path_buf();
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                pci_core_step(&root);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Kernel {
            stop,
            thread: Some(thread),
        }
    }
}

struct Kernel {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One look at the trigger files, doing what the PCI core does on a write.
fn pci_core_step(root: &Path) {
    let p = |s: &str| root.join(s.trim_start_matches('/'));
    let take = |f: &PathBuf| -> Option<String> {
        let v = fs::read_to_string(f).ok()?.trim().to_string();
        if v.is_empty() {
            return None;
        }
        fs::write(f, "").ok()?;
        Some(v)
    };
    for d in DRIVERS {
        if let Some(bdf) = take(&p(&format!("/sys/bus/pci/drivers/{d}/unbind"))) {
            let _ = fs::remove_file(p(&format!("/sys/bus/pci/devices/{bdf}/driver")));
        }
    }
    if let Some(bdf) = take(&p("/sys/bus/pci/drivers_probe")) {
        let dev = p(&format!("/sys/bus/pci/devices/{bdf}"));
        if fs::symlink_metadata(dev.join("driver")).is_ok() {
            return;
        }
        let ov = fs::read_to_string(dev.join("driver_override"))
            .unwrap_or_default()
            .trim()
            .to_string();
        let to = if ov.is_empty() || ov == "(null)" {
            "nvme".to_string()
        } else {
            ov
        };
        if p(&format!("/sys/bus/pci/drivers/{to}")).is_dir() {
            let _ = symlink(format!("../../../../bus/pci/drivers/{to}"), dev.join("driver"));
        }
    }
}

fn pci_disk(selector: &str) -> Disk {
    serde_json::from_value(serde_json::json!({ "pci": selector })).expect("disk")
}

fn start(f: &Fixture, state: State) -> TestRuntime {
    let root = f.root.clone();
    TestRuntime::start_on(state, move |rt| {
        rt.register(PciBindController {
            host: root,
            interval: Duration::from_millis(50),
        })
    })
    .expect("runtime")
}

async fn binding(state: &State, disk: &str, want: BindingState) -> PciBindingStatus {
    eventually(&format!("PciBindingStatus {disk} {want:?}"), WAIT, || async {
        state
            .get_typed::<PciBindingStatus>(disk)
            .expect("get")
            .map(|s| s.spec)
            .filter(|s| s.state == want)
    })
    .await
}

fn intent(state: &State) -> Option<PciBindIntent> {
    state
        .get_typed::<PciBindIntent>(BDF)
        .expect("get")
        .map(|i| i.spec)
}

#[tokio::test]
async fn a_free_disk_is_bound_then_given_back_when_the_disk_goes() {
    let f = Fixture::new();
    let _k = f.kernel();
    let dir = tempfile::tempdir().expect("tempdir");
    let state = State::open(&dir.path().join("state.redb")).expect("store");
    let rt = start(&f, state.clone());
    state.create_typed("nvme-a", "", &pci_disk(SERIAL)).expect("disk");

    let s = binding(&state, "nvme-a", BindingState::Bound).await;
    assert_eq!(
        (
            s.bdf.as_deref(),
            s.driver.as_deref(),
            s.original_driver.as_deref()
        ),
        (Some(BDF), Some("vfio-pci"), Some("nvme"))
    );
    assert!(s.message.contains("vfio-pci"), "{}", s.message);
    assert_eq!(
        (f.driver().as_deref(), f.override_().as_str()),
        (Some("vfio-pci"), "")
    );
    let i = intent(&state).expect("intent recorded");
    assert_eq!((i.phase, i.disk.as_str()), (BindPhase::Bound, "nvme-a"));
    let disk = state.get_typed::<Disk>("nvme-a").expect("get").expect("disk");
    assert!(disk.metadata.finalizers.contains("host.PciBindController"));
    rt.stop().await;

    // the intent survives a restart (ledger, persisted) and a second start changes nothing
    drop(state);
    let state = State::open(&dir.path().join("state.redb")).expect("reopen");
    assert_eq!(intent(&state).map(|i| i.phase), Some(BindPhase::Bound));
    let rt = start(&f, state.clone());
    binding(&state, "nvme-a", BindingState::Bound).await;

    state.destroy("config", "Disk", "nvme-a", "").expect("delete");
    eventually("Disk nvme-a gone", WAIT, || async {
        state
            .get_typed::<Disk>("nvme-a")
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        (f.driver().as_deref(), f.override_().as_str()),
        (Some("nvme"), "")
    );
    assert!(intent(&state).is_none(), "intent removed");
    eventually("status removed", WAIT, || async {
        state
            .get_typed::<PciBindingStatus>("nvme-a")
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    rt.stop().await;
}

#[tokio::test]
async fn removal_waits_for_spdk_to_let_go() {
    let f = Fixture::new();
    let _k = f.kernel();
    let rt = start(&f, State::in_memory());
    let state = rt.state.clone();
    state.create_typed("nvme-a", "", &pci_disk(BDF)).expect("disk");
    binding(&state, "nvme-a", BindingState::Bound).await;
    // SPDK's disk controller holds the Disk while the device is attached
    state
        .add_finalizer("config", "Disk", "nvme-a", "engine.SpdkDiskController")
        .expect("finalizer");
    state.destroy("config", "Disk", "nvme-a", "").expect("delete");
    let s = binding(&state, "nvme-a", BindingState::Releasing).await;
    assert!(s.message.contains("waiting for SPDK"), "{}", s.message);
    assert_eq!(f.driver().as_deref(), Some("vfio-pci"));
    state
        .remove_finalizer("config", "Disk", "nvme-a", "engine.SpdkDiskController")
        .expect("release");
    eventually("Disk gone", WAIT, || async {
        state
            .get_typed::<Disk>("nvme-a")
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(f.driver().as_deref(), Some("nvme"));
    rt.stop().await;
}

#[tokio::test]
async fn a_disk_in_use_is_refused_and_left_alone() {
    let f = Fixture::new();
    let _k = f.kernel();
    // an ext4 superblock magic at 1080
    let mut data = vec![0u8; 70 * 1024];
    data[1080] = 0x53;
    data[1081] = 0xef;
    fs::write(f.root.path("/dev/nvme0n1"), data).expect("write");
    let rt = start(&f, State::in_memory());
    let state = rt.state.clone();
    state.create_typed("nvme-a", "", &pci_disk(SERIAL)).expect("disk");
    let s = binding(&state, "nvme-a", BindingState::Failed).await;
    assert!(
        s.message
            .contains("Disk nvme-a: refusing to take 0000:01:00.0 from the kernel")
            && s.message.contains("ext2/3/4"),
        "{}",
        s.message
    );
    assert_eq!(f.driver().as_deref(), Some("nvme"));
    assert!(intent(&state).is_none(), "no intent for a refused device");
    // mounted instead of formatted: refused the same way
    fs::write(f.root.path("/dev/nvme0n1"), vec![0u8; 70 * 1024]).expect("wipe");
    f.write(
        "/proc/self/mountinfo",
        "30 1 259:0 / /data rw - ext4 /dev/nvme0n1 rw\n",
    );
    let s = eventually("refused: mounted", WAIT, || async {
        state
            .get_typed::<PciBindingStatus>("nvme-a")
            .expect("get")
            .map(|s| s.spec)
            .filter(|s| s.message.contains("mounted at /data"))
    })
    .await;
    assert_eq!(s.state, BindingState::Failed);
    assert_eq!(f.driver().as_deref(), Some("nvme"));
    // freed: bound at the next look
    f.write("/proc/self/mountinfo", "22 1 0:21 / /sys rw - sysfs sysfs rw\n");
    binding(&state, "nvme-a", BindingState::Bound).await;
    rt.stop().await;
}

/// A free device holding data (a file-system signature) is taken only on a
/// format request of its Disk (`talon disk format`), which the refusal
/// names; a device the kernel uses (mounted) never, format or not.
#[tokio::test]
async fn data_on_a_free_disk_is_taken_only_on_a_format_request() {
    let f = Fixture::new();
    let _k = f.kernel();
    let mut data = vec![0u8; 70 * 1024];
    data[1080] = 0x53;
    data[1081] = 0xef;
    fs::write(f.root.path("/dev/nvme0n1"), data).expect("write");
    f.write(
        "/proc/self/mountinfo",
        "30 1 259:0 / /data rw - ext4 /dev/nvme0n1 rw\n",
    );
    let rt = start(&f, State::in_memory());
    let state = rt.state.clone();
    let formatted = Disk {
        format: 1,
        ..pci_disk(SERIAL)
    };
    state.create_typed("nvme-a", "", &formatted).expect("disk");
    let s = binding(&state, "nvme-a", BindingState::Failed).await;
    assert!(s.message.contains("mounted at /data"), "{}", s.message);
    assert_eq!(f.driver().as_deref(), Some("nvme"));
    // unmounted, no format request: refused, naming the command
    let cur = state.get_typed::<Disk>("nvme-a").expect("get").expect("disk");
    state
        .update_typed("nvme-a", "", Some(cur.metadata.version), &pci_disk(SERIAL))
        .expect("no request");
    f.write("/proc/self/mountinfo", "22 1 0:21 / /sys rw - sysfs sysfs rw\n");
    let s = eventually("refused: data", WAIT, || async {
        state
            .get_typed::<PciBindingStatus>("nvme-a")
            .expect("get")
            .map(|s| s.spec)
            .filter(|s| s.message.contains("ext2/3/4"))
    })
    .await;
    assert!(
        s.message
            .contains("`talon disk format nvme-a --yes-destroy-data`"),
        "{}",
        s.message
    );
    assert_eq!(f.driver().as_deref(), Some("nvme"));
    // the request: taken
    let cur = state.get_typed::<Disk>("nvme-a").expect("get").expect("disk");
    state
        .update_typed("nvme-a", "", Some(cur.metadata.version), &formatted)
        .expect("format request");
    let s = eventually("bound on the request", WAIT, || async {
        let s = state
            .get_typed::<PciBindingStatus>("nvme-a")
            .expect("get")
            .map(|s| s.spec);
        s.filter(|s| s.state == BindingState::Bound)
    })
    .await;
    assert_ne!(f.driver().as_deref(), Some("nvme"), "{s:?}");
    rt.stop().await;
}

#[tokio::test]
async fn no_user_space_driver_is_a_clear_error() {
    let f = Fixture::new();
    fs::remove_dir_all(f.root.path("/sys/class/iommu")).expect("no iommu");
    fs::remove_dir_all(f.root.path("/sys/kernel/iommu_groups")).expect("no groups");
    fs::remove_file(f.root.path(format!("/sys/bus/pci/devices/{BDF}/iommu_group"))).expect("no group");
    fs::remove_dir_all(f.root.path("/sys/bus/pci/drivers/uio_pci_generic")).expect("no uio");
    let rt = start(&f, State::in_memory());
    let state = rt.state.clone();
    state.create_typed("nvme-a", "", &pci_disk(SERIAL)).expect("disk");
    let s = binding(&state, "nvme-a", BindingState::Failed).await;
    assert!(
        s.message
            .contains("cannot bind 0000:01:00.0 to a user-space driver")
            && s.message.contains("no IOMMU is active"),
        "{}",
        s.message
    );
    assert_eq!(f.driver().as_deref(), Some("nvme"));
    // a serial nobody has
    state
        .create_typed("nvme-b", "", &pci_disk("S4NOSUCH"))
        .expect("disk");
    let s = binding(&state, "nvme-b", BindingState::Failed).await;
    assert!(
        s.message.contains("Disk nvme-b") && s.message.contains("S4NOSUCH"),
        "{}",
        s.message
    );
    assert!(!s.message.contains("name one by PCI address"), "{}", s.message);
    // a device already on vfio-pci shows no serial: the message says to use its address
    f.set_driver(Some("vfio-pci"));
    fs::remove_dir_all(f.root.path(format!("/sys/bus/pci/devices/{BDF}/nvme"))).expect("rm");
    state.create_typed("nvme-c", "", &pci_disk(SERIAL)).expect("disk");
    let s = binding(&state, "nvme-c", BindingState::Failed).await;
    assert!(
        s.message.contains(&format!("name one by PCI address: {BDF}")),
        "{}",
        s.message
    );
    rt.stop().await;
}

/// A crash of talon left a recorded rebind half done: at the next start it is
/// finished (the Disk still wants the device) or rolled back (it does not).
#[tokio::test]
async fn a_rebind_cut_short_is_finished_or_rolled_back_at_start() {
    // (what the crash left: driver, driver_override, intent phase, Disk present?) -> driver after start
    type Case<'a> = (&'a str, Option<&'a str>, &'a str, BindPhase, bool, &'a str);
    let cases: [Case; 6] = [
        (
            "override written",
            Some("nvme"),
            "vfio-pci",
            BindPhase::Binding,
            true,
            "vfio-pci",
        ),
        (
            "unbound from nvme",
            None,
            "vfio-pci",
            BindPhase::Binding,
            true,
            "vfio-pci",
        ),
        (
            "probed, override not cleared",
            Some("vfio-pci"),
            "vfio-pci",
            BindPhase::Binding,
            true,
            "vfio-pci",
        ),
        (
            "unbound, Disk deleted meanwhile",
            None,
            "vfio-pci",
            BindPhase::Binding,
            false,
            "nvme",
        ),
        (
            "give back: unbound from vfio-pci",
            None,
            "nvme",
            BindPhase::Releasing,
            false,
            "nvme",
        ),
        (
            "give back: not started",
            Some("vfio-pci"),
            "",
            BindPhase::Releasing,
            false,
            "nvme",
        ),
    ];
    for (what, driver, ov, phase, disk, want) in cases {
        let f = Fixture::new();
        let _k = f.kernel();
        f.set_driver(driver);
        f.write(
            &format!("/sys/bus/pci/devices/{BDF}/driver_override"),
            &format!("{ov}\n"),
        );
        let state = State::in_memory();
        state
            .create_typed(
                BDF,
                "host.PciBindController",
                &PciBindIntent {
                    disk: "nvme-a".into(),
                    selector: SERIAL.into(),
                    original_driver: Some("nvme".into()),
                    target_driver: "vfio-pci".into(),
                    phase,
                },
            )
            .expect("intent");
        if disk {
            state.create_typed("nvme-a", "", &pci_disk(SERIAL)).expect("disk");
        }
        let rt = start(&f, state.clone());
        if disk {
            binding(&state, "nvme-a", BindingState::Bound).await;
            assert_eq!(intent(&state).map(|i| i.phase), Some(BindPhase::Bound), "{what}");
        } else {
            eventually(&format!("{what}: intent gone"), WAIT, || async {
                intent(&state).is_none().then_some(())
            })
            .await;
        }
        assert_eq!(f.driver().as_deref(), Some(want), "{what}");
        assert_eq!(f.override_(), "", "{what}: driver_override cleared");
        rt.stop().await;
    }
}
