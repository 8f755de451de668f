//! Shared helpers of the tgt process tests: prerequisites (root, tgtd, the
//! libiscsi clients), a tgtd that is always stopped, and a small libiscsi
//! client loaded with dlopen (Debian's `libiscsi-bin` has no tool that writes
//! chosen bytes, so raw WRITE16/READ16 go through libiscsi.so.7 itself).
#![allow(dead_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use talon::tgt::{Tgtd, TgtdConfig};

/// The shared library of `libiscsi7` (a dependency of `libiscsi-bin`).
pub const LIBISCSI: &str = "libiscsi.so.7";

fn on_path(program: &str) -> bool {
    which::which(program).is_ok()
}

/// Returns false (after printing `SKIP <test>: <reason>`) when something the
/// tgt tests need is missing.
pub fn ready(test: &str) -> bool {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP {test}: needs root (tgtd)");
        return false;
    }
    for p in ["tgtd", "tgtadm", "iscsi-inq", "iscsi-readcapacity16"] {
        if !on_path(p) {
            eprintln!("SKIP {test}: {p} not found (apt-get install tgt libiscsi-bin)");
            return false;
        }
    }
    if Libiscsi::load().is_err() {
        eprintln!("SKIP {test}: {LIBISCSI} cannot be loaded (apt-get install libiscsi-bin)");
        return false;
    }
    true
}

/// A port for a listener, from this process's reserved block below the
/// ephemeral range (`runtime::testing::free_port`).
pub fn free_port() -> u16 {
    talon::runtime::testing::free_port()
}

/// A tgtd started for one test, stopped when dropped.
pub struct TestTgtd {
    pub tgtd: Option<Tgtd>,
    pub cfg: TgtdConfig,
}

impl TestTgtd {
    /// Starts tgtd on a free loopback port with its files under `run_dir`.
    pub fn start(run_dir: &Path) -> Self {
        let portal: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("portal");
        let cfg = TgtdConfig::new(run_dir, portal);
        let tgtd = Tgtd::start(cfg.clone()).expect("start tgtd");
        Self {
            tgtd: Some(tgtd),
            cfg,
        }
    }

    pub fn get(&mut self) -> &mut Tgtd {
        self.tgtd.as_mut().expect("tgtd running")
    }

    pub fn url(&self, iqn: &str) -> String {
        format!("iscsi://{}/{iqn}/1", self.cfg.portal)
    }
}

impl Drop for TestTgtd {
    fn drop(&mut self) {
        if let Some(t) = self.tgtd.take()
            && let Err(e) = t.stop()
        {
            eprintln!("stopping tgtd: {e}");
        }
    }
}

