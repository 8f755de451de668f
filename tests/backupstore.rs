//! Backups in Longhorn's backupstore format against a real S3 server
//! (s3s-fs on loopback, SigV4 checked) and a local folder: round trips
//! checksummed end to end, incrementals that upload only changed blocks,
//! wrong credentials, damaged and missing blocks, in-progress backups and
//! deletion's block collection.

#[path = "support/s3_server.rs"]
mod s3_server;

use std::os::unix::fs::FileExt;
use std::path::Path;

use s3_server::S3Server;
use talon::backupstore::{
    BackupError, BackupRequest, Compression, Credentials, Progress, SparseImage, Store, format, ops,
};

const MIB: u64 = 1 << 20;
/// A talon replica's superblock room before the volume's data.
const ROOM: u64 = MIB;

fn sha(path: &Path, from: u64, len: u64) -> String {
    let f = std::fs::File::open(path).expect("open");
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, from).expect("read_exact_at");
    format::checksum(&buf)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).rotate_left(seed as u32) as u8 ^ seed)
        .collect()
}

/// A sparse image file: ROOM, then `size` bytes with `writes` at volume offsets.
fn image(path: &Path, size: u64, writes: &[(u64, Vec<u8>)]) -> SparseImage {
    let f = std::fs::File::create(path).expect("create");
    f.set_len(ROOM + size).expect("set_len");
    for (at, data) in writes {
        f.write_all_at(data, ROOM + at).expect("write_all_at");
    }
    drop(f);
    SparseImage::open(path, ROOM, size).expect("open")
}

async fn s3_store(server: &S3Server, dir: &Path, secret: &str) -> Store {
    let f = dir.join(format!("secret-{secret}.yaml"));
    std::fs::write(&f, server.secret_manifest(secret)).expect("secret_manifest");
    let creds = Credentials::from_secret(&f).expect("from_secret");
    Store::open("s3://backups@us-east-1/cluster-a/", &creds).expect("open")
}

/// A folder target (made first: a folder target is never made by talon)
/// in `dir`: its folder and the store on it.
fn folder_store(dir: &Path) -> (std::path::PathBuf, Store) {
    let root = dir.join("store");
    std::fs::create_dir(&root).expect("the target's folder");
    let store = Store::open(&format!("vfs://{}", root.display()), &Credentials::none()).expect("store");
    (root, store)
}

fn request(name: &str, snapshot: &str, size: u64) -> BackupRequest {
    BackupRequest::v2("pvc-data", name, snapshot, size)
}

