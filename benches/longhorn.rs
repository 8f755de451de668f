//! Longhorn-shaped V2 volumes through talon's instance-manager protocol,
//! against a real spdk_tgt (`TALON_SPDK_DIR`), printed as tables
//! (`cargo bench --bench longhorn`):
//!
//! 1. control plane: a Longhorn volume (two replicas on two disks, an engine
//!    over them, its export) made with three `InstanceCreate` calls, from the
//!    first call until the engine is `running`: p50/p99 over `VOLUMES` (20),
//!    and each call's share (replica a, replica b, engine);
//! 2. data path: 4 KiB randread / randwrite at QD32 and QD1 with
//!    spdk_nvme_perf over NVMe/TCP loopback, interleaved rounds over
//!    (a) talon's engine: raid1 of the two local lvols, exported, and
//!    (b) Longhorn's topology built by hand on the same target as
//!    longhorn-spdk-engine builds it (`connectReplicas`: every replica, the
//!    local ones too, is attached with `bdev_nvme_attach_controller` to its
//!    export; raid1 over the attached bdevs; exported).
//!    Both are written in full first (a thin lvol reads unallocated clusters
//!    as zeros without touching the disk). Each pair runs on two backings
//!    (`LH_BACKINGS`, default both): `memory` (the aio files in /dev/shm: no
//!    device limit, the CPU cost of the topology shows, as on fast NVMe) and
//!    `disk` (the aio files in the temp dir on the machine's virtual disk,
//!    which limits both alike).
//!
//! 3. rebuild (`rb`, issue 17): a 1 GiB replica with 10 % written rebuilt
//!    across two nodes, after the part's own talon and spdk_tgt above are
//!    stopped. Two talon nodes in this process (tests/support/longhorn_nodes.rs),
//!    each `serve_with` with its own spdk_tgt (A core 0, B core 1), data
//!    dir, 2 GiB aio disk in its temp dir and Longhorn ports, on 127.0.0.1
//!    and 127.0.0.2. The volume: replica A on A, replica B on B, engine on A
//!    without a frontend; 51 MiB written through the engine's export with
//!    spdk_dd, a `VolumeSnapshot` through the proxy, 51 MiB more (a
//!    snapshot and a head). Rows, interleaved per round (the order
//!    alternates):
//!    - thin (talon): `ReplicaRemove` B, B's replica deleted with its lvols
//!      (`InstanceDelete` cleanup_required) and made again empty,
//!      `ReplicaAdd` through the 8501 proxy; the time until `ReplicaList`
//!      shows B RW;
//!    - full (SPDK raid1 rebuild), the path talon does not take here, built
//!      by hand on the same targets: a thin lvol on A holding the same
//!      bytes (written through a hand-made export, then unexported), an
//!      empty thin 1 GiB lvol on B exported on 127.0.0.2 and attached on A
//!      (`bdev_nvme_attach_controller`), raid1 over both (no superblock),
//!      B's member removed (`bdev_raid_remove_base_bdev`: the raid stays
//!      online, the slot empties) and added back (`bdev_raid_add_base_bdev`:
//!      v26.05 starts a rebuild of every block onto a member added to an
//!      online raid); the time from the add until `bdev_raid_get_bdevs`
//!      shows no `process`. Every hand-made object is deleted after.
//!
//!    Bytes copied = what B's lvols hold after (`bdev_lvol_get_lvols`
//!    num_allocated_clusters x cluster size, head and snapshots). A note
//!    follows the table when `ReplicaList` showed a replica ERR during a
//!    thin rebuild (what longhorn-manager would take for a failed replica);
//!    the modes as they change go to stderr. The part takes about 1 min 45 s
//!    (5 rounds; most of it spdk_dd writing the 2 x 102 MiB, its core shared
//!    with B's polling reactor), so it runs by default.
//!
//! ```text
//!   talon serve (in-process, --longhorn-listen) ── spdk_tgt: one reactor, core 0 (0x1) ── aio files
//!   spdk_nvme_perf core 1 (-c 0x2) ──NVMe/TCP 127.0.0.1──> (a) raid1(lvol, lvol)
//!                                                          (b) raid1(nvme(lvol), nvme(lvol))
//!   rb: node A 127.0.0.1 (spdk_tgt 0x1): engine raid1(lvol A, nvme(B's replica)) ── 8501 proxy
//!       node B 127.0.0.2 (spdk_tgt 0x2): replica B ── thin copies from A
//!       full: raid1(lvol on A, nvme(lvol on B)) on A's spdk_tgt, B's member removed and added back
//! ```
//!
//! 4. `cl` (issue 55, not run by default: add it to `LH_PARTS`):
//!    Longhorn's `SnapshotClone` of a 1 GiB snapshot written in full
//!    (`CL_MIB`), into a volume on the source's node and into one on another
//!    node (the snapshot exposed there and read over NVMe/TCP); the time
//!    until `SnapshotCloneStatus` says complete.
//!
//! Knobs: `VOLUMES`, `ROUNDS` (5), `SECS` (4), `LH_PARTS` (`cp,dp,rb`; `cl` too),
//! `LH_BACKINGS` (`memory,disk`), `LH_TGT_MASK` (`0x1`), `LH_PERF_MASK`
//! (`0x2`). Every cell is the median of the rounds with min-max; the ratio
//! is the median of the per-round ratios (a round runs (a) and (b) back to
//! back) with their min-max. The machine is shared and noisy (load average
//! printed): compare within one run.

