//! The SPDK JSON-RPC client: one Unix-socket connection, many calls in flight.
//!
//! ```text
//!  call(method, params) ──┐ id = next_id             reader task
//!  call(method, params) ──┼─> pending[id] = oneshot   ┌──────────────────────────┐
//!  call(method, params) ──┘  write {"id":..} ───────> │ spdk_tgt  (answers in    │
//!                                                     │ order, compact JSON+\n)  │
//!        oneshot <── route by "id" <── StreamDeserializer over a byte buffer <──┘
//! ```
//!
//! - Requests are written whole under a write lock, so they never interleave;
//!   any number of them wait for answers at the same time (pipelining is
//!   where SPDK's throughput comes from: a round trip costs ~8 ms because the
//!   RPC poller runs every 4 ms).
//! - Replies are parsed as a stream of JSON values (SPDK needs no delimiter)
//!   and routed by `id`, although SPDK answers in order.
//! - A malformed reply, a reply cut short by EOF, or a closed connection fails
//!   every call in flight on that connection with an error; the connection is
//!   then dead and the next call opens a new one (so a restarted target is
//!   picked up). A call whose request could not be written to a dead
//!   connection is retried once on a fresh one; a call already sent is never
//!   resent (SPDK calls are not all idempotent).
//! - Each call has a timeout, long for the methods that do heavy work
//!   ([`Timeouts::for_method`]).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::error::{ErrorKind, SpdkError};

/// A reply larger than this is treated as malformed (a runaway peer).
const MAX_REPLY_BYTES: usize = 256 << 20;

/// Errors of the SPDK client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be connected.
    #[error("Connecting to the SPDK RPC socket {path} failed")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The connect error.
        #[source]
        source: io::Error,
    },
    /// The request could not be written, even on a fresh connection.
    #[error("Sending {method} to the SPDK RPC socket {path} failed")]
    Send {
        /// The method.
        method: String,
        /// The socket path.
        path: PathBuf,
        /// The write error.
        #[source]
        source: io::Error,
    },
    /// SPDK answered with an error.
    #[error(transparent)]
    Rpc(#[from] SpdkError),
    /// No answer within the call's timeout.
    #[error("SPDK {method} got no answer within {timeout:?}")]
    Timeout {
        /// The method.
        method: String,
        /// The timeout that passed.
        timeout: Duration,
    },
    /// The connection closed (or broke) before the answer came.
    #[error("The SPDK connection closed before {method} was answered: {reason}")]
    ConnectionLost {
        /// The method.
        method: String,
        /// Why the connection ended.
        reason: String,
    },
    /// The target sent bytes that are not a JSON-RPC reply.
    #[error("SPDK sent a malformed reply while {method} was in flight: {detail}")]
    MalformedReply {
        /// The method.
        method: String,
        /// What was wrong.
        detail: String,
    },
    /// The parameters did not serialize.
    #[error("Encoding the parameters of {method} failed")]
    EncodeParams {
        /// The method.
        method: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// The result did not decode into talon's type.
    #[error("The result of {method} did not decode")]
    DecodeResult {
        /// The method.
        method: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

impl ClientError {
    /// The kind of the SPDK error, or `None` for transport and decoding errors.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            ClientError::Rpc(e) => Some(e.kind),
            _ => None,
        }
    }

    /// Whether SPDK answered with an error of this kind.
    pub fn is(&self, kind: ErrorKind) -> bool {
        self.kind() == Some(kind)
    }

    /// Whether the call may not have reached the target or its outcome is
    /// unknown (connection trouble or timeout), as opposed to a definite answer.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::Send { .. }
                | ClientError::Timeout { .. }
                | ClientError::ConnectionLost { .. }
                | ClientError::MalformedReply { .. }
        )
    }
}

/// Per-call timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// For ordinary calls.
    pub default: Duration,
    /// For calls that do heavy work: lvstore creation (unmaps the whole
    /// device), controller attach (connects over the network, retries),
    /// shallow copy, examine, an aio bdev's creation (answered once the
    /// lvstore on it is loaded: after a kill -9, a replay of every metadata
    /// page, 7 s for a 3.7 GiB disk on a busy 2-core machine, 33 s under
    /// Longhorn's manager at 50 volumes; spdk_tgt v26.05).
    pub long: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            default: Duration::from_secs(30),
            long: Duration::from_secs(600),
        }
    }
}

