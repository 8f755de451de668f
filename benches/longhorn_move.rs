//! Moving a V2 volume's engine while it serves (issue 53), on the real control plane of
//! tests/longhorn_e2e (longhorn-manager v1.12.1, kube-apiserver, etcd, two talon nodes with real
//! spdk_tgt, `TALON_SPDK_DIR`): the driver's `moves` scenario and one table.
//!
//! ```text
//!   one volume, 2 replicas (one per node), nvmf, attached on node 1
//!   the writer (bdevperf verify, 4 KiB, QD 8, multipath)   LH_MOVE_STEADY s -> IOPS before
//!   LH_MOVES relocations by engineNodeID, node 2 and back in turn, the writer through each:
//!     the manager's switch-over (preparing, switching-over, finalizing)   -> s per phase, per move
//!     the new engine on its local replica directly again (no loopback attach; the replica's
//!       share is held 15 s after the last ask)                           -> s after the move
//!     the writer                               -> its longest I/O (the pause), IOPS, no I/O error
//!   the writer again, the engine back on node 1               -> IOPS after (the direct path back)
//! ```
//!
//! Run as root: `TALON_SPDK_DIR=/work/shared/spdk/v26.05 cargo bench --bench longhorn_move`
//! (`LH_MOVES=10`, `LH_MOVE_STEADY=10`; `LH_MOVE_TALON=<binary>` runs another talon build).
//! Both spdk_tgt busy-poll core 0 and everything else shares core 1: the phases' times are the
//! control plane's as much as talon's; the writer's longest I/O is the host's reconnect delay
//! (1 s here) when its only path is closed for a moment (see docs/replicas.md).

#[path = "../tests/support/longhorn_e2e.rs"]
mod longhorn_e2e;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use longhorn_e2e::{Driver, Guard, bench_parts, wait_bounded};
use serde_json::Value;

const NAME: &str = "longhorn_move";

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Some((spdk, longhorn, py)) = bench_parts(NAME, root, &["bdevperf"]) else {
        return;
    };
    let moves = std::env::var("LH_MOVES").unwrap_or_else(|_| "10".into());
    let talon = std::env::var_os("LH_MOVE_TALON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_talon")));
    eprintln!("{NAME}: talon {}, {moves} moves", talon.display());
    let work = tempfile::tempdir().expect("work dir");
    let _guard = Guard(work.path().to_path_buf());
    let metrics = work.path().join("metrics.json");
    let cache = root.join("target/tmp/longhorn-e2e");
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
        "moves",
        &[std::ffi::OsString::from(format!("--moves={moves}")), metrics_arg],
    );
    let bound = Duration::from_secs(900 + 120 * moves.parse::<u64>().unwrap_or(10));
    let status = wait_bounded(&mut child, t0, bound);
    let steps = std::fs::read_to_string(&out).unwrap_or_default();
    eprintln!("{steps}{status} in {:.0} s", t0.elapsed().as_secs_f64());
    if !status.success() {
        let keep = cache.join("moves.err");
        let _ = std::fs::copy(&err, &keep);
        eprintln!("the driver failed; its log is kept in {}", keep.display());
    }
    let m: Value = std::fs::read_to_string(&metrics)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    print!("{}", table(&m));
}

/// p50 and max of `xs` ("-" when empty).
fn p50_max(mut xs: Vec<f64>, digits: usize) -> String {
    if xs.is_empty() {
        return "-".into();
    }
    xs.sort_by(f64::total_cmp);
    format!(
        "{:.digits$} / {:.digits$}",
        xs[(xs.len() - 1) / 2],
        xs[xs.len() - 1]
    )
}

/// How long each switch-over state lasted in one move: from its first sighting to the next
/// state's (the volume's `switchoverState`, polled every half second by the driver).
fn phase_s(mv: &Value, state: &str) -> Option<f64> {
    let seen: Vec<(&str, f64)> = mv["phases"]
        .as_array()?
        .iter()
        .filter_map(|p| Some((p[0].as_str()?, p[1].as_f64()?)))
        .collect();
    let i = seen.iter().position(|(s, _)| *s == state)?;
    let end = seen.get(i + 1).map_or(mv["moved_s"].as_f64()?, |n| n.1);
    Some(end - seen[i].1)
}

fn table(m: &Value) -> String {
    let moves: Vec<&Value> = m["moves"].as_array().into_iter().flatten().collect();
    let each = |f: &dyn Fn(&Value) -> Option<f64>, d: usize| -> String {
        p50_max(moves.iter().filter_map(|mv| f(mv)).collect(), d)
    };
    let iops = |k: &str| m[k]["iops"].as_f64().map_or("-".into(), |x| format!("{x:.0}"));
    let rows: Vec<(String, String)> = vec![
        ("moves done".into(), moves.len().to_string()),
        (
            "move, s from the patch to one engine on the new node: p50 / max".into(),
            each(&|mv| mv["moved_s"].as_f64(), 1),
        ),
        (
            "... preparing (the new engine made), s".into(),
            each(&|mv| phase_s(mv, "preparing"), 1),
        ),
        (
            "... switching-over (the frontend's three calls), s".into(),
            each(&|mv| phase_s(mv, "switching-over"), 1),
        ),
        (
            "... finalizing (the old engine deleted; -: shorter than the 0.5 s poll), s".into(),
            each(&|mv| phase_s(mv, "finalizing"), 1),
        ),
        (
            "... then the new engine on its local replica directly again, s".into(),
            each(&|mv| mv["direct_s"].as_f64(), 1),
        ),
        (
            "writer's longest I/O during a move, ms: p50 / max".into(),
            each(&|mv| Some(mv["writer"]["max_latency_us"].as_f64()? / 1e3), 0),
        ),
        (
            "writer IOPS through a move (4 KiB verify, QD 8): p50 / max".into(),
            each(&|mv| mv["writer"]["iops"].as_f64(), 0),
        ),
        (
            "writer I/O failed or read back different, all moves".into(),
            moves
                .iter()
                .map(|mv| mv["writer"]["io_failed"].as_u64().unwrap_or(0))
                .sum::<u64>()
                .to_string(),
        ),
        (
            "steady IOPS before the first move / after the last (engine home)".into(),
            format!("{} / {}", iops("before"), iops("after")),
        ),
    ];
    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(10);
    let mut out = format!("\n| {:w$} | value |\n|{}|---:|\n", "figure", "-".repeat(w + 2));
    for (k, v) in rows {
        out += &format!("| {k:w$} | {v} |\n");
    }
    if let Some(f) = m["failed"].as_str() {
        out += &format!("\nthe run failed: {f}\n");
    }
    out
}
