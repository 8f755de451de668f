//! `volume_clone`: a new volume from a snapshot, in its source's layout.

use super::*;

/// `volume_clone` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CloneParams {
    /// The new volume's name.
    pub name: String,
    /// The source volume.
    pub volume: String,
    /// The source snapshot.
    pub snapshot: String,
    /// Wait until the operation is done (or failed).
    #[serde(default)]
    pub wait: bool,
    /// How long to wait, in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "volume_clone",
        "Create a volume from a snapshot.",
        &[NotFound, AlreadyExists],
        |p: CloneParams, ctx: Arc<ApiContext>| async move {
            let name = volume_name(&p.name)?;
            let guard = LIFECYCLE.lock().await;
            let action = format!("clone it into volume {name}");
            let src = live_volume(&ctx.state, &p.volume, &action)?;
            let sid = snapshot_id(&p.volume, &p.snapshot);
            live_snapshot(&ctx.state, &sid, &action)?;
            // the clone keeps its source's layout (`raidSuperblock`): its
            // replicas read the snapshot's data at the same offset
            let spec = Volume {
                from_snapshot: Some(sid),
                copy_from: None,
                from_backup: None,
                revert_to: None,
                revert_generation: 0,
                ..src.spec
            };
            ctx.state
                .create_typed(name.as_str(), "", &spec)
                .map_err(|e| exists_as("volume", &name, e))?;
            drop(guard);
            tracing::info!(
                "volume {name} created as a clone of snapshot {}@{}",
                p.volume,
                p.snapshot
            );
            if p.wait {
                wait_for(
                    &ctx.state,
                    name.as_str(),
                    wait_timeout(p.timeout_seconds),
                    &format!("cloning into volume {name}"),
                    engine_ready(spec.size_bytes),
                )
                .await?;
            }
            view(&ctx.state, get_volume(&ctx.state, name.as_str())?)
        },
    );
}
