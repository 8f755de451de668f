//! talon invoked as `longhorn` (a link with that name): the backup target
//! calls of Longhorn's engine binary, which longhorn-manager's backup target,
//! backup volume and backup controllers run (`engineapi/backups.go`,
//! `engineapi/system_backup.go`, `engineapi/backup_backing_image.go`) with
//! the target's credentials in the environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINTS`, `AWS_CERT`, ...):
//!
//! ```text
//!   longhorn backup ls [--volume V] [--volume-only] <target>
//!   longhorn backup inspect-volume <target>?volume=V
//!   longhorn backup inspect <target>?backup=B&volume=V
//!   longhorn backup head <target>?volume=V[&backup=B]
//!   longhorn backup rm <target>?backup=B&volume=V | rm --volume V <target>
//!   longhorn backup cleanup-all-mounts
//!   longhorn backup ls-backing-image <target>
//!   longhorn system-backup list <target>
//!   longhorn version --client-only
//! ```
//!
//! `version --client-only` is what the manager's engine image controller
//! (and the engine image pod's readiness probe) runs: it reports the CLI,
//! controller and data format API versions of longhorn-engine v1.12.1
//! (`pkg/meta/version.go`), so that the manager takes the image as
//! compatible; of that CLI talon answers the backup target calls above.
//!
//! Each prints the JSON Longhorn's binary prints ([`crate::backupstore::info`])
//! and exits 0, or says why on stderr and exits 1 ("cannot find ..." for a
//! missing volume or backup, the words the manager looks for). The engine
//! binary's other commands (a V1 engine's) are refused: talon has no V1
//! engine process. Backing image backups are listed but not inspected or
//! deleted.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;
use serde::Serialize;

use crate::backupstore::{BackupError, Credentials, Store, info, ops};

/// The name talon answers to as Longhorn's engine binary.
pub const NAME: &str = "longhorn";

/// Whether talon was invoked through a link named [`NAME`].
pub fn is_engine_argv(argv: &[OsString]) -> bool {
    argv.first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == NAME)
}

#[derive(Debug, Parser)]
#[command(
    name = "longhorn",
    about = "talon as Longhorn's engine binary: the backup target calls of longhorn-manager"
)]
struct EngineBinary {
    #[command(subcommand)]
    command: Top,
}

#[derive(Debug, clap::Subcommand)]
enum Top {
    /// Backups in a backup target.
    #[command(subcommand)]
    Backup(BackupCmd),
    /// Longhorn's system backups in a backup target.
    #[command(subcommand)]
    SystemBackup(SystemBackupCmd),
    /// The API versions this binary speaks.
    Version {
        /// Only this binary's (without it an engine process is asked: a
        /// V1 engine's, which talon has not).
        #[arg(long)]
        client_only: bool,
    },
}

/// longhorn-engine's `EngineVersionDetails` (field names and order as its
/// JSON).
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct VersionDetails {
    version: String,
    git_commit: String,
    build_date: String,
    #[serde(rename = "cliAPIVersion")]
    cli_api_version: u32,
    #[serde(rename = "cliAPIMinVersion")]
    cli_api_min_version: u32,
    #[serde(rename = "controllerAPIVersion")]
    controller_api_version: u32,
    #[serde(rename = "controllerAPIMinVersion")]
    controller_api_min_version: u32,
    data_format_version: u32,
    data_format_min_version: u32,
}

/// `version --client-only`'s answer: longhorn-engine v1.12.1's API
/// versions (`pkg/meta/version.go`), talon's own version.
fn client_version() -> serde_json::Value {
    let details = VersionDetails {
        version: format!("talon-{}", env!("CARGO_PKG_VERSION")),
        git_commit: String::new(),
        build_date: String::new(),
        cli_api_version: 12,
        cli_api_min_version: 8,
        controller_api_version: 6,
        controller_api_min_version: 4,
        data_format_version: 1,
        data_format_min_version: 1,
    };
    serde_json::json!({"clientVersion": details, "serverVersion": null})
}

#[derive(Debug, clap::Subcommand)]
enum BackupCmd {
    /// The backup volumes (and their backups' names).
    #[command(alias = "list")]
    Ls {
        #[arg(long)]
        volume: Option<String>,
        #[arg(long)]
        volume_only: bool,
        target: String,
    },
    /// A backup volume.
    InspectVolume { url: String },
    /// A complete backup.
    Inspect { url: String },
    /// When a volume's or backup's config last changed.
    Head { url: String },
    /// Deletes a backup (and the blocks no other backup maps), or with
    /// `--volume` a whole backup volume.
    #[command(aliases = ["remove", "delete"])]
    Rm {
        #[arg(long)]
        volume: Option<String>,
        url: String,
    },
    /// Unmounts the NFS backup targets' shares talon mounted.
    CleanupAllMounts,
    /// The names of the backing image backups.
    LsBackingImage { target: String },
}

#[derive(Debug, clap::Subcommand)]
enum SystemBackupCmd {
    /// Name -> folder of each system backup.
    #[command(alias = "ls")]
    List { target: String },
}

fn store(target: &str) -> Result<Store, BackupError> {
    Store::open(target, &Credentials::from_pairs(std::env::vars()))
}

