"""Stacked observations stored as single frames: one frame ring per env.

A stacked observation (K, H, W) is K consecutive frames of its env's ring, addressed by the
absolute position of its newest frame. Each step writes only what is new. When `obs` is the stack
the env's previous `next_obs` was, nothing is written for it; when `next_obs` is `obs` shifted by
one frame, only its newest frame is written. Any other stack (an episode's first observation,
whatever the env put in it: ALE's stack starts as zeros then the first frame) is written whole, so
every stack comes back exactly as the env produced it.
"""

from __future__ import annotations

import numpy as np

from onebox.replay.gather import take
from onebox.replay.persist import load_into


class FrameStore:
    """`frames_per_env` frames per env, for stacks of shape `stack_shape` = (K, *frame)."""

    def __init__(
        self, num_envs: int, frames_per_env: int, stack_shape: tuple[int, ...], dtype: np.dtype
    ) -> None:
        self.num_envs, self.size, self.stack = num_envs, int(frames_per_env), stack_shape[0]
        self.frames = np.zeros((num_envs, self.size, *stack_shape[1:]), dtype=dtype)
        self.written = np.zeros(num_envs, dtype=np.int64)  # frames written per env, ever
        self.last = np.zeros((num_envs, *stack_shape), dtype=dtype)  # the last stack written
        self.has_last = np.zeros(num_envs, dtype=bool)

    @property
    def oldest(self) -> np.ndarray:
        """Per env, the absolute position of the oldest frame still held."""
        return np.maximum(self.written - self.size, 0)

    def _write_stacks(self, envs: np.ndarray, stacks: np.ndarray) -> None:
        pos = (self.written[envs, None] + np.arange(self.stack)) % self.size
        self.frames[envs[:, None], pos] = stacks
        self.written[envs] += self.stack

    def put(
        self, obs: np.ndarray, next_obs: np.ndarray, envs: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Store one step of every env (or of the envs `envs`, row i being env envs[i]):
        (position of obs, position of next_obs), each the absolute position of the stack's
        newest frame."""
        envs = np.arange(self.num_envs) if envs is None else envs
        n = len(envs)
        same = self.has_last[envs] & np.all((obs == self.last[envs]).reshape(n, -1), axis=1)
        self._write_stacks(envs[~same], obs[~same])
        obs_pos = self.written[envs] - 1
        shifted = np.all((next_obs[:, :-1] == obs[:, 1:]).reshape(n, -1), axis=1)
        moved = envs[shifted]
        self.frames[moved, self.written[moved] % self.size] = next_obs[shifted, -1]
        self.written[moved] += 1
        self._write_stacks(envs[~shifted], next_obs[~shifted])
        self.last[envs] = next_obs
        self.has_last[envs] = True
        return obs_pos, self.written[envs] - 1

    def stacks(self, envs: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The stacks whose newest frames are at `pos` in the rings of `envs`."""
        idx = envs[:, None] * self.size + (pos[:, None] + np.arange(1 - self.stack, 1)) % self.size
        flat = self.frames.reshape(self.num_envs * self.size, *self.frames.shape[2:])
        return take(flat, idx).reshape(len(envs), self.stack, *self.frames.shape[2:])

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            "frames": self.frames,
            "written": self.written,
            "last": self.last,
            "has_last": self.has_last,
        }

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        load_into(self.state_dict(), state, "frame store")
