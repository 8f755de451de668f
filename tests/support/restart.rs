//! talon stopped and started again under volume I/O, shared by the restart
//! tests (tests/restart_io.rs) and the continuity bench
//! (benches/restart_io.rs), both `#[path]`-including it beside
//! `tests/tgt_common/mod.rs` (as `tgt_common`): spawning `talon serve` (this
//! build or an earlier one) and `talon keep-targets` on a test's dirs, the
//! two ways a rollout or a crash stops talon, the waits for a served volume,
//! the iSCSI reader/writer (libiscsi, no automatic reconnect) and
//! spdk_nvme_perf with the reading of its report.
//!
//! ```text
//!   <dir>/talon.yaml ──> talon serve (--socket <dir>/run/talon.sock, --data-dir <dir>/data)
//!                          ├─ tgtd     <dir>/run/tgtd/tgtd.pid  <── IscsiLoop (libiscsi thread)
//!                          └─ spdk_tgt <dir>/run/spdk.sock      <── Perf (spdk_nvme_perf)
//!   Stop::Term | Stop::Kill ──> talon gone, targets serving ──> talon serve again ──> adopted
//! ```
#![allow(dead_code)] // each includer uses a part

#[path = "serve_cmd.rs"]
mod serve_cmd;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use talon::client::Client;

use crate::tgt_common::Libiscsi;

/// The volume every restart run serves.
pub const VOLUME: &str = "io";
/// Generous bound for a wait that should take well under a second; it only
/// turns a hang into a failure with a message.
pub const WAIT: Duration = Duration::from_secs(60);

/// The libiscsi loop's initiator name: the V1 export admits it through
/// `allowedHosts` (by default only the host a volume is attached to may log in).
pub const INITIATOR: &str = "iqn.2026-11.test.talon:restart-io";

/// The host NQN spdk_nvme_perf connects with: the V2 export admits it
/// through `allowedHosts`.
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:1b3c2f0e-6d7a-4e21-9c55-3e7a10c0a001";

/// talon's flags for V2 here: no hugepages (the host has none), and no core
/// lock (other jobs on this machine may run SPDK on core 0).
pub const V2_ARGS: &[&str] = &[
    "--engine",
    "v2",
    "--no-huge",
    "--no-huge-mem-mib",
    "1024",
    "--spdk-arg=--disable-cpumask-locks",
];

/// Writes `<dir>/talon.yaml`: a V1 node on 127.0.0.1:`port` admitting
/// [`INITIATOR`], and the 16 MiB volume [`VOLUME`].
pub fn write_v1_config(dir: &Path, port: u16) {
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v1, listenAddress: 127.0.0.1, iscsiPort: {port}, allowedHosts: [{INITIATOR}] }}\n\
             volumes:\n  {VOLUME}: {{ sizeBytes: 16777216 }}\n"
        ),
    )
    .expect("config");
}

/// Writes `<dir>/talon.yaml`: a V2 node with NVMe/TCP on 127.0.0.1:`port`
/// admitting [`HOST`], a 256 MiB file disk and the 64 MiB volume [`VOLUME`].
pub fn write_v2_config(dir: &Path, port: u16) {
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v2, listenAddress: 127.0.0.1, nvmfPort: {port}, allowedHosts: [\"{HOST}\"] }}\n\
             disks:\n  d1: {{ path: disks/d1.img, sizeBytes: 268435456 }}\n\
             volumes:\n  {VOLUME}: {{ sizeBytes: 67108864 }}\n"
        ),
    )
    .expect("config");
}

/// `talon serve` of this build on the dirs under `dir`.
pub fn spawn_talon(dir: &Path, extra: &[&str]) -> Child {
    spawn_program(Path::new(env!("CARGO_BIN_EXE_talon")), dir, extra)
}

/// `program serve` (this talon, or an earlier build) on the dirs under `dir`;
/// its log goes to `<dir>/talon.log`.
pub fn spawn_program(program: &Path, dir: &Path, extra: &[&str]) -> Child {
    serve_cmd::serve(program, dir, "talon.yaml")
        .args(extra)
        .spawn()
        .expect("spawn talon")
}

/// How talon is stopped: SIGTERM (a rollout, `systemctl restart`) or
/// SIGKILL (a container killed, an OOM, a crash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Term,
    Kill,
}

impl Stop {
    /// SIGTERM on even rounds, SIGKILL on odd ones.
    pub fn alternating(round: usize) -> Stop {
        if round.is_multiple_of(2) {
            Stop::Term
        } else {
            Stop::Kill
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Stop::Term => "SIGTERM",
            Stop::Kill => "kill -9",
        }
    }
}

/// SIGTERM to talon; asserts it exits cleanly.
pub fn sigterm_and_wait(child: &mut Child) {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("SIGTERM talon");
    let status = child.wait().expect("wait for talon");
    assert!(status.success(), "talon exits cleanly on SIGTERM: {status}");
}

