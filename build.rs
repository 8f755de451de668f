//! Stamps the version: `git describe` when the source is a git checkout,
//! else the crate version. Generates the Longhorn instance-manager gRPC code
//! from talon's own protos in `proto/longhorn` (parsed by protox: no system
//! protoc needed).

use std::process::Command;

fn main() {
    watch_git_head();
    println!("cargo:rerun-if-env-changed=TALON_VERSION");
    let version = std::env::var("TALON_VERSION")
        .ok()
        .or_else(git_describe)
        .unwrap_or_else(|| format!("v{}", std::env::var("CARGO_PKG_VERSION").unwrap_or_default()));
    println!("cargo:rustc-env=TALON_VERSION={version}");
    longhorn_protos();
}

/// The Longhorn wire-compatible protos: server and client code, and the
/// descriptor set that gRPC reflection serves.
fn longhorn_protos() {
    const FILES: &[&str] = &[
        "imrpc/imrpc.proto",
        "imrpc/common.proto",
        "imrpc/instance.proto",
        "imrpc/disk.proto",
        "imrpc/proxy.proto",
        "ptypes/controller.proto",
        "ptypes/syncagent.proto",
        "spdkrpc/spdk.proto",
    ];
    let root = "proto/longhorn";
    println!("cargo:rerun-if-changed={root}");
    let fds = match protox::compile(FILES, [root]) {
        Ok(f) => f,
        Err(e) => panic!("the Longhorn protos in {root} do not compile: {e:?}"),
    };
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let descriptor = out.join("longhorn_descriptor.bin");
    if let Err(e) = std::fs::write(&descriptor, prost::Message::encode_to_vec(&fds)) {
        panic!("cannot write {}: {e}", descriptor.display());
    }
    if let Err(e) = tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)
    {
        panic!("generating the Longhorn gRPC code failed: {e}");
    }
}

/// Re-stamp when HEAD moves. A git worktree's `.git` is a file pointing at
/// its own git dir, so the paths come from git itself; only paths that exist
/// are watched (cargo reruns the script on every build for a missing one).
fn watch_git_head() {
    let dirs = ["--git-dir", "--git-common-dir"].map(|flag| {
        Command::new("git")
            .args(["rev-parse", flag])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| std::path::PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
    });
    let [git_dir, common_dir] = dirs;
    let paths = [
        git_dir.as_ref().map(|d| d.join("HEAD")),
        common_dir.as_ref().map(|d| d.join("refs")),
        common_dir.as_ref().map(|d| d.join("packed-refs")),
    ];
    for path in paths.into_iter().flatten().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn git_describe() -> Option<String> {
    let out = Command::new("git")
        .args(["describe", "--tags", "--always", "--dirty"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}
