//! Spawning a program inside a target's namespaces, with no `nsenter`.
//!
//! ```text
//!  parent: TargetNamespaces (fds open) ── report pipe (O_CLOEXEC) ──┐
//!    │  [pid ns wanted: spawn from a throwaway thread that setns(pid) first]
//!    ├─ fork ─> child: setns(ipc,uts,net,mnt) ─ chdir(cwd) ─ execvp (PATH of the target ns)
//!    │            └ on failure: write the failing namespace's index to the report pipe
//!    └─ poll(stdin out, stdout in, stderr in, pidfd) until exit or deadline ─> kill
//! ```

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};

use super::target::{NsKind, enter_error};
use super::{Namespaces, NsError, Target, TargetNamespaces};
use crate::util::HostRoot;

/// The time limit of an [`NsCommand`] unless set otherwise.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// The report-pipe byte for a failed `chdir` (namespace failures send their index
/// in [`NsKind::ORDER`]).
const REPORT_CWD: u8 = 0xfe;

/// A program to run inside a target's namespaces; a builder like
/// [`std::process::Command`]. The program is looked up in `PATH` inside the
/// target's mount namespace, and the working directory is entered there too.
#[derive(Debug, Clone)]
pub struct NsCommand {
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(OsString, Option<OsString>)>,
    env_clear: bool,
    cwd: Option<PathBuf>,
    stdin: Option<Vec<u8>>,
    timeout: Option<Duration>,
}

