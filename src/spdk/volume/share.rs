//! A local member of an engine's raid1 moved between its two paths at one
//! closed instant of the engine's export, with no rebuild: the lvol itself (the steady state, no
//! NVMe/TCP hop), or the replica's own export attached back over loopback
//! (so that another node's engine can attach that export too: an lvol a
//! raid1 claims cannot be exported, v26.05 refuses the namespace).
//!
//! ```text
//!   close    its listeners go (their connections drop: a host holds its I/O
//!            and connects again; with the namespace gone while connected it
//!            would drop the disk), then its namespace, which SPDK removes
//!            paused: every I/O the raid took has completed
//!   raid     deleted (no superblock: the members keep the data where it was)
//!   path     Export: the lvol exported as its replica NQN, attached over loopback
//!            Direct: the loopback detached, the replica's export removed
//!   raid     made again over the same slots, the member by its new path: all
//!            members in sync, nothing to rebuild
//!   open     namespace and listeners again (same NQN, namespace UUID, hosts),
//!            the listeners in the state the export serves in
//! ```
//!
//! No ANA freeze (listeners `inaccessible`) comes first: a host that saw
//! its path inaccessible and then lost the connection comes back on a new
//! controller with no ANA change to be told of. SPDK's initiator kept the
//! path inaccessible for its ANA transition time (10 s) and then failed
//! every I/O it held (talon issue 53: the move back after a relocation).
//!
//! Whatever fails after the raid is deleted, the raid is made again over
//! every member: by the path the member had, else by the other; never over
//! fewer members, so nothing is rebuilt and no member is lost.

use std::time::{Duration, Instant};

use super::{
    EngineNames, EnginePlan, Export, ExportSpec, Inventory, RemoteAttach, VolumeError, VolumeOps, rpc,
};
use crate::spdk::rpc::{RaidBdev, RaidDelete};

/// How a local replica is a member of its engine's raid1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberPath {
    /// The lvol itself.
    Direct,
    /// Its replica export, attached over loopback.
    Export,
}

impl MemberPath {
    /// The other path.
    pub fn other(self) -> Self {
        match self {
            Self::Direct => Self::Export,
            Self::Export => Self::Direct,
        }
    }

    /// In log lines and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "its lvol",
            Self::Export => "its export",
        }
    }
}

/// One local member of one engine, and both its paths.
#[derive(Debug, Clone)]
pub struct MemberSwap<'a> {
    /// The engine (errors name it).
    pub of: &'a str,
    /// The replica.
    pub replica: &'a str,
    /// The engine's raid and export names.
    pub names: &'a EngineNames,
    /// The engine's export (opened again).
    pub spec: &'a ExportSpec,
    /// The raid as listed.
    pub raid: &'a RaidBdev,
    /// The replica's lvol (alias).
    pub lvol: &'a str,
    /// Its UUID (the raid lists it by it).
    pub lvol_uuid: &'a str,
    /// The replica's export.
    pub export: Export<'a>,
    /// Its loopback attach (controller named for the replica).
    pub attach: RemoteAttach<'a>,
}

impl MemberSwap<'_> {
    fn nvme_bdev(&self) -> String {
        format!("{}n1", self.attach.controller)
    }

    /// Whether slot member `name` is this replica (by either path).
    fn is_member(&self, name: &str) -> bool {
        name == self.lvol || name == self.lvol_uuid || name == self.nvme_bdev()
    }

    /// The raid's slots with this replica's member as `bdev`.
    fn slots_with(&self, bdev: &str) -> Vec<Option<String>> {
        self.raid
            .base_bdevs_list
            .iter()
            .map(|b| {
                b.name.as_deref().map(|n| {
                    if self.is_member(n) {
                        bdev.to_owned()
                    } else {
                        n.to_owned()
                    }
                })
            })
            .collect()
    }

    fn refused(&self, to: MemberPath, reason: impl Into<String>) -> VolumeError {
        VolumeError::MemberSwap {
            engine: self.of.to_owned(),
            replica: self.replica.to_owned(),
            to: to.as_str(),
            reason: reason.into(),
        }
    }

    /// Why the raid cannot be made again over the same members now, if so:
    /// it must be online, every slot in service (a rebuild running or a
    /// member missing would be lost), without a superblock (its members'
    /// data offsets would have to be checked again), with this member in it.
    pub fn not_now(&self) -> Option<String> {
        let r = self.raid;
        if r.state != "online" {
            return Some(format!("raid {} is {}", r.name, r.state));
        }
        if r.process.is_some() {
            return Some(format!("raid {} is rebuilding", r.name));
        }
        if r.num_base_bdevs_discovered != r.num_base_bdevs
            || r.base_bdevs_list
                .iter()
                .any(|b| !b.is_configured || b.name.is_none())
        {
            return Some(format!("raid {} has a slot out of service", r.name));
        }
        if r.superblock {
            return Some(format!("raid {} has a superblock", r.name));
        }
        let listed = r
            .base_bdevs_list
            .iter()
            .filter(|b| b.name.as_deref().is_some_and(|n| self.is_member(n)))
            .count();
        if listed != 1 {
            return Some(format!(
                "replica {} is not one member of raid {}",
                self.replica, r.name
            ));
        }
        None
    }
}

