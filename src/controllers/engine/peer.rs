//! Calls to the other talon nodes that serve this node's remote replicas,
//! through their admin API on TCP (`RemoteReplica.api`, bearer token: this
//! node's peer token, one secret for the cluster's talon nodes), over TLS
//! when the node has `--tls-peer-ca` (its own `--tls-cert` is its client
//! certificate).
//!
//! ```text
//!   engine node                                  replica node (serveReplica k)
//!   snapshot: export frozen ──snapshot_create(wait)──> lvol <vol>-r<k>.s.<snap>
//!             local lvols snapshotted               (Snapshot resource there)
//!             export thawed
//!   delete:   local lvols ──snapshot_delete(wait)──> gone there too
//!   expand:   Volume size grows ──volume_expand──> served lvol grows there; its
//!             NVMe namespace grows, SPDK's raid1 follows its smallest member
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::api::ErrorKind;
use crate::api::volume::{ExpandParams, NameParams, RebuildPrepareParams, SnapshotParams};
use crate::client::{Client, ClientError, TlsClient};
use crate::resources::engine::RebuildDestStatus;
use crate::spdk::volume::{PeerError, PrepareError, RemoteDest};

/// How long a peer may take to make its replica ready for a rebuild's copy
/// (its volume controller answers in its next reconcile; the engine's
/// reconcile waits for it, so a node that is down is not waited for long).
const PREPARE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a peer may take to say which lvol it serves a replica from (asked
/// by the engine's reconcile when it is to make the raid1).
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a peer may take to snapshot its replica: this node's export is
/// frozen (hosts queue their I/O) while it does.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(10);

/// Talks to peer talon nodes.
#[derive(Clone, Default)]
pub struct Peers {
    token: Option<Arc<str>>,
    tls: Option<TlsClient>,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // the token is a secret
        f.debug_struct("Peers")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl Peers {
    /// Peers reached with `token` (none: every peer call fails, saying so).
    pub fn new(token: Option<Arc<str>>) -> Self {
        Self { token, tls: None }
    }

    /// Peers reached over TLS with `tls` (none: plain TCP).
    pub fn with_tls(mut self, tls: Option<TlsClient>) -> Self {
        self.tls = tls;
        self
    }

    /// Connects to the peer at `api` (done before a freeze: a node that
    /// cannot be reached never holds this node's export frozen).
    pub async fn connect(&self, api: &str) -> Result<Client, PeerError> {
        let token = self
            .token
            .as_deref()
            .ok_or_else(|| PeerError::NoToken { node: api.to_owned() })?;
        tokio::time::timeout(
            SNAPSHOT_TIMEOUT,
            Client::connect_tcp_with(api, token, self.tls.as_ref()),
        )
        .await
        .map_err(|_| PeerError::NoAnswer {
            node: api.to_owned(),
            after: SNAPSHOT_TIMEOUT,
        })?
        .map_err(|e| PeerError::Connect {
            node: api.to_owned(),
            message: crate::util::error_chain(&e),
        })
    }

    /// Snapshots replica `volume` on the peer at `api` (connected as `c`)
    /// as `snap`, waiting until it is taken.
    pub async fn snapshot(&self, c: &Client, api: &str, volume: &str, snap: &str) -> Result<(), PeerError> {
        let params = SnapshotParams {
            volume: volume.to_owned(),
            name: snap.to_owned(),
            wait: true,
            timeout_seconds: Some(SNAPSHOT_TIMEOUT.as_secs()),
        };
        let call = c.call::<_, serde_json::Value>("snapshot_create", params);
        let failed = |message| PeerError::Snapshot {
            node: api.to_owned(),
            volume: volume.to_owned(),
            snap: snap.to_owned(),
            message,
        };
        match tokio::time::timeout(SNAPSHOT_TIMEOUT + Duration::from_secs(1), call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(failed(format!(": {e}"))),
            Err(_) => Err(failed(format!(" not taken in {SNAPSHOT_TIMEOUT:?}"))),
        }
    }

    /// Deletes snapshot `snap` of replica `volume` on the peer at `api`,
    /// waiting until it is gone; one that is not there is no error.
    pub async fn delete_snapshot(&self, api: &str, volume: &str, snap: &str) -> Result<(), PeerError> {
        let c = self.connect(api).await?;
        let params = SnapshotParams {
            volume: volume.to_owned(),
            name: snap.to_owned(),
            wait: true,
            timeout_seconds: Some(60),
        };
        match c.call::<_, serde_json::Value>("snapshot_delete", params).await {
            Ok(_) => Ok(()),
            Err(ClientError::Rpc {
                kind: Some(ErrorKind::NotFound),
                ..
            }) => Ok(()),
            Err(e) => Err(PeerError::DeleteSnapshot {
                node: api.to_owned(),
                volume: volume.to_owned(),
                snap: snap.to_owned(),
                message: e.to_string(),
            }),
        }
    }

    /// Asks the peer at `api` to grow replica `volume` to `size_bytes` (its
    /// served lvol gets its superblock room on top); the same size is a no-op.
    pub async fn expand(&self, api: &str, volume: &str, size_bytes: u64) -> Result<(), PeerError> {
        let c = self.connect(api).await?;
        let params = ExpandParams {
            name: volume.to_owned(),
            size_bytes: Some(size_bytes),
            size: None,
            wait: false,
            timeout_seconds: None,
        };
        let call = c.call::<_, serde_json::Value>("volume_expand", params);
        let failed = |message| PeerError::Expand {
            node: api.to_owned(),
            volume: volume.to_owned(),
            message,
        };
        match tokio::time::timeout(SNAPSHOT_TIMEOUT, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(failed(format!(" to {size_bytes} bytes: {e}"))),
            Err(_) => Err(failed(format!(": no answer in {SNAPSHOT_TIMEOUT:?}"))),
        }
    }
}

/// The node serving remote replica `volume` (admin API `api`), as a thin
/// rebuild of that replica calls it.
#[derive(Debug, Clone)]
pub struct PeerDest {
    peers: Peers,
    api: String,
    volume: String,
}

impl PeerDest {
    /// The replica of `volume` served by the talon at `api`.
    pub fn new(peers: Peers, api: String, volume: String) -> Self {
        Self { peers, api, volume }
    }
}

#[async_trait::async_trait]
impl RemoteDest for PeerDest {
    async fn prepare(&self, chain: &[String]) -> Result<RebuildDestStatus, PrepareError> {
        let c = tokio::time::timeout(PREPARE_TIMEOUT, self.peers.connect(&self.api))
            .await
            .map_err(|_| {
                PrepareError::NoAnswer(format!(
                    "talon at {} did not answer in {PREPARE_TIMEOUT:?}",
                    self.api
                ))
            })?
            .map_err(|e| PrepareError::NoAnswer(e.to_string()))?;
        let params = RebuildPrepareParams {
            volume: self.volume.clone(),
            chain: chain.to_vec(),
            timeout_seconds: Some(PREPARE_TIMEOUT.as_secs()),
        };
        let call = c.call::<_, RebuildDestStatus>("replica_rebuild_prepare", params);
        let what = |e: &dyn std::fmt::Display| {
            format!(
                "talon at {}: making replica {} ready for its rebuild: {e}",
                self.api, self.volume
            )
        };
        match tokio::time::timeout(PREPARE_TIMEOUT + Duration::from_secs(1), call).await {
            Ok(Ok(a)) if a.message.is_empty() => Ok(a),
            Ok(Ok(a)) => Err(PrepareError::Refused(what(&a.message))),
            // its controller did not answer in time (its target down or restarting)
            Ok(Err(
                e @ ClientError::Rpc {
                    kind: Some(ErrorKind::Unavailable),
                    ..
                },
            ))
            | Ok(Err(e @ (ClientError::Transport(_) | ClientError::Connect { .. }))) => {
                Err(PrepareError::NoAnswer(what(&e)))
            }
            Ok(Err(e)) => Err(PrepareError::Refused(what(&e))),
            Err(_) => Err(PrepareError::NoAnswer(format!(
                "talon at {}: replica {} not ready for its rebuild in {PREPARE_TIMEOUT:?}",
                self.api, self.volume
            ))),
        }
    }

    async fn snapshot(&self, snap: &str) -> Result<(), PeerError> {
        let c = self.peers.connect(&self.api).await?;
        self.peers.snapshot(&c, &self.api, &self.volume, snap).await
    }

    async fn delete_snapshot(&self, snap: &str) -> Result<(), PeerError> {
        self.peers.delete_snapshot(&self.api, &self.volume, snap).await
    }

    async fn lvol(&self, k: usize) -> Result<Option<String>, PeerError> {
        let replica = crate::spdk::volume::naming::replica(&self.volume, k);
        let ask = async {
            let c = self.peers.connect(&self.api).await?;
            let params = NameParams {
                name: self.volume.clone(),
                wait: false,
                timeout_seconds: None,
            };
            // read as JSON: a peer of another version may report more fields
            let view = c
                .call::<_, serde_json::Value>("volume_get", params)
                .await
                .map_err(|e| PeerError::Connect {
                    node: self.api.clone(),
                    message: format!("reading volume {}: {e}", self.volume),
                })?;
            Ok(served_lvol(&view, &replica))
        };
        tokio::time::timeout(ASK_TIMEOUT, ask)
            .await
            .map_err(|_| PeerError::NoAnswer {
                node: self.api.clone(),
                after: ASK_TIMEOUT,
            })?
    }
}

/// The lvol UUID a peer's `volume_get` answer (`view`) reports for replica
/// lvol `replica` (its status's `bdev`, the lvol of `<lvstore>/<replica>`).
fn served_lvol(view: &serde_json::Value, replica: &str) -> Option<String> {
    view["replicas"]
        .as_array()?
        .iter()
        .filter(|r| {
            r["alias"]
                .as_str()
                .and_then(|a| a.rsplit_once('/'))
                .is_some_and(|(_, l)| l == replica)
        })
        .find_map(|r| r["bdev"].as_str().filter(|b| !b.is_empty()).map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_served_lvol_is_the_status_bdev_of_that_replica_only() {
        let view = serde_json::json!({
            "name": "v",
            "replicas": [
                {"alias": "talon-d1/v-r0", "bdev": "u-0"},
                {"alias": "talon-d2/v-r1", "bdev": "u-1", "newField": true},
                {"alias": "talon-d3/v-r10", "bdev": "u-10"},
                {"alias": "", "bdev": ""}
            ]
        });
        assert_eq!(served_lvol(&view, "v-r1").as_deref(), Some("u-1"));
        assert_eq!(served_lvol(&view, "v-r2"), None, "not reported");
        let waiting = serde_json::json!({"replicas": [{"alias": "talon-d2/v-r1", "bdev": ""}]});
        assert_eq!(served_lvol(&waiting, "v-r1"), None, "no lvol yet");
        assert_eq!(served_lvol(&serde_json::json!({}), "v-r1"), None);
    }
}
