//! An earlier talon for the upgrade tests (tests/restart_io.rs): the binary
//! `TALON_PREVIOUS_BIN` names, or else one built from this checkout's own git
//! history, once, into `target/previous-talon/talon-<rev>`.
//!
//! ```text
//!   TALON_PREVIOUS_BIN set ──────────────────────────────────────────────> that binary
//!   target/previous-talon/talon-<rev> there ─────────────────────────────> that binary
//!   git history has <rev> ─> (lock) git archive <rev> | tar -x -C src-<rev>
//!                            cargo build --locked --bin talon (own target dir, no debuginfo)
//!                            cp → talon-<rev>; src and target dir removed  ─> talon-<rev>
//!   no git history (a source tarball) ───────────────────────────────────> Err(reason): SKIP
//! ```
//!
//! The commit, in `tests/data/previous-talon.rev` (tests/previous_talon.sh
//! reads the same file), is 9324f2a: main just before issue 18 was merged,
//! the newest talon whose clean stop (SIGTERM) still stopped spdk_tgt and
//! tgtd. It is the upgrade docs/upgrade.md describes "from a talon before
//! targets outlived a clean stop", and its state store differs from today's:
//! it holds the config resources without everything added since (volume
//! layout flags, remote replicas' API, DH-HMAC-CHAP and TLS settings,
//! TargetStatus' cause fields), written by that binary, read by this one.
#![allow(dead_code)] // each includer uses a part

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The pinned commit (tests/data/previous-talon.rev).
pub fn rev() -> &'static str {
    include_str!("../data/previous-talon.rev").trim()
}

/// The repository this test was built from.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// This build's target dir (`<target>/debug/talon` is this talon).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_talon"))
        .ancestors()
        .nth(2)
        .expect("target dir")
        .to_path_buf()
}

/// The earlier talon's binary; `Err(reason)` when there is none to be had
/// (the caller prints `SKIP`). Panics when the build itself fails: with the
/// commit in the history, a failed build is a broken test, not a skip.
pub fn binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TALON_PREVIOUS_BIN").map(PathBuf::from) {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("TALON_PREVIOUS_BIN={} is not a file", p.display()))
        };
    }
    let rev = rev();
    let short = &rev[..9];
    let cache = target_dir().join("previous-talon");
    let bin = cache.join(format!("talon-{short}"));
    if bin.is_file() {
        return Ok(bin);
    }
    let found = Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(["cat-file", "-e", &format!("{rev}^{{commit}}")])
        .output();
    match found {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            // a shallow clone or a source tarball; or git refusing the directory (safe.directory)
            return Err(format!(
                "TALON_PREVIOUS_BIN not set and commit {short} is not in {}'s git history ({}) \
                 (export TALON_PREVIOUS_BIN=$(tests/previous_talon.sh REV))",
                repo().display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Err(e) => {
            return Err(format!(
                "TALON_PREVIOUS_BIN not set and git cannot run ({e}) to build commit {short}"
            ));
        }
    }
    std::fs::create_dir_all(&cache).expect("target/previous-talon");
    // one build for all the tests (nextest runs each in its own process)
    let lock = File::create(cache.join("build.lock")).expect("build.lock");
    lock.lock().expect("lock build.lock");
    if bin.is_file() {
        return Ok(bin);
    }
    let t0 = Instant::now();
    let src = cache.join(format!("src-{short}"));
    let target = cache.join("target");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).expect("src dir");
    let mut archive = Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(["archive", "--format=tar", rev])
        .stdout(Stdio::piped())
        .spawn()
        .expect("git archive");
    let untar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&src)
        .stdin(archive.stdout.take().expect("archive stdout"))
        .status()
        .expect("tar");
    assert!(
        archive.wait().expect("git archive").success() && untar.success(),
        "git archive {short} | tar -x -C {} failed",
        src.display()
    );
    let log_path = cache.join(format!("build-{short}.log"));
    let log = File::create(&log_path).expect("build log");
    eprintln!(
        "building talon {short} (the earlier talon of the upgrade tests) into {}; log {}",
        target.display(),
        log_path.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&src)
        .args(["build", "--locked", "--bin", "talon"])
        .env("CARGO_TARGET_DIR", &target)
        // only the binary is wanted: no debuginfo, no incremental state (half the time, a
        // fifth of the disk)
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .env("CARGO_INCREMENTAL", "0")
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .status()
        .expect("cargo build");
    if !status.success() {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        panic!(
            "building talon {short} failed ({status}); {}:\n{}",
            log_path.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let tmp = cache.join(format!("talon-{short}.tmp"));
    std::fs::copy(target.join("debug/talon"), &tmp).expect("copy the earlier talon");
    std::fs::rename(&tmp, &bin).expect("rename");
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(&target);
    eprintln!(
        "built talon {short} in {:.0} s: {}",
        t0.elapsed().as_secs_f64(),
        bin.display()
    );
    Ok(bin)
}
