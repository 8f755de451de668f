//! The replica side of two engines sharing a replica (issue 53): another
//! node's engine that waits for a replica an engine here holds directly asks
//! for it in its `ReplicaGet` (`proto::peer::SHARE_FOR`); the ask is
//! recorded on the replica as desired state, and the engine here carries it
//! out (`controllers::longhorn::shared`).
//!
//! ```text
//!   node B: engine e-1 waits ──ReplicaGet r_A + talon-share-for: e-1──> node A
//!   node A: LonghornReplica r_A.sharedFor = {e-1, now}   (persisted)
//!           engine e-0: r_A's member behind r_A's export, at one closed instant of e-0's export
//! ```

use super::error::LonghornError;
use super::service::Longhorn;
use crate::resources::longhorn::{LonghornReplica, ShareAsk};
use crate::runtime::Typed;
use crate::spdk::naming::longhorn as naming;

impl Longhorn {
    /// Engine `engine` (another node's) asks to reach replica `r` through
    /// its export: recorded as `r.sharedFor` with the time of the ask. A bad
    /// engine name is refused, naming it.
    pub(super) fn share_asked(&self, r: &Typed<LonghornReplica>, engine: &str) -> Result<(), LonghornError> {
        let e = naming::instance_name("engine", engine).map_err(|x| {
            LonghornError::Invalid(format!(
                "replica {}: the engine that asks to share it: {x}",
                r.id()
            ))
        })?;
        let spec = LonghornReplica {
            shared_for: Some(ShareAsk {
                engine: e.as_str().to_owned(),
                at_ms: crate::util::unix_ms(),
            }),
            ..r.spec.clone()
        };
        self.state()
            .update_typed(r.id(), "", None, &spec)
            .map_err(LonghornError::State)?;
        tracing::debug!(
            replica = r.id(),
            engine = e.as_str(),
            "another engine asks to share this replica"
        );
        Ok(())
    }
}
