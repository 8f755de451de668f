//! What exists in one target: [`Inventory`] (loaded once with concurrent
//! list calls), its lookups, and what talon owns there ([`Owned`], found by
//! the names of [`crate::spdk::naming`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::{ClientError, SpdkClient};
use super::naming::{self, LVS_PREFIX, LvolRole, NULL_PREFIX, RAID_PREFIX, REMOTE_PREFIX, parse_lvol};
use super::rpc::{
    Bdev, GetBdevs, GetControllers, GetLvols, GetRaids, GetSubsystems, GetTransports, Lvol, Lvstore,
    LvstoreSelector, RaidBdev, RaidCategory, Subsystem,
};
use crate::names::NQN_PREFIX;

/// Everything talon looks at in one target, loaded with concurrent calls.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// Every lvstore.
    pub lvstores: Vec<Lvstore>,
    /// Every lvol, by alias `lvs/name`.
    pub lvols: BTreeMap<String, Lvol>,
    /// Every bdev by name.
    pub bdevs: HashMap<String, Bdev>,
    /// Every raid bdev.
    pub raids: Vec<RaidBdev>,
    /// Every nvmf subsystem.
    pub subsystems: Vec<Subsystem>,
    /// Whether the TCP transport exists.
    pub tcp_transport: bool,
    /// NVMe bdev controllers by name (remote replicas are `talon-remote-*`).
    pub controllers: Vec<String>,
}

impl Inventory {
    /// Lists the target.
    pub async fn load(client: &SpdkClient) -> Result<Inventory, ClientError> {
        let (p1, p2, p3) = (
            LvstoreSelector::default(),
            GetLvols::default(),
            GetBdevs::default(),
        );
        let p4 = GetRaids {
            category: RaidCategory::All,
        };
        let (p5, p6) = (GetSubsystems::default(), GetTransports::default());
        let p7 = GetControllers::default();
        let (lvs, lvols, bdevs, raids, subs, tr, ctrlrs) = tokio::try_join!(
            client.bdev_lvol_get_lvstores(&p1),
            client.bdev_lvol_get_lvols(&p2),
            client.bdev_get_bdevs(&p3),
            client.bdev_raid_get_bdevs(&p4),
            client.nvmf_get_subsystems(&p5),
            client.nvmf_get_transports(&p6),
            client.bdev_nvme_get_controllers(&p7),
        )?;
        Ok(Inventory {
            lvstores: lvs,
            lvols: lvols.into_iter().map(|l| (l.alias.clone(), l)).collect(),
            bdevs: bdevs.into_iter().map(|b| (b.name.clone(), b)).collect(),
            raids,
            subsystems: subs,
            tcp_transport: tr.iter().any(|t| t.trtype.eq_ignore_ascii_case("tcp")),
            controllers: ctrlrs.into_iter().map(|c| c.name).collect(),
        })
    }

    /// The lvstore `talon-<disk>`.
    pub fn lvstore(&self, disk: &str) -> Option<&Lvstore> {
        let n = naming::lvstore(disk);
        self.lvstores.iter().find(|l| l.name == n)
    }

    /// The lvol `name` in any talon lvstore.
    pub fn find_lvol(&self, name: &str) -> Option<&Lvol> {
        self.lvols
            .values()
            .find(|l| l.name == name && l.lvs.name.starts_with(LVS_PREFIX))
    }

    /// The snapshot lvols of `vol`'s snapshot `snap` in talon's lvstores:
    /// (replica k, alias), by k.
    pub fn snapshot_lvols(&self, vol: &str, snap: &str) -> Vec<(usize, String)> {
        let mut out: Vec<(usize, String)> = self
            .lvols
            .values()
            .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
            .filter_map(|l| match parse_lvol(&l.name) {
                Some(LvolRole::Snapshot { volume, k, snap: s }) if volume == vol && s == snap => {
                    Some((k, l.alias.clone()))
                }
                _ => None,
            })
            .collect();
        out.sort();
        out
    }

