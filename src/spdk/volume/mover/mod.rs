//! The data mover: a bdev's data read out of spdk_tgt, or data written into
//! it, by talon itself over NVMe/TCP on loopback, with no staging file.
//!
//! SPDK v26.05 has no RPC that reads or writes an lvol's data (Longhorn's
//! fork adds range and checksum RPCs), and neither this machine nor Talos
//! is assumed to have the kernel's nvme_tcp. So the mover exports the bdev
//! for a moment to itself, and speaks NVMe/TCP to that export ([`tcp`]):
//!
//! ```text
//!   Session::open(bdev, purpose)
//!     nvmf_create_subsystem  nqn.2025-01.io.talon:mover:<run>:<purpose>:<uuid>  (<run>: the client's RunId)
//!     nvmf_subsystem_add_ns  <bdev>        (a snapshot's bdev is read-only: the export is too)
//!     nvmf_subsystem_add_host  one random host NQN, the session's own
//!     nvmf_subsystem_add_listener  127.0.0.1:<a free port>
//!     tcp::Controller::connect  ICReq, Connect, CC.EN, Identify, an I/O queue of `depth`
//!   read / write  whole blocks, split into commands of the controller's MDTS,
//!                 up to `depth` in flight; read_in_order: chunks in order, bounded
//!   close (or drop, or cancel)  connections closed, nvmf_delete_subsystem
//!   a crash (talon or spdk_tgt)  sweep(): subsystems of the mover's prefix of
//!                                another run go (the orphan controller's poll)
//! ```
//!
//! Where the data is: SPDK v26.05 has no fragmap RPC. A reader reads every
//! block and skips the chunks that are all zeros (a hole and written zeros
//! read alike); a writer writes only chunks that hold a non-zero byte, so
//! a thin lvol allocates only clusters with data.

pub mod backup;
pub mod copy;
pub mod into_replica;
pub mod map;
pub mod pdu;
pub mod restore;
pub mod standby;
pub mod tcp;

use std::net::{Ipv4Addr, SocketAddr};

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::FuturesOrdered;

use super::super::client::{ClientError, SpdkClient};
use super::super::error::ErrorKind;
use super::super::rpc::{
    AddNamespace, ByNqn, CreateSubsystem, CreateTransport, GetTransports, ListenAddress, SubsystemHostParams,
    SubsystemListener,
};
use super::Inventory;
use crate::names::{NQN_PREFIX, Nqn};

/// What a session is for: named in its NQN, so a leftover says who left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A snapshot hash reads a snapshot.
    Hash,
    /// A backup reads a snapshot.
    Backup,
    /// A restore writes a new lvol.
    Restore,
    /// A clone reads a snapshot and writes a new volume ([`copy`]).
    Clone,
    /// A test or bench.
    Test,
}

impl Purpose {
    fn as_str(self) -> &'static str {
        match self {
            Purpose::Hash => "hash",
            Purpose::Backup => "backup",
            Purpose::Restore => "restore",
            Purpose::Clone => "clone",
            Purpose::Test => "test",
        }
    }
}

/// The commands a session keeps in flight by default.
pub const DEPTH: u16 = 32;
/// The chunk the mover reads, skips when all zeros, and writes: 1 MiB.
pub const CHUNK: usize = 1 << 20;

