//! The NVMe-oF side of [`VolumeOps`]: a volume's export (subsystem,
//! namespace, listener, hosts and their DH-HMAC-CHAP keys, TLS PSK), an
//! export made again over the bdev that serves now, a replica exported to
//! another node's engine and another node's replica attached here.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::plan::{self, LvolNotes, Make, check_len};
use super::{
    ExportSpec, Inventory, MIB, Made, NSID, ReplicaInfo, VolumeError, VolumeInfo, VolumeOps, VolumePlan,
    ignore_missing, naming, no_placement, rpc,
};
use crate::names::{Nqn, ObjectName, volume_uuid};
use crate::spdk::client::ClientError;
use crate::spdk::error::ErrorKind;
use crate::spdk::placement::Blocked;
use crate::spdk::rpc::{
    AddNamespace, AllowAnyHost, AnaState, AttachController, ByName, CreateSubsystem, KeyringFileKey,
    ListenAddress, ListenerAnaState, RaidDelete, RemoveNamespace, SecureListener, SubsystemHostKeys,
    SubsystemHostParams, SubsystemListener,
};
use crate::util::nvme_auth::{self as dhchap, DhchapSecret, Secret, TlsPsk};

/// A failed `nvmf_subsystem_add_listener`: named [`VolumeError::PortInUse`]
/// when another process listens on the port (SPDK says only "Invalid
/// parameters"; its bind error is in its log).
/// `target` is spdk_tgt's pid (its own listeners on the port are no conflict).
fn listener_error(
    volume: &str,
    address: &str,
    port: u16,
    target: Option<i32>,
    source: ClientError,
) -> VolumeError {
    let except = target.and_then(|p| u32::try_from(p).ok());
    let holder = address.parse::<IpAddr>().ok().and_then(|ip| {
        crate::host::net::port_holder(&crate::host::HostRoot::real(), (ip, port).into(), except)
    });
    match holder {
        Some(holder) => VolumeError::PortInUse {
            volume: volume.to_owned(),
            listen: format!("{address}:{port}"),
            holder,
            source: Box::new(source),
        },
        None => rpc(volume, format!("listening on {address}:{port}"))(source),
    }
}

/// The subsystem an [`Export`] makes when it is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSubsystem {
    /// Its model number.
    pub model: String,
    /// Its serial number (`None`: SPDK's default).
    pub serial: Option<String>,
    /// ANA reporting: a snapshot can then freeze it (its listeners
    /// inaccessible) while the host waits instead of failing.
    pub ana: bool,
    /// The controller IDs it hands out, lowest and highest (`None`: all of
    /// SPDK's): exports of one subsystem on two nodes (two engines of one
    /// volume) must hand out disjoint IDs, or a host that connects to both
    /// refuses the second path as a duplicate controller.
    pub cntlid: Option<(u16, u16)>,
    /// The ANA state its listener is added in (with `ana`; `None`:
    /// SPDK's, optimized): an engine a host has left stays so when its
    /// export is made again (`EngineSetTargetListenerANAState`).
    pub listener_ana: Option<AnaState>,
}

impl NewSubsystem {
    pub(super) fn create(&self, nqn: &Nqn) -> CreateSubsystem {
        CreateSubsystem {
            nqn: nqn.as_str().to_owned(),
            allow_any_host: Some(false),
            serial_number: self.serial.clone(),
            model_number: Some(self.model.clone()),
            max_namespaces: Some(1),
            ana_reporting: self.ana.then_some(true),
            min_cntlid: self.cntlid.map(|c| c.0),
            max_cntlid: self.cntlid.map(|c| c.1),
        }
    }
}

/// One NVMe-oF export under any naming scheme (talon's volumes and served
/// replicas, Longhorn's engines and replicas): subsystem `nqn`, made as
/// `subsystem` says when missing, with `bdev` as its one namespace
/// (identity `ns_uuid`), listening and admitting exactly the hosts `spec`
/// gives (with their keys).
#[derive(Debug, Clone)]
pub struct Export<'a> {
    /// The subsystem.
    pub nqn: &'a Nqn,
    /// What it serves: a bdev name, or an lvol's alias `lvs/name`.
    pub bdev: &'a str,
    /// The namespace's UUID (and NGUID): what a host knows it by.
    pub ns_uuid: uuid::Uuid,
    /// The subsystem, when it has to be made.
    pub subsystem: NewSubsystem,
    /// Listener, hosts, keys.
    pub spec: &'a ExportSpec,
    /// The subsystem listens on the spec's address only: another listener
    /// (the plain port before TLS was turned on, or the TLS port after it
    /// was turned off) is removed, so no other path stays. Always so with TLS.
    pub only_listener: bool,
}

