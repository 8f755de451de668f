//! spdk_tgt supervision: readiness and adoption against the `SpdkDouble`,
//! early-exit detection with a real process that is not SPDK, and the whole
//! life cycle with a real spdk_tgt when `TALON_SPDK_DIR` is set.

use std::path::PathBuf;
use std::time::Duration;

use talon::spdk::launch::{nvme_keep_alive_ms, set_nvme_keep_alive};
use talon::spdk::rpc::{
    AddNamespace, AttachController, ByName, CreateSubsystem, CreateTransport, ListenAddress, MallocCreate,
    NvmeOptions, SubsystemListener,
};
use talon::spdk::target::{
    Memory, Origin, Target, TargetConfig, TargetError, TargetEvent, supervise, wait_ready,
};
use talon::spdk::{ClientError, SpdkClient, SpdkDouble};
use tokio::sync::{mpsc, oneshot};

#[tokio::test]
async fn readiness_waits_for_a_target_that_appears_later() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("spdk.sock");
    let (tx, rx) = oneshot::channel();
    let s2 = sock.clone();
    let starter = tokio::spawn(async move {
        // Starts only after the first probe failed (no sleeps: a signal).
        rx.await.expect("go");
        SpdkDouble::start(s2).await.expect("double")
    });
    let client = SpdkClient::new(&sock);
    assert!(client.spdk_get_version().await.is_err(), "nothing listens yet");
    tx.send(()).expect("go");
    let v = wait_ready(&client, None, Duration::from_secs(30))
        .await
        .expect("ready");
    assert!(v.version.starts_with("SPDK v26.05"));
    drop(starter.await.expect("double"));
}

#[tokio::test]
async fn readiness_times_out_with_the_socket_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let client = SpdkClient::new(dir.path().join("none.sock"));
    let e = wait_ready(&client, None, Duration::from_millis(200))
        .await
        .expect_err("no target");
    assert!(matches!(e, TargetError::NotReady { .. }));
    assert!(e.to_string().contains("none.sock"), "{e}");
}

#[tokio::test]
async fn start_adopts_a_target_already_answering() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = TargetConfig::new(dir.path());
    cfg.spdk_tgt = Some(dir.path().join("no-such-spdk_tgt"));
    cfg.spdk_dir = None;
    let _d = SpdkDouble::start(cfg.socket()).await.expect("double");
    let t = Target::start(&cfg).await.expect("adopt");
    assert_eq!(t.origin(), Origin::Adopted);
    // The double runs in this process: SO_PEERCRED names us.
    assert_eq!(t.pid(), Some(std::process::id() as i32));
    t.release(); // never signal ourselves
}

#[tokio::test]
async fn spawn_reports_a_process_that_exits_before_answering() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(false_bin) = ["/bin/false", "/usr/bin/false"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    else {
        eprintln!("SKIP spawn_reports_a_process_that_exits_before_answering: no false(1)");
        return;
    };
    let mut cfg = TargetConfig::new(dir.path().join("run"));
    cfg.spdk_tgt = Some(false_bin);
    let e = Target::spawn(&cfg).await.expect_err("exits");
    assert!(matches!(e, TargetError::ExitedEarly { .. }), "{e}");
}

