//! The `SpdkDouble` keeps the semantics recorded from a real spdk_tgt v26.05:
//! the whole recorded transcript is replayed against the double and every
//! call must succeed or fail as it did on the real target (same code and
//! message), plus flows the transcript does not cover (restart, faults,
//! framing).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use talon::spdk::double::Fault;
use talon::spdk::rpc::*;
use talon::spdk::{ClientError, ErrorKind, SpdkClient, SpdkDouble};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The recording: `$TALON_SPDK_FACTS`, else the repo's `tests/data/spdk`.
fn facts_dir() -> PathBuf {
    match std::env::var_os("TALON_SPDK_FACTS") {
        Some(d) => d.into(),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/spdk"),
    }
}

const T: Duration = Duration::from_secs(10);

async fn double() -> (tempfile::TempDir, SpdkDouble, SpdkClient) {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = SpdkDouble::start(dir.path().join("spdk.sock"))
        .await
        .expect("double");
    let c = SpdkClient::new(d.socket());
    (dir, d, c)
}

fn sparse_file(dir: &std::path::Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .expect("create")
        .set_len(size)
        .expect("set_len");
    p
}

/// A port for a listener, from this process's reserved block below the
/// ephemeral range (`runtime::testing::free_port`).
fn free_port() -> u16 {
    talon::runtime::testing::free_port()
}

/// Replays every recorded call through `c` and returns the differences from
/// the recorded outcomes (same code and message for errors; same shape, and
/// the same value unless it is a generated UUID, for results). The AIO file
/// and the TCP ports are moved to a temp dir and free ports.
async fn replay_against(c: &SpdkClient, transcript: &str, dir: &std::path::Path) -> (Vec<String>, usize) {
    let aio = sparse_file(dir, "aio0.img", 64 << 20);
    let ports: Vec<(String, String)> = ["4420", "4421", "3260", "3261"]
        .iter()
        .map(|p| (p.to_string(), free_port().to_string()))
        .collect();
    let mut failures = Vec::new();
    let mut errors = 0;
    for (line, text) in transcript.lines().enumerate() {
        let rec: Value = serde_json::from_str(text).expect("line");
        let method = rec["method"].as_str().expect("method");
        let mut params = rec["request"].get("params").cloned().filter(|p| !p.is_null());
        if let Some(f) = params.as_mut().and_then(|p| p.get_mut("filename")) {
            let name = f
                .as_str()
                .unwrap_or_default()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            *f = json!(if name == "aio0.img" {
                aio.clone()
            } else {
                dir.join(name)
            });
        }
        if let Some(p) = params.as_mut() {
            let mut text = p.to_string();
            for (from, to) in &ports {
                text = text.replace(&format!("\"{from}\""), &format!("\"{to}\""));
            }
            *p = serde_json::from_str(&text).expect("params");
        }
        let got = c.call_value(method, params, T).await;
        let resp = &rec["response"];
        match (resp.get("error"), got) {
            (Some(want), Err(ClientError::Rpc(e))) => {
                errors += 1;
                if Some(e.code) != want["code"].as_i64()
                    || Some(e.message.as_str()) != want["message"].as_str()
                {
                    failures.push(format!(
                        "line {line} {method}: got {} {:?}, recorded {want}",
                        e.code, e.message
                    ));
                }
            }
            (Some(want), other) => failures.push(format!(
                "line {line} {method}: got {other:?}, recorded error {want}"
            )),
            (None, Err(e)) => failures.push(format!("line {line} {method}: got {e}, recorded success")),
            (None, Ok(v)) => {
                let Some(want) = resp.get("result") else { continue }; // summarized
                let same_shape = match (want, &v) {
                    (Value::Array(a), Value::Array(b)) => a.len() == b.len(),
                    (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
                };
                // Names that are not generated UUIDs must match exactly.
                let generated = want.as_str().is_some_and(|s| uuid::Uuid::parse_str(s).is_ok());
                let exact_ok = !want.is_string() || generated || want == &v;
                if !same_shape || !exact_ok {
                    failures.push(format!("line {line} {method}: got {v}, recorded {want}"));
                }
            }
        }
    }
    (failures, errors)
}

/// The double answers no method a real v26.05 target lacks: every method it
/// implements is in the recorded `rpc_get_methods` list, and it lists
/// itself exactly those.
#[tokio::test]
async fn the_double_implements_only_methods_a_real_v26_05_target_has() {
    let real: Vec<String> = serde_json::from_str(
        &std::fs::read_to_string(facts_dir().join("rpc-methods-v26.05.json")).expect("method list"),
    )
    .expect("method list json");
    let extra: Vec<&&str> = talon::spdk::double::METHODS
        .iter()
        .filter(|m| !real.iter().any(|r| r == *m))
        .collect();
    assert!(
        extra.is_empty(),
        "the double answers methods v26.05 lacks: {extra:?}"
    );
    let (_dir, _d, c) = double().await;
    let listed: Vec<String> = c
        .typed("rpc_get_methods", &serde_json::json!({}))
        .await
        .expect("rpc_get_methods");
    let mut want: Vec<String> = talon::spdk::double::METHODS
        .iter()
        .map(|m| m.to_string())
        .collect();
    let mut got = listed.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want);
}

