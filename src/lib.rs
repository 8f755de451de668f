//! talon: a node service for replicated SPDK block volumes on Kubernetes and
//! Talos Linux.
//!
//! # Layout
//! - [`runtime`]: the controller-resource runtime (after Talos's COSI): resources,
//!   the state store (the `config` namespace persisted in redb), controllers and
//!   their supervision.
//! - [`resources`]: the typed resource specs, one file per subsystem.
//! - [`controllers`]: the controllers, one file per controller, one folder per
//!   subsystem (the same nouns as `resources`).
//! - [`api`]: the JSON-RPC admin API (jsonrpsee) on a Unix socket and an optional
//!   token-guarded TCP listener; API types and wire error codes live here only.
//! - [`client`]: the admin API client that the CLI and the tests share.
//! - [`cli`]: the `talon` command line, a thin layer over [`client`] and the
//!   library code that works without a daemon (`doctor`, `host`).
//! - [`host`]: host access through one root handle: hugepages, kernel modules,
//!   PCI devices and driver binding, OS detection, mount tables, TCP
//!   listeners, `doctor` and Talos patches.
//! - [`ns`]: running closures and programs inside another process's namespaces.
//! - [`spdk`]: the V2 engine: spdk_tgt launch (`launch`) and supervision
//!   (`target`, in-process `embedded`), its JSON-RPC client, and the
//!   operations by concept: `naming`, `inventory`, `placement`, `volume::plan`
//!   (pure), `volume` (apply), `disk` (DiskOps); the test double (`double/`,
//!   feature `testing`) one file per RPC family.
//! - [`tgt`]: the V1 engine: tgtd supervision and file-backed iSCSI LUNs.
//! - [`keeper`]: `talon keep-targets`, which starts and keeps spdk_tgt and tgtd
//!   as `talon serve --target-keeper` asks through files in the run dir, so the
//!   data path can outlive talon's pod.
//! - [`attach`]: host frontends: kernel NVMe/TCP initiator and iSCSI fallback.
//! - [`backupstore`]: backups in Longhorn's backupstore format (S3, local folders):
//!   format, targets, locks, backup/restore/delete, and a volume snapshot's image.
//! - [`names`]: validated names (volumes, NQNs, IQNs) that reach the kernel or SPDK.
//! - [`longhorn`]: Longhorn's V2 instance-manager gRPC protocol, mapped onto talon's
//!   resources (`talon serve --longhorn-listen`).
//! - [`serve`]: `talon serve`, wiring the runtime, controllers and API together.
//! - [`util`]: the bottom floor every module may use (error chains, the one
//!   backoff); it uses nothing of talon's.
//!
//! Every `use crate::` arrow between these modules points down: cli/serve ->
//! api/client -> controllers -> keeper -> spdk/tgt/attach -> resources -> runtime ->
//! host/ns -> names -> util (docs/architecture.md, "Module layout").

pub mod api;
pub mod attach;
pub mod backupstore;
pub mod cli;
pub mod client;
pub mod controllers;
pub mod host;
pub mod keeper;
pub mod longhorn;
pub mod names;
pub mod ns;
pub mod proto;
pub mod resources;
pub mod runtime;
pub mod serve;
pub mod spdk;
pub mod tgt;
pub mod util;

/// The version stamped at build time (`git describe` when available).
pub const VERSION: &str = env!("TALON_VERSION");
