//! `backup_delete`: talon's record of a backup goes (a running backup stops);
//! with `fromStore`, first the backup in its target.

use super::*;

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

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
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
                let store = open_recorded(&what, &b.spec.target, b.spec.credential_secret.as_deref())?;
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
            tracing::info!(
                "{what} deleted{}",
                if store_deleted {
                    ", from its target too"
                } else {
                    ""
                }
            );
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
}
