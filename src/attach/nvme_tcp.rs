//! The kernel NVMe/TCP initiator, driven without nvme-cli: an option string built from validated
//! types only is written to `/dev/nvme-fabrics`, the reply names the new controller, sysfs leads to
//! the namespace's block device, and `/dev/talon/<volume>` is made for it.
//!
//! ```text
//!  NvmeTcpTarget{IpAddr,u16,Nqn} + HostIdentity + ConnectOptions
//!        │ option_string()            "transport=tcp,traddr=..,trsvcid=..,nqn=..,hostnqn=..,..."
//!        ▼
//!  live controller for nqn+addr in /sys/class/nvme/*? ──yes──> reuse it
//!        │ no
//!        ▼
//!  fabrics_connect(): write /dev/nvme-fabrics, read "instance=N,cntlid=M"   (bounded: connect_timeout)
//!        ▼
//!  wait_namespace(nvmeN, nsid): /sys/class/nvme/nvmeN/{nvmeNnY | nvmeScNnY -> /sys/block/nvmeSnY}
//!        │ short backoff (2 ms .. 50 ms), bounded; controller gone/dead -> error
//!        │ not found -> delete_controller (nothing half-connected)
//!        ▼
//!  /sys/block/<ns>/dev "259:3" ──> devpath::create ──> /dev/talon/<volume>
//!
//!  detach: /dev/talon/<volume> ─ rdev ─> /sys/dev/block/M:m ─> <ns>/device ─> nvmeN | nvme-subsysS/nvme*
//!          (+ every tcp controller of --nqn) ──> delete_controller, wait until gone; then unlink the node
//! ```
//!
//! Every host path goes through [`HostRoot`], so the logic runs on fixture trees; the one call that
//! needs the real kernel, [`fabrics_connect`], is a plain function so that it can later run inside
//! the host mount namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::devpath::{self, DevNum};
use super::error::AttachError;
use super::kernel_backoff;
use crate::host::HostRoot;
use crate::names::{Nqn, ObjectName};
use crate::util::nvme_auth::DhchapSecret;

/// The fabrics control device, a host path.
pub const FABRICS_DEV: &str = "/dev/nvme-fabrics";
/// The default number of I/O queues per controller, whatever the host's CPU count: a
/// connected volume costs the target ~0.8 MiB of DPDK heap per queue (docs/sizing.md), so
/// the kernel's own default (one per online CPU) made a volume's memory follow the host's
/// size. Longhorn issue 13241: one queue per CPU (127) per volume exhausted SPDK's buffers.
pub const DEFAULT_IO_QUEUES: u32 = 4;
/// The most I/O queues a connect may ask for: Longhorn's bound for `nvmeTcpNrIoQueues`
/// (1..=128), which talon honours when the manager sends it; the kernel uses at most one per
/// online CPU whatever is asked.
pub const MAX_IO_QUEUES: u32 = 128;

/// Where to connect: validated address, port and subsystem NQN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeTcpTarget {
    pub traddr: IpAddr,
    pub trsvcid: u16,
    pub nqn: Nqn,
}

impl NvmeTcpTarget {
    /// `addr:port` (`[v6]:port`) for messages.
    pub fn addr(&self) -> String {
        std::net::SocketAddr::new(self.traddr, self.trsvcid).to_string()
    }
}

/// Controller options. `Default` gives talon's choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectOptions {
    /// I/O queues, 1..=[`MAX_IO_QUEUES`].
    pub nr_io_queues: u32,
    /// Seconds the kernel keeps reconnecting a lost controller before failing I/O; `None` = forever.
    pub ctrl_loss_tmo: Option<u32>,
    /// Seconds between reconnect attempts.
    pub reconnect_delay: u32,
    /// Keep-alive timeout in seconds.
    pub keep_alive_tmo: u32,
    /// Namespace ID of the volume in the subsystem.
    pub nsid: u32,
    /// Bound on the write to /dev/nvme-fabrics (a blackholed address blocks in TCP connect).
    pub connect_timeout: Duration,
    /// Bound on the wait for the namespace's block device.
    pub namespace_timeout: Duration,
    /// This host's DH-HMAC-CHAP secret (`NodeConfig.nvmeDhchap`), passed as
    /// `dhchap_secret=`; validated by its type, since it goes into the option
    /// string. `Debug` hides it, and the option string is never logged.
    pub dhchap_secret: Option<DhchapSecret>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            nr_io_queues: DEFAULT_IO_QUEUES,
            ctrl_loss_tmo: Some(60),
            reconnect_delay: 2,
            keep_alive_tmo: 5,
            nsid: 1,
            connect_timeout: Duration::from_secs(20),
            namespace_timeout: Duration::from_secs(10),
            dhchap_secret: None,
        }
    }
}

