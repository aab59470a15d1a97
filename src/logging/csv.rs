//! `train.csv` and `eval.csv`, one per phase.
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{append, Phase, Record, Sink};
use crate::error::{Error, Result};

/// A CSV file whose columns are fixed by the first record written to it.
struct CsvFile {
    out: BufWriter<File>,
    columns: Vec<String>,
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
                let path = self.dir.join(name);
                let fresh = !path.exists();
                let mut out = append(&path)?;
                let mut columns = vec!["step".to_owned()];
                columns.extend(record.values.keys().cloned());
                if fresh {
                    writeln!(out, "{}", columns.join(","))
                        .map_err(|e| Error::io(format!("write {name}"), e))?;
                }
                e.insert(CsvFile { out, columns })
            }
        };
        let cells: Vec<String> = file
            .columns
            .iter()
            .map(|c| match c.as_str() {
                "step" => record.step.to_string(),
                key => record
                    .values
                    .get(key)
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            })
            .collect();
        writeln!(file.out, "{}", cells.join(","))
            .and_then(|_| file.out.flush())
            .map_err(|e| Error::io(format!("write {name}"), e))
    }
}
