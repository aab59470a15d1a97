//! The embedded Python interpreter, pointed at the project's virtual environment.
//!
//! Started outside an activated venv, the interpreter only sees its base installation, so
//! `import torch` would fail. The venv's site-packages recorded at build time is added to
//! `sys.path`; `TDMPC2_VENV` (a venv directory) or `TDMPC2_SITE_PACKAGES` override it.
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyModuleNotFoundError;
use pyo3::prelude::*;

/// The interpreter could not start or a Python call failed (its type and message, then where
/// it was raised: see [`describe`]).
#[derive(Debug, Clone, thiserror::Error)]
#[error("python: {0}")]
pub struct Error(pub String);

impl From<PyErr> for Error {
    fn from(err: PyErr) -> Self {
        Error(describe(&err))
    }
}

/// What separates a Python error's message from the frames where it was raised.
pub const TRACEBACK: &str = "\n  Python traceback (innermost last):";

/// The innermost frames of a traceback kept in an error's text.
const FRAMES: usize = 8;

/// `Type: message`, then the innermost frames of the error's traceback: a library's exception
/// deep inside an environment is found from its file and line. A module not found is named
/// with the site-packages it was looked for in, and what chose that one.
pub fn describe(err: &PyErr) -> String {
    let missing = Python::attach(|py| err.is_instance_of::<PyModuleNotFoundError>(py));
    let message = match missing {
        true => format!(
            "{err}, not in site-packages {} (from {}): install it there, or name a venv \
             that has it",
            site_packages().display(),
            site_packages_source()
        ),
        false => err.to_string(),
    };
    let Some(traceback) = Python::attach(|py| err.traceback(py).and_then(|tb| tb.format().ok()))
    else {
        return message;
    };
    // "Traceback (most recent call last):", then per frame its File line and maybe its code.
    let lines: Vec<&str> = traceback.lines().skip(1).collect();
    let frames: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].trim_start().starts_with("File "))
        .collect();
    let first = frames
        .len()
        .checked_sub(FRAMES)
        .map_or(0, |skipped| frames[skipped]);
    let kept: Vec<String> = lines[first..].iter().map(|l| format!("  {l}")).collect();
    match kept.is_empty() {
        true => message,
        false => format!("{message}{TRACEBACK}\n{}", kept.join("\n")),
    }
}

/// A Python error's text without its traceback: its type and message.
pub fn message(text: &str) -> &str {
    text.split(TRACEBACK).next().unwrap_or(text)
}

pub type Result<T> = std::result::Result<T, Error>;

const BUILD_SITE_PACKAGES: &str = env!("TDMPC2_SITE_PACKAGES");

/// The variable that points the interpreter at another site-packages than the venv's.
pub const SITE_PACKAGES_VAR: &str = "TDMPC2_SITE_PACKAGES";

/// The site-packages directory the interpreter is pointed at.
pub fn site_packages() -> PathBuf {
    if let Some(dir) = set_var(SITE_PACKAGES_VAR) {
        return PathBuf::from(dir);
    }
    if let Some(venv) = set_var("TDMPC2_VENV") {
        let lib = PathBuf::from(&venv).join("lib");
        let found = std::fs::read_dir(&lib).ok().and_then(|entries| {
            entries
                .flatten()
                .map(|e| e.path().join("site-packages"))
                .find(|p| p.is_dir())
        });
        // A venv without one is named as it is, not replaced by the build's.
        return found.unwrap_or_else(|| PathBuf::from(venv).join(site_packages_in_venv()));
    }
    PathBuf::from(BUILD_SITE_PACKAGES)
}

/// A variable's value, unless it is unset or empty (an empty one names nothing).
fn set_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// What chose [`site_packages`], in words for an error.
fn site_packages_source() -> String {
    for var in [SITE_PACKAGES_VAR, "TDMPC2_VENV"] {
        if let Some(value) = set_var(var) {
            return format!("{var}={value}");
        }
    }
    "the venv this binary was built with; TDMPC2_VENV names another".into()
}

/// The project's venv: `TDMPC2_VENV`, else the venv whose site-packages was recorded at
/// build time (`<venv>/lib/pythonX.Y/site-packages`).
pub fn venv_dir() -> PathBuf {
    if let Some(venv) = set_var("TDMPC2_VENV") {
        return PathBuf::from(venv);
    }
    let site = PathBuf::from(BUILD_SITE_PACKAGES);
    site.ancestors()
        .nth(3)
        .map_or_else(|| site.clone(), PathBuf::from)
}

/// Where a venv made with this interpreter's Python keeps its packages, relative to the venv
/// (`lib/python3.12/site-packages`).
pub fn site_packages_in_venv() -> PathBuf {
    let site = PathBuf::from(BUILD_SITE_PACKAGES);
    let python = site
        .parent()
        .and_then(|lib| lib.file_name())
        .map_or_else(|| "python3".into(), PathBuf::from);
    PathBuf::from("lib").join(python).join("site-packages")
}

/// Keeps `ours` as the only site-packages on `sys.path`. An embedded interpreter looks for
/// `python3` on PATH to find its prefix, and adopts the venv it finds there (an activated
/// one, or the one the scripts put first): its packages must not shadow those of the venv
/// chosen here (a task family's venv pins other versions of the same packages).
const ONLY_OURS: &str = "\
import os, site, sys
ours = os.path.realpath(OURS)
sys.path[:] = [p for p in sys.path if os.path.basename(os.path.normpath(p)) not in
               ('site-packages', 'dist-packages') or os.path.realpath(p) == ours]