/// Runs a libiscsi-bin tool; returns (success, stdout + stderr).
pub fn tool(program: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .output()
        .expect("run libiscsi tool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Runs a libiscsi-bin tool as the unprivileged user `nobody` (what any local
/// user could do); returns (success, stdout + stderr).
pub fn tool_as_nobody(program: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(program)
        .args(args)
        .output()
        .expect("run setpriv");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The size iscsi-readcapacity16 reports for a LUN URL.
pub fn read_capacity(url: &str) -> u64 {
    read_capacity_as(url, None)
}

/// [`read_capacity`] logging in as `initiator` (libiscsi's default name
/// without one).
pub fn read_capacity_as(url: &str, initiator: Option<&str>) -> u64 {
    let mut args = Vec::new();
    if let Some(i) = initiator {
        args.extend(["-i", i]);
    }
    args.push(url);
    let (ok, out) = tool("iscsi-readcapacity16", &args);
    assert!(ok, "iscsi-readcapacity16 {url} failed: {out}");
    out.lines()
        .find_map(|l| l.strip_prefix("Total size:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no 'Total size:' in {out}"))
}

/// A loop-mounted scratch filesystem (XFS with reflink, ext4, ...), unmounted
/// and detached when dropped.
pub struct LoopFs {
    pub image: tempfile::TempDir,
    pub mount: tempfile::TempDir,
    pub device: String,
    mounted: bool,
}

impl LoopFs {
    /// Makes a `size_mb` image, formats it with `mkfs` args, mounts it.
    /// Err(reason) when the tools or loop devices are missing.
    pub fn new(size_mb: u64, mkfs: &[&str]) -> Result<Self, String> {
        if !on_path(mkfs[0]) || !on_path("losetup") {
            return Err(format!("{} or losetup not found", mkfs[0]));
        }
        let image = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mount = tempfile::tempdir().map_err(|e| e.to_string())?;
        let file = image.path().join("fs.img");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(size_mb << 20))
            .map_err(|e| format!("image: {e}"))?;
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "losetup: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let mut fs = Self {
            image,
            mount,
            device,
            mounted: false,
        };
        let out = Command::new(mkfs[0])
            .args(&mkfs[1..])
            .arg(&fs.device)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "{}: {}",
                mkfs[0],
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let out = Command::new("mount")
            .arg(&fs.device)
            .arg(fs.mount.path())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("mount: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        fs.mounted = true;
        Ok(fs)
    }

    pub fn path(&self) -> &Path {
        self.mount.path()
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(self.mount.path()).status();
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

#[repr(C)]
struct ScsiIovec {
    base: *mut c_void,
    len: usize,
}

type CreateContext = unsafe extern "C" fn(*const c_char) -> *mut c_void;
type CtxStr = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;
type CtxInt = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type CtxOnly = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetError = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type UserPwd = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> c_int;
type FullConnect = unsafe extern "C" fn(*mut c_void, *const c_char, c_int) -> c_int;
type Cdb16 = unsafe extern "C" fn(u64, u32, c_int, c_int, c_int, c_int, c_int, c_int) -> *mut c_void;
type SetIov = unsafe extern "C" fn(*mut c_void, *mut ScsiIovec, c_int);
type Command_ = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void) -> *mut c_void;
type FreeTask = unsafe extern "C" fn(*mut c_void);
type SetState = unsafe extern "C" fn(*mut c_void, c_int);

/// libiscsi's synchronous API, resolved with dlopen.
pub struct Libiscsi {
    create: CreateContext,
    destroy: CtxOnly,
    set_targetname: CtxStr,
    set_session_type: CtxInt,
    set_header_digest: CtxInt,
    set_user_pwd: UserPwd,
    full_connect: FullConnect,
    logout: CtxOnly,
    get_error: GetError,
    read16: Cdb16,
    write16: Cdb16,
    set_iov_in: SetIov,
    set_iov_out: SetIov,
    command: Command_,
    free_task: FreeTask,
    set_noautoreconnect: SetState,
}

impl Libiscsi {
    pub fn load() -> Result<Self, String> {
        let name = CString::new(LIBISCSI).expect("name");
        // SAFETY: dlopen with a valid C string; the handle is never closed, so
        // the resolved symbols stay valid for the life of the process.
        let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            return Err(format!("dlopen {LIBISCSI} failed"));
        }
        let sym = |s: &str| -> Result<*mut c_void, String> {
            let c = CString::new(s).expect("symbol");
            // SAFETY: valid handle and C string.
            let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
            if p.is_null() {
                Err(format!("{LIBISCSI} has no {s}"))
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol is transmuted to the function type its header
        // (/usr/include/iscsi/iscsi.h, scsi-lowlevel.h of libiscsi 1.19) declares.
        unsafe {
            Ok(Self {
                create: std::mem::transmute::<*mut c_void, CreateContext>(sym("iscsi_create_context")?),
                destroy: std::mem::transmute::<*mut c_void, CtxOnly>(sym("iscsi_destroy_context")?),
                set_targetname: std::mem::transmute::<*mut c_void, CtxStr>(sym("iscsi_set_targetname")?),
                set_session_type: std::mem::transmute::<*mut c_void, CtxInt>(sym("iscsi_set_session_type")?),
                set_header_digest: std::mem::transmute::<*mut c_void, CtxInt>(sym(
                    "iscsi_set_header_digest",
                )?),
                set_user_pwd: std::mem::transmute::<*mut c_void, UserPwd>(sym(
                    "iscsi_set_initiator_username_pwd",
                )?),
                full_connect: std::mem::transmute::<*mut c_void, FullConnect>(sym(
                    "iscsi_full_connect_sync",
                )?),
                logout: std::mem::transmute::<*mut c_void, CtxOnly>(sym("iscsi_logout_sync")?),
                get_error: std::mem::transmute::<*mut c_void, GetError>(sym("iscsi_get_error")?),
                read16: std::mem::transmute::<*mut c_void, Cdb16>(sym("scsi_cdb_read16")?),
                write16: std::mem::transmute::<*mut c_void, Cdb16>(sym("scsi_cdb_write16")?),
                set_iov_in: std::mem::transmute::<*mut c_void, SetIov>(sym("scsi_task_set_iov_in")?),
                set_iov_out: std::mem::transmute::<*mut c_void, SetIov>(sym("scsi_task_set_iov_out")?),
                command: std::mem::transmute::<*mut c_void, Command_>(sym("iscsi_scsi_command_sync")?),
                free_task: std::mem::transmute::<*mut c_void, FreeTask>(sym("scsi_free_scsi_task")?),
                set_noautoreconnect: std::mem::transmute::<*mut c_void, SetState>(sym(
                    "iscsi_set_noautoreconnect",
                )?),
            })
        }
    }

    /// Logs in to `iqn` at `portal` (host:port) as `initiator`, optionally with CHAP.
    pub fn connect(
        &self,
        portal: &str,
        iqn: &str,
        initiator: &str,
        chap: Option<(&str, &str)>,
    ) -> Result<Session<'_>, String> {
        let c = |s: &str| CString::new(s).expect("no NUL");
        let (ini, target, portal) = (c(initiator), c(iqn), c(portal));
        // SAFETY: valid C strings; a null context is checked.
        let ctx = unsafe { (self.create)(ini.as_ptr()) };
        if ctx.is_null() {
            return Err("iscsi_create_context failed".into());
        }
        let mut s = Session {
            lib: self,
            ctx,
            lun: 1,
            logged_in: false,
        };
        // SAFETY: ctx is a live context; strings outlive the calls (libiscsi copies them).
        unsafe {
            (self.set_targetname)(ctx, target.as_ptr());
            (self.set_session_type)(ctx, 2); // ISCSI_SESSION_NORMAL
            (self.set_header_digest)(ctx, 0); // ISCSI_HEADER_DIGEST_NONE
            if let Some((u, p)) = chap {
                let (u, p) = (c(u), c(p));
                (self.set_user_pwd)(ctx, u.as_ptr(), p.as_ptr());
            }
            if (self.full_connect)(ctx, portal.as_ptr(), 1) != 0 {
                return Err(s.error());
            }
        }
        s.logged_in = true;
        Ok(s)
    }
}

/// A logged-in libiscsi session on LUN 1.
pub struct Session<'a> {
    lib: &'a Libiscsi,
    ctx: *mut c_void,
    lun: c_int,
    logged_in: bool,
}

impl Session<'_> {
    fn error(&self) -> String {
        // SAFETY: live context; libiscsi returns a NUL-terminated string it owns.
        unsafe { CStr::from_ptr((self.lib.get_error)(self.ctx)) }
            .to_string_lossy()
            .into_owned()
    }

    fn run(&self, task: *mut c_void, buf: &mut [u8], write: bool) -> Result<(), String> {
        if task.is_null() {
            return Err("cannot build the CDB".into());
        }
        let mut iov = ScsiIovec {
            base: buf.as_mut_ptr().cast(),
            len: buf.len(),
        };
        // SAFETY: the task is live; `iov` and `buf` outlive the synchronous command.
        // `status` is the first field (int) of struct scsi_task.
        unsafe {
            if write {
                (self.lib.set_iov_out)(task, &mut iov, 1);
            } else {
                (self.lib.set_iov_in)(task, &mut iov, 1);
            }
            let done = (self.lib.command)(self.ctx, self.lun, task, std::ptr::null_mut());
            if done.is_null() {
                return Err(self.error());
            }
            let status = *(done as *const c_int);
            (self.lib.free_task)(done);
            if status != 0 {
                Err(format!("SCSI status {status}: {}", self.error()))
            } else {
                Ok(())
            }
        }
    }

    /// Turns libiscsi's automatic reconnect off: a dropped connection then
    /// fails the command instead of logging in again behind the caller's back.
    pub fn no_reconnect(&self) {
        // SAFETY: live context.
        unsafe { (self.lib.set_noautoreconnect)(self.ctx, 1) }
    }

    /// WRITE16 of whole 512-byte blocks at `lba`.
    pub fn write(&self, lba: u64, data: &[u8]) -> Result<(), String> {
        let mut buf = data.to_vec();
        let len = u32::try_from(buf.len()).expect("small write");
        // SAFETY: plain CDB constructor.
        let task = unsafe { (self.lib.write16)(lba, len, 512, 0, 0, 0, 0, 0) };
        self.run(task, &mut buf, true)
    }

    /// READ16 of `len` bytes (whole blocks) at `lba`.
    pub fn read(&self, lba: u64, len: usize) -> Result<Vec<u8>, String> {
        let mut buf = vec![0u8; len];
        // SAFETY: plain CDB constructor.
        let task =
            unsafe { (self.lib.read16)(lba, u32::try_from(len).expect("small read"), 512, 0, 0, 0, 0, 0) };
        self.run(task, &mut buf, false)?;
        Ok(buf)
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // SAFETY: live context, destroyed once.
        unsafe {
            if self.logged_in {
                (self.lib.logout)(self.ctx);
            }
            (self.lib.destroy)(self.ctx);
        }
    }
}
