//! Cross-check of talon's backupstore format against Longhorn's own Go
//! library (github.com/longhorn/backupstore), in both directions, on a local
//! folder (`vfs://`) and on a real S3 server (s3s-fs, SigV4):
//!
//! - Longhorn lists, inspects and restores talon's full and incremental
//!   backups, and deletes one of them (its block collection) while the other
//!   still restores in talon;
//! - talon lists and restores Longhorn's full and incremental backups, and
//!   makes an incremental backup on top of Longhorn's last one, which
//!   Longhorn restores;
//! - talon run as Longhorn's engine binary (`longhorn backup ls|inspect|...`,
//!   what longhorn-manager's backup target controller runs) prints what
//!   Longhorn's own commands print for the same store.
//!
//! Longhorn's code is not in this repository and is not built by it: the
//! test runs a program built outside it from Longhorn's library, named by
//! `TALON_LONGHORN_BACKUPSTORE` or unpacked by the test command to
//! `target/longhorn-backupstore`, and is reported skipped without one. That
//! program's command line (each prints JSON or a word, exits 1 on an error):
//!
//! ```text
//!   create <dest> <volume> <backup> <snap>=<file> [<snap>=<file>..] <size> <compression>
//!          (CreateDeltaBlockBackup of the first snapshot; the others are there for the
//!           library's incremental compare against the volume's last backup)
//!   restore <backup url> <file>      (RestoreDeltaBlockBackup)
//!   list <dest> <volume>             (List)
//!   inspect <backup url>             (InspectBackup)
//!   inspect-volume <volume url>      (InspectVolume)
//!   backup ... | system-backup ...   (Longhorn's engine binary's backup target commands:
//!                                     backupstore/cmd's ls, inspect-volume, inspect, head,
//!                                     rm, ls-backing-image, system-backup list)
//!   delete <backup url>              (DeleteDeltaBlockBackup)
//! ```
//!
//! The Go library reads its S3 endpoint and keys from the environment
//! (`AWS_ENDPOINTS`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`), as
//! Longhorn's engine gets them from the backup target's secret.

#[path = "support/longhorn_backupstore.rs"]
mod longhorn_backupstore;
#[path = "support/s3_server.rs"]
#[allow(dead_code)]
mod s3_server;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use longhorn_backupstore::Longhorn;
use s3_server::S3Server;
use talon::backupstore::{BackupRequest, Credentials, Progress, SparseImage, Store, format, ops};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;
const VOLUME: &str = "pvc-cross";

fn tool() -> Option<PathBuf> {
    Longhorn::find()
}

fn skip(test: &str) {
    eprintln!(
        "SKIP {test}: no program on Longhorn's backupstore library (TALON_LONGHORN_BACKUPSTORE unset, no \
         target/longhorn-backupstore); it is built outside this repository"
    );
}

fn pattern(seed: u8, len: u64) -> Vec<u8> {
    (0..len as usize)
        .map(|i| (i as u32).wrapping_mul(2654435761).rotate_left(seed as u32) as u8 ^ seed)
        .collect()
}

/// A plain image of SIZE bytes with `writes`, sparse elsewhere.
fn write_image(path: &Path, base: Option<&Path>, writes: &[(u64, u64, u8)]) {
    match base {
        Some(b) => {
            std::fs::copy(b, path).expect("copy");
        }
        None => {
            let f = std::fs::File::create(path).expect("create");
            f.set_len(SIZE).expect("set_len");
        }
    }
    let f = std::fs::OpenOptions::new().write(true).open(path).expect("open");
    for (at, len, seed) in writes {
        f.write_all_at(&pattern(*seed, *len), *at).expect("write_all_at");
    }
}

fn sha(path: &Path) -> String {
    let data = std::fs::read(path).expect("read");
    assert_eq!(data.len() as u64, SIZE, "{}", path.display());
    format::checksum(&data)
}

