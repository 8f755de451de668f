//! Backup methods: talon's `Backup`s of volumes' snapshots (desired state,
//! carried out by the engine's backup controller) and what a backup target
//! holds, talon's and Longhorn's backups alike.
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
use crate::backupstore::store::Target;
use crate::backupstore::{BackupError, Compression, Credentials, Store, format, ops};
use crate::names::ObjectName;
use crate::resources::backup::{Backup, BackupState, BackupStatus};
use crate::resources::config::{RemoteReplica, snapshot_id};
use crate::resources::engine::{EngineStatus, ObjectState};
use crate::runtime::{Destroyed, Phase, Spec, State, Typed};

/// `backup_create` params.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupCreateParams {
    /// The backup's name (Longhorn's rule: a letter or digit, then letters,
    /// digits, `_.-`; 2 characters or more). Default: `backup-` and 16 hex
    /// characters.
    #[serde(default)]
    pub name: Option<String>,
    /// The volume.
    pub volume: String,
    /// The volume's snapshot to back up.
    pub snapshot: String,
    /// The backup target: `s3://<bucket>@<region>/<path>` or `vfs:///<dir>`.
    pub target: String,
    /// The target's credentials: an absolute path on this node, a mounted
    /// Kubernetes secret (one file per key) or a Secret manifest file.
    #[serde(default)]
    pub credential_secret: Option<String>,
    /// The backup volume's name in the store (default: the volume's name).
    #[serde(default)]
    pub backup_volume: Option<String>,
    /// Upload every block, not only those the store lacks.
    #[serde(default)]
    pub full: bool,
    /// Labels recorded with the backup.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Wait until the backup completed (or failed).
    #[serde(default)]
    pub wait: bool,
    /// How long to wait, in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// `backup_list` params.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupListParams {
    /// Only backups of this volume.
    #[serde(default)]
    pub volume: Option<String>,
}

/// `backup_get` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupGetParams {
    /// The backup's name.
    pub name: String,
}

/// `backup_delete` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupDeleteParams {
    /// The backup's name.
    pub name: String,
    /// First delete the backup from its target (its config, then the blocks
    /// no other backup of its backup volume maps).
    #[serde(default)]
    pub from_store: bool,
    /// Wait until the backup and its status are gone (a running backup stopped).
    #[serde(default)]
    pub wait: bool,
    /// How long to wait, in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// `backup_store_list` params.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupStoreListParams {
    /// The backup target: `s3://<bucket>@<region>/<path>` or `vfs:///<dir>`.
    pub target: String,
    /// The target's credentials (an absolute path on this node).
    #[serde(default)]
    pub credential_secret: Option<String>,
    /// Only this backup volume.
    #[serde(default)]
    pub volume: Option<String>,
}

/// `backup_restore` params: a new volume with the data of a backup.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupRestoreParams {
    /// The backup (talon's or Longhorn's).
    pub backup: String,
    /// Its backup volume in the store.
    pub backup_volume: String,
    /// The backup target: `s3://<bucket>@<region>/<path>` or `vfs:///<dir>`.
    pub target: String,
    /// The target's credentials (an absolute path on this node).
    #[serde(default)]
    pub credential_secret: Option<String>,
    /// The new volume's name.
    pub volume: String,
    /// Its size (`10GiB`; default: the backed-up volume's size, rounded up
    /// to whole MiB); never smaller than that.
    #[serde(default)]
    pub size: Option<String>,
    /// Replicas (V2, local; default 1).
    #[serde(default)]
    pub replicas: Option<u32>,
    /// The disks to place replicas on (any disk when empty).
    #[serde(default)]
    pub disks: Vec<String>,
    /// Replicas kept by other talon nodes, as `volume_create`'s (each node
    /// runs the volume with `serveReplica`): made from the restored local
    /// replicas, as a rebuild.
    #[serde(default)]
    pub remote_replicas: Vec<RemoteReplica>,
    /// A standby (DR) volume: not served; it follows the backup volume's
    /// newest complete backup (incremental restores) until `volume_activate`.
    #[serde(default)]
    pub standby: bool,
    /// A standby volume's check for a newer backup, every this many seconds
    /// (default 60, at least 1).
    #[serde(default)]
    pub poll_seconds: Option<u32>,
    /// Wait until the volume is restored and served (a standby volume:
    /// until it holds the backup).
    #[serde(default)]
    pub wait: bool,
    /// How long a wait may take (seconds; default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

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