impl ConnectOptions {
    fn validate(&self) -> Result<(), AttachError> {
        let bad = |option, reason: String| Err(AttachError::InvalidOption { option, reason });
        if !(1..=MAX_IO_QUEUES).contains(&self.nr_io_queues) {
            return bad(
                "nr_io_queues",
                format!("{} is not in 1..={MAX_IO_QUEUES}", self.nr_io_queues),
            );
        }
        if self.reconnect_delay == 0 {
            return bad("reconnect_delay", "must be at least 1 second".into());
        }
        if let Some(t) = self.ctrl_loss_tmo
            && t < self.reconnect_delay
        {
            return bad(
                "ctrl_loss_tmo",
                format!("{t} s is shorter than reconnect_delay {} s", self.reconnect_delay),
            );
        }
        if !(1..=255).contains(&self.keep_alive_tmo) {
            return bad(
                "keep_alive_tmo",
                format!("{} is not in 1..=255", self.keep_alive_tmo),
            );
        }
        if self.nsid == 0 || self.nsid == u32::MAX {
            return bad("nsid", format!("{} is not a namespace ID", self.nsid));
        }
        Ok(())
    }
}

/// The host's NVMe identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    pub hostnqn: Nqn,
    pub hostid: uuid::Uuid,
}

impl HostIdentity {
    /// The host's `/etc/nvme/hostnqn` and `/etc/nvme/hostid` when present (what nvme-cli and the
    /// OS use), else an identity generated once and kept under `<data_dir>/nvme/`.
    pub fn load_or_create(root: &HostRoot, data_dir: &Path) -> Result<Self, AttachError> {
        if let Some(nqn) = root.read_attr_opt("/etc/nvme/hostnqn")?
            && !nqn.is_empty()
        {
            let hostnqn = Nqn::parse(&nqn).map_err(|source| AttachError::InvalidHostNqn {
                path: "/etc/nvme/hostnqn".into(),
                source,
            })?;
            let hostid = match root.read_attr_opt("/etc/nvme/hostid")? {
                Some(id) if !id.is_empty() => parse_hostid(Path::new("/etc/nvme/hostid"), &id)?,
                // nvme-cli derives the host ID from a uuid-style host NQN
                _ => nqn
                    .rsplit_once(":uuid:")
                    .and_then(|(_, u)| uuid::Uuid::parse_str(u).ok())
                    .unwrap_or_else(|| uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, nqn.as_bytes())),
            };
            return Ok(Self { hostnqn, hostid });
        }
        let dir = data_dir.join("nvme");
        let nqn_path = dir.join("hostnqn");
        let id_path = dir.join("hostid");
        if let (Ok(nqn), Ok(id)) = (fs::read_to_string(&nqn_path), fs::read_to_string(&id_path)) {
            let hostnqn = Nqn::parse(nqn.trim()).map_err(|source| AttachError::InvalidHostNqn {
                path: nqn_path.clone(),
                source,
            })?;
            return Ok(Self {
                hostnqn,
                hostid: parse_hostid(&id_path, &id)?,
            });
        }
        let hostid = uuid::Uuid::new_v4();
        let hostnqn = Nqn::parse(&format!("nqn.2014-08.org.nvmexpress:uuid:{hostid}")).map_err(|source| {
            AttachError::InvalidHostNqn {
                path: nqn_path.clone(),
                source,
            }
        })?;
        let store = |path: &Path, value: &str| {
            fs::create_dir_all(&dir)
                .and_then(|()| write_atomic(path, value))
                .map_err(|source| AttachError::StoreHostIdentity {
                    path: path.to_path_buf(),
                    source,
                })
        };
        store(&id_path, &format!("{hostid}\n"))?;
        store(&nqn_path, &format!("{hostnqn}\n"))?;
        Ok(Self { hostnqn, hostid })
    }
}

