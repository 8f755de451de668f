//! Who can reach a V1 volume, against a real tgtd, with libiscsi clients run
//! as the unprivileged user `nobody` (what any local user can do): nobody
//! while the volume is attached nowhere; only this host's initiator name
//! while it is attached here; the node's allowed hosts besides. Discovery
//! offers a stranger nothing.

mod tgt_common;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use talon::attach::HostInitiators;
use talon::controllers::engine::v1_target::TgtdController;
use talon::controllers::engine::v1_volume::V1VolumeController;
use talon::names::{Iqn, Nqn};
use talon::resources::config::{FrontendKind, NodeConfig, Volume};
use talon::resources::engine::{Engine, EngineStatus, ObjectState};
use talon::resources::frontend::Attachment;
use talon::runtime::State;
use talon::runtime::testing::{TestRuntime, eventually};
use talon::tgt::{Tgtd, TgtdConfig};
use tgt_common::{ready, tool_as_nobody};

const WAIT: Duration = Duration::from_secs(30);
/// talon's initiator name on this (test) host.
const ME: &str = "iqn.2025-01.io.talon:host.0b7d3c1e-3a43-4bd4-a4a1-4e3d7d4c2f10";
/// Any other initiator.
const STRANGER: &str = "iqn.2025-01.io.example:stranger";
/// An initiator the node allows for every volume.
const ALLOWED: &str = "iqn.2025-01.io.example:allowed";

struct Cleanup(TgtdConfig);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(Some(t)) = Tgtd::adopt(self.0.clone()) {
            let _ = t.stop();
        }
    }
}

fn engine_status(state: &State, id: &str) -> Option<EngineStatus> {
    state.get_typed::<EngineStatus>(id).ok().flatten().map(|t| t.spec)
}

/// Whether `initiator`, as user nobody, can log in and INQUIRE the LUN.
fn can_read(portal: SocketAddr, volume: &str, initiator: &str) -> (bool, String) {
    let url = format!("iscsi://{portal}/iqn.2025-01.io.talon:{volume}/1");
    tool_as_nobody("iscsi-inq", &["-i", initiator, &url])
}

