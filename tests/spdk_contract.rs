//! Contract tests: replay every call recorded from a real spdk_tgt v26.05
//! (`tests/data/spdk/transcript-v26.05.jsonl`).
//!
//! ```text
//!  transcript line ──params──> talon's typed params struct ──typed method──> SpdkClient
//!                                                                                │
//!  replay peer (Unix socket): checks the params it got == recorded params,      │
//!  answers the recorded response (its id rewritten)  <───────────────────────────┘
//!                     │
//!                     └──> typed result, or SpdkError whose kind must match the table
//! ```
//!
//! For each line: if talon has a typed method and its params struct can
//! express the recorded params, the typed method is called and the params on
//! the wire must equal the recorded ones; the recorded response, errors
//! included, must decode into the typed result or into the expected
//! [`ErrorKind`]. Deliberately invalid requests that talon's types cannot
//! express (an unknown param, a wrong type, `raid7`, the pre-v26 `name` of
//! `bdev_get_iostat`, an unknown method) are sent untyped so their recorded
//! error still goes through the client and the classifier.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use talon::spdk::rpc::*;
use talon::spdk::{ClientError, ErrorKind, SpdkClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

/// The recording: `$TALON_SPDK_FACTS`, else the repo's `tests/data/spdk`.
fn shared_dir() -> PathBuf {
    match std::env::var_os("TALON_SPDK_FACTS") {
        Some(d) => d.into(),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/spdk"),
    }
}

/// The error kind talon must give each recorded error (0-based line numbers).
fn expected_kind(line: usize) -> Option<ErrorKind> {
    use ErrorKind::*;
    Some(match line {
        5 | 9 | 15 | 21 | 25 | 40 | 45 | 59 => AlreadyExists,
        14 | 17 | 20 | 23 | 26 | 29 | 33 | 37 | 63 | 65 | 76 => NotFound,
        19 | 35 | 42 => Busy,
        6 | 31 | 46 => InvalidArgument,
        7 | 8 | 41 | 52 | 53 | 55 | 75 | 79 | 83 | 86 | 90 => InvalidParams,
        27 => NoSpace,
        49 | 50 => Internal,
        60 => Io,
        89 => MethodNotFound,
        _ => return None,
    })
}

#[derive(Default)]
struct Slot {
    /// The response to send to the next request.
    reply: Option<Value>,
    /// What the peer received: (method, params).
    got: Option<(String, Option<Value>)>,
}

async fn replay_peer(listener: UnixListener, slot: Arc<Mutex<Slot>>) {
    while let Ok((stream, _)) = listener.accept().await {
        let slot = slot.clone();
        tokio::spawn(async move {
            let (mut r, mut w) = stream.into_split();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 65536];
            loop {
                let n = match r.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                let mut out = Vec::new();
                let mut consumed = 0;
                let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
                while let Some(Ok(req)) = it.next() {
                    consumed = it.byte_offset();
                    let mut s = slot.lock().expect("slot");
                    s.got = Some((
                        req["method"].as_str().unwrap_or_default().to_owned(),
                        req.get("params").cloned(),
                    ));
                    let mut reply = s.reply.take().expect("a reply is queued for every request");
                    reply["id"] = req["id"].clone();
                    out.extend(serde_json::to_vec(&reply).expect("json"));
                    out.push(b'\n');
                }
                buf.drain(..consumed);
                if w.write_all(&out).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// Calls the typed method for `method` if talon has one and `params` fit
/// its params struct: `Some(result as JSON)`; `None` when not expressible.
async fn call_typed(
    c: &SpdkClient,
    method: &str,
    params: &Option<Value>,
) -> Option<Result<Value, ClientError>> {
    let p = params.clone().unwrap_or_else(|| json!({}));
    macro_rules! t {
        ($m:ident, $P:ty) => {{
            let typed: $P = serde_json::from_value(p).ok()?;
            Some(
                c.$m(&typed)
                    .await
                    .map(|r| serde_json::to_value(r).expect("result to json")),
            )
        }};
        ($m:ident) => {{
            if params.is_some() {
                return None;
            }
            Some(
                c.$m()
                    .await
                    .map(|r| serde_json::to_value(r).expect("result to json")),
            )
        }};
    }
    match method {
        "spdk_get_version" => t!(spdk_get_version),
        "rpc_get_methods" => t!(rpc_get_methods, GetMethods),
        "framework_wait_init" => t!(framework_wait_init),
        "bdev_get_bdevs" => t!(bdev_get_bdevs, GetBdevs),
        "bdev_aio_create" => t!(bdev_aio_create, AioCreate),
        "bdev_aio_delete" => t!(bdev_aio_delete, ByName),
        "bdev_malloc_create" => {
            if params.is_none() {
                return None;
            }
            t!(bdev_malloc_create, MallocCreate)
        }
        "bdev_malloc_delete" => t!(bdev_malloc_delete, ByName),
        "bdev_get_iostat" => t!(bdev_get_iostat, GetIostat),
        "bdev_lvol_create_lvstore" => t!(bdev_lvol_create_lvstore, LvstoreCreate),
        "bdev_lvol_get_lvstores" => t!(bdev_lvol_get_lvstores, LvstoreSelector),
        "bdev_lvol_delete_lvstore" => t!(bdev_lvol_delete_lvstore, LvstoreSelector),
        "bdev_lvol_create" => t!(bdev_lvol_create, LvolCreate),
        "bdev_lvol_snapshot" => t!(bdev_lvol_snapshot, LvolSnapshot),
        "bdev_lvol_clone" => t!(bdev_lvol_clone, LvolClone),
        "bdev_lvol_resize" => t!(bdev_lvol_resize, LvolResize),
        "bdev_lvol_delete" => t!(bdev_lvol_delete, ByName),
        "bdev_lvol_get_lvols" => t!(bdev_lvol_get_lvols, GetLvols),
        "bdev_raid_create" => t!(bdev_raid_create, RaidCreate),
        "bdev_raid_delete" => t!(bdev_raid_delete, RaidDelete),
        "bdev_raid_get_bdevs" => t!(bdev_raid_get_bdevs, GetRaids),
        "bdev_raid_add_base_bdev" => t!(bdev_raid_add_base_bdev, RaidAddBaseBdev),
        "bdev_raid_remove_base_bdev" => t!(bdev_raid_remove_base_bdev, ByName),
        "nvmf_create_transport" => t!(nvmf_create_transport, CreateTransport),
        "nvmf_get_transports" => t!(nvmf_get_transports, GetTransports),
        "nvmf_create_subsystem" => t!(nvmf_create_subsystem, CreateSubsystem),
        "nvmf_delete_subsystem" => t!(nvmf_delete_subsystem, ByNqn),
        "nvmf_get_subsystems" => t!(nvmf_get_subsystems, GetSubsystems),
        "nvmf_subsystem_add_ns" => t!(nvmf_subsystem_add_ns, AddNamespace),
        "nvmf_subsystem_remove_ns" => t!(nvmf_subsystem_remove_ns, RemoveNamespace),
        "nvmf_subsystem_add_listener" => t!(nvmf_subsystem_add_listener, SubsystemListener),
        "nvmf_subsystem_remove_listener" => t!(nvmf_subsystem_remove_listener, SubsystemListener),
        "nvmf_subsystem_add_host" => t!(nvmf_subsystem_add_host, SubsystemHostParams),
        "nvmf_subsystem_remove_host" => t!(nvmf_subsystem_remove_host, SubsystemHostParams),
        "nvmf_subsystem_get_controllers" => t!(nvmf_subsystem_get_controllers, ByNqn),
        "bdev_nvme_attach_controller" => t!(bdev_nvme_attach_controller, AttachController),
        "bdev_nvme_detach_controller" => t!(bdev_nvme_detach_controller, ByName),
        "bdev_nvme_get_controllers" => t!(bdev_nvme_get_controllers, GetControllers),
        "iscsi_create_portal_group" => t!(iscsi_create_portal_group, CreatePortalGroup),
        "iscsi_delete_portal_group" => t!(iscsi_delete_portal_group, ByTag),
        "iscsi_get_portal_groups" => t!(iscsi_get_portal_groups),
        "iscsi_create_initiator_group" => t!(iscsi_create_initiator_group, CreateInitiatorGroup),
        "iscsi_delete_initiator_group" => t!(iscsi_delete_initiator_group, ByTag),
        "iscsi_get_initiator_groups" => t!(iscsi_get_initiator_groups),
        "iscsi_create_target_node" => t!(iscsi_create_target_node, CreateTargetNode),
        "iscsi_delete_target_node" => t!(iscsi_delete_target_node, DeleteTargetNode),
        "iscsi_get_target_nodes" => t!(iscsi_get_target_nodes),
        _ => None,
    }
}

#[tokio::test]
async fn replay_recorded_transcript() {
    let dir = shared_dir();
    let text = std::fs::read_to_string(dir.join("transcript-v26.05.jsonl")).expect("recorded transcript");
    let methods: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("rpc-methods-v26.05.json")).expect("methods"))
            .expect("methods json");

    let tmp = tempfile::tempdir().expect("tempdir");
    let sock = tmp.path().join("replay.sock");
    let slot = Arc::new(Mutex::new(Slot::default()));
    tokio::spawn(replay_peer(
        UnixListener::bind(&sock).expect("bind"),
        slot.clone(),
    ));
    let client = SpdkClient::new(&sock);

    let (mut total, mut typed_req, mut ok_resp, mut err_resp, mut untyped) = (0, 0, 0, 0, 0);
    let mut failures = Vec::new();
    for (line, text) in text.lines().enumerate() {
        total += 1;
        let rec: Value = serde_json::from_str(text).expect("transcript line");
        let method = rec["method"].as_str().expect("method").to_owned();
        let params = rec["request"].get("params").cloned().filter(|p| !p.is_null());
        let mut response = rec["response"].clone();
        let summarized = rec
            .get("response_summarized")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut expect_len = None;
        if summarized {
            // Only the count was recorded: answer that many real method names.
            let n = response["result_count"].as_u64().expect("result_count") as usize;
            response =
                json!({"jsonrpc": "2.0", "id": 0, "result": methods.iter().take(n).collect::<Vec<_>>()});
            expect_len = Some(n);
        }
        slot.lock().expect("slot").reply = Some(response.clone());

        let outcome = match call_typed(&client, &method, &params).await {
            Some(out) => {
                typed_req += 1;
                let got = slot.lock().expect("slot").got.take();
                let want = (method.clone(), params.clone());
                if got.as_ref() != Some(&want) {
                    failures.push(format!("line {line} {method}: sent {got:?}, recorded {want:?}"));
                }
                out
            }
            None => {
                untyped += 1;
                let out = client
                    .call_value(&method, params.clone(), std::time::Duration::from_secs(5))
                    .await;
                slot.lock().expect("slot").got.take();
                out
            }
        };

        match (response.get("error"), outcome) {
            (None, Ok(v)) => {
                ok_resp += 1;
                if let Some(n) = expect_len
                    && v.as_array().map(Vec::len) != Some(n)
                {
                    failures.push(format!("line {line} {method}: expected {n} names"));
                }
            }
            (None, Err(e)) => failures.push(format!("line {line} {method}: result did not parse: {e:?}")),
            (Some(_), Ok(v)) => failures.push(format!("line {line} {method}: error parsed as success {v}")),
            (Some(_), Err(e)) => {
                err_resp += 1;
                let want = expected_kind(line);
                if want.is_none() || e.kind() != want {
                    failures.push(format!(
                        "line {line} {method}: kind {:?}, expected {want:?} ({e})",
                        e.kind()
                    ));
                }
            }
        }
    }
    eprintln!(
        "contract: {total} lines; {typed_req} sent through typed methods with identical params, \
         {untyped} deliberately invalid requests sent untyped; {ok_resp} results and {err_resp} errors parsed"
    );
    assert!(failures.is_empty(), "contract failures:\n{}", failures.join("\n"));
    assert_eq!(total, 91);
    assert_eq!(err_resp, 41);
    assert_eq!(ok_resp + err_resp, total);
}
