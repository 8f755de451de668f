//! Longhorn's backupstore format: where things live, what the configs say
//! and how a block is named and compressed. Wire-compatible with
//! `github.com/longhorn/backupstore` (its `config.go`, `deltablock.go`,
//! `util/util.go`), written from those facts, so that Longhorn lists and
//! restores talon's backups and talon restores Longhorn's.
//!
//! ```text
//!   backupstore/volumes/<c[0:2]>/<c[2:4]>/<volume>/      c = checksum(volume name)
//!     volume.cfg                                          VolumeCfg
//!     backups/backup_<backup>.cfg                         BackupCfg (CreatedTime "" = in progress)
//!     blocks/<b[0:2]>/<b[2:4]>/<b>.blk                    b = checksum(uncompressed block)
//!     locks/lock-<16 hex>.lck                             lock::LockFile
//! ```
//!
//! Two traps of Go's `json:",string"` tag are kept here and only here:
//! integers written as quoted decimals (`"Size":"2097152"`), and in
//! `volume.cfg` five string fields written JSON-encoded inside a JSON string
//! (`"CompressionMethod":"\"lz4\""`); Go's decoder refuses the plain form
//! and with it the whole `volume.cfg`. Readers here take both forms.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::BackupError;

/// The default (and Longhorn's only pre-2025) block size.
pub const DEFAULT_BLOCK_SIZE: u64 = 2 << 20;
/// Where every object of a store lives, below the target's path.
pub const BASE: &str = "backupstore";
/// `Parameters` key of a backup's block size (a Kubernetes quantity).
pub const PARAM_BLOCK_SIZE: &str = "backup-block-size";
/// `Parameters` key of the backup mode (`full` / `incremental`).
pub const PARAM_MODE: &str = "backup-mode";

/// Longhorn's name rule for volumes, backups, locks and blocks
/// (`^[a-zA-Z0-9][a-zA-Z0-9_.-]+$`, so two characters at least). Names
/// become object keys; anything else is refused, never interpolated.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.len() >= 2
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// The longest file name a folder target (vfs, NFS) holds (Linux's
/// `NAME_MAX`, in bytes): Longhorn's backupstore keeps each backup volume
/// name as one folder name and each backup name in one file name, so a
/// backup made with a longer one fails on such a target when it writes
/// (an S3 key holds more: what another tool wrote there is still read).
pub const NAME_MAX: usize = 255;
/// The longest name of a new backup: `backup_<name>.cfg` is one file name,
/// and so is the temporary name a writer gives it first (talon's store
/// `backup_<name>.cfg#<n>`, Longhorn's `backup_<name>.cfg.tmp`).
pub const MAX_BACKUP_NAME: usize = NAME_MAX - "backup_".len() - ".cfg".len() - ".tmp".len();

/// `what` `name` if it passes [`valid_name`], else an error naming it.
pub fn check_name<'a>(what: &str, name: &'a str) -> Result<&'a str, BackupError> {
    if valid_name(name) {
        Ok(name)
    } else {
        Err(BackupError::InvalidName {
            what: what.to_owned(),
            name: name.to_owned(),
        })
    }
}

/// The name of a backup to make: [`check_name`], and short enough for its
/// config's file name on every kind of target ([`MAX_BACKUP_NAME`]).
pub fn check_backup_name(name: &str) -> Result<&str, BackupError> {
    check_len("backup", name, MAX_BACKUP_NAME)?;
    check_name("backup", name)
}

/// The backup volume a new backup goes into: [`check_name`], and one
/// folder name at most ([`NAME_MAX`]).
pub fn check_backup_volume_name(name: &str) -> Result<&str, BackupError> {
    check_len("backup volume", name, NAME_MAX)?;
    check_name("backup volume", name)
}

fn check_len(what: &str, name: &str, max: usize) -> Result<(), BackupError> {
    if name.len() <= max {
        return Ok(());
    }
    let shown: String = name.chars().take(24).collect();
    Err(BackupError::NameTooLong {
        what: what.to_owned(),
        name: format!("{shown}..."),
        len: name.len(),
        max,
    })
}

/// Longhorn's checksum: SHA-512 of `data`, lowercase hex, the first 64
/// characters (`util.GetChecksum`; not SHA-256 nor SHA-512/256).
pub fn checksum(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA512, data);
    let mut s = String::with_capacity(128);
    for b in d.as_ref() {
        s.push_str(&format!("{b:02x}"));
    }
    s.truncate(64);
    s
}

