//! Errors of the host frontends. Every variant names the operation that failed and carries the
//! object involved (NQN, address, controller, path); messages do not repeat their `#[source]`.

use std::path::PathBuf;
use std::time::Duration;

use crate::host::HostIoError;
use crate::names::InvalidName;

/// A failed attach or detach.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("invalid NVMe/TCP connect option {option}: {reason}")]
    InvalidOption { option: &'static str, reason: String },

    #[error("the host NQN in {path} is not usable")]
    InvalidHostNqn {
        path: PathBuf,
        #[source]
        source: InvalidName,
    },

    #[error("the host ID in {path} is not a UUID: {value:?}")]
    InvalidHostId { path: PathBuf, value: String },

    #[error("cannot keep the generated NVMe host identity in {path}")]
    StoreHostIdentity {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot open {path} (is the nvme_tcp module loaded?)")]
    OpenFabrics {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("connecting to {nqn} at {addr} failed{hint}")]
    Connect {
        nqn: String,
        addr: String,
        hint: &'static str,
        #[source]
        source: std::io::Error,
    },

    #[error("connecting to {nqn} at {addr} did not finish within {waited:?} (target unreachable?)")]
    ConnectTimedOut {
        nqn: String,
        addr: String,
        waited: Duration,
    },

    #[error("the kernel answered the connect to {nqn} with {reply:?}, not instance=N,cntlid=M")]
    ConnectReply { nqn: String, reply: String },

    #[error("controller {controller} for {nqn} went away while attaching (state {state})")]
    ControllerVanished {
        controller: String,
        nqn: String,
        state: String,
    },

    #[error(
        "timed out waiting for NVMe controller {controller} of {nqn} at {addr} to become live after \
         {waited:?} (state {state}); it was disconnected"
    )]
    NotLive {
        controller: String,
        nqn: String,
        addr: String,
        state: String,
        waited: Duration,
    },

    #[error(
        "controller {controller} for {nqn} shows no namespace {nsid} after {waited:?}; it was disconnected"
    )]
    NamespaceNotFound {
        controller: String,
        nqn: String,
        nsid: u32,
        waited: Duration,
    },

    #[error("cannot delete controller {controller}")]
    DeleteController {
        controller: String,
        #[source]
        source: HostIoError,
    },

    #[error("controller {controller} is still present {waited:?} after delete_controller")]
    DeleteTimedOut { controller: String, waited: Duration },

    #[error("cannot create the device path {path} for {device}")]
    CreateDevicePath {
        path: PathBuf,
        device: String,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot remove the device path {path}")]
    RemoveDevicePath {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path} is not a block device made by talon; not touching it")]
    ForeignDevicePath { path: PathBuf },

    #[error("cannot take the attach lock {path} of volume {volume}")]
    LockVolume {
        volume: String,
        path: PathBuf,
        #[source]
        source: Box<crate::ns::NsError>,
    },

    #[error("reading the NVMe state of the host failed")]
    Host(#[from] HostIoError),
}

impl AttachError {
    /// A short operator hint for a connect errno (appended to the message).
    pub(crate) fn connect_hint(e: &std::io::Error) -> &'static str {
        match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => ": nothing listens on that address and port",
            Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => ": no route to the target",
            Some(libc::ETIMEDOUT) => ": the target did not answer",
            Some(libc::EALREADY) => ": a controller with these options already exists",
            Some(libc::EINVAL) => {
                ": the kernel rejected the options or the subsystem NQN is unknown to the target"
            }
            Some(libc::EIO) => {
                ": the target refused the connect (unknown subsystem NQN or host not allowed?)"
            }
            _ => "",
        }
    }
}
