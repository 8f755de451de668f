//! The double's raid bdevs, with the superblock and its examine as SPDK's raid module keeps them.

use super::*;

impl State {
    /// The raid methods (`call` routes them here by name).
    pub(super) fn call_raid(&mut self, method: &str, params: &Option<Value>) -> RpcResult {
        match method {
            "bdev_raid_create" => {
                if let Some(level) = params.as_ref().and_then(|p| p.get("raid_level"))
                    && serde_json::from_value::<RaidLevel>(level.clone()).is_err()
                {
                    return fail(-32700, "spdk_json_decode_object failed");
                }
                let p: RaidCreate = decode(params)?;
                let failed = |m: &str| format!("Failed to create RAID bdev {}: {m}", p.name);
                if self.name_taken(&p.name) || self.raids.iter().any(|r| r.name == p.name) {
                    return fail(-17, failed("File exists"));
                }
                if p.raid_level == RaidLevel::Raid1 && p.base_bdevs.len() < 2 {
                    return fail(-22, "At least 2 base devices required for raid1");
                }
                if p.base_bdevs.is_empty() {
                    return fail(-22, failed("Invalid argument"));
                }
                let mut idx = Vec::new();
                let uuid = p.uuid.clone().unwrap_or_else(new_uuid);
                for m in &p.base_bdevs {
                    let i = self.find(m).ok_or((-19, failed("No such device")))?;
                    if self.bdevs[i].claimed_by.is_some() {
                        return fail(-1, failed("Operation not permitted"));
                    }
                    // "Superblock of a different raid bdev found on bdev ..."
                    // (with or without `superblock`)
                    if self.visible_sb(i).is_some_and(|sb| sb.uuid != uuid) {
                        return fail(-17, failed("File exists"));
                    }
                    idx.push(i);
                }
                let superblock = p.superblock.unwrap_or(false);
                let offsets: Vec<u64> = idx
                    .iter()
                    .map(|&i| if superblock { self.sb_data_offset(i) } else { 0 })
                    .collect();
                let bs = self.bdevs[idx[0]].block_size;
                let min = idx
                    .iter()
                    .zip(&offsets)
                    .map(|(&i, off)| self.bdevs[i].num_blocks.saturating_sub(*off))
                    .min()
                    .unwrap_or(0);
                let sum: u64 = idx.iter().map(|&i| self.bdevs[i].num_blocks).sum();
                let num_blocks = if p.raid_level == RaidLevel::Raid1 {
                    min
                } else {
                    sum
                };
                let mut slots = Vec::new();
                for &i in &idx {
                    self.bdevs[i].claimed_by = Some(format!("raid {}", p.name));
                    slots.push(Some(self.bdevs[i].name.clone()));
                }
                let sb = superblock.then(|| Superblock {
                    uuid: uuid.clone(),
                    name: p.name.clone(),
                    seq: 1,
                    slots: idx
                        .iter()
                        .map(|&i| (Some(self.bdevs[i].uuid.clone()), true))
                        .collect(),
                });
                self.raids.push(Raid {
                    name: p.name.clone(),
                    level: p.raid_level,
                    strip_size_kb: p.strip_size_kb.unwrap_or(0),
                    slots,
                    rebuild: None,
                    sb,
                    configuring: false,
                    offsets,
                });
                let ri = self.raids.len() - 1;
                self.write_sb(ri);
                self.bdevs.push(Bdev {
                    name: p.name,
                    aliases: vec![uuid.clone()],
                    uuid,
                    block_size: bs,
                    num_blocks,
                    claimed_by: None,
                    kind: BdevKind::Raid,
                });
                Ok(json!(true))
            }
            "bdev_raid_delete" => {
                let p: crate::spdk::rpc::RaidDelete = decode(params)?;
                let Some(ri) = self.raids.iter().position(|r| r.name == p.name) else {
                    return e(ENODEV);
                };
                let raid = self.raids.remove(ri);
                for m in raid.slots.iter().flatten() {
                    if let Some(i) = self.find(m) {
                        self.bdevs[i].claimed_by = None;
                        // zeros written over it: a parent's superblock stays hidden
                        if p.clear_sb == Some(true) && raid.sb.is_some() {
                            self.set_lvol_info(i, |l| {
                                l.sb = None;
                                l.sb_cleared = true;
                            });
                        }
                    }
                }
                if let Some(i) = self.find(&p.name) {
                    self.remove_bdev(i);
                }
                Ok(json!(true))
            }
            "bdev_raid_get_bdevs" => {
                let p: GetRaids = decode(params)?;
                let all: Vec<Value> = self.raids.iter().map(|r| self.raid_json(&r.name)).collect();
                Ok(Value::Array(
                    all.into_iter()
                        .filter(|r| match p.category {
                            RaidCategory::All => true,
                            RaidCategory::Online => r["state"] == "online",
                            RaidCategory::Offline => r["state"] == "offline",
                            RaidCategory::Configuring => r["state"] == "configuring",
                        })
                        .collect(),
                ))
            }
            "bdev_raid_add_base_bdev" => {
                let p: RaidAddBaseBdev = decode(params)?;
                let ri = self
                    .raids
                    .iter()
                    .position(|r| r.name == p.raid_bdev)
                    .ok_or((ENODEV.0, ENODEV.1.into()))?;
                let bi = self.find(&p.base_bdev).ok_or((ENODEV.0, ENODEV.1.into()))?;
                if self.bdevs[bi].claimed_by.is_some() || self.raids[ri].rebuilding().is_some() {
                    return fail(-1, "Operation not permitted");
                }
                let raid_uuid = self.raids[ri].sb.as_ref().map(|sb| sb.uuid.clone());
                if self
                    .visible_sb(bi)
                    .is_some_and(|sb| Some(&sb.uuid) != raid_uuid.as_ref())
                {
                    return fail(-17, "File exists");
                }
                // a member that left takes its old slot back (its UUID is in the superblock)
                let uuid = self.bdevs[bi].uuid.clone();
                let own = self.raids[ri].sb.as_ref().and_then(|sb| {
                    sb.slots
                        .iter()
                        .position(|s| s.0.as_deref() == Some(uuid.as_str()))
                });
                let free = |r: &Raid| r.slots.iter().position(Option::is_none);
                let Some(slot) = own
                    .filter(|k| self.raids[ri].slots[*k].is_none())
                    .or_else(|| free(&self.raids[ri]))
                else {
                    return fail(-22, "Invalid argument");
                };
                let online = self.raids[ri].slots.iter().any(Option::is_some);
                self.raids[ri].slots[slot] = Some(self.bdevs[bi].name.clone());
                if self.raids[ri].sb.is_some() {
                    self.raids[ri].offsets[slot] = self.sb_data_offset(bi);
                }
                self.bdevs[bi].claimed_by = Some(format!("raid {}", p.raid_bdev));
                if online {
                    // SPDK names the member in the superblock when the rebuild finishes
                    let now = Instant::now();
                    self.raids[ri].rebuild = Some((p.base_bdev.clone(), now, now + self.rebuild_time));
                    if let Some(sb) = self.raids[ri].sb.as_mut()
                        && let Some(e) = sb.slots.get_mut(slot)
                    {
                        *e = (Some(uuid), false);
                    }
                    self.settle_rebuilds();
                }
                Ok(json!(true))
            }
            "bdev_raid_remove_base_bdev" => {
                let p: ByName = decode(params)?;
                let bi = self.find(&p.name).ok_or((ENODEV.0, ENODEV.1.into()))?;
                if self.take_out(bi) {
                    Ok(json!(true))
                } else {
                    e(ENODEV)
                }
            }
            _ => fail(-32601, "Method not found"),
        }
    }
}

