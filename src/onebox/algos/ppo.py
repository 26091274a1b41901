"""PPO (Schulman et al. 2017) with CleanRL's defaults, on onebox's env pools and sampler.

    onebox train ppo --env CartPole-v1
    onebox train ppo --env Pong-v5 --sampler double

One iteration collects `num_steps` steps from each of `num_envs` envs (sync or double-buffered, see
`onebox.sampling.Sampler`), computes GAE advantages, and runs `update_epochs` epochs of minibatch
updates of the clipped surrogate objective with value clipping, an entropy bonus, gradient norm
clipping and optional KL early stopping. The learning rate anneals linearly to zero.

With `--lstm H` the network has an LSTM core (CleanRL's ppo_atari_lstm): the sampler carries each
env's state, and a minibatch is a group of whole envs (num_envs / num_minibatches of them), each
replayed over the rollout from its stored initial state with the stored episode starts.

Defaults come from a preset per env family, equal to CleanRL's scripts so results compare:
`classic` (ppo.py), `atari` (ppo_atari_envpool.py), `continuous` (ppo_continuous_action.py, with
observation and reward normalization); `minatar` (`MinAtar/*` ids) is purejaxql's MinAtar PPO. Any field given on the command line wins over the preset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from onebox.algos.common import adam, check_positive, fill_log_every
from onebox.algos.onpolicy import ActorCriticLearner, OnPolicyTrainer, resolve_common
from onebox.algos.trainer import POSITIVE, Range, ranges, tunables
from onebox.nn.accel import AccelFields
from onebox.nn.networks import ActorCritic
from onebox.run.config import Switch, TorchConfig
from onebox.run.presets import Presets
from onebox.sampling import Rollout, gae


@dataclasses.dataclass
class Config(TorchConfig, AccelFields):
    """Train an agent with PPO. Fields left unset come from the env family's preset."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"target_kl", "lstm"})

    preset: Literal["auto", "classic", "atari", "continuous", "minatar"] = "auto"
    total_steps: int | None = None
    """Env steps to train for (preset: 500k classic, 10M Atari, 1M continuous)."""
    num_envs: int | None = None
    """Envs stepped in parallel (preset: 4 classic, 8 Atari, 1 continuous)."""
    num_steps: int | None = None
    """Steps per env in each rollout (preset: 128, or 2048 continuous)."""
    learning_rate: float | None = None
    """Adam learning rate (preset: 2.5e-4, or 3e-4 continuous)."""
    anneal_lr: Switch = True
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    num_minibatches: int | None = None
    """Minibatches per epoch (preset: 4, or 32 continuous); must divide num_envs * num_steps."""
    update_epochs: int | None = None
    """Epochs over each rollout (preset: 4, or 10 continuous)."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""
    clip_coef: float | None = None
    """Surrogate clipping coefficient (preset: 0.2, or 0.1 Atari)."""
    clip_vloss: bool = True
    """Clip the value loss as the policy loss."""
    ent_coef: float | None = None
    """Entropy bonus coefficient (preset: 0.01, or 0 continuous)."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Gradient norm clip."""
    target_kl: float | None = None
    """Stop an update's epochs early when the approximate KL exceeds this (None: never)."""
    lstm: int | None = None
    """LSTM core size; None = feed-forward. With it, num_minibatches must divide num_envs."""
    normalize_obs: bool | None = None
    """Running observation normalization (preset: on for continuous control only)."""
    normalize_reward: bool | None = None
    """Scale rewards by the running std of the discounted return (preset: continuous only)."""
    sampler: Literal["sync", "double"] = "sync"
    """`sync` steps all envs then infers; `double` overlaps two halves, two pools that take turns
    (needs even num_envs)."""
    num_threads: int | None = None
    """Env pool threads (default: physical cores); with `--sampler double`, per half's pool."""

    @property
    def batch_size(self) -> int:
        """Env steps per rollout (of a resolved config)."""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        """Env steps per minibatch (of a resolved config)."""
        return self.batch_size // self.num_minibatches


PRESETS = Presets(Config, {
    "classic": dict(
        total_steps=500_000, num_envs=4, num_steps=128, learning_rate=2.5e-4,
        num_minibatches=4, update_epochs=4, clip_coef=0.2, ent_coef=0.01,
        normalize_obs=False, normalize_reward=False,
    ),
    "atari": dict(
        total_steps=10_000_000, num_envs=8, num_steps=128, learning_rate=2.5e-4,
        num_minibatches=4, update_epochs=4, clip_coef=0.1, ent_coef=0.01,
        normalize_obs=False, normalize_reward=False,
    ),
    "continuous": dict(
        total_steps=1_000_000, num_envs=1, num_steps=2048, learning_rate=3e-4,
        num_minibatches=32, update_epochs=10, clip_coef=0.2, ent_coef=0.0,
        normalize_obs=True, normalize_reward=True,
    ),
    "minatar": dict(
        total_steps=10_000_000, num_envs=64, num_steps=128, learning_rate=5e-3,
        num_minibatches=8, update_epochs=4, clip_coef=0.2, ent_coef=1e-4,
        normalize_obs=False, normalize_reward=False,
    ),
})  # fmt: skip
"""CleanRL's hyperparameters per env family; the fields left None in `Config` come from here.
`minatar` (the MinAtar CNN) is the PPO baseline of the PQN paper (Gallici et al. 2024), every
number from purejaxql's `config/alg/ppo_minatar.yaml`: 10M steps, 64 envs x 128 steps, 4 epochs
of 8 minibatches, Adam 5e-3 annealed, clip 0.2, entropy 1e-4, gamma 0.99, GAE lambda 0.95, value
coefficient 0.5, gradient clip 0.5. At 1M steps here: Breakout 13.7-19.7 (3 seeds), Asterix 7.0,
Freeway 52.8, Seaquest 3.8, SpaceInvaders 108.6 (2 seeds; docs/results.md)."""


