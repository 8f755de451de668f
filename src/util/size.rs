//! Sizes for people: binary units, and in messages the exact byte count beside them.
//!
//! ```text
//!   4294967296 ──human_bytes──> "4 GiB"      ──Bytes──> "4 GiB (4294967296 bytes)"
//!   1610612737 ──human_bytes──> "1.5 GiB"    ──Bytes──> "1.5 GiB (1610612737 bytes)"
//! ```

/// Bytes for people: binary units (KiB, MiB, GiB, TiB), whole when exact,
/// else one decimal ("1 GiB", "1.5 GiB", "512 B").
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut div: u64 = 1;
    while unit + 1 < UNITS.len() && n >= div * 1024 {
        div *= 1024;
        unit += 1;
    }
    if n.is_multiple_of(div) {
        format!("{} {}", n / div, UNITS[unit])
    } else {
        format!("{:.1} {}", n as f64 / div as f64, UNITS[unit])
    }
}

/// A size in an error or log message: binary units and the exact count,
/// "4 GiB (4294967296 bytes)"; below 1 KiB just "512 bytes".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 < 1024 {
            write!(f, "{} bytes", self.0)
        } else {
            write!(f, "{} ({} bytes)", human_bytes(self.0), self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units_with_the_exact_count() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
        assert_eq!(Bytes(4 << 30).to_string(), "4 GiB (4294967296 bytes)");
        assert_eq!(Bytes((4 << 30) + 512).to_string(), "4.0 GiB (4294967808 bytes)");
        assert_eq!(Bytes(512).to_string(), "512 bytes");
    }
}
