"""Batched environments: `make` an env pool, `list_envs` to see what is available.

    import onebox.envs
    envs = onebox.envs.make("CartPole-v1", num_envs=64)
    obs, info = envs.reset(seed=0)
    obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())

Every pool is a `gymnasium.vector.VectorEnv` and also has EnvPool's async API:
`async_reset()`, `send(actions, env_ids)` and `recv()`, which returns the first `batch_size` envs
to finish with their ids in `info["env_id"]`.

Backends are pool classes listed in `BACKENDS`, fastest first; `make` picks the first whose
`handles(env_id)` is true, or the one named by `backend=`. Any Gymnasium id, or `env_fn=`, runs in
worker processes (`ProcessEnvPool`, the last backend). `choose_backend(env_id)` says which backend
an id gets and why; when that is a slower one than the id normally gets (a native MuJoCo id whose
module failed to load), `make` warns with a `BackendFallbackWarning` saying how to get the fast one.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import warnings
from collections.abc import Callable
from typing import Any

from onebox.envs.base import EnvPool, physical_cores
from onebox.envs.mujoco_module import is_mujoco_v5, mujoco_library, mujoco_unavailable
from onebox.envs.native import NativeEnvPool
from onebox.envs.process import ProcessEnvPool

__all__ = [
    "BACKENDS",
    "BackendChoice",
    "BackendFallbackWarning",
    "EnvPool",
    "NativeEnvPool",
    "ProcessEnvPool",
    "backend_of",
    "choose_backend",
    "env_options",
    "list_envs",
    "make",
    "make_splits",
    "physical_cores",
]

BACKENDS: dict[str, str] = {
    "native": "onebox.envs.native:NativeEnvPool",
    "atari": "onebox.envs.atari:AtariEnvPool",
    "process": "onebox.envs.process:ProcessEnvPool",
}
"""Backend name -> its pool class as "module:Class", in the order `make` tries them. A pool class
has classmethods `ids()` (the ids it lists) and `handles(env_id)`, and takes
`(env_id, num_envs, *, batch_size, num_threads, seed, **kwargs)`."""


MAX_LISTED_IDS = 12
"""An unknown id of a namespace ("MinAtar/Pong-v1") lists the namespace's ids if there are at most
this many."""


def _pool_class(backend: str) -> type[EnvPool]:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    module, _, name = BACKENDS[backend].partition(":")
    return getattr(importlib.import_module(module), name)


WHY: dict[str, str] = {
    "native": "native C++",
    "atari": "ALE vector engine",
    "process": "process: no native port",
}
"""Backend -> why an id that it handles gets it (when it is the id's usual backend)."""


class BackendFallbackWarning(UserWarning):
    """`make` runs an id in a slower backend than it normally gets; the message says why and how
    to get the fast one. `warnings.simplefilter("error", BackendFallbackWarning)` makes it an error;
    passing that backend explicitly (`backend="process"`) silences it."""


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """The backend `make` uses for an id, and why."""

    backend: str | None
    """A key of `BACKENDS`, or None when no backend has the id."""
    why: str
    """Why, e.g. "native C++" or "process: no native port"."""
    fallback: bool = False
    """Whether this backend stands in for a faster one that is unavailable."""


def choose_backend(env_id: str) -> BackendChoice:
    """The backend `make` would use for `env_id` (the first in `BACKENDS` that handles it), why,
    and whether that is a fallback from the id's usual backend."""
    if is_mujoco_v5(env_id) and (reason := mujoco_unavailable()) is not None:
        return BackendChoice("process", f"process: {reason}", fallback=True)
    for backend in BACKENDS:
        pool = _pool_class(backend)
        if pool.handles(env_id):
            if backend == "atari" and not pool.ids():  # claimed without ale-py: make says so
                return BackendChoice(
                    backend, 'ALE vector engine, not installed: pip install "onebox[atari]"'
                )
            if backend == "native" and is_mujoco_v5(env_id):
                return BackendChoice(backend, f"native C++ (MuJoCo {mujoco_library()[0]}, bundled)")
            return BackendChoice(backend, WHY[backend])
    return BackendChoice(None, "no backend has it")


def backend_of(env_id: str) -> str | None:
    """The backend `make` would use for `env_id`, or None if no backend handles it."""
    return choose_backend(env_id).backend


def list_envs() -> list[str]:
    """Ids of every env onebox can make, sorted."""
    ids: set[str] = set()
    for backend in BACKENDS:
        ids.update(_pool_class(backend).ids())
    return sorted(ids)


def make(
    env_id: str | None = None,
    num_envs: int = 1,
    batch_size: int | None = None,
    num_threads: int | None = None,
    seed: int = 0,
    *,
    backend: str | None = None,
    env_fn: Callable[[], Any] | None = None,
    **env_kwargs: Any,
) -> EnvPool:
    """Make a pool of `num_envs` envs `env_id` with the fastest backend that has it.

    `backend=` forces one (see `BACKENDS`); the other keyword arguments are the backend pool's
    (e.g. `NativeEnvPool`) and the env's own options. `env_fn=` (a callable returning a
    `gymnasium.Env`; `env_id` is then optional) runs any Python env in the process backend.
    """
    if env_fn is not None:
        if backend not in (None, "process"):
            raise ValueError(f"env_fn runs in the process backend, not {backend!r}")
        return _pool_class("process")(
            env_id,
            num_envs,
            batch_size=batch_size,
            num_threads=num_threads,
            seed=seed,
            env_fn=env_fn,
            **env_kwargs,
        )
    if not isinstance(env_id, str):
        raise TypeError(f"env_id must be a string, got {type(env_id).__name__}")
    choice = choose_backend(env_id) if backend is None else BackendChoice(backend, "chosen")
    chosen = choice.backend
    if chosen is None:
        close = difflib.get_close_matches(env_id, list_envs(), n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        namespace = env_id.rpartition("/")[0]
        kin = [i for i in list_envs() if namespace and i.startswith(namespace + "/")]
        if 0 < len(kin) <= MAX_LISTED_IDS:  # a few games of a family (MinAtar/...): name them all
            hint += f" The {namespace} ids: {', '.join(kin)}."
        raise ValueError(f"unknown env id {env_id!r}.{hint} `onebox envs` lists the available ids.")
    pool = _pool_class(chosen)
    if not pool.handles(env_id):
        raise ValueError(f"the {chosen} backend has no env {env_id!r}; `onebox envs` lists its ids")
    if choice.fallback:
        warnings.warn(
            f"{env_id} runs in the {chosen} backend, several times slower than its usual one: "
            f"{choice.why.removeprefix(chosen + ': ')}. Pass backend={chosen!r} to choose it "
            "explicitly.",
            BackendFallbackWarning,
            stacklevel=2,
        )
    return pool(
        env_id,
        num_envs,
        batch_size=batch_size,
        num_threads=num_threads,
        seed=seed,
        **env_kwargs,
    )


def make_splits(
    splits: int,
    env_id: str,
    num_envs: int,
    num_threads: int | None = None,
    seed: int = 0,
    **kwargs: Any,
) -> list[EnvPool]:
    """`num_envs` envs as `splits` pools of `m = num_envs // splits` that take turns
    (double-buffered sampling): pool k's env i is seeded `seed + k * m + i`, as env k * m + i of
    one pool would be, and each pool has `num_threads` threads (at most its envs). `kwargs` go
    to `make`. If a pool cannot be made, the ones made are closed."""
    if splits < 1 or num_envs % splits:
        raise ValueError(f"{num_envs} envs cannot be split into {splits} pools of one size")
    m = num_envs // splits
    threads = None if num_threads is None else min(num_threads, m)
    pools: list[EnvPool] = []
    try:
        for k in range(splits):
            pools.append(make(env_id, m, num_threads=threads, seed=seed + k * m, **kwargs))
    except BaseException:
        for pool in pools:
            pool.close()
        raise
    return pools


def env_options(env_id: str) -> dict[str, tuple[Any, str]]:
    """The options a native env takes as keyword arguments of `make`: name -> (default, doc)."""
    from onebox.envs.native import native_options

    return native_options(env_id)
