//! Bounds for the network listeners (the admin API's TCP port and Longhorn's
//! five gRPC ports): connections counted in all and per peer address, a
//! socket that moves no byte for a while closed, refusals logged at most once
//! per 10 s, and the descriptor limit raised so the bounds, not the kernel,
//! say no first.
//!
//! ```text
//!   accept ──> ConnCounter::take(peer) ──refused──> closed at once (RateLimitedLog)
//!                   │ ConnSlot
//!                   v
//!              Bounded<TcpStream> (owns the slot; idle timer) ──> HTTP / gRPC / WebSocket
//! ```
//!
//! The socket owns its slot, so a connection is counted for as long as its
//! descriptor is open, also after an HTTP upgrade hands it to a WebSocket task.
//!
//! A graceful stop gives open connections [`STOP_GRACE`] to finish their
//! calls, then closes them: a peer that never completes a request (or keeps
//! a connection open and silent) does not hold the daemon's exit for the
//! idle bound.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How long a graceful stop waits for open connections to finish their
/// calls before it closes them.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// Logs a warning at most once per 10 s, with how many were not logged.
#[derive(Debug)]
pub struct RateLimitedLog {
    last: Mutex<Option<Instant>>,
    suppressed: AtomicU64,
}

impl RateLimitedLog {
    /// A log that has said nothing yet.
    pub const fn new() -> Self {
        Self {
            last: Mutex::new(None),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Logs `what` about `peer`, unless a line went out in the last 10 s.
    pub fn warn(&self, peer: &str, what: &str) {
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

impl Default for RateLimitedLog {
    fn default() -> Self {
        Self::new()
    }
}

/// Why a connection was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("too many connections ({0} open)")]
    Total(usize),
    #[error("too many connections from this peer ({0} open)")]
    PerPeer(usize),
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// Open connections, in all and per peer address, shared by every listener
/// that counts against the same bounds.
#[derive(Debug, Clone, Default)]
pub struct ConnCounter(Arc<Mutex<Counts>>);

impl ConnCounter {
    /// A slot for a connection from `peer`, or why not.
    pub fn take(&self, peer: IpAddr, max_total: usize, max_per_peer: usize) -> Result<ConnSlot, Refused> {
        let mut c = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if c.total >= max_total {
            return Err(Refused::Total(c.total));
        }
        let n = c.per_peer.entry(peer).or_insert(0);
        if *n >= max_per_peer {
            return Err(Refused::PerPeer(*n));
        }
        *n += 1;
        c.total += 1;
        Ok(ConnSlot {
            counter: self.clone(),
            peer,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

/// A counted connection; uncounted when dropped.
#[derive(Debug)]
pub struct ConnSlot {
    counter: ConnCounter,
    peer: IpAddr,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut c = self.counter.0.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_peer.remove(&self.peer);
            }
        }
    }
}

/// Closes the connections it was given to, all at once, when a stop's grace
/// is over: their reads and writes fail, so the task serving each one ends
/// and lets go of what it holds (the daemon's state store among it). A
/// server's own abort does not do that where the server spawned one task per
/// connection (tonic does).
#[derive(Debug, Clone)]
pub struct Closer(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Closer {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(false)))
    }
}

impl Closer {
    /// Closes every connection given to this closer, and every later one.
    pub fn close(&self) {
        self.0.send_replace(true);
    }

    fn closed(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut rx = self.0.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|closed| *closed).await;
        })
    }
}

/// A socket that holds its [`ConnSlot`] and fails with `TimedOut` once it has
/// read and written nothing for `idle`, and with `ConnectionAborted` once
/// its [`Closer`] (if any) closed it.
pub struct Bounded<S> {
    inner: S,
    idle: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    closed: Closing,
    _slot: Option<ConnSlot>,
}

/// Whether a [`Bounded`] socket is closed by a [`Closer`].
enum Closing {
    Never,
    On(Pin<Box<dyn Future<Output = ()> + Send>>),
    Closed,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Bounded<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bounded")
            .field("inner", &self.inner)
            .field("idle", &self.idle)
            .field("closable", &!matches!(self.closed, Closing::Never))
            .finish_non_exhaustive()
    }
}

