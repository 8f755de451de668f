//! Issue 19 against a real spdk_tgt (`TALON_SPDK_DIR`), through the whole
//! daemon (`talon::serve::serve` in-process, its API client):
//! - a restart of talon with 20 volumes, which the volume controller sets up
//!   16 at a time: the new target holds exactly one TCP transport
//!   (`nvmf_get_transports`) and its log has no error line;
//! - a disk whose path is a file that does not exist yet under /dev/shm (a
//!   tmpfs inside /dev) is created like any file disk, and a volume is served
//!   on it;
//! - a volume on a disk that failed (a device node missing from devtmpfs):
//!   `volume_create` with `wait` fails with the disk's error instead of
//!   waiting out its timeout (how long it took is printed, not asserted);
//! - (issue 54) a volume's lvols after its state store was lost: reported as
//!   orphans, kept, and removed only by `orphan_remove`;
//! - two replicas on disks of two block sizes: the volume fails naming each
//!   replica and its size (SPDK's raid1 takes one block size).
//!
//! The test spawns each spdk_tgt itself (`--no-huge -s 2048`, `-u`,
//! `--disable-cpumask-locks`) with its output in a log file, and talon adopts
//! it on `<run_dir>/spdk.sock` as it adopts a target that survived a crash;
//! a clean stop of talon stops the adopted target, like a drain of the node.

#[path = "support/serve_daemon.rs"]
mod serve_daemon;
#[path = "support/spdk_real.rs"]
mod spdk_real;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use serve_daemon::start;
use spdk_real::{free_port, spdk_dir};
use talon::serve::ServeOptions;
use talon::spdk::SpdkClient;
use talon::spdk::target::{Memory, TargetConfig, find_spdk_tgt, wait_ready};
use talon::spdk::volume::Inventory;

const WAIT: Duration = Duration::from_secs(180);

/// A spdk_tgt spawned by the test, its output in `log`; reaped in the
/// background (so a SIGINT from talon ends it at once) and killed when dropped.
struct Tgt {
    pid: i32,
    log: PathBuf,
    exited: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Tgt {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

impl Tgt {
    async fn spawn(spdk: &Path, run_dir: &Path, log: PathBuf) -> Tgt {
        let mut cfg = TargetConfig::new(run_dir);
        cfg.spdk_dir = Some(spdk.to_path_buf());
        cfg.memory = Memory::NoHuge { mem_size_mib: 2048 };
        // other jobs may run SPDK on core 0
        cfg.extra_args = vec!["--disable-cpumask-locks".into()];
        let bin = find_spdk_tgt(None, Some(spdk), None).expect("spdk_tgt");
        std::fs::create_dir_all(run_dir).expect("run dir");
        let out = std::fs::File::create(&log).expect("log");
        let err = out.try_clone().expect("log");
        let mut child = tokio::process::Command::new(bin)
            .args(cfg.argv())
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn spdk_tgt");
        let pid = child.id().expect("pid") as i32;
        wait_ready(
            &SpdkClient::new(cfg.socket()),
            Some(&mut child),
            Duration::from_secs(60),
        )
        .await
        .expect("spdk_tgt answers");
        let exited = tokio::spawn(async move {
            let _ = child.wait().await;
        });
        Tgt {
            pid,
            log,
            exited: Some(exited),
        }
    }

    /// The lines of its log that SPDK marks as errors.
    fn error_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("*ERROR*"))
            .map(str::to_owned)
            .collect()
    }
}

fn opts(dir: &Path, spdk: &Path, config: &Path) -> ServeOptions {
    ServeOptions {
        config: Some(config.to_path_buf()),
        // the test stops talon with its target, as a drain does (a plain stop leaves it serving)
        stop_targets_on_exit: true,
        set_aside_orphan_data: false,
        ..serve_daemon::opts(dir, serve_daemon::real_spdk(spdk, 2048))
    }
}

fn write_config(dir: &Path, port: u16, disks: &[(&str, u64)]) -> PathBuf {
    let mut y = format!("node:\n  engine: v2\n  listenAddress: 127.0.0.1\n  nvmfPort: {port}\ndisks:\n");
    for (d, size) in disks {
        y.push_str(&format!(
            "  {d}:\n    path: {}\n    sizeBytes: {size}\n",
            dir.join(format!("disks/{d}.img")).display()
        ));
    }
    let p = dir.join("talon.yaml");
    std::fs::write(&p, y).expect("config");
    p
}

