//! One instant across a volume's replicas: freezing its NVMe-oF export.
//!
//! SPDK quiesces only the lvol `bdev_lvol_snapshot` snapshots, not its raid1
//! siblings, and v26.05 registers no `nvmf_subsystem_pause` RPC. A freeze
//! has to do two things: stop new I/O from entering the raid, and wait until
//! none is in flight in it. Upstream v26.05 offers each as a side effect of
//! another RPC, checked in its source and on a real target:
//!
//! 1. every listener of the subsystem is set ANA `inaccessible`
//!    (`nvmf_subsystem_listener_set_ana_state`): from then on every I/O
//!    command is completed with the path error "ANA inaccessible" (no DNR)
//!    before it reaches a bdev (`ctrlr.c`, `nvmf_ctrlr_process_io_cmd`). That
//!    RPC pauses the subsystem with nsid 0, which pauses no namespace: it
//!    does NOT wait for I/O already past the check;
//! 2. every namespace is moved to the ANA group it is already in
//!    (`nvmf_subsystem_set_ns_ana_group`), which SPDK does with that
//!    namespace paused: it waits until no I/O is outstanding on it in any
//!    poll group (`nvmf_poll_group_pause_subsystem`), so every write the
//!    raid1 took has completed on every member (raid1 completes a write
//!    when all its members did) before the call returns.
//!
//! Seen on a real v26.05 target with a `bdev_delay` namespace (2 s writes,
//! QD4): after step 1 alone, writes kept completing for up to 2 s; after
//! step 2 (which took the 1.8 s the writes still had), none did.
//!
//! A thaw sets the listeners back to the state the export serves in:
//! `optimized`, or the one its engine was set to
//! ([`Freezes::serve_as`]: a Longhorn engine a host is moving away from is
//! `inaccessible` or `non_optimized`). A host with NVMe multipath queues the
//! failed I/O until the ANA change notice and loses nothing.
//!
//! A stop between freeze and thaw leaves the export frozen: its hosts' I/O
//! queued for good. The engines' controllers call
//! [`Freezes::thaw_leftover`] once per export and start (through a
//! [`ThawOnce`]; every reconcile for an export that does not serve
//! `optimized`: one made again comes back optimized); it never thaws a freeze their operations hold (a snapshot
//! in progress), which [`Freezes::freeze`] records until [`Freezes::thaw`].
//! The record is the operations' own ([`super::VolumeOps::freezes`], shared
//! by their clones), not the process's: each controller freezes and checks
//! only the exports it serves.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::super::client::{ClientError, SpdkClient};
use super::super::error::ErrorKind;
use super::super::rpc::{AnaState, ByNqn, ListenAddress, ListenerAnaState, SetNsAnaGroup, Subsystem};

/// What a freeze set inaccessible: the listeners a thaw sets optimized again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frozen {
    /// The subsystem.
    pub nqn: String,
    /// Its listeners that are inaccessible now.
    pub listeners: Vec<ListenAddress>,
    /// Recorded as held in the [`Freezes`] that made it.
    held: bool,
}

/// The exports one engine's operations hold frozen (NQN -> freezes in
/// progress), and the ANA state each serves in when not `optimized`.
/// Clones share the record.
#[derive(Debug, Clone, Default)]
pub struct Freezes(Arc<Mutex<Record>>);

#[derive(Debug, Default)]
struct Record {
    held: BTreeMap<String, usize>,
    serving: BTreeMap<String, AnaState>,
}

/// A freeze that failed: what it was doing, and SPDK's answer. Whatever it
/// had set inaccessible was set optimized again.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct FreezeError {
    /// The step, naming the listener or namespace.
    pub what: String,
    /// SPDK's error.
    #[source]
    pub source: ClientError,
}

impl Freezes {
    fn record(&self) -> MutexGuard<'_, Record> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a freeze recorded here holds export `nqn`.
    pub fn holds(&self, nqn: &str) -> bool {
        self.record().held.contains_key(nqn)
    }

    /// Export `nqn` serves in ANA state `state` (`optimized` unless told):
    /// what a thaw sets its listeners to.
    pub fn serve_as(&self, nqn: &str, state: AnaState) {
        let mut r = self.record();
        match state {
            AnaState::Optimized => r.serving.remove(nqn),
            other => r.serving.insert(nqn.to_owned(), other),
        };
    }

    /// The ANA state export `nqn` serves in.
    pub fn serving(&self, nqn: &str) -> AnaState {
        self.record()
            .serving
            .get(nqn)
            .copied()
            .unwrap_or(AnaState::Optimized)
    }

    /// Freezes export `sub`: no I/O command reaches its namespaces' bdevs and
    /// none is in flight in them when this returns `Ok` (see the module). A
    /// subsystem created without ANA reporting cannot be frozen: the caller
    /// checks [`Subsystem::ana_reporting`] first (SPDK refuses the ANA state
    /// with -32603).
    pub async fn freeze(&self, client: &SpdkClient, sub: &Subsystem) -> Result<Frozen, FreezeError> {
        *self.record().held.entry(sub.nqn.clone()).or_default() += 1;
        let mut frozen = Frozen {
            nqn: sub.nqn.clone(),
            listeners: Vec::new(),
            held: true,
        };
        for l in &sub.listen_addresses {
            if let Err(source) = set_ana(client, &sub.nqn, l, AnaState::Inaccessible).await {
                // thaw logs its own failures; the freeze error is the one to report
                let _ = self.thaw(client, &frozen).await;
                return Err(FreezeError {
                    what: format!("freezing {} on {}", sub.nqn, l.traddr),
                    source,
                });
            }
            frozen.listeners.push(l.clone());
        }
        for ns in &sub.namespaces {
            let drain = SetNsAnaGroup {
                nqn: sub.nqn.clone(),
                nsid: ns.nsid,
                // SPDK puts a namespace added without one in the group of its nsid
                anagrpid: ns.anagrpid.unwrap_or(ns.nsid),
            };
            if let Err(source) = client.nvmf_subsystem_set_ns_ana_group(&drain).await {
                let _ = self.thaw(client, &frozen).await;
                return Err(FreezeError {
                    what: format!("draining namespace {} of {}", ns.nsid, sub.nqn),
                    source,
                });
            }
        }
        Ok(frozen)
    }

