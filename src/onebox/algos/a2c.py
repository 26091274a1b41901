"""A2C (Mnih et al. 2016, synchronous variant) with Stable-Baselines3's defaults.

    onebox train a2c --env CartPole-v1

One iteration collects `num_steps` (5) steps from each of `num_envs` envs with the `Sampler`,
computes n-step returns (GAE with lambda 1 by default), and takes one RMSprop step on the
policy-gradient loss, the value loss (mean squared error, as SB3) weighted by `vf_coef`, and an
entropy bonus, with the gradient norm clipped.

Presets per env family follow SB3 and the RL Baselines3 Zoo: `classic` (8 envs, no entropy bonus),
`atari` (16 envs, entropy 0.01, value coefficient 0.25), `continuous` (8 envs, observation and
reward normalization). Any field given on the command line wins over the preset.

With `--lstm H` the network has an LSTM core: the sampler carries each env's state across
rollouts, and the loss replays the whole rollout with one `unroll` from the stored initial state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

import torch
from torch.nn import functional as F

from onebox.algos.common import check_positive, fill_log_every
from onebox.algos.onpolicy import ActorCriticLearner, OnPolicyTrainer, resolve_common
from onebox.algos.trainer import Hyperparams
from onebox.nn.accel import AccelFields
from onebox.nn.networks import ActorCritic
from onebox.run.config import TorchConfig
from onebox.run.presets import Presets
from onebox.sampling import Rollout, gae


@dataclasses.dataclass
class Config(TorchConfig, AccelFields):
    """Train an agent with A2C. Fields left unset come from the env family's preset."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"lstm"})

    preset: Literal["auto", "classic", "atari", "continuous"] = "auto"
    total_steps: int | None = None
    """Env steps to train for (preset: 500k classic, 10M Atari, 1M continuous)."""
    num_envs: int | None = None
    """Envs stepped in parallel (preset: 8, or 16 Atari)."""
    num_steps: int = 5
    """Steps per env in each rollout: the n of the n-step returns."""
    learning_rate: float = 7e-4
    """RMSprop learning rate."""
    rms_alpha: float = 0.99
    """RMSprop smoothing constant."""
    rms_eps: float = 1e-5
    """RMSprop epsilon."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda (1: plain n-step returns)."""
    norm_adv: bool = False
    """Normalize the advantages of each rollout."""
    ent_coef: float | None = None
    """Entropy bonus coefficient (preset: 0, or 0.01 Atari)."""
    vf_coef: float | None = None
    """Value loss coefficient (preset: 0.5, or 0.25 Atari)."""
    max_grad_norm: float = 0.5
    """Gradient norm clip."""
    lstm: int | None = None
    """LSTM core size; None = feed-forward."""
    normalize_obs: bool | None = None
    """Running observation normalization (preset: on for continuous control only)."""
    normalize_reward: bool | None = None
    """Scale rewards by the running std of the discounted return (preset: continuous only)."""
    sampler: Literal["sync", "double"] = "sync"
    """`sync` steps all envs then infers; `double` overlaps two halves, two pools that take turns
    (needs even num_envs)."""
    num_threads: int | None = None
    """Env pool threads (default: physical cores); with `--sampler double`, per half's pool."""


PRESETS = Presets(Config, {
    "classic": dict(total_steps=500_000, num_envs=8, ent_coef=0.0, vf_coef=0.5,
                    normalize_obs=False, normalize_reward=False),
    "atari": dict(total_steps=10_000_000, num_envs=16, ent_coef=0.01, vf_coef=0.25,
                  normalize_obs=False, normalize_reward=False),
    "continuous": dict(total_steps=1_000_000, num_envs=8, ent_coef=0.0, vf_coef=0.5,
                       normalize_obs=True, normalize_reward=True),
})  # fmt: skip
"""SB3 / Zoo hyperparameters per env family; the fields left None in `Config` come from here."""


def resolve(config: Config) -> Config:
    """Fill the preset and check every field; raise ValueError before any work starts."""
    config = resolve_common(config, PRESETS)
    check_positive(config, "rms_eps", "max_grad_norm")
    if not 0 <= config.rms_alpha < 1:
        raise ValueError(f"--rms-alpha must be in [0, 1), got {config.rms_alpha}")
    return fill_log_every(config, 100 * config.num_envs * config.num_steps)  # 100 updates


def loss(net: ActorCritic, rollout: Rollout, hp: Hyperparams,
         norm_adv: bool) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
    """The actor-critic loss of one rollout and its parts to log, with `hp`'s gamma,
    gae_lambda, ent_coef and vf_coef (A3C's workers use it too). A recurrent net replays the
    rollout from its stored initial state and episode starts."""
    gamma = hp.gamma
    rewards = rollout.bootstrapped_rewards(gamma)
    advantages, returns = gae(rewards, rollout.values, rollout.ends, rollout.next_value,
                              gamma, hp.gae_lambda)  # fmt: skip
    if net.recurrent and (rollout.starts is None or rollout.state is None):
        raise ValueError("a recurrent net's loss needs a rollout with starts and state")
    dist, values, _ = net.unroll(rollout.obs, rollout.starts, rollout.state)
    logprobs = net.log_prob(dist, rollout.actions.flatten(0, 1))
    adv = advantages.flatten()
    if norm_adv:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = -(adv * logprobs).mean()
    v_loss = F.mse_loss(values, returns.flatten())
    entropy = net.entropy(dist).mean()
    total = pg_loss - hp.ent_coef * entropy + hp.vf_coef * v_loss
    return total, {
        "losses/policy_loss": pg_loss.item(),
        "losses/value_loss": v_loss.item(),
        "losses/entropy": entropy.item(),
    }


class A2C(ActorCriticLearner):
    """The actor-critic with RMSprop, one gradient step per rollout."""

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        c = self.config
        return torch.optim.RMSprop(params, lr=c.learning_rate, alpha=c.rms_alpha, eps=c.rms_eps)

    def update(self, rollout: Rollout) -> dict[str, float]:
        """One gradient step on one rollout; returns the losses to log."""
        total, stats = loss(self.net, rollout, self.hp, self.config.norm_adv)
        self.descend(total, self.hp.max_grad_norm)
        return stats


class Trainer(OnPolicyTrainer):
    """A2C on the sampler: a rollout of n steps, then one gradient step."""

    make_learner = A2C
