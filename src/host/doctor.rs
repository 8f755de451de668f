//! `talon doctor`: measures the host against what talon needs, says pass, warn
//! or fail with the measured value and the fix, and on Talos prints the
//! machine-config patch that fixes what is missing.
//!
//! ```text
//!   HostRoot ─> os · hugepages · hugetlbfs · modules · iommu · nvme disks ─> [Check]
//!                                                                              │
//!   target = talos (detected or --for talos) ─> TalosNeeds ─> talos::documents ─┴─> Report
//! ```
//!
//! The doctor only reads; it never loads modules, allocates hugepages or binds.

use super::HostRoot;
use super::hugepages::{self, PageSize};
use super::modules::{self, ModuleState};
use super::os::{self, OsRelease};
use super::pci;
use super::talos::{self, Schematic, TalosNeeds, TalosVersion};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The default data path of talon on the host.
pub const DEFAULT_DATA_PATH: &str = "/var/lib/talon";

/// Errors of the doctor itself (not failing checks: those are in the report).
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error("cannot generate the Talos machine-config patch")]
    Talos(#[from] talos::TalosError),
}

/// Which host kind to give advice for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Talos,
    Generic,
}

/// What the user asked the doctor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorOptions {
    /// `None`: detect from os-release.
    pub target: Option<Target>,
    /// Hugepage MiB wanted; `None`: size for `volumes`.
    pub hugepages_mib: Option<u64>,
    /// Disks talon should own (PCI address, serial or model).
    pub disks: Vec<String>,
    pub talos_version: TalosVersion,
    /// Expected attached NVMe/TCP volumes, for hugepage sizing.
    pub volumes: u32,
    pub data_path: String,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        Self {
            target: None,
            hugepages_mib: None,
            disks: Vec::new(),
            talos_version: TalosVersion::default(),
            volumes: 8,
            data_path: DEFAULT_DATA_PATH.to_string(),
        }
    }
}

/// The verdict of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

/// One check: what was measured and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub measured: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// The Talos part of the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TalosAdvice {
    pub version: TalosVersion,
    /// The machine-config documents (as JSON values).
    pub machine_config: Vec<serde_json::Value>,
    /// The same documents as one multi-document YAML stream.
    pub machine_config_yaml: String,
    pub schematic: Schematic,
    pub namespace_labels: BTreeMap<String, String>,
    pub notes: Vec<String>,
}

/// The doctor's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub os: Option<OsRelease>,
    pub target: Target,
    pub checks: Vec<Check>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub talos: Option<TalosAdvice>,
}

impl Report {
    /// The worst status of all checks.
    pub fn worst(&self) -> Status {
        self.checks.iter().map(|c| c.status).max().unwrap_or(Status::Pass)
    }

    /// The human-readable form.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            let tag = match c.status {
                Status::Pass => "PASS",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            out.push_str(&format!("{tag}  {:<22} {}\n", c.name, c.measured));
            if let Some(f) = &c.fix {
                out.push_str(&format!("      fix: {f}\n"));
            }
        }
        if let Some(t) = &self.talos {
            out.push_str(&format!(
                "\n# Talos v{} machine-config patch (talosctl patch mc --patch @talon.yaml)\n",
                t.version
            ));
            out.push_str(&t.machine_config_yaml);
            out.push_str("\n# Image Factory schematic\n");
            out.push_str(&talos::schematic_yaml(&t.schematic).unwrap_or_default());
            out.push_str("\n# Labels for talon's namespace\n");
            for (k, v) in &t.namespace_labels {
                out.push_str(&format!("{k}: {v}\n"));
            }
            for n in &t.notes {
                out.push_str(&format!("\nWARNING: {n}\n"));
            }
        }
        out
    }
}

/// An error with its sources, joined with ": ".
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn check(name: impl Into<String>, status: Status, measured: impl Into<String>, fix: Option<String>) -> Check {
    Check {
        name: name.into(),
        status,
        measured: measured.into(),
        fix,
    }
}

