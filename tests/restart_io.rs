//! Restarts of talon do not interrupt volume I/O (V1 engine, real tgtd, real
//! libiscsi initiator): a reader/writer loop runs against a volume while
//! `talon serve` is stopped with SIGTERM and started again 10 times. tgtd keeps
//! its pid (adopted, not restarted), the iSCSI session is never dropped (the
//! initiator's automatic reconnect is off, so a drop would be an error), every
//! read returns what was written, and I/O goes on while no talon runs. Then
//! `--stop-targets-on-exit` stops tgtd with talon.
//!
//! ```text
//!   talon serve (config: node v1 on 127.0.0.1:<free port>, volume io) ──> tgtd ──iSCSI──> loop thread
//!      SIGTERM ─> exit 0, tgtd same pid, loop still counting ─> talon serve again ─> adopted ×10
//! ```

mod tgt_common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use talon::client::Client;
use tgt_common::{Libiscsi, free_port, ready};

const VOLUME: &str = "io";
const V1: &[&str] = &["--engine", "v1"];
const ROUNDS: usize = 10;
/// Generous bound for a wait that should take well under a second; it only
/// turns a hang into a failure with a message.
const WAIT: Duration = Duration::from_secs(60);

/// The libiscsi loop's initiator name: the V1 export admits it through
/// `allowedHosts` (by default only the host a volume is attached to may log in).
const INITIATOR: &str = "iqn.2026-11.test.talon:restart-io";

/// The host NQN the test's spdk_nvme_perf connects with: the V2 export
/// admits it through `allowedHosts` (by default only the host a volume is
/// attached to may connect).
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:1b3c2f0e-6d7a-4e21-9c55-3e7a10c0a001";

fn spawn_talon(dir: &Path, extra: &[&str]) -> Child {
    spawn_program(Path::new(env!("CARGO_BIN_EXE_talon")), dir, extra)
}

