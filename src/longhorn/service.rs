//! What every Longhorn service handler shares: the [`Longhorn`] state the
//! five services work on, and the few words they answer in (NotFound as
//! Longhorn reads it, an internal error with its cause). A leaf of
//! `src/longhorn`: the handler files (`server`, `proxy`, `engine_ops`,
//! `rebuild`, `snaphash_ops`, ...) each add their `impl Longhorn` over it
//! and never import each other for it.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tonic::Status;

use super::error::LonghornError;
use super::snaphash::Hashes;
use crate::resources::longhorn::{Session, SwitchModes};
use crate::runtime::State;
use crate::spdk::SpdkClient;
use crate::spdk::client::ClientError;
use crate::spdk::inventory::{Inventory, SharedListing};

/// How old a listing of spdk_tgt may be when it answers one of the manager's polls
/// ([`Longhorn::polled_inventory`]). `engine.LonghornController` lists at each pass (every
/// 3 s while instances exist, plus the pass itself) and publishes the listing
/// ([`Longhorn::with_listing`]): at 5 s the polls between two passes take the last pass's
/// listing and list nothing themselves, and a change the target makes on its own (a remote
/// path lost) is reported within about the time the controller takes to act on it. A change
/// made through this session's clients still makes the next poll list again. Before
/// (issue 52): at 1 s, each poll's own listing, it was made again about every second
/// under the manager's polls of 20 engines (ReplicaList's 10.6 ms average, 2.3 s a minute
/// of node 1's, against 0.5 ms for the calls that list nothing); at 3 s, the polls' own,
/// one listing every 3 s beside the controller's.
pub const POLL_LISTING_AGE: Duration = Duration::from_secs(5);

/// Metadata of a forwarded proxy call (it is not forwarded again).
pub const FORWARDED: &str = "talon-forwarded";

/// How long a replica of another node that answered it restores nothing is taken at its
/// word: the manager asks every engine's restore status every few seconds (a call per
/// replica of another node each time: 21 calls/s on node 2 at 100 engines, issue 52),
/// and a restore into it starts with this node's own `BackupRestore` of the engine,
/// which forgets every such answer. Only a restore started by another node's engine
/// (an engine moved) goes unseen here, for at most this long.
const QUIET_AGE: Duration = Duration::from_secs(30);

/// The replicas of other nodes that answered they restore nothing, by (engine, replica),
/// with when: see [`QUIET_AGE`]. An answer asked before a `BackupRestore` started or
/// ended is not kept (the epoch moved on).
#[derive(Debug, Default)]
pub(super) struct QuietRestores {
    inner: Mutex<Quiet>,
}

/// What [`QuietRestores`] holds.
#[derive(Debug, Default)]
struct Quiet {
    /// Moved on at every start and end of a `BackupRestore`.
    epoch: u64,
    /// When each (engine, replica) answered it restores nothing.
    since: BTreeMap<(String, String), Instant>,
}

impl QuietRestores {
    fn lock(&self) -> MutexGuard<'_, Quiet> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The epoch to pass to [`Self::record`] for an answer asked now.
    pub(super) fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// Whether `replica` of `engine` answered it restores nothing within [`QUIET_AGE`].
    pub(super) fn quiet(&self, engine: &str, replica: &str) -> bool {
        self.lock()
            .since
            .get(&(engine.to_owned(), replica.to_owned()))
            .is_some_and(|at| at.elapsed() < QUIET_AGE)
    }

    /// Keeps `replica`'s answer that it restores nothing, asked at `epoch`.
    pub(super) fn record(&self, epoch: u64, engine: &str, replica: &str) {
        let mut q = self.lock();
        if q.epoch != epoch {
            return;
        }
        // answers of engines gone since are not kept
        q.since.retain(|_, at| at.elapsed() < QUIET_AGE);
        q.since
            .insert((engine.to_owned(), replica.to_owned()), Instant::now());
    }

