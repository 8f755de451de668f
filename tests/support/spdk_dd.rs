//! Reads and writes through SPDK's own NVMe/TCP initiator (`spdk_dd` with a
//! JSON config that attaches an export): the data path the real-SPDK tests
//! check, with no kernel initiator.

use std::path::Path;

use serde_json::json;
use talon::spdk::SpdkClient;

use super::spdk_perf;

/// The pools spdk_dd makes at start, sized for one copy at its queue depth
/// (32 commands of 64 KiB, in spdk_dd's own buffers) rather than SPDK's
/// defaults for a target (65535 bdev_io, 8192 small and 1024 large iobuf
/// buffers: ~200 MiB that DPDK touches before the copy starts, 1-9 s a run
/// on this 2-core machine, against 0.5 s with these).
pub const POOLS: Pools = Pools {
    bdev_io: 1024,
    iobuf_small: 1024,
    iobuf_large: 128,
};

/// Pool sizes of an SPDK app's JSON config ([`POOLS`]).
pub struct Pools {
    /// `bdev_set_options.bdev_io_pool_size`.
    pub bdev_io: u32,
    /// `iobuf_set_options.small_pool_count`.
    pub iobuf_small: u32,
    /// `iobuf_set_options.large_pool_count`.
    pub iobuf_large: u32,
}

impl Pools {
    /// The `iobuf` subsystem's entry of the JSON config.
    pub fn iobuf(&self) -> serde_json::Value {
        json!({"subsystem": "iobuf", "config": [{"method": "iobuf_set_options",
            "params": {"small_pool_count": self.iobuf_small, "large_pool_count": self.iobuf_large}}]})
    }
}

/// Writes `data` at offset 0 of an export, or reads `len` bytes back, through
/// SPDK's own NVMe/TCP initiator (`spdk_dd` with a JSON config that attaches
/// the export): the data path the test checks, with no kernel initiator.
pub fn dd(spdk: &Path, dir: &Path, port: u16, nqn: &str, write: Option<&[u8]>, len: usize) -> Vec<u8> {
    dd_on(spdk, dir, "127.0.0.1", port, nqn, write, len)
}

