"""What every row of `onebox bench envs` builds on (`onebox.bench.envs` and its Atari and process
rows, `onebox.bench.atari_peers` and `onebox.bench.process_peers`): the `Task` each backend is
asked to step, the timed `Loop` it returns (or `Unavailable`, saying why it cannot), the sync and
async loops every vector env runs, and the registration of MinAtar's Gymnasium ids.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

ACTION_BATCHES = 16
"""Random action batches drawn before timing; the loops cycle through them."""


class Unavailable(Exception):
    """A backend cannot run this task; the message says why and goes in the table."""


@dataclasses.dataclass(frozen=True)
class Task:
    """What every backend is asked to step."""

    env_id: str
    num_envs: int
    num_threads: int
    seed: int = 0

    def actions(self, single_space: Any, batch: int) -> list[Any]:
        """`ACTION_BATCHES` batches of `batch` random valid actions from `single_space`."""
        from gymnasium.vector.utils import batch_space

        space = batch_space(single_space, batch)
        space.seed(self.seed)
        return [space.sample() for _ in range(ACTION_BATCHES)]


@dataclasses.dataclass
class Loop:
    """A backend ready to time: `run(k)` makes k calls of its loop body."""

    run: Callable[[int], None]
    steps_per_call: int
    close: Callable[[], Any]


def sync_loop(env: Any, task: Task, steps_per_call: int) -> Loop:
    """`env.step(actions)` over every env: the loop of every sync vector env."""
    batches = itertools.cycle(task.actions(env.single_action_space, steps_per_call))
    env.reset(seed=task.seed)
    step = env.step

    def run(k: int) -> None:  # across calls too: slow envs are timed one call at a time
        for _ in range(k):
            step(next(batches))

    return Loop(run, steps_per_call, env.close)


def async_loop(env: Any, task: Task, batch_size: int) -> Loop:
    """`recv()` the first batch_size envs to finish, `send` them their next actions."""
    batches = itertools.cycle(task.actions(env.single_action_space, batch_size))
    env.async_reset()
    recv, send = env.recv, env.send

    def run(k: int) -> None:
        for _ in range(k):
            info = recv()[-1]
            send(next(batches), info["env_id"])

    return Loop(run, batch_size, env.close)


def half(n: int) -> int:
    """The batch size of the async loops for `n` envs: half of them, at least one."""
    return max(1, n // 2)


def register_minatar(env_id: str) -> None:
    """Register the `minatar` package's Gymnasium ids (`MinAtar/Breakout-v1`, ...) for the peers
    that run the package, Gymnasium's vector envs and onebox's process backend (Gymnasium 1.x does
    not load the package's entry point by itself). Nothing for other ids, or without the package
    (those peers then say n/a)."""
    import gymnasium as gym

    if not env_id.startswith("MinAtar/") or env_id in gym.registry:
        return
    try:
        import minatar.gym
    except ImportError:
        return
    minatar.gym.register_envs()
