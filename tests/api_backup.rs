//! The backup methods of the admin API (process test: a real daemon without
//! SPDK on a temp Unix socket, a `vfs://` backup target in a temp folder):
//! what `backup_create` refuses before anything is stored, each error naming
//! its object; talon's Backup records listed, shown and deleted (from the
//! target too); and what a target holds, written here with
//! `backupstore::ops::create` as the backup controller writes it.
//!
//! ```text
//!   serve (no SPDK) <── Client: backup_create / list / get / delete / store_list
//!                                                              └──> vfs:///<tmp>/target <── ops::create
//! ```

#[path = "support/serve_daemon.rs"]
mod serve_daemon;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use talon::api::ErrorKind;
use talon::api::backup::{BackupCreateParams, BackupDeleteResult, BackupView, StoreVolumeView};
use talon::backupstore::{BackupRequest, Credentials, Progress, SparseImage, Store, format, ops};
use talon::client::{Client, ClientError};

const MIB: u64 = 1 << 20;

/// The kind and message of a failed call.
fn failure<T: std::fmt::Debug>(r: Result<T, ClientError>, what: &str) -> (Option<ErrorKind>, String) {
    match r.expect_err(what) {
        ClientError::Rpc { kind, message, .. } => (kind, message),
        other => panic!("{what}: not an API error: {other}"),
    }
}

fn create(volume: &str, snapshot: &str, target: &str) -> BackupCreateParams {
    BackupCreateParams {
        volume: volume.into(),
        snapshot: snapshot.into(),
        target: target.into(),
        ..Default::default()
    }
}

/// A complete backup `name` of backup volume `volume` in `store`: 4 MiB with
/// data in its first 2 MiB block, as the backup controller writes one.
async fn write_backup(store: &Store, dir: &Path, volume: &str, name: &str) {
    let file = dir.join(format!("{name}.img"));
    let f = std::fs::File::create(&file).expect("image");
    f.set_len(4 * MIB).expect("size");
    f.write_all_at(&vec![0x5a; MIB as usize], 0).expect("data");
    drop(f);
    let image = SparseImage::open(&file, 0, 4 * MIB).expect("sparse image");
    let req = BackupRequest::v2(volume, name, "s1", 4 * MIB);
    let (cfg, _) = ops::create(store, &req, &image, None, &Progress::default())
        .await
        .expect("backup written");
    assert!(cfg.complete());
}

