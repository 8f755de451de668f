//! Two talon nodes in one process (`#[path]`-included): each `serve_with`
//! with its own Longhorn listeners on its own loopback address (127.0.0.1,
//! 127.0.0.2, the same five ports, as every instance manager of a cluster),
//! its own data dir and either a `SpdkDouble` (a TEST DOUBLE of spdk_tgt) or
//! a real spdk_tgt it spawns; and the Longhorn calls the engine-proxy tests
//! and the rebuild bench share (replica and engine instances, ReplicaList
//! modes, ReplicaAdd / ReplicaRemove, VolumeSnapshot, the bytes a replica's
//! lvols hold).
//!
//! ```text
//!   Node::new(127.0.0.1, base) ── serve_with ── spdk_tgt / SpdkDouble (run/spdk.sock)
//!   Node::new(127.0.0.2, base) ── serve_with ── spdk_tgt / SpdkDouble
//!   ProxyEngineServiceClient(a.channel(1)) ──ReplicaAdd──> engine on A ──> replica on B
//! ```

#![allow(dead_code)] // each includer uses a part

#[path = "serve_cmd.rs"]
mod serve_cmd;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::longhorn_req;
use talon::controllers::engine::selection::SpdkOptions;
use talon::longhorn::server::LonghornOptions;
use talon::proto::imrpc::{
    self, disk_service_client::DiskServiceClient, instance_service_client::InstanceServiceClient,
    proxy_engine_service_client::ProxyEngineServiceClient,
};
use talon::proto::ptypes;
use talon::serve::{ServeOptions, serve_with};
use talon::spdk::rpc::{GetLvols, LvstoreSelector};
use talon::spdk::{SpdkClient, SpdkDouble};
use tonic::transport::Channel;

use super::spdk_perf;

const MIB: u64 = 1 << 20;
/// How long a node, an instance or a mode change may take to show.
pub const WAIT: Duration = Duration::from_secs(30);

pub const RW: i32 = ptypes::ReplicaMode::Rw as i32;
pub const WO: i32 = ptypes::ReplicaMode::Wo as i32;
pub const ERR: i32 = ptypes::ReplicaMode::Err as i32;

/// `talon serve` options of a node at `ip`: on a double (adopted on the run
/// dir's socket) or, with `spdk`, on a real spdk_tgt it spawns on `cpumask`.
/// Lines of `dir/node-extra.yaml`, when a test wrote one, join the node's
/// settings (`  key: value`).
pub fn opts(dir: &Path, ip: &str, spdk: Option<&Path>, cpumask: &str) -> ServeOptions {
    let config = dir.join("node.yaml");
    let extra = std::fs::read_to_string(dir.join("node-extra.yaml")).unwrap_or_default();
    std::fs::write(
        &config,
        format!(
            "node:\n  listenAddress: {ip}\n  allowedHosts: [\"{}\"]\n{extra}",
            spdk_perf::HOST_NQN
        ),
    )
    .expect("config");
    let spdk = match spdk {
        Some(d) => SpdkOptions {
            spdk_dir: Some(d.to_path_buf()),
            no_huge: true,
            no_huge_mem_mib: 1024,
            cpumask: cpumask.into(),
            extra_args: vec!["--disable-cpumask-locks".into()],
            ..Default::default()
        },
        None => {
            // a stand-in binary: found, never run
            let fake = dir.join("spdk_tgt");
            std::fs::write(&fake, "#!/bin/sh\nexit 1\n").expect("fake spdk_tgt");
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            SpdkOptions {
                spdk_tgt: Some(fake),
                no_huge: true,
                no_huge_mem_mib: 256,
                ..Default::default()
            }
        }
    };
    ServeOptions {
        data_dir: dir.join("data"),
        config: Some(config),
        socket: dir.join("run/talon.sock"),
        listen_tcp: None,
        token_file: None,
        tls: Default::default(),
        run_dir: dir.join("run"),
        host_root: PathBuf::from("/"),
        spdk,
        stop_targets_on_exit: true,
        set_aside_orphan_data: false,
    }
}

/// Ports free on both loopback addresses from `base`, in a block reserved
/// for this test process (`reserve_ports`): five for the gRPC services, then
/// each node's instance ports (`INSTANCE_PORTS` each), so two runs at once (a
/// bench, another test) never share an export's port.
const SPAN: u16 = 5 + 2 * INSTANCE_PORTS;
const INSTANCE_PORTS: u16 = 50;

pub fn free_base(ips: &[IpAddr]) -> u16 {
    const { assert!(SPAN <= talon::runtime::testing::PORT_BLOCK) };
    talon::runtime::testing::reserve_ports(ips)
}

