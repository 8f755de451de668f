//! Backups of a V2 volume on a real spdk_tgt (`TALON_SPDK_DIR`) through
//! `talon serve`, to a real S3 server (s3s-fs on loopback): a 256 MiB volume
//! of two replicas written through its NVMe-oF export (spdk_dd), backed up
//! in full and then incrementally (only the changed 2 MiB blocks read and
//! uploaded), each backup restored and checksummed against what was
//! written; a restored image copied into a thin lvol on the same target
//! (`spdk::volume::from_file`) reads back the same; and a standby (DR)
//! volume made from the first backup, its data streamed into thin lvols
//! (no file on the data dir), keeps them over a restart, follows the
//! second and the third (fetching and writing only their changed blocks,
//! the third's blocks that became zeros included, read back from its
//! lvols), holds no backup once its follow of a fourth fails on a damaged
//! block and, that backup deleted and the third restored in full again,
//! activated, serves the third from those lvols, now its replicas.

#[path = "support/s3_server.rs"]
#[allow(dead_code)]
mod s3_server;
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

use std::os::unix::fs::FileExt;
use std::path::Path;

use serde_json::{Value, json};
use spdk_real::pattern;
use talon::backupstore::{Credentials, Progress, Store, ops};
use talon::serve::ServeOptions;
use talon::spdk::SpdkClient;

const MIB: u64 = 1 << 20;
// 256 MiB: room for the 8 written regions and the 2 MiB blocks each backup
// adds between them; every copy, read and checksum below is of the whole size
const SIZE: u64 = 256 * MIB;

fn sha(path: &Path, len: u64) -> String {
    let f = std::fs::File::open(path).expect("open");
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 8 << 20];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], at).expect("read_exact_at");
        ctx.update(&buf[..n]);
        at += n as u64;
    }
    format!("{:?}", ctx.finish())
}

const TARGET: &str = "s3://backups@us-east-1/talon/";

