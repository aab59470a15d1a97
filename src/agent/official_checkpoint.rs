//! The official TD-MPC2 checkpoint (`torch.save({"model": state_dict})`) and our safetensors
//! state dict, both ways: an import reads one with `torch.load(weights_only=True)` in the
//! embedded Python, an export writes one with `torch.save` there, for the official `TDMPC2.load`.
use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use pyo3::types::{PyAnyMethods, PyBytes, PyDict, PyDictMethods};
use tch::{Kind, Tensor};

use super::error::{Error, Result};
use super::world_model::{
    DYNAMICS, LOG_STD_DIF, LOG_STD_MIN, POLICY, Q_DETACHED, Q_ONLINE, Q_TARGET, REWARD, TERMINATION,
};

/// The names torch's own files take (`torch.save`'s, the official checkpoints').
pub const TORCH_EXTENSIONS: [&str; 2] = ["pt", "pth"];

/// Names of the per-layer tensors in the pre-2024 flat ensemble layout (`_Qs.params.<n>`).
const LEGACY_Q_NAMES: [&str; 4] = ["weight", "bias", "ln.weight", "ln.bias"];

/// Maps an official key to ours; `None` drops it (bookkeeping, the detached Q view). Official
/// code of late 2024 saved the detached and target ensembles twice (`_detach_Qs.params.*` and
/// `_target_Qs.params.<layer>.*` beside `_detach_Qs_params.*` and `_target_Qs_params.*`): the
/// detached copies are dropped, the target's read under one name (equal copies are taken once);
/// its April 2025 termination head `_terminated` is our `_termination`.
fn convert_key(key: &str) -> Option<String> {
    let key = key.strip_prefix("module.").unwrap_or(key);
    let bookkeeping = key.ends_with("__batch_size") || key.ends_with("__device");
    if bookkeeping || key.starts_with(Q_DETACHED) || key.starts_with("_detach_Qs.") {
        return None;
    }
    if let Some(rest) = key.strip_prefix("_terminated.") {
        return Some(format!("{TERMINATION}.{rest}"));
    }
    // Pre-compile checkpoints: `_Qs.params.<n>` / `_target_Qs.params.<n>`, four tensors per layer.
    for (legacy, ours) in [("_Qs.params.", Q_ONLINE), ("_target_Qs.params.", Q_TARGET)] {
        if let Some(index) = key
            .strip_prefix(legacy)
            .and_then(|rest| rest.parse::<usize>().ok())
        {
            return Some(format!(
                "{ours}.{}.{}",
                index / 4,
                LEGACY_Q_NAMES[index % 4]
            ));
        }
    }
    if let Some(rest) = key.strip_prefix("_target_Qs.params.") {
        return Some(format!("{Q_TARGET}.{rest}"));
    }
    Some(key.to_string())
}

/// One tensor read from Python: name, shape and float32 bytes.
struct RawTensor {
    name: String,
    shape: Vec<i64>,
    bytes: Vec<u8>,
}

/// Flattens (possibly nested, tensordict-like) mappings of tensors into dotted names.
fn collect<'py>(
    prefix: &str,
    mapping: &Bound<'py, PyAny>,
    out: &mut Vec<RawTensor>,
) -> PyResult<()> {
    let torch = mapping.py().import("torch")?;
    let tensor_type = torch.getattr("Tensor")?;
    let items = mapping.call_method0("items")?;
    for item in items.try_iter()? {
        let (key, value): (Bound<'py, PyAny>, Bound<'py, PyAny>) = item?.extract()?;
        let key: String = key.str()?.extract()?;
        let name = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        if value.is_instance(&tensor_type)? {
            if value.call_method0("is_complex")?.extract::<bool>()? {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "`{name}` holds complex numbers, which no TD-MPC2 parameter does"
                )));
            }
            let value = value.call_method0("detach")?.call_method0("cpu")?;
            let value = value
                .call_method1("to", (torch.getattr("float32")?,))?
                .call_method0("contiguous")?;
            let shape: Vec<i64> = value
                .getattr("shape")?
                .call_method0("__iter__")?
                .try_iter()?
                .map(|d| d.and_then(|d| d.extract::<i64>()))
                .collect::<PyResult<_>>()?;
            let bytes: Vec<u8> = value
                .call_method0("numpy")?
                .call_method0("tobytes")?
                .extract()?;
            out.push(RawTensor { name, shape, bytes });
        } else if value.hasattr("items")? {
            collect(&name, &value, out)?;
        }
        // Anything else (batch sizes, devices, None) is bookkeeping.
    }
    Ok(())
}