#[tokio::test]
async fn backups_round_trip_through_s3_and_an_incremental_uploads_only_changed_blocks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = S3Server::start(&dir.path().join("s3"), "backups").await;
    let store = s3_store(&server, dir.path(), s3_server::SECRET_KEY).await;
    store.check().await.expect("check");
    let size = 64 * MIB;

    // snapshot 1: 5 MiB at 8 MiB (blocks 4, 5, 6), 2 MiB at 40 MiB (block 20), twice the same 2 MiB
    let same = pattern(3, 2 * MIB as usize);
    let full = image(
        &dir.path().join("s1.img"),
        size,
        &[
            (8 * MIB, pattern(1, 5 * MIB as usize)),
            (40 * MIB, same.clone()),
            (50 * MIB, same.clone()),
        ],
    );
    let p = Progress::default();
    let (b1, st1) = ops::create(&store, &request("backup-one", "s1", size), &full, None, &p)
        .await
        .expect("request");
    assert_eq!(p.get(), 100);
    assert_eq!(st1.blocks_read, 5, "{st1:?}");
    assert_eq!(b1.blocks.len(), 5);
    assert!(b1.complete() && !b1.is_incremental);
    // blocks 20 and 25 are one object
    let blk_files = walk(&server.root.join("backups"), ".blk");
    assert_eq!(blk_files, 4, "deduplicated blocks in the store");
    let restored = dir.path().join("r1.img");
    let rs = ops::restore_to_file(&store, "pvc-data", "backup-one", &restored, ROOM, &p)
        .await
        .expect("restore_to_file");
    assert_eq!(rs.size, size);
    assert_eq!(
        sha(&restored, ROOM, size),
        sha(&full.file, ROOM, size),
        "restore of backup-one"
    );

    // snapshot 2 as a delta over snapshot 1: 1 MiB changed inside block 4 (8-10 MiB) and a new
    // 1 MiB at 30 MiB; the rest of block 4 comes from backup-one
    let delta = image(
        &dir.path().join("d2.img"),
        size,
        &[
            (9 * MIB, pattern(7, MIB as usize)),
            (30 * MIB, pattern(8, MIB as usize)),
        ],
    );
    let base = ops::last_backup(&store, "pvc-data")
        .await
        .expect("last_backup")
        .expect("backup-one is the last");
    assert_eq!(base.name, "backup-one");
    let (b2, st2) = ops::create(
        &store,
        &request("backup-two", "s2", size),
        &delta,
        Some(&base),
        &p,
    )
    .await
    .expect("ome");
    assert_eq!(
        (st2.blocks_read, st2.blocks_uploaded),
        (2, 2),
        "only the changed blocks: {st2:?}"
    );
    assert!(b2.is_incremental);
    assert_eq!(b2.blocks.len(), 6);
    // what snapshot 2 reads: snapshot 1 with the two changes
    let expect = dir.path().join("s2.img");
    std::fs::copy(&full.file, &expect).expect("copy");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&expect)
        .expect("open");
    f.write_all_at(&pattern(7, MIB as usize), ROOM + 9 * MIB)
        .expect("write_all_at");
    f.write_all_at(&pattern(8, MIB as usize), ROOM + 30 * MIB)
        .expect("write_all_at");
    drop(f);
    let r2 = dir.path().join("r2.img");
    ops::restore_to_file(&store, "pvc-data", "backup-two", &r2, ROOM, &p)
        .await
        .expect("restore_to_file");
    assert_eq!(
        sha(&r2, ROOM, size),
        sha(&expect, ROOM, size),
        "restore of backup-two"
    );
    // an incremental restore (a DR volume's): backup-one's restore brought to backup-two
    // fetches only the two blocks it lacks; brought back to backup-one, block 4's old
    // version is fetched and block 15 (30 MiB, not in backup-one) becomes a hole
    let dr = dir.path().join("dr.img");
    std::fs::copy(&restored, &dr).expect("copy");
    let d = ops::restore_delta_to_file(&store, "pvc-data", "backup-one", "backup-two", &dr, ROOM, &p)
        .await
        .expect("restore_delta_to_file");
    assert_eq!((d.blocks, d.blocks_downloaded), (6, 2), "{d:?}");
    assert_eq!(
        sha(&dr, ROOM, size),
        sha(&expect, ROOM, size),
        "backup-one + delta"
    );
    // applied again to what it made (a restore that runs again after a restart): the same
    ops::restore_delta_to_file(&store, "pvc-data", "backup-one", "backup-two", &dr, ROOM, &p)
        .await
        .expect("restore_delta_to_file again");
    assert_eq!(
        sha(&dr, ROOM, size),
        sha(&expect, ROOM, size),
        "the delta applied twice"
    );
    let d = ops::restore_delta_to_file(&store, "pvc-data", "backup-two", "backup-one", &dr, ROOM, &p)
        .await
        .expect("restore_delta_to_file back");
    assert_eq!((d.blocks, d.blocks_downloaded), (5, 1), "{d:?}");
    assert_eq!(
        sha(&dr, ROOM, size),
        sha(&full.file, ROOM, size),
        "back to backup-one"
    );
    // a base that is no backup of the volume: refused, nothing fetched
    let e = ops::restore_delta_to_file(&store, "pvc-data", "nosuch", "backup-two", &dr, ROOM, &p)
        .await
        .expect_err("an unknown base");
    assert!(e.to_string().contains("nosuch"), "{e}");

    let vol = ops::volume(&store, "pvc-data")
        .await
        .expect("volume")
        .expect("unwrap");
    assert_eq!(vol.last_backup_name, "backup-two");
    assert_eq!(vol.compression_method, "lz4");
    assert_eq!(vol.block_count, 6);
    let raw = std::fs::read_to_string(
        server
            .root
            .join("backups/cluster-a")
            .join(format::volume_cfg_path("pvc-data")),
    )
    .expect("volume_cfg_path");
    assert!(
        raw.contains(r#""CompressionMethod":"\"lz4\"""#),
        "Longhorn's quoting: {raw}"
    );
    assert_eq!(
        ops::volumes(&store).await.expect("volumes"),
        vec!["pvc-data".to_owned()]
    );

    // deleting backup-one keeps every block backup-two maps; then backup-two restores the same
    let removed = ops::delete(&store, "pvc-data", "backup-one")
        .await
        .expect("delete");
    assert_eq!(removed, 1, "the old version of block 4 only");
    let r3 = dir.path().join("r3.img");
    ops::restore_to_file(&store, "pvc-data", "backup-two", &r3, ROOM, &p)
        .await
        .expect("restore_to_file");
    assert_eq!(sha(&r3, ROOM, size), sha(&expect, ROOM, size));
    let removed = ops::delete(&store, "pvc-data", "backup-two")
        .await
        .expect("delete");
    assert_eq!(removed, 5);
    assert_eq!(walk(&server.root.join("backups"), ".blk"), 0);
    assert_eq!(walk(&server.root.join("backups"), ".lck"), 0, "no lock left");
    let vol = ops::volume(&store, "pvc-data")
        .await
        .expect("volume")
        .expect("unwrap");
    assert_eq!((vol.last_backup_name.as_str(), vol.block_count), ("", 0));
}

