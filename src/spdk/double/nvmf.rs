//! The double's NVMe-oF: transports, subsystems, namespaces, listeners and ANA states, hosts, controllers; NVMe bdev controllers.

use super::*;

/// SPDK's base64 (URL-safe, padded).
fn b64_padded(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE.encode(b)
}

impl State {
    /// The nvmf methods (`call` routes them here by name).
    pub(super) fn call_nvmf(&mut self, method: &str, params: &Option<Value>) -> RpcResult {
        match method {
            "nvmf_create_transport" => {
                let p: CreateTransport = decode(params)?;
                let t = p.trtype.to_uppercase();
                if t != "TCP" && t != "RDMA" {
                    return fail(-32602, format!("Invalid transport type '{}'", p.trtype));
                }
                if self.transports.contains(&t) {
                    return fail(-32603, format!("Transport type '{}' already exists", p.trtype));
                }
                self.transports.push(t);
                Ok(json!(true))
            }
            "nvmf_get_transports" => {
                let p: GetTransports = decode(params)?;
                Ok(Value::Array(
                    self.transports
                        .iter()
                        .filter(|t| p.trtype.as_ref().is_none_or(|w| w.eq_ignore_ascii_case(t)))
                        .map(|t| {
                            json!({"trtype": t, "max_queue_depth": 128, "max_io_qpairs_per_ctrlr": 127,
                            "in_capsule_data_size": 4096, "max_io_size": 131072})
                        })
                        .collect(),
                ))
            }
            "nvmf_create_subsystem" => {
                let p: CreateSubsystem = decode(params)?;
                let valid = p.nqn.starts_with("nqn.") && p.nqn.len() <= 223 && p.nqn.contains(':');
                if !valid || self.subsystems.iter().any(|s| s.nqn == p.nqn) {
                    return fail(-32603, format!("Unable to create subsystem {}", p.nqn));
                }
                let n = self.subsystems.len() + 1;
                self.subsystems.push(Subsys {
                    nqn: p.nqn,
                    allow_any_host: p.allow_any_host.unwrap_or(false),
                    serial: p.serial_number.unwrap_or_else(|| format!("SPDK{n:014}")),
                    model: p.model_number.unwrap_or_else(|| "SPDK bdev Controller".into()),
                    ana_reporting: p.ana_reporting.unwrap_or(false),
                    max_namespaces: p.max_namespaces.filter(|n| *n > 0).unwrap_or(32),
                    ..Subsys::default()
                });
                Ok(json!(true))
            }
            "nvmf_delete_subsystem" => {
                let p: ByNqn = decode(params)?;
                let i = self.subsys(&p.nqn)?;
                let gone = self.subsystems.remove(i);
                for ns in &gone.namespaces {
                    self.release_nvmf_claim(&ns.bdev);
                }
                Ok(json!(true))
            }
            "nvmf_get_subsystems" => {
                let p: GetSubsystems = decode(params)?;
                let mut out = vec![
                    json!({"nqn": "nqn.2014-08.org.nvmexpress.discovery", "subtype": "Discovery",
                    "listen_addresses": [], "allow_any_host": true, "hosts": []}),
                ];
                for s in &self.subsystems {
                    out.push(json!({
                        "nqn": s.nqn, "subtype": "NVMe", "listen_addresses": s.listeners,
                        "allow_any_host": s.allow_any_host,
                        "hosts": s.hosts.iter().map(|h| {
                            let mut v = json!({"nqn": h});
                            if let Some((k, c)) = s.host_keys.get(h) {
                                if let Some(k) = k { v["dhchap_key"] = json!(k); }
                                if let Some(c) = c { v["dhchap_ctrlr_key"] = json!(c); }
                            }
                            v
                        }).collect::<Vec<_>>(),
                        "serial_number": s.serial, "model_number": s.model, "max_namespaces": s.max_namespaces,
                        "namespaces": s.namespaces.iter().map(|n| {
                            let mut ns = json!({"nsid": n.nsid, "bdev_name": n.bdev,
                                "name": n.bdev, "nguid": n.nguid, "uuid": n.uuid});
                            if s.ana_reporting {
                                ns["anagrpid"] = json!(n.anagrpid);
                            }
                            ns
                        }).collect::<Vec<_>>(),
                    }));
                }
                match p.nqn {
                    Some(nqn) => {
                        let one: Vec<Value> = out.into_iter().filter(|s| s["nqn"] == nqn.as_str()).collect();
                        if one.is_empty() {
                            e(INVALID_PARAMS)
                        } else {
                            Ok(Value::Array(one))
                        }
                    }
                    None => Ok(Value::Array(out)),
                }
            }
            "nvmf_subsystem_add_ns" => {
                let p: AddNamespace = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                let bi = self
                    .find(&p.namespace.bdev_name)
                    .ok_or((INVALID_PARAMS.0, INVALID_PARAMS.1.into()))?;
                // the target claims a namespace's bdev (`exclusive_write`):
                // one claimed already (a raid member, another export) is
                // refused with -32602, as v26.05 does
                if self.bdevs[bi].claimed_by.is_some() {
                    return e(INVALID_PARAMS);
                }
                let b = self.bdevs[bi].clone();
                let sub = &mut self.subsystems[si];
                let nsid = match p.namespace.nsid {
                    Some(n) if n == 0 || sub.namespaces.iter().any(|x| x.nsid == n) => {
                        return e(INVALID_PARAMS);
                    }
                    Some(n) => n,
                    None => (1..)
                        .find(|n| !sub.namespaces.iter().any(|x| x.nsid == *n))
                        .unwrap_or(1),
                };
                let derived_nguid = p.namespace.nguid.is_none();
                sub.namespaces.push(Ns {
                    nsid,
                    bdev: b.name.clone(),
                    nguid: p.namespace.nguid.unwrap_or_else(|| nguid_of(&b.uuid)),
                    uuid: p.namespace.uuid.unwrap_or_else(|| b.uuid.clone()),
                    derived_nguid,
                    num_blocks: b.num_blocks,
                    block_size: b.block_size,
                    anagrpid: nsid,
                    drained: false,
                });
                sub.namespaces.sort_by_key(|n| n.nsid);
                self.bdevs[bi].claimed_by = Some(format!("{NVMF_CLAIM}{}", p.nqn));
                Ok(json!(nsid))
            }
            "nvmf_subsystem_remove_ns" => {
                let p: RemoveNamespace = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                let Some(at) = self.subsystems[si]
                    .namespaces
                    .iter()
                    .position(|n| n.nsid == p.nsid)
                else {
                    return e(INVALID_PARAMS);
                };
                let ns = self.subsystems[si].namespaces.remove(at);
                self.release_nvmf_claim(&ns.bdev);
                Ok(json!(true))
            }
            "nvmf_subsystem_add_listener" | "nvmf_subsystem_remove_listener" => {
                // add_listener also takes secure_channel (TLS on the whole port)
                let secure = method.ends_with("add_listener")
                    && params
                        .as_ref()
                        .and_then(|v| v.get("secure_channel"))
                        .and_then(Value::as_bool)
                        == Some(true);
                // and ana_state, the listener's state from the start: v26.05
                // takes optimized, non_optimized or inaccessible, anything
                // else -32602 with no listener; on a subsystem without ANA
                // reporting it is taken and never reported
                let mut ana = None;
                let mut params = params.clone();
                if let Some(Value::Object(m)) = params.as_mut() {
                    m.remove("secure_channel");
                    if method.ends_with("add_listener")
                        && let Some(a) = m.remove("ana_state")
                    {
                        ana = Some(
                            serde_json::from_value::<crate::spdk::rpc::AnaState>(a)
                                .map_err(|_| INVALID_PARAMS)
                                .or_else(e)?,
                        );
                    }
                }
                let p: SubsystemListener = decode(&params)?;
                let si = self.subsys(&p.nqn)?;
                let same = |l: &crate::spdk::rpc::ListenAddress| {
                    l.trtype.eq_ignore_ascii_case(&p.listen_address.trtype)
                        && l.traddr == p.listen_address.traddr
                        && l.trsvcid == p.listen_address.trsvcid
                };
                let exists = self.subsystems[si].listeners.iter().any(same);
                if method.ends_with("add_listener") {
                    if secure && self.subsystems[si].allow_any_host {
                        return fail(
                            -32603,
                            "Cannot establish secure channel, when 'allow_any_host' is set",
                        );
                    }
                    if exists || !self.transports.contains(&p.listen_address.trtype.to_uppercase()) {
                        return e(INVALID_PARAMS);
                    }
                    // the first listener on a port decides whether it is TLS (spdk_tgt v26.05)
                    let port = format!(
                        "{}:{}",
                        p.listen_address.traddr,
                        p.listen_address.trsvcid.as_deref().unwrap_or_default()
                    );
                    let listened = self.subsystems.iter().any(|s| {
                        s.listeners.iter().any(|l| {
                            format!("{}:{}", l.traddr, l.trsvcid.as_deref().unwrap_or_default()) == port
                        })
                    });
                    if !listened {
                        if secure {
                            self.tls_ports.insert(port);
                        } else {
                            self.tls_ports.remove(&port);
                        }
                    }
                    let key = format!(
                        "{}:{}",
                        p.listen_address.traddr,
                        p.listen_address.trsvcid.as_deref().unwrap_or_default()
                    );
                    let sub = &mut self.subsystems[si];
                    match ana {
                        Some(a) if sub.ana_reporting && a != crate::spdk::rpc::AnaState::Optimized => {
                            sub.ana.insert(key, a);
                        }
                        _ => {
                            sub.ana.remove(&key);
                        }
                    }
                    sub.listeners.push(p.listen_address);
                } else {
                    if !exists {
                        return e(INVALID_PARAMS);
                    }
                    // a listener added again is optimized (v26.05)
                    let key = format!(
                        "{}:{}",
                        p.listen_address.traddr,
                        p.listen_address.trsvcid.as_deref().unwrap_or_default()
                    );
                    self.subsystems[si].ana.remove(&key);
                    self.subsystems[si].listeners.retain(|l| !same(l));
                }
                Ok(json!(true))
            }
            "nvmf_subsystem_get_listeners" => {
                let p: ByNqn = decode(params)?;
                let Ok(si) = self.subsys(&p.nqn) else {
                    return fail(-32602, format!("Unable to find subsystem with NQN {}", p.nqn));
                };
                let sub = &self.subsystems[si];
                Ok(Value::Array(
                    sub.listeners
                        .iter()
                        .map(|l| {
                            let key = format!("{}:{}", l.traddr, l.trsvcid.as_deref().unwrap_or_default());
                            let state = sub
                                .ana
                                .get(&key)
                                .copied()
                                .unwrap_or(crate::spdk::rpc::AnaState::Optimized)
                                .as_str();
                            let mut v = json!({"address": l});
                            if sub.ana_reporting {
                                v["ana_states"] = json!([{"ana_group": 1, "ana_state": state}]);
                            }
                            v
                        })
                        .collect(),
                ))
            }
            "nvmf_subsystem_listener_set_ana_state" => {
                let p: ListenerAnaState = decode(params)?;
                let Ok(si) = self.subsys(&p.nqn) else {
                    return fail(-32602, format!("Unable to find subsystem with NQN {}", p.nqn));
                };
                let sub = &mut self.subsystems[si];
                let l = &p.listen_address;
                let listens = sub.listeners.iter().any(|x| {
                    x.trtype.eq_ignore_ascii_case(&l.trtype) && x.traddr == l.traddr && x.trsvcid == l.trsvcid
                });
                if !sub.ana_reporting || !listens {
                    return fail(-32603, "error setting ANA state: -22");
                }
                let key = format!("{}:{}", l.traddr, l.trsvcid.as_deref().unwrap_or_default());
                // v26.05 changes the state with no namespace paused: I/O past
                // the ANA check goes on (see `rpc::ListenerAnaState`)
                for n in &mut sub.namespaces {
                    n.drained = false;
                }
                match p.ana_state {
                    crate::spdk::rpc::AnaState::Optimized => sub.ana.remove(&key),
                    other => sub.ana.insert(key, other),
                };
                Ok(json!(true))
            }
            // v26.05 answers -32602 "Invalid parameters" to every refusal
            // (an unknown subsystem or namespace, a group of 0 or above
            // max_namespaces). The real one pauses the namespace until no I/O
            // is outstanding on it; the double has none in flight.
            "nvmf_subsystem_set_ns_ana_group" => {
                let p: crate::spdk::rpc::SetNsAnaGroup = decode(params)?;
                let Ok(si) = self.subsys(&p.nqn) else {
                    return e(INVALID_PARAMS);
                };
                let sub = &mut self.subsystems[si];
                if p.anagrpid == 0 || p.anagrpid > sub.max_namespaces {
                    return e(INVALID_PARAMS);
                }
                let Some(ns) = sub.namespaces.iter_mut().find(|n| n.nsid == p.nsid) else {
                    return e(INVALID_PARAMS);
                };
                ns.anagrpid = p.anagrpid;
                ns.drained = true;
                Ok(json!(true))
            }
            "nvmf_subsystem_allow_any_host" => {
                let p: crate::spdk::rpc::AllowAnyHost = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                self.subsystems[si].allow_any_host = p.allow_any_host;
                Ok(json!(true))
            }
            // nvmf_rpc.c, rpc_nvmf_subsystem_add_host (relaxed decode): a key the keyring
            // lacks is "Invalid parameters"; a host listed already, or a controller key
            // without a host key, fails spdk_nvmf_subsystem_add_host_ext: "Internal error"
            "nvmf_subsystem_add_host" => {
                let p: SubsystemHostKeys = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                for k in [&p.dhchap_key, &p.dhchap_ctrlr_key].into_iter().flatten() {
                    if !self.keys.contains_key(k) {
                        return e(INVALID_PARAMS);
                    }
                }
                let sub = &mut self.subsystems[si];
                if sub.hosts.contains(&p.host) || (p.dhchap_key.is_none() && p.dhchap_ctrlr_key.is_some()) {
                    return fail(-32603, "Internal error");
                }
                // tcp.c, nvmf_tcp_subsystem_add_host: an unknown PSK fails the add
                if let Some(psk) = &p.psk {
                    if !self.keys.contains_key(psk) {
                        return fail(-32603, "Internal error");
                    }
                    let sub = &mut self.subsystems[si];
                    sub.host_psks.insert(p.host.clone(), psk.clone());
                }
                let sub = &mut self.subsystems[si];
                if p.dhchap_key.is_some() {
                    sub.host_keys
                        .insert(p.host.clone(), (p.dhchap_key, p.dhchap_ctrlr_key));
                }
                sub.hosts.push(p.host);
                Ok(json!(true))
            }
            "nvmf_subsystem_remove_host" => {
                let p: SubsystemHostParams = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                let sub = &mut self.subsystems[si];
                if !sub.hosts.contains(&p.host) {
                    return e(INVALID_PARAMS);
                }
                sub.hosts.retain(|h| h != &p.host);
                sub.host_keys.remove(&p.host);
                sub.host_psks.remove(&p.host);
                Ok(json!(true))
            }
            // nvmf_rpc.c, rpc_nvmf_subsystem_set_keys: unknown key "Invalid parameters";
            // spdk_nvmf_subsystem_set_keys: a host not listed, or a controller key
            // without a host key, is -EINVAL sent as is; no key clears both
            "nvmf_subsystem_set_keys" => {
                let p: SubsystemHostKeys = decode(params)?;
                if p.psk.is_some() {
                    return e(INVALID_PARAMS);
                }
                let si = self.subsys(&p.nqn)?;
                for k in [&p.dhchap_key, &p.dhchap_ctrlr_key].into_iter().flatten() {
                    if !self.keys.contains_key(k) {
                        return e(INVALID_PARAMS);
                    }
                }
                let sub = &mut self.subsystems[si];
                if !sub.hosts.contains(&p.host) || (p.dhchap_key.is_none() && p.dhchap_ctrlr_key.is_some()) {
                    return fail(-22, "Invalid argument");
                }
                if p.dhchap_key.is_some() {
                    sub.host_keys.insert(p.host, (p.dhchap_key, p.dhchap_ctrlr_key));
                } else {
                    sub.host_keys.remove(&p.host);
                }
                Ok(json!(true))
            }
            "nvmf_subsystem_get_controllers" => {
                let p: ByNqn = decode(params)?;
                let si = self.subsys(&p.nqn)?;
                Ok(Value::Array(
                    self.subsystems[si]
                        .controllers
                        .iter()
                        .map(|(cntlid, hostnqn, hostid)| {
                            json!({"cntlid": cntlid, "cntrltype": "io",
                            "hostnqn": hostnqn, "hostid": hostid, "num_io_qpairs": 1})
                        })
                        .collect(),
                ))
            }
            "bdev_nvme_set_options" => {
                // the params v26.05 decodes (its `framework_get_config bdev` lists them); any
                // other field, or a keep-alive that is not a u32, fails decoding
                let Some(Value::Object(p)) = params else {
                    return fail(-32603, "spdk_json_decode_object failed");
                };
                let keep_alive = p
                    .get("keep_alive_timeout_ms")
                    .map(|v| v.as_u64().and_then(|ms| u32::try_from(ms).ok()));
                if p.keys().any(|k| !NVME_OPTIONS.contains(&k.as_str())) || keep_alive == Some(None) {
                    return fail(-32603, "spdk_json_decode_object failed");
                }
                // a global option: taken only before the first controller (recorded)
                if !self.ctrlrs.is_empty() {
                    return fail(-1, "RPC not permitted with nvme controllers already attached");
                }
                if let Some(Some(ms)) = keep_alive {
                    self.nvme_keep_alive_ms = Some(ms);
                }
                Ok(json!(true))
            }
            // qpairs and admin queue go; the double has neither: only the name is checked
            "bdev_nvme_disable_controller" => {
                let p: ByName = decode(params)?;
                if !self.ctrlrs.iter().any(|c| c.name == p.name) {
                    return e(ENODEV);
                }
                Ok(json!(true))
            }
            "bdev_nvme_send_cmd" => self.nvme_send_cmd(params),
            "bdev_nvme_get_controllers" => {
                let p: GetControllers = decode(params)?;
                let list: Vec<Value> = self
                    .ctrlrs
                    .iter()
                    .filter(|c| p.name.as_ref().is_none_or(|n| n == &c.name))
                    .map(|c| {
                        json!({"name": c.name, "ctrlrs": [{
                            "state": "enabled", "trid": c.trid, "host": {"nqn": c.host},
                        }]})
                    })
                    .collect();
                if p.name.is_some() && list.is_empty() {
                    return e(ENODEV);
                }
                Ok(Value::Array(list))
            }
            _ => fail(-32601, "Method not found"),
        }
    }
}

