//! Rendering for the CLI: tables (comfy-table), YAML and JSON.

use comfy_table::presets::NOTHING;
use comfy_table::{ContentArrangement, Table};
use serde_json::Value;

use crate::runtime::{ControllerStatus, Event, Resource, TypeInfo};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns.
    Table,
    /// YAML.
    Yaml,
    /// JSON (pretty).
    Json,
}

/// Prints any value as YAML or JSON (tables fall back to YAML).
pub fn print_value(v: &Value, f: Format) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    match f {
        Format::Json => println!("{}", serde_json::to_string_pretty(v)?),
        Format::Yaml | Format::Table => print!("{}", serde_yaml_ng::to_string(v)?),
    }
    Ok(())
}

fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled);
    t
}

pub use crate::util::size::human_bytes;

/// The widest text a table cell shows; longer text (a message listing every
/// place looked at, a Talos patch) is cut there, whole in `-o yaml|json`.
const CELL_MAX: usize = 100;

/// A table cell's text: its first line, at most [`CELL_MAX`] characters, `…`
/// where it was cut (so that one long message does not widen every row).
pub(crate) fn short(s: String) -> String {
    let first = s.lines().next().unwrap_or_default();
    if first.len() == s.len() && s.chars().count() <= CELL_MAX {
        return s;
    }
    let mut out: String = first.chars().take(CELL_MAX - 1).collect();
    out.push('…');
    out
}

/// A table cell; a column whose pointer ends in `Bytes` shows a size for people.
fn column_cell(v: Option<&Value>, pointer: &str) -> String {
    match v.and_then(Value::as_u64) {
        Some(n) if pointer.ends_with("Bytes") => human_bytes(n),
        _ => short(cell(v)),
    }
}

fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => a.iter().map(|x| cell(Some(x))).collect::<Vec<_>>().join(","),
        Some(other) => other.to_string(),
    }
}

/// `talon get types`.
pub fn print_types(types: &[TypeInfo]) {
    let mut t = table();
    t.set_header(vec!["NAMESPACE", "TYPE", "PERSISTED", "DESCRIPTION"]);
    for ti in types {
        t.add_row(vec![
            ti.namespace.clone(),
            ti.type_.clone(),
            ti.persisted.to_string(),
            ti.description.clone(),
        ]);
    }
    println!("{t}");
}

/// `talon node info -o table`: a field and its value per row, an engine per row.
pub fn print_node_info(n: &crate::api::types::NodeInfo) {
    let mut t = table();
    t.set_header(vec!["FIELD", "VALUE"]);
    for (k, v) in [
        ("version", &n.version),
        ("hostname", &n.hostname),
        ("kernel", &n.kernel),
        ("os", &n.os_name),
        ("dataDir", &n.data_dir),
        ("hostNqn", &n.host_nqn),
        ("hostIqn", &n.host_iqn),
    ] {
        t.add_row(vec![k.to_string(), v.clone()]);
    }
    for e in &n.engines {
        let state = if e.available { "available" } else { "unavailable" };
        t.add_row(vec![
            format!("engine {}", e.engine),
            short(format!("{state}: {}", e.detail)),
        ]);
    }
    println!("{t}");
}

/// `talon get controllers`.
pub fn print_controllers(cs: &[ControllerStatus]) {
    let mut t = table();
    t.set_header(vec![
        "NAME",
        "INPUTS",
        "OUTPUTS",
        "STATE",
        "RESTARTS",
        "LAST ERROR",
    ]);
    for c in cs {
        let ins: Vec<String> = c.inputs.iter().map(|i| i.type_.clone()).collect();
        let outs: Vec<String> = c.outputs.iter().map(|o| o.type_.clone()).collect();
        t.add_row(vec![
            c.name.clone(),
            ins.join(","),
            outs.join(","),
            serde_json::to_value(c.state)
                .map(|v| cell(Some(&v)))
                .unwrap_or_default(),
            c.restarts.to_string(),
            short(c.last_error.clone().unwrap_or_default()),
        ]);
    }
    println!("{t}");
}

fn resource_row(r: &Resource, info: Option<&TypeInfo>) -> Vec<String> {
    let m = &r.metadata;
    let mut row = vec![
        m.namespace.clone(),
        m.type_.clone(),
        m.id.clone(),
        m.version.to_string(),
    ];
    if let Some(info) = info {
        for c in &info.columns {
            row.push(column_cell(r.spec.pointer(&c.pointer), &c.pointer));
        }
    }
    row
}

fn resource_header(info: Option<&TypeInfo>) -> Vec<String> {
    let mut h: Vec<String> = ["NAMESPACE", "TYPE", "ID", "VERSION"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Some(info) = info {
        h.extend(info.columns.iter().map(|c| c.name.clone()));
    }
    h
}

/// `talon get <type>` as a table.
pub fn print_resources(items: &[Resource], info: Option<&TypeInfo>) {
    let mut t = table();
    t.set_header(resource_header(info));
    for r in items {
        t.add_row(resource_row(r, info));
    }
    println!("{t}");
}

/// One watch event.
pub fn print_event(
    ev: &Event,
    f: Format,
    info: Option<&TypeInfo>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    match f {
        Format::Table => {
            let kind = serde_json::to_value(ev.kind)
                .map(|v| cell(Some(&v)))
                .unwrap_or_default();
            println!("{kind:<9} {}", resource_row(&ev.resource, info).join("  "));
        }
        Format::Json => println!("{}", serde_json::to_string(ev)?),
        Format::Yaml => print!("---\n{}", serde_yaml_ng::to_string(ev)?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(1_073_741_824), "1 GiB");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
        assert_eq!(human_bytes(10 << 40), "10 TiB");
        assert_eq!(column_cell(Some(&Value::from(1u64 << 30)), "/sizeBytes"), "1 GiB");
        assert_eq!(column_cell(Some(&Value::from(3)), "/replicas"), "3");
    }

    #[test]
    fn long_messages_are_cut_in_tables() {
        let long = format!("spdk_tgt was not found in {}", "/usr/local/sbin, ".repeat(40));
        let c = column_cell(Some(&Value::from(long.clone())), "/message");
        assert_eq!(c.chars().count(), CELL_MAX, "{c}");
        assert!(
            c.starts_with("spdk_tgt was not found in /usr") && c.ends_with('…'),
            "{c}"
        );
        let c = column_cell(
            Some(&Value::from("wanted: x; apply\nmachine:\n  kernel: {}")),
            "/message",
        );
        assert_eq!(c, "wanted: x; apply…");
        assert_eq!(column_cell(Some(&Value::from("ok")), "/message"), "ok");
    }
}
