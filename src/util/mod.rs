//! The bottom floor: small helpers every other module may use and that use
//! nothing of talon's.
//!
//! ```text
//!   api, cli, controllers, runtime, spdk, tgt, attach, ns, host
//!        │  (every arrow points down; util imports no crate:: module)
//!        v
//!   util::error (error_chain)   util::backoff (Backoff)   util::root (HostRoot)
//!   util::nvme_auth (DH-HMAC-CHAP and TLS PSK files)   util::private (0700 dirs, 0600 logs)
//!   util::conn (connection bounds, idle sockets, descriptor limit)   util::size (sizes for people)
//!   util::space (a filesystem's room; "no space left on <dir>" with the sizes)
//!   util::failpoint (crash tests: TALON_FAILPOINT kills the process at a named point;
//!                    TALON_FAULTS turns named faults on and off while it runs)
//! ```

pub mod backoff;
pub mod conn;
pub mod error;
pub mod failpoint;
pub mod nvme_auth;
pub mod private;
pub mod root;
pub mod size;
pub mod space;

pub use backoff::Backoff;
pub use error::error_chain;
pub use failpoint::{failpoint, fault, fault_for};
pub use root::{HostIoError, HostRoot};

/// Milliseconds since the Unix epoch, now (0 before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
