//! TensorBoard event files, written natively: a TFRecord stream of `Event` protobufs, each a
//! scalar summary, or an image one for a video (an animated GIF, which TensorBoard's image
//! dashboard plays). Only the handful of protobuf fields these need are encoded.
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{Record, Sink, Video};
use crate::error::{Error, Result};

/// An image file's bytes and its size.
pub struct EncodedImage<'a> {
    pub bytes: &'a [u8],
    pub width: usize,
    pub height: usize,
}

pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// Creates `events.out.tfevents.<time>.<host>.<pid>.<n>` in `dir` and writes the version
    /// record, then a session start at `from`: TensorBoard drops the events of earlier files at
    /// that step and later (those of an attempt a resumed run undoes).
    pub fn create(dir: &Path, from: u64) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let host = host_name();
        // Unique to this writer: a restart within the same second must not truncate the file
        // of the attempt before.
        static WRITERS: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "events.out.tfevents.{}.{host}.{:010}.{:06}",
            wall_time() as u64,
            std::process::id(),
            WRITERS.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let file =
            File::create(&path).map_err(|e| Error::io(format!("create {}", path.display()), e))?;
        let mut writer = Self {
            path,
            out: BufWriter::new(file),
        };
        let mut event = Vec::new();
        put_double(&mut event, 1, wall_time());
        put_bytes(&mut event, 3, b"brain.Event:2");
        writer.record(&event)?;
        const START: u64 = 1;
        let mut session_log = Vec::new();
        put_varint_field(&mut session_log, 1, START);
        let mut event = Vec::new();
        put_double(&mut event, 1, wall_time());
        put_varint_field(&mut event, 2, from);
        put_bytes(&mut event, 7, &session_log);
        writer.record(&event)?;
        writer.flush()?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one scalar (`tag` at `step`).
    pub fn scalar(&mut self, tag: &str, value: f32, step: i64) -> Result<()> {
        let mut summary_value = Vec::new();
        put_bytes(&mut summary_value, 1, tag.as_bytes());
        put_float(&mut summary_value, 2, value);
        self.summary(&summary_value, step)
    }

    /// Appends one encoded image (PNG, JPEG or GIF: `tag` at `step`).
    pub fn image(&mut self, tag: &str, image: &EncodedImage<'_>, step: i64) -> Result<()> {
        const RGB: u64 = 3;
        let mut fields = Vec::new();
        put_varint_field(&mut fields, 1, image.height as u64);
        put_varint_field(&mut fields, 2, image.width as u64);
        put_varint_field(&mut fields, 3, RGB);
        put_bytes(&mut fields, 4, image.bytes);
        let mut summary_value = Vec::new();
        put_bytes(&mut summary_value, 1, tag.as_bytes());
        put_bytes(&mut summary_value, 4, &fields);
        self.summary(&summary_value, step)
    }

    fn summary(&mut self, summary_value: &[u8], step: i64) -> Result<()> {
        let mut summary = Vec::new();
        put_bytes(&mut summary, 1, summary_value);
        let mut event = Vec::new();
        put_double(&mut event, 1, wall_time());
        put_varint_field(&mut event, 2, step as u64);
        put_bytes(&mut event, 5, &summary);
        self.record(&event)
    }

    pub fn flush(&mut self) -> Result<()> {
        self.out
            .flush()
            .map_err(|e| Error::io(format!("write {}", self.path.display()), e))
    }

    fn record(&mut self, data: &[u8]) -> Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let mut bytes = Vec::with_capacity(data.len() + 16);
        bytes.extend_from_slice(&len);
        bytes.extend_from_slice(&masked_crc(&len).to_le_bytes());
        bytes.extend_from_slice(data);
        bytes.extend_from_slice(&masked_crc(data).to_le_bytes());
        self.out
            .write_all(&bytes)
            .map_err(|e| Error::io(format!("write {}", self.path.display()), e))
    }
}

