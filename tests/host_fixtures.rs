//! Host logic on fixture trees (fake /sys, /proc, /etc, /dev in a tempdir):
//! NUMA and not, Talos and not, IOMMU viable and not, device in use, module
//! missing, sysfs write refused, rollback after a failed probe.

use std::fs;
use std::os::unix::fs::symlink;
use talon::host::doctor::{self, DoctorOptions, Status, Target};
use talon::host::hugepages::{self, PageSize};
use talon::host::pci::{self, BindOptions, PciError, UserspaceDriver};
use talon::host::talos::TalosVersion;
use talon::host::{HostRoot, modules, os};

const BDF: &str = "0000:01:00.0";
const PEER: &str = "0000:01:00.1";

struct Fixture {
    _dir: tempfile::TempDir,
    root: HostRoot,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let f = Self { _dir: dir, root };
        f.write(
            "/etc/os-release",
            "ID=debian\nVERSION_ID=\"12\"\nPRETTY_NAME=\"Debian GNU/Linux 12\"\n",
        );
        f.write("/proc/sys/kernel/osrelease", "6.1.0-fixture\n");
        f.write(
            "/proc/modules",
            "nvme_tcp 45056 0 - Live 0x0\nnvme_fabrics 32768 1 nvme_tcp, Live 0x0\n",
        );
        f.write(
            "/lib/modules/6.1.0-fixture/modules.builtin",
            "kernel/drivers/nvme/host/nvme.ko\n",
        );
        f.write(
            "/lib/modules/6.1.0-fixture/modules.dep",
            "kernel/drivers/vfio/pci/vfio-pci.ko: kernel/drivers/vfio/vfio.ko\nkernel/drivers/uio/uio_pci_generic.ko: kernel/drivers/uio/uio.ko\nkernel/drivers/scsi/iscsi_tcp.ko:\n",
        );
        f.write("/proc/mounts", "sysfs /sys sysfs rw 0 0\n");
        f.write("/proc/self/mountinfo", "22 1 0:21 / /sys rw - sysfs sysfs rw\n");
        f.write("/sys/bus/pci/drivers_probe", "");
        for d in ["nvme", "vfio-pci", "uio_pci_generic"] {
            f.write(&format!("/sys/bus/pci/drivers/{d}/unbind"), "");
        }
        f.write("/sys/class/iommu/dmar0/uevent", "");
        f.nvme_device(BDF, "talon-test-1", "QEMU NVMe Ctrl", 0, "nvme0", 5);
        // A non-NVMe peer in the same IOMMU group, unbound.
        f.pci_device(PEER, "0x020000", 5);
        f
    }

    fn write(&self, p: &str, content: &str) {
        let path = self.root.path(p);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, content).expect("write");
    }

    fn mkdir(&self, p: &str) {
        fs::create_dir_all(self.root.path(p)).expect("mkdir");
    }

    fn link(&self, p: &str, target: &str) {
        let path = self.root.path(p);
        let _ = fs::remove_file(&path);
        symlink(target, path).expect("symlink");
    }

    fn pci_device(&self, bdf: &str, class: &str, group: u32) {
        let d = format!("/sys/bus/pci/devices/{bdf}");
        self.write(&format!("{d}/vendor"), "0x1b36\n");
        self.write(&format!("{d}/device"), "0x0010\n");
        self.write(&format!("{d}/class"), &format!("{class}\n"));
        self.write(&format!("{d}/numa_node"), "-1\n");
        self.write(&format!("{d}/driver_override"), "(null)\n");
        self.link(
            &format!("{d}/iommu_group"),
            &format!("../../../../kernel/iommu_groups/{group}"),
        );
        self.mkdir(&format!("/sys/kernel/iommu_groups/{group}/devices/{bdf}"));
    }

    fn nvme_device(&self, bdf: &str, serial: &str, model: &str, numa: u32, ctrl: &str, group: u32) {
        self.pci_device(bdf, "0x010802", group);
        let d = format!("/sys/bus/pci/devices/{bdf}");
        self.write(&format!("{d}/numa_node"), &format!("{numa}\n"));
        self.set_driver(bdf, Some("nvme"));
        self.write(&format!("{d}/nvme/{ctrl}/serial"), &format!("{serial}  \n"));
        self.write(&format!("{d}/nvme/{ctrl}/model"), &format!("{model}\n"));
        let ns = format!("{ctrl}n1");
        self.mkdir(&format!("{d}/nvme/{ctrl}/{ns}"));
        self.write(&format!("/sys/block/{ns}/size"), "524288\n");
        self.write(&format!("/sys/block/{ns}/dev"), "259:0\n");
        self.mkdir(&format!("/sys/block/{ns}/holders"));
        self.write(&format!("/dev/{ns}"), &"\0".repeat(70 * 1024));
    }

    fn set_driver(&self, bdf: &str, driver: Option<&str>) {
        let link = format!("/sys/bus/pci/devices/{bdf}/driver");
        let _ = fs::remove_file(self.root.path(&link));
        if let Some(d) = driver {
            self.link(&link, &format!("../../../../bus/pci/drivers/{d}"));
        }
    }

    fn driver(&self, bdf: &str) -> Option<String> {
        self.root
            .link_name(format!("/sys/bus/pci/devices/{bdf}/driver"))
            .expect("link")
    }

    fn attr(&self, p: &str) -> String {
        fs::read_to_string(self.root.path(p)).expect("read")
    }
}

