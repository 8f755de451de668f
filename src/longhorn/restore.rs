//! Longhorn's restore calls as desired state: a restore of a backup into an
//! engine becomes a `LonghornRestore` of each of its replicas, on the
//! replica's own node, carried out by `engine.LonghornRestoreController`;
//! the engine's restore status is read back from each replica's
//! `LonghornRestoreStatus`.
//!
//! ```text
//!   engine monitor ── proxy BackupRestore(engine, url, envs)
//!       every replica in service (RW), the backup's size the engine's
//!         local ──> ReplicaBackupRestore here ──┐
//!         remote ─> its node's SPDKService ReplicaBackupRestore
//!                                                v
//!                 config/LonghornRestore <replica> {target, backupVolume, backup, credentials}
//!   BackupRestoreStatus(engine) ── each replica's LonghornRestoreStatus, by tcp://address:
//!       Pending|InProgress -> isRestoring · Completed -> lastRestored · Error -> error
//! ```
//!
//! A replica restores its first backup into its new lvol; a later backup of
//! the same backup volume (a DR volume following its source) goes on from
//! the one it holds, fetching only the blocks that changed.

use std::collections::BTreeMap;

use super::error::LonghornError;
use super::service::{Longhorn, QuietRestores};
use crate::backupstore::format::check_name;
use crate::backupstore::info::decode_url;
use crate::proto::imrpc;
use crate::proto::ptypes;
use crate::proto::spdkrpc;
use crate::resources::backup::{BackupState, LonghornRestore, LonghornRestoreStatus};
use crate::resources::longhorn::LonghornEngine;
use crate::runtime::Typed;
use crate::spdk::naming::longhorn::tcp;

/// Longhorn's words for a restore's state.
fn restore_state(s: BackupState) -> &'static str {
    match s {
        BackupState::Pending | BackupState::InProgress => "in_progress",
        BackupState::Completed => "complete",
        BackupState::Error => "error",
    }
}

/// The JSON of longhorn-instance-manager's `TaskError`: the replicas that
/// refused to start, by `tcp://` address (the manager records each
/// message in that replica's restore status).
fn task_error(errors: &[(String, String)]) -> Vec<u8> {
    if errors.is_empty() {
        return Vec::new();
    }
    let list: Vec<serde_json::Value> = errors
        .iter()
        .map(|(a, m)| serde_json::json!({"Address": a, "Message": m}))
        .collect();
    serde_json::json!({ "ReplicaErrors": list })
        .to_string()
        .into_bytes()
}

/// Forgets the quiet answers when a `BackupRestore` starts and again when it ends.
struct ForgetQuiet<'a>(&'a QuietRestores);

impl<'a> ForgetQuiet<'a> {
    fn new(q: &'a QuietRestores) -> Self {
        q.forget();
        Self(q)
    }
}

impl Drop for ForgetQuiet<'_> {
    fn drop(&mut self) {
        self.0.forget();
    }
}

/// Whether a replica's restore status says it restores nothing and never did.
fn restores_nothing(s: &spdkrpc::ReplicaRestoreStatusResponse) -> bool {
    !s.is_restoring
        && s.state.is_empty()
        && s.last_restored.is_empty()
        && s.current_restoring_backup.is_empty()
        && s.error.is_empty()
        && s.backup_url.is_empty()
}