/// A remote replica to attach: NVMe/TCP controller `controller` to
/// subsystem `nqn` at `address:port`.
#[derive(Debug, Clone)]
pub struct RemoteAttach<'a> {
    /// The controller's name (its bdev is `<controller>n1`).
    pub controller: &'a str,
    /// The replica's node.
    pub address: IpAddr,
    /// Its port.
    pub port: u16,
    /// The replica's subsystem.
    pub nqn: &'a str,
    /// The host NQN this node connects as (`None`: SPDK's own).
    pub host_nqn: Option<String>,
    /// With the link timeouts Longhorn's engines use.
    pub longhorn_link: bool,
    /// `Some(<data-dir>)`: `host_nqn` authenticates with its DH-HMAC-CHAP
    /// secret from `<data-dir>/nvme-dhchap/` (made when it is this node's
    /// and absent).
    pub dhchap_data_dir: Option<&'a std::path::Path>,
    /// `Some(<data-dir>)`: over NVMe/TCP TLS with `host_nqn`'s PSK from
    /// `<data-dir>/nvme-tls/`.
    pub tls_data_dir: Option<&'a std::path::Path>,
}

impl<'a> RemoteAttach<'a> {
    /// A Longhorn replica's subsystem `nqn` at `at`, attached as controller
    /// `controller` the way Longhorn's engines attach it: as the internal
    /// host NQN, with their link timeouts.
    pub fn longhorn(controller: &'a str, at: std::net::SocketAddr, nqn: &'a str) -> Self {
        Self {
            controller,
            address: at.ip(),
            port: at.port(),
            nqn,
            host_nqn: Some(crate::spdk::naming::longhorn::internal_host_nqn()),
            longhorn_link: true,
            dhchap_data_dir: None,
            tls_data_dir: None,
        }
    }
}

impl VolumeOps {
    /// Exports as `e` says, in one target: the TCP transport, the subsystem
    /// (when missing), the namespace (replacing another bdev there), the
    /// listener and exactly the hosts. Idempotent; what it made is undone
    /// when a step fails. Errors name `vol`.
    pub async fn export(&self, inv: &Inventory, vol: &str, e: &Export<'_>) -> Result<(), VolumeError> {
        let mut made = Vec::new();
        let r = self.export_in(inv, vol, e, &mut made).await;
        if r.is_err() {
            self.undo(made).await;
        }
        r
    }

    /// Takes subsystem `nqn` away (its hosts lose their connections);
    /// nothing to do when it is not there.
    pub async fn unexport(&self, vol: &str, nqn: &str) -> Result<(), VolumeError> {
        ignore_missing(
            self.client
                .nvmf_delete_subsystem(&crate::spdk::rpc::ByNqn { nqn: nqn.into() }),
        )
        .await
        .map_err(rpc(vol, format!("deleting subsystem {nqn}")))
    }

    /// Closes export `nqn` for a moment (a switch of what it serves): its
    /// listeners and namespace go, so hosts' connections drop and their I/O
    /// waits for the reconnect; the subsystem and its hosts stay for
    /// [`Self::export`] to open it again.
    pub async fn close_export(&self, inv: &Inventory, vol: &str, nqn: &str) -> Result<(), VolumeError> {
        let Some(sub) = inv.subsystem(nqn) else {
            return Ok(());
        };
        for l in &sub.listen_addresses {
            ignore_missing(self.client.nvmf_subsystem_remove_listener(&SubsystemListener {
                nqn: nqn.to_owned(),
                listen_address: l.clone(),
            }))
            .await
            .map_err(rpc(
                vol,
                format!(
                    "closing listener {}:{} of {nqn}",
                    l.traddr,
                    l.trsvcid.as_deref().unwrap_or_default()
                ),
            ))?;
        }
        for n in &sub.namespaces {
            ignore_missing(self.client.nvmf_subsystem_remove_ns(&RemoveNamespace {
                nqn: nqn.to_owned(),
                nsid: n.nsid,
            }))
            .await
            .map_err(rpc(vol, format!("removing the namespace of {nqn}")))?;
        }
        Ok(())
    }

    /// [`Self::export`], what it made pushed on `made` for the caller.
    pub(super) async fn export_in(
        &self,
        inv: &Inventory,
        vol: &str,
        e: &Export<'_>,
        made: &mut Vec<Made>,
    ) -> Result<(), VolumeError> {
        if !inv.tcp_transport {
            self.ensure_transport()
                .await
                .map_err(rpc(vol, "creating the TCP transport"))?;
        }
        if inv.subsystem(e.nqn.as_str()).is_none() {
            self.client
                .nvmf_create_subsystem(&e.subsystem.create(e.nqn))
                .await
                .map_err(rpc(vol, format!("creating subsystem {}", e.nqn)))?;
            made.push(Made::Subsystem(e.nqn.as_str().to_owned()));
        }
        self.export_ns(inv, vol, e, made).await
    }