#[path = "../tests/support/longhorn_daemon.rs"]
mod longhorn_daemon;
#[path = "../tests/support/longhorn_nodes.rs"]
mod longhorn_nodes;
#[path = "../tests/support/longhorn_req.rs"]
mod longhorn_req;
#[path = "support/reap.rs"]
mod reap;
#[path = "../tests/support/spdk_dd.rs"]
#[allow(dead_code)]
mod spdk_dd;
#[path = "../tests/support/spdk_perf.rs"]
mod spdk_perf;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use longhorn_daemon::free_base;
use longhorn_nodes::{
    Node, RW, allocated_bytes, engine, modes, pattern, replica_add, replica_remove, snapshot,
};
use talon::controllers::engine::selection::SpdkOptions;
use talon::longhorn::server::LonghornOptions;
use talon::proto::imrpc::{
    self, disk_service_client::DiskServiceClient, instance_service_client::InstanceServiceClient,
    proxy_engine_service_client::ProxyEngineServiceClient,
};
use talon::serve::{ServeOptions, serve_with};
use talon::spdk::SpdkClient;
use talon::spdk::rpc::{
    AddNamespace, AttachController, ByName, ByNqn, CreateSubsystem, GetLvols, GetRaids, ListenAddress,
    LvolCreate, LvstoreSelector, RaidAddBaseBdev, RaidCategory, RaidCreate, RaidDelete, RaidLevel,
    SubsystemListener,
};
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// A port for a listener, from this process's reserved block below the
/// ephemeral range (`runtime::testing::free_port`).
fn free_port() -> u16 {
    talon::runtime::testing::free_port()
}

