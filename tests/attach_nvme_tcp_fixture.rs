//! The NVMe/TCP frontend's sysfs logic on fixture trees. The kernel is a test double here
//! (`fake_kernel_connect` lays out what the kernel would create, a thread plays
//! `delete_controller`); the real kernel path is covered by tests/vm/steps/nvmf-attach.sh.

use std::fs;
use std::path::Path;
use std::time::Duration;

use talon::attach::AttachError;
use talon::attach::nvme_tcp::{
    self, ConnectOptions, FabricsError, HostIdentity, NvmeTcpTarget, attach_with, detach, find_namespace,
    list_controllers,
};
use talon::host::HostRoot;
use talon::names::{Nqn, ObjectName};

fn w(root: &HostRoot, p: &str, v: &str) {
    let p = root.path(p);
    fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    fs::write(p, v).expect("write");
}

/// A controller as the kernel shows it under /sys/class/nvme.
fn controller(root: &HostRoot, name: &str, transport: &str, nqn: &str, addr: &str, state: &str) {
    let d = format!("/sys/class/nvme/{name}");
    w(root, &format!("{d}/transport"), &format!("{transport}\n"));
    w(root, &format!("{d}/subsysnqn"), &format!("{nqn}\n"));
    w(root, &format!("{d}/address"), &format!("{addr}\n"));
    w(root, &format!("{d}/state"), &format!("{state}\n"));
    w(root, &format!("{d}/delete_controller"), "");
}

/// A namespace block device: `ctrl_entry` under the controller (hidden path or plain), the
/// visible device in /sys/block with its dev number and /dev node (a plain file in a fixture).
fn namespace(
    root: &HostRoot,
    ctrl: &str,
    ctrl_entry: &str,
    visible: &str,
    nsid: u32,
    dev: &str,
    parent: &str,
) {
    w(
        root,
        &format!("/sys/class/nvme/{ctrl}/{ctrl_entry}/nsid"),
        &format!("{nsid}\n"),
    );
    w(root, &format!("/sys/block/{visible}/dev"), &format!("{dev}\n"));
    w(root, &format!("/dev/{visible}"), "");
    let dev_link = root.path(format!("/sys/dev/block/{dev}"));
    fs::create_dir_all(dev_link.parent().expect("parent")).expect("mkdir");
    let _ = std::os::unix::fs::symlink(format!("../../block/{visible}"), dev_link);
    let _ = std::os::unix::fs::symlink(
        format!("../../{parent}"),
        root.path(format!("/sys/block/{visible}/device")),
    );
}

fn target(nqn: &str) -> NvmeTcpTarget {
    NvmeTcpTarget {
        traddr: "10.0.2.2".parse().expect("ip"),
        trsvcid: 4420,
        nqn: Nqn::parse(nqn).expect("nqn"),
    }
}

const NQN: &str = "nqn.2025-01.io.talon:vol:v1";

