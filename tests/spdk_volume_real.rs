//! `engine.SpdkVolumeController` against a real spdk_tgt (`TALON_SPDK_DIR`):
//! volumes with 1 and 2 local replicas exported over NVMe/TCP on 127.0.0.1,
//! I/O through SPDK's own initiator (spdk_nvme_perf), snapshot, expand (the
//! size a host sees, read through an NVMe/TCP attach), clone, delete with no
//! leftovers; and `kill -9` of spdk_tgt in the middle of 20 creates.

#[path = "support/api_gate.rs"]
mod api_gate;
#[path = "support/disk_ready.rs"]
mod disk_ready;
#[path = "support/peer_api.rs"]
mod peer_api;
#[path = "support/spdk_dd.rs"]
mod spdk_dd;
#[path = "support/spdk_perf.rs"]
mod spdk_perf;
#[path = "support/spdk_real.rs"]
mod spdk_real;

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use talon::controllers::engine::spdk_volume::SpdkVolumeController;
use talon::resources::config::{Disk, NodeConfig, Snapshot, Volume};
use talon::resources::engine::SPDK_STATUS_ID;
use talon::resources::engine::{Engine, EngineStatus, ObjectState, SnapshotStatus, TargetStatus};
use talon::runtime::State;
use talon::runtime::testing::{TestRuntime, eventually};
use talon::spdk::SpdkClient;
use talon::spdk::rpc::{AioCreate, AttachController, ByName, GetBdevs, LvstoreCreate};
use talon::spdk::target::{Target, TargetConfig};
use talon::spdk::volume::Inventory;

use spdk_dd::{dd, dd_as, dd_retried, read_bdev};
use spdk_real::{Reaper, free_port, spdk_dir, spdk_dir_with};

const WAIT: Duration = Duration::from_secs(90);
const MIB: u64 = 1 << 20;

fn target_cfg(dir: &Path, spdk: &Path) -> TargetConfig {
    spdk_real::target_cfg(&dir.join("run"), spdk, 2048)
}

