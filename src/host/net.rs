//! TCP listeners of this host, read from `/proc` through the root handle:
//! who holds a port (error messages of the targets that cannot bind it).
//!
//! ```text
//!   /proc/net/tcp{,6} ──parse_proc_net_tcp (procfs-core)──> LISTEN (address, inode) ─┐
//!   /proc/<pid>/fd/* ──readlink "socket:[inode]"──────────────────────┴─> port_holder: "pid N (comm)"
//! ```

use std::collections::HashSet;
use std::fs;
use std::net::SocketAddr;

use super::HostRoot;

/// Who else listens on TCP `addr` (the same port on the same address, on the
/// any-address, or on any address when `addr`'s is unspecified): "pid N
/// (comm)" of the first process other than `except` found holding such a
/// socket, or "a process talon cannot see" when no process holds it. None when
/// nothing but `except` listens there. Reads `/proc/net/tcp{,6}` (talon's
/// network namespace) and every `/proc/<pid>/fd`: for error paths only.
pub fn port_holder(host: &HostRoot, addr: SocketAddr, except: Option<u32>) -> Option<String> {
    let mut inodes = HashSet::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = fs::read_to_string(host.path(format!("/proc/net/{table}"))) else {
            continue;
        };
        for (a, inode) in parse_proc_net_tcp(&text) {
            let ip_match = a.ip() == addr.ip() || a.ip().is_unspecified() || addr.ip().is_unspecified();
            if a.port() == addr.port() && ip_match {
                inodes.insert(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let mut except_holds = false;
    for p in fs::read_dir(host.path("/proc")).ok()?.flatten() {
        let name = p.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let holds = fds
            .flatten()
            .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| inodes.contains(t.to_string_lossy().as_ref())));
        if holds && Some(pid) == except {
            except_holds = true;
        } else if holds {
            let comm = fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            return Some(format!("pid {pid} ({})", comm.trim()));
        }
    }
    (!except_holds).then(|| "a process talon cannot see".into())
}

/// LISTEN rows of a `/proc/net/tcp` or `tcp6` table: (local address, inode),
/// parsed by `procfs-core` (addresses are 32-bit words in this host's byte
/// order). A table it cannot read gives no rows.
pub fn parse_proc_net_tcp(text: &str) -> Vec<(SocketAddr, String)> {
    use procfs_core::FromReadSI;
    let info = procfs_core::ExplicitSystemInfo {
        // only the byte order is read for these tables
        boot_time_secs: 0,
        ticks_per_second: 100,
        page_size: 4096,
        is_little_endian: cfg!(target_endian = "little"),
    };
    let Ok(table) = procfs_core::net::TcpNetEntries::from_read(text.as_bytes(), &info) else {
        return Vec::new();
    };
    table
        .0
        .into_iter()
        .filter(|e| e.state == procfs_core::net::TcpState::Listen)
        .map(|e| (e.local_address, e.inode.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_listen_rows_of_proc_net_tcp() {
        // 127.0.0.1:13999 LISTEN, 0.0.0.0:3260 LISTEN, one ESTABLISHED row.
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:36AF 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 00000000:0CBC 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4243 1 0000000000000000 100 0 0 10 0
   2: 0100007F:36AF 0100007F:C000 01 00000000:00000000 00:00000000 00000000     0        0 4244 1 0000000000000000 100 0 0 10 0
";
        let rows = parse_proc_net_tcp(v4);
        if cfg!(target_endian = "little") {
            assert_eq!(
                rows,
                vec![
                    ("127.0.0.1:13999".parse().expect("addr"), "4242".to_string()),
                    ("0.0.0.0:3260".parse().expect("addr"), "4243".to_string())
                ]
            );
        }
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:0CBC 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 77 1 0000000000000000 100 0 0 10 0
";
        if cfg!(target_endian = "little") {
            assert_eq!(
                parse_proc_net_tcp(v6),
                vec![("[::1]:3260".parse().expect("addr"), "77".to_string())]
            );
        }
    }
}