/// The targets SendTargets discovery offers `initiator`, as user nobody.
fn discovered(portal: SocketAddr, initiator: &str) -> String {
    let (_, out) = tool_as_nobody("iscsi-ls", &["-i", initiator, &format!("iscsi://{portal}")]);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_volume_reaches_only_the_host_it_is_attached_to() {
    if !ready("v1_volume_reaches_only_the_host_it_is_attached_to") {
        return;
    }
    let data = tempfile::tempdir().expect("data dir");
    let port = tgt_common::free_port();
    let portal: SocketAddr = format!("127.0.0.1:{port}").parse().expect("portal");
    let tgtd_cfg = TgtdConfig::new(data.path().join("run/tgtd"), portal);
    let _cleanup = Cleanup(tgtd_cfg.clone());
    let admin = tgtd_cfg.admin();
    let (cfg2, data_dir) = (tgtd_cfg.clone(), data.path().to_path_buf());
    let ids = HostInitiators {
        nqn: Nqn::parse("nqn.2014-08.org.nvmexpress:uuid:0b7d3c1e-3a43-4bd4-a4a1-4e3d7d4c2f10").expect("nqn"),
        iqn: Iqn::parse(ME).expect("iqn"),
    };
    // auto volumes on an auto node go to V2 here: V1 serves the explicit v1 volumes only
    let rt = TestRuntime::start(move |rt| {
        rt.register(TgtdController::with_config(cfg2, Engine::V2))?;
        rt.register(V1VolumeController::new(data_dir, admin, Engine::V2).with_initiators(Some(ids)))
    })
    .expect("runtime");
    let state = rt.state.clone();
    state
        .create_typed(
            "node",
            "",
            &NodeConfig {
                iscsi_port: port,
                ..NodeConfig::default()
            },
        )
        .expect("node config");
    let vol: Volume = serde_json::from_value(json!({"sizeBytes": 8 << 20, "engine": "v1"})).expect("volume");
    for v in ["acc1", "acc2"] {
        state.create_typed(v, "", &vol).expect("volume");
    }
    for v in ["acc1", "acc2"] {
        let s = eventually("served", WAIT, || async {
            engine_status(&state, v).filter(|s| s.state == ObjectState::Ready)
        })
        .await;
        assert_eq!(s.exports[0].hosts, Vec::<String>::new(), "{v}: nobody by default");
    }

    // attached nowhere: nobody, not even this host, reaches a volume or sees it
    for who in [ME, STRANGER] {
        let (ok, out) = can_read(portal, "acc1", who);
        assert!(!ok, "{who} read acc1 while it is attached nowhere: {out}");
        let offered = discovered(portal, who);
        assert!(!offered.contains("io.talon:acc"), "{who} discovered {offered}");
    }

    // attached here: this host's initiator name, and only for that volume
    state
        .create_typed(
            "acc1",
            "",
            &Attachment {
                frontend: FrontendKind::Auto,
            },
        )
        .expect("attachment");
    eventually("acc1 allows this host", WAIT, || async {
        engine_status(&state, "acc1").filter(|s| s.exports[0].hosts == [ME])
    })
    .await;
    let (ok, out) = can_read(portal, "acc1", ME);
    assert!(ok, "this host cannot read its attached volume: {out}");
    let (ok, out) = can_read(portal, "acc1", STRANGER);
    assert!(!ok, "a stranger read acc1: {out}");
    let (ok, out) = can_read(portal, "acc2", ME);
    assert!(!ok, "this host read acc2, which it has not attached: {out}");
    let offered = discovered(portal, ME);
    assert!(
        offered.contains("io.talon:acc1") && !offered.contains("io.talon:acc2"),
        "{offered}"
    );
    assert!(!discovered(portal, STRANGER).contains("io.talon:acc"));

    // the node's allowed hosts reach every volume
    let mut node = state.get_typed::<NodeConfig>("node").expect("get").expect("node");
    node.spec.allowed_hosts = vec![ALLOWED.to_string()];
    state
        .update_typed("node", "", Some(node.metadata.version), &node.spec)
        .expect("allow a host");
    eventually("acc2 allows the allowed host", WAIT, || async {
        engine_status(&state, "acc2").filter(|s| s.exports[0].hosts == [ALLOWED])
    })
    .await;
    let (ok, out) = can_read(portal, "acc2", ALLOWED);
    assert!(ok, "the allowed host cannot read acc2: {out}");

    // detached: this host is refused again
    state.destroy("config", "Attachment", "acc1", "").expect("detach");
    eventually("acc1 no longer allows this host", WAIT, || async {
        engine_status(&state, "acc1").filter(|s| s.exports[0].hosts == [ALLOWED])
    })
    .await;
    let (ok, out) = can_read(portal, "acc1", ME);
    assert!(!ok, "this host read acc1 after the detach: {out}");
    rt.stop().await;
}

/// A V1 engine (tgtd + volume controller) on a real tgtd for one test, with
/// tgtadm run through a wrapper that records every argv it is given.
struct Node {
    rt: TestRuntime,
    data: tempfile::TempDir,
    portal: SocketAddr,
    admin: talon::tgt::TgtAdm,
    argv_log: std::path::PathBuf,
    _cleanup: Cleanup,
}

impl Node {
    async fn start(node: NodeConfig) -> Self {
        let data = tempfile::tempdir().expect("data dir");
        let port = tgt_common::free_port();
        let portal: SocketAddr = format!("127.0.0.1:{port}").parse().expect("portal");
        let tgtd_cfg = TgtdConfig::new(data.path().join("run/tgtd"), portal);
        let cleanup = Cleanup(tgtd_cfg.clone());
        let argv_log = data.path().join("tgtadm-argv.log");
        let wrapper = data.path().join("tgtadm-recording");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\nexec tgtadm \"$@\"\n",
                argv_log.display()
            ),
        )
        .expect("wrapper");
        std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let admin = tgtd_cfg.admin().with_program(&wrapper);
        let (cfg2, data_dir, admin2) = (tgtd_cfg.clone(), data.path().to_path_buf(), admin.clone());
        let ids = HostInitiators {
            nqn: Nqn::parse("nqn.2014-08.org.nvmexpress:uuid:0b7d3c1e-3a43-4bd4-a4a1-4e3d7d4c2f10")
                .expect("nqn"),
            iqn: Iqn::parse(ME).expect("iqn"),
        };
        let rt = TestRuntime::start(move |rt| {
            rt.register(TgtdController::with_config(cfg2, Engine::V2))?;
            rt.register(V1VolumeController::new(data_dir, admin2, Engine::V2).with_initiators(Some(ids)))
        })
        .expect("runtime");
        rt.state
            .create_typed(
                "node",
                "",
                &NodeConfig {
                    iscsi_port: port,
                    ..node
                },
            )
            .expect("node config");
        Self {
            rt,
            data,
            portal,
            admin,
            argv_log,
            _cleanup: cleanup,
        }
    }

    /// Creates an 8 MiB V1 volume, attached here or not, and waits until it is served to `hosts`.
    async fn volume(&self, id: &str, attach: bool, hosts: &[&str]) {
        let vol: Volume =
            serde_json::from_value(json!({"sizeBytes": 8 << 20, "engine": "v1"})).expect("volume");
        self.rt.state.create_typed(id, "", &vol).expect("volume");
        if attach {
            let a = Attachment {
                frontend: FrontendKind::Auto,
            };
            self.rt.state.create_typed(id, "", &a).expect("attachment");
        }
        self.served_to(id, hosts).await;
    }

    async fn served_to(&self, id: &str, hosts: &[&str]) {
        let state = &self.rt.state;
        eventually(&format!("{id} served to {hosts:?}"), WAIT, || async {
            engine_status(state, id).filter(|s| s.state == ObjectState::Ready && s.exports[0].hosts == hosts)
        })
        .await;
    }

    async fn set_node(&self, f: impl FnOnce(&mut NodeConfig)) {
        let mut node = self
            .rt
            .state
            .get_typed::<NodeConfig>("node")
            .expect("get")
            .expect("node");
        f(&mut node.spec);
        self.rt
            .state
            .update_typed("node", "", Some(node.metadata.version), &node.spec)
            .expect("update node");
    }

    fn target(&self, id: &str) -> talon::tgt::TargetInfo {
        self.admin
            .find_target(&Iqn::parse(&format!("iqn.2025-01.io.talon:{id}")).expect("iqn"))
            .expect("show")
            .expect("target")
    }

    fn url(&self, id: &str, chap: Option<(&str, &str)>) -> String {
        let auth = chap.map(|(u, p)| format!("{u}%{p}@")).unwrap_or_default();
        format!("iscsi://{auth}{}/iqn.2025-01.io.talon:{id}/1", self.portal)
    }
}