/// What `backup_delete` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupDeleteResult {
    /// The backup.
    pub name: String,
    /// talon's record of it is gone.
    pub deleted: bool,
    /// Still being torn down.
    pub tearing_down: bool,
    /// It was deleted from its target (`fromStore`).
    pub store_deleted: bool,
    /// Blocks removed from the target with it (those no other backup maps).
    pub blocks_removed: u64,
}

/// A backup volume of a target: its `volume.cfg` facts and complete backups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoreVolumeView {
    /// The backup volume's name.
    pub name: String,
    /// The volume's size in bytes at its last backup (a restore's size).
    pub size: u64,
    /// When the backup volume was made.
    pub created_time: String,
    /// Its newest complete backup ("" when none).
    pub last_backup_name: String,
    /// That backup's snapshot's creation time.
    pub last_backup_at: String,
    /// How its blocks are compressed (`none`, `gzip`, `lz4`).
    pub compression: String,
    /// `v1` or `v2`.
    pub data_engine: String,
    /// Its complete backups, oldest snapshot first (in-progress ones are not listed).
    pub backups: Vec<StoreBackupView>,
    /// What could not be read of it ("" when all was).
    pub message: String,
}

/// A complete backup in a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoreBackupView {
    /// The backup's name.
    pub name: String,
    /// The snapshot it holds.
    pub snapshot_name: String,
    /// That snapshot's creation time.
    pub snapshot_created_at: String,
    /// When the backup completed.
    pub created_time: String,
    /// Bytes of the blocks it maps.
    pub size: u64,
    /// Whether it built on an earlier backup.
    pub is_incremental: bool,
    /// Longhorn's backup URL (`<target>?backup=<name>&volume=<volume>`).
    pub url: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// A backupstore error in the API's words, naming `what`.
