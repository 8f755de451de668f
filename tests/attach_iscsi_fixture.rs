//! The iSCSI frontend's logic on fixture trees. iscsiadm, iscsid and the kernel are a test
//! double here (`IscsiKernelDouble`: answers iscsiadm's commands and lays out the sysfs a login
//! makes); the real initiator, iscsid in its own namespaces and tgtd are covered by
//! tests/vm/steps/iscsi-attach.sh.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use talon::attach::iscsi::{
    self, AdmOutput, IscsiError, IscsiOptions, IscsiTarget, Iscsiadm, attach, detach, find_lun_device,
    list_sessions,
};
use talon::host::HostRoot;
use talon::names::{Iqn, ObjectName};
use talon::ns::NsError;
use talon::tgt::{ChapCredentials, ChapSecret, ChapUser};

const IQN: &str = "iqn.2025-01.io.talon:v1";
const PORTAL: &str = "10.0.2.2:3260";

/// Plays iscsiadm + iscsid + the kernel's iSCSI initiator on a fixture host root. A test double:
/// the real ones cannot run on this machine's kernel (no iscsi_tcp).
#[derive(Debug)]
struct IscsiKernelDouble {
    root: HostRoot,
    /// What SendTargets answers: tgtd names its bind address, not the portal we reach.
    offered: Vec<(String, String)>,
    /// Whether the target has the LUN asked for (false: the login makes no disk).
    lun_present: bool,
    /// Exit code of a login (0 = success).
    login_code: i32,
    /// Discovery hangs until killed.
    discovery_hangs: bool,
    /// Where iscsiadm keeps its node records.
    node_db: &'static str,
    state: Mutex<DoubleState>,
}

#[derive(Debug, Default)]
struct DoubleState {
    nodes: BTreeSet<(String, String)>,
    /// The initiator name of the interface `talon`, once made.
    iface_name: Option<String>,
    next_session: u32,
    calls: Vec<String>,
    /// The CHAP user and secret the last login read from its node record.
    login_auth: Option<(String, String)>,
}

impl IscsiKernelDouble {
    fn new(root: &HostRoot) -> Self {
        Self {
            root: root.clone(),
            offered: vec![("127.0.0.1:3260".into(), IQN.into())],
            lun_present: true,
            login_code: 0,
            discovery_hangs: false,
            node_db: "/etc/iscsi/nodes",
            state: Mutex::new(DoubleState {
                next_session: 1,
                ..Default::default()
            }),
        }
    }

    fn calls(&self) -> Vec<String> {
        self.state.lock().expect("lock").calls.clone()
    }

    fn nodes(&self) -> BTreeSet<(String, String)> {
        self.state.lock().expect("lock").nodes.clone()
    }

    fn w(&self, p: &str, v: &str) {
        let p = self.root.path(p);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, v).expect("write");
    }

    /// What the kernel shows after a login: session, connection, SCSI target, LUN 1 disk.
    fn make_session(&self, n: u32, iqn: &str, portal: &str) {
        let p: SocketAddr = portal.parse().expect("portal");
        let s = format!("/sys/class/iscsi_session/session{n}");
        self.w(&format!("{s}/targetname"), &format!("{iqn}\n"));
        self.w(&format!("{s}/state"), "LOGGED_IN\n");
        let c = format!("/sys/class/iscsi_connection/connection{n}:0");
        self.w(&format!("{c}/persistent_address"), &format!("{}\n", p.ip()));
        self.w(&format!("{c}/persistent_port"), &format!("{}\n", p.port()));
        if self.lun_present {
            let h = n + 1;
            let sd = format!("sd{}", (b'a' + (n - 1) as u8) as char);
            let minor = 16 * (n - 1);
            fs::create_dir_all(
                self.root
                    .path(format!("{s}/device/target{h}:0:0/{h}:0:0:1/block/{sd}")),
            )
            .expect("mkdir");
            self.w(&format!("/sys/block/{sd}/dev"), &format!("8:{minor}\n"));
            self.w(&format!("/dev/{sd}"), "");
            fs::create_dir_all(self.root.path("/sys/dev/block")).expect("mkdir");
            let _ = fs::remove_file(self.root.path(format!("/sys/dev/block/8:{minor}")));
            std::os::unix::fs::symlink(
                format!("../../devices/platform/host{h}/session{n}/target{h}:0:0/{h}:0:0:1/block/{sd}"),
                self.root.path(format!("/sys/dev/block/8:{minor}")),
            )
            .expect("link");
        }
    }

    fn remove_session(&self, n: u32) {
        let _ = fs::remove_dir_all(self.root.path(format!("/sys/class/iscsi_session/session{n}")));
        let _ = fs::remove_dir_all(
            self.root
                .path(format!("/sys/class/iscsi_connection/connection{n}:0")),
        );
    }

    fn sessions_of(&self, iqn: &str, portal: &str) -> Vec<u32> {
        list_sessions(&self.root)
            .expect("sessions")
            .into_iter()
            .filter(|s| s.targetname == iqn && s.portal.map(|p| p.to_string()).as_deref() == Some(portal))
            .filter_map(|s| s.name.strip_prefix("session").and_then(|n| n.parse().ok()))
            .collect()
    }
}

