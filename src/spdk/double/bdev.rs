//! The double's malloc, AIO and null bdevs, bdev listing, examine and I/O statistics.

use super::*;

impl State {
    /// The bdev methods (`call` routes them here by name).
    pub(super) fn call_bdev(&mut self, method: &str, params: &Option<Value>) -> RpcResult {
        match method {
            "bdev_get_bdevs" => {
                let p: GetBdevs = decode(params)?;
                match p.name {
                    Some(n) => match self.find(&n) {
                        Some(i) => Ok(json!([self.bdev_json(&self.bdevs[i])])),
                        None => e(ENODEV),
                    },
                    None => Ok(Value::Array(
                        self.bdevs.iter().map(|b| self.bdev_json(b)).collect(),
                    )),
                }
            }
            "bdev_examine" => {
                let p: ByName = decode(params)?;
                self.find(&p.name)
                    .map(|_| json!(true))
                    .ok_or((ENODEV.0, ENODEV.1.into()))
            }
            "bdev_get_iostat" => {
                let p: GetIostat = decode(params)?;
                let names: Vec<String> = match p.names {
                    Some(ns) => {
                        let mut out = Vec::new();
                        for n in ns {
                            let i = self.find(&n).ok_or((ENODEV.0, ENODEV.1.to_owned()))?;
                            out.push(self.bdevs[i].name.clone());
                        }
                        out
                    }
                    None => self.bdevs.iter().map(|b| b.name.clone()).collect(),
                };
                let bdevs: Vec<Value> = names
                    .iter()
                    .map(|n| {
                        json!({"name": n, "bytes_read": 0, "num_read_ops": 0, "bytes_written": 0,
                        "num_write_ops": 0, "bytes_unmapped": 0, "num_unmap_ops": 0,
                        "read_latency_ticks": 0, "write_latency_ticks": 0, "io_error": {}})
                    })
                    .collect();
                Ok(json!({"tick_rate": 1_000_000_000u64, "ticks": 0, "bdevs": bdevs}))
            }
            "bdev_set_qos_limit" => {
                // v26.05 `rpc_bdev_set_qos_limit`: limits not given stay as
                // they are; none given is refused; MB/s are whole MiB, IOPS
                // are rounded up to a multiple of 1000; 0 lifts a limit
                #[derive(serde::Deserialize)]
                #[serde(deny_unknown_fields)]
                struct QosLimit {
                    name: String,
                    rw_ios_per_sec: Option<u64>,
                    rw_mbytes_per_sec: Option<u64>,
                    r_mbytes_per_sec: Option<u64>,
                    w_mbytes_per_sec: Option<u64>,
                }
                let p: QosLimit = decode(params)?;
                let i = self.find(&p.name).ok_or((ENODEV.0, ENODEV.1.to_owned()))?;
                let given = [
                    p.rw_ios_per_sec.map(|v| v.div_ceil(1000) * 1000),
                    p.rw_mbytes_per_sec,
                    p.r_mbytes_per_sec,
                    p.w_mbytes_per_sec,
                ];
                if given.iter().all(Option::is_none) {
                    return fail(-22, "No rate limits specified");
                }
                let name = self.bdevs[i].name.clone();
                let mut now = self.qos.get(&name).copied().unwrap_or_default();
                for (k, v) in given.iter().enumerate() {
                    if let Some(v) = v {
                        now[k] = *v;
                    }
                }
                if now == [0; 4] {
                    self.qos.remove(&name);
                } else {
                    self.qos.insert(name, now);
                }
                Ok(json!(true))
            }
            "bdev_malloc_create" => {
                if params.is_none() {
                    return fail(-32603, "spdk_json_decode_object failed");
                }
                let p: MallocCreate = decode(params)?;
                if p.block_size == 0 || !p.block_size.is_multiple_of(512) || p.num_blocks == 0 {
                    return fail(-22, "Invalid argument");
                }
                let name = match p.name {
                    Some(n) => n,
                    None => {
                        let n = format!("Malloc{}", self.malloc_counter);
                        self.malloc_counter += 1;
                        n
                    }
                };
                if self.name_taken(&name) {
                    return e(EEXIST);
                }
                let uuid = p.uuid.unwrap_or_else(new_uuid);
                self.bdevs.push(Bdev {
                    name: name.clone(),
                    aliases: vec![uuid.clone()],
                    uuid,
                    block_size: p.block_size,
                    num_blocks: p.num_blocks,
                    claimed_by: None,
                    kind: BdevKind::Malloc,
                });
                Ok(json!(name))
            }
            "bdev_malloc_delete" | "bdev_aio_delete" => {
                let p: ByName = decode(params)?;
                let want_aio = method == "bdev_aio_delete";
                let i = match self.find(&p.name) {
                    Some(i)
                        if matches!(self.bdevs[i].kind, BdevKind::Aio { .. }) == want_aio
                            && matches!(self.bdevs[i].kind, BdevKind::Aio { .. } | BdevKind::Malloc) =>
                    {
                        i
                    }
                    _ => return e(ENODEV),
                };
                if !self.deletable(i) {
                    return e(EBUSY);
                }
                self.remove_bdev(i);
                Ok(json!(true))
            }
            "bdev_aio_create" => {
                let p: AioCreate = decode(params)?;
                let meta = match std::fs::metadata(&p.filename) {
                    Ok(m) => m,
                    Err(_) => return fail(-2, "No such file or directory"),
                };
                if self.name_taken(&p.name) {
                    return e(EEXIST);
                }
                // v26.05 (bdev_aio.c create_aio_bdev): a power of two, at least 512 (-22);
                // a file's block size is not detected (the double takes 512 for it)
                let bs = p.block_size.unwrap_or(512);
                if bs < 512 || !bs.is_power_of_two() {
                    return fail(-22, "Invalid argument");
                }
                let filename =
                    std::fs::canonicalize(&p.filename).unwrap_or_else(|_| PathBuf::from(&p.filename));
                let uuid = new_uuid();
                self.bdevs.push(Bdev {
                    name: p.name.clone(),
                    aliases: vec![uuid.clone()],
                    uuid,
                    block_size: bs,
                    num_blocks: meta.len() / u64::from(bs),
                    claimed_by: None,
                    kind: BdevKind::Aio {
                        filename: filename.clone(),
                    },
                });
                // Examine: an lvstore written on this file comes back.
                if let Some(d) = self.on_disk.remove(&filename) {
                    let mut lvs = d.lvs;
                    lvs.base_bdev = p.name.clone();
                    if let Some(i) = self.find(&p.name) {
                        self.bdevs[i].claimed_by = Some(format!("lvstore {}", lvs.name));
                    }
                    self.lvstores.push(lvs);
                    let appeared: Vec<String> = d.lvols.iter().map(|l| l.name.clone()).collect();
                    self.bdevs.extend(d.lvols);
                    self.examine_sb(&appeared);
                }
                Ok(json!(p.name))
            }
            "bdev_null_create" => {
                let p: NullCreate = decode(params)?;
                if self.name_taken(&p.name) {
                    return e(EEXIST);
                }
                if p.block_size == 0 || !p.block_size.is_multiple_of(512) || p.num_blocks == 0 {
                    return fail(-22, "Invalid argument");
                }
                let uuid = new_uuid();
                self.bdevs.push(Bdev {
                    name: p.name.clone(),
                    aliases: vec![uuid.clone()],
                    uuid,
                    block_size: p.block_size,
                    num_blocks: p.num_blocks,
                    claimed_by: None,
                    kind: BdevKind::Null,
                });
                Ok(json!(p.name))
            }
            "bdev_null_delete" => {
                let p: ByName = decode(params)?;
                match self.find(&p.name) {
                    // a raid member is hot-removed from its raid, as SPDK does
                    Some(i) if matches!(self.bdevs[i].kind, BdevKind::Null) => {
                        self.remove_bdev(i);
                        Ok(json!(true))
                    }
                    _ => e(ENODEV),
                }
            }
            _ => fail(-32601, "Method not found"),
        }
    }
}
