//! Checkpoints: rank 0 writes the plain model (`model.safetensors`, official state-dict keys,
//! loadable at any world size) and the learner state (`state.safetensors`: Adam moments and the
//! Q scale, and every rank's planner warm start; `meta.json`: counters). With `save_buffer=true` every rank also saves its replay
//! buffer. Each checkpoint directory is written atomically (see [`store`]).
//!
//! Integrity: `meta.json` records the crc32c of each file's bytes and of every part of the
//! learner state (see [`integrity`]). Loading checks the files first (a mismatch means the file
//! is damaged), then that the loaded state hashes to what was saved.
//!
//! Random streams are not saved: at every checkpoint point the trainer re-derives them from
//! (seed, rank, step), in an uninterrupted run and in a resumed one alike, so resuming
//! continues exactly.
mod buffers;
pub mod disk;
pub mod integrity;
mod rank_rows;
mod resume;
mod save;
pub mod store;
pub mod tensor_file;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::{Error, Result};

pub use resume::{
    check_model_fits, check_resume_source, resume, resume_source_of, resumes,
    resumes_own_checkpoint, verify_checkpoint,
};
pub use save::save;

/// Where and what a run checkpoints, taken once from the config.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointSettings {
    pub run_dir: PathBuf,
    /// Recorded, and checked on resume: a checkpoint resumes only the task it was trained on.
    pub task: String,
    /// Every rank saves its replay buffer too (`save_buffer`).
    pub save_buffer: bool,
    /// `keep_checkpoints`: how many of the newest checkpoints stay, with their buffers; 0 for
    /// all.
    pub keep: usize,
    /// `resume`: none, `auto` (the run directory's latest) or a path.
    pub resume: Option<String>,
    /// `steps`: where the run ends, which a resumed checkpoint must not be past.
    pub steps: u64,
    /// Environments per rank (`num_envs`): how many episode counts each rank continues from.
    pub num_envs: usize,
    /// Values in each rank's planner warm start (environments × horizon × action size); 0 for
    /// runs that do not plan online.
    pub warm_start_len: usize,
    /// Offline runs count updates, which every rank makes together; online runs count each
    /// rank's agent steps, world_size of them per local step.
    pub counts_updates: bool,
}

impl CheckpointSettings {
    pub fn from_config(config: &Config) -> Self {
        Self {
            run_dir: config.run_dir(),
            task: config.task.clone(),
            save_buffer: config.save_buffer,
            keep: config.keep_checkpoints,
            resume: config.resume.clone(),
            steps: config.steps,
            num_envs: config.num_envs,
            warm_start_len: 0,
            counts_updates: config.offline(),
        }
    }

    /// With the size of each rank's planner warm start, which checkpoints then keep.
    pub fn with_warm_start(self, warm_start_len: usize) -> Self {
        Self {
            warm_start_len,
            ..self
        }
    }

    /// The global step of a rank's local step.
    pub fn global_step(&self, local: u64, world_size: usize) -> u64 {
        match self.counts_updates {
            true => local,
            false => local * world_size as u64,
        }
    }

    /// The local step of a global step.
    pub fn local_step(&self, global: u64, world_size: usize) -> u64 {
        match self.counts_updates {
            true => global,
            false => global / world_size.max(1) as u64,
        }
    }
}

/// Counters of a run, in global agent steps.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TrainState {
    /// Local steps taken by each rank.
    pub step: u64,
    /// Episodes this rank has started before its running ones: where its episode seeds go on.
    pub episodes: u64,
    /// Of `episodes`, those the checkpoint this run resumed from cut short (started, never
    /// finished): not among the finished ones a run logs and saves.
    #[serde(default)]
    pub cut: u64,
    /// Seconds of training before this process started (for elapsed_time and steps/s).
    pub elapsed: f64,
    /// Updates of the seed-data pretraining already made, when a stop interrupted it.
    pub pretrain_updates: u64,
    /// Whether an evaluation was due and not yet made (a stop during it, or while environments
    /// waited for it): the resumed run makes it first.
    pub eval_due: bool,
    /// Whether a periodic checkpoint was due and not yet made (a stop during the evaluation
    /// before it, or while environments waited for it): the resumed run writes it when it
    /// would have been, and derives the random streams there as the uninterrupted run did.
    pub save_due: bool,
    /// Episodes started in each of this rank's environments (empty when not known).
    pub env_episodes: Vec<u64>,
    /// This rank's planner warm start, the means its next plans shift (empty when not known).
    /// An environment whose policy acting begins mid-episode (the step after seeding ends)
    /// plans from it, so a resumed run needs it to plan as the uninterrupted one.
    pub warm_start: Vec<f32>,
    /// Batches each rank has read of an offline run's dataset: where its next update's begin
    /// (not the steps times `sync_freq` once a resume changed `sync_freq`). None online, and
    /// for checkpoints written before it was recorded.
    pub batches_read: Option<u64>,
}

