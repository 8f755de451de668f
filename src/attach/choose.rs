//! Which frontend a volume is attached through on this host.
//!
//! ```text
//!   HostFrontends::probe(root)                       override: Attachment.frontend, else Volume.frontend
//!     nvme_tcp: /sys/module/nvme_tcp                          │
//!            or modules.dep of /lib/modules/<release>         ▼
//!     iscsi:  an iscsid process, or iscsiadm on PATH   choose(host, override, exports)
//!                                                             │ auto: nvme-tcp if the host has it and the
//!                                                             │       engine exports it, else iscsi, else error
//!                                                             ▼
//!                                                      (Transport, Export)
//! ```
//! An explicit override is the operator's decision: it is used whether or not the host probe found
//! the initiator (the attach itself then fails with a precise error), but never for a transport the
//! engine does not export (V1 volumes have iSCSI exports only).

use std::path::PathBuf;

use crate::host::HostRoot;
use crate::resources::config::FrontendKind;
use crate::resources::engine::Export;

/// A host frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    NvmeTcp,
    Iscsi,
}

impl Transport {
    /// The name used in `Export.transport` and `AttachmentStatus.transport`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NvmeTcp => "nvme-tcp",
            Self::Iscsi => "iscsi",
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why no frontend could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChooseError {
    #[error("volume {volume} asks for the {wanted} frontend but its engine exports only [{offered}]")]
    NotExported {
        volume: String,
        wanted: Transport,
        offered: String,
    },

    #[error("no usable frontend for volume {volume}: its engine exports [{offered}]; looked for {looked}")]
    NoFrontend {
        volume: String,
        /// Each initiator looked for, and why it is not usable.
        looked: String,
        offered: String,
    },
}

/// What the host can attach with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostFrontends {
    /// The nvme_tcp module is loaded (or built in) or can be loaded.
    pub nvme_tcp: bool,
    /// iscsid runs, or iscsiadm is installed.
    pub iscsi: bool,
}

/// Directories searched for `iscsiadm` in the host's file system (Talos extensions live under
/// /usr/local).
pub const ISCSIADM_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

impl HostFrontends {
    /// Looks at the host through `root`.
    pub fn probe(root: &HostRoot) -> Self {
        Self {
            nvme_tcp: nvme_tcp_available(root),
            iscsi: iscsi_available(root),
        }
    }

    /// Each initiator looked for and why it is not usable for `exports`
    /// ("nvme-tcp (the nvme_tcp kernel module is neither loaded nor installed)").
    fn why_unusable(&self, exports: &[Export]) -> String {
        let exported = |t: Transport| exports.iter().any(|e| e.transport == t.as_str());
        let why = |t: Transport, here: bool, missing: &str| {
            if here && !exported(t) {
                format!("{t} (usable on this host, but the engine does not export it)")
            } else {
                format!("{t} ({missing})")
            }
        };
        format!(
            "{} and {}",
            why(
                Transport::NvmeTcp,
                self.nvme_tcp,
                "the nvme_tcp kernel module is neither loaded nor installed"
            ),
            why(
                Transport::Iscsi,
                self.iscsi,
                "no iscsid runs and no iscsiadm is installed: install open-iscsi"
            ),
        )
    }
}

/// Whether nvme_tcp is loaded (or built in: /sys/module has it either way) or listed in
/// `modules.dep` of the running kernel (`/proc/sys/kernel/osrelease`).
pub fn nvme_tcp_available(root: &HostRoot) -> bool {
    if root.exists("/sys/module/nvme_tcp") {
        return true;
    }
    let Ok(Some(release)) = root.read_attr_opt("/proc/sys/kernel/osrelease") else {
        return false;
    };
    if release.is_empty() || release.contains('/') || release.starts_with('.') {
        return false;
    }
    let dep = PathBuf::from("/lib/modules").join(&release).join("modules.dep");
    let Ok(text) = root.read_string(&dep) else {
        return false;
    };
    text.lines().any(|l| {
        let Some((module, _)) = l.split_once(':') else {
            return false;
        };
        let file = module.rsplit('/').next().unwrap_or(module);
        ["nvme-tcp.ko", "nvme_tcp.ko"]
            .iter()
            .any(|m| file == *m || file.strip_prefix(m).is_some_and(|ext| ext.starts_with('.')))
    })
}

/// Whether an iscsid process runs or `iscsiadm` is installed on the host.
pub fn iscsi_available(root: &HostRoot) -> bool {
    crate::ns::find_process(root, "iscsid").is_ok()
        || ISCSIADM_DIRS
            .iter()
            .any(|d| root.path(PathBuf::from(d).join("iscsiadm")).is_file())
}

/// The effective override: the attachment's when set, else the volume's.
pub fn effective(attachment: FrontendKind, volume: FrontendKind) -> FrontendKind {
    match attachment {
        FrontendKind::Auto => volume,
        k => k,
    }
}

