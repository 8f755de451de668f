//! Crash tests: with `TALON_FAILPOINT=<name>` the process kills itself with
//! SIGKILL when it reaches the point `name` (as `kill -9` would: no
//! destructor runs, nothing is flushed), so a test can cut a sequence short
//! at each of its steps and check what the next talon makes of it. Without
//! the variable a point costs one environment lookup.
//!
//! The named points:
//!
//! | point                    | where                                                   |
//! |--------------------------|---------------------------------------------------------|
//! | `pci-after-intent`       | a rebind's intent persisted (`controllers::host`)       |
//! | `pci-after-override`     | `driver_override` written                               |
//! | `pci-after-unbind`       | the old driver unbound                                  |
//! | `pci-after-probe`        | the new driver bound                                    |
//! | `rebuild-switch-closed`  | a thin rebuild's switch: hosts off, raid deleted        |
//! | `rebuild-switch-copied`  | the switch's last copy kept in the dest, no raid yet    |
//! | `rebuild-switch-joined`  | the raid made again with the dest and exported, before  |
//! |                          | the engine records the dest current                     |
//! | `snapshot-frozen`        | a snapshot's export frozen, nothing taken yet           |
//! | `snapshot-local-taken`   | a snapshot's local replicas taken, the export frozen;   |
//! |                          | another node's call may not have answered yet           |
//! | `snapshot-taken`         | every replica's snapshot taken, the export still frozen |
//! | `revert-taken-down`      | a revert's export and raid gone, no head made again yet |
//! | `revert-head-remade`     | a revert's first head made again from its snapshot      |

/// Faults a test turns on and off while talon runs: with `TALON_FAULTS=<dir>`,
/// fault `name` is on while the file `<dir>/<name>` exists. Without the
/// variable a fault costs one environment lookup.
///
/// | fault                        | while on                                             |
/// |------------------------------|------------------------------------------------------|
/// | `longhorn-switch-promoting`  | an engine-frontend's `promoting` phase is refused    |
/// |                              | (UNAVAILABLE) before any of its steps                |
/// | `longhorn-engine-error`      | every Longhorn engine of this node not going away is |
/// |                              | reported in error, nothing of it made or changed;    |
/// |                              | a file with lines: only engines named with one of    |
/// |                              | them as the start ([`fault_for`])                    |
/// | `longhorn-replica-get-down`  | SPDKService's `ReplicaGet` answers UNAVAILABLE (the  |
/// |                              | replica's export still serves): a slow node          |
pub fn fault(name: &str) -> bool {
    std::env::var_os("TALON_FAULTS").is_some_and(|dir| std::path::Path::new(&dir).join(name).exists())
}

/// Whether fault `name` is on for object `id`: its file exists and is empty
/// (every object), or one of its non-empty lines starts `id`.
pub fn fault_for(name: &str, id: &str) -> bool {
    let Some(dir) = std::env::var_os("TALON_FAULTS") else {
        return false;
    };
    match std::fs::read_to_string(std::path::Path::new(&dir).join(name)) {
        Ok(text) => scoped(&text, id),
        Err(_) => false,
    }
}

/// A fault file's `text` covers `id`: empty, or a line that starts `id`.
fn scoped(text: &str, id: &str) -> bool {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty()).peekable();
    lines.peek().is_none() || lines.any(|l| id.starts_with(l))
}

/// Kills this process (SIGKILL) when `TALON_FAILPOINT` names `name`.
pub fn failpoint(name: &str) {
    if std::env::var_os("TALON_FAILPOINT").is_some_and(|v| v == name) {
        eprintln!("TALON_FAILPOINT={name}: killing this process");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::scoped;

    #[test]
    fn an_empty_fault_file_covers_every_object_one_with_lines_only_those_they_start() {
        assert!(scoped("", "vol-e-1"));
        assert!(scoped("\n  \n", "vol-e-1"));
        assert!(scoped("other-\nvol-mig-e-\n", "vol-mig-e-3"));
        assert!(!scoped("vol-mig-e-\n", "vol-e-1"));
    }
}
