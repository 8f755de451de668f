//! Restarts of talon do not interrupt volume I/O (V1 engine, real tgtd, real
//! libiscsi initiator): a reader/writer loop runs against a volume while
//! `talon serve` is stopped with SIGTERM and started again 10 times. tgtd keeps
//! its pid (adopted, not restarted), the iSCSI session is never dropped (the
//! initiator's automatic reconnect is off, so a drop would be an error), every
//! read returns what was written, and I/O goes on while no talon runs. Then
//! `--stop-targets-on-exit` stops tgtd with talon. The same with real SPDK
//! (spdk_nvme_perf), with the targets in `talon keep-targets`, and across an
//! upgrade from an earlier talon (built from git history, tests/support/previous_talon.rs).
//! The set-up and the I/O loops are shared with benches/restart_io.rs
//! (tests/support/restart.rs).
//!
//! ```text
//!   talon serve (config: node v1 on 127.0.0.1:<free port>, volume io) ──> tgtd ──iSCSI──> loop thread
//!      SIGTERM ─> exit 0, tgtd same pid, loop still counting ─> talon serve again ─> adopted ×10
//! ```

#[path = "support/previous_talon.rs"]
mod previous_talon;
#[path = "support/restart.rs"]
mod restart;
mod tgt_common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use restart::{
    Cleanup, IscsiLoop, Keeper, Perf, Stop, V2_ARGS, alive, cntlids, connect, is_tgtd, perf_connected, ppid,
    served, served_v2, sigterm_and_wait, spawn_program, spawn_talon, spec, stop_talon, until,
    write_v1_config, write_v2_config,
};
use serde_json::Value;
use talon::client::Client;
use tgt_common::{free_port, ready};

const V1: &[&str] = &["--engine", "v1"];
const ROUNDS: usize = 10;

/// TALON_SPDK_DIR, root and spdk_nvme_perf, or `SKIP <test>` and None.
fn spdk_ready(test: &str) -> Option<PathBuf> {
    let Some(spdk) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP {test}: TALON_SPDK_DIR not set");
        return None;
    };
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {test}: spdk_tgt needs root");
        return None;
    }
    let perf_bin = spdk.join("build/bin/spdk_nvme_perf");
    if !perf_bin.is_file() {
        eprintln!("SKIP {test}: {} not found", perf_bin.display());
        return None;
    }
    Some(spdk)
}

/// The earlier talon, or `SKIP <test>` and None.
fn previous(test: &str) -> Option<PathBuf> {
    match previous_talon::binary() {
        Ok(p) => Some(p),
        Err(why) => {
            eprintln!("SKIP {test}: {why}");
            None
        }
    }
}

/// spdk_nvme_perf's report, asserted free of I/O trouble before it was stopped.
fn assert_no_trouble(report: &restart::PerfReport, what: &str) {
    assert!(
        report.trouble.is_empty(),
        "spdk_nvme_perf reported I/O trouble {what}: {:?}\n{}",
        report.trouble,
        report.text
    );
    assert!(
        !report.total_line().is_empty(),
        "no Total line in spdk_nvme_perf's report:\n{}",
        report.text
    );
}

/// The new talon on `socket` serves the volume on the `target` ("tgtd" or
/// "spdk") it found running as `pid`: adopted, not restarted. Returns its
/// client and the TargetStatus; `what` leads the assert messages.
async fn adopted(socket: &Path, target: &str, pid: u32, what: &str) -> (Client, Value) {
    let c = connect(socket).await;
    let serving = match target {
        "tgtd" => served(&c).await.0,
        "spdk" => served_v2(&c).await.0,
        other => panic!("no target {other}"),
    };
    assert_eq!(serving, pid, "{what}: the new talon adopts {target} {pid}");
    let t = spec(&c, "TargetStatus", target)
        .await
        .unwrap_or_else(|| panic!("TargetStatus {target}"));
    assert_eq!(t["restarts"], 0, "{what}: {target} was not restarted: {t}");
    (c, t)
}

