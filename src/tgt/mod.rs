//! The V1 engine: tgtd supervision and file-backed iSCSI LUNs, for hosts
//! without SPDK.
//!
//! ```text
//!   volume::V1Store ── files under <data_dir>/v1 ──┐
//!        │ export / expand / delete                │ backing store (rdwr)
//!        v                                         v
//!   admin::TgtAdm ──tgtadm argv──> control socket ─> tgtd ──iSCSI──> initiators
//!   chap (node credentials file) ──ipc (secrets)──┘ ^
//!   daemon::Tgtd ── start / adopt / verify portal / stop ┘
//! ```

pub mod admin;
pub mod chap;
pub mod daemon;
pub mod ipc;
pub mod volume;

pub use admin::{AdminError, ChapSecret, ChapUser, InitiatorAcl, TargetInfo, TgtAdm, Tid};
pub use daemon::{DaemonError, Tgtd, TgtdConfig};
pub use volume::{ChapCredentials, Export, ExportOptions, V1Store, VolumeError, VolumeInfo};
