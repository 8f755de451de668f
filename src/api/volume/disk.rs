//! Disk methods: `disk_add`, `disk_list`, `disk_remove`, `disk_format`.

use super::*;

/// `disk_add` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DiskAddParams {
    /// Disk name.
    pub name: String,
    /// A file (created sparse with the size when missing, anywhere but on
    /// devtmpfs) or a block device, by what the path is.
    #[serde(default)]
    pub path: Option<String>,
    /// An NVMe PCI device by BDF or serial.
    #[serde(default)]
    pub pci: Option<String>,
    /// Size in bytes.
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// Size with a unit, e.g. `10GiB`.
    #[serde(default)]
    pub size: Option<String>,
    /// lvstore cluster size in MiB (default 1).
    #[serde(default)]
    pub cluster_mib: Option<u32>,
    /// Overwrite what the path holds (a file system, a partition table,
    /// other data): its first and last MiB are zeroed before it is added.
    /// Never an lvstore's.
    #[serde(default)]
    pub wipe: bool,
    /// Wait until its lvstore is ready (or failed); fails at once with
    /// spdk_tgt's cause when that target is failed.
    #[serde(default)]
    pub wait: bool,
    /// How long to wait, in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// `disk_format` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DiskFormatParams {
    /// Disk name.
    pub name: String,
    /// Must be true: the disk's device is overwritten, whatever it holds
    /// (a file system, another lvstore, the lvstore talon made there that
    /// no longer loads, with every replica on it).
    #[serde(default)]
    pub yes_destroy_data: bool,
    /// Wait until the new lvstore is ready (or the format failed).
    #[serde(default)]
    pub wait: bool,
    /// How long to wait, in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// A disk with its engine status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskView {
    /// The name.
    pub name: String,
    /// Desired state.
    pub spec: Disk,
    /// Phase.
    pub phase: Phase,
    /// The engine's status.
    pub status: Option<crate::resources::engine::DiskStatus>,
}

fn disk_ready(d: Option<&DiskStatus>) -> Option<Result<(), String>> {
    match d {
        Some(d) if matches!(d.state, ObjectState::Failed | ObjectState::Unused) => {
            Some(Err(d.message.clone()))
        }
        Some(d) if d.state == ObjectState::Ready => Some(Ok(())),
        _ => None,
    }
}

fn disk_view(state: &State, name: &str) -> Result<DiskView, ApiError> {
    let d = state
        .get_typed::<Disk>(name)?
        .ok_or_else(|| ApiError::not_found(format!("disk {name:?} not found")))?;
    Ok(DiskView {
        name: name.to_string(),
        status: state
            .get_typed::<crate::resources::engine::DiskStatus>(name)?
            .map(|x| x.spec),
        phase: d.metadata.phase,
        spec: d.spec,
    })
}