    /// Sets every listener a freeze made inaccessible to the state the export
    /// serves in ([`Freezes::serving`]) again; every one is tried, the first
    /// error returned. The freeze is no longer held either
    /// way (a listener left inaccessible is [`Freezes::thaw_leftover`]'s).
    pub async fn thaw(&self, client: &SpdkClient, frozen: &Frozen) -> Result<(), ClientError> {
        let mut first = Ok(());
        let state = self.serving(&frozen.nqn);
        for l in &frozen.listeners {
            if let Err(e) = set_ana(client, &frozen.nqn, l, state).await {
                tracing::error!(nqn = %frozen.nqn, listener = %l.traddr, error = %e, "could not thaw an export");
                first = first.and(Err(e));
            }
        }
        if frozen.held {
            let mut r = self.record();
            if let Some(n) = r.held.get_mut(&frozen.nqn) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    r.held.remove(&frozen.nqn);
                }
            }
        }
        first
    }

    /// Sets the listeners of export `nqn` that are not in the state it serves
    /// in ([`Freezes::serving`]) to it, unless a freeze recorded here holds
    /// it: what a stop between a freeze and its thaw left, or an export made
    /// again (its listener added optimized) of an engine set otherwise.
    /// Returns how many it set (0 for an export that is not there).
    pub async fn thaw_leftover(&self, client: &SpdkClient, nqn: &str) -> Result<usize, ClientError> {
        self.set_listeners(client, nqn, false).await
    }

    /// [`Self::thaw_leftover`]; `asked`: the state it serves in was just
    /// changed (an engine's ANA state set by its frontend's node), so the
    /// listeners set are told as that, not as something a stop left.
    async fn set_listeners(&self, client: &SpdkClient, nqn: &str, asked: bool) -> Result<usize, ClientError> {
        if self.holds(nqn) {
            return Ok(0);
        }
        let listeners = match client
            .nvmf_subsystem_get_listeners(&ByNqn { nqn: nqn.to_owned() })
            .await
        {
            Ok(l) => l,
            Err(e) if e.is(ErrorKind::InvalidParams) || e.is(ErrorKind::NotFound) => return Ok(0),
            Err(e) => return Err(e),
        };
        let want = self.serving(nqn).as_str();
        let left = Frozen {
            nqn: nqn.to_owned(),
            listeners: listeners
                .into_iter()
                .filter(|l| l.ana_states.iter().any(|s| s.ana_state != want))
                .map(|l| l.address)
                .collect(),
            held: false,
        };
        if left.listeners.is_empty() || self.holds(nqn) {
            return Ok(0);
        }
        if asked {
            tracing::info!(%nqn, listeners = left.listeners.len(), state = want, "export's listeners set to the ANA state asked");
        } else {
            tracing::warn!(%nqn, listeners = left.listeners.len(), state = want, "export's listeners are not in the state it serves in: setting them");
        }
        self.thaw(client, &left).await?;
        Ok(left.listeners.len())
    }
}

/// The exports an engine controller has checked with [`Freezes::thaw_leftover`]
/// since talon started: an export serving `optimized` is checked once, and
/// again after a failed check, a change of its state or a
/// [`forget`](ThawOnce::forget) (a snapshot whose thaw may have failed); one
/// serving in another state at every check (made again, by a restarted
/// spdk_tgt, its listener would be optimized).
#[derive(Debug, Default)]
pub struct ThawOnce(Mutex<BTreeMap<String, AnaState>>);

impl ThawOnce {
    fn checked(&self) -> MutexGuard<'_, BTreeMap<String, AnaState>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Export `nqn` serves in ANA state `state` ([`Freezes::serve_as`]): its
    /// listeners are set to it if a stopped talon left it frozen or it was
    /// set otherwise, unless done already (see [`ThawOnce`]). A failure is
    /// logged (the hosts' I/O stays queued), returned, and the export is
    /// checked again on the next call.
    pub async fn check(&self, ops: &super::VolumeOps, nqn: &str, state: AnaState) -> Result<(), ClientError> {
        ops.freezes().serve_as(nqn, state);
        let before = self.checked().get(nqn).copied();
        if state == AnaState::Optimized && before == Some(state) {
            return Ok(());
        }
        let asked = before.is_some_and(|b| b != state);
        match ops.freezes().set_listeners(ops.client(), nqn, asked).await {
            Ok(_) => {
                self.checked().insert(nqn.to_owned(), state);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(
                    %nqn,
                    error = %crate::util::error_chain(&e),
                    "could not check the export's ANA state"
                );
                self.checked().remove(nqn);
                Err(e)
            }
        }
    }

    /// Export `nqn` is checked again on the next [`check`](ThawOnce::check).
    pub fn forget(&self, nqn: &str) {
        self.checked().remove(nqn);
    }
}

async fn set_ana(
    client: &SpdkClient,
    nqn: &str,
    l: &ListenAddress,
    state: AnaState,
) -> Result<bool, ClientError> {
    client
        .nvmf_subsystem_listener_set_ana_state(&ListenerAnaState {
            nqn: nqn.to_owned(),
            listen_address: l.clone(),
            ana_state: state,
        })
        .await
}
