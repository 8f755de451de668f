//! Talos machine-config patches, the Image Factory schematic and the namespace
//! labels talon needs, in the shape of the Talos version asked for.
//!
//! ```text
//!   TalosNeeds { hugepages, modules, data_path, disks }
//!        │
//!        ├─ v1.13: v1alpha1 patch { machine.sysctls, machine.kernel.modules,
//!        │                          machine.kubelet.extraMounts (rshared) }
//!        │         + PCIDriverRebindConfig per disk
//!        └─ v1.15: SysctlConfig + KernelModuleConfig per module
//!                  + PCIDriverRebindConfig per disk  (no kubelet extraMounts in the schema)
//!        ──> serde types ──> multi-document YAML (serde_yaml_ng), schema-checked in tests
//! ```

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Errors of patch generation.
#[derive(Debug, thiserror::Error)]
pub enum TalosError {
    #[error("cannot render the Talos document {kind} as YAML")]
    Render {
        kind: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("cannot render the Talos document {kind} as JSON")]
    RenderJson {
        kind: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The Talos machine-config shape to generate.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum, schemars::JsonSchema,
)]
pub enum TalosVersion {
    /// v1.10 to v1.13: one `v1alpha1` document carries sysctls, modules, kubelet mounts.
    #[default]
    #[value(name = "1.13")]
    #[serde(rename = "1.13")]
    V1_13,
    /// v1.15 (development line): separate `SysctlConfig` and `KernelModuleConfig` documents.
    #[value(name = "1.15")]
    #[serde(rename = "1.15")]
    V1_15,
}

impl fmt::Display for TalosVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V1_13 => "1.13",
            Self::V1_15 => "1.15",
        })
    }
}

/// What the node needs, as the doctor measured it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TalosNeeds {
    /// `vm.nr_hugepages` (2 MiB pages) to set, when the node has too few.
    pub nr_hugepages: Option<u64>,
    /// Kernel modules to load at boot.
    pub modules: Vec<String>,
    /// talon's data path on the host, bind-mounted into the kubelet with rshared.
    pub data_path: String,
    /// (PCI address, target driver) for disks talon should own.
    pub disks: Vec<(String, String)>,
}

/// A `v1alpha1` machine-config patch (only the fields talon sets).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct V1Alpha1Patch {
    pub machine: MachinePatch,
}

/// `machine` of a v1alpha1 patch.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MachinePatch {
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub sysctls: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelPatch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletPatch>,
}

/// `machine.kernel`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelPatch {
    pub modules: Vec<KernelModule>,
}

/// One `machine.kernel.modules` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelModule {
    pub name: String,
}

/// `machine.kubelet`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletPatch {
    pub extra_mounts: Vec<ExtraMount>,
}

/// One `machine.kubelet.extraMounts` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExtraMount {
    pub destination: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub source: String,
    pub options: Vec<String>,
}

/// `PCIDriverRebindConfig` (v1.13 and later).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciDriverRebindConfig {
    pub api_version: String,
    pub kind: String,
    /// The PCI address.
    pub name: String,
    pub target_driver: String,
}

/// `SysctlConfig` (v1.15).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SysctlConfig {
    pub api_version: String,
    pub kind: String,
    pub params: BTreeMap<String, String>,
}

/// `KernelModuleConfig` (v1.15).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelModuleConfig {
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

/// One generated machine-config document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TalosDocument {
    V1Alpha1(V1Alpha1Patch),
    Sysctl(SysctlConfig),
    KernelModule(KernelModuleConfig),
    PciDriverRebind(PciDriverRebindConfig),
}

impl TalosDocument {
    /// The document's kind, `v1alpha1` for the classic machine document.
    pub fn kind(&self) -> &str {
        match self {
            Self::V1Alpha1(_) => "v1alpha1",
            Self::Sysctl(d) => &d.kind,
            Self::KernelModule(d) => &d.kind,
            Self::PciDriverRebind(d) => &d.kind,
        }
    }
}

/// The Image Factory schematic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schematic {
    pub customization: Customization,
}

/// `customization` of a schematic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Customization {
    pub system_extensions: SystemExtensions,
}

/// `customization.systemExtensions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemExtensions {
    pub official_extensions: Vec<String>,
}

/// The schematic talon needs: iSCSI tools (V1 engine, iSCSI attach) and util-linux tools.
pub fn schematic() -> Schematic {
    Schematic {
        customization: Customization {
            system_extensions: SystemExtensions {
                official_extensions: vec![
                    "siderolabs/iscsi-tools".into(),
                    "siderolabs/util-linux-tools".into(),
                ],
            },
        },
    }
}

/// The pod-security labels talon's namespace needs (it runs privileged pods).
pub fn namespace_labels() -> BTreeMap<String, String> {
    ["enforce", "audit", "warn"]
        .into_iter()
        .map(|m| {
            (
                format!("pod-security.kubernetes.io/{m}"),
                "privileged".to_string(),
            )
        })
        .collect()
}

/// The warning every Talos user of talon must see.
pub fn upgrade_warning(data_path: &str) -> String {
    format!(
        "`talosctl upgrade` without `--preserve` wipes the EPHEMERAL partition, and with it {data_path} (all replicas on this node); always upgrade with --preserve"
    )
}

