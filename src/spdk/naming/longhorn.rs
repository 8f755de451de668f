//! Longhorn's names of SPDK objects, and the checks a Longhorn instance name
//! passes before it reaches an NQN, a bdev or an lvol name.
//!
//! ```text
//!   replica  <r>   lvol talon-<disk>/<r>   subsystem nqn.2023-01.io.longhorn.spdk:<r>
//!   engine   <e>   raid1 <e>               subsystem nqn.2023-01.io.longhorn.spdk:volume-<volume>
//!   remote replica <r> of engine <e>       NVMe controller <r>, bdev <r>n1
//!   snapshot of <r> a clone into <e> on another node reads
//!                  lvol talon-<disk>/<r>-snap-<s>  subsystem nqn.2023-01.io.longhorn.spdk:clone-src:<r>:<e>
//!   linked clone of <r>'s snapshot <s>: entrypoint talon-<disk>/<r>-clone-ep-<s> (an empty
//!                  snapshot, a clone of <r>-snap-<s>), the parent of the clone replica's chain
//! ```

use crate::names::{InvalidName, Nqn, ObjectName};

/// The snapshot name prefix of rebuild snapshots (`talon-rb-<n>`): taken of
/// the source's head for a rebuild and merged away after it.
pub const REBUILD_SNAP_PREFIX: &str = "talon-rb-";

