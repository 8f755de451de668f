//! Reverts, one driver for both protocols (talon's volumes and Longhorn's
//! engines and replicas): what refuses a revert ([`RevertAsk`]), then
//! [`VolumeOps::revert_members`]: [`VolumeOps::take_down`] deletes what
//! serves the replicas (the export, the raid1, other nodes' replicas
//! attached here) and the heads that do not come back; other nodes revert
//! their replicas ([`RevertPeer`]: Longhorn's SPDKService
//! `ReplicaSnapshotRevert`); then [`VolumeOps::remake_heads`] makes each
//! head of this node again from its snapshot. talon's [`VolumeOps::revert`]
//! adds its names, the point-in-time set, the superblock and the marker; a
//! Longhorn engine's revert (`controllers::longhorn`) adds its persisted
//! begun-record (`LonghornRevertLedger`), and a Longhorn replica's revert
//! (another node's engine asks) remakes its one head.
//!
//! ```text
//!   RevertAsk::check   refused, nothing touched: a frontend attached, a member
//!                      being rebuilt, a member of this node without the snapshot
//!   take_down:         export ─x  raid1 ─x  remote controllers ─x  dropped heads ─x
//!   peers:             each other node reverts its replica (checks first; one still
//!                      at it is answered: Waiting, this node's heads wait)
//!   remake_heads:      <lvs>/<head> ─x ; a clone of <lvs>/<snapshot> (or fresh, its size: superblock)
//! ```
//!
//! Every step is idempotent (what is not there is not deleted twice; a head
//! is deleted before it is made), so a revert that failed half way is
//! carried out again from the start; the caller's persisted record that it
//! began (talon: `revertGeneration` above the marker in SPDK; Longhorn: the
//! ledger) makes a restart carry it on before any raid1 is made again.

use std::collections::{BTreeMap, BTreeSet};

use super::lvol::{HeadFrom, remake_head};
use super::{
    Inventory, LVS_PREFIX, LvolRole, MIB, TakeDown, VolumeError, VolumeOps, naming, parse_lvol,
    point_in_time_set, replica_heads, rpc,
};
use crate::names::{Nqn, ObjectName};
use crate::spdk::error::ErrorKind;
use crate::spdk::rpc::{ByName, Lvol, LvolCreate, LvolSetParent};

/// What a revert is asked over, as [`RevertAsk::check`] refuses it before
/// anything is touched (the same rules and words for both protocols; the
/// words are Longhorn's, which longhorn-manager shows).
#[derive(Debug)]
pub struct RevertAsk<'a> {
    /// What refusals call the reverted object: `engine` (Longhorn) or `volume` (talon).
    pub what: &'static str,
    /// Its name.
    pub id: &'a str,
    /// The snapshot reverted to.
    pub snapshot: &'a str,
    /// The frontend it is attached with (`None`: detached).
    pub frontend: Option<&'a str>,
    /// A member being rebuilt (write-only: it does not hold the snapshot's data).
    pub rebuilding: Option<&'a str>,
    /// This node's members that must hold the snapshot: (member, snapshot's alias `<lvs>/<lvol>`).
    pub holders: Vec<(String, String)>,
}

/// Why [`RevertAsk::check`] refused a revert (nothing was touched).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RevertRefused {
    /// A frontend is attached: a host would see its data change under it.
    #[error(
        "invalid frontend {frontend} for {what} {id} snapshot {snapshot} revert: the {what} must be detached from its frontend"
    )]
    Attached {
        /// `engine` or `volume`.
        what: &'static str,
        /// The engine or volume.
        id: String,
        /// The snapshot.
        snapshot: String,
        /// The frontend attached.
        frontend: String,
    },
    /// A member is being rebuilt (Longhorn: WO, write-only).
    #[error("{what} {id} contains WO replica {replica} during snapshot {snapshot} revert")]
    Rebuilding {
        /// `engine` or `volume`.
        what: &'static str,
        /// The engine or volume.
        id: String,
        /// The member being rebuilt.
        replica: String,
        /// The snapshot.
        snapshot: String,
    },
    /// A member of this node does not hold the snapshot.
    #[error("replica {replica} does not contain the reverting snapshot {snapshot}")]
    Missing {
        /// The member.
        replica: String,
        /// The snapshot.
        snapshot: String,
    },
}

