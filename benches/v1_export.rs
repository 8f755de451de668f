//! V1 export costs against a real tgtd, as the number of volumes grows: the
//! first export of a volume (target, LUN, name ACL), the re-export a reconcile
//! does for a volume already served, and one pass over tgtd's targets for
//! orphans (`V1Store::remove_orphans`). Each lists every target once
//! (`tgtadm --op show`), so each grows with the number of volumes: this is the
//! baseline for "reconcile what changed" (issue 14, V1 scale).
//!
//! ```text
//!   for n in 1..=N: V1Store::create + export(only one initiator name)   -> first export
//!   for each volume: export again (lists all targets each time)          -> re-export
//!   one listing, then each volume export_known against it (the controller) -> re-export, known
//!   remove_orphans (keeps all)                                           -> orphan pass
//! ```
//!
//! Run as root: `cargo bench --bench v1_export` (V1_EXPORT_VOLUMES=200 by default).

#[path = "support/reap.rs"]
mod reap;

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use talon::names::{Iqn, ObjectName};
use talon::tgt::{ExportOptions, InitiatorAcl, Tgtd, TgtdConfig, V1Store};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP v1_export: needs root (tgtd)");
        return;
    }
    let n: usize = std::env::var("V1_EXPORT_VOLUMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().expect("tempdir");
    // tgtd is killed on every way out, a panic too
    let _reap = reap::Reap::under(dir.path());
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let portal: SocketAddr = format!("127.0.0.1:{port}").parse().expect("portal");
    let tgtd = Tgtd::start(TgtdConfig::new(dir.path().join("run/tgtd"), portal)).expect("tgtd");
    let admin = tgtd.admin();
    let store = V1Store::new(dir.path());
    let opts = ExportOptions {
        initiators: vec![InitiatorAcl::Name(
            Iqn::parse("iqn.2025-01.io.talon:host.bench").expect("iqn"),
        )],
        chap: None,
    };
    let names: Vec<ObjectName> = (0..n)
        .map(|i| ObjectName::parse("volume", &format!("bench-{i}")).expect("name"))
        .collect();
    let mut first = Vec::new();
    let mut first_last_tenth = Vec::new();
    for (i, v) in names.iter().enumerate() {
        store.create(v, 1 << 20).expect("create");
        let t = Instant::now();
        store.export(&admin, v, &opts).expect("export");
        let d = t.elapsed();
        first.push(d);
        if i >= n - n / 10 {
            first_last_tenth.push(d);
        }
    }
    let mut again = Vec::new();
    for v in &names {
        let t = Instant::now();
        store.export(&admin, v, &opts).expect("re-export");
        again.push(t.elapsed());
    }
    // the reconcile's path now: one listing, then each volume against it
    let t = Instant::now();
    let targets = admin.show().expect("show");
    let mut known = Vec::new();
    for v in &names {
        let t = Instant::now();
        store
            .export_known(&admin, v, &opts, &targets)
            .expect("re-export against one listing");
        known.push(t.elapsed());
    }
    let known_all = t.elapsed();
    let t = Instant::now();
    let report = store.remove_orphans(&admin, |_| true).expect("orphan pass");
    let orphan_pass = t.elapsed();
    assert!(report.removed.is_empty());
    println!("V1 export costs with {n} volumes on tgtd (2 shared cores; compare ratios)");
    println!(
        "first export      p50 {:>8.2?}  p99 {:>8.2?}  (last tenth p50 {:.2?})",
        pct(&mut first.clone(), 0.5),
        pct(&mut first, 0.99),
        pct(&mut first_last_tenth, 0.5)
    );
    println!(
        "re-export (reconcile, per volume) p50 {:>8.2?}  p99 {:>8.2?}; all {n}: {:.2?}",
        pct(&mut again.clone(), 0.5),
        pct(&mut again.clone(), 0.99),
        again.iter().sum::<Duration>()
    );
    println!(
        "re-export against one listing (the controller's path): p50 {:>8.2?}  p99 {:>8.2?}; all {n} with the listing: {known_all:.2?}",
        pct(&mut known.clone(), 0.5),
        pct(&mut known, 0.99)
    );
    println!("orphan pass (one show of {n} targets): {orphan_pass:.2?}");
    tgtd.stop().expect("stop tgtd");
}
