//! Backups that wait, stop, crash or run out of room, on a real spdk_tgt
//! (`TALON_SPDK_DIR`) through `talon serve` (in-process, or a process that
//! is killed), to a real S3 server (s3s-fs on loopback) behind a gate that
//! holds the requests a test names (every `PUT`, or a backup's block uploads
//! or a restore's block downloads after the first few):
//!
//! ```text
//!   talon serve ──S3──> Gate (held: PUT *, or PUT|GET */blocks/* after N) ──> s3s-fs
//!      └─ data dir: a temp dir, or a small tmpfs (the full-disk cases)
//! ```
//!
//! - a backup queued behind one whose name sorts after it starts when that
//!   one ends;
//! - a backup deleted while it runs (its snapshot exported to talon by the
//!   data mover) leaves no export, and none stages a file on the data dir;
//! - what an older, staging talon left when stopped (a staging file, an
//!   aio bdev) goes at the next start;
//! - a backup with less room on the data dir than its data succeeds and
//!   takes no room there (read through the mover);
//! - a restore on a data dir with no room for the backup succeeds: it
//!   writes nothing there (streamed into the replica through the mover);
//! - talon killed (-9) mid-upload and mid-restore: nothing listed complete
//!   meanwhile, both finished by the next talon, nothing left behind;
//! - spdk_tgt killed (-9) mid-backup: talon starts it again, the volume is
//!   served again, the backup is tried again and completes (it restores
//!   bit-exact), and so does the next one; killed mid-restore: the restore
//!   is made again and reads back.

#[path = "support/restart.rs"]
mod restart;
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
mod tgt_common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use talon::client::Client;
use talon::runtime::testing::eventually;
use talon::serve::ServeOptions;
use talon::spdk::SpdkClient;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const MIB: u64 = 1 << 20;
const TARGET: &str = "s3://backups@us-east-1/talon/";
const WAIT: Duration = Duration::from_secs(180);

/// A TCP proxy in front of the S3 server that holds requests a [`Hold`]
/// names (a backup's block uploads, a restore's block downloads) until the
/// hold is lifted.
struct Gate {
    addr: SocketAddr,
    hold: Arc<tokio::sync::watch::Sender<Option<Hold>>>,
    /// Requests held now.
    waiting: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// Which requests a [`Gate`] holds: those whose request line starts with
/// `method` and holds `path`, once `passes` more of them went through.
#[derive(Debug, Clone, Copy)]
struct Hold {
    method: &'static str,
    path: &'static str,
    passes: usize,
}

impl Hold {
    /// Whether `request` (a chunk read from the client) may go on now; a
    /// pass it takes is counted.
    fn lets_through(hold: &mut Option<Hold>, request: &[u8]) -> bool {
        let Some(h) = hold else {
            return true;
        };
        let line = request.split(|b| *b == b'\n').next().unwrap_or_default();
        if !line.starts_with(h.method.as_bytes())
            || !line.windows(h.path.len()).any(|w| w == h.path.as_bytes())
        {
            return true;
        }
        if h.passes == 0 {
            return false;
        }
        h.passes -= 1;
        true
    }
}

impl Gate {
    async fn start(upstream: SocketAddr) -> Gate {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let hold = Arc::new(tokio::sync::watch::channel(None).0);
        let waiting = Arc::new(AtomicUsize::new(0));
        let (h, w) = (hold.clone(), waiting.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let (hold, waiting) = (h.clone(), w.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async move {
                        let mut rx = hold.subscribe();
                        let mut buf = vec![0u8; 64 << 10];
                        loop {
                            let n = cr.read(&mut buf).await.unwrap_or(0);
                            if n == 0 {
                                let _ = sw.shutdown().await;
                                return;
                            }
                            loop {
                                rx.borrow_and_update();
                                let mut go = true;
                                hold.send_if_modified(|h| {
                                    go = Hold::lets_through(h, &buf[..n]);
                                    false
                                });
                                if go {
                                    break;
                                }
                                waiting.fetch_add(1, Ordering::SeqCst);
                                let changed = rx.changed().await;
                                waiting.fetch_sub(1, Ordering::SeqCst);
                                if changed.is_err() {
                                    return;
                                }
                            }
                            if sw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    let down = async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        Gate {
            addr,
            hold,
            waiting,
            task,
        }
    }

    /// Closed: every `PUT` held (a backup's first write is its lock); open: none.
    fn set_open(&self, open: bool) {
        self.set_hold((!open).then_some(Hold {
            method: "PUT ",
            path: "/",
            passes: 0,
        }));
    }

    fn set_hold(&self, hold: Option<Hold>) {
        self.hold.send_replace(hold);
    }

    /// Requests held now.
    fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// A secret manifest whose endpoint is the gate.
    fn secret_manifest(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s3\nstringData:\n  AWS_ACCESS_KEY_ID: {}\n  AWS_SECRET_ACCESS_KEY: {}\n  AWS_ENDPOINTS: http://{}\n",
            s3_server::ACCESS_KEY,
            s3_server::SECRET_KEY,
            self.addr
        )
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A tmpfs of `size_mib` mounted on `at` (made), unmounted when dropped;
/// `None` after a `SKIP` line when it cannot be mounted (not root).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(test: &str, at: &Path, size_mib: u64) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).expect("mount point");
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size_mib}m,mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(at.to_owned())),
            Ok(o) => {
                eprintln!(
                    "SKIP {test}: mounting a tmpfs data dir: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIP {test}: mount: {e}");
                None
            }
        }
    }