/// `NodeConfig.iscsiChap`: the node's credentials file is made 0600; a login
/// with no secret or a wrong one is refused, the right one reads; the secret
/// never reaches tgtadm's argv (tgtadm runs through a recording wrapper).
/// Turning CHAP off unbinds the account again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_chap_refuses_missing_and_wrong_secrets() {
    if !ready("v1_chap_refuses_missing_and_wrong_secrets") {
        return;
    }
    let node = Node::start(NodeConfig {
        iscsi_chap: true,
        ..NodeConfig::default()
    })
    .await;
    node.volume("chap1", true, &[ME]).await;
    let file = node.data.path().join("iscsi-chap");
    let mode = std::fs::metadata(&file).expect("credentials file").permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
    let creds = talon::tgt::chap::load_or_create(node.data.path()).expect("read credentials");
    let (user, secret) = (creds.user.as_str(), creds.secret.expose());
    assert_eq!(node.target("chap1").accounts, vec![user.to_string()]);

    let (ok, out) = tool_as_nobody("iscsi-inq", &["-i", ME, &node.url("chap1", None)]);
    assert!(!ok, "a login without a secret read the volume: {out}");
    let wrong = format!("{}x", &secret[1..]);
    let (ok, out) = tool_as_nobody("iscsi-inq", &["-i", ME, &node.url("chap1", Some((user, &wrong)))]);
    assert!(!ok, "a wrong secret read the volume: {out}");
    let (ok, out) = tool_as_nobody("iscsi-inq", &["-i", ME, &node.url("chap1", Some((user, secret)))]);
    assert!(ok, "the right secret was refused: {out}");
    // the secret is no argument of the initiator-name ACL either: a stranger with it is refused
    let (ok, out) = tool_as_nobody(
        "iscsi-inq",
        &["-i", STRANGER, &node.url("chap1", Some((user, secret)))],
    );
    assert!(!ok, "a stranger with the secret read the volume: {out}");

    // a second volume is bound to the same account without making it again
    node.volume("chap2", true, &[ME]).await;
    assert_eq!(node.target("chap2").accounts, vec![user.to_string()]);
    let argv = std::fs::read_to_string(&node.argv_log).expect("argv log");
    assert!(
        argv.contains("--mode account"),
        "tgtadm bound the account: {argv}"
    );
    assert!(!argv.contains(secret), "the secret reached tgtadm's argv");

    // off again: the targets no longer ask for CHAP
    node.set_node(|n| n.iscsi_chap = false).await;
    let state = &node.rt.state;
    eventually("the account is unbound", WAIT, || async {
        let _ = state;
        node.target("chap1").accounts.is_empty().then_some(())
    })
    .await;
    let (ok, out) = tool_as_nobody("iscsi-inq", &["-i", ME, &node.url("chap1", None)]);
    assert!(ok, "without CHAP this host is refused: {out}");
    node.rt.stop().await;
}

