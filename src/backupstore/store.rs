//! A backup target: Longhorn's target URLs and credentials, over the
//! `object_store` crate (S3 and local directories).
//!
//! ```text
//!   s3://<bucket>@<region>/<path>    S3 (path-style when an endpoint is given)
//!   s3://<bucket>/<path>             region from the credentials, else us-east-1
//!   vfs:///<dir>                     a local directory (Longhorn's VFS target)
//!
//!   URL ──Target::checked(url, Caller)──> Target ──Store::open(creds)──> Store
//!          no '.' or '..' in any path          a folder must exist (nothing is made);
//!          Caller::Longhorn: a folder only     every call refuses one that vanished
//!            under the node's backupFolderRoot  (or whose share was unmounted)
//!          NFS: no exec/suid/dev (nfs.rs)       errors never hold a secret (redact)
//! ```
//!
//! Every target URL, from Longhorn's ports, talon's admin API, the CLI or a
//! stored spec, is checked by [`Target::checked`] (Longhorn's ports and the
//! API before anything is recorded; `Store::open` again with the rules every
//! caller shares).
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
            kind: Option<String>,
            #[serde(default)]
            data: BTreeMap<String, String>,
            #[serde(default)]
            string_data: BTreeMap<String, String>,
        }
        let bad = |reason: String| BackupError::Format {
            object: format!("secret {shown}"),
            reason,
        };
        // any YAML mapping would read as a Secret without keys ("no credentials")
        let not_secret =
            || bad("not a Kubernetes Secret manifest (no `kind: Secret`) nor a mounted secret folder".into());
        let s: Secret = serde_yaml_ng::from_str(&text).map_err(|_| not_secret())?;
        if s.kind.as_deref() != Some("Secret") {
            return Err(not_secret());
        }
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

    /// The values no error or log line may show: the secret key, the
    /// session token, and a password an endpoint URL holds.
    fn secrets(&self) -> Vec<String> {
        let mut out: Vec<String> = ["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"]
            .iter()
            .filter_map(|k| self.get(k))
            .map(str::to_owned)
            .collect();
        if let Some(e) = self.get("AWS_ENDPOINTS")
            && let Some(info) = userinfo(e)
        {
            out.push(info.rsplit_once(':').map_or(info, |(_, p)| p).to_owned());
        }
        out.retain(|s| !s.is_empty());
        out
    }

    /// Refuses credentials a store cannot use as given: one of the key id and
    /// the secret key without the other, and an endpoint that holds a user
    /// or password (S3 signs each request with the keys; a password in the
    /// endpoint is not S3's and would be shown wherever its URL is). The
    /// reason names keys, never a value.
    pub fn check(&self) -> Result<(), String> {
        match (self.get("AWS_ACCESS_KEY_ID"), self.get("AWS_SECRET_ACCESS_KEY")) {
            (Some(_), None) | (None, Some(_)) => {
                return Err(
                    "the credentials hold one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY without the other".into(),
                );
            }
            _ => {}
        }
        if let Some(e) = self.get("AWS_ENDPOINTS")
            && userinfo(e).is_some()
        {
            return Err(format!(
                "AWS_ENDPOINTS {:?} holds a user name or password: an S3 endpoint takes none \
                 (the keys go in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
                redact_urls(e)
            ));
        }
        Ok(())
    }

    /// `text` with every secret value and every URL's password replaced by
    /// `***`: what errors built from a store's answers show.
    pub fn redact(&self, text: &str) -> String {
        let mut out = redact_urls(text);
        for s in self.secrets() {
            out = out.replace(&s, "***");
        }
        out
    }
}

/// The user information of URL `url` (`user:password` in
/// `http://user:password@host/`), if it holds one.
fn userinfo(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority.rsplit_once('@').map(|(info, _)| info)
}

pub use super::error::redact_urls;