    /// Marks the slot of member `slot` of raid `raid` empty: taken out.
    pub fn empty_slot(&mut self, raid: &str, slot: &str) {
        for b in self
            .raids
            .iter_mut()
            .filter(|r| r.name == raid)
            .flat_map(|r| r.base_bdevs_list.iter_mut())
            .filter(|b| b.name.as_deref() == Some(slot))
        {
            b.name = None;
            b.is_configured = false;
        }
    }

    /// Forgets raid bdev `raid`: deleted.
    pub fn forget_raid(&mut self, raid: &str) {
        self.raids.retain(|r| r.name != raid);
    }

    /// Forgets NVMe-oF controller `controller` and its namespace's bdev
    /// (`<controller>n1`): detached.
    pub fn forget_controller(&mut self, controller: &str) {
        self.controllers.retain(|c| c != controller);
        self.bdevs.remove(&format!("{controller}n1"));
    }

    /// The snapshot lvol `alias` is a clone of (its alias), from
    /// `bdev_get_bdevs`' `driver_specific.lvol.base_snapshot` (an lvol name
    /// in the same lvstore).
    pub fn parent_of(&self, alias: &str) -> Option<String> {
        let l = self.lvols.get(alias)?;
        let b = self.bdevs.get(&l.uuid)?;
        let parent = b.driver_specific["lvol"]["base_snapshot"].as_str()?;
        Some(format!("{}/{parent}", l.lvs.name))
    }

    /// The lvols that are clones of lvol `alias` (their parent is it).
    pub fn clones_of(&self, alias: &str) -> Vec<String> {
        self.lvols
            .keys()
            .filter(|o| self.parent_of(o).as_deref() == Some(alias))
            .cloned()
            .collect()
    }

    /// The snapshots below lvol `alias`, oldest first.
    pub fn chain(&self, alias: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = alias.to_owned();
        while let Some(p) = self.parent_of(&at) {
            if out.contains(&p) || out.len() > 4096 {
                break;
            }
            out.push(p.clone());
            at = p;
        }
        out.reverse();
        out
    }

    /// Keeps only the lvstores of `disks` (and lvstores that are not talon's):
    /// replicas are placed on configured disks only.
    pub fn retain_disks(&mut self, disks: &std::collections::BTreeSet<String>) {
        self.lvstores
            .retain(|l| l.name.strip_prefix(LVS_PREFIX).is_none_or(|d| disks.contains(d)));
    }

    /// Bdev `name` as SPDK takes it in a call: by its name (an lvol's is its
    /// UUID), an lvol's alias, or another of its aliases.
    pub fn bdev_named(&self, name: &str) -> Option<&Bdev> {
        self.lvols
            .get(name)
            .and_then(|l| self.bdevs.get(&l.uuid))
            .or_else(|| self.bdevs.get(name))
            .or_else(|| self.bdevs.values().find(|b| b.aliases.iter().any(|a| a == name)))
    }

    /// The size of a bdev.
    pub fn bdev_size(&self, name: &str) -> Option<u64> {
        self.bdevs.get(name).map(Bdev::size_bytes)
    }

    /// The subsystem of `nqn`.
    pub fn subsystem(&self, nqn: &str) -> Option<&Subsystem> {
        self.subsystems.iter().find(|s| s.nqn == nqn)
    }

    /// The raid `name`.
    pub fn raid(&self, name: &str) -> Option<&RaidBdev> {
        self.raids.iter().find(|r| r.name == name)
    }

    /// Disk names with a talon lvstore, with free bytes. An lvstore whose
    /// figures make no sense is left out (no replica is placed on it; the
    /// disk controller reports it failed, saying why).
    pub fn disks(&self) -> Vec<(String, u64)> {
        self.lvstores
            .iter()
            .filter_map(|l| {
                let d = l.name.strip_prefix(LVS_PREFIX)?;
                Some((d.to_owned(), l.bytes().ok()?.free))
            })
            .collect()
    }

