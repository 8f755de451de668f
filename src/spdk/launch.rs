//! How a target is launched, below both ways of running one: its settings
//! ([`TargetConfig`]), its errors, where the binary is, and the readiness
//! probe. [`super::target`] (spawn/adopt/supervise) and [`super::embedded`]
//! (in-process) both build on this module; neither imports the other's
//! internals (the target holds the embedded framework, one way).
//!
//! ```text
//!   TargetConfig ──find_spdk_tgt / argv──> target.rs: spawn, adopt, supervise ─┐
//!        └──────── options ──────────────> embedded.rs: in-process framework ──┴─> wait_ready / probe
//! ```

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::process::Child;

use super::client::{ClientError, SpdkClient};
use super::rpc::{GetConfig, NVME_KEEP_ALIVE_MS, NvmeOptions, Version};
use crate::util::Backoff;

/// Errors of target supervision.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// No spdk_tgt binary was found.
    #[error("spdk_tgt was not found in {searched}")]
    NotFound {
        /// The places looked in, each once (an explicit binary: its path).
        searched: String,
    },
    /// The run dir could not be created.
    #[error("Creating the run dir {path} failed")]
    RunDir {
        /// The run dir.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The process could not be started.
    #[error("Starting {path} failed")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The process exited before it answered on its socket; `cause` is what
    /// its log says about it ([`start_failure_cause`]).
    #[error("spdk_tgt (pid {pid}) exited with {status} before answering on {socket}: {cause}")]
    ExitedEarly {
        /// Its pid.
        pid: u32,
        /// Its exit status.
        status: String,
        /// The socket.
        socket: PathBuf,
        /// Why, from its log (or the log's last lines and path).
        cause: String,
    },
    /// No answer within the readiness timeout.
    #[error("spdk_tgt did not answer on {socket} within {timeout:?}")]
    NotReady {
        /// The socket.
        socket: PathBuf,
        /// The timeout.
        timeout: Duration,
        /// The last probe error.
        #[source]
        last: Option<ClientError>,
    },
    /// An in-process target was asked for, but this build has no SPDK.
    #[error(
        "this talon was built without the spdk-embedded feature; rebuild with --features spdk-embedded \
         or use --engine v2"
    )]
    EmbeddedNotBuilt,
    /// The in-process framework already ran in this process.
    #[error(
        "the in-process SPDK target on {socket} already ran in this talon ({how}); DPDK cannot be \
         initialized twice in one process, so it is not restarted: restart talon"
    )]
    EmbeddedAlreadyRan {
        /// The socket.
        socket: PathBuf,
        /// How it ended.
        how: String,
    },
    /// A setting has no in-process form (or holds a NUL byte).
    #[error("the in-process SPDK target cannot take the {name} {value:?}")]
    EmbeddedOption {
        /// Which setting.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// The reactor thread could not be started.
    #[error("Starting the SPDK reactor thread for {socket} failed")]
    EmbeddedThread {
        /// The socket.
        socket: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The in-process framework stopped before it answered.
    #[error(
        "the in-process SPDK target for {socket} stopped before answering (spdk_app_start returned {rc}; \
         SPDK's log on stderr says why)"
    )]
    EmbeddedExited {
        /// The socket.
        socket: PathBuf,
        /// `spdk_app_start`'s result.
        rc: i32,
    },
    /// Another target answers on the socket an in-process one needs.
    #[error(
        "another SPDK target (pid {pid:?}) already answers on {socket}; stop it, or run with --engine v2 \
         to adopt it"
    )]
    SocketInUse {
        /// The socket.
        socket: PathBuf,
        /// Its pid, when known.
        pid: Option<i32>,
    },
    /// A signal could not be sent.
    #[error("Signalling spdk_tgt pid {pid} with {signal} failed")]
    Signal {
        /// The pid.
        pid: i32,
        /// The signal.
        signal: Signal,
        /// The error.
        #[source]
        source: nix::Error,
    },
    /// Waiting for the process failed.
    #[error("Waiting for spdk_tgt pid {pid} failed")]
    Wait {
        /// The pid.
        pid: u32,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl TargetError {
    /// Whether trying again cannot help (an in-process target that already
    /// ran, or a build without one): report it, do not retry.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            TargetError::EmbeddedNotBuilt
                | TargetError::EmbeddedAlreadyRan { .. }
                | TargetError::EmbeddedOption { .. }
        )
    }
}