    /// Puts `e.bdev` as namespace 1 of the existing subsystem `e.nqn`
    /// (replacing another bdev there), with its listener and exactly the
    /// allowed hosts.
    pub(super) async fn export_ns(
        &self,
        inv: &Inventory,
        vol: &str,
        e: &Export<'_>,
        made: &mut Vec<Made>,
    ) -> Result<(), VolumeError> {
        let (nqn, device, id, export) = (e.nqn, e.bdev, e.ns_uuid, e.spec);
        let sub = inv.subsystem(nqn.as_str());
        let ns = sub.and_then(|s| s.namespaces.iter().find(|n| n.nsid == NSID));
        // SPDK lists a namespace by its bdev's name: an lvol's is its UUID
        let device_uuid = inv.lvols.get(device).map(|l| l.uuid.as_str());
        let serves = |ns: &crate::spdk::rpc::SubsystemNamespace| {
            ns.bdev_name == device || Some(ns.bdev_name.as_str()) == device_uuid
        };
        if let Some(ns) = ns
            && !serves(ns)
        {
            self.client
                .nvmf_subsystem_remove_ns(&RemoveNamespace {
                    nqn: nqn.as_str().to_owned(),
                    nsid: NSID,
                })
                .await
                .map_err(rpc(vol, format!("replacing the namespace of {nqn}")))?;
        }
        if ns.is_none_or(|ns| !serves(ns)) {
            let mut p = AddNamespace::with_id(nqn.as_str(), device, id);
            p.namespace.nsid = Some(NSID);
            self.client
                .nvmf_subsystem_add_ns(&p)
                .await
                .map_err(rpc(vol, format!("adding bdev {device} to {nqn}")))?;
            made.push(Made::Namespace(nqn.as_str().to_owned()));
        }
        let listen = ListenAddress::tcp(export.address, export.port);
        let has_listener = sub.is_some_and(|s| {
            s.listen_addresses
                .iter()
                .any(|l| l.traddr == listen.traddr && l.trsvcid == listen.trsvcid)
        });
        // TLS (served replicas only): the port is TLS as a whole; a
        // listener elsewhere (the plain port before TLS was turned on, or the
        // TLS port after it was turned off) is removed, so no other path stays
        let tls = export.tls_data_dir.is_some();
        if tls || e.only_listener {
            let stale: Vec<ListenAddress> = sub
                .map(|s| {
                    s.listen_addresses
                        .iter()
                        .filter(|l| !(l.traddr == listen.traddr && l.trsvcid == listen.trsvcid))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            for l in stale {
                self.client
                    .nvmf_subsystem_remove_listener(&SubsystemListener {
                        nqn: nqn.as_str().to_owned(),
                        listen_address: l.clone(),
                    })
                    .await
                    .map_err(rpc(
                        vol,
                        format!(
                            "removing listener {}:{} of {nqn}",
                            l.traddr,
                            l.trsvcid.as_deref().unwrap_or_default()
                        ),
                    ))?;
            }
        }
        // a host listed before the TLS listener was made has no PSK (SPDK
        // does not report one): listed again with it
        let relist = tls && !has_listener;
        if relist && sub.is_some_and(|s| s.allow_any_host) {
            self.client
                .nvmf_subsystem_allow_any_host(&AllowAnyHost {
                    nqn: nqn.as_str().to_owned(),
                    allow_any_host: false,
                })
                .await
                .map_err(rpc(vol, format!("allowing only listed hosts on {nqn}")))?;
        }
        if !has_listener {
            let added = if tls {
                self.client
                    .nvmf_subsystem_add_listener_secure(&SecureListener {
                        nqn: nqn.as_str().to_owned(),
                        listen_address: listen.clone(),
                        secure_channel: true,
                    })
                    .await
            } else if let Some(ana_state) = e.subsystem.listener_ana.filter(|_| e.subsystem.ana) {
                self.client
                    .nvmf_subsystem_add_listener_ana(&ListenerAnaState {
                        nqn: nqn.as_str().to_owned(),
                        listen_address: listen.clone(),
                        ana_state,
                    })
                    .await
            } else {
                self.client
                    .nvmf_subsystem_add_listener(&SubsystemListener {
                        nqn: nqn.as_str().to_owned(),
                        listen_address: listen.clone(),
                    })
                    .await
            };
            match added {
                Ok(_) => made.push(Made::Listener(nqn.as_str().to_owned(), listen)),
                // listed since the listing this works from
                Err(source) if source.is(ErrorKind::AlreadyExists) => {}
                Err(source) => {
                    let target = crate::spdk::launch::socket_peer_pid(self.client.socket()).await;
                    return Err(listener_error(vol, &listen.traddr, export.port, target, source));
                }
            }
        }
        // exports made before access control allowed any host
        if sub.is_some_and(|s| s.allow_any_host) {
            self.client
                .nvmf_subsystem_allow_any_host(&AllowAnyHost {
                    nqn: nqn.as_str().to_owned(),
                    allow_any_host: false,
                })
                .await
                .map_err(rpc(vol, format!("allowing only listed hosts on {nqn}")))?;
        }
        let mut have: BTreeSet<&str> = sub
            .map(|s| s.hosts.iter().map(|h| h.nqn.as_str()).collect())
            .unwrap_or_default();
        // with DH-HMAC-CHAP every host is listed with its key, and only then;
        // with TLS, with its PSK
        let keys = match &export.dhchap_data_dir {
            Some(d) => Some(self.host_keys::<DhchapSecret>(vol, d, &export.hosts).await?),
            None => None,
        };
        let psks = match &export.tls_data_dir {
            Some(d) => Some(self.host_keys::<TlsPsk>(vol, d, &export.hosts).await?),
            None => None,
        };
        let key_of = |h: &str| keys.as_ref().and_then(|k| k.get(h).cloned());
        if relist {
            for h in std::mem::take(&mut have) {
                self.client
                    .nvmf_subsystem_remove_host(&SubsystemHostParams {
                        nqn: nqn.as_str().to_owned(),
                        host: h.to_owned(),
                    })
                    .await
                    .map_err(rpc(vol, format!("listing host {h} on {nqn} again with its PSK")))?;
            }
        }
        // each host in its own call, all at once: adding one is synchronous
        // in spdk_tgt (a list under the subsystem's lock)
        let (key_of, psks) = (&key_of, &psks);
        futures::future::try_join_all(export.hosts.iter().filter(|h| !have.contains(h.as_str())).map(
            |h| async move {
                let added = self
                    .client
                    .nvmf_subsystem_add_host_keys(&SubsystemHostKeys {
                        nqn: nqn.as_str().to_owned(),
                        host: h.clone(),
                        dhchap_key: key_of(h),
                        dhchap_ctrlr_key: None,
                        psk: psks.as_ref().and_then(|k| k.get(h.as_str()).cloned()),
                    })
                    .await;
                match added {
                    // listed since the listing this works from
                    Err(e) if e.is(ErrorKind::AlreadyExists) && !relist => Ok(()),
                    r => r
                        .map(|_| ())
                        .map_err(rpc(vol, format!("allowing host {h} on {nqn}"))),
                }
            },
        ))
        .await?;
        // hosts listed before DH-HMAC-CHAP was turned on (or off, or with another key)
        for h in sub
            .map(|s| s.hosts.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|_| !relist)
        {
            let want = key_of(&h.nqn);
            if export.hosts.contains(&h.nqn) && (h.dhchap_key != want || h.dhchap_ctrlr_key.is_some()) {
                self.client
                    .nvmf_subsystem_set_keys(&SubsystemHostKeys {
                        nqn: nqn.as_str().to_owned(),
                        host: h.nqn.clone(),
                        dhchap_key: want,
                        dhchap_ctrlr_key: None,
                        psk: None,
                    })
                    .await
                    .map_err(rpc(
                        vol,
                        format!("setting the DH-HMAC-CHAP key of host {} on {nqn}", h.nqn),
                    ))?;
            }
        }
        // the keys hosts held here before: freed from the keyring below when
        // nothing else uses them
        let mut dropped: BTreeSet<String> = BTreeSet::new();
        for h in sub.map(|s| s.hosts.as_slice()).unwrap_or_default() {
            let removed = !export.hosts.contains(&h.nqn);
            let want = key_of(&h.nqn);
            for k in [&h.dhchap_key, &h.dhchap_ctrlr_key].into_iter().flatten() {
                if removed || want.as_ref() != Some(k) {
                    dropped.insert(k.clone());
                }
            }
            if removed {
                dropped.insert(dhchap::keyring_name::<TlsPsk>(&h.nqn));
            }
        }
        // a host no longer allowed loses access, and SPDK ends its connections
        for h in have.iter().filter(|h| !export.hosts.iter().any(|x| x == *h)) {
            super::lvol::disallow_host(&self.client, nqn.as_str(), h)
                .await
                .map_err(rpc(vol, format!("disallowing host {h} on {nqn}")))?;
        }
        if !dropped.is_empty() {
            self.release_unused_keys(vol, &dropped).await;
        }
        Ok(())
    }

    /// Removes from the target's keyring each key of `names` that nothing
    /// uses any more (refcnt 1: only the keyring's own reference), so a host
    /// taken off every export leaves no key behind. A key still used (the
    /// host is listed on another export, a controller attached with it) stays.
    /// The secret files stay: they are the node's credentials (its own, or
    /// copies the operator placed), read again if the host comes back.
    /// Best effort: a failure is logged, the export stands.
    pub(super) async fn release_unused_keys(&self, vol: &str, names: &BTreeSet<String>) {
        let keys = match self.client.keyring_get_keys().await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(volume = vol, error = %e, "cannot list the keyring to release unused host keys");
                return;
            }
        };
        for k in keys
            .iter()
            .filter(|k| names.contains(&k.name) && !k.removed && k.refcnt == Some(1))
        {
            match self
                .client
                .keyring_file_remove_key(&ByName { name: k.name.clone() })
                .await
            {
                Ok(_) => {
                    tracing::info!(volume = vol, key = %k.name, "host key no longer used: removed from the keyring")
                }
                Err(e) => {
                    tracing::warn!(volume = vol, key = %k.name, error = %e, "cannot remove an unused host key from the keyring")
                }
            }
        }
    }

