"""The sampler: drives env pools with a policy and fills fixed-length rollouts.

Two modes:

- sync: one pool; `step` all envs, then compute all their actions in one batched call. Exactly
  on-policy.
- double-buffered (Sample Factory's): the envs are two pools of half the envs each, stepped in
  turn. Each row, a pool's results are taken, its actions computed and sent, then the other
  pool's: one pool steps on its threads while the policy acts for the other, so env stepping and
  inference overlap. Every env takes exactly one step per row, so no env can drift ahead of
  another (with one pool returning whichever half finished first, as EnvPool's async mode does,
  envs that reset slowly fell behind for good, and ALE's engine, which cannot hold an env back,
  failed once one was a whole rollout behind). Each rollout ends by acting at row T, by the
  rollout's own policy: those values bootstrap it, and those steps, taken while the learner
  updates, open the next rollout as its row 0 (their stored log-probabilities are that policy's,
  as PPO's ratio needs). For a deterministic policy the rollouts equal the sync sampler's.

Observations go to the device as they come (uint8 images stay uint8 until the network; on CUDA
through pinned buffers with non-blocking copies, `onebox.nn.accel.Staging`, so the one host wait
per step is the one that fetches the actions); there is no Python loop over envs. The pools
must use same-step autoreset: a truncated episode's final observation is then at hand, and the
rollout records V(final obs) (`Rollout.final`) for the learner to bootstrap its last reward with
(`Rollout.bootstrapped_rewards`); the sampler itself folds nothing into the rewards.

A recurrent policy (`policy.recurrent`, e.g. an `ActorCritic` with an LSTM core) gets each env's
state carried across steps and rollouts, indexed by env id, and zeroed where an episode starts.
The rollout then also holds `starts` and every env's state before its step 0, so a learner can
replay it; a truncated episode's V(final obs) is given the state after its last step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from onebox.envs.base import EnvPool, SeedLike, expand_seeds
from onebox.nn.accel import Staging
from onebox.sampling.rollout import Rollout

State = tuple[torch.Tensor, torch.Tensor]
"""A recurrent policy's state for a batch of envs, `(h, c)`, each (envs, hidden)."""

