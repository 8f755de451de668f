//! spdk_tgt's memory is sized from what it was seen using (issue 18): a real
//! spdk_tgt v26.05 run by `talon serve` is measured (`env_dpdk_get_mem_stats`,
//! its dump read through `/proc/<pid>/root`), the high-water mark lands in
//! `<data-dir>/spdk-memory.json`, and the `-s` of the next start comes from it
//! instead of the per-volume formula.
//!
//! ```text
//!   talon serve --engine v2 --no-huge (disk + 1 volume) ──> spdk_tgt ──5 s──> env_dpdk_get_mem_stats
//!        └──> data/spdk-memory.json {"spdk_tgt": {peakMib, volumes}} ──> sized_mem_mib(...) for the next start
//! ```

#[path = "support/serve_cmd.rs"]
mod serve_cmd;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use talon::spdk::launch::{MIB_PER_VOLUME, MemoryUse, SPDK_TGT_BASE_MIB, mem_size_mib_for, sized_mem_mib};

struct Talon(Child, PathBuf);

impl Drop for Talon {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0.id() as i32), Signal::SIGTERM);
        let _ = self.0.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.1.join("talon.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!("talon.log (newest first):\n{}", tail.join("\n"));
        }
    }
}

fn spawn(dir: &Path) -> Talon {
    let child = serve_cmd::serve(Path::new(env!("CARGO_BIN_EXE_talon")), dir, "talon.yaml")
        .args(["--engine", "v2", "--no-huge", "--no-huge-mem-mib", "1024"])
        .args(["--spdk-arg=--disable-cpumask-locks", "--stop-targets-on-exit"])
        .spawn()
        .expect("spawn talon");
    Talon(child, dir.to_path_buf())
}

#[test]
fn real_spdk_memory_use_is_measured_and_kept_for_the_next_start() {
    const TEST: &str = "real_spdk_memory_use_is_measured_and_kept_for_the_next_start";
    if std::env::var_os("TALON_SPDK_DIR").is_none() {
        eprintln!("SKIP {TEST}: TALON_SPDK_DIR not set");
        return;
    }
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {TEST}: spdk_tgt needs root");
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    std::fs::write(
        dir.join("talon.yaml"),
        format!(
            "node: {{ engine: v2, listenAddress: 127.0.0.1, nvmfPort: {port} }}\n\
             disks:\n  d1: {{ path: disks/d1.img, sizeBytes: 268435456 }}\n\
             volumes:\n  m1: {{ sizeBytes: 67108864 }}\n"
        ),
    )
    .expect("config");
    let talon = spawn(dir);
    let file = dir.join("data/spdk-memory.json");
    let start = Instant::now();
    let record: serde_json::Value = loop {
        if let Ok(text) = std::fs::read(&file) {
            let v: serde_json::Value = serde_json::from_slice(&text).expect("spdk-memory.json is JSON");
            if v["spdk_tgt"]["volumes"] == 1 {
                break v;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no measurement of spdk_tgt's memory in {}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let seen: MemoryUse = serde_json::from_value(record["spdk_tgt"].clone()).expect("MemoryUse");
    // spdk_tgt v26.05 holds ~884 MiB of its heap with nothing configured (benches/memory)
    assert!(
        (300..=1024).contains(&seen.peak_mib),
        "the heap in use is what a real spdk_tgt holds under -s 1024: {record}"
    );
    drop(talon);
    let next = sized_mem_mib(1, false, Some(&seen));
    eprintln!(
        "{TEST}: spdk_tgt seen using {} MiB with 1 volume; the next start asks -s {next} MiB \
         (floor {SPDK_TGT_BASE_MIB}, formula {}); for 100 volumes {} (formula {})",
        seen.peak_mib,
        mem_size_mib_for(1),
        sized_mem_mib(100, false, Some(&seen)),
        mem_size_mib_for(100)
    );
    assert!(next >= SPDK_TGT_BASE_MIB && next >= seen.peak_mib);
    // 100 volumes are sized from use: the peak seen, a quarter of it as margin, and each
    // volume beyond the ones measured (the formula's figure per volume), not from the formula
    let from_use = seen.peak_mib + MIB_PER_VOLUME * 99;
    let sized = sized_mem_mib(100, false, Some(&seen));
    assert!(
        (from_use..=from_use + seen.peak_mib.div_ceil(4) + MIB_PER_VOLUME).contains(&sized),
        "100 volumes are sized from use ({sized} MiB; peak {} MiB)",
        seen.peak_mib
    );
}