#[test]
fn inventory_reads_every_field() {
    let f = Fixture::new();
    let devs = pci::list_nvme(&f.root).expect("list");
    assert_eq!(devs.len(), 1, "{devs:?}");
    let d = &devs[0];
    assert_eq!(d.bdf.as_str(), BDF);
    assert_eq!(
        (d.vendor.as_str(), d.device.as_str(), d.class.as_str()),
        ("0x1b36", "0x0010", "0x010802")
    );
    assert_eq!(d.numa_node, Some(0));
    assert_eq!(d.driver.as_deref(), Some("nvme"));
    assert_eq!(d.iommu_group, Some(5));
    assert_eq!(d.iommu_peers.len(), 1);
    assert_eq!(
        (d.iommu_peers[0].bdf.as_str(), d.iommu_peers[0].driver.as_deref()),
        (PEER, None)
    );
    assert_eq!(d.block_devices, vec!["nvme0n1".to_string()]);
    assert_eq!(d.serial.as_deref(), Some("talon-test-1"));
    assert_eq!(d.model.as_deref(), Some("QEMU NVMe Ctrl"));
    assert_eq!(d.size_bytes, Some(256 << 20));
}

#[test]
fn inventory_finds_namespaces_of_a_multipath_subsystem() {
    let f = Fixture::new();
    let d = format!("/sys/bus/pci/devices/{BDF}/nvme/nvme0");
    fs::remove_dir_all(f.root.path(format!("{d}/nvme0n1"))).expect("rm");
    f.mkdir(&format!("{d}/nvme0c0n1"));
    f.mkdir("/sys/class/nvme-subsystem/nvme-subsys0/nvme0");
    f.mkdir("/sys/class/nvme-subsystem/nvme-subsys0/nvme0n1");
    let dev = pci::select(&f.root, "talon-test-1").expect("dev");
    assert_eq!(dev.block_devices, vec!["nvme0n1".to_string()]);
    assert_eq!(dev.size_bytes, Some(256 << 20));
}

