//! `host.HugepagesController`: the only writer of `nr_hugepages`. Sizes each
//! pool to its `HugepagesSpec` where the host allows it, verifies what the
//! kernel gave, and reports every pool as `HugepagesStatus` (wanted / have /
//! why).
//!
//! ```text
//!   HugepagesSpec "2M-node0" ─┐
//!   HugepagesLedger (ledger) ─┼─> target = max(wanted, in use, pool before talon grew it)
//!   pools (sysfs) ────────────┘        │   (never below pages in use; shrinks only what talon added)
//!                                      ├─ Talos: no write; Short + the machine-config patch
//!                                      ├─ ledger {before, set} persisted, then write nr_hugepages,
//!                                      │  read back: got < asked -> previous value restored, Short
//!                                      └─> HugepagesStatus "2M-node0" {wanted, total, free, inUse, state, reason}
//!   a pool wanted, no hugetlbfs mounted (real /, not Talos): mount one at /dev/hugepages
//!   polled every 30 s; pools nobody wants are listed Unmanaged.
//! ```
//!
//! The ledger is written before the pool is grown, so a crash right after the
//! write still knows which pages talon added. When someone else grows a pool
//! behind talon's back, the whole pool becomes the baseline: talon never
//! gives back pages it did not add (at the price of forgetting its own).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::host::hugepages::{self, HugepagesError, PageSize};
use crate::host::talos::{self, TalosNeeds, TalosVersion};
use crate::host::{HostRoot, os};
use crate::resources::host::{HugepagesLedger, HugepagesSpec, HugepagesState, HugepagesStatus};
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue, State};

use super::hugepages_config::pool_id;

/// The controller's name (owner of the ledger entries, also when written at start).
pub const NAME: &str = "host.HugepagesController";
/// After a shortfall the same target is tried again only after this long
/// (each try makes the kernel compact memory).
const SHORTFALL_RETRY: Duration = Duration::from_secs(300);

/// What one pass decided for the ledger of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerChange {
    /// Keep (or write) this entry.
    Keep(HugepagesLedger),
    /// The pool is back where talon found it: forget it.
    Drop,
}

/// A pool's status after a pass, and the (asked, got) of a shortfall in it.
pub type PoolOutcome = (HugepagesStatus, Option<(u64, u64)>);