/// Stops `cleanup`'s talon; then one more talon with `args` and
/// `--stop-targets-on-exit` adopts spdk_tgt `tgt` and is stopped with SIGTERM.
async fn stop_with_targets(cleanup: &mut Cleanup, dir: &Path, args: &[&str], tgt: u32) {
    let mut talon = cleanup.take();
    sigterm_and_wait(&mut talon);
    let mut args = args.to_vec();
    args.push("--stop-targets-on-exit");
    let mut talon = spawn_talon(dir, &args);
    let c = connect(&dir.join("run/talon.sock")).await;
    assert_eq!(served_v2(&c).await.0, tgt, "still the same spdk_tgt");
    drop(c);
    sigterm_and_wait(&mut talon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_io_runs_through_ten_talon_restarts() {
    const TEST: &str = "v1_io_runs_through_ten_talon_restarts";
    if !ready(TEST) {
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    write_v1_config(&dir, free_port());
    let socket = dir.join("run/talon.sock");
    let mut cleanup = Cleanup::new(&dir, spawn_talon(&dir, V1));
    let c = connect(&socket).await;
    let (tgtd, portal, iqn) = served(&c).await;
    drop(c);

    let io = IscsiLoop::start(portal, iqn);
    io.progressed("before the first restart").await;

    for round in 1..=ROUNDS {
        let mut talon = cleanup.take();
        sigterm_and_wait(&mut talon);
        assert!(
            !socket.exists(),
            "round {round}: the API socket is removed on SIGTERM"
        );
        assert!(
            is_tgtd(tgtd),
            "round {round}: tgtd (pid {tgtd}) keeps running after talon stopped"
        );
        // no talon runs: I/O goes on
        io.progressed(&format!("while talon is stopped (round {round})"))
            .await;

        cleanup.talon = Some(spawn_talon(&dir, V1));
        adopted(&socket, "tgtd", tgtd, &format!("round {round}")).await;
        io.progressed(&format!("after restart {round}")).await;
    }

    let n = io
        .finish()
        .unwrap_or_else(|e| panic!("I/O failed across talon restarts: {e}"));
    eprintln!(
        "{TEST}: {} verified 4 KiB write+read pairs through {ROUNDS} restarts of talon, no error; \
         longest pair {:.1} ms",
        n.pairs,
        n.max_stall.as_secs_f64() * 1000.0
    );

    // the explicit mode: --stop-targets-on-exit stops tgtd with talon
    let mut talon = cleanup.take();
    sigterm_and_wait(&mut talon);
    let mut talon = spawn_talon(&dir, &["--engine", "v1", "--stop-targets-on-exit"]);
    let c = connect(&socket).await;
    let (pid, _, _) = served(&c).await;
    assert_eq!(pid, tgtd, "still the same tgtd");
    drop(c);
    sigterm_and_wait(&mut talon);
    until("tgtd to stop with --stop-targets-on-exit", || async {
        (!is_tgtd(tgtd)).then_some(())
    })
    .await;
    assert!(
        !dir.join("run/tgtd/tgtd.pid").exists(),
        "tgtd's pid file is removed when it is stopped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_v2_io_runs_through_ten_talon_restarts() {
    const TEST: &str = "real_spdk_v2_io_runs_through_ten_talon_restarts";
    let Some(spdk) = spdk_ready(TEST) else {
        return;
    };
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    write_v2_config(&dir, free_port());
    let socket = dir.join("run/talon.sock");
    let spdk_sock = dir.join("run/spdk.sock");
    let mut cleanup = Cleanup::new(&dir, spawn_talon(&dir, V2_ARGS));
    let c = connect(&socket).await;
    let (tgt, port, nqn) = served_v2(&c).await;
    cleanup.spdk_tgt = Some(tgt);
    drop(c);

    // the reader/writer: 50/50 random 4 KiB I/O at QD8 from core 1 until SIGINT
    let mut perf = Perf::start(&spdk, "0x2", port, &nqn, 3600);
    let connected = perf_connected(&spdk_sock, &nqn).await;

    for round in 1..=ROUNDS {
        let mut talon = cleanup.take();
        sigterm_and_wait(&mut talon);
        assert!(
            alive(tgt),
            "round {round}: spdk_tgt (pid {tgt}) keeps running after talon stopped"
        );
        assert_eq!(
            cntlids(&spdk_sock, &nqn).await,
            connected,
            "round {round}: the initiator stays connected while talon is stopped"
        );
        cleanup.talon = Some(spawn_talon(&dir, V2_ARGS));
        let (_, t) = adopted(&socket, "spdk", tgt, &format!("round {round}")).await;
        assert!(
            t["message"].as_str().is_some_and(|m| m.starts_with("adopted")),
            "round {round}: {t}"
        );
        assert_eq!(
            cntlids(&spdk_sock, &nqn).await,
            connected,
            "round {round}: no reconnect after the new talon adopted the target"
        );
        assert!(perf.running(), "round {round}: spdk_nvme_perf ended early");
    }

    let report = perf.finish();
    assert_no_trouble(&report, "through the restarts");
    eprintln!(
        "{TEST}: {ROUNDS} restarts of talon under spdk_nvme_perf, no error, no reconnect; {}",
        report.total_line()
    );

    // --stop-targets-on-exit stops spdk_tgt with talon
    stop_with_targets(&mut cleanup, &dir, V2_ARGS, tgt).await;
    assert!(
        !alive(tgt),
        "spdk_tgt {tgt} is stopped with --stop-targets-on-exit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stop_leaves_tgtd_serving_and_node_drain_stops_it() {
    const TEST: &str = "node_stop_leaves_tgtd_serving_and_node_drain_stops_it";
    if !ready(TEST) {
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    write_v1_config(&dir, free_port());
    let socket = dir.join("run/talon.sock");
    let mut cleanup = Cleanup::new(&dir, spawn_talon(&dir, V1));
    let verb = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_talon"))
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .output()
            .expect("run talon");
        assert!(
            out.status.success(),
            "talon {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let c = connect(&socket).await;
    let (tgtd, _, _) = served(&c).await;
    drop(c);

    let said = verb(&["node", "stop"]);
    assert!(said.contains("keep serving"), "{said}");
    let status = cleanup.take().wait().expect("wait");
    assert!(status.success(), "talon exits cleanly on node stop: {status}");
    assert!(is_tgtd(tgtd), "tgtd (pid {tgtd}) keeps serving after node stop");

    cleanup.talon = Some(spawn_talon(&dir, V1));
    let c = connect(&socket).await;
    assert_eq!(served(&c).await.0, tgtd, "the next talon adopts it");
    drop(c);
    let said = verb(&["node", "drain"]);
    assert!(said.contains("spdk_tgt and tgtd with it"), "{said}");
    let status = cleanup.take().wait().expect("wait");
    assert!(status.success(), "talon exits cleanly on node drain: {status}");
    until("tgtd to stop with node drain", || async {
        (!is_tgtd(tgtd)).then_some(())
    })
    .await;
}

/// An upgrade from a talon built before targets outlived a clean stop
/// (tests/support/previous_talon.rs: `TALON_PREVIOUS_BIN`, or the pinned
/// commit built from git history): the old one is stopped with SIGKILL (it
/// would stop tgtd on SIGTERM, see docs/upgrade.md), and this talon adopts
/// the tgtd it started and the state store it wrote, with I/O running and no
/// reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_talons_tgtd_is_adopted_with_io_running() {
    const TEST: &str = "an_earlier_talons_tgtd_is_adopted_with_io_running";
    if !ready(TEST) {
        return;
    }
    let Some(previous) = previous(TEST) else {
        return;
    };
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    write_v1_config(&dir, free_port());
    let socket = dir.join("run/talon.sock");
    let mut cleanup = Cleanup::new(&dir, spawn_program(&previous, &dir, V1));
    let c = connect(&socket).await;
    let (tgtd, portal, iqn) = served(&c).await;
    drop(c);
    let io = IscsiLoop::start(portal, iqn);
    io.progressed("under the earlier talon").await;

    let mut old = cleanup.take();
    stop_talon(&mut old, Stop::Kill, &socket);
    assert!(is_tgtd(tgtd), "tgtd (pid {tgtd}) outlives the earlier talon");
    io.progressed("with no talon").await;

    cleanup.talon = Some(spawn_talon(&dir, V1));
    let (c, _) = adopted(&socket, "tgtd", tgtd, "this talon after the earlier one").await;
    // the earlier talon's state store is read, not recreated: the volume it
    // made keeps its identity (the export's name is derived from it)
    let v = spec(&c, "Volume", restart::VOLUME).await.expect("Volume io");
    assert_eq!(v["sizeBytes"], 16777216, "{v}");
    io.progressed("under this talon").await;
    let n = io
        .finish()
        .unwrap_or_else(|e| panic!("I/O failed across the upgrade: {e}"));
    eprintln!(
        "{TEST}: {} verified write+read pairs across the upgrade from {}",
        n.pairs,
        previous.display()
    );
    let mut talon = cleanup.take();
    sigterm_and_wait(&mut talon);
}

/// The same upgrade with real SPDK: an earlier talon's spdk_tgt is adopted
/// while spdk_nvme_perf runs, with the same controller ids (no reconnect).
/// Core 1 for the target: an earlier talon cannot pass `--disable-cpumask-locks`,
/// and other jobs here may hold core 0's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_an_earlier_talons_spdk_tgt_is_adopted_with_io_running() {
    const TEST: &str = "real_spdk_an_earlier_talons_spdk_tgt_is_adopted_with_io_running";
    let Some(spdk) = spdk_ready(TEST) else {
        return;
    };
    let Some(previous) = previous(TEST) else {
        return;
    };
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    write_v2_config(&dir, free_port());
    let v2: &[&str] = &[
        "--engine",
        "v2",
        "--no-huge",
        "--no-huge-mem-mib",
        "1024",
        "--spdk-cpumask",
        "0x2",
    ];
    let socket = dir.join("run/talon.sock");
    let spdk_sock = dir.join("run/spdk.sock");
    let mut cleanup = Cleanup::new(&dir, spawn_program(&previous, &dir, v2));
    let c = connect(&socket).await;
    let (tgt, port, nqn) = served_v2(&c).await;
    cleanup.spdk_tgt = Some(tgt);
    drop(c);
    let mut perf = Perf::start(&spdk, "0x1", port, &nqn, 3600);
    let connected = perf_connected(&spdk_sock, &nqn).await;

    let mut old = cleanup.take();
    stop_talon(&mut old, Stop::Kill, &socket);
    cleanup.talon = Some(spawn_talon(&dir, v2));
    adopted(&socket, "spdk", tgt, "this talon after the earlier one").await;
    assert_eq!(cntlids(&spdk_sock, &nqn).await, connected, "no reconnect");
    assert!(perf.running(), "spdk_nvme_perf still runs");

    let report = perf.finish();
    assert_no_trouble(&report, "across the upgrade");
    eprintln!(
        "{TEST}: adopted spdk_tgt {tgt} from {} with I/O running",
        previous.display()
    );
    // stop spdk_tgt with this talon
    stop_with_targets(&mut cleanup, &dir, v2, tgt).await;
}

/// The DaemonSet split (deploy/kubernetes/targets.yaml): `talon keep-targets`
/// starts tgtd as `talon serve --target-keeper` asks, and talon is stopped
/// (SIGTERM and SIGKILL in turn) and started again 10 times while a
/// libiscsi reader/writer runs: tgtd keeps its pid and its parent (the
/// keeper), no I/O error, no reconnect. Then tgtd killed: the keeper starts
/// it again and talon re-exports; `talon node drain` makes the keeper stop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_tgtd_serves_io_through_ten_talon_kills() {
    const TEST: &str = "kept_tgtd_serves_io_through_ten_talon_kills";
    if !ready(TEST) {
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    write_v1_config(&dir, free_port());
    let socket = dir.join("run/talon.sock");
    let kept: &[&str] = &["--engine", "v1", "--target-keeper"];
    let keeper = Keeper::spawn(&dir);
    let mut cleanup = Cleanup::new(&dir, spawn_talon(&dir, kept));
    let c = connect(&socket).await;
    let (tgtd, portal, iqn) = served(&c).await;
    assert_eq!(
        ppid(tgtd),
        Some(keeper.pid()),
        "tgtd is the keeper's child, not talon's"
    );
    let t = spec(&c, "TargetStatus", "tgtd").await.expect("TargetStatus tgtd");
    assert!(
        t["message"]
            .as_str()
            .is_some_and(|m| m.contains("kept by talon keep-targets")),
        "{t}"
    );
    drop(c);

    let io = IscsiLoop::start(portal, iqn);
    io.progressed("before the first kill").await;
    for round in 1..=ROUNDS {
        let mut talon = cleanup.take();
        stop_talon(&mut talon, Stop::alternating(round), &socket);
        assert!(is_tgtd(tgtd), "round {round}: tgtd {tgtd} outlives talon");
        io.progressed(&format!("with no talon (round {round})")).await;
        cleanup.talon = Some(spawn_talon(&dir, kept));
        adopted(&socket, "tgtd", tgtd, &format!("round {round}")).await;
        io.progressed(&format!("after restart {round}")).await;
    }
    let n = io
        .finish()
        .unwrap_or_else(|e| panic!("I/O failed across talon kills: {e}"));
    eprintln!(
        "{TEST}: {} verified 4 KiB write+read pairs through {ROUNDS} stops of talon (SIGTERM/SIGKILL) \
         with tgtd in the keeper, no error; longest pair {:.1} ms",
        n.pairs,
        n.max_stall.as_secs_f64() * 1000.0
    );

    // tgtd dies: the keeper starts another, talon adopts it and exports the volume again
    kill(Pid::from_raw(tgtd as i32), Signal::SIGKILL).expect("SIGKILL tgtd");
    let c = connect(&socket).await;
    let again = until("a new tgtd from the keeper", || async {
        let t = spec(&c, "TargetStatus", "tgtd").await?;
        let pid = t["pid"].as_u64().and_then(|p| u32::try_from(p).ok())?;
        (t["state"] == "ready" && pid != tgtd).then_some(pid)
    })
    .await;
    assert_eq!(ppid(again), Some(keeper.pid()), "the keeper started it");
    let (pid, _, _) = served(&c).await;
    assert_eq!(pid, again);
    let status: Value = serde_json::from_slice(
        &std::fs::read(dir.join("run/keeper/tgtd.status.json")).expect("keeper status"),
    )
    .expect("json");
    assert_eq!(status["restarts"], 1, "{status}");
    assert_eq!(status["pid"], again, "{status}");
    drop(c);

    // a drain: talon stops, and the keeper stops tgtd as talon asked; the keeper stays
    let out = Command::new(env!("CARGO_BIN_EXE_talon"))
        .arg("--socket")
        .arg(&socket)
        .args(["node", "drain"])
        .output()
        .expect("talon node drain");
    assert!(out.status.success(), "{out:?}");
    let status = cleanup.take().wait().expect("wait");
    assert!(status.success(), "talon exits cleanly on drain: {status}");
    until("the keeper to stop tgtd on drain", || async {
        (!is_tgtd(again)).then_some(())
    })
    .await;
    assert!(alive(keeper.pid()), "the keeper still runs");
    drop(keeper);
}

/// The same split with real SPDK: spdk_tgt started by `talon keep-targets`
/// (with the settings `talon serve --target-keeper` wrote: `--no-huge`,
/// `--disable-cpumask-locks`), spdk_nvme_perf running through 10 stops of
/// talon (SIGTERM and SIGKILL in turn): the same pid and parent, the same
/// controller ids (no reconnect), no I/O error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_kept_spdk_tgt_serves_io_through_ten_talon_kills() {
    const TEST: &str = "real_spdk_kept_spdk_tgt_serves_io_through_ten_talon_kills";
    let Some(spdk) = spdk_ready(TEST) else {
        return;
    };
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    write_v2_config(&dir, free_port());
    let mut kept = V2_ARGS.to_vec();
    kept.push("--target-keeper");
    let socket = dir.join("run/talon.sock");
    let spdk_sock = dir.join("run/spdk.sock");
    let keeper = Keeper::spawn(&dir);
    let mut cleanup = Cleanup::new(&dir, spawn_talon(&dir, &kept));
    let c = connect(&socket).await;
    let (tgt, port, nqn) = served_v2(&c).await;
    cleanup.spdk_tgt = Some(tgt);
    assert_eq!(ppid(tgt), Some(keeper.pid()), "spdk_tgt is the keeper's child");
    let cmdline = std::fs::read_to_string(format!("/proc/{tgt}/cmdline")).expect("cmdline");
    assert!(
        cmdline.contains("--no-huge") && cmdline.contains("--disable-cpumask-locks"),
        "the keeper ran what talon asked: {cmdline:?}"
    );
    drop(c);

    let mut perf = Perf::start(&spdk, "0x2", port, &nqn, 3600);
    let connected = perf_connected(&spdk_sock, &nqn).await;
    for round in 1..=ROUNDS {
        let mut talon = cleanup.take();
        stop_talon(&mut talon, Stop::alternating(round), &socket);
        assert!(alive(tgt), "round {round}: spdk_tgt {tgt} outlives talon");
        assert_eq!(cntlids(&spdk_sock, &nqn).await, connected, "round {round}");
        cleanup.talon = Some(spawn_talon(&dir, &kept));
        let (_, t) = adopted(&socket, "spdk", tgt, &format!("round {round}")).await;
        assert!(
            t["message"]
                .as_str()
                .is_some_and(|m| m.contains("kept by talon keep-targets")),
            "round {round}: {t}"
        );
        assert_eq!(
            cntlids(&spdk_sock, &nqn).await,
            connected,
            "round {round}: no reconnect"
        );
        assert!(perf.running(), "round {round}: spdk_nvme_perf ended early");
    }
    let report = perf.finish();
    assert_no_trouble(&report, "through the stops of talon");
    eprintln!(
        "{TEST}: {ROUNDS} stops of talon with spdk_tgt in the keeper, no error, no reconnect; {}",
        report.total_line()
    );

    // spdk_tgt dies: the keeper starts another, talon adopts it and exports the volume again
    kill(Pid::from_raw(tgt as i32), Signal::SIGKILL).expect("SIGKILL spdk_tgt");
    let c = connect(&socket).await;
    let again = until("a new spdk_tgt from the keeper", || async {
        let t = spec(&c, "TargetStatus", "spdk").await?;
        let pid = t["pid"].as_u64().and_then(|p| u32::try_from(p).ok())?;
        (t["state"] == "ready" && pid != tgt).then_some(pid)
    })
    .await;
    cleanup.spdk_tgt = Some(again);
    assert_eq!(ppid(again), Some(keeper.pid()), "the keeper started it");
    let (pid, _, nqn_again) = served_v2(&c).await;
    assert_eq!(
        (pid, nqn_again.as_str()),
        (again, nqn.as_str()),
        "the same export on the new target"
    );
    let t = spec(&c, "TargetStatus", "spdk").await.expect("TargetStatus spdk");
    assert_eq!(t["restarts"], 1, "{t}");
    drop(c);

    // the keeper's own stop (its pod replaced on node maintenance) stops spdk_tgt cleanly
    let mut talon = cleanup.take();
    sigterm_and_wait(&mut talon);
    drop(keeper);
    assert!(!alive(again), "spdk_tgt {again} stops with its keeper");
}

/// A target the keeper cannot start says why in talon's `TargetStatus` at
/// once (here: the keeper's image has no spdk_tgt), and stays `failed` with
/// that cause while the keeper tries again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_target_that_cannot_start_says_why_in_talon() {
    const TEST: &str = "a_kept_target_that_cannot_start_says_why_in_talon";
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {TEST}: talon serve's data dir and keeper run as root here");
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    // talon's side finds a spdk_tgt (it decides V2 can run); the keeper's does not
    let bin = dir.join("bin/spdk_tgt");
    std::fs::create_dir_all(bin.parent().expect("parent")).expect("mkdir");
    std::fs::write(&bin, "#!/bin/sh\nexit 1\n").expect("write");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v2, listenAddress: 127.0.0.1, nvmfPort: {} }}\n\
             disks:\n  d1: {{ path: disks/d1.img, sizeBytes: 268435456 }}\n",
            free_port()
        ),
    )
    .expect("config");
    let missing = dir.join("keeper-image/spdk_tgt");
    let _keeper = Keeper::spawn_with(&dir, |c| {
        c.arg("--spdk-tgt")
            .arg(&missing)
            .env_remove("TALON_SPDK_DIR")
            .env("PATH", "/nonexistent");
    });
    let socket = dir.join("run/talon.sock");
    let bin_arg = bin.display().to_string();
    let _cleanup = Cleanup::new(
        &dir,
        spawn_talon(
            &dir,
            &[
                "--engine",
                "v2",
                "--no-huge",
                "--spdk-tgt",
                &bin_arg,
                "--target-keeper",
            ],
        ),
    );
    let c = connect(&socket).await;
    let t0 = Instant::now();
    let msg = until("TargetStatus spdk failed with the keeper's cause", || async {
        let t = spec(&c, "TargetStatus", "spdk").await?;
        (t["state"] == "failed")
            .then(|| t["message"].as_str().map(String::from))
            .flatten()
    })
    .await;
    let took = t0.elapsed();
    assert!(
        msg.contains("the target keeper cannot start spdk_tgt") && msg.contains("spdk_tgt was not found"),
        "{msg}"
    );
    assert!(
        msg.contains(&missing.display().to_string()),
        "names where it looked: {msg}"
    );
    // it stays failed with the cause while the keeper tries again
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t = spec(&c, "TargetStatus", "spdk").await.expect("TargetStatus spdk");
        assert_eq!(t["state"], "failed", "{t}");
    }
    eprintln!("{TEST}: TargetStatus failed after {took:?}: {msg}");
}