impl NsCommand {
    /// A command running `program` with no arguments, the current environment,
    /// no stdin, and [`DEFAULT_COMMAND_TIMEOUT`].
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        Self {
            program: program.as_ref().to_os_string(),
            args: Vec::new(),
            envs: Vec::new(),
            env_clear: false,
            cwd: None,
            stdin: None,
            timeout: Some(DEFAULT_COMMAND_TIMEOUT),
        }
    }

    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        self.envs
            .push((key.as_ref().to_os_string(), Some(value.as_ref().to_os_string())));
        self
    }

    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut Self {
        self.envs.push((key.as_ref().to_os_string(), None));
        self
    }

    pub fn env_clear(&mut self) -> &mut Self {
        self.env_clear = true;
        self.envs.clear();
        self
    }

    /// The working directory, as a path in the target's mount namespace.
    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Self {
        self.cwd = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Bytes fed to the program's stdin (then closed). Without it stdin is
    /// `/dev/null` for [`output`](Self::output) and inherited for [`status`](Self::status).
    pub fn stdin_bytes(&mut self, data: Vec<u8>) -> &mut Self {
        self.stdin = Some(data);
        self
    }

    /// Kill the program (SIGKILL) when it runs longer than this.
    pub fn timeout(&mut self, timeout: Duration) -> &mut Self {
        self.timeout = Some(timeout);
        self
    }

    /// Wait for the program however long it runs.
    pub fn no_timeout(&mut self) -> &mut Self {
        self.timeout = None;
        self
    }

    /// The program name, for messages.
    pub fn program(&self) -> String {
        self.program.to_string_lossy().into_owned()
    }

    /// Runs the program in the namespaces `nss` of `target`, capturing stdout and
    /// stderr. A non-zero exit is not an error: check `output.status`.
    pub fn output(&self, root: &HostRoot, target: &Target, nss: Namespaces) -> Result<Output, NsError> {
        let ns = TargetNamespaces::open(root, target, nss)?;
        self.output_in(&ns)
    }

    /// [`output`](Self::output) with namespaces opened beforehand.
    pub fn output_in(&self, ns: &TargetNamespaces) -> Result<Output, NsError> {
        let (status, stdout, stderr) = self.run(ns, true)?;
        Ok(Output {
            status,
            stdout,
            stderr,
        })
    }

    /// Runs the program with stdout and stderr passed through (stdin too, unless
    /// [`stdin_bytes`](Self::stdin_bytes) was given) and returns its exit status.
    pub fn status(&self, root: &HostRoot, target: &Target, nss: Namespaces) -> Result<ExitStatus, NsError> {
        let ns = TargetNamespaces::open(root, target, nss)?;
        self.status_in(&ns)
    }

    /// [`status`](Self::status) with namespaces opened beforehand.
    pub fn status_in(&self, ns: &TargetNamespaces) -> Result<ExitStatus, NsError> {
        self.run(ns, false).map(|(status, _, _)| status)
    }

    fn run(&self, ns: &TargetNamespaces, capture: bool) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), NsError> {
        let mut child = self.spawn_in(ns, capture)?;
        let io_err = |source| NsError::CommandIo {
            program: self.program(),
            target: ns.label().to_string(),
            source,
        };
        let mut io = ChildIo {
            stdin: child.stdin.take().map(OwnedFd::from),
            stdin_data: self.stdin.as_deref().unwrap_or_default(),
            stdout: child.stdout.take().map(OwnedFd::from),
            stderr: child.stderr.take().map(OwnedFd::from),
            out: Vec::new(),
            err: Vec::new(),
        };
        match io.drive(&mut child, self.timeout, capture) {
            Ok(Some(status)) => Ok((status, io.out, io.err)),
            Ok(None) => Err(NsError::CommandTimeout {
                program: self.program(),
                target: ns.label().to_string(),
                timeout: self.timeout.unwrap_or_default(),
            }),
            Err(e) => {
                kill(&mut child, capture);
                Err(io_err(e))
            }
        }
    }

    fn spawn_in(&self, ns: &TargetNamespaces, capture: bool) -> Result<Child, NsError> {
        let program = self.program();
        let label = ns.label().to_string();
        let spawn_err = |source| NsError::Spawn {
            program: program.clone(),
            target: label.clone(),
            source,
        };

        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        if self.env_clear {
            cmd.env_clear();
        }
        for (k, v) in &self.envs {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        cmd.stdin(if self.stdin.is_some() {
            Stdio::piped()
        } else if capture {
            Stdio::null()
        } else {
            Stdio::inherit()
        });
        if capture {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            // Its own process group, so a timeout kills what it forked too. Not for
            // pass-through, where the terminal's job control must reach it.
            cmd.process_group(0);
        }

        let cwd = match &self.cwd {
            Some(dir) => Some(CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
                spawn_err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the working directory contains NUL",
                ))
            })?),
            None => None,
        };
        let to_enter = ns.to_enter()?;
        let pid_fd = to_enter
            .iter()
            .find(|(k, _)| *k == NsKind::Pid)
            .map(|(_, fd)| *fd);
        let entries: Vec<ChildEntry> = to_enter
            .iter()
            .filter(|(k, _)| *k != NsKind::Pid)
            .map(|(k, fd)| ChildEntry {
                fd: *fd,
                nstype: k.clone_flag().bits(),
                report: NsKind::ORDER.iter().position(|o| o == k).unwrap_or(0) as u8,
            })
            .collect();
        let (report_r, report_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| spawn_err(io::Error::from(e)))?;
        let report_fd = report_w.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and only calls
        // async-signal-safe functions (setns, chdir, write): it allocates nothing and
        // takes no locks; its captures were built in the parent. The raw fds it uses
        // (namespace files, report pipe) stay open in the parent until spawn returns,
        // so the child's copies are valid.
        unsafe {
            cmd.pre_exec(move || enter_in_child(&entries, cwd.as_deref(), report_fd));
        }

        let spawned = match pid_fd {
            None => cmd.spawn(),
            Some(fd) => spawn_in_pid_ns(cmd, ns.clone(), fd, &label)?,
        };
        drop(report_w);
        match spawned {
            Ok(child) => Ok(child),
            Err(source) => {
                let mut byte = [0u8; 1];
                let reported = match std::fs::File::from(report_r).read(&mut byte) {
                    Ok(1) => Some(byte[0]),
                    _ => None,
                };
                let errno = Errno::from_raw(source.raw_os_error().unwrap_or(0));
                Err(match reported {
                    Some(REPORT_CWD) => NsError::ChangeDir {
                        program,
                        dir: self.cwd.clone().unwrap_or_default(),
                        target: label,
                        source,
                    },
                    Some(i) if (i as usize) < NsKind::ORDER.len() => {
                        enter_error(NsKind::ORDER[i as usize], &label, errno)
                    }
                    _ => spawn_err(source),
                })
            }
        }
    }
}

/// One namespace the child enters: raw fd, CLONE_NEW* type, report byte.
#[derive(Debug, Clone, Copy)]
struct ChildEntry {
    fd: RawFd,
    nstype: libc::c_int,
    report: u8,
}

