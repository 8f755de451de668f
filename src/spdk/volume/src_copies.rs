//! The copies a replica of this node is the source of, for thin rebuilds an
//! engine on another node drives (Longhorn's `ReplicaRebuildingSrc*`
//! calls): the dest's export attached here once per (source, dest), each
//! snapshot's own clusters shallow-copied into it, detached at the end.
//! Kept in memory: a talon restarted forgets them, and the engine, finding
//! a copy unknown, starts it again.
//!
//! ```text
//!   attach(src, dst, address)  another dest once at that address: its controller detached
//!                              rb-<dst> detached (a dest made again is a new namespace), attached afresh
//!   start(src, address, snapshot lvol)  bdev_lvol_start_shallow_copy into that dest; its id kept by snapshot
//!   operation(src, dst, snapshot)       the id, for bdev_lvol_check_shallow_copy
//!   finish(src, dst)                    forgotten, rb-<dst> detached
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};

use super::super::ClientError;
use super::{RemoteAttach, VolumeError, VolumeOps};

/// The controller this node attaches a rebuild's dest replica with (not the
/// name an engine here attaches it with).
fn controller(dst: &str) -> String {
    format!("rb-{dst}")
}

/// One dest a replica here copies into.
#[derive(Debug, Default, Clone)]
struct Copy {
    /// The dest's export, `ip:port`.
    address: String,
    /// Its bdev here.
    bdev: String,
    /// The copies started, by snapshot: SPDK's operation ids.
    ops: BTreeMap<String, u32>,
}

/// The copies replicas of this node are the source of, by (source replica,
/// dest replica).
#[derive(Debug, Default)]
pub struct SrcCopies {
    copies: Mutex<BTreeMap<(String, String), Copy>>,
}

/// Why a source's step failed.
#[derive(Debug, thiserror::Error)]
pub enum SrcCopyError {
    /// No dest at that address was attached for the source.
    #[error("replica {replica}: no rebuild to {address} was started (ReplicaRebuildingSrcStart first)")]
    NotStarted { replica: String, address: String },
    /// The dest's export could not be attached.
    #[error("replica {replica}: rebuilding {dst}")]
    Attach {
        replica: String,
        dst: String,
        #[source]
        source: Box<VolumeError>,
    },
    /// An SPDK call failed.
    #[error("replica {replica}: {step}")]
    Spdk {
        replica: String,
        step: String,
        #[source]
        source: ClientError,
    },
}

impl SrcCopies {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<(String, String), Copy>> {
        self.copies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// SPDK's id of the copy of snapshot `snapshot` from `src` into `dst`,
    /// when one was started since this start.
    pub fn operation(&self, src: &str, dst: &str, snapshot: &str) -> Option<u32> {
        self.lock()
            .get(&(src.to_owned(), dst.to_owned()))
            .and_then(|c| c.ops.get(snapshot).copied())
    }
}

impl VolumeOps {
    /// Replica `src` of this node copies into replica `dst`, exported at
    /// `address` as `nqn`: that export attached here afresh (a dest made
    /// again is a new namespace). A copy from `src` to another dest once at
    /// that address (a replica made since on that node took its port) is
    /// over: copies find their dest by address, so it goes, with its
    /// controller.
    pub async fn attach_copy_dest(
        &self,
        copies: &SrcCopies,
        src: &str,
        dst: &str,
        address: SocketAddr,
        nqn: &str,
    ) -> Result<(), SrcCopyError> {
        let at = address.to_string();
        let stale: Vec<String> = {
            let mut all = copies.lock();
            let gone: Vec<String> = all
                .iter()
                .filter(|((s, d), c)| s == src && d != dst && c.address == at)
                .map(|((_, d), _)| d.clone())
                .collect();
            for d in &gone {
                all.remove(&(src.to_owned(), d.clone()));
            }
            gone
        };
        for d in stale {
            let old = controller(&d);
            if let Err(e) = self.detach_controller(&old).await {
                tracing::warn!(replica = %src, controller = %old, error = %e, "a stale rebuild's controller stays attached");
            }
        }
        let ctrl = controller(dst);
        self.detach_controller(&ctrl)
            .await
            .map_err(|source| SrcCopyError::Spdk {
                replica: src.to_owned(),
                step: format!("rebuilding {dst}: detaching {ctrl}"),
                source,
            })?;
        let a = RemoteAttach::longhorn(&ctrl, address, nqn);
        let bdev = self
            .attach_remote(src, &a)
            .await
            .map_err(|source| SrcCopyError::Attach {
                replica: src.to_owned(),
                dst: dst.to_owned(),
                source: Box::new(source),
            })?;
        copies.lock().insert(
            (src.to_owned(), dst.to_owned()),
            Copy {
                address: at,
                bdev,
                ops: BTreeMap::new(),
            },
        );
        Ok(())
    }

    /// Starts copying the clusters snapshot lvol `lvol` (snapshot
    /// `snapshot` of replica `src`) holds of its own into the dest attached
    /// at `address`.
    pub async fn start_copy_to_dest(
        &self,
        copies: &SrcCopies,
        src: &str,
        address: &str,
        snapshot: &str,
        lvol: &str,
    ) -> Result<(), SrcCopyError> {
        let (dst, bdev) = copies
            .lock()
            .iter()
            .find(|((s, _), c)| s == src && c.address == address)
            .map(|((_, d), c)| (d.clone(), c.bdev.clone()))
            .ok_or_else(|| SrcCopyError::NotStarted {
                replica: src.to_owned(),
                address: address.to_owned(),
            })?;
        let op = self
            .start_shallow_copy(lvol, &bdev)
            .await
            .map_err(|source| SrcCopyError::Spdk {
                replica: src.to_owned(),
                step: format!("copying {lvol}'s clusters to {bdev}"),
                source,
            })?;
        if let Some(c) = copies.lock().get_mut(&(src.to_owned(), dst)) {
            c.ops.insert(snapshot.to_owned(), op);
        }
        Ok(())
    }

    /// The copies from `src` into `dst` are over: forgotten, the dest's
    /// export detached.
    pub async fn finish_copies_to(
        &self,
        copies: &SrcCopies,
        src: &str,
        dst: &str,
    ) -> Result<(), SrcCopyError> {
        copies.lock().remove(&(src.to_owned(), dst.to_owned()));
        let ctrl = controller(dst);
        self.detach_controller(&ctrl)
            .await
            .map_err(|source| SrcCopyError::Spdk {
                replica: src.to_owned(),
                step: format!("detaching {ctrl}"),
                source,
            })
    }
}
