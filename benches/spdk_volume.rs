//! V2 volume benchmarks against a real spdk_tgt (`TALON_SPDK_DIR`), printed
//! as tables (`cargo bench --bench spdk_volume`):
//!
//! 1. control plane: `VolumeOps::ensure` from nothing to exported (lvol(s),
//!    raid1 when 2 replicas, subsystem, namespace, listener), p50/p99 over
//!    100 volumes, one at a time and 16 in flight on one client;
//! 2. data path: 4 KiB randread / randwrite QD32 with spdk_nvme_perf over
//!    NVMe/TCP loopback, interleaved rounds over (a) a bare lvol exported
//!    directly, (b) a talon 1-replica volume, (c) the Longhorn-style topology
//!    built by hand (replica exported over NVMe/TCP, attached back with an
//!    explicit NGUID, raid1 with a removed placeholder, exported again), and
//!    (d) the alternative 1-replica engine talon did not choose (raid1 of the
//!    local lvol + a removed placeholder);
//! 3. rebuild: a 1 GiB 2-replica volume with 10 % written gets an empty
//!    replica back, rebuilt thin (shallow copies + the switch) and by SPDK's
//!    raid rebuild, side by side: time, MiB copied, what the replica holds
//!    after, and the longest reconcile step (the thin switch); and
//!    (`rebuild_io`, also run by `rebuild`) the volume's own 4 KiB QD32
//!    randread / randwrite IOPS while a rebuild copies, rows none, thin,
//!    full and full capped at 50 MiB/s interleaved over `ROUNDS` rounds
//!    (median, % of none, each round, MiB copied during the run): an
//!    896 MiB volume written three times with a snapshot after each (2688
//!    MiB for a thin rebuild to copy, one shallow copy a snapshot) and once
//!    more (no copy-on-write under randwrite), replica 1 replaced empty;
//!    spdk_nvme_perf starts once the rebuild copies, and a thin rebuild is
//!    reconciled during it only while a snapshot is left to copy, so its
//!    switch (the export closed; spdk_nvme_perf does not reconnect) comes
//!    after it and is timed apart;
//! 4. snapshot: a 2-replica volume under sequential QD32 writes, with no
//!    snapshots and with one every 500 ms (each freezes the export, ANA
//!    inaccessible, around the replicas' snapshots): writes per second that
//!    reached the raid in both, and how long a snapshot call takes in ms (the
//!    freeze lies inside it).
//! 5. superblock (`superblock`): a 2-replica volume with and without the raid
//!    superblock, side by side, rounds interleaved: create to exported, 4 KiB
//!    randwrite / randread QD32, what each replica holds after create, and a
//!    revert to a snapshot (fresh heads + raid + set_parent with it, clones
//!    without).
//! 6. restore (`restore`): a restored backup's file copied into new thin
//!    lvols (esnap + decouple), one replica and two one after the other.
//!
//! ```text
//!   spdk_tgt core 0 ── malloc "talon-disk-bench" ── lvstore talon-bench ── lvols
//!        ^ NVMe/TCP 127.0.0.1
//!   spdk_nvme_perf core 1
//! ```
//! 4. restart (`restart`, its own targets on two 4 GiB aio file disks): 100
//!    volumes (half with two replicas) served by `engine.SpdkVolumeController`;
//!    time until every volume is exported again after talon restarts while
//!    the target keeps running (warm: every object is still there) and after
//!    the target restarts too (cold: spdk_tgt started again, lvstores
//!    imported, raids and exports made again, 16 volumes at a time); with the
//!    target's memory after it (RSS: `--no-huge` here, this machine has no
//!    hugepages) and its TCP transports.
//!
//! The machine is shared and noisy: compare within one run.

#[path = "../tests/support/disk_ready.rs"]
mod disk_ready;
#[path = "support/reap.rs"]
mod reap;
#[path = "../tests/support/spdk_dd.rs"]
#[allow(dead_code)]
mod spdk_dd;
#[path = "../tests/support/spdk_perf.rs"]
mod spdk_perf;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use talon::names::ObjectName;
use talon::spdk::SpdkClient;
use talon::spdk::rpc::{
    AddNamespace, ByName, CreateSubsystem, CreateTransport, ListenAddress, LvolCreate, LvstoreCreate,
    MallocCreate, NullCreate, RaidCreate, RaidLevel, SubsystemListener,
};
use talon::spdk::target::{Memory, Target, TargetConfig};
use talon::spdk::volume::{ExportSpec, Inventory, VolumeOps, VolumePlan};

const MIB: u64 = 1 << 20;

/// The host NQN the Longhorn-style engine of the data path attaches its
/// replica as (the node's own, which the replica's export admits).
const ENGINE_HOST_NQN: &str = "nqn.2014-08.io.talon.bench:engine-host";

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn plan(name: &str, replicas: usize, port: u16) -> VolumePlan {
    VolumePlan::new(
        ObjectName::parse("volume", name).expect("name"),
        64 * MIB,
        replicas,
        ExportSpec {
            address: [127, 0, 0, 1].into(),
            port,
            hosts: vec![spdk_perf::HOST_NQN.to_string()],
            dhchap_data_dir: None,
            tls_data_dir: None,
        },
    )
}