/// Plays the kernel's delete_controller: removes a controller's directory once "1" is written.
fn delete_double(root: &HostRoot) -> std::thread::JoinHandle<()> {
    let root = root.clone();
    std::thread::spawn(move || {
        for _ in 0..2000 {
            for c in list_controllers(&root).expect("list") {
                let p = root.path(format!("/sys/class/nvme/{}/delete_controller", c.name));
                if fs::read_to_string(&p).map(|s| s.trim() == "1").unwrap_or(false) {
                    // gone at once, like the kernel's device removal
                    let gone = root.path(format!("/sys/class/nvme/.gone-{}", c.name));
                    fs::rename(root.path(format!("/sys/class/nvme/{}", c.name)), &gone).expect("rename");
                    fs::remove_dir_all(gone).expect("rm");
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    })
}

/// The kernel double of a successful connect with native multipath: controller nvme3 in
/// subsystem 2, namespace path nvme2c3n1, visible head nvme2n1.
fn fake_kernel_connect(root: &HostRoot, options: &str) -> Result<String, FabricsError> {
    assert!(
        options.starts_with("transport=tcp,traddr=10.0.2.2,trsvcid=4420,nqn="),
        "{options}"
    );
    assert!(options.contains(",nr_io_queues=4,"), "{options}");
    let nqn = options
        .split(',')
        .find_map(|kv| kv.strip_prefix("nqn="))
        .expect("nqn");
    if nqn.ends_with(":refused") {
        return Err(FabricsError::Write(std::io::Error::from_raw_os_error(
            libc::ECONNREFUSED,
        )));
    }
    controller(
        root,
        "nvme3",
        "tcp",
        nqn,
        "traddr=10.0.2.2,trsvcid=4420,src_addr=10.0.2.15",
        "live",
    );
    if !nqn.ends_with(":nons") {
        namespace(root, "nvme3", "nvme2c3n1", "nvme2n1", 1, "259:5", "nvme-subsys2");
        w(root, "/sys/class/nvme-subsystem/nvme-subsys2/nvme3/x", "");
    }
    Ok("instance=3,cntlid=1\n".into())
}

fn setup() -> (tempfile::TempDir, HostRoot, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = HostRoot::new(dir.path().join("host"));
    // the PCIe disk of the host, which talon must never touch
    controller(
        &root,
        "nvme0",
        "pcie",
        "nqn.2019-08.org.qemu:talon-test-1",
        "0000:00:04.0",
        "live",
    );
    namespace(&root, "nvme0", "nvme0n1", "nvme0n1", 1, "259:0", "nvme0");
    let data = dir.path().join("data");
    (dir, root, data)
}

fn vol(n: &str) -> ObjectName {
    ObjectName::parse("volume", n).expect("name")
}

#[test]
fn finds_plain_and_multipath_namespaces() {
    let (_d, root, _) = setup();
    assert_eq!(
        find_namespace(&root, "nvme0", 1).expect("find"),
        Some("nvme0n1".into())
    );
    assert_eq!(find_namespace(&root, "nvme0", 2).expect("find"), None);
    fake_kernel_connect(
        &root,
        &format!("transport=tcp,traddr=10.0.2.2,trsvcid=4420,nqn={NQN},nr_io_queues=4,"),
    )
    .expect("connect");
    assert_eq!(
        find_namespace(&root, "nvme3", 1).expect("find"),
        Some("nvme2n1".into())
    );
    let cs = list_controllers(&root).expect("list");
    assert_eq!(cs.len(), 2);
    assert!(cs[1].matches(&target(NQN)));
    assert!(!cs[0].matches(&target(NQN)));
    let mut other_port = target(NQN);
    other_port.trsvcid = 4421;
    assert!(!cs[1].matches(&other_port));
}

#[test]
fn attach_reuse_and_detach_on_a_fixture_tree() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP attach_reuse_and_detach_on_a_fixture_tree: /dev/talon nodes need mknod (root)");
        return;
    }
    let (_d, root, data) = setup();
    let opts = ConnectOptions::default();
    let a = attach_with(&root, &data, &vol("v1"), &target(NQN), &opts, fake_kernel_connect).expect("attach");
    assert_eq!(
        (a.controller.as_str(), a.device.as_str(), a.reused),
        ("nvme3", "nvme2n1", false)
    );
    assert_eq!(a.stable_path, Path::new("/dev/talon/v1"));
    assert_eq!(a.dev.to_string(), "259:5");
    // generated host identity, kept for the next attach
    let id1 = HostIdentity::load_or_create(&root, &data).expect("id");
    assert!(id1.hostnqn.as_str().ends_with(&id1.hostid.to_string()));
    assert_eq!(HostIdentity::load_or_create(&root, &data).expect("id"), id1);

    // a second attach finds the live controller and does not connect again
    fn no_connect(_: &HostRoot, o: &str) -> Result<String, FabricsError> {
        panic!("must reuse the live controller, not connect with {o}")
    }
    let b = attach_with(&root, &data, &vol("v1"), &target(NQN), &opts, no_connect).expect("reuse");
    assert!(b.reused);
    assert_eq!(b.device, "nvme2n1");

    let kernel = delete_double(&root);
    let d = detach(&root, &data, &vol("v1"), None).expect("detach");
    assert_eq!(d.controllers, vec!["nvme3".to_string()]);
    assert!(d.removed_path);
    assert!(!root.exists("/sys/class/nvme/nvme3"));
    assert!(
        root.exists("/sys/class/nvme/nvme0/state"),
        "the PCIe controller must stay"
    );
    assert_eq!(
        detach(&root, &data, &vol("v1"), None).expect("again"),
        Default::default()
    );
    drop(kernel);
}

/// A controller the kernel reconnects (its target's export closed a moment: state
/// `connecting`) is the volume's still: an attach reuses it and a second path's connect waits
/// for it instead of connecting a duplicate, which the kernel refuses ("a controller with these
/// options already exists", EALREADY); its address is not among the live paths until it is live
/// again. A dead one is connected anew.
#[test]
fn a_controller_the_kernel_reconnects_is_never_connected_twice() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!(
            "SKIP a_controller_the_kernel_reconnects_is_never_connected_twice: /dev/talon nodes need mknod (root)"
        );
        return;
    }
    fn no_connect(_: &HostRoot, o: &str) -> Result<String, FabricsError> {
        panic!("a second controller of one target connected with {o}")
    }
    let (_d, root, data) = setup();
    let opts = ConnectOptions {
        namespace_timeout: Duration::from_secs(5),
        ..ConnectOptions::default()
    };
    fake_kernel_connect(
        &root,
        &format!("transport=tcp,traddr=10.0.2.2,trsvcid=4420,nqn={NQN},nr_io_queues=4,"),
    )
    .expect("connect");
    let nqn = Nqn::parse(NQN).expect("nqn");
    let live: Vec<String> = nvme_tcp::live_paths(&root, &nqn)
        .expect("paths")
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(live, vec!["10.0.2.2:4420".to_string()]);
    w(&root, "/sys/class/nvme/nvme3/state", "connecting\n");
    assert!(nvme_tcp::live_paths(&root, &nqn).expect("paths").is_empty());
    let a = attach_with(&root, &data, &vol("v1"), &target(NQN), &opts, no_connect).expect("attach");
    assert_eq!(
        (a.controller.as_str(), a.device.as_str(), a.reused),
        ("nvme3", "nvme2n1", true)
    );
    // the kernel gets it back while the second path's connect waits
    let r2 = root.clone();
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        w(&r2, "/sys/class/nvme/nvme3/state", "live\n");
    });
    let c =
        nvme_tcp::connect_path_with(&root, &data, &vol("v1"), &target(NQN), &opts, no_connect).expect("path");
    back.join().expect("join");
    assert_eq!(c, "nvme3");
    assert_eq!(nvme_tcp::live_paths(&root, &nqn).expect("paths").len(), 1);
    // one that never comes back is named, and not deleted: the kernel's to give up
    w(&root, "/sys/class/nvme/nvme3/state", "connecting\n");
    let short = ConnectOptions {
        namespace_timeout: Duration::from_millis(300),
        ..opts.clone()
    };
    let e = nvme_tcp::connect_path_with(&root, &data, &vol("v1"), &target(NQN), &short, no_connect)
        .expect_err("not live");
    assert!(matches!(e, AttachError::NotLive { .. }), "{e}");
    assert!(
        e.to_string().contains("10.0.2.2:4420") && e.to_string().contains("connecting"),
        "{e}"
    );
    assert!(
        root.exists("/sys/class/nvme/nvme3"),
        "a controller this call did not make is left"
    );
    // a dead one is no path: connected anew
    w(&root, "/sys/class/nvme/nvme3/state", "dead\n");
    let c = nvme_tcp::connect_path_with(&root, &data, &vol("v1"), &target(NQN), &opts, fake_kernel_connect)
        .expect("connected anew");
    assert_eq!(c, "nvme3");
    assert_eq!(nvme_tcp::live_paths(&root, &nqn).expect("paths").len(), 1);
}

