//! OS detection from the host's `/etc/os-release`.
//!
//! ```text
//!   HostRoot ── /etc/os-release ──> parse_os_release(text) ──> OsRelease { id, version_id, .. }
//!                                                               └─ is_talos(): ID=talos
//! ```
//!
//! [`parse_os_release`] takes the file text, so a reader that goes through the
//! host mount namespace (`crate::ns`) can reuse it.

use super::{HostIoError, HostRoot};
use serde::{Deserialize, Serialize};

/// Errors of OS detection.
#[derive(Debug, thiserror::Error)]
pub enum OsError {
    #[error("cannot read the host's os-release")]
    ReadOsRelease(#[source] HostIoError),
}

/// The fields of os-release that talon uses.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OsRelease {
    /// `ID` (lower-case, e.g. `talos`, `debian`).
    pub id: String,
    /// `VERSION_ID`, when present.
    pub version_id: Option<String>,
    /// `PRETTY_NAME`, when present.
    pub pretty_name: Option<String>,
}

impl OsRelease {
    /// Whether this is Talos Linux (`ID=talos`).
    pub fn is_talos(&self) -> bool {
        self.id == "talos"
    }
}

/// Parses os-release text (`KEY=value`, values optionally quoted).
pub fn parse_os_release(text: &str) -> OsRelease {
    let mut out = OsRelease::default();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some((key, raw)) = line.split_once('=') else {
            continue;
        };
        let value = unquote(raw.trim());
        match key.trim() {
            "ID" => out.id = value.to_ascii_lowercase(),
            "VERSION_ID" => out.version_id = Some(value),
            "PRETTY_NAME" => out.pretty_name = Some(value),
            _ => {}
        }
    }
    if out.id.is_empty() {
        // os-release(5): ID defaults to "linux".
        out.id = "linux".to_string();
    }
    out
}

fn unquote(v: &str) -> String {
    let stripped = v
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .or_else(|| v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
        .unwrap_or(v);
    stripped.replace("\\\"", "\"").replace("\\\\", "\\")
}

/// Reads `/etc/os-release` (falling back to `/usr/lib/os-release`) through `root`.
pub fn detect(root: &HostRoot) -> Result<OsRelease, OsError> {
    match root.read_string("/etc/os-release") {
        Ok(t) => Ok(parse_os_release(&t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => root
            .read_string("/usr/lib/os-release")
            .map(|t| parse_os_release(&t))
            .map_err(OsError::ReadOsRelease),
        Err(e) => Err(OsError::ReadOsRelease(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_talos_and_debian() {
        let t = parse_os_release(
            "NAME=\"Talos\"\nID=talos\nVERSION_ID=v1.13.0\nPRETTY_NAME=\"Talos (v1.13.0)\"\n",
        );
        assert!(t.is_talos());
        assert_eq!(t.version_id.as_deref(), Some("v1.13.0"));
        assert_eq!(t.pretty_name.as_deref(), Some("Talos (v1.13.0)"));
        let d = parse_os_release("# c\nID='debian'\nVERSION_ID=\"12\"\n");
        assert!(!d.is_talos());
        assert_eq!(d.id, "debian");
        assert_eq!(parse_os_release("").id, "linux");
    }
}
