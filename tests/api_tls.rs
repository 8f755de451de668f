//! The admin API's TCP listener over TLS (rustls), on real loopback sockets
//! with certificates made in the test (rcgen): the token still required, plain
//! clients and unknown CAs refused, client certificates when a client CA is
//! set, the listener bounds holding during the handshake, and `talon serve`'s
//! and the peer client's use of it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, SanType};
use talon::api::server::TcpLimits;
use talon::api::tls::{TlsClient, TlsOptions, server_config};
use talon::client::{Client, ClientError};

const TOKEN: &str = "0123456789abcdef0123456789abcdef-tls";

/// A CA and certificates it signed, as PEM files in a temp dir (keys 0600).
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Self {
        let pki = Self {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        let ca = pki.ca("ca");
        pki.leaf(&ca, "server", true);
        pki.leaf(&ca, "client", false);
        // another CA, and a client it signed
        let other = pki.ca("other-ca");
        pki.leaf(&other, "stranger", false);
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, pem: &str, private: bool) {
        let p = self.path(name);
        std::fs::write(&p, pem).expect("write pem");
        let mode = if private { 0o600 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    fn ca(&self, name: &str) -> Issuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("talon test {name}"));
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("self-signed");
        self.write(&format!("{name}.pem"), &cert.pem(), false);
        Issuer::new(params, key)
    }

    fn leaf(&self, ca: &Issuer<'static, KeyPair>, name: &str, server: bool) {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("talon test {name}"));
        params.extended_key_usages = if server {
            // a node's certificate: served, and presented to its peers
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        } else {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        };
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, ca).expect("signed");
        self.write(&format!("{name}.pem"), &cert.pem(), false);
        self.write(&format!("{name}.key"), &key.serialize_pem(), true);
    }

    fn client(&self, ca: &str, identity: Option<&str>) -> TlsClient {
        let (cert, key) = identity
            .map(|n| (self.path(&format!("{n}.pem")), self.path(&format!("{n}.key"))))
            .unzip();
        TlsClient::from_files(&self.path(ca), cert.as_deref().zip(key.as_deref())).expect("client TLS")
    }
}

fn methods(dir: &Path) -> jsonrpsee::Methods {
    let ctx = talon::api::ApiContext {
        state: talon::runtime::State::in_memory(),
        registry: Arc::new(talon::resources::registry()),
        statuses: Default::default(),
        node_info: talon::serve::node_info_fn(
            talon::host::HostRoot::new("/"),
            dir.to_path_buf(),
            &talon::controllers::engine::selection::EngineSelection::fixed(false, "test"),
        ),
        node_stop: Arc::new(|_drain| false),
    };
    let mut api = talon::api::ApiBuilder::new(ctx);
    talon::api::register_core(&mut api);
    api.build()
}

/// A TLS listener on loopback; dropped: stopped.
struct Server {
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    async fn start(pki: &Pki, client_ca: Option<&str>, limits: TcpLimits) -> Self {
        let ca = client_ca.map(|c| pki.path(c));
        let tls = server_config(&pki.path("server.pem"), &pki.path("server.key"), ca.as_deref())
            .expect("server TLS");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(talon::api::server::serve_tcp_tls(
            listener,
            Arc::from(TOKEN),
            Some(tls),
            limits,
            methods(pki.dir.path()),
            async move {
                let _ = rx.await;
            },
        ));
        Self {
            addr,
            stop: Some(tx),
            task: Some(task),
        }
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.expect("server task");
        }
    }
}

/// A call through `tls` as it ends: the node's version, or the error.
async fn call(addr: &str, token: &str, tls: Option<&TlsClient>) -> Result<String, ClientError> {
    let c = Client::connect_tcp_with(addr, token, tls).await?;
    Ok(c.node_info().await?.version)
}