impl TrainState {
    /// Episodes this rank has finished (on rank 0, what the run logs).
    pub fn finished(&self) -> u64 {
        self.episodes - self.cut
    }
}

/// `meta.json`'s format: 2 since checksums are crc32c of bytes and files carry hashes (format
/// 1 held float sums of the learner state, which depended on the thread count).
pub(crate) const FORMAT: u32 = 2;

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    #[serde(default)]
    format: u32,
    global_step: u64,
    world_size: usize,
    episodes: u64,
    elapsed: f64,
    task: String,
    /// Each rank's checksum of its learner state at this step; all equal by construction.
    #[serde(default)]
    rank_checksums: Vec<u32>,
    /// The checksum of each part of the learner state, to say what differs on a mismatch.
    #[serde(default)]
    learner_parts: BTreeMap<String, u32>,
    /// crc32c of each file's bytes.
    #[serde(default)]
    files: BTreeMap<String, u32>,
    model_optim_step: u64,
    policy_optim_step: u64,
    #[serde(default)]
    pretrain_updates: u64,
    #[serde(default)]
    eval_due: bool,
    #[serde(default)]
    save_due: bool,
    /// Episodes started in each environment, rank by rank: where each rank's episode seeds
    /// and a multitask run's task cycles continue.
    #[serde(default)]
    env_episodes: Vec<Vec<u64>>,
    /// Whether the run trained on a dataset (its steps count updates, not agent steps); not
    /// known for checkpoints written before it was recorded.
    #[serde(default)]
    offline: Option<bool>,
    /// The crc32c of each rank's saved replay buffer (none without `save_buffer=true`): a
    /// resume takes only the buffers saved with this checkpoint, not another run's left at the
    /// same step, nor those of a save cut short. Not known for checkpoints written before it
    /// was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    buffer_hashes: Option<Vec<u32>>,
    /// [`TrainState::batches_read`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    batches_read: Option<u64>,
}

const MODEL: &str = "model.safetensors";
const STATE: &str = "state.safetensors";
/// In `STATE`, a multitask model's task-embedding gradient carried to the next update.
const CARRIED_TASK_GRAD: &str = "model_optim.carried_task_grad";
/// In `STATE`, every rank's planner warm start, (world size, values per rank).
const WARM_START: &str = "warm_start";
const META: &str = "meta.json";

pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join(CHECKPOINTS)
}

/// The folder of a run's checkpoints, in its run directory.
const CHECKPOINTS: &str = "checkpoints";

/// The run directory that saved a weights file (`<run>/checkpoints/step_<N>/model.safetensors`);
/// None for a file elsewhere (an imported one).
pub fn run_of_model(model: &Path) -> Option<PathBuf> {
    // `..` and links resolved: `step_N/../step_N/model.safetensors` is in checkpoints/ too.
    let model = model
        .canonicalize()
        .or_else(|_| std::path::absolute(model))
        .ok()?;
    let checkpoint = model.parent()?;
    let checkpoints = checkpoint.parent()?;
    let saved_by_a_run = model.file_name() == Some(MODEL.as_ref())
        && store::step_of(checkpoint).is_some()
        && checkpoints.file_name() == Some(CHECKPOINTS.as_ref());
    saved_by_a_run.then(|| checkpoints.parent().map(Path::to_path_buf))?
}

