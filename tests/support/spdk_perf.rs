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
    command(spdk, port, nqn, workload, secs, hostnqn)
        .output()
        .expect("spdk_nvme_perf")
}

fn command(spdk: &Path, port: u16, nqn: &str, workload: &str, secs: u32, hostnqn: &str) -> Command {
    let mut cmd = Command::new(spdk.join("build/bin/spdk_nvme_perf"));
    cmd.args([
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
    .stdin(Stdio::null());
    cmd
}

/// spdk_nvme_perf as in [`run`], running in the background for up to `secs`
/// seconds, that the test stops as soon as it has done what it wrote for
/// ([`Writer::stop`]) instead of waiting out a duration sized for a slow
/// machine.
#[allow(dead_code)] // not every includer starts one
pub struct Writer {
    pid: nix::unistd::Pid,
    out: std::thread::JoinHandle<Output>,
}

#[allow(dead_code)]
impl Writer {
    /// Starts it.
    pub fn start(spdk: &Path, port: u16, nqn: &str, workload: &str, secs: u32) -> Self {
        let child = command(spdk, port, nqn, workload, secs, HOST_NQN)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn spdk_nvme_perf");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        // its output drained all along (a full pipe would stall the writer)
        let out = std::thread::spawn(move || child.wait_with_output().expect("spdk_nvme_perf"));
        Self { pid, out }
    }

    /// It ended by itself (its `secs` ran out, or it failed).
    pub fn is_finished(&self) -> bool {
        self.out.is_finished()
    }

    /// Stops it as Ctrl-C does (SIGINT: spdk_nvme_perf ends its I/O and
    /// prints its report, the `Total` line with it) and returns its output.
    pub fn stop(self) -> Output {
        if !self.out.is_finished() {
            // it may end between the look and the signal: then there is no one to signal
            let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGINT);
        }
        self.out.join().expect("perf thread")
    }
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
