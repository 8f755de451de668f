//! `benches/fio/run.sh` on a real block device: a loop device over a sparse file, real fio.
//!
//! ```text
//!   tempfile (32 MiB) ── losetup ── /dev/loopN ── run.sh --device --runtime 1 --jobs a,b
//!                                                   ├─ results.jsonl: one {"label","job","fio"} line per job
//!                                                   └─ stdout: one markdown row per job
//! ```
//!
//! Needs root, losetup (util-linux) and fio (Debian package fio); SKIPs otherwise. Every job file
//! is also checked to name the standard settings (libaio, direct, time_based, env runtime).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn have(prog: &str) -> bool {
    which::which(prog).is_ok()
}

/// A loop device over a sparse file, detached on drop.
struct Loop {
    dev: String,
}

impl Loop {
    fn new(file: &Path) -> Option<Loop> {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .ok()?;
        out.status.success().then(|| Loop {
            dev: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

#[test]
fn job_files_are_the_standard_set() {
    let dir = repo().join("benches/fio/jobs");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("benches/fio/jobs")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "randread-4k-qd1.fio",
            "randread-4k-qd32.fio",
            "randrw-70-30-4k-qd16.fio",
            "randwrite-4k-qd1.fio",
            "randwrite-4k-qd32.fio",
            "seqread-128k.fio",
            "seqwrite-128k.fio",
        ]
    );
    for n in &names {
        let text = std::fs::read_to_string(dir.join(n)).expect("read job");
        for want in [
            "ioengine=libaio",
            "direct=1",
            "time_based=1",
            "runtime=${TALON_FIO_RUNTIME}",
            "filename=${TALON_FIO_DEVICE}",
        ] {
            assert!(text.lines().any(|l| l == want), "{n} lacks `{want}`");
        }
        let job = n.trim_end_matches(".fio");
        assert!(
            text.contains(&format!("[{job}]")),
            "{n}: the job section is named {job}"
        );
    }
}

#[test]
fn runner_on_a_loop_device() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP runner_on_a_loop_device: needs root (losetup)");
        return;
    }
    for p in ["fio", "losetup"] {
        if !have(p) {
            eprintln!("SKIP runner_on_a_loop_device: {p} is not installed (tests/apt-packages.txt)");
            return;
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("disk.img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(32 << 20))
        .expect("sparse file");
    let Some(lo) = Loop::new(&img) else {
        eprintln!("SKIP runner_on_a_loop_device: losetup cannot create a loop device here");
        return;
    };
    let results = dir.path().join("results.jsonl");
    let run = |args: &[&str]| {
        Command::new("sh")
            .arg(repo().join("benches/fio/run.sh"))
            .args(args)
            .env("TALON_FIO_RAMP", "0")
            .env("TMPDIR", dir.path())
            .output()
            .expect("run benches/fio/run.sh")
    };
    let res = results.to_str().expect("utf-8");
    let out = run(&[
        "--device",
        &lo.dev,
        "--runtime",
        "1",
        "--label",
        "engine=loop,replicas=1",
        "--results",
        res,
        "--jobs",
        "randread-4k-qd1,randrw-70-30-4k-qd16",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "run.sh failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| engine=loop,replicas=1 | "))
        .collect();
    assert_eq!(rows.len(), 2, "one table row per job:\n{stdout}");
    let lines: Vec<Value> = std::fs::read_to_string(&results)
        .expect("results file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each result line is JSON"))
        .collect();
    assert_eq!(lines.len(), 2);
    for (rec, job) in lines.iter().zip(["randread-4k-qd1", "randrw-70-30-4k-qd16"]) {
        assert_eq!(rec["job"], job);
        assert_eq!(rec["label"], "engine=loop,replicas=1");
        assert_eq!(rec["device"], lo.dev.as_str());
        let j = &rec["fio"]["jobs"][0];
        assert_eq!(j["error"], 0);
        assert!(
            j["read"]["io_bytes"].as_u64().unwrap_or(0) > 0,
            "{job} read something"
        );
        if job.starts_with("randrw") {
            assert!(
                j["write"]["io_bytes"].as_u64().unwrap_or(0) > 0,
                "{job} wrote something"
            );
            assert_eq!(rec["fio"]["jobs"][0]["job options"]["rwmixread"], "70");
        }
    }

    // Bad input: a clear error, nothing appended.
    let out = run(&["--device", &lo.dev, "--label", "a\"b", "--results", res]);
    assert_eq!(out.status.code(), Some(2), "a label with a quote is refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("label"));
    let out = run(&["--device", img.to_str().expect("utf-8"), "--results", res]);
    assert_eq!(out.status.code(), Some(1), "a regular file is refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a block device"));
    let out = run(&[
        "--device",
        &lo.dev,
        "--results",
        res,
        "--jobs",
        "no-such-job",
        "--runtime",
        "1",
    ]);
    assert!(!out.status.success(), "an unknown job fails");
    assert_eq!(
        std::fs::read_to_string(&results)
            .expect("results")
            .lines()
            .count(),
        2
    );
}
