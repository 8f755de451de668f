//! The error type of the namespace-switch core.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// What went wrong while entering, or working inside, another process's namespaces.
///
/// Every variant names the target (`host (pid 1)`, `pid 4242`,
/// `process "iscsid" (pid 812)`) and the path, namespace or program involved.
#[derive(Debug, thiserror::Error)]
pub enum NsError {
    #[error("namespace list {input:?} is invalid: {reason}")]
    ParseNamespaces { input: String, reason: String },

    #[error("target {input:?} is invalid: {reason}")]
    ParseTarget { input: String, reason: &'static str },

    #[error("cannot list processes in {path}")]
    ListProcesses {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("no process named {name:?} is running: no entry of {proc_dir} matches by comm or argv[0]")]
    ProcessNotFound { name: String, proc_dir: PathBuf },

    #[error("{target} does not exist: {path} is missing")]
    TargetMissing { target: String, path: PathBuf },

    #[error(
        "{target} exited while its namespaces were being opened, {attempts} times in a row (last missing: {path})"
    )]
    TargetVanished {
        target: String,
        attempts: u32,
        path: PathBuf,
    },

    #[error("cannot open namespace file {path}")]
    OpenNamespace {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "not permitted to open {path} of {target}: needs ptrace read access (CAP_SYS_PTRACE, and a superset of its capabilities)"
    )]
    OpenDenied {
        ns: &'static str,
        path: PathBuf,
        target: String,
        #[source]
        source: io::Error,
    },

    #[error("cannot unshare the file-system attributes of the worker thread for {target}")]
    UnshareFs {
        target: String,
        #[source]
        source: io::Error,
    },

    #[error(
        "not permitted to enter the {ns} namespace of {target}: setns needs CAP_SYS_ADMIN (and CAP_SYS_CHROOT for mnt)"
    )]
    EnterDenied {
        ns: &'static str,
        target: String,
        #[source]
        source: io::Error,
    },

    #[error("cannot enter the {ns} namespace of {target}")]
    Enter {
        ns: &'static str,
        target: String,
        #[source]
        source: io::Error,
    },

    #[error("cannot start a worker thread for {target}")]
    SpawnThread {
        target: String,
        #[source]
        source: io::Error,
    },

    #[error("work in the namespaces of {target} did not finish within {timeout:?}")]
    Timeout { target: String, timeout: Duration },

    #[error("work in the namespaces of {target} panicked: {message}")]
    Panicked { target: String, message: String },

    #[error("cannot start {program:?} in the namespaces of {target}")]
    Spawn {
        program: String,
        target: String,
        #[source]
        source: io::Error,
    },

    #[error("cannot change to directory {dir} in the mount namespace of {target} to start {program:?}")]
    ChangeDir {
        program: String,
        dir: PathBuf,
        target: String,
        #[source]
        source: io::Error,
    },

    #[error("{program:?} in the namespaces of {target} did not exit within {timeout:?} and was killed")]
    CommandTimeout {
        program: String,
        target: String,
        timeout: Duration,
    },

    #[error("cannot exchange data with {program:?} in the namespaces of {target}")]
    CommandIo {
        program: String,
        target: String,
        #[source]
        source: io::Error,
    },

    #[error("cannot read {path} in the mount namespace of {target}")]
    ReadFile {
        path: PathBuf,
        target: String,
        #[source]
        source: io::Error,
    },

    #[error("cannot write {path} in the mount namespace of {target}")]
    WriteFile {
        path: PathBuf,
        target: String,
        #[source]
        source: io::Error,
    },

    #[error("cannot create directory {path} in the mount namespace of {target}")]
    CreateDir {
        path: PathBuf,
        target: String,
        #[source]
        source: io::Error,
    },

    #[error("cannot open lock file {path} in the mount namespace of {target}")]
    OpenLock {
        path: PathBuf,
        target: String,
        #[source]
        source: io::Error,
    },

    #[error("cannot lock {path} in the mount namespace of {target}")]
    Lock {
        path: PathBuf,
        target: String,
        #[source]
        source: io::Error,
    },

    #[error(
        "lock {path} in the mount namespace of {target} was still held by someone else after {timeout:?}"
    )]
    LockTimeout {
        path: PathBuf,
        target: String,
        timeout: Duration,
    },
}

impl NsError {
    /// Whether the error is a missing privilege (EPERM on setns).
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, Self::EnterDenied { .. } | Self::OpenDenied { .. })
    }

    /// Whether the target process (or the named process) does not exist.
    pub fn is_target_missing(&self) -> bool {
        matches!(
            self,
            Self::ProcessNotFound { .. } | Self::TargetMissing { .. } | Self::TargetVanished { .. }
        )
    }
}
