//! spdk_nvme_perf over NVMe/TCP on 127.0.0.1, shared by the real-SPDK tests
//! and the V2 bench (`#[path]`-included): 4 KiB I/O at QD32 from core 1
//! (`-c 0x2`), no hugepages, against one export.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs `spdk_nvme_perf -w <workload...> -t <secs>` against subsystem `nqn`
/// on 127.0.0.1:`port`; `workload` is e.g. `randread` or `randrw -M 50`.
pub fn run(spdk: &Path, port: u16, nqn: &str, workload: &str, secs: u32) -> Output {
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
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}"
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
