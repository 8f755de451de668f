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
    /// Size in bytes (with `fromSnapshot`: the source volume's when
    /// neither this nor `size` is given; never smaller).
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
    /// Create with a copy of this snapshot's data (`<volume>/<snapshot>`, or
    /// `<volume>@<snapshot>`; V2): copied through the data mover, thin,
    /// before the volume is first served (its engine status shows the copy's
    /// progress). `volume_clone` makes a linked clone instead.
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

/// The snapshot a new volume `name` is a copy of (`<volume>/<snapshot>` or
/// `<volume>@<snapshot>`): its volume and its id, both there and live.
fn copy_source(ctx: &ApiContext, name: &ObjectName, from: &str) -> Result<(Typed<Volume>, String), ApiError> {
    let (v, s) = from
        .split_once('/')
        .or_else(|| from.split_once('@'))
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "volume {name}: fromSnapshot {from:?} is not <volume>/<snapshot>"
            ))
        })?;
    let bad = |e: crate::names::InvalidName| {
        ApiError::invalid(format!("volume {name}: fromSnapshot {from:?}: {e}"))
    };
    let v = ObjectName::parse("volume", v).map_err(bad)?;
    let s = ObjectName::parse("snapshot", s).map_err(bad)?;
    let action = format!("copy it into volume {name}");
    let src = match ctx.state.get_typed::<Volume>(v.as_str())? {
        Some(_) => live_volume(&ctx.state, v.as_str(), &action)?,
        None => {
            return Err(ApiError::not_found(format!(
                "volume {name}: source volume {:?} not found (fromSnapshot {from:?})",
                v.as_str()
            )));
        }
    };
    let id = snapshot_id(v.as_str(), s.as_str());
    if ctx.state.get_typed::<Snapshot>(&id)?.is_none() {
        return Err(ApiError::not_found(format!(
            "volume {name}: snapshot {:?} of volume {:?} not found (fromSnapshot {from:?})",
            s.as_str(),
            v.as_str()
        )));
    }
    live_snapshot(&ctx.state, &id, &action)?;
    if let Some(e) = ctx.state.get_typed::<EngineStatus>(v.as_str())?
        && e.spec.engine == Engine::V1
    {
        return Err(ApiError::new(
            ErrorKind::FailedPrecondition,
            format!(
                "volume {name}: volume {:?} is served by engine v1, and a copy of a snapshot is V2 only \
                 (`talon volume clone` makes a V1 clone)",
                v.as_str()
            ),
        ));
    }
    Ok((src, id))
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
            let copy = match &p.from_snapshot {
                Some(from) => Some(copy_source(&ctx, &name, from)?),
                None => None,
            };
            let size_bytes = match (&copy, p.size_bytes, &p.size) {
                (Some((src, _)), None, None) => src.spec.size_bytes,
                _ => check_volume_size(&what, size_of(p.size_bytes, &p.size, &what)?)?,
            };
            if let Some((src, id)) = &copy
                && size_bytes < src.spec.size_bytes
            {
                return Err(ApiError::invalid(format!(
                    "volume {name}: size {} is smaller than the {} of volume {} whose snapshot {id} it copies \
                     (a copy is as large as its source, or larger)",
                    crate::util::size::Bytes(size_bytes),
                    crate::util::size::Bytes(src.spec.size_bytes),
                    src.id()
                )));
            }
            if copy.is_some() && (!p.remote_replicas.is_empty() || p.serve_replica.is_some()) {
                return Err(ApiError::invalid(format!(
                    "volume {name}: a copy of a snapshot (fromSnapshot) has local replicas only \
                     (no remoteReplicas, no serveReplica)"
                )));
            }
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
            // checked again under the lock: the snapshot is still there
            let copy_from = match &p.from_snapshot {
                Some(from) => Some(copy_source(&ctx, &name, from)?.1),
                None => None,
            };
            let mut spec = Volume {
                size_bytes,
                replicas,
                engine: p.engine.unwrap_or_default(),
                frontend: p.frontend.unwrap_or_default(),
                disks: p.disks,
                from_snapshot: None,
                copy_from,
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
            if let (Some(id), Some(how)) = (&spec.copy_from, v1_here(&ctx, &spec)?) {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!("{what}: {how}, and a copy of snapshot {id} is V2 only: ask for engine v2"),
                ));
            }
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