/// Who names a target, and so which targets it may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// talon's admin API and CLI (root on this node through the Unix
    /// socket, or a holder of the TCP listener's token): any absolute folder.
    Admin,
    /// Longhorn's gRPC ports, which have no authentication: a folder target
    /// only under the node's `backupFolderRoot`, none without one.
    Longhorn {
        /// `NodeConfig.backupFolderRoot`.
        folder_root: Option<std::path::PathBuf>,
    },
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
            url: redact_urls(url),
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
                if rest.split('/').any(|p| p == ".." || p == ".") {
                    return Err(bad("the path may not hold '.' or '..'"));
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

impl Target {
    /// Parses `url` and checks it is one `caller` may name: a folder target
    /// from Longhorn's ports only under the node's folder root (also once
    /// symbolic links are followed, where the folder exists). The one check
    /// of every target URL talon is given.
    pub fn checked(url: &str, caller: &Caller) -> Result<Target, BackupError> {
        let target = Target::parse(url)?;
        let bad = |reason: String| BackupError::Target {
            url: redact_urls(url),
            reason,
        };
        if let (Target::Dir(dir), Caller::Longhorn { folder_root }) = (&target, caller) {
            let Some(root) = folder_root else {
                return Err(bad(
                    "a folder target (vfs://) is refused on Longhorn's ports unless the node's \
                     backupFolderRoot holds it, and this node has no backupFolderRoot"
                        .into(),
                ));
            };
            let outside = || {
                bad(format!(
                    "the folder {} is not under the node's backupFolderRoot {}",
                    dir.display(),
                    root.display()
                ))
            };
            if !dir.starts_with(root) {
                return Err(outside());
            }
            // a symbolic link under the root that leads out of it: the folder's
            // nearest existing ancestor, links followed, is under the root's
            let existing = dir.ancestors().find(|a| a.exists()).unwrap_or(dir);
            if let (Ok(real), Ok(real_root)) = (std::fs::canonicalize(existing), std::fs::canonicalize(root))
                && !real.starts_with(&real_root)
            {
                return Err(outside());
            }
        }
        Ok(target)
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
    /// The device the folder was on when opened: another one (a share
    /// unmounted, leaving the folder beneath) is not the target.
    local_dev: u64,
    /// The credentials, to keep their values out of errors.
    creds: Arc<Credentials>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("url", &redact_urls(&self.url))
            .finish()
    }
}

/// Whether SigV4 leaves request bodies to the transport (`UNSIGNED-PAYLOAD`)
/// rather than signing a SHA-256 of each: over TLS (AWS itself without an
/// endpoint, or an `https://` one), whose records already guard every
/// body, and where a block's name is its SHA-512, checked by every restore.
/// A third hash of each 2 MiB block costs a core ~1.2 ms on talon's side
/// (aws-lc, SHA-NI) and as much on the server's. Over plain HTTP the
/// signature is a body's only guard against a change on the way: signed.
fn payload_left_to_tls(endpoint: Option<&str>) -> bool {
    endpoint.is_none_or(|e| e.starts_with("https://"))
}

/// The HTTP client of an S3 target: object_store's own (reqwest), but a
/// server certificate the roots do not trust fails the call at once.
/// object_store counts it a connect error and retries those ten times with
/// backoff, so a wrong or missing `AWS_CERT` took ~10 s to be told, on every
/// call; no retry can make the certificate trusted.
#[derive(Debug, Default)]
struct UntrustedIsFinal;

impl object_store::client::HttpConnector for UntrustedIsFinal {
    fn connect(
        &self,
        options: &object_store::ClientOptions,
    ) -> object_store::Result<object_store::client::HttpClient> {
        let inner = object_store::client::ReqwestConnector::default().connect(options)?;
        Ok(object_store::client::HttpClient::new(UntrustedIsFinalClient(
            inner,
        )))
    }
}

#[derive(Debug)]
struct UntrustedIsFinalClient(object_store::client::HttpClient);

#[async_trait::async_trait]
impl object_store::client::HttpService for UntrustedIsFinalClient {
    async fn call(
        &self,
        req: object_store::client::HttpRequest,
    ) -> Result<object_store::client::HttpResponse, object_store::client::HttpError> {
        use object_store::client::{HttpError, HttpErrorKind};
        self.0
            .execute(req)
            .await
            .map_err(|e| match untrusted_certificate(&e) {
                // `Unknown`: a kind object_store never retries
                Some(_) => HttpError::new(HttpErrorKind::Unknown, e),
                None => e,
            })
    }
}

/// rustls's refusal of the peer's certificate, when it is `e` or an error
/// under it. rustls's error reaches reqwest inside `io::Error`s (two, as
/// hyper-util wraps it), and an `io::Error`'s `source()` skips the error it
/// wraps, so each `io::Error` met is opened too.
fn untrusted_certificate(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    use tokio_rustls::rustls::Error as Tls;
    let mut at = vec![e];
    while let Some(x) = at.pop() {
        if let Some(t @ (Tls::InvalidCertificate(_) | Tls::NoCertificatesPresented)) = x.downcast_ref::<Tls>()
        {
            return Some(t.to_string());
        }
        if let Some(wrapped) = x.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            at.push(wrapped);
        }
        at.extend(x.source());
    }
    None
}

