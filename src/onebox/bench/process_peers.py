"""Rows of `onebox bench envs` for the process backend (`ProcessEnvPool`), and `BusyEnv`, a
synthetic env whose step burns about 100 microseconds of CPU, registered in Gymnasium as
`onebox/Busy100us-v0` so that every Gymnasium-based peer can make it too.

`onebox-process` forces any Gymnasium env (CartPole-v1 included, which onebox also has natively)
through worker processes, `num_threads` of them, with the sync loop; `onebox-process-async` uses
the async loop with batch_size num_envs/2.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from onebox.bench.loops import (
    Loop,
    Task,
    Unavailable,
    async_loop,
    half,
    register_minatar,
    sync_loop,
)

BUSY_ID = "onebox/Busy100us-v0"
BUSY_STEP_SECONDS = 100e-6


class BusyEnv(gym.Env):
    """A stand-in for an expensive Python env: each step spins the CPU for `step_seconds`.

    Observations are 4 floats drifting with the actions; episodes last 200 steps (the time limit
    of `onebox/Busy100us-v0`).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, step_seconds: float = BUSY_STEP_SECONDS) -> None:
        self.step_seconds = float(step_seconds)
        self.observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._state = np.zeros(4, np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._state = self.np_random.uniform(-0.05, 0.05, 4).astype(np.float32)
        return self._state.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        end = time.perf_counter() + self.step_seconds
        while time.perf_counter() < end:
            pass
        self._state += np.float32(0.01 if action else -0.01)
        return self._state.copy(), 1.0, False, False, {}


if BUSY_ID not in gym.registry:
    gym.register(BUSY_ID, entry_point=f"{__name__}:BusyEnv", max_episode_steps=200)


def _process_pool(task: Task, batch_size: int | None) -> Any:
    import onebox.envs

    register_minatar(task.env_id)
    if task.env_id not in gym.registry:
        raise Unavailable(f"n/a: Gymnasium has no {task.env_id}")
    return onebox.envs.make(
        task.env_id,
        task.num_envs,
        batch_size=batch_size,
        num_threads=task.num_threads,
        seed=task.seed,
        backend="process",
    )


def process_sync(task: Task) -> Loop:
    """`step` over every env of a `ProcessEnvPool`."""
    return sync_loop(_process_pool(task, None), task, task.num_envs)


def process_async(task: Task) -> Loop:
    """`recv` the first num_envs/2 envs of a `ProcessEnvPool`, `send` them their next actions."""
    batch = half(task.num_envs)
    return async_loop(_process_pool(task, batch), task, batch)
