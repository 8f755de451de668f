//! The real-kernel guest tests: runs `tests/vm/run.sh` with the `talon` binary that cargo built for
//! this test, which boots Debian's 6.1 kernel under QEMU and runs every step in `tests/vm/steps/`.
//!
//! ```text
//!   cargo nextest ── vm_guest_steps ── bash tests/vm/run.sh [--steps $TALON_VM_STEPS] <CARGO_BIN_EXE_talon>
//!                                          └─ apt-get download / dpkg -x (cached) ─ initramfs ─ QEMU ─ steps
//! ```
//!
//! SKIPs (with the reason on stderr) when not root or when run.sh reports it cannot run here
//! (exit 77: no apt sources, download failed, a host tool missing). `TALON_VM_STEPS=a,b` selects
//! steps; the run.sh knobs (`TALON_VM_CACHE`, `TALON_VM_TIMEOUT`, ...) pass through.
//!
//! `longhorn_client` (ignored: not a test of its own) is a small client of Longhorn's
//! instance-manager protocol on talon's protos, which the `longhorn-frontend` step runs on the host
//! and in the guest (this test binary, handed over as `TALON_VM_LONGHORN_CLIENT`):
//! `TALON_LH_ADDR=ip:base TALON_LH_CALL="<op> args.." <this binary> --ignored --exact longhorn_client`,
//! answers on lines `LH key=value`; see [`longhorn_call`].

#[path = "support/longhorn_req.rs"]
mod longhorn_req;

use std::path::Path;
use std::process::Command;

#[test]
fn vm_guest_steps() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP vm_guest_steps: needs root (apt-get download, QEMU guest, host-side targets)");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm/run.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script);
    if let Ok(steps) = std::env::var("TALON_VM_STEPS")
        && !steps.is_empty()
    {
        cmd.args(["--steps", &steps]);
    }
    cmd.arg(env!("CARGO_BIN_EXE_talon"));
    if let Ok(me) = std::env::current_exe() {
        cmd.env("TALON_VM_LONGHORN_CLIENT", me);
    }
    let out = cmd.output().expect("run tests/vm/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(77) {
        let reason = stdout
            .lines()
            .find(|l| l.starts_with("SKIP"))
            .unwrap_or("SKIP vm-tests: run.sh exit 77");
        eprintln!(
            "SKIP vm_guest_steps: {}",
            reason.trim_start_matches("SKIP vm-tests: ")
        );
        return;
    }
    println!("{stdout}");
    for (step, reason) in stdout
        .lines()
        .filter_map(|l| l.strip_prefix("vm: step ")?.split_once(" SKIP: "))
    {
        eprintln!("SKIP vm_guest_steps/{step}: {reason}");
    }
    eprintln!("{stderr}");
    let summary = stdout.lines().rev().find(|l| l.starts_with("vm-tests:"));
    assert!(
        out.status.success(),
        "vm guest tests failed: {}",
        summary.unwrap_or("no summary line")
    );
    let summary = summary.expect("run.sh prints a vm-tests summary line");
    assert!(summary.ends_with(" 0 failed"), "{summary}");
    assert!(
        !summary.starts_with("vm-tests: 0 passed"),
        "no step ran: {summary}"
    );
}

/// The Longhorn client the `longhorn-frontend` step runs (see the module doc); without
/// `TALON_LH_CALL` it says so and does nothing.
#[test]
#[ignore = "a tool of the longhorn-frontend guest step, not a test of its own"]
fn longhorn_client() {
    let (Ok(addr), Ok(call)) = (std::env::var("TALON_LH_ADDR"), std::env::var("TALON_LH_CALL")) else {
        eprintln!(
            "SKIP longhorn_client: TALON_LH_ADDR and TALON_LH_CALL are not set (a tool of tests/vm/steps/longhorn-frontend)"
        );
        return;
    };
    let addr: std::net::SocketAddr = addr.parse().expect("TALON_LH_ADDR is ip:port");
    let args: Vec<String> = call.split_whitespace().map(str::to_owned).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(longhorn_call(addr, &args));
}

