//! Issue 53 (a): Longhorn relocating a V2 engine creates a second engine
//! `vol-e-1` on node B over the replicas engine `vol-e-0` serves on node A
//! (a real spdk_tgt on each node, `TALON_SPDK_DIR`). B's engine asks A for
//! A's replica, which e-0 holds directly; e-0 moves that member behind the
//! replica's export (its export closed a moment, no rebuild), e-1 attaches it and
//! runs; both engines keep both replicas RW, and data written through e-0
//! before and after reads back through e-1's export. Once e-1 is deleted,
//! e-0 takes its lvol back directly (the node's hold set to 5 s here).
//!
//! ```text
//!   node A 127.0.0.1: vol-r-a ── vol-e-0 raid1 [ vol-r-a (lvol ⇄ export+loopback), vol-r-bn1 ]
//!   node B 127.0.0.2: vol-r-b ── export <── e-0;   vol-e-1 raid1 [ vol-r-an1, vol-r-bn1 ]
//! ```

#[path = "support/longhorn_nodes.rs"]
mod longhorn_nodes;
#[path = "support/longhorn_req.rs"]
mod longhorn_req;
#[allow(dead_code)] // other tests' parts
#[path = "support/spdk_dd.rs"]
mod spdk_dd;
#[allow(dead_code)] // other tests' parts
#[path = "support/spdk_perf.rs"]
mod spdk_perf;
#[path = "support/spdk_real.rs"]
mod spdk_real;

use std::net::IpAddr;
use std::time::Instant;

use longhorn_nodes::{Node, RW, WAIT, engine, engine_create, free_base, pattern, running};
use talon::proto::imrpc::{
    instance_service_client::InstanceServiceClient, proxy_engine_service_client::ProxyEngineServiceClient,
};
use talon::spdk::SpdkClient;
use talon::spdk::rpc::{GetRaids, RaidBdev, RaidCategory};
use tonic::transport::Channel;

const LEN: usize = 8 << 20;
const NQN: &str = "nqn.2023-01.io.longhorn.spdk:volume-vol";

/// Raid `name` on `c`.
async fn raid(c: &SpdkClient, name: &str) -> Option<RaidBdev> {
    c.bdev_raid_get_bdevs(&GetRaids {
        category: RaidCategory::All,
    })
    .await
    .ok()?
    .into_iter()
    .find(|r| r.name == name)
}

/// `InstanceDelete` of engine `name` through `c`, and its wait until it is gone.
async fn delete_engine(c: &InstanceServiceClient<Channel>, name: &str) {
    c.clone()
        .instance_delete(longhorn_nodes::delete_request(name, "engine"))
        .await
        .unwrap_or_else(|x| panic!("delete {name}: {x}"));
    longhorn_nodes::gone(c, name, "engine").await;
}

/// The manager's removal of snapshot `snap` and its purge, through engine
/// `engine` on `node`'s proxy.
async fn remove_and_purge(node: &Node, engine: &str, snap: &str) {
    let mut p = ProxyEngineServiceClient::new(node.channel(1).await);
    p.snapshot_remove(talon::proto::imrpc::EngineSnapshotRemoveRequest {
        proxy_engine_request: Some(longhorn_nodes::req(engine)),
        names: vec![snap.into()],
    })
    .await
    .unwrap_or_else(|x| panic!("SnapshotRemove {snap} through {engine}: {x}"));
    p.snapshot_purge(talon::proto::imrpc::EngineSnapshotPurgeRequest {
        proxy_engine_request: Some(longhorn_nodes::req(engine)),
        skip_if_in_progress: false,
    })
    .await
    .unwrap_or_else(|x| panic!("SnapshotPurge through {engine}: {x}"));
}

/// Engine `engine`'s replica modes (`ReplicaList` through the node's proxy).
async fn modes(p: &mut ProxyEngineServiceClient<Channel>, engine: &str) -> Vec<i32> {
    p.replica_list(longhorn_nodes::req(engine))
        .await
        .expect("ReplicaList")
        .into_inner()
        .replica_list
        .expect("list")
        .replicas
        .iter()
        .map(|r| r.mode)
        .collect()
}