/// torch's refusal to load a file, in one line: the unpickler's own reason where there is one
/// (torch wraps it in lines about `weights_only`, which an official checkpoint never needs).
fn unreadable(py: Python<'_>, e: PyErr) -> PyErr {
    let text = e.value(py).to_string();
    let reason = text
        .split_once("WeightsUnpickler error:")
        .map_or(text.as_str(), |(_, after)| after);
    let first = reason.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let kind = e
        .get_type(py)
        .name()
        .map_or_else(|_| "error".to_string(), |n| n.to_string());
    let why = match first.trim() {
        "" if kind == "EOFError" => format!("{kind}: the file ends early"),
        "" => kind,
        line => format!("{kind}: {line}"),
    };
    pyo3::exceptions::PyValueError::new_err(format!(
        "not a checkpoint torch.save wrote, or one torch cannot read (torch.load: {why})"
    ))
}

/// Reads the official checkpoint at `pt_path` and writes its model weights under our names to
/// `out_path` (safetensors). Returns the names written.
pub fn import_official(pt_path: &Path, out_path: &Path) -> Result<Vec<String>> {
    refuse_the_other_format(
        out_path,
        &TORCH_EXTENSIONS,
        "import writes safetensors, e.g. model.safetensors",
    )?;
    let path_text = pt_path.display().to_string();
    if pt_path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
    {
        return Err(Error::Unreadable {
            path: path_text,
            message: "a .safetensors file is this project's own format already: give it to \
                      eval or train as checkpoint= (import reads the official torch.save files)"
                .into(),
        });
    }
    refuse_a_damaged_archive(pt_path)?;
    let raw = embedded_python::with_python(|py| {
        let torch = py.import("torch")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("weights_only", true)?;
        kwargs.set_item("map_location", "cpu")?;
        let checkpoint = torch
            .call_method("load", (pt_path,), Some(&kwargs))
            .map_err(|e| unreadable(py, e))?;
        if !checkpoint.hasattr("items")? {
            let kind = checkpoint.get_type().name()?.to_string();
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "it holds a {kind}, not a state dict (a mapping of names to tensors)"
            )));
        }
        let state = match checkpoint.get_item("model") {
            Ok(model) if model.hasattr("items")? => model,
            _ => checkpoint,
        };
        let mut out = Vec::new();
        collect("", &state, &mut out)?;
        Ok(out)
    })
    .map_err(|e| Error::Unreadable {
        path: path_text.clone(),
        // The errors raised above are ours: their Python type says nothing.
        message: e
            .to_string()
            .trim_start_matches("python: ")
            .trim_start_matches("ValueError: ")
            .to_string(),
    })?;

    let named = under_our_names(raw, &path_text)?;
    if let Some(why) = not_a_tdmpc2_model(&named) {
        return Err(Error::Unreadable {
            path: path_text,
            message: why,
        });
    }
    let fail = |message: String| Error::Checkpoint {
        path: out_path.display().to_string(),
        message,
    };
    let (tmp, _watched) = reserve_partial(out_path)?;
    let written = Tensor::write_safetensors(&named, &tmp)
        .map_err(|e| fail(e.to_string()))
        .and_then(|()| std::fs::rename(&tmp, out_path).map_err(|e| fail(e.to_string())));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    Ok(named.into_iter().map(|(n, _)| n).collect())
}

