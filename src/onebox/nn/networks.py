"""Networks: Nature CNN for images, MinAtar's small CNN for MinAtar's bool grids, MLP for vectors,
CleanRL's initialization, and the actor-critic of the policy-gradient learners (the Q-learning
family's networks, built on these torsos, are in `onebox.nn.q_networks`).

`ActorCritic` takes observations as the env pool returns them (uint8 images are scaled by 1/255
inside the network, so rollouts keep them as uint8; bool grids become float channels inside the
network) and gives a categorical policy for `Discrete` actions or a Gaussian with a
state-independent log std for `Box` actions.

With `lstm=H` an LSTM core of H units sits between the torso and the heads (CleanRL's
ppo_atari_lstm, IMPALA's recurrent agent). Its state `(h, c)`, each (envs, H), is carried by the
caller: `step` acts one step for a batch of envs, `unroll` replays a (T, envs) sequence for the
learner. `starts[t, i]` says observation t of env i begins an episode, so env i's state is zeroed
before it. Both methods also work on feed-forward nets (the state is then `None`), so a learner can
use them whatever the core.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.distributions import Categorical, Normal

from onebox.nn.accel import scale_images

State = tuple[torch.Tensor, torch.Tensor]
"""An LSTM state `(h, c)`, each of shape (envs, hidden)."""

LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))
"""log(sqrt(2 pi)), as `torch.distributions.Normal.log_prob` computes it."""


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain `std`, constant bias (PPO's standard initialization)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


Init = Literal["orthogonal", "torch"]
"""A network's initialization: `orthogonal` (`layer_init`: gain sqrt(2), zero biases, as CleanRL's
PPO and PQN) or `torch` (PyTorch's own default for each layer, as CleanRL's DQN and the MinAtar
paper's DQN)."""


def torch_init(net: nn.Module) -> nn.Module:
    """Give every convolution and linear layer of `net` PyTorch's default initialization again
    (uniform weights and biases scaled by the fan-in), undoing `layer_init`."""
    for layer in net.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            layer.reset_parameters()
    return net


class NatureCNN(nn.Module):
    """DQN's Nature conv stack (32x8x8/4, 64x4x4/2, 64x3x3/1) and a 512-unit layer, ReLU; with
    `layer_norm` each layer's output is layer-normalized before its ReLU (PQN's network)."""

    def __init__(
        self, obs_shape: tuple[int, ...], hidden: int = 512, layer_norm: bool = False
    ) -> None:
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(f"NatureCNN takes (channels, height, width) images, got {obs_shape}")
        shape = tuple(obs_shape)
        layers: list[nn.Module] = []
        for channels, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            layers.append(layer_init(nn.Conv2d(shape[0], channels, kernel, stride=stride)))
            shape = (channels, *((size - kernel) // stride + 1 for size in shape[1:]))
            layers += [nn.LayerNorm(list(shape))] if layer_norm else []
            layers.append(nn.ReLU())
        self.convs = nn.Sequential(*layers, nn.Flatten())
        flat = int(np.prod(shape))
        norm = [nn.LayerNorm(hidden)] if layer_norm else []
        self.fc = nn.Sequential(layer_init(nn.Linear(flat, hidden)), *norm, nn.ReLU())
        self.out_features = hidden
        # Channels-last convolutions: 1.46x faster forward+backward on CPU (oneDNN) here.
        self.convs.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(x.contiguous(memory_format=torch.channels_last)))


class MinAtarCNN(nn.Module):
    """The network of the MinAtar paper (Young and Tian 2019): one 3x3 conv of 16 channels,
    stride 1, ReLU, then a `hidden`-unit (128) layer, ReLU; with `layer_norm` each layer's output
    is layer-normalized before its ReLU (as `NatureCNN`'s). It takes MinAtar's (height, width,
    channels) bool grids and makes them float channels-first inside, unscaled."""

    def __init__(
        self, obs_shape: tuple[int, ...], hidden: int = 128, layer_norm: bool = False
    ) -> None:
        super().__init__()
        if len(obs_shape) != 3 or min(obs_shape[:2]) < 3:
            raise ValueError(
                f"MinAtarCNN takes (height, width, channels) grids of at least 3x3, got {obs_shape}"
            )
        height, width, channels = obs_shape
        conv_out = [16, height - 2, width - 2]
        self.conv = nn.Sequential(
            layer_init(nn.Conv2d(channels, 16, 3, stride=1)),
            *([nn.LayerNorm(conv_out)] if layer_norm else []),
            nn.ReLU(),
            nn.Flatten(),
        )
        norm = [nn.LayerNorm(hidden)] if layer_norm else []
        flat = int(np.prod(conv_out))
        self.fc = nn.Sequential(layer_init(nn.Linear(flat, hidden)), *norm, nn.ReLU())
        self.out_features = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x.float().permute(0, 3, 1, 2)))