/// One talon node: its temp dir (data, run dir, disk files), its SPDK and
/// its Longhorn listeners at `ip:base..=base+4`.
pub struct Node {
    pub dir: tempfile::TempDir,
    /// The double, or None on a real spdk_tgt.
    pub double: Option<SpdkDouble>,
    pub real: Option<PathBuf>,
    pub spdk: SpdkClient,
    pub ip: IpAddr,
    pub base: u16,
    /// The real spdk_tgt's cores.
    pub cpumask: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), talon::serve::ServeError>>>,
    /// A node run as its own `talon serve` process ([`Node::spawned`]), so a
    /// test can kill it: the process while it runs.
    child: Option<std::process::Child>,
    process: bool,
    /// `TALON_FAILPOINT` of the next start of a process node.
    failpoint: Option<String>,
}

impl Node {
    /// A node at `ip` (its listeners from `base`) on a double, or with
    /// `real` (an SPDK tree) on a spdk_tgt of its own on core 0.
    pub async fn new(ip: IpAddr, base: u16, real: Option<&Path>) -> Node {
        Node::with_cpumask(ip, base, real, "0x1").await
    }

    /// [`Node::new`] with the real spdk_tgt on `cpumask`.
    pub async fn with_cpumask(ip: IpAddr, base: u16, real: Option<&Path>, cpumask: &str) -> Node {
        Node::with_config(ip, base, real, cpumask, "").await
    }

    /// [`Node::with_cpumask`] with `extra` among its node settings
    /// (`node-extra.yaml`, lines of `  key: value`).
    pub async fn with_config(ip: IpAddr, base: u16, real: Option<&Path>, cpumask: &str, extra: &str) -> Node {
        Node::made(ip, base, real, cpumask, extra, false).await
    }

    /// [`Node::with_config`] as its own `talon serve` process (this build,
    /// its log in `<dir>/talon.log`, shown when a test fails), on a real
    /// spdk_tgt only: a crash test kills it ([`Node::set_failpoint`],
    /// [`Node::killed_itself`]) and starts it again on the spdk_tgt it left,
    /// which the next talon adopts.
    pub async fn spawned(ip: IpAddr, base: u16, real: &Path, cpumask: &str, extra: &str) -> Node {
        Node::made(ip, base, Some(real), cpumask, extra, true).await
    }

