//! Helpers for controller tests: an in-memory runtime and eventually-style asserts.

use std::future::Future;
use std::time::Duration;

use super::controller::Controller;
use super::runner::{Runtime, RuntimeError, RuntimeHandle, Statuses};
use super::state::State;

/// Sends this test's logs (talon's at info, others' warnings) to the test's
/// output, which the test runner shows when the test fails; `RUST_LOG`
/// chooses otherwise. Once per process; later calls do nothing.
pub fn capture_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,talon=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_test_writer()
        .try_init();
}

/// An in-memory runtime running the given controllers.
#[derive(Debug)]
pub struct TestRuntime {
    /// The store the controllers work on.
    pub state: State,
    handle: Option<RuntimeHandle>,
    statuses: Statuses,
}

impl TestRuntime {
    /// Starts a runtime on an in-memory store; `register` adds the controllers.
    pub fn start(
        register: impl FnOnce(&mut Runtime) -> Result<(), RuntimeError>,
    ) -> Result<Self, RuntimeError> {
        Self::start_on(State::in_memory(), register)
    }

    /// Starts a runtime on a given store.
    pub fn start_on(
        state: State,
        register: impl FnOnce(&mut Runtime) -> Result<(), RuntimeError>,
    ) -> Result<Self, RuntimeError> {
        let mut rt = Runtime::new(state.clone());
        register(&mut rt)?;
        let statuses = rt.statuses();
        Ok(Self {
            state,
            handle: Some(rt.start()),
            statuses,
        })
    }

    /// Starts a runtime with one controller.
    pub fn with(c: impl Controller) -> Result<Self, RuntimeError> {
        Self::start(|rt| rt.register(c))
    }

    /// The controllers' statuses.
    pub fn statuses(&self) -> Statuses {
        self.statuses.clone()
    }

    /// Stops the controllers.
    pub async fn stop(mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown().await;
        }
    }
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
/// This is a wait for an outcome, not a timing assertion: the timeout is generous.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = crate::util::Backoff::new(Duration::from_millis(5), Duration::from_millis(100));
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(delay.next_delay()).await;
    }
}

/// Waits until gRPC port `url` (a `talon serve` task's Longhorn listener)
/// takes a connection, within `timeout`. A daemon that ended first (a port
/// taken, a store it could not open) panics with what it ended with,
/// instead of waiting for a port that never comes.
pub async fn until_listening<T: std::fmt::Debug>(
    url: &str,
    task: &mut tokio::task::JoinHandle<T>,
    timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if tonic::transport::Channel::from_shared(url.to_owned())
            .expect("url")
            .connect()
            .await
            .is_ok()
        {
            return;
        }
        if task.is_finished() {
            panic!(
                "talon serve ended before its port {url} answered: {:?}",
                task.await
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{url} did not answer within {timeout:?}; talon serve still runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ports a test's listeners may use, reserved among every test process on
/// this machine: a block of [`PORT_BLOCK`] consecutive ports below the
/// kernel's ephemeral range (as Longhorn's own instance ports, 20001-30000),
/// so no outgoing connection takes one of them as its local port before the
/// listener that comes later (an SPDK export) binds it, and no concurrent
/// test chooses an overlapping range. The reservation is a file under
/// `$TMPDIR/talon-test-ports` naming this process; it holds until the
/// process ends (a test process), and a file whose process is gone is taken
/// over. Every port of the block was free on each of `ips` when reserved.
pub fn reserve_ports(ips: &[std::net::IpAddr]) -> u16 {
    use std::io::Write;
    let lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|lo| *lo > FIRST_PORT + 4 * PORT_BLOCK)
        .unwrap_or(32768);
    let blocks = (lo - FIRST_PORT) / PORT_BLOCK;
    let dir = std::env::temp_dir().join("talon-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    let me = std::process::id();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ me.rotate_left(16);
    for attempt in 0..(4 * u32::from(blocks)) {
        let k = (seed.wrapping_add(attempt.wrapping_mul(7919)) % u32::from(blocks)) as u16;
        let base = FIRST_PORT + k * PORT_BLOCK;
        let marker = dir.join(base.to_string());
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&marker)
        {
            Ok(mut f) => {
                let _ = writeln!(f, "{me}");
                let free = ips
                    .iter()
                    .all(|ip| (0..PORT_BLOCK).all(|i| std::net::TcpListener::bind((*ip, base + i)).is_ok()));
                if free {
                    return base;
                }
                let _ = std::fs::remove_file(&marker);
            }
            Err(_) => {
                let owner = std::fs::read_to_string(&marker)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok());
                let alive =
                    owner.is_some_and(|p| p == me || std::path::Path::new(&format!("/proc/{p}")).exists());
                if !alive && owner.is_some() {
                    let _ = std::fs::remove_file(&marker);
                }
            }
        }
    }
    panic!("no free block of {PORT_BLOCK} ports below {lo} on {ips:?}");
}

/// The size of a [`reserve_ports`] block.
pub const PORT_BLOCK: u16 = 128;
const FIRST_PORT: u16 = 20000;

/// A port on 127.0.0.1 for a listener of this test, free now and handed out
/// once per process: taken in turn from this process's [`reserve_ports`]
/// blocks (below the ephemeral range, reserved among test processes), never
/// from the ephemeral range an outgoing connection may take it from.
pub fn free_port() -> u16 {
    static NEXT: std::sync::Mutex<Option<(u16, u16)>> = std::sync::Mutex::new(None);
    let local = [std::net::IpAddr::from([127, 0, 0, 1])];
    let mut next = NEXT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let (base, i) = match *next {
            Some((base, i)) if i < PORT_BLOCK => (base, i),
            _ => (reserve_ports(&local), 0),
        };
        *next = Some((base, i + 1));
        if std::net::TcpListener::bind((local[0], base + i)).is_ok() {
            return base + i;
        }
    }
}
