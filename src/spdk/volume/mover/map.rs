//! Which clusters of a snapshot's chain hold data, found without reading
//! the volume: SPDK v26.05 has no allocation map RPC (Longhorn's fork adds
//! one), but its shallow copy writes exactly the clusters an lvol holds of
//! its own into a bdev. talon serves that bdev itself: a minimal NVMe/TCP
//! target on 127.0.0.1 that takes the writes, records where they landed
//! and drops the data. spdk_tgt attaches it as an NVMe bdev, shallow-copies
//! each lvol of the chain into it and detaches it.
//!
//! ```text
//!   MapTarget::start(size, block)  127.0.0.1:<ephemeral>, one namespace, nothing stored
//!   bdev_nvme_attach_controller   talon-map-<uuid> -> bdev talon-map-<uuid>n1
//!   per lvol of the chain: bdev_lvol_start_shallow_copy(lvol, n1), polled to its end
//!     spdk_tgt ── Write(lba, n) ──> the target records [lba, lba+n), answers success
//!   bdev_nvme_detach_controller   (on every path: a failure, a cancel)
//!   the ranges written: where the chain holds data (a cluster's whole range)
//! ```
//!
//! The target answers what SPDK's NVMe host asks while it attaches (the
//! Fabrics Connect and properties, Identify, features, logs) and serves
//! reads as zeros (an examine reads a bdev's first blocks). Written data
//! reaches it in the capsule (IOCCSZ is set so every write up to MDTS fits)
//! or through R2T and H2CData; both are taken.
//!
//! What the copy sends crosses loopback once (the data a backup then reads
//! again), so a backup's reads grow with the data the chain holds, not with
//! the volume's size.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::pdu::{
    self, CAPSULE_CMD, CAPSULE_RESP, CH_LEN, DATA_LEN, FLAG_LAST, H2C_DATA, Header, IC_LEN, IC_REQ, IC_RESP,
    u16_at, u32_at,
};
use crate::spdk::client::{ClientError, SpdkClient};
use crate::spdk::rpc::AttachController;
use crate::spdk::volume::Inventory;

/// The most data one command moves (MDTS 5: 2^5 pages of 4 KiB).
const MDTS: u8 = 5;
const MAX_IO: usize = 4096 << MDTS;
/// Entries per queue the target offers (CAP.MQES, 0's based: 128).
const MQES: u16 = 127;

/// The byte ranges written into a [`MapTarget`], merged (start -> end).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    /// Adds `[start, end)`, merged with what it touches.
    pub fn add(&mut self, start: u64, end: u64) {
        if end <= start {
            return;
        }
        let (mut s, mut e) = (start, end);
        // the range before that reaches it, and every one it reaches
        if let Some((&ps, &pe)) = self.0.range(..=s).next_back()
            && pe >= s
        {
            s = ps;
            e = e.max(pe);
        }
        let touched: Vec<u64> = self.0.range(s..=e).map(|(&k, _)| k).collect();
        for k in touched {
            if let Some(v) = self.0.remove(&k) {
                e = e.max(v);
            }
        }
        self.0.insert(s, e);
    }

    /// Whether any byte of `[start, end)` was written.
    pub fn touches(&self, start: u64, end: u64) -> bool {
        self.0.range(..end).next_back().is_some_and(|(_, &e)| e > start)
    }

    /// The bytes written.
    pub fn bytes(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }

    /// The ranges, ascending.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().map(|(&s, &e)| (s, e))
    }
}

/// Why the map of a chain could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// The target could not listen.
    #[error("the map target could not listen on 127.0.0.1: {0}")]
    Listen(#[source] std::io::Error),
    /// spdk_tgt refused a call.
    #[error("{what}: {source}")]
    Spdk {
        /// The call and its object.
        what: String,
        /// SPDK's answer.
        #[source]
        source: ClientError,
    },
    /// A shallow copy failed, in SPDK's words.
    #[error("shallow copy of {lvol} into the map target failed: {reason}")]
    Copy {
        /// The lvol.
        lvol: String,
        /// Why.
        reason: String,
    },
}

struct Shared {
    nqn: String,
    blocks: u64,
    block: u32,
    written: Mutex<Ranges>,
}