/// A deleted Attachment, or an allowed host removed from the node, cuts the
/// initiator's existing session (tgtd checks the ACL only at login): tgtd
/// shows no session any more, the initiator's next command fails, and its
/// next login is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_detach_and_allowed_hosts_change_cut_sessions() {
    if !ready("v1_detach_and_allowed_hosts_change_cut_sessions") {
        return;
    }
    let node = Node::start(NodeConfig {
        allowed_hosts: vec![ALLOWED.to_string()],
        ..NodeConfig::default()
    })
    .await;
    node.volume("cut1", true, &[ME, ALLOWED]).await;
    let lib = tgt_common::Libiscsi::load().expect("libiscsi");
    let portal = node.portal.to_string();
    let iqn = "iqn.2025-01.io.talon:cut1";
    let mine = lib.connect(&portal, iqn, ME, None).expect("this host logs in");
    let other = lib
        .connect(&portal, iqn, ALLOWED, None)
        .expect("the allowed host logs in");
    for s in [&mine, &other] {
        s.no_reconnect();
        s.read(0, 512).expect("read while admitted");
    }
    assert_eq!(node.target("cut1").nexuses.len(), 2);

    // detach: this host's session goes, the allowed host's stays
    node.rt
        .state
        .destroy("config", "Attachment", "cut1", "")
        .expect("detach");
    node.served_to("cut1", &[ALLOWED]).await;
    eventually("this host's session is cut", WAIT, || async {
        let t = node.target("cut1");
        (t.nexuses.len() == 1 && t.nexuses[0].initiator == ALLOWED).then_some(())
    })
    .await;
    assert!(mine.read(0, 512).is_err(), "the cut session still reads");
    other.read(0, 512).expect("the allowed host still reads");
    assert!(
        lib.connect(&portal, iqn, ME, None).is_err(),
        "this host logged in again"
    );

    // the allowed host removed from the node: its session goes too
    node.set_node(|n| n.allowed_hosts.clear()).await;
    node.served_to("cut1", &[]).await;
    eventually("the allowed host's session is cut", WAIT, || async {
        node.target("cut1").nexuses.is_empty().then_some(())
    })
    .await;
    assert!(other.read(0, 512).is_err(), "the cut session still reads");
    assert!(lib.connect(&portal, iqn, ALLOWED, None).is_err());
    drop((mine, other));
    node.rt.stop().await;
}

