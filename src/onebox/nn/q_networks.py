"""The Q-learning family's networks: DQN's, PQN's and Ape-X's Q-network (optionally dueling, with
layer norm for PQN), R2D2's recurrent Q-network, epsilon-greedy acting with a linear schedule, and
SAC's squashed Gaussian actor and continuous Q-function.

They share the torsos of `onebox.nn.networks` (Nature CNN, MinAtar CNN, MLP) and its
initializations; observations come as the env pool returns them (uint8 images scaled inside).
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.distributions import Normal

from onebox.nn.accel import scale_images
from onebox.nn.networks import MLP, Init, State, cnn_torso, is_image, layer_init, torch_init


class QNetwork(nn.Module):
    """Q-values of every action for `Discrete` actions: a trunk (the Nature CNN for images, the
    MinAtar CNN for MinAtar's grids, a ReLU MLP for vectors), optionally with layer norm (PQN),
    and a linear head; with `dueling` the head is a value and an advantage stream,
    Q = V + A - mean(A) (Wang et al. 2016). `init` picks the initialization (`Init`)."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        hidden: tuple[int, ...] = (120, 84),
        dueling: bool = False,
        layer_norm: bool = False,
        init: Init = "orthogonal",
    ) -> None:
        super().__init__()
        self.check_spaces(observation_space, action_space)
        self.image = is_image(observation_space)
        self.num_actions = int(action_space.n)
        cnn = cnn_torso(observation_space, layer_norm)
        if cnn is not None:
            self.trunk: nn.Module = cnn
            features = cnn.out_features
        else:
            obs_dim = int(np.prod(observation_space.shape))
            mlp = MLP(obs_dim, hidden, activation=nn.ReLU, layer_norm=layer_norm)
            self.trunk = nn.Sequential(nn.Flatten(), mlp)
            features = mlp.out_features
        self.head = layer_init(nn.Linear(features, self.num_actions))
        """Q-values, or with `dueling` the advantages."""
        self.value_head = layer_init(nn.Linear(features, 1)) if dueling else None
        if init == "torch":
            torch_init(self)

    @staticmethod
    def check_spaces(observation_space: spaces.Space, action_space: spaces.Space) -> None:
        """Raise ValueError unless observations are a Box and actions Discrete."""
        if not isinstance(observation_space, spaces.Box):
            raise ValueError(f"QNetwork needs a Box observation space, got {observation_space}")
        if not isinstance(action_space, spaces.Discrete):
            raise ValueError(
                f"Q-learning needs Discrete actions, got {action_space}; for continuous actions "
                "train sac or ppo"
            )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(obs, .), shape (batch, actions)."""
        x = self.trunk(scale_images(obs) if self.image else obs.float())
        if self.value_head is None:
            return self.head(x).float()  # float32 out, also under bfloat16 autocast
        return dueling_q(self.value_head(x).float(), self.head(x).float())


class RecurrentQNetwork(nn.Module):
    """R2D2's Q-network: `QNetwork`'s trunk, an LSTM core of `size` units and a dueling head.

    `unroll(obs, state)` runs a (T, envs) sequence from the state before step 0 (the caller zeroes
    the state where an episode starts) and returns Q of shape (T, envs, actions) and the state
    after step T-1. With `core="mlp"` a ReLU layer of the same size takes the LSTM's place: the
    same network without memory, its state passed through unchanged (a control for memory)."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        hidden: tuple[int, ...] = (64,),
        size: int = 64,
        core: str = "lstm",
    ) -> None:
        super().__init__()
        QNetwork.check_spaces(observation_space, action_space)
        if size < 1 or core not in ("lstm", "mlp"):
            raise ValueError(f"the core is an 'lstm' or 'mlp' of size >= 1, got {core!r} {size}")
        self.image = is_image(observation_space)
        self.num_actions, self.size = int(action_space.n), int(size)
        cnn = cnn_torso(observation_space)
        if cnn is not None:
            self.trunk: nn.Module = cnn
            features = cnn.out_features
        else:
            mlp = MLP(int(np.prod(observation_space.shape)), hidden, activation=nn.ReLU)
            self.trunk, features = nn.Sequential(nn.Flatten(), mlp), mlp.out_features
        self.core: nn.Module = (
            nn.LSTM(features, size)
            if core == "lstm"
            else nn.Sequential(layer_init(nn.Linear(features, size)), nn.ReLU())
        )
        self.value_head = layer_init(nn.Linear(size, 1))
        self.head = layer_init(nn.Linear(size, self.num_actions))
        """The advantages."""

    def unroll(self, obs: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Q of a (T, envs, ...) sequence from `state` (each (envs, size)): (Q, state after)."""
        t_len, envs = obs.shape[:2]
        x = obs.flatten(0, 1).float()
        x = self.trunk(x * (1.0 / 255.0) if self.image else x).view(t_len, envs, -1)
        if isinstance(self.core, nn.LSTM):
            y, (h, c) = self.core(x, (state[0].unsqueeze(0), state[1].unsqueeze(0)))
            state = (h[0], c[0])
        else:
            y = self.core(x)
        return dueling_q(self.value_head(y), self.head(y)), state


def dueling_q(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """The dueling aggregation: Q(s, a) = V(s) + A(s, a) - mean over a of A(s, a)."""
    return value + advantage - advantage.mean(-1, keepdim=True)


def linear_schedule(start: float, end: float, duration: float, step: int) -> float:
    """`start` moving linearly to `end` over `duration` steps, then `end`."""
    if duration <= 0:
        return end
    return start + (end - start) * min(1.0, step / duration)


def epsilon_greedy(
    q: torch.Tensor, epsilon: torch.Tensor | float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Epsilon-greedy actions from Q-values `q` (rows, actions) on their device: each row a
    random action with probability `epsilon` (a number, or one per row: Ape-X's per-actor
    epsilons), else its argmax. PQN's, Ape-X's and R2D2's policies act with it; DQN's inline
    actor draws on the host (`EpsilonGreedy.sample`)."""
    n = len(q)
    explores = torch.rand(n, device=q.device, generator=generator) < epsilon
    random = torch.randint(0, q.shape[-1], (n,), device=q.device, generator=generator)
    return torch.where(explores, random, q.argmax(-1))


class EpsilonGreedy(nn.Module):
    """A `QNetwork` acting epsilon-greedily, epsilon falling linearly from `start_e` to `end_e` over
    `duration` env steps. It counts the steps it acts (the `steps` buffer, saved with its state),
    and has the sampler's policy interface (`act` gives (action, 0, max_a Q), `value` max_a Q)
    and the replay actor's (`sample`: actions only)."""

    recurrent = False

    def __init__(self, q: QNetwork, start_e: float, end_e: float, duration: float) -> None:
        super().__init__()
        self.q = q
        self.num_actions = q.num_actions  # a plain attribute: `sample` reads it every step
        self.start_e, self.end_e, self.duration = start_e, end_e, duration
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    @property
    def epsilon(self) -> float:
        """Epsilon at the current step."""
        return linear_schedule(self.start_e, self.end_e, self.duration, int(self.steps))

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q = self.q(obs)
        action = epsilon_greedy(q, self.epsilon)
        self.steps += len(obs)
        return action, torch.zeros(len(obs), device=q.device), q.max(-1).values

    def sample(self, obs: np.ndarray, device: torch.device) -> np.ndarray:
        """Epsilon-greedy actions for a host batch of observations, drawn on the host (numpy's
        generator): the Q-network runs (on `device`) only if some row acts greedily (one env
        early in the schedule mostly explores, and a forward pass costs more than a step)."""
        n = len(obs)
        explores = np.random.random(n) < self.epsilon
        random = np.random.randint(self.num_actions, size=n)
        self.steps += n
        if explores.all():
            return random
        with torch.inference_mode():
            greedy = self.q(torch.as_tensor(obs, device=device)).argmax(-1).cpu().numpy()
        return np.where(explores, random, greedy)

    @torch.no_grad()
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs).max(-1).values


