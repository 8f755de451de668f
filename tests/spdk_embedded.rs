//! `talon serve --engine spdk-embedded`, as a process:
//! - in a build without the `spdk-embedded` feature it fails at start with a
//!   clear error;
//! - with `TALON_SPDK_DIR`, talon is built with the feature (its own target
//!   dir, `<target>/embedded`, so the normal build is kept; or
//!   `TALON_EMBEDDED_BIN` names a built one) and run with `--no-huge` on two
//!   file disks: a 1-replica and a 2-replica volume come up, exported over
//!   NVMe/TCP on 127.0.0.1 by the SPDK running inside talon, take I/O from
//!   spdk_nvme_perf, and SIGTERM stops talon with status 0 and nothing left.

#[path = "support/spdk_perf.rs"]
mod spdk_perf;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use talon::client::Client;
use talon::runtime::testing::eventually;
use talon::spdk::SpdkClient;
use talon::spdk::rpc::GetSubsystems;

const WAIT: Duration = Duration::from_secs(120);

#[test]
fn embedded_engine_without_the_feature_fails_at_start() {
    if cfg!(feature = "spdk-embedded") {
        eprintln!(
            "SKIP embedded_engine_without_the_feature_fails_at_start: this build has the spdk-embedded feature"
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_talon"))
        .arg("--socket")
        .arg(dir.path().join("run/talon.sock"))
        .args(["serve", "--engine", "spdk-embedded", "--no-huge", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .stdin(Stdio::null())
        .output()
        .expect("run talon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "talon started: {stderr}");
    assert!(
        stderr.contains(
            "this talon was built without the spdk-embedded feature; rebuild with --features \
             spdk-embedded or use --engine v2"
        ),
        "{stderr}"
    );
    // it failed before taking the data dir or the API socket
    assert!(!dir.path().join("data/state.redb").exists());
    assert!(!dir.path().join("run/talon.sock").exists());
}

/// The workspace target dir (this test runs from `<target>/<profile>/deps`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .expect("<target>/<profile>/deps/<test>")
}

/// A talon built with the feature: this one if it has it, `TALON_EMBEDDED_BIN`,
/// or `cargo build --features spdk-embedded` into `<target>/embedded`.
fn embedded_talon(spdk: &Path) -> PathBuf {
    if cfg!(feature = "spdk-embedded") {
        return PathBuf::from(env!("CARGO_BIN_EXE_talon"));
    }
    if let Some(b) = std::env::var_os("TALON_EMBEDDED_BIN") {
        return PathBuf::from(b);
    }
    let target = target_dir().join("embedded");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    let status = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--features", "spdk-embedded", "--bin", "talon"])
        .env("CARGO_TARGET_DIR", &target)
        .env("SPDK_DIR", spdk)
        .stdin(Stdio::null())
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build --features spdk-embedded failed");
    eprintln!(
        "built talon with spdk-embedded in {:?} ({})",
        started.elapsed(),
        target.display()
    );
    target.join("debug/talon")
}

/// A port for a listener, from this process's reserved block below the
/// ephemeral range (`runtime::testing::free_port`).
fn free_port() -> u16 {
    talon::runtime::testing::free_port()
}

/// Processes whose parent is `pid` (from /proc).
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    // pid (comm) state ppid ...
                    let ppid = s
                        .rsplit_once(')')?
                        .1
                        .split_whitespace()
                        .nth(1)?
                        .parse::<u32>()
                        .ok()?;
                    Some(ppid == pid)
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Kills talon if the test fails before its clean stop.
struct Guard(Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_embedded_serves_volumes() {
    let test = "real_spdk_embedded_serves_volumes";
    let Some(spdk) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP {test}: TALON_SPDK_DIR not set");
        return;
    };
    if !spdk.join("build/bin/spdk_nvme_perf").exists() {
        eprintln!(
            "SKIP {test}: no build/bin/spdk_nvme_perf under {}",
            spdk.display()
        );
        return;
    }
    // building the feature needs SPDK's development files; a runtime-only SPDK
    // (binaries and shared libraries, as ../shared/spdk/v26.05) has none
    let has_dev_files = ["build/lib/pkgconfig", "lib/pkgconfig", "lib64/pkgconfig"]
        .iter()
        .any(|d| spdk.join(d).join("spdk_event.pc").is_file());
    if !cfg!(feature = "spdk-embedded") && std::env::var_os("TALON_EMBEDDED_BIN").is_none() && !has_dev_files
    {
        eprintln!(
            "SKIP {test}: {} is a runtime-only SPDK (no spdk_event.pc, no headers) and \
             TALON_EMBEDDED_BIN is not set: the spdk-embedded feature needs an SPDK build tree",
            spdk.display()
        );
        return;
    }
    let bin = tokio::task::block_in_place(|| embedded_talon(&spdk));
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = dir.path().join("talon.yaml");
    std::fs::write(
        &cfg,
        format!(
            "node:\n  nvmfPort: {port}\n  allowedHosts: [\"{}\"]\n\
             disks:\n  d1:\n    path: disks/d1.img\n    sizeBytes: 536870912\n\
             \x20 d2:\n    path: disks/d2.img\n    sizeBytes: 536870912\n\
             volumes:\n  one:\n    sizeBytes: 67108864\n    replicas: 1\n    engine: v2\n\
             \x20 two:\n    sizeBytes: 67108864\n    replicas: 2\n    engine: v2\n",
            spdk_perf::HOST_NQN
        ),
    )
    .expect("config");
    let socket = dir.path().join("run/talon.sock");
    let child = Command::new(&bin)
        .arg("--socket")
        .arg(&socket)
        .args([
            "serve",
            "--engine",
            "spdk-embedded",
            "--no-huge",
            "--no-huge-mem-mib",
            "1024",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .arg("--config")
        .arg(&cfg)
        .stdin(Stdio::null())
        .spawn()
        .expect("start talon");
    let pid = child.id();
    let mut guard = Guard(Some(child));

    let client = eventually("the API socket", WAIT, || async {
        Client::connect_unix(&socket).await.ok()
    })
    .await;
    let mut exports = Vec::new();
    for v in ["one", "two"] {
        let st = eventually(&format!("{v} ready and exported"), WAIT, || async {
            let r = client.get("EngineStatus", v).await.ok()?;
            (r.spec["state"] == "ready" && r.spec["exports"].as_array().is_some_and(|e| !e.is_empty()))
                .then_some(r.spec)
        })
        .await;
        exports.push(
            st["exports"][0]["name"]
                .as_str()
                .expect("export name")
                .to_string(),
        );
    }
    assert_eq!(exports[0], format!("{}:vol:one", talon::names::NQN_PREFIX));

    // the target is talon itself
    let t = client.get("TargetStatus", "spdk").await.expect("TargetStatus");
    assert_eq!(t.spec["state"], "ready", "{}", t.spec);
    assert_eq!(t.spec["pid"].as_u64(), Some(u64::from(pid)), "{}", t.spec);
    assert!(
        t.spec["message"]
            .as_str()
            .is_some_and(|m| m.contains("in-process")),
        "{}",
        t.spec
    );
    let spdk_sock = dir.path().join("run/spdk.sock");
    let peer = tokio::net::UnixStream::connect(&spdk_sock)
        .await
        .expect("connect spdk.sock")
        .peer_cred()
        .expect("peer cred")
        .pid();
    assert_eq!(peer, i32::try_from(pid).ok(), "spdk.sock is served by talon");

    // SPDK's own view over the same JSON-RPC socket
    let sc = SpdkClient::new(&spdk_sock);
    let subs = sc
        .nvmf_get_subsystems(&GetSubsystems::default())
        .await
        .expect("nvmf_get_subsystems");
    for nqn in &exports {
        let s = subs
            .iter()
            .find(|s| &s.nqn == nqn)
            .unwrap_or_else(|| panic!("{nqn} not in {subs:?}"));
        assert!(
            s.listen_addresses
                .iter()
                .any(|a| a.trsvcid.as_deref() == Some(port.to_string().as_str())),
            "{s:?}"
        );
    }
    sc.disconnect().await;

    for nqn in &exports {
        let out = tokio::task::block_in_place(|| spdk_perf::report(&spdk, port, nqn, "randrw -M 50", 2));
        let iops = spdk_perf::total_iops(&out);
        eprintln!("{nqn}: randrw QD32 {iops:.0} IOPS (in-process SPDK)");
        assert!(iops > 0.0, "{out}");
    }

    // SIGTERM: exit status 0, nothing left behind
    let kids = children(pid);
    drop(client);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let mut child = guard.0.take().expect("child");
    let status = tokio::task::block_in_place(|| child.wait()).expect("wait talon");
    assert!(status.success(), "talon exited with {status}");
    for k in kids {
        assert!(
            !Path::new(&format!("/proc/{k}")).exists(),
            "talon left its child {k} running"
        );
    }
    assert!(
        std::os::unix::net::UnixStream::connect(&spdk_sock).is_err(),
        "something still answers on {}",
        spdk_sock.display()
    );
    assert!(!socket.exists(), "the API socket was left behind");
}
