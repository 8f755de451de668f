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
use std::time::Duration;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::broadcast;

use super::resource::{Metadata, Phase, Resource, Spec, Typed, now_rfc3339};

const RESOURCES: TableDefinition<&str, &[u8]> = TableDefinition::new("resources");

/// What went wrong in the state store; names the resource.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{} {id:?} not found", super::resource::type_noun(type_))]
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
    #[error(
        "state store at {path} is damaged ({reason}); talon does not start on it, so that no volume \
         silently vanishes: restore it from a backup, or move it away to start as an empty node"
    )]
    Damaged { path: PathBuf, reason: String },
    #[error(
        "state store at {path} holds {type_} {id:?}, which this talon cannot read ({reason}): another \
         talon version wrote it (a newer schema, or one left after a downgrade); talon does not start \
         on it, so that the record is neither dropped nor rewritten without its fields: run the talon \
         version that wrote it and delete or change {type_} {id:?} there, or restore the store from a \
         backup this talon wrote"
    )]
    Unreadable {
        path: PathBuf,
        type_: String,
        id: String,
        reason: String,
    },
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
    /// The persisted store: `None` in memory-only stores, and after a write
    /// error until it is reopened.
    db: std::sync::Mutex<Option<redb::Database>>,
    /// Where it is (`None`: nothing is persisted).
    path: Option<PathBuf>,
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
            .field("persisted", &self.inner.path)
            .finish()
    }
}

fn key(ns: &str, ty: &str, id: &str) -> Key {
    (ns.to_string(), ty.to_string(), id.to_string())
}

