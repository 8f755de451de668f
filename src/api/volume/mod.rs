//! Volume methods, one module each (`create`, `read`, `delete`, `expand`,
//! `clone`, `revert`), and beside them one module per noun: snapshots
//! (`snapshot`), disks (`disk`), orphan lvols (`orphan`), attachments (`attach`), thin rebuilds'
//! peer calls (`rebuild`). This file keeps what they share: names, sizes,
//! views, the lifecycle lock and the waits. They validate names, write
//! desired state (`config` resources) and, when asked, wait for the engine's
//! or frontend's status; the controllers do the work.
//!
//! ```text
//!   volume_create ──validate──> Volume (config, persisted) ──> engine controller ──> EngineStatus
//!        └─ wait=true: watch EngineStatus/<name> until ready or failed (bounded); while it
//!           waits for its target, a `failed` TargetStatus (spdk, tgtd) fails the wait at once
//! ```

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{ApiError, ErrorKind};
use super::{ApiBuilder, ApiContext};
use crate::names::ObjectName;
use crate::resources::config::{
    Disk, EngineKind, FrontendKind, RemoteReplica, Snapshot, Volume, snapshot_id,
};
use crate::resources::engine::{
    DiskStatus, Engine, EngineStatus, ObjectState, RebuildDest, RebuildDestStatus, ReplicaStatus,
    SnapshotStatus, TargetStatus,
};
use crate::resources::frontend::{AttachState, Attachment, AttachmentStatus};
use crate::runtime::{Destroyed, Phase, Spec, State, Typed};
use crate::util::size::Bytes;

mod attach;
mod clone;
mod create;
mod delete;
mod disk;
mod expand;
mod orphan;
mod read;
mod rebuild;
mod revert;
mod snapshot;

pub use attach::AttachParams;
pub use clone::CloneParams;
pub use create::VolumeCreateParams;
pub use disk::{DiskAddParams, DiskFormatParams, DiskView};
pub use expand::ExpandParams;
pub use orphan::{OrphanRemoveParams, OrphanView};
pub use rebuild::RebuildPrepareParams;
pub use snapshot::{SnapshotListParams, SnapshotView};

/// Parses a size: bytes, or a number with a binary (`KiB`, `MiB`, `GiB`, `TiB`,
/// or `K`/`M`/`G`/`T`) or decimal (`KB`, `MB`, `GB`, `TB`) unit. Exact, in
/// integers: a fraction is taken only when it comes to a whole number of
/// bytes (`1.5GiB` is 1610612736; `0.3KiB`, 307.2 bytes, is refused).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let not_a_number = || format!("size {s:?} does not start with a number");
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if (whole.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(not_a_number());
    }
    let mult: u128 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "size {s:?} has an unknown unit {u:?} (valid: B, K/KiB, M/MiB, G/GiB, T/TiB, KB, MB, GB, TB)"
            ));
        }
    };
    let out_of_range = || format!("size {s:?} is out of range");
    // the number as digits / 10^frac.len(), times the unit, in u128
    let frac = frac.trim_end_matches('0');
    let digits: u128 = if whole.len() + frac.len() > 38 {
        return Err(out_of_range());
    } else {
        format!("{whole}{frac}").parse().unwrap_or(0)
    };
    let scale = 10u128.pow(frac.len() as u32);
    let scaled = digits.checked_mul(mult).ok_or_else(out_of_range)?;
    if scaled % scale != 0 {
        return Err(format!("size {s:?} is not a whole number of bytes"));
    }
    match u64::try_from(scaled / scale) {
        Ok(0) | Err(_) => Err(out_of_range()),
        Ok(bytes) => Ok(bytes),
    }
}

/// The largest volume talon serves: 64 TiB (SPDK's lvols and raid1 go
/// further; a V1 file on ext4 stops at 16 TiB, which the engine reports).
pub const MAX_VOLUME_BYTES: u64 = 64 << 40;
/// Volume sizes are multiples of this: the logical block of both engines'
/// exports (V2 rounds up to its lvstore cluster on top).
pub const VOLUME_BLOCK: u64 = 512;

