//! talon's own NVMe/TCP host: one admin and one I/O queue to one
//! controller, each a TCP connection with a reader and a writer task, so
//! that several commands are in flight at once.
//!
//! ```text
//!   submit(sqe, data) ── a free command id, a queue slot (the depth) ──> writer task ──> socket
//!                                                                             ^ H2CData (R2T asked)
//!   socket ──> reader task: CapsuleResp  ─> the command's completion   ──────┘
//!                           C2HData      ─> into the command's buffer (SUCCESS: completed)
//!                           R2T          ─> H2CData PDUs of the write data, at most MAXH2CDATA each
//!                           C2HTermReq, EOF, a PDU it does not expect ─> the queue dead,
//!                                                every command failed with why
//! ```
//!
//! A command's id and slot are given back when its completion arrives, not
//! when its caller stops waiting: a caller dropped mid-command (cancelled)
//! never sees its id reused under a late answer. Dropping a queue aborts
//! its tasks and closes its connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;

use super::pdu::{self, Cqe, DataHeader, Header, Sqe};

/// How long a TCP connect and the connection setup may take.
const SETUP: Duration = Duration::from_secs(10);
/// The keep-alive timeout the admin queue asks for, and how often a Keep
/// Alive is sent (a third of it).
const KATO_MS: u32 = 30_000;
/// The admin queue's depth.
const ADMIN_DEPTH: u16 = 4;
/// The most bytes one command moves, whatever the controller allows.
const MAX_IO: u32 = 1 << 20;

/// A header and the data after it, for the writer task.
struct Frame {
    head: Vec<u8>,
    data: Bytes,
}

/// A failed exchange with the target, naming the queue (`<subnqn> admin
/// queue`, `<subnqn> I/O queue`). Clone: a queue that dies fails every
/// command in flight with the same error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WireError {
    /// The socket failed: connecting, reading, writing.
    #[error("{queue}: {step}")]
    Io {
        /// The queue.
        queue: String,
        /// What it was doing.
        step: String,
        /// The socket's error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The target sent what NVMe/TCP does not allow here, or ended the
    /// connection itself (C2HTermReq).
    #[error("{queue}: {what}")]
    Protocol {
        /// The queue.
        queue: String,
        /// What it sent.
        what: String,
    },
    /// A command completed with an error status.
    #[error("{queue}: {command}: {status}")]
    Status {
        /// The queue.
        queue: String,
        /// The command.
        command: String,
        /// NVMe's status type and code, named.
        status: String,
    },
    /// A read or write the namespace cannot take (not whole blocks, past its end).
    #[error("{queue}: {request}")]
    Request {
        /// The queue.
        queue: String,
        /// The request and why.
        request: String,
    },
    /// A setup step took longer than it may.
    #[error("{queue}: {step}: no answer in {after:?}")]
    Timeout {
        /// The queue.
        queue: String,
        /// The step.
        step: String,
        /// How long it waited.
        after: Duration,
    },
    /// The queue's connection is gone: its tasks ended.
    #[error("{queue}: connection closed")]
    Closed {
        /// The queue.
        queue: String,
    },
}

/// Why a queue's reader or writer stopped, before the queue's name is put on it.
enum Broke {
    Io(&'static str, std::io::Error),
    Protocol(String),
}

impl From<pdu::Malformed> for Broke {
    fn from(m: pdu::Malformed) -> Broke {
        Broke::Protocol(m.0)
    }
}

impl Broke {
    fn on(self, queue: &str) -> WireError {
        let queue = queue.to_owned();
        match self {
            Broke::Io(step, e) => WireError::Io {
                queue,
                step: step.to_owned(),
                source: Arc::new(e),
            },
            Broke::Protocol(what) => WireError::Protocol { queue, what },
        }
    }
}

type Done = Result<(Cqe, Vec<u8>), WireError>;

struct Pending {
    /// Where C2HData lands (empty for a command that reads nothing).
    buf: Vec<u8>,
    /// The data an R2T asks for.
    data: Bytes,
    tx: oneshot::Sender<Done>,
    _slot: OwnedSemaphorePermit,
}

#[derive(Default)]
struct State {
    pending: HashMap<u16, Pending>,
    free: Vec<u16>,
    dead: Option<WireError>,
}

struct Shared {
    state: Mutex<State>,
    slots: Arc<Semaphore>,
    what: String,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The queue is dead: every command fails with `why`, and every later one.
    fn kill(&self, why: Broke) {
        let mut st = self.state();
        let why = st.dead.get_or_insert_with(|| why.on(&self.what)).clone();
        for (_, p) in st.pending.drain() {
            let _ = p.tx.send(Err(why.clone()));
        }
        self.slots.close();
    }

