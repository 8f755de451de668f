//! A target that cannot start says why, in its `TargetStatus` and in every
//! wait that depends on it, at once instead of at the wait's timeout.
//!
//! ```text
//!   talon serve (in-process) ──spawn──> spdk_tgt that exits (core locked, binary missing)
//!        TargetStatus spdk: failed, "core 0 is locked by another SPDK process (pid N)"
//!        volume_create {wait: true, timeoutSeconds: 120} ──> error naming that cause, long before 120 s
//! ```
//!
//! Without `TALON_SPDK_DIR` the spawned program is a stand-in that prints the
//! lines spdk_tgt v26.05 prints when its core is locked (app.c `claim_cpu_cores`, as
//! recorded on this machine)
//! and exits 1; with it, a real spdk_tgt holds core 0 and talon's real spdk_tgt
//! is refused by it.

#[path = "support/serve_daemon.rs"]
mod serve_daemon;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use serve_daemon::{Daemon, opts, opts_with_config, real_spdk, start};
use talon::controllers::engine::selection::SpdkOptions;
use talon::runtime::testing::eventually;

impl Daemon {
    /// The spdk TargetStatus once it is `failed`.
    async fn target_failed(&self) -> Value {
        eventually("TargetStatus spdk failed", Duration::from_secs(60), || async {
            let t = self.client.get("TargetStatus", "spdk").await.ok()?;
            (t.spec["state"] == "failed").then_some(t.spec)
        })
        .await
    }

