//! A typed wrapper of `tgtadm`, tgtd's management client.
//!
//! ```text
//!   TgtAdm::new_target(&Iqn) ──argv (no shell)──> tgtadm --lld iscsi --op new --mode target ...
//!        │                                             │  TGT_IPC_SOCKET=<run>/tgtd/socket
//!        │                                             v
//!        │                                   tgtd control socket (<socket>.0)
//!   TgtAdm::show() <──parse "Target N: iqn" blocks── tgtadm --op show --mode target
//! ```
//!
//! Every argument reaches tgtadm as one argv element, and every name (IQN,
//! initiator, CHAP user) is validated first, so nothing is interpolated into a
//! command line. tgtd has no online LUN resize (tgtd 1.0.85: `--op update --mode
//! logicalunit --params size=...` is an invalid request, and the size is read
//! once when the backing store opens); [`TgtAdm::reopen_lun`] removes and
//! re-adds the LUN instead, which tgtd refuses while commands are in flight
//! ("this logical unit is still active").

use std::ffi::OsString;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::names::{InvalidName, Iqn};

/// The environment variable that tells tgtd and tgtadm where the control socket is.
pub const IPC_SOCKET_ENV: &str = "TGT_IPC_SOCKET";

/// A tgtd target id (`--tid`), 1 or more.
pub type Tid = u32;

/// An error of one tgtadm operation.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot run {program}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tgtadm could not {action}: {message}")]
    Failed { action: String, message: String },
    #[error("cannot create a target for {iqn}: it already exists as target {tid}")]
    TargetExists { iqn: Iqn, tid: Tid },
    #[error("cannot create a target for {iqn}: every target id up to {max} is taken")]
    NoFreeTid { iqn: Iqn, max: Tid },
    #[error("cannot parse the output of tgtadm --op show at line {line:?}")]
    ParseShow { line: String },
    #[error("invalid CHAP {what}: {reason}")]
    InvalidChap { what: &'static str, reason: String },
}

impl AdminError {
    /// Whether tgtd did not answer (stopping, restarting, not started yet):
    /// a reason to wait, not a final failure. tgtadm 1.0.85 says "failed to
    /// send request hdr to tgt daemon" when nothing listens on the control
    /// socket, "tgtd closed the socket" or "can't get the response" when tgtd
    /// goes away mid-request.
    pub fn tgtd_unreachable(&self) -> bool {
        match self {
            Self::Failed { message, .. } => [
                "to tgt daemon",
                "tgtd closed the socket",
                "can't get the response",
            ]
            .iter()
            .any(|m| message.contains(m)),
            _ => false,
        }
    }
}

/// Who may log in to a target (tgtd's ACL): an address, a subnet, any address,
/// or an initiator name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InitiatorAcl {
    /// Any initiator (`-I ALL`).
    All,
    /// One initiator address.
    Address(IpAddr),
    /// A subnet, `addr/prefix`.
    Subnet { address: IpAddr, prefix: u8 },
    /// An initiator name (`--initiator-name`).
    Name(Iqn),
}

impl InitiatorAcl {
    /// The entry as tgtd lists it under "ACL information" (tgtd 1.0.85 lists
    /// addresses, subnets, `ALL` and initiator names there alike).
    fn to_tgt(&self) -> String {
        match self {
            Self::All => "ALL".to_string(),
            Self::Address(a) => a.to_string(),
            Self::Subnet { address, prefix } => format!("{address}/{prefix}"),
            Self::Name(n) => n.to_string(),
        }
    }

    fn args(&self) -> [OsString; 2] {
        match self {
            Self::Name(n) => ["--initiator-name".into(), n.as_str().into()],
            other => ["--initiator-address".into(), other.to_tgt().into()],
        }
    }

    /// Checks a subnet prefix length.
    pub fn subnet(address: IpAddr, prefix: u8) -> Result<Self, InvalidName> {
        let max = if address.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(InvalidName {
                what: "initiator subnet",
                value: format!("{address}/{prefix}"),
                reason: format!("prefix longer than {max} bits"),
            });
        }
        Ok(Self::Subnet { address, prefix })
    }
}

impl fmt::Display for InitiatorAcl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_tgt())
    }
}