/// Drives `ensure` (as the controller does every second while a rebuild
/// runs) until replica 1 is up to date again; returns the seconds it took
/// and the longest single `ensure` call (the thin switch lies in one).
async fn rebuild_until_joined(ops: &VolumeOps, p: &VolumePlan) -> (f64, f64) {
    let t0 = Instant::now();
    let mut longest = 0f64;
    loop {
        let inv = Inventory::load(ops.client()).await.expect("inventory");
        let t = Instant::now();
        let info = ops.ensure(&inv, p).await.expect("ensure");
        longest = longest.max(t.elapsed().as_secs_f64());
        if info.in_sync.contains(&1) && info.rebuilding.is_none() {
            return (t0.elapsed().as_secs_f64(), longest);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What replica k holds, its head and its snapshot chain, in clusters.
async fn held(c: &SpdkClient, vol: &str, k: usize) -> u64 {
    let inv = Inventory::load(c).await.expect("inventory");
    let Some(head) = inv.find_lvol(&format!("{vol}-r{k}")) else {
        return 0;
    };
    head.num_allocated_clusters
        + inv
            .chain(&head.alias)
            .iter()
            .map(|a| inv.lvols[a].num_allocated_clusters)
            .sum::<u64>()
}

/// A section's two disk files (4 GiB, sparse, in a folder of /var/tmp
/// removed with it), attached by their names.
struct Disks(tempfile::TempDir, [&'static str; 2]);

impl Disks {
    async fn attach(c: &SpdkClient, names: [&'static str; 2]) -> Disks {
        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        attach_disks(c, dir.path(), &names, true).await;
        Disks(dir, names)
    }
}

/// A 2-replica volume (superblock) of `size_mib` on disks `disks`, its
/// rebuilds capped at `cap`, with `written` MiB written from offset 0
/// (spdk_dd), or with every block written (`None`: [`fill_all`]).
async fn filled(
    spdk: &Path,
    ops: &VolumeOps,
    Disks(dir, disks): &Disks,
    port: u16,
    name: &str,
    cap: Option<u64>,
    (size_mib, written): (u64, Option<u64>),
) -> (VolumePlan, talon::spdk::volume::VolumeInfo) {
    let mut p = plan(name, 2, port);
    p.size_bytes = size_mib * MIB;
    p.disks = disks.iter().map(|d| d.to_string()).collect();
    p.superblock = true;
    p.rebuild_mib_per_sec = cap;
    let inv = Inventory::load(ops.client()).await.expect("inventory");
    let info = ops.ensure(&inv, &p).await.expect("ensure");
    let Some(written) = written else {
        fill_all(spdk, ops.client(), port, name, &info.nqn, size_mib).await;
        return (p, info);
    };
    let data = vec![0x5au8; usize::try_from(written * MIB).expect("size")];
    let out = spdk_dd::dd_as(
        spdk,
        dir.path(),
        port,
        &info.nqn,
        Some(&data),
        data.len(),
        spdk_perf::HOST_NQN,
    );
    assert!(
        out.status.success(),
        "dd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (p, info)
}

/// Every block of volume `name` written again (spdk_nvme_perf sequential
/// 128 KiB writes at QD32, far faster than spdk_dd's QD 2 on a loaded
/// machine), for longer until replica 0's head holds every cluster.
async fn fill_all(spdk: &Path, c: &SpdkClient, port: u16, name: &str, nqn: &str, size_mib: u64) {
    let mut secs = 4;
    loop {
        let inv = Inventory::load(c).await.expect("inventory");
        let head = inv.find_lvol(&format!("{name}-r0")).expect("r0");
        if head.num_allocated_clusters >= size_mib {
            return;
        }
        assert!(secs <= 64, "{name}: not filled in 64 s");
        spdk_perf::run(spdk, port, nqn, "write -o 131072", secs);
        secs *= 2;
    }
}

/// Replica 1 goes, as a replaced disk: out of the raid, its lvol and its
/// snapshots deleted; the plan's ledger then trusts replica 0 alone.
async fn replace_r1(c: &SpdkClient, info: &talon::spdk::volume::VolumeInfo, p: &mut VolumePlan) {
    c.bdev_raid_remove_base_bdev(&ByName::new(&info.replicas[1].bdev))
        .await
        .expect("r1 leaves");
    let chain = Inventory::load(c)
        .await
        .expect("inventory")
        .chain(&info.replicas[1].alias);
    for lvol in std::iter::once(&info.replicas[1].alias).chain(chain.iter().rev()) {
        c.bdev_lvol_delete(&ByName::new(lvol)).await.expect("r1 deleted");
    }
    p.in_sync = Some([0].into());
}

/// Thin rebuild (shallow copies of the source's chain, then the switch) and
/// SPDK's raid rebuild (every block), side by side: a 2-replica 1 GiB volume
/// with 10 % written (spdk_dd, sequential) loses replica 1 (its lvol
/// deleted, as a replaced disk), and gets it back empty.
async fn rebuild(spdk: &Path, c: &SpdkClient, port: u16, rounds: usize) {
    println!(
        "\nrebuild: a 1024 MiB 2-replica volume (superblock) with 102 MiB written gets an empty replica 1 back (two 4 GiB aio file disks, one target)"
    );
    println!(
        "{:<6} {:>5} {:>9} {:>9} {:>14} {:>14} {:>16}",
        "mode", "round", "ms", "MiB/s", "copied MiB", "r1 holds MiB", "longest step ms"
    );
    let disks = Disks::attach(c, ["rb1", "rb2"]).await;
    for round in 0..rounds {
        for (mode, full, cap) in [
            ("thin", false, None),
            ("full", true, None),
            ("full50", true, Some(50)),
        ] {
            let ops = VolumeOps::new(c.clone()).with_full_rebuild(full);
            let name = format!("rb{}{round}", &mode[..mode.len().min(5)]);
            let (mut p, info) = filled(spdk, &ops, &disks, port, &name, cap, (1024, Some(102))).await;
            replace_r1(c, &info, &mut p).await;
            let (secs, longest) = rebuild_until_joined(&ops, &p).await;
            let r1 = held(c, &name, 1).await;
            let inv = Inventory::load(c).await.expect("inventory");
            let limit = inv
                .find_lvol(&format!("{name}-r1"))
                .and_then(|l| inv.bdevs.get(&l.uuid))
                .and_then(|b| b.assigned_rate_limits.clone())
                .map_or(0, |l| l.rw_mbytes_per_sec);
            assert_eq!(limit, 0, "{mode}: the cap is lifted once r1 is back");
            let copied = if full { 1024 } else { r1 };
            println!(
                "{:<6} {:>5} {:>9.0} {:>9.0} {:>14} {:>14} {:>16.0}",
                mode,
                round,
                secs * 1e3,
                copied as f64 / secs,
                copied,
                r1,
                longest * 1e3
            );
            ops.delete(&inv, &ObjectName::parse("volume", &name).expect("n"))
                .await
                .expect("delete");
        }
    }
    println!("copied: clusters written to replica 1 (thin: what it holds; full: SPDK writes every block)");
    println!(
        "full50: NodeConfig rebuildMibPerSec 50 (bdev_set_qos_limit on the member SPDK rebuilds, lifted after)"
    );
    println!("longest step: the longest single reconcile, for thin the switch (export closed inside it)");
}

/// What volume `vol`'s rebuild has copied to replica 1 so far, in MiB, and
/// whether it still copies: SPDK's rebuild process of its raid (`full`), or
/// the clusters replica 1 holds, copying while it has fewer snapshots than
/// replica 0 (read from the lvols: checking a copy that is complete would
/// take its status from talon, SPDK forgets it once told).
async fn copying(c: &SpdkClient, vol: &talon::spdk::volume::VolumeInfo, full: bool) -> (u64, bool) {
    let inv = Inventory::load(c).await.expect("inventory");
    if full {
        let b = &inv.bdevs[&vol.device];
        let raid = inv.raids.iter().find(|r| r.name == vol.device);
        return match raid.and_then(|r| r.process.as_ref()) {
            Some(p) => (p.progress.blocks * u64::from(b.block_size) / MIB, true),
            None => (b.size_bytes() / MIB, false),
        };
    }
    let name = vol.nqn.rsplit(':').next().expect("volume name");
    // the bench's lvstores have 1 MiB clusters
    let held = held(c, name, 1).await;
    let (r1, r0) = chains(&inv, name);
    (held, held > 0 && r1 < r0)
}

/// Deletes what is left of volume `vol`'s lvols after `VolumeOps::delete`
/// (its snapshots, a thin rebuild's `rb.<n>` among them), newest first.
async fn drop_lvols(c: &SpdkClient, vol: &str) {
    loop {
        let inv = Inventory::load(c).await.expect("inventory");
        let left: Vec<&String> = inv
            .lvols
            .iter()
            .filter(|(_, l)| l.name.starts_with(&format!("{vol}-r")))
            .map(|(a, _)| a)
            .collect();
        if left.is_empty() {
            return;
        }
        for a in left
            .iter()
            .filter(|a| !inv.lvols.keys().any(|o| inv.parent_of(o).as_ref() == Some(a)))
        {
            c.bdev_lvol_delete(&ByName::new(a.as_str()))
                .await
                .expect("lvol deleted");
        }
    }
}

/// How many snapshots replicas 1 and 0 of volume `vol` have.
fn chains(inv: &Inventory, vol: &str) -> (usize, usize) {
    let n = |k| {
        inv.find_lvol(&format!("{vol}-r{k}"))
            .map_or(0, |l| inv.chain(&l.alias).len())
    };
    (n(1), n(0))
}

/// The volume's own 4 KiB QD32 I/O while a rebuild copies, beside the same
/// with no rebuild: a 2-replica 896 MiB volume written three times with a
/// snapshot after each (the same on every row: 2688 MiB for a thin rebuild
/// to copy, one shallow copy a snapshot) and once more (the head holds every
/// cluster, so randwrite measures no copy-on-write; the first run without
/// it measured mostly that), replica 1 replaced empty.
/// Reconciles (`ensure`) run until the rebuild copies, then every 50 ms
/// while spdk_nvme_perf (2 s) runs (the lvols are read on every row), a
/// full rebuild's always, a thin rebuild's only while replica 1 has fewer
/// snapshots than replica 0 (so none of them can start the switch, which
/// closes the export for a moment: spdk_nvme_perf does not reconnect), none
/// on the row without a rebuild; after perf, until replica 1 is back, the
/// longest reconcile being the switch. Rows interleaved per round.
async fn rebuild_io(spdk: &Path, c: &SpdkClient, port: u16, rounds: usize) {
    const SIZE_MIB: u64 = 896;
    const SNAPS: usize = 3;
    const ROWS: [(&str, bool, Option<u64>); 4] = [
        ("none", false, None),
        ("thin", false, None),
        ("full", true, None),
        ("full cap 50", true, Some(50)),
    ];
    println!(
        "\nrebuild I/O: the volume's 4 KiB QD32 IOPS (spdk_nvme_perf 2 s) while replica 1 is rebuilt; {SIZE_MIB} MiB 2-replica volume written {SNAPS} times with a snapshot after each and once more; {rounds} interleaved rounds, median\n{:<12} {:>9} {:>7} {:>9} {:>7} {:>12} {:>9}  per round: randread | randwrite",
        "rebuild", "randread", "read %", "randwrite", "write %", "copied r/w", "switch ms"
    );
    let disks = Disks::attach(c, ["io1", "io2"]).await;
    // per row and workload: IOPS, MiB copied during perf, whether the rebuild
    // still copied when perf ended; per row: the longest reconcile after
    let mut res = vec![[(); 2].map(|_| (Vec::new(), Vec::new(), Vec::new())); ROWS.len()];
    let mut switch = vec![Vec::new(); ROWS.len()];
    for round in 0..rounds {
        for (row, (mode, full, cap)) in ROWS.iter().enumerate() {
            for (w, workload) in ["randread", "randwrite"].into_iter().enumerate() {
                let ops = VolumeOps::new(c.clone()).with_full_rebuild(*full);
                let name = format!("ri{row}{w}{round}");
                let (mut p, info) = filled(spdk, &ops, &disks, port, &name, *cap, (SIZE_MIB, None)).await;
                for i in 0..SNAPS {
                    let inv = Inventory::load(c).await.expect("inventory");
                    let snap = ObjectName::parse("snapshot", &format!("s{i}")).expect("snap");
                    ops.snapshot(&inv, &p.name, &snap, None, vec![])
                        .await
                        .expect("snapshot");
                    // the head holds every cluster too: randwrite measures
                    // no copy-on-write of 1 MiB clusters, the same on every row
                    fill_all(spdk, c, port, &name, &info.nqn, SIZE_MIB).await;
                }
                let rebuilds = *mode != "none";
                let mut before = 0;
                if rebuilds {
                    replace_r1(c, &info, &mut p).await;
                    let t0 = Instant::now();
                    before = loop {
                        let inv = Inventory::load(c).await.expect("inventory");
                        ops.ensure(&inv, &p).await.expect("ensure");
                        if let (m, true) = copying(c, &info, *full).await {
                            break m;
                        }
                        assert!(t0.elapsed() < Duration::from_secs(60), "{mode}: no copy started");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    };
                }
                let (sp, nqn) = (spdk.to_path_buf(), info.nqn.clone());
                let perf = tokio::task::spawn_blocking(move || perf(&sp, port, &nqn, workload, 2));
                while !perf.is_finished() {
                    let inv = Inventory::load(c).await.expect("inventory");
                    let (r1, r0) = chains(&inv, &name);
                    if *full || r1 < r0 {
                        ops.ensure(&inv, &p).await.expect("ensure");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let cell = &mut res[row][w];
                cell.0.push(perf.await.expect("perf"));
                if rebuilds {
                    let (after, running) = copying(c, &info, *full).await;
                    cell.1.push(after - before);
                    cell.2.push(running);
                    let (_, longest) = rebuild_until_joined(&ops, &p).await;
                    switch[row].push(longest * 1e3);
                }
                let inv = Inventory::load(c).await.expect("inventory");
                ops.delete(&inv, &ObjectName::parse("volume", &name).expect("n"))
                    .await
                    .expect("delete");
                drop_lvols(c, &name).await;
            }
        }
    }
    let med = |v: &[f64]| pct(&mut v.to_vec(), 0.5);
    let base = [med(&res[0][0].0), med(&res[0][1].0)];
    let mut ended = 0;
    for (row, (mode, ..)) in ROWS.iter().enumerate() {
        let [r, w] = [0, 1].map(|i| med(&res[row][i].0));
        let [cr, cw] = [0, 1].map(|i| {
            let v: Vec<f64> = res[row][i].1.iter().map(|&m| m as f64).collect();
            if v.is_empty() {
                "-".into()
            } else {
                format!("{:.0}", med(&v))
            }
        });
        let rounds = [0, 1].map(|i| {
            let cell = &res[row][i];
            let ran = |k: usize| cell.2.get(k).copied().unwrap_or(true);
            ended += (0..cell.0.len()).filter(|&k| !ran(k)).count();
            (0..cell.0.len())
                .map(|k| format!("{:.0}{}", cell.0[k], if ran(k) { "" } else { "*" }))
                .collect::<Vec<_>>()
                .join(" ")
        });
        let sw = if *mode == "thin" {
            format!("{:.0}", med(&switch[row]))
        } else {
            "-".into()
        };
        println!(
            "{mode:<12} {r:>9.0} {:>7.0} {w:>9.0} {:>7.0} {:>12} {sw:>9}  {} | {}",
            100.0 * r / base[0].max(1.0),
            100.0 * w / base[1].max(1.0),
            format!("{cr}/{cw}"),
            rounds[0],
            rounds[1]
        );
    }
    println!(
        "%: of the median IOPS with no rebuild; one shared 2-core machine: compare within this run only"
    );
    println!(
        "copied: MiB the rebuild wrote to replica 1 while spdk_nvme_perf ran (median, randread/randwrite)"
    );
    println!(
        "thin: its copy phase (a shallow copy per snapshot); not capped (a QoS limit on the head could never be lifted on v26.05), so no capped row"
    );
    println!("switch: the thin rebuild's longest reconcile after perf, the switch (export closed inside it)");
    println!("full cap 50: NodeConfig rebuildMibPerSec 50 (bdev_set_qos_limit on the member SPDK rebuilds)");
    if ended > 0 {
        println!("*: {ended} run(s) whose rebuild had stopped copying before spdk_nvme_perf ended");
    }
}

/// A disk for the bench's volumes: malloc bdev `bdev` of `mib` MiB with
/// lvstore `lvs` (1 MiB clusters) on it.
async fn malloc_disk(
    c: &SpdkClient,
    bdev: &str,
    lvs: &str,
    mib: u64,
) -> Result<(), talon::spdk::ClientError> {
    c.bdev_malloc_create(&MallocCreate {
        name: Some(bdev.into()),
        num_blocks: mib * MIB / 4096,
        block_size: 4096,
        uuid: None,
    })
    .await?;
    c.bdev_lvol_create_lvstore(&LvstoreCreate {
        bdev_name: bdev.into(),
        lvs_name: lvs.into(),
        cluster_sz: Some(MIB as u32),
        clear_method: None,
        num_md_pages_per_cluster_ratio: None,
    })
    .await?;
    Ok(())
}

async fn control_plane(ops: &VolumeOps, port: u16) {
    // a second disk: each replica of a volume needs its own
    let c = ops.client();
    malloc_disk(c, "talon-disk-cpbench", "talon-cpbench", 1024)
        .await
        .expect("a malloc disk");
    println!("\ncontrol plane: volume create -> exported (VolumeOps::ensure), 100 volumes each");
    println!(
        "{:<34} {:>9} {:>9} {:>11}",
        "mode", "p50 ms", "p99 ms", "total ms"
    );
    for (label, replicas, inflight) in [
        ("1 replica, one at a time", 1, 1),
        ("1 replica, 16 in flight", 1, 16),
        ("2 replicas (raid1), one at a time", 2, 1),
        ("2 replicas (raid1), 16 in flight", 2, 16),
    ] {
        let inv = Inventory::load(ops.client()).await.expect("inventory");
        let t0 = Instant::now();
        let mut lat: Vec<f64> = futures::stream::iter(0..100)
            .map(|i| {
                let inv = &inv;
                async move {
                    let p = plan(&format!("cp{replicas}x{inflight}-{i}"), replicas, port);
                    let t = Instant::now();
                    ops.ensure(inv, &p).await.expect("ensure");
                    t.elapsed().as_secs_f64() * 1e3
                }
            })
            .buffer_unordered(inflight)
            .collect()
            .await;
        let total = t0.elapsed().as_secs_f64() * 1e3;
        println!(
            "{label:<34} {:>9.1} {:>9.1} {:>11.0}",
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
            total
        );
        let inv = Inventory::load(ops.client()).await.expect("inventory");
        futures::stream::iter(0..100)
            .for_each_concurrent(16, |i| {
                let inv = &inv;
                async move {
                    let n = ObjectName::parse("volume", &format!("cp{replicas}x{inflight}-{i}")).expect("n");
                    ops.delete(inv, &n).await.expect("delete");
                }
            })
            .await;
    }
}

async fn snapshots(spdk: &Path, ops: &VolumeOps, port: u16) {
    let c = ops.client();
    malloc_disk(c, "talon-disk-bench2", "talon-bench2", 1024)
        .await
        .expect("a malloc disk");
    let p = plan("snapbench", 2, port);
    let inv = Inventory::load(c).await.expect("inventory");
    ops.ensure(&inv, &p).await.expect("volume");
    let nqn = talon::names::Nqn::for_volume(&p.name).as_str().to_owned();
    println!("\nsnapshot: 2-replica volume, sequential 4 KiB writes QD32 for 6 s");
    println!(
        "{:<34} {:>11} {:>9} {:>9} {:>6}",
        "mode", "raid w/s", "snap p50", "snap p99", "snaps"
    );
    // writes that reached the raid (perf's own IOPS also count the writes a
    // frozen export failed with "ANA inaccessible", which perf does not retry)
    let raid_writes = || async {
        let v: serde_json::Value = c
            .typed(
                "bdev_get_iostat",
                &serde_json::json!({"names": ["talon-raid-snapbench"]}),
            )
            .await
            .expect("iostat");
        v["bdevs"][0]["num_write_ops"].as_u64().unwrap_or(0)
    };
    for every in [None, Some(Duration::from_millis(500))] {
        let (w0, t0) = (raid_writes().await, Instant::now());
        let writer = {
            let (spdk, nqn) = (spdk.to_path_buf(), nqn.clone());
            std::thread::spawn(move || perf(&spdk, port, &nqn, "write", 6))
        };
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut lat = Vec::new();
        if let Some(every) = every {
            let mut i = 0;
            while !writer.is_finished() && i < 8 {
                let inv = Inventory::load(c).await.expect("inventory");
                let s = ObjectName::parse("snapshot", &format!("b{i}")).expect("snap");
                let t = Instant::now();
                ops.snapshot(&inv, &p.name, &s, None, vec![])
                    .await
                    .expect("snapshot");
                lat.push(t.elapsed().as_secs_f64() * 1e3);
                i += 1;
                tokio::time::sleep(every).await;
            }
        }
        let _perf_iops = writer.join().expect("perf");
        let iops = (raid_writes().await - w0) as f64 / t0.elapsed().as_secs_f64().min(6.0);
        let label = if every.is_some() {
            "one snapshot every 500 ms"
        } else {
            "no snapshots"
        };
        let n = lat.len();
        let (p50, p99) = if n == 0 {
            (0.0, 0.0)
        } else {
            (pct(&mut lat, 0.5), pct(&mut lat, 0.99))
        };
        println!("{label:<34} {iops:>11.0} {p50:>9.1} {p99:>9.1} {n:>6}");
    }
    let inv = Inventory::load(c).await.expect("inventory");
    ops.delete(&inv, &p.name).await.expect("delete");
    let inv = Inventory::load(c).await.expect("inventory");
    for (k, l) in inv.lvols.iter().filter(|(a, _)| a.contains("snapbench")) {
        let _ = (k, c.bdev_lvol_delete(&ByName::new(&l.alias)).await);
    }
}

/// The raid superblock's cost: the same 2-replica volume with and without it.
async fn superblock(spdk: &Path, ops: &VolumeOps, port: u16) {
    let c = ops.client();
    // a second disk of its own (replicas live on distinct disks)
    // made once per target: one a rerun finds is used as it is
    let _ = malloc_disk(c, "talon-disk-sbbench", "talon-sbbench", 1024).await;
    const ROUNDS: usize = 2;
    println!("\nsuperblock: 2-replica 64 MiB volume, 4 KiB QD32, {ROUNDS} interleaved rounds");
    println!(
        "{:<16} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "layout", "create ms", "write/s", "read/s", "MiB/replica", "revert ms"
    );
    let mut rows: Vec<(bool, Vec<[f64; 5]>)> = vec![(false, Vec::new()), (true, Vec::new())];
    for round in 0..ROUNDS {
        for (sb, samples) in rows.iter_mut() {
            let name = format!("sb{}{round}", u8::from(*sb));
            let mut p = plan(&name, 2, port);
            p.superblock = *sb;
            let inv = Inventory::load(c).await.expect("inventory");
            let t = Instant::now();
            ops.ensure(&inv, &p).await.expect("volume");
            let create = t.elapsed().as_secs_f64() * 1e3;
            let nqn = talon::names::Nqn::for_volume(&p.name).as_str().to_owned();
            let w = perf(spdk, port, &nqn, "randwrite", 3);
            let r = perf(spdk, port, &nqn, "randread", 3);
            let inv = Inventory::load(c).await.expect("inventory");
            let held = inv
                .find_lvol(&format!("{name}-r0"))
                .map_or(0, |l| l.num_allocated_clusters);
            // revert: a snapshot, then back to it
            let s = ObjectName::parse("snapshot", "b").expect("snap");
            ops.snapshot(&inv, &p.name, &s, None, vec![])
                .await
                .expect("snapshot");
            let inv = Inventory::load(c).await.expect("inventory");
            let t = Instant::now();
            let set = ops
                .revert(&inv, &p.name, &s, 1, Some(&[0, 1].into()), sb.then_some(2))
                .await
                .expect("revert");
            let inv = Inventory::load(c).await.expect("inventory");
            let mut again = p.clone();
            again.in_sync = Some(set);
            ops.ensure(&inv, &again).await.expect("export again");
            let revert = t.elapsed().as_secs_f64() * 1e3;
            samples.push([create, w, r, held as f64, revert]);
            let inv = Inventory::load(c).await.expect("inventory");
            ops.delete(&inv, &p.name).await.expect("delete");
            let inv = Inventory::load(c).await.expect("inventory");
            for l in inv.lvols.values().filter(|l| l.name.starts_with(&name)) {
                let _ = c.bdev_lvol_delete(&ByName::new(&l.alias)).await;
            }
        }
    }
    for (sb, samples) in &rows {
        let mean = |i: usize| samples.iter().map(|s| s[i]).sum::<f64>() / samples.len() as f64;
        let label = if *sb { "superblock" } else { "no superblock" };
        println!(
            "{label:<16} {:>10.1} {:>10.0} {:>10.0} {:>12.0} {:>10.1}",
            mean(0),
            mean(1),
            mean(2),
            mean(3),
            mean(4)
        );
    }
}

fn perf(spdk: &Path, port: u16, nqn: &str, pattern: &str, secs: u32) -> f64 {
    let out = spdk_perf::run(spdk, port, nqn, pattern, secs);
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains("Total") {
        eprintln!(
            "spdk_nvme_perf on {nqn} reported no total: {}\n{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    spdk_perf::total_iops(&text)
}

async fn export(c: &SpdkClient, nqn: &str, bdev: &str, id: uuid::Uuid, port: u16) {
    c.nvmf_create_subsystem(&CreateSubsystem {
        nqn: nqn.into(),
        allow_any_host: Some(true),
        serial_number: None,
        model_number: None,
        max_namespaces: Some(1),
        ana_reporting: None,
        min_cntlid: None,
        max_cntlid: None,
    })
    .await
    .expect("subsystem");
    c.nvmf_subsystem_add_ns(&AddNamespace::with_id(nqn, bdev, id))
        .await
        .expect("ns");
    c.nvmf_subsystem_add_listener(&SubsystemListener {
        nqn: nqn.into(),
        listen_address: ListenAddress::tcp([127, 0, 0, 1].into(), port),
    })
    .await
    .expect("listener");
}

/// raid1 over `member` + a bdev_null placeholder that is then removed.
async fn one_member_raid1(c: &SpdkClient, name: &str, member: &str, blocks: u64) {
    let null = format!("{name}-null");
    // the placeholder talon itself uses for an empty slot (removed before any I/O)
    c.bdev_null_create(&NullCreate {
        name: null.clone(),
        num_blocks: blocks,
        block_size: 4096,
    })
    .await
    .expect("placeholder");
    c.bdev_raid_create(&RaidCreate {
        name: name.into(),
        raid_level: RaidLevel::Raid1,
        base_bdevs: vec![member.into(), null.clone()],
        strip_size_kb: None,
        uuid: None,
        superblock: Some(false),
    })
    .await
    .expect("raid1");
    c.bdev_raid_remove_base_bdev(&ByName::new(&null))
        .await
        .expect("remove placeholder");
    c.bdev_null_delete(&ByName::new(&null))
        .await
        .expect("placeholder delete");
}

async fn data_path(spdk: &Path, ops: &VolumeOps, port: u16, rounds: usize, secs: u32) {
    let c = ops.client();
    // four thin lvols are written to: 4 x 256 MiB fit the 2 GiB malloc lvstore
    // (4 x 512 MiB did not: the last one's writes failed with ENOSPC and its raid
    // failed the member, so (d) measured nothing)
    let size_mib = 256;
    let blocks = size_mib * MIB / 4096;
    // (a) bare lvol
    let bare = c
        .bdev_lvol_create(&LvolCreate::thin("talon-bench", "bare", size_mib))
        .await
        .expect("bare lvol");
    export(
        c,
        "nqn.2016-06.io.spdk:bench-bare",
        &bare,
        uuid::Uuid::new_v4(),
        port,
    )
    .await;
    // (b) talon 1-replica volume
    let inv = Inventory::load(c).await.expect("inventory");
    let mut p = plan("dp", 1, port);
    p.size_bytes = size_mib * MIB;
    let info = ops.ensure(&inv, &p).await.expect("talon volume");
    // (c) Longhorn-style: replica over NVMe/TCP loopback, attached back, raid1, exported again
    let lh = c
        .bdev_lvol_create(&LvolCreate::thin("talon-bench", "lh-r0", size_mib))
        .await
        .expect("lh lvol");
    let vol = ObjectName::parse("volume", "lh").expect("n");
    // exported to the engine's host alone, as a replica's node admits only the
    // node that serves its volume; the engine attaches it as that host
    let rnqn = ops
        .export_replica(
            &vol,
            "r0",
            &lh,
            [127, 0, 0, 1].into(),
            port,
            vec![ENGINE_HOST_NQN.to_string()],
        )
        .await
        .expect("export replica");
    let nvme = ops
        .clone()
        .with_host_nqn(Some(ENGINE_HOST_NQN.to_string()))
        .attach_replica("lh", "lhr0", [127, 0, 0, 1].into(), port, &rnqn, None, None)
        .await
        .expect("attach replica");
    one_member_raid1(c, "lh-raid", &nvme, blocks).await;
    export(
        c,
        "nqn.2016-06.io.spdk:bench-lh",
        "lh-raid",
        uuid::Uuid::new_v4(),
        port,
    )
    .await;
    // (d) raid1 of the local lvol with a removed placeholder
    let r1 = c
        .bdev_lvol_create(&LvolCreate::thin("talon-bench", "r1m", size_mib))
        .await
        .expect("r1 lvol");
    one_member_raid1(c, "r1m-raid", &r1, blocks).await;
    export(
        c,
        "nqn.2016-06.io.spdk:bench-r1m",
        "r1m-raid",
        uuid::Uuid::new_v4(),
        port,
    )
    .await;

    let topo = [
        (
            "(a) bare lvol export",
            "nqn.2016-06.io.spdk:bench-bare".to_string(),
        ),
        ("(b) talon 1-replica volume", info.nqn.clone()),
        (
            "(c) Longhorn-style (TCP hop+raid1)",
            "nqn.2016-06.io.spdk:bench-lh".to_string(),
        ),
        (
            "(d) raid1 1 member + placeholder",
            "nqn.2016-06.io.spdk:bench-r1m".to_string(),
        ),
    ];
    // fill once so randread reads allocated clusters and randwrite does not measure allocation
    for (_, nqn) in &topo {
        let _ = std::process::Command::new(spdk.join("build/bin/spdk_nvme_perf"))
            .args([
                "--no-huge",
                "-s",
                "512",
                "-c",
                "0x2",
                "-q",
                "32",
                "-o",
                "131072",
                "-w",
                "write",
                "-t",
                "3",
            ])
            .arg("-r")
            .arg(format!(
                "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}"
            ))
            .output();
    }
    let mut res: Vec<[Vec<f64>; 2]> = topo.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    for _ in 0..rounds {
        for (w, pattern) in ["randread", "randwrite"].iter().enumerate() {
            for (i, (_, nqn)) in topo.iter().enumerate() {
                res[i][w].push(perf(spdk, port, nqn, pattern, secs));
            }
        }
    }
    println!(
        "\ndata path: 4 KiB QD32 spdk_nvme_perf over NVMe/TCP loopback, {rounds} interleaved rounds of {secs} s, median IOPS"
    );
    println!(
        "{:<36} {:>10} {:>7} {:>10} {:>7}",
        "topology", "randread", "vs a", "randwrite", "vs a"
    );
    let med = |v: &Vec<f64>| {
        let mut v = v.clone();
        pct(&mut v, 0.5)
    };
    let (ar, aw) = (med(&res[0][0]), med(&res[0][1]));
    for (i, (label, _)) in topo.iter().enumerate() {
        let (r, w) = (med(&res[i][0]), med(&res[i][1]));
        println!(
            "{label:<36} {r:>10.0} {:>7.2} {w:>10.0} {:>7.2}",
            r / ar.max(1.0),
            w / aw.max(1.0)
        );
    }
}

/// A port for a listener, from this process's reserved block below the
/// ephemeral range (`runtime::testing::free_port`).
fn free_port() -> u16 {
    talon::runtime::testing::free_port()
}

/// Attaches the disk files by contract names (what the disk controller does);
/// the lvstore is made only when `create` (after a restart, examine imports it).
async fn attach_disks(c: &SpdkClient, dir: &Path, disks: &[&str], create: bool) {
    for d in disks {
        let file = dir.join(format!("{d}.img"));
        if !file.exists() {
            std::fs::File::create(&file)
                .and_then(|f| f.set_len(4096 * MIB))
                .expect("disk file");
        }
        c.bdev_aio_create(&talon::spdk::rpc::AioCreate {
            filename: file.display().to_string(),
            name: format!("talon-disk-{d}"),
            block_size: Some(4096),
            readonly: false,
            fallocate: false,
        })
        .await
        .expect("aio");
        if create {
            c.bdev_lvol_create_lvstore(&LvstoreCreate {
                bdev_name: format!("talon-disk-{d}"),
                lvs_name: format!("talon-{d}"),
                cluster_sz: Some(MIB as u32),
                clear_method: None,
                num_md_pages_per_cluster_ratio: None,
            })
            .await
            .expect("lvstore");
        }
    }
    c.bdev_wait_for_examine().await.expect("examine");
}

/// talon's volume controller on a fresh state holding the desired volumes;
/// returns once every volume's EngineStatus is ready.
async fn serve_volumes(c: &SpdkClient, port: u16, names: &[String]) -> talon::runtime::testing::TestRuntime {
    use talon::resources::config::{Disk, NodeConfig, Volume};
    use talon::resources::engine::{Engine, EngineStatus, ObjectState, TargetStatus};
    let c2 = c.clone();
    let rt = talon::runtime::testing::TestRuntime::start(move |rt| {
        rt.register(talon::controllers::engine::spdk_volume::SpdkVolumeController::new(c2, false))
    })
    .expect("runtime");
    let st = rt.state.clone();
    let node = NodeConfig {
        nvmf_port: port,
        ..NodeConfig::default()
    };
    st.create_typed("node", "", &node).expect("node");
    for d in ["d1", "d2"] {
        let disk: Disk =
            serde_json::from_value(serde_json::json!({"path": format!("/x/{d}.img")})).expect("disk");
        st.create_typed(d, "", &disk).expect("disk");
    }
    for (i, n) in names.iter().enumerate() {
        let v: Volume = serde_json::from_value(
            serde_json::json!({"sizeBytes": 16 * MIB, "replicas": 1 + i % 2, "engine": "v2"}),
        )
        .expect("volume");
        st.create_typed(n, "", &v).expect("volume");
    }
    let ts = TargetStatus {
        engine: Engine::V2,
        state: ObjectState::Ready,
        pid: None,
        socket: String::new(),
        version: "v26.05".into(),
        restarts: 0,
        message: String::new(),
    };
    st.create_typed(talon::resources::engine::SPDK_STATUS_ID, "", &ts)
        .expect("target");
    // the disk controller is not run here: its Ready, after the examine
    disk_ready::disks_ready_on(&st, &ts);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let ready = names
            .iter()
            .filter(|n| {
                st.get_typed::<EngineStatus>(n)
                    .ok()
                    .flatten()
                    .is_some_and(|e| e.spec.state == ObjectState::Ready)
            })
            .count();
        if ready == names.len() {
            return rt;
        }
        assert!(
            Instant::now() < deadline,
            "only {ready} of {} volumes ready",
            names.len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn rss_mib(pid: Option<i32>) -> f64 {
    let Some(pid) = pid else { return 0.0 };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|k| k.parse::<f64>().ok()))
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

async fn restart(spdk: &Path, volumes: usize, rounds: usize) {
    println!(
        "
restart: {volumes} volumes (half 2 replicas) exported again after a restart (2 aio file disks)"
    );
    println!(
        "{:<44} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "case", "target ms", "disks ms", "volumes ms", "total ms", "RSS MiB"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let _reap = reap::Reap::under(dir.path());
    let mut cfg = TargetConfig::new(dir.path().join("run"));
    cfg.spdk_dir = Some(spdk.to_path_buf());
    cfg.memory = Memory::NoHuge { mem_size_mib: 4096 };
    cfg.extra_args = vec!["--disable-cpumask-locks".into()];
    let mut t = Target::start(&cfg).await.expect("spdk_tgt");
    let c = t.client().clone();
    attach_disks(&c, dir.path(), &["d1", "d2"], true).await;
    let port = free_port();
    let names: Vec<String> = (0..volumes).map(|i| format!("rs{i}")).collect();
    let t0 = Instant::now();
    let rt = serve_volumes(&c, port, &names).await;
    let took = t0.elapsed().as_secs_f64() * 1e3;
    println!(
        "{:<44} {:>10} {:>10} {:>10.0} {:>10.0} {:>10.0}",
        "first start (create all)",
        "-",
        "-",
        took,
        took,
        rss_mib(t.pid())
    );
    rt.stop().await;
    for r in 0..rounds {
        let t0 = Instant::now();
        let rt = serve_volumes(&c, port, &names).await;
        let took = t0.elapsed().as_secs_f64() * 1e3;
        println!(
            "{:<44} {:>10} {:>10} {:>10.0} {:>10.0} {:>10.0}",
            format!("warm: talon restarts, target kept ({})", r + 1),
            "-",
            "-",
            took,
            took,
            rss_mib(t.pid())
        );
        rt.stop().await;
    }
    for r in 0..rounds {
        t.stop(Duration::from_secs(10)).await.expect("stop");
        let t0 = Instant::now();
        t = Target::start(&cfg).await.expect("spdk_tgt again");
        let up = t0.elapsed().as_secs_f64() * 1e3;
        attach_disks(&c, dir.path(), &["d1", "d2"], false).await;
        let disks = t0.elapsed().as_secs_f64() * 1e3 - up;
        let t1 = Instant::now();
        let rt = serve_volumes(&c, port, &names).await;
        let vols = t1.elapsed().as_secs_f64() * 1e3;
        let transports = c
            .nvmf_get_transports(&Default::default())
            .await
            .expect("transports")
            .len();
        println!(
            "{:<44} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0}",
            format!("cold: target restarts too ({}, {transports} transport)", r + 1),
            up,
            disks,
            vols,
            t0.elapsed().as_secs_f64() * 1e3,
            rss_mib(t.pid())
        );
        rt.stop().await;
    }
    t.stop(Duration::from_secs(10)).await.expect("stop");
}

/// The restore section (`restore`): a restored backup's file copied into new thin
/// lvols through the data mover (`spdk::volume::mover::fill_from_file`: only
/// the chunks that hold data are written), 512 MiB lvols from a sparse file with
/// 128 MiB written in 16 MiB runs: one replica, and two replicas one after
/// the other (as a two-replica Longhorn restore on one node); seconds,
/// lvol MiB/s and clusters each lvol holds after.
async fn restore(c: &SpdkClient, rounds: usize) {
    let size = 512 * MIB;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("restored.img");
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::File::create(&file).expect("file");
        f.set_len(size).expect("len");
        let run = vec![0xA7u8; 16 * MIB as usize];
        for k in 0..8u64 {
            f.seek(SeekFrom::Start(k * 64 * MIB)).expect("seek");
            f.write_all(&run).expect("write");
        }
        f.sync_all().expect("sync");
    }
    println!(
        "\nrestore: a file of {} MiB ({} MiB written) copied into new thin lvols (the mover)",
        size / MIB,
        128
    );
    println!(
        "{:<14} {:>5} {:>9} {:>12} {:>18}",
        "replicas", "round", "seconds", "lvol MiB/s", "clusters after"
    );
    for round in 0..rounds {
        for n in [1usize, 2] {
            let names: Vec<String> = (0..n).map(|k| format!("rst{round}{n}-r{k}")).collect();
            for name in &names {
                c.bdev_lvol_create(&LvolCreate::thin("talon-bench", name, size / MIB))
                    .await
                    .expect("lvol");
            }
            let t0 = Instant::now();
            for name in &names {
                talon::spdk::volume::mover::fill_from_file(
                    c,
                    &file,
                    &format!("talon-bench/{name}"),
                    talon::spdk::volume::mover::DEPTH,
                )
                .await
                .expect("copy");
            }
            let secs = t0.elapsed().as_secs_f64();
            let inv = Inventory::load(c).await.expect("inventory");
            let held: Vec<String> = names
                .iter()
                .map(|nm| {
                    inv.lvols
                        .get(&format!("talon-bench/{nm}"))
                        .map_or(0, |l| l.num_allocated_clusters)
                        .to_string()
                })
                .collect();
            println!(
                "{:<14} {:>5} {:>9.2} {:>12.0} {:>18}",
                n,
                round + 1,
                secs,
                (n as u64 * size / MIB) as f64 / secs,
                held.join(" + ")
            );
            for name in &names {
                c.bdev_lvol_delete(&ByName::new(format!("talon-bench/{name}")))
                    .await
                    .expect("lvol deleted");
            }
        }
    }
}

fn main() {
    let Some(spdk) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP spdk_volume bench: TALON_SPDK_DIR not set");
        return;
    };
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(async {
        if only.as_deref() == Some("restart") {
            let volumes = std::env::var("VOLUMES")
                .ok()
                .and_then(|r| r.parse().ok())
                .unwrap_or(100);
            let rounds = std::env::var("RESTART_ROUNDS")
                .ok()
                .and_then(|r| r.parse().ok())
                .unwrap_or(2);
            restart(&spdk, volumes, rounds).await;
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        // spdk_tgt is killed on every way out of here, a panic too
        let _reap = reap::Reap::under(dir.path());
        let mut cfg = TargetConfig::new(dir.path());
        cfg.spdk_dir = Some(spdk.clone());
        cfg.memory = Memory::NoHuge { mem_size_mib: 4096 };
        cfg.cpumask = "0x1".into();
        cfg.extra_args = vec!["--disable-cpumask-locks".into()];
        cfg.ready_timeout = Duration::from_secs(60);
        let t = Target::start(&cfg).await.expect("spdk_tgt");
        let c = t.client().clone();
        malloc_disk(&c, "talon-disk-bench", "talon-bench", 2048)
            .await
            .expect("a malloc disk");
        let _ = c.nvmf_create_transport(&CreateTransport::tcp()).await;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let ops = VolumeOps::new(c.clone());
        if only.as_deref().is_none_or(|o| o == "control") {
            control_plane(&ops, port).await;
        }
        let rounds = std::env::var("ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(3);
        if only.as_deref().is_none_or(|o| o == "rebuild") {
            rebuild(&spdk, &c, port, rounds).await;
        }
        if only
            .as_deref()
            .is_none_or(|o| o == "rebuild" || o == "rebuild_io")
        {
            rebuild_io(&spdk, &c, port, rounds).await;
        }
        if only.as_deref().is_none_or(|o| o == "snapshot") {
            snapshots(&spdk, &ops, port).await;
        }
        if only.as_deref().is_none_or(|o| o == "superblock") {
            superblock(&spdk, &ops, port).await;
        }
        if only.as_deref().is_none_or(|o| o == "data") {
            data_path(&spdk, &ops, port, rounds, 3).await;
        }
        if only.as_deref().is_none_or(|o| o == "restore") {
            restore(&c, rounds).await;
        }
        t.stop(Duration::from_secs(5)).await.expect("stop");
    });
}
