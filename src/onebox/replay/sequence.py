"""`SequenceReplay`: fixed-length, overlapping sequences with the recurrent state at their start,
prioritized over sequences, for R2D2 (Kapturowski et al. 2019).

    seq = SequenceReplay(capacity, obs_shape, obs_dtype, action_shape, action_dtype, num_envs,
                         hidden_size, seq_len=80, overlap=40, burn_in=40, prioritized=True,
                         alpha=0.9, beta=0.6, beta_steps=1_000_000, seed=0)
    seq.add(obs, actions, rewards, terminated, truncated, next_obs, (h, c))
    batch = seq.sample(64)       # SequenceBatch
    seq.update_priorities(batch.indices, mixed_priority(abs_td, batch.mask))

`add` takes one env step of every env (or with `envs`, of those envs: each actor adds its own)
and the recurrent state (h, c), each (num_envs, hidden_size), that the actor's network had before
it saw `obs` (zeros at an episode's start, if that is how the actor resets). A sequence starts every `seq_len - overlap` steps of an episode and
never crosses into the next episode: when an episode ends, the earliest unfinished sequence that
holds steps no earlier sequence holds is stored with what it has, the rest padded
(`mask` False). The learner unrolls from the stored state, the first `burn_in` steps only to warm
the state up; `first` marks the sequences that begin an episode, whose stored state is the
actor's start state itself (a learner may train on their burn-in steps too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from onebox.replay.checks import as_batch, check_envs, check_flags, check_obs
from onebox.replay.gather import take
from onebox.replay.persist import load_into
from onebox.replay.table import Table


@dataclass
class SequenceBatch:
    """Sampled sequences (numpy arrays; B sequences of L = seq_len steps)."""

    obs: (
        np.ndarray
    )  # (B, L + 1, ...): obs[:, i] at step i; obs[:, length] the obs after the last step
    actions: np.ndarray  # (B, L, ...)
    rewards: np.ndarray  # (B, L) float32
    terminated: np.ndarray  # (B, L) bool: the episode terminated at this step (no bootstrap)
    mask: np.ndarray  # (B, L) bool: a real step (False: padding after the episode ended)
    hidden: tuple[np.ndarray, np.ndarray]  # (h, c), each (B, hidden_size): the state before step 0
    first: np.ndarray  # (B,) bool: the sequence begins an episode
    weights: np.ndarray  # (B,) float32 importance weights; ones when uniform
    indices: np.ndarray  # (B,) int64 slots, for update_priorities


def mixed_priority(abs_td: np.ndarray, mask: np.ndarray, eta: float = 0.9) -> np.ndarray:
    """R2D2's sequence priority: eta * max + (1 - eta) * mean of |TD| over the real steps."""
    td = np.where(mask, np.abs(abs_td), 0.0)
    mean = td.sum(axis=1) / np.maximum(mask.sum(axis=1), 1)
    return eta * td.max(axis=1) + (1.0 - eta) * mean