impl Longhorn {
    /// Longhorn's restore of backup `name` into `out`; the checksum of what it wrote.
    fn restore(&self, target: &str, name: &str, out: &Path) -> String {
        let url = format::backup_url(target, name, VOLUME);
        self.run(&["restore", &url, &out.to_string_lossy()]);
        sha(out)
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.run(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    }
}

fn request(name: &str, snapshot: &str) -> BackupRequest {
    BackupRequest::v2(VOLUME, name, snapshot, SIZE)
}

/// Both directions against one store, `target` as Longhorn writes it.
async fn cross_check(store: &Store, target: &str, lh: &Longhorn, dir: &Path) {
    let p = Progress::default();
    let file = |n: &str| dir.join(n);

    // ---- talon -> Longhorn ------------------------------------------------------------------
    // s1: 5 MiB at 8 MiB, 2 MiB at 40 MiB; s2 = s1 + 1 MiB inside block 4 + 1 MiB at 30 MiB
    write_image(
        &file("s1.img"),
        None,
        &[(8 * MIB, 5 * MIB, 1), (40 * MIB, 2 * MIB, 2)],
    );
    let d2 = [(9 * MIB, MIB, 7), (30 * MIB, MIB, 8)];
    write_image(&file("s2.img"), Some(&file("s1.img")), &d2);
    write_image(&file("d2.img"), None, &d2);
    let full = SparseImage::open(&file("s1.img"), 0, SIZE).expect("open");
    ops::create(store, &request("talon-1", "snap-1"), &full, None, &p)
        .await
        .expect("talon's full backup");
    let base = ops::last_backup(store, VOLUME)
        .await
        .expect("last_backup")
        .expect("talon-1");
    let delta = SparseImage::open(&file("d2.img"), 0, SIZE).expect("open");
    let (b2, st2) = ops::create(store, &request("talon-2", "snap-2"), &delta, Some(&base), &p)
        .await
        .expect("talon's incremental backup");
    assert!(b2.is_incremental && st2.blocks_read == 2, "{st2:?}");

    // Longhorn's listing names the backups (their details come from inspect)
    let listed = lh.json(&["list", target, VOLUME]);
    let backups = listed[VOLUME]["Backups"].as_object().expect("Backups");
    let mut names: Vec<&String> = backups.keys().collect();
    names.sort();
    assert_eq!(
        names,
        ["talon-1", "talon-2"],
        "Longhorn lists talon's backups: {listed}"
    );
    assert_eq!(listed[VOLUME]["Messages"], serde_json::json!({}), "{listed}");
    let vol = lh.json(&["inspect-volume", &format!("{target}?volume={VOLUME}")]);
    assert_eq!(vol["Size"], SIZE.to_string(), "{vol}");
    assert_eq!(vol["LastBackupName"], "talon-2", "{vol}");
    assert_eq!(vol["DataEngine"], "v2", "{vol}");
    let info = lh.json(&["inspect", &format::backup_url(target, "talon-2", VOLUME)]);
    assert_eq!(info["SnapshotName"], "snap-2", "{info}");
    assert_eq!(info["VolumeName"], VOLUME, "{info}");
    assert_eq!(info["VolumeSize"], SIZE.to_string(), "{info}");
    assert_eq!(info["IsIncremental"], true, "{info}");
    assert_eq!(info["CompressionMethod"], "lz4", "{info}");
    assert!(
        info["Messages"].as_object().is_none_or(|m| m.is_empty()),
        "{info}"
    );
    for (n, expect) in [("talon-1", "s1.img"), ("talon-2", "s2.img")] {
        assert_eq!(
            lh.restore(target, n, &file(&format!("lh-restore-{n}.img"))),
            sha(&file(expect)),
            "Longhorn's restore of talon's {n}"
        );
    }

    // a backup of 16 MiB blocks (Longhorn's other `backup-block-size`), in a backup volume of its
    // own: Longhorn reads its size from the parameters and restores it
    let big = "pvc-cross-16";
    let req16 = BackupRequest {
        block_size: 16 * MIB,
        ..BackupRequest::v2(big, "talon-16", "snap-2", SIZE)
    };
    let s2 = SparseImage::open(&file("s2.img"), 0, SIZE).expect("open");
    let (b16, st16) = ops::create(store, &req16, &s2, None, &p)
        .await
        .expect("talon's backup of 16 MiB blocks");
    // the file s2.img (a copy of s1.img, written over) reads as data throughout: 4 blocks
    assert_eq!(
        (st16.blocks_read, b16.block_size().expect("block size")),
        (4, 16 * MIB),
        "{st16:?}"
    );
    let info = lh.json(&["inspect", &format::backup_url(target, "talon-16", big)]);
    assert_eq!(
        info["Parameters"]["backup-block-size"],
        (16 * MIB).to_string(),
        "{info}"
    );
    let out = file("lh-restore-talon-16.img");
    lh.run(&[
        "restore",
        &format::backup_url(target, "talon-16", big),
        &out.to_string_lossy(),
    ]);
    assert_eq!(
        sha(&out),
        sha(&file("s2.img")),
        "Longhorn's restore of talon's 16 MiB backup"
    );
    // and an incremental one over a 2 MiB backup is refused (a block size is the backup volume's)
    let e = ops::create(store, &request("talon-x", "snap-2"), &s2, Some(&b16), &p)
        .await
        .expect_err("2 MiB blocks over a 16 MiB backup");
    assert!(e.to_string().contains("back up in full"), "{e}");
    ops::delete_volume(store, big)
        .await
        .expect("delete the 16 MiB backup volume");

    // ---- Longhorn -> talon ------------------------------------------------------------------
    // Longhorn's library makes an incremental backup over talon-2 (its compare of snap-3 and
    // snap-2, the volume's last backed-up snapshot), then talon restores it
    write_image(
        &file("s3.img"),
        Some(&file("s2.img")),
        &[(2 * MIB, 3 * MIB, 9), (62 * MIB, 2 * MIB, 10)],
    );
    let made = lh.json(&[
        "create",
        target,
        VOLUME,
        "longhorn-3",
        &format!("snap-3={}", file("s3.img").display()),
        &format!("snap-2={}", file("s2.img").display()),
        &SIZE.to_string(),
        "lz4",
    ]);
    assert_eq!(
        made["incremental"], true,
        "Longhorn's backup over talon's: {made}"
    );
    let b3 = ops::backup(store, VOLUME, "longhorn-3")
        .await
        .expect("talon reads Longhorn's backup config");
    assert!(b3.complete() && b3.is_incremental, "{b3:?}");
    assert_eq!(b3.snapshot_name, "snap-3");
    let names: Vec<String> = ops::complete_backups(store, VOLUME)
        .await
        .expect("complete_backups")
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.contains(&"longhorn-3".to_owned()), "{names:?}");
    let out = file("talon-restore-longhorn-3.img");
    ops::restore_to_file(store, VOLUME, "longhorn-3", &out, 0, &p)
        .await
        .expect("talon restores Longhorn's incremental backup");
    assert_eq!(sha(&out), sha(&file("s3.img")), "talon's restore of longhorn-3");

