//! The persisted state store on a real filesystem that fills up: a write that
//! fails for lack of space is refused (naming the resource), nothing
//! acknowledged is lost, and once there is room again writes (deletes
//! included) work without a restart. A record another talon version wrote
//! (a field or an enum value this one does not know) is refused when the
//! store opens, naming it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use serde_json::json;
use talon::runtime::{State, StateError};

/// A tmpfs of `size` mounted on a temporary directory, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Fills the filesystem of `dir` with one file until it is full.
fn fill(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    let block = vec![0xa5u8; 64 << 10];
    loop {
        if f.write_all(&block).and_then(|()| f.sync_all()).is_err() {
            break;
        }
    }
    // and the last few bytes
    while f.write_all(&[0]).and_then(|()| f.sync_all()).is_ok() {}
    path
}

fn spec(i: usize) -> serde_json::Value {
    json!({"sizeBytes": 1u64 << 20, "pad": "x".repeat(2048), "i": i})
}

#[test]
fn a_full_disk_fails_writes_clearly_and_they_work_again_without_a_restart() {
    let test = "a_full_disk_fails_writes_clearly_and_they_work_again_without_a_restart";
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {test}: needs root (mounts a tmpfs)");
        return;
    }
    let fs = match Tmpfs::mount("4m") {
        Ok(f) => f,
        Err(e) => {
            eprintln!("SKIP {test}: cannot mount a tmpfs: {e}");
            return;
        }
    };
    let db = fs.path().join("state.redb");
    let state = State::open(&db).expect("open");
    let create = |id: &str, i| state.create("config", "Volume", id, "", spec(i), BTreeMap::new());
    create("before", 0).expect("create before the disk fills");
    let filler = fill(fs.path());

    // writes fail now (redb may still have room in its file for a few)
    let mut acked = vec!["before".to_string()];
    let mut refused = None;
    for i in 1..=2000 {
        let id = format!("v{i}");
        match create(&id, i) {
            Ok(_) => acked.push(id),
            Err(e) => {
                refused = Some((id, e));
                break;
            }
        }
    }
    let (id, e) = refused.expect("a full filesystem refuses a write");
    assert!(matches!(e, StateError::Persist { .. }), "{e:?}");
    assert!(e.to_string().contains(&format!("Volume \"{id}\"")), "{e}");
    assert!(
        state.get("config", "Volume", &id).is_none(),
        "a refused create is not kept"
    );
    // still full: still refused, and the store keeps answering reads
    assert!(create(&id, 0).is_err());
    assert!(state.get("config", "Volume", "before").is_some());

    // room again: the very next writes work, a delete included, with no restart
    std::fs::remove_file(&filler).expect("free space");
    create(&id, 0).expect("a create after space came back");
    acked.push(id);
    state
        .destroy("config", "Volume", "before", "")
        .expect("a delete after space came back");
    acked.retain(|a| a != "before");
    drop(state);

    // what was acknowledged is what a restart finds
    let state = State::open(&db).expect("reopen");
    let mut found: Vec<String> = state
        .list("config", "Volume")
        .into_iter()
        .map(|r| r.metadata.id)
        .collect();
    found.sort();
    acked.sort();
    assert_eq!(found, acked);
}

/// A record a newer talon wrote (a field or an enum value this talon does not
/// know) is refused when the store opens, naming the record, what did not
/// decode and what to do, instead of being loaded for its controllers to fail
/// on forever ("spec of volume ... does not decode"). A record of a type this
/// talon does not know is loaded as it is (nothing of this talon reads it).
#[test]
fn a_record_this_talon_cannot_read_is_refused_at_open_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("state.redb");
    let types = talon::resources::registry();
    let write = |id: &str, ty: &str, spec: serde_json::Value| {
        let s = State::open(&db).expect("open");
        s.create("config", ty, id, "", spec, BTreeMap::new())
            .expect("record");
    };
    write("good", "Volume", json!({"sizeBytes": 1u64 << 20, "engine": "v1"}));
    write("x", "TypeOfANewerTalon", json!({"anything": 1}));
    State::open_typed(&db, &types).expect("a store this talon wrote opens");

    for (id, spec, what) in [
        (
            "newer-field",
            json!({"sizeBytes": 1u64 << 20, "stripes": 4}),
            "unknown field `stripes`",
        ),
        (
            "newer-engine",
            json!({"sizeBytes": 1u64 << 20, "engine": "v3"}),
            "unknown variant `v3`",
        ),
    ] {
        write(id, "Volume", spec);
        let e = State::open_typed(&db, &types).expect_err(id);
        assert!(matches!(e, StateError::Unreadable { .. }), "{e:?}");
        let msg = e.to_string();
        for part in [
            db.display().to_string(),
            format!("Volume \"{id}\""),
            what.to_string(),
            "run the talon version that wrote it".to_string(),
        ] {
            assert!(msg.contains(&part), "{part:?} not in: {msg}");
        }
        // the refusal leaves the store as it was: the record is still there
        let s = State::open(&db).expect("open untyped");
        assert!(s.get("config", "Volume", id).is_some(), "{id} kept");
        s.destroy("config", "Volume", id, "").expect("remove the record");
    }
    let s = State::open_typed(&db, &types).expect("opens once the record is gone");
    assert!(s.get("config", "Volume", "good").is_some());
    assert!(s.get("config", "TypeOfANewerTalon", "x").is_some());
}
