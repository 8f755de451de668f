//! Backup and restore throughput against a real S3 server on loopback
//! (s3s-fs, SigV4), in Longhorn's backupstore format: a 4 GiB volume with
//! 25 % written (1 GiB of incompressible data in 64 MiB runs), backed up in
//! full, then incrementally after 64 MiB more changed, then restored (in
//! full, and incrementally from the full backup's restore); each
//! with lz4 (Longhorn's default) and with no compression, side by side.
//!
//! ```text
//!   sparse image (SEEK_DATA finds the data) -> backupstore::ops::create -> S3
//!   delta image (the changed runs only)     -> create over the full backup
//!   S3 -> backupstore::ops::restore_to_file (every block checked)
//!   S3 -> restore_delta_to_file: the full backup's restore brought to the
//!         incremental one (a DR volume's next restore: the changed blocks only)
//! ```
//!
//! What a V2 backup adds on top (the snapshot's shallow copy out of
//! spdk_tgt) is measured by the real-SPDK test's timings, not here.
//! Run: `cargo bench --bench backup` (BACKUP_BENCH_GIB=4 by default).

#[path = "../tests/support/s3_server.rs"]
#[allow(dead_code)]
mod s3_server;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use talon::backupstore::{BackupRequest, Compression, Credentials, Progress, SparseImage, Store, ops};

const MIB: u64 = 1 << 20;
const RUN: u64 = 64 * MIB;

fn fill(f: &std::fs::File, at: u64, len: u64, seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; 8 * MIB as usize];
    let mut done = 0;
    while done < len {
        for b in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes());
        }
        let n = (len - done).min(buf.len() as u64) as usize;
        f.write_all_at(&buf[..n], at + done).expect("write");
        done += n as u64;
    }
}

fn image(path: &Path, size: u64, runs: &[(u64, u64)], seed: u64) -> SparseImage {
    let f = std::fs::File::create(path).expect("image");
    f.set_len(size).expect("size");
    for (i, (at, len)) in runs.iter().enumerate() {
        fill(&f, *at, *len, seed + i as u64);
    }
    drop(f);
    SparseImage::open(path, 0, size).expect("open")
}

fn row(what: &str, method: &str, bytes: u64, secs: f64, blocks: u64) {
    println!(
        "| {what:<22} | {method:<5} | {:>9.0} | {:>7.1} | {:>7.0} | {blocks:>7} |",
        bytes as f64 / MIB as f64,
        secs,
        bytes as f64 / MIB as f64 / secs
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let gib: u64 = std::env::var("BACKUP_BENCH_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let size = gib << 30;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = s3_server::S3Server::start(&dir.path().join("s3"), "bench").await;
    let secret = dir.path().join("secret.yaml");
    std::fs::write(&secret, server.secret_manifest(s3_server::SECRET_KEY)).expect("secret");
    let creds = Credentials::from_secret(&secret).expect("creds");
    let store = Store::open("s3://bench@us-east-1/b/", &creds).expect("store");
    // 25 % written: one 64 MiB run in every 256 MiB
    let runs: Vec<(u64, u64)> = (0..size / (4 * RUN)).map(|i| (i * 4 * RUN, RUN)).collect();
    let written: u64 = runs.iter().map(|r| r.1).sum();
    let full = image(&dir.path().join("full.img"), size, &runs, 1);
    // 64 MiB more changed: 1 MiB in each of 64 places
    let changed: Vec<(u64, u64)> = (0..64).map(|i| (i * (size / 64) + 3 * MIB, MIB)).collect();
    let delta = image(&dir.path().join("delta.img"), size, &changed, 1000);

    println!(
        "backup and restore of a {gib} GiB volume, {} MiB written, S3 on loopback (s3s-fs)",
        written / MIB
    );
    println!("| operation              | comp. | data MiB  | seconds | MiB/s   | blocks  |");
    println!("|------------------------|-------|-----------|---------|---------|---------|");
    for (i, method) in [Compression::Lz4, Compression::None].into_iter().enumerate() {
        let vol = format!("bench-{}", method.as_str());
        let req = |name: &str| BackupRequest {
            compression: method,
            ..BackupRequest::v2(&vol, name, name, size)
        };
        let p = Progress::default();
        let t = Instant::now();
        let (b1, s1) = ops::create(&store, &req("full"), &full, None, &p)
            .await
            .expect("full backup");
        row(
            "full backup",
            method.as_str(),
            written,
            t.elapsed().as_secs_f64(),
            s1.blocks_uploaded,
        );
        let t = Instant::now();
        let (_, s2) = ops::create(&store, &req("incremental"), &delta, Some(&b1), &p)
            .await
            .expect("incremental backup");
        row(
            "incremental backup",
            method.as_str(),
            64 * MIB,
            t.elapsed().as_secs_f64(),
            s2.blocks_uploaded,
        );
        let out = dir.path().join(format!("restore-{i}.img"));
        let t = Instant::now();
        let r = ops::restore_to_file(&store, &vol, "incremental", &out, 0, &p)
            .await
            .expect("restore");
        row(
            "restore",
            method.as_str(),
            r.bytes_written,
            t.elapsed().as_secs_f64(),
            r.blocks,
        );
        // a DR volume's next restore: what holds "full" brought to "incremental",
        // fetching only the blocks that changed
        ops::restore_to_file(&store, &vol, "full", &out, 0, &p)
            .await
            .expect("restore of full");
        let t = Instant::now();
        let r = ops::restore_delta_to_file(&store, &vol, "full", "incremental", &out, 0, &p)
            .await
            .expect("incremental restore");
        row(
            "incremental restore",
            method.as_str(),
            r.blocks_downloaded * 2 * MIB,
            t.elapsed().as_secs_f64(),
            r.blocks_downloaded,
        );
        let _ = std::fs::remove_file(&out);
    }
    println!("(two cores; the 2 s of each operation's lock settle are included, as Longhorn waits them too)");
}