/// One pass over the pools: writes `nr_hugepages` where needed and allowed
/// and returns the statuses and ledger entries. `record` persists a ledger
/// entry and is called before the pool is grown.
pub fn size_pools(
    host: &HostRoot,
    talos: Option<TalosVersion>,
    specs: &BTreeMap<String, HugepagesSpec>,
    ledgers: &BTreeMap<String, HugepagesLedger>,
    skip: &dyn Fn(&str, u64) -> bool,
    record: &mut dyn FnMut(&str, &LedgerChange) -> Result<(), ControllerError>,
) -> Result<Vec<PoolOutcome>, ControllerError> {
    let pools = hugepages::pools(host)?;
    let two_m = pools.iter().filter(|p| p.size == PageSize::Size2M).count();
    let resv = if two_m == 1 {
        hugepages::reserved(host, PageSize::Size2M)
    } else {
        0
    };
    let mut out = Vec::new();
    for pool in pools {
        let mut status = HugepagesStatus::from(&pool);
        if pool.size != PageSize::Size2M {
            out.push((status, None));
            continue;
        }
        let id = pool_id(pool.node);
        let spec = specs.get(&id);
        let in_use = hugepages::in_use(&pool, resv);
        status.in_use = in_use;
        status.wanted = spec.and_then(|s| s.wanted);
        // someone else resized the pool since talon's last write: grown, the
        // whole pool counts as theirs from now on (talon cannot tell its pages
        // from theirs, and takes none back); shrunk, the baseline follows down
        let ledger = ledgers.get(&id).map(|l| {
            let mut l = l.clone();
            if pool.total > l.set {
                l.before = pool.total;
            } else if pool.total < l.set {
                l.before = l.before.min(pool.total);
            }
            l.set = pool.total;
            l
        });
        let wanted = spec.and_then(|s| s.wanted);
        let target = hugepages::target_pages(&pool, in_use, wanted, ledger.as_ref().map(|l| l.before));
        let mut reason = spec.map(|s| s.reason.clone()).unwrap_or_default();
        let mut shortfall = None;
        let mut now = pool.clone();
        match (target, talos) {
            (None, _) => {
                if let Some(l) = &ledger {
                    let change = if l.before == pool.total && wanted.is_none_or(|w| w <= l.before) {
                        LedgerChange::Drop
                    } else {
                        LedgerChange::Keep(l.clone())
                    };
                    record(&id, &change)?;
                }
            }
            (Some(t), Some(_)) if t > pool.total => {
                reason.push_str(&format!(
                    "; Talos: vm.nr_hugepages comes from the machine config, talon does not write it (the pool needs {t} pages)"
                ));
            }
            (Some(_), Some(_)) => {}
            (Some(t), None) if skip(&id, t) => {
                reason.push_str(&format!(
                    "; the kernel could not give {t} pages at the last try (memory fragmented); trying again later"
                ));
            }
            (Some(t), None) => {
                let before = ledger.as_ref().map_or(pool.total, |l| l.before);
                record(&id, &LedgerChange::Keep(HugepagesLedger { before, set: t }))?;
                match hugepages::set_pages(host, pool.size, pool.node, t) {
                    Ok(o) => {
                        let verb = if t > pool.total {
                            "grew"
                        } else {
                            "gave back free pages:"
                        };
                        reason.push_str(&format!("; talon {verb} {} -> {} pages", o.previous, o.now));
                        now = hugepages::read_pool(host, pool.size, pool.node)?;
                        if t < pool.total && t == before && wanted.is_none_or(|w| w <= before) {
                            record(&id, &LedgerChange::Drop)?;
                        }
                    }
                    Err(HugepagesError::Shortfall { got, previous, .. }) => {
                        record(
                            &id,
                            &LedgerChange::Keep(HugepagesLedger {
                                before,
                                set: previous,
                            }),
                        )?;
                        shortfall = Some((t, got));
                        reason.push_str(&format!(
                            "; the kernel gave only {got} of {t} pages (memory fragmented or too small), so the pool was left at {previous}; free memory, or reserve hugepages at boot (hugepages={t} on the kernel command line)"
                        ));
                        now = hugepages::read_pool(host, pool.size, pool.node)?;
                    }
                    Err(e) => {
                        record(
                            &id,
                            &LedgerChange::Keep(HugepagesLedger {
                                before,
                                set: pool.total,
                            }),
                        )?;
                        let node = pool.node.map(|n| format!(" --node {n}")).unwrap_or_default();
                        reason.push_str(&format!(
                            "; {}; give talon write access to /sys (a privileged container), or run `talon host hugepages --set {t}{node}` on the host",
                            crate::util::error_chain(&e)
                        ));
                    }
                }
            }
        }
        let mut fresh = HugepagesStatus::from(&now);
        fresh.in_use = hugepages::in_use(&now, resv);
        fresh.wanted = wanted;
        fresh.state = match wanted {
            None => HugepagesState::Unmanaged,
            Some(w) if now.total >= w => HugepagesState::Ok,
            Some(_) => HugepagesState::Short,
        };
        if let (Some(v), HugepagesState::Short) = (talos, fresh.state) {
            let nodes = hugepages::numa_nodes(host).len().max(1) as u64;
            let pages = wanted.unwrap_or(0).saturating_mul(nodes);
            let needs = TalosNeeds {
                nr_hugepages: Some(pages),
                ..TalosNeeds::default()
            };
            let patch = talos::to_yaml(&hugepages_only(talos::documents(v, &needs))).unwrap_or_default();
            if nodes > 1 {
                reason.push_str(&format!(
                    "; the kernel spreads vm.nr_hugepages over the {nodes} NUMA nodes, so the patch asks {nodes} × {} pages",
                    wanted.unwrap_or(0)
                ));
            }
            fresh.talos_patch = Some(patch);
        }
        fresh.reason = reason.trim_start_matches("; ").to_string();
        out.push((fresh, shortfall));
    }
    Ok(out)
}

/// The documents without the kubelet mount the doctor adds (the status is
/// about hugepages only).
pub fn hugepages_only(docs: Vec<talos::TalosDocument>) -> Vec<talos::TalosDocument> {
    docs.into_iter()
        .map(|d| match d {
            talos::TalosDocument::V1Alpha1(mut p) => {
                p.machine.kubelet = None;
                talos::TalosDocument::V1Alpha1(p)
            }
            other => other,
        })
        .collect()
}

