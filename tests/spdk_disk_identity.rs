//! A disk's identity and the blank check before an lvstore (issue 54, item
//! 3): talon makes an lvstore only over a device that reads blank, whatever
//! way the disk was given, and never over one where the lvstore it recorded
//! (`DiskIdentity`, persisted) does not load; a refusal names the device,
//! what it holds and `talon disk format <disk> --yes-destroy-data`, and
//! writes nothing.
//!
//! ```text
//!   real spdk_tgt (TALON_SPDK_DIR) ── path disks through the controllers, the state in redb
//!                                     (a file system refused; talon's lvstore, its superblock
//!                                     damaged, then zeroed: refused across a talon restart,
//!                                     bytes unchanged; formatted once on request)
//!   real spdk_tgt ── aio bdev ── NVMe/TCP export ── attached as talon-disk-p1 (an NVMe bdev,
//!                                     as a PCI disk's) ── DiskOps reads it with NVMe Reads
//!                                     through bdev_nvme_send_cmd
//!   SpdkDouble ── the same bdev_nvme_send_cmd contract, on a PCIe device of the double
//! ```

#[path = "support/serve_daemon.rs"]
mod serve_daemon;
#[path = "support/spdk_real.rs"]
mod spdk_real;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use talon::controllers::engine::selection::{EngineSelection, SpdkOptions};
use talon::controllers::engine::spdk_disk::SpdkDiskController;
use talon::controllers::engine::spdk_target::SpdkTargetController;
use talon::host::HostRoot;
use talon::host::disk_target::Content;
use talon::resources::config::Disk;
use talon::resources::engine::{DiskIdentity, DiskStatus, ObjectState};
use talon::runtime::State;
use talon::runtime::testing::{TestRuntime, eventually};
use talon::spdk::disk::{DiskError, DiskNames, DiskOps, nvme_cpl_status, nvme_read_sqe};
use talon::spdk::rpc::{
    AddNamespace, AioCreate, AttachController, ByName, CreateSubsystem, CreateTransport, ListenAddress,
    LvstoreSelector, NvmeSendCmd, SubsystemListener,
};
use talon::spdk::target::Target;
use talon::spdk::{ClientError, SpdkClient, SpdkDouble};

const WAIT: Duration = Duration::from_secs(90);
const MIB: u64 = 1 << 20;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    )
}

/// A hash of every byte of `path` (what "nothing written" is checked with).
fn digest(path: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(path).expect("read the device").hash(&mut h);
    h.finish()
}

fn put(path: &Path, at: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).expect("open");
    f.seek(SeekFrom::Start(at)).expect("seek");
    f.write_all(bytes).expect("write");
    f.sync_all().expect("sync");
}

fn head(path: &Path, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    std::fs::File::open(path)
        .expect("open")
        .read_exact(&mut b)
        .expect("read");
    b
}

/// A file of `len` zeros.
fn zeros_file(path: &Path, len: u64) {
    let f = std::fs::File::create(path).expect("create");
    f.set_len(len).expect("len");
}

fn pci_disk() -> Disk {
    Disk {
        path: None,
        pci: Some("0000:00:04.0".into()),
        size_bytes: None,
        cluster_mib: 1,
        block_size: None,
        format: 0,
    }
}

/// One NVMe Read through `bdev_nvme_send_cmd`.
fn read_cmd(ctrlr: &str, nsid: u32, lba: u64, blocks: u16, data_len: u32) -> NvmeSendCmd {
    NvmeSendCmd {
        name: ctrlr.into(),
        cmd_type: "io".into(),
        data_direction: "c2h".into(),
        cmdbuf: base64::engine::general_purpose::URL_SAFE.encode(nvme_read_sqe(nsid, lba, blocks)),
        data_len: Some(data_len),
        metadata_len: None,
        timeout_ms: None,
    }
}

