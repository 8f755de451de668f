//! Parameter and result types of the admin API. Every field is documented; the
//! OpenRPC document (`rpc.discover`) is generated from these types.

use serde::{Deserialize, Serialize};

/// `node_stop` parameters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeStopParams {
    /// Stop spdk_tgt and tgtd with talon (a drain of the node; their
    /// initiators lose the volumes). False: they keep serving and the next
    /// talon adopts them, unless talon runs with `--stop-targets-on-exit`.
    #[serde(default)]
    pub drain: bool,
}

/// What `node_stop` started.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStopResult {
    /// talon stops (right after this answer).
    pub stopping: bool,
    /// spdk_tgt and tgtd stop with it.
    pub targets_stop: bool,
}

/// No parameters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// Which engines can serve volumes on this node, and why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EngineAvailability {
    /// The engine: `v2` (SPDK) or `v1` (tgtd).
    pub engine: String,
    /// Whether it can serve volumes now.
    pub available: bool,
    /// What it runs (a path), or why it is not available.
    pub detail: String,
}

/// `node_info` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeInfo {
    /// talon's version (git describe).
    pub version: String,
    /// The node's host name.
    pub hostname: String,
    /// The running kernel release.
    pub kernel: String,
    /// `ID` from the host's /etc/os-release (`talos` on Talos Linux).
    pub os_id: String,
    /// `PRETTY_NAME` from the host's /etc/os-release.
    pub os_name: String,
    /// The data directory.
    pub data_dir: String,
    /// Engine availability.
    pub engines: Vec<EngineAvailability>,
    /// The host NQN this node's initiators present (NVMe/TCP attach, remote
    /// replicas): what another node's `replicaHosts` or `allowedHosts` names.
    #[serde(default)]
    pub host_nqn: String,
    /// The initiator name this node's iSCSI attach logs in with.
    #[serde(default)]
    pub host_iqn: String,
}

/// `resource_list` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Resource type, e.g. `Volume` (case-insensitive, plural accepted).
    #[serde(rename = "type")]
    pub type_: String,
}

/// `resource_get` params.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetParams {
    /// Resource type, e.g. `Volume`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Resource id.
    pub id: String,
}

/// `resource_watch` params.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WatchParams {
    /// Only this type (every type when absent).
    #[serde(rename = "type", default)]
    pub type_: Option<String>,
    /// First send every existing resource as a `created` event (default true).
    #[serde(default)]
    pub bootstrap: Option<bool>,
}