/// Raid superblocks and examine, and the raid listing.
impl State {
    /// The superblock bdev `i` shows at its start: its own, else (a thin
    /// lvol reads unallocated clusters from its parent) its parent's.
    pub(super) fn visible_sb(&self, i: usize) -> Option<Superblock> {
        let mut i = i;
        for _ in 0..64 {
            let BdevKind::Lvol(l) = &self.bdevs[i].kind else {
                return None;
            };
            if let Some(sb) = &l.sb {
                return Some(sb.clone());
            }
            if l.sb_cleared {
                return None;
            }
            i = self.find(l.parent.as_deref()?)?;
        }
        None
    }

    /// Where a raid puts its data on member `i` when it has a superblock:
    /// 1 MiB rounded up to the member's optimal I/O boundary (an lvol's
    /// cluster), as `raid_bdev_configure_base_bdev` does.
    pub(super) fn sb_data_offset(&self, i: usize) -> u64 {
        let bs = u64::from(self.bdevs[i].block_size.max(1));
        let min = (1u64 << 20) / bs;
        let boundary = match &self.bdevs[i].kind {
            BdevKind::Lvol(l) => self
                .lvstores
                .iter()
                .find(|s| s.uuid == l.lvs_uuid)
                .map_or(0, |s| s.cluster_size / bs),
            _ => 0,
        };
        if boundary == 0 {
            min
        } else {
            min.div_ceil(boundary) * boundary
        }
    }

