//! Host frontends: how an exported volume becomes a block device on the host.
//!
//! ```text
//!   target (SPDK / kernel nvmet) ──NVMe/TCP──> nvme_tcp: /dev/nvme-fabrics ──> /dev/nvmeXnY ─┐
//!   target (tgtd / SPDK iSCSI)   ──iSCSI────> iscsi: iscsiadm in iscsid's ns ──> /dev/sdX ───┤
//!                                                      devpath ──> /dev/talon/<volume> <─────┘
//!   choose: host (nvme_tcp loaded/loadable? iscsid?) × volume/attachment override × exports
//!   lock_volume: flock /run/talon/locks/<volume>.lock in the host mount namespace
//! ```
//! - [`nvme_tcp`]: the kernel NVMe/TCP initiator, driven through `/dev/nvme-fabrics` and sysfs.
//! - [`iscsi`]: the kernel iSCSI initiator, driven by `iscsiadm` inside iscsid's namespaces.
//! - [`choose`]: which frontend a volume gets on this host.
//! - [`devpath`]: the stable path `/dev/talon/<volume>`.
//! - [`error`]: the module's error type, `AttachError`.

pub mod choose;
pub mod devpath;
pub mod error;
pub mod iscsi;
pub mod nvme_tcp;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use error::AttachError;

use crate::host::HostRoot;
use crate::names::{Iqn, Nqn, ObjectName};
use crate::ns::{self, Namespaces, NsLock, Target, TargetNamespaces};
use crate::util::Backoff;

/// The directory of the per-volume attach locks, a path in the host mount namespace.
pub const LOCK_DIR: &str = "/run/talon/locks";
/// How long an attach or detach waits for another one of the same volume.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(180);

/// Who this host is to a target: the host NQN the NVMe/TCP initiator connects
/// with and the initiator name the iSCSI initiator logs in with. Exports
/// allow exactly these names (plus the node's `allowedHosts`) for the volumes
/// attached here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInitiators {
    /// The host NQN ([`nvme_tcp::HostIdentity`]).
    pub nqn: Nqn,
    /// talon's initiator name, derived from the host ID ([`Iqn::for_host`]);
    /// the iSCSI attach logs in with it through the iscsiadm interface
    /// [`iscsi::IFACE`], whatever iscsid's default name is.
    pub iqn: Iqn,
}

impl HostInitiators {
    /// The host's identity (made once and kept under `<data_dir>/nvme/` when the
    /// host has no `/etc/nvme/hostnqn`).
    pub fn load_or_create(root: &HostRoot, data_dir: &Path) -> Result<Self, AttachError> {
        let id = nvme_tcp::HostIdentity::load_or_create(root, data_dir)?;
        Ok(Self {
            iqn: Iqn::for_host(&id.hostid),
            nqn: id.hostnqn,
        })
    }
}

/// A held per-volume attach lock (released on drop).
#[derive(Debug)]
pub struct VolumeLock {
    _lock: NsLock,
}

/// The host path of the lock file of `volume`.
pub fn lock_path(volume: &ObjectName) -> PathBuf {
    Path::new(LOCK_DIR).join(format!("{volume}.lock"))
}

/// Takes the attach lock of `volume`: an exclusive `flock` on `/run/talon/locks/<volume>.lock`
/// in the host mount namespace, so that two attaches or detaches of one volume cannot interleave,
/// whichever frontend, process or container runs them. When the host namespace cannot be entered
/// (no privilege, a fixture root), the same path is used through `root` in talon's own mount
/// namespace.
pub fn lock_volume(root: &HostRoot, volume: &ObjectName) -> Result<VolumeLock, AttachError> {
    lock_volume_for(root, volume, LOCK_TIMEOUT)
}

/// [`lock_volume`] with another bound on the wait.
pub fn lock_volume_for(
    root: &HostRoot,
    volume: &ObjectName,
    timeout: Duration,
) -> Result<VolumeLock, AttachError> {
    let host_path = lock_path(volume);
    let err = |source| AttachError::LockVolume {
        volume: volume.to_string(),
        path: host_path.clone(),
        source: Box::new(source),
    };
    let host_ns = if root.is_real() {
        match TargetNamespaces::open(root, &Target::Host, Namespaces::MNT) {
            Ok(_) => Some(Target::Host),
            Err(e) => {
                tracing::debug!(%volume, error = %e, "cannot enter the host mount namespace; locking in talon's own");
                None
            }
        }
    } else {
        tracing::debug!(%volume, root = %root.prefix().display(), "fixture host root; locking under it");
        None
    };
    let lock = match host_ns {
        Some(target) => {
            ns::create_dir_all(root, &target, LOCK_DIR).map_err(err)?;
            ns::lock(root, &target, &host_path, timeout).map_err(err)?
        }
        None => {
            // talon's own mount namespace: Target::Pid(self) enters nothing
            let me = Target::Pid(std::process::id());
            let local = HostRoot::real();
            ns::create_dir_all(&local, &me, root.path(LOCK_DIR)).map_err(err)?;
            ns::lock(&local, &me, root.path(&host_path), timeout).map_err(err)?
        }
    };
    Ok(VolumeLock { _lock: lock })
}

/// The backoff of waits on the kernel (a namespace or a SCSI disk
/// appearing): 2 ms doubling to 50 ms, bounded by the caller's deadline
/// ([`Backoff::sleep_before`]). Never a fixed one-second sleep.
pub(crate) fn kernel_backoff() -> Backoff {
    Backoff::new(
        std::time::Duration::from_millis(2),
        std::time::Duration::from_millis(50),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_of_a_volume_waits_and_times_out_with_the_volume_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let v = ObjectName::parse("volume", "v1").expect("name");
        let held = lock_volume_for(&root, &v, Duration::from_secs(5)).expect("lock");
        assert!(root.exists("/run/talon/locks/v1.lock"));
        let err = lock_volume_for(&root, &v, Duration::from_millis(50)).expect_err("busy");
        let msg = err.to_string();
        assert!(
            msg.contains("v1") && msg.contains("/run/talon/locks/v1.lock"),
            "{msg}"
        );
        let other = ObjectName::parse("volume", "v2").expect("name");
        lock_volume_for(&root, &other, Duration::from_millis(50)).expect("other volume is free");
        drop(held);
        lock_volume_for(&root, &v, Duration::from_millis(50)).expect("free again");
    }
}