impl<S> Bounded<S> {
    /// `inner`, closed after `idle` without a byte either way; counted
    /// through `slot` until it is dropped.
    pub fn new(inner: S, idle: Duration, slot: Option<ConnSlot>) -> Self {
        Self {
            inner,
            idle,
            sleep: Box::pin(tokio::time::sleep(idle)),
            closed: Closing::Never,
            _slot: slot,
        }
    }

    /// This socket, also closed when `closer` closes.
    pub fn closed_by(mut self, closer: &Closer) -> Self {
        self.closed = Closing::On(closer.closed());
        self
    }

    /// `ConnectionAborted` once the closer closed this socket.
    fn check_closed(&mut self, cx: &mut Context<'_>) -> Result<(), std::io::Error> {
        let aborted = || {
            std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "closed: the server stopped",
            )
        };
        match &mut self.closed {
            Closing::Never => Ok(()),
            Closing::Closed => Err(aborted()),
            Closing::On(c) => match c.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.closed = Closing::Closed;
                    Err(aborted())
                }
                Poll::Pending => Ok(()),
            },
        }
    }

    /// The wrapped socket.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn active(&mut self) {
        let at = tokio::time::Instant::now() + self.idle;
        self.sleep.as_mut().reset(at);
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Bounded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.check_closed(cx)?;
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
                    "idle connection",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Bounded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.check_closed(cx)?;
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.active();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.check_closed(cx)?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The descriptor limit after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft limit of open descriptors to the hard limit (what a
/// server that holds many sockets does; the default soft limit of 1024 is
/// for select()-era programs) and returns the limits now in force.
pub fn raise_nofile() -> std::io::Result<Nofile> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(std::io::Error::from)?;
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    Ok(Nofile { soft, hard })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_count_in_all_and_per_peer_and_go_back_when_dropped() {
        let c = ConnCounter::default();
        let a: IpAddr = IpAddr::from([10, 0, 0, 1]);
        let b: IpAddr = IpAddr::from([10, 0, 0, 2]);
        let a1 = c.take(a, 3, 2).expect("a1");
        let _a2 = c.take(a, 3, 2).expect("a2");
        assert_eq!(c.take(a, 3, 2).expect_err("a third from a"), Refused::PerPeer(2));
        let _b1 = c.take(b, 3, 2).expect("b1");
        assert_eq!(c.take(b, 3, 2).expect_err("a fourth in all"), Refused::Total(3));
        drop(a1);
        assert_eq!(c.open(), 2);
        c.take(b, 3, 2).expect("room again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_socket_times_out_and_a_busy_one_does_not() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, mut peer) = tokio::io::duplex(64);
        let mut s = Bounded::new(a, Duration::from_secs(5), None);
        let mut buf = [0u8; 4];
        let talk = async {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                peer.write_all(b"x").await.expect("write");
            }
            peer
        };
        let (read, _peer) = tokio::join!(
            async {
                for _ in 0..3 {
                    s.read_exact(&mut buf[..1])
                        .await
                        .expect("a byte every 4 s keeps it open");
                }
                s.read(&mut buf).await
            },
            talk
        );
        assert_eq!(read.expect_err("timed out").kind(), std::io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn a_closer_ends_a_waiting_read_and_refuses_writes_after() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let closer = Closer::default();
        let (a, _peer) = tokio::io::duplex(64);
        let (b, _peer_b) = tokio::io::duplex(64);
        let mut s = Bounded::new(a, Duration::from_secs(120), None).closed_by(&closer);
        let mut open = Bounded::new(b, Duration::from_secs(120), None);
        let mut buf = [0u8; 4];
        let reading = tokio::spawn(async move {
            let r = s.read(&mut buf).await;
            (r.map_err(|e| e.kind()), s)
        });
        tokio::task::yield_now().await;
        closer.close();
        let (read, mut s) = reading.await.expect("join");
        assert_eq!(read, Err(std::io::ErrorKind::ConnectionAborted));
        let w = s.write(b"late").await.expect_err("closed");
        assert_eq!(w.kind(), std::io::ErrorKind::ConnectionAborted);
        // a socket made later by the same closer is closed from the start
        let (c, _peer_c) = tokio::io::duplex(64);
        let mut later = Bounded::new(c, Duration::from_secs(120), None).closed_by(&closer);
        assert!(later.write(b"x").await.is_err());
        // a socket without the closer is not touched
        assert_eq!(open.write(b"open").await.expect("open"), 4);
    }
}
