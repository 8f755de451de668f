//! Generates bindings to an installed SPDK and links it, only with the
//! `bindings` feature.
//!
//! ```text
//!   SPDK_DIR (source tree built in place: <dir>/build/lib/pkgconfig,
//!             or install prefix: <dir>/lib/pkgconfig) ─┐
//!   else PKG_CONFIG_PATH as set ───────────────────────┴─> pkg-config
//!        spdk_* and rte_* (static, whole-archive: subsystems, bdev modules
//!        and DPDK drivers register from constructors) + spdk_syslibs (dynamic)
//!   include dirs ──> bindgen(wrapper.h, allow-list) ──> $OUT_DIR/bindings.rs
//! ```
//!
//! The libraries are those spdk_tgt links (app/spdk_tgt/Makefile: every bdev,
//! accel, sock, scheduler and keyring module, the event framework, nvmf, and
//! the env_dpdk RPCs), less the iSCSI, NBD, vhost and fsdev targets talon
//! does not use. Without the feature this script does nothing, so the default
//! build of talon needs no SPDK headers or libraries.

fn main() {
    println!("cargo:rerun-if-env-changed=SPDK_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=wrapper.h");
    #[cfg(feature = "bindings")]
    if let Err(e) = bindings::run() {
        // A build script reports failure by exiting non-zero with the reason.
        eprintln!("spdk-sys: {e}");
        std::process::exit(1);
    }
}

#[cfg(feature = "bindings")]
mod bindings {
    use std::env;
    use std::path::{Path, PathBuf};

    /// The pkg-config packages linked (see the module docs).
    const PACKAGES: &[&str] = &[
        "spdk_event",
        "spdk_event_bdev",
        "spdk_event_nvmf",
        "spdk_bdev_modules",
        "spdk_accel_modules",
        "spdk_sock_modules",
        "spdk_scheduler_modules",
        "spdk_keyring_modules",
        "spdk_env_dpdk",
        "spdk_env_dpdk_rpc",
    ];

    /// System libraries SPDK and DPDK need when linked statically.
    const SYSLIBS: &str = "spdk_syslibs";

    /// The pkg-config directory under `SPDK_DIR`: a source tree built in
    /// place has it in `build/lib/pkgconfig`, an install prefix in `lib/pkgconfig`.
    fn pkgconfig_dir(dir: &Path) -> Result<PathBuf, String> {
        ["build/lib/pkgconfig", "lib/pkgconfig", "lib64/pkgconfig"]
            .iter()
            .map(|d| dir.join(d))
            .find(|d| d.join("spdk_event.pc").is_file())
            .ok_or_else(|| {
                format!(
                    "SPDK_DIR={} has no spdk_event.pc in build/lib/pkgconfig, lib/pkgconfig or \
                     lib64/pkgconfig (build SPDK first)",
                    dir.display()
                )
            })
    }

    pub fn run() -> Result<(), String> {
        if let Some(dir) = env::var_os("SPDK_DIR").map(PathBuf::from) {
            let pc = pkgconfig_dir(&dir)?;
            let path = match env::var_os("PKG_CONFIG_PATH") {
                Some(old) if !old.is_empty() => {
                    env::join_paths(std::iter::once(pc).chain(env::split_paths(&old)))
                        .map_err(|e| format!("PKG_CONFIG_PATH: {e}"))?
                }
                _ => pc.into_os_string(),
            };
            // SAFETY: the build script runs no other threads that could read the
            // environment concurrently; pkg-config (a child process) inherits it.
            unsafe { env::set_var("PKG_CONFIG_PATH", path) };
        }
        let spdk = probe_all(PACKAGES)?;
        let sys = pkg_config::Config::new()
            .cargo_metadata(false)
            .statik(true)
            .probe(SYSLIBS)
            .map_err(|e| format!("pkg-config {SYSLIBS}: {e}"))?;

        for p in &spdk.link_paths {
            println!("cargo:rustc-link-search=native={}", p.display());
        }
        for lib in &spdk.libs {
            if lib.starts_with("spdk_") || lib.starts_with("rte_") {
                // Constructors register subsystems, bdev modules, RPCs and DPDK
                // drivers; nothing references them by name, so keep every object.
                println!("cargo:rustc-link-lib=static:+whole-archive,-bundle={lib}");
            } else {
                println!("cargo:rustc-link-lib={lib}");
            }
        }
        for p in &sys.link_paths {
            println!("cargo:rustc-link-search=native={}", p.display());
        }
        for lib in &sys.libs {
            println!("cargo:rustc-link-lib={lib}");
        }

        let mut includes = spdk.include_paths.clone();
        if let Some(dir) = env::var_os("SPDK_DIR").map(PathBuf::from) {
            includes.push(dir.join("include"));
        }
        let mut builder = bindgen::Builder::default()
            .header("wrapper.h")
            .allowlist_function("spdk_app_opts_init")
            .allowlist_function("spdk_app_start")
            .allowlist_function("spdk_app_start_shutdown")
            .allowlist_function("spdk_app_stop")
            .allowlist_function("spdk_app_fini")
            .allowlist_function("spdk_log_set_print_level")
            .allowlist_function("spdk_log_set_level")
            .allowlist_type("spdk_app_opts")
            .allowlist_type("spdk_log_level")
            .allowlist_var("SPDK_VERSION_(MAJOR|MINOR|PATCH)")
            .derive_default(true)
            .layout_tests(false)
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for dir in &includes {
            builder = builder.clang_arg(format!("-I{}", dir.display()));
        }
        let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?);
        builder
            .generate()
            .map_err(|e| format!("bindgen failed on SPDK's headers (include dirs {includes:?}): {e}"))?
            .write_to_file(out.join("bindings.rs"))
            .map_err(|e| format!("writing {}: {e}", out.join("bindings.rs").display()))?;
        Ok(())
    }

    /// Libraries, link paths and include paths of several packages, in
    /// pkg-config's order, each once.
    #[derive(Default)]
    struct Found {
        libs: Vec<String>,
        link_paths: Vec<PathBuf>,
        include_paths: Vec<PathBuf>,
    }

    fn probe_all(names: &[&str]) -> Result<Found, String> {
        fn add<T: PartialEq>(to: &mut Vec<T>, from: Vec<T>) {
            for x in from {
                if !to.contains(&x) {
                    to.push(x);
                }
            }
        }
        let mut found = Found::default();
        for name in names {
            let lib = pkg_config::Config::new()
                .cargo_metadata(false)
                .env_metadata(false)
                .probe(name)
                .map_err(|e| {
                    format!(
                        "SPDK package {name} not found by pkg-config (set SPDK_DIR or PKG_CONFIG_PATH): {e}"
                    )
                })?;
            add(&mut found.libs, lib.libs);
            add(&mut found.link_paths, lib.link_paths);
            add(&mut found.include_paths, lib.include_paths);
        }
        Ok(found)
    }
}