#[tokio::test]
async fn transcript_replays_identically_against_the_double() {
    let text =
        std::fs::read_to_string(facts_dir().join("transcript-v26.05.jsonl")).expect("recorded transcript");
    let (dir, _d, c) = double().await;
    let (failures, errors) = replay_against(&c, &text, dir.path()).await;
    eprintln!(
        "double: {} recorded calls replayed, {errors} errors with identical code and message",
        text.lines().count()
    );
    assert!(
        failures.is_empty(),
        "the double differs from spdk_tgt:\n{}",
        failures.join("\n")
    );
    assert_eq!(errors, 41);
}

/// The same replay against a real spdk_tgt: checks the recording, the
/// client and the double's reference at once.
#[tokio::test]
async fn transcript_replays_identically_against_real_spdk_tgt() {
    let text =
        std::fs::read_to_string(facts_dir().join("transcript-v26.05.jsonl")).expect("recorded transcript");
    let Some(spdk_dir) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP transcript_replays_identically_against_real_spdk_tgt: TALON_SPDK_DIR is not set");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = talon::spdk::target::TargetConfig::new(dir.path().join("run"));
    cfg.spdk_dir = Some(spdk_dir);
    // The recording used hugepages; with --no-huge, 1024 MiB runs out (-12)
    // at the fourth malloc bdev.
    cfg.memory = talon::spdk::target::Memory::NoHuge { mem_size_mib: 2048 };
    let t = talon::spdk::target::Target::spawn(&cfg)
        .await
        .expect("spawn spdk_tgt");
    let c = t.client().clone();
    let (failures, errors) = replay_against(&c, &text, dir.path()).await;
    let stopped = t.stop(cfg.stop_grace).await;
    eprintln!(
        "spdk_tgt: {} recorded calls replayed, {errors} errors; stop: {stopped:?}",
        text.lines().count()
    );
    assert!(
        failures.is_empty(),
        "spdk_tgt differs from its recording:\n{}",
        failures.join("\n")
    );
}

