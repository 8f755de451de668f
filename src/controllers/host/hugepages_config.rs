//! `host.HugepagesConfigController`: how many 2 MiB hugepages SPDK needs on
//! this node, per NUMA node of its cores. Pure derivation: reads desired
//! state and the host's CPU topology, writes `HugepagesSpec`, changes nothing.
//!
//! ```text
//!   NodeConfig.hugepages ─┐  auto: SPDK can run here? (spdk_tgt found, not --no-huge,
//!   Volume (V2 ones) ─────┤        node not pinned to v1, or V2 work exists)
//!   Disk ─────────────────┤        ─> 1024 MiB + 8 MiB × exported volumes (docs/sizing.md)
//!   --spdk-cpumask ───────┘  <MiB>: that;  off: nothing wanted
//!        │ split over the NUMA nodes of the SPDK cores, in proportion to the cores
//!        │ on each (as DPDK spreads -s), rounded up to whole pages
//!        v
//!   HugepagesSpec "2M-node0" { wanted, spdkMemMib, exportedVolumes, reason }
//! ```

use crate::controllers::engine::selection::{EngineSelection, SpdkOptions};
use crate::host::HostRoot;
use crate::host::hugepages::{self, HugepagesError, PageSize};
use crate::resources::config::{Disk, EngineKind, HugepagesKeyword, HugepagesSetting, NodeConfig, Volume};
use crate::resources::engine::Engine;
use crate::resources::host::HugepagesSpec;
use crate::runtime::{Controller, ControllerError, Input, Output, ReconcileContext, Requeue};
use crate::spdk::target::mem_size_mib_for;

/// What decides SPDK's demand besides desired state: the `talon serve` flags
/// and the engine selection made at start.
#[derive(Debug, Clone)]
pub struct SpdkDemand {
    /// What would run SPDK here, or why nothing can.
    pub spdk: Result<String, String>,
    /// `--no-huge`: SPDK takes ordinary memory.
    pub no_huge: bool,
    /// `--spdk-cpumask`.
    pub cpumask: String,
    /// The engine selection (which volumes are V2).
    pub selection: EngineSelection,
}

impl SpdkDemand {
    /// From the serve flags and the engine selection.
    pub fn new(opts: &SpdkOptions, selection: &EngineSelection) -> Self {
        let spdk = if opts.embedded {
            if cfg!(feature = "spdk-embedded") {
                Ok("in-process SPDK (spdk-embedded)".to_string())
            } else {
                Err(crate::spdk::target::TargetError::EmbeddedNotBuilt.to_string())
            }
        } else {
            match &selection.spdk_tgt {
                Some(bin) => Ok(bin.display().to_string()),
                None => Err(selection.reason.clone()),
            }
        };
        SpdkDemand {
            spdk,
            no_huge: opts.no_huge,
            cpumask: opts.cpumask.clone(),
            selection: selection.clone(),
        }
    }
}

