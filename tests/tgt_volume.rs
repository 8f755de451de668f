//! V1 volumes served by a real tgtd, checked with real libiscsi initiators
//! (iscsi-inq, iscsi-readcapacity16 and libiscsi's WRITE16/READ16).

mod tgt_common;

use std::os::unix::fs::FileExt;

use talon::names::{Iqn, ObjectName};
use talon::tgt::volume::{VolumeError, ensure_chap_account};
use talon::tgt::{ChapCredentials, ChapSecret, ChapUser, ExportOptions, InitiatorAcl, V1Store};
use tgt_common::{Libiscsi, LoopFs, TestTgtd, read_capacity, ready, tool};

const INITIATOR: &str = "iqn.2025-01.io.talon.test:initiator";

fn name(s: &str) -> ObjectName {
    ObjectName::parse("volume", s).expect("name")
}

fn loopback() -> ExportOptions {
    ExportOptions {
        initiators: vec![InitiatorAcl::Address("127.0.0.1".parse().expect("ip"))],
        chap: None,
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn create_serve_write_read_expand_delete() {
    if !ready("create_serve_write_read_expand_delete") {
        return;
    }
    let data = tempfile::tempdir().expect("data dir");
    let mut tgtd = TestTgtd::start(&data.path().join("run/tgtd"));
    let admin = tgtd.get().admin();
    let store = V1Store::new(data.path());
    let vol = name("vol-a");
    let iqn = Iqn::for_volume(&vol);
    let url = tgtd.url(iqn.as_str());

    let info = store.create(&vol, 64 << 20).expect("create");
    assert_eq!(info.path, data.path().join("v1/volumes/vol-a.img"));
    let export = store.export(&admin, &vol, &loopback()).expect("export");
    assert_eq!(
        (export.iqn.as_str(), export.lun),
        ("iqn.2025-01.io.talon:vol-a", 1)
    );
    // export is idempotent
    assert_eq!(
        store.export(&admin, &vol, &loopback()).expect("export again").tid,
        export.tid
    );

    let (ok, inq) = tool("iscsi-inq", &[&url]);
    assert!(ok, "iscsi-inq {url}: {inq}");
    assert!(inq.contains("Peripheral Device Type:DIRECT_ACCESS"), "{inq}");
    assert_eq!(read_capacity(&url), 64 << 20);

    // write through iSCSI, read back through iSCSI and from the backing file
    let lib = Libiscsi::load().expect("libiscsi");
    let portal = tgtd.cfg.portal.to_string();
    let s = lib
        .connect(&portal, iqn.as_str(), INITIATOR, None)
        .expect("login");
    let a = pattern(7, 8192);
    s.write(16, &a).expect("write16");
    assert_eq!(s.read(16, 8192).expect("read16"), a, "read back what was written");
    let file = std::fs::File::open(&info.path).expect("open backing file");
    let mut on_disk = vec![0u8; 8192];
    file.read_exact_at(&mut on_disk, 16 * 512).expect("read file");
    assert_eq!(on_disk, a, "bytes reached the backing file");
    // and the other way round
    let b = pattern(99, 4096);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&info.path)
        .expect("open")
        .write_all_at(&b, 1 << 20)
        .expect("write");
    assert_eq!(s.read((1 << 20) / 512, 4096).expect("read16"), b);

    // expand and delete are refused while logged in, naming the session
    let e = store.expand(&admin, &vol, 128 << 20).expect_err("in use");
    assert!(matches!(e, VolumeError::InUse { .. }), "{e}");
    assert!(e.to_string().contains(INITIATOR), "{e}");
    assert_eq!(store.info(&vol).expect("info").size, 64 << 20, "file not grown");
    let e = store.delete(&admin, &vol).expect_err("in use");
    assert!(
        e.to_string()
            .starts_with("cannot unexport volume vol-a: initiators are logged in: "),
        "{e}"
    );
    assert!(info.path.exists(), "data kept while a session remains");
    drop(s);

    let grown = store.expand(&admin, &vol, 128 << 20).expect("expand");
    assert_eq!(grown.size, 128 << 20);
    assert_eq!(read_capacity(&url), 128 << 20, "initiator sees the new size");
    let s = lib
        .connect(&portal, iqn.as_str(), INITIATOR, None)
        .expect("login after expand");
    assert_eq!(s.read(16, 8192).expect("read16"), a, "data kept across expand");
    let c = pattern(3, 4096);
    s.write((100 << 20) / 512, &c).expect("write beyond the old end");
    assert_eq!(s.read((100 << 20) / 512, 4096).expect("read16"), c);
    drop(s);
    let e = store.expand(&admin, &vol, 64 << 20).expect_err("shrink");
    assert!(e.to_string().contains("volumes only grow"), "{e}");

    store.delete(&admin, &vol).expect("delete");
    assert!(!info.path.exists(), "file removed");
    assert!(admin.find_target(&iqn).expect("show").is_none(), "target removed");
    let (ok, _) = tool("iscsi-inq", &[&url]);
    assert!(!ok, "nothing served after delete");
    assert!(store.list().expect("list").is_empty());
}

#[test]
fn reexport_after_tgtd_restart_and_crash() {
    if !ready("reexport_after_tgtd_restart_and_crash") {
        return;
    }
    let data = tempfile::tempdir().expect("data dir");
    let run = data.path().join("run/tgtd");
    let mut tgtd = TestTgtd::start(&run);
    let store = V1Store::new(data.path());
    let lib = Libiscsi::load().expect("libiscsi");
    let portal = tgtd.cfg.portal.to_string();
    let vols = [name("r1"), name("r2")];
    let a = pattern(42, 4096);
    for v in &vols {
        store.create(v, 8 << 20).expect("create");
        store.export(&tgtd.get().admin(), v, &loopback()).expect("export");
    }
    let s = lib
        .connect(&portal, Iqn::for_volume(&vols[1]).as_str(), INITIATOR, None)
        .expect("login");
    s.write(0, &a).expect("write");
    drop(s);

    // clean restart: stop deletes every target, a new tgtd serves nothing until re-export
    tgtd.tgtd.take().expect("running").stop().expect("stop");
    tgtd.tgtd = Some(talon::tgt::Tgtd::start(tgtd.cfg.clone()).expect("restart"));
    let admin = tgtd.get().admin();
    assert!(admin.show().expect("show").is_empty());
    let report = store.reexport_all(&admin, |_| loopback());
    assert!(
        report.failed.is_empty() && report.list_error.is_none(),
        "{report:?}"
    );
    assert_eq!(report.exported.len(), 2);
    for v in &vols {
        let url = tgtd.url(Iqn::for_volume(v).as_str());
        assert_eq!(read_capacity(&url), 8 << 20, "{v} served again");
    }

    // crash: SIGKILL; the death is detected, a new tgtd starts, volumes come back
    let pid = tgtd.get().pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    let mut alive = true;
    for _ in 0..200 {
        alive = tgtd.get().is_alive();
        if !alive {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!alive, "death of tgtd {pid} detected");
    tgtd.tgtd = Some(talon::tgt::Tgtd::start(tgtd.cfg.clone()).expect("start after crash"));
    let admin = tgtd.get().admin();
    let report = store.reexport_all(&admin, |_| loopback());
    assert_eq!(report.exported.len(), 2, "{report:?}");
    let s = lib
        .connect(&portal, Iqn::for_volume(&vols[1]).as_str(), INITIATOR, None)
        .expect("login");
    assert_eq!(s.read(0, 4096).expect("read"), a, "data survived the crash");
}

#[test]
fn acl_and_chap_refuse_strangers() {
    if !ready("acl_and_chap_refuse_strangers") {
        return;
    }
    let data = tempfile::tempdir().expect("data dir");
    let mut tgtd = TestTgtd::start(&data.path().join("run/tgtd"));
    let admin = tgtd.get().admin();
    let store = V1Store::new(data.path());
    let lib = Libiscsi::load().expect("libiscsi");
    let portal = tgtd.cfg.portal.to_string();

    // by initiator name
    let v = name("acl-name");
    let iqn = Iqn::for_volume(&v);
    store.create(&v, 4 << 20).expect("create");
    let allowed = Iqn::parse(INITIATOR).expect("iqn");
    let by_name = ExportOptions {
        initiators: vec![InitiatorAcl::Name(allowed)],
        chap: None,
    };
    store.export(&admin, &v, &by_name).expect("export");
    let url = tgtd.url(iqn.as_str());
    let (ok, out) = tool("iscsi-inq", &["-i", INITIATOR, &url]);
    assert!(ok, "allowed initiator refused: {out}");
    let (ok, out) = tool("iscsi-inq", &["-i", "iqn.2025-01.io.example:stranger", &url]);
    assert!(!ok, "stranger admitted: {out}");
    assert!(
        lib.connect(&portal, iqn.as_str(), "iqn.2025-01.io.example:stranger", None)
            .is_err()
    );

    // by address: only 10.9.9.9 may log in, 127.0.0.1 is refused
    let v2 = name("acl-addr");
    store.create(&v2, 4 << 20).expect("create");
    let elsewhere = ExportOptions {
        initiators: vec![InitiatorAcl::Address("10.9.9.9".parse().expect("ip"))],
        chap: None,
    };
    store.export(&admin, &v2, &elsewhere).expect("export");
    let err = lib
        .connect(&portal, Iqn::for_volume(&v2).as_str(), INITIATOR, None)
        .err();
    assert!(err.is_some(), "127.0.0.1 admitted");
    // re-export with loopback allowed: the ACL is brought to the new set
    store.export(&admin, &v2, &loopback()).expect("re-export");
    let t = admin
        .find_target(&Iqn::for_volume(&v2))
        .expect("show")
        .expect("target");
    assert_eq!(t.acl, vec!["127.0.0.1"]);
    lib.connect(&portal, Iqn::for_volume(&v2).as_str(), INITIATOR, None)
        .expect("now allowed");

    // CHAP
    let v3 = name("chap");
    store.create(&v3, 4 << 20).expect("create");
    let user = ChapUser::parse("talon-chap").expect("user");
    let secret = ChapSecret::parse("s3cret-s3cret").expect("secret");
    let opts = ExportOptions {
        initiators: vec![InitiatorAcl::All],
        chap: Some(ChapCredentials {
            user: user.clone(),
            secret: secret.clone(),
        }),
    };
    let creds = opts.chap.clone().expect("chap");
    // the account reaches tgtd over its control socket (no argv)
    ensure_chap_account(&admin, &creds, false).expect("CHAP account");
    assert_eq!(admin.accounts().expect("accounts"), vec!["talon-chap"]);
    store.export(&admin, &v3, &opts).expect("export with CHAP");
    let iqn3 = Iqn::for_volume(&v3);
    assert!(
        lib.connect(&portal, iqn3.as_str(), INITIATOR, None).is_err(),
        "no CHAP admitted"
    );
    assert!(
        lib.connect(
            &portal,
            iqn3.as_str(),
            INITIATOR,
            Some(("talon-chap", "wrong-secret-x"))
        )
        .is_err()
    );
    let s = lib
        .connect(
            &portal,
            iqn3.as_str(),
            INITIATOR,
            Some((user.as_str(), secret.expose())),
        )
        .expect("CHAP login");
    s.write(0, &pattern(1, 512)).expect("write");
    drop(s);
    let t = admin.find_target(&iqn3).expect("show").expect("target");
    assert_eq!(t.accounts, vec!["talon-chap"]);
    // re-export (after a talon restart) keeps CHAP working
    store.export(&admin, &v3, &opts).expect("re-export with CHAP");
    lib.connect(
        &portal,
        iqn3.as_str(),
        INITIATOR,
        Some((user.as_str(), secret.expose())),
    )
    .expect("CHAP again");
}

#[test]
fn snapshot_and_clone_on_xfs_with_reflink() {
    if !ready("snapshot_and_clone_on_xfs_with_reflink") {
        return;
    }
    let xfs = match LoopFs::new(320, &["mkfs.xfs", "-q", "-m", "reflink=1"]) {
        Ok(fs) => fs,
        Err(reason) => {
            eprintln!("SKIP snapshot_and_clone_on_xfs_with_reflink: {reason}");
            return;
        }
    };
    let run = tempfile::tempdir().expect("run dir");
    let mut tgtd = TestTgtd::start(run.path());
    let admin = tgtd.get().admin();
    let store = V1Store::new(xfs.path());
    let lib = Libiscsi::load().expect("libiscsi");
    let portal = tgtd.cfg.portal.to_string();
    let vol = name("src");
    let (snap, clone) = (ObjectName::parse("snapshot", "s1").expect("name"), name("copy"));
    store.create(&vol, 32 << 20).expect("create");
    store.export(&admin, &vol, &loopback()).expect("export");
    let (a, b) = (pattern(10, 65536), pattern(20, 65536));
    {
        let s = lib
            .connect(&portal, Iqn::for_volume(&vol).as_str(), INITIATOR, None)
            .expect("login");
        s.write(2048, &a).expect("write a");
        // snapshot while logged in and serving
        let info = store.snapshot(&vol, &snap).expect("snapshot");
        assert_eq!(info.size, 32 << 20);
        s.write(2048, &b).expect("write b");
        assert_eq!(s.read(2048, 65536).expect("read"), b);
    }
    let e = store.snapshot(&vol, &snap).expect_err("exists");
    assert!(matches!(e, VolumeError::SnapshotExists { .. }), "{e}");
    assert_eq!(store.list_snapshots(&vol).expect("list").len(), 1);

    store.clone_snapshot(&vol, &snap, &clone).expect("clone");
    store.export(&admin, &clone, &loopback()).expect("export clone");
    let s = lib
        .connect(&portal, Iqn::for_volume(&clone).as_str(), INITIATOR, None)
        .expect("login clone");
    assert_eq!(
        s.read(2048, 65536).expect("read clone"),
        a,
        "clone has the snapshot's data"
    );
    drop(s);
    let e = store
        .clone_snapshot(&vol, &snap, &clone)
        .expect_err("clone exists");
    assert!(matches!(e, VolumeError::Exists { .. }), "{e}");

    // a clone survives the deletion of its source and snapshot
    store.delete(&admin, &vol).expect("delete source");
    assert!(
        store.list_snapshots(&vol).expect("list").is_empty(),
        "snapshots go with the volume"
    );
    let s = lib
        .connect(&portal, Iqn::for_volume(&clone).as_str(), INITIATOR, None)
        .expect("login clone");
    assert_eq!(s.read(2048, 65536).expect("read clone"), a);
    drop(s);
    store.delete(&admin, &clone).expect("delete clone");
    drop(tgtd);
}

#[test]
fn snapshot_on_ext4_is_a_clear_error() {
    // the root filesystem here is ext4; any non-reflink fs will do
    let dir = tempfile::tempdir().expect("tempdir");
    let store = V1Store::new(dir.path());
    let vol = name("plain");
    store.create(&vol, 1 << 20).expect("create");
    let snap = ObjectName::parse("snapshot", "s").expect("name");
    match store.snapshot(&vol, &snap) {
        Err(e @ VolumeError::NoReflink { .. }) => {
            assert!(
                e.to_string()
                    .ends_with("does not support reflink (use XFS with reflink=1 or btrfs)"),
                "{e}"
            );
            assert!(!store.snapshot_path(&vol, &snap).exists());
        }
        Ok(_) => eprintln!(
            "SKIP snapshot_on_ext4_is_a_clear_error: {} supports reflink",
            dir.path().display()
        ),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// A crash at any step of an export leaves a target talon finds by name: the
/// next export adopts and completes it (LUN, ACL), a target left serving
/// another file is made again, and targets of volumes nobody wants are
/// removed, whatever they hold; targets talon did not name stay.
#[test]
fn half_made_exports_are_adopted_or_removed_by_name() {
    if !ready("half_made_exports_are_adopted_or_removed_by_name") {
        return;
    }
    let data = tempfile::tempdir().expect("data dir");
    let mut tgtd = TestTgtd::start(&data.path().join("run/tgtd"));
    let admin = tgtd.get().admin();
    let store = V1Store::new(data.path());
    let only_me = ExportOptions {
        initiators: vec![InitiatorAcl::Name(Iqn::parse(INITIATOR).expect("iqn"))],
        chap: None,
    };
    let served = |v: &ObjectName| {
        let url = tgtd.url(Iqn::for_volume(v).as_str());
        let (ok, out) = tool("iscsi-inq", &["-i", INITIATOR, &url]);
        assert!(ok, "{v} not served after adoption: {out}");
        let (ok, _) = tool("iscsi-inq", &["-i", "iqn.2025-01.io.example:other", &url]);
        assert!(!ok, "{v}: the ACL was not completed");
    };

    // crash after "create the target"
    let a = name("half-a");
    store.create(&a, 8 << 20).expect("create");
    admin.new_target(&Iqn::for_volume(&a)).expect("target only");
    store
        .export(&admin, &a, &only_me)
        .expect("adopts a target without LUN");
    served(&a);

    // crash after "add the LUN", before the ACL
    let b = name("half-b");
    let info = store.create(&b, 8 << 20).expect("create");
    let tid = admin.new_target(&Iqn::for_volume(&b)).expect("target");
    admin.new_lun(tid, 1, &info.path).expect("lun");
    assert_eq!(store.export(&admin, &b, &only_me).expect("adopts").tid, tid);
    served(&b);

    // a target of that name left serving another file (deleted and made again while down)
    let c = name("half-c");
    store.create(&c, 8 << 20).expect("create");
    let other = data.path().join("elsewhere.img");
    std::fs::File::create(&other)
        .and_then(|f| f.set_len(4 << 20))
        .expect("other file");
    let tid = admin.new_target(&Iqn::for_volume(&c)).expect("target");
    admin.new_lun(tid, 1, &other).expect("lun");
    store.export(&admin, &c, &only_me).expect("made again");
    served(&c);

    // orphans: talon's names without a volume, in any state; another tool's target stays
    let gone = name("gone");
    admin
        .new_target(&Iqn::for_volume(&gone))
        .expect("orphan without LUN");
    let gone2 = name("gone-2");
    let tid = admin.new_target(&Iqn::for_volume(&gone2)).expect("orphan");
    admin.new_lun(tid, 1, &other).expect("lun");
    let foreign = Iqn::parse("iqn.2025-01.io.example:not-talons").expect("iqn");
    admin.new_target(&foreign).expect("another tool's target");
    let volumes: Vec<String> = store
        .list()
        .expect("list")
        .into_iter()
        .map(|v| v.name.to_string())
        .collect();
    let report = store
        .remove_orphans(&admin, |v| volumes.iter().any(|x| x == v.as_str()))
        .expect("orphans");
    let mut removed: Vec<String> = report.removed.iter().map(|i| i.to_string()).collect();
    removed.sort();
    assert_eq!(
        removed,
        [
            Iqn::for_volume(&gone).to_string(),
            Iqn::for_volume(&gone2).to_string()
        ]
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let left: Vec<String> = admin.show().expect("show").into_iter().map(|t| t.name).collect();
    for keep in [
        Iqn::for_volume(&a),
        Iqn::for_volume(&b),
        Iqn::for_volume(&c),
        foreign,
    ] {
        assert!(left.contains(&keep.to_string()), "{keep} was removed: {left:?}");
    }
    // the name is free again: a delete and a create of "gone" serve it
    store.create(&gone, 8 << 20).expect("create gone");
    store.export(&admin, &gone, &only_me).expect("export gone");
    served(&gone);
}
