//! Longhorn's five gRPC ports under hostile clients (the protocol has no
//! authentication): idle TCP connections from one peer and from many, a
//! connection that never speaks, streams whose message never comes. The
//! bounds hold, a well-behaved client and the admin socket are answered all
//! along, and the ports recover once the hostile peer leaves. Loopback only:
//! the hostile peers are 127.0.0.2 to 127.0.0.4, the good client 127.0.0.1.
//! A daemon without SPDK (the gRPC servers do not need it for these calls).

#[path = "support/longhorn_daemon.rs"]
mod longhorn_daemon;
#[path = "support/serve_daemon.rs"]
mod serve_daemon;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use longhorn_daemon::{Daemon, free_base, instance_ports};
use talon::client::Client;
use talon::longhorn::bounds::GrpcLimits;
use talon::proto::imrpc::instance_service_client::InstanceServiceClient;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

const LIMITS: GrpcLimits = GrpcLimits {
    max_connections: 40,
    max_per_peer: 16,
    idle: Duration::from_secs(15),
    ping: Duration::from_secs(1),
    max_streams: 8,
    message: Duration::from_secs(1),
};

/// A TCP connection to `port` from `from`.
async fn connect_from(from: [u8; 4], port: u16) -> TcpStream {
    let s = TcpSocket::new_v4().expect("socket");
    s.bind(SocketAddr::new(IpAddr::from(from), 0))
        .expect("bind the source address");
    s.connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("connect")
}

/// Opens `n` connections from `from` to the five ports in turn; returns the
/// ones the server kept (a refused one is closed at once: EOF or reset).
async fn hold(from: [u8; 4], base: u16, n: u16) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for i in 0..n {
        let mut s = connect_from(from, base + i % 5).await;
        let mut b = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(100), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            // kept: nothing to read (HTTP/2 waits for the client's preface)
            _ => held.push(s),
        }
    }
    held
}

/// The good client: InstanceList on the instance service from 127.0.0.1.
async fn good_call(d: &Daemon) -> Result<(), String> {
    let ch = tonic::transport::Channel::from_shared(d.url(3))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut c = InstanceServiceClient::new(ch);
    tokio::time::timeout(Duration::from_secs(5), c.instance_list(()))
        .await
        .map_err(|_| "no answer in 5 s".to_string())?
        .map(|_| ())
        .map_err(|s| s.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_and_stalled_streams_are_bounded_and_the_good_client_served() {
    talon::runtime::testing::capture_logs();
    let dir = tempfile::tempdir().expect("tempdir");
    let base = free_base();
    let d = Daemon::serve_within(
        serve_daemon::v1_opts(dir.path()),
        base,
        instance_ports(base),
        LIMITS,
    )
    .await;
    let admin = Client::connect_unix(&dir.path().join("run/talon.sock"))
        .await
        .expect("admin socket");

    // one peer: at most 16 kept over the five ports, the rest closed at once
    let a = hold([127, 0, 0, 2], d.base, 100).await;
    assert_eq!(a.len(), 16, "connections kept from one peer");
    good_call(&d)
        .await
        .expect("the good client is served beside them");
    admin.node_info().await.expect("the admin socket answers");

    // more peers: 40 in all
    let b = hold([127, 0, 0, 3], d.base, 100).await;
    let c = hold([127, 0, 0, 4], d.base, 100).await;
    assert_eq!(a.len() + b.len() + c.len(), 40, "connections kept in all");
    assert!(
        good_call(&d).await.is_err(),
        "the total bound holds for 127.0.0.1 too"
    );
    admin
        .node_info()
        .await
        .expect("the admin socket answers while the ports are full");

    // two peers leave: the ports serve again as soon as their connections
    // are gone (the figure: time from leaving to the first good answer)
    let left = Instant::now();
    drop((b, c));
    talon::runtime::testing::eventually("served again", Duration::from_secs(30), || async {
        good_call(&d).await.ok()
    })
    .await;
    eprintln!(
        "figure: served again {:?} after the hostile peers left",
        left.elapsed()
    );
    // the one that stays and says nothing is closed after the idle bound
    for mut s in a {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut rest))
            .await
            .expect("a silent connection is closed within the idle bound")
            .ok();
    }

    // a stream whose message never comes ends with DEADLINE_EXCEEDED; the
    // server allows 8 streams per connection
    let tcp = connect_from([127, 0, 0, 2], d.base + 3).await;
    let (h2, conn) = h2::client::handshake(tcp).await.expect("HTTP/2");
    tokio::spawn(conn);
    let mut held_bodies = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..8 {
        let mut h2 = h2.clone().ready().await.expect("ready");
        let req = http::Request::post(format!(
            "http://127.0.0.1:{}/imrpc.InstanceService/InstanceList",
            d.base + 3
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
        let (resp, body) = h2.send_request(req, false).expect("send headers only");
        held_bodies.push(body);
        answers.push(resp);
    }
    for resp in answers {
        let r = tokio::time::timeout(Duration::from_secs(20), resp)
            .await
            .expect("answered, not held")
            .expect("a response");
        let status = r
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        assert_eq!(
            status.as_deref(),
            Some("4"),
            "DEADLINE_EXCEEDED: {:?}",
            r.headers()
        );
    }
    assert_eq!(
        h2.current_max_send_streams(),
        8,
        "streams per connection the server allows"
    );
    drop(held_bodies);
    good_call(&d).await.expect("served after the stalled streams");
    drop(admin);
    d.stop().await;
}

/// A stopped talon lets go of its state store although clients keep calls
/// open (an InstanceWatch stream, as longhorn-manager keeps one; a call
/// whose request body never comes; a connection that never speaks): the
/// next `talon serve` on the same data dir and ports starts. Before, the stop
/// aborted the gRPC servers after the grace, but tonic serves each
/// connection in a task of its own; a connection with a call still open
/// went on holding the service and the store, and the next serve in the
/// same process found the store open (a restart test's daemon never came up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_talon_lets_go_of_its_store_although_clients_keep_calls_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = free_base();
    let d = Daemon::serve(serve_daemon::v1_opts(dir.path()), base, instance_ports(base)).await;
    let mut inst = InstanceServiceClient::new(d.channel(3).await);
    let mut watch = inst.instance_watch(()).await.expect("watch").into_inner();
    let silent = connect_from([127, 0, 0, 1], base + 1).await;
    // a call whose request body never comes (the default bound on a
    // message's wait is longer than the stop's grace)
    let tcp = connect_from([127, 0, 0, 1], base + 3).await;
    let (h2, conn) = h2::client::handshake(tcp).await.expect("HTTP/2");
    tokio::spawn(conn);
    let mut h2 = h2.ready().await.expect("ready");
    let req = http::Request::post(format!(
        "http://127.0.0.1:{}/imrpc.InstanceService/InstanceList",
        base + 3
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .expect("request");
    let (_resp, held_body) = h2.send_request(req, false).expect("send headers only");
    d.stop().await;
    // the watch ends with the stop (an error or its end), it is not left open
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the watch stream was left open after the stop");
    // the same data dir and ports serve again: the store was let go
    let again = Daemon::serve(serve_daemon::v1_opts(dir.path()), base, instance_ports(base)).await;
    good_call(&again).await.expect("the daemon started again answers");
    drop((silent, inst, held_body));
    again.stop().await;
}
