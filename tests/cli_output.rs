//! The CLI reads as people write (process test, real daemon, real tgtd):
//! sizes in binary units in tables, `get volume NAME` with its status beside
//! its spec, `-o json` with a `status`, `--watch` a line per change until the volume is
//! deleted, waits that say what they wait for, and a wait that fails at once with its cause.
//!
//! ```text
//!   talon serve (node v1 on 127.0.0.1:<free port>) <── talon volume create / get / get volume NAME
//! ```

mod tgt_common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use talon::client::Client;
use talon::runtime::testing::eventually;
use tgt_common::{free_port, ready};

fn talon(socket: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_talon"))
        .env("TALON_SOCKET", socket)
        // the default log level, whatever the environment sets
        .env_remove("TALON_LOG")
        .args(args)
        .output()
        .expect("run talon");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The daemon, stopped with its tgtd when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0.id() as i32), Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

impl Daemon {
    /// `talon serve` at the default log level on a V1 node (127.0.0.1, a free iSCSI port)
    /// without SPDK, whatever the environment has, with `more` appended to its config; its
    /// log (stderr) goes to `log`. Returns once its API answers.
    async fn start(dir: &Path, more: &str, log: Stdio) -> Daemon {
        std::fs::write(
            dir.join("talon.yaml"),
            format!(
                "node: {{ engine: auto, listenAddress: 127.0.0.1, iscsiPort: {} }}\n{more}",
                free_port()
            ),
        )
        .expect("config");
        let socket = dir.join("run/talon.sock");
        let daemon = Daemon(
            Command::new(env!("CARGO_BIN_EXE_talon"))
                .arg("--socket")
                .arg(&socket)
                .args(["serve", "--stop-targets-on-exit", "--data-dir"])
                .arg(dir.join("data"))
                .arg("--run-dir")
                .arg(dir.join("run"))
                .arg("--config")
                .arg(dir.join("talon.yaml"))
                // no SPDK here, whatever the environment has: V2 is unavailable
                .env_remove("TALON_SPDK_DIR")
                .env_remove("TALON_LOG")
                .arg("--spdk-tgt")
                .arg(dir.join("no/spdk_tgt"))
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn talon"),
        );
        eventually("the API", Duration::from_secs(30), || async {
            Client::connect_unix(&socket).await.ok()
        })
        .await;
        daemon
    }

