//! The V2 engine's conformance: scenarios with one set of assertions each,
//! run through both producers of an engine on one talon node with a real
//! spdk_tgt (skipped, saying so, without `TALON_SPDK_DIR`): a replica that
//! missed writes (below), a revert ([`reverted`]), a snapshot deleted
//! from the middle of the chain ([`snapshot_deleted`]), snapshots taken
//! under writes ([`snapshots_under_writes`]: one instant on both
//! replicas), and talon killed (`TALON_FAILPOINT`, SIGKILL) at each step
//! of a thin rebuild's switch ([`crashed_in_switch`]), in a snapshot with
//! the export frozen ([`crashed_in_snapshot`]) and in a revert
//! ([`crashed_in_revert`]): for these the node runs as
//! its own `talon serve` process, started again on the spdk_tgt it left.
//! The producers:
//! - talon's own volume (`volume_create` on the admin API, two replicas on
//!   the node's disks `t1`, `t2`), whose controller rebuilds a replica that
//!   fell behind by itself;
//! - a Longhorn engine over two replicas of the same node (instance-manager
//!   calls; the test plays longhorn-manager: a replica that fell out is
//!   ERR, it removes it and adds it back).
//!
//! ```text
//!   write a, snapshot s1          both replicas in service
//!   replica 1 leaves the raid1    out of service until rebuilt (ERR, or
//!                                 rebuilt within the controller's pass)
//!   write c                       replica 0 takes it (alone, while 1 is out)
//!   the control plane rebuilds    replica 1 in service again: thin, with s1
//!   replica 0 leaves the raid1    replica 1 alone serves: it reads c
//! ```
//!
//! Each scenario ends with replica 1 serving alone, so what one replica
//! holds is read, not what the raid1 picks from either.
//!
//! The same outcome on both is what "one engine" promises; the parallel
//! suites (`spdk_volume_real`, `longhorn_proxy`) go deeper into each.

#[path = "support/longhorn_nodes.rs"]
mod longhorn_nodes;
#[path = "support/longhorn_req.rs"]
mod longhorn_req;
#[path = "support/spdk_dd.rs"]
#[allow(dead_code)] // a part is used here
mod spdk_dd;
#[path = "support/spdk_perf.rs"]
#[allow(dead_code)]
mod spdk_perf;
#[path = "support/spdk_real.rs"]
mod spdk_real;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use talon::proto::imrpc;
use talon::proto::imrpc::instance_service_client::InstanceServiceClient;
use talon::proto::imrpc::proxy_engine_service_client::ProxyEngineServiceClient;
use talon::runtime::testing::eventually;
use talon::spdk::SpdkClient;
use talon::spdk::rpc::ByName;
use talon::spdk::volume::Inventory;
use tonic::transport::Channel;

use longhorn_nodes::{ERR, Node, RW, engine, free_base, pattern, replica_add, replica_remove, running};

const MIB: u64 = 1 << 20;
/// The data written: spdk_dd's blocks of 64 KiB.
const LEN: usize = 8 << 20;
const SIZE: u64 = 32 * MIB;
const WAIT: Duration = Duration::from_secs(120);

/// What produced the engine under test, and what its control plane does.
enum Producer {
    /// talon's own volume `cv`.
    Talon { admin: talon::client::Client },
    /// Longhorn engine `vol-e-0` over replicas `vol-r-a` (disk-a), `vol-r-b`
    /// (disk-b), both on this node.
    Longhorn {
        proxy: ProxyEngineServiceClient<Channel>,
        /// The replicas' names and addresses, replica 0 first.
        replicas: [(String, String); 2],
    },
}

/// Where the engine is exported.
struct Served {
    nqn: String,
    port: u16,
}