/// One call, `args[0]` the operation (waits are up to 120 s: the guest runs under TCG):
/// - `disk NAME PATH`: DiskCreate (aio);
/// - `replica NAME VOLUME DISK SIZE`: InstanceCreate, running; `LH port=<port_start>`;
/// - `engine NAME VOLUME SIZE R1=IP:PORT,R2=IP:PORT`: InstanceCreate, running; `LH port=<port>`;
/// - `frontend NAME VOLUME ENGINE IP:PORT SIZE`: InstanceCreate, running; `LH endpoint=<endpoint>`;
/// - `delete TYPE NAME [cleanup]`: InstanceDelete, then gone from InstanceGet; `LH gone=NAME`;
/// - `switchover NAME IP:PORT ENGINE PHASE`: InstanceSwitchOverTarget of engine-frontend NAME;
///   `LH switched=PHASE`, or `LH failed=<code>: <message>` (the manager asks again);
/// - `get TYPE NAME`: InstanceGet; `LH engine=<engine> active=<active path> paths=<ip:port/ana,..>`;
/// - `up`: whether the node's instance service takes a connection now (one try, 2 s at most):
///   `LH up=yes|no`.
async fn longhorn_call(base: std::net::SocketAddr, args: &[String]) {
    use std::time::{Duration, Instant};
    use talon::proto::imrpc::{
        self, disk_service_client::DiskServiceClient, instance_service_client::InstanceServiceClient,
    };
    use tonic::transport::Channel;

    let channel = |i: u16| async move {
        let url = format!("http://{}:{}", base.ip(), base.port() + i);
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            match Channel::from_shared(url.clone()).expect("url").connect().await {
                Ok(c) => return c,
                Err(e) if Instant::now() > until => panic!("no Longhorn service at {url}: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    };
    let v2 = imrpc::DataEngine::V2 as i32;
    let get = |ty: &str, name: &str| imrpc::InstanceGetRequest {
        name: name.into(),
        r#type: ty.into(),
        data_engine: v2,
        ..Default::default()
    };
    let running = |mut c: InstanceServiceClient<Channel>, ty: String, name: String| async move {
        let until = Instant::now() + Duration::from_secs(120);
        let mut last = String::new();
        while Instant::now() < until {
            if let Ok(r) = c.instance_get(get(&ty, &name)).await
                && let Some(s) = r.into_inner().status
            {
                if s.state == "running" {
                    return s;
                }
                last = format!("{} {}", s.state, s.error_msg);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{ty} {name} is not running after 120 s: {last}");
    };
    let create = longhorn_req::create;
    let a = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("{args:?}: argument {i} is missing"))
    };
    let size = |i: usize| a(i).parse::<u64>().expect("size in bytes");
    match a(0) {
        "disk" => {
            DiskServiceClient::new(channel(2).await)
                .disk_create(imrpc::DiskCreateRequest {
                    disk_type: imrpc::DiskType::Block as i32,
                    disk_name: a(1).into(),
                    disk_path: a(2).into(),
                    disk_driver: "aio".into(),
                    ..Default::default()
                })
                .await
                .expect("DiskCreate");
            println!("LH disk={}", a(1));
        }
        "replica" => {
            let mut c = InstanceServiceClient::new(channel(3).await);
            let sp = imrpc::SpdkInstanceSpec {
                disk_name: a(3).into(),
                size: size(4),
                ..Default::default()
            };
            c.instance_create(create(a(1), "replica", a(2), sp))
                .await
                .expect("InstanceCreate replica");
            let s = running(c, "replica".into(), a(1).into()).await;
            println!("LH port={}", s.port_start);
        }
        "engine" => {
            let mut c = InstanceServiceClient::new(channel(3).await);
            let map = a(4)
                .split(',')
                .map(|kv| {
                    let (k, v) = kv.split_once('=').expect("replica=ip:port");
                    (k.to_owned(), v.to_owned())
                })
                .collect();
            let sp = imrpc::SpdkInstanceSpec {
                replica_address_map: map,
                size: size(3),
                ..Default::default()
            };
            c.instance_create(create(a(1), "engine", a(2), sp))
                .await
                .expect("InstanceCreate engine");
            let s = running(c, "engine".into(), a(1).into()).await;
            println!("LH port={}", s.port_start);
        }
        "frontend" => {
            let mut c = InstanceServiceClient::new(channel(3).await);
            let mut req = create(
                a(1),
                "engine-frontend",
                a(2),
                imrpc::SpdkInstanceSpec {
                    size: size(5),
                    // Longhorn's blockdev frontend: the kernel's NVMe/TCP initiator attaches
                    frontend: "spdk-tcp-blockdev".into(),
                    ..Default::default()
                },
            );
            if let Some(spec) = req.spec.as_mut() {
                spec.engine_name = a(3).into();
                spec.target_address = a(4).into();
            }
            c.instance_create(req)
                .await
                .expect("InstanceCreate engine-frontend");
            let s = running(c, "engine-frontend".into(), a(1).into()).await;
            println!("LH endpoint={}", s.endpoint);
        }
        "delete" => {
            let mut c = InstanceServiceClient::new(channel(3).await);
            c.instance_delete(imrpc::InstanceDeleteRequest {
                name: a(2).into(),
                r#type: a(1).into(),
                cleanup_required: args.get(3).is_some_and(|x| x == "cleanup"),
                data_engine: v2,
                ..Default::default()
            })
            .await
            .expect("InstanceDelete");
            let until = Instant::now() + Duration::from_secs(120);
            loop {
                match c.instance_get(get(a(1), a(2))).await {
                    Err(e) if e.code() == tonic::Code::NotFound => break,
                    other => assert!(
                        Instant::now() < until,
                        "{} {} is not gone after 120 s: {other:?}",
                        a(1),
                        a(2)
                    ),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            println!("LH gone={}", a(2));
        }
        "switchover" => {
            let mut c = InstanceServiceClient::new(channel(3).await);
            let r = c
                .instance_switch_over_target(imrpc::InstanceSwitchOverTargetRequest {
                    data_engine: v2,
                    name: a(1).into(),
                    r#type: "engine-frontend".into(),
                    target_address: a(2).into(),
                    engine_name: a(3).into(),
                    switchover_phase: a(4).into(),
                })
                .await;
            match r {
                Ok(_) => println!("LH switched={}", a(4)),
                Err(e) => println!("LH failed={:?}: {}", e.code(), e.message()),
            }
        }
        "get" => {
            let mut c = InstanceServiceClient::new(channel(3).await);
            let s = c
                .instance_get(get(a(1), a(2)))
                .await
                .expect("InstanceGet")
                .into_inner()
                .status
                .unwrap_or_default();
            let paths: Vec<String> = s
                .paths
                .iter()
                .map(|p| format!("{}:{}/{}", p.target_ip, p.target_port, p.ana_state))
                .collect();
            println!(
                "LH engine={} active={} paths={}",
                s.engine_name,
                s.active_path,
                paths.join(",")
            );
        }
        "up" => {
            let url = format!("http://{}:{}", base.ip(), base.port() + 3);
            let endpoint = Channel::from_shared(url).expect("url");
            let up = matches!(
                tokio::time::timeout(Duration::from_secs(2), endpoint.connect()).await,
                Ok(Ok(_))
            );
            println!("LH up={}", if up { "yes" } else { "no" });
        }
        other => panic!("unknown operation {other:?}"),
    }
}

/// The `nfs-backup` step's client, run in the guest against the guest kernel's nfsd
/// (`TALON_NFS_TARGET`, an `nfs://` target): talon mounts the share itself (mount(2), no
/// mount.nfs), backs a 16 MiB image up in full and then incrementally (1 block uploaded),
/// restores both and compares them byte for byte, deletes the first (the second still
/// restores), refuses a path the server does not have and a port nobody answers with
/// nothing left mounted, and
/// unmounts what it mounted; the share is mounted nosuid,nodev,noexec. Prints `NFS ok`
/// at the end.
#[test]
#[ignore = "a tool of the nfs-backup guest step, not a test of its own"]
fn nfs_backup_client() {
    let Ok(target) = std::env::var("TALON_NFS_TARGET") else {
        eprintln!(
            "SKIP nfs_backup_client: TALON_NFS_TARGET is not set (a tool of tests/vm/steps/nfs-backup)"
        );
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(nfs_round_trip(&target));
}

async fn nfs_round_trip(target: &str) {
    use std::os::unix::fs::FileExt;
    use talon::backupstore::{BackupRequest, Credentials, Progress, SparseImage, Store, nfs, ops};
    const MIB: u64 = 1 << 20;
    let size = 16 * MIB;
    let dir = tempfile::tempdir().expect("tempdir");
    let pattern = |seed: u8, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    };
    let image = |name: &str, writes: &[(u64, Vec<u8>)]| {
        let p = dir.path().join(name);
        let f = std::fs::File::create(&p).expect("create");
        f.set_len(size).expect("set_len");
        for (at, d) in writes {
            f.write_all_at(d, *at).expect("write_all_at");
        }
        SparseImage::open(&p, 0, size).expect("open")
    };
    let request = |name: &str, snap: &str| BackupRequest::v2("vol", name, snap, size);
    let restored = |name: &str| dir.path().join(format!("{name}.out"));
    let store = Store::open(target, &Credentials::none()).unwrap_or_else(|e| panic!("open {target}: {e}"));
    let mounted = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    let line = mounted
        .lines()
        .find(|l| l.contains(" nfs4 ") && l.contains(nfs::DEFAULT_MOUNT_ROOT))
        .unwrap_or_else(|| panic!("no NFS mount under {}: {mounted}", nfs::DEFAULT_MOUNT_ROOT));
    println!("NFS mounted: {line}");
    // every share talon mounts is nosuid,nodev,noexec, whatever its options say
    let opts: Vec<&str> = line.split(' ').nth(3).unwrap_or_default().split(',').collect();
    for flag in ["nosuid", "nodev", "noexec"] {
        assert!(
            opts.contains(&flag),
            "the share is mounted without {flag}: {line}"
        );
    }

    // backup-one: 6 MiB at 2 MiB (blocks 1-3) and 2 MiB at 10 MiB (block 5)
    let one = [
        (2 * MIB, pattern(1, 6 * MIB as usize)),
        (10 * MIB, pattern(2, 2 * MIB as usize)),
    ];
    let full = image("one.img", &one);
    let p = Progress::default();
    let (b1, st1) = ops::create(&store, &request("backup-one", "s1"), &full, None, &p)
        .await
        .expect("backup-one");
    assert_eq!((st1.blocks_uploaded, b1.blocks.len()), (4, 4), "{st1:?}");
    // backup-two: 1 MiB changed inside block 2
    let change = (4 * MIB + 512 * 1024, pattern(3, MIB as usize));
    let delta = image("delta.img", std::slice::from_ref(&change));
    let (b2, st2) = ops::create(&store, &request("backup-two", "s2"), &delta, Some(&b1), &p)
        .await
        .expect("backup-two");
    assert!(b2.is_incremental && b2.complete(), "{b2:?}");
    assert_eq!(st2.blocks_uploaded, 1, "only the changed block: {st2:?}");
    let mut two = std::fs::read(&full.file).expect("read");
    two[change.0 as usize..change.0 as usize + change.1.len()].copy_from_slice(&change.1);
    for (name, want) in [
        ("backup-one", std::fs::read(&full.file).expect("read")),
        ("backup-two", two.clone()),
    ] {
        let r = ops::restore_to_file(&store, "vol", name, &restored(name), 0, &p)
            .await
            .unwrap_or_else(|e| panic!("restore {name}: {e}"));
        assert_eq!(r.size, size);
        assert!(
            std::fs::read(restored(name)).expect("read") == want,
            "{name} restored from NFS differs"
        );
    }
    let listed: Vec<String> = ops::complete_backups(&store, "vol")
        .await
        .expect("complete_backups")
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(listed, ["backup-one", "backup-two"]);
    ops::delete(&store, "vol", "backup-one")
        .await
        .expect("delete backup-one");
    let r = restored("again");
    ops::restore_to_file(&store, "vol", "backup-two", &r, 0, &p)
        .await
        .expect("restore backup-two after backup-one's delete");
    assert!(
        std::fs::read(&r).expect("read") == two,
        "backup-two after the delete"
    );
    println!("NFS backups: one {st1:?}, two {st2:?}");

    // a path the server does not have: a clear error, nothing mounted
    let missing = target.replace("/store", "/missing");
    let e = Store::open(&missing, &Credentials::none()).expect_err("a path the server does not have");
    assert!(e.to_string().contains("mounting NFS share"), "{e}");
    println!("NFS refused: {e}");
    // a server that does not answer where it is asked (port 1): refused in bounded time
    let closed = format!(
        "{}?nfsOptions=nfsvers=4.2,port=1,soft,timeo=10,retrans=1",
        target.replace("/store", "/closed")
    );
    let t0 = std::time::Instant::now();
    let e = Store::open(&closed, &Credentials::none()).expect_err("a closed port");
    assert!(e.to_string().contains("mounting NFS share"), "{e}");
    println!("NFS unreachable, refused after {:?}: {e}", t0.elapsed());

    let left = nfs::unmount_all();
    assert!(left.is_empty(), "{left:?}");
    let mounted = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    assert!(
        !mounted.contains(nfs::DEFAULT_MOUNT_ROOT),
        "left mounted: {mounted}"
    );
    println!("NFS ok");
}