/// `backupstore/volumes/<c[0:2]>/<c[2:4]>/<volume>`.
pub fn volume_dir(volume: &str) -> String {
    let c = checksum(volume.as_bytes());
    format!("{BASE}/volumes/{}/{}/{volume}", &c[0..2], &c[2..4])
}

/// The volume's `volume.cfg`.
pub fn volume_cfg_path(volume: &str) -> String {
    format!("{}/volume.cfg", volume_dir(volume))
}

/// The volume's backup configs' folder.
pub fn backups_dir(volume: &str) -> String {
    format!("{}/backups", volume_dir(volume))
}

/// Backup `backup`'s config.
pub fn backup_cfg_path(volume: &str, backup: &str) -> String {
    format!("{}/backup_{backup}.cfg", backups_dir(volume))
}

/// The volume's blocks' folder.
pub fn blocks_dir(volume: &str) -> String {
    format!("{}/blocks", volume_dir(volume))
}

/// Block `sum` of `volume`.
pub fn block_path(volume: &str, sum: &str) -> String {
    format!("{}/{}/{}/{sum}.blk", blocks_dir(volume), &sum[0..2], &sum[2..4])
}

/// The volume's locks' folder.
pub fn locks_dir(volume: &str) -> String {
    format!("{}/locks", volume_dir(volume))
}

/// Longhorn's backup URL (`EncodeBackupURL`: the target with `backup` and
/// `volume` added to its query, keys sorted).
pub fn backup_url(target: &str, backup: &str, volume: &str) -> String {
    let sep = if target.contains('?') { '&' } else { '?' };
    format!("{target}{sep}backup={backup}&volume={volume}")
}

/// Now in Longhorn's time format (`util.Now`: RFC 3339, whole seconds, `Z`).
pub fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// How blocks are compressed (`volume.cfg`'s and each backup's
/// `CompressionMethod`; empty means gzip, Longhorn's legacy default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    None,
    Gzip,
    /// LZ4 frames (what `pierrec/lz4` writes and reads), Longhorn's default.
    #[default]
    Lz4,
}

impl Compression {
    /// The method a config names; empty is gzip.
    pub fn parse(s: &str) -> Result<Compression, BackupError> {
        match s {
            "none" => Ok(Compression::None),
            "" | "gzip" => Ok(Compression::Gzip),
            "lz4" => Ok(Compression::Lz4),
            other => Err(BackupError::Format {
                object: "compression method".into(),
                reason: format!("{other:?} is none of none, gzip, lz4"),
            }),
        }
    }

    /// Its name in a config.
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Lz4 => "lz4",
        }
    }

    /// `data` compressed.
    pub fn compress(self, data: &[u8]) -> Vec<u8> {
        match self {
            Compression::None => data.to_vec(),
            Compression::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(data).expect("writing to memory");
                e.finish().expect("writing to memory")
            }
            Compression::Lz4 => {
                let info = lz4_flex::frame::FrameInfo::new()
                    .block_size(lz4_flex::frame::BlockSize::Max4MB)
                    .content_checksum(true);
                let mut e = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
                e.write_all(data).expect("writing to memory");
                e.finish().expect("writing to memory")
            }
        }
    }

    fn decompress(self, data: &[u8], limit: u64) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        match self {
            Compression::None => out.extend_from_slice(data),
            Compression::Gzip => {
                flate2::read::MultiGzDecoder::new(data)
                    .take(limit + 1)
                    .read_to_end(&mut out)?;
            }
            Compression::Lz4 => {
                lz4_flex::frame::FrameDecoder::new(data)
                    .take(limit + 1)
                    .read_to_end(&mut out)?;
            }
        }
        Ok(out)
    }
}

/// Block `sum` as stored (`data`, compressed with `method`), decompressed
/// and checked: exactly `block_size` bytes whose checksum is `sum`. Like
/// Longhorn, a gzip block that is an LZ4 frame (or the reverse) is read as
/// what it is: a volume's method may have changed between backups.
pub fn open_block(
    data: &[u8],
    method: Compression,
    sum: &str,
    block_size: u64,
) -> Result<Vec<u8>, BackupError> {
    const LZ4_MAGIC: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];
    const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
    let method = match method {
        Compression::Gzip if data.starts_with(&LZ4_MAGIC) => Compression::Lz4,
        Compression::Lz4 if data.starts_with(&GZIP_MAGIC) => Compression::Gzip,
        m => m,
    };
    let corrupt = |reason: String| BackupError::CorruptBlock {
        block: sum.to_owned(),
        reason,
    };
    let out = method
        .decompress(data, block_size)
        .map_err(|e| corrupt(format!("{} decompression: {e}", method.as_str())))?;
    if out.len() as u64 != block_size {
        return Err(corrupt(format!(
            "{} bytes, not the block size {block_size}",
            out.len()
        )));
    }
    let got = checksum(&out);
    if got != sum {
        return Err(corrupt(format!("its data's checksum is {got}")));
    }
    Ok(out)
}

