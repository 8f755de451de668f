//! The state store: every resource, in memory, with the `config` namespace
//! persisted in redb so that desired state survives a crash.
//!
//! ```text
//!   create/update/destroy ──> [redb commit, config only] ──> memory map ──> broadcast Event
//!                                 (durable before ack)                      └─> watch() subscribers
//! ```
//! A write to the `config` namespace is acknowledged only after its redb
//! transaction committed; a crash at any moment leaves either the old or the new
//! resource, never a partial one. Other namespaces are rebuilt from the host by
//! their controllers after a restart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::broadcast;

use super::resource::{Metadata, Phase, Resource, Spec, Typed, now_rfc3339};

const RESOURCES: TableDefinition<&str, &[u8]> = TableDefinition::new("resources");

/// What went wrong in the state store; names the resource.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{type_} {id:?} not found")]
    NotFound { type_: String, id: String },
    #[error("{type_} {id:?} already exists")]
    AlreadyExists { type_: String, id: String },
    #[error("{type_} {id:?} is at version {actual}, not {expected}")]
    Conflict {
        type_: String,
        id: String,
        expected: u64,
        actual: u64,
    },
    #[error("{type_} {id:?} is owned by {owner:?}, not {writer:?}")]
    NotOwner {
        type_: String,
        id: String,
        owner: String,
        writer: String,
    },
    #[error("spec of {type_} {id:?} does not decode")]
    Decode {
        type_: String,
        id: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("state store at {path} cannot be opened")]
    Open {
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },
    #[error("state store is already opened by another process ({path})")]
    Locked { path: PathBuf },
    #[error("state store write of {type_} {id:?} failed")]
    Persist {
        type_: String,
        id: String,
        #[source]
        source: Box<redb::Error>,
    },
}

/// The kind of change an [`Event`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// A resource appeared.
    Created,
    /// A resource changed (spec, labels, phase or finalizers).
    Updated,
    /// A resource was removed; the event carries its last state.
    Destroyed,
}

/// One change in the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The resource after the change (before it, for `destroyed`).
    pub resource: Resource,
}

/// What a destroy request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destroyed {
    /// The resource is gone.
    Gone,
    /// Finalizers hold it: it is now tearing down and goes when they are released.
    TearingDown,
}

type Key = (String, String, String);

struct Inner {
    mem: RwLock<BTreeMap<Key, Resource>>,
    db: Option<redb::Database>,
    events: broadcast::Sender<Event>,
}

/// The shared state store. Cheap to clone.
#[derive(Clone)]
pub struct State {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("persisted", &self.inner.db.is_some())
            .finish()
    }
}

fn key(ns: &str, ty: &str, id: &str) -> Key {
    (ns.to_string(), ty.to_string(), id.to_string())
}

fn db_key(ty: &str, id: &str) -> String {
    format!("{ty}/{id}")
}

fn persist_err(ty: &str, id: &str, e: impl Into<redb::Error>) -> StateError {
    StateError::Persist {
        type_: ty.to_string(),
        id: id.to_string(),
        source: Box::new(e.into()),
    }
}

impl State {
    /// A store with nothing persisted (tests, benchmarks).
    pub fn in_memory() -> Self {
        Self::with_db(None, BTreeMap::new())
    }