/// Removes this rank's replay buffers of steps past `resumed` (every one, for a fresh start)
/// from its run directory: no checkpoint refers to them (rank 0 failed to write the checkpoint
/// after every rank wrote its buffer: a full disk), and the next save of their step would need
/// room for both. A failure costs disk space, not the run.
pub fn forget_buffers_past(settings: &CheckpointSettings, resumed: Option<u64>, rank: usize) {
    let root = buffers_dir(&settings.run_dir, rank);
    if let Err(e) = store::remove_past(&root, resumed) {
        errln!("warning: replay buffers no checkpoint refers to stay: {e}");
    }
}

fn buffers_dir(run_dir: &Path, rank: usize) -> PathBuf {
    run_dir.join("buffers").join(format!("rank{rank}"))
}

fn fail(context: &str, e: impl std::fmt::Display) -> Error {
    Error::Checkpoint(format!("{context}: {e}"))
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let bytes =
        serde_json::to_vec_pretty(value).map_err(|e| fail(&path.display().to_string(), e))?;
    std::fs::write(path, bytes).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// Where a path to weights was given, for what its errors say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsGiven {
    /// The `checkpoint=` setting (eval, collect, a run continued from weights).
    AsCheckpoint,
    /// The input of `tdmpc2 export`.
    ToExport,
}

impl WeightsGiven {
    fn named(self, path: &Path) -> String {
        match self {
            Self::AsCheckpoint => format!("checkpoint={}", path.display()),
            Self::ToExport => format!("export {}", path.display()),
        }
    }
}

/// What a weights path may be, for the errors that say it names none.
const WEIGHTS_PATHS: &str = "a checkpoint directory, a run directory or a .safetensors file";

/// The model weights a path names: `model.safetensors` of a checkpoint directory (the
/// directory itself or any file in it), the latest checkpoint of a run (or checkpoints)
/// directory, or any other `.safetensors` file (an imported one). A file torch saved, whatever
/// its name, is refused with what to do.
pub fn model_file(path: &Path, given: WeightsGiven) -> Result<PathBuf> {
    let named = given.named(path);
    if path.is_file() {
        let dir = path.parent().unwrap_or(Path::new("."));
        let in_checkpoint = dir.join(MODEL).is_file() && dir.join(META).is_file();
        if in_checkpoint && path.file_name() != Some(MODEL.as_ref()) {
            return Ok(dir.join(MODEL));
        }
        if torch_saved(path) {
            let what = match given {
                WeightsGiven::AsCheckpoint => format!(
                    "`tdmpc2 import {} OUT.safetensors` converts it to weights this binary loads",
                    path.display()
                ),
                WeightsGiven::ToExport => format!(
                    "export writes that format from this project's weights ({WEIGHTS_PATHS}); \
                     this one needs no export"
                ),
            };
            return Err(Error::Config(format!(
                "{named}: a file torch.save wrote (an official checkpoint?); {what}"
            )));
        }
        return Ok(path.to_owned());
    }
    if path.join(MODEL).is_file() {
        return Ok(path.join(MODEL));
    }
    let latest = store::latest(path).or_else(|| store::latest(&checkpoints_dir(path)));
    match latest {
        Some((_, dir)) => Ok(dir.join(MODEL)),
        None if path.is_dir() => Err(Error::Config(format!(
            "{named}: a directory holding no checkpoint (no {MODEL}, no step_<N>/, no \
             checkpoints/); give {WEIGHTS_PATHS}"
        ))),
        None => Err(Error::Config(format!(
            "{named}: no such file, and no checkpoint directory there; give {WEIGHTS_PATHS}"
        ))),
    }
}

