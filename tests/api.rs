//! Admin API process tests (tier 3): a real daemon on a temp Unix socket.

#[path = "support/serve_daemon.rs"]
mod serve_daemon;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use talon::api::ErrorKind;
use talon::client::{Client, ClientError};
use talon::runtime::EventKind;
use talon::serve::{ServeOptions, serve};

struct Daemon {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), talon::serve::ServeError>>,
    socket: PathBuf,
}

/// A bearer token as long as the TCP listener requires.
const TOKEN: &str = "0123456789abcdef0123456789abcdef-test";

fn opts(dir: &Path) -> ServeOptions {
    serve_daemon::opts(dir, serve_daemon::no_spdk())
}

async fn start(o: ServeOptions) -> Daemon {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let socket = o.socket.clone();
    let task = tokio::spawn(serve(o, async move {
        let _ = rx.await;
    }));
    for _ in 0..200 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Daemon {
        stop: Some(tx),
        task,
        socket,
    }
}

impl Daemon {
    async fn client(&self) -> Client {
        Client::connect_unix(&self.socket).await.expect("connect")
    }
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task.await.expect("join").expect("clean stop");
        assert!(!self.socket.exists(), "the socket is removed on shutdown");
    }
}

fn rpc_kind(e: &ClientError) -> Option<ErrorKind> {
    match e {
        ClientError::Rpc { kind, .. } => *kind,
        _ => None,
    }
}

#[tokio::test]
async fn node_info_discover_and_errors_that_name_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(opts(dir.path())).await;
    let mode = std::fs::metadata(&d.socket).expect("socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the API socket is owner-only");
    let c = d.client().await;

    let info = c.node_info().await.expect("node_info");
    assert_eq!(info.version, talon::VERSION);
    assert!(!info.kernel.is_empty() && !info.hostname.is_empty());
    // the names other nodes' exports admit this node by
    assert!(info.host_nqn.starts_with("nqn."), "{info:?}");
    assert!(
        info.host_iqn.starts_with("iqn.2025-01.io.talon:host."),
        "{info:?}"
    );
    assert!(info.engines.iter().any(|e| e.engine == "v1") && info.engines.iter().any(|e| e.engine == "v2"));

    let doc = c.discover().await.expect("rpc.discover");
    let names: Vec<&str> = doc["methods"]
        .as_array()
        .expect("methods")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    for m in [
        "node_info",
        "resource_list",
        "resource_get",
        "resource_watch",
        "rpc.discover",
        "volume_create",
        "volume_delete",
        "snapshot_create",
        "disk_add",
        "volume_attach",
    ] {
        assert!(names.contains(&m), "rpc.discover lacks {m}: {names:?}");
    }
    let create = doc["methods"]
        .as_array()
        .expect("methods")
        .iter()
        .find(|m| m["name"] == "volume_create")
        .expect("volume_create");
    assert!(
        create["params"]
            .as_array()
            .expect("params")
            .iter()
            .any(|p| p["name"] == "name" && p["required"] == true)
    );
    assert!(
        create["errors"]
            .as_array()
            .expect("errors")
            .iter()
            .any(|e| e["code"] == -32002)
    );

    // Unknown method, unknown field, wrong type: clear errors, and the daemon keeps serving.
    let e = c
        .call::<_, Value>("no_such_method", json!({}))
        .await
        .expect_err("unknown method");
    assert!(matches!(e, ClientError::Rpc { code: -32601, .. }), "{e}");
    let e = c
        .call::<_, Value>("resource_list", json!({"type": "Volume", "colour": 1}))
        .await
        .expect_err("unknown field");
    assert_eq!(rpc_kind(&e), Some(ErrorKind::InvalidParams));
    assert!(e.to_string().contains("colour"), "{e}");
    let e = c
        .call::<_, Value>("volume_create", json!({"name": "v", "sizeBytes": "big"}))
        .await
        .expect_err("wrong type");
    assert!(e.to_string().contains("sizeBytes"), "{e}");
    let e = c
        .call::<_, Value>("volume_create", json!({"name": "Bad_Name", "size": "1GiB"}))
        .await
        .expect_err("bad name");
    assert_eq!(rpc_kind(&e), Some(ErrorKind::InvalidParams));
    assert!(e.to_string().contains("Bad_Name"), "{e}");
    let e = c
        .call::<_, Value>(
            "volume_create",
            json!({"name": "rv", "size": "1GiB", "remoteReplicas": [{"address": "node-b", "port": 4420}]}),
        )
        .await
        .expect_err("remote replica by name");
    assert_eq!(rpc_kind(&e), Some(ErrorKind::InvalidParams));
    assert!(
        e.to_string().contains("volume rv") && e.to_string().contains("node-b"),
        "{e}"
    );
    let e = c
        .call::<_, Value>(
            "volume_create",
            json!({"name": "rv", "size": "1GiB", "replicas": 2, "serveReplica": 1}),
        )
        .await
        .expect_err("served replica with two local replicas");
    assert!(e.to_string().contains("serveReplica"), "{e}");
    let e = c.get("Volume", "ghost").await.expect_err("missing");
    assert_eq!(rpc_kind(&e), Some(ErrorKind::NotFound));
    assert!(e.to_string().contains("ghost"), "{e}");
    let e = c.list("Gadget").await.expect_err("unknown type");
    assert!(e.to_string().contains("Gadget"), "{e}");
    c.node_info().await.expect("still serving");
    d.stop().await;
}

