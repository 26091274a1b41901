"""The replay family with one inline actor (DQN, SAC): the learner's policy steps one env pool,
each step goes into a replay buffer, and the learner updates on batches sampled from it.

`ReplayTrainer` is its trainer. One step acts on every env (`learner.act(obs, step)`), steps
the pool and adds one row per env to the buffer with the true next observation: the final one
where an episode ended (the pool runs in same-step autoreset mode and gives it in
`info["final_obs"]`), so a truncated episode bootstraps from where it was cut, while
`terminated` stops bootstrapping. Once `learning_starts` env steps have passed, an update is
due every `train_frequency` env steps: a sampled batch goes to `learner.update`, which writes
its new priorities back to the buffer (`learner.replay`) when the buffer is prioritized.

A learner module subclasses it, naming its `Learner` as `make_learner`; the config has the
fields read here: num_envs, buffer_size, batch_size, learning_starts, train_frequency, gamma,
n_step, prioritized, priority_alpha, priority_beta, save_replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces

import onebox.envs
from onebox.algos.common import check_positive, parse_env_options, setup_torch
from onebox.algos.trainer import EnvSeeds, Step, Trainer
from onebox.nn.accel import Accel
from onebox.nn.networks import is_image
from onebox.replay import ReplayBuffer
from onebox.sampling import EpisodeTracker


def check_replay(config: Any) -> None:
    """Raise ValueError on replay settings that cannot work, before any work starts."""
    check_positive(config, "buffer_size", "batch_size", "train_frequency")
    if config.learning_starts < 0:
        raise ValueError(f"--learning-starts must be >= 0, got {config.learning_starts}")
    if config.n_step <= 0:
        raise ValueError(f"--n-step must be positive (1: one-step targets), got {config.n_step}")
    if config.buffer_size < config.batch_size:
        raise ValueError(
            f"--buffer-size {config.buffer_size} is smaller than a batch (--batch-size "
            f"{config.batch_size}); make the buffer larger or the batch smaller"
        )
    if config.priority_alpha < 0 or not 0 <= config.priority_beta <= 1:
        raise ValueError("--priority-alpha must be >= 0 and --priority-beta in [0, 1]")


def frame_stack(config: Any, obs_space: Any) -> int:
    """Frames per observation to store once each (K for Atari's (K, H, W) stacks), else 0."""
    if onebox.envs.backend_of(config.env) == "atari" and is_image(obs_space):
        return int(obs_space.shape[0]) if obs_space.shape[0] > 1 else 0
    return 0


def make_buffer(config: Any, obs_space: Any, act_space: Any, num_envs: int, beta_steps: int,
                prioritized: bool) -> ReplayBuffer:  # fmt: skip
    """The replay buffer of `num_envs` envs' rows for the spaces, with the config's n-step and
    priority options (the importance-sampling exponent annealed over `beta_steps` samples);
    Atari's frame stacks are stored as single frames (Ape-X's table too)."""
    discrete = isinstance(act_space, spaces.Discrete)
    return ReplayBuffer(
        config.buffer_size,
        tuple(obs_space.shape),
        obs_space.dtype,
        () if discrete else tuple(act_space.shape),
        np.int64 if discrete else np.float32,
        num_envs,
        n_step=config.n_step,
        gamma=config.gamma,
        prioritized=prioritized,
        alpha=config.priority_alpha,
        beta=config.priority_beta,
        beta_steps=beta_steps,
        frame_stack=frame_stack(config, obs_space),
        seed=config.seed,
    )


def true_next_obs(next_obs: np.ndarray, ends: np.ndarray, info: dict[str, Any]) -> np.ndarray:
    """The observation each env's step led to: the final one where its episode ended (the pool
    has already reset it and returns the next episode's first)."""
    if not ends.any():
        return next_obs
    out = next_obs.copy()
    for i in np.flatnonzero(ends):
        out[i] = info["final_obs"][i]
    return out


class ReplayTrainer(Trainer):
    """One inline actor feeding a replay buffer that a learner samples (see the module's
    docstring)."""

    make_learner: ClassVar[Callable[..., Any]]
    """(config, observation space, action space, device) -> the learner; it has `act(obs,
    step) -> actions` besides the `Learner` contract."""

    def __init__(self, config: Any, seeds: EnvSeeds) -> None:
        super().__init__()
        self.config = config
        device = setup_torch(config)
        Accel.of(config, device).setup()
        self.num_envs = n = config.num_envs
        self.seed = seeds.take(n)
        self.envs = onebox.envs.make(config.env, n, num_threads=config.num_threads,
                                     seed=self.seed, autoreset_mode="SameStep",
                                     **parse_env_options(config.env_options))  # fmt: skip
        try:
            obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
            self.learner = self.make_learner(config, obs_space, act_space, device)
            beta_steps = max(1, config.total_steps // config.train_frequency)
            self.replay = make_buffer(
                config, obs_space, act_space, n, beta_steps, config.prioritized
            )
            self.learner.replay = self.replay
        except BaseException:
            self.close()
            raise
        self.total_steps = config.total_steps // n * n
        self.learn_from = config.learning_starts
        """Updates start once the buffer holds this many steps' transitions (again after a
        refill)."""
        self.tracker, self.ids, self.num_envs = EpisodeTracker(n), np.arange(n), n

    def start(self) -> None:
        self.obs, _ = self.envs.reset(seed=self.seed)

    def refill(self) -> str:
        self.learn_from = self.global_step + self.config.learning_starts
        return f"it refills for {self.config.learning_starts} steps before learning resumes"

    def step(self) -> Step:
        config, split, n = self.config, self.timer, self.num_envs
        with split("inference"), self.learner.autocast():
            actions = self.learner.act(self.obs, self.global_step)
        with split("env"):
            next_obs, rewards, terminated, truncated, info = self.envs.step(actions)
        ends = np.logical_or(terminated, truncated)
        self.tracker.update(self.ids, rewards, ends, info)
        with split("replay"):
            self.replay.add(self.obs, actions, rewards, terminated, truncated,
                            true_next_obs(next_obs, ends, info))  # fmt: skip
        self.obs = next_obs
        before = self.global_step
        self.global_step += n
        stats: dict[str, float] = {}
        if self.global_step > self.learn_from:
            every = config.train_frequency
            for _ in range(self.global_step // every - before // every):
                with split("replay"):
                    batch = self.replay.sample(config.batch_size)
                with split("learn"), self.learner.autocast():
                    stats = self.learner.update(batch)
                self.updates += 1
        return Step(stats, *self.tracker.pop())

    def close(self) -> None:
        self.envs.close()
