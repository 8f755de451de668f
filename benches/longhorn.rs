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
//! ```text
//!   talon serve (in-process, --longhorn-listen) ── spdk_tgt: one reactor, core 0 (0x1) ── aio files
//!   spdk_nvme_perf core 1 (-c 0x2) ──NVMe/TCP 127.0.0.1──> (a) raid1(lvol, lvol)
//!                                                          (b) raid1(nvme(lvol), nvme(lvol))
//! ```
//!
//! Knobs: `VOLUMES`, `ROUNDS` (5), `SECS` (4), `LH_PARTS` (`cp,dp`),
//! `LH_BACKINGS` (`memory,disk`), `LH_TGT_MASK` (`0x1`), `LH_PERF_MASK`
//! (`0x2`). Every cell is the median of the rounds with min-max; the ratio
//! is the median of the per-round ratios (a round runs (a) and (b) back to
//! back) with their min-max. The machine is shared and noisy (load average
//! printed): compare within one run.

#[path = "../tests/support/longhorn_daemon.rs"]
mod longhorn_daemon;
#[path = "../tests/support/spdk_perf.rs"]
mod spdk_perf;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use longhorn_daemon::free_base;
use talon::controllers::engine::selection::SpdkOptions;
use talon::longhorn::proto::imrpc::{
    self, disk_service_client::DiskServiceClient, instance_service_client::InstanceServiceClient,
};
use talon::longhorn::server::LonghornOptions;
use talon::serve::{ServeOptions, serve_with};
use talon::spdk::SpdkClient;
use talon::spdk::rpc::{
    AddNamespace, AttachController, CreateSubsystem, ListenAddress, LvolCreate, RaidCreate, RaidLevel,
    SubsystemListener,
};
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn create_req(
    name: &str,
    ty: &str,
    volume: &str,
    sp: imrpc::SpdkInstanceSpec,
) -> imrpc::InstanceCreateRequest {
    imrpc::InstanceCreateRequest {
        spec: Some(imrpc::InstanceSpec {
            name: name.into(),
            r#type: ty.into(),
            volume_name: volume.into(),
            port_count: 1,
            data_engine: imrpc::DataEngine::V2 as i32,
            spdk_instance_spec: Some(sp),
            ..Default::default()
        }),
        data_layout_type: 0,
    }
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
            .instance_create(create_req(
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
    c.instance_create(create_req(
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
        // profiling: e.g. RUST_LOG=talon::controllers::engine::longhorn=debug (one line per reconcile)
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let volumes: usize = env_or("VOLUMES", 20);
    let rounds: usize = env_or("ROUNDS", 5);
    let secs: u32 = env_or("SECS", 4);
    let parts = std::env::var("LH_PARTS").unwrap_or_else(|_| "cp,dp".into());
    let backings = std::env::var("LH_BACKINGS").unwrap_or_else(|_| "memory,disk".into());
    let tgt_mask = std::env::var("LH_TGT_MASK").unwrap_or_else(|_| "0x1".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(async move {
        let dir = tempfile::tempdir().expect("tempdir");
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
        };
        let base = free_base();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_with(
            opts,
            Some(LonghornOptions {
                listen: SocketAddr::from(([127, 0, 0, 1], base)),
                ports: 33000..=33999,
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
    });
}