/// Runs in the forked child between fork and exec: async-signal-safe calls only.
fn enter_in_child(entries: &[ChildEntry], cwd: Option<&CStr>, report_fd: RawFd) -> io::Result<()> {
    for e in entries {
        // SAFETY: setns is a plain system call on a descriptor the parent keeps open.
        if unsafe { libc::setns(e.fd, e.nstype) } != 0 {
            let err = io::Error::last_os_error();
            report(report_fd, e.report);
            return Err(err);
        }
    }
    if let Some(dir) = cwd {
        // SAFETY: chdir reads a NUL-terminated string that outlives the call.
        if unsafe { libc::chdir(dir.as_ptr()) } != 0 {
            let err = io::Error::last_os_error();
            report(report_fd, REPORT_CWD);
            return Err(err);
        }
    }
    Ok(())
}

fn report(fd: RawFd, byte: u8) {
    // SAFETY: write(2) of one byte from a live stack buffer; async-signal-safe.
    let _ = unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
}

/// Forks from a throwaway thread that joined the target's pid namespace first:
/// `setns(CLONE_NEWPID)` only moves the caller's future children.
fn spawn_in_pid_ns(
    mut cmd: Command,
    ns: TargetNamespaces,
    pid_fd: RawFd,
    label: &str,
) -> Result<io::Result<Child>, NsError> {
    let handle = std::thread::Builder::new()
        .name("talon-ns-spawn".to_string())
        .spawn(move || -> Result<io::Result<Child>, NsError> {
            // SAFETY: `ns` (moved here) owns the descriptor and keeps it open.
            let fd = unsafe { BorrowedFd::borrow_raw(pid_fd) };
            nix::sched::setns(fd, NsKind::Pid.clone_flag())
                .map_err(|errno| enter_error(NsKind::Pid, ns.label(), errno))?;
            Ok(cmd.spawn())
        })
        .map_err(|source| NsError::SpawnThread {
            target: label.to_string(),
            source,
        })?;
    handle.join().unwrap_or_else(|_| {
        Err(NsError::Panicked {
            target: label.to_string(),
            message: "the spawner thread panicked".to_string(),
        })
    })
}

fn kill(child: &mut Child, group: bool) {
    if group {
        // The child is not reaped yet, so its pid (= process group id) is still ours.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

struct ChildIo<'a> {
    stdin: Option<OwnedFd>,
    stdin_data: &'a [u8],
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    out: Vec<u8>,
    err: Vec<u8>,
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Reads what is available; Ok(false) at end of file.
fn drain(fd: &OwnedFd, buf: &mut Vec<u8>) -> io::Result<bool> {
    let mut chunk = [0u8; 16384];
    loop {
        match nix::unistd::read(fd, &mut chunk) {
            Ok(0) => return Ok(false),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(Errno::EAGAIN) => return Ok(true),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor (with
    // close-on-exec set) or -1; nothing else is touched.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if raw < 0 {
        return None;
    }
    // SAFETY: the kernel just returned this descriptor to us and nobody else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(raw as RawFd) })
}

impl ChildIo<'_> {
    /// Feeds stdin, collects stdout and stderr, and waits for the exit. Ok(None) on
    /// timeout (the child has then been killed and reaped).
    fn drive(
        &mut self,
        child: &mut Child,
        timeout: Option<Duration>,
        group: bool,
    ) -> io::Result<Option<ExitStatus>> {
        for fd in [&self.stdin, &self.stdout, &self.stderr].into_iter().flatten() {
            set_nonblocking(fd)?;
        }
        if self.stdin_data.is_empty() {
            self.stdin = None;
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let pidfd = pidfd_open(child.id());
        loop {
            if let Some(status) = child.try_wait()? {
                // Everything the child wrote is in the pipes now; take it and stop
                // (a grandchild that kept them open does not hold us up).
                if let Some(fd) = &self.stdout {
                    drain(fd, &mut self.out)?;
                }
                if let Some(fd) = &self.stderr {
                    drain(fd, &mut self.err)?;
                }
                return Ok(Some(status));
            }
            let mut wait_ms: libc::c_int = -1;
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    kill(child, group);
                    return Ok(None);
                }
                wait_ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
            }
            if pidfd.is_none() {
                // No pidfd (old kernel): look at the child every 10 ms.
                wait_ms = if wait_ms < 0 { 10 } else { wait_ms.min(10) };
            }
            let mut fds: Vec<libc::pollfd> = Vec::with_capacity(4);
            let mut push = |fd: Option<BorrowedFd<'_>>, events| {
                if let Some(fd) = fd {
                    fds.push(libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events,
                        revents: 0,
                    });
                }
            };
            push(self.stdin.as_ref().map(|f| f.as_fd()), libc::POLLOUT);
            push(self.stdout.as_ref().map(|f| f.as_fd()), libc::POLLIN);
            push(self.stderr.as_ref().map(|f| f.as_fd()), libc::POLLIN);
            push(pidfd.as_ref().map(|f| f.as_fd()), libc::POLLIN);
            // SAFETY: `fds` is a live, correctly sized array of pollfd structures whose
            // descriptors stay open for the duration of the call.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let ready = |fd: &Option<OwnedFd>| {
                fd.as_ref()
                    .and_then(|f| fds.iter().find(|p| p.fd == f.as_raw_fd()))
                    .is_some_and(|p| p.revents != 0)
            };
            let (stdin_ready, out_ready, err_ready) =
                (ready(&self.stdin), ready(&self.stdout), ready(&self.stderr));
            if stdin_ready {
                self.feed_stdin();
            }
            if out_ready
                && let Some(fd) = &self.stdout
                && !drain(fd, &mut self.out)?
            {
                self.stdout = None;
            }
            if err_ready
                && let Some(fd) = &self.stderr
                && !drain(fd, &mut self.err)?
            {
                self.stderr = None;
            }
        }
    }

    fn feed_stdin(&mut self) {
        loop {
            let Some(fd) = &self.stdin else { return };
            match nix::unistd::write(fd, self.stdin_data) {
                Ok(n) => {
                    self.stdin_data = &self.stdin_data[n..];
                    if self.stdin_data.is_empty() {
                        self.stdin = None; // close: the program sees end of file
                        return;
                    }
                }
                Err(Errno::EAGAIN) => return,
                Err(Errno::EINTR) => continue,
                // EPIPE and friends: the program does not want (more) input.
                Err(_) => {
                    self.stdin = None;
                    return;
                }
            }
        }
    }
}

