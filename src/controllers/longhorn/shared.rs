//! Replicas two engines of one volume share while Longhorn moves the engine
//! (a second engine on another node over the same replicas: engine
//! relocation by `engineNodeID`, V2 live migration), and the controller IDs
//! each engine's export hands out.
//!
//! ```text
//!   node A: engine e-0 (serves) ── raid1 [ r_A lvol, r_Bn1 ] ──────────┐ NVMe/TCP
//!   node B: replica r_B ── lvol ── export nqn..:r_B  <─────────────────┘
//!           engine e-1 (new) ── raid1 [ r_An1 (waits: e-0 holds r_A), r_Bn1 ] ── loopback to the export
//! ```
//!
//! A local replica an engine here does not serve from yet, whose export
//! another engine reads (a controller is connected to it), is left exactly
//! as it is: exported, never claimed. The engine here reaches it through
//! that export (a second host controller on the subsystem, over loopback)
//! and keeps doing so while that attachment exists. A replica another node
//! holds directly (its engine's raid1 claims the lvol, which SPDK cannot
//! export) is waited for, named with the engine its node says holds it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::LonghornController;
use crate::proto::spdkrpc;
use crate::resources::longhorn::{LonghornEngine, LonghornReplica};
use crate::runtime::Typed;
use crate::spdk::naming::longhorn as naming;
use crate::spdk::volume::Inventory;

/// How long an engine that waits asks a replica's node why it is not
/// exported.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Controller IDs per engine ordinal: an engine's export hands out these
/// many, from its own range.
const CNTLIDS_PER_ENGINE: u16 = 64;
/// SPDK's highest controller ID (`nvmf_get_subsystems` reports
/// `max_cntlid` 65519 for a subsystem made without one).
const MAX_CNTLID: u16 = 0xffef;

/// The controller IDs engine `engine`'s export hands out: its own range of
/// [`CNTLIDS_PER_ENGINE`] from the ordinal Longhorn puts last in its name
/// (`<volume>-e-<n>`), so two engines of one volume (whose ordinals
/// differ) never hand out the same ID. A name without a number gets a
/// range from its CRC-32 (not `DefaultHasher`, whose output may change
/// with the Rust release talon is built with). Derived from the name, the range is the same after
/// every restart and re-export.
pub(super) fn engine_cntlid(engine: &str) -> (u16, u16) {
    let ranges = u64::from(MAX_CNTLID / CNTLIDS_PER_ENGINE);
    let ordinal = engine
        .rsplit('-')
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| u64::from(crc32fast::hash(engine.as_bytes())));
    let slot = u16::try_from(ordinal % ranges).unwrap_or(0);
    let min = slot * CNTLIDS_PER_ENGINE + 1;
    (min, min + CNTLIDS_PER_ENGINE - 1)
}

/// What this node sees of a local replica in an engine's map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ReplicaSeen {
    /// This node has a controller attached to the replica's own export
    /// (the engine reaches it through it).
    pub through_export: bool,
    /// Its export exists.
    pub exported: bool,
    /// Host controllers connected to its export (`None`: the count could
    /// not be read).
    pub readers: Option<usize>,
}

/// Whether an engine here (`serves`: its raid1 or bare export exists)
/// reaches local replica `seen` through the replica's export rather than
/// holding its lvol directly. Through the export when it already does,
/// and when the engine does not serve yet while another engine reads the
/// export (or that cannot be told): taking the lvol then would end that
/// export and fail the serving engine's member.
pub(super) fn through_export(serves: bool, seen: ReplicaSeen) -> bool {
    if seen.through_export {
        return true;
    }
    !serves && seen.exported && seen.readers != Some(0)
}

