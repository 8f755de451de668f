//! Backups of V2 volumes in Longhorn's backupstore format, on S3, NFS or a
//! local folder: `format` (layout, configs, blocks), `store` (targets and
//! credentials), `nfs` (NFS shares mounted by talon), `lock` (Longhorn's lock protocol), `image` (a snapshot's
//! sparse-file copy), `ops` (backup, restore, list, delete) and `info`
//! (the JSON Longhorn's engine binary answers about a store). A V2
//! snapshot is read out of spdk_tgt by `spdk::volume::to_file`.
//!
//! Longhorn lists and restores what talon writes here, and talon restores
//! what Longhorn wrote (docs/backups.md).

pub mod error;
pub mod format;
pub mod image;
pub mod info;
pub mod lock;
pub mod nfs;
pub mod ops;
pub mod store;

pub use error::BackupError;
pub use format::{BackupCfg, Compression, VolumeCfg};
pub use image::SparseImage;
pub use ops::{BackupRequest, BackupStats, Progress, RestoreStats};
pub use store::{Credentials, Store};