/// Each value becomes the scalar `<phase>/<key>` at the record's step.
impl Sink for EventWriter {
    fn name(&self) -> &'static str {
        "tensorboard"
    }

    fn write(&mut self, record: &Record) -> Result<()> {
        for (k, v) in &record.values {
            self.scalar(
                &format!("{}/{k}", record.phase.name()),
                *v as f32,
                record.step as i64,
            )?;
        }
        self.flush()
    }

    fn video(&mut self, video: &Video) -> Result<()> {
        let image = EncodedImage {
            bytes: &video.gif,
            width: video.width,
            height: video.height,
        };
        self.image(super::VIDEO_TAG, &image, video.step as i64)?;
        self.flush()
    }

    fn close(&mut self) -> Result<()> {
        self.flush()
    }
}

/// Drops the events past step `through` (all but the version records, for `None`) from the
/// event files in `dir`: an earlier attempt's, which a resumed run undoes. TensorBoard's
/// Python loader drops them at the new file's session start, but its fast loader (the
/// default, where its data server is installed) ignores that and keeps them. A record cut by
/// a crash goes too; a file whose records all stay is left untouched. The file as it was stays
/// beside it under a name TensorBoard does not read (`tf-events` for `tfevents`). A file that
/// cannot be rewritten (another user's, a full disk) is a warning: the run goes on.
pub fn drop_events_after(dir: &Path, through: Option<u64>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        if !name.contains("tfevents") {
            continue;
        }
        if let Err(e) = rewrite_through(&path, &name, through) {
            errln!(
                "warning: {} keeps the events an earlier attempt wrote past the checkpoint \
                 ({e}); TensorBoard's fast loader may show them",
                path.display()
            );
        }
    }
}

fn rewrite_through(path: &Path, name: &str, through: Option<u64>) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    // SAFETY: geteuid has no preconditions.
    if meta.uid() != unsafe { libc::geteuid() } || meta.permissions().readonly() {
        return Err(std::io::Error::other("not ours to rewrite"));
    }
    // Record by record, twice (whether any goes, then the copy): a file holding every video's
    // GIF may be gigabytes, which rank 0 would otherwise hold twice in memory.
    let records = || -> std::io::Result<Records<BufReader<File>>> {
        Ok(Records::new(BufReader::new(File::open(path)?), meta.len()))
    };
    if !copy_kept(records()?, through, &mut std::io::sink())? {
        return Ok(());
    }
    // The file kept under a name TensorBoard does not read: it reads every `*tfevents*`.
    let kept_as = name.replace("tfevents", "tf-events");
    crate::whole_file::replace_keeping_with(path, &kept_as, |file| {
        let mut out = BufWriter::new(file);
        copy_kept(records()?, through, &mut out)?;
        out.flush()
    })
    .map(drop)
}

/// Writes to `out` the records whose events are at step `through` or before, or carry the
/// file's version; up to the first record that is cut short. Whether any record was left out.
fn copy_kept<R: Read>(
    mut records: Records<R>,
    through: Option<u64>,
    out: &mut impl Write,
) -> std::io::Result<bool> {
    let mut left_out = false;
    while let Some(record) = records.next_record()? {
        let (version, step) = event_fields(&record[12..record.len() - 4]);
        match version || through.is_some_and(|t| step <= t) {
            true => out.write_all(&record)?,
            false => left_out = true,
        }
    }
    Ok(left_out || records.cut)
}

/// The records of a TFRecord stream of `left` bytes, one at a time, whole (its length, that
/// length's CRC, the event, its CRC); the stream ends at its end or at a record cut short.
struct Records<R> {
    input: R,
    left: u64,
    /// Whether the stream ended in a record cut short (a crash mid-write).
    cut: bool,
}

impl<R: Read> Records<R> {
    fn new(input: R, left: u64) -> Self {
        Self {
            input,
            left,
            cut: false,
        }
    }

    fn next_record(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        if self.left == 0 {
            return Ok(None);
        }
        let mut head = [0u8; 8];
        // A length past the stream's end (cut, or garbage) ends it, before any allocation.
        let size = match self.left >= 8 {
            true => {
                self.input.read_exact(&mut head)?;
                u64::from_le_bytes(head)
                    .checked_add(16)
                    .filter(|&size| size <= self.left)
            }
            false => None,
        };
        let Some(size) = size.and_then(|size| usize::try_from(size).ok()) else {
            self.cut = true;
            return Ok(None);
        };
        let mut record = vec![0u8; size];
        record[..8].copy_from_slice(&head);
        self.input.read_exact(&mut record[8..])?;
        self.left -= size as u64;
        Ok(Some(record))
    }
}

