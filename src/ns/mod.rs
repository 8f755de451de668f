//! Running closures and programs inside another process's namespaces, with no
//! `nsenter` binary (Talos has none): host (pid 1), `iscsid`, `kubelet`, a pid.
//!
//! ```text
//!   Target ──resolve (<root>/proc)──> TargetNamespaces (ns fds, O_CLOEXEC, opened once)
//!                                          │
//!        run_in(closure) ──────────────────┼──> new OS thread: unshare(CLONE_FS),
//!                                          │      setns(ipc,uts,net,pid,mnt), closure,
//!                                          │      result over a channel; thread exits
//!        NsCommand::output/status ─────────┴──> fork; child: setns .. chdir (pre_exec)
//!                                                 exec; parent: poll stdio + pidfd, timeout
//!   read_file / write_file / create_dir_all / lock = run_in(mnt) + std::fs
//! ```
//!
//! Namespaces are entered only on threads that are thrown away afterwards and in
//! forked children, so nothing leaks into the rest of the process. A namespace the
//! thread is already in (same nsfs inode) is not entered again.

mod command;
mod error;
mod files;
mod target;

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::time::Duration;

pub use command::{DEFAULT_COMMAND_TIMEOUT, NsCommand, exit_code};
pub use error::NsError;
pub use files::{NsLock, create_dir_all, in_mnt, lock, read_file, write_file};
pub use target::{MAX_RESOLVE_ATTEMPTS, Namespaces, NsKind, Target, TargetNamespaces, find_process};

use crate::util::HostRoot;

/// The time limit of the file helpers ([`read_file`], [`write_file`], ...).
pub const FILE_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `f` inside the namespaces `nss` of `target` and returns its result.
///
/// `f` runs on a new OS thread that `unshare(CLONE_FS)`s and `setns`es into each
/// namespace, then exits; it is never reused. When `f` does not return within
/// `timeout`, [`NsError::Timeout`] is returned and the thread is left to finish
/// on its own (a closure cannot be cancelled). With `nss.pid`, only processes
/// that `f` forks land in the target's pid namespace.
pub fn run_in<T, F>(
    root: &HostRoot,
    target: &Target,
    nss: Namespaces,
    timeout: Duration,
    f: F,
) -> Result<T, NsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    TargetNamespaces::open(root, target, nss)?.run(timeout, f)
}

type ThreadResult<T> = Result<Result<T, Box<dyn Any + Send>>, NsError>;

impl TargetNamespaces {
    /// Runs `f` inside these namespaces on a dedicated thread; see [`run_in`].
    pub fn run<T, F>(&self, timeout: Duration, f: F) -> Result<T, NsError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel::<ThreadResult<T>>(1);
        let this = self.clone();
        let handle = std::thread::Builder::new()
            .name("talon-ns".to_string())
            .spawn(move || {
                let res = this
                    .enter_current_thread()
                    .map(|()| catch_unwind(AssertUnwindSafe(f)));
                let _ = tx.send(res);
            })
            .map_err(|source| NsError::SpawnThread {
                target: self.label().to_string(),
                source,
            })?;
        let res = match rx.recv_timeout(timeout) {
            Ok(res) => res,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(NsError::Timeout {
                    target: self.label().to_string(),
                    timeout,
                });
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Ok(Err(Box::new("the worker thread died") as _)),
        };
        // The thread exits right after sending; joining guarantees that no thread
        // of this process is left in the target's namespaces when we return.
        let _ = handle.join();
        match res? {
            Ok(v) => Ok(v),
            Err(payload) => Err(NsError::Panicked {
                target: self.label().to_string(),
                message: panic_message(&*payload),
            }),
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_ns(kind: &str) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/proc/thread-self/ns/{kind}"))
            .expect("own ns")
            .ino()
    }

    #[test]
    fn runs_in_own_namespaces_without_switching_and_reports_panics() {
        // Our own pid: every namespace is the one we are in, so nothing is entered
        // (works unprivileged too).
        let target = Target::Pid(std::process::id());
        let me = own_ns("net");
        let got = run_in(
            &HostRoot::real(),
            &target,
            Namespaces::ALL_BUT_PID,
            FILE_TIMEOUT,
            move || own_ns("net"),
        )
        .expect("run_in");
        assert_eq!(got, me);

        let err = run_in(
            &HostRoot::real(),
            &target,
            Namespaces::NET,
            FILE_TIMEOUT,
            || -> u32 { panic!("boom in closure") },
        )
        .expect_err("panic");
        assert!(err.to_string().contains("boom in closure"), "{err}");

        let err = run_in(
            &HostRoot::real(),
            &target,
            Namespaces::NET,
            Duration::from_millis(20),
            || std::thread::sleep(Duration::from_millis(500)),
        )
        .expect_err("timeout");
        assert!(matches!(err, NsError::Timeout { .. }), "{err:?}");
    }
}
