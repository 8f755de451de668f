//! What a backup, restore or delete can fail on, each naming its object.

/// A backupstore error.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The target URL or its credentials are unusable.
    #[error("backup target {url:?}: {reason}")]
    Target { url: String, reason: String },
    /// A folder target's folder is not there: talon makes none (a listing
    /// would otherwise make it, and a store that vanished come back empty).
    #[error(
        "backup target {url:?} does not exist: there is no folder {dir} (create it, or mount the share there)"
    )]
    TargetMissing { url: String, dir: String },
    /// A name that would become an object key breaks Longhorn's rule.
    #[error(
        "{what} name {name:?} is invalid: it must start with a letter or digit and hold only letters, digits, '_', '.' and '-' (2 characters or more)"
    )]
    InvalidName { what: String, name: String },
    /// A name longer than a backup store holds (`name`: its start).
    #[error(
        "{what} name {name:?} is {len} characters long: a backup store holds {what} names of {max} characters at most (a folder target keeps each in one file name)"
    )]
    NameTooLong {
        what: String,
        name: String,
        len: usize,
        max: usize,
    },
    /// The store refused or failed a call.
    #[error("backup store {op} {path}: {source}")]
    Store {
        op: &'static str,
        path: String,
        #[source]
        source: object_store::Error,
    },
    /// A config does not parse.
    #[error("{object}: {reason}")]
    Format { object: String, reason: String },
    /// A block does not decompress to what its name says.
    #[error("block {block} is corrupt: {reason}")]
    CorruptBlock { block: String, reason: String },
    /// Something asked for is not in the store.
    #[error("{0} not found in the backup store")]
    NotFound(String),
    /// The request cannot be carried out as asked.
    #[error("{0}")]
    Invalid(String),
    /// Another writer holds the volume (Longhorn's lock protocol).
    #[error("backup volume {volume} is locked by a {held} in progress; try again later")]
    Locked { volume: String, held: &'static str },
    /// A local file did not fit: its filesystem is full (`room`: where, and
    /// its sizes, [`crate::util::space::no_space`]).
    #[error("{path}: {room}")]
    NoSpace {
        path: String,
        room: String,
        #[source]
        source: std::io::Error,
    },
    /// The snapshot being backed up could not be read (`reason` from its reader).
    #[error("reading snapshot {snapshot}: {reason}")]
    ReadSnapshot { snapshot: String, reason: String },
    /// A restored block could not be written where it goes (a streaming
    /// restore's target; `reason` from its writer).
    #[error("writing block {block} of backup {backup} at offset {offset}: {reason}")]
    WriteBlock {
        block: String,
        backup: String,
        offset: u64,
        reason: String,
    },
    /// Local file I/O.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl BackupError {
    /// Local I/O on `path` failed (on a full filesystem: [`BackupError::NoSpace`]).
    pub fn io(path: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> BackupError {
        let path = path.to_string();
        move |source| {
            if crate::util::space::is_no_space(&source) {
                let p = std::path::Path::new(&path);
                let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(p);
                let room = crate::util::space::no_space(dir, None);
                return BackupError::NoSpace { path, room, source };
            }
            BackupError::Io { path, source }
        }
    }
}
/// `text` with the password of every `http(s)://user:password@` in it (the
/// whole user information for `http(s)://token@`, and for any scheme one
/// with a `:`) replaced by `***`. An S3 target's `s3://bucket@region` holds
/// no password and stays.
pub fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let scheme_start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.'))
            .map_or(0, |i| i + 1);
        let scheme = &rest[scheme_start..at];
        let after = at + 3;
        out.push_str(&rest[..after]);
        let tail = &rest[after..];
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#' | '"' | '\'' | ')' | ']' | '>') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rsplit_once('@') {
            Some((info, host)) => {
                let web = scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https");
                match info.split_once(':') {
                    Some((user, _)) => out.push_str(&format!("{user}:***@{host}")),
                    None if web => out.push_str(&format!("***@{host}")),
                    None => out.push_str(authority),
                }
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}
