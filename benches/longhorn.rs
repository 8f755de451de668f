//! Longhorn-shaped V2 volumes through talon's instance-manager protocol,
//! against a real spdk_tgt (`TALON_SPDK_DIR`), printed as tables
//! (`cargo bench --bench longhorn`):
//!
//! 1. control plane: a Longhorn volume (two replicas on two disks, an engine
//!    over them, its export) made with three `InstanceCreate` calls, from the
//!    first call until the engine is `running`: p50/p99 over `VOLUMES` (20);
//! 2. data path: 4 KiB randread / randwrite at QD32 and QD1 with
//!    spdk_nvme_perf over NVMe/TCP loopback, interleaved rounds over
//!    (a) talon's engine: raid1 of the two local lvols, exported, and
//!    (b) Longhorn's topology built by hand on the same target: each replica
//!    lvol exported over NVMe/TCP, attached back with
//!    `bdev_nvme_attach_controller`, raid1 over the attached bdevs, exported.
//!    Both are written in full first (a thin lvol reads unallocated clusters
//!    as zeros without touching the disk).
//!
//! ```text
//!   talon serve (in-process, --longhorn-listen) ── spdk_tgt core 0 ── aio files lb-a, lb-b
//!   spdk_nvme_perf core 1 ──NVMe/TCP 127.0.0.1──> (a) raid1(lvol, lvol)
//!                                                (b) raid1(nvme(lvol), nvme(lvol))
//! ```
//!
//! The machine is shared and noisy: compare within one run.

#[path = "../tests/support/spdk_perf.rs"]
mod spdk_perf;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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

fn free_base() -> u16 {
    for _ in 0..200 {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
        let base = probe.local_addr().expect("addr").port();
        drop(probe);
        if base > 65000 {
            continue;
        }
        let all: Vec<_> = (0..5)
            .map(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)))
            .collect();
        if all.iter().all(Result::is_ok) {
            return base;
        }
    }
    panic!("no five consecutive free ports");
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

