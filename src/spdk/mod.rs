//! The V2 engine's SPDK layer: spdk_tgt supervision and its JSON-RPC client.
//!
//! ```text
//!   volume operations (next layer)
//!          │ typed calls (rpc.rs)
//!          v
//!   SpdkClient (client.rs) ──Unix socket──> spdk_tgt  (supervised by target.rs)
//!          │                           └──> SpdkDouble (double.rs, tests only
//!          v                                stand-in that keeps SPDK's semantics)
//!   SpdkError / ErrorKind (error.rs)
//! ```

pub mod client;
pub mod double;
pub mod error;
pub mod rpc;
pub mod target;

pub use client::{ClientError, SpdkClient, Timeouts};
pub use double::SpdkDouble;
pub use error::{ErrorKind, SpdkError};
pub mod volume;