    // talon's incremental on top of Longhorn's last backup; Longhorn restores it
    let d4 = [(20 * MIB, 4 * MIB, 11)];
    write_image(&file("s4.img"), Some(&file("s3.img")), &d4);
    write_image(&file("d4.img"), None, &d4);
    let base = ops::last_backup(store, VOLUME)
        .await
        .expect("last_backup")
        .expect("longhorn-3 is the last");
    assert_eq!(base.name, "longhorn-3");
    let delta = SparseImage::open(&file("d4.img"), 0, SIZE).expect("open");
    let (_, st4) = ops::create(store, &request("talon-4", "snap-4"), &delta, Some(&base), &p)
        .await
        .expect("talon's incremental over Longhorn's");
    assert_eq!(st4.blocks_read, 2, "{st4:?}");
    assert_eq!(
        lh.restore(target, "talon-4", &file("lh-restore-talon-4.img")),
        sha(&file("s4.img")),
        "Longhorn's restore of talon-4"
    );

    // talon as Longhorn's engine binary answers the manager's calls as Longhorn's library does
    same_answers(target, lh, dir).await;

    // Longhorn's delete of talon's first backup keeps what the later ones map (its block
    // collection reads talon's configs); talon still restores talon-2 and talon-4
    lh.run(&["delete", &format::backup_url(target, "talon-1", VOLUME)]);
    for (n, expect) in [("talon-2", "s2.img"), ("talon-4", "s4.img")] {
        let out = file(&format!("talon-after-delete-{n}.img"));
        ops::restore_to_file(store, VOLUME, n, &out, 0, &p)
            .await
            .expect("restore after Longhorn's delete");
        assert_eq!(
            sha(&out),
            sha(&file(expect)),
            "{n} after Longhorn deleted talon-1"
        );
    }
    // and talon's delete of Longhorn's backup keeps what Longhorn restores
    ops::delete(store, VOLUME, "longhorn-3")
        .await
        .expect("talon deletes Longhorn's backup");
    assert_eq!(
        lh.restore(target, "talon-4", &file("lh-after-delete-talon-4.img")),
        sha(&file("s4.img")),
        "talon-4 after talon deleted longhorn-3"
    );

    // the manager's deletes through talon as the engine binary: a backup, then the whole volume
    let talon = talon_as_engine_binary(lh, dir);
    talon.run(&["backup", "rm", &format::backup_url(target, "talon-2", VOLUME)]);
    let listed = lh.json(&["backup", "ls", "--volume", VOLUME, target]);
    let left: Vec<&String> = listed[VOLUME]["Backups"]
        .as_object()
        .expect("Backups")
        .keys()
        .collect();
    assert_eq!(left, ["talon-4"], "Longhorn lists what talon left: {listed}");
    assert_eq!(
        lh.restore(target, "talon-4", &file("lh-after-rm-talon-4.img")),
        sha(&file("s4.img")),
        "talon-4 after talon's engine-binary rm of talon-2"
    );
    talon.run(&["backup", "rm", "--volume", VOLUME, target]);
    assert_eq!(
        lh.json(&["backup", "ls", "--volume-only", target]),
        serde_json::json!({}),
        "no backup volume left for Longhorn to list"
    );
}