#[tokio::test]
async fn watch_streams_create_update_destroy_and_state_survives_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(opts(dir.path())).await;
    let c = d.client().await;
    let mut sub = c.watch(Some("volume"), true).await.expect("watch");
    let _: Value = c
        .call("volume_create", json!({"name": "v1", "size": "1GiB"}))
        .await
        .expect("create");
    let _: Value = c
        .call("volume_expand", json!({"name": "v1", "size": "2GiB"}))
        .await
        .expect("expand");
    let _: Value = c
        .call("volume_create", json!({"name": "v2", "sizeBytes": 4096}))
        .await
        .expect("create");
    let _: Value = c
        .call("volume_delete", json!({"name": "v2"}))
        .await
        .expect("delete");
    let e = c
        .call::<_, Value>("volume_create", json!({"name": "v1", "size": "1GiB"}))
        .await
        .expect_err("dup");
    assert_eq!(rpc_kind(&e), Some(ErrorKind::AlreadyExists));
    assert!(e.to_string().contains("volume \"v1\" already exists"), "{e}");
    let e = c
        .call::<_, Value>("volume_expand", json!({"name": "v1", "size": "1GiB"}))
        .await
        .expect_err("shrink");
    assert_eq!(rpc_kind(&e), Some(ErrorKind::FailedPrecondition));
    // a controller adding its finalizer is an update too: only updates that
    // change what the test asked for are counted
    let mut seen: Vec<(EventKind, String, Option<u64>)> = Vec::new();
    while seen.len() < 4 {
        let ev = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("event in time")
            .expect("open")
            .expect("decodes");
        let now = (
            ev.kind,
            ev.resource.metadata.id.clone(),
            ev.resource.spec["sizeBytes"].as_u64(),
        );
        let last_of_id = seen.iter().rev().find(|(_, id, _)| *id == now.1);
        if now.0 == EventKind::Updated && last_of_id.is_some_and(|l| l.2 == now.2) {
            continue;
        }
        seen.push(now);
    }
    assert_eq!(
        seen,
        vec![
            (EventKind::Created, "v1".into(), Some(1 << 30)),
            (EventKind::Updated, "v1".into(), Some(2 << 30)),
            (EventKind::Created, "v2".into(), Some(4096)),
            (EventKind::Destroyed, "v2".into(), Some(4096)),
        ]
    );
    drop(sub);
    // a controller may still add its finalizer to v1 (a metadata update): what
    // was acknowledged last is what must survive
    let before = c.get("volume", "v1").await.expect("v1").metadata.version;
    assert!(before >= 2, "{before}");
    drop(c);
    d.stop().await;

    let d = start(opts(dir.path())).await;
    let c = d.client().await;
    let v = c.get("volume", "v1").await.expect("persisted across restart");
    assert_eq!(v.spec["sizeBytes"], json!(2u64 << 30));
    assert!(
        v.metadata.version >= before,
        "version {} after the restart, {before} before",
        v.metadata.version
    );
    assert!(c.get("volume", "v2").await.is_err());
    d.stop().await;
}

/// A V1 snapshot that failed (the data dir's file system has no reflink)
/// holds nothing: it does not block `volume_delete`, and goes with it. One
/// that was taken still does.
#[tokio::test]
async fn a_snapshot_that_failed_and_holds_nothing_goes_with_its_volume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(serve_daemon::v1_opts(dir.path())).await;
    let c = d.client().await;
    let _: Value = c
        .call(
            "volume_create",
            json!({"name": "plain", "size": "4MiB", "wait": true, "timeoutSeconds": 30}),
        )
        .await
        .expect("create");
    let taken = c
        .call::<_, Value>(
            "snapshot_create",
            json!({"volume": "plain", "name": "s1", "wait": true, "timeoutSeconds": 30}),
        )
        .await;
    if taken.is_ok() {
        eprintln!(
            "SKIP a_snapshot_that_failed_and_holds_nothing_goes_with_its_volume: {} supports reflink",
            dir.path().display()
        );
        d.stop().await;
        return;
    }
    let e = taken.expect_err("no reflink");
    assert!(e.to_string().contains("reflink"), "{e}");
    let _: Value = c
        .call("volume_delete", json!({"name": "plain"}))
        .await
        .expect("delete, the failed snapshot with it");
    talon::runtime::testing::eventually(
        "the volume and its failed snapshot gone",
        Duration::from_secs(10),
        || async {
            (c.get("volume", "plain").await.is_err() && c.get("snapshot", "plain@s1").await.is_err())
                .then_some(())
        },
    )
    .await;
    d.stop().await;
}

