//! `backup_restore`: a new V2 volume with the data of a backup (talon's or
//! Longhorn's), served, or a standby volume that follows its backup volume.

use super::*;
use crate::api::volume;

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
    /// The target's credentials: the name of a Kubernetes secret given to
    /// this node (in its `backupSecretsDir`).
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

/// A standby volume's wait: done once it holds a backup.
fn standby_holds_a_backup(e: Option<&EngineStatus>) -> Option<Result<(), String>> {
    match e {
        Some(e) if e.state == ObjectState::Failed => Some(Err(e.message.clone())),
        Some(e) if e.state == ObjectState::Standby && e.restored_backup.is_some() => Some(Ok(())),
        _ => None,
    }
}

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "backup_restore",
        "Create a V2 volume with the data of a backup (talon's or Longhorn's); with wait, \
         return once it is restored and served.",
        &[NotFound, AlreadyExists, FailedPrecondition, Unavailable],
        |p: BackupRestoreParams, ctx: Arc<ApiContext>| async move {
            use crate::resources::config::{BackupSource, EngineKind, Volume};
            let name = volume::volume_name(&p.volume)?;
            let what = format!("restoring backup {} into volume {name}", p.backup);
            format::check_name("backup", &p.backup).map_err(|e| store_error(&what, e))?;
            format::check_name("backup volume", &p.backup_volume).map_err(|e| store_error(&what, e))?;
            let replicas = p.replicas.unwrap_or(1);
            if !(1..=3).contains(&replicas) {
                return Err(ApiError::invalid(format!(
                    "{what}: replicas must be 1 to 3, not {replicas}"
                )));
            }
            volume::check_remote_replicas(&what, &p.remote_replicas)?;
            if replicas as usize + p.remote_replicas.len() > 3 {
                return Err(ApiError::invalid(format!(
                    "{what}: at most 3 replicas in all, not {replicas} local + {} remote",
                    p.remote_replicas.len()
                )));
            }
            for d in &p.disks {
                ObjectName::parse("disk", d)?;
            }
            volume::refuse_without_v2(&ctx, &what)?;
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
            check_target(&what, &p.target)?;
            let (secret_path, creds) = secret_of(&ctx.state, &what, p.credential_secret.as_deref())?;
            let store = Store::open(&p.target, &creds).map_err(|e| store_error(&what, e))?;
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
                Some(s) => volume::check_volume_size(
                    &what,
                    volume::parse_size(s)
                        .map_err(|e| ApiError::invalid(format!("{what}: size {s:?}: {e}")))?,
                )?,
                None => volume::check_volume_size(&what, least)?,
            };
            if size_bytes < cfg.size {
                return Err(ApiError::invalid(format!(
                    "{what}: the backup holds {}, more than a volume of {}",
                    crate::util::size::Bytes(cfg.size),
                    crate::util::size::Bytes(size_bytes)
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
                copy_from: None,
                from_backup: Some(BackupSource {
                    target: p.target.clone(),
                    credential_secret: secret_path,
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
            tracing::info!(
                "volume {name} created from backup {} of {}",
                p.backup,
                p.backup_volume
            );
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
                    volume::engine_ready(size_bytes),
                )
                .await?;
            }
            volume::view(
                &ctx.state,
                ctx.state.get_typed::<Volume>(name.as_str())?.unwrap_or(created),
            )
        },
    );
}
