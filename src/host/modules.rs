//! Kernel modules: loaded, built in, available or missing; loading with modprobe.
//!
//! ```text
//!   /proc/modules ─────────────────────────────┐
//!   /sys/module/<m>/initstate ("live") ────────┤
//!   /lib/modules/<release>/modules.builtin ────┼─> ModuleState ──> ensure_loaded()
//!   /lib/modules/<release>/modules.dep ────────┘        └─ Talos: report only (caller decides)
//!                                        <release> = /proc/sys/kernel/osrelease
//! ```
//!
//! Names are compared in kernel form (`nvme-tcp` and `nvme_tcp` are one module).
//! Loading runs `modprobe` only when the root is the real `/`; on a fixture tree
//! or on Talos (no modprobe, modules come from the machine config) callers get an
//! error naming the module and say what to do instead.

use super::{HostIoError, HostRoot};
use serde::{Deserialize, Serialize};
use std::process::Command;

/// The modules talon's data paths use.
pub const TALON_MODULES: &[&str] = &[
    "nvme_tcp",
    "nvme_fabrics",
    "vfio_pci",
    "uio_pci_generic",
    "iscsi_tcp",
];

/// Errors of module inspection and loading.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error("invalid kernel module name {0:?}")]
    InvalidName(String),
    #[error("cannot inspect kernel module {module}")]
    Inspect {
        module: String,
        #[source]
        source: HostIoError,
    },
    #[error(
        "cannot load kernel module {module}: the host root {root} is not the real / (modprobe runs only on the real host)"
    )]
    LoadNotLocal { module: String, root: String },
    #[error("cannot load kernel module {module}: modprobe is not installed (not found on PATH)")]
    ModprobeMissing { module: String },
    #[error("cannot run modprobe for kernel module {module}")]
    SpawnModprobe {
        module: String,
        #[source]
        source: std::io::Error,
    },
    #[error("modprobe {module} failed: {stderr}")]
    Modprobe { module: String, stderr: String },
    #[error("kernel module {module} is still not loaded after modprobe")]
    NotLoadedAfterModprobe { module: String },
}

/// Where a module stands on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ModuleState {
    /// Loaded as a module (in /proc/modules).
    Loaded,
    /// Compiled into the kernel.
    Builtin,
    /// Not loaded, but a module file is listed in modules.dep.
    Available,
    /// Neither loaded, built in nor installed.
    Missing,
}

impl ModuleState {
    /// Whether the module's function is usable now.
    pub fn is_present(self) -> bool {
        matches!(self, Self::Loaded | Self::Builtin)
    }
}

/// A module's name in kernel form (`-` becomes `_`), validated.
pub fn kernel_name(name: &str) -> Result<String, ModuleError> {
    let ok = !name.is_empty()
        && name.len() <= 56
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !ok {
        return Err(ModuleError::InvalidName(name.to_string()));
    }
    Ok(name.replace('-', "_"))
}

/// The running kernel release, from /proc/sys/kernel/osrelease.
pub fn kernel_release(root: &HostRoot) -> Result<String, HostIoError> {
    root.read_attr("/proc/sys/kernel/osrelease")
}

/// The state of one module.
pub fn module_state(root: &HostRoot, name: &str) -> Result<ModuleState, ModuleError> {
    let module = kernel_name(name)?;
    let inspect = |source| ModuleError::Inspect {
        module: module.clone(),
        source,
    };
    // No /proc/modules: a kernel without module support; only built-ins count.
    let proc_modules = root
        .read_attr_opt("/proc/modules")
        .map_err(inspect)?
        .unwrap_or_default();
    if proc_modules
        .lines()
        .any(|l| l.split_whitespace().next() == Some(module.as_str()))
    {
        return Ok(ModuleState::Loaded);
    }
    let release = kernel_release(root).map_err(inspect)?;
    let dir = format!("/lib/modules/{release}");
    if let Some(builtin) = root
        .read_attr_opt(format!("{dir}/modules.builtin"))
        .map_err(inspect)?
        && builtin.lines().any(|l| path_module_name(l) == module)
    {
        return Ok(ModuleState::Builtin);
    }
    // A built-in module with parameters has /sys/module/<m> but no initstate.
    if root.exists(format!("/sys/module/{module}")) && !root.exists(format!("/sys/module/{module}/initstate"))
    {
        return Ok(ModuleState::Builtin);
    }
    if let Some(dep) = root
        .read_attr_opt(format!("{dir}/modules.dep"))
        .map_err(inspect)?
        && dep
            .lines()
            .filter_map(|l| l.split(':').next())
            .any(|p| path_module_name(p) == module)
    {
        return Ok(ModuleState::Available);
    }
    Ok(ModuleState::Missing)
}

