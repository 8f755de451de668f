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

use super::{InstanceError, status};
use crate::names::{Nqn, ObjectName};
use crate::resources::engine::{DiskStatus, ObjectState, TargetStatus};
use crate::resources::longhorn::{
    AnaState, InstanceKind, InstanceState, LonghornEngine, LonghornInstanceStatus, LonghornReplica,
};
use crate::runtime::{Phase, Typed};
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
    Local { alias: String },
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
    for (replica, address) in wanted {
        match direct.get(replica) {
            Some(r) => {
                let alias = naming::replica_alias(&r.disk, replica);
                if inv.lvols.contains_key(&alias) {
                    members.push(Member::Local { alias });
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
    let bare = served_bare && members.len() + missing.len() == 1 && e.replica_address_map.len() == 1;
    Assembly::Make {
        members,
        missing,
        bare,
    }
}

/// This node's running replicas, as an engine's pass sees them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Local<'a> {
    /// Those the engine may claim directly ([`direct_members`]): its raid
    /// knows any other by its export's loopback bdev.
    pub(super) direct: &'a BTreeMap<String, LonghornReplica>,
    /// All of them, those behind their export for another engine too: a
    /// rebuild copies from a source of this node in this target, whatever
    /// path its raid has to it.
    pub(super) all: &'a BTreeMap<String, LonghornReplica>,
}

/// The local replicas an engine here may claim directly: all but those
/// another engine reads through their exports (`shared`).
pub(super) fn direct_members(
    local: &BTreeMap<String, LonghornReplica>,
    shared: &BTreeSet<String>,
) -> BTreeMap<String, LonghornReplica> {
    local
        .iter()
        .filter(|(r, _)| !shared.contains(*r))
        .map(|(r, s)| (r.clone(), s.clone()))
        .collect()
}

/// The replicas this node serves: running, and not made only to be removed.
pub(super) fn local_replicas(replicas: &[Typed<LonghornReplica>]) -> BTreeMap<String, LonghornReplica> {
    replicas
        .iter()
        .filter(|r| r.metadata.phase == Phase::Running && !r.spec.cleanup)
        .map(|r| (r.id().to_owned(), r.spec.clone()))
        .collect()
}

/// The local replicas a running engine here holds (a raid1 claims them: not
/// exported), each with that engine, but those rebuilt from another node
/// (exported for it) and those `shared` (another engine reads them through
/// their export: see [`shared`]).
pub(super) fn held<'a>(
    running_engines: &[&'a Typed<LonghornEngine>],
    local: &BTreeMap<String, LonghornReplica>,
    rebuilt_from_afar: &BTreeSet<String>,
    shared: &BTreeSet<String>,
) -> BTreeMap<&'a str, &'a str> {
    running_engines
        .iter()
        .flat_map(|e| e.spec.replica_address_map.keys().map(move |r| (r, e.id())))
        .filter(|(r, _)| local.contains_key(*r) && !rebuilt_from_afar.contains(*r) && !shared.contains(*r))
        .map(|(r, e)| (r.as_str(), e))
        .collect()
}

/// The disk of a replica when it is ready on the running target; loading
/// (a replica starting) while it is being brought up, not reported yet
/// (talon just started) or ready only on an earlier spdk_tgt (this one may
/// not have opened its lvols yet: [`DiskStatus::ready_on`]); not ready (a
/// replica in error) when it failed or goes.
pub(super) fn disk_ready(
    disk: &str,
    status: Option<Typed<DiskStatus>>,
    target: Option<&TargetStatus>,
) -> Result<Typed<DiskStatus>, InstanceError> {
    match status {
        Some(d) if d.spec.ready_on(target) => Ok(d),
        Some(d) if d.spec.state == ObjectState::Ready => Err(InstanceError::DiskLoading {
            disk: disk.to_owned(),
            why: "ready on an earlier spdk_tgt; waiting for this one to open its lvols".into(),
        }),
        Some(d) if d.spec.state == ObjectState::Creating => Err(InstanceError::DiskLoading {
            disk: disk.to_owned(),
            why: d.spec.message.clone(),
        }),
        None => Err(InstanceError::DiskLoading {
            disk: disk.to_owned(),
            why: "no status yet".into(),
        }),
        Some(d) => Err(InstanceError::DiskNotReady {
            disk: disk.to_owned(),
            why: format!("{:?}: {}", d.spec.state, d.spec.message),
        }),
    }
}

/// An engine's status from what `ensure_engine` came to: running, starting
/// while it waits for replicas, or in error.
pub(super) fn engine_status(made: Result<LonghornInstanceStatus, InstanceError>) -> LonghornInstanceStatus {
    match made {
        Ok(s) => s,
        Err(m) if m.waits() => status(InstanceKind::Engine, InstanceState::Starting, m.text()),
        Err(m) => status(InstanceKind::Engine, InstanceState::Error, m.text()),
    }
}

/// What an engine that is not running keeps of its previous status.
pub(super) fn keep_recorded(st: &mut LonghornInstanceStatus, prev: LonghornInstanceStatus) {
    // the rebuilds started stay recorded (none is started twice)
    st.rebuilds_started = prev.rebuilds_started;
    st.rebuilds_done = prev.rebuilds_done;
    st.rebuild_errors = prev.rebuild_errors;
    st.purge = prev.purge;
    // what is still to detach stays known
    st.remote_members = prev.remote_members;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::longhorn::tests::{engine, replica, tearing_down, typed};
    use crate::spdk::rpc::{Lvol, RaidBdev, Subsystem};

    fn engine_of(map: &[(&str, &str)], failed: &[&str]) -> LonghornEngine {
        let mut e = crate::controllers::longhorn::tests::engine_of_two();
        e.volume = "vol".into();
        e.replica_address_map = map.iter().map(|(r, a)| (r.to_string(), a.to_string())).collect();
        e.failed_replicas = failed.iter().map(|r| r.to_string()).collect();
        e
    }

    fn replica_on(disk: &str) -> LonghornReplica {
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
        let e = engine_of(&[("r-a", "10.0.0.1:20000"), ("r-b", "10.0.0.2:20000")], &[]);
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
        let e = engine_of(
            &[
                ("r-a", "10.0.0.1:20000"),
                ("r-b", "10.0.0.2:20000"),
                ("r-c", "10.0.0.3:20000"),
                ("r-d", "10.0.0.1:20002"),
            ],
            &["r-c"],
        );
        let direct = BTreeMap::from([("r-a".to_owned(), replica_on("d1"))]);
        let alias = naming::replica_alias("d1", "r-a");
        let inv = with_lvols(&[&alias]);
        // r-d: not current (its rebuild was not seen to end)
        let current = set(&["r-a", "r-b", "r-c"]);
        let a = assembly("vol-e-0", &e, &nqn(), &current, &direct, &inv);
        assert_eq!(
            a,
            Assembly::Make {
                members: vec![
                    Member::Local { alias },
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
        let e = engine_of(&[("r-a", "10.0.0.1:20000"), ("r-b", "10.0.0.2:20000")], &[]);
        let direct = BTreeMap::from([("r-a".to_owned(), replica_on("d1"))]);
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
        let one = engine_of(&[("r-a", "10.0.0.1:20000")], &[]);
        let direct = BTreeMap::from([("r-a".to_owned(), replica_on("d1"))]);
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
        let two = engine_of(&[("r-a", "10.0.0.1:20000"), ("r-b", "10.0.0.2:20000")], &[]);
        assert!(!made(&inv, &two));
    }

    #[test]
    fn an_engine_is_served_under_longhorns_names_in_its_ana_state() {
        let mut e = engine_of(&[("r-a", "10.0.0.1:20000")], &[]);
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

    #[test]
    fn a_replica_whose_disk_loads_is_starting_one_whose_disk_failed_an_error() {
        let target = |pid| TargetStatus::ready_for_test(Some(pid), String::new());
        let (now, before) = (target(20), target(10));
        let disk = |state, message: &str| {
            Some(typed(
                "d1",
                DiskStatus {
                    engine: crate::resources::engine::Engine::V2,
                    state,
                    bdev: "talon-disk-d1".into(),
                    lvstore: "talon-d1".into(),
                    lvstore_uuid: String::new(),
                    total_bytes: 0,
                    free_bytes: 0,
                    cluster_bytes: 0,
                    message: message.into(),
                    target: Some(now.instance()),
                },
            ))
        };
        assert!(disk_ready("d1", disk(ObjectState::Ready, "lvstore talon-d1"), Some(&now)).is_ok());
        // talon just started: no status yet, or the disk's bdev being made (its
        // lvstore replayed after a kill -9); or ready on the target before
        // this one, whose lvols this one may not have opened yet
        for (st, t) in [
            (None, &now),
            (disk(ObjectState::Creating, "waiting for spdk_tgt"), &now),
            (disk(ObjectState::Ready, "lvstore talon-d1"), &before),
        ] {
            let e = disk_ready("d1", st, Some(t)).expect_err("a loading disk is not ready");
            assert!(e.replica_starting(), "{e}");
            assert!(e.text().contains("disk d1 is loading"), "{}", e.text());
        }
        let e = disk_ready("d1", disk(ObjectState::Ready, "lvstore talon-d1"), None)
            .expect_err("no target running: not ready");
        assert!(e.replica_starting(), "{e}");
        let e = disk_ready(
            "d1",
            disk(ObjectState::Failed, "lvstore talon-d1 did not load"),
            Some(&now),
        )
        .expect_err("a failed disk is not ready");
        assert!(!e.replica_starting());
        assert!(
            e.text().contains("disk d1 is not ready") && e.text().contains("did not load"),
            "{}",
            e.text()
        );
    }

    /// This node serves its running replicas, not those tearing down or
    /// made only to be removed.
    #[test]
    fn only_running_replicas_not_made_to_be_removed_are_served_here() {
        let replicas = [
            replica("r-a", false),
            replica("r-b", true),
            tearing_down(replica("r-c", false)),
        ];
        assert_eq!(local_replicas(&replicas).into_keys().collect::<Vec<_>>(), ["r-a"]);
    }

    /// A local replica in a running engine's map is held (not exported)
    /// unless it is rebuilt from another node; another node's replica never.
    #[test]
    fn a_local_replica_of_a_running_engine_is_held_unless_rebuilt_from_afar() {
        let local = local_replicas(&[
            replica("r-a", false),
            replica("r-b", false),
            replica("r-c", false),
        ]);
        let (e1, e2) = (engine("e1", &["r-a", "r-x"]), engine("e2", &["r-b"]));
        let afar = BTreeSet::from(["r-b".to_owned()]);
        let none = BTreeSet::new();
        assert_eq!(
            held(&[&e1, &e2], &local, &afar, &none),
            BTreeMap::from([("r-a", "e1")])
        );
        assert_eq!(
            held(&[&e1, &e2], &local, &none, &none),
            BTreeMap::from([("r-a", "e1"), ("r-b", "e2")])
        );
        assert!(held(&[], &local, &afar, &none).is_empty());
        // one another engine reads through its export stays exported
        let shared = BTreeSet::from(["r-a".to_owned()]);
        assert_eq!(
            held(&[&e1, &e2], &local, &none, &shared),
            BTreeMap::from([("r-b", "e2")])
        );
    }

    /// An engine that waits for its replicas is starting, one that failed
    /// otherwise is in error.
    #[test]
    fn an_engine_waiting_for_replicas_is_starting_any_other_failure_an_error() {
        let s = engine_status(Err(InstanceError::WaitingForReplicas(vec![
            "remote replica r-b: cannot reach its node".into(),
            "local replica r-c: lvol talon-d/r-c is missing".into(),
        ])));
        assert_eq!(
            (s.state, s.message.as_str()),
            (
                InstanceState::Starting,
                "waiting for replicas: remote replica r-b: cannot reach its node; \
                 local replica r-c: lvol talon-d/r-c is missing"
            )
        );
        assert_eq!(
            engine_status(Err(InstanceError::NoHost)).state,
            InstanceState::Error
        );
        // a failure is an error whatever its words (they were once matched)
        let words = InstanceError::PeerRefused {
            replica: "r".into(),
            message: "waiting for replicas to learn the address".into(),
        };
        assert_eq!(engine_status(Err(words)).state, InstanceState::Error);
        let ok = status(InstanceKind::Engine, InstanceState::Running, "");
        assert_eq!(engine_status(Ok(ok.clone())), ok);
    }

    /// An engine not running keeps the rebuilds it started, saw done or
    /// failed, its purge and the members still to detach; nothing else.
    #[test]
    fn an_engine_not_running_keeps_its_rebuild_records_and_members_to_detach() {
        let mut prev = status(InstanceKind::Engine, InstanceState::Running, "");
        prev.rebuilds_started = [("r-a".to_owned(), 2)].into();
        prev.rebuilds_done = [("r-a".to_owned(), 1)].into();
        prev.rebuild_errors = [("r-b".to_owned(), "no lvol".to_owned())].into();
        prev.remote_members = ["r-b".to_owned()].into();
        prev.thin_rebuilds = [("r-a".to_owned(), 40)].into();
        prev.bdev = "e".into();
        let mut st = status(InstanceKind::Engine, InstanceState::Error, "gone");
        keep_recorded(&mut st, prev.clone());
        assert_eq!(st.rebuilds_started, prev.rebuilds_started);
        assert_eq!(st.rebuilds_done, prev.rebuilds_done);
        assert_eq!(st.rebuild_errors, prev.rebuild_errors);
        assert_eq!(st.remote_members, prev.remote_members);
        assert_eq!(st.purge, prev.purge);
        assert!(st.thin_rebuilds.is_empty() && st.bdev.is_empty(), "{st:?}");
        assert_eq!((st.state, st.message.as_str()), (InstanceState::Error, "gone"));
    }
}