impl RevertAsk<'_> {
    /// Refuses the revert, in this order, while a frontend is attached,
    /// while a member is being rebuilt, or when a member of this node lacks
    /// the snapshot in `inv`.
    pub fn check(&self, inv: &Inventory) -> Result<(), RevertRefused> {
        if let Some(f) = self.frontend {
            return Err(RevertRefused::Attached {
                what: self.what,
                id: self.id.to_owned(),
                snapshot: self.snapshot.to_owned(),
                frontend: f.to_owned(),
            });
        }
        if let Some(r) = self.rebuilding {
            return Err(RevertRefused::Rebuilding {
                what: self.what,
                id: self.id.to_owned(),
                replica: r.to_owned(),
                snapshot: self.snapshot.to_owned(),
            });
        }
        match self
            .holders
            .iter()
            .find(|(_, alias)| !inv.lvols.contains_key(alias))
        {
            Some((replica, _)) => Err(RevertRefused::Missing {
                replica: replica.clone(),
                snapshot: self.snapshot.to_owned(),
            }),
            None => Ok(()),
        }
    }
}

/// Another node's replica in a revert: its node makes the replica's head a
/// clone of the snapshot again, checking first that it holds it (Longhorn:
/// the node's SPDKService `ReplicaSnapshotRevert`). `Error` is the caller's.
#[async_trait::async_trait]
pub trait RevertPeer: Send + Sync {
    /// The caller's error (a node unreachable, or its refusal, in its words).
    type Error: From<VolumeError> + Send;
    /// The replica, as [`Reverted::Waiting`] names it.
    fn replica(&self) -> &str;
    /// Asks its node to revert the replica to `snapshot`, at once: `true`
    /// done, `false` its node is still at it (ask again later).
    async fn revert(&self, snapshot: &str) -> Result<bool, Self::Error>;
}

/// What [`VolumeOps::revert_members`] reverts.
pub struct RevertMembers<'a, E> {
    /// What goes first.
    pub take_down: TakeDown<'a>,
    /// The snapshot (by the name the peers know).
    pub snapshot: &'a str,
    /// Other nodes' replicas.
    pub peers: Vec<Box<dyn RevertPeer<Error = E> + 'a>>,
    /// This node's heads.
    pub heads: Vec<RevertHead>,
}

impl<E: From<VolumeError> + Send> std::fmt::Debug for RevertMembers<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peers: Vec<&str> = self.peers.iter().map(|p| p.replica()).collect();
        f.debug_struct("RevertMembers")
            .field("take_down", &self.take_down)
            .field("snapshot", &self.snapshot)
            .field("peers", &peers)
            .field("heads", &self.heads)
            .finish()
    }
}

/// How far [`VolumeOps::revert_members`] got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reverted {
    /// Every head is made again: the new heads' UUIDs, in order of `heads`.
    Done(Vec<String>),
    /// These other nodes' replicas are still being reverted: this node's
    /// heads are not touched yet; call again (the raid1 stays down).
    Waiting(Vec<String>),
}

/// A head [`VolumeOps::remake_heads`] makes again from its snapshot.
#[derive(Debug, Clone)]
pub struct RevertHead {
    /// The lvstore of both.
    pub lvs: String,
    /// The head's lvol name.
    pub head: String,
    /// The snapshot's lvol name.
    pub snapshot: String,
    /// `Some(mib)`: made fresh and empty of that size (the caller puts the
    /// snapshot under it later), not a clone.
    pub fresh_mib: Option<u64>,
}

impl RevertHead {
    /// The head's alias, `<lvs>/<head>`.
    pub fn alias(&self) -> String {
        format!("{}/{}", self.lvs, self.head)
    }
}

impl VolumeOps {
    /// Carries out a revert past its checks: [`Self::take_down`], then every
    /// peer asked once, then (none still at it) this node's heads made again
    /// ([`Self::remake_heads`]). Idempotent: a failure half way is carried
    /// on by calling it again; the caller keeps its record that the revert
    /// began until [`Reverted::Done`], and makes no raid1 before.
    pub async fn revert_members<E: From<VolumeError> + Send>(
        &self,
        m: &RevertMembers<'_, E>,
    ) -> Result<Reverted, E> {
        self.take_down(&m.take_down).await?;
        crate::util::failpoint("revert-taken-down");
        let mut waiting = Vec::new();
        for p in &m.peers {
            if !p.revert(m.snapshot).await? {
                waiting.push(p.replica().to_owned());
            }
        }
        if !waiting.is_empty() {
            return Ok(Reverted::Waiting(waiting));
        }
        Ok(Reverted::Done(self.remake_heads(m.take_down.id, &m.heads).await?))
    }

