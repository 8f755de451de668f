//! Generates bindings to an installed SPDK, only with the `bindings` feature.
//!
//! SPDK is found through `SPDK_DIR` (an SPDK source tree built in place, or an
//! install prefix) or, failing that, through pkg-config (`spdk_event`,
//! `spdk_bdev`, ...). Without the feature this script does nothing, so the
//! default build of talon needs no SPDK headers.

fn main() {
    println!("cargo:rerun-if-env-changed=SPDK_DIR");
    #[cfg(feature = "bindings")]
    bindings::generate();
}

#[cfg(feature = "bindings")]
mod bindings {
    use std::env;
    use std::path::PathBuf;

    /// The SPDK libraries talon links when it runs the target in-process.
    const LIBS: &[&str] = &[
        "spdk_event",
        "spdk_event_bdev",
        "spdk_event_nvmf",
        "spdk_bdev",
        "spdk_jsonrpc",
        "spdk_rpc",
        "spdk_log",
        "spdk_util",
        "spdk_env_dpdk",
    ];

    pub fn generate() {
        let mut includes: Vec<PathBuf> = Vec::new();
        if let Ok(dir) = env::var("SPDK_DIR") {
            let dir = PathBuf::from(dir);
            includes.push(dir.join("include"));
            for lib in ["build/lib", "lib", "dpdk/build/lib"] {
                println!("cargo:rustc-link-search=native={}", dir.join(lib).display());
            }
            for lib in LIBS {
                println!("cargo:rustc-link-lib={lib}");
            }
        } else {
            for lib in LIBS {
                match pkg_config::Config::new().probe(lib) {
                    Ok(found) => includes.extend(found.include_paths),
                    Err(e) => panic!("SPDK library {lib} not found by pkg-config and SPDK_DIR is unset: {e}"),
                }
            }
        }
        let mut builder = bindgen::Builder::default()
            .header("wrapper.h")
            .allowlist_function("spdk_app_.*")
            .allowlist_function("spdk_rpc_.*")
            .allowlist_function("spdk_log_.*")
            .allowlist_type("spdk_app_opts")
            .allowlist_var("SPDK_.*")
            .derive_default(true)
            .layout_tests(false)
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for dir in &includes {
            builder = builder.clang_arg(format!("-I{}", dir.display()));
        }
        let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        builder
            .generate()
            .expect("bindgen failed on SPDK headers")
            .write_to_file(out.join("bindings.rs"))
            .expect("cannot write bindings.rs");
    }
}
