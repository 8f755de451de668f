//! Real namespace switches into a helper process made with `unshare` (run as root).

mod ns_support;

use std::time::Duration;

use ns_support::{NsHelper, View, can_run, fds_on, threads_in, view};
use talon::host::HostRoot;
use talon::ns::{self, Namespaces, NsCommand, Target};

const T: Duration = Duration::from_secs(20);

fn helper(test: &str) -> Option<NsHelper> {
    if !can_run(test) {
        return None;
    }
    match NsHelper::start() {
        Ok(h) => Some(h),
        Err(e) => {
            eprintln!("SKIP {test}: cannot create namespaces here: {e}");
            None
        }
    }
}

fn assert_outside(h: &NsHelper) {
    let here = view(&h.marker_path(), &h.iface);
    assert_eq!(here.marker, None, "the tmpfs marker leaked into the test thread");
    assert_ne!(
        here.hostname, h.hostname,
        "the hostname leaked into the test thread"
    );
    assert!(
        !here.has_iface,
        "the interface {} leaked into the test thread",
        h.iface
    );
    for kind in ["mnt", "net", "uts"] {
        assert_eq!(
            threads_in(kind, h.ns_inode(kind)),
            Vec::<String>::new(),
            "threads left in the {kind} ns"
        );
        assert_eq!(
            fds_on(kind, h.ns_inode(kind)),
            Vec::<String>::new(),
            "fds left on the {kind} ns"
        );
    }
}

#[test]
fn closure_sees_the_target_namespaces_and_nothing_leaks() {
    let Some(h) = helper("closure_sees_the_target_namespaces_and_nothing_leaks") else {
        return;
    };
    assert_outside(&h);
    let (marker, iface) = (h.marker_path(), h.iface.clone());
    let root = HostRoot::real();
    let got = ns::run_in(
        &root,
        &Target::Pid(h.pid),
        Namespaces::ALL_BUT_PID,
        T,
        move || view(&marker, &iface),
    )
    .expect("run_in");
    assert_eq!(
        got,
        View {
            marker: Some(h.marker_text.clone()),
            hostname: h.hostname.clone(),
            has_iface: true
        }
    );
    assert_outside(&h);

    // Only the net namespace: the interface, but neither the marker nor the hostname.
    let (marker, iface) = (h.marker_path(), h.iface.clone());
    let got = ns::run_in(&root, &Target::Pid(h.pid), Namespaces::NET, T, move || {
        view(&marker, &iface)
    })
    .expect("run_in net");
    assert!(
        got.has_iface && got.marker.is_none() && got.hostname != h.hostname,
        "{got:?}"
    );

    // By name (argv[0] of the helper), through the file helpers.
    let by_name = Target::Process(h.name.clone());
    let data = ns::read_file(&root, &by_name, h.marker_path()).expect("read_file");
    assert_eq!(String::from_utf8_lossy(&data), h.marker_text);
    let sub = h.mnt_dir.path().join("x/y");
    ns::create_dir_all(&root, &by_name, &sub).expect("create_dir_all");
    ns::write_file(&root, &by_name, sub.join("f"), b"written inside").expect("write_file");
    assert_eq!(
        ns::read_file(&root, &by_name, sub.join("f")).expect("read back"),
        b"written inside"
    );
    assert!(
        !sub.exists(),
        "the directory was created outside the target's mount namespace"
    );
    let lock_path = h.mnt_dir.path().join("talon.lock");
    let held = ns::lock(&root, &by_name, &lock_path, T).expect("lock");
    assert!(
        !lock_path.exists(),
        "lock file outside the target's mount namespace"
    );
    let busy = ns::lock(&root, &by_name, &lock_path, Duration::from_millis(50)).expect_err("busy");
    assert!(matches!(busy, ns::NsError::LockTimeout { .. }), "{busy:?}");
    drop(held);
    ns::lock(&root, &by_name, &lock_path, T)
        .expect("lock again after release")
        .release()
        .expect("release");
    let rel = talon::host::os::read_in(&root, &by_name).expect("os_release");
    assert!(!rel.id.is_empty());
    assert_outside(&h);
}

