"""Actor-critic networks: Nature CNN for images, tanh MLP for vectors, CleanRL's initialization.

`ActorCritic` takes observations as the env pool returns them (uint8 images are scaled by 1/255
inside the network, so rollouts keep them as uint8) and gives a categorical policy for `Discrete`
actions or a Gaussian with a state-independent log std for `Box` actions.

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

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.distributions import Categorical, Normal

State = tuple[torch.Tensor, torch.Tensor]
"""An LSTM state `(h, c)`, each of shape (envs, hidden)."""


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain `std`, constant bias (PPO's standard initialization)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class NatureCNN(nn.Module):
    """DQN's Nature conv stack (32x8x8/4, 64x4x4/2, 64x3x3/1) and a 512-unit layer, ReLU."""

    def __init__(self, obs_shape: tuple[int, ...], hidden: int = 512) -> None:
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(f"NatureCNN takes (channels, height, width) images, got {obs_shape}")
        c, h, w = obs_shape
        self.convs = nn.Sequential(
            layer_init(nn.Conv2d(c, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, c, h, w)).shape[1]
        self.fc = nn.Sequential(layer_init(nn.Linear(flat, hidden)), nn.ReLU())
        self.out_features = hidden
        # Channels-last convolutions: 1.46x faster forward+backward on CPU (oneDNN) here.
        self.convs.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(x.contiguous(memory_format=torch.channels_last)))


class MLP(nn.Module):
    """Fully connected layers with tanh activations."""

    def __init__(self, in_features: int, hidden: tuple[int, ...] = (64, 64)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for width in hidden:
            layers += [layer_init(nn.Linear(in_features, width)), nn.Tanh()]
            in_features = width
        self.net = nn.Sequential(*layers)
        self.out_features = in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def is_image(space: spaces.Space) -> bool:
    """Whether observations are uint8 images (channels first), which get the Nature CNN."""
    return isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


class ActorCritic(nn.Module):
    """Policy and value heads on separate (MLP) or shared (CNN) torsos, as in CleanRL.

    For vector observations the actor and critic are separate 64-64 tanh MLPs; for images one
    Nature CNN feeds both heads. Heads are initialized with gain 0.01 (policy) and 1 (value).
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
        if self.image:
            self.torso: nn.Module = NatureCNN(tuple(observation_space.shape))
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
        if self.image:
            return self.torso(obs.float() * (1.0 / 255.0))
        return self.torso(obs.float())

    def _feed_forward(self) -> None:
        if self.core is not None:
            raise TypeError("this net has an LSTM core: use step() or unroll() with its state")

    def _heads(self, x: torch.Tensor) -> tuple[Categorical | Normal, torch.Tensor]:
        logits = self.actor(self.actor_torso(x))
        value = self.critic(self.critic_torso(x)).squeeze(-1)
        if self.discrete:
            return Categorical(logits=logits, validate_args=False), value
        return Normal(logits, self.log_std.expand_as(logits).exp(), validate_args=False), value

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs), shape (batch,), of a feed-forward net."""
        self._feed_forward()
        return self.critic(self.critic_torso(self._features(obs))).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> tuple[Categorical | Normal, torch.Tensor]:
        """The action distribution and V(obs) of a feed-forward net, in one pass."""
        self._feed_forward()
        return self._heads(self._features(obs))

    def unroll(
        self, obs: torch.Tensor, starts: torch.Tensor | None, state: State | None
    ) -> tuple[Categorical | Normal, torch.Tensor, State | None]:
        """Replay a sequence: obs (T, envs, ...), starts (T, envs) bool (None: no episode starts
        in it), the state before step 0.

        Returns the distributions and values of all T * envs steps (time-major, flattened) and
        the state after step T-1. Feed-forward nets ignore `starts` and `state`."""
        t_len, envs = obs.shape[:2]
        x = self._features(obs.flatten(0, 1))
        if self.core is None:
            d, v = self._heads(x)
            return d, v, state
        if state is None:
            raise ValueError("a recurrent net's unroll needs the state before step 0")
        x = x.view(t_len, envs, -1)
        h, c = state[0].unsqueeze(0), state[1].unsqueeze(0)
        if starts is None:
            y, (h, c) = self.core(x, (h, c))
            d, v = self._heads(y.flatten(0, 1))
            return d, v, (h[0], c[0])
        keep = (~starts.to(torch.bool)).to(x.dtype).unsqueeze(-1)  # (T, envs, 1)
        # One LSTM call per stretch of steps in which no env starts an episode.
        cuts = [0, *(torch.nonzero(starts[1:].any(1)).flatten() + 1).tolist(), t_len]
        out = []
        for a, b in itertools.pairwise(cuts):
            y, (h, c) = self.core(x[a:b], (h * keep[a], c * keep[a]))
            out.append(y)
        d, v = self._heads(torch.cat(out).flatten(0, 1))
        return d, v, (h[0], c[0])

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
        d, value, state = self.unroll(obs.unsqueeze(0), starts, state)
        return (*self._pick(d, deterministic), value, state)

    def _pick(
        self, d: Categorical | Normal, deterministic: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not deterministic:
            action = d.sample()
        elif isinstance(d, Categorical):
            action = d.probs.argmax(-1)
        else:
            action = d.mean
        return action, self.log_prob(d, action)

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
        d, value = self.dist(obs)
        return (*self._pick(d, deterministic), value)
