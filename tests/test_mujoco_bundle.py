"""onebox ships the libmujoco it was built against: the native MuJoCo envs run on it whatever
`mujoco` package is installed (the newest in CI) or imported first, or none; a broken install
falls back to worker processes with a warning, and `onebox envs` says why.

Each case runs in a fresh interpreter, since a process loads a shared library only once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import onebox.envs
from onebox.envs.mujoco_module import is_mujoco_v5, mujoco_library, mujoco_module

MODULE = mujoco_module()
pytestmark = pytest.mark.skipif(MODULE is None, reason="onebox was built without MuJoCo")

# Steps HalfCheetah with fixed actions and prints the library and a digest of the trajectory.
# `BEFORE`/`AFTER` is what the script does with the `mujoco` package around that.
SCRIPT = """
import json, sys
import numpy as np
BEFORE
import onebox.envs
from onebox.envs.mujoco_module import mujoco_library
pool = onebox.envs.make("HalfCheetah-v5", num_envs=3, seed=7)
obs, _ = pool.reset()
total = obs.sum()
rng = np.random.default_rng(0)
for _ in range(200):
    obs, rew, *_ = pool.step(rng.uniform(-1, 1, (3, 6)).astype(np.float32))
    total += obs.sum() + rew.sum()
pool.close()
AFTER
version, path = mujoco_library()
print(json.dumps({"pool": type(pool).__name__, "version": version, "path": path,
                  "total": float(total), "mujoco": MUJOCO}))
"""

IMPORT_MUJOCO = "import mujoco; MUJOCO = mujoco.__version__"
# The mujoco package, used after onebox's envs stepped: its own physics on its own library.
USE_MUJOCO_AFTER = """
import mujoco, gymnasium
env = gymnasium.make("HalfCheetah-v5").unwrapped
env.reset(seed=0)
env.step(np.zeros(6, np.float32))
MUJOCO = mujoco.__version__
"""
NO_MUJOCO = "sys.modules['mujoco'] = None; MUJOCO = None  # as if not installed"


def run_script(before: str, after: str = "") -> dict:
    code = SCRIPT.replace("BEFORE", before).replace("AFTER", after)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bundled_library() -> Path:
    """The libmujoco shipped next to onebox._mujoco."""
    (lib,) = Path(MODULE.__file__).parent.glob("libmujoco.so.*")
    return lib


def test_halfcheetah_is_native_on_the_bundled_library() -> None:
    choice = onebox.envs.choose_backend("HalfCheetah-v5")
    lib = bundled_library()
    version, _ = mujoco_library()
    assert lib.name == f"libmujoco.so.{version}"
    assert (choice.backend, choice.fallback) == ("native", False)
    assert choice.why == f"native C++ (MuJoCo {version}, bundled)"


def test_same_physics_whatever_mujoco_package_is_loaded() -> None:
    """Without the package, with it imported first, or used after onebox: the bundled library
    (or, only for the very same version imported first, the package's identical copy) runs the
    envs, and the trajectories agree to the last bit."""
    lib = str(bundled_library().resolve())
    alone = run_script(NO_MUJOCO)
    first = run_script(IMPORT_MUJOCO)
    after = run_script("", USE_MUJOCO_AFTER)
    assert alone["mujoco"] is None
    bundled_version = alone["version"]
    for result in (alone, first, after):
        assert result["pool"] == "NativeEnvPool"
        assert result["version"] == bundled_version
        assert result["total"] == alone["total"]
    assert alone["path"] == lib and after["path"] == lib
    if first["mujoco"] != bundled_version:  # another version: another soname, loaded beside
        assert first["path"] == lib


def test_native_mujoco_ids_are_gymnasiums_v5_mujoco_envs() -> None:
    """`is_mujoco_v5` tells a failed load which ids would have been native."""
    import gymnasium

    assert sorted(MODULE.list_envs()) == sorted(i for i in gymnasium.registry if is_mujoco_v5(i))


def broken_install(tmp_path: Path) -> dict[str, str]:
    """A copy of onebox without its libmujoco, first on the path of an interpreter started
    without site (so no editable-install hook), with this interpreter's path after it."""
    import onebox

    dst = tmp_path / "onebox"
    shutil.copytree(
        Path(onebox.__file__).parent,
        dst,
        ignore=shutil.ignore_patterns("libmujoco.so*", "__pycache__"),
    )
    for ext in Path(onebox._engine.__file__).parent.glob("_*.so"):
        shutil.copy(ext, dst)
    paths = [str(tmp_path), *(p for p in sys.path if p)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "COLUMNS": "1000"}


def test_broken_install_warns_and_envs_says_why(tmp_path: Path) -> None:
    code = """
import warnings
import onebox.envs
from onebox import cli
warnings.simplefilter("error", onebox.envs.BackendFallbackWarning)
try:
    onebox.envs.make("HalfCheetah-v5")
except onebox.envs.BackendFallbackWarning as w:
    print("WARNING:", w)
cli.main(["envs", "--match", "HalfCheetah-v5"])
"""
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        env=broken_install(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    warning = next(line for line in out.splitlines() if line.startswith("WARNING:"))
    assert "HalfCheetah-v5 runs in the process backend" in warning
    assert "native MuJoCo module failed to load" in warning and "libmujoco.so" in warning
    assert "reinstall onebox" in warning and "backend='process'" in warning
    row = next(line for line in out.splitlines() if "HalfCheetah-v5" in line and "│" in line)
    cells = [c.strip() for c in row.split("│")]
    assert cells[2] == "process"
    assert re.match(r"process: the native MuJoCo module failed to load: .*libmujoco", cells[3])
