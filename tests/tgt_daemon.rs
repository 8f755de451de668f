//! tgtd supervision against the real tgtd: portal verification, adoption,
//! clean stop.

mod tgt_common;

use std::net::{SocketAddr, TcpListener};

use talon::tgt::daemon::DaemonError;
use talon::tgt::{Tgtd, TgtdConfig};
use tgt_common::ready;

fn pid_gone(pid: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn taken_port_is_refused_and_nothing_keeps_listening() {
    if !ready("taken_port_is_refused_and_nothing_keeps_listening") {
        return;
    }
    let squatter = TcpListener::bind("127.0.0.1:0").expect("bind");
    let portal = squatter.local_addr().expect("addr");
    let run = tempfile::tempdir().expect("run dir");
    let err = Tgtd::start(TgtdConfig::new(run.path(), portal)).expect_err("port is taken");
    let pid = match &err {
        // tgtd fell back to other addresses; the error names who holds the port: this test
        DaemonError::PortInUse { pid, holder, .. } => {
            assert!(
                holder.starts_with(&format!("pid {} (", std::process::id())),
                "{err}"
            );
            *pid
        }
        other => panic!("unexpected error: {other}"),
    };
    assert!(err.to_string().contains(&portal.to_string()), "{err}");
    assert!(pid_gone(pid), "tgtd {pid} was stopped");
    assert!(
        !run.path().join("tgtd.pid").exists(),
        "no pid file for a refused tgtd"
    );
}

#[test]
fn start_adopt_stop() {
    if !ready("start_adopt_stop") {
        return;
    }
    let run = tempfile::tempdir().expect("run dir");
    let portal: SocketAddr = format!("127.0.0.1:{}", tgt_common::free_port())
        .parse()
        .expect("portal");
    let cfg = TgtdConfig::new(run.path(), portal);
    let mut first = Tgtd::start(cfg.clone()).expect("start");
    assert!(first.is_child() && first.is_alive());
    assert_eq!(first.listening().expect("listening"), vec![portal]);
    assert!(run.path().join("socket.0").exists(), "own control socket");
    let pid = first.pid();

    // a second supervisor (talon restarted) adopts it instead of starting another
    let mut adopted = Tgtd::start_or_adopt(cfg.clone()).expect("adopt");
    assert_eq!(adopted.pid(), pid);
    assert!(!adopted.is_child() && adopted.is_alive());
    adopted.admin().ping().expect("answers");

    // a supervisor on another portal refuses to adopt it
    let other: SocketAddr = format!("127.0.0.1:{}", tgt_common::free_port())
        .parse()
        .expect("portal");
    let e = Tgtd::adopt(TgtdConfig::new(run.path(), other)).expect_err("listens elsewhere");
    assert!(e.to_string().contains(&portal.to_string()), "{e}");

    adopted.stop().expect("stop");
    // the first handle is its parent: it sees the exit and reaps it
    let mut gone = false;
    for _ in 0..100 {
        if !first.is_alive() {
            gone = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(gone, "tgtd {pid} exited on delete system");
    assert!(pid_gone(pid));
    assert!(Tgtd::adopt(cfg).expect("adopt").is_none(), "nothing to adopt");
}

#[test]
fn a_tgtd_without_its_pid_file_is_adopted_through_its_control_socket() {
    if !ready("a_tgtd_without_its_pid_file_is_adopted_through_its_control_socket") {
        return;
    }
    let run = tempfile::tempdir().expect("run dir");
    let portal: SocketAddr = format!("127.0.0.1:{}", tgt_common::free_port())
        .parse()
        .expect("portal");
    let cfg = TgtdConfig::new(run.path(), portal);
    let first = Tgtd::start(cfg.clone()).expect("start");
    let pid = first.pid();
    // a talon killed between spawning tgtd and recording it leaves no pid file
    std::fs::remove_file(cfg.pid_path()).expect("remove pid file");
    let adopted = Tgtd::start_or_adopt(cfg.clone()).expect("adopt");
    assert_eq!(
        adopted.pid(),
        pid,
        "the tgtd behind socket.0 is adopted, not a second one started"
    );
    assert!(!adopted.is_child());
    assert_eq!(
        std::fs::read_to_string(cfg.pid_path()).expect("pid file").trim(),
        pid.to_string(),
        "the pid file is written again"
    );
    drop(adopted);
    first.stop().expect("stop"); // the child's handle reaps it
    assert!(pid_gone(pid), "tgtd {pid} stopped");
}
