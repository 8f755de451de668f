//! What the Longhorn adapter's calls refuse or fail with, as one type, and
//! the one conversion to the gRPC status longhorn-manager reads.
//!
//! longhorn-manager acts on the code and, for "not found", on the words:
//! it creates an instance, or takes one as gone, only when the message
//! says `cannot find` (its `types.ErrorIsNotFound`), as Longhorn's SPDK
//! engine says `cannot find replica|engine|engine frontend <name>`. Every
//! other message names the object and what was refused; the code tells a
//! caller whether trying again can help (`FAILED_PRECONDITION`: not as things
//! are; `UNAVAILABLE`: another node or spdk_tgt did not answer). A message
//! that is not in those words but is NOT_FOUND all the same (`no copy of
//! snapshot s to d runs here`: talon's engine controller acts on the code)
//! is [`LonghornError::Gone`].

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
    /// The node that serves a replica was not reached (UNAVAILABLE).
    #[error("replica {replica}: {}", crate::util::error_chain(source))]
    Unreachable {
        /// The replica that node serves.
        replica: String,
        /// Why it was not reached.
        source: crate::proto::peer::PeerError,
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
    /// The object is not there, in words other than `cannot find <noun>
    /// <name>` (NOT_FOUND all the same: callers act on the code).
    #[error("{0}")]
    Gone(String),
    /// The object exists with other contents (ALREADY_EXISTS).
    #[error("{0}")]
    Exists(String),
    /// What the call waits for did not come in time (DEADLINE_EXCEEDED).
    #[error("{0}")]
    Timeout(String),
    /// Another node or a backup target did not answer, in its own words
    /// (UNAVAILABLE).
    #[error("{0}")]
    Unavailable(String),
    /// The call was cut short, in its own words (ABORTED): what it waited
    /// on is being deleted.
    #[error("{0}")]
    Aborted(String),
    /// A bound of this node is reached, in its own words
    /// (RESOURCE_EXHAUSTED): no free ports left in the range, a disk past
    /// its overcommit.
    #[error("{0}")]
    Exhausted(String),
    /// A call talon does not carry out, in Longhorn's words (UNIMPLEMENTED).
    #[error("{0}")]
    Unimplemented(String),
    /// talon's state store failed a step: INTERNAL whatever its kind (a step
    /// whose not-found or conflict is not the caller's to act on).
    #[error("{}", crate::util::error_chain(.0))]
    Store(#[source] StateError),
    /// Another node's instance manager answered an error: its code, its
    /// words after the replica's name.
    #[error("replica {replica}: its node: {message}")]
    PeerAnswer {
        /// The replica that node serves.
        replica: String,
        /// The code it answered.
        code: Code,
        /// Its message.
        message: String,
    },
    /// Several replicas' errors: the first one's code, every message
    /// (`; ` between them).
    #[error("{}", join(.0))]
    Several(Vec<LonghornError>),
    /// A status passed on as it is: another node's answer, or a helper's
    /// that answers a [`Status`].
    #[error("{}", .0.message())]
    Relayed(Box<Status>),
    /// Failed on this node, in words that name the object already
    /// (INTERNAL): what the controller recorded of a request it carried
    /// out (an engine snapshot's error).
    #[error("{0}")]
    Failed(String),
    /// One step of a call failed: that step's code, its message after the
    /// call's words (`expanding engine e to <size> bytes: replica r ...`).
    #[error("{what}: {}", .error.message())]
    Within {
        /// The call, naming the object.
        what: String,
        /// The step's error.
        error: Box<LonghornError>,
    },
}

impl From<Status> for LonghornError {
    fn from(s: Status) -> Self {
        Self::Relayed(Box::new(s))
    }
}

fn join(all: &[LonghornError]) -> String {
    all.iter()
        .map(LonghornError::message)
        .collect::<Vec<_>>()
        .join("; ")
}

impl From<crate::spdk::volume::SrcCopyError> for LonghornError {
    /// A rebuild source's step: one asked before its start is refused.
    fn from(e: crate::spdk::volume::SrcCopyError) -> Self {
        use crate::spdk::volume::SrcCopyError as E;
        match e {
            E::NotStarted { .. } => Self::Refused(e.to_string()),
            E::Attach { replica, dst, source } => Self::internal(
                format!("replica {replica}: rebuilding {dst}"),
                crate::util::error_chain(&*source),
            ),
            E::Spdk {
                replica,
                step,
                source,
            } => Self::spdk(format!("replica {replica}: {step}"), source),
        }
    }
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

    /// [`LonghornError::Within`].
    pub fn within(what: impl Into<String>, error: LonghornError) -> Self {
        Self::Within {
            what: what.into(),
            error: Box::new(error),
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
            Self::Peer { .. } | Self::Unreachable { .. } => Code::Unavailable,
            Self::State(StateError::NotFound { .. }) => Code::NotFound,
            Self::State(StateError::AlreadyExists { .. }) => Code::AlreadyExists,
            Self::State(StateError::Conflict { .. }) => Code::Aborted,
            Self::Spdk { .. } | Self::State(_) | Self::Internal { .. } | Self::Store(_) | Self::Failed(_) => {
                Code::Internal
            }
            Self::Gone(_) => Code::NotFound,
            Self::Exists(_) => Code::AlreadyExists,
            Self::Timeout(_) => Code::DeadlineExceeded,
            Self::Unavailable(_) => Code::Unavailable,
            Self::Exhausted(_) => Code::ResourceExhausted,
            Self::Unimplemented(_) => Code::Unimplemented,
            Self::Aborted(_) => Code::Aborted,
            Self::PeerAnswer { code, .. } => *code,
            Self::Several(all) => all.first().map_or(Code::Internal, Self::code),
            Self::Relayed(s) => s.code(),
            Self::Within { error, .. } => error.code(),
        }
    }

    /// The message Longhorn's clients read.
    pub fn message(&self) -> String {
        match self {
            // the store's own words are `<type> "<id>" not found`
            Self::State(StateError::NotFound { type_, id }) => format!("cannot find {type_} {id}"),
            _ => self.to_string(),
        }
    }
}

impl From<LonghornError> for Status {
    fn from(e: LonghornError) -> Self {
        match e {
            LonghornError::Relayed(s) => *s,
            e => Status::new(e.code(), e.message()),
        }
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
            (
                LonghornError::Gone("replica r: no copy of snapshot s to d runs here".into()),
                Code::NotFound,
                "replica r: no copy of snapshot s to d runs here",
            ),
            (
                LonghornError::Exists("backup b: a backup of that name exists".into()),
                Code::AlreadyExists,
                "backup b: a backup of that name exists",
            ),
            (
                LonghornError::Timeout("replica r: its head is not exported again after 20s".into()),
                Code::DeadlineExceeded,
                "replica r: its head is not exported again after 20s",
            ),
            (
                LonghornError::Unavailable("replica r: connection refused".into()),
                Code::Unavailable,
                "replica r: connection refused",
            ),
            (
                LonghornError::Aborted("deleting snapshot s of engine e: engine e is being deleted".into()),
                Code::Aborted,
                "deleting snapshot s of engine e: engine e is being deleted",
            ),
            (
                LonghornError::Exhausted("replica r: no 2 free consecutive ports left in 20001-20002".into()),
                Code::ResourceExhausted,
                "replica r: no 2 free consecutive ports left in 20001-20002",
            ),
            (
                LonghornError::Unimplemented("resume is not supported for instance type engine".into()),
                Code::Unimplemented,
                "resume is not supported for instance type engine",
            ),
            (
                LonghornError::Store(StateError::Conflict {
                    type_: "LonghornReplica".into(),
                    id: "r".into(),
                    expected: 1,
                    actual: 2,
                }),
                Code::Internal,
                "LonghornReplica \"r\" is at version 2, not 1",
            ),
            (
                LonghornError::PeerAnswer {
                    replica: "vol-r-b".into(),
                    code: Code::NotFound,
                    message: "cannot find replica vol-r-b".into(),
                },
                Code::NotFound,
                "replica vol-r-b: its node: cannot find replica vol-r-b",
            ),
            (
                LonghornError::Several(vec![
                    LonghornError::Refused("replica a is WO".into()),
                    StateError::NotFound {
                        type_: "LonghornReplica".into(),
                        id: "b".into(),
                    }
                    .into(),
                ]),
                Code::FailedPrecondition,
                "replica a is WO; cannot find LonghornReplica b",
            ),
            (
                Status::resource_exhausted("its node: too many calls").into(),
                Code::ResourceExhausted,
                "its node: too many calls",
            ),
            (
                LonghornError::Failed("snapshot s of engine e: the engine is not running: stopped".into()),
                Code::Internal,
                "snapshot s of engine e: the engine is not running: stopped",
            ),
            (
                LonghornError::within(
                    "expanding engine e to 2097152 bytes",
                    LonghornError::Peer {
                        replica: "vol-r-b".into(),
                        message: "its node: connection refused".into(),
                    },
                ),
                Code::Unavailable,
                "expanding engine e to 2097152 bytes: replica vol-r-b: its node: connection refused",
            ),
            (
                LonghornError::within(
                    "expanding engine e to 2097152 bytes",
                    StateError::NotFound {
                        type_: "Disk".into(),
                        id: "d".into(),
                    }
                    .into(),
                ),
                Code::NotFound,
                "expanding engine e to 2097152 bytes: cannot find Disk d",
            ),
            (
                LonghornError::within(
                    "expanding engine e to 2097152 bytes",
                    Status::failed_precondition("replica r: disk d is not ready").into(),
                ),
                Code::FailedPrecondition,
                "expanding engine e to 2097152 bytes: replica r: disk d is not ready",
            ),
        ];
        for (e, code, message) in cases {
            let s = Status::from(e);
            assert_eq!((s.code(), s.message()), (code, message));
        }
    }

    #[test]
    fn a_relayed_status_is_passed_on_as_it_is() {
        let mut s = Status::with_details(Code::Aborted, "its words", vec![1, 2].into());
        s.metadata_mut().insert("x-peer", "b".parse().expect("ascii"));
        let back = Status::from(LonghornError::from(s));
        assert_eq!((back.code(), back.message()), (Code::Aborted, "its words"));
        assert_eq!(back.details(), &[1, 2]);
        assert_eq!(
            back.metadata().get("x-peer").map(|v| v.to_str().ok()),
            Some(Some("b"))
        );
    }
}