impl Timeouts {
    /// The methods that get the long timeout.
    pub const LONG_METHODS: &'static [&'static str] = &[
        "bdev_aio_create",
        "bdev_lvol_create_lvstore",
        "bdev_lvol_delete_lvstore",
        "bdev_nvme_attach_controller",
        "bdev_lvol_start_shallow_copy",
        "bdev_lvol_decouple_parent",
        "bdev_wait_for_examine",
        "framework_wait_init",
    ];

    /// The timeout for one method.
    pub fn for_method(&self, method: &str) -> Duration {
        if Self::LONG_METHODS.contains(&method) {
            self.long
        } else {
            self.default
        }
    }
}

/// How one call ended, as the reader task reports it.
type Reply = Result<Value, Failure>;

#[derive(Debug)]
enum Failure {
    Rpc { code: i64, message: String },
    Lost(String),
    Malformed(String),
}

#[derive(Debug, Default)]
struct Pending {
    waiters: HashMap<u64, oneshot::Sender<Reply>>,
    /// Set once the connection is finished; no call may register after.
    dead: Option<String>,
}

impl Pending {
    fn fail_all(&mut self, failure: impl Fn() -> Failure, reason: String) {
        self.dead.get_or_insert(reason);
        for (_, tx) in self.waiters.drain() {
            let _ = tx.send(Err(failure()));
        }
    }
}

#[derive(Debug)]
struct Conn {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Arc<Mutex<Pending>>,
    reader: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Conn {
    fn is_dead(&self) -> bool {
        lock(&self.pending).dead.is_some()
    }

    fn register(&self, id: u64) -> Option<oneshot::Receiver<Reply>> {
        let mut p = lock(&self.pending);
        if p.dead.is_some() {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        p.waiters.insert(id, tx);
        Some(rx)
    }

    fn unregister(&self, id: u64) {
        lock(&self.pending).waiters.remove(&id);
    }

    fn kill(&self, reason: String) {
        let reason2 = reason.clone();
        lock(&self.pending).fail_all(move || Failure::Lost(reason2.clone()), reason);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another task panicked mid-update of a map of
    // senders; the map is still consistent enough to fail or route replies.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A run of talon as its SPDK clients carry it: the data mover's exports
/// are named with it, so a sweep removes only what another run (before a
/// crash or restart) left. One per daemon, made where the daemon is built
/// and given to each of its clients ([`SpdkClient::of_run`]); a client made
/// alone ([`SpdkClient::new`]) is a run of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunId(Arc<str>);

impl RunId {
    /// A new run: 12 random hex digits.
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string()[..12].into())
    }

    /// Its text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

/// The SPDK JSON-RPC client. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct SpdkClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    timeouts: Timeouts,
    next_id: AtomicU64,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    connects: AtomicU64,
    /// Calls completed that may have changed the target (every method but a listing), counted
    /// with every client that shares the count ([`SpdkClient::of_run`]).
    changes: Arc<AtomicU64>,
    run: RunId,
}

impl SpdkClient {
    /// A client for the socket at `path`; it connects on the first call.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self::with_timeouts(path, Timeouts::default())
    }

    /// A client with explicit timeouts.
    pub fn with_timeouts(path: impl Into<PathBuf>, timeouts: Timeouts) -> Self {
        Self::made(path.into(), timeouts, RunId::new(), Arc::default())
    }

    /// A client of run `run` (the daemon's), counting its changes in `changes` (`None`: a count
    /// of its own) with the other clients of the same target that share it: a listing read
    /// through one is then not taken for current after another changed the target.
    pub fn of_run(path: impl Into<PathBuf>, run: &RunId, changes: Option<&Arc<AtomicU64>>) -> Self {
        let changes = changes.map_or_else(Arc::default, Arc::clone);
        Self::made(path.into(), Timeouts::default(), run.clone(), changes)
    }

    fn made(path: PathBuf, timeouts: Timeouts, run: RunId, changes: Arc<AtomicU64>) -> Self {
        SpdkClient {
            inner: Arc::new(Inner {
                path,
                timeouts,
                next_id: AtomicU64::new(1),
                conn: tokio::sync::Mutex::new(None),
                connects: AtomicU64::new(0),
                changes,
                run,
            }),
        }
    }

    /// The run this client is of.
    pub fn run_id(&self) -> &RunId {
        &self.inner.run
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.inner.path
    }

    /// The timeouts in use.
    pub fn timeouts(&self) -> Timeouts {
        self.inner.timeouts
    }

    /// How many connections this client has opened (1 + reconnects).
    pub fn connects(&self) -> u64 {
        self.inner.connects.load(Ordering::Relaxed)
    }

    /// A count that moves whenever the target may have changed through this client (or its
    /// clones, or the clients made with its count: [`Self::of_run`]): a call other than a
    /// listing completed, or a connection was opened (a new connection may be a new target).
    /// A listing made while it was `n` is still what the target holds, as far as these
    /// clients know, while it is `n`. A connection moves the shared count, not one of its
    /// own: clients whose own connections were counted apart could see a change of one as
    /// the other's connect, and take a listing from before it.
    pub fn changes(&self) -> u64 {
        self.inner.changes.load(Ordering::Acquire)
    }

    /// Which count [`Self::changes`] reads: equal for the clients made with one count (and
    /// their clones), so a listing made through one is compared with the count it was made
    /// under.
    pub fn count_id(&self) -> usize {
        Arc::as_ptr(&self.inner.changes) as usize
    }

    /// Connects now (calls connect lazily otherwise).
    pub async fn connect(&self) -> Result<(), ClientError> {
        self.connection(false).await.map(|_| ())
    }

    /// Calls `method` with typed params and decodes the typed result, with
    /// the method's default timeout.
    pub async fn call<P, R>(&self, method: &str, params: Option<&P>) -> Result<R, ClientError>
    where
        P: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        self.call_with_timeout(method, params, self.inner.timeouts.for_method(method))
            .await
    }

