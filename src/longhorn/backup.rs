//! Longhorn's backup calls as desired state: a backup of an engine's
//! snapshot becomes a talon `Backup` whose source is one replica's snapshot
//! lvol, carried out by `engine.BackupController` like a talon volume's
//! backup; its status is read back from `BackupStatus`.
//!
//! ```text
//!   backup monitor ── proxy SnapshotBackup(engine, snapshot, backup, target, envs)
//!       a replica in service (RW), this node's first:
//!         local ──> ReplicaBackupCreate here ──┐
//!         remote ─> its node's SPDKService ReplicaBackupCreate
//!                                               v
//!                 config/Backup <name> {volume, snapshot, target, credentials,
//!                                       longhorn: {replica, snapshotCreated}}
//!   SnapshotBackupStatus(backup, replica address) ── BackupStatus <name>
//!       Pending|InProgress -> in_progress · Completed -> complete + URL · Error -> error
//! ```
//!
//! Credentials come with the call (`KEY=VALUE`); only the keys Longhorn's
//! instance manager allows are taken, written as one file per key (a
//! Kubernetes secret's mounted shape) under `<data dir>/backup/credentials/
//! <backup>/`, 0600; the backup controller removes them when the backup
//! ends. Backup parameters
//! (`backup-mode`, `backup-block-size`) travel to another node's replica as
//! labels under `longhorn.io/backup-parameter.`, as Longhorn's V2 engine
//! sends them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::LonghornError;
use super::proxy::Member;
use super::service::Longhorn;
use crate::backupstore::format::{Compression, DEFAULT_BLOCK_SIZE, check_backup_name};
use crate::backupstore::store::{Caller, Target};
use crate::backupstore::{BackupError, Credentials};
use crate::proto::imrpc;
use crate::proto::ptypes;
use crate::proto::spdkrpc;
use crate::resources::backup::{Backup, BackupState, BackupStatus, LonghornSource};
use crate::resources::longhorn::LonghornEngine;
use crate::runtime::Typed;
use crate::spdk::naming::longhorn::tcp;

/// The credential keys Longhorn's instance manager takes from a backup
/// call (longhorn-instance-manager `backupEnvAllowlist`); any other key
/// refuses the call.
const ALLOWED_KEYS: [&str; 15] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ENDPOINTS",
    "AWS_CERT",
    "VIRTUAL_HOSTED_STYLE",
    "AWS_SIGN_ACCEPT_ENCODING",
    "CIFS_USERNAME",
    "CIFS_PASSWORD",
    "AZBLOB_ACCOUNT_NAME",
    "AZBLOB_ACCOUNT_KEY",
    "AZBLOB_ENDPOINT",
    "AZBLOB_CERT",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
];
/// Of those, the ones talon's S3 client reads; the others must be empty.
const USED_KEYS: [&str; 5] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ENDPOINTS",
    "AWS_CERT",
    "VIRTUAL_HOSTED_STYLE",
];
/// Where backup parameters ride in a replica backup's labels.
const PARAMETER_LABEL: &str = "longhorn.io/backup-parameter.";
const BACKUP_MODE: &str = "backup-mode";
const BLOCK_SIZE: &str = "backup-block-size";

/// A backup call's credential, label or parameter that talon refuses: it
/// names the key or label, never a credential's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParameterError {
    /// A credential entry without `=`.
    #[error("a credential entry is not KEY=VALUE")]
    NotKeyValue,
    /// A credential key outside Longhorn's allowlist.
    #[error("credential key {0:?} is not one a backup target takes")]
    UnknownKey(String),
    /// A credential talon cannot honour (a proxy, CIFS, Azure).
    #[error("credential key {0} is set, but talon reaches S3 targets directly (no proxy, CIFS or Azure)")]
    Unhonoured(String),
    /// A label without `=`.
    #[error("label {0:?} is not k=v")]
    Label(String),
    /// A block size that is not a number.
    #[error("backup block size {0:?} is not a number")]
    BlockSizeNotNumber(String),
    /// A block size Longhorn's setting does not take.
    #[error("backup block size {0}: a backup's blocks are 2097152 or 16777216 bytes")]
    BlockSize(i64),
    /// A backup mode other than full or incremental.
    #[error("backup mode {0:?} is neither full nor incremental")]
    Mode(String),
}