    /// Keeps replica `k` of a volume whose engine runs on another node: the
    /// thin lvol `<vol>-r<k>` (made on the disk with the most free space, or
    /// waited for on the disk it was placed on), grown to the size, and
    /// exported as `Nqn::for_replica(vol, "r<k>")` with an NGUID/UUID derived
    /// from the replica, on the node's listener, to the allowed hosts. Rolls
    /// back what it made when a step fails.
    pub async fn ensure_served(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        k: usize,
    ) -> Result<VolumeInfo, VolumeError> {
        let mut made = Vec::new();
        match self.ensure_served_inner(inv, plan, k, &mut made).await {
            Ok(i) => Ok(i),
            Err(e) => {
                self.undo(made).await;
                Err(e)
            }
        }
    }

    pub(super) async fn ensure_served_inner(
        &self,
        inv: &Inventory,
        plan: &VolumePlan,
        k: usize,
        made: &mut Vec<Made>,
    ) -> Result<VolumeInfo, VolumeError> {
        let vol = plan.name.as_str();
        let name = naming::replica(vol, k);
        check_len(vol, &name)?;
        let nqn = Nqn::for_replica(&plan.name, &format!("r{k}")).map_err(|source| VolumeError::BadName {
            volume: vol.to_owned(),
            source,
        })?;
        let mut info = VolumeInfo {
            device: String::new(),
            size_bytes: 0,
            nqn: nqn.as_str().to_owned(),
            replicas: Vec::new(),
            wanted: 1,
            waiting: Vec::new(),
            in_sync: BTreeSet::new(),
            notes: LvolNotes::default(),
            rebuilding: None,
            stale: Vec::new(),
            unplaced: None,
            export_next: false,
        };
        // the lvol: the same pure plan as the engine's replicas, for k alone
        let lp = plan::local_for(inv, plan, &[k], plan.superblock)?;
        if let Some(w) = lp.waiting.first() {
            info.waiting.push(w.clone());
            return Ok(info);
        }
        let Some(r) = lp.replicas.iter().find(|r| r.k == k) else {
            let b = lp.unplaced.unwrap_or_else(|| Blocked {
                replicas: vec![k],
                reason: format!("replica r{k} has no disk"),
                disk_failed: false,
                other_block_size: false,
            });
            return Err(no_placement(vol, &b));
        };
        let (disk, alias) = (r.disk.clone(), r.alias.clone());
        let cluster = inv.lvstore(&disk).map_or(MIB, |s| s.cluster_size);
        let (bdev, allocated) = match (&r.make, inv.lvols.get(&alias)) {
            (None, Some(l)) => (l.uuid.clone(), l.num_allocated_clusters.saturating_mul(cluster)),
            (make, _) => {
                // a served replica starts thin and empty (its engine rebuilds it)
                let mib = match make {
                    Some(Make::Thin { mib }) => *mib,
                    _ => lp.wanted[&k].div_ceil(MIB),
                };
                let uuid = self.make_replica(vol, &disk, &name, &Make::Thin { mib }).await?;
                made.push(Made::Lvol(alias.clone()));
                // exported from the next call: the engine node compares the
                // lvol it attached with the one this replica's status names
                // (a replica made again on a new disk is never trusted), and
                // that status is written when this pass ends
                info.export_next = true;
                info.replicas.push(ReplicaInfo {
                    k,
                    name,
                    disk,
                    bdev: uuid,
                    alias,
                    size_bytes: mib.saturating_mul(MIB),
                    allocated_bytes: 0,
                });
                return Ok(info);
            }
        };
        let want = lp.wanted[&k];
        let size = if r.size_bytes < want {
            let mib = want.div_ceil(MIB);
            super::lvol::resize(&self.client, &alias, mib)
                .await
                .map_err(rpc(vol, format!("resizing replica {alias} to {mib} MiB")))?;
            want
        } else {
            r.size_bytes
        };
        // the engine's raid superblock is in this lvol: SPDK's examine (this
        // target restarted) made a `configuring` raid of it here, which claims
        // it. That raid is the engine node's, not this one's: it goes, and the
        // superblock stays for the engine
        let raid = naming::raid(vol);
        if inv.raid(&raid).is_some_and(|r| {
            r.state == "configuring"
                && r.base_bdevs_list
                    .iter()
                    .any(|b| b.name.as_deref() == Some(bdev.as_str()))
        }) {
            ignore_missing(self.client.bdev_raid_delete(&RaidDelete::new(&raid)))
                .await
                .map_err(rpc(
                    vol,
                    format!("releasing {alias} from the raid {raid} its superblock made here"),
                ))?;
        }
        let id = uuid::Uuid::new_v5(&volume_uuid(&plan.name), format!("r{k}").as_bytes());
        self.export_replica_in(inv, vol, &nqn, &bdev, id, &plan.export, made)
            .await?;
        info.device = bdev.clone();
        // what the engine gets: the lvol less its superblock's room
        info.size_bytes = size.saturating_sub(r.room);
        info.in_sync.insert(k);
        info.replicas.push(ReplicaInfo {
            k,
            name,
            disk,
            bdev,
            alias,
            size_bytes: size,
            allocated_bytes: allocated,
        });
        Ok(info)
    }