/// The tensors read, under our names: bookkeeping dropped, and a tensor saved twice under names
/// that are both ours (official code of late 2024) taken once where the copies are equal.
fn under_our_names(raw: Vec<RawTensor>, path_text: &str) -> Result<Vec<(String, Tensor)>> {
    let mut named = Vec::new();
    let mut sources = std::collections::BTreeMap::new();
    for t in raw {
        let Some(name) = convert_key(&t.name) else {
            continue;
        };
        let tensor = Tensor::f_from_data_size(&t.bytes, &t.shape, Kind::Float)?;
        if let Some((first, at)) = sources.get(&name) {
            let (_, kept): &(String, Tensor) = &named[*at];
            if kept.size() == tensor.size() && kept.equal(&tensor) {
                continue;
            }
            return Err(Error::Unreadable {
                path: path_text.to_owned(),
                message: format!(
                    "`{first}` and `{}` are both the model's `{name}`, with other values: a \
                     state dict holds each parameter once",
                    t.name
                ),
            });
        }
        sources.insert(name.clone(), (t.name.clone(), named.len()));
        named.push((name, tensor));
    }
    Ok(named)
}

/// A file of this process's own beside `out_path` (created here, so no file of anyone else's
/// is written over), to be renamed to `out_path` once whole; watched from before it exists
/// until the guard drops.
fn reserve_partial(out_path: &Path) -> Result<(PathBuf, crate::partial_files::Pending)> {
    let name = out_path.file_name().unwrap_or_default().to_string_lossy();
    let fail = |e: std::io::Error| Error::Output {
        path: out_path.display().to_string(),
        message: format!("cannot make a file beside it to write into ({e})"),
    };
    for n in 0.. {
        let partial =
            out_path.with_file_name(format!(".{name}.{}-{n}.partial", std::process::id()));
        let watched = crate::partial_files::watch(&partial);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&partial)
        {
            Ok(_) => return Ok((partial, watched)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => continue,
            Err(e) => return Err(fail(e)),
        }
    }
    unreachable!("the loop returns")
}

/// Refuses a `torch.save` file whose bytes are not those written (torch's reader checks no
/// CRC-32, and a damaged copy loads as other weights). A file in torch's older format, which
/// is no zip archive, is left to torch's reader.
fn refuse_a_damaged_archive(pt_path: &Path) -> Result<()> {
    if !crate::zip_crc::is_zip(pt_path) {
        return Ok(());
    }
    use crate::zip_crc::{ReadBack, Unreadable};
    let path = pt_path.display().to_string();
    match crate::zip_crc::read_back(pt_path, &|| false) {
        Ok(ReadBack::Checked(_) | ReadBack::Stopped) => Ok(()),
        Ok(ReadBack::NoChecksums) => {
            errln!(
                "warning: {path} records no CRC-32s (saved with torch's CRC-32s turned off): \
                 its bytes cannot be checked"
            );
            Ok(())
        }
        Err(Unreadable::Damaged(what)) => Err(Error::Unreadable {
            path,
            message: format!(
                "{what}; the file is not what was written (a damaged copy or an interrupted \
                 download): copy or download it again"
            ),
        }),
        Err(Unreadable::CannotOpen(e)) => Err(Error::Unreadable {
            path,
            message: format!("cannot be opened ({e})"),
        }),
        Err(Unreadable::ReadFailed(what, e)) => Err(Error::Checkpoint {
            path,
            message: format!("reading {what} failed ({e})"),
        }),
    }
}

/// Why `named` is not a TD-MPC2 model's state dict, if it is not: a part every model has is
/// missing, its shapes disagree among themselves, or a value is not finite (the weights of a
/// diverged run play nothing).
fn not_a_tdmpc2_model(named: &[(String, Tensor)]) -> Option<String> {
    let has = |prefix: &str| named.iter().any(|(name, _)| name.starts_with(prefix));
    let parts = ["_encoder.", DYNAMICS, REWARD, POLICY, Q_ONLINE, Q_TARGET];
    if let Some(missing) = parts.iter().find(|part| !has(part)) {
        return Some(format!(
            "not a TD-MPC2 state dict: it has no `{}` tensors ({} tensors read)",
            missing.trim_end_matches('.'),
            named.len()
        ));
    }
    // A tensor of no part of the model: no settings would load it (eval's advice would be
    // to look for them).
    let first_part = |name: &str| name.split('.').next().unwrap_or_default().to_owned();
    let known: Vec<String> = parts
        .iter()
        .chain(&[
            TERMINATION,
            "_task_emb",
            "_action_masks",
            LOG_STD_MIN,
            LOG_STD_DIF,
        ])
        .map(|part| first_part(part))
        .collect();
    if let Some((name, _)) = named
        .iter()
        .find(|(name, _)| !known.contains(&first_part(name)))
    {
        return Some(format!(
            "`{name}` is no part of a TD-MPC2 model (its parts: {}): a state dict of another \
             model, or of a version of TD-MPC2 this one does not know",
            known.join(", ")
        ));
    }
    let not_finite = named
        .iter()
        .find(|(_, t)| !bool::try_from(t.isfinite().all()).unwrap_or(false));
    if let Some((name, _)) = not_finite {
        return Some(format!(
            "`{name}` holds NaN or infinite values: these weights cannot be played or trained"
        ));
    }
    let shapes: Vec<(String, Vec<i64>)> =
        named.iter().map(|(n, t)| (n.clone(), t.size())).collect();
    super::state_dict_check::inconsistency(&shapes)
        .map(|why| format!("an incomplete or damaged TD-MPC2 state dict: {why}"))
}