/// `program serve` (this talon, or an earlier build) on the test's dirs.
fn spawn_program(program: &Path, dir: &Path, extra: &[&str]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("talon.log"))
        .expect("talon.log");
    Command::new(program)
        .arg("--socket")
        .arg(dir.join("run/talon.sock"))
        .args(["serve", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--run-dir")
        .arg(dir.join("run"))
        .arg("--config")
        .arg(dir.join("talon.yaml"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn talon")
}

fn sigterm_and_wait(child: &mut Child) {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("SIGTERM talon");
    let status = child.wait().expect("wait for talon");
    assert!(status.success(), "talon exits cleanly on SIGTERM: {status}");
}

fn is_tgtd(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.contains("(tgtd)")
            && !s
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
    })
}

/// Polls `f` until it returns Some, failing with `what` after [`WAIT`].
async fn until<T, F: std::future::Future<Output = Option<T>>>(what: &str, mut f: impl FnMut() -> F) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < WAIT, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn connect(socket: &Path) -> Client {
    until("the talon API", || async {
        Client::connect_unix(socket).await.ok()
    })
    .await
}

async fn spec(c: &Client, type_: &str, id: &str) -> Option<Value> {
    c.get(type_, id).await.ok().map(|r| r.spec)
}

/// Waits until tgtd is ready and the volume exported; returns tgtd's pid and
/// the volume's (portal, iqn).
async fn served(c: &Client) -> (u32, String, String) {
    let pid = until("TargetStatus tgtd ready", || async {
        let t = spec(c, "TargetStatus", "tgtd").await?;
        (t["state"] == "ready").then(|| t["pid"].as_u64()).flatten()
    })
    .await;
    let (portal, iqn) = until("EngineStatus io ready", || async {
        let e = spec(c, "EngineStatus", VOLUME).await?;
        if e["state"] != "ready" {
            return None;
        }
        let x = e["exports"]
            .as_array()?
            .iter()
            .find(|x| x["transport"] == "iscsi")?
            .clone();
        Some((
            format!("{}:{}", x["address"].as_str()?, x["port"].as_u64()?),
            x["name"].as_str()?.to_string(),
        ))
    })
    .await;
    (u32::try_from(pid).expect("pid"), portal, iqn)
}

/// Kills what a failed run leaves behind: the talon child and the tgtd named
/// by the run dir's pid file.
struct Cleanup {
    dir: PathBuf,
    talon: Option<Child>,
    /// spdk_tgt's pid (V2), killed if it is still there.
    spdk_tgt: Option<u32>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("talon.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!("talon.log (last lines, newest first):\n{}", tail.join("\n"));
        }
        if let Some(mut c) = self.talon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(pid) = self.spdk_tgt
            && std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.contains("spdk_tgt"))
        {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("run/tgtd/tgtd.pid"))
            && let Ok(pid) = pid.trim().parse::<u32>()
            && is_tgtd(pid)
        {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// The reader/writer: 4 KiB writes of a pattern that names the op, each read
/// back and compared, over one session with automatic reconnect off.
/// Returns the pairs done and the longest one (the I/O stall a restart caused,
/// if any: printed, not asserted).
fn io_loop(
    portal: String,
    iqn: String,
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
) -> Result<(u64, Duration), String> {
    let lib = Libiscsi::load()?;
    let s = lib.connect(&portal, &iqn, INITIATOR, None)?;
    s.no_reconnect();
    let mut i: u64 = 0;
    let mut longest = Duration::ZERO;
    while !stop.load(Ordering::SeqCst) {
        let t0 = Instant::now();
        let lba = (i % 256) * 8;
        let data: Vec<u8> = (0..4096u64).map(|b| (b ^ i.wrapping_mul(31)) as u8).collect();
        s.write(lba, &data)
            .map_err(|e| format!("write {i} at lba {lba}: {e}"))?;
        let back = s
            .read(lba, 4096)
            .map_err(|e| format!("read {i} at lba {lba}: {e}"))?;
        if back != data {
            return Err(format!(
                "read {i} at lba {lba} returned other data than was written"
            ));
        }
        longest = longest.max(t0.elapsed());
        i += 1;
        ops.store(i, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok((i, longest))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_io_runs_through_ten_talon_restarts() {
    const TEST: &str = "v1_io_runs_through_ten_talon_restarts";
    if !ready(TEST) {
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    let port = free_port();
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v1, listenAddress: 127.0.0.1, iscsiPort: {port}, allowedHosts: [{INITIATOR}] }}\n\
             volumes:\n  {VOLUME}: {{ sizeBytes: 16777216 }}\n"
        ),
    )
    .expect("config");
    let socket = dir.join("run/talon.sock");
    let mut cleanup = Cleanup {
        dir: dir.clone(),
        talon: Some(spawn_talon(&dir, V1)),
        spdk_tgt: None,
    };
    let c = connect(&socket).await;
    let (tgtd, portal, iqn) = served(&c).await;
    drop(c);

    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let io = {
        let (stop, ops) = (stop.clone(), ops.clone());
        std::thread::spawn(move || io_loop(portal, iqn, stop, ops))
    };
    let progressed = |after: u64, when: &str| {
        let ops = ops.clone();
        let io = &io;
        let when = when.to_string();
        async move {
            until(&format!("I/O to go on {when}"), || {
                let n = ops.load(Ordering::SeqCst);
                let dead = io.is_finished();
                async move { (n > after + 20 || dead).then_some(()) }
            })
            .await;
            assert!(!io.is_finished(), "the I/O loop ended {when}");
        }
    };
    progressed(0, "before the first restart").await;

    for round in 1..=ROUNDS {
        let mut talon = cleanup.talon.take().expect("talon runs");
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
        progressed(
            ops.load(Ordering::SeqCst),
            &format!("while talon is stopped (round {round})"),
        )
        .await;

        cleanup.talon = Some(spawn_talon(&dir, V1));
        let c = connect(&socket).await;
        let (pid, _, _) = served(&c).await;
        assert_eq!(
            pid, tgtd,
            "round {round}: the new talon adopts tgtd instead of starting another"
        );
        let t = spec(&c, "TargetStatus", "tgtd").await.expect("TargetStatus tgtd");
        assert_eq!(t["restarts"], 0, "round {round}: tgtd was not restarted: {t}");
        progressed(ops.load(Ordering::SeqCst), &format!("after restart {round}")).await;
    }

    stop.store(true, Ordering::SeqCst);
    let done = io.join().expect("I/O thread");
    let (n, longest) = done.unwrap_or_else(|e| panic!("I/O failed across talon restarts: {e}"));
    eprintln!(
        "{TEST}: {n} verified 4 KiB write+read pairs through {ROUNDS} restarts of talon, no error; \
         longest pair {:.1} ms",
        longest.as_secs_f64() * 1000.0
    );

    // the explicit mode: --stop-targets-on-exit stops tgtd with talon
    let mut talon = cleanup.talon.take().expect("talon runs");
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

/// Waits until spdk_tgt is ready and the volume exported over NVMe/TCP;
/// returns spdk_tgt's pid, the port and the subsystem NQN.
async fn served_v2(c: &Client) -> (u32, u16, String) {
    let pid = until("TargetStatus spdk ready", || async {
        let t = spec(c, "TargetStatus", "spdk").await?;
        (t["state"] == "ready").then(|| t["pid"].as_u64()).flatten()
    })
    .await;
    let (port, nqn) = until("EngineStatus io ready", || async {
        let e = spec(c, "EngineStatus", VOLUME).await?;
        if e["state"] != "ready" {
            return None;
        }
        let x = e["exports"]
            .as_array()?
            .iter()
            .find(|x| x["transport"] == "nvme-tcp")?
            .clone();
        Some((
            u16::try_from(x["port"].as_u64()?).ok()?,
            x["name"].as_str()?.to_string(),
        ))
    })
    .await;
    (u32::try_from(pid).expect("pid"), port, nqn)
}

/// The controller ids connected to `nqn`: the same set before and after means
/// no initiator reconnected.
async fn cntlids(socket: &Path, nqn: &str) -> Vec<u64> {
    let c = talon::spdk::SpdkClient::new(socket);
    let v: Value = c
        .call(
            "nvmf_subsystem_get_controllers",
            Some(&serde_json::json!({"nqn": nqn})),
        )
        .await
        .expect("nvmf_subsystem_get_controllers");
    let mut ids: Vec<u64> = v
        .as_array()
        .expect("controllers")
        .iter()
        .filter_map(|c| c["cntlid"].as_u64())
        .collect();
    ids.sort_unstable();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_v2_io_runs_through_ten_talon_restarts() {
    const TEST: &str = "real_spdk_v2_io_runs_through_ten_talon_restarts";
    let Some(spdk) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP {TEST}: TALON_SPDK_DIR not set");
        return;
    };
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {TEST}: spdk_tgt needs root");
        return;
    }
    let perf_bin = spdk.join("build/bin/spdk_nvme_perf");
    if !perf_bin.is_file() {
        eprintln!("SKIP {TEST}: {} not found", perf_bin.display());
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    let port = free_port();
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v2, listenAddress: 127.0.0.1, nvmfPort: {port}, allowedHosts: [\"{HOST}\"] }}\n\
             disks:\n  d1: {{ path: disks/d1.img, sizeBytes: 268435456 }}\n\
             volumes:\n  {VOLUME}: {{ sizeBytes: 67108864 }}\n"
        ),
    )
    .expect("config");
    // no hugepages, and no core lock: other jobs on this machine may run SPDK on core 0
    let v2: &[&str] = &[
        "--engine",
        "v2",
        "--no-huge",
        "--no-huge-mem-mib",
        "1024",
        "--spdk-arg=--disable-cpumask-locks",
    ];
    let socket = dir.join("run/talon.sock");
    let spdk_sock = dir.join("run/spdk.sock");
    let mut cleanup = Cleanup {
        dir: dir.clone(),
        talon: Some(spawn_talon(&dir, v2)),
        spdk_tgt: None,
    };
    let c = connect(&socket).await;
    let (tgt, port, nqn) = served_v2(&c).await;
    cleanup.spdk_tgt = Some(tgt);
    drop(c);

    // the reader/writer: 50/50 random 4 KiB I/O at QD8 from core 1 until SIGINT
    let mut perf = Command::new(&perf_bin)
        .args(["--no-huge", "-s", "512", "-c", "0x2", "-q", "8", "-o", "4096"])
        .args(["-w", "randrw", "-M", "50", "-t", "3600", "-r"])
        .arg(format!(
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn} hostnqn:{HOST}"
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spdk_nvme_perf");
    let connected = until("spdk_nvme_perf to connect", || async {
        let ids = cntlids(&spdk_sock, &nqn).await;
        (!ids.is_empty()).then_some(ids)
    })
    .await;

    for round in 1..=ROUNDS {
        let mut talon = cleanup.talon.take().expect("talon runs");
        sigterm_and_wait(&mut talon);
        assert!(
            kill(Pid::from_raw(tgt as i32), None).is_ok(),
            "round {round}: spdk_tgt (pid {tgt}) keeps running after talon stopped"
        );
        assert_eq!(
            cntlids(&spdk_sock, &nqn).await,
            connected,
            "round {round}: the initiator stays connected while talon is stopped"
        );
        cleanup.talon = Some(spawn_talon(&dir, v2));
        let c = connect(&socket).await;
        let (pid, _, _) = served_v2(&c).await;
        assert_eq!(pid, tgt, "round {round}: the new talon adopts spdk_tgt");
        let t = spec(&c, "TargetStatus", "spdk").await.expect("TargetStatus spdk");
        assert_eq!(t["restarts"], 0, "round {round}: spdk_tgt was not restarted: {t}");
        assert!(
            t["message"].as_str().is_some_and(|m| m.starts_with("adopted")),
            "round {round}: {t}"
        );
        assert_eq!(
            cntlids(&spdk_sock, &nqn).await,
            connected,
            "round {round}: no reconnect after the new talon adopted the target"
        );
        assert!(
            perf.try_wait().expect("perf status").is_none(),
            "round {round}: spdk_nvme_perf ended early"
        );
    }

    // SPDK stamps its log lines with local time, "[2026-11-23 22:35:57.944849]"; perf's own
    // teardown after SIGINT logs its qpair's disconnect (it does so after a normal end too)
    let date = Command::new("date")
        .arg("+%Y-%m-%d %H:%M:%S.%6N")
        .output()
        .expect("date");
    let stopped_at = String::from_utf8_lossy(&date.stdout).trim().to_string();
    kill(Pid::from_raw(perf.id() as i32), Signal::SIGINT).expect("SIGINT spdk_nvme_perf");
    let out = perf.wait_with_output().expect("spdk_nvme_perf output");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bad: Vec<&str> = report
        .lines()
        .filter(|l| {
            let lower = l.to_ascii_lowercase();
            let trouble = lower.contains("error") || lower.contains("failed") || lower.contains("disconnect");
            let at = l
                .strip_prefix('[')
                .and_then(|r| r.split(']').next())
                .unwrap_or("");
            trouble && !(at.len() == stopped_at.len() && at >= stopped_at.as_str())
        })
        .collect();
    assert!(
        bad.is_empty(),
        "spdk_nvme_perf reported I/O trouble: {bad:?}\n{report}"
    );
    let total = report
        .lines()
        .find(|l| l.trim_start().starts_with("Total"))
        .unwrap_or_else(|| panic!("no Total line in spdk_nvme_perf's report:\n{report}"));
    eprintln!("{TEST}: {ROUNDS} restarts of talon under spdk_nvme_perf, no error, no reconnect; {total}");

    // --stop-targets-on-exit stops spdk_tgt with talon
    let mut talon = cleanup.talon.take().expect("talon runs");
    sigterm_and_wait(&mut talon);
    let mut args = v2.to_vec();
    args.push("--stop-targets-on-exit");
    let mut talon = spawn_talon(&dir, &args);
    let c = connect(&socket).await;
    assert_eq!(served_v2(&c).await.0, tgt, "still the same spdk_tgt");
    drop(c);
    sigterm_and_wait(&mut talon);
    assert!(
        kill(Pid::from_raw(tgt as i32), None).is_err(),
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
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v1, listenAddress: 127.0.0.1, iscsiPort: {}, allowedHosts: [{INITIATOR}] }}\n\
             volumes:\n  {VOLUME}: {{ sizeBytes: 16777216 }}\n",
            free_port()
        ),
    )
    .expect("config");
    let socket = dir.join("run/talon.sock");
    let mut cleanup = Cleanup {
        dir: dir.clone(),
        talon: Some(spawn_talon(&dir, V1)),
        spdk_tgt: None,
    };
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
    let status = cleanup.talon.take().expect("talon").wait().expect("wait");
    assert!(status.success(), "talon exits cleanly on node stop: {status}");
    assert!(is_tgtd(tgtd), "tgtd (pid {tgtd}) keeps serving after node stop");

    cleanup.talon = Some(spawn_talon(&dir, V1));
    let c = connect(&socket).await;
    assert_eq!(served(&c).await.0, tgtd, "the next talon adopts it");
    drop(c);
    let said = verb(&["node", "drain"]);
    assert!(said.contains("spdk_tgt and tgtd with it"), "{said}");
    let status = cleanup.talon.take().expect("talon").wait().expect("wait");
    assert!(status.success(), "talon exits cleanly on node drain: {status}");
    until("tgtd to stop with node drain", || async {
        (!is_tgtd(tgtd)).then_some(())
    })
    .await;
}

