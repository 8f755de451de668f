//! Longhorn's snapshot integrity hash (`SnapshotHash`/`SnapshotHashStatus`,
//! what longhorn-manager's snapshot monitor calls) on an engine of node A
//! over replica `vol-r-a` (A) and `vol-r-b` (node B, asked through B's
//! SPDKService `ReplicaSnapshotHash`/`Status`), with Longhorn's field
//! numbers (talon's protos). On two real spdk_tgt (`TALON_SPDK_DIR`), where
//! the snapshot streams through the data mover (talon's NVMe/TCP host on a
//! temporary loopback export): both replicas give one checksum for a
//! snapshot, another snapshot another one, a rehash the same; in_progress
//! then complete; an unknown snapshot is NOT_FOUND naming it; no file is
//! written (the hash directory is never made), no export is left. On
//! `SpdkDouble`s (a TEST DOUBLE of spdk_tgt, which serves no NVMe/TCP): a
//! hash fails naming the replica and snapshot and leaves no export, also
//! when its replica is deleted.

#[path = "support/longhorn_nodes.rs"]
mod longhorn_nodes;
#[path = "support/longhorn_req.rs"]
mod longhorn_req;
#[path = "support/spdk_dd.rs"]
#[allow(dead_code)]
mod spdk_dd;
#[path = "support/spdk_perf.rs"]
#[allow(dead_code)]
mod spdk_perf;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use talon::proto::imrpc::{self, proxy_engine_service_client::ProxyEngineServiceClient};
use talon::proto::ptypes;
use talon::proto::spdkrpc::{self, spdk_service_client::SpdkServiceClient};
use tonic::Code;
use tonic::transport::Channel;

use longhorn_nodes::{
    Node, WAIT, allocated_bytes, delete_request, engine, free_base, gone, pattern, req, running, snapshot,
    two_nodes_nvmf,
};

const MIB: u64 = 1 << 20;

async fn hash(
    p: &mut ProxyEngineServiceClient<Channel>,
    snap: &str,
    rehash: bool,
) -> Result<(), tonic::Status> {
    p.snapshot_hash(imrpc::EngineSnapshotHashRequest {
        proxy_engine_request: Some(req("vol-e-0")),
        snapshot_name: snap.into(),
        rehash,
    })
    .await
    .map(|_| ())
}

async fn status(
    p: &mut ProxyEngineServiceClient<Channel>,
    snap: &str,
) -> Result<HashMap<String, ptypes::SnapshotHashStatusResponse>, tonic::Status> {
    p.snapshot_hash_status(imrpc::EngineSnapshotHashStatusRequest {
        proxy_engine_request: Some(req("vol-e-0")),
        snapshot_name: snap.into(),
    })
    .await
    .map(|r| r.into_inner().status)
}

/// The statuses of `snap` once no replica is in progress any more.
async fn settled(
    p: &ProxyEngineServiceClient<Channel>,
    snap: &str,
    wait: Duration,
) -> HashMap<String, ptypes::SnapshotHashStatusResponse> {
    talon::runtime::testing::eventually(&format!("snapshot {snap} hashed"), wait, || async {
        let s = status(&mut p.clone(), snap).await.ok()?;
        s.values().all(|x| x.state != "in_progress").then_some(s)
    })
    .await
}

/// The one checksum both replicas report for a snapshot, complete.
fn one_checksum(s: &HashMap<String, ptypes::SnapshotHashStatusResponse>, addrs: &[&String]) -> String {
    let mut keys: Vec<&String> = s.keys().collect();
    keys.sort();
    let mut want: Vec<String> = addrs.iter().map(|a| format!("tcp://{a}")).collect();
    want.sort();
    assert_eq!(
        keys,
        want.iter().collect::<Vec<_>>(),
        "one status per replica URL: {s:?}"
    );
    for x in s.values() {
        assert_eq!(x.state, "complete", "{s:?}");
        assert!(!x.silently_corrupted);
    }
    let sums: Vec<&str> = s.values().map(|x| x.checksum.as_str()).collect();
    assert!(sums.iter().all(|c| *c == sums[0]), "both replicas agree: {s:?}");
    assert_eq!(sums[0].len(), 64, "SHA-256 in hex: {s:?}");
    sums[0].to_owned()
}