/// A failed step of the mover, naming the bdev.
#[derive(Debug, thiserror::Error)]
pub enum MoverError {
    /// An RPC to spdk_tgt failed.
    #[error("mover for bdev {bdev}: {step}")]
    Rpc {
        /// The bdev moved.
        bdev: String,
        /// The step.
        step: String,
        /// Why.
        #[source]
        source: ClientError,
    },
    /// A restore's backup could not be read (or a block of it written).
    #[error("mover for bdev {bdev}: restoring from the backup store")]
    Backup {
        /// The bdev written.
        bdev: String,
        /// Why.
        #[source]
        source: Box<crate::backupstore::BackupError>,
    },
    /// The NVMe/TCP exchange with the bdev's export failed.
    #[error("mover for bdev {bdev}: {step}")]
    Wire {
        /// The bdev moved.
        bdev: String,
        /// What the mover was doing.
        step: String,
        /// Why.
        #[source]
        source: Box<tcp::WireError>,
    },
    /// A file the mover reads from failed.
    #[error("mover for bdev {bdev}: {step} {}", path.display())]
    File {
        /// The bdev written.
        bdev: String,
        /// What the mover was doing with the file.
        step: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A request the bdev cannot take: a size or range that does not fit, a
    /// name SPDK refuses.
    #[error("mover for bdev {bdev}: {reason}")]
    Invalid {
        /// The bdev moved.
        bdev: String,
        /// What does not fit.
        reason: String,
    },
    /// A shallow copy inside spdk_tgt ([`copy::within`]) failed, in SPDK's words.
    #[error("mover for bdev {bdev}: the shallow copy of snapshot {snapshot} failed: {message}")]
    ShallowCopy {
        /// The bdev written.
        bdev: String,
        /// The snapshot copied.
        snapshot: String,
        /// SPDK's words.
        message: String,
    },
}

/// The prefix of every mover subsystem's NQN.
pub fn nqn_prefix() -> String {
    format!("{NQN_PREFIX}:mover:")
}

/// A bdev exported to talon for a moment, and talon's controller of it.
#[derive(Debug)]
pub struct Session {
    client: SpdkClient,
    nqn: Nqn,
    bdev: String,
    ctrl: Option<tcp::Controller>,
    /// Closed, or joined (the export is another's: it stays).
    closed: bool,
}

impl Session {
    /// Exports `bdev` (a name or alias) on 127.0.0.1 to a host NQN of its
    /// own and connects to it with `depth` commands in flight. Nothing is
    /// left behind when it fails.
    pub async fn open(
        client: &SpdkClient,
        bdev: &str,
        purpose: Purpose,
        depth: u16,
    ) -> Result<Session, MoverError> {
        let rpc = |step: String| {
            let bdev = bdev.to_owned();
            move |source| MoverError::Rpc { bdev, step, source }
        };
        ensure_tcp(client)
            .await
            .map_err(rpc("making the TCP transport".into()))?;
        let id = uuid::Uuid::new_v4();
        let nqn = Nqn::parse(&format!(
            "{}{}:{}:{}",
            nqn_prefix(),
            client.run_id().as_str(),
            purpose.as_str(),
            id.simple()
        ))
        .map_err(|e| MoverError::Invalid {
            bdev: bdev.to_owned(),
            reason: e.to_string(),
        })?;
        client
            .nvmf_create_subsystem(&CreateSubsystem {
                nqn: nqn.as_str().to_owned(),
                allow_any_host: Some(false),
                serial_number: None,
                model_number: Some("talon mover".into()),
                max_namespaces: Some(1),
                ana_reporting: None,
                min_cntlid: None,
                max_cntlid: None,
            })
            .await
            .map_err(rpc(format!("creating subsystem {nqn}")))?;
        // from here on, dropping the session removes the subsystem
        let mut s = Session {
            client: client.clone(),
            nqn,
            bdev: bdev.to_owned(),
            ctrl: None,
            closed: false,
        };
        match s.setup(id, depth).await {
            Ok(ctrl) => {
                s.ctrl = Some(ctrl);
                Ok(s)
            }
            Err(e) => {
                // removed before the error is answered: a failed open leaves nothing
                s.closed = true;
                if let Err(r) = remove(client, s.nqn.as_str()).await {
                    tracing::warn!(nqn = %s.nqn, error = %crate::util::error_chain(&r), "removing a mover export");
                }
                Err(e)
            }
        }
    }

    /// Connects to export `nqn` of `bdev` that another owns (an engine's
    /// export, which a bdev cannot have twice), at `addr`, as `host`, which
    /// it admits; its namespace 1 is read and written. Closing or dropping
    /// the session leaves the export as it was.
    pub async fn join(
        client: &SpdkClient,
        bdev: &str,
        nqn: &Nqn,
        addr: SocketAddr,
        host: &str,
        depth: u16,
    ) -> Result<Session, MoverError> {
        let hostid = uuid::Uuid::new_v4();
        let ctrl = tcp::Controller::connect(addr, nqn.as_str(), host, &hostid, depth)
            .await
            .map_err(|source| MoverError::Wire {
                bdev: bdev.to_owned(),
                step: format!("joining its export {nqn} at {addr} as {host}"),
                source: Box::new(source),
            })?;
        Ok(Session {
            client: client.clone(),
            nqn: nqn.clone(),
            bdev: bdev.to_owned(),
            ctrl: Some(ctrl),
            closed: true,
        })
    }