#[tokio::test]
async fn tls_listener_needs_its_ca_and_the_token_and_refuses_plain_clients() {
    let pki = Pki::new();
    let s = Server::start(&pki, None, TcpLimits::default()).await;
    let tls = pki.client("ca.pem", None);

    let version = call(&s.addr, TOKEN, Some(&tls))
        .await
        .expect("TLS call with the token");
    assert_eq!(version, talon::VERSION);
    // by name too (the certificate names localhost)
    let port = s.addr.rsplit_once(':').expect("port").1;
    call(&format!("localhost:{port}"), TOKEN, Some(&tls))
        .await
        .expect("TLS call to localhost");

    // the token is still required inside TLS
    let e = call(&s.addr, "not-the-token-not-the-token-0000", Some(&tls))
        .await
        .expect_err("wrong token");
    assert!(e.to_string().contains("401"), "refused with 401: {e}");

    // a plain client on the TLS port gets nothing
    let e = call(&s.addr, TOKEN, None).await.expect_err("plain client");
    println!("plain client: {e}");
    assert!(
        matches!(e, ClientError::Handshake { .. } | ClientError::Transport(_)),
        "plain client refused: {e}"
    );

    // a client that trusts another CA refuses the server, saying why
    let wrong = pki.client("other-ca.pem", None);
    let e = call(&s.addr, TOKEN, Some(&wrong)).await.expect_err("wrong CA");
    let msg = e.to_string();
    println!("wrong CA: {msg}");
    assert!(matches!(e, ClientError::Tls { .. }), "a TLS error: {msg}");
    assert!(
        msg.contains("TLS handshake with talon at") && msg.contains("UnknownIssuer"),
        "names the address and the reason: {msg}"
    );

    // the listener still serves after all that
    call(&s.addr, TOKEN, Some(&tls)).await.expect("still served");
    s.stop().await;
}

#[tokio::test]
async fn with_a_client_ca_only_clients_with_a_certificate_it_signed_are_served() {
    let pki = Pki::new();
    let s = Server::start(&pki, Some("ca.pem"), TcpLimits::default()).await;

    let without = pki.client("ca.pem", None);
    let e = call(&s.addr, TOKEN, Some(&without))
        .await
        .expect_err("no client certificate");
    // TLS 1.3: the client learns it from the server's alert, at the
    // handshake or at the first read
    let msg = e.to_string();
    println!("no client certificate: {msg}");
    assert!(
        msg.contains("CertificateRequired"),
        "refused for want of a certificate: {msg}"
    );

    let stranger = pki.client("ca.pem", Some("stranger"));
    let e = call(&s.addr, TOKEN, Some(&stranger))
        .await
        .expect_err("a certificate another CA signed");
    let msg = e.to_string();
    println!("a stranger's certificate: {msg}");
    assert!(
        msg.contains("UnknownCA"),
        "a stranger's certificate refused: {msg}"
    );

    let signed = pki.client("ca.pem", Some("client"));
    let version = call(&s.addr, TOKEN, Some(&signed))
        .await
        .expect("a certificate the client CA signed");
    assert_eq!(version, talon::VERSION);
    // a signed certificate does not replace the token
    call(&s.addr, "not-the-token-not-the-token-0000", Some(&signed))
        .await
        .expect_err("wrong token with a good certificate");
    s.stop().await;
}

/// Connections that never finish the handshake hold their slot only for the
/// handshake bound; the per-peer bound counts them.
#[tokio::test]
async fn a_stalled_tls_handshake_is_timed_out_and_counted_in_the_bounds() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = Pki::new();
    let limits = TcpLimits {
        max_per_peer: 2,
        handshake: Duration::from_secs(2),
        ..Default::default()
    };
    let s = Server::start(&pki, None, limits).await;
    let tls = pki.client("ca.pem", None);
    let mut silent = tokio::net::TcpStream::connect(&s.addr).await.expect("tcp");
    let mut half = tokio::net::TcpStream::connect(&s.addr).await.expect("tcp");
    // the first bytes of a TLS record, then nothing
    half.write_all(&[0x16, 0x03, 0x01, 0x02])
        .await
        .expect("half a hello");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // both slots of this peer are taken: a third connection is closed at once
    call(&s.addr, TOKEN, Some(&tls))
        .await
        .expect_err("over the per-peer bound");
    let started = std::time::Instant::now();
    for c in [&mut silent, &mut half] {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), c.read_to_end(&mut rest))
            .await
            .expect("the server closes a stalled handshake")
            .ok();
    }
    println!("stalled handshakes closed after {:?}", started.elapsed());
    call(&s.addr, TOKEN, Some(&tls))
        .await
        .expect("served once the stalled connections are gone");
    s.stop().await;
}

