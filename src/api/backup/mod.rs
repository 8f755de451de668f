//! Backup methods: talon's `Backup`s of volumes' snapshots (desired state,
//! carried out by the engine's backup controller) and what a backup target
//! holds, talon's and Longhorn's backups alike. One module each: `create`,
//! `read` (list, get), `delete`, `store` (what a target holds), `restore`
//! and `activate` (a standby volume served); this file keeps what they
//! share: the backup view, the store's errors and credentials.
//!
//! ```text
//!   backup_create ──validate──> Backup (config, persisted) ──> engine.BackupController ──> BackupStatus
//!        └─ wait=true: watch BackupStatus/<name> until completed or error (bounded)
//!   backup_delete ──fromStore──> backupstore::ops::delete (the target), then the Backup goes
//!   backup_store_list ──> backupstore::ops::{volumes, volume, complete_backups} (the target)
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::{ApiError, ErrorKind};
use super::volume::{
    LIFECYCLE, NameParams, OnTarget, exists_as, live_snapshot, live_volume, wait_for, wait_gone, wait_timeout,
};
use super::{ApiBuilder, ApiContext};
use crate::backupstore::store::{Caller, Target};
use crate::backupstore::{BackupError, Compression, Credentials, Store, format, ops};
use crate::names::ObjectName;
use crate::resources::backup::{Backup, BackupState, BackupStatus};
use crate::resources::config::{RemoteReplica, snapshot_id};
use crate::resources::engine::{EngineStatus, ObjectState};
use crate::runtime::{Destroyed, Phase, Spec, State, Typed};

mod activate;
mod create;
mod delete;
mod read;
mod restore;
mod store;

pub use create::BackupCreateParams;
pub use delete::{BackupDeleteParams, BackupDeleteResult};
pub use read::{BackupGetParams, BackupListParams};
pub use restore::BackupRestoreParams;
pub use store::{BackupStoreListParams, StoreBackupView, StoreVolumeView};

/// A backup with its status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupView {
    /// The backup's name.
    pub name: String,
    /// Desired state.
    pub spec: Backup,
    /// Phase.
    pub phase: Phase,
    /// How it went, once the backup controller has seen it.
    pub status: Option<BackupStatus>,
}

/// A backupstore error in the API's words, naming `what`.
fn store_error(what: &str, e: BackupError) -> ApiError {
    let kind = match &e {
        BackupError::Target { .. }
        | BackupError::InvalidName { .. }
        | BackupError::NameTooLong { .. }
        | BackupError::Invalid(_) => ErrorKind::InvalidParams,
        BackupError::NotFound(_) | BackupError::TargetMissing { .. } => ErrorKind::NotFound,
        BackupError::Locked { .. } | BackupError::Format { .. } | BackupError::CorruptBlock { .. } => {
            ErrorKind::FailedPrecondition
        }
        // the store did not answer, or a local file did not read
        _ => ErrorKind::Unavailable,
    };
    // no object named twice ("backup target \"x\": backup target \"x\": ...")
    let text = e.to_string();
    let message = if text.starts_with(&format!("{what}:")) {
        text
    } else {
        format!("{what}: {text}")
    };
    ApiError::new(kind, message)
}

/// Whether `name` is a Kubernetes object name (a DNS-1123 subdomain:
/// lowercase letters, digits, `-` and `.`, a letter or digit at each end,
/// at most 253 characters), as a Secret's name is.
fn kubernetes_name(name: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=253).contains(&name.len())
        && name.chars().all(|c| ok(c) || c == '-' || c == '.')
        && name.starts_with(ok)
        && name.ends_with(ok)
        && !name.contains("..")
}

/// The credentials of secret `name` given to `what`: a Kubernetes secret
/// given to this node, `<backupSecretsDir>/<name>` (a mounted secret
/// folder or a Secret manifest file), never a path; with where they were
/// read (what a spec records). No name: none. A name that is not there is
/// an error, never "no credentials".
fn secret_of(
    state: &State,
    what: &str,
    name: Option<&str>,
) -> Result<(Option<String>, Credentials), ApiError> {
    let Some(name) = name else {
        return Ok((None, Credentials::none()));
    };
    let dir = state
        .get_typed::<crate::resources::config::NodeConfig>("node")?
        .map(|n| n.spec.backup_secrets_dir())
        .unwrap_or_else(|| crate::resources::config::NodeConfig::default().backup_secrets_dir());
    if !kubernetes_name(name) {
        return Err(ApiError::invalid(format!(
            "{what}: credential secret {name:?} is not a Kubernetes secret name (lowercase letters, digits, \
             '-' and '.'): name a secret given to this node, in its backupSecretsDir {}",
            dir.display()
        )));
    }
    let path = dir.join(name);
    if !path.exists() {
        return Err(ApiError::not_found(format!(
            "{what}: credential secret {name:?} not found: there is no {} on this node (its backupSecretsDir)",
            path.display()
        )));
    }
    let creds = Credentials::from_secret(&path)
        .map_err(|e| ApiError::invalid(format!("{what}: credential secret {name:?}: {e}")))?;
    creds
        .check()
        .map_err(|e| ApiError::invalid(format!("{what}: credential secret {name:?}: {e}")))?;
    Ok((Some(path.display().to_string()), creds))
}

/// Target `url` as the admin API takes it ([`Target::checked`]: any
/// absolute folder, no `.` or `..`).
fn check_target(what: &str, url: &str) -> Result<Target, ApiError> {
    Target::checked(url, &Caller::Admin).map_err(|e| store_error(what, e))
}

