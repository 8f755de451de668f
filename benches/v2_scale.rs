//! V2 at scale, through a real `talon serve --engine v2` and a real spdk_tgt
//! (`TALON_SPDK_DIR`, v26.05, started `--no-huge -s V2_SCALE_MEM_MIB`: no
//! hugepages on the test machines): create N volumes (1,000 by default, one
//! replica each, thin lvols on one file-backed aio lvstore) with 16 requests in
//! flight, idle with them all served, delete them all, and print a table.
//!
//! ```text
//!   talon serve --engine v2 ── spdk_tgt --no-huge -s M (core 0) ── lvstore on <dir>/disks/d1.img
//!     volume_create {wait: true} × N, 16 in flight     -> create p50 / p99 / total
//!     idle TALON_BENCH_IDLE_SECS (20) s                 -> talon CPU, spdk_tgt CPU, talon RSS,
//!                                                          V2 reconciles in the window
//!     volume_delete × N, 16 in flight, until gone       -> delete p50 / p99 / total
//! ```
//!
//! Run as root: `TALON_SPDK_DIR=/opt/spdk cargo bench --bench v2_scale`
//! (`V2_SCALE_VOLUMES=1000`, `V2_SCALE_MEM_MIB=2048`, `V2_SCALE_DISK_DIR` for the
//! disk file, default a temp dir; `V2_SCALE_INTERRUPT=1` runs spdk_tgt in
//! interrupt mode, else it polls and uses a core whatever the load).

#[path = "support/reap.rs"]
mod reap;
#[path = "support/scale.rs"]
mod scale;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use scale::{Run, free_port, idle, in_flight, wait_for};
use serde_json::{Value, json};
use talon::client::Client;

const VOLUME_BYTES: u64 = 16 << 20;