    /// Makes each head of `heads` again from its snapshot: the head goes (one
    /// not there is no error), then comes back as a clone of the snapshot
    /// under the same name (or fresh, [`RevertHead::fresh_mib`]). Answers
    /// the new heads' UUIDs, in order.
    pub async fn remake_heads(&self, id: &str, heads: &[RevertHead]) -> Result<Vec<String>, VolumeError> {
        let mut made = Vec::with_capacity(heads.len());
        for h in heads {
            let snapshot = format!("{}/{}", h.lvs, h.snapshot);
            let from = match h.fresh_mib {
                Some(mib) => HeadFrom::Fresh(mib),
                None => HeadFrom::Snapshot(&snapshot),
            };
            let uuid = remake_head(&self.client, &h.lvs, &h.head, from)
                .await
                .map_err(|f| rpc(id, format!("{} for revert", f.doing))(f.source))?;
            made.push(uuid);
            crate::util::failpoint("revert-head-remade");
        }
        Ok(made)
    }

    /// Reverts the volume to snapshot `snap`: the export and engine go
    /// away, the head of each replica of the snapshot's point-in-time set
    /// ([`point_in_time_set`] of `recorded`) is deleted and made again as a
    /// clone of its snapshot, and the marker `<vol>.rev.<generation>` records
    /// it. Every other replica (behind when the snapshot was taken, or whose
    /// snapshot is not proven to be the same instant) loses its head: it is
    /// made again empty and rebuilt from the set, so a raid1 is never built
    /// over members that may differ. Idempotent: run again after a failure,
    /// it finishes the missing replicas. Returns the replicas now up to date;
    /// the caller then calls [`VolumeOps::ensure`] with them to export again.
    pub async fn revert(
        &self,
        inv: &Inventory,
        vol: &ObjectName,
        snap: &ObjectName,
        generation: u64,
        recorded: Option<&BTreeSet<usize>>,
        superblock: Option<usize>,
    ) -> Result<BTreeSet<usize>, VolumeError> {
        let v = vol.as_str();
        let id = format!("{v}@{snap}");
        let sources = point_in_time_set(inv, v, snap.as_str(), recorded);
        let snaps: Vec<(usize, &Lvol)> = inv
            .lvols
            .values()
            .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
            .filter_map(|l| match parse_lvol(&l.name) {
                Some(LvolRole::Snapshot { volume, k, snap: s })
                    if volume == v && s == snap.as_str() && sources.contains(&k) =>
                {
                    Some((k, l))
                }
                _ => None,
            })
            .collect();
        if snaps.is_empty() {
            return Err(VolumeError::SnapshotMissing {
                volume: v.to_owned(),
                lvol: naming::snapshot_lvol(v, 0, snap.as_str()),
            });
        }
        // engine and export go (SPDK has no in-place revert), and the heads
        // of replicas outside the set
        let nqn = Nqn::for_volume(vol);
        let raid = naming::raid(v);
        let take_down = TakeDown {
            id: &id,
            why: "revert",
            export: inv.subsystem(nqn.as_str()).map(|_| nqn.as_str()),
            raid: inv.raid(&raid).map(|_| raid.as_str()),
            remotes: Vec::new(),
            dropped: replica_heads(inv, v)
                .into_iter()
                .filter(|(k, _)| !snaps.iter().any(|(sk, _)| sk == k))
                .map(|(_, l)| l.alias.clone())
                .collect(),
        };
        let plan: Vec<RevertHead> = snaps
            .iter()
            .map(|(k, s)| RevertHead {
                lvs: s.lvs.name.clone(),
                head: naming::replica(v, *k),
                snapshot: s.name.clone(),
                // a fresh head of the snapshot's size (a clone would show the
                // old raid's superblock, and SPDK refuses it in a new raid)
                fresh_mib: superblock.map(|_| inv.bdev_size(&s.uuid).unwrap_or(0) / MIB),
            })
            .collect();
        let made = match self
            .revert_members::<VolumeError>(&RevertMembers {
                take_down,
                snapshot: snap.as_str(),
                peers: Vec::new(),
                heads: plan.clone(),
            })
            .await?
        {
            Reverted::Done(made) => made,
            // (no peers: nothing waits)
            Reverted::Waiting(replicas) => {
                return Err(VolumeError::RevertWaiting {
                    volume: id.clone(),
                    replicas,
                });
            }
        };
        let heads: BTreeMap<usize, (String, String)> = snaps
            .iter()
            .zip(plan.iter().zip(made))
            .map(|((k, _), (h, uuid))| (*k, (h.alias(), uuid)))
            .collect();
        if let Some(slots) = superblock {
            // the raid over the fresh heads writes its superblock into their
            // own first cluster; then the snapshots go under them. The marker
            // below comes last: a stop before it makes the next start revert
            // again from the beginning.
            let first = &snaps[0].1;
            let geometry = match inv.bdevs.get(&first.uuid) {
                Some(b) => (b.block_size, b.num_blocks),
                None => (4096, inv.bdev_size(&first.uuid).unwrap_or(0) / 4096),
            };
            let members: Vec<Option<String>> = (0..slots.max(2))
                .map(|k| heads.get(&k).map(|(_, uuid)| uuid.clone()))
                .collect();
            let mut made = Vec::new();
            self.create_raid(inv, v, &members, geometry, true, &mut made)
                .await
                .map_err(|e| match e {
                    VolumeError::Rpc { step, source, .. } => VolumeError::Rpc {
                        volume: id.clone(),
                        step,
                        source,
                    },
                    e => e,
                })?;
            for (k, s) in &snaps {
                let Some((alias, _)) = heads.get(k) else { continue };
                self.client
                    .bdev_lvol_set_parent(&LvolSetParent {
                        lvol_name: alias.clone(),
                        parent_name: s.alias.clone(),
                    })
                    .await
                    .map_err(rpc(&id, format!("making {} the parent of {alias}", s.alias)))?;
            }
        }
        let lvs = &snaps[0].1.lvs.name;
        let marker = naming::revert_marker(v, generation);
        match self
            .client
            .bdev_lvol_create(&LvolCreate::thin(lvs, &marker, 1))
            .await
        {
            Ok(_) => {}
            Err(e) if e.is(ErrorKind::AlreadyExists) => {}
            Err(e) => return Err(rpc(&id, format!("recording revert marker {lvs}/{marker}"))(e)),
        }
        // older markers go
        for l in inv.lvols.values() {
            if let Some(LvolRole::RevertMarker {
                volume,
                generation: g,
            }) = parse_lvol(&l.name)
                && volume == v
                && g < generation
            {
                let _ = self.client.bdev_lvol_delete(&ByName::new(&l.alias)).await;
            }
        }
        Ok(snaps.iter().map(|(k, _)| *k).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv_with(aliases: &[&str]) -> Inventory {
        let lvols = aliases
            .iter()
            .map(|a| {
                let (lvs, name) = a.split_once('/').expect("lvs/name");
                let l: Lvol = serde_json::from_value(serde_json::json!({
                    "alias": a, "uuid": format!("u-{name}"), "name": name,
                    "lvs": { "name": lvs, "uuid": format!("u-{lvs}") }
                }))
                .expect("lvol");
                (l.alias.clone(), l)
            })
            .collect();
        Inventory {
            lvstores: vec![],
            lvols,
            bdevs: Default::default(),
            raids: vec![],
            subsystems: vec![],
            tcp_transport: true,
            controllers: vec![],
        }
    }

    fn ask<'a>(what: &'static str, frontend: Option<&'a str>, rebuilding: Option<&'a str>) -> RevertAsk<'a> {
        RevertAsk {
            what,
            id: "e",
            snapshot: "s1",
            frontend,
            rebuilding,
            holders: vec![
                ("ra".into(), "talon-d/ra-snap-s1".into()),
                ("rb".into(), "talon-d/rb-snap-s1".into()),
            ],
        }
    }

