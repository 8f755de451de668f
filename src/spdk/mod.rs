//! The V2 engine's SPDK layer: spdk_tgt supervision, its JSON-RPC client, and
//! the volume operations over it, split by concept.
//!
//! ```text
//!   controllers (engine::spdk_volume, spdk_disk): resources -> plans, results -> statuses
//!          │         disk (DiskOps): a Disk's base bdev and lvstore, orphans
//!   volume::plan     pure: VolumePlan + Inventory -> local replica steps
//!          │         (placement.rs decides where; naming.rs says what things are called)
//!   volume (VolumeOps) applies: makes what is missing, records it, undoes it
//!          │         in reverse on error; raid, export, snapshot, revert, delete
//!   inventory        what exists in one target, loaded once; what talon owns
//!          │ typed calls (rpc.rs)
//!          v
//!   SpdkClient (client.rs) ──Unix socket──> spdk_tgt  (supervised by target.rs;
//!          │                                launch.rs: config, errors, readiness)
//!          │                           └──> SpdkDouble (double/, feature `testing`
//!          v                                only: a stand-in that keeps SPDK's
//!   SpdkError / ErrorKind (error.rs)        semantics, one file per RPC family)
//!                                          spdk_tgt spawned, adopted, or in-process
//!                                          (embedded.rs, `spdk-embedded` feature)
//! ```

pub mod client;
pub mod disk;
#[cfg(any(test, feature = "testing"))]
pub mod double;
#[cfg(feature = "spdk-embedded")]
pub mod embedded;
pub mod error;
pub mod inventory;
pub mod launch;
pub mod naming;
pub mod rpc;
pub mod target;

pub use client::{ClientError, RunId, SpdkClient, Timeouts};
#[cfg(any(test, feature = "testing"))]
pub use double::SpdkDouble;
pub use error::{ErrorKind, SpdkError};
pub mod placement;
pub mod volume;