/// Where SPDK's memory comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Memory {
    /// Hugepages; `mem_size_mib` None sizes it from the number of volumes.
    Hugepages {
        /// `-s` in MiB.
        mem_size_mib: Option<u64>,
    },
    /// `--no-huge -s N` (development and tests).
    NoHuge {
        /// `-s` in MiB.
        mem_size_mib: u64,
    },
}

/// How to run spdk_tgt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    /// An explicit binary (`--spdk-tgt PATH`); searched for when None.
    pub spdk_tgt: Option<PathBuf>,
    /// `$TALON_SPDK_DIR`: its `build/bin/spdk_tgt` is the second choice.
    pub spdk_dir: Option<PathBuf>,
    /// The run dir; the RPC socket is `<run_dir>/spdk.sock`.
    pub run_dir: PathBuf,
    /// `-m` cpumask, e.g. "0x1".
    pub cpumask: String,
    /// Memory.
    pub memory: Memory,
    /// Volumes exported (sizes hugepage memory).
    pub exported_volumes: u32,
    /// PCI NVMe disks are configured (otherwise `-u`).
    pub pci_disks: bool,
    /// `--interrupt-mode` (no busy polling).
    pub interrupt_mode: bool,
    /// More arguments, appended as given.
    pub extra_args: Vec<OsString>,
    /// How long to wait for the first answer.
    pub ready_timeout: Duration,
    /// SIGINT to SIGKILL grace period.
    pub stop_grace: Duration,
    /// Run the SPDK framework in-process (`--engine spdk-embedded`) instead
    /// of spawning spdk_tgt.
    pub embedded: bool,
}

impl TargetConfig {
    /// Defaults: core 0, hugepages sized from volumes, no PCI, 60 s readiness,
    /// 10 s grace (SPDK takes 1-2.5 s to stop on SIGINT).
    pub fn new(run_dir: impl Into<PathBuf>) -> Self {
        TargetConfig {
            spdk_tgt: None,
            spdk_dir: std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from),
            run_dir: run_dir.into(),
            cpumask: "0x1".into(),
            memory: Memory::Hugepages { mem_size_mib: None },
            exported_volumes: 0,
            pci_disks: false,
            interrupt_mode: false,
            extra_args: Vec::new(),
            ready_timeout: Duration::from_secs(60),
            stop_grace: Duration::from_secs(10),
            embedded: false,
        }
    }

    /// The RPC socket.
    pub fn socket(&self) -> PathBuf {
        self.run_dir.join("spdk.sock")
    }

    /// spdk_tgt's stdout and stderr (started afresh by each spawn; a target
    /// that outlives talon goes on writing there).
    pub fn log_path(&self) -> PathBuf {
        self.run_dir.join("spdk_tgt.log")
    }

    /// The `-s` value in MiB.
    pub fn mem_size_mib(&self) -> u64 {
        match self.memory {
            Memory::Hugepages {
                mem_size_mib: Some(m),
            }
            | Memory::NoHuge { mem_size_mib: m } => m,
            Memory::Hugepages { mem_size_mib: None } => mem_size_mib_for(self.exported_volumes),
        }
    }

    /// The arguments after the binary.
    pub fn argv(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["-m".into(), self.cpumask.clone().into()];
        if matches!(self.memory, Memory::NoHuge { .. }) {
            a.push("--no-huge".into());
        }
        a.push("-s".into());
        a.push(self.mem_size_mib().to_string().into());
        if !self.pci_disks {
            a.push("-u".into());
        }
        a.push("-r".into());
        a.push(self.socket().into_os_string());
        if self.interrupt_mode {
            a.push("--interrupt-mode".into());
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }
}

/// Why spdk_tgt could not start, from its log text: the cases SPDK and DPDK
/// name (a core locked by another SPDK process, hugepages short, the RPC
/// socket in use), else the last lines of the log.
pub fn start_failure_cause(log: &str) -> String {
    let lines: Vec<&str> = log.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    for l in &lines {
        // app.c: "Cannot create lock on core 0, probably process 1234 has claimed it."
        if let Some(rest) = l.split("Cannot create lock on core ").nth(1) {
            let core: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let pid = rest
                .split("probably process ")
                .nth(1)
                .map(|r| r.chars().take_while(char::is_ascii_digit).collect::<String>())
                .filter(|p| !p.is_empty());
            return match pid {
                Some(pid) => format!(
                    "core {core} is locked by another SPDK process (pid {pid}); stop it or give talon \
                     another --spdk-cpumask"
                ),
                None => format!("core {core} is locked by another SPDK process"),
            };
        }
    }
    let hugepage_signs = [
        "Not enough memory available",
        "Cannot init memory",
        "No free 2048 kB hugepages",
        "No free 1048576 kB hugepages",
        "Cannot get hugepage information",
        "No available 2048 kB hugepages",
    ];
    // the most specific sign first (DPDK warns of empty page sizes it then does without)
    if let Some(l) = hugepage_signs
        .iter()
        .find_map(|sign| lines.iter().find(|l| l.contains(sign)))
    {
        return format!("not enough hugepages for its memory (-s): {l}");
    }
    // --no-huge -s too small for its pools: "fsdev.c: ... Could not allocate spdk_fsdev_io pool"
    if let Some(l) = lines.iter().find(|l| l.contains("Could not allocate")) {
        return format!("not enough memory for its pools (-s): {l}");
    }
    if let Some(l) = lines
        .iter()
        .find(|l| l.contains("RPC Unix domain socket path") && l.contains("in use"))
    {
        return format!("its RPC socket is in use: {l}");
    }
    let tail = &lines[lines.len().saturating_sub(3)..];
    if tail.is_empty() {
        "it wrote nothing".into()
    } else {
        format!("its log ends with: {}", tail.join(" | "))
    }
}