fn parse_hostid(path: &Path, s: &str) -> Result<uuid::Uuid, AttachError> {
    uuid::Uuid::parse_str(s.trim()).map_err(|_| AttachError::InvalidHostId {
        path: path.to_path_buf(),
        value: s.trim().to_string(),
    })
}

fn write_atomic(path: &Path, value: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(value.as_bytes())?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

/// The option string for `/dev/nvme-fabrics`, built from validated values only (no value can
/// contain `,`, `=` or a newline).
pub fn option_string(
    target: &NvmeTcpTarget,
    host: &HostIdentity,
    opts: &ConnectOptions,
) -> Result<String, AttachError> {
    opts.validate()?;
    let mut s = format!(
        "transport=tcp,traddr={},trsvcid={},nqn={},hostnqn={},hostid={},nr_io_queues={},reconnect_delay={},keep_alive_tmo={}",
        target.traddr,
        target.trsvcid,
        target.nqn,
        host.hostnqn,
        host.hostid,
        opts.nr_io_queues,
        opts.reconnect_delay,
        opts.keep_alive_tmo,
    );
    match opts.ctrl_loss_tmo {
        Some(t) => s.push_str(&format!(",ctrl_loss_tmo={t}")),
        None => s.push_str(",ctrl_loss_tmo=-1"),
    }
    if let Some(secret) = &opts.dhchap_secret {
        // parsed again: only DHHC-1:hh:<base64>: ever reaches the kernel (no ',' or '=' key)
        let secret = DhchapSecret::parse(secret.expose()).map_err(|e| AttachError::InvalidOption {
            option: "dhchap_secret",
            reason: e.to_string(),
        })?;
        s.push_str(",dhchap_secret=");
        s.push_str(secret.expose());
    }
    Ok(s)
}

/// The kernel's answer to a connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectReply {
    pub instance: u32,
    pub cntlid: u16,
}

impl ConnectReply {
    /// Parses `instance=N,cntlid=M`.
    pub fn parse(reply: &str) -> Option<Self> {
        let kv = parse_kv(reply);
        Some(Self {
            instance: kv.get("instance")?.parse().ok()?,
            cntlid: kv.get("cntlid")?.parse().ok()?,
        })
    }

    /// The controller's name, `nvmeN`.
    pub fn controller(&self) -> String {
        format!("nvme{}", self.instance)
    }
}

fn parse_kv(s: &str) -> BTreeMap<&str, &str> {
    s.trim()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect()
}

/// Writes `options` to `/dev/nvme-fabrics` and returns the kernel's one-line reply. This is the
/// only call that needs the kernel initiator; it blocks for the whole connect.
pub fn fabrics_connect(root: &HostRoot, options: &str) -> Result<String, FabricsError> {
    let path = root.path(FABRICS_DEV);
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(FabricsError::Open)?;
    f.write_all(options.as_bytes()).map_err(FabricsError::Write)?;
    let mut buf = String::new();
    f.read_to_string(&mut buf).map_err(FabricsError::Write)?;
    Ok(buf.trim().to_string())
}

/// How [`fabrics_connect`] failed: opening the device or the connect itself.
#[derive(Debug)]
pub enum FabricsError {
    Open(std::io::Error),
    Write(std::io::Error),
}

/// What [`attach`] uses to connect: [`fabrics_connect`] on a real host.
pub type Connector = fn(&HostRoot, &str) -> Result<String, FabricsError>;

/// One NVMe controller as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    /// `nvmeN`.
    pub name: String,
    pub transport: String,
    pub subsysnqn: String,
    /// `traddr=...,trsvcid=...[,src_addr=...]`, empty for PCIe.
    pub address: String,
    pub state: String,
}

impl Controller {
    /// Whether this is a TCP controller of `target` (same NQN, address and port).
    pub fn matches(&self, target: &NvmeTcpTarget) -> bool {
        if self.transport != "tcp" || self.subsysnqn != target.nqn.as_str() {
            return false;
        }
        let kv = parse_kv(&self.address);
        kv.get("traddr").and_then(|a| a.parse::<IpAddr>().ok()) == Some(target.traddr)
            && kv.get("trsvcid").and_then(|p| p.parse::<u16>().ok()) == Some(target.trsvcid)
    }
}