    fn complete(&self, cqe: Cqe) -> Result<(), Broke> {
        let mut st = self.state();
        let p = st.pending.remove(&cqe.cid).ok_or_else(|| {
            Broke::Protocol(format!(
                "a completion of command {} that is not in flight",
                cqe.cid
            ))
        })?;
        st.free.push(cqe.cid);
        let _ = p.tx.send(Ok((cqe, p.buf)));
        Ok(())
    }
}

/// One queue: a TCP connection after ICReq/ICResp, its tasks, its slots.
struct Queue {
    shared: Arc<Shared>,
    frames: mpsc::UnboundedSender<Frame>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Queue {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Queue {
    /// Connects to `addr` and sets the connection up, for `depth` commands in flight.
    async fn open(addr: SocketAddr, what: String, depth: u16) -> Result<Queue, WireError> {
        let io = |step: String| {
            let queue = what.clone();
            move |e| WireError::Io {
                queue,
                step,
                source: Arc::new(e),
            }
        };
        let setup = async {
            let mut s = TcpStream::connect(addr)
                .await
                .map_err(io(format!("connecting to {addr}")))?;
            s.set_nodelay(true)
                .map_err(io(format!("setting TCP_NODELAY to {addr}")))?;
            s.write_all(&pdu::ic_req())
                .await
                .map_err(io(format!("sending ICReq to {addr}")))?;
            let mut ch = [0u8; pdu::CH_LEN];
            s.read_exact(&mut ch)
                .await
                .map_err(io(format!("reading ICResp from {addr}")))?;
            let h = Header::parse(&ch);
            if h.kind != pdu::IC_RESP || h.plen as usize != pdu::IC_LEN {
                return Err(WireError::Protocol {
                    queue: what.clone(),
                    what: format!(
                        "{addr} answered ICReq with PDU type {:#x} of {} bytes",
                        h.kind, h.plen
                    ),
                });
            }
            let mut rest = [0u8; pdu::IC_LEN - pdu::CH_LEN];
            s.read_exact(&mut rest)
                .await
                .map_err(io(format!("reading ICResp from {addr}")))?;
            let ic = pdu::ic_resp(&rest).map_err(|m| WireError::Protocol {
                queue: what.clone(),
                what: format!("{addr}: {m}"),
            })?;
            Ok((s, ic))
        };
        let (s, ic) = tokio::time::timeout(SETUP, setup)
            .await
            .map_err(|_| WireError::Timeout {
                queue: what.clone(),
                step: format!("ICReq to {addr}"),
                after: SETUP,
            })??;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                free: (0..depth).rev().collect(),
                ..State::default()
            }),
            slots: Arc::new(Semaphore::new(usize::from(depth))),
            what,
        });
        let (r, mut w) = s.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<Frame>();
        let sh = shared.clone();
        let writer = tokio::spawn(async move {
            while let Some(f) = rx.recv().await {
                let wrote = async {
                    w.write_all(&f.head).await?;
                    if !f.data.is_empty() {
                        w.write_all(&f.data).await?;
                    }
                    Ok::<_, std::io::Error>(())
                };
                if let Err(e) = wrote.await {
                    sh.kill(Broke::Io("writing", e));
                    return;
                }
            }
        });
        let (sh, frames) = (shared.clone(), tx.clone());
        let reader = tokio::spawn(async move {
            if let Err(e) = read_loop(r, &sh, &frames, ic.max_h2c_data).await {
                sh.kill(e);
            }
        });
        Ok(Queue {
            shared,
            frames: tx,
            tasks: vec![writer, reader],
        })
    }

    /// Sends `sqe` with `capsule` (in-capsule data) and waits for its
    /// completion and the `read` bytes it reads; `write` is the data an
    /// R2T asks for.
    async fn submit(&self, mut sqe: Sqe, capsule: Bytes, read: usize, write: Bytes) -> Done {
        let slot = self
            .shared
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| self.dead())?;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.shared.state();
            if let Some(d) = &st.dead {
                return Err(d.clone());
            }
            let cid = st.free.pop().ok_or_else(|| WireError::Request {
                queue: self.shared.what.clone(),
                request: "no free command id".to_owned(),
            })?;
            sqe.set_cid(cid);
            st.pending.insert(
                cid,
                Pending {
                    buf: vec![0; read],
                    data: write,
                    tx,
                    _slot: slot,
                },
            );
        }
        let len = u32::try_from(capsule.len()).map_err(|_| WireError::Request {
            queue: self.shared.what.clone(),
            request: format!("{} bytes of in-capsule data", capsule.len()),
        })?;
        let head = pdu::capsule_cmd(&sqe, len).to_vec();
        if self.frames.send(Frame { head, data: capsule }).is_err() {
            return Err(self.dead());
        }
        rx.await.map_err(|_| self.dead())?
    }

    /// [`Queue::submit`] of a command that must succeed.
    async fn command(&self, sqe: Sqe, capsule: Bytes, read: usize, write: Bytes, what: &str) -> Done {
        let (c, data) = self.submit(sqe, capsule, read, write).await?;
        if !c.ok() {
            return Err(WireError::Status {
                queue: self.shared.what.clone(),
                command: what.to_owned(),
                status: c.describe(),
            });
        }
        Ok((c, data))
    }

    fn dead(&self) -> WireError {
        self.shared
            .state()
            .dead
            .clone()
            .unwrap_or_else(|| WireError::Closed {
                queue: self.shared.what.clone(),
            })
    }
}