def resolve(config: Config) -> Config:
    """Fill the preset and check every field; raise ValueError before any work starts."""
    config = resolve_common(config, PRESETS)
    check_positive(config, "num_minibatches", "update_epochs", "clip_coef")
    if config.batch_size % config.num_minibatches:
        raise ValueError(
            f"--num-minibatches {config.num_minibatches} does not divide the batch of "
            f"num_envs * num_steps = {config.batch_size} steps; pick a divisor"
        )
    if config.lstm is not None and config.num_envs % config.num_minibatches:
        raise ValueError(
            f"with --lstm a minibatch is a group of whole envs: --num-minibatches "
            f"{config.num_minibatches} must divide --num-envs {config.num_envs}"
        )
    return fill_log_every(config, config.batch_size)  # every iteration, as CleanRL's


# ---- the learner --------------------------------------------------------------------------------


def minibatches(
    config: Config, net: ActorCritic, rollout: Rollout
) -> Iterator[tuple[torch.Tensor, Any, torch.Tensor]]:
    """One epoch's minibatches in random order, each computed when reached (after the previous
    one's optimizer step): (its rows of the flattened (T * N) rollout, the net's action
    distributions and values on those rows, in that order).

    A feed-forward net gets random rows; a recurrent one groups of whole envs, replayed with
    `net.unroll` from the rollout's stored initial state and episode starts."""
    if not net.recurrent:
        obs = rollout.obs.flatten(0, 1)
        order = torch.randperm(config.batch_size, device=obs.device)
        for start in range(0, config.batch_size, config.minibatch_size):
            mb = order[start : start + config.minibatch_size]
            dist, value = net.dist(obs[mb])
            yield mb, dist, value
        return
    if rollout.starts is None or rollout.state is None:
        raise ValueError("a recurrent net's update needs a rollout with starts and state")
    t, n = rollout.num_steps, rollout.num_envs
    device = rollout.obs.device
    order = torch.randperm(n, device=device)
    rows = torch.arange(t, device=device).unsqueeze(1) * n  # row of (step t, env 0)
    size = n // config.num_minibatches
    h, c = rollout.state
    for start in range(0, n, size):
        envs = order[start : start + size]
        dist, value, _ = net.unroll(
            rollout.obs[:, envs], rollout.starts[:, envs], (h[envs], c[envs])
        )
        yield (rows + envs).flatten(), dist, value


class PPO(ActorCriticLearner):
    """The actor-critic trained by PPO's clipped objective, with Adam (eps 1e-5)."""

    tunable = tunables(**ActorCriticLearner.tunable, clip_coef=POSITIVE)
    search = ranges(**ActorCriticLearner.search, clip_coef=Range(0.05, 0.4))

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        return adam(params, self.config.learning_rate, self.device, eps=1e-5)

    def update(self, rollout: Rollout) -> dict[str, float]:
        """PPO epochs over one rollout; returns the losses and diagnostics to log."""
        config, net = self.config, self.net
        hp = self.hp.values()
        clip, gamma = hp["clip_coef"], hp["gamma"]
        advantages, returns = gae(rollout.bootstrapped_rewards(gamma), rollout.values,
                                  rollout.ends, rollout.next_value, gamma, hp["gae_lambda"])  # fmt: skip
        actions = rollout.actions.flatten(0, 1)
        old_logprobs, old_values = rollout.logprobs.flatten(), rollout.values.flatten()
        advantages, returns = advantages.flatten(), returns.flatten()
        clipfracs: list[torch.Tensor] = []  # on the device: no host wait per minibatch
        approx_kl = old_approx_kl = torch.zeros(())
        pg_loss = v_loss = entropy_loss = torch.zeros(())
        for _ in range(config.update_epochs):
            for mb, dist, new_value in minibatches(config, net, rollout):
                logratio = net.log_prob(dist, actions[mb]) - old_logprobs[mb]
                ratio = logratio.exp()
                with torch.no_grad():
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > clip).float().mean())
                adv = advantages[mb]
                if config.norm_adv:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                if config.clip_vloss:
                    unclipped = (new_value - returns[mb]) ** 2
                    clipped = old_values[mb] + (new_value - old_values[mb]).clamp(-clip, clip)
                    v_loss = 0.5 * torch.max(unclipped, (clipped - returns[mb]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((new_value - returns[mb]) ** 2).mean()
                entropy_loss = net.entropy(dist).mean()
                loss = pg_loss - hp["ent_coef"] * entropy_loss + hp["vf_coef"] * v_loss
                self.descend(loss, hp["max_grad_norm"])
            if config.target_kl is not None and approx_kl.item() > config.target_kl:
                break
        y_pred, y_true = old_values.cpu().numpy(), returns.cpu().numpy()
        var_y = np.var(y_true)
        explained = float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)
        return {
            "losses/value_loss": v_loss.item(),
            "losses/policy_loss": pg_loss.item(),
            "losses/entropy": entropy_loss.item(),
            "losses/old_approx_kl": old_approx_kl.item(),
            "losses/approx_kl": approx_kl.item(),
            "losses/clipfrac": torch.stack(clipfracs).mean().item(),
            "losses/explained_variance": explained,
        }


class Trainer(OnPolicyTrainer):
    """PPO on the sampler: a rollout, then its epochs of minibatch updates."""

    make_learner = PPO
