//! `metrics.jsonl`: every record as one JSON object per line.
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::{append, Record, Sink};
use crate::error::{Error, Result};

pub struct Jsonl {
    out: BufWriter<File>,
}

impl Jsonl {
    pub fn create(path: &Path) -> Result<Self> {
        Ok(Self { out: append(path)? })
    }
}

impl Sink for Jsonl {
    fn name(&self) -> &'static str {
        "metrics.jsonl"
    }

    fn write(&mut self, record: &Record) -> Result<()> {
        let mut json = serde_json::Map::new();
        json.insert("phase".into(), record.phase.name().into());
        json.insert("step".into(), record.step.into());
        for (k, v) in &record.values {
            json.insert(k.clone(), serde_json::json!(v));
        }
        writeln!(self.out, "{}", serde_json::Value::Object(json))
            .and_then(|_| self.out.flush())
            .map_err(|e| Error::io("write metrics.jsonl", e))
    }
}
