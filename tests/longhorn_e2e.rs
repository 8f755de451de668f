//! talon under Longhorn's real control plane (issue 28): longhorn-manager
//! v1.12.1 and kube-apiserver v1.36.2 from `../shared/longhorn/v1.12.1/`
//! beside the checkout, etcd (Debian's etcd-server), no kubelet: a stand-in
//! kubelet runs the V2 instance-manager pod as `talon serve` on real SPDK
//! (`TALON_SPDK_DIR`). The harness is `tests/longhorn_e2e/` (Python, the
//! official `kubernetes` client); this test finds what it needs, runs it with
//! a time bound and turns its verdict into the test's.
//!
//! ```text
//!   cargo test ──> driver.py ──> netns: etcd, kube-apiserver, longhorn-manager,
//!        │            │                 stand-in kubelet ──> talon serve ──> spdk_tgt
//!        │            └── STEP <name> <s> lines (stdout), logs tail on failure (stderr)
//!        └── Guard: whatever state.json names (netns, loop devices) is removed
//!            even when the driver could not clean up itself
//! ```

#[path = "support/longhorn_e2e.rs"]
mod longhorn_e2e;
#[allow(dead_code)] // the secret manifest is other tests'
#[path = "support/s3_server.rs"]
mod s3_server;
#[path = "support/spdk_real.rs"]
mod spdk_real;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use longhorn_e2e::{Driver, Guard, PROGRAMS, on_path, python, skip, wait_bounded};

/// The driver's whole run; a pass takes a few minutes (the steps' own bounds are shorter), two
/// scenarios on one cluster up to ~10 under CI's load.
const BOUND: Duration = Duration::from_secs(1200);

fn tail(path: &Path, lines: usize) -> String {
    let mut s = String::new();
    let _ = std::fs::File::open(path).and_then(|mut f| f.read_to_string(&mut s));
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The last `lines` WARN and ERROR lines of each talon log kept in `dir`: a CI run's clone (and
/// its kept logs) is gone after the run, so what talon said goes into the failure message.
fn talon_warnings(dir: &Path, lines: usize) -> String {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("talon-"))
        })
        .collect();
    logs.sort();
    let mut out = String::new();
    for log in logs {
        let mut s = String::new();
        let _ = std::fs::File::open(&log).and_then(|mut f| f.read_to_string(&mut s));
        let hits: Vec<&str> = s
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .filter(|l| !l.contains("kernel module not loaded"))
            .collect();
        out += &format!(
            "talon's warnings and errors in {} (last {lines} of {}):\n{}\n",
            log.display(),
            hits.len(),
            hits[hits.len().saturating_sub(lines)..].join("\n")
        );
    }
    out
}

/// The hub's S3 server: on the apiserver's bridge address, which every node reaches.
const S3_PORT: u16 = 9000;
const S3_BUCKET: &str = "backups";
const S3_ENDPOINT: &str = "http://10.250.0.1:9000";

/// A real S3 server (s3s-fs) for the manager's backup target, in the driver's hub network
/// namespace (`talon-lh-e2e-<driver pid>`) once the driver made it: a thread of this test enters
/// that namespace, binds 0.0.0.0:9000 there and serves objects as files under `root`
/// (`<root>/<bucket>/<key>`, so the test reads the store afterwards as a folder target).
fn s3_in_hub(driver: u32, root: PathBuf) {
    std::thread::spawn(move || {
        let ns = PathBuf::from(format!("/run/netns/talon-lh-e2e-{driver}"));
        let end = Instant::now() + Duration::from_secs(300);
        // the file appears before `ip netns add` mounts the namespace on it
        loop {
            let entered = std::fs::File::open(&ns)
                .ok()
                .is_some_and(|f| nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).is_ok());
            if entered {
                break;
            }
            if Instant::now() > end {
                eprintln!("the hub namespace {} never appeared: no S3 server", ns.display());
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            return;
        };
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind(("0.0.0.0", S3_PORT))
                .await
                .expect("S3 server: bind 0.0.0.0:9000 in the hub namespace");
            let _server = s3_server::S3Server::start_on(listener, &root, S3_BUCKET);
            std::future::pending::<()>().await
        });
    });
}

