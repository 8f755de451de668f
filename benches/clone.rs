//! A clone's time (issue 55): a snapshot's data put into a new thin volume
//! on the same spdk_tgt, each way side by side, on a real spdk_tgt
//! (`TALON_SPDK_DIR`; without it the bench says so and does nothing).
//!
//! ```text
//!   source: thin lvol src (CLONE_BENCH_GIB, 4 GiB), 1/4 written in 64 MiB runs,
//!           snapshot s1; 1 MiB changed in 64 places, snapshot s2 (the chain s1 <- s2)
//!   (a) mover:   s2 exported and read whole over NVMe/TCP on loopback, chunks with
//!                data written into the new lvol's export (Longhorn's SnapshotClone
//!                and `copyFrom` today)
//!   (b) chain:   bdev_lvol_start_shallow_copy of s1, then of s2, into the new lvol:
//!                SPDK copies each snapshot's own allocated clusters, oldest first,
//!                inside the target (a later snapshot's clusters over the older's):
//!                `mover::copy::within`, talon's Longhorn clone of a local snapshot
//!   (c) chain into a raid1 of two new lvols (a Longhorn engine's bdev, no superblock)
//!   (d) linked:  bdev_lvol_clone of s2 (nothing copied: the clone depends on s2)
//!   (e) Longhorn's linked clone (`CloneMode` linked-clone): an empty replica lvol made
//!       a clone of s2's entrypoint (`VolumeOps::link_clone`: the entrypoint made, then
//!       bdev_lvol_set_parent), timed with the listing it starts from
//! ```
//!
//! Each result is read back whole through the mover and compared with s2
//! (SHA-256); the table gives seconds, MiB/s of the source's size and of its
//! data, and the clusters the new lvol(s) allocated.
//! Run: `cargo bench --bench clone`.

#[path = "../tests/support/spdk_real.rs"]
mod spdk_real;

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use bytes::Bytes;
use talon::spdk::SpdkClient;
use talon::spdk::rpc::{GetLvols, LvolClone, LvolCreate, LvolSnapshot, RaidCreate, RaidDelete, RaidLevel};
use talon::spdk::volume::Inventory;
use talon::spdk::volume::mover::copy::Within;
use talon::spdk::volume::mover::{self, Purpose, Session};

const MIB: u64 = 1 << 20;
const RUN: u64 = 64 * MIB;
const LVS: &str = "talon-bench";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(spdk) = spdk_real::spdk_dir("clone bench") else {
        println!("clone bench: no spdk_tgt (TALON_SPDK_DIR), nothing measured");
        return;
    };
    let gib: u64 = std::env::var("CLONE_BENCH_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let size = gib << 30;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = spdk_real::target_cfg(&dir.path().join("run"), &spdk, 1024);
    let t = talon::spdk::target::Target::spawn(&cfg).await.expect("spdk_tgt");
    let _reaper = spdk_real::Reaper::new(&t, &cfg);
    let c = t.client();
    spdk_real::aio_lvstore(
        c,
        &dir.path().join("disk.img"),
        5 * size + 512 * MIB,
        "bench0",
        LVS,
    )
    .await;

    println!("a clone of a snapshot (a chain of two) into new thin lvols on one spdk_tgt, 1 MiB clusters");
    println!(
        "| shape                | way                              | seconds | MiB/s (size) | MiB/s (data) | clusters | equal |"
    );
    println!(
        "|----------------------|----------------------------------|---------|--------------|--------------|----------|-------|"
    );
    // a quarter written (one 64 MiB run in every 256 MiB), and a thirty-second (one in every 2 GiB)
    for (k, stride) in [(0u32, 4 * RUN), (1, 32 * RUN)] {
        shape(c, k, size, stride).await;
    }
    println!("(two cores; the source's size is what the mover reads, its data what the shallow copies read)");
    t.stop(Duration::from_secs(5)).await.expect("stop spdk_tgt");
}

