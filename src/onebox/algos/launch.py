"""What `onebox train` and `onebox eval` run.

`onebox train NAME` and `onebox train --resume RUN` hand the learner's config to the driver
(`onebox.algos.driver.train`); `onebox eval RUN` plays the policy of a run: a learner's through
`driver.load_policy`, an evolve run's through its module's (`onebox.evo.run.load_policy`), each
`policy(obs, starts) -> actions` (`starts` flags the envs whose observation begins an episode,
for recurrent policies). A run folder's `config.json` names its config class; only config
classes of `onebox train` and `onebox evolve` commands are accepted, checked before anything is
imported or written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

import onebox.envs
from onebox import run
from onebox.algos import driver
from onebox.envs.base import EPISODE_CAP, cap_options, time_limit


def train(config: Any) -> int:
    """Start a run of the learner whose config this is; print where it went."""
    run_dir = driver.train(config)
    print(f"run folder: {run_dir}")
    return 0


def resume(config: Any) -> int:
    """Continue the training run in `config.resume` from its last checkpoint."""
    from onebox.registry import command_of

    run_dir = Path(config.resume)
    group, name = command_of(run_dir)
    if group != "train":
        raise ValueError(
            f"{run_dir} is a run of `onebox {group} {name}`; continue it with "
            f"`onebox {group} --resume {run_dir}`"
        )
    saved = run.load_config(run_dir)
    from onebox import cluster

    module = driver.learner_module(saved)
    cluster.rehost(run_dir, saved, config.ray, config.hosts, "actor_hosts", module.resolve)
    run_dir = driver.train(run.load_config(run_dir), resume=run_dir)  # as rehost saved it
    print(f"run folder: {run_dir}")
    return 0


def play(
    policy: Any, envs: Any, episodes: int, seed: int, record: bool = False
) -> tuple[list[float], list[int], list[np.ndarray]]:
    """Play `episodes` episodes on a one-env pool; returns, lengths and (if `record`) the
    frames of the first episode: `envs.render()` when the pool renders, else the newest frame
    of each image observation (what the agent sees, e.g. Atari's 84x84 grayscale)."""
    from onebox.sampling import EpisodeTracker

    tracker = EpisodeTracker(1)
    frames: list[np.ndarray] = []
    obs, _ = envs.reset(seed=seed)
    starts = np.ones(1, np.bool_)
    while len(tracker.finished_returns) < episodes:
        if record and not tracker.finished_returns:
            frames.append(envs.render()[0] if envs.render_mode else _observed_frame(obs))
        obs, reward, terminated, truncated, info = envs.step(policy(obs, starts))
        starts = np.logical_or(terminated, truncated)
        tracker.update(np.zeros(1, np.int64), reward, starts, info)
    return tracker.finished_returns[:episodes], tracker.finished_lengths[:episodes], frames


def _observed_frame(obs: np.ndarray) -> np.ndarray:
    image = obs[0]
    if image.dtype != np.uint8 or image.ndim != 3:
        raise ValueError("this env neither renders nor has image observations: no video")
    return image[-1] if image.shape[0] < image.shape[-1] else image  # stacked CHW or HWC RGB


def eval_envs(saved: Any, config: Any) -> Any:
    """The one-env pool `onebox eval` plays the run's policy on: the run's env and options, and
    an episode cap (`--max-episode-steps`, else the run's own, else the env's time limit, else
    `EPISODE_CAP`, said on stdout: a greedy policy can play forever where nothing ends it)."""
    from onebox.algos.common import parse_env_options

    renders = onebox.envs.backend_of(saved.env) in ("native", "process")
    kwargs = dict(seed=config.seed, autoreset_mode="SameStep",
                  **parse_env_options(getattr(saved, "env_options", {})),
                  **({"render_mode": "rgb_array"} if config.video and renders else {}))  # fmt: skip
    envs = onebox.envs.make(saved.env, 1, **kwargs)
    cap = config.max_episode_steps or getattr(saved, "max_episode_steps", None)
    if cap is None and time_limit(envs.spec) is None:
        cap = EPISODE_CAP
        print(f"{saved.env} has no time limit: episodes end at {cap:,} steps "
              "(--max-episode-steps to change)")  # fmt: skip
    if cap is None or cap == time_limit(envs.spec):
        return envs
    spec = envs.spec
    envs.close()
    return onebox.envs.make(saved.env, 1, **{**kwargs, **cap_options(spec, cap)})


def evaluate(config: Any) -> int:
    """`onebox eval`: play the run's policy, print the returns, optionally write a video."""
    from onebox.registry import command_of

    run_dir = Path(config.run_dir)
    if config.episodes <= 0:
        raise ValueError(f"--episodes must be positive, got {config.episodes}")
    if config.max_episode_steps is not None and config.max_episode_steps <= 0:
        raise ValueError(f"--max-episode-steps must be positive, got {config.max_episode_steps}")
    group, _ = command_of(run_dir)  # a run of onebox train, evolve or pbt, or ValueError
    if config.member is not None and group != "pbt":
        raise ValueError(f"--member picks a population's member; {run_dir} is a `{group}` run")
    saved = run.load_config(run_dir)
    if group == "train":
        policy = driver.load_policy(run_dir, saved)
    elif group == "pbt":
        from onebox.pbt.run import load_policy as load_member

        policy = load_member(run_dir, saved, config.member)
    else:
        from onebox.evo.run import load_policy

        policy = load_policy(run_dir, saved)
    # The run's own torch threads (1 for small nets: at batch 1 more threads only cost).
    torch.set_num_threads(getattr(saved, "torch_threads", 1))
    with eval_envs(saved, config) as envs:
        returns, lengths, frames = play(policy, envs, config.episodes, config.seed, config.video)
    print(
        f"{saved.env}: {len(returns)} episodes, return {np.mean(returns):.2f} "
        f"+- {np.std(returns):.2f} (min {np.min(returns):.2f}, max {np.max(returns):.2f}), "
        f"length {np.mean(lengths):.1f}"
    )
    if config.video:
        path = run.write_video(frames, run_dir / "videos" / "eval.mp4")
        print(f"video: {path}")
    return 0
