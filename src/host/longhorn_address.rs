//! The address Longhorn instances are reached at: where replica and engine
//! exports listen and what their endpoints say, derived as Longhorn's
//! instance-manager derives it (go-common-libs `net.GetIPForPod`, which
//! longhorn-spdk-engine uses for every replica and engine target).
//!
//! ```text
//!   IPv4 of interface lhnet1 (Longhorn's storage network, when the pod has it)
//!     else $POD_IP (the instance-manager pod's IP: longhorn-manager sets it from status.podIP)
//!     else the node's listenAddress (talon outside a Longhorn pod: tests, benches, hand-run nodes)
//! ```
//!
//! longhorn-manager reaches the gRPC services at the pod IP (talon binds
//! `--longhorn-listen`, 0.0.0.0:8500 in the pod), and hands remote engines
//! each replica's address at the storage IP: an export listening on another
//! address (the node's, when the pod has its own network) would not be found.

use std::net::{IpAddr, Ipv4Addr};

/// Longhorn's storage network interface (go-common-libs `StorageNetworkInterface`).
pub const STORAGE_INTERFACE: &str = "lhnet1";
/// The environment variable with the pod's IP (go-common-libs `EnvPodIP`).
pub const POD_IP_ENV: &str = "POD_IP";

/// Why no instance address was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// `$POD_IP` is set but is not an IP address.
    #[error("{POD_IP_ENV}={value:?} is not an IP address")]
    PodIp {
        /// Its value.
        value: String,
    },
    /// Neither the storage interface nor `$POD_IP`, and the node's
    /// `listenAddress` is not an IP address.
    #[error(
        "no address for Longhorn instances: no {STORAGE_INTERFACE} interface, no {POD_IP_ENV}, and the node's listenAddress {listen_address:?} is not an IP address"
    )]
    NoAddress {
        /// The node's `listenAddress`.
        listen_address: String,
    },
}

/// The instance address on this host: see the module doc. `listen_address`
/// is the node's `listenAddress`.
pub fn instance_ip(listen_address: &str) -> Result<IpAddr, AddressError> {
    choose(
        interface_ipv4(STORAGE_INTERFACE),
        std::env::var(POD_IP_ENV).ok().as_deref(),
        listen_address,
    )
}

/// The choice itself, on what was found.
pub fn choose(
    storage: Option<Ipv4Addr>,
    pod_ip: Option<&str>,
    listen_address: &str,
) -> Result<IpAddr, AddressError> {
    if let Some(ip) = storage {
        return Ok(IpAddr::V4(ip));
    }
    if let Some(p) = pod_ip.map(str::trim).filter(|p| !p.is_empty()) {
        return p.parse().map_err(|_| AddressError::PodIp { value: p.to_owned() });
    }
    listen_address.parse().map_err(|_| AddressError::NoAddress {
        listen_address: listen_address.to_owned(),
    })
}

/// The first IPv4 address of interface `name`, if it has one.
pub fn interface_ipv4(name: &str) -> Option<Ipv4Addr> {
    nix::ifaddrs::getifaddrs()
        .ok()?
        .filter(|a| a.interface_name == name)
        .find_map(|a| a.address.and_then(|s| s.as_sockaddr_in().map(|v4| v4.ip())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_network_then_pod_ip_then_node() {
        let lh = Ipv4Addr::new(10, 42, 0, 7);
        assert_eq!(
            choose(Some(lh), Some("10.0.0.5"), "192.168.1.2"),
            Ok(IpAddr::V4(lh))
        );
        assert_eq!(
            choose(None, Some("10.0.0.5"), "192.168.1.2"),
            Ok("10.0.0.5".parse().expect("ip"))
        );
        assert_eq!(
            choose(None, Some(" "), "192.168.1.2"),
            Ok("192.168.1.2".parse().expect("ip"))
        );
        assert_eq!(choose(None, None, "fd00::1"), Ok("fd00::1".parse().expect("ip")));
        let e = choose(None, Some("pod"), "127.0.0.1").expect_err("bad POD_IP");
        assert_eq!(e, AddressError::PodIp { value: "pod".into() });
        assert!(e.to_string().contains("POD_IP=\"pod\""), "{e}");
        let e = choose(None, None, "").expect_err("nothing").to_string();
        assert!(e.contains("lhnet1") && e.contains("listenAddress"), "{e}");
    }

    #[test]
    fn loopback_has_an_ipv4() {
        assert_eq!(interface_ipv4("lo"), Some(Ipv4Addr::LOCALHOST));
        assert_eq!(interface_ipv4("no-such-interface0"), None);
    }
}