/// Whether `torch.save` wrote the file at `path`, unless its bytes are a safetensors file's (the
/// length of its header, which the file holds, then the header's `{`): by its first bytes, a zip
/// archive (torch's format since 1.6) or a pickle (its older one: protocol 2 to 5), or by its
/// name (`.pt`, `.pth`).
fn torch_saved(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 9];
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let size = file.metadata().map_or(0, |m| m.len());
    let head = match file.read(&mut head) {
        Ok(n) => &head[..n],
        Err(_) => return false,
    };
    if let Some(length) = head
        .first_chunk::<8>()
        .map(|bytes| u64::from_le_bytes(*bytes))
    {
        if head.get(8) == Some(&b'{') && length <= size.saturating_sub(8) {
            return false;
        }
    }
    const PICKLE_PROTOCOL: u8 = 0x80;
    let pickle =
        head.first() == Some(&PICKLE_PROTOCOL) && head.get(1).is_some_and(|v| (2..=5).contains(v));
    let named = path.extension().is_some_and(|e| {
        crate::agent::official_checkpoint::TORCH_EXTENSIONS
            .iter()
            .any(|torch| e.eq_ignore_ascii_case(torch))
    });
    head.starts_with(&crate::zip_crc::ZIP_MAGIC) || pickle || named
}

/// Says which weights file a file of a checkpoint named (`model_file` of its `meta.json`).
pub fn say_which_weights(named: &Path, weights: &Path) {
    if named.is_file() && named != weights {
        errln!(
            "checkpoint={}: taking the weights of its checkpoint, {}",
            named.display(),
            weights.display()
        );
    }
}

/// Checks a weights file against the hash its checkpoint's `meta.json` recorded. A file outside
/// a checkpoint directory (an imported one) has nothing to check against; one inside a
/// checkpoint (a `step_N` folder, or one beside its state) without its `meta.json` is refused
/// as incomplete; a checkpoint written before hashes were recorded loads with a warning.
pub fn verify_model(path: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    if path.file_name() != Some(MODEL.as_ref()) {
        return Ok(());
    }
    let in_checkpoints = dir.parent().and_then(Path::file_name) == Some(CHECKPOINTS.as_ref());
    let in_a_checkpoint =
        dir.join(STATE).exists() || (in_checkpoints && store::step_of(dir).is_some());
    if !in_a_checkpoint && !dir.join(META).is_file() {
        return Ok(());
    }
    let meta = read_meta(dir)?;
    verify_files(dir, &meta, &[MODEL])
}

/// The task the checkpoint that holds the weights file `model` was trained on; None for a file
/// outside a checkpoint (an imported one) or metadata that cannot be read.
pub fn trained_task(model: &Path) -> Option<String> {
    let dir = model.parent()?;
    read_meta(dir).ok().map(|meta| meta.task)
}

/// The global step of the checkpoint in `dir`: from its name, else from its metadata (a
/// checkpoint copied under another name).
pub fn step_of(dir: &Path) -> Option<u64> {
    store::step_of(dir).or_else(|| read_meta(dir).ok().map(|meta| meta.global_step))
}

/// Reads `meta.json`; a checkpoint of format 1 (float checksums, no file hashes) reads with its
/// checksums left out, and [`Meta::format`] says it cannot be verified.
fn read_meta(dir: &Path) -> Result<Meta> {
    let path = dir.join(META);
    let bytes = std::fs::read(&path).map_err(|e| missing_or_io(dir, META, e))?;
    let unreadable = |e: serde_json::Error| {
        Error::Unreadable(format!(
            "{}: not a checkpoint's meta.json (damaged or edited): {e}",
            path.display()
        ))
    };
    let mut value: serde_json::Value = serde_json::from_slice(&bytes).map_err(unreadable)?;
    let format = value.get("format").and_then(|f| f.as_u64()).unwrap_or(1);
    if format > FORMAT as u64 {
        return Err(Error::Unreadable(format!(
            "{}: written by a newer tdmpc2 (format {format}; this one reads up to {FORMAT})",
            path.display()
        )));
    }
    if format < FORMAT as u64 {
        if let Some(object) = value.as_object_mut() {
            object.remove("rank_checksums");
        }
    }
    let meta: Meta = serde_json::from_value(value).map_err(unreadable)?;
    // A save names its folder for its step (a checkpoint copied under another name has none).
    let misnamed = || {
        store::step_of(dir)
            .filter(|&step| step != meta.global_step)
            .map(|step| {
                format!(
                    "global_step {}, in the folder of step {step}",
                    meta.global_step
                )
            })
    };
    if let Some(why) = meta.check().err().or_else(misnamed) {
        return Err(Error::Unreadable(format!(
            "{}: {why}: edited or damaged (a checkpoint never holds that)",
            path.display()
        )));
    }
    Ok(meta)
}

