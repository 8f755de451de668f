//! SPDK JSON-RPC errors and how talon classifies them.
//!
//! ```text
//!  {"error":{"code":-19,"message":"No such device"}}
//!        |                  |
//!        v                  v
//!   code (errno or     message (strerror text,
//!   JSON-RPC code)     or a method's own text)
//!        \                  /
//!         +--> ErrorKind::classify(code, message) --> SpdkError { method, code, message, kind }
//! ```
//!
//! # The mapping, checked against every error in `transcript-v26.05.jsonl`
//!
//! SPDK answers with a negative errno when a bdev module fails
//! (`-17` EEXIST, `-19` ENODEV, `-2` ENOENT, `-1` EPERM, `-16` EBUSY, `-114`
//! EALREADY, `-22` EINVAL, `-5` EIO, `-28` ENOSPC) and with a JSON-RPC code
//! (`-32601`, `-32602`, `-32603`, `-32700`) when the RPC layer fails or when a
//! method reports a failure through `spdk_jsonrpc_send_error_response(...,
//! SPDK_JSONRPC_ERROR_INVALID_PARAMS, spdk_strerror(-rc))`.
//!
//! The message is used only where the transcript shows it is reliable:
//! - A JSON-RPC code whose message is exactly a `strerror()` text ("No such
//!   device", "No space left on device", "Operation not permitted", "Invalid
//!   argument", ...) is classified by that errno: SPDK put `spdk_strerror(rc)`
//!   there (recorded: `-32602 "No space left on device"` for a thick lvol
//!   larger than its lvstore, `-32602 "Invalid argument"` for a clone of a
//!   writable lvol, `-32603 "Operation not permitted"` for deleting a snapshot
//!   that has clones).
//! - `"spdk_json_decode_object failed"` is a parameter decoding failure
//!   ([`ErrorKind::InvalidParams`]), whatever the code: SPDK sent it with
//!   `-32603` (unknown param, wrong type, missing params) and with `-32700` (a
//!   bad `raid_level` enum, although the JSON was valid).
//! - A message containing "already exists" is [`ErrorKind::AlreadyExists`]
//!   (recorded: `-32603 "Transport type 'TCP' already exists"`, `-114 "A
//!   controller named Nvme0 already exists with the specified network path"`);
//!   any other `-114` is [`ErrorKind::AlreadyInProgress`].
//! - A message starting "Invalid transport type" is
//!   [`ErrorKind::InvalidArgument`].
//!
//! Deliberately NOT mapped: the nvmf and iSCSI methods answer `-32602
//! "Invalid parameters"` for a missing bdev, a missing subsystem, a duplicate
//! listener, an already-deleted subsystem and a duplicate portal group tag
//! alike, and `-32603 "Unable to create subsystem NQN"` both for a duplicate
//! and for an invalid NQN. Those stay [`ErrorKind::InvalidParams`] and
//! [`ErrorKind::Internal`]: a caller that needs to know whether the object
//! exists must look it up (`nvmf_get_subsystems`) instead of guessing from the
//! error.

use std::fmt;

/// What an SPDK error means to talon, independent of the exact code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// The name is taken (EEXIST, or "already exists").
    AlreadyExists,
    /// The bdev, lvstore, lvol or controller does not exist (ENODEV, ENOENT).
    NotFound,
    /// The object is claimed or in use (EPERM, EBUSY): a bdev under an
    /// lvstore or raid, a snapshot that still has clones.
    Busy,
    /// The same operation is already running (EALREADY without "already exists").
    AlreadyInProgress,
    /// A parameter value was refused by the method (EINVAL).
    InvalidArgument,
    /// The parameters did not decode, or the method refused them without
    /// saying why (`-32602 "Invalid parameters"`, `spdk_json_decode_object failed`).
    InvalidParams,
    /// An I/O or connect failure (EIO).
    Io,
    /// Not enough space (ENOSPC).
    NoSpace,
    /// The target does not know the method (`-32601`).
    MethodNotFound,
    /// The request was not valid JSON-RPC (`-32600`, `-32700`).
    InvalidRequest,
    /// `-32603` with a message that does not say more.
    Internal,
    /// Any other code.
    Other,
}

impl ErrorKind {
    /// Classifies an SPDK error by its code and, where reliable, its message
    /// (see the module documentation for the table and the reasons).
    pub fn classify(code: i64, message: &str) -> ErrorKind {
        if message == "spdk_json_decode_object failed" {
            return ErrorKind::InvalidParams;
        }
        if message.contains("already exists") {
            return ErrorKind::AlreadyExists;
        }
        if let Some(kind) = Self::from_errno(code, message) {
            return kind;
        }
        match code {
            -32601 => ErrorKind::MethodNotFound,
            -32600 | -32700 => ErrorKind::InvalidRequest,
            -32602 | -32603 => {
                if let Some(kind) = Self::from_strerror(message) {
                    kind
                } else if message.starts_with("Invalid transport type") {
                    ErrorKind::InvalidArgument
                } else if code == -32602 {
                    ErrorKind::InvalidParams
                } else {
                    ErrorKind::Internal
                }
            }
            _ => ErrorKind::Other,
        }
    }

