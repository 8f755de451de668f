//! `talon volume|snapshot|disk ...`: thin clients of the volume API methods.

use serde_json::{Value, json};

use super::CliError;
use super::output::{Format, print_value};
use crate::client::Client;

/// `talon volume`.
#[derive(Debug, clap::Subcommand)]
pub enum VolumeCommand {
    /// Create a volume.
    Create {
        /// Name: `[a-z0-9-]`, at most 63 characters.
        name: String,
        /// Size, e.g. `10GiB`.
        #[arg(long)]
        size: String,
        /// Replicas.
        #[arg(long, default_value_t = 1)]
        replicas: u32,
        /// Engine: auto, v2, v1.
        #[arg(long)]
        engine: Option<String>,
        /// Frontend: auto, nvme-tcp, iscsi.
        #[arg(long)]
        frontend: Option<String>,
        /// Disks to place replicas on.
        #[arg(long = "disk")]
        disks: Vec<String>,
        /// A replica kept by another talon node, `ADDRESS:PORT` of its NVMe/TCP
        /// listener (V2; repeat for more); that node runs `--serve-replica K`.
        #[arg(long = "remote-replica", value_name = "ADDRESS:PORT")]
        remote_replicas: Vec<std::net::SocketAddr>,
        /// Only keep replica K here, for an engine on another node (V2).
        #[arg(long, value_name = "K", conflicts_with = "remote_replicas")]
        serve_replica: Option<u32>,
        /// With --serve-replica: the host NQN of the engine's node (its
        /// `talon node info`), the only host allowed to attach the replica.
        #[arg(long = "replica-host", value_name = "NQN", requires = "serve_replica")]
        replica_hosts: Vec<String>,
        /// Return at once instead of waiting until it is exported.
        #[arg(long)]
        no_wait: bool,
    },
    /// Show a volume.
    Get {
        /// Name.
        name: String,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
        output: Format,
    },
    /// List volumes.
    List {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Delete a volume.
    Delete {
        /// Name.
        name: String,
    },
    /// Grow a volume.
    Expand {
        /// Name.
        name: String,
        /// New size, e.g. `20GiB`.
        #[arg(long)]
        size: String,
    },
    /// Create a volume from a snapshot.
    Clone {
        /// New volume.
        name: String,
        /// Source `VOLUME@SNAPSHOT`.
        #[arg(long)]
        from: String,
    },
    /// Revert a detached volume to a snapshot.
    Revert {
        /// Volume.
        name: String,
        /// Snapshot name.
        #[arg(long)]
        snapshot: String,
    },
    /// Attach a volume on this host: `/dev/talon/<name>`.
    Attach {
        /// Name.
        name: String,
        /// Frontend override: nvme-tcp or iscsi.
        #[arg(long)]
        frontend: Option<String>,
    },
    /// Detach a volume from this host.
    Detach {
        /// Name.
        name: String,
    },
    /// Wait until a volume is exported, then print how an initiator reaches it.
    Wait {
        /// Name.
        name: String,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
}

/// How an initiator reaches an export, as commands to paste.
pub fn connect_help(name: &str, export: &Value) -> String {
    let s = |k: &str| {
        export
            .get(k)
            .map(|x| x.as_str().map(String::from).unwrap_or_else(|| x.to_string()))
            .unwrap_or_default()
    };
    let (transport, addr, port, target) = (s("transport"), s("address"), s("port"), s("name"));
    let lun = export.get("lun").and_then(Value::as_u64).unwrap_or(1);
    match transport.as_str() {
        "iscsi" => format!(
            "volume {name} is served over iSCSI at {addr}:{port}\n  target: {target}  LUN {lun}\n  \
             libiscsi:  iscsi-inq iscsi://{addr}:{port}/{target}/{lun}\n  \
             open-iscsi: iscsiadm -m discovery -t sendtargets -p {addr}:{port} && iscsiadm -m node -T {target} -p {addr}:{port} --login\n  \
             talon:     talon volume attach {name}   (-> /dev/talon/{name})"
        ),
        _ => format!(
            "volume {name} is served over NVMe/TCP at {addr}:{port}\n  subsystem: {target}\n  \
             nvme-cli: nvme connect -t tcp -a {addr} -s {port} -n {target}\n  \
             talon:    talon volume attach {name}   (-> /dev/talon/{name})"
        ),
    }
}

/// `talon snapshot`.
#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// Snapshot a volume.
    Create {
        /// Volume.
        volume: String,
        /// Snapshot name.
        name: String,
    },
    /// List snapshots.
    List {
        /// Only of this volume.
        volume: Option<String>,
    },
    /// Delete a snapshot.
    Delete {
        /// Volume.
        volume: String,
        /// Snapshot name.
        name: String,
    },
}

/// `talon disk`.
#[derive(Debug, clap::Subcommand)]
pub enum DiskCommand {
    /// Add a disk: a file/block device (`--path`) or an NVMe device (`--pci BDF|SERIAL`).
    Add {
        /// Disk name.
        name: String,
        /// File or block device.
        #[arg(long)]
        path: Option<String>,
        /// NVMe PCI device by BDF or serial.
        #[arg(long)]
        pci: Option<String>,
        /// Size of a file disk, e.g. `20GiB`.
        #[arg(long)]
        size: Option<String>,
    },
    /// List disks.
    List,
    /// Remove a disk.
    Remove {
        /// Disk name.
        name: String,
    },
}

/// Calls `method` (one that waits), and while it waits says on stderr what it
/// waits for: each new state and message of `type_/id`, one line per change
/// ("volume pvc-1: creating: waiting for spdk_tgt").
async fn call_telling(
    c: &Client,
    method: &str,
    params: Value,
    type_: &str,
    id: &str,
) -> Result<Value, CliError> {
    let mut sub = c.watch(Some(type_), true).await.ok();
    let call = c.call::<_, Value>(method, params);
    tokio::pin!(call);
    let mut last = String::new();
    loop {
        let next = async {
            match sub.as_mut() {
                Some(s) => s.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = &mut call => return Ok(r?),
            ev = next => match ev {
                Some(Ok(ev)) if ev.resource.metadata.id == id => {
                    let spec = &ev.resource.spec;
                    let state = spec["state"].as_str().unwrap_or("");
                    let msg = spec["message"].as_str().unwrap_or("");
                    let line = if msg.is_empty() {
                        format!("{type_} {id}: {state}")
                    } else {
                        format!("{type_} {id}: {state}: {msg}")
                    };
                    if line != last && !matches!(state, "ready" | "attached") {
                        eprintln!("waiting: {line}");
                        last = line;
                    }
                }
                Some(_) => {}
                None => sub = None,
            },
        }
    }
}

/// A volume for people (`talon get volume NAME`, `talon volume get NAME -o
/// table`): desired state beside what the engine, replicas and attachment
/// report, and the last error. `v` is a `volume_get` answer.
pub fn describe_volume(v: &Value) -> String {
    let s = |p: &str| match v.pointer(p) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(x)) => x.clone(),
        Some(x) => x.to_string(),
    };
    let size = |p: &str| {
        v.pointer(p)
            .and_then(Value::as_u64)
            .map(crate::cli::output::human_bytes)
            .unwrap_or_default()
    };
    let mut out = String::new();
    let mut line = |k: &str, val: String| {
        if !val.is_empty() {
            out.push_str(&format!("{k:<11}{val}\n"));
        }
    };
    line("Name:", s("/name"));
    let mut want = format!("{}, {} replica(s)", size("/spec/sizeBytes"), s("/spec/replicas"));
    for (label, p) in [("engine", "/spec/engine"), ("frontend", "/spec/frontend")] {
        let x = s(p);
        if !x.is_empty() && x != "auto" {
            want.push_str(&format!(", {label} {x}"));
        }
    }
    line("Spec:", want);
    if s("/phase") == "tearing-down" {
        line("Phase:", "tearing down".into());
    }
    match v.pointer("/engine").filter(|e| !e.is_null()) {
        None => line("State:", "pending (no engine has taken it yet)".into()),
        Some(_) => {
            let mut st = format!("{} ({})", s("/engine/state"), s("/engine/engine"));
            if v.pointer("/engine/sizeBytes")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                > 0
            {
                st.push_str(&format!(", serving {}", size("/engine/sizeBytes")));
            }
            line("State:", st);
            let exports: Vec<String> = v
                .pointer("/engine/exports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|e| {
                    let g = |k: &str| {
                        e.get(k)
                            .map(|x| x.as_str().map(String::from).unwrap_or_else(|| x.to_string()))
                            .unwrap_or_default()
                    };
                    format!("{} {}:{} {}", g("transport"), g("address"), g("port"), g("name"))
                })
                .collect();
            line("Exports:", exports.join("\n           "));
            let msg = s("/engine/message");
            let st = s("/engine/state");
            if !msg.is_empty() {
                line(if st == "failed" { "Error:" } else { "Message:" }, msg);
            }
        }
    }
    match v.pointer("/attachment").filter(|a| !a.is_null()) {
        None => line("Attached:", "no".into()),
        Some(_) => {
            let mut a = format!(
                "{} {} ({})",
                s("/attachment/state"),
                s("/attachment/path"),
                s("/attachment/transport")
            );
            let m = s("/attachment/message");
            if !m.is_empty() {
                a.push_str(&format!(": {m}"));
            }
            line("Attached:", a);
        }
    }
    let replicas = v
        .pointer("/replicas")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !replicas.is_empty() {
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::NOTHING);
        t.set_header(vec!["  REPLICA", "DISK", "STATE", "SIZE", "ALLOCATED", "MESSAGE"]);
        for r in &replicas {
            let g = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
            let b = |k: &str| {
                r.get(k)
                    .and_then(Value::as_u64)
                    .map(crate::cli::output::human_bytes)
                    .unwrap_or_default()
            };
            let id = if g("alias").is_empty() {
                g("bdev")
            } else {
                g("alias")
            };
            t.add_row(vec![
                format!("  {id}"),
                g("disk"),
                g("state"),
                b("sizeBytes"),
                b("allocatedBytes"),
                g("message"),
            ]);
        }
        out.push_str(&format!("Replicas:\n{t}\n"));
    }
    out
}

