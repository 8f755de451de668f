//! Engine selection: whether this node can run the V2 engine (SPDK), and
//! which engine serves a given volume.
//!
//! ```text
//!   SpdkOptions (--spdk-tgt, --no-huge, --engine) ─┐
//!   find_spdk_tgt (explicit, TALON_SPDK_DIR, PATH) ┼─> detect ─> EngineSelection { v2_available, reason }
//!     or in-process (--engine spdk-embedded)       │                  │
//!   /sys/kernel/mm/hugepages/*/free_hugepages ─────┘                  │
//!                                                                     v
//!   Volume.engine / NodeConfig.engine / --engine ──> engine_for ──> Engine::V1 | Engine::V2
//!                 (explicit wins; auto -> node; auto node -> --engine; auto -> V2 if available)
//! ```
//!
//! One rule decides which engine serves a volume: [`engine_for`]. Serve
//! detects the selection once at start and hands the same one to
//! `node_info` (so `talon node info` shows it) and to every controller: the
//! SPDK target controller and the hugepage sizing ask
//! [`EngineSelection::engine_for`]; tgtd's and the V1 volume controller,
//! given [`EngineSelection::auto_engine`], ask [`engine_for`]; the V2 volume
//! controller asks [`serves_v2`], which is [`engine_for`] too.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::host::HostRoot;
use crate::resources::config::{EngineKind, NodeConfig, Volume};
use crate::resources::engine::Engine;
use crate::spdk::target::{Memory, TargetConfig, find_spdk_tgt, mem_size_mib_for};

/// How the daemon runs SPDK (the `talon serve` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpdkOptions {
    /// `--spdk-tgt PATH`: an explicit binary.
    pub spdk_tgt: Option<PathBuf>,
    /// `$TALON_SPDK_DIR`: `<dir>/build/bin/spdk_tgt` is searched second.
    pub spdk_dir: Option<PathBuf>,
    /// `PATH` searched last.
    pub path_var: Option<OsString>,
    /// `--spdk-cpumask` (default `0x1`).
    pub cpumask: String,
    /// `--no-huge`: ordinary memory instead of hugepages (development).
    pub no_huge: bool,
    /// `-s` with `--no-huge`, in MiB.
    pub no_huge_mem_mib: u64,
    /// `--interrupt-mode`.
    pub interrupt_mode: bool,
    /// `--engine`: the node default for `auto` volumes on an `auto` node.
    pub engine: EngineKind,
    /// More spdk_tgt arguments (tests: `--disable-cpumask-locks`).
    pub extra_args: Vec<OsString>,
    /// `--engine spdk-embedded`: SPDK in-process instead of spdk_tgt.
    pub embedded: bool,
    /// `--target-keeper`: spdk_tgt and tgtd are run by `talon keep-targets`
    /// (another pod); the target controllers write what should run under
    /// `<run_dir>/keeper/` and adopt, never start or stop a target.
    pub target_keeper: bool,
}

impl Default for SpdkOptions {
    fn default() -> Self {
        SpdkOptions {
            spdk_tgt: None,
            spdk_dir: std::env::var_os("TALON_SPDK_DIR").map(PathBuf::from),
            path_var: std::env::var_os("PATH"),
            cpumask: "0x1".into(),
            no_huge: false,
            no_huge_mem_mib: 2048,
            interrupt_mode: false,
            engine: EngineKind::Auto,
            extra_args: Vec::new(),
            embedded: false,
            target_keeper: false,
        }
    }
}

impl SpdkOptions {
    /// The target settings for `run_dir` (socket `<run_dir>/spdk.sock`).
    pub fn target_config(&self, run_dir: impl Into<PathBuf>) -> TargetConfig {
        let mut c = TargetConfig::new(run_dir);
        c.spdk_tgt = self.spdk_tgt.clone();
        c.spdk_dir = self.spdk_dir.clone();
        c.cpumask = self.cpumask.clone();
        c.interrupt_mode = self.interrupt_mode;
        c.extra_args = self.extra_args.clone();
        c.embedded = self.embedded;
        c.memory = if self.no_huge {
            Memory::NoHuge {
                mem_size_mib: self.no_huge_mem_mib,
            }
        } else {
            Memory::Hugepages { mem_size_mib: None }
        };
        c
    }
}