/// The resources of type `ty` in namespace `ns`, sorted by id.
fn of_type<'m>(
    mem: &'m BTreeMap<Key, Resource>,
    ns: &'m str,
    ty: &'m str,
) -> impl Iterator<Item = (&'m Key, &'m Resource)> {
    mem.range(key(ns, ty, "")..)
        .take_while(move |((n, t, _), _)| n == ns && t == ty)
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
    /// Lets go of this handle and waits, up to `within`, until no other
    /// handle to the store is left (tasks that still hold one end their
    /// work), so the store file is closed and the next open of it succeeds.
    /// Returns how many handles were still held when the wait gave up (0:
    /// closed).
    pub async fn close(self, within: Duration) -> usize {
        let inner = Arc::downgrade(&self.inner);
        drop(self);
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let held = inner.strong_count();
            if held == 0 || tokio::time::Instant::now() >= deadline {
                return held;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A store with nothing persisted (tests, benchmarks).
    pub fn in_memory() -> Self {
        Self::with_db(None, None, BTreeMap::new())
    }

    /// Opens (or creates) the store at `path` and loads the persisted `config`
    /// namespace.
    pub fn open(path: &Path) -> Result<Self, StateError> {
        Self::open_typed(path, &super::TypeRegistry::new())
    }

    /// [`State::open`], and every record of a type in `types` is decoded with
    /// its typed spec in the same pass: a record that does not (an unknown
    /// field or enum value, written by a newer talon) is refused
    /// ([`StateError::Unreadable`]) rather than left for its controllers to fail
    /// on forever. Records of types not in `types` are loaded as they are.
    pub fn open_typed(path: &Path, types: &super::TypeRegistry) -> Result<Self, StateError> {
        let open_err = |e: redb::Error| match e {
            redb::Error::DatabaseAlreadyOpen => StateError::Locked {
                path: path.to_path_buf(),
            },
            e => StateError::Open {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        };
        let damaged = |reason: String| StateError::Damaged {
            path: path.to_path_buf(),
            reason,
        };
        // redb makes a new store of an empty file: an existing store must open as one
        let db = match std::fs::metadata(path) {
            Ok(m) if m.len() == 0 => return Err(damaged("the file is empty".into())),
            Ok(_) => redb::Database::open(path).map_err(|e| match open_err(e.into()) {
                StateError::Open { source, .. } => damaged(source.to_string()),
                other => other,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                redb::Database::create(path).map_err(|e| open_err(e.into()))?
            }
            Err(e) => return Err(open_err(redb::StorageError::Io(e).into())),
        };
        let mut mem = BTreeMap::new();
        {
            let txn = db
                .begin_read()
                .map_err(|e| damaged(redb::Error::from(e).to_string()))?;
            match txn.open_table(RESOURCES) {
                Ok(table) => {
                    let rows = table.iter().map_err(|e| damaged(e.to_string()))?;
                    for row in rows {
                        let (k, v) = row.map_err(|e| damaged(e.to_string()))?;
                        let r = serde_json::from_slice::<Resource>(v.value())
                            .map_err(|e| damaged(format!("record {:?} does not decode: {e}", k.value())))?;
                        let m = &r.metadata;
                        if let Some(Err(e)) = types.check_spec(&m.type_, &r.spec) {
                            return Err(StateError::Unreadable {
                                path: path.to_path_buf(),
                                type_: m.type_.clone(),
                                id: m.id.clone(),
                                reason: format!("its spec does not decode: {e}"),
                            });
                        }
                        mem.insert(key(&m.namespace, &m.type_, &m.id), r);
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(damaged(e.to_string())),
            }
        }
        Ok(Self::with_db(Some(db), Some(path.to_path_buf()), mem))
    }

    fn with_db(db: Option<redb::Database>, path: Option<PathBuf>, mem: BTreeMap<Key, Resource>) -> Self {
        let (events, _) = broadcast::channel(4096);
        Self {
            inner: Arc::new(Inner {
                mem: RwLock::new(mem),
                db: std::sync::Mutex::new(db),
                path,
                events,
            }),
        }
    }

    /// Runs one write transaction on the persisted store, for resource
    /// `ty`/`id`. After a failed write redb refuses every later one ("previous
    /// I/O error") until it is reopened: the store is reopened at once (a disk
    /// that was full and has room again then works without a restart) and the
    /// write tried once more. The failure is logged as an error.
    fn db_write(
        &self,
        ty: &str,
        id: &str,
        op: impl Fn(&mut redb::Table<&str, &[u8]>) -> Result<(), redb::StorageError>,
    ) -> Result<(), StateError> {
        let Some(path) = &self.inner.path else {
            return Ok(());
        };
        let once = |db: &redb::Database| -> Result<(), StateError> {
            let txn = db.begin_write().map_err(|e| persist_err(ty, id, e))?;
            {
                let mut t = txn.open_table(RESOURCES).map_err(|e| persist_err(ty, id, e))?;
                op(&mut t).map_err(|e| persist_err(ty, id, e))?;
            }
            txn.commit().map_err(|e| persist_err(ty, id, e))
        };
        let mut db = self.inner.db.lock().unwrap_or_else(|p| p.into_inner());
        let first = match db.as_ref() {
            Some(d) => once(d),
            None => Err(StateError::Persist {
                type_: ty.to_string(),
                id: id.to_string(),
                source: Box::new(
                    redb::StorageError::Io(std::io::Error::other(
                        "the store is closed after an earlier error",
                    ))
                    .into(),
                ),
            }),
        };
        let Err(e) = first else {
            return Ok(());
        };
        tracing::error!(path = %path.display(), error = %crate::util::error_chain(&e),
            "state store write failed; reopening the store");
        // redb allows one open handle per file: close it before reopening
        *db = None;
        match redb::Database::create(path) {
            Ok(d) => *db = Some(d),
            Err(re) => {
                tracing::error!(path = %path.display(), error = %re, "cannot reopen the state store; the next write tries again");
                return Err(e);
            }
        }
        once(db.as_ref().expect("just reopened")).inspect_err(|e2| {
            tracing::error!(path = %path.display(), error = %crate::util::error_chain(e2),
                "state store write failed again after reopening")
        })
    }

    fn write_db(&self, r: &Resource) -> Result<(), StateError> {
        let m = &r.metadata;
        if !super::resource::is_persisted(&m.namespace) {
            return Ok(());
        }
        let bytes = serde_json::to_vec(r).map_err(|source| StateError::Decode {
            type_: m.type_.clone(),
            id: m.id.clone(),
            source,
        })?;
        let k = db_key(&m.type_, &m.id);
        self.db_write(&m.type_, &m.id, |t| {
            t.insert(k.as_str(), bytes.as_slice()).map(drop)
        })
    }

    fn remove_db(&self, m: &Metadata) -> Result<(), StateError> {
        if !super::resource::is_persisted(&m.namespace) {
            return Ok(());
        }
        let k = db_key(&m.type_, &m.id);
        self.db_write(&m.type_, &m.id, |t| t.remove(k.as_str()).map(drop))
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
        of_type(&mem, ns, ty).map(|(_, r)| r.clone()).collect()
    }

    /// Subscribes to changes, and returns the current resources of a type (or of
    /// every type) taken atomically with the subscription, so nothing is missed.
    pub fn watch(&self, ns_type: Option<(&str, &str)>) -> (Vec<Resource>, broadcast::Receiver<Event>) {
        let mem = self.lock_read();
        let rx = self.inner.events.subscribe();
        let snapshot = match ns_type {
            Some((ns, ty)) => of_type(&mem, ns, ty).map(|(_, r)| r.clone()).collect(),
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

    /// One typed resource. Decoded from the stored spec in place (no copy of
    /// its JSON is made: the manager's polls read a few per call).
    pub fn get_typed<S: Spec>(&self, id: &str) -> Result<Option<Typed<S>>, StateError> {
        self.lock_read()
            .get(&key(S::NAMESPACE, S::TYPE, id))
            .map(decode_ref::<S>)
            .transpose()
    }

    /// Whether resource `ty`/`id` of namespace `ns` exists (nothing is copied).
    pub fn contains(&self, ns: &str, ty: &str, id: &str) -> bool {
        self.lock_read().contains_key(&key(ns, ty, id))
    }

    /// Whether resource `ty`/`id` of namespace `ns` exists, owned by `owner`,
    /// with spec `spec`: an update of it to `spec` by `owner` would change
    /// nothing (nothing is copied to find out).
    pub fn holds(&self, ns: &str, ty: &str, id: &str, owner: &str, spec: &Value) -> bool {
        self.lock_read()
            .get(&key(ns, ty, id))
            .is_some_and(|r| r.metadata.owner == owner && &r.spec == spec)
    }

    /// The typed resources of a type whose stored spec `keep` takes, each decoded in place
    /// (the others are not decoded: `keep` reads only the fields it needs).
    pub fn list_typed_where<S: Spec>(
        &self,
        keep: impl Fn(&Value) -> bool,
    ) -> Result<Vec<Typed<S>>, StateError> {
        let (ns, ty) = (S::NAMESPACE, S::TYPE);
        of_type(&self.lock_read(), ns, ty)
            .filter(|(_, r)| keep(&r.spec))
            .map(|(_, r)| decode_ref::<S>(r))
            .collect()
    }

    /// The ids of the resources of a type owned by `owner`, sorted (nothing else is copied).
    pub fn owned_ids(&self, ns: &str, ty: &str, owner: &str) -> Vec<String> {
        of_type(&self.lock_read(), ns, ty)
            .filter(|(_, r)| r.metadata.owner == owner)
            .map(|((_, _, id), _)| id.clone())
            .collect()
    }

    /// Every typed resource of a type, each decoded in place.
    pub fn list_typed<S: Spec>(&self) -> Result<Vec<Typed<S>>, StateError> {
        self.list_typed_where(|_| true)
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

    /// Creates or replaces a user-owned typed resource (the config file at
    /// start, the API's node settings).
    pub fn upsert_typed<S: Spec>(&self, id: &str, spec: &S) -> Result<(), StateError> {
        match self.get_typed::<S>(id)? {
            Some(_) => self.update_typed(id, "", None, spec).map(drop),
            None => self.create_typed(id, "", spec).map(drop),
        }
    }
}

fn encode<S: Spec>(ty: &str, id: &str, spec: &S) -> Result<Value, StateError> {
    serde_json::to_value(spec).map_err(|source| StateError::Decode {
        type_: ty.to_string(),
        id: id.to_string(),
        source,
    })
}

fn decode_ref<S: Spec>(r: &Resource) -> Result<Typed<S>, StateError> {
    Ok(Typed {
        spec: S::deserialize(&r.spec).map_err(|source| StateError::Decode {
            type_: r.metadata.type_.clone(),
            id: r.metadata.id.clone(),
            source,
        })?,
        metadata: r.metadata.clone(),
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
    fn not_found_names_the_type_as_a_noun() {
        let s = State::in_memory();
        let e = s
            .destroy("engine", "EngineStatus", "x", "c")
            .expect_err("nothing there");
        assert_eq!(e.to_string(), "engine status \"x\" not found");
        let e = StateError::NotFound {
            type_: "Volume".into(),
            id: "x".into(),
        };
        assert_eq!(e.to_string(), "volume \"x\" not found");
    }

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
    fn a_damaged_store_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let vol = |s: &State, id: &str| {
            s.create(
                "config",
                "Volume",
                id,
                "",
                json!({"sizeBytes": 1}),
                BTreeMap::new(),
            )
            .expect("create")
        };
        {
            let s = State::open(&path).expect("open");
            vol(&s, "keep");
        }
        let good = std::fs::read(&path).expect("read");
        let damaged = |bytes: &[u8], why: &str| {
            std::fs::write(&path, bytes).expect("write");
            let e = State::open(&path).expect_err(why);
            assert!(matches!(e, StateError::Damaged { .. }), "{why}: {e:?}");
            let msg = e.to_string();
            assert!(
                msg.contains(&path.display().to_string()) && msg.contains("damaged"),
                "{msg}"
            );
        };
        damaged(b"", "an empty file");
        damaged(&vec![0x5a; good.len()], "garbage");
        damaged(&good[..good.len() / 3], "a truncated store");
        // a record that does not decode is damage too, not something to skip
        std::fs::write(&path, &good).expect("restore");
        {
            let db = redb::Database::open(&path).expect("raw open");
            let txn = db.begin_write().expect("txn");
            txn.open_table(RESOURCES)
                .expect("table")
                .insert("Volume/bad", b"{not json".as_slice())
                .expect("insert");
            txn.commit().expect("commit");
        }
        let e = State::open(&path).expect_err("undecodable record");
        assert!(e.to_string().contains("Volume/bad"), "{e}");
        // the intact store still opens with its volume
        std::fs::write(&path, &good).expect("restore");
        let s = State::open(&path).expect("open intact");
        assert!(s.get("config", "Volume", "keep").is_some());
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
        // what a no-op update would find, asked without a copy
        assert!(s.holds("engine", "T", "a", "ctl", &json!(1)));
        assert!(!s.holds("engine", "T", "a", "other", &json!(1)), "another owner");
        assert!(!s.holds("engine", "T", "a", "ctl", &json!(2)), "another spec");
        assert!(!s.holds("engine", "T", "b", "ctl", &json!(1)), "none");
        assert!(s.contains("engine", "T", "a") && !s.contains("engine", "T", "b"));
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