impl Meta {
    /// What every checkpoint of its format holds, as a save writes it.
    fn check(&self) -> std::result::Result<(), String> {
        if !(1..=crate::config::MAX_WORLD_SIZE).contains(&self.world_size) {
            return Err(format!(
                "world_size {} (a run has 1 to {} ranks)",
                self.world_size,
                crate::config::MAX_WORLD_SIZE
            ));
        }
        if let Some(hashes) = self.buffer_hashes.as_ref().filter(|h| !h.is_empty()) {
            if hashes.len() != self.world_size {
                return Err(format!(
                    "{} replay-buffer hashes for world_size {}",
                    hashes.len(),
                    self.world_size
                ));
            }
        }
        if self.format < FORMAT {
            return Ok(());
        }
        if self.rank_checksums.len() != self.world_size {
            return Err(format!(
                "{} rank checksums for world_size {}",
                self.rank_checksums.len(),
                self.world_size
            ));
        }
        match [MODEL, STATE]
            .iter()
            .find(|f| !self.files.contains_key(**f))
        {
            Some(file) => Err(format!("no hash of {file}")),
            None => Ok(()),
        }
    }
}

/// A file of the checkpoint in `dir` that cannot be read: one that is not there makes the
/// checkpoint incomplete (a copy cut short, a file removed), which is bad input, not a failure
/// to restart from.
fn missing_or_io(dir: &Path, name: &str, e: std::io::Error) -> Error {
    let path = dir.join(name);
    match e.kind() {
        std::io::ErrorKind::NotFound => Error::Unreadable(format!(
            "{} is incomplete: it has no {name} (a copy cut short, or a file removed); \
             {USE_ANOTHER}",
            dir.display()
        )),
        _ => Error::io(format!("read {}", path.display()), e),
    }
}

/// The way on from a checkpoint that is damaged or incomplete, for `resume`, `eval` and `export`.
const USE_ANOTHER: &str = "give the checkpoint before it, or a whole copy of this one (a resume \
                           takes the one before once this one is moved out of checkpoints/)";