/// Whether snapshot name `snap` is a rebuild snapshot.
pub fn is_rebuild_snap(snap: &str) -> bool {
    snap.strip_prefix(REBUILD_SNAP_PREFIX)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Longhorn's NQN prefix (go-spdk-helper `types.NQNPrefix`).
pub const NQN_PREFIX: &str = "nqn.2023-01.io.longhorn.spdk";

/// The host NQN Longhorn's engines present when they attach a replica
/// (go-spdk-helper `types.InternalHostNQN`); talon's engines present it too,
/// so a replica export admits engines of either kind.
pub fn internal_host_nqn() -> String {
    format!("{NQN_PREFIX}:internal-host")
}

/// Validates a Longhorn instance, volume or disk name: a DNS label (what
/// Longhorn generates), and never one of talon's own object names (`talon-*`
/// bdevs, `<volume>-r<k>` lvols), so talon's orphan cleanup never takes it.
pub fn instance_name(what: &'static str, value: &str) -> Result<ObjectName, InvalidName> {
    let name = ObjectName::parse(what, value)?;
    let refuse = |reason: &str| InvalidName {
        what,
        value: value.to_string(),
        reason: reason.to_string(),
    };
    if value.starts_with("talon-") {
        return Err(refuse("names starting with \"talon-\" are talon's own"));
    }
    if crate::spdk::volume::parse_lvol(value).is_some() {
        return Err(refuse(
            "names ending in -r<number> are talon's replica lvols; Longhorn's are <volume>-r-<id>",
        ));
    }
    Ok(name)
}

/// Validates the name of a snapshot of one replica, as the replica calls
/// (`ReplicaSnapshotCreate/Delete`, the rebuilding calls) take it: a
/// Longhorn snapshot name ([`instance_name`]), or one of the `talon-rb-<n>`
/// snapshots a thin rebuild takes of the source's head and merges away after
/// ([`is_rebuild_snap`]). Engine calls (Longhorn's
/// `VolumeSnapshot`, revert, remove) take [`instance_name`] only, so a user
/// never makes or reverts to one.
pub fn replica_snapshot_name(value: &str) -> Result<ObjectName, InvalidName> {
    if is_rebuild_snap(value) {
        return ObjectName::parse("snapshot", value);
    }
    instance_name("snapshot", value)
}

/// The snapshot an incremental restore takes of replica `replica`'s lvol
/// while it fills it anew (`engine.LonghornRestoreController`): a name no
/// Longhorn snapshot (`<replica>-snap-<s>`) or replica (a DNS label, no
/// dot) has.
pub fn restore_snapshot(replica: &str) -> String {
    format!("{replica}.restore")
}

/// The thin lvol a restore into replica `replica` writes the backup into
/// through the mover (new, or a clone of [`restore_snapshot`]), never read
/// as the replica.
pub fn restore_target(replica: &str) -> String {
    format!("{replica}.restoring")
}

/// The snapshot of [`restore_target`] once the whole backup is in it: it
/// becomes the replica lvol's parent and is merged into it.
pub fn restored_snapshot(replica: &str) -> String {
    format!("{replica}.restored")
}

/// Every lvol name a restore into replica `replica` makes beside its lvol.
pub fn restore_lvols(replica: &str) -> [String; 3] {
    [
        restore_snapshot(replica),
        restore_target(replica),
        restored_snapshot(replica),
    ]
}

/// The infix of a clone entrypoint's name (Longhorn's
/// `ReplicaCloneEntrypointLvolInfix`).
const ENTRYPOINT_INFIX: &str = "-clone-ep-";
/// The suffix of the writable lvol an entrypoint is made from (Longhorn's
/// `ReplicaCloneEntrypointTmpHeadSuffix`).
const TMP_HEAD_SUFFIX: &str = "-tmp-head";

/// The entrypoint of a linked clone of snapshot `snapshot` of replica
/// `replica`: an empty snapshot lvol whose parent is the replica's snapshot,
/// and the parent of every linked clone's chain made of it (Longhorn's
/// `GetCloneEntrypointLvolName`, `<replica>-clone-ep-<snapshot>`).
pub fn clone_entrypoint(replica: &str, snapshot: &str) -> String {
    format!("{replica}{ENTRYPOINT_INFIX}{snapshot}")
}

/// The writable lvol an entrypoint is made from (cloned from the snapshot,
/// snapshotted as the entrypoint, deleted): Longhorn's
/// `GetCloneEntrypointTmpHeadLvolName`.
pub fn clone_entrypoint_tmp_head(entrypoint: &str) -> String {
    format!("{entrypoint}{TMP_HEAD_SUFFIX}")
}

/// Whether lvol name `name` is a clone entrypoint ([`clone_entrypoint`]).
pub fn is_clone_entrypoint(name: &str) -> bool {
    name.contains(ENTRYPOINT_INFIX) && !name.ends_with(TMP_HEAD_SUFFIX)
}

/// The snapshot name of clone entrypoint `name` ([`clone_entrypoint`]): what
/// follows the first infix (a Longhorn replica name, `<volume>-r-<8 hex>`,
/// holds none). `None`: not an entrypoint. A name read wrong names a
/// snapshot the replica beside does not have: the caller finds it missing.
pub fn clone_entrypoint_snapshot(name: &str) -> Option<&str> {
    if !is_clone_entrypoint(name) {
        return None;
    }
    name.split_once(ENTRYPOINT_INFIX)
        .map(|(_, s)| s)
        .filter(|s| !s.is_empty())
}

/// The NQN of a replica's export.
pub fn replica_nqn(replica: &ObjectName) -> Result<Nqn, InvalidName> {
    Nqn::parse(&format!("{NQN_PREFIX}:{replica}"))
}

/// The prefix of [`clone_source_nqn`]: no replica's or engine's own NQN
/// starts with it (an instance name holds no colon).
pub fn clone_source_prefix() -> String {
    format!("{NQN_PREFIX}:clone-src:")
}

/// The NQN under which replica `replica` exposes a snapshot to a clone into
/// engine `engine` on another node (`ReplicaRebuildingSrcStart` with
/// `exposed_snapshot_name`): one per pair, so two clones of one snapshot
/// each remove only their own.
pub fn clone_source_nqn(replica: &ObjectName, engine: &ObjectName) -> Result<Nqn, InvalidName> {
    Nqn::parse(&format!("{}{replica}:{engine}", clone_source_prefix()))
}

/// The NQN of an engine's export (Longhorn's stable volume NQN).
pub fn volume_nqn(volume: &ObjectName) -> Result<Nqn, InvalidName> {
    Nqn::parse(&format!("{NQN_PREFIX}:volume-{volume}"))
}

/// The lvol alias of a replica on `disk`.
pub fn replica_alias(disk: &str, replica: &str) -> String {
    format!("{}/{replica}", crate::spdk::volume::naming::lvstore(disk))
}

/// The namespace id (NGUID and UUID) of an export: stable per name, distinct
/// from the bdev's own UUID (an attach inside the same target would clash).
pub fn namespace_id(name: &str) -> uuid::Uuid {
    uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("{NQN_PREFIX}:{name}").as_bytes(),
    )
}

/// What an engine-frontend does on this node, by Longhorn's frontend name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontendMode {
    /// `spdk-tcp-blockdev`: the host kernel's NVMe/TCP initiator attaches the
    /// engine's export; the endpoint is `/dev/longhorn/<volume>`.
    KernelBlockdev,
    /// `spdk-tcp-nvmf`: no initiator; the endpoint is the export,
    /// `nvmf://ip:port/nqn`, for the workload's own initiator.
    NvmfEndpoint,
    /// `""`: attached with the frontend disabled (maintenance mode); nothing
    /// to attach, no endpoint.
    Disabled,
}

