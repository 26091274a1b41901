"""Atari rows of `onebox bench envs`: every backend on the same game with the "envpool" preset.

The preset (frameskip 4, max-pool, grayscale 84x84, stack 4, up to 30 no-ops, FIRE reset, cap
108,000 frames, no sticky actions, episodic life, reward clipping) maps onto each peer:

- EnvPool: `envpool.make_gymnasium("Pong-v5", episodic_life=True, reward_clip=True)` (the rest
  are its defaults).
- ALE's `AtariVectorEnv("pong")`: its defaults, with `life_loss_info=True` for episodic life
  (ALE's own `episodic_life` restarts the game at a lost life). Its `send` takes no env ids: it
  steps the envs of the last `recv`, which is what the async loop sends to anyway.
- Gymnasium: `ALE/Pong-v5` with frameskip 1 and no sticky actions, `AtariPreprocessing`
  (frameskip 4, max-pool, grayscale, 84x84, 30 no-ops), `FrameStackObservation(4)` and reward
  clipping, in a `SyncVectorEnv` or `AsyncVectorEnv`. Gymnasium has no FIRE reset, and its
  `terminal_on_life_loss` restarts the game, so it is off; neither changes Pong, which has no
  lives and one reset per game.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from onebox.bench.loops import Loop, Task, Unavailable, half, sync_loop
from onebox.envs.atari_games import atari_ids, rom_id


def is_atari(env_id: str) -> bool:
    """Whether `env_id` is one of onebox's Atari ids ("Pong-v5")."""
    return env_id in atari_ids()


def envpool_options(env_id: str) -> dict[str, Any]:
    """EnvPool's options for the "envpool" preset where it differs from EnvPool's defaults."""
    return {"episodic_life": True, "reward_clip": True} if is_atari(env_id) else {}


def _rom(task: Task) -> str:
    if not is_atari(task.env_id):
        raise Unavailable(f"n/a: {task.env_id} is not an Atari game")
    return rom_id(task.env_id)


def _ale_env(task: Task, batch_size: int) -> Any:
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv(
        _rom(task),
        task.num_envs,
        batch_size=batch_size,
        num_threads=min(task.num_threads, task.num_envs),
        life_loss_info=True,
        reward_clipping=True,
    )


def ale_sync(task: Task) -> Loop:
    """`step` over every env of ALE's `AtariVectorEnv`."""
    return sync_loop(_ale_env(task, task.num_envs), task, task.num_envs)


def ale_async(task: Task) -> Loop:
    """`recv()`, then `send(actions)` to the envs just received (ALE's send has no env ids)."""
    batch = half(task.num_envs)
    env = _ale_env(task, batch)
    batches = itertools.cycle(task.actions(env.single_action_space, batch))
    env.reset(seed=task.seed)  # returns the first batch, as recv does
    recv, send = env.recv, env.send
    send(next(batches))

    def run(k: int) -> None:  # across calls too: slow envs are timed one call at a time
        for _ in range(k):
            recv()
            send(next(batches))

    return Loop(run, batch, env.close)


def _gymnasium_atari(env_id: str) -> Any:
    import ale_py
    import gymnasium as gym
    import numpy as np
    from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{env_id}", frameskip=1, repeat_action_probability=0.0)
    env = AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
    env = FrameStackObservation(env, 4)
    return ClipReward(env, np.float32(-1), np.float32(1))


def gymnasium_vector_env(task: Task, mode: str) -> Any:
    """Gymnasium's Sync ("sync") or Async ("async") vector env of the game, preprocessed."""
    import gymnasium as gym

    _rom(task)
    factory = functools.partial(_gymnasium_atari, task.env_id)
    cls = gym.vector.SyncVectorEnv if mode == "sync" else gym.vector.AsyncVectorEnv
    return cls([factory] * task.num_envs)