/// Stops talon the way `how` says; after a SIGKILL the API socket it left
/// is removed (the next talon would refuse a live one, not a stale one, but
/// the tests check the socket is gone after a clean stop).
pub fn stop_talon(child: &mut Child, how: Stop, socket: &Path) {
    match how {
        Stop::Term => sigterm_and_wait(child),
        Stop::Kill => {
            child.kill().expect("SIGKILL talon");
            child.wait().expect("reap talon");
            let _ = std::fs::remove_file(socket);
        }
    }
}

/// Whether `pid` is a live (not zombie) tgtd.
pub fn is_tgtd(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.contains("(tgtd)")
            && !s
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
    })
}

/// Whether a process `pid` exists.
pub fn alive(pid: u32) -> bool {
    kill(Pid::from_raw(pid as i32), None).is_ok()
}

/// The parent pid of `pid` (`/proc/<pid>/stat`, field 4).
pub fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

/// Polls `f` until it returns Some, failing with `what` after [`WAIT`].
pub async fn until<T, F: std::future::Future<Output = Option<T>>>(what: &str, mut f: impl FnMut() -> F) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < WAIT, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client of the talon API at `socket`, once it answers.
pub async fn connect(socket: &Path) -> Client {
    until("the talon API", || async {
        Client::connect_unix(socket).await.ok()
    })
    .await
}

/// The spec of resource `type_/id`, if there is one.
pub async fn spec(c: &Client, type_: &str, id: &str) -> Option<Value> {
    c.get(type_, id).await.ok().map(|r| r.spec)
}

/// Waits until tgtd is ready and [`VOLUME`] exported; returns tgtd's pid
/// and the volume's (portal, iqn).
pub async fn served(c: &Client) -> (u32, String, String) {
    let (pid, (portal, iqn)) = served_by(c, "tgtd", "iscsi", |x| {
        Some((
            format!("{}:{}", x["address"].as_str()?, x["port"].as_u64()?),
            x["name"].as_str()?.to_string(),
        ))
    })
    .await;
    (pid, portal, iqn)
}

/// Waits until spdk_tgt is ready and [`VOLUME`] exported over NVMe/TCP;
/// returns spdk_tgt's pid, the port and the subsystem NQN.
pub async fn served_v2(c: &Client) -> (u32, u16, String) {
    let (pid, (port, nqn)) = served_by(c, "spdk", "nvme-tcp", |x| {
        Some((
            u16::try_from(x["port"].as_u64()?).ok()?,
            x["name"].as_str()?.to_string(),
        ))
    })
    .await;
    (pid, port, nqn)
}

/// Waits until TargetStatus `target` is ready and [`VOLUME`] ready with an
/// export over `transport` that `export` can read; returns the target's pid
/// and what `export` read.
async fn served_by<T>(
    c: &Client,
    target: &str,
    transport: &str,
    export: impl Fn(&Value) -> Option<T>,
) -> (u32, T) {
    let pid = until(&format!("TargetStatus {target} ready"), || async {
        let t = spec(c, "TargetStatus", target).await?;
        (t["state"] == "ready").then(|| t["pid"].as_u64()).flatten()
    })
    .await;
    let got = until("EngineStatus io ready", || async {
        let e = spec(c, "EngineStatus", VOLUME).await?;
        if e["state"] != "ready" {
            return None;
        }
        let x = e["exports"]
            .as_array()?
            .iter()
            .find(|x| x["transport"] == transport)?
            .clone();
        export(&x)
    })
    .await;
    (u32::try_from(pid).expect("pid"), got)
}

/// Waits until an initiator (spdk_nvme_perf) is connected to `nqn`; returns
/// its controller ids (the same ids later mean no reconnect).
pub async fn perf_connected(spdk_sock: &Path, nqn: &str) -> Vec<u64> {
    until("spdk_nvme_perf to connect", || async {
        let ids = cntlids(spdk_sock, nqn).await;
        (!ids.is_empty()).then_some(ids)
    })
    .await
}

