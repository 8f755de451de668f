//! spdk_nvme_perf over NVMe/TCP on 127.0.0.1, shared by the real-SPDK tests
//! and the V2 bench (`#[path]`-included): 4 KiB I/O at QD32 from core 1
//! (`-c 0x2`), no hugepages, against one export.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The host NQN the tests' and benches' initiators connect with; exports
/// allow only the hosts they name, so the tests name this one.
#[allow(dead_code)] // not every includer names it
pub const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:5d0c7c8e-2f6b-4f6e-9a51-7c1c2b0e4a10";

/// Runs `spdk_nvme_perf -w <workload...> -t <secs>` against subsystem `nqn`
/// on 127.0.0.1:`port` as host [`HOST_NQN`]; `workload` is e.g. `randread`
/// or `randrw -M 50`.
pub fn run(spdk: &Path, port: u16, nqn: &str, workload: &str, secs: u32) -> Output {
    run_as(spdk, port, nqn, workload, secs, HOST_NQN)
}

/// [`run`] as host `hostnqn`.
pub fn run_as(spdk: &Path, port: u16, nqn: &str, workload: &str, secs: u32, hostnqn: &str) -> Output {
    Command::new(spdk.join("build/bin/spdk_nvme_perf"))
        .args([
            "--no-huge",
            "-s",
            "512",
            "-c",
            "0x2",
            "-q",
            "32",
            "-o",
            "4096",
            "-w",
        ])
        .args(workload.split_whitespace())
        .args(["-t", &secs.to_string()])
        .arg("-r")
        .arg(format!(
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn} hostnqn:{hostnqn}"
        ))
        .stdin(Stdio::null())
        .output()
        .expect("spdk_nvme_perf")
}

/// Runs it and asserts it succeeded; returns its report.
#[allow(dead_code)] // the bench reads the total without asserting
pub fn report(spdk: &Path, port: u16, nqn: &str, workload: &str, secs: u32) -> String {
    let out = run(spdk, port, nqn, workload, secs);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "spdk_nvme_perf failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// IOPS from the report's "Total" line (0 without one).
pub fn total_iops(report: &str) -> f64 {
    report
        .lines()
        .find(|l| l.trim_start().starts_with("Total"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
