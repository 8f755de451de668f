//! What runs Longhorn's real control plane around talon (`tests/longhorn_e2e/driver.py`) needs,
//! shared by tests/longhorn_e2e.rs and benches/longhorn_scale.rs (`#[path]`-included): the
//! programs it needs, the Python with the `kubernetes` client, and a guard that removes what
//! the driver's `state.json` names (network namespaces and their processes, loop devices,
//! folders) when the driver could not.

#![allow(dead_code)] // each includer uses a part

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

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