/// What spdk_tgt v26.05 answers to `bdev_nvme_send_cmd` on controller
/// `ctrlr` of a namespace of `num_blocks` blocks of 4096 bytes starting
/// with `first` (the double must answer the same).
async fn send_cmd_contract(c: &SpdkClient, ctrlr: &str, num_blocks: u64, first: &[u8]) {
    let invalid = |r: Result<_, ClientError>, what: &str| match r {
        Err(ClientError::Rpc(e)) => {
            assert_eq!(
                (e.code, e.message.as_str()),
                (-32602, "Invalid argument"),
                "{what}"
            )
        }
        other => panic!("{what}: {other:?}"),
    };
    let status = |cpl: &str| nvme_cpl_status(&b64().decode(cpl).expect("base64")).expect("16 bytes");
    // a Read of 2 blocks at 0: its data, padded base64
    let r = c
        .bdev_nvme_send_cmd(&read_cmd(ctrlr, 1, 0, 2, 8192))
        .await
        .expect("read");
    assert_eq!(status(&r.cpl), (0, 0));
    let data = b64().decode(r.data.expect("data")).expect("base64");
    assert_eq!(data.len(), 8192);
    assert_eq!(&data[..first.len()], first);
    // the last block reads, one past it completes with LBA out of range
    let r = c
        .bdev_nvme_send_cmd(&read_cmd(ctrlr, 1, num_blocks - 1, 1, 4096))
        .await
        .expect("last block");
    assert_eq!(status(&r.cpl), (0, 0));
    let r = c
        .bdev_nvme_send_cmd(&read_cmd(ctrlr, 1, num_blocks, 1, 4096))
        .await
        .expect("past the end");
    assert_eq!(status(&r.cpl), (0, 0x80), "LBA out of range");
    // a namespace that is not there
    let r = c
        .bdev_nvme_send_cmd(&read_cmd(ctrlr, 9, 0, 1, 4096))
        .await
        .expect("nsid 9");
    assert_eq!(status(&r.cpl), (0, 0x0b), "invalid namespace");
    // a data length that is not the command's
    let r = c
        .bdev_nvme_send_cmd(&read_cmd(ctrlr, 1, 0, 2, 4096))
        .await
        .expect("short buffer");
    assert_ne!(status(&r.cpl), (0, 0), "a Read of 8 KiB into 4 KiB");
    // refused by the RPC: no such controller, a command that is not 64 bytes
    invalid(
        c.bdev_nvme_send_cmd(&read_cmd("talon-disk-none", 1, 0, 1, 4096))
            .await,
        "unknown controller",
    );
    invalid(
        c.bdev_nvme_send_cmd(&NvmeSendCmd {
            cmdbuf: "AAAA".into(),
            ..read_cmd(ctrlr, 1, 0, 1, 4096)
        })
        .await,
        "a 3-byte command",
    );
}

// ------------------------------------------------------------------ double

