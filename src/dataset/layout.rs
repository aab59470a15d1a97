//! Where a dataset file's tensors lie: its index (read without running pickled code), and
//! each entry's dtype, shape and strides checked against the file's [episodes, T].
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::Deserialize;

use super::{MODULE, OFFICIAL_FORMAT};

#[derive(Debug, Deserialize)]
pub(super) struct Index {
    pub(super) batch_size: Vec<usize>,
    pub(super) tensors: std::collections::BTreeMap<String, Described>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct Described {
    dtype: String,
    shape: Vec<usize>,
    stride: Vec<usize>,
    offset: usize,
    file_offset: u64,
    nbytes: u64,
    item_size: usize,
}

/// Where one [episodes, T, width] tensor's elements lie in its file.
#[derive(Debug, Clone)]
pub(super) struct Field {
    /// Byte position of element (0, 0, 0).
    pub(super) start: u64,
    pub(super) episode_stride: u64,
    pub(super) row_stride: u64,
    pub(super) width: usize,
    pub(super) item: usize,
}

impl Field {
    /// Checks the tensor's dtype and shape, and that every element lies inside its storage.
    pub(super) fn new(
        name: &str,
        d: &Described,
        dtypes: &[&str],
        episodes: usize,
        length: usize,
    ) -> std::result::Result<Self, String> {
        if !dtypes.contains(&d.dtype.as_str()) {
            return Err(format!(
                "`{name}` is {}, expected {}",
                d.dtype,
                dtypes.join(" or ")
            ));
        }
        if d.stride.len() != d.shape.len() {
            return Err(format!(
                "`{name}` has {} strides for {} dimensions",
                d.stride.len(),
                d.shape.len()
            ));
        }
        let (width, inner) = match d.shape.len() {
            2 => (1, 1),
            3 => (d.shape[2], d.stride[2]),
            _ => {
                return Err(format!(
                    "`{name}` has shape {:?}, expected [episodes, T] or [episodes, T, n]",
                    d.shape
                ))
            }
        };
        if d.shape[..2] != [episodes, length] {
            return Err(format!(
                "`{name}` has shape {:?}, but the file's episodes are [{episodes}, {length}]",
                d.shape
            ));
        }
        if inner != 1 && width > 1 {
            return Err(format!(
                "`{name}` is stored transposed (stride {:?}); save it with .contiguous()",
                d.stride
            ));
        }
        // The last element's index; saturating, so that a file claiming absurd sizes is refused.
        let last = [
            (episodes.max(1) - 1).saturating_mul(d.stride[0]),
            (length.max(1) - 1).saturating_mul(d.stride[1]),
            width.max(1) - 1,
        ]
        .iter()
        .fold(d.offset, |sum, &x| sum.saturating_add(x));
        let end = (last.saturating_add(1) as u64).saturating_mul(d.item_size as u64);
        if end > d.nbytes {
            return Err(format!("`{name}` reaches past its storage"));
        }
        let item = d.item_size as u64;
        Ok(Self {
            start: d.file_offset + d.offset as u64 * item,
            episode_stride: d.stride[0] as u64 * item,
            row_stride: d.stride[1] as u64 * item,
            width,
            item: d.item_size,
        })
    }

    /// The bytes of `rows` consecutive rows of `episode` from row `row`, row after row.
    pub(super) fn read(
        &self,
        file: &File,
        episode: usize,
        row: usize,
        rows: usize,
    ) -> std::io::Result<Vec<u8>> {
        let row_bytes = self.width * self.item;
        let mut bytes = vec![0u8; rows * row_bytes];
        let first =
            self.start + episode as u64 * self.episode_stride + row as u64 * self.row_stride;
        if self.row_stride == row_bytes as u64 {
            file.read_exact_at(&mut bytes, first)?;
        } else {
            for (r, chunk) in bytes.chunks_mut(row_bytes).enumerate() {
                file.read_exact_at(chunk, first + r as u64 * self.row_stride)?;
            }
        }
        Ok(bytes)
    }
}

/// A dataset file's entries, as its index describes them.
pub(super) struct Fields<'a> {
    pub(super) index: &'a Index,
    pub(super) episodes: usize,
    pub(super) length: usize,
}

impl Fields<'_> {
    pub(super) fn has(&self, name: &str) -> bool {
        self.index.tensors.contains_key(name)
    }

    pub(super) fn field(&self, name: &str, dtypes: &[&str]) -> std::result::Result<Field, String> {
        let described = self.index.tensors.get(name).ok_or_else(|| {
            format!(
                "holds no `{name}` (it has: {})",
                self.index
                    .tensors
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        Field::new(name, described, dtypes, self.episodes, self.length)
    }

    /// An entry of one number a row: a reward, a termination, a task id.
    pub(super) fn scalar(&self, name: &str, dtypes: &[&str]) -> std::result::Result<Field, String> {
        let field = self.field(name, dtypes)?;
        match field.width {
            1 => Ok(field),
            width => Err(format!(
                "`{name}` holds {width} numbers a row, expected one (shape [episodes, T] or \
                 [episodes, T, 1])"
            )),
        }
    }
}

/// Indexes a dataset file in the embedded interpreter.
pub(super) fn index(path: &Path) -> std::result::Result<Index, String> {
    let text = embedded_python::attach_exclusive(|py| {
        use pyo3::prelude::*;
        let module = embedded_python::load_module(py, OFFICIAL_FORMAT, MODULE)
            .map_err(|e| embedded_python::Error(e.to_string()))?;
        module
            .call_method1("index", (path.to_string_lossy().to_string(),))
            .and_then(|v| v.extract::<String>())
            .map_err(|e| embedded_python::Error(e.to_string()))
    })
    .map_err(|e: embedded_python::Error| e.0)?;
    serde_json::from_str(&text).map_err(|e| format!("index: {e}"))
}
