//! `talon backup ...`: thin clients of the backup API methods.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::CliError;
use super::output::{Format, human_bytes, print_value};
use crate::api::backup::{BackupCreateParams, BackupView, StoreVolumeView};
use crate::client::Client;
use crate::resources::backup::BackupState;

/// `talon backup`.
#[derive(Debug, clap::Subcommand)]
pub enum BackupCommand {
    /// Back a volume's snapshot up to a backup target (Longhorn's format);
    /// waits until it completed.
    Create {
        /// What to back up: `VOLUME@SNAPSHOT`.
        source: String,
        /// The backup target: `s3://BUCKET@REGION/PATH` or `vfs:///DIR`.
        #[arg(long)]
        target: String,
        /// The target's credentials: the name of a Kubernetes secret given to
        /// this node, in its backupSecretsDir (default /etc/talon/backup-secrets):
        /// a mounted secret (one file per key) or a Secret manifest
        /// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINTS, ...).
        #[arg(long, value_name = "NAME")]
        secret: Option<String>,
        /// The backup's name (default: `backup-` and 16 hex characters).
        #[arg(long)]
        name: Option<String>,
        /// The backup volume's name in the store (default: the volume's name).
        #[arg(long)]
        backup_volume: Option<String>,
        /// Upload every block, not only those the store lacks.
        #[arg(long)]
        full: bool,
        /// A label recorded with the backup (repeat for more).
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// The backup's block size in MiB: 2 (the default) or 16, as
        /// Longhorn's `backup-block-size`.
        #[arg(long, value_name = "MIB", value_parser = clap::builder::PossibleValuesParser::new(["2", "16"]))]
        block_size_mib: Option<String>,
        /// Blocks compressed and uploaded at once (1 to 64; default 4).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
        concurrency: Option<u32>,
        /// Return at once instead of waiting until it completed.
        #[arg(long)]
        no_wait: bool,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
        output: Format,
    },
    /// List talon's backups with their state.
    List {
        /// Only backups of this volume.
        #[arg(long)]
        volume: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Show a backup.
    Get {
        /// The backup's name.
        name: String,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
        output: Format,
    },
    /// Delete a backup (a running one stops).
    Delete {
        /// The backup's name.
        name: String,
        /// Also delete it from its backup target (and the blocks only it maps).
        #[arg(long)]
        from_store: bool,
    },
    /// Create a V2 volume with the data of a backup (talon's or Longhorn's);
    /// waits until it is restored and served.
    Restore {
        /// The backup's name.
        backup: String,
        /// Its backup volume in the store.
        #[arg(long)]
        backup_volume: String,
        /// The new volume's name.
        #[arg(long)]
        volume: String,
        /// The backup target: `s3://BUCKET@REGION/PATH` or `vfs:///DIR`.
        #[arg(long)]
        target: String,
        /// The target's credentials: the name of a secret in the node's backupSecretsDir.
        #[arg(long, value_name = "NAME")]
        secret: Option<String>,
        /// The volume's size (default: the backed-up volume's).
        #[arg(long)]
        size: Option<String>,
        /// Replicas (default 1).
        #[arg(long)]
        replicas: Option<u32>,
        /// A replica kept by another talon node (repeatable), as `talon
        /// volume create --remote-replica`: rebuilt from the restored ones.
        #[arg(long = "remote-replica", value_name = "ADDRESS:PORT[,api=IP:PORT]")]
        remote_replicas: Vec<super::volume::RemoteArg>,
        /// A standby (DR) volume: not served; it follows the backup volume's
        /// newest backup until `talon volume activate`.
        #[arg(long)]
        standby: bool,
        /// A standby volume's check for a newer backup, every this many
        /// seconds (default 60).
        #[arg(long, value_name = "SECONDS", requires = "standby")]
        poll: Option<u32>,
        /// How long to wait, seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
        output: Format,
    },
    /// What a backup target holds: backup volumes and their complete backups
    /// (talon's and Longhorn's).
    StoreList {
        /// The backup target: `s3://BUCKET@REGION/PATH` or `vfs:///DIR`.
        #[arg(long)]
        target: String,
        /// The target's credentials: the name of a secret in the node's backupSecretsDir.
        #[arg(long, value_name = "NAME")]
        secret: Option<String>,
        /// Only this backup volume.
        #[arg(long)]
        volume: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
}

/// `--label KEY=VALUE`.
fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// A value as the API writes it (an enum's wire name), as text.
fn wire<T: Serialize>(t: &T) -> String {
    match serde_json::to_value(t) {
        Ok(Value::String(s)) => s,
        Ok(Value::Null) | Err(_) => String::new(),
        Ok(v) => v.to_string(),
    }
}

fn table() -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t
}

/// The state of a backup for people: `pending` until the controller saw it.
fn state_text(b: &BackupView) -> String {
    b.status
        .as_ref()
        .map(|s| wire(&s.state))
        .unwrap_or_else(|| "pending".into())
}

/// Backups as a table (`backup list`, `backup get -o table`).
pub fn backup_rows(backups: &[BackupView]) -> String {
    let mut t = table();
    t.set_header(vec![
        "NAME", "VOLUME", "SNAPSHOT", "STATE", "PROGRESS", "UPLOADED", "URL",
    ]);
    for b in backups {
        let s = b.status.as_ref();
        t.add_row(vec![
            b.name.clone(),
            b.spec.volume.clone(),
            b.spec.snapshot.clone(),
            state_text(b),
            format!("{}%", s.map_or(0, |s| s.progress)),
            s.map(|s| human_bytes(s.bytes_uploaded)).unwrap_or_default(),
            s.map(|s| s.url.clone()).unwrap_or_default(),
        ]);
    }
    t.to_string()
}

/// What a target holds as two tables: its backup volumes, then their backups.
pub fn store_rows(volumes: &[StoreVolumeView]) -> String {
    let mut vt = table();
    vt.set_header(vec![
        "BACKUP VOLUME",
        "SIZE",
        "ENGINE",
        "COMPRESSION",
        "BACKUPS",
        "LAST BACKUP",
        "MESSAGE",
    ]);
    let mut bt = table();
    bt.set_header(vec![
        "BACKUP VOLUME",
        "BACKUP",
        "SNAPSHOT",
        "SNAPSHOT CREATED",
        "CREATED",
        "SIZE",
        "INCREMENTAL",
        "URL",
    ]);
    for v in volumes {
        vt.add_row(vec![
            v.name.clone(),
            human_bytes(v.size),
            v.data_engine.clone(),
            v.compression.clone(),
            v.backups.len().to_string(),
            v.last_backup_name.clone(),
            v.message.clone(),
        ]);
        for b in &v.backups {
            bt.add_row(vec![
                v.name.clone(),
                b.name.clone(),
                b.snapshot_name.clone(),
                b.snapshot_created_at.clone(),
                b.created_time.clone(),
                human_bytes(b.size),
                b.is_incremental.to_string(),
                b.url.clone(),
            ]);
        }
    }
    format!("{vt}\n\n{bt}")
}

/// Prints `v` as `output` says; `rows` is its table.
fn show<T: Serialize>(v: &T, output: Format, rows: impl FnOnce() -> String) -> Result<(), CliError> {
    if output == Format::Table {
        println!("{}", rows());
        return Ok(());
    }
    print_value(&serde_json::to_value(v)?, output)
}

/// Waits until backup `name` completed (its view) or failed (an error with
/// its cause), saying on stderr what it is at when that changes.
async fn wait_done(c: &Client, name: &str) -> Result<BackupView, CliError> {
    let mut sub = c.watch(Some("BackupStatus"), false).await?;
    let mut told = String::new();
    loop {
        let b = c.backup_get(name).await?;
        if let Some(s) = &b.status {
            match s.state {
                BackupState::Completed => return Ok(b),
                BackupState::Error => return Err(format!("backup {name} failed: {}", s.message).into()),
                _ => {}
            }
        }
        let mut line = format!("backup {name}: {}", state_text(&b));
        if let Some(s) = b.status.as_ref().filter(|s| s.state == BackupState::InProgress) {
            line.push_str(&format!(" {}%", s.progress));
        }
        if let Some(s) = b.status.as_ref().filter(|s| !s.message.is_empty()) {
            line.push_str(&format!(": {}", s.message));
        }
        if line != told {
            eprintln!("waiting: {line}");
            told = line;
        }
        // the next change of any backup's status (or the end of the watch)
        loop {
            match sub.next().await {
                Some(Ok(ev)) if ev.resource.metadata.id == name => break,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(format!("watch ended: {e}").into()),
                None => return Err("watch ended: the daemon closed it".into()),
            }
        }
    }
}

/// Runs `talon backup ...`.
pub async fn run(c: &Client, cmd: BackupCommand) -> Result<(), CliError> {
    match cmd {
        BackupCommand::Create {
            source,
            target,
            secret,
            name,
            backup_volume,
            full,
            labels,
            block_size_mib,
            concurrency,
            no_wait,
            output,
        } => {
            let (volume, snapshot) = source
                .split_once('@')
                .ok_or_else(|| format!("{source:?} must be VOLUME@SNAPSHOT"))?;
            let params = BackupCreateParams {
                name,
                volume: volume.to_owned(),
                snapshot: snapshot.to_owned(),
                target,
                credential_secret: secret,
                backup_volume,
                full,
                labels: labels.into_iter().collect::<BTreeMap<_, _>>(),
                block_size: block_size_mib
                    .and_then(|m| m.parse::<u64>().ok())
                    .map(|m| m << 20),
                concurrency,
                // the CLI waits by watching: a backup may take longer than one call may
                wait: false,
                timeout_seconds: None,
            };
            let mut b = c.backup_create(&params).await?;
            if !no_wait {
                b = wait_done(c, &b.name).await?;
            }
            show(&b, output, || backup_rows(std::slice::from_ref(&b)))
        }
        BackupCommand::List { volume, output } => {
            let v = c.backup_list(volume.as_deref()).await?;
            show(&v, output, || backup_rows(&v))
        }
        BackupCommand::Get { name, output } => {
            let b = c.backup_get(&name).await?;
            show(&b, output, || backup_rows(std::slice::from_ref(&b)))
        }
        BackupCommand::Delete { name, from_store } => {
            let r = c.backup_delete(&name, from_store, true).await?;
            print_value(&serde_json::to_value(&r)?, Format::Yaml)
        }
        BackupCommand::Restore {
            backup,
            backup_volume,
            volume,
            target,
            secret,
            size,
            replicas,
            remote_replicas,
            standby,
            poll,
            timeout,
            output,
        } => {
            let params = crate::api::backup::BackupRestoreParams {
                backup,
                backup_volume,
                target,
                credential_secret: secret,
                volume,
                size,
                replicas,
                disks: Vec::new(),
                remote_replicas: remote_replicas
                    .iter()
                    .map(super::volume::RemoteArg::replica)
                    .collect(),
                standby,
                poll_seconds: poll,
                wait: true,
                timeout_seconds: Some(timeout),
            };
            let v = c.backup_restore(&params).await?;
            print_value(&serde_json::to_value(&v)?, output)
        }
        BackupCommand::StoreList {
            target,
            secret,
            volume,
            output,
        } => {
            let v = c
                .backup_store_list(&target, secret.as_deref(), volume.as_deref())
                .await?;
            show(&v, output, || store_rows(&v))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn backups_list_as_a_table_with_progress_and_bytes_for_people() {
        let views: Vec<BackupView> = serde_json::from_value(json!([
            {"name": "backup-0123456789abcdef", "phase": "running",
             "spec": {"volume": "pvc-1", "snapshot": "s1", "target": "vfs:///b"},
             "status": {"state": "completed", "progress": 100, "url": "vfs:///b?backup=backup-0123456789abcdef&volume=pvc-1",
                        "incremental": false, "blocksRead": 3, "blocksUploaded": 3, "bytesUploaded": 3145728,
                        "size": 6291456, "completed": "2025-01-01T00:00:00Z", "message": ""}},
            {"name": "b2", "phase": "running",
             "spec": {"volume": "pvc-1", "snapshot": "s2", "target": "vfs:///b"}, "status": null}
        ]))
        .expect("backup_list answer");
        let out = backup_rows(&views);
        let lines: Vec<&str> = out.lines().collect();
        for (line, want) in [
            (
                0,
                vec![
                    "NAME", "VOLUME", "SNAPSHOT", "STATE", "PROGRESS", "UPLOADED", "URL",
                ],
            ),
            (
                1,
                vec![
                    "backup-0123456789abcdef",
                    "pvc-1",
                    "s1",
                    "completed",
                    "100%",
                    "3 MiB",
                    "vfs:///b?backup=backup-0123456789abcdef&volume=pvc-1",
                ],
            ),
            (2, vec!["b2", "s2", "pending", "0%"]),
        ] {
            for w in want {
                assert!(lines[line].contains(w), "{w:?} in line {line}:\n{out}");
            }
        }
    }

    #[test]
    fn labels_are_read_as_written() {
        assert_eq!(parse_label("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_label("k="), Ok(("k".into(), String::new())));
        assert!(parse_label("novalue").is_err() && parse_label("=v").is_err());
    }

    #[test]
    fn a_store_lists_its_volumes_then_their_backups() {
        let v: Vec<StoreVolumeView> = serde_json::from_value(json!([{
            "name": "pvc-1", "size": 67108864, "createdTime": "", "lastBackupName": "b1", "lastBackupAt": "",
            "compression": "lz4", "dataEngine": "v2", "message": "",
            "backups": [{"name": "b1", "snapshotName": "s1", "snapshotCreatedAt": "2025-01-01T00:00:00Z",
                         "createdTime": "2025-01-01T00:01:00Z", "size": 2097152, "isIncremental": false,
                         "url": "vfs:///b?backup=b1&volume=pvc-1", "labels": {}}]
        }]))
        .expect("backup_store_list answer");
        let out = store_rows(&v);
        let (vols, backups) = out.split_once("\n\n").expect("two tables");
        assert!(
            vols.contains("BACKUP VOLUME") && vols.contains("64 MiB") && vols.contains("lz4"),
            "{out}"
        );
        assert!(
            backups.contains("b1")
                && backups.contains("2 MiB")
                && backups.contains("vfs:///b?backup=b1&volume=pvc-1"),
            "{out}"
        );
    }
}