impl Store {
    /// Opens `url` with `creds`; nothing is called yet (see [`Store::check`]).
    /// A folder target's folder must exist: talon never makes one (a
    /// backup makes the store's own folders under it).
    pub fn open(url: &str, creds: &Credentials) -> Result<Store, BackupError> {
        let target = Target::parse(url)?;
        let bad = |reason: String| BackupError::Target {
            url: redact_urls(url),
            reason: creds.redact(&reason),
        };
        creds.check().map_err(bad)?;
        let folder = |dir: &std::path::Path| -> Result<Arc<dyn ObjectStore>, BackupError> {
            folder_dev(url, dir)?;
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
                    // one without the other was refused by check()
                    _ => b = b.with_skip_signature(true),
                }
                if let Some(t) = creds.get("AWS_SESSION_TOKEN") {
                    b = b.with_token(t);
                }
                let endpoint = creds.get("AWS_ENDPOINTS");
                if let Some(e) = endpoint {
                    b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
                }
                b = b
                    .with_unsigned_payload(payload_left_to_tls(endpoint))
                    .with_http_connector(UntrustedIsFinal);
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
        let local_dev = match &local {
            Some(dir) => folder_dev(url, dir)?,
            None => 0,
        };
        Ok(Store {
            inner,
            prefix,
            url: url.to_owned(),
            local,
            local_dev,
            creds: Arc::new(creds.clone()),
        })
    }