/// Whether V2 can run here, and the node default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSelection {
    /// spdk_tgt was found and its memory is there.
    pub v2_available: bool,
    /// What runs V2 (the binary and memory), or why V2 is not available.
    pub reason: String,
    /// The binary found.
    pub spdk_tgt: Option<PathBuf>,
    /// `--engine`: the default for `auto` volumes on an `auto` node.
    pub default_engine: EngineKind,
}

pub use crate::host::hugepages::free_hugepages_mib;

impl EngineSelection {
    /// Detects on the real host.
    pub fn detect(opts: &SpdkOptions) -> EngineSelection {
        Self::detect_on(opts, &HostRoot::real())
    }

    /// Like [`Self::detect_on`], but a target already listening on `socket`
    /// (left running by a talon that crashed; it holds the hugepages) makes
    /// V2 available too: the target controller adopts it.
    pub fn detect_with_socket(opts: &SpdkOptions, host: &HostRoot, socket: &Path) -> EngineSelection {
        let mut s = Self::detect_on(opts, host);
        if !s.v2_available && s.spdk_tgt.is_some() && std::os::unix::net::UnixStream::connect(socket).is_ok()
        {
            s.v2_available = true;
            s.reason = format!("spdk_tgt already listening on {} (adopted)", socket.display());
        }
        s
    }

    /// Detects with `/sys` read through `host` (fixture trees in tests).
    pub fn detect_on(opts: &SpdkOptions, host: &HostRoot) -> EngineSelection {
        // what would run SPDK: (its description, the binary)
        let found = if opts.embedded {
            if cfg!(feature = "spdk-embedded") {
                Ok(("in-process SPDK (spdk-embedded)".to_string(), None))
            } else {
                Err(crate::spdk::target::TargetError::EmbeddedNotBuilt.to_string())
            }
        } else {
            find_spdk_tgt(
                opts.spdk_tgt.as_deref(),
                opts.spdk_dir.as_deref(),
                opts.path_var.as_deref(),
            )
            .map(|bin| (bin.display().to_string(), Some(bin)))
            .map_err(|e| format!("{e}; set --spdk-tgt or TALON_SPDK_DIR, or put spdk_tgt on PATH"))
        };
        let (v2_available, reason, spdk_tgt) = match found {
            Err(e) => (false, e, None),
            Ok((what, bin)) if opts.no_huge => (
                true,
                format!("{what} with --no-huge -s {} (development)", opts.no_huge_mem_mib),
                bin,
            ),
            Ok((what, bin)) => {
                let need = mem_size_mib_for(0);
                let free = free_hugepages_mib(host);
                if free >= need {
                    (true, format!("{what} with {free} MiB of free hugepages"), bin)
                } else {
                    (
                        false,
                        format!(
                            "{what} found, but only {free} MiB of hugepages are free and SPDK needs {need} MiB \
                             (reserve hugepages, or run with --no-huge for development)"
                        ),
                        bin,
                    )
                }
            }
        };
        EngineSelection {
            v2_available,
            reason,
            spdk_tgt,
            default_engine: opts.engine,
        }
    }

    /// A fixed selection (tests, and callers that detected elsewhere).
    pub fn fixed(v2_available: bool, reason: impl Into<String>) -> EngineSelection {
        EngineSelection {
            v2_available,
            reason: reason.into(),
            spdk_tgt: None,
            default_engine: EngineKind::Auto,
        }
    }

    /// The engine of an `auto` volume on an `auto` node: the one case the
    /// volume controllers need decided here (explicit choices they read
    /// themselves).
    pub fn auto_engine(&self) -> Engine {
        match self.default_engine {
            EngineKind::V1 => Engine::V1,
            EngineKind::V2 => Engine::V2,
            EngineKind::Auto if self.v2_available => Engine::V2,
            EngineKind::Auto => Engine::V1,
        }
    }

