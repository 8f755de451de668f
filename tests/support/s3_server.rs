//! A real S3 server for backup tests and benchmarks: s3s-fs (S3's REST
//! API with SigV4 checks, objects as files) on 127.0.0.1, in-process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{S3, S3Request, S3Response, S3Result};

/// The access key the server takes.
pub const ACCESS_KEY: &str = "talon-test";
/// Its secret.
pub const SECRET_KEY: &str = "talon-test-secret";

/// A running server; it stops when dropped.
pub struct S3Server {
    pub addr: SocketAddr,
    /// Where its objects are files (`<root>/<bucket>/<key>`).
    pub root: PathBuf,
    task: tokio::task::JoinHandle<()>,
    /// Its own runtime, when it has one ([`S3Server::start_apart`]).
    runtime: Option<tokio::runtime::Runtime>,
    /// With TLS ([`S3Server::start_tls`]): the PEM of the CA its
    /// certificate is signed by (a secret's `AWS_CERT`).
    pub ca_pem: Option<String>,
    /// How the PUTs it took were signed.
    pub puts: Arc<Puts>,
    /// The TCP connections it accepted.
    pub accepted: Arc<AtomicU64>,
}

/// The PUTs a server took, by how SigV4 covered their bodies
/// (`x-amz-content-sha256`).
#[derive(Default)]
pub struct Puts {
    /// A SHA-256 of the body, checked by the server.
    pub signed: AtomicU64,
    /// `UNSIGNED-PAYLOAD`: the body left to the transport.
    pub unsigned: AtomicU64,
}

impl Puts {
    /// (signed, unsigned) so far.
    #[allow(dead_code, reason = "the TLS tests'")]
    pub fn counts(&self) -> (u64, u64) {
        (
            self.signed.load(Ordering::Relaxed),
            self.unsigned.load(Ordering::Relaxed),
        )
    }
}

impl S3Server {
    /// Serves `root` with bucket `bucket` made, on 127.0.0.1.
    pub async fn start(root: &Path, bucket: &str) -> S3Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::start_on(listener, root, bucket)
    }

    /// Serves `root` with bucket `bucket` made, on 127.0.0.1, on a runtime of
    /// its own (two worker threads), as a server in another process would:
    /// its request handling (SigV4 checks, MD5s, file writes) never runs on
    /// the caller's workers between the caller's own tasks. For benchmarks,
    /// where talon's side and Longhorn's program (another process) should
    /// meet the server alike.
    #[allow(dead_code, reason = "benches/backup.rs's; the tests share the runtime")]
    pub fn start_apart(root: &Path, bucket: &str) -> S3Server {
        Self::apart(root, bucket, None)
    }

    /// [`S3Server::start_apart`] over TLS, as [`S3Server::start_tls`].
    #[allow(dead_code, reason = "benches/backup.rs's")]
    pub fn start_apart_tls(root: &Path, bucket: &str) -> S3Server {
        Self::apart(root, bucket, Some(Self::tls()))
    }

    fn apart(root: &Path, bucket: &str, tls: Option<(tokio_rustls::TlsAcceptor, String)>) -> S3Server {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("s3-server")
            .enable_all()
            .build()
            .expect("the S3 server's runtime");
        let _in = runtime.enter();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        let mut server = Self::serve(listener, root, bucket, tls);
        drop(_in);
        server.runtime = Some(runtime);
        server
    }

    /// Serves `root` with bucket `bucket` made, on `listener` (one bound in
    /// another network namespace, say).
    pub fn start_on(listener: tokio::net::TcpListener, root: &Path, bucket: &str) -> S3Server {
        Self::serve(listener, root, bucket, None)
    }

    /// Serves `root` with bucket `bucket` made, on 127.0.0.1 over TLS: its
    /// certificate (for 127.0.0.1) signed by a CA made here, whose PEM is
    /// [`S3Server::ca_pem`] (the secret's `AWS_CERT`).
    #[allow(dead_code, reason = "tests/backupstore.rs's")]
    pub async fn start_tls(root: &Path, bucket: &str) -> S3Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::serve(listener, root, bucket, Some(Self::tls()))
    }

    /// A TLS acceptor with a certificate for 127.0.0.1, and the PEM of the
    /// CA (made here) that signed it.
    fn tls() -> (tokio_rustls::TlsAcceptor, String) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
        use tokio_rustls::rustls;
        let mut ca = CertificateParams::new(Vec::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "talon test S3 CA");
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_pem = ca.self_signed(&ca_key).expect("CA").pem();
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf = CertificateParams::new(Vec::new()).expect("params");
        leaf.subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
        let key = KeyPair::generate().expect("key");
        let cert = leaf.signed_by(&key, &issuer).expect("certificate");
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_no_client_auth()
                .with_single_cert(
                    vec![cert.der().clone()],
                    rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der"),
                )
                .expect("TLS config");
        (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca_pem)
    }

    fn serve(
        listener: tokio::net::TcpListener,
        root: &Path,
        bucket: &str,
        tls: Option<(tokio_rustls::TlsAcceptor, String)>,
    ) -> S3Server {
        std::fs::create_dir_all(root.join(bucket)).expect("bucket folder");
        let fs = s3s_fs::FileSystem::new(root).expect("s3s-fs root");
        let puts = Arc::new(Puts::default());
        let mut b = S3ServiceBuilder::new(AwsDelimiter(fs, puts.clone()));
        b.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = b.build();
        let addr = listener.local_addr().expect("addr");
        let (tls, ca_pem) = tls.unzip();
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = accepted.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                counted.fetch_add(1, Ordering::Relaxed);
                let (service, tls) = (service.clone(), tls.clone());
                tokio::spawn(async move {
                    let conn = ConnBuilder::new(TokioExecutor::new());
                    let _ = match tls {
                        None => conn.serve_connection(TokioIo::new(socket), service).await,
                        Some(tls) => match tls.accept(socket).await {
                            Ok(socket) => conn.serve_connection(TokioIo::new(socket), service).await,
                            Err(_) => return,
                        },
                    };
                });
            }
        });
        S3Server {
            addr,
            root: root.to_owned(),
            task,
            runtime: None,
            ca_pem,
            puts,
            accepted,
        }
    }

    /// Its endpoint URL.
    pub fn endpoint(&self) -> String {
        match self.ca_pem {
            Some(_) => format!("https://{}", self.addr),
            None => format!("http://{}", self.addr),
        }
    }

    /// A secret manifest with its credentials (or `secret` as the secret key).
    pub fn secret_manifest(&self, secret: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s3\nstringData:\n  AWS_ACCESS_KEY_ID: {ACCESS_KEY}\n  AWS_SECRET_ACCESS_KEY: {secret}\n  AWS_ENDPOINTS: {}\n{}",
            self.endpoint(),
            self.ca_pem.as_ref().map_or(String::new(), |pem| {
                // a block scalar: the PEM's lines, indented
                let lines: String = pem.lines().map(|l| format!("    {l}\n")).collect();
                format!("  AWS_CERT: |\n{lines}")
            })
        )
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// s3s-fs 0.14.1 with one S3 rule it misses: an empty `delimiter` is no
/// delimiter (AWS's behaviour; s3s-fs panics on it). Longhorn's backupstore
/// lists with `delimiter=` before it deletes a prefix. Every other call goes
/// to s3s-fs as it is.
struct AwsDelimiter(s3s_fs::FileSystem, Arc<Puts>);