impl Longhorn {
    /// A restore of `req.backup_url` into local replica `req.replica_name`:
    /// a `LonghornRestore`. Asked again for the same backup, the same
    /// restore; for another backup of the same backup volume and target once
    /// the last is restored, an incremental restore from it (a DR volume);
    /// refused while one runs, after one failed, or from another volume.
    pub(super) fn replica_backup_restore(
        &self,
        req: spdkrpc::ReplicaBackupRestoreRequest,
    ) -> Result<(), LonghornError> {
        let what = format!(
            "restore of {} into replica {}",
            crate::backupstore::store::redact_urls(&req.backup_url),
            req.replica_name
        );
        let bad = |e: String| LonghornError::Invalid(format!("{what}: {e}"));
        let (target, backup_volume, backup) = decode_url(&req.backup_url).map_err(|e| bad(e.to_string()))?;
        let backup = backup.ok_or_else(|| bad("the URL names no backup".into()))?;
        check_name("backup", &backup).map_err(|e| bad(e.to_string()))?;
        self.check_target(&target).map_err(|e| bad(e.to_string()))?;
        let creds: BTreeMap<String, String> = req.credential.into_iter().collect();
        super::backup::check_credentials(&creds).map_err(|e| bad(e.to_string()))?;
        crate::backupstore::Credentials::from_pairs(creds.clone())
            .check()
            .map_err(bad)?;
        if self.local_replica(&req.replica_name).is_none() {
            return Err(LonghornError::Gone(format!(
                "{what}: the replica is not on this node"
            )));
        }
        let dir = self
            .backup_dir()
            .map(|d| d.join("restore-credentials"))
            .ok_or_else(|| {
                LonghornError::Refused("restores need talon's data dir (none was given)".into())
            })?;
        let mut spec = LonghornRestore {
            target,
            backup_volume,
            backup: backup.clone(),
            credential_secret: Some(dir.join(&req.replica_name).display().to_string()),
            base: None,
        };
        let id = req.replica_name.as_str();
        let have = self
            .state()
            .get_typed::<LonghornRestore>(id)
            .map_err(|e| LonghornError::internal(&what, e))?;
        if let Some(have) = &have {
            let h = &have.spec;
            if (&h.target, &h.backup_volume, &h.backup) == (&spec.target, &spec.backup_volume, &spec.backup) {
                return Ok(());
            }
            let st = self.restore_status_of(id);
            // a status of the backup asked before this one is of no restore yet
            let current = st.backup.is_empty() || st.backup == h.backup;
            match st.state {
                BackupState::Completed
                    if current && (&h.target, &h.backup_volume) == (&spec.target, &spec.backup_volume) =>
                {
                    spec.base = Some(h.backup.clone());
                }
                BackupState::Completed if current => {
                    return Err(LonghornError::Refused(format!(
                        "{what}: the replica holds backup {} of backup volume {} in {}; an incremental \
                         restore goes on from a backup of the same volume and target only",
                        h.backup, h.backup_volume, h.target
                    )));
                }
                BackupState::Error if current => {
                    return Err(LonghornError::Refused(format!(
                        "{what}: its restore of backup {} failed ({}); the replica must be made again",
                        h.backup, st.message
                    )));
                }
                _ => {
                    return Err(LonghornError::Refused(format!(
                        "{what}: restoring backup {} is already in progress",
                        h.backup
                    )));
                }
            }
        }
        super::backup::write_credentials(&dir, id, &creds)
            .map_err(|e| LonghornError::internal(format!("{what}: writing its credentials"), e))?;
        let recorded = match &have {
            None => self.state().create_typed(id, "", &spec),
            Some(h) => self.state().update_typed(id, "", Some(h.metadata.version), &spec),
        };
        if let Err(e) = recorded {
            let _ = std::fs::remove_dir_all(dir.join(id));
            return Err(LonghornError::internal(format!("{what}: recording it"), e));
        }
        Ok(())
    }

    fn restore_status_of(&self, replica: &str) -> LonghornRestoreStatus {
        self.state()
            .get_typed::<LonghornRestoreStatus>(replica)
            .ok()
            .flatten()
            .map(|s| s.spec)
            .unwrap_or_default()
    }

    /// The restore status of local replica `replica`: empty (not
    /// restoring, nothing restored) when it was never asked to restore.
    pub(super) fn replica_restore_status(
        &self,
        replica: &str,
    ) -> Result<spdkrpc::ReplicaRestoreStatusResponse, LonghornError> {
        let mut out = spdkrpc::ReplicaRestoreStatusResponse {
            replica_name: replica.to_owned(),
            ..Default::default()
        };
        let Some(r) = self
            .state()
            .get_typed::<LonghornRestore>(replica)
            .map_err(|e| LonghornError::internal(format!("restore of replica {replica}"), e))?
        else {
            return Ok(out);
        };
        let mut s = self.restore_status_of(replica);
        if !s.backup.is_empty() && s.backup != r.spec.backup {
            // the status of the backup before: this one is not started yet
            s = LonghornRestoreStatus::default();
        }
        out.backup_url = r.spec.url();
        out.state = restore_state(s.state).into();
        out.progress = s.progress as i32;
        match s.state {
            BackupState::Pending | BackupState::InProgress => {
                out.is_restoring = true;
                out.current_restoring_backup = r.spec.backup.clone();
                // what the replica held before this restore (an incremental one)
                out.last_restored = r.spec.base.clone().unwrap_or_default();
            }
            BackupState::Completed => out.last_restored = r.spec.backup.clone(),
            BackupState::Error => out.error = s.message,
        }
        Ok(out)
    }

