//! Desired state, written by the admin API and the config file, persisted.

use serde::{Deserialize, Serialize};

use crate::names::ObjectName;
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
    /// Require iSCSI CHAP on V1 targets: initiators log in with the user and
    /// secret of `<data-dir>/iscsi-chap` (0600, made by talon with a random
    /// secret if absent), on top of the initiator-name ACL. This host's attach
    /// path uses the same file. The secret is never in the node config.
    #[serde(default)]
    pub iscsi_chap: bool,
    /// Require NVMe in-band authentication (DH-HMAC-CHAP) on V2 exports:
    /// every allowed host is listed with its secret from
    /// `<data-dir>/nvme-dhchap/<host NQN>` (0600; this node's own is made by
    /// talon, another host's is put there by the operator, for another talon
    /// node a copy of its own file). This host's kernel attach and the
    /// engine's attach of remote replicas authenticate with this node's
    /// secret. The secrets are never in the node config.
    #[serde(default)]
    pub nvme_dhchap: bool,
    /// NVMe/TCP TLS 1.3 with pre-shared keys on node-to-node links (V2):
    /// replicas this node serves (`serveReplica`) listen with TLS on
    /// `replicaTlsPort` and admit each host with its PSK from
    /// `<data-dir>/nvme-tls/<host NQN>` (0600, PSK interchange format; this
    /// node's own made by talon, another node's copied there by the operator);
    /// this node attaches remote replicas over TLS with its own PSK (point
    /// their `remoteReplicas[].port` at the serving node's `replicaTlsPort`).
    /// Volumes attached by kernel hosts are not affected.
    #[serde(default)]
    pub replica_tls: bool,
    /// The TLS port of `replicaTls` (TLS is a property of a listening port in
    /// SPDK, so it cannot share `nvmfPort`).
    #[serde(default = "default_replica_tls_port")]
    pub replica_tls_port: u16,
    /// Caps SPDK's raid rebuild (remote replicas, and volumes whose thin
    /// rebuilds failed) at this many MiB/s: `bdev_set_qos_limit` on the
    /// member being rebuilt, lifted when it is back; none by default. Thin
    /// rebuilds are not capped (see docs/replicas.md "Thin rebuild").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild_mib_per_sec: Option<u64>,
    /// How far the sizes of the thin replicas on one disk may add up past its capacity, in
    /// percent of it: a new replica (or an expansion) that would go past it is refused, naming
    /// the disk and the figures. Default 500 (Longhorn's `--longhorn-overcommit-percent` too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overcommit_percent: Option<u32>,
    /// How long, in seconds, an engine keeps a local replica's member behind
    /// the replica's export after another node's engine last asked for it
    /// or read it (Longhorn moving the engine), before it goes back to the
    /// lvol itself (default 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_share_hold_secs: Option<u64>,
    /// The 2 MiB hugepage pool for SPDK: `auto` (sized from the volumes this
    /// node exports, on the NUMA nodes of the SPDK cores), a fixed number of
    /// MiB, or `off` (talon leaves the pool alone).
    #[serde(default)]
    pub hugepages: HugepagesSetting,
    /// The folder under which Longhorn's calls may name folder backup
    /// targets (`vfs:///<dir>`, absolute). None by default: Longhorn's ports
    /// have no authentication, so a caller there names no local folder
    /// unless the operator set one here. talon's own API takes any folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_folder_root: Option<String>,
    /// Where the backup target secrets given to this node are: a
    /// `credentialSecret` of talon's API names one, `<dir>/<name>` (a
    /// mounted Kubernetes secret, one file per key, or a Secret manifest
    /// file). Default `/etc/talon/backup-secrets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_secrets_dir: Option<String>,
}

/// Where backup target secrets are when `NodeConfig.backupSecretsDir` is unset.
pub const DEFAULT_BACKUP_SECRETS_DIR: &str = "/etc/talon/backup-secrets";

impl NodeConfig {
    /// [`NodeConfig::backup_secrets_dir`] or its default.
    pub fn backup_secrets_dir(&self) -> std::path::PathBuf {
        std::path::PathBuf::from(
            self.backup_secrets_dir
                .as_deref()
                .unwrap_or(DEFAULT_BACKUP_SECRETS_DIR),
        )
    }
}