/// The hugepage specs for this desired state: one per pool SPDK's cores use
/// (none with `off`... except that `off` still publishes the pools with
/// nothing wanted, so the status says why).
pub fn desired(
    host: &HostRoot,
    demand: &SpdkDemand,
    node: &NodeConfig,
    volumes: &[Volume],
    disks: usize,
) -> Result<Vec<HugepagesSpec>, HugepagesError> {
    let exported = volumes
        .iter()
        .filter(|v| demand.selection.engine_for(v, node) == Engine::V2)
        .count();
    let exported = u32::try_from(exported).unwrap_or(u32::MAX);
    let node_default = match node.engine {
        EngineKind::Auto => demand.selection.default_engine,
        e => e,
    };
    let v2_work = exported > 0 || disks > 0;
    let spdk_here = match &demand.spdk {
        Err(why) => Err(format!("no SPDK on this node ({why})")),
        Ok(_) if demand.no_huge => Err("spdk_tgt runs with --no-huge (ordinary memory)".to_string()),
        Ok(_) if node_default == EngineKind::V1 && !v2_work => {
            Err("the node is pinned to the v1 engine and has no V2 work".to_string())
        }
        Ok(what) => Ok(what.clone()),
    };
    let spdk_mem_mib = if spdk_here.is_ok() {
        mem_size_mib_for(exported)
    } else {
        0
    };
    let (mode, total_mib, why) = match node.hugepages {
        HugepagesSetting::Keyword(HugepagesKeyword::Off) => (
            "off".to_string(),
            None,
            "hugepages: off (talon leaves the pool alone)".to_string(),
        ),
        HugepagesSetting::Mib(m) => ("fixed".to_string(), Some(m), format!("hugepages: {m} MiB")),
        HugepagesSetting::Keyword(HugepagesKeyword::Auto) => match &spdk_here {
            Ok(what) => (
                "auto".to_string(),
                Some(spdk_mem_mib),
                format!(
                    "auto: {} MiB + {} MiB × {exported} exported volume(s) = {spdk_mem_mib} MiB for {what}",
                    crate::host::hugepages::SPDK_BASE_MIB,
                    crate::host::hugepages::SPDK_MIB_PER_VOLUME
                ),
            ),
            Err(why) => (
                "auto".to_string(),
                Some(0),
                format!("auto: nothing wanted: {why}"),
            ),
        },
    };
    let cpus = hugepages::parse_cpumask(&demand.cpumask)?;
    let per_node = hugepages::cpus_per_node(host, &cpus);
    let shares = hugepages::split_pages(total_mib.unwrap_or(0), &per_node);
    let cores_on = |n: Option<u32>| per_node.iter().find(|(k, _)| *k == n).map_or(0, |(_, c)| *c);
    Ok(shares
        .into_iter()
        .map(|(n, pages)| {
            let wanted = total_mib.map(|_| pages);
            let place = match n {
                Some(k) if per_node.len() > 1 => format!(
                    "; NUMA node {k} holds {} of the {} SPDK cores, so {pages} of the pages",
                    cores_on(n),
                    cpus.len()
                ),
                Some(k) => format!("; the SPDK cores ({}) are on NUMA node {k}", demand.cpumask),
                None => String::new(),
            };
            HugepagesSpec {
                size: PageSize::Size2M,
                node: n,
                mode: mode.clone(),
                wanted,
                wanted_mib: wanted.map(|p| p * PageSize::Size2M.mib()),
                spdk_mem_mib,
                exported_volumes: exported,
                reason: if total_mib.is_some() {
                    format!("{why}{place}")
                } else {
                    why.clone()
                },
            }
        })
        .collect())
}

/// The id of a 2 MiB pool's resources: `2M-node0`, or `2M` without NUMA.
pub fn pool_id(node: Option<u32>) -> String {
    match node {
        Some(n) => format!("{}-node{n}", PageSize::Size2M),
        None => PageSize::Size2M.to_string(),
    }
}

/// Derives `HugepagesSpec` from desired state (see the module docs).
#[derive(Debug, Clone)]
pub struct HugepagesConfigController {
    pub host: HostRoot,
    pub demand: SpdkDemand,
}

