//! DH-HMAC-CHAP (`NodeConfig.nvmeDhchap`) and NVMe/TCP TLS with PSKs
//! (`NodeConfig.replicaTls`) between two real spdk_tgt v26.05
//! (`TALON_SPDK_DIR`): one serves a replica whose only host must
//! authenticate with its secret from talon's secret files (SPDK's file
//! keyring), the other attaches it as talon's engine does. The right secret
//! attaches; no key, another secret, or a host listed without its secret are
//! refused.

#[path = "support/spdk_real.rs"]
mod spdk_real;

use std::path::{Path, PathBuf};
use std::time::Duration;

use talon::names::ObjectName;
use talon::spdk::SpdkClient;
use talon::spdk::rpc::{ByName, MallocCreate};
use talon::spdk::target::Target;
use talon::spdk::volume::{ExportSpec, VolumeOps};
use talon::util::nvme_auth::{self as dhchap, DhchapSecret, Secret, TlsPsk};

use spdk_real::{Reaper, free_port, spdk_dir_as_root, target_cfg};

const MIB: u64 = 1 << 20;
const ENGINE: &str = "nqn.2025-01.io.talon.test:node:engine";
const SERVER: &str = "nqn.2025-01.io.talon.test:node:server";

/// One talon node: its spdk_tgt, the reaper that kills it if the test ends
/// early, a client, and its `VolumeOps` with the node's host NQN.
struct Node(Target, Reaper, SpdkClient, VolumeOps);

async fn node(run: &Path, spdk: &Path, nqn: &str, what: &str) -> Node {
    let cfg = target_cfg(run, spdk, 1024);
    let t = Target::start(&cfg).await.expect(what);
    let reap = Reaper::new(&t, &cfg);
    let c = SpdkClient::new(cfg.socket());
    let ops = VolumeOps::new(c.clone()).with_host_nqn(Some(nqn.into()));
    Node(t, reap, c, ops)
}

