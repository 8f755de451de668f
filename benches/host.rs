//! Host inspection costs on a fixture tree: NVMe inventory, the in-use check
//! (mount tables, holders, a 68 KiB signature read) and a whole `talon doctor`.

use criterion::{Criterion, criterion_group, criterion_main};
use std::fs;
use std::os::unix::fs::symlink;
use talon::host::doctor::{self, DoctorOptions};
use talon::host::{HostRoot, pci};

fn write(root: &HostRoot, p: &str, c: &[u8]) {
    let path = root.path(p);
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, c).expect("write");
}

/// `n` NVMe controllers, each with one 256 MiB namespace, on nvme.
fn fixture(n: usize) -> (tempfile::TempDir, HostRoot) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = HostRoot::new(dir.path());
    write(&root, "/etc/os-release", b"ID=debian\n");
    write(&root, "/proc/sys/kernel/osrelease", b"6.1.0\n");
    write(&root, "/proc/modules", b"nvme_tcp 1 0 - Live 0x0\n");
    let mounts: String = (0..40)
        .map(|i| format!("tmpfs /run/x{i} tmpfs rw 0 0\n"))
        .collect();
    write(&root, "/proc/mounts", mounts.as_bytes());
    write(&root, "/proc/self/mountinfo", b"");
    write(
        &root,
        "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
        b"512\n",
    );
    write(
        &root,
        "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
        b"512\n",
    );
    fs::create_dir_all(root.path("/sys/bus/pci/drivers/nvme")).expect("mkdir");
    for i in 0..n {
        let bdf = format!("0000:{:02x}:00.0", i + 1);
        let d = format!("/sys/bus/pci/devices/{bdf}");
        for (a, v) in [
            ("vendor", "0x144d"),
            ("device", "0xa808"),
            ("class", "0x010802"),
            ("numa_node", "0"),
        ] {
            write(&root, &format!("{d}/{a}"), format!("{v}\n").as_bytes());
        }
        symlink(
            "../../../../bus/pci/drivers/nvme",
            root.path(format!("{d}/driver")),
        )
        .expect("ln");
        write(
            &root,
            &format!("{d}/nvme/nvme{i}/serial"),
            format!("S{i}\n").as_bytes(),
        );
        write(&root, &format!("{d}/nvme/nvme{i}/model"), b"Bench NVMe\n");
        fs::create_dir_all(root.path(format!("{d}/nvme/nvme{i}/nvme{i}n1"))).expect("mkdir");
        write(&root, &format!("/sys/block/nvme{i}n1/size"), b"524288\n");
        write(
            &root,
            &format!("/sys/block/nvme{i}n1/dev"),
            format!("259:{i}\n").as_bytes(),
        );
        fs::create_dir_all(root.path(format!("/sys/block/nvme{i}n1/holders"))).expect("mkdir");
        write(&root, &format!("/dev/nvme{i}n1"), &vec![0u8; 70 * 1024]);
    }
    (dir, root)
}

fn bench(c: &mut Criterion) {
    let (_d, root) = fixture(8);
    c.bench_function("pci::list_nvme (8 controllers)", |b| {
        b.iter(|| pci::list_nvme(&root).expect("list"))
    });
    let dev = pci::select(&root, "S3").expect("select");
    c.bench_function("pci::in_use (1 namespace, signature read)", |b| {
        b.iter(|| pci::in_use(&root, &dev).expect("in_use"))
    });
    let opts = DoctorOptions {
        disks: vec!["S1".into(), "S2".into()],
        ..Default::default()
    };
    c.bench_function("doctor::run (8 controllers, 2 disks)", |b| {
        b.iter(|| doctor::run(&root, &opts).expect("doctor"))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