async fn snapshot(c: &talon::client::Client, name: &str) {
    let _: Value = c
        .call(
            "snapshot_create",
            json!({"volume": "vol", "name": name, "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect("snapshot_create");
}

/// The S3 server's secret, by its name in the node's backupSecretsDir.
const SECRET: &str = "s3";

async fn backup(c: &talon::client::Client, name: &str, snap: &str) -> Value {
    let v: Value = c
        .call(
            "backup_create",
            json!({"name": name, "volume": "vol", "snapshot": snap, "target": TARGET,
                   "credentialSecret": SECRET, "wait": true, "timeoutSeconds": 600}),
        )
        .await
        .unwrap_or_else(|e| panic!("backup_create {name}: {e}"));
    v["status"].clone()
}

/// Nothing is staged under the data dir's `restore` (none of the candidates
/// `dirs` holds a file there).
fn nothing_staged(dirs: &[std::path::PathBuf]) {
    for d in dirs {
        let staged: Vec<_> = std::fs::read_dir(d.join("restore"))
            .map(|r| r.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(staged.is_empty(), "staged on the data dir: {staged:?}");
    }
}

/// Standby volume `dr`'s lvols (`dr-r<k>.dr`): (alias, uuid), by alias.
async fn standby_lvols(c: &SpdkClient) -> Vec<(String, String)> {
    let inv = talon::spdk::volume::Inventory::load(c).await.expect("inventory");
    let mut out: Vec<_> = inv
        .lvols
        .values()
        .filter(|l| l.name.starts_with("dr-r") && l.name.ends_with(".dr"))
        .map(|l| (l.alias.clone(), l.uuid.clone()))
        .collect();
    out.sort();
    out
}

/// The engine status of standby volume `vol` once it holds `backup` (bounded).
async fn standby_engine(c: &talon::client::Client, vol: &str, backup: &str) -> Value {
    talon::runtime::testing::eventually(
        &format!("standby volume {vol} holding {backup}"),
        std::time::Duration::from_secs(300),
        || async {
            let v: Value = c.call("volume_get", json!({"name": vol})).await.ok()?;
            let e = &v["engine"];
            (e["restoredBackup"] == backup).then(|| e.clone())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_backups_of_a_volume_round_trip_through_s3_full_then_incremental() {
    let test = "real_spdk_backups_of_a_volume_round_trip_through_s3_full_then_incremental";
    let Some(spdk) = spdk_real::spdk_dir_with(test, &["spdk_dd"]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let port = spdk_real::free_port();
    let mut y = format!(
        "node:\n  engine: v2\n  listenAddress: 127.0.0.1\n  nvmfPort: {port}\n  allowedHosts: [\"{}\"]\n  \
         backupSecretsDir: {}\ndisks:\n",
        spdk_perf::HOST_NQN,
        dir.path().join("secrets").display()
    );
    for d in ["d1", "d2"] {
        y.push_str(&format!(
            "  {d}:\n    path: {}\n    sizeBytes: {}\n",
            dir.path().join(format!("disks/{d}.img")).display(),
            3u64 << 30
        ));
    }
    let config = dir.path().join("talon.yaml");
    std::fs::write(&config, y).expect("write");
    let opts = ServeOptions {
        config: Some(config),
        stop_targets_on_exit: true,
        ..serve_daemon::opts(dir.path(), serve_daemon::real_spdk(&spdk, 2048))
    };
    let mut d = serve_daemon::start(opts.clone()).await;
    let spdk_client = SpdkClient::new(dir.path().join("run/spdk.sock"));
    let server = s3_server::S3Server::start(&dir.path().join("s3"), "backups").await;
    std::fs::create_dir_all(dir.path().join("secrets")).expect("secrets");
    let secret = dir.path().join("secrets").join(SECRET);
    std::fs::write(&secret, server.secret_manifest(s3_server::SECRET_KEY)).expect("secret_manifest");
    let target = TARGET;

    let _: Value = d
        .client
        .call(
            "volume_create",
            json!({"name": "vol", "sizeBytes": SIZE, "replicas": 2, "wait": true, "timeoutSeconds": 180}),
        )
        .await
        .expect("volume_create");
    let nqn = format!("{}:vol:vol", talon::names::NQN_PREFIX);

    // what the volume holds, kept beside it: 128 MiB in 8 regions of 16 MiB, 14 MiB apart
    let model = dir.path().join("model.img");
    std::fs::File::create(&model)
        .expect("create")
        .set_len(SIZE)
        .expect("set_len");
    let m = std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .expect("open");
    let work = dir.path().join("dd");
    std::fs::create_dir_all(&work).expect("create_dir_all");
    for i in 0..8u64 {
        let at = i * 30 * MIB + 4 * MIB;
        let data = pattern(i + 1, 16 * MIB as usize);
        spdk_dd::dd_write_at(&spdk, &work, port, &nqn, &data, at as usize);
        m.write_all_at(&data, at).expect("write_all_at");
    }
    snapshot(&d.client, "s1").await;
    let s1 = backup(&d.client, "backup-one", "s1").await;
    eprintln!("backup-one: {s1}");
    assert_eq!(s1["state"], "completed", "{s1}");
    assert_eq!(s1["incremental"], false, "{s1}");
    assert_eq!(s1["blocksUploaded"], 64, "128 MiB of distinct data: {s1}");
    let at_s1 = dir.path().join("model-s1.img");
    std::fs::copy(&model, &at_s1).expect("copy");

    // a standby (DR) volume of two replicas from backup-one: held, not served
    let dr: Value = d
        .client
        .call(
            "backup_restore",
            json!({"backup": "backup-one", "backupVolume": "vol", "target": TARGET,
                   "credentialSecret": SECRET, "volume": "dr",
                   "replicas": 2, "standby": true, "pollSeconds": 1, "wait": true,
                   "timeoutSeconds": 600}),
        )
        .await
        .expect("backup_restore of a standby volume");
    assert_eq!(
        (
            dr["engine"]["state"].as_str(),
            dr["engine"]["restoredBackup"].as_str()
        ),
        (Some("standby"), Some("backup-one")),
        "{dr}"
    );
    assert!(
        dr["replicas"].as_array().is_some_and(|r| r.is_empty()),
        "no replica yet: {dr}"
    );
    for (method, params) in [
        ("volume_attach", json!({"name": "dr"})),
        ("snapshot_create", json!({"volume": "dr", "name": "s"})),
    ] {
        let e = d
            .client
            .call::<_, Value>(method, params)
            .await
            .expect_err("a standby volume is not served");
        assert!(e.to_string().contains("standby (DR) volume"), "{method}: {e}");
    }
    // its data in two thin lvols, nothing on the data dir but the record of what they hold
    let data_dirs = [dir.path().join("data"), dir.path().to_owned()];
    nothing_staged(&data_dirs);
    let record = data_dirs
        .iter()
        .map(|d| d.join("standby/dr.json"))
        .find(|p| p.exists())
        .expect("the standby's record");
    let lvols = standby_lvols(&spdk_client).await;
    assert_eq!(lvols.len(), 2, "one lvol a replica: {lvols:?}");
    // talon restarted (spdk_tgt too): the standby takes its lvols up again, not restored anew
    d.stop().await;
    d = serve_daemon::start(opts.clone()).await;
    let e = standby_engine(&d.client, "dr", "backup-one").await;
    assert_eq!(e["state"], "standby", "{e}");
    assert_eq!(
        standby_lvols(&spdk_client).await,
        lvols,
        "the standby's lvols are not made again after a restart"
    );

    // 3 MiB over two blocks between the first two regions changes; the second backup
    // reads and uploads those two only
    let change = pattern(99, 3 * MIB as usize);
    spdk_dd::dd_write_at(&spdk, &work, port, &nqn, &change, (21 * MIB) as usize);
    m.write_all_at(&change, 21 * MIB).expect("write_all_at");
    drop(m);
    snapshot(&d.client, "s2").await;
    let s2 = backup(&d.client, "backup-two", "s2").await;
    eprintln!("backup-two: {s2}");
    assert_eq!(s2["state"], "completed", "{s2}");
    assert_eq!(s2["incremental"], true, "{s2}");
    assert_eq!(
        (s2["blocksRead"].as_u64(), s2["blocksUploaded"].as_u64()),
        (Some(2), Some(2)),
        "{s2}"
    );

    // the standby follows: backup-two applied to what it holds
    let e = standby_engine(&d.client, "dr", "backup-two").await;
    eprintln!("standby after backup-two: {e}");
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("fetched 2 of 66 blocks")),
        "only backup-two's 2 changed blocks fetched: {e}"
    );
    let at_s2 = dir.path().join("model-s2.img");
    std::fs::copy(&model, &at_s2).expect("copy");

    // a third backup (1 MiB in a block no backup mapped, a block of data zeroed whole
    // and one half zeroed): two blocks uploaded, the zeroed one left out of its map (a
    // hole, as Longhorn's incremental restore zeroes a block the last backup mapped and
    // the new one does not); the standby follows it too
    let third = pattern(7, MIB as usize);
    let m = std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .expect("open");
    for (at, data) in [
        (232 * MIB, third),
        (4 * MIB, vec![0u8; 2 * MIB as usize]),
        (10 * MIB, vec![0u8; MIB as usize]),
    ] {
        spdk_dd::dd_write_at(&spdk, &work, port, &nqn, &data, at as usize);
        m.write_all_at(&data, at).expect("write_all_at");
    }
    drop(m);
    snapshot(&d.client, "s3").await;
    let s3 = backup(&d.client, "backup-three", "s3").await;
    assert_eq!(
        (
            s3["state"].as_str(),
            s3["incremental"].as_bool(),
            s3["blocksUploaded"].as_u64()
        ),
        (Some("completed"), Some(true), Some(2)),
        "{s3}"
    );
    let e = standby_engine(&d.client, "dr", "backup-three").await;
    eprintln!("standby after backup-three: {e}");
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("fetched 2 of 66 blocks")),
        "only backup-three's 2 changed blocks fetched: {e}"
    );
    // both lvols hold backup-three where it changed: its zeros too
    nothing_staged(&data_dirs);
    let held: Value = serde_json::from_slice(&std::fs::read(&record).expect("record")).expect("json");
    let room = held["dataOffset"].as_u64().expect("dataOffset");
    let model_at = |at: u64, len: u64| {
        let mut b = vec![0u8; len as usize];
        std::fs::File::open(&model)
            .and_then(|f| f.read_exact_at(&mut b, at))
            .expect("read the model");
        b
    };
    for (alias, _) in &lvols {
        let s = talon::spdk::volume::mover::Session::open(
            &spdk_client,
            alias,
            talon::spdk::volume::mover::Purpose::Test,
            8,
        )
        .await
        .expect("open a standby lvol");
        for (at, len) in [(0, 24 * MIB), (232 * MIB, 2 * MIB)] {
            let got = s.read(room + at, len as usize).await.expect("read");
            assert!(
                got == model_at(at, len),
                "{alias} holds backup-three at {at}..{}",
                at + len
            );
        }
        s.close().await.expect("close");
    }

    // a fourth backup whose block at 244 MiB is damaged in the store (planted before the
    // backup, which finds the block there and does not upload it): the standby's follow
    // fails part way, and the standby says it holds no backup whole, not backup-three
    let fourth = pattern(11, 6 * MIB as usize);
    let bad = talon::backupstore::format::checksum(&fourth[4 * MIB as usize..]);
    let planted = dir
        .path()
        .join("s3/backups/talon")
        .join(talon::backupstore::format::block_path("vol", &bad));
    std::fs::create_dir_all(planted.parent().expect("parent")).expect("create_dir_all");
    std::fs::write(&planted, pattern(12, 4096)).expect("plant a damaged block");
    spdk_dd::dd_write_at(&spdk, &work, port, &nqn, &fourth, (240 * MIB) as usize);
    snapshot(&d.client, "s4").await;
    let s4 = backup(&d.client, "backup-four", "s4").await;
    assert_eq!(
        (s4["state"].as_str(), s4["blocksUploaded"].as_u64()),
        (Some("completed"), Some(2)),
        "the damaged block was found in the store: {s4}"
    );
    let e = talon::runtime::testing::eventually(
        "the standby's follow to backup-four failed",
        std::time::Duration::from_secs(300),
        || async {
            let v: Value = d.client.call("volume_get", json!({"name": "dr"})).await.ok()?;
            let e = &v["engine"];
            e["message"]
                .as_str()
                .is_some_and(|m| m.contains("holds no whole backup"))
                .then(|| e.clone())
        },
    )
    .await;
    eprintln!("standby after backup-four failed: {e}");
    assert_eq!(e["restoredBackup"], Value::Null, "{e}");
    // backup-four deleted: the standby restores backup-three in full again
    let _: Value = d
        .client
        .call(
            "backup_delete",
            json!({"name": "backup-four", "fromStore": true, "wait": true}),
        )
        .await
        .expect("backup_delete backup-four");
    let e = standby_engine(&d.client, "dr", "backup-three").await;
    eprintln!("standby after backup-four was deleted: {e}");

    // activated, it serves backup-three from its lvols, now its replicas
    let v: Value = d
        .client
        .call(
            "volume_activate",
            json!({"name": "dr", "wait": true, "timeoutSeconds": 600}),
        )
        .await
        .expect("volume_activate");
    assert_eq!(v["engine"]["state"], "ready", "{v}");
    assert_eq!(v["spec"]["standby"], Value::Null, "activated: {v}");
    let dr_nqn = format!("{}:vol:dr", talon::names::NQN_PREFIX);
    let data = spdk_dd::dd(&spdk, &work, port, &dr_nqn, None, SIZE as usize);
    let f = dir.path().join("dr-volume.img");
    std::fs::write(&f, &data).expect("write");
    drop(data);
    assert_eq!(
        sha(&f, SIZE),
        sha(&model, SIZE),
        "the activated standby volume reads backup-three"
    );
    std::fs::remove_file(&f).expect("remove_file");
    assert!(
        standby_lvols(&spdk_client).await.is_empty() && !record.exists(),
        "the standby's lvols are its replicas and its record is removed once it is served"
    );
    nothing_staged(&data_dirs);
    let e = d
        .client
        .call::<_, Value>("volume_activate", json!({"name": "dr"}))
        .await
        .expect_err("activated twice");
    assert!(e.to_string().contains("not a standby volume"), "{e}");
    let _: Value = d
        .client
        .call(
            "volume_delete",
            json!({"name": "dr", "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect("volume_delete");

    // both restore to what was written, checked end to end
    let store =
        Store::open(target, &Credentials::from_secret(&secret).expect("from_secret")).expect("unwrap");
    let p = Progress::default();
    for (name, expect) in [
        ("backup-one", &at_s1),
        ("backup-two", &at_s2),
        ("backup-three", &model),
    ] {
        let out = dir.path().join(format!("{name}.img"));
        let r = ops::restore_to_file(&store, "vol", name, &out, 0, &p)
            .await
            .expect("restore_to_file");
        assert_eq!(r.size, SIZE);
        assert_eq!(sha(&out, SIZE), sha(expect, SIZE), "restore of {name}");
    }
    let v = ops::volume(&store, "vol").await.expect("volume").expect("unwrap");
    assert_eq!(
        (v.last_backup_name.as_str(), v.size, v.data_engine.as_str()),
        ("backup-three", SIZE, "v2")
    );

    // an idle volume's backup reads nothing: s5 over backup-three (s4's write between: read
    // side by side, its 3 changed blocks taken), then s6 with nothing written since s5
    snapshot(&d.client, "s5").await;
    let s5 = backup(&d.client, "backup-five", "s5").await;
    assert_eq!(
        (
            s5["state"].as_str(),
            s5["incremental"].as_bool(),
            s5["blocksRead"].as_u64()
        ),
        (Some("completed"), Some(true), Some(3)),
        "{s5}"
    );
    snapshot(&d.client, "s6").await;
    let s6 = backup(&d.client, "backup-six", "s6").await;
    assert_eq!(
        (
            s6["state"].as_str(),
            s6["incremental"].as_bool(),
            s6["blocksRead"].as_u64(),
            s6["blocksUploaded"].as_u64()
        ),
        (Some("completed"), Some(true), Some(0), Some(0)),
        "{s6}"
    );
    let map = |name: &'static str| {
        let store = &store;
        async move {
            ops::backup(store, "vol", name)
                .await
                .expect("backup cfg")
                .blocks
                .into_iter()
                .map(|b| (b.offset, b.checksum))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        map("backup-six").await,
        map("backup-five").await,
        "the same block map"
    );

    // a restored image into a thin lvol of the same target reads back the same
    let restored = dir.path().join("backup-two.img");
    let lvol = "talon-d1/restore-check";
    spdk_client
        .bdev_lvol_create(&talon::spdk::rpc::LvolCreate::thin(
            "talon-d1",
            "restore-check",
            SIZE / MIB,
        ))
        .await
        .expect("thin lvol");
    talon::spdk::volume::mover::fill_from_file(
        &spdk_client,
        &restored,
        lvol,
        talon::spdk::volume::mover::DEPTH,
    )
    .await
    .expect("the mover fills the lvol from the restored image");
    let _ = spdk_client
        .bdev_lvol_snapshot(&talon::spdk::rpc::LvolSnapshot {
            lvol_name: lvol.into(),
            snapshot_name: "restore-check-snap".into(),
        })
        .await
        .expect("snapshot of the restored lvol");
    let inv = talon::spdk::volume::Inventory::load(&spdk_client)
        .await
        .expect("load");
    let chain = talon::spdk::volume::to_file::Chain::of(&inv, "talon-d1/restore-check-snap").expect("chain");
    let back = dir.path().join("back.img");
    talon::spdk::volume::to_file::copy_to_file(&spdk_client, &chain, &back, "restore-check-dst")
        .await
        .expect("copy_to_file");
    assert_eq!(
        sha(&back, SIZE),
        sha(&at_s2, SIZE),
        "the lvol restored from backup-two"
    );

    // a new volume of two replicas restored from backup-two serves what was written
    let v: Value = d
        .client
        .call(
            "backup_restore",
            json!({"backup": "backup-two", "backupVolume": "vol", "target": TARGET,
                   "credentialSecret": SECRET, "volume": "back",
                   "replicas": 2, "wait": true, "timeoutSeconds": 600}),
        )
        .await
        .expect("backup_restore");
    eprintln!("restored volume: {}", v["engine"]);
    let back_nqn = format!("{}:vol:back", talon::names::NQN_PREFIX);
    let data = spdk_dd::dd(&spdk, &work, port, &back_nqn, None, SIZE as usize);
    let f = dir.path().join("back-volume.img");
    std::fs::write(&f, &data).expect("write");
    drop(data);
    assert_eq!(
        sha(&f, SIZE),
        sha(&at_s2, SIZE),
        "volume back, restored from backup-two"
    );
    assert!(
        !dir.path().join("data/restore/back.img").exists() && !dir.path().join("restore/back.img").exists(),
        "the restore file is removed once the volume is served"
    );
    d.stop().await;
}