/// A minimal NVMe/TCP target that records where it was written (module
/// notes). It stops when dropped.
pub struct MapTarget {
    port: u16,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MapTarget {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for MapTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapTarget")
            .field("port", &self.port)
            .field("nqn", &self.shared.nqn)
            .finish_non_exhaustive()
    }
}

impl MapTarget {
    /// Listens on 127.0.0.1 (an ephemeral port) with one namespace of
    /// `size` bytes in blocks of `block` bytes, under NQN `nqn`.
    pub async fn start(nqn: String, size: u64, block: u32) -> Result<MapTarget, MapError> {
        let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .map_err(MapError::Listen)?;
        let port = l.local_addr().map_err(MapError::Listen)?.port();
        let shared = Arc::new(Shared {
            nqn,
            blocks: size.div_ceil(u64::from(block)),
            block,
            written: Mutex::default(),
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    a = l.accept() => match a {
                        Ok((stream, _)) => {
                            let _ = stream.set_nodelay(true);
                            let s = s.clone();
                            conns.spawn(async move {
                                if let Err(e) = serve(stream, &s).await {
                                    tracing::debug!(error = %e, "map target connection ended");
                                }
                            });
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "map target accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    },
                    Some(_) = conns.join_next() => {}
                }
            }
        });
        Ok(MapTarget { port, shared, task })
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its NQN.
    pub fn nqn(&self) -> &str {
        &self.shared.nqn
    }

    /// The byte ranges written so far.
    pub fn written(&self) -> Ranges {
        self.shared
            .written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The ranges of `lvols` (snapshot lvols of one lvstore, `lvs/name`; `size`
/// bytes each at most, blocks of `block`) that hold clusters of their own,
/// in one map: a target of talon's attached to spdk_tgt, each lvol
/// shallow-copied into it in turn. The controller is detached on every
/// path; what a crash leaves is named `talon-map-<run>-` ([`sweep`]).
pub async fn allocated(
    client: &SpdkClient,
    lvols: &[String],
    size: u64,
    block: u32,
) -> Result<Ranges, MapError> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let run = client.run_id().as_str();
    let name = format!("{PREFIX}{run}-{}", &id[..12]);
    let nqn = format!("{}:map:{run}:{id}", crate::names::NQN_PREFIX);
    let target = MapTarget::start(nqn.clone(), size, block).await?;
    let attach = AttachController::tcp(name.clone(), Ipv4Addr::LOCALHOST.into(), target.port(), nqn);
    client
        .bdev_nvme_attach_controller(&attach)
        .await
        .map_err(|source| MapError::Spdk {
            what: format!("attaching the map target {name}"),
            source,
        })?;
    let copied = copy_all(client, lvols, &format!("{name}n1")).await;
    let detached = super::super::lvol::detach_controller(client, &name)
        .await
        .map_err(|source| MapError::Spdk {
            what: format!("detaching the map target {name}"),
            source,
        });
    copied?;
    detached?;
    Ok(target.written())
}

/// Whether the own clusters of `chain`'s lvols (`lvs/name`, the oldest
/// first) are all that reads as data in its last one: its bottom is an lvol
/// of its own, not a clone of another lvol or of an external snapshot
/// (whose data no shallow copy of the chain names), and every lvol is listed.
pub fn names_all_data(inv: &Inventory, chain: &[String]) -> bool {
    let listed = chain.iter().all(|l| inv.lvols.contains_key(l));
    let bottom = chain.first().and_then(|l| inv.lvols.get(l));
    listed && bottom.is_some_and(|b| !b.is_esnap_clone && !b.is_clone)
}

/// The bytes `lvols` hold of their own, as SPDK counts their clusters: what
/// a map of them moves over loopback.
pub fn held(inv: &Inventory, lvols: &[String]) -> u64 {
    lvols.iter().filter_map(|l| inv.held_bytes(l)).sum()
}

/// The prefix of the NVMe controllers [`allocated`] attaches.
pub const PREFIX: &str = "talon-map-";

async fn copy_all(client: &SpdkClient, lvols: &[String], dst: &str) -> Result<(), MapError> {
    use super::super::thin::EachError;
    super::super::thin::copy_each(client, lvols, dst, Duration::from_millis(10))
        .await
        .map_err(|e| match e {
            EachError::Start { lvol, source } => MapError::Spdk {
                what: format!("shallow copy of {lvol} into {dst}"),
                source,
            },
            EachError::State { lvol, source, .. } => MapError::Spdk {
                what: format!("state of the shallow copy of {lvol}"),
                source,
            },
            EachError::Failed { lvol, message } => MapError::Copy {
                lvol,
                reason: message,
            },
        })
}

/// Detaches the map controllers another run than `client`'s left (a talon
/// killed mid-map: the controller reconnects to a target that is gone);
/// answers their names.
pub async fn sweep(client: &SpdkClient, controllers: &[String]) -> Vec<String> {
    let mine = format!("{PREFIX}{}-", client.run_id().as_str());
    let mut gone = Vec::new();
    for c in controllers
        .iter()
        .filter(|c| c.starts_with(PREFIX) && !c.starts_with(&mine))
    {
        match super::super::lvol::detach_controller(client, c).await {
            Ok(()) => {
                tracing::info!(controller = %c, "detached an allocation map controller an earlier run left");
                gone.push(c.clone());
            }
            Err(e) => tracing::warn!(controller = %c, error = %crate::util::error_chain(&e),
                "detaching an allocation map controller"),
        }
    }
    gone
}

/// One queue's state on a connection.
struct Queue {
    qid: u16,
    sqsize: u16,
    sqhd: u16,
    cc: u32,
}

/// A write waiting for its data through R2T.
struct Pending {
    lba: u64,
    len: u32,
    got: u32,
}

/// Serves one connection (one queue) until the host closes it.
async fn serve(mut s: TcpStream, t: &Shared) -> std::io::Result<()> {
    let mut ch = [0u8; CH_LEN];
    s.read_exact(&mut ch).await?;
    let h = Header::parse(&ch);
    if h.kind != IC_REQ || h.plen as usize != IC_LEN {
        return Err(bad(format!("expected an ICReq, got PDU type {:#x}", h.kind)));
    }
    let mut rest = [0u8; IC_LEN - CH_LEN];
    s.read_exact(&mut rest).await?;
    s.write_all(&ic_resp()).await?;
    let mut q = Queue {
        qid: 0,
        sqsize: MQES,
        sqhd: 0,
        cc: 0,
    };
    let mut pending: BTreeMap<u16, Pending> = BTreeMap::new();
    loop {
        let mut ch = [0u8; CH_LEN];
        match s.read_exact(&mut ch).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let h = Header::parse(&ch);
        let len = (h.plen as usize)
            .checked_sub(CH_LEN)
            .filter(|l| *l <= MAX_IO + 4096)
            .ok_or_else(|| bad(format!("PDU of {} bytes", h.plen)))?;
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).await?;
        match h.kind {
            CAPSULE_CMD => {
                if body.len() < 64 {
                    return Err(bad("a CapsuleCmd without its SQE".into()));
                }
                let mut sqe = [0u8; 64];
                sqe.copy_from_slice(&body[..64]);
                let data = if h.pdo > 0 {
                    body.get(usize::from(h.pdo) - CH_LEN..).unwrap_or_default()
                } else {
                    &[]
                };
                command(&mut s, t, &mut q, &mut pending, &sqe, data).await?;
            }
            H2C_DATA => {
                if body.len() < DATA_LEN - CH_LEN {
                    return Err(bad("a short H2CData".into()));
                }
                let mut dh = [0u8; DATA_LEN - CH_LEN];
                dh.copy_from_slice(&body[..DATA_LEN - CH_LEN]);
                let d = pdu::DataHeader::parse(&dh);
                let Some(p) = pending.get_mut(&d.cid) else {
                    return Err(bad(format!("H2CData for command {} not waiting", d.cid)));
                };
                p.got += d.len;
                if p.got >= p.len {
                    let p = pending.remove(&d.cid).expect("there");
                    record(t, p.lba, p.len);
                    respond(&mut s, &mut q, d.cid, 0, 0).await?;
                }
            }
            other => return Err(bad(format!("unexpected PDU type {other:#x}"))),
        }
    }
}

fn bad(m: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, m)
}

fn record(t: &Shared, lba: u64, len: u32) {
    let b = u64::from(t.block);
    t.written
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .add(lba * b, lba * b + u64::from(len));
}

fn ic_resp() -> [u8; IC_LEN] {
    let mut b = [0u8; IC_LEN];
    b[0] = IC_RESP;
    b[2] = IC_LEN as u8;
    b[4..8].copy_from_slice(&(IC_LEN as u32).to_le_bytes());
    // PFV 0, CPDA 0, no digests, MAXH2CDATA
    b[12..16].copy_from_slice(&(MAX_IO as u32).to_le_bytes());
    b
}

/// Status: invalid command opcode.
const INVALID_OPCODE: u16 = 0x01;
/// Status: invalid field in command.
const INVALID_FIELD: u16 = 0x02;

async fn command(
    s: &mut TcpStream,
    t: &Shared,
    q: &mut Queue,
    pending: &mut BTreeMap<u16, Pending>,
    sqe: &[u8; 64],
    data: &[u8],
) -> std::io::Result<()> {
    let (opc, cid) = (sqe[0], u16_at(sqe, 2));
    let cdw = |n: usize| u32_at(sqe, n * 4);
    let sgl_len = u32_at(sqe, 32);
    if opc == pdu::OPC_FABRICS {
        return fabrics(s, t, q, sqe, data).await;
    }
    if q.qid == 0 {
        return match opc {
            pdu::OPC_IDENTIFY => {
                let d = identify(t, cdw(10) & 0xff, u32_at(sqe, 4));
                match d {
                    Some(d) => send_data(s, q, cid, &d, sgl_len).await,
                    None => respond(s, q, cid, 0, INVALID_FIELD).await,
                }
            }
            // Get Log Page: zeros of the length asked
            0x02 => {
                let dwords = ((cdw(10) >> 16) & 0xffff) | ((cdw(11) & 0xffff) << 16);
                let len = ((dwords as usize) + 1) * 4;
                send_data(s, q, cid, &vec![0u8; len.min(MAX_IO)], sgl_len).await
            }
            // Set Features: the number of queues as asked (up to 16); others taken
            0x09 => {
                let dw0 = if cdw(10) & 0xff == 0x07 {
                    let (sq, cq) = ((cdw(11) & 0xffff).min(15), (cdw(11) >> 16).min(15));
                    (cq << 16) | sq
                } else {
                    0
                };
                respond(s, q, cid, dw0, 0).await
            }
            // Get Features, Keep Alive, Abort (nothing aborted)
            0x0a | pdu::OPC_KEEP_ALIVE => respond(s, q, cid, 0, 0).await,
            0x08 => respond(s, q, cid, 1, 0).await,
            // Asynchronous Event Request: held, no event ever comes
            0x0c => Ok(()),
            _ => respond(s, q, cid, 0, INVALID_OPCODE).await,
        };
    }
    let lba = u64::from(cdw(10)) | (u64::from(cdw(11)) << 32);
    let blocks = (cdw(12) & 0xffff) + 1;
    let len = blocks * t.block;
    let in_range = lba
        .checked_add(u64::from(blocks))
        .is_some_and(|end| end <= t.blocks);
    match opc {
        pdu::OPC_WRITE if !in_range => respond(s, q, cid, 0, 0x80).await,
        pdu::OPC_WRITE if len as usize > MAX_IO => respond(s, q, cid, 0, INVALID_FIELD).await,
        pdu::OPC_WRITE if !data.is_empty() || sqe[39] == 0x01 => {
            record(t, lba, len);
            respond(s, q, cid, 0, 0).await
        }
        pdu::OPC_WRITE => {
            // the data comes through R2T: all of it asked at once
            pending.insert(cid, Pending { lba, len, got: 0 });
            let mut r2t = [0u8; DATA_LEN];
            r2t[0] = pdu::R2T;
            r2t[2] = DATA_LEN as u8;
            r2t[4..8].copy_from_slice(&(DATA_LEN as u32).to_le_bytes());
            r2t[8..10].copy_from_slice(&cid.to_le_bytes());
            r2t[10..12].copy_from_slice(&cid.to_le_bytes());
            r2t[16..20].copy_from_slice(&len.to_le_bytes());
            s.write_all(&r2t).await
        }
        pdu::OPC_READ if !in_range => respond(s, q, cid, 0, 0x80).await,
        pdu::OPC_READ if len as usize > MAX_IO => respond(s, q, cid, 0, INVALID_FIELD).await,
        pdu::OPC_READ => send_data(s, q, cid, &vec![0u8; len as usize], len).await,
        // Flush, Write Zeroes (no data: nothing recorded), Dataset Management
        0x00 | 0x08 | 0x09 => respond(s, q, cid, 0, 0).await,
        _ => respond(s, q, cid, 0, INVALID_OPCODE).await,
    }
}

async fn fabrics(
    s: &mut TcpStream,
    t: &Shared,
    q: &mut Queue,
    sqe: &[u8; 64],
    data: &[u8],
) -> std::io::Result<()> {
    let cid = u16_at(sqe, 2);
    match sqe[4] {
        pdu::FCTYPE_CONNECT => {
            if data.len() < 1024 {
                return respond(s, q, cid, 0, INVALID_FIELD).await;
            }
            let subnqn = &data[256..512];
            let subnqn = &subnqn[..subnqn.iter().position(|b| *b == 0).unwrap_or(256)];
            if subnqn != t.nqn.as_bytes() {
                // Connect Invalid Parameters (command specific, type 1)
                return respond(s, q, cid, 0, 0x100 | 0x82).await;
            }
            q.qid = u16_at(sqe, 42);
            q.sqsize = u16_at(sqe, 44).min(MQES);
            // controller id 1: the one controller of this target
            respond(s, q, cid, 1, 0).await
        }
        pdu::FCTYPE_PROPERTY_GET => {
            let v: u64 = match u32_at(sqe, 44) {
                // CAP: MQES, CQR, TO 10 (5 s), NVM command set, 4 KiB pages
                pdu::REG_CAP => u64::from(MQES) | (1 << 16) | (10 << 24) | (1 << 37),
                // VS 1.3
                0x08 => 0x0001_0300,
                pdu::REG_CC => u64::from(q.cc),
                // CSTS: ready while enabled; a shutdown asked is complete at once
                pdu::REG_CSTS => u64::from(q.cc & 1) | if q.cc & 0xc000 != 0 { 2 << 2 } else { 0 },
                _ => 0,
            };
            respond_wide(s, q, cid, v, 0).await
        }
        pdu::FCTYPE_PROPERTY_SET => {
            if u32_at(sqe, 44) == pdu::REG_CC {
                q.cc = u32_at(sqe, 48);
            }
            respond(s, q, cid, 0, 0).await
        }
        _ => respond(s, q, cid, 0, INVALID_OPCODE).await,
    }
}

/// Identify data for `cns`: the controller (1), namespace 1 (0), the
/// active namespaces (2), namespace 1's identifiers (3); `None`: not served.
fn identify(t: &Shared, cns: u32, nsid: u32) -> Option<Vec<u8>> {
    let mut d = vec![0u8; 4096];
    let text = |d: &mut [u8], at: usize, len: usize, s: &str| {
        d[at..at + len].fill(b' ');
        d[at..at + s.len().min(len)].copy_from_slice(&s.as_bytes()[..s.len().min(len)]);
    };
    match cns {
        1 => {
            text(&mut d, 4, 20, "talon-map");
            text(&mut d, 24, 40, "talon allocation map");
            text(&mut d, 64, 8, env!("CARGO_PKG_VERSION"));
            d[77] = MDTS;
            d[78..80].copy_from_slice(&1u16.to_le_bytes());
            d[80..84].copy_from_slice(&0x0001_0300u32.to_le_bytes());
            d[111] = 1; // an I/O controller
            d[258] = 3; // ACL
            d[259] = 3; // AERL
            d[320..322].copy_from_slice(&10u16.to_le_bytes()); // KAS
            d[512] = 0x66; // SQES
            d[513] = 0x44; // CQES
            d[514..516].copy_from_slice(&(MQES + 1).to_le_bytes()); // MAXCMD
            d[516..520].copy_from_slice(&1u32.to_le_bytes()); // NN
            // SGLS: SGLs supported, offsets in the capsule
            d[536..540].copy_from_slice(&((1u32 << 20) | 1).to_le_bytes());
            let n = t.nqn.len().min(256);
            d[768..768 + n].copy_from_slice(&t.nqn.as_bytes()[..n]);
            // IOCCSZ: a whole MDTS write fits in the capsule; IORCSZ; MSDBD
            d[1792..1796].copy_from_slice(&(((64 + MAX_IO) / 16) as u32).to_le_bytes());
            d[1796..1800].copy_from_slice(&1u32.to_le_bytes());
            d[1801] = 1;
            Some(d)
        }
        0 if nsid == 1 => {
            for at in [0, 8, 16] {
                d[at..at + 8].copy_from_slice(&t.blocks.to_le_bytes());
            }
            d[130] = t.block.trailing_zeros() as u8; // LBAF0's LBADS
            Some(d)
        }
        0 => None,
        2 => {
            d[0..4].copy_from_slice(&1u32.to_le_bytes());
            Some(d)
        }
        3 => {
            // a UUID descriptor, from the NQN (stable for the target's life)
            d[0] = 3;
            d[1] = 16;
            let u = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, t.nqn.as_bytes());
            d[4..20].copy_from_slice(u.as_bytes());
            Some(d)
        }
        _ => None,
    }
}

