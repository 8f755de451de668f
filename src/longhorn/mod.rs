//! Longhorn's V2 instance-manager protocol, served by `talon serve
//! --longhorn-listen ADDR:PORT` so that longhorn-manager drives talon as the
//! node engine of its V2 volumes.
//!
//! ```text
//!   longhorn-manager ──gRPC──> base+0 ProcessManagerService (VersionGet)
//!                              base+1 imrpc.ProxyEngineService (engines of this node; others forwarded)
//!                              base+2 imrpc.DiskService ──> config/Disk (talon's disks)
//!                              base+3 imrpc.InstanceService ─┐
//!   other nodes' engines ────> base+4 spdkrpc.SPDKService ───┴> config/Longhorn{Replica,Engine,EngineFrontend}
//!                                                                 │ engine.LonghornController
//!   every port: grpc.health.v1.Health, server reflection          v spdk_tgt, kernel NVMe/TCP
//! ```
//!
//! The protos in `proto/longhorn` are talon's own, wire-compatible with the
//! subset of `longhorn/types` v0.0.0-20260810232958-141f76734364 (the version
//! longhorn-instance-manager v1.12.1 vendors) that talon serves. A method
//! outside that subset answers gRPC UNIMPLEMENTED naming it.

pub mod backup;
pub mod bounds;
pub mod clone;
mod clone_ops;
pub mod engine_ops;
pub mod error;
pub mod lifecycle;
pub mod proxy;
pub mod rebuild;
mod replica_msg;
pub mod restore;
pub mod server;
pub mod service;
mod share;
pub mod snaphash;
mod snaphash_ops;
mod switchover;

pub use error::LonghornError;

/// `instanceManagerAPIVersion` and its minimum, as longhorn-instance-manager
/// v1.12.1 reports them (`pkg/meta/version.go`); longhorn-manager v1.12
/// accepts an instance manager whose version is at least 4 and whose
/// minimum is at most 6 (`engineapi/instance_manager.go`).
pub const API_VERSION: i64 = 7;
/// See [`API_VERSION`].
pub const API_MIN_VERSION: i64 = 1;
/// The proxy API version and its minimum (the same release's values).
pub const PROXY_API_VERSION: i64 = 7;
/// See [`PROXY_API_VERSION`].
pub const PROXY_API_MIN_VERSION: i64 = 1;
/// The disk service API version and its minimum.
pub const DISK_API_VERSION: i64 = 1;
/// See [`DISK_API_VERSION`].
pub const DISK_API_MIN_VERSION: i64 = 1;

/// The five services in port order from the base port.
pub const SERVICES: [&str; 5] = [
    "ProcessManagerService",
    "imrpc.ProxyEngineService",
    "imrpc.DiskService",
    "imrpc.InstanceService",
    "spdkrpc.SPDKService",
];