fn serve_opts(dir: &Path, pki: &Pki, tls: TlsOptions, port: u16) -> talon::serve::ServeOptions {
    let token = dir.join("token");
    std::fs::write(&token, TOKEN).expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let _ = pki;
    talon::serve::ServeOptions {
        data_dir: dir.join("data"),
        config: None,
        socket: dir.join("run/talon.sock"),
        listen_tcp: Some(format!("127.0.0.1:{port}").parse().expect("addr")),
        token_file: Some(token),
        tls,
        run_dir: dir.join("run"),
        host_root: PathBuf::from("/"),
        spdk: talon::controllers::engine::selection::SpdkOptions {
            spdk_tgt: Some(dir.join("no/spdk_tgt")),
            ..Default::default()
        },
        stop_targets_on_exit: true,
        set_aside_orphan_data: false,
    }
}

/// A port for a listener, from this process's reserved block below the
/// ephemeral range (`runtime::testing::free_port`).
fn free_port() -> u16 {
    talon::runtime::testing::free_port()
}

/// `talon serve` with TLS: served over TLS with the client CA's
/// certificates, its peer client (`--tls-peer-ca`, the node's certificate as
/// client certificate) gets through, and bad TLS settings stop it at start
/// with an error naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talon_serve_with_tls_and_its_peer_client() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().expect("tempdir");

    // a key others can read is refused, naming it
    std::fs::set_permissions(pki.path("server.key"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let tls = TlsOptions {
        cert: Some(pki.path("server.pem")),
        key: Some(pki.path("server.key")),
        client_ca: Some(pki.path("ca.pem")),
        peer_ca: Some(pki.path("ca.pem")),
    };
    let e = talon::serve::serve(serve_opts(dir.path(), &pki, tls.clone(), free_port()), async {})
        .await
        .expect_err("a key readable by others");
    let msg = talon::util::error_chain(&e);
    assert!(msg.contains("server.key") && msg.contains("0600"), "{msg}");
    std::fs::set_permissions(pki.path("server.key"), std::fs::Permissions::from_mode(0o600)).expect("chmod");

    // a client CA without a certificate to serve is refused
    let half = TlsOptions {
        client_ca: Some(pki.path("ca.pem")),
        ..Default::default()
    };
    let e = half.server().expect_err("client CA alone");
    assert!(e.to_string().contains("--tls-client-ca"), "{e}");
    // a certificate file that is not PEM
    std::fs::write(pki.path("junk.pem"), "not a certificate\n").expect("junk");
    let e = TlsClient::from_files(&pki.path("junk.pem"), None).expect_err("junk CA");
    assert!(e.to_string().contains("junk.pem"), "{e}");

    let port = free_port();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(talon::serve::serve(
        serve_opts(dir.path(), &pki, tls.clone(), port),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let addr = format!("127.0.0.1:{port}");
    let client = pki.client("ca.pem", Some("client"));
    let mut up = None;
    for _ in 0..300 {
        match call(&addr, TOKEN, Some(&client)).await {
            Ok(v) => {
                up = Some(v);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert_eq!(up.as_deref(), Some(talon::VERSION), "served over TLS");
    call(&addr, TOKEN, None).await.expect_err("plain client refused");
    call(&addr, TOKEN, Some(&pki.client("ca.pem", None)))
        .await
        .expect_err("no client certificate refused");

    // the engine's peer client, as serve builds it from the same options
    let peers = talon::controllers::engine::peer::Peers::new(Some(TOKEN.into()))
        .with_tls(tls.peer_client().expect("peer TLS"));
    let c = peers.connect(&addr).await.expect("peer over TLS");
    assert_eq!(c.node_info().await.expect("call").version, talon::VERSION);
    // and without TLS the peer cannot get through
    let plain = talon::controllers::engine::peer::Peers::new(Some(TOKEN.into()));
    let e = plain.connect(&addr).await.expect_err("plain peer");
    assert!(e.to_string().contains(&addr), "names the peer: {e}");

    let _ = stop_tx.send(());
    daemon.await.expect("join").expect("clean stop");
}
