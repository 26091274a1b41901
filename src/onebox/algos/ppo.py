"""PPO (Schulman et al. 2017) with CleanRL's defaults, on onebox's env pools and sampler.

    onebox train ppo --env CartPole-v1
    onebox train ppo --env Pong-v5 --sampler double

One iteration collects `num_steps` steps from each of `num_envs` envs (sync or double-buffered, see
`onebox.sampling.Sampler`), computes GAE advantages, and runs `update_epochs` epochs of minibatch
updates of the clipped surrogate objective with value clipping, an entropy bonus, gradient norm
clipping and optional KL early stopping. The learning rate anneals linearly to zero.

Defaults come from a preset per env family, equal to CleanRL's scripts so results compare:
`classic` (ppo.py), `atari` (ppo_atari_envpool.py), `continuous` (ppo_continuous_action.py, with
observation and reward normalization). Any field given on the command line wins over the preset.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

import onebox.envs
from onebox import run
from onebox.algos.common import (
    check_positive,
    fill_preset,
    parse_env_options,
    probe_env,
    resolve_device,
    seed_everything,
)
from onebox.nn.networks import ActorCritic
from onebox.nn.normalize import ObsNormalizer, RewardScaler
from onebox.sampling import Rollout, Sampler, gae

PRESETS: dict[str, dict[str, Any]] = {
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
}  # fmt: skip
"""CleanRL's hyperparameters per env family; the fields left None in `Config` come from here."""


@dataclasses.dataclass
class Config:
    """Train an agent with PPO. Fields left unset come from the env family's preset."""

    env: str = "CartPole-v1"
    """Env id (`onebox envs` lists them)."""
    env_options: dict[str, str] = dataclasses.field(default_factory=dict)
    """The env's own options as KEY VALUE pairs, e.g. `--env-options stack_num 1`."""
    preset: Literal["auto", "classic", "atari", "continuous"] = "auto"
    """Hyperparameter preset: `auto` picks by env (Atari, continuous actions, or classic)."""
    total_steps: int | None = None
    """Env steps to train for (preset: 500k classic, 10M Atari, 1M continuous)."""
    num_envs: int | None = None
    """Envs stepped in parallel (preset: 4 classic, 8 Atari, 1 continuous)."""
    num_steps: int | None = None
    """Steps per env in each rollout (preset: 128, or 2048 continuous)."""
    learning_rate: float | None = None
    """Adam learning rate (preset: 2.5e-4, or 3e-4 continuous)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over the run."""
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
    normalize_obs: bool | None = None
    """Running observation normalization (preset: on for continuous control only)."""
    normalize_reward: bool | None = None
    """Scale rewards by the running std of the discounted return (preset: continuous only)."""
    sampler: Literal["sync", "double"] = "sync"
    """`sync` steps all envs then infers; `double` overlaps two halves (needs even num_envs)."""
    num_threads: int | None = None
    """Env pool threads (default: physical cores)."""
    torch_threads: int | None = None
    """CPU threads for torch (default: 1 for MLPs, whose small ops only lose from more; the
    physical cores for CNNs)."""
    seed: int = 1
    """Seed of the env pool, the network initialization and the sampling."""
    device: str = "auto"
    """Torch device: `auto` (CUDA if present), `cpu`, `cuda`, `cuda:1`, ..."""
    torch_deterministic: bool = True
    """Deterministic cuDNN kernels."""
    runs_dir: str = "runs"
    """Where run folders are created."""
    name: str | None = None
    """Run folder name (default: env__ppo__seed__time)."""
    checkpoint_minutes: float = 10.0
    """Save a checkpoint this often (and always at the end or on Ctrl-C); 0 = only at the end."""
    progress: bool | None = None
    """Show a progress bar (default: when stderr is a terminal)."""
    track: bool = False
    """Also log to Weights & Biases."""
    wandb_project: str = "onebox"
    """Weights & Biases project for `--track`."""

    @property
    def batch_size(self) -> int:
        assert self.num_envs is not None and self.num_steps is not None
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        assert self.num_minibatches is not None
        return self.batch_size // self.num_minibatches

    @property
    def num_iterations(self) -> int:
        assert self.total_steps is not None
        return max(1, self.total_steps // self.batch_size)


def resolve(config: Config) -> Config:
    """Fill the preset and check every field; raise ValueError before any work starts."""
    env_kwargs = parse_env_options(config.env_options)
    if onebox.envs.backend_of(config.env) is None:
        onebox.envs.make(config.env)  # raises the unknown-id error with suggestions
    family, obs_space, act_space = probe_env(config.env, **env_kwargs)
    ActorCritic.check_spaces(obs_space, act_space)
    family = config.preset if config.preset != "auto" else family
    config = fill_preset(config, PRESETS[family])
    if config.preset == "auto":
        config = dataclasses.replace(config, preset=family)
    if config.num_threads is None:
        config = dataclasses.replace(config, num_threads=onebox.envs.physical_cores())
    if config.torch_threads is None:
        threads = onebox.envs.physical_cores() if family == "atari" else 1
        config = dataclasses.replace(config, torch_threads=threads)
    check_positive(config, "total_steps", "num_envs", "num_steps", "learning_rate")
    check_positive(config, "num_minibatches", "update_epochs", "clip_coef", "torch_threads")
    if config.batch_size % config.num_minibatches:
        raise ValueError(
            f"--num-minibatches {config.num_minibatches} does not divide the batch of "
            f"num_envs * num_steps = {config.batch_size} steps; pick a divisor"
        )
    if config.sampler == "double" and (config.num_envs < 2 or config.num_envs % 2):
        raise ValueError(f"--sampler double needs an even --num-envs >= 2, got {config.num_envs}")
    if not 0 <= config.gamma <= 1 or not 0 <= config.gae_lambda <= 1:
        raise ValueError("--gamma and --gae-lambda must be in [0, 1]")
    resolve_device(config.device)
    return config


# ---- the agent ----------------------------------------------------------------------------------


def make_envs(config: Config, num_envs: int | None = None, seed: int | None = None) -> Any:
    """The training env pool (same-step autoreset, half batches for double buffering)."""
    n = num_envs if num_envs is not None else config.num_envs
    assert n is not None
    return onebox.envs.make(
        config.env,
        n,
        batch_size=n // 2 if config.sampler == "double" and num_envs is None else None,
        num_threads=config.num_threads,
        seed=config.seed if seed is None else seed,
        autoreset_mode="SameStep",
        **parse_env_options(config.env_options),
    )


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


def make_agent(config: Config, envs: Any, device: torch.device) -> Agent:
    net = ActorCritic(envs.single_observation_space, envs.single_action_space).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.learning_rate, eps=1e-5)
    obs_norm = ObsNormalizer(envs.single_observation_space.shape) if config.normalize_obs else None
    scaler = RewardScaler(envs.num_envs, config.gamma) if config.normalize_reward else None
    return Agent(net, optimizer, obs_norm, scaler)


