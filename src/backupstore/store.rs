//! A backup target: Longhorn's target URLs and credentials, over the
//! `object_store` crate (S3 and local directories).
//!
//! ```text
//!   s3://<bucket>@<region>/<path>    S3 (path-style when an endpoint is given)
//!   s3://<bucket>/<path>             region from the credentials, else us-east-1
//!   vfs:///<dir>                     a local directory (Longhorn's VFS target)
//! ```
//!
//! Credentials come as a Kubernetes secret does: the keys Longhorn's backup
//! target secrets hold (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_ENDPOINTS`, `AWS_CERT`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//! `VIRTUAL_HOSTED_STYLE`), read from a mounted secret folder (one file per
//! key) or a Secret manifest (`data`, base64, or `stringData`).

use std::collections::BTreeMap;
use std::path::Path as FsPath;
use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::error::BackupError;

/// The secret keys a target reads.
const KEYS: [&str; 7] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINTS",
    "AWS_CERT",
    "AWS_REGION",
    "VIRTUAL_HOSTED_STYLE",
];

/// A backup target's credentials (secret key -> value).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials(BTreeMap<String, String>);

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // key names only: values are secrets
        f.debug_tuple("Credentials")
            .field(&self.0.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Credentials {
    /// No credentials (a local target, or an S3 server that takes anonymous calls).
    pub fn none() -> Self {
        Credentials::default()
    }

    /// From key/value pairs; keys talon does not read are dropped.
    pub fn from_pairs<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Self {
        Credentials(
            pairs
                .into_iter()
                .filter(|(k, _)| KEYS.contains(&k.as_str()))
                .map(|(k, v)| (k, v.trim_end_matches('\n').to_owned()))
                .collect(),
        )
    }

    /// From a mounted secret (a folder, one file per key) or a Secret
    /// manifest file (YAML or JSON: `data` base64, `stringData` plain).
    pub fn from_secret(path: &FsPath) -> Result<Self, BackupError> {
        let shown = path.display().to_string();
        if path.is_dir() {
            let mut pairs = Vec::new();
            for k in KEYS {
                let f = path.join(k);
                if f.is_file() {
                    pairs.push((
                        k.to_owned(),
                        std::fs::read_to_string(&f).map_err(BackupError::io(f.display()))?,
                    ));
                }
            }
            return Ok(Credentials::from_pairs(pairs));
        }
        let text = std::fs::read_to_string(path).map_err(BackupError::io(&shown))?;
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Secret {
            #[serde(default)]
            data: BTreeMap<String, String>,
            #[serde(default)]
            string_data: BTreeMap<String, String>,
        }
        let bad = |reason: String| BackupError::Format {
            object: format!("secret {shown}"),
            reason,
        };
        let s: Secret = serde_yaml_ng::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let mut pairs = Vec::new();
        for (k, v) in s.data {
            use base64::Engine as _;
            let raw = base64::engine::general_purpose::STANDARD
                .decode(v.trim())
                .map_err(|e| bad(format!("data.{k} is not base64: {e}")))?;
            let v = String::from_utf8(raw).map_err(|_| bad(format!("data.{k} is not UTF-8")))?;
            pairs.push((k, v));
        }
        pairs.extend(s.string_data);
        Ok(Credentials::from_pairs(pairs))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str).filter(|v| !v.is_empty())
    }
}

/// A parsed target URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    S3 {
        bucket: String,
        region: Option<String>,
        /// The path below the bucket (no leading or trailing `/`).
        prefix: String,
    },
    Dir(std::path::PathBuf),
    /// An NFS share (`nfs://<server>:/<export>`), mounted by talon.
    Nfs(super::nfs::NfsTarget),
}