/// `-s` for hugepages: the `wanted` MiB, or the `free` MiB when fewer are
/// free (start with what there is), with a note of the shortfall. With no
/// free hugepages at all there is nothing to start with: `wanted` is kept and
/// the target's own failure names the cause.
pub fn cap_memory(wanted: u64, free: u64, volumes: u32) -> (u64, Option<String>) {
    if free >= wanted || free == 0 {
        return (wanted, None);
    }
    let note = format!(
        "hugepages short: started with -s {free} MiB, all that was free, instead of the {wanted} MiB \
         sized for {volumes} volume(s) ({} MiB short)",
        wanted - free
    );
    (free, Some(note))
}

/// `-s` floor of spdk_tgt v26.05: its DPDK heap holds 884 MiB with nothing
/// configured (the iSCSI target's PDU and task pools, the bdev_io, fsdev_io
/// and message pools; `benches/memory/run.sh`). It does not start with 512.
pub const SPDK_TGT_BASE_MIB: u64 = crate::host::hugepages::SPDK_BASE_MIB;
/// `-s` floor of nvmf_tgt v26.05 (interrupt mode): 386 MiB in use empty.
pub const NVMF_TGT_BASE_MIB: u64 = 512;
/// `-s` per exported volume before any use was measured: an exported volume
/// costs nothing measurable until a host connects; a connected controller
/// with one I/O queue costs ~1.6 MiB (the TCP qpairs' buffers), a kernel
/// initiator opens one I/O queue per host CPU.
pub const MIB_PER_VOLUME: u64 = 8;

/// The most of its DPDK heap a target was seen using, persisted in the data
/// dir (`spdk-memory.json`) per program, so the next start is sized from use.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryUse {
    /// The high-water mark of the heap in use, MiB.
    pub peak_mib: u64,
    /// Volumes exported when it was seen.
    pub volumes: u32,
}

/// `-s` in MiB for a start of spdk_tgt (or nvmf_tgt, `nvmf`) with `volumes`
/// exported: from the use seen before (its high-water mark plus a quarter,
/// and [`MIB_PER_VOLUME`] for each volume more than then), else the
/// program's floor plus [`MIB_PER_VOLUME`] each; never below the floor,
/// rounded up to whole 2 MiB pages.
pub fn sized_mem_mib(volumes: u32, nvmf: bool, seen: Option<&MemoryUse>) -> u64 {
    let base = if nvmf {
        NVMF_TGT_BASE_MIB
    } else {
        SPDK_TGT_BASE_MIB
    };
    let mib = match seen.filter(|s| s.peak_mib > 0) {
        Some(s) => {
            let more = u64::from(volumes.saturating_sub(s.volumes));
            (s.peak_mib + s.peak_mib.div_ceil(4) + MIB_PER_VOLUME * more).max(base)
        }
        None => base + MIB_PER_VOLUME * u64::from(volumes),
    };
    mib.div_ceil(2) * 2
}

/// The MiB in use in a target's DPDK heaps, from the file
/// `env_dpdk_get_mem_stats` writes (`rte_malloc_dump_stats`: an
/// `Alloc_size:N,` line per heap after "DPDK malloc stats.").
pub fn heap_in_use_mib(dump: &str) -> Option<u64> {
    let stats = dump.split("DPDK malloc stats.").nth(1)?;
    let stats = stats.split("DPDK malloc heaps.").next().unwrap_or(stats);
    let bytes: Option<Vec<u64>> = stats
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Alloc_size:"))
        .map(|v| v.trim().trim_end_matches(',').parse::<u64>().ok())
        .collect();
    let bytes = bytes?;
    (!bytes.is_empty()).then(|| bytes.iter().sum::<u64>().div_ceil(1 << 20))
}

