//! `talon volume|snapshot|disk ...`: thin clients of the volume API methods.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::CliError;
use super::output::{Format, human_bytes, print_value};
use crate::api::types::NoParams;
use crate::api::volume::{
    AttachParams, CloneParams, DiskAddParams, DiskFormatParams, DiskView, ExpandParams, NameParams,
    SnapshotListParams, SnapshotParams, SnapshotView, VolumeCreateParams, VolumeView,
};
use crate::client::Client;
use crate::resources::config::{RemoteReplica, snapshot_id};
use crate::resources::engine::{DiskStatus, EngineStatus, Export, ObjectState, SnapshotStatus, TargetStatus};
use crate::resources::frontend::AttachmentStatus;

/// A value as the API writes it, as text: a string as is, `null` as nothing,
/// anything else as JSON (`2`, an enum's wire name such as `nvme-tcp`).
fn wire<T: Serialize>(t: &T) -> String {
    match serde_json::to_value(t) {
        Ok(Value::String(s)) => s,
        Ok(Value::Null) | Err(_) => String::new(),
        Ok(v) => v.to_string(),
    }
}

/// A command-line word parsed as the API's type (`--engine v2`, `--frontend iscsi`).
fn from_word<T: DeserializeOwned>(flag: &str, word: &str) -> Result<T, CliError> {
    serde_json::from_value(Value::String(word.to_string()))
        .map_err(|e| format!("{flag} {word:?}: {e}").into())
}

/// An optional command-line word parsed as the API's type.
fn from_opt_word<T: DeserializeOwned>(flag: &str, word: Option<String>) -> Result<Option<T>, CliError> {
    word.map(|w| from_word(flag, &w)).transpose()
}

/// The params of a method that names a volume.
fn name_params(name: &str, wait: bool) -> NameParams {
    NameParams {
        name: name.to_string(),
        wait,
        timeout_seconds: None,
    }
}

/// The params of a method that names a snapshot of a volume.
fn snapshot_params(volume: &str, name: &str, wait: bool) -> SnapshotParams {
    SnapshotParams {
        volume: volume.to_string(),
        name: name.to_string(),
        wait,
        timeout_seconds: None,
    }
}