/// An upgrade from a talon built before targets outlived a clean stop: the
/// old one is stopped with SIGKILL (it would stop tgtd on SIGTERM, see
/// docs/upgrade.md), and this talon adopts the tgtd it started, with I/O
/// running and no reconnect. Needs `TALON_PREVIOUS_BIN` (tests/previous_talon.sh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_talons_tgtd_is_adopted_with_io_running() {
    const TEST: &str = "an_earlier_talons_tgtd_is_adopted_with_io_running";
    let Some(previous) = std::env::var_os("TALON_PREVIOUS_BIN").map(PathBuf::from) else {
        eprintln!(
            "SKIP {TEST}: TALON_PREVIOUS_BIN not set (export TALON_PREVIOUS_BIN=$(tests/previous_talon.sh))"
        );
        return;
    };
    if !ready(TEST) {
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v1, listenAddress: 127.0.0.1, iscsiPort: {}, allowedHosts: [{INITIATOR}] }}\n\
             volumes:\n  {VOLUME}: {{ sizeBytes: 16777216 }}\n",
            free_port()
        ),
    )
    .expect("config");
    let socket = dir.join("run/talon.sock");
    let mut cleanup = Cleanup {
        dir: dir.clone(),
        talon: Some(spawn_program(&previous, &dir, V1)),
        spdk_tgt: None,
    };
    let c = connect(&socket).await;
    let (tgtd, portal, iqn) = served(&c).await;
    drop(c);
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let io = {
        let (stop, ops) = (stop.clone(), ops.clone());
        std::thread::spawn(move || io_loop(portal, iqn, stop, ops))
    };
    let progressed = |when: &'static str| {
        let ops = ops.clone();
        let io = &io;
        async move {
            let after = ops.load(Ordering::SeqCst);
            until(&format!("I/O to go on {when}"), || {
                let n = ops.load(Ordering::SeqCst);
                let dead = io.is_finished();
                async move { (n > after + 20 || dead).then_some(()) }
            })
            .await;
            assert!(!io.is_finished(), "the I/O loop ended {when}");
        }
    };
    progressed("under the earlier talon").await;

    let mut old = cleanup.talon.take().expect("the earlier talon");
    old.kill().expect("SIGKILL the earlier talon");
    old.wait().expect("reap it");
    let _ = std::fs::remove_file(&socket);
    assert!(is_tgtd(tgtd), "tgtd (pid {tgtd}) outlives the earlier talon");
    progressed("with no talon").await;

    cleanup.talon = Some(spawn_talon(&dir, V1));
    let c = connect(&socket).await;
    let (pid, _, _) = served(&c).await;
    assert_eq!(pid, tgtd, "this talon adopts the earlier talon's tgtd");
    let t = spec(&c, "TargetStatus", "tgtd").await.expect("TargetStatus tgtd");
    assert_eq!(t["restarts"], 0, "{t}");
    progressed("under this talon").await;
    stop.store(true, Ordering::SeqCst);
    let (n, _) = io
        .join()
        .expect("I/O thread")
        .unwrap_or_else(|e| panic!("I/O failed across the upgrade: {e}"));
    eprintln!(
        "{TEST}: {n} verified write+read pairs across the upgrade from {}",
        previous.display()
    );
    let mut talon = cleanup.talon.take().expect("talon");
    sigterm_and_wait(&mut talon);
}