/// Attaches the disk files by contract names; the lvstore is made only when
/// `create` (after a restart it is imported by examine).
async fn attach_disks(c: &SpdkClient, dir: &Path, disks: &[&str], create: bool) {
    for d in disks {
        let file = dir.join(format!("{d}.img"));
        if !file.exists() {
            std::fs::File::create(&file)
                .and_then(|f| f.set_len(1024 * MIB))
                .expect("disk file");
        }
        c.bdev_aio_create(&AioCreate {
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

fn target_status(restarts: u32) -> TargetStatus {
    TargetStatus {
        engine: Engine::V2,
        state: ObjectState::Ready,
        pid: None,
        socket: String::new(),
        version: "v26.05".into(),
        restarts,
        message: String::new(),
    }
}

/// The host NQN of the talon node whose listener is on `port` (what its
/// engine attaches remote replicas as).
fn node_nqn(port: u16) -> String {
    format!("nqn.2025-01.io.talon.test:node:{port}")
}

fn runtime(c: &SpdkClient, disks: &[&str], port: u16) -> TestRuntime {
    runtime_in(c, disks, port, None)
}

/// [`runtime`] with a data directory (restores from backups are made there).
fn runtime_in(c: &SpdkClient, disks: &[&str], port: u16, data_dir: Option<&Path>) -> TestRuntime {
    talon::runtime::testing::capture_logs();
    let c2 = c.clone();
    let data_dir = data_dir.map(Path::to_path_buf);
    let rt = TestRuntime::start(move |rt| {
        let mut ctl = SpdkVolumeController::new(c2, false)
            .with_host_nqn(Some(node_nqn(port)))
            .with_peers(talon::controllers::engine::peer::Peers::new(Some(
                peer_api::TOKEN.into(),
            )));
        if let Some(d) = data_dir {
            ctl = ctl.with_data_dir(d);
        }
        rt.register(ctl)
    })
    .expect("runtime");
    let state = rt.state.clone();
    // the tests' own initiators (spdk_dd, spdk_nvme_perf) connect as HOST_NQN
    let node = NodeConfig {
        nvmf_port: port,
        allowed_hosts: vec![spdk_perf::HOST_NQN.to_string()],
        ..NodeConfig::default()
    };
    state.create_typed("node", "", &node).expect("node");
    state
        .create_typed(SPDK_STATUS_ID, "", &target_status(0))
        .expect("target");
    for d in disks {
        let disk: Disk = serde_json::from_value(json!({"path": format!("/x/{d}.img")})).expect("disk");
        state.create_typed(d, "", &disk).expect("disk");
    }
    disk_ready::disks_ready_on(&state, &target_status(0));
    rt
}

fn volume(size: u64, replicas: u32) -> Volume {
    serde_json::from_value(json!({"sizeBytes": size, "replicas": replicas, "engine": "v2"})).expect("volume")
}

fn engine(state: &State, id: &str) -> Option<EngineStatus> {
    state.get_typed::<EngineStatus>(id).ok().flatten().map(|t| t.spec)
}

async fn ready(state: &State, id: &str) -> EngineStatus {
    eventually(&format!("{id} ready"), WAIT, || async {
        engine(state, id).filter(|s| s.state == ObjectState::Ready)
    })
    .await
}

/// The namespace size a host sees: attach the export over NVMe/TCP inside the
/// same target, read the bdev, detach.
async fn host_size(c: &SpdkClient, port: u16, nqn: &str) -> u64 {
    let names = c
        .bdev_nvme_attach_controller(&AttachController {
            hostnqn: Some(spdk_perf::HOST_NQN.into()),
            ..AttachController::tcp("hostview", [127, 0, 0, 1].into(), port, nqn)
        })
        .await
        .expect("attach");
    let name = names
        .first()
        .cloned()
        .expect("a bdev registered (explicit NGUID)");
    let size = c.bdev(&name).await.expect("get").expect("bdev").size_bytes();
    c.bdev_nvme_detach_controller(&ByName::new("hostview"))
        .await
        .expect("detach");
    size
}

async fn leftovers(c: &SpdkClient) -> Vec<String> {
    let inv = Inventory::load(c).await.expect("inventory");
    let mut out: Vec<String> = inv
        .bdevs
        .values()
        .filter(|b| !b.name.starts_with("talon-disk-"))
        .map(|b| format!("bdev {} {:?}", b.name, b.aliases))
        .collect();
    out.extend(
        inv.subsystems
            .iter()
            .filter(|s| s.subtype != "Discovery")
            .map(|s| format!("subsystem {}", s.nqn)),
    );
    out
}

/// Where the raid1 of volume `vol` keeps its data on its remote member (the
/// NVMe bdev of the other node's replica), in bytes.
async fn remote_room(c: &SpdkClient, vol: &str) -> usize {
    let inv = Inventory::load(c).await.expect("inventory");
    inv.raid(&format!("talon-raid-{vol}"))
        .expect("raid")
        .base_bdevs_list
        .iter()
        .find(|b| b.name.as_deref().is_some_and(|n| n.starts_with("talon-remote-")))
        .map(|b| (b.data_offset * 4096) as usize)
        .expect("remote member")
}

/// One spdk_tgt (one talon node): its temp dir, its config, the target, its
/// reaper and a client; its disks attached with new lvstores. Destructured in
/// the test, the bindings drop in reverse order: the reaper kills the target
/// before its dir goes (bind the dir to a name: `_` would drop it at once).
struct Node(tempfile::TempDir, TargetConfig, Target, Reaper, SpdkClient);

async fn node(spdk: &Path, disks: &[&str], what: &str) -> Node {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = target_cfg(dir.path(), spdk);
    let t = Target::start(&cfg).await.expect(what);
    let reap = Reaper::new(&t, &cfg);
    let c = SpdkClient::new(cfg.socket());
    attach_disks(&c, dir.path(), disks, true).await;
    Node(dir, cfg, t, reap, c)
}

/// spdk_tgt again on `cfg` after it stopped or was killed, the disks
/// attached again (their lvstores come back by examine).
async fn restart(
    cfg: &TargetConfig,
    c: &SpdkClient,
    dir: &Path,
    disks: &[&str],
    what: &str,
) -> (Target, Reaper) {
    let t = Target::start(cfg).await.expect(what);
    let reap = Reaper::new(&t, cfg);
    attach_disks(c, dir, disks, false).await;
    (t, reap)
}

/// `kill -9` of spdk_tgt, and its exit reaped.
async fn kill9(t: &mut Target, what: &str) {
    if let Some(pid) = t.pid() {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
            .expect(what);
    }
    let _ = t.wait_exit().await;
}

/// Tells the controller the target restarted (the `restarts`-th time).
fn restarted(state: &State, restarts: u32, what: &str) {
    state
        .update_typed(SPDK_STATUS_ID, "", None, &target_status(restarts))
        .expect(what);
    disk_ready::disks_ready_on(state, &target_status(restarts));
}

/// The disk that replica `k` of `volume` is on.
fn replica_disk(state: &State, volume: &str, k: u32) -> String {
    state
        .get_typed::<talon::resources::engine::ReplicaStatus>(&format!("{volume}-r{k}"))
        .ok()
        .flatten()
        .map(|r| r.spec.disk)
        .expect("replica status")
}

/// Takes snapshot `snap` of volume `vol` through a Snapshot resource and
/// waits until the engine has done with it (Ready or Failed).
async fn snapshot(state: &State, vol: &str, snap: &str) -> SnapshotStatus {
    let id = format!("{vol}@{snap}");
    state
        .create_typed(
            &id,
            "",
            &Snapshot {
                volume: vol.into(),
                name: snap.into(),
            },
        )
        .expect("snapshot");
    eventually(&format!("{id} taken"), WAIT, || async {
        state
            .get_typed::<SnapshotStatus>(&id)
            .ok()
            .flatten()
            .map(|s| s.spec)
            .filter(|s| s.state != ObjectState::Creating)
    })
    .await
}

/// Deletes Volume `id` on one node and waits until it has none left.
async fn delete_volume(state: &State, id: &str, node: &str) {
    state
        .destroy("config", "Volume", id, "")
        .unwrap_or_else(|e| panic!("delete on {node}: {e}"));
    eventually(&format!("{node} clean"), WAIT, || async {
        state.list("config", "Volume").is_empty().then_some(())
    })
    .await;
}

/// Volume `id` over two nodes: B (`rtb`) serves replica 1 to A's engine,
/// A (`rta`, port `pa`) keeps replica 0 and attaches B's (port `pb`, admin
/// API `api`); a raid superblock on both. Returns the export of B's replica,
/// A's engine status and A's Volume.
async fn served_by_b(
    rta: &State,
    rtb: &State,
    id: &str,
    size: u64,
    ports: (u16, u16),
    api: Option<String>,
) -> (String, EngineStatus, Volume) {
    served_by_b_as(rta, rtb, id, size, ports, api, true).await
}

/// [`served_by_b`], with a raid superblock or (`superblock` false: a volume
/// made before the superblock layout) without.
async fn served_by_b_as(
    rta: &State,
    rtb: &State,
    id: &str,
    size: u64,
    (pa, pb): (u16, u16),
    api: Option<String>,
    superblock: bool,
) -> (String, EngineStatus, Volume) {
    let mut served = volume(size, 1);
    served.serve_replica = Some(1);
    served.replica_hosts = vec![node_nqn(pa)];
    served.raid_superblock = superblock;
    rtb.create_typed(id, "", &served).expect("served");
    let replica_nqn = ready(rtb, id).await.exports[0].name.clone();
    let mut engine_vol = volume(size, 1);
    engine_vol.remote_replicas = vec![talon::resources::config::RemoteReplica {
        address: "127.0.0.1".into(),
        port: pb,
        api,
    }];
    engine_vol.raid_superblock = superblock;
    rta.create_typed(id, "", &engine_vol).expect("engine");
    (replica_nqn, ready(rta, id).await, engine_vol)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_volume_life_cycle() {
    let Some(spdk) = spdk_dir("real_spdk_volume_life_cycle") else {
        return;
    };
    let Node(_dir, _, t, _reap, c) = node(&spdk, &["d1", "d2"], "spdk_tgt").await;
    let port = free_port();
    let rt = runtime(&c, &["d1", "d2"], port);
    let state = rt.state.clone();

    state.create_typed("one", "", &volume(64 * MIB, 1)).expect("one");
    state.create_typed("two", "", &volume(64 * MIB, 2)).expect("two");
    let one = ready(&state, "one").await;
    let two = ready(&state, "two").await;
    assert_eq!(two.device, "talon-raid-two");
    for st in [&one, &two] {
        let out = spdk_perf::report(&spdk, port, &st.exports[0].name, "randrw -M 50", 2);
        let iops = spdk_perf::total_iops(&out);
        eprintln!("{}: randrw QD32 {iops:.0} IOPS", st.exports[0].name);
        assert!(iops > 0.0, "{out}");
    }
    // replicas hold data now
    let written = eventually("allocation reported", WAIT, || async {
        state
            .get_typed::<talon::resources::engine::ReplicaStatus>("two-r1")
            .ok()
            .flatten()
            .filter(|r| r.spec.allocated_bytes > 0)
    })
    .await;
    assert!(written.spec.allocated_bytes <= 64 * MIB);

    // snapshot (export frozen around it), expand the raid1, clone
    let snap = snapshot(&state, "two", "s1").await;
    assert_eq!(snap.state, ObjectState::Ready, "{}", snap.message);
    assert_eq!(snap.objects.len(), 2, "{snap:?}");
    state
        .update_typed("two", "", None, &volume(128 * MIB, 2))
        .expect("expand");
    let grown = eventually("two grown", WAIT, || async {
        engine(&state, "two").filter(|e| e.size_bytes == 128 * MIB)
    })
    .await;
    assert_eq!(host_size(&c, port, &grown.exports[0].name).await, 128 * MIB);
    let mut clone = volume(64 * MIB, 2);
    clone.from_snapshot = Some("two@s1".into());
    state.create_typed("copy", "", &clone).expect("clone");
    let copy = ready(&state, "copy").await;
    assert!(
        spdk_perf::total_iops(&spdk_perf::report(
            &spdk,
            port,
            &copy.exports[0].name,
            "randread",
            1
        )) > 0.0
    );

    // snapshot delete is refused while the clone exists, with a clear message
    state
        .destroy("config", "Snapshot", "two@s1", "")
        .expect("destroy");
    let held = eventually("snapshot delete held", WAIT, || async {
        state
            .get_typed::<SnapshotStatus>("two@s1")
            .ok()
            .flatten()
            .filter(|s| s.spec.state == ObjectState::Deleting)
    })
    .await;
    assert!(held.spec.message.contains("cloned"), "{}", held.spec.message);

    for v in ["copy", "two", "one"] {
        state.destroy("config", "Volume", v, "").expect("destroy");
    }
    eventually("all deleted", WAIT, || async {
        (state.list("config", "Volume").is_empty() && state.list("config", "Snapshot").is_empty())
            .then_some(())
    })
    .await;
    assert_eq!(leftovers(&c).await, Vec::<String>::new());
    rt.stop().await;
    t.stop(Duration::from_secs(5)).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_kill9_during_20_creates() {
    let Some(spdk) = spdk_dir("real_spdk_kill9_during_20_creates") else {
        return;
    };
    let Node(dir, cfg, mut t, _reap, c) = node(&spdk, &["d1", "d2"], "spdk_tgt").await;
    let port = free_port();
    let rt = runtime(&c, &["d1", "d2"], port);
    let state = rt.state.clone();
    let names: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let create = |i: usize| {
        state
            .create_typed(&names[i], "", &volume(16 * MIB, 1 + (i % 2) as u32))
            .expect("volume");
    };
    // the first 10 are acknowledged (Ready); kill -9 right after asking for the other 10
    for i in 0..10 {
        create(i);
    }
    for n in &names[..10] {
        ready(&state, n).await;
    }
    for i in 10..20 {
        create(i);
    }
    tokio::time::sleep(Duration::from_millis(15)).await; // let the controller start on them
    let pid = t.pid().expect("pid");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .expect("kill -9");
    let _ = t.wait_exit().await;
    let acked: Vec<&String> = names
        .iter()
        .filter(|n| engine(&state, n).is_some_and(|e| e.state == ObjectState::Ready))
        .collect();
    eprintln!("killed spdk_tgt with {} of 20 acknowledged", acked.len());

    let (t, _reap) = restart(&cfg, &c, dir.path(), &["d1", "d2"], "restart").await;
    let inv = Inventory::load(&c).await.expect("inv");
    eprintln!(
        "after restart: {} lvols came back, {} subsystems, {} raids",
        inv.lvols.len(),
        inv.subsystems.len(),
        inv.raids.len()
    );
    restarted(&state, 1, "restarts");
    // the outcome in SPDK, not the (stale) statuses
    eventually("all 20 exported again", WAIT, || async {
        let inv = Inventory::load(&c).await.ok()?;
        names
            .iter()
            .all(|n| {
                inv.subsystem(&format!("{}:vol:{n}", talon::names::NQN_PREFIX))
                    .is_some_and(|s| s.namespaces.len() == 1 && !s.listen_addresses.is_empty())
            })
            .then_some(())
    })
    .await;
    let inv = Inventory::load(&c).await.expect("inv");
    for (i, n) in names.iter().enumerate() {
        let nqn = format!("{}:vol:{n}", talon::names::NQN_PREFIX);
        let sub = inv
            .subsystem(&nqn)
            .unwrap_or_else(|| panic!("{n} exported again"));
        assert_eq!(sub.namespaces.len(), 1);
        let heads = inv
            .lvols
            .keys()
            .filter(|a| {
                // heads only: a rebuild after the restart may hold its snapshot (`.s.rb.N`)
                // for a moment after the export is back
                a.split('/')
                    .nth(1)
                    .is_some_and(|l| l.starts_with(&format!("{n}-r")) && !l.contains(".s."))
            })
            .count();
        assert_eq!(heads, 1 + i % 2, "{n}: replicas {:?}", inv.lvols.keys());
        if i % 2 == 1 {
            assert!(inv.raid(&format!("talon-raid-{n}")).is_some());
        }
    }
    // nothing half-made: every talon raid and lvol belongs to one of the volumes, once the
    // rebuilds after the restart have dropped their snapshots (`.s.rb.N` on source and dest)
    eventually("the rebuilds' snapshots dropped", WAIT, || async {
        let inv = Inventory::load(&c).await.ok()?;
        (!inv.lvols.keys().any(|a| a.contains(".s.rb."))).then_some(())
    })
    .await;
    let inv = Inventory::load(&c).await.expect("inv");
    assert_eq!(inv.raids.len(), 10);
    assert_eq!(inv.lvols.len(), 30, "{:?}", inv.lvols.keys());
    let bdevs = c.bdev_get_bdevs(&GetBdevs::default()).await.expect("bdevs");
    assert_eq!(bdevs.len(), 2 + 30 + 10);
    rt.stop().await;
    t.stop(Duration::from_secs(5)).await.expect("stop");
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[i % 4] ^ seed)
        .collect()
}

/// Waits until the ledger of `id` says exactly `want` are up to date.
async fn ledger_becomes(state: &State, id: &str, want: &[u32], what: &str) {
    eventually(what, WAIT, || async {
        (ledger(state, id).as_deref() == Some(want)).then_some(())
    })
    .await;
}

fn ledger(state: &State, id: &str) -> Option<Vec<u32>> {
    state
        .get_typed::<talon::resources::engine::ReplicaLedger>(id)
        .ok()
        .flatten()
        .map(|l| l.spec.in_sync)
}

/// A replica that misses writes (its disk went away) is rebuilt from the one
/// that did not when it comes back; after a restart of spdk_tgt the ledger
/// keeps the stale copy from being served alone. Data is checked end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_replica_that_missed_writes_is_rebuilt() {
    let test = "real_spdk_replica_that_missed_writes_is_rebuilt";
    let Some(spdk) = spdk_dir_with(test, &["spdk_dd"]) else {
        return;
    };
    const LEN: usize = 8 << 20;
    let Node(dir, cfg, t, _reap, c) = node(&spdk, &["d1", "d2"], "spdk_tgt").await;
    let port = free_port();
    let rt = runtime(&c, &["d1", "d2"], port);
    let state = rt.state.clone();
    state.create_typed("m", "", &volume(32 * MIB, 2)).expect("m");
    let nqn = ready(&state, "m").await.exports[0].name.clone();
    let (d0, d1) = (replica_disk(&state, "m", 0), replica_disk(&state, "m", 1));
    assert_ne!(d0, d1, "replicas on distinct disks");
    assert_eq!(ledger(&state, "m"), Some(vec![0, 1]));

    let a = pattern(0xa5, LEN);
    dd(&spdk, dir.path(), port, &nqn, Some(&a), LEN);
    // r1's disk goes away; the volume keeps serving and takes new writes
    c.bdev_aio_delete(&ByName::new(format!("talon-disk-{d1}")))
        .await
        .expect("pull r1's disk");
    ledger_becomes(&state, "m", &[0], "r1 out of the ledger").await;
    assert_eq!(engine(&state, "m").map(|e| e.state), Some(ObjectState::Degraded));
    let away = state
        .get_typed::<talon::resources::engine::ReplicaStatus>("m-r1")
        .ok()
        .flatten()
        .expect("the away replica is still reported");
    assert_eq!(
        (away.spec.state, away.spec.disk.as_str()),
        (ObjectState::Stale, d1.as_str())
    );
    let b = pattern(0x3c, LEN);
    dd(&spdk, dir.path(), port, &nqn, Some(&b), LEN);

    // r1 comes back behind; it is rebuilt, then it alone must hold b
    attach_disks(&c, dir.path(), &[&d1], false).await;
    ledger_becomes(&state, "m", &[0, 1], "r1 rebuilt").await;
    ready(&state, "m").await;
    c.bdev_aio_delete(&ByName::new(format!("talon-disk-{d0}")))
        .await
        .expect("pull r0's disk");
    assert!(
        dd(&spdk, dir.path(), port, &nqn, None, LEN) == b,
        "r1 serves what r0 had"
    );
    ledger_becomes(&state, "m", &[1], "r0 out of the ledger").await;

    // spdk_tgt restarts with only the stale r0 present: not served
    t.stop(Duration::from_secs(5)).await.expect("stop");
    let (t, _reap) = restart(&cfg, &c, dir.path(), &[&d0], "restart").await;
    restarted(&state, 1, "restarts");
    let held = eventually("m held back", WAIT, || async {
        engine(&state, "m").filter(|e| e.state == ObjectState::Failed)
    })
    .await;
    assert!(held.message.contains("no up-to-date replica"), "{}", held.message);
    let inv = Inventory::load(&c).await.expect("inv");
    // (a reconcile may be between making the subsystem and undoing it: no
    // namespace, no listener — nothing a host can reach)
    assert!(
        inv.subsystem(&nqn)
            .is_none_or(|s| s.namespaces.is_empty() && s.listen_addresses.is_empty()),
        "a stale replica alone is not exported"
    );
    assert!(inv.raids.is_empty() && !inv.bdevs.keys().any(|b| b.starts_with("talon-null-")));

    // the up-to-date r1 returns: served again, r0 rebuilt from it
    attach_disks(&c, dir.path(), &[&d1], false).await;
    ledger_becomes(&state, "m", &[0, 1], "both up to date").await;
    ready(&state, "m").await;
    c.bdev_aio_delete(&ByName::new(format!("talon-disk-{d1}")))
        .await
        .expect("pull r1's disk");
    assert!(
        dd(&spdk, dir.path(), port, &nqn, None, LEN) == b,
        "rebuilt r0 serves b"
    );

    rt.stop().await;
    t.stop(Duration::from_secs(5)).await.expect("stop");
}

/// Two spdk_tgt processes as two talon nodes: B keeps replica 1 of `rv` and
/// exports it; A's engine has replica 0 locally and attaches B's over
/// NVMe/TCP into its raid1. Data written to A's export is read back from B's
/// replica export directly: the remote copy holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_remote_replica_on_another_target() {
    let test = "real_spdk_remote_replica_on_another_target";
    let Some(spdk) = spdk_dir_with(test, &["spdk_dd"]) else {
        return;
    };
    const LEN: usize = 4 << 20;
    let Node(da, cfg_a, ta, _reap_a, ca) = node(&spdk, &["da"], "spdk_tgt A").await;
    let Node(db, cfg_b, tb, _reap_b, cb) = node(&spdk, &["db"], "spdk_tgt B").await;
    let (pa, pb) = (free_port(), free_port());
    let (rta, rtb) = (runtime(&ca, &["da"], pa), runtime(&cb, &["db"], pb));

    let (replica_nqn, st, _) = served_by_b(&rta.state, &rtb.state, "rv", 32 * MIB, (pa, pb), None).await;
    assert_eq!(st.device, "talon-raid-rv");
    assert_eq!(ledger(&rta.state, "rv"), Some(vec![0, 1]));
    let inv = Inventory::load(&ca).await.expect("inventory");
    let raid = inv.raid("talon-raid-rv").expect("raid");
    assert!(raid.superblock, "{raid:?}");
    // where the raid's data starts on B's replica (its NVMe bdev here)
    let remote_room = remote_room(&ca, "rv").await;

    let data = pattern(0x5a, LEN);
    dd(&spdk, da.path(), pa, &st.exports[0].name, Some(&data), LEN);
    let read_b = || dd(&spdk, db.path(), pb, &replica_nqn, None, remote_room + LEN)[remote_room..].to_vec();
    assert!(read_b() == data, "B's replica holds what was written through A");
    let out = spdk_perf::report(&spdk, pa, &st.exports[0].name, "randrw -M 50", 1);
    assert!(spdk_perf::total_iops(&out) > 0.0, "{out}");

    // access control: the volume's export and the replica's refuse a host they do not name
    let stranger = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000dead";
    for (dir, port, nqn) in [
        (da.path(), pa, st.exports[0].name.as_str()),
        (db.path(), pb, replica_nqn.as_str()),
    ] {
        let out = dd_as(&spdk, dir, port, nqn, None, LEN, stranger);
        assert!(!out.status.success(), "a stranger read {nqn}");
        // spdk_nvme_perf may exit 0 without a controller: no I/O is the proof
        let out = spdk_perf::run_as(&spdk, port, nqn, "randread", 1, stranger);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            spdk_perf::total_iops(&text),
            0.0,
            "a stranger ran I/O on {nqn}: {text}"
        );
    }
    // the replica export names exactly A's engine and the node's allowed host
    let subs = cb
        .nvmf_get_subsystems(&Default::default())
        .await
        .expect("subsystems");
    let sub = subs
        .iter()
        .find(|s| s.nqn == replica_nqn)
        .expect("replica subsystem");
    assert!(!sub.allow_any_host, "{sub:?}");
    let mut hosts: Vec<&str> = sub.hosts.iter().map(|h| h.nqn.as_str()).collect();
    hosts.sort_unstable();
    let a_nqn = node_nqn(pa);
    let mut want = [a_nqn.as_str(), spdk_perf::HOST_NQN];
    want.sort_unstable();
    assert_eq!(hosts, want);

    // B's target dies and comes back: its examine finds A's raid superblock
    // in the replica and makes a `configuring` raid of it there; talon
    // releases the replica and exports it again, A takes it back by a rebuild
    let mut tb = tb;
    kill9(&mut tb, "kill -9 B").await;
    // a write fails on B's side: the raid drops it and goes on with A's
    let more = pattern(0x77, LEN);
    dd(&spdk, da.path(), pa, &st.exports[0].name, Some(&more), LEN);
    ledger_becomes(&rta.state, "rv", &[0], "B's replica out of A's ledger").await;
    let (tb, _reap_b) = restart(&cfg_b, &cb, db.path(), &["db"], "restart B").await;
    restarted(&rtb.state, 1, "B restarts");
    ready(&rtb.state, "rv").await;
    ledger_becomes(&rta.state, "rv", &[0, 1], "B's replica rebuilt").await;
    assert!(read_b() == more, "B's replica was rebuilt with what it missed");

    // A's target dies and comes back: its raid waits for B's replica (the
    // superblock names it) until talon attaches it, then serves both
    let mut ta = ta;
    kill9(&mut ta, "kill -9 A").await;
    let (ta, _reap_a) = restart(&cfg_a, &ca, da.path(), &["da"], "restart A").await;
    restarted(&rta.state, 1, "A restarts");
    // the status may still be the one from before the kill: wait for the
    // new target to hold the raid over both and the export again
    let export_nqn = st.exports[0].name.clone();
    eventually("A's raid over both members, exported", WAIT, || async {
        let inv = Inventory::load(&ca).await.ok()?;
        let raid = inv.raid("talon-raid-rv")?;
        // the export's last step admits the hosts
        let admitted = inv.subsystem(&export_nqn).is_some_and(|s| {
            !s.listen_addresses.is_empty() && s.hosts.iter().any(|h| h.nqn == spdk_perf::HOST_NQN)
        });
        (raid.state == "online" && raid.num_base_bdevs_discovered == 2 && admitted).then_some(())
    })
    .await;
    let st = ready(&rta.state, "rv").await;
    assert_eq!(ledger(&rta.state, "rv"), Some(vec![0, 1]));
    assert!(
        dd(&spdk, da.path(), pa, &st.exports[0].name, None, LEN) == more,
        "A serves what was written before its target died"
    );

    delete_volume(&rta.state, "rv", "A").await;
    assert_eq!(leftovers(&ca).await, Vec::<String>::new());
    delete_volume(&rtb.state, "rv", "B").await;
    assert_eq!(leftovers(&cb).await, Vec::<String>::new());
    rta.stop().await;
    rtb.stop().await;
    ta.stop(Duration::from_secs(5)).await.expect("stop A");
    tb.stop(Duration::from_secs(5)).await.expect("stop B");
}

/// The writes bdev `bdev` has completed (`bdev_get_iostat`).
async fn completed_writes(c: &SpdkClient, bdev: &str) -> u64 {
    let v: serde_json::Value = c
        .typed("bdev_get_iostat", &json!({"names": [bdev]}))
        .await
        .expect("iostat");
    v["bdevs"][0]["num_write_ops"].as_u64().expect("num_write_ops")
}

/// Issue 12: 24 snapshots of a 2-replica volume taken while spdk_nvme_perf
/// writes to it sequentially at QD32 (each write fills its 4 KiB block with
/// the pattern of its queue slot, so a block's content moves with every pass;
/// sequential, because SPDK's raid1 does not order concurrent writes to the
/// same block, which may then land in different orders on the members: see
/// docs/replicas.md); every
/// snapshot's two replica lvols are read back separately and compared block
/// by block; consecutive snapshots must differ somewhere (the writer moved
/// the data between two instants, so the check could see a difference). No
/// write reaches the raid while the export is frozen by hand. Then a revert
/// to one snapshot, read twice through the raid1 of both members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_snapshots_under_writes_are_one_point_in_time() {
    let test = "real_spdk_snapshots_under_writes_are_one_point_in_time";
    let Some(spdk) = spdk_dir_with(test, &["spdk_dd", "spdk_nvme_perf"]) else {
        return;
    };
    use std::collections::BTreeSet;
    use talon::names::{Nqn, ObjectName};
    use talon::spdk::volume::{ExportSpec, VolumeOps, VolumePlan, naming};
    const LEN: usize = 16 << 20;
    const SNAPSHOTS: usize = 24; // 50 cost CI 5 min of reads (each snapshot lvol read by its own spdk_dd)
    let Node(dir, _, t, _reap, c) = node(&spdk, &["d1", "d2"], "spdk_tgt").await;
    let (port, read_port) = (free_port(), free_port());
    let ops = VolumeOps::new(c.clone());
    let v = ObjectName::parse("volume", "pit").expect("name");
    let plan = VolumePlan::new(
        v.clone(),
        LEN as u64,
        2,
        ExportSpec {
            address: [127, 0, 0, 1].into(),
            port,
            hosts: vec![spdk_perf::HOST_NQN.to_string()],
            dhchap_data_dir: None,
            tls_data_dir: None,
        },
    );
    let inv = Inventory::load(&c).await.expect("inventory");
    let info = ops.ensure(&inv, &plan).await.expect("volume");
    assert_eq!(info.in_sync, BTreeSet::from([0, 1]));
    let nqn = Nqn::for_volume(&v).as_str().to_owned();
    // the raid's data starts after its superblock's room on each member
    let inv = Inventory::load(&c).await.expect("inventory");
    let raid = inv.raid("talon-raid-pit").expect("raid");
    assert!(raid.superblock, "a new 2-replica volume has a superblock");
    let room = (raid.base_bdevs_list[0].data_offset * 4096) as usize;
    assert!(
        raid.base_bdevs_list
            .iter()
            .all(|b| b.data_offset * 4096 == room as u64),
        "{raid:?}"
    );

    // QD 31: the volume's 4,096 blocks are not a multiple of it, so every
    // pass writes each block from another queue slot (another pattern); at
    // QD 32 the data moved only when completions came out of order, never
    // on a starved machine (0 of 23 snapshots in a rehearsal); 45 s at
    // most: stopped once the snapshots are taken (~10 s)
    let idle = completed_writes(&c, "talon-raid-pit").await;
    let writer = spdk_perf::Writer::start(&spdk, port, &nqn, "write -q 31", 45);
    // perf connects (seconds on a loaded machine): its first writes reach the raid
    let connected = std::time::Instant::now();
    while completed_writes(&c, "talon-raid-pit").await == idle
        && connected.elapsed() < Duration::from_secs(30)
        && !writer.is_finished()
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // frozen as a snapshot freezes it: not one write completes in the raid meanwhile
    {
        use talon::spdk::volume::freeze;
        let writes = || completed_writes(&c, "talon-raid-pit");
        let before = writes().await;
        let sub = c.subsystem(&nqn).await.expect("subsystems").expect("export");
        let freezes = freeze::Freezes::default();
        let frozen = freezes.freeze(&c, &sub).await.expect("freeze");
        let (a, _) = (
            writes().await,
            tokio::time::sleep(Duration::from_millis(300)).await,
        );
        let b = writes().await;
        freezes.thaw(&c, &frozen).await.expect("thaw");
        assert!(a > before, "the writer was writing");
        assert_eq!(a, b, "writes reached the raid while the export was frozen");
    }
    let mut names = Vec::new();
    let mut still_writing = true;
    for i in 0..SNAPSHOTS {
        still_writing &= !writer.is_finished();
        let inv = Inventory::load(&c).await.expect("inventory");
        let s = ObjectName::parse("snapshot", &format!("s{i}")).expect("snap");
        let taken = ops.snapshot(&inv, &v, &s, None, vec![]).await.expect("snapshot");
        assert_eq!(taken.point_in_time, BTreeSet::from([0, 1]), "snapshot {i}");
        names.push(s);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let out = writer.stop();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    let iops = spdk_perf::total_iops(&report);
    assert!(still_writing, "the writer ran through all {SNAPSHOTS} snapshots");
    assert!(iops > 0.0, "writes went on: {report}");
    let stalled = String::from_utf8_lossy(&out.stderr)
        .matches("sct=3, sc=2")
        .count();
    eprintln!(
        "{test}: writer {iops:.0} IOPS; perf logged {stalled} ANA-inaccessible completions (rate-limited log)"
    );

    let inv = Inventory::load(&c).await.expect("inventory");
    let mut s0_data = None;
    let (mut previous, mut moved) = (None::<Vec<u8>>, 0);
    for (i, s) in names.iter().enumerate() {
        let lvol = |k: usize| {
            inv.find_lvol(&naming::snapshot_lvol("pit", k, s.as_str()))
                .unwrap_or_else(|| panic!("snapshot {s} of r{k}"))
                .uuid
                .clone()
        };
        // whole snapshot lvols: the superblock's room, then the volume's data
        let a = read_bdev(&c, &spdk, dir.path(), read_port, &lvol(0), room + LEN).await;
        let b = read_bdev(&c, &spdk, dir.path(), read_port, &lvol(1), room + LEN).await;
        if let Some(block) = a.chunks(4096).zip(b.chunks(4096)).position(|(x, y)| x != y) {
            panic!("snapshot {s} ({i}): r0 and r1 differ first at block {block}");
        }
        if previous.as_ref().is_some_and(|p| *p != a) {
            moved += 1;
        }
        if i == SNAPSHOTS / 2 {
            s0_data = Some(a[room..].to_vec());
        }
        previous = Some(a);
    }
    eprintln!(
        "{test}: {SNAPSHOTS} snapshots, both replicas identical block by block in every one; \
         the data moved between {moved} of {} consecutive snapshots",
        SNAPSHOTS - 1
    );
    // the check can see two instants: the writer changed the data between snapshots
    assert!(
        moved > 0,
        "the writer never changed the data between two snapshots"
    );

    // revert to the middle snapshot: both members from the recorded set, read twice
    let mid = &names[SNAPSHOTS / 2];
    let inv = Inventory::load(&c).await.expect("inventory");
    let set = ops
        .revert(
            &inv,
            &v,
            mid,
            1,
            Some(&BTreeSet::from([0, 1])),
            plan.uses_superblock().then_some(plan.replicas),
        )
        .await
        .expect("revert");
    assert_eq!(set, BTreeSet::from([0, 1]));
    let inv = Inventory::load(&c).await.expect("inventory");
    let mut p = plan.clone();
    p.in_sync = Some(set);
    let info = ops.ensure(&inv, &p).await.expect("export again");
    assert_eq!(info.in_sync, BTreeSet::from([0, 1]));
    let want = s0_data.expect("middle snapshot data");
    for round in 0..2 {
        let got = tokio::task::spawn_blocking({
            let (spdk, dir, nqn) = (spdk.clone(), dir.path().to_path_buf(), nqn.clone());
            move || dd(&spdk, &dir, port, &nqn, None, LEN)
        })
        .await
        .expect("dd");
        assert!(
            got == want,
            "read {round} after the revert differs from the snapshot"
        );
    }
    t.stop(Duration::from_secs(5)).await.expect("stop");
}

/// The freeze that makes a snapshot one instant must wait for the writes
/// already in flight, not only stop new ones. On a real spdk_tgt, an export
/// of a `bdev_delay` (every write takes 1 s) under spdk_nvme_perf at QD8:
/// setting the listener ANA inaccessible (SPDK pauses no namespace for it)
/// returns while writes are in flight, and they complete after it; talon's
/// freeze returns only when none is, and none completes after it. A second
/// freeze right after the thaw finds the writer back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_freeze_waits_for_the_writes_in_flight() {
    let test = "real_spdk_a_freeze_waits_for_the_writes_in_flight";
    let Some(spdk) = spdk_dir_with(test, &["spdk_nvme_perf"]) else {
        return;
    };
    use talon::spdk::rpc::{
        AddNamespace, AnaState, CreateSubsystem, CreateTransport, ListenAddress, ListenerAnaState,
        NamespaceParams, SubsystemListener,
    };
    use talon::spdk::volume::freeze;
    let Node(_dir, _, t, _reap, c) = node(&spdk, &[], "spdk_tgt").await;
    let port = free_port();
    let nqn = "nqn.2025-01.io.talon.test:freeze";
    let _: serde_json::Value = c
        .typed(
            "bdev_malloc_create",
            &json!({"name": "m0", "num_blocks": 4096, "block_size": 4096}),
        )
        .await
        .expect("malloc");
    // latencies in microseconds: every write takes 1 s, reads 100 us
    let _: serde_json::Value = c
        .typed(
            "bdev_delay_create",
            &json!({"base_bdev_name": "m0", "name": "slow", "avg_read_latency": 100, "p99_read_latency": 100,
                "avg_write_latency": 1_000_000, "p99_write_latency": 1_000_000}),
        )
        .await
        .expect("delay bdev");
    let _ = c.nvmf_create_transport(&CreateTransport::tcp()).await;
    c.nvmf_create_subsystem(&CreateSubsystem {
        nqn: nqn.into(),
        allow_any_host: Some(true),
        serial_number: None,
        model_number: None,
        max_namespaces: Some(1),
        ana_reporting: Some(true),
        min_cntlid: None,
        max_cntlid: None,
    })
    .await
    .expect("subsystem");
    c.nvmf_subsystem_add_ns(&AddNamespace {
        nqn: nqn.into(),
        namespace: NamespaceParams {
            bdev_name: "slow".into(),
            nsid: None,
            nguid: None,
            uuid: None,
        },
    })
    .await
    .expect("namespace");
    let listener = ListenAddress::tcp([127, 0, 0, 1].into(), port);
    c.nvmf_subsystem_add_listener(&SubsystemListener {
        nqn: nqn.into(),
        listen_address: listener.clone(),
    })
    .await
    .expect("listener");
    let writer = {
        let spdk = spdk.clone();
        std::thread::spawn(move || spdk_perf::run(&spdk, port, nqn, "write -q 8", 25))
    };
    let writes = || completed_writes(&c, "slow");
    // until the count grows from one look to the next: writes are flowing
    let flowing = || async {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut seen = writes().await;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = writes().await;
            if now > seen && seen > 0 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the writer never wrote: {now} writes"
            );
            seen = now;
        }
    };
    // the writer is writing: 8 writes in flight all the time
    flowing().await;
    let set = |ana_state| ListenerAnaState {
        nqn: nqn.into(),
        listen_address: listener.clone(),
        ana_state,
    };
    // the ANA state alone: writes in flight complete after it returned
    c.nvmf_subsystem_listener_set_ana_state(&set(AnaState::Inaccessible))
        .await
        .expect("inaccessible");
    let at_return = writes().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let later = writes().await;
    c.nvmf_subsystem_listener_set_ana_state(&set(AnaState::Optimized))
        .await
        .expect("optimized");
    assert!(
        later > at_return,
        "SPDK drained the namespace for an ANA state change ({at_return} writes at its return, {later} later): \
         the freeze's second step would not be needed"
    );
    eprintln!(
        "{test}: ANA state alone: {} writes completed after it returned",
        later - at_return
    );
    for round in 0..2 {
        flowing().await;
        let sub = c.subsystem(nqn).await.expect("subsystems").expect("subsystem");
        let started = std::time::Instant::now();
        let freezes = freeze::Freezes::default();
        let frozen = freezes.freeze(&c, &sub).await.expect("freeze");
        let took = started.elapsed();
        let at_return = writes().await;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let later = writes().await;
        freezes.thaw(&c, &frozen).await.expect("thaw");
        assert_eq!(
            at_return, later,
            "round {round}: writes completed after the freeze returned"
        );
        eprintln!("{test}: round {round}: the freeze returned after {took:?}; no write completed after it");
    }
    let out = writer.join().expect("perf");
    assert!(
        spdk_perf::total_iops(&String::from_utf8_lossy(&out.stdout)) > 0.0,
        "the writer wrote"
    );
    t.stop(Duration::from_secs(5)).await.expect("stop");
}