fn is_ctrl_name(n: &str) -> bool {
    n.strip_prefix("nvme")
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// Reads one controller, `None` when it is gone.
pub fn read_controller(root: &HostRoot, name: &str) -> Result<Option<Controller>, AttachError> {
    let dir = PathBuf::from("/sys/class/nvme").join(name);
    let Some(state) = root.read_attr_opt(dir.join("state"))? else {
        return Ok(None);
    };
    let attr =
        |a: &str| -> Result<String, AttachError> { Ok(root.read_attr_opt(dir.join(a))?.unwrap_or_default()) };
    Ok(Some(Controller {
        name: name.to_string(),
        transport: attr("transport")?,
        subsysnqn: attr("subsysnqn")?,
        address: attr("address")?,
        state,
    }))
}

/// Every NVMe controller of the host.
pub fn list_controllers(root: &HostRoot) -> Result<Vec<Controller>, AttachError> {
    let names = match root.list_dir("/sys/class/nvme") {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for n in names.iter().filter(|n| is_ctrl_name(n)) {
        if let Some(c) = read_controller(root, n)? {
            out.push(c);
        }
    }
    Ok(out)
}

/// The block device of namespace `nsid` of controller `ctrl`, when it is there: `nvmeNnY`
/// without native multipath; with it, the controller shows the hidden path device `nvmeScNnY`
/// and the visible device is the subsystem head `nvmeSnY` in /sys/block.
pub fn find_namespace(root: &HostRoot, ctrl: &str, nsid: u32) -> Result<Option<String>, AttachError> {
    let dir = PathBuf::from("/sys/class/nvme").join(ctrl);
    let entries = match root.list_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    for e in entries {
        let Some(parsed) = parse_ns_name(&e) else { continue };
        let ns_nsid = match root.read_attr_opt(dir.join(&e).join("nsid"))? {
            Some(v) => v.parse::<u32>().ok(),
            None => Some(parsed.2),
        };
        if ns_nsid != Some(nsid) {
            continue;
        }
        let visible = match parsed.1 {
            None => e.clone(),
            Some(_) => format!("nvme{}n{}", parsed.0, parsed.2),
        };
        if root.exists(PathBuf::from("/sys/block").join(&visible).join("dev")) {
            return Ok(Some(visible));
        }
    }
    Ok(None)
}

/// `nvmeXnY` -> (X, None, Y); `nvmeXcCnY` -> (X, Some(C), Y).
fn parse_ns_name(n: &str) -> Option<(u32, Option<u32>, u32)> {
    let rest = n.strip_prefix("nvme")?;
    let (head, y) = rest.rsplit_once('n')?;
    let y = y.parse().ok()?;
    match head.split_once('c') {
        Some((x, c)) => Some((x.parse().ok()?, Some(c.parse().ok()?), y)),
        None => Some((head.parse().ok()?, None, y)),
    }
}

/// Waits for the namespace's block device (sysfs and its /dev node). Fails early when the
/// controller goes away or dies.
pub fn wait_namespace(
    root: &HostRoot,
    ctrl: &str,
    nqn: &Nqn,
    nsid: u32,
    bound: Duration,
) -> Result<(String, DevNum), AttachError> {
    let (mut backoff, until) = (kernel_backoff(), std::time::Instant::now() + bound);
    loop {
        match read_controller(root, ctrl)? {
            None => {
                return Err(AttachError::ControllerVanished {
                    controller: ctrl.into(),
                    nqn: nqn.to_string(),
                    state: "removed".into(),
                });
            }
            Some(c) if c.state.starts_with("deleting") || c.state == "dead" => {
                return Err(AttachError::ControllerVanished {
                    controller: ctrl.into(),
                    nqn: nqn.to_string(),
                    state: c.state,
                });
            }
            Some(_) => {}
        }
        if let Some(blk) = find_namespace(root, ctrl, nsid)?
            && let Some(dev) = root.read_attr_opt(PathBuf::from("/sys/block").join(&blk).join("dev"))?
            && let Some(dev) = DevNum::parse(&dev)
            && root.exists(PathBuf::from("/dev").join(&blk))
        {
            return Ok((blk, dev));
        }
        if !backoff.sleep_before(until) {
            return Err(AttachError::NamespaceNotFound {
                controller: ctrl.into(),
                nqn: nqn.to_string(),
                nsid,
                waited: bound,
            });
        }
    }
}

/// Disconnects a controller with `delete_controller` and waits (bounded) until it is gone.
/// A controller that is already gone is fine.
pub fn delete_controller(root: &HostRoot, ctrl: &str, bound: Duration) -> Result<(), AttachError> {
    let attr = PathBuf::from("/sys/class/nvme")
        .join(ctrl)
        .join("delete_controller");
    match root.write_str(&attr, "1") {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(AttachError::DeleteController {
                controller: ctrl.into(),
                source,
            });
        }
    }
    let (mut backoff, until) = (kernel_backoff(), std::time::Instant::now() + bound);
    while root.exists(PathBuf::from("/sys/class/nvme").join(ctrl).join("state")) {
        if !backoff.sleep_before(until) {
            return Err(AttachError::DeleteTimedOut {
                controller: ctrl.into(),
                waited: bound,
            });
        }
    }
    Ok(())
}

/// The result of an attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// `nvmeN`.
    pub controller: String,
    /// The kernel block device, `nvmeXnY`.
    pub device: String,
    pub dev: DevNum,
    /// `/dev/talon/<volume>` (a host path).
    pub stable_path: PathBuf,
    /// Whether a live controller for the same NQN and address was reused.
    pub reused: bool,
}

