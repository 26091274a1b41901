"""Build the wheelhouse that `benchmarks/gpu.sh` installs from on a GPU machine with no package
index (this workplace's lent machines: Python 3.12 with torch, nanobind, scikit-build-core, cmake
and ninja, no network). Run it here, where pip reaches PyPI:

    python benchmarks/gpu_wheelhouse.py .whl          # 8 MB; then carry `.whl` to the machine

It downloads, for CPython 3.12 on manylinux x86-64 and without their dependencies (the machine has
numpy, torch, rich, tensorboard, matplotlib, imageio, absl-py, typing-extensions), the packages
onebox and its benchmarks need that the machine lacks: gymnasium, tyro and theirs, ale-py (the
Atari envs), EnvPool 1.2.5 (the peer of the env benchmark) with optree and dm-env, and the
scikit-build-core and nanobind that build onebox there. With `--build-python` (a Python 3.12 here
with scikit-build-core, nanobind, cmake and ninja; without mujoco, so no MuJoCo envs) it also
builds onebox's own wheel from this tree, which gpu.sh installs only if building the
tree there fails (saying so in the report); ONEBOX_COMMIT records the tree's commit.
EnvPool's wheel is 50 MB of env families, more than a machine call carries; it is rebuilt here
holding its Python API and its Atari envs alone, with Pong's ROM taken from ale-py's wheel (the
same ROM file). `--python-version 3.11` builds the same for this machine's Python, to check it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGES = [
    "gymnasium==1.4.0", "farama-notifications==0.0.6", "tyro==1.0.17", "docstring-parser==0.18.0",
    "typeguard==4.6.1", "ale-py==0.12.1", "optree==0.20.0", "dm-env==1.6", "envpool==1.2.5",
    "scikit-build-core==1.1.2", "nanobind==3.1.0",
]  # fmt: skip
"""What gpu.sh installs besides onebox itself, pinned to versions checked together here."""

PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_28_x86_64"]  # fmt: skip

ENVPOOL_KEEP = ("envpool/__init__.py", "envpool/entry.py", "envpool/registration.py",
                "envpool/py.typed", "envpool/python/", "envpool/atari/", "envpool-1.2.5.dist-info/")  # fmt: skip
"""What the rebuilt EnvPool wheel keeps: the API and the Atari family."""


def download(folder: Path, python_version: str) -> None:
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", python_version, "--implementation", "cp", "-d", str(folder)]  # fmt: skip
    for platform in PLATFORMS:
        args += ["--platform", platform]
    subprocess.run([*args, *PACKAGES], check=True)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def trim_envpool(folder: Path) -> Path:
    """Rewrite EnvPool's wheel in `folder` to keep `ENVPOOL_KEEP`, register the Atari envs only,
    and hold Pong's ROM (from ale-py's wheel beside it)."""
    (wheel,) = folder.glob("envpool-1.2.5-*.whl")
    (ale,) = folder.glob("ale_py-*.whl")
    with zipfile.ZipFile(ale) as z:
        rom = z.read("ale_py/roms/pong.bin")
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(ENVPOOL_KEEP) and not name.endswith("/RECORD"):
                files[name] = z.read(name)
    info = next(n for n in files if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
    files["envpool/entry.py"] = b'"""Atari only: the rest was left out of this build."""\n\n'
    files["envpool/entry.py"] += b"import envpool.atari.registration  # noqa: F401\n"
    files["envpool/atari/roms/pong.bin"] = rom  # found there by envpool.registration
    meta = files[f"{info}/METADATA"].decode().splitlines()
    keep = [line for line in meta if not line.startswith("Requires-Dist:")]
    keep += ["Requires-Dist: dm-env", "Requires-Dist: optree", "Requires-Dist: gymnasium"]
    files[f"{info}/METADATA"] = ("\n".join(keep) + "\n").encode()
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel.unlink()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where the wheels go (e.g. .whl)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's (3.12)")
    parser.add_argument("--build-python", help="a Python of that version to build onebox's wheel")
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    for old in args.folder.glob("*.whl"):
        old.unlink()
    download(args.folder, args.python_version)
    trim_envpool(args.folder)
    if args.build_python:
        root = Path(__file__).resolve().parent.parent
        subprocess.run([args.build_python, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(args.folder), str(root)], check=True)  # fmt: skip
        commit = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                                capture_output=True, text=True).stdout.strip()  # fmt: skip
        (args.folder / "ONEBOX_COMMIT").write_text(f"commit {commit or 'unknown'}\n")
    total = sum(p.stat().st_size for p in args.folder.glob("*.whl"))
    print(f"{args.folder}: {len(list(args.folder.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
