//! Safetensors files read and written straight between the file and the tensors' own memory.
//! torch's reader takes the whole file into memory and then copies each tensor out of it, and
//! its writer copies every tensor into a buffer of its own first: a replay buffer of 12 GB
//! needed 24 GB on top of its ring to restore, and as much again to save. Here each tensor's
//! bytes go between the file and the tensor itself (a tensor off the CPU a slice of rows at a
//! time), so the tensors are all there is.
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tch::{Kind, Tensor};

use crate::error::{Error, Result};

/// One entry of the file's JSON header.
#[derive(Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<i64>,
    data_offsets: [u64; 2],
}

/// The largest header safetensors writes (100 MB).
const MAX_HEADER: u64 = 100_000_000;

/// A safetensors file, open: its tensors' shapes and kinds from its header (checked against
/// the file's length), their rows read when asked for.
pub struct TensorFile {
    file: File,
    path: PathBuf,
    /// By name: shape, kind, and where its bytes begin in the file.
    entries: BTreeMap<String, (Vec<i64>, Kind, u64)>,
}

impl TensorFile {
    pub fn open(path: &Path) -> Result<Self> {
        let bad = |why: String| Error::Checkpoint(format!("{}: {why}", path.display()));
        let io = |e: std::io::Error| Error::io(format!("read {}", path.display()), e);
        let mut file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut len = [0u8; 8];
        file.read_exact(&mut len).map_err(io)?;
        let header_len = u64::from_le_bytes(len);
        if header_len > MAX_HEADER || 8 + header_len > file_len {
            return Err(bad(format!(
                "a header of {header_len} bytes in a file of {file_len}: not a safetensors file"
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header).map_err(io)?;
        let mut listed: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&header)
            .map_err(|e| bad(format!("its header is not safetensors JSON ({e})")))?;
        listed.remove("__metadata__");
        let data_start = 8 + header_len;
        let mut entries = BTreeMap::new();
        for (name, entry) in listed {
            let entry: Entry =
                serde_json::from_value(entry).map_err(|e| bad(format!("tensor {name}: {e}")))?;
            let kind = kind_of(&entry.dtype)
                .ok_or_else(|| bad(format!("tensor {name}: dtype {} unknown", entry.dtype)))?;
            let [begin, end] = entry.data_offsets;
            let numel = entry
                .shape
                .iter()
                .try_fold(1i64, |n, &d| (d >= 0).then(|| n.checked_mul(d)).flatten());
            let bytes = numel.and_then(|n| (n as u64).checked_mul(kind.elt_size_in_bytes() as u64));
            let past_the_end = data_start
                .checked_add(end)
                .is_none_or(|last| last > file_len);
            if bytes != Some(end.saturating_sub(begin)) || end < begin || past_the_end {
                return Err(bad(format!(
                    "tensor {name}: shape {:?} of {} does not fit bytes {begin}..{end} of the \
                     file's {} data bytes",
                    entry.shape,
                    entry.dtype,
                    file_len.saturating_sub(data_start)
                )));
            }
            entries.insert(name, (entry.shape, kind, data_start + begin));
        }
        Ok(Self {
            file,
            path: path.to_owned(),
            entries,
        })
    }

    /// The shape and kind of tensor `name`, if the file holds it.
    pub fn describe(&self, name: &str) -> Option<(Vec<i64>, Kind)> {
        let (shape, kind, _) = self.entries.get(name)?;
        Some((shape.clone(), *kind))
    }

    /// Rows `start..start + count` of tensor `name` (along its first dimension; all of a
    /// scalar), on the CPU.
    pub fn rows(&self, name: &str, start: i64, count: i64) -> Result<Tensor> {
        let (shape, kind, at) = self.entries.get(name).ok_or_else(|| {
            Error::Checkpoint(format!("{}: no tensor {name}", self.path.display()))
        })?;
        let mut part = shape.clone();
        let row_numel: i64 = shape.iter().skip(1).product();
        if let Some(first) = part.first_mut() {
            if start < 0 || count < 0 || start + count > *first {
                return Err(Error::Checkpoint(format!(
                    "{}: rows {start}..{} of tensor {name}, which has {first}",
                    self.path.display(),
                    start + count
                )));
            }
            *first = count;
        }
        let row_bytes = (row_numel * kind.elt_size_in_bytes() as i64) as u64;
        let tensor = Tensor::f_empty(&part, (*kind, tch::Device::Cpu))?;
        let len = tensor.numel() * kind.elt_size_in_bytes();
        if len > 0 {
            // SAFETY: `tensor` is a fresh contiguous CPU tensor of exactly `len` bytes, owned
            // here and not shared until it is returned.
            let target =
                unsafe { std::slice::from_raw_parts_mut(tensor.data_ptr() as *mut u8, len) };
            self.file
                .read_exact_at(target, at + start.max(0) as u64 * row_bytes)
                .map_err(|e| Error::io(format!("read {}", self.path.display()), e))?;
        }
        Ok(tensor)
    }

    /// Every tensor whole, by name.
    pub fn read_all(&self) -> Result<Vec<(String, Tensor)>> {
        (self.entries.iter())
            .map(|(name, (shape, _, _))| {
                let rows = shape.first().copied().unwrap_or(1);
                Ok((name.clone(), self.rows(name, 0, rows)?))
            })
            .collect()
    }
}

/// The named tensors of the safetensors file at `path`, on the CPU, by name.
pub fn read(path: &Path) -> Result<Vec<(String, Tensor)>> {
    TensorFile::open(path)?.read_all()
}

/// Writes the named `tensors` to `path` as a safetensors file (in name order, as torch's
/// writer lays them out), each from its own memory; returns the file's crc32c, taken from the
/// bytes as they are written (a large file is not read again for it).
pub fn write(path: &Path, tensors: &[(String, Tensor)]) -> Result<u32> {
    write_in_slices(path, tensors, 64 << 20)
}

/// A writer that hashes (crc32c) what it passes on.
struct Hashing<W> {
    inner: W,
    crc: u32,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(bytes)?;
        self.crc = crc32c::crc32c_append(self.crc, &bytes[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// As [`write`], each tensor in slices of rows of at most `slice_bytes` (one row at least).
fn write_in_slices(path: &Path, tensors: &[(String, Tensor)], slice_bytes: i64) -> Result<u32> {
    let io = |e: std::io::Error| Error::io(format!("write {}", path.display()), e);
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, tensor) in &sorted {
        let dtype = KINDS
            .iter()
            .find(|(_, kind)| *kind == tensor.kind())
            .map(|(dtype, _)| *dtype)
            .ok_or_else(|| {
                Error::Checkpoint(format!("tensor {name}: {:?} has no dtype", tensor.kind()))
            })?;
        let bytes = tensor.numel() as u64 * tensor.kind().elt_size_in_bytes() as u64;
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": dtype, "shape": tensor.size(), "data_offsets": [offset, offset + bytes]
            }),
        );
        offset += bytes;
    }
    let mut text = serde_json::to_vec(&header).map_err(|e| Error::Other(e.to_string()))?;
    // The data starts 8-byte aligned, as safetensors pads its header with spaces.
    text.resize(text.len().div_ceil(8) * 8, b' ');
    let mut out = Hashing {
        inner: BufWriter::new(File::create(path).map_err(io)?),
        crc: 0,
    };
    out.write_all(&(text.len() as u64).to_le_bytes())
        .and_then(|()| out.write_all(&text))
        .map_err(io)?;
    for (_, tensor) in sorted {
        write_bytes(&mut out, tensor, slice_bytes).map_err(|e| match e {
            Error::Io { .. } => e,
            e => Error::Checkpoint(format!("{}: {e}", path.display())),
        })?;
    }
    out.inner
        .into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    Ok(out.crc)
}

/// A tensor's bytes in row-major order, `slice_bytes` of rows at a time: a contiguous CPU
/// tensor's straight from its memory (its slices are views), another's through a copy a slice.
fn write_bytes(out: &mut impl Write, tensor: &Tensor, slice_bytes: i64) -> Result<()> {
    let io = |e: std::io::Error| Error::io("write a tensor", e);
    if tensor.numel() == 0 {
        return Ok(());
    }
    let rows = tensor.size().first().copied().unwrap_or(1);
    let row_bytes =
        (tensor.numel() as i64 / rows.max(1)) * tensor.kind().elt_size_in_bytes() as i64;
    let rows_at_once = (slice_bytes / row_bytes.max(1)).max(1);
    let mut start = 0;
    while start < rows {
        let count = rows_at_once.min(rows - start);
        let part = match tensor.dim() {
            0 => tensor.shallow_clone(),
            _ => tensor.f_narrow(0, start, count)?,
        };
        let part = part.f_to_device(tch::Device::Cpu)?.f_contiguous()?;
        let len = part.numel() * part.kind().elt_size_in_bytes();
        // SAFETY: `part` is a contiguous CPU tensor of `len` bytes, alive while they are read.
        let bytes = unsafe { std::slice::from_raw_parts(part.data_ptr() as *const u8, len) };
        out.write_all(bytes).map_err(io)?;
        start += count.max(1);
    }
    Ok(())
}

/// safetensors' dtypes and their tch kinds (little-endian, as torch's are on the CPUs we run
/// on).
const KINDS: [(&str, Kind); 10] = [
    ("F64", Kind::Double),
    ("F32", Kind::Float),
    ("F16", Kind::Half),
    ("BF16", Kind::BFloat16),
    ("I64", Kind::Int64),
    ("I32", Kind::Int),
    ("I16", Kind::Int16),
    ("I8", Kind::Int8),
    ("U8", Kind::Uint8),
    ("BOOL", Kind::Bool),
];

/// The tch kind of a safetensors dtype.
fn kind_of(dtype: &str) -> Option<Kind> {
    KINDS
        .iter()
        .find(|(d, _)| *d == dtype)
        .map(|(_, kind)| *kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_read_back_as_torch_reads_them_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let tensors = vec![
            (
                "obs".to_string(),
                Tensor::randn([5, 3], tch::kind::FLOAT_CPU),
            ),
            (
                "pixels".to_string(),
                Tensor::arange(7, (Kind::Uint8, tch::Device::Cpu)),
            ),
            (
                "steps".to_string(),
                Tensor::arange(4, (Kind::Int64, tch::Device::Cpu)),
            ),
            (
                "empty".to_string(),
                Tensor::zeros([0, 2], tch::kind::FLOAT_CPU),
            ),
            (
                "flags".to_string(),
                Tensor::ones([3], (Kind::Bool, tch::Device::Cpu)),
            ),
        ];
        Tensor::write_safetensors(&tensors, &path).unwrap();
        let ours = read(&path).unwrap();
        let torch = Tensor::read_safetensors(&path).unwrap();
        assert_eq!(ours.len(), torch.len());
        for (name, tensor) in &torch {
            let (_, mine) = ours.iter().find(|(n, _)| n == name).unwrap();
            assert_eq!(mine.kind(), tensor.kind(), "{name}");
            assert_eq!(mine.size(), tensor.size(), "{name}");
            assert!(mine.equal(tensor), "{name}");
        }
        // Cut short: named, not a panic or a short tensor.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("does not fit bytes"), "{e}");
        std::fs::write(&path, b"12345678").unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("not a safetensors file"), "{e}");
        // Offsets near u64::MAX: named, not an overflow that wraps into a read elsewhere.
        let huge = u64::MAX - 4;
        let header = format!(
            r#"{{"t":{{"dtype":"U8","shape":[4],"data_offsets":[{},{huge}]}}}}"#,
            huge - 4
        );
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend(header.as_bytes());
        file.extend([0u8; 4]);
        std::fs::write(&path, file).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("does not fit bytes"), "{e}");
    }

    /// What `write` writes reads back through torch's reader (which checks the layout) and
    /// ours as the tensors written: empty, scalar and strided ones too.
    #[test]
    fn written_tensors_read_back_through_torch_and_ours() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let tensors = vec![
            (
                "obs".to_string(),
                Tensor::randn([5, 3], tch::kind::FLOAT_CPU),
            ),
            (
                "transposed".to_string(),
                Tensor::randn([3, 4], tch::kind::FLOAT_CPU).tr(),
            ),
            (
                "pixels".to_string(),
                Tensor::arange(7, (Kind::Uint8, tch::Device::Cpu)),
            ),
            ("scale".to_string(), Tensor::from(2.5f64)),
            (
                "empty".to_string(),
                Tensor::zeros([0, 2], tch::kind::FLOAT_CPU),
            ),
            (
                "flags".to_string(),
                Tensor::ones([3], (Kind::Bool, tch::Device::Cpu)),
            ),
        ];
        let crc = write(&path, &tensors).unwrap();
        let whole = std::fs::read(&path).unwrap();
        assert_eq!(crc, crate::checkpoint::integrity::file_crc(&path).unwrap());
        // In slices of one row, or two of `obs`: the same file.
        for slice_bytes in [1, 24] {
            write_in_slices(&path, &tensors, slice_bytes).unwrap();
            assert_eq!(
                std::fs::read(&path).unwrap(),
                whole,
                "{slice_bytes} bytes a slice"
            );
        }
        for back in [
            Tensor::read_safetensors(&path).unwrap(),
            read(&path).unwrap(),
        ] {
            assert_eq!(back.len(), tensors.len());
            for (name, tensor) in &tensors {
                let (_, got) = back.iter().find(|(n, _)| n == name).unwrap();
                assert_eq!(
                    (got.kind(), got.size()),
                    (tensor.kind(), tensor.size()),
                    "{name}"
                );
                assert!(got.equal(tensor), "{name}");
            }
        }
    }
}