/// Attaches `volume` from `target` on a real host (see [`attach_with`]).
pub fn attach(
    root: &HostRoot,
    data_dir: &Path,
    volume: &ObjectName,
    target: &NvmeTcpTarget,
    opts: &ConnectOptions,
) -> Result<Attached, AttachError> {
    attach_with(root, data_dir, volume, target, opts, fabrics_connect)
}

/// Attaches `volume`: reuses the controller of `target` the kernel has (live, or reconnecting
/// after its target's export was closed a moment) or connects one through `connect`,
/// waits for the namespace and makes `/dev/talon/<volume>`. On failure after a new connect, the
/// controller is deleted again.
pub fn attach_with(
    root: &HostRoot,
    data_dir: &Path,
    volume: &ObjectName,
    target: &NvmeTcpTarget,
    opts: &ConnectOptions,
    connect: Connector,
) -> Result<Attached, AttachError> {
    opts.validate()?;
    let _lock = super::lock_volume(root, volume)?;
    let nqn = &target.nqn;
    let (controller, state) = existing_or_connect(root, data_dir, target, opts, connect)?;
    let reused = state.is_some();
    let undo = |e: AttachError| -> AttachError {
        if !reused && let Err(d) = delete_controller(root, &controller, Duration::from_secs(10)) {
            tracing::error!(%controller, error = %d, "cannot delete the controller of a failed attach");
        }
        e
    };
    let (device, dev) =
        wait_namespace(root, &controller, nqn, opts.nsid, opts.namespace_timeout).map_err(undo)?;
    let stable_path = devpath::create(root, volume, &device, dev).map_err(undo)?;
    Ok(Attached {
        controller,
        device,
        dev,
        stable_path,
        reused,
    })
}

/// Connects one more path of `volume`'s subsystem: a controller of `target` (reused when the
/// kernel has one, live or reconnecting), waited for until the kernel says it is `live` (at
/// most `opts.namespace_timeout`); its namespace is not waited for, as its listener may be
/// inaccessible (Longhorn connects a
/// switch-over's new path so, and its kernel shows the namespace under the multipath head the
/// volume has). Returns the controller; one this call made is deleted again when it fails.
/// A controller the kernel reconnects is never connected twice (the kernel refuses the
/// duplicate: "a controller with these options already exists").
pub fn connect_path(
    root: &HostRoot,
    data_dir: &Path,
    volume: &ObjectName,
    target: &NvmeTcpTarget,
    opts: &ConnectOptions,
) -> Result<String, AttachError> {
    connect_path_with(root, data_dir, volume, target, opts, fabrics_connect)
}