/// Nothing a hash makes is left on `n`: no mover export, no aio bdev
/// (an earlier talon's staging), no file.
async fn nothing_left(n: &Node) {
    let bdevs: Vec<String> = n
        .spdk
        .bdev_get_bdevs(&Default::default())
        .await
        .expect("bdevs")
        .into_iter()
        .map(|b| b.name)
        .filter(|b| b.starts_with("talon-hash-"))
        .collect();
    assert!(bdevs.is_empty(), "hash bdevs left: {bdevs:?}");
    talon::runtime::testing::eventually("no mover export left", WAIT, || async {
        let subs: Vec<String> = n
            .spdk
            .nvmf_get_subsystems(&Default::default())
            .await
            .expect("subsystems")
            .into_iter()
            .map(|s| s.nqn)
            .filter(|q| q.starts_with(&talon::spdk::volume::mover::nqn_prefix()))
            .collect();
        subs.is_empty().then_some(())
    })
    .await;
    let dir = n.dir.path().join("data/snaphash");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(files.is_empty(), "hash files left: {files:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_hash_on_the_double_fails_naming_it_and_leaves_nothing() {
    let size = 64 * MIB;
    let (mut a, mut b, addr_a, addr_b, _) = two_nodes_nvmf(None, size).await;
    let (da, db) = (
        a.double.as_ref().expect("double"),
        b.double.as_ref().expect("double"),
    );
    let mut p = ProxyEngineServiceClient::new(a.channel(1).await);
    assert!(da.write("talon-disk-a/vol-r-a", 2), "A's replica takes the write");
    assert!(db.write("talon-disk-b/vol-r-b", 2), "B's replica takes the write");
    snapshot(&mut p, "s1").await.expect("snapshot s1");
    assert_eq!(
        status(&mut p, "s1")
            .await
            .expect("status before")
            .values()
            .map(|s| s.state.as_str())
            .collect::<Vec<_>>(),
        vec!["", ""],
        "never hashed"
    );
    // the double exports the snapshot but serves no NVMe/TCP: the mover cannot
    // connect, and the hash fails naming the replica and snapshot
    let aio_before = da.calls("bdev_aio_create");
    hash(&mut p, "s1", false).await.expect("SnapshotHash s1");
    let s = settled(&p, "s1", WAIT).await;
    let mut keys: Vec<&String> = s.keys().collect();
    keys.sort();
    let mut want = [format!("tcp://{addr_a}"), format!("tcp://{addr_b}")];
    want.sort();
    assert_eq!(keys, want.iter().collect::<Vec<_>>(), "{s:?}");
    for x in s.values() {
        assert_eq!(x.state, "error", "{s:?}");
        assert!(x.error.contains("s1") && x.error.contains("127.0.0.1"), "{s:?}");
    }
    assert!(
        da.calls("nvmf_create_subsystem") >= 1,
        "A exported the snapshot to itself"
    );
    assert_eq!(da.calls("bdev_aio_create"), aio_before, "no staging file");

    // B's SPDKService with Longhorn's field numbers, directly
    let mut sb = SpdkServiceClient::new(b.channel(4).await);
    let r = sb
        .replica_snapshot_hash_status(spdkrpc::SnapshotHashStatusRequest {
            name: "vol-r-b".into(),
            snapshot_name: "s1".into(),
        })
        .await
        .expect("ReplicaSnapshotHashStatus")
        .into_inner();
    assert_eq!(r.state.as_str(), "error");

    // an unknown snapshot: NOT_FOUND naming it, at both calls
    let e = hash(&mut p, "nosuch", false).await.expect_err("unknown snapshot");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("nosuch"), "{e:?}");
    let e = status(&mut p, "nosuch").await.expect_err("unknown snapshot");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("nosuch"), "{e:?}");

    nothing_left(&a).await;
    nothing_left(&b).await;
    a.stop().await;
    b.stop().await;
}

/// `ProxyEngineRequest` of the clone's engine.
fn clone_req() -> imrpc::ProxyEngineRequest {
    imrpc::ProxyEngineRequest {
        volume_name: "clone".into(),
        ..req("clone-e-0")
    }
}

async fn clone_status(
    p: &mut ProxyEngineServiceClient<Channel>,
) -> HashMap<String, ptypes::SnapshotCloneStatusResponse> {
    p.snapshot_clone_status(clone_req())
        .await
        .expect("SnapshotCloneStatus")
        .into_inner()
        .status
}

/// Longhorn's clone flow on node `a` (what longhorn-manager's engine monitor
/// calls for a volume with `dataSource: snap://vol/<snap>`): volume "clone"
/// of one replica and an engine, `SnapshotCloneStatus` (one member, state
/// ""), `SnapshotClone` from `snap` of "vol", polled to complete; the clone
/// is thin; its data is checked by snapshotting and hashing it: answers the
/// checksum. The clone's engine and replica are deleted after.
/// Replica `name` of volume "clone" made on `n`'s disk `disk` through
/// `inst` (`n`'s InstanceService): its address once running.
async fn clone_replica(
    n: &Node,
    inst: &talon::proto::imrpc::instance_service_client::InstanceServiceClient<Channel>,
    name: &str,
    disk: &str,
    size: u64,
) -> String {
    inst.clone()
        .instance_create(longhorn_req::create(
            name,
            "replica",
            "clone",
            imrpc::SpdkInstanceSpec {
                disk_name: disk.into(),
                size,
                ..Default::default()
            },
        ))
        .await
        .unwrap_or_else(|e| panic!("create the clone's replica {name}: {e}"));
    format!("{}:{}", n.ip, running(inst, name, "replica").await.port_start)
}