async fn call(c: &Client, method: &str, params: Value) -> Result<Value, ClientError> {
    c.call(method, params).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_are_validated_recorded_and_listed_from_their_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    // the node's credential secrets: one folder, each a secret by its name
    let secrets = dir.path().join("secrets");
    std::fs::create_dir_all(&secrets).expect("secrets");
    let d = serve_daemon::start(serve_daemon::opts_with_config(
        dir.path(),
        serve_daemon::no_spdk(),
        &format!("node: {{ backupSecretsDir: {} }}\n", secrets.display()),
    ))
    .await;
    let c = &d.client;
    let target = format!("vfs://{}", dir.path().join("target").display());
    std::fs::create_dir(dir.path().join("target")).expect("the target's folder");

    // a volume and a snapshot (records: no engine needs to serve them here)
    call(c, "volume_create", json!({"name": "vol-a", "size": "4MiB"}))
        .await
        .expect("volume");
    call(c, "snapshot_create", json!({"volume": "vol-a", "name": "s1"}))
        .await
        .expect("snapshot");

    // refused before anything is stored, each naming what is wrong
    // a file that is no Secret, outside the secrets folder, as a secret's name or its path
    let shadow = dir.path().join("shadow");
    std::fs::write(
        &shadow,
        "root:*:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n",
    )
    .expect("shadow");
    std::fs::write(secrets.join("not-a-secret"), "root:*:19000:0:99999:7:::\n").expect("not-a-secret");
    let refused: Vec<(BackupCreateParams, ErrorKind, Vec<&str>)> = vec![
        (
            BackupCreateParams {
                name: Some("../x".into()),
                ..create("vol-a", "s1", &target)
            },
            ErrorKind::InvalidParams,
            vec!["backup name \"../x\" is invalid"],
        ),
        (
            create("nope", "s1", &target),
            ErrorKind::NotFound,
            vec!["volume \"nope\" not found"],
        ),
        (
            create("vol-a", "nosnap", &target),
            ErrorKind::NotFound,
            vec!["snapshot \"vol-a@nosnap\" not found"],
        ),
        (
            create("vol-a", "s1", "cifs://x/y"),
            ErrorKind::InvalidParams,
            vec!["cifs://x/y", "not supported"],
        ),
        (
            BackupCreateParams {
                credential_secret: Some("no-such-secret".into()),
                ..create("vol-a", "s1", &target)
            },
            ErrorKind::NotFound,
            vec!["credential secret \"no-such-secret\"", "not found"],
        ),
        (
            BackupCreateParams {
                credential_secret: Some("relative/secret".into()),
                ..create("vol-a", "s1", &target)
            },
            ErrorKind::InvalidParams,
            vec!["not a Kubernetes secret name"],
        ),
        (
            BackupCreateParams {
                credential_secret: Some("/etc/shadow".into()),
                ..create("vol-a", "s1", &target)
            },
            ErrorKind::InvalidParams,
            vec!["not a Kubernetes secret name"],
        ),
        (
            BackupCreateParams {
                credential_secret: Some(shadow.display().to_string()),
                ..create("vol-a", "s1", &target)
            },
            ErrorKind::InvalidParams,
            vec!["not a Kubernetes secret name"],
        ),
        (
            BackupCreateParams {
                credential_secret: Some("not-a-secret".into()),
                ..create("vol-a", "s1", &target)
            },
            ErrorKind::InvalidParams,
            vec!["credential secret", "not a Kubernetes Secret"],
        ),
        (
            create(
                "vol-a",
                "s1",
                &format!("vfs://{}/target/../elsewhere", dir.path().display()),
            ),
            ErrorKind::InvalidParams,
            vec!["'..'"],
        ),
        (
            BackupCreateParams {
                backup_volume: Some("-bad".into()),
                ..create("vol-a", "s1", &target)
            },
            ErrorKind::InvalidParams,
            vec!["backup volume name \"-bad\" is invalid"],
        ),
    ];
    for (params, kind, wants) in refused {
        let (got, msg) = failure(c.backup_create(&params).await, &format!("{params:?}"));
        assert_eq!(got, Some(kind), "{params:?}: {msg}");
        for w in wants {
            assert!(msg.contains(w), "{w:?} in {msg:?}");
        }
        assert!(msg.starts_with("backup "), "the error names the backup: {msg}");
    }
    // a one-letter volume cannot name a backup volume (Longhorn's rule): say how to give one
    call(c, "volume_create", json!({"name": "v", "size": "1MiB"}))
        .await
        .expect("volume v");
    let (kind, msg) = failure(c.backup_create(&create("v", "s1", &target)).await, "volume v");
    assert_eq!(kind, Some(ErrorKind::InvalidParams), "{msg}");
    assert!(msg.contains("give backupVolume"), "{msg}");
    assert!(
        c.backup_list(None).await.expect("list").is_empty(),
        "nothing stored"
    );

    // created once; the second create of the name is refused
    std::fs::write(
        secrets.join("s3"),
        "apiVersion: v1\nkind: Secret\nstringData: {}\n",
    )
    .expect("secret");
    let b1 = c
        .backup_create(&BackupCreateParams {
            name: Some("b1".into()),
            credential_secret: Some("s3".into()),
            backup_volume: Some("pvc-data".into()),
            labels: [("app".to_owned(), "db".to_owned())].into(),
            ..create("vol-a", "s1", &target)
        })
        .await
        .expect("b1");
    assert_eq!(b1.name, "b1");
    assert_eq!(
        (
            b1.spec.volume.as_str(),
            b1.spec.snapshot.as_str(),
            b1.spec.backup_volume()
        ),
        ("vol-a", "s1", "pvc-data")
    );
    assert_eq!(b1.spec.labels.get("app").map(String::as_str), Some("db"));
    let (kind, msg) = failure(
        c.backup_create(&BackupCreateParams {
            name: Some("b1".into()),
            ..create("vol-a", "s1", &target)
        })
        .await,
        "b1 again",
    );
    assert_eq!(kind, Some(ErrorKind::AlreadyExists), "{msg}");
    assert!(msg.contains("backup \"b1\" already exists"), "{msg}");

    // a name of Longhorn's form when none is given
    let auto = c
        .backup_create(&create("vol-a", "s1", &target))
        .await
        .expect("unnamed");
    let hex = auto.name.strip_prefix("backup-").expect("backup-<hex>");
    assert!(
        hex.len() == 16
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
        "{}",
        auto.name
    );

    // a V1 volume's backup never completes: a bounded wait fails naming it
    let (kind, msg) = failure(
        c.backup_create(&BackupCreateParams {
            name: Some("b-wait".into()),
            wait: true,
            timeout_seconds: Some(2),
            ..create("vol-a", "s1", &target)
        })
        .await,
        "wait",
    );
    assert!(
        matches!(kind, Some(ErrorKind::Unavailable | ErrorKind::FailedPrecondition)),
        "{kind:?}: {msg}"
    );
    assert!(msg.contains("backup b-wait"), "{msg}");

    // listed, by volume too, and shown
    let names = |v: Vec<BackupView>| v.into_iter().map(|b| b.name).collect::<Vec<_>>();
    let mut all = names(c.backup_list(None).await.expect("list"));
    all.sort();
    let mut want = vec!["b-wait".to_owned(), "b1".to_owned(), auto.name.clone()];
    want.sort();
    assert_eq!(all, want);
    assert_eq!(
        names(c.backup_list(Some("vol-a")).await.expect("of vol-a")).len(),
        3
    );
    assert!(c.backup_list(Some("v")).await.expect("of v").is_empty());
    let got = c.backup_get("b1").await.expect("get b1");
    assert_eq!(got.spec, b1.spec);
    let (kind, msg) = failure(c.backup_get("zz").await, "unknown");
    assert_eq!(kind, Some(ErrorKind::NotFound), "{msg}");
    assert!(msg.contains("backup \"zz\" not found"), "{msg}");

    // what the target holds: a backup written as the controller writes one
    let store = Store::open(&target, &Credentials::none()).expect("store");
    write_backup(&store, dir.path(), "pvc-data", "b1").await;
    write_backup(&store, dir.path(), "other-vol", "backup-other").await;
    let listed = c
        .backup_store_list(&target, None, None)
        .await
        .expect("store list");
    assert_eq!(
        listed.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        vec!["other-vol", "pvc-data"]
    );
    let pvc = &listed[1];
    assert_eq!(
        (
            pvc.size,
            pvc.last_backup_name.as_str(),
            pvc.compression.as_str(),
            pvc.data_engine.as_str(),
            pvc.message.as_str()
        ),
        (4 * MIB, "b1", "lz4", "v2", "")
    );
    assert_eq!(pvc.backups.len(), 1);
    let b = &pvc.backups[0];
    assert_eq!((b.name.as_str(), b.snapshot_name.as_str()), ("b1", "s1"));
    assert_eq!(b.size, format::DEFAULT_BLOCK_SIZE, "one block of data");
    assert!(!b.is_incremental && !b.created_time.is_empty() && !b.snapshot_created_at.is_empty());
    assert_eq!(b.url, format!("{target}?backup=b1&volume=pvc-data"));
    // one backup volume, with the credentials of a secret file
    let one: Vec<StoreVolumeView> = c
        .backup_store_list(&target, Some("s3"), Some("pvc-data"))
        .await
        .expect("one volume");
    assert_eq!(one, vec![pvc.clone()]);
    for (volume, target, kind, want) in [
        (
            Some("nope"),
            target.as_str(),
            ErrorKind::NotFound,
            "backup volume \"nope\" not found",
        ),
        (
            Some("../x"),
            target.as_str(),
            ErrorKind::InvalidParams,
            "\"../x\" is invalid",
        ),
        (None, "cifs://x/y", ErrorKind::InvalidParams, "not supported"),
    ] {
        let (got, msg) = failure(c.backup_store_list(target, None, volume).await, want);
        assert_eq!(got, Some(kind), "{msg}");
        assert!(msg.contains(want) && msg.contains("backup target"), "{msg}");
    }

    // a listing never makes the folder it lists; a target whose folder vanished
    // is refused, not made again empty
    let never = dir.path().join("never-made");
    let (kind, msg) = failure(
        c.backup_store_list(&format!("vfs://{}", never.display()), None, None)
            .await,
        "no folder",
    );
    assert_eq!(kind, Some(ErrorKind::NotFound), "{msg}");
    assert!(msg.contains("does not exist"), "{msg}");
    assert!(!never.exists(), "the listing made the folder");
    let away = dir.path().join("target-away");
    std::fs::rename(dir.path().join("target"), &away).expect("the target vanishes");
    let (kind, msg) = failure(c.backup_store_list(&target, None, None).await, "vanished");
    assert_eq!(kind, Some(ErrorKind::NotFound), "{msg}");
    assert!(
        !dir.path().join("target").exists(),
        "the store was made again, empty"
    );
    std::fs::rename(&away, dir.path().join("target")).expect("the target is back");

    // deleted: talon's record only, then one from its target as well
    let r: BackupDeleteResult = c.backup_delete(&auto.name, false, true).await.expect("delete");
    assert!(r.deleted && !r.store_deleted, "{r:?}");
    let (kind, _) = failure(c.backup_get(&auto.name).await, "gone");
    assert_eq!(kind, Some(ErrorKind::NotFound));
    // never reached the target: nothing there to delete is fine
    let r = c
        .backup_delete("b-wait", true, true)
        .await
        .expect("delete b-wait");
    assert!(r.deleted && !r.store_deleted, "{r:?}");
    let r = c
        .backup_delete("b1", true, true)
        .await
        .expect("delete b1 from its target");
    assert!(r.deleted && r.store_deleted && r.blocks_removed == 1, "{r:?}");
    let pvc = c
        .backup_store_list(&target, None, Some("pvc-data"))
        .await
        .expect("after");
    assert!(
        pvc[0].backups.is_empty() && pvc[0].last_backup_name.is_empty(),
        "{pvc:?}"
    );
    let (kind, msg) = failure(c.backup_delete("b1", false, false).await, "twice");
    assert_eq!(kind, Some(ErrorKind::NotFound), "{msg}");
    assert!(msg.contains("backup \"b1\" not found"), "{msg}");
    assert!(c.backup_list(None).await.expect("list").is_empty());

    // the CLI: tables and JSON of the same answers
    let socket = dir.path().join("run/talon.sock");
    let talon = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_talon"))
            .env("TALON_SOCKET", &socket)
            .args(args)
            .output()
            .expect("run talon");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = talon(&[
        "backup",
        "create",
        "vol-a@s1",
        "--target",
        &target,
        "--name",
        "cli-1",
        "--label",
        "k=v",
        "--no-wait",
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        (v["name"].as_str(), v["spec"]["labels"]["k"].as_str()),
        (Some("cli-1"), Some("v"))
    );
    let (ok, out, err) = talon(&["backup", "list"]);
    assert!(ok, "{err}");
    let header = out.lines().next().unwrap_or_default();
    for col in [
        "NAME", "VOLUME", "SNAPSHOT", "STATE", "PROGRESS", "UPLOADED", "URL",
    ] {
        assert!(header.contains(col), "{col} in {out}");
    }
    assert!(out.contains("cli-1") && out.contains("vol-a"), "{out}");
    let (ok, out, err) = talon(&["backup", "store-list", "--target", &target]);
    assert!(ok, "{err}");
    assert!(out.contains("other-vol") && out.contains("backup-other"), "{out}");
    let (ok, _, err) = talon(&[
        "backup",
        "create",
        "vol-a@s1",
        "--target",
        "cifs://x/y",
        "--no-wait",
    ]);
    assert!(!ok && err.contains("not supported"), "{err}");
    let (ok, _, err) = talon(&["backup", "create", "vol-a", "--target", &target]);
    assert!(!ok && err.contains("VOLUME@SNAPSHOT"), "{err}");
    let (ok, out, err) = talon(&["backup", "delete", "cli-1"]);
    assert!(ok && out.contains("deleted: true"), "{out}{err}");

    tokio::time::timeout(Duration::from_secs(30), d.stop())
        .await
        .expect("the daemon stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_name_longer_than_a_store_holds_is_refused_naming_the_backup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = serve_daemon::start(serve_daemon::opts(dir.path(), serve_daemon::no_spdk())).await;
    let c = &d.client;
    let target = format!("vfs://{}", dir.path().join("target").display());
    std::fs::create_dir_all(dir.path().join("target")).expect("the folder target");
    call(c, "volume_create", json!({"name": "vol-a", "size": "4MiB"}))
        .await
        .expect("volume");
    call(c, "snapshot_create", json!({"volume": "vol-a", "name": "s1"}))
        .await
        .expect("snapshot");
    // `backup_<name>.cfg` (and its temporary name) is one file name on a folder target:
    // 240 characters fit, 241 do not
    let long = "b".repeat(300);
    for (params, wants) in [
        (
            BackupCreateParams {
                name: Some(long.clone()),
                ..create("vol-a", "s1", &target)
            },
            vec![
                "backup name \"bbbb",
                "300 characters long",
                "240 characters at most",
            ],
        ),
        (
            BackupCreateParams {
                name: Some("b".repeat(format::MAX_BACKUP_NAME + 1)),
                ..create("vol-a", "s1", &target)
            },
            vec!["241 characters long"],
        ),
        (
            BackupCreateParams {
                backup_volume: Some("v".repeat(256)),
                ..create("vol-a", "s1", &target)
            },
            vec!["backup volume name \"vvvv", "255 characters at most"],
        ),
    ] {
        let (kind, msg) = failure(c.backup_create(&params).await, "a name too long");
        assert_eq!(kind, Some(ErrorKind::InvalidParams), "{msg}");
        for w in wants {
            assert!(msg.contains(w), "{w:?} in {msg:?}");
        }
        assert!(msg.len() < 400, "the name is not echoed whole: {msg}");
    }
    let listed = call(c, "backup_list", json!({})).await.expect("backup_list");
    assert_eq!(listed, json!([]), "nothing recorded");
    // the longest name that fits is taken, and its config written on the folder target
    let name = "b".repeat(format::MAX_BACKUP_NAME);
    let store = Store::open(&target, &Credentials::none()).expect("store");
    write_backup(&store, dir.path(), "vol-a", &name).await;
    assert_eq!(
        ops::backup(&store, "vol-a", &name).await.expect("read back").name,
        name
    );
    d.stop().await;
}