    /// The bytes lvol `alias` (`lvs/name`) holds of its own: its allocated
    /// clusters times its lvstore's cluster size (`None`: the lvol or its
    /// lvstore is not listed).
    pub fn held_bytes(&self, alias: &str) -> Option<u64> {
        let l = self.lvols.get(alias)?;
        let cluster = self.lvstores.iter().find(|s| s.name == l.lvs.name)?.cluster_size;
        Some(l.num_allocated_clusters.saturating_mul(cluster))
    }

    /// The bytes the thin lvols (heads and clones, not snapshots) in `disk`'s lvstore promise,
    /// added up; `None` when a figure makes no sense (past 2^64 bytes).
    pub fn committed(&self, disk: &str) -> Option<u64> {
        let lvs = naming::lvstore(disk);
        self.lvols
            .values()
            .filter(|l| l.lvs.name == lvs && !l.is_snapshot)
            .try_fold(0u64, |sum, l| {
                let size = self
                    .bdevs
                    .get(&l.uuid)
                    .map_or(Some(0), |b| b.num_blocks.checked_mul(u64::from(b.block_size)))?;
                sum.checked_add(size)
            })
    }

    /// Every talon object of a volume that is not wanted (`keep_volume`
    /// false) that holds no data (exports, raids, placeholders, remote
    /// attachments), and a snapshot lvol of a wanted volume that is not
    /// (`keep_snapshot(vol, snap)` false). Lvols of a volume not wanted are
    /// never listed: a volume talon deletes goes with its lvols
    /// (`VolumeOps::delete`), so the lvols of one it does not know are data it
    /// lost track of (a lost state store) and are reported, kept
    /// (`engine.SpdkOrphanController`). Foreign objects are never listed.
    pub fn orphans(
        &self,
        keep_volume: impl Fn(&str) -> bool,
        keep_snapshot: impl Fn(&str, &str) -> bool,
        keep_remote: impl Fn(&str, usize) -> bool,
    ) -> Vec<Owned> {
        let mut out = Vec::new();
        let vol_prefix = format!("{NQN_PREFIX}:vol:");
        let rep_prefix = format!("{NQN_PREFIX}:replica:");
        for s in &self.subsystems {
            let vol = s
                .nqn
                .strip_prefix(&vol_prefix)
                .or_else(|| s.nqn.strip_prefix(&rep_prefix).and_then(|r| r.split(':').next()));
            if let Some(v) = vol
                && !keep_volume(v)
            {
                out.push(Owned::Subsystem(s.nqn.clone()));
            }
        }
        for r in &self.raids {
            if let Some(v) = r.name.strip_prefix(RAID_PREFIX)
                && !keep_volume(v)
            {
                out.push(Owned::Raid(r.name.clone()));
            }
        }
        for c in &self.controllers {
            if let Some(LvolRole::Replica { volume, k }) = c.strip_prefix(REMOTE_PREFIX).and_then(parse_lvol)
                && !keep_remote(&volume, k)
            {
                out.push(Owned::Remote(c.clone()));
            }
        }
        for b in self.bdevs.values() {
            if let Some(v) = b.name.strip_prefix(NULL_PREFIX)
                && !keep_volume(v)
            {
                out.push(Owned::Null(b.name.clone()));
            }
        }
        // snapshots of wanted volumes that no Snapshot accounts for, last
        for l in self.lvols.values() {
            if !l.lvs.name.starts_with(LVS_PREFIX) {
                continue;
            }
            // a rebuild snapshot lives with its volume (the rebuild deletes it)
            if let Some(LvolRole::Snapshot { volume, snap, .. }) = parse_lvol(&l.name)
                && keep_volume(&volume)
                && !keep_snapshot(&volume, &snap)
                && !super::naming::is_rebuild_snap(&snap)
            {
                out.push(Owned::Lvol(l.alias.clone()));
            }
        }
        out
    }
}

/// An SPDK object talon owns (by name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    /// An nvmf subsystem.
    Subsystem(String),
    /// A raid bdev.
    Raid(String),
    /// A null placeholder bdev.
    Null(String),
    /// An lvol by alias.
    Lvol(String),
    /// An NVMe controller attaching a remote replica.
    Remote(String),
}