/// `KEY=VALUE` entries as a credential map; a key outside Longhorn's
/// allowlist, or one talon cannot honour with a value, refuses the whole
/// call (the error names the key, never a value).
pub fn credentials_from_envs(envs: &[String]) -> Result<BTreeMap<String, String>, ParameterError> {
    let mut out = BTreeMap::new();
    for env in envs {
        let Some((k, v)) = env.split_once('=') else {
            return Err(ParameterError::NotKeyValue);
        };
        out.insert(k.to_owned(), v.to_owned());
    }
    check_credentials(&out)?;
    Ok(out)
}

pub(super) fn check_credentials(creds: &BTreeMap<String, String>) -> Result<(), ParameterError> {
    for (k, v) in creds {
        if !ALLOWED_KEYS.contains(&k.as_str()) {
            return Err(ParameterError::UnknownKey(k.clone()));
        }
        if !v.is_empty() && !USED_KEYS.contains(&k.as_str()) {
            return Err(ParameterError::Unhonoured(k.clone()));
        }
    }
    Ok(())
}

/// Writes `creds` as a secret folder (one 0600 file per non-empty key)
/// `<dir>/<backup>`, replacing one there.
pub(super) fn write_credentials(
    dir: &Path,
    backup: &str,
    creds: &BTreeMap<String, String>,
) -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let at = dir.join(backup);
    let _ = std::fs::remove_dir_all(&at);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&at)?;
    for (k, v) in creds.iter().filter(|(_, v)| !v.is_empty()) {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(at.join(k))?
            .write_all(v.as_bytes())?;
    }
    Ok(at)
}

type Pairs = BTreeMap<String, String>;

/// `k=v` labels and the parameters among them (`PARAMETER_LABEL<key>`).
fn split_labels(labels: &[String]) -> Result<(Pairs, Pairs), ParameterError> {
    let (mut plain, mut params) = (BTreeMap::new(), BTreeMap::new());
    for l in labels {
        let Some((k, v)) = l.split_once('=') else {
            return Err(ParameterError::Label(l.clone()));
        };
        match k.strip_prefix(PARAMETER_LABEL) {
            Some(p) => params.insert(p.to_owned(), v.to_owned()),
            None => plain.insert(k.to_owned(), v.to_owned()),
        };
    }
    Ok((plain, params))
}

/// What parameters ask: a full backup or not, and the block size (2 MiB
/// or 16 MiB, as Longhorn's `backup-block-size` setting takes; empty or 0:
/// 2 MiB).
fn backup_params(params: &BTreeMap<String, String>) -> Result<(bool, u64), ParameterError> {
    let mut block = DEFAULT_BLOCK_SIZE;
    if let Some(bs) = params.get(BLOCK_SIZE).filter(|s| !s.is_empty()) {
        let n: i64 = bs
            .parse()
            .map_err(|_| ParameterError::BlockSizeNotNumber(bs.clone()))?;
        if n > 0 {
            block = n as u64;
        }
        if n < 0 || !crate::backupstore::ops::BLOCK_SIZES.contains(&block) {
            return Err(ParameterError::BlockSize(n));
        }
    }
    let full = match params.get(BACKUP_MODE).map(String::as_str) {
        None | Some("" | "incremental") => false,
        Some("full") => true,
        Some(other) => return Err(ParameterError::Mode(other.to_owned())),
    };
    Ok((full, block))
}