/// The daemon; dropped: SIGTERM (`--stop-targets-on-exit` stops spdk_tgt
/// too), then SIGKILL of spdk_tgt should it still run.
struct Serve {
    child: Child,
    spdk_pid: Option<u32>,
    /// Then whatever is left under the dirs (a talon deaf to SIGTERM, a
    /// spdk_tgt it started before its pid was known).
    _reap: reap::Reap,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
        if let Some(p) = self.spdk_pid {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

struct Opts {
    spdk_dir: PathBuf,
    n: usize,
    idle_secs: u64,
    mem_mib: u64,
    disk_dir: Option<PathBuf>,
    interrupt: bool,
}

async fn run(program: &Path, o: &Opts) -> Run {
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().to_path_buf();
    let disk_dir = o.disk_dir.clone().unwrap_or_else(|| dir.join("disks"));
    std::fs::create_dir_all(&disk_dir).expect("disk dir");
    let disk = disk_dir.join(format!("v2-scale-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&disk);
    // thin lvols: the file is sparse, the lvstore holds N volumes' metadata
    let disk_bytes = ((o.n as u64 * VOLUME_BYTES).max(1 << 30) + (1 << 30)) & !((1 << 20) - 1);
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v2, listenAddress: 127.0.0.1, nvmfPort: {} }}\n\
             disks:\n  d1:\n    path: {}\n    sizeBytes: {disk_bytes}\n",
            free_port(),
            disk.display()
        ),
    )
    .expect("config");
    let log = std::fs::File::create(dir.join("talon.log")).expect("log");
    let mut cmd = Command::new(program);
    cmd.arg("--socket")
        .arg(dir.join("run/talon.sock"))
        .args(["serve", "--engine", "v2", "--stop-targets-on-exit", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--run-dir")
        .arg(dir.join("data/run"))
        .arg("--config")
        .arg(dir.join("talon.yaml"))
        .arg("--spdk-tgt")
        .arg(o.spdk_dir.join("build/bin/spdk_tgt"))
        .args(["--no-huge", "--no-huge-mem-mib", &o.mem_mib.to_string()])
        .arg("--spdk-arg=--disable-cpumask-locks")
        .env("TALON_SPDK_DIR", &o.spdk_dir)
        .stdout(Stdio::null())
        .stderr(log);
    if o.interrupt {
        cmd.arg("--interrupt-mode");
    }
    let child = cmd.spawn().expect("spawn talon");
    let mut serve = Serve {
        child,
        spdk_pid: None,
        _reap: reap::Reap::under(&dir),
    };
    let socket = dir.join("run/talon.sock");
    let c = Arc::new(
        wait_for("the API", Duration::from_secs(60), || async {
            Client::connect_unix(&socket).await.ok()
        })
        .await,
    );
    let spdk_pid = wait_for("spdk_tgt ready", Duration::from_secs(120), || async {
        let t = c.get("TargetStatus", "spdk").await.ok()?.spec;
        (t["state"] == "ready").then(|| t["pid"].as_u64()).flatten()
    })
    .await as u32;
    serve.spdk_pid = Some(spdk_pid);
    wait_for("disk d1 ready", Duration::from_secs(120), || async {
        let r = c.get("DiskStatus", "d1").await.ok()?;
        (r.spec["state"] == "ready").then_some(())
    })
    .await;
    let create = in_flight(o.n, |i| {
        let c = c.clone();
        async move {
            let r: Result<Value, _> = c
                .call(
                    "volume_create",
                    json!({"name": format!("s{i}"), "sizeBytes": VOLUME_BYTES, "engine": "v2",
                       "replicas": 1, "wait": true, "timeoutSeconds": 3600}),
                )
                .await;
            r.unwrap_or_else(|e| panic!("create s{i}: {e}"));
        }
    })
    .await;
    eprintln!("v2_scale: {} volumes created in {:.1?}", o.n, create.2);

    let idle = idle(
        &c,
        serve.child.id(),
        spdk_pid,
        "engine.SpdkVolumeController",
        o.idle_secs,
    )
    .await;

    let delete = in_flight(o.n, |i| {
        let c = c.clone();
        async move {
            let r: Result<Value, _> = c.call("volume_delete", json!({"name": format!("s{i}")})).await;
            r.unwrap_or_else(|e| panic!("delete s{i}: {e}"));
            wait_for("the volume gone", Duration::from_secs(3600), || async {
                c.get("Volume", &format!("s{i}")).await.is_err().then_some(())
            })
            .await;
        }
    })
    .await;
    drop(serve);
    let _ = std::fs::remove_file(&disk);
    Run {
        n: o.n,
        create,
        idle_secs: o.idle_secs,
        idle,
        delete,
    }
}

fn main() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP v2_scale: needs root (spdk_tgt, its file keyring and sockets)");
        return;
    }
    let Some(spdk_dir) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP v2_scale: TALON_SPDK_DIR not set");
        return;
    };
    if !spdk_dir.join("build/bin/spdk_tgt").exists() {
        eprintln!(
            "SKIP v2_scale: no build/bin/spdk_tgt under {}",
            spdk_dir.display()
        );
        return;
    }
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let o = Opts {
        spdk_dir,
        n: env("V2_SCALE_VOLUMES", 1000) as usize,
        idle_secs: env("TALON_BENCH_IDLE_SECS", 20),
        mem_mib: env("V2_SCALE_MEM_MIB", 2048),
        disk_dir: std::env::var_os("V2_SCALE_DISK_DIR").map(PathBuf::from),
        interrupt: env("V2_SCALE_INTERRUPT", 0) == 1,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let r = rt.block_on(run(Path::new(env!("CARGO_BIN_EXE_talon")), &o));
    println!(
        "| volumes | create p50 | create p99 | create total | idle talon CPU | idle spdk_tgt CPU ({}) | V2 reconciles idle | talon RSS | delete p50 | delete p99 | delete total |",
        if o.interrupt { "interrupt mode" } else { "polling" }
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    println!("{}", r.cells());
}