/// Checks a volume size against what the engines can serve, before anything
/// is stored.
pub(crate) fn check_volume_size(what: &str, size: u64) -> Result<u64, ApiError> {
    if size == 0 {
        return Err(ApiError::invalid(format!("{what}: a volume must not be empty")));
    }
    if size > MAX_VOLUME_BYTES {
        return Err(ApiError::invalid(format!(
            "{what}: size {} is larger than the {} TiB talon serves",
            Bytes(size),
            MAX_VOLUME_BYTES >> 40
        )));
    }
    if !size.is_multiple_of(VOLUME_BLOCK) {
        return Err(ApiError::invalid(format!(
            "{what}: size {} is not a multiple of the {VOLUME_BLOCK}-byte block",
            Bytes(size)
        )));
    }
    Ok(size)
}

/// Whether `spec` would be V1 here, the engine `selection::engine_for`
/// picks: the volume's, else the node's, else V2 when this node has it
/// available. `Some(how)` when V1, with how it came to be V1.
fn v1_here(ctx: &ApiContext, spec: &Volume) -> Result<Option<&'static str>, ApiError> {
    let node = ctx
        .state
        .get_typed::<crate::resources::config::NodeConfig>("node")?
        .map(|n| n.spec)
        .unwrap_or_default();
    Ok(match (spec.engine, node.engine) {
        (EngineKind::V1, _) => Some("engine v1"),
        (EngineKind::Auto, EngineKind::V1) => Some("engine auto is v1 on this node (its node config)"),
        (EngineKind::V2, _) | (EngineKind::Auto, EngineKind::V2) => None,
        (EngineKind::Auto, EngineKind::Auto) => (!(ctx.node_info)()
            .engines
            .iter()
            .any(|e| e.engine == "v2" && e.available))
        .then_some("engine auto is v1 on this node (no usable spdk_tgt)"),
    })
}

/// Refuses what only the V2 engine serves on a node that cannot run it (no
/// usable spdk_tgt, too few hugepages): nothing would ever serve it, so
/// nothing is stored.
pub(crate) fn refuse_without_v2(ctx: &ApiContext, what: &str) -> Result<(), ApiError> {
    match (ctx.node_info)().engines.into_iter().find(|e| e.engine == "v2") {
        Some(v2) if !v2.available => Err(ApiError::new(
            ErrorKind::FailedPrecondition,
            format!(
                "{what}: engine v2 needs SPDK, and this node cannot serve V2 volumes ({}); nothing was created",
                v2.detail
            ),
        )),
        _ => Ok(()),
    }
}

/// An engine choice as the API writes it (`auto`, `v1`, `v2`).
pub(crate) fn engine_word(e: EngineKind) -> String {
    match serde_json::to_value(e) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{e:?}"),
    }
}

/// Checks a size against the file size limit of the data directory's
/// filesystem when the volume would be V1 here (a file: 16 TiB - 4 KiB on
/// ext4 with 4 KiB blocks), so that the spec is never stored for the engine
/// to refuse.
fn check_v1_file_size(ctx: &ApiContext, what: &str, spec: &Volume) -> Result<(), ApiError> {
    if v1_here(ctx, spec)?.is_none() {
        return Ok(());
    }
    let dir = std::path::PathBuf::from((ctx.node_info)().data_dir);
    if let Some((fs, max)) =
        crate::tgt::volume::filesystem_limit(&dir).filter(|(_, max)| spec.size_bytes > *max)
    {
        return Err(ApiError::invalid(format!(
            "{what}: size {} is larger than the {} a V1 volume file can have on the {fs} filesystem of {}",
            Bytes(spec.size_bytes),
            Bytes(max),
            dir.display()
        )));
    }
    Ok(())
}

/// A size given as bytes (`sizeBytes`) or as text (`size: "10GiB"`).
fn size_of(size_bytes: Option<u64>, size: &Option<String>, what: &str) -> Result<u64, ApiError> {
    match (size_bytes, size) {
        (Some(b), None) if b > 0 => Ok(b),
        (None, Some(s)) => parse_size(s).map_err(|e| ApiError::invalid(format!("{what}: {e}"))),
        (Some(_), Some(_)) => Err(ApiError::invalid(format!(
            "{what}: give sizeBytes or size, not both"
        ))),
        _ => Err(ApiError::invalid(format!(
            "{what}: a size is required (sizeBytes or size)"
        ))),
    }
}

