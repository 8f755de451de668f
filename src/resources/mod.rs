//! Resource spec types, one file per subsystem (the same nouns as
//! [`crate::controllers`]).
//!
//! | namespace | types |
//! |---|---|
//! | `config` | NodeConfig, Disk, Volume, Snapshot (persisted) |
//! | `host` | HugepagesStatus, KernelModuleStatus, PciDevice, HostCapabilities |
//! | `engine` | TargetStatus, DiskStatus, ReplicaStatus, EngineStatus |
//! | `frontend` | AttachmentStatus |

pub mod config;
pub mod host;

use crate::runtime::TypeRegistry;

/// Registers every resource type with its table columns.
pub fn register_types(reg: &mut TypeRegistry) {
    reg.register::<config::NodeConfig>(
        "Node-wide settings",
        &[("ENGINE", "/engine"), ("LISTEN", "/listenAddress"), ("NVMF-PORT", "/nvmfPort")],
    );
    reg.register::<config::Disk>(
        "A disk that holds replicas",
        &[("PATH", "/path"), ("PCI", "/pci"), ("SIZE", "/sizeBytes")],
    );
    reg.register::<config::Volume>(
        "A replicated block volume",
        &[("SIZE", "/sizeBytes"), ("REPLICAS", "/replicas"), ("ENGINE", "/engine"), ("FRONTEND", "/frontend")],
    );
    reg.register::<config::Snapshot>("A snapshot of a volume", &[("VOLUME", "/volume")]);
    host::register_types(reg);
}

/// A registry with every type.
pub fn registry() -> TypeRegistry {
    let mut r = TypeRegistry::new();
    register_types(&mut r);
    r
}
