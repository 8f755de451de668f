//! The double's lvstores and lvols: create, snapshot, clone, set_parent, resize, delete, listing.

use super::*;

impl State {
    /// The lvol methods (`call` routes them here by name).
    pub(super) fn call_lvol(&mut self, method: &str, params: &Option<Value>) -> RpcResult {
        match method {
            "bdev_lvol_create_lvstore" => {
                let p: LvstoreCreate = decode(params)?;
                let i = self.find(&p.bdev_name).ok_or((ENODEV.0, ENODEV.1.to_owned()))?;
                if self.bdevs[i].claimed_by.is_some() {
                    return fail(-1, "Operation not permitted");
                }
                if self.lvstores.iter().any(|l| l.name == p.lvs_name) {
                    return e(EEXIST);
                }
                let cluster = u64::from(p.cluster_sz.unwrap_or(4 << 20));
                let size = self.bdevs[i].num_blocks * u64::from(self.bdevs[i].block_size);
                if cluster == 0 || size / cluster < 2 {
                    return fail(-22, "Invalid argument");
                }
                let uuid = new_uuid();
                self.bdevs[i].claimed_by = Some(format!("lvstore {}", p.lvs_name));
                self.lvstores.push(Lvs {
                    uuid: uuid.clone(),
                    name: p.lvs_name,
                    base_bdev: self.bdevs[i].name.clone(),
                    cluster_size: cluster,
                    total_clusters: size / cluster - 1,
                });
                if let Some(d) = self.pci_device_of(i) {
                    d.writes.push((0, b"SPDKBLOB".to_vec()));
                }
                Ok(json!(uuid))
            }
            "bdev_lvol_get_lvstores" => {
                let p: LvstoreSelector = decode(params)?;
                if p.uuid.is_none() && p.lvs_name.is_none() {
                    return Ok(Value::Array(
                        self.lvstores.iter().map(|l| self.lvs_json(l)).collect(),
                    ));
                }
                let i = self.lvs_by(&p)?;
                Ok(json!([self.lvs_json(&self.lvstores[i])]))
            }
            "bdev_lvol_delete_lvstore" => {
                let p: LvstoreSelector = decode(params)?;
                if p.uuid.is_none() && p.lvs_name.is_none() {
                    return fail(-22, "Invalid argument");
                }
                let i = self.lvs_by(&p)?;
                let lvs = self.lvstores[i].clone();
                let in_lvs = |b: &Bdev| matches!(&b.kind, BdevKind::Lvol(l) if l.lvs_uuid == lvs.uuid);
                if self.bdevs.iter().any(|b| in_lvs(b) && b.claimed_by.is_some()) {
                    return e(EBUSY);
                }
                while let Some(j) = self.bdevs.iter().position(in_lvs) {
                    self.remove_bdev(j);
                }
                self.lvstores.remove(i);
                if let Some(j) = self.find(&lvs.base_bdev) {
                    self.bdevs[j].claimed_by = None;
                    // SPDK zeroes the superblock of a deleted lvstore
                    if let Some(d) = self.pci_device_of(j) {
                        d.writes.push((0, vec![0u8; 8]));
                    }
                }
                Ok(json!(true))
            }
            "bdev_lvol_create" => {
                let p: LvolCreate = decode(params)?;
                let sel = LvstoreSelector {
                    uuid: p.uuid.clone(),
                    lvs_name: p.lvs_name.clone(),
                };
                if sel.uuid.is_none() && sel.lvs_name.is_none() {
                    return fail(-32602, "Invalid parameters");
                }
                let li = self.lvs_by(&sel)?;
                let lvs = self.lvstores[li].clone();
                let alias = format!("{}/{}", lvs.name, p.lvol_name);
                if self.name_taken(&alias) {
                    return e(EEXIST);
                }
                let clusters = (p.size_in_mib << 20).div_ceil(lvs.cluster_size);
                let thin = p.thin_provision.unwrap_or(false);
                if !thin && clusters > self.free_clusters(&lvs.uuid) {
                    return fail(-32602, "No space left on device");
                }
                let bs = self
                    .find(&lvs.base_bdev)
                    .map(|i| self.bdevs[i].block_size)
                    .unwrap_or(4096);
                let uuid = new_uuid();
                self.bdevs.push(Bdev {
                    name: uuid.clone(),
                    aliases: vec![alias],
                    uuid: uuid.clone(),
                    block_size: bs,
                    num_blocks: clusters * lvs.cluster_size / u64::from(bs),
                    claimed_by: None,
                    kind: BdevKind::Lvol(LvolInfo {
                        lvs_uuid: lvs.uuid,
                        name: p.lvol_name,
                        thin,
                        snapshot: false,
                        parent: None,
                        allocated: if thin { 0 } else { clusters },
                        sb: None,
                        sb_cleared: false,
                    }),
                });
                Ok(json!(uuid))
            }
            "bdev_lvol_snapshot" => {
                let p: LvolSnapshot = decode(params)?;
                let i = self.lvol(&p.lvol_name)?;
                let info = self.lvol_info(i);
                let lvs = self.lvstores.iter().find(|l| l.uuid == info.lvs_uuid).cloned();
                let Some(lvs) = lvs else { return e(ENODEV) };
                if info.snapshot {
                    return fail(-22, "Invalid argument");
                }
                let alias = format!("{}/{}", lvs.name, p.snapshot_name);
                if self.name_taken(&alias) {
                    return e(EEXIST);
                }
                if self.writable_export(i) {
                    self.snapshots_while_writable.push(alias.clone());
                }
                let uuid = new_uuid();
                let src = self.bdevs[i].clone();
                self.bdevs.push(Bdev {
                    name: uuid.clone(),
                    aliases: vec![alias],
                    uuid: uuid.clone(),
                    claimed_by: None,
                    kind: BdevKind::Lvol(LvolInfo {
                        name: p.snapshot_name,
                        snapshot: true,
                        parent: info.parent.clone(),
                        allocated: info.allocated,
                        thin: info.thin,
                        lvs_uuid: info.lvs_uuid,
                        // the head's clusters (its superblock too) now belong to the snapshot
                        sb: info.sb.clone(),
                        sb_cleared: info.sb_cleared,
                    }),
                    ..src
                });
                let snap = uuid.clone();
                self.set_lvol_info(i, |l| {
                    l.parent = Some(snap);
                    l.allocated = 0;
                    l.thin = true;
                    l.sb = None;
                    l.sb_cleared = false;
                });
                Ok(json!(uuid))
            }
            "bdev_lvol_set_parent" => {
                let p: crate::spdk::rpc::LvolSetParent = decode(params)?;
                let i = self.lvol(&p.lvol_name)?;
                let si = self.lvol(&p.parent_name)?;
                let (info, parent) = (self.lvol_info(i), self.lvol_info(si));
                // blobstore: the parent must be a snapshot with as many
                // clusters as the lvol, and the lvol thin
                if i == si
                    || !parent.snapshot
                    || !info.thin
                    || self.bdevs[i].num_blocks != self.bdevs[si].num_blocks
                {
                    return fail(-32602, "Invalid argument");
                }
                let snap = self.bdevs[si].name.clone();
                self.set_lvol_info(i, |l| l.parent = Some(snap));
                Ok(json!(true))
            }
            "bdev_lvol_clone" => {
                let p: LvolClone = decode(params)?;
                let i = self.lvol(&p.snapshot_name)?;
                let info = self.lvol_info(i);
                if !info.snapshot {
                    return fail(-32602, "Invalid argument");
                }
                let Some(lvs) = self.lvstores.iter().find(|l| l.uuid == info.lvs_uuid).cloned() else {
                    return e(ENODEV);
                };
                let alias = format!("{}/{}", lvs.name, p.clone_name);
                if self.name_taken(&alias) {
                    return e(EEXIST);
                }
                let uuid = new_uuid();
                let src = self.bdevs[i].clone();
                self.bdevs.push(Bdev {
                    name: uuid.clone(),
                    aliases: vec![alias],
                    uuid: uuid.clone(),
                    claimed_by: None,
                    kind: BdevKind::Lvol(LvolInfo {
                        name: p.clone_name,
                        snapshot: false,
                        parent: Some(src.name.clone()),
                        allocated: 0,
                        thin: true,
                        lvs_uuid: info.lvs_uuid,
                        sb: None,
                        sb_cleared: false,
                    }),
                    ..src
                });
                Ok(json!(uuid))
            }
            "bdev_lvol_resize" => {
                let p: LvolResize = decode(params)?;
                let i = self.lvol(&p.name)?;
                let info = self.lvol_info(i);
                let Some(lvs) = self.lvstores.iter().find(|l| l.uuid == info.lvs_uuid).cloned() else {
                    return e(ENODEV);
                };
                let clusters = (p.size_in_mib << 20).div_ceil(lvs.cluster_size);
                if !info.thin
                    && clusters > info.allocated
                    && clusters - info.allocated > self.free_clusters(&lvs.uuid)
                {
                    return fail(-32602, "No space left on device");
                }
                let bs = u64::from(self.bdevs[i].block_size);
                self.bdevs[i].num_blocks = clusters * lvs.cluster_size / bs;
                if !info.thin {
                    self.set_lvol_info(i, |l| l.allocated = clusters);
                }
                Ok(json!(true))
            }
            "bdev_lvol_delete" => {
                let p: ByName = decode(params)?;
                let i = self.lvol(&p.name)?;
                if !self.deletable(i) {
                    return e(EBUSY);
                }
                let name = self.bdevs[i].name.clone();
                let info = self.lvol_info(i);
                let clones = self.clones_of(&name);
                if clones.len() > 1 {
                    return fail(-32603, "Operation not permitted");
                }
                // A snapshot with one clone is merged into it: the clone
                // takes the parent and the clusters it did not have.
                for c in clones {
                    if let Some(j) = self.find(&c) {
                        let parent = info.parent.clone();
                        let clusters = self.bdevs[j].num_blocks * u64::from(self.bdevs[j].block_size)
                            / self.cluster_size_of(j).max(1);
                        self.set_lvol_info(j, |l| {
                            l.parent = parent;
                            l.allocated = (l.allocated + info.allocated).min(clusters);
                            if l.sb.is_none() && !l.sb_cleared {
                                l.sb = info.sb.clone();
                                l.sb_cleared = info.sb_cleared;
                            }
                        });
                    }
                }
                self.remove_bdev(i);
                Ok(json!(true))
            }
            "bdev_lvol_get_lvols" => {
                let p: GetLvols = decode(params)?;
                let sel = LvstoreSelector {
                    uuid: p.lvs_uuid,
                    lvs_name: p.lvs_name,
                };
                let only = if sel.uuid.is_some() || sel.lvs_name.is_some() {
                    Some(self.lvstores[self.lvs_by(&sel)?].uuid.clone())
                } else {
                    None
                };
                let mut out = Vec::new();
                for b in &self.bdevs {
                    let BdevKind::Lvol(l) = &b.kind else { continue };
                    if only.as_ref().is_some_and(|u| u != &l.lvs_uuid) {
                        continue;
                    }
                    let lvs_name = self
                        .lvstores
                        .iter()
                        .find(|s| s.uuid == l.lvs_uuid)
                        .map(|s| s.name.clone());
                    out.push(json!({
                        "alias": b.aliases.first(), "uuid": b.uuid, "name": l.name,
                        "is_thin_provisioned": l.thin, "is_snapshot": l.snapshot, "is_clone": l.parent.is_some(),
                        "is_esnap_clone": false, "is_degraded": false, "num_allocated_clusters": l.allocated,
                        "lvs": {"name": lvs_name, "uuid": l.lvs_uuid},
                    }));
                }
                Ok(Value::Array(out))
            }
            "bdev_lvol_start_shallow_copy" => {
                let p: StartShallowCopy = decode(params)?;
                // spdk_bdev_get_by_name, then the lvol behind it
                let Some(si) = self.find(&p.src_lvol_name) else {
                    return e(ENODEV);
                };
                let BdevKind::Lvol(src) = self.bdevs[si].kind.clone() else {
                    return e(ENODEV);
                };
                // the destination is opened and claimed at once (errors are
                // the RPC's, INVALID_PARAMS with strerror); the rest of the
                // checks run in the copy and show in its status
                let Some(di) = self.find(&p.dst_bdev_name) else {
                    return fail(-32602, "No such device");
                };
                if self.bdevs[di].claimed_by.is_some() {
                    return fail(-32602, "Operation not permitted");
                }
                self.shallow_copy_count += 1;
                let id = self.shallow_copy_count;
                self.copies_started
                    .push((p.src_lvol_name.clone(), p.dst_bdev_name.clone()));
                let src_bytes = self.bdevs[si].num_blocks * u64::from(self.bdevs[si].block_size);
                let dst_bytes = self.bdevs[di].num_blocks * u64::from(self.bdevs[di].block_size);
                let mut error = if !src.snapshot {
                    Some("Operation not permitted")
                } else if dst_bytes < src_bytes || self.bdevs[di].block_size != self.bdevs[si].block_size {
                    Some("Invalid argument")
                } else {
                    None
                };
                if error.is_none() {
                    // the source's own clusters land in the destination's
                    // own clusters (the first one: a superblock or its zeros)
                    // through NVMe/TCP: into the remote double's lvol
                    if let BdevKind::Nvme { ctrlr } = &self.bdevs[di].kind {
                        let nsid = self.bdevs[di]
                            .name
                            .rsplit_once('n')
                            .and_then(|(_, n)| n.parse().ok())
                            .unwrap_or(1);
                        if let Some(c) = self.ctrlrs.iter().find(|c| &c.name == ctrlr) {
                            let sb = (src.sb.is_some() || src.sb_cleared)
                                .then(|| (src.sb.clone(), src.sb_cleared));
                            self.fabric_writes.push(super::FabricWrite {
                                trid: c.trid.clone(),
                                nsid,
                                clusters: src.allocated,
                                sb,
                            });
                        }
                    }
                    // into an aio file (a snapshot hash): the double keeps
                    // no data, so each of the source's clusters is written
                    // with bytes that follow from how many it holds (two
                    // copies of equal writes write equal bytes)
                    if let BdevKind::Aio { filename } = &self.bdevs[di].kind {
                        let cluster = self.cluster_size_of(si);
                        let n = src.allocated.min(dst_bytes / cluster.max(1));
                        if written_clusters(filename, cluster, n, src.allocated).is_err() {
                            error = Some("Input/output error");
                        }
                    }
                    if let BdevKind::Lvol(_) = &self.bdevs[di].kind {
                        let clusters = dst_bytes / self.cluster_size_of(di).max(1);
                        self.set_lvol_info(di, |l| {
                            l.allocated = (l.allocated + src.allocated).min(clusters);
                            if src.sb.is_some() || src.sb_cleared {
                                l.sb = src.sb.clone();
                                l.sb_cleared = src.sb_cleared;
                            }
                        });
                    }
                }
                self.shallow_copies.push(super::ShallowCopy {
                    id,
                    total: src.allocated,
                    error,
                    checks: 0,
                    done_at: std::time::Instant::now()
                        + if src.allocated > 0 {
                            self.rebuild_time
                        } else {
                            Duration::ZERO
                        },
                    dst: p.dst_bdev_name.clone(),
                });
                Ok(json!({ "operation_id": id }))
            }
            "bdev_lvol_check_shallow_copy" => {
                let p: CheckShallowCopy = decode(params)?;
                let Some(pos) = self.shallow_copies.iter().position(|c| c.id == p.operation_id) else {
                    return e(ENODEV);
                };
                let gone = std::time::Instant::now() < self.shallow_copies[pos].done_at
                    && self.find(&self.shallow_copies[pos].dst).is_none();
                let c = &mut self.shallow_copies[pos];
                c.checks += 1;
                if gone && c.error.is_none() {
                    c.error = Some("Input/output error");
                }
                let (total, error) = (c.total, c.error);
                // reported once when it ended, then forgotten (as SPDK does)
                if let Some(err) = error {
                    self.shallow_copies.remove(pos);
                    return Ok(json!({"copied_clusters": 0, "total_clusters": total,
                        "state": "error", "error": err}));
                }
                if (c.checks == 1 && total > 1) || std::time::Instant::now() < c.done_at {
                    return Ok(json!({"copied_clusters": total / 2, "total_clusters": total,
                        "state": "in progress"}));
                }
                self.shallow_copies.remove(pos);
                Ok(json!({"copied_clusters": total, "total_clusters": total, "state": "complete"}))
            }
            _ => fail(-32601, "Method not found"),
        }
    }

    /// The cluster size of lvol bdev `i`'s lvstore.
    pub(super) fn cluster_size_of(&self, i: usize) -> u64 {
        match &self.bdevs[i].kind {
            BdevKind::Lvol(l) => self
                .lvstores
                .iter()
                .find(|s| s.uuid == l.lvs_uuid)
                .map_or(1 << 20, |s| s.cluster_size),
            _ => 1 << 20,
        }
    }
}

/// Writes clusters `0..n` (of `cluster` bytes) of aio file `file` as a
/// shallow copy of a snapshot holding `held` clusters writes them: bytes
/// that follow from `held` and the cluster.
fn written_clusters(file: &Path, cluster: u64, n: u64, held: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(file)?;
    let words = usize::try_from(cluster / 8).unwrap_or(0);
    for k in 0..n {
        let mut x = (held << 32) ^ k ^ 0x9e37_79b9_7f4a_7c15;
        let mut buf = Vec::with_capacity(words * 8);
        for _ in 0..words {
            // splitmix64
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            buf.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        f.write_all_at(&buf, k * cluster)?;
    }
    Ok(())
}