/// Sends `data` (at most `asked` bytes) as one C2HData, then the completion.
async fn send_data(
    s: &mut TcpStream,
    q: &mut Queue,
    cid: u16,
    data: &[u8],
    asked: u32,
) -> std::io::Result<()> {
    let data = &data[..data.len().min(asked as usize)];
    let mut h = [0u8; DATA_LEN];
    h[0] = pdu::C2H_DATA;
    h[1] = FLAG_LAST;
    h[2] = DATA_LEN as u8;
    h[3] = DATA_LEN as u8;
    h[4..8].copy_from_slice(&((DATA_LEN + data.len()) as u32).to_le_bytes());
    h[8..10].copy_from_slice(&cid.to_le_bytes());
    h[16..20].copy_from_slice(&(data.len() as u32).to_le_bytes());
    s.write_all(&h).await?;
    s.write_all(data).await?;
    respond(s, q, cid, 0, 0).await
}

/// A CapsuleResp for `cid`: `dw0`, `status` (type << 8 | code).
async fn respond(s: &mut TcpStream, q: &mut Queue, cid: u16, dw0: u32, status: u16) -> std::io::Result<()> {
    respond_wide(s, q, cid, u64::from(dw0), status).await
}

/// [`respond`] with dwords 0 and 1 (an 8-byte property).
async fn respond_wide(
    s: &mut TcpStream,
    q: &mut Queue,
    cid: u16,
    dw: u64,
    status: u16,
) -> std::io::Result<()> {
    q.sqhd = (q.sqhd + 1) % (q.sqsize + 1);
    let mut b = [0u8; pdu::RESP_LEN];
    b[0] = CAPSULE_RESP;
    b[2] = pdu::RESP_LEN as u8;
    b[4..8].copy_from_slice(&(pdu::RESP_LEN as u32).to_le_bytes());
    b[8..16].copy_from_slice(&dw.to_le_bytes());
    b[16..18].copy_from_slice(&q.sqhd.to_le_bytes());
    b[18..20].copy_from_slice(&q.qid.to_le_bytes());
    b[20..22].copy_from_slice(&cid.to_le_bytes());
    b[22..24].copy_from_slice(&(status << 1).to_le_bytes());
    s.write_all(&b).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_what_touches_and_say_what_a_block_meets() {
        let mut r = Ranges::default();
        r.add(10, 20);
        r.add(30, 40);
        r.add(20, 25);
        assert_eq!(r.iter().collect::<Vec<_>>(), [(10, 25), (30, 40)]);
        r.add(5, 35);
        assert_eq!(r.iter().collect::<Vec<_>>(), [(5, 40)]);
        r.add(50, 60);
        assert_eq!(r.bytes(), 45);
        assert!(r.touches(0, 6) && r.touches(39, 50) && r.touches(55, 56));
        assert!(!r.touches(0, 5) && !r.touches(40, 50) && !r.touches(60, 70));
    }
}