/// Raid `r` in service over every slot, no rebuild running.
fn whole(r: &RaidBdev) -> bool {
    r.state == "online"
        && r.process.is_none()
        && r.num_base_bdevs == 2
        && r.base_bdevs_list.iter().all(|b| b.is_configured)
}

fn members(r: &RaidBdev) -> Vec<String> {
    r.base_bdevs_list.iter().filter_map(|b| b.name.clone()).collect()
}

/// Nodes A (127.0.0.1) and B (127.0.0.2), `hold` in their config, replica
/// vol-r-a on A and vol-r-b on B, and engine vol-e-0 on A over both,
/// running: the nodes, the replicas' addresses and e-0's port.
async fn engine_on_a_over_both(spdk: &std::path::Path, hold: &str) -> (Node, Node, [String; 2], u16) {
    let (ip_a, ip_b) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2]));
    let base = free_base(&[ip_a, ip_b]);
    let a = Node::with_config(ip_a, base, Some(spdk), "0x1", hold).await;
    let b = Node::with_config(ip_b, base, Some(spdk), "0x1", hold).await;
    let addr_a = a.replica("disk-a", "vol-r-a", LEN as u64).await;
    let addr_b = b.replica("disk-b", "vol-r-b", LEN as u64).await;
    engine(
        &a,
        &[("vol-r-a", &addr_a), ("vol-r-b", &addr_b)],
        LEN as u64,
        "spdk-tcp-nvmf",
    )
    .await;
    let e0 = running(
        &InstanceServiceClient::new(a.channel(3).await),
        "vol-e-0",
        "engine",
    )
    .await;
    let port0 = u16::try_from(e0.port_start).expect("port");
    (a, b, [addr_a, addr_b], port0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_second_engine_shares_the_replica_the_first_holds() {
    let test = "real_spdk_a_second_engine_shares_the_replica_the_first_holds";
    let Some(spdk) = spdk_real::spdk_dir(test) else {
        return;
    };
    let t0 = Instant::now();
    // A's engine gives the member back 5 s after the last ask or other
    // reader (B's engine asks again at its 3 s poll: it attaches within it)
    const HOLD: &str = "  replicaShareHoldSecs: 5\n";
    let (mut a, mut b, [addr_a, addr_b], port0) = engine_on_a_over_both(&spdk, HOLD).await;
    let replicas = [("vol-r-a", &addr_a), ("vol-r-b", &addr_b)];
    let lvol_a = a
        .spdk
        .bdev("talon-disk-a/vol-r-a")
        .await
        .expect("bdev_get_bdevs")
        .and_then(|b| b.uuid)
        .expect("vol-r-a's lvol");
    let r0 = raid(&a.spdk, "vol-e-0").await.expect("raid vol-e-0");
    let direct = |r: &RaidBdev, uuid: &str| {
        r.base_bdevs_list.iter().any(|b| {
            b.name.as_deref() == Some(uuid)
                || b.name.as_deref() == Some("talon-disk-a/vol-r-a")
                || b.uuid.as_deref() == Some(uuid)
        })
    };
    assert!(direct(&r0, &lvol_a), "e-0 holds its lvol directly: {r0:?}");
    let dir = a.dir.path().to_path_buf();
    let first = pattern(LEN / 2, 1);
    {
        let (spdk, dir, d) = (spdk.clone(), dir.clone(), first.clone());
        tokio::task::spawn_blocking(move || spdk_dd::dd(&spdk, &dir, port0, NQN, Some(&d), d.len()))
            .await
            .expect("write through e-0");
    }

    // Longhorn's second engine on B over the same replicas
    let inst_b = engine_create(&b, "vol-e-1", &replicas, LEN as u64, "spdk-tcp-nvmf").await;
    let e1 = running(&inst_b, "vol-e-1", "engine").await;
    let port1 = u16::try_from(e1.port_start).expect("port");
    let r0 = raid(&a.spdk, "vol-e-0").await.expect("raid vol-e-0");
    assert!(whole(&r0), "e-0 keeps both members, no rebuild: {r0:?}");
    assert!(
        members(&r0).contains(&"vol-r-an1".to_owned()),
        "e-0's member behind its export: {r0:?}"
    );
    let r1 = raid(&b.spdk, "vol-e-1").await.expect("raid vol-e-1");
    assert!(whole(&r1), "e-1 over both replicas: {r1:?}");
    let mut pa = ProxyEngineServiceClient::new(a.channel(1).await);
    let mut pb = ProxyEngineServiceClient::new(b.channel(1).await);
    assert_eq!(modes(&mut pa, "vol-e-0").await, vec![RW; 2], "e-0");
    assert_eq!(modes(&mut pb, "vol-e-1").await, vec![RW; 2], "e-1");
    let shared_at = t0.elapsed();

    // written through e-0 after the move, read back through e-1
    let second = pattern(LEN / 2, 2);
    {
        let (spdk, dir, d) = (spdk.clone(), dir.clone(), second.clone());
        tokio::task::spawn_blocking(move || spdk_dd::dd_write_at(&spdk, &dir, port0, NQN, &d, LEN / 2))
            .await
            .expect("write through e-0");
    }
    let back = {
        let (spdk, dir) = (spdk.clone(), dir.clone());
        tokio::task::spawn_blocking(move || spdk_dd::dd_on(&spdk, &dir, "127.0.0.2", port1, NQN, None, LEN))
            .await
            .expect("read through e-1")
    };
    assert!(
        back[..LEN / 2] == first[..],
        "written before the move, read through e-1"
    );
    assert!(
        back[LEN / 2..] == second[..],
        "written after the move, read through e-1"
    );

    // e-1 goes: e-0 takes its lvol back directly, its export closed a moment
    delete_engine(&inst_b, "vol-e-1").await;
    let spdk_a = a.spdk.clone();
    let lvol = lvol_a.clone();
    talon::runtime::testing::eventually("e-0 over its lvol again", WAIT, || {
        let (c, lvol) = (spdk_a.clone(), lvol.clone());
        async move {
            let r = raid(&c, "vol-e-0").await?;
            (whole(&r) && direct(&r, &lvol)).then_some(())
        }
    })
    .await;
    assert!(
        a.spdk
            .subsystem("nqn.2023-01.io.longhorn.spdk:vol-r-a")
            .await
            .expect("subsystems")
            .is_none(),
        "held directly again: not exported"
    );
    assert!(
        a.spdk.bdev("vol-r-an1").await.expect("bdevs").is_none(),
        "the loopback is detached"
    );
    assert_eq!(modes(&mut pa, "vol-e-0").await, vec![RW; 2], "e-0 after");
    let back = {
        let (spdk, dir) = (spdk.clone(), dir.clone());
        tokio::task::spawn_blocking(move || spdk_dd::dd(&spdk, &dir, port0, NQN, None, LEN))
            .await
            .expect("read through e-0")
    };
    assert!(
        back[..LEN / 2] == first[..] && back[LEN / 2..] == second[..],
        "through e-0 after"
    );
    eprintln!(
        "{test}: shared after {:.1} s, direct again after {:.1} s",
        shared_at.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    b.stop().await;
    a.stop().await;
}

/// Issue 53 (the data after a relocation): Longhorn's relocation as the real
/// manager ran it. Engine e-0 on A serves over A's and B's replicas; a
/// second engine e-1 on B shares them (B's replica, which e-0 reads, through
/// its export over loopback; A's member moved behind its export); e-0 is
/// deleted; the manager purges snapshot `s1` through e-1 (deleting a
/// snapshot whose one child is the head merges it into the head, here on
/// two heads a raid reaches through exports); data is written through e-1;
/// then B's member moves back to its lvol once nobody else reads it (the
/// hold, 8 s here). Everything written reads back through e-1 before and
/// after the move back, and data written while the member moves back (a
/// host that reconnects, as a kernel host does) reads back too. The e2e
/// failure this follows was its reader's: spdk_dd attached without
/// reconnecting and never looks at an I/O's success, so a write the move
/// back's closed export failed was dropped unseen (with such a host here, a
/// write across the move back exits 0 and is not there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_data_written_through_a_moved_engine_reads_back_after_its_member_moves_back() {
    let test = "real_spdk_data_written_through_a_moved_engine_reads_back_after_its_member_moves_back";
    let Some(spdk) = spdk_real::spdk_dir(test) else {
        return;
    };
    let t0 = Instant::now();
    // B's engine gives its member back 8 s after e-0 stops reading it:
    // the writes below begin before that and go on until after
    const HOLD: &str = "  replicaShareHoldSecs: 8\n";
    let (mut a, mut b, [addr_a, addr_b], port0) = engine_on_a_over_both(&spdk, HOLD).await;
    let replicas = [("vol-r-a", &addr_a), ("vol-r-b", &addr_b)];
    let dir = a.dir.path().to_path_buf();
    let q = LEN / 4;
    // before the snapshot, and after it (the head's own clusters)
    let first = pattern(q, 1);
    let mid = pattern(q, 2);
    {
        let (spdk, dir, d) = (spdk.clone(), dir.clone(), first.clone());
        tokio::task::spawn_blocking(move || spdk_dd::dd(&spdk, &dir, port0, NQN, Some(&d), d.len()))
            .await
            .expect("write through e-0");
    }
    let mut pa = ProxyEngineServiceClient::new(a.channel(1).await);
    longhorn_nodes::snapshot(&mut pa, "s1")
        .await
        .expect("snapshot s1 through e-0");
    {
        let (spdk, dir, d) = (spdk.clone(), dir.clone(), mid.clone());
        tokio::task::spawn_blocking(move || spdk_dd::dd_write_at(&spdk, &dir, port0, NQN, &d, q))
            .await
            .expect("write through e-0");
    }

    // the second engine on B, over the same replicas; then e-0 goes
    let inst_b = engine_create(&b, "vol-e-1", &replicas, LEN as u64, "spdk-tcp-nvmf").await;
    let e1 = running(&inst_b, "vol-e-1", "engine").await;
    let port1 = u16::try_from(e1.port_start).expect("port");
    let r1 = raid(&b.spdk, "vol-e-1").await.expect("raid vol-e-1");
    assert!(whole(&r1), "e-1 over both replicas: {r1:?}");
    assert!(
        members(&r1).contains(&"vol-r-bn1".to_owned()),
        "e-1 reaches B's replica through its export: {r1:?}"
    );
    let inst_a = InstanceServiceClient::new(a.channel(3).await);
    delete_engine(&inst_a, "vol-e-0").await;

    // the manager's purge of s1 through e-1
    remove_and_purge(&b, "vol-e-1", "s1").await;
    for n in [&a, &b] {
        assert!(
            !n.lvols().await.iter().any(|l| l.contains("-snap-")),
            "s1 purged: {:?}",
            n.lvols().await
        );
    }

    // written through e-1 while B's member is behind its export
    let third = pattern(q, 3);
    let read1 = |what: &'static str| {
        let (spdk, dir) = (spdk.clone(), dir.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                spdk_dd::dd_at_on_connecting(&spdk, &dir, "127.0.0.2", port1, NQN, None, LEN, 0)
            })
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"))
        }
    };
    {
        let (spdk, dir, d) = (spdk.clone(), dir.clone(), third.clone());
        tokio::task::spawn_blocking(move || {
            spdk_dd::dd_at_on_connecting(&spdk, &dir, "127.0.0.2", port1, NQN, Some(&d), d.len(), 2 * q)
        })
        .await
        .expect("write through e-1");
    }
    let want = |back: &[u8], what: &str| {
        for (i, (p, n)) in [(&first, "first"), (&mid, "mid"), (&third, "third")]
            .iter()
            .enumerate()
        {
            let got = &back[i * q..(i + 1) * q];
            let bad = got.iter().zip(p.iter()).filter(|(x, y)| x != y).count();
            assert!(
                bad == 0,
                "{what}: {n} ({} bytes at {}) differs in {bad} bytes",
                q,
                i * q
            );
        }
    };
    want(&read1("read through e-1").await, "through e-1 after the purge");
    let lvol_b = b
        .spdk
        .bdev("talon-disk-b/vol-r-b")
        .await
        .expect("bdev_get_bdevs")
        .and_then(|x| x.uuid)
        .expect("vol-r-b's lvol");

    // B's member back to its lvol once nobody else reads it; written
    // meanwhile, a slot of its own per write, by a host that reconnects (as
    // a kernel host does: the move closes the export for a moment)
    const SLOT: usize = 128 << 10;
    let slots = q / SLOT;
    let direct = |r: &RaidBdev, lvol: &str| {
        whole(r) && r.base_bdevs_list.iter().any(|m| m.name.as_deref() == Some(lvol))
    };
    let writer = {
        let (spdk, dir) = (spdk.clone(), dir.clone());
        let bspdk = b.spdk.clone();
        let lvol = lvol_b.clone();
        tokio::spawn(async move {
            // (slots written, writes that began before the move back and ended after it)
            let (mut n, mut across) = (0, 0);
            while n < slots {
                let before = raid(&bspdk, "vol-e-1").await.is_some_and(|r| direct(&r, &lvol));
                let (spdk, dir, d) = (spdk.clone(), dir.clone(), pattern(SLOT, 100 + n as u64));
                tokio::task::spawn_blocking(move || {
                    spdk_dd::dd_at_on_connecting(
                        &spdk,
                        &dir,
                        "127.0.0.2",
                        port1,
                        NQN,
                        Some(&d),
                        SLOT,
                        3 * q + n * SLOT,
                    )
                })
                .await
                .expect("write through e-1 while its member moves back");
                n += 1;
                if raid(&bspdk, "vol-e-1").await.is_some_and(|r| direct(&r, &lvol)) {
                    across += usize::from(!before);
                    break;
                }
            }
            (n, across)
        })
    };
    let spdk_b = b.spdk.clone();
    let lvol = lvol_b.clone();
    talon::runtime::testing::eventually("e-1 over B's lvol directly", WAIT, || {
        let (c, lvol) = (spdk_b.clone(), lvol.clone());
        async move { raid(&c, "vol-e-1").await.filter(|r| direct(r, &lvol)).map(|_| ()) }
    })
    .await;
    let (writes, across) = writer.await.expect("writer");
    let back = read1("read through e-1 after the move back").await;
    want(&back, "through e-1 after its member moved back");
    for k in 0..writes {
        let at = 3 * q + k * SLOT;
        assert!(
            back[at..at + SLOT] == pattern(SLOT, 100 + k as u64)[..],
            "write {k} of {writes} (at {at}), made while the member moved back, reads back"
        );
    }
    eprintln!(
        "{test}: {writes} writes while the member moved back ({across} begun before it and ended after); {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    b.stop().await;
    a.stop().await;
}