/// `talon volume`.
#[derive(Debug, clap::Subcommand)]
pub enum VolumeCommand {
    /// Create a volume.
    Create {
        /// Name: `[a-z0-9-]`, at most 63 characters.
        name: String,
        /// Size, e.g. `10GiB` (with --from-snapshot: the source volume's
        /// when not given, never smaller).
        #[arg(long, required_unless_present = "from_snapshot")]
        size: Option<String>,
        /// Replicas.
        #[arg(long, default_value_t = 1)]
        replicas: u32,
        /// Create with a copy of a snapshot's data (V2): copied thin through
        /// the data mover before the volume is served; it does not depend on
        /// the snapshot afterwards (`volume clone` makes a linked clone).
        #[arg(long, value_name = "VOLUME/SNAPSHOT", conflicts_with_all = ["remote_replicas", "serve_replica"])]
        from_snapshot: Option<String>,
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
        /// `,api=IP:PORT` names that node's talon admin API (its --listen-tcp):
        /// snapshots then include the replica at the same instant.
        #[arg(long = "remote-replica", value_name = "ADDRESS:PORT[,api=IP:PORT]")]
        remote_replicas: Vec<RemoteArg>,
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
    /// Serve a standby (DR) volume: its backup volume's newest backup is
    /// restored, its replicas made, and it is served.
    Activate {
        /// Name.
        name: String,
        /// How long to wait, seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
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

/// How an initiator reaches an export, as commands to paste. The target
/// admits only the initiators in `export.hosts` (the node's allowedHosts and
/// the host the volume is attached to): the libiscsi line logs in as the
/// first of them, and says so when there is none.
pub fn connect_help(name: &str, export: &Export) -> String {
    let (addr, port, target, lun) = (&export.address, export.port, &export.name, export.lun);
    match export.transport.as_str() {
        "iscsi" => {
            let libiscsi = match export.hosts.first() {
                Some(iqn) => format!("iscsi-inq -i {iqn} iscsi://{addr}:{port}/{target}/{lun}"),
                None => "none: the target admits only allowedHosts (node config) and the host \
                         it is attached to, and has neither now"
                    .to_string(),
            };
            format!(
                "volume {name} is served over iSCSI at {addr}:{port}\n  target: {target}  LUN {lun}\n  \
                 admits: [{}]\n  \
                 libiscsi:  {libiscsi}\n  \
                 open-iscsi: iscsiadm -m discovery -t sendtargets -p {addr}:{port} && iscsiadm -m node -T {target} -p {addr}:{port} --login\n  \
                 talon:     talon volume attach {name}   (-> /dev/talon/{name})",
                export.hosts.join(", ")
            )
        }
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
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Table)]
        output: Format,
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
        /// Overwrite what the path holds (a file system, partition table or
        /// other data; never an lvstore): its first and last MiB are zeroed.
        #[arg(long)]
        wipe: bool,
        /// Return at once instead of waiting until its lvstore is ready.
        #[arg(long)]
        no_wait: bool,
    },
    /// List disks.
    List {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Remove a disk.
    Remove {
        /// Disk name.
        name: String,
    },
    /// Format a disk talon refuses for what its device holds: a file system,
    /// other data, an lvstore that is not this disk's, or the lvstore talon
    /// made there that no longer loads. Makes a new lvstore over it; whatever
    /// it held, every replica on it included, is lost.
    Format {
        /// Disk name.
        name: String,
        /// Required: confirms that the device's data is to be destroyed.
        #[arg(long)]
        yes_destroy_data: bool,
        /// Return at once instead of waiting until the new lvstore is ready.
        #[arg(long)]
        no_wait: bool,
    },
}

/// `talon orphan`.
#[derive(Debug, clap::Subcommand)]
pub enum OrphanCommand {
    /// List lvols on this node's disks that no volume or Longhorn replica owns
    /// (as after a lost state store); they are kept until removed.
    List,
    /// Delete an orphan lvol (refused for one a volume or Longhorn replica owns).
    Remove {
        /// The lvol as `orphan list` names it: `talon-<disk>/<lvol>`.
        name: String,
    },
}

/// Runs `talon orphan ...`.
pub async fn run_orphan(c: &Client, cmd: OrphanCommand) -> Result<(), CliError> {
    let v: Value = match cmd {
        OrphanCommand::List => c.call("orphan_list", NoParams {}).await?,
        OrphanCommand::Remove { name } => {
            c.call(
                "orphan_remove",
                crate::api::volume::OrphanRemoveParams {
                    name,
                    timeout_seconds: None,
                },
            )
            .await?
        }
    };
    print_value(&v, Format::Yaml)
}

/// Calls `method` (one that waits), and while it waits says on stderr what it
/// waits for: each new state and message of `type_/id`, one line per change
/// ("volume pvc-1: creating: waiting for spdk_tgt").
async fn call_telling<P: Serialize>(
    c: &Client,
    method: &str,
    params: P,
    type_: &str,
    id: &str,
) -> Result<Value, CliError> {
    // changes only, no replay of the state before the call: a line is
    // something seen while this call runs
    let mut sub = c.watch(Some(type_), false).await.ok();
    // The state before the call is not news: a controller that writes the same state again while
    // the call runs (a retry of a stuck volume) is not told as if the call had caused it.
    let mut last = match c.get(type_, id).await {
        Ok(r) => telling_line(type_, id, &r.spec),
        Err(_) => String::new(),
    };
    let call = c.call::<_, Value>(method, params);
    tokio::pin!(call);
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
                    let (state, _) = state_and_message(type_, &ev.resource.spec);
                    let line = telling_line(type_, id, &ev.resource.spec);
                    // an end state is not waited for: the call returns (a failure with its cause)
                    if line != last && !matches!(state.as_str(), "ready" | "attached" | "failed") {
                        eprintln!("waiting: {line}");
                    }
                    last = line;
                }
                Some(_) => {}
                None => sub = None,
            },
        }
    }
}

/// The line `call_telling` prints for a status: its type, id, state and message.
fn telling_line(type_: &str, id: &str, spec: &Value) -> String {
    let (state, msg) = state_and_message(type_, spec);
    if msg.is_empty() {
        format!("{type_} {id}: {state}")
    } else {
        format!("{type_} {id}: {state}: {msg}")
    }
}

