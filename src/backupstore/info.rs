//! What Longhorn's engine binary answers about a backup store
//! (`longhorn backup ls|inspect-volume|inspect|head`, `system-backup list`,
//! `backup ls-backing-image`), in the JSON shapes longhorn-manager's backup
//! target controller parses (`engineapi/backups.go`): the backupstore
//! library's `VolumeInfo`, `BackupInfo` and `ConfigMetadata`, field for
//! field, with Go's quirks (integers quoted, `null` for an absent map,
//! `omitempty` fields left out).
//!
//! A missing volume or backup is [`BackupError::NotFound`] naming the
//! config's path; the engine binary's command line says it in the
//! library's words ("cannot find <path> in backupstore"), by which the
//! manager takes it as gone.

use std::collections::BTreeMap;

use serde::Serialize;

use super::error::BackupError;
use super::format::{self, BackupCfg, VolumeCfg};
use super::ops;
use super::store::Store;

/// A backup volume as Longhorn lists and inspects it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct VolumeInfo {
    pub name: String,
    #[serde(serialize_with = "quoted")]
    pub size: u64,
    pub labels: Option<BTreeMap<String, String>>,
    pub created: String,
    pub last_backup_name: String,
    pub last_backup_at: String,
    #[serde(serialize_with = "quoted")]
    pub data_stored: u64,
    /// `error` -> why the volume does not read.
    pub messages: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backups: Option<BTreeMap<String, BackupInfo>>,
    pub backing_image_name: String,
    pub backing_image_checksum: String,
    /// Longhorn's spelling.
    #[serde(rename = "StorageClassname")]
    pub storage_class_name: String,
    pub data_engine: String,
}

/// A backup as Longhorn inspects it (a listing gives only the names, with
/// every field empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct BackupInfo {
    pub name: String,
    #[serde(rename = "URL")]
    pub url: String,
    pub snapshot_name: String,
    pub snapshot_created: String,
    pub created: String,
    #[serde(serialize_with = "quoted")]
    pub size: u64,
    pub labels: Option<BTreeMap<String, String>>,
    pub parameters: Option<BTreeMap<String, String>>,
    pub is_incremental: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub compression_method: String,
    #[serde(serialize_with = "quoted")]
    pub newly_uploaded_data_size: u64,
    #[serde(serialize_with = "quoted")]
    pub re_uploaded_data_size: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub volume_name: String,
    #[serde(serialize_with = "quoted", skip_serializing_if = "is_zero")]
    pub volume_size: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub volume_created: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub volume_backing_image_name: String,
    pub messages: Option<BTreeMap<String, String>>,
}

/// A config's modification time (`backup head`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ConfigMetadata {
    /// RFC 3339 with nanoseconds, as Go prints a `time.Time`.
    pub modification_time: String,
}

fn quoted<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn not_found(path: &str) -> BackupError {
    BackupError::NotFound(path.to_owned())
}

fn volume_info(v: &VolumeCfg) -> VolumeInfo {
    VolumeInfo {
        name: v.name.clone(),
        size: v.size,
        labels: v.labels.clone(),
        created: v.created_time.clone(),
        last_backup_name: v.last_backup_name.clone(),
        last_backup_at: v.last_backup_at.clone(),
        data_stored: v.block_count * format::DEFAULT_BLOCK_SIZE,
        messages: BTreeMap::new(),
        backups: None,
        backing_image_name: v.backing_image_name.clone(),
        backing_image_checksum: v.backing_image_checksum.clone(),
        storage_class_name: v.storage_class_name.clone(),
        data_engine: v.data_engine.clone(),
    }
}

