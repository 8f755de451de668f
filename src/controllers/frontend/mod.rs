//! Frontend controllers: volumes attached on this host.

pub mod attach;