    /// The namespace, the host, the listener and the connection of a new session.
    async fn setup(&self, id: uuid::Uuid, depth: u16) -> Result<tcp::Controller, MoverError> {
        let (client, bdev) = (&self.client, self.bdev.as_str());
        let rpc = |step: String| {
            let bdev = bdev.to_owned();
            move |source| MoverError::Rpc { bdev, step, source }
        };
        let n = self.nqn.as_str().to_owned();
        client
            .nvmf_subsystem_add_ns(&AddNamespace::with_id(&n, bdev, id))
            .await
            .map_err(rpc(format!("adding {bdev} to {n}")))?;
        let hostid = uuid::Uuid::new_v4();
        let host = format!("nqn.2014-08.org.nvmexpress:uuid:{}", hostid.hyphenated());
        client
            .nvmf_subsystem_add_host(&SubsystemHostParams {
                nqn: n.clone(),
                host: host.clone(),
            })
            .await
            .map_err(rpc(format!("admitting the mover's host to {n}")))?;
        let addr = listen(client, &n)
            .await
            .map_err(rpc(format!("listening for {n} on 127.0.0.1")))?;
        tcp::Controller::connect(addr, &n, &host, &hostid, depth)
            .await
            .map_err(|source| MoverError::Wire {
                bdev: bdev.to_owned(),
                step: format!("connecting to its export {n} at {addr}"),
                source: Box::new(source),
            })
    }

    fn ctrl(&self) -> &tcp::Controller {
        self.ctrl.as_ref().expect("a session is open")
    }

    /// The bdev's size in bytes.
    pub fn size(&self) -> u64 {
        self.ctrl().size()
    }

    /// Its block size.
    pub fn block_size(&self) -> u32 {
        self.ctrl().block_size
    }

    /// The subsystem's NQN.
    pub fn nqn(&self) -> &str {
        self.nqn.as_str()
    }

    pub(super) fn invalid(&self, reason: String) -> MoverError {
        MoverError::Invalid {
            bdev: self.bdev.clone(),
            reason,
        }
    }

    fn wire(&self, step: &str) -> impl FnOnce(tcp::WireError) -> MoverError {
        let (bdev, step) = (self.bdev.clone(), step.to_owned());
        move |source| MoverError::Wire {
            bdev,
            step,
            source: Box::new(source),
        }
    }

    /// Reads `len` bytes at `offset` (whole blocks), in commands of at most
    /// the controller's transfer size, all in flight at once.
    pub async fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, MoverError> {
        let c = self.ctrl();
        let step = c.max_io as usize;
        let parts = futures::future::try_join_all(
            (0..len)
                .step_by(step)
                .map(|at| c.read(offset + at as u64, step.min(len - at))),
        )
        .await
        .map_err(self.wire("reading"))?;
        if parts.len() == 1 {
            return Ok(parts.into_iter().next().unwrap_or_default());
        }
        Ok(parts.concat())
    }

    /// Writes `data` at `offset` (whole blocks), as [`Session::read`].
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), MoverError> {
        let c = self.ctrl();
        let step = c.max_io as usize;
        futures::future::try_join_all(
            (0..data.len())
                .step_by(step)
                .map(|at| c.write(offset + at as u64, data.slice(at..(at + step).min(data.len())))),
        )
        .await
        .map_err(self.wire("writing"))?;
        Ok(())
    }

    /// Reads the whole bdev in chunks of `chunk` bytes (the last one
    /// shorter), `ahead` chunks in flight, and gives them to `each` in
    /// order with their offsets: at most `ahead` chunks in memory.
    pub async fn read_in_order<F>(&self, chunk: usize, ahead: usize, each: F) -> Result<(), MoverError>
    where
        F: FnMut(u64, &[u8]) -> Result<(), MoverError>,
    {
        self.read_in_order_where(chunk, ahead, |_, _| true, each).await
    }