/// Runs every check; never changes the host.
pub fn run(root: &HostRoot, opts: &DoctorOptions) -> Result<Report, DoctorError> {
    let mut checks = Vec::new();
    let os = match os::detect(root) {
        Ok(o) => {
            let name = o.pretty_name.clone().unwrap_or_else(|| o.id.clone());
            checks.push(check("os", Status::Pass, format!("{name} (ID={})", o.id), None));
            Some(o)
        }
        Err(e) => {
            checks.push(check(
                "os",
                Status::Warn,
                chain(&e),
                Some("pass --for talos|generic".into()),
            ));
            None
        }
    };
    let on_talos = os.as_ref().is_some_and(OsRelease::is_talos);
    let target = opts
        .target
        .unwrap_or(if on_talos { Target::Talos } else { Target::Generic });
    let talos_target = target == Target::Talos;
    let mut needs = TalosNeeds {
        data_path: opts.data_path.clone(),
        ..TalosNeeds::default()
    };

    // Hugepages.
    let want_mib = opts
        .hugepages_mib
        .unwrap_or_else(|| hugepages::spdk_sizing_mib(opts.volumes));
    let want_pages = want_mib.div_ceil(PageSize::Size2M.mib());
    let sizing = match opts.hugepages_mib {
        Some(_) => format!("{want_mib} MiB asked"),
        None => format!(
            "{want_mib} MiB for {} attached volumes ({} MiB + {} MiB each)",
            opts.volumes,
            hugepages::SPDK_BASE_MIB,
            hugepages::SPDK_MIB_PER_VOLUME
        ),
    };
    let hp_fix = if talos_target {
        format!("machine-config sysctl vm.nr_hugepages: \"{want_pages}\" (patch below)")
    } else {
        format!("talon host hugepages --set {want_pages} --size 2M")
    };
    match hugepages::totals(root, PageSize::Size2M) {
        Ok(t) => {
            let per_node: Vec<String> = hugepages::pools(root)
                .unwrap_or_default()
                .iter()
                .filter(|p| p.size == PageSize::Size2M)
                .filter_map(|p| {
                    Some(format!(
                        "node{}: {}/{} MiB free",
                        p.node?,
                        p.free_mib(),
                        p.total_mib()
                    ))
                })
                .collect();
            let nodes = if per_node.is_empty() {
                String::new()
            } else {
                format!(" ({})", per_node.join(", "))
            };
            let measured = format!(
                "{} MiB total, {} MiB free of 2M pages{nodes}; need {sizing}",
                t.total_mib(),
                t.free_mib()
            );
            // the pages SPDK can take are the free ones: a pool big enough but held by others
            // does not pass
            let mut measured = measured;
            let status = if t.free >= want_pages {
                Status::Pass
            } else if t.total > 0 {
                if t.total >= want_pages {
                    measured.push_str(&format!(
                        " (free is {} MiB short: other processes hold pages)",
                        (want_pages - t.free) * PageSize::Size2M.mib()
                    ));
                }
                Status::Warn
            } else {
                Status::Fail
            };
            if status != Status::Pass {
                needs.nr_hugepages = Some(want_pages);
            }
            checks.push(check(
                "hugepages-2M",
                status,
                measured,
                (status != Status::Pass).then_some(hp_fix),
            ));
        }
        Err(e) => {
            needs.nr_hugepages = Some(want_pages);
            checks.push(check(
                "hugepages-2M",
                Status::Fail,
                format!("{}; need {sizing}", chain(&e)),
                Some(hp_fix),
            ));
        }
    }
    match hugepages::hugetlbfs_mounts(root) {
        Ok(m) if !m.is_empty() => checks.push(check(
            "hugetlbfs",
            Status::Pass,
            format!(
                "mounted at {}",
                m.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None,
        )),
        Ok(_) => checks.push(check(
            "hugetlbfs",
            Status::Warn,
            "no hugetlbfs mounted",
            Some("talon host hugepages --set N mounts it at /dev/hugepages (spdk_tgt needs one)".into()),
        )),
        Err(e) => checks.push(check("hugetlbfs", Status::Warn, chain(&e), None)),
    }

    // Kernel modules.
    for &m in modules::TALON_MODULES {
        let required = matches!(m, "nvme_tcp" | "nvme_fabrics");
        let fix = |verb: &str| {
            if talos_target {
                format!("machine.kernel.modules: {m} (patch below)")
            } else {
                format!("{verb} modprobe {m}")
            }
        };
        let c = match modules::module_state(root, m) {
            Ok(s @ (ModuleState::Loaded | ModuleState::Builtin)) => check(
                format!("module {m}"),
                Status::Pass,
                format!("{s:?}").to_lowercase(),
                None,
            ),
            Ok(ModuleState::Available) => {
                needs.modules.push(m.to_string());
                check(
                    format!("module {m}"),
                    Status::Warn,
                    "installed, not loaded",
                    Some(fix("run")),
                )
            }
            Ok(ModuleState::Missing) => {
                needs.modules.push(m.to_string());
                let status = if required { Status::Fail } else { Status::Warn };
                let why = match m {
                    "vfio_pci" | "uio_pci_generic" => "needed to give local NVMe disks to SPDK",
                    "iscsi_tcp" => "needed for the iSCSI fallback",
                    _ => "needed to attach volumes over NVMe/TCP",
                };
                check(
                    format!("module {m}"),
                    status,
                    format!("not installed ({why})"),
                    Some(fix("install the kernel module package, then")),
                )
            }
            Err(e) => check(format!("module {m}"), Status::Warn, chain(&e), None),
        };
        checks.push(c);
    }
    if talos_target && !on_talos {
        // The measured modules are this host's, not the Talos node's: ask for all.
        needs.modules = ["nvme_tcp", "vfio_pci", "uio_pci_generic"]
            .map(String::from)
            .to_vec();
    }

    // IOMMU and disks.
    if pci::iommu_active(root) {
        checks.push(check("iommu", Status::Pass, "active", None));
    } else {
        checks.push(check(
            "iommu",
            Status::Warn,
            "no IOMMU active: disks can only go to uio_pci_generic",
            Some("enable VT-d/AMD-Vi in firmware and intel_iommu=on / amd_iommu=on".into()),
        ));
    }
    match pci::list_nvme(root) {
        Ok(all) => checks.push(check(
            "nvme-devices",
            Status::Pass,
            if all.is_empty() {
                "none (volumes can still be file- or malloc-backed)".to_string()
            } else {
                all.iter()
                    .map(|d| {
                        format!(
                            "{} ({}, {})",
                            d.bdf,
                            d.serial.as_deref().unwrap_or("?"),
                            d.driver.as_deref().unwrap_or("unbound")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            None,
        )),
        Err(e) => checks.push(check("nvme-devices", Status::Warn, chain(&e), None)),
    }
    for sel in &opts.disks {
        let name = format!("disk {sel}");
        let dev = match pci::select(root, sel) {
            Ok(d) => d,
            Err(e) => {
                checks.push(check(
                    name,
                    Status::Fail,
                    chain(&e),
                    Some("list disks with `talon host pci list`".into()),
                ));
                continue;
            }
        };
        let driver = dev.driver.clone().unwrap_or_else(|| "unbound".into());
        if matches!(dev.driver.as_deref(), Some("vfio-pci" | "uio_pci_generic")) {
            needs.disks.push((dev.bdf.to_string(), driver.clone()));
            checks.push(check(
                name,
                Status::Pass,
                format!("{} on {driver}", dev.bdf),
                None,
            ));
            continue;
        }
        match pci::in_use(root, &dev) {
            Ok(Some(reason)) => {
                checks.push(check(
                    name,
                    Status::Fail,
                    format!("{} in use: {reason}", dev.bdf),
                    Some("choose another disk, or wipe this one after moving its data".into()),
                ));
                continue;
            }
            Err(e) => {
                checks.push(check(name, Status::Fail, chain(&e), None));
                continue;
            }
            Ok(None) => {}
        }
        // On a Talos target without a measured Talos node, assume vfio-pci.
        let chosen = match pci::choose_driver(root, &dev) {
            Ok(d) => Ok(d.sysfs_name().to_string()),
            Err(_) if talos_target && !on_talos => Ok("vfio-pci".to_string()),
            Err(e) => Err(e),
        };
        match chosen {
            Ok(d) => {
                needs.disks.push((dev.bdf.to_string(), d.clone()));
                let fix = if talos_target {
                    format!("PCIDriverRebindConfig {} -> {d} (patch below)", dev.bdf)
                } else {
                    format!("talon host pci bind {} --driver {d}", dev.bdf)
                };
                checks.push(check(
                    name,
                    Status::Warn,
                    format!("{} on {driver}, free", dev.bdf),
                    Some(fix),
                ));
            }
            Err(e) => checks.push(check(name, Status::Fail, chain(&e), None)),
        }
    }

    let talos = if talos_target {
        checks.push(check(
            "talos-upgrade",
            Status::Warn,
            format!("data path {} lives on EPHEMERAL", opts.data_path),
            Some("always run `talosctl upgrade --preserve`".into()),
        ));
        let docs = talos::documents(opts.talos_version, &needs);
        Some(TalosAdvice {
            version: opts.talos_version,
            machine_config: talos::to_json(&docs)?,
            machine_config_yaml: talos::to_yaml(&docs)?,
            schematic: talos::schematic(),
            namespace_labels: talos::namespace_labels(),
            notes: talos::notes(opts.talos_version, &opts.data_path),
        })
    } else {
        None
    };
    Ok(Report {
        os,
        target,
        checks,
        talos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hugepages_pass_only_when_free_covers_the_need() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(d.path());
        let dir = root.path("/sys/kernel/mm/hugepages/hugepages-2048kB");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let hp = |total: u64, free: u64| {
            std::fs::write(dir.join("nr_hugepages"), format!("{total}\n")).expect("w");
            std::fs::write(dir.join("free_hugepages"), format!("{free}\n")).expect("w");
            let opts = DoctorOptions {
                hugepages_mib: Some(1024),
                ..Default::default()
            };
            let r = run(&root, &opts).expect("doctor");
            r.checks
                .into_iter()
                .find(|c| c.name == "hugepages-2M")
                .expect("hugepages")
        };
        let c = hp(512, 512);
        assert_eq!(c.status, Status::Pass, "{c:?}");
        let c = hp(600, 10);
        assert_eq!(c.status, Status::Warn, "free 20 MiB < need 1024 MiB: {c:?}");
        assert!(c.measured.contains("1200 MiB total, 20 MiB free"), "{c:?}");
        assert!(c.measured.contains("free is 1004 MiB short"), "{c:?}");
        assert_eq!(hp(0, 0).status, Status::Fail);
    }

    #[test]
    fn an_empty_root_fails_clearly_and_renders_in_every_format() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(d.path());
        let opts = DoctorOptions {
            target: Some(Target::Talos),
            volumes: 2,
            ..Default::default()
        };
        let r = run(&root, &opts).expect("doctor");
        assert_eq!(r.checks[0].name, "os");
        assert_eq!(r.checks[0].status, Status::Warn);
        assert!(r.checks[0].measured.contains("os-release"), "{:?}", r.checks[0]);
        assert_eq!(r.worst(), Status::Fail);
        let hp = r
            .checks
            .iter()
            .find(|c| c.name == "hugepages-2M")
            .expect("hugepages");
        assert!(
            hp.measured
                .contains("1040 MiB for 2 attached volumes (1024 MiB + 8 MiB each)"),
            "{hp:?}"
        );
        let t = r.talos.as_ref().expect("talos");
        assert!(
            t.machine_config_yaml.contains("vm.nr_hugepages: '520'"),
            "{}",
            t.machine_config_yaml
        );
        let text = r.to_text();
        assert!(
            text.contains("WARNING: `talosctl upgrade` without `--preserve`"),
            "{text}"
        );
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["target"], "talos");
        assert_eq!(json["checks"][0]["status"], "warn");
        let yaml = serde_yaml_ng::to_string(&r).expect("yaml");
        assert!(yaml.contains("machine_config_yaml"), "{yaml}");
    }
}
