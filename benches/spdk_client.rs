//! Pipelined vs sequential SPDK JSON-RPC calls (`spdk_get_version`) on one
//! connection: against the `SpdkDouble` always, and against a real spdk_tgt
//! (`--no-huge -s 1024 -m 0x1`) when `TALON_SPDK_DIR` is set. Each iteration
//! makes 100 calls, so the time per iteration / 100 is the cost per call.
//!
//! ```text
//!  sequential: call → answer → call → answer ...   (one round trip each)
//!  pipelined:  100 calls written at once, answers routed by id
//! ```

#[path = "support/reap.rs"]
mod reap;

use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use talon::spdk::target::{Memory, Target, TargetConfig};
use talon::spdk::{SpdkClient, SpdkDouble};

const CALLS: usize = 100;

async fn sequential(c: &SpdkClient) {
    for _ in 0..CALLS {
        c.spdk_get_version().await.expect("version");
    }
}

async fn pipelined(c: &SpdkClient) {
    let all = futures::future::join_all((0..CALLS).map(|_| c.spdk_get_version())).await;
    assert!(all.iter().all(Result::is_ok));
}

fn bench_target(cr: &mut Criterion, rt: &tokio::runtime::Runtime, name: &str, client: &SpdkClient) {
    let mut g = cr.benchmark_group(format!("spdk_client/{name}"));
    g.sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .warm_up_time(Duration::from_secs(1));
    g.bench_function(format!("sequential_{CALLS}"), |b| {
        b.to_async(rt).iter(|| sequential(client))
    });
    g.bench_function(format!("pipelined_{CALLS}"), |b| {
        b.to_async(rt).iter(|| pipelined(client))
    });
    g.finish();
}

fn benches(cr: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    // the target is killed on every way out, a panic too
    let _reap = reap::Reap::under(dir.path());

    let double = rt
        .block_on(SpdkDouble::start(dir.path().join("double.sock")))
        .expect("double");
    let client = SpdkClient::new(double.socket());
    bench_target(cr, &rt, "double", &client);

    let Some(spdk_dir) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP spdk_client/spdk_tgt: TALON_SPDK_DIR is not set");
        return;
    };
    let mut cfg = TargetConfig::new(dir.path().join("real"));
    cfg.spdk_dir = Some(spdk_dir);
    cfg.memory = Memory::NoHuge { mem_size_mib: 1024 };
    let target = match rt.block_on(Target::start(&cfg)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("SKIP spdk_client/spdk_tgt: {e}");
            return;
        }
    };
    let client = target.client().clone();
    bench_target(cr, &rt, "spdk_tgt", &client);
    let _ = rt.block_on(target.stop(Duration::from_secs(10)));
}

criterion_group!(spdk, benches);
criterion_main!(spdk);