    /// Bytes free on it.
    fn free(&self) -> u64 {
        let s = nix::sys::statvfs::statvfs(&self.0).expect("statvfs");
        s.blocks_available() as u64 * s.fragment_size() as u64
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A daemon on real SPDK with one 1 GiB file disk under `dir` and its NVMe-oF
/// export on `port` (spdk_dd writes through it); `keep_target`: its
/// spdk_tgt outlives it (the next daemon adopts it).
fn options(dir: &Path, spdk: &Path, port: u16, keep_target: bool) -> ServeOptions {
    ServeOptions {
        config: Some(write_config(dir, port)),
        stop_targets_on_exit: !keep_target,
        ..serve_daemon::opts(dir, serve_daemon::real_spdk(spdk, 2048))
    }
}

/// Writes `<dir>/talon.yaml` of [`options`] (a `talon serve` process of
/// `restart::spawn_talon` reads it there too); returns its path.
fn write_config(dir: &Path, port: u16) -> PathBuf {
    let y = format!(
        "node:\n  engine: v2\n  listenAddress: 127.0.0.1\n  nvmfPort: {port}\n  allowedHosts: [\"{}\"]\n  backupSecretsDir: {}\ndisks:\n  d1:\n    path: {}\n    sizeBytes: {}\n",
        spdk_perf::HOST_NQN,
        dir.join("secrets").display(),
        dir.join("disks/d1.img").display(),
        1u64 << 30
    );
    let config = dir.join("talon.yaml");
    std::fs::write(&config, y).expect("config");
    config
}

/// Volume `vol` (64 MiB, one replica) with `data_mib` MiB written at its
/// start, and its snapshot `s1`.
async fn volume_with_snapshot(c: &Client, spdk: &Path, dir: &Path, port: u16, data_mib: u64) {
    let _: Value = c
        .call(
            "volume_create",
            json!({"name": "vol", "sizeBytes": 64 * MIB, "replicas": 1, "wait": true, "timeoutSeconds": 180}),
        )
        .await
        .expect("volume_create");
    if data_mib > 0 {
        let nqn = format!("{}:vol:vol", talon::names::NQN_PREFIX);
        let work = dir.join("dd");
        std::fs::create_dir_all(&work).expect("dd dir");
        let data = pattern(data_mib);
        let (spdk, work) = (spdk.to_owned(), work.clone());
        tokio::task::spawn_blocking(move || spdk_dd::dd_write_at(&spdk, &work, port, &nqn, &data, 0))
            .await
            .expect("dd");
    }
    let _: Value = c
        .call(
            "snapshot_create",
            json!({"volume": "vol", "name": "s1", "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect("snapshot_create");
}

/// The bytes [`volume_with_snapshot`] writes: `mib` MiB, each 4 KiB block
/// its own value.
fn pattern(mib: u64) -> Vec<u8> {
    (0..mib * MIB).map(|i| (i / 4096 % 251 + 1) as u8).collect()
}

/// Asserts that restored volume `name` (`v`, its `volume_get`; one replica
/// `<name>-r0`) is thin, its replica holding about the backup's `data_mib`
/// MiB (and its superblock room), and reads back [`pattern`] through its export.
async fn assert_restored(dir: &Path, spdk: &Path, port: u16, name: &str, v: &Value, data_mib: u64) {
    let inv = talon::spdk::volume::Inventory::load(&SpdkClient::new(dir.join("run/spdk.sock")))
        .await
        .expect("inventory");
    let r0 = inv
        .find_lvol(&format!("{name}-r0"))
        .unwrap_or_else(|| panic!("{name}'s replica"));
    let cluster = inv
        .lvstores
        .iter()
        .find(|l| l.name == r0.lvs.name)
        .expect("its lvstore")
        .cluster_size;
    let allocated = r0.num_allocated_clusters * cluster;
    assert!(
        (data_mib * MIB..=(data_mib + 4) * MIB).contains(&allocated),
        "{name}: the restored replica holds about the backup's {data_mib} MiB: {allocated} bytes"
    );
    let nqn = v["engine"]["exports"][0]["name"]
        .as_str()
        .expect("the export")
        .to_owned();
    let work = dir.join(format!("dd-{name}"));
    std::fs::create_dir_all(&work).expect("dd dir");
    let (sp, w) = (spdk.to_owned(), work.clone());
    let len = (data_mib * MIB) as usize;
    let got = tokio::task::spawn_blocking(move || spdk_dd::dd(&sp, &w, port, &nqn, None, len))
        .await
        .expect("dd");
    assert!(
        got == pattern(data_mib),
        "{name}: the restored volume reads the backup"
    );
}

/// The name a secret file in the node's backupSecretsDir is asked by.
fn secret_name(secret: &Path) -> String {
    secret
        .file_name()
        .expect("a secret's file name")
        .to_string_lossy()
        .into_owned()
}

/// Starts backup `name` of `vol@s1` (not waited for).
async fn start_backup(c: &Client, secret: &Path, name: &str) {
    start_backup_with(c, secret, name, json!({})).await
}

/// [`start_backup`] with `extra` params (`blockSize`, `concurrency`).
async fn start_backup_with(c: &Client, secret: &Path, name: &str, extra: Value) {
    let mut p = json!({"name": name, "volume": "vol", "snapshot": "s1", "target": TARGET,
                       "credentialSecret": secret_name(secret)});
    if let (Some(p), Some(extra)) = (p.as_object_mut(), extra.as_object()) {
        p.extend(extra.clone());
    }
    let _: Value = c
        .call("backup_create", p)
        .await
        .unwrap_or_else(|e| panic!("backup_create {name}: {e}"));
}

/// Backup `name`'s status once `done` takes it.
async fn backup_status(c: &Client, name: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    eventually(&format!("backup {name} {what}"), WAIT, || async {
        let v: Value = c.call("backup_get", json!({"name": name})).await.ok()?;
        let s = v["status"].clone();
        done(&s).then_some(s)
    })
    .await
}

/// The aio bdevs of backups in spdk_tgt.
async fn backup_bdevs(spdk: &SpdkClient) -> Vec<String> {
    spdk.bdev_get_bdevs(&Default::default())
        .await
        .expect("bdev_get_bdevs")
        .into_iter()
        .map(|b| b.name)
        .filter(|b| b.starts_with("talon-backup-"))
        .collect()
}

/// The mover's exports of backups' snapshots in spdk_tgt (their NQNs).
async fn backup_exports(spdk: &SpdkClient) -> Vec<String> {
    spdk.nvmf_get_subsystems(&Default::default())
        .await
        .expect("nvmf_get_subsystems")
        .into_iter()
        .map(|s| s.nqn)
        .filter(|n| n.contains(":mover:") && n.contains(":backup:"))
        .collect()
}

/// What a test needs: SPDK and spdk_dd, a temp dir, the S3 server and its gate.
async fn setup(test: &str) -> Option<(PathBuf, tempfile::TempDir, s3_server::S3Server, Gate, PathBuf)> {
    let spdk = spdk_real::spdk_dir_with(test, &["spdk_dd"])?;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = s3_server::S3Server::start(&dir.path().join("s3"), "backups").await;
    let gate = Gate::start(server.addr).await;
    // a secret given to the node: named, in its backupSecretsDir
    std::fs::create_dir_all(dir.path().join("secrets")).expect("secrets");
    let secret = dir.path().join("secrets/s3");
    std::fs::write(&secret, gate.secret_manifest()).expect("secret");
    Some((spdk, dir, server, gate, secret))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_backup_queued_behind_one_named_after_it_starts_when_that_one_ends() {
    let test = "real_spdk_a_backup_queued_behind_one_named_after_it_starts_when_that_one_ends";
    let Some((spdk, dir, _server, gate, secret)) = setup(test).await else {
        return;
    };
    let port = spdk_real::free_port();
    let d = serve_daemon::start(options(dir.path(), &spdk, port, false)).await;
    volume_with_snapshot(&d.client, &spdk, dir.path(), port, 4).await;

    // zz-first runs (held in its upload); aa-second, created after, waits for it
    gate.set_open(false);
    start_backup(&d.client, &secret, "zz-first").await;
    backup_status(&d.client, "zz-first", "in progress", |s| {
        s["state"] == "inProgress"
    })
    .await;
    start_backup(&d.client, &secret, "aa-second").await;
    let s = backup_status(&d.client, "aa-second", "queued", |s| s["state"] == "pending").await;
    assert!(
        s["message"]
            .as_str()
            .is_some_and(|m| m.contains("waiting for backup zz-first")),
        "{s}"
    );
    gate.set_open(true);
    let first = backup_status(&d.client, "zz-first", "ended", |s| {
        s["state"] == "completed" || s["state"] == "error"
    })
    .await;
    assert_eq!(first["state"], "completed", "{first}");
    // the queued one starts when the first ends, with no other change to wake it
    let second = backup_status(&d.client, "aa-second", "ended", |s| {
        s["state"] == "completed" || s["state"] == "error"
    })
    .await;
    assert_eq!(second["state"], "completed", "{second}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_backup_deleted_while_it_runs_leaves_no_export_and_stages_nothing() {
    let test = "real_spdk_a_backup_deleted_while_it_runs_leaves_no_export_and_stages_nothing";
    let Some((spdk, dir, _server, gate, secret)) = setup(test).await else {
        return;
    };
    let port = spdk_real::free_port();
    let d = serve_daemon::start(options(dir.path(), &spdk, port, false)).await;
    let spdk_client = SpdkClient::new(dir.path().join("run/spdk.sock"));
    volume_with_snapshot(&d.client, &spdk, dir.path(), port, 16).await;

    // held at its first write (the store's lock), its snapshot exported to talon
    // by the mover: nothing of the volume's data on the data dir
    gate.set_open(false);
    start_backup(&d.client, &secret, "up").await;
    backup_status(&d.client, "up", "in progress", |s| s["state"] == "inProgress").await;
    let exports = eventually("backup up's export of its snapshot", WAIT, || async {
        let e = backup_exports(&spdk_client).await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(
        exports.len(),
        1,
        "one export, of the snapshot (a full backup): {exports:?}"
    );
    assert!(
        !dir.path().join("data/backup/up.img").exists(),
        "a backup stages no file on the data dir"
    );
    let _: Value = d
        .client
        .call("backup_delete", json!({"name": "up", "wait": true}))
        .await
        .expect("backup_delete up");
    eventually("backup up's export removed", WAIT, || async {
        backup_exports(&spdk_client).await.is_empty().then_some(())
    })
    .await;
    gate.set_open(true);
    // the next backup runs to its end and leaves no export either
    start_backup(&d.client, &secret, "next").await;
    let s = backup_status(&d.client, "next", "ended", |s| {
        s["state"] == "completed" || s["state"] == "error"
    })
    .await;
    assert_eq!(s["state"], "completed", "{s}");
    assert!(
        backup_exports(&spdk_client).await.is_empty(),
        "an ended backup leaves no export"
    );
    assert!(backup_bdevs(&spdk_client).await.is_empty(), "nor an aio bdev");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_staging_file_and_bdev_a_stopped_talon_left_go_at_the_next_start() {
    let test = "real_spdk_a_staging_file_and_bdev_a_stopped_talon_left_go_at_the_next_start";
    let Some(spdk) = spdk_real::spdk_dir(test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let port = spdk_real::free_port();
    let d = serve_daemon::start(options(dir.path(), &spdk, port, true)).await;
    let spdk_client = SpdkClient::new(dir.path().join("run/spdk.sock"));
    let _: Value = d
        .client
        .call(
            "volume_create",
            json!({"name": "vol", "sizeBytes": 64 * MIB, "replicas": 1, "wait": true, "timeoutSeconds": 180}),
        )
        .await
        .expect("volume_create");
    // what a talon stopped in a backup's copy leaves: its file, and its aio bdev in spdk_tgt
    let file = dir.path().join("data/backup/gone.img");
    std::fs::create_dir_all(file.parent().expect("dir")).expect("backup dir");
    std::fs::File::create(&file)
        .and_then(|f| f.set_len(64 * MIB))
        .expect("staging file");
    spdk_client
        .bdev_aio_create(&talon::spdk::rpc::AioCreate {
            filename: file.display().to_string(),
            name: "talon-backup-gone".into(),
            block_size: Some(4096),
            readonly: false,
            fallocate: false,
        })
        .await
        .expect("bdev_aio_create");
    d.stop().await;
    // the next talon adopts the target and removes both
    let d = serve_daemon::start(options(dir.path(), &spdk, port, false)).await;
    eventually("what the stopped talon left removed", WAIT, || async {
        (!file.exists() && backup_bdevs(&spdk_client).await.is_empty()).then_some(())
    })
    .await;
    d.stop().await;
}

/// Issue 55: a backup reads its snapshot through the mover, nothing on the
/// data dir: 40 MiB of data backed up with a 24 MiB data dir succeeds and
/// takes no room there (before, it staged the snapshot in
/// `<data>/backup/<name>.img` and failed "no space left on" it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_backup_with_a_small_data_dir_writes_nothing_there_and_succeeds() {
    let test = "real_spdk_a_backup_with_a_small_data_dir_writes_nothing_there_and_succeeds";
    let Some((spdk, dir, _server, _gate, secret)) = setup(test).await else {
        return;
    };
    let Some(data) = Tmpfs::mount(test, &dir.path().join("data"), 24) else {
        return;
    };
    let port = spdk_real::free_port();
    let d = serve_daemon::start(options(dir.path(), &spdk, port, false)).await;
    // 40 MiB of data: more than the data dir's 24 MiB
    volume_with_snapshot(&d.client, &spdk, dir.path(), port, 40).await;
    let before = data.free();
    start_backup(&d.client, &secret, "big").await;
    let s = backup_status(&d.client, "big", "ended", |s| {
        s["state"] == "completed" || s["state"] == "error"
    })
    .await;
    eprintln!("{test}: {s}");
    assert_eq!(s["state"], "completed", "{s}");
    assert_eq!(s["blocksUploaded"], 20, "40 MiB of data in 2 MiB blocks: {s}");
    let after = data.free();
    assert!(
        before.saturating_sub(after) < MIB,
        "the backup took room on the data dir: {before} -> {after} bytes free"
    );
    d.stop().await;
    drop(data);
}

/// Issue 55: a restore writes the backup (here one of 16 MiB blocks) straight into the
/// volume's thin replica (through the mover), nothing on the data dir: a 40 MiB restore
/// with 16 MiB free there succeeds, reads back the backup, and takes no
/// room on the data dir (before, it staged the backup in
/// `<data>/restore/<volume>.img` and failed "no space left on" it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_restore_with_a_full_data_dir_writes_nothing_there_and_succeeds() {
    let test = "real_spdk_a_restore_with_a_full_data_dir_writes_nothing_there_and_succeeds";
    let Some((spdk, dir, _server, _gate, secret)) = setup(test).await else {
        return;
    };
    let Some(data) = Tmpfs::mount(test, &dir.path().join("data"), 64) else {
        return;
    };
    let port = spdk_real::free_port();
    let d = serve_daemon::start(options(dir.path(), &spdk, port, false)).await;
    volume_with_snapshot(&d.client, &spdk, dir.path(), port, 40).await;
    // in blocks of 16 MiB (Longhorn's other backup-block-size), 2 uploads at once
    start_backup_with(
        &d.client,
        &secret,
        "b1",
        json!({"blockSize": 16 * MIB, "concurrency": 2}),
    )
    .await;
    let s = backup_status(&d.client, "b1", "ended", |s| {
        s["state"] == "completed" || s["state"] == "error"
    })
    .await;
    assert_eq!(s["state"], "completed", "{s}");
    assert_eq!(s["blocksUploaded"], 3, "40 MiB of data in blocks of 16 MiB: {s}");
    // the data dir with 16 MiB free: a 40 MiB restore file could not fit
    let ballast = dir.path().join("data/ballast");
    let keep = 16 * MIB;
    let f = std::fs::File::create(&ballast).expect("ballast");
    let fill = data.free().saturating_sub(keep);
    std::io::Write::write_all(&mut &f, &vec![1u8; fill as usize]).expect("ballast written");
    f.sync_all().expect("sync");
    let before = data.free();
    let _: Value = d
        .client
        .call(
            "backup_restore",
            json!({"backup": "b1", "backupVolume": "vol", "target": TARGET,
                   "credentialSecret": secret_name(&secret), "volume": "rv",
                   "replicas": 1}),
        )
        .await
        .expect("backup_restore");
    let v = eventually("volume rv restored and ready", WAIT, || async {
        let v: Value = d.client.call("volume_get", json!({"name": "rv"})).await.ok()?;
        assert!(!v.to_string().contains("no space left on"), "{v}");
        (v["engine"]["state"] == "ready").then_some(v)
    })
    .await;
    eprintln!("{test}: {v}");
    assert!(
        !dir.path().join("data/restore").exists(),
        "nothing written under the data dir's restore/"
    );
    assert!(
        data.free() + MIB >= before,
        "no room taken on the data dir: {} free, {} before the restore",
        data.free(),
        before
    );
    assert_restored(dir.path(), &spdk, port, "rv", &v, 40).await;
    let _: Value = d
        .client
        .call(
            "volume_delete",
            json!({"name": "rv", "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect("volume_delete rv");
    d.stop().await;
    drop(data);
}

/// Files under `root` whose path holds `part`.
fn files_under(root: &Path, part: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                files_under(&p, part)
            } else {
                usize::from(p.to_string_lossy().contains(part))
            }
        })
        .sum()
}

/// The lvols in spdk_tgt whose alias (`<lvs>/<name>`) holds `part`.
async fn lvols_named(spdk: &SpdkClient, part: &str) -> Vec<String> {
    talon::spdk::volume::Inventory::load(spdk)
        .await
        .expect("inventory")
        .lvols
        .values()
        .map(|l| l.alias.clone())
        .filter(|n| n.contains(part))
        .collect()
}

/// The mover's exports in spdk_tgt (backups, restores, copies).
async fn mover_exports(spdk: &SpdkClient) -> Vec<String> {
    spdk.nvmf_get_subsystems(&Default::default())
        .await
        .expect("nvmf_get_subsystems")
        .into_iter()
        .map(|s| s.nqn)
        .filter(|n| n.contains(":mover:"))
        .collect()
}

/// Volume `name` once its engine is ready (its `volume_get`).
async fn ready_volume(c: &Client, name: &str) -> Value {
    eventually(&format!("volume {name} ready"), WAIT, || async {
        let v: Value = c.call("volume_get", json!({"name": name})).await.ok()?;
        (v["engine"]["state"] == "ready").then_some(v)
    })
    .await
}

/// Starts the restore of backup k1 of `vol` into new volume `rv` (one
/// replica) with the gate holding its block downloads after the first two;
/// returns once one is held (the copy under way, `rv-r0.rst` made).
async fn restore_held(c: &Client, gate: &Gate, secret: &Path) {
    gate.set_hold(Some(Hold {
        method: "GET ",
        path: "/blocks/",
        passes: 2,
    }));
    let _: Value = c
        .call(
            "backup_restore",
            json!({"backup": "k1", "backupVolume": "vol", "target": TARGET,
                   "credentialSecret": secret_name(secret), "volume": "rv", "replicas": 1}),
        )
        .await
        .expect("backup_restore");
    eventually("the restore held in its copy", WAIT, || async {
        (gate.waiting() > 0).then_some(())
    })
    .await;
}

/// Asserts that `rv`, restored again after its copy was cut off, is served
/// thin with k1's 24 MiB, and that no half-restored lvol nor mover export is left.
async fn restored_again(c: &Client, dir: &Path, spdk: &Path, port: u16) {
    let v = ready_volume(c, "rv").await;
    assert_restored(dir, spdk, port, "rv", &v, 24).await;
    let spdk_client = SpdkClient::new(dir.join("run/spdk.sock"));
    assert!(
        lvols_named(&spdk_client, ".rst").await.is_empty(),
        "no half-restored lvol left"
    );
    assert!(
        mover_exports(&spdk_client).await.is_empty(),
        "no mover export left"
    );
}

/// Kills (-9) the spdk_tgt talon runs (TargetStatus `spdk`).
async fn kill_target(c: &Client) {
    let pid = restart::spec(c, "TargetStatus", "spdk")
        .await
        .and_then(|t| t["pid"].as_u64())
        .expect("spdk_tgt's pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill spdk_tgt");
}

/// Issue 55: `talon serve` killed (-9) in a backup's upload (one block
/// stored, the next held) and then in a restore's copy (two blocks written
/// into the new replica, the next held). After each kill the store lists
/// no complete backup, and the next talon (on the same spdk_tgt) finishes
/// the backup (it restores bit-exact) and the restore (thin, reads the
/// backup), with no mover export and no half-restored lvol left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_talon_killed_mid_backup_and_mid_restore_finishes_both_when_it_is_back() {
    let test = "real_spdk_talon_killed_mid_backup_and_mid_restore_finishes_both_when_it_is_back";
    let Some((spdk, dir, server, gate, secret)) = setup(test).await else {
        return;
    };
    let dir = dir.path();
    let port = spdk_real::free_port();
    write_config(dir, port);
    let socket = dir.join("run/talon.sock");
    let spdk_client = SpdkClient::new(dir.join("run/spdk.sock"));
    let mut talon = restart::Cleanup::new(dir, restart::spawn_talon(dir, restart::V2_ARGS));
    let c = restart::connect(&socket).await;
    volume_with_snapshot(&c, &spdk, dir, port, 24).await;
    talon.spdk_tgt = restart::spec(&c, "TargetStatus", "spdk")
        .await
        .and_then(|t| t["pid"].as_u64())
        .map(|p| p as u32);
    let store = talon::backupstore::Store::open(
        TARGET,
        &talon::backupstore::Credentials::from_secret(&secret).expect("credentials"),
    )
    .expect("store");
    let s3 = dir.join("s3");

    // killed in the upload: the lock and one block through, the next held
    gate.set_hold(Some(Hold {
        method: "PUT ",
        path: "/blocks/",
        passes: 1,
    }));
    start_backup_with(&c, &secret, "k1", json!({"concurrency": 1})).await;
    eventually("backup k1 held in its upload, a block stored", WAIT, || async {
        (gate.waiting() > 0 && files_under(&s3, "/blocks/") > 0).then_some(())
    })
    .await;
    assert_eq!(
        mover_exports(&spdk_client).await.len(),
        1,
        "the snapshot is read through one export"
    );
    restart::stop_talon(&mut talon.take(), restart::Stop::Kill, &socket);
    let complete = talon::backupstore::ops::complete_backups(&store, "vol")
        .await
        .expect("the store's backups");
    assert!(
        complete.is_empty(),
        "a backup cut off in its upload is not listed complete: {complete:?}"
    );
    gate.set_hold(None);
    talon.talon = Some(restart::spawn_talon(dir, restart::V2_ARGS));
    let c = restart::connect(&socket).await;
    let s = backup_status(&c, "k1", "ended after the restart", |s| {
        s["state"] == "completed" || s["state"] == "error"
    })
    .await;
    assert_eq!(s["state"], "completed", "the next talon finishes backup k1: {s}");
    eventually("the cut-off backup's export removed", WAIT, || async {
        mover_exports(&spdk_client).await.is_empty().then_some(())
    })
    .await;

    // killed in the restore's copy: two blocks written into the new replica, the next held
    restore_held(&c, &gate, &secret).await;
    let cut = lvols_named(&spdk_client, "rv-r0.rst").await;
    assert_eq!(cut.len(), 1, "the replica is copied under its .rst name: {cut:?}");
    restart::stop_talon(&mut talon.take(), restart::Stop::Kill, &socket);
    gate.set_hold(None);
    talon.talon = Some(restart::spawn_talon(dir, restart::V2_ARGS));
    let c = restart::connect(&socket).await;
    restored_again(&c, dir, &spdk, port).await;
    // and the backup the first talon started restores bit-exact by the store's own reader
    let out = dir.join("k1.img");
    talon::backupstore::ops::restore_to_file(&store, "vol", "k1", &out, 0, &Default::default())
        .await
        .expect("restore k1 to a file");
    let got = std::fs::read(&out).expect("k1.img");
    assert!(
        got[..(24 * MIB) as usize] == pattern(24),
        "backup k1 holds the data"
    );
    assert!(
        got[(24 * MIB) as usize..].iter().all(|b| *b == 0),
        "and zeros after it"
    );
    drop(server);
}

/// Issue 55: spdk_tgt killed (-9) while a backup uploads (its snapshot read
/// through the mover's export): talon starts the target again, the volume
/// is served again and reads back, the backup (its read cut off: "Connection
/// reset by peer") is tried again and completes, restoring bit-exact, and
/// the next backup completes with no export left. Then killed in a
/// restore's copy: the restore is made again, thin, and reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_spdk_tgt_killed_mid_backup_and_mid_restore_both_finish_and_the_volume_is_served_again() {
    let test =
        "real_spdk_spdk_tgt_killed_mid_backup_and_mid_restore_both_finish_and_the_volume_is_served_again";
    let Some((spdk, dir, _server, gate, secret)) = setup(test).await else {
        return;
    };
    let port = spdk_real::free_port();
    let d = serve_daemon::start(options(dir.path(), &spdk, port, false)).await;
    let spdk_client = SpdkClient::new(dir.path().join("run/spdk.sock"));
    volume_with_snapshot(&d.client, &spdk, dir.path(), port, 24).await;
    gate.set_hold(Some(Hold {
        method: "PUT ",
        path: "/blocks/",
        passes: 1,
    }));
    start_backup_with(&d.client, &secret, "k1", json!({"concurrency": 1})).await;
    eventually("backup k1 held in its upload", WAIT, || async {
        (gate.waiting() > 0).then_some(())
    })
    .await;
    kill_target(&d.client).await;
    gate.set_hold(None);
    let s = backup_status(&d.client, "k1", "ended", |s| {
        s["state"] == "completed" || s["state"] == "error"
    })
    .await;
    eprintln!("{test}: k1 after spdk_tgt was killed: {s}");
    assert_eq!(
        s["state"], "completed",
        "a backup whose reads the target's restart cut off is tried again: {s}"
    );
    // served again by the new target, and the data is still there
    let v = ready_volume(&d.client, "vol").await;
    let nqn = v["engine"]["exports"][0]["name"]
        .as_str()
        .expect("the export")
        .to_owned();
    let work = dir.path().join("dd-vol");
    std::fs::create_dir_all(&work).expect("dd dir");
    let (sp, w) = (spdk.clone(), work.clone());
    let got = tokio::task::spawn_blocking(move || {
        spdk_dd::dd_retried(
            &sp,
            &w,
            port,
            &nqn,
            None,
            (24 * MIB) as usize,
            "vol after the target's restart",
        )
    })
    .await
    .expect("dd");
    assert!(
        got == pattern(24),
        "the volume reads its data after spdk_tgt's restart"
    );
    // the next backup completes, and every complete one restores bit-exact
    start_backup(&d.client, &secret, "k2").await;
    let s = backup_status(&d.client, "k2", "ended", |s| {
        s["state"] == "completed" || s["state"] == "error"
    })
    .await;
    assert_eq!(s["state"], "completed", "{s}");
    assert!(
        mover_exports(&spdk_client).await.is_empty(),
        "no mover export left"
    );
    let store = talon::backupstore::Store::open(
        TARGET,
        &talon::backupstore::Credentials::from_secret(&secret).expect("credentials"),
    )
    .expect("store");
    let complete = talon::backupstore::ops::complete_backups(&store, "vol")
        .await
        .expect("the store's backups");
    let names: Vec<&str> = complete.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["k1", "k2"], "both listed complete");
    for b in &complete {
        let out = dir.path().join(format!("{}.img", b.name));
        talon::backupstore::ops::restore_to_file(&store, "vol", &b.name, &out, 0, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("restore {}: {e}", b.name));
        let got = std::fs::read(&out).expect("restored image");
        assert!(
            got[..(24 * MIB) as usize] == pattern(24),
            "backup {} holds the data",
            b.name
        );
    }

    // spdk_tgt killed again in a restore's copy (two blocks written into the new
    // replica, the next held): once the target is back the restore is made again
    restore_held(&d.client, &gate, &secret).await;
    kill_target(&d.client).await;
    gate.set_hold(None);
    restored_again(&d.client, dir.path(), &spdk, port).await;
    d.stop().await;
}
