//! `talon serve` wiring of the V2 engine: the serve flags, `node_info`'s
//! engine availability from `EngineSelection`, and (with `TALON_SPDK_DIR`)
//! a daemon started with `--no-huge` that brings a config-file disk up on a
//! real spdk_tgt and stops it on a clean shutdown.

#[path = "support/serve_daemon.rs"]
mod serve_daemon;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serve_daemon::{opts, opts_with_config, real_spdk, start};
use talon::cli::{Cli, Command};
use talon::controllers::engine::selection::SpdkOptions;
use talon::resources::config::EngineKind;

#[test]
fn serve_flags_parse_into_spdk_options() {
    let cli = Cli::try_parse_from([
        "talon",
        "serve",
        "--spdk-tgt",
        "/opt/spdk/build/bin/spdk_tgt",
        "--spdk-cpumask",
        "0x6",
        "--no-huge",
        "--interrupt-mode",
        "--engine",
        "v1",
    ])
    .expect("parse");
    let Command::Serve(a) = cli.command else {
        panic!("not serve")
    };
    assert_eq!(
        a.spdk_tgt.as_deref(),
        Some(Path::new("/opt/spdk/build/bin/spdk_tgt"))
    );
    assert_eq!(a.spdk_cpumask, "0x6");
    assert!(a.no_huge && a.interrupt_mode);
    assert_eq!(EngineKind::from(a.engine), EngineKind::V1);
    let cli = Cli::try_parse_from(["talon", "serve"]).expect("parse");
    let Command::Serve(a) = cli.command else {
        panic!("not serve")
    };
    assert_eq!(a.spdk_cpumask, "0x1");
    assert!(!a.no_huge);
    assert_eq!(EngineKind::from(a.engine), EngineKind::Auto);
    assert!(Cli::try_parse_from(["talon", "serve", "--engine", "v3"]).is_err());
}

#[tokio::test]
async fn node_info_reports_v2_from_engine_selection() {
    let dir = tempfile::tempdir().expect("tempdir");
    // not found anywhere
    let missing = SpdkOptions {
        spdk_tgt: Some(dir.path().join("nowhere/spdk_tgt")),
        spdk_dir: None,
        path_var: None,
        ..SpdkOptions::default()
    };
    let d = start(opts(dir.path(), missing)).await;
    let info = d.client.node_info().await.expect("node_info");
    let v2 = info.engines.iter().find(|e| e.engine == "v2").expect("v2");
    assert!(!v2.available);
    assert!(v2.detail.contains("spdk_tgt was not found"), "{}", v2.detail);
    d.stop().await;

    // an executable (never run: no disk, no V2 volume) with --no-huge
    let bin = dir.path().join("bin/spdk_tgt");
    std::fs::create_dir_all(bin.parent().expect("parent")).expect("mkdir");
    std::fs::write(&bin, "#!/bin/sh\nexit 1\n").expect("write");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let found = SpdkOptions {
        spdk_tgt: Some(bin.clone()),
        spdk_dir: None,
        path_var: None,
        no_huge: true,
        ..SpdkOptions::default()
    };
    let d = start(opts(dir.path(), found)).await;
    let info = d.client.node_info().await.expect("node_info");
    let v2 = info.engines.iter().find(|e| e.engine == "v2").expect("v2");
    assert!(v2.available, "{}", v2.detail);
    assert!(v2.detail.contains("--no-huge"), "{}", v2.detail);
    assert!(v2.detail.contains(&bin.display().to_string()), "{}", v2.detail);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_spdk_serve_brings_a_config_disk_up() {
    let Some(spdk_dir) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP real_spdk_serve_brings_a_config_disk_up: TALON_SPDK_DIR not set");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(opts_with_config(
        dir.path(),
        real_spdk(&spdk_dir, 1024),
        "disks:\n  d1:\n    path: disks/d1.img\n    sizeBytes: 134217728\n",
    ))
    .await;
    let disk =
        talon::runtime::testing::eventually("DiskStatus d1 ready", Duration::from_secs(90), || async {
            let r = d.client.get("DiskStatus", "d1").await.ok()?;
            (r.spec["state"] == "ready").then_some(r.spec)
        })
        .await;
    assert_eq!(disk["lvstore"], "talon-d1");
    // disk_add with wait returns once the lvstore is there
    let added: serde_json::Value = d
        .client
        .call(
            "disk_add",
            serde_json::json!({"name": "d2", "path": dir.path().join("d2.img"),
                               "sizeBytes": 134217728u64, "wait": true}),
        )
        .await
        .expect("disk_add d2 with wait");
    assert_eq!(added["status"]["state"], "ready", "{added}");
    assert_eq!(added["status"]["lvstore"], "talon-d2", "{added}");
    let t = d.client.get("TargetStatus", "spdk").await.expect("TargetStatus");
    let pid = t.spec["pid"].as_u64().expect("pid");
    assert_eq!(t.spec["engine"], "v2");
    d.stop().await;
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_err(),
        "spdk_tgt {pid} still runs after a clean stop of talon"
    );
}
