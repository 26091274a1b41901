"""The run folder `runs/<name>/` and its resolved config, `config.json`.

The config is stored as `{"type": "module:QualName", "config": {...}}`: fields by name, tuples as
lists, paths as strings. `load_config` rebuilds it from the dataclass's type hints, so nested
dataclasses, tuples, `Path`, `Literal` and `X | None` fields come back as they were.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import enum
import importlib
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"


def new_run_dir(
    root: str | Path = "runs",
    name: str | None = None,
    *,
    env_id: str,
    algo: str,
    seed: int,
) -> Path:
    """Create and return the run folder `root/name`.

    `name` defaults to `"{env_id}__{algo}__{seed}__{YYYYmmdd-HHMMSS}"` (with `/` in the env id
    replaced by `_`). An existing empty folder is reused; a non-empty one raises `FileExistsError`.
    """
    if name is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        name = f"{env_id.replace('/', '_')}__{algo}__{seed}__{stamp}"
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise ValueError(f"run name {name!r} is not a folder name: use letters, digits, -_.")
    path = Path(root) / name
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a folder: choose another --name")
    if path.is_dir() and any(path.iterdir()):
        raise FileExistsError(
            f"run folder {path} already exists and is not empty: use --resume to continue that "
            "run, or another --name to start a new one"
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_config(run_dir: Path, config: Any) -> Path:
    """Write the config dataclass `config` to `run_dir/"config.json"` (atomically); return the path."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"save_config needs a dataclass instance, got {type(config).__name__}")
    cls = type(config)
    doc = {"type": f"{cls.__module__}:{cls.__qualname__}", "config": _encode(config, "config")}
    path = Path(run_dir) / CONFIG_FILE
    tmp = path.with_name(f".{CONFIG_FILE}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def load_config(run_dir: Path, cls: type | None = None) -> Any:
    """Rebuild the config saved by `save_config` in `run_dir`.

    `cls` defaults to the type stored in the file. A stored field the class no longer has raises
    `ValueError`; fields added to the class since take their defaults.
    """
    path = Path(run_dir) / CONFIG_FILE
    stored_type, data = _read(run_dir)
    if cls is None:
        cls = _import_type(stored_type, path)
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"load_config needs a dataclass type, got {cls!r}")
    try:
        return _decode(data, cls, "config", path)
    except TypeError as e:  # a value of the wrong type: the file's fault, not the caller's
        raise ValueError(str(e)) from None


def as_field_type(value: Any, hint: Any, name: str, where: str) -> Any:
    """`value` as a config field `name` of type `hint` holds it after a trip through
    `config.json` (ints for floats, tuples for lists, ...); TypeError, its message starting with
    `where`, if it is not of that type."""
    try:
        data = _encode(value, name)
    except TypeError as e:
        raise TypeError(f"{where}: {e}") from None
    try:
        return _decode(data, hint, name, where)  # type: ignore[arg-type]
    except ValueError as e:
        raise TypeError(str(e)) from None


def config_type(run_dir: Path) -> str:
    """The config type `run_dir/"config.json"` names, as "module:QualName" (nothing imported)."""
    return _read(run_dir)[0]


def _read(run_dir: Path) -> tuple[str, Any]:
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        what = "does not exist" if not Path(run_dir).exists() else f"has no {CONFIG_FILE}"
        raise FileNotFoundError(f"{run_dir} is not a onebox run folder: it {what}")
    try:
        doc = json.loads(path.read_text())
        stored_type, data = doc["type"], doc["config"]
        if not isinstance(stored_type, str) or not isinstance(data, dict):
            raise TypeError("type must be a string and config an object")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a onebox config file ({e})") from None
    return stored_type, data


# ---- encoding ----------------------------------------------------------------------------------


def _encode(value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _encode(getattr(value, f.name), f"{where}.{f.name}")
            for f in dataclasses.fields(value)
            if f.init
        }
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return _encode(value.value, where)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{where}: only dicts with str keys can be saved in a config")
        return {k: _encode(v, f"{where}.{k}") for k, v in value.items()}
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalars
        return value.item()
    raise TypeError(f"{where}: cannot save a {type(value).__name__} in a config")


# ---- decoding ----------------------------------------------------------------------------------


def _import_type(target: str, path: Path) -> type:
    module_name, _, qualname = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(
            f"{path}: config type {target!r} cannot be imported ({e}); pass cls= to load_config"
        ) from e
    return obj


def _decode(data: Any, hint: Any, where: str, path: Path) -> Any:
    if dataclasses.is_dataclass(hint):
        return _decode_dataclass(data, hint, where, path)
    if hint is Any:
        return data
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if data is None and type(None) in args:
            return None
        errors = []
        for option in args:
            if option is type(None):
                continue
            try:
                return _decode(data, option, where, path)
            except (TypeError, ValueError) as e:
                errors.append(str(e))
        raise ValueError(f"{path}: {where}={data!r} matches none of {hint}: {'; '.join(errors)}")
    if origin is typing.Literal:
        if data not in args:
            raise ValueError(f"{path}: {where}={data!r} is not one of {args}")
        return data
    if origin is tuple:
        _expect(data, list, where, path)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(v, args[0], f"{where}[{i}]", path) for i, v in enumerate(data))
        if args and args != ((),) and len(args) != len(data):
            raise ValueError(
                f"{path}: {where} has {len(data)} items, its type {hint} wants {len(args)}"
            )
        if not args or args == ((),):
            return tuple(data)
        return tuple(
            _decode(v, a, f"{where}[{i}]", path)
            for i, (v, a) in enumerate(zip(data, args, strict=True))
        )
    if origin in (list, set, frozenset, collections.abc.Sequence):
        _expect(data, list, where, path)
        item = args[0] if args else Any
        items = [_decode(v, item, f"{where}[{i}]", path) for i, v in enumerate(data)]
        return items if origin not in (set, frozenset) else origin(items)
    if origin in (dict, collections.abc.Mapping):
        _expect(data, dict, where, path)
        value_hint = args[1] if len(args) == 2 else Any
        return {k: _decode(v, value_hint, f"{where}.{k}", path) for k, v in data.items()}
    if hint in (tuple, list, dict):
        _expect(data, dict if hint is dict else list, where, path)
        return hint(data)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(data)
    if isinstance(hint, type) and issubclass(hint, Path):
        _expect(data, str, where, path)
        return hint(data)
    if hint is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise TypeError(f"{path}: {where}={data!r} is not a float")
        return float(data)
    if hint is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise TypeError(f"{path}: {where}={data!r} is not an int")
        return data
    if hint in (bool, str, type(None)):
        _expect(data, hint, where, path)
        return data
    return data  # an annotation we do not interpret: keep the JSON value


def _decode_dataclass(data: Any, cls: type, where: str, path: Path) -> Any:
    _expect(data, dict, where, path)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(
            f"{path}: {where} has field(s) {', '.join(unknown)} that {cls.__qualname__} no longer "
            "has; edit config.json or load it with the version of onebox that wrote it"
        )
    kwargs = {k: _decode(v, hints[k], f"{where}.{k}", path) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"{path}: cannot rebuild {where} as {cls.__qualname__}: {e}") from e


def _expect(data: Any, kind: type, where: str, path: Path) -> None:
    if not isinstance(data, kind):
        raise TypeError(f"{path}: {where}={data!r} is not a {kind.__name__}")