/// Replica `old` (on node `n`, disk `disk`) of the clone's engine removed and deleted, and
/// a new one, `new`, added and rebuilt in its place (`beside`: a linked clone's, the source
/// volume's replica beside it and the engine that holds it, as longhorn-manager's
/// `ReplicaAdd` names them; the engine is on the node asked, which reads it there without
/// its address); checked to be
/// thin when `linked`: the new chain starts on `n`'s own entrypoint of `snap` beside it and
/// holds the clone's own snapshot. Returns `new`.
async fn rebuilt<'a>(
    p: &mut ProxyEngineServiceClient<Channel>,
    n: &Node,
    inst: &mut talon::proto::imrpc::instance_service_client::InstanceServiceClient<Channel>,
    (old, new, disk): (&str, &'a str, &str),
    beside: Option<(&str, &str)>,
    (size, snap, linked): (u64, &str, bool),
) -> &'a str {
    p.replica_remove(imrpc::EngineReplicaRemoveRequest {
        proxy_engine_request: Some(clone_req()),
        replica_name: old.into(),
        replica_address: String::new(),
    })
    .await
    .unwrap_or_else(|e| panic!("ReplicaRemove {old}: {e}"));
    inst.instance_delete(delete_request(old, "replica"))
        .await
        .unwrap_or_else(|e| panic!("delete {old}: {e}"));
    gone(inst, old, "replica").await;
    let addr = clone_replica(n, inst, new, disk, size).await;
    p.replica_add(imrpc::EngineReplicaAddRequest {
        proxy_engine_request: Some(clone_req()),
        replica_name: new.into(),
        replica_address: format!("tcp://{addr}"),
        linked_clone_source: beside.map(|(r, e)| imrpc::LinkedCloneSource {
            replica_name: r.into(),
            engine_name: e.into(),
            engine_address: String::new(),
        }),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("ReplicaAdd {new}: {e}"));
    talon::runtime::testing::eventually(&format!("{new} rebuilt"), WAIT * 2, || async {
        let list = p
            .clone()
            .replica_list(clone_req())
            .await
            .ok()?
            .into_inner()
            .replica_list?
            .replicas;
        (list.len() == 2 && list.iter().all(|r| r.mode == ptypes::ReplicaMode::Rw as i32)).then_some(())
    })
    .await;
    if let Some((r, _)) = beside.filter(|_| linked) {
        // once the rebuild's own snapshot is merged away (after the switch)
        let ep = format!("{r}-clone-ep-{snap}");
        let lvs = format!("talon-{disk}");
        talon::runtime::testing::eventually(&format!("{new}'s chain on {ep}"), WAIT, || async {
            let inv = talon::spdk::volume::Inventory::load(&n.spdk).await.ok()?;
            let have = talon::spdk::volume::ReplicaLvols::from_inventory(&inv, &lvs, new);
            // the clone's own snapshot copied, its chain on the entrypoint beside it
            (have.base.as_deref() == Some(ep.as_str()) && have.chain() == ["c1"]).then_some(())
        })
        .await;
        let held = allocated_bytes(n, new).await;
        assert!(
            held <= 4 << 20,
            "only the clone's own data is copied: {held} bytes in {new}"
        );
    }
    new
}

/// Snapshot `name` of the clone taken and hashed: the statuses of its
/// `members` replicas once all are complete.
async fn snapshot_hashed(
    p: &mut ProxyEngineServiceClient<Channel>,
    name: &str,
    members: usize,
) -> HashMap<String, ptypes::SnapshotHashStatusResponse> {
    p.volume_snapshot(imrpc::EngineVolumeSnapshotRequest {
        proxy_engine_request: Some(clone_req()),
        snapshot_volume: Some(ptypes::VolumeSnapshotRequest {
            name: name.into(),
            ..Default::default()
        }),
    })
    .await
    .unwrap_or_else(|e| panic!("snapshot {name} of the clone: {e}"));
    p.snapshot_hash(imrpc::EngineSnapshotHashRequest {
        proxy_engine_request: Some(clone_req()),
        snapshot_name: name.into(),
        rehash: false,
    })
    .await
    .unwrap_or_else(|e| panic!("hash {name}: {e}"));
    talon::runtime::testing::eventually(&format!("{name} hashed on every replica"), WAIT, || async {
        let s = p
            .clone()
            .snapshot_hash_status(imrpc::EngineSnapshotHashStatusRequest {
                proxy_engine_request: Some(clone_req()),
                snapshot_name: name.into(),
            })
            .await
            .ok()?
            .into_inner()
            .status;
        (s.len() == members && s.values().all(|x| x.state == "complete")).then_some(s)
    })
    .await
}

