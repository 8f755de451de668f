//! The data mover (`spdk::volume::mover`) on a real spdk_tgt
//! (`TALON_SPDK_DIR`): talon's own NVMe/TCP host writes a thin lvol and
//! reads its snapshot back through temporary exports on 127.0.0.1, with
//! no kernel nvme_tcp and no file; only clusters with data are allocated;
//! every export goes when its session ends (closed or dropped), and the
//! sweep removes what another run left.

#[path = "support/spdk_real.rs"]
mod spdk_real;

use std::os::unix::fs::FileExt;

use bytes::Bytes;
use spdk_real::pattern;
use talon::spdk::SpdkClient;
use talon::spdk::rpc::{ByName, CreateSubsystem, GetLvols, LvolCreate, LvolSnapshot};
use talon::spdk::target::Target;
use talon::spdk::volume::Inventory;
use talon::spdk::volume::mover::{self, Purpose, Session};

const MIB: u64 = 1 << 20;

/// A lvstore `talon-m` (1 MiB clusters) on an aio bdev over a sparse
/// 256 MiB file in `dir` and a thin lvol `v` of `mib`.
async fn lvol(c: &SpdkClient, dir: &std::path::Path, mib: u64) {
    spdk_real::aio_lvstore(c, &dir.join("disk.img"), 256 * MIB, "m0", "talon-m").await;
    c.bdev_lvol_create(&LvolCreate::thin("talon-m", "v", mib))
        .await
        .expect("lvol");
}

async fn allocated(c: &SpdkClient, name: &str) -> u64 {
    c.bdev_lvol_get_lvols(&GetLvols::default())
        .await
        .expect("lvols")
        .into_iter()
        .find(|l| l.name == name)
        .expect("the lvol")
        .num_allocated_clusters
}

async fn mover_subsystems(c: &SpdkClient) -> Vec<String> {
    Inventory::load(c)
        .await
        .expect("inventory")
        .subsystems
        .into_iter()
        .map(|s| s.nqn)
        .filter(|n| n.starts_with(&mover::nqn_prefix()))
        .collect()
}

