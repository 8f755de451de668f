//! The `InstanceCreateRequest`s the Longhorn tests send, written once: a V2
//! instance (replica, engine, engine-frontend) as longhorn-manager asks for
//! it, with the few fields each kind reads.
//!
//! ```text
//!   replica(name, volume, disk, size)                     -> type "replica"
//!   engine(name, volume, replicaAddressMap, size, fe)     -> type "engine"
//!   frontend(name, volume, engine, target, size, fe)      -> type "engine-frontend"
//!   create(name, type, volume, SpdkInstanceSpec)          -> any of them
//! ```

#![allow(dead_code)] // each includer uses a part

use std::collections::HashMap;

use talon::proto::imrpc;

/// A V2 instance of type `ty` named `name`, of volume `volume`, one port,
/// with SPDK spec `spec`.
pub fn create(
    name: &str,
    ty: &str,
    volume: &str,
    spec: imrpc::SpdkInstanceSpec,
) -> imrpc::InstanceCreateRequest {
    imrpc::InstanceCreateRequest {
        spec: Some(imrpc::InstanceSpec {
            name: name.into(),
            r#type: ty.into(),
            volume_name: volume.into(),
            port_count: 1,
            data_engine: imrpc::DataEngine::V2 as i32,
            spdk_instance_spec: Some(spec),
            ..Default::default()
        }),
        data_layout_type: 0,
    }
}

/// Replica `name` of `volume`: `size` bytes on disk `disk`.
pub fn replica(name: &str, volume: &str, disk: &str, size: u64) -> imrpc::InstanceCreateRequest {
    let spec = imrpc::SpdkInstanceSpec {
        disk_name: disk.into(),
        size,
        ..Default::default()
    };
    create(name, "replica", volume, spec)
}

/// Engine `name` of `volume` over `map` (replica -> `ip:port`), `size`
/// bytes, frontend `frontend` (`spdk-tcp-nvmf`, or "" for none).
pub fn engine(
    name: &str,
    volume: &str,
    map: HashMap<String, String>,
    size: u64,
    frontend: &str,
) -> imrpc::InstanceCreateRequest {
    let spec = imrpc::SpdkInstanceSpec {
        replica_address_map: map,
        size,
        frontend: frontend.into(),
        ..Default::default()
    };
    create(name, "engine", volume, spec)
}

/// Engine-frontend `name` of `volume`, for engine `engine` served at
/// `target` (`ip:port`), `size` bytes, frontend `frontend`.
pub fn frontend(
    name: &str,
    volume: &str,
    engine: &str,
    target: &str,
    size: u64,
    frontend: &str,
) -> imrpc::InstanceCreateRequest {
    let spec = imrpc::SpdkInstanceSpec {
        size,
        frontend: frontend.into(),
        ..Default::default()
    };
    let mut req = create(name, "engine-frontend", volume, spec);
    if let Some(s) = req.spec.as_mut() {
        s.engine_name = engine.into();
        s.target_address = target.into();
    }
    req
}
