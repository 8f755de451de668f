//! `--interrupt-mode` serves V2 volumes with nvmf_tgt (real SPDK): spdk_tgt's
//! iSCSI poll group busy-polls even in interrupt mode (benches/interrupt/), so
//! talon runs the nvmf_tgt beside it; a volume is exported over NVMe/TCP and
//! spdk_nvme_perf reads and writes it.
//!
//! ```text
//!   talon serve --interrupt-mode (TALON_SPDK_DIR) ──spawn──> nvmf_tgt --interrupt-mode ──NVMe/TCP──> spdk_nvme_perf
//! ```

#[path = "support/serve_daemon.rs"]
mod serve_daemon;
#[path = "support/spdk_perf.rs"]
mod spdk_perf;

use std::path::PathBuf;
use std::time::Duration;

use serve_daemon::{opts_with_config, real_spdk, start};
use talon::controllers::engine::selection::SpdkOptions;
use talon::runtime::testing::eventually;

/// The host NQN spdk_nvme_perf connects with (tests/support/spdk_perf.rs): the
/// V2 export admits it through `allowedHosts` (by default only the host a
/// volume is attached to may connect).
const HOST: &str = spdk_perf::HOST_NQN;

/// A port for a listener, from this process's reserved block below the
/// ephemeral range (`runtime::testing::free_port`).
fn free_port() -> u16 {
    talon::runtime::testing::free_port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_interrupt_mode_serves_with_nvmf_tgt() {
    const TEST: &str = "real_spdk_interrupt_mode_serves_with_nvmf_tgt";
    let Some(spdk) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP {TEST}: TALON_SPDK_DIR not set");
        return;
    };
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {TEST}: SPDK needs root");
        return;
    }
    if !spdk.join("build/bin/nvmf_tgt").is_file() {
        eprintln!("SKIP {TEST}: no nvmf_tgt in {}", spdk.display());
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let yaml = format!(
        "node: {{ engine: v2, listenAddress: 127.0.0.1, nvmfPort: {port}, allowedHosts: [\"{HOST}\"] }}\n\
             disks:\n  d1: {{ path: disks/d1.img, sizeBytes: 268435456 }}\n\
             volumes:\n  quiet: {{ sizeBytes: 67108864 }}\n"
    );
    let spdk_opts = SpdkOptions {
        interrupt_mode: true,
        ..real_spdk(&spdk, 1024)
    };
    let d = start(opts_with_config(dir.path(), spdk_opts, &yaml)).await;
    let c = &d.client;
    let nqn = eventually("EngineStatus quiet ready", Duration::from_secs(120), || async {
        let e = c.get("EngineStatus", "quiet").await.ok()?.spec;
        (e["state"] == "ready").then(|| e["exports"][0]["name"].as_str().map(String::from))?
    })
    .await;
    let t = c.get("TargetStatus", "spdk").await.expect("TargetStatus").spec;
    let pid = t["pid"].as_u64().expect("pid");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    assert_eq!(
        exe.file_name().and_then(|n| n.to_str()),
        Some("nvmf_tgt"),
        "interrupt mode runs nvmf_tgt: {}",
        exe.display()
    );
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).expect("cmdline");
    assert!(cmdline.contains("--interrupt-mode"), "{cmdline:?}");
    // Longhorn's V2 instance-manager pod is alive while `pgrep -f '^spdk_tgt'` finds a
    // process: the command line starts with the name of the program asked for
    assert!(cmdline.starts_with("spdk_tgt\0"), "{cmdline:?}");
    let probe = std::process::Command::new("pgrep")
        .args(["-f", "^spdk_tgt"])
        .output()
        .expect("pgrep");
    let found = String::from_utf8_lossy(&probe.stdout);
    assert!(
        found.lines().any(|l| l.trim() == pid.to_string()),
        "Longhorn's liveness probe `pgrep -f '^spdk_tgt'` does not find nvmf_tgt {pid}: {found:?}"
    );
    let report = spdk_perf::report(&spdk, port, &nqn, "randrw -M 50", 2);
    let iops = spdk_perf::total_iops(&report);
    assert!(iops > 0.0, "I/O through nvmf_tgt in interrupt mode: {report}");
    eprintln!("{TEST}: nvmf_tgt --interrupt-mode served {iops:.0} IOPS (4 KiB randrw QD32, loaded machine)");
    d.stop().await;
}