#[test]
fn selects_by_bdf_serial_model_never_dev_name() {
    let f = Fixture::new();
    assert_eq!(pci::select(&f.root, BDF).expect("bdf").bdf.as_str(), BDF);
    assert_eq!(
        pci::select(&f.root, "01:00.0").expect("short bdf").bdf.as_str(),
        BDF
    );
    assert_eq!(
        pci::select(&f.root, "talon-test-1").expect("serial").bdf.as_str(),
        BDF
    );
    assert_eq!(
        pci::select(&f.root, "QEMU NVMe Ctrl")
            .expect("model")
            .bdf
            .as_str(),
        BDF
    );
    assert!(matches!(
        pci::select(&f.root, "/dev/nvme0n1"),
        Err(PciError::DevName(_))
    ));
    assert!(matches!(
        pci::select(&f.root, "nvme0n1"),
        Err(PciError::DevName(_))
    ));
    assert!(matches!(
        pci::select(&f.root, "0000:01:00.9"),
        Err(PciError::MalformedBdf(_))
    ));
    let e = pci::select(&f.root, "0000:02:00.0").expect_err("unknown");
    assert!(
        matches!(e, PciError::UnknownDevice(_)) && e.to_string().contains("0000:02:00.0"),
        "{e}"
    );
    assert!(matches!(
        pci::select(&f.root, PEER),
        Err(PciError::NotNvme { .. })
    ));
    assert!(matches!(pci::select(&f.root, "nope"), Err(PciError::NoMatch(_))));
    f.nvme_device("0000:02:00.0", "other", "QEMU NVMe Ctrl", 0, "nvme1", 6);
    let e = pci::select(&f.root, "QEMU NVMe Ctrl").expect_err("ambiguous");
    assert!(
        matches!(e, PciError::Ambiguous { .. }) && e.to_string().contains("0000:02:00.0"),
        "{e}"
    );
}

#[test]
fn chooses_vfio_when_group_viable_else_uio_else_explains() {
    let f = Fixture::new();
    let dev = pci::select(&f.root, BDF).expect("dev");
    assert_eq!(
        pci::choose_driver(&f.root, &dev).expect("viable"),
        UserspaceDriver::VfioPci
    );

    // A peer on a kernel driver makes the group not viable.
    f.set_driver(PEER, Some("e1000e"));
    let dev = pci::select(&f.root, BDF).expect("dev");
    let why = pci::vfio_blocker(&f.root, &dev).expect("blocked");
    assert!(why.contains(PEER) && why.contains("e1000e"), "{why}");
    assert_eq!(
        pci::choose_driver(&f.root, &dev).expect("uio"),
        UserspaceDriver::UioPciGeneric
    );
    let e = pci::bind(
        &f.root,
        BDF,
        BindOptions {
            driver: Some(UserspaceDriver::VfioPci),
            load_module: false,
            data_ok: false,
        },
    )
    .expect_err("not viable");
    assert!(matches!(e, PciError::VfioNotViable { .. }), "{e}");
    assert_eq!(f.driver(BDF).as_deref(), Some("nvme"));

    // No IOMMU at all.
    let f = Fixture::new();
    fs::remove_dir_all(f.root.path("/sys/class/iommu")).expect("rm");
    fs::remove_dir_all(f.root.path("/sys/kernel/iommu_groups")).expect("rm");
    fs::remove_file(f.root.path(format!("/sys/bus/pci/devices/{BDF}/iommu_group"))).expect("rm");
    let dev = pci::select(&f.root, BDF).expect("dev");
    assert!(
        pci::vfio_blocker(&f.root, &dev)
            .expect("no iommu")
            .contains("no IOMMU")
    );
    assert_eq!(
        pci::choose_driver(&f.root, &dev).expect("uio"),
        UserspaceDriver::UioPciGeneric
    );

    // ... and no uio_pci_generic either: explain.
    fs::remove_dir_all(f.root.path("/sys/bus/pci/drivers/uio_pci_generic")).expect("rm");
    f.write("/lib/modules/6.1.0-fixture/modules.dep", "");
    let e = pci::choose_driver(&f.root, &dev).expect_err("nothing");
    assert!(
        matches!(e, PciError::NoUserspaceDriver { .. }) && e.to_string().contains("no IOMMU"),
        "{e}"
    );
}

fn assert_untouched(f: &Fixture) {
    assert_eq!(f.driver(BDF).as_deref(), Some("nvme"));
    let ov = f.attr(&format!("/sys/bus/pci/devices/{BDF}/driver_override"));
    assert!(ov == "(null)\n" || ov == "\n", "driver_override left at {ov:?}");
}

fn bind_refused(f: &Fixture, needle: &str) {
    let e = pci::bind(&f.root, "talon-test-1", BindOptions::default()).expect_err("in use");
    assert!(matches!(e, PciError::InUse { .. }), "{e}");
    assert!(e.to_string().contains(needle), "{e} lacks {needle}");
    assert_eq!(f.attr("/sys/bus/pci/drivers_probe"), "", "probe was written");
    assert_untouched(f);
}

