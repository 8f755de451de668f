//! Serving the API: a Unix socket (mode 0600) and an optional TCP listener that
//! refuses every request without the bearer token.
//!
//! ```text
//!   bind_unix(path) ──> UnixListener ─┐
//!   TcpListener + token ──────────────┼─> accept loop ──> jsonrpsee TowerService per connection
//!   shutdown future ──────────────────┘      (graceful: in-flight calls get STOP_GRACE, then closed; socket removed)
//! ```
//!
//! The TCP listener is bounded ([`TcpLimits`]): connections in total and per
//! peer address (over the bound a connection is closed at once), counted for
//! as long as the socket is open (a WebSocket the connection was upgraded to
//! included), a connection that moves no byte either way for `idle` is closed
//! (half-sent requests, half WebSocket frames, idle clients; WebSocket clients
//! answer the server's pings), and a refused request is answered 401 and
//! closed. The Unix socket has its own accept loop and no connection cap of
//! its own (only the idle bound), so a CLI call is never answered 429 however
//! many clients hold it; `serve` raises the descriptor limit and keeps
//! descriptors back from every network listener (this one's 128, Longhorn's
//! ports sized under the rest), so TCP clients cannot take the ones it needs.
//! Refusals are logged at most once per 10 s, with the count. With TLS
//! ([`serve_tcp_tls`]), a connection first takes its slot, then has
//! `handshake` to finish the TLS handshake (a client without a certificate
//! the client CA signed, or one speaking plain HTTP, is closed there); the
//! idle bound applies beneath TLS too.

use std::future::Future;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use jsonrpsee::Methods;
use jsonrpsee::server::{
    HttpBody, HttpRequest, HttpResponse, ServerConfig, serve_with_graceful_shutdown, stop_channel,
};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::net::{TcpListener, UnixListener};

use tower::Service;

use crate::util::conn::{Bounded, ConnCounter, RateLimitedLog};

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A listener that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot create the socket directory {path}")]
    SocketDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("socket {path} is in use by a running talon")]
    SocketInUse { path: PathBuf },
    #[error("cannot bind the API socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Binds the API's Unix socket: creates the parent directory (0700), removes a
/// stale socket nobody answers on, refuses one a live daemon answers on, and
/// restricts the socket to its owner (0600).
pub fn bind_unix(path: &Path) -> Result<UnixListener, ServeError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| ServeError::SocketDir {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServeError::SocketInUse {
                path: path.to_path_buf(),
            });
        }
        let _ = std::fs::remove_file(path);
    }
    let l = UnixListener::bind(path).map_err(|source| ServeError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        ServeError::Bind {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(l)
}

use std::os::unix::fs::DirBuilderExt;

/// jsonrpsee's settings; `max_connections` past which a connection is
/// answered 429 (the TCP listener's own bounds close connections before).
fn config(max_connections: u32) -> ServerConfig {
    ServerConfig::builder()
        .max_connections(max_connections)
        .max_subscriptions_per_connection(64)
        // a WebSocket client that answers no ping for 90 s is gone; the pings
        // keep a watching client's connection active for the idle timeout
        .enable_ws_ping(
            jsonrpsee::server::PingConfig::new()
                .ping_interval(Duration::from_secs(30))
                .inactive_limit(Duration::from_secs(90)),
        )
        .build()
}

/// Bounds of the TCP listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpLimits {
    /// Open connections in all.
    pub max_connections: usize,
    /// Open connections from one peer address.
    pub max_per_peer: usize,
    /// A connection that reads and writes nothing for this long is closed.
    pub idle: Duration,
    /// A TLS handshake not finished in this time is abandoned.
    pub handshake: Duration,
}

impl Default for TcpLimits {
    fn default() -> Self {
        Self {
            max_connections: 128,
            max_per_peer: 16,
            idle: Duration::from_secs(300),
            handshake: Duration::from_secs(10),
        }
    }
}

static REFUSED_TOKEN: RateLimitedLog = RateLimitedLog::new();
static REFUSED_CONN: RateLimitedLog = RateLimitedLog::new();
static REFUSED_TLS: RateLimitedLog = RateLimitedLog::new();

/// A listener the API can serve on.
trait ApiListener: Send + 'static {
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static;
    /// The next connection, and who is on the other end (`None`: the Unix socket).
    fn accept_conn(&self) -> impl Future<Output = std::io::Result<(Self::Stream, Option<IpAddr>)>> + Send;
}

impl ApiListener for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_conn(&self) -> std::io::Result<(Self::Stream, Option<IpAddr>)> {
        let (s, _) = self.accept().await?;
        Ok((s, None))
    }
}

impl ApiListener for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_conn(&self) -> std::io::Result<(Self::Stream, Option<IpAddr>)> {
        let (s, peer) = self.accept().await?;
        Ok((s, Some(peer.ip())))
    }
}