fn backup_info(store: &Store, b: &BackupCfg, v: &VolumeCfg) -> BackupInfo {
    BackupInfo {
        name: b.name.clone(),
        url: format::backup_url(store.url(), &b.name, &b.volume_name),
        snapshot_name: b.snapshot_name.clone(),
        snapshot_created: b.snapshot_created_at.clone(),
        created: b.created_time.clone(),
        size: b.size,
        labels: b.labels.clone(),
        parameters: b.parameters.clone(),
        is_incremental: b.is_incremental,
        compression_method: b.compression_method.clone(),
        newly_uploaded_data_size: b.newly_uploaded_data_size,
        re_uploaded_data_size: b.re_uploaded_data_size,
        volume_name: v.name.clone(),
        volume_size: v.size,
        volume_created: v.created_time.clone(),
        volume_backing_image_name: v.backing_image_name.clone(),
        messages: None,
    }
}

/// `backup ls [--volume V] [--volume-only]`: every backup volume (or `V`),
/// with its backups' names unless `volume_only`. A volume whose
/// `volume.cfg` is missing is listed with the error in its messages.
pub async fn list(
    store: &Store,
    volume: Option<&str>,
    volume_only: bool,
) -> Result<BTreeMap<String, VolumeInfo>, BackupError> {
    let names = match volume {
        Some(v) => vec![format::check_name("volume", v)?.to_owned()],
        None => ops::volumes(store).await?,
    };
    let mut out = BTreeMap::new();
    for name in names {
        let mut info = VolumeInfo::default();
        let cfg = format::volume_cfg_path(&name);
        if !store.exists(&cfg).await? {
            info.messages
                .insert("error".into(), format!("cannot find {cfg} in backupstore"));
        } else if !volume_only {
            match ops::backup_names(store, &name).await {
                Ok(backups) => {
                    info.backups = Some(backups.into_iter().map(|b| (b, BackupInfo::default())).collect());
                }
                Err(e) => {
                    info.messages.insert("error".into(), e.to_string());
                }
            }
        }
        out.insert(name, info);
    }
    Ok(out)
}

/// `backup inspect-volume <target>?volume=V`.
pub async fn inspect_volume(store: &Store, volume: &str) -> Result<VolumeInfo, BackupError> {
    let v = ops::volume(store, volume)
        .await?
        .ok_or_else(|| not_found(&format::volume_cfg_path(volume)))?;
    Ok(volume_info(&v))
}

/// `backup inspect <target>?backup=B&volume=V`: a complete backup only.
pub async fn inspect_backup(store: &Store, volume: &str, name: &str) -> Result<BackupInfo, BackupError> {
    let v = ops::volume(store, volume)
        .await?
        .ok_or_else(|| not_found(&format::volume_cfg_path(volume)))?;
    let path = format::backup_cfg_path(volume, name);
    if !store.exists(&path).await? {
        return Err(not_found(&path));
    }
    let b = ops::backup(store, volume, name).await?;
    if !b.complete() {
        return Err(BackupError::Invalid(format!(
            "backup {name} is still in progress"
        )));
    }
    Ok(backup_info(store, &b, &v))
}

/// `backup head <target>?volume=V[&backup=B]`: when the backup's config (or
/// the volume's) last changed.
pub async fn head(store: &Store, volume: &str, backup: Option<&str>) -> Result<ConfigMetadata, BackupError> {
    let path = match backup {
        Some(b) => format::backup_cfg_path(volume, b),
        None => format::volume_cfg_path(volume),
    };
    let t = store.modified(&path).await?.ok_or_else(|| not_found(&path))?;
    // Go's RFC 3339 with nanoseconds drops the fraction's trailing zeros
    let full = humantime::format_rfc3339_nanos(t).to_string();
    let (secs, frac) = full.trim_end_matches('Z').split_once('.').unwrap_or((&full, ""));
    let frac = frac.trim_end_matches('0');
    let modification_time = if frac.is_empty() {
        format!("{secs}Z")
    } else {
        format!("{secs}.{frac}Z")
    };
    Ok(ConfigMetadata { modification_time })
}

/// `system-backup list`: Longhorn's system backups, name -> their folder
/// (`backupstore/system-backups/<longhorn version>/<name>`).
pub async fn system_backups(store: &Store) -> Result<BTreeMap<String, String>, BackupError> {
    let base = format!("{}/system-backups", format::BASE);
    let mut out = BTreeMap::new();
    for version in store.list(&base).await? {
        let dir = format!("{base}/{version}");
        for name in store.list(&dir).await? {
            out.insert(name.clone(), format!("{dir}/{name}"));
        }
    }
    Ok(out)
}