    /// Refuses a folder target whose folder vanished, or is no longer on
    /// the device it was opened on (a share unmounted under it): the next
    /// write would make it again, empty, or write to the disk beneath.
    fn present(&self) -> Result<(), BackupError> {
        match &self.local {
            Some(dir) if folder_dev(&self.url, dir)? != self.local_dev => Err(BackupError::Target {
                url: redact_urls(&self.url),
                reason: format!(
                    "the folder {} is no longer the target's (another file system is there now: \
                     a share unmounted?)",
                    dir.display()
                ),
            }),
            _ => Ok(()),
        }
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

    /// The error of call `op` on `path`; one whose text (or a cause's)
    /// holds a secret value or a URL's password is replaced by its text
    /// with those values as `***`.
    fn failed(&self, op: &'static str, path: &str) -> impl FnOnce(object_store::Error) -> BackupError {
        let path = path.to_owned();
        let creds = self.creds.clone();
        let url = redact_urls(&self.url);
        move |source| {
            if let Some(refusal) = untrusted_certificate(&source) {
                let ca = if creds.get("AWS_CERT").is_some() {
                    "the CA in AWS_CERT did not sign it: AWS_CERT must hold the CA (PEM) that did"
                } else {
                    "no AWS_CERT is given: put the CA (PEM) that signed it in the secret's AWS_CERT"
                };
                return BackupError::Target {
                    url,
                    reason: format!("{op} {path}: the server's certificate is not trusted ({ca}): {refusal}"),
                };
            }
            let mut chain = source.to_string();
            let mut cause = std::error::Error::source(&source);
            while let Some(c) = cause {
                chain.push_str(&format!(": {c}"));
                cause = c.source();
            }
            let clean = creds.redact(&chain);
            let source = if clean == chain {
                source
            } else {
                object_store::Error::Generic {
                    store: "backup target",
                    source: clean.into(),
                }
            };
            BackupError::Store { op, path, source }
        }
    }

    /// Proves the target answers with these credentials: lists its root.
    pub async fn check(&self) -> Result<(), BackupError> {
        self.list(super::format::BASE).await.map(|_| ())
    }

    /// Object `rel`'s bytes; `None` when it is not there.
    pub async fn read(&self, rel: &str) -> Result<Option<bytes::Bytes>, BackupError> {
        self.present()?;
        match self.inner.get(&self.key(rel)?).await {
            Ok(r) => r.bytes().await.map(Some).map_err(self.failed("read", rel)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.failed("read", rel)(e)),
        }
    }

    /// Writes object `rel` whole (one put: atomic on S3 and on a folder).
    pub async fn write(&self, rel: &str, data: Vec<u8>) -> Result<(), BackupError> {
        self.present()?;
        self.inner
            .put(&self.key(rel)?, PutPayload::from(data))
            .await
            .map(|_| ())
            .map_err(self.failed("write", rel))
    }

    /// When object `rel` was last written; `None` when it is not there.
    pub async fn modified(&self, rel: &str) -> Result<Option<std::time::SystemTime>, BackupError> {
        self.present()?;
        match self.inner.head(&self.key(rel)?).await {
            Ok(m) => Ok(Some(m.last_modified.into())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.failed("head", rel)(e)),
        }
    }

    /// Whether object `rel` is there.
    pub async fn exists(&self, rel: &str) -> Result<bool, BackupError> {
        self.modified(rel).await.map(|m| m.is_some())
    }

    /// The names one level below folder `rel` (objects and folders, like `ls`).
    pub async fn list(&self, rel: &str) -> Result<Vec<String>, BackupError> {
        self.present()?;
        let key = self.key(rel)?;
        let r = self
            .inner
            .list_with_delimiter(Some(&key))
            .await
            .map_err(self.failed("list", rel))?;
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
        self.present()?;
        match self.inner.delete(&self.key(rel)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.failed("delete", rel)(e)),
        }
    }