/// A `volume_attach` that waits and fails (this host has neither NVMe/TCP
/// nor iSCSI in its kernel here, or none works) withdraws the attachment it
/// made: the export is not left open to this host.
#[tokio::test]
async fn a_failed_attach_leaves_no_attachment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(serve_daemon::v1_opts(dir.path())).await;
    let c = d.client().await;
    let _: Value = c
        .call(
            "volume_create",
            json!({"name": "att", "size": "4MiB", "wait": true, "timeoutSeconds": 30}),
        )
        .await
        .expect("create");
    let attached = c
        .call::<_, Value>(
            "volume_attach",
            json!({"name": "att", "wait": true, "timeoutSeconds": 30}),
        )
        .await;
    if attached.is_ok() {
        eprintln!("SKIP a_failed_attach_leaves_no_attachment: this host attached it (it has an initiator)");
        let _: Value = c
            .call("volume_detach", json!({"name": "att"}))
            .await
            .expect("detach");
        d.stop().await;
        return;
    }
    let e = attached.expect_err("no initiator");
    assert!(e.to_string().contains("att"), "{e}");
    talon::runtime::testing::eventually("no attachment left", Duration::from_secs(10), || async {
        c.get("attachment", "att").await.is_err().then_some(())
    })
    .await;
    // nothing holds the volume: it can be deleted at once
    let _: Value = c
        .call("volume_delete", json!({"name": "att"}))
        .await
        .expect("delete: no attachment holds it");
    d.stop().await;
}

/// What a newcomer gets wrong is refused with the volume's name and the rule:
/// more than one replica where the volume would be V1, an unknown size unit,
/// a name that cannot be a volume's; a missing volume reads `volume "x" not found`.
#[tokio::test]
async fn v1_replicas_units_and_names_are_refused_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(serve_daemon::opts_with_config(
        dir.path(),
        Default::default(),
        "node: { engine: v1 }\n",
    ))
    .await;
    let c = d.client().await;
    let e = c
        .call::<_, Value>(
            "volume_create",
            json!({"name": "r2", "size": "1GiB", "replicas": 2}),
        )
        .await
        .expect_err("V1 keeps one replica");
    assert_eq!(rpc_kind(&e), Some(ErrorKind::InvalidParams), "{e}");
    assert!(
        e.to_string()
            .contains("volume r2: engine auto is v1 on this node (its node config), and V1 keeps one replica (one file), not 2"),
        "{e}"
    );
    let e = c
        .call::<_, Value>(
            "volume_create",
            json!({"name": "r2", "size": "1GiB", "replicas": 2, "engine": "v1"}),
        )
        .await
        .expect_err("V1 keeps one replica");
    assert!(
        e.to_string()
            .contains("volume r2: engine v1, and V1 keeps one replica"),
        "{e}"
    );
    assert!(c.get("volume", "r2").await.is_err(), "nothing stored");
    let e = c
        .call::<_, Value>("volume_create", json!({"name": "u", "size": "1XB"}))
        .await
        .expect_err("unknown unit");
    assert!(
        e.to_string()
            .contains("unknown unit \"xb\" (valid: B, K/KiB, M/MiB, G/GiB, T/TiB, KB, MB, GB, TB)"),
        "{e}"
    );
    for method in ["volume_get", "volume_delete", "volume_attach"] {
        let e = c
            .call::<_, Value>(method, json!({"name": "a/b"}))
            .await
            .expect_err("not a volume name");
        assert_eq!(rpc_kind(&e), Some(ErrorKind::InvalidParams), "{method}: {e}");
        assert!(e.to_string().contains("invalid volume \"a/b\""), "{method}: {e}");
        let e = c
            .call::<_, Value>(method, json!({"name": "nope"}))
            .await
            .expect_err("no such volume");
        assert!(
            e.to_string().contains("volume \"nope\" not found"),
            "{method}: {e}"
        );
    }
    let e = c.get("volume", "nope").await.expect_err("resource_get");
    assert!(e.to_string().contains("volume \"nope\" not found"), "{e}");
    drop(c);
    d.stop().await;
}