#[tokio::test]
async fn nvme_passthrough_reads_and_refusals_on_the_double() {
    let d = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(d.path().join("spdk.sock"))
        .await
        .expect("double");
    let bdf = "0000:00:04.0";
    double.add_pcie_nvme(bdf, 16384, 4096);
    double.write_pcie_nvme(bdf, 0, b"XFSB");
    let c = SpdkClient::new(double.socket());
    c.bdev_nvme_attach_controller(&AttachController::pcie("talon-disk-p1", bdf))
        .await
        .expect("attach");
    send_cmd_contract(&c, "talon-disk-p1", 16384, b"XFSB").await;

    // an ensure refuses it, naming the device, what it holds and the command
    let ops = DiskOps::new(c.clone(), HostRoot::new(d.path()));
    let n = DiskNames::of("p1", &pci_disk()).expect("names");
    let e = ops
        .ensure(&n, &pci_disk(), None, false)
        .await
        .expect_err("an XFS file system");
    assert!(
        matches!(e, DiskError::NotBlank { found: Content::Signature(s), .. } if s == "an XFS file system"),
        "{e:?}"
    );
    let m = e.to_string();
    for want in [
        "NVMe 0000:00:04.0 (bdev talon-disk-p1n1)",
        "an XFS file system",
        "`talon disk format p1 --yes-destroy-data`",
    ] {
        assert!(m.contains(want), "{want}: {m}");
    }
    assert_eq!(double.read_pcie_nvme(bdf, 0, 4), b"XFSB", "nothing written");
    assert!(double.calls("bdev_lvol_create_lvstore") == 0);
    // data in the last MiB, named by its offset
    double.write_pcie_nvme(bdf, 0, &[0; 4]);
    let end = 16384 * 4096 - 100;
    double.write_pcie_nvme(bdf, end, b"x");
    let e = ops.ensure(&n, &pci_disk(), None, false).await.expect_err("data");
    assert!(
        matches!(e, DiskError::NotBlank { found: Content::Data { at }, .. } if at == end),
        "{e:?}"
    );
    // blank: an lvstore is made, and its superblock is what the device then reads
    double.write_pcie_nvme(bdf, end, b"\0");
    let made = ops.ensure(&n, &pci_disk(), None, false).await.expect("blank");
    assert!(made.created);
    assert_eq!(double.read_pcie_nvme(bdf, 0, 8), b"SPDKBLOB");
    // after a restart of the double its lvstore is gone, the superblock stays:
    // refused with the UUID recorded, and without a record as an lvstore that did not load
    double.restart().await.expect("restart");
    c.bdev_nvme_attach_controller(&AttachController::pcie("talon-disk-p1", bdf))
        .await
        .expect("attach again");
    let e = ops
        .ensure(&n, &pci_disk(), Some(&made.lvstore.uuid), false)
        .await
        .expect_err("recorded, not loaded");
    assert!(
        matches!(&e, DiskError::LvstoreNotLoaded { expected, found: Content::Lvstore, .. } if *expected == made.lvstore.uuid),
        "{e:?}"
    );
    let e = ops
        .ensure(&n, &pci_disk(), None, false)
        .await
        .expect_err("an lvstore");
    assert!(
        e.to_string()
            .contains("an lvstore superblock (SPDKBLOB at offset 0) that did not load"),
        "{e}"
    );
    // the one deliberate command: a new lvstore over it
    let again = ops
        .ensure(&n, &pci_disk(), Some(&made.lvstore.uuid), true)
        .await
        .expect("format");
    assert!(again.created && again.lvstore.uuid != made.lvstore.uuid);
    // an lvstore of this name but another UUID than recorded is not taken
    let e = ops
        .ensure(&n, &pci_disk(), Some(&made.lvstore.uuid), false)
        .await
        .expect_err("another uuid");
    assert!(
        matches!(&e, DiskError::LvstoreReplaced { found, .. } if *found == again.lvstore.uuid),
        "{e:?}"
    );
    double.stop().await;
}

