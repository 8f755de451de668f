//! Controllers, one folder per subsystem (the same nouns as [`crate::resources`]),
//! one controller per file.

pub mod engine;
pub mod frontend;
pub mod host;

use std::path::PathBuf;

use crate::host::HostRoot;
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
}

/// Registers every controller.
pub fn register_all(rt: &mut Runtime, deps: &Deps) -> Result<(), RuntimeError> {
    engine::v1::register(rt, deps)?;
    rt.register(frontend::attach::AttachController::new(deps.clone()))?;
    host::register(rt, &deps.host, host::POLL)?;
    Ok(())
}