#[async_trait::async_trait]
impl Controller for HugepagesConfigController {
    fn name(&self) -> &'static str {
        "host.HugepagesConfigController"
    }
    fn inputs(&self) -> Vec<Input> {
        vec![
            Input::of::<NodeConfig>(),
            Input::of::<Volume>(),
            Input::of::<Disk>(),
        ]
    }
    fn outputs(&self) -> Vec<Output> {
        vec![Output::exclusive::<HugepagesSpec>()]
    }
    async fn reconcile(&self, ctx: &mut ReconcileContext) -> Result<Requeue, ControllerError> {
        let node = ctx.get::<NodeConfig>("node")?.map(|n| n.spec).unwrap_or_default();
        let volumes: Vec<Volume> = ctx.list::<Volume>()?.into_iter().map(|v| v.spec).collect();
        let disks = ctx.list::<Disk>()?.len();
        for spec in desired(&self.host, &self.demand, &node, &volumes, disks)? {
            ctx.apply(&pool_id(spec.node), spec)?;
        }
        Ok(Requeue::OnInputChange)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(spdk: bool) -> SpdkDemand {
        SpdkDemand {
            spdk: if spdk {
                Ok("/opt/spdk_tgt".into())
            } else {
                Err("spdk_tgt was not found".into())
            },
            no_huge: false,
            cpumask: "0x1".into(),
            selection: EngineSelection::fixed(spdk, "test"),
        }
    }

    fn vol() -> Volume {
        serde_json::from_value(serde_json::json!({"sizeBytes": 1048576})).expect("volume")
    }

    fn numa_host(nodes: &[&str]) -> (tempfile::TempDir, HostRoot) {
        let d = tempfile::tempdir().expect("tempdir");
        for (n, cpus) in nodes.iter().enumerate() {
            let dir = d.path().join(format!("sys/devices/system/node/node{n}"));
            std::fs::create_dir_all(dir.join("hugepages/hugepages-2048kB")).expect("mkdir");
            std::fs::write(dir.join("cpulist"), format!("{cpus}\n")).expect("write");
        }
        let root = HostRoot::new(d.path());
        (d, root)
    }

    #[test]
    fn auto_follows_the_exported_volumes_on_the_node_of_the_cores() {
        let (_d, root) = numa_host(&["0-1", "2-3"]);
        let node = NodeConfig::default();
        let specs = desired(&root, &demand(true), &node, &[vol(), vol(), vol()], 0).expect("desired");
        assert_eq!(specs.len(), 1, "{specs:?}");
        let s = &specs[0];
        // 1024 + 3 × 8 = 1048 MiB (spdk_tgt -s) -> 524 pages of 2 MiB, all on node 0 (core 0)
        assert_eq!(
            (s.node, s.wanted, s.spdk_mem_mib, s.exported_volumes),
            (Some(0), Some(524), 1048, 3)
        );
        assert!(s.reason.contains("8 MiB × 3 exported"), "{}", s.reason);
        assert!(s.reason.contains("NUMA node 0"), "{}", s.reason);

        // cores on both nodes: the pages follow the cores (DPDK's split)
        let two_nodes = SpdkDemand {
            cpumask: "0x7".into(),
            ..demand(true)
        };
        let specs = desired(&root, &two_nodes, &node, &[], 0).expect("desired");
        let wanted: Vec<_> = specs.iter().map(|s| (s.node, s.wanted)).collect();
        // 1024 MiB = 512 pages: two thirds on node 0 (two cores), a third on node 1, rounded up
        assert_eq!(wanted, vec![(Some(0), Some(342)), (Some(1), Some(171))]);
    }

    #[test]
    fn nothing_without_spdk_fixed_and_off_as_told() {
        let (_d, root) = numa_host(&["0"]);
        let node = NodeConfig::default();
        let specs = desired(&root, &demand(false), &node, &[vol()], 0).expect("desired");
        assert_eq!(specs[0].wanted, Some(0));
        assert!(
            specs[0].reason.contains("no SPDK on this node"),
            "{}",
            specs[0].reason
        );
        let no_huge = SpdkDemand {
            no_huge: true,
            ..demand(true)
        };
        let specs = desired(&root, &no_huge, &node, &[vol()], 1).expect("desired");
        assert!(specs[0].reason.contains("--no-huge"), "{}", specs[0].reason);
        assert_eq!(specs[0].wanted, Some(0));
        let v1 = NodeConfig {
            engine: EngineKind::V1,
            ..NodeConfig::default()
        };
        let specs = desired(&root, &demand(true), &v1, &[], 0).expect("desired");
        assert_eq!(specs[0].wanted, Some(0), "{}", specs[0].reason);
        // a disk is V2 work even on a v1 node
        let specs = desired(&root, &demand(true), &v1, &[], 1).expect("desired");
        assert_eq!(specs[0].wanted, Some(512));

        let fixed = NodeConfig {
            hugepages: HugepagesSetting::Mib(1001),
            ..NodeConfig::default()
        };
        let specs = desired(&root, &demand(false), &fixed, &[], 0).expect("desired");
        assert_eq!((specs[0].wanted, specs[0].wanted_mib), (Some(501), Some(1002)));
        let off = NodeConfig {
            hugepages: HugepagesSetting::OFF,
            ..NodeConfig::default()
        };
        let specs = desired(&root, &demand(true), &off, &[vol()], 0).expect("desired");
        assert_eq!((specs[0].wanted, specs[0].spdk_mem_mib), (None, 1032));
    }

    #[test]
    fn a_host_without_numa_sysfs_has_one_global_pool() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(d.path());
        let specs = desired(&root, &demand(true), &NodeConfig::default(), &[], 0).expect("desired");
        assert_eq!(specs.len(), 1);
        assert_eq!((specs[0].node, specs[0].wanted), (None, Some(512)));
        assert_eq!(pool_id(None), "2M");
        assert_eq!(pool_id(Some(1)), "2M-node1");
        let bad = SpdkDemand {
            cpumask: "cores".into(),
            ..demand(true)
        };
        let err = desired(&root, &bad, &NodeConfig::default(), &[], 0).expect_err("bad mask");
        assert!(err.to_string().contains("\"cores\""), "{err}");
    }
}
