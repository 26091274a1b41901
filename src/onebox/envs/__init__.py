"""Batched environments: `make` an env pool, `list_envs` to see what is available.

    import onebox.envs
    envs = onebox.envs.make("CartPole-v1", num_envs=64)
    obs, info = envs.reset(seed=0)
    obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())

Every pool is a `gymnasium.vector.VectorEnv` and also has EnvPool's async API:
`async_reset()`, `send(actions, env_ids)` and `recv()`, which returns the first `batch_size` envs
to finish with their ids in `info["env_id"]`.
"""

from __future__ import annotations

import difflib
from typing import Any

from onebox.envs.base import EnvPool, physical_cores
from onebox.envs.native import NativeEnvPool, native_ids, native_options

__all__ = ["EnvPool", "NativeEnvPool", "list_envs", "make", "physical_cores"]


def list_envs() -> list[str]:
    """Ids of every env onebox can make, sorted."""
    return sorted(native_ids())


def make(
    env_id: str,
    num_envs: int = 1,
    batch_size: int | None = None,
    num_threads: int | None = None,
    seed: int = 0,
    **env_kwargs: Any,
) -> EnvPool:
    """Make a pool of `num_envs` envs `env_id`; see `NativeEnvPool` for the keyword arguments."""
    if not isinstance(env_id, str):
        raise TypeError(f"env_id must be a string, got {type(env_id).__name__}")
    if env_id in native_ids():
        return NativeEnvPool(
            env_id,
            num_envs,
            batch_size=batch_size,
            num_threads=num_threads,
            seed=seed,
            **env_kwargs,
        )
    close = difflib.get_close_matches(env_id, list_envs(), n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ValueError(f"unknown env id {env_id!r}.{hint} `onebox envs` lists the available ids.")


def env_options(env_id: str) -> dict[str, tuple[Any, str]]:
    """The options an env takes as keyword arguments of `make`: name -> (default, doc)."""
    return native_options(env_id)