/// Compares each of `names` in `dir` with the hash `meta` recorded when it was saved.
fn verify_files(dir: &Path, meta: &Meta, names: &[&str]) -> Result<()> {
    for name in names {
        let path = dir.join(name);
        let Some(saved) = meta.files.get(*name) else {
            errln!(
                "warning: {} records no hash of {name} (written by an older tdmpc2): its bytes \
                 cannot be verified",
                dir.join(META).display()
            );
            continue;
        };
        std::fs::File::open(&path).map_err(|e| missing_or_io(dir, name, e))?;
        let now = integrity::file_crc(&path)?;
        if now != *saved {
            return Err(Error::Unreadable(format!(
                "{} is damaged: its bytes do not match the hash recorded when it was saved \
                 (crc32c {now:08x}, saved {saved:08x}); {USE_ANOTHER}",
                path.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AdamState;
    use crate::config::Source;
    use crate::ddp::ProcessGroup;

    #[test]
    fn a_runs_weights_are_known_by_any_path_to_them() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().canonicalize().unwrap().join("run");
        let step = checkpoints_dir(&run).join("step_000000000400");
        std::fs::create_dir_all(&step).unwrap();
        std::fs::write(step.join(MODEL), b"").unwrap();
        let roundabout = step.join("..").join("step_000000000400").join(MODEL);
        for model in [step.join(MODEL), roundabout] {
            assert_eq!(
                run_of_model(&model),
                Some(run.clone()),
                "{}",
                model.display()
            );
        }
        std::fs::write(run.join(MODEL), b"").unwrap();
        assert_eq!(run_of_model(&run.join(MODEL)), None);
    }

    /// A meta.json edited into what no save writes (no ranks, checksums of another world size,
    /// the file hashes gone, which would skip their check) is refused.
    #[test]
    fn a_meta_json_no_save_writes_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta {
            format: FORMAT,
            global_step: 400,
            world_size: 2,
            episodes: 2,
            elapsed: 1.0,
            task: "Pendulum-v1".into(),
            rank_checksums: vec![7, 7],
            learner_parts: BTreeMap::new(),
            files: [(MODEL.to_string(), 1), (STATE.to_string(), 2)].into(),
            model_optim_step: 1,
            policy_optim_step: 1,
            pretrain_updates: 0,
            eval_due: false,
            save_due: false,
            env_episodes: Vec::new(),
            offline: Some(false),
            buffer_hashes: None,
            batches_read: None,
        };
        let written = serde_json::to_value(&meta).unwrap();
        std::fs::write(dir.path().join(META), written.to_string()).unwrap();
        read_meta(dir.path()).unwrap();
        for (edits, why) in [
            (vec![("world_size", serde_json::json!(0))], "world_size 0"),
            (
                vec![("rank_checksums", serde_json::json!([]))],
                "0 rank checksums for world_size 2",
            ),
            (
                vec![("files", serde_json::json!({}))],
                "no hash of model.safetensors",
            ),
            // In any format: a world size no run has (read on, it would size allocations),
            // and buffer hashes of another world size (they would go unchecked).
            (
                vec![
                    ("format", serde_json::json!(1)),
                    ("world_size", serde_json::json!(1u64 << 40)),
                ],
                "world_size 1099511627776 (a run has 1 to 65536 ranks)",
            ),
            (
                vec![
                    ("format", serde_json::json!(1)),
                    ("buffer_hashes", serde_json::json!([1, 2, 3])),
                ],
                "3 replay-buffer hashes for world_size 2",
            ),
        ] {
            let mut edited = written.clone();
            for (key, value) in edits {
                edited[key] = value;
            }
            std::fs::write(dir.path().join(META), edited.to_string()).unwrap();
            let e = read_meta(dir.path()).unwrap_err();
            assert_eq!(e.exit_code(), crate::error::BAD_INPUT_EXIT_CODE, "{e}");
            assert!(e.to_string().contains(why), "{why}: {e}");
        }
        // A save names its folder for its step; under another name, any step reads.
        let named = dir.path().join("step_000000000400");
        std::fs::create_dir(&named).unwrap();
        let mut edited = written.clone();
        edited["global_step"] = serde_json::json!(99_999_999_999u64);
        std::fs::write(named.join(META), edited.to_string()).unwrap();
        let e = read_meta(&named).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::BAD_INPUT_EXIT_CODE, "{e}");
        assert!(
            e.to_string()
                .contains("global_step 99999999999, in the folder of step 400: edited"),
            "{e}"
        );
        std::fs::write(dir.path().join(META), edited.to_string()).unwrap();
        read_meta(dir.path()).unwrap();
    }

    /// A directory that holds no checkpoint, and a path that does not exist, are told apart.
    #[test]
    fn a_weights_path_that_names_nothing_says_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let e = model_file(dir.path(), WeightsGiven::AsCheckpoint).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::BAD_INPUT_EXIT_CODE);
        assert!(
            e.to_string().contains("a directory holding no checkpoint"),
            "{e}"
        );
        let e = model_file(&dir.path().join("gone"), WeightsGiven::ToExport)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("export ") && e.contains("no such file") && e.contains(WEIGHTS_PATHS),
            "{e}"
        );
    }

    /// A file torch saved is known by its bytes, whatever its name, and the error says what to
    /// do where it was given; a safetensors file named `.pt` is taken.
    #[test]
    fn a_file_torch_saved_is_known_by_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let zip = dir.path().join("final.ckpt");
        std::fs::write(&zip, b"PK\x03\x04rest").unwrap();
        let pickle = dir.path().join("agent.bin");
        std::fs::write(&pickle, [0x80, 0x02, b'}', b'q']).unwrap();
        for file in [&zip, &pickle] {
            let e = model_file(file, WeightsGiven::AsCheckpoint)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("checkpoint=") && e.contains("`tdmpc2 import"),
                "{e}"
            );
            let e = model_file(file, WeightsGiven::ToExport)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("export {}", file.display())) && e.contains("needs no export"),
                "{e}"
            );
        }
        let named_pt = dir.path().join("weights.pt");
        let tensors = [("x".to_string(), tch::Tensor::from_slice(&[1.0f32]))];
        tch::Tensor::write_safetensors(&tensors, &named_pt).unwrap();
        assert_eq!(
            model_file(&named_pt, WeightsGiven::AsCheckpoint).unwrap(),
            named_pt
        );
        // A header of 128 bytes begins with 0x80, as a pickle does.
        let header = r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let header = format!("{header:<128}");
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header.as_bytes());
        bytes.extend(1.0f32.to_le_bytes());
        let padded = dir.path().join("w128.safetensors");
        std::fs::write(&padded, bytes).unwrap();
        assert_eq!(model_file(&padded, WeightsGiven::ToExport).unwrap(), padded);
    }

    /// A `meta.json` that is not one, or one of a newer format, is refused as bad input
    /// (exit 2: a restart would meet it again), naming the file.
    #[test]
    fn a_meta_json_that_cannot_be_read_is_refused_as_input() {
        let dir = tempfile::tempdir().unwrap();
        for (bytes, why) in [
            (&b"{garbage"[..], "not a checkpoint's meta.json"),
            (b"{\"format\": 99}", "written by a newer tdmpc2 (format 99"),
            (b"{\"format\": 2}", "not a checkpoint's meta.json"),
        ] {
            std::fs::write(dir.path().join(META), bytes).unwrap();
            let e = read_meta(dir.path()).unwrap_err();
            assert_eq!(e.exit_code(), crate::error::BAD_INPUT_EXIT_CODE, "{e}");
            assert!(e.to_string().contains(why), "{e}");
            assert!(e.to_string().contains("meta.json"), "{e}");
        }
    }
    use crate::ddp::RankInfo;
    use crate::learner::Learner;
    use tch::{Device, Kind, Tensor};

    fn config(run_dir: &Path) -> Config {
        let overrides = [
            "model_size=1",
            "obs_shape=[5]",
            "action_dim=2",
            "discount=0.99",
            "num_threads=1",
        ];
        let mut overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        overrides.push(format!("run_dir={}", run_dir.display()));
        Config::load(&Source {
            overrides,
            ..Source::default()
        })
        .unwrap()
    }

    /// A learner whose every part holds distinct values (moments and scale included).
    fn learner<'g>(config: &Config, seed: u64, group: &'g ProcessGroup) -> Learner<'g> {
        let config = Config {
            seed,
            ..config.clone()
        };
        let mut learner = Learner::new(
            &crate::learner::LearnerSettings::from_config(&config)
                .unwrap()
                .with_capacity(100),
            Device::Cpu,
            group,
        )
        .unwrap();
        tch::manual_seed(seed as i64);
        let updater = learner.updater_mut();
        for (optim, steps) in [
            (&mut updater.model_optim, 7),
            (&mut updater.policy_optim, 5),
        ] {
            let shape = optim.state().exp_avg;
            let state = AdamState {
                step: steps,
                exp_avg: shape.randn_like(),
                exp_avg_sq: shape.rand_like(),
            };
            optim.load_state(&state).unwrap();
        }
        updater
            .scale
            .set(&Tensor::from_slice(&[3.25f32]).to_kind(Kind::Float));
        learner
    }

    #[test]
    fn the_learner_checksum_ignores_the_thread_count() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let group = ProcessGroup::alone(RankInfo::single(&config));
        let agent = learner(&config, 3, &group);
        let threads = tch::get_num_threads();
        tch::set_num_threads(1);
        let one = integrity::learner_parts(&agent);
        tch::set_num_threads(2);
        let two = integrity::learner_parts(&agent);
        tch::set_num_threads(threads);
        assert_eq!(one, two);
        assert!(
            agent.model().model_params.flat.numel() > 100_000,
            "large enough for a parallel reduction"
        );
    }

    /// Resumes a fresh agent from `dir`; on success its learner state must hash to `expected`.
    fn resume_into(
        config: &Config,
        dir: &Path,
        expected: &[(&str, u32)],
    ) -> Result<Option<TrainState>> {
        let mut config = config.clone();
        config.resume = Some(dir.display().to_string());
        let group = ProcessGroup::alone(RankInfo::single(&config));
        let mut fresh = learner(&config, 11, &group);
        let resumed = resume(
            &CheckpointSettings::from_config(&config),
            &mut fresh,
            &group,
        )?;
        assert_eq!(integrity::learner_parts(&fresh), expected);
        Ok(resumed.map(|(state, _)| state))
    }

    fn rewrite_meta(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
        let path = dir.join(META);
        let mut meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut meta);
        std::fs::write(&path, serde_json::to_vec(&meta).unwrap()).unwrap();
    }

    #[test]
    fn a_saved_state_loads_back_and_damage_is_named() {
        let run = tempfile::tempdir().unwrap();
        let config = config(run.path());
        let group = ProcessGroup::alone(RankInfo::single(&config));
        let saved = learner(&config, 3, &group);
        let state = TrainState {
            step: 40,
            pretrain_updates: 9,
            eval_due: true,
            ..TrainState::default()
        };
        tch::set_num_threads(1);
        let expected = integrity::learner_parts(&saved);
        save(
            &CheckpointSettings::from_config(&config),
            &state,
            &saved,
            &group,
        )
        .unwrap();
        let dir = store::latest(&checkpoints_dir(run.path())).unwrap().1;

        // The same parts hash the same after a round trip through the files, at any threads.
        tch::set_num_threads(2);
        let resumed = resume_into(&config, &dir, &expected).unwrap().unwrap();
        assert_eq!(
            (resumed.step, resumed.pretrain_updates, resumed.eval_due),
            (40, 9, true)
        );
        verify_model(&dir.join(MODEL)).unwrap();
        // Any file of the checkpoint names its weights.
        let weights = |path: &Path| model_file(path, WeightsGiven::AsCheckpoint).unwrap();
        assert_eq!(weights(&dir.join(STATE)), dir.join(MODEL));
        assert_eq!(weights(&dir.join(META)), dir.join(MODEL));
        assert_eq!(weights(run.path()), dir.join(MODEL));

        // Intact files that do not load back: the message names the part, not damage.
        let original = std::fs::read(dir.join(META)).unwrap();
        rewrite_meta(&dir, |m| m["learner_parts"]["scale"] = 1.into());
        let err = resume_into(&config, &dir, &expected)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("scale differs") && !err.contains("damaged"),
            "{err}"
        );

        // An older checkpoint (float checksums, no hashes) loads with a warning.
        rewrite_meta(&dir, |m| {
            m.as_object_mut().unwrap().remove("format");
            m.as_object_mut().unwrap().remove("files");
            m["rank_checksums"] = serde_json::json!([15656.840652986819]);
        });
        assert!(resume_into(&config, &dir, &expected).unwrap().is_some());
        verify_model(&dir.join(MODEL)).unwrap();
        std::fs::write(dir.join(META), &original).unwrap();

        // Flipped bytes in the middle of the weights: the file is named as damaged.
        let model = dir.join(MODEL);
        let mut bytes = std::fs::read(&model).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(&model, &bytes).unwrap();
        for err in [
            verify_model(&model).unwrap_err().to_string(),
            resume_into(&config, &dir, &expected)
                .unwrap_err()
                .to_string(),
        ] {
            assert!(
                err.contains(&model.display().to_string()) && err.contains("damaged"),
                "{err}"
            );
        }

        // Without its meta.json a checkpoint's weights cannot be checked: refused, where a
        // weights file of its own (an imported one) is not.
        std::fs::remove_file(dir.join(META)).unwrap();
        let err = verify_model(&model).unwrap_err().to_string();
        assert!(err.contains("is incomplete: it has no meta.json"), "{err}");
        // (even in a folder named as a checkpoint is, outside checkpoints/)
        let loose = run.path().join("imported/step_000000001000");
        std::fs::create_dir_all(&loose).unwrap();
        std::fs::copy(&model, loose.join(MODEL)).unwrap();
        verify_model(&loose.join(MODEL)).unwrap();
    }
}
