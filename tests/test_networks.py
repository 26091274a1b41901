"""ActorCritic's LSTM core: replaying a sequence equals stepping it, episode starts zero the
state, and feed-forward nets pass through the same interface; QNetwork's two initializations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn
from torch.distributions import Categorical, Normal

from onebox.nn.networks import ActorCritic
from onebox.nn.q_networks import QNetwork

VEC = spaces.Box(-1, 1, (4,), np.float32)


def test_unroll_equals_stepping_and_starts_zero_the_state() -> None:
    torch.manual_seed(0)
    net = ActorCritic(VEC, spaces.Discrete(3), lstm=16)
    obs = torch.randn(6, 3, 4)
    starts = torch.zeros(6, 3, dtype=torch.bool)
    starts[3, 1] = True
    state0 = (torch.randn(3, 16), torch.randn(3, 16))
    dist, values, state = net.unroll(obs, starts, state0)
    stepped, s = [], state0
    for t in range(6):
        _, _, v, s = net.step(obs[t], starts[t], s)
        stepped.append(v)
    torch.testing.assert_close(torch.stack(stepped).flatten(), values)
    torch.testing.assert_close(s[0], state[0])
    # From the start flag on, env 1 forgets everything before: a fresh zero state gives the same.
    _, tail, _ = net.unroll(obs[3:, 1:2], None, net.initial_state(1))
    torch.testing.assert_close(tail, values.view(6, 3)[3:, 1])
    # Without the flag the past matters.
    _, carried, _ = net.unroll(obs, None, state0)
    assert not torch.allclose(carried.view(6, 3)[3:, 1], tail)
    assert dist.logits.shape == (18, 3)


def test_recurrent_image_net_and_gradients() -> None:
    net = ActorCritic(spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6), lstm=32)
    obs = torch.randint(0, 255, (2, 3, 4, 84, 84), dtype=torch.uint8)
    dist, values, _ = net.unroll(obs, torch.zeros(2, 3, dtype=torch.bool), net.initial_state(3))
    (values.sum() + dist.entropy().sum()).backward()
    assert net.core is not None and net.core.weight_hh_l0.grad is not None
    assert values.shape == (6,)


def test_feed_forward_nets_share_the_interface() -> None:
    net = ActorCritic(VEC, spaces.Box(-1, 1, (2,), np.float32))
    assert not net.recurrent and net.initial_state(5) is None
    obs = torch.randn(4, 5, 4)
    _, values, state = net.unroll(obs, None, None)
    assert state is None
    torch.testing.assert_close(values, net.value(obs.flatten(0, 1)))
    action, _, _, _ = net.step(obs[0], None, None)
    assert action.shape == (5, 2)


def test_actions_are_drawn_and_scored_as_the_distributions_do() -> None:
    """`ActorCritic.sample` against torch's distributions: discrete actions are the draws
    `Categorical(logits).sample()` makes from the same random state, their log-probabilities
    its `log_prob`, the mode the argmax; continuous ones those of `Normal`, the mode its mean."""
    net = ActorCritic(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(6))
    out = torch.randn(4096, 6, generator=torch.Generator().manual_seed(0)) * 3
    torch.manual_seed(1)
    action, logprob = net.sample(out)
    torch.manual_seed(1)
    d = Categorical(logits=out)
    expected = d.sample()
    assert torch.equal(action, expected) and action.dtype == expected.dtype
    assert torch.equal(logprob, d.log_prob(action))  # to the bit: runs act as they did
    mode, mode_logprob = net.sample(out, deterministic=True)
    assert torch.equal(mode, out.argmax(-1))
    assert torch.equal(mode_logprob, d.log_prob(mode))
    obs = torch.randn(5, 3)
    torch.manual_seed(2)
    a, lp, v = net.act(obs)
    torch.manual_seed(2)
    d, value = net.dist(obs)
    assert torch.equal(a, d.sample()) and torch.equal(lp, d.log_prob(a))
    torch.testing.assert_close(v, value)

    cont = ActorCritic(spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-1, 1, (2,), np.float32))
    with torch.no_grad():
        cont.log_std.uniform_(-1.0, 0.5)
    mean = torch.randn(7, 2)
    torch.manual_seed(3)
    action, logprob = cont.sample(mean)
    torch.manual_seed(3)
    normal = Normal(mean, cont.log_std.exp().expand_as(mean))
    assert torch.equal(action, normal.sample())
    assert torch.equal(logprob, normal.log_prob(action).sum(-1))
    mode, mode_logprob = cont.sample(mean, deterministic=True)
    assert torch.equal(mode, mean)
    assert torch.equal(mode_logprob, normal.log_prob(mean).sum(-1))


def test_recurrent_misuse_is_a_clear_error() -> None:
    net = ActorCritic(VEC, spaces.Discrete(2), lstm=8)
    with pytest.raises(TypeError, match="LSTM core"):
        net.act(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="state before step 0"):
        net.unroll(torch.zeros(1, 2, 4), None, None)
    with pytest.raises(ValueError, match="lstm"):
        ActorCritic(VEC, spaces.Discrete(2), lstm=0)


@pytest.mark.parametrize(
    "obs_space", [VEC, spaces.Box(0, 1, (10, 10, 4), np.bool_)], ids=["mlp", "minatar"]
)
def test_q_network_initializations(obs_space: spaces.Box) -> None:
    """`orthogonal`: orthogonal rows of norm sqrt(2), zero biases; `torch`: PyTorch's default,
    weights and biases uniform within 1/sqrt(fan_in) and the biases not zero."""
    torch.manual_seed(0)
    nets = {
        init: QNetwork(obs_space, spaces.Discrete(6), init=init) for init in ("orthogonal", "torch")
    }
    for init, net in nets.items():
        layers = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        assert len(layers) == 3
        for layer in layers:
            weight = layer.weight.detach().flatten(1)
            fan_in = weight.shape[1]
            if init == "orthogonal":
                assert torch.count_nonzero(layer.bias) == 0
                rows = weight if weight.shape[0] <= fan_in else weight.T
                torch.testing.assert_close(rows @ rows.T, 2 * torch.eye(len(rows)))
            else:
                bound = 1 / math.sqrt(fan_in)
                assert weight.abs().max() <= bound and layer.bias.abs().max() <= bound
                assert torch.count_nonzero(layer.bias) == len(layer.bias)