    /// Exports replica `replica` (bdev `bdev`, an lvol) of `vol` to a remote
    /// engine: subsystem `Nqn::for_replica`, namespace with explicit
    /// NGUID/UUID derived from the replica (so an attach inside the same
    /// target registers a bdev), to exactly `hosts`. Idempotent; rolls back on
    /// error.
    pub async fn export_replica(
        &self,
        vol: &ObjectName,
        replica: &str,
        bdev: &str,
        address: IpAddr,
        port: u16,
        hosts: Vec<String>,
    ) -> Result<String, VolumeError> {
        self.export_replica_as(vol, replica, bdev, ExportSpec::plain(address, port, hosts))
            .await
    }

    /// [`VolumeOps::export_replica`] with the whole export spec (hosts with
    /// DH-HMAC-CHAP when it has `dhchap_data_dir`).
    pub async fn export_replica_as(
        &self,
        vol: &ObjectName,
        replica: &str,
        bdev: &str,
        export: ExportSpec,
    ) -> Result<String, VolumeError> {
        let v = vol.as_str();
        let nqn = Nqn::for_replica(vol, replica).map_err(|source| VolumeError::BadName {
            volume: v.to_owned(),
            source,
        })?;
        let inv = Inventory::load(&self.client)
            .await
            .map_err(rpc(v, "listing the target"))?;
        let id = uuid::Uuid::new_v5(&volume_uuid(vol), replica.as_bytes());
        let mut made = Vec::new();
        match self
            .export_replica_in(&inv, v, &nqn, bdev, id, &export, &mut made)
            .await
        {
            Ok(()) => Ok(nqn.as_str().to_owned()),
            Err(e) => {
                self.undo(made).await;
                Err(e)
            }
        }
    }

