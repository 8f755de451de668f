//! V1 at scale, through a real `talon serve --engine v1` and a real tgtd: create N volumes
//! (1,000 by default) with 16 requests in flight, idle with them all served, delete them all,
//! and print a table. With `TALON_PREVIOUS_BIN` (`tests/previous_talon.sh [REV]` builds one;
//! by default the upgrade tests' pinned commit) the same run measures that binary too, on its
//! own dirs and port.
//!
//! ```text
//!   talon serve --engine v1 (this build | TALON_PREVIOUS_BIN) ── tgtd on 127.0.0.1:<free port>
//!     volume_create {wait: true} × N, 16 in flight     -> create p50 / p99 / total
//!     idle TALON_BENCH_IDLE_SECS (20) s                 -> talon CPU, tgtd CPU, talon RSS,
//!                                                          V1 reconciles in the window
//!     volume_delete × N, 16 in flight, until gone       -> delete p50 / p99 / total
//! ```
//!
//! Run as root: `cargo bench --bench v1_scale` (`V1_SCALE_VOLUMES=1000`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use talon::client::Client;

const IN_FLIGHT: usize = 16;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port()
}

/// (utime + stime in clock ticks, RSS in kB) of a process.
fn proc_stat(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit(')').next()?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((ticks, rss))
}

struct Row {
    label: String,
    n: usize,
    create: (Duration, Duration, Duration),
    delete: (Duration, Duration, Duration),
    idle_secs: u64,
    talon_cpu: f64,
    tgtd_cpu: f64,
    rss_mib: f64,
    reconciles: u64,
}

struct Serve {
    child: Child,
    dir: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        // --stop-targets-on-exit: SIGTERM stops tgtd too
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
        let _ = &self.dir;
    }
}

async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(what: &str, mut f: impl FnMut() -> F) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn v1_reconciles(c: &Client) -> u64 {
    c.controllers()
        .await
        .ok()
        .and_then(|cs| cs.into_iter().find(|s| s.name == "engine.V1VolumeController"))
        .map(|s| s.reconciles)
        .unwrap_or(0)
}

async fn run(label: &str, program: &Path, n: usize, idle_secs: u64) -> Row {
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    let port = free_port();
    std::fs::write(
        dir.join("talon.yaml"),
        format!("node: {{ engine: v1, listenAddress: 127.0.0.1, iscsiPort: {port} }}\n"),
    )
    .expect("config");
    let log = std::fs::File::create(dir.join("talon.log")).expect("log");
    let child = Command::new(program)
        .arg("--socket")
        .arg(dir.join("run/talon.sock"))
        .args(["serve", "--engine", "v1", "--stop-targets-on-exit", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--run-dir")
        .arg(dir.join("data/run"))
        .arg("--config")
        .arg(dir.join("talon.yaml"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn talon");
    let serve = Serve {
        child,
        dir: dir.clone(),
    };
    let socket = dir.join("run/talon.sock");
    let c = Arc::new(wait_for("the API", || async { Client::connect_unix(&socket).await.ok() }).await);
    c.node_info().await.expect("node_info");
    let sem = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (c, sem) = (c.clone(), sem.clone());
        tasks.spawn(async move {
            let _slot = sem.acquire().await.expect("semaphore");
            let t = Instant::now();
            let r: Result<Value, _> = c
                .call(
                    "volume_create",
                    json!({"name": format!("s{i}"), "sizeBytes": 1 << 20, "engine": "v1", "wait": true}),
                )
                .await;
            r.unwrap_or_else(|e| panic!("create s{i}: {e}"));
            t.elapsed()
        });
    }
    let mut create: Vec<Duration> = tasks.join_all().await;
    let create_total = t0.elapsed();

    // tgtd runs while V1 volumes exist
    let tgtd_pid = wait_for("tgtd ready", || async {
        let t = c.get("TargetStatus", "tgtd").await.ok()?.spec;
        (t["state"] == "ready").then(|| t["pid"].as_u64()).flatten()
    })
    .await as u32;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (talon0, _) = proc_stat(serve.child.id()).expect("talon stat");
    let (tgtd0, _) = proc_stat(tgtd_pid).expect("tgtd stat");
    let r0 = v1_reconciles(&c).await;
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let (talon1, rss) = proc_stat(serve.child.id()).expect("talon stat");
    let (tgtd1, _) = proc_stat(tgtd_pid).expect("tgtd stat");
    let r1 = v1_reconciles(&c).await;
    let cpu = |a: u64, b: u64| (b - a) as f64 / 100.0 / idle_secs as f64 * 100.0;

    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (c, sem) = (c.clone(), sem.clone());
        tasks.spawn(async move {
            let _slot = sem.acquire().await.expect("semaphore");
            let t = Instant::now();
            let r: Result<Value, _> = c.call("volume_delete", json!({"name": format!("s{i}")})).await;
            r.unwrap_or_else(|e| panic!("delete s{i}: {e}"));
            wait_for("the volume gone", || async {
                c.get("Volume", &format!("s{i}")).await.is_err().then_some(())
            })
            .await;
            t.elapsed()
        });
    }
    let mut delete: Vec<Duration> = tasks.join_all().await;
    let delete_total = t0.elapsed();
    drop(serve);
    Row {
        label: label.to_string(),
        n,
        create: (pct(&mut create, 0.5), pct(&mut create, 0.99), create_total),
        delete: (pct(&mut delete, 0.5), pct(&mut delete, 0.99), delete_total),
        idle_secs,
        talon_cpu: cpu(talon0, talon1),
        tgtd_cpu: cpu(tgtd0, tgtd1),
        rss_mib: rss as f64 / 1024.0,
        reconciles: r1 - r0,
    }
}

fn main() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP v1_scale: needs root (tgtd)");
        return;
    }
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let n = env("V1_SCALE_VOLUMES", 1000) as usize;
    let idle = env("TALON_BENCH_IDLE_SECS", 20);
    let this = PathBuf::from(env!("CARGO_BIN_EXE_talon"));
    let mut bins = vec![("this build".to_string(), this)];
    if let Some(p) = std::env::var_os("TALON_PREVIOUS_BIN") {
        bins.push((
            format!("previous ({})", Path::new(&p).display()),
            PathBuf::from(p),
        ));
    } else {
        eprintln!("v1_scale: TALON_PREVIOUS_BIN not set: measuring this build only");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let rows: Vec<Row> = bins
        .iter()
        .map(|(label, bin)| rt.block_on(run(label, bin, n, idle)))
        .collect();
    println!(
        "| talon | volumes | create p50 | create p99 | create total | idle talon CPU | idle tgtd CPU | V1 reconciles idle | talon RSS | delete p50 | delete p99 | delete total |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.1?} | {:.1?} | {:.1?} | {:.1} % | {:.1} % | {} in {} s | {:.1} MiB | {:.1?} | {:.1?} | {:.1?} |",
            r.label,
            r.n,
            r.create.0,
            r.create.1,
            r.create.2,
            r.talon_cpu,
            r.tgtd_cpu,
            r.reconciles,
            r.idle_secs,
            r.rss_mib,
            r.delete.0,
            r.delete.1,
            r.delete.2
        );
    }
}