    /// Stops the daemon (SIGTERM) and waits until it has exited.
    fn stop(mut self) {
        let _ = kill(Pid::from_raw(self.0.id() as i32), Signal::SIGTERM);
        let status = self.0.wait().expect("wait for talon");
        // reaped: no signal from Drop to a pid that may be another process's by then
        std::mem::forget(self);
        assert!(status.success(), "talon serve stops cleanly: {status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_status_and_waits_read_as_people_write_them() {
    const TEST: &str = "sizes_status_and_waits_read_as_people_write_them";
    if !ready(TEST) {
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path();
    // `stuck`: a V2 volume on a node without SPDK, from the config (the API refuses one)
    let _daemon = Daemon::start(
        dir,
        "volumes:\n  stuck: { sizeBytes: 1048576, engine: v2 }\n",
        Stdio::null(),
    )
    .await;
    let socket = dir.join("run/talon.sock");

    let (ok, _, err) = talon(&socket, &["volume", "create", "docs", "--size", "1536MiB"]);
    assert!(ok, "volume create: {err}");

    // tables: sizes in binary units
    let (ok, out, err) = talon(&socket, &["get", "volume"]);
    assert!(ok, "{err}");
    assert!(out.contains("1.5 GiB"), "SIZE in GiB: {out}");
    assert!(!out.contains("1610612736"), "no raw byte count: {out}");
    // the engine as asked and as resolved, the same in every view
    assert!(out.contains("auto (v1)"), "{out}");
    let (ok, list, err) = talon(&socket, &["volume", "list"]);
    assert!(ok, "{err}");
    assert!(list.contains("1.5 GiB") && list.contains("auto (v1)"), "{list}");
    assert_eq!(out, list, "get volume and volume list are one table");
    // -o table: a table, the volume's row of it
    let (ok, out, err) = talon(&socket, &["get", "volume", "docs", "-o", "table"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.len() == 2 && lines[0].contains("NAME") && lines[0].contains("ENGINE"),
        "{out}"
    );
    assert!(
        lines[1].contains("docs") && lines[1].contains("auto (v1)"),
        "{out}"
    );
    let (ok, out, err) = talon(&socket, &["get", "enginestatus"]);
    assert!(ok, "{err}");
    assert!(out.contains("1.5 GiB"), "{out}");

    // get volume NAME: spec and status side by side
    let (ok, out, err) = talon(&socket, &["get", "volume", "docs"]);
    assert!(ok, "{err}");
    for want in [
        "Name:      docs",
        "Spec:      1.5 GiB, 1 replica(s), engine auto (v1)",
        "State:     ready (v1), serving 1.5 GiB",
        "Exports:   iscsi 127.0.0.1:",
        "Attached:  no",
    ] {
        assert!(out.contains(want), "{want:?} in:\n{out}");
    }
    let (ok, out, err) = talon(&socket, &["get", "volume", "docs", "-o", "json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["spec"]["sizeBytes"], 1_610_612_736u64);
    assert_eq!(v["status"]["engine"]["state"], "ready", "{v}");
    assert_eq!(v["metadata"]["id"], "docs");

    // --from-snapshot: an unknown snapshot or a malformed source refused naming it, before
    // anything is stored; --size is needed only without it
    let (ok, _, err) = talon(
        &socket,
        &["volume", "create", "copy", "--from-snapshot", "docs/nope"],
    );
    assert!(!ok, "no such snapshot");
    assert!(
        err.contains("volume copy: snapshot \"nope\" of volume \"docs\" not found"),
        "{err}"
    );
    let (ok, _, err) = talon(&socket, &["volume", "create", "copy", "--from-snapshot", "docs"]);
    assert!(!ok && err.contains("is not <volume>/<snapshot>"), "{err}");
    let (ok, _, err) = talon(&socket, &["volume", "create", "copy"]);
    assert!(!ok && err.contains("--size"), "a size or a snapshot: {err}");

    // --watch: a line now and one per change, until the volume is deleted
    let mut watch = Command::new(env!("CARGO_BIN_EXE_talon"))
        .env("TALON_SOCKET", &socket)
        .args(["get", "volume", "docs", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("talon get volume --watch");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = watch.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // its first watch line is printed once it is subscribed: only then delete
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.ends_with("  docs ready")) {
        let l = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("the watch's line ({e}); so far: {lines:?}"));
        lines.push(l);
    }

    // a delete waits (telling what for) until the volume is gone
    let (ok, _, err) = talon(&socket, &["volume", "delete", "docs"]);
    assert!(ok, "volume delete: {err}");
    let (ok, out, err) = talon(&socket, &["get", "volume"]);
    assert!(ok, "{err}");
    assert!(!out.contains("docs"), "deleted when the CLI returns: {out}");
    let status = tokio::task::spawn_blocking(move || {
        let status = watch.wait();
        reader.join().expect("reader");
        status
    })
    .await
    .expect("join")
    .expect("watch status");
    lines.extend(rx.try_iter());
    let lines = lines.join("\n");
    assert!(status.success(), "the watch ends with the volume: {lines}");
    assert!(
        lines.starts_with("Name:      docs\n"),
        "the description first: {lines}"
    );
    assert!(
        lines
            .lines()
            .last()
            .is_some_and(|l| l.ends_with("  docs deleted")),
        "and its end: {lines}"
    );

    // a V2 volume on a node without SPDK is refused at create, naming why; nothing is left
    let (ok, _, err) = talon(
        &socket,
        &["volume", "create", "never", "--size", "1MiB", "--engine", "v2"],
    );
    assert!(!ok, "a V2 volume on a node without SPDK cannot be served");
    assert!(
        err.contains("volume never: engine v2 needs SPDK, and this node cannot serve V2 volumes")
            && err.contains("spdk_tgt was not found"),
        "refused at once, saying why: {err}"
    );
    let (ok, out, err) = talon(&socket, &["volume", "list"]);
    assert!(ok, "{err}");
    assert!(!out.contains("never"), "nothing half-made: {out}");
    // `volume wait` says what it waits for while it waits, and why it gave up
    let (ok, _, err) = talon(&socket, &["volume", "wait", "stuck", "--timeout", "1"]);
    assert!(!ok, "never exported");
    assert!(
        err.contains("waiting: stuck creating (waiting for spdk_tgt"),
        "the wait tells what it waits for: {err}"
    );
    assert!(err.contains("target spdk failed"), "and why it gave up: {err}");
    // a delete says only what it sees after the call, not the state before it (a replay)
    let (ok, _, err) = talon(&socket, &["volume", "delete", "stuck"]);
    assert!(ok, "volume delete: {err}");
    assert!(
        !err.contains("creating"),
        "no line of the state before the delete: {err}"
    );
}

/// The log is quiet and says what operators change (issue 54): at the default level a successful
/// CLI call writes nothing on stderr, the daemon writes no DEBUG line (the HTTP and JSON-RPC
/// libraries wrote one per connection and frame), and each change is an info line naming its
/// object. The newcomer's views beside it: a disk on a node without SPDK says it is unused, list
/// verbs take `-o`, `volume get` and `get volume` print one document, sizes in errors read in
/// binary units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_quiet_and_names_each_change() {
    const TEST: &str = "the_log_is_quiet_and_names_each_change";
    if !ready(TEST) {
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path();
    let log_path = dir.join("talon.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    // the quick start's disk: a file for V2's lvstore
    let daemon = Daemon::start(
        dir,
        "disks:\n  disk0: { path: disk0.img, sizeBytes: 1073741824 }\n",
        Stdio::from(log),
    )
    .await;
    let socket = dir.join("run/talon.sock");

    // a call that waits says what it waits for, a line per state it sees, and nothing else
    let (ok, _, err) = talon(&socket, &["volume", "create", "quiet", "--size", "64MiB"]);
    assert!(ok, "volume create: {err}");
    assert!(
        err.lines()
            .all(|l| l.starts_with("waiting: EngineStatus quiet: ")),
        "only what it waits for: {err}"
    );
    for args in [
        &["volume", "list"][..],
        &["volume", "get", "quiet"],
        &["get", "volume", "quiet"],
        &["node", "info"],
    ] {
        let (ok, _, err) = talon(&socket, args);
        assert!(ok, "talon {args:?}: {err}");
        assert_eq!(
            err, "",
            "talon {args:?} writes nothing on stderr when it succeeds"
        );
    }

    // a disk no engine here uses says so, and why (it is not waiting for anything)
    let (ok, out, err) = talon(&socket, &["disk", "list", "-o", "json"]);
    assert!(ok, "{err}");
    let disks: serde_json::Value = serde_json::from_str(&out).expect("json");
    let status = &disks[0]["status"];
    assert_eq!(status["state"], "unused", "{disks:#}");
    let msg = status["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("only V2 volumes use disks") && msg.contains("spdk_tgt was not found"),
        "{msg}"
    );
    let (ok, out, err) = talon(&socket, &["disk", "list"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("NAME") && out.contains("disk0") && out.contains("unused"),
        "{out}"
    );
    let (ok, out, err) = talon(&socket, &["snapshot", "list", "-o", "json"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "[]");
    let (ok, out, err) = talon(&socket, &["node", "info", "-o", "table"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("FIELD") && out.contains("engine v1"),
        "a table: {out}"
    );
    assert!(!out.contains("engines:"), "not YAML: {out}");
    // one document, whichever verb asks
    let (ok, a, err) = talon(&socket, &["volume", "get", "quiet", "-o", "json"]);
    assert!(ok, "{err}");
    let (ok, b, err) = talon(&socket, &["get", "volume", "quiet", "-o", "json"]);
    assert!(ok, "{err}");
    let (a, b): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(&a).expect("json"),
        serde_json::from_str(&b).expect("json"),
    );
    assert_eq!(a, b);
    assert_eq!(a["metadata"]["id"], "quiet");
    // sizes in errors: binary units, and the exact count
    let (ok, _, err) = talon(&socket, &["volume", "expand", "quiet", "--size", "32MiB"]);
    assert!(!ok);
    assert!(
        err.contains("is 64 MiB (67108864 bytes); it can only grow, not shrink to 32 MiB (33554432 bytes)"),
        "{err}"
    );
    let (ok, _, err) = talon(&socket, &["volume", "expand", "quiet", "--size", "128MiB"]);
    assert!(ok, "{err}");
    let (ok, _, err) = talon(&socket, &["volume", "delete", "quiet"]);
    assert!(ok, "{err}");
    daemon.stop();

    let log = std::fs::read_to_string(&log_path).expect("the daemon's log");
    let debug: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" DEBUG ") || l.contains(" TRACE "))
        .collect();
    assert!(
        debug.is_empty(),
        "no DEBUG line at the default level:\n{}",
        debug.join("\n")
    );
    for change in [
        "volume quiet created: 64 MiB, 1 replica(s), engine auto",
        "volume quiet expanded to 128 MiB",
        "volume quiet deleted",
    ] {
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(change)).collect();
        assert_eq!(lines.len(), 1, "{change:?} once:\n{log}");
        assert!(lines[0].contains(" INFO "), "{}", lines[0]);
    }
    assert!(
        !log.lines()
            .any(|l| l.contains("volume quiet") && (l.contains("list") || l.contains("get"))),
        "reads are not logged:\n{log}"
    );
}

/// The Longhorn gRPC bounds are flags of `talon serve` (issue 31); values that would disable a
/// bound, or close live connections between two pings, are refused naming the flag, before
/// anything starts.
#[test]
fn longhorn_bounds_are_flags_and_nonsense_is_refused_naming_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("talon.sock");
    let (ok, help, err) = talon(&socket, &["serve", "--help"]);
    assert!(ok, "{err}");
    for flag in [
        "--longhorn-max-connections <N>",
        "--longhorn-max-connections-per-peer <N>",
        "--longhorn-idle-timeout <SECONDS>",
    ] {
        assert!(help.contains(flag), "{flag} in:\n{help}");
    }
    for (flag, value) in [
        ("--longhorn-max-connections", "0"),
        ("--longhorn-max-connections-per-peer", "0"),
        ("--longhorn-idle-timeout", "5"),
    ] {
        let (ok, _, err) = talon(
            &socket,
            &["serve", "--longhorn-listen", "127.0.0.1:1", flag, value],
        );
        assert!(!ok, "{flag} {value} accepted");
        assert!(err.contains(flag) && err.contains(value), "{flag} {value}: {err}");
    }
}