/// `NodeConfig.hugepages`: `auto`, `off`, or MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged, expecting = "`auto`, `off` or a number of MiB")]
pub enum HugepagesSetting {
    /// `auto` or `off`.
    Keyword(HugepagesKeyword),
    /// This many MiB of 2 MiB pages (rounded up to whole pages).
    Mib(u64),
}

/// The keywords of [`HugepagesSetting`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HugepagesKeyword {
    /// About 1024 MiB + 8 MiB per exported NVMe/TCP volume while SPDK can run
    /// here (docs/sizing.md); nothing on a node without SPDK.
    Auto,
    /// talon neither grows nor shrinks the pool (pages it added earlier are
    /// given back once free).
    Off,
}

impl HugepagesSetting {
    /// `auto`.
    pub const AUTO: Self = Self::Keyword(HugepagesKeyword::Auto);
    /// `off`.
    pub const OFF: Self = Self::Keyword(HugepagesKeyword::Off);
}

impl Default for HugepagesSetting {
    fn default() -> Self {
        Self::AUTO
    }
}

impl std::fmt::Display for HugepagesSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Keyword(HugepagesKeyword::Auto) => f.write_str("auto"),
            Self::Keyword(HugepagesKeyword::Off) => f.write_str("off"),
            Self::Mib(m) => write!(f, "{m} MiB"),
        }
    }
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
fn default_replica_tls_port() -> u16 {
    4421
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            engine: EngineKind::Auto,
            listen_address: default_listen(),
            nvmf_port: default_nvmf_port(),
            iscsi_port: default_iscsi_port(),
            allowed_hosts: Vec::new(),
            iscsi_chap: false,
            nvme_dhchap: false,
            replica_tls: false,
            replica_tls_port: default_replica_tls_port(),
            rebuild_mib_per_sec: None,
            overcommit_percent: None,
            replica_share_hold_secs: None,
            hugepages: HugepagesSetting::AUTO,
            backup_folder_root: None,
            backup_secrets_dir: None,
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
    /// Block size of an aio disk's bdev in bytes (a power of two, at least
    /// 512, not below the device's own); SPDK detects it when absent (4096
    /// for a file). Longhorn's `DiskCreate` gives 512.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// A numbered request to format the disk (`talon disk format <disk>
    /// --yes-destroy-data` raises it): carried out once, when it is above the
    /// last one served (its `DiskIdentity`), and only while the disk is
    /// refused for what its device holds: an lvstore is made over it, losing
    /// whatever was there. 0: never.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub format: u64,
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
    /// Create as a clone of this snapshot (`<volume>@<name>`): each replica
    /// an lvol clone of the snapshot, which stays as long as the volume does.
    #[serde(default)]
    pub from_snapshot: Option<String>,
    /// Create with a copy of this snapshot's data (`<volume>@<name>`, V2):
    /// written once through the data mover (`spdk::volume::mover`), only the
    /// chunks that hold data, into a new thin replica, before the volume is
    /// first served; the others are rebuilt from it. Once served, the volume
    /// no longer needs the snapshot. A copy cut off (a restart, a failure) is
    /// removed and made again from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_from: Option<String>,
    /// Create with the data of a backup (V2, local replicas): restored once,
    /// before the volume is first served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_backup: Option<BackupSource>,
    /// A standby (DR) volume (with `fromBackup`): not served; its data is
    /// kept at the backup volume's newest complete backup, each new one
    /// restored incrementally as it appears (every `fromBackup.pollSeconds`).
    /// `volume_activate` clears it: the newest backup restored, the
    /// replicas are made and the volume is served.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standby: bool,
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
    /// The V2 raid1 keeps a superblock on its replicas (set for every
    /// volume of two or more replicas, local or remote, made since the
    /// superblock layout; on a served replica: room for its engine's):
    /// SPDK records there a replica that leaves before I/O goes on, so a
    /// replica that missed writes is never trusted after a crash. Replica
    /// lvols are one lvstore cluster larger than the volume. Volumes made
    /// before keep their layout (the flag absent).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub raid_superblock: bool,
}