/// Whether the store at `target` holds a complete backup of `volume` (a
/// new backup then builds on it); no answer within 10 s, or an error: no.
async fn has_backups(target: &str, creds: &Pairs, volume: &str) -> bool {
    let Ok(store) = crate::backupstore::Store::open(
        target,
        &crate::backupstore::Credentials::from_pairs(creds.clone()),
    ) else {
        return false;
    };
    let last = crate::backupstore::ops::last_backup(&store, volume);
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(10), last).await,
        Ok(Ok(Some(_)))
    )
}

/// Longhorn's words for a backup's state.
fn backup_state(s: BackupState) -> &'static str {
    match s {
        BackupState::Pending | BackupState::InProgress => "in_progress",
        BackupState::Completed => "complete",
        BackupState::Error => "error",
    }
}

impl Longhorn {
    /// Who Longhorn's callers are to the backup target check: unauthenticated,
    /// so a folder target only under the node's `backupFolderRoot`.
    pub(super) fn caller(&self) -> Caller {
        let node = self
            .state()
            .get_typed::<crate::resources::config::NodeConfig>("node")
            .ok()
            .flatten();
        Caller::Longhorn {
            folder_root: node.and_then(|n| n.spec.backup_folder_root).map(PathBuf::from),
        }
    }

    /// Refuses a target URL a Longhorn caller may not name ([`Target::checked`]).
    pub(super) fn check_target(&self, url: &str) -> Result<(), BackupError> {
        Target::checked(url, &self.caller()).map(|_| ())
    }

    /// Where Longhorn's backup credentials are kept while a backup runs.
    fn credentials_dir(&self) -> Result<PathBuf, LonghornError> {
        self.backup_dir()
            .map(|d| d.join("credentials"))
            .ok_or_else(|| LonghornError::Refused("backups need talon's data dir (none was given)".into()))
    }

    /// A backup of local replica `req.replica_name`'s snapshot: a `Backup`
    /// resource. Asked again with the same request, the same backup.
    pub(super) async fn replica_backup_create(
        &self,
        req: spdkrpc::BackupCreateRequest,
    ) -> Result<spdkrpc::BackupCreateResponse, LonghornError> {
        let what = format!(
            "backup {} of snapshot {} of replica {}",
            req.backup_name, req.snapshot_name, req.replica_name
        );
        let bad = |e: String| LonghornError::Invalid(format!("{what}: {e}"));
        check_backup_name(&req.backup_name).map_err(|e| bad(e.to_string()))?;
        crate::spdk::naming::longhorn::instance_name("snapshot", &req.snapshot_name)
            .map_err(|e| bad(e.to_string()))?;
        self.check_target(&req.backup_target)
            .map_err(|e| bad(e.to_string()))?;
        let compression = (!req.compression_method.is_empty()).then(|| req.compression_method.clone());
        if let Some(c) = &compression {
            Compression::parse(c).map_err(|e| bad(e.to_string()))?;
        }
        let creds: BTreeMap<String, String> = req.credential.clone().into_iter().collect();
        check_credentials(&creds).map_err(|e| bad(e.to_string()))?;
        Credentials::from_pairs(creds.clone()).check().map_err(bad)?;
        let (labels, params) = split_labels(&req.labels).map_err(|e| bad(e.to_string()))?;
        let (full, block_size) = backup_params(&params).map_err(|e| bad(e.to_string()))?;
        let r = self
            .local_replica(&req.replica_name)
            .ok_or_else(|| LonghornError::Gone(format!("{what}: the replica is not on this node")))?;
        if !req.volume_name.is_empty() && r.volume != req.volume_name {
            return Err(bad(format!("the replica is of volume {}", r.volume)));
        }
        let inv = crate::spdk::volume::Inventory::load(self.client())
            .await
            .map_err(|x| LonghornError::spdk(format!("{what}: reading spdk_tgt"), x))?;
        let lvol = format!(
            "{}/{}",
            crate::spdk::volume::naming::lvstore(&r.disk),
            crate::resources::longhorn::snapshot_lvol(&req.replica_name, &req.snapshot_name)
        );
        if !inv.lvols.contains_key(&lvol) {
            return Err(LonghornError::Gone(format!(
                "{what}: could not find snapshot {} ({lvol})",
                req.snapshot_name
            )));
        }
        let created = self
            .engine(&req.engine_name)
            .ok()
            .and_then(|e| {
                e.spec
                    .snapshot_info
                    .get(&req.snapshot_name)
                    .map(|i| i.created.clone())
            })
            .unwrap_or_default();
        let dir = self.credentials_dir()?;
        let spec = Backup {
            volume: r.volume.clone(),
            snapshot: req.snapshot_name.clone(),
            target: req.backup_target.clone(),
            credential_secret: Some(dir.join(&req.backup_name).display().to_string()),
            backup_volume: None,
            full,
            labels,
            compression,
            block_size: (block_size != DEFAULT_BLOCK_SIZE).then_some(block_size),
            concurrency: u32::try_from(req.concurrent_limit).ok().filter(|n| *n > 0),
            longhorn: Some(LonghornSource {
                replica: req.replica_name.clone(),
                snapshot_created: created,
            }),
        };
        let is_incremental = match self.state().get_typed::<Backup>(&req.backup_name) {
            // asked again: the same backup (its credentials as they were)
            Ok(Some(b)) if b.spec == spec => self
                .state()
                .get_typed::<BackupStatus>(&req.backup_name)
                .ok()
                .flatten()
                .is_some_and(|s| s.spec.incremental),
            Ok(Some(_)) => {
                return Err(LonghornError::Exists(format!(
                    "{what}: a backup of that name exists with another source or target"
                )));
            }
            _ => {
                write_credentials(&dir, &req.backup_name, &creds)
                    .map_err(|e| LonghornError::internal(format!("{what}: writing its credentials"), e))?;
                if let Err(e) = self.state().create_typed(&req.backup_name, "", &spec) {
                    let _ = std::fs::remove_dir_all(dir.join(&req.backup_name));
                    return Err(LonghornError::internal(format!("{what}: recording it"), e));
                }
                !full && has_backups(&req.backup_target, &creds, &r.volume).await
            }
        };
        Ok(spdkrpc::BackupCreateResponse {
            backup: req.backup_name,
            is_incremental,
            replica_address: String::new(),
        })
    }

