"""What the on-policy learners (PPO, A2C) share: the agent a checkpoint restores, the training env
pools, the run loop around a `Sampler` (on a `RunSession`: run folder, logs, progress bar,
checkpoints, Ctrl-C, exact resume), and the greedy policy of a finished run for `onebox eval`.

A learner module supplies its config (a dataclass with the fields `run_loop` reads: env, seed,
total_steps, num_envs, num_steps, sampler, learning_rate, anneal_lr, gamma, lstm, torch_threads,
device, and `onebox.nn.accel.AccelFields`' precision and compile, ...), `make_agent(config, envs,
device)` and `update(config, agent, rollout) -> stats`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import onebox.envs
from onebox import run
from onebox.algos.common import (
    Policy,
    check_lstm,
    check_positive,
    greedy_policy,
    parse_env_options,
    resolve_env,
    setup_torch,
)
from onebox.nn.accel import Accel, check_accel
from onebox.nn.networks import ActorCritic
from onebox.nn.normalize import ObsNormalizer, RewardScaler
from onebox.run.presets import Presets
from onebox.sampling import Rollout, Sampler


@dataclasses.dataclass
class Agent:
    """Network, optimizer and normalizers: everything a checkpoint must restore."""

    net: ActorCritic
    optimizer: torch.optim.Optimizer
    obs_norm: ObsNormalizer | None
    reward_scaler: RewardScaler | None

    def state_dict(self) -> dict[str, Any]:
        return {
            "net": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "obs_norm": self.obs_norm.state_dict() if self.obs_norm else None,
            "reward_scaler": self.reward_scaler.state_dict() if self.reward_scaler else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.obs_norm is not None:
            self.obs_norm.load_state_dict(state["obs_norm"])
        if self.reward_scaler is not None:
            self.reward_scaler.load_state_dict(state["reward_scaler"])


def resolve_common(config: Any, presets: Presets) -> Any:
    """Check the env and its options, fill the env family's preset (or `config.preset`'s) into
    the fields left None, pick thread counts, and check the fields every on-policy learner has
    (sizes, learning rate, sampler, gamma, gae_lambda, device); raise ValueError on bad input."""
    config = resolve_env(config, presets, ActorCritic.check_spaces)
    check_accel(config)
    check_positive(config, "num_steps", "learning_rate")
    check_lstm(config.lstm)
    check_sampler(config)
    if not 0 <= config.gae_lambda <= 1:
        raise ValueError(f"--gae-lambda must be in [0, 1], got {config.gae_lambda}")
    return config


def check_sampler(config: Any) -> None:
    """Raise ValueError unless `config.sampler` can drive `config.num_envs` envs (double
    buffering needs an even number)."""
    if config.sampler == "double" and (config.num_envs < 2 or config.num_envs % 2):
        raise ValueError(f"--sampler double needs an even --num-envs >= 2, got {config.num_envs}")


MakeOptimizer = Callable[[Any], torch.optim.Optimizer]
"""Network parameters -> optimizer."""


def build_agent(config: Any, envs: Any, device: torch.device, optimizer: MakeOptimizer) -> Agent:
    """An `ActorCritic` for the pool's spaces (with an LSTM core of `config.lstm` units if set),
    its optimizer, and the normalizers the config asks for (`normalize_obs`, `normalize_reward`,
    the latter with a return per env of the run's `config.num_envs`)."""
    net = ActorCritic(envs.single_observation_space, envs.single_action_space, lstm=config.lstm).to(
        device
    )
    obs_norm = ObsNormalizer(envs.single_observation_space.shape) if config.normalize_obs else None
    scaler = RewardScaler(config.num_envs, config.gamma) if config.normalize_reward else None
    return Agent(net, optimizer(net.parameters()), obs_norm, scaler)


def make_probe(config: Any) -> Any:
    """A pool of one env of the run's env, for its spaces (a finished run's policy)."""
    return onebox.envs.make(config.env, 1, num_threads=1, seed=config.seed,
                            autoreset_mode="SameStep",
                            **parse_env_options(config.env_options))  # fmt: skip


def make_pools(config: Any) -> list[Any]:
    """The training env pools: one of `num_envs` envs, or with `--sampler double` two halves
    (env i seeded `seed + i` as in one pool), each with `num_threads` threads."""
    return onebox.envs.make_splits(2 if config.sampler == "double" else 1, config.env,
                                   config.num_envs, config.num_threads, config.seed,
                                   autoreset_mode="SameStep",
                                   **parse_env_options(config.env_options))  # fmt: skip


CHECKPOINT_KEYS = ("agent", "iteration", "env_seed")
"""What an on-policy learner's checkpoint holds besides the session's counters."""

MakeAgent = Callable[[Any, Any, torch.device], Agent]
Update = Callable[[Any, Agent, Rollout], dict[str, float]]


def run_loop(
    config: Any,
    algo: str,
    resume: Path | None,
    *,
    resolve: Callable[[Any], Any],
    make_agent: MakeAgent,
    update: Update,
    log_every: int = 1,
) -> Path:
    """Train (or, with `resume`, continue the run in that folder); return the run folder.

    Each iteration collects one rollout of `num_steps` steps from `num_envs` envs and calls
    `update`; its stats are logged every `log_every` iterations (and at the last one). The
    learning rate anneals linearly to 0 when `config.anneal_lr`.
    """
    session = run.RunSession.open(config, resume, algo, resolve, keys=CHECKPOINT_KEYS)
    config, state = session.config, session.checkpoint
    batch = config.num_envs * config.num_steps
    num_iterations = max(1, config.total_steps // batch)
    device = setup_torch(config)
    accel = Accel.of(config, device)
    accel.setup()

    pools = make_pools(config)
    agent = make_agent(config, pools[0], device)
    sampler = Sampler(
        pools,
        accel.policy(agent.net),
        config.num_steps,
        device=device,
        obs_transform=agent.obs_norm,
        reward_transform=agent.reward_scaler,
        timer=session.timer,
    )
    iteration, global_step, env_seed = 0, session.step, config.seed
    if state is not None:
        agent.load_state_dict(state["agent"])
        iteration = state["iteration"]
        # Env states cannot be saved (an emulator's RAM, a simulator's contacts): the envs
        # restart from fresh episodes, with seeds no earlier episode used.
        env_seed = config.seed + iteration * config.num_envs
    sampler.reset(seed=env_seed)

    def checkpoint() -> dict[str, Any]:
        return {"agent": agent.state_dict(), "iteration": iteration, "env_seed": env_seed}

    with contextlib.ExitStack() as stack:
        for pool in pools:
            stack.enter_context(pool)
        with session.start(checkpoint, total=config.total_steps):
            while iteration < num_iterations and not session.stopping:
                if config.anneal_lr:
                    frac = 1.0 - iteration / num_iterations
                    agent.optimizer.param_groups[0]["lr"] = frac * config.learning_rate
                rollout = sampler.collect()
                global_step += batch
                with session.timer("learn"), accel.autocast():
                    stats = update(config, agent, rollout)
                iteration += 1
                session.episodes(global_step, *sampler.episodes.pop())
                if iteration % log_every == 0 or iteration == num_iterations:
                    stats["charts/learning_rate"] = agent.optimizer.param_groups[0]["lr"]
                    session.log(global_step, {**stats, **session.rates(global_step)})
                session.update(global_step)
    return session.run_dir


def load_policy(run_dir: Path, config: Any, make_agent: MakeAgent, device: str = "cpu") -> Policy:
    """The trained policy of a run: greedy actions for a batch of observations."""
    state = run.load_checkpoint(run_dir, keys=CHECKPOINT_KEYS)["agent"]
    with make_probe(config) as probe:
        agent = make_agent(config, probe, torch.device(device))
    agent.load_state_dict(state)
    norm = agent.obs_norm
    return greedy_policy(
        agent.net, device, (lambda obs: norm(obs, update=False)) if norm is not None else None
    )
