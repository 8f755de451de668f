//! Longhorn's backupstore lock protocol (`lock.go`), so that talon and
//! Longhorn never delete blocks under each other's backups.
//!
//! A lock is a file `locks/lock-<16 hex>.lck` holding
//! `{"Name":..,"Type":1|2,"Acquired":bool}`; its time is the store's
//! modification time. Backups and restores (type 1) share; a deletion
//! (type 2) excludes them. To lock: write the file, wait 2 s, and give up
//! (removing the file) if a lock of the other type that is not expired
//! (150 s after its last write) comes first: acquired before not, then
//! older, then by name. Then write it acquired and rewrite it every 60 s
//! while held.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::error::BackupError;
use super::format;
use super::store::Store;

/// How long a lock lives after its last write.
const EXPIRY: Duration = Duration::from_secs(150);
/// How often a held lock is rewritten.
const REFRESH: Duration = Duration::from_secs(60);
/// The wait between writing a lock and checking the others (S3 times are
/// whole seconds).
const SETTLE: Duration = Duration::from_secs(2);

/// What a lock guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// A backup or a restore (Longhorn's type 1: they share).
    Use = 1,
    /// A deletion (type 2: alone).
    Delete = 2,
}

impl LockKind {
    fn what(self) -> &'static str {
        match self {
            LockKind::Use => "backup or restore",
            LockKind::Delete => "deletion",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LockFile {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Type")]
    kind: i64,
    #[serde(rename = "Acquired")]
    acquired: bool,
}

/// A held lock; [`Lock::release`] removes it (dropping it removes it in
/// the background).
#[derive(Debug)]
pub struct Lock {
    store: Store,
    /// The backup volume it locks, and how.
    volume: String,
    kind: LockKind,
    path: String,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
}

impl Lock {
    /// Takes a `kind` lock on backup volume `volume`, or fails at once with
    /// [`BackupError::Locked`] (as Longhorn does: no waiting).
    pub async fn acquire(store: &Store, volume: &str, kind: LockKind) -> Result<Lock, BackupError> {
        // the lock's path is made of the name: checked here, whoever calls
        format::check_backup_volume_name(volume)?;
        let name = format!("lock-{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
        let dir = format::locks_dir(volume);
        let path = format!("{dir}/{name}.lck");
        let mut mine = LockFile {
            name: name.clone(),
            kind: kind as i64,
            acquired: false,
        };
        store.write(&path, format::encode(&mine)).await?;
        let mut lock = Lock {
            store: store.clone(),
            volume: volume.to_owned(),
            kind,
            path: path.clone(),
            heartbeat: None,
        };
        tokio::time::sleep(SETTLE).await;
        let my_time = store.modified(&path).await?.unwrap_or_else(SystemTime::now);
        let now = SystemTime::now();
        for entry in store.list(&dir).await? {
            let Some(other) = entry.strip_suffix(".lck") else {
                continue;
            };
            if other == name {
                continue;
            }
            let p = format!("{dir}/{entry}");
            let (Some(bytes), Some(at)) = (store.read(&p).await?, store.modified(&p).await?) else {
                continue;
            };
            let Ok(l) = serde_json::from_slice::<LockFile>(&bytes) else {
                continue;
            };
            let expired = now.duration_since(at).unwrap_or_default() > EXPIRY;
            let before = (!l.acquired, at, l.name.as_str()) < (!mine.acquired, my_time, name.as_str());
            if l.kind != kind as i64 && !expired && before {
                lock.release().await;
                let held = if l.kind == LockKind::Delete as i64 {
                    LockKind::Delete.what()
                } else {
                    LockKind::Use.what()
                };
                return Err(BackupError::Locked {
                    volume: volume.to_owned(),
                    held,
                });
            }
        }
        mine.acquired = true;
        let body = format::encode(&mine);
        store.write(&path, body.clone()).await?;
        let (s, p) = (store.clone(), path);
        lock.heartbeat = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH).await;
                if let Err(e) = s.write(&p, body.clone()).await {
                    tracing::warn!(lock = %p, error = %e, "refreshing a backupstore lock");
                }
            }
        }));
        Ok(lock)
    }

    /// Runs `work` under a `kind` lock on `volume`, and releases the lock
    /// whatever `work` returns.
    pub async fn holding<T>(
        store: &Store,
        volume: &str,
        kind: LockKind,
        work: impl Future<Output = Result<T, BackupError>>,
    ) -> Result<T, BackupError> {
        let lock = Lock::acquire(store, volume, kind).await?;
        let out = work.await;
        lock.release().await;
        out
    }

    /// Whether it is a `kind` lock on backup volume `volume`.
    pub fn covers(&self, volume: &str, kind: LockKind) -> bool {
        self.volume == volume && self.kind == kind
    }

    /// Stops refreshing and removes the lock file.
    pub async fn release(mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        let path = std::mem::take(&mut self.path);
        if let Err(e) = self.store.remove(&path).await {
            tracing::warn!(lock = %path, error = %e, "removing a backupstore lock (it expires in 150 s)");
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        if self.path.is_empty() {
            return;
        }
        let (store, path) = (self.store.clone(), std::mem::take(&mut self.path));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = store.remove(&path).await;
            });
        }
    }
}
