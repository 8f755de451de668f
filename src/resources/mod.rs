//! Resource spec types, one file per subsystem (the same nouns as
//! [`crate::controllers`]).
//!
//! | namespace | types |
//! |---|---|
//! | `config` | NodeConfig, Disk, Volume, Snapshot, OrphanRemoval, Backup, LonghornReplica, LonghornEngine, LonghornEngineFrontend, LonghornRestore (persisted) |
//! | `host` | HugepagesSpec, HugepagesStatus, KernelModuleStatus, PciDevice, PciBindingStatus, HostCapabilities |
//! | `engine` | BackupStatus, LonghornRestoreStatus, TargetStatus, DiskStatus, OrphanLvol, ReplicaStatus, EngineStatus, LonghornInstanceStatus, RebuildDest, RebuildDestStatus |
//! | `frontend` | AttachmentStatus |
//! | `ledger` | ReplicaLedger, DiskIdentity, HugepagesLedger, PciBindIntent, LonghornRestoreLedger, LonghornRevertLedger, LonghornSnapshotLedger, LonghornSnapshotTake, LonghornMemberLedger, LonghornCloneLedger (persisted) |

pub mod backup;
pub mod config;
pub mod engine;
pub mod frontend;
pub mod host;
pub mod longhorn;

use crate::runtime::TypeRegistry;

