//! `volume_create` with `fromSnapshot` (`talon volume create <new>
//! --from-snapshot <volume>/<snapshot>`) against a real spdk_tgt
//! (`TALON_SPDK_DIR`), through the whole daemon (`talon::serve::serve`
//! in-process, its API client):
//! - a pattern written to a volume, a snapshot, later writes; the copy holds
//!   the snapshot's data (not the later writes), read back over NVMe/TCP, and
//!   is thin (its lvol allocates the snapshot's clusters, no more); its engine
//!   status shows the copy at 100 % once served;
//! - the refusals: an unknown volume or snapshot (named), a size below the
//!   source's (both named), and the snapshot's deletion while a copy reads it
//!   (a copy that cannot be placed stays at 0 %);
//! - talon stopped right after a copy was asked for, a copy cut off left
//!   behind (`<vol>-r0.rst`), talon started again: the leftover is removed and
//!   the copy made again from the start, equal to the snapshot;
//! - once the copies are whole, the snapshot may go and they keep their data.

#[path = "support/serve_daemon.rs"]
mod serve_daemon;
#[path = "support/spdk_dd.rs"]
#[allow(dead_code)]
mod spdk_dd;
#[path = "support/spdk_perf.rs"]
#[allow(dead_code)]
mod spdk_perf;
#[path = "support/spdk_real.rs"]
mod spdk_real;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spdk_real::pattern;
use talon::serve::ServeOptions;
use talon::spdk::SpdkClient;
use talon::spdk::rpc::LvolCreate;
use talon::spdk::volume::Inventory;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;
const WAIT: Duration = Duration::from_secs(120);

fn nqn(vol: &str) -> String {
    format!("{}:vol:{vol}", talon::names::NQN_PREFIX)
}

/// The allocated clusters of lvol `alias`.
async fn clusters(c: &SpdkClient, alias: &str) -> u64 {
    let inv = Inventory::load(c).await.expect("inventory");
    inv.lvols
        .get(alias)
        .unwrap_or_else(|| panic!("lvol {alias} in {:?}", inv.lvols.keys().collect::<Vec<_>>()))
        .num_allocated_clusters
}

async fn create(c: &talon::client::Client, params: Value) -> Result<Value, String> {
    c.call::<_, Value>("volume_create", params)
        .await
        .map_err(|e| e.to_string())
}

/// The volume's engine status, as `volume_get` shows it.
async fn engine(c: &talon::client::Client, vol: &str) -> Value {
    let v: Value = c
        .call("volume_get", json!({"name": vol}))
        .await
        .expect("volume_get");
    v["engine"].clone()
}

/// Waits until the volume is served with its copy whole.
async fn copied(c: &talon::client::Client, vol: &str) -> Value {
    talon::runtime::testing::eventually(&format!("volume {vol} copied and served"), WAIT, || async {
        let e = engine(c, vol).await;
        (e["state"] == "ready" && e["copy"]["percent"] == 100).then_some(e)
    })
    .await
}

/// Snapshot `name` of volume `vol`, waited for.
async fn snapshot(c: &talon::client::Client, vol: &str, name: &str) {
    let _: Value = c
        .call(
            "snapshot_create",
            json!({"volume": vol, "name": name, "wait": true}),
        )
        .await
        .unwrap_or_else(|e| panic!("snapshot_create {vol}@{name}: {e}"));
}

/// The node config: one 1 GiB disk file per name in `disks`, under `dir/disks`.
fn write_config(dir: &Path, port: u16, disks: &[&str]) {
    let mut cfg = format!(
        "node:\n  engine: v2\n  listenAddress: 127.0.0.1\n  nvmfPort: {port}\n  allowedHosts: [\"{}\"]\ndisks:\n",
        spdk_perf::HOST_NQN
    );
    for d in disks {
        cfg += &format!(
            "  {d}:\n    path: {}\n    sizeBytes: {}\n",
            dir.join(format!("disks/{d}.img")).display(),
            1u64 << 30
        );
    }
    std::fs::write(dir.join("talon.yaml"), cfg).expect("config");
}