/// One listing of a target shared by the clients of one change count
/// ([`SpdkClient::changes`]): the Longhorn services answer the manager's
/// polls from it, and `engine.LonghornController` publishes the listing each
/// of its passes makes. Each listing holds every object of the target, so a
/// reader that takes the last one while it is young enough and nothing went
/// through those clients since saves a listing of every engine's objects.
#[derive(Debug, Clone, Default)]
pub struct SharedListing(Arc<tokio::sync::Mutex<Option<Listed>>>);

#[derive(Debug)]
struct Listed {
    /// When the listing began (a change the target made on its own is seen
    /// within `age` of it).
    at: Instant,
    /// The change count it was made under ([`SpdkClient::count_id`]), and
    /// its value when it began.
    count: usize,
    changes: u64,
    inventory: Arc<Inventory>,
}

impl SharedListing {
    /// The last listing if it began less than `age` ago and `client`'s
    /// change count has not moved since, else a new one, kept for the
    /// next reader. The lock is held across the listing on purpose:
    /// concurrent readers wait for the one being made instead of making
    /// their own.
    pub async fn within(&self, client: &SpdkClient, age: Duration) -> Result<Arc<Inventory>, ClientError> {
        let mut last = self.0.lock().await;
        if let Some(l) = last.as_ref()
            && l.at.elapsed() < age
            && l.count == client.count_id()
            && l.changes == client.changes()
        {
            return Ok(Arc::clone(&l.inventory));
        }
        Self::list(&mut last, client).await
    }

    /// A new listing, kept for the readers after.
    pub async fn fresh(&self, client: &SpdkClient) -> Result<Arc<Inventory>, ClientError> {
        Self::list(&mut *self.0.lock().await, client).await
    }

    async fn list(last: &mut Option<Listed>, client: &SpdkClient) -> Result<Arc<Inventory>, ClientError> {
        // counted before the listing: a change that ends while it is made
        // makes the next reader list again
        let (at, changes) = (Instant::now(), client.changes());
        let inventory = Arc::new(Inventory::load(client).await?);
        *last = Some(Listed {
            at,
            count: client.count_id(),
            changes,
            inventory: Arc::clone(&inventory),
        });
        Ok(inventory)
    }
}

/// The replica heads `(k, lvol)` of a volume.
pub fn replica_heads<'a>(inv: &'a Inventory, vol: &str) -> Vec<(usize, &'a Lvol)> {
    let mut v: Vec<(usize, &Lvol)> = inv
        .lvols
        .values()
        .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
        .filter_map(|l| match parse_lvol(&l.name) {
            Some(LvolRole::Replica { volume, k }) if volume == vol => Some((k, l)),
            _ => None,
        })
        .collect();
    v.sort_by_key(|(k, _)| *k);
    v
}