/// SPDK's answer to a `bdev_nvme_send_cmd` it cannot decode or route.
const INVALID_ARGUMENT: (i64, &str) = (-32602, "Invalid argument");

/// The most an NVMe Read moves here (the max_io_size its transports report).
const MAX_TRANSFER: u64 = 131_072;

impl State {
    /// `bdev_nvme_send_cmd`: NVMe Reads of a controller's namespace 1.
    fn nvme_send_cmd(&mut self, params: &Option<Value>) -> RpcResult {
        use base64::Engine;
        let b64 = base64::engine::GeneralPurpose::new(
            &base64::alphabet::URL_SAFE,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        let p: NvmeSendCmd = decode(params).or_else(|_| e(INVALID_ARGUMENT))?;
        if !matches!(p.cmd_type.as_str(), "admin" | "io")
            || !matches!(p.data_direction.as_str(), "c2h" | "h2c")
        {
            return e(INVALID_ARGUMENT);
        }
        let sqe: [u8; 64] = match b64.decode(&p.cmdbuf).ok().and_then(|v| v.try_into().ok()) {
            Some(s) => s,
            None => return e(INVALID_ARGUMENT),
        };
        let Some(c) = self.ctrlrs.iter().find(|c| c.name == p.name) else {
            return e(INVALID_ARGUMENT);
        };
        // (sct, sc, dnr) of the completion, and the data read
        let complete = |sc: u8, dnr: bool, data: Option<Vec<u8>>| {
            let mut cpl = [0u8; 16];
            cpl[10] = u8::from(p.cmd_type == "io");
            let status = (u16::from(sc) | (u16::from(dnr) << 14)) << 1;
            cpl[14..16].copy_from_slice(&status.to_le_bytes());
            let mut r = json!({"cpl": b64_padded(&cpl)});
            if let Some(d) = data {
                r["data"] = json!(b64_padded(&d));
            }
            Ok(r)
        };
        if p.cmd_type != "io" || sqe[0] != 0x02 {
            return complete(0x01, true, None);
        }
        let nsid = u32::from_le_bytes(sqe[4..8].try_into().unwrap_or_default());
        let Some(bdev) = c.bdevs.first().and_then(|b| self.find(b)).map(|i| &self.bdevs[i]) else {
            return complete(0x0b, true, None);
        };
        if nsid != 1 {
            return complete(0x0b, true, None);
        }
        let slba = u64::from_le_bytes(sqe[40..48].try_into().unwrap_or_default());
        let nlb = u64::from(u16::from_le_bytes([sqe[48], sqe[49]])) + 1;
        let bs = u64::from(bdev.block_size);
        let data_len = u64::from(p.data_len.unwrap_or(0));
        if slba.saturating_add(nlb) > bdev.num_blocks {
            return complete(0x80, true, None);
        }
        if data_len != nlb * bs {
            return complete(0x0f, false, None);
        }
        if data_len > MAX_TRANSFER {
            return complete(0x08, false, None);
        }
        let traddr = c.trid["traddr"].as_str().unwrap_or_default();
        let pcie = c.trid["trtype"].as_str() == Some("PCIe");
        let data = match self.pci.get(traddr) {
            Some(d) if pcie => d.read(slba * bs, data_len),
            _ => vec![0u8; data_len as usize],
        };
        complete(0, false, Some(data))
    }

    /// How many users hold key `name`: subsystem hosts (DH-HMAC-CHAP keys, PSK)
    /// and NVMe controllers attached with it.
    fn key_users(&self, name: &str) -> i64 {
        let mut n = 0;
        for sub in &self.subsystems {
            for (k, c) in sub.host_keys.values() {
                n += i64::from(k.as_deref() == Some(name)) + i64::from(c.as_deref() == Some(name));
            }
            n += sub.host_psks.values().filter(|p| *p == name).count() as i64;
        }
        for c in &self.ctrlrs {
            n += c.keys.iter().filter(|k| *k == name).count() as i64;
        }
        n
    }

    /// The file keyring (`module/keyring/file`, `lib/keyring/keyring.c` of v26.05).
    pub(super) fn call_keyring(&mut self, method: &str, params: &Option<Value>) -> RpcResult {
        match method {
            "keyring_file_add_key" => {
                let p: KeyringFileKey = decode(params)?;
                if p.name.find(':').is_some_and(|i| i > 0) {
                    return fail(-22, "Invalid argument");
                }
                if self.keys.contains_key(&p.name) {
                    return e(EEXIST);
                }
                if !p.path.starts_with('/') {
                    return fail(-1, "Operation not permitted");
                }
                let m = match std::fs::metadata(&p.path) {
                    Ok(m) => m,
                    Err(err) => {
                        let errno = i64::from(err.raw_os_error().unwrap_or(libc::EIO));
                        let msg = std::io::Error::from_raw_os_error(errno as i32).to_string();
                        let msg = msg.split(" (os error").next().unwrap_or_default().to_owned();
                        return fail(-errno, msg);
                    }
                };
                use std::os::unix::fs::MetadataExt;
                if m.mode() & 0o077 != 0 || m.uid() != nix::unistd::getuid().as_raw() {
                    return fail(-1, "Operation not permitted");
                }
                self.keys.insert(p.name, PathBuf::from(p.path));
                Ok(json!(true))
            }
            "keyring_file_remove_key" => {
                let p: ByName = decode(params)?;
                let Some(path) = self.keys.remove(&p.name) else {
                    return fail(-126, "Required key not available");
                };
                // a key in use stays until its users let go (they keep working)
                if self.key_users(&p.name) > 0 {
                    self.removed_keys.insert(p.name, path);
                }
                Ok(json!(true))
            }
            "keyring_get_keys" => {
                let users: Vec<_> = self
                    .removed_keys
                    .keys()
                    .map(|n| (n.clone(), self.key_users(n)))
                    .collect();
                for (n, u) in users {
                    if u == 0 {
                        self.removed_keys.remove(&n);
                    }
                }
                let live = self.keys.iter().map(|(n, p)| {
                    json!({"name": n, "module": "keyring_file", "removed": false,
                    "probed": false, "refcnt": 1 + self.key_users(n), "path": p})
                });
                // a removed key shows no module info (no path), as keyring_dump_key_info
                let removed = self.removed_keys.keys().map(|n| {
                    json!({"name": n, "module": "keyring_file", "removed": true,
                    "probed": false, "refcnt": self.key_users(n)})
                });
                Ok(Value::Array(live.chain(removed).collect()))
            }
            _ => fail(-32601, "Method not found"),
        }
    }
}

/// The params `bdev_nvme_set_options` of v26.05 decodes (those its
/// `framework_get_config bdev` reports).
const NVME_OPTIONS: &[&str] = &[
    "action_on_timeout",
    "timeout_us",
    "timeout_admin_us",
    "keep_alive_timeout_ms",
    "arbitration_burst",
    "low_priority_weight",
    "medium_priority_weight",
    "high_priority_weight",
    "nvme_adminq_poll_period_us",
    "nvme_ioq_poll_period_us",
    "io_queue_requests",
    "delay_cmd_submit",
    "transport_retry_count",
    "bdev_retry_count",
    "transport_ack_timeout",
    "ctrlr_loss_timeout_sec",
    "reconnect_delay_sec",
    "fast_io_fail_timeout_sec",
    "disable_auto_failback",
    "generate_uuids",
    "transport_tos",
    "nvme_error_stat",
    "rdma_srq_size",
    "io_path_stat",
    "allow_accel_sequence",
    "rdma_max_cq_size",
    "rdma_cm_event_timeout_ms",
    "dhchap_digests",
    "dhchap_dhgroups",
    "rdma_umr_per_io",
    "tcp_connect_timeout_ms",
    "enable_flush",
    "multipath_opts",
];
