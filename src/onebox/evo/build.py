"""The evaluator and the algorithm an evolve config describes, made alike by the run in this
process (`onebox.evo.run`) and by each of its evaluation hosts on Ray
(`onebox.cluster.evolve_hosts`), which rebuild them from the run's resolved config.

A config is `onebox.evo.run`'s `GAConfig`, `ESConfig` or `RSConfig`: the settings every run
shares and its algorithm's hyperparameters (it inherits `GAParams`, `ESParams` or `RSParams`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from onebox.evo.core import Algorithm
from onebox.evo.es import ES, ESParams
from onebox.evo.evaluator import PopulationEvaluator
from onebox.evo.ga import GA, GAParams
from onebox.evo.rs import ARS, RandomSearch, RSParams


def params_of(config: Any) -> GAParams | ESParams | RSParams:
    """The algorithm's hyperparameters in an evolve config; TypeError for another config."""
    for cls in (GAParams, ESParams, RSParams):
        if isinstance(config, cls):
            return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})
    raise TypeError(f"not an evolve config: {type(config).__name__}")


def net_hidden(config: Any) -> tuple[int, ...] | None:
    """The network's hidden sizes from `--hidden`: None (the architecture's default) when unset,
    () for a linear policy (`--hidden 0`)."""
    if config.hidden is None:
        return None
    hidden = tuple(config.hidden)
    if hidden == (0,):
        return ()
    if any(h < 1 for h in hidden):
        raise ValueError(
            f"--hidden takes positive sizes, or 0 alone for a linear policy; got {hidden}"
        )
    return hidden or None


def make_evaluator(config: Any) -> PopulationEvaluator:
    """The population evaluator a config describes."""
    return PopulationEvaluator(
        config.env,
        arch=config.arch,
        hidden=net_hidden(config),
        num_slots=config.num_slots,
        slot_groups=config.slot_groups,
        num_threads=config.num_threads,
        max_episode_steps=config.max_episode_steps,
        max_envs=config.max_envs,
        device=config.device,
        dtype=config.dtype,
        native_rollout=config.native_rollout,
        episode_seeds=config.episode_seeds,
        pool_turns=config.pool_turns,
    )


def make_algorithm(config: Any, evaluator: PopulationEvaluator) -> Algorithm:
    """The algorithm a config describes, over the evaluator's networks."""
    net, dim = evaluator.net, evaluator.num_params
    device = net.device  # parameters are made where the evaluator runs them

    def init(seed: int) -> torch.Tensor:
        return net.init_params(seed, device)

    obs_shape = net.obs_shape if net.arch == "mlp" else None
    params = params_of(config)
    if isinstance(params, GAParams):
        return GA(dim, init, params, config.seed, device)
    if isinstance(params, ESParams):
        return ES(dim, init, params, config.seed, obs_shape, device)
    if params.mode == "ars":
        linear = net.arch == "mlp" and len(net.layers) == 1
        return ARS(dim, init, params, config.seed, obs_shape, device, linear)
    return RandomSearch(dim, init, params, config.seed, device)
