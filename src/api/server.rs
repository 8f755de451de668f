//! Serving the API: a Unix socket (mode 0600) and an optional TCP listener that
//! refuses every request without the bearer token.
//!
//! ```text
//!   bind_unix(path) ──> UnixListener ─┐
//!   TcpListener + token ──────────────┼─> accept loop ──> jsonrpsee TowerService per connection
//!   shutdown future ──────────────────┘      (graceful: in-flight calls finish; socket removed)
//! ```

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

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
        .build()
}

/// A listener the API can serve on.
trait ApiListener: Send + 'static {
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static;
    /// The next connection, and who is on the other end (for logs).
    fn accept_conn(&self) -> impl Future<Output = std::io::Result<(Self::Stream, String)>> + Send;
}

impl ApiListener for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_conn(&self) -> std::io::Result<(Self::Stream, String)> {
        let (s, _) = self.accept().await?;
        Ok((s, "unix socket".to_string()))
    }
}

impl ApiListener for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_conn(&self) -> std::io::Result<(Self::Stream, String)> {
        let (s, peer) = self.accept().await?;
        Ok((s, peer.to_string()))
    }
}

/// The accept loop shared by every listener: one jsonrpsee service per
/// connection, behind the bearer-token guard when `token` is set; on shutdown,
/// stop accepting and let open calls finish.
async fn serve_listener(
    listener: impl ApiListener,
    token: Option<Arc<str>>,
    methods: Methods,
    shutdown: impl Future<Output = ()>,
) {
    let (stop_handle, server_handle) = stop_channel();
    let builder = jsonrpsee::server::Server::builder()
        .set_config(config())
        .to_service_builder();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            conn = listener.accept_conn() => match conn {
                Ok((stream, peer)) => {
                    let inner = builder.clone().build(methods.clone(), stop_handle.clone());
                    let svc = BearerAuth { inner, token: token.clone(), peer };
                    let stopped = stop_handle.clone().shutdown();
                    tokio::spawn(async move {
                        if let Err(e) = serve_with_graceful_shutdown(stream, svc, stopped).await {
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
    serve_listener(listener, None, methods, shutdown).await;
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
    serve_listener(listener, Some(token), methods, shutdown).await;
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
                tracing::warn!(peer = %self.peer, "API request without a valid bearer token refused");
                let mut resp = HttpResponse::new(HttpBody::from("talon: missing or wrong bearer token\n"));
                *resp.status_mut() = http::StatusCode::UNAUTHORIZED;
                Box::pin(async move { Ok(resp) })
            }
            _ => Box::pin(self.inner.call(req)),
        }
    }
}