impl Target {
    /// Parses a Longhorn backup target URL.
    pub fn parse(url: &str) -> Result<Target, BackupError> {
        let bad = |reason: &str| BackupError::Target {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("no scheme (s3://, nfs://, vfs://)"))?;
        match scheme {
            "s3" => {
                let (host, path) = rest.split_once('/').ok_or_else(|| {
                    bad("an S3 target needs a path after the bucket (s3://bucket@region/ at least)")
                })?;
                let (bucket, region) = match host.split_once('@') {
                    Some((b, r)) => (b, Some(r.to_owned()).filter(|r| !r.is_empty())),
                    None => (host, None),
                };
                let bucket_ok = (3..=63).contains(&bucket.len())
                    && bucket
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
                if !bucket_ok {
                    return Err(bad(
                        "the bucket name must be 3-63 lowercase letters, digits, '-' or '.'",
                    ));
                }
                let prefix = path.split('?').next().unwrap_or("").trim_matches('/').to_owned();
                if prefix.split('/').any(|p| p == ".." || p == ".") {
                    return Err(bad("the path may not hold '.' or '..'"));
                }
                Ok(Target::S3 {
                    bucket: bucket.to_owned(),
                    region,
                    prefix,
                })
            }
            "vfs" => {
                let dir = std::path::PathBuf::from(rest);
                if !rest.starts_with('/') {
                    return Err(bad("a vfs target names an absolute folder (vfs:///path)"));
                }
                Ok(Target::Dir(dir))
            }
            "nfs" => super::nfs::NfsTarget::parse(rest, bad).map(Target::Nfs),
            "cifs" | "azblob" => Err(bad(
                "this target kind is not supported by talon yet (S3, NFS and vfs:// are); mount the share and use vfs:///<mount>",
            )),
            _ => Err(bad("unknown scheme (s3://, nfs://, vfs://)")),
        }
    }
}

/// A backup target opened with its credentials.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    /// The target's path, prefixed to every key.
    prefix: String,
    url: String,
    /// A local folder target's folder (its directories are Longhorn's
    /// listing: a folder emptied is removed too).
    local: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("url", &self.url).finish()
    }
}

impl Store {
    /// Opens `url` with `creds`; nothing is called yet (see [`Store::check`]).
    pub fn open(url: &str, creds: &Credentials) -> Result<Store, BackupError> {
        let target = Target::parse(url)?;
        let bad = |reason: String| BackupError::Target {
            url: url.to_owned(),
            reason,
        };
        let folder = |dir: &std::path::Path| -> Result<Arc<dyn ObjectStore>, BackupError> {
            std::fs::create_dir_all(dir).map_err(|e| bad(format!("creating {}: {e}", dir.display())))?;
            let fs =
                object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(|e| bad(e.to_string()))?;
            Ok(Arc::new(fs))
        };
        let (inner, prefix, local): (Arc<dyn ObjectStore>, String, Option<std::path::PathBuf>) = match target
        {
            Target::S3 {
                bucket,
                region,
                prefix,
            } => {
                let mut b = object_store::aws::AmazonS3Builder::new()
                    .with_bucket_name(&bucket)
                    .with_region(
                        region
                            .as_deref()
                            .or(creds.get("AWS_REGION"))
                            .unwrap_or("us-east-1"),
                    );
                match (creds.get("AWS_ACCESS_KEY_ID"), creds.get("AWS_SECRET_ACCESS_KEY")) {
                    (Some(id), Some(secret)) => {
                        b = b.with_access_key_id(id).with_secret_access_key(secret);
                    }
                    (None, None) => b = b.with_skip_signature(true),
                    _ => {
                        return Err(bad(
                            "the credentials hold one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY without the other".into(),
                        ));
                    }
                }
                if let Some(t) = creds.get("AWS_SESSION_TOKEN") {
                    b = b.with_token(t);
                }
                let endpoint = creds.get("AWS_ENDPOINTS");
                if let Some(e) = endpoint {
                    b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
                }
                // Longhorn's rule: path-style with an endpoint, virtual-hosted on AWS
                let virtual_hosted = match creds.get("VIRTUAL_HOSTED_STYLE") {
                    Some("true") => true,
                    Some("false") => false,
                    _ => endpoint.is_none(),
                };
                b = b.with_virtual_hosted_style_request(virtual_hosted);
                if let Some(pem) = creds.get("AWS_CERT") {
                    let certs = object_store::Certificate::from_pem_bundle(pem.as_bytes())
                        .map_err(|e| bad(format!("AWS_CERT: {e}")))?;
                    let mut opts = object_store::ClientOptions::new();
                    for c in certs {
                        opts = opts.with_root_certificate(c);
                    }
                    b = b.with_client_options(opts);
                }
                (Arc::new(b.build().map_err(|e| bad(e.to_string()))?), prefix, None)
            }
            Target::Dir(dir) => (folder(&dir)?, String::new(), Some(dir)),
            // an NFS share is a local folder once mounted
            Target::Nfs(t) => {
                let dir = super::nfs::ensure_mounted(&t, url)?;
                (folder(&dir)?, String::new(), Some(dir))
            }
        };
        Ok(Store {
            inner,
            prefix,
            url: url.to_owned(),
            local,
        })
    }