fn out(code: i32, stdout: &str) -> Result<AdmOutput, NsError> {
    Ok(AdmOutput {
        code,
        stdout: stdout.into(),
        stderr: if code == 0 {
            String::new()
        } else {
            format!("iscsiadm double: exit {code}")
        },
    })
}

impl Iscsiadm for IscsiKernelDouble {
    fn set_node_auth(
        &self,
        target: &IscsiTarget,
        iface: &str,
        chap: &ChapCredentials,
    ) -> Result<Vec<PathBuf>, String> {
        // the real record edit, on the fixture root's node directories
        self.state
            .lock()
            .expect("lock")
            .calls
            .push(format!("<set_node_auth {} {iface}>", target.iqn));
        let dirs: Vec<PathBuf> = talon::attach::iscsi::NODE_DIRS
            .iter()
            .map(|d| self.root.path(d))
            .collect();
        let files =
            talon::attach::iscsi::node_record_files(&dirs, target.iqn.as_str(), &target.portal, iface);
        for f in &files {
            talon::attach::iscsi::set_record_auth(f, chap).map_err(|e| e.to_string())?;
        }
        Ok(files)
    }

    fn run(&self, args: &[String], timeout: Duration) -> Result<AdmOutput, NsError> {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        self.state.lock().expect("lock").calls.push(a.join(" "));
        let opt = |k: &str| a.iter().position(|x| *x == k).and_then(|i| a.get(i + 1)).copied();
        // `-I talon` at the end: through talon's interface, which must carry a name by then
        let mut a = a.clone();
        let iface = if a.len() > 2 && a[a.len() - 2..] == ["-I", "talon"] {
            "talon"
        } else {
            "default"
        };
        if a.len() > 2 && a[a.len() - 2..] == ["-I", "talon"] && a[..2] != ["-m", "iface"] {
            if self.state.lock().expect("lock").iface_name.is_none() {
                return out(6, "");
            }
            a.truncate(a.len() - 2);
        }
        match a.as_slice() {
            ["-m", "iface", "-I", "talon", "-o", "new"] => out(0, "New interface talon added"),
            [
                "-m",
                "iface",
                "-I",
                "talon",
                "-o",
                "update",
                "-n",
                "iface.initiatorname",
                "-v",
                name,
            ] => {
                self.state.lock().expect("lock").iface_name = Some(name.to_string());
                out(0, "talon updated.")
            }
            [
                "-m",
                "discovery",
                "-t",
                "sendtargets",
                "-p",
                _,
                "-o",
                "nonpersistent",
            ] => {
                if self.discovery_hangs {
                    return Err(NsError::CommandTimeout {
                        program: "iscsiadm".into(),
                        target: "iscsid double".into(),
                        timeout,
                    });
                }
                let lines: String = self.offered.iter().map(|(p, n)| format!("{p},1 {n}\n")).collect();
                out(0, &lines)
            }
            ["-m", "node", "-o", "new", "-T", iqn, "-p", p] => {
                self.state
                    .lock()
                    .expect("lock")
                    .nodes
                    .insert((iqn.to_string(), p.to_string()));
                // the record file, laid out and written as open-iscsi 2.1 does
                let addr: std::net::SocketAddr = p.parse().expect("portal");
                let dir = self
                    .root
                    .path(format!("{}/{iqn}/{},{},-1", self.node_db, addr.ip(), addr.port()));
                fs::create_dir_all(&dir).expect("record dir");
                fs::write(
                    dir.join(iface),
                    format!(
                        "# BEGIN RECORD 2.1.8\nnode.name = {iqn}\nnode.tpgt = -1\n\
                         node.session.auth.authmethod = None\nnode.conn[0].address = {}\n\
                         node.conn[0].port = {}\n# END RECORD\n",
                        addr.ip(),
                        addr.port()
                    ),
                )
                .expect("record");
                out(0, "New iSCSI node added")
            }
            ["-m", "node", "-T", iqn, "-p", p, "-o", "update", "-n", _, "-v", _] => {
                let known = self
                    .state
                    .lock()
                    .expect("lock")
                    .nodes
                    .contains(&(iqn.to_string(), p.to_string()));
                out(if known { 0 } else { 21 }, "")
            }
            ["-m", "node", "-T", iqn, "-p", p, "--login"] => {
                // iscsiadm reads the record file and hands it to iscsid
                let addr: std::net::SocketAddr = p.parse().expect("portal");
                let record = fs::read_to_string(self.root.path(format!(
                    "{}/{iqn}/{},{},-1/{iface}",
                    self.node_db,
                    addr.ip(),
                    addr.port()
                )))
                .unwrap_or_default();
                let get = |k: &str| {
                    record.lines().find_map(|l| {
                        l.strip_prefix(k)
                            .and_then(|r| r.trim_start().strip_prefix('='))
                            .map(|v| v.trim().to_string())
                    })
                };
                self.state.lock().expect("lock").login_auth =
                    (get("node.session.auth.authmethod").as_deref() == Some("CHAP")).then(|| {
                        (
                            get("node.session.auth.username").unwrap_or_default(),
                            get("node.session.auth.password").unwrap_or_default(),
                        )
                    });
                if self.login_code != 0 {
                    return out(self.login_code, "");
                }
                if !self.sessions_of(iqn, p).is_empty() {
                    return out(15, "");
                }
                let n = {
                    let mut st = self.state.lock().expect("lock");
                    let n = st.next_session;
                    st.next_session += 1;
                    n
                };
                self.make_session(n, iqn, p);
                out(0, "Login successful.")
            }
            ["-m", "node", "-T", iqn, "-p", p, "--logout"] => {
                let s = self.sessions_of(iqn, p);
                for n in &s {
                    self.remove_session(*n);
                }
                out(if s.is_empty() { 21 } else { 0 }, "")
            }
            ["-m", "session", "-r", n, "--logout"] => {
                let n: u32 = n.parse().expect("sid");
                let there = self.root.exists(format!("/sys/class/iscsi_session/session{n}"));
                self.remove_session(n);
                out(if there { 0 } else { 21 }, "")
            }
            ["-m", "node", "-o", "delete", "-T", iqn, ..] => {
                let p = opt("-p");
                let mut st = self.state.lock().expect("lock");
                let before = st.nodes.len();
                st.nodes
                    .retain(|(i, pp)| !(i == iqn && p.is_none_or(|p| p == pp)));
                out(if st.nodes.len() == before { 21 } else { 0 }, "")
            }
            other => panic!("the double does not know iscsiadm {other:?}"),
        }
    }
}