/// A data dir as `mkdir -p` or a hostPath `DirectoryOrCreate` leaves it (0755,
/// files 0644) is made private at start: directories 0700, files 0600; a
/// damaged state store is refused with an error that names it.
#[tokio::test]
async fn the_data_dir_is_made_private_and_a_damaged_store_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let vols = data.join("v1/volumes");
    std::fs::create_dir_all(&vols).expect("mkdir");
    std::fs::write(vols.join("old.img"), b"data").expect("volume file");
    std::fs::create_dir_all(data.join("nvme")).expect("mkdir");
    std::fs::write(data.join("nvme/hostnqn"), b"nqn.2014-08.org.nvmexpress:uuid:x\n").expect("nqn");
    std::os::unix::fs::symlink("/etc/hostname", data.join("link")).expect("symlink");
    for p in [&data, &data.join("v1"), &vols, &data.join("nvme")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    for p in [vols.join("old.img"), data.join("nvme/hostnqn")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let etc_mode = std::fs::metadata("/etc/hostname").map(|m| m.permissions().mode());
    // no store beside a volume file: it is set aside (kept, its mode made private first)
    let d = start(ServeOptions {
        set_aside_orphan_data: true,
        ..opts(dir.path())
    })
    .await;
    let aside = set_aside_dirs(&data);
    assert_eq!(aside.len(), 1, "{aside:?}");
    let mode = |p: &Path| std::fs::symlink_metadata(p).expect("stat").permissions().mode() & 0o7777;
    for p in [data.clone(), data.join("v1"), vols.clone(), data.join("nvme")] {
        assert_eq!(mode(&p), 0o700, "{}", p.display());
    }
    for p in [
        aside[0].join("volumes/old.img"),
        data.join("nvme/hostnqn"),
        data.join("state.redb"),
    ] {
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
    assert_eq!(
        std::fs::metadata("/etc/hostname")
            .map(|m| m.permissions().mode())
            .ok(),
        etc_mode.ok(),
        "a symbolic link is not followed"
    );
    d.stop().await;

    std::fs::write(data.join("state.redb"), b"").expect("truncate the store");
    let err = serve(opts(dir.path()), async {})
        .await
        .expect_err("damaged store");
    let msg = err.to_string();
    assert!(
        msg.contains("damaged") && msg.contains(&data.join("state.redb").display().to_string()),
        "{msg}"
    );
}

/// The directories `--set-aside-orphan-data` (or a start on a store that does
/// not describe some volume files) moved volume data to.
fn set_aside_dirs(data: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(data.join("v1/orphaned")) {
        Ok(d) => d.map(|e| e.expect("entry").path()).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// `state.redb` deleted while V1 volume files stay: talon refuses to start,
/// naming the files and the missing store, and makes no store (so the next
/// start refuses too). With `--set-aside-orphan-data` it starts empty and the
/// files are moved, data intact, under `v1/orphaned/`: a new volume of an old
/// name gets a new file, never the old one at its old size. A store that does
/// not describe a volume file (restored from an older backup) has it set
/// aside at start the same way.
#[tokio::test]
async fn a_missing_store_beside_volume_files_refuses_the_start_until_set_aside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let old = data.join("v1/volumes/old.img");
    let snaps = data.join("v1/snapshots/old");
    std::fs::create_dir_all(old.parent().expect("dir")).expect("mkdir");
    std::fs::create_dir_all(&snaps).expect("mkdir");
    std::fs::write(&old, b"old data").expect("volume file");
    std::fs::write(snaps.join("s1.img"), b"snapshot").expect("snapshot file");

    for attempt in ["first", "second"] {
        let err = serve(opts(dir.path()), async {})
            .await
            .expect_err("a missing store beside volume files");
        let msg = err.to_string();
        for part in [
            data.join("state.redb").display().to_string(),
            old.display().to_string(),
            snaps.display().to_string(),
            "missing".to_string(),
            "--set-aside-orphan-data".to_string(),
        ] {
            assert!(msg.contains(&part), "{attempt} start: {part:?} not in: {msg}");
        }
        assert!(
            !data.join("state.redb").exists(),
            "a refused start makes no store"
        );
        assert_eq!(std::fs::read(&old).expect("kept"), b"old data");
    }

    let d = start(ServeOptions {
        set_aside_orphan_data: true,
        ..opts(dir.path())
    })
    .await;
    let c = d.client().await;
    assert!(c.list("Volume").await.expect("list").is_empty(), "an empty node");
    assert!(
        !old.exists() && !snaps.exists(),
        "the old name is free of old data"
    );
    let aside = set_aside_dirs(&data);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read(aside[0].join("volumes/old.img")).expect("set aside"),
        b"old data"
    );
    assert_eq!(
        std::fs::read(aside[0].join("snapshots/old/s1.img")).expect("set aside"),
        b"snapshot"
    );
    c.call::<_, Value>("volume_create", json!({"name": "kept", "sizeBytes": 1u64 << 20}))
        .await
        .expect("create a volume");
    d.stop().await;

    // the store exists now; a volume file it does not describe is set aside at start,
    // the file of a volume it holds is not
    let stray = data.join("v1/volumes/stray.img");
    std::fs::write(&stray, b"stray").expect("stray file");
    let kept = data.join("v1/volumes/kept.img");
    std::fs::write(&kept, b"kept").expect("a described file");
    let d = start(opts(dir.path())).await;
    d.stop().await;
    assert!(!stray.exists(), "set aside");
    // (grown to its volume's size if a tgtd served it meanwhile)
    assert!(std::fs::read(&kept).expect("kept").starts_with(b"kept"));
    let found: Vec<PathBuf> = set_aside_dirs(&data)
        .iter()
        .map(|d| d.join("volumes/stray.img"))
        .filter(|p| p.exists())
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(std::fs::read(&found[0]).expect("read"), b"stray");
}

/// A store record a newer talon wrote (a field this talon does not know)
/// stops the start with an error naming the record, instead of a daemon whose
/// controllers fail on it forever and whose new volumes never finish.
#[tokio::test]
async fn a_store_record_this_talon_cannot_read_refuses_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    {
        let s = talon::runtime::State::open(&data.join("state.redb")).expect("store");
        s.create(
            "config",
            "Volume",
            "from-newer",
            "",
            json!({"sizeBytes": 1u64 << 20, "stripes": 4}),
            Default::default(),
        )
        .expect("record");
    }
    let err = serve(opts(dir.path()), async {})
        .await
        .expect_err("an unreadable record");
    let msg = err.to_string();
    for part in [
        "Volume \"from-newer\"",
        "unknown field `stripes`",
        "run the talon version that wrote it",
    ] {
        assert!(msg.contains(part), "{part:?} not in: {msg}");
    }
    assert!(!dir.path().join("run/talon.sock").exists(), "nothing serves");
}

#[tokio::test]
async fn a_second_daemon_on_the_same_data_dir_is_refused_and_bad_sockets_fail_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(opts(dir.path())).await;
    let mut o = opts(dir.path());
    o.socket = dir.path().join("other.sock");
    let err = serve(o, async {}).await.expect_err("locked");
    let msg = err.to_string();
    assert!(
        msg.contains("in use by another talon") && msg.contains(&std::process::id().to_string()),
        "{msg}"
    );
    d.stop().await;

    let mut o = opts(dir.path());
    o.socket = PathBuf::from("/proc/talon-nonexistent/x.sock");
    let err = serve(o, async {}).await.expect_err("bad socket dir");
    assert!(err.to_string().contains("/proc/talon-nonexistent"), "{err}");
}

