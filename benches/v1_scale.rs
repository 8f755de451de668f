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

#[path = "support/reap.rs"]
mod reap;
#[path = "support/scale.rs"]
mod scale;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use scale::{Run, free_port, idle, in_flight};
use serde_json::{Value, json};
use talon::client::Client;

/// How long one wait of the run may take.
const LIMIT: Duration = Duration::from_secs(300);

struct Serve {
    child: Child,
    dir: PathBuf,
    /// Then whatever is left under the dir (a talon deaf to SIGTERM, its tgtd).
    _reap: reap::Reap,
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

async fn run(program: &Path, n: usize, idle_secs: u64) -> Run {
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
        _reap: reap::Reap::under(&dir),
    };
    let socket = dir.join("run/talon.sock");
    let c = Arc::new(
        scale::wait_for("the API", LIMIT, || async {
            Client::connect_unix(&socket).await.ok()
        })
        .await,
    );
    c.node_info().await.expect("node_info");
    let create = in_flight(n, |i| {
        let c = c.clone();
        async move {
            let r: Result<Value, _> = c
                .call(
                    "volume_create",
                    json!({"name": format!("s{i}"), "sizeBytes": 1 << 20, "engine": "v1", "wait": true}),
                )
                .await;
            r.unwrap_or_else(|e| panic!("create s{i}: {e}"));
        }
    })
    .await;

    // tgtd runs while V1 volumes exist
    let tgtd_pid = scale::wait_for("tgtd ready", LIMIT, || async {
        let t = c.get("TargetStatus", "tgtd").await.ok()?.spec;
        (t["state"] == "ready").then(|| t["pid"].as_u64()).flatten()
    })
    .await as u32;
    let idle = idle(
        &c,
        serve.child.id(),
        tgtd_pid,
        "engine.V1VolumeController",
        idle_secs,
    )
    .await;

    let delete = in_flight(n, |i| {
        let c = c.clone();
        async move {
            let r: Result<Value, _> = c.call("volume_delete", json!({"name": format!("s{i}")})).await;
            r.unwrap_or_else(|e| panic!("delete s{i}: {e}"));
            scale::wait_for("the volume gone", LIMIT, || async {
                c.get("Volume", &format!("s{i}")).await.is_err().then_some(())
            })
            .await;
        }
    })
    .await;
    drop(serve);
    Run {
        n,
        create,
        idle_secs,
        idle,
        delete,
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
    let rows: Vec<(&String, Run)> = bins
        .iter()
        .map(|(label, bin)| (label, rt.block_on(run(bin, n, idle))))
        .collect();
    println!(
        "| talon | volumes | create p50 | create p99 | create total | idle talon CPU | idle tgtd CPU | V1 reconciles idle | talon RSS | delete p50 | delete p99 | delete total |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (label, r) in rows {
        println!("| {label} {}", r.cells());
    }
}
