"""The sampler: drives an env pool with a policy and fills fixed-length rollouts.

Two modes, both exactly on-policy (every action of a rollout comes from the same weights):

- sync: `step` all envs, then compute all their actions in one batched call.
- double-buffered (Sample Factory, Uber): the envs are split into two halves stepped through the
  pool's async `send`/`recv` (`batch_size = num_envs / 2`). While one half steps on the pool's
  threads, the policy computes the other half's actions, so env stepping and inference overlap.

Observations go to the device as they come (uint8 images stay uint8 until the network); there is
no Python loop over envs. The pool must use same-step autoreset: a truncated episode's final
observation is then at hand to bootstrap its last reward (`r + gamma * V(final obs)`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from onebox.envs.base import EnvPool, SeedLike
from onebox.sampling.rollout import Rollout

ObsTransform = Callable[[np.ndarray, bool], np.ndarray]
"""(observations, update statistics?) -> observations the policy sees."""
RewardTransform = Callable[[np.ndarray, np.ndarray, slice], np.ndarray]
"""(rewards, episode ends, env slice) -> rewards the learner sees."""


class Policy(Protocol):
    """What the sampler needs of a policy (e.g. `onebox.nn.networks.ActorCritic`)."""

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action, log-probability, value) for a batch of observations."""
        ...

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs) for a batch of observations."""
        ...


class EpisodeTracker:
    """Returns and lengths of finished episodes, from the pool's info or summed here.

    Pools that know the true score (Atari: the unclipped whole-game return, across lives) report
    it as `info["episode_return"]`, `info["episode_length"]` with mask `info["_episode"]`; for
    the others the tracker sums the rewards itself.
    """

    def __init__(self, num_envs: int) -> None:
        self.returns = np.zeros(num_envs, np.float64)
        self.lengths = np.zeros(num_envs, np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []

    def update(
        self, ids: slice, rewards: np.ndarray, ends: np.ndarray, info: dict[str, Any]
    ) -> None:
        """Account one step of envs `ids`."""
        source = info if "_episode" in info else info.get("final_info", {})
        if "_episode" in source:
            mask = np.asarray(source["_episode"], bool)
            if mask.any():
                self.finished_returns += np.asarray(source["episode_return"])[mask].tolist()
                self.finished_lengths += np.asarray(source["episode_length"])[mask].tolist()
            return
        self.returns[ids] += rewards
        self.lengths[ids] += 1
        if ends.any():
            idx = np.flatnonzero(ends) + ids.start
            self.finished_returns += self.returns[idx].tolist()
            self.finished_lengths += self.lengths[idx].tolist()
            self.returns[idx] = 0.0
            self.lengths[idx] = 0

    def pop(self) -> tuple[list[float], list[int]]:
        """The episodes finished since the last call."""
        out = (self.finished_returns, self.finished_lengths)
        self.finished_returns, self.finished_lengths = [], []
        return out


class Sampler:
    """Fills `Rollout`s of `num_steps` steps from every env of `envs` with `policy`.

    Args:
        envs: a pool in same-step autoreset mode; for double buffering its `batch_size` must be
            half its (even) `num_envs`.
        policy: computes actions, log-probabilities and values on `device`.
        num_steps: steps per env in each rollout.
        device: where rollouts live and the policy runs.
        gamma: discount, to bootstrap truncated episodes.
        double_buffered: overlap stepping one half of the envs with inference on the other.
        obs_transform: e.g. an observation normalizer, applied before the policy and storage.
        reward_transform: e.g. a reward scaler, applied to what the learner sees (episode
            statistics always use the env's own rewards).
        timer: a `TimeSplit`-like callable; `timer("env")` and `timer("inference")` are timed.
    """

    def __init__(
        self,
        envs: EnvPool,
        policy: Policy,
        num_steps: int,
        *,
        device: torch.device | str = "cpu",
        gamma: float = 0.99,
        double_buffered: bool = False,
        obs_transform: ObsTransform | None = None,
        reward_transform: RewardTransform | None = None,
        timer: Callable[[str], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        if envs.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
            raise ValueError(
                "the sampler needs an env pool with autoreset_mode='SameStep' (to bootstrap "
                "truncated episodes from their final observation)"
            )
        n = envs.num_envs
        if double_buffered and (n < 2 or n % 2 or envs.batch_size != n // 2):
            raise ValueError(
                f"double buffering needs an even num_envs >= 2 and batch_size = num_envs / 2; "
                f"got num_envs={n}, batch_size={envs.batch_size}"
            )
        if not double_buffered and envs.batch_size != n:
            raise ValueError(f"sync sampling needs batch_size = num_envs = {n}")
        if num_steps <= 0:
            raise ValueError(f"num_steps must be positive, got {num_steps}")
        self.envs, self.policy, self.num_steps = envs, policy, num_steps
        self.device = torch.device(device)
        self.gamma = gamma
        self.double_buffered = double_buffered
        self.obs_transform, self.reward_transform = obs_transform, reward_transform
        self.timer = timer or (lambda name: contextlib.nullcontext())
        self.episodes = EpisodeTracker(n)

        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 and obs_transform is None else None
        if isinstance(act_space, spaces.Discrete):
            act_shape, act_dtype = (), torch.int64
            self._clip: tuple[np.ndarray, np.ndarray] | None = None
        elif isinstance(act_space, spaces.Box):
            act_shape, act_dtype = tuple(act_space.shape), torch.float32
            self._clip = (act_space.low, act_space.high)
        else:
            raise ValueError(f"the sampler supports Discrete and Box actions, got {act_space}")
        self.rollout = Rollout.empty(
            num_steps,
            n,
            tuple(obs_space.shape),
            obs_dtype or torch.float32,
            act_shape,
            act_dtype,
            self.device,
        )
        half = n // 2
        self._groups = [slice(0, half), slice(half, n)] if double_buffered else [slice(0, n)]
        self._obs: torch.Tensor | None = None

    # ---- public API ---------------------------------------------------------------------------

    def reset(self, seed: SeedLike = None) -> None:
        """Reset every env (env i gets `seed + i`); the next rollout starts from there."""
        obs, _ = self.envs.reset(seed=seed)
        self._obs = self._to_device(obs, update=True)
        self.episodes = EpisodeTracker(self.envs.num_envs)

    @torch.no_grad()
    def collect(self) -> Rollout:
        """Play `num_steps` steps in every env and return the (reused) rollout buffers."""
        if self._obs is None:
            raise RuntimeError("call Sampler.reset(seed) before collect()")
        if self.double_buffered:
            self._collect_double()
        else:
            self._collect_sync()
        r = self.rollout
        r.next_obs.copy_(self._obs)
        with self.timer("inference"):
            r.next_value.copy_(self.policy.value(self._obs))
        return r

    # ---- the two loops ------------------------------------------------------------------------

    def _collect_sync(self) -> None:
        everyone = self._groups[0]
        for t in range(self.num_steps):
            actions = self._act(t, everyone)
            with self.timer("env"):
                result = self.envs.step(actions)
            self._record(t, everyone, result)

    def _collect_double(self) -> None:
        # Only one half is ever in flight, so each recv() returns exactly that half.
        first, second = self._groups
        self._send(self._act(0, first), first)
        for t in range(self.num_steps):
            self._send(self._act(t, second), second)  # computed while `first` steps
            self._record(t, first, self._recv())
            if t + 1 < self.num_steps:
                self._send(self._act(t + 1, first), first)  # computed while `second` steps
            self._record(t, second, self._recv())

    # ---- pieces -------------------------------------------------------------------------------

    def _act(self, t: int, ids: slice) -> np.ndarray:
        r = self.rollout
        assert self._obs is not None
        with self.timer("inference"):
            obs = self._obs[ids]
            action, logprob, value = self.policy.act(obs)
            r.obs[t, ids] = obs
            r.actions[t, ids] = action
            r.logprobs[t, ids] = logprob
            r.values[t, ids] = value
            out = action.cpu().numpy()
        if self._clip is not None:
            out = np.clip(out, *self._clip)
        return out

    def _send(self, actions: np.ndarray, ids: slice) -> None:
        with self.timer("env"):
            self.envs.send(actions, np.arange(ids.start, ids.stop, dtype=np.int32))

    def _recv(self) -> tuple[Any, ...]:
        with self.timer("env"):
            return self.envs.recv()

    def _record(self, t: int, ids: slice, result: tuple[Any, ...]) -> None:
        obs, reward, terminated, truncated, info = result
        if "env_id" in info and self.double_buffered:
            got = np.asarray(info["env_id"])
            if got[0] != ids.start or got[-1] != ids.stop - 1:
                raise RuntimeError(f"expected envs {ids.start}..{ids.stop - 1} from recv()")
        ends = np.logical_or(terminated, truncated)
        self.episodes.update(ids, reward, ends, info)
        reward = np.asarray(reward, np.float32)
        if self.reward_transform is not None:
            reward = self.reward_transform(reward, ends, ids)
        cut = np.flatnonzero(np.logical_and(truncated, np.logical_not(terminated)))
        if cut.size:
            reward = reward + self.gamma * self._final_values(info, cut)
        r = self.rollout
        r.rewards[t, ids] = torch.from_numpy(np.asarray(reward, np.float32)).to(self.device)
        r.ends[t, ids] = torch.from_numpy(ends).to(self.device)
        assert self._obs is not None
        self._obs[ids] = self._to_device(obs, update=True)

    def _final_values(self, info: dict[str, Any], idx: np.ndarray) -> np.ndarray:
        """V(final observation) of the truncated envs `idx` (positions within the batch)."""
        final = np.stack([info["final_obs"][i] for i in idx])
        with self.timer("inference"):
            values = self.policy.value(self._to_device(final, update=False))
        out = np.zeros(len(info["final_obs"]), np.float32)
        out[idx] = values.cpu().numpy()
        return out

    def _to_device(self, obs: np.ndarray, update: bool) -> torch.Tensor:
        if self.obs_transform is not None:
            obs = self.obs_transform(obs, update)
        return torch.as_tensor(obs, device=self.device)