    /// Opens (or creates) the store at `path` and loads the persisted `config`
    /// namespace.
    pub fn open(path: &Path) -> Result<Self, StateError> {
        let open_err = |e: redb::Error| match e {
            redb::Error::DatabaseAlreadyOpen => StateError::Locked {
                path: path.to_path_buf(),
            },
            e => StateError::Open {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        };
        let db = redb::Database::create(path).map_err(|e| open_err(e.into()))?;
        let mut mem = BTreeMap::new();
        {
            let txn = db.begin_read().map_err(|e| open_err(e.into()))?;
            match txn.open_table(RESOURCES) {
                Ok(table) => {
                    for row in table.iter().map_err(|e| open_err(e.into()))? {
                        let (k, v) = row.map_err(|e| open_err(e.into()))?;
                        match serde_json::from_slice::<Resource>(v.value()) {
                            Ok(r) => {
                                let m = &r.metadata;
                                mem.insert(key(&m.namespace, &m.type_, &m.id), r);
                            }
                            Err(e) => {
                                tracing::error!(key = k.value(), error = %e, "skipping undecodable stored resource")
                            }
                        }
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(open_err(e.into())),
            }
        }
        Ok(Self::with_db(Some(db), mem))
    }

    fn with_db(db: Option<redb::Database>, mem: BTreeMap<Key, Resource>) -> Self {
        let (events, _) = broadcast::channel(4096);
        Self {
            inner: Arc::new(Inner {
                mem: RwLock::new(mem),
                db,
                events,
            }),
        }
    }

    fn persisted(&self, ns: &str) -> Option<&redb::Database> {
        if super::resource::is_persisted(ns) {
            self.inner.db.as_ref()
        } else {
            None
        }
    }

    fn write_db(&self, r: &Resource) -> Result<(), StateError> {
        let m = &r.metadata;
        let Some(db) = self.persisted(&m.namespace) else {
            return Ok(());
        };
        let bytes = serde_json::to_vec(r).map_err(|source| StateError::Decode {
            type_: m.type_.clone(),
            id: m.id.clone(),
            source,
        })?;
        let txn = db.begin_write().map_err(|e| persist_err(&m.type_, &m.id, e))?;
        {
            let mut t = txn
                .open_table(RESOURCES)
                .map_err(|e| persist_err(&m.type_, &m.id, e))?;
            t.insert(db_key(&m.type_, &m.id).as_str(), bytes.as_slice())
                .map_err(|e| persist_err(&m.type_, &m.id, e))?;
        }
        txn.commit().map_err(|e| persist_err(&m.type_, &m.id, e))
    }

    fn remove_db(&self, m: &Metadata) -> Result<(), StateError> {
        let Some(db) = self.persisted(&m.namespace) else {
            return Ok(());
        };
        let txn = db.begin_write().map_err(|e| persist_err(&m.type_, &m.id, e))?;
        {
            let mut t = txn
                .open_table(RESOURCES)
                .map_err(|e| persist_err(&m.type_, &m.id, e))?;
            t.remove(db_key(&m.type_, &m.id).as_str())
                .map_err(|e| persist_err(&m.type_, &m.id, e))?;
        }
        txn.commit().map_err(|e| persist_err(&m.type_, &m.id, e))
    }

    fn emit(&self, kind: EventKind, resource: Resource) {
        // No subscribers is fine.
        let _ = self.inner.events.send(Event { kind, resource });
    }

    fn lock_read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Key, Resource>> {
        self.inner.mem.read().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<Key, Resource>> {
        self.inner.mem.write().unwrap_or_else(|p| p.into_inner())
    }

    /// One resource.
    pub fn get(&self, ns: &str, ty: &str, id: &str) -> Option<Resource> {
        self.lock_read().get(&key(ns, ty, id)).cloned()
    }

    /// Every resource of a type, sorted by id.
    pub fn list(&self, ns: &str, ty: &str) -> Vec<Resource> {
        let mem = self.lock_read();
        mem.range(key(ns, ty, "")..)
            .take_while(|((n, t, _), _)| n == ns && t == ty)
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Subscribes to changes, and returns the current resources of a type (or of
    /// every type) taken atomically with the subscription, so nothing is missed.
    pub fn watch(&self, ns_type: Option<(&str, &str)>) -> (Vec<Resource>, broadcast::Receiver<Event>) {
        let mem = self.lock_read();
        let rx = self.inner.events.subscribe();
        let snapshot = match ns_type {
            Some((ns, ty)) => mem
                .range(key(ns, ty, "")..)
                .take_while(|((n, t, _), _)| n == ns && t == ty)
                .map(|(_, r)| r.clone())
                .collect(),
            None => mem.values().cloned().collect(),
        };
        (snapshot, rx)
    }

    /// Creates a resource; fails if it exists.
    pub fn create(
        &self,
        ns: &str,
        ty: &str,
        id: &str,
        owner: &str,
        spec: Value,
        labels: BTreeMap<String, String>,
    ) -> Result<Resource, StateError> {
        let mut mem = self.lock_write();
        let k = key(ns, ty, id);
        if mem.contains_key(&k) {
            return Err(StateError::AlreadyExists {
                type_: ty.to_string(),
                id: id.to_string(),
            });
        }
        let mut metadata = Metadata::new(ns, ty, id, owner);
        metadata.labels = labels;
        let r = Resource { metadata, spec };
        self.write_db(&r)?;
        mem.insert(k, r.clone());
        drop(mem);
        self.emit(EventKind::Created, r.clone());
        Ok(r)
    }

    /// Changes an existing resource through `change`, as `writer`. With
    /// `expected_version`, fails on a concurrent change. A change that leaves the
    /// resource as it was writes nothing and emits nothing.
    pub fn update(
        &self,
        ns: &str,
        ty: &str,
        id: &str,
        writer: &str,
        expected_version: Option<u64>,
        change: impl FnOnce(&mut Resource),
    ) -> Result<Resource, StateError> {
        self.update_inner(ns, ty, id, Some(writer), expected_version, change)
    }

    fn update_inner(
        &self,
        ns: &str,
        ty: &str,
        id: &str,
        writer: Option<&str>,
        expected_version: Option<u64>,
        change: impl FnOnce(&mut Resource),
    ) -> Result<Resource, StateError> {
        let mut mem = self.lock_write();
        let k = key(ns, ty, id);
        let Some(cur) = mem.get(&k) else {
            return Err(StateError::NotFound {
                type_: ty.to_string(),
                id: id.to_string(),
            });
        };
        if let Some(w) = writer
            && cur.metadata.owner != w
        {
            return Err(StateError::NotOwner {
                type_: ty.to_string(),
                id: id.to_string(),
                owner: cur.metadata.owner.clone(),
                writer: w.to_string(),
            });
        }
        if let Some(v) = expected_version
            && v != cur.metadata.version
        {
            return Err(StateError::Conflict {
                type_: ty.to_string(),
                id: id.to_string(),
                expected: v,
                actual: cur.metadata.version,
            });
        }
        let mut next = cur.clone();
        change(&mut next);
        // Identity fields are not the caller's to change.
        next.metadata.namespace = cur.metadata.namespace.clone();
        next.metadata.type_ = cur.metadata.type_.clone();
        next.metadata.id = cur.metadata.id.clone();
        next.metadata.owner = cur.metadata.owner.clone();
        next.metadata.created = cur.metadata.created.clone();
        next.metadata.version = cur.metadata.version;
        next.metadata.updated = cur.metadata.updated.clone();
        if &next == cur {
            return Ok(next);
        }
        next.metadata.version += 1;
        next.metadata.updated = now_rfc3339();
        // A tearing-down resource whose last finalizer went is destroyed.
        if next.metadata.phase == Phase::TearingDown && next.metadata.finalizers.is_empty() {
            self.remove_db(&next.metadata)?;
            mem.remove(&k);
            drop(mem);
            self.emit(EventKind::Destroyed, next.clone());
            return Ok(next);
        }
        self.write_db(&next)?;
        mem.insert(k, next.clone());
        drop(mem);
        self.emit(EventKind::Updated, next.clone());
        Ok(next)
    }

    /// Destroys a resource as `writer`. One with finalizers is only marked
    /// tearing-down; it goes when the last finalizer is removed.
    pub fn destroy(&self, ns: &str, ty: &str, id: &str, writer: &str) -> Result<Destroyed, StateError> {
        let mut mem = self.lock_write();
        let k = key(ns, ty, id);
        let Some(cur) = mem.get(&k) else {
            return Err(StateError::NotFound {
                type_: ty.to_string(),
                id: id.to_string(),
            });
        };
        if cur.metadata.owner != writer {
            return Err(StateError::NotOwner {
                type_: ty.to_string(),
                id: id.to_string(),
                owner: cur.metadata.owner.clone(),
                writer: writer.to_string(),
            });
        }
        if !cur.metadata.finalizers.is_empty() {
            drop(mem);
            self.update(ns, ty, id, writer, None, |r| {
                r.metadata.phase = Phase::TearingDown
            })?;
            return Ok(Destroyed::TearingDown);
        }
        let gone = cur.clone();
        self.remove_db(&gone.metadata)?;
        mem.remove(&k);
        drop(mem);
        self.emit(EventKind::Destroyed, gone);
        Ok(Destroyed::Gone)
    }

    /// Adds a finalizer (any controller may hold one on any resource it reads).
    pub fn add_finalizer(&self, ns: &str, ty: &str, id: &str, finalizer: &str) -> Result<(), StateError> {
        self.update_inner(ns, ty, id, None, None, |r| {
            r.metadata.finalizers.insert(finalizer.to_string());
        })
        .map(drop)
    }

    /// Removes a finalizer; a tearing-down resource left with none is destroyed.
    pub fn remove_finalizer(&self, ns: &str, ty: &str, id: &str, finalizer: &str) -> Result<(), StateError> {
        match self.update_inner(ns, ty, id, None, None, |r| {
            r.metadata.finalizers.remove(finalizer);
        }) {
            Ok(_) | Err(StateError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    // ---- typed helpers ----

    /// One typed resource.
    pub fn get_typed<S: Spec>(&self, id: &str) -> Result<Option<Typed<S>>, StateError> {
        self.get(S::NAMESPACE, S::TYPE, id)
            .map(|r| decode::<S>(r))
            .transpose()
    }

    /// Every typed resource of a type.
    pub fn list_typed<S: Spec>(&self) -> Result<Vec<Typed<S>>, StateError> {
        self.list(S::NAMESPACE, S::TYPE)
            .into_iter()
            .map(decode::<S>)
            .collect()
    }

    /// Creates a typed resource.
    pub fn create_typed<S: Spec>(&self, id: &str, owner: &str, spec: &S) -> Result<Typed<S>, StateError> {
        let v = encode(S::TYPE, id, spec)?;
        self.create(S::NAMESPACE, S::TYPE, id, owner, v, BTreeMap::new())
            .and_then(decode::<S>)
    }

    /// Replaces the spec of a typed resource.
    pub fn update_typed<S: Spec>(
        &self,
        id: &str,
        writer: &str,
        expected_version: Option<u64>,
        spec: &S,
    ) -> Result<Typed<S>, StateError> {
        let v = encode(S::TYPE, id, spec)?;
        self.update(S::NAMESPACE, S::TYPE, id, writer, expected_version, |r| {
            r.spec = v
        })
        .and_then(decode::<S>)
    }
}

fn encode<S: Spec>(ty: &str, id: &str, spec: &S) -> Result<Value, StateError> {
    serde_json::to_value(spec).map_err(|source| StateError::Decode {
        type_: ty.to_string(),
        id: id.to_string(),
        source,
    })
}

fn decode<S: Spec>(r: Resource) -> Result<Typed<S>, StateError> {
    let (ty, id) = (r.metadata.type_.clone(), r.metadata.id.clone());
    Typed::from_resource(r).map_err(|source| StateError::Decode {
        type_: ty,
        id,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_and_ledger_survive_reopen_and_others_do_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        {
            let s = State::open(&path).expect("open");
            s.create("config", "Volume", "v1", "", json!({"size": 1}), BTreeMap::new())
                .expect("create");
            s.create("engine", "EngineStatus", "v1", "c", json!({}), BTreeMap::new())
                .expect("create");
            s.create(
                "ledger",
                "ReplicaLedger",
                "v1",
                "c",
                json!({"inSync": [0]}),
                BTreeMap::new(),
            )
            .expect("create");
            s.update("config", "Volume", "v1", "", None, |r| {
                r.spec = json!({"size": 2})
            })
            .expect("update");
        }
        let s = State::open(&path).expect("reopen");
        let v = s.get("config", "Volume", "v1").expect("persisted");
        assert_eq!(v.spec, json!({"size": 2}));
        assert_eq!(v.metadata.version, 2);
        assert!(s.get("engine", "EngineStatus", "v1").is_none());
        let l = s.get("ledger", "ReplicaLedger", "v1").expect("ledger persisted");
        assert_eq!((l.spec, l.metadata.owner.as_str()), (json!({"inSync": [0]}), "c"));
    }

    #[test]
    fn second_open_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let _s = State::open(&path).expect("open");
        assert!(matches!(State::open(&path), Err(StateError::Locked { .. })));
    }

    #[test]
    fn owner_version_and_noop_rules() {
        let s = State::in_memory();
        s.create("engine", "T", "a", "ctl", json!(1), BTreeMap::new())
            .expect("create");
        let err = s
            .update("engine", "T", "a", "other", None, |r| r.spec = json!(2))
            .expect_err("owner");
        assert!(err.to_string().contains("owned by \"ctl\""), "{err}");
        let err = s
            .update("engine", "T", "a", "ctl", Some(7), |r| r.spec = json!(2))
            .expect_err("version");
        assert!(matches!(err, StateError::Conflict { actual: 1, .. }));
        let (_, mut rx) = s.watch(None);
        let same = s
            .update("engine", "T", "a", "ctl", None, |r| r.spec = json!(1))
            .expect("noop");
        assert_eq!(same.metadata.version, 1);
        assert!(rx.try_recv().is_err(), "a no-op update emits nothing");
    }

    #[test]
    fn finalizers_hold_a_destroy_until_released() {
        let s = State::in_memory();
        s.create("config", "Volume", "v", "", json!({}), BTreeMap::new())
            .expect("create");
        s.add_finalizer("config", "Volume", "v", "engine").expect("fin");
        assert_eq!(
            s.destroy("config", "Volume", "v", "").expect("destroy"),
            Destroyed::TearingDown
        );
        let r = s.get("config", "Volume", "v").expect("still there");
        assert_eq!(r.metadata.phase, Phase::TearingDown);
        s.remove_finalizer("config", "Volume", "v", "engine")
            .expect("release");
        assert!(s.get("config", "Volume", "v").is_none());
    }
}