/// [`connect_path`] through `connect`.
pub fn connect_path_with(
    root: &HostRoot,
    data_dir: &Path,
    volume: &ObjectName,
    target: &NvmeTcpTarget,
    opts: &ConnectOptions,
    connect: Connector,
) -> Result<String, AttachError> {
    opts.validate()?;
    let _lock = super::lock_volume(root, volume)?;
    let (controller, state) = existing_or_connect(root, data_dir, target, opts, connect)?;
    if state.as_deref() == Some("live") {
        return Ok(controller);
    }
    // one the kernel reconnects is waited for, never connected twice
    let made = state.is_none();
    let (mut backoff, until) = (
        kernel_backoff(),
        std::time::Instant::now() + opts.namespace_timeout,
    );
    loop {
        let state = read_controller(root, &controller)?.map(|c| c.state);
        match state.as_deref() {
            Some("live") => return Ok(controller),
            Some(s) if !(s.starts_with("deleting") || s == "dead") && backoff.sleep_before(until) => {}
            _ => {
                if made && let Err(d) = delete_controller(root, &controller, Duration::from_secs(10)) {
                    tracing::error!(%controller, error = %d, "cannot delete a path that did not come up");
                }
                return Err(AttachError::NotLive {
                    controller,
                    nqn: target.nqn.to_string(),
                    addr: target.addr(),
                    state: state.unwrap_or_else(|| "removed".into()),
                    waited: opts.namespace_timeout,
                });
            }
        }
    }
}

/// The controller of `target`: the one the kernel has (with its state), else one connected
/// through `connect` (state `None`).
fn existing_or_connect(
    root: &HostRoot,
    data_dir: &Path,
    target: &NvmeTcpTarget,
    opts: &ConnectOptions,
    connect: Connector,
) -> Result<(String, Option<String>), AttachError> {
    if let Some(c) = existing(root, target)? {
        if c.state == "live" {
            tracing::debug!(controller = %c.name, nqn = %target.nqn, "reusing the live controller");
        } else {
            // the kernel reconnects it (its target's export was closed a
            // moment); another connect would be refused as a duplicate
            tracing::info!(controller = %c.name, nqn = %target.nqn, state = c.state, "reusing the controller the kernel reconnects");
        }
        return Ok((c.name, Some(c.state)));
    }
    let host = HostIdentity::load_or_create(root, data_dir)?;
    let options = option_string(target, &host, opts)?;
    let reply = connect_bounded(root, target, &options, opts.connect_timeout, connect)?;
    Ok((reply.controller(), None))
}

/// The controller of `target` the kernel has, live or reconnecting (one being deleted, or dead,
/// is not): the live one first.
fn existing(root: &HostRoot, target: &NvmeTcpTarget) -> Result<Option<Controller>, AttachError> {
    let mut found: Vec<Controller> = list_controllers(root)?
        .into_iter()
        .filter(|c| c.matches(target) && !(c.state.starts_with("deleting") || c.state == "dead"))
        .collect();
    found.sort_by_key(|c| c.state != "live");
    Ok(found.into_iter().next())
}

/// The addresses of the TCP controllers of subsystem `nqn` the kernel has live: a volume's
/// paths.
pub fn live_paths(root: &HostRoot, nqn: &Nqn) -> Result<BTreeSet<SocketAddr>, AttachError> {
    Ok(list_controllers(root)?
        .into_iter()
        .filter(|c| c.transport == "tcp" && c.subsysnqn == nqn.as_str() && c.state == "live")
        .filter_map(|c| {
            let kv = parse_kv(&c.address);
            let ip = kv.get("traddr")?.parse::<IpAddr>().ok()?;
            let port = kv.get("trsvcid")?.parse::<u16>().ok()?;
            Some(SocketAddr::new(ip, port))
        })
        .collect())
}