    /// Like [`SpdkClient::call`] with an explicit timeout.
    pub async fn call_with_timeout<P, R>(
        &self,
        method: &str,
        params: Option<&P>,
        timeout: Duration,
    ) -> Result<R, ClientError>
    where
        P: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        let params = match params {
            Some(p) => Some(
                serde_json::to_value(p).map_err(|source| ClientError::EncodeParams {
                    method: method.to_owned(),
                    source,
                })?,
            ),
            None => None,
        };
        let value = self.call_value(method, params, timeout).await?;
        serde_json::from_value(value).map_err(|source| ClientError::DecodeResult {
            method: method.to_owned(),
            source,
        })
    }

    /// The untyped call: `params` is sent as is (omitted when `None`).
    pub async fn call_value(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, ClientError> {
        let r = self.exchange(method, params, timeout).await;
        // counted when it ended (failed or timed out too: it may have changed something), so a
        // listing made while it ran is not taken for what the target holds after it
        if !is_listing(method) {
            self.inner.changes.fetch_add(1, Ordering::AcqRel);
        }
        r
    }

    /// One request and its reply ([`Self::call_value`]).
    async fn exchange(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, ClientError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let mut req = serde_json::Map::new();
        req.insert("jsonrpc".into(), Value::from("2.0"));
        req.insert("method".into(), Value::from(method));
        req.insert("id".into(), Value::from(id));
        if let Some(p) = params {
            req.insert("params".into(), p);
        }
        let bytes = serde_json::to_vec(&Value::Object(req)).map_err(|source| ClientError::EncodeParams {
            method: method.to_owned(),
            source,
        })?;

        let mut attempt = 0;
        let (conn, rx) = loop {
            let conn = self.connection(attempt > 0).await?;
            let Some(rx) = conn.register(id) else {
                attempt += 1;
                if attempt > 1 {
                    return Err(ClientError::ConnectionLost {
                        method: method.to_owned(),
                        reason: "the fresh connection died at once".into(),
                    });
                }
                continue;
            };
            let written = {
                let mut w = conn.writer.lock().await;
                w.write_all(&bytes).await
            };
            match written {
                Ok(()) => break (conn, rx),
                Err(source) => {
                    conn.unregister(id);
                    conn.kill(format!("write failed: {source}"));
                    attempt += 1;
                    if attempt > 1 {
                        return Err(ClientError::Send {
                            method: method.to_owned(),
                            path: self.inner.path.clone(),
                            source,
                        });
                    }
                }
            }
        };

        let reply = match tokio::time::timeout(timeout, rx).await {
            Err(_) => {
                conn.unregister(id);
                return Err(ClientError::Timeout {
                    method: method.to_owned(),
                    timeout,
                });
            }
            Ok(Err(_)) => Err(Failure::Lost("the reader stopped".into())),
            Ok(Ok(reply)) => reply,
        };
        reply.map_err(|f| match f {
            Failure::Rpc { code, message } => ClientError::Rpc(SpdkError::new(method, code, message)),
            Failure::Lost(reason) => ClientError::ConnectionLost {
                method: method.to_owned(),
                reason,
            },
            Failure::Malformed(detail) => ClientError::MalformedReply {
                method: method.to_owned(),
                detail,
            },
        })
    }

    /// The live connection, opening a new one if there is none or it is dead
    /// (or `fresh` asks for one because the current one just failed).
    async fn connection(&self, fresh: bool) -> Result<Arc<Conn>, ClientError> {
        let mut slot = self.inner.conn.lock().await;
        if let Some(c) = slot.as_ref()
            && !c.is_dead()
            && !fresh
        {
            return Ok(c.clone());
        }
        if let Some(old) = slot.take() {
            old.kill("replaced by a new connection".into());
        }
        let stream = UnixStream::connect(&self.inner.path)
            .await
            .map_err(|source| ClientError::Connect {
                path: self.inner.path.clone(),
                source,
            })?;
        self.inner.connects.fetch_add(1, Ordering::Relaxed);
        self.inner.changes.fetch_add(1, Ordering::AcqRel);
        let (r, w) = stream.into_split();
        let pending = Arc::new(Mutex::new(Pending::default()));
        let reader = tokio::spawn(read_replies(r, pending.clone()));
        let conn = Arc::new(Conn {
            writer: tokio::sync::Mutex::new(w),
            pending,
            reader,
        });
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Closes the connection; calls in flight fail, the next call reconnects.
    pub async fn disconnect(&self) {
        if let Some(c) = self.inner.conn.lock().await.take() {
            c.kill("disconnected by the client".into());
        }
    }
}

/// Reads replies until the connection ends, routing each to its waiter.
async fn read_replies(mut r: OwnedReadHalf, pending: Arc<Mutex<Pending>>) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    // Re-parse an incomplete value only when a newline arrived (SPDK ends
    // every reply with one) or the buffer doubled, so a large reply read in
    // many chunks costs linear time.
    let mut retry_at = 0usize;
    loop {
        let before = buf.len();
        let n = match r.read_buf(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                lock(&pending).fail_all(|| Failure::Lost(format!("read failed: {e}")), e.to_string());
                return;
            }
        };
        if n == 0 {
            let rest = &buf[..];
            let mut p = lock(&pending);
            if rest.iter().any(|b| !b.is_ascii_whitespace()) {
                let detail = format!(
                    "the connection closed in the middle of a reply ({} bytes)",
                    rest.len()
                );
                let d2 = detail.clone();
                p.fail_all(move || Failure::Malformed(d2.clone()), detail);
            } else {
                p.fail_all(
                    || Failure::Lost("the target closed the connection".into()),
                    "eof".into(),
                );
            }
            return;
        }
        if !buf[before..].contains(&b'\n') && buf.len() < retry_at {
            continue;
        }
        let mut consumed = 0;
        let mut stream = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
        let mut bad = None;
        loop {
            match stream.next() {
                Some(Ok(v)) => {
                    consumed = stream.byte_offset();
                    dispatch(&pending, v);
                }
                Some(Err(e)) if e.is_eof() => break,
                Some(Err(e)) => {
                    bad = Some(format!("invalid JSON: {e}"));
                    break;
                }
                None => {
                    consumed = buf.len();
                    break;
                }
            }
        }
        if let Some(detail) = bad {
            let d2 = detail.clone();
            lock(&pending).fail_all(move || Failure::Malformed(d2.clone()), detail);
            return;
        }
        buf.drain(..consumed);
        if buf.len() > MAX_REPLY_BYTES {
            let detail = format!("a reply exceeded {MAX_REPLY_BYTES} bytes");
            let d2 = detail.clone();
            lock(&pending).fail_all(move || Failure::Malformed(d2.clone()), detail);
            return;
        }
        retry_at = buf.len().saturating_mul(2);
    }
}

