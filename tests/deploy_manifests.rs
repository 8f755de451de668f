//! Checks of the deployment manifests under `deploy/`.
//!
//! ```text
//!   deploy/**/*.yaml ── serde_yaml_ng (multi-doc) ── every document parses
//!   deploy/kubernetes/*.yaml ── kubernetes-validate --strict (schemas of Kubernetes 1.37)
//!   daemonset.yaml: container args ── talon::cli::Cli::try_parse_from ── data dir, run dir, socket
//!                   host paths in src/**/*.rs (string literals) ──┴── each mounted (or allowed, with the reason)
//!   targets.yaml:   `talon keep-targets` args ── same run dir and data dir, on the same host paths;
//!                   OnDelete, no liveness probe, hugepages; daemonset.yaml RollingUpdate + --target-keeper
//! ```
//!
//! The schema validation needs the PyPI package `kubernetes-validate` (tests/pip-packages.txt);
//! without it that test prints `SKIP` and returns.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(p);
        }
    }
}

/// Every document of a multi-document YAML file, as JSON values.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| {
            <Value as serde::Deserialize>::deserialize(d)
                .unwrap_or_else(|e| panic!("{} does not parse as YAML: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The Kubernetes manifests: deploy/kubernetes/*.yaml except the kustomization.
fn kubernetes_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy/kubernetes"), &mut files);
    files.retain(|p| p.file_name().is_some_and(|n| n != "kustomization.yaml"));
    assert!(!files.is_empty(), "no manifests under deploy/kubernetes");
    files
}

fn daemonset() -> Value {
    let docs = documents(&repo().join("deploy/kubernetes/daemonset.yaml"));
    docs.into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("daemonset.yaml holds a DaemonSet")
}

fn targets_daemonset() -> Value {
    let docs = documents(&repo().join("deploy/kubernetes/targets.yaml"));
    docs.into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("targets.yaml holds a DaemonSet")
}

/// The container's command line (command + args).
fn argv_of(c: &Value) -> Vec<String> {
    let mut argv: Vec<String> = c["command"]
        .as_array()
        .expect("command")
        .iter()
        .map(|a| str_of(a).into())
        .collect();
    argv.extend(
        c["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| str_of(a).to_string()),
    );
    argv
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("expected a string, got {v}"))
}

#[test]
fn every_yaml_under_deploy_parses() {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files);
    assert!(files.len() >= 4, "expected the deploy manifests, found {files:?}");
    for f in &files {
        let docs = documents(f);
        assert!(!docs.is_empty(), "{} has no document", f.display());
        for d in &docs {
            assert!(d.is_object(), "{}: a document is not a mapping: {d}", f.display());
        }
    }
}

#[test]
fn kubernetes_objects_match_their_schema() {
    let Ok(bin) = which::which("kubernetes-validate") else {
        eprintln!(
            "SKIP kubernetes_objects_match_their_schema: kubernetes-validate is not installed (pip install -r tests/pip-packages.txt)"
        );
        return;
    };
    let files = kubernetes_files();
    let out = Command::new(&bin)
        .args(["--strict", "--kubernetes-version", "1.37.0"])
        .args(&files)
        .output()
        .expect("run kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate failed:\n{text}");
    let passed = text
        .lines()
        .filter(|l| l.contains(" passed for resource "))
        .count();
    let objects: usize = files.iter().map(|f| documents(f).len()).sum();
    assert_eq!(passed, objects, "every object is validated:\n{text}");

    // The validator really is strict: a misspelt field in a copy of the DaemonSet fails.
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("daemonset.yaml");
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/daemonset.yaml")).expect("read");
    std::fs::write(&bad, text.replacen("hostPID: true", "hostPid: true", 1)).expect("write");
    let out = Command::new(&bin)
        .arg("--strict")
        .arg(&bad)
        .output()
        .expect("run kubernetes-validate");
    assert!(!out.status.success(), "a misspelt field passed validation");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hostPid"),
        "{out:?}"
    );
}

#[test]
fn kustomization_lists_every_manifest() {
    let k = documents(&repo().join("deploy/kubernetes/kustomization.yaml"));
    let listed: Vec<&str> = k[0]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(str_of)
        .collect();
    let mut files: Vec<String> = kubernetes_files()
        .iter()
        .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(
        sorted, files,
        "kustomization.yaml resources vs files in deploy/kubernetes"
    );
    for f in kubernetes_files() {
        for d in documents(&f) {
            if d["kind"] != "Namespace" {
                assert_eq!(
                    d["metadata"]["namespace"],
                    k[0]["namespace"],
                    "{}: namespace",
                    f.display()
                );
            }
        }
    }
}