# ---- the update ---------------------------------------------------------------------------------


def update(config: Config, agent: Agent, rollout: Rollout) -> dict[str, float]:
    """PPO epochs over one rollout; returns the losses and diagnostics to log."""
    net, optimizer = agent.net, agent.optimizer
    advantages, returns = gae(
        rollout.rewards,
        rollout.values,
        rollout.ends,
        rollout.next_value,
        config.gamma,
        config.gae_lambda,
    )
    obs = rollout.obs.flatten(0, 1)
    actions = rollout.actions.flatten(0, 1)
    old_logprobs, old_values = rollout.logprobs.flatten(), rollout.values.flatten()
    advantages, returns = advantages.flatten(), returns.flatten()
    clip = config.clip_coef
    assert clip is not None and config.ent_coef is not None and config.update_epochs is not None
    clipfracs: list[float] = []
    approx_kl = old_approx_kl = torch.zeros(())
    pg_loss = v_loss = entropy_loss = torch.zeros(())
    for _ in range(config.update_epochs):
        order = torch.randperm(config.batch_size, device=obs.device)
        for start in range(0, config.batch_size, config.minibatch_size):
            mb = order[start : start + config.minibatch_size]
            dist, new_value = net.dist(obs[mb])
            logratio = net.log_prob(dist, actions[mb]) - old_logprobs[mb]
            ratio = logratio.exp()
            with torch.no_grad():
                old_approx_kl = (-logratio).mean()
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfracs.append(((ratio - 1.0).abs() > clip).float().mean().item())
            adv = advantages[mb]
            if config.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
            if config.clip_vloss:
                unclipped = (new_value - returns[mb]) ** 2
                clipped_value = old_values[mb] + (new_value - old_values[mb]).clamp(-clip, clip)
                v_loss = 0.5 * torch.max(unclipped, (clipped_value - returns[mb]) ** 2).mean()
            else:
                v_loss = 0.5 * ((new_value - returns[mb]) ** 2).mean()
            entropy_loss = net.entropy(dist).mean()
            loss = pg_loss - config.ent_coef * entropy_loss + config.vf_coef * v_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), config.max_grad_norm)
            optimizer.step()
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
        "losses/clipfrac": float(np.mean(clipfracs)),
        "losses/explained_variance": explained,
        "charts/learning_rate": optimizer.param_groups[0]["lr"],
    }


