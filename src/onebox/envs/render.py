"""Frames of native envs, for `NativeEnvPool.render()`, drawn from each env's state.

Classic control is drawn here with numpy, as Gymnasium draws it with pygame (same sizes, shapes,
colors and anti-aliased edges; Pendulum without its torque arrow), so videos need nothing beyond
onebox's own dependencies. MuJoCo envs are drawn by Gymnasium's renderer of the same env, set to
each env's (qpos, qvel): that needs the `mujoco` package (any version: it only draws) and an
OpenGL backend (`MUJOCO_GL`).
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from onebox.envs.mujoco_module import is_mujoco_v5

SUBSAMPLES = 4
"""Samples per pixel along each axis: a pixel's color is its shapes' blend by covered fraction."""


class Canvas:
    """An RGB picture drawn in Gymnasium's coordinates: x to the right, y up, in pixels (pixel
    (x, y) is centered on integer x, y, as pygame's)."""

    def __init__(self, width: int, height: int) -> None:
        self.rgb = np.full((height, width, 3), 255.0, dtype=np.float32)  # row 0: y = 0 (bottom)

    def frame(self) -> np.ndarray:
        """The picture as uint8 rows from top to bottom."""
        return np.ascontiguousarray(self.rgb[::-1].round().astype(np.uint8))

    def _fill(
        self,
        inside: Callable[[np.ndarray, np.ndarray], np.ndarray],
        box: tuple[float, float, float, float],
        color: tuple[int, int, int],
    ) -> None:
        height, width = self.rgb.shape[:2]
        x0, x1 = max(math.floor(box[0]), 0), min(math.ceil(box[1]) + 1, width)
        y0, y1 = max(math.floor(box[2]), 0), min(math.ceil(box[3]) + 1, height)
        if x0 >= x1 or y0 >= y1:
            return
        offsets = (np.arange(SUBSAMPLES) + 0.5) / SUBSAMPLES - 0.5  # pixel i spans i +- 0.5
        xs = (np.arange(x0, x1)[:, None] + offsets).ravel()
        ys = (np.arange(y0, y1)[:, None] + offsets).ravel()
        cover = inside(xs[None, :], ys[:, None])
        cover = cover.reshape(y1 - y0, SUBSAMPLES, x1 - x0, SUBSAMPLES).mean(axis=(1, 3))
        region = self.rgb[y0:y1, x0:x1]
        region += cover[..., None] * (np.asarray(color, np.float32) - region)

    def polygon(self, points: Any, color: tuple[int, int, int]) -> None:
        """A filled convex polygon."""
        p = np.asarray(points, dtype=np.float64)
        (ax, ay), (bx, by) = p[1] - p[0], p[2] - p[0]
        if ax * by - ay * bx < 0:
            p = p[::-1]  # counterclockwise: inside is left of every edge
        edges = list(zip(p, np.roll(p, -1, axis=0), strict=True))

        def inside(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            result = np.ones(np.broadcast_shapes(x.shape, y.shape), dtype=bool)
            for a, b in edges:
                result &= (b[0] - a[0]) * (y - a[1]) - (b[1] - a[1]) * (x - a[0]) >= 0
            return result

        self._fill(inside, (p[:, 0].min(), p[:, 0].max(), p[:, 1].min(), p[:, 1].max()), color)

    def circle(self, x: float, y: float, r: float, color: tuple[int, int, int]) -> None:
        """A filled disc of radius r."""
        self._fill(
            lambda px, py: (px - x) ** 2 + (py - y) ** 2 <= r * r,
            (x - r, x + r, y - r, y + r),
            color,
        )

    def line(self, points: Any, color: tuple[int, int, int], width: float = 1.0) -> None:
        """A polyline of the given width through `points`."""
        p = np.asarray(points, dtype=np.float64)
        for a, b in itertools.pairwise(p):
            d = b - a
            n = np.array([-d[1], d[0]]) * (width / 2 / max(np.hypot(*d), 1e-12))
            self.polygon([a + n, b + n, b - n, a - n], color)


def _rotated(points: Any, angle: float, origin: tuple[float, float]) -> np.ndarray:
    """Points rotated counterclockwise by `angle` radians, then moved to `origin`."""
    c, s = math.cos(angle), math.sin(angle)
    p = np.asarray(points, dtype=np.float64)
    return np.stack([p[:, 0] * c - p[:, 1] * s, p[:, 0] * s + p[:, 1] * c], axis=1) + origin


def _box(left: float, right: float, bottom: float, top: float) -> list[tuple[float, float]]:
    return [(left, bottom), (left, top), (right, top), (right, bottom)]


def cartpole(state: np.ndarray) -> np.ndarray:
    """CartPole-v1 (x, x_dot, theta, theta_dot) as Gymnasium draws it: 600x400."""
    canvas = Canvas(600, 400)
    scale = 600 / (2 * 2.4)
    cart_x, cart_y, axle_y = state[0] * scale + 300, 100.0, 100.0 + 30 / 4
    canvas.line([(0, cart_y), (600, cart_y)], (0, 0, 0))
    canvas.polygon(_rotated(_box(-25, 25, -15, 15), 0.0, (cart_x, cart_y)), (0, 0, 0))
    pole = _box(-5, 5, -5, scale * 1.0 - 5)
    canvas.polygon(_rotated(pole, -state[2], (cart_x, axle_y)), (202, 152, 101))
    canvas.circle(int(cart_x), int(axle_y), 5, (129, 132, 203))
    return canvas.frame()


def acrobot(state: np.ndarray) -> np.ndarray:
    """Acrobot-v1 (theta1, theta2, dtheta1, dtheta2) as Gymnasium draws it: 500x500."""
    canvas = Canvas(500, 500)
    scale, offset = 500 / (2 * 2.2), 250.0
    canvas.line(
        [(-2.2 * scale + offset, scale + offset), (2.2 * scale + offset, scale + offset)], (0, 0, 0)
    )
    joints = [
        (offset, offset),
        (offset + math.sin(state[0]) * scale, offset - math.cos(state[0]) * scale),
    ]
    angles = [state[0] - math.pi / 2, state[0] + state[1] - math.pi / 2]
    for (x, y), angle in zip(joints, angles, strict=True):
        link = _box(0, scale, -0.1 * scale, 0.1 * scale)
        canvas.polygon(_rotated(link, angle, (x, y)), (0, 204, 204))
        canvas.circle(int(x), int(y), int(0.1 * scale), (204, 204, 0))
    return canvas.frame()


def mountain_car(state: np.ndarray, goal: float) -> np.ndarray:
    """MountainCar (position, velocity) with its flag at `goal`, as Gymnasium draws it: 600x400."""
    canvas = Canvas(600, 400)
    low, scale = -1.2, 600 / 1.8

    def height(x: Any) -> Any:
        return np.sin(3 * x) * 0.45 + 0.55

    xs = np.linspace(low, 0.6, 100)
    canvas.line(np.stack([(xs - low) * scale, height(xs) * scale], axis=1), (0, 0, 0))
    pos = float(state[0])
    where, tilt = ((pos - low) * scale, 10 + height(pos) * scale), math.cos(3 * pos)
    canvas.polygon(_rotated(_box(-20, 20, 0, 20), tilt, where), (0, 0, 0))
    for wx, wy in _rotated([(10, 0), (-10, 0)], tilt, where):
        canvas.circle(int(wx), int(wy), int(20 / 2.5), (128, 128, 128))
    flag_x, flag_y = int((goal - low) * scale), int(height(goal) * scale)
    canvas.line([(flag_x, flag_y), (flag_x, flag_y + 50)], (0, 0, 0))
    flag = [(flag_x, flag_y + 50), (flag_x, flag_y + 40), (flag_x + 25, flag_y + 45)]
    canvas.polygon(flag, (204, 204, 0))
    return canvas.frame()


def pendulum(state: np.ndarray) -> np.ndarray:
    """Pendulum-v1 (theta, theta_dot) as Gymnasium draws it, without the torque arrow: 500x500."""
    canvas = Canvas(500, 500)
    scale, offset = 500 / (2 * 2.2), 250
    angle = state[0] + math.pi / 2
    rod = _rotated(_box(0, scale, -0.1 * scale, 0.1 * scale), angle, (offset, offset))
    canvas.polygon(rod, (204, 77, 77))
    canvas.circle(offset, offset, int(0.1 * scale), (204, 77, 77))
    end_x, end_y = _rotated([(scale, 0)], angle, (offset, offset))[0]
    canvas.circle(int(end_x), int(end_y), int(0.1 * scale), (204, 77, 77))
    canvas.circle(offset, offset, int(0.05 * scale), (0, 0, 0))
    return canvas.frame()


CLASSIC: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "CartPole-v1": cartpole,
    "Acrobot-v1": acrobot,
    "MountainCar-v0": lambda state: mountain_car(state, goal=0.5),
    "MountainCarContinuous-v0": lambda state: mountain_car(state, goal=0.45),
    "Pendulum-v1": pendulum,
}
"""Env id -> its drawing from the env's state (`NativeEnvPool.get_state`)."""