/// Issue 12 with a remote replica, on two real spdk_tgt (two nodes): a
/// 2-replica volume, r0 on A, r1 served by B; spdk_nvme_perf writes through
/// A's export all along while A takes 20 snapshots through its controller
/// (Snapshot resources). Each takes r1's snapshot on B through B's admin
/// API inside A's freeze. Afterwards every snapshot is read on each node
/// separately (A's snapshot lvol on A, B's on B): identical block by block,
/// and the data moved between snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_snapshots_with_a_remote_replica_are_one_point_in_time() {
    let test = "real_spdk_snapshots_with_a_remote_replica_are_one_point_in_time";
    let Some(spdk) = spdk_dir_with(test, &["spdk_dd", "spdk_nvme_perf"]) else {
        return;
    };
    use talon::spdk::volume::naming;
    const LEN: usize = 16 << 20;
    const SNAPSHOTS: usize = 20;
    let Node(da, _, ta, _reap_a, ca) = node(&spdk, &["da"], "spdk_tgt A").await;
    let Node(db, _, tb, _reap_b, cb) = node(&spdk, &["db"], "spdk_tgt B").await;
    let (pa, pb, read_a, read_b) = (free_port(), free_port(), free_port(), free_port());
    let (rta, rtb) = (runtime(&ca, &["da"], pa), runtime(&cb, &["db"], pb));
    let (api_b, _server_b) = peer_api::serve(&rtb.state, rtb.statuses(), "127.0.0.1:0").await;

    let api = Some(api_b.to_string());
    let (_, st, _) = served_by_b(&rta.state, &rtb.state, "pr", LEN as u64, (pa, pb), api).await;
    ledger_becomes(&rta.state, "pr", &[0, 1], "both replicas up to date").await;
    let nqn = st.exports[0].name.clone();
    let inv = Inventory::load(&ca).await.expect("inventory");
    let raid = inv.raid("talon-raid-pr").expect("raid");
    let room_of = |remote: bool| {
        raid.base_bdevs_list
            .iter()
            .find(|b| {
                b.name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("talon-remote-") == remote)
            })
            .map(|b| (b.data_offset * 4096) as usize)
            .expect("member")
    };
    let (room_a, room_b) = (room_of(false), room_of(true));

    // QD 31: the volume's blocks are not a multiple of it, so every pass
    // writes each block from another queue slot (another pattern); 60 s at
    // most: stopped once the snapshots are taken (~20 s)
    let writer = spdk_perf::Writer::start(&spdk, pa, &nqn, "write -q 31", 60);
    tokio::time::sleep(Duration::from_secs(3)).await; // perf connects
    let mut still_writing = true;
    for i in 0..SNAPSHOTS {
        still_writing &= !writer.is_finished();
        let id = format!("pr@s{i}");
        let st = snapshot(&rta.state, "pr", &format!("s{i}")).await;
        assert_eq!(st.state, ObjectState::Ready, "{id}: {}", st.message);
        let set = rta
            .state
            .get_typed::<talon::resources::engine::ReplicaLedger>("pr")
            .expect("get")
            .expect("ledger")
            .spec
            .snapshots
            .get(&format!("s{i}"))
            .cloned();
        assert_eq!(set, Some(vec![0, 1]), "{id}: both replicas at one instant");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = writer.stop();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    let iops = spdk_perf::total_iops(&report);
    assert!(still_writing, "the writer ran through all {SNAPSHOTS} snapshots");
    assert!(iops > 0.0, "writes went on: {report}");

    let (inv_a, inv_b) = (
        Inventory::load(&ca).await.expect("inventory A"),
        Inventory::load(&cb).await.expect("inventory B"),
    );
    let (mut previous, mut moved) = (None::<Vec<u8>>, 0);
    for i in 0..SNAPSHOTS {
        let s = format!("s{i}");
        let uuid = |inv: &Inventory, k: usize| {
            inv.find_lvol(&naming::snapshot_lvol("pr", k, &s))
                .unwrap_or_else(|| panic!("snapshot {s} of r{k}"))
                .uuid
                .clone()
        };
        let a = read_bdev(&ca, &spdk, da.path(), read_a, &uuid(&inv_a, 0), room_a + LEN).await;
        let b = read_bdev(&cb, &spdk, db.path(), read_b, &uuid(&inv_b, 1), room_b + LEN).await;
        let (a, b) = (&a[room_a..], &b[room_b..]);
        if let Some(block) = a.chunks(4096).zip(b.chunks(4096)).position(|(x, y)| x != y) {
            panic!("snapshot {s}: A's r0 and B's r1 differ first at block {block}");
        }
        if previous.as_deref().is_some_and(|p| p != a) {
            moved += 1;
        }
        previous = Some(a.to_vec());
    }
    eprintln!(
        "{test}: writer {iops:.0} IOPS; {SNAPSHOTS} snapshots, A's and B's replicas identical in every one; \
         the data moved between {moved} of {} consecutive snapshots",
        SNAPSHOTS - 1
    );
    assert!(
        moved > 0,
        "the writer never changed the data between two snapshots"
    );

    for i in 0..SNAPSHOTS {
        let id = format!("pr@s{i}");
        rta.state
            .destroy("config", "Snapshot", &id, "")
            .expect("delete snapshot");
    }
    eventually("A's snapshots gone, and B's", WAIT, || async {
        (rta.state.list("config", "Snapshot").is_empty() && rtb.state.list("config", "Snapshot").is_empty())
            .then_some(())
    })
    .await;
    delete_volume(&rta.state, "pr", "A").await;
    delete_volume(&rtb.state, "pr", "B").await;
    assert_eq!(leftovers(&ca).await, Vec::<String>::new());
    assert_eq!(leftovers(&cb).await, Vec::<String>::new());
    rta.stop().await;
    rtb.stop().await;
    ta.stop(Duration::from_secs(5)).await.expect("stop A");
    tb.stop(Duration::from_secs(5)).await.expect("stop B");
}

