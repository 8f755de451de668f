//! Calls to another node's SPDKService (base + 4): the replica calls an
//! engine makes of the nodes its remote replicas live on.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::spdkrpc::{self, spdk_service_client::SpdkServiceClient};

/// How long a connection to another node may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Request metadata a talon engine sends with a replica call that waits on
/// the replica node's controller (`ReplicaRebuildingDstStart`,
/// `ReplicaSnapshotRevert`): the node
/// answers at once with where it stands, and the engine asks again at its
/// next step. An engine calls from inside its own controller's reconcile,
/// so two nodes rebuilding into each other would otherwise each hold their
/// reconcile until the other's call timed out. A caller without it (not
/// talon's) gets Longhorn's answer: once the work is done.
pub const AT_ONCE: &str = "talon-answer-at-once";

/// `message` as a request asked [`AT_ONCE`].
pub fn at_once<T>(message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut()
        .insert(AT_ONCE, tonic::metadata::MetadataValue::from_static("1"));
    req
}

/// Response metadata of a call asked [`AT_ONCE`] whose answer carries no
/// field to say it (`ReplicaSnapshotRevert`): the node is still at the work;
/// the engine asks again. Absent: the work is done.
pub const PENDING: &str = "talon-pending";

/// Request metadata of a talon engine's `ReplicaGet` of a replica it waits
/// for because an engine on the replica's node holds it directly (its raid1
/// claims the lvol): the value names the asking engine, and the replica's
/// node records the ask (`LonghornReplica::shared_for`), so its engine puts
/// that member behind the replica's export (`controllers::longhorn::shared`).
pub const SHARE_FOR: &str = "talon-share-for";

/// `message` asked [`SHARE_FOR`] engine `engine` (an engine name is ASCII;
/// one that is not a metadata value is sent without the ask).
pub fn share_for<T>(message: T, engine: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Ok(v) = tonic::metadata::MetadataValue::try_from(engine) {
        req.metadata_mut().insert(SHARE_FOR, v);
    }
    req
}