#[test]
fn refuses_a_device_in_use() {
    let f = Fixture::new();
    f.write(
        "/proc/self/mountinfo",
        "30 1 259:0 / /data rw,relatime - ext4 /dev/nvme0n1 rw\n",
    );
    bind_refused(&f, "mounted at /data");

    let f = Fixture::new();
    f.write("/proc/self/mountinfo", "");
    f.write("/proc/mounts", "/dev/nvme0n1 /mnt/with\\040space xfs rw 0 0\n");
    bind_refused(&f, "mounted at /mnt/with space");

    let f = Fixture::new();
    f.mkdir("/sys/block/nvme0n1/holders/dm-0");
    bind_refused(&f, "held by dm-0");

    let f = Fixture::new();
    f.write("/sys/block/nvme0n1/nvme0n1p1/partition", "1\n");
    f.write("/sys/block/nvme0n1/nvme0n1p1/dev", "259:1\n");
    bind_refused(&f, "has partitions (nvme0n1p1)");

    let f = Fixture::new();
    f.write("/sys/block/nvme0n1/nvme0n1p1/partition", "1\n");
    f.write("/sys/block/nvme0n1/nvme0n1p1/dev", "259:1\n");
    f.write(
        "/proc/self/mountinfo",
        "30 1 259:1 / /boot rw - vfat /dev/nvme0n1p1 rw\n",
    );
    bind_refused(&f, "/dev/nvme0n1p1 is mounted at /boot");

    let f = Fixture::new();
    let mut img = vec![0u8; 70 * 1024];
    img[1080] = 0x53;
    img[1081] = 0xef;
    fs::write(f.root.path("/dev/nvme0n1"), img).expect("write");
    bind_refused(&f, "ext2/3/4");
}

#[test]
fn refuses_swap_and_a_device_held_open_by_a_userspace_driver() {
    let f = Fixture::new();
    f.write(
        "/proc/swaps",
        "Filename Type Size Used Priority\n/dev/nvme0n1 partition 262140 0 -2\n",
    );
    bind_refused(&f, "active swap");

    let f = Fixture::new();
    f.set_driver(BDF, Some("vfio-pci"));
    f.write("/proc/4242/comm", "spdk_tgt\n");
    f.mkdir("/proc/4242/fd");
    f.link("/proc/4242/fd/7", "/dev/vfio/5");
    let e = pci::unbind(&f.root, BDF).expect_err("held open");
    assert!(
        matches!(e, PciError::InUse { .. }) && e.to_string().contains("spdk_tgt (pid 4242)"),
        "{e}"
    );
    let e = pci::bind(
        &f.root,
        BDF,
        BindOptions {
            driver: Some(UserspaceDriver::UioPciGeneric),
            load_module: false,
            data_ok: false,
        },
    )
    .expect_err("held open");
    assert!(e.to_string().contains("spdk_tgt (pid 4242)"), "{e}");
    assert_eq!(f.driver(BDF).as_deref(), Some("vfio-pci"));
    assert_eq!(f.attr("/sys/bus/pci/drivers_probe"), "");
}

#[test]
fn failed_probe_rolls_back_to_the_original_driver() {
    // The fixture tree is no kernel: the driver link never moves, so the
    // verification fails and the rollback must leave the device on nvme.
    let f = Fixture::new();
    let e = pci::bind(&f.root, BDF, BindOptions::default()).expect_err("fixture never binds");
    match &e {
        PciError::Rebind { restored, to, .. } => {
            assert_eq!((restored.as_str(), to.as_str()), ("nvme", "vfio-pci"))
        }
        other => panic!("unexpected {other}: {:?}", std::error::Error::source(other)),
    }
    assert!(e.to_string().contains("put back on nvme"), "{e}");
    assert_eq!(f.attr("/sys/bus/pci/drivers_probe"), BDF, "probe written");
    assert_untouched(&f);
}