    /// Writes raid `ri`'s superblock on its active members (the lvols).
    pub(super) fn write_sb(&mut self, ri: usize) {
        let Some(sb) = self.raids[ri].sb.clone() else {
            return;
        };
        let members: Vec<String> = self.raids[ri].slots.iter().flatten().cloned().collect();
        for m in members {
            if let Some(i) = self.find(&m) {
                self.set_lvol_info(i, |l| {
                    l.sb = Some(sb.clone());
                    l.sb_cleared = false;
                });
            }
        }
    }

    /// Raid `ri` lost the member with `uuid`: its superblock says so (seq+1)
    /// on the members left.
    pub(super) fn sb_member_left(&mut self, ri: usize, uuid: &str) {
        let Some(sb) = self.raids[ri].sb.as_mut() else {
            return;
        };
        let mut hit = false;
        for slot in sb.slots.iter_mut() {
            if slot.0.as_deref() == Some(uuid) && slot.1 {
                slot.1 = false;
                hit = true;
            }
        }
        if hit {
            sb.seq += 1;
            self.write_sb(ri);
        }
        if let Some(r) = self.raids.get_mut(ri)
            && r.rebuild
                .as_ref()
                .is_some_and(|(t, _, _)| self.bdevs.iter().all(|b| &b.name != t))
        {
            r.rebuild = None;
        }
    }

    /// Takes member bdev `bi` out of the raid it serves in, as
    /// `bdev_raid_remove_base_bdev` does; false when it serves in none.
    fn take_out(&mut self, bi: usize) -> bool {
        let name = self.bdevs[bi].name.clone();
        let Some(ri) = self
            .raids
            .iter()
            .position(|r| r.slots.iter().any(|s| s.as_deref() == Some(&name)))
        else {
            return false;
        };
        for s in &mut self.raids[ri].slots {
            if s.as_deref() == Some(&name) {
                *s = None;
            }
        }
        self.bdevs[bi].claimed_by = None;
        let uuid = self.bdevs[bi].uuid.clone();
        self.sb_member_left(ri, &uuid);
        true
    }