/// mountPath -> (host path, readOnly, mountPropagation) of the talon container.
fn mounts(ds: &Value) -> BTreeMap<String, (Option<String>, bool, Option<String>)> {
    let spec = &ds["spec"]["template"]["spec"];
    let volumes: BTreeMap<&str, &Value> = spec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .map(|v| (str_of(&v["name"]), v))
        .collect();
    spec["containers"][0]["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .map(|m| {
            let vol = volumes
                .get(str_of(&m["name"]))
                .unwrap_or_else(|| panic!("mount {m} names no volume"));
            let host = vol["hostPath"]["path"].as_str().map(String::from);
            (
                str_of(&m["mountPath"]).to_string(),
                (
                    host,
                    m["readOnly"].as_bool().unwrap_or(false),
                    m["mountPropagation"].as_str().map(String::from),
                ),
            )
        })
        .collect()
}

/// The host path mounted at `path` (or at a parent of it) at the same place in the container.
fn host_mount_of(
    mounts: &BTreeMap<String, (Option<String>, bool, Option<String>)>,
    path: &str,
) -> Option<String> {
    mounts
        .iter()
        .filter(|(mp, (host, _, _))| {
            host.as_deref() == Some(mp.as_str())
                && (path == mp.as_str() || path.starts_with(&format!("{mp}/")))
        })
        .map(|(mp, _)| mp.clone())
        .max_by_key(|mp| mp.len())
}

#[test]
fn daemonset_mounts_what_talon_opens() {
    let ds = daemonset();
    let spec = &ds["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    assert_eq!(
        spec["hostPID"], true,
        "hostPID: the namespace switch reads /proc/<pid>/ns of host processes"
    );
    assert_eq!(
        spec["hostNetwork"], true,
        "hostNetwork: NVMe-oF/iSCSI portals on the node's addresses"
    );
    assert_eq!(c["securityContext"]["privileged"], true);
    let m = mounts(&ds);

    // The daemon's own paths, as the real CLI parses the container's command line.
    let argv = argv_of(c);
    let cli =
        talon::cli::Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("talon rejects {argv:?}: {e}"));
    let talon::cli::Command::Serve(serve) = &cli.command else {
        panic!("the container does not run `talon serve`: {argv:?}")
    };
    let data = serve.data_dir.to_str().expect("utf-8");
    let (host, ro, prop) = m
        .get(data)
        .unwrap_or_else(|| panic!("data dir {data} is not mounted"));
    assert_eq!(
        host.as_deref(),
        Some(data),
        "data dir is the same path on the host"
    );
    assert!(!ro, "data dir is writable");
    assert_eq!(
        prop.as_deref(),
        Some("Bidirectional"),
        "data dir propagates mounts both ways (rshared)"
    );
    assert_eq!(
        serve.host_root,
        Path::new("/"),
        "the host's /dev and /sys are mounted at their own paths"
    );
    for (what, p) in [
        ("run dir", serve.run_dir.clone()),
        ("API socket", cli.socket.clone()),
        (
            "default API socket (talon CLI on the node)",
            PathBuf::from(talon::client::DEFAULT_SOCKET),
        ),
        (
            "NVMe-oF fabrics device",
            PathBuf::from(talon::attach::nvme_tcp::FABRICS_DEV),
        ),
        ("/dev/talon links", PathBuf::from(talon::attach::devpath::DEV_DIR)),
        (
            "data dir of `talon attach`",
            PathBuf::from(talon::cli::attach::DEFAULT_DATA_DIR),
        ),
    ] {
        let p = p.to_str().expect("utf-8").to_string();
        assert!(
            host_mount_of(&m, &p).is_some(),
            "{what} {p} is not on a host mount: {m:?}"
        );
    }
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        let cmd: Vec<String> = c[probe]["exec"]["command"]
            .as_array()
            .unwrap_or_else(|| panic!("{probe} is an exec probe"))
            .iter()
            .map(|a| str_of(a).to_string())
            .collect();
        let pc = talon::cli::Cli::try_parse_from(&cmd)
            .unwrap_or_else(|e| panic!("{probe}: talon rejects {cmd:?}: {e}"));
        assert!(
            matches!(pc.command, talon::cli::Command::Node(_)),
            "{probe} runs `talon node info`"
        );
        assert_eq!(pc.socket, cli.socket, "{probe} asks the daemon's socket");
    }

    // The targets run in the talon-targets pod (targets.yaml): no hugepages here.
    assert!(
        serve.target_keeper,
        "talon serve runs with --target-keeper: {argv:?}"
    );
    assert!(
        c["resources"]["requests"]["hugepages-2Mi"].is_null(),
        "talon's pod runs no SPDK and requests no hugepages"
    );
    let (_, ro, _) = m.get("/lib/modules").expect("/lib/modules is mounted");
    assert!(ro, "/lib/modules is read-only");

    // Every absolute host path in talon's code is reachable in the pod.
    let allowed: BTreeMap<&str, &str> = [
        (
            "/etc/nvme/hostnqn",
            "container-local on purpose: without it talon keeps its NVMe host identity under the data dir",
        ),
        ("/etc/nvme/hostid", "as /etc/nvme/hostnqn"),
        ("/usr/lib/os-release", "fallback when /etc/os-release is missing"),
        ("/proc/thread-self/ns/", "talon's own namespaces"),
        (
            "/etc/iscsi/nodes",
            "iscsiadm's node records, opened inside iscsid's mount namespace (setns), not the pod's",
        ),
        ("/var/lib/iscsi/nodes", "as /etc/iscsi/nodes"),
    ]
    .into();
    let mut checked = Vec::new();
    for (file, lit) in host_path_literals() {
        if allowed.contains_key(lit.as_str()) {
            continue;
        }
        let ok = if lit.starts_with("/proc/") || lit == "/proc" {
            spec["hostPID"] == true
        } else {
            host_mount_of(&m, lit.trim_end_matches('/')).is_some()
        };
        assert!(
            ok,
            "{file} opens {lit}, which the DaemonSet does not mount from the host (mounts: {m:?})"
        );
        checked.push(lit);
    }
    for must in [
        "/dev/nvme-fabrics",
        "/sys/class/nvme",
        "/var/lib/talon",
        "/run/talon",
        "/etc/os-release",
    ] {
        assert!(
            checked.iter().any(|l| l == must),
            "the source scan found {must}: {checked:?}"
        );
    }
}

