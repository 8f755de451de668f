//! The guard every bench that starts a target holds (`#[path]`-included):
//! dropped, on every path (a panic unwinding through the bench too), it kills
//! what the bench started under its temp dir, so no spdk_tgt, tgtd or
//! talon daemon outlives the bench. A target is meant to outlive its holder
//! (talon adopts it after a restart), so nothing else stops it.
//!
//! ```text
//!   Reap::under(dir)  ── drop ──> every process whose command line or environment
//!                                 names dir (spdk_tgt -r <dir>/…/spdk.sock,
//!                                 tgtd TGT_IPC_SOCKET=<dir>/…, talon --data-dir <dir>/…)
//!                                 and every pid given with `pid`:
//!                                 SIGKILL to its process group when it leads one
//!                                 (spdk_tgt and tgtd do), else to it
//! ```

#![allow(dead_code)] // each includer uses a part

use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgid};

/// Kills, when dropped, the processes a bench started (see the module doc).
#[derive(Debug)]
pub struct Reap {
    dirs: Vec<PathBuf>,
    pids: Vec<i32>,
}

impl Reap {
    /// A guard for what runs under `dir`.
    pub fn under(dir: &Path) -> Reap {
        Reap {
            dirs: vec![dir.to_path_buf()],
            pids: Vec::new(),
        }
    }

    /// And what runs under `dir` too.
    pub fn and(mut self, dir: &Path) -> Reap {
        self.dirs.push(dir.to_path_buf());
        self
    }

    /// And process `pid` (a target whose command line names no dir of ours).
    pub fn pid(&mut self, pid: Option<i32>) {
        self.pids.extend(pid);
    }

    /// The processes to kill: the pids given, and those whose command line
    /// or environment names one of the dirs; never this process.
    pub fn matching(&self) -> Vec<i32> {
        let me = std::process::id() as i32;
        let mut out: Vec<i32> = self.pids.clone();
        let needles: Vec<Vec<u8>> = self
            .dirs
            .iter()
            .map(|d| d.as_os_str().as_encoded_bytes().to_vec())
            .collect();
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return out;
        };
        for e in procs.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if pid == me || out.contains(&pid) {
                continue;
            }
            let names = |what: &str| {
                std::fs::read(e.path().join(what)).is_ok_and(|text| {
                    needles
                        .iter()
                        .any(|n| !n.is_empty() && text.windows(n.len()).any(|w| w == n.as_slice()))
                })
            };
            if names("cmdline") || names("environ") {
                out.push(pid);
            }
        }
        out
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        let own_group = getpgid(None).ok();
        for pid in self.matching() {
            let p = Pid::from_raw(pid);
            match getpgid(Some(p)) {
                // it leads a group of its own (spdk_tgt, tgtd): the group goes
                Ok(g) if g == p && Some(g) != own_group => {
                    let _ = killpg(g, Signal::SIGKILL);
                }
                _ => {
                    let _ = kill(p, Signal::SIGKILL);
                }
            }
        }
    }
}