/// Registers every resource type with its table columns.
pub fn register_types(reg: &mut TypeRegistry) {
    reg.register::<config::NodeConfig>(
        "Node-wide settings",
        &[
            ("ENGINE", "/engine"),
            ("LISTEN", "/listenAddress"),
            ("NVMF-PORT", "/nvmfPort"),
        ],
    );
    reg.register::<config::Disk>(
        "A disk that holds replicas",
        &[("PATH", "/path"), ("PCI", "/pci"), ("SIZE", "/sizeBytes")],
    );
    reg.register::<config::Volume>(
        "A replicated block volume",
        &[
            ("SIZE", "/sizeBytes"),
            ("REPLICAS", "/replicas"),
            ("ENGINE", "/engine"),
            ("FRONTEND", "/frontend"),
        ],
    );
    reg.register::<config::Snapshot>("A snapshot of a volume", &[("VOLUME", "/volume")]);
    reg.register::<backup::Backup>(
        "A backup of a volume's snapshot to a backup target",
        &[
            ("VOLUME", "/volume"),
            ("SNAPSHOT", "/snapshot"),
            ("TARGET", "/target"),
        ],
    );
    reg.register::<frontend::Attachment>(
        "A request to attach a volume on this host",
        &[("FRONTEND", "/frontend")],
    );
    reg.register::<engine::TargetStatus>(
        "A target process (spdk_tgt or tgtd)",
        &[
            ("ENGINE", "/engine"),
            ("STATE", "/state"),
            ("PID", "/pid"),
            ("VERSION", "/version"),
            ("RESTARTS", "/restarts"),
            ("MESSAGE", "/message"),
        ],
    );
    reg.register::<engine::DiskStatus>(
        "A disk as the engine sees it",
        &[
            ("STATE", "/state"),
            ("BDEV", "/bdev"),
            ("TOTAL", "/totalBytes"),
            ("FREE", "/freeBytes"),
        ],
    );
    reg.register::<engine::DiskIdentity>(
        "The lvstore talon made on a disk, checked before any other is made there (persisted)",
        &[
            ("LVSTORE", "/lvstore"),
            ("UUID", "/lvstoreUuid"),
            ("DEVICE", "/device"),
        ],
    );
    reg.register::<engine::ReplicaStatus>(
        "A replica of a volume",
        &[
            ("VOLUME", "/volume"),
            ("DISK", "/disk"),
            ("STATE", "/state"),
            ("SIZE", "/sizeBytes"),
        ],
    );
    reg.register::<engine::OrphanLvol>(
        "An lvol on a disk that no volume or Longhorn replica owns (kept until orphan_remove)",
        &[
            ("DISK", "/disk"),
            ("WAS", "/was"),
            ("SIZE", "/sizeBytes"),
            ("ALLOCATED", "/allocatedBytes"),
            ("MESSAGE", "/message"),
        ],
    );
    reg.register::<config::OrphanRemoval>("A request to remove an orphan lvol", &[("UUID", "/uuid")]);
    reg.register::<engine::SpdkEvents>(
        "Bdev events of spdk_tgt (wake the volume controller)",
        &[
            ("UNREGISTERED", "/bdevUnregistered"),
            ("REGISTERED", "/bdevRegistered"),
            ("LAST", "/lastBdev"),
        ],
    );
    reg.register::<engine::ReplicaLedger>(
        "Which replicas of a volume are up to date (persisted)",
        &[
            ("IN-SYNC", "/inSync"),
            ("CHANGED", "/changed"),
            ("REASON", "/reason"),
        ],
    );
    reg.register::<engine::EngineStatus>(
        "The engine of a volume and its exports",
        &[
            ("ENGINE", "/engine"),
            ("STATE", "/state"),
            ("SIZE", "/sizeBytes"),
            ("EXPORT", "/exports/0/name"),
        ],
    );
    reg.register::<backup::BackupStatus>(
        "A backup as it went",
        &[
            ("STATE", "/state"),
            ("PROGRESS", "/progress"),
            ("UPLOADED", "/blocksUploaded"),
        ],
    );
    reg.register::<backup::LonghornRestore>(
        "A backup restored into a Longhorn replica (Longhorn's BackupRestore)",
        &[
            ("BACKUP", "/backup"),
            ("VOLUME", "/backupVolume"),
            ("TARGET", "/target"),
        ],
    );
    reg.register::<backup::LonghornRestoreLedger>(
        "The backup a Longhorn replica's lvol holds restored (kept across restarts)",
        &[("BACKUP", "/backup")],
    );
    reg.register::<longhorn::LonghornRevertLedger>(
        "A Longhorn engine's revert begun and not done (kept across restarts)",
        &[("REQUEST", "/request"), ("SNAPSHOT", "/snapshot")],
    );
    reg.register::<longhorn::LonghornMemberLedger>(
        "The current (in-sync) replicas of a Longhorn engine (kept across restarts)",
        &[
            ("VOLUME", "/volume"),
            ("CURRENT", "/current"),
            ("REASON", "/reason"),
        ],
    );
    reg.register::<longhorn::LonghornCloneLedger>(
        "A snapshot clone into a Longhorn engine and how it ended (kept across restarts)",
        &[("SNAPSHOT", "/snapshot"), ("STATE", "/state"), ("HOW", "/how")],
    );
    reg.register::<longhorn::LonghornSnapshotTake>(
        "A Longhorn engine's snapshot being taken, or whose copies a take that did not end left (kept across restarts)",
        &[("ENGINE", "/engine"), ("SNAPSHOT", "/snapshot"), ("LEFT", "/left")],
    );
    reg.register::<longhorn::LonghornSnapshotLedger>(
        "The snapshot times of a Longhorn replica whose instance is deleted and lvol kept",
        &[("VOLUME", "/volume"), ("DISK", "/disk")],
    );
    reg.register::<backup::LonghornRestoreStatus>(
        "A Longhorn replica's restore as it went",
        &[
            ("STATE", "/state"),
            ("PROGRESS", "/progress"),
            ("MESSAGE", "/message"),
        ],
    );
    reg.register::<engine::SnapshotStatus>(
        "A snapshot as the engine holds it",
        &[("VOLUME", "/volume"), ("ENGINE", "/engine"), ("STATE", "/state")],
    );
    reg.register::<engine::RebuildDest>(
        "An engine node's request to the node serving its replica: ready for the next copy of a thin rebuild",
        &[("GENERATION", "/generation")],
    );
    reg.register::<engine::RebuildDestStatus>(
        "The answer to a RebuildDest",
        &[
            ("GENERATION", "/generation"),
            ("SHARED", "/shared"),
            ("RESET", "/reset"),
            ("MESSAGE", "/message"),
        ],
    );
    reg.register::<frontend::AttachmentStatus>(
        "A volume attached on this host",
        &[
            ("TRANSPORT", "/transport"),
            ("STATE", "/state"),
            ("DEVICE", "/device"),
            ("PATH", "/path"),
        ],
    );
    reg.register::<longhorn::LonghornReplica>(
        "A Longhorn replica instance (thin lvol, NVMe/TCP export)",
        &[
            ("VOLUME", "/volume"),
            ("DISK", "/disk"),
            ("SIZE", "/sizeBytes"),
            ("PORT", "/portStart"),
        ],
    );
    reg.register::<longhorn::LonghornEngine>(
        "A Longhorn engine instance (raid1 over its replicas, NVMe/TCP export)",
        &[("VOLUME", "/volume"), ("SIZE", "/sizeBytes"), ("PORT", "/port")],
    );
    reg.register::<longhorn::LonghornEngineFrontend>(
        "A Longhorn engine-frontend instance (kernel NVMe/TCP attach)",
        &[
            ("VOLUME", "/volume"),
            ("ENGINE", "/engineName"),
            ("TARGET", "/targetAddress"),
        ],
    );
    reg.register::<longhorn::LonghornInstanceStatus>(
        "A Longhorn instance as the engine made it",
        &[
            ("KIND", "/kind"),
            ("STATE", "/state"),
            ("ENDPOINT", "/endpoint"),
            ("MESSAGE", "/message"),
        ],
    );
    host::register_types(reg);
}

/// A registry with every type.
pub fn registry() -> TypeRegistry {
    let mut r = TypeRegistry::new();
    register_types(&mut r);
    r
}
