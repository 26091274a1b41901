"""`ReplayBuffer`: the transition table of DQN-family and SAC learners (see `onebox.replay`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from onebox.replay.checks import as_batch, check_envs, check_flags, check_obs
from onebox.replay.frames import FrameStore
from onebox.replay.gather import take
from onebox.replay.nstep import NStepStaging, check_nstep_args
from onebox.replay.persist import load_into
from onebox.replay.table import Table, subset


@dataclass
class ReplayBatch:
    """A sampled batch of n-step transitions (numpy arrays, leading axis the batch)."""

    obs: np.ndarray  # the observation the action was taken in
    actions: np.ndarray
    returns: np.ndarray  # float32: discounted sum of the (up to) n rewards
    next_obs: np.ndarray  # the observation after the last of those steps (final obs at an end)
    discounts: np.ndarray  # float32: gamma**k for the k steps taken; 0 if terminated within them
    weights: np.ndarray  # float32 importance weights (max 1); ones when uniform
    indices: np.ndarray  # int64 slots, for update_priorities


class ReplayBuffer(Table[ReplayBatch]):
    """A FIFO table of n-step transitions, uniform or prioritized (see the package docstring).

    `capacity` is rounded down to a multiple of `num_envs`: each env owns `capacity // num_envs`
    slots and, with `frame_stack`, a frame ring of that many frames plus 1/16 more (for the whole
    first stacks of episodes). Episodes shorter than about 16 * K steps on average can outrun that
    margin; the env's oldest transitions then leave the table early (never a wrong stack).
    """

    kind, items = "replay table", "transitions"

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        obs_dtype: Any,
        action_shape: tuple[int, ...],
        action_dtype: Any,
        num_envs: int,
        n_step: int = 1,
        gamma: float = 0.99,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_steps: int = 1_000_000,
        frame_stack: int = 0,
        seed: int = 0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(
            capacity, obs_shape, obs_dtype, action_shape, action_dtype, num_envs,
            prioritized, alpha, beta, beta_steps, seed, eps,
        )  # fmt: skip
        obs_shape, action_shape = self.obs_shape, self.action_shape
        if frame_stack < 0 or (frame_stack and (len(obs_shape) < 2 or obs_shape[0] != frame_stack)):
            raise ValueError(
                f"frame_stack={frame_stack} needs obs_shape (frame_stack, H, W, ...), got {obs_shape}"
            )
        check_nstep_args(n_step, gamma)
        self.config |= {
            "n_step": int(n_step),
            "gamma": float(gamma),
            "frame_stack": int(frame_stack),
        }
        self.per_env = self.capacity // self.num_envs
        self.capacity = self.per_env * self.num_envs
        self.frame_stack, self.gamma = int(frame_stack), float(gamma)
        self._make_priorities()

        staged: dict[str, tuple[tuple[int, ...], np.dtype]] = {
            "action": (action_shape, self.action_dtype),
            "priority": ((), np.dtype(np.float64)),
        }
        # One record per transition: a sampled transition is one stretch of memory, not one
        # scattered read per field.
        row: list[tuple[str, np.dtype, tuple[int, ...]]] = [
            ("actions", self.action_dtype, action_shape),
            ("returns", np.dtype(np.float32), ()),
            ("discounts", np.dtype(np.float32), ()),
        ]
        if frame_stack:
            margin = max(self.per_env // 16, 2 * frame_stack * (n_step + 2))
            self.frames: FrameStore | None = FrameStore(
                self.num_envs, self.per_env + margin, obs_shape, self.obs_dtype
            )
            staged["obs_pos"] = ((), np.dtype(np.int64))
            row += [("obs_pos", np.dtype(np.int64), ()), ("next_pos", np.dtype(np.int64), ())]
        else:
            self.frames = None
            staged["obs"] = (obs_shape, self.obs_dtype)
            row += [("obs", self.obs_dtype, obs_shape), ("next_obs", self.obs_dtype, obs_shape)]
        self.table = np.zeros(self.capacity, dtype=np.dtype(row))
        self.staging = NStepStaging(self.num_envs, n_step, gamma, staged)
        self.head = np.zeros(self.num_envs, dtype=np.int64)  # transitions ever written per env
        self.tail = np.zeros(self.num_envs, dtype=np.int64)  # the oldest still held, per env

    def __len__(self) -> int:
        return int((self.head - self.tail).sum())

    def add(
        self,
        obs: Any,
        actions: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
        next_obs: Any,
        priorities: Any = None,
        envs: Any = None,
    ) -> None:
        """One env step of every env (row i is env i), or with `envs` (increasing env ids) of
        those envs only (row i is env envs[i]: Ape-X's actors each add their own envs).
        `next_obs` is the true next observation (the final one where an episode ended).
        `priorities`: optional TD-error magnitudes of the transitions that start at this step
        (Ape-X's actor priorities; NaN: the max), applied when their n-step returns complete;
        without them new transitions get the max priority."""
        self._add((), obs, actions, rewards, terminated, truncated, next_obs, priorities, envs)

    def add_steps(
        self,
        obs: Any,
        actions: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
        next_obs: Any,
        priorities: Any = None,
        envs: Any = None,
    ) -> None:
        """T consecutive env steps at once (an actor's unroll): `add`'s arguments with a leading
        time axis, (T, envs, ...). The table ends as after T calls of `add`, except that a NaN
        priority becomes the largest priority seen by the end of the block."""
        steps = np.shape(rewards)[:1]
        if steps and steps[0] + self.staging.n_step - 1 > self.per_env:
            raise ValueError(
                f"add_steps() of {steps[0]} steps could write more than an env's "
                f"{self.per_env} slots at once; add fewer steps per call or make the table larger"
            )
        self._add(steps, obs, actions, rewards, terminated, truncated, next_obs, priorities, envs)

    def _add(self, lead: tuple[int, ...], obs: Any, actions: Any, rewards: Any, terminated: Any,
             truncated: Any, next_obs: Any, priorities: Any, envs: Any) -> None:  # fmt: skip
        """`add` (`lead` ()) or `add_steps` (`lead` (T,)): check, then stage the steps."""
        rows = check_envs(envs, self.num_envs)
        shape = (*lead, len(rows))
        obs = check_obs("obs", obs, (*shape, *self.obs_shape), self.obs_dtype)
        next_obs = check_obs("next_obs", next_obs, (*shape, *self.obs_shape), self.obs_dtype)
        actions = as_batch("actions", actions, (*shape, *self.action_shape), self.action_dtype)
        rewards = as_batch("rewards", rewards, shape, np.dtype(np.float64))
        terminated = check_flags("terminated", terminated, shape)
        truncated = check_flags("truncated", truncated, shape)
        if priorities is None:
            prio = np.full(shape, np.nan)
        elif self.priorities is None:
            raise ValueError("priorities given to add() of a uniform table (prioritized=False)")
        else:
            prio = as_batch("priorities", priorities, shape, np.dtype(np.float64))
        if not lead:  # one step: a block of 1
            obs, next_obs, actions, rewards = (
                obs[None],
                next_obs[None],
                actions[None],
                rewards[None],
            )
            terminated, truncated, prio = terminated[None], truncated[None], prio[None]
        staged = {"action": actions, "priority": prio}
        if self.frames is not None:
            pos = [self.frames.put(obs[t], next_obs[t], rows) for t in range(len(obs))]
            staged["obs_pos"] = np.stack([p for p, _ in pos])
            next_pos = np.stack([p for _, p in pos])
        else:
            staged["obs"] = obs
        out = self.staging.push(staged, rewards, terminated, truncated, rows)

        counts = np.bincount(out.envs, minlength=self.num_envs)
        rank = np.arange(len(out.envs)) - (np.cumsum(counts) - counts)[out.envs]
        slots = out.envs * self.per_env + (self.head[out.envs] + rank) % self.per_env
        self.head += counts
        self.tail = np.maximum(self.tail, self.head - self.per_env)
        t = self.table
        t["actions"][slots] = out.fields["action"]
        t["returns"][slots] = out.returns
        t["discounts"][slots] = out.discounts
        if self.frames is not None:
            t["obs_pos"][slots] = out.fields["obs_pos"]
            t["next_pos"][slots] = next_pos[out.steps, out.rows]
            self._drop_overwritten()
        else:
            t["obs"][slots] = out.fields["obs"]
            t["next_obs"][slots] = next_obs[out.steps, out.rows]
        if self.priorities is not None:
            self.priorities.add(slots, out.fields["priority"])

    def _drop_overwritten(self) -> None:
        """Transitions whose oldest frame has been overwritten leave the table."""
        envs = np.arange(self.num_envs)
        oldest = self.frames.oldest + self.frame_stack - 1  # lowest newest-frame still whole
        while True:
            slots = envs * self.per_env + self.tail % self.per_env
            gone = (self.head > self.tail) & (self.table["obs_pos"][slots] < oldest)
            if not gone.any():
                return
            if self.priorities is not None:
                self.priorities.remove(slots[gone])
            self.tail[gone] += 1

    def _uniform_slots(self, batch_size: int) -> np.ndarray:
        counts = self.head - self.tail
        ends = np.cumsum(counts)
        u = self.rng.integers(len(self), size=batch_size)
        env = np.searchsorted(ends, u, side="right")
        offset = self.tail[env] + u - (ends[env] - counts[env])
        return env * self.per_env + offset % self.per_env

    def live_indices(self) -> np.ndarray:
        """The slots that hold transitions, env by env, oldest first."""
        parts = [
            e * self.per_env + np.arange(self.tail[e], self.head[e]) % self.per_env
            for e in range(self.num_envs)
        ]
        return np.concatenate(parts).astype(np.int64)

    def get(self, indices: Any) -> ReplayBatch:
        """The transitions in slots `indices` (weights 1), e.g. from `live_indices()`."""
        slots = self._check_indices(indices, self.capacity)
        return self._gather(slots, np.ones(len(slots), dtype=np.float32))

    def _gather(self, slots: np.ndarray, weights: np.ndarray) -> ReplayBatch:
        rows = take(self.table, slots)

        def field(name: str) -> np.ndarray:
            return np.ascontiguousarray(rows[name])

        if self.frames is not None:
            env = slots // self.per_env
            obs = self.frames.stacks(env, rows["obs_pos"])
            next_obs = self.frames.stacks(env, rows["next_pos"])
        else:
            obs, next_obs = field("obs"), field("next_obs")
        return ReplayBatch(
            obs=obs,
            actions=field("actions"),
            returns=field("returns"),
            next_obs=next_obs,
            discounts=field("discounts"),
            weights=weights,
            indices=slots,
        )

    def _arrays(self) -> dict[str, np.ndarray]:
        state = {"table": self.table}
        state |= {f"staging.{k}": v for k, v in self.staging.state_dict().items()}
        state |= {"head": self.head, "tail": self.tail}
        if self.frames is not None:
            state |= {f"frames.{k}": v for k, v in self.frames.state_dict().items()}
        return state

    def _load_arrays(self, state: dict[str, np.ndarray]) -> None:
        self.staging.load_state_dict(subset(state, "staging."))
        load_into(
            {"table": self.table, "head": self.head, "tail": self.tail}, state, "replay table"
        )
        if self.frames is not None:
            self.frames.load_state_dict(subset(state, "frames."))

    def resume_from(self, path: Any) -> None:
        """`load` a saved table for envs that restart fresh episodes (a resumed run): the steps
        that were still waiting for their n-step return (at most n - 1 per env) are dropped, so
        no transition joins two episodes."""
        self.load(path)
        self.staging.count[:] = 0