fn walk(dir: &Path, suffix: &str) -> usize {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                n += walk(&p, suffix);
            } else if p.to_string_lossy().ends_with(suffix) {
                n += 1;
            }
        }
    }
    n
}

#[tokio::test]
async fn bad_credentials_damaged_blocks_and_unfinished_backups_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = S3Server::start(&dir.path().join("s3"), "backups").await;
    let wrong = s3_store(&server, dir.path(), "not-the-secret").await;
    let e = wrong.check().await.expect_err("check fails").to_string();
    assert!(e.contains("backup store list"), "{e}");
    assert!(e.contains("403") || e.to_lowercase().contains("signature"), "{e}");

    let store = s3_store(&server, dir.path(), s3_server::SECRET_KEY).await;
    let size = 16 * MIB;
    let img = image(
        &dir.path().join("a.img"),
        size,
        &[(2 * MIB, pattern(5, 2 * MIB as usize))],
    );
    let p = Progress::default();
    let (b, _) = ops::create(&store, &request("backup-a", "sa", size), &img, None, &p)
        .await
        .expect("request");
    // the same name again is refused, and the first stays as it was
    let e = ops::create(&store, &request("backup-a", "sb", size), &img, None, &p)
        .await
        .expect_err("request fails")
        .to_string();
    assert!(e.contains("backup-a") && e.contains("already exists"), "{e}");
    let e = ops::create(&store, &request("../x", "sb", size), &img, None, &p)
        .await
        .expect_err("request fails")
        .to_string();
    assert!(e.contains("\"../x\" is invalid"), "{e}");

    // a damaged block fails the restore, naming the block
    let sum = &b.blocks[0].checksum;
    let blk = server
        .root
        .join("backups/cluster-a")
        .join(format::block_path("pvc-data", sum));
    let mut raw = std::fs::read(&blk).expect("read");
    let n = raw.len();
    raw[n / 2] ^= 0x5a;
    std::fs::write(&blk, &raw).expect("write");
    let e = ops::restore_to_file(&store, "pvc-data", "backup-a", &dir.path().join("x.img"), 0, &p)
        .await
        .expect_err("restore_to_file fails")
        .to_string();
    assert!(e.contains(sum.as_str()), "{e}");
    std::fs::remove_file(&blk).expect("remove_file");
    let e = ops::restore_to_file(&store, "pvc-data", "backup-a", &dir.path().join("x.img"), 0, &p)
        .await
        .expect_err("restore_to_file fails")
        .to_string();
    assert!(e.contains("not found") && e.contains(sum.as_str()), "{e}");

    // an unfinished backup (a crash before its config was final) is never restored, never a base,
    // and keeps deletion from collecting blocks
    let placeholder = format::BackupCfg {
        name: "backup-cut".into(),
        volume_name: "pvc-data".into(),
        compression_method: "lz4".into(),
        ..Default::default()
    };
    store
        .write(
            &format::backup_cfg_path("pvc-data", "backup-cut"),
            format::encode(&placeholder),
        )
        .await
        .expect("encode");
    let e = ops::restore_to_file(&store, "pvc-data", "backup-cut", &dir.path().join("y.img"), 0, &p)
        .await
        .expect_err("restore_to_file fails")
        .to_string();
    assert!(e.contains("still in progress"), "{e}");
    assert_eq!(
        ops::complete_backups(&store, "pvc-data")
            .await
            .expect("complete_backups")
            .len(),
        1
    );
    let img2 = image(
        &dir.path().join("b.img"),
        size,
        &[(4 * MIB, pattern(6, 2 * MIB as usize))],
    );
    ops::create(&store, &request("backup-b", "sb", size), &img2, None, &p)
        .await
        .expect("request");
    let removed = ops::delete(&store, "pvc-data", "backup-a").await.expect("delete");
    assert_eq!(removed, 0, "no block collected while a backup is in progress");
    let e = ops::delete(&store, "pvc-data", "backup-a")
        .await
        .expect_err("delete fails")
        .to_string();
    assert!(e.contains("backup-a") && e.contains("not found"), "{e}");

    // the cut-off backup is made again under its name (a restart of talon does that)
    let (again, _) = ops::create(&store, &request("backup-cut", "sc", size), &img2, None, &p)
        .await
        .expect("the cut-off backup made again");
    assert!(again.complete());
    let r = ops::restore_to_file(&store, "pvc-data", "backup-cut", &dir.path().join("z.img"), 0, &p)
        .await
        .expect("restore of the backup made again");
    assert_eq!(r.size, size);
}

