//! `TALON_LOG=trace` never writes a secret: the TCP listener's bearer token
//! sent by a client is nowhere in talon's log.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use talon::client::Client;
use talon::serve::{ServeOptions, serve};

#[path = "support/serve_daemon.rs"]
mod serve_daemon;

const TOKEN: &str = "0123456789abcdef0123456789abcdef-secret";

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn opts(dir: &Path) -> ServeOptions {
    serve_daemon::opts(dir, serve_daemon::no_spdk())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_logs_never_hold_the_bearer_token() {
    let buf = Buf::default();
    let w = buf.clone();
    // without talon's caps, jsonrpsee-server logged the upgrade request with
    // its headers at trace: "authorization": "Bearer <token>"
    tracing_subscriber::fmt()
        .with_env_filter(talon::cli::log_filter(Some("trace")))
        .with_ansi(false)
        .with_writer(move || w.clone())
        .init();
    tracing::trace!(target: "talon::test", "trace is on");
    let dir = tempfile::tempdir().expect("tempdir");
    let port = serve_daemon::free_port();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut o = opts(dir.path());
    o.listen_tcp = Some(format!("127.0.0.1:{port}").parse().expect("addr"));
    o.token_file = Some(token_file);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(o, async move {
        let _ = rx.await;
    }));
    let addr = format!("127.0.0.1:{port}");
    let mut client = None;
    for _ in 0..200 {
        if let Ok(c) = Client::connect_tcp(&addr, TOKEN).await {
            client = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = client.expect("connect with the token");
    c.node_info().await.expect("an authorized call");
    drop(c);
    let _ = tx.send(());
    task.await.expect("join").expect("clean stop");
    let log = String::from_utf8_lossy(&buf.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    assert!(
        log.contains("TRACE talon::test: trace is on"),
        "the log is at trace level"
    );
    let leaks: Vec<&str> = log.lines().filter(|l| l.contains(TOKEN)).collect();
    assert!(leaks.is_empty(), "the token is in the log:\n{}", leaks.join("\n"));
}
