//! `talon serve` in-process, as the tests that drive a whole daemon start it
//! (`#[path]`-included): options rooted in a temp dir, a running daemon with
//! an API client on its Unix socket, and a clean stop.
//!
//! ```text
//!   opts(dir, spdk) ──start──> Daemon { client ──> dir/run/talon.sock } ──stop──> Ok(())
//! ```

#![allow(dead_code)] // each includer uses a part

use std::path::{Path, PathBuf};
use std::time::Duration;

use talon::client::Client;
use talon::controllers::engine::selection::SpdkOptions;
use talon::serve::{ServeOptions, serve};

/// A daemon's options with everything under `dir` (`data/`, `run/`), no
/// config file, no TCP listener, and `spdk` for its V2 engine. The
/// in-process daemons of the tests stop the targets they start.
pub fn opts(dir: &Path, spdk: SpdkOptions) -> ServeOptions {
    ServeOptions {
        data_dir: dir.join("data"),
        config: None,
        socket: dir.join("run/talon.sock"),
        listen_tcp: None,
        token_file: None,
        tls: Default::default(),
        run_dir: dir.join("run"),
        host_root: PathBuf::from("/"),
        spdk,
        stop_targets_on_exit: true,
        set_aside_orphan_data: false,
    }
}

/// A port for a listener, from this process's reserved block below the
/// ephemeral range (`runtime::testing::free_port`).
pub fn free_port() -> u16 {
    talon::runtime::testing::free_port()
}

/// [`opts`] for a V1 node (no SPDK) whose iSCSI target listens on a free
/// port of its own: other tests' daemons hold 3260.
pub fn v1_opts(dir: &Path) -> ServeOptions {
    opts_with_config(
        dir,
        no_spdk(),
        &format!(
            "node: {{ engine: v1, listenAddress: 127.0.0.1, iscsiPort: {} }}\n",
            free_port()
        ),
    )
}

/// [`opts`] with `yaml` as the daemon's config file, written to `dir/talon.yaml`.
pub fn opts_with_config(dir: &Path, spdk: SpdkOptions, yaml: &str) -> ServeOptions {
    let config = dir.join("talon.yaml");
    std::fs::write(&config, yaml).expect("config");
    ServeOptions {
        config: Some(config),
        ..opts(dir, spdk)
    }
}

/// No SPDK, whatever the environment has (`TALON_SPDK_DIR`, `PATH`): the
/// daemon serves with the V1 engine and sizes no hugepages. Tests of the
/// daemon's API use this, so a run with SPDK (CI) does not start spdk_tgt on
/// core 0 for them nor leave the host's hugepage pool sized for it.
pub fn no_spdk() -> SpdkOptions {
    SpdkOptions {
        spdk_tgt: None,
        spdk_dir: None,
        path_var: Some(std::ffi::OsString::new()),
        ..SpdkOptions::default()
    }
}

/// The V2 engine on a real spdk_tgt under `spdk_dir` on a host without
/// hugepages: `mem_mib` of ordinary memory, no cpumask locks (other jobs may
/// run SPDK on core 0).
pub fn real_spdk(spdk_dir: &Path, mem_mib: u64) -> SpdkOptions {
    SpdkOptions {
        spdk_tgt: None,
        spdk_dir: Some(spdk_dir.to_path_buf()),
        path_var: None,
        no_huge: true,
        no_huge_mem_mib: mem_mib,
        extra_args: vec!["--disable-cpumask-locks".into()],
        ..SpdkOptions::default()
    }
}

/// A running `serve` task and a client on its API socket.
pub struct Daemon {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), talon::serve::ServeError>>,
    pub client: Client,
}

/// Starts `serve` with `o` and waits until its API socket answers.
pub async fn start(o: ServeOptions) -> Daemon {
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let socket = o.socket.clone();
    let task = tokio::spawn(serve(o, async move {
        let _ = rx.await;
    }));
    let client = talon::runtime::testing::eventually("the API socket", Duration::from_secs(30), || async {
        Client::connect_unix(&socket).await.ok()
    })
    .await;
    Daemon { stop, task, client }
}

impl Daemon {
    /// Asks the daemon to stop; it must end without an error.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("join").expect("clean stop");
    }
}
