//! Peer methods of thin rebuilds.

use super::*;

/// `replica_rebuild_prepare` params (a peer call from a volume's engine node).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RebuildPrepareParams {
    /// The volume whose replica this node serves (`serveReplica`).
    pub volume: String,
    /// The source replica's snapshots, oldest first.
    pub chain: Vec<String>,
    /// How long to wait for the answer, in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// `replica_rebuild_prepare`: the engine node of a volume whose replica this
/// node serves gets it ready for the next copy of a thin rebuild.
pub(super) fn register(api: &mut ApiBuilder) {
    api.method(
        "replica_rebuild_prepare",
        "Peer call: make a served replica ready for the next copy of its thin rebuild \
         (its head empty right above the snapshots of the source's chain it shares).",
        &[
            ErrorKind::NotFound,
            ErrorKind::FailedPrecondition,
            ErrorKind::InvalidParams,
        ],
        |p: RebuildPrepareParams, ctx: Arc<ApiContext>| async move {
            for s in &p.chain {
                ObjectName::parse("snapshot", s)?;
            }
            let v = live_volume(&ctx.state, &p.volume, "rebuild its replica")?;
            if v.spec.serve_replica.is_none() {
                return Err(ApiError::new(
                    ErrorKind::FailedPrecondition,
                    format!(
                        "volume {:?} is not a replica this node serves (serveReplica): its engine is here",
                        p.volume
                    ),
                ));
            }
            let generation = {
                let _guard = LIFECYCLE.lock().await;
                let cur = ctx.state.get_typed::<RebuildDest>(&p.volume)?;
                let answered = ctx
                    .state
                    .get_typed::<RebuildDestStatus>(&p.volume)?
                    .map_or(0, |a| a.spec.generation);
                let generation = cur.as_ref().map_or(0, |c| c.spec.generation).max(answered) + 1;
                let spec = RebuildDest {
                    chain: p.chain.clone(),
                    generation,
                };
                match cur {
                    Some(c) => ctx
                        .state
                        .update_typed(&p.volume, "", Some(c.metadata.version), &spec)?,
                    None => ctx.state.create_typed(&p.volume, "", &spec)?,
                };
                generation
            };
            wait_for::<RebuildDestStatus>(
                &ctx.state,
                &p.volume,
                wait_timeout(p.timeout_seconds),
                &format!("making replica {} ready for its rebuild", p.volume),
                |a| match a {
                    Some(a) if a.generation >= generation && !a.message.is_empty() => {
                        Some(Err(a.message.clone()))
                    }
                    Some(a) if a.generation >= generation => Some(Ok(())),
                    _ => None,
                },
            )
            .await?;
            ctx.state
                .get_typed::<RebuildDestStatus>(&p.volume)?
                .map(|a| a.spec)
                .ok_or_else(|| ApiError::not_found(format!("volume {:?}: its answer went", p.volume)))
        },
    );
}