#[tokio::test]
async fn tcp_listener_refuses_calls_without_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let token_file = dir.path().join("token");
    let mut o = opts(dir.path());
    o.listen_tcp = Some(format!("127.0.0.1:{port}").parse().expect("addr"));
    o.token_file = Some(token_file.clone());
    // a token others can read, or a short one, is refused
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let e = serve(o.clone(), async {})
        .await
        .expect_err("world-readable token");
    assert!(e.to_string().contains("accessible by group or others"), "{e}");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::write(&token_file, "s3cret-token\n").expect("short token");
    let e = serve(o.clone(), async {}).await.expect_err("short token");
    assert!(e.to_string().contains("at least 32"), "{e}");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token");
    let d = start(o).await;
    let addr = format!("127.0.0.1:{port}");
    let mut ok = None;
    for _ in 0..100 {
        match Client::connect_tcp(&addr, TOKEN).await {
            Ok(c) => {
                ok = Some(c);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let c = ok.expect("connect with token");
    c.node_info().await.expect("authorized call");
    let e = Client::connect_tcp(&addr, "wrong")
        .await
        .expect_err("wrong token refused");
    assert!(e.to_string().contains("401"), "{e}");
    // A plain HTTP JSON-RPC POST without the header gets 401 too.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(&addr).await.expect("tcp");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"node_info","params":{}}"#;
    let req = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    // the refused client keeps no connection: the server closes it after the 401
    s.read_to_end(&mut got)
        .await
        .expect("read until the server closes");
    assert!(
        String::from_utf8_lossy(&got).starts_with("HTTP/1.1 401"),
        "{}",
        String::from_utf8_lossy(&got)
    );

    // many connections from one peer: past the bound they are closed at once, and
    // the Unix socket answers all along
    let mut held = Vec::new();
    let mut closed = 0;
    for _ in 0..200 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.expect("tcp");
        let mut b = [0u8; 1];
        // an accepted connection stays open (this read would wait); a refused one ends
        match tokio::time::timeout(Duration::from_millis(200), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed += 1,
            _ => held.push(s),
        }
    }
    assert!(held.len() <= 16, "{} connections from one peer kept", held.len());
    assert!(closed >= 200 - 16, "only {closed} refused");
    d.client()
        .await
        .node_info()
        .await
        .expect("the Unix socket answers");
    drop(held);
    // and once they are gone, an authorized client gets in again
    let mut again = None;
    for _ in 0..100 {
        if let Ok(c) = Client::connect_tcp(&addr, TOKEN).await {
            again = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    again
        .expect("connect again")
        .node_info()
        .await
        .expect("authorized call");
    drop(c);
    d.stop().await;
}

/// The core API served on a fresh loopback TCP port within `limits` (an
/// in-memory state): its address, the stop sender, and the server task.
async fn tcp_api(
    limits: talon::api::server::TcpLimits,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = talon::api::ApiContext {
        state: talon::runtime::State::in_memory(),
        registry: Arc::new(talon::resources::registry()),
        statuses: Default::default(),
        node_info: talon::serve::node_info_fn(
            talon::host::HostRoot::new("/"),
            dir.path().to_path_buf(),
            &talon::controllers::engine::selection::EngineSelection::fixed(false, "test"),
        ),
        node_stop: Arc::new(|_drain| false),
    };
    let mut api = talon::api::ApiBuilder::new(ctx);
    talon::api::register_core(&mut api);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(talon::api::server::serve_tcp_with(
        listener,
        Arc::from(TOKEN),
        limits,
        api.build(),
        async move {
            let _ = rx.await;
        },
    ));
    (addr, tx, server)
}

/// A TCP connection that stalls (a half-sent request) or says nothing is closed
/// after the idle bound, while an authorized client is served.
#[tokio::test]
async fn stalled_and_idle_tcp_connections_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, tx, server) = tcp_api(talon::api::server::TcpLimits {
        idle: Duration::from_secs(1),
        ..Default::default()
    })
    .await;
    let mut half = tokio::net::TcpStream::connect(addr).await.expect("tcp");
    half.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Len")
        .await
        .expect("half a request");
    let mut silent = tokio::net::TcpStream::connect(addr).await.expect("tcp");
    for s in [&mut half, &mut silent] {
        let mut rest = Vec::new();
        // ends (EOF or reset) instead of hanging: the server closed it
        let _ = s.read_to_end(&mut rest).await;
    }
    let c = Client::connect_tcp(&addr.to_string(), TOKEN)
        .await
        .expect("connect");
    c.node_info().await.expect("call");
    let _ = tx.send(());
    server.await.expect("server");
}

/// A token holder's WebSocket connections count against the per-peer bound
/// for as long as they are open, not only until the HTTP upgrade: past the
/// bound a new one is refused, and one closed makes room again.
#[tokio::test]
async fn websockets_count_against_the_tcp_bounds_while_they_are_open() {
    let (addr, tx, server) = tcp_api(talon::api::server::TcpLimits {
        max_per_peer: 4,
        ..Default::default()
    })
    .await;
    let addr = addr.to_string();
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..10 {
        match Client::connect_tcp(&addr, TOKEN).await {
            Ok(c) => {
                c.node_info().await.expect("an open WebSocket is served");
                open.push(c);
            }
            Err(_) => refused += 1,
        }
    }
    assert_eq!(
        (open.len(), refused),
        (4, 6),
        "4 WebSockets from one peer at most"
    );
    drop(open.pop());
    let again = talon::runtime::testing::eventually("room for one more", Duration::from_secs(10), || async {
        Client::connect_tcp(&addr, TOKEN).await.ok()
    })
    .await;
    again.node_info().await.expect("served");
    drop((open, again));
    let _ = tx.send(());
    server.await.expect("server");
}

/// Clients holding the admin socket (half-sent requests, idle WebSockets)
/// never make a CLI call wait or get 429: the Unix socket has no connection
/// cap of its own (jsonrpsee's 256 answered 429 before).
#[tokio::test]
async fn the_admin_socket_answers_while_400_clients_hold_it() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(serve_daemon::v1_opts(dir.path())).await;
    let socket = dir.path().join("run/talon.sock");
    let (mut half, mut idle) = (Vec::new(), Vec::new());
    for i in 0..300 {
        if i % 3 == 0 {
            let mut s = tokio::net::UnixStream::connect(&socket).await.expect("unix");
            s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
                .await
                .expect("half a request");
            half.push(s);
        }
        idle.push(Client::connect_unix(&socket).await.expect("an idle WebSocket"));
    }
    let c = Client::connect_unix(&socket).await.expect("the CLI connects");
    c.node_info().await.expect("and is answered");
    drop((half, idle));
    drop(c);
    d.stop().await;
}

