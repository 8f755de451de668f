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
//! export) is waited for, named with the engine its node says holds it,
//! and asked for: the waiting engine's `ReplicaGet` carries
//! `proto::peer::SHARE_FOR` with its name, and the holder's node records the
//! ask on the replica (`LonghornReplica::shared_for`).
//!
//! ```text
//!   e-1 on B waits for r_A ──ReplicaGet r_A, talon-share-for: e-1──> A: r_A.sharedFor = {e-1, t}
//!   A, e-0's reconcile: r_A asked within the hold ──> member to its export (the engine's export closed a moment)
//!                       r_A through its export, no ask nor other reader for the hold
//!                                               ──> member back to its lvol (the engine's export closed a moment)
//! ```
//!
//! The serving engine decides ([`share_step`]); the move is
//! `spdk::volume::share` (no rebuild: the raid1 is made again over the same
//! members in sync). Whatever fails, the raid serves over every member.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::LonghornController;
use crate::names::ObjectName;
use crate::proto::spdkrpc;
use crate::resources::config::NodeConfig;
use crate::resources::longhorn::{LonghornEngine, LonghornReplica, SwitchModes};
use crate::runtime::Typed;
use crate::spdk::naming::longhorn as naming;
use crate::spdk::volume::{Inventory, MemberPath, MemberSwap, RemoteAttach};

/// How long a member stays behind its export after the last ask or the
/// last other reader, unless the node says (`replicaShareHoldSecs`).
pub(super) const SHARE_HOLD: Duration = Duration::from_secs(15);

/// What the serving engine does with one local member now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ShareStep {
    /// Stays as it is.
    Keep,
    /// From its lvol to its export (another engine asked).
    ToExport,
    /// From its export back to its lvol (nobody wants it any more).
    ToDirect,
}

/// The decision for one local member of a serving engine: `through_export`
/// now; `wanted`: how long ago another engine last asked for it or read its
/// export (`None`: never seen); `other_readers`: hosts other than this
/// engine's loopback on its export (`None`: unknown).
pub(super) fn share_step(
    through_export: bool,
    wanted: Option<Duration>,
    other_readers: Option<usize>,
    hold: Duration,
) -> ShareStep {
    let recently = wanted.is_some_and(|w| w < hold);
    match through_export {
        false if recently => ShareStep::ToExport,
        true if !recently && other_readers == Some(0) => ShareStep::ToDirect,
        _ => ShareStep::Keep,
    }
}

/// When each shared member (engine, replica) was last wanted: an ask, another reader,
/// or the first look after talon started (so a restart waits a hold before
/// taking a member back from readers it has not seen yet). The controller's own memory.
#[derive(Debug, Default)]
pub(super) struct Wanted(Mutex<BTreeMap<(String, String), Instant>>);

impl Wanted {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<(String, String), Instant>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

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
    /// The ask carries [`crate::proto::peer::SHARE_FOR`] `engine`: that
    /// engine puts its member behind the replica's export.
    pub(super) async fn holder_of(&self, engine: &str, replica: &str, address: &str) -> Option<String> {
        let ask = crate::proto::peer::share_for(
            spdkrpc::ReplicaGetRequest {
                name: replica.to_owned(),
            },
            engine,
        );
        let r = self.replica_there(address, ask).await?;
        r.error_msg.starts_with("held by engine").then_some(r.error_msg)
    }

    /// Replica `ask` names as the node at `address` answers `ReplicaGet`,
    /// asked briefly ([`ASK_TIMEOUT`]: a node that does not answer holds
    /// the pass). `None` when it does not answer, or refuses.
    pub(super) async fn replica_there(
        &self,
        address: &str,
        ask: tonic::Request<spdkrpc::ReplicaGetRequest>,
    ) -> Option<spdkrpc::Replica> {
        let replica = ask.get_ref().name.clone();
        let mut c = self
            .peers
            .client(address, self.peer_port, ASK_TIMEOUT)
            .await
            .ok()?;
        match tokio::time::timeout(ASK_TIMEOUT, c.replica_get(ask)).await {
            Ok(Ok(r)) => Some(r.into_inner()),
            Ok(Err(s)) => {
                tracing::debug!(%replica, %address, error = %s.message(), "ReplicaGet refused");
                None
            }
            Err(_) => {
                tracing::debug!(%replica, %address, "ReplicaGet: no answer in time");
                None
            }
        }
    }
}