/// `linked`: Longhorn's linked clone (`CloneMode` linked-clone, the clone's
/// replica paired with `vol-r-a`, on the same disk): nothing is copied, the
/// clone's replica holds no cluster, and the entrypoint it reads goes with it.
/// With `b`, the clone has a second replica on node B paired with `vol-r-b`,
/// which B links when A's engine asks it (`ReplicaSnapshotCloneDstStart`).
async fn clone_from(
    a: &Node,
    b: Option<&Node>,
    p: &mut ProxyEngineServiceClient<Channel>,
    size: u64,
    snap: &str,
    linked: bool,
) -> String {
    let mut inst =
        talon::proto::imrpc::instance_service_client::InstanceServiceClient::new(a.channel(3).await);
    let spec = |name: &str, ty: &str, s: imrpc::SpdkInstanceSpec| longhorn_req::create(name, ty, "clone", s);
    let addr = clone_replica(a, &inst, "clone-r-a", "disk-a", size).await;
    let mut members = vec![("clone-r-a".to_owned(), addr.clone())];
    let mut inst_b = match b {
        Some(b) => {
            Some(talon::proto::imrpc::instance_service_client::InstanceServiceClient::new(b.channel(3).await))
        }
        None => None,
    };
    if let (Some(b), Some(ib)) = (b, inst_b.as_ref()) {
        members.push((
            "clone-r-b".to_owned(),
            clone_replica(b, ib, "clone-r-b", "disk-b", size).await,
        ));
    }
    inst.instance_create(spec(
        "clone-e-0",
        "engine",
        imrpc::SpdkInstanceSpec {
            replica_address_map: members.iter().cloned().collect(),
            size,
            frontend: "spdk-tcp-nvmf".into(),
            ..Default::default()
        },
    ))
    .await
    .expect("create the clone's engine");
    running(&inst, "clone-e-0", "engine").await;

    let before = clone_status(p).await;
    let tcp = format!("tcp://{addr}");
    assert_eq!(before.keys().collect::<Vec<_>>(), [&tcp], "{before:?}");
    assert_eq!(before[&tcp].state, "", "no clone yet: {before:?}");
    let clone = |snapshot: &str| imrpc::EngineSnapshotCloneRequest {
        proxy_engine_request: Some(clone_req()),
        from_engine_address: String::new(),
        snapshot_name: snapshot.into(),
        from_engine_name: "vol-e-0".into(),
        from_volume_name: "vol".into(),
        grpc_timeout_seconds: 60,
        clone_mode: if linked {
            imrpc::CloneMode::LinkedClone as i32
        } else {
            imrpc::CloneMode::FullCopy as i32
        },
        dst_replica_src_replica_pair_map: if linked {
            [
                ("clone-r-a".to_owned(), "vol-r-a".to_owned()),
                ("clone-r-b".to_owned(), "vol-r-b".to_owned()),
            ]
            .into_iter()
            .take(members.len())
            .collect()
        } else {
            Default::default()
        },
        ..Default::default()
    };
    let e = p
        .snapshot_clone(clone("nosuch"))
        .await
        .expect_err("unknown snapshot");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("nosuch") && e.message().contains("vol-r-a"),
        "{e:?}"
    );
    p.snapshot_clone(clone(snap)).await.expect("SnapshotClone");
    let done = talon::runtime::testing::eventually("the clone complete", WAIT, || async {
        let s = clone_status(&mut p.clone()).await;
        s.values().all(|x| x.state != "in_progress").then_some(s)
    })
    .await;
    let st = &done[&tcp];
    assert_eq!(
        (
            st.state.as_str(),
            st.progress,
            st.is_cloning,
            st.snapshot_name.as_str(),
            st.error.as_str()
        ),
        ("complete", 100, false, snap, ""),
        "{done:?}"
    );
    // asked again once complete: done, nothing copied again
    p.snapshot_clone(clone(snap)).await.expect("SnapshotClone again");
    let held = allocated_bytes(a, "clone-r-a").await;
    assert!(
        held <= size / 2,
        "the clone is thin: {held} bytes allocated of {size}"
    );
    let entrypoints = [
        (a, format!("talon-disk-a/vol-r-a-clone-ep-{snap}"), "clone-r-a"),
        (
            b.unwrap_or(a),
            format!("talon-disk-b/vol-r-b-clone-ep-{snap}"),
            "clone-r-b",
        ),
    ];
    let entrypoints = &entrypoints[..members.len()];
    if linked {
        for (n, entrypoint, replica) in entrypoints {
            assert_eq!(
                allocated_bytes(n, replica).await,
                0,
                "a linked clone copies nothing into {replica}"
            );
            let lvols = n
                .spdk
                .bdev_lvol_get_lvols(&Default::default())
                .await
                .expect("lvols");
            assert!(
                lvols.iter().any(|l| l.alias == *entrypoint && l.is_snapshot),
                "the entrypoint {entrypoint} is a snapshot: {:?}",
                lvols.iter().map(|l| &l.alias).collect::<Vec<_>>()
            );
        }
    }

    // keyed tcp://ip:port, the replica URL longhorn-manager's ReplicaModeUpdate takes
    let sums = snapshot_hashed(p, "c1", members.len()).await;
    let sum = sums[&format!("tcp://{addr}")].checksum.clone();
    eprintln!("clone of {snap}: {held} bytes allocated, checksum {sum}");
    let (mut a_replica, mut b_replica) = ("clone-r-a", "clone-r-b");
    if let (Some(b), Some(ib)) = (b, inst_b.as_mut()) {
        // each replica lost and rebuilt from the other, as longhorn-manager asks it for a
        // linked clone (`linked_clone_source`: the source volume's replica beside the new
        // one): B's first (the engine's node copies into B's node), then A's (B's node
        // copies into the engine's node). Each new chain starts on its own node's
        // entrypoint and only the clone's own snapshots are copied (a thin copy of them
        // over nothing would leave out what the source reads of its entrypoint); both
        // read as the snapshot
        let beside = |s: &'static str| linked.then_some((s, "vol-e-0"));
        b_replica = rebuilt(
            p,
            b,
            ib,
            ("clone-r-b", "clone-r-b2", "disk-b"),
            beside("vol-r-b"),
            (size, snap, linked),
        )
        .await;
        a_replica = rebuilt(
            p,
            a,
            &mut inst,
            ("clone-r-a", "clone-r-a2", "disk-a"),
            beside("vol-r-a"),
            (size, snap, linked),
        )
        .await;
        let sums = snapshot_hashed(p, "c2", 2).await;
        for (at, x) in &sums {
            assert_eq!(
                x.checksum, sum,
                "{at} reads as the snapshot after the rebuilds: {sums:?}"
            );
        }
        if linked {
            // a source that is a linked clone (A's) and no entrypoint the dest can start
            // on: B's asked with a replica "beside" it that is on the other node (RW in its
            // engine, but B's node has no such snapshot and refuses the base), then without `linked_clone_source` (an older manager), then with
            // a replica beside it that holds the snapshot but is not RW in the engine named
            // (Longhorn's check: a base voted corrupt is not linked to). SPDK's raid
            // rebuild copies every block (a thin copy of the clone's own snapshots over
            // nothing would leave out what A reads of its entrypoint); each reads as the
            // snapshot
            for (new, beside) in [
                ("clone-r-b3", Some(("vol-r-a", "vol-e-0"))),
                ("clone-r-b4", None),
                ("clone-r-b5", Some(("vol-r-b", "clone-e-0"))),
            ] {
                b_replica = rebuilt(p, b, ib, (b_replica, new, "disk-b"), beside, (size, snap, false)).await;
                let held = allocated_bytes(b, b_replica).await;
                assert!(
                    held >= size / 2,
                    "{b_replica} rebuilt whole by the raid: {held} bytes of {size}"
                );
            }
            let sums = snapshot_hashed(p, "c3", 2).await;
            for (at, x) in &sums {
                assert_eq!(
                    x.checksum, sum,
                    "{at} reads as the snapshot after the raid rebuilds: {sums:?}"
                );
            }
        }
    }
    for (name, ty) in [("clone-e-0", "engine"), (a_replica, "replica")] {
        inst.instance_delete(delete_request(name, ty))
            .await
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
        gone(&inst, name, ty).await;
    }
    if let Some(ib) = inst_b.as_mut() {
        ib.instance_delete(delete_request(b_replica, "replica"))
            .await
            .expect("delete B's replica");
        gone(ib, b_replica, "replica").await;
    }
    for (n, entrypoint, _) in entrypoints {
        talon::runtime::testing::eventually("no entrypoint left", WAIT, || async {
            let lvols = n.spdk.bdev_lvol_get_lvols(&Default::default()).await.ok()?;
            lvols.iter().all(|l| l.alias != *entrypoint).then_some(())
        })
        .await;
    }
    sum
}