/// A Kubernetes quantity as Longhorn's `backup-block-size` parameter holds
/// it (`2Mi`, `16Mi`, `2097152`, `2M`), in bytes.
pub fn parse_quantity(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mul: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(mul)
}

/// `volume.cfg` (Go's `backupstore.Volume`), keys in Longhorn's order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct VolumeCfg {
    #[serde(default)]
    pub name: String,
    /// The volume's size in bytes at its last backup; a restore's size.
    #[serde(default, with = "quoted_u64")]
    pub size: u64,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub created_time: String,
    /// The newest complete backup ("" when none).
    #[serde(default)]
    pub last_backup_name: String,
    /// That backup's snapshot's creation time.
    #[serde(default)]
    pub last_backup_at: String,
    /// Blocks uploaded by this volume's backups (display only).
    #[serde(default, with = "quoted_u64")]
    pub block_count: u64,
    #[serde(default, with = "double_encoded")]
    pub backing_image_name: String,
    #[serde(default, with = "double_encoded")]
    pub backing_image_checksum: String,
    /// Fixed when the volume is first backed up.
    #[serde(default, with = "double_encoded")]
    pub compression_method: String,
    #[serde(default, with = "double_encoded")]
    pub storage_class_name: String,
    /// `v1` or `v2` (empty reads as `v1`).
    #[serde(default, with = "double_encoded")]
    pub data_engine: String,
}

/// One block of a backup: its offset in the volume and its checksum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRef {
    #[serde(rename = "Offset")]
    pub offset: u64,
    #[serde(rename = "BlockChecksum")]
    pub checksum: String,
}

/// `backups/backup_<name>.cfg` (Go's `backupstore.Backup`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct BackupCfg {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub volume_name: String,
    #[serde(default)]
    pub snapshot_name: String,
    #[serde(default)]
    pub snapshot_created_at: String,
    /// Empty while the backup is in progress: such a backup is never
    /// restored, listed as complete or used as an incremental base.
    #[serde(default)]
    pub created_time: String,
    /// Bytes of the blocks it maps (`len(Blocks) * block size`).
    #[serde(default, with = "quoted_u64")]
    pub size: u64,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub parameters: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub is_incremental: bool,
    /// A plain string here (no `,string` tag in Go); empty reads as gzip.
    #[serde(default)]
    pub compression_method: String,
    #[serde(default, with = "quoted_u64")]
    pub newly_uploaded_data_size: u64,
    #[serde(default, with = "quoted_u64")]
    pub re_uploaded_data_size: u64,
    /// Longhorn's internal bookkeeping: written `null`, read and dropped.
    #[serde(default, serialize_with = "null", deserialize_with = "ignore")]
    pub processing_blocks: (),
    /// Every block that holds data, by offset ascending, unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<BlockRef>,
    #[serde(default)]
    pub single_file: SingleFile,
}

/// Longhorn's single-file backups' path (empty for block backups).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SingleFile {
    #[serde(rename = "FilePath", default)]
    pub file_path: String,
}

impl BackupCfg {
    /// Whether it is complete (Longhorn's `isBackupInProgress` negated).
    pub fn complete(&self) -> bool {
        !self.created_time.is_empty()
    }

    /// Its block size (`Parameters["backup-block-size"]`, else 2 MiB).
    pub fn block_size(&self) -> Result<u64, BackupError> {
        match self.parameters.as_ref().and_then(|p| p.get(PARAM_BLOCK_SIZE)) {
            None => Ok(DEFAULT_BLOCK_SIZE),
            Some(s) if s.is_empty() => Ok(DEFAULT_BLOCK_SIZE),
            Some(s) => match parse_quantity(s) {
                Some(0) => Ok(DEFAULT_BLOCK_SIZE),
                Some(n) if n.is_power_of_two() && n >= 4096 => Ok(n),
                _ => Err(BackupError::Format {
                    object: format!("backup {}", self.name),
                    reason: format!("block size {s:?} is not a power of two of 4 KiB or more"),
                }),
            },
        }
    }

    /// Its compression method.
    pub fn compression(&self) -> Result<Compression, BackupError> {
        Compression::parse(&self.compression_method)
    }
}