/// A backup a new volume is restored from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupSource {
    /// The backup target (`s3://<bucket>@<region>/<path>`, `vfs:///<dir>`).
    pub target: String,
    /// The target's credentials on this node (a mounted secret or a Secret
    /// manifest file), as `Backup.credentialSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_secret: Option<String>,
    /// The backup volume in the store.
    pub backup_volume: String,
    /// The backup (a standby volume's first; it then follows the newest).
    pub backup: String,
    /// A standby volume's check for a newer backup, every this many seconds
    /// (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_seconds: Option<u32>,
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
    /// The node's talon admin API on TCP (`IP:PORT` of its `--listen-tcp`),
    /// reached with this node's peer token. With it, a snapshot of the volume
    /// includes this replica at the same instant as the local ones (taken on
    /// that node while this node's export is frozen) and a snapshot's delete
    /// deletes it there; without it, the replica gets no snapshot and a
    /// revert or clone rebuilds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
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

impl Volume {
    /// The members of its raid1: local replicas, then remote ones.
    pub fn raid_slots(&self) -> usize {
        self.replicas.max(1) as usize + self.remote_replicas.len()
    }

    /// Whether a volume of this shape is made with the superblock layout: a
    /// raid1 of two or more members keeps SPDK's superblock; a served replica
    /// has room for its engine's.
    pub fn wants_superblock(&self) -> bool {
        self.raid_slots() >= 2 || self.serve_replica.is_some()
    }

    /// Whether its replicas carry (or have room for) a raid superblock: made
    /// with the layout ([`Volume::raid_superblock`]) and of a shape that has one.
    pub fn uses_superblock(&self) -> bool {
        self.raid_superblock && self.wants_superblock()
    }
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

/// Splits a snapshot id `<volume>@<snapshot>` (the inverse of [`snapshot_id`]),
/// both names validated.
pub fn split_snapshot_id(id: &str) -> Result<(ObjectName, ObjectName), String> {
    let (v, s) = id
        .split_once('@')
        .ok_or_else(|| format!("snapshot {id:?} is not <volume>@<snapshot>"))?;
    Ok((
        ObjectName::parse("volume", v).map_err(|e| e.to_string())?,
        ObjectName::parse("snapshot", s).map_err(|e| e.to_string())?,
    ))
}

impl Spec for Snapshot {
    const TYPE: &'static str = "Snapshot";
    const NAMESPACE: &'static str = "config";
}

/// A request to remove an orphan lvol (id: its alias, as its
/// [`OrphanLvol`](crate::resources::engine::OrphanLvol)), written by
/// `orphan_remove`: the orphan controller deletes the lvol only while it is
/// still an orphan with this UUID and no clone of it is left.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OrphanRemoval {
    /// The UUID of the lvol reported.
    pub uuid: String,
}

impl Spec for OrphanRemoval {
    const TYPE: &'static str = "OrphanRemoval";
    const NAMESPACE: &'static str = "config";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hugepages_setting_reads_auto_off_and_mib() {
        let n: NodeConfig = serde_yaml_ng::from_str("engine: v2\n").expect("default");
        assert_eq!(n.hugepages, HugepagesSetting::AUTO);
        for (text, want) in [
            ("hugepages: auto", HugepagesSetting::AUTO),
            ("hugepages: off", HugepagesSetting::OFF),
            ("hugepages: 1024", HugepagesSetting::Mib(1024)),
        ] {
            let n: NodeConfig = serde_yaml_ng::from_str(text).expect(text);
            assert_eq!(n.hugepages, want, "{text}");
            let back = serde_json::to_value(&n).expect("json");
            let again: NodeConfig = serde_json::from_value(back).expect("round trip");
            assert_eq!(again.hugepages, want);
        }
        let err = serde_yaml_ng::from_str::<NodeConfig>("hugepages: lots").expect_err("bad");
        assert!(
            err.to_string().contains("`auto`, `off` or a number of MiB"),
            "{err}"
        );
    }
}