impl VolumeOps {
    /// Moves `s`'s member to path `to` at one closed instant of the engine's
    /// export (see the module). Returns how long the export was closed. On
    /// an error the raid serves again over every member (the path it had,
    /// else the other: logged, naming the engine and the replica), or, if
    /// even that failed, the next reconcile makes it over them.
    pub async fn swap_member(
        &self,
        inv: &Inventory,
        s: &MemberSwap<'_>,
        to: MemberPath,
    ) -> Result<Duration, VolumeError> {
        if let Some(why) = s.not_now() {
            return Err(s.refused(to, why));
        }
        let nqn = s.names.nqn.as_str();
        if inv.subsystem(nqn).is_none() {
            return Err(s.refused(to, format!("the engine is not exported as {nqn}")));
        }
        let started = Instant::now();
        // no ANA freeze first: a host that saw its path `inaccessible` and
        // then lost the connection (the listeners go) comes back on a new
        // controller after the export is open again, with no ANA change to
        // be told of; SPDK's initiator kept the path inaccessible until its
        // ANA transition time (10 s) and then failed every I/O it held (a
        // reader that ignores failures read stale buffers: issue 53's move
        // back). Closing alone stops and drains the I/O: the listeners go
        // first (their connections drop, the hosts hold their I/O and
        // connect again), then the namespace, which SPDK removes with it
        // paused (every I/O the raid took completed) before the raid goes.
        let r = self.swap_frozen(inv, s, to).await;
        // the listeners made again in the state the export serves in
        let thawed = self.freezes().thaw_leftover(&self.client, nqn).await;
        let took = started.elapsed();
        r?;
        thawed.map_err(rpc(s.of, format!("setting the listeners of {nqn} back")))?;
        Ok(took)
    }

    async fn swap_frozen(
        &self,
        inv: &Inventory,
        s: &MemberSwap<'_>,
        to: MemberPath,
    ) -> Result<(), VolumeError> {
        let nqn = s.names.nqn.as_str();
        let reopen = |e: VolumeError| async move {
            let mut made = Vec::new();
            let opened = match Inventory::load(&self.client).await {
                Ok(now) => {
                    self.export_in(&now, s.of, &s.names.export(&s.names.raid, s.spec), &mut made)
                        .await
                }
                Err(x) => Err(rpc(s.of, "listing the target")(x)),
            };
            if let Err(x) = opened {
                tracing::error!(engine = s.of, replica = s.replica, error = %crate::util::error_chain(&x),
                    "sharing a member: the engine's export could not be opened again; the next reconcile does");
            }
            e
        };
        if let Err(e) = self.close_export(inv, s.of, nqn).await {
            return Err(reopen(e).await);
        }
        if let Err(e) = self
            .client
            .bdev_raid_delete(&RaidDelete {
                name: s.raid.name.clone(),
                clear_sb: None,
            })
            .await
        {
            let e = rpc(
                s.of,
                format!("deleting raid {} to move {}'s member", s.raid.name, s.replica),
            )(e);
            return Err(reopen(e).await);
        }
        // the listing as it is now: no raid, the export without namespace
        // and listeners
        let mut now = inv.clone();
        now.forget_raid(&s.raid.name);
        for sub in now.subsystems.iter_mut().filter(|x| x.nqn == nqn) {
            sub.namespaces.clear();
            sub.listen_addresses.clear();
        }
        let Err(e) = self.remake(&mut now, s, to).await else {
            return Ok(());
        };
        tracing::error!(engine = s.of, replica = s.replica, to = to.as_str(), error = %crate::util::error_chain(&e),
            "moving a member of the engine failed; the raid is made again over every member");
        for back in [to.other(), to] {
            now = match Inventory::load(&self.client).await {
                Ok(i) => i,
                Err(x) => {
                    tracing::error!(engine = s.of, replica = s.replica, error = %x,
                        "listing the target to make the raid again");
                    continue;
                }
            };
            match self.remake(&mut now, s, back).await {
                Ok(()) => {
                    tracing::warn!(
                        engine = s.of,
                        replica = s.replica,
                        path = back.as_str(),
                        "the raid serves again over every member"
                    );
                    return Err(e);
                }
                Err(x) => tracing::error!(engine = s.of, replica = s.replica, path = back.as_str(),
                    error = %crate::util::error_chain(&x), "making the raid again failed"),
            }
        }
        tracing::error!(
            engine = s.of,
            replica = s.replica,
            "the raid could not be made again now; the next reconcile makes it over its members"
        );
        Err(e)
    }