async fn target(test: &str) -> Option<(tempfile::TempDir, Target, spdk_real::Reaper)> {
    let spdk = spdk_real::spdk_dir(test)?;
    let d = tempfile::tempdir().expect("tempdir");
    let cfg = spdk_real::target_cfg(&d.path().join("run"), &spdk, 1024);
    let t = Target::spawn(&cfg).await.expect("spdk_tgt");
    let r = spdk_real::Reaper::new(&t, &cfg);
    Some((d, t, r))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_the_mover_writes_a_thin_lvol_and_reads_its_snapshot_back() {
    let test = "real_spdk_the_mover_writes_a_thin_lvol_and_reads_its_snapshot_back";
    let Some((d, t, _reaper)) = target(test).await else {
        return;
    };
    let c = t.client().clone();
    lvol(&c, d.path(), 64).await;
    let (a, b) = (pattern(1, 3 * MIB as usize), pattern(2, 64 << 10));
    let s = Session::open(&c, "talon-m/v", Purpose::Test, mover::DEPTH)
        .await
        .expect("open a write session");
    assert_eq!((s.size(), s.block_size()), (64 * MIB, 4096));
    // 3 MiB in one call (split into the controller's transfer size), 64 KiB at 40 MiB
    let started = std::time::Instant::now();
    s.write(0, Bytes::from(a.clone())).await.expect("write a");
    eprintln!(
        "{test}: 3 MiB written in {:.3} s",
        started.elapsed().as_secs_f64()
    );
    s.write(40 * MIB, Bytes::from(b.clone())).await.expect("write b");
    assert_eq!(s.read(40 * MIB, b.len()).await.expect("read b"), b);
    let e = s
        .read(63 * MIB, 2 * MIB as usize)
        .await
        .expect_err("beyond the end");
    let e = talon::util::error_chain(&e);
    assert!(e.contains("beyond"), "{e}");
    assert_eq!(mover_subsystems(&c).await.len(), 1, "the session's export");
    s.close().await.expect("close");
    assert!(mover_subsystems(&c).await.is_empty(), "closed: its export gone");
    assert_eq!(allocated(&c, "v").await, 4, "3 clusters of a, 1 of b: thin");

    c.bdev_lvol_snapshot(&LvolSnapshot {
        lvol_name: "talon-m/v".into(),
        snapshot_name: "v-snap".into(),
    })
    .await
    .expect("snapshot");
    let s = Session::open(&c, "talon-m/v-snap", Purpose::Test, mover::DEPTH)
        .await
        .expect("open a read session of the snapshot");
    let mut want = vec![0u8; 64 * MIB as usize];
    want[..a.len()].copy_from_slice(&a);
    want[40 * MIB as usize..40 * MIB as usize + b.len()].copy_from_slice(&b);
    let mut got = Vec::new();
    let mut with_data = 0;
    let started = std::time::Instant::now();
    s.read_in_order(mover::CHUNK, 4, |at, d| {
        assert_eq!(at, got.len() as u64, "in order");
        with_data += usize::from(mover::has_data(d));
        got.extend_from_slice(d);
        Ok(())
    })
    .await
    .expect("read the snapshot");
    let read_secs = started.elapsed().as_secs_f64();
    assert!(got == want, "the snapshot reads as written");
    // for the report, not asserted: the old way (shallow copy of the chain into a sparse file)
    let inv = Inventory::load(&c).await.expect("inventory");
    let chain = talon::spdk::volume::to_file::Chain::of(&inv, "talon-m/v-snap").expect("chain");
    let started = std::time::Instant::now();
    talon::spdk::volume::to_file::copy_to_file(&c, &chain, &d.path().join("staged.img"), "talon-staging")
        .await
        .expect("shallow copy");
    eprintln!(
        "{test}: 64 MiB snapshot (4 MiB data) read through the mover in {:.3} s ({:.0} MiB/s), \
         shallow-copied into a staging file in {:.3} s",
        read_secs,
        64.0 / read_secs,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(with_data, 4, "chunks with data");
    // a snapshot is read-only: so is its export
    let e = s
        .write(0, Bytes::from(vec![1u8; 4096]))
        .await
        .expect_err("a write into a snapshot");
    eprintln!(
        "{test}: a write into the snapshot: {}",
        talon::util::error_chain(&e)
    );
    // refused by the target with an NVMe status, not a broken connection
    assert!(
        matches!(
            &e,
            talon::spdk::volume::mover::MoverError::Wire { source, .. }
                if matches!(**source, talon::spdk::volume::mover::tcp::WireError::Status { .. })
        ),
        "{e:?}"
    );
    // dropped without close: the export still goes
    drop(s);
    talon::runtime::testing::eventually(
        "a dropped session's export removed",
        std::time::Duration::from_secs(10),
        || async { mover_subsystems(&c).await.is_empty().then_some(()) },
    )
    .await;
    let e = Session::open(&c, "talon-m/nosuch", Purpose::Test, 4)
        .await
        .expect_err("an unknown bdev");
    assert!(e.to_string().contains("nosuch"), "{e}");
    assert!(
        mover_subsystems(&c).await.is_empty(),
        "a failed open leaves nothing"
    );
    t.stop(std::time::Duration::from_secs(5)).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_the_mover_fills_a_thin_lvol_with_only_a_files_data_and_sweeps_other_runs() {
    let test = "real_spdk_the_mover_fills_a_thin_lvol_with_only_a_files_data_and_sweeps_other_runs";
    let Some((d, t, _reaper)) = target(test).await else {
        return;
    };
    let c = t.client().clone();
    lvol(&c, d.path(), 32).await;
    // a sparse file: data at 1 MiB and at 20 MiB + 4 KiB, 2 MiB of written zeros at 8 MiB
    let file = d.path().join("img");
    let f = std::fs::File::create(&file).expect("file");
    f.set_len(32 * MIB).expect("size");
    let (a, b) = (pattern(3, MIB as usize), pattern(4, 8192));
    f.write_all_at(&a, MIB).expect("a");
    f.write_all_at(&vec![0u8; 2 * MIB as usize], 8 * MIB)
        .expect("zeros");
    f.write_all_at(&b, 20 * MIB + 4096).expect("b");
    let filled = mover::fill_from_file(&c, &file, "talon-m/v", mover::DEPTH)
        .await
        .expect("fill");
    eprintln!("{test}: {filled:?}");
    assert_eq!(filled.written, 2 * MIB, "two chunks with data written, zeros not");
    assert_eq!(allocated(&c, "v").await, 2, "two clusters: thin");
    let s = Session::open(&c, "talon-m/v", Purpose::Test, 8)
        .await
        .expect("open");
    assert_eq!(s.read(MIB, a.len()).await.expect("read a"), a);
    assert_eq!(s.read(20 * MIB + 4096, b.len()).await.expect("read b"), b);
    assert!(!mover::has_data(
        &s.read(8 * MIB, 2 * MIB as usize).await.expect("zeros")
    ));

    // another run's export (a crash mid-move) goes; this run's stays
    let other = format!(
        "{}0123456789ab:restore:{}",
        mover::nqn_prefix(),
        uuid::Uuid::nil().simple()
    );
    c.nvmf_create_subsystem(&CreateSubsystem {
        nqn: other.clone(),
        allow_any_host: Some(false),
        serial_number: None,
        model_number: None,
        max_namespaces: Some(1),
        ana_reporting: None,
        min_cntlid: None,
        max_cntlid: None,
    })
    .await
    .expect("another run's subsystem");
    // another run in this process (a client of its own run, as a second
    // serve's would be): its export goes too
    c.bdev_lvol_create(&LvolCreate::thin("talon-m", "w", 4))
        .await
        .expect("lvol w");
    let run2 = Session::open(&SpdkClient::new(c.socket()), "talon-m/w", Purpose::Test, 2)
        .await
        .expect("another run's session");
    let inv = Inventory::load(&c).await.expect("inventory");
    let mut swept = mover::sweep(&c, &inv).await;
    swept.sort();
    let mut want = vec![other.clone(), run2.nqn().to_owned()];
    want.sort();
    assert_eq!(swept, want);
    drop(run2);
    assert_eq!(
        mover_subsystems(&c).await,
        vec![s.nqn().to_owned()],
        "this run's session stays"
    );
    s.close().await.expect("close");
    c.bdev_lvol_delete(&ByName::new("talon-m/v"))
        .await
        .expect("delete");
    t.stop(std::time::Duration::from_secs(5)).await.expect("stop");
}

/// Issue 55: a backup restored straight from its store into a new thin
/// replica lvol (`mover::restore::fill_replica` from `Source::Backup`), no
/// file: the data reads back at the replica's data offset, only the 1 MiB
/// chunks with data are written (a half-empty block, a block of written
/// zeros and the holes are not), the export goes; a standby's lvols
/// (`mover::restore::fill_standby`) restored from it, then brought to a
/// newer backup incrementally, read exactly that backup, its blocks that
/// became zeros included; and a backup with a missing block fails naming
/// it and leaves no lvol behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_the_mover_restores_a_backup_with_holes_from_its_store_into_a_thin_lvol() {
    use std::sync::Arc;
    use talon::backupstore::{BackupRequest, Credentials, Progress, SparseImage, Store, format, ops};
    use talon::spdk::volume::mover::restore::{FromBackup, Source, fill_replica};
    let test = "real_spdk_the_mover_restores_a_backup_with_holes_from_its_store_into_a_thin_lvol";
    let Some((d, t, _reaper)) = target(test).await else {
        return;
    };
    let c = t.client().clone();
    lvol(&c, d.path(), 8).await;
    const SIZE: u64 = 32 * MIB;
    const ROOM: u64 = MIB;
    // a 32 MiB image: 1 MiB of data in the first 2 MiB block (its second half
    // zeros), 2 MiB of written zeros at 8 MiB, 4 MiB at 20 MiB, 8 KiB at 30 MiB + 4 KiB
    let image = d.path().join("image.img");
    let f = std::fs::File::create(&image).expect("image");
    f.set_len(SIZE).expect("size");
    f.write_all_at(&pattern(5, MIB as usize), 0).expect("a");
    f.write_all_at(&vec![0u8; 2 * MIB as usize], 8 * MIB)
        .expect("zeros");
    f.write_all_at(&pattern(6, 4 * MIB as usize), 20 * MIB)
        .expect("b");
    f.write_all_at(&pattern(7, 8192), 30 * MIB + 4096).expect("c");
    drop(f);
    let want = std::fs::read(&image).expect("read the image");
    let store_dir = d.path().join("store");
    std::fs::create_dir(&store_dir).expect("the target's folder");
    let target = format!("vfs://{}", store_dir.display());
    let store = Store::open(&target, &Credentials::none()).expect("store");
    let img = SparseImage::open(&image, 0, SIZE).expect("sparse image");
    let (b, _) = ops::create(
        &store,
        &BackupRequest::v2("src", "b1", "s", SIZE),
        &img,
        None,
        &Progress::default(),
    )
    .await
    .expect("backup");
    let from = |backup: &str| {
        Source::Backup(FromBackup {
            target: target.clone(),
            store: store.clone(),
            volume: "src".into(),
            backup: backup.into(),
            data_offset: ROOM,
            progress: Arc::new(Progress::default()),
        })
    };

    let started = std::time::Instant::now();
    fill_replica(&c, &from("b1"), "talon-m", "rb-r0", (ROOM + SIZE) / MIB)
        .await
        .expect("restore from the store");
    eprintln!(
        "{test}: {} blocks restored in {:.3} s",
        b.blocks.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(mover_subsystems(&c).await.is_empty(), "the restore's export gone");
    assert_eq!(
        allocated(&c, "rb-r0").await,
        6,
        "1 + 4 + 1 clusters of data: the zeros and holes not written"
    );
    let s = Session::open(&c, "talon-m/rb-r0", Purpose::Test, 8)
        .await
        .expect("open the restored replica");
    assert!(
        !mover::has_data(&s.read(0, ROOM as usize).await.expect("the room")),
        "nothing written before the data offset"
    );
    assert!(
        s.read(ROOM, SIZE as usize).await.expect("read back") == want,
        "the replica reads the backup at its data offset"
    );
    s.close().await.expect("close");

    // a standby's restores (mover::restore::fill_standby): b1 into two new thin lvols,
    // then b2 onto them, incremental: b2 zeroes all of b1's first block and the first
    // half of its block at 20 MiB, and adds a block at 12 MiB; only the blocks that
    // differ are fetched, and both lvols then read exactly b2 (the zeros too)
    let standby = ["talon-m/sb-r0.dr", "talon-m/sb-r1.dr"];
    for n in standby {
        let name = n.rsplit('/').next().expect("name");
        c.bdev_lvol_create(&LvolCreate::thin("talon-m", name, (ROOM + SIZE) / MIB))
            .await
            .expect("standby lvol");
    }
    let bdevs = standby.map(String::from);
    let p = Progress::default();
    let onto = |base, backup| mover::restore::Onto {
        store: &store,
        volume: "src",
        backup,
        base,
        data_offset: ROOM,
    };
    let full = mover::restore::fill_standby(&c, &onto(None, "b1"), &bdevs, &p)
        .await
        .expect("b1 into the standby's lvols");
    assert_eq!(full.blocks_downloaded, b.blocks.len() as u64, "{full:?}");
    let image2 = d.path().join("image2.img");
    std::fs::copy(&image, &image2).expect("copy");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&image2)
        .expect("image2");
    f.write_all_at(&vec![0u8; MIB as usize], 0)
        .expect("block 0 zeroed");
    f.write_all_at(&vec![0u8; MIB as usize], 20 * MIB)
        .expect("half of block 20 zeroed");
    f.write_all_at(&pattern(8, MIB as usize), 12 * MIB)
        .expect("a new block");
    drop(f);
    let want2 = std::fs::read(&image2).expect("read image2");
    let img2 = SparseImage::open(&image2, 0, SIZE).expect("sparse image");
    let (b2, _) = ops::create(
        &store,
        &BackupRequest::v2("src", "b2", "s2", SIZE),
        &img2,
        Some(&b),
        &Progress::default(),
    )
    .await
    .expect("backup b2");
    let started = std::time::Instant::now();
    let delta = mover::restore::fill_standby(&c, &onto(Some("b1"), "b2"), &bdevs, &p)
        .await
        .expect("b2 onto b1 in the standby's lvols");
    eprintln!(
        "{test}: incremental standby restore {delta:?} into 2 lvols in {:.3} s",
        started.elapsed().as_secs_f64()
    );
    let changed = b2
        .blocks
        .iter()
        .filter(|r| {
            !b.blocks
                .iter()
                .any(|o| o.offset == r.offset && o.checksum == r.checksum)
        })
        .count() as u64;
    assert_eq!(
        delta.blocks_downloaded, changed,
        "only b2's changed blocks fetched: {delta:?}"
    );
    for n in standby {
        let s = Session::open(&c, n, Purpose::Test, 8).await.expect("open");
        let got = s.read(ROOM, SIZE as usize).await.expect("read back");
        for (k, (g, w)) in got
            .chunks(MIB as usize)
            .zip(want2.chunks(MIB as usize))
            .enumerate()
        {
            assert!(g == w, "{n}: MiB {k} is not b2's");
        }
        s.close().await.expect("close");
    }
    assert!(
        mover_subsystems(&c).await.is_empty(),
        "the standby restores' exports gone"
    );

    // a block gone from the store: the restore fails naming it, nothing left
    let sum = &b
        .blocks
        .iter()
        .find(|r| r.offset == 20 * MIB)
        .expect("block")
        .checksum;
    let rel = format::block_path("src", sum);
    let path = [store_dir.join(&rel), store_dir.join("backupstore").join(&rel)]
        .into_iter()
        .find(|p| p.exists())
        .expect("the block's file");
    std::fs::remove_file(&path).expect("remove the block");
    let e = fill_replica(&c, &from("b1"), "talon-m", "rb-r1", (ROOM + SIZE) / MIB)
        .await
        .expect_err("a block missing");
    let e = talon::util::error_chain(&e);
    eprintln!("{test}: {e}");
    assert!(e.contains(sum.as_str()), "the error names the block: {e}");
    let inv = Inventory::load(&c).await.expect("inventory");
    assert!(
        inv.find_lvol("rb-r1").is_none() && inv.find_lvol("rb-r1.rst").is_none(),
        "a failed restore leaves no lvol"
    );
    assert!(mover_subsystems(&c).await.is_empty(), "nor an export");
    t.stop(std::time::Duration::from_secs(5)).await.expect("stop");
}

/// A snapshot copied inside spdk_tgt (`mover::copy::within`: a copy of a
/// snapshot into a new volume, a Longhorn clone into an unexported engine): a chain of two snapshots where the newer one
/// overwrites some of the older one's data and writes zeros over some of
/// it; the copy reads back equal to the newer snapshot through the mover,
/// allocates only the clusters the chain holds, reports each copy's id and
/// the whole size as copied. A copy that still runs is waited for before
/// the next try starts. A target SPDK cannot copy into (another block
/// size) is refused before anything is written: `None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_snapshot_chain_is_copied_inside_the_target_equal_and_thin() {
    let Some((dir, t, _r)) =
        target("real_spdk_a_snapshot_chain_is_copied_inside_the_target_equal_and_thin").await
    else {
        return;
    };
    let c = t.client();
    lvol(c, dir.path(), 64).await;
    let v = Session::open(c, "talon-m/v", Purpose::Test, mover::DEPTH)
        .await
        .expect("export v");
    // s1: 1 MiB of data at 0, 4 and 9 MiB
    for at in [0, 4, 9] {
        v.write(at * MIB, Bytes::from(pattern(at, MIB as usize)))
            .await
            .expect("write");
    }
    v.close().await.expect("close");
    c.bdev_lvol_snapshot(&LvolSnapshot {
        lvol_name: "talon-m/v".into(),
        snapshot_name: "s1".into(),
    })
    .await
    .expect("s1");
    // s2: 4 MiB overwritten, 9 MiB written with zeros, 20 MiB new
    let v = Session::open(c, "talon-m/v", Purpose::Test, mover::DEPTH)
        .await
        .expect("export v");
    v.write(4 * MIB, Bytes::from(pattern(100, MIB as usize)))
        .await
        .expect("write");
    v.write(9 * MIB, Bytes::from(vec![0u8; MIB as usize]))
        .await
        .expect("zeros");
    v.write(20 * MIB, Bytes::from(pattern(20, MIB as usize)))
        .await
        .expect("write");
    v.close().await.expect("close");
    c.bdev_lvol_snapshot(&LvolSnapshot {
        lvol_name: "talon-m/v".into(),
        snapshot_name: "s2".into(),
    })
    .await
    .expect("s2");
    let read_all = |bdev: &'static str| async move {
        let s = Session::open(c, bdev, Purpose::Test, mover::DEPTH)
            .await
            .expect("export");
        let mut all = Vec::new();
        s.read_in_order(mover::CHUNK, 4, |_, d| {
            all.extend_from_slice(d);
            Ok(())
        })
        .await
        .expect("read");
        s.close().await.expect("close");
        all
    };
    let want = read_all("talon-m/s2").await;
    assert_eq!(
        &want[9 * MIB as usize..10 * MIB as usize],
        &vec![0u8; MIB as usize][..]
    );

    c.bdev_lvol_create(&LvolCreate::thin("talon-m", "dst", 64))
        .await
        .expect("dst");
    let inv = Inventory::load(c).await.expect("inventory");
    let ops = std::sync::Mutex::new(Vec::new());
    let started = |op: u32| ops.lock().expect("ops").push(op);
    let copied = std::sync::atomic::AtomicU64::new(0);
    let w = mover::copy::Within {
        snap: "talon-m/s2",
        dst: "talon-m/dst",
        earlier: None,
        started: &started,
        size: 64 * MIB,
    };
    let f = mover::copy::within(c, &inv, &w, &copied)
        .await
        .expect("copy within")
        .expect("not refused");
    assert_eq!(
        ops.lock().expect("ops").len(),
        2,
        "one copy per snapshot of the chain"
    );
    assert_eq!(copied.load(std::sync::atomic::Ordering::Relaxed), 64 * MIB);
    assert_eq!(
        read_all("talon-m/dst").await,
        want,
        "the copy reads as the snapshot does"
    );
    // s1's 3 clusters and s2's 3: 0, 4, 9 (zeros written), 20
    assert_eq!(allocated(c, "dst").await, 4, "only the clusters the chain holds");
    assert_eq!(f.written, 6 * MIB, "each snapshot's own clusters, once each");
    assert!(
        mover_subsystems(c).await.is_empty(),
        "no export for a copy inside the target"
    );

    // a second try waits for the copy the first left running: the ids of the
    // first are done, so it starts at once and writes the same data again
    let last = *ops.lock().expect("ops").last().expect("an id");
    let w2 = mover::copy::Within {
        earlier: Some(last),
        ..w
    };
    mover::copy::within(c, &inv, &w2, &copied)
        .await
        .expect("second try")
        .expect("not refused");
    assert_eq!(read_all("talon-m/dst").await, want);

    // a 512-byte-block bdev: SPDK v26.05 would copy into it at the wrong
    // offsets (a real target did); refused, nothing written
    c.typed::<_, String>(
        "bdev_malloc_create",
        &serde_json::json!({"name": "m512", "num_blocks": 64 * 2048, "block_size": 512}),
    )
    .await
    .expect("malloc");
    let inv = Inventory::load(c).await.expect("inventory with m512");
    assert_eq!(inv.bdevs.get("m512").map(|b| b.block_size), Some(512));
    let w3 = mover::copy::Within {
        dst: "m512",
        earlier: None,
        ..w
    };
    let r = mover::copy::within(c, &inv, &w3, &copied)
        .await
        .expect("no error");
    assert!(
        r.is_none(),
        "another block size: refused before anything was written"
    );
    assert!(
        read_all("m512").await.iter().all(|b| *b == 0),
        "nothing written into it"
    );
}