pub(super) fn register(api: &mut ApiBuilder) {
    use ErrorKind::*;
    api.method(
        "disk_add",
        "Add a disk for replicas: a file/block device, or an NVMe PCI device.",
        &[AlreadyExists, FailedPrecondition],
        |p: DiskAddParams, ctx: Arc<ApiContext>| async move {
            let name = ObjectName::parse("disk", &p.name)?;
            let size_bytes = if p.size_bytes.is_some() || p.size.is_some() {
                Some(size_of(p.size_bytes, &p.size, &format!("disk {name}"))?)
            } else {
                None
            };
            match (&p.path, &p.pci) {
                (Some(path), None) if path.starts_with('/') => {
                    // an lvstore overwrites what is there: new paths, zeros, lvstores,
                    // and with `wipe` what else a device nobody holds carries
                    let path = std::path::PathBuf::from(path);
                    let wipe = p.wipe;
                    tokio::task::spawn_blocking(move || {
                        use crate::host::disk_target;
                        let content = disk_target::check(&path, wipe)?;
                        if wipe && !content.is_blank() && content != disk_target::Content::Lvstore {
                            disk_target::wipe(&path)?;
                            tracing::warn!(path = %path.display(), was = %content, "disk wiped (its first and last MiB zeroed)");
                        }
                        Ok::<_, disk_target::DiskTargetError>(())
                    })
                    .await
                    .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?
                    .map_err(|e| {
                        ApiError::new(
                            FailedPrecondition,
                            format!("disk {name}: {}", crate::util::error_chain(&e)),
                        )
                    })?;
                }
                (Some(path), None) => {
                    return Err(ApiError::invalid(format!(
                        "disk {name}: path {path:?} must be absolute"
                    )));
                }
                (None, Some(pci)) if p.wipe => {
                    return Err(ApiError::invalid(format!(
                        "disk {name}: `wipe` is for a path; NVMe {pci} is read through SPDK once bound: add it without, and if talon refuses what it holds, `talon disk format {name} --yes-destroy-data`"
                    )));
                }
                (None, Some(_)) => {}
                _ => {
                    return Err(ApiError::invalid(format!(
                        "disk {name}: give exactly one of path or pci"
                    )));
                }
            }
            if p.wait
                && let Some(v2) = (ctx.node_info)().engines.into_iter().find(|e| e.engine == "v2")
                && !v2.available
            {
                // nothing would ever make its lvstore: say so before anything is recorded
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!(
                        "disk {name}: this node cannot serve V2 volumes ({}); nothing was added",
                        v2.detail
                    ),
                ));
            }
            let spec = Disk {
                path: p.path,
                pci: p.pci,
                size_bytes,
                cluster_mib: p.cluster_mib.unwrap_or(1),
                block_size: None,
                format: 0,
            };
            ctx.state
                .create_typed(name.as_str(), "", &spec)
                .map_err(|e| exists_as("disk", &name, e))?;
            tracing::info!(
                "disk {name} added: {}",
                spec.path.as_deref().or(spec.pci.as_deref()).unwrap_or_default()
            );
            if p.wait {
                wait_for(
                    &ctx.state,
                    name.as_str(),
                    wait_timeout(p.timeout_seconds),
                    &format!("adding disk {name}"),
                    disk_ready,
                )
                .await?;
            }
            disk_view(&ctx.state, name.as_str())
        },
    );
    api.method(
        "disk_list",
        "Every disk with its engine status.",
        &[],
        |_: crate::api::types::NoParams, ctx: Arc<ApiContext>| async move {
            ctx.state
                .list_typed::<Disk>()?
                .into_iter()
                .map(|d| disk_view(&ctx.state, d.id()))
                .collect::<Result<Vec<_>, _>>()
        },
    );
    api.method(
        "disk_format",
        "Format a disk talon refuses for what its device holds (destroys it).",
        &[NotFound, FailedPrecondition],
        |p: DiskFormatParams, ctx: Arc<ApiContext>| async move {
            let name = ObjectName::parse("disk", &p.name)?;
            let d = ctx
                .state
                .get_typed::<Disk>(name.as_str())?
                .ok_or_else(|| ApiError::not_found(format!("disk {name:?} not found")))?;
            if !p.yes_destroy_data {
                return Err(ApiError::invalid(format!(
                    "disk {name}: formatting overwrites its device, whatever it holds (every replica on it); confirm with --yes-destroy-data (yesDestroyData: true)"
                )));
            }
            if d.metadata.phase == Phase::TearingDown {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!("disk {name} is being removed"),
                ));
            }
            let before = ctx
                .state
                .get_typed::<DiskStatus>(name.as_str())?
                .map(|s| s.spec);
            match &before {
                Some(s) if s.state == ObjectState::Ready => {
                    return Err(ApiError::new(
                        FailedPrecondition,
                        format!(
                            "disk {name} is ready (lvstore {} uuid {} loaded); talon formats only a disk it refuses for what its device holds. To start it over, delete its volumes and remove it",
                            s.lvstore, s.lvstore_uuid
                        ),
                    ));
                }
                Some(s) if s.state == ObjectState::Failed => {}
                _ => {
                    return Err(ApiError::new(
                        FailedPrecondition,
                        format!(
                            "disk {name} is not refused ({}); talon formats only a disk it refuses for what its device holds",
                            before.as_ref().map_or("no status yet".to_owned(), |s| format!("{:?}: {}", s.state, s.message))
                        ),
                    ));
                }
            }
            let spec = Disk {
                format: d.spec.format + 1,
                ..d.spec.clone()
            };
            ctx.state
                .update_typed(name.as_str(), "", Some(d.metadata.version), &spec)?;
            tracing::warn!(disk = %name, request = spec.format, "disk format requested (--yes-destroy-data)");
            if p.wait {
                let refused = before.map(|s| s.message).unwrap_or_default();
                wait_for::<DiskStatus>(
                    &ctx.state,
                    name.as_str(),
                    wait_timeout(p.timeout_seconds),
                    &format!("formatting disk {name}"),
                    move |s| match s {
                        Some(s) if s.state == ObjectState::Ready => Some(Ok(())),
                        Some(s) if s.state == ObjectState::Failed && s.message != refused => {
                            Some(Err(s.message.clone()))
                        }
                        _ => None,
                    },
                )
                .await?;
            }
            disk_view(&ctx.state, name.as_str())
        },
    );
    api.method(
        "disk_remove",
        "Remove a disk (refused while replicas live on it).",
        &[NotFound, FailedPrecondition],
        |p: NameParams, ctx: Arc<ApiContext>| async move {
            if ctx.state.get_typed::<Disk>(&p.name)?.is_none() {
                return Err(ApiError::not_found(format!("disk {:?} not found", p.name)));
            }
            let on: Vec<String> = ctx
                .state
                .list_typed::<ReplicaStatus>()?
                .into_iter()
                .filter(|r| r.spec.disk == p.name)
                .map(|r| r.metadata.id)
                .collect();
            if !on.is_empty() {
                return Err(ApiError::new(
                    FailedPrecondition,
                    format!(
                        "disk {:?} holds replicas ({}); delete their volumes first",
                        p.name,
                        on.join(", ")
                    ),
                ));
            }
            let d = ctx.state.destroy(Disk::NAMESPACE, Disk::TYPE, &p.name, "")?;
            tracing::info!("disk {} removed", p.name);
            Ok(DeleteResult {
                name: p.name,
                deleted: d == Destroyed::Gone,
                tearing_down: d == Destroyed::TearingDown,
            })
        },
    );
}