    /// Deletes every object below folder `rel`, and on a local folder target
    /// the folder itself (Longhorn lists a folder left behind as a backup
    /// volume whose `volume.cfg` is missing).
    pub async fn remove_all(&self, rel: &str) -> Result<(), BackupError> {
        use futures::TryStreamExt;
        self.present()?;
        let key = self.key(rel)?;
        let all: Vec<_> = self
            .inner
            .list(Some(&key))
            .try_collect()
            .await
            .map_err(self.failed("list", rel))?;
        for o in all {
            match self.inner.delete(&o.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.failed("delete", o.location.as_ref())(e)),
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

/// The device folder `dir` of target `url` is on; a folder that does not
/// exist (or is no folder) is refused, naming it.
fn folder_dev(url: &str, dir: &std::path::Path) -> Result<u64, BackupError> {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(m.dev()),
        Ok(_) => Err(BackupError::Target {
            url: redact_urls(url),
            reason: format!("{} is not a folder", dir.display()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(BackupError::TargetMissing {
            url: redact_urls(url),
            dir: dir.display().to_string(),
        }),
        Err(e) => Err(BackupError::Target {
            url: redact_urls(url),
            reason: format!("{}: {e}", dir.display()),
        }),
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
        std::fs::write(&f, "kind: Secret\ndata:\n  AWS_ACCESS_KEY_ID: '%%%'\n").expect("write");
        let e = Credentials::from_secret(&f)
            .expect_err("from_secret fails")
            .to_string();
        assert!(e.contains("AWS_ACCESS_KEY_ID is not base64"), "{e}");
        let one = Credentials::from_pairs([("AWS_ACCESS_KEY_ID".to_owned(), "a".to_owned())]);
        let e = Store::open("s3://bkt/", &one)
            .expect_err("open fails")
            .to_string();
        assert!(e.contains("without the other"), "{e}");
        // a file that is no Secret (any YAML mapping read as one without keys before)
        std::fs::write(&f, "root:*:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n").expect("write");
        let e = Credentials::from_secret(&f).expect_err("no Secret").to_string();
        assert!(e.contains("not a Kubernetes Secret"), "{e}");
    }

    #[test]
    fn urls_and_secret_values_are_redacted() {
        assert_eq!(
            redact_urls("error sending request for url (http://user:PASS@h:9000/b/k): refused"),
            "error sending request for url (http://user:***@h:9000/b/k): refused"
        );
        assert_eq!(
            redact_urls("https://tok@h/x https://h/y"),
            "https://***@h/x https://h/y"
        );
        assert_eq!(
            redact_urls("s3://backups@us-east-1/x"),
            "s3://backups@us-east-1/x"
        );
        assert_eq!(redact_urls("nfs://u:p@h:/x"), "nfs://u:***@h:/x");
        let c = Credentials::from_pairs([
            ("AWS_ACCESS_KEY_ID".to_owned(), "ak".to_owned()),
            ("AWS_SECRET_ACCESS_KEY".to_owned(), "sk-123".to_owned()),
            ("AWS_ENDPOINTS".to_owned(), "http://me:PASS@h:1".to_owned()),
        ]);
        assert_eq!(
            c.redact("sk-123 and PASS at http://me:PASS@h:1"),
            "*** and *** at http://me:***@h:1"
        );
        let e = c.check().expect_err("a password in the endpoint");
        assert!(e.contains("AWS_ENDPOINTS") && !e.contains("PASS"), "{e}");
        let e = Store::open("s3://bkt/", &c).expect_err("refused").to_string();
        assert!(!e.contains("PASS"), "{e}");
    }

    #[test]
    fn a_longhorn_caller_names_folders_only_under_the_folder_root() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("store")).expect("store");
        std::fs::create_dir_all(d.path().join("out")).expect("out");
        std::os::unix::fs::symlink(d.path().join("out"), root.join("link")).expect("symlink");
        let none = Caller::Longhorn { folder_root: None };
        let under = Caller::Longhorn {
            folder_root: Some(root.clone()),
        };
        let url = |p: &std::path::Path| format!("vfs://{}", p.display());
        let e = Target::checked(&url(&root.join("store")), &none)
            .expect_err("no root")
            .to_string();
        assert!(e.contains("no backupFolderRoot"), "{e}");
        Target::checked(&url(&root.join("store")), &under).expect("under the root");
        Target::checked(&url(&root.join("not-yet")), &under).expect("under the root, not made");
        for bad in [d.path().join("out"), root.join("link"), root.join("link/x")] {
            let e = Target::checked(&url(&bad), &under)
                .expect_err("outside")
                .to_string();
            assert!(
                e.contains("not under the node's backupFolderRoot"),
                "{bad:?}: {e}"
            );
        }
        let e = Target::checked(&format!("vfs://{}/../out", root.display()), &Caller::Admin)
            .expect_err("..")
            .to_string();
        assert!(e.contains("'..'"), "{e}");
        Target::checked(&url(&d.path().join("out")), &Caller::Admin).expect("the admin names any folder");
        Target::checked("s3://backups@us-east-1/x", &none).expect("S3 from Longhorn");
    }
}