/// One line of a volume's state for `--watch`: state, message, and each
/// replica's state (with a rebuild's progress).
pub fn volume_line(v: &Value) -> String {
    let g = |p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let mut line = format!(
        "{} {}",
        g("/name"),
        if g("/engine/state").is_empty() {
            "pending".into()
        } else {
            g("/engine/state")
        }
    );
    let msg = g("/engine/message");
    if !msg.is_empty() {
        line.push_str(&format!(" ({msg})"));
    }
    let reps: Vec<String> = v
        .pointer("/replicas")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            let f = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default();
            let m = f("message");
            if f("state") == "rebuilding" && !m.is_empty() {
                format!("{} rebuilding {m}", f("disk"))
            } else {
                format!("{} {}", f("disk"), f("state"))
            }
        })
        .collect();
    if !reps.is_empty() {
        line.push_str(&format!("; replicas: {}", reps.join(", ")));
    }
    line
}

fn volume_rows(v: &Value) {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t.set_header(vec![
        "NAME", "SIZE", "REPLICAS", "ENGINE", "STATE", "EXPORT", "ATTACHED",
    ]);
    for v in v.as_array().into_iter().flatten() {
        let s = |p: &str| {
            v.pointer(p)
                .map(|x| x.as_str().map(String::from).unwrap_or_else(|| x.to_string()))
                .unwrap_or_default()
        };
        t.add_row(vec![
            s("/name"),
            v.pointer("/spec/sizeBytes")
                .and_then(Value::as_u64)
                .map(crate::cli::output::human_bytes)
                .unwrap_or_default(),
            s("/spec/replicas"),
            v.pointer("/engine/engine")
                .map(|_| s("/engine/engine"))
                .unwrap_or_else(|| s("/spec/engine")),
            v.pointer("/engine/state")
                .map(|_| s("/engine/state"))
                .unwrap_or_else(|| "pending".into()),
            s("/engine/exports/0/name"),
            s("/attachment/path"),
        ]);
    }
    println!("{t}");
}

