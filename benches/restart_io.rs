//! I/O continuity across restarts of talon: a reader/writer runs against a
//! volume while `talon serve` is stopped and started again ROUNDS times (10),
//! and the table says what the initiator saw, side by side for each target,
//! each way of stopping talon, and with the targets started by talon itself
//! or kept by `talon keep-targets` (the DaemonSet split); and an upgrade: an earlier talon
//! (tests/support/previous_talon.rs: `TALON_PREVIOUS_BIN`, or the pinned commit built from
//! git history) started the targets, is killed, and this one adopts them.
//!
//! ```text
//!   tgtd      <── libiscsi thread: 4 KiB WRITE16 + READ16 compared, no automatic reconnect
//!   spdk_tgt  <── spdk_nvme_perf: 4 KiB randrw 50/50, QD8, core 1 (TALON_SPDK_DIR only)
//!                  │ BASELINE_SECS with talon running        -> IOPS before
//!                  │ ROUNDS × (stop talon: SIGTERM | kill -9; talon serve again; adopted)
//!                  ▼                                        -> IOPS during, errors, reconnects,
//!   table                                                      max I/O stall, s per restart
//! ```
//!
//! - I/O errors: libiscsi commands that failed or read other data (the loop then logs in
//!   again: a reconnect); spdk_nvme_perf's error/failure/disconnect lines from before it was
//!   told to stop.
//! - Reconnects: iSCSI logins after the first; NVMe/TCP controller ids that changed
//!   (`nvmf_subsystem_get_controllers` after each restart).
//! - Max I/O stall: the longest write+read pair (or error-to-next-good-pair) of the iSCSI
//!   loop; spdk_nvme_perf's max latency over its run. "before" is the same over the
//!   baseline, with talon left alone: the restarts cost what "during" exceeds it by.
//! - Target restarts: rounds after which the target had another pid (0 means adopted).
//!
//! The set-up is the restart tests' (tests/support/restart.rs). The data path is C (tgtd,
//! libiscsi, SPDK), so `--profile dev` gives the same I/O numbers as a release build;
//! "s/restart" (stop to adopted and exported again) is talon's own and is faster in release.
//! Run as root: `cargo bench --bench restart_io --profile dev` (`TALON_SPDK_DIR=/opt/spdk`
//! adds the spdk_tgt rows; `RESTART_ROUNDS=10`, `RESTART_BASELINE_SECS=3`).

#[path = "support/reap.rs"]
mod reap;
#[path = "../tests/tgt_common/mod.rs"]
#[allow(dead_code, clippy::all)]
mod tgt_common;

#[path = "../tests/support/restart.rs"]
mod restart;

#[path = "../tests/support/previous_talon.rs"]
mod previous_talon;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use comfy_table::Table;
use restart::{
    Cleanup, IscsiLoop, Keeper, Perf, Stop, V2_ARGS, connect, served, served_v2, spawn_program, spawn_talon,
    stop_talon, until, write_v1_config, write_v2_config,
};
use tgt_common::free_port;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Engine {
    Tgtd,
    Spdk,
}

/// Who runs the targets, and which talon runs first.
#[derive(Clone)]
enum Layout {
    /// `talon serve` starts them.
    Talon,
    /// `talon keep-targets` starts them (`talon serve --target-keeper`).
    Keeper,
    /// An earlier talon started them; this one adopts them (one restart: the upgrade).
    Upgrade(PathBuf),
}

impl Layout {
    fn label(&self) -> String {
        match self {
            Layout::Talon => "talon serve".into(),
            Layout::Keeper => "talon keep-targets".into(),
            Layout::Upgrade(_) => format!("talon {} -> this", &previous_talon::rev()[..9]),
        }
    }

    fn keeper(&self) -> bool {
        matches!(self, Layout::Keeper)
    }

    /// The first talon.
    fn spawn_first(&self, dir: &Path, args: &[&str]) -> std::process::Child {
        match self {
            Layout::Upgrade(earlier) => spawn_program(earlier, dir, args),
            _ => spawn_talon(dir, args),
        }
    }
}