/// The machine-config documents for `needs` in the shape of `version`.
pub fn documents(version: TalosVersion, needs: &TalosNeeds) -> Vec<TalosDocument> {
    let mut docs = Vec::new();
    let rebinds = needs.disks.iter().map(|(bdf, driver)| {
        TalosDocument::PciDriverRebind(PciDriverRebindConfig {
            api_version: "v1alpha1".into(),
            kind: "PCIDriverRebindConfig".into(),
            name: bdf.clone(),
            target_driver: driver.clone(),
        })
    });
    match version {
        TalosVersion::V1_13 => {
            let mut machine = MachinePatch::default();
            if let Some(n) = needs.nr_hugepages {
                machine.sysctls.insert("vm.nr_hugepages".into(), n.to_string());
            }
            if !needs.modules.is_empty() {
                machine.kernel = Some(KernelPatch {
                    modules: needs
                        .modules
                        .iter()
                        .map(|m| KernelModule { name: m.clone() })
                        .collect(),
                });
            }
            machine.kubelet = Some(KubeletPatch {
                extra_mounts: vec![ExtraMount {
                    destination: needs.data_path.clone(),
                    kind: "bind".into(),
                    source: needs.data_path.clone(),
                    options: vec!["bind".into(), "rshared".into(), "rw".into()],
                }],
            });
            docs.push(TalosDocument::V1Alpha1(V1Alpha1Patch { machine }));
        }
        TalosVersion::V1_15 => {
            if let Some(n) = needs.nr_hugepages {
                docs.push(TalosDocument::Sysctl(SysctlConfig {
                    api_version: "v1alpha1".into(),
                    kind: "SysctlConfig".into(),
                    params: BTreeMap::from([("vm.nr_hugepages".to_string(), n.to_string())]),
                }));
            }
            for m in &needs.modules {
                docs.push(TalosDocument::KernelModule(KernelModuleConfig {
                    api_version: "v1alpha1".into(),
                    kind: "KernelModuleConfig".into(),
                    name: m.clone(),
                }));
            }
        }
    }
    docs.extend(rebinds);
    docs
}

/// Notes that go with the documents of `version`.
pub fn notes(version: TalosVersion, data_path: &str) -> Vec<String> {
    let mut n = vec![upgrade_warning(data_path)];
    if version == TalosVersion::V1_15 {
        n.push(format!(
            "the v1.15 schema has no kubelet extraMounts (KubeletConfig has none): keep the data path {data_path} under /var so the kubelet sees it"
        ));
    }
    n
}

/// Renders documents as one multi-document YAML stream.
pub fn to_yaml(docs: &[TalosDocument]) -> Result<String, TalosError> {
    let mut out = String::new();
    for d in docs {
        let y = serde_yaml_ng::to_string(d).map_err(|source| TalosError::Render {
            kind: d.kind().to_string(),
            source,
        })?;
        out.push_str("---\n");
        out.push_str(&y);
    }
    Ok(out)
}

/// Renders a schematic as YAML.
pub fn schematic_yaml(s: &Schematic) -> Result<String, TalosError> {
    serde_yaml_ng::to_string(s).map_err(|source| TalosError::Render {
        kind: "schematic".into(),
        source,
    })
}

/// The documents as JSON values (for `-o json` and for schema checks).
pub fn to_json(docs: &[TalosDocument]) -> Result<Vec<serde_json::Value>, TalosError> {
    docs.iter()
        .map(|d| {
            serde_json::to_value(d).map_err(|source| TalosError::RenderJson {
                kind: d.kind().to_string(),
                source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs() -> TalosNeeds {
        TalosNeeds {
            nr_hugepages: Some(512),
            modules: vec!["nvme_tcp".into(), "vfio_pci".into()],
            data_path: "/var/lib/talon".into(),
            disks: vec![("0000:01:00.0".into(), "vfio-pci".into())],
        }
    }

    #[test]
    fn v1_13_is_one_machine_patch_plus_rebinds() {
        let docs = documents(TalosVersion::V1_13, &needs());
        assert_eq!(docs.len(), 2);
        let y = to_yaml(&docs).expect("yaml");
        assert!(
            y.contains("vm.nr_hugepages: '512'") || y.contains("vm.nr_hugepages: \"512\""),
            "{y}"
        );
        assert!(
            y.contains("rshared") && y.contains("extraMounts") && y.contains("kind: PCIDriverRebindConfig"),
            "{y}"
        );
        assert_eq!(y.matches("---\n").count(), 2);
    }

    #[test]
    fn v1_15_splits_documents() {
        let docs = documents(TalosVersion::V1_15, &needs());
        let kinds: Vec<&str> = docs.iter().map(TalosDocument::kind).collect();
        assert_eq!(
            kinds,
            vec![
                "SysctlConfig",
                "KernelModuleConfig",
                "KernelModuleConfig",
                "PCIDriverRebindConfig"
            ]
        );
        assert!(
            notes(TalosVersion::V1_15, "/var/lib/talon")
                .iter()
                .any(|n| n.contains("--preserve"))
        );
        let s = schematic_yaml(&schematic()).expect("yaml");
        assert!(
            s.contains("siderolabs/iscsi-tools") && s.contains("officialExtensions"),
            "{s}"
        );
    }
}