#[test]
fn program_sees_the_target_namespaces() {
    let Some(h) = helper("program_sees_the_target_namespaces") else {
        return;
    };
    let root = HostRoot::real();
    let target = Target::Pid(h.pid);
    let out = NsCommand::new("cat")
        .arg(h.marker_path())
        .output(&root, &target, Namespaces::ALL_BUT_PID)
        .expect("cat");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), h.marker_text);

    let out = NsCommand::new("hostname")
        .output(&root, &target, Namespaces::ALL_BUT_PID)
        .expect("hostname");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), h.hostname);

    let out = NsCommand::new("ip")
        .args(["-o", "link", "show"])
        .output(&root, &target, Namespaces::ALL_BUT_PID)
        .expect("ip");
    let links = String::from_utf8_lossy(&out.stdout);
    assert!(links.contains(&format!(": {}:", h.iface)), "{links}");

    // The same programs outside: none of it.
    let out = NsCommand::new("ip")
        .args(["-o", "link", "show"])
        .output(&root, &Target::Pid(std::process::id()), Namespaces::ALL_BUT_PID)
        .expect("ip here");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&format!(": {}:", h.iface)));
    let out = NsCommand::new("cat")
        .arg(h.marker_path())
        .output(&root, &Target::Pid(std::process::id()), Namespaces::MNT)
        .expect("cat here");
    assert!(
        !out.status.success(),
        "the marker is visible in our own mount namespace"
    );

    // Working directory and stdin inside the target's mount namespace.
    let out = NsCommand::new("sh")
        .args(["-c", "cat marker; cat"])
        .current_dir(h.mnt_dir.path())
        .stdin_bytes(b"+stdin".to_vec())
        .output(&root, &Target::Process(h.name.clone()), Namespaces::MNT)
        .expect("sh");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}+stdin", h.marker_text)
    );
    assert_outside(&h);
}

#[test]
fn program_joins_the_target_pid_namespace() {
    let test = "program_joins_the_target_pid_namespace";
    if !can_run(test) {
        return;
    }
    let h = match NsHelper::start_with(None, true) {
        Ok(h) => h,
        Err(e) => return eprintln!("SKIP {test}: cannot create namespaces here: {e}"),
    };
    let want = std::fs::read_link(format!("/proc/{}/ns/pid", h.pid)).expect("helper pid ns");
    let out = NsCommand::new("readlink")
        .arg("/proc/self/ns/pid")
        .output(&HostRoot::real(), &Target::Pid(h.pid), Namespaces::ALL)
        .expect("readlink");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        want.to_string_lossy()
    );
    // Its own view of its pid is small: the helper's sleep is pid 1 in there.
    let out = NsCommand::new("sh")
        .args(["-c", "echo $$"])
        .output(&HostRoot::real(), &Target::Pid(h.pid), Namespaces::ALL)
        .expect("echo $$");
    let inner: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("pid");
    assert!(
        inner > 1 && inner < 100,
        "pid {inner} is not from the helper's pid namespace"
    );
}

#[test]
fn two_hundred_concurrent_switches_from_tokio_tasks() {
    let Some(h) = helper("two_hundred_concurrent_switches_from_tokio_tasks") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .max_blocking_threads(64)
        .enable_all()
        .build()
        .expect("runtime");
    let want = View {
        marker: Some(h.marker_text.clone()),
        hostname: h.hostname.clone(),
        has_iface: true,
    };
    let results = rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..200u32 {
            let (marker, iface, pid) = (h.marker_path(), h.iface.clone(), h.pid);
            tasks.push(tokio::spawn(async move {
                // Odd tasks switch, even ones check that the blocking pool thread they
                // run on was not moved anywhere.
                tokio::task::spawn_blocking(move || {
                    let outside = view(&marker, &iface);
                    let inside = ns::run_in(
                        &HostRoot::real(),
                        &Target::Pid(pid),
                        Namespaces::ALL_BUT_PID,
                        T,
                        move || view(&marker, &iface),
                    );
                    (i, outside, inside)
                })
                .await
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("task").expect("blocking"));
        }
        out
    });
    assert_eq!(results.len(), 200);
    for (i, outside, inside) in results {
        let inside = inside.unwrap_or_else(|e| panic!("switch {i}: {e}"));
        assert_eq!(inside, want, "switch {i}");
        assert!(
            outside.marker.is_none() && !outside.has_iface && outside.hostname != h.hostname,
            "switch {i} saw {outside:?} outside"
        );
    }
    drop(rt);
    assert_outside(&h);
}
