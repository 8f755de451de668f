//! [`ReplicaLvols`] in Longhorn's messages: read from another node's
//! `ReplicaGet` answer, written into this node's.

use std::collections::BTreeMap;

use crate::proto::spdkrpc;
use crate::spdk::volume::ReplicaLvols;

/// From another node's `ReplicaGet` answer.
impl From<&spdkrpc::Replica> for ReplicaLvols {
    fn from(r: &spdkrpc::Replica) -> Self {
        let parent = |p: &str| (!p.is_empty()).then(|| p.to_owned());
        Self {
            head: r.head.is_some(),
            head_parent: r.head.as_ref().and_then(|h| parent(&h.parent)),
            head_bytes: r.head.as_ref().map_or(0, |h| h.actual_size),
            snapshots: r
                .snapshots
                .iter()
                .map(|(n, l)| (n.clone(), (parent(&l.parent), l.actual_size)))
                .collect(),
        }
    }
}

/// Replica message `r`'s head and snapshots as `ReplicaGet` reports `lvols`.
pub fn fill_replica(lvols: &ReplicaLvols, r: &mut spdkrpc::Replica) {
    if let Some(h) = r.head.as_mut() {
        h.parent = lvols.head_parent.clone().unwrap_or_default();
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
                parent: p.clone().unwrap_or_default(),
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