    /// The proxy's `BackupRestore` into engine `e`: every replica restores
    /// the backup on its node. Refused before any replica is asked when a
    /// replica is not in service (an error: tried again), or when the
    /// backup is missing, incomplete or not of the engine's size (every
    /// replica's restore fails with the reason): Longhorn's V2 engine's
    /// checks.
    pub(super) async fn engine_backup_restore(
        &self,
        e: &Typed<LonghornEngine>,
        req: imrpc::EngineBackupRestoreRequest,
    ) -> Result<imrpc::EngineBackupRestoreProxyResponse, LonghornError> {
        let _forget = ForgetQuiet::new(self.quiet_restores());
        let what = format!(
            "restore of {} into engine {}",
            crate::backupstore::store::redact_urls(&req.url),
            e.id()
        );
        let bad = |x: String| LonghornError::Invalid(format!("{what}: {x}"));
        let creds = super::backup::credentials_from_envs(&req.envs).map_err(|x| bad(x.to_string()))?;
        let (target, backup_volume, backup) = decode_url(&req.url).map_err(|x| bad(x.to_string()))?;
        let backup = backup.ok_or_else(|| bad("the URL names no backup".into()))?;
        self.check_target(&target)
            .map_err(|e| e.to_string())
            .and_then(|()| crate::backupstore::Credentials::from_pairs(creds.clone()).check())
            .map_err(bad)?;
        let members = self.members(e).await?;
        if members.is_empty() {
            return Err(LonghornError::Refused(format!("{what}: no replicas available")));
        }
        if let Some(m) = members.iter().find(|m| m.mode != ptypes::ReplicaMode::Rw) {
            return Err(LonghornError::Refused(format!(
                "{what}: replica {} is in mode {:?}",
                m.address, m.mode
            )));
        }
        // the backup, read as Longhorn's engine inspects it (bounded: the store may hang)
        let store = crate::backupstore::Store::open(
            &target,
            &crate::backupstore::Credentials::from_pairs(creds.clone()),
        )
        .map_err(|x| bad(x.to_string()))?;
        let look = async {
            let cfg = crate::backupstore::ops::backup(&store, &backup_volume, &backup).await?;
            let vol = crate::backupstore::ops::volume(&store, &backup_volume).await?;
            Ok::<_, crate::backupstore::BackupError>((cfg, vol))
        };
        // a backup that cannot be restored fails every replica's restore (the manager
        // records the message in each replica's restore status, as Longhorn's V2
        // engine records it); a target that does not answer is tried again later
        let refused = |why: String| imrpc::EngineBackupRestoreProxyResponse {
            task_error: task_error(
                &members
                    .iter()
                    .map(|m| (tcp(&m.address), format!("{what}: {why}")))
                    .collect::<Vec<_>>(),
            ),
        };
        let (cfg, vol) = match tokio::time::timeout(std::time::Duration::from_secs(30), look).await {
            Ok(Ok(found)) => found,
            Ok(Err(
                x @ (crate::backupstore::BackupError::NotFound(_)
                | crate::backupstore::BackupError::Format { .. }),
            )) => return Ok(refused(x.to_string())),
            Ok(Err(x)) => return Err(LonghornError::Unavailable(format!("{what}: {x}"))),
            Err(_) => {
                return Err(LonghornError::Unavailable(format!(
                    "{what}: the backup target did not answer within 30 s"
                )));
            }
        };
        if !cfg.complete() {
            return Ok(refused(format!("backup {backup} is not complete")));
        }
        let size = vol.map_or(0, |v| v.size);
        if size != e.spec.size_bytes {
            return Ok(refused(format!(
                "the backup volume {backup_volume} size {size} must be the same as the Longhorn volume size {}",
                e.spec.size_bytes
            )));
        }
        let mut errors = Vec::new();
        // this node's replicas asked first, with no wait between them: its
        // restore controller starts them as one job (each block fetched once)
        let mut members = members;
        members.sort_by_key(|m| self.local_replica(&m.replica).is_none());
        for m in &members {
            let ask = spdkrpc::ReplicaBackupRestoreRequest {
                backup_url: req.url.clone(),
                replica_name: m.replica.clone(),
                snapshot_name: cfg.snapshot_name.clone(),
                credential: creds.clone().into_iter().collect(),
                concurrent_limit: req.concurrent_limit,
            };
            let done = if self.local_replica(&m.replica).is_some() {
                self.replica_backup_restore(ask)
            } else {
                match self.replica_node(&m.replica, &m.address).await {
                    Ok(mut c) => c
                        .replica_backup_restore(ask)
                        .await
                        .map(|_| ())
                        .map_err(LonghornError::from),
                    Err(x) => Err(x),
                }
            };
            if let Err(x) = done {
                errors.push((tcp(&m.address), x.message()));
            }
        }
        Ok(imrpc::EngineBackupRestoreProxyResponse {
            task_error: task_error(&errors),
        })
    }