/// A Longhorn frontend talon does not serve (`ublk`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("frontend {frontend:?} is not served by talon (spdk-tcp-blockdev, spdk-tcp-nvmf, or \"\" for none)")]
pub struct UnservedFrontend {
    /// The frontend's name.
    pub frontend: String,
}

impl FrontendMode {
    /// The mode of Longhorn's frontend name; others (`ublk`) are refused by name.
    pub fn of(frontend: &str) -> Result<Self, UnservedFrontend> {
        match frontend {
            "spdk-tcp-blockdev" => Ok(Self::KernelBlockdev),
            "spdk-tcp-nvmf" => Ok(Self::NvmfEndpoint),
            "" => Ok(Self::Disabled),
            other => Err(UnservedFrontend {
                frontend: other.to_owned(),
            }),
        }
    }
}

/// Longhorn's endpoint of an NVMe-oF export: `nvmf://ip:port/nqn` (`target`: a
/// `SocketAddr`, or the `ip:port` an engine's status holds).
pub fn nvmf_endpoint(target: impl std::fmt::Display, nqn: &str) -> String {
    format!("nvmf://{target}/{nqn}")
}

/// `tcp://<address>`: a replica address as Longhorn writes it.
pub fn tcp(address: &str) -> String {
    format!("tcp://{address}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entrypoint_names_its_snapshot() {
        let ep = clone_entrypoint("vol-r-1a2b3c4d", "snap-1");
        assert_eq!(ep, "vol-r-1a2b3c4d-clone-ep-snap-1");
        assert_eq!(clone_entrypoint_snapshot(&ep), Some("snap-1"));
        assert_eq!(clone_entrypoint_snapshot(&clone_entrypoint_tmp_head(&ep)), None);
        assert_eq!(clone_entrypoint_snapshot("vol-r-1a2b3c4d-snap-1"), None);
        assert_eq!(clone_entrypoint_snapshot("vol-r-1-clone-ep-"), None);
    }

    #[test]
    fn rebuild_snapshots_are_named_talon_rb_and_a_number() {
        assert!(is_rebuild_snap("talon-rb-1"));
        assert!(is_rebuild_snap("talon-rb-42"));
        assert!(!is_rebuild_snap("talon-rb-"));
        assert!(!is_rebuild_snap("talon-rb-x"));
        assert!(!is_rebuild_snap("snap-1"));
    }

    #[test]
    fn longhorn_names_pass_and_injections_do_not() {
        for ok in ["pvc-0a1b-r-1f2e3d4c", "vol-e-0", "default-disk-abc"] {
            instance_name("replica", ok).expect(ok);
        }
        for bad in [
            "x:nqn.evil",
            "a,b",
            "with space",
            "UPPER",
            "talon-raid-x",
            "vol-r1",
            "",
            "a/b",
        ] {
            let e = instance_name("replica", bad).expect_err(bad);
            assert_eq!(e.value, bad);
        }
        let n = ObjectName::parse("replica", "v-r-1").expect("n");
        assert_eq!(
            replica_nqn(&n).expect("nqn").as_str(),
            "nqn.2023-01.io.longhorn.spdk:v-r-1"
        );
        let v = ObjectName::parse("volume", "v").expect("v");
        assert_eq!(
            volume_nqn(&v).expect("nqn").as_str(),
            "nqn.2023-01.io.longhorn.spdk:volume-v"
        );
        assert_ne!(namespace_id("a"), namespace_id("b"));
    }

    #[test]
    fn frontend_modes_are_longhorns_names_and_others_are_refused_by_name() {
        assert_eq!(
            FrontendMode::of("spdk-tcp-blockdev"),
            Ok(FrontendMode::KernelBlockdev)
        );
        assert_eq!(FrontendMode::of("spdk-tcp-nvmf"), Ok(FrontendMode::NvmfEndpoint));
        assert_eq!(FrontendMode::of(""), Ok(FrontendMode::Disabled));
        let e = FrontendMode::of("ublk").expect_err("ublk");
        assert!(e.to_string().contains("\"ublk\" is not served by talon"), "{e}");
    }

    #[test]
    fn nvmf_endpoints_are_longhorns_urls() {
        let nqn = "nqn.2023-01.io.longhorn.spdk:vol-e-0";
        assert_eq!(
            nvmf_endpoint("10.0.0.2:20001".parse::<std::net::SocketAddr>().expect("v4"), nqn),
            format!("nvmf://10.0.0.2:20001/{nqn}")
        );
        assert_eq!(
            nvmf_endpoint(
                "[fd00::2]:20001".parse::<std::net::SocketAddr>().expect("v6"),
                nqn
            ),
            format!("nvmf://[fd00::2]:20001/{nqn}")
        );
    }
}