/// The same upgrade with real SPDK: an earlier talon's spdk_tgt is adopted
/// while spdk_nvme_perf runs, with the same controller ids (no reconnect).
/// Core 1 for the target: an earlier talon cannot pass `--disable-cpumask-locks`,
/// and other jobs here may hold core 0's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_an_earlier_talons_spdk_tgt_is_adopted_with_io_running() {
    const TEST: &str = "real_spdk_an_earlier_talons_spdk_tgt_is_adopted_with_io_running";
    let Some(previous) = std::env::var_os("TALON_PREVIOUS_BIN").map(PathBuf::from) else {
        eprintln!(
            "SKIP {TEST}: TALON_PREVIOUS_BIN not set (export TALON_PREVIOUS_BIN=$(tests/previous_talon.sh))"
        );
        return;
    };
    let Some(spdk) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP {TEST}: TALON_SPDK_DIR not set");
        return;
    };
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {TEST}: spdk_tgt needs root");
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v2, listenAddress: 127.0.0.1, nvmfPort: {}, allowedHosts: [\"{HOST}\"] }}\n\
             disks:\n  d1: {{ path: disks/d1.img, sizeBytes: 268435456 }}\n\
             volumes:\n  {VOLUME}: {{ sizeBytes: 67108864 }}\n",
            free_port()
        ),
    )
    .expect("config");
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
    let mut cleanup = Cleanup {
        dir: dir.clone(),
        talon: Some(spawn_program(&previous, &dir, v2)),
        spdk_tgt: None,
    };
    let c = connect(&socket).await;
    let (tgt, port, nqn) = served_v2(&c).await;
    cleanup.spdk_tgt = Some(tgt);
    drop(c);
    let mut perf = Command::new(spdk.join("build/bin/spdk_nvme_perf"))
        .args(["--no-huge", "-s", "512", "-c", "0x1", "-q", "8", "-o", "4096"])
        .args(["-w", "randrw", "-M", "50", "-t", "3600", "-r"])
        .arg(format!(
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn} hostnqn:{HOST}"
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spdk_nvme_perf");
    let connected = until("spdk_nvme_perf to connect", || async {
        let ids = cntlids(&spdk_sock, &nqn).await;
        (!ids.is_empty()).then_some(ids)
    })
    .await;

    let mut old = cleanup.talon.take().expect("the earlier talon");
    old.kill().expect("SIGKILL the earlier talon");
    old.wait().expect("reap it");
    let _ = std::fs::remove_file(&socket);
    cleanup.talon = Some(spawn_talon(&dir, v2));
    let c = connect(&socket).await;
    let (pid, _, _) = served_v2(&c).await;
    assert_eq!(pid, tgt, "this talon adopts the earlier talon's spdk_tgt");
    let t = spec(&c, "TargetStatus", "spdk").await.expect("TargetStatus spdk");
    assert_eq!(t["restarts"], 0, "{t}");
    assert_eq!(cntlids(&spdk_sock, &nqn).await, connected, "no reconnect");
    assert!(
        perf.try_wait().expect("perf").is_none(),
        "spdk_nvme_perf still runs"
    );

    let date = Command::new("date")
        .arg("+%Y-%m-%d %H:%M:%S.%6N")
        .output()
        .expect("date");
    let stopped_at = String::from_utf8_lossy(&date.stdout).trim().to_string();
    kill(Pid::from_raw(perf.id() as i32), Signal::SIGINT).expect("SIGINT spdk_nvme_perf");
    let out = perf.wait_with_output().expect("perf output");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bad: Vec<&str> = report
        .lines()
        .filter(|l| {
            let lower = l.to_ascii_lowercase();
            let trouble = lower.contains("error") || lower.contains("failed") || lower.contains("disconnect");
            let at = l
                .strip_prefix('[')
                .and_then(|r| r.split(']').next())
                .unwrap_or("");
            trouble && !(at.len() == stopped_at.len() && at >= stopped_at.as_str())
        })
        .collect();
    assert!(
        bad.is_empty(),
        "I/O trouble across the upgrade: {bad:?}\n{report}"
    );
    eprintln!(
        "{TEST}: adopted spdk_tgt {tgt} from {} with I/O running",
        previous.display()
    );
    // stop spdk_tgt with this talon
    let mut talon = cleanup.talon.take().expect("talon");
    sigterm_and_wait(&mut talon);
    let mut args = v2.to_vec();
    args.push("--stop-targets-on-exit");
    let mut talon = spawn_talon(&dir, &args);
    let c = connect(&socket).await;
    assert_eq!(served_v2(&c).await.0, tgt);
    drop(c);
    sigterm_and_wait(&mut talon);
}

