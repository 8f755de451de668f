//! What the Longhorn adapter's calls refuse or fail with, as one type, and
//! the one conversion to the gRPC status longhorn-manager reads.
//!
//! longhorn-manager acts on the code and, for "not found", on the words:
//! it creates an instance, or takes one as gone, only when the message
//! says `cannot find` (its `types.ErrorIsNotFound`), as Longhorn's SPDK
//! engine says `cannot find replica|engine|engine frontend <name>`. Every
//! other message names the object and what was refused; the code tells a
//! caller whether trying again can help (`FAILED_PRECONDITION`: not as things
//! are; `UNAVAILABLE`: another node or spdk_tgt did not answer).

use tonic::{Code, Status};

use crate::runtime::StateError;
use crate::spdk::ClientError;

/// An error of a Longhorn call.
#[derive(Debug, thiserror::Error)]
pub enum LonghornError {
    /// A field of the request is malformed (a name, an address, a size).
    #[error("{0}")]
    Invalid(String),
    /// The object does not exist, in Longhorn's words.
    #[error("cannot find {noun} {name}")]
    NotFound {
        /// `replica`, `engine`, `engine frontend`, `snapshot`, ...
        noun: String,
        /// Its name.
        name: String,
    },
    /// Refused as things are (a replica being rebuilt, a frontend attached):
    /// the message says what to change.
    #[error("{0}")]
    Refused(String),
    /// spdk_tgt failed a step.
    #[error("{what}: {}", crate::util::error_chain(source))]
    Spdk {
        /// The step, naming the object.
        what: String,
        /// SPDK's answer.
        source: ClientError,
    },
    /// Another node's instance manager refused or did not answer.
    #[error("replica {replica}: {message}")]
    Peer {
        /// The replica that node serves.
        replica: String,
        /// What it (or reaching it) said.
        message: String,
    },
    /// talon's state store.
    #[error("{}", crate::util::error_chain(.0))]
    State(#[from] StateError),
    /// Anything else that failed on this node.
    #[error("{what}: {message}")]
    Internal {
        /// The step, naming the object.
        what: String,
        /// What failed.
        message: String,
    },
}

impl LonghornError {
    /// [`LonghornError::Spdk`].
    pub fn spdk(what: impl Into<String>, source: ClientError) -> Self {
        Self::Spdk {
            what: what.into(),
            source,
        }
    }

    /// [`LonghornError::Internal`].
    pub fn internal(what: impl Into<String>, message: impl std::fmt::Display) -> Self {
        Self::Internal {
            what: what.into(),
            message: message.to_string(),
        }
    }

    /// [`LonghornError::NotFound`].
    pub fn not_found(noun: &str, name: &str) -> Self {
        Self::NotFound {
            noun: noun.to_owned(),
            name: name.to_owned(),
        }
    }

    /// The gRPC code Longhorn's clients read.
    pub fn code(&self) -> Code {
        match self {
            Self::Invalid(_) => Code::InvalidArgument,
            Self::NotFound { .. } => Code::NotFound,
            Self::Refused(_) => Code::FailedPrecondition,
            Self::Peer { .. } => Code::Unavailable,
            Self::State(StateError::NotFound { .. }) => Code::NotFound,
            Self::State(StateError::AlreadyExists { .. }) => Code::AlreadyExists,
            Self::State(StateError::Conflict { .. }) => Code::Aborted,
            Self::Spdk { .. } | Self::State(_) | Self::Internal { .. } => Code::Internal,
        }
    }
}

impl From<LonghornError> for Status {
    fn from(e: LonghornError) -> Self {
        let message = match &e {
            // the store's own words are `<type> "<id>" not found`
            LonghornError::State(StateError::NotFound { type_, id }) => format!("cannot find {type_} {id}"),
            _ => e.to_string(),
        };
        Status::new(e.code(), message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_the_code_and_words_longhorn_reads() {
        let cases: Vec<(LonghornError, Code, &str)> = vec![
            (
                LonghornError::Invalid("address \"x\" is not ip:port".into()),
                Code::InvalidArgument,
                "address \"x\" is not ip:port",
            ),
            (
                LonghornError::not_found("engine", "vol-e-0"),
                Code::NotFound,
                "cannot find engine vol-e-0",
            ),
            (
                LonghornError::Refused("replica r is WO".into()),
                Code::FailedPrecondition,
                "replica r is WO",
            ),
            (
                LonghornError::Peer {
                    replica: "vol-r-b".into(),
                    message: "its node: connection refused".into(),
                },
                Code::Unavailable,
                "replica vol-r-b: its node: connection refused",
            ),
            (
                StateError::NotFound {
                    type_: "LonghornEngine".into(),
                    id: "e".into(),
                }
                .into(),
                Code::NotFound,
                "cannot find LonghornEngine e",
            ),
            (
                LonghornError::internal("engine e: reading spdk_tgt", "closed"),
                Code::Internal,
                "engine e: reading spdk_tgt: closed",
            ),
        ];
        for (e, code, message) in cases {
            let s = Status::from(e);
            assert_eq!((s.code(), s.message()), (code, message));
        }
    }
}
