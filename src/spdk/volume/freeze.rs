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
//! A thaw sets the listeners `optimized` again. A host with NVMe multipath
//! queues the failed I/O until the ANA change notice and loses nothing.
//!
//! A stop between freeze and thaw leaves the export frozen: its hosts' I/O
//! queued for good. The engines' controllers call [`thaw_leftover`] once per
//! export and start (through a [`ThawOnce`]); it never thaws a freeze this
//! process holds (a snapshot in progress), which [`freeze`] records until
//! [`thaw`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, OnceLock};

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
    /// Recorded as held by this process (made by [`freeze`]).
    held: bool,
}

/// The exports this process holds frozen: NQN -> freezes in progress.
fn held() -> MutexGuard<'static, BTreeMap<String, usize>> {
    static HELD: OnceLock<Mutex<BTreeMap<String, usize>>> = OnceLock::new();
    HELD.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// Freezes export `sub`: no I/O command reaches its namespaces' bdevs and
/// none is in flight in them when this returns `Ok` (see the module). A
/// subsystem created without ANA reporting cannot be frozen: the caller
/// checks [`Subsystem::ana_reporting`] first (SPDK refuses the ANA state
/// with -32603).
pub async fn freeze(client: &SpdkClient, sub: &Subsystem) -> Result<Frozen, FreezeError> {
    *held().entry(sub.nqn.clone()).or_default() += 1;
    let mut frozen = Frozen {
        nqn: sub.nqn.clone(),
        listeners: Vec::new(),
        held: true,
    };
    for l in &sub.listen_addresses {
        if let Err(source) = set_ana(client, &sub.nqn, l, AnaState::Inaccessible).await {
            // thaw logs its own failures; the freeze error is the one to report
            let _ = thaw(client, &frozen).await;
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
            let _ = thaw(client, &frozen).await;
            return Err(FreezeError {
                what: format!("draining namespace {} of {}", ns.nsid, sub.nqn),
                source,
            });
        }
    }
    Ok(frozen)
}

/// Sets every listener a freeze made inaccessible optimized again; every one
/// is tried, the first error returned. The freeze is no longer held either
/// way (a listener left inaccessible is [`thaw_leftover`]'s).
pub async fn thaw(client: &SpdkClient, frozen: &Frozen) -> Result<(), ClientError> {
    let mut first = Ok(());
    for l in &frozen.listeners {
        if let Err(e) = set_ana(client, &frozen.nqn, l, AnaState::Optimized).await {
            tracing::error!(nqn = %frozen.nqn, listener = %l.traddr, error = %e, "could not thaw an export");
            first = first.and(Err(e));
        }
    }
    if frozen.held {
        let mut h = held();
        if let Some(n) = h.get_mut(&frozen.nqn) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                h.remove(&frozen.nqn);
            }
        }
    }
    first
}

/// Sets the listeners of export `nqn` that are not optimized optimized
/// again, unless a freeze of this process holds it: what a stop between a
/// freeze and its thaw left. Returns how many it thawed (0 for an export
/// that is not there).
pub async fn thaw_leftover(client: &SpdkClient, nqn: &str) -> Result<usize, ClientError> {
    if held().contains_key(nqn) {
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
    let left = Frozen {
        nqn: nqn.to_owned(),
        listeners: listeners
            .into_iter()
            .filter(|l| l.ana_states.iter().any(|s| s.ana_state != "optimized"))
            .map(|l| l.address)
            .collect(),
        held: false,
    };
    if left.listeners.is_empty() || held().contains_key(nqn) {
        return Ok(0);
    }
    tracing::warn!(%nqn, listeners = left.listeners.len(), "export was left frozen: thawing it");
    thaw(client, &left).await?;
    Ok(left.listeners.len())
}

/// The exports an engine controller has checked with [`thaw_leftover`]
/// since talon started: each is checked once, and again after a failed
/// check or a [`forget`](ThawOnce::forget) (a snapshot whose thaw may have
/// failed).
#[derive(Debug, Default)]
pub struct ThawOnce(Mutex<BTreeSet<String>>);

impl ThawOnce {
    fn checked(&self) -> MutexGuard<'_, BTreeSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Thaws export `nqn` if a stopped talon left it frozen, unless done
    /// already; a failure is logged (the hosts' I/O stays queued) and the
    /// export is checked again on the next call.
    pub async fn check(&self, client: &SpdkClient, nqn: &str) {
        if self.checked().contains(nqn) {
            return;
        }
        match thaw_leftover(client, nqn).await {
            Ok(_) => {
                self.checked().insert(nqn.to_owned());
            }
            Err(e) => tracing::warn!(
                %nqn,
                error = %crate::util::error_chain(&e),
                "could not check the export for a freeze"
            ),
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
