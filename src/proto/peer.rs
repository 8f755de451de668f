//! Calls to another node's SPDKService (base + 4): the replica calls an
//! engine makes of the nodes its remote replicas live on.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::spdkrpc::{self, spdk_service_client::SpdkServiceClient};
use crate::spdk::volume::replica_lvols::ReplicaLvols;

/// How long a connection to another node may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The SPDKService of the node that serves a replica at `address` (`ip:port`
/// of its export): the same IP, SPDKService port `port` (every instance
/// manager of a cluster listens on the same ports); calls time out after
/// `timeout`.
pub async fn peer_client(
    replica: &str,
    address: &str,
    port: u16,
    timeout: Duration,
) -> Result<SpdkServiceClient<tonic::transport::Channel>, String> {
    let address = address.strip_prefix("tcp://").unwrap_or(address);
    let sa: SocketAddr = address
        .parse()
        .map_err(|_| format!("replica {replica}: address {address:?} is not ip:port"))?;
    let url = format!("http://{}", SocketAddr::new(sa.ip(), port));
    let ch = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|e| format!("replica {replica}: {url}: {e}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(timeout)
        .connect()
        .await
        .map_err(|e| format!("replica {replica}: cannot reach its node at {url}: {e}"))?;
    Ok(SpdkServiceClient::new(ch))
}

/// The lvols of a replica of `map` (replica -> `ip:port`) as its node
/// lists them (its `ReplicaGet`), from the first that answers; calls to
/// SPDKService port `port` time out after `timeout`.
pub async fn remote_lvols(
    map: &BTreeMap<String, String>,
    port: u16,
    timeout: Duration,
) -> Option<ReplicaLvols> {
    for (replica, address) in map {
        let Ok(mut c) = peer_client(replica, address, port, timeout).await else {
            continue;
        };
        if let Ok(r) = c
            .replica_get(spdkrpc::ReplicaGetRequest {
                name: replica.clone(),
            })
            .await
        {
            return Some(ReplicaLvols::from(&r.into_inner()));
        }
    }
    None
}