/// Absolute paths under /dev, /sys, /proc, /run, /var, /etc, /lib in string literals of the
/// non-test code of src/ (everything before a file's first `#[cfg(test)]`), cut at the first `{`.
fn host_path_literals() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rs_files(&repo().join("src"), &mut files);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read source");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let name = f.strip_prefix(repo()).unwrap_or(&f).display().to_string();
        for piece in code.split('"').skip(1).step_by(2) {
            let lit = piece.split('{').next().unwrap_or("");
            if ["/dev", "/sys", "/proc", "/run", "/var", "/etc", "/lib"]
                .iter()
                .any(|p| lit == *p || lit.starts_with(&format!("{p}/")))
                && !lit.contains(' ')
            {
                out.push((name.clone(), lit.to_string()));
            }
        }
    }
    out
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn containerfile_runtime_holds_talon_and_tgt_only() {
    let text = std::fs::read_to_string(repo().join("deploy/Containerfile")).expect("deploy/Containerfile");
    let code: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    let froms: Vec<&str> = code.iter().filter(|l| l.starts_with("FROM ")).copied().collect();
    assert_eq!(froms.len(), 2, "a builder and a runtime stage: {froms:?}");
    assert!(
        froms[0].contains("rust:1-bookworm") && froms[0].ends_with(" AS build"),
        "{}",
        froms[0]
    );
    assert!(froms[1].contains("debian:bookworm-slim"), "{}", froms[1]);
    // The packages of the runtime stage: exactly tgt (tgtd, the V1 engine's target).
    let joined = code.join("\n").replace("\\\n", " ");
    let installs: Vec<Vec<&str>> = joined
        .lines()
        .filter_map(|l| l.split("apt-get install").nth(1))
        .map(|rest| {
            rest.split("&&")
                .next()
                .unwrap_or("")
                .split_whitespace()
                .filter(|w| !w.starts_with('-'))
                .collect()
        })
        .collect();
    assert_eq!(installs, [["tgt"]], "runtime packages");
    // The binary lands where the DaemonSet runs it.
    let ds = daemonset();
    let cmd = str_of(&ds["spec"]["template"]["spec"]["containers"][0]["command"][0]);
    assert!(
        code.iter()
            .any(|l| l.starts_with("COPY --from=build ") && l.ends_with(&format!(" {cmd}"))),
        "the runtime stage copies talon to {cmd}"
    );
    assert!(
        code.iter().any(|l| l.contains("--locked")),
        "the build uses Cargo.lock"
    );
}

