//! Controllers, one folder per subsystem (the same nouns as [`crate::resources`]),
//! one controller per file.

pub mod engine;
pub mod frontend;
pub mod host;
pub mod longhorn;

use std::path::PathBuf;

use crate::controllers::engine::selection::{EngineSelection, SpdkOptions};
use crate::host::HostRoot;
use crate::resources::engine::Engine;
use crate::runtime::{Runtime, RuntimeError};

/// What controllers need from the daemon's configuration.
#[derive(Debug, Clone)]
pub struct Deps {
    /// Host access.
    pub host: HostRoot,
    /// The data directory (persisted state, V1 volume files, host NQN).
    pub data_dir: PathBuf,
    /// The run directory (sockets of spdk_tgt and tgtd).
    pub run_dir: PathBuf,
    /// How SPDK is found and run (`talon serve` flags).
    pub spdk: SpdkOptions,
    /// Whether a clean stop of talon stops spdk_tgt and tgtd or leaves them
    /// serving (`--stop-targets-on-exit`).
    pub targets_on_exit: engine::TargetsOnExit,
    /// The bearer token for the admin API of the nodes that serve remote
    /// replicas (this node's own `--token-file`: one token for the
    /// cluster's talon nodes); none: their snapshots cannot be taken.
    pub peer_token: Option<std::sync::Arc<str>>,
    /// TLS for the calls to those nodes (`--tls-peer-ca`); none: plain TCP.
    pub peer_tls: Option<crate::client::TlsClient>,
    /// The SPDKService port of the other nodes' Longhorn services (this
    /// node's own, `--longhorn-listen` base + 4): a Longhorn engine's
    /// rebuilds call the replica nodes there.
    pub longhorn_peer_port: u16,
    /// This serve's Longhorn session (`resources::longhorn::new_session`),
    /// shared by the Longhorn services and `engine.LonghornController`.
    pub longhorn_session: crate::resources::longhorn::Session,
    /// The listing of spdk_tgt that the Longhorn services' polls and
    /// `engine.LonghornController`'s passes share (their clients count
    /// changes in the session's count).
    pub longhorn_listing: crate::spdk::inventory::SharedListing,
    /// Whether talon serves Longhorn's instance-manager protocol (`--longhorn-listen`): then
    /// spdk_tgt runs from the start, as in Longhorn's V2 instance-manager pod.
    pub longhorn: bool,
    /// This serve's run, which every SPDK client of its controllers and
    /// services is of (the data mover's exports carry it).
    pub spdk_run: crate::spdk::RunId,
}

/// Registers every controller; `selection`: the engine selection detected
/// once at start ([`EngineSelection::detect_with_socket`]; `node_info` shows
/// the same one).
pub fn register_all(rt: &mut Runtime, deps: &Deps, selection: &EngineSelection) -> Result<(), RuntimeError> {
    let socket = deps.spdk.target_config(&deps.run_dir).socket();
    engine::v1::register(rt, deps, selection)?;
    let target = engine::spdk_target::SpdkTargetController::new(
        deps.spdk.target_config(&deps.run_dir),
        selection.clone(),
    )
    .on_exit(deps.targets_on_exit.clone())
    .with_host(deps.host.clone())
    .with_data_dir(&deps.data_dir)
    .always(deps.longhorn)
    .with_keeper(
        deps.spdk
            .target_keeper
            .then(|| crate::keeper::KeeperFiles::new(&deps.run_dir)),
    );
    rt.register(target)?;
    rt.register(
        engine::spdk_disk::SpdkDiskController::new(&deps.run_dir, deps.host.clone())
            .without_v2((!selection.v2_available).then(|| selection.reason.clone())),
    )?;
    // every client of this serve is of its run (the data mover's exports)
    let spdk = |socket: &std::path::Path| crate::spdk::SpdkClient::of_run(socket, &deps.spdk_run, None);
    rt.register(engine::spdk_events::SpdkEventsController::new(spdk(&socket)))?;
    rt.register(engine::spdk_orphans::SpdkOrphanController::new(spdk(&socket)))?;
    let host_nqn = crate::attach::HostInitiators::load_or_create(&deps.host, &deps.data_dir)
        .ok()
        .map(|i| i.nqn.to_string());
    rt.register(
        engine::spdk_volume::SpdkVolumeController::new(spdk(&socket), selection.auto_engine() == Engine::V2)
            .with_host_nqn(host_nqn.clone())
            .with_data_dir(deps.data_dir.clone())
            .with_peers(engine::peer::Peers::new(deps.peer_token.clone()).with_tls(deps.peer_tls.clone())),
    )?;
    rt.register(
        longhorn::LonghornController::new(crate::spdk::SpdkClient::of_run(
            deps.spdk.target_config(&deps.run_dir).socket(),
            &deps.spdk_run,
            Some(deps.longhorn_session.spdk_changes()),
        ))
        .with_host_nqn(host_nqn)
        .with_host(deps.host.clone(), deps.data_dir.clone())
        .with_peer_port(deps.longhorn_peer_port)
        .with_session(deps.longhorn_session.clone())
        .with_listing(deps.longhorn_listing.clone()),
    )?;
    rt.register(engine::backup::BackupController::new(
        spdk(&deps.spdk.target_config(&deps.run_dir).socket()),
        &deps.data_dir,
    ))?;
    rt.register(longhorn::restore::LonghornRestoreController::new(
        spdk(&deps.spdk.target_config(&deps.run_dir).socket()),
        &deps.data_dir,
    ))?;
    rt.register(frontend::attach::AttachController::new(deps.clone()))?;
    host::register_config(rt, &deps.host, host::SpdkDemand::new(&deps.spdk, selection))?;
    host::register(rt, &deps.host, host::POLL)?;
    Ok(())
}