    /// Forgets every answer (a restore starts or was asked).
    pub(super) fn forget(&self) {
        let mut q = self.lock();
        q.epoch += 1;
        q.since.clear();
    }
}

/// The state every service works on.
#[derive(Debug, Clone)]
pub struct Longhorn {
    state: State,
    client: SpdkClient,
    /// The V2 engine's operations over `client` (what this layer asks of SPDK).
    ops: crate::spdk::volume::VolumeOps,
    pub(super) ports: RangeInclusive<u16>,
    /// One port allocation at a time.
    pub(super) alloc: Arc<tokio::sync::Mutex<()>>,
    /// Set when the servers stop: open watch streams end (a graceful stop
    /// waits for every open call).
    pub(super) stopping: Arc<tokio::sync::watch::Sender<bool>>,
    /// The SPDKService port of the other nodes (the same as this node's).
    peer_port: u16,
    /// The channels to them, kept.
    peers: crate::proto::peer::PeerChannels,
    /// The ProxyEngineService port of the other nodes (this node's own).
    proxy_port: u16,
    /// The last iostat of each engine (MetricsGet reports rates).
    io_samples: Arc<std::sync::Mutex<BTreeMap<String, IoSample>>>,
    /// See [`super::server::LonghornOptions::overcommit_percent`].
    pub(super) overcommit_percent: u32,
    /// The snapshot hash jobs of this node's replicas.
    hashes: Arc<Hashes>,
    /// The snapshot clones into this node's engines (`SnapshotClone`).
    clones: Arc<super::clone::Clones>,
    /// talon's backup work dir (`<data dir>/backup`): Longhorn's backup
    /// credentials are kept under it while a backup runs.
    backup_dir: Option<std::path::PathBuf>,
    /// This serve's session (`resources::longhorn::new_session`), shared
    /// with `engine.LonghornController`: the reverts and rebuild starts the
    /// calls write carry it.
    session: Session,
    /// The operations in progress that a second one is refused on
    /// (`<engine>/replica-add`).
    held: Arc<Mutex<BTreeSet<String>>>,
    /// The copies this node runs for other nodes' engines' rebuilds, by
    /// (source replica, dest replica).
    src_copies: Arc<crate::spdk::volume::SrcCopies>,
    /// The last listing of spdk_tgt that answered a poll or a pass of
    /// `engine.LonghornController` ([`Self::with_listing`]).
    listing: SharedListing,
    /// The log levels and flags Longhorn asked for (`LogSetLevel`, `LogSetFlags`).
    asked_log: Arc<Mutex<BTreeSet<String>>>,
    /// Other nodes' replicas that answered they restore nothing (`BackupRestoreStatus`).
    quiet_restores: Arc<QuietRestores>,
}

impl Longhorn {
    /// Services on `state`, reading SPDK through `client`.
    pub fn new(state: State, client: SpdkClient, ports: RangeInclusive<u16>) -> Self {
        Self {
            state,
            ops: crate::spdk::volume::VolumeOps::new(client.clone()),
            client,
            ports,
            alloc: Arc::default(),
            stopping: Arc::new(tokio::sync::watch::channel(false).0),
            peer_port: 8504,
            peers: Default::default(),
            proxy_port: 8501,
            io_samples: Arc::default(),
            overcommit_percent: crate::spdk::placement::DEFAULT_OVERCOMMIT_PERCENT,
            hashes: Arc::new(Hashes::new(None)),
            clones: Arc::default(),
            backup_dir: None,
            session: crate::resources::longhorn::new_session(),
            held: Arc::default(),
            src_copies: Arc::default(),
            listing: SharedListing::default(),
            asked_log: Arc::default(),
            quiet_restores: Arc::default(),
        }
    }

    /// Other nodes' replicas that answered they restore nothing.
    pub(super) fn quiet_restores(&self) -> &QuietRestores {
        &self.quiet_restores
    }

