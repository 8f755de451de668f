//! The admin API: JSON-RPC 2.0 (jsonrpsee) over a Unix socket, optionally a
//! token-guarded TCP listener. Handlers read status and write desired state;
//! they never touch the host.
//!
//! ```text
//!   client ──ws/http over UDS or TCP──> server::serve_* ──> RpcModule<ApiContext>
//!                                                            ├─ node_info, rpc.discover
//!                                                            ├─ resource_list/get/types, controller_list
//!                                                            └─ resource_watch (subscription) <── State events
//! ```
//! Every method is registered through [`ApiBuilder`], which also records its
//! params/result schemas and errors for the OpenRPC document (`rpc.discover`).

pub mod backup;
pub mod error;
pub mod server;
pub mod tls;
pub mod types;
pub mod volume;

use std::future::Future;
use std::sync::Arc;

use jsonrpsee::core::server::PendingSubscriptionSink;
use jsonrpsee::types::{ErrorObjectOwned, Params};
use jsonrpsee::{Methods, RpcModule};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

pub use error::{ApiError, ErrorKind};
use types::{GetParams, ListParams, NoParams, NodeInfo, WatchParams};

use crate::runtime::{ControllerStatus, Event, EventKind, Resource, State, Statuses, TypeInfo, TypeRegistry};

/// What handlers work with.
#[derive(Clone)]
pub struct ApiContext {
    /// The state store.
    pub state: State,
    /// Known resource types.
    pub registry: Arc<TypeRegistry>,
    /// Controller statuses.
    pub statuses: Statuses,
    /// Produces `node_info`.
    pub node_info: Arc<dyn Fn() -> NodeInfo + Send + Sync>,
    /// Stops the daemon (`node_stop`): true also stops the targets; returns
    /// whether they stop.
    pub node_stop: Arc<dyn Fn(bool) -> bool + Send + Sync>,
}

impl std::fmt::Debug for ApiContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiContext").finish_non_exhaustive()
    }
}

impl ApiContext {
    /// Resolves a user-given type name.
    pub fn resolve_type(&self, name: &str) -> Result<&TypeInfo, ApiError> {
        self.registry.lookup(name).ok_or_else(|| {
            let known: Vec<String> = self.registry.all().into_iter().map(|t| t.type_).collect();
            ApiError::not_found(format!(
                "resource type {name:?} is unknown (known: {})",
                known.join(", ")
            ))
        })
    }
}

/// The description of one method, for `rpc.discover`.
#[derive(Debug, Clone)]
pub struct MethodDoc {
    name: &'static str,
    summary: &'static str,
    params: Value,
    result: Value,
    errors: Vec<ErrorKind>,
}

/// Registers methods and records their documentation.
#[derive(Debug)]
pub struct ApiBuilder {
    module: RpcModule<ApiContext>,
    docs: Vec<MethodDoc>,
}

/// Parses named params, naming the offending field on error.
pub fn parse_params<P: DeserializeOwned>(params: &Params) -> Result<P, ApiError> {
    let raw = params.as_str().unwrap_or("{}");
    let trimmed = raw.trim();
    let raw = if trimmed == "[]" || trimmed.is_empty() {
        "{}"
    } else {
        raw
    };
    if raw.trim_start().starts_with('[') {
        return Err(ApiError::invalid(
            "invalid params: pass params as an object of named fields",
        ));
    }
    let de = &mut serde_json::Deserializer::from_str(raw);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            ApiError::invalid(format!("invalid params: {}", e.inner()))
        } else {
            ApiError::invalid(format!("invalid params: field `{path}`: {}", e.inner()))
        }
    })
}

fn schema_of<T: schemars::JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null)
}

impl ApiBuilder {
    /// An empty API over a context.
    pub fn new(ctx: ApiContext) -> Self {
        Self {
            module: RpcModule::new(ctx),
            docs: Vec::new(),
        }
    }