/// talon run as `longhorn` (a link), with the same environment.
fn talon_as_engine_binary(lh: &Longhorn, dir: &Path) -> Longhorn {
    let link = dir.join("engine-binary").join("longhorn");
    if !link.exists() {
        std::fs::create_dir_all(link.parent().expect("parent")).expect("dir");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_talon"), &link).expect("symlink");
    }
    Longhorn {
        bin: link,
        env: lh.env.clone(),
    }
}

/// The backup target calls longhorn-manager makes of the engine binary
/// (`engineapi/backups.go`), answered by Longhorn's library (through its
/// `backupstore/cmd` commands, as longhorn-engine's binary runs them) and by
/// talon: the same JSON, the same "cannot find" for what is not there.
async fn same_answers(target: &str, lh: &Longhorn, dir: &Path) {
    let talon = talon_as_engine_binary(lh, dir);
    let vol_url = format!("{target}?volume={VOLUME}");
    let b2 = format::backup_url(target, "talon-2", VOLUME);
    let b3 = format::backup_url(target, "longhorn-3", VOLUME);
    let b2_head = format!("{target}?backup=talon-2&volume={VOLUME}");
    for args in [
        &["backup", "ls", "--volume-only", target][..],
        &["backup", "ls", "--volume", VOLUME, target],
        &["backup", "ls", target],
        &["backup", "inspect-volume", &vol_url],
        &["backup", "inspect", &b2],
        &["backup", "inspect", &b3],
        &["system-backup", "list", target],
    ] {
        let (want, got) = (lh.json(args), talon.json(args));
        assert_eq!(
            got, want,
            "talon's answer to {args:?} (left) vs Longhorn's (right)"
        );
    }
    // a config's modification time: the same instant
    for url in [&vol_url, &b2_head] {
        let (want, got) = (
            lh.json(&["backup", "head", url]),
            talon.json(&["backup", "head", url]),
        );
        let t = |v: &serde_json::Value| {
            humantime::parse_rfc3339(v["ModificationTime"].as_str().expect("ModificationTime"))
                .expect("RFC 3339")
        };
        assert_eq!(t(&got), t(&want), "head {url}: {got} vs {want}");
    }
    // backing image backups: none, as a list
    let names = |v: serde_json::Value| v.as_array().cloned().unwrap_or_default();
    assert_eq!(
        names(talon.json(&["backup", "ls-backing-image", target])),
        names(lh.json(&["backup", "ls-backing-image", target]))
    );
    // what is not there: both fail, in the words the manager looks for ("cannot find")
    let missing = format::backup_url(target, "no-such-backup", VOLUME);
    for bin in [lh, &talon] {
        let out = bin.output(&["backup", "inspect", &missing]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && text.contains("cannot find"),
            "{}: {text}",
            bin.bin.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longhorn_and_talon_read_each_others_backups_on_a_folder() {
    let Some(bin) = tool() else {
        return skip("longhorn_and_talon_read_each_others_backups_on_a_folder");
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("store");
    std::fs::create_dir_all(&root).expect("store");
    let target = format!("vfs://{}", root.display());
    let store = Store::open(&target, &Credentials::default()).expect("open");
    let lh = Longhorn { bin, env: vec![] };
    cross_check(&store, &target, &lh, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longhorn_and_talon_read_each_others_backups_on_s3() {
    let Some(bin) = tool() else {
        return skip("longhorn_and_talon_read_each_others_backups_on_s3");
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = S3Server::start(&dir.path().join("s3"), "backups").await;
    let secret = dir.path().join("secret.yaml");
    std::fs::write(&secret, server.secret_manifest(s3_server::SECRET_KEY)).expect("secret");
    let target = "s3://backups@us-east-1/cluster-x/";
    let store = Store::open(target, &Credentials::from_secret(&secret).expect("from_secret")).expect("open");
    let lh = Longhorn {
        bin,
        env: Longhorn::s3_env(server.endpoint(), s3_server::ACCESS_KEY, s3_server::SECRET_KEY),
    };
    cross_check(&store, target, &lh, dir.path()).await;
}
