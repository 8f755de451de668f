//! `volume_expand`: a volume grows, every replica, then the engine and its
//! export.

use super::*;

/// `volume_expand` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExpandParams {
    /// The volume.
    pub name: String,
    /// Size in bytes.
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// Size with a unit, e.g. `10GiB`.
    #[serde(default)]
    pub size: Option<String>,
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
        "volume_expand",
        "Grow a volume: every replica, then the engine and its export.",
        &[NotFound, FailedPrecondition],
        |p: ExpandParams, ctx: Arc<ApiContext>| async move {
            let guard = LIFECYCLE.lock().await;
            let v = live_volume(&ctx.state, &p.name, "expand it")?;
            let what = format!("volume {}", p.name);
            let size = check_volume_size(&what, size_of(p.size_bytes, &p.size, &what)?)?;
            // what the engine serves is the floor: an expand it could not do (still
            // pending or failed) is replaced by a smaller one, never stuck forever
            let served = ctx
                .state
                .get_typed::<EngineStatus>(&p.name)?
                .map(|e| e.spec.size_bytes)
                .filter(|s| *s > 0)
                .unwrap_or(v.spec.size_bytes);
            if size < served {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!(
                        "volume {:?} is {}; it can only grow, not shrink to {}",
                        p.name,
                        Bytes(served),
                        Bytes(size)
                    ),
                ));
            }
            let mut spec = v.spec.clone();
            spec.size_bytes = size;
            check_v1_file_size(&ctx, &what, &spec)?;
            ctx.state
                .update_typed(&p.name, "", Some(v.metadata.version), &spec)?;
            drop(guard);
            tracing::info!(
                "volume {} expanded to {}",
                p.name,
                crate::util::size::human_bytes(size)
            );
            if p.wait {
                wait_for(
                    &ctx.state,
                    &p.name,
                    wait_timeout(p.timeout_seconds),
                    &format!("expanding volume {}", p.name),
                    engine_ready(size),
                )
                .await?;
            }
            view(&ctx.state, get_volume(&ctx.state, &p.name)?)
        },
    );
}
