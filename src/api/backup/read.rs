//! Reads of talon's backups: `backup_list`, `backup_get`.

use super::*;

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

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
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
}
