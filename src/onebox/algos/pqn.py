"""PQN, parallel Q-learning (Gallici et al. 2024), with CleanRL's settings, on onebox's sampler.

    onebox train pqn --env CartPole-v1
    onebox train pqn --env Pong-v5

Many envs replace the replay buffer and layer norm replaces the target network: one iteration
collects `num_steps` steps from each of `num_envs` envs with an epsilon-greedy policy on the
Q-network (`onebox.nn.q_networks.EpsilonGreedy`, epsilon falling linearly over the first
`exploration_fraction` of the run), computes Q(lambda) returns from the max-Q values seen while
acting, and runs `update_epochs` epochs of minibatch regression of Q(s, a) on them (RAdam, gradient
norm clipping, the learning rate annealed linearly to zero).

A truncated episode (a time limit) bootstraps from max_a Q of its final observation, which the
sampler records and the update adds to the last reward (`Rollout.bootstrapped_rewards`); a
terminated one does not bootstrap.

Presets equal CleanRL's scripts: `classic` (pqn.py: 4 envs, a 120-84 ReLU MLP with layer norm)
and `atari` (pqn_atari_envpool.py: 8 envs, the Nature CNN with layer norm, epsilon to 0.01 over
the first 10%); `minatar` (`MinAtar/*` ids) is purejaxql's MinAtar PQN (128 envs, the MinAtar CNN
with layer norm). Any field given on the command line wins over the preset.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
from torch.nn import functional as F

from onebox.algos import onpolicy
from onebox.algos.common import check_positive, fill_log_every, greedy_q_policy, resolve_env
from onebox.algos.trainer import (
    DISCOUNT,
    GRAD_CLIP,
    LEARNING_RATE,
    POSITIVE,
    UNIT,
    Learner,
    Range,
    ranges,
    tunables,
)
from onebox.nn.accel import Accel, AccelFields, check_accel
from onebox.nn.q_networks import EpsilonGreedy, QNetwork
from onebox.run.config import Switch, TorchConfig
from onebox.run.presets import Presets
from onebox.sampling import Rollout


@dataclasses.dataclass
class Config(TorchConfig, AccelFields):
    """Train an agent with PQN. Fields left unset come from the env family's preset."""

    preset: Literal["auto", "classic", "atari", "minatar"] = "auto"
    total_steps: int | None = None
    """Env steps to train for (preset: 500k classic, 10M Atari and MinAtar)."""
    num_envs: int | None = None
    """Envs stepped in parallel (preset: 4 classic, 8 Atari, 128 MinAtar)."""
    num_steps: int | None = None
    """Steps per env in each rollout (preset: 128, 32 MinAtar)."""
    learning_rate: float | None = None
    """RAdam learning rate (preset: 2.5e-4, 5e-4 MinAtar)."""
    anneal_lr: Switch = True
    gamma: float = 0.99
    """Discount factor."""
    q_lambda: float = 0.65
    """Lambda of the Q(lambda) returns (0: one-step Q-learning targets, 1: Monte Carlo)."""
    num_minibatches: int | None = None
    """Minibatches per epoch (preset: 4, 32 MinAtar); must divide num_envs * num_steps."""
    update_epochs: int | None = None
    """Epochs over each rollout (preset: 4, 2 MinAtar)."""
    start_e: float = 1.0
    """Exploration epsilon at the start."""
    end_e: float | None = None
    """Exploration epsilon at the end of the schedule (preset: 0.05 classic and MinAtar, 0.01
    Atari)."""
    exploration_fraction: float | None = None
    """Fraction of total_steps over which epsilon falls from start_e to end_e (preset: 0.5
    classic, 0.1 Atari and MinAtar)."""
    max_grad_norm: float = 10.0
    """Gradient norm clip."""
    hidden: tuple[int, ...] = (120, 84)
    """Hidden layer widths of the MLP Q-network (vector observations)."""
    sampler: Literal["sync", "double"] = "sync"
    """`sync` steps all envs then infers; `double` overlaps two halves, two pools that take turns
    (needs even num_envs)."""
    num_threads: int | None = None
    """Env pool threads (default: physical cores); with `--sampler double`, per half's pool."""


PRESETS = Presets(Config, {
    "classic": dict(total_steps=500_000, num_envs=4, num_steps=128, learning_rate=2.5e-4,
                    num_minibatches=4, update_epochs=4, end_e=0.05, exploration_fraction=0.5),
    "atari": dict(total_steps=10_000_000, num_envs=8, num_steps=128, learning_rate=2.5e-4,
                  num_minibatches=4, update_epochs=4, end_e=0.01, exploration_fraction=0.1),
    "minatar": dict(total_steps=10_000_000, num_envs=128, num_steps=32, learning_rate=5e-4,
                    num_minibatches=32, update_epochs=2, end_e=0.05, exploration_fraction=0.1),
})  # fmt: skip
"""CleanRL's hyperparameters per env family; the fields left None in `Config` come from here.
`minatar` (the MinAtar CNN with layer norm) is the PQN paper's MinAtar setting (Gallici et al.
2024), every number from purejaxql's `config/alg/pqn_minatar.yaml`: 10M steps, 128 envs x 32
steps, 2 epochs of 32 minibatches, RAdam 5e-4 annealed, gradient clip 10, epsilon 1 -> 0.05 over
the first 10%, gamma 0.99, lambda 0.65. It differs from purejaxql's network in its inputs (the
0/1 grids as they are; purejaxql divides them by 255) and initialization (onebox's; He normal
there). At 1M steps here: Breakout 10.4 and 11.5 (seeds 1, 2; docs/results.md)."""