/// Issue 17 for talon's own volumes: a volume with a replica on another
/// node grows there too. A's Volume is expanded; A asks B (its admin API) to
/// grow the replica it serves; B's served lvol grows, its NVMe namespace
/// grows on A, and SPDK's raid1 grows to the new size: the export serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_remote_replica_grows_with_its_volume() {
    let test = "real_spdk_a_remote_replica_grows_with_its_volume";
    let Some(spdk) = spdk_dir(test) else {
        return;
    };
    let Node(_da, _, ta, _reap_a, ca) = node(&spdk, &["da"], "spdk_tgt A").await;
    let Node(_db, _, tb, _reap_b, cb) = node(&spdk, &["db"], "spdk_tgt B").await;
    let (pa, pb) = (free_port(), free_port());
    let (rta, rtb) = (runtime(&ca, &["da"], pa), runtime(&cb, &["db"], pb));
    let (api_b, _server_b) = peer_api::serve(&rtb.state, rtb.statuses(), "127.0.0.1:0").await;
    let api = Some(api_b.to_string());
    let (_, st, engine_vol) = served_by_b(&rta.state, &rtb.state, "gr", 16 * MIB, (pa, pb), api).await;
    assert_eq!(st.size_bytes, 16 * MIB);
    ledger_becomes(&rta.state, "gr", &[0, 1], "both replicas up to date").await;

    let mut bigger = engine_vol.clone();
    bigger.size_bytes = 48 * MIB;
    rta.state
        .update_typed("gr", "", None, &bigger)
        .expect("expand on A");
    eventually("B's Volume grown by A", WAIT, || async {
        let v = rtb.state.get_typed::<Volume>("gr").ok().flatten()?;
        (v.spec.size_bytes == 48 * MIB).then_some(())
    })
    .await;
    eventually("A's raid1 at the new size", WAIT, || async {
        let inv = Inventory::load(&ca).await.ok()?;
        let raid = inv.bdevs.get("talon-raid-gr")?;
        (raid.num_blocks * u64::from(raid.block_size) == 48 * MIB).then_some(())
    })
    .await;
    let st = eventually("A's engine serves 48 MiB", WAIT, || async {
        engine(&rta.state, "gr").filter(|e| e.size_bytes == 48 * MIB && e.state == ObjectState::Ready)
    })
    .await;
    assert_eq!(
        host_size(&ca, pa, &st.exports[0].name).await,
        48 * MIB,
        "the host sees the new size"
    );
    assert_eq!(
        ledger(&rta.state, "gr"),
        Some(vec![0, 1]),
        "no replica dropped by the growth"
    );

    delete_volume(&rta.state, "gr", "A").await;
    delete_volume(&rtb.state, "gr", "B").await;
    rta.stop().await;
    rtb.stop().await;
    ta.stop(Duration::from_secs(5)).await.expect("stop A");
    tb.stop(Duration::from_secs(5)).await.expect("stop B");
}

