//! Host access: everything under /sys, /proc, /dev and /etc through [`HostRoot`].

pub mod root;

pub use root::{HostIoError, HostRoot};