class MLP(nn.Module):
    """Fully connected layers with tanh activations (or `activation`); with `layer_norm` each
    layer's output is layer-normalized before its activation (PQN's network)."""

    def __init__(
        self,
        in_features: int,
        hidden: tuple[int, ...] = (64, 64),
        activation: type[nn.Module] = nn.Tanh,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for width in hidden:
            layers.append(layer_init(nn.Linear(in_features, width)))
            layers += [nn.LayerNorm(width)] if layer_norm else []
            layers.append(activation())
            in_features = width
        self.net = nn.Sequential(*layers)
        self.out_features = in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def is_image(space: spaces.Space) -> bool:
    """Whether observations are uint8 images (channels first), which get the Nature CNN."""
    return isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def is_grid(space: spaces.Space) -> bool:
    """Whether observations are bool (height, width, channels) grids (MinAtar's), which get the
    MinAtar CNN."""
    return isinstance(space, spaces.Box) and space.dtype == np.bool_ and len(space.shape) == 3


def cnn_torso(space: spaces.Space, layer_norm: bool = False) -> NatureCNN | MinAtarCNN | None:
    """The CNN for an observation space: the Nature CNN for uint8 images, the MinAtar CNN for
    bool grids, None for anything else (which gets an MLP)."""
    if is_image(space):
        return NatureCNN(tuple(space.shape), layer_norm=layer_norm)
    if is_grid(space):
        return MinAtarCNN(tuple(space.shape), layer_norm=layer_norm)
    return None


class ActorCritic(nn.Module):
    """Policy and value heads on separate (MLP) or shared (CNN) torsos, as in CleanRL.

    For vector observations the actor and critic are separate 64-64 tanh MLPs; for images one
    Nature CNN feeds both heads, for MinAtar's grids one MinAtar CNN. Heads are initialized with
    gain 0.01 (policy) and 1 (value).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        hidden: tuple[int, ...] = (64, 64),
        lstm: int | None = None,
    ) -> None:
        super().__init__()
        self.check_spaces(observation_space, action_space)
        if lstm is not None and lstm < 1:
            raise ValueError(f"lstm is the LSTM core's size (>= 1) or None, got {lstm}")
        self.image = is_image(observation_space)
        self.discrete = isinstance(action_space, spaces.Discrete)
        act_dim = int(action_space.n) if self.discrete else int(action_space.shape[0])
        cnn = cnn_torso(observation_space)
        if cnn is not None:
            self.torso: nn.Module = cnn
            self.actor_torso: nn.Module = nn.Identity()
            self.critic_torso: nn.Module = nn.Identity()
            features = actor_features = self.torso.out_features
        elif lstm is not None:  # one shared MLP feeds the core
            obs_dim = int(np.prod(observation_space.shape))
            self.torso = nn.Sequential(nn.Flatten(), MLP(obs_dim, hidden))
            self.actor_torso, self.critic_torso = nn.Identity(), nn.Identity()
            features = actor_features = hidden[-1] if hidden else obs_dim
        else:
            obs_dim = int(np.prod(observation_space.shape))
            self.torso = nn.Flatten()
            self.actor_torso, self.critic_torso = MLP(obs_dim, hidden), MLP(obs_dim, hidden)
            features = actor_features = self.actor_torso.out_features
        self.lstm_size = lstm
        """The LSTM core's size, or None for a feed-forward net."""
        self.core: nn.LSTM | None = None
        if lstm is not None:
            self.core = nn.LSTM(features, lstm)
            for name, param in self.core.named_parameters():
                if "bias" in name:
                    nn.init.constant_(param, 0.0)
                else:
                    nn.init.orthogonal_(param, 1.0)
            features = actor_features = lstm
        self.actor = layer_init(nn.Linear(actor_features, act_dim), std=0.01)
        self.critic = layer_init(nn.Linear(features, 1), std=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.zeros(1, act_dim))

    @staticmethod
    def check_spaces(observation_space: spaces.Space, action_space: spaces.Space) -> None:
        """Raise ValueError unless observations are a Box and actions Discrete or a 1-D Box."""
        if not isinstance(observation_space, spaces.Box):
            raise ValueError(f"ActorCritic needs a Box observation space, got {observation_space}")
        discrete = isinstance(action_space, spaces.Discrete)
        if not discrete and not (
            isinstance(action_space, spaces.Box) and len(action_space.shape) == 1
        ):
            raise ValueError(
                f"ActorCritic supports Discrete and 1-D Box actions, got {action_space}"
            )

    @property
    def recurrent(self) -> bool:
        """Whether the net has an LSTM core (and so needs a state)."""
        return self.core is not None

    def initial_state(self, envs: int, device: torch.device | str | None = None) -> State | None:
        """The zero LSTM state for `envs` envs (None for a feed-forward net)."""
        if self.lstm_size is None:
            return None
        device = device if device is not None else self.actor.weight.device
        zeros = torch.zeros(envs, self.lstm_size, device=device)
        return zeros, zeros.clone()

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.torso(scale_images(obs) if self.image else obs.float())

    def _feed_forward(self) -> None:
        if self.core is not None:
            raise TypeError("this net has an LSTM core: use step() or unroll() with its state")

    def _raw_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # float32 out, also under bfloat16 autocast: distributions and losses stay float32
        logits = self.actor(self.actor_torso(x)).float()
        return logits, self.critic(self.critic_torso(x)).squeeze(-1).float()

    def distribution(self, out: torch.Tensor) -> Categorical | Normal:
        """The action distribution for the actor head's output (logits, or Gaussian means)."""
        if self.discrete:
            return Categorical(logits=out, validate_args=False)
        return Normal(out, self.log_std.expand_as(out).exp(), validate_args=False)

    def outputs(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A feed-forward net's whole forward pass as plain tensors, float32: (the actor head's
        output, V(obs)); `distribution` makes the first a distribution. What `--compile`
        compiles (`onebox.nn.accel`)."""
        self._feed_forward()
        return self._raw_heads(self._features(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs), shape (batch,), of a feed-forward net."""
        self._feed_forward()
        return self.critic(self.critic_torso(self._features(obs))).squeeze(-1).float()

    def dist(self, obs: torch.Tensor) -> tuple[Categorical | Normal, torch.Tensor]:
        """The action distribution and V(obs) of a feed-forward net, in one pass."""
        out, value = self.outputs(obs)
        return self.distribution(out), value

    def unroll(
        self, obs: torch.Tensor, starts: torch.Tensor | None, state: State | None
    ) -> tuple[Categorical | Normal, torch.Tensor, State | None]:
        """Replay a sequence: obs (T, envs, ...), starts (T, envs) bool (None: no episode starts
        in it), the state before step 0.

        Returns the distributions and values of all T * envs steps (time-major, flattened) and
        the state after step T-1. Feed-forward nets ignore `starts` and `state`."""
        out, v, state = self.unroll_outputs(obs, starts, state)
        return self.distribution(out), v, state

    def unroll_outputs(
        self, obs: torch.Tensor, starts: torch.Tensor | None, state: State | None
    ) -> tuple[torch.Tensor, torch.Tensor, State | None]:
        """`unroll` with the actor head's output in place of the distributions."""
        t_len, envs = obs.shape[:2]
        x = self._features(obs.flatten(0, 1))
        if self.core is None:
            out, v = self._raw_heads(x)
            return out, v, state
        if state is None:
            raise ValueError("a recurrent net's unroll needs the state before step 0")
        x = x.view(t_len, envs, -1)
        h, c = state[0].unsqueeze(0), state[1].unsqueeze(0)
        if starts is None:
            y, (h, c) = self.core(x, (h, c))
            out, v = self._raw_heads(y.flatten(0, 1))
            return out, v, (h[0], c[0])
        keep = (~starts.to(torch.bool)).to(x.dtype).unsqueeze(-1)  # (T, envs, 1)
        # One LSTM call per stretch of steps in which no env starts an episode.
        cuts = [0, *(torch.nonzero(starts[1:].any(1)).flatten() + 1).tolist(), t_len]
        out = []
        for a, b in itertools.pairwise(cuts):
            y, (h, c) = self.core(x[a:b], (h * keep[a], c * keep[a]))
            out.append(y)
        heads, v = self._raw_heads(torch.cat(out).flatten(0, 1))
        return heads, v, (h[0], c[0])

    @torch.no_grad()
    def step(
        self,
        obs: torch.Tensor,
        starts: torch.Tensor | None,
        state: State | None,
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, State | None]:
        """Act one step for a batch of envs: (action, log_prob, value, state after the step).

        `starts` (envs,) marks envs whose observation begins an episode (None: none do)."""
        starts = None if starts is None else starts.reshape(1, -1)
        out, value, state = self.unroll_outputs(obs.unsqueeze(0), starts, state)
        return (*self.sample(out, deterministic), value, state)

    def sample(
        self, out: torch.Tensor, deterministic: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(an action drawn from the distribution of the actor head's output `out`, or its mode
        if `deterministic`; its log-probability): what `distribution(out)` would give, to the
        bit, with no distribution object (a policy call's host time is its few kernel
        launches, and building the distribution, sampling and scoring through it took two to
        three times as long, docs/benchmarks.md). Discrete: `Categorical`'s normalized logits,
        `torch.multinomial` on their softmax and a gather; continuous: `Normal`'s draw (the
        mean plus the standard deviation times a standard normal, as `torch.normal`) and its
        log-density, term by term as torch writes it."""
        if not self.discrete:
            scale = self.log_std.expand_as(out).exp()
            action = out if deterministic else out + scale * torch.randn_like(out)
            logprob = -((action - out) ** 2) / (2 * scale**2) - scale.log() - LOG_SQRT_2PI
            return action, logprob.sum(-1)
        logits = out - out.logsumexp(-1, keepdim=True)
        if deterministic:
            action = logits.argmax(-1, keepdim=True)
        else:
            action = torch.multinomial(torch.softmax(logits, -1), 1, True)
        return action.squeeze(-1), logits.gather(-1, action).squeeze(-1)

    def log_prob(self, d: Categorical | Normal, action: torch.Tensor) -> torch.Tensor:
        """Log-probability of `action`, summed over action dimensions for Gaussians."""
        lp = d.log_prob(action)
        return lp if self.discrete else lp.sum(-1)

    def entropy(self, d: Categorical | Normal) -> torch.Tensor:
        """Entropy per sample, summed over action dimensions for Gaussians."""
        ent = d.entropy()
        return ent if self.discrete else ent.sum(-1)

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, deterministic: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample (or take the mode of) an action of a feed-forward net: (action, log_prob,
        value)."""
        out, value = self.outputs(obs)
        return (*self.sample(out, deterministic), value)