/// Picks the frontend of `volume` and the export to use.
pub fn choose(
    volume: &str,
    host: HostFrontends,
    wanted: FrontendKind,
    exports: &[Export],
) -> Result<(Transport, Export), ChooseError> {
    let find = |t: Transport| exports.iter().find(|e| e.transport == t.as_str()).cloned();
    let offered = || {
        exports
            .iter()
            .map(|e| e.transport.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let explicit = match wanted {
        FrontendKind::NvmeTcp => Some(Transport::NvmeTcp),
        FrontendKind::Iscsi => Some(Transport::Iscsi),
        FrontendKind::Auto => None,
    };
    if let Some(t) = explicit {
        return find(t).map(|e| (t, e)).ok_or_else(|| ChooseError::NotExported {
            volume: volume.to_string(),
            wanted: t,
            offered: offered(),
        });
    }
    if host.nvme_tcp
        && let Some(e) = find(Transport::NvmeTcp)
    {
        return Ok((Transport::NvmeTcp, e));
    }
    if host.iscsi
        && let Some(e) = find(Transport::Iscsi)
    {
        return Ok((Transport::Iscsi, e));
    }
    Err(ChooseError::NoFrontend {
        volume: volume.to_string(),
        looked: host.why_unusable(exports),
        offered: offered(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn export(t: &str) -> Export {
        Export {
            transport: t.into(),
            address: "10.0.2.2".into(),
            port: 1,
            name: "x".into(),
            lun: 1,
            hosts: Vec::new(),
        }
    }

    fn w(root: &HostRoot, p: &str, v: &str) {
        let p = root.path(p);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, v).expect("write");
    }

    #[test]
    fn probes_loaded_loadable_and_iscsi() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        fs::create_dir_all(root.path("/proc")).expect("proc");
        assert_eq!(HostFrontends::probe(&root), HostFrontends::default());
        w(&root, "/proc/sys/kernel/osrelease", "6.1.0-28-amd64\n");
        w(
            &root,
            "/lib/modules/6.1.0-28-amd64/modules.dep",
            "kernel/drivers/nvme/host/nvme-fabrics.ko.xz: kernel/drivers/nvme/host/nvme-core.ko.xz\n",
        );
        assert!(!nvme_tcp_available(&root), "nvme-fabrics is not nvme-tcp");
        w(
            &root,
            "/lib/modules/6.1.0-28-amd64/modules.dep",
            "kernel/drivers/nvme/host/nvme-tcp.ko.xz: kernel/drivers/nvme/host/nvme-fabrics.ko.xz\n",
        );
        assert!(nvme_tcp_available(&root), "loadable");
        fs::remove_file(root.path("/lib/modules/6.1.0-28-amd64/modules.dep")).expect("rm");
        fs::create_dir_all(root.path("/sys/module/nvme_tcp")).expect("mkdir");
        assert!(nvme_tcp_available(&root), "loaded");
        assert!(!iscsi_available(&root));
        w(&root, "/usr/local/sbin/iscsiadm", "");
        assert!(iscsi_available(&root));
    }

    #[test]
    fn auto_prefers_nvme_and_respects_exports_and_overrides() {
        let both = HostFrontends {
            nvme_tcp: true,
            iscsi: true,
        };
        let v2 = [export("nvme-tcp"), export("iscsi")];
        let v1 = [export("iscsi")];
        assert_eq!(
            choose("v", both, FrontendKind::Auto, &v2).expect("auto").0,
            Transport::NvmeTcp
        );
        assert_eq!(
            choose("v", both, FrontendKind::Auto, &v1).expect("v1").0,
            Transport::Iscsi
        );
        let iscsi_only = HostFrontends {
            nvme_tcp: false,
            iscsi: true,
        };
        assert_eq!(
            choose("v", iscsi_only, FrontendKind::Auto, &v2)
                .expect("fallback")
                .0,
            Transport::Iscsi
        );
        assert_eq!(
            choose("v", both, FrontendKind::Iscsi, &v2).expect("override").0,
            Transport::Iscsi
        );
        let err = choose("v", both, FrontendKind::NvmeTcp, &v1).expect_err("not exported");
        assert!(
            err.to_string().contains("volume v asks for the nvme-tcp"),
            "{err}"
        );
        let none = HostFrontends::default();
        let err = choose("v", none, FrontendKind::Auto, &v1).expect_err("nothing");
        assert_eq!(
            err.to_string(),
            "no usable frontend for volume v: its engine exports [iscsi]; looked for nvme-tcp (the nvme_tcp \
             kernel module is neither loaded nor installed) and iscsi (no iscsid runs and no iscsiadm is \
             installed: install open-iscsi)"
        );
        let nvme_only = HostFrontends {
            nvme_tcp: true,
            iscsi: false,
        };
        let err = choose("v", nvme_only, FrontendKind::Auto, &v1).expect_err("not exported");
        assert!(
            err.to_string().contains(
                "looked for nvme-tcp (usable on this host, but the engine does not export it) and iscsi (no iscsid"
            ),
            "{err}"
        );
        assert_eq!(
            effective(FrontendKind::Auto, FrontendKind::Iscsi),
            FrontendKind::Iscsi
        );
        assert_eq!(
            effective(FrontendKind::NvmeTcp, FrontendKind::Iscsi),
            FrontendKind::NvmeTcp
        );
    }
}
