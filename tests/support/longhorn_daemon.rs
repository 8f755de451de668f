//! `talon serve` in-process with its Longhorn instance-manager listeners
//! (`#[path]`-included): five consecutive free ports from a base (the
//! process manager, proxy, disk, instance and SPDK services), a daemon
//! serving them, a gRPC channel to one, and a clean stop.
//!
//! ```text
//!   free_base() = b ──Daemon::serve(opts, b, ports)──> 127.0.0.1:b..=b+4 ──channel(i)──> b+i
//! ```

#![allow(dead_code)] // each includer uses a part

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

use talon::longhorn::bounds::GrpcLimits;
use talon::longhorn::server::LonghornOptions;
use talon::serve::{ServeOptions, serve_with};
use tonic::transport::Channel;

/// The first of five consecutive free ports on 127.0.0.1, in a block
/// reserved for this test process (`reserve_ports`): the services at
/// base..=base+4, the instances' ports from [`instance_ports`].
pub fn free_base() -> u16 {
    talon::runtime::testing::reserve_ports(&[std::net::IpAddr::from([127, 0, 0, 1])])
}

/// The instance ports of the block that starts at `base`.
pub fn instance_ports(base: u16) -> RangeInclusive<u16> {
    base + 5..=base + talon::runtime::testing::PORT_BLOCK - 1
}

/// A running `serve_with` task with the Longhorn listeners from `base`.
pub struct Daemon {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), talon::serve::ServeError>>,
    pub base: u16,
}

impl Daemon {
    /// Serves `opts` with the Longhorn listeners from `base` (instances get
    /// ports from `ports`); returns once the instance service answers.
    pub async fn serve(opts: ServeOptions, base: u16, ports: RangeInclusive<u16>) -> Daemon {
        Self::serve_within(opts, base, ports, GrpcLimits::default()).await
    }

    /// [`Daemon::serve`] with other gRPC bounds.
    pub async fn serve_within(
        opts: ServeOptions,
        base: u16,
        ports: RangeInclusive<u16>,
        limits: GrpcLimits,
    ) -> Daemon {
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let lh = LonghornOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], base)),
            ports,
            limits,
            overcommit_percent: LonghornOptions::DEFAULT_OVERCOMMIT_PERCENT,
        };
        let mut task = tokio::spawn(serve_with(opts, Some(lh), async move {
            let _ = rx.await;
        }));
        let url = format!("http://127.0.0.1:{}", base + 3);
        talon::runtime::testing::until_listening(&url, &mut task, Duration::from_secs(30)).await;
        Daemon { stop, task, base }
    }

    /// The URL of listener `i` (0 to 4).
    pub fn url(&self, i: u16) -> String {
        format!("http://127.0.0.1:{}", self.base + i)
    }

    pub async fn channel(&self, i: u16) -> Channel {
        Channel::from_shared(self.url(i))
            .expect("url")
            .connect()
            .await
            .expect("connect")
    }

    /// Asks the daemon to stop; it must end without an error.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("join").expect("clean stop");
    }
}
