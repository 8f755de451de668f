//! `NsIscsiadm` with real namespaces: a process named `iscsid` in its own mount, UTS and IPC
//! namespaces (util-linux `unshare`) has `iscsiadm` only in its own /usr/local/sbin (a tmpfs
//! there), like Talos' iscsi-tools extension. This machine's kernel has no iSCSI initiator, so
//! that `iscsiadm` is a stand-in script (`iscsiadm-standin`: prints its hostname and arguments and
//! answers SendTargets with another target); what is real is the namespace switch, the PATH lookup
//! in iscsid's mount namespace and the attach logic on top. The real iscsiadm/iscsid/kernel path
//! is tests/vm/steps/iscsi-attach.sh.

use std::fs;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use talon::attach::iscsi::{self, IscsiError, IscsiOptions, IscsiTarget, Iscsiadm, NsIscsiadm};
use talon::host::HostRoot;
use talon::names::{Iqn, ObjectName};

/// The "extension": `iscsid` (argv[0] of a sleep) in new mount/UTS/IPC namespaces with the
/// stand-in iscsiadm in a tmpfs on /usr/local/sbin. Killed on drop.
struct Extension {
    unshare: Child,
    hostname: String,
}

impl Drop for Extension {
    fn drop(&mut self) {
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

const STANDIN: &str = r#"#!/bin/sh
# iscsiadm-standin (test double): who am I, and what was I asked
echo "$(hostname): $*"
case "$*" in
"-m discovery -t sendtargets -p "*) echo "127.0.0.1:3260,1 iqn.2025-01.io.talon:other" ;;
esac
exit 0
"#;

fn start_extension() -> Result<Extension, String> {
    let hostname = format!("talon-iscsi-ext-{}", std::process::id());
    let ready = tempfile::tempdir().map_err(|e| e.to_string())?;
    let script = r#"
        set -e
        mount -t tmpfs talon-iscsi-ext /usr/local/sbin
        printf '%s' "$STANDIN" > /usr/local/sbin/iscsiadm
        chmod 0755 /usr/local/sbin/iscsiadm
        hostname "$HOST"
        touch "$READY/ready"
        exec -a iscsid sleep 600
    "#;
    let mut unshare = Command::new("unshare")
        .args([
            "--mount",
            "--uts",
            "--ipc",
            "--fork",
            "--kill-child",
            "bash",
            "-c",
            script,
        ])
        .env("STANDIN", STANDIN)
        .env("HOST", &hostname)
        .env("READY", ready.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start unshare: {e}"))?;
    let start = Instant::now();
    while !ready.path().join("ready").exists() {
        if let Ok(Some(st)) = unshare.try_wait() {
            return Err(format!("the extension helper exited: {st}"));
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = unshare.kill();
            let _ = unshare.wait();
            return Err("the extension helper did not get ready".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // the exec into sleep follows the ready file: wait until argv[0] is iscsid
    let root = HostRoot::real();
    while talon::ns::find_process(&root, "iscsid").is_err() {
        if start.elapsed() > Duration::from_secs(20) {
            return Err("no process named iscsid appeared".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(Extension { unshare, hostname })
}

fn can_run(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP {test}: needs root to create and enter namespaces");
        return false;
    }
    if Command::new("unshare").arg("--version").output().is_err() {
        eprintln!("SKIP {test}: unshare (util-linux) is not installed");
        return false;
    }
    if talon::ns::find_process(&HostRoot::real(), "iscsid").is_ok() {
        eprintln!("SKIP {test}: a real iscsid runs on this machine; not shadowing it");
        return false;
    }
    if std::path::Path::new("/usr/local/sbin/iscsiadm").exists() {
        eprintln!("SKIP {test}: /usr/local/sbin/iscsiadm exists here; the test needs it absent");
        return false;
    }
    true
}

/// One test: the helper is a process named iscsid, and two tests would find each other's.
#[test]
fn iscsiadm_runs_in_iscsids_namespaces_and_attach_reports_a_wrong_iqn() {
    let test = "iscsiadm_runs_in_iscsids_namespaces_and_attach_reports_a_wrong_iqn";
    if !can_run(test) {
        return;
    }
    let ext = match start_extension() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            return;
        }
    };
    let root = HostRoot::real();
    let adm = NsIscsiadm::new(root.clone());
    let out = adm
        .run(&["-m".into(), "session".into()], Duration::from_secs(20))
        .expect("run");
    assert_eq!(out.code, 0, "{out:?}");
    // iscsid's UTS namespace, and an iscsiadm that exists only in its mount namespace
    assert_eq!(out.stdout.trim(), format!("{}: -m session", ext.hostname));

    let target = IscsiTarget {
        portal: "127.0.0.1:3260".parse().expect("portal"),
        iqn: Iqn::parse("iqn.2025-01.io.talon:talon-test-ns").expect("iqn"),
        lun: 1,
        initiator: None,
        chap: None,
    };
    let vol = ObjectName::parse("volume", &format!("talon-test-ns-{}", std::process::id())).expect("vol");
    let err = iscsi::attach(&root, &vol, &target, &IscsiOptions::default(), &adm).expect_err("wrong iqn");
    assert!(matches!(err, IscsiError::NotOffered { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("does not offer target iqn.2025-01.io.talon:talon-test-ns")
            && msg.contains("iqn.2025-01.io.talon:other"),
        "{msg}"
    );
    assert!(!root.path(format!("/dev/talon/{vol}")).exists());
    // the attach lock was taken in the host's /run (pid 1's mount namespace is ours here)
    let lock = talon::attach::lock_path(&vol);
    assert!(lock.exists(), "{} missing", lock.display());
    let _ = fs::remove_file(lock);
    drop(ext);
}