/// A daemon without SPDK, whatever the environment has: its volumes are V1
/// (a daemon killed with -9 would otherwise leave an spdk_tgt running on
/// core 0 and the hugepages, in the way of every later real-SPDK test).
fn spawn_daemon(dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_talon"))
        .args(["--socket"])
        .arg(dir.join("run/talon.sock"))
        .args(["serve", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--run-dir")
        .arg(dir.join("run"))
        .env_remove("TALON_SPDK_DIR")
        .arg("--spdk-tgt")
        .arg(dir.join("no/spdk_tgt"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn talon")
}

async fn connect_retry(socket: &Path) -> Client {
    for _ in 0..300 {
        if let Ok(c) = Client::connect_unix(socket).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("daemon did not come up on {}", socket.display());
}

/// A daemon killed with -9 leaves its tgtd running on purpose (the next talon
/// adopts it); the test stops whatever tgtd is left under its run dir, even
/// when it fails, so nothing outlives it.
struct TgtdReaper(PathBuf);

impl Drop for TgtdReaper {
    fn drop(&mut self) {
        let Ok(pid) = std::fs::read_to_string(self.0.join("run/tgtd/tgtd.pid")) else {
            return;
        };
        let Ok(pid) = pid.trim().parse::<i32>() else {
            return;
        };
        let is_tgtd = std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "tgtd");
        if is_tgtd {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_writes_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _reaper = TgtdReaper(dir.path().to_path_buf());
    let socket = dir.path().join("run/talon.sock");
    let mut acked: Vec<String> = Vec::new();
    for round in 0..3u64 {
        let mut child = spawn_daemon(dir.path());
        let c = connect_retry(&socket).await;
        // Every volume acknowledged so far is there, whole.
        for name in &acked {
            let v = c
                .get("Volume", name)
                .await
                .unwrap_or_else(|e| panic!("acknowledged {name} lost: {e}"));
            assert_eq!(v.spec["sizeBytes"], json!(1u64 << 20), "{name}");
        }
        // Write in a loop and kill -9 at a moment that varies by round.
        let killer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30 + 40 * round)).await;
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
        });
        for i in 0.. {
            let name = format!("r{round}-v{i}");
            match c
                .call::<_, Value>("volume_create", json!({"name": name, "sizeBytes": 1u64 << 20}))
                .await
            {
                Ok(_) => acked.push(name),
                Err(_) => break,
            }
        }
        killer.await.expect("killer");
        let _ = std::fs::remove_file(&socket);
    }
    assert!(acked.len() > 3, "some writes were acknowledged ({})", acked.len());
    let mut child = spawn_daemon(dir.path());
    let c = connect_retry(&socket).await;
    let all = c.list("Volume").await.expect("list");
    for name in &acked {
        assert!(
            all.iter().any(|r| &r.metadata.id == name),
            "acknowledged {name} lost"
        );
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let status = child.wait().expect("wait");
    assert!(status.success(), "clean exit on SIGTERM: {status}");
    assert!(!socket.exists(), "socket removed on SIGTERM");
}

#[test]
fn cli_get_types_and_controllers_against_a_running_daemon() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = spawn_daemon(dir.path());
    let socket = dir.path().join("run/talon.sock");
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(connect_retry(&socket));
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_talon"))
            .env("TALON_SOCKET", &socket)
            .args(args)
            .output()
            .expect("run");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = run(&["get", "types"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("Volume") && out.contains("EngineStatus") && out.contains("config"),
        "{out}"
    );
    let (ok, out, err) = run(&["get", "controllers"]);
    assert!(ok, "{err}");
    assert!(out.contains("NAME") && out.contains("RESTARTS"), "{out}");
    let (ok, out, _) = run(&["get", "nodeconfig", "node", "-o", "json"]);
    assert!(ok);
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["metadata"]["id"], "node");
    let (ok, _, err) = run(&["get", "volume", "nope"]);
    assert!(!ok && err.contains("volume \"nope\" not found"), "{err}");
    let (ok, _, err) = run(&["get", "enginestatus", "nope"]);
    assert!(!ok && err.contains("engine status \"nope\" not found"), "{err}");
    // a name that cannot be a volume's is refused as such, with the rule
    let (ok, _, err) = run(&["get", "volume", "a/b"]);
    assert!(
        !ok && err.contains("invalid volume \"a/b\": character '/' is not allowed (use a-z, 0-9 and '-')"),
        "{err}"
    );
    let (ok, _, err) = run(&["--socket", "/nonexistent/talon.sock", "node", "info"]);
    assert!(!ok && err.contains("/nonexistent/talon.sock"), "{err}");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    assert!(child.wait().expect("wait").success());
}

/// `disk_add` refuses what an lvstore would destroy: a file with data talon
/// did not make, a mounted block device; it takes a new path and the same
/// block device once nobody holds it.
#[tokio::test]
async fn disk_add_refuses_data_and_devices_in_use_accepts_zeros_and_wipes_on_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(opts(dir.path())).await;
    let c = d.client().await;
    let add = |name: &str, path: &Path| json!({"name": name, "path": path, "size": "64MiB"});
    let foreign = dir.path().join("photos.db");
    std::fs::write(&foreign, b"SQLite format 3\0...").expect("foreign file");
    let e = c
        .call::<_, serde_json::Value>("disk_add", add("d1", &foreign))
        .await
        .expect_err("a foreign file");
    assert_eq!(rpc_kind(&e), Some(ErrorKind::FailedPrecondition), "{e}");
    assert!(e.to_string().contains("photos.db"), "{e}");
    assert_eq!(std::fs::read(&foreign).expect("read"), b"SQLite format 3\0...");
    c.call::<_, serde_json::Value>("disk_add", add("d2", &dir.path().join("new.img")))
        .await
        .expect("a new path");
    // `truncate -s`: a sparse file of zeros is the usual file disk
    let zeros = dir.path().join("zeros.img");
    std::fs::File::create(&zeros)
        .and_then(|f| f.set_len(1 << 30))
        .expect("sparse file");
    c.call::<_, serde_json::Value>("disk_add", add("d4", &zeros))
        .await
        .expect("a sparse file of zeros");

    let test = "disk_add_refuses_data_and_devices_in_use_accepts_zeros_and_wipes_on_request";
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {test} (block device part): needs root (losetup, mount)");
        d.stop().await;
        return;
    }
    let img = dir.path().join("fs.img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(32 << 20))
        .expect("image");
    let out = std::process::Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&img)
        .output()
        .expect("losetup");
    if !out.status.success() {
        eprintln!(
            "SKIP {test} (block device part): losetup: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        d.stop().await;
        return;
    }
    let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).expect("mnt");
    let run =
        |p: &str, a: &[&std::ffi::OsStr]| std::process::Command::new(p).args(a).status().expect(p).success();
    assert!(run("mkfs.ext4", &["-q".as_ref(), dev.as_os_str()]));
    assert!(run("mount", &[dev.as_os_str(), mnt.as_os_str()]));
    let e = c
        .call::<_, serde_json::Value>("disk_add", add("d3", &dev))
        .await
        .expect_err("a mounted device");
    assert_eq!(rpc_kind(&e), Some(ErrorKind::FailedPrecondition), "{e}");
    assert!(e.to_string().contains("in use"), "{e}");
    assert!(run("umount", &[mnt.as_os_str()]));
    // unmounted, its file system is still data: refused by name, until wiped
    let e = c
        .call::<_, serde_json::Value>("disk_add", add("d3", &dev))
        .await
        .expect_err("a device with a file system");
    assert_eq!(rpc_kind(&e), Some(ErrorKind::FailedPrecondition), "{e}");
    assert!(
        e.to_string().contains("ext2/3/4 file system") && e.to_string().contains("--wipe"),
        "{e}"
    );
    let mut wiped = add("d3", &dev);
    wiped["wipe"] = json!(true);
    c.call::<_, serde_json::Value>("disk_add", wiped)
        .await
        .expect("the device, wiped");
    let probe = std::process::Command::new("blkid")
        .arg("-p")
        .arg(&dev)
        .output()
        .expect("blkid");
    assert!(
        !String::from_utf8_lossy(&probe.stdout).contains("ext4"),
        "blkid still finds the file system: {}",
        String::from_utf8_lossy(&probe.stdout)
    );
    assert!(run("losetup", &["-d".as_ref(), dev.as_os_str()]));
    d.stop().await;
}