/// Issue 12: the window between a replica leaving the raid and talon
/// recording it is closed by the raid superblock, on a real spdk_tgt. 10
/// rounds of the worst order of events: talon stops (its ledger keeps saying
/// both replicas are up to date), r1's disk is pulled, a new pattern is
/// written through the export (acknowledged by r0 alone), and spdk_tgt is
/// killed -9 0 to 450 ms later (50 ms more each round; without the
/// superblock the first round already fails). spdk_tgt and talon then start again, the two
/// disks attached one at a time in alternating order (the stale one first
/// every other round). Every round, the first read after recovery returns
/// the pattern written last (a trusted r1 would answer part of it with the
/// one before), r1 is rebuilt from r0, and then r1 alone serves it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_replica_that_left_just_before_a_crash_is_never_trusted() {
    let test = "real_spdk_replica_that_left_just_before_a_crash_is_never_trusted";
    let Some(spdk) = spdk_dir_with(test, &["spdk_dd"]) else {
        return;
    };
    const ROUNDS: u8 = 10;
    // how much later than the last one each round's kill comes
    const STEP_MS: u64 = 50;
    const LEN: usize = 4 << 20;
    let Node(dir, cfg, mut t, mut _reap, c) = node(&spdk, &["d1", "d2"], "spdk_tgt").await;
    let port = free_port();
    let rt = runtime(&c, &["d1", "d2"], port);
    let state = rt.state.clone();
    let vol: Volume = serde_json::from_value(
        json!({"sizeBytes": 16 * MIB, "replicas": 2, "engine": "v2", "raidSuperblock": true}),
    )
    .expect("volume");
    state.create_typed("w", "", &vol).expect("w");
    let nqn = ready(&state, "w").await.exports[0].name.clone();
    let inv = Inventory::load(&c).await.expect("inventory");
    let raid = inv.raid("talon-raid-w").expect("raid");
    assert!(raid.superblock, "{raid:?}");
    let (d0, d1) = (replica_disk(&state, "w", 0), replica_disk(&state, "w", 1));
    let read = |what: &'static str| {
        let (spdk, dir, nqn) = (spdk.clone(), dir.path().to_path_buf(), nqn.clone());
        async move {
            tokio::task::spawn_blocking(move || dd(&spdk, &dir, port, &nqn, None, LEN))
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"))
        }
    };
    // a rebuild's switch closes the export for a moment (a host reconnects,
    // spdk_dd does not): a write that could not connect is made again
    let write = |data: Vec<u8>| {
        let (spdk, dir, nqn) = (spdk.clone(), dir.path().to_path_buf(), nqn.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                dd_retried(&spdk, &dir, port, &nqn, Some(&data), LEN, "write");
            })
            .await
            .expect("write");
        }
    };
    let register = |c: SpdkClient| {
        move |rt: &mut talon::runtime::Runtime| {
            rt.register(SpdkVolumeController::new(c, false).with_host_nqn(Some(node_nqn(port))))
        }
    };
    let mut rt = Some(rt);
    for round in 0..ROUNDS {
        let before = pattern(round.wrapping_mul(2), LEN);
        write(before.clone()).await;
        ledger_becomes(&state, "w", &[0, 1], "both up to date").await;
        ready(&state, "w").await;

        // talon stops; r1's disk goes; a write r0 alone acknowledges
        if let Some(r) = rt.take() {
            r.stop().await;
        }
        c.bdev_aio_delete(&ByName::new(format!("talon-disk-{d1}")))
            .await
            .expect("pull r1's disk");
        let after = pattern(round.wrapping_mul(2).wrapping_add(1), LEN);
        write(after.clone()).await;
        tokio::time::sleep(Duration::from_millis(STEP_MS * u64::from(round))).await;
        kill9(&mut t, "kill -9 spdk_tgt").await;
        assert_eq!(
            ledger(&state, "w"),
            Some(vec![0, 1]),
            "round {round}: the ledger never heard r1 leave"
        );

        // both come back, one disk at a time
        t = Target::start(&cfg).await.expect("restart spdk_tgt");
        _reap = Reaper::new(&t, &cfg);
        let order = if round % 2 == 0 { [&d1, &d0] } else { [&d0, &d1] };
        for d in order {
            attach_disks(&c, dir.path(), &[d.as_str()], false).await;
        }
        rt = Some(TestRuntime::start_on(state.clone(), register(c.clone())).expect("runtime"));
        restarted(&state, u32::from(round) + 1, "restarts");
        eventually("w exported again", WAIT, || async {
            engine(&state, "w").filter(|e| {
                matches!(e.state, ObjectState::Ready | ObjectState::Degraded) && !e.exports.is_empty()
            })
        })
        .await;
        // r1's thin rebuild may switch the raid meanwhile, closing the export
        // for a moment: a host reconnects, spdk_dd does not, so a read that
        // could not finish is tried again (what it reads is the point)
        let first = {
            let (spdk, d, nqn) = (spdk.clone(), dir.path().to_path_buf(), nqn.clone());
            tokio::task::spawn_blocking(move || dd_retried(&spdk, &d, port, &nqn, None, LEN, "first read"))
                .await
                .expect("first read")
        };
        assert!(
            first == after,
            "round {round}: the first read after recovery is not what was written last: {} bytes, first difference at {:?}, equal to the one before: {}",
            first.len(),
            first.iter().zip(&after).position(|(a, b)| a != b),
            first == before
        );
        ledger_becomes(&state, "w", &[0, 1], "r1 rebuilt").await;
        ready(&state, "w").await;
        // talon's clean-up after the rebuild over (its rebuild snapshots
        // merged away) and no raid process of SPDK's running: a disk pulled
        // in the middle of those is not what this test is about. (Under CI's
        // load, the pull below has hung in spdk_tgt, `bdev_aio_delete`
        // timing out, in some runs; not seen here. The target's log tail is
        // printed as `why:` lines when it does.)
        eventually("w settled after the rebuild", WAIT, || async {
            let inv = Inventory::load(&c).await.ok()?;
            let idle = inv.raid("talon-raid-w").is_some_and(|r| r.process.is_none());
            (idle && !inv.lvols.keys().any(|a| a.contains(".s.rb."))).then_some(())
        })
        .await;

        // r1 alone serves it too; r0 then comes back and is rebuilt
        c.bdev_aio_delete(&ByName::new(format!("talon-disk-{d0}")))
            .await
            .expect("pull r0's disk");
        assert!(
            read("r1 alone").await == after,
            "round {round}: rebuilt r1 does not hold what r0 acknowledged"
        );
        attach_disks(&c, dir.path(), &[d0.as_str()], false).await;
        eprintln!(
            "{test}: round {round}: killed {} ms after the write; r0's data served, r1 rebuilt",
            STEP_MS * u64::from(round)
        );
    }
    ledger_becomes(&state, "w", &[0, 1], "both up to date at the end").await;
    if let Some(r) = rt.take() {
        r.stop().await;
    }
    t.stop(Duration::from_secs(5)).await.expect("stop");
}

/// Where volume `id`'s ledger noted its local replicas' lvols (k -> lvstore UUID).
fn noted_lvstores(state: &State, id: &str) -> std::collections::BTreeMap<u32, String> {
    state
        .get_typed::<talon::resources::engine::ReplicaLedger>(id)
        .ok()
        .flatten()
        .map(|l| l.spec.lvstores)
        .unwrap_or_default()
}

/// Issue 51 (the check Longhorn's engines had, now talon's volumes' too: one
/// rule, `made_again`): a power cut (talon and spdk_tgt down at once) just
/// after a pass made replica 1's lvol again, empty, on its formatted disk,
/// before the ledger heard of it. The ledger still holds r1 up to date, and
/// r1's lvol exists, so "made by this pass" no longer tells it apart: the
/// ledger's note of the lvstore r1's lvol was in does (the format made a new
/// one). r1 is rebuilt from r0, never taken in as it is. A volume of the
/// layout before the raid superblock, where nothing in SPDK tells the
/// members apart: before, its raid1 was made over both and reads alternated
/// between r0's data and r1's zeros.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_replica_made_again_on_a_formatted_disk_before_the_ledger_heard_is_never_trusted() {
    formatted_before_the_ledger_heard(
        "real_spdk_a_replica_made_again_on_a_formatted_disk_before_the_ledger_heard_is_never_trusted",
        false,
    )
    .await;
}

/// The same power cut on a volume with the raid superblock (every volume of
/// two or more replicas the API makes): SPDK's examine assembles the raid1
/// from r0's superblock and waits for r1's old lvol, which went with the
/// format. Before, the volume stayed `RaidAssembling`, never served; now
/// the raid that waits only for a replica made again is given up (r0's
/// superblock cleared), made again from r0, and r1 rebuilt into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_raid_that_waits_for_a_local_replica_made_again_on_a_formatted_disk_is_made_again_without_it()
 {
    formatted_before_the_ledger_heard(
        "real_spdk_a_raid_that_waits_for_a_local_replica_made_again_on_a_formatted_disk_is_made_again_without_it",
        true,
    )
    .await;
}

