//! talon: a node service for replicated SPDK block volumes on Kubernetes and
//! Talos Linux.
//!
//! # Layout
//! - [`runtime`]: the controller-resource runtime (after Talos's COSI): resources,
//!   the state store (the `config` namespace persisted in redb), controllers and
//!   their supervision.
//! - [`resources`]: the typed resource specs, one file per subsystem.
//! - [`controllers`]: the controllers, one file per controller, one folder per
//!   subsystem (the same nouns as `resources`): `engine` (talon's V1 and V2
//!   volumes, backups, restores), `longhorn` (Longhorn's V2 instances and
//!   restores), `frontend`, `host`.
//! - [`api`]: the JSON-RPC admin API (jsonrpsee) on a Unix socket and an optional
//!   token-guarded TCP listener; API types and wire error codes live here only.
//! - [`client`]: the admin API client that the CLI, the tests and the
//!   controllers that call other nodes (`controllers::engine::peer`) share.
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
//! - [`proto`]: Longhorn's instance-manager wire types (generated) and the
//!   calls to another node's SPDKService (`proto::peer`).
//! - [`longhorn`]: Longhorn's V2 instance-manager gRPC protocol, mapped onto talon's
//!   resources (`talon serve --longhorn-listen`).
//! - [`serve`]: `talon serve`, wiring the runtime, controllers and API together.
//! - [`util`]: the bottom floor every module may use (error chains, the one
//!   backoff); it uses nothing of talon's.
//!
//! # Layers
//!
//! Every `use crate::` arrow between these modules points down this list: a
//! module uses only the modules on lines below its own, and the modules on
//! one line never use each other. `tests/layering.rs` reads the list here
//! and checks the sources against it; docs/architecture.md shows the same.
//!
//! ```text
//! cli                     the command line (it can run serve)
//! serve                   wires the runtime, the controllers, the API and Longhorn's services
//! controllers, longhorn   the apply side; Longhorn's adapter (never each other)
//! client                  controllers call other nodes' admin API through it (engine::peer)
//! api                     handlers write desired state, read status
//! attach, keeper          host frontends; the process that keeps the targets
//! spdk, tgt, proto        the V2 and V1 engines; Longhorn's wire types
//! resources               the specs, and where a backup is (backupstore::format)
//! runtime, backupstore    the controller runtime; Longhorn's backup format
//! host                    the one root handle
//! ns                      entering namespaces
//! names, util             validated names; error chains, backoff
//! ```

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
