//! A snapshot's data as a sparse file ([`crate::spdk::volume::to_file`]
//! writes it): which blocks hold data (`SEEK_DATA`/`SEEK_HOLE`), and their
//! bytes.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::error::BackupError;

/// A sparse file holding a volume's data at `data_offset` (the room a raid
/// superblock takes before it on a talon replica).
#[derive(Debug, Clone)]
pub struct SparseImage {
    pub file: PathBuf,
    pub data_offset: u64,
    /// The volume's size in bytes.
    pub size: u64,
    /// The data ranges (volume offsets, end exclusive), ascending.
    ranges: Vec<(u64, u64)>,
}

impl SparseImage {
    /// Opens `file` and finds its data ranges within the volume.
    pub fn open(file: &Path, data_offset: u64, size: u64) -> Result<SparseImage, BackupError> {
        let ranges = data_ranges(file, data_offset, data_offset + size)?
            .into_iter()
            .map(|(s, e)| (s - data_offset, e - data_offset))
            .collect();
        Ok(SparseImage {
            file: file.to_owned(),
            data_offset,
            size,
            ranges,
        })
    }

    /// The offsets of the `block_size` blocks that hold data, ascending.
    pub fn blocks(&self, block_size: u64) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        for &(s, e) in &self.ranges {
            let mut b = s / block_size * block_size;
            while b < e {
                if out.last() != Some(&b) {
                    out.push(b);
                }
                b += block_size;
            }
        }
        out
    }

    /// Whether block `[offset, offset + len)` is data throughout (no hole).
    pub fn whole(&self, offset: u64, len: u64) -> bool {
        let end = (offset + len).min(self.size);
        self.ranges.iter().any(|&(s, e)| s <= offset && e >= end)
    }

    /// The bytes of `[offset, offset + buf.len())`, zeros past the volume's end.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackupError> {
        let f = std::fs::File::open(&self.file).map_err(BackupError::io(self.file.display()))?;
        buf.fill(0);
        let n = (self.size.saturating_sub(offset)).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], self.data_offset + offset)
            .map_err(BackupError::io(self.file.display()))
    }

    /// Bytes of data it holds.
    pub fn data_bytes(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }
}

/// The data ranges of `file` within `[from, to)` (file offsets).
fn data_ranges(file: &Path, from: u64, to: u64) -> Result<Vec<(u64, u64)>, BackupError> {
    use nix::unistd::{Whence, lseek};
    let f = std::fs::File::open(file).map_err(BackupError::io(file.display()))?;
    let len = f.metadata().map_err(BackupError::io(file.display()))?.len();
    let to = to.min(len);
    let mut out = Vec::new();
    let mut pos = from;
    while pos < to {
        let start = match lseek(&f, pos as i64, Whence::SeekData) {
            Ok(s) => s as u64,
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(BackupError::io(file.display())(e.into())),
        };
        if start >= to {
            break;
        }
        let end = match lseek(&f, start as i64, Whence::SeekHole) {
            Ok(e) => (e as u64).min(to),
            Err(e) => return Err(BackupError::io(file.display())(e.into())),
        };
        out.push((start, end));
        pos = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_file_names_its_data_blocks() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("img");
        let f = std::fs::File::create(&p).expect("create");
        let room = 1 << 20;
        f.set_len(room + (16 << 20)).expect("set_len");
        // 1 MiB at volume offset 4 MiB + 1 MiB, 4 KiB at 10 MiB
        f.write_all_at(&[7u8; 1 << 20], room + (5 << 20))
            .expect("write_all_at");
        f.write_all_at(&[9u8; 4096], room + (10 << 20))
            .expect("write_all_at");
        f.write_all_at(&[1u8; 4096], 0).expect("write_all_at"); // the superblock room is not the volume's
        drop(f);
        let img = SparseImage::open(&p, room, 16 << 20).expect("open");
        assert_eq!(img.blocks(2 << 20), vec![4 << 20, 10 << 20]);
        assert!(!img.whole(4 << 20, 2 << 20));
        assert!(img.whole(5 << 20, 1 << 20));
        let mut buf = vec![0u8; 2 << 20];
        img.read(4 << 20, &mut buf).expect("read");
        assert!(buf[..1 << 20].iter().all(|&b| b == 0) && buf[1 << 20..].iter().all(|&b| b == 7));
    }
}