    fn from_errno(code: i64, message: &str) -> Option<ErrorKind> {
        Some(match code {
            -17 => ErrorKind::AlreadyExists,
            -19 | -2 => ErrorKind::NotFound,
            -1 | -16 => ErrorKind::Busy,
            -114 => {
                if message.contains("already exists") {
                    ErrorKind::AlreadyExists
                } else {
                    ErrorKind::AlreadyInProgress
                }
            }
            -22 => ErrorKind::InvalidArgument,
            -5 => ErrorKind::Io,
            -28 => ErrorKind::NoSpace,
            _ => return None,
        })
    }

    /// The errno whose `strerror()` text is exactly `message` (glibc texts).
    fn from_strerror(message: &str) -> Option<ErrorKind> {
        Some(match message {
            "File exists" => ErrorKind::AlreadyExists,
            "No such device" | "No such file or directory" => ErrorKind::NotFound,
            "Operation not permitted" | "Device or resource busy" => ErrorKind::Busy,
            "Operation already in progress" => ErrorKind::AlreadyInProgress,
            "Invalid argument" => ErrorKind::InvalidArgument,
            "Input/output error" => ErrorKind::Io,
            "No space left on device" => ErrorKind::NoSpace,
            _ => return None,
        })
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorKind::AlreadyExists => "already exists",
            ErrorKind::NotFound => "not found",
            ErrorKind::Busy => "busy",
            ErrorKind::AlreadyInProgress => "already in progress",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::InvalidParams => "invalid parameters",
            ErrorKind::Io => "I/O error",
            ErrorKind::NoSpace => "no space",
            ErrorKind::MethodNotFound => "method not found",
            ErrorKind::InvalidRequest => "invalid request",
            ErrorKind::Internal => "internal error",
            ErrorKind::Other => "error",
        };
        f.write_str(s)
    }
}

/// An error answered by the SPDK target for one call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SPDK {method} failed ({kind}): code {code}, \"{message}\"")]
pub struct SpdkError {
    /// The JSON-RPC method that failed.
    pub method: String,
    /// The code SPDK sent (a negative errno or a JSON-RPC code).
    pub code: i64,
    /// The message SPDK sent.
    pub message: String,
    /// What it means, see [`ErrorKind::classify`].
    pub kind: ErrorKind,
}

impl SpdkError {
    /// Builds the error for `method` from the code and message on the wire.
    pub fn new(method: impl Into<String>, code: i64, message: impl Into<String>) -> Self {
        let message = message.into();
        let kind = ErrorKind::classify(code, &message);
        SpdkError {
            method: method.into(),
            code,
            message,
            kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_recorded_errors() {
        let cases = [
            (-17, "File exists", ErrorKind::AlreadyExists),
            (
                -17,
                "Failed to create RAID bdev Raid1: File exists",
                ErrorKind::AlreadyExists,
            ),
            (-19, "No such device", ErrorKind::NotFound),
            (-2, "No such file or directory", ErrorKind::NotFound),
            (-1, "Operation not permitted", ErrorKind::Busy),
            (-32603, "Operation not permitted", ErrorKind::Busy),
            (
                -114,
                "A controller named Nvme0 already exists with the specified network path",
                ErrorKind::AlreadyExists,
            ),
            (
                -114,
                "Operation already in progress",
                ErrorKind::AlreadyInProgress,
            ),
            (-22, "Invalid argument", ErrorKind::InvalidArgument),
            (-32602, "Invalid argument", ErrorKind::InvalidArgument),
            (-32602, "No space left on device", ErrorKind::NoSpace),
            (-32602, "Invalid parameters", ErrorKind::InvalidParams),
            (-32602, "Invalid transport type 'FOO'", ErrorKind::InvalidArgument),
            (
                -32603,
                "Transport type 'TCP' already exists",
                ErrorKind::AlreadyExists,
            ),
            (-32603, "Unable to create subsystem x", ErrorKind::Internal),
            (-32603, "spdk_json_decode_object failed", ErrorKind::InvalidParams),
            (-32700, "spdk_json_decode_object failed", ErrorKind::InvalidParams),
            (-32601, "Method not found", ErrorKind::MethodNotFound),
            (-32600, "Invalid request", ErrorKind::InvalidRequest),
            (-5, "Input/output error", ErrorKind::Io),
            (-12, "Cannot allocate memory", ErrorKind::Other),
        ];
        for (code, msg, kind) in cases {
            assert_eq!(ErrorKind::classify(code, msg), kind, "{code} {msg}");
        }
    }

    #[test]
    fn display_names_method_and_kind() {
        let e = SpdkError::new("bdev_get_bdevs", -19, "No such device");
        assert_eq!(
            e.to_string(),
            "SPDK bdev_get_bdevs failed (not found): code -19, \"No such device\""
        );
    }
}
