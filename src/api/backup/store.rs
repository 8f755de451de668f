//! `backup_store_list`: what a backup target holds, talon's and Longhorn's
//! backups alike.

use super::*;

/// `backup_store_list` params.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupStoreListParams {
    /// The backup target: `s3://<bucket>@<region>/<path>` or `vfs:///<dir>`.
    pub target: String,
    /// The target's credentials: the name of a Kubernetes secret given to
    /// this node (in its `backupSecretsDir`).
    #[serde(default)]
    pub credential_secret: Option<String>,
    /// Only this backup volume.
    #[serde(default)]
    pub volume: Option<String>,
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

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "backup_store_list",
        "What a backup target holds: each backup volume's facts and complete backups \
         (talon's and Longhorn's).",
        &[NotFound, FailedPrecondition, Unavailable],
        |p: BackupStoreListParams, ctx: Arc<ApiContext>| async move {
            let what = format!(
                "backup target {:?}",
                crate::backupstore::store::redact_urls(&p.target)
            );
            let store = open_store(&ctx.state, &what, &p.target, p.credential_secret.as_deref())?;
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
