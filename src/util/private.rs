//! Files only root reads: the run directory talon makes, the staging
//! copies of volumes' data (backups, restores, snapshot hashes) and the targets'
//! logs (tgtd's names the initiators of failed CHAP logins; spdk_tgt's, the
//! NQNs of every host). Logs are made so at creation and mended when found
//! otherwise (a log an earlier talon left 0644).

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Creates `dir` (and its parents) 0700. An existing directory keeps its
/// mode: it may be one the host shares (`--run-dir /run`); what talon puts
/// in it is private by itself (logs 0600, sockets root's).
pub fn dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Opens log `path` for appending, created 0600 (an existing one made
/// 0600); `fresh` empties it first.
pub fn log(path: &Path, fresh: bool) -> io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(Permissions::from_mode(0o600))?;
    if fresh {
        f.set_len(0)?;
    }
    Ok(f)
}

/// Creates file `path` empty (truncating one that is there), readable by
/// root only (0600, an existing one made so): a staging copy of a volume's
/// data.
pub fn file(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(Permissions::from_mode(0o600))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_run_dirs_and_every_log_are_private() {
        let t = tempfile::tempdir().expect("tempdir");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o7777;
        let run = t.path().join("a/run");
        dir(&run).expect("new private dir");
        assert_eq!(mode(&run), 0o700);
        // one the host shares keeps its mode
        let shared = t.path().join("shared");
        std::fs::create_dir(&shared).expect("mkdir");
        std::fs::set_permissions(&shared, Permissions::from_mode(0o1777)).expect("chmod");
        dir(&shared).expect("existing dir");
        assert_eq!(mode(&shared), 0o1777);

        let p = run.join("tgtd.log");
        std::fs::write(&p, b"earlier\n").expect("write");
        std::fs::set_permissions(&p, Permissions::from_mode(0o644)).expect("chmod");
        let mut f = log(&p, false).expect("log");
        io::Write::write_all(&mut f, b"more\n").expect("append");
        assert_eq!(mode(&p), 0o600);
        assert_eq!(std::fs::read(&p).expect("read"), b"earlier\nmore\n");
        drop(log(&p, true).expect("fresh"));
        assert_eq!(std::fs::read(&p).expect("read"), b"");
        drop(log(&run.join("new.log"), false).expect("new log"));
        assert_eq!(mode(&run.join("new.log")), 0o600);
    }

    #[test]
    fn staging_files_are_private_and_made_empty() {
        let t = tempfile::tempdir().expect("tempdir");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o7777;
        let p = t.path().join("b.img");
        drop(file(&p).expect("new file"));
        assert_eq!(mode(&p), 0o600);
        std::fs::write(&p, b"earlier").expect("write");
        std::fs::set_permissions(&p, Permissions::from_mode(0o644)).expect("chmod");
        drop(file(&p).expect("again"));
        assert_eq!((mode(&p), std::fs::read(&p).expect("read").len()), (0o600, 0));
    }
}