fn setup() -> (tempfile::TempDir, HostRoot) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = HostRoot::new(dir.path());
    fs::create_dir_all(root.path("/dev")).expect("dev");
    (dir, root)
}

fn target(iqn: &str) -> IscsiTarget {
    IscsiTarget {
        portal: PORTAL.parse().expect("portal"),
        iqn: Iqn::parse(iqn).expect("iqn"),
        lun: 1,
        initiator: None,
        chap: None,
    }
}

fn vol(n: &str) -> ObjectName {
    ObjectName::parse("volume", n).expect("volume")
}

fn opts() -> IscsiOptions {
    IscsiOptions {
        device_timeout: Duration::from_millis(200),
        ..IscsiOptions::default()
    }
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

#[test]
fn attach_reuse_and_detach_on_a_fixture_tree() {
    if !is_root() {
        eprintln!("SKIP attach_reuse_and_detach_on_a_fixture_tree: /dev/talon nodes need mknod (root)");
        return;
    }
    let (_d, root) = setup();
    let k = IscsiKernelDouble::new(&root);
    let at = attach(&root, &vol("v1"), &target(IQN), &opts(), &k).expect("attach");
    assert_eq!(
        (at.session.as_str(), at.device.as_str(), at.reused),
        ("session1", "sda", false)
    );
    assert_eq!(at.stable_path, std::path::PathBuf::from("/dev/talon/v1"));
    // SendTargets named 127.0.0.1 (tgtd's bind address): the node is made for the portal we reach
    assert_eq!(k.nodes(), BTreeSet::from([(IQN.to_string(), PORTAL.to_string())]));
    assert_eq!(
        k.calls()[0],
        format!("-m discovery -t sendtargets -p {PORTAL} -o nonpersistent")
    );
    assert!(
        k.calls()
            .iter()
            .any(|c| c == &format!("-m node -T {IQN} -p {PORTAL} --login"))
    );

    let n = k.calls().len();
    let again = attach(&root, &vol("v1"), &target(IQN), &opts(), &k).expect("re-attach");
    assert!(again.reused && again.session == "session1", "{again:?}");
    assert_eq!(k.calls().len(), n, "a reused session runs no iscsiadm");

    let d = detach(&root, &vol("v1"), None, &opts(), &k).expect("detach");
    assert_eq!(d.sessions, vec!["session1".to_string()]);
    assert!(d.removed_path);
    assert!(list_sessions(&root).expect("sessions").is_empty());
    assert!(k.nodes().is_empty(), "node record left: {:?}", k.nodes());
    assert!(!root.path("/dev/talon/v1").exists());
    let d = detach(
        &root,
        &vol("v1"),
        Some(&Iqn::parse(IQN).expect("iqn")),
        &opts(),
        &k,
    )
    .expect("twice");
    assert!(d.sessions.is_empty() && !d.removed_path);
}

/// With CHAP, the node record gets the method, user and secret before the login.
#[test]
fn chap_is_set_in_the_node_record_before_login() {
    if !is_root() {
        eprintln!("SKIP chap_is_set_in_the_node_record_before_login: /dev/talon nodes need mknod (root)");
        return;
    }
    let (_d, root) = setup();
    let k = IscsiKernelDouble::new(&root);
    let secret = "0123456789abcdef0123";
    let t = IscsiTarget {
        chap: Some(ChapCredentials {
            user: ChapUser::parse("talon").expect("user"),
            secret: ChapSecret::parse(secret).expect("secret"),
        }),
        ..target(IQN)
    };
    attach(&root, &vol("v1"), &t, &opts(), &k).expect("attach");
    let calls = k.calls();
    let at = |needle: &str| {
        calls
            .iter()
            .position(|c| c.contains(needle))
            .unwrap_or_else(|| panic!("no iscsiadm call with {needle:?}: {calls:#?}"))
    };
    // the secret is in no iscsiadm argument: the record file carries it, 0600
    assert!(!calls.iter().any(|c| c.contains(secret)), "{calls:#?}");
    assert!(at("<set_node_auth") < at("--login"), "{calls:#?}");
    let st = k.state.lock().expect("lock").login_auth.clone();
    assert_eq!(
        st,
        Some(("talon".to_string(), secret.to_string())),
        "the login read CHAP from the record"
    );
    let record = root.path("/etc/iscsi/nodes/iqn.2025-01.io.talon:v1/10.0.2.2,3260,-1/default");
    let text = fs::read_to_string(&record).expect("record");
    assert_eq!(text.matches("node.session.auth.authmethod").count(), 1, "{text}");
    assert!(text.ends_with("# END RECORD\n"), "{text}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&record).expect("stat").permissions().mode() & 0o777,
        0o600
    );
}

/// CHAP with no node record to write to (an iscsid whose node database is
/// elsewhere) fails the attach clearly instead of passing the secret as an
/// argument, and leaves nothing.
#[test]
fn chap_without_a_node_record_file_fails_clearly() {
    if !is_root() {
        eprintln!("SKIP chap_without_a_node_record_file_fails_clearly: /dev/talon nodes need mknod (root)");
        return;
    }
    let (_d, root) = setup();
    // the records land where talon does not look
    let k = IscsiKernelDouble {
        node_db: "/var/db/iscsi/nodes",
        ..IscsiKernelDouble::new(&root)
    };
    let secret = "0123456789abcdef0123";
    let t = IscsiTarget {
        chap: Some(ChapCredentials {
            user: ChapUser::parse("talon").expect("user"),
            secret: ChapSecret::parse(secret).expect("secret"),
        }),
        ..target(IQN)
    };
    let e = attach(&root, &vol("v1"), &t, &opts(), &k).expect_err("no record to write");
    let msg = talon::util::error_chain(&e);
    assert!(msg.contains("CHAP") && msg.contains("node record"), "{msg}");
    assert!(!msg.contains(secret));
    assert!(!k.calls().iter().any(|c| c.contains(secret)));
    assert!(
        !k.calls().iter().any(|c| c.contains("--login")),
        "no login without CHAP set"
    );
}

#[test]
fn wrong_iqn_is_named_and_leaves_nothing() {
    let (_d, root) = setup();
    let k = IscsiKernelDouble::new(&root);
    let err = attach(
        &root,
        &vol("v1"),
        &target("iqn.2025-01.io.talon:nope"),
        &opts(),
        &k,
    )
    .expect_err("wrong iqn");
    assert!(matches!(err, IscsiError::NotOffered { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("iqn.2025-01.io.talon:nope") && msg.contains(PORTAL) && msg.contains(IQN),
        "{msg}"
    );
    assert!(k.nodes().is_empty());
    assert!(list_sessions(&root).expect("sessions").is_empty());
}

#[test]
fn missing_lun_logs_out_and_deletes_the_node() {
    let (_d, root) = setup();
    let mut k = IscsiKernelDouble::new(&root);
    k.lun_present = false;
    let err = attach(&root, &vol("v1"), &target(IQN), &opts(), &k).expect_err("no disk");
    assert!(
        matches!(err, IscsiError::DeviceNotFound { lun: 1, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("session1"), "{err}");
    assert!(
        list_sessions(&root).expect("sessions").is_empty(),
        "still logged in"
    );
    assert!(k.nodes().is_empty(), "node record left");
    assert!(!root.path("/dev/talon/v1").exists());
}

#[test]
fn failed_login_is_named_and_leaves_no_node() {
    let (_d, root) = setup();
    let mut k = IscsiKernelDouble::new(&root);
    k.login_code = 24;
    let err = attach(&root, &vol("v1"), &target(IQN), &opts(), &k).expect_err("login");
    assert!(matches!(err, IscsiError::Login { code: 24, .. }), "{err:?}");
    assert!(
        err.to_string().contains(IQN) && err.to_string().contains(PORTAL),
        "{err}"
    );
    assert!(k.nodes().is_empty());
}

#[test]
fn hung_discovery_is_a_timeout_naming_the_portal() {
    let (_d, root) = setup();
    let mut k = IscsiKernelDouble::new(&root);
    k.discovery_hangs = true;
    let err = attach(&root, &vol("v1"), &target(IQN), &opts(), &k).expect_err("hang");
    assert!(
        matches!(err, IscsiError::TimedOut { op: "discovery", .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains(PORTAL), "{err}");
    assert_eq!(k.calls().len(), 1, "nothing after a failed discovery");
}

#[test]
fn finds_the_lun_disk_under_the_session() {
    let (_d, root) = setup();
    let k = IscsiKernelDouble::new(&root);
    k.make_session(3, IQN, PORTAL);
    assert_eq!(
        find_lun_device(&root, "session3", 1).expect("find").as_deref(),
        Some("sdc")
    );
    assert_eq!(find_lun_device(&root, "session3", 2).expect("find"), None);
    assert_eq!(find_lun_device(&root, "session9", 1).expect("find"), None);
    let s = iscsi::find_session(&root, &target(IQN))
        .expect("find")
        .expect("session");
    assert_eq!(s.name, "session3");
    assert_eq!(s.portal, Some(PORTAL.parse().expect("portal")));
}

/// `frontend.AttachController` on an in-memory runtime and a fixture host: Attachment + a V1
/// EngineStatus with an iSCSI export -> AttachmentStatus (transport iscsi, /dev/sdX, session);
/// delete -> logout, finalizer released, status gone. A Volume asking for nvme-tcp with only an
/// iSCSI export fails with a clear message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_controller_attaches_v1_volumes_through_iscsi() {
    use talon::attach::choose::HostFrontends;
    use talon::controllers::Deps;
    use talon::controllers::frontend::attach::AttachController;
    use talon::resources::frontend::{AttachState, Attachment, AttachmentStatus};
    use talon::runtime::testing::{TestRuntime, eventually};

    if !is_root() {
        eprintln!(
            "SKIP attach_controller_attaches_v1_volumes_through_iscsi: /dev/talon nodes need mknod (root)"
        );
        return;
    }
    let (d, root) = setup();
    let k = Arc::new(IscsiKernelDouble::new(&root));
    let deps = Deps {
        host: root.clone(),
        data_dir: d.path().join("data"),
        run_dir: d.path().join("run"),
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
    // a host without nvme_tcp, with iscsid: auto picks iSCSI
    let host = HostFrontends {
        nvme_tcp: false,
        iscsi: true,
    };
    let me = talon::attach::HostInitiators::load_or_create(&root, &deps.data_dir)
        .expect("host identity")
        .iqn
        .to_string();
    let ctl = AttachController::new(deps).with_iscsi(k.clone(), opts(), host);
    let rt = TestRuntime::with(ctl).expect("runtime");
    let st = rt.state.clone();
    let engine = |name: &str| {
        serde_json::json!({
            "engine": "v1", "state": "ready", "sizeBytes": 1u64 << 26, "device": "/var/lib/talon/v1/v.img",
            "replicas": [],
            "exports": [{"transport": "iscsi", "address": "10.0.2.2", "port": 3260, "name": name, "lun": 1,
                         "hosts": [me]}],
            "message": ""
        })
    };
    st.create(
        "engine",
        "EngineStatus",
        "v1",
        "test.Engine",
        engine(IQN),
        BTreeMap::new(),
    )
    .expect("engine");
    st.create(
        "config",
        "Attachment",
        "v1",
        "",
        serde_json::json!({}),
        BTreeMap::new(),
    )
    .expect("attachment");
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
    assert_eq!(attached.spec.transport, "iscsi");
    assert_eq!(attached.spec.device, "/dev/sda");
    assert_eq!(attached.spec.path, "/dev/talon/v1");
    assert_eq!(attached.spec.controller, "session1");
    // logged in through talon's interface, with talon's initiator name (the one the export allows)
    assert_eq!(
        k.state.lock().expect("lock").iface_name.as_deref(),
        Some(me.as_str())
    );
    assert!(
        k.calls()
            .iter()
            .any(|c| c.ends_with("--login -I talon") && c.contains(IQN)),
        "{:?}",
        k.calls()
    );
    assert!(root.path("/dev/talon/v1").exists());

    // v2: the volume asks for nvme-tcp, the engine only exports iSCSI
    st.create(
        "config",
        "Volume",
        "v2",
        "",
        serde_json::json!({"sizeBytes": 1u64 << 26, "frontend": "nvme-tcp"}),
        BTreeMap::new(),
    )
    .expect("volume");
    st.create(
        "engine",
        "EngineStatus",
        "v2",
        "test.Engine",
        engine("iqn.2025-01.io.talon:v2"),
        BTreeMap::new(),
    )
    .expect("engine v2");
    st.create(
        "config",
        "Attachment",
        "v2",
        "",
        serde_json::json!({}),
        BTreeMap::new(),
    )
    .expect("attachment v2");
    let failed = eventually("v2 failed", Duration::from_secs(10), || {
        let st = st.clone();
        async move {
            st.get_typed::<AttachmentStatus>("v2")
                .ok()
                .flatten()
                .filter(|s| s.spec.state == AttachState::Failed)
        }
    })
    .await;
    assert!(
        failed.spec.message.contains("asks for the nvme-tcp frontend"),
        "{}",
        failed.spec.message
    );

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
        list_sessions(&root).expect("sessions").is_empty(),
        "session not logged out"
    );
    assert!(k.nodes().is_empty(), "node record left: {:?}", k.nodes());
    assert!(!root.path("/dev/talon/v1").exists());
    rt.stop().await;
}