async fn read_loop(
    mut r: OwnedReadHalf,
    sh: &Shared,
    frames: &mpsc::UnboundedSender<Frame>,
    max_h2c: u32,
) -> Result<(), Broke> {
    let io = |e: std::io::Error| Broke::Io("reading", e);
    loop {
        let mut ch = [0u8; pdu::CH_LEN];
        r.read_exact(&mut ch).await.map_err(io)?;
        let h = Header::parse(&ch);
        match h.kind {
            pdu::CAPSULE_RESP => {
                if h.plen as usize != pdu::RESP_LEN {
                    return Err(Broke::Protocol(format!("a CapsuleResp of {} bytes", h.plen)));
                }
                let mut b = [0u8; 16];
                r.read_exact(&mut b).await.map_err(io)?;
                sh.complete(Cqe::parse(&b))?;
            }
            pdu::C2H_DATA => {
                let d = data_header(&mut r, &h).await?;
                let pad = usize::from(h.pdo).saturating_sub(pdu::DATA_LEN);
                if u64::from(h.plen) != u64::from(h.pdo) + u64::from(d.len) || h.pdo == 0 && d.len > 0 {
                    return Err(Broke::Protocol(format!(
                        "a C2HData of {} bytes with offset {} and {} data",
                        h.plen, h.pdo, d.len
                    )));
                }
                let mut skip = vec![0u8; pad];
                r.read_exact(&mut skip).await.map_err(io)?;
                let mut buf = {
                    let mut st = sh.state();
                    let p = st.pending.get_mut(&d.cid).ok_or_else(|| {
                        Broke::Protocol(format!("C2HData for command {} that is not in flight", d.cid))
                    })?;
                    std::mem::take(&mut p.buf)
                };
                let (at, end) = (d.offset as usize, d.offset as usize + d.len as usize);
                if end > buf.len() {
                    return Err(Broke::Protocol(format!(
                        "C2HData of command {} at {at}..{end}, beyond its {} bytes",
                        d.cid,
                        buf.len()
                    )));
                }
                r.read_exact(&mut buf[at..end]).await.map_err(io)?;
                if let Some(p) = sh.state().pending.get_mut(&d.cid) {
                    p.buf = buf;
                }
                if h.flags & pdu::FLAG_SUCCESS != 0 {
                    sh.complete(Cqe::success(d.cid))?;
                }
            }
            pdu::R2T => {
                let d = data_header(&mut r, &h).await?;
                let data = sh
                    .state()
                    .pending
                    .get(&d.cid)
                    .map(|p| p.data.clone())
                    .ok_or_else(|| {
                        Broke::Protocol(format!("R2T for command {} that is not in flight", d.cid))
                    })?;
                let (mut at, end) = (d.offset as usize, d.offset as usize + d.len as usize);
                if end > data.len() || d.len == 0 {
                    return Err(Broke::Protocol(format!(
                        "R2T of command {} for {at}..{end} of its {} bytes",
                        d.cid,
                        data.len()
                    )));
                }
                while at < end {
                    let n = (end - at).min(max_h2c as usize);
                    let head = pdu::h2c_data(d.cid, d.ttag, at as u32, n as u32, at + n == end).to_vec();
                    frames
                        .send(Frame {
                            head,
                            data: data.slice(at..at + n),
                        })
                        .map_err(|_| Broke::Protocol("the writer stopped".to_owned()))?;
                    at += n;
                }
            }
            pdu::C2H_TERM_REQ => {
                let mut rest = vec![0u8; (h.plen as usize).saturating_sub(pdu::CH_LEN).min(1 << 16)];
                let _ = r.read_exact(&mut rest).await;
                let fes = rest.get(..2).map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
                return Err(Broke::Protocol(format!(
                    "the target ended the connection (C2HTermReq, error {fes:#x})"
                )));
            }
            other => return Err(Broke::Protocol(format!("an unexpected PDU of type {other:#x}"))),
        }
    }
}

