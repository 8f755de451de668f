//! Snapshot methods: `snapshot_create`, `snapshot_list`, `snapshot_delete`.

use super::*;

/// `snapshot_list` params.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotListParams {
    /// Only snapshots of this volume.
    #[serde(default)]
    pub volume: Option<String>,
}

/// A snapshot with its engine status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotView {
    /// `<volume>@<name>`.
    pub id: String,
    /// Desired state.
    pub spec: Snapshot,
    /// Phase.
    pub phase: Phase,
    /// The engine's status.
    pub status: Option<SnapshotStatus>,
}

fn snapshot_view(state: &State, id: &str) -> Result<SnapshotView, ApiError> {
    let s = state
        .get_typed::<Snapshot>(id)?
        .ok_or_else(|| ApiError::not_found(format!("snapshot {id:?} not found")))?;
    Ok(SnapshotView {
        id: id.to_string(),
        status: state.get_typed::<SnapshotStatus>(id)?.map(|x| x.spec),
        phase: s.metadata.phase,
        spec: s.spec,
    })
}

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "snapshot_create",
        "Snapshot a volume (all replicas, consistently).",
        &[NotFound, AlreadyExists, FailedPrecondition],
        |p: SnapshotParams, ctx: Arc<ApiContext>| async move {
            ObjectName::parse("snapshot", &p.name)?;
            let guard = LIFECYCLE.lock().await;
            live_volume(&ctx.state, &p.volume, &format!("snapshot it as {:?}", p.name))?;
            let id = snapshot_id(&p.volume, &p.name);
            let spec = Snapshot {
                volume: p.volume.clone(),
                name: p.name.clone(),
            };
            ctx.state
                .create_typed(&id, "", &spec)
                .map_err(|e| exists_as("snapshot", &id, e))?;
            drop(guard);
            tracing::info!("snapshot {id} created");
            if p.wait {
                wait_for::<SnapshotStatus>(
                    &ctx.state,
                    &id,
                    wait_timeout(p.timeout_seconds),
                    &format!("snapshot {id}"),
                    |s| match s {
                        Some(s) if s.state == ObjectState::Failed => Some(Err(s.message.clone())),
                        Some(s) if s.state == ObjectState::Ready => Some(Ok(())),
                        _ => None,
                    },
                )
                .await?;
            }
            snapshot_view(&ctx.state, &id)
        },
    );
    api.method(
        "snapshot_list",
        "Snapshots, of one volume or all.",
        &[],
        |p: SnapshotListParams, ctx: Arc<ApiContext>| async move {
            let mut out = Vec::new();
            for s in ctx.state.list_typed::<Snapshot>()? {
                if p.volume.as_ref().is_none_or(|v| v == &s.spec.volume) {
                    out.push(snapshot_view(&ctx.state, s.id())?);
                }
            }
            Ok(out)
        },
    );
    api.method(
        "snapshot_delete",
        "Delete a snapshot (refused while clones depend on it).",
        &[NotFound, FailedPrecondition],
        |p: SnapshotParams, ctx: Arc<ApiContext>| async move {
            let id = snapshot_id(&p.volume, &p.name);
            let guard = LIFECYCLE.lock().await;
            if ctx.state.get_typed::<Snapshot>(&id)?.is_none() {
                return Err(ApiError::not_found(format!("snapshot {id:?} not found")));
            }
            let clones: Vec<String> = ctx
                .state
                .list_typed::<Volume>()?
                .into_iter()
                .filter(|v| v.spec.from_snapshot.as_deref() == Some(id.as_str()))
                .map(|v| v.metadata.id)
                .collect();
            if !clones.is_empty() {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!(
                        "snapshot {id:?} has clones ({}); delete them first",
                        clones.join(", ")
                    ),
                ));
            }
            // a copy reads the snapshot until it is whole (its engine status says 100 %)
            let mut copying = Vec::new();
            for v in ctx.state.list_typed::<Volume>()? {
                if v.spec.copy_from.as_deref() != Some(id.as_str()) {
                    continue;
                }
                let whole = ctx
                    .state
                    .get_typed::<EngineStatus>(v.id())?
                    .and_then(|e| e.spec.copy)
                    .is_some_and(|c| c.percent == 100);
                if !whole {
                    copying.push(v.metadata.id);
                }
            }
            if !copying.is_empty() {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!(
                        "snapshot {id:?} is being copied into volume(s) {}; delete it once the copy is done \
                         (their engine status shows copy 100 %), or delete those volumes first",
                        copying.join(", ")
                    ),
                ));
            }
            let d = ctx.state.destroy(Snapshot::NAMESPACE, Snapshot::TYPE, &id, "")?;
            drop(guard);
            tracing::info!("snapshot {id} deleted");
            if p.wait && d == Destroyed::TearingDown {
                wait_for::<Snapshot>(
                    &ctx.state,
                    &id,
                    wait_timeout(p.timeout_seconds),
                    &format!("deleting snapshot {id}"),
                    wait_gone,
                )
                .await?;
            }
            Ok(DeleteResult {
                name: id,
                deleted: true,
                tearing_down: false,
            })
        },
    );
}
