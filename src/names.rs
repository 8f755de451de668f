//! Validated names. Everything that ends up in a kernel option string
//! (`/dev/nvme-fabrics`), an NQN, an IQN, a bdev name or a file name under the
//! data dir is checked here first and never interpolated raw.
//!
//! ```text
//!   "pvc-1234" ──ObjectName::parse──> ObjectName ──> Nqn::for_volume  nqn.2025-01.io.talon:vol:pvc-1234
//!                                                └─> Iqn::for_volume  iqn.2025-01.io.talon:pvc-1234
//! ```

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// The NQN prefix of talon's subsystems.
pub const NQN_PREFIX: &str = "nqn.2025-01.io.talon";
/// The IQN prefix of talon's iSCSI targets.
pub const IQN_PREFIX: &str = "iqn.2025-01.io.talon";
/// The longest object name: a DNS label.
pub const MAX_NAME_LEN: usize = 63;

/// A name that is not acceptable, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {reason}")]
pub struct InvalidName {
    /// What kind of name (volume, disk, snapshot, NQN, ...).
    pub what: &'static str,
    /// The rejected value.
    pub value: String,
    /// Why it was rejected.
    pub reason: String,
}

fn invalid(what: &'static str, value: &str, reason: impl Into<String>) -> InvalidName {
    InvalidName {
        what,
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// The name of a volume, disk, snapshot or node: a DNS label, `[a-z0-9-]`, 1 to
/// 63 characters, starting and ending with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ObjectName(String);

impl ObjectName {
    /// Validates `value` as the name of a `what` (used in the error).
    pub fn parse(what: &'static str, value: &str) -> Result<Self, InvalidName> {
        if value.is_empty() {
            return Err(invalid(what, value, "a name must not be empty"));
        }
        if value.len() > MAX_NAME_LEN {
            return Err(invalid(
                what,
                value,
                format!("longer than {MAX_NAME_LEN} characters"),
            ));
        }
        if let Some(c) = value
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
        {
            return Err(invalid(
                what,
                value,
                format!("character {c:?} is not allowed (use a-z, 0-9 and '-')"),
            ));
        }
        if value.starts_with('-') || value.ends_with('-') {
            return Err(invalid(what, value, "must start and end with a letter or digit"));
        }
        Ok(Self(value.to_string()))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ObjectName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for ObjectName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse("name", &s).map_err(serde::de::Error::custom)
    }
}

/// Characters that must never reach a comma-separated kernel option string or a
/// shell-free argv position unchecked.
fn check_option_safe(what: &'static str, value: &str, max: usize) -> Result<(), InvalidName> {
    if value.is_empty() {
        return Err(invalid(what, value, "must not be empty"));
    }
    if value.len() > max {
        return Err(invalid(what, value, format!("longer than {max} bytes")));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_')))
    {
        return Err(invalid(what, value, format!("character {c:?} is not allowed")));
    }
    Ok(())
}

/// An NVMe Qualified Name, validated (NVMe base spec: at most 223 bytes,
/// `nqn.yyyy-mm.reverse-domain:...`; talon allows only `[A-Za-z0-9.:_-]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Nqn(String);

impl Nqn {
    /// Validates an NQN given by a user or read from a target.
    pub fn parse(value: &str) -> Result<Self, InvalidName> {
        check_option_safe("NQN", value, 223)?;
        if !value.starts_with("nqn.") {
            return Err(invalid("NQN", value, "must start with \"nqn.\""));
        }
        Ok(Self(value.to_string()))
    }

    /// The NQN of the subsystem that exports a volume's engine.
    pub fn for_volume(volume: &ObjectName) -> Self {
        Self(format!("{NQN_PREFIX}:vol:{volume}"))
    }

    /// The NQN of the subsystem that exports one replica to a remote engine.
    pub fn for_replica(volume: &ObjectName, replica: &str) -> Result<Self, InvalidName> {
        Self::parse(&format!("{NQN_PREFIX}:replica:{volume}:{replica}"))
    }

    /// The NQN as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Nqn {
    type Error = InvalidName;
    fn try_from(s: String) -> Result<Self, InvalidName> {
        Self::parse(&s)
    }
}

impl From<Nqn> for String {
    fn from(n: Nqn) -> String {
        n.0
    }
}

impl fmt::Display for Nqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An iSCSI Qualified Name, validated (RFC 3720: at most 223 bytes,
/// `iqn.yyyy-mm.reverse-domain[:...]`, lower case).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Iqn(String);

impl Iqn {
    /// Validates an IQN given by a user or read from a target.
    pub fn parse(value: &str) -> Result<Self, InvalidName> {
        check_option_safe("IQN", value, 223)?;
        if !value.starts_with("iqn.") {
            return Err(invalid("IQN", value, "must start with \"iqn.\""));
        }
        if value.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(invalid("IQN", value, "must be lower case"));
        }
        Ok(Self(value.to_string()))
    }

    /// The IQN of the iSCSI target that exports a volume.
    pub fn for_volume(volume: &ObjectName) -> Self {
        Self(format!("{IQN_PREFIX}:{volume}"))
    }

    /// talon's own initiator name on a host, from the host's NVMe host ID
    /// (`iqn.2025-01.io.talon:host.<uuid>`; a target's name never contains
    /// `host.`, since `.` is not allowed in volume names).
    pub fn for_host(hostid: &uuid::Uuid) -> Self {
        Self(format!("{IQN_PREFIX}:host.{}", hostid.hyphenated()))
    }

    /// The IQN as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Iqn {
    type Error = InvalidName;
    fn try_from(s: String) -> Result<Self, InvalidName> {
        Self::parse(&s)
    }
}

impl From<Iqn> for String {
    fn from(n: Iqn) -> String {
        n.0
    }
}

impl fmt::Display for Iqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The stable UUID of a volume (v5, in talon's namespace), used as the NVMe
/// namespace UUID and NGUID so that a re-created export looks the same to hosts.
pub fn volume_uuid(volume: &ObjectName) -> uuid::Uuid {
    const TALON_NS: uuid::Uuid = uuid::Uuid::from_u128(0x7a1e_0b5e_0000_4000_8000_7a10_0000_0001);
    uuid::Uuid::new_v5(&TALON_NS, volume.as_str().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_dns_labels() {
        assert!(ObjectName::parse("volume", "pvc-0a1b").is_ok());
        for bad in ["", "-a", "a-", "A", "a_b", "a,b", "a=b", "a b", &"x".repeat(64)] {
            let err = ObjectName::parse("volume", bad).expect_err(bad);
            assert!(err.to_string().starts_with("invalid volume"), "{err}");
        }
    }

    #[test]
    fn nqns_reject_option_injection() {
        let v = ObjectName::parse("volume", "v1").expect("name");
        assert_eq!(Nqn::for_volume(&v).as_str(), "nqn.2025-01.io.talon:vol:v1");
        assert!(Nqn::parse("nqn.x:a,traddr=10.0.0.1").is_err());
        assert!(Nqn::parse("nqn.x:a\nb").is_err());
        assert!(Nqn::parse("iqn.x").is_err());
        assert!(Iqn::parse("iqn.2025-01.io.talon:Vol").is_err());
        assert_eq!(Iqn::for_volume(&v).as_str(), "iqn.2025-01.io.talon:v1");
    }

    #[test]
    fn volume_uuid_is_stable() {
        let v = ObjectName::parse("volume", "v1").expect("name");
        assert_eq!(volume_uuid(&v), volume_uuid(&v));
        assert_ne!(
            volume_uuid(&v),
            volume_uuid(&ObjectName::parse("volume", "v2").expect("name"))
        );
    }
}