/// How long a `wait` may take.
pub(crate) fn wait_timeout(timeout_seconds: Option<u64>) -> Duration {
    Duration::from_secs(timeout_seconds.unwrap_or(120))
}

/// Params naming a volume.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NameParams {
    /// The name.
    pub name: String,
    /// Wait until the operation is done (or failed).
    #[serde(default)]
    pub wait: bool,
    /// How long to wait, in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// `snapshot_create` / `snapshot_delete` / `volume_revert` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotParams {
    /// The volume.
    pub volume: String,
    /// The snapshot's name.
    pub name: String,
    /// Wait until the operation is done (or failed).
    #[serde(default)]
    pub wait: bool,
    /// How long to wait, in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// A volume with everything known about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeView {
    /// The name.
    pub name: String,
    /// Desired state.
    pub spec: Volume,
    /// `running` or `tearing-down`.
    pub phase: Phase,
    /// The engine's status, once it has seen the volume.
    pub engine: Option<EngineStatus>,
    /// Replicas.
    pub replicas: Vec<ReplicaStatus>,
    /// The attachment on this host, if any.
    pub attachment: Option<AttachmentStatus>,
}

/// What a delete did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeleteResult {
    /// The object.
    pub name: String,
    /// Gone now.
    pub deleted: bool,
    /// Still being torn down by the engine.
    pub tearing_down: bool,
}

/// A create that found the object already there, said in the API's words
/// (`volume "v1" already exists`); any other store error maps as usual.
pub(crate) fn exists_as(what: &str, id: &dyn std::fmt::Display, e: crate::runtime::StateError) -> ApiError {
    match e {
        crate::runtime::StateError::AlreadyExists { .. } => ApiError::new(
            ErrorKind::AlreadyExists,
            format!("{what} {:?} already exists", id.to_string()),
        ),
        e => e.into(),
    }
}

pub(crate) fn volume_name(s: &str) -> Result<ObjectName, ApiError> {
    Ok(ObjectName::parse("volume", s)?)
}

/// A volume by name; a name that cannot be one is refused as invalid, with
/// the rule, before any lookup.
pub(crate) fn get_volume(state: &State, name: &str) -> Result<Typed<Volume>, ApiError> {
    volume_name(name)?;
    state
        .get_typed::<Volume>(name)?
        .ok_or_else(|| ApiError::not_found(format!("volume {name:?} not found")))
}

/// Serialises the checks and writes of the requests that create, change or
/// delete volumes, snapshots and attachments, so that a check ("no
/// snapshots", "not being deleted") still holds when the write lands: no
/// volume is deleted while it has snapshots, in whichever order the requests
/// come. Held for the check and the write only, never across a `wait`.
pub(crate) static LIFECYCLE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A volume that is not being deleted: requests on one that is tearing down
/// are refused (its engine objects are going away).
pub(crate) fn live_volume(state: &State, name: &str, action: &str) -> Result<Typed<Volume>, ApiError> {
    let v = get_volume(state, name)?;
    if v.metadata.phase == Phase::TearingDown {
        return Err(ApiError::new(
            ErrorKind::FailedPrecondition,
            format!("volume {name:?} is being deleted; cannot {action}"),
        ));
    }
    if v.spec.standby {
        return Err(ApiError::new(
            ErrorKind::FailedPrecondition,
            format!(
                "volume {name:?} is a standby (DR) volume, not served; activate it (volume_activate) to {action}"
            ),
        ));
    }
    Ok(v)
}

