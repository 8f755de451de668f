//! Resources: metadata plus a typed spec, and the registry of known types.
//!
//! ```text
//!   Spec (typed, e.g. Volume) ──serde──> Resource { metadata, spec: Value } ──> State
//!                                        TypeRegistry: type name -> namespace, columns, JSON schema
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The lifecycle phase of a resource (COSI: running or tearing down).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Wanted and live.
    #[default]
    Running,
    /// Deletion was asked for; finalizers still hold it.
    TearingDown,
}

/// Metadata common to every resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// The namespace: `config`, `host`, `engine` or `frontend`.
    pub namespace: String,
    /// The resource type, e.g. `Volume`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The id, unique within namespace and type.
    pub id: String,
    /// Incremented on every change; starts at 1.
    pub version: u64,
    /// The controller that owns the resource; empty for user-owned (API, config file).
    #[serde(default)]
    pub owner: String,
    /// Running or tearing down.
    #[serde(default)]
    pub phase: Phase,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Controllers that must release the resource before it is destroyed.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub finalizers: BTreeSet<String>,
    /// Creation time, RFC 3339.
    pub created: String,
    /// Last change, RFC 3339.
    pub updated: String,
}

/// A resource type as a noun in a sentence: `Volume` -> `volume`,
/// `EngineStatus` -> `engine status` ("volume \"x\" not found", as the API's
/// own messages say it).
pub fn type_noun(type_: &str) -> String {
    let mut out = String::with_capacity(type_.len() + 4);
    for (i, c) in type_.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push(' ');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// Now, as an RFC 3339 string with milliseconds.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl Metadata {
    /// Metadata for a resource about to be created.
    pub fn new(namespace: &str, type_: &str, id: &str, owner: &str) -> Self {
        let now = now_rfc3339();
        Self {
            namespace: namespace.to_string(),
            type_: type_.to_string(),
            id: id.to_string(),
            version: 1,
            owner: owner.to_string(),
            phase: Phase::Running,
            labels: BTreeMap::new(),
            finalizers: BTreeSet::new(),
            created: now.clone(),
            updated: now,
        }
    }
}

/// A resource as stored: metadata and an untyped spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resource {
    /// Metadata.
    pub metadata: Metadata,
    /// The spec, as JSON (its shape is given by the type's schema).
    pub spec: Value,
}

/// A typed spec. Each spec type names its resource type and namespace.
pub trait Spec:
    Serialize + DeserializeOwned + Clone + PartialEq + Send + Sync + std::fmt::Debug + 'static
{
    /// The resource type name, e.g. `Volume`.
    const TYPE: &'static str;
    /// The namespace: `config`, `host`, `engine` or `frontend`.
    const NAMESPACE: &'static str;
}

/// A resource with its spec decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Typed<S> {
    /// Metadata.
    pub metadata: Metadata,
    /// The decoded spec.
    pub spec: S,
}

impl<S: Spec> Typed<S> {
    /// Decodes a stored resource.
    pub fn from_resource(r: Resource) -> Result<Self, serde_json::Error> {
        Ok(Self {
            spec: serde_json::from_value(r.spec)?,
            metadata: r.metadata,
        })
    }

    /// The resource id.
    pub fn id(&self) -> &str {
        &self.metadata.id
    }
}

/// A column of `talon get <type>` table output: a header and a JSON pointer into
/// the spec (e.g. `/sizeBytes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Column {
    /// Column header.
    pub name: String,
    /// JSON pointer into the spec.
    pub pointer: String,
}

/// What the runtime knows of a resource type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TypeInfo {
    /// The type name.
    #[serde(rename = "type")]
    pub type_: String,
    /// Its namespace.
    pub namespace: String,
    /// One line on what it holds.
    pub description: String,
    /// Whether it is persisted in the store (the `config` namespace).
    pub persisted: bool,
    /// Table columns beyond id/version/owner.
    pub columns: Vec<Column>,
    /// JSON schema of the spec.
    pub schema: Value,
}

/// Decodes a spec with its type's serde rules, keeping only whether it did.
type SpecCheck = fn(&Value) -> Result<(), serde_json::Error>;

/// The registry of resource types.
#[derive(Debug, Clone, Default)]
pub struct TypeRegistry {
    types: BTreeMap<String, TypeInfo>,
    checks: BTreeMap<String, SpecCheck>,
}

/// The namespaces persisted in the embedded store: desired state (`config`)
/// and the few facts controllers must not lose with a restart (`ledger`, e.g.
/// which replicas of a volume hold its newest data).
pub const PERSISTED_NAMESPACES: &[&str] = &["config", "ledger"];

/// Whether resources of namespace `ns` are persisted.
pub fn is_persisted(ns: &str) -> bool {
    PERSISTED_NAMESPACES.contains(&ns)
}

impl TypeRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a spec type with a description and table columns (`(header, pointer)`).
    pub fn register<S: Spec + schemars::JsonSchema>(&mut self, description: &str, columns: &[(&str, &str)]) {
        let schema = serde_json::to_value(schemars::schema_for!(S)).unwrap_or(Value::Null);
        self.checks
            .insert(S::TYPE.to_string(), |v| S::deserialize(v).map(drop));
        self.types.insert(
            S::TYPE.to_string(),
            TypeInfo {
                type_: S::TYPE.to_string(),
                namespace: S::NAMESPACE.to_string(),
                description: description.to_string(),
                persisted: is_persisted(S::NAMESPACE),
                columns: columns
                    .iter()
                    .map(|(n, p)| Column {
                        name: n.to_string(),
                        pointer: p.to_string(),
                    })
                    .collect(),
                schema,
            },
        );
    }

    /// Looks a type up by name, case-insensitively (`volume` finds `Volume`), also
    /// accepting a plural `s`.
    pub fn lookup(&self, name: &str) -> Option<&TypeInfo> {
        if let Some(t) = self.types.get(name) {
            return Some(t);
        }
        let lower = name.to_ascii_lowercase();
        self.types.values().find(|t| {
            let tl = t.type_.to_ascii_lowercase();
            tl == lower || format!("{tl}s") == lower || format!("{tl}es") == lower
        })
    }

    /// Whether `spec` decodes as the spec of `type_` (exact name), as
    /// [`crate::runtime::State::get_typed`] would decode it: `None` for a type
    /// that is not registered.
    pub fn check_spec(&self, type_: &str, spec: &Value) -> Option<Result<(), serde_json::Error>> {
        self.checks.get(type_).map(|check| check(spec))
    }

    /// Every registered type, sorted by namespace then name.
    pub fn all(&self) -> Vec<TypeInfo> {
        let mut v: Vec<TypeInfo> = self.types.values().cloned().collect();
        v.sort_by(|a, b| (&a.namespace, &a.type_).cmp(&(&b.namespace, &b.type_)));
        v
    }
}
