//! Replicas that left an engine's replica map (`ReplicaRemove` takes them
//! out of the spec and waits for the status to have seen that spec), and
//! replicas longhorn-manager set ERR (`ReplicaModeUpdate`, after its
//! snapshot checksum vote): this node's controller takes them out of the
//! raid1 and detaches the remote ones that left.
//!
//! ```text
//!   ReplicaRemove(r)     ──> replicaAddressMap -= r  (engine version v) ──> waits: status.observedVersion >= v
//!   ReplicaModeUpdate(r) ──> failedReplicas += r     (engine version v) ──> waits: the same, then r out of the raid1
//!   reconcile: raid1 slot of a replica not in the map, or failed ──> out of the raid1
//!              a remote member attached before (status.remoteMembers), not in the map ──> detached
//!   a raid1 made again: never over a failed replica (until ReplicaAdd of it clears the mark)
//! ```

use std::collections::{BTreeMap, BTreeSet};

use super::{LonghornController, chain};
use crate::resources::longhorn::{LonghornEngine, LonghornInstanceStatus, LonghornReplica};
use crate::runtime::Typed;
use crate::spdk::volume::Inventory;

impl LonghornController {
    /// Takes the replicas that left engine `e`'s map out of its raid1 and
    /// detaches the remote ones (`prev.remoteMembers`). Only a slot this can
    /// name as a replica not in the map is touched: an lvol of this node, or
    /// the namespace `<replica>n1` of a controller. What SPDK refuses does
    /// not stop the engine: it is logged and given back (a slot stays in
    /// the raid1 and a controller stays in the status's `remoteMembers`, so
    /// the next reconcile tries again).
    pub(super) async fn drop_removed(
        &self,
        inv: &mut Inventory,
        e: &Typed<LonghornEngine>,
        local: &BTreeMap<String, LonghornReplica>,
        prev: Option<&LonghornInstanceStatus>,
    ) -> Left {
        let mut left = Left::default();
        let map = &e.spec.replica_address_map;
        // the raid1 keeps the replicas of the map that were not set ERR
        let kept: BTreeMap<String, String> = map
            .iter()
            .filter(|(r, _)| !e.spec.failed_replicas.contains(*r))
            .map(|(r, a)| (r.clone(), a.clone()))
            .collect();
        let slots: Vec<String> = inv
            .raid(e.id())
            .map(|r| r.base_bdevs_list.iter().filter_map(|b| b.name.clone()).collect())
            .unwrap_or_default();
        for slot in slots {
            let Some((replica, member)) = removed_member(inv, &kept, &slot) else {
                continue;
            };
            let why = if map.contains_key(&replica) {
                "set ERR (ReplicaModeUpdate)"
            } else {
                "left (ReplicaRemove)"
            };
            if let Err(x) = self.ops.take_out_member(&slot).await {
                left.failed(
                    e.id(),
                    format!(
                        "replica {replica} {why}: taking {member} out of the raid1: {}",
                        chain(&x)
                    ),
                );
                continue;
            }
            inv.empty_slot(e.id(), &slot);
            self.caps.forget(&member);
            self.caps.forget(&slot);
            tracing::info!(
                engine = e.id(),
                replica,
                member,
                "replica out of the raid1: {why}"
            );
        }
        let attached: Vec<String> = prev
            .map(|p| p.remote_members.iter())
            .into_iter()
            .flatten()
            .filter(|r| !map.contains_key(*r) && !local.contains_key(*r))
            .filter(|r| inv.controllers.iter().any(|c| c == *r))
            .cloned()
            .collect();
        for replica in attached {
            if let Err(x) = self.ops.detach_remote(inv, &replica).await {
                left.failed(
                    e.id(),
                    format!("replica {replica} left: detaching it: {}", chain(&x)),
                );
                left.attached.insert(replica);
                continue;
            }
            tracing::info!(
                engine = e.id(),
                replica,
                "remote replica detached (ReplicaRemove)"
            );
        }
        left
    }
}

/// What [`LonghornController::drop_removed`] could not do.
#[derive(Debug, Default)]
pub(super) struct Left {
    /// Remote replicas gone from the map still attached.
    pub attached: BTreeSet<String>,
    /// What SPDK refused, one line each.
    pub errors: Vec<String>,
}

impl Left {
    fn failed(&mut self, engine: &str, m: String) {
        tracing::warn!(engine, "{m}; tried again at the next reconcile");
        self.errors.push(m);
    }
}

/// The replicas of `map` served from afar (attached by the engine).
pub(super) fn remote_members(
    map: &BTreeMap<String, String>,
    local: &BTreeMap<String, LonghornReplica>,
) -> BTreeSet<String> {
    map.keys().filter(|r| !local.contains_key(*r)).cloned().collect()
}

/// The replica raid1 slot `slot` holds and its member bdev name, when that
/// replica is not in `map`: an lvol of this node (the slot names its UUID or
/// alias), or the namespace `<replica>n1` of a controller. `None` for a
/// replica of the map and for what is not a replica (a placeholder).
fn removed_member(inv: &Inventory, map: &BTreeMap<String, String>, slot: &str) -> Option<(String, String)> {
    if let Some((alias, l)) = inv
        .lvols
        .iter()
        .find(|(a, l)| l.uuid == slot || a.as_str() == slot)
    {
        return (!map.contains_key(&l.name)).then(|| (l.name.clone(), alias.clone()));
    }
    let replica = slot.strip_suffix("n1")?;
    (inv.controllers.iter().any(|c| c == replica) && !map.contains_key(replica))
        .then(|| (replica.to_owned(), slot.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv() -> Inventory {
        let l: crate::spdk::rpc::Lvol = serde_json::from_value(serde_json::json!({
            "alias": "talon-d/vol-r-a", "uuid": "u-a", "name": "vol-r-a",
            "lvs": { "name": "talon-d", "uuid": "u-d" }
        }))
        .expect("lvol");
        let mut inv = Inventory::default();
        inv.lvols.insert(l.alias.clone(), l);
        inv.controllers = vec!["vol-r-b".into(), "vol-r-c".into()];
        inv
    }

    /// Only a slot that names a replica gone from the map is taken out: this
    /// node's lvol by UUID or alias, a controller's `<replica>n1`; a replica
    /// still in the map, a placeholder or an unknown bdev never.
    #[test]
    fn only_a_slot_of_a_replica_gone_from_the_map_is_taken_out() {
        let inv = inv();
        let map: BTreeMap<String, String> = [("vol-r-c".to_string(), "127.0.0.2:1".to_string())].into();
        assert_eq!(
            removed_member(&inv, &map, "u-a"),
            Some(("vol-r-a".into(), "talon-d/vol-r-a".into()))
        );
        assert_eq!(
            removed_member(&inv, &map, "talon-d/vol-r-a"),
            Some(("vol-r-a".into(), "talon-d/vol-r-a".into()))
        );
        assert_eq!(
            removed_member(&inv, &map, "vol-r-bn1"),
            Some(("vol-r-b".into(), "vol-r-bn1".into()))
        );
        assert_eq!(removed_member(&inv, &map, "vol-r-cn1"), None, "in the map");
        assert_eq!(
            removed_member(&inv, &map, "talon-null-lh-e"),
            None,
            "a placeholder"
        );
        assert_eq!(
            removed_member(&inv, &map, "vol-r-xn1"),
            None,
            "no such controller"
        );
        let all: BTreeMap<String, String> = [("vol-r-a".to_string(), "127.0.0.1:1".to_string())].into();
        assert_eq!(removed_member(&inv, &all, "u-a"), None, "in the map");
    }
}
