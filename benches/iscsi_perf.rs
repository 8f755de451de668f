//! V1 engine throughput: libiscsi's `iscsi-perf` against a V1 volume served
//! by a real tgtd on loopback; prints a table of 4 KiB read IOPS.
//!
//! ```text
//!   V1Store::create (256 MiB, filled) ──export──> tgtd 127.0.0.1:<free port>
//!        iscsi-perf -b 8 [-r] -m QD -t SECONDS iscsi://127.0.0.1:PORT/IQN/1
//!        libiscsi WRITE16 4 KiB, QD 1, for SECONDS
//! ```
//!
//! The measured programs are C (tgtd, libiscsi), so `--profile dev` gives the
//! same numbers as a release build and saves a long compile.
//!
//! `iscsi-perf` only reads (READ16); a last row measures synchronous 4 KiB
//! random WRITE16 through libiscsi itself (the tests' dlopen client). The file
//! sits in the page cache, so the number is tgtd's and the iSCSI stack's cost,
//! not the disk's. Run as root: `cargo bench --bench iscsi_perf`
//! (ISCSI_PERF_SECONDS=5 by default).

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::process::Command;

use comfy_table::Table;

#[path = "support/reap.rs"]
mod reap;
#[path = "../tests/tgt_common/mod.rs"]
#[allow(dead_code, clippy::all)]
mod tgt_common;

/// (workload, queue depth, IOPS)
type Row = (&'static str, u32, u64);
use talon::names::{Iqn, ObjectName};
use talon::tgt::{ExportOptions, InitiatorAcl, Tgtd, TgtdConfig, V1Store};

const SIZE: u64 = 256 << 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("iscsi_perf: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP iscsi_perf: needs root (tgtd)");
        return Ok(());
    }
    if Command::new("iscsi-perf").arg("-?").output().is_err()
        || Command::new("tgtd").arg("-h").output().is_err()
    {
        eprintln!("SKIP iscsi_perf: needs tgtd and iscsi-perf (apt-get install tgt libiscsi-bin)");
        return Ok(());
    }
    let seconds: u32 = std::env::var("ISCSI_PERF_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let data = tempfile::tempdir()?;
    // tgtd is killed on every way out, a panic too
    let _reap = reap::Reap::under(data.path());
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let portal: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let tgtd = Tgtd::start(TgtdConfig::new(data.path().join("run/tgtd"), portal))?;
    let result = measure(&tgtd, data.path(), portal, seconds);
    tgtd.stop()?;
    let rows = result?;

    let mut table = Table::new();
    table.set_header([
        "engine",
        "workload",
        "block",
        "queue depth",
        "seconds",
        "IOPS",
        "MiB/s",
    ]);
    for (workload, qd, iops) in rows {
        table.add_row([
            "V1 (tgtd, loopback)".to_string(),
            workload.to_string(),
            "4 KiB".to_string(),
            qd.to_string(),
            seconds.to_string(),
            iops.to_string(),
            format!("{:.1}", iops as f64 * 4096.0 / (1 << 20) as f64),
        ]);
    }
    println!("{table}");
    Ok(())
}

fn measure(
    tgtd: &Tgtd,
    data: &std::path::Path,
    portal: SocketAddr,
    seconds: u32,
) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let store = V1Store::new(data);
    let vol = ObjectName::parse("volume", "perf")?;
    let info = store.create(&vol, SIZE)?;
    // fill it so reads hit real extents, not holes
    let mut f = std::fs::OpenOptions::new().write(true).open(&info.path)?;
    let chunk: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    for _ in 0..SIZE >> 20 {
        f.write_all(&chunk)?;
    }
    f.sync_all()?;
    let opts = ExportOptions {
        initiators: vec![InitiatorAcl::Address("127.0.0.1".parse()?)],
        chap: None,
    };
    store.export(&tgtd.admin(), &vol, &opts)?;
    let url = format!("iscsi://{portal}/{}/1", Iqn::for_volume(&vol));
    let mut rows = Vec::new();
    for (workload, random, qd) in [
        ("sequential read", false, 1),
        ("random read", true, 1),
        ("sequential read", false, 32),
        ("random read", true, 32),
    ] {
        let mut cmd = Command::new("iscsi-perf");
        cmd.args(["-b", "8", "-m", &qd.to_string(), "-t", &seconds.to_string()]);
        if random {
            cmd.arg("-r");
        }
        let out = cmd.arg(&url).output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let iops =
            last_average(&text).ok_or_else(|| format!("no 'iops average' in iscsi-perf output: {text}"))?;
        rows.push((workload, qd, iops));
    }
    // iscsi-perf only reads: writes go through libiscsi's WRITE16, synchronous (QD 1)
    if let Ok(lib) = tgt_common::Libiscsi::load() {
        let session = lib.connect(
            &portal.to_string(),
            Iqn::for_volume(&vol).as_str(),
            "iqn.2025-01.io.talon:bench",
            None,
        )?;
        let block = vec![0x5au8; 4096];
        let blocks = SIZE / 4096;
        let (start, mut n, mut lba) = (std::time::Instant::now(), 0u64, 0u64);
        while start.elapsed().as_secs() < u64::from(seconds) {
            // a cheap LCG walk over the volume's 4 KiB blocks
            lba = (lba
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407))
                % blocks;
            session.write(lba * 8, &block)?;
            n += 1;
        }
        rows.push(("random write (libiscsi)", 1, n / u64::from(seconds.max(1))));
    }
    Ok(rows)
}

/// The last "iops average N" of iscsi-perf's progress lines.
fn last_average(text: &str) -> Option<u64> {
    text.rsplit("iops average ")
        .next()
        .filter(|_| text.contains("iops average "))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