/// The state and message of an `EngineStatus` or `AttachmentStatus` as the
/// API writes them (empty when the spec is not one).
fn state_and_message(type_: &str, spec: &Value) -> (String, String) {
    let decoded = match type_ {
        "EngineStatus" => {
            serde_json::from_value::<EngineStatus>(spec.clone()).map(|s| (wire(&s.state), s.message))
        }
        "AttachmentStatus" => {
            serde_json::from_value::<AttachmentStatus>(spec.clone()).map(|s| (wire(&s.state), s.message))
        }
        "DiskStatus" => {
            serde_json::from_value::<DiskStatus>(spec.clone()).map(|s| (wire(&s.state), s.message))
        }
        "SnapshotStatus" => {
            serde_json::from_value::<SnapshotStatus>(spec.clone()).map(|s| (wire(&s.state), s.message))
        }
        _ => return Default::default(),
    };
    decoded.unwrap_or_default()
}

/// A volume's engine as asked and as resolved: `v1`, or `auto (v1)` once the
/// engine has taken an `auto` volume (`auto` until then). Every view of a
/// volume says it this way.
pub fn engine_text(v: &VolumeView) -> String {
    let asked = wire(&v.spec.engine);
    match v.engine.as_ref().map(|e| wire(&e.engine)) {
        Some(got) if !got.is_empty() && got != asked => format!("{asked} ({got})"),
        _ => asked,
    }
}

/// A volume for people (`talon get volume NAME`): desired state beside what
/// the engine, replicas and attachment report, and the last error. `v` is a
/// `volume_get` answer.
pub fn describe_volume(v: &VolumeView) -> String {
    let mut out = String::new();
    let mut line = |k: &str, val: String| {
        if !val.is_empty() {
            out.push_str(&format!("{k:<11}{val}\n"));
        }
    };
    line("Name:", v.name.clone());
    let mut want = format!(
        "{}, {} replica(s), engine {}",
        human_bytes(v.spec.size_bytes),
        v.spec.replicas,
        engine_text(v)
    );
    let frontend = wire(&v.spec.frontend);
    if !frontend.is_empty() && frontend != "auto" {
        want.push_str(&format!(", frontend {frontend}"));
    }
    line("Spec:", want);
    if wire(&v.phase) == "tearing-down" {
        line("Phase:", "tearing down".into());
    }
    match &v.engine {
        None => line("State:", "pending (no engine has taken it yet)".into()),
        Some(e) => {
            let mut st = format!("{} ({})", wire(&e.state), wire(&e.engine));
            if e.size_bytes > 0 {
                st.push_str(&format!(", serving {}", human_bytes(e.size_bytes)));
            }
            line("State:", st);
            let exports: Vec<String> = e
                .exports
                .iter()
                .map(|x| format!("{} {}:{} {}", x.transport, x.address, x.port, x.name))
                .collect();
            line("Exports:", exports.join("\n           "));
            if let Some(c) = &e.copy {
                line(
                    "Copy:",
                    format!(
                        "of snapshot {}: {}% ({} of {})",
                        c.from,
                        c.percent,
                        human_bytes(c.bytes_copied),
                        human_bytes(c.bytes_total)
                    ),
                );
            }
            if !e.message.is_empty() {
                let label = if e.state == ObjectState::Failed {
                    "Error:"
                } else {
                    "Message:"
                };
                line(label, e.message.clone());
            }
        }
    }
    match &v.attachment {
        None => line("Attached:", "no".into()),
        Some(a) => {
            // a failed attach has no path and maybe no transport: no empty "()"
            let mut text = wire(&a.state);
            if !a.path.is_empty() {
                text.push_str(&format!(" {}", a.path));
            }
            if !a.transport.is_empty() {
                text.push_str(&format!(" ({})", a.transport));
            }
            if !a.message.is_empty() {
                text.push_str(&format!(": {}", a.message));
            }
            line("Attached:", text);
        }
    }
    if !v.replicas.is_empty() {
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::NOTHING);
        t.set_header(vec!["  REPLICA", "DISK", "STATE", "SIZE", "ALLOCATED", "MESSAGE"]);
        for r in &v.replicas {
            let id = if r.alias.is_empty() { &r.bdev } else { &r.alias };
            t.add_row(vec![
                format!("  {id}"),
                r.disk.clone(),
                wire(&r.state),
                human_bytes(r.size_bytes),
                human_bytes(r.allocated_bytes),
                r.message.clone(),
            ]);
        }
        out.push_str(&format!("Replicas:\n{t}\n"));
    }
    out
}

