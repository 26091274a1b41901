"""PPO (Schulman et al. 2017) with CleanRL's defaults, on onebox's env pools and sampler.

    onebox train ppo --env CartPole-v1
    onebox train ppo --env Pong-v5 --sampler double

One iteration collects `num_steps` steps from each of `num_envs` envs (sync or double-buffered, see
`onebox.sampling.Sampler`), computes GAE advantages, and runs `update_epochs` epochs of minibatch
updates of the clipped surrogate objective with value clipping, an entropy bonus, gradient norm
clipping and optional KL early stopping. The learning rate anneals linearly to zero. The update
is written for several learners at once (`update_together`: a population's members, their nets
stacked into one forward and backward pass per minibatch, `onebox.pbt.shared`); one run's
`PPO.update` is that of one learner.

With `--lstm H` the network has an LSTM core (CleanRL's ppo_atari_lstm): the sampler carries each
env's state, and a minibatch is a group of whole envs (num_envs / num_minibatches of them), each
replayed over the rollout from its stored initial state with the stored episode starts.

Defaults come from a preset per env family, equal to CleanRL's scripts so results compare:
`classic` (ppo.py), `atari` (ppo_atari_envpool.py), `continuous` (ppo_continuous_action.py, with
observation and reward normalization); `minatar` (`MinAtar/*` ids) is purejaxql's MinAtar PPO. Any field given on the command line wins over the preset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from onebox.algos.common import adam, check_positive, fill_log_every
from onebox.algos.onpolicy import ActorCriticLearner, OnPolicyTrainer, resolve_common
from onebox.algos.trainer import POSITIVE, Learner, Range, ranges, tunables
from onebox.nn.accel import AccelFields
from onebox.nn.networks import ActorCritic
from onebox.nn.stacked import StackedNets
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
    config: Config, nets: Sequence[ActorCritic], batch: dict[str, torch.Tensor],
    rollout: Rollout, stacked: StackedNets | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:  # fmt: skip
    """One epoch's minibatches of each net's own batch, in random order, each computed when
    reached (after the previous one's optimizer steps): (its rows, (nets, rows), of each net's
    flattened (T * E) rollout; the nets' actor head outputs and values on them).

    Feed-forward nets get random rows, each its own order (several: in one forward of their
    `stacked` nets); a recurrent one (alone) groups of whole envs, replayed with
    `unroll_outputs` from `rollout`'s stored initial state and episode starts."""
    n = len(nets)
    if not nets[0].recurrent:
        obs = batch["obs"]
        device = obs.device
        order = torch.stack([torch.randperm(config.batch_size, device=device) for _ in nets])
        own = torch.arange(n, device=device).unsqueeze(1)
        for start in range(0, config.batch_size, config.minibatch_size):
            mb = order[:, start : start + config.minibatch_size]
            if stacked is None:
                out, value = nets[0].outputs(obs[0, mb[0]])
                yield mb, out.unsqueeze(0), value.unsqueeze(0)
            else:
                yield mb, *stacked(stacked.weights(), obs[own, mb])
        return
    if rollout.starts is None or rollout.state is None:
        raise ValueError("a recurrent net's update needs a rollout with starts and state")
    t, e = rollout.num_steps, rollout.num_envs
    device = rollout.obs.device
    order = torch.randperm(e, device=device)
    rows = torch.arange(t, device=device).unsqueeze(1) * e  # row of (step t, env 0)
    size = e // config.num_minibatches
    h, c = rollout.state
    for start in range(0, e, size):
        envs = order[start : start + size]
        out, value, _ = nets[0].unroll_outputs(
            rollout.obs[:, envs], rollout.starts[:, envs], (h[envs], c[envs])
        )
        yield (rows + envs).flatten().unsqueeze(0), out.unsqueeze(0), value.unsqueeze(0)


def prepared(hp: dict[str, float], rollout: Rollout) -> dict[str, torch.Tensor]:
    """A rollout as PPO's update reads it, with a learner's hyperparameters `hp` (its discount
    and GAE lambda): observations, actions, log-probabilities, values, advantages and returns,
    flattened to (T * E, ...)."""
    advantages, returns = gae(rollout.bootstrapped_rewards(hp["gamma"]), rollout.values,
                              rollout.ends, rollout.next_value, hp["gamma"], hp["gae_lambda"])  # fmt: skip
    return {"obs": rollout.obs.flatten(0, 1), "actions": rollout.actions.flatten(0, 1),
            "logprobs": rollout.logprobs.flatten(), "values": rollout.values.flatten(),
            "advantages": advantages.flatten(), "returns": returns.flatten()}  # fmt: skip


def update_together(learners: Sequence[PPO], rollouts: Sequence[Rollout]) -> list[dict[str, float]]:
    """PPO's epochs for `learners` (one config but for their hyperparameters), each on its own
    rollout, in one forward and one backward pass per minibatch (the nets stacked,
    `StackedNets`; one learner: its own net); each learner then clips its own gradients and
    steps its own optimizer, and stops its epochs early at its own `target_kl`. Returns each
    learner's losses and diagnostics to log. The population's batched update
    (`onebox.pbt.shared`) and, with one learner, `PPO.update`."""
    first = learners[0]
    config, nets, device = first.config, [lr.net for lr in learners], first.device
    if len(learners) > 1 and (nets[0].recurrent or not nets[0].discrete):
        raise ValueError("PPO updates several learners together with feed-forward nets and "
                         "discrete actions only")  # fmt: skip
    hps = [lr.hp.values() for lr in learners]
    each = [prepared(hp, r) for hp, r in zip(hps, rollouts, strict=True)]
    batch = {key: torch.stack([b[key] for b in each]) if len(each) > 1 else each[0][key][None]
             for key in each[0]}  # fmt: skip
    grad_norms = [hp.get("max_grad_norm") for hp in hps]
    stacked = StackedNets(nets) if len(nets) > 1 else None

    def column(name: str) -> torch.Tensor:
        return torch.tensor([hp[name] for hp in hps], device=device)

    clip = column("clip_coef").unsqueeze(1)  # (learners, 1): against each learner's rows
    ent_coef, vf_coef = column("ent_coef"), column("vf_coef")
    own = torch.arange(len(learners), device=device).unsqueeze(1)
    active = list(range(len(learners)))
    clipfracs: list[torch.Tensor] = []  # on the device: no host wait per minibatch
    losses: dict[str, torch.Tensor] = {}  # the last minibatch's, per learner
    stats: dict[int, dict[str, float]] = {}  # of the learners whose epochs are over

    def finish(learners_done: list[int]) -> None:
        table = {**{key: v.tolist() for key, v in losses.items()},
                 "losses/clipfrac": torch.stack(clipfracs).mean(0).tolist()}  # fmt: skip
        for k in learners_done:
            stats[k] = {key: v[k] for key, v in table.items()}

    for _ in range(config.update_epochs):
        for mb, out, new_value in minibatches(config, nets, batch, rollouts[0], stacked):
            part = {key: batch[key][own, mb] for key in batch if key != "obs"}
            dist = nets[0].distribution(out)
            logratio = nets[0].log_prob(dist, part["actions"]) - part["logprobs"]
            ratio = logratio.exp()
            with torch.no_grad():
                losses["losses/old_approx_kl"] = (-logratio).mean(-1)
                losses["losses/approx_kl"] = ((ratio - 1) - logratio).mean(-1)
                clipfracs.append(((ratio - 1.0).abs() > clip).float().mean(-1))
            adv = part["advantages"]
            if config.norm_adv:
                adv = (adv - adv.mean(-1, keepdim=True)) / (adv.std(-1, keepdim=True) + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean(-1)
            returns, old_values = part["returns"], part["values"]
            if config.clip_vloss:
                unclipped = (new_value - returns) ** 2
                clipped = old_values + (new_value - old_values).clamp(-clip, clip)
                v_loss = 0.5 * torch.max(unclipped, (clipped - returns) ** 2).mean(-1)
            else:
                v_loss = 0.5 * ((new_value - returns) ** 2).mean(-1)
            entropy_loss = nets[0].entropy(dist).mean(-1)
            loss = pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
            descend_together([learners[k] for k in active], loss[active],
                             [grad_norms[k] for k in active])  # fmt: skip
            losses.update({"losses/value_loss": v_loss.detach(),
                           "losses/policy_loss": pg_loss.detach(),
                           "losses/entropy": entropy_loss.detach()})  # fmt: skip
        if config.target_kl is not None:
            kl = losses["losses/approx_kl"].tolist()
            finish([k for k in active if kl[k] > config.target_kl])
            active = [k for k in active if kl[k] <= config.target_kl]
            if not active:
                break
    finish(active)
    y_pred, y_true = batch["values"].cpu().numpy(), batch["returns"].cpu().numpy()
    return [{**stats[k], "losses/explained_variance": explained_variance(y_pred[k], y_true[k])}
            for k in range(len(learners))]  # fmt: skip


def descend_together(
    learners: Sequence[Learner], losses: torch.Tensor, max_grad_norms: Sequence[float | None]
) -> None:
    """One optimizer step of each of `learners` down its own loss, `losses[i]` for learner i:
    one backward pass of their sum (their parameters apart, each gets its own gradients), then
    each learner's step, its gradients clipped to its `max_grad_norms[i]`
    (`Learner.apply_gradients`)."""
    for lr in learners:
        lr.optimizer.zero_grad()
    losses.sum().backward()
    for lr, max_grad_norm in zip(learners, max_grad_norms, strict=True):
        lr.apply_gradients(max_grad_norm)


def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """1 - Var(y_true - y_pred) / Var(y_true) (NaN when y_true is constant)."""
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)


class PPO(ActorCriticLearner):
    """The actor-critic trained by PPO's clipped objective, with Adam (eps 1e-5)."""

    tunable = tunables(**ActorCriticLearner.tunable, clip_coef=POSITIVE)
    search = ranges(**ActorCriticLearner.search, clip_coef=Range(0.05, 0.4))
    update_together = staticmethod(update_together)

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        return adam(params, self.config.learning_rate, self.device, eps=1e-5)

    def update(self, rollout: Rollout) -> dict[str, float]:
        """PPO epochs over one rollout; returns the losses and diagnostics to log."""
        return update_together([self], [rollout])[0]


class Trainer(OnPolicyTrainer):
    """PPO on the sampler: a rollout, then its epochs of minibatch updates."""

    make_learner = PPO