/// A delete removes its volume's target by the target id its export got, and
/// lists none of tgtd's targets (its cost does not grow with the number of
/// volumes; tgtadm runs through a recording wrapper). With an initiator
/// logged in it waits, naming it. After tgtd restarts (new target ids) the
/// remembered ids are not trusted: the right target goes, the others stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_delete_lists_no_targets_and_survives_a_tgtd_restart() {
    if !ready("v1_delete_lists_no_targets_and_survives_a_tgtd_restart") {
        return;
    }
    let node = Node::start(NodeConfig::default()).await;
    for id in ["del1", "del2", "del3", "del4"] {
        node.volume(id, false, &[]).await;
    }
    node.volume("del5", true, &[ME]).await;
    let state = &node.rt.state;
    let gone = |id: &'static str| async move {
        eventually(&format!("{id} deleted"), WAIT, || async {
            state
                .get_typed::<Volume>(id)
                .expect("get")
                .is_none()
                .then_some(())
        })
        .await
    };
    std::fs::write(&node.argv_log, "").expect("clear the argv log");
    state
        .destroy("config", "Volume", "del2", "")
        .expect("delete del2");
    gone("del2").await;
    let argv = std::fs::read_to_string(&node.argv_log).expect("argv log");
    assert!(
        argv.lines()
            .any(|l| l.contains("--op delete --mode target --tid")),
        "the target was removed by its id: {argv}"
    );
    assert!(
        !argv.contains("--op show --mode target"),
        "a delete listed tgtd's targets: {argv}"
    );
    let plain = tgtd_admin(&node);
    let names = |admin: &talon::tgt::TgtAdm| -> Vec<String> {
        admin.show().expect("show").into_iter().map(|t| t.name).collect()
    };
    let have = names(&plain);
    assert!(
        !have.iter().any(|n| n.ends_with(":del2")),
        "del2's target stays: {have:?}"
    );
    for id in ["del1", "del3", "del4", "del5"] {
        assert!(
            have.iter().any(|n| n.ends_with(&format!(":{id}"))),
            "{id} lost its target"
        );
    }

    // an initiator logged in: the delete waits and names it, then goes on
    let lib = tgt_common::Libiscsi::load().expect("libiscsi");
    let session = lib
        .connect(&node.portal.to_string(), "iqn.2025-01.io.talon:del5", ME, None)
        .expect("this host logs in");
    session.no_reconnect();
    state
        .destroy("config", "Volume", "del5", "")
        .expect("delete del5");
    let msg = eventually("del5 waits for its session", WAIT, || async {
        engine_status(state, "del5")
            .filter(|s| s.state == ObjectState::Deleting && s.message.contains(ME))
            .map(|s| s.message)
    })
    .await;
    println!("delete with a session: {msg}");
    drop(session);
    gone("del5").await;

    // tgtd restarts: the targets come back with new ids; deletes still hit the right one
    let pid = state
        .get_typed::<talon::resources::engine::TargetStatus>(talon::resources::engine::TGTD_STATUS_ID)
        .expect("get")
        .and_then(|t| t.spec.pid)
        .expect("tgtd pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill tgtd");
    eventually("the targets are back", WAIT, || async {
        let have = plain.show().ok()?.into_iter().map(|t| t.name).collect::<Vec<_>>();
        ["del1", "del3", "del4"]
            .iter()
            .all(|id| have.iter().any(|n| n.ends_with(&format!(":{id}"))))
            .then_some(())
    })
    .await;
    state
        .destroy("config", "Volume", "del3", "")
        .expect("delete del3");
    gone("del3").await;
    let have = names(&plain);
    assert!(
        !have.iter().any(|n| n.ends_with(":del3")),
        "del3's target stays: {have:?}"
    );
    for id in ["del1", "del4"] {
        assert!(
            have.iter().any(|n| n.ends_with(&format!(":{id}"))),
            "{id} lost its target: {have:?}"
        );
    }
    node.rt.stop().await;
}

/// tgtadm without the recording wrapper (the test's own listings stay out of the log).
fn tgtd_admin(node: &Node) -> talon::tgt::TgtAdm {
    talon::tgt::TgtAdm::new(node.admin.socket())
}