fn store_error(what: &str, e: BackupError) -> ApiError {
    let kind = match &e {
        BackupError::Target { .. } | BackupError::InvalidName { .. } | BackupError::Invalid(_) => {
            ErrorKind::InvalidParams
        }
        BackupError::NotFound(_) => ErrorKind::NotFound,
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

/// A credential secret given to `what`: an absolute path on this node that
/// exists and reads as credentials.
fn check_secret(what: &str, secret: Option<&str>) -> Result<Credentials, ApiError> {
    let Some(s) = secret else {
        return Ok(Credentials::none());
    };
    let path = Path::new(s);
    if !path.is_absolute() {
        return Err(ApiError::invalid(format!(
            "{what}: credential secret {s:?} must be an absolute path on this node"
        )));
    }
    if !path.exists() {
        return Err(ApiError::invalid(format!(
            "{what}: credential secret {s:?} does not exist on this node"
        )));
    }
    Credentials::from_secret(path).map_err(|e| ApiError::invalid(format!("{what}: credential secret: {e}")))
}

/// The store of `target` with the credentials of `secret`.
fn open_store(what: &str, target: &str, secret: Option<&str>) -> Result<Store, ApiError> {
    let creds = check_secret(what, secret)?;
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

/// A new backup's name: Longhorn's form, `backup-` and 16 hex characters.
fn generated_name() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("backup-{}", &id[..16])
}

/// What a target holds of backup volume `volume`; what does not read is
/// said in `message`, the rest is listed.
async fn store_volume(store: &Store, target: &str, volume: &str) -> StoreVolumeView {
    let mut v = StoreVolumeView {
        name: volume.to_owned(),
        size: 0,
        created_time: String::new(),
        last_backup_name: String::new(),
        last_backup_at: String::new(),
        compression: String::new(),
        data_engine: String::new(),
        backups: Vec::new(),
        message: String::new(),
    };
    let mut problems = Vec::new();
    match ops::volume(store, volume).await {
        Ok(Some(cfg)) => {
            v.size = cfg.size;
            v.created_time = cfg.created_time;
            v.last_backup_name = cfg.last_backup_name;
            v.last_backup_at = cfg.last_backup_at;
            // the configs' own words: "" is gzip (Longhorn's legacy default), "" is v1
            v.compression = Compression::parse(&cfg.compression_method)
                .map(|c| c.as_str().to_owned())
                .unwrap_or(cfg.compression_method);
            v.data_engine = if cfg.data_engine.is_empty() {
                "v1".into()
            } else {
                cfg.data_engine
            };
        }
        Ok(None) => {
            problems.push("it has no volume.cfg (its first backup is in progress, or failed)".to_owned())
        }
        Err(e) => problems.push(e.to_string()),
    }
    match ops::complete_backups(store, volume).await {
        Ok(backups) => {
            v.backups = backups
                .into_iter()
                .map(|b| StoreBackupView {
                    url: format::backup_url(target, &b.name, volume),
                    name: b.name,
                    snapshot_name: b.snapshot_name,
                    snapshot_created_at: b.snapshot_created_at,
                    created_time: b.created_time,
                    size: b.size,
                    is_incremental: b.is_incremental,
                    labels: b.labels.unwrap_or_default(),
                })
                .collect();
        }
        Err(e) => problems.push(e.to_string()),
    }
    v.message = problems.join("; ");
    v
}

/// A standby volume's wait: done once it holds a backup.
fn standby_holds_a_backup(e: Option<&EngineStatus>) -> Option<Result<(), String>> {
    match e {
        Some(e) if e.state == ObjectState::Failed => Some(Err(e.message.clone())),
        Some(e) if e.state == ObjectState::Standby && e.restored_backup.is_some() => Some(Ok(())),
        _ => None,
    }
}

/// Registers the backup methods.
pub fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "volume_activate",
        "Serve a standby (DR) volume: the backup volume's newest complete backup is \
         restored, its replicas made and it is served; with wait, return once it is.",
        &[NotFound, FailedPrecondition],
        |p: NameParams, ctx: Arc<ApiContext>| async move {
            let guard = LIFECYCLE.lock().await;
            let v = super::volume::get_volume(&ctx.state, &p.name)?;
            if v.metadata.phase == Phase::TearingDown {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!("volume {:?} is being deleted; cannot activate it", p.name),
                ));
            }
            if !v.spec.standby {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!("volume {:?} is not a standby volume; nothing to activate", p.name),
                ));
            }
            let mut spec = v.spec.clone();
            spec.standby = false;
            ctx.state
                .update_typed(&p.name, "", Some(v.metadata.version), &spec)?;
            drop(guard);
            if p.wait {
                wait_for(
                    &ctx.state,
                    &p.name,
                    wait_timeout(p.timeout_seconds),
                    &format!("activating volume {}", p.name),
                    super::volume::engine_ready(spec.size_bytes),
                )
                .await?;
            }
            super::volume::view(&ctx.state, super::volume::get_volume(&ctx.state, &p.name)?)
        },
    );
    api.method(
        "backup_restore",
        "Create a V2 volume with the data of a backup (talon's or Longhorn's); with wait, \
         return once it is restored and served.",
        &[NotFound, AlreadyExists, FailedPrecondition, Unavailable],
        |p: BackupRestoreParams, ctx: Arc<ApiContext>| async move {
            use crate::resources::config::{BackupSource, EngineKind, Volume};
            let name = super::volume::volume_name(&p.volume)?;
            let what = format!("restoring backup {} into volume {name}", p.backup);
            format::check_name("backup", &p.backup).map_err(|e| store_error(&what, e))?;
            format::check_name("backup volume", &p.backup_volume).map_err(|e| store_error(&what, e))?;
            let replicas = p.replicas.unwrap_or(1);
            if !(1..=3).contains(&replicas) {
                return Err(ApiError::invalid(format!(
                    "{what}: replicas must be 1 to 3, not {replicas}"
                )));
            }
            super::volume::check_remote_replicas(&what, &p.remote_replicas)?;
            if replicas as usize + p.remote_replicas.len() > 3 {
                return Err(ApiError::invalid(format!(
                    "{what}: at most 3 replicas in all, not {replicas} local + {} remote",
                    p.remote_replicas.len()
                )));
            }
            for d in &p.disks {
                ObjectName::parse("disk", d)?;
            }
            match (p.standby, p.poll_seconds) {
                (false, Some(_)) => {
                    return Err(ApiError::invalid(format!(
                        "{what}: pollSeconds is for a standby volume (standby: true)"
                    )));
                }
                (true, Some(0)) => {
                    return Err(ApiError::invalid(format!(
                        "{what}: pollSeconds must be 1 or more"
                    )));
                }
                _ => {}
            }
            let store = open_store(&what, &p.target, p.credential_secret.as_deref())?;
            let cfg = ops::volume(&store, &p.backup_volume)
                .await
                .map_err(|e| store_error(&what, e))?
                .ok_or_else(|| {
                    ApiError::not_found(format!(
                        "{what}: backup volume {} not found in {}",
                        p.backup_volume, p.target
                    ))
                })?;
            let b = ops::backup(&store, &p.backup_volume, &p.backup)
                .await
                .map_err(|e| store_error(&what, e))?;
            if !b.complete() {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!("{what}: backup {} is still in progress", p.backup),
                ));
            }
            const MIB: u64 = 1 << 20;
            let least = cfg.size.div_ceil(MIB) * MIB;
            let size_bytes = match &p.size {
                Some(s) => super::volume::check_volume_size(
                    &what,
                    super::volume::parse_size(s)
                        .map_err(|e| ApiError::invalid(format!("{what}: size {s:?}: {e}")))?,
                )?,
                None => super::volume::check_volume_size(&what, least)?,
            };
            if size_bytes < cfg.size {
                return Err(ApiError::invalid(format!(
                    "{what}: the backup holds {} bytes, more than a volume of {size_bytes}",
                    cfg.size
                )));
            }
            let guard = LIFECYCLE.lock().await;
            let mut spec = Volume {
                size_bytes,
                replicas,
                engine: EngineKind::V2,
                frontend: Default::default(),
                disks: p.disks.clone(),
                from_snapshot: None,
                from_backup: Some(BackupSource {
                    target: p.target.clone(),
                    credential_secret: p.credential_secret.clone(),
                    backup_volume: p.backup_volume.clone(),
                    backup: p.backup.clone(),
                    poll_seconds: p.poll_seconds,
                }),
                standby: p.standby,
                revert_to: None,
                revert_generation: 0,
                raid_superblock: false,
                remote_replicas: p.remote_replicas.clone(),
                serve_replica: None,
                replica_hosts: Vec::new(),
            };
            spec.raid_superblock = spec.wants_superblock();
            let created = ctx
                .state
                .create_typed(name.as_str(), "", &spec)
                .map_err(|e| exists_as("volume", &name, e))?;
            drop(guard);
            if p.wait && p.standby {
                wait_for(
                    &ctx.state,
                    name.as_str(),
                    wait_timeout(p.timeout_seconds),
                    &what,
                    standby_holds_a_backup,
                )
                .await?;
            } else if p.wait {
                wait_for(
                    &ctx.state,
                    name.as_str(),
                    wait_timeout(p.timeout_seconds),
                    &what,
                    super::volume::engine_ready(size_bytes),
                )
                .await?;
            }
            super::volume::view(
                &ctx.state,
                ctx.state.get_typed::<Volume>(name.as_str())?.unwrap_or(created),
            )
        },
    );
    api.method(
        "backup_create",
        "Back a volume's snapshot up to a backup target (Longhorn's backupstore format); \
         with wait, return once it completed.",
        &[NotFound, AlreadyExists, FailedPrecondition, Unavailable],
        |p: BackupCreateParams, ctx: Arc<ApiContext>| async move {
            let name = p.name.clone().unwrap_or_else(generated_name);
            format::check_name("backup", &name).map_err(|e| ApiError::invalid(e.to_string()))?;
            let what = format!("backup {name}");
            let bvol = p.backup_volume.as_deref().unwrap_or(&p.volume);
            format::check_name("backup volume", bvol).map_err(|e| {
                let hint = if p.backup_volume.is_none() {
                    " (the volume's name, by default): give backupVolume"
                } else {
                    ""
                };
                ApiError::invalid(format!("{what}: {e}{hint}"))
            })?;
            ObjectName::parse("snapshot", &p.snapshot)
                .map_err(|e| ApiError::invalid(format!("{what}: {e}")))?;
            Target::parse(&p.target).map_err(|e| ApiError::invalid(format!("{what}: {e}")))?;
            check_secret(&what, p.credential_secret.as_deref())?;
            let guard = LIFECYCLE.lock().await;
            let action = format!("back it up as {name}");
            live_volume(&ctx.state, &p.volume, &action)
                .map_err(|e| ApiError::new(e.kind, format!("{what}: {}", e.message)))?;
            let sid = snapshot_id(&p.volume, &p.snapshot);
            live_snapshot(&ctx.state, &sid, &action)
                .map_err(|e| ApiError::new(e.kind, format!("{what}: {}", e.message)))?;
            let spec = Backup {
                volume: p.volume,
                snapshot: p.snapshot,
                target: p.target,
                credential_secret: p.credential_secret,
                backup_volume: p.backup_volume,
                full: p.full,
                labels: p.labels,
                compression: None,
                longhorn: None,
            };
            let created = ctx
                .state
                .create_typed(&name, "", &spec)
                .map_err(|e| exists_as("backup", &name, e))?;
            drop(guard);
            if p.wait {
                wait_for::<BackupStatus>(&ctx.state, &name, wait_timeout(p.timeout_seconds), &what, |s| {
                    match s {
                        Some(s) if s.state == BackupState::Error => Some(Err(s.message.clone())),
                        Some(s) if s.state == BackupState::Completed => Some(Ok(())),
                        _ => None,
                    }
                })
                .await?;
            }
            backup_view(
                &ctx.state,
                ctx.state.get_typed::<Backup>(&name)?.unwrap_or(created),
            )
        },
    );
    api.method(
        "backup_list",
        "talon's backups, of one volume or all, with their status.",
        &[],
        |p: BackupListParams, ctx: Arc<ApiContext>| async move {
            ctx.state
                .list_typed::<Backup>()?
                .into_iter()
                .filter(|b| p.volume.as_ref().is_none_or(|v| v == &b.spec.volume))
                .map(|b| backup_view(&ctx.state, b))
                .collect::<Result<Vec<_>, _>>()
        },
    );
    api.method(
        "backup_get",
        "One of talon's backups with its status.",
        &[NotFound],
        |p: BackupGetParams, ctx: Arc<ApiContext>| async move {
            backup_view(&ctx.state, get_backup(&ctx.state, &p.name)?)
        },
    );
    api.method(
        "backup_delete",
        "Delete a backup: talon's record (a running backup stops); with fromStore, first \
         the backup in its target.",
        &[NotFound, FailedPrecondition, Unavailable],
        |p: BackupDeleteParams, ctx: Arc<ApiContext>| async move {
            let b = get_backup(&ctx.state, &p.name)?;
            let what = format!("backup {}", p.name);
            let state = ctx
                .state
                .get_typed::<BackupStatus>(&p.name)?
                .map(|s| s.spec.state)
                .unwrap_or_default();
            let (mut store_deleted, mut blocks_removed) = (false, 0);
            if p.from_store {
                if state == BackupState::InProgress {
                    return Err(ApiError::new(
                        FailedPrecondition,
                        format!(
                            "{what} is in progress: delete it without fromStore to stop it (the target keeps \
                             an unfinished config no restore or listing trusts), or once it completed"
                        ),
                    ));
                }
                let store = open_store(&what, &b.spec.target, b.spec.credential_secret.as_deref())?;
                match ops::delete(&store, b.spec.backup_volume(), &p.name).await {
                    Ok(n) => (store_deleted, blocks_removed) = (true, n),
                    // it never reached the target
                    Err(BackupError::NotFound(_)) if state != BackupState::Completed => {}
                    Err(e @ BackupError::NotFound(_)) => {
                        return Err(ApiError::not_found(format!(
                            "{what}: {e} although it completed (deleted there by someone else?); \
                             delete it without fromStore to drop talon's record"
                        )));
                    }
                    Err(e) => return Err(store_error(&what, e)),
                }
            }
            let d = ctx.state.destroy(Backup::NAMESPACE, Backup::TYPE, &p.name, "")?;
            let mut res = BackupDeleteResult {
                name: p.name.clone(),
                deleted: d == Destroyed::Gone,
                tearing_down: d == Destroyed::TearingDown,
                store_deleted,
                blocks_removed,
            };
            if p.wait {
                let timeout = wait_timeout(p.timeout_seconds);
                let deleting = format!("deleting {what}");
                wait_for::<Backup>(&ctx.state, &p.name, timeout, &deleting, wait_gone).await?;
                // the controller has seen it go (and stopped its task)
                wait_for::<BackupStatus>(&ctx.state, &p.name, timeout, &deleting, wait_gone).await?;
                res.deleted = true;
                res.tearing_down = false;
            }
            Ok(res)
        },
    );
    api.method(
        "backup_store_list",
        "What a backup target holds: each backup volume's facts and complete backups \
         (talon's and Longhorn's).",
        &[NotFound, FailedPrecondition, Unavailable],
        |p: BackupStoreListParams, _ctx: Arc<ApiContext>| async move {
            let what = format!("backup target {:?}", p.target);
            let store = open_store(&what, &p.target, p.credential_secret.as_deref())?;
            let volumes = match &p.volume {
                Some(v) => {
                    format::check_name("backup volume", v)
                        .map_err(|e| ApiError::invalid(format!("{what}: {e}")))?;
                    let has = ops::volume(&store, v)
                        .await
                        .map_err(|e| store_error(&what, e))?
                        .is_some()
                        || !ops::backup_names(&store, v)
                            .await
                            .map_err(|e| store_error(&what, e))?
                            .is_empty();
                    if !has {
                        return Err(ApiError::not_found(format!(
                            "{what}: backup volume {v:?} not found"
                        )));
                    }
                    vec![v.clone()]
                }
                None => ops::volumes(&store).await.map_err(|e| store_error(&what, e))?,
            };
            let mut out = Vec::with_capacity(volumes.len());
            for v in &volumes {
                out.push(store_volume(&store, &p.target, v).await);
            }
            Ok(out)
        },
    );
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
    fn generated_names_are_longhorns_form() {
        let n = generated_name();
        assert_eq!(n.len(), "backup-".len() + 16, "{n}");
        assert!(n.starts_with("backup-") && format::valid_name(&n), "{n}");
        assert!(
            n["backup-".len()..]
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
            "{n}"
        );
        assert_ne!(generated_name(), n);
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