#[tokio::test]
async fn supervise_adopts_then_sees_the_exit_and_adopts_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = TargetConfig::new(dir.path());
    cfg.spdk_tgt = Some(dir.path().join("no-such-spdk_tgt"));
    cfg.spdk_dir = None;
    let d = SpdkDouble::start(cfg.socket()).await.expect("double");
    let (tx, mut rx) = mpsc::channel(16);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let sup = tokio::spawn(supervise(cfg, tx, async move {
        let _ = stop_rx.await;
    }));
    assert!(matches!(rx.recv().await, Some(TargetEvent::Adopted { .. })));
    d.stop().await;
    assert!(matches!(rx.recv().await, Some(TargetEvent::Exited { .. })));
    assert!(matches!(
        rx.recv().await,
        Some(TargetEvent::Restarting { attempt: 1, .. })
    ));
    // No binary and nothing to adopt: the start fails, and is retried.
    assert!(matches!(rx.recv().await, Some(TargetEvent::StartFailed { .. })));
    d.resume().expect("resume");
    loop {
        match rx.recv().await {
            Some(TargetEvent::Adopted { .. }) => break,
            Some(TargetEvent::Restarting { .. } | TargetEvent::StartFailed { .. }) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
    // Abort rather than shut down: the adopted target is this process.
    sup.abort();
    let _ = sup.await;
    drop(stop_tx);
}

/// With a real spdk_tgt: spawn (`--no-huge -s 1024 -m 0x1`), use, stop; and
/// the supervisor restarts it after `kill -9`.
#[tokio::test]
async fn real_spdk_tgt_life_cycle() {
    let Some(spdk_dir) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP real_spdk_tgt_life_cycle: TALON_SPDK_DIR is not set");
        return;
    };
    if !spdk_dir.join("build/bin/spdk_tgt").exists() {
        eprintln!(
            "SKIP real_spdk_tgt_life_cycle: no build/bin/spdk_tgt under {}",
            spdk_dir.display()
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = TargetConfig::new(dir.path());
    cfg.spdk_dir = Some(spdk_dir);
    cfg.memory = Memory::NoHuge { mem_size_mib: 1024 };
    cfg.cpumask = "0x1".into();
    let t = Target::start(&cfg).await.expect("spawn spdk_tgt");
    assert_eq!(t.origin(), Origin::Spawned);
    assert!(t.version().version.starts_with("SPDK v"), "{:?}", t.version());
    let c = t.client().clone();
    c.bdev_malloc_create(&MallocCreate {
        name: Some("M".into()),
        num_blocks: 256,
        block_size: 4096,
        uuid: None,
    })
    .await
    .expect("malloc");
    c.bdev_malloc_delete(&ByName::new("M")).await.expect("delete");
    let status = t.stop(cfg.stop_grace).await.expect("stop");
    eprintln!("spdk_tgt stopped: {status}");
    assert!(c.spdk_get_version().await.is_err());

    let (tx, mut rx) = mpsc::channel(16);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let sup = tokio::spawn(supervise(cfg.clone(), tx, async move {
        let _ = stop_rx.await;
    }));
    let Some(TargetEvent::Started { pid: Some(pid), .. }) = rx.recv().await else {
        panic!("not started")
    };
    // A client held across the crash reconnects on its own.
    let held = SpdkClient::new(cfg.socket());
    held.spdk_get_version().await.expect("before the crash");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .expect("kill -9");
    assert!(matches!(rx.recv().await, Some(TargetEvent::Exited { .. })));
    assert!(matches!(rx.recv().await, Some(TargetEvent::Restarting { .. })));
    assert!(matches!(rx.recv().await, Some(TargetEvent::Started { .. })));
    held.spdk_get_version().await.expect("after the restart");
    assert_eq!(held.connects(), 2);
    stop_tx.send(()).expect("shutdown");
    assert!(matches!(rx.recv().await, Some(TargetEvent::Stopped { .. })));
    sup.await.expect("supervisor");
}

/// `bdev_nvme_set_options` is taken before the first NVMe controller and
/// refused while one exists (-1 "RPC not permitted with nvme controllers
/// already attached", recorded from v26.05), taken again once it is gone;
/// [`set_nvme_keep_alive`] then checks the keep-alive the target reports.
async fn nvme_keep_alive_only_without_controllers(c: &SpdkClient, port: u16) {
    assert_eq!(set_nvme_keep_alive(c).await.expect("set"), None);
    assert_eq!(nvme_keep_alive_ms(c).await.expect("config"), Some(10_000));
    c.nvmf_create_transport(&CreateTransport::tcp())
        .await
        .expect("transport");
    c.bdev_malloc_create(&MallocCreate {
        name: Some("KA".into()),
        num_blocks: 256,
        block_size: 4096,
        uuid: None,
    })
    .await
    .expect("malloc");
    let nqn = "nqn.2024-01.io.talon:keep-alive";
    c.nvmf_create_subsystem(&CreateSubsystem {
        nqn: nqn.into(),
        allow_any_host: Some(true),
        serial_number: None,
        model_number: None,
        max_namespaces: None,
        ana_reporting: None,
        min_cntlid: None,
        max_cntlid: None,
    })
    .await
    .expect("subsystem");
    let id = uuid::Uuid::from_u128(0x6a1e_55d0_0c3b_4e5f_9a8b_7c6d_5e4f_3a2b);
    c.nvmf_subsystem_add_ns(&AddNamespace::with_id(nqn, "KA", id))
        .await
        .expect("ns");
    c.nvmf_subsystem_add_listener(&SubsystemListener {
        nqn: nqn.into(),
        listen_address: ListenAddress::tcp([127, 0, 0, 1].into(), port),
    })
    .await
    .expect("listener");
    c.bdev_nvme_attach_controller(&AttachController::tcp("KA", [127, 0, 0, 1].into(), port, nqn))
        .await
        .expect("attach");
    let opts = NvmeOptions {
        keep_alive_timeout_ms: Some(5_000),
    };
    match c.bdev_nvme_set_options(&opts).await {
        Err(ClientError::Rpc(e)) => {
            assert_eq!(e.code, -1, "{e}");
            assert_eq!(
                e.message,
                "RPC not permitted with nvme controllers already attached"
            );
        }
        other => panic!("taken with a controller attached: {other:?}"),
    }
    // refused, but the target has the keep-alive: nothing to note
    assert_eq!(set_nvme_keep_alive(c).await.expect("set"), None);
    c.bdev_nvme_detach_controller(&ByName::new("KA"))
        .await
        .expect("detach");
    c.bdev_nvme_set_options(&opts)
        .await
        .expect("taken again without controllers");
    assert_eq!(nvme_keep_alive_ms(c).await.expect("config"), Some(5_000));
    // a target left with another keep-alive and a controller is named in the note
    c.bdev_nvme_attach_controller(&AttachController::tcp("KA", [127, 0, 0, 1].into(), port, nqn))
        .await
        .expect("attach again");
    let note = set_nvme_keep_alive(c).await.expect("set").expect("a note");
    assert!(
        note.contains("NVMe keep-alive is 5000 ms, not 10000 ms"),
        "{note}"
    );
    c.bdev_nvme_detach_controller(&ByName::new("KA"))
        .await
        .expect("detach");
}

#[tokio::test]
async fn nvme_keep_alive_only_without_controllers_on_the_double() {
    let dir = tempfile::tempdir().expect("tempdir");
    let double = SpdkDouble::start(dir.path().join("spdk.sock"))
        .await
        .expect("double");
    nvme_keep_alive_only_without_controllers(&SpdkClient::new(double.socket()), 4431).await;
    assert_eq!(double.nvme_keep_alive_set(), Some(5_000));
}

#[tokio::test]
async fn real_nvme_keep_alive_only_without_controllers() {
    let Some(spdk_dir) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP real_nvme_keep_alive_only_without_controllers: TALON_SPDK_DIR is not set");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = TargetConfig::new(dir.path());
    cfg.spdk_dir = Some(spdk_dir);
    cfg.memory = Memory::NoHuge { mem_size_mib: 1024 };
    cfg.cpumask = "0x1".into();
    let t = Target::start(&cfg).await.expect("spawn spdk_tgt");
    let c = t.client().clone();
    nvme_keep_alive_only_without_controllers(&c, 24431).await;
    t.stop(cfg.stop_grace).await.expect("stop");
}
