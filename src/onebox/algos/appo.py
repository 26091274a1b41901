"""APPO (Sample Factory, Petrenko et al. 2020): PPO's clipped objective on V-trace targets, with
IMPALA's asynchronous actors and central inference.

    onebox train appo --env CartPole-v1 --actors 2

Actors and the inference server are IMPALA's (`onebox.algos.impala`). For each batch of unrolls
the learner computes V-trace value targets and advantages once with its current weights, then
runs `update_epochs` epochs of `num_minibatches` minibatches of the clipped surrogate, whose ratio
is taken against the behaviour policy that chose the actions (so stale samples are clipped, not
trusted), the value loss against the V-trace targets and an entropy bonus. Every optimizer step
bumps the server's weights version; policy lag is logged as IMPALA's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch

from onebox.algos import actor_learner, impala
from onebox.algos.common import check_positive
from onebox.algos.trainer import POSITIVE, Range, ranges, tunables
from onebox.algos.vtrace import vtrace
from onebox.run.presets import Presets


@dataclasses.dataclass
class Config(impala.Config):
    """Train an agent with APPO (PPO's clipped loss on V-trace targets). Fields left unset come
    from the env family's preset (IMPALA's, with APPO's own for classic control and MinAtar)."""

    preset: Literal["auto", "classic", "atari", "minatar"] = "auto"
    unroll: int | None = None
    """Steps per unroll (preset: 8 classic, 20 Atari)."""
    learning_rate: float | None = None
    """Learning rate (preset: Adam 2.5e-3 classic, RMSProp 6e-4 Atari, Adam 5e-3 MinAtar), linearly
    annealed."""
    clip_coef: float = 0.2
    """Surrogate clipping coefficient."""
    update_epochs: int | None = None
    """Epochs over each batch of unrolls (preset: 4 classic, 2 Atari)."""
    num_minibatches: int | None = None
    """Minibatches per epoch (preset: 4 classic, 2 Atari); must divide the batch's env steps (with
    `--lstm`, its env columns: `batch_unrolls * envs_per_actor`, each minibatch replaying whole
    columns)."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""


PRESETS = Presets(Config, {
    family: {**impala.PRESETS.get(family, {}), **own}
    for family, own in {
        "classic": dict(unroll=8, batch_unrolls=4, learning_rate=2.5e-3, update_epochs=4,
                        num_minibatches=2),
        "atari": dict(update_epochs=2, num_minibatches=2),
        "minatar": dict(
            total_steps=10_000_000, actors=2, envs_per_actor=16, unroll=32, batch_unrolls=4,
            learning_rate=5e-3, optimizer="adam", max_grad_norm=0.5, update_epochs=4,
            num_minibatches=4, ent_coef=1e-4,
        ),
    }.items()
})  # fmt: skip
"""IMPALA's presets, with APPO's own for classic control: batches of 4 unrolls of 8 steps from
8 envs (256 steps), 4 epochs of 2 minibatches at Adam 2.5e-3: 8 optimizer steps per 256 env
steps. On CartPole-v1 (seeds 1-4, 2026-12-02) the best 20-episode mean reached 475 at 31k-48k
steps and 500 within 100k, at 8,600-8,900 SPS on a 2-core machine. The preset before (one
unroll a batch, 4 epochs of 4 minibatches: 16 optimizer steps per 64 env steps, 8 times as many
per env step) reached 475 at 22k-33k but ran at 2,550 SPS, its learner 99.7% of the run (a
default run of 500k steps took 491 s where IMPALA's took 98 s); 4 epochs of 4 minibatches of
4 unrolls reached 475 at 22k-28k at 6,900-7,200 SPS, 2 epochs of 2 at 8,900-9,300 SPS but not
in every seed (365 and a collapse to 227 in 100k). With the preset before and `--lstm 64` it
passed 150 at 27k-35k steps and reached 321-500 within 100k (IMPALA's preset: 40-63 at 80k). For MinAtar (the MinAtar CNN): 2 actors x 16 envs, batches of 4 unrolls of 32 steps
(2,048 steps), 4 epochs of 4 minibatches, gradient clip 0.5, and PPO's MinAtar learning rate and
entropy coefficient (Adam 5e-3, 1e-4). On MinAtar/Breakout-v1 at 1M steps the last 100 training
episodes averaged 18.1, 16.4 and 16.5 (seeds 1-3), where Adam 1e-3 with IMPALA's entropy 0.01
gave 7.6, 7.2 and 6.7, entropy 1e-4 at 1e-3 10.0 and at 3e-3 15.6 and 15.4 (docs/results.md)."""


def resolve(config: Config) -> Config:
    """IMPALA's checks plus APPO's own; raise ValueError before any work starts."""
    config = impala.resolve(config, PRESETS)
    check_positive(config, "clip_coef", "update_epochs", "num_minibatches")
    if config.batch_size % config.num_minibatches:
        raise ValueError(
            f"--num-minibatches {config.num_minibatches} does not divide the batch of "
            f"unroll * batch_unrolls * envs_per_actor = {config.batch_size} steps; pick a divisor"
        )
    columns = config.batch_unrolls * config.envs_per_actor
    if config.lstm is not None and columns % config.num_minibatches:
        raise ValueError(
            f"with --lstm, --num-minibatches {config.num_minibatches} must divide the batch's "
            f"batch_unrolls * envs_per_actor = {columns} env columns; pick a divisor"
        )
    return config


class APPO(impala.IMPALA):
    """IMPALA's learner, its update PPO's epochs on V-trace targets: for each batch, V-trace
    targets and advantages once with the current weights, then `update_epochs` epochs of
    `num_minibatches` minibatches of the clipped surrogate, whose ratio is taken against the
    behaviour policy that chose the actions."""

    tunable = tunables(**impala.IMPALA.tunable, clip_coef=POSITIVE)
    search = ranges(**impala.IMPALA.search, clip_coef=Range(0.05, 0.4))

    def learn(self, batch: dict[str, Any]) -> dict[str, float]:
        config, net, hp = self.config, self.net, self.hp.values()
        obs, actions, behaviour = batch["obs"], batch["actions"], batch["logprobs"]
        t_len, b = actions.shape
        starts, state = batch["starts"], batch["state"]
        with torch.no_grad():
            dist, values, last = net.unroll(obs, starts, state)
            logprobs = net.log_prob(dist, actions.flatten()).view(t_len, b)
            bootstrap = impala.bootstrap_value(net, batch, last)
            vt = vtrace(logprobs - behaviour, batch["rewards"], values.view(t_len, b),
                        batch["ends"], bootstrap, hp["gamma"], hp["rho_bar"], hp["c_bar"])  # fmt: skip
        clip = hp["clip_coef"]
        flat = {"obs": obs.flatten(0, 1), "actions": actions.flatten(0, 1),
                "behaviour": behaviour.flatten(), "advantages": vt.advantages.flatten(),
                "vs": vt.vs.flatten()}  # fmt: skip
        clipfracs: list[torch.Tensor] = []  # on the device: no host wait per minibatch
        pg_loss = v_loss = entropy = torch.zeros(())
        for _ in range(config.update_epochs):
            for mb in minibatches(config, net.recurrent, t_len, b, obs.device):
                if net.recurrent:  # whole env columns, replayed from their start states
                    mb_state = (state[0][mb], state[1][mb])
                    dist, value, _ = net.unroll(obs[:, mb], starts[:, mb], mb_state)
                    rows = (torch.arange(t_len, device=mb.device)[:, None] * b + mb).flatten()
                else:  # single steps of the flattened (T * B) batch
                    dist, value = net.dist(flat["obs"][mb])
                    rows = mb
                ratio = (net.log_prob(dist, flat["actions"][rows]) - flat["behaviour"][rows]).exp()
                adv = flat["advantages"][rows]
                if config.norm_adv:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                v_loss = 0.5 * ((value - flat["vs"][rows]) ** 2).mean()
                entropy = net.entropy(dist).mean()
                loss = pg_loss + hp["vf_coef"] * v_loss - hp["ent_coef"] * entropy
                self.descend(loss, hp["max_grad_norm"])
                clipfracs.append(((ratio.detach() - 1).abs() > clip).float().mean())
        return {
            "losses/policy_loss": pg_loss.item(),
            "losses/value_loss": v_loss.item(),
            "losses/entropy": entropy.item(),
            "losses/clipfrac": torch.stack(clipfracs).mean().item(),
            "losses/mean_rho": vt.rhos.mean().item(),
        }


def minibatches(
    config: Config, recurrent: bool, t_len: int, b: int, device: torch.device
) -> list[torch.Tensor]:
    """One epoch's minibatches: shuffled env columns for a recurrent net (each replayed whole),
    shuffled steps (flat indices into (T, B)) otherwise."""
    size = b if recurrent else t_len * b
    order = torch.randperm(size, device=device)
    return list(order.chunk(config.num_minibatches))


class Trainer(actor_learner.ActorLearnerTrainer):
    """APPO: IMPALA's actors, inference server and FIFO, PPO's clipped loss."""

    make_learner = APPO