fn json(v: &impl Serialize) -> Result<Option<String>, BackupError> {
    // Go's json.MarshalIndent(v, "", "\t")
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut out,
        serde_json::ser::PrettyFormatter::with_indent(b"\t"),
    );
    v.serialize(&mut ser)
        .map_err(|e| BackupError::Invalid(e.to_string()))?;
    Ok(Some(String::from_utf8_lossy(&out).into_owned()))
}

async fn backup(cmd: BackupCmd) -> Result<Option<String>, BackupError> {
    match cmd {
        BackupCmd::Ls {
            volume,
            volume_only,
            target,
        } => json(&info::list(&store(&target)?, volume.as_deref(), volume_only).await?),
        BackupCmd::InspectVolume { url } => {
            let (dest, volume, _) = info::decode_url(&url)?;
            json(&info::inspect_volume(&store(&dest)?, &volume).await?)
        }
        BackupCmd::Inspect { url } => {
            let (dest, volume, name) = info::decode_url(&url)?;
            let name = name.ok_or_else(|| BackupError::Invalid(format!("no backup in {url}")))?;
            json(&info::inspect_backup(&store(&dest)?, &volume, &name).await?)
        }
        BackupCmd::Head { url } => {
            let (dest, volume, name) = info::decode_url(&url)?;
            json(&info::head(&store(&dest)?, &volume, name.as_deref()).await?)
        }
        BackupCmd::Rm {
            volume: Some(volume),
            url,
        } => {
            ops::delete_volume(&store(&url)?, &volume).await?;
            Ok(None)
        }
        BackupCmd::Rm { volume: None, url } => {
            let (dest, volume, name) = info::decode_url(&url)?;
            let name = name.ok_or_else(|| BackupError::Invalid(format!("no backup in {url}")))?;
            ops::delete(&store(&dest)?, &volume, &name).await?;
            Ok(None)
        }
        BackupCmd::CleanupAllMounts => {
            let failed = crate::backupstore::nfs::unmount_all();
            if failed.is_empty() {
                Ok(None)
            } else {
                Err(BackupError::Invalid(format!(
                    "cannot unmount {}",
                    failed.join(", ")
                )))
            }
        }
        BackupCmd::LsBackingImage { target } => json(&info::backing_images(&store(&target)?).await?),
    }
}

/// Runs the engine binary's command in `argv` (argv[0] is `longhorn`).
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let cmd = match EngineBinary::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) if e.use_stderr() => {
            eprintln!("{e}\ntalon answers only the backup target calls of Longhorn's engine binary");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let out = rt.block_on(async {
        match cmd.command {
            Top::Backup(b) => backup(b).await,
            Top::SystemBackup(SystemBackupCmd::List { target }) => {
                json(&info::system_backups(&store(&target)?).await?)
            }
            Top::Version { client_only: true } => json(&client_version()),
            Top::Version { client_only: false } => Err(BackupError::Invalid(
                "version without --client-only asks a V1 engine process; talon serves V2 engines".into(),
            )),
        }
    });
    match out {
        Ok(Some(text)) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        // the library's words, by which the manager takes it as gone
        Err(BackupError::NotFound(what)) => {
            eprintln!("cannot find {what} in backupstore");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The manager decodes `clientVersion` into `EngineVersionDetails` and
    /// checks its CLI API range against its own (12, min 8).
    #[test]
    fn the_client_version_is_longhorn_engines_api_range() {
        let v = client_version();
        let c = &v["clientVersion"];
        assert_eq!(
            (c["cliAPIVersion"].as_u64(), c["cliAPIMinVersion"].as_u64()),
            (Some(12), Some(8))
        );
        assert_eq!(c["controllerAPIVersion"], 6);
        assert_eq!(c["dataFormatMinVersion"], 1);
        assert!(c["version"].as_str().is_some_and(|s| s.starts_with("talon-")));
        assert!(v["serverVersion"].is_null());
    }

    #[test]
    fn only_a_link_named_longhorn_is_the_engine_binary() {
        assert!(is_engine_argv(&[
            "/var/lib/longhorn/engine-binaries/x/longhorn".into()
        ]));
        assert!(is_engine_argv(&["longhorn".into(), "backup".into()]));
        assert!(!is_engine_argv(&["/usr/bin/talon".into()]));
        assert!(!is_engine_argv(&["longhorn-manager".into()]));
        assert!(!is_engine_argv(&[]));
    }

    #[test]
    fn the_managers_command_lines_parse() {
        for argv in [
            &["longhorn", "backup", "ls", "--volume-only", "s3://b@r/p"][..],
            &["longhorn", "backup", "ls", "--volume", "v1", "s3://b@r/p"],
            &["longhorn", "backup", "inspect-volume", "s3://b@r/p?volume=v1"],
            &["longhorn", "backup", "inspect", "s3://b@r/p?backup=b1&volume=v1"],
            &["longhorn", "backup", "head", "s3://b@r/p?volume=v1"],
            &["longhorn", "backup", "rm", "s3://b@r/p?backup=b1&volume=v1"],
            &["longhorn", "backup", "rm", "--volume", "v1", "s3://b@r/p"],
            &["longhorn", "backup", "cleanup-all-mounts"],
            &["longhorn", "backup", "ls-backing-image", "s3://b@r/p"],
            &["longhorn", "system-backup", "list", "s3://b@r/p"],
            &["longhorn", "version", "--client-only"],
        ] {
            EngineBinary::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        }
        assert!(
            EngineBinary::try_parse_from(["longhorn", "info"]).is_err(),
            "a V1 engine's call"
        );
    }
}