impl Producer {
    fn what(&self) -> &'static str {
        match self {
            Producer::Talon { .. } => "talon volume",
            Producer::Longhorn { .. } => "Longhorn engine",
        }
    }

    /// The engine's raid1.
    fn raid(&self) -> &'static str {
        match self {
            Producer::Talon { .. } => "talon-raid-cv",
            Producer::Longhorn { .. } => "vol-e-0",
        }
    }

    /// Replica `k`'s head lvol's name.
    fn head(&self, k: usize) -> String {
        match self {
            Producer::Talon { .. } => format!("cv-r{k}"),
            Producer::Longhorn { replicas, .. } => replicas[k].0.clone(),
        }
    }

    /// Replica `k`'s lvol of snapshot `name`.
    fn snapshot_lvol(&self, k: usize, name: &str) -> String {
        match self {
            Producer::Talon { .. } => talon::spdk::naming::snapshot_lvol("cv", k, name),
            Producer::Longhorn { replicas, .. } => format!("{}-snap-{name}", replicas[k].0),
        }
    }

    /// Asks for a revert to `name` once, its answer returned (talon's
    /// request is only written: it never fails for a kill).
    async fn try_revert(&self, name: &str) -> Result<(), String> {
        match self {
            Producer::Talon { admin } => {
                let r: Result<Value, _> = admin
                    .call("volume_revert", json!({"volume": "cv", "name": name}))
                    .await;
                r.map(|_| ()).map_err(|e| e.to_string())
            }
            Producer::Longhorn { proxy, .. } => proxy
                .clone()
                .snapshot_revert(imrpc::EngineSnapshotRevertRequest {
                    proxy_engine_request: Some(longhorn_nodes::req("vol-e-0")),
                    name: name.into(),
                })
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }

    /// Asks for snapshot `name` once, its answer returned (a call a killed
    /// talon cut is an error).
    async fn try_snapshot(&self, name: &str) -> Result<(), String> {
        match self {
            Producer::Talon { admin } => {
                let r: Result<Value, _> = admin
                    .call(
                        "snapshot_create",
                        json!({"volume": "cv", "name": name, "wait": true}),
                    )
                    .await;
                r.map(|_| ()).map_err(|e| e.to_string())
            }
            Producer::Longhorn { proxy, .. } => longhorn_nodes::snapshot(&mut proxy.clone(), name)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }

    /// The checksums of the two replicas' lvols of snapshot `name`.
    async fn snapshot_checksums(&self, node: &Node, name: &str) -> Vec<String> {
        let inv = Inventory::load(&node.spdk).await.expect("inventory");
        let mut sums = Vec::new();
        for k in 0..2 {
            let lvol = self.snapshot_lvol(k, name);
            let l = inv
                .find_lvol(&lvol)
                .unwrap_or_else(|| panic!("{}: no snapshot lvol {lvol}", self.what()));
            let size = inv.bdev_size(&l.uuid).expect("snapshot size");
            // this test's mover export is another run's to the node's talon:
            // a sweep of its orphan controller (at its start after a kill, then
            // every 30 s) removes it mid-hash, and the hash is taken again
            let mut tries = 0;
            let h = loop {
                tries += 1;
                match talon::longhorn::snaphash::hash_lvol(&node.spdk, &l.alias, size, None).await {
                    Ok(h) => break h,
                    Err(e) if tries < 3 => {
                        eprintln!("{}: hashing {} again: {e}", self.what(), l.alias);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => panic!("{}: hashing {}: {e}", self.what(), l.alias),
                }
            };
            sums.push(h.checksum);
        }
        sums
    }

    async fn snapshot(&mut self, name: &str) {
        match self {
            Producer::Talon { admin } => {
                let _: Value = admin
                    .call(
                        "snapshot_create",
                        json!({"volume": "cv", "name": name, "wait": true}),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("snapshot_create cv@{name}: {e}"));
            }
            Producer::Longhorn { proxy, .. } => {
                longhorn_nodes::snapshot(proxy, name)
                    .await
                    .unwrap_or_else(|e| panic!("VolumeSnapshot {name}: {e}"));
            }
        }
    }

    /// Reverts the engine to snapshot `name`, and waits until it is done:
    /// talon's `volume_revert` (a request its controller carries out), or
    /// Longhorn's `SnapshotRevert` (done when it answers).
    async fn revert(&mut self, name: &str) {
        match self {
            Producer::Talon { admin } => {
                let _: Value = admin
                    .call("volume_revert", json!({"volume": "cv", "name": name}))
                    .await
                    .unwrap_or_else(|e| panic!("volume_revert cv@{name}: {e}"));
                let done = format!("reverted to cv@{name} (generation 1)");
                let admin = &*admin;
                eventually(&format!("cv {done}"), WAIT, || async {
                    let st = admin.get("EngineStatus", "cv").await.ok()?.spec;
                    (st["state"] == "ready" && st["message"].as_str()?.contains(&done)).then_some(())
                })
                .await;
            }
            Producer::Longhorn { proxy, .. } => {
                proxy
                    .snapshot_revert(imrpc::EngineSnapshotRevertRequest {
                        proxy_engine_request: Some(longhorn_nodes::req("vol-e-0")),
                        name: name.into(),
                    })
                    .await
                    .unwrap_or_else(|e| panic!("SnapshotRevert {name}: {e}"));
            }
        }
    }

    /// Deletes snapshot `name` and waits until it is gone: talon's
    /// `snapshot_delete`, or Longhorn's `SnapshotRemove` then `SnapshotPurge`
    /// (what longhorn-manager sends for a snapshot deleted in its UI).
    async fn delete_snapshot(&mut self, name: &str) {
        match self {
            Producer::Talon { admin } => {
                let _: Value = admin
                    .call(
                        "snapshot_delete",
                        json!({"volume": "cv", "name": name, "wait": true}),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("snapshot_delete cv@{name}: {e}"));
            }
            Producer::Longhorn { proxy, .. } => {
                proxy
                    .snapshot_remove(imrpc::EngineSnapshotRemoveRequest {
                        proxy_engine_request: Some(longhorn_nodes::req("vol-e-0")),
                        names: vec![name.into()],
                    })
                    .await
                    .unwrap_or_else(|e| panic!("SnapshotRemove {name}: {e}"));
                proxy
                    .snapshot_purge(imrpc::EngineSnapshotPurgeRequest {
                        proxy_engine_request: Some(longhorn_nodes::req("vol-e-0")),
                        skip_if_in_progress: false,
                    })
                    .await
                    .unwrap_or_else(|e| panic!("SnapshotPurge: {e}"));
            }
        }
    }

    /// Whether replica `k` counts as up to date: in talon's ledger, RW
    /// for Longhorn.
    async fn in_service(&self, k: usize) -> bool {
        match self {
            Producer::Talon { admin } => admin
                .get("ReplicaLedger", "cv")
                .await
                .ok()
                .and_then(|r| r.spec["inSync"].as_array().cloned())
                .is_some_and(|s| s.iter().any(|x| x.as_u64() == Some(k as u64))),
            Producer::Longhorn { .. } => self.mode(k).await == Some(RW),
        }
    }

    /// Longhorn: replica `k`'s mode in `ReplicaList`, if it lists it (a
    /// talon just started answers UNAVAILABLE until its first pass: None).
    async fn mode(&self, k: usize) -> Option<i32> {
        let Producer::Longhorn { proxy, replicas } = self else {
            return None;
        };
        let at = format!("tcp://{}", replicas[k].1);
        let list = proxy
            .clone()
            .replica_list(longhorn_nodes::req("vol-e-0"))
            .await
            .ok()?;
        list.into_inner()
            .replica_list?
            .replicas
            .into_iter()
            .find(|r| r.address.as_ref().is_some_and(|a| a.address == at))
            .map(|r| r.mode)
    }

    /// The clients again, after talon was started again.
    async fn reconnect(&mut self, node: &Node) {
        match self {
            Producer::Talon { admin } => {
                *admin = talon::client::Client::connect_unix(&node.dir.path().join("run/talon.sock"))
                    .await
                    .expect("talon's API");
            }
            Producer::Longhorn { proxy, .. } => *proxy = ProxyEngineServiceClient::new(node.channel(1).await),
        }
    }

    /// Replica `k` back in service after talon was started again in the
    /// middle of its rebuild: talon's controller rebuilds it by itself; the
    /// test plays longhorn-manager, which adds a replica listed ERR (removed
    /// first) or not listed back, and waits while it is WO.
    async fn back_after_crash(&mut self, k: usize) {
        let t = std::time::Instant::now();
        while t.elapsed() < WAIT {
            if self.in_service(k).await {
                return;
            }
            let mode = self.mode(k).await;
            if let Producer::Longhorn { proxy, replicas } = self {
                let (name, at) = (&replicas[k].0, &replicas[k].1);
                if mode == Some(ERR) {
                    replica_remove(proxy, name).await;
                }
                if mode.is_none_or(|m| m == ERR)
                    && let Err(e) = replica_add(proxy, name, at).await
                {
                    eprintln!("ReplicaAdd {name} after the crash: {e} (tried again)");
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!(
            "{}: replica {k} not in service {WAIT:?} after talon started again",
            self.what()
        );
    }

    /// What the control plane does once replica `k` fell out: talon's
    /// controller rebuilds it by itself; longhorn-manager sees it ERR,
    /// removes it and adds it back.
    async fn bring_back(&mut self, k: usize) {
        if let Err(e) = self.try_bring_back(k).await {
            panic!("ReplicaAdd {}: {e}", self.head(k));
        }
    }

    /// [`Producer::bring_back`], the `ReplicaAdd`'s error returned (one
    /// cut by a talon killed in the rebuild it waits for).
    async fn try_bring_back(&mut self, k: usize) -> Result<(), tonic::Status> {
        if let Producer::Longhorn { .. } = self {
            let me = &*self;
            eventually(&format!("{} ERR", me.head(k)), WAIT, || async move {
                (me.mode(k).await == Some(ERR)).then_some(())
            })
            .await;
        }
        if let Producer::Longhorn { proxy, replicas } = self {
            replica_remove(proxy, &replicas[k].0).await;
            return replica_add(proxy, &replicas[k].0, &replicas[k].1).await;
        }
        Ok(())
    }
}

/// The raid1 member that is replica `head`'s lvol, in service, if any.
async fn member(spdk: &SpdkClient, raid: &str, head: &str) -> Option<String> {
    let inv = Inventory::load(spdk).await.ok()?;
    let l = inv.lvols.values().find(|l| l.name == head)?;
    inv.raid(raid)?
        .base_bdevs_list
        .iter()
        .filter(|b| b.is_configured)
        .find(|b| {
            b.name.as_deref().is_some_and(|n| n == l.alias || n == l.uuid)
                || b.uuid.as_deref() == Some(l.uuid.as_str())
        })
        .and_then(|b| b.name.clone())
}

/// The snapshot replica `head`'s head lvol is a clone of (its lvol name).
async fn parent(node: &Node, head: &str) -> Option<String> {
    let inv = Inventory::load(&node.spdk).await.expect("inventory");
    let alias = inv.lvols.values().find(|l| l.name == head)?.alias.clone();
    inv.parent_of(&alias)
        .map(|p| p.rsplit('/').next().unwrap_or_default().to_owned())
}

/// The bytes replica `head`'s lvols hold (its head and its snapshots, by
/// either producer's names: `<head>.s.<snap>`, `<head>-snap-<snap>`).
async fn held(node: &Node, head: &str) -> u64 {
    let inv = Inventory::load(&node.spdk).await.expect("inventory");
    let cluster = inv.lvstores.first().map_or(0, |l| l.cluster_size);
    let (dot, dash) = (format!("{head}.s."), format!("{head}-snap-"));
    inv.lvols
        .values()
        .filter(|l| l.name == head || l.name.starts_with(&dot) || l.name.starts_with(&dash))
        .map(|l| l.num_allocated_clusters * cluster)
        .sum()
}

/// Replica `k` taken out of the raid1, as a failed write takes a member out.
async fn leaves(spdk: &SpdkClient, p: &Producer, k: usize) {
    let head = p.head(k);
    let m = member(spdk, p.raid(), &head)
        .await
        .unwrap_or_else(|| panic!("{}: {head} is no member of {}", p.what(), p.raid()));
    spdk.bdev_raid_remove_base_bdev(&ByName::new(&m))
        .await
        .unwrap_or_else(|e| panic!("{}: taking {m} out: {e}", p.what()));
}

/// Reads the engine's first `LEN` bytes, or writes `data` there, through
/// its export (connecting again while a rebuild's switch closes it).
async fn dd(spdk_dir: &Path, work: &Path, s: &Served, data: Option<Vec<u8>>, what: &str) -> Vec<u8> {
    let (spdk_dir, work, nqn, port, what) = (
        spdk_dir.to_path_buf(),
        work.to_path_buf(),
        s.nqn.clone(),
        s.port,
        what.to_owned(),
    );
    tokio::task::spawn_blocking(move || {
        spdk_dd::dd_retried(&spdk_dir, &work, port, &nqn, data.as_deref(), LEN, &what)
    })
    .await
    .expect("dd task")
}

/// A scenario's spdk_dd work dir, by its `tag` and the engine.
fn work_dir(node: &Node, p: &Producer, tag: &str) -> PathBuf {
    let work = node.dir.path().join(format!("dd-{tag}-{}", p.raid()));
    std::fs::create_dir_all(&work).expect("dd dir");
    work
}

/// Asks `call` until it is answered, as longhorn-manager asks again: a
/// talon just started refuses it while the engine is not running yet
/// (FailedPrecondition), for up to [`WAIT`].
async fn asked_again<F: std::future::Future<Output = Result<(), String>>>(
    what: &str,
    call_name: &str,
    mut call: impl FnMut() -> F,
) {
    let t = std::time::Instant::now();
    loop {
        match call().await {
            Ok(()) => return,
            Err(e) if t.elapsed() < WAIT => {
                eprintln!("{what}: {call_name} after the restart: {e} (asked again)");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{what}: {call_name} refused for {WAIT:?} after the restart: {e}"),
        }
    }
}

/// Starts a process node again with `point` armed (or none) and connects
/// the producer's clients to it.
async fn arm(node: &mut Node, p: &mut Producer, point: Option<&str>) {
    node.set_failpoint(point);
    node.start().await;
    p.reconnect(node).await;
}

/// A talon volume whose replica 0 left (the end of a scenario) is rebuilt
/// by talon's controller: waited for, so that the next producer's armed
/// failpoint is not met by this rebuild. A Longhorn engine waits for its
/// manager: nothing to wait for.
async fn whole_again(node: &Node, p: &Producer) {
    if let Producer::Talon { .. } = p {
        eventually(&format!("{}: replica 0 rebuilt", p.what()), WAIT, || async {
            member(&node.spdk, p.raid(), &p.head(0)).await?;
            p.in_service(0).await.then_some(())
        })
        .await;
    }
}

/// After a revert to s1: each replica's head a clone of its own s1, in
/// service and a member of the raid1.
async fn heads_of_s1_in_service(node: &Node, p: &Producer) {
    let what = p.what();
    for k in 0..2 {
        let head = p.head(k);
        let of = parent(node, &head).await;
        assert!(
            of.as_deref()
                .is_some_and(|o| o.starts_with(&head) && o.ends_with("s1")),
            "{what}: replica {k}'s head {head} is no clone of its own s1 after the revert: {of:?}"
        );
        eventually(
            &format!("{what}: replica {k} in service after the revert"),
            WAIT,
            || async move {
                (p.in_service(k).await && member(&node.spdk, p.raid(), &p.head(k)).await.is_some())
                    .then_some(())
            },
        )
        .await;
    }
}

/// Waits until both replicas count as up to date.
async fn both_in_service(p: &Producer) {
    for k in 0..2 {
        eventually(
            &format!("{}: replica {k} in service", p.what()),
            WAIT,
            || async move { p.in_service(k).await.then_some(()) },
        )
        .await;
    }
}

/// Replica 0 leaves the raid1; replica 1 alone must read `want` (`after`:
/// what came before, for the failure's words).
async fn replica_1_alone_reads(
    spdk_dir: &Path,
    node: &Node,
    p: &Producer,
    s: &Served,
    work: &Path,
    want: &[u8],
    after: &str,
) {
    let what = p.what();
    leaves(&node.spdk, p, 0).await;
    let read = dd(spdk_dir, work, s, None, &format!("{what}: read, replica 1 alone")).await;
    assert!(
        read == want,
        "{what}: replica 1 alone does not read what it should {after}"
    );
}

/// The scenario (see the module), with its assertions, on `p`.
async fn missed_writes(spdk_dir: &Path, node: &Node, mut p: Producer, s: Served) {
    let what = p.what();
    let work = work_dir(node, &p, "missed");
    let a = pattern(LEN, 1);
    dd(spdk_dir, &work, &s, Some(a), &format!("{what}: write a")).await;
    p.snapshot("s1").await;
    both_in_service(&p).await;

    // replica 1 leaves; the writes that follow may miss it (Longhorn's: it
    // is ERR until the manager adds it back; talon's controller may have
    // rebuilt it within the pass that saw it go, whose ledger then never
    // shows it out: the raid superblock records the leave meanwhile)
    leaves(&node.spdk, &p, 1).await;
    let c = pattern(LEN, 3);
    dd(spdk_dir, &work, &s, Some(c.clone()), &format!("{what}: write c")).await;

    // rebuilt (by the controller, or after ReplicaAdd): up to date again
    p.bring_back(1).await;
    let t = std::time::Instant::now();
    let mut back = false;
    while t.elapsed() < WAIT {
        if p.in_service(1).await && member(&node.spdk, p.raid(), &p.head(1)).await.is_some() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(back, "{what}: replica 1 not rebuilt into the raid1 in {WAIT:?}");
    // thin: about what its source holds (s1's data and c's), not the volume
    let (h0, h1) = (held(node, &p.head(0)).await, held(node, &p.head(1)).await);
    eprintln!(
        "{what}: replica 1 rebuilt in {:?}; holds {} MiB, replica 0 {} MiB",
        t.elapsed(),
        h1 >> 20,
        h0 >> 20
    );
    assert!(
        h1 >= 2 * LEN as u64 && h1 <= h0 + 4 * MIB,
        "{what}: the rebuilt replica holds {h1} bytes, its source {h0}"
    );
    let lvols = node.lvols().await;
    assert!(
        lvols.iter().any(|l| l.contains(&p.head(1)) && l.contains("s1")),
        "{what}: the rebuilt replica has s1 again: {lvols:?}"
    );

    // replica 0 leaves: replica 1 alone serves c
    replica_1_alone_reads(spdk_dir, node, &p, &s, &work, &c, "(the writes it missed)").await;
}

/// The crash scenario: talon killed (SIGKILL, `TALON_FAILPOINT`) at one
/// step of a thin rebuild's switch (`point`, see `talon::util::failpoint`),
/// then started again on the spdk_tgt it left, which it adopts.
///
/// ```text
///   write a, snapshot s1            both replicas in service
///   talon stopped (SIGTERM)         spdk_tgt serves on
///   replica 1 leaves, write c       replica 0 alone takes c
///   talon started, armed            the control plane rebuilds replica 1;
///                                   talon kills itself at `point`
///   talon started again             the engine serves c; replica 1 counts as
///                                   up to date only once rebuilt (again)
///   replica 0 leaves the raid1      replica 1 alone serves: it reads c
/// ```
async fn crashed_in_switch(spdk_dir: &Path, node: &mut Node, mut p: Producer, s: Served, point: &str) {
    let what = p.what();
    let work = work_dir(node, &p, point);
    let a = pattern(LEN, 21);
    dd(spdk_dir, &work, &s, Some(a), &format!("{what}: write a")).await;
    p.snapshot("s1").await;
    both_in_service(&p).await;

    // talon stopped (its spdk_tgt serves on); replica 1 leaves and misses c
    node.stop().await;
    leaves(&node.spdk, &p, 1).await;
    let c = pattern(LEN, 23);
    dd(spdk_dir, &work, &s, Some(c.clone()), &format!("{what}: write c")).await;
    // started again, armed: the control plane rebuilds replica 1
    arm(node, &mut p, Some(point)).await;
    if let Err(e) = p.try_bring_back(1).await {
        // Longhorn's ReplicaAdd waits for the rebuild: talon killed in it
        eprintln!("{what}: ReplicaAdd cut: {}", e.message());
    }
    assert!(
        node.killed_itself(WAIT).await,
        "{what}: talon did not reach {point} within {WAIT:?} of the rebuild\n{}",
        node.log_tail()
    );

    arm(node, &mut p, None).await;
    let t = std::time::Instant::now();
    p.back_after_crash(1).await;
    eventually(
        &format!("{what}: replica 1 a member of the raid1"),
        WAIT,
        || async { member(&node.spdk, p.raid(), &p.head(1)).await },
    )
    .await;
    eprintln!(
        "{what}: killed at {point}; replica 1 in service {:?} after the restart",
        t.elapsed()
    );
    let read = dd(
        spdk_dir,
        &work,
        &s,
        None,
        &format!("{what}: read after the restart"),
    )
    .await;
    assert!(
        read == c,
        "{what}: the engine does not read c after talon was killed at {point}"
    );
    replica_1_alone_reads(
        spdk_dir,
        node,
        &p,
        &s,
        &work,
        &c,
        &format!("(the writes it missed; talon killed at {point})"),
    )
    .await;
    whole_again(node, &p).await;
}

/// The one-instant scenario: snapshots taken while spdk_nvme_perf writes
/// hold the same data on both replicas (each producer freezes the export
/// for the snapshot: no write lands in one replica's snapshot and not the
/// other's). Sequential writes at QD 31, as `spdk_volume_real`'s deeper
/// test explains: SPDK's raid1 does not order concurrent writes to one
/// block, and 31 does not divide the volume's blocks, so each pass writes a
/// block from another queue slot and the data moves between snapshots.
///
/// ```text
///   perf writes (sequential, QD 31)   both replicas in service
///   snapshots w0..w3, 300 ms apart    perf still writing after the last
///   each snapshot's lvol on replica 0 and on replica 1: one checksum
///   two consecutive snapshots differ  (the check could see two instants)
/// ```
async fn snapshots_under_writes(spdk_dir: &Path, node: &Node, mut p: Producer, s: Served) {
    const SNAPSHOTS: usize = 4;
    let what = p.what();
    both_in_service(&p).await;
    let writer = spdk_perf::Writer::start(spdk_dir, s.port, &s.nqn, "write -q 31", 60);
    // perf connects (seconds on a loaded machine) and writes
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut names = Vec::new();
    for i in 0..SNAPSHOTS {
        let name = format!("w{i}");
        p.snapshot(&name).await;
        names.push(name);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let still = !writer.is_finished();
    let out = writer.stop();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(still, "{what}: the writer ran through the snapshots: {report}");
    let iops = spdk_perf::total_iops(&report);
    assert!(iops > 0.0, "{what}: writes went on: {report}");

    let (mut previous, mut moved) = (None::<String>, 0);
    for name in &names {
        let sums = p.snapshot_checksums(node, name).await;
        assert_eq!(
            sums[0], sums[1],
            "{what}: snapshot {name} holds other data on replica 0 than on replica 1"
        );
        if previous.as_ref().is_some_and(|x| *x != sums[0]) {
            moved += 1;
        }
        previous = Some(sums[0].clone());
    }
    eprintln!(
        "{what}: {SNAPSHOTS} snapshots under writes ({iops:.0} IOPS), each one checksum on both replicas; \
         the data moved between {moved} of {} consecutive snapshots",
        SNAPSHOTS - 1
    );
    assert!(
        moved > 0,
        "{what}: the writer never changed the data between two snapshots"
    );
}

/// The snapshot crash scenario: talon killed (`TALON_FAILPOINT`) in a
/// snapshot, with the export frozen (`snapshot-frozen`: nothing taken yet;
/// `snapshot-taken`: every replica's snapshot taken, not thawed), then
/// started again.
///
/// ```text
///   write a                        both replicas in service
///   talon started again, armed; the snapshot s1 asked  talon kills itself
///   talon started again            the export serves (thawed): write b, read b
///   the snapshot asked again       (Longhorn: VolumeSnapshot s1 again, as a
///                                   retrying manager would; talon: the request
///                                   it persisted is carried out)
///   s1 on both replicas            one checksum: one instant (talon's:
///                                   before b when it was taken before the
///                                   kill; Longhorn's, its call cut by the
///                                   kill, undone and taken again: after b)
/// ```
async fn crashed_in_snapshot(spdk_dir: &Path, node: &mut Node, mut p: Producer, s: Served, point: &str) {
    let what = p.what();
    let work = work_dir(node, &p, point);
    let a = pattern(LEN, 31);
    dd(spdk_dir, &work, &s, Some(a.clone()), &format!("{what}: write a")).await;
    both_in_service(&p).await;
    node.stop().await;
    arm(node, &mut p, Some(point)).await;
    both_in_service(&p).await;
    // the call is cut by the kill
    let asked = p.try_snapshot("s1").await;
    assert!(
        node.killed_itself(WAIT).await,
        "{what}: talon did not reach {point} in a snapshot (the call said {asked:?})\n{}",
        node.log_tail()
    );
    arm(node, &mut p, None).await;
    let t = std::time::Instant::now();
    // served again: the freeze the killed talon left is thawed
    let b = pattern(LEN, 33);
    dd(
        spdk_dir,
        &work,
        &s,
        Some(b.clone()),
        &format!("{what}: write b after the restart"),
    )
    .await;
    let read = dd(spdk_dir, &work, &s, None, &format!("{what}: read b")).await;
    assert!(
        read == b,
        "{what}: the engine does not read b after talon was killed at {point}"
    );
    eprintln!(
        "{what}: killed at {point}; written and read again {:?} after the restart",
        t.elapsed()
    );
    // the snapshot: the manager asks again; talon's request is carried out
    if let Producer::Longhorn { .. } = p {
        asked_again(what, "VolumeSnapshot s1", || p.try_snapshot("s1")).await;
    }
    eventually(&format!("{what}: s1 on both replicas"), WAIT, || async {
        let inv = Inventory::load(&node.spdk).await.ok()?;
        (0..2)
            .all(|k| inv.find_lvol(&p.snapshot_lvol(k, "s1")).is_some())
            .then_some(())
    })
    .await;
    let s1 = p.snapshot_checksums(node, "s1").await;
    assert_eq!(
        s1[0], s1[1],
        "{what}: s1 holds other data on replica 0 than on replica 1 after talon was killed at {point}"
    );
    // a snapshot now holds b, one instant too. talon's s1 taken before the
    // kill (`snapshot-taken`) is the instant before b, kept: it differs. A
    // Longhorn take the kill cut before its call answered is undone on
    // every replica (its record outlived the kill) and taken again when the
    // manager asks again: after b. One the kill cut before it was taken is
    // taken after the restart, before or after b
    p.snapshot("s2").await;
    let s2 = p.snapshot_checksums(node, "s2").await;
    assert_eq!(
        s2[0], s2[1],
        "{what}: s2 holds other data on replica 0 than on replica 1"
    );
    if point == "snapshot-taken" {
        match p {
            Producer::Talon { .. } => assert_ne!(
                s2[0], s1[0],
                "{what}: s1, taken before the kill, holds b, written after the restart"
            ),
            Producer::Longhorn { .. } => assert_eq!(
                s2[0], s1[0],
                "{what}: s1, cut by the kill before its call answered, was kept rather than taken again"
            ),
        }
    }
}

/// The revert crash scenario: talon killed (`TALON_FAILPOINT`) in a revert
/// (`revert-taken-down`: the export and raid gone, no head made again yet;
/// `revert-head-remade`: one replica's head a clone of its s1, the other's
/// still holding b), then started again.
///
/// ```text
///   write a, snapshot s1, write b   both replicas in service
///   talon started again, armed; revert to s1   talon kills itself
///   talon started again             never a raid1 over a reverted head and one
///                                   that is not; talon's request is carried out; the
///                                   test plays longhorn-manager, which asks
///                                   for the revert again when it failed
///   the engine reads a              both heads clones of their s1
///   replica 0 leaves the raid1      replica 1 alone reads a: never b
/// ```
async fn crashed_in_revert(spdk_dir: &Path, node: &mut Node, mut p: Producer, s: Served, point: &str) {
    let what = p.what();
    let work = work_dir(node, &p, point);
    let a = pattern(LEN, 41);
    dd(spdk_dir, &work, &s, Some(a.clone()), &format!("{what}: write a")).await;
    p.snapshot("s1").await;
    let b = pattern(LEN, 42);
    dd(spdk_dir, &work, &s, Some(b), &format!("{what}: write b")).await;
    both_in_service(&p).await;
    node.stop().await;
    arm(node, &mut p, Some(point)).await;
    both_in_service(&p).await;
    let asked = p.try_revert("s1").await;
    assert!(
        node.killed_itself(WAIT).await,
        "{what}: talon did not reach {point} in a revert (the call said {asked:?})\n{}",
        node.log_tail()
    );
    arm(node, &mut p, None).await;
    // before the revert is carried out (again): never an exported raid1
    // over a head made again from s1 and one that was not (one holds a, the
    // other b). Unexported, the carry-on's own raid is judged by nothing: it
    // is made over fresh heads, then each snapshot put under its head in
    // turn (talon's volumes with a superblock, `spdk/volume/revert.rs`)
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        let exported = Inventory::load(&node.spdk)
            .await
            .ok()
            .and_then(|i| i.subsystem(&s.nqn).map(|x| !x.namespaces.is_empty()))
            .unwrap_or(false);
        if !exported {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let mut reverted = Vec::new();
        let mut seen = Vec::new();
        for k in 0..2 {
            if let Some(m) = member(&node.spdk, p.raid(), &p.head(k)).await {
                let of = parent(node, &p.head(k)).await;
                reverted.push(of.as_ref().is_some_and(|o| o.ends_with("s1")));
                seen.push(format!("member {m}: {} of {of:?}", p.head(k)));
            }
        }
        assert!(
            reverted.len() < 2 || reverted[0] == reverted[1],
            "{what}: after talon was killed at {point}, the exported raid1 serves one head reverted and one not: \
             {seen:?}; raid {:?}\n{}",
            Inventory::load(&node.spdk)
                .await
                .ok()
                .and_then(|i| i.raid(p.raid()).cloned()),
            node.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // talon's persisted request goes on by itself; Longhorn's manager asks
    // again for a revert whose call failed
    match &p {
        Producer::Talon { admin } => {
            let done = "reverted to cv@s1 (generation 1)";
            eventually(&format!("cv {done}"), WAIT, || async {
                let st = admin.get("EngineStatus", "cv").await.ok()?.spec;
                (st["state"] == "ready" && st["message"].as_str()?.contains(done)).then_some(())
            })
            .await;
        }
        Producer::Longhorn { .. } => asked_again(what, "SnapshotRevert s1", || p.try_revert("s1")).await,
    }
    let node = &*node;
    let read = dd(
        spdk_dir,
        &work,
        &s,
        None,
        &format!("{what}: read after the revert"),
    )
    .await;
    assert!(
        read == a,
        "{what}: the engine does not read s1's data after talon was killed at {point}"
    );
    heads_of_s1_in_service(node, &p).await;
    replica_1_alone_reads(
        spdk_dir,
        node,
        &p,
        &s,
        &work,
        &a,
        &format!("(s1's data; talon killed at {point})"),
    )
    .await;
    whole_again(node, &p).await;
}

/// The revert scenario: a revert to a snapshot makes every replica's head
/// again from its own copy of the snapshot, and the writes after the
/// snapshot are gone from each.
///
/// ```text
///   write a, snapshot s1, write b   both replicas in service
///   revert to s1                    the engine reads a; each head a clone of its s1
///   replica 0 leaves the raid1      replica 1 alone reads a (not b)
/// ```
async fn reverted(spdk_dir: &Path, node: &Node, mut p: Producer, s: Served) {
    let what = p.what();
    let work = work_dir(node, &p, "rev");
    let a = pattern(LEN, 11);
    dd(spdk_dir, &work, &s, Some(a.clone()), &format!("{what}: write a")).await;
    p.snapshot("s1").await;
    let b = pattern(LEN, 12);
    dd(spdk_dir, &work, &s, Some(b), &format!("{what}: write b")).await;
    both_in_service(&p).await;

    p.revert("s1").await;
    let read = dd(
        spdk_dir,
        &work,
        &s,
        None,
        &format!("{what}: read after the revert"),
    )
    .await;
    assert!(
        read == a,
        "{what}: the engine does not read s1's data after the revert"
    );
    heads_of_s1_in_service(node, &p).await;

    // replica 0 leaves: replica 1 alone holds the reverted data
    replica_1_alone_reads(spdk_dir, node, &p, &s, &work, &a, "(s1's data, after the revert)").await;
}

/// The snapshot-delete scenario: a snapshot deleted from the middle of the
/// chain leaves every replica's data as it was, its data merged into the
/// snapshot above it on each replica.
///
/// ```text
///   write a (8 MiB), s1, write b (first 4 MiB), s2    both replicas in service
///   delete s1            no replica keeps an s1 lvol; each head's chain is [s2]
///                        the engine reads b + the second half of a
///   replica 0 leaves     replica 1 alone reads the same
/// ```
async fn snapshot_deleted(spdk_dir: &Path, node: &Node, mut p: Producer, s: Served) {
    let what = p.what();
    let work = work_dir(node, &p, "del");
    let a = pattern(LEN, 21);
    dd(spdk_dir, &work, &s, Some(a.clone()), &format!("{what}: write a")).await;
    p.snapshot("s1").await;
    let b = pattern(LEN / 2, 22);
    dd(spdk_dir, &work, &s, Some(b.clone()), &format!("{what}: write b")).await;
    p.snapshot("s2").await;
    let mut expected = b;
    expected.extend_from_slice(&a[LEN / 2..]);
    both_in_service(&p).await;

    p.delete_snapshot("s1").await;
    let snaps = |k: usize| {
        let head = p.head(k);
        async move {
            let inv = Inventory::load(&node.spdk).await.expect("inventory");
            let alias = inv.lvols.values().find(|l| l.name == head)?.alias.clone();
            Some(inv.chain(&alias))
        }
    };
    for k in 0..2 {
        let chain = eventually(&format!("{what}: replica {k}'s s1 gone"), WAIT, || async {
            snaps(k).await.filter(|c| !c.iter().any(|l| l.ends_with("s1")))
        })
        .await;
        assert!(
            chain.len() == 1 && chain[0].ends_with("s2"),
            "{what}: replica {k}'s head sits on {chain:?}, not on its s2 alone"
        );
    }
    let lvols = node.lvols().await;
    for k in 0..2 {
        let head = p.head(k);
        assert!(
            !lvols.iter().any(|l| l.contains(&head) && l.ends_with("s1")),
            "{what}: an s1 lvol of {head} is left: {lvols:?}"
        );
    }
    let read = dd(
        spdk_dir,
        &work,
        &s,
        None,
        &format!("{what}: read after the delete"),
    )
    .await;
    assert!(read == expected, "{what}: the data changed when s1 was deleted");
    replica_1_alone_reads(spdk_dir, node, &p, &s, &work, &expected, "(after s1 was deleted)").await;
}

/// One talon node with real spdk_tgt and both producers' engines, each in
/// its state before a scenario: talon's volume `cv` (disks `t1`, `t2`) and
/// a Longhorn engine `vol-e-0` (replicas on `disk-a`, `disk-b`).
struct Both {
    spdk: PathBuf,
    node: Node,
    talon: (Producer, Served),
    longhorn: (Producer, Served),
    _disks: tempfile::TempDir,
}

async fn both(test: &str) -> Option<Both> {
    both_on(test, false).await
}

/// [`both`] on a node of its own `talon serve` process (`spawned`), which
/// a crash scenario kills and starts again.
async fn both_on(test: &str, spawned: bool) -> Option<Both> {
    let spdk = spdk_real::spdk_dir_with(test, &["spdk_dd", "spdk_nvme_perf"])?;
    let ip = IpAddr::from([127, 0, 0, 1]);
    let base = free_base(&[ip]);
    let port = spdk_real::free_port();
    let disks = tempfile::tempdir().expect("disks dir");
    let file = |d: &str| -> PathBuf { disks.path().join(format!("{d}.img")) };
    let extra = format!(
        "  nvmfPort: {port}\ndisks:\n  t1:\n    path: {}\n    sizeBytes: {}\n  t2:\n    path: {}\n    sizeBytes: {}\n",
        file("t1").display(),
        256 * MIB,
        file("t2").display(),
        256 * MIB
    );
    let node = if spawned {
        Node::spawned(ip, base, &spdk, "0x1", &extra).await
    } else {
        Node::with_config(ip, base, Some(&spdk), "0x1", &extra).await
    };
    let admin = talon::client::Client::connect_unix(&node.dir.path().join("run/talon.sock"))
        .await
        .expect("talon's API");

    // talon's own volume
    for d in ["t1", "t2"] {
        eventually(&format!("disk {d} ready"), WAIT, || async {
            let r = admin.get("DiskStatus", d).await.ok()?;
            (r.spec["state"] == "ready").then_some(())
        })
        .await;
    }
    let v: Value = admin
        .call(
            "volume_create",
            json!({"name": "cv", "sizeBytes": SIZE, "replicas": 2, "engine": "v2",
                   "disks": ["t1", "t2"], "wait": true}),
        )
        .await
        .expect("volume_create cv");
    let export = &v["engine"]["exports"][0];
    let talon_served = Served {
        nqn: export["name"].as_str().expect("nqn").to_owned(),
        port: u16::try_from(export["port"].as_u64().expect("port")).expect("port"),
    };

    // a Longhorn engine, on the same node and target
    let a = node.replica("disk-a", "vol-r-a", SIZE).await;
    let b = node.replica("disk-b", "vol-r-b", SIZE).await;
    engine(&node, &[("vol-r-a", &a), ("vol-r-b", &b)], SIZE, "").await;
    let inst = InstanceServiceClient::new(node.channel(3).await);
    let st = running(&inst, "vol-e-0", "engine").await;
    let served = Served {
        nqn: "nqn.2023-01.io.longhorn.spdk:volume-vol".into(),
        port: u16::try_from(st.port_start).expect("port"),
    };
    let proxy = ProxyEngineServiceClient::new(node.channel(1).await);
    let replicas = [("vol-r-a".to_owned(), a), ("vol-r-b".to_owned(), b)];
    Some(Both {
        spdk,
        node,
        talon: (Producer::Talon { admin }, talon_served),
        longhorn: (Producer::Longhorn { proxy, replicas }, served),
        _disks: disks,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_replica_that_missed_writes_conforms_on_both_producers() {
    let Some(b) = both("real_spdk_a_replica_that_missed_writes_conforms_on_both_producers").await else {
        return;
    };
    missed_writes(&b.spdk, &b.node, b.talon.0, b.talon.1).await;
    missed_writes(&b.spdk, &b.node, b.longhorn.0, b.longhorn.1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_snapshots_under_writes_are_one_instant_on_both_producers() {
    let Some(b) = both("real_spdk_snapshots_under_writes_are_one_instant_on_both_producers").await else {
        return;
    };
    snapshots_under_writes(&b.spdk, &b.node, b.talon.0, b.talon.1).await;
    snapshots_under_writes(&b.spdk, &b.node, b.longhorn.0, b.longhorn.1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_revert_conforms_on_both_producers() {
    let Some(b) = both("real_spdk_a_revert_conforms_on_both_producers").await else {
        return;
    };
    reverted(&b.spdk, &b.node, b.talon.0, b.talon.1).await;
    reverted(&b.spdk, &b.node, b.longhorn.0, b.longhorn.1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_snapshot_deleted_from_the_chain_conforms_on_both_producers() {
    let Some(b) = both("real_spdk_a_snapshot_deleted_from_the_chain_conforms_on_both_producers").await else {
        return;
    };
    snapshot_deleted(&b.spdk, &b.node, b.talon.0, b.talon.1).await;
    snapshot_deleted(&b.spdk, &b.node, b.longhorn.0, b.longhorn.1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_talon_killed_in_a_revert_taken_down_conforms_on_both_producers() {
    crash_conforms(
        "real_spdk_talon_killed_in_a_revert_taken_down_conforms_on_both_producers",
        "revert-taken-down",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_talon_killed_in_a_revert_one_head_remade_conforms_on_both_producers() {
    crash_conforms(
        "real_spdk_talon_killed_in_a_revert_one_head_remade_conforms_on_both_producers",
        "revert-head-remade",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_talon_killed_in_a_frozen_snapshot_conforms_on_both_producers() {
    crash_conforms(
        "real_spdk_talon_killed_in_a_frozen_snapshot_conforms_on_both_producers",
        "snapshot-frozen",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_talon_killed_with_a_snapshot_taken_not_thawed_conforms_on_both_producers() {
    crash_conforms(
        "real_spdk_talon_killed_with_a_snapshot_taken_not_thawed_conforms_on_both_producers",
        "snapshot-taken",
    )
    .await;
}

/// talon killed at `point` (its step names the scenario), on both producers.
async fn crash_conforms(test: &str, point: &str) {
    let Some(mut b) = both_on(test, true).await else {
        return;
    };
    let (node, spdk) = (&mut b.node, b.spdk.as_path());
    for (p, s) in [b.talon, b.longhorn] {
        match point.split('-').next() {
            Some("rebuild") => crashed_in_switch(spdk, node, p, s, point).await,
            Some("snapshot") => crashed_in_snapshot(spdk, node, p, s, point).await,
            Some("revert") => crashed_in_revert(spdk, node, p, s, point).await,
            _ => panic!("no crash scenario for {point}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_talon_killed_with_the_switch_closed_conforms_on_both_producers() {
    crash_conforms(
        "real_spdk_talon_killed_with_the_switch_closed_conforms_on_both_producers",
        "rebuild-switch-closed",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_talon_killed_with_the_switch_copied_conforms_on_both_producers() {
    crash_conforms(
        "real_spdk_talon_killed_with_the_switch_copied_conforms_on_both_producers",
        "rebuild-switch-copied",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_talon_killed_with_the_switch_joined_conforms_on_both_producers() {
    crash_conforms(
        "real_spdk_talon_killed_with_the_switch_joined_conforms_on_both_producers",
        "rebuild-switch-joined",
    )
    .await;
}