macro_rules! aws_delimiter {
    ($($name:ident: $input:ty => $output:ty;)*) => {
        #[async_trait::async_trait]
        impl S3 for AwsDelimiter {
            $(
                async fn $name(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.0.$name(req).await
                }
            )*

            async fn put_object(
                &self,
                req: S3Request<PutObjectInput>,
            ) -> S3Result<S3Response<PutObjectOutput>> {
                let unsigned = req
                    .headers
                    .get("x-amz-content-sha256")
                    .is_some_and(|v| v.as_bytes().starts_with(b"UNSIGNED-PAYLOAD"));
                let count = if unsigned { &self.1.unsigned } else { &self.1.signed };
                count.fetch_add(1, Ordering::Relaxed);
                self.0.put_object(req).await
            }

            async fn list_objects(
                &self,
                mut req: S3Request<ListObjectsInput>,
            ) -> S3Result<S3Response<ListObjectsOutput>> {
                req.input.delimiter = req.input.delimiter.filter(|d| !d.is_empty());
                self.0.list_objects(req).await
            }

            async fn list_objects_v2(
                &self,
                mut req: S3Request<ListObjectsV2Input>,
            ) -> S3Result<S3Response<ListObjectsV2Output>> {
                req.input.delimiter = req.input.delimiter.filter(|d| !d.is_empty());
                self.0.list_objects_v2(req).await
            }
        }
    };
}

aws_delimiter! {
    create_bucket: CreateBucketInput => CreateBucketOutput;
    copy_object: CopyObjectInput => CopyObjectOutput;
    delete_object: DeleteObjectInput => DeleteObjectOutput;
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
    get_object: GetObjectInput => GetObjectOutput;
    head_bucket: HeadBucketInput => HeadBucketOutput;
    head_object: HeadObjectInput => HeadObjectOutput;
    list_buckets: ListBucketsInput => ListBucketsOutput;
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
    upload_part: UploadPartInput => UploadPartOutput;
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
}
