//! Whether a zip archive's bytes (`torch.save`'s format) are those that were written: every
//! entry read to its end against the CRC-32 the archive keeps for it. torch's own reader checks
//! none of them, so a damaged copy loads as other numbers.
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// What reading an archive back found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadBack {
    /// Every entry matched its CRC-32; the bytes read.
    Checked(u64),
    /// The archive records no CRC-32s (torch writes 0s after
    /// `torch.serialization.set_crc32_options(False)`): its bytes cannot be checked.
    NoChecksums,
    /// Left part-way because `stopped` said so: nothing is known of the bytes.
    Stopped,
}

/// Why an archive could not be read back.
#[derive(Debug)]
pub enum Unreadable {
    /// Its bytes are not what was written: what is wrong, naming the entry.
    Damaged(String),
    /// It cannot be opened (not there, no permission).
    CannotOpen(std::io::Error),
    /// Reading it failed part-way (a disk or network error; not known to be damaged): where.
    ReadFailed(String, std::io::Error),
}

/// The first bytes of a zip archive (a local file header).
pub const ZIP_MAGIC: [u8; 4] = *b"PK\x03\x04";

/// Whether `path` starts as a zip archive does (torch.save's format since torch 1.6).
pub fn is_zip(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == ZIP_MAGIC)
}

/// Reads every entry of the archive at `path` to its end, checking its CRC-32; leaves it
/// between two reads of a MiB once `stopped` says so (a file of many GB takes minutes).
pub fn read_back(path: &Path, stopped: &dyn Fn() -> bool) -> Result<ReadBack, Unreadable> {
    let file = File::open(path).map_err(Unreadable::CannotOpen)?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| match e {
        zip::result::ZipError::Io(e) => Unreadable::ReadFailed("its directory".into(), e),
        e => Unreadable::Damaged(format!("not a readable zip archive ({e})")),
    })?;
    if records_no_checksums(&mut archive) {
        return Ok(ReadBack::NoChecksums);
    }
    let mut bytes = 0;
    let mut buffer = vec![0u8; 1 << 20];
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(|e| match e {
            zip::result::ZipError::Io(e) => Unreadable::ReadFailed(format!("entry {i}"), e),
            e => Unreadable::Damaged(format!("entry {i} cannot be read ({e})")),
        })?;
        let name = entry
            .name()
            .map_or_else(|_| format!("entry {i}"), |n| n.into_owned());
        loop {
            if stopped() {
                return Ok(ReadBack::Stopped);
            }
            match entry.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => bytes += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    let what = match e.to_string().to_lowercase().contains("checksum") {
                        true => "does not match the CRC-32 the archive keeps for it",
                        false => "does not read as the archive describes it",
                    };
                    return Err(Unreadable::Damaged(format!("entry `{name}` {what} ({e})")));
                }
                Err(e) => return Err(Unreadable::ReadFailed(format!("entry `{name}`"), e)),
            }
        }
    }
    Ok(ReadBack::Checked(bytes))
}

/// Whether every entry that holds bytes records a CRC-32 of 0: an archive written without
/// them, not one whose every entry was damaged so.
fn records_no_checksums(archive: &mut zip::ZipArchive<File>) -> bool {
    let mut holding = 0;
    for i in 0..archive.len() {
        let Ok(entry) = archive.by_index_raw(i) else {
            return false;
        };
        if entry.size() > 0 {
            if entry.crc32() != 0 {
                return false;
            }
            holding += 1;
        }
    }
    holding > 0
}