    /// The proxy's `BackupRestoreStatus` of engine `e`: each replica's, by
    /// `tcp://` address.
    pub(super) async fn engine_restore_status(
        &self,
        e: &Typed<LonghornEngine>,
    ) -> Result<imrpc::EngineBackupRestoreStatusProxyResponse, LonghornError> {
        let mut out = imrpc::EngineBackupRestoreStatusProxyResponse::default();
        // the replicas on other nodes asked at once: the manager polls every
        // engine, and a poll waits for the slowest node, not for their sum
        let asks = e
            .spec
            .replica_address_map
            .iter()
            .map(|(replica, address)| async move {
                let quiet = self.quiet_restores();
                let s = if self.local_replica(replica).is_some() {
                    self.replica_restore_status(replica)?
                } else if quiet.quiet(e.id(), replica) {
                    spdkrpc::ReplicaRestoreStatusResponse {
                        replica_name: replica.clone(),
                        ..Default::default()
                    }
                } else {
                    let epoch = quiet.epoch();
                    let mut c = self.replica_node(replica, address).await.map_err(|x| {
                        LonghornError::within(format!("restore status of engine {}", e.id()), x)
                    })?;
                    let s = c
                        .replica_restore_status(spdkrpc::ReplicaRestoreStatusRequest {
                            replica_name: replica.clone(),
                        })
                        .await?
                        .into_inner();
                    if restores_nothing(&s) {
                        quiet.record(epoch, e.id(), replica);
                    }
                    s
                };
                Ok::<_, LonghornError>((address, s))
            });
        for r in futures::future::join_all(asks).await {
            let (address, s) = r?;
            out.status.insert(
                tcp(address),
                imrpc::EngineBackupRestoreStatus {
                    is_restoring: s.is_restoring,
                    last_restored: s.last_restored,
                    current_restoring_backup: s.current_restoring_backup,
                    progress: s.progress,
                    error: s.error,
                    filename: s.dest_file_name,
                    state: s.state,
                    backup_url: s.backup_url,
                },
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_errors_are_the_json_longhorns_manager_reads() {
        assert!(task_error(&[]).is_empty());
        let j: serde_json::Value =
            serde_json::from_slice(&task_error(&[("tcp://10.0.0.1:20001".into(), "no".into())]))
                .expect("json");
        assert_eq!(
            j,
            serde_json::json!({"ReplicaErrors": [{"Address": "tcp://10.0.0.1:20001", "Message": "no"}]})
        );
    }

    #[test]
    fn a_quiet_answer_is_kept_unless_a_restore_started_or_ended_while_it_was_asked() {
        let q = QuietRestores::default();
        assert!(!q.quiet("e", "r"));
        let asked = q.epoch();
        q.record(asked, "e", "r");
        assert!(q.quiet("e", "r"));
        assert!(!q.quiet("e", "other"), "per replica");
        assert!(!q.quiet("other", "r"), "per engine");
        // a BackupRestore: every answer is forgotten, at its start and at its end
        let asked = q.epoch();
        {
            let _restore = ForgetQuiet::new(&q);
            assert!(!q.quiet("e", "r"));
            // asked before the restore started, answered while it runs: not kept
            q.record(asked, "e", "r");
            assert!(!q.quiet("e", "r"));
            let during = q.epoch();
            q.record(during, "e", "r");
            assert!(q.quiet("e", "r"));
        }
        assert!(
            !q.quiet("e", "r"),
            "an answer asked while it ran is forgotten when it ends"
        );
    }

    #[test]
    fn only_a_replica_that_never_restored_is_quiet() {
        let nothing = spdkrpc::ReplicaRestoreStatusResponse {
            replica_name: "r".into(),
            ..Default::default()
        };
        assert!(restores_nothing(&nothing));
        for s in [
            spdkrpc::ReplicaRestoreStatusResponse {
                is_restoring: true,
                ..nothing.clone()
            },
            spdkrpc::ReplicaRestoreStatusResponse {
                state: "complete".into(),
                last_restored: "b".into(),
                ..nothing.clone()
            },
            spdkrpc::ReplicaRestoreStatusResponse {
                state: "error".into(),
                error: "no".into(),
                ..nothing.clone()
            },
        ] {
            assert!(!restores_nothing(&s), "{s:?}");
        }
    }

    #[test]
    fn restore_states_are_longhorns_words() {
        assert_eq!(restore_state(BackupState::Pending), "in_progress");
        assert_eq!(restore_state(BackupState::InProgress), "in_progress");
        assert_eq!(restore_state(BackupState::Completed), "complete");
        assert_eq!(restore_state(BackupState::Error), "error");
    }
}