/// Runs `connect` on a thread and waits at most `bound`. A connect that finishes after the
/// caller gave up is disconnected by that thread, so nothing stays connected behind its back.
fn connect_bounded(
    root: &HostRoot,
    target: &NvmeTcpTarget,
    options: &str,
    bound: Duration,
    connect: Connector,
) -> Result<ConnectReply, AttachError> {
    let nqn = target.nqn.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let abandoned = Arc::new(AtomicBool::new(false));
    let (root2, options2, abandoned2) = (root.clone(), options.to_string(), abandoned.clone());
    std::thread::spawn(move || {
        let res = connect(&root2, &options2);
        if abandoned2.load(Ordering::SeqCst) {
            if let Ok(reply) = &res
                && let Some(r) = ConnectReply::parse(reply)
            {
                tracing::warn!(controller = %r.controller(), "late connect after timeout: deleting it");
                let _ = delete_controller(&root2, &r.controller(), Duration::from_secs(10));
            }
        } else {
            let _ = tx.send(res);
        }
    });
    let res = match rx.recv_timeout(bound) {
        Ok(res) => res,
        Err(_) => {
            abandoned.store(true, Ordering::SeqCst);
            // the result may have been sent just before the flag was set
            match rx.try_recv() {
                Ok(res) => res,
                Err(_) => {
                    return Err(AttachError::ConnectTimedOut {
                        nqn,
                        addr: target.addr(),
                        waited: bound,
                    });
                }
            }
        }
    };
    let reply = match res {
        Ok(r) => r,
        Err(FabricsError::Open(source)) => {
            return Err(AttachError::OpenFabrics {
                path: FABRICS_DEV.into(),
                source,
            });
        }
        Err(FabricsError::Write(source)) => {
            let hint = AttachError::connect_hint(&source);
            return Err(AttachError::Connect {
                nqn,
                addr: target.addr(),
                hint,
                source,
            });
        }
    };
    match ConnectReply::parse(&reply) {
        Some(r) => Ok(r),
        None => {
            // the kernel made something we cannot name: find it by NQN+address and delete it
            for c in list_controllers(root)?.iter().filter(|c| c.matches(target)) {
                let _ = delete_controller(root, &c.name, Duration::from_secs(10));
            }
            Err(AttachError::ConnectReply { nqn, reply })
        }
    }
}

/// The result of a detach.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Detached {
    /// Controllers disconnected.
    pub controllers: Vec<String>,
    /// Whether `/dev/talon/<volume>` was removed.
    pub removed_path: bool,
}

/// The TCP controllers behind block device `blk` (one, or all paths of a multipath head).
fn controllers_of_block(root: &HostRoot, blk: &str) -> Result<Vec<String>, AttachError> {
    let Some(parent) = root.link_name(PathBuf::from("/sys/block").join(blk).join("device"))? else {
        return Ok(Vec::new());
    };
    if is_ctrl_name(&parent) {
        return Ok(vec![parent]);
    }
    if parent.starts_with("nvme-subsys") {
        let dir = PathBuf::from("/sys/class/nvme-subsystem").join(&parent);
        return Ok(root
            .list_dir(dir)?
            .into_iter()
            .filter(|n| is_ctrl_name(n))
            .collect());
    }
    Ok(Vec::new())
}

