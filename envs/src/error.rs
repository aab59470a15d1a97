//! The crate's error type.
use std::fmt;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Python exception: its type and message, then the innermost frames of its traceback.
    #[error("python: {0}")]
    Python(String),
    #[error("unknown task `{name}`{}", SuggestionList(suggestions))]
    UnknownTask {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("action has {got} components, expected {expected}")]
    ActionLength { expected: usize, got: usize },
    #[error("action component {index} is not finite ({value})")]
    NonFiniteAction { index: usize, value: f32 },
    /// An env's observation is not as long as its spec says.
    #[error(
        "`{task}` env {index} returned an observation of {got} components, but its \
         observation space has {expected}"
    )]
    ObsLength {
        task: String,
        index: usize,
        expected: usize,
        got: usize,
    },
    /// An env returned NaN or an infinity, which would reach the replay buffer and the
    /// planner (`what`: `observation component 12 (NaN)`, `reward (inf)`; `after`: `a step`).
    #[error(
        "`{task}` env {index} returned a non-finite {what} after {after}: the simulator has \
         become unstable, or the task computes it wrongly"
    )]
    NonFiniteStep {
        task: String,
        index: usize,
        what: String,
        after: &'static str,
    },
    #[error("step called before reset or after the episode ended; call reset first")]
    NeedsReset,
    #[error("task `{task}` is not supported: {reason}")]
    Unsupported { task: String, reason: String },
    #[error("seed {seed} is not valid for `{task}`: {reason}")]
    InvalidSeed {
        task: String,
        seed: u64,
        reason: String,
    },
    /// A worker process of a vector env died or broke its channel. `envs` names the envs it
    /// ran (`env 3`, `envs 4-7`).
    #[error("the environment worker (pid {pid}) running `{task}` {envs} {what}")]
    Worker {
        task: String,
        envs: String,
        pid: u32,
        what: String,
    },
    /// An env failed inside its worker process; `message` is the worker's error text (a
    /// Python exception as `python: Type: message`).
    #[error("`{task}` env {index} failed in its worker process (pid {pid}): {message}")]
    WorkerEnv {
        task: String,
        index: usize,
        pid: u32,
        message: String,
    },
    /// A worker process of a vector env, alive, did not reply within its time limit (`limit`:
    /// `4 s (env_timeout)`); it was killed. `owner` is who ran it (`rank 1: `, or empty).
    #[error(
        "{owner}the environment worker (pid {pid}) running `{task}` {envs} did not answer \
         `{asked}` within {limit} and was killed"
    )]
    WorkerSilent {
        owner: String,
        task: String,
        envs: String,
        pid: u32,
        asked: &'static str,
        limit: String,
    },
    /// A worker process did not answer within `patience` of a stop its owner was asked for
    /// (see `WorkerCommand::stop`); it was killed.
    #[error(
        "{owner}the environment worker (pid {pid}) running `{task}` {envs} did not answer \
         `{asked}` within {patience} s of the stop and was killed"
    )]
    GivenUpAtStop {
        owner: String,
        task: String,
        envs: String,
        pid: u32,
        asked: &'static str,
        /// Seconds.
        patience: f64,
    },
    /// A task's family steps with a venv of its own, and there is none.
    #[error(
        "{family} tasks step with a Python environment of their own, and {problem}: run \
         `{install}` (or point {venv_var} at one)"
    )]
    FamilyMissing {
        family: &'static str,
        problem: String,
        install: String,
        venv_var: String,
    },
    /// MuJoCo cannot render with the chosen backend (`MUJOCO_GL`): what failed, and the
    /// backends this machine has.
    #[error("MUJOCO_GL={backend} cannot render: {what}; {}", Renderers(available))]
    Renderer {
        backend: String,
        what: String,
        available: Vec<String>,
    },
    #[error("cannot start the environment worker `{program}`: {reason}")]
    WorkerStart { program: String, reason: String },
    /// The worker side's own channel failed (`serve_worker`).
    #[error("env worker: {0}")]
    WorkerChannel(String),
    /// Bad arguments to a vector env (no envs, an index out of range or listed twice, ...).
    #[error("vector env: {0}")]
    VectorInput(String),
}

pub type Result<T> = std::result::Result<T, Error>;

struct SuggestionList<'a>(&'a [String]);

impl fmt::Display for SuggestionList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [] => write!(
                f,
                " (not a native, DMControl, Meta-World, MyoSuite or gymnasium task)"
            ),
            names => write!(f, "; did you mean: {}?", names.join(", ")),
        }
    }
}

struct Renderers<'a>(&'a [String]);

impl fmt::Display for Renderers<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [] => write!(
                f,
                "this machine has no renderer MuJoCo can use: install libegl1 and \
                 libgl1-mesa-dri (apt), or your GPU driver's EGL"
            ),
            names => write!(
                f,
                "this machine has: {} (set MUJOCO_GL to one of them)",
                names.join(", ")
            ),
        }
    }
}

impl Error {
    /// Whether a worker was given up at a stop: what it was asked is dropped, as a stop drops
    /// the episodes that run.
    pub fn given_up_at_stop(&self) -> bool {
        matches!(self, Error::GivenUpAtStop { .. })
    }
}

impl From<pyo3::PyErr> for Error {
    fn from(err: pyo3::PyErr) -> Self {
        Error::Python(embedded_python::describe(&err))
    }
}

impl From<embedded_python::Error> for Error {
    fn from(err: embedded_python::Error) -> Self {
        Error::Python(err.0)
    }
}
