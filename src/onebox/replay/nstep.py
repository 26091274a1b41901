"""n-step returns computed at insertion, from a small staging ring per env.

Each env step is pushed for all envs at once. A step leaves the staging as a transition when its
n-step window is complete, or earlier when the episode ends: at termination every staged step of
that env leaves with the rewards up to the end and discount 0 (no bootstrap); at truncation they
leave with discount gamma**k for the k steps they span, to bootstrap from the final observation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onebox.replay.persist import load_into


@dataclass
class Emitted:
    """Transitions that left the staging, ordered by env then age (oldest first)."""

    envs: np.ndarray  # (m,) int64: the env of each
    fields: dict[str, np.ndarray]  # the staged fields of each transition's first step
    returns: np.ndarray  # (m,) float64: sum_k gamma**k * r_{t+k}
    discounts: np.ndarray  # (m,) float64: gamma**steps, 0 if terminated within them


def check_nstep_args(n_step: int, gamma: float) -> None:
    """Raise ValueError naming the argument that is out of range."""
    if n_step < 1:
        raise ValueError(f"n_step must be >= 1 (1: one-step transitions), got {n_step}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")


class NStepStaging:
    """Up to `n_step` staged steps per env, each with `fields` (name -> (shape, dtype))."""

    def __init__(
        self,
        num_envs: int,
        n_step: int,
        gamma: float,
        fields: dict[str, tuple[tuple[int, ...], np.dtype]],
    ) -> None:
        check_nstep_args(n_step, gamma)
        self.num_envs, self.n_step, self.gamma = num_envs, int(n_step), float(gamma)
        self.data = {
            name: np.zeros((num_envs, n_step, *shape), dtype=dtype)
            for name, (shape, dtype) in fields.items()
        }
        self.rewards = np.zeros((num_envs, n_step), dtype=np.float64)
        self.head = np.zeros(num_envs, dtype=np.int64)  # ring index of the oldest staged step
        self.count = np.zeros(num_envs, dtype=np.int64)  # staged steps per env
        self._envs, self._ages = np.arange(num_envs), np.arange(n_step)
        # returns by age = staged rewards by age @ _suffix: _suffix[k, j] = gamma**(k - j), k >= j
        lag = self._ages[:, None] - self._ages
        self._suffix = np.where(lag >= 0, self.gamma ** np.maximum(lag, 0), 0.0)
        self._powers = self.gamma ** np.arange(n_step + 1, dtype=np.float64)

    def push(
        self,
        fields: dict[str, np.ndarray],
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        envs: np.ndarray | None = None,
    ) -> Emitted:
        """Stage one step of every env (or of the envs `envs`, increasing ids, row i being env
        envs[i]); return the transitions it completes."""
        n, ages = self.n_step, self._ages
        envs = self._envs if envs is None else envs
        head, count = self.head[envs], self.count[envs] + 1
        slot = (head + count - 1) % n
        for name, value in fields.items():
            self.data[name][envs, slot] = value
        self.rewards[envs, slot] = rewards
        done = terminated | truncated

        ring = (head[:, None] + ages) % n  # (envs, n): ring index of each age
        staged = ages < count[:, None]
        returns = (self.rewards[envs[:, None], ring] * staged) @ self._suffix
        full = count == n
        emit = staged & (done[:, None] | (full[:, None] & (ages == 0)))
        row, age = np.nonzero(emit)
        discounts = self._powers[count[row] - age] * ~terminated[row]
        env, index = envs[row], ring[row, age]
        out = {name: value[env, index] for name, value in self.data.items()}
        emitted = Emitted(env, out, returns[row, age], discounts)

        slide = full & ~done
        head[slide] = (head[slide] + 1) % n
        count[slide] -= 1
        head[done] = 0
        count[done] = 0
        self.head[envs], self.count[envs] = head, count
        return emitted

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            **{f"data.{k}": v for k, v in self.data.items()},
            "rewards": self.rewards,
            "head": self.head,
            "count": self.count,
        }

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        load_into(self.state_dict(), state, "n-step staging")
