//! Every name talon gives an SPDK object of the V2 engine, and the parse
//! back of the lvol names (what [`crate::spdk::inventory`] uses to find what
//! talon owns). Names that reach SPDK come from validated
//! [`ObjectName`]s; lvol names are checked against SPDK's 63 characters where
//! they are made.

use crate::names::{ObjectName, volume_uuid};

pub mod longhorn;

/// Prefix of talon's lvstores (`talon-<disk>`).
pub const LVS_PREFIX: &str = "talon-";
/// Prefix of talon's raid bdevs.
pub const RAID_PREFIX: &str = "talon-raid-";
/// Prefix of talon's placeholder null bdevs.
pub const NULL_PREFIX: &str = "talon-null-";
/// Prefix of the NVMe controllers that attach remote replicas
/// (`talon-remote-<vol>-r<k>`, bdev `talon-remote-<vol>-r<k>n1`).
pub const REMOTE_PREFIX: &str = "talon-remote-";
/// Prefix of talon's disk base bdevs and NVMe controllers (`talon-disk-<d>`).
pub const DISK_BDEV_PREFIX: &str = "talon-disk-";
/// The namespace id of every export.
pub const NSID: u32 = 1;

/// `talon-disk-<disk>`: a file disk's aio bdev, or a PCI disk's NVMe controller.
pub fn disk_base(disk: &str) -> String {
    format!("{DISK_BDEV_PREFIX}{disk}")
}
/// The bdev of a PCI disk's NVMe controller `talon-disk-<d>`: `talon-disk-<d>n1`.
pub fn pci_bdev(controller: &str) -> String {
    format!("{controller}n1")
}

/// `talon-<disk>`.
pub fn lvstore(disk: &str) -> String {
    format!("{LVS_PREFIX}{disk}")
}
/// `<vol>-r<k>`.
pub fn replica(vol: &str, k: usize) -> String {
    format!("{vol}-r{k}")
}
/// `<vol>-r<k>.s.<snap>`.
pub fn snapshot_lvol(vol: &str, k: usize, snap: &str) -> String {
    format!("{vol}-r{k}.s.{snap}")
}
/// `<replica>.rst`: replica lvol `<replica>` (`<vol>-r<k>`) while a
/// restore writes it; renamed to `<replica>` once it holds the backup
/// whole, so a restore cut off leaves no lvol that reads as a replica.
pub fn restoring(replica: &str) -> String {
    format!("{replica}.rst")
}
/// `<replica>.dr`: replica lvol `<replica>` (`<vol>-r<k>`) of a standby
/// (DR) volume: written by its restores, never served; renamed to
/// `<replica>` when the volume is activated.
pub fn standby(replica: &str) -> String {
    format!("{replica}.dr")
}
/// `rb.<n>`: the snapshot name of a rebuild snapshot (taken by a thin
/// rebuild, deleted when it ends); the '.' keeps it apart from every
/// snapshot name a user can give.
pub fn rebuild_snap(n: u32) -> String {
    format!("rb.{n}")
}
/// `n` of a rebuild snapshot's name `rb.<n>`.
pub fn rebuild_snap_number(snap: &str) -> Option<u32> {
    snap.strip_prefix("rb.")?.parse().ok()
}
/// Whether a snapshot name is a rebuild snapshot's.
pub fn is_rebuild_snap(snap: &str) -> bool {
    rebuild_snap_number(snap).is_some()
}
/// `<vol>.rev.<generation>`: a thin empty lvol recording that revert
/// generation N was applied (SPDK keeps it with the data, so a revert runs
/// once even across talon restarts).
pub fn revert_marker(vol: &str, generation: u64) -> String {
    format!("{vol}.rev.{generation}")
}
/// `talon-raid-<vol>`.
pub fn raid(vol: &str) -> String {
    format!("{RAID_PREFIX}{vol}")
}
/// The subsystem serial number: 20 characters from the volume UUID.
pub fn serial(vol: &ObjectName) -> String {
    let u = volume_uuid(vol).simple().to_string().to_uppercase();
    format!("TLN{}", &u[..17])
}

/// What an owned lvol name means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LvolRole {
    /// Replica k of a volume.
    Replica {
        /// The volume.
        volume: String,
        /// k.
        k: usize,
    },
    /// Snapshot of replica k.
    Snapshot {
        /// The volume.
        volume: String,
        /// k.
        k: usize,
        /// The snapshot name.
        snap: String,
    },
    /// A revert marker.
    RevertMarker {
        /// The volume.
        volume: String,
        /// The generation.
        generation: u64,
    },
    /// Replica k while a restore writes it ([`restoring`]): never served.
    Restoring {
        /// The volume.
        volume: String,
        /// k.
        k: usize,
    },
    /// Replica k of a standby volume ([`standby`]): never served.
    Standby {
        /// The volume.
        volume: String,
        /// k.
        k: usize,
    },
}