/// A CHAP user name: `[A-Za-z0-9._:-]`, 1 to 64 characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ChapUser(String);

impl ChapUser {
    /// Validates a CHAP user name.
    pub fn parse(value: &str) -> Result<Self, AdminError> {
        if value.is_empty() || value.len() > 64 {
            return Err(AdminError::InvalidChap {
                what: "user",
                reason: format!("{value:?} must have 1 to 64 characters"),
            });
        }
        if let Some(c) = value
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_')))
        {
            return Err(AdminError::InvalidChap {
                what: "user",
                reason: format!("character {c:?} in {value:?} is not allowed"),
            });
        }
        Ok(Self(value.to_string()))
    }

    /// The user name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ChapUser {
    type Error = AdminError;
    fn try_from(s: String) -> Result<Self, AdminError> {
        Self::parse(&s)
    }
}

impl From<ChapUser> for String {
    fn from(u: ChapUser) -> String {
        u.0
    }
}

impl fmt::Display for ChapUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A CHAP secret: 12 to 255 printable ASCII characters without spaces (RFC 3720
/// asks for at least 12 bytes; open-iscsi rejects shorter ones). Its `Debug`
/// hides the value, and errors never contain it. It never reaches tgtadm's
/// argv (visible in `/proc/<pid>/cmdline` to every local user): talon sends
/// it to tgtd over the control socket ([`TgtAdm::new_account`]).
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ChapSecret(String);

impl ChapSecret {
    /// Validates a CHAP secret.
    pub fn parse(value: &str) -> Result<Self, AdminError> {
        if value.len() < 12 || value.len() > 255 {
            return Err(AdminError::InvalidChap {
                what: "secret",
                reason: format!("it has {} characters, not 12 to 255", value.len()),
            });
        }
        if value.chars().any(|c| !c.is_ascii_graphic()) {
            return Err(AdminError::InvalidChap {
                what: "secret",
                reason: "only printable ASCII without spaces is allowed".to_string(),
            });
        }
        Ok(Self(value.to_string()))
    }

    /// The secret (to hand to tgtadm or an initiator).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ChapSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ChapSecret(***)")
    }
}

impl TryFrom<String> for ChapSecret {
    type Error = AdminError;
    fn try_from(s: String) -> Result<Self, AdminError> {
        Self::parse(&s)
    }
}

impl From<ChapSecret> for String {
    fn from(s: ChapSecret) -> String {
        s.0
    }
}

/// One connection of an I_T nexus.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Connection {
    /// The connection id.
    pub cid: u32,
    /// The initiator's address.
    pub address: String,
}

/// A logged-in session (tgtd's "I_T nexus").
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Nexus {
    /// tgtd's nexus id.
    pub id: u64,
    /// The initiator name.
    pub initiator: String,
    /// The initiator's connections.
    pub connections: Vec<Connection>,
}

impl fmt::Display for Nexus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (nexus {}", self.initiator, self.id)?;
        for c in &self.connections {
            write!(f, " from {}", c.address)?;
        }
        f.write_str(")")
    }
}

/// A logical unit of a target.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LunInfo {
    /// The LUN (0 is tgtd's controller LUN).
    pub lun: u64,
    /// "disk", "controller", ...
    pub kind: String,
    /// The size as tgtd prints it: decimal megabytes, rounded down (tgtd shows
    /// no exact size; stat the backing file for that).
    pub size_mb: u64,
    /// The logical block size in bytes.
    pub block_size: u32,
    /// Whether the LUN is online.
    pub online: bool,
    /// Whether the LUN is read-only.
    pub readonly: bool,
    /// The backing store type ("rdwr", "null", ...).
    pub backing_type: String,
    /// The backing file, if any.
    pub backing_path: Option<PathBuf>,
}

/// A target as `tgtadm --op show --mode target` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TargetInfo {
    /// The target id.
    pub tid: Tid,
    /// The target name (an IQN, not revalidated: another tool may have made it).
    pub name: String,
    /// "ready", "offline", ...
    pub state: String,
    /// Logged-in sessions.
    pub nexuses: Vec<Nexus>,
    /// Logical units, LUN 0 (the controller) included.
    pub luns: Vec<LunInfo>,
    /// Bound CHAP accounts (incoming); outgoing ones end in " (outgoing)".
    pub accounts: Vec<String>,
    /// ACL entries: addresses, subnets, "ALL" and initiator names.
    pub acl: Vec<String>,
}