/// Tensors for the embedded Python, name → (float32 bytes, shape), which
/// `torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape)` rebuilds.
pub fn python_tensors<'py, 't>(
    py: Python<'py>,
    tensors: impl IntoIterator<Item = (&'t str, &'t Tensor)>,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (name, tensor) in tensors {
        let tensor = tensor.to_kind(Kind::Float).contiguous();
        let mut bytes = vec![0u8; tensor.numel() * 4];
        tensor.copy_data_u8(&mut bytes, tensor.numel());
        out.set_item(name, (PyBytes::new(py, &bytes), tensor.size()))?;
    }
    Ok(out)
}

/// Writes the official checkpoint of our safetensors state dict at `model_path` to `out_path`:
/// our tensors under their names (the official keys), the online Q parameters once more as the
/// official detached view, and each Q ensemble's bookkeeping entries (a tensordict's batch size
/// and device, without which the official `load_state_dict` refuses the file). The file appears
/// whole or not at all. Returns the number of tensors written.
pub fn export_official(model_path: &Path, out_path: &Path) -> Result<usize> {
    refuse_the_other_format(
        out_path,
        &["safetensors"],
        "export writes torch's format, e.g. agent.pt",
    )?;
    let fail = |path: &Path, message: String| Error::Unreadable {
        path: path.display().to_string(),
        message,
    };
    let (mut named, num_q) = read_our_model(model_path)?;
    // An official checkpoint of the 2023 layout, imported, has no log-std bounds (nor a
    // multitask model's action masks): written back in that layout, the official loader
    // converts it and takes them from its config, as it does for the published checkpoints.
    let legacy = !named.iter().any(|(name, _)| name == LOG_STD_MIN);
    if legacy {
        errln!(
            "note: {} has no log-std bounds (an official checkpoint of 2023's layout, \
             imported): written in that layout, which the official loader converts",
            model_path.display()
        );
        for (name, _) in &mut named {
            *name = legacy_q_name(name);
        }
    }
    let (partial, _watched) = reserve_partial(out_path)?;
    let written = embedded_python::with_python(|py| {
        let globals = PyDict::new(py);
        let tensors = named.iter().map(|(name, tensor)| (name.as_str(), tensor));
        globals.set_item("tensors", python_tensors(py, tensors)?)?;
        globals.set_item("legacy", legacy)?;
        // A path, not text: a name that is not UTF-8 reaches Python as the same file.
        globals.set_item("path", out_path)?;
        globals.set_item("partial", &partial)?;
        globals.set_item("num_q", num_q)?;
        globals.set_item("online", Q_ONLINE)?;
        globals.set_item("detached", Q_DETACHED)?;
        globals.set_item("ensembles", [Q_ONLINE, Q_DETACHED, Q_TARGET])?;
        py.run(
            c"
import os, torch
state = {
    name: torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape)
    for name, (raw, shape) in tensors.items()
}
for name in [n for n in state if n.startswith(online + '.') and not legacy]:
    state[detached + name[len(online):]] = state[name]
for prefix in ensembles if not legacy else []:
    state[prefix + '.__batch_size'] = torch.Size([num_q])
    state[prefix + '.__device'] = None
path, partial = os.fspath(path), os.fspath(partial)
try:
    # Through a file object: torch's own path handling takes only UTF-8 names.
    with open(partial, 'wb') as out:
        torch.save({'model': state}, out)
    os.replace(partial, path)
finally:
    if os.path.exists(partial):
        os.remove(partial)
written = sum(isinstance(v, torch.Tensor) for v in state.values())
",
            Some(&globals),
            None,
        )?;
        globals
            .get_item("written")?
            .map_or(Ok(0), |n| n.extract::<usize>())
    })
    .map_err(|e| fail(out_path, e.to_string()));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// Our safetensors state dict at `model_path`, checked to be a whole TD-MPC2 model, and the
