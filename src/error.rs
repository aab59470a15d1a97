//! The crate's one error type.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad user input in the configuration or on the command line (exit code 2).
    #[error("config error: {0}")]
    Config(String),
    #[error(transparent)]
    Env(#[from] envs::Error),
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("agent: {0}")]
    Agent(crate::agent::Error),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    CudaGraph(#[from] crate::cuda::GraphError),
    #[error("python: {0}")]
    Python(String),
    /// A collective (or joining the process group) failed: another rank stopped or timed out.
    #[error("{0}")]
    Collective(String),
    /// A checkpoint that cannot be written, found or trusted.
    #[error("{0}")]
    Checkpoint(String),
    /// A file given to read that is damaged or not what it should be (a checkpoint whose bytes
    /// differ from their recorded hash, a `meta.json` that is not one): bad input (exit 2),
    /// which a restart would meet again.
    #[error("{0}")]
    Unreadable(String),
    /// Training produced non-finite values.
    #[error("{0}")]
    Diverged(String),
    /// A rank of this node failed, or a peer node went away (what `max_restarts` restarts).
    #[error("{0}")]
    JobFailed(String),
    /// A stop that was asked for (Ctrl-C, SIGTERM, a lost launcher): not a failure of the run.
    #[error("{0}")]
    Stopped(String),
    #[error("{0}")]
    Other(String),
}

/// What a caught panic said (its message, when it has one).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

/// The exit code of a process that stopped because a stop was asked for.
pub const STOPPED_EXIT_CODE: i32 = 3;
/// The exit code of a process whose training diverged: a restart from the last checkpoint
/// would most likely diverge again (the same step, when the replay buffers were saved), so it
/// is never restarted.
pub const DIVERGED_EXIT_CODE: i32 = 4;
/// The exit code of a process refused its input (a setting, a task, a file): the same input
/// fails the same way again, so it is never restarted.
pub const BAD_INPUT_EXIT_CODE: i32 = 2;

pub type Result<T> = std::result::Result<T, Error>;

/// A collective the agent waited on is the run's collective failure (another rank stopped or
/// timed out), not the agent's.
impl From<crate::agent::Error> for Error {
    fn from(err: crate::agent::Error) -> Self {
        match err {
            crate::agent::Error::Collective(what) => Error::Collective(what),
            other => Error::Agent(other),
        }
    }
}

impl From<embedded_python::Error> for Error {
    fn from(err: embedded_python::Error) -> Self {
        Error::Python(err.0)
    }
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The process exit code: 2 for bad input, 3 for a requested stop, 4 for a divergence, 1
    /// for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) => BAD_INPUT_EXIT_CODE,
            Error::Env(
                envs::Error::UnknownTask { .. }
                | envs::Error::Unsupported { .. }
                | envs::Error::FamilyMissing { .. }
                | envs::Error::Renderer { .. },
            ) => BAD_INPUT_EXIT_CODE,
            Error::Agent(
                crate::agent::Error::Output { .. }
                | crate::agent::Error::Mismatch { .. }
                | crate::agent::Error::Unreadable { .. },
            ) => BAD_INPUT_EXIT_CODE,
            Error::Unreadable(_) => BAD_INPUT_EXIT_CODE,
            Error::Stopped(_) => STOPPED_EXIT_CODE,
            Error::Diverged(_) => DIVERGED_EXIT_CODE,
            _ => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collective_the_agent_waited_on_stays_a_collective_failure() {
        let why = "collective all_gather failed: Connection closed by peer";
        let err = Error::from(crate::agent::Error::Collective(why.into()));
        assert!(matches!(err, Error::Collective(_)), "{err:?}");
        assert_eq!(err.to_string(), why);
        let err = Error::from(crate::agent::Error::Config("bad".into()));
        assert_eq!(err.to_string(), "agent: invalid agent config: bad");
    }
}