struct Row {
    engine: &'static str,
    layout: String,
    stop: Stop,
    rounds: usize,
    errors: u64,
    reconnects: u64,
    stall_before: Duration,
    max_stall: Duration,
    iops_before: f64,
    iops_during: f64,
    target_restarts: usize,
    per_restart: Duration,
}

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = env_num("RESTART_ROUNDS", 10);
    let baseline = Duration::from_secs(env_num("RESTART_BASELINE_SECS", 3));
    let mut engines = Vec::new();
    if tgt_common::ready("restart_io (tgtd rows)") {
        engines.push(Engine::Tgtd);
    }
    match std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) {
        None => eprintln!("SKIP restart_io (spdk_tgt rows): TALON_SPDK_DIR not set"),
        Some(spdk) if !spdk.join("build/bin/spdk_nvme_perf").is_file() => {
            eprintln!(
                "SKIP restart_io (spdk_tgt rows): no build/bin/spdk_nvme_perf in {}",
                spdk.display()
            )
        }
        Some(_) if !nix::unistd::Uid::effective().is_root() => {
            eprintln!("SKIP restart_io (spdk_tgt rows): spdk_tgt needs root")
        }
        Some(_) => engines.push(Engine::Spdk),
    }
    // the upgrade rows: an earlier talon's targets adopted by this one (kill -9: an earlier
    // talon stops its targets on SIGTERM, docs/upgrade.md)
    let earlier = match previous_talon::binary() {
        Ok(p) => Some(p),
        Err(why) => {
            eprintln!("SKIP restart_io (upgrade rows): {why}");
            None
        }
    };
    let mut runs: Vec<(Layout, Stop, usize)> = Vec::new();
    for layout in [Layout::Talon, Layout::Keeper] {
        for stop in [Stop::Term, Stop::Kill] {
            runs.push((layout.clone(), stop, rounds));
        }
    }
    if let Some(p) = earlier {
        runs.push((Layout::Upgrade(p), Stop::Kill, 1));
    }
    let mut rows = Vec::new();
    for engine in engines {
        for (layout, stop, rounds) in &runs {
            let row = match engine {
                Engine::Tgtd => tgtd_row(layout, *stop, *rounds, baseline).await,
                Engine::Spdk => {
                    let spdk = PathBuf::from(std::env::var_os("TALON_SPDK_DIR").expect("checked"));
                    spdk_row(&spdk, layout, *stop, *rounds, baseline).await
                }
            };
            eprintln!(
                "restart_io: {} {} {}: {} errors, {} reconnects, max stall {:.1} ms",
                row.engine,
                row.layout,
                stop.label(),
                row.errors,
                row.reconnects,
                row.max_stall.as_secs_f64() * 1000.0
            );
            rows.push(row);
        }
    }
    if rows.is_empty() {
        return;
    }
    let mut t = Table::new();
    t.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    t.set_header(vec![
        "engine",
        "targets run by",
        "stop kind",
        "restarts",
        "I/O errors",
        "reconnects",
        "max I/O stall before (ms)",
        "max I/O stall during (ms)",
        "IOPS before",
        "IOPS during",
        "target restarts",
        "s/restart",
    ]);
    for r in &rows {
        t.add_row(vec![
            r.engine.to_string(),
            r.layout.clone(),
            r.stop.label().to_string(),
            r.rounds.to_string(),
            r.errors.to_string(),
            r.reconnects.to_string(),
            format!("{:.1}", r.stall_before.as_secs_f64() * 1000.0),
            format!("{:.1}", r.max_stall.as_secs_f64() * 1000.0),
            format!("{:.0}", r.iops_before),
            format!("{:.0}", r.iops_during),
            r.target_restarts.to_string(),
            format!("{:.2}", r.per_restart.as_secs_f64()),
        ]);
    }
    println!("{t}");
}