/// The controller ids connected to `nqn` (spdk_tgt at `spdk_sock`): the same
/// set before and after means no initiator reconnected.
pub async fn cntlids(spdk_sock: &Path, nqn: &str) -> Vec<u64> {
    let c = talon::spdk::SpdkClient::new(spdk_sock);
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

/// Kills what a failed run leaves behind: the talon child, spdk_tgt if
/// named, and the tgtd named by the run dir's pid file; prints talon's last
/// log lines when a test fails.
pub struct Cleanup {
    pub dir: PathBuf,
    pub talon: Option<Child>,
    /// spdk_tgt's pid (V2), killed if it is still there.
    pub spdk_tgt: Option<u32>,
}

impl Cleanup {
    pub fn new(dir: &Path, talon: Child) -> Self {
        Self {
            dir: dir.to_path_buf(),
            talon: Some(talon),
            spdk_tgt: None,
        }
    }

    /// The running talon, taken out to be stopped.
    pub fn take(&mut self) -> Child {
        self.talon.take().expect("talon runs")
    }
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
            && std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.contains("spdk_tgt") || c.contains("nvmf_tgt"))
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

/// `talon keep-targets` on the run dir under `dir` (the data path's own
/// process, as the talon-targets pod runs it); stopped when dropped.
pub struct Keeper(Child);

impl Keeper {
    pub fn spawn(dir: &Path) -> Keeper {
        Self::spawn_with(dir, |_| {})
    }

    pub fn spawn_with(dir: &Path, more: impl FnOnce(&mut Command)) -> Keeper {
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

    pub fn pid(&self) -> u32 {
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

/// What the iSCSI reader/writer counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct IoCounts {
    /// Verified write+read pairs.
    pub pairs: u64,
    /// Failed commands (and reads that returned other data).
    pub errors: u64,
    /// Logins after the first (each after an error).
    pub reconnects: u64,
    /// The longest write+read pair, or the longest time from an error to the
    /// next verified pair.
    pub max_stall: Duration,
}

/// The reader/writer: 4 KiB writes of a pattern that names the op, each read
/// back and compared, over one libiscsi session with automatic reconnect off
/// (a dropped session is an error, never hidden), on a thread of its own.
///
/// Strict (the tests): the first error ends the loop and is returned.
/// Counting (the bench): an error is counted, the loop logs in again (a
/// reconnect, counted) and goes on.
pub struct IscsiLoop {
    stop: Arc<AtomicBool>,
    pairs: Arc<AtomicU64>,
    /// The longest stall since the last [`IscsiLoop::take_max_stall`], in µs.
    stall_us: Arc<AtomicU64>,
    thread: JoinHandle<Result<IoCounts, String>>,
}

impl IscsiLoop {
    /// Strict, with a 1 ms pause between pairs (the tests share the machine).
    pub fn start(portal: String, iqn: String) -> Self {
        Self::start_with(portal, iqn, true, Duration::from_millis(1))
    }

    pub fn start_with(portal: String, iqn: String, strict: bool, pause: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let pairs = Arc::new(AtomicU64::new(0));
        let stall_us = Arc::new(AtomicU64::new(0));
        let thread = {
            let shared = Shared {
                stop: stop.clone(),
                pairs: pairs.clone(),
                stall_us: stall_us.clone(),
            };
            std::thread::spawn(move || iscsi_loop(&portal, &iqn, strict, pause, &shared))
        };
        Self {
            stop,
            pairs,
            stall_us,
            thread,
        }
    }

    /// The longest stall since the last call (or the start); starts over.
    pub fn take_max_stall(&self) -> Duration {
        Duration::from_micros(self.stall_us.swap(0, Ordering::SeqCst))
    }

    /// Verified pairs so far.
    pub fn pairs(&self) -> u64 {
        self.pairs.load(Ordering::SeqCst)
    }

    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits until more than 20 further pairs are verified; fails (naming
    /// `when`) if the loop ended instead.
    pub async fn progressed(&self, when: &str) {
        let after = self.pairs();
        until(&format!("I/O to go on {when}"), || {
            let n = self.pairs();
            let dead = self.is_finished();
            async move { (n > after + 20 || dead).then_some(()) }
        })
        .await;
        assert!(!self.is_finished(), "the I/O loop ended {when}");
    }

    /// Stops the loop; its counts, or (strict) its first error.
    pub fn finish(self) -> Result<IoCounts, String> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("I/O thread")
    }
}

/// What the loop's thread shares with its [`IscsiLoop`].
struct Shared {
    stop: Arc<AtomicBool>,
    pairs: Arc<AtomicU64>,
    stall_us: Arc<AtomicU64>,
}

fn iscsi_loop(
    portal: &str,
    iqn: &str,
    strict: bool,
    pause: Duration,
    sh: &Shared,
) -> Result<IoCounts, String> {
    let (stop, pairs) = (&sh.stop, &sh.pairs);
    let lib = Libiscsi::load()?;
    let login = || {
        let s = lib.connect(portal, iqn, INITIATOR, None)?;
        s.no_reconnect();
        Ok::<_, String>(s)
    };
    let mut s = login()?;
    let mut n = IoCounts::default();
    let mut i: u64 = 0;
    // when the last error happened: the stall lasts until the next verified pair
    let mut failing_since: Option<Instant> = None;
    while !stop.load(Ordering::SeqCst) {
        let t0 = Instant::now();
        let lba = (i % 256) * 8;
        let data: Vec<u8> = (0..4096u64).map(|b| (b ^ i.wrapping_mul(31)) as u8).collect();
        let done = s
            .write(lba, &data)
            .map_err(|e| format!("write {i} at lba {lba}: {e}"))
            .and_then(|()| {
                s.read(lba, 4096)
                    .map_err(|e| format!("read {i} at lba {lba}: {e}"))
            })
            .and_then(|back| {
                (back == data)
                    .then_some(())
                    .ok_or_else(|| format!("read {i} at lba {lba} returned other data than was written"))
            });
        match done {
            Ok(()) => {
                let stall = failing_since.take().unwrap_or(t0).elapsed();
                n.max_stall = n.max_stall.max(stall);
                sh.stall_us.fetch_max(
                    u64::try_from(stall.as_micros()).unwrap_or(u64::MAX),
                    Ordering::SeqCst,
                );
                i += 1;
                n.pairs = i;
                pairs.store(i, Ordering::SeqCst);
            }
            Err(e) if strict => return Err(e),
            Err(_) => {
                n.errors += 1;
                failing_since.get_or_insert(t0);
                // log in again, until the target takes us (or we are told to stop)
                loop {
                    match login() {
                        Ok(again) => {
                            s = again;
                            n.reconnects += 1;
                            break;
                        }
                        Err(_) if stop.load(Ordering::SeqCst) => return Ok(n),
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            }
        }
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    Ok(n)
}

/// spdk_nvme_perf running a 50/50 random 4 KiB read/write mix at QD8 from
/// core `cpumask` against the export, as [`HOST`], until [`Perf::finish`].
pub struct Perf {
    child: Option<Child>,
}

impl Drop for Perf {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What spdk_nvme_perf reported.
#[derive(Debug, Clone)]
pub struct PerfReport {
    /// Its whole output.
    pub text: String,
    /// Lines that report an error, a failure or a disconnect from before it
    /// was told to stop (its own teardown logs a disconnect).
    pub trouble: Vec<String>,
    /// The "Total" line's IOPS (0 without one).
    pub iops: f64,
    /// The "Total" line's max latency, in µs (0 without one).
    pub max_latency_us: f64,
}

impl PerfReport {
    /// The "Total" line, for a test's closing message ("" without one).
    pub fn total_line(&self) -> &str {
        self.text
            .lines()
            .find(|l| l.trim_start().starts_with("Total"))
            .unwrap_or("")
    }
}

impl Perf {
    /// Starts it for up to `secs` seconds.
    pub fn start(spdk: &Path, cpumask: &str, port: u16, nqn: &str, secs: u32) -> Self {
        let child = Command::new(spdk.join("build/bin/spdk_nvme_perf"))
            .args(["--no-huge", "-s", "512", "-c", cpumask, "-q", "8", "-o", "4096"])
            .args(["-w", "randrw", "-M", "50", "-t", &secs.to_string(), "-r"])
            .arg(format!(
                "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn} hostnqn:{HOST}"
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn spdk_nvme_perf");
        Self { child: Some(child) }
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().expect("perf status").is_none())
    }

    /// Stops it (SIGINT) if it still runs, and reads its report.
    pub fn finish(mut self) -> PerfReport {
        // SPDK stamps its log lines with local time, "[2026-11-23 22:35:57.944849]"; perf's
        // own teardown after SIGINT logs its qpair's disconnect (it does after a normal end too)
        let date = Command::new("date")
            .arg("+%Y-%m-%d %H:%M:%S.%6N")
            .output()
            .expect("date");
        let stopped_at = String::from_utf8_lossy(&date.stdout).trim().to_string();
        let child = self.child.take().expect("spdk_nvme_perf started");
        // fails only if it already ended on its own (-t elapsed, or it failed)
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGINT);
        let out = child.wait_with_output().expect("spdk_nvme_perf output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let trouble = text
            .lines()
            .filter(|l| {
                let lower = l.to_ascii_lowercase();
                let trouble =
                    lower.contains("error") || lower.contains("failed") || lower.contains("disconnect");
                let at = l
                    .strip_prefix('[')
                    .and_then(|r| r.split(']').next())
                    .unwrap_or("");
                trouble && !(at.len() == stopped_at.len() && at >= stopped_at.as_str())
            })
            .map(String::from)
            .collect();
        // "Total : IOPS MiB/s Average min max" (latencies in µs)
        let total: Vec<f64> = text
            .lines()
            .find(|l| l.trim_start().starts_with("Total"))
            .and_then(|l| l.split(':').nth(1))
            .map(|r| r.split_whitespace().filter_map(|v| v.parse().ok()).collect())
            .unwrap_or_default();
        PerfReport {
            trouble,
            iops: total.first().copied().unwrap_or(0.0),
            max_latency_us: total.get(4).copied().unwrap_or(0.0),
            text,
        }
    }
}
