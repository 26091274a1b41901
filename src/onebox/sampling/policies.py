"""The policies actors act with and the weights they reload.

- `actor_critic_policy`: an `ActorCritic` as a `PolicyFn` (served by the inference server, or run
  by an actor itself); `ACTOR_CRITIC_OUTPUTS` names what it outputs besides actions.
- `Weights` (actor threads) and `SharedWeights` (actor processes, through shared memory): the
  learner's latest published weights and their version.
- `LocalPolicy`: an actor's own copy of the network (`--inference local`, Ape-X's actors, the
  actor hosts on Ray), reloaded whenever the learner has published newer weights.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import nn

from onebox.envs.shm import Block, Layout
from onebox.nn.accel import to_host
from onebox.sampling.actor_client import InferResult, OutputSpec
from onebox.sampling.env_states import EnvStates
from onebox.sampling.inference import PolicyFn


def actor_critic_policy(net: Any) -> PolicyFn:
    """An `ActorCritic` as the inference server's policy: outputs `actions`, `logprobs` and
    `values` (see `ACTOR_CRITIC_OUTPUTS`); with an LSTM also its new state."""
    if net.recurrent:

        def recurrent(obs: torch.Tensor, actor_ids: Any, env_ids: Any, state: Any) -> Any:
            action, logprob, value, state1 = net.step(obs, None, state)
            return {"actions": action, "logprobs": logprob, "values": value}, state1

        return recurrent

    def feed_forward(obs: torch.Tensor, actor_ids: Any, env_ids: Any) -> dict[str, torch.Tensor]:
        action, logprob, value = net.act(obs)
        return {"actions": action, "logprobs": logprob, "values": value}

    return feed_forward


ACTOR_CRITIC_OUTPUTS: OutputSpec = {"logprobs": ((), np.float32), "values": ((), np.float32)}
"""What `actor_critic_policy` outputs besides actions: behaviour log-probabilities and V(obs)."""


class Weights:
    """The learner's latest published weights, `(version, state_dict)`, for local inference."""

    def __init__(self, net: nn.Module, version: int) -> None:
        self.latest: tuple[int, dict[str, torch.Tensor]] = (version, {})
        self.publish(net, version)

    def publish(self, net: nn.Module, version: int) -> None:
        """Snapshot `net`'s weights as `version` (one atomic attribute swap)."""
        self.latest = (version, {k: v.detach().clone() for k, v in net.state_dict().items()})


class SharedWeights:
    """`Weights` for actors in other processes: each tensor of the network's state dict as an
    array of one shared-memory block, beside the version and a sequence count. The learner
    `publish`es in place (the count is odd while it writes); an actor's `latest` copies the
    block out only when the version has moved, and again if a publish overlapped the copy (a
    seqlock: one writer, any number of readers, nobody waits for a lock)."""

    def __init__(self, layout: Layout, name: str | None = None) -> None:
        self.block = Block(layout, name=name)
        self.a = self.block.arrays
        self._latest: tuple[int, dict[str, torch.Tensor]] = (-1, {})
        self._copies: tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        """The network last published and (its array in the block, its tensor) pairs."""

    @classmethod
    def create(cls, net: nn.Module, version: int) -> SharedWeights:
        """A new block holding `net`'s weights as `version` (the learner's side)."""
        state = net.state_dict()
        arrays = [
            (f"w.{k}", tuple(v.shape), v.detach().cpu().numpy().dtype) for k, v in state.items()
        ]
        weights = cls(Layout.plan([*arrays, ("version", (1,), np.int64), ("seq", (1,), np.int64)]))
        weights.publish(net, version)
        return weights

    def publish(self, net: nn.Module, version: int) -> None:
        """Write `net`'s weights as `version`. The tensors of a network published before are
        reused (an optimizer and `load_state_dict` change them in place)."""
        if self._copies is None or self._copies[0] is not net:
            pairs = [(torch.from_numpy(self.a[f"w.{k}"]), v) for k, v in net.state_dict().items()]
            self._copies = (net, pairs)
        seq = self.a["seq"]
        seq[0] += 1  # odd: a reader that started its copy now will copy again
        with torch.no_grad():
            for array, tensor in self._copies[1]:
                array.copy_(tensor)
        self.a["version"][0] = version
        seq[0] += 1

    @property
    def latest(self) -> tuple[int, dict[str, torch.Tensor]]:
        """`(version, state_dict)` of the newest weights (the actor's side)."""
        if int(self.a["version"][0]) == self._latest[0]:
            return self._latest
        while True:
            before = int(self.a["seq"][0])
            if before % 2 == 0:
                state = {k[2:]: torch.from_numpy(v.copy()) for k, v in self.a.items()
                         if k.startswith("w.")}  # fmt: skip
                version = int(self.a["version"][0])
                if int(self.a["seq"][0]) == before:
                    self._latest = (version, state)
                    return self._latest
            time.sleep(0.0001)

    def close(self, unlink: bool = False) -> None:
        """Drop this process's mapping; `unlink`: free the block (the learner, at the end)."""
        self.a, self._copies, self._latest = {}, None, (-1, {})
        self.block.close(unlink=unlink)


class LocalPolicy:
    """Actor-side inference (IMPALA, and every actor host on Ray): a copy of the network,
    reloaded whenever the learner has published newer weights. `policy`: the copy as a
    `PolicyFn` (default: `actor_critic_policy(net)`). With `lstm` (the recurrent policy's state
    size) each env's state is kept here as the inference server keeps it (`EnvStates`)."""

    def __init__(self, weights: Weights, net: Any, actor_id: int = 0, policy: PolicyFn | None = None,
                 lstm: int | None = None) -> None:  # fmt: skip
        self.weights, self.net, self.version = weights, net, -1
        self.policy = policy or actor_critic_policy(net)
        self.device = next(net.parameters()).device
        self.states = EnvStates(lstm, self.device) if lstm is not None else None
        self.actor_id = actor_id

    @torch.no_grad()
    def __call__(self, ids: np.ndarray, obs: np.ndarray, starts: np.ndarray) -> InferResult:
        version, weights = self.weights.latest
        if version != self.version:
            self.net.load_state_dict(weights)
            self.version = version
        x = torch.as_tensor(obs, device=self.device)
        if self.states is None:
            rows = torch.as_tensor(ids, device=self.device)
            out = self.policy(x, torch.full_like(rows, self.actor_id), rows)
            fetch = out
        else:
            rows, state0 = self.states.before(ids, starts)
            out, state1 = self.policy(x, torch.full_like(rows, self.actor_id), rows, state0)
            self.states.after(rows, state1)
            fetch = {**out, "state.h": state0[0], "state.c": state0[1]}
        outputs = to_host(fetch)  # one wait for the device
        start = None
        if self.states is not None:
            start = (outputs.pop("state.h"), outputs.pop("state.c"))
        return InferResult(outputs.pop("actions"), outputs, version, start)