/// `backup ls-backing-image`: the names of Longhorn's backing image backups
/// (`backupstore/backing-images/backing-images/<name>`).
pub async fn backing_images(store: &Store) -> Result<Vec<String>, BackupError> {
    store
        .list(&format!("{}/backing-images/backing-images", format::BASE))
        .await
}

/// A backup URL taken apart as Longhorn does (`DecodeBackupURL`): the
/// target without the `backup` and `volume` parameters, and those two
/// (`volume` required and valid; `backup` valid when given).
pub fn decode_url(url: &str) -> Result<(String, String, Option<String>), BackupError> {
    // Longhorn's engine binary takes `\u0026` and `u0026` for `&` (a shell's escapes)
    let url = url.replacen("\\u0026", "&", 1).replacen("u0026", "&", 1);
    let (dest, query) = url.split_once('?').unwrap_or((url.as_str(), ""));
    let (mut volume, mut backup, mut rest) = (String::new(), None, Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_encoding::percent_decode_str(v)
            .decode_utf8_lossy()
            .into_owned();
        match k {
            "volume" => volume = v,
            "backup" => backup = Some(v).filter(|b: &String| !b.is_empty()),
            _ => rest.push(pair),
        }
    }
    if !format::valid_name(&volume) {
        return Err(BackupError::Invalid(format!(
            "invalid volume name parsed, got {volume:?} (from {})",
            super::store::redact_urls(&url)
        )));
    }
    if let Some(b) = &backup
        && !format::valid_name(b)
    {
        return Err(BackupError::Invalid(format!(
            "invalid backup name parsed, got {b:?} (from {})",
            super::store::redact_urls(&url)
        )));
    }
    let dest = if rest.is_empty() {
        dest.to_owned()
    } else {
        format!("{dest}?{}", rest.join("&"))
    };
    Ok((dest, volume, backup))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_urls_come_apart_as_longhorn_takes_them() {
        let (d, v, b) = decode_url("s3://bk@us-east-1/a/?backup=backup-1&volume=pvc-x").expect("decode");
        assert_eq!(
            (d.as_str(), v.as_str(), b.as_deref()),
            ("s3://bk@us-east-1/a/", "pvc-x", Some("backup-1"))
        );
        let (d, v, b) = decode_url("vfs:///mnt/b?volume=v1").expect("decode");
        assert_eq!((d.as_str(), v.as_str(), b), ("vfs:///mnt/b", "v1", None));
        let (_, _, b) = decode_url("vfs:///b?backup=x1\\u0026volume=v1").expect("a shell's escape");
        assert_eq!(b.as_deref(), Some("x1"));
        let e = decode_url("vfs:///b?backup=x1&volume=../up")
            .expect_err("bad volume")
            .to_string();
        assert!(e.contains("invalid volume name"), "{e}");
        assert!(decode_url("vfs:///b?backup=a/b&volume=v").is_err());
        assert!(decode_url("vfs:///b").is_err(), "no volume");
    }

    #[test]
    fn infos_serialize_in_gos_shape() {
        let b = serde_json::to_value(BackupInfo::default()).expect("json");
        assert_eq!(
            b,
            serde_json::json!({"Name":"","URL":"","SnapshotName":"","SnapshotCreated":"","Created":"",
                "Size":"0","Labels":null,"Parameters":null,"IsIncremental":false,
                "NewlyUploadedDataSize":"0","ReUploadedDataSize":"0","Messages":null})
        );
        let v = serde_json::to_value(VolumeInfo::default()).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"Name":"","Size":"0","Labels":null,"Created":"","LastBackupName":"",
                "LastBackupAt":"","DataStored":"0","Messages":{},"BackingImageName":"",
                "BackingImageChecksum":"","StorageClassname":"","DataEngine":""})
        );
    }
}