#[tokio::test]
async fn lvol_names_aliases_snapshot_clone_resize() {
    let (_dir, _d, c) = double().await;
    let lvs = talon::spdk::double::malloc_lvstore(&c, "lvs0")
        .await
        .expect("malloc bdev and lvstore");
    let id = c
        .bdev_lvol_create(&LvolCreate::thin("lvs0", "v1", 16))
        .await
        .expect("lvol");
    let b = c.bdev("lvs0/v1").await.expect("get").expect("present");
    assert_eq!(b.name, id);
    assert_eq!(b.aliases, vec!["lvs0/v1".to_string()]);
    assert_eq!(b.size_bytes(), 16 << 20);
    assert!(c.bdev(&id).await.expect("by uuid").is_some());

    let snap = c
        .bdev_lvol_snapshot(&LvolSnapshot {
            lvol_name: "lvs0/v1".into(),
            snapshot_name: "s1".into(),
        })
        .await
        .expect("snapshot");
    let clone = c
        .bdev_lvol_clone(&LvolClone {
            snapshot_name: "lvs0/s1".into(),
            clone_name: "c1".into(),
        })
        .await
        .expect("clone");
    let e = c
        .bdev_lvol_delete(&ByName::new(snap.clone()))
        .await
        .expect_err("snapshot has two clones");
    assert!(e.is(ErrorKind::Busy), "{e}");
    c.bdev_lvol_delete(&ByName::new(clone))
        .await
        .expect("delete clone");
    // One clone left (v1): SPDK merges the snapshot into it.
    c.bdev_lvol_delete(&ByName::new(snap))
        .await
        .expect("delete snapshot");
    c.bdev_lvol_resize(&LvolResize {
        name: "lvs0/v1".into(),
        size_in_mib: 32,
    })
    .await
    .expect("resize");
    assert_eq!(
        c.bdev("lvs0/v1")
            .await
            .expect("get")
            .expect("present")
            .size_bytes(),
        32 << 20
    );
    let lvols = c.bdev_lvol_get_lvols(&GetLvols::default()).await.expect("lvols");
    assert_eq!(lvols.len(), 1);
    assert!(!lvols[0].is_clone);
    let e = c
        .bdev_lvol_create_lvstore(&LvstoreCreate {
            bdev_name: "M0".into(),
            lvs_name: "lvs1".into(),
            cluster_sz: None,
            clear_method: None,
            num_md_pages_per_cluster_ratio: None,
        })
        .await
        .expect_err("claimed");
    assert!(e.is(ErrorKind::Busy));
    c.bdev_lvol_delete_lvstore(&LvstoreSelector {
        uuid: Some(lvs),
        lvs_name: None,
    })
    .await
    .expect("delete lvs");
    c.bdev_malloc_delete(&ByName::new("M0"))
        .await
        .expect("malloc delete");
    assert!(
        c.bdev_get_bdevs(&GetBdevs::default())
            .await
            .expect("list")
            .is_empty()
    );
}

#[tokio::test]
async fn raid1_degraded_and_claims() {
    let (_dir, _d, c) = double().await;
    for n in ["A", "B", "C"] {
        c.bdev_malloc_create(&MallocCreate {
            name: Some(n.into()),
            num_blocks: 2048,
            block_size: 4096,
            uuid: None,
        })
        .await
        .expect("malloc");
    }
    let one = RaidCreate {
        name: "R".into(),
        raid_level: RaidLevel::Raid1,
        base_bdevs: vec!["A".into()],
        strip_size_kb: None,
        uuid: None,
        superblock: None,
    };
    let e = c.bdev_raid_create(&one).await.expect_err("raid1 of one");
    assert!(e.is(ErrorKind::InvalidArgument));
    c.bdev_raid_create(&RaidCreate {
        base_bdevs: vec!["A".into(), "B".into()],
        ..one.clone()
    })
    .await
    .expect("raid1");
    assert!(c.bdev("A").await.expect("A").expect("A").claimed);
    c.bdev_raid_remove_base_bdev(&ByName::new("B"))
        .await
        .expect("remove");
    let r = &c
        .bdev_raid_get_bdevs(&GetRaids {
            category: RaidCategory::All,
        })
        .await
        .expect("raids")[0];
    assert_eq!(
        (r.state.as_str(), r.num_base_bdevs, r.num_base_bdevs_operational),
        ("online", 2, 1)
    );
    c.bdev_raid_add_base_bdev(&RaidAddBaseBdev {
        raid_bdev: "R".into(),
        base_bdev: "C".into(),
    })
    .await
    .expect("add");
    let r = &c
        .bdev_raid_get_bdevs(&GetRaids {
            category: RaidCategory::Online,
        })
        .await
        .expect("raids")[0];
    assert_eq!(r.num_base_bdevs_operational, 2);
    let e = c
        .bdev_malloc_delete(&ByName::new("C"))
        .await
        .expect_err("claimed member");
    assert!(e.is(ErrorKind::Busy));
    c.bdev_raid_delete(&talon::spdk::rpc::RaidDelete::new("R"))
        .await
        .expect("delete raid");
    assert!(!c.bdev("A").await.expect("A").expect("A").claimed);
}

