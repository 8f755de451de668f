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
            s("/spec/sizeBytes"),
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
            c.call(
                "volume_create",
                json!({"name": name, "size": size, "replicas": replicas, "engine": engine, "frontend": frontend,
                       "disks": disks, "remoteReplicas": remote, "serveReplica": serve_replica, "replicaHosts": replica_hosts, "wait": !no_wait}),
            )
            .await?
        }
        VolumeCommand::Get { name, output } => {
            let v: Value = c.call("volume_get", json!({"name": name})).await?;
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
            c.call("volume_expand", json!({"name": name, "size": size, "wait": true}))
                .await?
        }
        VolumeCommand::Clone { name, from } => {
            let (volume, snapshot) = from
                .split_once('@')
                .ok_or_else(|| format!("--from {from:?} must be VOLUME@SNAPSHOT"))?;
            c.call(
                "volume_clone",
                json!({"name": name, "volume": volume, "snapshot": snapshot, "wait": true}),
            )
            .await?
        }
        VolumeCommand::Revert { name, snapshot } => {
            c.call("volume_revert", json!({"volume": name, "name": snapshot}))
                .await?
        }
        VolumeCommand::Attach { name, frontend } => {
            c.call(
                "volume_attach",
                json!({"name": name, "frontend": frontend, "wait": true}),
            )
            .await?
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
