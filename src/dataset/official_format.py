"""The official dataset files (`chunk_{i}.pt`: a TensorDict of shape [episodes, T] saved with
torch.save), read without running pickled code and written with tensordict.

`index(path)` unpickles the file's `data.pkl` with an unpickler that knows only a few names
(tensor rebuilds, storage types, TensorDict reconstruction, OrderedDict, torch.Size) and turns
each into inert data; any other name is refused. It returns, per tensor, where its bytes lie in
the file, so that the trainer reads rows straight from disk.
"""
import _compat_pickle
import collections
import json
import pickle
import struct
import zipfile

_DTYPES = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
}
_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
          "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


class _StorageType:
    def __init__(self, dtype):
        self.dtype = dtype


class _Storage:
    def __init__(self, key, dtype):
        self.key = key
        self.dtype = dtype


class _Tensor(dict):
    """A tensor's description: dtype, shape, stride, offset (elements) and its storage key."""


def _rebuild_tensor(storage, offset, size, stride, *_rest):
    return _Tensor(key=storage.key, dtype=storage.dtype, shape=list(size), stride=list(stride),
                   offset=offset)


def _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype, *_rest):
    return _rebuild_tensor(storage, offset, size, stride)


def _rebuild_from_type(func, new_type, args, state):
    return func(*args)


class _TensorDict(dict):
    """A TensorDict's entries (nested ones as nested dicts) and its batch size."""

    def __setstate__(self, state):
        # Versions that pickle the object's __dict__, or (with __slots__) a pair of the
        # __dict__ and the slots' values.
        if isinstance(state, tuple) and len(state) == 2:
            state = {**(state[0] or {}), **(state[1] or {})}
        entries = _entries(state)
        self.update(entries)
        self.batch_size = entries.batch_size


def _entries(state):
    entries = state.get("_tensordict", state.get("_dict_meta", {})) if isinstance(state, dict) else {}
    td = _TensorDict(entries)
    td.batch_size = list(state.get("_batch_size", [])) if isinstance(state, dict) else []
    return td


def _make_td(cls, state):
    return _entries(state)


def _size(*args):
    return tuple(*args) if args else ()


_ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type,
    ("torch", "Tensor"): object,
    ("torch", "Size"): _size,
    ("torch", "device"): str,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("tensordict._reductions", "_make_td"): _make_td,
    ("tensordict._td", "TensorDict"): _TensorDict,
    ("tensordict.tensordict", "TensorDict"): _TensorDict,
    ("copyreg", "_reconstructor"): lambda cls, base, state: cls(),
    ("builtins", "object"): object,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    # tensordict from mid-2023 to mid-2024 (the official datasets' time) kept a TensorDict's
    # entries in a dict subclass of its own.
    ("tensordict.utils", "_StringOnlyDict"): dict,
}
for _name, _dtype in _DTYPES.items():
    _ALLOWED[("torch", _name)] = _StorageType(_dtype)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        # Protocols 0-2 (torch.save's default is 2) name Python 2's modules
        # (`__builtin__.set`): mapped as pickle's own find_class maps them, then checked.
        if (module, name) not in _ALLOWED:
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"{module}.{name} is not something a dataset file holds: refused "
                "(only tensors and TensorDicts are read, no pickled code runs)") from None

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        kind = pid[1]
        dtype = kind.dtype if isinstance(kind, _StorageType) else None
        return _Storage(str(pid[2]), dtype)


def _data_offset(raw, info):
    """Where a stored (uncompressed) zip member's bytes start in the file."""
    raw.seek(info.header_offset)
    header = raw.read(30)
    if header[:4] != b"PK\x03\x04":
        raise ValueError(f"{info.filename}: bad zip local header")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _flatten(mapping, prefix, out):
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, _Tensor):
            out[name] = value
        elif isinstance(value, dict):
            _flatten(value, name + ".", out)


def index(path):
    """JSON: {"batch_size": [...], "tensors": {name: {dtype, shape, stride, offset (elements),
    file_offset (bytes of the storage's start), nbytes (of the storage)}}}."""
    with zipfile.ZipFile(path) as archive, open(path, "rb") as raw:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pickles) != 1:
            raise ValueError("not a torch.save file (no data.pkl)")
        prefix = pickles[0][: -len("data.pkl")]
        with archive.open(pickles[0]) as f:
            root = _Unpickler(f).load()
        if not isinstance(root, dict):
            raise ValueError(f"holds a {type(root).__name__}, not a TensorDict of episodes")
        if not isinstance(root, _TensorDict):
            keys = ", ".join(map(str, list(root)[:5]))
            raise ValueError(f"holds a plain mapping ({keys}), not a TensorDict of episodes "
                             "(a checkpoint's weights?)")
        tensors = {}
        _flatten(root, "", tensors)
        # A tensor stored under two names is one description: each name gets its own.
        tensors = {name: dict(t) for name, t in tensors.items()}
        for name, t in tensors.items():
            if t["dtype"] is None:
                raise ValueError(f"{name}: storage of unknown dtype")
            info = archive.getinfo(f"{prefix}data/{t['key']}")
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{name}: compressed inside the file; torch.save never compresses")
            t["file_offset"] = _data_offset(raw, info)
            t["nbytes"] = info.file_size
            t["item_size"] = _SIZES[t["dtype"]]
            del t["key"]
        batch = getattr(root, "batch_size", [])
        return json.dumps({"batch_size": list(batch), "tensors": tensors})


def write_chunk(path, episodes, length, obs, obs_dim, action, action_dim, reward, task):
    """Saves one chunk as the official files are: a TensorDict of shape [episodes, T]. The
    arrays come as little-endian bytes (float32, task ids int64), row after row."""
    import numpy as np
    import torch
    from tensordict import TensorDict

    def array(data, dtype, *shape):
        return torch.from_numpy(np.frombuffer(data, dtype=dtype).reshape(episodes, length, *shape).copy())

    td = TensorDict({
        "obs": array(obs, "<f4", obs_dim),
        "action": array(action, "<f4", action_dim),
        "reward": array(reward, "<f4"),
        "task": array(task, "<i8"),
    }, batch_size=[episodes, length])
    import os
    # Through a file object: torch's own path handling takes only UTF-8 names.
    path = os.fspath(path)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "wb") as out:
        torch.save(td, out)
    os.replace(partial, path)
