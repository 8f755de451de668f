//! What runs Longhorn's real control plane around talon (`tests/longhorn_e2e/driver.py`) needs,
//! shared by tests/longhorn_e2e.rs and benches/longhorn_{scale,move}.rs (`#[path]`-included):
//! the programs it needs, the Python with the `kubernetes` client, the driver started with the
//! arguments every scenario takes and waited for within a bound, and a guard that removes what
//! the driver's `state.json` names (network namespaces and their processes, loop devices,
//! folders) when the driver could not.

#![allow(dead_code)] // each includer uses a part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const PROGRAMS: &[&str] = &[
    "etcd", "ip", "losetup", "unshare", "chroot", "nsenter", "openssl", "nc", "pgrep", "iscsiadm",
];

pub fn skip(test: &str, reason: impl std::fmt::Display) {
    eprintln!("SKIP {test}: {reason}");
}

pub fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false)
}

/// The Python with the `kubernetes` client: run-all's venv, else the one on PATH.
pub fn python(root: &Path) -> Option<PathBuf> {
    let venv = root.join("target/test-venv/bin/python3");
    [venv, PathBuf::from("python3")].into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import kubernetes, yaml"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// What a benchmark on the control plane needs (root, `TALON_SPDK_DIR` with `tools` in its
/// `build/bin`, Longhorn's files beside the checkout, the programs, the Python), or `None`
/// after saying `SKIP <name>: why`. Returns (SPDK's dir, Longhorn's dir, the Python).
pub fn bench_parts(name: &str, root: &Path, tools: &[&str]) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let why = if !nix::unistd::geteuid().is_root() {
        "not root (network namespaces, loop devices)".to_owned()
    } else if let Some(spdk) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) {
        let longhorn = root.join("../shared/longhorn/v1.12.1");
        if let Some(t) = tools.iter().find(|t| !spdk.join("build/bin").join(t).is_file()) {
            format!("no build/bin/{t} under {}", spdk.display())
        } else if !longhorn.join("longhorn-manager.xz").is_file() {
            format!("no {} (Longhorn's control plane)", longhorn.display())
        } else if let Some(p) = PROGRAMS.iter().find(|p| !on_path(p)) {
            format!("no `{p}` on PATH (tests/apt-packages.txt)")
        } else if let Some(py) = python(root) {
            return Some((spdk, longhorn, py));
        } else {
            "no Python with the kubernetes client (tests/pip-packages.txt)".to_owned()
        }
    } else {
        "TALON_SPDK_DIR not set".to_owned()
    };
    eprintln!("SKIP {name}: {why}");
    None
}

/// What every run of `tests/longhorn_e2e/driver.py` is given.
#[derive(Debug)]
pub struct Driver<'a> {
    /// The Python with the `kubernetes` client ([`python`]).
    pub py: &'a Path,
    /// The checkout.
    pub root: &'a Path,
    /// The run's work dir (its `driver.out` and `driver.err` go there).
    pub work: &'a Path,
    /// Longhorn's control plane (`../shared/longhorn/v1.12.1`).
    pub longhorn: &'a Path,
    /// Where unpacked binaries are kept between runs.
    pub cache: &'a Path,
    /// `TALON_SPDK_DIR`.
    pub spdk: &'a Path,
    /// The talon binary the nodes run.
    pub talon: &'a Path,
    /// The S3 endpoint of the backup steps.
    pub s3_endpoint: &'a str,
}

impl Driver<'_> {
    /// The driver's stdout (`STEP` lines) and stderr (its log).
    pub fn out_err(&self) -> (PathBuf, PathBuf) {
        (self.work.join("driver.out"), self.work.join("driver.err"))
    }

    /// Starts the driver on `scenario` with `extra` arguments after the common ones.
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(&self, scenario: &str, extra: &[S]) -> Child {
        let (out, err) = self.out_err();
        Command::new(self.py)
            .arg(self.root.join("tests/longhorn_e2e/driver.py"))
            .args(["--scenario", scenario])
            .arg("--work")
            .arg(self.work)
            .arg("--longhorn")
            .arg(self.longhorn.canonicalize().expect("longhorn dir"))
            .arg("--cache")
            .arg(self.cache)
            .arg("--spdk")
            .arg(self.spdk)
            .arg("--talon")
            .arg(self.talon)
            .args(["--s3-endpoint", self.s3_endpoint])
            .args(extra)
            .current_dir(self.root.join("tests/longhorn_e2e"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(out).expect("driver.out"))
            .stderr(std::fs::File::create(err).expect("driver.err"))
            .spawn()
            .expect("driver.py")
    }
}

/// Waits for the driver until `bound` after `t0`; past it, SIGTERM (the driver cleans up),
/// up to 90 s more, then SIGKILL (and the [`Guard`] cleans up).
pub fn wait_bounded(child: &mut Child, t0: Instant, bound: Duration) -> ExitStatus {
    loop {
        if let Some(s) = child.try_wait().expect("driver") {
            return s;
        }
        if t0.elapsed() > bound {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let end = Instant::now() + Duration::from_secs(90);
            while Instant::now() < end && child.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(200));
            }
            let _ = child.kill();
            return child.wait().expect("driver");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Removes what the driver's `state.json` names when the driver did not: every process
/// left in its network namespace, the namespace, its loop devices.
pub struct Guard(pub PathBuf);

impl Drop for Guard {
    fn drop(&mut self) {
        let Ok(text) = std::fs::read_to_string(self.0.join("state.json")) else {
            return;
        };
        let Ok(state) = serde_json::from_str::<serde_json::Value>(&text) else {
            return;
        };
        let netns: Vec<&str> = state["netns"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str())
            .collect();
        for ns in &netns {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        for ns in netns.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        // folders the harness made outside its work dir (the engine image's binaries), newest first
        let made: Vec<&str> = state["made"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d.as_str())
            .collect();
        for d in made.iter().rev() {
            let _ = std::fs::remove_dir_all(d);
        }
        for dev in state["loops"].as_array().into_iter().flatten() {
            if let Some(dev) = dev.as_str() {
                let _ = Command::new("losetup").args(["-d", dev]).status();
            }
        }
    }
}
