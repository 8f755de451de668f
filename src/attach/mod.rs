//! Host frontends: how an exported volume becomes a block device on the host.
//!
//! ```text
//!   target (SPDK / kernel nvmet / tgtd) ──NVMe/TCP──> nvme_tcp: /dev/nvme-fabrics ──> /dev/nvmeXnY
//!                                                                  └── devpath ──> /dev/talon/<volume>
//! ```
//! - [`nvme_tcp`]: the kernel NVMe/TCP initiator, driven through `/dev/nvme-fabrics` and sysfs.
//! - [`devpath`]: the stable path `/dev/talon/<volume>`.
//! - [`error`]: the module's error type, `AttachError`.

pub mod devpath;
pub mod error;
pub mod nvme_tcp;

pub use error::AttachError;