/// The store of `target` with the credentials of secret `name` (a caller's).
fn open_store(state: &State, what: &str, target: &str, name: Option<&str>) -> Result<Store, ApiError> {
    check_target(what, target)?;
    let (_, creds) = secret_of(state, what, name)?;
    Store::open(target, &creds).map_err(|e| store_error(what, e))
}

/// The store of a recorded spec's `target`, with the credentials read from
/// `path` (where the secret was found when the spec was made).
fn open_recorded(what: &str, target: &str, path: Option<&str>) -> Result<Store, ApiError> {
    let creds = match path {
        Some(p) => Credentials::from_secret(Path::new(p))
            .map_err(|e| ApiError::invalid(format!("{what}: credential secret: {e}")))?,
        None => Credentials::none(),
    };
    Store::open(target, &creds).map_err(|e| store_error(what, e))
}

fn get_backup(state: &State, name: &str) -> Result<Typed<Backup>, ApiError> {
    state
        .get_typed::<Backup>(name)?
        .ok_or_else(|| ApiError::not_found(format!("backup {name:?} not found")))
}

fn backup_view(state: &State, b: Typed<Backup>) -> Result<BackupView, ApiError> {
    let name = b.metadata.id.clone();
    Ok(BackupView {
        status: state.get_typed::<BackupStatus>(&name)?.map(|s| s.spec),
        phase: b.metadata.phase,
        spec: b.spec,
        name,
    })
}

impl OnTarget for BackupStatus {}
impl OnTarget for Backup {}

/// Registers the backup methods, in the order `rpc.discover` lists them.
pub fn register(api: &mut ApiBuilder) {
    activate::register(api);
    restore::register(api);
    create::register(api);
    read::register(api);
    delete::register(api);
    store::register(api);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};

    use super::super::volume::get_volume;
    use super::super::volume::lifecycle_tests::{api_with, call};
    use super::*;

    #[tokio::test]
    async fn a_standby_volume_is_refused_what_needs_it_served_until_it_is_activated() {
        let state = State::in_memory();
        let m = api_with(&state, "", register);
        state
            .create(
                "config",
                "Volume",
                "dr",
                "",
                json!({"sizeBytes": 1 << 20, "engine": "v2", "standby": true,
                       "fromBackup": {"target": "vfs:///nonexistent", "backupVolume": "v", "backup": "b"}}),
                BTreeMap::new(),
            )
            .expect("volume");
        for (method, params) in [
            ("volume_attach", json!({"name": "dr"})),
            ("snapshot_create", json!({"volume": "dr", "name": "s"})),
            ("volume_expand", json!({"name": "dr", "sizeBytes": 2 << 20})),
            (
                "volume_clone",
                json!({"name": "c", "volume": "dr", "snapshot": "s"}),
            ),
            ("volume_revert", json!({"volume": "dr", "name": "s"})),
        ] {
            let (code, msg) = call(&m, method, params).await.expect_err(method);
            assert_eq!(code, ErrorKind::FailedPrecondition.code(), "{method}: {msg}");
            assert!(
                msg.contains("\"dr\" is a standby (DR) volume") && msg.contains("volume_activate"),
                "{method}: {msg}"
            );
        }
        assert!(state.get("config", "Attachment", "dr").is_none());
        assert!(state.get("config", "Snapshot", "dr@s").is_none());

        let v = call(&m, "volume_activate", json!({"name": "dr"}))
            .await
            .expect("volume_activate");
        assert_eq!(v["spec"]["standby"], Value::Null, "{v}");
        assert!(!get_volume(&state, "dr").expect("volume").spec.standby);
        let (code, msg) = call(&m, "volume_activate", json!({"name": "dr"}))
            .await
            .expect_err("activated twice");
        assert_eq!(code, ErrorKind::FailedPrecondition.code(), "{msg}");
        assert!(msg.contains("not a standby volume"), "{msg}");
        let (code, msg) = call(&m, "volume_activate", json!({"name": "nope"}))
            .await
            .expect_err("no such volume");
        assert_eq!(code, ErrorKind::NotFound.code(), "{msg}");

        // pollSeconds: only for a standby volume, and at least 1 (refused before the store is read)
        let restore = |extra: Value| {
            let mut p = json!({"backup": "backup-1", "backupVolume": "vol-1", "target": "vfs:///nonexistent",
                               "volume": "r"});
            for (k, v) in extra.as_object().expect("object") {
                p[k] = v.clone();
            }
            p
        };
        for (extra, says) in [
            (json!({"pollSeconds": 5}), "pollSeconds is for a standby volume"),
            (
                json!({"standby": true, "pollSeconds": 0}),
                "pollSeconds must be 1 or more",
            ),
        ] {
            let (code, msg) = call(&m, "backup_restore", restore(extra)).await.expect_err(says);
            assert_eq!(code, ErrorKind::InvalidParams.code(), "{msg}");
            assert!(msg.contains(says), "{msg}");
        }
        assert!(state.get("config", "Volume", "r").is_none());
    }

    #[test]
    fn store_errors_keep_their_kind_and_name_the_object() {
        let e = store_error("backup b1", BackupError::NotFound("backup b1 of volume v".into()));
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(
            e.message.starts_with("backup b1: backup b1 of volume v"),
            "{}",
            e.message
        );
        let e = store_error(
            "backup target \"cifs://x\"",
            BackupError::Target {
                url: "cifs://x".into(),
                reason: "not supported".into(),
            },
        );
        assert_eq!(e.message, "backup target \"cifs://x\": not supported");
        assert_eq!(e.kind, ErrorKind::InvalidParams);
        let e = store_error(
            "backup b1",
            BackupError::Locked {
                volume: "v".into(),
                held: "backup",
            },
        );
        assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    }
}