/// The shell-style exit code of a status: the code, or 128 + the signal number.
pub fn exit_code(status: &ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Target {
        Target::Pid(std::process::id())
    }

    #[test]
    fn runs_a_program_with_args_env_cwd_and_stdin() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = NsCommand::new("sh")
            .args(["-c", "pwd; echo \"$TALON_X\"; cat; echo err >&2; exit 3"])
            .env("TALON_X", "x-value")
            .current_dir(dir.path())
            .stdin_bytes(b"from-stdin\n".to_vec())
            .output(&HostRoot::real(), &me(), Namespaces::ALL_BUT_PID)
            .expect("output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let cwd = dir.path().canonicalize().expect("canon");
        assert_eq!(stdout, format!("{}\nx-value\nfrom-stdin\n", cwd.display()));
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.status.code(), Some(3));
    }

    #[test]
    fn large_output_and_timeouts() {
        let out = NsCommand::new("head")
            .args(["-c", "1000000", "/dev/zero"])
            .output(&HostRoot::real(), &me(), Namespaces::NET)
            .expect("output");
        assert_eq!(out.stdout.len(), 1_000_000);
        let out = NsCommand::new("wc")
            .arg("-c")
            .stdin_bytes(vec![b'x'; 1_000_000])
            .output(&HostRoot::real(), &me(), Namespaces::NET)
            .expect("wc");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1000000");

        let err = NsCommand::new("sleep")
            .arg("30")
            .timeout(Duration::from_millis(50))
            .output(&HostRoot::real(), &me(), Namespaces::NET)
            .expect_err("timeout");
        assert!(matches!(err, NsError::CommandTimeout { .. }), "{err:?}");
        assert!(err.to_string().contains("\"sleep\""), "{err}");
    }

    #[test]
    fn missing_program_and_directory_are_named() {
        let err = NsCommand::new("talon-no-such-program")
            .output(&HostRoot::real(), &me(), Namespaces::NET)
            .expect_err("missing");
        assert!(
            matches!(err, NsError::Spawn { .. }) && err.to_string().contains("talon-no-such-program"),
            "{err}"
        );
        let err = NsCommand::new("true")
            .current_dir("/talon/no/such/dir")
            .output(&HostRoot::real(), &me(), Namespaces::NET)
            .expect_err("cwd");
        assert!(
            matches!(err, NsError::ChangeDir { .. }) && err.to_string().contains("/talon/no/such/dir"),
            "{err}"
        );
    }

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(&ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(&ExitStatus::from_raw(9)), 137);
    }
}
