"""The trajectory record, `Rollout`: T steps of N envs, filled by the on-policy sampler (torch
tensors on the learner's device) and by the actor-learner's actors (numpy arrays, an "unroll").
Also the truncation bootstrap and GAE, which learners apply to it in their own transform.

The record keeps what happened, nothing folded in: the rewards as the env (or the sampler's
reward transform) gave them, `terminated` and `truncated` apart, and the policy's outputs at the
final observation of every truncated episode (`final`; its value is the bootstrap input, computed
where the policy's state for that episode is at hand). The env pool runs in same-step autoreset
mode, so where an episode ended at step t, `obs[t + 1]` is already the next episode's first
observation. Each learner bootstraps truncation once, with `bootstrapped_rewards`, then cuts its
returns at every end (`ends`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

Array = Any
"""A numpy array (actors) or a torch tensor (the sampler)."""


@dataclasses.dataclass
class Rollout:
    """(T, N, ...) arrays: what each of N envs saw and did at each of T steps.

    Named outputs of the policy are kept in dicts (`outputs`, `final`, `next`) and readable as
    properties for the common ones: `logprobs`, `values`, `final_values`, `next_value`.
    """

    obs: Array
    actions: Array
    rewards: Array
    """The rewards as they came (after the sampler's reward transform); nothing bootstrapped."""
    terminated: Array
    """The episode reached a terminal state with this step (no bootstrap)."""
    truncated: Array
    """The episode was cut with this step (a time limit): its value goes on after it."""
    outputs: dict[str, Array]
    """The policy's named outputs at each step's observation (`logprobs` and `values`, or `q`)."""
    final: dict[str, Array]
    """The policy's outputs at the final observation of a truncated (not terminated) step, zeros
    elsewhere: the bootstrap input (see `bootstrapped_rewards`)."""
    next_obs: Array
    """(N, ...): the observations after the last step, where the next rollout starts."""
    next: dict[str, Array] = dataclasses.field(default_factory=dict)
    """The policy's outputs at `next_obs`, (N, ...) (the sampler: `values`); empty for actors,
    whose learner evaluates `next_obs` itself."""
    starts: Array | None = None
    """Recurrent policies (and every actor's rollout): (T, N) bool, `starts[t, i]` when obs[t, i]
    begins an episode (the LSTM state is zeroed before it)."""
    state: tuple[Array, Array] | None = None
    """Recurrent policies only: each env's LSTM state `(h, c)` before step 0, each (N, hidden),
    as the policy carried it (before `starts[0]` zeroes any of it)."""
    versions: Array | None = None
    """Actors: the weights' version that chose each action."""
    final_obs: Array | None = None
    """Actors: the observation each step led to: the final one where the episode ended, else
    obs[t + 1]."""
    returns: list[float] = dataclasses.field(default_factory=list)
    """Actors: returns of the episodes that ended in this rollout."""
    lengths: list[int] = dataclasses.field(default_factory=list)
    """Actors: their lengths."""

    @classmethod
    def empty(
        cls,
        num_steps: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: torch.dtype,
        action_shape: tuple[int, ...],
        action_dtype: torch.dtype,
        device: torch.device,
        hidden: int | None = None,
    ) -> Rollout:
        """The sampler's preallocated buffers, reused by every rollout; with `hidden` (an LSTM's
        size) also `starts` and the initial `state`."""
        t, n = num_steps, num_envs

        def z(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            obs=z(t, n, *obs_shape, dtype=obs_dtype),
            actions=z(t, n, *action_shape, dtype=action_dtype),
            rewards=z(t, n),
            terminated=z(t, n, dtype=torch.bool),
            truncated=z(t, n, dtype=torch.bool),
            outputs={"logprobs": z(t, n), "values": z(t, n)},
            final={"values": z(t, n)},
            next_obs=z(n, *obs_shape, dtype=obs_dtype),
            next={"values": z(n)},
            starts=None if hidden is None else z(t, n, dtype=torch.bool),
            state=None if hidden is None else (z(n, hidden), z(n, hidden)),
        )

    @classmethod
    def from_arrays(
        cls, a: dict[str, np.ndarray], returns: list[float], lengths: list[int]
    ) -> Rollout:
        """An actor's rollout from the arrays `ActorSpec.arrays` names (taken as they are, not
        copied): "out.K" and "final.K" are output K at each step and at final observations."""
        keys = ("obs", "actions", "rewards", "terminated", "truncated", "starts", "versions",
                "final_obs", "next_obs")  # fmt: skip
        return cls(
            **{k: a[k] for k in keys},
            outputs={k[4:]: v for k, v in a.items() if k.startswith("out.")},
            final={k[6:]: v for k, v in a.items() if k.startswith("final.")},
            state=(a["h"], a["c"]) if "h" in a else None,
            returns=returns,
            lengths=lengths,
        )

    @property
    def ends(self) -> Array:
        """The episode ended with this step (terminated or truncated)."""
        return self.terminated | self.truncated

    @property
    def logprobs(self) -> Array:
        """The behaviour policy's log-probabilities of the actions taken."""
        return self.outputs["logprobs"]

    @property
    def values(self) -> Array:
        """V(obs) (for PQN: max_a Q(obs, a))."""
        return self.outputs["values"]

    @property
    def final_values(self) -> Array:
        """V(final observation) of truncated steps, zeros elsewhere."""
        return self.final["values"]

    @property
    def next_value(self) -> Array:
        """V(next_obs), (N,)."""
        return self.next["values"]

    @property
    def num_steps(self) -> int:
        """T."""
        return self.obs.shape[0]

    @property
    def num_envs(self) -> int:
        """N."""
        return self.obs.shape[1]

    @property
    def env_steps(self) -> int:
        """Env steps in the rollout: T x N."""
        return self.num_steps * self.num_envs

    def envs(self, first: int, stop: int) -> Rollout:
        """Envs `first` to `stop` - 1 of a sampler's rollout, as views of its buffers: one
        population member's share of a rollout of every member's envs."""
        cut = slice(first, stop)
        return Rollout(
            self.obs[:, cut], self.actions[:, cut], self.rewards[:, cut],
            self.terminated[:, cut], self.truncated[:, cut],
            outputs={k: v[:, cut] for k, v in self.outputs.items()},
            final={k: v[:, cut] for k, v in self.final.items()},
            next_obs=self.next_obs[cut], next={k: v[cut] for k, v in self.next.items()},
            starts=None if self.starts is None else self.starts[:, cut],
            state=None if self.state is None else (self.state[0][cut], self.state[1][cut]),
        )  # fmt: skip

    def bootstrapped_rewards(self, gamma: float, output: str = "values") -> Array:
        """`bootstrapped_rewards` of this rollout, from its final `output` values: the learner's
        transform, before it cuts its returns at `ends`."""
        return bootstrapped_rewards(
            self.rewards, self.terminated, self.truncated, self.final[output], gamma
        )


def bootstrapped_rewards(
    rewards: Array, terminated: Array, truncated: Array, final_values: Array, gamma: float
) -> Array:
    """The one place truncation is bootstrapped: a truncated (not terminated) step's reward
    becomes r + gamma * V(final observation); then `ends` may cut the returns at every end."""
    return rewards + gamma * final_values * (truncated & ~terminated)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    ends: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimates and returns (advantages + values), both (T, N), from
    bootstrapped rewards (`Rollout.bootstrapped_rewards`).

    delta_t = r_t + gamma * V_{t+1} * (1 - end_t) - V_t;  A_t = delta_t + gamma * lam * (1 - end_t) * A_{t+1}
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    keep = 1.0 - ends.float()
    for t in reversed(range(num_steps)):
        next_v = next_value if t == num_steps - 1 else values[t + 1]
        delta = rewards[t] + gamma * next_v * keep[t] - values[t]
        last = delta + gamma * lam * keep[t] * last
        advantages[t] = last
    return advantages, advantages + values