fn spdk_dir(test: &str) -> Option<PathBuf> {
    let Some(d) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP {test}: TALON_SPDK_DIR not set");
        return None;
    };
    for tool in ["spdk_tgt", "spdk_dd"] {
        if !d.join("build/bin").join(tool).exists() {
            eprintln!("SKIP {test}: no build/bin/{tool} under {}", d.display());
            return None;
        }
    }
    Some(d)
}

/// The checksum talon gives a snapshot that reads as `writes` (offset,
/// bytes) over zeros, `size` bytes: the same function over a local file.
fn expected(size: u64, writes: &[(u64, &[u8])]) -> String {
    use std::os::unix::fs::FileExt;
    let f = tempfile::NamedTempFile::new().expect("temp file");
    f.as_file().set_len(size).expect("size");
    for (at, data) in writes {
        f.as_file().write_all_at(data, *at).expect("write");
    }
    talon::longhorn::snaphash::checksum(f.path(), size).expect("checksum")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_snapshot_hashes_agree_across_two_nodes() {
    let test = "real_spdk_snapshot_hashes_agree_across_two_nodes";
    let Some(spdk) = spdk_dir(test) else {
        return;
    };
    let size = 16 * MIB;
    let (mut a, mut b, addr_a, addr_b, port) = two_nodes_nvmf(Some(&spdk), size).await;
    let mut p = ProxyEngineServiceClient::new(a.channel(1).await);
    let nqn = "nqn.2023-01.io.longhorn.spdk:volume-vol";
    let first = pattern(2 * MIB as usize, 1);
    let second = pattern(MIB as usize / 2, 2);
    let (d1, d2) = (a.dir.path().to_path_buf(), first.clone());
    let sp = spdk.clone();
    tokio::task::spawn_blocking(move || spdk_dd::dd_write_at(&sp, &d1, port, nqn, &d2, 0))
        .await
        .expect("dd");
    snapshot(&mut p, "s1").await.expect("snapshot s1");
    // s2 overwrites part of what s1 holds, and writes beyond it
    let (d1, d2) = (a.dir.path().to_path_buf(), second.clone());
    let sp = spdk.clone();
    tokio::task::spawn_blocking(move || spdk_dd::dd_write_at(&sp, &d1, port, nqn, &d2, 3 * MIB as usize / 2))
        .await
        .expect("dd");
    snapshot(&mut p, "s2").await.expect("snapshot s2");

    hash(&mut p, "s1", false).await.expect("SnapshotHash s1");
    let first_seen = status(&mut p, "s1").await.expect("status");
    assert!(
        first_seen
            .values()
            .all(|x| x.state == "in_progress" || x.state == "complete"),
        "{first_seen:?}"
    );
    let s1 = one_checksum(&settled(&p, "s1", WAIT).await, &[&addr_a, &addr_b]);
    hash(&mut p, "s2", false).await.expect("SnapshotHash s2");
    let s2 = one_checksum(&settled(&p, "s2", WAIT).await, &[&addr_a, &addr_b]);
    assert_ne!(s1, s2, "other data, another checksum");
    // what each snapshot reads: s2 is s1's data with the second write over it
    assert_eq!(s1, expected(size, &[(0, &first)]), "s1 hashes as it reads");
    assert_eq!(
        s2,
        expected(size, &[(0, &first), (3 * MIB / 2, &second)]),
        "s2 hashes as it reads, s1's clusters included"
    );
    eprintln!("{test}: first status {first_seen:?}, s1 {s1}, s2 {s2}");

    // a rehash gives the same again
    hash(&mut p, "s1", true).await.expect("rehash s1");
    assert_eq!(
        one_checksum(&settled(&p, "s1", WAIT).await, &[&addr_a, &addr_b]),
        s1
    );
    // B's SPDKService with Longhorn's field numbers, directly
    let mut sb = SpdkServiceClient::new(b.channel(4).await);
    let r = sb
        .replica_snapshot_hash_status(spdkrpc::SnapshotHashStatusRequest {
            name: "vol-r-b".into(),
            snapshot_name: "s2".into(),
        })
        .await
        .expect("ReplicaSnapshotHashStatus")
        .into_inner();
    assert_eq!((r.state.as_str(), r.checksum.as_str()), ("complete", s2.as_str()));

    let e = hash(&mut p, "nosuch", false).await.expect_err("unknown snapshot");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("nosuch"), "{e:?}");
    let e = status(&mut p, "nosuch").await.expect_err("unknown snapshot");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // issue 55, Longhorn's SnapshotClone: volume "clone" (one replica on A) made from s1
    let c1 = clone_from(&a, None, &mut p, size, "s1", false).await;
    assert_eq!(c1, s1, "the clone reads as s1 reads");
    // and as a linked clone (Longhorn's fast clone): the same data, nothing copied
    let c2 = clone_from(&a, None, &mut p, size, "s2", true).await;
    assert_eq!(c2, s2, "the linked clone reads as s2 reads");
    // of two replicas, one on each node: B links its own when A's engine asks
    let c3 = clone_from(&a, Some(&b), &mut p, size, "s1", true).await;
    assert_eq!(c3, s1, "the linked clone of two replicas reads as s1 reads");
    // the source's snapshots are as they were
    hash(&mut p, "s2", true).await.expect("rehash s2");
    assert_eq!(
        one_checksum(&settled(&p, "s2", WAIT).await, &[&addr_a, &addr_b]),
        s2
    );

    // issue 55: the hashes streamed, nothing was staged on the data dir
    for n in [&a, &b] {
        let dir = n.dir.path().join("data/snaphash");
        assert!(
            !dir.exists(),
            "no hash file was ever written: {} exists",
            dir.display()
        );
    }
    nothing_left(&a).await;
    nothing_left(&b).await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_whose_replica_is_deleted_leaves_nothing_on_the_double() {
    let size = 64 * MIB;
    let (mut a, mut b, _, _, _) = two_nodes_nvmf(None, size).await;
    let (da, db) = (
        a.double.as_ref().expect("double"),
        b.double.as_ref().expect("double"),
    );
    let mut p = ProxyEngineServiceClient::new(a.channel(1).await);
    assert!(da.write("talon-disk-a/vol-r-a", 2), "A's replica takes the write");
    assert!(db.write("talon-disk-b/vol-r-b", 2), "B's replica takes the write");
    snapshot(&mut p, "s1").await.expect("snapshot s1");
    hash(&mut p, "s1", false).await.expect("SnapshotHash s1");

    // the volume goes (engine, then A's replica), its hash with it
    let mut inst =
        talon::proto::imrpc::instance_service_client::InstanceServiceClient::new(a.channel(3).await);
    inst.instance_delete(delete_request("vol-e-0", "engine"))
        .await
        .expect("InstanceDelete engine");
    inst.instance_delete(delete_request("vol-r-a", "replica"))
        .await
        .expect("InstanceDelete replica");
    nothing_left(&a).await;
    nothing_left(&b).await;
    a.stop().await;
    b.stop().await;
}

/// Volume `volume` on node `n`: replica `<volume>-r-b` on disk `disk-b` and
/// engine `<volume>-e-0` over it (exported); answers the replica's address.
async fn clone_volume(n: &Node, volume: &str, size: u64) -> String {
    let mut inst =
        talon::proto::imrpc::instance_service_client::InstanceServiceClient::new(n.channel(3).await);
    let (replica, engine) = (format!("{volume}-r-b"), format!("{volume}-e-0"));
    let spec = |name: &str, ty: &str, s: imrpc::SpdkInstanceSpec| longhorn_req::create(name, ty, volume, s);
    inst.instance_create(spec(
        &replica,
        "replica",
        imrpc::SpdkInstanceSpec {
            disk_name: "disk-b".into(),
            size,
            ..Default::default()
        },
    ))
    .await
    .unwrap_or_else(|e| panic!("create replica {replica}: {e}"));
    let addr = format!(
        "{}:{}",
        n.ip,
        running(&inst, &replica, "replica").await.port_start
    );
    inst.instance_create(spec(
        &engine,
        "engine",
        imrpc::SpdkInstanceSpec {
            replica_address_map: [(replica.clone(), addr.clone())].into(),
            size,
            frontend: "spdk-tcp-nvmf".into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap_or_else(|e| panic!("create engine {engine}: {e}"));
    running(&inst, &engine, "engine").await;
    addr
}

fn proxy_req_of(volume: &str) -> imrpc::ProxyEngineRequest {
    imrpc::ProxyEngineRequest {
        volume_name: volume.into(),
        ..req(&format!("{volume}-e-0"))
    }
}

/// `SnapshotCloneStatus` of volume `volume`'s engine, once it answers (an
/// engine made again after a restart answers once it serves).
async fn clone_states(
    p: &ProxyEngineServiceClient<Channel>,
    volume: &str,
) -> Option<HashMap<String, ptypes::SnapshotCloneStatusResponse>> {
    p.clone()
        .snapshot_clone_status(proxy_req_of(volume))
        .await
        .ok()
        .map(|r| r.into_inner().status)
}

/// The checksum of what volume `volume`'s engine serves: snapshotted as `c1`
/// and hashed by its replica at `addr`.
async fn served_checksum(p: &mut ProxyEngineServiceClient<Channel>, volume: &str, addr: &str) -> String {
    p.volume_snapshot(imrpc::EngineVolumeSnapshotRequest {
        proxy_engine_request: Some(proxy_req_of(volume)),
        snapshot_volume: Some(ptypes::VolumeSnapshotRequest {
            name: "c1".into(),
            ..Default::default()
        }),
    })
    .await
    .expect("snapshot the clone");
    p.snapshot_hash(imrpc::EngineSnapshotHashRequest {
        proxy_engine_request: Some(proxy_req_of(volume)),
        snapshot_name: "c1".into(),
        rehash: false,
    })
    .await
    .expect("hash the clone");
    talon::runtime::testing::eventually("the clone hashed", WAIT, || async {
        let s = p
            .clone()
            .snapshot_hash_status(imrpc::EngineSnapshotHashStatusRequest {
                proxy_engine_request: Some(proxy_req_of(volume)),
                snapshot_name: "c1".into(),
            })
            .await
            .ok()?
            .into_inner()
            .status;
        s.get(&format!("tcp://{addr}"))
            .filter(|x| x.state == "complete")
            .map(|x| x.checksum.clone())
    })
    .await
}

/// The pid of node `n`'s spdk_tgt (the one whose RPC socket is in its run dir).
fn spdk_tgt_of_opt(n: &Node) -> Option<i32> {
    let sock = n.dir.path().join("run").to_string_lossy().into_owned();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        (cmd.contains("spdk_tgt") && cmd.contains(&sock)).then_some(pid)
    })
}

/// [`spdk_tgt_of_opt`], which must find it.
fn spdk_tgt_of(n: &Node) -> i32 {
    spdk_tgt_of_opt(n).unwrap_or_else(|| panic!("no spdk_tgt with its socket in {}", n.dir.path().display()))
}

/// No snapshot is left exposed for a clone on `n`.
async fn no_exposure_left(n: &Node) {
    talon::runtime::testing::eventually("no clone exposure left", WAIT, || async {
        let subs: Vec<String> = n
            .spdk
            .nvmf_get_subsystems(&Default::default())
            .await
            .expect("subsystems")
            .into_iter()
            .map(|s| s.nqn)
            .filter(|q| q.starts_with(&talon::spdk::naming::longhorn::clone_source_prefix()))
            .collect();
        subs.is_empty().then_some(())
    })
    .await;
}

/// Issue 55 on two real spdk_tgt: volume "vol" has its only replica on node
/// A; a clone of its snapshot into volume "clone" on node B (Longhorn puts
/// the clone's engine on any node) finds A's replica through A's
/// `EngineGet` (`from_engine_address`), A exposes the snapshot read-only,
/// B's mover reads it over NVMe/TCP: the clone reads as the snapshot does,
/// is thin, and nothing is left exposed on A. Then a second clone ("clone2")
/// and talon on B stopped right after `SnapshotClone` (the copy ends with
/// the serve, unrecorded) and started again: `SnapshotCloneStatus` never
/// says "" (nor error) for it, and it completes, equal; a finished clone
/// still says complete after the restart. Then a third ("clone3") with B's
/// spdk_tgt killed (-9) mid-copy: complete once it is back (or, in error,
/// complete when asked again), equal, nothing left exposed or exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_clone_reads_a_snapshot_of_another_node_and_survives_a_restart() {
    let test = "real_spdk_a_clone_reads_a_snapshot_of_another_node_and_survives_a_restart";
    let Some(spdk) = spdk_dir(test) else {
        return;
    };
    let started = std::time::Instant::now();
    let size = 64 * MIB;
    let (ip_a, ip_b) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2]));
    let base = free_base(&[ip_a, ip_b]);
    let mut a = Node::new(ip_a, base, Some(&spdk)).await;
    let mut b = Node::new(ip_b, base, Some(&spdk)).await;
    let addr_a = a.replica("disk-a", "vol-r-a", size).await;
    engine(&a, &[("vol-r-a", &addr_a)], size, "spdk-tcp-nvmf").await;
    let inst = talon::proto::imrpc::instance_service_client::InstanceServiceClient::new(a.channel(3).await);
    let port = u16::try_from(running(&inst, "vol-e-0", "engine").await.port_start).expect("port");
    let mut pa = ProxyEngineServiceClient::new(a.channel(1).await);
    let nqn = "nqn.2023-01.io.longhorn.spdk:volume-vol";
    let (first, second) = (pattern(2 * MIB as usize, 7), pattern(8 * MIB as usize, 8));
    for (data, at) in [(&first, 0), (&second, 40 * MIB as usize)] {
        let (d1, d2, sp) = (a.dir.path().to_path_buf(), data.clone(), spdk.clone());
        tokio::task::spawn_blocking(move || spdk_dd::dd_write_at(&sp, &d1, port, nqn, &d2, at))
            .await
            .expect("dd");
    }
    snapshot(&mut pa, "s1").await.expect("snapshot s1");
    let want = expected(size, &[(0, &first), (40 * MIB, &second)]);

    b.disk("disk-b").await;
    let addr_b = clone_volume(&b, "clone", size).await;
    let mut pb = ProxyEngineServiceClient::new(b.channel(1).await);
    let clone = |volume: &str| imrpc::EngineSnapshotCloneRequest {
        proxy_engine_request: Some(proxy_req_of(volume)),
        from_engine_address: format!("{ip_a}:{}", base + 4),
        snapshot_name: "s1".into(),
        from_engine_name: "vol-e-0".into(),
        from_volume_name: "vol".into(),
        grpc_timeout_seconds: 60,
        clone_mode: imrpc::CloneMode::FullCopy as i32,
        ..Default::default()
    };
    // without from_engine_address: B holds no replica of "vol", refused naming it
    let e = pb
        .snapshot_clone(imrpc::EngineSnapshotCloneRequest {
            from_engine_address: String::new(),
            ..clone("clone")
        })
        .await
        .expect_err("no replica here, no node to ask");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("from_engine_address"), "{e:?}");
    // a snapshot none of A's replicas holds: refused naming the replica asked
    let e = pb
        .snapshot_clone(imrpc::EngineSnapshotCloneRequest {
            snapshot_name: "nosuch".into(),
            ..clone("clone")
        })
        .await
        .expect_err("unknown snapshot");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("nosuch") && e.message().contains("vol-r-a"),
        "{e:?}"
    );

    let t = std::time::Instant::now();
    pb.snapshot_clone(clone("clone")).await.expect("SnapshotClone");
    let done = talon::runtime::testing::eventually("the clone complete", WAIT, || async {
        let s = clone_states(&pb, "clone").await?;
        s.values().all(|x| x.state != "in_progress").then_some(s)
    })
    .await;
    let copy_time = t.elapsed();
    let st = &done[&format!("tcp://{addr_b}")];
    assert_eq!(
        (
            st.state.as_str(),
            st.progress,
            st.error.as_str(),
            st.from_replica_address.as_str()
        ),
        ("complete", 100, "", addr_a.as_str()),
        "{done:?}"
    );
    no_exposure_left(&a).await;
    let held = allocated_bytes(&b, "clone-r-b").await;
    assert!(
        (10 * MIB..=16 * MIB).contains(&held),
        "the clone is thin: {held} bytes allocated for 10 MiB of data in {size}"
    );
    assert_eq!(
        served_checksum(&mut pb, "clone", &addr_b).await,
        want,
        "the clone reads as s1"
    );

    // a second clone, and talon on B stopped right after it began
    let addr_b2 = clone_volume(&b, "clone2", size).await;
    pb.snapshot_clone(clone("clone2"))
        .await
        .expect("SnapshotClone clone2");
    let at_stop = clone_states(&pb, "clone2").await.expect("status before the stop");
    b.stop().await;
    b.start().await;
    let pb = ProxyEngineServiceClient::new(b.channel(1).await);
    // the finished clone is still complete, from its ledger
    let first_again = talon::runtime::testing::eventually("clone's status after the restart", WAIT, || {
        clone_states(&pb, "clone")
    })
    .await;
    assert!(
        first_again
            .values()
            .all(|x| x.state == "complete" && x.progress == 100),
        "{first_again:?}"
    );
    let seen = std::sync::Mutex::new(Vec::new());
    let after = talon::runtime::testing::eventually("clone2 complete after the restart", WAIT, || async {
        let s = clone_states(&pb, "clone2").await?;
        for x in s.values() {
            assert!(
                x.state == "in_progress" || x.state == "complete",
                "never \"\" nor error after the restart: {s:?}"
            );
            seen.lock().expect("seen").push(x.state.clone());
        }
        s.values().all(|x| x.state == "complete").then_some(s)
    })
    .await;
    eprintln!(
        "{test}: clone2 at the stop {at_stop:?}; after the restart {:?} then {after:?}",
        seen.lock().expect("seen")
    );
    let mut pb = pb;
    assert_eq!(
        served_checksum(&mut pb, "clone2", &addr_b2).await,
        want,
        "clone2 reads as s1"
    );
    no_exposure_left(&a).await;
    nothing_left(&a).await;
    nothing_left(&b).await;

    // a third clone, B's spdk_tgt killed (-9) while it copies (the clone's
    // lvol capped at 2 MB/s of writes, a cap the killed target takes with it,
    // so that the copy is under way): B's talon starts spdk_tgt again, the
    // engine is made again, and the clone ends complete (carried on) or in
    // error (asked again, then complete): either way it reads as s1 and no
    // exposure or mover export is left on either node
    let addr_b3 = clone_volume(&b, "clone3", size).await;
    let capped: bool = b
        .spdk
        .typed(
            "bdev_set_qos_limit",
            &serde_json::json!({"name": "talon-disk-b/clone3-r-b", "w_mbytes_per_sec": 2}),
        )
        .await
        .expect("bdev_set_qos_limit");
    assert!(capped);
    pb.snapshot_clone(clone("clone3"))
        .await
        .expect("SnapshotClone clone3");
    let under_way = talon::runtime::testing::eventually("clone3 under way", WAIT, || async {
        let s = clone_states(&pb, "clone3").await?;
        s.values()
            .any(|x| x.state == "in_progress" && x.progress > 0 && x.progress < 100)
            .then_some(s)
    })
    .await;
    let pid = spdk_tgt_of(&b);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .expect("kill -9 spdk_tgt of B");
    let ended = talon::runtime::testing::eventually(
        "clone3 ended after B's spdk_tgt came back",
        Duration::from_secs(240),
        || async {
            let s = clone_states(&pb, "clone3").await?;
            (spdk_tgt_of_opt(&b).is_some_and(|p| p != pid)
                && s.values().all(|x| x.state == "complete" || x.state == "error"))
            .then_some(s)
        },
    )
    .await;
    eprintln!("{test}: clone3 at the kill {under_way:?}; after spdk_tgt's restart {ended:?}");
    if ended.values().any(|x| x.state == "error") {
        // the manager asks again (its clone flow does): a new copy, complete
        assert!(
            ended.values().all(|x| x.error.contains("s1")),
            "the error names the snapshot: {ended:?}"
        );
        no_exposure_left(&a).await;
        pb.snapshot_clone(clone("clone3"))
            .await
            .expect("SnapshotClone clone3 again");
        talon::runtime::testing::eventually("clone3 complete when asked again", WAIT, || async {
            let s = clone_states(&pb, "clone3").await?;
            s.values().all(|x| x.state == "complete").then_some(())
        })
        .await;
    }
    let mut pb = pb;
    assert_eq!(
        served_checksum(&mut pb, "clone3", &addr_b3).await,
        want,
        "clone3 reads as s1 after spdk_tgt was killed mid-copy"
    );
    no_exposure_left(&a).await;
    nothing_left(&a).await;
    nothing_left(&b).await;
    eprintln!(
        "{test}: remote clone of 64 MiB (10 MiB data) {copy_time:?}, {held} bytes allocated; whole test {:?}",
        started.elapsed()
    );
    a.stop().await;
    b.stop().await;
}