/// The engine a request asks [`SHARE_FOR`], if any.
pub fn asked_share_for(meta: &tonic::metadata::MetadataMap) -> Option<String> {
    meta.get(SHARE_FOR)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Why another node's SPDKService cannot be reached. It does not name the
/// replica: each caller names it once, in its own words.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("address {0:?} is not ip, ip:port or tcp://ip:port")]
    Address(String),
    #[error("cannot reach its node at {url}")]
    Unreachable {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// Why another node did not say what an engine of it is ([`PeerChannels::engine_get`]).
#[derive(Debug, thiserror::Error)]
pub enum EngineAskError {
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// Its answer, an error (NOT_FOUND: no such engine there).
    #[error("EngineGet: {}", .0.message())]
    Answered(Box<tonic::Status>),
}

impl EngineAskError {
    /// Whether the node answered it has no such engine.
    pub fn not_found(&self) -> bool {
        matches!(self, Self::Answered(s) if s.code() == tonic::Code::NotFound)
    }
}

/// Why replica `replica` cannot be the base a linked clone's replica is
/// rebuilt on, from what engine `engine` (at `address`), the source volume's
/// engine, says of it: not running, or not holding the replica RW (its data
/// voted corrupt, being rebuilt, gone). `None`: it can. Asked at the
/// `ReplicaAdd` (`longhorn`) and again right before the thin rebuild's switch
/// (`controllers::longhorn`), as longhorn-spdk-engine asks it twice.
pub fn unfit_base(
    replica: &str,
    engine: &str,
    address: &str,
    said: Result<spdkrpc::Engine, String>,
) -> Option<String> {
    match said {
        Err(x) => Some(format!("engine {engine} at {address:?} could not be asked: {x}")),
        Ok(e) if e.state != crate::resources::longhorn::InstanceState::Running.as_str() => {
            Some(format!("engine {engine} is not running ({:?})", e.state))
        }
        Ok(e) if e.replica_mode_map.get(replica) != Some(&(spdkrpc::ReplicaMode::Rw as i32)) => {
            Some(format!("replica {replica} is not RW in engine {engine}"))
        }
        Ok(_) => None,
    }
}

/// The channels to other nodes' SPDKService, by URL and call timeout, kept once connected:
/// the manager polls every engine every few seconds, and an engine asks the nodes of its
/// replicas each time (their restore status), so a connection per call cost a TCP and HTTP/2
/// handshake on both nodes per engine per poll. A kept channel connects again by itself
/// after its node restarts (a call meanwhile fails Unavailable). Owned by what calls the
/// other nodes (the Longhorn services, `engine.LonghornController`); clones share the channels.
#[derive(Debug, Clone, Default)]
pub struct PeerChannels(Arc<Mutex<Channels>>);

type Channels = HashMap<(String, Duration), tonic::transport::Channel>;

impl PeerChannels {
    fn lock(&self) -> std::sync::MutexGuard<'_, Channels> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The SPDKService of the node that serves a replica or an engine at
    /// `address` (`ip:port` of its export, `tcp://ip:port`, or the IP alone):
    /// the same IP, SPDKService port `port` (every instance manager of a
    /// cluster listens on the same ports); calls time out after `timeout`.
    pub async fn client(
        &self,
        address: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<SpdkServiceClient<tonic::transport::Channel>, PeerError> {
        let a = address.strip_prefix("tcp://").unwrap_or(address);
        let ip = a
            .parse::<SocketAddr>()
            .map(|sa| sa.ip())
            .or_else(|_| a.parse::<std::net::IpAddr>())
            .map_err(|_| PeerError::Address(address.to_owned()))?;
        let url = format!("http://{}", SocketAddr::new(ip, port));
        let key = (url.clone(), timeout);
        if let Some(ch) = self.lock().get(&key) {
            return Ok(SpdkServiceClient::new(ch.clone()));
        }
        let unreachable = |source| PeerError::Unreachable {
            url: url.clone(),
            source,
        };
        let ch = tonic::transport::Endpoint::from_shared(url.clone())
            .map_err(unreachable)?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(timeout)
            .connect()
            .await
            .map_err(unreachable)?;
        self.lock().insert(key, ch.clone());
        Ok(SpdkServiceClient::new(ch))
    }

    /// Engine `name` as its node (at `address`, as [`Self::client`] takes
    /// it) answers its SPDKService `EngineGet`.
    pub async fn engine_get(
        &self,
        address: &str,
        port: u16,
        timeout: Duration,
        name: &str,
    ) -> Result<spdkrpc::Engine, EngineAskError> {
        let mut c = self.client(address, port, timeout).await?;
        c.engine_get(spdkrpc::EngineGetRequest {
            name: name.to_owned(),
        })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| EngineAskError::Answered(Box::new(s)))
    }

    /// A replica of `map` (replica -> `ip:port`) as its node lists it (its
    /// `ReplicaGet`: head and snapshots), from the first that answers; calls to
    /// SPDKService port `port` time out after `timeout`.
    pub async fn remote_replica(
        &self,
        map: &BTreeMap<String, String>,
        port: u16,
        timeout: Duration,
    ) -> Option<spdkrpc::Replica> {
        for (replica, address) in map {
            let Ok(mut c) = self.client(address, port, timeout).await else {
                continue;
            };
            if let Ok(r) = c
                .replica_get(spdkrpc::ReplicaGetRequest {
                    name: replica.clone(),
                })
                .await
            {
                return Some(r.into_inner());
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_is_fit_only_in_a_running_engine_that_holds_it_rw() {
        let e = |state: &str, mode: spdkrpc::ReplicaMode| spdkrpc::Engine {
            state: state.into(),
            replica_mode_map: [("r".to_owned(), mode as i32)].into(),
            ..Default::default()
        };
        let rw = e("running", spdkrpc::ReplicaMode::Rw);
        assert_eq!(unfit_base("r", "e", "10.0.0.1", Ok(rw.clone())), None);
        assert_eq!(
            unfit_base("r", "e", "10.0.0.1", Ok(e("error", spdkrpc::ReplicaMode::Rw))).as_deref(),
            Some("engine e is not running (\"error\")")
        );
        assert_eq!(
            unfit_base("r", "e", "10.0.0.1", Ok(e("running", spdkrpc::ReplicaMode::Wo))).as_deref(),
            Some("replica r is not RW in engine e")
        );
        assert_eq!(
            unfit_base("x", "e", "10.0.0.1", Ok(rw)).as_deref(),
            Some("replica x is not RW in engine e")
        );
        assert_eq!(
            unfit_base("r", "e", "10.0.0.1", Err("EngineGet: gone".into())).as_deref(),
            Some("engine e at \"10.0.0.1\" could not be asked: EngineGet: gone")
        );
    }

    /// The ask names the engine on the wire and is read back as sent; a
    /// plain request asks nothing.
    #[test]
    fn a_share_ask_carries_the_engine() {
        let req = share_for((), "vol-e-1");
        assert_eq!(asked_share_for(req.metadata()).as_deref(), Some("vol-e-1"));
        assert_eq!(asked_share_for(tonic::Request::new(()).metadata()), None);
    }
}