/// What an export's claim on its bdev allows, as one script: each call's
/// outcome (`ok`, or the error's code) and, after some, whether `m0` is
/// claimed. Run on the double and, with `TALON_SPDK_DIR`, on spdk_tgt
/// v26.05, which must give the same list.
async fn export_claims(c: &SpdkClient) -> Vec<String> {
    let mut out = Vec::new();
    let calls: Vec<(&str, Value)> = vec![
        (
            "bdev_malloc_create",
            json!({"name": "m0", "num_blocks": 4096, "block_size": 4096}),
        ),
        (
            "bdev_malloc_create",
            json!({"name": "m1", "num_blocks": 4096, "block_size": 4096}),
        ),
        (
            "bdev_malloc_create",
            json!({"name": "m2", "num_blocks": 4096, "block_size": 4096}),
        ),
        (
            "bdev_malloc_create",
            json!({"name": "m3", "num_blocks": 4096, "block_size": 4096}),
        ),
        ("nvmf_create_transport", json!({"trtype": "TCP"})),
        (
            "nvmf_create_subsystem",
            json!({"nqn": "nqn.2016-06.io.spdk:a", "allow_any_host": true}),
        ),
        (
            "nvmf_create_subsystem",
            json!({"nqn": "nqn.2016-06.io.spdk:b", "allow_any_host": true}),
        ),
        // exported: claimed
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": "nqn.2016-06.io.spdk:a", "namespace": {"bdev_name": "m0"}}),
        ),
        // a raid over an exported bdev: refused, nothing left
        (
            "bdev_raid_create",
            json!({"name": "r0", "raid_level": "raid1", "base_bdevs": ["m0", "m1"]}),
        ),
        (
            "bdev_raid_create",
            json!({"name": "r1", "raid_level": "raid1", "base_bdevs": ["m2", "m3"]}),
        ),
        // a raid member exported, an exported bdev exported again: refused
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": "nqn.2016-06.io.spdk:b", "namespace": {"bdev_name": "m2"}}),
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": "nqn.2016-06.io.spdk:b", "namespace": {"bdev_name": "m0"}}),
        ),
        // the namespace removed: the claim ends
        (
            "nvmf_subsystem_remove_ns",
            json!({"nqn": "nqn.2016-06.io.spdk:a", "nsid": 1}),
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": "nqn.2016-06.io.spdk:b", "namespace": {"bdev_name": "m0"}}),
        ),
        // an exported bdev deleted all the same; its namespace goes
        ("bdev_malloc_delete", json!({"name": "m0"})),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": "nqn.2016-06.io.spdk:b", "namespace": {"bdev_name": "m1"}}),
        ),
        // the subsystem deleted: the claim ends (m1 can be a raid member)
        ("nvmf_delete_subsystem", json!({"nqn": "nqn.2016-06.io.spdk:b"})),
        (
            "bdev_malloc_create",
            json!({"name": "m4", "num_blocks": 4096, "block_size": 4096}),
        ),
        (
            "bdev_raid_create",
            json!({"name": "r2", "raid_level": "raid1", "base_bdevs": ["m1", "m4"]}),
        ),
    ];
    for (method, params) in calls {
        let got = match c.call_value(method, Some(params.clone()), T).await {
            Ok(_) => "ok".to_owned(),
            Err(ClientError::Rpc(e)) => e.code.to_string(),
            Err(e) => panic!("{method}: {e}"),
        };
        let claimed = match c.bdev("m0").await {
            Ok(Some(b)) => b.claimed.to_string(),
            Ok(None) => "gone".to_owned(),
            Err(e) => panic!("m0: {e}"),
        };
        out.push(format!("{method} {params}: {got}; m0 claimed: {claimed}"));
    }
    let raids: Vec<String> = c
        .bdev_raid_get_bdevs(&GetRaids {
            category: RaidCategory::All,
        })
        .await
        .expect("raids")
        .into_iter()
        .map(|r| r.name)
        .collect();
    out.push(format!("raids: {raids:?}"));
    out
}