/// Parses a talon lvol name (inside a `talon-*` lvstore).
pub fn parse_lvol(name: &str) -> Option<LvolRole> {
    if let Some(head) = name.strip_suffix(".rst")
        && let Some(LvolRole::Replica { volume, k }) = parse_lvol(head)
    {
        return Some(LvolRole::Restoring { volume, k });
    }
    if let Some(head) = name.strip_suffix(".dr")
        && let Some(LvolRole::Replica { volume, k }) = parse_lvol(head)
    {
        return Some(LvolRole::Standby { volume, k });
    }
    if let Some((vol, gen_)) = name.split_once(".rev.") {
        return Some(LvolRole::RevertMarker {
            volume: vol.to_owned(),
            generation: gen_.parse().ok()?,
        });
    }
    let (head, snap) = match name.split_once(".s.") {
        Some((h, s)) => (h, Some(s)),
        None => (name, None),
    };
    let (vol, k) = head.rsplit_once("-r")?;
    let k: usize = k.parse().ok()?;
    if vol.is_empty() {
        return None;
    }
    Some(match snap {
        Some(s) => LvolRole::Snapshot {
            volume: vol.to_owned(),
            k,
            snap: s.to_owned(),
        },
        None => LvolRole::Replica {
            volume: vol.to_owned(),
            k,
        },
    })
}

impl LvolRole {
    /// The volume the lvol belongs to.
    pub fn volume(&self) -> &str {
        match self {
            LvolRole::Replica { volume, .. }
            | LvolRole::Snapshot { volume, .. }
            | LvolRole::RevertMarker { volume, .. }
            | LvolRole::Restoring { volume, .. }
            | LvolRole::Standby { volume, .. } => volume,
        }
    }
}

/// Who may own an lvol: the Volumes and LonghornReplicas by id.
#[derive(Debug, Default)]
pub struct Owners {
    /// Volume ids (any engine, any phase).
    pub volumes: std::collections::BTreeSet<String>,
    /// LonghornReplica ids.
    pub replicas: std::collections::BTreeSet<String>,
}

impl Owners {
    /// Both sets, `o`'s added.
    pub fn extend(&mut self, o: Owners) {
        self.volumes.extend(o.volumes);
        self.replicas.extend(o.replicas);
    }

    /// Who owns lvol `name` (in a talon lvstore), if anyone.
    pub fn owner(&self, name: &str) -> Option<String> {
        if let Some(role) = parse_lvol(name)
            && self.volumes.contains(role.volume())
        {
            return Some(format!("volume {}", role.volume()));
        }
        self.replicas
            .iter()
            .find(|r| {
                name == r.as_str()
                    || name
                        .strip_prefix(r.as_str())
                        .is_some_and(|rest| rest.starts_with('-') || rest.starts_with('.'))
            })
            .map(|r| format!("Longhorn replica {r}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_replica_being_restored_is_no_replica_and_belongs_to_its_volume() {
        assert_eq!(
            parse_lvol(&restoring("v-r1")),
            Some(LvolRole::Restoring {
                volume: "v".into(),
                k: 1
            })
        );
        // a snapshot that happens to end in .rst stays a snapshot
        assert!(matches!(
            parse_lvol("v-r1.s.x.rst"),
            Some(LvolRole::Snapshot { .. })
        ));
        let owners = Owners {
            volumes: ["v".to_owned()].into(),
            replicas: Default::default(),
        };
        assert_eq!(owners.owner("v-r1.rst").as_deref(), Some("volume v"));
    }

    #[test]
    fn lvol_names_parse_back() {
        assert_eq!(
            parse_lvol("x-r1-r0"),
            Some(LvolRole::Replica {
                volume: "x-r1".into(),
                k: 0
            })
        );
        assert_eq!(
            parse_lvol("v-r2.s.daily"),
            Some(LvolRole::Snapshot {
                volume: "v".into(),
                k: 2,
                snap: "daily".into()
            })
        );
        assert_eq!(
            parse_lvol("v.rev.3"),
            Some(LvolRole::RevertMarker {
                volume: "v".into(),
                generation: 3
            })
        );
        assert_eq!(parse_lvol("lvol0"), None);
        assert_eq!(parse_lvol("-r0"), None);
    }

    #[test]
    fn serial_is_twenty_chars() {
        let v = ObjectName::parse("volume", "a").expect("name");
        assert_eq!(serial(&v).len(), 20);
    }
}