def resolve(config: Config) -> Config:
    """Fill the preset and check every field; raise ValueError before any work starts."""
    config = resolve_env(config, PRESETS, QNetwork.check_spaces)
    check_accel(config, compiles=False)
    check_positive(config, "num_steps", "learning_rate", "num_minibatches", "update_epochs")
    check_positive(config, "max_grad_norm")
    batch = config.num_envs * config.num_steps
    if batch % config.num_minibatches:
        raise ValueError(
            f"--num-minibatches {config.num_minibatches} does not divide the batch of "
            f"num_envs * num_steps = {batch} steps; pick a divisor"
        )
    onpolicy.check_sampler(config)
    if not 0 <= config.q_lambda <= 1:
        raise ValueError(f"--q-lambda must be in [0, 1], got {config.q_lambda}")
    return fill_log_every(config, batch)  # every iteration


def q_lambda_returns(
    rewards: torch.Tensor,
    values: torch.Tensor,
    ends: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Peng's Q(lambda) returns, (T, N), from rewards, max-Q values `values[t] = max_a Q(s_t, a)`,
    episode ends and max_a Q of the observation after the last step:

    G_t = r_t + gamma * (1 - end_t) * (lam * G_{t+1} + (1 - lam) * values[t+1]),
    with G_{T-1} = r_{T-1} + gamma * (1 - end_{T-1}) * next_value.
    """
    returns = torch.zeros_like(rewards)
    boot = next_value
    keep = 1.0 - ends.float()
    for t in reversed(range(rewards.shape[0])):
        returns[t] = rewards[t] + gamma * keep[t] * boot
        boot = lam * returns[t] + (1 - lam) * values[t]
    return returns


class PQN(Learner):
    """The epsilon-greedy layer-norm Q-network (the sampler's policy: `act` gives the action,
    a log-probability of 0 and max_a Q) and RAdam, CleanRL's optimizer for PQN."""

    tunable = tunables(learning_rate=POSITIVE, gamma=UNIT, q_lambda=UNIT, max_grad_norm=POSITIVE)
    search = ranges(learning_rate=LEARNING_RATE, gamma=DISCOUNT,
                    q_lambda=Range(0.5, 0.99, "complement"), max_grad_norm=GRAD_CLIP)  # fmt: skip
    obs_norm = reward_scaler = None  # the sampler's transforms: none

    def __init__(self, config: Config, obs_space: Any, act_space: Any, device: torch.device):
        self.config = config
        self.accel = Accel.of(config, device)
        q = QNetwork(obs_space, act_space, config.hidden, layer_norm=True)
        duration = config.exploration_fraction * config.total_steps
        self.net = EpsilonGreedy(q, config.start_e, config.end_e, duration).to(device)
        self.params = list(self.net.parameters())  # listed once: every step clips their norm
        self.optimizer = torch.optim.RAdam(self.params, lr=config.learning_rate)
        self.hp = self.make_hyperparams(config)
        self.hp.bind("learning_rate", self.optimizer)

    def update(self, rollout: Rollout) -> dict[str, float]:
        """PQN epochs over one rollout; returns the loss and diagnostics to log."""
        config, net = self.config, self.net
        gamma, max_grad_norm = self.hp.gamma, self.hp.max_grad_norm
        rewards = rollout.bootstrapped_rewards(gamma)
        returns = q_lambda_returns(rewards, rollout.values, rollout.ends, rollout.next_value,
                                   gamma, self.hp.q_lambda).flatten()  # fmt: skip
        obs, actions = rollout.obs.flatten(0, 1), rollout.actions.flatten()
        batch = len(returns)
        size = batch // config.num_minibatches
        loss = q_taken = torch.zeros(())
        for _ in range(config.update_epochs):
            order = torch.randperm(batch, device=returns.device)
            for start in range(0, batch, size):
                mb = order[start : start + size]
                q_taken = net.q(obs[mb]).gather(1, actions[mb].unsqueeze(1)).squeeze(1)
                loss = F.mse_loss(q_taken, returns[mb])
                self.descend(loss, max_grad_norm)
        return {
            "losses/td_loss": loss.item(),
            "losses/q_values": q_taken.mean().item(),
            "charts/epsilon": net.epsilon,
        }

    def greedy(self, device: torch.device) -> Any:
        return greedy_q_policy(self.net.q.eval(), device)

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])


class Trainer(onpolicy.OnPolicyTrainer):
    """PQN on the sampler: a rollout acted epsilon-greedily, then its epochs of regression."""

    make_learner = PQN