    /// [`Session::read_in_order`] of the chunks `wanted(start, end)` keeps
    /// only: the others are not read and `each` does not see them (a map
    /// says they read as zeros).
    pub async fn read_in_order_where<W, F>(
        &self,
        chunk: usize,
        ahead: usize,
        wanted: W,
        mut each: F,
    ) -> Result<(), MoverError>
    where
        W: Fn(u64, u64) -> bool,
        F: FnMut(u64, &[u8]) -> Result<(), MoverError>,
    {
        let size = self.size();
        let bs = u64::from(self.block_size());
        let chunk = (chunk as u64).max(bs) / bs * bs;
        let mut next = 0u64;
        let mut inflight = FuturesOrdered::new();
        loop {
            while next < size && inflight.len() < ahead.max(1) {
                let len = chunk.min(size - next) as usize;
                let at = next;
                next += len as u64;
                if !wanted(at, next) {
                    continue;
                }
                inflight.push_back(async move { self.read(at, len).await.map(|d| (at, d)) });
            }
            let Some(r) = inflight.next().await else {
                return Ok(());
            };
            let (at, d) = r?;
            each(at, &d)?;
        }
    }

    /// Closes the connections and removes the export.
    pub async fn close(mut self) -> Result<(), MoverError> {
        self.ctrl = None;
        if self.closed {
            // joined: the export is its owner's
            return Ok(());
        }
        self.closed = true;
        remove(&self.client, self.nqn.as_str())
            .await
            .map_err(|source| MoverError::Rpc {
                bdev: self.bdev.clone(),
                step: format!("deleting subsystem {}", self.nqn),
                source,
            })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.ctrl = None;
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, nqn) = (self.client.clone(), self.nqn.as_str().to_owned());
        rt.spawn(async move {
            if let Err(e) = remove(&client, &nqn).await {
                tracing::warn!(%nqn, error = %crate::util::error_chain(&e), "removing a mover export");
            }
        });
    }
}

async fn remove(client: &SpdkClient, nqn: &str) -> Result<(), ClientError> {
    match client.nvmf_delete_subsystem(&ByNqn { nqn: nqn.to_owned() }).await {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::NotFound) || e.to_string().contains("Unable to find subsystem") => Ok(()),
        Err(e) => Err(e),
    }
}

