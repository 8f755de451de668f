//! API errors: the only place where domain errors become JSON-RPC error codes.
//! Codes are stable; messages name the object involved.

use jsonrpsee::types::ErrorObjectOwned;
use serde::{Deserialize, Serialize};

use crate::names::InvalidName;
use crate::runtime::StateError;

/// Stable error codes of the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// -32602: a parameter is missing, unknown or of the wrong type, or a name is invalid.
    InvalidParams,
    /// -32001: the object does not exist.
    NotFound,
    /// -32002: an object of that name exists.
    AlreadyExists,
    /// -32003: the object changed since it was read (version mismatch).
    Conflict,
    /// -32004: the object is in a state that forbids the operation (in use, tearing down).
    FailedPrecondition,
    /// -32005: what the operation needs is not available on this node (engine, module).
    Unavailable,
    /// -32603: an unexpected failure; the message says where.
    Internal,
}

impl ErrorKind {
    /// Every kind, for the OpenRPC document.
    pub const ALL: [ErrorKind; 7] = [
        Self::InvalidParams,
        Self::NotFound,
        Self::AlreadyExists,
        Self::Conflict,
        Self::FailedPrecondition,
        Self::Unavailable,
        Self::Internal,
    ];

    /// The JSON-RPC error code.
    pub fn code(self) -> i32 {
        match self {
            Self::InvalidParams => -32602,
            Self::NotFound => -32001,
            Self::AlreadyExists => -32002,
            Self::Conflict => -32003,
            Self::FailedPrecondition => -32004,
            Self::Unavailable => -32005,
            Self::Internal => -32603,
        }
    }

    /// The kind of a code, if it is one of talon's.
    pub fn from_code(code: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }

    /// A short title of the kind.
    pub fn title(self) -> &'static str {
        match self {
            Self::InvalidParams => "invalid params",
            Self::NotFound => "not found",
            Self::AlreadyExists => "already exists",
            Self::Conflict => "conflict",
            Self::FailedPrecondition => "failed precondition",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal error",
        }
    }
}

/// An API error: a kind and a sentence naming the object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// The kind (and so the code).
    pub kind: ErrorKind,
    /// What went wrong, naming the object.
    pub message: String,
}

impl ApiError {
    /// An error of a kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Invalid params.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidParams, message)
    }

    /// Not found.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// Internal.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}

impl From<ApiError> for ErrorObjectOwned {
    fn from(e: ApiError) -> Self {
        ErrorObjectOwned::owned(
            e.kind.code(),
            e.message,
            Some(serde_json::json!({ "kind": e.kind })),
        )
    }
}

impl From<StateError> for ApiError {
    fn from(e: StateError) -> Self {
        let kind = match &e {
            StateError::NotFound { .. } => ErrorKind::NotFound,
            StateError::AlreadyExists { .. } => ErrorKind::AlreadyExists,
            StateError::Conflict { .. } => ErrorKind::Conflict,
            StateError::NotOwner { .. } => ErrorKind::FailedPrecondition,
            _ => ErrorKind::Internal,
        };
        Self::new(kind, crate::util::error_chain(&e))
    }
}

impl From<InvalidName> for ApiError {
    fn from(e: InvalidName) -> Self {
        Self::invalid(e.to_string())
    }
}