/// Runs `talon volume ...`.
pub async fn run_volume(c: &Client, cmd: VolumeCommand) -> Result<(), CliError> {
    let v: Value = match cmd {
        VolumeCommand::Create {
            name,
            size,
            replicas,
            engine,
            frontend,
            disks,
            remote_replicas,
            serve_replica,
            replica_hosts,
            no_wait,
        } => {
            let remote: Vec<Value> = remote_replicas
                .iter()
                .map(|a| json!({"address": a.ip().to_string(), "port": a.port()}))
                .collect();
            let params = json!({"name": name, "size": size, "replicas": replicas, "engine": engine,
                                "frontend": frontend, "disks": disks, "remoteReplicas": remote,
                                "serveReplica": serve_replica, "replicaHosts": replica_hosts,
                                "wait": !no_wait});
            call_telling(c, "volume_create", params, "EngineStatus", &name).await?
        }
        VolumeCommand::Get { name, output } => {
            let v: Value = c.call("volume_get", json!({"name": name})).await?;
            if output == Format::Table {
                print!("{}", describe_volume(&v));
                return Ok(());
            }
            return print_value(&v, output);
        }
        VolumeCommand::List { output } => {
            let v: Value = c.call("volume_list", json!({})).await?;
            if output == Format::Table {
                volume_rows(&v);
                return Ok(());
            }
            return print_value(&v, output);
        }
        VolumeCommand::Delete { name } => {
            c.call("volume_delete", json!({"name": name, "wait": true}))
                .await?
        }
        VolumeCommand::Expand { name, size } => {
            let params = json!({"name": name, "size": size, "wait": true});
            call_telling(c, "volume_expand", params, "EngineStatus", &name).await?
        }
        VolumeCommand::Clone { name, from } => {
            let (volume, snapshot) = from
                .split_once('@')
                .ok_or_else(|| format!("--from {from:?} must be VOLUME@SNAPSHOT"))?;
            let params = json!({"name": name, "volume": volume, "snapshot": snapshot, "wait": true});
            call_telling(c, "volume_clone", params, "EngineStatus", &name).await?
        }
        VolumeCommand::Revert { name, snapshot } => {
            c.call("volume_revert", json!({"volume": name, "name": snapshot}))
                .await?
        }
        VolumeCommand::Attach { name, frontend } => {
            let params = json!({"name": name, "frontend": frontend, "wait": true});
            call_telling(c, "volume_attach", params, "AttachmentStatus", &name).await?
        }
        VolumeCommand::Detach { name } => {
            c.call("volume_detach", json!({"name": name, "wait": true}))
                .await?
        }
        VolumeCommand::Wait { name, timeout } => {
            let mut sub = c.watch(Some("EngineStatus"), true).await?;
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(timeout);
            loop {
                let v: Value = c.call("volume_get", json!({"name": name})).await?;
                let state = v
                    .pointer("/engine/state")
                    .and_then(Value::as_str)
                    .unwrap_or("pending");
                match state {
                    "ready" | "degraded" => {
                        for e in v
                            .pointer("/engine/exports")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                        {
                            println!("{}", connect_help(&name, e));
                        }
                        return Ok(());
                    }
                    "failed" => {
                        let msg = v.pointer("/engine/message").and_then(Value::as_str).unwrap_or("");
                        return Err(format!("volume {name} failed: {msg}").into());
                    }
                    _ => {}
                }
                tokio::select! {
                    _ = sub.next() => {}
                    _ = tokio::time::sleep_until(deadline) => {
                        let msg = v.pointer("/engine/message").and_then(Value::as_str).unwrap_or("");
                        let mut why = if msg.is_empty() { String::new() } else { format!(": {msg}") };
                        // A target that failed is the usual reason; name it.
                        let targets: Vec<crate::runtime::Resource> = c.list("TargetStatus").await.unwrap_or_default();
                        for t in targets.iter().filter(|t| t.spec["state"] == "failed") {
                            why.push_str(&format!("; target {} failed: {}", t.metadata.id, t.spec["message"].as_str().unwrap_or("")));
                        }
                        return Err(format!("volume {name} is not exported after {timeout} s (state {state}){why}; see `talon get enginestatus {name}` and `talon get controllers`").into());
                    }
                }
            }
        }
    };
    print_value(&v, Format::Yaml)
}

