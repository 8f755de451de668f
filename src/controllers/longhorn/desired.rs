//! A Longhorn engine as the engine's desired state: its names in SPDK, its
//! ANA state, and which members it is assembled from, in which slots, bare
//! or raid1. A pure function of the `LonghornEngine`, its current members
//! (the member ledger, `ledger.rs`) and the listing of this node's target:
//! no SPDK call, tested without one. `ensure_engine` carries it out (a
//! remote member attached, the plan served by [`VolumeOps::serve_engine`]).
//!
//! ```text
//!   replicaAddressMap ─ not current (ledger) ─ failedReplicas ──> wanted, in map order
//!   wanted replica held here directly ──> Member::Local(its lvol)   (an lvol not listed: missing, named)
//!                  any other          ──> Member::Remote(address)  (attached over NVMe/TCP)
//!   its raid1 listed ──> Assembly::Serving: made before; its members change by rebuilds and removals
//!   one member ──> a raid1 with an empty second slot (a rebuild joins it there), unless the
//!                  export serves that one lvol bare already (made so before) and the map has one
//! ```
//!
//! [`VolumeOps::serve_engine`]: crate::spdk::volume::VolumeOps::serve_engine

use std::collections::{BTreeMap, BTreeSet};

use super::InstanceError;
use crate::names::{Nqn, ObjectName};
use crate::resources::longhorn::{AnaState, LonghornEngine, LonghornReplica};
use crate::spdk::naming::longhorn as naming;
use crate::spdk::volume::{EngineNames, EnginePlan, ExportSpec, Inventory, NewSubsystem};

/// Longhorn's ANA state of an engine in SPDK's words.
pub(super) fn spdk_ana(a: AnaState) -> crate::spdk::rpc::AnaState {
    use crate::spdk::rpc::AnaState as Spdk;
    match a {
        AnaState::Optimized => Spdk::Optimized,
        AnaState::NonOptimized => Spdk::NonOptimized,
        AnaState::Inaccessible => Spdk::Inaccessible,
    }
}

/// How an engine is served: its names in SPDK (Longhorn's) and its
/// export, for its assembly and its thin rebuild's switch alike.
#[derive(Debug)]
pub(in crate::controllers::longhorn) struct Serving {
    pub(super) names: EngineNames,
    pub(super) spec: ExportSpec,
}

impl Serving {
    /// Engine `id` of its spec `e`, exported by `spec`: raid1 `<engine>`,
    /// exported as `naming::volume_nqn(volume)` with namespace id
    /// `volume-<volume>`, its own controller ID range (a host that connects
    /// to two engines of the volume, a move, sees no duplicate), its
    /// listener added in the ANA state the spec holds. An engine or volume
    /// name that cannot be an NQN's part is refused, naming it.
    pub(super) fn of(id: &str, e: &LonghornEngine, spec: ExportSpec) -> Result<Self, InstanceError> {
        let engine = ObjectName::parse("engine", id)?;
        let volume = ObjectName::parse("volume", &e.volume)?;
        Ok(Self {
            names: EngineNames {
                raid: engine.as_str().to_owned(),
                placeholder: format!("{}lh-{engine}-", crate::spdk::naming::NULL_PREFIX),
                nqn: naming::volume_nqn(&volume)?,
                ns_uuid: naming::namespace_id(&format!("volume-{volume}")),
                subsystem: NewSubsystem {
                    model: "talon-longhorn-engine".into(),
                    serial: None,
                    ana: true,
                    cntlid: Some(super::shared::engine_cntlid(engine.as_str())),
                    listener_ana: Some(spdk_ana(e.ana_state)),
                },
            },
            spec,
        })
    }

    /// The export's subsystem.
    pub(super) fn nqn(&self) -> &Nqn {
        &self.names.nqn
    }

    /// The plan that serves the engine from `slots` (see [`EnginePlan`]);
    /// `bare`: its one replica's lvol, no raid1.
    pub(super) fn plan(&self, slots: Vec<Option<String>>, bare: bool) -> EnginePlan<'_> {
        EnginePlan {
            volume: &self.names.raid,
            names: &self.names,
            slots,
            bare,
            geometry: None,
            superblock: None,
            spec: &self.spec,
        }
    }
}

/// A member an engine is assembled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Member {
    /// A replica of this node the engine claims directly: its lvol (alias).
    Local { replica: String, alias: String },
    /// Any other replica: its export at `address` (`ip:port`), attached here
    /// over NVMe/TCP.
    Remote { replica: String, address: String },
}

/// What an engine's pass does about its assembly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Assembly {
    /// Its raid1 is listed: made before. Its members change by rebuilds and
    /// removals only, never by a new assembly.
    Serving,
    /// Made from `members` (in `replicaAddressMap` order); `missing` names
    /// the wanted local replicas whose lvol is not listed (the engine waits
    /// for them); `bare`: its one member's lvol serves, no raid1.
    Make {
        members: Vec<Member>,
        missing: Vec<String>,
        bare: bool,
    },
}