    /// A rebuild that has finished makes its member active in the superblock
    /// (SPDK: `raid_bdev_process_finish_write_sb`); one armed to fail
    /// ([`super::SpdkDouble::fail_next_rebuild`]) leaves its target listed,
    /// then takes it out.
    pub(super) fn settle_rebuilds(&mut self) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.failed_targets)
            .into_iter()
            .partition(|(_, _, at)| now >= *at);
        self.failed_targets = later;
        for (raid, target, _) in due {
            let serves = self
                .raids
                .iter()
                .any(|r| r.name == raid && r.slots.iter().any(|s| s.as_deref() == Some(target.as_str())));
            if let Some(bi) = self.find(&target).filter(|_| serves) {
                self.take_out(bi);
            }
        }
        for ri in 0..self.raids.len() {
            let done = match &self.raids[ri].rebuild {
                Some((target, _, end)) if now >= *end => Some(target.clone()),
                _ => None,
            };
            let Some(target) = done else { continue };
            self.raids[ri].rebuild = None;
            if let Some(listed_for) = self.rebuild_failure.take() {
                let raid = self.raids[ri].name.clone();
                self.failed_targets.push((raid, target, now + listed_for));
                continue;
            }
            let Some(i) = self.find(&target) else { continue };
            let uuid = self.bdevs[i].uuid.clone();
            // raid_bdev_process wrote every block of the target
            if let BdevKind::Lvol(_) = &self.bdevs[i].kind {
                let clusters = self.bdevs[i].num_blocks * u64::from(self.bdevs[i].block_size)
                    / self.cluster_size_of(i).max(1);
                self.set_lvol_info(i, |l| l.allocated = clusters);
            }
            let Some(slot) = self.raids[ri]
                .slots
                .iter()
                .position(|s| s.as_deref() == Some(target.as_str()))
            else {
                continue;
            };
            if let Some(sb) = self.raids[ri].sb.as_mut() {
                if let Some(e) = sb.slots.get_mut(slot) {
                    *e = (Some(uuid), true);
                }
                sb.seq += 1;
                self.write_sb(ri);
            }
        }
    }

    /// Examine of lvols that just appeared (an lvstore loaded): a raid whose
    /// superblock they carry is assembled as SPDK's raid module does
    /// (`raid_bdev_examine_sb`): from the newest superblock among its members
    /// present; `configuring` (no bdev) until every member it names as
    /// active is here; a member that left re-joins an online raid by a
    /// rebuild; a member the newest superblock does not name is ignored.
    pub(super) fn examine_sb(&mut self, appeared: &[String]) {
        let mut uuids = Vec::new();
        for n in appeared {
            let Some(i) = self.find(n) else { continue };
            if let Some(sb) = self.visible_sb(i)
                && sb
                    .slots
                    .iter()
                    .any(|s| s.0.as_deref() == Some(self.bdevs[i].uuid.as_str()))
                && !uuids.contains(&sb.uuid)
            {
                uuids.push(sb.uuid);
            }
        }
        for u in uuids {
            // every present bdev that carries this raid's superblock and is named in it
            let carriers: Vec<(usize, Superblock)> = (0..self.bdevs.len())
                .filter_map(|i| {
                    let sb = self.visible_sb(i)?;
                    (sb.uuid == u
                        && sb
                            .slots
                            .iter()
                            .any(|s| s.0.as_deref() == Some(self.bdevs[i].uuid.as_str())))
                    .then_some((i, sb))
                })
                .collect();
            let online = self
                .raids
                .iter()
                .position(|r| r.sb.as_ref().is_some_and(|sb| sb.uuid == u) && !r.configuring);
            if let Some(ri) = online {
                // members that left come back through a rebuild
                let Some(sb) = self.raids[ri].sb.clone() else {
                    continue;
                };
                for (i, _) in &carriers {
                    let (uuid, name) = (self.bdevs[*i].uuid.clone(), self.bdevs[*i].name.clone());
                    let slot = sb
                        .slots
                        .iter()
                        .position(|s| s.0.as_deref() == Some(uuid.as_str()) && !s.1);
                    if let Some(slot) = slot
                        && self.raids[ri].slots[slot].is_none()
                        && self.bdevs[*i].claimed_by.is_none()
                        && self.raids[ri].rebuilding().is_none()
                    {
                        self.raids[ri].slots[slot] = Some(name.clone());
                        self.raids[ri].offsets[slot] = self.sb_data_offset(*i);
                        self.bdevs[*i].claimed_by = Some(format!("raid {}", self.raids[ri].name));
                        let now = Instant::now();
                        self.raids[ri].rebuild = Some((name, now, now + self.rebuild_time));
                    }
                }
                continue;
            }
            // (re)assemble from the newest superblock present
            let Some(newest) = carriers.iter().map(|(_, sb)| sb.clone()).max_by_key(|sb| sb.seq) else {
                continue;
            };
            if let Some(ri) = self
                .raids
                .iter()
                .position(|r| r.sb.as_ref().is_some_and(|sb| sb.uuid == u))
            {
                let old = self.raids.remove(ri);
                for m in old.slots.iter().flatten() {
                    if let Some(i) = self.find(m) {
                        self.bdevs[i].claimed_by = None;
                    }
                }
            }
            let mut slots = vec![None; newest.slots.len()];
            let mut offsets = vec![0; newest.slots.len()];
            for (k, (uuid, active)) in newest.slots.iter().enumerate() {
                if !active {
                    continue;
                }
                if let Some(i) = self.bdevs.iter().position(|b| Some(&b.uuid) == uuid.as_ref()) {
                    slots[k] = Some(self.bdevs[i].name.clone());
                    offsets[k] = self.sb_data_offset(i);
                    self.bdevs[i].claimed_by = Some(format!("raid {}", newest.name));
                }
            }
            let configuring = newest
                .slots
                .iter()
                .zip(&slots)
                .any(|((_, active), present)| *active && present.is_none());
            let name = newest.name.clone();
            let members: Vec<usize> = slots.iter().flatten().filter_map(|n| self.find(n)).collect();
            let num_blocks = members
                .iter()
                .zip(
                    slots
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| s.is_some())
                        .map(|(k, _)| offsets[k]),
                )
                .map(|(&i, off)| self.bdevs[i].num_blocks.saturating_sub(off))
                .min()
                .unwrap_or(0);
            let bs = members.first().map_or(4096, |&i| self.bdevs[i].block_size);
            self.raids.push(Raid {
                name: name.clone(),
                level: RaidLevel::Raid1,
                strip_size_kb: 0,
                slots,
                rebuild: None,
                sb: Some(newest.clone()),
                configuring,
                offsets,
            });
            if !configuring && self.find(&name).is_none() {
                self.bdevs.push(Bdev {
                    name,
                    aliases: vec![newest.uuid.clone()],
                    uuid: newest.uuid.clone(),
                    block_size: bs,
                    num_blocks,
                    claimed_by: None,
                    kind: BdevKind::Raid,
                });
            }
        }
    }

    pub(super) fn raid_json(&self, name: &str) -> Value {
        let Some(r) = self.raids.iter().find(|r| r.name == name) else {
            return json!({});
        };
        let uuid = self
            .bdevs
            .iter()
            .find(|b| b.name == name)
            .map(|b| b.uuid.clone())
            .unwrap_or_default();
        let discovered = r.slots.iter().filter(|s| s.is_some()).count();
        let operational = match (&r.sb, r.configuring) {
            (Some(sb), true) => sb.slots.iter().filter(|s| s.1).count(),
            _ => discovered,
        };
        let state = if r.configuring {
            "configuring"
        } else if discovered == 0 {
            "offline"
        } else {
            "online"
        };
        let uuid = r.sb.as_ref().map(|sb| sb.uuid.clone()).unwrap_or(uuid);
        let size = self.find(&r.name).map_or(0, |i| self.bdevs[i].num_blocks);
        let level = serde_json::to_value(r.level).unwrap_or(Value::Null);
        let list: Vec<Value> = r
            .slots
            .iter()
            .enumerate()
            .map(|(k, s)| match s {
                Some(n) => {
                    let u = self.find(n).map(|i| self.bdevs[i].uuid.clone());
                    json!({"name": n, "uuid": u, "is_configured": true,
                        "data_offset": r.offsets.get(k).copied().unwrap_or(0), "data_size": size})
                }
                None => json!({"name": null, "uuid": null, "is_configured": false, "data_offset": 0, "data_size": 0}),
            })
            .collect();
        let mut out = json!({
            "name": r.name, "uuid": uuid, "strip_size_kb": r.strip_size_kb, "state": state,
            "raid_level": level, "superblock": r.sb.is_some(), "num_base_bdevs": r.slots.len(),
            "num_base_bdevs_discovered": discovered, "num_base_bdevs_operational": operational,
            "base_bdevs_list": list,
        });
        if let Some((target, start, end)) = r.rebuilding() {
            let blocks = self.find(&r.name).map(|i| self.bdevs[i].num_blocks).unwrap_or(0);
            let done = start.elapsed().as_secs_f64() / (*end - *start).as_secs_f64();
            out["process"] = json!({"type": "rebuild", "target": target,
                "progress": {"blocks": (blocks as f64 * done) as u64, "percent": (done * 100.0) as u32}});
        }
        out
    }
}