fn opts(dir: &Path, spdk: &Path, stop_targets: bool) -> ServeOptions {
    ServeOptions {
        config: Some(dir.join("talon.yaml")),
        stop_targets_on_exit: stop_targets,
        ..serve_daemon::opts(dir, serve_daemon::real_spdk(spdk, 1024))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_volume_from_a_snapshot_is_a_thin_copy_made_again_after_a_restart() {
    let test = "real_spdk_volume_from_a_snapshot_is_a_thin_copy_made_again_after_a_restart";
    let Some(spdk) = spdk_real::spdk_dir_with(test, &["spdk_dd"]) else {
        return;
    };
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let port = spdk_real::free_port();
    write_config(dir.path(), port, &["d1"]);
    // the first talon leaves spdk_tgt serving when it stops (a restart of talon)
    let d = serve_daemon::start(opts(dir.path(), &spdk, false)).await;
    let spdk_client = SpdkClient::new(dir.path().join("run/spdk.sock"));
    let work = dir.path().join("dd");
    std::fs::create_dir_all(&work).expect("dd dir");

    create(&d.client, json!({"name": "src", "sizeBytes": SIZE, "wait": true}))
        .await
        .expect("volume_create src");
    // 12 MiB of data in two regions: what the snapshot holds
    let mut model = vec![0u8; SIZE as usize];
    for (seed, at, len) in [(1u64, 4 * MIB, 8 * MIB), (2, 40 * MIB, 4 * MIB)] {
        let data = pattern(seed, len as usize);
        spdk_dd::dd_write_at(&spdk, &work, port, &nqn("src"), &data, at as usize);
        model[at as usize..(at + len) as usize].copy_from_slice(&data);
    }
    snapshot(&d.client, "src", "s1").await;
    // written after the snapshot: no copy of s1 holds it
    spdk_dd::dd_write_at(
        &spdk,
        &work,
        port,
        &nqn("src"),
        &pattern(3, MIB as usize),
        4 * MIB as usize,
    );
    let snap_clusters = clusters(&spdk_client, "talon-d1/src-r0.s.s1").await;
    assert_eq!(snap_clusters, 12, "the snapshot holds 12 MiB of 1 MiB clusters");

    eprintln!("{:?}: written and snapshotted", started.elapsed());
    // refusals: nothing stored
    for (params, words) in [
        (
            json!({"name": "c0", "fromSnapshot": "nope/s1"}),
            vec!["c0", "\"nope\"", "not found"],
        ),
        (
            json!({"name": "c0", "fromSnapshot": "src/nope"}),
            vec!["c0", "\"nope\"", "\"src\"", "not found"],
        ),
        (
            json!({"name": "c0", "fromSnapshot": "src/s1", "size": "32MiB"}),
            vec!["c0", "src", "smaller"],
        ),
        (
            json!({"name": "c0", "fromSnapshot": "src"}),
            vec!["c0", "<volume>/<snapshot>"],
        ),
    ] {
        let e = create(&d.client, params.clone()).await.expect_err("refused");
        for w in words {
            assert!(e.contains(w), "{params}: {e:?} should name {w}");
        }
    }
    let listed: Vec<Value> = d
        .client
        .call("volume_list", json!({}))
        .await
        .expect("volume_list");
    assert_eq!(listed.len(), 1, "a refused create stores nothing: {listed:?}");

    eprintln!("{:?}: refusals", started.elapsed());
    // the copy: the snapshot's data, thin, at 100 %
    let t = Instant::now();
    let c1 = create(
        &d.client,
        json!({"name": "c1", "fromSnapshot": "src/s1", "wait": true, "timeoutSeconds": 120}),
    )
    .await
    .expect("volume_create c1 from src/s1");
    eprintln!("c1 copied and served in {:?}: {}", t.elapsed(), c1["engine"]);
    assert_eq!(c1["spec"]["copyFrom"], "src@s1", "{c1}");
    assert_eq!(
        c1["spec"]["sizeBytes"], SIZE,
        "the source's size by default: {c1}"
    );
    let e1 = copied(&d.client, "c1").await;
    assert_eq!(e1["copy"]["bytesCopied"], e1["copy"]["bytesTotal"], "{e1}");
    assert_eq!(e1["copy"]["from"], "src@s1", "{e1}");
    let read = spdk_dd::dd(&spdk, &work, port, &nqn("c1"), None, SIZE as usize);
    assert!(
        read == model,
        "c1 holds the snapshot's data, not the later writes"
    );
    assert_eq!(
        clusters(&spdk_client, "talon-d1/c1-r0").await,
        snap_clusters,
        "the copy is thin: the snapshot's clusters, no more"
    );

    eprintln!("{:?}: c1 checked", started.elapsed());
    // larger than the source: the copy's data, zeros after it
    create(
        &d.client,
        json!({"name": "c2", "fromSnapshot": "src@s1", "size": "96MiB", "wait": true, "timeoutSeconds": 120}),
    )
    .await
    .expect("volume_create c2 from src@s1, larger");
    copied(&d.client, "c2").await;
    let read = spdk_dd::dd(&spdk, &work, port, &nqn("c2"), None, (96 * MIB) as usize);
    assert!(read[..SIZE as usize] == model[..], "c2 holds the snapshot's data");
    assert!(
        read[SIZE as usize..].iter().all(|b| *b == 0),
        "c2 reads zeros past the source's size"
    );

    eprintln!("{:?}: c2 checked", started.elapsed());
    // a copy that cannot be placed (8 GiB on a 1 GiB disk, past the 500 % overcommit) stays at 0 %:
    // the snapshot it reads cannot be deleted
    create(
        &d.client,
        json!({"name": "big", "fromSnapshot": "src/s1", "size": "8GiB"}),
    )
    .await
    .expect("volume_create big");
    let e = talon::runtime::testing::eventually("big waits for a disk", WAIT, || async {
        let e = engine(&d.client, "big").await;
        (e["copy"]["percent"] == 0 && e["state"] == "creating").then_some(e)
    })
    .await;
    eprintln!("big: {e}");
    let refused = d
        .client
        .call::<_, Value>("snapshot_delete", json!({"volume": "src", "name": "s1"}))
        .await
        .expect_err("a snapshot being copied is not deleted");
    assert!(
        refused.to_string().contains("big") && refused.to_string().contains("copied"),
        "{refused}"
    );
    let _: Value = d
        .client
        .call("volume_delete", json!({"name": "big", "wait": true}))
        .await
        .expect("volume_delete big");

    eprintln!("{:?}: big refused", started.elapsed());
    // a restart: talon stopped right after the copy was asked for
    create(&d.client, json!({"name": "c3", "fromSnapshot": "src/s1"}))
        .await
        .expect("volume_create c3");
    d.stop().await;
    let inv = Inventory::load(&spdk_client).await.expect("inventory");
    let cut = if inv.lvols.contains_key("talon-d1/c3-r0") {
        "the copy had finished"
    } else {
        if !inv.lvols.contains_key("talon-d1/c3-r0.rst") {
            // what a talon stopped in the copy's first write leaves: made here
            spdk_client
                .bdev_lvol_create(&LvolCreate::thin("talon-d1", "c3-r0.rst", SIZE / MIB))
                .await
                .expect("a copy cut off");
        }
        "a copy cut off"
    };
    eprintln!("talon stopped: {cut}");
    let d = serve_daemon::start(opts(dir.path(), &spdk, true)).await;
    let e3 = copied(&d.client, "c3").await;
    eprintln!("c3 after the restart: {e3}");
    let inv = Inventory::load(&spdk_client).await.expect("inventory");
    assert!(
        !inv.lvols.keys().any(|a| a.ends_with(".rst")),
        "no copy left behind: {:?}",
        inv.lvols.keys().collect::<Vec<_>>()
    );
    let read = spdk_dd::dd(&spdk, &work, port, &nqn("c3"), None, SIZE as usize);
    assert!(read == model, "c3 holds the snapshot's data after the restart");
    assert_eq!(
        clusters(&spdk_client, "talon-d1/c3-r0").await,
        snap_clusters,
        "c3 is thin"
    );

    eprintln!("{:?}: restart checked", started.elapsed());
    // the copies are whole: the snapshot goes, they keep their data
    let _: Value = d
        .client
        .call(
            "snapshot_delete",
            json!({"volume": "src", "name": "s1", "wait": true}),
        )
        .await
        .expect("snapshot_delete once the copies are whole");
    let read = spdk_dd::dd(&spdk, &work, port, &nqn("c1"), None, SIZE as usize);
    assert!(read == model, "c1 keeps its data without the snapshot");
    d.stop().await;
    eprintln!("{test}: {:?}", started.elapsed());
}

/// Two replicas on two disks (the raid superblock in each replica's first
/// MiB): the copy of replica 0 is made inside spdk_tgt at the same offsets
/// (`mover::copy::within`), the source's superblock room zeroed after
/// (bdev_raid_create refuses a member keeping another raid's superblock),
/// replica 1 rebuilt from it; the copy reads back as the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_two_replica_volume_from_a_snapshot_of_another_is_served_with_its_data() {
    let test = "real_spdk_a_two_replica_volume_from_a_snapshot_of_another_is_served_with_its_data";
    let Some(spdk) = spdk_real::spdk_dir_with(test, &["spdk_dd"]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let port = spdk_real::free_port();
    write_config(dir.path(), port, &["d1", "d2"]);
    let d = serve_daemon::start(opts(dir.path(), &spdk, true)).await;
    let work = dir.path().join("dd");
    std::fs::create_dir_all(&work).expect("dd dir");
    create(
        &d.client,
        json!({"name": "src2", "sizeBytes": SIZE, "replicas": 2, "wait": true, "timeoutSeconds": 120}),
    )
    .await
    .expect("volume_create src2");
    let data = pattern(7, 6 * MIB as usize);
    spdk_dd::dd_write_at(&spdk, &work, port, &nqn("src2"), &data, (10 * MIB) as usize);
    snapshot(&d.client, "src2", "s1").await;
    // written after the snapshot: the copy does not hold it
    spdk_dd::dd_write_at(
        &spdk,
        &work,
        port,
        &nqn("src2"),
        &pattern(8, MIB as usize),
        (10 * MIB) as usize,
    );
    create(
        &d.client,
        json!({"name": "c4", "fromSnapshot": "src2@s1", "replicas": 2, "wait": true, "timeoutSeconds": 120}),
    )
    .await
    .expect("volume_create c4 from src2@s1");
    let e4 = copied(&d.client, "c4").await;
    assert_eq!(e4["copy"]["bytesCopied"], e4["copy"]["bytesTotal"], "{e4}");
    let read = spdk_dd::dd(&spdk, &work, port, &nqn("c4"), None, SIZE as usize);
    let mut model = vec![0u8; SIZE as usize];
    model[(10 * MIB) as usize..(16 * MIB) as usize].copy_from_slice(&data);
    assert!(read == model, "c4 holds src2@s1's data");
    // copied inside the target: replica 0 holds the snapshot's clusters (its
    // superblock room among them, zeroed, then the new raid's); the mover
    // would have written the 6 MiB of data alone
    let spdk_client = SpdkClient::new(dir.path().join("run/spdk.sock"));
    let inv = Inventory::load(&spdk_client).await.expect("inventory");
    let lvol = |name: &str| {
        inv.lvols
            .values()
            .find(|l| l.name == name)
            .unwrap_or_else(|| panic!("lvol {name}"))
            .num_allocated_clusters
    };
    assert_eq!(
        lvol("c4-r0"),
        lvol("src2-r0.s.s1"),
        "the snapshot's clusters, no more"
    );
    assert_eq!(lvol("c4-r0"), 7, "6 MiB of data and the superblock's room");
    d.stop().await;
}
