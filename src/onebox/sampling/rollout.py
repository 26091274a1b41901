"""A fixed-length rollout of T steps from N envs, kept on the learner's device, and GAE."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class Rollout:
    """Tensors of shape (T, N, ...): what each env saw and did at each step.

    `ends[t, i]` is true when env i's episode ended at step t (terminated or truncated); the env
    pool runs in same-step autoreset mode, so `obs[t + 1, i]` is then the first observation of the
    next episode. A truncated step's reward already includes `gamma * V(final observation)`, so
    `ends` can cut bootstrapping for both kinds of endings.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    ends: torch.Tensor
    next_obs: torch.Tensor
    """Observations after the last step, (N, ...): where the next rollout starts."""
    next_value: torch.Tensor
    """V(next_obs), (N,)."""
    starts: torch.Tensor | None = None
    """Recurrent policies only: (T, N) bool, `starts[t, i]` when obs[t, i] begins an episode (the
    LSTM state is zeroed before it)."""
    state: tuple[torch.Tensor, torch.Tensor] | None = None
    """Recurrent policies only: each env's LSTM state `(h, c)` before step 0, each (N, hidden), as
    the policy carried it (before `starts[0]` zeroes any of it)."""

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
        """Preallocated buffers, reused by every rollout; with `hidden` (an LSTM's size) also
        `starts` and the initial `state`."""
        t, n = num_steps, num_envs

        def z(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            obs=z(t, n, *obs_shape, dtype=obs_dtype),
            actions=z(t, n, *action_shape, dtype=action_dtype),
            logprobs=z(t, n),
            values=z(t, n),
            rewards=z(t, n),
            ends=z(t, n, dtype=torch.bool),
            next_obs=z(n, *obs_shape, dtype=obs_dtype),
            next_value=z(n),
            starts=None if hidden is None else z(t, n, dtype=torch.bool),
            state=None if hidden is None else (z(n, hidden), z(n, hidden)),
        )

    @property
    def num_steps(self) -> int:
        return self.obs.shape[0]

    @property
    def num_envs(self) -> int:
        return self.obs.shape[1]


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    ends: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimates and returns (advantages + values), both (T, N).

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
