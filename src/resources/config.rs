//! Desired state, written by the admin API and the config file, persisted.

use serde::{Deserialize, Serialize};

use crate::runtime::Spec;

/// Which engine serves a volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// V2 when SPDK is usable on this node, else V1.
    #[default]
    Auto,
    /// SPDK: lvol replicas, raid1 engine, NVMe-oF/TCP.
    V2,
    /// tgtd: a sparse file exported over iSCSI.
    V1,
}

/// How the host attaches a volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FrontendKind {
    /// NVMe/TCP when nvme_tcp is loaded or loadable, else iSCSI.
    #[default]
    Auto,
    /// The kernel NVMe/TCP initiator.
    NvmeTcp,
    /// The kernel iSCSI initiator (iscsiadm in iscsid's namespaces).
    Iscsi,
}

/// Node-wide settings (id `node`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeConfig {
    /// Engine preference for volumes that do not name one.
    #[serde(default)]
    pub engine: EngineKind,
    /// Address the NVMe-oF and iSCSI targets listen on.
    #[serde(default = "default_listen")]
    pub listen_address: String,
    /// NVMe-oF/TCP port.
    #[serde(default = "default_nvmf_port")]
    pub nvmf_port: u16,
    /// iSCSI portal port.
    #[serde(default = "default_iscsi_port")]
    pub iscsi_port: u16,
    /// Hosts (NQNs and IQNs) allowed to connect to every volume, besides the
    /// host a volume is attached to (which is always allowed while attached).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

fn default_listen() -> String {
    "127.0.0.1".to_string()
}
fn default_nvmf_port() -> u16 {
    4420
}
fn default_iscsi_port() -> u16 {
    3260
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            engine: EngineKind::Auto,
            listen_address: default_listen(),
            nvmf_port: default_nvmf_port(),
            iscsi_port: default_iscsi_port(),
            allowed_hosts: Vec::new(),
        }
    }
}

impl Spec for NodeConfig {
    const TYPE: &'static str = "NodeConfig";
    const NAMESPACE: &'static str = "config";
}

/// A disk that holds replicas: a file or block device (aio), or an NVMe PCI device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Disk {
    /// A file or block device path (a file is created sparse with `sizeBytes`).
    #[serde(default)]
    pub path: Option<String>,
    /// An NVMe PCI device by BDF or serial (bound to vfio-pci/uio_pci_generic).
    #[serde(default)]
    pub pci: Option<String>,
    /// Size of a file disk to create.
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// lvstore cluster size in MiB (default 1).
    #[serde(default = "default_cluster_mib")]
    pub cluster_mib: u32,
}

fn default_cluster_mib() -> u32 {
    1
}

impl Spec for Disk {
    const TYPE: &'static str = "Disk";
    const NAMESPACE: &'static str = "config";
}

/// A volume: size, replicas, engine, frontend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Volume {
    /// Size in bytes.
    pub size_bytes: u64,
    /// Number of replicas (V2; V1 has one).
    #[serde(default = "default_replicas")]
    pub replicas: u32,
    /// Engine; `auto` follows the node.
    #[serde(default)]
    pub engine: EngineKind,
    /// Frontend for attaching on the host.
    #[serde(default)]
    pub frontend: FrontendKind,
    /// The disks to place replicas on (any disk when empty).
    #[serde(default)]
    pub disks: Vec<String>,
    /// Create as a clone of this snapshot (`<volume>@<name>`).
    #[serde(default)]
    pub from_snapshot: Option<String>,
    /// Revert the volume's data to this snapshot (`<volume>@<name>`); the engine
    /// does it once per change of `revertGeneration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert_to: Option<String>,
    /// Bumped by every `volume_revert`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub revert_generation: u64,
    /// Replicas kept by other talon nodes (V2): replica `replicas + i` is the
    /// one that node `remoteReplicas[i]` serves (see `serveReplica`), attached
    /// over NVMe/TCP into this node's raid1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_replicas: Vec<RemoteReplica>,
    /// This node only keeps replica `k` of a volume whose engine runs on
    /// another node (V2): lvol `<volume>-r<k>` exported as
    /// `<prefix>:replica:<volume>:r<k>` on the node's listener, no engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_replica: Option<u32>,
    /// With `serveReplica`: the host NQNs allowed to attach the served replica
    /// (the engine node's talon host NQN, `talon node info`); nobody else can.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replica_hosts: Vec<String>,
}

/// Where another talon node serves a replica (its NVMe/TCP listener).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RemoteReplica {
    /// The node's listen address (an IP address).
    pub address: String,
    /// The node's NVMe/TCP port.
    #[serde(default = "default_nvmf_port")]
    pub port: u16,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn default_replicas() -> u32 {
    1
}

impl Spec for Volume {
    const TYPE: &'static str = "Volume";
    const NAMESPACE: &'static str = "config";
}

/// A snapshot of a volume (id `<volume>@<name>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Snapshot {
    /// The volume it is a snapshot of.
    pub volume: String,
    /// The snapshot's name within the volume.
    pub name: String,
}

/// The id of a snapshot resource.
pub fn snapshot_id(volume: &str, name: &str) -> String {
    format!("{volume}@{name}")
}

impl Spec for Snapshot {
    const TYPE: &'static str = "Snapshot";
    const NAMESPACE: &'static str = "config";
}