/// SPDK memory for `volumes` exported volumes before any use was measured:
/// the hugepage pool's figure ([`crate::host::hugepages::spdk_sizing_mib`]).
pub fn mem_size_mib_for(volumes: u32) -> u64 {
    crate::host::hugepages::spdk_sizing_mib(volumes)
}

/// Finds spdk_tgt: the explicit path alone when there is one (missing: an
/// error naming it); else `<spdk_dir>/build/bin/spdk_tgt`, then each directory
/// of `path_var`.
pub fn find_spdk_tgt(
    explicit: Option<&Path>,
    spdk_dir: Option<&Path>,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, TargetError> {
    let mut candidates = Vec::new();
    // an explicit binary is the only one: a wrong `--spdk-tgt` is an error, never
    // quietly replaced by another SPDK found in the environment
    if let Some(p) = explicit {
        if is_executable(p) {
            return Ok(p.to_path_buf());
        }
        return Err(TargetError::NotFound {
            searched: p.display().to_string(),
        });
    }
    if let Some(d) = spdk_dir {
        candidates.push(d.join("build/bin/spdk_tgt"));
    }
    if let Some(path) = path_var {
        candidates.extend(std::env::split_paths(path).map(|d| d.join("spdk_tgt")));
    }
    // each directory once: PATH often names one twice, or by a link (/bin and /usr/bin)
    let mut searched: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for c in candidates {
        if is_executable(&c) {
            return Ok(c);
        }
        let dir = c.parent().unwrap_or(Path::new("/"));
        if seen.insert(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())) {
            searched.push(dir.display().to_string());
        }
    }
    Err(TargetError::NotFound {
        searched: if searched.is_empty() {
            "no directory (no TALON_SPDK_DIR, no PATH)".into()
        } else {
            searched.join(", ")
        },
    })
}

/// The program that serves in interrupt mode: `nvmf_tgt` beside `spdk_tgt`
/// when there is one. spdk_tgt v26.05 also starts the iSCSI target, whose poll
/// group has a busy poller (`iscsi_poll_group_poll`) without interrupt support:
/// it keeps the reactor spinning in interrupt mode (measured: bare spdk_tgt
/// `--interrupt-mode` ~48 % of a core idle, nvmf_tgt ~1 %). nvmf_tgt has every
/// method talon calls except the `iscsi_*` ones (V2 volumes are then exported
/// over NVMe/TCP only). Any other binary is kept as given.
pub fn interrupt_mode_program(spdk_tgt: &Path) -> PathBuf {
    if spdk_tgt.file_name() == Some(OsStr::new("spdk_tgt"))
        && let Some(nvmf) = spdk_tgt.parent().map(|d| d.join("nvmf_tgt"))
        && is_executable(&nvmf)
    {
        return nvmf;
    }
    spdk_tgt.to_path_buf()
}

pub(super) fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Waits until `client` answers `spdk_get_version`, probing with backoff
/// (5 ms doubling to 250 ms); fails at once if `child` exits.
pub async fn wait_ready(
    client: &SpdkClient,
    mut child: Option<&mut Child>,
    timeout: Duration,
) -> Result<Version, TargetError> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(250));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let probe = Duration::from_secs(2).min(left.max(Duration::from_millis(1)));
        let last = match client
            .call_with_timeout::<(), Version>("spdk_get_version", None, probe)
            .await
        {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if let Some(c) = child.as_deref_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            return Err(TargetError::ExitedEarly {
                pid: c.id().unwrap_or(0),
                status: status.to_string(),
                socket: client.socket().to_path_buf(),
                cause: "see its output".into(),
            });
        }
        if Instant::now() >= deadline {
            return Err(TargetError::NotReady {
                socket: client.socket().to_path_buf(),
                timeout,
                last: Some(last),
            });
        }
        tokio::time::sleep(backoff.next_delay().min(left)).await;
    }
}

/// The pid of the process listening on a Unix socket (SO_PEERCRED).
pub(crate) async fn socket_peer_pid(socket: &Path) -> Option<i32> {
    let s = tokio::net::UnixStream::connect(socket).await.ok()?;
    s.peer_cred().ok()?.pid()
}