/// Parses `bytes` (object `path`) as a config.
pub fn decode<T: for<'de> Deserialize<'de>>(path: &str, bytes: &[u8]) -> Result<T, BackupError> {
    serde_json::from_slice(bytes).map_err(|e| BackupError::Format {
        object: path.to_owned(),
        reason: e.to_string(),
    })
}

/// A config as Longhorn writes it (compact JSON).
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("configs serialize")
}

fn null<S: Serializer>(_: &(), s: S) -> Result<S::Ok, S::Error> {
    s.serialize_none()
}

fn ignore<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| ())
}

/// Go's `int64 json:",string"`: written `"123"`, read as `"123"` or `123`.
mod quoted_u64 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Text(String),
            Number(u64),
            Null(()),
        }
        match Either::deserialize(d)? {
            Either::Text(t) => t
                .parse()
                .map_err(|_| D::Error::custom(format!("{t:?} is not a byte count"))),
            Either::Number(n) => Ok(n),
            Either::Null(()) => Ok(0),
        }
    }
}

/// Go's `string json:",string"`: written as a JSON string holding a JSON
/// string (`"\"lz4\""`); read in that form or plain.
mod double_encoded {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &str, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&serde_json::to_string(v).expect("a string serializes"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let outer: Option<String> = Option::deserialize(d)?;
        let outer = outer.unwrap_or_default();
        if outer.starts_with('"')
            && let Ok(inner) = serde_json::from_str::<String>(&outer)
        {
            return Ok(inner);
        }
        Ok(outer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_and_paths_are_longhorns() {
        // vectors computed from Longhorn's GetChecksum (SHA-512, hex, 64 chars)
        assert_eq!(
            checksum(b"pvc-0123abcd-test"),
            "a79b1d58759a544a3be9898fb7913e885d661e109abe20bb03ad2008912c15a5"
        );
        assert_eq!(
            checksum(&vec![0u8; 2 << 20]),
            "731859029215873fdac1c9f2f8bd25a334abf0f3a9e1b057cf2cacc2826d86b0"
        );
        assert_eq!(
            volume_cfg_path("pvc-0123abcd-test"),
            "backupstore/volumes/a7/9b/pvc-0123abcd-test/volume.cfg"
        );
        assert_eq!(
            backup_cfg_path("vol1", "backup-1"),
            "backupstore/volumes/01/9c/vol1/backups/backup_backup-1.cfg"
        );
        let s = checksum(b"x");
        assert_eq!(
            block_path("vol1", &s),
            format!(
                "backupstore/volumes/01/9c/vol1/blocks/{}/{}/{s}.blk",
                &s[..2],
                &s[2..4]
            )
        );
    }

    #[test]
    fn backup_urls_are_longhorns() {
        assert_eq!(
            backup_url("vfs:///b", "backup-1", "pvc-1"),
            "vfs:///b?backup=backup-1&volume=pvc-1"
        );
        assert_eq!(
            backup_url("nfs://h:/x?nfsOptions=soft", "b2", "v2"),
            "nfs://h:/x?nfsOptions=soft&backup=b2&volume=v2"
        );
    }

    #[test]
    fn names_follow_longhorns_rule() {
        for ok in ["vol1", "pvc-1.2_3", "a1"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "a", "-a", "a/b", "a b", "../x", "é1"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn volume_cfg_reads_longhorns_and_writes_its_quoting() {
        // the example of Longhorn's backupstore layout documentation
        let doc = r#"{"Name":"pvc-0123abcd-test","Size":"18874368","Labels":{"k":"v"},"CreatedTime":"2026-10-05T00:40:38Z","LastBackupName":"backup-854f6ced7b4942d4","LastBackupAt":"2026-10-05T00:40:38Z","BlockCount":"4","BackingImageName":"\"\"","BackingImageChecksum":"\"\"","CompressionMethod":"\"lz4\"","StorageClassName":"\"\"","DataEngine":"\"v1\"","LinkedCloneSourceVolume":"\"\""}"#;
        let v: VolumeCfg = decode("volume.cfg", doc.as_bytes()).expect("decode");
        assert_eq!(v.size, 18874368);
        assert_eq!(v.block_count, 4);
        assert_eq!(v.compression_method, "lz4");
        assert_eq!(v.data_engine, "v1");
        let text = String::from_utf8(encode(&v)).expect("encode");
        assert!(text.contains(r#""Size":"18874368""#), "{text}");
        assert!(text.contains(r#""CompressionMethod":"\"lz4\"""#), "{text}");
        assert!(text.contains(r#""BackingImageName":"\"\"""#), "{text}");
        assert!(
            text.starts_with(r#"{"Name":"pvc-0123abcd-test","Size""#),
            "{text}"
        );
        // plain strings and bare numbers are read too
        let v: VolumeCfg =
            decode("v", br#"{"Name":"a1","Size":4194304,"CompressionMethod":"gzip"}"#).expect("decode");
        assert_eq!((v.size, v.compression_method.as_str()), (4194304, "gzip"));
    }

    #[test]
    fn backup_cfg_round_trips_in_longhorns_form() {
        let doc = r#"{"Name":"backup-854f6ced7b4942d4","VolumeName":"pvc-0123abcd-test","SnapshotName":"snap-1","SnapshotCreatedAt":"2026-10-05T00:40:38Z","CreatedTime":"2026-10-05T00:40:43Z","Size":"4194304","Labels":{"k":"v"},"Parameters":null,"IsIncremental":true,"CompressionMethod":"lz4","NewlyUploadedDataSize":"2097171","ReUploadedDataSize":"0","ProcessingBlocks":{},"Blocks":[{"Offset":0,"BlockChecksum":"d9cf"},{"Offset":2097152,"BlockChecksum":"bb9d"}],"SingleFile":{"FilePath":""}}"#;
        let b: BackupCfg = decode("b", doc.as_bytes()).expect("decode");
        assert!(b.complete() && b.is_incremental);
        assert_eq!(b.blocks.len(), 2);
        assert_eq!(b.block_size().expect("block_size"), DEFAULT_BLOCK_SIZE);
        assert_eq!(b.compression().expect("compression"), Compression::Lz4);
        let text = String::from_utf8(encode(&b)).expect("encode");
        assert!(text.contains(r#""ProcessingBlocks":null"#), "{text}");
        assert!(text.contains(r#""CompressionMethod":"lz4""#), "{text}");
        assert!(text.contains(r#""Size":"4194304""#), "{text}");
        assert_eq!(decode::<BackupCfg>("b", &encode(&b)).expect("encode"), b);
        // an in-progress placeholder has no blocks key at all
        let p = BackupCfg {
            name: "b1".into(),
            ..Default::default()
        };
        assert!(
            !String::from_utf8(encode(&p))
                .expect("encode")
                .contains("\"Blocks\"")
        );
        assert!(!p.complete());
    }

    #[test]
    fn blocks_compress_and_open_in_every_method_and_refuse_damage() {
        let mut data = vec![0u8; 2 << 20];
        for (i, b) in data.iter_mut().enumerate().take(300_000) {
            *b = (i * 7 % 251) as u8;
        }
        let sum = checksum(&data);
        for m in [Compression::None, Compression::Gzip, Compression::Lz4] {
            let z = m.compress(&data);
            assert_eq!(
                open_block(&z, m, &sum, 2 << 20).expect("open_block"),
                data,
                "{m:?}"
            );
        }
        let lz = Compression::Lz4.compress(&data);
        // Longhorn's defaults: LZ4 frame, 4 MiB blocks, content checksum
        assert_eq!(&lz[..7], &[0x04, 0x22, 0x4d, 0x18, 0x64, 0x70, 0xb9]);
        // a gzip volume's lz4 block is still read
        assert_eq!(
            open_block(&lz, Compression::Gzip, &sum, 2 << 20).expect("open_block"),
            data
        );
        let mut bad = lz.clone();
        let n = bad.len();
        bad[n / 2] ^= 0xff;
        let e = open_block(&bad, Compression::Lz4, &sum, 2 << 20)
            .expect_err("open_block fails")
            .to_string();
        assert!(e.contains(&sum), "{e}");
        let e = open_block(&lz, Compression::Lz4, &checksum(b"other"), 2 << 20)
            .expect_err("checksum fails")
            .to_string();
        assert!(e.contains("checksum"), "{e}");
        let e = open_block(&lz, Compression::Lz4, &sum, 4 << 20)
            .expect_err("open_block fails")
            .to_string();
        assert!(e.contains("not the block size"), "{e}");
    }

    #[test]
    fn block_sizes_come_from_the_parameters() {
        assert_eq!(parse_quantity("16Mi"), Some(16 << 20));
        assert_eq!(parse_quantity("2097152"), Some(2 << 20));
        assert_eq!(parse_quantity("2Qi"), None);
        let mut b = BackupCfg {
            parameters: Some([(PARAM_BLOCK_SIZE.to_owned(), "16Mi".to_owned())].into()),
            ..Default::default()
        };
        assert_eq!(b.block_size().expect("block_size"), 16 << 20);
        b.parameters = Some([(PARAM_BLOCK_SIZE.to_owned(), "3000".to_owned())].into());
        assert!(b.block_size().is_err());
    }
}