    /// The member by `path` and the raid over the slots with it, unless
    /// the raid is there (made by a part that failed after: its members are
    /// left as they are, a path taken from under it would fail a member);
    /// the engine's export opened. `now` is kept as it changes.
    async fn remake(
        &self,
        now: &mut Inventory,
        s: &MemberSwap<'_>,
        path: MemberPath,
    ) -> Result<(), VolumeError> {
        if now.raid(&s.names.raid).is_none() {
            self.member_raid(now, s, path).await?;
        }
        let mut made = Vec::new();
        self.export_in(now, s.of, &s.names.export(&s.names.raid, s.spec), &mut made)
            .await
    }

    /// The member by `path`, the raid made over the slots with it.
    async fn member_raid(
        &self,
        now: &mut Inventory,
        s: &MemberSwap<'_>,
        path: MemberPath,
    ) -> Result<(), VolumeError> {
        let enqn = s.export.nqn.as_str();
        let bdev = match path {
            MemberPath::Direct => {
                // the loopback goes, then the export, whose namespace claims the lvol
                if now.controllers.iter().any(|c| c == s.attach.controller) {
                    super::lvol::detach_controller(&self.client, s.attach.controller)
                        .await
                        .map_err(rpc(s.of, format!("detaching {}", s.attach.controller)))?;
                    now.forget_controller(s.attach.controller);
                }
                if now.subsystem(enqn).is_some() {
                    self.unexport(s.of, enqn).await?;
                    now.subsystems.retain(|x| x.nqn != enqn);
                }
                s.lvol_uuid.to_owned()
            }
            MemberPath::Export => {
                self.export(now, s.of, &s.export).await?;
                now.tcp_transport = true;
                let b = self.remote_member(now, s.of, &s.attach).await?;
                now.controllers.push(s.attach.controller.to_owned());
                b
            }
        };
        let plan = EnginePlan {
            volume: s.of,
            names: s.names,
            slots: s.slots_with(&bdev),
            bare: false,
            geometry: None,
            superblock: None,
            spec: s.spec,
        };
        let mut made = Vec::new();
        if let Err(e) = self.engine_raid(now, &plan, &mut made).await {
            self.undo(made).await;
            return Err(e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{Nqn, ObjectName};

    fn raid(members: &[(&str, bool)]) -> RaidBdev {
        let list: Vec<serde_json::Value> = members
            .iter()
            .map(|(n, ok)| serde_json::json!({"name": n, "is_configured": ok}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "name": "vol-e-0", "state": "online", "raid_level": "raid1",
            "num_base_bdevs": members.len(), "num_base_bdevs_discovered": members.len(),
            "num_base_bdevs_operational": members.len(), "base_bdevs_list": list
        }))
        .expect("a raid listing")
    }

    /// The raid is made again only when every slot serves and nothing runs
    /// in it; the member is swapped in its own slot, the others kept.
    #[test]
    fn a_member_moves_only_in_a_whole_raid_and_keeps_its_slot() {
        let vol = ObjectName::parse("volume", "vol").expect("name");
        let names = EngineNames::volume(&vol);
        let spec = ExportSpec::plain([127, 0, 0, 1].into(), 20000, Vec::new());
        let nqn = Nqn::parse("nqn.2023-01.io.longhorn.spdk:vol-r-a").expect("nqn");
        let at: std::net::SocketAddr = "127.0.0.1:20001".parse().expect("address");
        let r = raid(&[("uuid-a", true), ("vol-r-bn1", true)]);
        let s = MemberSwap {
            of: "vol-e-0",
            replica: "vol-r-a",
            names: &names,
            spec: &spec,
            raid: &r,
            lvol: "talon-d/vol-r-a",
            lvol_uuid: "uuid-a",
            export: names.export("talon-d/vol-r-a", &spec),
            attach: RemoteAttach::longhorn("vol-r-a", at, nqn.as_str()),
        };
        assert_eq!(s.not_now(), None);
        assert_eq!(
            s.slots_with("vol-r-an1"),
            vec![Some("vol-r-an1".to_owned()), Some("vol-r-bn1".to_owned())]
        );
        let degraded = raid(&[("uuid-a", true), ("vol-r-bn1", false)]);
        let s2 = MemberSwap {
            raid: &degraded,
            ..s.clone()
        };
        assert!(s2.not_now().is_some_and(|w| w.contains("out of service")));
        let mut rebuilding = r.clone();
        rebuilding.process = serde_json::from_value(serde_json::json!({
            "type": "rebuild", "target": "vol-r-bn1",
            "progress": {"blocks": 1, "percent": 1}
        }))
        .expect("a rebuild");
        let s3 = MemberSwap {
            raid: &rebuilding,
            ..s.clone()
        };
        assert!(s3.not_now().is_some_and(|w| w.contains("rebuilding")));
        let other = raid(&[("uuid-x", true), ("vol-r-bn1", true)]);
        let s4 = MemberSwap { raid: &other, ..s };
        assert!(s4.not_now().is_some_and(|w| w.contains("not one member")));
    }
}