async fn running(c: &mut InstanceServiceClient<Channel>, name: &str, ty: &str) -> imrpc::InstanceStatus {
    loop {
        let r = c
            .instance_get(imrpc::InstanceGetRequest {
                name: name.into(),
                r#type: ty.into(),
                data_engine: imrpc::DataEngine::V2 as i32,
                ..Default::default()
            })
            .await;
        if let Ok(r) = r
            && let Some(s) = r.into_inner().status
        {
            if s.state == "running" {
                return s;
            }
            assert!(s.state != "error", "{ty} {name}: {}", s.error_msg);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A Longhorn volume `v` of `size`: two replicas (on `disks`), an engine; the
/// engine's port and the time each of the three calls took until running.
async fn make_volume(
    c: &mut InstanceServiceClient<Channel>,
    v: &str,
    size: u64,
    disks: [&str; 2],
) -> (u16, [f64; 3]) {
    let mut map = HashMap::new();
    let mut took = [0.0; 3];
    for (i, (k, disk)) in [("0000000a", disks[0]), ("0000000b", disks[1])]
        .into_iter()
        .enumerate()
    {
        let t = Instant::now();
        let r = format!("{v}-r-{k}");
        let resp = c
            .instance_create(longhorn_req::create(
                &r,
                "replica",
                v,
                imrpc::SpdkInstanceSpec {
                    disk_name: disk.into(),
                    size,
                    ..Default::default()
                },
            ))
            .await
            .expect("replica")
            .into_inner();
        let port = resp.status.map(|s| s.port_start).unwrap_or_default();
        running(c, &r, "replica").await;
        took[i] = t.elapsed().as_secs_f64() * 1000.0;
        map.insert(r, format!("127.0.0.1:{port}"));
    }
    let t = Instant::now();
    let e = format!("{v}-e-0");
    c.instance_create(longhorn_req::create(
        &e,
        "engine",
        v,
        imrpc::SpdkInstanceSpec {
            replica_address_map: map,
            size,
            ..Default::default()
        },
    ))
    .await
    .expect("engine");
    let port = u16::try_from(running(c, &e, "engine").await.port_start).expect("port");
    took[2] = t.elapsed().as_secs_f64() * 1000.0;
    (port, took)
}

async fn delete_volume(c: &mut InstanceServiceClient<Channel>, v: &str) {
    for (n, t) in [
        (format!("{v}-e-0"), "engine"),
        (format!("{v}-r-0000000a"), "replica"),
        (format!("{v}-r-0000000b"), "replica"),
    ] {
        c.instance_delete(imrpc::InstanceDeleteRequest {
            name: n,
            r#type: t.into(),
            cleanup_required: true,
            data_engine: imrpc::DataEngine::V2 as i32,
            ..Default::default()
        })
        .await
        .expect("delete");
    }
}

/// spdk_nvme_perf: IOPS of `workload` at queue depth `qd` and block size `bs`.
fn perf(spdk: &Path, port: u16, nqn: &str, workload: &str, qd: u32, bs: u32, secs: u32) -> f64 {
    let mask = std::env::var("LH_PERF_MASK").unwrap_or_else(|_| "0x2".into());
    let out = std::process::Command::new(spdk.join("build/bin/spdk_nvme_perf"))
        .args(["--no-huge", "-s", "512", "-c", &mask])
        .args([
            "-q",
            &qd.to_string(),
            "-o",
            &bs.to_string(),
            "-w",
            workload,
            "-t",
            &secs.to_string(),
        ])
        .arg("-r")
        .arg(format!(
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn} hostnqn:{}",
            spdk_perf::HOST_NQN
        ))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("spdk_nvme_perf");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "spdk_nvme_perf {workload}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    spdk_perf::total_iops(&text)
}

/// Longhorn's topology by hand: replica lvols exported, attached back, raid1, exported.
async fn longhorn_topology(c: &SpdkClient, size: u64, tag: &str, disks: [&str; 2]) -> (u16, String) {
    let any_host = |nqn: &str| CreateSubsystem {
        nqn: nqn.into(),
        allow_any_host: Some(true),
        serial_number: None,
        model_number: None,
        max_namespaces: Some(1),
        ana_reporting: None,
        min_cntlid: None,
        max_cntlid: None,
    };
    let mut members = Vec::new();
    for (k, disk) in [("a", disks[0]), ("b", disks[1])] {
        let lvs = format!("talon-{disk}");
        let lvs = lvs.as_str();
        let name = format!("{tag}-{k}");
        c.bdev_lvol_create(&LvolCreate::thin(lvs, &name, size / MIB))
            .await
            .expect("lvol");
        let nqn = format!("nqn.2016-06.io.spdk:{name}");
        let port = free_port();
        c.nvmf_create_subsystem(&any_host(&nqn)).await.expect("subsystem");
        c.nvmf_subsystem_add_ns(&AddNamespace::with_id(
            &nqn,
            format!("{lvs}/{name}"),
            uuid::Uuid::new_v4(),
        ))
        .await
        .expect("ns");
        c.nvmf_subsystem_add_listener(&SubsystemListener {
            nqn: nqn.clone(),
            listen_address: ListenAddress::tcp([127, 0, 0, 1].into(), port),
        })
        .await
        .expect("listener");
        let ctrl = format!("{tag}{k}");
        let bdevs = c
            .bdev_nvme_attach_controller(&AttachController::tcp(&ctrl, [127, 0, 0, 1].into(), port, &nqn))
            .await
            .expect("attach back");
        members.push(bdevs.into_iter().next().expect("bdev"));
    }
    c.bdev_raid_create(&RaidCreate {
        name: format!("{tag}-raid"),
        raid_level: RaidLevel::Raid1,
        base_bdevs: members,
        strip_size_kb: None,
        uuid: None,
        superblock: None,
    })
    .await
    .expect("raid");
    let nqn = format!("nqn.2016-06.io.spdk:{tag}");
    let port = free_port();
    c.nvmf_create_subsystem(&any_host(&nqn)).await.expect("subsystem");
    c.nvmf_subsystem_add_ns(&AddNamespace::with_id(
        &nqn,
        format!("{tag}-raid"),
        uuid::Uuid::new_v4(),
    ))
    .await
    .expect("ns");
    c.nvmf_subsystem_add_listener(&SubsystemListener {
        nqn: nqn.clone(),
        listen_address: ListenAddress::tcp([127, 0, 0, 1].into(), port),
    })
    .await
    .expect("listener");
    (port, nqn)
}

/// A hand-made export of bdev `bdev` as `nqn` on `ip:port` (any host).
async fn export(c: &SpdkClient, nqn: &str, bdev: &str, ip: IpAddr, port: u16) {
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
    c.nvmf_subsystem_add_ns(&AddNamespace::with_id(nqn, bdev, uuid::Uuid::new_v4()))
        .await
        .expect("ns");
    c.nvmf_subsystem_add_listener(&SubsystemListener {
        nqn: nqn.into(),
        listen_address: ListenAddress::tcp(ip, port),
    })
    .await
    .expect("listener");
}

/// `data` written at byte `at` of an export on 127.0.0.1 with spdk_dd.
async fn dd_write(spdk: &Path, dir: &Path, port: u16, nqn: &str, data: Vec<u8>, at: usize) {
    let (spdk, dir, nqn) = (spdk.to_path_buf(), dir.to_path_buf(), nqn.to_owned());
    tokio::task::spawn_blocking(move || spdk_dd::dd_write_at(&spdk, &dir, port, &nqn, &data, at))
        .await
        .expect("spdk_dd");
}

/// Allocated bytes of lvol `name` (`lvs/lvol`) on `c`.
async fn lvol_bytes(c: &SpdkClient, alias: &str) -> u64 {
    let cluster = c
        .bdev_lvol_get_lvstores(&LvstoreSelector::default())
        .await
        .expect("lvstores")
        .first()
        .map_or(0, |l| l.cluster_size);
    c.bdev_lvol_get_lvols(&GetLvols::default())
        .await
        .expect("lvols")
        .iter()
        .find(|l| l.alias == alias)
        .map_or(0, |l| l.num_allocated_clusters * cluster)
}

const RB_VOLUME: u64 = 1 << 30;
const RB_POLL: Duration = Duration::from_millis(20);
const RB_LIMIT: Duration = Duration::from_secs(600);

/// One thin rebuild: B's replica removed from the engine, deleted with its
/// lvols and made again empty, added back through the proxy; the time until
/// ReplicaList shows it RW, the bytes B's lvols hold then, and how long
/// ReplicaList showed a replica ERR meanwhile (what longhorn-manager would
/// take for a failed replica).
async fn rb_thin(
    a_addr: &str,
    src_held: u64,
    b: &Node,
    p: &mut ProxyEngineServiceClient<Channel>,
) -> (f64, u64, f64) {
    replica_remove(p, "vol-r-b").await;
    let addr_b = b
        .replica_remade_empty("disk-b", "vol-r-b", RB_VOLUME, RB_LIMIT)
        .await;
    let want = vec![(format!("tcp://{a_addr}"), RW), (format!("tcp://{addr_b}"), RW)];
    let t = Instant::now();
    replica_add(p, "vol-r-b", &addr_b).await.expect("ReplicaAdd");
    let (mut err, mut err_since, mut last) = (0.0, None::<Instant>, Vec::new());
    loop {
        let m = modes(p).await;
        if m != last {
            // the modes longhorn-manager would see, each time they change (stderr)
            eprintln!(
                "thin rebuild +{:.3}s: ReplicaList {m:?}",
                t.elapsed().as_secs_f64()
            );
            last = m.clone();
        }
        if m == want {
            break;
        }
        match (m.iter().any(|(_, mode)| *mode == longhorn_nodes::ERR), err_since) {
            (true, None) => err_since = Some(Instant::now()),
            (false, Some(s)) => {
                err += s.elapsed().as_secs_f64();
                err_since = None;
            }
            _ => {}
        }
        assert!(
            t.elapsed() < RB_LIMIT,
            "thin rebuild: {m:?} after {:?}",
            t.elapsed()
        );
        tokio::time::sleep(RB_POLL).await;
    }
    let secs = t.elapsed().as_secs_f64();
    err += err_since.map_or(0.0, |s| s.elapsed().as_secs_f64());
    let held = allocated_bytes(b, "vol-r-b").await;
    if held < src_held {
        // a rebuilt replica holding less than its source: B's lvols now and a second later (stderr)
        for when in ["at RW", "1 s later"] {
            let l = b
                .spdk
                .bdev_lvol_get_lvols(&GetLvols::default())
                .await
                .expect("lvols");
            let l: Vec<_> = l
                .iter()
                .map(|l| {
                    (
                        l.name.clone(),
                        l.num_allocated_clusters,
                        l.is_snapshot,
                        l.is_clone,
                    )
                })
                .collect();
            eprintln!("thin rebuild: B holds {held} bytes < source's {src_held}; B's lvols {when}: {l:?}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    (secs, held, err)
}

/// One full rebuild by SPDK's raid1, built by hand: an empty thin lvol on B
/// exported on 127.0.0.2, attached on A, raid1 over A's source lvol and it,
/// the member removed and added back (SPDK v26.05 starts a rebuild of
/// every block onto a member added to an online raid1); the time from the
/// add until the raid reports no process, the bytes B's lvol holds then.
/// Every object it makes it deletes.
async fn rb_full(a: &Node, b: &Node, src: &str) -> (f64, u64) {
    let (lvol_b, nqn_b, ctrl, raid) = (
        "talon-disk-b/bench-full-b",
        "nqn.2016-06.io.spdk:bench-full-b",
        "benchfullb",
        "bench-full",
    );
    b.spdk
        .bdev_lvol_create(&LvolCreate::thin("talon-disk-b", "bench-full-b", RB_VOLUME / MIB))
        .await
        .expect("B's lvol");
    let port = std::net::TcpListener::bind((b.ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port on B");
    export(&b.spdk, nqn_b, lvol_b, b.ip, port).await;
    let member = a
        .spdk
        .bdev_nvme_attach_controller(&AttachController::tcp(ctrl, b.ip, port, nqn_b))
        .await
        .expect("attach B's lvol on A")
        .into_iter()
        .next()
        .expect("a namespace bdev");
    a.spdk
        .bdev_raid_create(&RaidCreate {
            name: raid.into(),
            raid_level: RaidLevel::Raid1,
            base_bdevs: vec![src.into(), member.clone()],
            strip_size_kb: None,
            uuid: None,
            superblock: None,
        })
        .await
        .expect("raid1");
    let get = || async {
        a.spdk
            .bdev_raid_get_bdevs(&GetRaids {
                category: RaidCategory::All,
            })
            .await
            .expect("raids")
            .into_iter()
            .find(|r| r.name == raid)
            .expect("the raid")
    };
    a.spdk
        .bdev_raid_remove_base_bdev(&ByName::new(&member))
        .await
        .expect("remove B's member");
    talon::runtime::testing::eventually("B's member out of the raid", RB_LIMIT, || async {
        let r = get().await;
        (r.num_base_bdevs_discovered == 1 && r.state == "online").then_some(())
    })
    .await;
    let t = Instant::now();
    a.spdk
        .bdev_raid_add_base_bdev(&RaidAddBaseBdev {
            raid_bdev: raid.into(),
            base_bdev: member.clone(),
        })
        .await
        .expect("add B's member back");
    // the process is attached after every channel knows it: done once it has
    // been seen and is gone, with both members in service
    let mut seen = false;
    loop {
        let r = get().await;
        match &r.process {
            Some(p) => {
                assert_eq!(p.target, member, "the rebuild writes B's member");
                seen = true;
            }
            None if seen && r.num_base_bdevs_operational == 2 => break,
            None => {}
        }
        assert!(
            t.elapsed() < RB_LIMIT,
            "full rebuild: {r:?} after {:?}",
            t.elapsed()
        );
        tokio::time::sleep(RB_POLL).await;
    }
    let secs = t.elapsed().as_secs_f64();
    let bytes = lvol_bytes(&b.spdk, lvol_b).await;
    a.spdk
        .bdev_raid_delete(&RaidDelete::new(raid))
        .await
        .expect("raid delete");
    a.spdk
        .bdev_nvme_detach_controller(&ByName::new(ctrl))
        .await
        .expect("detach");
    b.spdk
        .nvmf_delete_subsystem(&ByNqn { nqn: nqn_b.into() })
        .await
        .expect("B's export");
    b.spdk
        .bdev_lvol_delete(&ByName::new(lvol_b))
        .await
        .expect("B's lvol");
    (secs, bytes)
}

/// Part 3, issue 17's rebuild of a 1 GiB replica with 10 % written, across
/// two nodes: talon's thin rebuild vs SPDK's raid1 rebuild of every block.
async fn rebuild_part(spdk: &Path, rounds: usize) {
    const HALF: usize = 51 << 20;
    let setup = Instant::now();
    let (ip_a, ip_b) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2]));
    let base = longhorn_nodes::free_base(&[ip_a, ip_b]);
    let mut a = Node::with_cpumask(ip_a, base, Some(spdk), "0x1").await;
    // each node's spdk_tgt is killed on every way out, a panic too
    let reap = reap::Reap::under(a.dir.path());
    let mut b = Node::with_cpumask(ip_b, base, Some(spdk), "0x2").await;
    let _reap = reap.and(b.dir.path());
    // B's disk holds the full rebuild's 1 GiB next to the thin replica
    a.disk_sized("disk-a", 2048 * MIB).await;
    b.disk_sized("disk-b", 2048 * MIB).await;
    let addr_a = a.replica_again("disk-a", "vol-r-a", RB_VOLUME).await;
    let addr_b = b.replica_again("disk-b", "vol-r-b", RB_VOLUME).await;
    engine(&a, &[("vol-r-a", &addr_a), ("vol-r-b", &addr_b)], RB_VOLUME, "").await;
    let est = longhorn_nodes::running(
        &InstanceServiceClient::new(a.channel(3).await),
        "vol-e-0",
        "engine",
    )
    .await;
    let port = u16::try_from(est.port_start).expect("engine port");
    let mut p = ProxyEngineServiceClient::new(a.channel(1).await);
    eprintln!("rb: nodes and volume up in {:.1}s", setup.elapsed().as_secs_f64());
    let halves = [(pattern(HALF, 1), 0), (pattern(HALF, 2), 512 << 20)];
    // the volume: half, a snapshot through the proxy, half (a snapshot and a head)
    let nqn = "nqn.2023-01.io.longhorn.spdk:volume-vol";
    dd_write(spdk, a.dir.path(), port, nqn, halves[0].0.clone(), halves[0].1).await;
    snapshot(&mut p, "s1").await.expect("VolumeSnapshot s1");
    dd_write(spdk, a.dir.path(), port, nqn, halves[1].0.clone(), halves[1].1).await;
    // the full rebuild's source: one thin lvol on A with the same bytes
    let src = "talon-disk-a/bench-full-a";
    a.spdk
        .bdev_lvol_create(&LvolCreate::thin("talon-disk-a", "bench-full-a", RB_VOLUME / MIB))
        .await
        .expect("A's source lvol");
    let (src_nqn, src_port) = ("nqn.2016-06.io.spdk:bench-full-a", free_port());
    export(&a.spdk, src_nqn, src, ip_a, src_port).await;
    for (data, at) in &halves {
        dd_write(spdk, a.dir.path(), src_port, src_nqn, data.clone(), *at).await;
    }
    a.spdk
        .nvmf_delete_subsystem(&ByNqn { nqn: src_nqn.into() })
        .await
        .expect("drop the source's export");
    eprintln!(
        "rb: volume and source written in {:.1}s",
        setup.elapsed().as_secs_f64()
    );
    let held_thin = allocated_bytes(&a, "vol-r-a").await;
    let held_full = lvol_bytes(&a.spdk, src).await;
    println!(
        "\nRebuild of a {} MiB replica across two nodes (127.0.0.1 spdk_tgt 0x1, 127.0.0.2 spdk_tgt 0x2), {} MiB written; \
         sources hold {} MiB (A's replica: a snapshot and a head) and {} MiB (A's lvol under the raid); load average at start: {}",
        RB_VOLUME / MIB,
        2 * HALF as u64 / MIB,
        held_thin / MIB,
        held_full / MIB,
        loadavg()
    );
    // per row: seconds, bytes
    let mut rows: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    let mut errs = Vec::new();
    for r in 0..rounds {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for k in order {
            let (secs, bytes) = if k == 0 {
                let (secs, bytes, err) = rb_thin(&addr_a, held_thin, &b, &mut p).await;
                errs.push(err);
                (secs, bytes)
            } else {
                rb_full(&a, &b, src).await
            };
            rows[k].0.push(secs);
            rows[k].1.push(bytes as f64);
        }
    }
    println!(
        "{rounds} interleaved rounds; median (min-max); load average at the end: {}",
        loadavg()
    );
    println!("| rebuild | time s | bytes copied MiB | MiB/s | B holds, % of the volume |");
    println!("|---|---|---|---|---|");
    for (k, what) in ["thin (talon)", "full (SPDK raid1 rebuild)"]
        .into_iter()
        .enumerate()
    {
        let (secs, bytes) = &rows[k];
        let mib: Vec<f64> = bytes.iter().map(|b| b / MIB as f64).collect();
        let rate: Vec<f64> = mib.iter().zip(secs).map(|(m, s)| m / s).collect();
        let share: Vec<f64> = bytes.iter().map(|b| b * 100.0 / RB_VOLUME as f64).collect();
        println!(
            "| {what} | {} | {} | {} | {} |",
            spread(secs, 2),
            spread(&mib, 0),
            spread(&rate, 0),
            spread(&share, 1)
        );
    }
    let shown = errs.iter().filter(|e| **e > 0.0).count();
    if shown > 0 {
        println!(
            "NOTE: during {shown} of {rounds} thin rebuilds ReplicaList showed a replica ERR (polled every {} ms; \
             the longest {:.0} ms)",
            RB_POLL.as_millis(),
            errs.iter().copied().fold(0.0, f64::max) * 1000.0
        );
    }
    a.spdk
        .bdev_lvol_delete(&ByName::new(src))
        .await
        .expect("A's source lvol");
    a.stop().await;
    b.stop().await;
}

/// Part 4, issue 55: Longhorn's `SnapshotClone` of a 1 GiB snapshot written
/// in full (`CL_MIB`, 1024), into a one-replica volume on the source's node
/// (the snapshot read through a loopback export) and into one on another
/// node (the source node exposes it, the mover reads it over NVMe/TCP); the
/// time from `SnapshotClone` until `SnapshotCloneStatus` says complete
/// (polled every 50 ms). Each clone volume is deleted after its round.
async fn clone_part(spdk: &Path, rounds: usize) {
    let vol: u64 = env_or("CL_MIB", 1024) * MIB;
    let setup = Instant::now();
    let (ip_a, ip_b) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2]));
    let base = longhorn_nodes::free_base(&[ip_a, ip_b]);
    let mut a = Node::with_cpumask(ip_a, base, Some(spdk), "0x1").await;
    let reap = reap::Reap::under(a.dir.path());
    let mut b = Node::with_cpumask(ip_b, base, Some(spdk), "0x2").await;
    let _reap = reap.and(b.dir.path());
    a.disk_sized("disk-a", 2 * vol + 512 * MIB).await;
    b.disk_sized("disk-b", vol + 512 * MIB).await;
    let addr_a = a.replica_again("disk-a", "vol-r-a", vol).await;
    engine(&a, &[("vol-r-a", &addr_a)], vol, "spdk-tcp-nvmf").await;
    let est = longhorn_nodes::running(
        &InstanceServiceClient::new(a.channel(3).await),
        "vol-e-0",
        "engine",
    )
    .await;
    let port = u16::try_from(est.port_start).expect("engine port");
    let nqn = "nqn.2023-01.io.longhorn.spdk:volume-vol";
    const PIECE: u64 = 128 * MIB;
    for k in 0..vol / PIECE {
        dd_write(
            spdk,
            a.dir.path(),
            port,
            nqn,
            pattern(PIECE as usize, k + 1),
            (k * PIECE) as usize,
        )
        .await;
    }
    let mut p = ProxyEngineServiceClient::new(a.channel(1).await);
    snapshot(&mut p, "s1").await.expect("VolumeSnapshot s1");
    eprintln!(
        "cl: volume written and snapshotted in {:.1}s",
        setup.elapsed().as_secs_f64()
    );
    println!(
        "\nSnapshotClone of a {} MiB snapshot written in full (node A 127.0.0.1 spdk_tgt 0x1, node B 127.0.0.2 spdk_tgt 0x2); load average at start: {}",
        vol / MIB,
        loadavg()
    );
    let mut rows: [Vec<f64>; 2] = Default::default();
    for r in 0..rounds {
        for (k, (n, disk)) in [(&a, "disk-a"), (&b, "disk-b")].into_iter().enumerate() {
            let v = format!("cl{r}{k}");
            let (replica, eng) = (format!("{v}-r-0"), format!("{v}-e-0"));
            let mut inst = InstanceServiceClient::new(n.channel(3).await);
            let spec =
                |name: &str, ty: &str, s: imrpc::SpdkInstanceSpec| longhorn_req::create(name, ty, &v, s);
            inst.instance_create(spec(
                &replica,
                "replica",
                imrpc::SpdkInstanceSpec {
                    disk_name: disk.into(),
                    size: vol,
                    ..Default::default()
                },
            ))
            .await
            .expect("the clone's replica");
            let at = longhorn_nodes::running(&inst, &replica, "replica")
                .await
                .port_start;
            inst.instance_create(spec(
                &eng,
                "engine",
                imrpc::SpdkInstanceSpec {
                    replica_address_map: [(replica.clone(), format!("{}:{at}", n.ip))].into(),
                    size: vol,
                    frontend: "spdk-tcp-nvmf".into(),
                    ..Default::default()
                },
            ))
            .await
            .expect("the clone's engine");
            longhorn_nodes::running(&inst, &eng, "engine").await;
            let pr = imrpc::ProxyEngineRequest {
                volume_name: v.clone(),
                ..longhorn_nodes::req(&eng)
            };
            let mut pn = ProxyEngineServiceClient::new(n.channel(1).await);
            let t = Instant::now();
            pn.snapshot_clone(imrpc::EngineSnapshotCloneRequest {
                proxy_engine_request: Some(pr.clone()),
                from_engine_address: format!("{ip_a}:{}", base + 4),
                snapshot_name: "s1".into(),
                from_engine_name: "vol-e-0".into(),
                from_volume_name: "vol".into(),
                clone_mode: imrpc::CloneMode::FullCopy as i32,
                ..Default::default()
            })
            .await
            .expect("SnapshotClone");
            loop {
                let s = pn
                    .snapshot_clone_status(pr.clone())
                    .await
                    .expect("SnapshotCloneStatus")
                    .into_inner()
                    .status;
                if s.values().any(|x| x.state == "error") {
                    panic!("the clone failed: {s:?}");
                }
                if !s.is_empty() && s.values().all(|x| x.state == "complete") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            rows[k].push(t.elapsed().as_secs_f64());
            for (name, ty) in [(&eng, "engine"), (&replica, "replica")] {
                inst.instance_delete(longhorn_nodes::delete_request(name, ty))
                    .await
                    .expect("delete the clone");
                longhorn_nodes::gone(&inst, name, ty).await;
            }
        }
    }
    println!(
        "{rounds} interleaved rounds; median (min-max); load average at the end: {}",
        loadavg()
    );
    println!("| clone of {} MiB | time s | MiB/s |", vol / MIB);
    println!("|---|---|---|");
    for (k, what) in [
        "source on the same node",
        "source on another node (exposed, NVMe/TCP)",
    ]
    .into_iter()
    .enumerate()
    {
        let rate: Vec<f64> = rows[k].iter().map(|s| (vol / MIB) as f64 / s).collect();
        println!("| {what} | {} | {} |", spread(&rows[k], 2), spread(&rate, 0));
    }
    a.stop().await;
    b.stop().await;
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `median (min-max)` of `v`.
fn spread(v: &[f64], digits: usize) -> String {
    let mut v = v.to_vec();
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.*} ({lo:.*}-{hi:.*})",
        digits,
        pct(&mut v, 0.5),
        digits,
        digits
    )
}

fn main() {
    let Some(spdk) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP longhorn bench: TALON_SPDK_DIR not set");
        return;
    };
    if std::env::var_os("RUST_LOG").is_some() {
        // profiling: e.g. RUST_LOG=talon::controllers::longhorn=debug (one line per reconcile)
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let volumes: usize = env_or("VOLUMES", 20);
    let rounds: usize = env_or("ROUNDS", 5);
    let secs: u32 = env_or("SECS", 4);
    let parts = std::env::var("LH_PARTS").unwrap_or_else(|_| "cp,dp,rb".into());
    let backings = std::env::var("LH_BACKINGS").unwrap_or_else(|_| "memory,disk".into());
    let tgt_mask = std::env::var("LH_TGT_MASK").unwrap_or_else(|_| "0x1".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(async move {
        if !parts.split(',').any(|p| p == "cp" || p == "dp") {
            // the rebuild or the clone alone: no single-node talon to start
            if parts.split(',').any(|p| p == "rb") {
                rebuild_part(&spdk, rounds).await;
            }
            if parts.split(',').any(|p| p == "cl") {
                clone_part(&spdk, rounds).await;
            }
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        // the daemon's spdk_tgt is killed on every way out, a panic too
        let _reap = reap::Reap::under(dir.path());
        let config = dir.path().join("talon.yaml");
        std::fs::write(
            &config,
            format!("node:\n  listenAddress: 127.0.0.1\n  allowedHosts: [\"{}\"]\n", spdk_perf::HOST_NQN),
        )
        .expect("config");
        let opts = ServeOptions {
            data_dir: dir.path().join("data"),
            config: Some(config),
            socket: dir.path().join("run/talon.sock"),
            listen_tcp: None,
            token_file: None,
            tls: Default::default(),
            run_dir: dir.path().join("run"),
            host_root: PathBuf::from("/"),
            spdk: SpdkOptions {
                spdk_dir: Some(spdk.clone()),
                no_huge: true,
                no_huge_mem_mib: 2048,
                cpumask: tgt_mask.clone(),
                extra_args: vec!["--disable-cpumask-locks".into()],
                ..Default::default()
            },
            stop_targets_on_exit: true,
            set_aside_orphan_data: false,
        };
        let base = free_base();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_with(
            opts,
            Some(LonghornOptions {
                listen: SocketAddr::from(([127, 0, 0, 1], base)),
                ports: longhorn_daemon::instance_ports(base),
                limits: Default::default(),
                overcommit_percent: LonghornOptions::DEFAULT_OVERCOMMIT_PERCENT,
            }),
            async move {
                let _ = rx.await;
            },
        ));
        let url = |i: u16| format!("http://127.0.0.1:{}", base + i);
        let ch = |i: u16| {
            let u = url(i);
            async move {
                for _ in 0..300 {
                    if let Ok(c) = Channel::from_shared(u.clone()).expect("url").connect().await {
                        return c;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                panic!("no Longhorn port at {u}");
            }
        };
        // disk files: "disk" in the temp dir (the machine's disk), "memory" in /dev/shm
        let shm = tempfile::tempdir_in("/dev/shm").ok();
        let mut disks = DiskServiceClient::new(ch(2).await);
        let mut pairs: Vec<(&str, [&str; 2])> = Vec::new();
        for (backing, names) in [("memory", ["lm-a", "lm-b"]), ("disk", ["lb-a", "lb-b"])] {
            if !backings.split(',').any(|b| b == backing) {
                continue;
            }
            let at = match backing {
                "memory" => match &shm {
                    Some(d) => d.path().to_owned(),
                    None => {
                        eprintln!("no /dev/shm: no memory backing");
                        continue;
                    }
                },
                _ => dir.path().to_owned(),
            };
            for name in names {
                let f = at.join(format!("{name}.img"));
                std::fs::File::create(&f)
                    .and_then(|f| f.set_len(2048 * MIB))
                    .expect("disk file");
                disks
                    .disk_create(imrpc::DiskCreateRequest {
                        disk_type: imrpc::DiskType::Block as i32,
                        disk_name: name.into(),
                        disk_path: f.display().to_string(),
                        disk_driver: "aio".into(),
                        ..Default::default()
                    })
                    .await
                    .expect("disk");
            }
            pairs.push((backing, names));
        }
        let mut inst = InstanceServiceClient::new(ch(3).await);
        println!(
            "\nspdk_tgt cpumask {tgt_mask}, spdk_nvme_perf -c {}; load average at start: {}",
            std::env::var("LH_PERF_MASK").unwrap_or_else(|_| "0x2".into()),
            loadavg()
        );

        // 1. control plane
        if parts.split(',').any(|p| p == "cp")
            && let Some((_, cp_disks)) = pairs.first().copied()
        {
            let mut times = Vec::new();
            let mut calls: [Vec<f64>; 3] = Default::default();
            for i in 0..volumes {
                let v = format!("cp{i}");
                let t = Instant::now();
                let (_, took) = make_volume(&mut inst, &v, 64 * MIB, cp_disks).await;
                times.push(t.elapsed().as_secs_f64() * 1000.0);
                for (k, x) in took.into_iter().enumerate() {
                    calls[k].push(x);
                }
            }
            for i in 0..volumes {
                delete_volume(&mut inst, &format!("cp{i}")).await;
            }
            let (p50, p99) = (pct(&mut times, 0.5), pct(&mut times, 0.99));
            println!("\nLonghorn volume (2 replicas on 2 disks + engine + export) through InstanceCreate, {volumes} volumes:");
            println!("| | p50 ms | p99 ms |");
            println!("|---|---|---|");
            println!("| InstanceCreate x3 -> engine running | {p50:.1} | {p99:.1} |");
            for (k, what) in ["replica a -> running", "replica b -> running", "engine -> running"]
                .into_iter()
                .enumerate()
            {
                let (a, b) = (pct(&mut calls[k], 0.5), pct(&mut calls[k], 0.99));
                println!("| {what} | {a:.1} | {b:.1} |");
            }
        }

        // 2. data path
        if parts.split(',').any(|p| p == "dp") {
            let size = 256 * MIB;
            let c = SpdkClient::new(dir.path().join("run/spdk.sock"));
            // (backing, topology, port, nqn)
            let mut topo: Vec<(&str, &str, u16, String)> = Vec::new();
            for (backing, d) in &pairs {
                let v = format!("dp{}", &backing[..1]);
                let (port, _) = make_volume(&mut inst, &v, size, *d).await;
                topo.push((backing, "talon", port, format!("nqn.2023-01.io.longhorn.spdk:volume-{v}")));
                let (lh_port, lh_nqn) = longhorn_topology(&c, size, &format!("lht{}", &backing[..1]), *d).await;
                topo.push((backing, "longhorn", lh_port, lh_nqn));
            }
            for (_, _, port, nqn) in &topo {
                let (spdk, nqn, port) = (spdk.clone(), nqn.clone(), *port);
                // fill: 256 MiB sequentially in 128 KiB writes
                tokio::task::spawn_blocking(move || perf(&spdk, port, &nqn, "write", 32, 131072, 4))
                    .await
                    .expect("fill");
            }
            let cases = [("randread", 32u32), ("randwrite", 32), ("randread", 1), ("randwrite", 1)];
            let mut iops: HashMap<(usize, usize), Vec<f64>> = HashMap::new();
            for r in 0..rounds {
                for (ci, (w, qd)) in cases.iter().enumerate() {
                    // alternate which of a pair goes first
                    let mut order: Vec<usize> = (0..topo.len()).collect();
                    if r % 2 == 1 {
                        for p in order.chunks_mut(2) {
                            p.reverse();
                        }
                    }
                    for ti in order {
                        let (_, _, port, nqn) = &topo[ti];
                        let (spdk, nqn, port, w, qd) = (spdk.clone(), nqn.clone(), *port, *w, *qd);
                        let v = tokio::task::spawn_blocking(move || perf(&spdk, port, &nqn, w, qd, 4096, secs))
                            .await
                            .expect("perf");
                        iops.entry((ci, ti)).or_default().push(v);
                    }
                }
            }
            println!(
                "\nData path, 4 KiB, spdk_nvme_perf over NVMe/TCP loopback, {rounds} interleaved rounds of {secs} s; IOPS median (min-max); load average at the end: {}",
                loadavg()
            );
            println!("| backing | workload | talon engine (local lvols) | Longhorn topology (NVMe/TCP loopback) | ratio |");
            println!("|---|---|---|---|---|");
            for pi in 0..topo.len() / 2 {
                for (ci, (w, qd)) in cases.iter().enumerate() {
                    let a = &iops[&(ci, 2 * pi)];
                    let b = &iops[&(ci, 2 * pi + 1)];
                    let ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y.max(1.0)).collect();
                    println!(
                        "| {} | {w} QD{qd} | {} | {} | {}x |",
                        topo[2 * pi].0,
                        spread(a, 0),
                        spread(b, 0),
                        spread(&ratios, 2)
                    );
                }
            }
        }
        let _ = stop.send(());
        let _ = task.await;

        // 3. rebuild across two nodes (their own targets: the one above is gone)
        if parts.split(',').any(|p| p == "rb") {
            rebuild_part(&spdk, rounds).await;
        }
        // 4. SnapshotClone of 1 GiB, on the source's node and from another node
        if parts.split(',').any(|p| p == "cl") {
            clone_part(&spdk, rounds).await;
        }
    });
}
