//! Volume reads: `volume_get`, `volume_list` (each volume with its engine,
//! replicas and attachment).

use super::*;

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method("volume_get", "A volume with its engine, replicas and attachment.", &[NotFound], |p: NameParams, ctx: Arc<ApiContext>| async move {
        view(&ctx.state, get_volume(&ctx.state, &p.name)?)
    });
    api.method(
        "volume_list",
        "Every volume.",
        &[],
        |_: crate::api::types::NoParams, ctx: Arc<ApiContext>| async move {
            ctx.state
                .list_typed::<Volume>()?
                .into_iter()
                .map(|v| view(&ctx.state, v))
                .collect::<Result<Vec<_>, _>>()
        },
    );
}