class SquashedGaussianActor(nn.Module):
    """SAC's policy for 1-D `Box` actions: a ReLU MLP gives the mean and log std of a Gaussian
    (log std squashed into [-5, 2]); a sample is squashed by tanh and rescaled to the action
    bounds, and its log-probability corrected for both (Haarnoja et al. 2018, appendix C)."""

    LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        hidden: tuple[int, ...] = (256, 256),
    ) -> None:
        super().__init__()
        low, high = check_bounded_actions(action_space)
        obs_dim, act_dim = int(np.prod(observation_space.shape)), len(low)
        self.trunk = MLP(obs_dim, hidden, activation=nn.ReLU)
        self.mean = nn.Linear(self.trunk.out_features, act_dim)
        self.log_std = nn.Linear(self.trunk.out_features, act_dim)
        self.register_buffer("scale", torch.as_tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("bias", torch.as_tensor((high + low) / 2.0, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log std of the Gaussian before squashing."""
        x = self.trunk(obs.float().flatten(1))
        log_std = torch.tanh(self.log_std(x))
        span = self.LOG_STD_MAX - self.LOG_STD_MIN  # float32 out, also under bfloat16 autocast
        return self.mean(x).float(), self.LOG_STD_MIN + 0.5 * span * (log_std.float() + 1)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action sampled with the reparameterization trick, its log-probability (batch,), the
        deterministic action tanh(mean)), actions within the bounds."""
        mean, log_std = self(obs)
        normal = Normal(mean, log_std.exp(), validate_args=False)
        u = normal.rsample()
        y = torch.tanh(u)
        log_prob = normal.log_prob(u) - torch.log(self.scale * (1 - y.pow(2)) + 1e-6)
        return (
            y * self.scale + self.bias,
            log_prob.sum(-1),
            torch.tanh(mean) * self.scale + self.bias,
        )


class ContinuousQ(nn.Module):
    """Q(s, a) for 1-D `Box` actions: a ReLU MLP on the observation and action concatenated."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        hidden: tuple[int, ...] = (256, 256),
    ) -> None:
        super().__init__()
        obs_dim = int(np.prod(observation_space.shape))
        act_dim = int(np.prod(action_space.shape))
        self.trunk = MLP(obs_dim + act_dim, hidden, activation=nn.ReLU)
        self.head = nn.Linear(self.trunk.out_features, 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q(obs, action), shape (batch,)."""
        x = torch.cat([obs.float().flatten(1), action.float()], 1)
        return self.head(self.trunk(x)).squeeze(-1).float()  # float32, also under autocast


def check_bounded_actions(action_space: spaces.Space) -> tuple[np.ndarray, np.ndarray]:
    """The (low, high) bounds of a 1-D `Box` action space with finite bounds; ValueError else."""
    if not isinstance(action_space, spaces.Box) or len(action_space.shape) != 1:
        raise ValueError(
            f"SAC needs continuous (1-D Box) actions, got {action_space}; for Discrete actions "
            "train dqn, pqn or ppo"
        )
    low, high = action_space.low.astype(np.float64), action_space.high.astype(np.float64)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise ValueError(
            f"SAC rescales actions to their bounds, which must be finite: {action_space}"
        )
    return low, high