    /// Both protocols' revert refusals, in one order and Longhorn's words
    /// (the manager shows them): a frontend first, then a member being
    /// rebuilt, then a member of this node without the snapshot.
    #[test]
    fn a_revert_is_refused_for_a_frontend_a_rebuild_or_a_missing_snapshot_in_that_order() {
        let both = inv_with(&["talon-d/ra-snap-s1", "talon-d/rb-snap-s1"]);
        let one = inv_with(&["talon-d/ra-snap-s1"]);
        ask("engine", None, None).check(&both).expect("allowed");
        let no = |a: RevertAsk<'_>, inv: &Inventory| a.check(inv).expect_err("refused").to_string();
        assert_eq!(
            no(ask("engine", Some("spdk-tcp-blockdev"), Some("rb")), &one),
            "invalid frontend spdk-tcp-blockdev for engine e snapshot s1 revert: the engine must be detached from its frontend"
        );
        assert_eq!(
            no(ask("volume", Some("nvme-tcp"), None), &both),
            "invalid frontend nvme-tcp for volume e snapshot s1 revert: the volume must be detached from its frontend"
        );
        assert_eq!(
            no(ask("engine", None, Some("rb")), &one),
            "engine e contains WO replica rb during snapshot s1 revert"
        );
        assert_eq!(
            no(ask("engine", None, None), &one),
            "replica rb does not contain the reverting snapshot s1"
        );
    }

