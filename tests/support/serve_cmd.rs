//! The `talon serve` command line of a test's talon process, laid out in one
//! directory: `run/talon.sock` (the admin API), `data/`, `run/`, the config
//! file named, and its log appended to `talon.log` (kept over restarts, shown
//! when a test fails). The caller adds its own options and starts it.

use std::path::Path;
use std::process::{Command, Stdio};

/// `program --socket <dir>/run/talon.sock serve --data-dir <dir>/data
/// --run-dir <dir>/run --config <dir>/<config>`, stdout discarded, stderr
/// appended to `<dir>/talon.log`.
pub fn serve(program: &Path, dir: &Path, config: &str) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("talon.log"))
        .expect("talon.log");
    let mut cmd = Command::new(program);
    cmd.arg("--socket")
        .arg(dir.join("run/talon.sock"))
        .args(["serve", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--run-dir")
        .arg(dir.join("run"))
        .arg("--config")
        .arg(dir.join(config))
        .stdout(Stdio::null())
        .stderr(log);
    cmd
}
