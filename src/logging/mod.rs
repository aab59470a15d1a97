//! Rank 0's metrics: the console, `metrics.jsonl`, `train.csv`/`eval.csv` and TensorBoard
//! event files in the run directory.
pub mod tensorboard;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use tensorboard::EventWriter;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Train,
    Eval,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Train => "train",
            Phase::Eval => "eval",
        }
    }
}

/// One line of metrics at a global step.
#[derive(Debug, Clone)]
pub struct Record {
    pub phase: Phase,
    pub step: u64,
    pub values: BTreeMap<String, f64>,
}

impl Record {
    pub fn new(phase: Phase, step: u64) -> Self {
        Self {
            phase,
            step,
            values: BTreeMap::new(),
        }
    }

    pub fn with(mut self, key: &str, value: f64) -> Self {
        self.values.insert(key.to_owned(), value);
        self
    }
}

/// A CSV file whose columns are fixed by the first record written to it.
struct CsvFile {
    out: BufWriter<File>,
    columns: Vec<String>,
}

pub struct Logger {
    dir: PathBuf,
    jsonl: BufWriter<File>,
    csv: BTreeMap<&'static str, CsvFile>,
    save_csv: bool,
    events: Option<EventWriter>,
    console: bool,
}

impl Logger {
    pub fn create(dir: &Path, save_csv: bool, tensorboard: bool, console: bool) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let jsonl = append(&dir.join("metrics.jsonl"))?;
        let events = if tensorboard {
            Some(EventWriter::create(&dir.join("tb"))?)
        } else {
            None
        };
        Ok(Self {
            dir: dir.to_owned(),
            jsonl,
            csv: BTreeMap::new(),
            save_csv,
            events,
            console,
        })
    }

    pub fn log(&mut self, record: &Record) -> Result<()> {
        if self.console {
            println!("{}", console_line(record));
        }
        let mut json = serde_json::Map::new();
        json.insert("phase".into(), record.phase.name().into());
        json.insert("step".into(), record.step.into());
        for (k, v) in &record.values {
            json.insert(k.clone(), serde_json::json!(v));
        }
        writeln!(self.jsonl, "{}", serde_json::Value::Object(json))
            .and_then(|_| self.jsonl.flush())
            .map_err(|e| Error::io("write metrics.jsonl", e))?;
        if self.save_csv {
            self.write_csv(record)?;
        }
        if let Some(events) = &mut self.events {
            for (k, v) in &record.values {
                events.scalar(
                    &format!("{}/{k}", record.phase.name()),
                    *v as f32,
                    record.step as i64,
                )?;
            }
            events.flush()?;
        }
        Ok(())
    }

    fn write_csv(&mut self, record: &Record) -> Result<()> {
        let name = match record.phase {
            Phase::Train => "train.csv",
            Phase::Eval => "eval.csv",
        };
        if !self.csv.contains_key(name) {
            let path = self.dir.join(name);
            let fresh = !path.exists();
            let mut out = append(&path)?;
            let mut columns = vec!["step".to_owned()];
            columns.extend(record.values.keys().cloned());
            if fresh {
                writeln!(out, "{}", columns.join(","))
                    .map_err(|e| Error::io(format!("write {name}"), e))?;
            }
            self.csv.insert(name, CsvFile { out, columns });
        }
        let file = self.csv.get_mut(name).expect("inserted above");
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

fn append(path: &Path) -> Result<BufWriter<File>> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(BufWriter::new)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))
}

/// The official trainer's console style: `train  E: 12  I: 6,000  R: 512.3  T: 0:01:02 ...`.
pub fn console_line(record: &Record) -> String {
    let mut line = format!("{:<6}", record.phase.name());
    let v = |k: &str| record.values.get(k).copied();
    if let Some(e) = v("episode") {
        line += &format!("  E: {:<6}", e as u64);
    }
    line += &format!("  I: {:<10}", record.step);
    if let Some(r) = v("episode_reward") {
        line += &format!("  R: {r:<9.1}");
    }
    if let Some(s) = v("episode_reward_std") {
        line += &format!("  ±{s:<7.1}");
    }
    if let Some(t) = v("elapsed_time") {
        let t = t as u64;
        line += &format!("  T: {}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
    }
    if let Some(sps) = v("steps_per_second") {
        line += &format!("  SPS: {sps:.1}");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_and_csv_hold_every_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut logger = Logger::create(dir.path(), true, false, false).unwrap();
        for step in [10u64, 20] {
            logger
                .log(&Record::new(Phase::Eval, step).with("episode_reward", step as f64 * 1.5))
                .unwrap();
        }
        logger
            .log(
                &Record::new(Phase::Train, 20)
                    .with("episode_reward", 3.0)
                    .with("episode", 2.0),
            )
            .unwrap();
        let jsonl = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = jsonl
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1]["phase"], "eval");
        assert_eq!(lines[1]["episode_reward"], 30.0);
        let eval = std::fs::read_to_string(dir.path().join("eval.csv")).unwrap();
        assert_eq!(eval, "step,episode_reward\n10,15\n20,30\n");
        let train = std::fs::read_to_string(dir.path().join("train.csv")).unwrap();
        assert_eq!(train, "step,episode,episode_reward\n20,2,3\n");
    }

    #[test]
    fn console_line_reads_like_the_official_one() {
        let r = Record::new(Phase::Eval, 6000)
            .with("episode_reward", 512.34)
            .with("elapsed_time", 3725.0);
        let line = console_line(&r);
        assert!(line.starts_with("eval"), "{line}");
        assert!(
            line.contains("I: 6000") && line.contains("R: 512.3") && line.contains("T: 1:02:05"),
            "{line}"
        );
    }
}
