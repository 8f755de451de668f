//! The V2 engine's SPDK layer: spdk_tgt supervision and its JSON-RPC client.
//!
//! ```text
//!   volume operations (next layer)
//!          │ typed calls (rpc.rs)
//!          v
//!   SpdkClient (client.rs) ──Unix socket──> spdk_tgt  (supervised by target.rs)
//!          │                           └──> SpdkDouble (double.rs, tests only
//!          v                                stand-in that keeps SPDK's semantics)
//!   SpdkError / ErrorKind (error.rs)       spdk_tgt spawned, adopted, or in-process
//!                                          (embedded.rs, `spdk-embedded` feature)
//! ```

pub mod client;
pub mod disk;
#[cfg(any(test, feature = "testing"))]
pub mod double;
#[cfg(feature = "spdk-embedded")]
pub mod embedded;
pub mod error;
pub mod launch;
pub mod rpc;
pub mod target;

pub use client::{ClientError, SpdkClient, Timeouts};
#[cfg(any(test, feature = "testing"))]
pub use double::SpdkDouble;
pub use error::{ErrorKind, SpdkError};
pub mod placement;
pub mod volume;
