//! What the scale benches (`v1_scale`, `v2_scale`) share (`#[path]`-included):
//! N API calls with [`IN_FLIGHT`] at a time timed as p50 / p99 / total, and
//! the idle window's CPU, RSS and reconciles read from `/proc` and the API.
//!
//! ```text
//!   in_flight(n, op)            -> (p50, p99, total) of op(0..n), 16 at a time
//!   idle(c, talon, target, ..)  -> talon CPU %, target CPU %, talon RSS, reconciles
//!   Run::cells()                -> | volumes | create p50 … | idle … | delete … total |
//! ```
//!
//! `benches/api.rs` reads a process's CPU and RSS with [`proc_stat`] too.

#![allow(dead_code)] // benches/api.rs uses proc_stat alone

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use talon::client::Client;

/// API calls in flight at once.
pub const IN_FLIGHT: usize = 16;

/// p50, p99 and the whole run's time.
pub type Timing = (Duration, Duration, Duration);

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

pub fn free_port() -> u16 {
    talon::runtime::testing::free_port()
}

/// (utime + stime in clock ticks, RSS in kB) of a process.
pub fn proc_stat(pid: u32) -> Option<(u64, u64)> {
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

/// Polls `f` every 20 ms until it returns a value; panics after `limit`.
pub async fn wait_for<T, F: Future<Output = Option<T>>>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> F,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < limit, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `op(0)` … `op(n - 1)`, [`IN_FLIGHT`] at a time, each timed.
pub async fn in_flight<F, Fut>(n: usize, op: F) -> Timing
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let sem = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (sem, call) = (sem.clone(), op(i));
        tasks.spawn(async move {
            let _slot = sem.acquire().await.expect("semaphore");
            let t = Instant::now();
            call.await;
            t.elapsed()
        });
    }
    let mut each: Vec<Duration> = tasks.join_all().await;
    let total = t0.elapsed();
    (pct(&mut each, 0.5), pct(&mut each, 0.99), total)
}

/// How many reconciles controller `name` has run.
async fn reconciles(c: &Client, name: &str) -> u64 {
    c.controllers()
        .await
        .ok()
        .and_then(|cs| cs.into_iter().find(|s| s.name == name))
        .map(|s| s.reconciles)
        .unwrap_or(0)
}

/// The idle window: CPU of talon and of its target in percent of one core,
/// talon's RSS at its end, and the reconciles of `controller` in it.
pub struct Idle {
    pub talon_cpu: f64,
    pub target_cpu: f64,
    pub rss_mib: f64,
    pub reconciles: u64,
}

/// Settles 3 s, then measures talon (`talon`) and its target (`target`)
/// over `secs` s of idle.
pub async fn idle(c: &Client, talon: u32, target: u32, controller: &str, secs: u64) -> Idle {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (talon0, _) = proc_stat(talon).expect("talon stat");
    let (target0, _) = proc_stat(target).expect("target stat");
    let r0 = reconciles(c, controller).await;
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (talon1, rss) = proc_stat(talon).expect("talon stat");
    let (target1, _) = proc_stat(target).expect("target stat");
    let r1 = reconciles(c, controller).await;
    let cpu = |a: u64, b: u64| (b - a) as f64 / 100.0 / secs as f64 * 100.0;
    Idle {
        talon_cpu: cpu(talon0, talon1),
        target_cpu: cpu(target0, target1),
        rss_mib: rss as f64 / 1024.0,
        reconciles: r1 - r0,
    }
}

/// One measured run: N volumes created, idle, deleted.
pub struct Run {
    pub n: usize,
    pub create: Timing,
    pub idle_secs: u64,
    pub idle: Idle,
    pub delete: Timing,
}

impl Run {
    /// The table cells from "volumes" to "delete total", with the `|` around them.
    pub fn cells(&self) -> String {
        format!(
            "| {} | {:.1?} | {:.1?} | {:.1?} | {:.1} % | {:.1} % | {} in {} s | {:.1} MiB | {:.1?} | {:.1?} | {:.1?} |",
            self.n,
            self.create.0,
            self.create.1,
            self.create.2,
            self.idle.talon_cpu,
            self.idle.target_cpu,
            self.idle.reconciles,
            self.idle_secs,
            self.idle.rss_mib,
            self.delete.0,
            self.delete.1,
            self.delete.2
        )
    }
}