/// `kernel/drivers/nvme/host/nvme-tcp.ko.xz` -> `nvme_tcp`.
fn path_module_name(path: &str) -> String {
    let file = path.trim().rsplit('/').next().unwrap_or("");
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// Why modprobe did not start: not installed (said plainly), or another error.
fn spawn_error(module: &str, source: std::io::Error) -> ModuleError {
    let module = module.to_string();
    match source.kind() {
        std::io::ErrorKind::NotFound => ModuleError::ModprobeMissing { module },
        _ => ModuleError::SpawnModprobe { module, source },
    }
}

/// Loads a module with modprobe unless it is already present; verifies it is
/// loaded afterwards. Never called on Talos by talon (the caller checks the OS).
pub fn ensure_loaded(root: &HostRoot, name: &str) -> Result<ModuleState, ModuleError> {
    let module = kernel_name(name)?;
    let state = module_state(root, &module)?;
    if state.is_present() {
        return Ok(state);
    }
    if !root.is_real() {
        return Err(ModuleError::LoadNotLocal {
            module,
            root: root.prefix().display().to_string(),
        });
    }
    let out = Command::new("modprobe")
        .arg("--")
        .arg(&module)
        .output()
        .map_err(|source| spawn_error(&module, source))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(ModuleError::Modprobe { module, stderr });
    }
    let after = module_state(root, &module)?;
    if !after.is_present() {
        return Err(ModuleError::NotLoadedAfterModprobe { module });
    }
    Ok(after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn a_missing_modprobe_is_named() {
        let e = spawn_error("nvme_tcp", std::io::Error::from(std::io::ErrorKind::NotFound));
        assert_eq!(
            e.to_string(),
            "cannot load kernel module nvme_tcp: modprobe is not installed (not found on PATH)"
        );
        let e = spawn_error(
            "nvme_tcp",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        assert!(matches!(e, ModuleError::SpawnModprobe { .. }), "{e:?}");
    }

    fn fixture() -> (tempfile::TempDir, HostRoot) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        fs::create_dir_all(root.path("/proc/sys/kernel")).expect("mkdir");
        fs::write(root.path("/proc/sys/kernel/osrelease"), "6.1.0-test\n").expect("w");
        fs::write(
            root.path("/proc/modules"),
            "nvme_tcp 45056 0 - Live 0x0\nnvme_fabrics 32768 1 nvme_tcp, Live 0x0\n",
        )
        .expect("w");
        fs::create_dir_all(root.path("/lib/modules/6.1.0-test")).expect("mkdir");
        fs::write(
            root.path("/lib/modules/6.1.0-test/modules.builtin"),
            "kernel/drivers/vfio/pci/vfio-pci.ko\n",
        )
        .expect("w");
        fs::write(
            root.path("/lib/modules/6.1.0-test/modules.dep"),
            "kernel/drivers/uio/uio_pci_generic.ko.xz: kernel/drivers/uio/uio.ko.xz\n",
        )
        .expect("w");
        (dir, root)
    }

    #[test]
    fn classifies_loaded_builtin_available_missing() {
        let (_d, root) = fixture();
        assert_eq!(module_state(&root, "nvme-tcp").expect("s"), ModuleState::Loaded);
        assert_eq!(module_state(&root, "vfio_pci").expect("s"), ModuleState::Builtin);
        assert_eq!(
            module_state(&root, "uio_pci_generic").expect("s"),
            ModuleState::Available
        );
        assert_eq!(module_state(&root, "iscsi_tcp").expect("s"), ModuleState::Missing);
    }

    #[test]
    fn a_kernel_without_module_support_has_only_builtins() {
        let (_d, root) = fixture();
        fs::remove_file(root.path("/proc/modules")).expect("rm");
        assert_eq!(module_state(&root, "vfio_pci").expect("s"), ModuleState::Builtin);
        assert_eq!(module_state(&root, "nvme_tcp").expect("s"), ModuleState::Missing);
    }

    #[test]
    fn rejects_bad_names_and_refuses_to_load_on_a_fixture() {
        let (_d, root) = fixture();
        assert!(matches!(
            module_state(&root, "../etc"),
            Err(ModuleError::InvalidName(_))
        ));
        let err = ensure_loaded(&root, "iscsi_tcp").expect_err("fixture");
        assert!(err.to_string().contains("iscsi_tcp"), "{err}");
        assert_eq!(
            ensure_loaded(&root, "nvme_tcp").expect("present"),
            ModuleState::Loaded
        );
    }
}
