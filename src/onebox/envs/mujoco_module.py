"""`onebox._mujoco`, the native MuJoCo envs: loading it, the libmujoco it runs on, and why it is
missing when it is.

The module is built against the `mujoco` package of the build environment (the version pinned in
pyproject.toml's build-system.requires) and onebox ships that libmujoco next to it, so the envs
work with any `mujoco` package installed at run time, or none: the physics is always the bundled
version's. A `mujoco` package of another version loads its own libmujoco (another soname) beside it.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import os
from types import ModuleType


@functools.cache
def _load() -> tuple[ModuleType | None, str | None]:
    if importlib.util.find_spec("onebox._mujoco") is None:
        return None, (
            "onebox was built without its MuJoCo module (the build found no `mujoco` package); "
            "reinstall onebox with `pip install .`, which builds against the pinned mujoco"
        )
    try:
        return importlib.import_module("onebox._mujoco"), None
    except ImportError as e:
        return None, f"the native MuJoCo module failed to load: {e}; reinstall onebox"


def mujoco_module() -> ModuleType | None:
    """`onebox._mujoco`, or None if it is missing or cannot load (`mujoco_unavailable` says why)."""
    return _load()[0]


def mujoco_unavailable() -> str | None:
    """Why the native MuJoCo envs are unavailable, or None when they are available."""
    return _load()[1]


def is_mujoco_v5(env_id: str) -> bool:
    """Whether `env_id` is one of Gymnasium's v5 MuJoCo envs: those `onebox._mujoco` implements
    (the tests check that the two lists agree)."""
    import gymnasium

    spec = gymnasium.registry.get(env_id)
    return (
        spec is not None
        and spec.version == 5
        and isinstance(spec.entry_point, str)
        and spec.entry_point.startswith("gymnasium.envs.mujoco")
    )


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


@functools.cache
def mujoco_library() -> tuple[str, str]:
    """(version, path) of the libmujoco that `onebox._mujoco` runs on.

    Normally the one shipped in onebox's package. (A `mujoco` package of the very same version,
    imported first, may provide it instead: the loader shares a soname that is already loaded.)
    """
    module = mujoco_module()
    if module is None:
        raise RuntimeError(f"no native MuJoCo envs: {mujoco_unavailable()}")
    # The module is loaded: this gets its handle. Symbols looked up through it resolve in the
    # module and its dependencies, i.e. in the libmujoco it was linked to.
    handle = ctypes.CDLL(module.__file__, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    version_string = handle.mj_versionString
    version_string.restype = ctypes.c_char_p
    info = _DlInfo()
    libdl = ctypes.CDLL("libdl.so.2")  # glibc's dladdr: in libdl, or in libc, which libdl loads
    if not libdl.dladdr(ctypes.cast(version_string, ctypes.c_void_p), ctypes.byref(info)):
        raise RuntimeError("dladdr found no library for mj_versionString")
    return version_string().decode(), os.path.realpath(info.dli_fname.decode())
