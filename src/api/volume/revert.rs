//! `volume_revert`: a detached volume's data back to one of its snapshots.

use super::*;

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "volume_revert",
        "Revert a volume's data to one of its snapshots (the volume must be detached).",
        &[NotFound, FailedPrecondition],
        |p: SnapshotParams, ctx: Arc<ApiContext>| async move {
            let _guard = LIFECYCLE.lock().await;
            let sid = snapshot_id(&p.volume, &p.name);
            let action = format!("revert it to {sid}");
            let v = live_volume(&ctx.state, &p.volume, &action)?;
            live_snapshot(&ctx.state, &sid, &action)?;
            if ctx.state.get_typed::<Attachment>(&p.volume)?.is_some() {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!("volume {:?} is attached; detach it before a revert", p.volume),
                ));
            }
            let mut spec = v.spec.clone();
            spec.revert_to = Some(sid);
            spec.revert_generation += 1;
            ctx.state
                .update_typed(&p.volume, "", Some(v.metadata.version), &spec)?;
            tracing::info!("volume {} reverted to snapshot {}", p.volume, p.name);
            view(&ctx.state, get_volume(&ctx.state, &p.volume)?)
        },
    );
}
