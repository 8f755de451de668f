//! Foundation benchmarks, printed as a table (run: `cargo bench --bench api`):
//! - API round trip over the Unix socket (`node_info`): p50 / p99;
//! - runtime: 10,000 resource updates through a chain of two controllers until quiescent;
//! - daemon idle: RSS and CPU of a `talon serve` process over 30 s (`TALON_BENCH_IDLE_SECS`).

#[path = "support/reap.rs"]
mod reap;
#[path = "support/scale.rs"]
mod scale;

use std::path::Path;
use std::time::{Duration, Instant};

use scale::proc_stat;
use serde::{Deserialize, Serialize};
use talon::runtime::testing::TestRuntime;
use talon::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue, Spec};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct A {
    n: u64,
}
impl Spec for A {
    const TYPE: &'static str = "A";
    const NAMESPACE: &'static str = "config";
}
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct B {
    n: u64,
}
impl Spec for B {
    const TYPE: &'static str = "B";
    const NAMESPACE: &'static str = "engine";
}
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct C {
    n: u64,
}
impl Spec for C {
    const TYPE: &'static str = "C";
    const NAMESPACE: &'static str = "frontend";
}

macro_rules! copy_controller {
    ($name:ident, $label:literal, $in:ty, $out:ty) => {
        struct $name;
        #[async_trait::async_trait]
        impl Controller for $name {
            fn name(&self) -> &'static str {
                $label
            }
            fn inputs(&self) -> Vec<Input> {
                vec![Input::of::<$in>()]
            }
            fn outputs(&self) -> Vec<Output> {
                vec![Output::exclusive::<$out>()]
            }
            async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
                for r in ctx.list::<$in>()? {
                    ctx.apply(r.id(), <$out>::from_n(r.spec.n))?;
                }
                Ok(Requeue::OnInputChange)
            }
        }
    };
}
impl B {
    fn from_n(n: u64) -> Self {
        Self { n }
    }
}
impl C {
    fn from_n(n: u64) -> Self {
        Self { n }
    }
}
copy_controller!(AtoB, "bench.AtoBController", A, B);
copy_controller!(BtoC, "bench.BtoCController", B, C);

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn api_round_trip() -> (Duration, Duration, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = talon::serve::ServeOptions {
        data_dir: dir.path().join("data"),
        config: None,
        socket: dir.path().join("talon.sock"),
        listen_tcp: None,
        token_file: None,
        tls: Default::default(),
        run_dir: dir.path().join("run"),
        host_root: "/".into(),
        spdk: Default::default(),
        stop_targets_on_exit: true,
        set_aside_orphan_data: false,
    };
    let socket = opts.socket.clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(talon::serve::serve(opts, async move {
        let _ = rx.await;
    }));
    let client = loop {
        if let Ok(c) = talon::client::Client::connect_unix(&socket).await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    for _ in 0..200 {
        client.node_info().await.expect("warm-up");
    }
    let n = 5000;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        client.node_info().await.expect("node_info");
        lat.push(t.elapsed());
    }
    lat.sort();
    let _ = tx.send(());
    let _ = task.await;
    (pct(&lat, 0.5), pct(&lat, 0.99), n)
}

async fn runtime_chain() -> Duration {
    let rt = TestRuntime::start(|rt| {
        rt.register(AtoB)?;
        rt.register(BtoC)
    })
    .expect("runtime");
    let st = rt.state.clone();
    let ids = 100u64;
    for i in 0..ids {
        st.create_typed(&format!("r{i}"), "", &A { n: 0 })
            .expect("create");
    }
    let t = Instant::now();
    let updates = 10_000u64;
    for u in 1..=updates / ids {
        for i in 0..ids {
            st.update_typed(&format!("r{i}"), "", None, &A { n: u })
                .expect("update");
        }
    }
    let last = updates / ids;
    loop {
        let cs = st.list_typed::<C>().expect("list");
        if cs.len() as u64 == ids && cs.iter().all(|c| c.spec.n == last) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let el = t.elapsed();
    rt.stop().await;
    el
}

fn idle(secs: u64) -> Option<(f64, f64)> {
    let exe = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/talon");
    let exe = if exe.exists() {
        exe
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug/talon")
    };
    if !exe.exists() {
        return None;
    }
    let dir = tempfile::tempdir().ok()?;
    // the daemon is killed on every way out, a panic too
    let _reap = reap::Reap::under(dir.path());
    let mut child = std::process::Command::new(&exe)
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_secs(2));
    let (t0, _) = proc_stat(child.id())?;
    std::thread::sleep(Duration::from_secs(secs));
    let (t1, rss) = proc_stat(child.id())?;
    let _ = child.kill();
    let _ = child.wait();
    let hz = 100.0;
    Some((rss as f64 / 1024.0, (t1 - t0) as f64 / hz / secs as f64 * 100.0))
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let (p50, p99, n) = rt.block_on(api_round_trip());
    let chain = rt.block_on(runtime_chain());
    let secs = std::env::var("TALON_BENCH_IDLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let idle = idle(secs);
    println!("| benchmark | result | aim |");
    println!("|---|---|---|");
    println!("| API round trip node_info over UDS ({n} calls) | p50 {p50:?}, p99 {p99:?} | p50 < 200 µs |");
    println!("| 10,000 updates through 2 controllers until quiescent | {chain:?} | < 1 s |");
    match idle {
        Some((rss, cpu)) => {
            println!("| daemon idle {secs} s | RSS {rss:.1} MiB, CPU {cpu:.2} % | < 30 MB, ~0 % |")
        }
        None => println!("| daemon idle | skipped: build the talon binary first | |"),
    }
}