/// The highest revert generation recorded for a volume.
pub fn applied_revert(inv: &Inventory, vol: &str) -> u64 {
    inv.lvols
        .values()
        .filter(|l| l.lvs.name.starts_with(LVS_PREFIX))
        .filter_map(|l| match parse_lvol(&l.name) {
            Some(LvolRole::RevertMarker { volume, generation }) if volume == vol => Some(generation),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Hand-built inventories for unit tests (no double, no SPDK).
#[cfg(test)]
pub mod testing {
    use super::Inventory;
    use crate::spdk::rpc::{Bdev, Lvol, LvolStoreRef};

    /// What [`add_lvol`] makes.
    #[derive(Debug, Clone, Default)]
    pub struct TestLvol<'a> {
        /// Its lvstore's name.
        pub lvs: &'a str,
        pub name: &'a str,
        pub bytes: u64,
        pub clusters: u64,
        pub snapshot: bool,
        /// The snapshot it is a clone of (a name in the same lvstore).
        pub parent: Option<&'a str>,
    }

    /// Adds lvol `l` (uuid `uuid-<name>`, alias `<lvs>/<name>`, thin, 4 KiB
    /// blocks) and its bdev to `i`.
    pub fn add_lvol(i: &mut Inventory, l: TestLvol<'_>) {
        let (uuid, alias) = (format!("uuid-{}", l.name), format!("{}/{}", l.lvs, l.name));
        i.lvols.insert(
            alias.clone(),
            Lvol {
                alias: alias.clone(),
                uuid: uuid.clone(),
                name: l.name.into(),
                is_thin_provisioned: true,
                is_snapshot: l.snapshot,
                is_clone: l.parent.is_some(),
                is_esnap_clone: false,
                num_allocated_clusters: l.clusters,
                lvs: LvolStoreRef {
                    name: l.lvs.into(),
                    uuid: format!("u-{}", l.lvs),
                },
            },
        );
        i.bdevs.insert(
            uuid.clone(),
            Bdev {
                name: uuid,
                aliases: vec![alias],
                product_name: "Logical Volume".into(),
                block_size: 4096,
                num_blocks: l.bytes / 4096,
                uuid: None,
                claimed: false,
                claim_type: None,
                assigned_rate_limits: None,
                driver_specific: match l.parent {
                    Some(p) => serde_json::json!({"lvol": {"base_snapshot": p}}),
                    None => serde_json::Value::Null,
                },
                md_size: 0,
                md_interleave: false,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::SharedListing;
    use crate::spdk::double::SpdkDouble;
    use crate::spdk::{RunId, SpdkClient};

    /// Readers of one change count take the last listing while it is young
    /// and nothing changed through any of their clients; a change through
    /// one, a listing too old, or a reader of another count lists again.
    #[tokio::test]
    async fn a_shared_listing_serves_until_a_change_through_any_client_of_its_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        let double = SpdkDouble::start(dir.path().join("spdk.sock"))
            .await
            .expect("double");
        let (run, count) = (RunId::new(), Arc::new(AtomicU64::new(0)));
        let controller = SpdkClient::of_run(double.socket(), &run, Some(&count));
        let polls = SpdkClient::of_run(double.socket(), &run, Some(&count));
        let listing = SharedListing::default();
        let age = Duration::from_secs(60);
        let listed = || double.calls("bdev_get_bdevs");

        let first = listing.fresh(&controller).await.expect("pass");
        assert_eq!(listed(), 1);
        // a connection opened is a change (a new connection may be a new
        // target): the polls' client connecting makes them list again
        polls.connect().await.expect("connect");
        let second = listing.within(&polls, age).await.expect("poll");
        assert_eq!(listed(), 2, "the polls' connect moved the count");
        let third = listing.within(&polls, age).await.expect("poll");
        assert!(Arc::ptr_eq(&second, &third), "nothing changed: the same listing");
        assert_eq!(listed(), 2);
        assert!(first.bdevs.is_empty());

        // a change through the controller's client: the polls list again and see it
        controller
            .call::<Value, Value>(
                "bdev_null_create",
                Some(&json!({"name": "n0", "num_blocks": 8, "block_size": 512})),
            )
            .await
            .expect("bdev_null_create");
        let after = listing.within(&polls, age).await.expect("poll");
        assert_eq!(listed(), 3);
        assert!(after.bdevs.contains_key("n0"), "the change is in the listing");
        // the controller's pass always lists, and publishes it
        let pass = listing.fresh(&controller).await.expect("pass");
        assert_eq!(listed(), 4);
        let poll = listing.within(&polls, age).await.expect("poll");
        assert!(Arc::ptr_eq(&pass, &poll), "the polls take the pass's listing");
        // too old
        listing.within(&polls, Duration::ZERO).await.expect("poll");
        assert_eq!(listed(), 5);
        // a listing made through a client of another count is not taken: its
        // count says nothing of the other's changes
        let alone = SpdkClient::of_run(double.socket(), &run, None);
        alone.connect().await.expect("connect");
        listing.within(&alone, age).await.expect("alone");
        listing.within(&alone, age).await.expect("alone");
        assert_eq!(listed(), 6);
        listing.within(&polls, age).await.expect("poll");
        assert_eq!(listed(), 7);
    }
}