/// Issue 53 (the move back to node 1): Longhorn relocating the engine from B
/// back to A, as the real manager ran it. e-0 on A serves over both
/// replicas; e-1 on B shares them (A's member moved behind its export); e-0
/// goes; snapshot `s1` purged through e-1; then e-2 on A over both while e-1
/// still serves: A's replica, which e-1 reads through its export, is
/// attached by e-2 through that export too (loopback); e-1 goes; e-2 moves
/// that member back to its lvol once nobody else reads it (the hold, 8 s
/// here). Hosts that reconnect write a slot at a time through e-2 and,
/// beside them, read the first three quarters again and again, across the
/// move back; then every byte reads back through e-2, and each replica
/// alone (e-2 deleted) holds the same bytes. Before the move stopped
/// freezing the export (ANA inaccessible) ahead of closing it, a reader
/// that met the freeze got every block stale (1 run in 5): see
/// `talon::spdk::volume::share`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_data_reads_back_after_the_engine_moves_back_and_its_member_to_its_lvol() {
    let test = "real_spdk_data_reads_back_after_the_engine_moves_back_and_its_member_to_its_lvol";
    let Some(spdk) = spdk_real::spdk_dir(test) else {
        return;
    };
    let t0 = Instant::now();
    const HOLD: &str = "  replicaShareHoldSecs: 8\n";
    let (mut a, mut b, [addr_a, addr_b], port0) = engine_on_a_over_both(&spdk, HOLD).await;
    let replicas = [("vol-r-a", &addr_a), ("vol-r-b", &addr_b)];
    let dir = a.dir.path().to_path_buf();
    let q = LEN / 4;
    let dd = |ip: &'static str, port: u16, data: Option<Vec<u8>>, len: usize, offset: usize| {
        let (spdk, dir) = (spdk.clone(), dir.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                spdk_dd::dd_at_on_connecting(&spdk, &dir, ip, port, NQN, data.as_deref(), len, offset)
            })
            .await
            .expect("spdk_dd")
        }
    };
    let first = pattern(q, 1);
    dd("127.0.0.1", port0, Some(first.clone()), q, 0).await;
    let mut pa = ProxyEngineServiceClient::new(a.channel(1).await);
    longhorn_nodes::snapshot(&mut pa, "s1")
        .await
        .expect("snapshot s1 through e-0");

    // relocation to B: e-1 over both, e-0 goes, s1 purged through e-1
    let inst_b = engine_create(&b, "vol-e-1", &replicas, LEN as u64, "spdk-tcp-nvmf").await;
    let e1 = running(&inst_b, "vol-e-1", "engine").await;
    let port1 = u16::try_from(e1.port_start).expect("port");
    let inst_a = InstanceServiceClient::new(a.channel(3).await);
    delete_engine(&inst_a, "vol-e-0").await;
    remove_and_purge(&b, "vol-e-1", "s1").await;
    let second = pattern(q, 2);
    dd("127.0.0.2", port1, Some(second.clone()), q, q).await;

    // relocation back to A: e-2 over both while e-1 serves
    let inst_a = engine_create(&a, "vol-e-2", &replicas, LEN as u64, "spdk-tcp-nvmf").await;
    let e2 = running(&inst_a, "vol-e-2", "engine").await;
    let port2 = u16::try_from(e2.port_start).expect("port");
    let r2 = raid(&a.spdk, "vol-e-2").await.expect("raid vol-e-2");
    assert!(whole(&r2), "e-2 over both replicas: {r2:?}");
    assert!(
        members(&r2).contains(&"vol-r-an1".to_owned()),
        "e-2 reaches A's replica through its export, which e-1 reads: {r2:?}"
    );
    delete_engine(&inst_b, "vol-e-1").await;
    let third = pattern(q, 3);
    dd("127.0.0.1", port2, Some(third.clone()), q, 2 * q).await;
    let lvol_a = a
        .spdk
        .bdev("talon-disk-a/vol-r-a")
        .await
        .expect("bdev_get_bdevs")
        .and_then(|x| x.uuid)
        .expect("vol-r-a's lvol");
    let direct = |r: &RaidBdev, lvol: &str| {
        whole(r) && r.base_bdevs_list.iter().any(|m| m.name.as_deref() == Some(lvol))
    };
    assert!(
        !direct(&raid(&a.spdk, "vol-e-2").await.expect("raid vol-e-2"), &lvol_a),
        "e-2's member still behind its export before the hold"
    );

    // e-2's member back to its lvol; meanwhile a slot at a time written,
    // everything read back after each write
    const SLOT: usize = 128 << 10;
    let slots = q / SLOT;
    let want = |back: &[u8], upto: usize, what: &str| {
        for (i, (p, n)) in [(&first, "first"), (&second, "second"), (&third, "third")]
            .iter()
            .enumerate()
        {
            let got = &back[i * q..(i + 1) * q];
            let bad = got.iter().zip(p.iter()).filter(|(x, y)| x != y).count();
            assert!(
                bad == 0,
                "{what}: {n} ({q} bytes at {}) differs in {bad} bytes",
                i * q
            );
        }
        for k in 0..upto {
            let at = 3 * q + k * SLOT;
            let bad = back[at..at + SLOT]
                .iter()
                .zip(pattern(SLOT, 100 + k as u64).iter())
                .filter(|(x, y)| x != y)
                .count();
            assert!(
                bad == 0,
                "{what}: slot {k} of {upto} (at {at}) differs in {bad} bytes"
            );
        }
    };
    // a reader alongside, its own files: the first three quarters, again and again
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (spdk, rdir, stop) = (spdk.clone(), dir.join("reader"), stop.clone());
        let expect: Vec<u8> = [&first[..], &second[..], &third[..]].concat();
        std::fs::create_dir_all(&rdir).expect("reader dir");
        tokio::task::spawn_blocking(move || {
            let mut bad = Vec::new();
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let got = spdk_dd::dd_at_on_connecting(&spdk, &rdir, "127.0.0.1", port2, NQN, None, 3 * q, 0);
                reads += 1;
                let blocks: Vec<usize> = (0..3 * q / 65536)
                    .filter(|b| got[b * 65536..(b + 1) * 65536] != expect[b * 65536..(b + 1) * 65536])
                    .collect();
                if !blocks.is_empty() {
                    bad.push(format!("read {reads}: 64 KiB blocks {blocks:?} differ"));
                }
            }
            (reads, bad)
        })
    };
    let (mut n, mut after) = (0, 0);
    while n < slots && after < 2 {
        dd(
            "127.0.0.1",
            port2,
            Some(pattern(SLOT, 100 + n as u64)),
            SLOT,
            3 * q + n * SLOT,
        )
        .await;
        n += 1;
        let moved = raid(&a.spdk, "vol-e-2")
            .await
            .is_some_and(|r| direct(&r, &lvol_a));
        after += usize::from(moved);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (reads, bad) = reader.await.expect("reader");
    eprintln!("READER {reads} reads, bad {bad:?}");
    assert!(bad.is_empty(), "reads through e-2 across the move back: {bad:?}");
    assert!(
        after > 0,
        "e-2's member moved back to its lvol within {slots} writes"
    );
    let back = dd("127.0.0.1", port2, None, LEN, 0).await;
    want(&back, n, "through e-2 after its member moved back");

    // each replica alone
    delete_engine(&inst_a, "vol-e-2").await;
    for (node, r, lvol, at) in [
        (&a, "vol-r-a", "talon-disk-a/vol-r-a", &addr_a),
        (&b, "vol-r-b", "talon-disk-b/vol-r-b", &addr_b),
    ] {
        // through its own export where it still has one (B's: e-2 read it)
        let rnqn = format!("nqn.2023-01.io.longhorn.spdk:{r}");
        let got = if node.spdk.subsystem(&rnqn).await.expect("subsystems").is_some() {
            let (ip, port) = at.rsplit_once(':').expect("ip:port");
            let (ip, port) = (ip.to_owned(), port.parse::<u16>().expect("port"));
            let (spdk, dir) = (spdk.clone(), dir.clone());
            tokio::task::spawn_blocking(move || {
                spdk_dd::dd_at_on_connecting(&spdk, &dir, &ip, port, &rnqn, None, LEN, 0)
            })
            .await
            .expect("spdk_dd")
        } else {
            let port = free_base(&[IpAddr::from([127, 0, 0, 1])]);
            spdk_dd::read_bdev(&node.spdk, &spdk, &dir, port, lvol, LEN).await
        };
        want(&got, n, &format!("replica {r} alone"));
    }
    eprintln!(
        "{test}: {n} writes and reads through e-2 ({after} after its member moved back); {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    b.stop().await;
    a.stop().await;
}

/// Issue 53 (the rebuild after a talon killed mid-move, as the real manager
/// met it): an engine whose own node's replica is still behind its export
/// (another engine read it until lately) rebuilds the other node's replica.
/// e-0 on A over both; e-1 on B shares them (A's member of e-0 moves behind
/// its export) and goes, A's member staying there (the hold); B's replica is
/// removed from e-0, data written without it, and added again (Longhorn's
/// ReplicaAdd): the thin rebuild copies from A's replica in A's target. It
/// went through A's own SPDKService before, whose attach of B's replica
/// (`rb-vol-r-b`) took the path e-0's attach of it needs (SPDK keeps one
/// controller per path and host NQN): the switch found no `vol-r-bn1`
/// ("went before the switch") at every try. The rebuild ends with both
/// members RW, and each byte reads back through e-0 and from B's replica alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_replica_is_rebuilt_from_a_source_behind_its_export_on_the_engines_node() {
    let test = "real_spdk_a_replica_is_rebuilt_from_a_source_behind_its_export_on_the_engines_node";
    let Some(spdk) = spdk_real::spdk_dir(test) else {
        return;
    };
    let t0 = Instant::now();
    // A's member stays behind its export for the whole test
    const HOLD: &str = "  replicaShareHoldSecs: 600\n";
    let (mut a, mut b, [addr_a, addr_b], port0) = engine_on_a_over_both(&spdk, HOLD).await;
    let replicas = [("vol-r-a", &addr_a), ("vol-r-b", &addr_b)];
    let dir = a.dir.path().to_path_buf();
    let q = LEN / 4;
    let dd =
        |ip: &'static str, port: u16, nqn: &'static str, data: Option<Vec<u8>>, len: usize, offset: usize| {
            let (spdk, dir) = (spdk.clone(), dir.clone());
            async move {
                tokio::task::spawn_blocking(move || {
                    spdk_dd::dd_at_on_connecting(&spdk, &dir, ip, port, nqn, data.as_deref(), len, offset)
                })
                .await
                .expect("spdk_dd")
            }
        };
    let first = pattern(q, 1);
    dd("127.0.0.1", port0, NQN, Some(first.clone()), q, 0).await;
    let mut pa = ProxyEngineServiceClient::new(a.channel(1).await);
    longhorn_nodes::snapshot(&mut pa, "s1")
        .await
        .expect("snapshot s1 through e-0");

    // a second engine on B, then gone: A's member stays behind its export
    let inst_b = engine_create(&b, "vol-e-1", &replicas, LEN as u64, "spdk-tcp-nvmf").await;
    running(&inst_b, "vol-e-1", "engine").await;
    delete_engine(&inst_b, "vol-e-1").await;
    let second = pattern(q, 2);
    dd("127.0.0.1", port0, NQN, Some(second.clone()), q, q).await;
    let r0 = raid(&a.spdk, "vol-e-0").await.expect("raid vol-e-0");
    assert!(
        whole(&r0) && members(&r0).contains(&"vol-r-an1".to_owned()),
        "e-0 over both, A's member behind its export: {r0:?}"
    );

    // B's replica out, data written without it, then added again
    longhorn_nodes::replica_remove(&mut pa, "vol-r-b").await;
    talon::runtime::testing::eventually("vol-r-b out of e-0", WAIT, || {
        let c = a.spdk.clone();
        async move {
            let r = raid(&c, "vol-e-0").await?;
            (!members(&r).contains(&"vol-r-bn1".to_owned())).then_some(())
        }
    })
    .await;
    let third = pattern(q, 3);
    dd("127.0.0.1", port0, NQN, Some(third.clone()), q, 2 * q).await;
    longhorn_nodes::replica_add(&pa, "vol-r-b", &addr_b)
        .await
        .expect("ReplicaAdd vol-r-b");
    let rebuilt = Instant::now();
    let spdk_a = a.spdk.clone();
    talon::runtime::testing::eventually("vol-r-b rebuilt into e-0", 4 * WAIT, || {
        let (c, mut p) = (spdk_a.clone(), pa.clone());
        async move {
            let r = raid(&c, "vol-e-0").await?;
            let ok = whole(&r)
                && members(&r).contains(&"vol-r-bn1".to_owned())
                && modes(&mut p, "vol-e-0").await == vec![RW; 2];
            ok.then_some(())
        }
    })
    .await;
    let rebuild_s = rebuilt.elapsed().as_secs_f64();
    assert!(
        a.spdk.bdev("rb-vol-r-bn1").await.expect("bdevs").is_none(),
        "the copies ran in A's target, not through A's own SPDKService"
    );
    let fourth = pattern(q, 4);
    dd("127.0.0.1", port0, NQN, Some(fourth.clone()), q, 3 * q).await;
    let want: Vec<u8> = [&first[..], &second[..], &third[..], &fourth[..]].concat();
    let back = dd("127.0.0.1", port0, NQN, None, LEN, 0).await;
    assert!(
        back == want,
        "every quarter reads back through e-0 after the rebuild"
    );

    // B's replica alone, through its export (e-0 read it through it)
    let inst_a = InstanceServiceClient::new(a.channel(3).await);
    delete_engine(&inst_a, "vol-e-0").await;
    let port_b = addr_b
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .expect("B's replica port");
    let alone = dd(
        "127.0.0.2",
        port_b,
        "nqn.2023-01.io.longhorn.spdk:vol-r-b",
        None,
        LEN,
        0,
    )
    .await;
    assert!(alone == want, "B's replica alone holds every quarter");
    eprintln!(
        "{test}: rebuilt in {rebuild_s:.1} s; {:.1} s in all",
        t0.elapsed().as_secs_f64()
    );
    b.stop().await;
    a.stop().await;
}