/// The allocation map (`mover::map`): spdk_tgt shallow-copies each lvol of
/// a chain into an NVMe/TCP target talon serves itself, which records where
/// it was written and keeps no data. The map names exactly the clusters
/// each snapshot holds of its own (1 MiB clusters here): s1's three, s2's
/// one, and their union for the two; the controller is detached after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_the_allocation_map_names_the_clusters_each_snapshot_holds() {
    let test = "real_spdk_the_allocation_map_names_the_clusters_each_snapshot_holds";
    let Some((d, t, _reaper)) = target(test).await else {
        return;
    };
    let c = t.client().clone();
    lvol(&c, d.path(), 64).await;
    let s = Session::open(&c, "talon-m/v", Purpose::Test, mover::DEPTH)
        .await
        .expect("open a write session");
    // s1: clusters 3 (a part of it), 10 and 11; s2: cluster 20
    s.write(3 * MIB + 4096, Bytes::from(pattern(1, 8192)))
        .await
        .expect("write");
    s.write(10 * MIB, Bytes::from(pattern(2, 2 * MIB as usize)))
        .await
        .expect("write");
    let snap = |name: &'static str| {
        let c = c.clone();
        async move {
            c.bdev_lvol_snapshot(&LvolSnapshot {
                lvol_name: "talon-m/v".into(),
                snapshot_name: name.into(),
            })
            .await
            .expect("snapshot");
        }
    };
    snap("s1").await;
    s.write(20 * MIB + MIB / 2, Bytes::from(pattern(3, 4096)))
        .await
        .expect("write");
    snap("s2").await;
    s.close().await.expect("close");

    let map = |lvols: &'static [&'static str]| {
        let c = c.clone();
        async move {
            let lvols: Vec<String> = lvols.iter().map(|l| format!("talon-m/{l}")).collect();
            let started = std::time::Instant::now();
            let r = mover::map::allocated(&c, &lvols, 64 * MIB, 4096)
                .await
                .unwrap_or_else(|e| panic!("map of {lvols:?}: {}", talon::util::error_chain(&e)));
            eprintln!("{test}: map of {lvols:?} in {:?}", started.elapsed());
            r.iter().collect::<Vec<_>>()
        }
    };
    let cluster = |k: u64, n: u64| (k * MIB, (k + n) * MIB);
    assert_eq!(map(&["s1"]).await, [cluster(3, 1), cluster(10, 2)]);
    assert_eq!(map(&["s2"]).await, [cluster(20, 1)]);
    assert_eq!(
        map(&["s1", "s2"]).await,
        [cluster(3, 1), cluster(10, 2), cluster(20, 1)]
    );
    let inv = Inventory::load(&c).await.expect("inventory");
    assert!(
        !inv.bdevs.values().any(|b| b.name.starts_with(mover::map::PREFIX)),
        "the map's controller is detached"
    );

    // a backup reads only the mapped blocks, and takes what it took reading
    // every block (an empty listing: no map), full and incremental
    use futures::StreamExt as _;
    use talon::spdk::volume::mover::backup::{BackupRead, BackupReader};
    let read = |base: Option<&str>| BackupRead {
        snapshot: "talon-m/s2".into(),
        base: base.map(str::to_owned),
        data_offset: 0,
        size: 64 * MIB,
    };
    for (base, mapped) in [(None, 4 * MIB), (Some("talon-m/s1"), MIB)] {
        let mut took = Vec::new();
        for listing in [&inv, &Inventory::default()] {
            let r = BackupReader::open(&c, listing, read(base))
                .await
                .expect("a backup's reader");
            let blocks: Vec<(u64, bool)> = r
                .blocks(2 * MIB)
                .map(|b| b.map(|b| (b.offset, b.data.is_some())).expect("a block"))
                .collect()
                .await;
            took.push((r.mapped(), blocks));
            r.close().await.expect("close");
        }
        assert_eq!(took[0].0, Some(mapped), "the map over base {base:?}");
        assert_eq!(took[1].0, None, "no listing: no map");
        assert_eq!(took[0].1, took[1].1, "the same blocks taken over base {base:?}");
    }

    // a snapshot hash reads only the chunks the map names, and gives the
    // checksum of every chunk read, which is that of the same data in a file
    use talon::longhorn::snaphash::{checksum, hash_lvol, map_of};
    let chain = talon::spdk::volume::to_file::Chain::of(&inv, "talon-m/s2").expect("s2's chain");
    let lvols = map_of(&inv, &chain).expect("a sparse chain is mapped");
    assert_eq!(lvols, ["talon-m/s1", "talon-m/s2"]);
    let mapped = hash_lvol(&c, "talon-m/s2", 64 * MIB, Some(lvols))
        .await
        .expect("hash, mapped");
    let every = hash_lvol(&c, "talon-m/s2", 64 * MIB, None)
        .await
        .expect("hash, every chunk");
    assert_eq!((mapped.read, every.read), (4 * MIB, 64 * MIB), "the bytes read");
    assert_eq!(mapped.checksum, every.checksum, "one checksum either way");
    let f = tempfile::NamedTempFile::new().expect("temp file");
    {
        use std::os::unix::fs::FileExt as _;
        f.as_file().set_len(64 * MIB).expect("size");
        for (at, data) in [
            (3 * MIB + 4096, pattern(1, 8192)),
            (10 * MIB, pattern(2, 2 * MIB as usize)),
            (20 * MIB + MIB / 2, pattern(3, 4096)),
        ] {
            f.as_file().write_all_at(&data, at).expect("write");
        }
    }
    assert_eq!(
        mapped.checksum,
        checksum(f.path(), 64 * MIB).expect("checksum of the file"),
        "the snapshot hashes as the same data in a file"
    );
    assert!(
        mover_subsystems(&c).await.is_empty(),
        "the hash's exports are gone"
    );

    // a map an earlier run left (talon killed mid-map: its target gone, the
    // controller left reconnecting): the sweep detaches it
    let nqn = format!("{}:map:earlier:test", talon::names::NQN_PREFIX);
    let target = mover::map::MapTarget::start(nqn.clone(), 64 * MIB, 4096)
        .await
        .expect("a map target");
    let left = format!("{}earlierrun0-0123456789ab", mover::map::PREFIX);
    c.bdev_nvme_attach_controller(&talon::spdk::rpc::AttachController::tcp(
        left.clone(),
        [127, 0, 0, 1].into(),
        target.port(),
        nqn,
    ))
    .await
    .expect("attach a map target as an earlier run did");
    drop(target);
    let inv = Inventory::load(&c).await.expect("inventory");
    assert!(inv.controllers.contains(&left), "{:?}", inv.controllers);
    let swept = mover::sweep(&c, &inv).await;
    assert_eq!(swept, std::slice::from_ref(&left));
    let inv = Inventory::load(&c).await.expect("inventory");
    assert!(!inv.controllers.contains(&left), "{:?}", inv.controllers);
}