/// Whether an `Event` holds the file's version (field 3), and its step (field 2; 0 when
/// absent, as protobuf leaves zeros out).
fn event_fields(mut data: &[u8]) -> (bool, u64) {
    let (mut version, mut step) = (false, 0);
    while let Some((key, rest)) = varint(data) {
        let (field, wire) = (key >> 3, key & 7);
        let rest = match wire {
            0 => match varint(rest) {
                Some((value, rest)) => {
                    if field == 2 {
                        step = value;
                    }
                    rest
                }
                None => break,
            },
            1 => rest.get(8..).unwrap_or_default(),
            2 => match varint(rest) {
                Some((len, rest)) => rest.get(len as usize..).unwrap_or_default(),
                None => break,
            },
            5 => rest.get(4..).unwrap_or_default(),
            _ => break,
        };
        version |= field == 3;
        data = rest;
    }
    (version, step)
}

fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

/// This machine's name for a file's name, its dots as dashes (the name's fields are
/// dot-separated).
fn host_name() -> String {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    let ok = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    match ok && end > 0 {
        true => String::from_utf8_lossy(&name[..end]).replace(['/', '.'], "-"),
        false => "localhost".into(),
    }
}

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// TFRecord's CRC: crc32c, rotated and offset so that CRCs of CRCs stay well distributed.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire_type: u32) {
    put_varint(out, u64::from(field << 3 | wire_type));
}

fn put_varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    put_key(out, field, 0);
    put_varint(out, value);
}

fn put_double(out: &mut Vec<u8>, field: u32, value: f64) {
    put_key(out, field, 1);
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_float(out: &mut Vec<u8>, field: u32, value: f32) {
    put_key(out, field, 5);
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resume at step 3 keeps the events through step 3 (and every version record) of the
    /// files before it, and drops a record cut by a crash; a fresh start keeps none.
    #[test]
    fn events_past_the_resumed_step_are_dropped_from_earlier_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = EventWriter::create(dir.path(), 0).unwrap();
        for step in 0..6 {
            writer
                .scalar("eval/episode_reward", step as f32, step)
                .unwrap();
        }
        writer.flush().unwrap();
        let path = writer.path().to_owned();
        drop(writer);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[9, 0, 0]);
        std::fs::write(&path, &bytes).unwrap();
        let steps = |path: &Path| -> Vec<(bool, u64)> {
            let bytes = std::fs::read(path).unwrap();
            let mut at = 0;
            let mut out = Vec::new();
            while at + 12 <= bytes.len() {
                let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
                out.push(event_fields(&bytes[at + 12..at + 12 + len]));
                at += 16 + len;
            }
            out
        };
        // The version, the session start at 0, then steps 0..=5.
        assert_eq!(steps(&path).len(), 8);
        drop_events_after(dir.path(), Some(3));
        assert_eq!(
            steps(&path),
            [
                (true, 0),
                (false, 0),
                (false, 0),
                (false, 1),
                (false, 2),
                (false, 3)
            ]
        );
        drop_events_after(dir.path(), None);
        assert_eq!(steps(&path), [(true, 0)]);
        // The files as they were stay, under names TensorBoard does not read; a length that
        // overflows is the end of the stream, not a panic.
        let aside: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| !name.contains("tfevents"))
            .collect();
        assert!(
            !aside.is_empty() && aside.iter().all(|n| n.contains("tf-events")),
            "{aside:?}"
        );
        let overflowing = (u64::MAX - 14).to_le_bytes();
        let mut kept = Vec::new();
        let records = Records::new(&overflowing[..], overflowing.len() as u64);
        assert!(copy_kept(records, Some(1), &mut kept).unwrap());
        assert!(kept.is_empty());
    }

    #[test]
    fn varints_and_masked_crc() {
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        // crc32c("123456789") = 0xe3069283 (the standard check value).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(
            masked_crc(b""),
            0u32.rotate_right(15).wrapping_add(0xa282_ead8)
        );
    }
}
