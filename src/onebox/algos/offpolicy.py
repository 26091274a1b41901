"""What the replay learners (DQN, SAC) share: the replay buffer built from a config, and the run
loop (run folder, logs, progress bar, checkpoints, Ctrl-C, resume) around stepping the envs into
the buffer and updating from it.

Each vector step adds one row per env to the buffer, with the true next observation: the final
one where an episode ended (the pool runs in same-step autoreset mode and gives it in
`info["final_obs"]`), so a truncated episode bootstraps from where it was cut, while `terminated`
stops bootstrapping. Once `learning_starts` env steps have passed, an update is due every
`train_frequency` env steps: a sampled batch goes to the agent, whose new priorities (prioritized
replay) go back to the buffer.

A learner module supplies its config (a `TorchConfig` with the fields read here: total_steps,
num_envs, buffer_size, batch_size, learning_starts, train_frequency, gamma, n_step, prioritized,
priority_alpha, priority_beta, save_replay, ...) and `make_agent(config, envs, device)`, an
`Agent`. The run's folder, logs, checkpoints, progress bar and Ctrl-C are a `RunSession`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from gymnasium import spaces

import onebox.envs
from onebox import run
from onebox.algos.common import check_positive, parse_env_options, setup_torch
from onebox.nn.accel import Accel
from onebox.nn.networks import is_image
from onebox.replay import ReplayBatch, ReplayBuffer
from onebox.sampling import EpisodeTracker

REPLAY_FILE = "replay.npz"
"""The replay buffer saved beside the checkpoint with `--save-replay`."""
LOG_EVERY = 1000
"""Env steps between two logs of the losses, SPS and time split."""


class Agent(Protocol):
    """What the loop needs of a replay learner's agent; its state is what a checkpoint holds."""

    def act(self, obs: np.ndarray, step: int) -> np.ndarray:
        """Actions for a batch of observations (one per env), at env step `step`."""
        ...

    def update(self, batch: ReplayBatch, step: int) -> tuple[dict[str, float], torch.Tensor | None]:
        """One gradient update on `batch` at env step `step`: (stats to log, new priorities of
        the batch's rows for prioritized replay, else None)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


MakeAgent = Callable[[Any, Any, torch.device], Agent]


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


def load_replay(config: Any, run_dir: Path, load: Callable[[Path], None]) -> bool:
    """On resume: `load` the replay saved beside the checkpoint with `--save-replay`; False if
    there is none (the run then refills its buffer)."""
    path = run_dir / REPLAY_FILE
    if config.save_replay and path.exists():
        load(path)
        return True
    return False


def note_refill(logger: run.Logger, step: int, config: Any) -> None:
    """Tell the user that a resumed run refills its replay buffer before it learns again."""
    logger.note(step, (
        "resumed without a saved replay buffer (train with --save-replay to keep it): it "
        f"refills for {config.learning_starts} steps before learning resumes"
    ))  # fmt: skip


def frame_stack(config: Any, envs: Any) -> int:
    """Frames per observation to store once each (K for Atari's (K, H, W) stacks), else 0."""
    space = envs.single_observation_space
    if onebox.envs.backend_of(config.env) == "atari" and is_image(space):
        return int(space.shape[0]) if space.shape[0] > 1 else 0
    return 0


def make_buffer(config: Any, envs: Any) -> ReplayBuffer:
    """The replay buffer for the pool's spaces, with the config's n-step and priority options;
    Atari's frame stacks are stored as single frames."""
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    discrete = isinstance(act_space, spaces.Discrete)
    return ReplayBuffer(
        config.buffer_size,
        tuple(obs_space.shape),
        obs_space.dtype,
        () if discrete else tuple(act_space.shape),
        np.int64 if discrete else np.float32,
        envs.num_envs,
        n_step=config.n_step,
        gamma=config.gamma,
        prioritized=config.prioritized,
        alpha=config.priority_alpha,
        beta=config.priority_beta,
        beta_steps=max(1, config.total_steps // config.train_frequency),
        frame_stack=frame_stack(config, envs),
        seed=config.seed,
    )


def make_envs(config: Any, num_envs: int | None = None, seed: int | None = None) -> Any:
    """The training env pool, in same-step autoreset mode (final observations in the info)."""
    return onebox.envs.make(
        config.env,
        num_envs or config.num_envs,
        num_threads=config.num_threads,
        seed=config.seed if seed is None else seed,
        autoreset_mode="SameStep",
        **parse_env_options(config.env_options),
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


CHECKPOINT_KEYS = ("agent", "updates")
"""What a replay learner's checkpoint holds besides the session's counters."""


def run_loop(
    config: Any, algo: str, resume: Path | None, *, resolve: Callable[[Any], Any],
    make_agent: MakeAgent,
) -> Path:  # fmt: skip
    """Train (or, with `resume`, continue the run in that folder); return the run folder."""
    session = run.RunSession.open(config, resume, algo, resolve, keys=CHECKPOINT_KEYS)
    config, state = session.config, session.checkpoint
    device = setup_torch(config)
    accel = Accel.of(config, device)
    accel.setup()
    envs = make_envs(config)
    agent = make_agent(config, envs, device)
    buffer = make_buffer(config, envs)
    n = envs.num_envs
    global_step, updates, env_seed = session.step, 0, config.seed
    refilled = False
    if state is not None:
        agent.load_state_dict(state["agent"])
        updates = state["updates"]
        refilled = not load_replay(config, session.run_dir, buffer.resume_from)
        # The envs restart from fresh episodes, with seeds no earlier episode used.
        env_seed = config.seed + global_step
    # Updates start once `learning_starts` steps are in the buffer (again after a refill).
    learn_from = (global_step if refilled else 0) + config.learning_starts
    obs, _ = envs.reset(seed=env_seed)
    tracker, split, ids = EpisodeTracker(n), session.timer, np.arange(n)
    stats: dict[str, float] = {}

    def checkpoint() -> dict[str, Any]:
        if config.save_replay:  # first, so that a checkpoint never outlives its replay
            buffer.save(session.run_dir / REPLAY_FILE)
        return {"agent": agent.state_dict(), "updates": updates}

    with envs, session.start(checkpoint, total=config.total_steps):
        if refilled:
            note_refill(session.logger, global_step, config)
        while global_step + n <= config.total_steps and not session.stopping:
            with split("inference"), accel.autocast():
                actions = agent.act(obs, global_step)
            with split("env"):
                next_obs, rewards, terminated, truncated, info = envs.step(actions)
            ends = np.logical_or(terminated, truncated)
            tracker.update(ids, rewards, ends, info)
            with split("replay"):
                buffer.add(obs, actions, rewards, terminated, truncated,
                           true_next_obs(next_obs, ends, info))  # fmt: skip
            obs = next_obs
            before, global_step = global_step, global_step + n
            if global_step > learn_from:
                due = global_step // config.train_frequency - before // config.train_frequency
                for _ in range(due):
                    with split("replay"):
                        batch = buffer.sample(config.batch_size)
                    with split("learn"), accel.autocast():
                        stats, priorities = agent.update(batch, global_step)
                    if priorities is not None:
                        with split("replay"):
                            buffer.update_priorities(batch.indices, priorities.cpu().numpy())
                    updates += 1
            session.episodes(global_step, *tracker.pop())
            if global_step // LOG_EVERY > before // LOG_EVERY and stats:
                session.log(global_step, {**stats, "charts/updates": updates,
                                          **session.rates(global_step)})  # fmt: skip
            session.update(global_step)
    return session.run_dir
