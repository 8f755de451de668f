//! Attachment methods: `volume_attach`, `volume_detach` (a frontend on this node).

use super::*;

/// `volume_attach` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AttachParams {
    /// The volume.
    pub name: String,
    /// Frontend override.
    #[serde(default)]
    pub frontend: Option<FrontendKind>,
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
        "volume_attach",
        "Attach a volume on this host (NVMe/TCP, else iSCSI): /dev/talon/<name>.",
        &[NotFound, FailedPrecondition, Unavailable],
        |p: AttachParams, ctx: Arc<ApiContext>| async move {
            let guard = LIFECYCLE.lock().await;
            live_volume(&ctx.state, &p.name, "attach it")?;
            let spec = Attachment {
                frontend: p.frontend.unwrap_or_default(),
            };
            let existed = ctx.state.get_typed::<Attachment>(&p.name)?.is_some();
            ctx.state.upsert_typed(&p.name, &spec)?;
            drop(guard);
            if !existed {
                tracing::info!("volume {} attached on this host", p.name);
            }
            if p.wait {
                let attached = wait_for::<AttachmentStatus>(
                    &ctx.state,
                    &p.name,
                    wait_timeout(p.timeout_seconds),
                    &format!("attaching volume {}", p.name),
                    |a| match a {
                        Some(a) if a.state == AttachState::Failed => Some(Err(a.message.clone())),
                        Some(a) if a.state == AttachState::Attached => Some(Ok(())),
                        _ => None,
                    },
                )
                .await;
                if let Err(e) = attached {
                    // the caller is told it failed: what this call made goes
                    // (the export is not left open to this host); an
                    // attachment that was there before stays
                    if !existed {
                        let _guard = LIFECYCLE.lock().await;
                        ctx.state
                            .destroy(Attachment::NAMESPACE, Attachment::TYPE, &p.name, "")?;
                    }
                    return Err(e);
                }
            }
            view(&ctx.state, get_volume(&ctx.state, &p.name)?)
        },
    );
    api.method(
        "volume_detach",
        "Detach a volume from this host.",
        &[NotFound],
        |p: NameParams, ctx: Arc<ApiContext>| async move {
            if ctx.state.get_typed::<Attachment>(&p.name)?.is_none() {
                return Err(ApiError::not_found(format!(
                    "volume {:?} is not attached on this host",
                    p.name
                )));
            }
            ctx.state
                .destroy(Attachment::NAMESPACE, Attachment::TYPE, &p.name, "")?;
            tracing::info!("volume {} detached from this host", p.name);
            if p.wait {
                wait_for::<AttachmentStatus>(
                    &ctx.state,
                    &p.name,
                    wait_timeout(p.timeout_seconds),
                    &format!("detaching volume {}", p.name),
                    wait_gone,
                )
                .await?;
            }
            view(&ctx.state, get_volume(&ctx.state, &p.name)?)
        },
    );
}