async fn exported(c: &SpdkClient, names: &[String]) -> Option<()> {
    let inv = Inventory::load(c).await.ok()?;
    names
        .iter()
        .all(|n| {
            inv.subsystem(&format!("{}:vol:{n}", talon::names::NQN_PREFIX))
                .is_some_and(|s| s.namespaces.len() == 1 && !s.listen_addresses.is_empty())
        })
        .then_some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_restart_with_20_volumes_makes_one_transport() {
    let test = "real_spdk_restart_with_20_volumes_makes_one_transport";
    let Some(spdk) = spdk_dir(test) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("run");
    let config = write_config(dir.path(), free_port(), &[("d1", 1 << 30), ("d2", 1 << 30)]);
    let spdk_client = SpdkClient::new(run.join("spdk.sock"));

    // 1. talon serves 20 volumes (half with two replicas)
    let mut t1 = Tgt::spawn(&spdk, &run, dir.path().join("tgt1.log")).await;
    let d = start(opts(dir.path(), &spdk, &config)).await;
    let names: Vec<String> = (0..20).map(|i| format!("r{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        let _: Value = d
            .client
            .call(
                "volume_create",
                json!({"name": n, "size": "16MiB", "replicas": 1 + i % 2}),
            )
            .await
            .expect("volume_create");
    }
    talon::runtime::testing::eventually("20 volumes exported", WAIT, || exported(&spdk_client, &names)).await;
    let first = spdk_client
        .nvmf_get_transports(&Default::default())
        .await
        .expect("transports");
    assert_eq!(first.len(), 1, "first start: {first:?}");

    // 2. talon stops cleanly (and stops the target it adopted)
    d.stop().await;
    tokio::time::timeout(Duration::from_secs(30), t1.exited.take().expect("reaper"))
        .await
        .expect("spdk_tgt stopped with talon")
        .expect("join");
    let first_errors = t1.error_lines();

    // 3. a new target, a new talon on the same data: 20 volumes set up again, 16 at a time
    let t2 = Tgt::spawn(&spdk, &run, dir.path().join("tgt2.log")).await;
    let started = Instant::now();
    let d = start(opts(dir.path(), &spdk, &config)).await;
    talon::runtime::testing::eventually("20 volumes exported again", WAIT, || {
        exported(&spdk_client, &names)
    })
    .await;
    let took = started.elapsed();
    let transports = spdk_client
        .nvmf_get_transports(&Default::default())
        .await
        .expect("transports");
    let errors = t2.error_lines();
    eprintln!(
        "restart with 20 volumes: exported again {took:?} after talon started; {} TCP transport(s); \
         target log error lines: first run {}, after the restart {}",
        transports.len(),
        first_errors.len(),
        errors.len()
    );
    assert_eq!(
        transports.len(),
        1,
        "one transport per target: {:?}",
        transports.iter().map(|t| &t.trtype).collect::<Vec<_>>()
    );
    assert!(
        errors.is_empty(),
        "spdk_tgt logged errors after the restart:\n{}",
        errors.join("\n")
    );
    assert!(
        first_errors.is_empty(),
        "spdk_tgt logged errors:\n{}",
        first_errors.join("\n")
    );
    d.stop().await;
    drop(t2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_disk_paths_under_dev_and_a_failed_disk_ends_the_wait() {
    let test = "real_spdk_disk_paths_under_dev_and_a_failed_disk_ends_the_wait";
    let Some(spdk) = spdk_dir(test) else { return };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if !mountinfo.contains(" /dev/shm ") || !mountinfo.contains(" - devtmpfs ") {
        eprintln!("SKIP {test}: no tmpfs on /dev/shm or no devtmpfs on this host");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("run");
    let config = write_config(dir.path(), free_port(), &[]);
    let _t = Tgt::spawn(&spdk, &run, dir.path().join("tgt.log")).await;
    let d = start(opts(dir.path(), &spdk, &config)).await;

    // a file that does not exist yet on the tmpfs in /dev: made, then served
    let shm = PathBuf::from(format!("/dev/shm/talon-test-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&shm);
    struct Rm(PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _rm = Rm(shm.clone());
    let _: Value = d
        .client
        .call(
            "disk_add",
            json!({"name": "shm", "path": shm.display().to_string(), "size": "256MiB"}),
        )
        .await
        .expect("disk_add");
    let v: Value = d
        .client
        .call(
            "volume_create",
            json!({"name": "onshm", "size": "16MiB", "disks": ["shm"], "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect("a volume on the /dev/shm disk");
    assert_eq!(v["engine"]["state"], "ready", "{v}");
    assert!(
        std::fs::metadata(&shm).is_ok_and(|m| m.is_file() && m.len() == 256 << 20),
        "created as a sparse file"
    );

    // a device node that is not there: the disk fails, and a wait on it ends with its error
    let missing = format!("/dev/talon-test-no-such-device-{}", std::process::id());
    let asked = Instant::now();
    let _: Value = d
        .client
        .call("disk_add", json!({"name": "gone", "path": missing}))
        .await
        .expect("disk_add");
    let err = d
        .client
        .call::<_, Value>(
            "volume_create",
            json!({"name": "ongone", "size": "16MiB", "disks": ["gone"], "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect_err("the wait fails");
    let took = asked.elapsed();
    let msg = err.to_string();
    eprintln!("volume on a failed disk: the wait ended after {took:?}: {msg}");
    assert!(
        msg.contains(&format!("block device {missing} does not exist")),
        "the disk's error: {msg}"
    );
    assert!(!msg.contains("did not finish within"), "{msg}");
    let s = d.client.get("EngineStatus", "ongone").await.expect("status");
    assert_eq!(s.spec["state"], "failed", "{}", s.spec);
    d.stop().await;
}

/// The lvols (`lost-r…`) of the volumes in store, by alias.
async fn lvols_of(c: &SpdkClient, prefix: &str) -> std::collections::BTreeSet<String> {
    Inventory::load(c)
        .await
        .expect("inventory")
        .lvols
        .values()
        .filter(|l| l.name.starts_with(prefix))
        .map(|l| l.alias.clone())
        .collect()
}

/// How many reconciles `engine.SpdkVolumeController` has run.
async fn volume_reconciles(c: &talon::client::Client) -> u64 {
    c.controllers()
        .await
        .expect("controllers")
        .into_iter()
        .find(|s| s.name == "engine.SpdkVolumeController")
        .map_or(0, |s| s.reconciles)
}

/// Issue 54 (from issue 31): V2 replicas left on disk after a lost state
/// store. A 2-replica volume with a snapshot; talon stops; its state file is
/// deleted; a new target and talon on the same disks: the volume's lvols are
/// reported as `OrphanLvol`s and still there after the volume controller
/// has reconciled (it used to delete them as orphans), and they go only by
/// `orphan_remove`, which refuses an lvol a volume owns, one not reported,
/// and a snapshot with a clone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_lvols_of_a_lost_store_are_reported_and_kept_until_removed() {
    let test = "real_spdk_lvols_of_a_lost_store_are_reported_and_kept_until_removed";
    let Some(spdk) = spdk_dir(test) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("run");
    let config = write_config(dir.path(), free_port(), &[("d1", 1 << 30), ("d2", 1 << 30)]);
    let spdk_client = SpdkClient::new(run.join("spdk.sock"));

    // 1. a 2-replica volume with a snapshot
    let mut t1 = Tgt::spawn(&spdk, &run, dir.path().join("tgt1.log")).await;
    let d = start(opts(dir.path(), &spdk, &config)).await;
    let _: Value = d
        .client
        .call(
            "volume_create",
            json!({"name": "lost", "size": "16MiB", "replicas": 2, "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect("volume_create");
    let _: Value = d
        .client
        .call(
            "snapshot_create",
            json!({"volume": "lost", "name": "daily", "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect("snapshot_create");
    let lost = lvols_of(&spdk_client, "lost-r").await;
    assert_eq!(lost.len(), 4, "two heads and two snapshots: {lost:?}");

    // 2. talon stops (its target with it); the state store is lost
    d.stop().await;
    tokio::time::timeout(Duration::from_secs(30), t1.exited.take().expect("reaper"))
        .await
        .expect("spdk_tgt stopped with talon")
        .expect("join");
    std::fs::remove_file(dir.path().join("data/state.redb")).expect("state.redb deleted");

    // 3. a new target and talon on the same disks: reported, kept
    let _t2 = Tgt::spawn(&spdk, &run, dir.path().join("tgt2.log")).await;
    let d = start(opts(dir.path(), &spdk, &config)).await;
    talon::runtime::testing::eventually("the lost lvols reported", WAIT, || async {
        let ids: std::collections::BTreeSet<String> = d
            .client
            .list("OrphanLvol")
            .await
            .ok()?
            .into_iter()
            .map(|r| r.metadata.id)
            .collect();
        (ids == lost).then_some(())
    })
    .await;
    let seen = volume_reconciles(&d.client).await;
    talon::runtime::testing::eventually("two more volume reconciles", WAIT, || async {
        (volume_reconciles(&d.client).await >= seen + 2).then_some(())
    })
    .await;
    assert_eq!(
        lvols_of(&spdk_client, "lost-r").await,
        lost,
        "the volume controller kept the lost lvols"
    );
    let head = lost.iter().find(|a| a.ends_with("/lost-r0")).expect("r0").clone();
    let snap = lost
        .iter()
        .find(|a| a.ends_with("/lost-r0.s.daily"))
        .expect("r0's snapshot")
        .clone();
    let o = d.client.get("OrphanLvol", &head).await.expect("OrphanLvol");
    assert_eq!(o.spec["was"], "volume lost replica 0", "{}", o.spec);

    // 4. orphan_remove refuses what it must
    let _: Value = d
        .client
        .call(
            "volume_create",
            json!({"name": "fresh", "size": "16MiB", "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect("volume_create");
    let fresh = lvols_of(&spdk_client, "fresh-r").await;
    let owned = fresh.iter().next().expect("fresh's lvol").clone();
    let err = d
        .client
        .call::<_, Value>("orphan_remove", json!({"name": owned}))
        .await
        .expect_err("an owned lvol is refused")
        .to_string();
    assert!(err.contains("belongs to volume fresh"), "{err}");
    let err = d
        .client
        .call::<_, Value>("orphan_remove", json!({"name": "talon-d1/nothing-here"}))
        .await
        .expect_err("an lvol not reported is refused")
        .to_string();
    assert!(err.contains("no orphan lvol talon-d1/nothing-here"), "{err}");
    let err = d
        .client
        .call::<_, Value>("orphan_remove", json!({"name": snap}))
        .await
        .expect_err("a snapshot with a clone is refused")
        .to_string();
    assert!(err.contains("has clones"), "{err}");
    assert_eq!(
        lvols_of(&spdk_client, "lost-r").await,
        lost,
        "nothing removed yet"
    );

    // 5. removed when asked: the head, then its snapshot; the others stay
    for a in [&head, &snap] {
        let _: Value = d
            .client
            .call("orphan_remove", json!({"name": a}))
            .await
            .unwrap_or_else(|e| panic!("orphan_remove {a}: {e}"));
    }
    let left = lvols_of(&spdk_client, "lost-r").await;
    let want: std::collections::BTreeSet<String> = lost
        .iter()
        .filter(|a| **a != head && **a != snap)
        .cloned()
        .collect();
    assert_eq!(left, want, "only the two asked for went");
    assert!(
        d.client.get("OrphanLvol", &head).await.is_err(),
        "no longer reported"
    );

    // 6. a volume talon deletes goes with its lvols, reported as no orphan
    let _: Value = d
        .client
        .call(
            "volume_delete",
            json!({"name": "fresh", "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect("volume_delete");
    assert!(
        lvols_of(&spdk_client, "fresh-r").await.is_empty(),
        "fresh's lvols deleted"
    );
    let ids: Vec<String> = d
        .client
        .list("OrphanLvol")
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.metadata.id)
        .collect();
    assert!(ids.iter().all(|i| !i.contains("fresh")), "{ids:?}");
    d.stop().await;
}

/// Two disks of different block sizes (a file disk at 4 KiB beside one at
/// 512 B, as an NVMe disk formatted 4 KiB beside an aio disk): SPDK's raid1
/// refuses members of two block sizes ("Invalid argument"), so a two-replica
/// volume over them is not placed: its wait fails at once saying so, naming
/// the disk of the other block size and what to do, and nothing is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_replicas_on_disks_of_two_block_sizes_fail_naming_them() {
    let test = "real_spdk_replicas_on_disks_of_two_block_sizes_fail_naming_them";
    let Some(spdk) = spdk_dir(test) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("run");
    let config = dir.path().join("talon.yaml");
    std::fs::write(
        &config,
        format!(
            "node:\n  engine: v2\n  listenAddress: 127.0.0.1\n  nvmfPort: {}\ndisks:\n  \
             d1:\n    path: {}\n    sizeBytes: {}\n  d2:\n    path: {}\n    sizeBytes: {}\n    blockSize: 512\n",
            free_port(),
            dir.path().join("disks/d1.img").display(),
            256u64 << 20,
            dir.path().join("disks/d2.img").display(),
            256u64 << 20
        ),
    )
    .expect("config");
    let _t = Tgt::spawn(&spdk, &run, dir.path().join("tgt.log")).await;
    let d = start(opts(dir.path(), &spdk, &config)).await;
    let e = d
        .client
        .call::<_, Value>(
            "volume_create",
            json!({"name": "mixed", "size": "16MiB", "replicas": 2, "wait": true, "timeoutSeconds": 60}),
        )
        .await
        .expect_err("no raid1 over two block sizes")
        .to_string();
    for w in [
        "all of one block size",
        "d1 is ready",
        "d2 has 512-byte blocks, not the 4096-byte blocks of the volume's replicas",
        "`disks`",
    ] {
        assert!(e.contains(w), "{e:?} should say {w:?}");
    }
    assert!(!e.contains("did not finish within"), "failed at once: {e:?}");
    let lvols = talon::spdk::SpdkClient::new(run.join("spdk.sock"))
        .bdev_lvol_get_lvols(&talon::spdk::rpc::GetLvols::default())
        .await
        .expect("lvols");
    assert!(
        !lvols.iter().any(|l| l.name.starts_with("mixed-r")),
        "no replica made: {lvols:?}"
    );
    d.stop().await;
}
