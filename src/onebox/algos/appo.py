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
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from onebox import run
from onebox.algos import impala
from onebox.algos.common import check_positive
from onebox.algos.vtrace import vtrace
from onebox.nn.networks import ActorCritic
from onebox.sampling.inference import InferenceServer


@dataclasses.dataclass
class Config(impala.Config):
    """Train an agent with APPO (PPO's clipped loss on V-trace targets). Fields left unset come
    from the env family's preset (IMPALA's)."""

    clip_coef: float = 0.2
    """Surrogate clipping coefficient."""
    update_epochs: int = 2
    """Epochs over each batch of unrolls."""
    num_minibatches: int = 2
    """Minibatches per epoch; must divide the batch's env steps."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""


def resolve(config: Config) -> Config:
    """IMPALA's checks plus APPO's own; raise ValueError before any work starts."""
    config = impala.resolve(config)
    check_positive(config, "clip_coef", "update_epochs", "num_minibatches")
    if config.batch_size % config.num_minibatches:
        raise ValueError(
            f"--num-minibatches {config.num_minibatches} does not divide the batch of "
            f"unroll * batch_unrolls * envs_per_actor = {config.batch_size} steps; pick a divisor"
        )
    return config


def update(
    config: Config, net: ActorCritic, opt: Any, server: InferenceServer, batch: dict[str, Any]
) -> dict[str, float]:
    """V-trace targets for the batch, then the PPO epochs on them."""
    obs, actions, behaviour = batch["obs"], batch["actions"], batch["logprobs"]
    t_len, b = actions.shape
    flat_obs = obs.flatten(0, 1)
    rewards = batch["rewards"].clone()
    with torch.no_grad():
        dist, values = net.dist(flat_obs)
        logprobs = net.log_prob(dist, actions.flatten()).view(t_len, b)
        bootstrap = net.value(batch["next_obs"])
        if batch["truncated"]:
            final = torch.as_tensor(np.stack([o for _, _, o in batch["truncated"]]))
            v_final = net.value(final.to(obs.device))
            for k, (t, i, _) in enumerate(batch["truncated"]):
                rewards[t, i] += config.gamma * v_final[k]
        vt = vtrace(logprobs - behaviour, rewards, values.view(t_len, b), batch["ends"],
                    bootstrap, config.gamma, config.rho_bar, config.c_bar)  # fmt: skip
    lag = (server.version - batch["versions"]).float()  # learner version minus behaviour version
    targets, advantages = vt.vs.flatten(), vt.advantages.flatten()
    flat_actions, flat_behaviour = actions.flatten(), behaviour.flatten()
    size = t_len * b
    mb_size = size // config.num_minibatches
    clip = config.clip_coef
    clipfracs = []
    pg_loss = v_loss = entropy = torch.zeros(())
    for _ in range(config.update_epochs):
        order = torch.randperm(size, device=obs.device)
        for start in range(0, size, mb_size):
            mb = order[start : start + mb_size]
            dist, value = net.dist(flat_obs[mb])
            ratio = (net.log_prob(dist, flat_actions[mb]) - flat_behaviour[mb]).exp()
            adv = advantages[mb]
            if config.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_loss = 0.5 * ((value - targets[mb]) ** 2).mean()
            entropy = net.entropy(dist).mean()
            loss = pg_loss + config.vf_coef * v_loss - config.ent_coef * entropy
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), config.max_grad_norm or 0.0)
            with server.updating():
                opt.step()
            clipfracs.append(((ratio.detach() - 1).abs() > clip).float().mean().item())
    return {
        "losses/policy_loss": pg_loss.item(),
        "losses/value_loss": v_loss.item(),
        "losses/entropy": entropy.item(),
        "losses/clipfrac": float(np.mean(clipfracs)),
        "losses/mean_rho": vt.rhos.mean().item(),
        "charts/policy_lag": lag.mean().item(),
        "charts/policy_lag_max": lag.max().item(),
        "charts/learning_rate": opt.param_groups[0]["lr"],
    }


def train(config: Config, resume: Path | None = None) -> Path:
    """Train (or, with `resume`, continue the run in that folder); return the run folder."""
    return impala.train_async(config, resume, "appo", resolve, update)


def resume(run_dir: Path) -> Path:
    """Continue the run in `run_dir` from its last checkpoint."""
    return train(run.load_config(run_dir, Config), resume=run_dir)


def load_policy(run_dir: Path, config: Config, device: str = "cpu") -> Any:
    """The trained policy of a run: a batch of observations -> a batch of greedy actions."""
    return impala.load_policy(run_dir, config, device)