    /// `volume_create` with wait and a long timeout; returns its error text.
    async fn create_and_wait(&self, name: &str) -> String {
        let e = self
            .client
            .call::<_, Value>(
                "volume_create",
                json!({"name": name, "sizeBytes": 1u64 << 20, "engine": "v2", "wait": true,
                       "timeoutSeconds": 120}),
            )
            .await
            .expect_err("the wait fails: the target cannot start");
        e.to_string()
    }
}

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}")).expect("write script");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_core_is_named_in_the_status_and_fails_the_wait_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    // the two lines spdk_tgt v26.05 writes when another SPDK process holds its core
    let bin = script(
        dir.path(),
        "spdk_tgt",
        "echo '[2026-11-23 21:40:01.123456] app.c: 855:claim_cpu_cores: *ERROR*: Cannot create lock on \
         core 0, probably process 4242 has claimed it.' >&2\n\
         echo '[2026-11-23 21:40:01.123480] app.c: 986:spdk_app_start: *ERROR*: Unable to acquire lock \
         on assigned core mask - exiting.' >&2\nexit 1\n",
    );
    let d = start(opts(
        dir.path(),
        SpdkOptions {
            spdk_tgt: Some(bin),
            spdk_dir: None,
            path_var: None,
            no_huge: true,
            ..SpdkOptions::default()
        },
    ))
    .await;
    let err = d.create_and_wait("locked").await;
    assert!(
        err.contains("core 0 is locked by another SPDK process (pid 4242)"),
        "the wait names the cause: {err}"
    );
    assert!(
        !err.contains("did not finish within"),
        "it did not wait for its timeout: {err}"
    );
    let t = d.target_failed().await;
    let msg = t["message"].as_str().expect("message");
    assert!(
        msg.contains("core 0 is locked by another SPDK process (pid 4242)"),
        "{msg}"
    );
    assert!(msg.contains("spdk_tgt.log"), "the status names the log: {msg}");
    let e = d
        .client
        .get("EngineStatus", "locked")
        .await
        .expect("EngineStatus");
    assert_eq!(
        e.spec["state"], "creating",
        "the volume waits for its target: {}",
        e.spec
    );
    // a disk's lvstore waits for the same target: `disk add` (which waits) fails at once too
    let started = std::time::Instant::now();
    let err = d
        .client
        .call::<_, Value>(
            "disk_add",
            json!({"name": "d1", "path": dir.path().join("d1.img"), "sizeBytes": 64u64 << 20,
                   "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect_err("the disk cannot be made: the target cannot start")
        .to_string();
    assert!(
        err.contains("adding disk d1 cannot finish: it waits for spdk_tgt, which is failed")
            && err.contains("core 0 is locked by another SPDK process (pid 4242)"),
        "the disk's wait names the cause: {err}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "at once: {err}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_binary_is_named_in_the_status_and_fails_the_wait_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(opts(
        dir.path(),
        SpdkOptions {
            spdk_tgt: Some(dir.path().join("nowhere/spdk_tgt")),
            spdk_dir: None,
            path_var: None,
            no_huge: true,
            ..SpdkOptions::default()
        },
    ))
    .await;
    // a V2 volume is refused at create: nothing could serve it (issue 54)
    let err = d.create_and_wait("nobin").await;
    assert!(
        err.contains("volume nobin: engine v2 needs SPDK") && err.contains("spdk_tgt was not found"),
        "{err}"
    );
    assert!(
        err.contains("nowhere/spdk_tgt"),
        "the refusal names where it looked: {err}"
    );
    assert!(
        d.client.get("Volume", "nobin").await.is_err(),
        "nothing is left of it"
    );
    // a disk (added without waiting) is unused, saying why, and the target's status names the cause
    d.client
        .call::<_, Value>(
            "disk_add",
            json!({"name": "d1", "path": dir.path().join("d1.img"), "sizeBytes": 64u64 << 20}),
        )
        .await
        .expect("disk_add without wait");
    let disk = eventually("DiskStatus d1 unused", Duration::from_secs(60), || async {
        let s = d.client.get("DiskStatus", "d1").await.ok()?;
        (s.spec["state"] == "unused").then_some(s.spec)
    })
    .await;
    assert!(
        disk["message"]
            .as_str()
            .is_some_and(|m| m.contains("only V2 volumes use disks") && m.contains("nowhere/spdk_tgt")),
        "{disk}"
    );
    let t = d.target_failed().await;
    assert!(
        t["message"]
            .as_str()
            .is_some_and(|m| m.contains("spdk_tgt was not found")),
        "{t}"
    );
    d.stop().await;
}

/// Kills the holder spdk_tgt even when the test fails.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_a_core_held_by_another_spdk_tgt_is_named_with_its_pid() {
    const TEST: &str = "real_spdk_a_core_held_by_another_spdk_tgt_is_named_with_its_pid";
    let Some(spdk_dir) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP {TEST}: TALON_SPDK_DIR not set");
        return;
    };
    let bin = spdk_dir.join("build/bin/spdk_tgt");
    if !bin.is_file() {
        eprintln!("SKIP {TEST}: {} not found", bin.display());
        return;
    }
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {TEST}: spdk_tgt needs root");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // Another SPDK process on core 1 (a core no other test's spdk_tgt claims by
    // default), holding its lock; talon is told to use the same core.
    let holder_sock = dir.path().join("holder.sock");
    let holder = Holder(
        Command::new(&bin)
            .args(["-m", "0x2", "--no-huge", "-s", "1024", "-u", "-r"])
            .arg(&holder_sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the holder spdk_tgt"),
    );
    eventually(
        "the holder spdk_tgt to answer",
        Duration::from_secs(60),
        || async {
            talon::spdk::SpdkClient::new(&holder_sock)
                .spdk_get_version()
                .await
                .ok()
        },
    )
    .await;
    let d = start(opts(
        dir.path(),
        SpdkOptions {
            spdk_tgt: Some(bin),
            spdk_dir: None,
            path_var: None,
            cpumask: "0x2".into(),
            no_huge: true,
            no_huge_mem_mib: 1024,
            ..SpdkOptions::default()
        },
    ))
    .await;
    let want = format!("core 1 is locked by another SPDK process (pid {})", holder.0.id());
    let err = d.create_and_wait("held").await;
    assert!(err.contains(&want), "the wait names the holder: {err}");
    let t = d.target_failed().await;
    assert!(
        t["message"].as_str().is_some_and(|m| m.contains(&want)),
        "the status names the holder: {t}"
    );
    d.stop().await;
    drop(holder);
}

fn on_path(program: &str) -> bool {
    which::which(program).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_an_iscsi_port_in_use_is_named_with_its_holder() {
    const TEST: &str = "v1_an_iscsi_port_in_use_is_named_with_its_holder";
    if !nix::unistd::Uid::effective().is_root() || !on_path("tgtd") || !on_path("tgtadm") {
        eprintln!("SKIP {TEST}: needs root and tgtd, tgtadm (apt-get install tgt)");
        return;
    }
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = squatter.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(opts_with_config(
        dir.path(),
        SpdkOptions::default(),
        &format!("node: {{ engine: v1, listenAddress: 127.0.0.1, iscsiPort: {port} }}\n"),
    ))
    .await;
    let want = format!("the port is in use by pid {} (", std::process::id());
    let e = d
        .client
        .call::<_, Value>(
            "volume_create",
            json!({"name": "squat", "sizeBytes": 1u64 << 20, "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect_err("the wait fails: tgtd cannot have its port")
        .to_string();
    assert!(e.contains(&want), "the wait names the holder: {e}");
    assert!(e.contains(&format!("127.0.0.1:{port}")), "and the portal: {e}");
    let t = eventually("TargetStatus tgtd failed", Duration::from_secs(60), || async {
        let t = d.client.get("TargetStatus", "tgtd").await.ok()?;
        (t.spec["state"] == "failed").then_some(t.spec)
    })
    .await;
    assert!(
        t["message"].as_str().is_some_and(|m| m.contains(&want)),
        "the status names the holder: {t}"
    );
    d.stop().await;
    drop(squatter);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_an_nvmf_port_in_use_is_named_with_its_holder() {
    const TEST: &str = "real_spdk_an_nvmf_port_in_use_is_named_with_its_holder";
    let Some(spdk_dir) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP {TEST}: TALON_SPDK_DIR not set");
        return;
    };
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {TEST}: spdk_tgt needs root");
        return;
    }
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = squatter.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(opts_with_config(
        dir.path(),
        real_spdk(&spdk_dir, 1024),
        &format!(
            "node: {{ engine: v2, listenAddress: 127.0.0.1, nvmfPort: {port} }}\n\
             disks:\n  d1: {{ path: disks/d1.img, sizeBytes: 134217728 }}\n"
        ),
    ))
    .await;
    let e = d
        .client
        .call::<_, Value>(
            "volume_create",
            json!({"name": "squat", "sizeBytes": 1u64 << 20, "wait": true, "timeoutSeconds": 120}),
        )
        .await
        .expect_err("the export fails: the port is taken")
        .to_string();
    let want = format!(
        "cannot listen on 127.0.0.1:{port}: the port is in use by pid {} (",
        std::process::id()
    );
    assert!(e.contains(&want), "the error names the port and its holder: {e}");
    d.stop().await;
    drop(squatter);
}