/// One line of a volume's state for `--watch`: state, message, and each
/// replica's state (with a rebuild's progress).
pub fn volume_line(v: &VolumeView) -> String {
    let state = v.engine.as_ref().map(|e| wire(&e.state)).unwrap_or_default();
    let mut line = format!(
        "{} {}",
        v.name,
        if state.is_empty() { "pending".into() } else { state }
    );
    let msg = v.engine.as_ref().map(|e| e.message.as_str()).unwrap_or_default();
    if !msg.is_empty() {
        line.push_str(&format!(" ({msg})"));
    }
    let reps: Vec<String> = v
        .replicas
        .iter()
        .map(|r| {
            if r.state == ObjectState::Rebuilding && !r.message.is_empty() {
                format!("{} rebuilding {}", r.disk, r.message)
            } else {
                format!("{} {}", r.disk, wire(&r.state))
            }
        })
        .collect();
    if !reps.is_empty() {
        line.push_str(&format!("; replicas: {}", reps.join(", ")));
    }
    line
}

/// Volumes as a table, one row each (`volume list`, `get volume`, `get volume NAME -o table`).
pub fn volume_rows(volumes: &[VolumeView]) {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t.set_header(vec![
        "NAME", "SIZE", "REPLICAS", "ENGINE", "STATE", "EXPORT", "ATTACHED",
    ]);
    for v in volumes {
        let e = v.engine.as_ref();
        t.add_row(vec![
            v.name.clone(),
            human_bytes(v.spec.size_bytes),
            v.spec.replicas.to_string(),
            engine_text(v),
            e.map(|e| wire(&e.state)).unwrap_or_else(|| "pending".into()),
            e.and_then(|e| e.exports.first())
                .map(|x| x.name.clone())
                .unwrap_or_default(),
            v.attachment.as_ref().map(|a| a.path.clone()).unwrap_or_default(),
        ]);
    }
    println!("{t}");
}

/// Snapshots as a table, one row each (`snapshot list`).
pub fn snapshot_rows(snapshots: &[SnapshotView]) {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t.set_header(vec!["VOLUME", "SNAPSHOT", "STATE", "CREATED", "MESSAGE"]);
    for s in snapshots {
        let st = s.status.as_ref();
        t.add_row(vec![
            s.spec.volume.clone(),
            s.spec.name.clone(),
            st.map(|x| wire(&x.state)).unwrap_or_else(|| "pending".into()),
            st.map(|x| x.created.clone()).unwrap_or_default(),
            st.map(|x| x.message.clone()).unwrap_or_default(),
        ]);
    }
    println!("{t}");
}

