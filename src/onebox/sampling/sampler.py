"""The sampler: drives an env pool with a policy and fills fixed-length rollouts.

Two modes:

- sync: `step` all envs, then compute all their actions in one batched call. Exactly on-policy.
- double-buffered (Sample Factory, Uber): the pool runs async with `batch_size = num_envs / 2`.
  Each `recv` returns the half that finished first; their actions are computed and sent while the
  other half is still stepping on the pool's threads, so env stepping and inference overlap.
  Whatever ids `recv` returns are accepted (ALE and process pools choose them). Every env is
  always in flight, so when the last env completes its `num_steps`, the others may have gone a
  step or two further: those steps open the next rollout, taken by the policy of the rollout
  that just ended (their stored log-probabilities are that policy's, as PPO's ratio needs).

Observations go to the device as they come (uint8 images stay uint8 until the network; on CUDA
through pinned buffers with non-blocking copies, `onebox.nn.accel.Staging`, so the one host wait
per step is the one that fetches the actions); there is no Python loop over envs. The pool must use same-step autoreset: a truncated episode's final
observation is then at hand, and the rollout records V(final obs) (`Rollout.final`) for the
learner to bootstrap its last reward with (`Rollout.bootstrapped_rewards`); the sampler itself
folds nothing into the rewards.

A recurrent policy (`policy.recurrent`, e.g. an `ActorCritic` with an LSTM core) gets each env's
state carried across steps and rollouts, indexed by env id, and zeroed where an episode starts.
The rollout then also holds `starts` and every env's state before its step 0, so a learner can
replay it; a truncated episode's V(final obs) is given the state after its last step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol, cast

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from onebox.envs.base import EnvPool, SeedLike
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
            return
        self.returns[ids] += rewards
        self.lengths[ids] += 1
        if ends.any():
            idx = ids[ends]
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
        policy: computes actions, log-probabilities and values on `device`; a recurrent one
            (`policy.recurrent`) gets its state carried per env.
        num_steps: steps per env in each rollout.
        device: where rollouts live and the policy runs.
        double_buffered: overlap stepping one half of the envs with inference on the other.
        obs_transform: e.g. an observation normalizer, applied before the policy and storage.
        reward_transform: e.g. a reward scaler, applied to what the learner sees (episode
            statistics always use the env's own rewards).
        timer: a `TimeSplit`-like callable; `timer("env")` and `timer("inference")` are timed.
    """

    def __init__(
        self,
        envs: EnvPool,
        policy: Policy | RecurrentPolicy,
        num_steps: int,
        *,
        device: torch.device | str = "cpu",
        double_buffered: bool = False,
        obs_transform: ObsTransform | None = None,
        reward_transform: RewardTransform | None = None,
        timer: Callable[[str], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        if envs.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
            raise ValueError(
                "the sampler needs an env pool with autoreset_mode='SameStep' (to record the "
                "value of truncated episodes' final observations)"
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
        self._staging = Staging(self.device)  # pinned, non-blocking copies on CUDA
        self.double_buffered = double_buffered
        self.obs_transform, self.reward_transform = obs_transform, reward_transform
        self.timer = timer or (lambda name: contextlib.nullcontext())
        self.episodes = EpisodeTracker(n)
        self.recurrent = bool(getattr(policy, "recurrent", False))
        """Whether the policy has a state, carried here for each env."""
        self._rnn = cast(RecurrentPolicy, policy)  # the policy, used only when recurrent
        self._state: State | None = None  # recurrent: each env's state after its last step
        self._next_state: State | None = None  # double: the state before each env's step T
        self._starts = np.ones(n, bool)  # recurrent: each env's next observation begins an episode
        hidden = None
        if self.recurrent:
            self._state = self._initial_state()
            self._next_state = self._initial_state() if double_buffered else None
            hidden = self._state[0].shape[1]

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
        t, n = num_steps, envs.num_envs
        # Double buffering keeps up to a second rollout of steps taken ahead, plus row T:
        # the observation (and its value) each env is at when the rollout ends.
        self._storage = Rollout.empty(
            2 * t + 1 if double_buffered else t,
            n,
            tuple(obs_space.shape),
            obs_dtype or torch.float32,
            act_shape,
            act_dtype,
            self.device,
            hidden,
        )
        st = self._storage
        if double_buffered:
            self.rollout = Rollout(
                st.obs[:t], st.actions[:t], st.rewards[:t], st.terminated[:t], st.truncated[:t],
                outputs={k: v[:t] for k, v in st.outputs.items()},
                final={k: v[:t] for k, v in st.final.items()},
                next_obs=st.obs[t], next={"values": st.values[t]},
                starts=None if st.starts is None else st.starts[:t], state=st.state,
            )  # fmt: skip
        else:
            self.rollout = st
        self._all = np.arange(n)
        self._sent = np.zeros(n, np.int64)  # double: steps sent in this rollout, per env
        self._fresh = np.zeros(n, bool)  # double: the next recv of this env is its reset
        # double: envs a whole rollout ahead of the others, held until the next rollout opens
        self._held_ids = np.zeros(0, np.int64)
        self._held_obs: list[torch.Tensor] = []
        self._obs: torch.Tensor | None = None  # sync: the observations to act on
        self._started = False

    # ---- public API ---------------------------------------------------------------------------

    def reset(self, seed: SeedLike = None) -> None:
        """Reset every env (env i gets `seed + i`); the next rollout starts from there."""
        self.episodes = EpisodeTracker(self.envs.num_envs)
        self._started = True
        if self.recurrent:
            self._state = self._initial_state()
            self._starts[:] = True
        if self.double_buffered:
            self.envs.async_reset(seed=seed)
            self._sent[:] = 0
            self._fresh[:] = True
            self._held_ids, self._held_obs = np.zeros(0, np.int64), []
            return
        obs, _ = self.envs.reset(seed=seed)
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
        for t in range(self.num_steps):
            actions = self._act(t, self._all, self._obs)
            with self.timer("env"):
                result = self.envs.step(actions)
            obs = self._record(t, self._all, result)
            self._obs = obs
        assert self._obs is not None
        r.next_obs.copy_(self._obs)
        with self.timer("inference"):
            if self.recurrent:  # the state carries on: this step is not taken here
                starts = torch.as_tensor(self._starts, device=self.device).unsqueeze(0)
                _, value, _ = self._rnn.unroll(self._obs.unsqueeze(0), starts, self._state)
            else:
                value = self.policy.value(self._obs)
            r.next_value.copy_(value)
        return r

    # ---- double buffering ---------------------------------------------------------------------

    def _collect_double(self) -> None:
        t = self.num_steps
        ahead = int(self._sent.max()) - t
        if ahead > 0:  # steps taken past the last rollout open this one
            st = self._storage
            bufs = [st.obs, st.actions, st.rewards, st.terminated, st.truncated,
                    *st.outputs.values(), *st.final.values()]  # fmt: skip
            for buf in bufs if st.starts is None else [*bufs, st.starts]:
                buf[:ahead] = buf[t : t + ahead].clone()  # a held env's rows overlap row t
            if st.state is not None:  # every env took its step T, this rollout's step 0
                assert self._next_state is not None
                st.state[0].copy_(self._next_state[0])
                st.state[1].copy_(self._next_state[1])
        self._sent -= np.minimum(self._sent, t)
        if len(self._held_ids):  # their observations open this rollout's step t + 1
            ids, obs = self._held_ids, torch.cat(self._held_obs)
            self._held_ids, self._held_obs = np.zeros(0, np.int64), []
            self._send(ids, obs)
        # An env's results for step s arrive when sent = s + 1; the rollout is complete when
        # every env has sent step t (the row holding its next observation and value).
        while self._sent.min() <= t:
            with self.timer("env"):
                result = self.envs.recv()
            ids = np.asarray(result[4]["env_id"], np.int64)
            fresh = self._fresh[ids]  # their first observation after async_reset()
            self._fresh[ids] = False
            obs = self._record(self._sent[ids] - 1, ids, result, keep=~fresh)
            over = self._sent[ids] > 2 * t  # a whole rollout ahead: no row left for them
            if over.any():  # the pool's scheduling passed others over; hold these envs back
                in_flight = len(self._all) - len(self._held_ids) - int(over.sum())
                if in_flight < self.envs.batch_size:
                    raise RuntimeError(
                        "envs ran a whole rollout ahead of the others and too few are left in "
                        "flight to fill a batch; the pool starves some envs"
                    )
                keep = torch.as_tensor(over, device=obs.device)
                self._held_ids = np.concatenate([self._held_ids, ids[over]])
                self._held_obs.append(obs[keep])
                ids, obs = ids[~over], obs[~keep]
            if len(ids):
                self._send(ids, obs)

    def _send(self, ids: np.ndarray, obs: torch.Tensor) -> None:
        """Act for envs `ids` at their next rows and send them a step."""
        actions = self._act(self._sent[ids], ids, obs)
        with self.timer("env"):
            self.envs.send(actions, ids.astype(np.int32))
        self._sent[ids] += 1

    # ---- pieces -------------------------------------------------------------------------------

    def _act(self, rows: Any, ids: np.ndarray, obs: torch.Tensor | None) -> np.ndarray:
        """Choose actions for envs `ids` at step `rows` (an int or one per env) and store them."""
        assert obs is not None
        st = self._storage
        index = self._index(rows, ids)
        with self.timer("inference"):
            if self.recurrent:
                action, logprob, value = self._step(rows, ids, index, obs)
            else:
                action, logprob, value = self.policy.act(obs)
            st.obs[index] = obs
            st.actions[index] = action
            st.logprobs[index] = logprob
            st.values[index] = value
            out = action.cpu().numpy()
        if self._clip is not None:
            out = np.clip(out, *self._clip)
        return out

    def _step(
        self, rows: Any, ids: np.ndarray, index: tuple[Any, Any], obs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A recurrent policy's step for envs `ids` at step `rows`: their states advance here, and
        the state before step 0 (or, double-buffered, before step T: the next rollout's 0) is
        kept for the rollout."""
        assert self._state is not None
        st = self._storage
        assert st.starts is not None and st.state is not None
        starts = torch.as_tensor(self._starts[ids], device=self.device)
        st.starts[index] = starts
        if isinstance(rows, int):  # sync: every env at once
            action, logprob, value, state = self._rnn.step(obs, starts, self._state)
            assert state is not None
            self._state = state
            return action, logprob, value
        env = index[1]
        assert self._next_state is not None
        for row, keep in ((0, st.state), (self.num_steps, self._next_state)):
            at = env[torch.as_tensor(rows == row)]
            if len(at):
                keep[0][at] = self._state[0][at]
                keep[1][at] = self._state[1][at]
        mine = (self._state[0][env], self._state[1][env])
        action, logprob, value, state = self._rnn.step(obs, starts, mine)
        assert state is not None
        self._state[0][env] = state[0]
        self._state[1][env] = state[1]
        return action, logprob, value

    def _initial_state(self) -> State:
        state = self._rnn.initial_state(self.envs.num_envs, self.device)
        if state is None:
            raise ValueError("a recurrent policy's initial_state() gave no state")
        return state

    def _record(
        self, rows: Any, ids: np.ndarray, result: tuple[Any, ...], keep: Any = None
    ) -> torch.Tensor:
        """Store the results of step `rows` of envs `ids` (only where `keep`, if given: the
        others are first observations, not results); return all the next observations."""
        obs, reward, terminated, truncated, info = result
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        reward = np.asarray(reward, np.float32)
        batch_ids = ids
        if keep is not None and not keep.all():
            if not keep.any():
                return self._to_device(obs, update=True)
            rows, ids, reward = rows[keep], ids[keep], reward[keep]
            terminated, truncated = terminated[keep], truncated[keep]
            positions = np.flatnonzero(keep)
        else:
            positions = None
        ends = np.logical_or(terminated, truncated)
        self.episodes.update(ids, reward, ends, info)
        if self.recurrent:
            self._starts[ids] = ends
        if self.reward_transform is not None:
            reward = self.reward_transform(reward, ends, ids)
        final = np.zeros(len(ids), np.float32)
        cut = np.flatnonzero(np.logical_and(truncated, np.logical_not(terminated)))
        if cut.size:
            at = cut if positions is None else positions[cut]
            final[cut] = self._final_values(info, at, batch_ids[at])
        st = self._storage
        index = self._index(rows, ids)
        for buf, x in ((st.rewards, np.asarray(reward, np.float32)), (st.terminated, terminated),
                       (st.truncated, truncated), (st.final["values"], final)):  # fmt: skip
            buf[index] = self._staging(x)
        return self._to_device(obs, update=True)

    def _index(self, rows: Any, ids: np.ndarray) -> tuple[Any, Any]:
        """Where step `rows` of envs `ids` lives in the (T, N, ...) storage: a plain row for sync
        sampling (step `rows` of every env), gathered (row, env) pairs for double buffering (index
        tensors staged to the device: no host wait)."""
        if isinstance(rows, int):
            return rows, slice(None)
        return self._staging(np.asarray(rows, np.int64)), self._staging(np.asarray(ids, np.int64))

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
                values = self.policy.value(final_t)
        return values.cpu().numpy()

    def _to_device(self, obs: np.ndarray, update: bool) -> torch.Tensor:
        if self.obs_transform is not None:
            obs = self.obs_transform(obs, update)
        return self._staging(obs)