class SequenceReplay(Table[SequenceBatch]):
    """A FIFO table of `capacity` sequences of `seq_len` steps (see the module docstring)."""

    kind, items = "sequence table", "steps"

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        obs_dtype: Any,
        action_shape: tuple[int, ...],
        action_dtype: Any,
        num_envs: int,
        hidden_size: int,
        seq_len: int = 80,
        overlap: int = 40,
        burn_in: int = 40,
        prioritized: bool = True,
        alpha: float = 0.9,
        beta: float = 0.6,
        beta_steps: int = 1_000_000,
        seed: int = 0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(
            capacity, obs_shape, obs_dtype, action_shape, action_dtype, num_envs,
            prioritized, alpha, beta, beta_steps, seed, eps,
        )  # fmt: skip
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if not 0 <= overlap < seq_len:
            raise ValueError(f"overlap must be in [0, seq_len={seq_len}), got {overlap}")
        if not 0 <= burn_in < seq_len:
            raise ValueError(
                f"burn_in ({burn_in}) must be >= 0 and smaller than seq_len ({seq_len}): "
                "the learner needs steps after the burn-in to train on"
            )
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
        self.config |= {
            "hidden_size": int(hidden_size), "seq_len": int(seq_len), "overlap": int(overlap),
            "burn_in": int(burn_in),
        }  # fmt: skip
        self.hidden_size = int(hidden_size)
        self.seq_len, self.stride, self.burn_in = int(seq_len), int(seq_len - overlap), int(burn_in)
        obs_shape, action_shape = self.obs_shape, self.action_shape
        n, c, L, H = self.num_envs, self.capacity, self.seq_len, self.hidden_size
        self.stage = {  # the last L steps of each env
            "obs": np.zeros((n, L, *obs_shape), dtype=self.obs_dtype),
            "actions": np.zeros((n, L, *action_shape), dtype=self.action_dtype),
            "rewards": np.zeros((n, L), dtype=np.float32),
            "terminated": np.zeros((n, L), dtype=bool),
            "h": np.zeros((n, L, H), dtype=np.float32),
            "c": np.zeros((n, L, H), dtype=np.float32),
            "steps": np.zeros(n, dtype=np.int64),  # steps ever pushed per env
            "episode_start": np.zeros(n, dtype=np.int64),  # the step its episode began at
            "covered": np.zeros(n, dtype=np.int64),  # the end of its last stored full sequence
        }
        self.table = {
            "obs": np.zeros((c, L + 1, *obs_shape), dtype=self.obs_dtype),
            "actions": np.zeros((c, L, *action_shape), dtype=self.action_dtype),
            "rewards": np.zeros((c, L), dtype=np.float32),
            "terminated": np.zeros((c, L), dtype=bool),
            "mask": np.zeros((c, L), dtype=bool),
            "h": np.zeros((c, H), dtype=np.float32),
            "c": np.zeros((c, H), dtype=np.float32),
            "first": np.zeros(c, dtype=bool),
        }
        self.written = np.zeros((), dtype=np.int64)  # sequences ever stored
        self._make_priorities()

    def __len__(self) -> int:
        return int(min(self.written, self.capacity))

    def add(
        self,
        obs: Any,
        actions: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
        next_obs: Any,
        hidden: tuple[Any, Any],
        envs: Any = None,
    ) -> None:
        """One env step of every env (row i is env i), or with `envs` (increasing env ids) of
        those envs only; `hidden` = (h, c) before the step (see the module doc)."""
        rows = check_envs(envs, self.num_envs)
        n, L, st = len(rows), self.seq_len, self.stage
        obs = check_obs("obs", obs, (n, *self.obs_shape), self.obs_dtype)
        next_obs = check_obs("next_obs", next_obs, (n, *self.obs_shape), self.obs_dtype)
        actions = as_batch("actions", actions, (n, *self.action_shape), self.action_dtype)
        rewards = as_batch("rewards", rewards, (n,), np.dtype(np.float32))
        terminated = check_flags("terminated", terminated, (n,))
        truncated = check_flags("truncated", truncated, (n,))
        if not isinstance(hidden, tuple | list) or len(hidden) != 2:
            raise ValueError("hidden must be the pair (h, c)")
        h = as_batch("hidden h", hidden[0], (n, self.hidden_size), np.dtype(np.float32))
        c = as_batch("hidden c", hidden[1], (n, self.hidden_size), np.dtype(np.float32))

        ring = st["steps"][rows] % L
        for name, value in (("obs", obs), ("actions", actions), ("rewards", rewards)):
            st[name][rows, ring] = value
        st["terminated"][rows, ring] = terminated
        st["h"][rows, ring], st["c"][rows, ring] = h, c
        st["steps"][rows] += 1
        done = terminated | truncated
        t = st["steps"][rows] - st["episode_start"][rows]  # steps of the episode so far
        full = (t >= L) & ((t - L) % self.stride == 0)
        partial = done & ~full & (t > st["covered"][rows])
        # A full sequence ends here; else the earliest one still open when the episode ends.
        start = np.where(full, t - L, -(-np.maximum(t - L + 1, 0) // self.stride) * self.stride)
        st["covered"][rows] = np.where(full, t, st["covered"][rows])
        emit = np.flatnonzero(full | partial)
        if len(emit):
            self._store(rows[emit], start[emit], t[emit], next_obs[emit])
        ended = rows[done]
        st["episode_start"][ended] = st["steps"][ended]
        st["covered"][ended] = 0

    def _store(
        self, envs: np.ndarray, start: np.ndarray, end: np.ndarray, last: np.ndarray
    ) -> None:
        """Store the steps [start, end) of each env's episode, `last` the obs after them."""
        L, st, tab = self.seq_len, self.stage, self.table
        length = end - start
        steps = st["episode_start"][envs, None] + start[:, None] + np.arange(L)
        ring = steps % L
        valid = np.arange(L) < length[:, None]
        slots = (self.written + np.arange(len(envs))) % self.capacity
        for name in ("obs", "actions", "rewards", "terminated"):
            value = st[name][envs[:, None], ring]
            value[~valid] = 0
            tab[name][slots, :L] = value
        tab["obs"][slots, L] = 0
        tab["obs"][slots, length] = last
        tab["mask"][slots] = valid
        tab["h"][slots] = st["h"][envs, ring[:, 0]]
        tab["c"][slots] = st["c"][envs, ring[:, 0]]
        tab["first"][slots] = start == 0
        self.written += len(envs)
        if self.priorities is not None:
            self.priorities.add(slots)

    def _uniform_slots(self, batch_size: int) -> np.ndarray:
        return self.rng.integers(len(self), size=batch_size)

    def get(self, indices: Any) -> SequenceBatch:
        """The sequences in slots `indices` (weights 1); slots [0, len) hold sequences."""
        slots = self._check_indices(indices, len(self))
        return self._gather(slots, np.ones(len(slots), dtype=np.float32))

    def _gather(self, slots: np.ndarray, weights: np.ndarray) -> SequenceBatch:
        tab = {name: take(value, slots) for name, value in self.table.items()}
        return SequenceBatch(
            obs=tab["obs"],
            actions=tab["actions"],
            rewards=tab["rewards"],
            terminated=tab["terminated"],
            mask=tab["mask"],
            hidden=(tab["h"], tab["c"]),
            first=tab["first"],
            weights=weights,
            indices=slots,
        )

    def _arrays(self) -> dict[str, np.ndarray]:
        state = {f"table.{k}": v for k, v in self.table.items()}
        state |= {f"stage.{k}": v for k, v in self.stage.items()}
        state["written"] = self.written
        return state

    def _load_arrays(self, state: dict[str, np.ndarray]) -> None:
        load_into(self._arrays(), state, "sequence table")

    def resume_from(self, path: Any) -> None:
        """`load` a saved table for envs that restart fresh episodes (a resumed run): the steps
        of each env's unfinished episode are dropped, so no sequence joins two episodes."""
        self.load(path)
        self.drop_open()

    def drop_open(self, envs: Any = None) -> None:
        """The envs (all, or those of `envs`) start fresh episodes where theirs were cut (a
        resumed run, a restarted actor): the steps of their unfinished episodes not yet in a
        stored sequence are dropped, so no sequence joins two episodes. No-op for an env whose
        episode just ended."""
        rows = check_envs(envs, self.num_envs)
        self.stage["episode_start"][rows] = self.stage["steps"][rows]
        self.stage["covered"][rows] = 0
