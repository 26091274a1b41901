"""Running normalizers for continuous control: observations (per feature) and rewards (per env).

Both follow Gymnasium's `NormalizeObservation` / `NormalizeReward` (as CleanRL's MuJoCo PPO uses
them): running mean and variance by the parallel (Chan et al.) update, epsilon 1e-8, outputs
clipped to [-clip, clip]. They work on whole batches with numpy, and their state is a plain dict
for checkpoints.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class RunningMeanStd:
    """Running mean and variance of batches of vectors of one shape, in float64."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = float(epsilon)

    def update(self, batch: np.ndarray) -> None:
        """Fold in a batch (first axis = samples)."""
        batch = np.asarray(batch, np.float64)
        n = batch.shape[0]
        if n == 0:
            return
        b_mean, b_var = batch.mean(axis=0), batch.var(axis=0)
        delta = b_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean = np.asarray(state["mean"], np.float64).copy()
        self.var = np.asarray(state["var"], np.float64).copy()
        self.count = float(state["count"])


class ObsNormalizer:
    """`(obs - mean) / sqrt(var + eps)`, clipped; `update=True` folds the batch in first."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, epsilon: float = 1e-8) -> None:
        self.rms = RunningMeanStd(shape)
        self.clip, self.epsilon = clip, epsilon

    def __call__(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        if update:
            self.rms.update(obs)
        out = (obs - self.rms.mean) / np.sqrt(self.rms.var + self.epsilon)
        return np.clip(out, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return self.rms.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.load_state_dict(state)


class RewardScaler:
    """Divide rewards by the running std of each env's discounted return, then clip.

    `ends` (terminated or truncated) restarts an env's discounted return after this step.
    """

    def __init__(
        self, num_envs: int, gamma: float, clip: float = 10.0, epsilon: float = 1e-8
    ) -> None:
        self.rms = RunningMeanStd(())
        self.returns = np.zeros(num_envs, np.float64)
        self.gamma, self.clip, self.epsilon = gamma, clip, epsilon

    def __call__(
        self, rewards: np.ndarray, ends: np.ndarray, ids: slice | np.ndarray
    ) -> np.ndarray:
        returns = self.returns[ids] * self.gamma + rewards
        self.rms.update(returns)
        self.returns[ids] = np.where(ends, 0.0, returns)
        scaled = rewards / np.sqrt(self.rms.var + self.epsilon)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"rms": self.rms.state_dict(), "returns": self.returns.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.load_state_dict(state["rms"])
        self.returns = np.asarray(state["returns"], np.float64).copy()
