//! Every machine-config document talon generates validates against Talos's own
//! schemas (read from `../shared/talos/`, never copied into the repo): partial
//! v1alpha1 patches against their `$defs`, whole documents of the newer kinds
//! against the schema's top-level `oneOf`.

use serde_json::{Value, json};
use std::path::PathBuf;
use talon::host::talos::{self, TalosDocument, TalosNeeds, TalosVersion};

/// The shared schema `file` (../shared/talos beside the repository, else
/// /work/shared/talos), found as tests/deploy_talos.rs finds it.
fn schema(file: &str) -> Option<Value> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let path = [repo.join("../shared/talos"), PathBuf::from("/work/shared/talos")]
        .iter()
        .map(|d| d.join(file))
        .find(|p| p.is_file())?;
    let text = std::fs::read_to_string(&path).ok()?;
    Some(serde_json::from_str(&text).expect("schema is JSON"))
}

/// The schema with its top-level `oneOf` replaced by a reference to one `$defs` entry.
fn def_validator(schema: &Value, def: &str) -> jsonschema::Validator {
    let mut s = schema.clone();
    let obj = s.as_object_mut().expect("object");
    obj.remove("oneOf");
    obj.insert("$ref".into(), json!(format!("#/$defs/{def}")));
    jsonschema::validator_for(&s).expect("compile def")
}

fn errors(v: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    v.iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

fn full_needs() -> TalosNeeds {
    TalosNeeds {
        nr_hugepages: Some(428),
        modules: vec!["nvme_tcp".into(), "vfio_pci".into(), "uio_pci_generic".into()],
        data_path: "/var/lib/talon".into(),
        disks: vec![
            ("0000:01:00.0".into(), "vfio-pci".into()),
            ("0000:02:00.0".into(), "uio_pci_generic".into()),
        ],
    }
}

fn validate_all(version: TalosVersion, schema: &Value) -> usize {
    let whole = jsonschema::validator_for(schema).expect("compile schema");
    let machine = def_validator(schema, "v1alpha1.MachineConfig");
    let docs = talos::documents(version, &full_needs());
    let values = talos::to_json(&docs).expect("json");
    for (d, v) in docs.iter().zip(&values) {
        let errs = match d {
            // A patch: its `machine` sub-object against v1alpha1.MachineConfig.
            TalosDocument::V1Alpha1(_) => errors(&machine, &v["machine"]),
            _ => errors(&whole, v),
        };
        assert!(
            errs.is_empty(),
            "v{version} {} does not validate: {errs:#?}\n{v:#}",
            d.kind()
        );
    }
    // The YAML we print parses back to the same documents.
    let yaml = talos::to_yaml(&docs).expect("yaml");
    let back: Vec<Value> = yaml
        .split("---\n")
        .filter(|s| !s.trim().is_empty())
        .map(|s| serde_yaml_ng::from_str(s).expect("yaml doc"))
        .collect();
    assert_eq!(back, values);
    docs.len()
}

#[test]
fn v1_13_documents_validate() {
    let Some(schema) = schema("config.schema.v1.13.json") else {
        eprintln!(
            "SKIP v1_13_documents_validate: config.schema.v1.13.json not in ../shared/talos nor /work/shared/talos"
        );
        return;
    };
    assert_eq!(validate_all(TalosVersion::V1_13, &schema), 3);
    // The validator is not vacuous: an unknown machine field and a bad rebind fail.
    let machine = def_validator(&schema, "v1alpha1.MachineConfig");
    assert!(!errors(&machine, &json!({"kubelet": {"extraMountz": []}})).is_empty());
    let whole = jsonschema::validator_for(&schema).expect("compile");
    assert!(
        !errors(
            &whole,
            &json!({"apiVersion": "v1alpha1", "kind": "PCIDriverRebindConfig", "name": "x"})
        )
        .is_empty()
    );
}

#[test]
fn v1_15_documents_validate() {
    let Some(schema) = schema("config.schema.v1.15-dev.json") else {
        eprintln!(
            "SKIP v1_15_documents_validate: config.schema.v1.15-dev.json not in ../shared/talos nor /work/shared/talos"
        );
        return;
    };
    assert_eq!(validate_all(TalosVersion::V1_15, &schema), 6);
    // The v1.13 shape is not valid there: machine.sysctls moved to SysctlConfig.
    let machine = def_validator(&schema, "v1alpha1.MachineConfig");
    let old = talos::to_json(&talos::documents(TalosVersion::V1_13, &full_needs())).expect("json");
    assert!(
        !errors(&machine, &old[0]["machine"]).is_empty(),
        "v1.13 shape unexpectedly valid on v1.15"
    );
}

/// The patches the daemon puts in `HugepagesStatus.talosPatch` and
/// `KernelModuleStatus.message` (the documents without the kubelet mount)
/// validate too.
#[test]
fn status_patches_validate() {
    use talon::controllers::host::hugepages::hugepages_only;
    for (version, file) in [
        (TalosVersion::V1_13, "config.schema.v1.13.json"),
        (TalosVersion::V1_15, "config.schema.v1.15-dev.json"),
    ] {
        let Some(schema) = schema(file) else {
            eprintln!("SKIP status_patches_validate: {file} not in ../shared/talos nor /work/shared/talos");
            return;
        };
        let whole = jsonschema::validator_for(&schema).expect("compile schema");
        let machine = def_validator(&schema, "v1alpha1.MachineConfig");
        for needs in [
            TalosNeeds {
                nr_hugepages: Some(512),
                ..TalosNeeds::default()
            },
            TalosNeeds {
                modules: vec!["nvme_tcp".into()],
                ..TalosNeeds::default()
            },
        ] {
            let docs = hugepages_only(talos::documents(version, &needs));
            let values = talos::to_json(&docs).expect("json");
            assert!(!values.is_empty());
            for (d, v) in docs.iter().zip(&values) {
                let errs = match d {
                    TalosDocument::V1Alpha1(_) => {
                        assert!(v["machine"].get("kubelet").is_none(), "{v:#}");
                        errors(&machine, &v["machine"])
                    }
                    _ => errors(&whole, v),
                };
                assert!(errs.is_empty(), "v{version} {}: {errs:#?}\n{v:#}", d.kind());
            }
        }
    }
}