impl LonghornController {
    /// Before running engine `e`'s reconcile: each local member of its raid1
    /// moved between its lvol and its export as [`share_step`] says. Returns
    /// the local replicas `e` holds directly afterwards (`direct` with the
    /// moves); `inv` is listed again after a move.
    pub(super) async fn share_members(
        &self,
        inv: &mut Inventory,
        node: &NodeConfig,
        e: &Typed<LonghornEngine>,
        local: &BTreeMap<String, LonghornReplica>,
        direct: &BTreeMap<String, LonghornReplica>,
    ) -> BTreeMap<String, LonghornReplica> {
        let mut direct = direct.clone();
        let hold = node
            .replica_share_hold_secs
            .map_or(SHARE_HOLD, Duration::from_secs);
        let now_ms = crate::util::unix_ms();
        for (r, address) in &e.spec.replica_address_map {
            let Some(spec) = local.get(r) else { continue };
            let Some(raid) = inv.raid(e.id()) else {
                return direct;
            };
            let through = inv.controllers.iter().any(|c| c == r);
            let key = (e.id().to_owned(), r.clone());
            // an ask of another engine, as old as its time says
            let asked = spec
                .shared_for
                .as_ref()
                .filter(|a| a.engine != e.id())
                .map(|a| Duration::from_millis(now_ms.saturating_sub(a.at_ms)));
            let Ok(name) = ObjectName::parse("replica", r) else {
                continue;
            };
            let Ok(rnqn) = naming::replica_nqn(&name) else {
                continue;
            };
            let mut other_readers = None;
            if through {
                let q = crate::spdk::rpc::ByNqn {
                    nqn: rnqn.as_str().to_owned(),
                };
                other_readers = match self.client.nvmf_subsystem_get_controllers(&q).await {
                    Ok(c) => Some(c.len().saturating_sub(1)),
                    Err(x) => {
                        tracing::warn!(
                            engine = e.id(),
                            replica = r.as_str(),
                            "reading the hosts of its export: {}; the member stays behind it",
                            super::chain(&x)
                        );
                        None
                    }
                };
            }
            let seen = Instant::now();
            let last = self.wanted.with(|w| {
                if !through {
                    w.remove(&key);
                } else if other_readers != Some(0) || !w.contains_key(&key) {
                    w.insert(key.clone(), seen);
                }
                w.get(&key).map(|t| seen.duration_since(*t))
            });
            let wanted = match (asked, last) {
                (Some(a), Some(l)) => Some(a.min(l)),
                (a, l) => a.or(l),
            };
            let to = match share_step(through, wanted, other_readers, hold) {
                ShareStep::Keep => continue,
                ShareStep::ToExport => MemberPath::Export,
                ShareStep::ToDirect => MemberPath::Direct,
            };
            let alias = naming::replica_alias(&spec.disk, r);
            let Some(lvol_uuid) = inv.lvols.get(&alias).map(|l| l.uuid.clone()) else {
                continue;
            };
            let Ok(addr) = self.instance_ip(node) else {
                continue;
            };
            let Ok(serving) = super::Serving::of(e.id(), &e.spec, self.export_spec(node, addr, e.spec.port))
            else {
                continue;
            };
            let at: SocketAddr = address
                .parse()
                .unwrap_or_else(|_| SocketAddr::new(addr, spec.port_start));
            let rspec = self.export_spec(node, addr, spec.port_start);
            let raid = raid.clone();
            let s = MemberSwap {
                of: e.id(),
                replica: r,
                names: &serving.names,
                spec: &serving.spec,
                raid: &raid,
                lvol: &alias,
                lvol_uuid: &lvol_uuid,
                export: super::replica_export(&rnqn, &alias, naming::namespace_id(name.as_str()), &rspec),
                attach: RemoteAttach::longhorn(r, at, rnqn.as_str()),
            };
            if let Some(why) = s.not_now() {
                tracing::info!(
                    engine = e.id(),
                    replica = r.as_str(),
                    to = to.as_str(),
                    "a member to move waits: {why}"
                );
                continue;
            }
            let asker = spec
                .shared_for
                .as_ref()
                .map(|a| a.engine.as_str())
                .unwrap_or_default();
            // while the raid is made again, `ReplicaList` reports the modes
            // from before (every member in service): the manager must not
            // fail a replica for the moment its raid is missing
            self.session.start_switch(
                e.id(),
                SwitchModes {
                    joining: String::new(),
                    in_service: e.spec.replica_address_map.keys().cloned().collect(),
                },
            );
            match self.ops.swap_member(inv, &s, to).await {
                Ok(took) => {
                    tracing::info!(
                        engine = e.id(),
                        replica = r.as_str(),
                        to = to.as_str(),
                        asked_by = asker,
                        closed_ms = took.as_secs_f64() * 1e3,
                        "the member moved while the export was closed, no rebuild"
                    );
                    match to {
                        MemberPath::Export => {
                            direct.remove(r);
                            self.wanted.with(|w| w.insert(key, seen));
                        }
                        MemberPath::Direct => {
                            direct.insert(r.clone(), spec.clone());
                            self.wanted.with(|w| w.remove(&key));
                        }
                    }
                }
                Err(x) => tracing::error!(engine = e.id(), replica = r.as_str(), to = to.as_str(),
                    error = %crate::util::error_chain(&x),
                    "moving the member failed; the engine keeps every member"),
            }
            match Inventory::load(&self.client).await {
                Ok(i) => *inv = i,
                Err(x) => tracing::warn!(engine = e.id(), "listing the target after a member moved: {x}"),
            }
            if inv.raid(e.id()).is_some() {
                self.session.switch_done(e.id());
            }
            // the move left the path as it is now
            let through_now = inv.controllers.iter().any(|c| c == r);
            if through_now {
                direct.remove(r);
            } else {
                direct.insert(r.clone(), spec.clone());
            }
        }
        direct
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

    /// The serving engine moves its member to the export when another
    /// engine asked within the hold, keeps it there while asked or read,
    /// and moves it back once neither for the hold and nobody else reads.
    #[test]
    fn a_member_goes_behind_its_export_while_wanted_and_back_after_the_hold() {
        let hold = Duration::from_secs(15);
        let s = |x: u64| Some(Duration::from_secs(x));
        assert_eq!(
            share_step(false, None, None, hold),
            ShareStep::Keep,
            "nobody asked"
        );
        assert_eq!(
            share_step(false, s(1), None, hold),
            ShareStep::ToExport,
            "asked just now"
        );
        assert_eq!(
            share_step(false, s(20), None, hold),
            ShareStep::Keep,
            "an old ask"
        );
        assert_eq!(
            share_step(true, s(1), Some(0), hold),
            ShareStep::Keep,
            "asked within the hold"
        );
        assert_eq!(
            share_step(true, s(20), Some(1), hold),
            ShareStep::Keep,
            "another engine reads it"
        );
        assert_eq!(
            share_step(true, s(20), None, hold),
            ShareStep::Keep,
            "readers unknown"
        );
        assert_eq!(
            share_step(true, s(20), Some(0), hold),
            ShareStep::ToDirect,
            "nobody wants it"
        );
        assert_eq!(
            share_step(true, None, Some(0), hold),
            ShareStep::ToDirect,
            "never asked, unread"
        );
        assert_eq!(
            share_step(true, s(0), Some(0), Duration::ZERO),
            ShareStep::ToDirect,
            "no hold"
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