    /// A peer that answers from a list, for the driver's order.
    struct Scripted {
        replica: String,
        done: bool,
        asked: std::sync::Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl RevertPeer for &Scripted {
        type Error = VolumeError;
        fn replica(&self) -> &str {
            &self.replica
        }
        async fn revert(&self, snapshot: &str) -> Result<bool, VolumeError> {
            self.asked.lock().expect("lock").push(snapshot.to_owned());
            Ok(self.done)
        }
    }

    /// The one driver: a peer still at it leaves this node's heads
    /// untouched (answered Waiting, asked again later); with every peer
    /// done, this node's heads are clones of the snapshot. Run on the
    /// double, which refuses what SPDK v26.05 refuses.
    #[tokio::test]
    async fn the_revert_driver_waits_on_peers_before_it_touches_this_nodes_heads() {
        use crate::spdk::double::SpdkDouble;
        let dir = tempfile::tempdir().expect("tempdir");
        let double = SpdkDouble::start(dir.path().join("spdk.sock"))
            .await
            .expect("double");
        let client = crate::spdk::SpdkClient::new(double.socket());
        crate::spdk::double::malloc_lvstore(&client, "talon-d")
            .await
            .expect("malloc bdev and lvstore");
        client
            .bdev_lvol_create(&LvolCreate::thin("talon-d", "ra", 4))
            .await
            .expect("head");
        client
            .bdev_lvol_snapshot(&crate::spdk::rpc::LvolSnapshot {
                lvol_name: "talon-d/ra".into(),
                snapshot_name: "ra-snap-s1".into(),
            })
            .await
            .expect("snapshot");
        let ops = VolumeOps::new(client.clone());
        let head = |inv: &Inventory| inv.lvols.get("talon-d/ra").map(|l| l.uuid.clone());
        let before = head(&Inventory::load(&client).await.expect("inv")).expect("head ra");
        let busy = Scripted {
            replica: "rb".into(),
            done: false,
            asked: Default::default(),
        };
        let members = |snap: &'static str| RevertMembers::<VolumeError> {
            take_down: TakeDown {
                id: "e@s1",
                why: "revert",
                export: None,
                raid: None,
                remotes: Vec::new(),
                dropped: Vec::new(),
            },
            snapshot: "s1",
            peers: Vec::new(),
            heads: vec![RevertHead {
                lvs: "talon-d".into(),
                head: "ra".into(),
                snapshot: format!("ra-snap-{snap}"),
                fresh_mib: None,
            }],
        };
        let mut waiting = members("s1");
        waiting.peers.push(Box::new(&busy));
        assert_eq!(
            ops.revert_members(&waiting).await.expect("asked"),
            Reverted::Waiting(vec!["rb".into()])
        );
        assert_eq!(*busy.asked.lock().expect("lock"), ["s1"]);
        let inv = Inventory::load(&client).await.expect("inv");
        assert_eq!(head(&inv).as_ref(), Some(&before), "this node's head untouched");
        let done = ops.revert_members(&members("s1")).await.expect("done");
        let made = match done {
            Reverted::Done(made) => made,
            Reverted::Waiting(w) => Vec::from_iter(w.into_iter().map(|r| format!("waiting on {r}"))),
        };
        let inv = Inventory::load(&client).await.expect("inv");
        assert_eq!(head(&inv), made.first().cloned(), "{made:?}");
        assert_ne!(made.first(), Some(&before), "the head was made again");
    }
}