/// The Talos machine-config shape for an os-release `VERSION_ID` (`v1.15.0`).
pub fn talos_version(version_id: Option<&str>) -> TalosVersion {
    let v = version_id.unwrap_or("").trim_start_matches('v');
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    match (it.next(), it.next()) {
        (Some(1), Some(m)) if m >= 15 => TalosVersion::V1_15,
        _ => TalosVersion::V1_13,
    }
}

fn detect_talos(host: &HostRoot) -> Option<TalosVersion> {
    let os = os::detect(host).ok()?;
    os.is_talos().then(|| talos_version(os.version_id.as_deref()))
}

/// Sizes the pools once from the specs in `state`, before the controllers
/// start (so the engine selection at start sees the pool talon reserves).
pub fn size_at_start(host: &HostRoot, state: &State, specs: &[HugepagesSpec]) -> Result<(), ControllerError> {
    let specs: BTreeMap<String, HugepagesSpec> = specs.iter().map(|s| (pool_id(s.node), s.clone())).collect();
    let ledgers: BTreeMap<String, HugepagesLedger> = state
        .list_typed::<HugepagesLedger>()?
        .into_iter()
        .map(|l| (l.id().to_string(), l.spec))
        .collect();
    let mut record = |id: &str, change: &LedgerChange| -> Result<(), ControllerError> {
        match change {
            LedgerChange::Keep(l) => match state.get_typed::<HugepagesLedger>(id)? {
                Some(_) => drop(state.update_typed(id, NAME, None, l)?),
                None => drop(state.create_typed(id, NAME, l)?),
            },
            LedgerChange::Drop => match state.destroy("ledger", "HugepagesLedger", id, NAME) {
                Ok(_) | Err(crate::runtime::StateError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            },
        }
        Ok(())
    };
    for (s, _) in size_pools(
        host,
        detect_talos(host),
        &specs,
        &ledgers,
        &|_, _| false,
        &mut record,
    )? {
        tracing::info!(pool = %s.id(), wanted = ?s.wanted, total = s.total, state = ?s.state, reason = %s.reason, "hugepages at start");
    }
    Ok(())
}

/// Sizes the hugepage pools (see the module docs).
#[derive(Debug)]
pub struct HugepagesController {
    pub host: HostRoot,
    pub interval: Duration,
    /// Targets the kernel could not give, per pool, and when that was.
    shortfalls: Mutex<BTreeMap<String, (u64, Instant)>>,
}

impl HugepagesController {
    /// Polls every `interval`.
    pub fn new(host: HostRoot, interval: Duration) -> Self {
        HugepagesController {
            host,
            interval,
            shortfalls: Mutex::new(BTreeMap::new()),
        }
    }
}

#[async_trait::async_trait]
impl Controller for HugepagesController {
    fn name(&self) -> &'static str {
        NAME
    }
    fn inputs(&self) -> Vec<Input> {
        vec![Input::of::<HugepagesSpec>()]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![
            Output::exclusive::<HugepagesStatus>(),
            Output::exclusive::<HugepagesLedger>(),
        ]
    }
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let specs: BTreeMap<String, HugepagesSpec> = ctx
            .list::<HugepagesSpec>()?
            .into_iter()
            .map(|s| (s.id().to_string(), s.spec))
            .collect();
        let ledgers: BTreeMap<String, HugepagesLedger> = ctx
            .list::<HugepagesLedger>()?
            .into_iter()
            .map(|l| (l.id().to_string(), l.spec))
            .collect();
        let talos = detect_talos(&self.host);
        let failed = self.shortfalls.lock().map(|m| m.clone()).unwrap_or_default();
        let skip = |id: &str, t: u64| {
            failed
                .get(id)
                .is_some_and(|(ft, at)| *ft == t && at.elapsed() < SHORTFALL_RETRY)
        };
        let mut changes: Vec<(String, LedgerChange)> = Vec::new();
        let mut record = |id: &str, c: &LedgerChange| -> Result<(), ControllerError> {
            changes.push((id.to_string(), c.clone()));
            Ok(())
        };
        // persisted before the write: the ledger write goes through the store first
        let statuses = {
            let state = ctx.state().clone();
            let mut persist = |id: &str, c: &LedgerChange| -> Result<(), ControllerError> {
                if let LedgerChange::Keep(l) = c {
                    match state.get_typed::<HugepagesLedger>(id)? {
                        Some(_) => drop(state.update_typed(id, NAME, None, l)?),
                        None => drop(state.create_typed(id, NAME, l)?),
                    }
                }
                record(id, c)
            };
            size_pools(&self.host, talos, &specs, &ledgers, &skip, &mut persist)?
        };
        // the ledger entries this pass keeps are outputs of this reconcile; the others go
        let mut kept: BTreeMap<String, Option<HugepagesLedger>> =
            ledgers.into_iter().map(|(id, l)| (id, Some(l))).collect();
        for (id, c) in changes {
            kept.insert(
                id,
                match c {
                    LedgerChange::Keep(l) => Some(l),
                    LedgerChange::Drop => None,
                },
            );
        }
        for (id, l) in kept {
            match l {
                Some(l) => ctx.apply(&id, l)?,
                None => ctx.destroy::<HugepagesLedger>(&id)?,
            }
        }
        if let Ok(mut m) = self.shortfalls.lock() {
            for (s, short) in &statuses {
                let id = pool_id(s.node);
                match short {
                    Some((t, _)) => {
                        m.entry(id).or_insert((*t, Instant::now()));
                    }
                    None if !skip(&id, s.wanted.unwrap_or(0)) => {
                        m.remove(&id);
                    }
                    None => {}
                }
            }
        }
        // spdk_tgt maps its pages through a hugetlbfs mount: make one where talon may
        let wants = statuses.iter().any(|(s, _)| s.wanted.unwrap_or(0) > 0);
        let mut mounted = None;
        if wants && talos.is_none() && self.host.is_real() {
            match hugepages::ensure_hugetlbfs(&self.host) {
                Ok(hugepages::MountOutcome::Mounted(p)) => {
                    tracing::info!(path = %p.display(), "mounted hugetlbfs");
                    mounted = Some(format!("; mounted hugetlbfs at {}", p.display()));
                }
                Ok(hugepages::MountOutcome::AlreadyMounted(_)) => {}
                Err(e) => mounted = Some(format!("; {}", crate::util::error_chain(&e))),
            }
        }
        for (mut s, _) in statuses {
            if let (Some(m), Some(w)) = (&mounted, s.wanted)
                && w > 0
            {
                s.reason.push_str(m);
            }
            ctx.apply(&s.id(), s)?;
        }
        Ok(Requeue::After(self.interval))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::hugepages::HugepagePool;

    #[test]
    fn talos_versions() {
        assert_eq!(talos_version(Some("v1.15.0")), TalosVersion::V1_15);
        assert_eq!(talos_version(Some("v1.13.2")), TalosVersion::V1_13);
        assert_eq!(talos_version(None), TalosVersion::V1_13);
    }

    #[test]
    fn targets_grow_never_shrink_in_use_or_foreign_pages() {
        let pool = |total, free| HugepagePool {
            size: PageSize::Size2M,
            node: Some(0),
            total,
            free,
        };
        use hugepages::target_pages as t;
        // grow to what is wanted
        assert_eq!(t(&pool(0, 0), 0, Some(256), None), Some(256));
        // enough already, talon added nothing: leave it
        assert_eq!(t(&pool(1024, 1024), 0, Some(256), None), None);
        // talon added pages (before 0): give back free ones down to the wanted count
        assert_eq!(t(&pool(300, 300), 0, Some(256), Some(0)), Some(256));
        // ... but never below the pages in use
        assert_eq!(t(&pool(300, 20), 280, Some(256), Some(0)), Some(280));
        assert_eq!(t(&pool(280, 0), 280, Some(256), Some(0)), None);
        // nothing wanted any more: back to the baseline, pages in use stay
        assert_eq!(t(&pool(300, 300), 0, None, Some(10)), Some(10));
        assert_eq!(t(&pool(300, 100), 200, None, Some(10)), Some(200));
        // off without a baseline: untouched
        assert_eq!(t(&pool(300, 300), 0, None, None), None);
    }
}