/// `disk_format` through the API of a daemon whose V2 engine is the double:
/// refused without `yesDestroyData`, for a ready disk, for an unknown one;
/// on an NVMe disk refused for its file system it makes the lvstore;
/// `disk_add` refuses `wipe` for an NVMe disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_format_through_the_api_on_the_double() {
    use serde_json::{Value, json};
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(d.path().join("run")).expect("run dir");
    let double = SpdkDouble::start(d.path().join("run/spdk.sock"))
        .await
        .expect("double");
    // a stand-in binary: found, never run (the double is adopted)
    let fake = d.path().join("spdk_tgt");
    std::fs::write(&fake, "#!/bin/sh\nexit 1\n").expect("fake spdk_tgt");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let spdk = talon::controllers::engine::selection::SpdkOptions {
        spdk_tgt: Some(fake),
        no_huge: true,
        no_huge_mem_mib: 256,
        ..Default::default()
    };
    // an NVMe device of the double, in a fixture /sys (already on vfio-pci), holding XFS
    let bdf = "0000:00:04.0";
    double.add_pcie_nvme(bdf, 16384, 4096);
    double.write_pcie_nvme(bdf, 0, b"XFSB");
    let dev = d.path().join("sys/bus/pci/devices").join(bdf);
    std::fs::create_dir_all(&dev).expect("mkdir");
    std::fs::create_dir_all(d.path().join("sys/bus/pci/drivers/vfio-pci")).expect("mkdir");
    for (attr, v) in [("vendor", "0x1b36"), ("device", "0x0010"), ("class", "0x010802")] {
        std::fs::write(dev.join(attr), format!("{v}\n")).expect("write");
    }
    std::os::unix::fs::symlink("../../../../bus/pci/drivers/vfio-pci", dev.join("driver")).expect("ln");
    let daemon = serve_daemon::start(talon::serve::ServeOptions {
        stop_targets_on_exit: false,
        host_root: d.path().to_path_buf(),
        ..serve_daemon::opts(d.path(), spdk)
    })
    .await;
    let c = &daemon.client;
    let msg = |e: talon::client::ClientError| e.to_string();

    let img = d.path().join("d1.img");
    zeros_file(&img, 64 * MIB);
    c.call::<_, Value>("disk_add", json!({"name": "d1", "path": img, "wait": true}))
        .await
        .expect("a blank file");
    let e = c
        .call::<_, Value>("disk_format", json!({"name": "d1", "yesDestroyData": true}))
        .await
        .expect_err("a ready disk");
    assert!(msg(e).contains("disk d1 is ready"));
    let e = c
        .call::<_, Value>("disk_format", json!({"name": "nope", "yesDestroyData": true}))
        .await
        .expect_err("unknown");
    assert!(msg(e).contains("nope"));
    let e = c
        .call::<_, Value>("disk_add", json!({"name": "n1", "pci": bdf, "wipe": true}))
        .await
        .expect_err("wipe of an NVMe disk");
    let m = msg(e);
    assert!(m.contains("talon disk format n1 --yes-destroy-data"), "{m}");
    // the NVMe disk: refused for its file system, nothing written
    let e = c
        .call::<_, Value>("disk_add", json!({"name": "n1", "pci": bdf, "wait": true}))
        .await
        .expect_err("an XFS file system");
    let m = msg(e);
    assert!(
        m.contains("an XFS file system") && m.contains("`talon disk format n1 --yes-destroy-data`"),
        "{m}"
    );
    assert_eq!(double.read_pcie_nvme(bdf, 0, 4), b"XFSB");
    let e = c
        .call::<_, Value>("disk_format", json!({"name": "n1"}))
        .await
        .expect_err("not confirmed");
    assert!(msg(e).contains("--yes-destroy-data"));
    assert_eq!(double.read_pcie_nvme(bdf, 0, 4), b"XFSB");
    let v = c
        .call::<_, Value>(
            "disk_format",
            json!({"name": "n1", "yesDestroyData": true, "wait": true, "timeoutSeconds": 60}),
        )
        .await
        .expect("format");
    assert_eq!(v["status"]["state"], "ready", "{v}");
    assert_eq!(v["spec"]["format"], 1, "{v}");
    assert_eq!(double.read_pcie_nvme(bdf, 0, 8), b"SPDKBLOB", "formatted");
    daemon.stop().await;
    double.stop().await;
}

// -------------------------------------------------------------- real SPDK

fn start(run_dir: &Path, spdk_dir: &Path, state: State) -> TestRuntime {
    let opts = SpdkOptions {
        spdk_tgt: None,
        spdk_dir: Some(spdk_dir.to_path_buf()),
        path_var: None,
        no_huge: true,
        no_huge_mem_mib: 1024,
        extra_args: vec!["--disable-cpumask-locks".into()],
        ..SpdkOptions::default()
    };
    let selection = EngineSelection::detect(&opts);
    assert!(selection.v2_available, "{}", selection.reason);
    let cfg = opts.target_config(run_dir);
    let run = run_dir.to_path_buf();
    TestRuntime::start_on(state, move |rt| {
        rt.register(SpdkTargetController::new(cfg, selection))?;
        rt.register(SpdkDiskController::new(&run, HostRoot::new(&run)))
    })
    .expect("runtime")
}

