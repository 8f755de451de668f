//! Cost of a namespace switch and of spawning inside namespaces, against a real
//! helper process in its own mount, net and uts namespaces (needs root).
//!
//! Criterion reports means; after it, a p50/p99 table from plain samples.

#[path = "../tests/ns_support/mod.rs"]
mod ns_support;

use std::hint::black_box;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use criterion::Criterion;
use talon::host::HostRoot;
use talon::ns::{self, Namespaces, NsCommand, Target, TargetNamespaces};

const T: Duration = Duration::from_secs(10);

fn plain_spawn() {
    let out = Command::new("true").stdin(Stdio::null()).output().expect("true");
    assert!(out.status.success());
}

fn benches(c: &mut Criterion, h: &ns_support::NsHelper, held: &TargetNamespaces) {
    let root = HostRoot::real();
    let target = Target::Pid(h.pid);
    let mut g = c.benchmark_group("ns");
    g.bench_function("run_in: open + switch + trivial closure", |b| {
        b.iter(|| ns::run_in(&root, &target, Namespaces::ALL_BUT_PID, T, || black_box(1u32)).expect("run_in"))
    });
    g.bench_function("switch + trivial closure (fds opened once)", |b| {
        b.iter(|| held.run(T, || black_box(1u32)).expect("run"))
    });
    g.bench_function("thread + trivial closure, no switch (baseline)", |b| {
        b.iter(|| std::thread::spawn(|| black_box(1u32)).join().expect("join"))
    });
    g.bench_function("spawn `true` in namespaces", |b| {
        let cmd = NsCommand::new("true");
        b.iter(|| cmd.output_in(held).expect("spawn"))
    });
    g.bench_function("spawn `true` plain", |b| b.iter(plain_spawn));
    g.finish();
}

fn percentiles(label: &str, n: usize, mut f: impl FnMut()) {
    for _ in 0..n / 10 {
        f(); // warm up
    }
    let mut samples: Vec<Duration> = (0..n)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    println!(
        "{label:<48} n={n:<5} p50={:>9.1?} p99={:>9.1?}",
        at(0.50),
        at(0.99)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !ns_support::can_run("benches/ns") {
        return;
    }
    let h = match ns_support::NsHelper::start() {
        Ok(h) => h,
        Err(e) => return eprintln!("SKIP benches/ns: cannot create namespaces here: {e}"),
    };
    let held = TargetNamespaces::open(&HostRoot::real(), &Target::Pid(h.pid), Namespaces::ALL_BUT_PID)
        .expect("open");
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c, &h, &held);
    c.final_summary();
    if args.iter().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let root = HostRoot::real();
    let target = Target::Pid(h.pid);
    println!("\nns latency percentiles (helper in its own mnt+net+uts namespaces):");
    percentiles("run_in: open + switch + trivial closure", 5000, || {
        ns::run_in(&root, &target, Namespaces::ALL_BUT_PID, T, || black_box(1u32)).expect("run_in");
    });
    percentiles("switch + trivial closure (fds opened once)", 5000, || {
        held.run(T, || black_box(1u32)).expect("run");
    });
    percentiles("thread + trivial closure, no switch", 5000, || {
        std::thread::spawn(|| black_box(1u32)).join().expect("join");
    });
    let cmd = NsCommand::new("true");
    percentiles("spawn `true` in namespaces", 1000, || {
        cmd.output_in(&held).expect("spawn");
    });
    percentiles("spawn `true` plain (std Command)", 1000, plain_spawn);
}
