//! `engine.SpdkEventsController`: turns SPDK's notify events into a resource
//! change, so that a raid member that goes away (a disk pulled, a remote path
//! lost) is seen by the volume controller within a poll of ~200 ms instead of
//! its own 2 s status poll. The sooner the ledger learns that a replica left,
//! the smaller the window in which a crash of spdk_tgt could let it be
//! trusted again.
//!
//! Registrations wake it too: a replica's disk that comes back brings its
//! lvol back, and SPDK's examine re-adds it to its raid (superblock) with a
//! full rebuild of every block. The volume controller stops that rebuild and
//! rebuilds thin instead, but only if it sees it: a 1 GiB full rebuild can
//! end within the 2 s poll (seen in a CI rehearsal: the returning replica
//! came back fully allocated).
//!
//! ```text
//!   spdk_tgt notify_get_notifications(id = cursor) ──> bdev_unregister seen?
//!        │ (every 200 ms while the target is ready)          │ yes (or bdev_register)
//!        v                                                   v
//!   cursor kept in memory (reset when TargetStatus    SpdkEvents "spdk" {bdevUnregistered += n,
//!                                                                        bdevRegistered += m}
//!   restarts changes: ids count from 0 again)          ──> input of engine.SpdkVolumeController
//! ```

use std::sync::Mutex;
use std::time::Duration;

use crate::resources::engine::SPDK_STATUS_ID;
use crate::resources::engine::{Engine, ObjectState, SpdkEvents, TargetStatus};
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};
use crate::spdk::SpdkClient;
use crate::spdk::rpc::GetNotifications;

/// How often the target is asked for events.
const POLL: Duration = Duration::from_millis(200);
/// Events asked for at once.
const BATCH: u64 = 1024;

/// Watches spdk_tgt's notify events.
#[derive(Debug)]
pub struct SpdkEventsController {
    client: SpdkClient,
    /// (TargetStatus restarts it belongs to, next event id).
    cursor: Mutex<(u32, u64)>,
}

impl SpdkEventsController {
    /// A controller asking the target behind `client`.
    pub fn new(client: SpdkClient) -> Self {
        Self {
            client,
            cursor: Mutex::new((0, 0)),
        }
    }
}

#[async_trait::async_trait]
impl Controller for SpdkEventsController {
    fn name(&self) -> &'static str {
        "engine.SpdkEventsController"
    }

    fn inputs(&self) -> Vec<Input> {
        vec![Input::of::<TargetStatus>()]
    }

    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<SpdkEvents>()]
    }

    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let mut events = ctx
            .get::<SpdkEvents>(SPDK_STATUS_ID)?
            .map(|e| e.spec)
            .unwrap_or_default();
        let target = ctx.get::<TargetStatus>(SPDK_STATUS_ID)?.map(|t| t.spec);
        let Some(target) = target.filter(|t| t.engine == Engine::V2 && t.state == ObjectState::Ready) else {
            ctx.apply(SPDK_STATUS_ID, events)?;
            return Ok(Requeue::OnInputChange);
        };
        let from = {
            let mut c = self.cursor.lock().unwrap_or_else(|p| p.into_inner());
            if c.0 != target.restarts {
                *c = (target.restarts, 0);
            }
            c.1
        };
        match self
            .client
            .notify_get_notifications(&GetNotifications {
                id: Some(from),
                max: Some(BATCH),
            })
            .await
        {
            Ok(list) => {
                if let Some(last) = list.last() {
                    let mut c = self.cursor.lock().unwrap_or_else(|p| p.into_inner());
                    c.1 = last.id + 1;
                }
                for n in &list {
                    match n.kind.as_str() {
                        "bdev_unregister" => events.bdev_unregistered += 1,
                        "bdev_register" => events.bdev_registered += 1,
                        _ => continue,
                    }
                    events.last_bdev = n.ctx.clone();
                }
            }
            // the target is going or gone: TargetStatus says so soon, and this runs again then
            Err(e) => tracing::debug!(error = %e, "notify_get_notifications"),
        }
        ctx.apply(SPDK_STATUS_ID, events)?;
        Ok(Requeue::After(POLL))
    }
}
