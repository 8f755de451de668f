//! `volume_delete`: the engine removes a volume's objects, then its
//! definition goes.

use super::*;

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "volume_delete",
        "Delete a volume: the engine removes its objects, then the definition goes.",
        &[NotFound, FailedPrecondition],
        |p: NameParams, ctx: Arc<ApiContext>| async move {
            let guard = LIFECYCLE.lock().await;
            let v = get_volume(&ctx.state, &p.name)?;
            if ctx.state.get_typed::<Attachment>(&p.name)?.is_some() {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!("volume {:?} is attached on this host; detach it first", p.name),
                ));
            }
            // a snapshot that failed and holds nothing (V1 on a file system
            // without reflink) goes with the volume; any other is kept
            let (never_taken, clones): (Vec<String>, Vec<String>) = ctx
                .state
                .list_typed::<Snapshot>()?
                .into_iter()
                .filter(|s| s.spec.volume == p.name)
                .map(|s| s.metadata.id)
                .partition(|id| {
                    ctx.state
                        .get_typed::<SnapshotStatus>(id)
                        .ok()
                        .flatten()
                        .is_some_and(|st| st.spec.state == ObjectState::Failed && st.spec.objects.is_empty())
                });
            if !clones.is_empty() {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!(
                        "volume {:?} has snapshots ({}); delete them first",
                        p.name,
                        clones.join(", ")
                    ),
                ));
            }
            for id in &never_taken {
                ctx.state.destroy(Snapshot::NAMESPACE, Snapshot::TYPE, id, "")?;
            }
            let d = ctx
                .state
                .destroy(Volume::NAMESPACE, Volume::TYPE, &v.metadata.id, "")?;
            // an engine node's rebuild request for the replica served here
            // goes with it (a volume made again under the name starts anew)
            if ctx.state.get_typed::<RebuildDest>(&p.name)?.is_some() {
                ctx.state
                    .destroy(RebuildDest::NAMESPACE, RebuildDest::TYPE, &p.name, "")?;
            }
            drop(guard);
            tracing::info!("volume {} deleted", p.name);
            let mut res = DeleteResult {
                name: p.name.clone(),
                deleted: d == Destroyed::Gone,
                tearing_down: d == Destroyed::TearingDown,
            };
            if p.wait && res.tearing_down {
                wait_for::<Volume>(
                    &ctx.state,
                    &p.name,
                    wait_timeout(p.timeout_seconds),
                    &format!("deleting volume {}", p.name),
                    wait_gone,
                )
                .await?;
                res = DeleteResult {
                    name: p.name,
                    deleted: true,
                    tearing_down: false,
                };
            }
            Ok(res)
        },
    );
}