/// An export claims its namespace's bdev on the double as on a real
/// v26.05 target (checked there by hand first, and by the real_spdk twin
/// below: a raid over an exported bdev -1, an export of a raid member or of
/// an exported bdev -32602, an exported bdev deleted with its namespace):
/// the double once let a raid take an exported lvol, which the real target
/// refuses.
#[tokio::test]
async fn an_export_claims_its_bdev_on_the_double() {
    let (_dir, _d, c) = double().await;
    let on_double = export_claims(&c).await;
    assert!(on_double[8].contains(": -1;"), "{}", on_double[8]);
    assert!(on_double[10].contains(": -32602;"), "{}", on_double[10]);
    assert!(on_double[11].contains(": -32602;"), "{}", on_double[11]);
    assert!(on_double[12].ends_with("m0 claimed: false"), "{}", on_double[12]);
    assert!(on_double[14].ends_with("m0 claimed: gone"), "{}", on_double[14]);
    assert_eq!(
        on_double.last().map(String::as_str),
        Some(r#"raids: ["r1", "r2"]"#)
    );
}

/// The same script on spdk_tgt v26.05 gives what the double gives.
#[tokio::test]
async fn real_spdk_an_export_claims_its_bdev_as_on_the_double() {
    let Some(spdk_dir) = std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from) else {
        eprintln!("SKIP real_spdk_an_export_claims_its_bdev_as_on_the_double: TALON_SPDK_DIR is not set");
        return;
    };
    let (_ddir, _d, c) = double().await;
    let on_double = export_claims(&c).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = talon::spdk::target::TargetConfig::new(dir.path().join("run"));
    cfg.spdk_dir = Some(spdk_dir);
    cfg.memory = talon::spdk::target::Memory::NoHuge { mem_size_mib: 1024 };
    let t = talon::spdk::target::Target::spawn(&cfg)
        .await
        .expect("spawn spdk_tgt");
    let on_real = export_claims(t.client()).await;
    let _ = t.stop(cfg.stop_grace).await;
    assert_eq!(on_double, on_real, "the double and spdk_tgt differ");
}