async fn status_where(st: &State, id: &str, what: &str, pred: impl Fn(&DiskStatus) -> bool) -> DiskStatus {
    eventually(what, WAIT, || async {
        st.get_typed::<DiskStatus>(id)
            .expect("get")
            .map(|d| d.spec)
            .filter(|d| pred(d))
    })
    .await
}

fn file_disk(path: &Path) -> Disk {
    Disk {
        path: Some(path.display().to_string()),
        pci: None,
        size_bytes: None,
        cluster_mib: 1,
        block_size: None,
        format: 0,
    }
}

/// Path disks through the disk controller on a real spdk_tgt, the state in
/// redb across talon restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_path_disk_refusals_and_identity() {
    let Some(spdk_dir) = spdk_real::spdk_dir("real_spdk_path_disk_refusals_and_identity") else {
        return;
    };
    let d = tempfile::tempdir().expect("tempdir");
    let db = d.path().join("state.redb");
    let fs = d.path().join("fs.img");
    zeros_file(&fs, 64 * MIB);
    put(&fs, 1080, &[0x53, 0xef]);
    let img = d.path().join("d1.img");
    zeros_file(&img, 256 * MIB);

    // 1. a foreign file system: refused, named, nothing written
    let st = State::open(&db).expect("state");
    let rt = start(d.path(), &spdk_dir, st.clone());
    let fs_before = digest(&fs);
    st.create_typed("fs", "", &file_disk(&fs)).expect("disk fs");
    let s = status_where(&st, "fs", "disk fs refused", |s| s.state == ObjectState::Failed).await;
    for want in [
        fs.display().to_string().as_str(),
        "an ext2/3/4 file system",
        "`talon disk format fs --yes-destroy-data`",
    ] {
        assert!(s.message.contains(want), "{want}: {}", s.message);
    }
    assert_eq!(digest(&fs), fs_before, "the file system is as it was");
    assert!(st.get_typed::<DiskIdentity>("fs").expect("get").is_none());

    // 2. a blank file: lvstore made, its identity recorded
    st.create_typed("d1", "", &file_disk(&img)).expect("disk d1");
    let s1 = status_where(&st, "d1", "disk d1 ready", |s| s.state == ObjectState::Ready).await;
    let id = st
        .get_typed::<DiskIdentity>("d1")
        .expect("get")
        .expect("identity")
        .spec;
    assert_eq!(id.lvstore_uuid, s1.lvstore_uuid);
    assert!(id.created, "{id:?}");
    assert_eq!(id.device, img.display().to_string());
    eprintln!("d1: lvstore {} uuid {}", s1.lvstore, s1.lvstore_uuid);
    rt.stop().await;
    drop(st);

    // 3. its superblock damaged (a byte inside it flipped: the CRC no longer
    // matches, the signature stays): after a talon restart it does not load
    let mut sb = head(&img, 64);
    assert_eq!(&sb[..8], b"SPDKBLOB");
    sb[40] ^= 0xff;
    put(&img, 0, &sb[..64]);
    let before = digest(&img);
    let st = State::open(&db).expect("state reopened");
    assert_eq!(
        st.get_typed::<DiskIdentity>("d1")
            .expect("get")
            .map(|i| i.spec.lvstore_uuid),
        Some(s1.lvstore_uuid.clone()),
        "the identity is persisted"
    );
    let rt = start(d.path(), &spdk_dir, st.clone());
    let s = status_where(&st, "d1", "disk d1 refused (damaged)", |s| {
        s.state == ObjectState::Failed
    })
    .await;
    for want in [
        img.display().to_string().as_str(),
        s1.lvstore_uuid.as_str(),
        "did not load",
        "an lvstore superblock (SPDKBLOB at offset 0) that did not load",
        "`talon disk format d1 --yes-destroy-data`",
    ] {
        assert!(s.message.contains(want), "{want}: {}", s.message);
    }
    // 4. then its first MiB zeroed (the superblock gone): the device reads blank,
    // and is still refused (without the identity talon would make a new lvstore here)
    put(&img, 0, &vec![0u8; MIB as usize]);
    let zeroed = digest(&img);
    assert_ne!(zeroed, before);
    let s = status_where(&st, "d1", "disk d1 refused (zeroed)", |s| {
        s.state == ObjectState::Failed && s.message.contains("holds only zeros")
    })
    .await;
    assert!(s.message.contains(&s1.lvstore_uuid), "{}", s.message);
    // a few more reconciles (every 2 s while failed): nothing written
    let client = SpdkClient::new(d.path().join("spdk.sock"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(digest(&img), zeroed, "nothing written over the refused disk");
    assert!(
        client
            .bdev_lvol_get_lvstores(&LvstoreSelector::default())
            .await
            .expect("lvstores")
            .iter()
            .all(|l| l.name != "talon-d1"),
        "no lvstore made"
    );
    // 5. the one deliberate command: format request 1, served once
    let cur = st.get_typed::<Disk>("d1").expect("get").expect("disk");
    st.update_typed(
        "d1",
        "",
        Some(cur.metadata.version),
        &Disk {
            format: 1,
            ..cur.spec
        },
    )
    .expect("format request");
    let s2 = status_where(&st, "d1", "disk d1 formatted", |s| s.state == ObjectState::Ready).await;
    assert_ne!(s2.lvstore_uuid, s1.lvstore_uuid);
    let id = st
        .get_typed::<DiskIdentity>("d1")
        .expect("get")
        .expect("identity")
        .spec;
    assert_eq!(
        (id.lvstore_uuid.as_str(), id.format_served),
        (s2.lvstore_uuid.as_str(), 1)
    );
    // 6. removed: the identity goes with it
    st.destroy("config", "Disk", "d1", "").expect("remove");
    st.destroy("config", "Disk", "fs", "").expect("remove");
    eventually("d1's identity dropped", WAIT, || async {
        st.get_typed::<DiskIdentity>("d1")
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    rt.stop().await;
}

/// The NVMe path on a real spdk_tgt: an aio bdev over a file exported over
/// NVMe/TCP on 127.0.0.1 and attached from the same target as controller
/// `talon-disk-p1` is an NVMe bdev as a PCI disk's is; DiskOps reads its
/// ends with NVMe Reads (`bdev_nvme_send_cmd`) and the file tells what was
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_nvme_disk_is_read_before_an_lvstore() {
    let test = "real_spdk_nvme_disk_is_read_before_an_lvstore";
    let Some(spdk_dir) = spdk_real::spdk_dir(test) else {
        return;
    };
    let d = tempfile::tempdir().expect("tempdir");
    let cfg = spdk_real::target_cfg(&d.path().join("run"), &spdk_dir, 1024);
    let t = Target::spawn(&cfg).await.expect("spdk_tgt");
    let _reaper = spdk_real::Reaper::new(&t, &cfg);
    let c = t.client().clone();
    let img = d.path().join("nvme.img");
    let len = 64 * MIB;
    zeros_file(&img, len);
    put(&img, 0, b"XFSB");
    c.bdev_aio_create(&AioCreate {
        filename: img.display().to_string(),
        name: "src".into(),
        block_size: Some(4096),
        readonly: false,
        fallocate: false,
    })
    .await
    .expect("aio");
    c.nvmf_create_transport(&CreateTransport::tcp())
        .await
        .expect("transport");
    let nqn = "nqn.2024-01.io.talon:disk-identity";
    c.nvmf_create_subsystem(&CreateSubsystem {
        nqn: nqn.into(),
        allow_any_host: Some(true),
        serial_number: None,
        model_number: None,
        max_namespaces: None,
        ana_reporting: None,
        min_cntlid: None,
        max_cntlid: None,
    })
    .await
    .expect("subsystem");
    let id = uuid::Uuid::from_u128(0x54a1_0d15_c0de_4000_8000_0000_0000_0054);
    c.nvmf_subsystem_add_ns(&AddNamespace::with_id(nqn, "src", id))
        .await
        .expect("ns");
    let port = spdk_real::free_port();
    c.nvmf_subsystem_add_listener(&SubsystemListener {
        nqn: nqn.into(),
        listen_address: ListenAddress::tcp([127, 0, 0, 1].into(), port),
    })
    .await
    .expect("listener");
    let attach = || async {
        c.bdev_nvme_attach_controller(&AttachController::tcp(
            "talon-disk-p1",
            [127, 0, 0, 1].into(),
            port,
            nqn,
        ))
        .await
        .expect("attach")
    };
    assert_eq!(attach().await, vec!["talon-disk-p1n1".to_owned()]);
    send_cmd_contract(&c, "talon-disk-p1", len / 4096, b"XFSB").await;

    let ops = DiskOps::new(c.clone(), HostRoot::new(d.path()));
    let spec = pci_disk();
    let n = DiskNames::of("p1", &spec).expect("names");
    // a file system: refused, nothing written
    let before = digest(&img);
    let e = ops.ensure(&n, &spec, None, false).await.expect_err("XFS");
    assert!(
        matches!(e, DiskError::NotBlank { found: Content::Signature(s), .. } if s == "an XFS file system"),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("`talon disk format p1 --yes-destroy-data`"),
        "{e}"
    );
    assert_eq!(digest(&img), before, "nothing written");
    // data in the last MiB, at its offset (read in 32 KiB Reads)
    put(&img, 0, &[0; 4]);
    put(&img, len - 100, b"x");
    let e = ops.ensure(&n, &spec, None, false).await.expect_err("data");
    assert!(
        matches!(e, DiskError::NotBlank { found: Content::Data { at }, .. } if at == len - 100),
        "{e:?}"
    );
    // blank: the lvstore is made through the NVMe bdev
    put(&img, len - 100, b"\0");
    let made = ops.ensure(&n, &spec, None, false).await.expect("blank");
    assert!(made.created);
    assert_eq!(&head(&img, 8), b"SPDKBLOB");
    // detached (the lvstore unloads with its bdev), its superblock damaged, attached again:
    // it does not load, and is refused with or without the record; nothing written
    c.bdev_nvme_detach_controller(&ByName::new("talon-disk-p1"))
        .await
        .expect("detach");
    eventually("lvstore unloaded", WAIT, || async {
        c.bdev_lvol_get_lvstores(&LvstoreSelector::default())
            .await
            .ok()
            .filter(|v| v.is_empty())
            .map(|_| ())
    })
    .await;
    let mut sb = head(&img, 64);
    sb[40] ^= 0xff;
    put(&img, 0, &sb);
    let before = digest(&img);
    attach().await;
    let e = ops
        .ensure(&n, &spec, Some(&made.lvstore.uuid), false)
        .await
        .expect_err("damaged");
    assert!(
        matches!(&e, DiskError::LvstoreNotLoaded { expected, found: Content::Lvstore, .. } if *expected == made.lvstore.uuid),
        "{e:?}"
    );
    eprintln!("refused: {e}");
    let e = ops.ensure(&n, &spec, None, false).await.expect_err("unrecorded");
    assert!(
        matches!(
            e,
            DiskError::NotBlank {
                found: Content::Lvstore,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(digest(&img), before, "nothing written over the damaged lvstore");
    // formatting on request: a new lvstore
    let again = ops
        .ensure(&n, &spec, Some(&made.lvstore.uuid), true)
        .await
        .expect("format");
    assert!(again.created && again.lvstore.uuid != made.lvstore.uuid);
    c.bdev_lvol_delete_lvstore(&LvstoreSelector::name("talon-p1"))
        .await
        .expect("delete lvstore");
    c.bdev_nvme_detach_controller(&ByName::new("talon-disk-p1"))
        .await
        .expect("detach");
    t.stop(cfg.stop_grace).await.expect("stop");
}