impl TargetInfo {
    /// The LUN `lun`, if present.
    pub fn lun(&self, lun: u64) -> Option<&LunInfo> {
        self.luns.iter().find(|l| l.lun == lun)
    }
}

/// The tgtadm client of one tgtd (one control socket).
#[derive(Debug, Clone)]
pub struct TgtAdm {
    program: PathBuf,
    socket: PathBuf,
    /// The target id [`TgtAdm::new_target`] tries first (shared by clones):
    /// one past the last one it made, so a create lists no targets unless that
    /// id turns out to be taken.
    next_tid: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

/// The highest target id talon allocates.
pub const MAX_TID: Tid = 4096;

impl TgtAdm {
    /// A client of the tgtd whose control socket base path is `socket` (tgtd
    /// appends ".0"), running `tgtadm` from PATH.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            program: PathBuf::from("tgtadm"),
            socket: socket.into(),
            next_tid: std::sync::Arc::new(std::sync::atomic::AtomicU32::new(1)),
        }
    }

    /// Uses another tgtadm binary.
    pub fn with_program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = program.into();
        self
    }

    /// The control socket base path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn run(&self, action: impl FnOnce() -> String, args: Vec<OsString>) -> Result<String, AdminError> {
        let out = Command::new(&self.program)
            .env(IPC_SOCKET_ENV, &self.socket)
            .arg("--lld")
            .arg("iscsi")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| AdminError::Spawn {
                program: self.program.clone(),
                source,
            })?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let mut message = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if let Some(m) = message.strip_prefix("tgtadm: ") {
            message = m.to_string();
        }
        if message.is_empty() {
            message = format!("exited with {}", out.status);
        }
        Err(AdminError::Failed {
            action: action(),
            message,
        })
    }

    /// Whether tgtd answers on the control socket.
    pub fn ping(&self) -> Result<(), AdminError> {
        self.run(
            || "show the system".into(),
            args(&["--op", "show", "--mode", "system"]),
        )
        .map(drop)
    }

    /// Every target with its LUNs, sessions, accounts and ACL.
    pub fn show(&self) -> Result<Vec<TargetInfo>, AdminError> {
        let out = self.run(
            || "show the targets".into(),
            args(&["--op", "show", "--mode", "target"]),
        )?;
        parse_show(&out)
    }

    /// The target named `iqn`, if any.
    pub fn find_target(&self, iqn: &Iqn) -> Result<Option<TargetInfo>, AdminError> {
        Ok(self.show()?.into_iter().find(|t| t.name == iqn.as_str()))
    }

    /// Creates a target named `iqn` with a free target id. Its cost does not
    /// grow with the number of targets: it tries the id after the last one
    /// made, and lists the targets only when tgtd says that id (or the name)
    /// is taken, then takes the lowest free id after the hint (or from 1).
    pub fn new_target(&self, iqn: &Iqn) -> Result<Tid, AdminError> {
        use std::sync::atomic::Ordering;
        let hint = self.next_tid.load(Ordering::Relaxed).clamp(1, MAX_TID);
        match self.new_target_with_tid(hint, iqn) {
            Ok(()) => {
                self.next_tid.store(hint + 1, Ordering::Relaxed);
                return Ok(hint);
            }
            Err(AdminError::Failed { message, .. }) if message.contains("this target already exists") => {}
            Err(e) => return Err(e),
        }
        let targets = self.show()?;
        if let Some(t) = targets.iter().find(|t| t.name == iqn.as_str()) {
            return Err(AdminError::TargetExists {
                iqn: iqn.clone(),
                tid: t.tid,
            });
        }
        let free = |tid: &Tid| targets.iter().all(|t| t.tid != *tid);
        let tid = (hint..=MAX_TID)
            .find(free)
            .or_else(|| (1..hint).find(free))
            .ok_or_else(|| AdminError::NoFreeTid {
                iqn: iqn.clone(),
                max: MAX_TID,
            })?;
        self.new_target_with_tid(tid, iqn)?;
        self.next_tid.store(tid + 1, Ordering::Relaxed);
        Ok(tid)
    }

    /// Creates a target with a given id.
    pub fn new_target_with_tid(&self, tid: Tid, iqn: &Iqn) -> Result<(), AdminError> {
        let mut a = args(&["--op", "new", "--mode", "target", "--tid"]);
        a.push(tid.to_string().into());
        a.push("--targetname".into());
        a.push(iqn.as_str().into());
        self.run(|| format!("create target {tid} ({iqn})"), a).map(drop)
    }

    /// Deletes a target; with `force`, even with sessions logged in.
    pub fn delete_target(&self, tid: Tid, force: bool) -> Result<(), AdminError> {
        let mut a = args(&["--op", "delete", "--mode", "target", "--tid"]);
        a.push(tid.to_string().into());
        if force {
            a.push("--force".into());
        }
        self.run(|| format!("delete target {tid}"), a).map(drop)
    }

    /// Adds a LUN backed by a file (`--bstype rdwr`).
    pub fn new_lun(&self, tid: Tid, lun: u64, path: &Path) -> Result<(), AdminError> {
        let mut a = args(&["--op", "new", "--mode", "logicalunit", "--tid"]);
        a.push(tid.to_string().into());
        a.push("--lun".into());
        a.push(lun.to_string().into());
        a.push("--backing-store".into());
        a.push(path.as_os_str().into());
        a.push("--bstype".into());
        a.push("rdwr".into());
        self.run(
            || format!("add LUN {lun} backed by {} to target {tid}", path.display()),
            a,
        )
        .map(drop)
    }

    /// Removes a LUN (tgtd refuses while commands are in flight).
    pub fn delete_lun(&self, tid: Tid, lun: u64) -> Result<(), AdminError> {
        let mut a = args(&["--op", "delete", "--mode", "logicalunit", "--tid"]);
        a.push(tid.to_string().into());
        a.push("--lun".into());
        a.push(lun.to_string().into());
        self.run(|| format!("delete LUN {lun} of target {tid}"), a)
            .map(drop)
    }

    /// Makes tgtd read the size of a LUN's backing file again: removes and
    /// re-adds the LUN (tgtd has no online resize). If the re-add fails the LUN
    /// is gone; the error says so.
    pub fn reopen_lun(&self, tid: Tid, lun: u64, path: &Path) -> Result<(), AdminError> {
        self.delete_lun(tid, lun)?;
        self.new_lun(tid, lun, path).map_err(|e| AdminError::Failed {
            action: format!("re-add LUN {lun} of target {tid} after removing it (the LUN is now missing)"),
            message: e.to_string(),
        })
    }

    /// Allows an initiator address, subnet or name to log in.
    pub fn bind(&self, tid: Tid, acl: &InitiatorAcl) -> Result<(), AdminError> {
        let mut a = args(&["--op", "bind", "--mode", "target", "--tid"]);
        a.push(tid.to_string().into());
        a.extend(acl.args());
        self.run(|| format!("allow initiator {acl} on target {tid}"), a)
            .map(drop)
    }

    /// Removes an ACL entry.
    pub fn unbind(&self, tid: Tid, acl: &InitiatorAcl) -> Result<(), AdminError> {
        let mut a = args(&["--op", "unbind", "--mode", "target", "--tid"]);
        a.push(tid.to_string().into());
        a.extend(acl.args());
        self.run(|| format!("remove initiator {acl} from target {tid}"), a)
            .map(drop)
    }

    /// Creates a CHAP account (global in tgtd). Not through tgtadm: its argv
    /// would show the secret to every local user; talon sends the request on
    /// tgtd's control socket itself ([`super::ipc`]).
    pub fn new_account(&self, user: &ChapUser, secret: &ChapSecret) -> Result<(), AdminError> {
        let mut params = format!("user={},password={}", user.as_str(), secret.expose()).into_bytes();
        let done = super::ipc::request(
            &self.socket,
            super::ipc::MODE_ACCOUNT,
            super::ipc::OP_NEW,
            0,
            &params,
        );
        params.iter_mut().for_each(|b| *b = 0);
        done.map(drop).map_err(|e| AdminError::Failed {
            action: format!("create CHAP account {user}"),
            message: match &e {
                super::ipc::IpcError::Io { .. } => {
                    format!("cannot talk to tgt daemon: {}", crate::util::error_chain(&e))
                }
                other => other.to_string(),
            },
        })
    }

    /// Deletes a CHAP account.
    pub fn delete_account(&self, user: &ChapUser) -> Result<(), AdminError> {
        let mut a = args(&["--op", "delete", "--mode", "account", "--user"]);
        a.push(user.as_str().into());
        self.run(|| format!("delete CHAP account {user}"), a).map(drop)
    }

    /// The CHAP accounts tgtd knows.
    pub fn accounts(&self) -> Result<Vec<String>, AdminError> {
        let out = self.run(
            || "show the CHAP accounts".into(),
            args(&["--op", "show", "--mode", "account"]),
        )?;
        Ok(out
            .lines()
            .skip_while(|l| !l.starts_with("Account list"))
            .skip(1)
            .map(|l| l.trim().to_string())
            .collect())
    }

    /// Binds an account to a target: incoming (the initiator authenticates), or
    /// outgoing (mutual CHAP: the target authenticates).
    pub fn bind_account(&self, tid: Tid, user: &ChapUser, outgoing: bool) -> Result<(), AdminError> {
        let mut a = args(&["--op", "bind", "--mode", "account", "--tid"]);
        a.push(tid.to_string().into());
        a.push("--user".into());
        a.push(user.as_str().into());
        if outgoing {
            a.push("--outgoing".into());
        }
        self.run(|| format!("bind CHAP account {user} to target {tid}"), a)
            .map(drop)
    }

    /// Unbinds an account from a target.
    pub fn unbind_account(&self, tid: Tid, user: &ChapUser, outgoing: bool) -> Result<(), AdminError> {
        let mut a = args(&["--op", "unbind", "--mode", "account", "--tid"]);
        a.push(tid.to_string().into());
        a.push("--user".into());
        a.push(user.as_str().into());
        if outgoing {
            a.push("--outgoing".into());
        }
        self.run(|| format!("unbind CHAP account {user} from target {tid}"), a)
            .map(drop)
    }

    /// Closes one connection of a session (the nexus id is tgtd's session id,
    /// the TSIH): the initiator sees its TCP connection end and must log in
    /// again, which the ACL and CHAP then decide.
    pub fn close_connection(&self, tid: Tid, nexus: u64, cid: u32) -> Result<(), AdminError> {
        let mut a = args(&["--op", "delete", "--mode", "connection", "--tid"]);
        a.push(tid.to_string().into());
        a.push("--sid".into());
        a.push(nexus.to_string().into());
        a.push("--cid".into());
        a.push(cid.to_string().into());
        self.run(
            || format!("close connection {cid} of session {nexus} on target {tid}"),
            a,
        )
        .map(drop)
    }

    /// Asks tgtd to exit (it refuses while targets exist; tgtd ignores SIGTERM).
    pub fn delete_system(&self) -> Result<(), AdminError> {
        self.run(
            || "shut tgtd down".into(),
            args(&["--op", "delete", "--mode", "system"]),
        )
        .map(drop)
    }
}