    /// The engine that serves `volume` on a node configured as `node`: an
    /// explicit volume engine wins, then the node's, then `--engine`, then V2
    /// when available, else V1 ([`engine_for`] with [`Self::auto_engine`]).
    pub fn engine_for(&self, volume: &Volume, node: &NodeConfig) -> Engine {
        engine_for(volume, node, self.auto_engine())
    }
}

/// The rule: the engine that serves `volume` on a node configured as `node`.
/// An explicit volume engine wins, then the node's; an `auto` volume on an
/// `auto` node gets `auto` (this host's [`EngineSelection::auto_engine`]).
pub fn engine_for(volume: &Volume, node: &NodeConfig, auto: Engine) -> Engine {
    match (volume.engine, node.engine) {
        (EngineKind::V1, _) | (EngineKind::Auto, EngineKind::V1) => Engine::V1,
        (EngineKind::V2, _) | (EngineKind::Auto, EngineKind::V2) => Engine::V2,
        (EngineKind::Auto, EngineKind::Auto) => auto,
    }
}

/// Whether the V2 engine serves `volume` on `node`, for a controller that
/// knows only whether `auto` volumes on an `auto` node are V2 here
/// (`claims_auto`: [`EngineSelection::auto_engine`] is V2): [`engine_for`].
pub fn serves_v2(volume: &Volume, node: &NodeConfig, claims_auto: bool) -> bool {
    let auto = if claims_auto { Engine::V2 } else { Engine::V1 };
    engine_for(volume, node, auto) == Engine::V2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(engine: EngineKind) -> Volume {
        serde_json::from_value(serde_json::json!({"sizeBytes": 1048576, "engine": engine})).expect("volume")
    }

    fn node(engine: EngineKind) -> NodeConfig {
        NodeConfig {
            engine,
            ..NodeConfig::default()
        }
    }

    #[test]
    fn explicit_wins_then_node_then_flag_then_availability() {
        use EngineKind::{Auto, V1, V2};
        let avail = EngineSelection::fixed(true, "x");
        let none = EngineSelection::fixed(false, "x");
        assert_eq!(avail.engine_for(&vol(V1), &node(V2)), Engine::V1);
        assert_eq!(none.engine_for(&vol(V2), &node(V1)), Engine::V2);
        assert_eq!(none.engine_for(&vol(Auto), &node(V2)), Engine::V2);
        assert_eq!(avail.engine_for(&vol(Auto), &node(V1)), Engine::V1);
        assert_eq!(avail.engine_for(&vol(Auto), &node(Auto)), Engine::V2);
        assert_eq!(none.engine_for(&vol(Auto), &node(Auto)), Engine::V1);
        let pinned = EngineSelection {
            default_engine: V1,
            ..avail.clone()
        };
        assert_eq!(pinned.engine_for(&vol(Auto), &node(Auto)), Engine::V1);
        assert_eq!(pinned.engine_for(&vol(Auto), &node(V2)), Engine::V2);
    }

    #[test]
    fn the_rule_for_controllers_that_know_only_the_auto_engine() {
        use EngineKind::{Auto, V1, V2};
        for auto in [Engine::V1, Engine::V2] {
            assert_eq!(engine_for(&vol(V1), &node(V2), auto), Engine::V1);
            assert_eq!(engine_for(&vol(V2), &node(V1), auto), Engine::V2);
            assert_eq!(engine_for(&vol(Auto), &node(V1), auto), Engine::V1);
            assert_eq!(engine_for(&vol(Auto), &node(V2), auto), Engine::V2);
            assert_eq!(engine_for(&vol(Auto), &node(Auto), auto), auto);
        }
        assert!(serves_v2(&vol(V2), &node(V1), false));
        assert!(!serves_v2(&vol(V1), &node(V2), true));
        assert!(serves_v2(&vol(Auto), &node(V2), false));
        assert!(!serves_v2(&vol(Auto), &node(Auto), false));
        assert!(serves_v2(&vol(Auto), &node(Auto), true));
        // a selection's answer is the rule's with its auto engine, for every input
        for sel in [
            EngineSelection::fixed(true, "x"),
            EngineSelection::fixed(false, "x"),
        ] {
            for d in [Auto, V1, V2] {
                let sel = EngineSelection {
                    default_engine: d,
                    ..sel.clone()
                };
                for (v, n) in [Auto, V1, V2]
                    .into_iter()
                    .flat_map(|v| [Auto, V1, V2].map(|n| (v, n)))
                {
                    let e = sel.engine_for(&vol(v), &node(n));
                    assert_eq!(e, engine_for(&vol(v), &node(n), sel.auto_engine()));
                    assert_eq!(
                        e == Engine::V2,
                        serves_v2(&vol(v), &node(n), sel.auto_engine() == Engine::V2)
                    );
                }
            }
        }
    }

    fn fixture(free_2m: u64) -> (tempfile::TempDir, HostRoot, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().expect("tempdir");
        let hp = d.path().join("root/sys/kernel/mm/hugepages/hugepages-2048kB");
        std::fs::create_dir_all(&hp).expect("mkdir");
        std::fs::write(hp.join("free_hugepages"), format!("{free_2m}\n")).expect("write");
        let bin = d.path().join("bin/spdk_tgt");
        std::fs::create_dir_all(bin.parent().expect("parent")).expect("mkdir");
        std::fs::write(&bin, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let root = HostRoot::new(d.path().join("root"));
        (d, root, bin)
    }

    #[test]
    fn detect_needs_binary_and_hugepages_or_no_huge() {
        let (_d, root, bin) = fixture(100);
        let mut opts = SpdkOptions {
            spdk_tgt: None,
            spdk_dir: None,
            path_var: None,
            ..SpdkOptions::default()
        };
        let s = EngineSelection::detect_on(&opts, &root);
        assert!(!s.v2_available);
        assert!(s.reason.contains("spdk_tgt was not found"), "{}", s.reason);

        opts.spdk_tgt = Some(bin.clone());
        let s = EngineSelection::detect_on(&opts, &root);
        assert!(!s.v2_available);
        assert!(
            s.reason.contains("only 200 MiB of hugepages are free"),
            "{}",
            s.reason
        );

        opts.no_huge = true;
        let s = EngineSelection::detect_on(&opts, &root);
        assert!(s.v2_available, "{}", s.reason);
        assert!(s.reason.contains("--no-huge"), "{}", s.reason);

        // a target already listening holds the hugepages: adopted
        opts.no_huge = false;
        let sock = _d.path().join("spdk.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        let s = EngineSelection::detect_with_socket(&opts, &root, &sock);
        assert!(s.v2_available, "{}", s.reason);
        assert!(s.reason.contains("already listening"), "{}", s.reason);

        // in-process: no binary needed, but a build with the feature
        let embedded = SpdkOptions {
            embedded: true,
            no_huge: true,
            ..opts.clone()
        };
        let s = EngineSelection::detect_on(&embedded, &root);
        assert_eq!(s.v2_available, cfg!(feature = "spdk-embedded"), "{}", s.reason);
        assert_eq!(s.spdk_tgt, None);
        if cfg!(feature = "spdk-embedded") {
            assert!(s.reason.starts_with("in-process SPDK"), "{}", s.reason);
        } else {
            assert!(
                s.reason.contains("built without the spdk-embedded feature"),
                "{}",
                s.reason
            );
        }

        let (_d2, root2, bin2) = fixture(512);
        opts.no_huge = false;
        opts.spdk_tgt = Some(bin2);
        let s = EngineSelection::detect_on(&opts, &root2);
        assert!(s.v2_available, "{}", s.reason);
        assert_eq!(free_hugepages_mib(&root2), 1024);
    }
}