impl LonghornController {
    /// The local replicas engines here reach through their exports (see
    /// [`through_export`]): never held, never unexported here while so.
    pub(super) async fn shared_replicas(
        &self,
        inv: &Inventory,
        running_engines: &[&Typed<LonghornEngine>],
        local: &BTreeMap<String, LonghornReplica>,
    ) -> BTreeSet<String> {
        let mut shared = BTreeSet::new();
        for e in running_engines {
            let serves = inv.raid(e.id()).is_some()
                || crate::names::ObjectName::parse("volume", &e.spec.volume)
                    .ok()
                    .and_then(|v| naming::volume_nqn(&v).ok())
                    .is_some_and(|n| inv.subsystem(n.as_str()).is_some());
            for r in e
                .spec
                .replica_address_map
                .keys()
                .filter(|r| local.contains_key(*r))
            {
                let mut seen = ReplicaSeen {
                    through_export: inv.controllers.iter().any(|c| c == r),
                    ..Default::default()
                };
                let nqn = crate::names::ObjectName::parse("replica", r)
                    .ok()
                    .and_then(|n| naming::replica_nqn(&n).ok());
                if let Some(nqn) = nqn.as_ref().filter(|n| inv.subsystem(n.as_str()).is_some()) {
                    seen.exported = true;
                    // asked only when it decides
                    if !seen.through_export && !serves {
                        let q = crate::spdk::rpc::ByNqn {
                            nqn: nqn.as_str().to_owned(),
                        };
                        seen.readers = match self.client.nvmf_subsystem_get_controllers(&q).await {
                            Ok(c) => Some(c.len()),
                            Err(x) => {
                                tracing::warn!(
                                    replica = r.as_str(),
                                    "reading the hosts of its export: {}; it is left exported",
                                    super::chain(&x)
                                );
                                None
                            }
                        };
                    }
                }
                if through_export(serves, seen) {
                    if !seen.through_export {
                        tracing::info!(
                            engine = e.id(),
                            replica = r.as_str(),
                            "another engine reads this replica through its export: it stays \
                             exported and this engine attaches it through that export"
                        );
                    }
                    shared.insert(r.clone());
                }
            }
        }
        shared
    }

    /// Why remote replica `replica` at `address` cannot be attached, as its
    /// node says (`ReplicaGet`'s `error_msg`), when it says an engine there
    /// holds it. `None` when the node does not answer or says otherwise.
    pub(super) async fn holder_of(&self, replica: &str, address: &str) -> Option<String> {
        let mut c = self
            .peers
            .client(address, self.peer_port, ASK_TIMEOUT)
            .await
            .ok()?;
        let get = c.replica_get(spdkrpc::ReplicaGetRequest {
            name: replica.to_owned(),
        });
        let r = tokio::time::timeout(ASK_TIMEOUT, get)
            .await
            .ok()?
            .ok()?
            .into_inner();
        r.error_msg.starts_with("held by engine").then_some(r.error_msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica another engine reads through its export is never taken by
    /// an engine here that does not serve yet: it reaches it through the
    /// export, and keeps doing so once it serves; a replica nobody reads is
    /// held directly, as before.
    #[test]
    fn a_replica_another_engine_reads_is_reached_through_its_export() {
        let read = ReplicaSeen {
            through_export: false,
            exported: true,
            readers: Some(1),
        };
        assert!(through_export(false, read), "a second engine leaves it exported");
        let unknown = ReplicaSeen {
            readers: None,
            ..read
        };
        assert!(through_export(false, unknown), "unknown readers: left exported");
        let idle = ReplicaSeen {
            readers: Some(0),
            ..read
        };
        assert!(!through_export(false, idle), "nobody reads it: held directly");
        let unexported = ReplicaSeen::default();
        assert!(!through_export(false, unexported), "not exported: held directly");
        assert!(
            !through_export(true, read),
            "an engine that serves with its lvol keeps it"
        );
        let attached = ReplicaSeen {
            through_export: true,
            ..ReplicaSeen::default()
        };
        assert!(
            through_export(true, attached),
            "attached through its export: stays so"
        );
    }

    /// Two engines of one volume hand out disjoint controller IDs, within
    /// SPDK's range, the same at every call.
    #[test]
    fn engines_of_one_volume_get_disjoint_controller_id_ranges() {
        let a = engine_cntlid("vol-e-0");
        let b = engine_cntlid("vol-e-1");
        assert_eq!(a, (1, 64));
        assert_eq!(b, (65, 128));
        assert!(a.1 < b.0);
        assert_eq!(engine_cntlid("vol-e-1"), b);
        // a name without an ordinal: from its CRC-32, the same with every
        // Rust release (the value is zlib's crc32 of the name, mod 1023)
        assert_eq!(engine_cntlid("talon-engine"), (46849, 46912));
        for n in ["vol-e-1022", "vol-e-1023", "vol-e-99999", "talon-engine"] {
            let (lo, hi) = engine_cntlid(n);
            assert!(lo >= 1 && hi <= MAX_CNTLID && lo <= hi, "{n}: {lo}..{hi}");
        }
    }
}
