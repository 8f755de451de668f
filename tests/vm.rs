//! The real-kernel guest tests: runs `tests/vm/run.sh` with the `talon` binary that cargo built for
//! this test, which boots Debian's 6.1 kernel under QEMU and runs every step in `tests/vm/steps/`.
//!
//! ```text
//!   cargo nextest ── vm_guest_steps ── bash tests/vm/run.sh [--steps $TALON_VM_STEPS] <CARGO_BIN_EXE_talon>
//!                                          └─ apt-get download / dpkg -x (cached) ─ initramfs ─ QEMU ─ steps
//! ```
//!
//! SKIPs (with the reason on stderr) when not root or when run.sh reports it cannot run here
//! (exit 77: no apt sources, download failed, a host tool missing). `TALON_VM_STEPS=a,b` selects
//! steps; the run.sh knobs (`TALON_VM_CACHE`, `TALON_VM_TIMEOUT`, ...) pass through.

use std::path::Path;
use std::process::Command;

#[test]
fn vm_guest_steps() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP vm_guest_steps: needs root (apt-get download, QEMU guest, host-side targets)");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm/run.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script);
    if let Ok(steps) = std::env::var("TALON_VM_STEPS")
        && !steps.is_empty()
    {
        cmd.args(["--steps", &steps]);
    }
    cmd.arg(env!("CARGO_BIN_EXE_talon"));
    let out = cmd.output().expect("run tests/vm/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(77) {
        let reason = stdout
            .lines()
            .find(|l| l.starts_with("SKIP"))
            .unwrap_or("SKIP vm-tests: run.sh exit 77");
        eprintln!(
            "SKIP vm_guest_steps: {}",
            reason.trim_start_matches("SKIP vm-tests: ")
        );
        return;
    }
    println!("{stdout}");
    for (step, reason) in stdout
        .lines()
        .filter_map(|l| l.strip_prefix("vm: step ")?.split_once(" SKIP: "))
    {
        eprintln!("SKIP vm_guest_steps/{step}: {reason}");
    }
    eprintln!("{stderr}");
    let summary = stdout.lines().rev().find(|l| l.starts_with("vm-tests:"));
    assert!(
        out.status.success(),
        "vm guest tests failed: {}",
        summary.unwrap_or("no summary line")
    );
    let summary = summary.expect("run.sh prints a vm-tests summary line");
    assert!(summary.ends_with(" 0 failed"), "{summary}");
    assert!(
        !summary.starts_with("vm-tests: 0 passed"),
        "no step ran: {summary}"
    );
}