/// `remoteReplicas` of a new volume (`what` names it): IP addresses and
/// ports, and an `api` that is `IP:PORT`.
pub(crate) fn check_remote_replicas(what: &str, remote: &[RemoteReplica]) -> Result<(), ApiError> {
    for r in remote {
        if r.address.parse::<std::net::IpAddr>().is_err() || r.port == 0 {
            return Err(ApiError::invalid(format!(
                "{what}: remote replica {:?}:{} is not an IP address and port",
                r.address, r.port
            )));
        }
        if let Some(api) = &r.api
            && api.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(ApiError::invalid(format!(
                "{what}: remote replica {}:{}: api {api:?} is not an IP address and port \
                 (the node's talon --listen-tcp)",
                r.address, r.port
            )));
        }
    }
    Ok(())
}

/// A snapshot that exists and is not being deleted.
pub(crate) fn live_snapshot(state: &State, id: &str, action: &str) -> Result<Typed<Snapshot>, ApiError> {
    let s = state
        .get_typed::<Snapshot>(id)?
        .ok_or_else(|| ApiError::not_found(format!("snapshot {id:?} not found")))?;
    if s.metadata.phase == Phase::TearingDown {
        return Err(ApiError::new(
            ErrorKind::FailedPrecondition,
            format!("snapshot {id:?} is being deleted; cannot {action}"),
        ));
    }
    Ok(s)
}

pub(crate) fn view(state: &State, v: Typed<Volume>) -> Result<VolumeView, ApiError> {
    let name = v.metadata.id.clone();
    let replicas = state
        .list_typed::<ReplicaStatus>()?
        .into_iter()
        .filter(|r| r.spec.volume == name)
        .map(|r| r.spec)
        .collect();
    Ok(VolumeView {
        engine: state.get_typed::<EngineStatus>(&name)?.map(|e| e.spec),
        attachment: state.get_typed::<AttachmentStatus>(&name)?.map(|a| a.spec),
        replicas,
        phase: v.metadata.phase,
        spec: v.spec,
        name,
    })
}

/// A status a wait may hang on because its engine's target cannot start.
pub(crate) trait OnTarget: Spec {
    /// The engine whose target this status waits for, if it waits.
    fn waits_for_target(&self) -> Option<Engine> {
        None
    }
}

impl OnTarget for EngineStatus {
    fn waits_for_target(&self) -> Option<Engine> {
        (self.state == ObjectState::Creating).then_some(self.engine)
    }
}

impl OnTarget for SnapshotStatus {
    fn waits_for_target(&self) -> Option<Engine> {
        (self.state == ObjectState::Creating).then_some(self.engine)
    }
}

impl OnTarget for RebuildDestStatus {}

impl OnTarget for DiskStatus {
    fn waits_for_target(&self) -> Option<Engine> {
        (self.state == ObjectState::Creating).then_some(Engine::V2)
    }
}

impl OnTarget for Volume {}
impl OnTarget for Snapshot {}
impl OnTarget for AttachmentStatus {}

/// Why `engine`'s target cannot serve, when its `TargetStatus` is `failed`.
fn target_failure(state: &State, engine: Engine) -> Result<Option<String>, ApiError> {
    let (id, program) = match engine {
        Engine::V2 => ("spdk", "spdk_tgt"),
        Engine::V1 => ("tgtd", "tgtd"),
    };
    Ok(state
        .get_typed::<TargetStatus>(id)?
        .filter(|t| t.spec.state == ObjectState::Failed)
        .map(|t| format!("it waits for {program}, which is failed: {}", t.spec.message)))
}

/// Waits (event-driven) until `done` says yes or no for resource `S/id`, or the
/// timeout passes. `done` returns `Some(Ok)` when finished, `Some(Err)` on failure.
/// A status that waits for a target whose `TargetStatus` is `failed` fails at
/// once with the target's cause.
pub(crate) async fn wait_for<S: OnTarget>(
    state: &State,
    id: &str,
    timeout: Duration,
    what: &str,
    done: impl Fn(Option<&S>) -> Option<Result<(), String>>,
) -> Result<(), ApiError> {
    let (_, mut rx) = state.watch(Some((S::NAMESPACE, S::TYPE)));
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let cur = state.get_typed::<S>(id)?;
        match done(cur.as_ref().map(|t| &t.spec)) {
            Some(Ok(())) => return Ok(()),
            Some(Err(msg)) => {
                return Err(ApiError::new(
                    ErrorKind::FailedPrecondition,
                    format!("{what} failed: {msg}"),
                ));
            }
            None => {}
        }
        if let Some(engine) = cur.as_ref().and_then(|c| c.spec.waits_for_target())
            && let Some(why) = target_failure(state, engine)?
        {
            return Err(ApiError::new(
                ErrorKind::Unavailable,
                format!("{what} cannot finish: {why}"),
            ));
        }
        tokio::select! {
            _ = rx.recv() => {}
            _ = tokio::time::sleep_until(deadline) => {
                return Err(ApiError::new(
                    ErrorKind::Unavailable,
                    format!("{what} did not finish within {timeout:?} (it goes on in the background; see `talon get {} {id}`)", S::TYPE),
                ));
            }
        }
    }
}

