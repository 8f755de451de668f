//! Longhorn's own backupstore library v1.12.1 as a program
//! (`../shared/longhorn/backupstore-tool`; `tests/run-all.sh` unpacks it to
//! `target/longhorn-backupstore`, checks it against its README's checksum
//! and names it in `TALON_LONGHORN_BACKUPSTORE`), run by the cross-check
//! (`tests/backupstore_longhorn.rs`) and the backup bench
//! (`benches/backup.rs`), both `#[path]`-including this.
#![allow(dead_code)] // each includer uses a part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The program (or another that answers the same commands: talon run as
/// Longhorn's engine binary) and the environment it runs with.
pub struct Longhorn {
    pub bin: PathBuf,
    /// S3's endpoint and keys, as Longhorn's engine gets them from a backup
    /// target's secret (`AWS_ENDPOINTS`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`); empty for a folder target.
    pub env: Vec<(String, String)>,
}

impl Longhorn {
    /// The program: `TALON_LONGHORN_BACKUPSTORE`, else where the test
    /// command unpacks it; `None` when neither is a file.
    pub fn find() -> Option<PathBuf> {
        std::env::var_os("TALON_LONGHORN_BACKUPSTORE")
            .map(PathBuf::from)
            .or_else(|| Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("target/longhorn-backupstore")))
            .filter(|p| p.is_file())
    }

    /// The environment of an S3 server at `endpoint` with these keys.
    pub fn s3_env(endpoint: String, access_key: &str, secret_key: &str) -> Vec<(String, String)> {
        vec![
            ("AWS_ENDPOINTS".into(), endpoint),
            ("AWS_ACCESS_KEY_ID".into(), access_key.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), secret_key.into()),
        ]
    }

    /// Runs it with `args`, blocking, off the runtime's other thread (which
    /// may serve S3).
    pub fn output(&self, args: &[&str]) -> Output {
        tokio::task::block_in_place(|| {
            Command::new(&self.bin)
                .args(args)
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .output()
        })
        .unwrap_or_else(|e| panic!("run {}: {e}", self.bin.display()))
    }

    /// [`Self::output`]'s stdout; fails with its stderr when it exits with an error.
    pub fn run(&self, args: &[&str]) -> String {
        let out = self.output(args);
        assert!(
            out.status.success(),
            "Longhorn's backupstore {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