/// What the manager's backup wrote, read back through talon's backupstore reader from the S3
/// server's files (a folder target over the same layout): the driver's pattern (seed 0x5A, 8 MiB)
/// at the start, zeros after.
fn check_backup(s3_root: &Path, work: &Path) {
    let target = format!("vfs://{}", s3_root.join(S3_BUCKET).display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = work.join("restored.img");
    let (volume, backup) = ("e2e-vol-1", "e2e-backup-1");
    rt.block_on(async {
        let store = talon::backupstore::Store::open(&target, &talon::backupstore::Credentials::none())
            .expect("the S3 server's files as a folder target");
        talon::backupstore::ops::restore_to_file(&store, volume, backup, &out, 0, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("restoring {backup} of {volume} from {target}: {e}"));
    });
    let got = std::fs::read(&out).expect("restored image");
    let mib = 1 << 20;
    let pattern: Vec<u8> = (0..8 * mib)
        .map(|i: usize| (((i as u64 * 2_654_435_761) >> (8 * (i % 4))) & 0xFF) as u8 ^ 0x5A)
        .collect();
    assert_eq!(got.len(), 128 * mib, "the volume's size");
    assert!(
        got[..8 * mib] == pattern[..],
        "backup {backup} holds the pattern written through the volume"
    );
    assert!(got[8 * mib..].iter().all(|b| *b == 0), "and zeros after it");
    eprintln!("backup {backup} of {volume}: restored from the S3 server's files, the pattern and zeros");
}

/// One at a time within this binary (`cargo test` runs tests on threads; nextest runs them in the
/// real-spdk group): each starts a control plane, talon and spdk_tgt.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Scenario 1: one node, a V2 volume of 1 replica (nvmf) attached, written and read back,
/// snapshotted, detached and deleted, nothing left in SPDK or talon.
#[test]
fn one_node_volume_lifecycle() {
    run_scenario("longhorn_e2e one_node_volume_lifecycle", "one-node", &[]);
}

/// Two nodes, 2 replicas: the manager's snapshot data integrity check, then bit rot in node 2's
/// copy of the snapshot (a block inverted on its disk): reported corrupted, set ERR through
/// `ReplicaModeUpdate`, taken out of the raid1 and rebuilt; kill -9 of one node's talon and
/// spdk_tgt and the manager rebuilding the replica, a revert in maintenance mode, online expansion (written and read past the old end),
/// the engine relocated to node 2 and back by `engineNodeID` while attached (the manager's
/// three-phase switch-over of the same engine-frontend, each new engine listing every snapshot
/// with its creation time, the data written after each move read back, a multipath host
/// (bdevperf, verify) writing through each move with no I/O error, a move the manager reverts
/// (its new engine in error after `switching`: the old engine optimized again), then the same two moves with
/// node 2's talon killed (-9) mid-move (`TALON_E2E_CRASH=0` leaves those two out,
/// `TALON_E2E_RELOCATE=0` all the moves), a second, migratable volume live-migrated to node 2 by a second
/// csi-attacher ticket and confirmed, then migrated back and rolled back (the data read through
/// each new engine-frontend; `TALON_E2E_MIGRATE=0` leaves it out), then detach, delete and
/// nothing left. Then, on the same cluster (one start of the control plane, the
/// managers and the instance managers for both: CI time), issue 52's CI-sized scale run: 10
/// volumes of 2 replicas (nvmf) created at once through the manager and attached, a short idle,
/// node 2's talon and spdk_tgt killed and started again (every volume healthy again, whether the
/// manager saw it degraded or not), all detached and deleted, then nothing left: no lvol, no raid
/// or NVMe bdev, no subsystem on either node, no Longhorn CR, no instance. The 50- and 100-volume
/// runs, the connected host and the figures are `cargo bench --bench longhorn_scale`.
#[test]
fn two_nodes_rebuild_expand_revert_then_scale_ten_volumes() {
    run_scenario(
        "longhorn_e2e two_nodes_rebuild_expand_revert_then_scale_ten_volumes",
        "two-nodes+scale",
        &["--volumes", "10", "--idle", "2", "--queues", "0"],
    );
}

fn run_scenario(test: &str, scenario: &str, extra: &[&str]) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !nix::unistd::geteuid().is_root() {
        return skip(test, "not root (network namespaces, loop devices, mounts)");
    }
    let Some(spdk) = spdk_real::spdk_dir_with(test, &["spdk_dd", "bdevperf"]) else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let longhorn = root.join("../shared/longhorn/v1.12.1");
    for f in ["longhorn-manager.xz", "kube-apiserver.xz", "longhorn-crds.yaml"] {
        if !longhorn.join(f).is_file() {
            return skip(
                test,
                format!(
                    "no {} (Longhorn's control plane beside the checkout)",
                    longhorn.join(f).display()
                ),
            );
        }
    }
    if let Some(p) = PROGRAMS.iter().find(|p| !on_path(p)) {
        return skip(test, format!("no `{p}` on PATH (tests/apt-packages.txt)"));
    }
    let Some(py) = python(root) else {
        return skip(
            test,
            "no Python with the kubernetes client (tests/pip-packages.txt into target/test-venv)",
        );
    };
    let work = tempfile::tempdir().expect("work dir");
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("longhorn-e2e");
    let _guard = Guard(work.path().to_path_buf());
    let t0 = Instant::now();
    let s3_root = work.path().join("s3");
    let driver = Driver {
        py: &py,
        root,
        work: work.path(),
        longhorn: &longhorn,
        cache: &cache,
        spdk: &spdk,
        talon: Path::new(env!("CARGO_BIN_EXE_talon")),
        s3_endpoint: S3_ENDPOINT,
    };
    let (out, err) = driver.out_err();
    let mut child = driver.spawn(scenario, extra);
    s3_in_hub(child.id(), s3_root.clone());
    let status = wait_bounded(&mut child, t0, BOUND);
    let steps = std::fs::read_to_string(&out).unwrap_or_default();
    eprintln!("{steps}wall time {:.0} s", t0.elapsed().as_secs_f64());
    // TALON_E2E_KEEP_LOGS: a passed run's logs too (to see where its time went)
    if !status.success() || std::env::var_os("TALON_E2E_KEEP_LOGS").is_some() {
        keep_logs(work.path(), &cache, scenario);
    }
    let failed: Vec<String> = std::fs::read_to_string(&err)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("FAILED:") || l.starts_with("why: "))
        .map(str::to_owned)
        .collect();
    assert!(
        status.success(),
        "{test}: the driver failed ({status}{}): {}\n{}its steps:\n{steps}\nthe logs are kept in {}\nits log's tail:\n{}",
        if t0.elapsed() > BOUND { ", out of time" } else { "" },
        failed.join("\n"),
        talon_warnings(&kept_logs(&cache, scenario), 25),
        kept_logs(&cache, scenario).display(),
        tail(&err, 150)
    );
    if scenario != "scale" {
        check_backup(&s3_root, work.path());
    }
}

