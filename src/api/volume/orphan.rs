//! Orphan lvols: `orphan_list`, `orphan_remove`. An lvol in talon's
//! lvstores that no volume or Longhorn replica owns (as after a lost state
//! store) is reported by the orphan controller (`OrphanLvol`) and kept;
//! `orphan_remove` is the one way it goes.
//!
//! ```text
//!   orphan_remove talon-d1/v-r0 ──owned? refused──> error naming the owner
//!        │ reported (OrphanLvol, its uuid)
//!        v
//!   OrphanRemoval talon-d1/v-r0 {uuid} ──> engine.SpdkOrphanController deletes it
//!        └─ waits: OrphanLvol gone (removed) or its message (refused: clones left, …);
//!           the request is dropped either way
//! ```

use super::*;
use crate::resources::config::OrphanRemoval;
use crate::resources::engine::OrphanLvol;
use crate::resources::longhorn::LonghornReplica;
use crate::spdk::naming::Owners;

/// `orphan_remove` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OrphanRemoveParams {
    /// The orphan lvol: its alias `talon-<disk>/<lvol>` as `orphan_list`
    /// names it.
    pub name: String,
    /// How long to wait for the removal, in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// An orphan lvol as reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrphanView {
    /// Its alias `talon-<disk>/<lvol>` (what `orphan_remove` takes).
    pub name: String,
    /// What the orphan controller found.
    pub orphan: OrphanLvol,
}

impl OnTarget for OrphanLvol {}

fn owners(state: &State) -> Result<Owners, ApiError> {
    Ok(Owners {
        volumes: state
            .list_typed::<Volume>()?
            .into_iter()
            .map(|v| v.metadata.id)
            .collect(),
        replicas: state
            .list_typed::<LonghornReplica>()?
            .into_iter()
            .map(|r| r.metadata.id)
            .collect(),
    })
}

/// The error for lvol `alias` that an owner claims, if one does.
fn owned(state: &State, alias: &str) -> Result<Option<ApiError>, ApiError> {
    let lvol = alias.rsplit_once('/').map_or(alias, |(_, l)| l);
    Ok(owners(state)?.owner(lvol).map(|who| {
        ApiError::new(
            ErrorKind::FailedPrecondition,
            format!("lvol {alias} belongs to {who}: not an orphan, not removed (delete its owner instead)"),
        )
    }))
}

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "orphan_list",
        "Lvols on this node's disks that no volume or Longhorn replica owns (kept until orphan_remove).",
        &[],
        |_: crate::api::types::NoParams, ctx: Arc<ApiContext>| async move {
            Ok(ctx
                .state
                .list_typed::<OrphanLvol>()?
                .into_iter()
                .map(|o| OrphanView {
                    name: o.metadata.id,
                    orphan: o.spec,
                })
                .collect::<Vec<_>>())
        },
    );
    api.method(
        "orphan_remove",
        "Delete an orphan lvol (refused for an lvol a volume or Longhorn replica owns, or one with clones).",
        &[NotFound, FailedPrecondition, Unavailable],
        |p: OrphanRemoveParams, ctx: Arc<ApiContext>| async move {
            let alias = p.name.as_str();
            if let Some(e) = owned(&ctx.state, alias)? {
                return Err(e);
            }
            let Some(o) = ctx.state.get_typed::<OrphanLvol>(alias)? else {
                return Err(ApiError::not_found(format!(
                    "no orphan lvol {alias} (see `talon orphan list`)"
                )));
            };
            ctx.state.upsert_typed(
                alias,
                &OrphanRemoval {
                    uuid: o.spec.uuid.clone(),
                },
            )?;
            let uuid = o.spec.uuid;
            let waited = wait_for::<OrphanLvol>(
                &ctx.state,
                alias,
                wait_timeout(p.timeout_seconds),
                &format!("removing orphan lvol {alias}"),
                |o| match o {
                    None => Some(Ok(())),
                    Some(o) if o.uuid != uuid => Some(Ok(())),
                    Some(o) if !o.message.is_empty() => Some(Err(o.message.clone())),
                    Some(_) => None,
                },
            )
            .await;
            let _ = ctx
                .state
                .destroy(OrphanRemoval::NAMESPACE, OrphanRemoval::TYPE, alias, "");
            waited?;
            // a volume made under its name meanwhile keeps it
            if let Some(e) = owned(&ctx.state, alias)? {
                return Err(e);
            }
            tracing::info!(lvol = alias, "orphan lvol removed");
            Ok(DeleteResult {
                name: p.name,
                deleted: true,
                tearing_down: false,
            })
        },
    );
}
