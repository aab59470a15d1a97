//! Whether a zip archive's bytes (`torch.save`'s format) are those that were written: every
//! entry read to its end against the CRC-32 the archive keeps for it. torch's own reader checks
//! none of them, so a damaged copy loads as other numbers.
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Why an archive could not be read back.
#[derive(Debug)]
pub enum Unreadable {
    /// Its bytes are not what was written: what is wrong, naming the entry.
    Damaged(String),
    /// Reading failed (the file is not damaged as far as is known): what could not be read
    /// (the file, or an entry of it), and why.
    Io(String, std::io::Error),
}

/// Whether `path` starts as a zip archive does (torch.save's format since torch 1.6).
pub fn is_zip(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"PK\x03\x04")
}

/// Reads every entry of the archive at `path` to its end, checking its CRC-32; the bytes read.
pub fn read_back(path: &Path) -> Result<u64, Unreadable> {
    let file = File::open(path).map_err(|e| Unreadable::Io("it cannot be opened".into(), e))?;
    let mut archive = zip::ZipArchive::new(file)
        .map_err(|e| Unreadable::Damaged(format!("not a readable zip archive ({e})")))?;
    let mut bytes = 0;
    let mut buffer = vec![0u8; 1 << 20];
    for i in 0..archive.len() {
        let mut entry = archive
            .by_index(i)
            .map_err(|e| Unreadable::Damaged(format!("entry {i} cannot be read ({e})")))?;
        let name = entry
            .name()
            .map_or_else(|_| format!("entry {i}"), |n| n.into_owned());
        loop {
            match entry.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => bytes += n as u64,
                Err(e)
                    if e.kind() == std::io::ErrorKind::InvalidData
                        || e.to_string().contains("checksum") =>
                {
                    return Err(Unreadable::Damaged(format!(
                        "entry `{name}` does not match the CRC-32 the archive keeps for it ({e})"
                    )))
                }
                Err(e) => return Err(Unreadable::Io(format!("entry `{name}` cannot be read"), e)),
            }
        }
    }
    Ok(bytes)
}
