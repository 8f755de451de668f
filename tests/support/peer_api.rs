//! A test node's talon admin API on TCP, as `talon serve --listen-tcp
//! --token-file` serves it: what another node's engine calls for the
//! snapshots of the replica it serves.

use std::sync::Arc;

use talon::api::{ApiBuilder, ApiContext};
use talon::runtime::{State, Statuses};

/// The test nodes' token (what `--token-file` holds; one for the cluster).
pub const TOKEN: &str = "0123456789abcdef0123456789abcdef-peer";

/// Serves the admin API of the node whose store is `state` on `addr`
/// (`127.0.0.1:0`: any port); returns where, and the task (abort it to take
/// the node's API away).
pub async fn serve(
    state: &State,
    statuses: Statuses,
    addr: &str,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let ctx = ApiContext {
        state: state.clone(),
        registry: Arc::new(talon::resources::registry()),
        statuses,
        node_info: Arc::new(|| talon::api::types::NodeInfo {
            version: "test".into(),
            hostname: "test".into(),
            kernel: String::new(),
            os_id: String::new(),
            os_name: String::new(),
            data_dir: String::new(),
            engines: vec![],
            host_nqn: String::new(),
            host_iqn: String::new(),
        }),
        node_stop: Arc::new(|_| false),
    };
    let mut api = ApiBuilder::new(ctx);
    talon::api::register_core(&mut api);
    talon::api::volume::register(&mut api);
    let l = tokio::net::TcpListener::bind(addr).await.expect("bind the API");
    let at = l.local_addr().expect("API address");
    let task = tokio::spawn(talon::api::server::serve_tcp(
        l,
        TOKEN.into(),
        api.build(),
        std::future::pending(),
    ));
    (at, task)
}