pub(crate) fn engine_ready(size: u64) -> impl Fn(Option<&EngineStatus>) -> Option<Result<(), String>> {
    move |e| match e {
        Some(e) if e.state == ObjectState::Failed => Some(Err(e.message.clone())),
        Some(e) if matches!(e.state, ObjectState::Ready | ObjectState::Degraded) && e.size_bytes >= size => {
            Some(Ok(()))
        }
        _ => None,
    }
}

pub(crate) fn wait_gone<S: Spec>(s: Option<&S>) -> Option<Result<(), String>> {
    s.is_none().then_some(Ok(()))
}

/// Registers the volume, snapshot, disk and attachment methods, in the
/// order `rpc.discover` lists them.
pub fn register(api: &mut ApiBuilder) {
    rebuild::register(api);
    snapshot::register(api);
    disk::register(api);
    orphan::register(api);
    attach::register(api);
    create::register(api);
    read::register(api);
    delete::register(api);
    expand::register(api);
    clone::register(api);
    revert::register(api);
}

#[cfg(test)]
pub(crate) mod lifecycle_tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};

    use super::*;
    use crate::api::types::NodeInfo;

    fn api(state: &State) -> jsonrpsee::Methods {
        api_in(state, "")
    }

    /// The API of a node whose data directory is `data_dir` and that has no
    /// V2 engine (auto volumes are V1).
    fn api_in(state: &State, data_dir: &str) -> jsonrpsee::Methods {
        api_with(state, data_dir, |_| {})
    }

    /// [`api_in`], with the methods `more` registers too (another module's).
    pub(crate) fn api_with(state: &State, data_dir: &str, more: fn(&mut ApiBuilder)) -> jsonrpsee::Methods {
        let data_dir = data_dir.to_owned();
        let ctx = ApiContext {
            state: state.clone(),
            registry: Arc::new(crate::resources::registry()),
            statuses: Default::default(),
            node_info: Arc::new(move || NodeInfo {
                version: String::new(),
                hostname: String::new(),
                kernel: String::new(),
                os_id: String::new(),
                os_name: String::new(),
                data_dir: data_dir.clone(),
                engines: Vec::new(),
                host_nqn: String::new(),
                host_iqn: String::new(),
            }),
            node_stop: Arc::new(|_drain| false),
        };
        let mut b = ApiBuilder::new(ctx);
        register(&mut b);
        more(&mut b);
        b.build()
    }

    /// The error code and message of a call, or its result.
    pub(crate) async fn call(
        m: &jsonrpsee::Methods,
        method: &str,
        params: Value,
    ) -> Result<Value, (i32, String)> {
        let mut object = jsonrpsee::core::params::ObjectParams::new();
        for (k, v) in params.as_object().expect("object") {
            object.insert(k, v).expect("param");
        }
        let params = object;
        m.call::<_, Value>(method, params).await.map_err(|e| match e {
            jsonrpsee::core::server::MethodsError::JsonRpc(o) => (o.code(), o.message().to_string()),
            other => (0, other.to_string()),
        })
    }

    fn volume(state: &State, name: &str) {
        state
            .create(
                "config",
                "Volume",
                name,
                "",
                json!({"sizeBytes": 1 << 20, "engine": "v1"}),
                BTreeMap::new(),
            )
            .expect("volume");
    }

    #[tokio::test]
    async fn requests_on_a_volume_being_deleted_are_refused() {
        let state = State::in_memory();
        let m = api(&state);
        volume(&state, "v");
        call(&m, "snapshot_create", json!({"volume": "v", "name": "s"}))
            .await
            .expect("snapshot");
        // the engine holds the volume (an initiator is logged in), so the delete tears down
        state
            .add_finalizer("config", "Volume", "v", "engine")
            .expect("finalizer");
        call(&m, "snapshot_delete", json!({"volume": "v", "name": "s"}))
            .await
            .expect("snapshot delete");
        call(&m, "volume_delete", json!({"name": "v"}))
            .await
            .expect("delete starts");
        let refused = [
            ("snapshot_create", json!({"volume": "v", "name": "s2"})),
            ("volume_expand", json!({"name": "v", "sizeBytes": 2 << 20})),
            ("volume_attach", json!({"name": "v"})),
            (
                "volume_clone",
                json!({"name": "c", "volume": "v", "snapshot": "s"}),
            ),
            ("volume_revert", json!({"volume": "v", "name": "s"})),
        ];
        for (method, params) in refused {
            let (code, msg) = call(&m, method, params).await.expect_err(method);
            assert!(
                (code == ErrorKind::FailedPrecondition.code() && msg.contains("is being deleted"))
                    || code == ErrorKind::NotFound.code(),
                "{method}: {code} {msg}"
            );
            assert!(msg.contains("\"v\"") || msg.contains("v@s"), "{method}: {msg}");
        }
        assert!(state.get("config", "Snapshot", "v@s2").is_none());
        assert!(state.get("config", "Volume", "c").is_none());
        assert!(state.get("config", "Attachment", "v").is_none());
        let v = get_volume(&state, "v").expect("volume");
        assert_eq!(v.spec.size_bytes, 1 << 20, "the expand was not stored");
    }

    #[tokio::test]
    async fn sizes_the_engines_cannot_serve_are_refused_before_anything_is_stored() {
        let state = State::in_memory();
        let m = api(&state);
        let bad: [(Value, &str); 5] = [
            (json!(u64::MAX), "larger than the 64 TiB"),
            (json!(1u64 << 60), "larger than the 64 TiB"),
            (json!(1000), "not a multiple of the 512-byte block"),
            (json!(0), "a size is required"),
            (json!("1EiB"), "unknown unit"),
        ];
        for (size, why) in bad {
            let key = if size.is_string() { "size" } else { "sizeBytes" };
            let (code, msg) = call(&m, "volume_create", json!({"name": "big", key: size}))
                .await
                .expect_err(why);
            assert_eq!(code, ErrorKind::InvalidParams.code(), "{msg}");
            assert!(msg.contains(why) && msg.contains("volume big"), "{msg}");
            assert!(
                state.get("config", "Volume", "big").is_none(),
                "nothing stored for {size}"
            );
        }
        call(&m, "volume_create", json!({"name": "v", "size": "1MiB"}))
            .await
            .expect("a servable size");

        // an expand the engine has not done (it could not) does not block a smaller one
        state
            .create(
                "engine",
                "EngineStatus",
                "v",
                "test.Engine",
                json!({"engine": "v1", "state": "ready", "sizeBytes": 1 << 20, "device": "",
                       "replicas": [], "exports": [], "message": "expand to 68719476736 bytes waits"}),
                BTreeMap::new(),
            )
            .expect("status");
        for (size, ok) in [
            (json!(u64::MAX), false),
            (json!(64u64 << 40), true),
            (json!(2 << 20), true),
            (json!(512 << 10), false),
        ] {
            let r = call(&m, "volume_expand", json!({"name": "v", "sizeBytes": size})).await;
            assert_eq!(r.is_ok(), ok, "expand to {size}: {r:?}");
        }
        assert_eq!(get_volume(&state, "v").expect("v").spec.size_bytes, 2 << 20);

        // a served replica names who may attach it, with a valid NQN
        let (_, msg) = call(
            &m,
            "volume_create",
            json!({"name": "r", "size": "1MiB", "serveReplica": 1}),
        )
        .await
        .expect_err("no replicaHosts");
        assert!(msg.contains("needs replicaHosts"), "{msg}");
        let (_, msg) = call(
            &m,
            "volume_create",
            json!({"name": "r", "size": "1MiB", "serveReplica": 1, "replicaHosts": ["nqn.x,hostnqn=y"]}),
        )
        .await
        .expect_err("a bad NQN");
        assert!(msg.contains("replicaHosts") && msg.contains("NQN"), "{msg}");
        call(
            &m,
            "volume_create",
            json!({"name": "r", "size": "1MiB", "serveReplica": 1,
                   "replicaHosts": ["nqn.2014-08.org.nvmexpress:uuid:1"]}),
        )
        .await
        .expect("a served replica for one engine");
    }

    #[tokio::test]
    async fn a_v1_size_beyond_the_data_dirs_ext4_file_limit_is_refused_by_the_api() {
        let d = tempfile::tempdir().expect("tempdir");
        let Some(("ext4", max)) = crate::tgt::volume::filesystem_limit(d.path()) else {
            eprintln!(
                "SKIP a_v1_size_beyond_the_data_dirs_ext4_file_limit_is_refused_by_the_api: {} is not on ext4",
                d.path().display()
            );
            return;
        };
        let state = State::in_memory();
        let m = api_in(&state, d.path().to_str().expect("utf8"));
        let over = (max / 512 + 1) * 512;
        let (code, msg) = call(&m, "volume_create", json!({"name": "big", "sizeBytes": over}))
            .await
            .expect_err("beyond ext4's largest file");
        assert_eq!(code, ErrorKind::InvalidParams.code(), "{msg}");
        assert!(msg.contains("ext4") && msg.contains("volume big"), "{msg}");
        assert!(state.get("config", "Volume", "big").is_none(), "nothing stored");
        // the same size for V2 (lvols, not files) is accepted
        call(
            &m,
            "volume_create",
            json!({"name": "big", "sizeBytes": over, "engine": "v2"}),
        )
        .await
        .expect("V2 is not bound by the file limit");
        // an expand past the limit is refused and not stored
        call(&m, "volume_create", json!({"name": "small", "size": "1MiB"}))
            .await
            .expect("small");
        let (_, msg) = call(&m, "volume_expand", json!({"name": "small", "sizeBytes": over}))
            .await
            .expect_err("expand beyond");
        assert!(msg.contains("ext4"), "{msg}");
        assert_eq!(get_volume(&state, "small").expect("v").spec.size_bytes, 1 << 20);
    }

    /// Snapshot creates and volume deletes racing on many volumes: whichever
    /// wins, no volume is deleted while it has a snapshot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn no_volume_is_deleted_while_it_has_snapshots_in_any_order() {
        let state = State::in_memory();
        let m = Arc::new(api(&state));
        let n = 200;
        for i in 0..n {
            volume(&state, &format!("v{i}"));
        }
        let mut tasks = Vec::new();
        for i in 0..n {
            let (m1, m2) = (m.clone(), m.clone());
            let v = format!("v{i}");
            let v2 = v.clone();
            tasks.push(tokio::spawn(async move {
                call(&m1, "snapshot_create", json!({"volume": v, "name": "s"})).await
            }));
            tasks.push(tokio::spawn(async move {
                call(&m2, "volume_delete", json!({"name": v2})).await
            }));
        }
        for t in tasks {
            let _ = t.await.expect("task");
        }
        for i in 0..n {
            let v = format!("v{i}");
            let snap = state.get("config", "Snapshot", &format!("{v}@s")).is_some();
            let vol = state.get("config", "Volume", &v).is_some();
            assert!(!snap || vol, "{v} was deleted with snapshot {v}@s");
        }
    }

    #[tokio::test]
    async fn a_rebuild_prepare_is_asked_of_a_served_replica_and_answered_by_generation() {
        let state = State::in_memory();
        let m = api(&state);
        volume(&state, "engine-here");
        state
            .create(
                "config",
                "Volume",
                "served",
                "",
                json!({"sizeBytes": 1 << 20, "engine": "v2", "serveReplica": 1,
                       "replicaHosts": ["nqn.2014-08.org.nvmexpress:uuid:host1"]}),
                BTreeMap::new(),
            )
            .expect("served volume");
        // refused before anything is stored
        let refused = [
            (
                json!({"volume": "nope", "chain": []}),
                ErrorKind::NotFound,
                "nope",
            ),
            (
                json!({"volume": "engine-here", "chain": []}),
                ErrorKind::FailedPrecondition,
                "not a replica this node serves",
            ),
            (
                json!({"volume": "served", "chain": ["s1", "rb.1"]}),
                ErrorKind::InvalidParams,
                "rb.1",
            ),
        ];
        for (params, kind, why) in refused {
            let (code, msg) = call(&m, "replica_rebuild_prepare", params.clone())
                .await
                .expect_err(why);
            assert_eq!(code, kind.code(), "{params}: {msg}");
            assert!(msg.contains(why), "{params}: {msg}");
        }
        assert!(state.list("engine", "RebuildDest").is_empty());

        // asked twice: each request raises the generation, each waits for its own answer
        for generation in 1..=2u64 {
            let answer = {
                let state = state.clone();
                tokio::spawn(async move {
                    let req = crate::runtime::testing::eventually(
                        "the request",
                        Duration::from_secs(5),
                        || async {
                            state
                                .get_typed::<RebuildDest>("served")
                                .ok()
                                .flatten()
                                .filter(|r| r.spec.generation == generation)
                        },
                    )
                    .await;
                    assert_eq!(req.spec.chain, vec!["s1".to_string(), "s2".to_string()]);
                    let a = RebuildDestStatus {
                        generation,
                        shared: 1,
                        reset: true,
                        ..RebuildDestStatus::default()
                    };
                    match state.get_typed::<RebuildDestStatus>("served").expect("get") {
                        Some(cur) => state
                            .update_typed("served", "", Some(cur.metadata.version), &a)
                            .expect("answer"),
                        None => state.create_typed("served", "", &a).expect("answer"),
                    };
                })
            };
            let got = call(
                &m,
                "replica_rebuild_prepare",
                json!({"volume": "served", "chain": ["s1", "s2"], "timeoutSeconds": 10}),
            )
            .await
            .expect("answered");
            answer.await.expect("answerer");
            assert_eq!(got["generation"], generation);
            assert_eq!(got["shared"], 1);
            assert_eq!(got["reset"], true);
        }
        call(&m, "volume_delete", json!({"name": "served"}))
            .await
            .expect("delete");
        assert!(
            state.list("engine", "RebuildDest").is_empty(),
            "the request goes with its volume"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("ten").is_err());
        let e = parse_size("1XB").expect_err("unknown unit");
        assert!(
            e.contains("unknown unit \"xb\"") && e.contains("valid: B, K/KiB"),
            "{e}"
        );
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn sizes_are_exact_or_refused() {
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("1.5GiB"), Ok(1_610_612_736));
        assert_eq!(parse_size("1536MiB"), Ok(1_610_612_736));
        assert_eq!(parse_size(" 2.50 KB "), Ok(2_500));
        assert_eq!(parse_size(".5KiB"), Ok(512));
        assert_eq!(parse_size("5."), Ok(5));
        assert_eq!(parse_size("0.000000001GB"), Ok(1));
        assert_eq!(
            parse_size("16777215.999999940395355224609375TiB"),
            Err("size \"16777215.999999940395355224609375TiB\" is out of range".into())
        );
        // 2^64 - 1 bytes is the largest; f64 would have rounded both of these
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("9007199254740993"), Ok(9_007_199_254_740_993));
        for bad in [
            "18446744073709551616",
            "0.3KiB",
            "1.0000001KiB",
            "0.5",
            "1.2.3",
            ".",
            "",
            "0.0",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_size("0.3KiB").expect_err("fraction of a byte"),
            "size \"0.3KiB\" is not a whole number of bytes"
        );
        assert!(
            parse_size(".")
                .expect_err("no digits")
                .contains("does not start with a number")
        );
    }
}
