//! Longhorn at node scale (issue 52), on the real control plane of tests/longhorn_e2e
//! (longhorn-manager v1.12.1, kube-apiserver, etcd, two talon nodes with real spdk_tgt,
//! `TALON_SPDK_DIR`): for each N, the driver's `scale` scenario (tests/longhorn_e2e/scale.py)
//! and one table, side by side per N.
//!
//! ```text
//!   per N:  driver.py --scenario scale --volumes N ──> metrics.json
//!     N volumes (2 replicas, 32 MiB, nvmf) created at once, each attached when its
//!       VolumeAttachment exists                     -> attached / healthy p50, p95, last
//!     idle LH_SCALE_IDLE s (60) under the manager's polling
//!                                                   -> CPU, RSS, DPDK heap, log bytes/min, calls/s
//!     a host on every engine (spdk_nvme_perf, LH_SCALE_QUEUES I/O queues, QD1)
//!                                                   -> heap per connected volume
//!     node 2's talon + spdk_tgt kill -9, started again at once
//!                                                   -> all healthy (both replicas RW) p50, p95, last
//!     all detached, deleted, nothing left           -> seconds; manager Warning events / errors
//! ```
//!
//! Run as root: `TALON_SPDK_DIR=/work/shared/spdk/v26.05 cargo bench --bench longhorn_scale`
//! (`LH_SCALE_N=10,50,100`, `LH_SCALE_IDLE=60`, `LH_SCALE_QUEUES=4`; `LH_SCALE_TALON=<binary>`
//! runs another talon, an older build for a before/after; `LH_SCALE_KEEP=<dir>` keeps each
//! run's metrics and driver log there, as `scale-<N>-<unix time>.json` and `.err`). Node 1 holds the N engines
//! and N replicas, node 2 N replicas. Both spdk_tgt busy-poll core 0 (the manager's default, no
//! interrupt mode) and everything else shares core 1: on a 2-core machine that others use too,
//! compare within one run (the load average is printed).

#[path = "../tests/support/longhorn_e2e.rs"]
mod longhorn_e2e;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use longhorn_e2e::{Driver, Guard, bench_parts, wait_bounded};
use serde_json::Value;