#[tokio::test]
async fn a_local_folder_target_holds_the_same_layout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store) = folder_store(dir.path());
    let size = 8 * MIB;
    let img = image(
        &dir.path().join("a.img"),
        size,
        &[(0, pattern(9, 3 * MIB as usize))],
    );
    let p = Progress::default();
    let mut req = request("backup-g", "sg", size);
    req.compression = Compression::Gzip;
    ops::create(&store, &req, &img, None, &p).await.expect("create");
    assert!(
        root.join(format::backup_cfg_path("pvc-data", "backup-g"))
            .is_file()
    );
    let out = dir.path().join("out.img");
    ops::restore_to_file(&store, "pvc-data", "backup-g", &out, 0, &p)
        .await
        .expect("restore_to_file");
    assert_eq!(sha(&out, 0, size), sha(&img.file, ROOM, size));
    assert_eq!(std::fs::metadata(&out).expect("metadata").len(), size);
}

/// A folder target is a folder that exists: opening one that does not is
/// refused and makes nothing (a listing never creates it); one that
/// vanished under an open store is refused, never made again empty by the
/// next write; `.` and `..` are refused in its path.
#[tokio::test]
async fn a_folder_target_is_never_made_and_one_that_vanished_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("vfs");
    let target = format!("vfs://{}", folder.display());
    let e = Store::open(&target, &Credentials::none())
        .expect_err("no folder")
        .to_string();
    assert!(e.contains("does not exist") && e.contains(&target), "{e}");
    assert!(!folder.exists(), "opening made the folder");

    std::fs::create_dir(&folder).expect("the target's folder");
    let store = Store::open(&target, &Credentials::none()).expect("open");
    assert!(ops::volumes(&store).await.expect("listed").is_empty());
    let size = 4 * MIB;
    let img = image(&dir.path().join("a.img"), size, &[(0, pattern(5, MIB as usize))]);
    let p = Progress::default();
    ops::create(&store, &request("backup-a", "sa", size), &img, None, &p)
        .await
        .expect("a backup makes the store's own folders under the target");
    std::fs::remove_dir_all(&folder).expect("the target vanishes");
    let e = ops::create(&store, &request("backup-b", "sb", size), &img, None, &p)
        .await
        .expect_err("its folder is gone")
        .to_string();
    assert!(e.contains("does not exist"), "{e}");
    let e = ops::volumes(&store).await.expect_err("listed").to_string();
    assert!(e.contains("does not exist"), "{e}");
    assert!(!folder.exists(), "the store was made again, empty");

    for bad in [
        format!("vfs://{}/../elsewhere", folder.display()),
        format!("vfs://{}/./x", dir.path().display()),
    ] {
        let e = Store::open(&bad, &Credentials::none())
            .expect_err(&bad)
            .to_string();
        assert!(e.contains("'..'"), "{bad}: {e}");
    }
    assert!(!dir.path().join("elsewhere").exists());
}