fn args(a: &[&str]) -> Vec<OsString> {
    a.iter().map(OsString::from).collect()
}

/// Where a line of `show --mode target` belongs.
#[derive(Clone, Copy, PartialEq)]
enum Section {
    None,
    System,
    Nexus,
    Lun,
    Account,
    Acl,
}

/// Parses the output of `tgtadm --op show --mode target`.
pub fn parse_show(out: &str) -> Result<Vec<TargetInfo>, AdminError> {
    let bad = |line: &str| AdminError::ParseShow {
        line: line.to_string(),
    };
    let mut targets: Vec<TargetInfo> = Vec::new();
    let mut section = Section::None;
    for raw in out.lines() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = raw.strip_prefix("Target ") {
            let (tid, name) = rest.split_once(": ").ok_or_else(|| bad(raw))?;
            targets.push(TargetInfo {
                tid: tid.parse().map_err(|_| bad(raw))?,
                name: name.trim().to_string(),
                state: String::new(),
                nexuses: Vec::new(),
                luns: Vec::new(),
                accounts: Vec::new(),
                acl: Vec::new(),
            });
            section = Section::None;
            continue;
        }
        let t = targets.last_mut().ok_or_else(|| bad(raw))?;
        match line {
            "System information:" => section = Section::System,
            "I_T nexus information:" => section = Section::Nexus,
            "LUN information:" => section = Section::Lun,
            "Account information:" => section = Section::Account,
            "ACL information:" => section = Section::Acl,
            _ => {
                let kv = line.split_once(':').map(|(k, v)| (k.trim(), v.trim()));
                match (section, kv) {
                    (Section::System, Some(("State", v))) => t.state = v.to_string(),
                    (Section::System, _) => {}
                    (Section::Nexus, Some(("I_T nexus", v))) => t.nexuses.push(Nexus {
                        id: v.parse().map_err(|_| bad(raw))?,
                        initiator: String::new(),
                        connections: Vec::new(),
                    }),
                    (Section::Nexus, Some(("Initiator", v))) => {
                        let n = t.nexuses.last_mut().ok_or_else(|| bad(raw))?;
                        n.initiator = v.split(" alias:").next().unwrap_or(v).trim().to_string();
                    }
                    (Section::Nexus, Some(("Connection", v))) => {
                        let n = t.nexuses.last_mut().ok_or_else(|| bad(raw))?;
                        n.connections.push(Connection {
                            cid: v.parse().map_err(|_| bad(raw))?,
                            address: String::new(),
                        });
                    }
                    (Section::Nexus, Some(("IP Address", v))) => {
                        let c = t
                            .nexuses
                            .last_mut()
                            .and_then(|n| n.connections.last_mut())
                            .ok_or_else(|| bad(raw))?;
                        c.address = v.to_string();
                    }
                    (Section::Nexus, _) => {}
                    (Section::Lun, Some(("LUN", v))) => t.luns.push(LunInfo {
                        lun: v.parse().map_err(|_| bad(raw))?,
                        kind: String::new(),
                        size_mb: 0,
                        block_size: 0,
                        online: false,
                        readonly: false,
                        backing_type: String::new(),
                        backing_path: None,
                    }),
                    (Section::Lun, Some((k, v))) => {
                        let l = t.luns.last_mut().ok_or_else(|| bad(raw))?;
                        match k {
                            "Type" => l.kind = v.to_string(),
                            "Size" => {
                                // "67 MB, Block size: 512"
                                let (size, bs) = v.split_once(", Block size:").ok_or_else(|| bad(raw))?;
                                let mb = size.trim().strip_suffix("MB").ok_or_else(|| bad(raw))?;
                                l.size_mb = mb.trim().parse().map_err(|_| bad(raw))?;
                                l.block_size = bs.trim().parse().map_err(|_| bad(raw))?;
                            }
                            "Online" => l.online = v == "Yes",
                            "Readonly" => l.readonly = v == "Yes",
                            "Backing store type" => l.backing_type = v.to_string(),
                            "Backing store path" => {
                                l.backing_path = (v != "None" && !v.is_empty()).then(|| PathBuf::from(v));
                            }
                            _ => {}
                        }
                    }
                    (Section::Account, _) => t.accounts.push(line.to_string()),
                    (Section::Acl, _) => t.acl.push(line.to_string()),
                    _ => return Err(bad(raw)),
                }
            }
        }
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOW: &str = "Target 1: iqn.2025-01.io.talon:a
    System information:
        Driver: iscsi
        State: ready
    I_T nexus information:
        I_T nexus: 6
            Initiator: iqn.2010-11.libiscsi:iscsi-perf alias: none
            Connection: 0
                IP Address: 127.0.0.1
    LUN information:
        LUN: 0
            Type: controller
            SCSI ID: IET     00010000
            SCSI SN: beaf10
            Size: 0 MB, Block size: 1
            Online: Yes
            Removable media: No
            Prevent removal: No
            Readonly: No
            SWP: No
            Thin-provisioning: No
            Backing store type: null
            Backing store path: None
            Backing store flags: 
        LUN: 1
            Type: disk
            SCSI ID: IET     00010001
            SCSI SN: beaf11
            Size: 67 MB, Block size: 512
            Online: Yes
            Removable media: No
            Prevent removal: No
            Readonly: No
            SWP: No
            Thin-provisioning: No
            Backing store type: rdwr
            Backing store path: /tmp/tgtx/a.img
            Backing store flags: 
    Account information:
        alice
        bob (outgoing)
    ACL information:
        127.0.0.1
        iqn.2025-01.io.example:host
Target 2: iqn.2025-01.io.talon:b
    System information:
        Driver: iscsi
        State: ready
    I_T nexus information:
    LUN information:
        LUN: 0
            Type: controller
            SCSI ID: IET     00020000
            SCSI SN: beaf20
            Size: 0 MB, Block size: 1
            Online: Yes
            Removable media: No
            Prevent removal: No
            Readonly: No
            SWP: No
            Thin-provisioning: No
            Backing store type: null
            Backing store path: None
            Backing store flags: 
    Account information:
    ACL information:
";

    #[test]
    fn parses_show_output_of_tgtd_1_0_85() {
        let t = parse_show(SHOW).expect("parse");
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].tid, t[0].name.as_str(), t[0].state.as_str()),
            (1, "iqn.2025-01.io.talon:a", "ready")
        );
        assert_eq!(t[0].nexuses.len(), 1);
        assert_eq!(t[0].nexuses[0].initiator, "iqn.2010-11.libiscsi:iscsi-perf");
        assert_eq!(
            t[0].nexuses[0].connections,
            vec![Connection {
                cid: 0,
                address: "127.0.0.1".into()
            }]
        );
        let l1 = t[0].lun(1).expect("lun 1");
        assert_eq!((l1.size_mb, l1.block_size, l1.kind.as_str()), (67, 512, "disk"));
        assert_eq!(l1.backing_path.as_deref(), Some(Path::new("/tmp/tgtx/a.img")));
        assert_eq!(t[0].lun(0).expect("lun 0").backing_path, None);
        assert_eq!(t[0].accounts, vec!["alice", "bob (outgoing)"]);
        assert_eq!(t[0].acl, vec!["127.0.0.1", "iqn.2025-01.io.example:host"]);
        assert!(t[1].nexuses.is_empty() && t[1].acl.is_empty() && t[1].luns.len() == 1);
        assert_eq!(parse_show("").expect("empty").len(), 0);
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(parse_show("hello\n"), Err(AdminError::ParseShow { .. })));
        assert!(matches!(
            parse_show("Target x: iqn.a\n"),
            Err(AdminError::ParseShow { .. })
        ));
    }

    #[test]
    fn chap_names_and_secrets_are_checked() {
        assert!(ChapUser::parse("user-1").is_ok());
        assert!(ChapUser::parse("a b").is_err());
        assert!(ChapUser::parse("").is_err());
        assert!(ChapSecret::parse("short").is_err());
        assert!(ChapSecret::parse("twelve chars!").is_err());
        let s = ChapSecret::parse("0123456789ab").expect("secret");
        assert_eq!(format!("{s:?}"), "ChapSecret(***)");
        let e = ChapSecret::parse("hunter2").expect_err("short");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn acl_arguments() {
        let a = InitiatorAcl::Address("127.0.0.1".parse().expect("ip"));
        assert_eq!(
            a.args(),
            [OsString::from("--initiator-address"), OsString::from("127.0.0.1")]
        );
        let s = InitiatorAcl::subnet("10.0.0.0".parse().expect("ip"), 8).expect("subnet");
        assert_eq!(s.to_string(), "10.0.0.0/8");
        assert!(InitiatorAcl::subnet("10.0.0.0".parse().expect("ip"), 33).is_err());
        let n = InitiatorAcl::Name(Iqn::parse("iqn.2025-01.io.example:h").expect("iqn"));
        assert_eq!(n.args()[0], OsString::from("--initiator-name"));
        assert_eq!(InitiatorAcl::All.to_string(), "ALL");
    }
}