    /// Records the log level (`flags`: the flags) Longhorn asked for; whether it is one it
    /// never asked before. The manager asks again every few seconds, the same few values
    /// each time (v1.12.1 alternates `Info` and `Notice`: its own level and SPDK's).
    pub(super) fn log_asked(&self, flags: bool, value: &str) -> bool {
        let mut asked = lock(&self.asked_log);
        if asked.len() >= 64 {
            asked.clear();
        }
        asked.insert(format!("{}:{value}", if flags { "flags" } else { "level" }))
    }

    /// spdk_tgt's listing for what the manager polls every few seconds per engine and replica
    /// (`ReplicaList`, `ReplicaRebuildingStatus`, `SnapshotList`, `ReplicaGet`): one listing
    /// made within [`POLL_LISTING_AGE`] answers them all. Each listing holds every object of
    /// the target, so a listing per call made a round of polls over N engines cost N
    /// listings of N engines' objects (N²). A listing is not used again once anything that may have
    /// changed the target went through a client of this session (the services' own, or
    /// `engine.LonghornController`'s: a snapshot made, a replica added; the manager's next
    /// SnapshotList must see it), so it only serves polls between changes. The
    /// lock is held across the listing on purpose: concurrent polls wait for the one being
    /// made instead of making their own.
    pub(super) async fn polled_inventory(&self) -> Result<Arc<Inventory>, ClientError> {
        self.listing.within(&self.client, POLL_LISTING_AGE).await
    }

    /// The listing shared with `engine.LonghornController` (its passes publish theirs): the
    /// controller lists every [`POLL_LISTING_AGE`] while instances exist, so the polls
    /// between its passes list nothing themselves. Its clients must share this service's
    /// change count (the session's).
    pub fn with_listing(mut self, listing: SharedListing) -> Self {
        self.listing = listing;
        self
    }

    /// The session `engine.LonghornController` of this serve carries out.
    pub fn with_session(mut self, session: Session) -> Self {
        self.session = session;
        self
    }

    pub(super) fn session(&self) -> u64 {
        self.session.id()
    }

    /// Holds operation `name` (`<engine>/<operation>`) until the [`Hold`]
    /// is dropped, unless one holds it already.
    pub(super) fn try_hold(&self, name: &str) -> Option<Hold> {
        lock(&self.held).insert(name.to_owned()).then(|| Hold {
            held: Arc::clone(&self.held),
            name: name.to_owned(),
        })
    }

    /// The copies this node runs for other nodes' rebuilds.
    pub(super) fn src_copies(&self) -> &crate::spdk::volume::SrcCopies {
        &self.src_copies
    }

    /// The modes engine `e` had when a thin rebuild's switch of it started,
    /// while the switch lasts.
    pub(super) fn switch_of(&self, e: &str) -> Option<SwitchModes> {
        self.session.switch_of(e)
    }

    /// Backups of Longhorn replicas keep their credentials under `dir`
    /// (talon's `<data dir>/backup`); without one they are refused.
    pub fn with_backup_dir(mut self, dir: std::path::PathBuf) -> Self {
        self.backup_dir = Some(dir);
        self
    }

    pub(super) fn backup_dir(&self) -> Option<&std::path::Path> {
        self.backup_dir.as_deref()
    }

    /// Snapshot hashes copy into files under `dir` (talon's data dir: a
    /// copy holds up to the snapshot's data); without one they are refused.
    pub fn with_hash_dir(mut self, dir: std::path::PathBuf) -> Self {
        self.hashes = Arc::new(Hashes::new(Some(dir)));
        self
    }

    pub(super) fn hashes(&self) -> &Arc<Hashes> {
        &self.hashes
    }

    pub(super) fn clones(&self) -> &Arc<super::clone::Clones> {
        &self.clones
    }

    /// The replicas on one disk may add up to `percent` of its capacity.
    pub fn with_overcommit(mut self, percent: u32) -> Self {
        self.overcommit_percent = percent;
        self
    }

