//! The admin API client, shared by the CLI and the tests.
//!
//! ```text
//!   Client::connect_unix(path) ──UnixStream──> WebSocket handshake ──> jsonrpsee client
//!   Client::connect_tcp(addr, token) ──TcpStream + Authorization: Bearer──┘
//!   client.call("volume_create", json!({...})) / typed helpers / watch() subscription
//! ```

mod backup;

use std::path::{Path, PathBuf};
use std::time::Duration;

use jsonrpsee::client_transport::ws::{Url, WsTransportClientBuilder};
use jsonrpsee::core::client::{ClientBuilder, ClientT, Subscription, SubscriptionClientT};
use jsonrpsee::core::traits::ToRpcParams;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::api::ErrorKind;
pub use crate::api::tls::TlsClient;
use crate::api::types::NodeInfo;
use crate::runtime::{ControllerStatus, Event, Resource, TypeInfo};

/// The default API socket.
pub const DEFAULT_SOCKET: &str = "/run/talon/talon.sock";

/// A failed API call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach talon at {path} (is `talon serve` running? set --socket or TALON_SOCKET)")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS handshake with talon at {endpoint} failed: {message}")]
    Tls { endpoint: String, message: String },
    #[error("API handshake with {endpoint} failed: {message}")]
    Handshake { endpoint: String, message: String },
    /// The daemon answered with an error.
    #[error("{message}")]
    Rpc {
        /// JSON-RPC error code.
        code: i32,
        /// talon's error kind, when the code is one of talon's.
        kind: Option<ErrorKind>,
        /// The daemon's message (names the object).
        message: String,
    },
    #[error("API transport failed: {0}")]
    Transport(String),
    #[error("API reply does not decode: {0}")]
    Decode(#[from] serde_json::Error),
}

impl From<jsonrpsee::core::ClientError> for ClientError {
    fn from(e: jsonrpsee::core::ClientError) -> Self {
        match e {
            jsonrpsee::core::ClientError::Call(obj) => ClientError::Rpc {
                code: obj.code(),
                kind: ErrorKind::from_code(obj.code()),
                message: obj.message().to_string(),
            },
            other => ClientError::Transport(other.to_string()),
        }
    }
}

/// Named params from any serializable value.
struct Named(Value);

impl ToRpcParams for Named {
    fn to_rpc_params(self) -> Result<Option<Box<RawValue>>, serde_json::Error> {
        serde_json::value::to_raw_value(&self.0).map(Some)
    }
}

/// A connected API client.
#[derive(Debug)]
pub struct Client {
    inner: jsonrpsee::core::client::Client,
}

fn builder() -> ClientBuilder {
    ClientBuilder::default()
        .request_timeout(Duration::from_secs(300))
        .max_buffer_capacity_per_subscription(4096)
}

impl Client {
    /// Connects to the daemon's Unix socket.
    pub async fn connect_unix(path: &Path) -> Result<Self, ClientError> {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|source| ClientError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        let url = Url::parse("ws://localhost/").map_err(|e| ClientError::Transport(e.to_string()))?;
        let (tx, rx) = WsTransportClientBuilder::default()
            .build_with_stream(url, stream)
            .await
            .map_err(|e| ClientError::Handshake {
                endpoint: path.display().to_string(),
                message: e.to_string(),
            })?;
        Ok(Self {
            inner: builder().build_with_tokio(tx, rx),
        })
    }

    /// Connects to the daemon's TCP listener with a bearer token (plain TCP:
    /// the token and every call cross the network unencrypted).
    pub async fn connect_tcp(addr: &str, token: &str) -> Result<Self, ClientError> {
        Self::connect_tcp_with(addr, token, None).await
    }

    /// Connects to the daemon's TCP listener over TLS (`tls`: the CA the
    /// server's certificate must be signed by, and a client certificate when
    /// the server asks for one) with a bearer token.
    pub async fn connect_tcp_tls(addr: &str, token: &str, tls: &TlsClient) -> Result<Self, ClientError> {
        Self::connect_tcp_with(addr, token, Some(tls)).await
    }

    /// [`Client::connect_tcp`], over TLS when `tls` is given.
    pub async fn connect_tcp_with(
        addr: &str,
        token: &str,
        tls: Option<&TlsClient>,
    ) -> Result<Self, ClientError> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| ClientError::Connect {
                path: PathBuf::from(addr),
                source,
            })?;
        let url = Url::parse(&format!("ws://{addr}/")).map_err(|e| ClientError::Transport(e.to_string()))?;
        let mut headers = http::HeaderMap::new();
        let value = http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|e| ClientError::Transport(format!("token is not a valid header value: {e}")))?;
        headers.insert(http::header::AUTHORIZATION, value);
        let ws = WsTransportClientBuilder::default().set_headers(headers);
        let handshake = |message: String| ClientError::Handshake {
            endpoint: addr.to_string(),
            message,
        };
        let inner = match tls {
            None => {
                let (tx, rx) = ws
                    .build_with_stream(url, stream)
                    .await
                    .map_err(|e| handshake(e.to_string()))?;
                builder().build_with_tokio(tx, rx)
            }
            Some(tls) => {
                let (connector, name) = tls.connector(addr).map_err(|message| ClientError::Tls {
                    endpoint: addr.to_string(),
                    message,
                })?;
                let stream = connector
                    .connect(name, stream)
                    .await
                    .map_err(|e| ClientError::Tls {
                        endpoint: addr.to_string(),
                        message: e.to_string(),
                    })?;
                let (tx, rx) = ws
                    .build_with_stream(url, stream)
                    .await
                    .map_err(|e| handshake(e.to_string()))?;
                builder().build_with_tokio(tx, rx)
            }
        };
        Ok(Self { inner })
    }

    /// Calls a method with named params and decodes the result.
    pub async fn call<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: P,
    ) -> Result<R, ClientError> {
        let v: Value = self
            .inner
            .request(method, Named(serde_json::to_value(params)?))
            .await?;
        Ok(serde_json::from_value(v)?)
    }

    /// `node_info`.
    pub async fn node_info(&self) -> Result<NodeInfo, ClientError> {
        self.call("node_info", serde_json::json!({})).await
    }

    /// `resource_types`.
    pub async fn types(&self) -> Result<Vec<TypeInfo>, ClientError> {
        self.call("resource_types", serde_json::json!({})).await
    }

    /// `controller_list`.
    pub async fn controllers(&self) -> Result<Vec<ControllerStatus>, ClientError> {
        self.call("controller_list", serde_json::json!({})).await
    }

    /// `resource_list`.
    pub async fn list(&self, type_: &str) -> Result<Vec<Resource>, ClientError> {
        self.call("resource_list", serde_json::json!({ "type": type_ }))
            .await
    }

    /// `resource_get`.
    pub async fn get(&self, type_: &str, id: &str) -> Result<Resource, ClientError> {
        self.call("resource_get", serde_json::json!({ "type": type_, "id": id }))
            .await
    }

    /// `resource_watch`: a stream of events (existing resources first when `bootstrap`).
    pub async fn watch(
        &self,
        type_: Option<&str>,
        bootstrap: bool,
    ) -> Result<Subscription<Event>, ClientError> {
        let params = serde_json::json!({ "type": type_, "bootstrap": bootstrap });
        Ok(self
            .inner
            .subscribe("resource_watch", Named(params), "resource_unwatch")
            .await?)
    }

    /// `rpc.discover`.
    pub async fn discover(&self) -> Result<Value, ClientError> {
        self.call("rpc.discover", serde_json::json!({})).await
    }
}
