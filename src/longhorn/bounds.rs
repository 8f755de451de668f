//! Bounds of the five gRPC ports: Longhorn's instance-manager protocol has
//! no authentication, so whoever reaches the ports must not be able to take
//! the node's descriptors or memory.
//!
//! ```text
//!   TcpListener x5 ──accept──> ConnCounter (shared by the five ports: in all, per peer)
//!        │ over a bound: closed at once, one warning per 10 s
//!        v
//!   Bounded<TcpStream> (idle timer; HTTP/2 pings every 30 s keep a live one moving)
//!        v
//!   HTTP/2: at most `max_streams` streams per connection
//!        v
//!   each request's message must arrive within `message` (MessageTimeout), else DEADLINE_EXCEEDED
//! ```

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::util::conn::{Bounded, Closer, ConnCounter, RateLimitedLog};

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Bounds of the five gRPC ports together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcLimits {
    /// Open connections to the five ports in all.
    pub max_connections: usize,
    /// Open connections from one peer address.
    pub max_per_peer: usize,
    /// A connection that moves no byte either way for this long is closed
    /// (a live client answers the HTTP/2 pings sent every `ping`).
    pub idle: Duration,
    /// HTTP/2 keep-alive ping interval; a peer that does not answer in 20 s
    /// is gone.
    pub ping: Duration,
    /// Streams (calls) open at once on one connection.
    pub max_streams: u32,
    /// A request's message must arrive within this time after its headers.
    pub message: Duration,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_per_peer: 256,
            idle: Duration::from_secs(120),
            ping: Duration::from_secs(30),
            max_streams: 32,
            message: Duration::from_secs(20),
        }
    }
}

impl GrpcLimits {
    /// These limits with the connection bounds lowered, if need be, so that
    /// `descriptors` (what the process may still open for network clients)
    /// hold them; the admin socket, SPDK's socket and the store keep theirs.
    pub fn within(mut self, descriptors: u64) -> Self {
        let fit = usize::try_from(descriptors).unwrap_or(usize::MAX).max(16);
        if self.max_connections > fit {
            tracing::warn!(
                wanted = self.max_connections,
                allowed = fit,
                "the descriptor limit (ulimit -n) holds fewer Longhorn gRPC connections than wanted; raise it in the pod spec or the service unit"
            );
            self.max_connections = fit;
        }
        self.max_per_peer = self.max_per_peer.min(self.max_connections);
        self
    }
}

/// The warnings of one server's accept loops (its ports share them), each
/// at most one line per 10 s.
#[derive(Debug, Default)]
pub struct AcceptLogs {
    refused: RateLimitedLog,
    failed: RateLimitedLog,
}

/// The accepted connections of one port, counted in `counter`: a connection
/// over a bound is closed at once (logged in `logs`); an accept error
/// (EMFILE) pauses 50 ms instead of spinning; `closer` closes them all at a stop.
pub fn incoming(
    listener: tokio::net::TcpListener,
    counter: ConnCounter,
    limits: GrpcLimits,
    logs: std::sync::Arc<AcceptLogs>,
    closer: Closer,
) -> impl futures::Stream<Item = Result<Bounded<tokio::net::TcpStream>, std::io::Error>> + Send + 'static {
    futures::stream::unfold(
        (listener, counter, limits, logs, closer),
        |(listener, counter, limits, logs, closer)| async move {
            loop {
                match listener.accept().await {
                    Ok((s, peer)) => {
                        match counter.take(peer.ip(), limits.max_connections, limits.max_per_peer) {
                            Ok(slot) => {
                                let _ = s.set_nodelay(true);
                                let conn = Bounded::new(s, limits.idle, Some(slot)).closed_by(&closer);
                                return Some((Ok(conn), (listener, counter, limits, logs, closer)));
                            }
                            Err(why) => {
                                logs.refused.warn(
                                    &peer.ip().to_string(),
                                    &format!("Longhorn gRPC connection refused: {why}"),
                                );
                            }
                        }
                    }
                    Err(e) => {
                        logs.failed
                            .warn("-", &format!("Longhorn gRPC accept failed: {e}"));
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        },
    )
}

/// An accepted, counted gRPC connection: tonic learns its addresses from
/// the socket inside.
impl tonic::transport::server::Connected for Bounded<tokio::net::TcpStream> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.get_ref().connect_info()
    }
}

/// A request body that fails with DEADLINE_EXCEEDED when no frame comes for
/// `within` before its end: a stream whose message never comes is ended
/// instead of held (with its buffers) for good.
#[derive(Debug)]
pub struct MessageTimeout<B> {
    inner: B,
    within: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl<B> MessageTimeout<B> {
    /// `inner`, bounded.
    pub fn new(inner: B, within: Duration) -> Self {
        Self {
            inner,
            within,
            sleep: Box::pin(tokio::time::sleep(within)),
        }
    }
}

impl<B> Body for MessageTimeout<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(f) => {
                let at = tokio::time::Instant::now() + this.within;
                this.sleep.as_mut().reset(at);
                Poll::Ready(f.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(tonic::Status::deadline_exceeded(
                    format!("no request message within {:?} of its headers", this.within),
                ))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test(start_paused = true)]
    async fn a_message_that_never_comes_ends_the_body_with_deadline_exceeded() {
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes, BoxError>::new(1);
        let mut b = MessageTimeout::new(body, Duration::from_secs(20));
        tx.send_data(Bytes::from_static(b"x")).await.expect("send");
        let f = b.frame().await.expect("a frame").expect("data");
        assert_eq!(f.into_data().expect("data"), Bytes::from_static(b"x"));
        let e = b.frame().await.expect("an end").expect_err("timed out");
        let s = e.downcast::<tonic::Status>().expect("a status");
        assert_eq!(s.code(), tonic::Code::DeadlineExceeded);
        drop(tx);
    }

    #[test]
    fn the_connection_bounds_fit_the_descriptors() {
        let l = GrpcLimits::default().within(100);
        assert_eq!((l.max_connections, l.max_per_peer), (100, 100));
        let l = GrpcLimits::default().within(1 << 20);
        assert_eq!(l, GrpcLimits::default());
    }
}
