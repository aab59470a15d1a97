//! `train.csv` and `eval.csv`, one per phase.
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{append, Phase, Record, Sink};
use crate::error::{Error, Result};

/// A CSV file with the columns of the records written to it so far (and of its earlier rows,
/// when a resumed run appends): a record with a new key widens it, rewriting the file with the
/// new header and its rows with an empty cell there.
struct CsvFile {
    path: PathBuf,
    out: BufWriter<File>,
    columns: Vec<String>,
}

impl CsvFile {
    fn open(path: PathBuf) -> Result<Self> {
        let header = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| text.lines().next().map(str::to_owned));
        let columns = match header {
            Some(header) => header.split(',').map(str::to_owned).collect(),
            None => {
                let mut out = append(&path)?;
                writeln!(out, "step").map_err(|e| write_error(&path, e))?;
                vec!["step".to_owned()]
            }
        };
        Ok(Self {
            out: append(&path)?,
            path,
            columns,
        })
    }

    fn write(&mut self, record: &Record) -> Result<()> {
        let mut new: Vec<&String> = (record.values.keys())
            .filter(|k| !self.columns.contains(k))
            .collect();
        // `step,episode_reward` first, as the official eval.csv (read by column position).
        new.sort_by_key(|k| k.as_str() != "episode_reward");
        if !new.is_empty() {
            let columns: Vec<String> = self
                .columns
                .iter()
                .cloned()
                .chain(new.into_iter().cloned())
                .collect();
            self.widen(columns)?;
        }
        let cells: Vec<String> = (self.columns.iter())
            .map(|c| match c.as_str() {
                "step" => record.step.to_string(),
                key => record
                    .values
                    .get(key)
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            })
            .collect();
        writeln!(self.out, "{}", cells.join(","))
            .and_then(|_| self.out.flush())
            .map_err(|e| write_error(&self.path, e))
    }

    /// Rewrites the file under `columns` (the old ones first), through a temporary file.
    fn widen(&mut self, columns: Vec<String>) -> Result<()> {
        let text = std::fs::read_to_string(&self.path).map_err(|e| write_error(&self.path, e))?;
        let pad = ",".repeat(columns.len() - self.columns.len());
        let mut out = columns.join(",") + "\n";
        for row in text.lines().skip(1) {
            out += &format!("{row}{pad}\n");
        }
        crate::whole_file::write(&self.path, out).map_err(|e| write_error(&self.path, e))?;
        self.out = append(&self.path)?;
        self.columns = columns;
        Ok(())
    }
}

fn write_error(path: &Path, e: std::io::Error) -> Error {
    Error::io(format!("write {}", path.display()), e)
}

pub struct Csv {
    dir: PathBuf,
    files: BTreeMap<&'static str, CsvFile>,
}

impl Csv {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            files: BTreeMap::new(),
        }
    }
}

impl Sink for Csv {
    fn name(&self) -> &'static str {
        "csv"
    }

    fn write(&mut self, record: &Record) -> Result<()> {
        let name = match record.phase {
            Phase::Train => "train.csv",
            Phase::Eval => "eval.csv",
        };
        let file = match self.files.entry(name) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(CsvFile::open(self.dir.join(name))?)
            }
        };
        file.write(record)
    }
}
