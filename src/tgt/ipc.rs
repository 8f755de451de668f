//! tgtd's management protocol, spoken directly over its control socket, for
//! the one request that carries a secret: creating a CHAP account.
//!
//! ```text
//!   TgtAdm::new_account(user, secret)
//!     │ connect <socket>.0 (AF_UNIX; tgtd checks the peer's uid/gid = its own)
//!     │ write struct tgtadm_req {mode ACCOUNT, op NEW, lld "iscsi", len, ...} (120 bytes)
//!     │ write "user=<user>,password=<secret>\0"
//!     v
//!   tgtd: account_add(user, password) ──> struct tgtadm_rsp {err, len} (+ text)
//! ```
//!
//! `tgtadm --op new --mode account --password S` puts the secret in tgtadm's
//! argv, which every local user can read in `/proc/<pid>/cmdline` while it
//! runs. The protocol (tgt 1.0.85 `usr/tgtadm.h`, `usr/mgmt.c`) is a fixed
//! header and a comma-separated parameter string; talon writes it itself, so
//! the secret goes from talon's memory to tgtd's through a socket only the
//! owner of tgtd may use. Every other request still goes through tgtadm.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `enum tgtadm_mode` value of `MODE_ACCOUNT`.
pub const MODE_ACCOUNT: u32 = 7;
/// `enum tgtadm_op` value of `OP_NEW`.
pub const OP_NEW: u32 = 0;
/// `sizeof(struct tgtadm_req)` on Linux (x86_64 and aarch64 alike: natural alignment).
pub const REQ_LEN: usize = 120;
/// `TGT_LLD_NAME_LEN`.
const LLD_NAME_LEN: usize = 64;
/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// An error of one request on tgtd's control socket. Never contains the
/// parameters (they may hold a secret).
#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    #[error("cannot talk to tgtd on {socket}")]
    Io {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tgtd refused the request: {message}")]
    Refused { code: u32, message: &'static str },
}

/// tgtd's error texts (`usr/tgtadm_error.h` order, `tgtadm_strerror` texts).
pub fn strerror(code: u32) -> &'static str {
    const TEXTS: [&str; 25] = [
        "success",
        "unknown error",
        "out of memory",
        "can't find the driver",
        "can't find the target",
        "can't find the logical unit",
        "can't find the session",
        "can't find the connection",
        "can't find the binding",
        "this target already exists",
        "this logical unit number already exists",
        "this binding already exists",
        "this access control rule already exists",
        "this access control rule does not exist",
        "this account already exists",
        "can't find the account",
        "too many accounts",
        "invalid request",
        "this target already has an outgoing account",
        "this target is still active",
        "this logical unit is still active",
        "this driver is busy",
        "this operation isn't supported",
        "unknown parameter",
        "this device has Prevent Removal set",
    ];
    TEXTS.get(code as usize).copied().unwrap_or("unknown error")
}

/// The request header for `mode`/`op` with `params_len` bytes of parameters.
pub fn header(mode: u32, op: u32, tid: i32, params_len: usize) -> [u8; REQ_LEN] {
    let mut h = [0u8; REQ_LEN];
    h[0..4].copy_from_slice(&mode.to_ne_bytes());
    h[4..8].copy_from_slice(&op.to_ne_bytes());
    let lld = b"iscsi";
    h[8..8 + lld.len()].copy_from_slice(lld);
    let len = (REQ_LEN + params_len) as u32;
    h[8 + LLD_NAME_LEN..12 + LLD_NAME_LEN].copy_from_slice(&len.to_ne_bytes());
    h[12 + LLD_NAME_LEN..16 + LLD_NAME_LEN].copy_from_slice(&tid.to_ne_bytes());
    // sid, lun, cid, host_no, device_type, ac_dir, pack, force: 0
    h
}

/// Sends one request (`params` without the trailing NUL, which is added) to
/// the tgtd whose control socket base path is `socket` and returns the text
/// it answers with.
pub fn request(socket: &Path, mode: u32, op: u32, tid: i32, params: &[u8]) -> Result<String, IpcError> {
    let path = PathBuf::from(format!("{}.0", socket.display()));
    let io = |source| IpcError::Io {
        socket: path.clone(),
        source,
    };
    let mut s = UnixStream::connect(&path).map_err(io)?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    let mut msg = Vec::with_capacity(REQ_LEN + params.len() + 1);
    msg.extend_from_slice(&header(mode, op, tid, params.len() + 1));
    msg.extend_from_slice(params);
    msg.push(0);
    let sent = s.write_all(&msg);
    // the copy holding the parameters is wiped whether or not it was sent
    msg.iter_mut().for_each(|b| *b = 0);
    sent.map_err(io)?;
    let mut rsp = [0u8; 8];
    s.read_exact(&mut rsp).map_err(io)?;
    let code = u32::from_ne_bytes([rsp[0], rsp[1], rsp[2], rsp[3]]);
    let len = u32::from_ne_bytes([rsp[4], rsp[5], rsp[6], rsp[7]]) as usize;
    if code != 0 {
        return Err(IpcError::Refused {
            code,
            message: strerror(code),
        });
    }
    let mut body = Vec::new();
    if len > rsp.len() {
        (&mut s)
            .take((len - rsp.len()) as u64)
            .read_to_end(&mut body)
            .map_err(io)?;
    }
    let text = String::from_utf8_lossy(&body);
    Ok(text.trim_end_matches('\0').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_matches_struct_tgtadm_req() {
        let h = header(MODE_ACCOUNT, OP_NEW, -1, 10);
        assert_eq!(u32::from_ne_bytes(h[0..4].try_into().expect("4")), 7);
        assert_eq!(u32::from_ne_bytes(h[4..8].try_into().expect("4")), 0);
        assert_eq!(&h[8..14], b"iscsi\0");
        // len after lld[64]: header + params
        assert_eq!(u32::from_ne_bytes(h[72..76].try_into().expect("4")), 130);
        assert_eq!(i32::from_ne_bytes(h[76..80].try_into().expect("4")), -1);
        assert!(h[80..].iter().all(|b| *b == 0));
    }

    #[test]
    fn error_texts() {
        assert_eq!(strerror(14), "this account already exists");
        assert_eq!(strerror(17), "invalid request");
        assert_eq!(strerror(99), "unknown error");
    }
}