/// The accept loop shared by every listener: one jsonrpsee service per
/// connection, behind the bearer-token guard when `token` is set; on shutdown,
/// stop accepting and let open calls finish.
async fn serve_listener(
    listener: impl ApiListener,
    token: Option<Arc<str>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: TcpLimits,
    methods: Methods,
    shutdown: impl Future<Output = ()>,
) {
    let (stop_handle, server_handle) = stop_channel();
    // the Unix socket (0600, this node's root) is bounded by descriptors
    // only: a CLI call always finds a connection; TCP closes connections
    // over its own bounds before jsonrpsee would answer 429
    let max = if token.is_none() {
        u32::MAX
    } else {
        u32::try_from(limits.max_connections.saturating_add(1)).unwrap_or(u32::MAX)
    };
    let builder = jsonrpsee::server::Server::builder()
        .set_config(config(max))
        .to_service_builder();
    let counts = ConnCounter::default();
    // the connections' tasks: on shutdown they get STOP_GRACE to finish their calls
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            conn = listener.accept_conn() => match conn {
                Ok((stream, peer)) => {
                    let (slot, peer_name) = match peer {
                        None => (None, "unix socket".to_string()),
                        Some(ip) => match counts.take(ip, limits.max_connections, limits.max_per_peer) {
                            Ok(s) => (Some(s), ip.to_string()),
                            Err(why) => {
                                REFUSED_CONN.warn(&ip.to_string(), &format!("API connection refused: {why}"));
                                drop(stream);
                                continue;
                            }
                        },
                    };
                    let inner = builder.clone().build(methods.clone(), stop_handle.clone());
                    let svc = BearerAuth { inner, token: token.clone(), peer: peer_name };
                    let stopped = stop_handle.clone().shutdown();
                    let handshake = limits.handshake;
                    // the socket holds the slot: a WebSocket the connection
                    // was upgraded to (served by a task of its own) counts
                    // until its descriptor is closed
                    let stream = Bounded::new(stream, limits.idle, slot);
                    let tls = tls.clone();
                    // finished connections' tasks leave the set as it grows
                    while conns.try_join_next().is_some() {}
                    conns.spawn(async move {
                        let r = match (peer, tls) {
                            (Some(ip), Some(acceptor)) => {
                                let accept = acceptor.accept(stream);
                                match tokio::time::timeout(handshake, accept).await {
                                    Ok(Ok(tls)) => serve_with_graceful_shutdown(tls, svc, stopped).await,
                                    Ok(Err(e)) => {
                                        REFUSED_TLS.warn(&ip.to_string(), &format!("API connection refused: TLS handshake failed: {e}"));
                                        return;
                                    }
                                    Err(_) => {
                                        REFUSED_TLS.warn(&ip.to_string(), &format!("API connection refused: no TLS handshake in {handshake:?}"));
                                        return;
                                    }
                                }
                            }
                            _ => serve_with_graceful_shutdown(stream, svc, stopped).await,
                        };
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "API connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "API accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = &mut shutdown => break,
        }
    }
    let _ = server_handle.stop();
    // then closed: a connection that never finishes a request does not hold the stop
    let drained = tokio::time::timeout(crate::util::conn::STOP_GRACE, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            open = conns.len(),
            grace = ?crate::util::conn::STOP_GRACE,
            "API connections still open after the grace period closed"
        );
        conns.abort_all();
    }
}

/// Serves `methods` on a Unix listener until `shutdown` completes; then stops
/// accepting, lets open calls finish, and removes the socket file.
pub async fn serve_unix(
    listener: UnixListener,
    path: PathBuf,
    methods: Methods,
    shutdown: impl Future<Output = ()>,
) {
    serve_listener(listener, None, None, TcpLimits::default(), methods, shutdown).await;
    let _ = std::fs::remove_file(&path);
}

fn bearer_ok(req: &HttpRequest<hyper::body::Incoming>, token: &str) -> bool {
    let Some(v) = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some(given) = v.strip_prefix("Bearer ") else {
        return false;
    };
    // Constant-time in the token's length: no early exit on the first mismatch.
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Serves `methods` on TCP, refusing (HTTP 401) every request, WebSocket
/// upgrades included, that lacks `Authorization: Bearer <token>`.
pub async fn serve_tcp(
    listener: TcpListener,
    token: Arc<str>,
    methods: Methods,
    shutdown: impl Future<Output = ()>,
) {
    serve_tcp_with(listener, token, TcpLimits::default(), methods, shutdown).await;
}

/// [`serve_tcp`] with other bounds.
pub async fn serve_tcp_with(
    listener: TcpListener,
    token: Arc<str>,
    limits: TcpLimits,
    methods: Methods,
    shutdown: impl Future<Output = ()>,
) {
    serve_listener(listener, Some(token), None, limits, methods, shutdown).await;
}

/// [`serve_tcp_with`] over TLS when `tls` is given (plain TCP otherwise):
/// the handshake is bounded by `limits.handshake` and happens after the
/// connection took its slot, so the per-peer and total bounds hold for it.
pub async fn serve_tcp_tls(
    listener: TcpListener,
    token: Arc<str>,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    limits: TcpLimits,
    methods: Methods,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    serve_listener(listener, Some(token), acceptor, limits, methods, shutdown).await;
}

/// Wraps the API service: with a token, a request without it gets HTTP 401 and
/// never reaches the JSON-RPC layer; without one (the 0600 Unix socket), every
/// request passes.
#[derive(Clone)]
struct BearerAuth<S> {
    inner: S,
    token: Option<Arc<str>>,
    peer: String,
}

impl<S> Service<HttpRequest<hyper::body::Incoming>> for BearerAuth<S>
where
    S: Service<HttpRequest<hyper::body::Incoming>, Response = HttpResponse, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: HttpRequest<hyper::body::Incoming>) -> Self::Future {
        match &self.token {
            Some(token) if !bearer_ok(&req, token) => {
                REFUSED_TOKEN.warn(&self.peer, "API request without a valid bearer token refused");
                let mut resp = HttpResponse::new(HttpBody::from("talon: missing or wrong bearer token\n"));
                *resp.status_mut() = http::StatusCode::UNAUTHORIZED;
                // and the connection goes: a refused client keeps no descriptor
                resp.headers_mut()
                    .insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
                Box::pin(async move { Ok(resp) })
            }
            _ => Box::pin(self.inner.call(req)),
        }
    }
}