/// [`dd`], made again (up to 20 times, 250 ms apart) while spdk_dd cannot
/// finish: a rebuild's switch closes an export for a moment, and a host
/// reconnects where spdk_dd does not. `what` names it if it never finishes.
#[allow(dead_code)]
pub fn dd_retried(
    spdk: &Path,
    dir: &Path,
    port: u16,
    nqn: &str,
    write: Option<&[u8]>,
    len: usize,
    what: &str,
) -> Vec<u8> {
    for _ in 0..20 {
        if dd_as(spdk, dir, port, nqn, write, len, spdk_perf::HOST_NQN)
            .status
            .success()
        {
            return std::fs::read(dir.join("dd.bin")).expect("dd file");
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    panic!("{what}: spdk_dd never finished");
}

/// Writes `data` at byte `offset` (a multiple of 64 KiB) of an export, as
/// [`dd`] does at offset 0.
#[allow(dead_code)]
pub fn dd_write_at(spdk: &Path, dir: &Path, port: u16, nqn: &str, data: &[u8], offset: usize) {
    assert_eq!(offset % 65536, 0, "spdk_dd seeks in 64 KiB blocks here");
    let out = run(
        spdk,
        dir,
        port,
        nqn,
        Some(data),
        data.len(),
        spdk_perf::HOST_NQN,
        offset / 65536,
    );
    assert!(
        out.status.success(),
        "spdk_dd on {nqn} at {offset} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// [`dd`] as host `hostnqn`, whatever it gives.
pub fn dd_as(
    spdk: &Path,
    dir: &Path,
    port: u16,
    nqn: &str,
    write: Option<&[u8]>,
    len: usize,
    hostnqn: &str,
) -> std::process::Output {
    run(spdk, dir, port, nqn, write, len, hostnqn, 0)
}

/// [`dd`] of an export on `traddr` (another node's loopback address): what
/// was read, or written.
pub fn dd_on(
    spdk: &Path,
    dir: &Path,
    traddr: &str,
    port: u16,
    nqn: &str,
    write: Option<&[u8]>,
    len: usize,
) -> Vec<u8> {
    let out = run_on(spdk, dir, traddr, port, nqn, write, len, spdk_perf::HOST_NQN, 0);
    assert!(
        out.status.success(),
        "spdk_dd on {nqn} at {traddr}:{port} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(dir.join("dd.bin")).expect("dd file")
}

/// Writes `data` at byte `offset` (a multiple of 64 KiB) of an export on
/// `traddr`, or reads `len` bytes at 0 (`data` None), connecting again (up
/// to 20 times, 250 ms apart) while the export refuses the connection: a
/// member moving between its paths closes the export for a moment, and a
/// host connects again (one connected rides through it, see `run_on`).
#[allow(dead_code, clippy::too_many_arguments)]
pub fn dd_at_on_connecting(
    spdk: &Path,
    dir: &Path,
    traddr: &str,
    port: u16,
    nqn: &str,
    data: Option<&[u8]>,
    len: usize,
    offset: usize,
) -> Vec<u8> {
    assert_eq!(offset % 65536, 0, "spdk_dd seeks in 64 KiB blocks here");
    let mut last = String::new();
    for _ in 0..20 {
        let out = run_on(
            spdk,
            dir,
            traddr,
            port,
            nqn,
            data,
            len,
            spdk_perf::HOST_NQN,
            offset / 65536,
        );
        if out.status.success() {
            if data.is_some() {
                return Vec::new();
            }
            return std::fs::read(dir.join("dd.bin")).expect("dd file");
        }
        last = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // the attach cut short by the closure (the controller made, its
        // connection dropped before the bdev was; spdk_dd's JSON config
        // failed, so its copy never began: nothing read or written). Seen
        // as "No such device or address" and, with the connection dropped
        // while the controller was being initialized, "Operation not
        // permitted" (a CI run under load)
        let attach_cut = last.contains("Failed to load subsystems");
        assert!(
            last.contains("Failed to attach") || attach_cut,
            "spdk_dd on {nqn} at {traddr}:{port}, offset {offset}, failed: {last}"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    panic!("spdk_dd on {nqn} at {traddr}:{port} never connected: {last}");
}

#[allow(clippy::too_many_arguments)]
fn run(
    spdk: &Path,
    dir: &Path,
    port: u16,
    nqn: &str,
    write: Option<&[u8]>,
    len: usize,
    hostnqn: &str,
    seek: usize,
) -> std::process::Output {
    run_on(spdk, dir, "127.0.0.1", port, nqn, write, len, hostnqn, seek)
}

#[allow(clippy::too_many_arguments)]
fn run_on(
    spdk: &Path,
    dir: &Path,
    traddr: &str,
    port: u16,
    nqn: &str,
    write: Option<&[u8]>,
    len: usize,
    hostnqn: &str,
    seek: usize,
) -> std::process::Output {
    let conf = dir.join("dd.json");
    // no examine in spdk_dd: a replica carries its raid's superblock, and
    // spdk_dd's own raid module would claim it; small pools (see [`POOLS`])
    let cfg = json!({"subsystems": [POOLS.iobuf(), {"subsystem": "bdev", "config": [{
        "method": "bdev_set_options", "params": {"bdev_auto_examine": false,
                                                 "bdev_io_pool_size": POOLS.bdev_io}}, {
        "method": "bdev_nvme_attach_controller",
        "params": {"name": "dd", "trtype": "tcp", "adrfam": "ipv4", "traddr": traddr,
                   "trsvcid": port.to_string(), "subnqn": nqn, "hostnqn": hostnqn,
                   // a host that rides through a lost connection as the
                   // kernel's does (reconnect every 2 s, I/O held meanwhile):
                   // spdk_dd itself ignores a failed read (its
                   // _dd_read_bdev_done never looks at `success`) and
                   // would write stale buffers out
                   "reconnect_delay_sec": 1, "ctrlr_loss_timeout_sec": 30}}]}]});
    std::fs::write(&conf, cfg.to_string()).expect("dd config");
    let file = dir.join("dd.bin");
    let mut cmd = std::process::Command::new(spdk.join("build/bin/spdk_dd"));
    cmd.args([
        "--no-huge",
        "-s",
        "512",
        "--disable-cpumask-locks",
        "-c",
        "0x2",
        "-r",
    ])
    .arg(dir.join("dd.sock"))
    .arg("--json")
    .arg(&conf)
    // 32 commands in flight: at spdk_dd's default of 2, a copy ran at 10 MB/s
    // on this loaded 2-core machine (each round trip waits for the target's
    // reactor to be scheduled), at 32 at ~100 MB/s; the blocks of one copy
    // never overlap, so their order does not matter
    .args(["--bs", "65536", "--qd", "32"]);
    match write {
        Some(data) => {
            std::fs::write(&file, data).expect("pattern");
            cmd.arg("--if").arg(&file).args(["--ob", "ddn1"]);
            if seek > 0 {
                cmd.args(["--seek", &seek.to_string()]);
            }
        }
        None => {
            cmd.args(["--ib", "ddn1", "--of"])
                .arg(&file)
                .args(["--count", &(len / 65536).to_string()]);
        }
    }
    cmd.output().expect("spdk_dd")
}

/// Exports bdev `bdev` alone as `nqn` on 127.0.0.1:`port` (a test subsystem,
/// not talon's), reads `len` bytes of it with spdk_dd, and removes the export.
pub async fn read_bdev(
    c: &SpdkClient,
    spdk: &Path,
    dir: &Path,
    port: u16,
    bdev: &str,
    len: usize,
) -> Vec<u8> {
    use talon::spdk::rpc::{AddNamespace, ByNqn, CreateSubsystem, ListenAddress, SubsystemListener};
    let nqn = "nqn.2016-06.io.spdk:talon-test-read";
    c.nvmf_create_subsystem(&CreateSubsystem {
        nqn: nqn.into(),
        allow_any_host: Some(true),
        serial_number: None,
        model_number: None,
        max_namespaces: Some(1),
        ana_reporting: None,
        min_cntlid: None,
        max_cntlid: None,
    })
    .await
    .expect("test subsystem");
    let id = uuid::Uuid::new_v4();
    c.nvmf_subsystem_add_ns(&AddNamespace::with_id(nqn, bdev, id))
        .await
        .expect("test ns");
    c.nvmf_subsystem_add_listener(&SubsystemListener {
        nqn: nqn.into(),
        listen_address: ListenAddress::tcp([127, 0, 0, 1].into(), port),
    })
    .await
    .expect("test listener");
    let data = {
        let (spdk, dir) = (spdk.to_path_buf(), dir.to_path_buf());
        tokio::task::spawn_blocking(move || dd(&spdk, &dir, port, nqn, None, len))
            .await
            .expect("dd task")
    };
    c.nvmf_delete_subsystem(&ByNqn { nqn: nqn.into() })
        .await
        .expect("drop test subsystem");
    data
}