class RenderUnavailable(RuntimeError):
    """An env's frames cannot be drawn: something its renderer needs is missing (the message
    names it and how to get it)."""


MUJOCO_GL_HINT = (
    "MuJoCo draws with OpenGL, chosen by MUJOCO_GL: with no display use MUJOCO_GL=egl (a GPU "
    "driver or Mesa's libEGL: apt install libegl1) or MUJOCO_GL=osmesa (apt install libosmesa6)"
)


class MujocoFrames:
    """Frames of a MuJoCo env from Gymnasium's renderer of the same env and options."""

    def __init__(self, env_id: str, options: dict[str, Any]) -> None:
        no_display = not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
        if no_display and "mujoco" not in sys.modules:
            os.environ.setdefault("MUJOCO_GL", "egl")  # mujoco's default (glfw) needs a display
        import gymnasium

        try:
            self.env = gymnasium.make(env_id, render_mode="rgb_array", **options).unwrapped
        except gymnasium.error.DependencyNotInstalled:
            raise RenderUnavailable(
                f"{env_id} videos need the `mujoco` package (any version; it only draws): "
                'pip install "onebox[mujoco]"'
            ) from None
        except RuntimeError as e:  # `import mujoco` rejects MUJOCO_GL
            raise RenderUnavailable(f"{env_id} cannot render ({e}). {MUJOCO_GL_HINT}") from None
        self.env.reset(seed=0)
        self.env_id = env_id

    def __call__(self, state: np.ndarray) -> np.ndarray:
        nq = self.env.model.nq
        self.env.set_state(state[:nq], state[nq:])
        try:
            return self.env.render()
        except Exception as e:  # no OpenGL context: the error types vary by backend
            raise RenderUnavailable(
                f"{self.env_id} cannot render ({type(e).__name__}: {e}). {MUJOCO_GL_HINT}"
            ) from e

    def close(self) -> None:
        self.env.close()


def frames_of(env_id: str, options: dict[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
    """A function from an env's state to its RGB frame (uint8, height x width x 3)."""
    if env_id in CLASSIC:
        return CLASSIC[env_id]
    if is_mujoco_v5(env_id):
        return MujocoFrames(env_id, options)
    raise RenderUnavailable(f"{env_id} has no renderer in onebox")