/// The split that keeps volume I/O going through a rollout of talon: the
/// targets in a DaemonSet of their own that a template change does not
/// replace (OnDelete), with no liveness probe (a restart would kill the
/// targets), sharing talon's run dir and data dir on the same host paths and
/// the host's PID namespace; talon's DaemonSet rolls (RollingUpdate) and
/// adopts them (`--target-keeper`).
#[test]
fn targets_run_in_a_daemonset_that_talons_rollout_does_not_replace() {
    let ctl = daemonset();
    let tgt = targets_daemonset();
    assert_eq!(ctl["spec"]["updateStrategy"]["type"], "RollingUpdate");
    assert_eq!(
        tgt["spec"]["updateStrategy"]["type"], "OnDelete",
        "the targets' pods are replaced only when deleted (node maintenance)"
    );
    assert_ne!(
        ctl["spec"]["selector"], tgt["spec"]["selector"],
        "the two DaemonSets select different pods"
    );
    assert_eq!(
        tgt["spec"]["selector"]["matchLabels"], tgt["spec"]["template"]["metadata"]["labels"],
        "the targets' selector matches its pods"
    );
    let tspec = &tgt["spec"]["template"]["spec"];
    assert_eq!(tspec["hostPID"], true, "pids mean the same in both pods");
    assert_eq!(tspec["hostNetwork"], true, "listeners on the node's addresses");
    let c = &tspec["containers"][0];
    assert_eq!(c["securityContext"]["privileged"], true);
    for probe in ["livenessProbe", "startupProbe"] {
        assert!(
            c[probe].is_null(),
            "{probe} on the targets' container: a failed probe restarts it and kills the targets"
        );
    }
    // the keeper, as the real CLI parses its command line
    let argv = argv_of(c);
    let cli =
        talon::cli::Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("talon rejects {argv:?}: {e}"));
    let talon::cli::Command::KeepTargets(keep) = &cli.command else {
        panic!("the targets' container does not run `talon keep-targets`: {argv:?}")
    };
    let ctl_cli = talon::cli::Cli::try_parse_from(argv_of(&ctl["spec"]["template"]["spec"]["containers"][0]))
        .expect("talon serve argv");
    let talon::cli::Command::Serve(serve) = &ctl_cli.command else {
        panic!("talon's container runs `talon serve`")
    };
    assert_eq!(
        keep.run_dir, serve.run_dir,
        "the keeper and talon share the run dir"
    );
    assert!(serve.target_keeper, "talon adopts the keeper's targets");
    let (ctl_m, tgt_m) = (mounts(&ctl), mounts(&tgt));
    for (what, p) in [
        ("run dir", keep.run_dir.to_str().expect("utf-8").to_string()),
        (
            "data dir (disk files, V1 volume files)",
            serve.data_dir.to_str().expect("utf-8").to_string(),
        ),
    ] {
        let a = host_mount_of(&ctl_m, &p)
            .unwrap_or_else(|| panic!("{what} {p} not on a host mount in talon's pod"));
        let b = host_mount_of(&tgt_m, &p)
            .unwrap_or_else(|| panic!("{what} {p} not on a host mount in the targets' pod"));
        assert_eq!(a, b, "{what} {p}: the same host path in both pods");
    }
    for dev in ["/dev", "/sys"] {
        assert!(host_mount_of(&tgt_m, dev).is_some(), "{dev} in the targets' pod");
    }
    // hugepages: a HugePages-2Mi volume, equal request and limit, at least the keeper's -s floor
    let hp = tspec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["emptyDir"]["medium"] == "HugePages-2Mi");
    assert!(hp.is_some(), "a HugePages-2Mi emptyDir volume");
    let res = &c["resources"];
    assert_eq!(
        res["limits"]["hugepages-2Mi"], res["requests"]["hugepages-2Mi"],
        "hugepage requests equal limits"
    );
    let limit = str_of(&res["limits"]["hugepages-2Mi"]);
    let mib = match limit.strip_suffix("Gi") {
        Some(g) => g.parse::<u64>().expect("Gi") * 1024,
        None => limit
            .strip_suffix("Mi")
            .expect("Mi or Gi")
            .parse::<u64>()
            .expect("Mi"),
    };
    assert!(
        mib >= talon::spdk::launch::SPDK_TGT_BASE_MIB,
        "hugepages-2Mi {limit} holds spdk_tgt's floor ({} MiB)",
        talon::spdk::launch::SPDK_TGT_BASE_MIB
    );
    // SPDK in the image the keeper runs
    let env: Vec<(&str, &str)> = c["env"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|v| (str_of(&v["name"]), v["value"].as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    let spdk_dir = |c: &Value| -> Option<String> {
        c["env"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == "TALON_SPDK_DIR")
            .and_then(|v| v["value"].as_str().map(String::from))
    };
    assert!(
        env.iter().any(|(n, _)| *n == "TALON_SPDK_DIR"),
        "the keeper is told where SPDK is: {env:?}"
    );
    assert_eq!(
        spdk_dir(c),
        spdk_dir(&ctl["spec"]["template"]["spec"]["containers"][0]),
        "talon decides what runs from the same SPDK the keeper runs"
    );
}

/// The quick start's config is one the daemon takes, and it admits the iSCSI client whose IQN
/// `deploy/quickstart.sh` prints in its `iscsi-inq -i ...` line (else that line gets "Target not
/// found").
#[test]
fn the_quickstart_admits_the_client_it_prints() {
    let script = std::fs::read_to_string(repo().join("deploy/quickstart.sh")).expect("quickstart.sh");
    let iqn = script
        .lines()
        .find_map(|l| l.strip_prefix("CLIENT_IQN="))
        .expect("CLIENT_IQN= in quickstart.sh");
    assert!(
        script.contains("iscsi-inq -i $CLIENT_IQN"),
        "the printed command logs in as it"
    );
    let port = script
        .lines()
        .find_map(|l| l.strip_prefix("PORTAL=127.0.0.1:"))
        .expect("PORTAL= in quickstart.sh");
    let state = talon::runtime::State::in_memory();
    let data = tempfile::tempdir().expect("tempdir");
    talon::serve::apply_config_file(&state, &repo().join("deploy/quickstart.yaml"), data.path())
        .expect("the daemon takes quickstart.yaml");
    let node = state
        .get_typed::<talon::resources::config::NodeConfig>("node")
        .expect("get")
        .expect("a node config")
        .spec;
    assert!(
        node.allowed_hosts.iter().any(|h| h == iqn),
        "{:?}",
        node.allowed_hosts
    );
    assert_eq!(node.iscsi_port.to_string(), port);
    let demo = state
        .get_typed::<talon::resources::config::Volume>("demo")
        .expect("get")
        .expect("the volume demo");
    assert_eq!(demo.spec.replicas, 1, "V1 keeps one replica");
}

/// The quick start checks the build's needs before it installs or builds anything (issue 54): on
/// a host without cargo and cc (a fresh Debian) it says what to install, with Cargo.toml's
/// rust-version, and stops; an old rustc (Debian's packaged 1.63) is named as too old.
#[test]
fn the_quickstart_names_the_toolchain_it_needs_before_anything_else() {
    use std::os::unix::fs::PermissionsExt;
    let cargo_toml = std::fs::read_to_string(repo().join("Cargo.toml")).expect("Cargo.toml");
    let min = cargo_toml
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("rust-version in Cargo.toml");
    // a PATH with the shell tools the script reads with, and no cargo, cc, apt-get or curl
    let bin = tempfile::tempdir().expect("tempdir");
    for tool in ["sed", "head", "awk", "sort", "dirname", "id", "cat"] {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} on this host"));
        std::os::unix::fs::symlink(found, bin.path().join(tool)).expect("symlink");
    }
    let run = |path: &Path| {
        let out = Command::new("/bin/bash")
            .arg(repo().join("deploy/quickstart.sh"))
            .env_clear()
            .env("PATH", path)
            .env("HOME", bin.path())
            .env("TALON_DATA_DIR", bin.path().join("data"))
            .output()
            .expect("run quickstart.sh");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(bin.path());
    assert_eq!(code, Some(1), "{out}\n{err}");
    for want in [
        format!("cargo is missing: talon builds with Rust {min} or newer"),
        "https://sh.rustup.rs".to_string(),
        "apt-get install curl".to_string(),
        "a C compiler (cc) is missing".to_string(),
        "apt-get install gcc".to_string(),
    ] {
        assert!(err.contains(&want), "{want:?} in:\n{err}");
    }
    assert!(
        !out.contains("building") && !err.contains("installing") && !bin.path().join("data").exists(),
        "nothing is installed, built or made before: {out}\n{err}"
    );
    // Debian's own rustc
    for (name, text) in [
        ("cargo", "#!/bin/sh\necho cargo 1.65.0\n"),
        ("rustc", "#!/bin/sh\necho rustc 1.63.0\n"),
        ("cc", "#!/bin/sh\n"),
    ] {
        let p = bin.path().join(name);
        std::fs::write(&p, text).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let (code, out, err) = run(bin.path());
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains(&format!("rustc 1.63.0 is older than the Rust {min} talon needs")),
        "{err}"
    );
    assert!(!err.contains("C compiler"), "cc is there: {err}");
}