    /// Backup `backup`'s status on this node.
    pub(super) fn replica_backup_status(
        &self,
        backup: &str,
    ) -> Result<spdkrpc::BackupStatusResponse, LonghornError> {
        let b = self
            .state()
            .get_typed::<Backup>(backup)
            .map_err(|e| LonghornError::internal(format!("backup {backup}"), e))?
            .ok_or_else(|| LonghornError::Gone(format!("backup {backup} is not on this node")))?;
        let s = self
            .state()
            .get_typed::<BackupStatus>(backup)
            .map_err(|e| LonghornError::internal(format!("backup {backup}"), e))?
            .map(|s| s.spec)
            .unwrap_or_default();
        Ok(spdkrpc::BackupStatusResponse {
            progress: s.progress as i32,
            backup_url: if s.state == BackupState::Completed {
                s.url
            } else {
                String::new()
            },
            error: if s.state == BackupState::Error {
                s.message
            } else {
                String::new()
            },
            snapshot_name: b.spec.snapshot.clone(),
            state: backup_state(s.state).into(),
            replica_address: String::new(),
        })
    }

    /// The proxy's `SnapshotBackup` of engine `e`: the backup of a replica in
    /// service, this node's if it has one.
    pub(super) async fn engine_backup(
        &self,
        e: &Typed<LonghornEngine>,
        req: imrpc::EngineSnapshotBackupRequest,
    ) -> Result<imrpc::EngineSnapshotBackupProxyResponse, LonghornError> {
        let what = format!("backup {} of engine {}", req.backup_name, e.id());
        if req.snapshot_name.is_empty() || req.snapshot_name == super::proxy::VOLUME_HEAD {
            return Err(LonghornError::Invalid(format!(
                "{what}: name a snapshot (not {:?})",
                req.snapshot_name
            )));
        }
        let creds =
            credentials_from_envs(&req.envs).map_err(|x| LonghornError::Invalid(format!("{what}: {x}")))?;
        // refused here, before a replica (maybe on another node) is asked
        self.check_target(&req.backup_target)
            .map_err(|e| e.to_string())
            .and_then(|()| Credentials::from_pairs(creds.clone()).check())
            .map_err(|x| LonghornError::Invalid(format!("{what}: {x}")))?;
        let mut labels: Vec<String> = req.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.extend([BACKUP_MODE, BLOCK_SIZE].iter().filter_map(|k| {
            req.parameters
                .get(*k)
                .map(|v| format!("{PARAMETER_LABEL}{k}={v}"))
        }));
        let members = self.members(e).await?;
        let rw: Vec<&Member> = members
            .iter()
            .filter(|m| m.mode == ptypes::ReplicaMode::Rw)
            .collect();
        let m = rw
            .iter()
            .find(|m| self.local_replica(&m.replica).is_some())
            .or_else(|| rw.first())
            .ok_or_else(|| LonghornError::Refused(format!("{what}: no replica is in service")))?;
        let ask = spdkrpc::BackupCreateRequest {
            snapshot_name: req.snapshot_name,
            backup_target: req.backup_target,
            volume_name: e.spec.volume.clone(),
            size: i64::try_from(e.spec.size_bytes).unwrap_or(i64::MAX),
            engine_name: e.id().to_owned(),
            replica_name: m.replica.clone(),
            labels,
            credential: creds.into_iter().collect(),
            backing_image_name: req.backing_image_name,
            backing_image_checksum: req.backing_image_checksum,
            backup_name: req.backup_name,
            compression_method: req.compression_method,
            concurrent_limit: req.concurrent_limit,
            storage_class_name: req.storage_class_name,
        };
        let made = if self.local_replica(&m.replica).is_some() {
            self.replica_backup_create(ask).await?
        } else {
            let mut c = self
                .replica_node(&m.replica, &m.address)
                .await
                .map_err(|x| LonghornError::within(what.clone(), x))?;
            c.replica_backup_create(ask).await?.into_inner()
        };
        Ok(imrpc::EngineSnapshotBackupProxyResponse {
            backup_id: made.backup,
            replica: tcp(&m.address),
            is_incremental: made.is_incremental,
        })
    }