# ---- the run ------------------------------------------------------------------------------------


def train(config: Config, resume: Path | None = None) -> Path:
    """Train (or, with `resume`, continue the run in that folder); return the run folder."""
    if resume is None:
        config = resolve(config)
        run_dir = run.new_run_dir(config.runs_dir, config.name, env_id=config.env, algo="ppo",
                                  seed=config.seed)  # fmt: skip
        run.save_config(run_dir, config)
        state: dict[str, Any] | None = None
    else:
        run_dir = Path(resume)
        state = run.load_checkpoint(run_dir)
    assert config.total_steps is not None
    device = resolve_device(config.device)
    seed_everything(config.seed, config.torch_deterministic)
    torch.set_num_threads(config.torch_threads or 1)

    envs = make_envs(config)
    agent = make_agent(config, envs, device)
    split = run.TimeSplit()
    sampler = Sampler(
        envs,
        agent.net,
        config.num_steps or 0,
        device=device,
        gamma=config.gamma,
        double_buffered=config.sampler == "double",
        obs_transform=agent.obs_norm,
        reward_transform=agent.reward_scaler,
        timer=split,
    )
    iteration, global_step, env_seed, elapsed = 0, 0, config.seed, 0.0
    if state is not None:
        agent.load_state_dict(state["agent"])
        iteration, global_step = state["iteration"], state["global_step"]
        elapsed = state["elapsed"]
        # Env states cannot be saved (an emulator's RAM, a simulator's contacts): the envs
        # restart from fresh episodes, with seeds no earlier episode used.
        env_seed = config.seed + iteration * envs.num_envs
    sampler.reset(seed=env_seed)
    if state is not None:
        run.set_rng_state(state["rng"])

    logger = run.Logger(run_dir, start_step=global_step, elapsed=elapsed, track=config.track,
                        project=config.wandb_project, config=config)  # fmt: skip
    checkpointer = run.Checkpointer(run_dir, config.checkpoint_minutes)

    def save() -> None:
        logger.flush()  # the logs up to the checkpoint survive a kill, as the checkpoint does
        checkpointer.save({
            "agent": agent.state_dict(), "iteration": iteration, "global_step": global_step,
            "elapsed": logger.elapsed(), "rng": run.rng_state(), "env_seed": env_seed,
        })  # fmt: skip

    start_time, start_step = time.perf_counter(), global_step
    with (
        run.Progress(config.total_steps, start_step=global_step, enabled=config.progress,
                     description=f"ppo {config.env}") as progress,
        run.GracefulInterrupt() as interrupt,
    ):  # fmt: skip
        try:
            while iteration < config.num_iterations and not interrupt.requested:
                if config.anneal_lr:
                    frac = 1.0 - iteration / config.num_iterations
                    agent.optimizer.param_groups[0]["lr"] = frac * config.learning_rate
                rollout = sampler.collect()
                global_step += config.batch_size
                with split("learn"):
                    stats = update(config, agent, rollout)
                iteration += 1
                returns, lengths = sampler.episodes.pop()
                if returns:
                    logger.episodes(global_step, returns, lengths)
                sps = (global_step - start_step) / (time.perf_counter() - start_time)
                stats["charts/SPS"] = sps
                stats.update({f"time/{k}": v for k, v in split.fractions().items()})
                logger.scalars(global_step, stats)
                progress.update(global_step, logger.recent_return)
                if checkpointer.due():
                    save()
            save()
        finally:
            logger.close()
            envs.close()
    run.plot_curves(run_dir)
    return run_dir


def resume(run_dir: Path) -> Path:
    """Continue the run in `run_dir` from its last checkpoint."""
    return train(run.load_config(run_dir, Config), resume=run_dir)


# ---- eval ---------------------------------------------------------------------------------------


def load_policy(run_dir: Path, config: Config, device: str = "cpu") -> Any:
    """The trained policy of a run: a batch of observations -> a batch of greedy actions."""
    state = run.load_checkpoint(run_dir)["agent"]
    with make_envs(config, num_envs=1) as probe:
        agent = make_agent(config, probe, torch.device(device))
    agent.load_state_dict(state)
    net, norm = agent.net.eval(), agent.obs_norm

    def policy(obs: np.ndarray) -> np.ndarray:
        x = norm(obs, update=False) if norm is not None else obs
        action, _, _ = net.act(torch.as_tensor(x, device=device), deterministic=True)
        return action.cpu().numpy()

    return policy