#[test]
fn refused_sysfs_write_and_missing_driver_leave_state_unchanged() {
    let f = Fixture::new();
    // driver_override as a directory: every write to it fails, like a refusing sysfs.
    let ov = f.root.path(format!("/sys/bus/pci/devices/{BDF}/driver_override"));
    fs::remove_file(&ov).expect("rm");
    fs::create_dir(&ov).expect("mkdir");
    let e = pci::bind(&f.root, BDF, BindOptions::default()).expect_err("refused");
    assert!(e.to_string().contains(BDF), "{e}");
    assert_eq!(f.driver(BDF).as_deref(), Some("nvme"));
    assert_eq!(f.attr("/sys/bus/pci/drivers_probe"), "");

    let f = Fixture::new();
    fs::remove_dir_all(f.root.path("/sys/bus/pci/drivers/uio_pci_generic")).expect("rm");
    let e = pci::bind(
        &f.root,
        BDF,
        BindOptions {
            driver: Some(UserspaceDriver::UioPciGeneric),
            load_module: false,
            data_ok: false,
        },
    )
    .expect_err("no driver");
    assert!(
        matches!(e, PciError::NoDriver { .. }) && e.to_string().contains("uio_pci_generic"),
        "{e}"
    );
    // load_module on a fixture root refuses to run modprobe, naming the module.
    let e = pci::bind(
        &f.root,
        BDF,
        BindOptions {
            driver: Some(UserspaceDriver::UioPciGeneric),
            load_module: true,
            data_ok: false,
        },
    )
    .expect_err("not local");
    assert!(e.to_string().contains("uio_pci_generic"), "{e}");
    assert_untouched(&f);

    // Already on the target: nothing to do.
    let f = Fixture::new();
    f.set_driver(BDF, Some("vfio-pci"));
    let out = pci::bind(&f.root, BDF, BindOptions::default()).expect("noop");
    assert!(!out.changed);
    let out = pci::unbind(&f.root, "0000:01:00.0");
    assert!(out.is_err(), "fixture unbind cannot verify");
    assert_eq!(
        f.driver(BDF).as_deref(),
        Some("vfio-pci"),
        "rolled back to vfio-pci"
    );
}

