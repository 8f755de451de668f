//! The DH-HMAC-CHAP keys of hosts taken off an export leave the target's
//! keyring once nothing uses them (`keyring_file_remove_key`), and a key
//! another export still uses stays. Run on the SpdkDouble (TEST DOUBLE: it
//! models the keyring's reference counts as `lib/keyring/keyring.c` of v26.05
//! keeps them) and, with `TALON_SPDK_DIR` and as root, on a real spdk_tgt.

#[path = "support/spdk_real.rs"]
mod spdk_real;

use std::path::Path;

use talon::names::ObjectName;
use talon::spdk::SpdkClient;
use talon::spdk::double::SpdkDouble;
use talon::spdk::inventory::Inventory;
use talon::spdk::rpc::{KeyringKey, MallocCreate};
use talon::spdk::target::Target;
use talon::spdk::volume::{ExportSpec, VolumeOps};
use talon::util::nvme_auth::{self as dhchap, DhchapSecret};

use spdk_real::{Reaper, free_port, spdk_dir_as_root, target_cfg};

const H1: &str = "nqn.2025-01.io.talon.test:node:one";
const H2: &str = "nqn.2025-01.io.talon.test:node:two";
const SERVER: &str = "nqn.2025-01.io.talon.test:node:server";

async fn keys(c: &SpdkClient) -> Vec<KeyringKey> {
    c.keyring_get_keys().await.expect("keyring_get_keys")
}

/// Whether the keyring holds a live (not removed) key for `host`.
async fn has_key(c: &SpdkClient, host: &str) -> bool {
    let name = dhchap::keyring_name::<DhchapSecret>(host);
    keys(c).await.iter().any(|k| k.name == name && !k.removed)
}

async fn export(
    ops: &VolumeOps,
    vol: &ObjectName,
    replica: &str,
    bdev: &str,
    port: u16,
    hosts: &[&str],
    data: &Path,
) {
    ops.export_replica_as(
        vol,
        replica,
        bdev,
        ExportSpec {
            address: [127, 0, 0, 1].into(),
            port,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            dhchap_data_dir: Some(data.to_path_buf()),
            tls_data_dir: None,
        },
    )
    .await
    .unwrap_or_else(|e| panic!("export {replica} to {hosts:?}: {}", talon::util::error_chain(&e)));
}

/// The steps, on any target: two replica exports of one volume; hosts come
/// and go; the keyring follows.
async fn removed_hosts_keys_leave_the_keyring(c: &SpdkClient, data: &Path, port: u16) {
    for h in [H1, H2] {
        // the operator's copies of the two hosts' secrets
        dhchap::load_or_create::<DhchapSecret>(data, h).expect("host secret");
    }
    let mut bdevs = Vec::new();
    for name in ["kr-a", "kr-b"] {
        bdevs.push(
            c.bdev_malloc_create(&MallocCreate {
                name: Some(name.into()),
                num_blocks: 8 << 11,
                block_size: 512,
                uuid: None,
            })
            .await
            .expect("malloc"),
        );
    }
    let vol = ObjectName::parse("volume", "kr").expect("name");
    let ops = VolumeOps::new(c.clone()).with_host_nqn(Some(SERVER.into()));
    export(&ops, &vol, "r1", &bdevs[0], port, &[H1, H2], data).await;
    export(&ops, &vol, "r2", &bdevs[1], port, &[H1], data).await;
    assert!(
        has_key(c, H1).await && has_key(c, H2).await,
        "{:?}",
        keys(c).await
    );
    let refs = |ks: &[KeyringKey], h: &str| {
        let n = dhchap::keyring_name::<DhchapSecret>(h);
        ks.iter().find(|k| k.name == n).and_then(|k| k.refcnt)
    };
    let ks = keys(c).await;
    assert_eq!(refs(&ks, H1), Some(3), "keyring + two subsystems: {ks:?}");
    assert_eq!(refs(&ks, H2), Some(2), "keyring + one subsystem: {ks:?}");

    // H2 taken off r1, its only export: its key goes; the secret file stays
    export(&ops, &vol, "r1", &bdevs[0], port, &[H1], data).await;
    assert!(!has_key(c, H2).await, "H2's key stays: {:?}", keys(c).await);
    assert!(has_key(c, H1).await);
    assert!(
        dhchap::path::<DhchapSecret>(data, H2).expect("path").exists(),
        "the secret file is the node's credential: kept"
    );
    // H1 off r1 but still on r2: its key stays
    export(&ops, &vol, "r1", &bdevs[0], port, &[], data).await;
    assert!(has_key(c, H1).await, "a key r2 still uses was removed");
    assert_eq!(refs(&keys(c).await, H1), Some(2));
    // H2 back: registered again from its file
    export(&ops, &vol, "r1", &bdevs[0], port, &[H2], data).await;
    assert!(has_key(c, H2).await, "H2 comes back with its key");

    // the volume deleted: its exports go, and every key they held
    let inv = Inventory::load(c).await.expect("inventory");
    ops.delete(&inv, &vol).await.expect("delete");
    let ks = keys(c).await;
    assert!(
        !ks.iter().any(|k| k.name.starts_with("talon-dhchap-")),
        "keys left after the delete: {ks:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_removed_hosts_keys_leave_the_keyring() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = SpdkDouble::start(dir.path().join("spdk.sock"))
        .await
        .expect("double");
    let c = SpdkClient::new(t.socket());
    removed_hosts_keys_leave_the_keyring(&c, &dir.path().join("data"), 4460).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_removed_hosts_keys_leave_the_keyring() {
    let test = "real_spdk_removed_hosts_keys_leave_the_keyring";
    let Some(spdk) = spdk_dir_as_root(test) else {
        return;
    };
    let d = tempfile::tempdir().expect("tempdir");
    let cfg = target_cfg(&d.path().join("run"), &spdk, 1024);
    let t = Target::start(&cfg).await.expect("spdk_tgt");
    let _r = Reaper::new(&t, &cfg);
    let c = SpdkClient::new(cfg.socket());
    let port = free_port();
    removed_hosts_keys_leave_the_keyring(&c, &d.path().join("data"), port).await;
}