impl Assembly {
    /// The slots of an engine made from `bdevs` (the members' bdevs, in
    /// order): one member of a raid1 gets an empty second slot.
    pub(super) fn slots(bdevs: Vec<String>, bare: bool) -> Vec<Option<String>> {
        let mut slots: Vec<Option<String>> = bdevs.into_iter().map(Some).collect();
        if slots.len() == 1 && !bare {
            slots.push(None);
        }
        slots
    }
}

/// The assembly of engine `id` (spec `e`, export `nqn`): see the module's
/// picture. `current` is its ledger's current members; `direct` the local
/// replicas it may claim directly (any other, this node's too, is reached
/// through its export).
pub(super) fn assembly(
    id: &str,
    e: &LonghornEngine,
    nqn: &Nqn,
    current: &BTreeSet<String>,
    direct: &BTreeMap<String, LonghornReplica>,
    inv: &Inventory,
) -> Assembly {
    if inv.raid(id).is_some() {
        return Assembly::Serving;
    }
    // only the members the ledger says are current: one that left the raid1
    // (missed writes) or whose rebuild was not seen to end (may hold half a
    // rebuild) stays out, and Longhorn sees it ERR (see `ledger`)
    let wanted = e
        .replica_address_map
        .iter()
        .filter(|(r, _)| current.contains(*r) && !e.failed_replicas.contains(*r));
    let mut members = Vec::new();
    let mut missing = Vec::new();
    let mut count = 0;
    for (replica, address) in wanted {
        count += 1;
        match direct.get(replica) {
            Some(r) => {
                let alias = naming::replica_alias(&r.disk, replica);
                if inv.lvols.contains_key(&alias) {
                    members.push(Member::Local {
                        replica: replica.clone(),
                        alias,
                    });
                } else {
                    missing.push(format!("local replica {replica}: lvol {alias} is missing"));
                }
            }
            None => members.push(Member::Remote {
                replica: replica.clone(),
                address: address.clone(),
            }),
        }
    }
    // one member of several (the others held out, or not given by the
    // manager, which makes an engine over the replicas it sees running): a
    // raid1 still, so the others can be rebuilt into it (Longhorn's
    // ReplicaAdd; a bare engine refuses it). Only an engine that already
    // serves its one lvol bare (made so before) stays so.
    let served_bare = inv
        .subsystem(nqn.as_str())
        .is_some_and(|s| !s.namespaces.is_empty());
    let bare = served_bare && count == 1 && e.replica_address_map.len() == 1;
    Assembly::Make {
        members,
        missing,
        bare,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spdk::rpc::{Lvol, RaidBdev, Subsystem};

    fn engine(map: &[(&str, &str)], failed: &[&str]) -> LonghornEngine {
        let mut e = crate::controllers::longhorn::tests::engine_of_two();
        e.volume = "vol".into();
        e.replica_address_map = map.iter().map(|(r, a)| (r.to_string(), a.to_string())).collect();
        e.failed_replicas = failed.iter().map(|r| r.to_string()).collect();
        e
    }

    fn replica(disk: &str) -> LonghornReplica {
        let spec = serde_json::json!({
            "volume": "vol", "disk": disk, "sizeBytes": 1048576, "portStart": 20000, "portEnd": 20010
        });
        serde_json::from_value(spec).expect("replica")
    }

    fn with_lvols(aliases: &[&str]) -> Inventory {
        let mut inv = Inventory::default();
        for a in aliases {
            let lvol: Lvol = serde_json::from_value(serde_json::json!({
                "alias": a, "uuid": format!("u-{a}"), "name": a,
                "lvs": { "name": "talon-d1", "uuid": "u-d1" }
            }))
            .expect("lvol");
            inv.lvols.insert((*a).to_owned(), lvol);
        }
        inv
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn nqn() -> Nqn {
        naming::volume_nqn(&ObjectName::parse("volume", "vol").expect("name")).expect("nqn")
    }

    #[test]
    fn an_engine_whose_raid_is_listed_is_never_assembled_again() {
        let e = engine(&[("r-a", "10.0.0.1:20000"), ("r-b", "10.0.0.2:20000")], &[]);
        let mut inv = with_lvols(&[]);
        inv.raids.push(RaidBdev {
            name: "vol-e-0".into(),
            uuid: None,
            state: "online".into(),
            raid_level: "raid1".into(),
            superblock: false,
            num_base_bdevs: 2,
            num_base_bdevs_discovered: 2,
            num_base_bdevs_operational: 2,
            base_bdevs_list: Vec::new(),
            process: None,
        });
        let current = set(&["r-a", "r-b"]);
        let a = assembly("vol-e-0", &e, &nqn(), &current, &BTreeMap::new(), &inv);
        assert_eq!(a, Assembly::Serving);
    }

    #[test]
    fn members_are_the_current_replicas_not_set_err_local_ones_by_their_lvol() {
        let e = engine(
            &[
                ("r-a", "10.0.0.1:20000"),
                ("r-b", "10.0.0.2:20000"),
                ("r-c", "10.0.0.3:20000"),
                ("r-d", "10.0.0.1:20002"),
            ],
            &["r-c"],
        );
        let direct = BTreeMap::from([("r-a".to_owned(), replica("d1"))]);
        let alias = naming::replica_alias("d1", "r-a");
        let inv = with_lvols(&[&alias]);
        // r-d: not current (its rebuild was not seen to end)
        let current = set(&["r-a", "r-b", "r-c"]);
        let a = assembly("vol-e-0", &e, &nqn(), &current, &direct, &inv);
        assert_eq!(
            a,
            Assembly::Make {
                members: vec![
                    Member::Local {
                        replica: "r-a".into(),
                        alias
                    },
                    Member::Remote {
                        replica: "r-b".into(),
                        address: "10.0.0.2:20000".into()
                    },
                ],
                missing: vec![],
                bare: false,
            }
        );
    }

    #[test]
    fn a_local_replica_without_its_lvol_is_named_missing() {
        let e = engine(&[("r-a", "10.0.0.1:20000"), ("r-b", "10.0.0.2:20000")], &[]);
        let direct = BTreeMap::from([("r-a".to_owned(), replica("d1"))]);
        let a = assembly(
            "vol-e-0",
            &e,
            &nqn(),
            &set(&["r-a", "r-b"]),
            &direct,
            &with_lvols(&[]),
        );
        let Assembly::Make { members, missing, .. } = a else {
            panic!("{a:?}")
        };
        assert_eq!(members.len(), 1);
        assert_eq!(
            missing,
            vec![format!(
                "local replica r-a: lvol {} is missing",
                naming::replica_alias("d1", "r-a")
            )]
        );
    }

    #[test]
    fn one_member_is_a_raid1_with_an_empty_slot_unless_served_bare_before() {
        let one = engine(&[("r-a", "10.0.0.1:20000")], &[]);
        let direct = BTreeMap::from([("r-a".to_owned(), replica("d1"))]);
        let alias = naming::replica_alias("d1", "r-a");
        let mut inv = with_lvols(&[&alias]);
        let current = set(&["r-a"]);
        let made = |inv: &Inventory, e: &LonghornEngine| match assembly(
            "vol-e-0",
            e,
            &nqn(),
            &current,
            &direct,
            inv,
        ) {
            Assembly::Make { bare, .. } => bare,
            a => panic!("{a:?}"),
        };
        assert!(!made(&inv, &one), "a new engine of one replica is a raid1");
        assert_eq!(
            Assembly::slots(vec![alias.clone()], false),
            vec![Some(alias.clone()), None]
        );
        let sub: Subsystem = serde_json::from_value(serde_json::json!({
            "nqn": nqn().as_str(), "subtype": "NVMe",
            "namespaces": [{"nsid": 1, "bdev_name": alias, "name": alias}]
        }))
        .expect("subsystem");
        inv.subsystems.push(sub);
        assert!(made(&inv, &one), "one served bare before stays bare");
        assert_eq!(Assembly::slots(vec![alias.clone()], true), vec![Some(alias)]);
        // a map of two with one current: a raid1, the other rebuilt into it
        let two = engine(&[("r-a", "10.0.0.1:20000"), ("r-b", "10.0.0.2:20000")], &[]);
        assert!(!made(&inv, &two));
    }

    #[test]
    fn an_engine_is_served_under_longhorns_names_in_its_ana_state() {
        let mut e = engine(&[("r-a", "10.0.0.1:20000")], &[]);
        e.ana_state = AnaState::NonOptimized;
        let spec = ExportSpec::plain(
            "10.0.0.1".parse().expect("ip"),
            20001,
            vec![naming::internal_host_nqn()],
        );
        let s = Serving::of("vol-e-1", &e, spec).expect("serving");
        assert_eq!(s.nqn().as_str(), "nqn.2023-01.io.longhorn.spdk:volume-vol");
        assert_eq!(s.names.raid, "vol-e-1");
        assert_eq!(
            s.names.subsystem.listener_ana,
            Some(crate::spdk::rpc::AnaState::NonOptimized)
        );
        assert_eq!(
            s.names.subsystem.cntlid,
            Some(super::super::shared::engine_cntlid("vol-e-1"))
        );
        let bad = LonghornEngine {
            volume: "vol/../x".into(),
            ..e
        };
        let err = Serving::of(
            "vol-e-1",
            &bad,
            ExportSpec::plain("10.0.0.1".parse().expect("ip"), 20001, vec![]),
        )
        .expect_err("a volume name that is no NQN part");
        assert!(err.text().contains("vol/../x"), "{}", err.text());
    }
}