/// Where a failed scenario's logs are kept (the work dir goes with the test).
fn kept_logs(cache: &Path, scenario: &str) -> PathBuf {
    cache.join("failed").join(scenario)
}

/// Keeps the logs of a failed run (the manager's, talon's, spdk_tgt's, the driver's), replacing
/// an earlier failure's.
fn keep_logs(work: &Path, cache: &Path, scenario: &str) {
    let to = kept_logs(cache, scenario);
    let _ = std::fs::remove_dir_all(&to);
    if std::fs::create_dir_all(&to).is_err() {
        return;
    }
    let mut logs: Vec<PathBuf> = ["driver.out", "driver.err"]
        .iter()
        .map(|f| work.join(f))
        .collect();
    logs.extend(
        std::fs::read_dir(work.join("logs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path()),
    );
    for pod in std::fs::read_dir(work).into_iter().flatten().flatten() {
        let log = pod.path().join("run/spdk_tgt.log");
        if log.is_file() {
            logs.push(log);
        }
    }
    for f in logs {
        let name = if f.ends_with("run/spdk_tgt.log") {
            format!(
                "spdk_tgt-{}.log",
                f.ancestors()
                    .nth(2)
                    .and_then(|p| p.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            )
        } else {
            f.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let _ = std::fs::copy(&f, to.join(name));
    }
}
