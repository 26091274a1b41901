"""Several feed-forward actor-critics of one architecture computed as one: their parameters
stacked (a leading net axis on every tensor) and one vmapped forward pass (`torch.func.vmap`
over `functional_call`) giving every net's outputs for its own rows at once, where one call per
net would launch each layer's kernels once per net.

`StackedNets` is that forward. Its `weights()` stack the nets' current parameters with
`torch.stack`, so a loss of the stacked outputs sends each net's gradients to its own
parameters (a population's batched update, `onebox.algos.ppo.update_together`).

`StackedPolicy` is the sampler's routed policy (`onebox.sampling.sampler.RoutedPolicy`) for a
population whose members share one env pool (`onebox.pbt.shared`): net k acts for envs
`k * envs_per_net` to `(k + 1) * envs_per_net - 1`. Its stack is a copy: `refresh()` takes the
nets' current weights (after their updates, before the next rollout). Discrete actions only
(a Gaussian's standard deviation is a parameter of each net: drawn net by net it would need a
stacked sample too).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from onebox.nn.networks import ActorCritic

Weights = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]
"""Stacked parameters and buffers, by name (`StackedNets.weights`)."""


class _Heads(nn.Module):
    """A net's `outputs` as its forward (what `functional_call` calls)."""

    def __init__(self, net: ActorCritic) -> None:
        super().__init__()
        self.net = net

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net.outputs(obs)


class StackedNets:
    """`nets` (feed-forward `ActorCritic`s of one architecture) as one forward over a leading
    net axis (see the module's docstring)."""

    def __init__(self, nets: Sequence[ActorCritic]) -> None:
        if any(net.recurrent for net in nets):
            raise ValueError(
                "stacked nets are feed-forward (a recurrent core's state is not stacked)"
            )
        self.nets = list(nets)
        self._base = _Heads(copy.deepcopy(self.nets[0]).to("meta"))
        heads = [_Heads(net) for net in self.nets]  # the nets' own tensors, under `_base`'s names
        self._params = [dict(h.named_parameters()) for h in heads]
        self._buffers = [dict(h.named_buffers()) for h in heads]

        def forward(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                    obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
            return torch.func.functional_call(self._base, (params, buffers), (obs,))

        self._forward = torch.func.vmap(forward)

    def weights(self) -> Weights:
        """The nets' current parameters and buffers, each stacked along a new first axis
        (`torch.stack`: differentiable into each net's own parameters; a copy)."""

        def stack(named: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
            return {name: torch.stack([n[name] for n in named]) for name in named[0]}

        return stack(self._params), stack(self._buffers)

    def __call__(self, weights: Weights, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every net's (actor head output, value) on its own rows: `obs` (nets, rows, ...) ->
        (nets, rows, ...) and (nets, rows)."""
        return self._forward(*weights, obs)


class StackedPolicy:
    """`nets` (feed-forward `ActorCritic`s of one architecture, discrete actions) acting for
    `envs_per_net` envs each, in one call (see the module's docstring); `autocast` is the
    context the forward runs under (a run's precision)."""

    routed = True

    def __init__(
        self,
        nets: Sequence[ActorCritic],
        envs_per_net: int,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> None:
        if any(net.recurrent for net in nets) or not all(net.discrete for net in nets):
            raise ValueError("a stacked policy takes feed-forward nets with discrete actions")
        self.nets, self.envs, self.autocast = list(nets), envs_per_net, autocast
        self.num_envs = len(self.nets) * envs_per_net
        self.stacked = StackedNets(self.nets)
        self._every = np.arange(self.num_envs)
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Stack the nets' current weights."""
        self.weights = self.stacked.weights()

    def _all(self, ids: np.ndarray) -> bool:
        """Whether `ids` are every env, in order."""
        return len(ids) == self.num_envs and np.array_equal(ids, self._every)

    def _stacked(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every net's (actor head output, value) for its envs' rows of `obs` (all envs), as
        (num_envs, ...) and (num_envs,)."""
        with self.autocast():
            out, value = self.stacked(self.weights,
                                      obs.view(len(self.nets), self.envs, *obs.shape[1:]))  # fmt: skip
        return out.flatten(0, 1), value.flatten()

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, ids: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action, log-probability, value) of every env, `ids` all of them in order."""
        if not self._all(ids):
            raise ValueError(
                f"a stacked policy acts for all its {self.num_envs} envs at once, in order "
                "(the sync sampler)"
            )
        out, value = self._stacked(obs)
        action, logprob = self.nets[0].sample(out)  # the logits alone: any net's
        return action, logprob, value

    @torch.no_grad()
    def value(self, obs: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        """V(obs) of envs `ids` (every env, or a few: truncated episodes' final observations),
        each by its own net."""
        if self._all(ids):
            return self._stacked(obs)[1]
        values = torch.empty(len(ids), device=obs.device)
        owners = np.asarray(ids) // self.envs
        with self.autocast():
            for k in np.unique(owners):
                rows = torch.as_tensor(np.flatnonzero(owners == k), device=obs.device)
                values[rows] = self.nets[k].value(obs[rows])
        return values
