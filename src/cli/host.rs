//! `talon host ...`: hugepages and NVMe driver binding, without a daemon.
//!
//! ```text
//!   talon host hugepages [--set N] ─> host::hugepages (set, verify, mount, map one page)
//!   talon host pci list|bind|unbind ─> host::pci (inventory, in-use refusal, rebind + rollback)
//! ```

use crate::host::hugepages::{self, PageSize};
use crate::host::pci::{self, BindOptions, UserspaceDriver};
use crate::host::{HostRoot, os};

/// Output format of the listing commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Output {
    #[default]
    Text,
    Json,
    Yaml,
}

/// The `talon host` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum HostCommand {
    /// Show hugepage pools, or set one (verified; the previous value is kept on a shortfall).
    Hugepages(HugepagesArgs),
    /// NVMe PCI devices: list, bind to a user-space driver, give back to nvme.
    Pci(PciArgs),
}

/// `talon host hugepages`.
#[derive(Debug, clap::Args)]
pub struct HugepagesArgs {
    /// Set nr_hugepages to this many pages.
    #[arg(long)]
    pub set: Option<u64>,
    /// Only this NUMA node (default: the global pool).
    #[arg(long)]
    pub node: Option<u32>,
    /// Page size: 2M or 1G.
    #[arg(long, default_value = "2M")]
    pub size: PageSize,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// `talon host pci`.
#[derive(Debug, clap::Args)]
pub struct PciArgs {
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    #[command(subcommand)]
    pub command: PciCommand,
}

/// `talon host pci ...`.
#[derive(Debug, clap::Subcommand)]
pub enum PciCommand {
    /// List NVMe controllers with driver, IOMMU group, block devices, serial.
    List,
    /// Bind a disk (PCI address, serial or model) to a user-space driver.
    Bind {
        /// PCI address, serial or model.
        device: String,
        /// The driver (default: vfio-pci when the IOMMU group allows it, else uio_pci_generic).
        #[arg(long, value_enum)]
        driver: Option<UserspaceDriver>,
    },
    /// Give a disk back to the kernel nvme driver.
    Unbind {
        /// PCI address, serial or model.
        device: String,
    },
}

fn print<T: serde::Serialize>(
    output: Output,
    value: &T,
    text: impl FnOnce() -> String,
) -> Result<(), crate::cli::CliError> {
    match output {
        Output::Text => print!("{}", text()),
        Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(value)?),
    }
    Ok(())
}

/// Runs one `talon host` subcommand on `root`.
pub fn run_command(root: &HostRoot, command: HostCommand) -> Result<(), crate::cli::CliError> {
    match command {
        HostCommand::Hugepages(h) => run_hugepages(root, h.output, h),
        HostCommand::Pci(p) => run_pci(root, p.output, p.command),
    }
}

fn run_hugepages(root: &HostRoot, output: Output, h: HugepagesArgs) -> Result<(), crate::cli::CliError> {
    if let Some(n) = h.set {
        let on_talos = os::detect(root).map(|o| o.is_talos()).unwrap_or(false);
        let out = hugepages::set_pages(root, h.size, h.node, n)?;
        println!(
            "{} hugepages{}: {} -> {}",
            h.size,
            node_text(h.node),
            out.previous,
            out.now
        );
        if on_talos {
            println!(
                "note: on Talos this does not survive a reboot; set machine sysctl vm.nr_hugepages (see `talon doctor`)"
            );
        }
        if n > 0 {
            match hugepages::ensure_hugetlbfs(root)? {
                hugepages::MountOutcome::Mounted(p) => println!("mounted hugetlbfs at {}", p.display()),
                hugepages::MountOutcome::AlreadyMounted(p) => {
                    println!("hugetlbfs mounted at {}", p.display())
                }
            }
            if root.is_real() && hugepages::default_size(root) == Some(h.size) {
                hugepages::prove_usable(root, h.size)?;
                println!("mapped one {} page: usable", h.size);
            }
        }
        return Ok(());
    }
    let pools = hugepages::pools(root)?;
    print(output, &pools, || {
        let mut s = String::from("SIZE  NODE    TOTAL  FREE   TOTAL-MiB\n");
        for p in &pools {
            let node = p.node.map_or("-".to_string(), |n| n.to_string());
            s.push_str(&format!(
                "{:<5} {:<7} {:<6} {:<6} {}\n",
                p.size.to_string(),
                node,
                p.total,
                p.free,
                p.total_mib()
            ));
        }
        s
    })
}

fn node_text(node: Option<u32>) -> String {
    node.map(|n| format!(" on node {n}")).unwrap_or_default()
}

fn run_pci(root: &HostRoot, output: Output, cmd: PciCommand) -> Result<(), crate::cli::CliError> {
    match cmd {
        PciCommand::List => {
            let devs = pci::list_nvme(root)?;
            print(output, &devs, || {
                let mut s = String::from(
                    "BDF           VENDOR:DEVICE  NUMA DRIVER           IOMMU  BLOCK        SIZE        SERIAL / MODEL\n",
                );
                for d in &devs {
                    s.push_str(&format!(
                        "{:<13} {}:{}  {:<4} {:<16} {:<6} {:<12} {:<11} {} / {}\n",
                        d.bdf.as_str(),
                        d.vendor.trim_start_matches("0x"),
                        d.device.trim_start_matches("0x"),
                        d.numa_node.map_or("-".into(), |n| n.to_string()),
                        d.driver.as_deref().unwrap_or("-"),
                        d.iommu_group.map_or("-".into(), |g| g.to_string()),
                        if d.block_devices.is_empty() {
                            "-".to_string()
                        } else {
                            d.block_devices.join(",")
                        },
                        d.size_bytes.map_or("-".into(), |b| format!("{} MiB", b >> 20)),
                        d.serial.as_deref().unwrap_or("-"),
                        d.model.as_deref().unwrap_or("-"),
                    ));
                }
                s
            })
        }
        PciCommand::Bind { device, driver } => {
            let on_talos = os::detect(root).map(|o| o.is_talos()).unwrap_or(false);
            let out = pci::bind(
                root,
                &device,
                BindOptions {
                    driver,
                    load_module: !on_talos,
                    data_ok: false,
                },
            )?;
            print(output, &out, || bind_text(&out))
        }
        PciCommand::Unbind { device } => {
            let out = pci::unbind(root, &device)?;
            print(output, &out, || bind_text(&out))
        }
    }
}

fn bind_text(out: &pci::BindOutcome) -> String {
    let from = out.from.as_deref().unwrap_or("no driver");
    if out.changed {
        format!("{}: {from} -> {}\n", out.bdf, out.to)
    } else {
        format!("{}: already on {}\n", out.bdf, out.to)
    }
}