async fn ensure_tcp(client: &SpdkClient) -> Result<(), ClientError> {
    let have = client.nvmf_get_transports(&GetTransports::default()).await?;
    if have.iter().any(|t| t.trtype.eq_ignore_ascii_case("tcp")) {
        return Ok(());
    }
    match client.nvmf_create_transport(&CreateTransport::tcp()).await {
        Ok(_) => Ok(()),
        Err(e) if e.is(ErrorKind::AlreadyExists) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A listener of `nqn` on 127.0.0.1, on a port free a moment before (tried
/// three times: another process may take it meanwhile).
async fn listen(client: &SpdkClient, nqn: &str) -> Result<SocketAddr, ClientError> {
    let mut last = None;
    for _ in 0..3 {
        let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(0);
        let r = client
            .nvmf_subsystem_add_listener(&SubsystemListener {
                nqn: nqn.to_owned(),
                listen_address: ListenAddress::tcp(Ipv4Addr::LOCALHOST.into(), port),
            })
            .await;
        match r {
            Ok(_) => return Ok((Ipv4Addr::LOCALHOST, port).into()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("tried"))
}

/// Removes the mover subsystems another run than `client`'s left (talon
/// stopped or crashed mid-move), and its allocation map controllers
/// ([`map::sweep`]); answers their names.
pub async fn sweep(client: &SpdkClient, inv: &Inventory) -> Vec<String> {
    let prefix = nqn_prefix();
    let mine = format!("{prefix}{}:", client.run_id().as_str());
    let mut out = map::sweep(client, &inv.controllers).await;
    for s in &inv.subsystems {
        if !s.nqn.starts_with(&prefix) || s.nqn.starts_with(&mine) {
            continue;
        }
        match remove(client, &s.nqn).await {
            Ok(()) => {
                tracing::info!(nqn = %s.nqn, "removed a mover export an earlier run left");
                out.push(s.nqn.clone());
            }
            Err(e) => {
                tracing::warn!(nqn = %s.nqn, error = %crate::util::error_chain(&e), "removing a mover export")
            }
        }
    }
    out
}

/// Whether `data` holds a non-zero byte.
pub fn has_data(data: &[u8]) -> bool {
    // by words: an all-zero 1 MiB chunk is the common case
    let words = data.chunks_exact(8);
    let tail = words.remainder();
    words
        .map(|w| u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]))
        .any(|w| w != 0)
        || tail.iter().any(|b| *b != 0)
}

/// What [`fill_from_file`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Filled {
    /// Bytes written into the bdev (chunks with data).
    pub written: u64,
    /// Bytes read from the source: the file's data ranges, or the
    /// backup's blocks that hold data.
    pub read: u64,
}

/// Writes the chunks of `file` that hold data into bdev `bdev` (thin: a
/// chunk that is a hole or all zeros is not written), `depth` commands in
/// flight, at most `2 * depth` chunks in memory.
pub async fn fill_from_file(
    client: &SpdkClient,
    file: &std::path::Path,
    bdev: &str,
    depth: u16,
) -> Result<Filled, MoverError> {
    use std::os::unix::fs::FileExt as _;
    let s = Session::open(client, bdev, Purpose::Restore, depth).await?;
    let file_error = |step: &'static str| {
        let (bdev, path) = (s.bdev.clone(), file.to_owned());
        move |source| MoverError::File {
            bdev,
            step,
            path,
            source,
        }
    };
    let f = std::sync::Arc::new(std::fs::File::open(file).map_err(file_error("opening"))?);
    let len = f.metadata().map_err(file_error("looking at"))?.len();
    if len > s.size() {
        return Err(s.invalid(format!(
            "{} holds {len} bytes: more than the bdev's {}",
            file.display(),
            s.size()
        )));
    }
    let bs = u64::from(s.block_size());
    let mut done = Filled::default();
    let mut writes = futures::stream::FuturesUnordered::new();
    let mut at = 0u64;
    while at < len {
        // the next data at or after `at` (holes: skipped unread)
        match nix::unistd::lseek(&*f, at as i64, nix::unistd::Whence::SeekData) {
            Ok(d) => at = (d as u64 / CHUNK as u64 * CHUNK as u64).max(at),
            Err(nix::errno::Errno::ENXIO) => break,
            Err(_) => {}
        }
        if at >= len {
            break;
        }
        let n = (CHUNK as u64).min(len - at);
        let (f2, at2) = (f.clone(), at);
        let mut buf = tokio::task::spawn_blocking(move || {
            let mut b = vec![0u8; n as usize];
            f2.read_exact_at(&mut b, at2).map(|()| b)
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        .map_err(file_error("reading"))?;
        done.read += n;
        if has_data(&buf) {
            // a short last chunk padded to whole blocks (the file is the bdev's data)
            buf.resize((n.div_ceil(bs) * bs) as usize, 0);
            done.written += buf.len() as u64;
            let s = &s;
            writes.push(async move { s.write(at2, Bytes::from(buf)).await });
            while writes.len() >= 2 * usize::from(depth.max(1)) {
                if let Some(r) = writes.next().await {
                    r?;
                }
            }
        }
        at += n;
    }
    while let Some(r) = writes.next().await {
        r?;
    }
    drop(writes);
    s.close().await?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_no_data_and_one_byte_is() {
        let mut b = vec![0u8; CHUNK + 3];
        assert!(!has_data(&b));
        assert!(!has_data(&b[1..]));
        b[CHUNK + 2] = 1;
        assert!(has_data(&b));
        b[CHUNK + 2] = 0;
        b[5] = 9;
        assert!(has_data(&b[1..]));
    }

    #[test]
    fn a_mover_nqn_is_a_valid_nqn_under_talons_prefix() {
        let n = format!(
            "{}{}:{}:{}",
            nqn_prefix(),
            crate::spdk::RunId::new().as_str(),
            Purpose::Hash.as_str(),
            uuid::Uuid::nil().simple()
        );
        let nqn = Nqn::parse(&n).expect("valid");
        assert!(nqn.as_str().starts_with("nqn.2025-01.io.talon:mover:"), "{nqn}");
    }
}