/// One source shape: `src<k>` written one 64 MiB run in every `stride`,
/// snapshot, 1 MiB changed in 64 places, snapshot; cloned each way.
async fn shape(c: &SpdkClient, k: u32, size: u64, stride: u64) {
    let n = |x: &str| format!("{x}{k}");
    let at = |x: &str| format!("{LVS}/{x}{k}");
    make(c, &n("src"), size).await;
    let runs: Vec<(u64, u64)> = (0..size / stride).map(|i| (i * stride, RUN)).collect();
    write_runs(c, &n("src"), &runs, 1).await;
    snapshot(c, &n("src"), &n("s1")).await;
    let changed: Vec<(u64, u64)> = (0..64).map(|i| (i * (size / 64) + 3 * MIB, MIB)).collect();
    write_runs(c, &n("src"), &changed, 1000).await;
    snapshot(c, &n("src"), &n("s2")).await;
    let data: u64 = runs.iter().map(|r| r.1).sum();
    let want = hash(c, &at("s2")).await;
    let label = format!("{} GiB, {} MiB data", size >> 30, data / MIB);
    let row = |way: &str, secs: f64, clusters: u64, equal: bool| {
        println!(
            "| {label:<20} | {way:<32} | {secs:>7.2} | {:>12.0} | {:>12.0} | {clusters:>8} | {:>5} |",
            size as f64 / MIB as f64 / secs,
            data as f64 / MIB as f64 / secs,
            if equal { "yes" } else { "NO" }
        );
    };

    // (a) the mover: read whole, chunks with data written
    make(c, &n("a"), size).await;
    let t0 = Instant::now();
    let dst = Session::open(c, &at("a"), Purpose::Test, mover::DEPTH)
        .await
        .expect("a's export");
    mover::copy::copy(c, &at("s2"), dst, mover::DEPTH, &AtomicU64::new(0))
        .await
        .expect("mover copy");
    let secs = t0.elapsed().as_secs_f64();
    row(
        "(a) mover, read whole",
        secs,
        clusters(c, &[&n("a")]).await,
        hash(c, &at("a")).await == want,
    );

    // (b) the chain of shallow copies into a new lvol
    make(c, &n("b"), size).await;
    let t0 = Instant::now();
    chain(c, &at("s2"), &at("b"), size).await;
    let secs = t0.elapsed().as_secs_f64();
    row(
        "(b) shallow copies, lvol",
        secs,
        clusters(c, &[&n("b")]).await,
        hash(c, &at("b")).await == want,
    );

    // (c) the chain into a raid1 of two new lvols (no superblock)
    make(c, &n("c0"), size).await;
    make(c, &n("c1"), size).await;
    let raid = n("bench-raid");
    c.bdev_raid_create(&RaidCreate {
        name: raid.clone(),
        raid_level: RaidLevel::Raid1,
        base_bdevs: vec![at("c0"), at("c1")],
        strip_size_kb: None,
        uuid: None,
        superblock: Some(false),
    })
    .await
    .expect("raid1");
    let t0 = Instant::now();
    chain(c, &at("s2"), &raid, size).await;
    let secs = t0.elapsed().as_secs_f64();
    let equal = hash(c, &raid).await == want;
    c.bdev_raid_delete(&RaidDelete::new(&raid))
        .await
        .expect("raid delete");
    let equal = equal && hash(c, &at("c0")).await == want && hash(c, &at("c1")).await == want;
    row(
        "(c) shallow copies, raid1 of 2",
        secs,
        clusters(c, &[&n("c0"), &n("c1")]).await,
        equal,
    );

    // (d) a linked clone: nothing copied
    let t0 = Instant::now();
    c.bdev_lvol_clone(&LvolClone {
        snapshot_name: at("s2"),
        clone_name: n("d"),
    })
    .await
    .expect("clone");
    let secs = t0.elapsed().as_secs_f64();
    row(
        "(d) linked clone (depends on s2)",
        secs,
        clusters(c, &[&n("d")]).await,
        hash(c, &at("d")).await == want,
    );

    // (e) Longhorn's linked clone as talon makes it: the replica (an empty thin lvol, made
    // before, as the manager creates it) linked to s2's entrypoint
    make(c, &n("e"), size).await;
    let t0 = Instant::now();
    let ops = talon::spdk::volume::VolumeOps::new(c.clone());
    let inv = talon::spdk::volume::Inventory::load(c).await.expect("listing");
    ops.link_clone(
        &inv,
        &talon::spdk::volume::Link {
            snapshot: &at("s2"),
            entrypoint: &n("src-clone-ep-s2"),
            head: &at("e"),
        },
    )
    .await
    .expect("link");
    let secs = t0.elapsed().as_secs_f64();
    row(
        "(e) linked via an entrypoint",
        secs,
        clusters(c, &[&n("e")]).await,
        hash(c, &at("e")).await == want,
    );
}

async fn make(c: &SpdkClient, name: &str, size: u64) {
    c.bdev_lvol_create(&LvolCreate::thin(LVS, name, size / MIB))
        .await
        .expect("lvol");
}

async fn snapshot(c: &SpdkClient, lvol: &str, snap: &str) {
    c.bdev_lvol_snapshot(&LvolSnapshot {
        lvol_name: format!("{LVS}/{lvol}"),
        snapshot_name: snap.into(),
    })
    .await
    .expect("snapshot");
}

/// Writes a pattern (seeded per run) over `runs` of lvol `name`, through the mover.
async fn write_runs(c: &SpdkClient, name: &str, runs: &[(u64, u64)], seed: u64) {
    let s = Session::open(c, &format!("{LVS}/{name}"), Purpose::Test, mover::DEPTH)
        .await
        .expect("export");
    for (i, (at, len)) in runs.iter().enumerate() {
        let mut done = 0;
        while done < *len {
            let n = (len - done).min(8 * MIB);
            let data = spdk_real::pattern(seed + i as u64 * 1000 + done / MIB, n as usize);
            s.write(at + done, Bytes::from(data)).await.expect("write");
            done += n;
        }
    }
    s.close().await.expect("close");
}

/// Snapshot `snap` copied into bdev `dst` inside the target, as talon's
/// Longhorn clone of a local snapshot does (`mover::copy::within`).
async fn chain(c: &SpdkClient, snap: &str, dst: &str, size: u64) {
    let inv = Inventory::load(c).await.expect("inventory");
    let w = Within {
        snap,
        dst,
        earlier: None,
        started: &|_| {},
        size,
    };
    mover::copy::within(c, &inv, &w, &AtomicU64::new(0))
        .await
        .expect("copy within")
        .expect("equal block sizes: copied inside the target");
}

/// SHA-256 of bdev `bdev`, read whole through the mover.
async fn hash(c: &SpdkClient, bdev: &str) -> Vec<u8> {
    let s = Session::open(c, bdev, Purpose::Test, mover::DEPTH)
        .await
        .expect("export to hash");
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    s.read_in_order(mover::CHUNK, 8, |_, d| {
        h.update(d);
        Ok(())
    })
    .await
    .expect("read");
    s.close().await.expect("close");
    h.finish().as_ref().to_vec()
}

/// Clusters the lvols `names` allocated.
async fn clusters(c: &SpdkClient, names: &[&str]) -> u64 {
    let all = c.bdev_lvol_get_lvols(&GetLvols::default()).await.expect("lvols");
    names
        .iter()
        .filter_map(|n| all.iter().find(|l| l.name == *n))
        .map(|l| l.num_allocated_clusters)
        .sum()
}
