//! `backup_create`: a `Backup` of a volume's snapshot (desired state, carried
//! out by the engine's backup controller).

use super::*;

/// `backup_create` params.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupCreateParams {
    /// The backup's name (Longhorn's rule: a letter or digit, then letters,
    /// digits, `_.-`; 2 to 240 characters, as `backup_<name>.cfg` is one
    /// file name in a folder target). Default: `backup-` and 16 hex
    /// characters.
    #[serde(default)]
    pub name: Option<String>,
    /// The volume.
    pub volume: String,
    /// The volume's snapshot to back up.
    pub snapshot: String,
    /// The backup target: `s3://<bucket>@<region>/<path>` or `vfs:///<dir>`.
    pub target: String,
    /// The target's credentials: the name of a Kubernetes secret given to
    /// this node, `<backupSecretsDir>/<name>` (a mounted secret, one file
    /// per key, or a Secret manifest file); never a path. The backup records
    /// where it was found.
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
    /// The backup's block size in bytes: 2097152 (2 MiB, the default) or
    /// 16777216 (16 MiB), as Longhorn's `backup-block-size`. A backup
    /// volume's backups build on each other only at one block size.
    #[serde(default)]
    pub block_size: Option<u64>,
    /// Blocks compressed and uploaded at once (1 to 64; default 4).
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// Wait until the backup completed (or failed).
    #[serde(default)]
    pub wait: bool,
    /// How long to wait, in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// A new backup's name: Longhorn's form, `backup-` and 16 hex characters.
fn generated_name() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("backup-{}", &id[..16])
}

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "backup_create",
        "Back a volume's snapshot up to a backup target (Longhorn's backupstore format); \
         with wait, return once it completed.",
        &[NotFound, AlreadyExists, FailedPrecondition, Unavailable],
        |p: BackupCreateParams, ctx: Arc<ApiContext>| async move {
            let name = p.name.clone().unwrap_or_else(generated_name);
            format::check_backup_name(&name).map_err(|e| ApiError::invalid(e.to_string()))?;
            let what = format!("backup {name}");
            let bvol = p.backup_volume.as_deref().unwrap_or(&p.volume);
            format::check_backup_volume_name(bvol).map_err(|e| {
                let hint = if p.backup_volume.is_none() {
                    " (the volume's name, by default): give backupVolume"
                } else {
                    ""
                };
                ApiError::invalid(format!("{what}: {e}{hint}"))
            })?;
            ObjectName::parse("snapshot", &p.snapshot)
                .map_err(|e| ApiError::invalid(format!("{what}: {e}")))?;
            check_target(&what, &p.target)?;
            if let Some(bs) = p.block_size
                && !crate::backupstore::ops::BLOCK_SIZES.contains(&bs)
            {
                return Err(ApiError::invalid(format!(
                    "{what}: blockSize {bs} is not 2097152 (2 MiB) nor 16777216 (16 MiB)"
                )));
            }
            if let Some(n) = p.concurrency
                && !(1..=64).contains(&n)
            {
                return Err(ApiError::invalid(format!(
                    "{what}: concurrency {n} is not 1 to 64"
                )));
            }
            let (secret_path, _) = secret_of(&ctx.state, &what, p.credential_secret.as_deref())?;
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
                credential_secret: secret_path,
                backup_volume: p.backup_volume,
                full: p.full,
                labels: p.labels,
                compression: None,
                block_size: p.block_size.filter(|bs| *bs != format::DEFAULT_BLOCK_SIZE),
                concurrency: p.concurrency,
                longhorn: None,
            };
            let created = ctx
                .state
                .create_typed(&name, "", &spec)
                .map_err(|e| exists_as("backup", &name, e))?;
            drop(guard);
            tracing::info!(
                "backup {name} of snapshot {}@{} created",
                spec.volume,
                spec.snapshot
            );
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