site.addsitedir(OURS)
";

/// Starts the interpreter once and makes the venv importable. Cheap after the first call.
pub fn init() -> Result<()> {
    static READY: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            let dir = site_packages();
            if !dir.is_dir() {
                return Err(format!(
                    "cannot use site-packages {}: there is no such directory (from {})",
                    dir.display(),
                    site_packages_source()
                ));
            }
            Python::attach(|py| -> PyResult<()> {
                let globals = pyo3::types::PyDict::new(py);
                globals.set_item("OURS", dir.to_string_lossy())?;
                py.run(&std::ffi::CString::new(ONLY_OURS)?, Some(&globals), None)
            })
            .map_err(|e| format!("cannot use site-packages {}: {e}", dir.display()))
        })
        .clone()
        .map_err(Error)
}

/// Runs `f` with the interpreter initialised and the GIL held.
pub fn with_python<T>(f: impl for<'py> FnOnce(Python<'py>) -> PyResult<T>) -> Result<T> {
    init()?;
    Python::attach(f).map_err(Error::from)
}

/// Like [`with_python`], for closures that produce the caller's own errors.
pub fn attach<T, E: From<Error>>(
    f: impl for<'py> FnOnce(Python<'py>) -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    init()?;
    Python::attach(f)
}

/// Imports Python source embedded in the binary as a module named `name`.
pub fn load_module<'py>(
    py: Python<'py>,
    source: &str,
    name: &str,
) -> PyResult<Bound<'py, PyModule>> {
    let to_c = |s: &str| {
        std::ffi::CString::new(s)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    };
    PyModule::from_code(
        py,
        &to_c(source)?,
        &to_c(&format!("{name}.py"))?,
        &to_c(name)?,
    )
}

/// Copies a 1-D float32 numpy array into a Vec.
pub fn f32_vec<E: From<Error>>(array: &Bound<'_, PyAny>) -> std::result::Result<Vec<f32>, E> {
    let array = array
        .cast::<PyArray1<f32>>()
        .map_err(|e| Error(e.to_string()))?;
    Ok(array.readonly().as_array().to_vec())
}

/// Like [`attach`], but one thread at a time. Two threads importing interdependent modules
/// concurrently can each be handed the other's partially initialised module (an
/// ImportError about a circular import), so every call that may import goes through here.
/// A thread waiting for its turn releases the GIL, so this cannot deadlock with it, also
/// when called from inside `Python::attach`. Not reentrant.
pub fn attach_exclusive<T, E: From<Error>>(
    f: impl for<'py> FnOnce(Python<'py>) -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    attach(|py| {
        py.detach(|| IMPORT_TURN.acquire());
        let _turn = ImportTurn;
        f(py)
    })
}

/// A lock whose waiting happens without the GIL and whose holding happens with it (a
/// `MutexGuard` cannot cross `Python::detach`, so ownership is a flag).
struct TurnLock {
    busy: Mutex<bool>,
    released: Condvar,
}

static IMPORT_TURN: TurnLock = TurnLock {
    busy: Mutex::new(false),
    released: Condvar::new(),
};

impl TurnLock {
    fn flag(&self) -> MutexGuard<'_, bool> {
        self.busy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn acquire(&self) {
        let mut busy = self.flag();
        while *busy {
            busy = self
                .released
                .wait(busy)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        *busy = true;
    }

    fn release(&self) {
        *self.flag() = false;
        self.released.notify_one();
    }
}

/// Releases the import turn when dropped, also on panic.
struct ImportTurn;

impl Drop for ImportTurn {
    fn drop(&mut self) {
        IMPORT_TURN.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_keeps_where_it_was_raised_and_its_message_stays_first() {
        let source =
            "def inner(x):\n    return {}[x]\n\ndef outer():\n    return inner('solved')\n";
        let text = with_python(|py| {
            let module = load_module(py, source, "raiser")?;
            module.getattr("outer")?.call0().map(|_| ())
        })
        .unwrap_err()
        .0;
        assert_eq!(message(&text), "KeyError: 'solved'", "{text}");
        assert!(
            text.contains("raiser.py\", line 2, in inner") && text.contains("in outer"),
            "{text}"
        );
        // The innermost frame last, as Python prints it.
        assert!(text.find("in outer") < text.find("in inner"), "{text}");
    }

    #[test]
    fn a_module_not_found_names_where_it_was_looked_for() {
        let text = with_python(|py| py.import("tdmpc2_no_such_module").map(drop))
            .unwrap_err()
            .0;
        assert!(
            message(&text).starts_with(&format!(
                "ModuleNotFoundError: No module named 'tdmpc2_no_such_module', not in \
                 site-packages {} (from ",
                site_packages().display()
            )),
            "{text}"
        );
    }

    #[test]
    fn a_deep_traceback_keeps_its_innermost_frames() {
        // f0 calls f1 ... f11, which raises: twelve frames of their own.
        let mut source = String::from("def f11():\n    raise ValueError('bottom')\n");
        for i in 0..11 {
            source += &format!("def f{i}():\n    return f{}()\n", i + 1);
        }
        let text = with_python(|py| {
            let module = load_module(py, &source, "deep")?;
            module.getattr("f0")?.call0().map(|_| ())
        })
        .unwrap_err()
        .0;
        assert_eq!(text.matches("File ").count(), FRAMES, "{text}");
        assert!(
            text.contains("in f11") && !text.contains("in f3\n"),
            "{text}"
        );
    }
}