/// Issue 55: a streamed restore (no file) gives its writer each block that
/// holds data once, at its offset, and never an all-zero one; no more than
/// `STREAM_BYTES` of blocks are being written at once; a backup larger
/// than what it is restored into is refused before anything is written.
#[tokio::test]
async fn a_streamed_restore_gives_only_blocks_with_data_with_bounded_blocks_in_flight() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, store) = folder_store(dir.path());
    const SIZE: u64 = 96 * MIB;
    // 40 blocks of data (some written twice: deduplicated in the store),
    // 2 MiB of written zeros, the rest holes
    let mut writes: Vec<(u64, Vec<u8>)> = (0..40u64)
        .map(|i| (i * 2 * MIB, pattern((i % 7) as u8 + 1, 2 * MIB as usize)))
        .collect();
    writes.push((90 * MIB, vec![0u8; 2 * MIB as usize]));
    let img = image(&dir.path().join("img"), SIZE, &writes);
    ops::create(
        &store,
        &request("b1", "s1", SIZE),
        &img,
        None,
        &Progress::default(),
    )
    .await
    .expect("backup");

    let got = Mutex::new(BTreeMap::new());
    let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let stats = ops::restore_streamed(
        &store,
        "pvc-data",
        "b1",
        SIZE,
        &Progress::default(),
        |at, data| {
            let (got, now, most) = (&got, &now, &most);
            async move {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                assert!(
                    got.lock().expect("lock").insert(at, data).is_none(),
                    "block {at} given twice"
                );
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        },
    )
    .await
    .expect("streamed restore");
    let got = got.into_inner().expect("lock");
    assert_eq!(
        got.len(),
        40,
        "the blocks with data, not the zero one: {:?}",
        got.keys()
    );
    for (at, data) in &writes[..40] {
        assert!(got[at] == *data, "block at {at}");
    }
    assert_eq!(stats.bytes_written, 80 * MIB);
    let bound = (ops::STREAM_BYTES / (2 * MIB)) as usize;
    let most = most.load(Ordering::SeqCst);
    assert!(most <= bound, "{most} blocks in flight, more than {bound}");
    assert!(most > 1, "several blocks in flight: {most}");

    let e = ops::restore_streamed(
        &store,
        "pvc-data",
        "b1",
        SIZE - MIB,
        &Progress::default(),
        |_, _| async { panic!("nothing is written") },
    )
    .await
    .expect_err("larger than its target");
    assert!(e.to_string().contains("more than"), "{e}");
}

/// A backup whose caller took the lock (to open its reader during the
/// lock's 2 s settle, as the backup controller does) commits only under a
/// backup's lock on its own backup volume, and every lock is gone after:
/// the one it committed under, and those it refused (another volume's, a
/// deletion's), with nothing of the refused backups in the store.
#[tokio::test]
async fn a_backup_under_a_lock_its_caller_took_commits_only_under_its_own_lock() {
    use futures::StreamExt as _;
    use talon::backupstore::lock::{Lock, LockKind};
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store) = folder_store(dir.path());
    let size = 8 * MIB;
    let bs = format::DEFAULT_BLOCK_SIZE;
    let blocks = || {
        futures::stream::iter([Ok(ops::Block {
            offset: 2 * bs,
            data: Some(pattern(5, bs as usize)),
        })])
        .boxed()
    };
    let p = Progress::default();
    // the three locks settle together (2 s), not one after another
    let (own, other, deletion) = futures::join!(
        Lock::acquire(&store, "pvc-data", LockKind::Use),
        Lock::acquire(&store, "pvc-other", LockKind::Use),
        Lock::acquire(&store, "pvc-third", LockKind::Delete),
    );
    let (b, st) = ops::create_held(
        &store,
        own.expect("a backup's lock"),
        &request("backup-held", "s1", size),
        blocks(),
        None,
        &p,
    )
    .await
    .expect("a backup under its own lock");
    assert!(b.complete(), "{b:?}");
    assert_eq!((st.blocks_read, st.blocks_uploaded), (1, 1), "{st:?}");
    for (lock, name) in [
        (other.expect("another volume's lock"), "backup-other"),
        (deletion.expect("a deletion's lock"), "backup-deletion"),
    ] {
        let e = ops::create_held(&store, lock, &request(name, "s1", size), blocks(), None, &p)
            .await
            .expect_err("a lock not its own");
        assert!(
            matches!(&e, BackupError::Invalid(m) if m.contains(name) && m.contains("pvc-data")),
            "{e}"
        );
        assert!(
            !root.join(format::backup_cfg_path("pvc-data", name)).exists(),
            "{name} wrote nothing"
        );
    }
    assert_eq!(walk(&root, ".lck"), 0, "no lock left, taken or refused");
    // a lock's path is made of the backup volume's name: a bad one is refused by the lock itself
    let e = Lock::acquire(&store, "../pvc-data", LockKind::Use)
        .await
        .expect_err("a backup volume name with a path in it");
    assert!(
        matches!(&e, BackupError::InvalidName { name, .. } if name == "../pvc-data"),
        "{e}"
    );
    assert_eq!(walk(dir.path(), ".lck"), 0, "nothing written for it");
    // what it committed restores
    let out = dir.path().join("out.img");
    ops::restore_to_file(&store, "pvc-data", "backup-held", &out, 0, &p)
        .await
        .expect("restore_to_file");
    let mut want = vec![0u8; size as usize];
    want[2 * bs as usize..3 * bs as usize].copy_from_slice(&pattern(5, bs as usize));
    assert_eq!(std::fs::read(&out).expect("read"), want);
}

