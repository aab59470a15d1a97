//! The agent's error type, and the shape check its modules share.
use tch::Tensor;

/// Errors of the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("invalid agent config: {0}")]
    Config(String),
    #[error("{what}: expected shape {expected:?}, got {got:?}")]
    Shape {
        what: String,
        expected: Vec<i64>,
        got: Vec<i64>,
    },
    #[error("noise replay: {0}")]
    Replay(String),
    #[error("random draws: {0}")]
    Draw(String),
    /// A call through the C++ shim (src/cuda/shim.cpp) failed.
    #[error(transparent)]
    Shim(#[from] crate::cuda::GraphError),
    /// One of our fused CUDA kernels (src/cuda/fused/) failed to compile, load or launch.
    #[error(transparent)]
    Fused(#[from] crate::cuda::fused::FusedError),
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: String, message: String },
    /// A file given to read that is not what it should be (truncated, damaged, another format,
    /// not a TD-MPC2 model): bad input, refused the same way every time.
    #[error("{path}: {message}")]
    Unreadable { path: String, message: String },
    /// A file to write that cannot be written as given (bad input: it exists, has no folder, is
    /// named for another format).
    #[error("output {path}: {message}")]
    Output { path: String, message: String },
    /// A state dict read whole whose parameters are not this model's (other sizes, tasks or
    /// layers).
    #[error("checkpoint {path} does not fit this model: {message}")]
    Mismatch { path: String, message: String },
    #[error("embedded Python: {0}")]
    Python(String),
    /// A collective among the ranks failed (the crate's `Error::Collective`, passed through).
    #[error("{0}")]
    Collective(String),
}

impl From<embedded_python::Error> for Error {
    fn from(e: embedded_python::Error) -> Self {
        Self::Python(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Checks a tensor's shape, naming it in the error.
pub(crate) fn expect_shape(what: &str, tensor: &Tensor, expected: &[i64]) -> Result<()> {
    let got = tensor.size();
    if got != expected {
        return Err(Error::Shape {
            what: what.to_string(),
            expected: expected.to_vec(),
            got,
        });
    }
    Ok(())
}