async fn formatted_before_the_ledger_heard(test: &str, superblock: bool) {
    let Some(spdk) = spdk_dir_with(test, &["spdk_dd"]) else {
        return;
    };
    const LEN: usize = 4 << 20;
    let Node(dir, cfg, mut t, _reap, c) = node(&spdk, &["d1", "d2"], "spdk_tgt").await;
    let port = free_port();
    let rt = runtime(&c, &["d1", "d2"], port);
    let state = rt.state.clone();
    let vol: Volume = serde_json::from_value(json!({
        "sizeBytes": 16 * MIB, "replicas": 2, "engine": "v2", "raidSuperblock": superblock,
    }))
    .expect("volume");
    state.create_typed("f", "", &vol).expect("f");
    let nqn = ready(&state, "f").await.exports[0].name.clone();
    ledger_becomes(&state, "f", &[0, 1], "both up to date").await;
    // r1's lvol as the pass made it (a superblock's room larger with one)
    let r1_mib = {
        let inv = Inventory::load(&c).await.expect("inventory");
        let l = inv
            .bdevs
            .values()
            .find(|b| b.aliases.iter().any(|a| a.ends_with("/f-r1")))
            .expect("r1's lvol");
        u64::from(l.block_size) * l.num_blocks / MIB
    };
    let noted = eventually("both replicas' lvstores noted", WAIT, || async {
        let n = noted_lvstores(&state, "f");
        (n.len() == 2).then_some(n)
    })
    .await;
    let data = pattern(0x3c, LEN);
    dd(&spdk, dir.path(), port, &nqn, Some(&data), LEN);
    let (d0, d1) = (replica_disk(&state, "f", 0), replica_disk(&state, "f", 1));

    // the power cut; r1's disk comes back empty and formatted (a new
    // lvstore), with r1's lvol made again in it as the cut-off pass left it
    rt.stop().await;
    kill9(&mut t, "kill -9 spdk_tgt").await;
    std::fs::remove_file(dir.path().join(format!("{d1}.img"))).expect("r1's old disk gone");
    let t = Target::start(&cfg).await.expect("restart spdk_tgt");
    let _reap = Reaper::new(&t, &cfg);
    attach_disks(&c, dir.path(), &[d0.as_str()], false).await;
    attach_disks(&c, dir.path(), &[d1.as_str()], true).await;
    c.bdev_lvol_create(&talon::spdk::rpc::LvolCreate::thin(
        format!("talon-{d1}"),
        "f-r1",
        r1_mib,
    ))
    .await
    .expect("r1's lvol made again, empty");
    assert_eq!(
        ledger(&state, "f"),
        Some(vec![0, 1]),
        "the ledger never heard of it"
    );

    let register = |c: SpdkClient| {
        move |rt: &mut talon::runtime::Runtime| {
            rt.register(SpdkVolumeController::new(c, false).with_host_nqn(Some(node_nqn(port))))
        }
    };
    let rt = TestRuntime::start_on(state.clone(), register(c.clone())).expect("runtime");
    restarted(&state, 1, "restarts");
    let rebuilt = eventually(
        "r1 rebuilt from r0 and noted in its new lvstore",
        WAIT,
        || async {
            let n = noted_lvstores(&state, "f");
            let again = n.get(&1).filter(|u| **u != noted[&1])?.clone();
            (ledger(&state, "f").as_deref() == Some(&[0, 1][..]) && n.get(&0) == noted.get(&0))
                .then_some(again)
        },
    )
    .await;
    ready(&state, "f").await;
    eventually("the rebuild over", WAIT, || async {
        let inv = Inventory::load(&c).await.ok()?;
        let idle = inv.raid("talon-raid-f").is_some_and(|r| r.process.is_none());
        (idle && !inv.lvols.keys().any(|a| a.contains(".s.rb."))).then_some(())
    })
    .await;
    eprintln!(
        "{test}: r1's lvstore {} before, {rebuilt} after the format",
        noted[&1]
    );

    // r1 alone serves what r0 held
    c.bdev_aio_delete(&ByName::new(format!("talon-disk-{d0}")))
        .await
        .expect("pull r0's disk");
    let got = dd_retried(&spdk, dir.path(), port, &nqn, None, LEN, "r1 alone");
    assert!(
        got == data,
        "r1, made again empty, holds r0's data only by its rebuild: first difference at {:?}",
        got.iter().zip(&data).position(|(a, b)| a != b)
    );
    rt.stop().await;
    t.stop(Duration::from_secs(5)).await.expect("stop");
}

/// A host removed from the node's `allowedHosts` loses its connection to a V2
/// export, not only its next one: talon calls `nvmf_subsystem_remove_host`,
/// which spdk_tgt v26.05 follows with `spdk_nvmf_subsystem_disconnect_host`
/// (lib/nvmf/nvmf_rpc.c). Seen from the target: the host's controller goes
/// and does not come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_removed_host_loses_its_connection() {
    let Some(spdk) = spdk_dir("real_spdk_removed_host_loses_its_connection") else {
        return;
    };
    let Node(_dir, _, t, _reap, c) = node(&spdk, &["dc"], "spdk_tgt").await;
    let port = free_port();
    let rt = runtime(&c, &["dc"], port);
    rt.state
        .create_typed("cut", "", &volume(32 * MIB, 1))
        .expect("volume");
    let nqn = ready(&rt.state, "cut").await.exports[0].name.clone();
    let by_nqn = talon::spdk::rpc::ByNqn { nqn: nqn.clone() };
    // a host connection: the target's own NVMe/TCP initiator, presenting HOST_NQN
    c.bdev_nvme_attach_controller(&AttachController {
        hostnqn: Some(spdk_perf::HOST_NQN.into()),
        ..AttachController::tcp("cuthost", [127, 0, 0, 1].into(), port, &nqn)
    })
    .await
    .expect("the allowed host connects");
    let hosts = |cs: Vec<talon::spdk::rpc::NvmfController>| -> Vec<String> {
        cs.into_iter().map(|c| c.hostnqn).collect()
    };
    let before = hosts(
        c.nvmf_subsystem_get_controllers(&by_nqn)
            .await
            .expect("controllers"),
    );
    assert_eq!(before, vec![spdk_perf::HOST_NQN.to_string()]);

    let mut node = rt
        .state
        .get_typed::<NodeConfig>("node")
        .expect("get")
        .expect("node");
    node.spec.allowed_hosts.clear();
    rt.state
        .update_typed("node", "", Some(node.metadata.version), &node.spec)
        .expect("remove the host");
    eventually("the host's controller is gone", WAIT, || async {
        let cs = c.nvmf_subsystem_get_controllers(&by_nqn).await.ok()?;
        cs.is_empty().then_some(())
    })
    .await;
    // the initiator tries to reconnect; the subsystem refuses it
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = hosts(
        c.nvmf_subsystem_get_controllers(&by_nqn)
            .await
            .expect("controllers"),
    );
    assert!(after.is_empty(), "the removed host is connected again: {after:?}");

    let _ = c.bdev_nvme_detach_controller(&ByName::new("cuthost")).await;
    rt.state.destroy("config", "Volume", "cut", "").expect("delete");
    eventually("deleted", WAIT, || async {
        rt.state.list("config", "Volume").is_empty().then_some(())
    })
    .await;
    rt.stop().await;
    t.stop(Duration::from_secs(5)).await.expect("stop");
}

/// Issue 17: a replica that fell behind is rebuilt thin, with its snapshot
/// chain: on a real v26.05, a 1 GiB two-replica volume with 32 MiB written,
/// a snapshot, then 64 MiB written over it; r1's disk goes, 16 MiB more are
/// written; r1 comes back and is rebuilt from r0. r1 then holds as many
/// clusters as r0 (about 96 MiB, not 1 GiB), has its own copy of the
/// snapshot with as many clusters as r0's, and alone serves what was
/// written last, block by block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_rebuilt_replica_is_as_thin_as_its_source_and_keeps_the_chain() {
    let test = "real_spdk_a_rebuilt_replica_is_as_thin_as_its_source_and_keeps_the_chain";
    let Some(spdk) = spdk_dir_with(test, &["spdk_dd"]) else {
        return;
    };
    let Node(dir, _, t, _reap, c) = node(&spdk, &["d1", "d2"], "spdk_tgt").await;
    let port = free_port();
    let rt = runtime(&c, &["d1", "d2"], port);
    let state = rt.state.clone();
    let vol: Volume = serde_json::from_value(
        json!({"sizeBytes": 1024 * MIB, "replicas": 2, "engine": "v2", "raidSuperblock": true}),
    )
    .expect("volume");
    state.create_typed("t", "", &vol).expect("t");
    let nqn = ready(&state, "t").await.exports[0].name.clone();
    let (d0, d1) = (replica_disk(&state, "t", 0), replica_disk(&state, "t", 1));
    let io = |data: Option<Vec<u8>>, len: usize| {
        let (spdk, dir, nqn) = (spdk.clone(), dir.path().to_path_buf(), nqn.clone());
        async move {
            tokio::task::spawn_blocking(move || dd(&spdk, &dir, port, &nqn, data.as_deref(), len))
                .await
                .expect("dd")
        }
    };
    let a = pattern(0x11, 32 << 20);
    io(Some(a.clone()), a.len()).await;
    let s1 = snapshot(&state, "t", "s1").await;
    assert_eq!(s1.state, ObjectState::Ready, "{}", s1.message);
    let mut b = pattern(0x22, 64 << 20);
    io(Some(b.clone()), b.len()).await;

    // r1's disk goes; 16 MiB more land on r0 alone
    c.bdev_aio_delete(&ByName::new(format!("talon-disk-{d1}")))
        .await
        .expect("pull r1's disk");
    ledger_becomes(&state, "t", &[0], "r1 out of the ledger").await;
    let cc = pattern(0x33, 16 << 20);
    io(Some(cc.clone()), cc.len()).await;
    b[..cc.len()].copy_from_slice(&cc);

    // back: rebuilt thin, from r0
    attach_disks(&c, dir.path(), &[&d1], false).await;
    ledger_becomes(&state, "t", &[0, 1], "r1 rebuilt").await;
    ready(&state, "t").await;
    // the rebuild's own snapshots are merged away
    let inv = eventually("rebuild snapshots merged", WAIT, || async {
        let inv = Inventory::load(&c).await.ok()?;
        (!inv.lvols.keys().any(|a| a.contains(".s.rb."))).then_some(inv)
    })
    .await;
    let lvol = |name: &str| {
        inv.find_lvol(name)
            .unwrap_or_else(|| panic!("{name}: {:?}", inv.lvols.keys()))
    };
    let total = |k: u32| {
        let head = lvol(&format!("t-r{k}"));
        let chain: u64 = inv
            .chain(&head.alias)
            .iter()
            .map(|a| inv.lvols[a].num_allocated_clusters)
            .sum();
        head.num_allocated_clusters + chain
    };
    let (t0, t1) = (total(0), total(1));
    eprintln!(
        "{test}: r0 holds {t0} clusters of 1 MiB, rebuilt r1 {t1}; snapshot s1: r0 {}, r1 {}",
        lvol("t-r0.s.s1").num_allocated_clusters,
        lvol("t-r1.s.s1").num_allocated_clusters
    );
    assert!(
        t1 <= t0 + 1 && t1 + 1 >= t0,
        "r1 ({t1}) holds what r0 ({t0}) holds"
    );
    assert!(
        t1 < 128,
        "thin: {t1} clusters of a 1024 MiB volume with 96 MiB written"
    );
    assert_eq!(
        lvol("t-r1.s.s1").num_allocated_clusters,
        lvol("t-r0.s.s1").num_allocated_clusters,
        "the snapshot is rebuilt as a snapshot"
    );
    assert_eq!(
        inv.chain(&lvol("t-r1").alias),
        vec![lvol("t-r1.s.s1").alias.clone()],
        "r1's head is a clone of its copy of s1"
    );

    // r1 alone serves what was written last
    c.bdev_aio_delete(&ByName::new(format!("talon-disk-{d0}")))
        .await
        .expect("pull r0's disk");
    ledger_becomes(&state, "t", &[1], "r0 out of the ledger").await;
    let got = io(None, b.len()).await;
    assert!(
        got == b,
        "rebuilt r1 serves the data: first difference at {:?}",
        got.iter().zip(&b).position(|(x, y)| x != y)
    );
    rt.stop().await;
    t.stop(Duration::from_secs(5)).await.expect("stop");
}