/// Disks as a table, one row each (`disk list`).
pub fn disk_rows(disks: &[DiskView]) {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t.set_header(vec!["NAME", "DEVICE", "STATE", "SIZE", "FREE", "MESSAGE"]);
    for d in disks {
        let st = d.status.as_ref();
        let device = d
            .spec
            .path
            .clone()
            .or_else(|| d.spec.pci.clone())
            .unwrap_or_default();
        let size = |b: u64| if b == 0 { String::new() } else { human_bytes(b) };
        t.add_row(vec![
            d.name.clone(),
            device,
            st.map(|x| wire(&x.state)).unwrap_or_else(|| "pending".into()),
            st.map(|x| size(x.total_bytes)).unwrap_or_default(),
            st.map(|x| size(x.free_bytes)).unwrap_or_default(),
            st.map(|x| super::output::short(x.message.clone()))
                .unwrap_or_default(),
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
            from_snapshot,
            engine,
            frontend,
            disks,
            remote_replicas,
            serve_replica,
            replica_hosts,
            no_wait,
        } => {
            let params = VolumeCreateParams {
                name: name.clone(),
                size_bytes: None,
                size,
                replicas: Some(replicas),
                engine: from_opt_word("--engine", engine)?,
                frontend: from_opt_word("--frontend", frontend)?,
                disks,
                // a copy takes as long as its data: waited for up to an hour
                timeout_seconds: from_snapshot.as_ref().map(|_| 3600),
                from_snapshot,
                remote_replicas: remote_replicas.iter().map(RemoteArg::replica).collect(),
                serve_replica,
                replica_hosts,
                wait: !no_wait,
            };
            call_telling(c, "volume_create", params, "EngineStatus", &name).await?
        }
        VolumeCommand::Get { name, output } => {
            // the one shape `get volume NAME -o ...` prints too
            return super::get_volume(c, &name, Some(output), false).await;
        }
        VolumeCommand::List { output } => {
            let v: Vec<VolumeView> = c.call("volume_list", NoParams {}).await?;
            if output == Format::Table {
                volume_rows(&v);
                return Ok(());
            }
            return print_value(&serde_json::to_value(&v)?, output);
        }
        VolumeCommand::Delete { name } => {
            call_telling(
                c,
                "volume_delete",
                name_params(&name, true),
                "EngineStatus",
                &name,
            )
            .await?
        }
        VolumeCommand::Expand { name, size } => {
            let params = ExpandParams {
                name: name.clone(),
                size_bytes: None,
                size: Some(size),
                wait: true,
                timeout_seconds: None,
            };
            call_telling(c, "volume_expand", params, "EngineStatus", &name).await?
        }
        VolumeCommand::Activate { name, timeout } => {
            let params = crate::api::volume::NameParams {
                name: name.clone(),
                wait: true,
                timeout_seconds: Some(timeout),
            };
            call_telling(c, "volume_activate", params, "EngineStatus", &name).await?
        }
        VolumeCommand::Clone { name, from } => {
            let (volume, snapshot) = from
                .split_once('@')
                .ok_or_else(|| format!("--from {from:?} must be VOLUME@SNAPSHOT"))?;
            let params = CloneParams {
                name: name.clone(),
                volume: volume.to_string(),
                snapshot: snapshot.to_string(),
                wait: true,
                timeout_seconds: None,
            };
            call_telling(c, "volume_clone", params, "EngineStatus", &name).await?
        }
        VolumeCommand::Revert { name, snapshot } => {
            c.call("volume_revert", snapshot_params(&name, &snapshot, false))
                .await?
        }
        VolumeCommand::Attach { name, frontend } => {
            let params = AttachParams {
                name: name.clone(),
                frontend: from_opt_word("--frontend", frontend)?,
                wait: true,
                timeout_seconds: None,
            };
            call_telling(c, "volume_attach", params, "AttachmentStatus", &name).await?
        }
        VolumeCommand::Detach { name } => {
            call_telling(
                c,
                "volume_detach",
                name_params(&name, true),
                "AttachmentStatus",
                &name,
            )
            .await?
        }
        VolumeCommand::Wait { name, timeout } => {
            let mut sub = c.watch(Some("EngineStatus"), true).await?;
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(timeout);
            let mut told = String::new();
            loop {
                let v: VolumeView = c.call("volume_get", name_params(&name, false)).await?;
                let state = v.engine.as_ref().map(|e| e.state);
                let msg = v.engine.as_ref().map(|e| e.message.as_str()).unwrap_or("");
                // say what it waits for, once per change
                let line = volume_line(&v);
                if line != told
                    && !matches!(
                        state,
                        Some(ObjectState::Ready | ObjectState::Degraded | ObjectState::Failed)
                    )
                {
                    eprintln!("waiting: {line}");
                    told = line;
                }
                match state {
                    Some(ObjectState::Ready | ObjectState::Degraded) => {
                        for e in v.engine.iter().flat_map(|e| &e.exports) {
                            println!("{}", connect_help(&name, e));
                        }
                        return Ok(());
                    }
                    Some(ObjectState::Failed) => {
                        return Err(format!("volume {name} failed: {msg}").into());
                    }
                    _ => {}
                }
                tokio::select! {
                    _ = sub.next() => {}
                    _ = tokio::time::sleep_until(deadline) => {
                        let state = state.map(|s| wire(&s)).unwrap_or_else(|| "pending".into());
                        let mut why = if msg.is_empty() { String::new() } else { format!(": {msg}") };
                        // A target that failed is the usual reason; name it.
                        let targets: Vec<crate::runtime::Resource> = c.list("TargetStatus").await.unwrap_or_default();
                        for t in &targets {
                            if let Ok(ts) = serde_json::from_value::<TargetStatus>(t.spec.clone())
                                && ts.state == ObjectState::Failed
                            {
                                why.push_str(&format!("; target {} failed: {}", t.metadata.id, ts.message));
                            }
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
            let id = snapshot_id(&volume, &name);
            call_telling(
                c,
                "snapshot_create",
                snapshot_params(&volume, &name, true),
                "SnapshotStatus",
                &id,
            )
            .await?
        }
        SnapshotCommand::List { volume, output } => {
            let v: Vec<SnapshotView> = c.call("snapshot_list", SnapshotListParams { volume }).await?;
            if output == Format::Table {
                snapshot_rows(&v);
                return Ok(());
            }
            return print_value(&serde_json::to_value(&v)?, output);
        }
        SnapshotCommand::Delete { volume, name } => {
            let id = snapshot_id(&volume, &name);
            call_telling(
                c,
                "snapshot_delete",
                snapshot_params(&volume, &name, true),
                "SnapshotStatus",
                &id,
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
            wipe,
            no_wait,
        } => {
            let params = DiskAddParams {
                name: name.clone(),
                path,
                pci,
                size_bytes: None,
                size,
                cluster_mib: None,
                wipe,
                wait: !no_wait,
                timeout_seconds: None,
            };
            call_telling(c, "disk_add", params, "DiskStatus", &name).await?
        }
        DiskCommand::List { output } => {
            let v: Vec<DiskView> = c.call("disk_list", NoParams {}).await?;
            if output == Format::Table {
                disk_rows(&v);
                return Ok(());
            }
            return print_value(&serde_json::to_value(&v)?, output);
        }
        DiskCommand::Remove { name } => c.call("disk_remove", name_params(&name, false)).await?,
        DiskCommand::Format {
            name,
            yes_destroy_data,
            no_wait,
        } => {
            let params = DiskFormatParams {
                name: name.clone(),
                yes_destroy_data,
                wait: !no_wait,
                timeout_seconds: None,
            };
            call_telling(c, "disk_format", params, "DiskStatus", &name).await?
        }
    };
    print_value(&v, Format::Yaml)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A `volume_get` answer for a 2-replica V2 volume whose second replica
    /// is being rebuilt.
    fn rebuilding() -> VolumeView {
        serde_json::from_value(json!({
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
        }))
        .expect("a volume_get answer")
    }

    #[test]
    fn describe_shows_status_beside_spec_with_rebuild_progress() {
        let out = describe_volume(&rebuilding());
        for want in [
            "Name:      pvc-1",
            "Spec:      10 GiB, 2 replica(s), engine auto (v2)",
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
        let e = failed.engine.as_mut().expect("engine");
        e.state = ObjectState::Failed;
        e.message = "no up-to-date replica is present".into();
        assert!(
            describe_volume(&failed).contains("Error:     no up-to-date replica is present"),
            "the last error is shown as such"
        );
        let pending: VolumeView = serde_json::from_value(
            json!({"name": "p", "spec": {"sizeBytes": 1u64 << 20, "replicas": 1},
            "phase": "running", "engine": null, "replicas": [], "attachment": null}),
        )
        .expect("a pending volume");
        assert!(describe_volume(&pending).contains("State:     pending"));
        assert!(
            describe_volume(&pending).contains("engine auto\n"),
            "not resolved yet"
        );
    }

    #[test]
    fn a_failed_attach_says_why_without_empty_parentheses() {
        let mut v = rebuilding();
        v.attachment = Some(
            serde_json::from_value(json!({
                "transport": "", "device": "", "path": "", "controller": "", "state": "failed",
                "message": "no usable frontend for volume pvc-1: its engine exports [iscsi]; looked for ..."
            }))
            .expect("an attachment status"),
        );
        let out = describe_volume(&v);
        assert!(
            out.contains("Attached:  failed: no usable frontend for volume pvc-1"),
            "{out}"
        );
        assert!(!out.contains("()"), "{out}");
    }

    #[test]
    fn the_engine_is_shown_as_asked_and_as_resolved() {
        let mut v = rebuilding();
        assert_eq!(engine_text(&v), "auto (v2)");
        v.spec.engine = crate::resources::config::EngineKind::V2;
        assert_eq!(engine_text(&v), "v2");
        v.engine = None;
        assert_eq!(engine_text(&v), "v2");
    }

    #[test]
    fn the_iscsi_hint_logs_in_as_an_admitted_initiator() {
        let mut e = Export {
            transport: "iscsi".into(),
            address: "127.0.0.1".into(),
            port: 3262,
            name: "iqn.2025-01.io.talon:demo".into(),
            lun: 1,
            hosts: vec!["iqn.2025-01.io.talon.quickstart:client".into()],
        };
        let out = connect_help("demo", &e);
        assert!(
            out.contains(
                "libiscsi:  iscsi-inq -i iqn.2025-01.io.talon.quickstart:client \
                 iscsi://127.0.0.1:3262/iqn.2025-01.io.talon:demo/1"
            ),
            "{out}"
        );
        e.hosts.clear();
        let out = connect_help("demo", &e);
        assert!(
            out.contains("libiscsi:  none: the target admits only allowedHosts"),
            "{out}"
        );
    }

    #[test]
    fn watch_lines_carry_a_rebuilds_progress() {
        assert_eq!(
            volume_line(&rebuilding()),
            "pvc-1 degraded (replica pvc-1-r1 is rebuilding); replicas: d0 ready, d1 rebuilding 42% rebuilt"
        );
    }

    #[test]
    fn a_snapshot_wait_says_what_it_waits_for() {
        let spec = json!({
            "volume": "pvc-1", "engine": "v2", "state": "creating", "objects": [], "created": "",
            "message": "waiting for remote replica pvc-1-r1 (10.0.0.2:9000)"
        });
        assert_eq!(
            state_and_message("SnapshotStatus", &spec),
            (
                "creating".to_string(),
                "waiting for remote replica pvc-1-r1 (10.0.0.2:9000)".to_string()
            )
        );
        assert_eq!(state_and_message("Disk", &spec), Default::default());
    }
}

/// `--remote-replica ADDRESS:PORT[,api=IP:PORT]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteArg {
    /// The replica's NVMe/TCP listener.
    pub nvmf: std::net::SocketAddr,
    /// The node's talon admin API on TCP.
    pub api: Option<std::net::SocketAddr>,
}

impl RemoteArg {
    /// The `RemoteReplica` it names.
    pub fn replica(&self) -> RemoteReplica {
        RemoteReplica {
            address: self.nvmf.ip().to_string(),
            port: self.nvmf.port(),
            api: self.api.map(|x| x.to_string()),
        }
    }
}

impl std::str::FromStr for RemoteArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (nvmf, rest) = match s.split_once(',') {
            Some((a, r)) => (a, Some(r)),
            None => (s, None),
        };
        let nvmf = nvmf
            .parse()
            .map_err(|_| format!("{nvmf:?} is not ADDRESS:PORT (an IP address and the NVMe/TCP port)"))?;
        let api = match rest {
            None => None,
            Some(r) => {
                let a = r
                    .strip_prefix("api=")
                    .ok_or_else(|| format!("{r:?}: only api=IP:PORT may follow the address"))?;
                Some(
                    a.parse()
                        .map_err(|_| format!("api={a:?} is not IP:PORT (the node's talon --listen-tcp)"))?,
                )
            }
        };
        Ok(Self { nvmf, api })
    }
}

#[cfg(test)]
mod remote_arg_tests {
    use super::RemoteArg;

    #[test]
    fn a_remote_replica_names_its_listener_and_may_name_its_api() {
        let a: RemoteArg = "10.0.0.2:4420".parse().expect("plain");
        assert_eq!((a.nvmf.to_string(), a.api), ("10.0.0.2:4420".into(), None));
        let a: RemoteArg = "10.0.0.2:4420,api=10.0.0.2:7000".parse().expect("with api");
        assert_eq!(a.api.map(|x| x.to_string()).as_deref(), Some("10.0.0.2:7000"));
        for bad in [
            "node-b:4420",
            "10.0.0.2:4420,10.0.0.2:7000",
            "10.0.0.2:4420,api=b:7",
        ] {
            assert!(bad.parse::<RemoteArg>().is_err(), "{bad}");
        }
    }
}
