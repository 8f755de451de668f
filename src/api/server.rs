//! Serving the API: a Unix socket (mode 0600) and an optional TCP listener that
//! refuses every request without the bearer token.
//!
//! ```text
//!   bind_unix(path) ──> UnixListener ─┐
//!   TcpListener + token ──────────────┼─> accept loop ──> jsonrpsee TowerService per connection
//!   shutdown future ──────────────────┘      (graceful: in-flight calls finish; socket removed)
//! ```
//!
//! The TCP listener is bounded ([`TcpLimits`]): connections in total and per
//! peer address (over the bound a connection is closed at once), a connection
//! that moves no byte either way for `idle` is closed (half-sent requests,
//! half WebSocket frames, idle clients; WebSocket clients answer the server's
//! pings), and a refused request is answered 401 and closed. The Unix socket
//! has its own accept loop and descriptors are kept free for it, so it stays
//! reachable whatever TCP clients do. Refusals are logged at most once per
//! 10 s, with the count. With TLS ([`serve_tcp_tls`]), a connection first
//! takes its slot, then has `handshake` to finish the TLS handshake (a client
//! without a certificate the client CA signed, or one speaking plain HTTP, is
//! closed there); the idle bound applies beneath TLS too.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jsonrpsee::Methods;
use jsonrpsee::server::{
    HttpBody, HttpRequest, HttpResponse, ServerConfig, serve_with_graceful_shutdown, stop_channel,
};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::net::{TcpListener, UnixListener};

use tower::Service;

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

fn config() -> ServerConfig {
    ServerConfig::builder()
        .max_connections(256)
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

/// Logs a warning at most once per 10 s, with how many were not logged.
struct RateLimitedLog {
    last: Mutex<Option<Instant>>,
    suppressed: AtomicU64,
}

impl RateLimitedLog {
    const fn new() -> Self {
        Self {
            last: Mutex::new(None),
            suppressed: AtomicU64::new(0),
        }
    }

    fn warn(&self, peer: &str, what: &str) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(10)) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *last = Some(Instant::now());
        let more = self.suppressed.swap(0, Ordering::Relaxed);
        tracing::warn!(%peer, suppressed = more, "{what} (at most one such line per 10 s)");
    }
}

static REFUSED_TOKEN: RateLimitedLog = RateLimitedLog::new();
static REFUSED_CONN: RateLimitedLog = RateLimitedLog::new();
static REFUSED_TLS: RateLimitedLog = RateLimitedLog::new();

/// Open TCP connections, in all and per peer address.
#[derive(Default)]
struct ConnCount {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// A counted connection; uncounted when dropped.
struct ConnSlot {
    counts: Arc<Mutex<ConnCount>>,
    peer: IpAddr,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total -= 1;
        if let Some(n) = c.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                c.per_peer.remove(&self.peer);
            }
        }
    }
}

impl ConnSlot {
    /// A slot for a connection from `peer`, or why not.
    fn take(counts: &Arc<Mutex<ConnCount>>, peer: IpAddr, limits: &TcpLimits) -> Result<Self, &'static str> {
        let mut c = counts.lock().unwrap_or_else(|p| p.into_inner());
        if c.total >= limits.max_connections {
            return Err("API connection refused: too many TCP connections");
        }
        let n = c.per_peer.entry(peer).or_insert(0);
        if *n >= limits.max_per_peer {
            return Err("API connection refused: too many TCP connections from this peer");
        }
        *n += 1;
        c.total += 1;
        Ok(Self {
            counts: counts.clone(),
            peer,
        })
    }
}

/// A stream that fails with `TimedOut` once it has read and written nothing
/// for `idle`.
struct IdleTimeout<S> {
    inner: S,
    idle: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl<S> IdleTimeout<S> {
    fn new(inner: S, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            sleep: Box::pin(tokio::time::sleep(idle)),
        }
    }

    fn active(&mut self) {
        let at = tokio::time::Instant::now() + self.idle;
        self.sleep.as_mut().reset(at);
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for IdleTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.active();
                }
                Poll::Ready(r)
            }
            Poll::Pending => match self.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "idle API connection",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for IdleTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.active();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

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
    let builder = jsonrpsee::server::Server::builder()
        .set_config(config())
        .to_service_builder();
    let counts: Arc<Mutex<ConnCount>> = Arc::default();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            conn = listener.accept_conn() => match conn {
                Ok((stream, peer)) => {
                    let (slot, peer_name) = match peer {
                        None => (None, "unix socket".to_string()),
                        Some(ip) => match ConnSlot::take(&counts, ip, &limits) {
                            Ok(s) => (Some(s), ip.to_string()),
                            Err(why) => {
                                REFUSED_CONN.warn(&ip.to_string(), why);
                                drop(stream);
                                continue;
                            }
                        },
                    };
                    let inner = builder.clone().build(methods.clone(), stop_handle.clone());
                    let svc = BearerAuth { inner, token: token.clone(), peer: peer_name };
                    let stopped = stop_handle.clone().shutdown();
                    let (idle, handshake) = (limits.idle, limits.handshake);
                    let tls = tls.clone();
                    tokio::spawn(async move {
                        let _slot = slot;
                        let r = match (peer, tls) {
                            (None, _) => serve_with_graceful_shutdown(stream, svc, stopped).await,
                            (Some(_), None) => {
                                serve_with_graceful_shutdown(IdleTimeout::new(stream, idle), svc, stopped).await
                            }
                            (Some(ip), Some(acceptor)) => {
                                let accept = acceptor.accept(IdleTimeout::new(stream, idle));
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