fn dispatch(pending: &Mutex<Pending>, v: Value) {
    match v {
        Value::Array(items) => {
            for item in items {
                dispatch(pending, item);
            }
        }
        Value::Object(mut obj) => {
            let mut p = lock(pending);
            let id = obj.get("id").and_then(Value::as_u64);
            let error = obj.remove("error");
            let reply = match (error, obj.remove("result")) {
                (Some(e), _) => Err(Failure::Rpc {
                    code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
                    message: e.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
                }),
                (None, Some(result)) => Ok(result),
                (None, None) => Err(Failure::Malformed("a reply with neither result nor error".into())),
            };
            let tx = match id {
                Some(id) => p.waiters.remove(&id),
                // An error the target could not tie to a request ("id": null).
                // SPDK answers in order, so it belongs to the oldest call.
                None if reply.is_err() => {
                    let oldest = p.waiters.keys().min().copied();
                    oldest.and_then(|id| p.waiters.remove(&id))
                }
                None => None,
            };
            match tx {
                Some(tx) => {
                    let _ = tx.send(reply);
                }
                None => tracing::debug!(?id, "SPDK reply for no waiting call (timed out?)"),
            }
        }
        other => tracing::warn!(reply = %other, "SPDK sent a reply that is not an object"),
    }
}