ObsTransform = Callable[[np.ndarray, bool], np.ndarray]
"""(observations, update statistics?) -> observations the policy sees."""
RewardTransform = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""(rewards, episode ends, env ids) -> rewards the learner sees."""


class Policy(Protocol):
    """What the sampler needs of a policy (e.g. `onebox.nn.networks.ActorCritic`)."""

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action, log-probability, value) for a batch of observations."""
        ...

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs) for a batch of observations."""
        ...


class RoutedPolicy(Protocol):
    """A policy whose envs are not all alike (`routed` true: a population's, each member acting
    for its own envs): told which envs each observation is of."""

    @property
    def routed(self) -> bool: ...

    def act(
        self, obs: torch.Tensor, ids: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action, log-probability, value) for the observations of envs `ids`."""
        ...

    def value(self, obs: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        """V(obs) for the observations of envs `ids`."""
        ...


class RecurrentPolicy(Protocol):
    """What the sampler needs of a policy with a state (`recurrent` true), as `ActorCritic`'s."""

    @property
    def recurrent(self) -> bool:
        """True: the sampler carries a state for each env."""
        ...

    def initial_state(self, envs: int, device: torch.device) -> State | None:
        """The state of `envs` envs at the start of an episode."""
        ...

    def step(
        self, obs: torch.Tensor, starts: torch.Tensor | None, state: State | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, State | None]:
        """(action, log-probability, value, state after the step) for a batch of envs; the
        state of envs flagged in `starts` (their obs begins an episode) is zeroed first."""
        ...

    def unroll(
        self, obs: torch.Tensor, starts: torch.Tensor | None, state: State | None
    ) -> tuple[Any, torch.Tensor, State | None]:
        """Replay (T, envs) steps: (distributions, values (T * envs,), state after them)."""
        ...


class EpisodeTracker:
    """Returns and lengths of finished episodes, from the pool's info or summed here.

    Pools that know the true score (Atari: the unclipped whole-game return, across lives) report
    it as `info["episode_return"]`, `info["episode_length"]` with mask `info["_episode_return"]`; for
    the others the tracker sums the rewards itself.
    """

    def __init__(self, num_envs: int) -> None:
        self.returns = np.zeros(num_envs, np.float64)
        self.lengths = np.zeros(num_envs, np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.finished_envs: list[int] = []

    def update(
        self, ids: np.ndarray, rewards: np.ndarray, ends: np.ndarray, info: dict[str, Any]
    ) -> None:
        """Account one step of envs `ids` (an int array)."""
        source = info if "_episode_return" in info else info.get("final_info", {})
        if "_episode_return" in source:
            mask = np.asarray(source["_episode_return"], bool)
            if mask.any():
                self.finished_returns += np.asarray(source["episode_return"])[mask].tolist()
                self.finished_lengths += np.asarray(source["episode_length"])[mask].tolist()
                self.finished_envs += ids[mask].tolist()
            return
        self.returns[ids] += rewards
        self.lengths[ids] += 1
        if ends.any():
            idx = ids[ends]
            self.finished_returns += self.returns[idx].tolist()
            self.finished_lengths += self.lengths[idx].tolist()
            self.finished_envs += idx.tolist()
            self.returns[idx] = 0.0
            self.lengths[idx] = 0

    def pop(self) -> tuple[list[float], list[int]]:
        """The episodes finished since the last call."""
        out = (self.finished_returns, self.finished_lengths)
        self.finished_returns, self.finished_lengths, self.finished_envs = [], [], []
        return out

    def take(self, first: int, stop: int) -> tuple[list[float], list[int]]:
        """The episodes of envs `first` to `stop` - 1 finished since they were last taken (or
        popped), in the order they finished; the others' stay."""
        mine = [first <= env < stop for env in self.finished_envs]

        def split(xs: list[Any]) -> tuple[list[Any], list[Any]]:
            return ([x for x, m in zip(xs, mine, strict=True) if m],
                    [x for x, m in zip(xs, mine, strict=True) if not m])  # fmt: skip

        returns, self.finished_returns = split(self.finished_returns)
        lengths, self.finished_lengths = split(self.finished_lengths)
        self.finished_envs = split(self.finished_envs)[1]
        return returns, lengths


class Sampler:
    """Fills `Rollout`s of `num_steps` steps from every env of `envs` with `policy`.

    Args:
        envs: a pool in same-step autoreset mode that steps all its envs together (`batch_size`
            its `num_envs`); or, for double buffering, a sequence of such pools of one size
            (the envs' halves), stepped in turn.
        policy: computes actions, log-probabilities and values on `device`; a recurrent one
            (`policy.recurrent`) gets its state carried per env.
        num_steps: steps per env in each rollout.
        device: where rollouts live and the policy runs.
        obs_transform: e.g. an observation normalizer, applied before the policy and storage.
        reward_transform: e.g. a reward scaler, applied to what the learner sees (episode
            statistics always use the env's own rewards).
        timer: a `TimeSplit`-like callable; `timer("env")` and `timer("inference")` are timed.
    """

    def __init__(
        self,
        envs: EnvPool | Sequence[EnvPool],
        policy: Policy | RecurrentPolicy | RoutedPolicy,
        num_steps: int,
        *,
        device: torch.device | str = "cpu",
        obs_transform: ObsTransform | None = None,
        reward_transform: RewardTransform | None = None,
        timer: Callable[[str], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        pools = list(envs) if isinstance(envs, Sequence) else [envs]
        if not pools:
            raise ValueError("the sampler needs an env pool")
        for pool in pools:
            if pool.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
                raise ValueError(
                    "the sampler needs env pools with autoreset_mode='SameStep' (to record the "
                    "value of truncated episodes' final observations)"
                )
            if pool.batch_size != pool.num_envs:
                raise ValueError(
                    f"the sampler steps all the envs of a pool together: it needs batch_size = "
                    f"num_envs, got {pool.batch_size} of {pool.num_envs}"
                )
        m = pools[0].num_envs
        if any(pool.num_envs != m for pool in pools):
            sizes = [pool.num_envs for pool in pools]
            raise ValueError(f"double buffering needs pools of one size, got {sizes}")
        if num_steps <= 0:
            raise ValueError(f"num_steps must be positive, got {num_steps}")
        self.pools, self.policy, self.num_steps = pools, policy, num_steps
        self.num_envs = n = m * len(pools)
        self.double_buffered = len(pools) > 1
        """Whether the pools take turns: one steps while the policy acts for the next."""
        self.device = torch.device(device)
        self._staging = Staging(self.device)  # pinned, non-blocking copies on CUDA
        self.obs_transform, self.reward_transform = obs_transform, reward_transform
        self.timer = timer or (lambda name: contextlib.nullcontext())
        self.episodes = EpisodeTracker(n)
        self.recurrent = bool(getattr(policy, "recurrent", False))
        """Whether the policy has a state, carried here for each env."""
        self._rnn = cast(RecurrentPolicy, policy)  # the policy, used only when recurrent
        self.routed = bool(getattr(policy, "routed", False))
        """Whether the policy is told the envs of its observations (`RoutedPolicy`)."""
        self._state: State | None = None  # recurrent: each env's state after its last step
        self._next_state: State | None = None  # double: the state before each env's step T
        self._starts = np.ones(n, bool)  # recurrent: each env's next observation begins an episode
        hidden = None
        if self.recurrent:
            self._state = self._initial_state()
            self._next_state = self._initial_state() if self.double_buffered else None
            hidden = self._state[0].shape[1]

        obs_space, act_space = pools[0].single_observation_space, pools[0].single_action_space
        obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 and obs_transform is None else None
        if isinstance(act_space, spaces.Discrete):
            act_shape, act_dtype = (), torch.int64
            self._clip: tuple[np.ndarray, np.ndarray] | None = None
        elif isinstance(act_space, spaces.Box):
            act_shape, act_dtype = tuple(act_space.shape), torch.float32
            self._clip = (act_space.low, act_space.high)
        else:
            raise ValueError(f"the sampler supports Discrete and Box actions, got {act_space}")
        t = num_steps
        # Double buffering also acts at row T: each env's step past the rollout, whose value
        # bootstraps it, taken while the learner updates; it opens the next rollout as row 0.
        self._storage = Rollout.empty(
            t + 1 if self.double_buffered else t,
            n,
            tuple(obs_space.shape),
            obs_dtype or torch.float32,
            act_shape,
            act_dtype,
            self.device,
            hidden,
        )
        st = self._storage
        if self.double_buffered:
            self.rollout = Rollout(
                st.obs[:t], st.actions[:t], st.rewards[:t], st.terminated[:t], st.truncated[:t],
                outputs={k: v[:t] for k, v in st.outputs.items()},
                final={k: v[:t] for k, v in st.final.items()},
                next_obs=st.obs[t], next={"values": st.values[t]},
                starts=None if st.starts is None else st.starts[:t], state=st.state,
            )  # fmt: skip
        else:
            self.rollout = st
        self._obs: torch.Tensor | None = None  # sync: the observations to act on
        self._started = False
        self._primed = False  # double: every env has been sent its step 0

    # ---- public API ---------------------------------------------------------------------------

    def reset(self, seed: SeedLike = None) -> None:
        """Reset every env (env i gets `seed + i`); the next rollout starts from there."""
        self.episodes = EpisodeTracker(self.num_envs)
        self._started = True
        if self.recurrent:
            self._state = self._initial_state()
            self._starts[:] = True
        seeds = expand_seeds(seed, self.num_envs)
        m = self.pools[0].num_envs
        if self.double_buffered:
            for k, pool in enumerate(self.pools):
                pool.async_reset(seed=seeds[k * m : (k + 1) * m] or None)
            self._primed = False
            return
        obs, _ = self.pools[0].reset(seed=seeds or None)
        self._obs = self._to_device(obs, update=True)

    @torch.no_grad()
    def collect(self) -> Rollout:
        """Play `num_steps` steps in every env and return the (reused) rollout buffers."""
        if not self._started:
            raise RuntimeError("call Sampler.reset(seed) before collect()")
        if self.double_buffered:
            self._collect_double()
            return self.rollout
        r = self.rollout
        if r.state is not None:
            assert self._state is not None
            r.state[0].copy_(self._state[0])
            r.state[1].copy_(self._state[1])
        every = np.arange(self.num_envs)
        for t in range(self.num_steps):
            actions = self._act(t, every, self._obs)
            with self.timer("env"):
                result = self.pools[0].step(actions)
            self._obs = self._record(t, every, result)
        assert self._obs is not None
        r.next_obs.copy_(self._obs)
        with self.timer("inference"):
            if self.recurrent:  # the state carries on: this step is not taken here
                starts = torch.as_tensor(self._starts, device=self.device).unsqueeze(0)
                _, value, _ = self._rnn.unroll(self._obs.unsqueeze(0), starts, self._state)
            else:
                value = self._value(self._obs, every)
            r.next_value.copy_(value)
        return r

    # ---- double buffering ---------------------------------------------------------------------

    def _collect_double(self) -> None:
        """Each row, every pool in turn: take its results of the row, act for its next row and
        send it (so the other pool steps meanwhile). Row T's actions, by this rollout's policy,
        are the next rollout's row 0; their values bootstrap this one."""
        t, st = self.num_steps, self._storage
        if not self._primed:
            for k, pool in enumerate(self.pools):
                with self.timer("env"):
                    obs, *_, info = pool.recv()  # the reset's first observations
                ids = self._ids(k, info)
                self._send(k, 0, ids, self._to_device(obs, update=True))
            self._primed = True
        else:  # row T, acted on and sent at the end of the last rollout, opens this one
            bufs = [st.obs, st.actions, *st.outputs.values()]
            for buf in bufs if st.starts is None else [*bufs, st.starts]:
                buf[0] = buf[t]
            if st.state is not None:  # every env's state before its step T, now its step 0
                assert self._next_state is not None
                st.state[0].copy_(self._next_state[0])
                st.state[1].copy_(self._next_state[1])
        for row in range(t):
            for k, pool in enumerate(self.pools):
                with self.timer("env"):
                    result = pool.recv()
                ids = self._ids(k, result[4])
                self._send(k, row + 1, ids, self._record(row, ids, result))

    def _ids(self, k: int, info: dict[str, Any]) -> np.ndarray:
        """The sampler's env ids of pool k's results, in the order the pool returned them."""
        return k * self.pools[0].num_envs + np.asarray(info["env_id"], np.int64)

    def _send(self, k: int, row: int, ids: np.ndarray, obs: torch.Tensor) -> None:
        """Act for pool k's envs `ids` at `row` and send them a step."""
        actions = self._act(row, ids, obs)
        local = ids - k * self.pools[0].num_envs
        with self.timer("env"):
            self.pools[k].send(actions, local.astype(np.int32))

    # ---- pieces -------------------------------------------------------------------------------

    def _act(self, row: int, ids: np.ndarray, obs: torch.Tensor | None) -> np.ndarray:
        """Choose actions for envs `ids` at `row` and store them."""
        assert obs is not None
        st = self._storage
        index = self._index(row, ids)
        with self.timer("inference"):
            if self.recurrent:
                action, logprob, value = self._step(row, ids, index, obs)
            else:
                action, logprob, value = (
                    cast(RoutedPolicy, self.policy).act(obs, ids) if self.routed
                    else cast(Policy, self.policy).act(obs)
                )  # fmt: skip
            st.obs[index] = obs
            st.actions[index] = action
            st.logprobs[index] = logprob
            st.values[index] = value
            out = action.cpu().numpy()
        if self._clip is not None:
            out = np.clip(out, *self._clip)
        return out

    def _step(
        self, row: int, ids: np.ndarray, index: tuple[Any, Any], obs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A recurrent policy's step for envs `ids` at `row`: their states advance here, and the
        state before step 0 (double-buffered: before the first step 0, then before each step T,
        the next rollout's 0) is kept for the rollout."""
        assert self._state is not None
        st = self._storage
        assert st.starts is not None and st.state is not None
        env = index[1]
        starts = torch.as_tensor(self._starts[ids], device=self.device)
        st.starts[index] = starts
        if not self.double_buffered:  # every env at once
            action, logprob, value, state = self._rnn.step(obs, starts, self._state)
            assert state is not None
            self._state = state
            return action, logprob, value
        mine = (self._state[0][env], self._state[1][env])
        keep = {0: st.state, self.num_steps: self._next_state}.get(row)
        if keep is not None:
            keep[0][env], keep[1][env] = mine
        action, logprob, value, state = self._rnn.step(obs, starts, mine)
        assert state is not None
        self._state[0][env] = state[0]
        self._state[1][env] = state[1]
        return action, logprob, value

    def _initial_state(self) -> State:
        state = self._rnn.initial_state(self.num_envs, self.device)
        if state is None:
            raise ValueError("a recurrent policy's initial_state() gave no state")
        return state

    def _record(self, row: int, ids: np.ndarray, result: tuple[Any, ...]) -> torch.Tensor:
        """Store the results of step `row` of envs `ids`; return their next observations."""
        obs, reward, terminated, truncated, info = result
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        reward = np.asarray(reward, np.float32)
        ends = np.logical_or(terminated, truncated)
        self.episodes.update(ids, reward, ends, info)
        if self.recurrent:
            self._starts[ids] = ends
        if self.reward_transform is not None:
            reward = self.reward_transform(reward, ends, ids)
        final = np.zeros(len(ids), np.float32)
        cut = np.flatnonzero(np.logical_and(truncated, np.logical_not(terminated)))
        if cut.size:
            final[cut] = self._final_values(info, cut, ids[cut])
        st = self._storage
        index = self._index(row, ids)
        for buf, x in ((st.rewards, np.asarray(reward, np.float32)), (st.terminated, terminated),
                       (st.truncated, truncated), (st.final["values"], final)):  # fmt: skip
            buf[index] = self._staging(x)
        return self._to_device(obs, update=True)

    def _index(self, row: int, ids: np.ndarray) -> tuple[int, Any]:
        """Where step `row` of envs `ids` lives in the (T, N, ...) storage: the row, and the envs
        as a slice where they are consecutive and in order (the usual case), else an index
        tensor staged to the device (no host wait)."""
        first = int(ids[0])
        if np.array_equal(ids, np.arange(first, first + len(ids))):
            return row, slice(first, first + len(ids))
        return row, self._staging(np.asarray(ids, np.int64))

    def _final_values(self, info: dict[str, Any], idx: np.ndarray, env: np.ndarray) -> np.ndarray:
        """V(final observation) of the truncated envs at positions `idx` within the batch (`env`:
        their ids), for a recurrent policy given each env's state after its last step."""
        final = np.stack([info["final_obs"][i] for i in idx])
        with self.timer("inference"):
            final_t = self._to_device(final, update=False)
            if self._state is not None:
                at = torch.as_tensor(env, device=self.device)
                state = (self._state[0][at], self._state[1][at])
                _, values, _ = self._rnn.unroll(final_t.unsqueeze(0), None, state)
            else:
                values = self._value(final_t, env)
        return values.cpu().numpy()

    def _value(self, obs: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        """V(obs) of a feed-forward policy for envs `ids`."""
        if self.routed:
            return cast(RoutedPolicy, self.policy).value(obs, ids)
        return cast(Policy, self.policy).value(obs)

    def _to_device(self, obs: np.ndarray, update: bool) -> torch.Tensor:
        if self.obs_transform is not None:
            obs = self.obs_transform(obs, update)
        return self._staging(obs)
