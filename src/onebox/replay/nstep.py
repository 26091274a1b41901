"""n-step returns computed at insertion, from a small staging ring per env.

Steps are pushed for all envs (or a set of them) at once, one step or a block of consecutive
steps. A step leaves the staging as a transition when its n-step window is complete, or earlier
when the episode ends: at termination every staged step of that env leaves with the rewards up
to the end and discount 0 (no bootstrap); at truncation they leave with discount gamma**k for
the k steps they span, to bootstrap from the final observation. A block is one pass of numpy over
its (env, step) grid, whatever its length: an actor's whole unroll costs about what one step does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onebox.replay.persist import load_into


@dataclass
class Emitted:
    """Transitions that left the staging, ordered by env then age (oldest first)."""

    envs: np.ndarray  # (m,) int64: the env of each
    rows: np.ndarray  # (m,) int64: the env's row among the pushed ones
    steps: np.ndarray  # (m,) int64: the pushed step that completed it (its last step)
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
    """Up to `n_step - 1` staged steps per env between pushes, each with `fields` (name ->
    (shape, dtype)): a ring per env, its oldest step at `head`."""

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
        self._envs = np.arange(num_envs)
        self._powers = self.gamma ** np.arange(n_step + 1, dtype=np.float64)

    def push(
        self,
        fields: dict[str, np.ndarray],
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        envs: np.ndarray | None = None,
    ) -> Emitted:
        """Stage a block of T consecutive steps of every env (or of the envs `envs`, increasing
        ids, row i being env envs[i]): arrays with leading axes (T, rows); return the
        transitions they complete.

        Each env's staged steps and the block form one sequence of positions; the transition
        starting at a position spans the steps up to the first episode end within n_step of
        them, and leaves once that span is known (it ends at an episode end, or spans n_step
        steps); the positions left over stay staged."""
        envs = self._envs if envs is None else envs
        if self.n_step == 1:
            return self._push_single(fields, rewards, terminated, envs)
        return self._push_windows(fields, rewards, terminated, truncated, envs)

    def _push_windows(
        self,
        fields: dict[str, np.ndarray],
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        envs: np.ndarray,
    ) -> Emitted:
        """`push` for any n_step: each position's window, one numpy pass per step of it."""
        n = self.n_step
        t_len, rows = rewards.shape
        old, length = n - 1, n - 1 + t_len  # positions: up to n - 1 staged, then the block
        pos = np.arange(length)
        count = self.count[envs]
        ring = (self.head[envs, None] + pos[:old] - (old - count[:, None])) % n
        valid = pos >= old - count[:, None]  # (rows, length): a staged or pushed step
        staged = (envs[:, None], ring)

        seqs = {name: np.concatenate([self.data[name][staged], value.swapaxes(0, 1)], axis=1)
                for name, value in fields.items()}  # fmt: skip
        rew = np.concatenate([self.rewards[staged], rewards.T], axis=1)
        ends = np.zeros((rows, length), np.bool_)  # a staged step never ends an episode
        ends[:, old:] = (terminated | truncated).T
        term = np.zeros((rows, length), np.bool_)
        term[:, old:] = terminated.T

        returns = np.zeros((rows, length))
        discounts = np.zeros((rows, length))
        last = np.full((rows, length), -1)  # the position of each transition's last step
        alive = valid.copy()  # spans still open
        for k in range(n):
            q = pos + k
            inside = q < length
            alive[:, ~inside] = False  # spans past the block wait for more steps
            qi = np.minimum(q, length - 1)
            returns += alive * self._powers[k] * rew[:, qi]
            stop = alive & ends[:, qi]
            discounts[stop] = self._powers[k + 1] * ~term[:, qi][stop]
            last[stop] = np.broadcast_to(qi, stop.shape)[stop]
            alive &= ~stop
        discounts[alive] = self._powers[n]  # spans of n steps, no episode end within
        last[alive] = np.broadcast_to(np.minimum(pos + n - 1, length - 1), alive.shape)[alive]
        emit = last >= 0
        row, p = np.nonzero(emit)  # by row, then position (oldest first)
        out = {name: seq[row, p] for name, seq in seqs.items()}
        emitted = Emitted(envs[row], row, last[row, p] - old, out, returns[row, p],
                          discounts[row, p])  # fmt: skip

        # The steps left over: each row's last few positions, restaged from ring index 0.
        left = valid & ~emit
        count = left.sum(1)
        row, p = np.nonzero(left)
        age = p - (length - count[row])
        for name, seq in seqs.items():
            self.data[name][envs[row], age] = seq[row, p]
        self.rewards[envs[row], age] = rew[row, p]
        self.head[envs], self.count[envs] = 0, count
        return emitted

    def _push_single(
        self,
        fields: dict[str, np.ndarray],
        rewards: np.ndarray,
        terminated: np.ndarray,
        envs: np.ndarray,
    ) -> Emitted:
        """`push` for n_step 1, where every step is a whole transition and nothing is staged:
        the windows' result without their passes (a MinAtar transition's `ReplayBuffer.add` in
        about a fifth of the time). Its return R = r, its discount gamma, 0 if it terminated."""
        t_len, rows = rewards.shape
        row, step = np.divmod(np.arange(rows * t_len), t_len)  # by env, then age

        def by_env(x: np.ndarray) -> np.ndarray:  # (T, rows, ...) -> (rows * T, ...)
            return x.swapaxes(0, 1).reshape(rows * t_len, *x.shape[2:])

        out = {name: by_env(value) for name, value in fields.items()}
        returns = by_env(rewards).astype(np.float64, copy=False)
        discounts = np.where(by_env(terminated), 0.0, self.gamma)
        return Emitted(envs[row], row, step, out, returns, discounts)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            **{f"data.{k}": v for k, v in self.data.items()},
            "rewards": self.rewards,
            "head": self.head,
            "count": self.count,
        }

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        load_into(self.state_dict(), state, "n-step staging")
