//! `volume_activate`: a standby (DR) volume is served, from the backup
//! volume's newest complete backup.

use super::*;
use crate::api::volume;

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "volume_activate",
        "Serve a standby (DR) volume: the backup volume's newest complete backup is \
         restored, its replicas made and it is served; with wait, return once it is.",
        &[NotFound, FailedPrecondition],
        |p: NameParams, ctx: Arc<ApiContext>| async move {
            let guard = LIFECYCLE.lock().await;
            let v = volume::get_volume(&ctx.state, &p.name)?;
            if v.metadata.phase == Phase::TearingDown {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!("volume {:?} is being deleted; cannot activate it", p.name),
                ));
            }
            if !v.spec.standby {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!("volume {:?} is not a standby volume; nothing to activate", p.name),
                ));
            }
            let mut spec = v.spec.clone();
            spec.standby = false;
            ctx.state
                .update_typed(&p.name, "", Some(v.metadata.version), &spec)?;
            drop(guard);
            tracing::info!(
                "volume {} activated (a standby no more: it is restored and served)",
                p.name
            );
            if p.wait {
                wait_for(
                    &ctx.state,
                    &p.name,
                    wait_timeout(p.timeout_seconds),
                    &format!("activating volume {}", p.name),
                    volume::engine_ready(spec.size_bytes),
                )
                .await?;
            }
            volume::view(&ctx.state, volume::get_volume(&ctx.state, &p.name)?)
        },
    );
}
