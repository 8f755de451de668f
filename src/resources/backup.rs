//! Backups of V2 volumes to a backup target, in Longhorn's backupstore
//! format ([`crate::backupstore`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::runtime::Spec;

/// A backup of a volume's snapshot (id: the backup's name, Longhorn's rule:
/// letters, digits, `_.-`). Persisted; done once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Backup {
    /// The volume.
    pub volume: String,
    /// Its snapshot backed up.
    pub snapshot: String,
    /// The backup target (`s3://<bucket>@<region>/<path>`, `vfs:///<dir>`).
    pub target: String,
    /// Where the target's credentials are read on this node: a mounted
    /// Kubernetes secret (one file per key) or a Secret manifest file
    /// (Longhorn's keys: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_ENDPOINTS`, ...). Written by talon: the API's `credentialSecret`
    /// names a secret in the node's `backupSecretsDir` and this records its
    /// path; a Longhorn call's credentials are a folder under the data dir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_secret: Option<String>,
    /// The backup volume's name in the store (default: the volume's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_volume: Option<String>,
    /// Upload every block, not only those the store lacks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub full: bool,
    /// Labels recorded with the backup.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// How a new backup volume's blocks are compressed: `lz4` (the
    /// default), `gzip` or `none`; an existing backup volume keeps its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// The backup's block size in bytes: 2 MiB (the default) or 16 MiB, as
    /// Longhorn's `backup-block-size`. An incremental backup builds only on a
    /// last backup of the same block size (else it is full).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u64>,
    /// Blocks compressed and uploaded at once (default 4; Longhorn's
    /// `backup-concurrent-limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// The snapshot is a Longhorn replica's (asked through Longhorn's
    /// backup calls), not a talon volume's: `volume` is then the Longhorn
    /// volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longhorn: Option<LonghornSource>,
}

/// A Longhorn replica's snapshot that a backup reads: lvol
/// `<replica>-snap-<snapshot>` in the replica's lvstore on this node, and
/// the snapshots below it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornSource {
    /// The replica instance.
    pub replica: String,
    /// When the engine took the snapshot (RFC 3339; empty: unknown).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub snapshot_created: String,
}

impl Backup {
    /// The backup volume's name in the store.
    pub fn backup_volume(&self) -> &str {
        self.backup_volume.as_deref().unwrap_or(&self.volume)
    }
}

impl Spec for Backup {
    const TYPE: &'static str = "Backup";
    const NAMESPACE: &'static str = "config";
}

/// Where a backup is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum BackupState {
    /// Waiting for its snapshot (or for another backup to finish).
    #[default]
    Pending,
    InProgress,
    Completed,
    Error,
}

/// A backup as it went (id: the backup's name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupStatus {
    pub state: BackupState,
    /// Percent done.
    pub progress: u32,
    /// Longhorn's backup URL (`<target>?backup=<name>&volume=<volume>`).
    pub url: String,
    /// Whether it built on the last backup (took only what changed since).
    pub incremental: bool,
    /// Blocks taken from the snapshot: those with data, or, incremental,
    /// those whose bytes changed since the last backup.
    pub blocks_read: u64,
    /// Blocks uploaded (the others were in the store already).
    pub blocks_uploaded: u64,
    /// Compressed bytes uploaded.
    pub bytes_uploaded: u64,
    /// Bytes of data the backup maps.
    pub size: u64,
    /// When it completed (RFC 3339).
    pub completed: String,
    /// What went wrong, or what it waits for.
    pub message: String,
}

impl Spec for BackupStatus {
    const TYPE: &'static str = "BackupStatus";
    const NAMESPACE: &'static str = "engine";
}

/// A backup restored into a Longhorn replica of this node (id: the replica
/// instance), asked through Longhorn's `BackupRestore`: the backup's data
/// becomes the replica's, before the engine serves it. Persisted. Asked
/// again for another backup of the same backup volume once the last is
/// restored, the replica goes on from it (`base`): a DR volume's
/// incremental restores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornRestore {
    /// The backup target (`s3://<bucket>@<region>/<path>`, `vfs:///<dir>`).
    pub target: String,
    /// The backup volume's name in the store.
    pub backup_volume: String,
    /// The backup.
    pub backup: String,
    /// The target's credentials on this node (a secret folder, removed
    /// when the restore ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_secret: Option<String>,
    /// The backup of the same backup volume the replica holds restored, when
    /// this restore goes on from it (incremental: a DR volume following its
    /// source's backups); `None` restores into a new lvol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

impl LonghornRestore {
    /// Longhorn's URL of the backup.
    pub fn url(&self) -> String {
        crate::backupstore::format::backup_url(&self.target, &self.backup, &self.backup_volume)
    }
}

impl Spec for LonghornRestore {
    const TYPE: &'static str = "LonghornRestore";
    const NAMESPACE: &'static str = "config";
}

/// A `LonghornRestore` as it went (id: the replica instance).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornRestoreStatus {
    /// Pending (not started), InProgress, Completed (the replica holds the
    /// backup), Error (`message`).
    pub state: BackupState,
    /// Percent done.
    pub progress: u32,
    /// What went wrong.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The backup this status is of (the spec's when it was set); a spec
    /// naming another backup starts a new restore.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub backup: String,
    /// Blocks fetched from the backup target (an incremental restore
    /// fetches only the blocks its base lacks).
    #[serde(default)]
    pub blocks_downloaded: u64,
}

impl Spec for LonghornRestoreStatus {
    const TYPE: &'static str = "LonghornRestoreStatus";
    const NAMESPACE: &'static str = "engine";
}

/// The backup a Longhorn replica's lvol holds restored (id: the replica),
/// written when its restore completes; persisted, so that after a restart
/// of talon (its statuses gone) a finished restore reads finished, and a
/// DR replica's next restore goes on from it. Goes with its
/// `LonghornRestore`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LonghornRestoreLedger {
    /// The backup restored.
    pub backup: String,
}

impl Spec for LonghornRestoreLedger {
    const TYPE: &'static str = "LonghornRestoreLedger";
    const NAMESPACE: &'static str = "ledger";
}
