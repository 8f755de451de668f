//! `volume_create`: a new volume (desired state), checked against what the
//! engines here can serve before anything is stored; with wait, until the
//! engine exports it.

use super::*;

/// `volume_create` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VolumeCreateParams {
    /// Volume name: `[a-z0-9-]`, at most 63 characters.
    pub name: String,
    /// Size in bytes.
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// Size with a unit, e.g. `10GiB`.
    #[serde(default)]
    pub size: Option<String>,
    /// Number of replicas (default 1; V1 supports 1).
    #[serde(default)]
    pub replicas: Option<u32>,
    /// Engine (default: the node's choice).
    #[serde(default)]
    pub engine: Option<EngineKind>,
    /// Frontend for attaching.
    #[serde(default)]
    pub frontend: Option<FrontendKind>,
    /// Disks to place replicas on.
    #[serde(default)]
    pub disks: Vec<String>,
    /// Create as a clone of this snapshot (`<volume>@<snapshot>`).
    #[serde(default)]
    pub from_snapshot: Option<String>,
    /// Replicas kept by other talon nodes (V2), attached into this node's raid1.
    #[serde(default)]
    pub remote_replicas: Vec<RemoteReplica>,
    /// Only keep replica k here for an engine on another node (V2).
    #[serde(default)]
    pub serve_replica: Option<u32>,
    /// With `serveReplica`: the host NQNs allowed to attach the replica (the
    /// engine node's host NQN from its `node_info`); nobody else can.
    #[serde(default)]
    pub replica_hosts: Vec<String>,
    /// Wait until the operation is done (or failed).
    #[serde(default)]
    pub wait: bool,
    /// How long to wait, in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// Refuses more than one replica when `spec` would be V1 here: a V1 volume
/// is one file, and a second replica asked for would silently not be kept.
fn check_v1_replicas(ctx: &ApiContext, what: &str, spec: &Volume) -> Result<(), ApiError> {
    let wanted = spec.replicas as usize + spec.remote_replicas.len();
    if wanted <= 1 {
        return Ok(());
    }
    match v1_here(ctx, spec)? {
        Some(how) => Err(ApiError::invalid(format!(
            "{what}: {how}, and V1 keeps one replica (one file), not {wanted}: ask for 1 replica, \
             or engine v2 on a node with SPDK"
        ))),
        None => Ok(()),
    }
}

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "volume_create",
        "Create a volume (desired state); with wait, return once the engine exports it.",
        &[AlreadyExists, NotFound, FailedPrecondition, Unavailable],
        |p: VolumeCreateParams, ctx: Arc<ApiContext>| async move {
            let name = volume_name(&p.name)?;
            let what = format!("volume {name}");
            let size_bytes = check_volume_size(&what, size_of(p.size_bytes, &p.size, &what)?)?;
            let replicas = p.replicas.unwrap_or(1);
            if !(1..=3).contains(&replicas) {
                return Err(ApiError::invalid(format!(
                    "volume {name}: replicas must be 1 to 3, not {replicas}"
                )));
            }
            for d in &p.disks {
                ObjectName::parse("disk", d)?;
                if ctx.state.get_typed::<Disk>(d)?.is_none() {
                    return Err(ApiError::not_found(format!(
                        "volume {name}: disk {d:?} not found"
                    )));
                }
            }
            check_remote_replicas(&format!("volume {name}"), &p.remote_replicas)?;
            if let Some(k) = p.serve_replica
                && (!p.remote_replicas.is_empty() || replicas != 1 || k > 8)
            {
                return Err(ApiError::invalid(format!(
                    "volume {name}: serveReplica {k} keeps one replica (0 to 8) for an engine elsewhere; \
                     it takes neither remoteReplicas nor replicas other than 1"
                )));
            }
            if !p.replica_hosts.is_empty() && p.serve_replica.is_none() {
                return Err(ApiError::invalid(format!(
                    "volume {name}: replicaHosts only goes with serveReplica"
                )));
            }
            if p.serve_replica.is_some() && p.replica_hosts.is_empty() {
                return Err(ApiError::invalid(format!(
                    "volume {name}: serveReplica needs replicaHosts, the engine node's hostNqn \
                     (its `talon node info`): no other host can attach the replica"
                )));
            }
            for h in &p.replica_hosts {
                crate::names::Nqn::parse(h)
                    .map_err(|e| ApiError::invalid(format!("volume {name}: replicaHosts: {e}")))?;
            }
            if replicas as usize + p.remote_replicas.len() > 3 {
                return Err(ApiError::invalid(format!(
                    "volume {name}: at most 3 replicas in all, not {} local + {} remote",
                    replicas,
                    p.remote_replicas.len()
                )));
            }
            let guard = LIFECYCLE.lock().await;
            if let Some(s) = &p.from_snapshot {
                live_snapshot(&ctx.state, s, &format!("clone it into volume {name}"))
                    .map_err(|e| ApiError::new(e.kind, format!("volume {name}: {}", e.message)))?;
            }
            let mut spec = Volume {
                size_bytes,
                replicas,
                engine: p.engine.unwrap_or_default(),
                frontend: p.frontend.unwrap_or_default(),
                disks: p.disks,
                from_snapshot: p.from_snapshot,
                from_backup: None,
                standby: false,
                revert_to: None,
                revert_generation: 0,
                raid_superblock: false,
                remote_replicas: p.remote_replicas,
                serve_replica: p.serve_replica,
                replica_hosts: p.replica_hosts,
            };
            // every new volume of a shape that has one gets the superblock layout
            spec.raid_superblock = spec.wants_superblock();
            check_v1_replicas(&ctx, &what, &spec)?;
            if v1_here(&ctx, &spec)?.is_none() {
                refuse_without_v2(&ctx, &what).map_err(|e| {
                    ApiError::new(
                        e.kind,
                        format!("{} (engine v1 or auto serves it here, with tgtd)", e.message),
                    )
                })?;
            }
            check_v1_file_size(&ctx, &what, &spec)?;
            let created = ctx
                .state
                .create_typed(name.as_str(), "", &spec)
                .map_err(|e| exists_as("volume", &name, e))?;
            drop(guard);
            tracing::info!(
                "volume {name} created: {}, {} replica(s), engine {}",
                crate::util::size::human_bytes(size_bytes),
                replicas,
                engine_word(spec.engine)
            );
            if p.wait {
                wait_for(
                    &ctx.state,
                    name.as_str(),
                    wait_timeout(p.timeout_seconds),
                    &format!("creating volume {name}"),
                    engine_ready(size_bytes),
                )
                .await?;
            }
            view(
                &ctx.state,
                ctx.state.get_typed::<Volume>(name.as_str())?.unwrap_or(created),
            )
        },
    );
}
