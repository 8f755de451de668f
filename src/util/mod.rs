//! The bottom floor: small helpers every other module may use and that use
//! nothing of talon's.
//!
//! ```text
//!   api, cli, controllers, runtime, spdk, tgt, attach, ns, host
//!        │  (every arrow points down; util imports no crate:: module)
//!        v
//!   util::error (error_chain)   util::backoff (Backoff)   util::root (HostRoot)
//!   util::dhchap (DH-HMAC-CHAP secret files)
//! ```

pub mod backoff;
pub mod dhchap;
pub mod error;
pub mod root;

pub use backoff::Backoff;
pub use error::error_chain;
pub use root::{HostIoError, HostRoot};