#[test]
fn hugepages_numa_and_not() {
    let f = Fixture::new();
    for n in [0, 1] {
        for (size, nr) in [("2048kB", 64), ("1048576kB", 0)] {
            f.write(
                &format!("/sys/devices/system/node/node{n}/hugepages/hugepages-{size}/nr_hugepages"),
                &format!("{nr}\n"),
            );
            f.write(
                &format!("/sys/devices/system/node/node{n}/hugepages/hugepages-{size}/free_hugepages"),
                &format!("{nr}\n"),
            );
        }
    }
    let pools = hugepages::pools(&f.root).expect("pools");
    assert_eq!(pools.iter().filter(|p| p.node == Some(1)).count(), 2);
    assert_eq!(
        hugepages::totals(&f.root, PageSize::Size2M).expect("t").total,
        128
    );
    let out = hugepages::set_pages(&f.root, PageSize::Size2M, Some(1), 100).expect("set node 1");
    assert_eq!((out.previous, out.now), (64, 100));
    assert_eq!(
        f.attr("/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"),
        "100"
    );
    assert!(hugepages::set_pages(&f.root, PageSize::Size2M, Some(3), 1).is_err());

    let f = Fixture::new();
    f.write("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0\n");
    f.write("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "0\n");
    let pools = hugepages::pools(&f.root).expect("pools");
    assert_eq!(pools.len(), 1);
    assert_eq!(pools[0].node, None);
}

#[test]
fn modules_missing_and_present() {
    let f = Fixture::new();
    assert_eq!(
        modules::module_state(&f.root, "nvme_tcp").expect("s"),
        modules::ModuleState::Loaded
    );
    assert_eq!(
        modules::module_state(&f.root, "nvme").expect("s"),
        modules::ModuleState::Builtin
    );
    assert_eq!(
        modules::module_state(&f.root, "vfio-pci").expect("s"),
        modules::ModuleState::Available
    );
    f.write("/lib/modules/6.1.0-fixture/modules.dep", "");
    assert_eq!(
        modules::module_state(&f.root, "iscsi_tcp").expect("s"),
        modules::ModuleState::Missing
    );
}

#[test]
fn doctor_generic_host() {
    let f = Fixture::new();
    f.write("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0\n");
    f.write("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "0\n");
    f.write("/lib/modules/6.1.0-fixture/modules.dep", "");
    f.write("/proc/modules", "");
    for d in ["vfio-pci", "uio_pci_generic"] {
        fs::remove_dir_all(f.root.path(format!("/sys/bus/pci/drivers/{d}"))).expect("rm");
    }
    let r = doctor::run(
        &f.root,
        &DoctorOptions {
            disks: vec!["talon-test-1".into()],
            ..Default::default()
        },
    )
    .expect("doctor");
    assert!(!os::detect(&f.root).expect("os").is_talos());
    assert_eq!(r.target, Target::Generic);
    assert!(r.talos.is_none());
    let get = |n: &str| {
        r.checks
            .iter()
            .find(|c| c.name == n)
            .unwrap_or_else(|| panic!("no check {n}: {r:?}"))
    };
    assert_eq!(get("hugepages-2M").status, Status::Fail);
    assert!(
        get("hugepages-2M")
            .fix
            .as_deref()
            .unwrap_or("")
            .contains("--set 544"),
        "{:?}",
        get("hugepages-2M")
    );
    assert_eq!(get("module nvme_tcp").status, Status::Fail);
    assert_eq!(get("module iscsi_tcp").status, Status::Warn);
    assert_eq!(get("iommu").status, Status::Pass);
    assert_eq!(
        get("disk talon-test-1").status,
        Status::Fail,
        "no uio/vfio module installed"
    );
    assert_eq!(r.worst(), Status::Fail);
    assert!(r.to_text().contains("FAIL  module nvme_tcp"));
}

#[test]
fn doctor_talos_host_prints_patch_for_what_is_missing() {
    let f = Fixture::new();
    f.write(
        "/etc/os-release",
        "NAME=\"Talos\"\nID=talos\nVERSION_ID=v1.13.0\n",
    );
    for n in [0, 1] {
        f.write(
            &format!("/sys/devices/system/node/node{n}/hugepages/hugepages-2048kB/nr_hugepages"),
            "0\n",
        );
        f.write(
            &format!("/sys/devices/system/node/node{n}/hugepages/hugepages-2048kB/free_hugepages"),
            "0\n",
        );
    }
    f.write("/proc/mounts", "hugetlbfs /dev/hugepages hugetlbfs rw 0 0\n");
    let opts = DoctorOptions {
        disks: vec![BDF.into()],
        hugepages_mib: Some(1024),
        ..Default::default()
    };
    let r = doctor::run(&f.root, &opts).expect("doctor");
    assert_eq!(r.target, Target::Talos);
    let hp = r
        .checks
        .iter()
        .find(|c| c.name == "hugepages-2M")
        .expect("hugepages check");
    assert!(hp.measured.contains("node1: 0/0 MiB free"), "{hp:?}");
    let t = r.talos.as_ref().expect("talos advice");
    let y = &t.machine_config_yaml;
    assert!(y.contains("vm.nr_hugepages: '512'"), "{y}");
    assert!(
        y.contains("name: vfio_pci") && y.contains("name: uio_pci_generic") && !y.contains("name: nvme_tcp"),
        "{y}"
    );
    assert!(
        y.contains("name: 0000:01:00.0") && y.contains("targetDriver: vfio-pci"),
        "{y}"
    );
    assert!(t.notes.iter().any(|n| n.contains("--preserve")));
    assert_eq!(
        t.namespace_labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("privileged")
    );

    let opts = DoctorOptions {
        talos_version: TalosVersion::V1_15,
        target: Some(Target::Talos),
        ..opts
    };
    let r = doctor::run(&f.root, &opts).expect("doctor");
    let kinds: Vec<&str> = r
        .talos
        .as_ref()
        .expect("t")
        .machine_config
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        vec![
            "SysctlConfig",
            "KernelModuleConfig",
            "KernelModuleConfig",
            "KernelModuleConfig",
            "PCIDriverRebindConfig"
        ]
    );
}