    /// Other nodes' SPDKService is on `port` (this node's own, base + 4),
    /// and so their ProxyEngineService on base + 1 (the five services are
    /// on consecutive ports in [`super::SERVICES`] order).
    pub fn with_peer_port(mut self, port: u16) -> Self {
        self.peer_port = port;
        self.proxy_port = port.saturating_sub(3);
        self
    }

    pub(super) fn state(&self) -> &State {
        &self.state
    }

    pub(super) fn client(&self) -> &SpdkClient {
        &self.client
    }

    pub(super) fn ops(&self) -> &crate::spdk::volume::VolumeOps {
        &self.ops
    }

    pub(super) fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// The channels to the other nodes' SPDKService.
    pub(super) fn peers(&self) -> &crate::proto::peer::PeerChannels {
        &self.peers
    }

    pub(super) fn proxy_port(&self) -> u16 {
        self.proxy_port
    }

    /// Keeps `now` as engine `e`'s last iostat; returns the one before.
    pub(super) fn swap_io_sample(&self, e: &str, now: IoSample) -> Option<IoSample> {
        let mut m = self
            .io_samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.insert(e.to_owned(), now)
    }
}

/// An iostat sample of an engine's bdev, for rates between two MetricsGet.
#[derive(Debug, Clone, Copy)]
pub(super) struct IoSample {
    pub(super) at: Instant,
    pub(super) bytes_read: u64,
    pub(super) bytes_written: u64,
    pub(super) reads: u64,
    pub(super) writes: u64,
    pub(super) read_ticks: u64,
    pub(super) write_ticks: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An operation in progress ([`Longhorn::try_hold`]); over when dropped.
#[derive(Debug)]
pub(super) struct Hold {
    held: Arc<Mutex<BTreeSet<String>>>,
    name: String,
}

impl Drop for Hold {
    fn drop(&mut self) {
        lock(&self.held).remove(&self.name);
    }
}

/// NotFound in Longhorn's words: longhorn-manager goes on (creates the instance,
/// takes it as gone) only when the text says `cannot find` (its
/// `types.ErrorIsNotFound`), as Longhorn's SPDK engine says `cannot find
/// replica|engine|engine frontend <name>`.
pub(super) fn cannot_find(noun: &str, name: &str) -> Status {
    LonghornError::not_found(noun, name).into()
}

pub(super) fn internal(what: &str, e: impl std::fmt::Display) -> Status {
    LonghornError::internal(what, e).into()
}

pub(super) fn chain(e: &crate::spdk::ClientError) -> String {
    crate::util::error_chain(e)
}

/// A request number above `used` (the last one on the resource): the
/// clock's nanoseconds, so a number is not used again after a restart.
pub(super) fn next_request(used: u64) -> u64 {
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    clock.max(used.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The manager asks for the same log levels every few seconds (alternating `Info` and
    /// `Notice`): each value said once, the levels and the flags apart.
    #[test]
    fn a_log_level_asked_again_is_no_change() {
        let lh = Longhorn::new(State::in_memory(), SpdkClient::new("/nonexistent"), 1..=2);
        assert!(lh.log_asked(false, "Info"));
        assert!(lh.log_asked(false, "Notice"));
        for _ in 0..3 {
            assert!(!lh.log_asked(false, "Info"));
            assert!(!lh.log_asked(false, "Notice"));
        }
        assert!(lh.log_asked(true, ""), "the flags: first asked");
        assert!(!lh.log_asked(true, ""));
        assert!(lh.log_asked(false, "Debug"), "a new level");
    }

    #[test]
    fn a_hold_is_exclusive_until_dropped() {
        let lh = Longhorn::new(State::in_memory(), SpdkClient::new("/nonexistent"), 1..=2);
        let h = lh.try_hold("e/replica-add").expect("first hold");
        assert!(lh.try_hold("e/replica-add").is_none());
        assert!(
            lh.clone().try_hold("e/replica-add").is_none(),
            "a clone shares the holds"
        );
        drop(h);
        assert!(lh.try_hold("e/replica-add").is_some());
    }
}
