//! What the tests against a real spdk_tgt (`TALON_SPDK_DIR`) share
//! (`#[path]`-included): where SPDK is (or a `SKIP` line when it is not), a
//! target config for a host without hugepages, a guard that kills a spawned
//! spdk_tgt when a test ends early, and a free TCP port on 127.0.0.1.

#![allow(dead_code)] // each includer uses a part

use std::path::{Path, PathBuf};

use talon::spdk::target::{Memory, TargetConfig};

/// The SPDK tree at `TALON_SPDK_DIR` with a built spdk_tgt; `None` after
/// printing `SKIP <test>: <reason>` when there is none.
pub fn spdk_dir(test: &str) -> Option<PathBuf> {
    spdk_dir_with(test, &[])
}

/// [`spdk_dir`] that also needs each of `tools` under `build/bin`.
pub fn spdk_dir_with(test: &str, tools: &[&str]) -> Option<PathBuf> {
    let Some(d) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP {test}: TALON_SPDK_DIR not set");
        return None;
    };
    for tool in std::iter::once(&"spdk_tgt").chain(tools) {
        if !d.join("build/bin").join(tool).exists() {
            eprintln!("SKIP {test}: no build/bin/{tool} under {}", d.display());
            return None;
        }
    }
    Some(d)
}

/// Kills a spawned spdk_tgt when a test ends early (a failed assert): a
/// Target is meant to outlive its holder (talon adopts it after a restart).
/// A test that panics also gets the end of the target's log on stderr: what
/// spdk_tgt said last is often why an RPC timed out or the socket closed.
pub struct Reaper {
    pid: Option<i32>,
    log: PathBuf,
}

impl Reaper {
    /// The guard of `t`, started from `cfg`.
    pub fn new(t: &talon::spdk::target::Target, cfg: &TargetConfig) -> Reaper {
        Reaper {
            pid: t.pid(),
            log: cfg.log_path(),
        }
    }
}

/// Lines of a target's log a failed test prints, each as a `why: ` line
/// (tests/summary.py repeats those in the test summary, which is what a
/// cut CI log still shows).
const LOG_TAIL: usize = 30;

impl Drop for Reaper {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!(
                "--- the last {} lines of {} (pid {:?}) ---",
                LOG_TAIL.min(lines.len()),
                self.log.display(),
                self.pid
            );
            for l in &lines[lines.len().saturating_sub(LOG_TAIL)..] {
                eprintln!("why: spdk_tgt: {l}");
            }
        }
        if let Some(pid) = self.pid {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// A port for a listener, from this process's reserved block below the
/// ephemeral range (`runtime::testing::free_port`).
pub fn free_port() -> u16 {
    talon::runtime::testing::free_port()
}

/// A spdk_tgt with its run directory (socket, log) at `run`: `mem_size_mib`
/// of ordinary memory (the host has no hugepages), core 0, no cpumask locks
/// (several targets run at once).
pub fn target_cfg(run: &Path, spdk: &Path, mem_size_mib: u64) -> TargetConfig {
    let mut cfg = TargetConfig::new(run.to_path_buf());
    cfg.spdk_dir = Some(spdk.to_path_buf());
    cfg.memory = Memory::NoHuge { mem_size_mib };
    cfg.cpumask = "0x1".into();
    cfg.extra_args = vec!["--disable-cpumask-locks".into()];
    cfg
}

/// [`spdk_dir`] for a test that must run as root: SPDK's file keyring wants
/// key files owned by spdk_tgt's uid, and talon runs as root.
pub fn spdk_dir_as_root(test: &str) -> Option<PathBuf> {
    let d = spdk_dir(test)?;
    if nix::unistd::geteuid().as_raw() != 0 {
        eprintln!("SKIP {test}: not root");
        return None;
    }
    Some(d)
}

/// `len` bytes of a xorshift stream from `seed`: what a test writes and
/// checks it reads back (no two seeds alike, no long run of zeros).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A sparse file of `len` bytes at `path` as aio bdev `bdev` (4 KiB blocks), with lvstore `lvs`
/// (1 MiB clusters, no clearing) on it: the disk a real-SPDK test or bench works on.
#[allow(dead_code)] // not every includer makes one
pub async fn aio_lvstore(c: &talon::spdk::SpdkClient, path: &Path, len: u64, bdev: &str, lvs: &str) {
    use talon::spdk::rpc::{AioCreate, LvstoreCreate};
    std::fs::File::create(path)
        .and_then(|f| f.set_len(len))
        .expect("disk file");
    c.bdev_aio_create(&AioCreate {
        filename: path.display().to_string(),
        name: bdev.into(),
        block_size: Some(4096),
        readonly: false,
        fallocate: false,
    })
    .await
    .expect("aio");
    c.bdev_lvol_create_lvstore(&LvstoreCreate {
        bdev_name: bdev.into(),
        lvs_name: lvs.into(),
        cluster_sz: Some(1 << 20),
        clear_method: Some("none".into()),
        num_md_pages_per_cluster_ratio: None,
    })
    .await
    .expect("lvstore");
}
