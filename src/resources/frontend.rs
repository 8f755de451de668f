//! Observed state of volumes attached on this host.

use serde::{Deserialize, Serialize};

use crate::runtime::Spec;

/// How far an attachment got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AttachState {
    /// Connecting.
    Attaching,
    /// The block device and /dev/talon/<volume> exist.
    Attached,
    /// Disconnecting.
    Detaching,
    /// Failed; `message` says why.
    Failed,
}

/// A volume attached on this host (id = volume name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AttachmentStatus {
    /// `nvme-tcp` or `iscsi`.
    pub transport: String,
    /// The kernel block device (`/dev/nvme1n1`, `/dev/sdb`).
    pub device: String,
    /// The stable path, `/dev/talon/<volume>`.
    pub path: String,
    /// NVMe controller (`nvme1`) or iSCSI session id.
    pub controller: String,
    /// State.
    pub state: AttachState,
    /// What went wrong.
    pub message: String,
}

impl Spec for AttachmentStatus {
    const TYPE: &'static str = "AttachmentStatus";
    const NAMESPACE: &'static str = "frontend";
}

/// A request to attach a volume on this host (id = volume name), written by
/// `volume_attach` and removed by `volume_detach`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Attachment {
    /// Frontend override (`auto` follows the volume and the host).
    #[serde(default)]
    pub frontend: super::config::FrontendKind,
}

impl Spec for Attachment {
    const TYPE: &'static str = "Attachment";
    const NAMESPACE: &'static str = "config";
}