    async fn made(
        ip: IpAddr,
        base: u16,
        real: Option<&Path>,
        cpumask: &str,
        extra: &str,
        process: bool,
    ) -> Node {
        // the daemons' logs (they run in this process), shown when a test fails
        talon::runtime::testing::capture_logs();
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("run")).expect("run dir");
        if !extra.is_empty() {
            std::fs::write(dir.path().join("node-extra.yaml"), extra).expect("node-extra.yaml");
        }
        let socket = dir.path().join("run/spdk.sock");
        let double = match real {
            Some(_) => None,
            None => Some(SpdkDouble::start(&socket).await.expect("double")),
        };
        let spdk = SpdkClient::new(&socket);
        let mut n = Node {
            dir,
            double,
            real: real.map(Path::to_path_buf),
            spdk,
            ip,
            base,
            cpumask: cpumask.into(),
            stop: None,
            task: None,
            child: None,
            process,
            failpoint: None,
        };
        n.start().await;
        n
    }

    /// The instance ports of this node's Longhorn listeners: each node its
    /// own range (one machine here).
    fn instance_ports(&self) -> std::ops::RangeInclusive<u16> {
        let first = self.base
            + 5
            + if self.ip == IpAddr::from([127, 0, 0, 1]) {
                0
            } else {
                INSTANCE_PORTS
            };
        first..=first + INSTANCE_PORTS - 1
    }

    pub async fn start(&mut self) {
        if self.process {
            return self.start_process().await;
        }
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let lh = LonghornOptions {
            listen: SocketAddr::new(self.ip, self.base),
            // instance ports: each node its own range (one machine here)
            ports: self.instance_ports(),
            limits: Default::default(),
            overcommit_percent: LonghornOptions::DEFAULT_OVERCOMMIT_PERCENT,
        };
        let ip = self.ip.to_string();
        self.task = Some(tokio::spawn(serve_with(
            opts(self.dir.path(), &ip, self.real.as_deref(), &self.cpumask),
            Some(lh),
            async move {
                let _ = rx.await;
            },
        )));
        self.stop = Some(stop);
        let url = self.url(3);
        let task = self.task.as_mut().expect("just spawned");
        talon::runtime::testing::until_listening(&url, task, WAIT).await;
    }

    /// `talon serve` of this build with the settings [`opts`] gives an
    /// in-process node, `TALON_FAILPOINT` set when a test asked for one.
    async fn start_process(&mut self) {
        let dir = self.dir.path();
        let real = self
            .real
            .as_deref()
            .expect("a process node runs on a real spdk_tgt");
        opts(dir, &self.ip.to_string(), Some(real), &self.cpumask);
        let ports = self.instance_ports();
        let mut cmd = serve_cmd::serve(Path::new(env!("CARGO_BIN_EXE_talon")), dir, "node.yaml");
        cmd.args([
            "--no-huge",
            "--no-huge-mem-mib",
            "1024",
            "--spdk-cpumask",
            &self.cpumask,
        ])
        .arg("--spdk-arg=--disable-cpumask-locks")
        .arg("--longhorn-listen")
        .arg(SocketAddr::new(self.ip, self.base).to_string())
        .arg("--longhorn-port-range")
        .arg(format!("{}-{}", ports.start(), ports.end()))
        .env("TALON_SPDK_DIR", real)
        .env_remove("TALON_FAILPOINT");
        if let Some(f) = &self.failpoint {
            cmd.env("TALON_FAILPOINT", f);
        }
        let mut child = cmd.spawn().expect("spawn talon serve");
        let url = self.url(3);
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            if Channel::from_shared(url.clone())
                .expect("url")
                .connect()
                .await
                .is_ok()
            {
                break;
            }
            if let Some(st) = child.try_wait().expect("talon serve") {
                panic!(
                    "talon serve ended before {url} answered: {st}\n{}",
                    self.log_tail()
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{url} did not answer within {WAIT:?}\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child = Some(child);
    }

    /// `TALON_FAILPOINT` of this process node's next start.
    pub fn set_failpoint(&mut self, point: Option<&str>) {
        self.failpoint = point.map(str::to_owned);
    }

    /// Waits up to `within` for this process node to kill itself at its
    /// failpoint: true once it is gone by SIGKILL (reaped; the spdk_tgt it
    /// ran keeps serving), false if it still runs.
    pub async fn killed_itself(&mut self, within: Duration) -> bool {
        use std::os::unix::process::ExitStatusExt;
        let deadline = std::time::Instant::now() + within;
        let child = self.child.as_mut().expect("a process node that runs");
        loop {
            if let Some(st) = child.try_wait().expect("talon serve") {
                self.child = None;
                let _ = std::fs::remove_file(self.dir.path().join("run/talon.sock"));
                assert_eq!(st.signal(), Some(9), "talon serve ended otherwise: {st}");
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of a process node's log, newest last: talon's own,
    /// and spdk_tgt's errors once per message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("talon.log")).unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| {
                !l.contains("spdk_tgt:")
                    || (l.contains("*ERROR*") && seen.insert(l.rsplit("*ERROR*").next().unwrap_or(l)))
            })
            .collect();
        format!(
            "talon.log (last lines):\n{}",
            lines[lines.len().saturating_sub(60)..].join("\n")
        )
    }

    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGTERM: talon stops, its spdk_tgt keeps serving (adopted next)
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let st = c.wait().expect("wait for talon serve");
            assert!(st.success(), "talon serve exits cleanly on SIGTERM: {st}");
            return;
        }
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.expect("join").expect("clean stop");
        }
    }

    pub fn url(&self, i: u16) -> String {
        format!("http://{}:{}", self.ip, self.base + i)
    }

    pub async fn channel(&self, i: u16) -> Channel {
        Channel::from_shared(self.url(i))
            .expect("url")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn lvols(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .spdk
            .bdev_lvol_get_lvols(&GetLvols::default())
            .await
            .expect("lvols")
            .into_iter()
            .map(|l| l.alias)
            .collect();
        v.sort();
        v
    }

    /// A disk (aio file) and a running replica on it; returns its `ip:port`.
    pub async fn replica(&self, disk: &str, name: &str, size: u64) -> String {
        self.disk(disk).await;
        self.replica_again(disk, name, size).await
    }

    /// A disk (aio file of 256 MiB) made through Longhorn's DiskCreate.
    pub async fn disk(&self, disk: &str) {
        self.disk_sized(disk, 256 * MIB).await;
    }

    /// A disk (a sparse aio file of `bytes`) made through Longhorn's DiskCreate.
    pub async fn disk_sized(&self, disk: &str, bytes: u64) {
        let f = self.dir.path().join(format!("{disk}.img"));
        std::fs::File::create(&f)
            .and_then(|f| f.set_len(bytes))
            .expect("disk file");
        DiskServiceClient::new(self.channel(2).await)
            .disk_create(imrpc::DiskCreateRequest {
                disk_type: imrpc::DiskType::Block as i32,
                disk_name: disk.into(),
                disk_path: f.display().to_string(),
                block_size: 4096,
                disk_driver: "aio".into(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("DiskCreate {disk}: {e}"));
    }

    /// Replica `name` deleted with its lvols (`cleanup_required`) and made
    /// again empty on disk `disk`, once none of its lvols and no rebuild
    /// snapshot is left (within `wait`); returns its `ip:port`.
    pub async fn replica_remade_empty(&self, disk: &str, name: &str, size: u64, wait: Duration) -> String {
        InstanceServiceClient::new(self.channel(3).await)
            .instance_delete(delete_request(name, "replica"))
            .await
            .unwrap_or_else(|e| panic!("delete replica {name}: {e}"));
        talon::runtime::testing::eventually(&format!("replica {name}'s lvols deleted"), wait, || async {
            (!self
                .lvols()
                .await
                .iter()
                .any(|l| l.contains(name) || l.contains("talon-rb-")))
            .then_some(())
        })
        .await;
        self.replica_again(disk, name, size).await
    }

    /// A running replica on disk `disk` (made already); returns its `ip:port`.
    pub async fn replica_again(&self, disk: &str, name: &str, size: u64) -> String {
        let mut inst = InstanceServiceClient::new(self.channel(3).await);
        inst.instance_create(longhorn_req::replica(name, "vol", disk, size))
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
        let st = running(&inst, name, "replica").await;
        format!("{}:{}", self.ip, st.port_start)
    }
}

impl Drop for Node {
    /// A process node: talon killed, and the spdk_tgt of its run dir (which
    /// outlives talon by design).
    fn drop(&mut self) {
        if !self.process {
            return;
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let sock = self.dir.path().join("run/spdk.sock").display().to_string();
        for pid in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = pid.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("spdk_tgt") && cmdline.contains(&sock) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

pub async fn running(c: &InstanceServiceClient<Channel>, name: &str, ty: &str) -> imrpc::InstanceStatus {
    talon::runtime::testing::eventually(&format!("{ty} {name} running"), WAIT, || async {
        let mut c = c.clone();
        let r = c.instance_get(get_request(name, ty)).await.ok()?;
        r.into_inner().status.filter(|s| s.state == "running")
    })
    .await
}

pub fn req(engine: &str) -> imrpc::ProxyEngineRequest {
    imrpc::ProxyEngineRequest {
        address: String::new(),
        engine_name: engine.into(),
        volume_name: "vol".into(),
        data_engine: imrpc::DataEngine::V2 as i32,
        ..Default::default()
    }
}

pub async fn snapshot(
    p: &mut ProxyEngineServiceClient<Channel>,
    name: &str,
) -> Result<String, tonic::Status> {
    p.volume_snapshot(imrpc::EngineVolumeSnapshotRequest {
        proxy_engine_request: Some(req("vol-e-0")),
        snapshot_volume: Some(ptypes::VolumeSnapshotRequest {
            name: name.into(),
            ..Default::default()
        }),
    })
    .await
    .map(|r| r.into_inner().snapshot.map(|s| s.name).unwrap_or_default())
}

pub async fn engine(a: &Node, replicas: &[(&str, &String)], size: u64, frontend: &str) {
    let inst = engine_create(a, "vol-e-0", replicas, size, frontend).await;
    running(&inst, "vol-e-0", "engine").await;
}

/// Asks node `a` for engine `name` of volume `vol` over `replicas` (name and
/// address), without waiting for it to run; the node's InstanceService.
pub async fn engine_create(
    a: &Node,
    name: &str,
    replicas: &[(&str, &String)],
    size: u64,
    frontend: &str,
) -> InstanceServiceClient<Channel> {
    let inst = InstanceServiceClient::new(a.channel(3).await);
    let map: HashMap<String, String> = replicas
        .iter()
        .map(|(r, x)| ((*r).to_owned(), (*x).clone()))
        .collect();
    inst.clone()
        .instance_create(longhorn_req::engine(name, "vol", map, size, frontend))
        .await
        .unwrap_or_else(|e| panic!("engine {name} create: {e}"));
    inst
}

/// `(address, mode)` of every replica of the engine, sorted.
pub async fn modes(p: &mut ProxyEngineServiceClient<Channel>) -> Vec<(String, i32)> {
    let mut m: Vec<(String, i32)> = p
        .replica_list(req("vol-e-0"))
        .await
        .expect("ReplicaList")
        .into_inner()
        .replica_list
        .expect("list")
        .replicas
        .into_iter()
        .map(|r| (r.address.map(|a| a.address).unwrap_or_default(), r.mode))
        .collect();
    m.sort();
    m
}

pub async fn replica_add(
    p: &ProxyEngineServiceClient<Channel>,
    name: &str,
    address: &str,
) -> Result<(), tonic::Status> {
    p.clone()
        .replica_add(imrpc::EngineReplicaAddRequest {
            proxy_engine_request: Some(req("vol-e-0")),
            replica_name: name.into(),
            replica_address: format!("tcp://{address}"),
            ..Default::default()
        })
        .await
        .map(|_| ())
}

pub async fn replica_remove(p: &mut ProxyEngineServiceClient<Channel>, name: &str) {
    p.replica_remove(imrpc::EngineReplicaRemoveRequest {
        proxy_engine_request: Some(req("vol-e-0")),
        replica_name: name.into(),
        replica_address: String::new(),
    })
    .await
    .unwrap_or_else(|e| panic!("ReplicaRemove {name}: {e}"));
}

/// Bytes that differ in every 8-byte word (`seed` tells two patterns apart).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The bytes the lvols of `replica` hold on `n` (its head and snapshots, a
/// rebuild's `talon-rb-*` included): allocated clusters times the cluster size.
pub async fn allocated_bytes(n: &Node, replica: &str) -> u64 {
    let cluster = n
        .spdk
        .bdev_lvol_get_lvstores(&LvstoreSelector::default())
        .await
        .expect("lvstores")
        .first()
        .map_or(0, |l| l.cluster_size);
    let prefix = format!("{replica}-snap-");
    n.spdk
        .bdev_lvol_get_lvols(&GetLvols::default())
        .await
        .expect("lvols")
        .iter()
        .filter(|l| l.name == replica || l.name.starts_with(&prefix))
        .map(|l| l.num_allocated_clusters * cluster)
        .sum()
}

/// `InstanceGet` of V2 instance `name` of kind `kind` ("engine", "replica").
pub fn get_request(name: &str, kind: &str) -> imrpc::InstanceGetRequest {
    imrpc::InstanceGetRequest {
        name: name.into(),
        r#type: kind.into(),
        data_engine: imrpc::DataEngine::V2 as i32,
        ..Default::default()
    }
}

/// Waits until instance `name` of kind `kind` is no longer there
/// (`InstanceGet` fails).
pub async fn gone(c: &InstanceServiceClient<Channel>, name: &str, kind: &str) {
    talon::runtime::testing::eventually(&format!("{kind} {name} gone"), WAIT, || async {
        c.clone()
            .instance_get(get_request(name, kind))
            .await
            .is_err()
            .then_some(())
    })
    .await;
}

/// `InstanceDelete` of V2 instance `name` of kind `kind` ("engine",
/// "replica"), its lvols with it.
pub fn delete_request(name: &str, kind: &str) -> imrpc::InstanceDeleteRequest {
    imrpc::InstanceDeleteRequest {
        name: name.into(),
        r#type: kind.into(),
        cleanup_required: true,
        data_engine: imrpc::DataEngine::V2 as i32,
        ..Default::default()
    }
}

/// Two nodes, a replica on each (`vol-r-a`, `vol-r-b`), engine `vol-e-0` on
/// A over both with an `spdk-tcp-nvmf` frontend; on the doubles, or on real
/// spdk_tgt with `real`; returns the
/// nodes, the replicas' addresses and the engine's export port.
pub async fn two_nodes_nvmf(real: Option<&std::path::Path>, size: u64) -> (Node, Node, String, String, u16) {
    let (ip_a, ip_b) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2]));
    let base = free_base(&[ip_a, ip_b]);
    let a = Node::new(ip_a, base, real).await;
    let b = Node::new(ip_b, base, real).await;
    let addr_a = a.replica("disk-a", "vol-r-a", size).await;
    let addr_b = b.replica("disk-b", "vol-r-b", size).await;
    engine(
        &a,
        &[("vol-r-a", &addr_a), ("vol-r-b", &addr_b)],
        size,
        "spdk-tcp-nvmf",
    )
    .await;
    let inst = InstanceServiceClient::new(a.channel(3).await);
    let port = running(&inst, "vol-e-0", "engine").await.port_start;
    (a, b, addr_a, addr_b, u16::try_from(port).expect("port"))
}