#[tokio::test]
async fn nvmf_export_and_attach_across_two_doubles() {
    let (_d1dir, d1, c1) = double().await;
    let (_d2dir, _d2, c2) = double().await;
    c1.bdev_malloc_create(&MallocCreate {
        name: Some("M".into()),
        num_blocks: 2048,
        block_size: 4096,
        uuid: None,
    })
    .await
    .expect("malloc");
    c1.nvmf_create_transport(&CreateTransport::tcp())
        .await
        .expect("transport");
    let nqn = "nqn.2024-01.io.talon:replica-a";
    c1.nvmf_create_subsystem(&CreateSubsystem {
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
    let id = uuid::Uuid::from_u128(0x0b4c5f0e_6f2a_4d33_9c1e_3d2b5a7e9f10);
    assert_eq!(
        c1.nvmf_subsystem_add_ns(&AddNamespace::with_id(nqn, "M", id))
            .await
            .expect("ns"),
        1
    );
    let addr = ListenAddress::tcp([127, 0, 0, 9].into(), 4420);
    c1.nvmf_subsystem_add_listener(&SubsystemListener {
        nqn: nqn.into(),
        listen_address: addr.clone(),
    })
    .await
    .expect("listener");
    let e = c1
        .nvmf_subsystem_add_listener(&SubsystemListener {
            nqn: nqn.into(),
            listen_address: addr,
        })
        .await
        .expect_err("duplicate listener");
    assert!(e.is(ErrorKind::InvalidParams));
    let got = c2
        .bdev_nvme_attach_controller(&AttachController::tcp("Rep", [127, 0, 0, 9].into(), 4420, nqn))
        .await
        .expect("attach");
    assert_eq!(got, vec!["Repn1".to_string()]);
    assert_eq!(
        c2.bdev("Repn1")
            .await
            .expect("get")
            .expect("bdev")
            .uuid
            .as_deref(),
        Some(id.to_string().as_str())
    );
    let e = c2
        .bdev_nvme_attach_controller(&AttachController::tcp("X", [127, 0, 0, 9].into(), 4421, nqn))
        .await
        .expect_err("nobody listens");
    assert!(e.is(ErrorKind::Io));
    c2.bdev_nvme_detach_controller(&ByName::new("Rep"))
        .await
        .expect("detach");
    assert!(c1.subsystem(nqn).await.expect("lookup").is_some());
    c1.nvmf_delete_subsystem(&ByNqn { nqn: nqn.into() })
        .await
        .expect("delete");
    assert!(c1.subsystem(nqn).await.expect("lookup").is_none());
    assert_eq!(d1.subsystem_nqns(), Vec::<String>::new());
}

#[tokio::test]
async fn fault_injection_fails_nth_call_and_drops_connection() {
    let (_dir, d, c) = double().await;
    d.fail_nth("bdev_malloc_create", 2, -12, "Cannot allocate memory");
    let mk = |n: &str| MallocCreate {
        name: Some(n.into()),
        num_blocks: 256,
        block_size: 4096,
        uuid: None,
    };
    c.bdev_malloc_create(&mk("a")).await.expect("first");
    let e = c.bdev_malloc_create(&mk("b")).await.expect_err("second fails");
    assert_eq!(e.kind(), Some(ErrorKind::Other));
    c.bdev_malloc_create(&mk("b")).await.expect("third");

    d.inject(
        "bdev_malloc_create",
        1,
        Fault::DropConnection { after_execute: true },
    );
    let e = c.bdev_malloc_create(&mk("c")).await.expect_err("dropped");
    assert!(e.is_transport(), "{e}");
    // The call ran before the drop: the retry sees the name taken.
    let e = c.bdev_malloc_create(&mk("c")).await.expect_err("exists");
    assert!(e.is(ErrorKind::AlreadyExists));
    assert_eq!(c.connects(), 2);
    assert_eq!(d.calls("bdev_malloc_create"), 5);
}

#[tokio::test]
async fn restart_drops_memory_and_reimports_aio_lvstores() {
    let (dir, d, c) = double().await;
    let img = sparse_file(dir.path(), "disk.img", 64 << 20);
    let aio = AioCreate {
        filename: img.display().to_string(),
        name: "disk0".into(),
        block_size: Some(4096),
        readonly: false,
        fallocate: false,
    };
    c.bdev_aio_create(&aio).await.expect("aio");
    c.bdev_lvol_create_lvstore(&LvstoreCreate {
        bdev_name: "disk0".into(),
        lvs_name: "lvs".into(),
        cluster_sz: Some(1 << 20),
        clear_method: None,
        num_md_pages_per_cluster_ratio: None,
    })
    .await
    .expect("lvs");
    let id = c
        .bdev_lvol_create(&LvolCreate::thin("lvs", "v", 8))
        .await
        .expect("lvol");
    c.bdev_malloc_create(&MallocCreate {
        name: Some("m".into()),
        num_blocks: 256,
        block_size: 4096,
        uuid: None,
    })
    .await
    .expect("malloc");
    d.restart().await.expect("restart");
    // The client reconnects on its own.
    assert!(
        c.bdev_get_bdevs(&GetBdevs::default())
            .await
            .expect("list")
            .is_empty()
    );
    c.bdev_aio_create(&aio).await.expect("aio again");
    assert_eq!(c.bdev("lvs/v").await.expect("get").expect("lvol back").name, id);
    assert_eq!(
        c.bdev_lvol_get_lvstores(&LvstoreSelector::name("lvs"))
            .await
            .expect("lvs")
            .len(),
        1
    );
    assert_eq!(c.connects(), 2);
}

#[tokio::test]
async fn framing_like_spdk() {
    let (_dir, d, _c) = double().await;
    let mut s = tokio::net::UnixStream::connect(d.socket())
        .await
        .expect("connect");
    // Two requests in one write, a notification (no answer), a batch.
    s.write_all(
        br#"{"jsonrpc":"2.0","method":"spdk_get_version","id":1}{"jsonrpc":"2.0","method":"spdk_get_version"}
[{"jsonrpc":"2.0","method":"nope","id":3},{"jsonrpc":"2.0","method":"spdk_get_version"}]"#,
    )
    .await
    .expect("write");
    let mut got = Vec::new();
    while got.iter().filter(|b| **b == b'\n').count() < 2 {
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed early");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8(got).expect("utf8");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines[0]["id"], 1);
    assert_eq!(
        lines[1],
        json!([{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"Method not found"}}])
    );
    // Malformed JSON: the connection closes without an answer.
    s.write_all(br#"{"jsonrpc":"2.0",,"id":12}{"jsonrpc":"2.0","method":"spdk_get_version","id":13}"#)
        .await
        .expect("write");
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.expect("eof");
    assert!(rest.is_empty());
}

#[tokio::test]
async fn many_calls_in_flight_on_one_connection() {
    let (_dir, _d, c) = double().await;
    let calls = (0..200).map(|_| c.spdk_get_version());
    let all = futures::future::join_all(calls).await;
    assert!(all.iter().all(Result::is_ok));
    assert_eq!(c.connects(), 1);
}