/// `talon keep-targets` on the test's run dir (the data path's own process,
/// as the talon-targets pod runs it); killed when dropped.
struct Keeper(Child);

impl Keeper {
    fn spawn(dir: &Path) -> Keeper {
        Self::spawn_with(dir, |_| {})
    }

    fn spawn_with(dir: &Path, more: impl FnOnce(&mut Command)) -> Keeper {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("keeper.log"))
            .expect("keeper.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_talon"));
        cmd.args(["keep-targets", "--run-dir"])
            .arg(dir.join("run"))
            .stdout(Stdio::null())
            .stderr(log);
        more(&mut cmd);
        Keeper(cmd.spawn().expect("spawn talon keep-targets"))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The parent pid of `pid` (`/proc/<pid>/stat`, field 4).
fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

/// Stops talon the way a rollout or a crash does: SIGTERM on even rounds,
/// SIGKILL (a container killed, an OOM) on odd ones.
fn stop_talon(child: &mut Child, round: usize, socket: &Path) {
    if round.is_multiple_of(2) {
        sigterm_and_wait(child);
    } else {
        child.kill().expect("SIGKILL talon");
        child.wait().expect("reap talon");
        let _ = std::fs::remove_file(socket);
    }
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
    let port = free_port();
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v1, listenAddress: 127.0.0.1, iscsiPort: {port}, allowedHosts: [{INITIATOR}] }}\n\
             volumes:\n  {VOLUME}: {{ sizeBytes: 16777216 }}\n"
        ),
    )
    .expect("config");
    let socket = dir.join("run/talon.sock");
    let kept: &[&str] = &["--engine", "v1", "--target-keeper"];
    let keeper = Keeper::spawn(&dir);
    let mut cleanup = Cleanup {
        dir: dir.clone(),
        talon: Some(spawn_talon(&dir, kept)),
        spdk_tgt: None,
    };
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

    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let io = {
        let (stop, ops) = (stop.clone(), ops.clone());
        std::thread::spawn(move || io_loop(portal, iqn, stop, ops))
    };
    let progressed = |when: String| {
        let ops = ops.clone();
        let io = &io;
        async move {
            let after = ops.load(Ordering::SeqCst);
            until(&format!("I/O to go on {when}"), || {
                let n = ops.load(Ordering::SeqCst);
                let dead = io.is_finished();
                async move { (n > after + 20 || dead).then_some(()) }
            })
            .await;
            assert!(!io.is_finished(), "the I/O loop ended {when}");
        }
    };
    progressed("before the first kill".into()).await;
    for round in 1..=ROUNDS {
        let mut talon = cleanup.talon.take().expect("talon runs");
        stop_talon(&mut talon, round, &socket);
        assert!(is_tgtd(tgtd), "round {round}: tgtd {tgtd} outlives talon");
        progressed(format!("with no talon (round {round})")).await;
        cleanup.talon = Some(spawn_talon(&dir, kept));
        let c = connect(&socket).await;
        let (pid, _, _) = served(&c).await;
        assert_eq!(pid, tgtd, "round {round}: the new talon adopts the kept tgtd");
        let t = spec(&c, "TargetStatus", "tgtd").await.expect("TargetStatus tgtd");
        assert_eq!(t["restarts"], 0, "round {round}: {t}");
        progressed(format!("after restart {round}")).await;
    }
    stop.store(true, Ordering::SeqCst);
    let (n, longest) = io
        .join()
        .expect("I/O thread")
        .unwrap_or_else(|e| panic!("I/O failed across talon kills: {e}"));
    eprintln!(
        "{TEST}: {n} verified 4 KiB write+read pairs through {ROUNDS} stops of talon (SIGTERM/SIGKILL) \
         with tgtd in the keeper, no error; longest pair {:.1} ms",
        longest.as_secs_f64() * 1000.0
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
    let status = cleanup.talon.take().expect("talon").wait().expect("wait");
    assert!(status.success(), "talon exits cleanly on drain: {status}");
    until("the keeper to stop tgtd on drain", || async {
        (!is_tgtd(again)).then_some(())
    })
    .await;
    assert!(
        kill(Pid::from_raw(keeper.pid() as i32), None).is_ok(),
        "the keeper still runs"
    );
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
    let Some(spdk) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP {TEST}: TALON_SPDK_DIR not set");
        return;
    };
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {TEST}: spdk_tgt needs root");
        return;
    }
    let perf_bin = spdk.join("build/bin/spdk_nvme_perf");
    if !perf_bin.is_file() {
        eprintln!("SKIP {TEST}: {} not found", perf_bin.display());
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v2, listenAddress: 127.0.0.1, nvmfPort: {}, allowedHosts: [\"{HOST}\"] }}\n\
             disks:\n  d1: {{ path: disks/d1.img, sizeBytes: 268435456 }}\n\
             volumes:\n  {VOLUME}: {{ sizeBytes: 67108864 }}\n",
            free_port()
        ),
    )
    .expect("config");
    let kept: &[&str] = &[
        "--engine",
        "v2",
        "--no-huge",
        "--no-huge-mem-mib",
        "1024",
        "--spdk-arg=--disable-cpumask-locks",
        "--target-keeper",
    ];
    let socket = dir.join("run/talon.sock");
    let spdk_sock = dir.join("run/spdk.sock");
    let keeper = Keeper::spawn(&dir);
    let mut cleanup = Cleanup {
        dir: dir.clone(),
        talon: Some(spawn_talon(&dir, kept)),
        spdk_tgt: None,
    };
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

    let mut perf = Command::new(&perf_bin)
        .args(["--no-huge", "-s", "512", "-c", "0x2", "-q", "8", "-o", "4096"])
        .args(["-w", "randrw", "-M", "50", "-t", "3600", "-r"])
        .arg(format!(
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn} hostnqn:{HOST}"
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spdk_nvme_perf");
    let connected = until("spdk_nvme_perf to connect", || async {
        let ids = cntlids(&spdk_sock, &nqn).await;
        (!ids.is_empty()).then_some(ids)
    })
    .await;
    for round in 1..=ROUNDS {
        let mut talon = cleanup.talon.take().expect("talon runs");
        stop_talon(&mut talon, round, &socket);
        assert!(
            kill(Pid::from_raw(tgt as i32), None).is_ok(),
            "round {round}: spdk_tgt {tgt} outlives talon"
        );
        assert_eq!(cntlids(&spdk_sock, &nqn).await, connected, "round {round}");
        cleanup.talon = Some(spawn_talon(&dir, kept));
        let c = connect(&socket).await;
        let (pid, _, _) = served_v2(&c).await;
        assert_eq!(pid, tgt, "round {round}: the new talon adopts the kept spdk_tgt");
        let t = spec(&c, "TargetStatus", "spdk").await.expect("TargetStatus spdk");
        assert_eq!(t["restarts"], 0, "round {round}: {t}");
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
        assert!(
            perf.try_wait().expect("perf status").is_none(),
            "round {round}: spdk_nvme_perf ended early"
        );
    }
    let date = Command::new("date")
        .arg("+%Y-%m-%d %H:%M:%S.%6N")
        .output()
        .expect("date");
    let stopped_at = String::from_utf8_lossy(&date.stdout).trim().to_string();
    kill(Pid::from_raw(perf.id() as i32), Signal::SIGINT).expect("SIGINT spdk_nvme_perf");
    let out = perf.wait_with_output().expect("spdk_nvme_perf output");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bad: Vec<&str> = report
        .lines()
        .filter(|l| {
            let lower = l.to_ascii_lowercase();
            let trouble = lower.contains("error") || lower.contains("failed") || lower.contains("disconnect");
            let at = l
                .strip_prefix('[')
                .and_then(|r| r.split(']').next())
                .unwrap_or("");
            trouble && !(at.len() == stopped_at.len() && at >= stopped_at.as_str())
        })
        .collect();
    assert!(
        bad.is_empty(),
        "spdk_nvme_perf reported I/O trouble: {bad:?}\n{report}"
    );
    let total = report
        .lines()
        .find(|l| l.trim_start().starts_with("Total"))
        .unwrap_or_else(|| panic!("no Total line in spdk_nvme_perf's report:\n{report}"));
    eprintln!("{TEST}: {ROUNDS} stops of talon with spdk_tgt in the keeper, no error, no reconnect; {total}");

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
    let mut talon = cleanup.talon.take().expect("talon");
    sigterm_and_wait(&mut talon);
    drop(keeper);
    assert!(
        kill(Pid::from_raw(again as i32), None).is_err(),
        "spdk_tgt {again} stops with its keeper"
    );
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
    let _cleanup = Cleanup {
        dir: dir.clone(),
        talon: Some(spawn_talon(
            &dir,
            &[
                "--engine",
                "v2",
                "--no-huge",
                "--spdk-tgt",
                &bin_arg,
                "--target-keeper",
            ],
        )),
        spdk_tgt: None,
    };
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