/// Runs `talon snapshot ...`.
pub async fn run_snapshot(c: &Client, cmd: SnapshotCommand) -> Result<(), CliError> {
    let v: Value = match cmd {
        SnapshotCommand::Create { volume, name } => {
            c.call(
                "snapshot_create",
                json!({"volume": volume, "name": name, "wait": true}),
            )
            .await?
        }
        SnapshotCommand::List { volume } => c.call("snapshot_list", json!({"volume": volume})).await?,
        SnapshotCommand::Delete { volume, name } => {
            c.call(
                "snapshot_delete",
                json!({"volume": volume, "name": name, "wait": true}),
            )
            .await?
        }
    };
    print_value(&v, Format::Yaml)
}

/// Runs `talon disk ...`.
pub async fn run_disk(c: &Client, cmd: DiskCommand) -> Result<(), CliError> {
    let v: Value = match cmd {
        DiskCommand::Add {
            name,
            path,
            pci,
            size,
        } => {
            c.call(
                "disk_add",
                json!({"name": name, "path": path, "pci": pci, "size": size}),
            )
            .await?
        }
        DiskCommand::List => c.call("disk_list", json!({})).await?,
        DiskCommand::Remove { name } => c.call("disk_remove", json!({"name": name})).await?,
    };
    print_value(&v, Format::Yaml)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `volume_get` answer for a 2-replica V2 volume whose second replica
    /// is being rebuilt.
    fn rebuilding() -> Value {
        json!({
            "name": "pvc-1",
            "spec": {"sizeBytes": 10u64 << 30, "replicas": 2, "engine": "auto", "frontend": "auto"},
            "phase": "running",
            "engine": {
                "engine": "v2", "state": "degraded", "sizeBytes": 10u64 << 30, "device": "talon-raid-pvc-1",
                "replicas": ["pvc-1-r0", "pvc-1-r1"],
                "exports": [{"transport": "nvme-tcp", "address": "10.0.0.1", "port": 4420,
                             "name": "nqn.2025-01.io.talon:vol:pvc-1", "lun": 1}],
                "message": "replica pvc-1-r1 is rebuilding"
            },
            "replicas": [
                {"volume": "pvc-1", "disk": "d0", "bdev": "u0", "alias": "talon-d0/pvc-1-r0",
                 "sizeBytes": 10u64 << 30, "allocatedBytes": 3u64 << 29, "state": "ready", "message": ""},
                {"volume": "pvc-1", "disk": "d1", "bdev": "u1", "alias": "talon-d1/pvc-1-r1",
                 "sizeBytes": 10u64 << 30, "allocatedBytes": 1u64 << 30, "state": "rebuilding",
                 "message": "42% rebuilt"}
            ],
            "attachment": null
        })
    }

    #[test]
    fn describe_shows_status_beside_spec_with_rebuild_progress() {
        let out = describe_volume(&rebuilding());
        for want in [
            "Name:      pvc-1",
            "Spec:      10 GiB, 2 replica(s)",
            "State:     degraded (v2), serving 10 GiB",
            "Exports:   nvme-tcp 10.0.0.1:4420 nqn.2025-01.io.talon:vol:pvc-1",
            "Message:   replica pvc-1-r1 is rebuilding",
            "Attached:  no",
            "talon-d1/pvc-1-r1",
            "42% rebuilt",
            "1.5 GiB",
        ] {
            assert!(out.contains(want), "{want:?} in:\n{out}");
        }
        let mut failed = rebuilding();
        failed["engine"]["state"] = json!("failed");
        failed["engine"]["message"] = json!("no up-to-date replica is present");
        assert!(
            describe_volume(&failed).contains("Error:     no up-to-date replica is present"),
            "the last error is shown as such"
        );
        let pending = json!({"name": "p", "spec": {"sizeBytes": 1u64 << 20, "replicas": 1}, "engine": null});
        assert!(describe_volume(&pending).contains("State:     pending"));
    }

    #[test]
    fn watch_lines_carry_a_rebuilds_progress() {
        assert_eq!(
            volume_line(&rebuilding()),
            "pvc-1 degraded (replica pvc-1-r1 is rebuilding); replicas: d0 ready, d1 rebuilding 42% rebuilt"
        );
    }
}
