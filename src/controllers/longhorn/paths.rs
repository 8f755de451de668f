//! The second kernel path of a `spdk-tcp-blockdev` engine-frontend in a
//! switch-over (the new engine's export), connected in the background: a
//! connect may take its whole bound (20 s to an address that does not
//! answer), and the controller's pass serves every instance of the node.
//!
//! ```text
//!   pass: the frontend's switch-over names a new export the kernel has no live path to
//!     no connect of it running ──> one started (spawn_blocking nvme_tcp::connect_path)
//!     one running              ──> nothing (the pass comes back soon)
//!     one ended                ──> its error reported (the next pass starts another), or done
//!   a frontend deleted: a connect of it still running is waited for first, so the
//!   detach that follows removes what it made
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use tokio::task::JoinHandle;

use crate::attach::AttachError;

/// A connect running, of one address.
#[derive(Debug)]
struct Connecting {
    address: SocketAddr,
    task: JoinHandle<Result<String, AttachError>>,
}

/// The second paths being connected, by engine-frontend.
#[derive(Debug, Default)]
pub(super) struct SecondPaths(Mutex<BTreeMap<String, Connecting>>);

/// What [`SecondPaths::look`] found of a frontend's second path.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Look {
    /// A connect runs (just started, or still at it).
    Connecting,
    /// The last connect failed (another starts at the next look).
    Failed(String),
    /// Nothing runs: the path is live.
    Idle,
}

impl SecondPaths {
    /// Frontend `name`'s path to `address`: `live` (the kernel has it live)
    /// ends the look; else a connect is started with `start` unless one of
    /// that address runs, and a connect that ended says how it went.
    pub(super) fn look(
        &self,
        name: &str,
        address: SocketAddr,
        live: bool,
        start: impl FnOnce() -> JoinHandle<Result<String, AttachError>>,
    ) -> Look {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let running = m
            .get(name)
            .is_some_and(|c| c.address == address && !c.task.is_finished());
        if running {
            return Look::Connecting;
        }
        // one of another address (the record names another engine now)
        // ends on its own: its controller goes with the frontend or the
        // kernel's loss timeout
        let ended = m.remove(name).filter(|c| c.address == address);
        if live {
            return Look::Idle;
        }
        if let Some(c) = ended
            && let Some(Ok(Err(e))) = c.task.now_or_never()
        {
            return Look::Failed(crate::util::error_chain(&e));
        }
        m.insert(
            name.to_owned(),
            Connecting {
                address,
                task: start(),
            },
        );
        Look::Connecting
    }

    /// Whether a connect of any frontend runs (the pass comes back soon).
    pub(super) fn any_running(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .any(|c| !c.task.is_finished())
    }

    /// Waits (at most `bound`) for a connect of frontend `name` still
    /// running, so that its detach removes what it made.
    pub(super) async fn settle(&self, name: &str, bound: Duration) {
        let c = self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(name);
        if let Some(c) = c
            && tokio::time::timeout(bound, c.task).await.is_err()
        {
            tracing::warn!(
                frontend = name,
                "a second path's connect still runs after {bound:?}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 2], p))
    }

    /// One connect at a time per frontend; its failure is said once and the
    /// next look starts another; a live path starts nothing.
    #[tokio::test]
    async fn one_connect_at_a_time_its_failure_said_then_tried_again() {
        let p = SecondPaths::default();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let started = std::sync::atomic::AtomicU32::new(0);
        let start = |fail: bool, wait: Option<std::sync::mpsc::Receiver<()>>| {
            started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::task::spawn_blocking(move || {
                if let Some(w) = wait {
                    let _ = w.recv();
                }
                if fail {
                    Err(AttachError::NotLive {
                        controller: "nvme2".into(),
                        nqn: "nqn.x".into(),
                        addr: "10.0.0.2:20001".into(),
                        state: "connecting".into(),
                        waited: Duration::from_secs(1),
                    })
                } else {
                    Ok("nvme2".into())
                }
            })
        };
        let count = || started.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            p.look("ef", addr(1), false, || start(true, Some(rx))),
            Look::Connecting
        );
        assert!(p.any_running());
        // still at it: nothing new started
        assert_eq!(
            p.look("ef", addr(1), false, || start(true, None)),
            Look::Connecting
        );
        assert_eq!(count(), 1);
        tx.send(()).expect("release");
        while p.any_running() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let Look::Failed(why) = p.look("ef", addr(1), false, || start(false, None)) else {
            panic!("the failure is said")
        };
        assert!(why.contains("10.0.0.2:20001"), "{why}");
        assert_eq!(count(), 1, "the look that says the failure starts nothing");
        assert_eq!(
            p.look("ef", addr(1), false, || start(false, None)),
            Look::Connecting
        );
        assert_eq!(count(), 2);
        while p.any_running() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(p.look("ef", addr(1), true, || start(false, None)), Look::Idle);
        assert_eq!(count(), 2, "a live path starts nothing");
        p.settle("ef", Duration::from_secs(1)).await;
    }
}