#[test]
fn namespace_that_never_appears_disconnects_the_controller() {
    let (_d, root, data) = setup();
    let opts = ConnectOptions {
        namespace_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let _kernel = delete_double(&root);
    let err = attach_with(
        &root,
        &data,
        &vol("v2"),
        &target("nqn.2025-01.io.talon:vol:nons"),
        &opts,
        fake_kernel_connect,
    )
    .expect_err("no namespace");
    assert!(matches!(err, AttachError::NamespaceNotFound { .. }), "{err}");
    assert!(err.to_string().contains("nvme3"), "{err}");
    assert!(
        !root.exists("/sys/class/nvme/nvme3"),
        "half-connected controller left behind"
    );
    assert!(!root.exists("/dev/talon/v2"));
}

#[test]
fn refused_connect_is_named_and_leaves_nothing() {
    let (_d, root, data) = setup();
    let err = attach_with(
        &root,
        &data,
        &vol("v3"),
        &target("nqn.2025-01.io.talon:vol:refused"),
        &ConnectOptions::default(),
        fake_kernel_connect,
    )
    .expect_err("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("nqn.2025-01.io.talon:vol:refused") && msg.contains("10.0.2.2:4420"),
        "{msg}"
    );
    assert!(msg.contains("nothing listens"), "{msg}");
    assert_eq!(list_controllers(&root).expect("list").len(), 1);
}

#[test]
fn hung_connect_times_out() {
    fn hang(_: &HostRoot, _: &str) -> Result<String, FabricsError> {
        std::thread::sleep(Duration::from_secs(3));
        Err(FabricsError::Write(std::io::Error::from_raw_os_error(
            libc::ETIMEDOUT,
        )))
    }
    let (_d, root, data) = setup();
    let opts = ConnectOptions {
        connect_timeout: Duration::from_millis(100),
        ..Default::default()
    };
    let err = attach_with(&root, &data, &vol("v4"), &target(NQN), &opts, hang).expect_err("timeout");
    assert!(matches!(err, AttachError::ConnectTimedOut { .. }), "{err}");
}

#[test]
fn host_identity_comes_from_etc_nvme_when_present() {
    let (dir, root, data) = setup();
    w(
        &root,
        "/etc/nvme/hostnqn",
        "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555\n",
    );
    w(
        &root,
        "/etc/nvme/hostid",
        "11111111-2222-3333-4444-555555555555\n",
    );
    let id = HostIdentity::load_or_create(&root, &data).expect("id");
    assert_eq!(id.hostid.to_string(), "11111111-2222-3333-4444-555555555555");
    assert!(
        !data.join("nvme").exists(),
        "nothing generated when the host has an identity"
    );
    w(&root, "/etc/nvme/hostnqn", "nqn.x,traddr=1.2.3.4\n");
    let err = HostIdentity::load_or_create(&root, &data).expect_err("bad");
    assert!(err.to_string().contains("/etc/nvme/hostnqn"), "{err}");
    drop(dir);
    let _ = nvme_tcp::FABRICS_DEV;
}

/// `frontend.AttachController` on an in-memory runtime and a fixture host: Attachment +
/// EngineStatus(nvme-tcp export) -> AttachmentStatus attached; delete -> detach, finalizer
/// released, status gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_controller_attaches_and_detaches() {
    use std::collections::BTreeMap;
    use talon::controllers::Deps;
    use talon::controllers::frontend::attach::AttachController;
    use talon::resources::frontend::{AttachState, Attachment, AttachmentStatus};
    use talon::runtime::testing::{TestRuntime, eventually};

    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP attach_controller_attaches_and_detaches: /dev/talon nodes need mknod (root)");
        return;
    }
    let (_d, root, data) = setup();
    let deps = Deps {
        host: root.clone(),
        data_dir: data.clone(),
        run_dir: data.join("run"),
        spdk: Default::default(),
        targets_on_exit: Default::default(),
        peer_token: None,
        peer_tls: None,
        longhorn_peer_port: 8504,
        longhorn_session: talon::resources::longhorn::new_session(),
        longhorn_listing: Default::default(),
        spdk_run: talon::spdk::RunId::new(),
        longhorn: false,
    };
    let ctl = AttachController::with_connector(deps, ConnectOptions::default(), fake_kernel_connect);
    let rt = TestRuntime::with(ctl).expect("runtime");
    let st = rt.state.clone();
    st.create(
        "config",
        "Attachment",
        "v1",
        "",
        serde_json::json!({}),
        BTreeMap::new(),
    )
    .expect("attachment");
    let waiting = eventually("status attaching", Duration::from_secs(10), || {
        let st = st.clone();
        async move { st.get_typed::<AttachmentStatus>("v1").ok().flatten() }
    })
    .await;
    assert_eq!(waiting.spec.state, AttachState::Attaching, "{:?}", waiting.spec);
    let me = HostIdentity::load_or_create(&root, &data)
        .expect("host identity")
        .hostnqn
        .to_string();
    let engine = |hosts: Vec<String>| {
        serde_json::json!({
            "engine": "v2", "state": "ready", "sizeBytes": 1u64 << 30, "device": "lvs/v1", "replicas": [],
            "exports": [{"transport": "nvme-tcp", "address": "10.0.2.2", "port": 4420, "name": NQN, "lun": 1,
                         "hosts": hosts}],
            "message": ""
        })
    };
    // an export that does not (yet) allow this host is waited for, not connected to
    st.create(
        "engine",
        "EngineStatus",
        "v1",
        "test.Engine",
        engine(vec!["nqn.2014-08.org.nvmexpress:uuid:another".into()]),
        BTreeMap::new(),
    )
    .expect("engine");
    let waiting = eventually(
        "waits for the engine to allow this host",
        Duration::from_secs(10),
        || {
            let st = st.clone();
            async move {
                st.get_typed::<AttachmentStatus>("v1")
                    .ok()
                    .flatten()
                    .filter(|s| s.spec.message.contains("allow this host"))
            }
        },
    )
    .await;
    assert_eq!(waiting.spec.state, AttachState::Attaching);
    assert!(waiting.spec.message.contains(&me), "{}", waiting.spec.message);
    st.update("engine", "EngineStatus", "v1", "test.Engine", None, |r| {
        r.spec = engine(vec![me.clone()])
    })
    .expect("engine allows this host");
    let attached = eventually("status attached", Duration::from_secs(10), || {
        let st = st.clone();
        async move {
            st.get_typed::<AttachmentStatus>("v1")
                .ok()
                .flatten()
                .filter(|s| s.spec.state == AttachState::Attached)
        }
    })
    .await;
    assert_eq!(attached.spec.device, "/dev/nvme2n1");
    assert_eq!(attached.spec.path, "/dev/talon/v1");
    assert_eq!(attached.spec.controller, "nvme3");
    assert!(root.path("/dev/talon/v1").exists());

    let _kernel = delete_double(&root);
    st.destroy("config", "Attachment", "v1", "").expect("delete");
    eventually("attachment and status gone", Duration::from_secs(10), || {
        let st = st.clone();
        async move {
            (st.get_typed::<Attachment>("v1").ok()?.is_none()
                && st.get_typed::<AttachmentStatus>("v1").ok()?.is_none())
            .then_some(())
        }
    })
    .await;
    assert!(
        !root.exists("/sys/class/nvme/nvme3"),
        "controller not disconnected"
    );
    assert!(!root.path("/dev/talon/v1").exists());
    assert!(root.exists("/sys/class/nvme/nvme0/state"));
    rt.stop().await;
}
