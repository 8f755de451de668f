//! [`ReplicaLvols`] in Longhorn's messages: read from another node's
//! `ReplicaGet` answer, written into this node's.

use std::collections::BTreeMap;

use crate::proto::spdkrpc;
use crate::spdk::volume::ReplicaLvols;

/// From another node's `ReplicaGet` answer.
impl From<&spdkrpc::Replica> for ReplicaLvols {
    fn from(r: &spdkrpc::Replica) -> Self {
        // a parent that is none of the replica's snapshots is its base (a
        // linked clone's entrypoint, as Longhorn reports it too)
        let mut base = None;
        let mut parent = |p: &str| {
            if p.is_empty() {
                None
            } else if r.snapshots.contains_key(p) {
                Some(p.to_owned())
            } else {
                base = Some(p.to_owned());
                None
            }
        };
        let head_parent = r.head.as_ref().and_then(|h| parent(&h.parent));
        let snapshots = r
            .snapshots
            .iter()
            .map(|(n, l)| (n.clone(), (parent(&l.parent), l.actual_size)))
            .collect();
        Self {
            head: r.head.is_some(),
            head_parent,
            head_bytes: r.head.as_ref().map_or(0, |h| h.actual_size),
            snapshots,
            base,
        }
    }
}

/// Replica message `r`'s head and snapshots as `ReplicaGet` reports `lvols`.
pub fn fill_replica(lvols: &ReplicaLvols, r: &mut spdkrpc::Replica) {
    // the chain's first lvol is a clone of the base (a linked clone's entrypoint)
    let base = lvols.base.clone().unwrap_or_default();
    if let Some(h) = r.head.as_mut() {
        h.parent = lvols.head_parent.clone().unwrap_or_else(|| base.clone());
        h.actual_size = lvols.head_bytes;
    }
    let mut children: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (s, (p, _)) in &lvols.snapshots {
        if let Some(p) = p {
            children.entry(p).or_default().push(s.clone());
        }
    }
    if let Some(p) = &lvols.head_parent {
        children.entry(p).or_default().push(r.name.clone());
    }
    r.snapshots = lvols
        .snapshots
        .iter()
        .map(|(s, (p, bytes))| {
            let lvol = spdkrpc::Lvol {
                name: s.clone(),
                spec_size: r.spec_size,
                actual_size: *bytes,
                parent: p.clone().unwrap_or_else(|| base.clone()),
                children: children
                    .get(s.as_str())
                    .into_iter()
                    .flatten()
                    .map(|c| (c.clone(), true))
                    .collect(),
                ..Default::default()
            };
            (s.clone(), lvol)
        })
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A linked clone's replica: its chain starts on another replica's
    /// entrypoint. The base crosses the wire as the parent of the chain's
    /// first lvol (as Longhorn reports it) and is read back as the base,
    /// not as a snapshot of the replica.
    #[test]
    fn a_linked_clones_base_crosses_the_wire_as_its_first_lvols_parent() {
        let lvols = ReplicaLvols {
            head: true,
            head_parent: Some("c1".into()),
            head_bytes: 4096,
            snapshots: [("c1".to_owned(), (None, 8192))].into(),
            base: Some("src-r-clone-ep-s1".into()),
        };
        let mut r = spdkrpc::Replica {
            name: "clone-r".into(),
            head: Some(spdkrpc::Lvol::default()),
            ..Default::default()
        };
        fill_replica(&lvols, &mut r);
        assert_eq!(r.snapshots["c1"].parent, "src-r-clone-ep-s1");
        assert_eq!(r.head.as_ref().map(|h| h.parent.as_str()), Some("c1"));
        let back = ReplicaLvols::from(&r);
        assert_eq!(back, lvols);
        assert_eq!(back.chain(), vec!["c1"], "the base is no snapshot of the replica");
        // linked and never snapshotted: the head itself sits on the base
        let bare = ReplicaLvols {
            head: true,
            base: Some("src-r-clone-ep-s1".into()),
            ..Default::default()
        };
        let mut r = spdkrpc::Replica {
            name: "clone-r".into(),
            head: Some(spdkrpc::Lvol::default()),
            ..Default::default()
        };
        fill_replica(&bare, &mut r);
        assert_eq!(ReplicaLvols::from(&r), bare);
        // a replica that is no clone has none
        let plain = ReplicaLvols {
            head: true,
            head_parent: Some("s1".into()),
            snapshots: [("s1".to_owned(), (None, 0))].into(),
            ..Default::default()
        };
        fill_replica(&plain, &mut r);
        assert_eq!(ReplicaLvols::from(&r).base, None);
    }
}
