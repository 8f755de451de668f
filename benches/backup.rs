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
//! With `TALON_SPDK_DIR` set, a talon volume's restore into a thin replica
//! lvol on a real spdk_tgt, both ways side by side (issue 55):
//!
//! ```text
//!   via file: S3 -> restore_to_file <dir>/restore.img -> mover::fill_from_file -> lvol
//!   streamed: S3 -> mover::restore::fill_replica(Source::Backup) -> lvol (no file)
//! ```
//!
//! with the bytes each left allocated on the data dir's filesystem and the
//! lvol's clusters (1 MiB) allocated after it.
//!
//! With Longhorn's own backupstore library (the test command unpacks it to
//! `target/longhorn-backupstore`), its full and incremental backup and
//! restore of the same images on the same S3 server, beside talon's (rows
//! "Longhorn's ...", its default 2 blocks at once; talon's "full backup, 2
//! at once" is at the same concurrency, "8 at once" above its default 4).
//!
//! Then a backup of that lvol's snapshots out of spdk_tgt, in full and
//! incrementally, both ways side by side: staged in a file (the shallow
//! copy talon used before) and streamed through the data mover (what a
//! backup does now; see `backups_of_lvol`), every block read and only what
//! the allocation map names (the streamed ones as the backup controller
//! runs them: the reader opened during the lock's 2 s settle, its open
//! time printed below the row); and Longhorn's snapshot hash of the first
//! snapshot, every chunk read and mapped.
//! The last column, peak MiB: for a talon row, how far the bench process's
//! peak RSS rose during the operation above what it held before (freed
//! memory given back first; talon and the in-process S3 server together, so
//! an upper bound of talon's; the system allocator, where the daemon runs
//! mimalloc); for a Longhorn row, its program's peak RSS (`VmHWM`, its S3
//! server's not in it).
//!
//! The first rows, "S3 PUTs alone", are the server's floor: the same bytes
//! in 2 MiB objects PUT with nothing read, checksummed or compressed. The
//! S3 server runs on a runtime of its own (`S3Server::start_apart`), as
//! it would in another process: talon's tasks and Longhorn's program meet
//! it alike, both on the same two cores.
//!
//! The last rows, "TLS: ...", are the same server over TLS (its own CA in
//! `AWS_CERT`): its floor, full backups and a restore, lz4, to read beside
//! the plain-HTTP rows of the same names.
//!
//! Run: `cargo bench --bench backup` (BACKUP_BENCH_GIB=4 by default).

#[path = "../tests/support/longhorn_backupstore.rs"]
mod longhorn_backupstore;
#[path = "../tests/support/s3_server.rs"]
#[allow(dead_code)]
mod s3_server;
#[path = "../tests/support/spdk_real.rs"]
mod spdk_real;

use futures::{StreamExt, TryStreamExt};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use longhorn_backupstore::Longhorn;
use talon::backupstore::lock::{Lock, LockKind};
use talon::backupstore::{
    BackupCfg, BackupRequest, Compression, Credentials, Progress, SparseImage, Store, ops,
};

const MIB: u64 = 1 << 20;
const RUN: u64 = 64 * MIB;

/// Fills `buf` with incompressible bytes (xorshift64 from state `x`, which
/// goes on where the last call left it).
fn random(buf: &mut [u8], x: &mut u64) {
    for b in buf.chunks_exact_mut(8) {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        b.copy_from_slice(&x.to_le_bytes());
    }
}