/// A graceful stop is bounded: connections to the admin socket and to the
/// Longhorn ports that never finish a request (nothing sent, half an HTTP
/// request, half the HTTP/2 preface) do not hold SIGTERM's exit for their
/// idle bound (120 s on the Longhorn ports). The wait below is generous
/// (30 s, six times the grace) and asserts only that the daemon exited.
#[test]
fn sigterm_ends_the_daemon_despite_connections_that_send_nothing() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tempdir");
    let base = talon::runtime::testing::reserve_ports(&[std::net::IpAddr::from([127, 0, 0, 1])]);
    let socket = dir.path().join("run/talon.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_talon"))
        .arg("--socket")
        .arg(&socket)
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .arg("--spdk-tgt")
        .arg(dir.path().join("no/spdk_tgt"))
        .args(["--longhorn-listen", &format!("127.0.0.1:{base}")])
        .env_remove("TALON_SPDK_DIR")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn talon");
    // killed however the test ends
    struct Kill(u32);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0 as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let _kill = Kill(child.id());
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(connect_retry(&socket));
    let mut held: Vec<Box<dyn std::any::Any>> = Vec::new();
    // the admin socket: one silent, one with half a request
    let silent = std::os::unix::net::UnixStream::connect(&socket).expect("unix connect");
    held.push(Box::new(silent));
    let mut half = std::os::unix::net::UnixStream::connect(&socket).expect("unix connect");
    half.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\"")
        .expect("half a request");
    held.push(Box::new(half));
    // each Longhorn port: one silent, one with half the HTTP/2 preface
    let mut up = false;
    for _ in 0..300 {
        if std::net::TcpStream::connect(("127.0.0.1", base)).is_ok() {
            up = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(up, "the Longhorn ports did not come up at {base}");
    for i in 0..5u16 {
        let silent = std::net::TcpStream::connect(("127.0.0.1", base + i)).expect("tcp connect");
        held.push(Box::new(silent));
        let mut half = std::net::TcpStream::connect(("127.0.0.1", base + i)).expect("tcp connect");
        half.write_all(b"PRI * HTTP/2.0\r\n").expect("half a preface");
        held.push(Box::new(half));
    }
    // the connections are accepted before the stop
    std::thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let mut status = None;
    for _ in 0..300 {
        if let Some(s) = child.try_wait().expect("try_wait") {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(held);
    let status = status.expect("talon exits on SIGTERM while connections that send nothing are open");
    assert!(status.success(), "clean exit on SIGTERM: {status}");
}