/// A Longhorn volume `v` of `size`: two replicas, an engine; the engine's port.
async fn make_volume(c: &mut InstanceServiceClient<Channel>, v: &str, size: u64) -> u16 {
    let mut map = HashMap::new();
    for (k, disk) in [("0000000a", "lb-a"), ("0000000b", "lb-b")] {
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
        map.insert(r, format!("127.0.0.1:{port}"));
    }
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
    u16::try_from(running(c, &e, "engine").await.port_start).expect("port")
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
    let out = std::process::Command::new(spdk.join("build/bin/spdk_nvme_perf"))
        .args(["--no-huge", "-s", "512", "-c", "0x2"])
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
async fn longhorn_topology(c: &SpdkClient, size: u64) -> (u16, String) {
    let any_host = |nqn: &str| CreateSubsystem {
        nqn: nqn.into(),
        allow_any_host: Some(true),
        serial_number: None,
        model_number: None,
        max_namespaces: Some(1),
        ana_reporting: None,
    };
    let mut members = Vec::new();
    for (k, lvs) in [("a", "talon-lb-a"), ("b", "talon-lb-b")] {
        let name = format!("lhtopo-{k}");
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
        let ctrl = format!("lhtopo{k}");
        let bdevs = c
            .bdev_nvme_attach_controller(&AttachController::tcp(&ctrl, [127, 0, 0, 1].into(), port, &nqn))
            .await
            .expect("attach back");
        members.push(bdevs.into_iter().next().expect("bdev"));
    }
    c.bdev_raid_create(&RaidCreate {
        name: "lhtopo-raid".into(),
        raid_level: RaidLevel::Raid1,
        base_bdevs: members,
        strip_size_kb: None,
        uuid: None,
        superblock: None,
    })
    .await
    .expect("raid");
    let nqn = "nqn.2016-06.io.spdk:lhtopo".to_string();
    let port = free_port();
    c.nvmf_create_subsystem(&any_host(&nqn)).await.expect("subsystem");
    c.nvmf_subsystem_add_ns(&AddNamespace::with_id(&nqn, "lhtopo-raid", uuid::Uuid::new_v4()))
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

fn main() {
    let Some(spdk) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP longhorn bench: TALON_SPDK_DIR not set");
        return;
    };
    let volumes: usize = std::env::var("VOLUMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let secs: u32 = std::env::var("SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
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
            run_dir: dir.path().join("run"),
            host_root: PathBuf::from("/"),
            spdk: SpdkOptions {
                spdk_dir: Some(spdk.clone()),
                no_huge: true,
                no_huge_mem_mib: 2048,
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
        let mut disks = DiskServiceClient::new(ch(2).await);
        for name in ["lb-a", "lb-b"] {
            let f = dir.path().join(format!("{name}.img"));
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
        let mut inst = InstanceServiceClient::new(ch(3).await);

        // 1. control plane
        let mut times = Vec::new();
        for i in 0..volumes {
            let v = format!("cp{i}");
            let t = Instant::now();
            make_volume(&mut inst, &v, 64 * MIB).await;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        for i in 0..volumes {
            delete_volume(&mut inst, &format!("cp{i}")).await;
        }
        let (p50, p99) = (pct(&mut times, 0.5), pct(&mut times, 0.99));
        println!("\nLonghorn volume (2 replicas on 2 disks + engine + export) through InstanceCreate, {volumes} volumes:");
        println!("| | p50 ms | p99 ms |");
        println!("|---|---|---|");
        println!("| InstanceCreate x3 -> engine running | {p50:.1} | {p99:.1} |");

        // 2. data path
        let size = 256 * MIB;
        let talon_port = make_volume(&mut inst, "dp", size).await;
        let talon_nqn = "nqn.2023-01.io.longhorn.spdk:volume-dp".to_string();
        let c = SpdkClient::new(dir.path().join("run/spdk.sock"));
        let (lh_port, lh_nqn) = longhorn_topology(&c, size).await;
        let topo = [("talon engine (local lvols)", talon_port, talon_nqn), ("Longhorn topology (NVMe/TCP loopback)", lh_port, lh_nqn)];
        for (_, port, nqn) in &topo {
            let (spdk, nqn, port) = (spdk.clone(), nqn.clone(), *port);
            // fill: 256 MiB sequentially in 128 KiB writes
            tokio::task::spawn_blocking(move || perf(&spdk, port, &nqn, "write", 32, 131072, 4))
                .await
                .expect("fill");
        }
        let cases = [("randread", 32u32), ("randwrite", 32), ("randread", 1), ("randwrite", 1)];
        let mut iops: HashMap<(usize, usize), Vec<f64>> = HashMap::new();
        for _ in 0..rounds {
            for (ci, (w, qd)) in cases.iter().enumerate() {
                for (ti, (_, port, nqn)) in topo.iter().enumerate() {
                    let (spdk, nqn, port, w, qd) = (spdk.clone(), nqn.clone(), *port, *w, *qd);
                    let v = tokio::task::spawn_blocking(move || perf(&spdk, port, &nqn, w, qd, 4096, secs))
                        .await
                        .expect("perf");
                    iops.entry((ci, ti)).or_default().push(v);
                }
            }
        }
        println!("\nData path, 4 KiB, spdk_nvme_perf over NVMe/TCP loopback, median of {rounds} interleaved rounds of {secs} s (IOPS):");
        println!("| workload | {} | {} | ratio |", topo[0].0, topo[1].0);
        println!("|---|---|---|---|");
        for (ci, (w, qd)) in cases.iter().enumerate() {
            let a = pct(iops.get_mut(&(ci, 0)).expect("a"), 0.5);
            let b = pct(iops.get_mut(&(ci, 1)).expect("b"), 0.5);
            println!("| {w} QD{qd} | {a:.0} | {b:.0} | {:.2}x |", a / b.max(1.0));
        }
        let _ = stop.send(());
        let _ = task.await;
    });
}
