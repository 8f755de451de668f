//! Longhorn's gRPC ports under hostile clients, measured on a `talon serve`
//! process (no SPDK: the gRPC servers answer without it) with the default
//! bounds (`longhorn::bounds::GrpcLimits`), printed as a table (run: `cargo
//! bench --bench grpc_bounds`):
//!
//! ```text
//!   phase                                  kept  refused  RSS MiB  admin socket
//!   idle daemon                               -        -     ...   answers in ...
//!   1,100 idle connections from one peer   ...      ...     ...   answers in ...
//!   50,000 stalled streams (50 conns)      ...        -  peak ...  answers in ...
//!   after the peers left                      -        -     ...   served again in ...
//! ```
//!
//! The hostile peer is 127.0.0.2; the admin socket is the daemon's Unix
//! socket; "served again" is the time from the peers leaving to the first
//! InstanceList answered to 127.0.0.1.

#[path = "support/reap.rs"]
mod reap;
#[path = "support/scale.rs"]
mod scale;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use scale::proc_stat;
use talon::client::Client;
use talon::proto::imrpc::instance_service_client::InstanceServiceClient;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

const HOSTILE: [u8; 4] = [127, 0, 0, 2];

async fn connect_from(from: [u8; 4], port: u16) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::new(IpAddr::from(from), 0))?;
    s.connect(SocketAddr::from(([127, 0, 0, 1], port))).await
}

fn rss_mib(pid: u32) -> f64 {
    proc_stat(pid).map_or(0.0, |(_, kb)| kb as f64 / 1024.0)
}

async fn admin_answers(socket: &Path) -> String {
    let t = Instant::now();
    match tokio::time::timeout(Duration::from_secs(10), async {
        Client::connect_unix(socket).await.ok()?.node_info().await.ok()
    })
    .await
    {
        Ok(Some(_)) => format!("answers in {:.1} ms", t.elapsed().as_secs_f64() * 1e3),
        _ => "NO ANSWER".into(),
    }
}

async fn good_call(base: u16) -> bool {
    let Ok(ch) = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{}", base + 3)) else {
        return false;
    };
    let Ok(ch) = ch.connect_timeout(Duration::from_secs(2)).connect().await else {
        return false;
    };
    let mut c = InstanceServiceClient::new(ch);
    matches!(
        tokio::time::timeout(Duration::from_secs(5), c.instance_list(())).await,
        Ok(Ok(_))
    )
}

async fn run() {
    let dir = tempfile::tempdir().expect("tempdir");
    // the daemon is killed on every way out, a panic too
    let _reap = reap::Reap::under(dir.path());
    let base = talon::runtime::testing::reserve_ports(&[IpAddr::from([127, 0, 0, 1])]);
    let socket = dir.path().join("run/talon.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_talon"))
        .arg("--socket")
        .arg(&socket)
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .arg("--spdk-tgt")
        .arg(dir.path().join("no/spdk_tgt"))
        .args(["--longhorn-listen", &format!("127.0.0.1:{base}")])
        .env_remove("TALON_SPDK_DIR")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn talon");
    let pid = child.id();
    scale::wait_for("the daemon", Duration::from_secs(60), || async {
        good_call(base).await.then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut rows: Vec<[String; 5]> = Vec::new();
    rows.push([
        "idle daemon".into(),
        "-".into(),
        "-".into(),
        format!("{:.1}", rss_mib(pid)),
        admin_answers(&socket).await,
    ]);

    // 1,100 idle connections from one peer, over the five ports
    let mut kept = Vec::new();
    let mut refused = 0;
    for i in 0..1100u16 {
        let Ok(mut s) = connect_from(HOSTILE, base + i % 5).await else {
            refused += 1;
            continue;
        };
        let mut b = [0u8; 16];
        match tokio::time::timeout(Duration::from_millis(30), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => refused += 1,
            _ => kept.push(s),
        }
    }
    let good = if good_call(base).await {
        "; 127.0.0.1 served"
    } else {
        "; 127.0.0.1 NOT served"
    };
    rows.push([
        "1,100 idle connections from one peer".into(),
        kept.len().to_string(),
        refused.to_string(),
        format!("{:.1}", rss_mib(pid)),
        format!("{}{good}", admin_answers(&socket).await),
    ]);
    drop(kept);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 50,000 streams that never send their message: 50 connections x 1,000
    let mut conns = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let Ok(tcp) = connect_from(HOSTILE, base + 3).await else {
            continue;
        };
        let Ok((h2, conn)) = h2::client::handshake(tcp).await else {
            continue;
        };
        conns.push(tokio::spawn(conn));
        for _ in 0..1000 {
            let h2 = h2.clone();
            let port = base + 3;
            tasks.push(tokio::spawn(async move {
                let Ok(mut h2) = h2.ready().await else {
                    return;
                };
                let req = http::Request::post(format!(
                    "http://127.0.0.1:{port}/imrpc.InstanceService/InstanceList"
                ))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .expect("request");
                if let Ok((resp, body)) = h2.send_request(req, false) {
                    let _ = resp.await;
                    drop(body);
                }
            }));
        }
    }
    let mut peak: f64 = 0.0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        peak = peak.max(rss_mib(pid));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    rows.push([
        format!("50,000 stalled streams ({} conns)", conns.len()),
        format!("{} conns", conns.len()),
        "-".into(),
        format!("peak {peak:.1}"),
        admin_answers(&socket).await,
    ]);

    // the peers leave
    for t in tasks {
        t.abort();
    }
    for c in conns {
        c.abort();
    }
    let left = Instant::now();
    scale::wait_for("served again", Duration::from_secs(60), || async {
        good_call(base).await.then_some(())
    })
    .await;
    let again = left.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    rows.push([
        "5 s after the peers left".into(),
        "-".into(),
        "-".into(),
        format!("{:.1}", rss_mib(pid)),
        format!("served again in {:.1} ms", again.as_secs_f64() * 1e3),
    ]);

    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();

    println!("\nLonghorn gRPC ports under hostile clients (default bounds; talon serve without SPDK)\n");
    println!("| phase | kept | refused | RSS MiB | admin socket / good client |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("| {} | {} | {} | {} | {} |", r[0], r[1], r[2], r[3], r[4]);
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}