/// Whether `method` only lists (SPDK's `*_get_*` methods): it changes nothing on the target.
fn is_listing(method: &str) -> bool {
    method.contains("_get_") || method.starts_with("get_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt;

    /// Listings change nothing; every other method may (an unknown one too).
    #[test]
    fn only_listings_leave_the_change_count() {
        for m in [
            "bdev_get_bdevs",
            "nvmf_get_subsystems",
            "bdev_lvol_get_lvols",
            "bdev_raid_get_bdevs",
        ] {
            assert!(is_listing(m), "{m}");
        }
        for m in [
            "bdev_lvol_snapshot",
            "nvmf_subsystem_add_ns",
            "bdev_raid_create",
            "framework_start_init",
        ] {
            assert!(!is_listing(m), "{m}");
        }
    }
    use tokio::net::UnixListener;

    /// A scripted peer: for each request it reads, writes the bytes the
    /// script computes (then closes if asked; None: close at once).
    async fn scripted(
        path: &Path,
        script: impl Fn(u64, &Value) -> Option<(Vec<u8>, bool)> + Send + 'static,
    ) -> JoinHandle<()> {
        let l = UnixListener::bind(path).expect("bind");
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let (r, mut w) = s.into_split();
                let mut lines = tokio::io::BufReader::new(r);
                let mut line = String::new();
                loop {
                    line.clear();
                    // The client writes compact JSON without newlines; read
                    // one value by scanning for the closing brace.
                    let mut bytes = Vec::new();
                    if lines.read_until(b'}', &mut bytes).await.unwrap_or(0) == 0 {
                        break;
                    }
                    while serde_json::from_slice::<Value>(&bytes).is_err() {
                        if lines.read_until(b'}', &mut bytes).await.unwrap_or(0) == 0 {
                            return;
                        }
                    }
                    let v: Value = serde_json::from_slice(&bytes).expect("json");
                    let id = v["id"].as_u64().expect("id");
                    match script(id, &v) {
                        Some((out, close)) => {
                            if w.write_all(&out).await.is_err() || close {
                                break;
                            }
                        }
                        None => break,
                    }
                }
            }
        })
    }

    /// Clients made with one count share it from the start, their clones
    /// too: a change through one moves the count every other one reads.
    #[tokio::test]
    async fn clients_of_one_count_see_each_others_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("s.sock");
        let _srv = scripted(&sock, |id, _| {
            Some((
                format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":true}}\n").into_bytes(),
                false,
            ))
        })
        .await;
        let (run, count) = (RunId::new(), Arc::new(AtomicU64::new(0)));
        let a = SpdkClient::of_run(&sock, &run, Some(&count));
        let b = SpdkClient::of_run(&sock, &run, Some(&count)).clone();
        let alone = SpdkClient::of_run(&sock, &run, None);
        assert_eq!(b.run_id(), alone.run_id());
        assert_ne!(
            SpdkClient::new(&sock).run_id(),
            &run,
            "a client made alone is a run of its own"
        );
        // (the scripted peer serves one connection at a time: only a connects)
        let before = b.changes();
        a.clone()
            .call::<Value, bool>("bdev_lvol_snapshot", None)
            .await
            .expect("call");
        assert!(b.changes() > before, "b sees a's change");
        assert_eq!(alone.changes(), 0, "a client of its own count does not");
    }

    #[tokio::test]
    async fn routes_out_of_order_replies_by_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("s.sock");
        // Hold every reply until two requests arrived, then answer in reverse.
        let held = Arc::new(Mutex::new(Vec::<u64>::new()));
        let h2 = held.clone();
        let _srv = scripted(&sock, move |id, _| {
            let mut h = lock(&h2);
            h.push(id);
            if h.len() < 2 {
                return Some((Vec::new(), false));
            }
            let mut out = Vec::new();
            for id in h.iter().rev() {
                out.extend_from_slice(
                    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{id}}}\n").as_bytes(),
                );
            }
            h.clear();
            Some((out, false))
        })
        .await;
        let c = SpdkClient::new(&sock);
        let (a, b) = tokio::join!(c.call::<Value, u64>("a", None), c.call::<Value, u64>("b", None));
        let (a, b) = (a.expect("a"), b.expect("b"));
        assert_ne!(a, b);
        assert_eq!(c.connects(), 1);
    }

    #[tokio::test]
    async fn reply_split_in_many_writes_and_many_in_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("s.sock");
        let _srv = scripted(&sock, |id, _| {
            // A pretty-printed reply with no trailing newline.
            Some((
                format!("{{\n \"jsonrpc\": \"2.0\",\n \"id\": {id},\n \"result\": [1, 2]\n}}").into_bytes(),
                false,
            ))
        })
        .await;
        let c = SpdkClient::new(&sock);
        let r: Vec<u32> = c.call::<Value, _>("m", None).await.expect("call");
        assert_eq!(r, vec![1, 2]);
    }

    #[tokio::test]
    async fn malformed_reply_fails_the_call_and_reconnects_next_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("s.sock");
        let _srv = scripted(&sock, |id, v| {
            if v["method"] == "bad" {
                Some((b"{\"jsonrpc\":\"2.0\",,}\n".to_vec(), false))
            } else if v["method"] == "cut" {
                Some((format!("{{\"jsonrpc\":\"2.0\",\"id\":{id}").into_bytes(), true))
            } else {
                Some((
                    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":true}}\n").into_bytes(),
                    false,
                ))
            }
        })
        .await;
        let c = SpdkClient::new(&sock);
        let e = c.call::<Value, Value>("bad", None).await.expect_err("malformed");
        assert!(matches!(e, ClientError::MalformedReply { .. }), "{e}");
        let e = c.call::<Value, Value>("cut", None).await.expect_err("truncated");
        assert!(matches!(e, ClientError::MalformedReply { .. }), "{e}");
        let ok: bool = c.call::<Value, _>("good", None).await.expect("reconnected");
        assert!(ok);
        assert_eq!(c.connects(), 3);
    }

    #[tokio::test]
    async fn closed_connection_fails_in_flight_call() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("s.sock");
        let _srv = scripted(&sock, |_, _| None).await;
        let c = SpdkClient::new(&sock);
        let e = c.call::<Value, Value>("x", None).await.expect_err("closed");
        assert!(matches!(e, ClientError::ConnectionLost { .. }), "{e}");
    }

    #[tokio::test]
    async fn timeout_leaves_connection_usable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("s.sock");
        let _srv = scripted(&sock, |id, v| {
            if v["method"] == "slow" {
                Some((Vec::new(), false))
            } else {
                Some((
                    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":1}}\n").into_bytes(),
                    false,
                ))
            }
        })
        .await;
        let c = SpdkClient::new(&sock);
        let e = c
            .call_with_timeout::<Value, Value>("slow", None, Duration::from_millis(50))
            .await
            .expect_err("timeout");
        assert!(matches!(e, ClientError::Timeout { .. }));
        let v: u32 = c.call::<Value, _>("fast", None).await.expect("fast");
        assert_eq!(v, 1);
        assert_eq!(c.connects(), 1);
    }

    #[test]
    fn long_timeouts_for_heavy_methods() {
        let t = Timeouts::default();
        assert_eq!(t.for_method("bdev_lvol_create_lvstore"), t.long);
        assert_eq!(t.for_method("bdev_nvme_attach_controller"), t.long);
        // answered once the lvstore on it has loaded (a replay after a kill -9)
        assert_eq!(t.for_method("bdev_aio_create"), t.long);
        assert_eq!(t.for_method("bdev_get_bdevs"), t.default);
    }
}
