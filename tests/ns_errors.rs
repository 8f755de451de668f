//! Failure paths with real processes: a target that never existed, one that exits
//! mid-way, and a caller without CAP_SYS_ADMIN.

mod ns_support;

use std::time::Duration;

use ns_support::{NsHelper, View, can_run, drop_cap_sys_admin_in_this_thread, view};
use talon::host::HostRoot;
use talon::ns::{self, Namespaces, NsCommand, NsError, Target, TargetNamespaces};

const T: Duration = Duration::from_secs(20);

fn reaped_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().expect("spawn true");
    let pid = c.id();
    c.wait().expect("wait");
    pid
}

#[test]
fn target_that_never_existed_is_named_with_the_missing_path() {
    let root = HostRoot::real();
    let pid = reaped_pid();
    let err = ns::run_in(&root, &Target::Pid(pid), Namespaces::ALL_BUT_PID, T, || ()).expect_err("gone pid");
    assert!(matches!(err, NsError::TargetMissing { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("pid {pid}")) && msg.contains(&format!("/proc/{pid}")),
        "{msg}"
    );

    let name = "talon-never-existed";
    let err = NsCommand::new("true")
        .output(&root, &Target::Process(name.into()), Namespaces::MNT)
        .expect_err("no process");
    assert!(
        matches!(err, NsError::ProcessNotFound { .. }) && err.is_target_missing(),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains(name) && msg.contains("/proc"), "{msg}");

    let err = ns::read_file(&root, &Target::Process(name.into()), "/etc/os-release").expect_err("no process");
    assert!(err.to_string().contains(name), "{err}");
}

#[test]
fn target_that_exits_mid_way() {
    let test = "target_that_exits_mid_way";
    if !can_run(test) {
        return;
    }
    let name = format!("talonns-flap-{}", std::process::id());
    let mut a = match NsHelper::start_with(Some(&name), false) {
        Ok(h) => h,
        Err(e) => return eprintln!("SKIP {test}: cannot create namespaces here: {e}"),
    };
    let root = HostRoot::real();

    // Namespaces opened, then the target dies: the open descriptors keep its
    // namespaces alive, so work started afterwards still lands in them.
    let held =
        TargetNamespaces::open(&root, &Target::Process(name.clone()), Namespaces::ALL_BUT_PID).expect("open");
    assert_eq!(held.pid(), a.pid);
    a.kill();
    assert!(
        !std::path::Path::new(&format!("/proc/{}/ns", a.pid)).exists(),
        "helper still there"
    );
    let (marker, iface) = (a.marker_path(), a.iface.clone());
    let seen = held
        .run(T, move || view(&marker, &iface))
        .expect("run after exit");
    assert_eq!(
        seen,
        View {
            marker: Some(a.marker_text.clone()),
            hostname: a.hostname.clone(),
            has_iface: true
        }
    );
    let out = NsCommand::new("hostname")
        .output_in(&held)
        .expect("hostname after exit");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), a.hostname);
    drop(held);

    // Gone, and nothing by that name: the error names the process and /proc.
    let err = ns::run_in(&root, &Target::Process(name.clone()), Namespaces::NET, T, || ()).expect_err("gone");
    assert!(
        err.is_target_missing() && err.to_string().contains(&name),
        "{err}"
    );
    // The pid itself is gone too.
    let err = ns::run_in(&root, &Target::Pid(a.pid), Namespaces::NET, T, || ()).expect_err("gone pid");
    assert!(matches!(err, NsError::TargetMissing { .. }), "{err:?}");

    // Restarted under the same name (iscsid restarting): found again, new namespaces.
    let b = NsHelper::start_with(Some(&name), false).expect("restart");
    let iface = b.iface.clone();
    let seen = ns::run_in(
        &root,
        &Target::Process(name.clone()),
        Namespaces::ALL_BUT_PID,
        T,
        move || {
            (
                nix::unistd::gethostname()
                    .map(|h| h.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                ns_support::if_index(&iface) != 0,
            )
        },
    )
    .expect("restarted target");
    assert_eq!(seen, (b.hostname.clone(), true));
}

#[test]
fn without_cap_sys_admin_the_error_names_the_namespace() {
    let test = "without_cap_sys_admin_the_error_names_the_namespace";
    if !can_run(test) {
        return;
    }
    let h = match NsHelper::start() {
        Ok(h) => h,
        Err(e) => return eprintln!("SKIP {test}: cannot create namespaces here: {e}"),
    };
    let pid = h.pid;
    // Capabilities are per thread: drop CAP_SYS_ADMIN in a thread of our own; the
    // worker threads and children it creates inherit the reduced set.
    let errors = std::thread::spawn(move || {
        drop_cap_sys_admin_in_this_thread().expect("capset");
        let root = HostRoot::real();
        let target = Target::Pid(pid);
        let closure_mnt = ns::run_in(&root, &target, Namespaces::MNT, T, || ()).expect_err("closure mnt");
        let closure_all =
            ns::run_in(&root, &target, Namespaces::ALL_BUT_PID, T, || ()).expect_err("closure all");
        let spawn_net = NsCommand::new("true")
            .output(&root, &target, Namespaces::NET)
            .expect_err("spawn net");
        let spawn_mnt = NsCommand::new("true")
            .output(&root, &target, Namespaces::MNT)
            .expect_err("spawn mnt");
        [closure_mnt, closure_all, spawn_net, spawn_mnt]
    })
    .join()
    .expect("capless thread");
    for (err, ns) in errors.iter().zip(["mnt", "uts", "net", "mnt"]) {
        assert!(err.is_permission_denied(), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("the {ns} namespace of pid {pid}")) && msg.contains("CAP_SYS_ADMIN"),
            "{msg}"
        );
    }
    // This thread kept its capabilities.
    ns::run_in(&HostRoot::real(), &Target::Pid(pid), Namespaces::MNT, T, || ()).expect("privileged thread");
}