/// Sets the NVMe keep-alive ([`NVME_KEEP_ALIVE_MS`]) on a target talon has
/// just started or adopted, before any controller is attached, as Longhorn's
/// SPDK engine does when it starts. SPDK takes the option only while no NVMe
/// controller exists: an adopted target that already has some (talon
/// restarted under running volumes) refuses it, and then the keep-alive it
/// reports (`framework_get_config bdev`) is checked instead. `Ok(None)`: the
/// target has the keep-alive; `Ok(Some(note))`: it runs with another one, and
/// controllers attached since keep it (the note says so).
pub async fn set_nvme_keep_alive(client: &SpdkClient) -> Result<Option<String>, ClientError> {
    let opts = NvmeOptions {
        keep_alive_timeout_ms: Some(NVME_KEEP_ALIVE_MS),
    };
    let refused = match client.bdev_nvme_set_options(&opts).await {
        Ok(_) => return Ok(None),
        Err(ClientError::Rpc(e)) if e.code == -1 => e.message,
        Err(e) => return Err(e),
    };
    let have = nvme_keep_alive_ms(client).await?;
    if have == Some(NVME_KEEP_ALIVE_MS) {
        return Ok(None);
    }
    let have = have.map_or_else(|| "unknown".to_owned(), |ms| format!("{ms} ms"));
    Ok(Some(format!(
        "NVMe keep-alive is {have}, not {NVME_KEEP_ALIVE_MS} ms: the target refused to change it ({refused})"
    )))
}

/// The NVMe keep-alive a target applies to new controllers, from its `bdev`
/// configuration (v26.05 has no getter of NVMe options); `None` if it reports
/// none.
pub async fn nvme_keep_alive_ms(client: &SpdkClient) -> Result<Option<u32>, ClientError> {
    let config = client
        .framework_get_config(&GetConfig { name: "bdev".into() })
        .await?;
    Ok(config
        .iter()
        .find(|c| c.method == "bdev_nvme_set_options")
        .and_then(|c| c.params.get("keep_alive_timeout_ms")?.as_u64())
        .and_then(|ms| u32::try_from(ms).ok()))
}

/// A target answering `spdk_get_version` on `socket` (within 2 s): its
/// client, version and pid; `None` when none answers.
pub async fn probe(socket: &Path) -> Option<(SpdkClient, Version, Option<i32>)> {
    let client = SpdkClient::new(socket);
    let version = client
        .call_with_timeout::<(), Version>("spdk_get_version", None, Duration::from_secs(2))
        .await
        .ok()?;
    let pid = socket_peer_pid(socket).await;
    Some((client, version, pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_sized_from_use_seen_with_a_floor() {
        // nothing seen: the floor and 8 MiB a volume (the old formula asked 4812 for 100)
        assert_eq!(sized_mem_mib(0, false, None), 1024);
        assert_eq!(sized_mem_mib(100, false, None), 1824);
        assert_eq!(sized_mem_mib(100, true, None), 1312);
        // 100 volumes seen in 900 MiB: a quarter more, no more volumes since
        let seen = MemoryUse {
            peak_mib: 900,
            volumes: 100,
        };
        assert_eq!(sized_mem_mib(100, false, Some(&seen)), 1126);
        assert_eq!(sized_mem_mib(90, false, Some(&seen)), 1126);
        assert_eq!(sized_mem_mib(110, false, Some(&seen)), 1206);
        // never below the floor; whole 2 MiB pages
        let small = MemoryUse {
            peak_mib: 387,
            volumes: 0,
        };
        assert_eq!(sized_mem_mib(0, false, Some(&small)), 1024);
        assert_eq!(sized_mem_mib(0, true, Some(&small)), 512);
        let odd = MemoryUse {
            peak_mib: 901,
            volumes: 0,
        };
        assert_eq!(sized_mem_mib(0, false, Some(&odd)), 1128);
    }

    #[test]
    fn heap_use_is_read_from_the_mem_stats_dump() {
        let dump = "DPDK memory size 1073741824\nDPDK mempools.\nAlloc_size:5,\nDPDK malloc stats.\nHeap id:0\n\
                    \tHeap name:socket_0\n\tHeap_size:1073741824,\n\tFree_size:146716864,\n\
                    \tAlloc_size:927024960,\n\tGreatest_free_size:145639744,\nHeap id:1\n\tAlloc_size:0,\n\
                    DPDK malloc heaps.\n\tAlloc_size:99999999999,\n";
        assert_eq!(heap_in_use_mib(dump), Some(885));
        assert_eq!(heap_in_use_mib("DPDK memory size 1\n"), None);
        assert_eq!(heap_in_use_mib("DPDK malloc stats.\nAlloc_size:x,\n"), None);
    }
}