    /// The proxy's `SnapshotBackupStatus`: asked of the replica at
    /// `address` (`tcp://ip:port`), or of each replica in service when
    /// empty (the first that knows the backup answers).
    pub(super) async fn engine_backup_status(
        &self,
        e: &Typed<LonghornEngine>,
        backup: &str,
        address: &str,
    ) -> Result<imrpc::EngineSnapshotBackupStatusProxyResponse, LonghornError> {
        let address = address.strip_prefix("tcp://").unwrap_or(address);
        let mut asked: Vec<(String, String)> = Vec::new();
        if address.is_empty() {
            for m in self.members(e).await? {
                if m.mode == ptypes::ReplicaMode::Rw {
                    asked.push((m.replica, m.address));
                }
            }
        } else {
            let replica = e
                .spec
                .replica_address_map
                .iter()
                .find(|(_, a)| a.as_str() == address)
                .map(|(r, _)| r.clone())
                .unwrap_or_default();
            asked.push((replica, address.to_owned()));
        }
        let mut not_found = None;
        for (replica, address) in asked {
            let got = if self.local_replica(&replica).is_some() || replica.is_empty() {
                self.replica_backup_status(backup)
            } else {
                match self.replica_node(&replica, &address).await {
                    Ok(mut c) => c
                        .replica_backup_status(spdkrpc::BackupStatusRequest {
                            backup: backup.to_owned(),
                            engine_name: e.id().to_owned(),
                            replica_address: address.clone(),
                        })
                        .await
                        .map(tonic::Response::into_inner)
                        .map_err(LonghornError::from),
                    Err(x) => Err(x),
                }
            };
            match got {
                Ok(s) => {
                    return Ok(imrpc::EngineSnapshotBackupStatusProxyResponse {
                        backup_url: s.backup_url,
                        error: s.error,
                        progress: s.progress,
                        snapshot_name: s.snapshot_name,
                        state: s.state,
                        replica_address: tcp(&address),
                    });
                }
                Err(s) if s.code() == tonic::Code::NotFound => not_found = Some(s),
                Err(s) => return Err(s),
            }
        }
        Err(not_found.unwrap_or_else(|| {
            LonghornError::Gone(format!("backup {backup}: no replica of engine {} has it", e.id()))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_take_longhorns_keys_only_and_name_the_key_never_the_value() {
        let ok = credentials_from_envs(&[
            "AWS_ACCESS_KEY_ID=ak".into(),
            "AWS_SECRET_ACCESS_KEY=s=k".into(),
            "HTTPS_PROXY=".into(),
        ])
        .expect("allowed");
        assert_eq!(ok["AWS_SECRET_ACCESS_KEY"], "s=k");
        let e = credentials_from_envs(&["LD_PRELOAD=/tmp/x.so".into()])
            .expect_err("refused")
            .to_string();
        assert!(e.contains("LD_PRELOAD") && !e.contains("/tmp/x.so"), "{e}");
        let e = credentials_from_envs(&["HTTPS_PROXY=http://secret@proxy".into()])
            .expect_err("refused")
            .to_string();
        assert!(e.contains("HTTPS_PROXY") && !e.contains("secret"), "{e}");
        assert!(credentials_from_envs(&["novalue".into()]).is_err());
    }

    #[test]
    fn parameters_ride_in_labels_as_longhorns_v2_engine_sends_them() {
        let (plain, params) = split_labels(&[
            "app=db".into(),
            "longhorn.io/backup-parameter.backup-mode=full".into(),
            "longhorn.io/backup-parameter.backup-block-size=2097152".into(),
        ])
        .expect("labels");
        assert_eq!(plain, [("app".to_owned(), "db".to_owned())].into());
        assert_eq!(backup_params(&params), Ok((true, DEFAULT_BLOCK_SIZE)));
        assert_eq!(backup_params(&BTreeMap::new()), Ok((false, DEFAULT_BLOCK_SIZE)));
        let big: BTreeMap<_, _> = [(BLOCK_SIZE.to_owned(), "16777216".to_owned())].into();
        assert_eq!(backup_params(&big), Ok((false, 16 << 20)));
        for odd in ["4194304", "-1", "2Mi"] {
            let odd: BTreeMap<_, _> = [(BLOCK_SIZE.to_owned(), odd.to_owned())].into();
            assert!(backup_params(&odd).is_err(), "{odd:?}");
        }
        let odd: BTreeMap<_, _> = [(BACKUP_MODE.to_owned(), "sometimes".to_owned())].into();
        assert!(backup_params(&odd).is_err());
    }

    #[test]
    fn credentials_are_a_secret_folder_only_root_reads() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tmp");
        let creds: BTreeMap<_, _> = [
            ("AWS_ACCESS_KEY_ID".to_owned(), "ak".to_owned()),
            ("HTTPS_PROXY".to_owned(), String::new()),
        ]
        .into();
        let at = write_credentials(dir.path(), "b1", &creds).expect("written");
        assert_eq!(
            std::fs::read_to_string(at.join("AWS_ACCESS_KEY_ID")).expect("key"),
            "ak"
        );
        assert!(!at.join("HTTPS_PROXY").exists());
        let mode = std::fs::metadata(at.join("AWS_ACCESS_KEY_ID"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // again: replaced, not refused
        write_credentials(dir.path(), "b1", &creds).expect("rewritten");
    }

    #[test]
    fn states_are_longhorns_words() {
        assert_eq!(backup_state(BackupState::Pending), "in_progress");
        assert_eq!(backup_state(BackupState::Completed), "complete");
        assert_eq!(backup_state(BackupState::Error), "error");
    }
}