/// number of its Q-functions.
fn read_our_model(model_path: &Path) -> Result<(Vec<(String, Tensor)>, i64)> {
    let fail = |message: String| Error::Unreadable {
        path: model_path.display().to_string(),
        message,
    };
    std::fs::File::open(model_path).map_err(|e| Error::Checkpoint {
        path: model_path.display().to_string(),
        message: format!("cannot be read: {e}"),
    })?;
    let named = Tensor::read_safetensors(model_path).map_err(|e| {
        fail(format!(
            "not a readable safetensors file (truncated, damaged, or another format): {e}"
        ))
    })?;
    // Named as a model loads them (a wrapper's `module.`, no detached view of its own).
    let named: Vec<(String, Tensor)> = named
        .into_iter()
        .map(|(name, t)| (name.strip_prefix("module.").unwrap_or(&name).to_owned(), t))
        .filter(|(name, _)| !name.starts_with(Q_DETACHED))
        .collect();
    let first_q = format!("{Q_ONLINE}.0.weight");
    let num_q = named
        .iter()
        .find(|(name, _)| *name == first_q)
        .and_then(|(_, weight)| match weight.size()[..] {
            [members, _, _] => Some(members),
            _ => None,
        })
        .ok_or_else(|| {
            fail(format!(
                "no `{first_q}` of shape [members, out, in]: not a TD-MPC2 state dict"
            ))
        })?;
    if let Some(why) = not_a_tdmpc2_model(&named) {
        return Err(fail(why));
    }
    Ok((named, num_q))
}

/// A Q-ensemble tensor's name in the 2023 layout (`_Qs.params.<n>`, `_target_Qs.params.<n>`,
/// four tensors a layer); other names as they are.
fn legacy_q_name(name: &str) -> String {
    for (ours, legacy) in [(Q_ONLINE, "_Qs.params"), (Q_TARGET, "_target_Qs.params")] {
        let Some((layer, tensor)) = name
            .strip_prefix(ours)
            .and_then(|rest| rest.strip_prefix('.'))
            .and_then(|rest| rest.split_once('.'))
        else {
            continue;
        };
        let index = LEGACY_Q_NAMES.iter().position(|n| *n == tensor);
        if let (Ok(layer), Some(index)) = (layer.parse::<usize>(), index) {
            return format!("{legacy}.{}", layer * LEGACY_Q_NAMES.len() + index);
        }
    }
    name.to_owned()
}