/// Issue 17: a remote replica (node B serves it, A's engine calls B's admin
/// API) that missed writes is rebuilt thin through B's node: B's snapshot
/// that both share is kept, B's head is made again over it, and only what A
/// holds after it is copied, from A's target into B's head over NVMe/TCP.
/// B ends as thin as A, with the same chain, and serves what was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_remote_replica_is_rebuilt_thin_through_its_node() {
    let test = "real_spdk_a_remote_replica_is_rebuilt_thin_through_its_node";
    let Some(spdk) = spdk_dir_with(test, &["spdk_dd"]) else {
        return;
    };
    let Node(da, _, ta, _reap_a, ca) = node(&spdk, &["da"], "spdk_tgt A").await;
    let Node(db, cfg_b, tb, _reap_b, cb) = node(&spdk, &["db"], "spdk_tgt B").await;
    let (pa, pb) = (free_port(), free_port());
    let (rta, rtb) = (runtime(&ca, &["da"], pa), runtime(&cb, &["db"], pb));
    let (api_b, _server_b) = peer_api::serve(&rtb.state, rtb.statuses(), "127.0.0.1:0").await;
    let api = Some(api_b.to_string());
    let (replica_nqn, st, _) = served_by_b(&rta.state, &rtb.state, "tr", 1024 * MIB, (pa, pb), api).await;
    ledger_becomes(&rta.state, "tr", &[0, 1], "both replicas up to date").await;
    let nqn = st.exports[0].name.clone();
    let remote_room = remote_room(&ca, "tr").await;
    let io = |data: Option<Vec<u8>>, len: usize| {
        let (spdk, dir, nqn) = (spdk.clone(), da.path().to_path_buf(), nqn.clone());
        async move {
            tokio::task::spawn_blocking(move || dd(&spdk, &dir, pa, &nqn, data.as_deref(), len))
                .await
                .expect("dd")
        }
    };
    io(Some(pattern(0x11, 32 << 20)), 32 << 20).await;
    let s1 = snapshot(&rta.state, "tr", "s1").await;
    assert_eq!(s1.state, ObjectState::Ready, "{}", s1.message);
    let mut b = pattern(0x22, 64 << 20);
    io(Some(b.clone()), b.len()).await;

    // B's target dies; 16 MiB more land on A alone
    let mut tb = tb;
    kill9(&mut tb, "kill -9 B").await;
    let cc = pattern(0x33, 16 << 20);
    io(Some(cc.clone()), cc.len()).await;
    b[..cc.len()].copy_from_slice(&cc);
    ledger_becomes(&rta.state, "tr", &[0], "B's replica out of A's ledger").await;

    // B back with what it held: rebuilt thin through B's node
    let (tb, _reap_b) = restart(&cfg_b, &cb, db.path(), &["db"], "restart B").await;
    restarted(&rtb.state, 1, "B restarts");
    ledger_becomes(&rta.state, "tr", &[0, 1], "B's replica rebuilt").await;
    let (inv_a, inv_b) = eventually("rebuild snapshots merged", WAIT, || async {
        let (a, b) = (Inventory::load(&ca).await.ok()?, Inventory::load(&cb).await.ok()?);
        let rb = |i: &Inventory| i.lvols.keys().any(|a| a.contains(".s.rb."));
        (!rb(&a) && !rb(&b)).then_some((a, b))
    })
    .await;
    let total = |inv: &Inventory, name: &str| {
        let head = inv
            .find_lvol(name)
            .unwrap_or_else(|| panic!("{name}: {:?}", inv.lvols.keys()));
        let chain = inv.chain(&head.alias);
        let sum: u64 = chain.iter().map(|a| inv.lvols[a].num_allocated_clusters).sum();
        (head.num_allocated_clusters + sum, chain)
    };
    let (ta_clusters, chain_a) = total(&inv_a, "tr-r0");
    let (tb_clusters, chain_b) = total(&inv_b, "tr-r1");
    let snap = |inv: &Inventory, n: &str| inv.find_lvol(n).map(|l| l.num_allocated_clusters);
    eprintln!(
        "{test}: A holds {ta_clusters} clusters, rebuilt B {tb_clusters}; s1: A {:?}, B {:?}",
        snap(&inv_a, "tr-r0.s.s1"),
        snap(&inv_b, "tr-r1.s.s1")
    );
    assert!(
        tb_clusters <= ta_clusters + 2 && tb_clusters + 2 >= ta_clusters,
        "B ({tb_clusters}) holds what A ({ta_clusters}) holds"
    );
    assert!(
        tb_clusters < 128,
        "thin: {tb_clusters} clusters of a 1024 MiB volume with 96 MiB written"
    );
    assert_eq!(
        snap(&inv_b, "tr-r1.s.s1"),
        snap(&inv_a, "tr-r0.s.s1"),
        "s1 kept on B"
    );
    assert_eq!(chain_a.len(), 1, "{chain_a:?}");
    assert_eq!(
        chain_b,
        vec![inv_b.find_lvol("tr-r1.s.s1").expect("s1 on B").alias.clone()],
        "B's head is a clone of its s1"
    );
    // B's replica holds what was written, read on B
    let got = dd(&spdk, db.path(), pb, &replica_nqn, None, remote_room + b.len())[remote_room..].to_vec();
    assert!(
        got == b,
        "B's rebuilt replica holds the data: first difference at {:?}",
        got.iter().zip(&b).position(|(x, y)| x != y)
    );
    // and the volume serves it
    assert!(io(None, b.len()).await == b, "A's export serves the data");

    // B away again, and a snapshot s2 taken on A alone: B's s1 is given up
    // (a clone of it would carry A's raid superblock) and B is copied from
    // s1 on, into an empty head; it ends with both, as thin as A
    let mut tb = tb;
    kill9(&mut tb, "kill -9 B again").await;
    let dd2 = pattern(0x44, 8 << 20);
    io(Some(dd2.clone()), dd2.len()).await;
    b[..dd2.len()].copy_from_slice(&dd2);
    ledger_becomes(&rta.state, "tr", &[0], "B's replica out again").await;
    let s2 = snapshot(&rta.state, "tr", "s2").await;
    assert_eq!(s2.state, ObjectState::Ready, "{}", s2.message);
    let ee = pattern(0x55, 4 << 20);
    io(Some(ee.clone()), ee.len()).await;
    b[..ee.len()].copy_from_slice(&ee);
    let (tb, _reap_b2) = restart(&cfg_b, &cb, db.path(), &["db"], "restart B again").await;
    restarted(&rtb.state, 2, "B restarts again");
    ledger_becomes(&rta.state, "tr", &[0, 1], "B's replica rebuilt with s2").await;
    let (inv_a, inv_b) = eventually("rebuild snapshots merged again", WAIT, || async {
        let (a, b) = (Inventory::load(&ca).await.ok()?, Inventory::load(&cb).await.ok()?);
        let rb = |i: &Inventory| i.lvols.keys().any(|a| a.contains(".s.rb."));
        (!rb(&a) && !rb(&b)).then_some((a, b))
    })
    .await;
    let names = |inv: &Inventory, head: &str| -> Vec<String> {
        let h = inv.find_lvol(head).expect("head");
        inv.chain(&h.alias)
            .iter()
            .map(|x| inv.lvols[x].name.clone())
            .collect()
    };
    assert_eq!(names(&inv_b, "tr-r1"), ["tr-r1.s.s1", "tr-r1.s.s2"], "B's chain");
    for s in ["s1", "s2"] {
        assert_eq!(
            snap(&inv_b, &format!("tr-r1.s.{s}")),
            snap(&inv_a, &format!("tr-r0.s.{s}")),
            "{s} on B as on A"
        );
    }
    let ((ta2, _), (tb2, _)) = (total(&inv_a, "tr-r0"), total(&inv_b, "tr-r1"));
    eprintln!("{test}: second rebuild: A holds {ta2} clusters, B {tb2}");
    assert!(
        tb2 <= ta2 + 2 && tb2 + 2 >= ta2,
        "B ({tb2}) holds what A ({ta2}) holds"
    );
    let got = dd(&spdk, db.path(), pb, &replica_nqn, None, remote_room + b.len())[remote_room..].to_vec();
    assert!(
        got == b,
        "B's replica rebuilt again holds the data: first difference at {:?}",
        got.iter().zip(&b).position(|(x, y)| x != y)
    );

    for s in ["s2", "s1"] {
        rta.state
            .destroy("config", "Snapshot", &format!("tr@{s}"), "")
            .expect("delete snapshot");
    }
    eventually("snapshots gone on A", WAIT, || async {
        rta.state.list("config", "Snapshot").is_empty().then_some(())
    })
    .await;
    delete_volume(&rta.state, "tr", "A").await;
    delete_volume(&rtb.state, "tr", "B").await;
    rta.stop().await;
    rtb.stop().await;
    ta.stop(Duration::from_secs(5)).await.expect("stop A");
    tb.stop(Duration::from_secs(5)).await.expect("stop B");
}

/// The lvol B serves as replica 1 of `id` (its ReplicaStatus), once B reports one.
fn served_lvol(state: &State, id: &str) -> Option<String> {
    state
        .get_typed::<talon::resources::engine::ReplicaStatus>(&format!("{id}-r1"))
        .ok()
        .flatten()
        .map(|r| r.spec.bdev)
        .filter(|b| !b.is_empty())
}

/// What A's ledger of `id` noted of its remote replica 1's lvol.
fn noted_lvol(state: &State, id: &str) -> Option<String> {
    state
        .get_typed::<talon::resources::engine::ReplicaLedger>(id)
        .ok()
        .flatten()
        .and_then(|l| l.spec.lvols.get(&1).cloned())
}

/// B's disk replaced while A's engine is down: B makes replica 1 again, empty,
/// in the new lvstore and exports it under the same NQN. When A's engine is
/// made again it must not take that replica in as up to date (its ledger
/// holds it so): A's ledger noted the lvol B served, B reports another now,
/// so the replica is rebuilt from A's before it counts. Without the check a
/// volume without a raid superblock was served over A's data and B's empty
/// lvol (B's replica, read directly, held zeros; reads alternate between
/// members), and one with a superblock was never served again (SPDK's raid
/// from A's superblock waited for a member that never joins).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_remote_replica_made_again_on_a_new_disk_is_rebuilt_never_trusted() {
    remote_replica_made_again(
        "real_spdk_a_remote_replica_made_again_on_a_new_disk_is_rebuilt_never_trusted",
        true,
        false,
    )
    .await;
}

/// [`real_spdk_a_remote_replica_made_again_on_a_new_disk_is_rebuilt_never_trusted`]
/// for a volume made before the superblock layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_remote_replica_made_again_without_a_superblock_is_rebuilt_never_served() {
    remote_replica_made_again(
        "real_spdk_a_remote_replica_made_again_without_a_superblock_is_rebuilt_never_served",
        false,
        false,
    )
    .await;
}

/// [`real_spdk_a_remote_replica_made_again_without_a_superblock_is_rebuilt_never_served`]
/// with B's admin API silent as A's engine is made (B's talon down, its
/// spdk_tgt serving B's new, empty replica on): A cannot ask which lvol B
/// serves, so it cannot tell the replica made again. A replica with a noted
/// lvol whose node does not answer then is not trusted (`Trust::unjudged`):
/// A serves its own data, and reads through A's export never meet B's zeros.
/// Before, such a replica was not judged and taken in as up to date. Once
/// B answers, its replica is rebuilt and noted anew, as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_remote_replica_whose_node_is_silent_as_the_engine_is_made_is_never_trusted() {
    remote_replica_made_again(
        "real_spdk_a_remote_replica_whose_node_is_silent_as_the_engine_is_made_is_never_trusted",
        false,
        true,
    )
    .await;
}

