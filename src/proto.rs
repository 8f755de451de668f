//! Longhorn's instance-manager wire definitions: code generated from
//! `proto/longhorn` (tonic + prost, parsed by protox), talon's own protos,
//! wire-compatible with the subset of `longhorn/types` it serves. The
//! Longhorn adapter (`crate::longhorn`) serves them; the engine controller
//! calls other nodes with them ([`peer`]).

pub mod peer;

#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used
)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/_.rs"));

    /// Package `imrpc`.
    pub mod imrpc {
        include!(concat!(env!("OUT_DIR"), "/imrpc.rs"));
    }
    /// Package `ptypes`.
    pub mod ptypes {
        include!(concat!(env!("OUT_DIR"), "/ptypes.rs"));
    }
    /// Package `spdkrpc`.
    pub mod spdkrpc {
        include!(concat!(env!("OUT_DIR"), "/spdkrpc.rs"));
    }
}
pub use generated::*;

/// The encoded descriptor set of talon's Longhorn protos (for reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/longhorn_descriptor.bin"));
