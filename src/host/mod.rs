//! Host access: everything under /sys, /proc, /dev and /etc through [`HostRoot`],
//! and the host preparation built on it.
//!
//! ```text
//!   cli (host, doctor) ──┐
//!   controllers/host ────┼─> hugepages · modules · pci · os ──> HostRoot ──> /sys /proc /dev /etc
//!                        └─> doctor ──> talos (machine-config patches, schematic)
//! ```

pub mod disk_target;
pub mod doctor;
pub mod hugepages;
pub mod longhorn_address;
pub mod modules;
pub mod mounts;
pub mod net;
pub mod os;
pub mod pci;
pub mod talos;

/// The host's file system tree handle lives on the bottom floor (`util`), so
/// that `ns` below `host` can take it; it is `host`'s word for the host.
pub use crate::util::root::{HostIoError, HostRoot};