const NAME: &str = "longhorn_scale";

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Some((spdk, longhorn, py)) = bench_parts(NAME, root, &[]) else {
        return;
    };
    let ns: Vec<u32> = std::env::var("LH_SCALE_N")
        .unwrap_or_else(|_| "10,50,100".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let idle = std::env::var("LH_SCALE_IDLE").unwrap_or_else(|_| "60".into());
    let queues = std::env::var("LH_SCALE_QUEUES").unwrap_or_else(|_| "4".into());
    let cache = root.join("target/tmp/longhorn-e2e");
    let talon = std::env::var_os("LH_SCALE_TALON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_talon")));
    eprintln!("{NAME}: talon {}", talon.display());
    let mut runs = Vec::new();
    for &n in &ns {
        eprintln!("{NAME}: N = {n} (load average {})", load());
        let work = tempfile::tempdir().expect("work dir");
        let _guard = Guard(work.path().to_path_buf());
        let metrics = work.path().join("metrics.json");
        let t0 = Instant::now();
        let driver = Driver {
            py: &py,
            root,
            work: work.path(),
            longhorn: &longhorn,
            cache: &cache,
            spdk: &spdk,
            talon: &talon,
            s3_endpoint: "http://10.250.0.1:9000",
        };
        let (out, err) = driver.out_err();
        let mut metrics_arg = std::ffi::OsString::from("--metrics=");
        metrics_arg.push(&metrics);
        let mut child = driver.spawn(
            "scale",
            &[
                std::ffi::OsString::from(format!("--volumes={n}")),
                format!("--idle={idle}").into(),
                format!("--queues={queues}").into(),
                metrics_arg,
            ],
        );
        let bound = Duration::from_secs(900 + 30 * u64::from(n));
        let status = wait_bounded(&mut child, t0, bound);
        let steps = std::fs::read_to_string(&out).unwrap_or_default();
        eprintln!("{steps}N = {n}: {status} in {:.0} s", t0.elapsed().as_secs_f64());
        if !status.success() {
            let keep = cache.join(format!("scale-{n}.err"));
            let _ = std::fs::copy(&err, &keep);
            eprintln!(
                "N = {n}: the driver failed; its log is kept in {}",
                keep.display()
            );
        }
        let m: Value = std::fs::read_to_string(&metrics)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        if let Ok(dir) = std::env::var("LH_SCALE_KEEP") {
            // one name per run: runs at one N into one directory do not overwrite each other
            let at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let _ = std::fs::copy(&metrics, Path::new(&dir).join(format!("scale-{n}-{at}.json")));
            let _ = std::fs::copy(&err, Path::new(&dir).join(format!("scale-{n}-{at}.err")));
        }
        runs.push((n, m));
    }
    print!("{}", table(&runs));
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn f(v: &Value, digits: usize) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// One row per figure, one column per N.
fn table(runs: &[(u32, Value)]) -> String {
    type Row = (&'static str, Box<dyn Fn(u32, &Value) -> String>);
    let ph = |m: &Value, p: &str, k: &str| m["phases"][p][k].clone();
    let node = |m: &Value, i: usize, k: &str| {
        let nodes = &m["phases"]["idle"]["nodes"];
        let name = nodes
            .as_object()
            .and_then(|o| o.keys().nth(i).cloned())
            .unwrap_or_default();
        nodes[name][k].clone()
    };
    let three = move |p: &'static str, k: &'static str| {
        move |_: u32, m: &Value| {
            format!(
                "{} / {} / {}",
                f(&ph(m, p, &format!("{k}_p50")), 1),
                f(&ph(m, p, &format!("{k}_p95")), 1),
                f(&ph(m, p, &format!("{k}_last")), 1)
            )
        }
    };
    let rows: Vec<Row> = vec![
        (
            "volumes attached, s from the CRs: p50 / p95 / last",
            Box::new(three("attach", "attach")),
        ),
        (
            "... healthy (2 replicas RW): p50 / p95 / last",
            Box::new(three("attach", "healthy")),
        ),
        (
            "restart of node 2: talon + spdk_tgt back, s",
            Box::new(move |_, m| f(&ph(m, "restart", "targets_back_s"), 1)),
        ),
        (
            "... volumes seen degraded",
            Box::new(move |_, m| f(&ph(m, "restart", "degraded"), 0)),
        ),
        (
            "... all healthy again, s: p50 / p95 / last",
            Box::new(three("restart", "healthy")),
        ),
        (
            "idle talon CPU, % of a core: node 1 / node 2",
            Box::new(move |_, m| {
                format!(
                    "{} / {}",
                    f(&node(m, 0, "talon_cpu_pct"), 2),
                    f(&node(m, 1, "talon_cpu_pct"), 2)
                )
            }),
        ),
        (
            "... node 1 per 100 engines",
            Box::new(move |n, m| {
                f(
                    &node(m, 0, "talon_cpu_pct")
                        .as_f64()
                        .map(|x| x * 100.0 / f64::from(n))
                        .into(),
                    2,
                )
            }),
        ),
        (
            "idle spdk_tgt CPU, %: node 1 / node 2 (polling)",
            Box::new(move |_, m| {
                format!(
                    "{} / {}",
                    f(&node(m, 0, "spdk_cpu_pct"), 0),
                    f(&node(m, 1, "spdk_cpu_pct"), 0)
                )
            }),
        ),
        (
            "talon RSS, MiB: node 1 / node 2",
            Box::new(move |_, m| {
                format!(
                    "{} / {}",
                    f(&node(m, 0, "talon_rss_mib"), 0),
                    f(&node(m, 1, "talon_rss_mib"), 0)
                )
            }),
        ),
        (
            "spdk_tgt RSS, MiB: node 1 / node 2",
            Box::new(move |_, m| {
                format!(
                    "{} / {}",
                    f(&node(m, 0, "spdk_rss_mib"), 0),
                    f(&node(m, 1, "spdk_rss_mib"), 0)
                )
            }),
        ),
        (
            "DPDK heap in use, MiB: node 1 / node 2",
            Box::new(move |_, m| {
                format!(
                    "{} / {}",
                    f(&node(m, 0, "heap_mib"), 0),
                    f(&node(m, 1, "heap_mib"), 0)
                )
            }),
        ),
        (
            "heap with a host on every engine, MiB (node 1)",
            Box::new(move |_, m| f(&ph(m, "connected", "heap_connected_mib"), 0)),
        ),
        (
            "... per connected volume, MiB (controllers, I/O qpairs; per qpair)",
            Box::new(move |_, m| {
                format!(
                    "{} ({} ctrl, {} I/O; {})",
                    f(&ph(m, "connected", "per_volume_mib"), 2),
                    f(&ph(m, "connected", "controllers"), 0),
                    f(&ph(m, "connected", "io_qpairs"), 0),
                    f(&ph(m, "connected", "per_qpair_mib"), 2)
                )
            }),
        ),
        (
            "talon log at info, bytes/min: node 1 / node 2",
            Box::new(move |_, m| {
                format!(
                    "{} / {}",
                    f(&node(m, 0, "log_bytes_min"), 0),
                    f(&node(m, 1, "log_bytes_min"), 0)
                )
            }),
        ),
        (
            "gRPC calls received /s: node 1 / node 2",
            Box::new(move |_, m| {
                format!(
                    "{} / {}",
                    f(&node(m, 0, "calls_s"), 1),
                    f(&node(m, 1, "calls_s"), 1)
                )
            }),
        ),
        (
            "detach all / delete all, s",
            Box::new(move |_, m| {
                format!(
                    "{} / {}",
                    f(&ph(m, "delete", "detach_s"), 1),
                    f(&ph(m, "delete", "delete_s"), 1)
                )
            }),
        ),
        (
            "manager Warning events + error lines: attach/idle/restart/delete",
            Box::new(move |_, m| {
                ["attach", "idle", "restart", "delete"]
                    .iter()
                    .map(|p| {
                        m["phases"][p]["manager_errors"]
                            .as_object()
                            .map_or("-".into(), |o| {
                                o.values().filter_map(Value::as_u64).sum::<u64>().to_string()
                            })
                    })
                    .collect::<Vec<_>>()
                    .join("/")
            }),
        ),
        (
            "run failed",
            Box::new(move |_, m| {
                m["failed"]
                    .as_str()
                    .map_or("no".into(), |s| s.chars().take(40).collect())
            }),
        ),
    ];
    let mut out = format!(
        "\n| figure | {} |\n|---|{}\n",
        runs.iter()
            .map(|(n, _)| format!("N = {n}"))
            .collect::<Vec<_>>()
            .join(" | "),
        "---:|".repeat(runs.len())
    );
    for (name, cell) in &rows {
        out += &format!(
            "| {name} | {} |\n",
            runs.iter()
                .map(|(n, m)| cell(*n, m))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    out += "\nwhere the attach storm's CPU went, % of one core (processes alive at its end):\n";
    for (n, m) in runs {
        if let Some(o) = ph(m, "attach", "cpu_split").as_object() {
            let mut split: Vec<_> = o.iter().collect();
            split.sort_by(|a, b| {
                b.1.as_f64()
                    .partial_cmp(&a.1.as_f64())
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
            let split: Vec<String> = split.iter().map(|(k, v)| format!("{k} {}", f(v, 1))).collect();
            out += &format!("  N = {n}: {}\n", split.join(", "));
        }
        // talon's handler time per method in the storm, by node, the costliest first
        if let Some(nodes) = ph(m, "attach", "call_ms").as_object() {
            for (node, calls) in nodes {
                let mut calls: Vec<_> = calls.as_object().into_iter().flatten().collect();
                calls.sort_by(|a, b| {
                    b.1["sum_s"]
                        .as_f64()
                        .partial_cmp(&a.1["sum_s"].as_f64())
                        .unwrap_or(std::cmp::Ordering::Equal)
                });
                let calls: Vec<String> = calls
                    .into_iter()
                    .take(4)
                    .map(|(k, c)| {
                        format!(
                            "{k} {}x p50/p95/max {}/{}/{} ms",
                            c["n"], c["p50"], c["p95"], c["max"]
                        )
                    })
                    .collect();
                out += &format!("    {node}: {}\n", calls.join("; "));
            }
        }
    }
    out += "\nthe calls by method over the idle window (node 1):\n";
    for (n, m) in runs {
        let nodes = &m["phases"]["idle"]["nodes"];
        if let Some((_, first)) = nodes.as_object().and_then(|o| o.iter().next()) {
            let calls = first["calls"].as_object().map(|c| {
                let mut c: Vec<_> = c.iter().collect();
                c.sort_by_key(|(_, v)| std::cmp::Reverse(v.as_u64().unwrap_or(0)));
                c.into_iter()
                    .take(10)
                    .map(|(k, v)| format!("{} {}", k.rsplit('/').next().unwrap_or(k), v))
                    .collect::<Vec<_>>()
                    .join(", ")
            });
            out += &format!("  N = {n}: {}\n", calls.unwrap_or_default());
        }
        for p in ["attach", "idle", "restart", "delete"] {
            if let Some(o) = m["phases"][p]["manager_errors"]
                .as_object()
                .filter(|o| !o.is_empty())
            {
                out += &format!(
                    "  N = {n} {p}: {}\n",
                    serde_json::to_string(o).unwrap_or_default()
                );
            }
        }
    }
    out
}