/// A file to write whose name says the format the command reads: a `.safetensors` file holding
/// a torch pickle (or the reverse) would mislead whoever opens it next.
/// The file import or export is to write, refused before anything is read when it is named for
/// the other format, has no folder, or exists: neither ever replaces a file (a checkpoint's
/// own, the run's config) with what it writes.
fn refuse_the_other_format(out_path: &Path, extensions: &[&str], writes: &str) -> Result<()> {
    let refuse = |message| {
        Err(Error::Output {
            path: out_path.display().to_string(),
            message,
        })
    };
    let other = out_path.extension().and_then(|e| {
        extensions
            .iter()
            .find(|other| e.eq_ignore_ascii_case(other))
    });
    if let Some(extension) = other {
        return refuse(format!("named .{extension}, but {writes}"));
    }
    if out_path.as_os_str().as_encoded_bytes().ends_with(b"/") {
        return refuse("ends in '/': give the name of the file to write".into());
    }
    let folder = out_path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(folder) = folder.filter(|f| !f.is_dir()) {
        return refuse(format!("the folder {} does not exist", folder.display()));
    }
    if out_path.is_dir() {
        return refuse(format!(
            "is a directory; give the file to write, e.g. {}",
            out_path
                .join(if extensions == TORCH_EXTENSIONS {
                    "model.safetensors"
                } else {
                    "agent.pt"
                })
                .display()
        ));
    }
    // A link counts, one that leads nowhere too: writing would replace it.
    if out_path.symlink_metadata().is_ok() {
        return refuse("exists; give a new file (nothing is ever overwritten)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One tensor name of every part a TD-MPC2 state dict has, as a Python list.
    const PARTS: &str = "['_encoder.state.0.weight', '_dynamics.0.weight', '_reward.0.weight', \
                         '_pi.0.weight', '_Qs.params.0.weight', '_target_Qs_params.0.weight']";

    /// The smallest whole model, as a Python dict: every part's first layer, 4 × 4.
    fn whole_model() -> String {
        format!(
            "{{**{{k: torch.full((4, 4), 0.5) for k in {PARTS}}}, \
             **{{k.replace('weight', 'bias'): torch.full((4,), 0.5) for k in {PARTS}}}}}"
        )
    }

    /// Runs `code` in the embedded interpreter (to write a `.pt` as torch does).
    fn run_python(code: &str) {
        embedded_python::with_python(|py| {
            py.run(&std::ffi::CString::new(code).unwrap(), None, None)
        })
        .unwrap();
    }

    #[test]
    fn a_file_torch_cannot_load_is_one_line_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.safetensors");
        for (bytes, why) in [
            (
                &b"garbage"[..],
                "(torch.load: UnpicklingError: Unsupported operand 103)",
            ),
            (b"", "(torch.load: EOFError: the file ends early)"),
        ] {
            let pt = dir.path().join("agent.pt");
            std::fs::write(&pt, bytes).unwrap();
            let e = import_official(&pt, &out).unwrap_err();
            assert!(matches!(e, Error::Unreadable { .. }), "{e:?}");
            let e = e.to_string();
            assert!(
                e.contains(": not a checkpoint torch.save wrote, or one torch cannot read")
                    && e.contains(why),
                "{e}"
            );
            assert!(!e.contains('\n') && !e.contains("weights_only"), "{e}");
            assert!(!out.exists());
        }
    }

    /// A copy whose tensor bytes changed loads in torch as other weights: it is refused by the
    /// archive's CRC-32s, and nothing is written; an output that is a link, even one leading
    /// nowhere, is not written through.
    #[test]
    fn a_damaged_official_checkpoint_or_a_link_as_output_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pt = dir.path().join("agent.pt");
        let code = format!(
            "import torch\ntorch.save({{'model': {}}}, {:?})\n",
            whole_model(),
            pt.to_string_lossy()
        );
        run_python(&code);
        let out = dir.path().join("out.safetensors");
        import_official(&pt, &out).unwrap();
        // Saved without CRC-32s (torch writes 0s): not checkable, not damaged.
        let unchecked = dir.path().join("unchecked.pt");
        let code = format!(
            "import torch\ns = torch.serialization\ns.set_crc32_options(False)\n\
             torch.save(torch.load({:?}), {:?})\ns.set_crc32_options(True)\n",
            pt.to_string_lossy(),
            unchecked.to_string_lossy()
        );
        run_python(&code);
        import_official(&unchecked, &dir.path().join("unchecked.safetensors")).unwrap();

        let mut bytes = std::fs::read(&pt).unwrap();
        let half = 0.5f32.to_le_bytes().repeat(4);
        let at = bytes.windows(half.len()).position(|w| w == half).unwrap();
        bytes[at + 3] ^= 0x01;
        std::fs::write(&pt, &bytes).unwrap();
        let fresh = dir.path().join("fresh.safetensors");
        let e = import_official(&pt, &fresh).unwrap_err();
        assert!(matches!(e, Error::Unreadable { .. }), "{e:?}");
        assert!(e.to_string().contains("does not match the CRC-32"), "{e}");
        assert!(!fresh.exists());

        let link = dir.path().join("link.safetensors");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
        let e = import_official(&dir.path().join("agent.pt"), &link).unwrap_err();
        assert!(e.to_string().contains("exists; give a new file"), "{e}");
        assert!(!dir.path().join("nowhere").exists());
    }

    /// Files torch loads that hold no TD-MPC2 model are refused, naming why, and nothing is
    /// written: a bare tensor, a state dict of something else, a model with NaN weights, one
    /// with a part missing.
    #[test]
    fn what_is_not_a_tdmpc2_model_is_not_imported() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.safetensors");
        let parts = PARTS;
        for (name, object, why) in [
            (
                "tensor",
                "torch.zeros(3)".to_string(),
                "it holds a Tensor, not a state dict",
            ),
            (
                "other",
                "{'model': {'a': torch.zeros(2)}}".to_string(),
                "not a TD-MPC2 state dict: it has no `_encoder` tensors (1 tensors read)",
            ),
            (
                "nan",
                format!(
                    "{{'model': {{k: torch.full((2, 2), float('nan') if k.startswith('_pi') \
                     else 0.5) for k in {parts}}}}}"
                ),
                "`_pi.0.weight` holds NaN or infinite values",
            ),
            (
                "extra",
                format!(
                    "{{'model': {{**{{k: torch.zeros(2) for k in {parts}}}, \
                     'extra.weight': torch.zeros(2)}}}}"
                ),
                "`extra.weight` is no part of a TD-MPC2 model",
            ),
            (
                "twice",
                format!(
                    "{{'model': {{**{{k: torch.zeros(2) for k in {parts}}}, \
                     'module._pi.0.weight': torch.ones(2)}}}}"
                ),
                "`_pi.0.weight` and `module._pi.0.weight` are both the model's `_pi.0.weight`, \
                 with other values",
            ),
            (
                "incomplete",
                format!(
                    "{{'model': {{**{{k: torch.zeros(2, 2) for k in {parts}}}, \
                     **{{k.replace('weight', 'bias'): torch.zeros(2) for k in {parts} \
                     if not k.startswith('_dynamics')}}}}}}"
                ),
                "an incomplete or damaged TD-MPC2 state dict: `_dynamics.0.bias` is missing \
                 beside `_dynamics.0.weight`",
            ),
            (
                "complex",
                format!(
                    "{{'model': {{k: torch.zeros(2, dtype=torch.complex64) for k in {parts}}}}}"
                ),
                "holds complex numbers",
            ),
        ] {
            let pt = dir.path().join(format!("{name}.pt"));
            let code = format!(
                "import torch\ntorch.save({object}, {:?})\n",
                pt.to_string_lossy()
            );
            run_python(&code);
            let e = import_official(&pt, &out).unwrap_err();
            assert!(matches!(e, Error::Unreadable { .. }), "{name}: {e:?}");
            assert!(e.to_string().contains(why), "{name}: {e}");
            assert!(!out.exists(), "{name}");
        }
    }

    /// The file written first and renamed is this process's own: a file of that kind of name
    /// already there is kept, and none is left behind.
    #[test]
    fn an_import_writes_over_no_other_file_on_its_way() {
        let dir = tempfile::tempdir().unwrap();
        let pt = dir.path().join("agent.pt");
        let code = format!(
            "import torch\ntorch.save({{'model': {}}}, {:?})\n",
            whole_model(),
            pt.to_string_lossy()
        );
        run_python(&code);
        let out = dir.path().join("out.safetensors");
        let bystanders = [
            dir.path().join("out.safetensors.tmp"),
            dir.path()
                .join(format!(".out.safetensors.{}-0.partial", std::process::id())),
        ];
        for file in &bystanders {
            std::fs::write(file, "keep me").unwrap();
        }
        import_official(&pt, &out).unwrap();
        for file in &bystanders {
            assert_eq!(std::fs::read_to_string(file).unwrap(), "keep me");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 4);
    }

    /// Export refuses what import would: here a model with a layer's bias missing.
    #[test]
    fn an_incomplete_model_is_not_exported() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.safetensors");
        let mut named = Vec::new();
        for stack in [
            "_encoder.state",
            DYNAMICS,
            REWARD,
            POLICY,
            Q_ONLINE,
            Q_TARGET,
        ] {
            let lead: &[i64] = if stack.starts_with("_Q") || stack.starts_with("_target") {
                &[2]
            } else {
                &[]
            };
            let zeros = |dims: &[i64]| {
                Tensor::zeros([lead, dims].concat(), (Kind::Float, tch::Device::Cpu))
            };
            named.push((format!("{stack}.0.weight"), zeros(&[2, 2])));
            if stack != REWARD {
                named.push((format!("{stack}.0.bias"), zeros(&[2])));
            }
        }
        Tensor::write_safetensors(&named, &model).unwrap();
        let out = dir.path().join("agent.pt");
        let e = export_official(&model, &out).unwrap_err();
        assert!(
            e.to_string()
                .contains("`_reward.0.bias` is missing beside `_reward.0.weight`"),
            "{e}"
        );
        assert!(!out.exists());
    }

    #[test]
    fn export_to_a_directory_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let e = export_official(&dir.path().join("model.safetensors"), dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a directory; give the file to write"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn an_output_named_for_the_other_format_is_refused_before_anything_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nothing-here");
        let pt = dir.path().join("agent.pt");
        let e = export_official(&missing, &dir.path().join("agent.safetensors"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("agent.safetensors: named .safetensors, but export writes torch's format"),
            "{e}"
        );
        let e = import_official(&missing, &pt).unwrap_err().to_string();
        assert!(
            e.contains("agent.pt: named .pt, but import writes safetensors"),
            "{e}"
        );
        for name in ["agent.PTH", "agent.Pt"] {
            let e = import_official(&missing, &dir.path().join(name))
                .unwrap_err()
                .to_string();
            assert!(e.contains("but import writes safetensors"), "{name}: {e}");
        }
        let e = export_official(&missing, &dir.path().join("a.SafeTensors"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("but export writes torch's format"), "{e}");
        let nowhere = dir.path().join("no-folder/agent.pt");
        let e = export_official(&missing, &nowhere).unwrap_err().to_string();
        assert!(e.contains("no-folder does not exist"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// Neither replaces a file: a checkpoint's own meta.json or model, the run's config.
    #[test]
    fn an_existing_output_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nothing-here");
        let kept = dir.path().join("meta.json");
        std::fs::write(&kept, "{}").unwrap();
        for e in [
            export_official(&missing, &kept).unwrap_err(),
            import_official(&missing, &kept).unwrap_err(),
        ] {
            assert!(matches!(e, Error::Output { .. }), "bad input: {e}");
            assert!(e.to_string().contains("meta.json: exists"), "{e}");
        }
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "{}");
    }

    #[test]
    fn keys_are_converted_or_dropped() {
        assert_eq!(
            convert_key("_Qs.params.0.weight").as_deref(),
            Some("_Qs.params.0.weight")
        );
        assert_eq!(
            convert_key("module._pi.2.bias").as_deref(),
            Some("_pi.2.bias")
        );
        assert_eq!(convert_key("_Qs.params.__batch_size"), None);
        assert_eq!(convert_key("_target_Qs_params.__device"), None);
        assert_eq!(convert_key("_detach_Qs_params.1.weight"), None);
        assert_eq!(
            convert_key("_Qs.params.6").as_deref(),
            Some("_Qs.params.1.ln.weight")
        );
        assert_eq!(
            convert_key("_target_Qs.params.9").as_deref(),
            Some("_target_Qs_params.2.bias")
        );
        // Late 2024: both ensembles saved twice; April 2025: the termination head's name.
        assert_eq!(convert_key("_detach_Qs.params.0.weight"), None);
        assert_eq!(
            convert_key("_target_Qs.params.1.ln.bias").as_deref(),
            Some("_target_Qs_params.1.ln.bias")
        );
        assert_eq!(
            convert_key("_terminated.2.weight").as_deref(),
            Some("_termination.2.weight")
        );
    }

    #[test]
    fn q_names_go_back_to_the_2023_layout() {
        assert_eq!(legacy_q_name("_Qs.params.0.weight"), "_Qs.params.0");
        assert_eq!(legacy_q_name("_Qs.params.1.ln.weight"), "_Qs.params.6");
        assert_eq!(
            legacy_q_name("_target_Qs_params.2.bias"),
            "_target_Qs.params.9"
        );
        assert_eq!(legacy_q_name("_pi.0.weight"), "_pi.0.weight");
        for name in ["_Qs.params.9", "_Qs.params.6", "_target_Qs.params.9"] {
            assert_eq!(legacy_q_name(&convert_key(name).unwrap()), name);
        }
    }
}
