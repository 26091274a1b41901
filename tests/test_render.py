"""Frames of native envs: classic control drawn with numpy as Gymnasium draws it with pygame, and
videos from `onebox eval --video` with nothing beyond onebox's own dependencies; MuJoCo frames
through the `mujoco` package's OpenGL, with an error naming only what MuJoCo needs without it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest

import onebox.envs
from onebox import cli
from onebox.envs.mujoco_module import mujoco_module
from onebox.envs.render import CLASSIC


@pytest.mark.parametrize("env_id", sorted(CLASSIC))
def test_classic_frames_look_like_gymnasiums(env_id: str) -> None:
    """Same picture as Gymnasium's pygame renderer of the same state, up to anti-aliasing at the
    edges (Pendulum's torque arrow left out: no action has been taken)."""
    pytest.importorskip("pygame")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    reference = gymnasium.make(env_id, render_mode="rgb_array").unwrapped
    reference.reset(seed=0)  # no action yet: Pendulum draws no torque arrow
    pool = onebox.envs.make(env_id, num_envs=3, seed=3, render_mode="rgb_array")
    pool.reset()
    for _ in range(15):
        pool.step(pool.action_space.sample())
    frames = pool.render()
    assert len(frames) == 3
    for i, frame in enumerate(frames):
        reference.state = pool.get_state(i)
        expected = reference.render()
        assert frame.dtype == np.uint8 and frame.shape == expected.shape
        diff = np.abs(frame.astype(int) - expected.astype(int)).max(axis=-1)
        assert (diff > 64).mean() < 0.01  # edge pixels only
        drawn = (expected < 250).any(axis=-1)  # what Gymnasium drew, not background
        assert ((frame < 250).any(axis=-1) == drawn).mean() > 0.99
    pool.close()


def test_eval_video_of_a_cartpole_run_without_pygame(tmp_path: Path) -> None:
    """`onebox eval --video` plays the policy and records its first episode, with only what
    `pip install .` installs: pygame is not needed (blocked here)."""
    assert cli.main(["train", "ppo", "--env", "CartPole-v1", "--total-steps", "512",
                     "--runs-dir", str(tmp_path), "--name", "run"]) == 0  # fmt: skip
    run_dir = tmp_path / "run"
    code = (
        "import sys; sys.modules['pygame'] = None  # as if not installed\n"
        "from onebox import cli\n"
        f"sys.exit(cli.main(['eval', {str(run_dir)!r}, '--episodes', '1', '--video']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "CartPole-v1: 1 episodes" in out.stdout and "video:" in out.stdout
    length = float(re.search(r"length ([\d.]+)", out.stdout).group(1))
    import imageio.v3 as iio

    frames = iio.imread(run_dir / "videos" / "eval.mp4")
    assert frames.shape == (int(length), 400, 600, 3)  # one frame per step of the episode
    assert frames.std() > 10  # not blank: the cart and the pole


MUJOCO_RENDER = """
import sys
BLOCK
import onebox.envs
pool = onebox.envs.make("HalfCheetah-v5", num_envs=2, render_mode="rgb_array")
pool.reset(seed=0)
try:
    frames = pool.render()
except RuntimeError as e:
    print("ERROR:", e)
else:
    print("FRAMES:", [f.shape for f in frames], float(frames[0].std()))
"""


def render_mujoco(gl: str, block: str = "") -> str:
    """Render HalfCheetah in a fresh interpreter (mujoco reads MUJOCO_GL once, at import)."""
    out = subprocess.run(
        [sys.executable, "-c", MUJOCO_RENDER.replace("BLOCK", block)],
        env={**os.environ, "MUJOCO_GL": gl},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


needs_mujoco = pytest.mark.skipif(
    mujoco_module() is None or importlib.util.find_spec("mujoco") is None,
    reason="needs onebox's MuJoCo envs and the mujoco package",
)


@needs_mujoco
def test_eval_video_without_opengl_names_only_mujocos_needs(tmp_path: Path) -> None:
    """`onebox eval --video` of a MuJoCo run where MuJoCo has no OpenGL backend (MUJOCO_GL names
    none that exists): an error naming what MuJoCo's rendering needs, no traceback."""
    assert cli.main(["train", "ppo", "--env", "InvertedPendulum-v5", "--total-steps", "64",
                     "--num-steps", "32", "--num-envs", "2", "--runs-dir", str(tmp_path),
                     "--name", "run"]) == 0  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "onebox", "eval", str(tmp_path / "run"), "--video"],
        env={**os.environ, "MUJOCO_GL": "bogus"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("onebox: error: InvertedPendulum-v5 cannot render")
    assert "MUJOCO_GL=egl" in out.stderr and "MUJOCO_GL=osmesa" in out.stderr
    assert "libosmesa6" in out.stderr and "pygame" not in out.stderr
    assert not (tmp_path / "run" / "videos").exists()


@pytest.mark.skipif(mujoco_module() is None, reason="onebox was built without MuJoCo")
def test_mujoco_without_the_package_says_to_install_it() -> None:
    out = render_mujoco("egl", block="sys.modules['mujoco'] = None  # as if not installed")
    assert out.startswith("ERROR: HalfCheetah-v5 videos need the `mujoco` package")
    assert 'pip install "onebox[mujoco]"' in out and "pygame" not in out


@needs_mujoco
def test_mujoco_frames_where_egl_works() -> None:
    out = render_mujoco("egl")
    if out.startswith("ERROR:"):
        pytest.skip(f"no EGL on this machine: {out.strip()}")
    assert out.startswith("FRAMES: [(480, 480, 3), (480, 480, 3)]")
    assert float(out.split()[-1]) > 5  # not blank