/// Detaches `volume`: disconnects the TCP controllers behind `/dev/talon/<volume>` and, when
/// `nqn` is given, every TCP controller of that subsystem (cleans up after a lost node), then
/// removes the node. Idempotent. PCIe controllers are never touched. (`_data_dir` is kept for
/// callers; the attach lock lives in the host's /run now, see [`super::lock_volume`].)
pub fn detach(
    root: &HostRoot,
    _data_dir: &Path,
    volume: &ObjectName,
    nqn: Option<&Nqn>,
) -> Result<Detached, AttachError> {
    let _lock = super::lock_volume(root, volume)?;
    let mut names = Vec::new();
    if let Some(dev) = devpath::current(root, volume)?
        && let Some(blk) = root.link_name(format!("/sys/dev/block/{dev}"))?
    {
        names.extend(controllers_of_block(root, &blk)?);
    }
    let all = list_controllers(root)?;
    if let Some(nqn) = nqn {
        names.extend(
            all.iter()
                .filter(|c| c.subsysnqn == nqn.as_str())
                .map(|c| c.name.clone()),
        );
    }
    names.sort();
    names.dedup();
    let tcp: Vec<String> = names
        .into_iter()
        .filter(|n| all.iter().any(|c| &c.name == n && c.transport == "tcp"))
        .collect();
    // controllers first, the node last: a detach that fails half-way finds them again through it
    for c in &tcp {
        delete_controller(root, c, Duration::from_secs(10))?;
    }
    let removed_path = devpath::current(root, volume)?.is_some();
    devpath::remove(root, volume)?;
    Ok(Detached {
        controllers: tcp,
        removed_path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> NvmeTcpTarget {
        NvmeTcpTarget {
            traddr: "127.0.0.1".parse().expect("ip"),
            trsvcid: 4420,
            nqn: Nqn::parse("nqn.2025-01.io.talon:vol:v1").expect("nqn"),
        }
    }

    fn host() -> HostIdentity {
        HostIdentity {
            hostnqn: Nqn::parse("nqn.2014-08.org.nvmexpress:uuid:0b7d3c1e-3a43-4bd4-a4a1-4e3d7d4c2f10")
                .expect("nqn"),
            hostid: uuid::Uuid::parse_str("0b7d3c1e-3a43-4bd4-a4a1-4e3d7d4c2f10").expect("uuid"),
        }
    }

    #[test]
    fn option_string_has_exactly_the_expected_keys() {
        let s = option_string(&target(), &host(), &ConnectOptions::default()).expect("options");
        let kv = parse_kv(&s);
        let keys: Vec<&str> = kv.keys().copied().collect();
        assert_eq!(
            keys,
            [
                "ctrl_loss_tmo",
                "hostid",
                "hostnqn",
                "keep_alive_tmo",
                "nqn",
                "nr_io_queues",
                "reconnect_delay",
                "traddr",
                "transport",
                "trsvcid"
            ]
        );
        assert_eq!(s.split(',').count(), 10, "{s}");
        assert_eq!(kv["nr_io_queues"], "4");
        assert_eq!(kv["nqn"], "nqn.2025-01.io.talon:vol:v1");
        let v6 = NvmeTcpTarget {
            traddr: "fd00::1".parse().expect("ip"),
            ..target()
        };
        let s = option_string(&v6, &host(), &ConnectOptions::default()).expect("options");
        assert!(s.contains(",traddr=fd00::1,"), "{s}");
    }

    #[test]
    fn option_string_carries_a_valid_dhchap_secret_only() {
        let secret = DhchapSecret::generate().expect("random");
        let opts = ConnectOptions {
            dhchap_secret: Some(secret.clone()),
            ..ConnectOptions::default()
        };
        let s = option_string(&target(), &host(), &opts).expect("options");
        let kv = parse_kv(&s);
        assert_eq!(kv["dhchap_secret"], secret.expose());
        assert_eq!(s.split(',').count(), 11, "{s}");
        assert!(!format!("{opts:?}").contains(secret.expose()), "Debug hides it");
    }

    #[test]
    fn options_are_bounded() {
        let bad = ConnectOptions {
            nr_io_queues: 129,
            ..Default::default()
        };
        let err = option_string(&target(), &host(), &bad).expect_err("129 queues");
        assert!(err.to_string().contains("nr_io_queues"), "{err}");
        let bad = ConnectOptions {
            ctrl_loss_tmo: Some(1),
            reconnect_delay: 5,
            ..Default::default()
        };
        assert!(option_string(&target(), &host(), &bad).is_err());
        let inf = ConnectOptions {
            ctrl_loss_tmo: None,
            ..Default::default()
        };
        assert!(
            option_string(&target(), &host(), &inf)
                .expect("ok")
                .ends_with(",ctrl_loss_tmo=-1")
        );
    }

    #[test]
    fn parses_replies() {
        assert_eq!(
            ConnectReply::parse("instance=3,cntlid=1\n"),
            Some(ConnectReply {
                instance: 3,
                cntlid: 1
            })
        );
        assert_eq!(ConnectReply::parse("instance=x"), None);
        assert_eq!(ConnectReply::parse(""), None);
        assert_eq!(parse_ns_name("nvme0c1n2"), Some((0, Some(1), 2)));
        assert_eq!(parse_ns_name("nvme3n1"), Some((3, None, 1)));
        assert_eq!(parse_ns_name("nvme3"), None);
        assert_eq!(parse_ns_name("nvme-subsys0"), None);
    }
}