/// Two spdk_tgt under `d` as two talon nodes: `a` serves (as [`SERVER`]) its
/// 32 MiB malloc bdev, whose name comes third; `b` attaches as [`ENGINE`].
async fn two_nodes(d: &Path, spdk: &Path) -> (Node, Node, String) {
    let a = node(&d.join("run-a"), spdk, SERVER, "spdk_tgt a").await;
    let b = node(&d.join("run-b"), spdk, ENGINE, "spdk_tgt b").await;
    let bdev =
        a.2.bdev_malloc_create(&MallocCreate {
            name: Some("served".into()),
            num_blocks: 32 * MIB / 512,
            block_size: 512,
            uuid: None,
        })
        .await
        .expect("malloc");
    (a, b, bdev)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_dhchap_replica_needs_the_engine_nodes_secret() {
    let test = "real_spdk_dhchap_replica_needs_the_engine_nodes_secret";
    let Some(spdk) = spdk_dir_as_root(test) else {
        return;
    };
    let d = tempfile::tempdir().expect("tempdir");
    let (data_a, data_b) = (d.path().join("data-a"), d.path().join("data-b"));
    let (Node(ta, _ra, ca, oa), Node(tb, _rb, cb, ob), bdev) = two_nodes(d.path(), &spdk).await;
    let vol = ObjectName::parse("volume", "dh").expect("name");
    let port = free_port();
    let export = ExportSpec {
        address: [127, 0, 0, 1].into(),
        port,
        hosts: vec![ENGINE.to_string()],
        dhchap_data_dir: Some(data_a.clone()),
        tls_data_dir: None,
    };

    // the engine node's secret, made by talon there, copied to the serving node
    let mine = dhchap::load_or_create::<DhchapSecret>(&data_b, ENGINE).expect("engine secret");
    std::fs::create_dir_all(dhchap::dir::<DhchapSecret>(&data_a)).expect("dir");
    let copy = dhchap::path::<DhchapSecret>(&data_a, ENGINE).expect("path");
    std::fs::write(&copy, format!("{}\n", mine.expose())).expect("copy");
    let nqn = oa
        .export_replica_as(&vol, "r1", &bdev, export.clone())
        .await
        .expect("export with DH-HMAC-CHAP");
    let sub = ca.subsystem(&nqn).await.expect("list").expect("subsystem");
    let key = dhchap::keyring_name::<DhchapSecret>(ENGINE);
    assert_eq!(sub.hosts.len(), 1);
    assert_eq!(sub.hosts[0].nqn, ENGINE);
    assert_eq!(sub.hosts[0].dhchap_key.as_deref(), Some(key.as_str()));
    assert!(!sub.allow_any_host);

    // no key: the target asks for authentication, the attach fails
    let e = ob
        .attach_replica("dh", "nokey", [127, 0, 0, 1].into(), port, &nqn, None, None)
        .await
        .expect_err("no key: refused");
    eprintln!("no key: {}", talon::util::error_chain(&e));
    // another secret under the engine node's name
    let other = d.path().join("data-other");
    dhchap::load_or_create::<DhchapSecret>(&other, ENGINE).expect("another secret");
    let e = ob
        .attach_replica(
            "dh",
            "wrong",
            [127, 0, 0, 1].into(),
            port,
            &nqn,
            Some(&other),
            None,
        )
        .await
        .expect_err("another secret: refused");
    let m = talon::util::error_chain(&e);
    assert!(m.contains("Input/output error"), "{m}");
    assert!(!m.contains(mine.expose()), "the secret is not in errors");
    cb.keyring_file_remove_key(&ByName::new(key.clone()))
        .await
        .expect("forget the wrong key");
    assert!(
        ca.nvmf_subsystem_get_controllers(&talon::spdk::rpc::ByNqn { nqn: nqn.clone() })
            .await
            .expect("controllers")
            .is_empty(),
        "nobody connected"
    );

    // the engine node's own secret: attached
    let got = ob
        .attach_replica(
            "dh",
            "right",
            [127, 0, 0, 1].into(),
            port,
            &nqn,
            Some(&data_b),
            None,
        )
        .await
        .expect("attach with the engine node's secret");
    let b = cb.bdev(&got).await.expect("get").expect("bdev");
    assert_eq!(b.size_bytes(), 32 * MIB);
    let connected = ca
        .nvmf_subsystem_get_controllers(&talon::spdk::rpc::ByNqn { nqn: nqn.clone() })
        .await
        .expect("controllers");
    assert_eq!(connected.len(), 1);
    assert_eq!(connected[0].hostnqn, ENGINE);
    cb.bdev_nvme_detach_controller(&ByName::new("right"))
        .await
        .expect("detach");

    // rotation: a new secret in both files is used at the next authentication
    // (the file keyring reads the file at every use)
    let new = DhchapSecret::generate().expect("random");
    std::fs::write(&copy, format!("{}\n", new.expose())).expect("rotate on the server");
    let e = ob
        .attach_replica(
            "dh",
            "stale",
            [127, 0, 0, 1].into(),
            port,
            &nqn,
            Some(&data_b),
            None,
        )
        .await
        .expect_err("the old secret after a rotation: refused");
    eprintln!("old secret after rotation: {}", talon::util::error_chain(&e));
    std::fs::write(
        dhchap::path::<DhchapSecret>(&data_b, ENGINE).expect("p"),
        format!("{}\n", new.expose()),
    )
    .expect("rotate on the engine node");
    ob.attach_replica(
        "dh",
        "rotated",
        [127, 0, 0, 1].into(),
        port,
        &nqn,
        Some(&data_b),
        None,
    )
    .await
    .expect("the new secret on both sides");
    cb.bdev_nvme_detach_controller(&ByName::new("rotated"))
        .await
        .expect("detach");

    // without DH-HMAC-CHAP the host's key is cleared: a keyless attach works again
    oa.export_replica_as(
        &vol,
        "r1",
        &bdev,
        ExportSpec {
            dhchap_data_dir: None,
            ..export
        },
    )
    .await
    .expect("export without DH-HMAC-CHAP");
    let sub = ca.subsystem(&nqn).await.expect("list").expect("subsystem");
    assert_eq!(sub.hosts[0].dhchap_key, None);
    ob.attach_replica("dh", "plain", [127, 0, 0, 1].into(), port, &nqn, None, None)
        .await
        .expect("no authentication asked");
    let _ = cb.bdev_nvme_detach_controller(&ByName::new("plain")).await;
    tb.stop(Duration::from_secs(5)).await.expect("stop b");
    ta.stop(Duration::from_secs(5)).await.expect("stop a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_tls_replica_needs_the_engine_nodes_psk() {
    let test = "real_spdk_tls_replica_needs_the_engine_nodes_psk";
    let Some(spdk) = spdk_dir_as_root(test) else {
        return;
    };
    let d = tempfile::tempdir().expect("tempdir");
    let (data_a, data_b) = (d.path().join("data-a"), d.path().join("data-b"));
    let (Node(ta, _ra, ca, oa), Node(tb, _rb, cb, ob), bdev) = two_nodes(d.path(), &spdk).await;
    let vol = ObjectName::parse("volume", "tl").expect("name");
    let (plain_port, tls_port) = (free_port(), free_port());
    // first plain, as before TLS was turned on
    let plain = ExportSpec {
        address: [127, 0, 0, 1].into(),
        port: plain_port,
        hosts: vec![ENGINE.to_string()],
        dhchap_data_dir: None,
        tls_data_dir: None,
    };
    let nqn = oa
        .export_replica_as(&vol, "r1", &bdev, plain.clone())
        .await
        .expect("plain export");
    // TLS on: the engine node's PSK (made there) copied to the serving node
    let mine = dhchap::load_or_create::<TlsPsk>(&data_b, ENGINE).expect("engine psk");
    dhchap::store(&data_a, ENGINE, &mine).expect("copy");
    let tls = ExportSpec {
        port: tls_port,
        tls_data_dir: Some(data_a.clone()),
        ..plain.clone()
    };
    oa.export_replica_as(&vol, "r1", &bdev, tls.clone())
        .await
        .expect("TLS export");
    let sub = ca.subsystem(&nqn).await.expect("list").expect("subsystem");
    let ports: Vec<_> = sub
        .listen_addresses
        .iter()
        .filter_map(|l| l.trsvcid.clone())
        .collect();
    assert_eq!(ports, vec![tls_port.to_string()], "only the TLS port is left");
    assert_eq!(sub.hosts.len(), 1);

    let at = |name: &'static str, port: u16, tls: Option<PathBuf>| {
        let (ob, nqn) = (ob.clone(), nqn.clone());
        async move {
            ob.attach_replica(
                "tl",
                name,
                [127, 0, 0, 1].into(),
                port,
                &nqn,
                None,
                tls.as_deref(),
            )
            .await
        }
    };
    // no TLS: the handshake is refused
    let e = at("notls", tls_port, None)
        .await
        .expect_err("plain connect to the TLS port");
    eprintln!("no TLS: {}", talon::util::error_chain(&e));
    // the old plain port is gone
    at("oldport", plain_port, None)
        .await
        .expect_err("the plain port is closed");
    // another PSK under the engine node's name
    let other = d.path().join("data-other");
    dhchap::load_or_create::<TlsPsk>(&other, ENGINE).expect("another psk");
    let e = at("wrong", tls_port, Some(other))
        .await
        .expect_err("another PSK: refused");
    let m = talon::util::error_chain(&e);
    assert!(!m.contains(mine.expose()), "the PSK is not in errors");
    cb.keyring_file_remove_key(&ByName::new(dhchap::keyring_name::<TlsPsk>(ENGINE)))
        .await
        .expect("forget the wrong key");
    assert!(
        ca.nvmf_subsystem_get_controllers(&talon::spdk::rpc::ByNqn { nqn: nqn.clone() })
            .await
            .expect("controllers")
            .is_empty(),
        "nobody connected"
    );
    // the engine node's own PSK: attached over TLS
    let got = at("right", tls_port, Some(data_b.clone()))
        .await
        .expect("attach with the engine node's PSK");
    assert_eq!(
        cb.bdev(&got).await.expect("get").expect("bdev").size_bytes(),
        32 * MIB
    );
    let connected = ca
        .nvmf_subsystem_get_controllers(&talon::spdk::rpc::ByNqn { nqn: nqn.clone() })
        .await
        .expect("controllers");
    assert_eq!(connected.len(), 1);
    assert_eq!(connected[0].hostnqn, ENGINE);
    // idempotent while TLS stays on (hosts are not listed again)
    oa.export_replica_as(&vol, "r1", &bdev, tls).await.expect("again");
    assert_eq!(
        ca.nvmf_subsystem_get_controllers(&talon::spdk::rpc::ByNqn { nqn: nqn.clone() })
            .await
            .expect("controllers")
            .len(),
        1,
        "the connection stays"
    );
    cb.bdev_nvme_detach_controller(&ByName::new("right"))
        .await
        .expect("detach");
    assert!(<TlsPsk as Secret>::parse(mine.expose()).is_ok());
    tb.stop(Duration::from_secs(5)).await.expect("stop b");
    ta.stop(Duration::from_secs(5)).await.expect("stop a");
}