fn fill(f: &std::fs::File, at: u64, len: u64, seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; 8 * MIB as usize];
    let mut done = 0;
    while done < len {
        random(&mut buf, &mut x);
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

/// Peak memory, from `/proc/self/status`: [`clock`] resets the process's
/// peak RSS (`clear_refs` 5) and notes its RSS; a talon row shows how far the
/// peak rose above that during the operation (talon's and the in-process S3
/// server's memory together: an upper bound for talon's).
mod rss {
    use std::sync::atomic::{AtomicU64, Ordering};

    static BASE_KIB: AtomicU64 = AtomicU64::new(0);

    /// Field `key` of a `/proc/<pid>/status` file, in KiB.
    pub fn kib(status: &str, key: &str) -> Option<u64> {
        let s = std::fs::read_to_string(status).ok()?;
        s.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// The memory freed before given back (else the allocator's retained
    /// pages hide what the next operation takes), the peak reset, the RSS
    /// now noted.
    pub fn start() {
        // SAFETY: glibc's malloc_trim only releases free heap memory
        unsafe {
            libc::malloc_trim(0);
        }
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        BASE_KIB.store(kib("/proc/self/status", "VmRSS:").unwrap_or(0), Ordering::SeqCst);
    }

    /// MiB the peak RSS rose since [`start`].
    pub fn rise_mib() -> Option<f64> {
        let peak = kib("/proc/self/status", "VmHWM:")?;
        Some(peak.saturating_sub(BASE_KIB.load(Ordering::SeqCst)) as f64 / 1024.0)
    }
}

/// The start of a timed talon operation: its peak memory measured from here.
fn clock() -> Instant {
    rss::start();
    Instant::now()
}

/// A talon row: the peak RSS rise since its [`clock`].
fn row(what: &str, method: &str, bytes: u64, secs: f64, blocks: u64) {
    row_rss(what, method, bytes, secs, blocks, rss::rise_mib());
}

fn row_rss(what: &str, method: &str, bytes: u64, secs: f64, blocks: u64, rss_mib: Option<f64>) {
    let rss = rss_mib.map_or_else(|| "-".to_owned(), |m| format!("{m:.0}"));
    println!(
        "| {what:<27} | {method:<5} | {:>9.0} | {:>7.1} | {:>7.0} | {blocks:>7} | {rss:>8} |",
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
    let server = s3_server::S3Server::start_apart(&dir.path().join("s3"), "bench");
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
    // the snapshot after the change, whole (Longhorn's library compares two whole snapshots)
    let s2_img = dir.path().join("s2.img");
    image(&s2_img, size, &runs, 1);
    {
        let f = std::fs::OpenOptions::new().write(true).open(&s2_img).expect("s2");
        for (i, (at, len)) in changed.iter().enumerate() {
            fill(&f, *at, *len, 1000 + i as u64);
        }
    }
    let longhorn = Longhorn::on(&server);

    let floor_rows = floor(&store, written).await;
    let lvols = lvol_target(dir.path(), size).await;
    println!(
        "backup and restore of a {gib} GiB volume, {} MiB written, S3 on loopback (s3s-fs)",
        written / MIB
    );
    println!("| operation                   | comp. | data MiB  | seconds | MiB/s   | blocks  | peak MiB |");
    println!("|-----------------------------|-------|-----------|---------|---------|---------|----------|");
    for (what, secs) in &floor_rows {
        row(what, "-", written, *secs, written / (2 * MIB));
    }
    for (i, method) in [Compression::Lz4, Compression::None].into_iter().enumerate() {
        let vol = format!("bench-{}", method.as_str());
        let req = |name: &str| BackupRequest {
            compression: method,
            ..BackupRequest::v2(&vol, name, name, size)
        };
        let p = Progress::default();
        let t = clock();
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
        let t = clock();
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
        // the same full backup (every block uploaded again) at other concurrencies: 2 is
        // Longhorn's default, 4 talon's
        for n in [2usize, 8] {
            let t = clock();
            let again = BackupRequest {
                concurrency: n,
                full: true,
                ..req(&format!("full-{n}"))
            };
            let (_, s3) = ops::create(&store, &again, &full, None, &p)
                .await
                .expect("full backup again");
            row(
                &format!("full backup, {n} at once"),
                method.as_str(),
                written,
                t.elapsed().as_secs_f64(),
                s3.blocks_uploaded,
            );
        }
        if let Some(lh) = &longhorn {
            lh.side_by_side(
                &dir.path().join(format!("lh-{i}")),
                &full,
                &s2_img,
                size,
                method.as_str(),
                written,
            );
        }
        let out = dir.path().join(format!("restore-{i}.img"));
        let t = clock();
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
        // the full backup restored (what the TLS rows' restore reads beside),
        // then a DR volume's next restore: what holds "full" brought to
        // "incremental", fetching only the blocks that changed
        let t = clock();
        let r = ops::restore_to_file(&store, &vol, "full", &out, 0, &p)
            .await
            .expect("restore of full");
        row(
            "restore of the full backup",
            method.as_str(),
            r.bytes_written,
            t.elapsed().as_secs_f64(),
            r.blocks,
        );
        let t = clock();
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
        if let Some(t) = &lvols {
            into_lvols(
                t,
                &store,
                &vol,
                size,
                method.as_str(),
                &dir.path().join(format!("via-{i}.img")),
            )
            .await;
        }
    }
    over_tls(dir.path(), &full, size, written).await;
    if let Some(t) = lvols {
        t.0.stop(std::time::Duration::from_secs(5))
            .await
            .expect("stop spdk_tgt");
    }
    println!("(two cores; the 2 s of each operation's lock settle are included, as Longhorn waits them too)");
}

/// The same server over TLS (an `https://` endpoint, `AWS_CERT` its CA):
/// its floor, the full backup at 2 and 4 at once and its restore, lz4, each
/// to read beside the plain-HTTP row of the same name. Over TLS talon leaves
/// request bodies unsigned (SigV4 `UNSIGNED-PAYLOAD`), so these rows carry
/// TLS's encryption on both sides and no SHA-256 of any body.
async fn over_tls(dir: &Path, full: &SparseImage, size: u64, written: u64) {
    let server = s3_server::S3Server::start_apart_tls(&dir.join("s3-tls"), "bench");
    let secret = dir.join("secret-tls.yaml");
    std::fs::write(&secret, server.secret_manifest(s3_server::SECRET_KEY)).expect("secret");
    let creds = Credentials::from_secret(&secret).expect("creds");
    let store = Store::open("s3://bench@us-east-1/b/", &creds).expect("store over TLS");
    for (what, secs) in floor(&store, written).await {
        row(
            &what.replace("S3 ", "TLS: "),
            "-",
            written,
            secs,
            written / (2 * MIB),
        );
    }
    let vol = "bench-tls";
    let p = Progress::default();
    for n in [2usize, 4] {
        let req = BackupRequest {
            compression: Compression::Lz4,
            concurrency: n,
            full: true,
            ..BackupRequest::v2(vol, &format!("full-{n}"), &format!("full-{n}"), size)
        };
        let t = clock();
        let (_, s) = ops::create(&store, &req, full, None, &p)
            .await
            .expect("full backup over TLS");
        row(
            &format!("TLS: full backup, {n} at once"),
            "lz4",
            written,
            t.elapsed().as_secs_f64(),
            s.blocks_uploaded,
        );
    }
    let out = dir.join("restore-tls.img");
    let t = clock();
    let r = ops::restore_to_file(&store, vol, "full-4", &out, 0, &p)
        .await
        .expect("restore over TLS");
    row(
        "TLS: restore of the full backup",
        "lz4",
        r.bytes_written,
        t.elapsed().as_secs_f64(),
        r.blocks,
    );
    let _ = std::fs::remove_file(&out);
}

/// The S3 server's own floor: `bytes` in 2 MiB objects PUT (one
/// incompressible block, signed as every upload is) with no reading,
/// checksum or compression, 2 and 8 at once: what neither talon's backup
/// nor Longhorn's can go below on this server and these cores.
async fn floor(store: &Store, bytes: u64) -> Vec<(String, f64)> {
    let mut block = vec![0u8; 2 * MIB as usize];
    random(&mut block, &mut 0x9E37_79B9_7F4A_7C15u64);
    let mut rows = Vec::new();
    for n in [2usize, 8] {
        let t = Instant::now();
        futures::stream::iter(0..bytes / (2 * MIB))
            .map(|i| {
                let data = block.clone();
                async move { store.write(&format!("floor/{n}/{i}.blk"), data).await }
            })
            .buffer_unordered(n)
            .try_collect::<Vec<()>>()
            .await
            .expect("PUT");
        rows.push((format!("S3 PUTs alone, {n} at once"), t.elapsed().as_secs_f64()));
    }
    rows
}

/// Longhorn's own backupstore library v1.12.1 on the same S3 server: its
/// backups and restores of the same images, timed beside talon's (its
/// concurrency is its default, 2 blocks at once).
impl Longhorn {
    fn on(server: &s3_server::S3Server) -> Option<Longhorn> {
        let Some(bin) = Longhorn::find() else {
            println!(
                "(Longhorn's backupstore library: not found, its rows left out; `bash tests/run-all.sh` unpacks it)"
            );
            return None;
        };
        Some(Longhorn {
            bin,
            env: Longhorn::s3_env(server.endpoint(), s3_server::ACCESS_KEY, s3_server::SECRET_KEY),
        })
    }

    /// Seconds `args` takes Longhorn's program, and its peak RSS in MiB:
    /// its `VmHWM` read every 10 ms until it exits (the last reading; a
    /// child's `ru_maxrss` would count the bench's own memory at the fork).
    /// Its stderr in `work`.
    fn timed(&self, work: &Path, args: &[&str]) -> (f64, f64) {
        std::fs::create_dir_all(work).expect("work dir");
        let log = work.join("longhorn.err");
        let t = Instant::now();
        let mut child = std::process::Command::new(&self.bin)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", self.bin.display()));
        let status_file = format!("/proc/{}/status", child.id());
        let mut peak_kib = 0;
        let status = tokio::task::block_in_place(|| {
            loop {
                if let Some(s) = child.try_wait().expect("wait") {
                    break s;
                }
                if let Some(k) = rss::kib(&status_file, "VmHWM:") {
                    peak_kib = k;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        });
        let secs = t.elapsed().as_secs_f64();
        assert!(
            status.success(),
            "Longhorn's backupstore {args:?}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        (secs, peak_kib as f64 / 1024.0)
    }

    /// Longhorn's full backup of `full`, its incremental one of `s2` over
    /// it, and its restore of the incremental one, each a row.
    fn side_by_side(
        &self,
        work: &Path,
        full: &SparseImage,
        s2: &Path,
        size: u64,
        method: &str,
        written: u64,
    ) {
        let dest = "s3://bench@us-east-1/lh/";
        let vol = format!("lh-{method}");
        let (size_s, f1, f2) = (
            size.to_string(),
            format!("snap-1={}", full.file.display()),
            format!("snap-2={}", s2.display()),
        );
        let (secs, rss) = self.timed(work, &["create", dest, &vol, "lh-full", &f1, &size_s, method]);
        row_rss("Longhorn's full backup", method, written, secs, 0, Some(rss));
        let (secs, rss) = self.timed(
            work,
            &["create", dest, &vol, "lh-incr", &f2, &f1, &size_s, method],
        );
        row_rss("Longhorn's incr. backup", method, 64 * MIB, secs, 0, Some(rss));
        let out = work.join("restore.img");
        let url = talon::backupstore::format::backup_url(dest, "lh-incr", &vol);
        let (secs, rss) = self.timed(work, &["restore", &url, &out.to_string_lossy()]);
        row_rss(
            "Longhorn's restore",
            method,
            written + 96 * MIB,
            secs,
            0,
            Some(rss),
        );
        let _ = std::fs::remove_file(&out);
    }
}

/// A spdk_tgt (`TALON_SPDK_DIR`) with lvstore `talon-bench` (1 MiB
/// clusters) on an aio bdev over a sparse file in `dir` room for two
/// replicas of `size`; none (a line says so) without SPDK.
async fn lvol_target(dir: &Path, size: u64) -> Option<(talon::spdk::target::Target, spdk_real::Reaper)> {
    let spdk = spdk_real::spdk_dir("backup bench: restores into lvols")?;
    let cfg = spdk_real::target_cfg(&dir.join("run"), &spdk, 1024);
    let t = talon::spdk::target::Target::spawn(&cfg).await.expect("spdk_tgt");
    let reaper = spdk_real::Reaper::new(&t, &cfg);
    let c = t.client();
    spdk_real::aio_lvstore(
        c,
        &dir.join("disk.img"),
        2 * size + 256 * MIB,
        "bench0",
        "talon-bench",
    )
    .await;
    Some((t, reaper))
}

/// Bytes allocated to `path` on its filesystem (0 when there is none).
fn on_disk(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map(|m| m.blocks() * 512).unwrap_or(0)
}

/// Backup "incremental" of `vol` restored into a new replica lvol both
/// ways (through a file, and streamed), each timed, then deleted.
async fn into_lvols(
    t: &(talon::spdk::target::Target, spdk_real::Reaper),
    store: &Store,
    vol: &str,
    size: u64,
    method: &str,
    file: &Path,
) {
    use talon::spdk::rpc::{ByName, GetLvols};
    use talon::spdk::volume::mover::restore::{FromBackup, Source, fill_replica};
    let c = t.0.client();
    let clusters = |name: &'static str| async move {
        c.bdev_lvol_get_lvols(&GetLvols::default())
            .await
            .expect("lvols")
            .into_iter()
            .find(|l| l.name == name)
            .map_or(0, |l| l.num_allocated_clusters)
    };
    let p = Progress::default();
    let t0 = clock();
    let r = ops::restore_to_file(store, vol, "incremental", file, 0, &p)
        .await
        .expect("restore to a file");
    let staged = on_disk(file);
    fill_replica(
        c,
        &Source::File(file.to_owned()),
        "talon-bench",
        "via-r0",
        size / MIB,
    )
    .await
    .expect("fill from the file");
    let secs = t0.elapsed().as_secs_f64();
    row("restore->lvol via file", method, r.bytes_written, secs, r.blocks);
    println!(
        "|   (data dir: {} MiB staged; lvol: {} clusters)",
        staged / MIB,
        clusters("via-r0").await
    );
    let _ = std::fs::remove_file(file);
    let from = Source::Backup(FromBackup {
        target: "s3://bench@us-east-1/b/".into(),
        store: store.clone(),
        volume: vol.to_owned(),
        backup: "incremental".into(),
        data_offset: 0,
        progress: std::sync::Arc::new(Progress::default()),
    });
    let t0 = clock();
    fill_replica(c, &from, "talon-bench", "streamed-r0", size / MIB)
        .await
        .expect("restore streamed");
    let secs = t0.elapsed().as_secs_f64();
    row("restore->lvol streamed", method, r.bytes_written, secs, r.blocks);
    println!(
        "|   (data dir: 0 MiB staged; lvol: {} clusters)",
        clusters("streamed-r0").await
    );
    backups_of_lvol(t, store, vol, size, method).await;
    for l in [
        "talon-bench/via-r0",
        "talon-bench/streamed-r0",
        "talon-bench/bench-s2",
        "talon-bench/bench-s1",
    ] {
        c.bdev_lvol_delete(&ByName::new(l)).await.expect("delete");
    }
}

/// The restored lvol `streamed-r0` snapshotted (`s1`), 64 MiB of it
/// changed (1 MiB in each of 64 places) and snapshotted again (`s2`), then
/// backed up from spdk_tgt both ways, in full (`s1`) and incrementally
/// (`s2` over `s1`), each timed (issue 55):
///
/// ```text
///   via file:  shallow copy of the chain (or of s2 alone) into a sparse file on the
///              data dir (spdk::volume::to_file, how talon read backups before)
///              -> backupstore::ops::create
///   streamed:  mover::backup::BackupReader (s1; s2 and s1 side by side, the blocks
///              that differ) -> backupstore::ops::create_from (no file)
/// ```
async fn backups_of_lvol(
    t: &(talon::spdk::target::Target, spdk_real::Reaper),
    store: &Store,
    vol: &str,
    size: u64,
    method: &str,
) {
    use talon::spdk::rpc::LvolSnapshot;
    use talon::spdk::volume::mover::backup::{BackupRead, BackupReader};
    use talon::spdk::volume::mover::{self, Purpose, Session};
    use talon::spdk::volume::{Inventory, to_file};
    let c = t.0.client();
    let snap = |name: &'static str| async move {
        c.bdev_lvol_snapshot(&LvolSnapshot {
            lvol_name: "talon-bench/streamed-r0".into(),
            snapshot_name: name.into(),
        })
        .await
        .expect("snapshot");
    };
    snap("bench-s1").await;
    let w = Session::open(c, "talon-bench/streamed-r0", Purpose::Test, mover::DEPTH)
        .await
        .expect("write session");
    for i in 0..64u64 {
        let data = bytes::Bytes::from(vec![(i as u8) | 1; MIB as usize]);
        w.write(i * (size / 64) + 5 * MIB, data).await.expect("write");
    }
    w.close().await.expect("close");
    snap("bench-s2").await;
    let compression = Compression::parse(method).expect("method");
    let req = |bvol: &str, name: &str| BackupRequest {
        compression,
        ..BackupRequest::v2(bvol, name, name, size)
    };
    let p = Progress::default();
    let inv = Inventory::load(c).await.expect("inventory");
    let (s1, s2) = ("talon-bench/bench-s1", "talon-bench/bench-s2");
    let data = to_file::Chain::of(&inv, s1).expect("chain of s1").data_bytes();

    // via a file
    let bvol = format!("{vol}-lvol-file");
    let file = std::env::temp_dir().join(format!("talon-bench-{method}.img"));
    let t0 = clock();
    let chain = to_file::Chain::of(&inv, s1).expect("chain of s1");
    to_file::copy_to_file(c, &chain, &file, "talon-bench-staging")
        .await
        .expect("staging copy of s1");
    let staged = on_disk(&file);
    let image = SparseImage::open(&file, 0, size).expect("image");
    let (b1, st) = ops::create(store, &req(&bvol, "full"), &image, None, &p)
        .await
        .expect("full backup via file");
    row(
        "lvol->full backup via file",
        method,
        data,
        t0.elapsed().as_secs_f64(),
        st.blocks_uploaded,
    );
    println!("|   (data dir: {} MiB staged)", staged / MIB);
    let t0 = clock();
    let mut delta = to_file::Chain::of(&inv, s2).expect("chain of s2");
    // s2 alone: what changed since s1 (its parent)
    delta.lvols = vec![s2.to_owned()];
    delta.held = delta.held.split_off(delta.held.len() - 1);
    to_file::copy_to_file(c, &delta, &file, "talon-bench-staging")
        .await
        .expect("staging copy of s2");
    let image = SparseImage::open(&file, 0, size).expect("image");
    let (_, st) = ops::create(store, &req(&bvol, "incr"), &image, Some(&b1), &p)
        .await
        .expect("incremental backup via file");
    row(
        "lvol->incr. backup via file",
        method,
        64 * MIB,
        t0.elapsed().as_secs_f64(),
        st.blocks_uploaded,
    );
    let _ = std::fs::remove_file(&file);

    // streamed through the mover
    let bs = talon::backupstore::format::DEFAULT_BLOCK_SIZE;
    let read = |snapshot: &str, base: Option<&str>| BackupRead {
        snapshot: snapshot.to_owned(),
        base: base.map(str::to_owned),
        data_offset: 0,
        size,
    };
    // every block read (no map: an empty listing), and only what the
    // chain's allocation map names (mover::map), side by side
    let listed = talon::spdk::volume::Inventory::load(c).await.expect("inventory");
    let unlisted = talon::spdk::volume::Inventory::default();
    for (way, inv, tag) in [("every block", &unlisted, "all"), ("mapped", &listed, "map")] {
        let bvol = format!("{vol}-lvol-mover-{tag}");
        // as the backup controller does it: the reader opened during the
        // lock's 2 s settle, then the blocks streamed under the lock
        let streamed = async |r: BackupRead, req: BackupRequest, base: Option<&BackupCfg>| {
            let t0 = clock();
            let (lock, reader) = futures::join!(Lock::acquire(store, &req.volume, LockKind::Use), async {
                let r = BackupReader::open(c, inv, r).await.expect("reader");
                (r, t0.elapsed().as_secs_f64())
            });
            let (r, opened) = reader;
            let lock = lock.expect("lock");
            let out = ops::create_held(store, lock, &req, r.blocks(bs), base, &p)
                .await
                .expect("backup streamed");
            r.close().await.expect("close");
            (out, t0.elapsed().as_secs_f64(), opened)
        };
        let ((b1, st), secs, opened) = streamed(read(s1, None), req(&bvol, "full"), None).await;
        row(
            &format!("lvol->full, {way}"),
            method,
            data,
            secs,
            st.blocks_uploaded,
        );
        println!("|   (its reader opened in {opened:.1} s, beside the lock's 2 s settle)");
        let ((_, st), secs, opened) = streamed(read(s2, Some(s1)), req(&bvol, "incr"), Some(&b1)).await;
        row(
            &format!("lvol->incr., {way}"),
            method,
            64 * MIB,
            secs,
            st.blocks_uploaded,
        );
        println!("|   (its reader opened in {opened:.1} s, beside the lock's 2 s settle)");
    }

    // Longhorn's snapshot hash of s1 (issue 55), once: every 1 MiB chunk
    // read, and only the chunks the chain's map names; the size column is
    // the snapshot's (what a hash covers), the blocks column the chunks read
    if method == Compression::Lz4.as_str() {
        use talon::longhorn::snaphash::{hash_lvol, map_of};
        let chain = to_file::Chain::of(&listed, s1).expect("chain of s1");
        let mut sums = Vec::new();
        for (way, map) in [("every chunk", None), ("mapped", map_of(&listed, &chain))] {
            let t0 = clock();
            let h = hash_lvol(c, s1, size, map).await.expect("snapshot hash");
            row(
                &format!("snapshot hash, {way}"),
                "-",
                size,
                t0.elapsed().as_secs_f64(),
                h.read / MIB,
            );
            sums.push(h.checksum);
        }
        assert_eq!(sums[0], sums[1], "one checksum either way");
    }
}