async fn data_header(r: &mut OwnedReadHalf, h: &Header) -> Result<DataHeader, Broke> {
    if usize::from(h.hlen) != pdu::DATA_LEN {
        return Err(Broke::Protocol(format!(
            "a PDU of type {:#x} with a {}-byte header",
            h.kind, h.hlen
        )));
    }
    let mut b = [0u8; pdu::DATA_LEN - pdu::CH_LEN];
    r.read_exact(&mut b).await.map_err(|e| Broke::Io("reading", e))?;
    Ok(DataHeader::parse(&b))
}

/// One controller of one subsystem: its admin queue (kept alive), one I/O
/// queue, and namespace 1's geometry.
pub struct Controller {
    admin: Arc<Queue>,
    io: Queue,
    /// Namespace 1's size in blocks.
    pub blocks: u64,
    /// Its block size.
    pub block_size: u32,
    /// The most bytes one command moves.
    pub max_io: u32,
    /// The most write data sent in the capsule (larger writes wait for R2T).
    in_capsule: u32,
    keep_alive: JoinHandle<()>,
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.keep_alive.abort();
    }
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("what", &self.io.shared.what)
            .field("blocks", &self.blocks)
            .field("block_size", &self.block_size)
            .finish_non_exhaustive()
    }
}

impl Controller {
    /// Connects to subsystem `subnqn` at `addr` as host `hostnqn`, enables
    /// the controller, reads namespace 1, and opens an I/O queue of `depth`
    /// commands in flight (at most what the controller allows).
    pub async fn connect(
        addr: SocketAddr,
        subnqn: &str,
        hostnqn: &str,
        hostid: &uuid::Uuid,
        depth: u16,
    ) -> Result<Controller, WireError> {
        let admin_queue = format!("{subnqn} admin queue");
        let admin = Queue::open(addr, admin_queue.clone(), ADMIN_DEPTH).await?;
        let none = Bytes::new;
        let data = Bytes::from(pdu::connect_data(hostid, 0xffff, subnqn, hostnqn));
        let (c, _) = admin
            .command(pdu::connect(0, 31, KATO_MS), data, 0, none(), "connect")
            .await?;
        let cntlid = (c.dw0 & 0xffff) as u16;
        let (cap, _) = admin
            .command(
                pdu::property_get(pdu::REG_CAP, true),
                none(),
                0,
                none(),
                "reading CAP",
            )
            .await?;
        let mqes = (cap.dw0 & 0xffff) as u16;
        admin
            .command(
                pdu::property_set(pdu::REG_CC, pdu::CC_ENABLE),
                none(),
                0,
                none(),
                "enabling",
            )
            .await?;
        let ready = async {
            loop {
                let (c, _) = admin
                    .command(
                        pdu::property_get(pdu::REG_CSTS, false),
                        none(),
                        0,
                        none(),
                        "reading CSTS",
                    )
                    .await?;
                if c.dw0 & 2 != 0 {
                    return Err(WireError::Status {
                        queue: admin_queue.clone(),
                        command: "reading CSTS".to_owned(),
                        status: "the controller reports a fatal status (CSTS.CFS)".to_owned(),
                    });
                }
                if c.dw0 & 1 != 0 {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(SETUP, ready)
            .await
            .map_err(|_| WireError::Timeout {
                queue: admin_queue.clone(),
                step: "waiting for CSTS.RDY".to_owned(),
                after: SETUP,
            })??;
        let (_, id) = admin
            .command(pdu::identify(1, 0), none(), 4096, none(), "identify controller")
            .await?;
        let (mdts, ioccsz) = pdu::identify_controller(&id);
        let (_, ns) = admin
            .command(pdu::identify(0, 1), none(), 4096, none(), "identify namespace 1")
            .await?;
        let (blocks, block_size) = pdu::identify_namespace(&ns).map_err(|m| WireError::Protocol {
            queue: admin_queue.clone(),
            what: format!("identify namespace 1: {m}"),
        })?;
        if blocks == 0 {
            return Err(WireError::Protocol {
                queue: admin_queue,
                what: "namespace 1 is not there (size 0)".to_owned(),
            });
        }
        let max_io = match mdts {
            0 => MAX_IO,
            m if m >= 12 => MAX_IO,
            m => (4096u32 << m).min(MAX_IO),
        };
        let depth = depth.clamp(1, mqes.max(1));
        let io = Queue::open(addr, format!("{subnqn} I/O queue"), depth).await?;
        let data = Bytes::from(pdu::connect_data(hostid, cntlid, subnqn, hostnqn));
        io.command(pdu::connect(1, depth, 0), data, 0, none(), "connect")
            .await?;
        let admin = Arc::new(admin);
        let a = Arc::downgrade(&admin);
        let keep_alive = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(u64::from(KATO_MS / 3))).await;
                let Some(a) = a.upgrade() else { return };
                let sent = Sqe::new(pdu::OPC_KEEP_ALIVE);
                if let Err(e) = a.command(sent, Bytes::new(), 0, Bytes::new(), "keep alive").await {
                    tracing::warn!(error = %crate::util::error_chain(&e), "mover: keep alive failed");
                    return;
                }
            }
        });
        Ok(Controller {
            admin,
            io,
            blocks,
            block_size,
            max_io: max_io.max(block_size),
            in_capsule: (ioccsz * 16).saturating_sub(64),
            keep_alive,
        })
    }

    /// The namespace's size in bytes.
    pub fn size(&self) -> u64 {
        self.blocks * u64::from(self.block_size)
    }

    fn check(&self, offset: u64, len: usize) -> Result<(u64, u32), WireError> {
        let bs = u64::from(self.block_size);
        let len64 = len as u64;
        if len == 0
            || !offset.is_multiple_of(bs)
            || !len64.is_multiple_of(bs)
            || len64 > u64::from(self.max_io)
        {
            return Err(WireError::Request {
                queue: self.io.shared.what.clone(),
                request: format!(
                    "{len} bytes at {offset}: not whole {bs}-byte blocks of at most {} bytes",
                    self.max_io
                ),
            });
        }
        if offset + len64 > self.size() {
            return Err(WireError::Request {
                queue: self.io.shared.what.clone(),
                request: format!("{len} bytes at {offset}: beyond its {} bytes", self.size()),
            });
        }
        Ok((offset / bs, (len64 / bs) as u32))
    }

    /// Reads `len` bytes at byte `offset` (whole blocks, at most `max_io`).
    pub async fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, WireError> {
        let (lba, n) = self.check(offset, len)?;
        let mut sqe = pdu::rw(pdu::OPC_READ, lba, n);
        sqe.host_data(len as u32);
        let what = format!("reading {len} bytes at {offset}");
        let (_, data) = self
            .io
            .command(sqe, Bytes::new(), len, Bytes::new(), &what)
            .await?;
        Ok(data)
    }

    /// Writes `data` at byte `offset` (whole blocks, at most `max_io`).
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), WireError> {
        let (lba, n) = self.check(offset, data.len())?;
        let mut sqe = pdu::rw(pdu::OPC_WRITE, lba, n);
        let len = data.len() as u32;
        let what = format!("writing {len} bytes at {offset}");
        if len <= self.in_capsule {
            sqe.in_capsule(len);
            self.io.command(sqe, data, 0, Bytes::new(), &what).await?;
        } else {
            sqe.host_data(len);
            self.io.command(sqe, Bytes::new(), 0, data, &what).await?;
        }
        Ok(())
    }

    /// Whether the admin queue still answers (it is kept alive meanwhile).
    pub fn alive(&self) -> bool {
        self.admin.shared.state().dead.is_none() && self.io.shared.state().dead.is_none()
    }
}