/// talon's flags for a row.
fn talon_args(base: &[&'static str], keeper: bool) -> Vec<&'static str> {
    let mut a = base.to_vec();
    if keeper {
        a.push("--target-keeper");
    }
    a
}

async fn tgtd_row(layout: &Layout, stop: Stop, rounds: usize, baseline: Duration) -> Row {
    let keeper = layout.keeper();
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    // talon, its targets and the keeper are killed on every way out, a panic too
    let _reap = reap::Reap::under(&dir);
    write_v1_config(&dir, free_port());
    let socket = dir.join("run/talon.sock");
    let args = talon_args(&["--engine", "v1"], keeper);
    let kept = keeper.then(|| Keeper::spawn(&dir));
    let mut cleanup = Cleanup::new(&dir, layout.spawn_first(&dir, &args));
    let c = connect(&socket).await;
    let (first, portal, iqn) = served(&c).await;
    drop(c);

    // counting, not strict: an error is counted and the loop logs in again
    let io = IscsiLoop::start_with(portal, iqn, false, Duration::ZERO);
    io.progressed("before the restarts").await;
    let p0 = io.pairs();
    tokio::time::sleep(baseline).await;
    let iops_before = 2.0 * (io.pairs() - p0) as f64 / baseline.as_secs_f64();
    let stall_before = io.take_max_stall();

    let (p1, t1) = (io.pairs(), Instant::now());
    let mut pid = first;
    let mut target_restarts = 0;
    for _ in 0..rounds {
        let mut talon = cleanup.take();
        stop_talon(&mut talon, stop, &socket);
        cleanup.talon = Some(spawn_talon(&dir, &args));
        let c = connect(&socket).await;
        let (now, _, _) = served(&c).await;
        if now != pid {
            target_restarts += 1;
            pid = now;
        }
    }
    let took = t1.elapsed();
    let iops_during = 2.0 * (io.pairs() - p1) as f64 / took.as_secs_f64();
    let max_stall = io.take_max_stall();
    let n = io.finish().expect("the counting loop does not fail");
    // the keeper first: it stops its targets cleanly
    drop(kept);
    drop(cleanup);
    Row {
        engine: "tgtd",
        layout: layout.label(),
        stop,
        rounds,
        errors: n.errors,
        reconnects: n.reconnects,
        stall_before,
        max_stall,
        iops_before,
        iops_during,
        target_restarts,
        per_restart: took / rounds.max(1) as u32,
    }
}

async fn spdk_row(spdk: &Path, layout: &Layout, stop: Stop, rounds: usize, baseline: Duration) -> Row {
    let keeper = layout.keeper();
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    // talon, its targets and the keeper are killed on every way out, a panic too
    let _reap = reap::Reap::under(&dir);
    write_v2_config(&dir, free_port());
    let socket = dir.join("run/talon.sock");
    let spdk_sock = dir.join("run/spdk.sock");
    // an earlier talon has no --spdk-arg (for --disable-cpumask-locks): the target takes
    // core 1's lock then, and spdk_nvme_perf runs on core 0
    let (base, perf_core): (&[&'static str], &str) = match layout {
        Layout::Upgrade(_) => (
            &[
                "--engine",
                "v2",
                "--no-huge",
                "--no-huge-mem-mib",
                "1024",
                "--spdk-cpumask",
                "0x2",
            ],
            "0x1",
        ),
        _ => (V2_ARGS, "0x2"),
    };
    let args = talon_args(base, keeper);
    let kept = keeper.then(|| Keeper::spawn(&dir));
    let mut cleanup = Cleanup::new(&dir, layout.spawn_first(&dir, &args));
    let c = connect(&socket).await;
    let (first, port, nqn) = served_v2(&c).await;
    cleanup.spdk_tgt = Some(first);
    drop(c);

    // IOPS before: a run of its own, with talon running and left alone
    let mut before = Perf::start(spdk, perf_core, port, &nqn, baseline.as_secs().max(1) as u32);
    until("the baseline spdk_nvme_perf to end", || {
        let done = !before.running();
        async move { done.then_some(()) }
    })
    .await;
    let before = before.finish();

    let mut perf = Perf::start(spdk, perf_core, port, &nqn, 3600);
    let mut connected = restart::perf_connected(&spdk_sock, &nqn).await;
    let t1 = Instant::now();
    let mut pid = first;
    let (mut target_restarts, mut reconnects) = (0, 0);
    let mut died = false;
    for _ in 0..rounds {
        let mut talon = cleanup.take();
        stop_talon(&mut talon, stop, &socket);
        cleanup.talon = Some(spawn_talon(&dir, &args));
        let c = connect(&socket).await;
        let (now, _, _) = served_v2(&c).await;
        if now != pid {
            target_restarts += 1;
            pid = now;
            cleanup.spdk_tgt = Some(now);
        }
        let ids = restart::cntlids(&spdk_sock, &nqn).await;
        if ids != connected {
            reconnects += 1;
            connected = ids;
        }
        died |= !perf.running();
    }
    let took = t1.elapsed();
    let during = perf.finish();
    drop(kept);
    drop(cleanup);
    Row {
        engine: "spdk_tgt",
        layout: layout.label(),
        stop,
        rounds,
        errors: during.trouble.len() as u64 + u64::from(died && during.trouble.is_empty()),
        reconnects,
        stall_before: Duration::from_secs_f64(before.max_latency_us / 1e6),
        max_stall: Duration::from_secs_f64(during.max_latency_us / 1e6),
        iops_before: before.iops,
        iops_during: during.iops,
        target_restarts,
        per_restart: took / rounds.max(1) as u32,
    }
}
