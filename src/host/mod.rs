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
pub mod modules;
pub mod mounts;
pub mod net;
pub mod os;
pub mod pci;
pub mod root;
pub mod talos;

pub use root::{HostIoError, HostRoot};