    /// The TCP transport, the replica subsystem `nqn` and its namespace.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn export_replica_in(
        &self,
        inv: &Inventory,
        vol: &str,
        nqn: &Nqn,
        bdev: &str,
        id: uuid::Uuid,
        export: &ExportSpec,
        made: &mut Vec<Made>,
    ) -> Result<(), VolumeError> {
        let e = Export {
            nqn,
            bdev,
            ns_uuid: id,
            subsystem: NewSubsystem {
                model: "talon-replica".into(),
                serial: None,
                ana: false,
                cntlid: None,
                listener_ana: None,
            },
            spec: export,
            only_listener: true,
        };
        self.export_in(inv, vol, &e, made).await
    }

    /// The names of the keys in spdk_tgt's keyring (removed ones left out).
    async fn registered_keys(&self, vol: &str) -> Result<BTreeSet<String>, VolumeError> {
        Ok(self
            .client
            .keyring_get_keys()
            .await
            .map_err(rpc(vol, "listing the keyring"))?
            .into_iter()
            .filter(|k| !k.removed)
            .map(|k| k.name)
            .collect())
    }

    /// The keyring key of each host's DH-HMAC-CHAP secret, registered with
    /// the target's file keyring where it is not yet. This node's own secret
    /// is made when absent; another host's must be there (its file names it).
    pub(super) async fn host_keys<S: Secret>(
        &self,
        vol: &str,
        data_dir: &std::path::Path,
        hosts: &[String],
    ) -> Result<std::collections::BTreeMap<String, String>, VolumeError> {
        let registered = self.registered_keys(vol).await?;
        let mut out = std::collections::BTreeMap::new();
        for h in hosts {
            let name = self.register_key::<S>(vol, data_dir, h, &registered).await?;
            out.insert(h.clone(), name);
        }
        Ok(out)
    }

    /// Checks host `nqn`'s secret file (made when it is this node's own) and
    /// gives it to the target's keyring unless `registered` has it; returns
    /// the key name.
    pub(super) async fn register_key<S: Secret>(
        &self,
        vol: &str,
        data_dir: &std::path::Path,
        nqn: &str,
        registered: &BTreeSet<String>,
    ) -> Result<String, VolumeError> {
        let bad = |source| VolumeError::Dhchap {
            volume: vol.to_owned(),
            source,
        };
        if self.host_nqn.as_deref() == Some(nqn) {
            dhchap::load_or_create::<S>(data_dir, nqn).map_err(bad)?;
        } else {
            dhchap::load::<S>(data_dir, nqn).map_err(bad)?;
        }
        let name = dhchap::keyring_name::<S>(nqn);
        if !registered.contains(&name) {
            let path = dhchap::path::<S>(data_dir, nqn).map_err(bad)?;
            match self
                .client
                .keyring_file_add_key(&KeyringFileKey {
                    name: name.clone(),
                    path: path.display().to_string(),
                })
                .await
            {
                Ok(_) => {}
                Err(e) if e.is(ErrorKind::AlreadyExists) => {}
                Err(e) => {
                    return Err(rpc(
                        vol,
                        format!("giving {} to the target's keyring", path.display()),
                    )(e));
                }
            }
        }
        Ok(name)
    }

    /// Remote replica `a` as an engine's member: its NVMe/TCP bdev
    /// (`<controller>n1`), the one `inv` lists, else attached. A controller
    /// listed without its namespace (the replica's export went, and may be
    /// back under the same NQN) is detached first, so the attach makes it
    /// afresh rather than taking "already attached" for a bdev that is not
    /// there. The one way both engines attach a member.
    pub async fn remote_member(
        &self,
        inv: &Inventory,
        vol: &str,
        a: &RemoteAttach<'_>,
    ) -> Result<String, VolumeError> {
        let bdev = format!("{}n1", a.controller);
        if inv.bdevs.contains_key(&bdev) {
            return Ok(bdev);
        }
        if inv.controllers.iter().any(|c| c == a.controller) {
            super::lvol::detach_controller(&self.client, a.controller)
                .await
                .map_err(rpc(
                    vol,
                    format!("detaching {}, listed without its namespace", a.controller),
                ))?;
        }
        self.attach_remote(vol, a).await
    }

    /// Attaches a talon replica exported by [`VolumeOps::export_replica`]
    /// as this node's host NQN: with `tls_data_dir`, over NVMe/TCP TLS with
    /// its own PSK; with `dhchap_data_dir`, authenticated by its own
    /// DH-HMAC-CHAP secret. Returns its bdev (`<controller>n1`).
    #[allow(clippy::too_many_arguments)]
    pub async fn attach_replica(
        &self,
        vol: &str,
        controller: &str,
        address: IpAddr,
        port: u16,
        nqn: &str,
        dhchap_data_dir: Option<&std::path::Path>,
        tls_data_dir: Option<&std::path::Path>,
    ) -> Result<String, VolumeError> {
        let a = RemoteAttach {
            controller,
            address,
            port,
            nqn,
            host_nqn: self.host_nqn.clone(),
            longhorn_link: false,
            dhchap_data_dir,
            tls_data_dir,
        };
        self.attach_remote(vol, &a).await
    }

    /// Attaches the remote replica `a` says (exported by
    /// [`VolumeOps::export_replica`] or a Longhorn replica's node) with the
    /// keys it names: its bdev (`<controller>n1`); one attached already is
    /// that bdev. A controller with no namespace is detached again.
    pub async fn attach_remote(&self, vol: &str, a: &RemoteAttach<'_>) -> Result<String, VolumeError> {
        let mut dhchap_key = None;
        let mut psk = None;
        if let Some(me) = a.host_nqn.as_deref()
            && (a.dhchap_data_dir.is_some() || a.tls_data_dir.is_some())
        {
            let registered = self.registered_keys(vol).await?;
            if let Some(d) = a.dhchap_data_dir {
                dhchap_key = Some(self.register_key::<DhchapSecret>(vol, d, me, &registered).await?);
            }
            if let Some(d) = a.tls_data_dir {
                psk = Some(self.register_key::<TlsPsk>(vol, d, me, &registered).await?);
            }
        }
        self.attach_keyed(vol, a, dhchap_key, psk).await
    }

    /// After an attach answered "already exists": fine when controller
    /// `a.controller` is the one on `a`'s path; another controller on the
    /// path with the same host NQN (SPDK's -17: one controller per path and
    /// host) is named in the error, so nobody takes `<controller>n1` for a
    /// bdev that is not there.
    async fn attached_already(&self, vol: &str, a: &RemoteAttach<'_>) -> Result<(), VolumeError> {
        let all = self
            .client
            .bdev_nvme_get_controllers(&crate::spdk::rpc::GetControllers::default())
            .await
            .map_err(rpc(vol, "listing the NVMe controllers"))?;
        let port = a.port.to_string();
        let on_path = |c: &crate::spdk::rpc::NvmeController| {
            c.ctrlrs.iter().any(|p| {
                p.trid.subnqn.as_deref() == Some(a.nqn)
                    && p.trid.trsvcid.as_deref() == Some(port.as_str())
                    && p.trid.traddr.parse::<IpAddr>().ok() == Some(a.address)
                    && match (&p.host, &a.host_nqn) {
                        (Some(h), Some(want)) => &h.nqn == want,
                        // a target that does not say: the path alone
                        _ => true,
                    }
            })
        };
        match all.iter().find(|c| on_path(c)) {
            Some(c) if c.name != a.controller => Err(VolumeError::PathHeld {
                volume: vol.to_owned(),
                nqn: a.nqn.to_owned(),
                address: std::net::SocketAddr::new(a.address, a.port).to_string(),
                controller: a.controller.to_owned(),
                holder: c.name.clone(),
            }),
            _ => Ok(()),
        }
    }

    async fn attach_keyed(
        &self,
        vol: &str,
        a: &RemoteAttach<'_>,
        dhchap_key: Option<String>,
        psk: Option<String>,
    ) -> Result<String, VolumeError> {
        let (controller, nqn) = (a.controller, a.nqn);
        let mut p = AttachController {
            hostnqn: a.host_nqn.clone(),
            dhchap_key,
            psk,
            ..AttachController::tcp(controller, a.address, a.port, nqn)
        };
        if a.longhorn_link {
            p = p.with_longhorn_link_timeouts();
        }
        let bdevs = match self.client.bdev_nvme_attach_controller(&p).await {
            Ok(b) => b,
            // this controller already (same name, same path), or another
            // controller of this target on the same path and host NQN
            Err(e) if e.is(ErrorKind::AlreadyExists) => {
                self.attached_already(vol, a).await?;
                vec![format!("{controller}n1")]
            }
            Err(e) => {
                return Err(rpc(vol, format!("attaching {nqn} at {}:{}", a.address, a.port))(
                    e,
                ));
            }
        };
        match bdevs.into_iter().next() {
            Some(b) => Ok(b),
            None => {
                let _ = super::lvol::detach_controller(&self.client, controller).await;
                Err(VolumeError::AttachedNoBdev {
                    volume: vol.to_owned(),
                    nqn: nqn.to_owned(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spdk::SpdkClient;
    use crate::spdk::double::{SpdkDouble, malloc_lvstore};
    use crate::spdk::naming::longhorn::internal_host_nqn;
    use crate::spdk::rpc::LvolCreate;

    /// SPDK keeps one NVMe controller per path and host NQN (a real v26.05
    /// answers a second attach of the path under another name -17 "File
    /// exists"): an attach that meets another controller on its path names
    /// it rather than handing back a `<controller>n1` that is not there (a
    /// thin rebuild's switch took that for a dest that "went before the
    /// switch"); the same controller again is its bdev, and another host NQN
    /// is another path.
    #[tokio::test]
    async fn an_attach_whose_path_another_controller_holds_names_that_controller() {
        let dir = tempfile::tempdir().expect("tempdir");
        let double = SpdkDouble::start(dir.path().join("spdk.sock"))
            .await
            .expect("double");
        let client = SpdkClient::new(double.socket());
        malloc_lvstore(&client, "talon-d").await.expect("lvstore");
        client
            .bdev_lvol_create(&LvolCreate::thin("talon-d", "r", 4))
            .await
            .expect("lvol");
        let ops = VolumeOps::new(client.clone());
        let vol = ObjectName::parse("volume", "pathheld").expect("name");
        let other_host = "nqn.2014-08.io.talon:pathheld-other".to_owned();
        let nqn = ops
            .export_replica(
                &vol,
                "r1",
                "talon-d/r",
                [127, 0, 0, 1].into(),
                4471,
                vec![internal_host_nqn(), other_host.clone()],
            )
            .await
            .expect("export");
        let at: std::net::SocketAddr = "127.0.0.1:4471".parse().expect("address");
        let rb = RemoteAttach::longhorn("rb-x", at, &nqn);
        assert_eq!(ops.attach_remote("v", &rb).await.expect("rb-x"), "rb-xn1");
        assert_eq!(ops.attach_remote("v", &rb).await.expect("rb-x again"), "rb-xn1");
        let x = RemoteAttach::longhorn("x", at, &nqn);
        match ops.attach_remote("v", &x).await {
            Err(VolumeError::PathHeld {
                controller, holder, ..
            }) => assert_eq!((controller.as_str(), holder.as_str()), ("x", "rb-x")),
            other => panic!("x on rb-x's path: {other:?}"),
        }
        // another host NQN is another path: SPDK connects it (its namespace
        // then clashes with rb-xn1's UUID, and registers no bdev)
        let as_other = RemoteAttach {
            host_nqn: Some(other_host),
            ..x.clone()
        };
        assert!(
            !matches!(
                ops.attach_remote("v", &as_other).await,
                Err(VolumeError::PathHeld { .. })
            ),
            "another host NQN's path is not held"
        );
    }
}