    /// Registers an async method with named params `P` and result `R`.
    pub fn method<P, R, F, Fut>(
        &mut self,
        name: &'static str,
        summary: &'static str,
        errors: &[ErrorKind],
        f: F,
    ) where
        P: DeserializeOwned + schemars::JsonSchema + Send + 'static,
        R: Serialize + schemars::JsonSchema + Send + 'static,
        F: Fn(P, Arc<ApiContext>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ApiError>> + Send + 'static,
    {
        let res = self.module.register_async_method(name, move |params, ctx, _ext| {
            let f = f.clone();
            async move {
                let p: P = parse_params(&params).map_err(ErrorObjectOwned::from)?;
                let r = f(p, ctx).await.map_err(ErrorObjectOwned::from)?;
                serde_json::to_value(r).map_err(|e| ErrorObjectOwned::from(ApiError::internal(e.to_string())))
            }
        });
        if let Err(e) = res {
            // Method names are static and unique; a clash is a programming error.
            tracing::error!(method = name, error = %e, "duplicate API method");
        }
        let mut errs = vec![ErrorKind::InvalidParams, ErrorKind::Internal];
        errs.extend(errors.iter().copied());
        self.docs.push(MethodDoc {
            name,
            summary,
            params: schema_of::<P>(),
            result: schema_of::<R>(),
            errors: errs,
        });
    }

    /// The OpenRPC document of every registered method.
    fn openrpc(docs: &[MethodDoc]) -> Value {
        let methods: Vec<Value> = docs
            .iter()
            .map(|d| {
                let required: Vec<String> = d.params["required"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
                    .unwrap_or_default();
                let params: Vec<Value> = d.params["properties"]
                    .as_object()
                    .map(|props| {
                        props
                            .iter()
                            .map(|(k, s)| json!({"name": k, "required": required.contains(k), "schema": s}))
                            .collect()
                    })
                    .unwrap_or_default();
                let errors: Vec<Value> = d
                    .errors
                    .iter()
                    .map(|k| json!({"code": k.code(), "message": k.title()}))
                    .collect();
                json!({
                    "name": d.name,
                    "summary": d.summary,
                    "paramStructure": "by-name",
                    "params": params,
                    "result": {"name": "result", "schema": d.result},
                    "errors": errors,
                })
            })
            .collect();
        json!({
            "openrpc": "1.3.2",
            "info": {"title": "talon admin API", "version": crate::VERSION},
            "methods": methods,
        })
    }

    /// Finishes the API: adds `rpc.discover` and returns the methods to serve.
    pub fn build(mut self) -> Methods {
        self.docs.push(MethodDoc {
            name: "rpc.discover",
            summary: "The OpenRPC document of this API.",
            params: schema_of::<NoParams>(),
            result: json!({"type": "object"}),
            errors: vec![],
        });
        let doc = Self::openrpc(&self.docs);
        let res = self
            .module
            .register_method("rpc.discover", move |_, _, _| doc.clone());
        if let Err(e) = res {
            tracing::error!(error = %e, "cannot register rpc.discover");
        }
        self.module.into()
    }
}

/// Registers the core methods: node, resources, controllers, watch.
pub fn register_core(api: &mut ApiBuilder) {
    api.method(
        "node_info",
        "Version, host, kernel, OS and engine availability of this node.",
        &[],
        |_: NoParams, ctx: Arc<ApiContext>| async move { Ok((ctx.node_info)()) },
    );
    api.method(
        "node_stop",
        "Stop talon (as SIGTERM does); with drain, spdk_tgt and tgtd stop with it.",
        &[],
        |p: types::NodeStopParams, ctx: Arc<ApiContext>| async move {
            let targets_stop = (ctx.node_stop)(p.drain);
            Ok(types::NodeStopResult {
                stopping: true,
                targets_stop,
            })
        },
    );
    api.method(
        "resource_types",
        "Every resource type: namespace, description, columns, schema.",
        &[],
        |_: NoParams, ctx: Arc<ApiContext>| async move { Ok(ctx.registry.all()) },
    );
    api.method(
        "resource_list",
        "Every resource of a type.",
        &[ErrorKind::NotFound],
        |p: ListParams, ctx: Arc<ApiContext>| async move {
            let t = ctx.resolve_type(&p.type_)?;
            Ok(ctx.state.list(&t.namespace, &t.type_))
        },
    );
    api.method(
        "resource_get",
        "One resource by type and id.",
        &[ErrorKind::NotFound],
        |p: GetParams, ctx: Arc<ApiContext>| async move {
            let t = ctx.resolve_type(&p.type_)?;
            ctx.state.get(&t.namespace, &t.type_, &p.id).ok_or_else(|| {
                let noun = crate::runtime::resource::type_noun(&t.type_);
                ApiError::not_found(format!("{noun} {:?} not found", p.id))
            })
        },
    );
    api.method(
        "controller_list",
        "Every controller: inputs, outputs, state, restarts.",
        &[],
        |_: NoParams, ctx: Arc<ApiContext>| async move {
            let s = ctx.statuses.read().unwrap_or_else(|p| p.into_inner());
            Ok(s.values().cloned().collect::<Vec<ControllerStatus>>())
        },
    );
    register_watch(api);
    // the backup methods ride with the core: serve.rs registers the core and `volume::register`
    backup::register(api);
}

fn register_watch(api: &mut ApiBuilder) {
    let res = api.module.register_subscription(
        "resource_watch",
        "resource_event",
        "resource_unwatch",
        |params, pending: PendingSubscriptionSink, ctx: Arc<ApiContext>, _ext| async move {
            let p: WatchParams = match parse_params(&params) {
                Ok(p) => p,
                Err(e) => {
                    pending.reject(ErrorObjectOwned::from(e)).await;
                    return;
                }
            };
            let filter = match p.type_.as_deref().map(|t| ctx.resolve_type(t)).transpose() {
                Ok(t) => t.map(|t| (t.namespace.clone(), t.type_.clone())),
                Err(e) => {
                    pending.reject(ErrorObjectOwned::from(e)).await;
                    return;
                }
            };
            let (snapshot, mut rx) = ctx
                .state
                .watch(filter.as_ref().map(|(n, t)| (n.as_str(), t.as_str())));
            let Ok(sink) = pending.accept().await else { return };
            let to_msg = |ev: &Event| serde_json::value::to_raw_value(ev);
            if p.bootstrap.unwrap_or(true) {
                for r in snapshot {
                    let Ok(msg) = to_msg(&Event {
                        kind: EventKind::Created,
                        resource: r,
                    }) else {
                        return;
                    };
                    if sink.send(msg).await.is_err() {
                        return;
                    }
                }
            }
            let matches = |r: &Resource| {
                filter
                    .as_ref()
                    .is_none_or(|(n, t)| &r.metadata.namespace == n && &r.metadata.type_ == t)
            };
            loop {
                tokio::select! {
                    ev = rx.recv() => match ev {
                        Ok(ev) if matches(&ev.resource) => {
                            let Ok(msg) = to_msg(&ev) else { return };
                            if sink.send(msg).await.is_err() { return; }
                        }
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(missed = n, "a watcher fell behind; closing its subscription");
                            return;
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                    _ = sink.closed() => return,
                }
            }
        },
    );
    if let Err(e) = res {
        tracing::error!(error = %e, "cannot register resource_watch");
    }
    api.docs.push(MethodDoc {
        name: "resource_watch",
        summary: "Subscription: streams create/update/destroy events (notification `resource_event`; \
                  unsubscribe with `resource_unwatch`).",
        params: schema_of::<WatchParams>(),
        result: schema_of::<Event>(),
        errors: vec![ErrorKind::InvalidParams, ErrorKind::NotFound],
    });
}
