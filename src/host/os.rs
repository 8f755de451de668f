//! OS detection from the host's `/etc/os-release`: the one os-release type
//! and parser of talon.
//!
//! ```text
//!   HostRoot ── /etc/os-release ──────────────┐
//!   ns::read_file (a mount namespace) ────────┴─> OsRelease::parse(text) ──> OsRelease { id, version_id, .. }
//!                                                                             └─ is_talos(): ID=talos
//! ```

use std::collections::BTreeMap;

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

    /// Parses os-release text: `KEY=value` lines, values optionally in single
    /// or double quotes with backslash escapes; comments and malformed lines
    /// skipped. `ID` is lower-cased, and `linux` when absent (os-release(5)).
    pub fn parse(text: &str) -> OsRelease {
        let mut fields = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((key, raw)) = line.split_once('=') else {
                continue;
            };
            let key = key.trim();
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                continue;
            }
            fields.insert(key.to_string(), unquote(raw.trim()));
        }
        OsRelease {
            id: fields
                .get("ID")
                .map_or_else(|| "linux".to_string(), |id| id.to_ascii_lowercase()),
            version_id: fields.remove("VERSION_ID"),
            pretty_name: fields.remove("PRETTY_NAME"),
        }
    }
}

fn unquote(raw: &str) -> String {
    let mut chars = raw.chars();
    let quote = match raw.chars().next() {
        Some(q @ ('"' | '\'')) => {
            chars.next();
            Some(q)
        }
        _ => None,
    };
    let mut out = String::new();
    while let Some(c) = chars.next() {
        match (c, quote) {
            (c, Some(q)) if c == q => break,
            ('\\', Some('"')) | ('\\', None) => {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            }
            (c, _) => out.push(c),
        }
    }
    out
}

/// Reads `/etc/os-release` (or `/usr/lib/os-release`) inside the mount
/// namespace of `target`.
pub fn read_in(root: &HostRoot, target: &crate::ns::Target) -> Result<OsRelease, crate::ns::NsError> {
    let text = match crate::ns::read_file(root, target, "/etc/os-release") {
        Err(crate::ns::NsError::ReadFile { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            crate::ns::read_file(root, target, "/usr/lib/os-release")?
        }
        r => r?,
    };
    Ok(OsRelease::parse(&String::from_utf8_lossy(&text)))
}

/// Reads `/etc/os-release` (falling back to `/usr/lib/os-release`) through `root`.
/// On the real root the file is read inside the host's mount namespace (pid 1),
/// so a containerized talon sees the node's OS, not its image's; where that
/// namespace cannot be entered (no privilege) it falls back to the root handle.
pub fn detect(root: &HostRoot) -> Result<OsRelease, OsError> {
    if root.is_real() {
        match read_in(root, &crate::ns::Target::Host) {
            Ok(os) => return Ok(os),
            Err(e) => {
                tracing::debug!(error = %e, "host mount namespace not readable; reading os-release through the root handle")
            }
        }
    }
    match root.read_string("/etc/os-release") {
        Ok(t) => Ok(OsRelease::parse(&t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => root
            .read_string("/usr/lib/os-release")
            .map(|t| OsRelease::parse(&t))
            .map_err(OsError::ReadOsRelease),
        Err(e) => Err(OsError::ReadOsRelease(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_talos_and_debian() {
        let t = OsRelease::parse(
            "NAME=\"Talos\"\nID=talos\nVERSION_ID=v1.13.0\nPRETTY_NAME=\"Talos (v1.13.0)\"\n",
        );
        assert!(t.is_talos());
        assert_eq!(t.version_id.as_deref(), Some("v1.13.0"));
        assert_eq!(t.pretty_name.as_deref(), Some("Talos (v1.13.0)"));
        let d = OsRelease::parse("# c\nID='debian'\nVERSION_ID=\"12\"\n");
        assert!(!d.is_talos());
        assert_eq!(d.id, "debian");
        assert_eq!(OsRelease::parse("").id, "linux");
    }

    #[test]
    fn parses_quoting_and_escapes() {
        let text = "# comment\nNAME=\"Talos\"\nID=Talos\nVERSION_ID=v1.11.0\n\
                    PRETTY_NAME=\"Talos (v1.11.0) \\\"x\\\"\"\nHOME_URL='https://x/$y'\nbad line\n";
        let rel = OsRelease::parse(text);
        assert_eq!(rel.id, "talos");
        assert_eq!(rel.version_id.as_deref(), Some("v1.11.0"));
        assert_eq!(rel.pretty_name.as_deref(), Some("Talos (v1.11.0) \"x\""));
        let empty = OsRelease::parse("");
        assert_eq!(
            (empty.id.as_str(), empty.pretty_name, empty.version_id),
            ("linux", None, None)
        );
    }

    /// Read through the mount namespace of our own process (no switch needed).
    #[test]
    fn reads_in_a_mount_namespace() {
        let me = crate::ns::Target::Pid(std::process::id());
        let rel = read_in(&HostRoot::real(), &me).expect("os-release");
        assert!(!rel.id.is_empty());
    }
}