/// `silent`: B's admin API does not answer from before A's target is back
/// until A served its engine and the data read back through it.
async fn remote_replica_made_again(test: &str, superblock: bool, silent: bool) {
    let Some(spdk) = spdk_dir_with(test, &["spdk_dd"]) else {
        return;
    };
    let Node(da, cfg_a, ta, _reap_a, ca) = node(&spdk, &["da"], "spdk_tgt A").await;
    let Node(db, cfg_b, tb, _reap_b, cb) = node(&spdk, &["db"], "spdk_tgt B").await;
    let (pa, pb) = (free_port(), free_port());
    let (rta, rtb) = (runtime(&ca, &["da"], pa), runtime(&cb, &["db"], pb));
    let (api_b, _server_b) = peer_api::serve(&rtb.state, rtb.statuses(), "127.0.0.1:0").await;
    let gate = api_gate::Gate::start(api_b).await;
    let api = Some(gate.addr.to_string());
    let (replica_nqn, st, _) =
        served_by_b_as(&rta.state, &rtb.state, "nd", 256 * MIB, (pa, pb), api, superblock).await;
    ledger_becomes(&rta.state, "nd", &[0, 1], "both replicas up to date").await;
    let first = eventually("A's ledger notes the lvol B serves", WAIT, || async {
        let n = noted_lvol(&rta.state, "nd")?;
        (Some(&n) == served_lvol(&rtb.state, "nd").as_ref()).then_some(n)
    })
    .await;
    let nqn = st.exports[0].name.clone();
    let remote_room = remote_room(&ca, "nd").await;
    let data = pattern(0x5a, 8 << 20);
    dd(&spdk, da.path(), pa, &nqn, Some(&data), data.len());

    // A's target down; B's disk replaced by an empty one (a new lvstore)
    let (mut ta, mut tb) = (ta, tb);
    kill9(&mut ta, "kill -9 A").await;
    kill9(&mut tb, "kill -9 B").await;
    std::fs::remove_file(db.path().join("db.img")).expect("B's old disk gone");
    let tb = Target::start(&cfg_b).await.expect("B with a new disk");
    let _reap_b2 = Reaper::new(&tb, &cfg_b);
    attach_disks(&cb, db.path(), &["db"], true).await;
    restarted(&rtb.state, 1, "B restarts");
    let remade = eventually("B serves replica 1 from a new lvol", WAIT, || async {
        served_lvol(&rtb.state, "nd").filter(|b| *b != first)
    })
    .await;
    assert_eq!(
        noted_lvol(&rta.state, "nd").as_deref(),
        Some(first.as_str()),
        "A's ledger, written while its target was down, still notes the lvol before"
    );

    // A back: replica 1 is rebuilt from replica 0, never taken in as it is
    if silent {
        gate.silence();
    }
    let (ta, _reap_a2) = restart(&cfg_a, &ca, da.path(), &["da"], "restart A").await;
    restarted(&rta.state, 1, "A restarts");
    if silent {
        // B's replica answers over NVMe/TCP, B's node not: A serves what it holds
        eventually("A's engine made again and exported", WAIT, || async {
            let inv = Inventory::load(&ca).await.ok()?;
            let exported = inv
                .subsystems
                .iter()
                .any(|s| s.nqn == nqn && !s.namespaces.is_empty());
            (inv.raid("talon-raid-nd").is_some() && exported).then_some(())
        })
        .await;
        for round in 0..3 {
            let got = dd(&spdk, da.path(), pa, &nqn, None, data.len());
            assert!(
                got == data,
                "read {round} through A's export with B's node silent: first difference at {:?}",
                got.iter().zip(&data).position(|(x, y)| x != y)
            );
        }
        assert_ne!(
            noted_lvol(&rta.state, "nd").as_deref(),
            Some(remade.as_str()),
            "B's new lvol is never noted while B's node is silent"
        );
        gate.open();
    }
    let rebuilt = eventually("replica 1 rebuilt and noted again", WAIT, || async {
        let n = noted_lvol(&rta.state, "nd").filter(|n| *n != first)?;
        (ledger(&rta.state, "nd").as_deref() == Some(&[0, 1][..])
            && Some(&n) == served_lvol(&rtb.state, "nd").as_ref())
        .then_some(n)
    })
    .await;
    eprintln!("{test}: B's lvol {first}, made again as {remade}, rebuilt into {rebuilt}");
    let got = dd(&spdk, db.path(), pb, &replica_nqn, None, remote_room + data.len())[remote_room..].to_vec();
    assert!(
        got == data,
        "B's replica holds the data after its rebuild: first difference at {:?}",
        got.iter().zip(&data).position(|(x, y)| x != y)
    );
    assert!(
        dd(&spdk, da.path(), pa, &nqn, None, data.len()) == data,
        "A's export serves the data"
    );

    delete_volume(&rta.state, "nd", "A").await;
    delete_volume(&rtb.state, "nd", "B").await;
    rta.stop().await;
    rtb.stop().await;
    ta.stop(Duration::from_secs(5)).await.expect("stop A");
    tb.stop(Duration::from_secs(5)).await.expect("stop B");
}

/// Issue 30: a backup restored into a volume with a remote replica. A's
/// local replica is made from the restored file; B's served replica starts
/// empty, is never trusted, and is rebuilt from A's: then both read the
/// backup's bytes (B's read directly through its replica export). Issue
/// 55: A's replica is thin (only the backup's data written, through the
/// mover), and a replica a cut-off restore left under its restoring name
/// is removed first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_backup_restores_into_a_volume_with_a_remote_replica() {
    use std::os::unix::fs::FileExt;
    use talon::backupstore::{BackupRequest, Credentials, Progress, SparseImage, Store, ops};
    use talon::resources::config::{BackupSource, RemoteReplica};
    let test = "real_spdk_a_backup_restores_into_a_volume_with_a_remote_replica";
    let Some(spdk) = spdk_dir_with(test, &["spdk_dd"]) else {
        return;
    };
    const SIZE: u64 = 16 * MIB;
    let Node(da, _, ta, _reap_a, ca) = node(&spdk, &["da"], "spdk_tgt A").await;
    let Node(db, _, tb, _reap_b, cb) = node(&spdk, &["db"], "spdk_tgt B").await;
    let (pa, pb) = (free_port(), free_port());
    let rta = runtime_in(&ca, &["da"], pa, Some(&da.path().join("data")));
    let rtb = runtime(&cb, &["db"], pb);
    // what a restore cut off by a crash leaves: replica 0 still under its restoring name
    ca.bdev_lvol_create(&talon::spdk::rpc::LvolCreate::thin("talon-da", "rr-r0.rst", 17))
        .await
        .expect("a cut-off restore's lvol");

    // a backup of 16 MiB: 6 MiB of data in three places, the rest holes
    let store_dir = da.path().join("store");
    let target = format!("vfs://{}", store_dir.display());
    std::fs::create_dir(&store_dir).expect("the target's folder");
    let store = Store::open(&target, &Credentials::none()).expect("store");
    let image = da.path().join("image.img");
    let f = std::fs::File::create(&image).expect("create");
    f.set_len(SIZE).expect("set_len");
    for (at, seed) in [(0, 0x11u8), (5 * MIB, 0x22), (13 * MIB, 0x33)] {
        f.write_all_at(&pattern(seed, 2 * MIB as usize), at)
            .expect("write_all_at");
    }
    drop(f);
    let req = BackupRequest::v2("src", "backup-r", "s", SIZE);
    let img = SparseImage::open(&image, 0, SIZE).expect("image");
    ops::create(&store, &req, &img, None, &Progress::default())
        .await
        .expect("backup");
    let want = std::fs::read(&image).expect("read");

    // B serves replica 1 (empty); A's volume restores the backup with B's replica in its raid1
    let mut served = volume(SIZE, 1);
    served.serve_replica = Some(1);
    served.replica_hosts = vec![node_nqn(pa)];
    served.raid_superblock = true;
    rtb.state.create_typed("rr", "", &served).expect("served");
    let replica_nqn = ready(&rtb.state, "rr").await.exports[0].name.clone();
    let mut vol = volume(SIZE, 1);
    vol.remote_replicas = vec![RemoteReplica {
        address: "127.0.0.1".into(),
        port: pb,
        api: None,
    }];
    vol.raid_superblock = true;
    vol.from_backup = Some(BackupSource {
        target: target.clone(),
        credential_secret: None,
        backup_volume: "src".into(),
        backup: "backup-r".into(),
        poll_seconds: None,
    });
    rta.state
        .create_typed("rr", "", &vol)
        .expect("volume from the backup");
    let st = ready(&rta.state, "rr").await;
    ledger_becomes(
        &rta.state,
        "rr",
        &[0, 1],
        "B's replica rebuilt from the restored one",
    )
    .await;

    let read_a = dd(&spdk, da.path(), pa, &st.exports[0].name, None, SIZE as usize);
    assert!(read_a == want, "the volume reads the backup");
    let remote_room = remote_room(&ca, "rr").await;
    let read_b = dd(
        &spdk,
        db.path(),
        pb,
        &replica_nqn,
        None,
        remote_room + SIZE as usize,
    );
    assert!(
        read_b[remote_room..] == want[..],
        "B's replica holds the backup after its rebuild"
    );
    // issue 55: restored straight from the store into the replica, no file
    // ever made on the data dir, no mover export left
    assert!(
        !da.path().join("data/restore").exists(),
        "nothing written under the data dir's restore/"
    );
    let inv = Inventory::load(&ca).await.expect("inventory");
    assert!(
        !inv.subsystems
            .iter()
            .any(|s| s.nqn.starts_with(&talon::spdk::volume::mover::nqn_prefix())),
        "the restore's temporary export is gone"
    );
    // issue 55: the restored replica is thin, it holds the backup's data
    // (6 MiB) and the raid superblock's room, not the volume's 16 MiB + room
    let inv = Inventory::load(&ca).await.expect("inventory");
    let clusters = inv
        .find_lvol("rr-r0")
        .expect("A's replica")
        .num_allocated_clusters;
    eprintln!("{test}: A's restored replica holds {clusters} clusters of 1 MiB");
    assert!((6..=8).contains(&clusters), "a thin restore: {clusters} clusters");
    assert!(
        inv.find_lvol("rr-r0.rst").is_none(),
        "the cut-off restore's lvol was removed"
    );

    delete_volume(&rta.state, "rr", "A").await;
    delete_volume(&rtb.state, "rr", "B").await;
    rta.stop().await;
    rtb.stop().await;
    ta.stop(Duration::from_secs(5)).await.expect("stop A");
    tb.stop(Duration::from_secs(5)).await.expect("stop B");
}

/// The NVMe/TCP transport is made once on a target even when the parts that
/// export on it (talon's volume controller, the Longhorn controller and
/// services: each with its own client and operations, as serve makes them)
/// ask at the same moment: spdk_tgt makes one and refuses the others
/// ("already exists"), which each takes as the transport being there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_concurrent_exports_through_separate_operations_make_one_transport() {
    use talon::spdk::volume::VolumeOps;
    let test = "real_spdk_concurrent_exports_through_separate_operations_make_one_transport";
    let Some(spdk) = spdk_dir(test) else {
        return;
    };
    let Node(_d, cfg, t, _reap, _c) = node(&spdk, &[], "spdk_tgt").await;
    // separate clients and operations, as serve makes them
    let ops: Vec<VolumeOps> = (0..4)
        .map(|_| VolumeOps::new(SpdkClient::new(cfg.socket())))
        .collect();
    let made = futures::future::join_all(ops.iter().map(|o| o.ensure_transport())).await;
    let made: Vec<bool> = made.into_iter().map(|r| r.expect("ensure_transport")).collect();
    assert_eq!(made.iter().filter(|m| **m).count(), 1, "{made:?}");
    let transports = SpdkClient::new(cfg.socket())
        .nvmf_get_transports(&Default::default())
        .await
        .expect("nvmf_get_transports");
    assert_eq!(transports.len(), 1, "{transports:?}");
    t.stop(Duration::from_secs(5)).await.expect("stop");
}