    /// Opens `url` with the credentials of secret `secret` (a path, see
    /// [`Credentials::from_secret`]), or none.
    pub fn open_with_secret(url: &str, secret: Option<&FsPath>) -> Result<Store, BackupError> {
        let creds = match secret {
            Some(p) => Credentials::from_secret(p)?,
            None => Credentials::none(),
        };
        Store::open(url, &creds)
    }

    /// The target's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn key(&self, rel: &str) -> Result<Path, BackupError> {
        let full = if self.prefix.is_empty() {
            rel.to_owned()
        } else {
            format!("{}/{rel}", self.prefix)
        };
        Path::parse(&full).map_err(|e| BackupError::Invalid(format!("object key {full:?}: {e}")))
    }

    fn failed(op: &'static str, path: &str) -> impl FnOnce(object_store::Error) -> BackupError {
        let path = path.to_owned();
        move |source| BackupError::Store { op, path, source }
    }

    /// Proves the target answers with these credentials: lists its root.
    pub async fn check(&self) -> Result<(), BackupError> {
        self.list(super::format::BASE).await.map(|_| ())
    }

    /// Object `rel`'s bytes; `None` when it is not there.
    pub async fn read(&self, rel: &str) -> Result<Option<bytes::Bytes>, BackupError> {
        match self.inner.get(&self.key(rel)?).await {
            Ok(r) => r.bytes().await.map(Some).map_err(Self::failed("read", rel)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Self::failed("read", rel)(e)),
        }
    }

    /// Writes object `rel` whole (one put: atomic on S3 and on a folder).
    pub async fn write(&self, rel: &str, data: Vec<u8>) -> Result<(), BackupError> {
        self.inner
            .put(&self.key(rel)?, PutPayload::from(data))
            .await
            .map(|_| ())
            .map_err(Self::failed("write", rel))
    }

    /// When object `rel` was last written; `None` when it is not there.
    pub async fn modified(&self, rel: &str) -> Result<Option<std::time::SystemTime>, BackupError> {
        match self.inner.head(&self.key(rel)?).await {
            Ok(m) => Ok(Some(m.last_modified.into())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Self::failed("head", rel)(e)),
        }
    }

    /// Whether object `rel` is there.
    pub async fn exists(&self, rel: &str) -> Result<bool, BackupError> {
        self.modified(rel).await.map(|m| m.is_some())
    }

    /// The names one level below folder `rel` (objects and folders, like `ls`).
    pub async fn list(&self, rel: &str) -> Result<Vec<String>, BackupError> {
        let key = self.key(rel)?;
        let r = self
            .inner
            .list_with_delimiter(Some(&key))
            .await
            .map_err(Self::failed("list", rel))?;
        let mut names: Vec<String> = r
            .common_prefixes
            .iter()
            .chain(r.objects.iter().map(|o| &o.location))
            .filter_map(|p| p.filename().map(str::to_owned))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Deletes object `rel`; one that is not there is no error.
    pub async fn remove(&self, rel: &str) -> Result<(), BackupError> {
        match self.inner.delete(&self.key(rel)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Self::failed("delete", rel)(e)),
        }
    }

    /// Deletes every object below folder `rel`, and on a local folder target
    /// the folder itself (Longhorn lists a folder left behind as a backup
    /// volume whose `volume.cfg` is missing).
    pub async fn remove_all(&self, rel: &str) -> Result<(), BackupError> {
        use futures::TryStreamExt;
        let key = self.key(rel)?;
        let all: Vec<_> = self
            .inner
            .list(Some(&key))
            .try_collect()
            .await
            .map_err(Self::failed("list", rel))?;
        for o in all {
            match self.inner.delete(&o.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Self::failed("delete", o.location.as_ref())(e)),
            }
        }
        if let Some(root) = &self.local {
            let dir = root.join(key.as_ref());
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(BackupError::io(dir.display())(e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_urls_parse_as_longhorns() {
        assert_eq!(
            Target::parse("s3://backups@us-east-1/talon/x").expect("target_urls_parse_as_longhorns"),
            Target::S3 {
                bucket: "backups".into(),
                region: Some("us-east-1".into()),
                prefix: "talon/x".into()
            }
        );
        assert_eq!(
            Target::parse("s3://backups/").expect("ome"),
            Target::S3 {
                bucket: "backups".into(),
                region: None,
                prefix: String::new()
            }
        );
        assert_eq!(
            Target::parse("vfs:///var/b").expect("unwrap"),
            Target::Dir("/var/b".into())
        );
        for (bad, says) in [
            ("s3://backups@us-east-1", "needs a path"),
            ("s3://Bad_Bucket/", "bucket name"),
            ("s3://bkt/../x", "'..'"),
            ("vfs://rel/path", "absolute"),
            ("cifs://10.0.0.1/b", "not supported"),
            ("nfs://10.0.0.1/b", "nfs://<server>:/<export>"),
            ("/plain", "no scheme"),
        ] {
            let e = Target::parse(bad).expect_err("parse fails").to_string();
            assert!(e.contains(says) && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn credentials_read_a_secret_manifest_and_a_mounted_secret() {
        let d = tempfile::tempdir().expect("tempdir");
        let f = d.path().join("secret.yaml");
        std::fs::write(
            &f,
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s3}\ndata:\n  AWS_ACCESS_KEY_ID: dGFsb24=\nstringData:\n  AWS_SECRET_ACCESS_KEY: s3cr3t\n  AWS_ENDPOINTS: http://127.0.0.1:9000\n  OTHER: x\n",
        )
        .expect("write");
        let c = Credentials::from_secret(&f).expect("from_secret");
        assert_eq!(c.get("AWS_ACCESS_KEY_ID"), Some("talon"));
        assert_eq!(c.get("AWS_SECRET_ACCESS_KEY"), Some("s3cr3t"));
        assert_eq!(c.get("OTHER"), None);
        assert!(!format!("{c:?}").contains("s3cr3t"));
        let m = d.path().join("mounted");
        std::fs::create_dir(&m).expect("create_dir");
        std::fs::write(m.join("AWS_ACCESS_KEY_ID"), "talon\n").expect("write");
        std::fs::write(m.join("AWS_SECRET_ACCESS_KEY"), "s3cr3t").expect("write");
        let c2 = Credentials::from_secret(&m).expect("from_secret");
        assert_eq!(c2.get("AWS_ACCESS_KEY_ID"), Some("talon"));
        std::fs::write(&f, "data:\n  AWS_ACCESS_KEY_ID: '%%%'\n").expect("write");
        let e = Credentials::from_secret(&f)
            .expect_err("from_secret fails")
            .to_string();
        assert!(e.contains("AWS_ACCESS_KEY_ID is not base64"), "{e}");
        let one = Credentials::from_pairs([("AWS_ACCESS_KEY_ID".to_owned(), "a".to_owned())]);
        let e = Store::open("s3://bkt/", &one)
            .expect_err("open fails")
            .to_string();
        assert!(e.contains("without the other"), "{e}");
    }
}