#[tokio::test]
async fn over_tls_with_the_targets_own_ca_bodies_are_left_to_tls_and_over_http_they_are_signed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let size = 16 * MIB;
    let full = image(
        &dir.path().join("s1.img"),
        size,
        &[
            (2 * MIB, pattern(5, 3 * MIB as usize)),
            (12 * MIB, pattern(6, MIB as usize)),
        ],
    );
    let tls = S3Server::start_tls(&dir.path().join("s3-tls"), "backups").await;
    let plain = S3Server::start(&dir.path().join("s3"), "backups").await;
    let creds = |server: &S3Server, ca: Option<&str>| {
        Credentials::from_pairs(
            [
                ("AWS_ACCESS_KEY_ID", s3_server::ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", s3_server::SECRET_KEY),
                ("AWS_ENDPOINTS", server.endpoint().as_str()),
            ]
            .into_iter()
            .chain(ca.map(|c| ("AWS_CERT", c)))
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        )
    };
    let url = "s3://backups@us-east-1/cluster-a/";
    let ca = tls.ca_pem.clone().expect("the TLS server's CA");
    assert!(tls.endpoint().starts_with("https://"), "{}", tls.endpoint());

    // without the CA, or with another server's, the server's certificate is
    // refused at the first connection (no retry can make it trusted), the
    // error says what to fix, and nothing is written
    let other = S3Server::start_tls(&dir.path().join("s3-other"), "backups").await;
    let other_ca = other.ca_pem.clone().expect("the other server's CA");
    for (ca, hint) in [
        (None, "no AWS_CERT is given"),
        (Some(other_ca.as_str()), "the CA in AWS_CERT did not sign it"),
    ] {
        let before = tls.accepted.load(std::sync::atomic::Ordering::Relaxed);
        let untrusted = Store::open(url, &creds(&tls, ca)).expect("open");
        let refused = untrusted
            .check()
            .await
            .expect_err("a certificate of an unknown CA was taken");
        let said = refused.to_string();
        assert!(matches!(refused, BackupError::Target { .. }), "{refused:?}");
        assert!(
            said.contains("certificate is not trusted") && said.contains(hint),
            "{said}"
        );
        let tried = tls.accepted.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert_eq!(
            tried, 1,
            "the untrusted certificate was tried {tried} times: {said}"
        );
    }
    assert_eq!(tls.puts.counts(), (0, 0));

    let p = Progress::default();
    for (server, store) in [
        (
            &tls,
            Store::open(url, &creds(&tls, Some(&ca))).expect("open over TLS"),
        ),
        (
            &plain,
            Store::open(url, &creds(&plain, None)).expect("open over HTTP"),
        ),
    ] {
        store.check().await.expect("check");
        let before = server.puts.counts();
        let (b, stats) = ops::create(&store, &request("backup-one", "s1", size), &full, None, &p)
            .await
            .expect("backup");
        assert!(b.complete());
        assert_eq!(stats.blocks_uploaded, 3, "{stats:?}");
        let (signed, unsigned) = server.puts.counts();
        let puts = signed + unsigned - before.0 - before.1;
        assert!(puts >= 3 + 2, "3 blocks and the cfgs: {puts} PUTs");
        if std::ptr::eq(server, &tls) {
            assert_eq!(signed, 0, "a body signed over TLS");
        } else {
            assert_eq!(unsigned, 0, "a body left unsigned over plain HTTP");
        }
        let out = dir.path().join("r.img");
        ops::restore_to_file(&store, "pvc-data", "backup-one", &out, ROOM, &p)
            .await
            .expect("restore");
        assert_eq!(
            sha(&out, ROOM, size),
            sha(&full.file, ROOM, size),
            "{}",
            server.endpoint()
        );
    }
}
