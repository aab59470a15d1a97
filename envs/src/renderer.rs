//! Which OpenGL backend MuJoCo renders with (`MUJOCO_GL`), whether this machine has it, and a
//! rendering failure said in one line: the backend, what failed, and the backends this machine
//! has, instead of the traceback of whichever library gave up.
use std::sync::OnceLock;

use crate::{Error, Result};

/// The backends MuJoCo renders with, in the order they are suggested.
pub const BACKENDS: [&str; 3] = ["egl", "osmesa", "glfw"];
/// What rendering headless uses when the user chose nothing.
pub const DEFAULT: &str = "egl";
/// Values of `MUJOCO_GL` that turn rendering off.
const OFF: [&str; 5] = ["disable", "disabled", "off", "false", "0"];

/// The backend a process that renders uses: `MUJOCO_GL` when set, else [`DEFAULT`].
pub fn chosen() -> String {
    std::env::var("MUJOCO_GL")
        .ok()
        .filter(|gl| !gl.is_empty())
        .unwrap_or_else(|| DEFAULT.to_string())
}

/// Takes an empty `MUJOCO_GL` for none chosen, for the simulators too (MuJoCo and dm_control
/// refuse an empty value, at the first frame): called first thing, while no other thread runs.
pub fn forget_an_empty_choice() {
    if std::env::var_os("MUJOCO_GL").is_some_and(|gl| gl.is_empty()) {
        std::env::remove_var("MUJOCO_GL");
    }
}

/// The backends whose libraries (or display) this machine has.
pub fn available() -> Vec<&'static str> {
    static FOUND: OnceLock<Vec<&'static str>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            BACKENDS
                .into_iter()
                .filter(|&backend| missing(backend).is_none())
                .collect()
        })
        .clone()
}

/// Why `backend` cannot render on this machine, if it cannot.
fn missing(backend: &str) -> Option<String> {
    let has = |names: &[&str]| names.iter().any(|name| library_exists(name));
    match backend {
        "egl" if !has(&["libEGL.so.1", "libEGL.so"]) => Some("libEGL.so.1 is not installed".into()),
        "osmesa" if !has(&["libOSMesa.so.8", "libOSMesa.so.6", "libOSMesa.so"]) => {
            Some("libOSMesa is not installed".into())
        }
        "glfw"
            if ["DISPLAY", "WAYLAND_DISPLAY"]
                .iter()
                .all(|var| !std::env::var(var).is_ok_and(|v| !v.is_empty())) =>
        {
            Some("there is no display (DISPLAY and WAYLAND_DISPLAY are unset)".into())
        }
        "egl" | "osmesa" | "glfw" => None,
        other if OFF.contains(&other) => Some("it turns rendering off".into()),
        _ => Some(format!(
            "it is not a backend MuJoCo knows ({})",
            BACKENDS.join(", ")
        )),
    }
}

/// Errors unless the backend a rendering environment would use can render here.
pub fn check() -> Result<()> {
    let backend = chosen();
    match missing(&backend) {
        None => Ok(()),
        Some(what) => Err(failure_of(&backend, what)),
    }
}

/// [`check`] for an environment that `renders` or not. One that does not still loads the
/// backend the user chose (MuJoCo's packages import it with themselves), so a chosen backend
/// must be usable unless it turns rendering off; none chosen needs nothing.
pub fn check_for(renders: bool) -> Result<()> {
    let set = std::env::var("MUJOCO_GL").ok().filter(|gl| !gl.is_empty());
    match set {
        _ if renders => check(),
        Some(gl) if !OFF.contains(&gl.as_str()) => check(),
        _ => Ok(()),
    }
}

/// Words of a Python error (its message or the files of its traceback) that place it in the
/// OpenGL backend: MuJoCo's and dm_control's GL bindings, PyOpenGL, EGL, OSMesa, GLFW. Whole
/// words (`EGL_BAD_DISPLAY`, `libEGL.so.1`, `.../mujoco/egl/...`), not parts of others.
const GL_WORDS: [&str; 9] = [
    "egl",
    "libegl",
    "osmesa",
    "libosmesa",
    "glfw",
    "opengl",
    "pyopengl",
    "gladloadgl",
    "mjr",
];
/// Folders of the GL bindings, as a traceback's files name them.
const GL_FOLDERS: [&str; 2] = ["/_render/", "/mujoco/gl_context"];

/// An error raised while loading a renderer or rendering: a failure of the chosen backend when
/// it comes from the OpenGL backend, else the error itself (a missing package, a bug in an
/// adapter), with its traceback: never sent to debug EGL for what is not EGL's.
pub fn failure(err: Error) -> Error {
    match err {
        Error::Python(text) if from_gl(&text) => backend_failure(embedded_python::message(&text)),
        other => other,
    }
}

fn from_gl(text: &str) -> bool {
    let text = text.to_lowercase();
    GL_FOLDERS.iter().any(|folder| text.contains(folder))
        || text
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|word| GL_WORDS.contains(&word) || word.starts_with("mjr"))
}

/// A failure of the chosen backend, said by the last line of what the library raised.
fn backend_failure(text: &str) -> Error {
    let line = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no reason given")
        .trim_end_matches('.');
    failure_of(&chosen(), format!("rendering failed: {line}"))
}

fn failure_of(backend: &str, what: String) -> Error {
    Error::Renderer {
        backend: backend.to_string(),
        what,
        available: available().into_iter().map(String::from).collect(),
    }
}

/// Whether the dynamic linker would find `name`: in its cache (`ldconfig -p`) or in a
/// `LD_LIBRARY_PATH` directory. Nothing is loaded.
fn library_exists(name: &str) -> bool {
    static CACHE: OnceLock<String> = OnceLock::new();
    let cache = CACHE.get_or_init(|| {
        ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
            .iter()
            .find_map(|ldconfig| std::process::Command::new(ldconfig).arg("-p").output().ok())
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default()
    });
    let listed = cache
        .lines()
        .any(|line| line.split_whitespace().next() == Some(name));
    listed
        || std::env::var("LD_LIBRARY_PATH").is_ok_and(|dirs| {
            dirs.split(':')
                .filter(|d| !d.is_empty())
                .any(|d| std::path::Path::new(d).join(name).exists())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_off_values_are_named() {
        assert!(missing("bogus").unwrap().contains("egl, osmesa, glfw"));
        assert!(missing("disable").unwrap().contains("off"));
        let e = failure_of("osmesa", "libOSMesa is not installed".into()).to_string();
        assert!(
            e.starts_with("MUJOCO_GL=osmesa cannot render: libOSMesa is not installed; "),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    #[test]
    fn a_gl_error_becomes_its_last_line() {
        let text = format!(
            "ImportError: Cannot initialize a EGL device display.\nlast line: boom{}\n  File \
             \"/site/dm_control/_render/pyopengl/egl_renderer.py\", line 3",
            embedded_python::TRACEBACK
        );
        let e = failure(Error::Python(text)).to_string();
        assert!(
            e.contains("cannot render: rendering failed: last line: boom"),
            "{e}"
        );
        assert!(!e.contains("egl_renderer.py"), "{e}");
    }

    #[test]
    fn an_error_that_is_not_gl_s_stays_itself() {
        for text in [
            "ModuleNotFoundError: No module named 'dm_control'",
            "KeyError: 'solved'\n  Python traceback (innermost last):\n    File \"adapter.py\"",
            "Unsupported: made without a renderer",
            "ValueError: a negligible reward in /home/segler/run.py",
        ] {
            let e = failure(Error::Python(text.into()));
            assert!(matches!(&e, Error::Python(t) if t == text), "{e}");
        }
    }
}
